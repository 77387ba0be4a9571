//! What a write needs to know besides its run's row: [`Needs`] (which facts, asked by
//! [`Write::needs`](super::Write::needs)) and [`Facts`] (their values, gathered by the backend under the write's
//! locks and given to [`plan`](super::plan::plan)).
//!
//! A backend reads each fact its own way (redb: a table lookup in the write transaction;
//! PostgreSQL: one statement of the first round trip), but every fact means the same in
//! every backend, as documented on its field.

use super::protocol::Write;
use super::{Lease, RunInfo};
use crate::schedule::ScheduleInfo;
use crate::schema::SchemaHash;

/// Which facts a [`Write`](super::Write) needs, besides its run's row: what [`Write::needs`](super::Write::needs) answers. A
/// backend gathers each one that is set (and only those) into [`Facts`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Needs<'w> {
    /// The run whose row the write reads (and locks, in a store that locks rows): the row is
    /// [`plan`](super::plan::plan)'s `row` argument. `None` only for [`Write::Prune`](super::Write::Prune).
    pub run: Option<&'w str>,
    /// Whether the run's row is read without a lock, in a store that locks rows: a creation's
    /// (the row refuses it if it is there, and is not there to lock otherwise). Held by a
    /// creation that is refused, the lock would keep the run just created from the workers
    /// woken to claim it, whose claims pass locked rows by.
    pub run_unlocked: bool,
    /// A record key of the run whose use the write must know: [`Facts::record_taken`].
    pub record: Option<RecordKey<'w>>,
    /// A schema hash whose description may be stored already: [`Facts::schema_stored`].
    pub schema: Option<SchemaHash>,
    /// `(seq, attempt)`: the next free failure index of that attempt:
    /// [`Facts::failure_index`].
    pub failure_index: Option<(u64, u32)>,
    /// `seq`: the failure records of the highest attempt at that seq that has any:
    /// [`Facts::last_attempt`].
    pub last_attempt: Option<u64>,
    /// An event name: the run's oldest undelivered event of that name: [`Facts::pending`].
    pub pending: Option<&'w str>,
    /// An idempotency key: the event the run's inbox holds under it: [`Facts::key_seen`].
    pub event_key: Option<&'w str>,
    /// The next free event sequence number of the run's inbox: [`Facts::next_event_seq`].
    pub next_event_seq: bool,
    /// Runs whose rows the write reads (and locks): [`Facts::runs`].
    pub runs: &'w [String],
    /// The rows of the run's children that have not ended: [`Facts::children`].
    pub children: bool,
    /// The children of [`Needs::runs`], ended or not: [`Facts::children_of_runs`].
    pub children_of_runs: bool,
    /// A schedule whose row the write reads (and locks, in a store that locks rows):
    /// [`Facts::schedule`].
    pub schedule: Option<&'w str>,
}

/// A key of one of a run's immutable records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKey<'w> {
    /// The transition record of `seq`.
    Journal {
        /// Its sequence number.
        seq: u64,
    },
    /// The step record `(name, occurrence)` of the state at `seq`.
    Step {
        /// The state's sequence number.
        seq: u64,
        /// The step name.
        name: &'w str,
        /// Which use of the name, from 0.
        occurrence: u32,
    },
}

/// The values of the facts a write [`Needs`], gathered by the backend under the write's
/// locks. A fact the write does not need keeps its default value.
///
/// Built with `Facts::default()` and filled in field by field (the struct may grow).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Facts<'a> {
    /// The lease the write carries, with the run's current lease: set by stores whose leases
    /// can lapse and pass between workers; `None` where the lease is not checked (no lease
    /// given, or a store one process owns).
    pub lease: Option<LeaseCheck<'a>>,
    /// Whether the record at [`Needs::record`] exists.
    pub record_taken: bool,
    /// Whether a description is stored for [`Needs::schema`].
    pub schema_stored: bool,
    /// One more than the highest failure index of [`Needs::failure_index`]'s attempt; 0 if
    /// it has none.
    pub failure_index: u32,
    /// The highest attempt at [`Needs::last_attempt`]'s seq with a failure record, and what
    /// its records say; `None` if the seq has none.
    pub last_attempt: Option<AttemptFailures>,
    /// The oldest undelivered event named [`Needs::pending`], if any.
    pub pending: Option<PendingEvent>,
    /// The event sequence number of the event sent with [`Needs::event_key`], if any.
    pub key_seen: Option<u64>,
    /// One more than the highest event sequence number of the run's inbox; 0 if it is empty.
    pub next_event_seq: u64,
    /// The rows of [`Needs::runs`] that exist, in any order.
    pub runs: Vec<RunInfo>,
    /// With [`Needs::children`]: the rows of the runs whose [`parent`](RunInfo::parent) is
    /// the run, that have not ended (status running, waiting or blocked), by run id.
    pub children: Vec<RunInfo>,
    /// With [`Needs::children_of_runs`]: `(parent, child)`, the run ids of every run whose
    /// [`parent`](RunInfo::parent) is one of [`Needs::runs`], in any order.
    pub children_of_runs: Vec<(String, String)>,
    /// The row of the schedule [`Needs::schedule`], if it exists.
    pub schedule: Option<ScheduleInfo>,
}

/// The failure records of one attempt of a state ([`Facts::last_attempt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptFailures {
    /// The attempt, from 1.
    pub attempt: u32,
    /// One more than the highest failure index among its records.
    pub next_index: u32,
    /// Whether one of its records ended it
    /// ([`FailureRecord::ends_attempt`](crate::FailureRecord::ends_attempt): its handler's
    /// failure, or its interruption; a step's failure, which the handler may have handled,
    /// does not).
    pub ended: bool,
}

impl AttemptFailures {
    /// Adds one failure record of `run_id`'s state at `seq` (its `attempt`, its `index` and
    /// its stored `bytes`) to `last`, the records of the highest attempt met so far; the
    /// records must come highest attempt first. Returns whether the record was of that
    /// attempt (`false`: of an earlier one, which the fact does not count; a store walking
    /// back may stop). Every store gathers [`Facts::last_attempt`] through it.
    ///
    /// # Errors
    /// As [`FailureRecord::ends_attempt`](crate::FailureRecord::ends_attempt).
    pub fn add(
        last: &mut Option<AttemptFailures>,
        (run_id, seq): (&str, u64),
        (attempt, index): (u32, u32),
        bytes: &[u8],
    ) -> crate::error::Result<bool> {
        let this = last.get_or_insert(AttemptFailures {
            attempt,
            next_index: 0,
            ended: false,
        });
        if this.attempt != attempt {
            return Ok(false);
        }
        this.next_index = this.next_index.max(index.saturating_add(1));
        this.ended |= crate::FailureRecord::ends_attempt(run_id, seq, bytes)?;
        Ok(true)
    }
}

/// The lease a write carries and the run's current one.
#[derive(Debug, Clone, Copy)]
pub struct LeaseCheck<'a> {
    /// The lease the write was given.
    pub lease: &'a Lease,
    /// The run's current lease, if it has one.
    pub current: Option<CurrentLease>,
}

/// A run's current lease, as its store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CurrentLease {
    /// Its fencing token.
    pub token: u64,
    /// Whether it has not lapsed (by the store's clock).
    pub live: bool,
}

/// An undelivered event of a run's inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingEvent {
    /// Its sequence number in the inbox.
    pub event_seq: u64,
    /// Its [`EventRecord`](super::EventRecord) as stored (JSON), or `None` if the inbox has
    /// no record for it (a damaged store: the plan refuses with `RecordMissing`).
    pub record: Option<Vec<u8>>,
}

impl Write {
    /// The facts the write needs besides its run's row, for the backend to gather (in one
    /// read, or one round trip together with the locks) before it calls [`plan`](super::plan::plan).
    pub fn needs(&self) -> Needs<'_> {
        let run = self.run_id();
        match self {
            Write::Create { info, .. } => Needs {
                run,
                run_unlocked: true,
                record: Some(RecordKey::Journal { seq: 0 }),
                schema: Some(info.schema),
                ..Needs::default()
            },
            Write::Transition { seq, .. } => Needs {
                run,
                record: Some(RecordKey::Journal { seq: *seq }),
                ..Needs::default()
            },
            Write::Step {
                seq,
                name,
                occurrence,
                ..
            } => Needs {
                run,
                record: Some(RecordKey::Step {
                    seq: *seq,
                    name,
                    occurrence: *occurrence,
                }),
                ..Needs::default()
            },
            Write::Failure { seq, record, .. } => Needs {
                run,
                failure_index: Some((*seq, record.attempt)),
                ..Needs::default()
            },
            Write::BeginAttempt { seq, .. } => Needs {
                run,
                last_attempt: Some(*seq),
                ..Needs::default()
            },
            Write::Wait {
                seq, step, event, ..
            } => Needs {
                run,
                record: step.as_ref().map(|(name, occurrence)| RecordKey::Step {
                    seq: *seq,
                    name,
                    occurrence: *occurrence,
                }),
                pending: event.as_deref(),
                ..Needs::default()
            },
            Write::Send { key, .. } => Needs {
                run,
                event_key: key.as_deref(),
                next_event_seq: true,
                ..Needs::default()
            },
            Write::Migrate { seq, record, .. } => Needs {
                run,
                record: Some(RecordKey::Journal {
                    seq: seq.saturating_add(1),
                }),
                schema: Some(record.schema),
                ..Needs::default()
            },
            Write::Cancel { .. } => Needs {
                run,
                children: true,
                ..Needs::default()
            },
            Write::EndCancelled { .. }
            | Write::Retry { .. }
            | Write::Wake { .. }
            | Write::Block { .. }
            | Write::Unblock { .. }
            | Write::SetAttributes { .. } => Needs {
                run,
                ..Needs::default()
            },
            Write::Prune { run_ids } => Needs {
                runs: run_ids,
                children_of_runs: true,
                ..Needs::default()
            },
            Write::Seal { .. } => Needs::default(),
            Write::PutSchedule { info } => Needs {
                schedule: Some(&info.name),
                ..Needs::default()
            },
            Write::PauseSchedule { name, .. }
            | Write::RemoveSchedule { name }
            | Write::TickSchedule { name, .. } => Needs {
                schedule: Some(name),
                ..Needs::default()
            },
        }
    }
}
