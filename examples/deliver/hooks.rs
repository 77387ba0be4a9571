//! What happens at the entry of every state: the progress line, and the hooks that crash
//! tests use to stop the program at an exact point.
//!
//! The hooks are environment variables, for tests only (see `--help`):
//! - `LOOPS_DELIVER_HOLD_AT_SEQ=k`: at the entry of the state at seq `k`, print
//!   `holding at seq k` and wait forever, so that a test can SIGKILL the process right after
//!   the `k`-th transition was committed;
//! - `LOOPS_DELIVER_STOP_AT_SEQ=k`: at the entry of seq `k`, stop driving and exit 0 cleanly
//!   without doing the state's work (the store file is closed properly); version 2's
//!   `Planned` enters after its child runs have ended (the join comes before the entry
//!   line, so that a handler that parks in the join enters once), so a stop at its seq
//!   comes after the children;
//! - `LOOPS_DELIVER_HOLD_IN_SETUP=point`: at that point of the setup, print `holding in
//!   setup at point` and wait forever, so that a test can SIGKILL a start before its run
//!   exists: `aside` (`--fresh` has moved the old work directory aside), `new` (a new work
//!   directory is built beside its place, not renamed into it yet), `made` (the work
//!   directory is in place and held, the store not opened yet), `repo` (the work directory
//!   and the store are held; the demo's repository is not set up, the run not recorded);
//! - every entry appends `seq state attempt` to `<workdir>/handler-entries.log`.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use tokio::sync::Notify;

/// Name of the hold hook's variable.
pub const HOLD_VAR: &str = "LOOPS_DELIVER_HOLD_AT_SEQ";
/// Name of the stop hook's variable.
pub const STOP_VAR: &str = "LOOPS_DELIVER_STOP_AT_SEQ";

/// Name of the setup hook's variable.
pub const HOLD_IN_SETUP_VAR: &str = "LOOPS_DELIVER_HOLD_IN_SETUP";

/// The setup hook: if [`HOLD_IN_SETUP_VAR`] names `point`, prints `holding in setup at
/// point` and never returns (the process is to be killed there; the thread sleeps, so it may
/// be called outside async code); else returns at once.
pub fn hold_in_setup(point: &str) {
    if std::env::var_os(HOLD_IN_SETUP_VAR).is_some_and(|held| held == point) {
        say!("holding in setup at {point}");
        let _ = std::io::stdout().flush();
        loop {
            std::thread::park();
        }
    }
}

/// The entry hooks of one process.
#[derive(Debug, Clone)]
pub struct Hooks {
    hold_at: Option<u64>,
    stop_at: Option<u64>,
    entries_log: PathBuf,
    stop: Arc<Notify>,
}

impl Hooks {
    /// Reads the hook variables; entries are logged to `entries_log`.
    ///
    /// # Errors
    /// If a variable is set but is not a number.
    pub fn from_env(entries_log: PathBuf) -> Result<Hooks> {
        Ok(Hooks {
            hold_at: seq_var(HOLD_VAR)?,
            stop_at: seq_var(STOP_VAR)?,
            entries_log,
            stop: Arc::new(Notify::new()),
        })
    }

    /// Hooks that never fire, logging entries to `entries_log`.
    #[cfg(test)]
    pub fn none(entries_log: PathBuf) -> Hooks {
        Hooks {
            hold_at: None,
            stop_at: None,
            entries_log,
            stop: Arc::new(Notify::new()),
        }
    }

    /// Marks the entry of the state `state` at `seq`: runs the stop hook, logs the entry,
    /// prints `line`, then runs the hold hook. `attempt` is `None` for a terminal state,
    /// which has no handler (its entry is the final report).
    ///
    /// When a hook fires this never returns: the caller's future is dropped (stop) or the
    /// process is killed (hold).
    ///
    /// # Errors
    /// If the entries log cannot be written.
    pub async fn enter(
        &self,
        seq: u64,
        state: &str,
        attempt: Option<u32>,
        line: &str,
    ) -> Result<()> {
        if self.stop_at == Some(seq) {
            say!("stopping at seq {seq} ({STOP_VAR})");
            self.stop.notify_one();
            std::future::pending::<()>().await;
        }
        let attempt = attempt.map_or_else(|| "-".to_owned(), |a| a.to_string());
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.entries_log)
            .with_context(|| format!("cannot open {}", self.entries_log.display()))?;
        writeln!(log, "{seq} {state} {attempt}")
            .with_context(|| format!("cannot write {}", self.entries_log.display()))?;
        say!("[seq {seq}] {state}: {line}");
        if self.hold_at == Some(seq) {
            say!("holding at seq {seq}");
            // Standard output is line-buffered; this is belt and braces. A closed pipe is no
            // reason to stop (see `say!`).
            let _ = std::io::stdout().flush();
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    /// Resolves when the stop hook has fired.
    pub async fn stopped(&self) {
        self.stop.notified().await;
    }

    /// Whether the stop hook fires at `seq`.
    pub fn stops_at(&self, seq: u64) -> bool {
        self.stop_at == Some(seq)
    }
}

fn seq_var(name: &str) -> Result<Option<u64>> {
    match std::env::var(name) {
        Ok(value) => value
            .trim()
            .parse()
            .map(Some)
            .with_context(|| format!("{name}={value:?} is not a sequence number")),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {name}")),
    }
}
