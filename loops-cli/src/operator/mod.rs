//! The one interface every command works through: the reads and steering operations on a
//! store, whichever way the store is reached.
//!
//! - [`Local`]: this process opens the store itself: a redb file that no process holds
//!   (read-only for reading commands, writable for the others), or a PostgreSQL store
//!   (shared with its workers, as every worker shares it).
//! - [`Remote`]: a process holds the redb file and serves its control endpoint; every
//!   operation is a request to it, and its runtime makes every write.
//!
//! Commands do not know which: their output and exit codes are the same either way
//! (`--verbose` says which was taken).

mod local;
mod remote;
mod sealed;

use loops_core::{Attributes, RunFilter, ScheduleStatus, SchemaHash};
use loops_core::{Compacted, EventRecord, Pruned, RetentionPolicy, RunInfo, RunStatus, Sent};
use loops_core::{FailureRecord, StepRecord, TransitionRecord};
use serde_json::value::RawValue;

pub use local::Local;
pub use remote::{Remote, remote_failure};
pub use sealed::Unsealing;

use crate::failure::{Failure, Result};

/// A store's runs, to read and steer. Every method is one operation of the store (or of the
/// runtime that holds it); errors are the command's failure, said as the store's words.
pub trait Operator {
    /// What the store is called in messages: its file path, or its PostgreSQL label.
    fn label(&self) -> &str;

    /// How the store is reached, in a few words (for `--verbose`).
    fn reached(&self) -> String;

    /// Who takes an event sent to a run that waits for it: what `send` can promise.
    fn taker(&self) -> Taker;

    /// The runs with `status`, optionally of one workflow.
    fn list(&self, status: RunStatus, workflow: Option<&str>) -> Result<Vec<RunInfo>>;

    /// The child runs of `run_id`, by run id (none if it has none or does not exist).
    fn children(&self, run_id: &str) -> Result<Vec<RunInfo>>;

    /// The run's row, or `None`.
    fn run(&self, run_id: &str) -> Result<Option<RunInfo>>;

    /// The run's row and latest transition record, or `None`.
    fn latest(&self, run_id: &str) -> Result<Option<(RunInfo, TransitionRecord)>>;

    /// Every transition record of the run.
    fn history(&self, run_id: &str) -> Result<Vec<TransitionRecord>>;

    /// The step records of the run's state at `seq`, as `(name, occurrence, record)`.
    fn steps(&self, run_id: &str, seq: u64) -> Result<Vec<(String, u32, StepRecord)>>;

    /// The step records of every seq of the run (those of `history`), as `(seq, name,
    /// occurrence, record)`, by seq. By default [`steps`](Self::steps) for each seq; a redb
    /// file read here answers in one walk of the run's records.
    fn all_steps(
        &self,
        run_id: &str,
        history: &[TransitionRecord],
    ) -> Result<Vec<(u64, String, u32, StepRecord)>> {
        steps_of_each_seq(self, run_id, history)
    }

    /// Every failed attempt of the run, as `(seq, record)`.
    fn failures(&self, run_id: &str) -> Result<Vec<(u64, FailureRecord)>>;

    /// Every event sent to the run, as `(event seq, record, delivered)`.
    fn events(&self, run_id: &str) -> Result<Vec<(u64, EventRecord, bool)>>;

    /// The run's searchable attributes (empty if none).
    fn attributes(&self, run_id: &str) -> Result<Attributes>;

    /// The runs `filter` selects, with their attributes, by run id: through the store's
    /// attribute index when the filter has an attribute filter
    /// ([`find_runs`](loops_core::find_runs)).
    fn search(&self, filter: &RunFilter) -> Result<Vec<(RunInfo, Attributes)>>;

    /// Every stored schema, as `(hash, description)`.
    fn schemas(&self) -> Result<Vec<(SchemaHash, String)>>;

    /// The description stored for `hash`.
    fn schema(&self, hash: SchemaHash) -> Result<Option<String>>;

    /// The ids of the keys that sealed payloads in the store; empty for a store in clear.
    fn sealing_keys(&self) -> Result<Vec<String>>;

    /// The check values recorded with the sealing keys, `(key id, check)`
    /// (`Store::sealing_checks`).
    fn sealing_checks(&self) -> Result<Vec<(String, String)>>;

    /// Every stored schedule with its next tick.
    fn schedules(&self) -> Result<Vec<ScheduleStatus>>;

    /// Pauses (`paused`) or resumes the schedule `name`; returns it after.
    fn pause_schedule(&self, name: &str, paused: bool) -> Result<ScheduleStatus>;

    /// Removes the schedule `name` (its runs stay).
    fn remove_schedule(&self, name: &str) -> Result<()>;

    /// Cancels the run with `reason`; returns its row after.
    fn cancel(&self, run_id: &str, reason: &str) -> Result<RunInfo>;

    /// Makes a failed run running again; returns its row after and who takes it up.
    fn retry(&self, run_id: &str) -> Result<(RunInfo, Taker)>;

    /// Sends event `event` with `payload` (and idempotency key `key`) to the run; returns the
    /// receipt and who takes the event up if the run waits for it.
    fn send(
        &self,
        run_id: &str,
        event: &str,
        key: Option<&str>,
        payload: &RawValue,
    ) -> Result<(Sent, Taker)>;

    /// Removes (or, with `dry_run`, only lists) the ended runs `policy` expires now;
    /// `progress` is told `(runs removed so far, runs to remove)` as it goes.
    fn prune(
        &self,
        policy: &RetentionPolicy,
        dry_run: bool,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Pruned>;

    /// Compacts the store file.
    fn compact(&self) -> Result<Compacted>;

    /// Closes the store (a redb file writes its allocator state on close), so that its file
    /// size can be measured after.
    fn close(self: Box<Self>) {}
}

/// Who takes an event sent through an [`Operator`] to a run waiting for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taker {
    /// No process holds the redb file: the next process that drives the run's workflow
    /// takes it when it starts (`Runtime::resume_all`).
    NextStart,
    /// The process that holds the store got the event: its runtime hands it to the run now.
    Serving,
    /// The process that holds the store got the request but does not take the run up: it
    /// neither drives the run nor registers its workflow (a process that drives its own runs
    /// only). A process that drives the workflow takes it up when it drives the run.
    NotServed,
    /// A store shared by workers: one that serves the run's workflow takes it when it next
    /// claims ready runs.
    Workers,
}

/// [`Operator::all_steps`] by [`Operator::steps`] for each seq of `history`.
pub fn steps_of_each_seq(
    store: &(impl Operator + ?Sized),
    run_id: &str,
    history: &[TransitionRecord],
) -> Result<Vec<(u64, String, u32, StepRecord)>> {
    let mut out = Vec::new();
    for record in history {
        let steps = store.steps(run_id, record.seq)?;
        out.extend(steps.into_iter().map(|(n, o, r)| (record.seq, n, o, r)));
    }
    Ok(out)
}

/// The failure of an operation on run `run_id`'s store `label`, from loops' error: no such
/// run names the store; an invalid run id, event name or key, and an event the run's workflow
/// does not declare or a payload that does not match its declared shape, are bad arguments
/// (exit 2).
pub fn core_failure(label: &str, e: loops_core::Error) -> Failure {
    use loops_core::Error;
    match e {
        Error::RunNotFound { run_id } => not_found(label, &run_id),
        other => other.into(),
    }
}

/// The failure for a run id the store `label` does not have.
pub fn not_found(label: &str, run_id: &str) -> Failure {
    Failure {
        missing: true,
        ..Failure::new(format!(
            "run `{run_id}` does not exist in store {label} (`loops runs` lists the runs)"
        ))
    }
}
