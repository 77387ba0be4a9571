//! A worker process of a test: the test binary itself, re-run with one ignored test of its
//! own as the worker, its stdout read line by line.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A worker process, killed when dropped.
pub struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Worker {
    /// Runs this test binary's ignored test `test` alone, with `env` set, as a process.
    pub fn spawn(test: &str, env: &[(&str, String)]) -> Worker {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([
                test,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker { child, lines }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (up to 60 s) for a line containing `marker`; returns it from the marker on.
    pub fn expect(&self, marker: &str) -> String {
        let line = self.expect_all(&[marker]);
        line[line.find(marker).unwrap_or(0)..].to_owned()
    }

    /// Waits (up to 60 s) for a line containing every one of `markers`; returns it.
    pub fn expect_all(&self, markers: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if markers.iter().all(|m| line.contains(m)) => return line,
                Ok(_) => {}
                Err(e) => panic!("worker {} printed no {markers:?}: {e}", self.pid()),
            }
        }
    }

    /// Sends `signal` (`-KILL`, `-STOP`, `-CONT`) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {}", self.pid());
    }

    /// SIGKILLs the process (no release of leases or places, no clean shutdown) and reaps
    /// it.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
