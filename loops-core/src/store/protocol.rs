//! The storage protocol: the writes a store applies and what it answers.

use serde::{Deserialize, Serialize};

use super::RunInfo;
use crate::attribute::AttributeValue;
use crate::error::{Error, Result};
use crate::record::{FailureRecord, TransitionRecord};
use crate::schedule::ScheduleInfo;
use crate::schema::SchemaHash;

/// One write of the storage protocol. A store applies each write atomically (one redb write
/// transaction, possibly shared with other writes; one PostgreSQL transaction), checking its
/// preconditions first: a write that fails them leaves no trace and returns its error.
///
/// What each write means (its checks, row changes and records) is given once, by
/// [`plan`](super::plan()); a store gathers the facts the write [`needs`](Write::needs) and
/// writes the plan's [`Effects`](super::Effects) out. New writes may be added in any release:
/// match with a wildcard arm.
#[derive(Debug)]
#[non_exhaustive]
// A write is built once and moved into the store: boxing `Create`'s row (the largest variant,
// since rows carry their block) would cost an allocation for no copy saved.
#[allow(clippy::large_enum_variant)]
pub enum Write {
    /// Create a run with its initial record (seq 0).
    Create {
        /// The new run's row (seq 0, attempt 1).
        info: RunInfo,
        /// The [`TransitionRecord`](crate::TransitionRecord) of seq 0, serialized.
        record: Vec<u8>,
        /// The workflow's schema description, stored once per schema hash.
        schema_text: &'static str,
        /// The run's attributes given at its start (checked as [`Write::SetAttributes`]'s).
        attributes: Vec<(String, AttributeValue)>,
    },
    /// Append the record of `seq` (the run's next sequence number) and move the run to it.
    Transition {
        /// The run.
        run_id: String,
        /// The new record's sequence number: the run's current seq + 1.
        seq: u64,
        /// The state entered.
        state: String,
        /// The [`TransitionRecord`](crate::TransitionRecord), serialized.
        record: Vec<u8>,
        /// Whether the state ends the run (status becomes completed).
        terminal: bool,
        /// Commit time, ms since the Unix epoch.
        at_ms: u64,
        /// Whether the driver lets the run go once this is committed (a draining runtime,
        /// [`Runtime::drain`](crate::Runtime::drain)): the new state's first attempt is then
        /// not begun (the row's attempt is 0), so the worker or process that takes the run up
        /// begins it without counting an interruption. `false` for every other transition.
        hands_over: bool,
    },
    /// Record a step's output.
    Step {
        /// The run.
        run_id: String,
        /// The state's sequence number (must be the run's current
        /// [`state_seq`](RunInfo::state_seq), as for every write made in a state).
        seq: u64,
        /// The step name.
        name: String,
        /// Which use of the name, from 0.
        occurrence: u32,
        /// The [`StepRecord`](crate::StepRecord), serialized.
        record: Vec<u8>,
        /// `Some(now)` (ms since the Unix epoch) when earlier tries of this step failed: their
        /// failures set the run's [`error`](RunInfo::error), which this record clears (and
        /// the row's `updated_ms` becomes `now`). `None` (a step recorded at its first try)
        /// leaves the row as it is.
        clear_error_at_ms: Option<u64>,
    },
    /// Record a failed attempt (or a failed step) and what follows from it.
    Failure {
        /// The run.
        run_id: String,
        /// The state's sequence number (must be the run's current [`state_seq`](RunInfo::state_seq)).
        seq: u64,
        /// What failed.
        record: FailureRecord,
        /// What follows for the run.
        then: AfterFailure,
    },
    /// Start the next attempt at the current state, or fail the run if attempts ran out. An
    /// attempt that left no failure record was interrupted: it gets an `Interrupted` failure
    /// record and counts against `max_interruptions`.
    BeginAttempt {
        /// The run.
        run_id: String,
        /// The state's sequence number (must be the run's current [`state_seq`](RunInfo::state_seq)).
        seq: u64,
        /// The retry policy's failed attempts allowed (counted from the row's `attempt_base`).
        max_attempts: u32,
        /// The retry policy's interrupted attempts allowed.
        max_interruptions: u32,
        /// Now, ms since the Unix epoch.
        at_ms: u64,
    },
    /// Ask for the run to be cancelled; end it at once if `end_now`.
    Cancel {
        /// The run.
        run_id: String,
        /// Why.
        reason: String,
        /// End the run at once (nobody drives it) rather than at its next boundary.
        end_now: bool,
        /// Now, ms since the Unix epoch.
        at_ms: u64,
    },
    /// End a run whose cancellation was asked for.
    EndCancelled {
        /// The run.
        run_id: String,
        /// Now, ms since the Unix epoch.
        at_ms: u64,
    },
    /// Make a failed run running again, with a fresh budget of attempts (their numbers
    /// count on: the row's `attempt_base` is where the budget starts).
    Retry {
        /// The run.
        run_id: String,
        /// Now, ms since the Unix epoch.
        at_ms: u64,
    },
    /// A wait of the handler at `seq`, recorded as the step `(name, occurrence)`: deliver the
    /// oldest undelivered `event` (if one is named), or end the wait if `until_ms` passed, or
    /// park the run (status waiting). One transaction, so no event sent meanwhile is missed.
    Wait {
        /// The run.
        run_id: String,
        /// The state's sequence number (must be the run's current [`state_seq`](RunInfo::state_seq)).
        seq: u64,
        /// The attempt recording the outcome.
        attempt: u32,
        /// The step the outcome is recorded as (event waits); sleeps record nothing here.
        step: Option<(String, u32)>,
        /// The event waited for, if any.
        event: Option<String>,
        /// When the wait ends on its own, ms since the Unix epoch.
        until_ms: Option<u64>,
        /// Now, ms since the Unix epoch.
        at_ms: u64,
    },
    /// Append an event to a run's inbox (once per idempotency key).
    Send {
        /// The run.
        run_id: String,
        /// The event name.
        name: String,
        /// The payload, JSON.
        payload: String,
        /// The sender's idempotency key: a second send with it writes nothing.
        key: Option<String>,
        /// Now, ms since the Unix epoch.
        at_ms: u64,
    },
    /// A waiting run is being driven again.
    Wake {
        /// The run.
        run_id: String,
        /// The state's sequence number (must be the run's current [`state_seq`](RunInfo::state_seq)).
        seq: u64,
        /// Now, ms since the Unix epoch.
        at_ms: u64,
    },
    /// Mark a run [blocked](super::RunStatus::Blocked): no build that looked at it can drive
    /// it. Committed once: if the run is blocked already for the same schema and reason,
    /// nothing is written (the reply is the row as it is); a run whose schema is no longer
    /// `schema` (migrated meanwhile) is left as it is too. A blocked run goes back to the
    /// status it had ([`BlockInfo::resume`](crate::BlockInfo::resume)) with [`Write::Unblock`] or
    /// [`Write::Migrate`].
    Block {
        /// The run.
        run_id: String,
        /// The run's schema hash, as the blocker read it.
        schema: SchemaHash,
        /// Why (one sentence).
        reason: String,
        /// What changed, one human line per change.
        changes: Vec<String>,
        /// Now, ms since the Unix epoch.
        at_ms: u64,
    },
    /// A blocked run goes back to the status it had before it was blocked; any other run is
    /// left as it is (nothing is written).
    Unblock {
        /// The run.
        run_id: String,
        /// Now, ms since the Unix epoch.
        at_ms: u64,
    },
    /// Commit a migration: append `record` (a migration's record: its
    /// [`migrated`](TransitionRecord::migrated) names the schema migrated from and the state's
    /// seq) at `seq + 1`, and move the run's row to it: state, schema, and
    /// [`entered`](RunInfo::entered) (the state continues, so its steps stay keyed by the seq
    /// it was entered at). Expects the row at `seq`, not ended, with the schema migrated
    /// from; a blocked run is unblocked. Attempts, waits and events are untouched. Stores the
    /// new schema's description as [`Write::Create`] does.
    Migrate {
        /// The run.
        run_id: String,
        /// The run's current seq (the record migrated is the one at `seq`).
        seq: u64,
        /// The migration's record, for seq `seq + 1`.
        record: TransitionRecord,
        /// The new version's schema description, stored once per schema hash.
        schema_text: &'static str,
        /// Whether the record's state is terminal in the new version: the run completes.
        terminal: bool,
    },
    /// Set searchable attributes of the run, from its handler in the state entered at `seq`:
    /// each key gets its value, replacing the value it had (the same value again writes the
    /// same entry: a handler run again after a crash sets nothing twice). Fenced like a
    /// step: refused unless the run is in that state, not ended nor blocked, and (with a
    /// lease) held by the writer. Each key and value is checked by
    /// [`check_attribute`](crate::check_attribute). The row is unchanged.
    SetAttributes {
        /// The run.
        run_id: String,
        /// The state's sequence number (must be the run's current [`state_seq`](RunInfo::state_seq)).
        seq: u64,
        /// The attributes, in order (a key given twice keeps its last value).
        attributes: Vec<(String, AttributeValue)>,
    },
    /// Delete every record, row, index entry, attribute and event of these ended runs.
    Prune {
        /// The runs; those that do not exist are skipped, and so is every run linked to one
        /// that has not ended (its parent, its children, theirs) among them: a family goes
        /// whole or not at all.
        run_ids: Vec<String>,
    },
    /// Record that the store holds payloads sealed with key `key` (a runtime with a codec
    /// writes it before its first payload; see [`Store::sealing_keys`](super::Store::sealing_keys)).
    /// A key recorded already keeps its first time.
    Seal {
        /// The id of the key that seals (`PayloadCodec::key_id`).
        key: String,
        /// Its check value (`PayloadCodec::key_check`), recorded if the key has none yet.
        check: Option<String>,
        /// When, in ms since the Unix epoch.
        at_ms: u64,
    },
    /// Register the schedule `info.name`: a new one is stored as `info` is; an existing one
    /// takes `info`'s workflow, spec and catch-up policy and keeps its pause, its ticks
    /// ([`through_ms`](ScheduleInfo::through_ms), [`last_tick_ms`](ScheduleInfo::last_tick_ms))
    /// and its creation time. Replies [`Reply::Schedule`] with the stored row.
    PutSchedule {
        /// The schedule as a new registration would store it.
        info: ScheduleInfo,
    },
    /// Pause (`paused`) or resume a schedule. Resuming settles every tick up to `at_ms`
    /// (they fell while it was paused: none is caught up). Replies [`Reply::Schedule`];
    /// refused with [`Error::ScheduleNotFound`] if there is no such schedule.
    PauseSchedule {
        /// The schedule.
        name: String,
        /// Paused (`true`) or resumed.
        paused: bool,
        /// Now, ms since the Unix epoch.
        at_ms: u64,
    },
    /// Delete a schedule (the runs its ticks started stay). Refused with
    /// [`Error::ScheduleNotFound`] if there is no such schedule.
    RemoveSchedule {
        /// The schedule.
        name: String,
    },
    /// Record that a schedule's tick `tick_ms` fired (its run exists): its
    /// [`through_ms`](ScheduleInfo::through_ms) and [`last_tick_ms`](ScheduleInfo::last_tick_ms)
    /// move up to it; neither ever moves back. Replies [`Reply::Schedule`], or
    /// [`Reply::Done`] (nothing written) if the schedule was removed.
    TickSchedule {
        /// The schedule.
        name: String,
        /// The tick's time, ms since the Unix epoch.
        tick_ms: u64,
        /// Now, ms since the Unix epoch.
        at_ms: u64,
    },
}

/// What a [`Write::Failure`] does to the run besides keeping the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Nothing (a step failed; the handler decides).
    Nothing,
    /// The next attempt may start at this time (ms since the Unix epoch).
    RetryAt(u64),
    /// The run fails.
    GiveUp,
}

/// What the writer answers to one write. New answers may be added in any release: match
/// with a wildcard arm.
#[derive(Debug)]
#[non_exhaustive]
pub enum Reply {
    /// The run's row after the write.
    Run(RunInfo),
    /// Written; nothing to report.
    Done,
    /// The outcome of a [`Write::Wait`], with the run's row after it.
    Waited(WaitOutcome, RunInfo),
    /// Runs were pruned; this many transition records went with them.
    Pruned {
        /// Transition records deleted.
        records: u64,
        /// The runs deleted, in the order the write named them.
        run_ids: Vec<String>,
    },
    /// An event was appended (or was a duplicate of `event_seq`), with the run's row.
    Sent {
        /// The event's sequence number in the run's inbox.
        event_seq: u64,
        /// Whether the idempotency key had been used (nothing was written).
        duplicate: bool,
        /// The run's row.
        info: RunInfo,
    },
    /// A schedule's row after the write.
    Schedule(ScheduleInfo),
}

/// The outcome of a [`Write::Wait`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The oldest undelivered event of the name was delivered to the wait (its payload JSON).
    Delivered {
        /// The event's sequence number in the inbox.
        event_seq: u64,
        /// Its payload, JSON.
        payload: String,
    },
    /// The wait's time passed (and, for an event, none came): recorded as timed out.
    Due,
    /// Nothing yet: the run is now waiting.
    Parked,
}

impl Write {
    /// The write's kind, as its variant is spelled (`"Transition"`, `"Step"`, ...).
    pub fn kind(&self) -> &'static str {
        Self::KINDS[self.kind_index()]
    }

    /// Every name [`kind`](Self::kind) returns, in the order of the variants: what reads a
    /// kind back from its name (the test kit's child processes report writes by name).
    pub const KINDS: [&'static str; 21] = [
        "Create",
        "Transition",
        "Step",
        "Failure",
        "BeginAttempt",
        "Cancel",
        "EndCancelled",
        "Retry",
        "Wait",
        "Send",
        "Wake",
        "Block",
        "Unblock",
        "Migrate",
        "SetAttributes",
        "Prune",
        "Seal",
        "PutSchedule",
        "PauseSchedule",
        "RemoveSchedule",
        "TickSchedule",
    ];

    /// The variant's place in [`KINDS`](Self::KINDS): the one match over the variants that
    /// names them.
    fn kind_index(&self) -> usize {
        match self {
            Write::Create { .. } => 0,
            Write::Transition { .. } => 1,
            Write::Step { .. } => 2,
            Write::Failure { .. } => 3,
            Write::BeginAttempt { .. } => 4,
            Write::Cancel { .. } => 5,
            Write::EndCancelled { .. } => 6,
            Write::Retry { .. } => 7,
            Write::Wait { .. } => 8,
            Write::Send { .. } => 9,
            Write::Wake { .. } => 10,
            Write::Block { .. } => 11,
            Write::Unblock { .. } => 12,
            Write::Migrate { .. } => 13,
            Write::SetAttributes { .. } => 14,
            Write::Prune { .. } => 15,
            Write::Seal { .. } => 16,
            Write::PutSchedule { .. } => 17,
            Write::PauseSchedule { .. } => 18,
            Write::RemoveSchedule { .. } => 19,
            Write::TickSchedule { .. } => 20,
        }
    }

    /// The run the write is for; `None` for [`Write::Prune`], which names several, for
    /// [`Write::Seal`], which is about the store, and for the writes of schedules.
    pub fn run_id(&self) -> Option<&str> {
        match self {
            Write::Create { info, .. } => Some(&info.run_id),
            Write::Transition { run_id, .. }
            | Write::Step { run_id, .. }
            | Write::Failure { run_id, .. }
            | Write::BeginAttempt { run_id, .. }
            | Write::Cancel { run_id, .. }
            | Write::EndCancelled { run_id, .. }
            | Write::Retry { run_id, .. }
            | Write::Wait { run_id, .. }
            | Write::Send { run_id, .. }
            | Write::Wake { run_id, .. }
            | Write::Block { run_id, .. }
            | Write::Unblock { run_id, .. }
            | Write::Migrate { run_id, .. }
            | Write::SetAttributes { run_id, .. } => Some(run_id),
            Write::Prune { .. } | Write::Seal { .. } => None,
            Write::PutSchedule { .. }
            | Write::PauseSchedule { .. }
            | Write::RemoveSchedule { .. }
            | Write::TickSchedule { .. } => None,
        }
    }
}

impl Reply {
    /// The run's row carried by the reply.
    ///
    /// # Errors
    /// [`Error::RunNotFound`] for a reply that carries none.
    pub fn into_run(self, run_id: &str) -> Result<RunInfo> {
        match self {
            Reply::Run(info) | Reply::Waited(_, info) | Reply::Sent { info, .. } => Ok(info),
            Reply::Done | Reply::Pruned { .. } | Reply::Schedule(_) => Err(Error::RunNotFound {
                run_id: run_id.to_owned(),
            }),
        }
    }
}

/// One event sent to a run, kept in its inbox until a wait takes it (and after, for
/// inspection).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventRecord {
    /// The event's name.
    pub name: String,
    /// The idempotency key the sender gave, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// When it was sent, in ms since the Unix epoch.
    pub at_ms: u64,
    /// The payload, serialized by serde_json.
    pub payload: Box<serde_json::value::RawValue>,
}
