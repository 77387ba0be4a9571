//! The one error type of loops-core.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::hint::{Hinted, RetryHint};
use crate::schema::SchemaHash;
use crate::status::RunStatus;
use crate::workflow::BoxError;

mod codec;
mod methods;
pub(crate) mod text;

pub use codec::{CodecError, NO_KEY_HINT};
pub use methods::retry_hint;
pub use text::{Holder, RecordKind, error_chain};
use text::{
    at_seq, attempts_text, cause_text, decoded, describe_changes, ended_text, format_text,
    holder_text, mismatch_remedy, not_failed_text, open_text, sealed_field, shown_id,
};

/// Everything loops-core can fail with. Each variant names the run, the state and the sequence
/// number involved, where there is one, so that a log line is enough to find the record.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store file is open in this or another process (redb's exclusive file lock, which
    /// the OS releases when the holder exits, even on SIGKILL).
    #[error("store {path} is already open in this or another process")]
    StoreLocked {
        /// The store file.
        path: PathBuf,
    },

    /// The store file records a format other than [`STORE_FORMAT`](crate::STORE_FORMAT);
    /// nothing was read or written. An older one is converted by `loops upgrade PATH`
    /// ([`RedbStore::upgrade`](crate::RedbStore::upgrade)); a newer one needs a newer loops.
    #[error("{}", format_text(path, *found, *supported))]
    StoreFormat {
        /// The store file.
        path: PathBuf,
        /// The format the file records.
        found: u64,
        /// The format this build reads and writes.
        supported: u64,
    },

    /// The store file was not closed cleanly (its process crashed): a read-only open cannot
    /// repair it, a writable one ([`Runtime::open`](crate::Runtime::open)) does.
    #[error("{}; a writable open repairs it", Error::needs_repair(path))]
    NeedsRecovery {
        /// The store file.
        path: PathBuf,
    },

    /// The store was opened read-only, and the write would change it
    /// ([`RedbStore::open_read_only`](crate::RedbStore::open_read_only)).
    #[error("store {path} is open read-only")]
    ReadOnly {
        /// The store file.
        path: PathBuf,
    },

    /// The store file could not be opened: not a redb file, damaged, or an I/O error. The
    /// message names the cause ("cannot open store PATH: I/O error: Permission denied (os
    /// error 13)"; for damage, `loops check` and a backup), so `source()` is `None`; the
    /// cause itself is in `cause` ([`Error::store_cause`]).
    #[error("{}", open_text(path, &**cause))]
    Open {
        /// The store file.
        path: PathBuf,
        /// What went wrong.
        cause: BoxError,
    },

    /// A read or a commit of the store failed (I/O error, full disk, corruption). The
    /// message names the cause ("store error while committing 2 writes: I/O error: No space
    /// left on device (os error 28)"), so `source()` is `None`; the cause itself is in
    /// `cause` ([`Error::store_cause`]).
    #[error("store error while {action}: {}", cause_text(&**cause))]
    Storage {
        /// What the store was doing ("committing 3 records", "reading run `r1`").
        action: String,
        /// The underlying error, shared: one failed commit fails every write in it. For the
        /// redb store it is a `redb::Error`, which `downcast_ref` reaches; its type is not
        /// part of this API.
        cause: Arc<dyn std::error::Error + Send + Sync + 'static>,
    },

    /// A database store (PostgreSQL) failed a read or a write (unreachable, connection lost,
    /// statement refused): not committed, unless the connection was lost during the commit
    /// (the run's next write finds out). The cause is in `cause` ([`Error::store_cause`]).
    #[error("store error while {action}: {}", cause_text(&**cause))]
    Database {
        /// What the store was doing ("committing a transition of run `r1`").
        action: String,
        /// The database client's error.
        cause: Arc<dyn std::error::Error + Send + Sync + 'static>,
    },

    /// The run id is empty, too long, contains control characters or white space at an end, or
    /// (a new run's) bidirectional controls or only invisible characters.
    #[error("invalid run id {}: {reason}", shown_id(run_id))]
    InvalidRunId {
        /// The rejected id (escaped when printed).
        run_id: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A step name, event name or idempotency key is empty, too long, holds control characters
    /// (or an event's key white space at an end), or a cancellation reason is empty or has them.
    #[error("run `{run_id}`: invalid {what} {}: {reason}", shown_id(name))]
    InvalidName {
        /// The run.
        run_id: String,
        /// What was rejected: `"step name"`, `"event name"`, `"idempotency key"` (given to
        /// [`Runtime::send_with_key`](crate::Runtime::send_with_key)), `"key name"` (given
        /// to [`Context::idempotency_key`](crate::Context::idempotency_key)) or
        /// `"cancellation reason"` (given to [`Runtime::cancel`](crate::Runtime::cancel)).
        what: &'static str,
        /// The rejected name (or key).
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// An attribute of a run was refused: its key is empty, too long or has a character
    /// outside ASCII letters, digits, `_`, `-` and `.`, or its string value is too long
    /// ([`check_attribute`](crate::check_attribute)). Nothing was written.
    #[error(
        "run `{run_id}` at seq {seq} (state `{state}`): invalid attribute {}: {reason}",
        shown_id(key)
    )]
    InvalidAttribute {
        /// The run.
        run_id: String,
        /// The state the run was in (its initial state, for attributes given at the start).
        state: String,
        /// The seq of that state.
        seq: u64,
        /// The rejected key.
        key: String,
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
    #[error("run `{run_id}` is a run of workflow `{stored}`, not of `{requested}`")]
    WorkflowMismatch {
        /// The run.
        run_id: String,
        /// The workflow the run was started as.
        stored: String,
        /// The workflow it was driven as now.
        requested: &'static str,
    },

    /// A handler's [`Context::start_child`](crate::Context::start_child) found a run with the
    /// child's id that is not this run's child of that workflow (another workflow, another
    /// parent, or no parent): nothing was written, and the run is left alone.
    #[error("run `{run_id}` (state `{state}`, seq {seq}) cannot start child `{child}`: {reason}")]
    ChildConflict {
        /// The parent run.
        run_id: String,
        /// The parent's state.
        state: &'static str,
        /// That state's sequence number.
        seq: u64,
        /// The child's run id.
        child: String,
        /// What the existing run is (`a run of workflow `w``, `the child of run `p``, ...).
        reason: String,
    },

    /// The stored schema hash differs from the compiled one: the workflow enum (or loops'
    /// record format) changed since the run was recorded. Nothing was written.
    #[error(
        "run `{run_id}` of workflow `{workflow}` was recorded with schema {stored} but this build has {compiled}; refusing to read its records, to resume it or to report its end{} ({}: see docs/evolution.md)",
        describe_changes(changes),
        mismatch_remedy(stored, changes)
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

    /// A version claims to accept an older schema ([`Workflow::ACCEPTS`](crate::Workflow::ACCEPTS))
    /// whose stored description differs from it by breaking changes: the store is not
    /// opened, or its runs not resumed. Write a migration instead (docs/evolution.md).
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

    /// Driven already: here, or by a worker whose lease has not lapsed (docs/postgres.md).
    #[error("run `{run_id}` is already being driven, {}", holder_text(holder))]
    RunActive {
        /// The run.
        run_id: String,
        /// Who drives it: this runtime, or the holder of its lease.
        holder: Holder,
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

    /// The run's row points at a seq that has no record: the store was altered outside loops.
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

    /// The lease of this worker on the run lapsed, by its own monotonic clock (it was paused,
    /// or could not renew it for longer than the lease time), before it ran a step's closure
    /// or sent a write: it stops driving the run, which another worker may hold now. Nothing
    /// was run or written.
    #[error(
        "run `{run_id}`: this worker's lease lapsed {late_ms} ms ago (by its own clock) before seq {seq} could go on; another worker may hold the run"
    )]
    LeaseExpired {
        /// The run.
        run_id: String,
        /// The state's sequence number.
        seq: u64,
        /// How long ago the lease lapsed, in ms.
        late_ms: u64,
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

    /// An event sent from outside the program ([`Runtime::send_json`](crate::Runtime::send_json):
    /// the CLI, the control endpoint) was refused: its run's workflow declares events and
    /// this is not one of them, or its payload cannot be the declared type. Nothing was written.
    #[error("run `{run_id}` (state `{state}`, seq {seq}): event `{event}` refused: {refusal}")]
    EventRefused {
        /// The run.
        run_id: String,
        /// The run's state when the event was refused.
        state: String,
        /// The run's seq then.
        seq: u64,
        /// The event's name.
        event: String,
        /// Why (boxed: it would make every `Result` of loops larger).
        refusal: Box<crate::schema::EventRefusal>,
    },

    /// A state does not serialize, or not as JSON that decodes back (a NaN, a skipped field).
    #[error("run `{run_id}`: cannot encode state `{state}` (seq {seq}) as JSON that decodes back")]
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

    /// The store lists keys that sealed payloads ([`Store::sealing_keys`](crate::Store::sealing_keys))
    /// and the runtime has no codec: refused at the open (a store built elsewhere: at its first
    /// read or write), rather than fail later or write in clear among sealed payloads.
    #[error("store {store} holds payloads encrypted with key {}: {NO_KEY_HINT}", keys.join(", "))]
    Encrypted {
        /// The store's label (a file path; a database without password).
        store: String,
        /// The ids of the keys that sealed its payloads, oldest first.
        keys: Vec<String>,
    },

    /// A runtime's codec, or a writer that [seals as the store does](crate::RuntimeBuilder::seal_as_store_does),
    /// holds none of the keys the store lists (`key`: its writing key). Nothing written.
    #[error(
        "store {store} holds payloads encrypted with key {} and none of them is held here: what key `{key}` sealed, its workers may not open (give the key file the workers use; after a rotation it holds the old key too)",
        keys.join(", ")
    )]
    KeyNotInStore {
        /// The store's label (a file path; a database without password).
        store: String,
        /// The id of the key that would seal.
        key: String,
        /// The ids of the keys that sealed the store's payloads, oldest first.
        keys: Vec<String>,
    },

    /// The codec's key `key` has another [check value](crate::PayloadCodec::key_check) than
    /// the store recorded for that id: it would seal what no other worker opens. Nothing written.
    #[error(
        "store {store}: key `{key}` is not the key `{key}` its payloads were sealed with (another key under the same id): give the runtime the key the workers use"
    )]
    KeyMismatch {
        /// The store's label (a file path; a database without password).
        store: String,
        /// The key id.
        key: String,
    },

    /// A payload sent from outside (an event, a cancellation reason) arrived sealed and this
    /// runtime cannot open it (no codec, a key it lacks, another key of the same id).
    #[error(
        "run `{run_id}`: the {} arrived encrypted and is refused: {cause}",
        sealed_field(record, 0, field)
    )]
    SealedRefused {
        /// The run.
        run_id: String,
        /// The record: an event (by name) or the run's row (a cancellation reason).
        record: RecordKind,
        /// The field (`payload`, `cancel`).
        field: &'static str,
        /// Why; it names the key id.
        cause: Box<CodecError>,
    },

    /// A payload could not be sealed or opened by the runtime's
    /// [`PayloadCodec`](crate::PayloadCodec): the key is missing or wrong, the payload was
    /// altered or moved, or it is sealed and no codec was given. Nothing is shown in clear.
    #[error("run `{run_id}`: the {} cannot be {action}: {cause}", sealed_field(record, *seq, field))]
    Payload {
        /// The run.
        run_id: String,
        /// The record.
        record: RecordKind,
        /// The seq of the record's state (an event's place has 0).
        seq: u64,
        /// The field (`payload`, `output`, `errors`, `cancel`, `block`).
        field: &'static str,
        /// `"opened"` or `"sealed"`.
        action: &'static str,
        /// Why; it names the key id.
        cause: Box<CodecError>,
    },

    /// A number read from the store (a seq, an attempt, the interruption count, a failure
    /// index, an event seq) is the largest its type holds and the write needs the next:
    /// loops never stores that, so the store was altered outside loops. Nothing written.
    #[error(
        "run `{run_id}`: {counter} {value} in the {} is the largest it can be, so {action} is not possible",
        decoded(record, *seq, "")
    )]
    CounterOverflow {
        /// The run.
        run_id: String,
        /// The record the number was read from ([`RecordKind::RunRow`] for the row's seq,
        /// attempt and interruption count).
        record: RecordKind,
        /// The sequence number of the state the record belongs to (for an event, its event
        /// seq; for the run's row, the row's seq).
        seq: u64,
        /// Which number: `"seq"`, `"attempt"`, `"interruption count"`, `"failure index"`,
        /// `"event seq"`.
        counter: &'static str,
        /// Its value as read.
        value: u64,
        /// What needed the next value ("moving to a next state", "retrying").
        action: &'static str,
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
    #[error(
        "run `{run_id}` was cancelled in state `{state}` (seq {seq}): {}",
        crate::bidi::escape_bidi_controls(reason)
    )]
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
    #[error("run `{run_id}` has ended ({status}); {action} is not possible{}", ended_text(*status))]
    RunEnded {
        /// The run.
        run_id: String,
        /// Its final status.
        status: RunStatus,
        /// What was attempted ("cancel").
        action: &'static str,
    },

    /// The operation needs a failed run.
    #[error("run `{run_id}` is {status}, not failed; {}", not_failed_text(*status))]
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

    /// A step's output does not serialize as JSON that decodes back; its effect happened, unrecorded.
    #[error(
        "run `{run_id}`: output of step `{step}`#{occurrence} of state `{state}` (seq {seq}) cannot be encoded as JSON that decodes back"
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

    /// A step's closure failed on its last try (or on a try whose error is
    /// [permanent](Error::permanent)); its tries are recorded as failures. `source` is the
    /// closure's error of the last try, so a handler can downcast it, and the retry hints
    /// in it ([`retry_hint`](crate::retry_hint)) reach the state's retry policy.
    #[error(
        "run `{run_id}`: step `{step}`#{occurrence} of state `{state}` (seq {seq}) failed after {tries} {}",
        if *tries == 1 { "try" } else { "tries" }
    )]
    StepFailed {
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
        /// Tries made in this round of the step's retry policy, the last one included.
        tries: u32,
        /// The last try's error.
        #[source]
        source: BoxError,
    },

    /// An error marked permanent by [`Error::permanent`]: no retry will fix it, so neither a
    /// step's retry policy nor the state's tries again.
    #[error("permanent error, not retried")]
    Permanent {
        /// The error, with its mark.
        #[source]
        source: Hinted,
    },

    /// An error that says when to try again, made by [`Error::retry_after`] (an HTTP 429 or
    /// 503 with `Retry-After`): the next try, of the step or of the state, waits at least
    /// that long.
    #[error("retry after {after_ms} ms")]
    RetryAfter {
        /// The hint, in ms.
        after_ms: u64,
        /// The error, with its hint.
        #[source]
        source: Hinted,
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

    /// No schedule has this name (pausing, resuming or removing it).
    #[error("schedule `{name}` does not exist")]
    ScheduleNotFound {
        /// The schedule's name.
        name: String,
    },

    /// A schedule that cannot be registered or read back: its name breaks
    /// [`check_schedule_name`](crate::check_schedule_name), its spec does not parse (a bad
    /// cron pattern, an unknown time zone, a zero interval), or its workflow has no handler.
    #[error("schedule `{name}`: {reason}")]
    InvalidSchedule {
        /// The schedule's name.
        name: String,
        /// Why.
        reason: String,
    },

    /// The runtime is shutting down; the store's writer has stopped.
    #[error("the store is closed")]
    Closed,
}

/// `Result` with loops' [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
