//! The one error type of loops-core.

use std::path::PathBuf;
use std::sync::Arc;

use crate::schema::SchemaHash;
use crate::status::RunStatus;
use crate::workflow::BoxError;

/// Everything loops-core can fail with. Each variant names the run, the state and the sequence
/// number involved, where there is one, so that a log line is enough to find the record.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store file is open in this or another process (redb holds an exclusive file lock,
    /// released by the OS when the holder exits, even on SIGKILL).
    #[error("store {path} is already open in this or another process")]
    StoreLocked {
        /// The store file.
        path: PathBuf,
    },

    /// The store file was not closed cleanly (the process that had it open crashed); a
    /// read-only open cannot repair it. A writable open ([`Runtime::open`](crate::Runtime::open))
    /// repairs it.
    #[error("store {path} was not closed cleanly and needs the repair a writable open makes")]
    NeedsRecovery {
        /// The store file.
        path: PathBuf,
    },

    /// The store was opened read-only; nothing can be written through it.
    #[error("store {path} is open read-only")]
    ReadOnly {
        /// The store file.
        path: PathBuf,
    },

    /// The store file could not be opened: not a redb file, corrupt, or an I/O error.
    #[error("cannot open store {path}")]
    Open {
        /// The store file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: BoxError,
    },

    /// A read or a commit of the store failed (I/O error, full disk, corruption).
    #[error("store error while {action}")]
    Storage {
        /// What the store was doing ("committing 3 records", "reading run `r1`").
        action: String,
        /// The underlying error, shared: one failed commit fails every write in it. For the
        /// redb store it is a `redb::Error`, which `source()` and `downcast_ref` reach; its
        /// type is not part of this API.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync + 'static>,
    },

    /// A database store (PostgreSQL, in the `loops-postgres` crate) failed a read or a write:
    /// the server could not be reached, the connection was lost, or it refused a statement.
    /// A write that fails so has not committed, except when the connection was lost during
    /// its commit: then whether it committed is unknown, and the run's next write (or its
    /// next driver, after a resume) finds out from the store.
    #[error("store error while {action}: {source}")]
    Database {
        /// What the store was doing ("committing a transition of run `r1`").
        action: String,
        /// The database client's error.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync + 'static>,
    },

    /// The run id is empty, too long or contains control characters.
    #[error("invalid run id {}: {reason}", shown_id(run_id))]
    InvalidRunId {
        /// The rejected id (escaped when printed).
        run_id: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A step name, event name or idempotency key is empty, too long or contains control
    /// characters.
    #[error("run `{run_id}`: invalid {what} {}: {reason}", shown_id(name))]
    InvalidName {
        /// The run.
        run_id: String,
        /// What was rejected: `"step name"`, `"event name"`, `"idempotency key"` (given to
        /// [`Runtime::send_with_key`](crate::Runtime::send_with_key)) or `"key name"` (given
        /// to [`Context::idempotency_key`](crate::Context::idempotency_key)).
        what: &'static str,
        /// The rejected name (or key).
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// No run has this id.
    #[error("run `{run_id}` does not exist")]
    RunNotFound {
        /// The run.
        run_id: String,
    },

    /// The run exists as another workflow type.
    #[error("run `{run_id}` is a `{stored}` run, not a `{requested}` run")]
    WorkflowMismatch {
        /// The run.
        run_id: String,
        /// The workflow the run was started as.
        stored: String,
        /// The workflow it was driven as now.
        requested: &'static str,
    },

    /// The stored schema hash differs from the compiled one: the workflow enum (or loops'
    /// record format) changed since the run was recorded. Nothing was written.
    #[error(
        "run `{run_id}` of workflow `{workflow}` was recorded with schema {stored} but this build has {compiled}; refusing to resume{} (keep the old version registered, or write a migration: see docs/evolution.md)",
        describe_changes(changes)
    )]
    SchemaMismatch {
        /// The run.
        run_id: String,
        /// The workflow name.
        workflow: String,
        /// The hash stored with the run's records.
        stored: SchemaHash,
        /// The hash compiled into this build.
        compiled: SchemaHash,
        /// What changed, each change with its class (compatible or breaking) and why; never
        /// empty (a missing stored description is a change of its own).
        changes: crate::schema::SchemaDiff,
    },

    /// The run is [blocked](crate::RunStatus::Blocked): a build that cannot drive it said so
    /// (the reason is its [`BlockInfo`](crate::BlockInfo)'s). It is left as it is until a
    /// build that can route it unblocks it (docs/evolution.md).
    #[error("run `{run_id}` is blocked in state `{state}` at seq {seq}: {reason}")]
    RunBlocked {
        /// The run.
        run_id: String,
        /// Its state.
        state: String,
        /// Its seq.
        seq: u64,
        /// Why it is blocked.
        reason: String,
    },

    /// A [`Write::Migrate`](crate::store::Write::Migrate) does not fit the run: its record is
    /// not a migration of the run's current record (another schema, seq or state seq).
    /// Nothing was written.
    #[error("run `{run_id}`: the migration of seq {seq} is refused: {reason}")]
    MigrationRefused {
        /// The run.
        run_id: String,
        /// The seq the migration was for.
        seq: u64,
        /// What does not fit.
        reason: String,
    },

    /// A registered version claims to accept an older stored schema
    /// ([`Workflow::ACCEPTS`](crate::Workflow::ACCEPTS), `#[workflow(accepts = [..])]`), but
    /// the store's description of that schema differs from the version's by changes that are
    /// breaking whatever state a run is in: the store is not opened. Write a migration
    /// instead (docs/evolution.md).
    #[error(
        "version {version} of workflow `{workflow}` claims to accept schema {accepts}, but these changes are breaking{}",
        describe_changes(changes)
    )]
    AcceptsRefused {
        /// The workflow.
        workflow: String,
        /// The version that makes the claim.
        version: u32,
        /// The schema it claims to accept.
        accepts: SchemaHash,
        /// The breaking changes.
        changes: crate::schema::SchemaDiff,
    },

    /// The run is being driven already, by this process.
    #[error("run `{run_id}` is already being driven")]
    RunActive {
        /// The run.
        run_id: String,
    },

    /// A new run must start in the workflow's initial state.
    #[error(
        "run `{run_id}`: a new `{workflow}` run must start in state `{initial}`, not `{given}`"
    )]
    NotInitial {
        /// The run.
        run_id: String,
        /// The workflow name.
        workflow: &'static str,
        /// The declared initial state.
        initial: &'static str,
        /// The state that was given.
        given: &'static str,
    },

    /// A record at this sequence number exists already; records are never overwritten.
    #[error("run `{run_id}`: a record at seq {seq} exists already (records are immutable)")]
    SequenceConflict {
        /// The run.
        run_id: String,
        /// The sequence number that was taken.
        seq: u64,
    },

    /// The run's row points at a sequence number that has no record: the store was altered
    /// outside loops.
    #[error("run `{run_id}`: its row points at seq {seq} but no record exists there")]
    RecordMissing {
        /// The run.
        run_id: String,
        /// The sequence number without a record.
        seq: u64,
    },

    /// A step record exists already under this key; step records are immutable.
    #[error("run `{run_id}`: step `{step}`#{occurrence} of seq {seq} is recorded already")]
    StepExists {
        /// The run.
        run_id: String,
        /// The state's sequence number.
        seq: u64,
        /// The step name.
        step: String,
        /// Which use of the name, from 0.
        occurrence: u32,
    },

    /// A write for a state the run has already left (or a run that has ended) was refused:
    /// only the driver of the current state may write.
    #[error("run `{run_id}`: write for seq {seq} refused: the run is at seq {current} ({status})")]
    Fenced {
        /// The run.
        run_id: String,
        /// The sequence number the write was for.
        seq: u64,
        /// The run's current sequence number.
        current: u64,
        /// The run's status.
        status: RunStatus,
    },

    /// A handler returned a state that is not an allowed next state. The derive makes this a
    /// compile error; the runtime checks again before committing.
    #[error("run `{run_id}`: state `{from}` (seq {seq}) may not move to `{to}`")]
    IllegalTransition {
        /// The run.
        run_id: String,
        /// The current state.
        from: &'static str,
        /// The rejected next state.
        to: &'static str,
        /// The current state's sequence number.
        seq: u64,
    },

    /// An event's payload could not be serialized (by [`Runtime::send`](crate::Runtime::send));
    /// nothing was written.
    #[error("run `{run_id}`: cannot encode the payload of event `{event}`")]
    EventEncode {
        /// The run.
        run_id: String,
        /// The event's name.
        event: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// A state could not be serialized.
    #[error("run `{run_id}`: cannot encode state `{state}` (seq {seq})")]
    Encode {
        /// The run.
        run_id: String,
        /// The state.
        state: String,
        /// Its sequence number.
        seq: u64,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// A stored record does not decode: the store was damaged or altered outside loops.
    #[error("run `{run_id}`: {} does not decode", decoded(record, *seq, state))]
    Decode {
        /// The run.
        run_id: String,
        /// What the record is.
        record: RecordKind,
        /// The sequence number of the state the record belongs to (for an event, its event
        /// seq in the run's inbox; 0 for the run's row).
        seq: u64,
        /// For a transition record, the state named in the record (or `?` if the envelope
        /// itself is unreadable); empty for other records.
        state: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// A serialized payload exceeds the configured limit; nothing was written.
    #[error(
        "run `{run_id}`: {what}{} is {bytes} bytes, over the {limit}-byte limit",
        at_seq(*.seq)
    )]
    PayloadTooLarge {
        /// The run.
        run_id: String,
        /// What was too large ("state `Planned`", "output of step `plan`#0", "payload of
        /// event `approve`").
        what: String,
        /// The sequence number of the state it belonged to; `None` for an event's payload,
        /// which belongs to the run's inbox rather than to a state.
        seq: Option<u64>,
        /// Its size in bytes.
        bytes: usize,
        /// The limit in bytes.
        limit: usize,
    },

    /// The run failed: its retry policy ran out of attempts (or of interruptions).
    /// `last_error` is the error chain of the last attempt, outermost first; `source` is that
    /// error itself when it failed in this process (then the message leaves the chain to it).
    #[error(
        "run `{run_id}` failed in state `{state}` (seq {seq}) after {}",
        attempts_text(*attempts, *interrupted, last_error, source.is_some())
    )]
    RunFailed {
        /// The run.
        run_id: String,
        /// The state it failed in.
        state: String,
        /// That state's sequence number.
        seq: u64,
        /// Attempts made, interrupted ones included.
        attempts: u32,
        /// How many of them the process stopping cut short.
        interrupted: u32,
        /// The last attempt's error chain, outermost first.
        last_error: Vec<String>,
        /// The last attempt's error itself, when it failed in this process.
        #[source]
        source: Option<BoxError>,
    },

    /// The run was cancelled.
    #[error("run `{run_id}` was cancelled in state `{state}` (seq {seq}): {reason}")]
    RunCancelled {
        /// The run.
        run_id: String,
        /// The state it was in.
        state: String,
        /// That state's sequence number.
        seq: u64,
        /// The reason given to `cancel`.
        reason: String,
    },

    /// The operation needs a run that has not ended.
    #[error("run `{run_id}` has ended ({status}); {action} is not possible")]
    RunEnded {
        /// The run.
        run_id: String,
        /// Its final status.
        status: RunStatus,
        /// What was attempted ("cancel").
        action: &'static str,
    },

    /// The operation needs a failed run.
    #[error("run `{run_id}` is {status}, not failed; only a failed run can be retried")]
    NotFailed {
        /// The run.
        run_id: String,
        /// Its status.
        status: RunStatus,
    },

    /// A recorded step's output does not decode as the type the handler asks for now:
    /// the handler's code changed between the record and this execution.
    #[error(
        "run `{run_id}`: step `{step}`#{occurrence} of state `{state}` (seq {seq}) was recorded in a form that does not decode as the requested type"
    )]
    StepDecode {
        /// The run.
        run_id: String,
        /// The state whose handler ran the step.
        state: &'static str,
        /// That state's sequence number.
        seq: u64,
        /// The step name.
        step: String,
        /// Which use of the name within the state's execution, from 0.
        occurrence: u32,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// An event's payload does not decode as the type the waiting handler asks for.
    #[error(
        "run `{run_id}`: event `{event}` (event seq {event_seq}) delivered to state `{state}` (seq {seq}) does not decode as the requested type"
    )]
    EventDecode {
        /// The run.
        run_id: String,
        /// The state whose handler waited.
        state: &'static str,
        /// That state's sequence number.
        seq: u64,
        /// The event name.
        event: String,
        /// The event's sequence number in the run's inbox.
        event_seq: u64,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// A step's output could not be serialized; the step's effect happened but is not recorded.
    #[error(
        "run `{run_id}`: output of step `{step}`#{occurrence} of state `{state}` (seq {seq}) cannot be encoded"
    )]
    StepEncode {
        /// The run.
        run_id: String,
        /// The state whose handler ran the step.
        state: &'static str,
        /// That state's sequence number.
        seq: u64,
        /// The step name.
        step: String,
        /// Which use of the name, from 0.
        occurrence: u32,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// A step ran longer than its time-out and was abandoned.
    #[error(
        "run `{run_id}`: step `{step}`#{occurrence} of state `{state}` (seq {seq}) timed out after {after_ms} ms"
    )]
    StepTimeout {
        /// The run.
        run_id: String,
        /// The state.
        state: &'static str,
        /// Its sequence number.
        seq: u64,
        /// The step name.
        step: String,
        /// Which use of the name, from 0.
        occurrence: u32,
        /// The time-out in ms.
        after_ms: u64,
    },

    /// A state's handler ran longer than its time-out and was abandoned.
    #[error(
        "run `{run_id}`: handler of state `{state}` (seq {seq}, attempt {attempt}) timed out after {after_ms} ms"
    )]
    StateTimeout {
        /// The run.
        run_id: String,
        /// The state.
        state: &'static str,
        /// Its sequence number.
        seq: u64,
        /// The attempt, from 1.
        attempt: u32,
        /// The time-out in ms.
        after_ms: u64,
    },

    /// A state's handler panicked (in its own code or in a step's closure). The panic is
    /// caught and counts as a failed attempt under the retry policy, like an error; the
    /// process's panic hook has printed it as usual. A build with `panic = "abort"` cannot
    /// catch it: the process ends, and the attempt counts as interrupted when the run resumes.
    #[error(
        "run `{run_id}`: handler of state `{state}` (seq {seq}, attempt {attempt}) panicked: {message}"
    )]
    HandlerPanicked {
        /// The run.
        run_id: String,
        /// The state.
        state: &'static str,
        /// Its sequence number.
        seq: u64,
        /// The attempt, from 1.
        attempt: u32,
        /// The panic's message (its payload when that is a string, else a placeholder).
        message: String,
    },

    /// The run was cancelled while its handler was running; returned by steps started after
    /// the cancellation.
    #[error("run `{run_id}`: cancelled during state `{state}` (seq {seq})")]
    Cancelled {
        /// The run.
        run_id: String,
        /// The state.
        state: &'static str,
        /// Its sequence number.
        seq: u64,
    },

    /// No handler is registered for the workflow ([`Runtime::register`](crate::Runtime::register)).
    #[error("no handler is registered for workflow `{workflow}`")]
    NotRegistered {
        /// The workflow name.
        workflow: String,
    },

    /// The runtime is shutting down; the store's writer has stopped.
    #[error("the store is closed")]
    Closed,
}

/// What kind of stored record an [`Error::Decode`] is about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordKind {
    /// A transition record: the state the run entered at `seq`.
    Transition,
    /// The run's row: its current standing (status, state, seq, wait).
    RunRow,
    /// A step record of the state at `seq`.
    Step {
        /// The step's name.
        name: String,
        /// Which use of the name, from 0.
        occurrence: u32,
    },
    /// The record of a failed attempt at the state at `seq`.
    Failure,
    /// An event in the run's inbox (`seq` is its event seq).
    Event {
        /// The event's name, when it was known before its record was read.
        name: Option<String>,
    },
    /// The recorded outcome of a wait for an event, in the state at `seq`.
    Wait {
        /// The event waited for.
        event: String,
    },
}

/// The record in [`Error::Decode`]'s message: `transition record at seq 3 (state `Work`)`,
/// `run row`, `event record at event seq 0`, ...
fn decoded(record: &RecordKind, seq: u64, state: &str) -> String {
    match record {
        RecordKind::Transition if state.is_empty() || state == "?" => {
            format!("transition record at seq {seq}")
        }
        RecordKind::Transition => format!("transition record at seq {seq} (state `{state}`)"),
        RecordKind::RunRow => "run row".to_owned(),
        RecordKind::Step { name, occurrence } => {
            format!("step record `{name}`#{occurrence} of seq {seq}")
        }
        RecordKind::Failure => format!("failure record of seq {seq}"),
        RecordKind::Event { name: Some(name) } => {
            format!("event record `{name}` at event seq {seq}")
        }
        RecordKind::Event { name: None } => format!("event record at event seq {seq}"),
        RecordKind::Wait { event } => {
            format!("recorded outcome of the wait for `{event}` of seq {seq}")
        }
    }
}

fn attempts_text(
    attempts: u32,
    interrupted: u32,
    last_error: &[String],
    has_source: bool,
) -> String {
    let plural = |n: u32| if n == 1 { "" } else { "s" };
    if interrupted == attempts {
        return format!(
            "{attempts} attempt{}, each cut short by the process stopping",
            plural(attempts)
        );
    }
    let counted = match interrupted {
        0 => format!("{attempts} attempt{}", plural(attempts)),
        i => format!(
            "{attempts} attempt{} ({i} cut short by the process stopping)",
            plural(attempts)
        ),
    };
    // With a source, the chain is the source's to tell.
    if has_source || last_error.is_empty() {
        counted
    } else {
        format!("{counted}: {}", last_error.join(": "))
    }
}

/// The run id as shown in a message: at most 64 characters, then how long it was.
fn shown_id(run_id: &str) -> String {
    if run_id.chars().count() <= 64 {
        format!("{run_id:?}")
    } else {
        let head: String = run_id.chars().take(64).collect();
        format!("{head:?}... ({} bytes)", run_id.len())
    }
}

fn describe_changes(changes: &crate::schema::SchemaDiff) -> String {
    if changes.is_empty() {
        String::new()
    } else {
        format!("; changes: {changes}")
    }
}

/// `Result` with loops' [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Database`]: `action` says what the store was doing, `source` is the
    /// database client's error.
    pub fn database(
        action: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Database {
            action: action.into(),
            source: Arc::new(source),
        }
    }

    /// An [`Error::Storage`] from a redb error (converted to `redb::Error`, so that a caller
    /// who downcasts the source finds one type).
    pub(crate) fn storage(action: impl Into<String>, source: impl Into<redb::Error>) -> Self {
        Error::Storage {
            action: action.into(),
            source: Arc::new(source.into()),
        }
    }

    /// Whether the same call may succeed if it is made again later, unchanged: the store
    /// could not be reached or failed on the system (an I/O error, a lost connection:
    /// [`Storage`](Error::Storage), [`Database`](Error::Database)), the store file is open
    /// elsewhere ([`StoreLocked`](Error::StoreLocked)), or another driver in this process
    /// holds the run for now ([`RunActive`](Error::RunActive)). Every other error is about
    /// the request, the run or the stored records, and repeats until one of those changes.
    /// A write that failed transiently may still have committed when the connection was lost
    /// during its commit (see [`Database`](Error::Database)); the writes of loops are made so
    /// that repeating them is safe.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Storage { .. }
                | Error::Database { .. }
                | Error::StoreLocked { .. }
                | Error::RunActive { .. }
        )
    }

    /// The run the error is about, when there is one.
    pub fn run_id(&self) -> Option<&str> {
        match self {
            Error::InvalidRunId { run_id, .. }
            | Error::InvalidName { run_id, .. }
            | Error::RunNotFound { run_id }
            | Error::WorkflowMismatch { run_id, .. }
            | Error::SchemaMismatch { run_id, .. }
            | Error::RunActive { run_id }
            | Error::MigrationRefused { run_id, .. }
            | Error::RunBlocked { run_id, .. }
            | Error::NotInitial { run_id, .. }
            | Error::SequenceConflict { run_id, .. }
            | Error::RecordMissing { run_id, .. }
            | Error::StepExists { run_id, .. }
            | Error::Fenced { run_id, .. }
            | Error::IllegalTransition { run_id, .. }
            | Error::EventEncode { run_id, .. }
            | Error::Encode { run_id, .. }
            | Error::Decode { run_id, .. }
            | Error::PayloadTooLarge { run_id, .. }
            | Error::RunFailed { run_id, .. }
            | Error::RunCancelled { run_id, .. }
            | Error::RunEnded { run_id, .. }
            | Error::NotFailed { run_id, .. }
            | Error::StepDecode { run_id, .. }
            | Error::EventDecode { run_id, .. }
            | Error::StepEncode { run_id, .. }
            | Error::StepTimeout { run_id, .. }
            | Error::StateTimeout { run_id, .. }
            | Error::HandlerPanicked { run_id, .. }
            | Error::Cancelled { run_id, .. } => Some(run_id),
            Error::StoreLocked { .. }
            | Error::NeedsRecovery { .. }
            | Error::ReadOnly { .. }
            | Error::Open { .. }
            | Error::Storage { .. }
            | Error::Database { .. }
            | Error::NotRegistered { .. }
            | Error::AcceptsRefused { .. }
            | Error::Closed => None,
        }
    }
}

impl Error {
    /// The message and the messages of its `source()` chain, joined by `": "`: the whole
    /// story in one line, for logs and command-line tools.
    pub fn chain(&self) -> String {
        error_chain(self).join(": ")
    }
}

/// `" at seq N"`, or nothing for `None`: for messages about a payload that may belong to no
/// state.
fn at_seq(seq: Option<u64>) -> String {
    seq.map(|seq| format!(" at seq {seq}")).unwrap_or_default()
}

/// The error and its `source()` chain as text, outermost first.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = vec![err.to_string()];
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push(e.to_string());
        cur = e.source();
    }
    out
}
