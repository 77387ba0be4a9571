//! What a planned write stores: [`Effects`], which a backend writes out as it is (redb as
//! table writes, PostgreSQL as SQL), and the encodings of the records the plan makes.

use std::borrow::Cow;

use super::protocol::{Reply, Write};
use super::{RunInfo, RunStatus};
use crate::attribute::AttributeValue;
use crate::error::Error;
use crate::schedule::ScheduleInfo;
use crate::schema::SchemaHash;

/// Everything one write stores, and what the store answers once it is durable: the outcome
/// of [`plan`](super::plan::plan). A backend writes all of it in one atomic commit, or none
/// of it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Effects<'w> {
    /// The run the records and inbox changes belong to (empty for [`Write::Prune`](super::Write::Prune)).
    pub run_id: &'w str,
    /// The run's new row, if it changes ([`Effects::row`]). Private with `reply`: where the
    /// answer is that row, it is moved into the answer ([`Effects::into_reply`]), not copied.
    row: Option<RowWrite>,
    /// Immutable records to append; each key is free (the plan checked it).
    pub records: Vec<Record<'w>>,
    /// Changes to the run's inbox.
    pub inbox: Vec<InboxChange<'w>>,
    /// A schema description to store under its hash.
    pub schema: Option<(SchemaHash, &'w str)>,
    /// Attributes of the run to set, each replacing the key's value (and its index entry).
    pub attributes: Vec<(&'w str, &'w AttributeValue)>,
    /// Ended runs to delete with every record, index entry, attribute and event they have.
    pub delete: Vec<RunInfo>,
    /// A key id to add, with its check value and its time (ms since the Unix epoch), to the
    /// store's list of the keys that sealed its payloads ([`Write::Seal`](super::Write::Seal));
    /// a key listed already keeps its first time, and its first check value.
    pub sealing: Option<(&'w str, Option<&'w str>, u64)>,
    /// Whether the write makes its run need a driver that the writer does not provide, so
    /// that other workers should look for runs to claim now rather than at their next poll:
    /// the write carries no lease, and after it the run needs a driver at once
    /// ([`RunInfo::readiness`]) where it did not before (a retry, a cancelled wait, a new
    /// run), or an event it waits for arrives in its inbox. Set by
    /// [`plan`](super::plan::plan) for every write; a store shared by several workers tells
    /// them on commit (PostgreSQL: `NOTIFY`), a store only one process opens may ignore it.
    pub wakes: bool,
    /// Writes of other runs that follow from this one, to apply after it in the same
    /// commit, each planned on its own (its facts gathered after this write's effects are
    /// written): the wake-up of a child's parent when the child ends, the cancellation of a
    /// cancelled run's children. A follow-up its plan refuses (the parent ended, say) is
    /// skipped: it writes nothing and does not refuse this write.
    pub follow_ups: Vec<Write>,
    /// A schedule's row to write or delete.
    pub schedule: Option<ScheduleChange<'w>>,
    /// What the store answers; `None`: [`Reply::Run`] with the new row (see `row`).
    reply: Option<Reply>,
}

impl<'w> Effects<'w> {
    /// Stores `text`, the description of `schema`, unless the store has it already
    /// (`stored`: [`Facts::schema_stored`](crate::store::Facts::schema_stored)) or there is
    /// none to store.
    pub(crate) fn store_schema(&mut self, stored: bool, schema: SchemaHash, text: Option<&'w str>) {
        if !stored {
            self.schema = text.map(|text| (schema, text));
        }
    }

    /// Effects that store nothing and answer `reply`.
    pub(crate) fn unchanged(run_id: &'w str, reply: Reply) -> Self {
        Effects {
            run_id,
            row: None,
            records: Vec::new(),
            inbox: Vec::new(),
            schema: None,
            attributes: Vec::new(),
            delete: Vec::new(),
            sealing: None,
            wakes: false,
            follow_ups: Vec::new(),
            schedule: None,
            reply: Some(reply),
        }
    }

    /// Effects that write the run's new row `info` (its status was `was`; `None` for a new
    /// run) and answer [`Reply::Run`] with it.
    pub(crate) fn with_row(run_id: &'w str, was: Option<RunStatus>, info: RunInfo) -> Self {
        Effects {
            row: Some(RowWrite { info, was }),
            reply: None,
            ..Effects::unchanged(run_id, Reply::Done)
        }
    }

    /// Answers `reply` instead of the new row.
    pub(crate) fn answer(&mut self, reply: Reply) {
        self.reply = Some(reply);
    }

    /// The run's new row, if the write changes it (to write out with the other effects).
    pub fn row(&self) -> Option<&RowWrite> {
        self.row.as_ref()
    }

    /// What the store answers once the effects are durable (or at once, for effects that
    /// [store nothing](Self::is_empty)): for most writes that change a run's row,
    /// [`Reply::Run`] with the new row, which is moved into the answer, not copied.
    pub fn into_reply(self) -> Reply {
        match self.reply {
            Some(reply) => reply,
            // Only `with_row` leaves `reply` unset, and it sets `row` (both are private): the
            // `Done` is never reached.
            None => self.row.map_or(Reply::Done, |row| Reply::Run(row.info)),
        }
    }

    /// The run's new row, if the write changes it, and the answer (as
    /// [`into_reply`](Self::into_reply)): for a store that keeps the new row after the commit
    /// (a cache), at the cost of one copy of it when the answer carries it too.
    pub fn into_row_and_reply(self) -> (Option<RowWrite>, Reply) {
        let reply = match self.reply {
            Some(reply) => reply,
            None => self
                .row
                .as_ref()
                .map_or(Reply::Done, |row| Reply::Run(row.info.clone())),
        };
        (self.row, reply)
    }

    /// Whether there is nothing to store: the backend need not commit (nor sync) anything.
    pub fn is_empty(&self) -> bool {
        self.row.is_none()
            && self.records.is_empty()
            && self.inbox.is_empty()
            && self.schema.is_none()
            && self.attributes.is_empty()
            && self.delete.is_empty()
            && self.sealing.is_none()
            && self.follow_ups.is_empty()
            && self.schedule.is_none()
    }
}

/// A change to a schedule's row ([`Effects::schedule`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleChange<'w> {
    /// Write the row `info` (keyed by its name).
    Put {
        /// The row.
        info: ScheduleInfo,
        /// Whether the plan saw no row of that name: a store that finds one when it inserts
        /// (a concurrent registration committed first) keeps the one it found.
        new: bool,
    },
    /// Delete the row of this name.
    Delete {
        /// The schedule's name.
        name: &'w str,
    },
}

/// A run's new row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowWrite {
    /// The row.
    pub info: RunInfo,
    /// The status it had before; `None` for a run that did not exist (a new row).
    pub was: Option<RunStatus>,
}

impl RowWrite {
    /// The move of the run's status index entry, `(from, to)`, if the status changed (`from`
    /// is `None` for a new run); `None` if it stays where it is.
    pub fn status_move(&self) -> Option<(Option<RunStatus>, RunStatus)> {
        (self.was != Some(self.info.status)).then_some((self.was, self.info.status))
    }

    /// The refusal for a new row whose run id a concurrent write took first (a store that
    /// finds the key taken only when it inserts the row); `None` for an update.
    pub fn refusal_if_taken(&self) -> Option<Error> {
        self.was.is_none().then(|| Error::SequenceConflict {
            run_id: self.info.run_id.clone(),
            seq: 0,
        })
    }
}

/// An immutable record to append, as its serialized bytes (JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'w> {
    /// A [`TransitionRecord`](crate::TransitionRecord).
    Journal {
        /// Its sequence number.
        seq: u64,
        /// The record.
        bytes: Cow<'w, [u8]>,
    },
    /// A [`StepRecord`](crate::StepRecord).
    Step {
        /// The state's sequence number.
        seq: u64,
        /// The step name.
        name: &'w str,
        /// Which use of the name, from 0.
        occurrence: u32,
        /// The record.
        bytes: Cow<'w, [u8]>,
    },
    /// A [`FailureRecord`](crate::FailureRecord).
    Failure {
        /// The state's sequence number.
        seq: u64,
        /// The attempt that failed.
        attempt: u32,
        /// Which failure of the attempt, from 0.
        index: u32,
        /// The record.
        bytes: Vec<u8>,
    },
}

impl Record<'_> {
    /// The record's bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Record::Journal { bytes, .. } => bytes,
            Record::Step { bytes, .. } => bytes,
            Record::Failure { bytes, .. } => bytes,
        }
    }

    /// The refusal for a record whose key a concurrent write took first (a store that finds
    /// the key taken only when it inserts the record); `None` for a failure record, whose
    /// key no concurrent write can take.
    pub fn refusal_if_taken(&self, run_id: &str) -> Option<Error> {
        match self {
            Record::Journal { seq, .. } => Some(Error::SequenceConflict {
                run_id: run_id.to_owned(),
                seq: *seq,
            }),
            Record::Step {
                seq,
                name,
                occurrence,
                ..
            } => Some(Error::StepExists {
                run_id: run_id.to_owned(),
                seq: *seq,
                step: (*name).to_owned(),
                occurrence: *occurrence,
            }),
            Record::Failure { .. } => None,
        }
    }
}

/// A change to a run's inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxChange<'w> {
    /// A new event: undelivered, and found again by its idempotency key if it has one.
    Append {
        /// Its sequence number in the inbox (free: the plan took the next one).
        event_seq: u64,
        /// Its name.
        name: &'w str,
        /// The sender's idempotency key.
        key: Option<&'w str>,
        /// Its [`EventRecord`](super::EventRecord), serialized ([`event_record`]).
        record: Vec<u8>,
    },
    /// An undelivered event is delivered (it stays in the inbox, for inspection).
    Deliver {
        /// Its sequence number in the inbox.
        event_seq: u64,
        /// Its name.
        name: &'w str,
    },
}

/// The [`EventRecord`](super::EventRecord) of an event, serialized: what every store keeps in
/// its inbox. `payload` is JSON and is kept as it is.
pub fn event_record(name: &str, key: Option<&str>, at_ms: u64, payload: &str) -> Vec<u8> {
    format!(
        r#"{{"name":{},{}"at_ms":{at_ms},"payload":{payload}}}"#,
        json_string(name),
        key.map(|k| format!(r#""key":{},"#, json_string(k)))
            .unwrap_or_default(),
    )
    .into_bytes()
}

/// The output a wait records as its step when an event is delivered to it: the event's
/// sequence number and its payload (JSON, kept as it is).
pub(crate) fn delivered_output(event_seq: u64, payload: &str) -> String {
    format!(r#"{{"event":{{"seq":{event_seq},"payload":{payload}}}}}"#)
}

/// The output a wait records as its step when its time passed first.
pub(crate) const DUE_OUTPUT: &str = r#""due""#;

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EventRecord;

    #[test]
    fn event_records_read_back_as_event_records() {
        let bytes = event_record("a\"b", Some("k\\1"), 17, r#"{"x":[1,2]}"#);
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"name":"a\"b","key":"k\\1","at_ms":17,"payload":{"x":[1,2]}}"#
        );
        let record: EventRecord = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(record.name, "a\"b");
        assert_eq!(record.key.as_deref(), Some("k\\1"));
        assert_eq!(record.at_ms, 17);
        assert_eq!(record.payload.get(), r#"{"x":[1,2]}"#);
        let bytes = event_record("e", None, 0, "null");
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"name":"e","at_ms":0,"payload":null}"#
        );
    }
}
