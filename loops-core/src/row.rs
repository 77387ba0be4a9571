//! A run's row: [`RunInfo`], its current standing, and [`WaitInfo`], what a waiting run
//! waits for. One mutable row per run, next to the run's immutable records.

use serde::{Deserialize, Serialize};

use crate::error::{Error, RecordKind, Result};
use crate::record::{FailureRecord, FailureSource};
use crate::schema::SchemaHash;
use crate::status::RunStatus;
use crate::workflow::{StateId, Workflow};

/// The error loops records for an attempt that the process's stop cut short (a
/// [`FailureSource::Interrupted`] failure record), and what every message about such an
/// attempt says of it: the one wording ([`interrupted_attempt`]).
pub const INTERRUPTED: &str =
    "the process stopped (or lost the run's lease) while this attempt ran";

/// What to say of attempt `attempt` that the process's stop cut short:
/// `attempt N did not finish: the process stopped (or lost the run's lease) while this attempt ran`. For the messages
/// of a program that resumes a run (the CLI's, an agent's "resuming at ..." line).
pub fn interrupted_attempt(attempt: u32) -> String {
    format!("attempt {attempt} did not finish: {INTERRUPTED}")
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
    /// explicit retry of a failed run); 0 while none is begun: a run queued by
    /// [`Runtime::enqueue`](crate::Runtime::enqueue), or let go by a draining driver
    /// ([`Runtime::drain`](crate::Runtime::drain)) at the state it had just entered.
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
    /// The error chain of the run's last failure, outermost first: a failed attempt's,
    /// cleared by a transition; or a failed try of a step, cleared also when that step
    /// succeeds (its record is written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Vec<String>>,
    /// The reason given when the run was cancelled (or asked to be).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<String>,
    /// What a waiting run waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitInfo>,
    /// Why a [blocked](RunStatus::Blocked) run is blocked, and what changed; `None` for a
    /// run that is not blocked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<BlockInfo>,
    /// The sequence number the current state was entered at, when it is not `seq`: the
    /// latest record is a migration ([`TransitionRecord::migrated`](crate::TransitionRecord::migrated)) that continues the state
    /// entered there. `None`: the state was entered at `seq`. See [`state_seq`](Self::state_seq).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entered: Option<u64>,
    /// The run that started this one as its child
    /// ([`Context::start_child`](crate::Context::start_child)), and what that run's
    /// cancellation does to this one; `None` for a run started otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// A random number chosen when the run was created (by a runtime with a
    /// [`ManualClock`](crate::ManualClock): a hash of its id, creation time and how many runs
    /// of that id the clock saw created before), mixed into its idempotency keys
    /// ([`Context::idempotency_key`](crate::Context::idempotency_key)) so that a later run
    /// under the same id (after a prune, or in another store) gets keys of its own; never
    /// changed afterwards. `None` for a run created by a build of loops before it: that
    /// run's keys stay what they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_nonce: Option<u64>,
}

/// A child run's link to its parent: stored in the child's row ([`RunInfo::parent`]) when the
/// parent's handler starts it, never changed afterwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentLink {
    /// The parent run's id.
    pub run_id: String,
    /// What the parent's cancellation does to this run.
    #[serde(default, skip_serializing_if = "OnParentCancel::is_default")]
    pub on_cancel: OnParentCancel,
}

/// What a parent's cancellation does to a child run that has not ended: the child's policy,
/// chosen when the parent starts it ([`ChildOptions`](crate::ChildOptions)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnParentCancel {
    /// The child is cancelled too, in the commit that cancels the parent (the default).
    #[default]
    Cancel,
    /// The child goes on, to its own end; nobody joins it.
    Abandon,
}

impl OnParentCancel {
    fn is_default(&self) -> bool {
        *self == OnParentCancel::Cancel
    }
}

impl RunInfo {
    /// The row of a run created in `state` at `now_ms` (ms since the Unix epoch): seq 0,
    /// attempt 1, `Completed` if `state` is terminal, else `Running`; the workflow's name and
    /// pinned schema hash; a random [key nonce](Self::key_nonce).
    pub fn new_run<W: Workflow>(run_id: &str, state: W::State, now_ms: u64) -> RunInfo {
        Self::created::<W>(run_id, state, now_ms, crate::clock::random_key_nonce())
    }

    /// [`new_run`](Self::new_run) with the key nonce `key_nonce`: the runtime's creation of
    /// a run, whose clock chooses it (`Clock::key_nonce`).
    pub(crate) fn created<W: Workflow>(
        run_id: &str,
        state: W::State,
        now_ms: u64,
        key_nonce: u64,
    ) -> RunInfo {
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
            block: None,
            entered: None,
            parent: None,
            key_nonce: Some(key_nonce),
        }
    }

    /// The sequence number the current state was entered at: `seq`, or, after a migration,
    /// the seq of the state it continues. The current state's steps, waits, failures and
    /// idempotency keys are keyed by it, and the writes made in the state
    /// ([`Write::Step`](crate::store::Write::Step), [`Write::Wait`](crate::store::Write::Wait), [`Write::Failure`](crate::store::Write::Failure), [`Write::BeginAttempt`](crate::store::Write::BeginAttempt),
    /// [`Write::Wake`](crate::store::Write::Wake)) carry it.
    pub fn state_seq(&self) -> u64 {
        self.entered.unwrap_or(self.seq)
    }

    /// Applies [`Write::BeginAttempt`](crate::store::Write::BeginAttempt) to a running run's row, the same in every store: if
    /// the current attempt left no failure record (`attempt_has_failure` is false), the
    /// process stopped during it, and the returned `Interrupted` failure record (for the
    /// current attempt, at `at_ms`) must be stored with the row. Then the run fails if its
    /// failed attempts reached `max_attempts` or its interruptions `max_interruptions`;
    /// otherwise its attempt number goes up by one.
    ///
    /// # Errors
    /// [`Error::CounterOverflow`] if the attempt number or the interruption count read from
    /// the store is `u32::MAX` and would have to go up; `self` is then partly changed, and
    /// must not be stored.
    pub fn begin_attempt(
        &mut self,
        attempt_has_failure: bool,
        at_ms: u64,
        max_attempts: u32,
        max_interruptions: u32,
    ) -> Result<Option<FailureRecord>> {
        let interrupted = (self.attempt > 0 && !attempt_has_failure).then(|| FailureRecord {
            attempt: self.attempt,
            at_ms,
            source: FailureSource::Interrupted,
            errors: vec![INTERRUPTED.to_owned()],
        });
        if let Some(record) = &interrupted {
            self.error = Some(record.errors.clone());
            self.interrupted = self.interrupted.checked_add(1).ok_or_else(|| {
                self.overflow(
                    "interruption count",
                    self.interrupted,
                    "counting an interrupted attempt",
                )
            })?;
        }
        let failed = self
            .attempt
            .saturating_sub(self.attempt_base)
            .saturating_sub(self.interrupted);
        if failed >= max_attempts || self.interrupted >= max_interruptions {
            self.status = RunStatus::Failed;
            self.retry_at_ms = None;
        } else {
            self.attempt = self
                .attempt
                .checked_add(1)
                .ok_or_else(|| self.overflow("attempt", self.attempt, "starting a new attempt"))?;
        }
        self.updated_ms = at_ms;
        Ok(interrupted)
    }

    /// The [`Error::CounterOverflow`] of the row's seq, which `action` needed the next of.
    pub(crate) fn overflow_seq(&self, action: &'static str) -> Error {
        Error::counter_overflow(
            &self.run_id,
            (RecordKind::RunRow, self.seq),
            "seq",
            self.seq,
            action,
        )
    }

    /// The [`Error::CounterOverflow`] of the row's `counter`, at `value`, for `action`.
    pub(crate) fn overflow(
        &self,
        counter: &'static str,
        value: u32,
        action: &'static str,
    ) -> Error {
        Error::counter_overflow(
            &self.run_id,
            (RecordKind::RunRow, self.seq),
            counter,
            u64::from(value),
            action,
        )
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

/// Why a run is [blocked](RunStatus::Blocked): stored in its row
/// ([`RunInfo::block`]) by [`Write::Block`](crate::store::Write::Block), cleared by [`Write::Unblock`](crate::store::Write::Unblock) and
/// [`Write::Migrate`](crate::store::Write::Migrate).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BlockInfo {
    /// One sentence: why the build that blocked the run cannot drive it (no version has its
    /// schema, or its migration failed, with the error).
    pub reason: String,
    /// What changed between the run's schema and the version that could not take it, one
    /// human line per change (the [`SchemaDiff`](crate::SchemaDiff)'s texts); may be empty
    /// (a build that compiles no version of the workflow, a failed migration).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    /// The run's schema hash when it was blocked.
    pub schema: SchemaHash,
    /// When it was blocked, in ms since the Unix epoch.
    pub at_ms: u64,
    /// The status the run goes back to when it is unblocked (running or waiting).
    pub resume: RunStatus,
}

impl BlockInfo {
    /// A block of a run of schema `schema` at `at_ms` (ms since the Unix epoch), which goes
    /// back to `resume` when unblocked.
    pub fn new(
        reason: impl Into<String>,
        changes: Vec<String>,
        schema: SchemaHash,
        at_ms: u64,
        resume: RunStatus,
    ) -> BlockInfo {
        BlockInfo {
            reason: reason.into(),
            changes,
            schema,
            at_ms,
            resume,
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl RunInfo {
    /// Reads a run's row as stored (JSON; the run id is the row's key, not in the value).
    ///
    /// # Errors
    /// [`Error::Decode`] (a run row of `run_id`) if `bytes` is not a row.
    pub fn decode(run_id: &str, bytes: &[u8]) -> Result<RunInfo> {
        let mut info: RunInfo = serde_json::from_slice(bytes).map_err(|source| Error::Decode {
            run_id: run_id.to_owned(),
            record: RecordKind::RunRow,
            seq: 0,
            state: String::new(),
            source,
        })?;
        info.run_id = run_id.to_owned();
        Ok(info)
    }

    /// The row as stored (JSON, without the run id): what [`decode`](Self::decode) reads.
    pub fn encode(&self) -> Vec<u8> {
        crate::record::to_vec(self)
    }
}

#[cfg(test)]
mod tests {
    /// The one wording of an interrupted attempt: the record's text, and the resume line's.
    #[test]
    fn an_interrupted_attempt_is_said_one_way() {
        assert_eq!(
            super::interrupted_attempt(1),
            format!("attempt 1 did not finish: {}", super::INTERRUPTED)
        );
        assert_eq!(
            super::interrupted_attempt(2),
            "attempt 2 did not finish: the process stopped (or lost the run's lease) while this attempt ran"
        );
    }
}
