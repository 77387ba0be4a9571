//! The one-round-trip commit of lease holders' writes (docs/postgres.md, "The commit path").
//!
//! The store remembers, per lease, the text of the run's row (`runs.info`) that its last
//! write under that lease committed or read ([`Cache`]). A write that needs nothing but the
//! lease, the run's row and whether one record key is free ([`Needs::run`] and
//! [`Needs::record`]: a transition, a step record, a wake, a sleep) is planned against that
//! row, with the facts of a lease that holds and a key that is free, by the same [`plan`] as
//! every write. If its effects are a record at that key and an update of the row, one
//! statement commits them, in a transaction of its own: `commit_batch` (a function of the
//! schema, migration 11). Its guard locks the lease row and the run's row, as the
//! two-round-trip path does and in the same order, and commits the write only if the lease
//! still has the write's token and has not expired (on the server's clock), the row's text is
//! the one remembered, and the record key is free: only if the two-round-trip path would have
//! read exactly the row and facts the plan was given, under the same locks, so the effects
//! are the ones that path would write. A write whose guard fails writes nothing and goes the
//! two-round-trip way, whose plan gives the typed refusal if there is one.
//!
//! **Group commit.** The statement takes many writes, of as many runs, at once: each is
//! guarded and committed or declined on its own, in one transaction and one round trip. A
//! write that finds no batch in progress commits alone, at once, on its caller's task (a
//! lone run never waits); writes that arrive meanwhile queue, and a task of the store's
//! ([`drain`]) commits what has queued in one statement each time, until the queue is empty.
//! One batch is in progress per store at a time; other writes use the pool's other
//! connections. The statement takes its locks `SKIP LOCKED`: a write whose lease or row
//! another transaction holds is declined (and waits on two round trips), so no run's lock
//! holds up the others' writes.
//!
//! A write whose plan against the remembered row refuses, changes nothing, or has other
//! effects (follow-ups, attributes, a wake-up to send) also goes the two-round-trip way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use loops_core::{
    CurrentLease, Effects, Error, Facts, Lease, LeaseCheck, Needs, Record, RecordKey, Reply,
    RunInfo, Write, plan,
};
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;

use crate::action::describe;
use crate::commit::{RowColumns, STORE_LABEL, row_columns, utf8};
use crate::guard::Guard;
use crate::{Inner, PgStore, big, is_connection_error};

/// The most writes one `commit_batch` statement carries.
const BATCH: usize = 512;

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
    /// The writes waiting for the batch after the one in progress.
    queue: Mutex<Queue>,
    one_round_trip: AtomicU64,
    fell_back: AtomicU64,
    batches: AtomicU64,
}

/// The writes waiting for a batch, and whether one is in progress.
#[derive(Default)]
struct Queue {
    waiting: Vec<Queued>,
    /// Whether a batch is in progress.
    busy: bool,
}

/// A write waiting for its batch, and where its outcome goes.
struct Queued {
    item: Item,
    done: oneshot::Sender<Outcome>,
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
    /// taken, or whose statement rolled back: nothing was written and they went the
    /// two-round-trip way.
    pub fell_back: u64,
    /// The one-round-trip statements that answered (group commit: one statement carries the
    /// writes that queued together, `one_round_trip / batches` of them on average).
    pub batches: u64,
    /// The writes queued now for the next statement, behind the one in progress.
    pub waiting: u64,
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
            batches: cache.batches.load(Ordering::Relaxed),
            waiting: cache.queue().waiting.len() as u64,
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
            queue: Mutex::new(Queue::default()),
            one_round_trip: AtomicU64::new(0),
            fell_back: AtomicU64::new(0),
            batches: AtomicU64::new(0),
        }
    }

    fn rows(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // The map is consistent after any panic: every change is one insert or remove.
        self.rows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        // Consistent after any panic: every change is a push, a take of the whole queue, or
        // a flag set.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
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

/// One write's columns of `commit_batch` (migration 11).
struct Item {
    run: String,
    token: i64,
    /// The row's text the write was planned against.
    info: String,
    /// The record key: seq; a step record's name and occurrence.
    seq: Option<i64>,
    step: Option<String>,
    occurrence: Option<i32>,
    record: Option<String>,
    /// The new row, if the row changes.
    row: Option<RowColumns>,
}

/// The columns of `commit_batch` for `effects`, planned against `entry` under `lease` with
/// the record key `key` free. `None` if the effects are more than a record at `key` and an
/// update of the row (those go the two-round-trip way).
fn item(
    lease: &Lease,
    entry: &Entry,
    key: Option<RecordKey<'_>>,
    effects: &Effects<'_>,
) -> Option<Item> {
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
        && effects.row().is_none_or(|r| r.was.is_some())
        && !effects.is_empty();
    if !only_record_and_row {
        return None;
    }
    let (seq, step, occurrence) = match key {
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
    Some(Item {
        run: lease.run_id.clone(),
        token: big(lease.token),
        info: entry.text.clone(),
        seq,
        step,
        occurrence,
        record,
        row: effects.row().map(|row| row_columns(&row.info)),
    })
}

/// What became of a write sent for a batch.
#[derive(Clone)]
enum Outcome {
    Committed,
    /// Its guard found the lease, the row or the key changed, or the statement failed and
    /// rolled back: nothing was written.
    Declined,
    /// Never sent (no connection, or the statement could not be prepared): nothing was
    /// written.
    NotSent,
    /// The connection failed, or the batch was cancelled, once the statement was sent:
    /// whether the write committed is unknown.
    Unknown(Arc<dyn std::error::Error + Send + Sync>),
}

/// Commits `write` of the holder of `lease` in one round trip, planned against `entry` (the
/// row remembered for the lease), if it is a write for this path and its guard passes, and
/// remembers the row it leaves. Returns its reply, or `None` if nothing was written and the
/// write goes the two-round-trip way.
///
/// # Errors
/// [`Error::Database`] if the connection failed once the write was sent: whether it
/// committed is unknown.
pub(crate) async fn commit(
    store: &PgStore,
    lease: &Lease,
    write: &Write,
    entry: Entry,
) -> loops_core::Result<Option<Reply>> {
    let Some(key) = needs_only_row(lease, write) else {
        return Ok(None);
    };
    let mut facts = Facts::default();
    facts.lease = Some(LeaseCheck {
        lease,
        current: Some(CurrentLease {
            token: lease.token,
            live: true,
        }),
    });
    let Ok(effects) = plan(write, Some(&entry.info), &facts) else {
        return Ok(None);
    };
    let Some(item) = item(lease, &entry, key, &effects) else {
        return Ok(None);
    };
    let text = item.row.as_ref().map(|row| row.text.clone());
    let cache = &store.inner.cache;
    match submit(&store.inner, item).await {
        Outcome::Committed => {
            cache.one_round_trip.fetch_add(1, Ordering::Relaxed);
            let (new, reply) = effects.into_row_and_reply();
            let now = match (new, text) {
                (Some(row), Some(text)) => Entry {
                    token: lease.token,
                    text,
                    info: row.info,
                },
                _ => entry,
            };
            cache.put_entry(lease, now);
            Ok(Some(reply))
        }
        Outcome::Declined => {
            tracing::debug!(run = %lease.run_id, "the one-round-trip commit fell back to two round trips");
            cache.fell_back.fetch_add(1, Ordering::Relaxed);
            Ok(None)
        }
        Outcome::NotSent => Ok(None),
        Outcome::Unknown(e) => Err(Error::database(describe(write), e)),
    }
}

/// Sends `item` for a batch and returns its outcome: commits it at once on this task if no
/// batch is in progress, else queues it for [`drain`].
async fn submit(inner: &Arc<Inner>, item: Item) -> Outcome {
    let queued = {
        let mut queue = inner.cache.queue();
        if queue.busy {
            let (done, outcome) = oneshot::channel();
            queue.waiting.push(Queued { item, done });
            Err(outcome)
        } else {
            queue.busy = true;
            Ok(item)
        }
    };
    let outcome = match queued {
        Ok(item) => {
            let handover = Handover(Some(Arc::clone(inner)));
            let mut outcome = commit_batch(inner, std::slice::from_ref(&item)).await;
            drop(handover);
            return outcome.swap_remove(0);
        }
        Err(outcome) => outcome,
    };
    outcome.await.unwrap_or_else(|_| {
        Outcome::Unknown(Arc::new(std::io::Error::other(
            "the batch that carried the write ended before it answered: whether it committed \
             is unknown",
        )))
    })
}

/// Ends the batch in progress, when the write that committed alone is done or cancelled:
/// the writes that queued meanwhile go to a [`drain`] task.
struct Handover(Option<Arc<Inner>>);

impl Drop for Handover {
    fn drop(&mut self) {
        let Some(inner) = self.0.take() else { return };
        let mut queue = inner.cache.queue();
        if queue.waiting.is_empty() {
            queue.busy = false;
            return;
        }
        drop(queue);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(drain(inner))),
            // No runtime to commit them on: they go the two-round-trip way.
            Err(_) => {
                let mut queue = inner.cache.queue();
                for queued in queue.waiting.drain(..) {
                    drop(queued.done.send(Outcome::NotSent));
                }
                queue.busy = false;
            }
        }
    }
}

/// Commits what has queued, one statement at a time, until the queue is empty; then no
/// batch is in progress. A task of its own: a caller's cancellation cannot cut a batch that
/// carries other runs' writes.
async fn drain(inner: Arc<Inner>) {
    loop {
        let batch: Vec<Queued> = {
            let mut queue = inner.cache.queue();
            if queue.waiting.is_empty() {
                queue.busy = false;
                return;
            }
            let n = queue.waiting.len().min(BATCH);
            queue.waiting.drain(..n).collect()
        };
        let (items, senders): (Vec<Item>, Vec<_>) =
            batch.into_iter().map(|q| (q.item, q.done)).unzip();
        let outcomes = commit_batch(&inner, &items).await;
        for (done, outcome) in senders.into_iter().zip(outcomes) {
            // A caller that stopped waiting (its write timed out) gets nothing.
            drop(done.send(outcome));
        }
    }
}

/// Commits `items` in one `commit_batch` statement, on a connection of the pool, within the
/// store's timeout. Returns each item's outcome, in order.
async fn commit_batch(inner: &Inner, items: &[Item]) -> Vec<Outcome> {
    let all = |outcome: Outcome| vec![outcome; items.len()];
    let Ok(client) = inner.pool.get().await else {
        return all(Outcome::NotSent);
    };
    let guard = Guard(Some(client));
    let statement = match guard.client().prepare_cached(&inner.sql.commit_batch).await {
        Ok(statement) => statement,
        // The connection is dropped with the guard.
        Err(e) if is_connection_error(&e) => return all(Outcome::NotSent),
        Err(e) => {
            // A function that cannot be prepared (a schema altered outside loops): nothing
            // was sent.
            tracing::debug!(error = %e, "the one-round-trip commit cannot be prepared");
            guard.keep();
            return all(Outcome::Declined);
        }
    };
    let columns = Columns::of(items);
    crate::failpoint::before_commit();
    let params = columns.params();
    let sent = guard.client().query_one(&statement, &params);
    let answer = match tokio::time::timeout(inner.timeout, sent).await {
        Ok(answer) => answer,
        Err(_) => {
            let e = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer in {} ms", inner.timeout.as_millis()),
            );
            return all(Outcome::Unknown(Arc::new(e)));
        }
    };
    match answer {
        Ok(row) => {
            guard.keep();
            inner.cache.batches.fetch_add(1, Ordering::Relaxed);
            loops_core::metrics::commit_batch(STORE_LABEL, items.len());
            let done: Vec<Option<bool>> = row.try_get(0).unwrap_or_default();
            (0..items.len())
                .map(|i| match done.get(i) {
                    Some(Some(true)) => Outcome::Committed,
                    Some(Some(false)) => Outcome::Declined,
                    // The function answers every item; an answer without one is not
                    // understood.
                    _ => Outcome::Unknown(Arc::new(std::io::Error::other(
                        "commit_batch gave no answer for the write",
                    ))),
                })
                .collect()
        }
        Err(e) if e.as_db_error().is_none() || is_connection_error(&e) => {
            all(Outcome::Unknown(Arc::new(e)))
        }
        // The statement failed (the schema altered outside loops, a server-side error), so
        // its transaction rolled back: nothing was written.
        Err(e) => {
            tracing::debug!(error = %e, "a one-round-trip batch rolled back");
            guard.keep();
            all(Outcome::Declined)
        }
    }
}

/// The array parameters of `commit_batch`, one element per item.
#[derive(Default)]
struct Columns<'a> {
    run: Vec<&'a str>,
    token: Vec<i64>,
    info: Vec<&'a str>,
    seq: Vec<Option<i64>>,
    step: Vec<Option<&'a str>>,
    occurrence: Vec<Option<i32>>,
    record: Vec<Option<&'a str>>,
    status: Vec<Option<&'static str>>,
    row_seq: Vec<Option<i64>>,
    wait_event: Vec<Option<&'a str>>,
    wait_until_ms: Vec<Option<i64>>,
    new: Vec<Option<&'a str>>,
    schema: Vec<Option<&'a str>>,
}

impl<'a> Columns<'a> {
    fn of(items: &'a [Item]) -> Columns<'a> {
        let mut c = Columns::default();
        for it in items {
            let row = it.row.as_ref();
            c.run.push(it.run.as_str());
            c.token.push(it.token);
            c.info.push(it.info.as_str());
            c.seq.push(it.seq);
            c.step.push(it.step.as_deref());
            c.occurrence.push(it.occurrence);
            c.record.push(it.record.as_deref());
            c.status.push(row.map(|r| r.status));
            c.row_seq.push(row.map(|r| r.seq));
            c.wait_event.push(row.and_then(|r| r.wait_event.as_deref()));
            c.wait_until_ms.push(row.and_then(|r| r.wait_until_ms));
            c.new.push(row.map(|r| r.text.as_str()));
            c.schema.push(row.map(|r| r.schema.as_str()));
        }
        c
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 13] {
        [
            &self.run,
            &self.token,
            &self.info,
            &self.seq,
            &self.step,
            &self.occurrence,
            &self.record,
            &self.status,
            &self.row_seq,
            &self.wait_event,
            &self.wait_until_ms,
            &self.new,
            &self.schema,
        ]
    }
}
