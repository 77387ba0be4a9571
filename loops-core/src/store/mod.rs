//! Stores: where runs' records live, behind the [`Store`] trait.
//!
//! [`RedbStore`] is the embedded store: one redb file, owned by one process; its commit path
//! (group commit on a writer thread) is in [`redb`]. Other stores (PostgreSQL, for many
//! workers sharing runs) implement the same trait with the same semantics: the
//! [`protocol`]'s writes, leases that fence every write of a run's driver, and the reads the
//! runtime needs.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::record::{FailureRecord, StepRecord, TransitionRecord};
use crate::schema::SchemaHash;
use crate::workflow::{StateId, Workflow};

pub mod protocol;
pub mod redb;
mod verify;

pub use self::protocol::{AfterFailure, EventRecord, Reply, WaitOutcome, Write};
pub use self::redb::{Compacted, RedbStore, StoreOptions};

/// A boxed, `Send` future: what [`Store`] methods return, so that `dyn Store` works.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The right to drive one run, held by one worker at a time. Every write the driver makes
/// carries it, and a store refuses the write ([`Error::Fenced`](crate::Error::Fenced)) unless
/// the lease is still the run's current one: a paused worker whose lease lapsed can never
/// commit after another took the run over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The run.
    pub run_id: String,
    /// The fencing token: unique per acquisition of the run.
    pub token: u64,
    /// When the lease lapses unless renewed, in ms since the Unix epoch; `None` for a store
    /// that only one process can open (its file lock is the lease).
    pub expires_ms: Option<u64>,
}

/// Where runs' records live. Implemented by [`RedbStore`] (embedded, one process) and by the
/// PostgreSQL store (many workers); the runtime drives runs through `dyn Store`.
///
/// Every method returns a boxed future; stores that do blocking I/O keep it short or move it
/// off the async threads. Semantics every implementation must give:
/// - [`write`](Self::write) applies one [`Write`] atomically, exactly as described on
///   [`Write`]; with a lease, it is refused unless the lease is the run's current one;
/// - records are immutable; reads see every write whose future has completed;
/// - a lease is held by one worker at a time; [`acquire`](Self::acquire) returns `None` while
///   another worker holds a live lease on the run.
pub trait Store: Send + Sync + 'static {
    /// Names the store in errors and logs (a file path; a database URL without password).
    fn label(&self) -> String;

    /// The store as `Any`, to reach its own API (for example [`RedbStore::compact`]).
    fn as_any(&self) -> &dyn Any;

    /// Applies `write` atomically (possibly in one commit with concurrent writes) and returns
    /// the store's reply, after the commit is durable.
    fn write<'a>(&'a self, lease: Option<&'a Lease>, write: Write) -> BoxFuture<'a, Result<Reply>>;

    /// The run's row, or `None`.
    fn run_info<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunInfo>>>;

    /// The run's row and its latest transition record, in time independent of the history.
    fn latest<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<(RunInfo, TransitionRecord)>>>;

    /// Every transition record of the run, by sequence number.
    fn history<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<TransitionRecord>>>;

    /// The step records of the run's state at `seq`, as `(name, occurrence, record)`.
    fn steps<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<Vec<(String, u32, StepRecord)>>>;

    /// Every failed attempt of the run, as `(seq, record)`.
    fn failures<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<(u64, FailureRecord)>>>;

    /// Every event sent to the run, as `(event seq, record, delivered)`.
    fn events<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(u64, EventRecord, bool)>>>;

    /// Whether an event named `event` waits undelivered in the run's inbox.
    fn has_pending<'a>(&'a self, run_id: &'a str, event: &'a str) -> BoxFuture<'a, Result<bool>>;

    /// The runs with `status` (optionally of one workflow), from the status index.
    fn list<'a>(
        &'a self,
        status: RunStatus,
        workflow: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<RunInfo>>>;

    /// The schema description stored for `hash`.
    fn schema(&self, hash: SchemaHash) -> BoxFuture<'_, Result<Option<String>>>;

    /// Every stored schema description, as `(hash, description)`, by hash.
    fn schemas(&self) -> BoxFuture<'_, Result<Vec<(SchemaHash, String)>>>;

    /// Takes the lease of the run for this worker; `None` if another worker holds a live
    /// lease on it.
    fn acquire<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<Lease>>>;

    /// Gives the lease back (the run may be taken by any worker at once).
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>>;

    /// Extends `leases`; returns those renewed, with their new expiry. A lease missing from
    /// the answer was lost (it lapsed and another worker may hold the run).
    fn renew<'a>(&'a self, leases: &'a [Lease]) -> BoxFuture<'a, Result<Vec<Lease>>>;

    /// How long a lease lasts without renewal; `None` if leases never lapse.
    fn lease_ttl(&self) -> Option<Duration>;

    /// Runs of `workflows` that need a driver and that no worker holds: running runs, and
    /// waiting runs whose wait is over. Each comes with a lease for this worker (at most
    /// `limit`). A store with no other workers returns every such run.
    fn claim_ready<'a>(
        &'a self,
        workflows: &'a [String],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(RunInfo, Lease)>>>;
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The run has not ended: it is being driven, or will be when it is next resumed.
    Running,
    /// The run is parked until an event arrives or a time passes ([`RunInfo::wait`] says
    /// which); it holds no task while it waits.
    Waiting,
    /// The run reached a terminal state.
    Completed,
    /// The run's retry policy ran out of attempts; [`Runtime::retry`](crate::Runtime::retry)
    /// makes it running again.
    Failed,
    /// The run was cancelled.
    Cancelled,
}

impl RunStatus {
    /// Every status, in index order.
    pub const ALL: [RunStatus; 5] = [
        RunStatus::Running,
        RunStatus::Waiting,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    /// Whether the run has ended (completed, failed or cancelled).
    pub fn is_ended(self) -> bool {
        !matches!(self, RunStatus::Running | RunStatus::Waiting)
    }

    /// The lowercase name (`"running"`).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            RunStatus::Running => 0,
            RunStatus::Completed => 1,
            RunStatus::Failed => 2,
            RunStatus::Cancelled => 3,
            RunStatus::Waiting => 4,
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A run's current standing: the one mutable row per run, updated in the same commit as the
/// immutable record that changes it. Listing and resuming read this, never the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    /// The run id (the row's key; not repeated in the stored value).
    #[serde(skip)]
    pub run_id: String,
    /// The workflow name.
    pub workflow: String,
    /// The pinned schema hash the run was started with.
    pub schema: SchemaHash,
    /// Where the run stands.
    pub status: RunStatus,
    /// The current state's name.
    pub state: String,
    /// The current state's sequence number (the latest transition record's key).
    pub seq: u64,
    /// Attempts started at handling the current state, from 1 (counting on across an
    /// explicit retry of a failed run).
    pub attempt: u32,
    /// Attempts made before the last explicit retry of a failed run: the retry policy's
    /// budget counts from here.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt_base: u32,
    /// How many of the current state's attempts since `attempt_base` were cut short by the
    /// process stopping (counted against [`RetryPolicy::max_interruptions`](crate::RetryPolicy)).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub interrupted: u32,
    /// When the run was created, in ms since the Unix epoch.
    pub created_ms: u64,
    /// When this row last changed, in ms since the Unix epoch.
    pub updated_ms: u64,
    /// When the next attempt may start (after a failure), in ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at_ms: Option<u64>,
    /// The last failed attempt's error chain, outermost first; cleared by a transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Vec<String>>,
    /// The reason given when the run was cancelled (or asked to be).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<String>,
    /// What a waiting run waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitInfo>,
}

impl RunInfo {
    /// The row of a run created in `state` at `now_ms` (ms since the Unix epoch): seq 0,
    /// attempt 1, `Completed` if `state` is terminal, else `Running`; the workflow's name and
    /// pinned schema hash.
    pub fn new_run<W: Workflow>(run_id: &str, state: W::State, now_ms: u64) -> RunInfo {
        RunInfo {
            run_id: run_id.to_owned(),
            workflow: W::NAME.to_owned(),
            schema: W::SCHEMA_HASH.pinned(),
            status: if state.is_terminal() {
                RunStatus::Completed
            } else {
                RunStatus::Running
            },
            state: state.name().to_owned(),
            seq: 0,
            attempt: 1,
            attempt_base: 0,
            interrupted: 0,
            created_ms: now_ms,
            updated_ms: now_ms,
            retry_at_ms: None,
            error: None,
            cancel: None,
            wait: None,
        }
    }

    /// Applies [`Write::BeginAttempt`] to a running run's row, the same in every store: if
    /// the current attempt left no failure record (`attempt_has_failure` is false), the
    /// process stopped during it, and the returned `Interrupted` failure record (for the
    /// current attempt, at `at_ms`) must be stored with the row. Then the run fails if its
    /// failed attempts reached `max_attempts` or its interruptions `max_interruptions`;
    /// otherwise its attempt number goes up by one.
    pub fn begin_attempt(
        &mut self,
        attempt_has_failure: bool,
        at_ms: u64,
        max_attempts: u32,
        max_interruptions: u32,
    ) -> Option<FailureRecord> {
        let interrupted = (self.attempt > 0 && !attempt_has_failure).then(|| FailureRecord {
            attempt: self.attempt,
            at_ms,
            source: crate::record::FailureSource::Interrupted,
            errors: vec!["the process stopped while this attempt ran".to_owned()],
        });
        if let Some(record) = &interrupted {
            self.error = Some(record.errors.clone());
            self.interrupted += 1;
        }
        let failed = self
            .attempt
            .saturating_sub(self.attempt_base)
            .saturating_sub(self.interrupted);
        if failed >= max_attempts || self.interrupted >= max_interruptions {
            self.status = RunStatus::Failed;
            self.retry_at_ms = None;
        } else {
            self.attempt += 1;
        }
        self.updated_ms = at_ms;
        interrupted
    }
}

/// What a [waiting](RunStatus::Waiting) run waits for: an event, a time, or an event until a
/// time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitInfo {
    /// The event's name, when it waits for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// When the wait ends on its own (a sleep's wake-up or a wait's time-out), in ms since
    /// the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What [`prune`] removed (or, in a dry run, would remove).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Pruned {
    /// Runs removed.
    pub runs: u64,
    /// Transition records removed (step, failure and event records go with them).
    pub records: u64,
    /// The ids of the runs removed, oldest first.
    pub run_ids: Vec<String>,
}

/// Most runs deleted by one write of [`prune`].
pub const PRUNE_BATCH: usize = 256;

/// Selects the ended runs `policy` expires at `now_ms` and, unless `dry_run`, deletes their
/// records, rows, index entries and events with [`Write::Prune`], [`PRUNE_BATCH`] runs per
/// write. Runs that have not ended are never touched.
///
/// # Errors
/// [`Error::Storage`](crate::Error::Storage) if a read or a commit fails (runs deleted by
/// earlier writes stay deleted); [`Error::ReadOnly`](crate::Error::ReadOnly) for a read-only
/// store unless `dry_run`.
pub async fn prune(
    store: &dyn Store,
    policy: &crate::retention::RetentionPolicy,
    now_ms: u64,
    dry_run: bool,
) -> Result<Pruned> {
    let mut ended = Vec::new();
    for status in policy.statuses() {
        ended.extend(store.list(status, None).await?);
    }
    let expired = policy.select(ended, now_ms);
    let mut report = Pruned {
        runs: expired.len() as u64,
        records: 0,
        run_ids: expired.clone(),
    };
    if dry_run {
        for run_id in &expired {
            report.records += store.history(run_id).await?.len() as u64;
        }
        return Ok(report);
    }
    for chunk in expired.chunks(PRUNE_BATCH) {
        if let Reply::Pruned { records } = store
            .write(
                None,
                Write::Prune {
                    run_ids: chunk.to_vec(),
                },
            )
            .await?
        {
            report.records += records;
        }
    }
    Ok(report)
}
