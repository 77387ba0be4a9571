//! The commit path: a write is committed by its caller as the leader, or by the writer
//! thread, batched with the writes that queued meanwhile into one write transaction.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use redb::Database;
use tokio::sync::{mpsc, oneshot};

use super::apply::{Applied, ApplyError, apply, lease_check};
use super::step_keys::StepKeys;
use super::tables::Tables;
use super::{Db, Leases, Mode, Opener, Queue, RedbStore, Request, corrupted};
use crate::error::{Error, Result};
use crate::store::Lease;
use crate::store::protocol::{Reply, Write};

/// A write to commit and the lease it carries.
pub(super) type Leased<'a> = (&'a Write, Option<&'a Lease>);

/// Most writes committed in one write transaction.
pub(crate) const MAX_BATCH: usize = 1024;

/// Writes waiting for the writer thread before senders wait (backpressure).
pub(super) const QUEUE: usize = 4096;

/// Rounds a leader commits of others' writes before it hands the rest to the writer thread.
pub(crate) const LEADER_ROUNDS: usize = 4;

/// Whether a write may be committed on the caller's thread: inside a multi-threaded tokio
/// runtime, whose other workers steal the tasks queued on the caller's worker while it is
/// blocked in the commit. (`block_in_place` would hand the worker's queue to a new thread
/// instead; measured in alternated runs at 64 and 256 runs, it changed nothing beyond the
/// noise, and it panics inside a `LocalSet`, which runs on a multi-threaded runtime too.)
fn inline_commit_allowed() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

impl RedbStore {
    /// Commits `write` (batched with concurrent writes) and returns the writer's answer.
    ///
    /// On a multi-threaded tokio runtime the commit is made on the caller's thread (blocking
    /// its worker for one commit) when no other commit is in progress: a lone write then costs what a
    /// raw redb commit costs, without two thread hand-offs. Writes that arrive during that
    /// commit queue up, and the committing caller (the leader) commits them too, in one
    /// transaction, for up to [`LEADER_ROUNDS`] rounds before it hands what is left to the
    /// writer thread. Elsewhere (a current-thread runtime) every write goes to the writer
    /// thread, which batches the same way.
    ///
    /// The future holds the write until its first poll, then at most a channel's receiver:
    /// the choice of committer is made by [`route`](Self::route), a plain function, so that
    /// the future (boxed by [`Store::write`](crate::store::Store::write)) stays small. Held
    /// across the awaits of the routing, it took 2 KiB, an allocation too large for the
    /// allocator's per-thread cache at every write.
    pub(super) async fn submit(&self, write: Write, lease: Option<Lease>) -> Result<Reply> {
        // The routing's outcome is taken apart before any await: held across one, it
        // would count in the future's size.
        let (full, rx) = match self.route(write, lease) {
            Routed::Led(result) => return result,
            Routed::Queued(rx) => (None, rx),
            Routed::Full(request, rx) => (Some(request), rx),
        };
        if let Some(request) = full {
            let tx = self.inner.tx.as_ref().ok_or(Error::Closed)?;
            // Rare (the writer thread's queue is full): the send waits for room, boxed so
            // that its size does not count in every write's future.
            Box::pin(tx.send(*request))
                .await
                .map_err(|_| Error::Closed)?;
        }
        answered(rx).await
    }

    /// Where `write` goes (see [`submit`](Self::submit)): committed here as the leader,
    /// queued for the leader in progress, or sent to the writer thread.
    fn route(&self, write: Write, lease: Option<Lease>) -> Routed {
        // No writer (a read-only store, or a view repaired in memory): answered as read-only.
        let Some(tx) = self.inner.tx.as_ref() else {
            return Routed::Led(self.answer_read_only(&write, lease.as_ref()));
        };
        if self.inner.commit_on_caller && inline_commit_allowed() {
            let mut queue = self
                .inner
                .queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match queue.mode {
                Mode::Idle => {
                    queue.mode = Mode::Inline;
                    drop(queue);
                    return Routed::Led(self.lead(write, lease));
                }
                Mode::Inline => {
                    let (reply, rx) = oneshot::channel();
                    queue.pending.push(Request {
                        write,
                        lease,
                        reply,
                    });
                    return Routed::Queued(rx);
                }
                Mode::Thread => {}
            }
        }
        let (reply, rx) = oneshot::channel();
        let request = Request {
            write,
            lease,
            reply,
        };
        match tx.try_send(request) {
            Ok(()) => Routed::Queued(rx),
            Err(mpsc::error::TrySendError::Full(request)) => Routed::Full(Box::new(request), rx),
            Err(mpsc::error::TrySendError::Closed(_)) => Routed::Led(Err(Error::Closed)),
        }
    }

    /// Commits `own` and what queues up meanwhile, as the leader (see [`submit`]); returns
    /// `own`'s answer. Blocking.
    fn lead(&self, own: Write, own_lease: Option<Lease>) -> Result<Reply> {
        let inner = &*self.inner;
        let Some(opener) = inner.opener.as_ref() else {
            return Err(Error::Closed);
        };
        let mut own = Some(own);
        let mut own_result = Err(Error::Closed);
        for round in 0.. {
            let pending = {
                let mut queue = inner.queue.lock().unwrap_or_else(PoisonError::into_inner);
                // The next round's queue gets the room this one had (up to 256 writes), so
                // that it does not grow (and copy its writes) one doubling at a time.
                let room = queue.pending.capacity().min(256);
                let pending = std::mem::replace(&mut queue.pending, Vec::with_capacity(room));
                if pending.is_empty() && own.is_none() {
                    queue.mode = Mode::Idle;
                    return own_result;
                }
                if round >= LEADER_ROUNDS && own.is_none() {
                    // Enough for one caller: the writer thread takes over until it runs dry.
                    queue.mode = Mode::Thread;
                    drop(queue);
                    self.hand_off(pending);
                    return own_result;
                }
                pending
            };
            let mut writes: Vec<Leased<'_>> = Vec::with_capacity(pending.len().saturating_add(1));
            if let Some(write) = &own {
                writes.push((write, own_lease.as_ref()));
            }
            writes.extend(pending.iter().map(|r| (&r.write, r.lease.as_ref())));
            crate::metrics::commit_batch(STORE_LABEL, writes.len());
            let mut results = commit_writes(
                &inner.db,
                opener,
                &inner.path,
                &inner.leases,
                &inner.step_keys,
                writes,
            )
            .into_iter();
            if own.take().is_some() {
                own_result = results.next().unwrap_or(Err(Error::Closed));
            }
            for (request, result) in pending.into_iter().zip(results) {
                let _ = request.reply.send((result, 0));
            }
        }
        own_result
    }

    /// Gives queued writes to the writer thread; if its queue is full, commits them here.
    fn hand_off(&self, pending: Vec<Request>) {
        let mut left = Vec::new();
        if let Some(tx) = &self.inner.tx {
            for request in pending {
                match tx.try_send(request) {
                    Ok(()) => {}
                    Err(
                        mpsc::error::TrySendError::Full(request)
                        | mpsc::error::TrySendError::Closed(request),
                    ) => left.push(request),
                }
            }
        } else {
            left = pending;
        }
        if left.is_empty() {
            return;
        }
        let Some(opener) = self.inner.opener.as_ref() else {
            return;
        };
        crate::metrics::commit_batch(STORE_LABEL, left.len());
        let results = commit_writes(
            &self.inner.db,
            opener,
            &self.inner.path,
            &self.inner.leases,
            &self.inner.step_keys,
            left.iter().map(|r| (&r.write, r.lease.as_ref())).collect(),
        );
        for (request, result) in left.into_iter().zip(results) {
            let _ = request.reply.send((result, 0));
        }
    }
}

/// Where [`RedbStore::route`] sent a write. The answer of a write led here is moved out at
/// once, never held: it need not be boxed.
#[allow(clippy::large_enum_variant)]
enum Routed {
    /// Committed by the caller, as the leader: its answer.
    Led(Result<Reply>),
    /// Queued for another committer, which answers on the channel.
    Queued(oneshot::Receiver<(Result<Reply>, usize)>),
    /// For the writer thread, whose queue is full: the request to send once it has room.
    Full(Box<Request>, oneshot::Receiver<(Result<Reply>, usize)>),
}

/// The `store` label of this store's metrics.
const STORE_LABEL: &str = "redb";

/// The answer of a write queued for another committer; records its batch when the answer
/// says it was the first of one (see [`Request`]).
async fn answered(rx: oneshot::Receiver<(Result<Reply>, usize)>) -> Result<Reply> {
    let (result, batch) = rx.await.map_err(|_| Error::Closed)?;
    if batch > 0 {
        crate::metrics::commit_batch(STORE_LABEL, batch);
    }
    result
}

// ---------------------------------------------------------------------------------------------
// The writer thread.

pub(super) fn writer_loop(
    db: &RwLock<Db>,
    opener: &Opener,
    path: &Path,
    queue: &Mutex<Queue>,
    leases: &Leases,
    step_keys: &StepKeys,
    mut rx: mpsc::Receiver<Request>,
) {
    let mut batch: Vec<Request> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = next_request(&mut rx, queue) {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        let results = commit_writes(
            db,
            opener,
            path,
            leases,
            step_keys,
            batch.iter().map(|r| (&r.write, r.lease.as_ref())).collect(),
        );
        let mut size = batch.len();
        for (request, result) in batch.drain(..).zip(results) {
            // The caller may have stopped waiting (its task was dropped); the write stands.
            let _ = request.reply.send((result, std::mem::take(&mut size)));
        }
    }
}

/// Commits `writes` in one write transaction (see [`commit_batch`]), reopening the database
/// before if a failed commit closed it, and closing it after a commit fails (redb refuses
/// every transaction after an I/O error until it is opened again). A redb panic on a damaged
/// page fails the batch with a storage error. Blocking.
fn commit_writes(
    db: &RwLock<Db>,
    opener: &Opener,
    path: &Path,
    leases: &Leases,
    step_keys: &StepKeys,
    writes: Vec<Leased<'_>>,
) -> Vec<Result<Reply>> {
    let n = writes.len();
    let reopened = reopen_if_needed(db, opener, path);
    let (results, storage_failed) = {
        let guard = db.read().unwrap_or_else(PoisonError::into_inner);
        match (&*guard, reopened) {
            (Db::Writable(db), _) => crate::panics::catch(|| {
                commit_batch(db, Some(leases), step_keys, writes.iter().copied())
            })
            .unwrap_or_else(|_| {
                step_keys.forget_all();
                let e = Arc::new(corrupted("a commit"));
                let results = (0..n)
                    .map(|_| {
                        Err(Error::Storage {
                            action: format!("committing {n} writes"),
                            cause: e.clone(),
                        })
                    })
                    .collect();
                (results, true)
            }),
            (Db::Reopening(_), Err(e)) => (
                (0..n)
                    .map(|_| {
                        Err(Error::Storage {
                            action: format!("reopening {} after an I/O error", path.display()),
                            cause: e.clone(),
                        })
                    })
                    .collect(),
                false,
            ),
            _ => ((0..n).map(|_| Err(Error::Closed)).collect(), false),
        }
    };
    if storage_failed {
        let mut guard = db.write().unwrap_or_else(PoisonError::into_inner);
        if matches!(&*guard, Db::Writable(_)) {
            tracing::warn!(path = %path.display(), "store write failed; reopening");
            *guard = Db::Reopening(Arc::new(redb::Error::Io(std::io::Error::other(
                "closed after a failed commit",
            ))));
        }
        drop(guard);
        let _ = reopen_if_needed(db, opener, path);
    }
    results
}

/// The next write for the writer thread: at once if one is queued; else, once it has let
/// callers commit on their own threads again (if it had taken over from one), asleep.
fn next_request(rx: &mut mpsc::Receiver<Request>, queue: &Mutex<Queue>) -> Option<Request> {
    match rx.try_recv() {
        Ok(request) => return Some(request),
        Err(mpsc::error::TryRecvError::Disconnected) => return None,
        Err(mpsc::error::TryRecvError::Empty) => {}
    }
    {
        let mut queue = queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.mode == Mode::Thread {
            queue.mode = Mode::Idle;
        }
    }
    rx.blocking_recv()
}

/// Opens the database again if a failed commit closed it. Returns the error of a reopen
/// that failed (the next batch tries again).
pub(super) fn reopen_if_needed(
    db: &RwLock<Db>,
    opener: &Opener,
    path: &Path,
) -> std::result::Result<(), Arc<redb::Error>> {
    if !matches!(
        &*db.read().unwrap_or_else(PoisonError::into_inner),
        Db::Reopening(_)
    ) {
        return Ok(());
    }
    let mut guard = db.write().unwrap_or_else(PoisonError::into_inner);
    if !matches!(&*guard, Db::Reopening(_)) {
        return Ok(());
    }
    match opener() {
        Ok(new) => {
            tracing::info!(path = %path.display(), "store reopened after an I/O error");
            *guard = Db::Writable(new);
            Ok(())
        }
        Err(e) => {
            let e = Arc::new(redb::Error::from(e));
            *guard = Db::Reopening(Arc::clone(&e));
            Err(e)
        }
    }
}

/// Applies `writes` in one write transaction and commits it (or aborts it if none wrote).
/// Each write that carries a lease is checked, in the transaction, against the run's
/// current lease in `leases` (none given: the writes carry none). Returns each write's
/// answer, and whether the commit failed on the store.
pub(super) fn commit_batch<'a>(
    db: &Database,
    leases: Option<&Leases>,
    step_keys: &StepKeys,
    writes: impl ExactSizeIterator<Item = Leased<'a>>,
) -> (Vec<Result<Reply>>, bool) {
    let n = writes.len();
    let fail_all = |action: String, e: redb::Error| -> (Vec<Result<Reply>>, bool) {
        // The batch's log positions are taken again by the next one.
        step_keys.forget_all();
        let shared = Arc::new(e);
        let results = (0..n)
            .map(|_| {
                Err(Error::Storage {
                    action: action.clone(),
                    cause: shared.clone(),
                })
            })
            .collect();
        (results, true)
    };
    let txn = match db.begin_write() {
        Ok(txn) => txn,
        Err(e) => return fail_all(format!("beginning a commit of {n} writes"), e.into()),
    };
    let mut results = Vec::with_capacity(n);
    let mut wrote = false;
    let outcome: std::result::Result<(), redb::Error> = (|| {
        let mut t = Tables::new(&txn, step_keys);
        for (write, lease) in writes {
            match apply(&mut t, write, lease.map(|lease| lease_check(leases, lease))) {
                Ok(Applied::Wrote(info)) => {
                    wrote = true;
                    results.push(Ok(info));
                }
                Ok(Applied::Unchanged(info)) => results.push(Ok(info)),
                Err(ApplyError::Rejected(e)) => results.push(Err(e)),
                Err(ApplyError::Storage(e)) => return Err(e),
            }
        }
        Ok(())
    })();
    if let Err(e) = outcome {
        let _ = txn.abort();
        return fail_all(format!("applying a commit of {n} writes"), e);
    }
    if !wrote {
        // Nothing changed: leave the file untouched (no commit, no fsync).
        let _ = txn.abort();
        return (results, false);
    }
    match txn.commit() {
        Ok(()) => {
            crate::failpoint::point("loops::writer::after_commit");
            (results, false)
        }
        Err(e) => fail_all(format!("committing {n} writes"), e.into()),
    }
}
