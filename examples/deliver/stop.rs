//! What asks this program to stop: Ctrl-C (SIGINT) or SIGTERM, listened for from the start
//! so that neither ends the process while the store is open; the program then stops driving
//! and closes the store cleanly, and says what comes next ([`after_a_stop`]).

use std::path::Path;

/// What asked this program to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Ctrl-C (SIGINT): exit code 130.
    CtrlC,
    /// SIGTERM, as a deploy or `systemctl stop` sends it: exit code 143.
    Terminate,
}

/// Set when Ctrl-C is pressed or SIGTERM arrives.
pub struct Interrupt(tokio::sync::watch::Receiver<Option<Stop>>);

impl Interrupt {
    /// Starts listening for Ctrl-C and SIGTERM: from this call on, neither ends the process
    /// at once. The handlers are registered here, not in the task that waits for them (which
    /// would leave a window, until its first poll, in which the store is open and a signal
    /// still kills the process).
    pub fn listen() -> Interrupt {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let signals = Signals::register();
        tokio::spawn(async move {
            if let Some(stop) = signals.next().await {
                let _ = tx.send(Some(stop));
            }
            // Keeps the sender: were it dropped, `wait` would resolve.
            std::future::pending::<()>().await;
        });
        Interrupt(rx)
    }

    /// Resolves with what stopped this program, once something did.
    pub async fn wait(&self) -> Stop {
        let mut rx = self.0.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(stop) => stop.unwrap_or(Stop::CtrlC),
            Err(_) => std::future::pending().await,
        }
    }
}

/// The handlers of Ctrl-C (SIGINT) and SIGTERM, registered: each one that could not be is
/// `None`, and never arrives.
#[cfg(unix)]
struct Signals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
}

#[cfg(unix)]
impl Signals {
    /// Registers both handlers (needs the tokio runtime).
    fn register() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        Signals {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    /// The first of the two to arrive; `None` if neither can.
    async fn next(mut self) -> Option<Stop> {
        async fn arrived(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
            match signal {
                Some(signal) => signal.recv().await,
                None => None,
            }
        }
        tokio::select! {
            Some(()) = arrived(&mut self.interrupt) => Some(Stop::CtrlC),
            Some(()) = arrived(&mut self.terminate) => Some(Stop::Terminate),
            else => None,
        }
    }
}

/// Ctrl-C, where there is no SIGTERM.
#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn register() -> Signals {
        Signals
    }

    async fn next(self) -> Option<Stop> {
        tokio::signal::ctrl_c().await.ok().map(|()| Stop::CtrlC)
    }
}

/// What to say after a stop, instead of how to resume, if the run `run_id` has nothing to
/// resume: it is not in `store` (the stop came before its first record: the same command
/// starts it) or it has ended. Read from the store read-only once this process has closed
/// it; `None` (resume) if the run is unfinished, or the store cannot be read now (another
/// process holds it: a serving one that `--approve` reached).
pub fn after_a_stop(store: &Path, run_id: &str) -> Option<String> {
    let before = || {
        Some(format!(
            "stopped before run {run_id} was recorded: the same command starts it"
        ))
    };
    if !store.exists() {
        return before();
    }
    let read = loops::RedbStore::open_read_only(store).ok()?;
    match read.run(run_id).ok()? {
        None => before(),
        Some(info) if info.status.is_ended() => Some(format!(
            "run {run_id} has ended ({} at {}, seq {}): nothing to resume",
            info.status, info.state, info.seq
        )),
        Some(_) => None,
    }
}
