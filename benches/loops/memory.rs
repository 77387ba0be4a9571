//! Scenario 7: peak resident memory while 10 000 runs wait for an event, against an idle
//! runtime with no runs (the floor).
//!
//! Each measurement is a child process: open a runtime with the workflow registered, start N
//! runs at once (`start`, in concurrent tasks, so that their creation commits batch), whose
//! handler waits for an event that never comes; once every handler's future has been
//! dropped (the run parked: status waiting, no task), read the peak (`VmHWM`) and current
//! (`VmRSS`) resident set.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use loops::{RunStatus, Runtime};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::child;
use crate::measure::{median, status_kib};
use crate::workload::{Bench, Parker, note};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Child {
    pub runs: u64,
    pub start_s: f64,
    pub peak_kib: u64,
    pub rss_kib: u64,
    /// Runs found waiting in the status index afterwards.
    pub waiting: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    pub runs: u64,
    pub reps: usize,
    pub idle_peak_kib: f64,
    pub idle_rss_kib: f64,
    pub waiting_peak_kib: f64,
    pub waiting_rss_kib: f64,
    /// (waiting peak - idle peak) / runs.
    pub per_run_peak_bytes: f64,
    /// (waiting RSS - idle RSS) / runs: what a parked run keeps.
    pub per_run_rss_bytes: f64,
    pub start_s: f64,
    pub children: Vec<Child>,
}

pub fn run(dir: &Path, runs: u64, reps: usize) -> Memory {
    let mut idle = Vec::new();
    let mut waiting = Vec::new();
    for rep in 0..reps {
        for k in 0..2 {
            let n = if (k + rep) % 2 == 0 { 0 } else { runs };
            let path = dir.join("memory.redb");
            let _ = std::fs::remove_file(&path);
            let out: Child = child::run(&[
                "waiting",
                "--path",
                &path.display().to_string(),
                "--child-runs",
                &n.to_string(),
            ]);
            eprintln!(
                "  {n:>6} waiting runs: peak {:>7} KiB  now {:>7} KiB  ({} waiting, started in {:.1} s)",
                out.peak_kib, out.rss_kib, out.waiting, out.start_s
            );
            if n == 0 { &mut idle } else { &mut waiting }.push(out);
            let _ = std::fs::remove_file(&path);
        }
    }
    let m = |cs: &[Child], f: &dyn Fn(&Child) -> f64| median(&cs.iter().map(f).collect::<Vec<_>>());
    let idle_peak_kib = m(&idle, &|c| c.peak_kib as f64);
    let idle_rss_kib = m(&idle, &|c| c.rss_kib as f64);
    let waiting_peak_kib = m(&waiting, &|c| c.peak_kib as f64);
    let waiting_rss_kib = m(&waiting, &|c| c.rss_kib as f64);
    Memory {
        runs,
        reps,
        idle_peak_kib,
        idle_rss_kib,
        waiting_peak_kib,
        waiting_rss_kib,
        per_run_peak_bytes: (waiting_peak_kib - idle_peak_kib) * 1024.0 / runs as f64,
        per_run_rss_bytes: (waiting_rss_kib - idle_rss_kib) * 1024.0 / runs as f64,
        start_s: m(&waiting, &|c| c.start_s),
        children: idle.into_iter().chain(waiting).collect(),
    }
}

pub fn child_main(path: &Path, runs: u64) -> Child {
    let tokio = crate::tokio_runtime();
    let parker = Parker::default();
    let parked = parker.parked.clone();
    let rt = Runtime::builder()
        .register::<Bench, _>(parker)
        .open(path)
        .expect("open the store");
    let started = Instant::now();
    let start_s = tokio.block_on(async {
        let mut tasks = JoinSet::new();
        for i in 0..runs {
            let rt = rt.clone();
            tasks.spawn(async move {
                let start = Bench::Start {
                    left: 0,
                    note: note(),
                };
                rt.start(&format!("wait-{i:06}"), start).await.map(|_| ())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("a start task").expect("a run starts");
        }
        let deadline = Instant::now() + Duration::from_secs(600);
        while parked.load(Ordering::Relaxed) < runs {
            assert!(Instant::now() < deadline, "the runs did not all park");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let start_s = started.elapsed().as_secs_f64();
        // Let the drivers read the parked status back and end their tasks.
        tokio::time::sleep(Duration::from_millis(300)).await;
        start_s
    });
    let (peak_kib, rss_kib) = (status_kib("VmHWM"), status_kib("VmRSS"));
    let waiting = tokio
        .block_on(rt.list_runs(RunStatus::Waiting, Some("bench")))
        .expect("list")
        .len() as u64;
    assert_eq!(waiting, runs, "every run waits");
    Child {
        runs,
        start_s,
        peak_kib,
        rss_kib,
        waiting,
    }
}
