//! The one-round-trip commit of a lease holder's write (docs/postgres.md, "The commit path").
//!
//! The store remembers, per lease, the text of the run's row (`runs.info`) that its last
//! write under that lease committed or read ([`Cache`]). A write that needs nothing but the
//! lease, the run's row and whether one record key is free ([`Needs::run`] and
//! [`Needs::record`]: a transition, a step record, a wake, a sleep) is planned against that
//! row, with the facts of a lease that holds and a key that is free, by the same [`plan`] as
//! every write. If its effects are a record at that key and an update of the row, one
//! statement commits them, in a transaction of its own: `commit_one` (a function of the
//! schema, migration 9). Its guard locks the lease row and the run's row, as the
//! two-round-trip path does and in the same order, and raises SQLSTATE `LP001` unless the
//! lease still has the write's token and has not expired (on the server's clock), the row's
//! text is the one remembered, and the record key is free (when the effects write a record
//! at the key, by the table's unique key as it inserts): it commits only if the
//! two-round-trip path would have read exactly the row and facts the plan was given, under
//! the same locks, so the effects are the ones that path would write. If it fails, the
//! statement's transaction rolls back, nothing is written and the connection is left
//! without a transaction: the write goes the two-round-trip way, whose plan gives the typed
//! refusal if there is one.
//!
//! A write whose plan against the remembered row refuses, changes nothing, or has other
//! effects (follow-ups, attributes, a wake-up to send) also goes the two-round-trip way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use deadpool_postgres::Object;
use loops_core::{
    CurrentLease, Effects, Error, Facts, Lease, LeaseCheck, Needs, Record, RecordKey, Reply,
    RunInfo, Write, plan,
};

use crate::commit::{Fail, Param, STORE_LABEL, row_columns, statement as statement_of, utf8};
use crate::sql::Sql;
use crate::{PgStore, big, is_connection_error};

/// The most leases the cache remembers rows of; it is emptied when full (an entry is only a
/// hint: a write without one takes two round trips).
const CAPACITY: usize = 16_384;

/// A run's row as this store last committed or read it under a lease.
pub(crate) struct Entry {
    token: u64,
    text: String,
    info: RunInfo,
}

/// The rows this store's leases last saw, by run id, and what became of the writes that
/// used them.
pub(crate) struct Cache {
    enabled: bool,
    rows: Mutex<HashMap<String, Entry>>,
    one_round_trip: AtomicU64,
    fell_back: AtomicU64,
}

/// How a store's writes under a lease committed, since it connected
/// ([`PgStore::commit_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CommitCounts {
    /// Writes committed in one round trip.
    pub one_round_trip: u64,
    /// Writes that tried one round trip and found the run's row or lease changed (a
    /// cancellation or a failure recorded by another handle, a lease taken over) or the key
    /// taken: nothing was written and they went the two-round-trip way.
    pub fell_back: u64,
}

impl PgStore {
    /// How this store's writes under a lease committed so far: in one round trip, or back
    /// on the two-round-trip path after its guard found something changed (docs/postgres.md,
    /// "The commit path"). Diagnostics: a store whose runs are often changed by other
    /// writers (events, cancellations) falls back more.
    pub fn commit_counts(&self) -> CommitCounts {
        let cache = &self.inner.cache;
        CommitCounts {
            one_round_trip: cache.one_round_trip.load(Ordering::Relaxed),
            fell_back: cache.fell_back.load(Ordering::Relaxed),
        }
    }
}

impl Cache {
    /// A cache; with `enabled` false, it remembers nothing and every write takes two round
    /// trips.
    pub(crate) fn new(enabled: bool) -> Cache {
        Cache {
            enabled,
            rows: Mutex::new(HashMap::new()),
            one_round_trip: AtomicU64::new(0),
            fell_back: AtomicU64::new(0),
        }
    }

    fn rows(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // The map is consistent after any panic: every change is one insert or remove.
        self.rows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes out the row remembered for `lease` (none if it was remembered under another
    /// token): a write holds it while it runs and puts the row back only if it commits, so
    /// that a failed or refused write leaves nothing remembered.
    pub(crate) fn take(&self, lease: &Lease) -> Option<Entry> {
        if !self.enabled {
            return None;
        }
        self.rows()
            .remove(&lease.run_id)
            .filter(|e| e.token == lease.token)
    }

    /// Remembers `text` (decoded: `info`) as the row of `lease`'s run, committed or read
    /// under `lease` by a write that committed.
    pub(crate) fn put(&self, lease: &Lease, text: String, info: RunInfo) {
        if !self.enabled {
            return;
        }
        let mut rows = self.rows();
        if rows.len() >= CAPACITY && !rows.contains_key(&lease.run_id) {
            rows.clear();
        }
        let token = lease.token;
        rows.insert(lease.run_id.clone(), Entry { token, text, info });
    }

    /// Remembers `entry` again, after the write that took it out committed.
    pub(crate) fn put_entry(&self, lease: &Lease, entry: Entry) {
        self.put(lease, entry.text, entry.info);
    }

    /// Forgets the row of `run_id` (its lease was released, or lost).
    pub(crate) fn forget(&self, run_id: &str) {
        if self.enabled {
            self.rows().remove(run_id);
        }
    }
}

/// What [`try_commit`] did.
// Returned once per write and matched at once: boxing the row would cost an allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Fast {
    /// Committed in one round trip: the reply, and the run's row as it is now.
    Committed(Reply, Entry),
    /// Nothing was written and the connection has no transaction open: the write is not
    /// one for this path, or the guard found the lease, the row or the key changed.
    Declined,
}

/// The record key `write` needs to know is free, if `write` needs nothing but `lease`, its
/// run's row and that key (`Some(None)`: no key); `None` if it needs more (or is for another
/// run than `lease`'s).
fn needs_only_row<'w>(lease: &Lease, write: &'w Write) -> Option<Option<RecordKey<'w>>> {
    let needs = write.needs();
    let mut only = Needs::default();
    only.run = needs.run;
    only.record = needs.record;
    (needs == only && needs.run == Some(lease.run_id.as_str())).then_some(needs.record)
}

/// Whether `record` is the record at `key`.
fn at_key(record: &Record<'_>, key: Option<RecordKey<'_>>) -> bool {
    match (record, key) {
        (Record::Journal { seq, .. }, Some(RecordKey::Journal { seq: at })) => *seq == at,
        (
            Record::Step {
                seq,
                name,
                occurrence,
                ..
            },
            Some(RecordKey::Step {
                seq: at,
                name: named,
                occurrence: nth,
            }),
        ) => *seq == at && *name == named && *occurrence == nth,
        _ => false,
    }
}

/// The parameters of `commit_one` (migration 9) for `effects`, planned against `entry`
/// under `lease` with the record key `key` free; with the new row's text, if the row
/// changes. `None` if the effects are more than a record at `key` and an update of the row
/// (those go the two-round-trip way).
fn commit_params(
    lease: &Lease,
    entry: &Entry,
    key: Option<RecordKey<'_>>,
    effects: &Effects<'_>,
) -> Option<(Vec<Param>, Option<String>)> {
    let record = match effects.records.as_slice() {
        [] => None,
        [record] if at_key(record, key) => Some(utf8(record.bytes()).to_owned()),
        _ => return None,
    };
    let only_record_and_row = effects.inbox.is_empty()
        && effects.schema.is_none()
        && effects.attributes.is_empty()
        && effects.delete.is_empty()
        && effects.sealing.is_none()
        && effects.follow_ups.is_empty()
        && effects.schedule.is_none()
        && !effects.wakes
        && effects.row.as_ref().is_none_or(|r| r.was.is_some())
        && !effects.is_empty();
    if !only_record_and_row {
        return None;
    }
    let (seq, step, occurrence): (Option<i64>, Option<String>, Option<i32>) = match key {
        None => (None, None, None),
        Some(RecordKey::Journal { seq }) => (Some(big(seq)), None, None),
        Some(RecordKey::Step {
            seq,
            name,
            occurrence,
        }) => (
            Some(big(seq)),
            Some(name.to_owned()),
            // As the two-round-trip path stores it (`commit::writes`).
            Some(occurrence as i32),
        ),
    };
    let mut params: Vec<Param> = vec![
        Box::new(lease.run_id.clone()),
        Box::new(big(lease.token)),
        Box::new(entry.text.clone()),
        Box::new(seq),
        Box::new(step),
        Box::new(occurrence),
        Box::new(record),
    ];
    let text = match &effects.row {
        Some(row) => {
            let (text, [status, row_seq, event, from, schema]) = row_columns(&row.info);
            let new: Param = Box::new(text.clone());
            params.extend([status, row_seq, event, from, new, schema]);
            Some(text)
        }
        None => {
            let none = || -> Param { Box::new(None::<String>) };
            let number = || -> Param { Box::new(None::<i64>) };
            params.extend([none(), number(), none(), number(), none(), none()]);
            None
        }
    };
    Some((params, text))
}

/// Commits `write` of the holder of `lease` in one round trip, planned against `entry` (the
/// row remembered for the lease), if it is a write for this path and the guard passes: one
/// statement (`commit_one`), in a transaction of its own.
///
/// # Errors
/// [`Fail::Broken`] if the connection failed once the statement was sent (whether it
/// committed is unknown); [`Fail::Retry`] if it failed before (preparing the statement).
pub(crate) async fn try_commit(
    c: &Object,
    sql: &Sql,
    cache: &Cache,
    (lease, write, action): (&Lease, &Write, &str),
    entry: Entry,
) -> std::result::Result<Fast, Fail> {
    let Some(key) = needs_only_row(lease, write) else {
        return Ok(Fast::Declined);
    };
    let mut facts = Facts::default();
    facts.lease = Some(LeaseCheck {
        lease,
        current: Some(CurrentLease {
            token: lease.token,
            live: true,
        }),
    });
    let Ok(mut effects) = plan(write, Some(&entry.info), &facts) else {
        return Ok(Fast::Declined);
    };
    let Some((params, text)) = commit_params(lease, &entry, key, &effects) else {
        return Ok(Fast::Declined);
    };
    let fell_back = |e: &dyn std::fmt::Display| {
        tracing::debug!(error = %e, "the one-round-trip commit fell back to two round trips");
        cache.fell_back.fetch_add(1, Ordering::Relaxed);
        Ok(Fast::Declined)
    };
    let statement = match c.prepare_cached(&sql.commit_one).await {
        Ok(statement) => statement,
        Err(e) if is_connection_error(&e) => return Err(Fail::Retry(e)),
        // A function that cannot be prepared (a schema altered outside loops): nothing of the
        // write was sent.
        Err(e) => return fell_back(&e),
    };
    let params = statement_of(&sql.commit_one, params);
    crate::failpoint::before_commit();
    match c.execute(&statement, &params.params()).await {
        Ok(_) => {}
        Err(e) if e.as_db_error().is_none() || is_connection_error(&e) => {
            return Err(Fail::Broken(Error::database(action, e)));
        }
        // The statement failed (its guard raised, or the record's key was taken: a unique
        // violation), so its transaction rolled back: nothing was written.
        Err(e) => return fell_back(&e),
    }
    loops_core::metrics::commit_batch(STORE_LABEL, 1);
    cache.one_round_trip.fetch_add(1, Ordering::Relaxed);
    let now = match (effects.row.take(), text) {
        (Some(row), Some(text)) => Entry {
            token: lease.token,
            text,
            info: row.info,
        },
        _ => entry,
    };
    Ok(Fast::Committed(effects.reply, now))
}
