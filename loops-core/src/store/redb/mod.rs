//! The embedded store: one redb file, written by one writer thread with group commit.
//!
//! # Key layout
//! | table      | key                                   | value                          |
//! |------------|---------------------------------------|--------------------------------|
//! | `runs`     | run id                                | the run's head in `log` (16 bytes), then [`RunInfo`] (binary, `row`), mutable |
//! | `log`      | global sequence (u64, from 1)         | one [`TransitionRecord`], [`StepRecord`] or [`FailureRecord`] (JSON) of a run, with its run id, key and back-pointers |
//! | `status`   | (status code, workflow, run id)       | `()`: the index runs are listed and resumed from |
//! | `schemas`  | schema hash (hex)                     | schema description             |
//! | `inbox`    | (run id, event seq)                   | [`EventRecord`] (JSON)         |
//! | `pending`  | (run id, event name, event seq)       | `()`: events not yet delivered |
//! | `event_keys` | (run id, idempotency key)           | event seq: duplicate sends     |
//!
//! This is store format 3 ([`STORE_FORMAT`]). The records of every run go to one
//! append-only log, in the order they are written, so that a commit of many runs' writes
//! appends to the end of one tree; each entry points back at its run's previous entry (and
//! a transition at its run's previous transition), and the run's row starts with the
//! positions of its newest entry and newest transition (`log` has the details). Format 1
//! kept them in `journal` (run id, seq), `steps` (run id, seq, step name, occurrence) and
//! `failures` (run id, seq, attempt, index); format 2 stored the rest of a run's row as
//! JSON, format 3 in a compact binary encoding (`row`); [`RedbStore::upgrade`] converts a
//! file of format 1 or 2.
//!
//! Records are immutable: every write checks that its key (the run, its seq and, for a step,
//! its name and occurrence) is free, and is refused otherwise. The `runs` row and the
//! `status` index change in the same write transaction as the record that changes them.
//!
//! # Commit path
//! Writers send their write to one thread that owns redb's single write transaction. The thread
//! takes the first write that arrives, adds every write that queued up meanwhile (up to
//! [`MAX_BATCH`]), applies them in one write transaction and commits it with
//! `Durability::Immediate` (one fdatasync), then acknowledges each caller. A lone write is
//! committed at once; under load, writes that arrive during a commit share the next one, as in
//! PostgreSQL's group commit. A write that fails its checks is answered with its error and
//! leaves no trace; a failed commit fails every write in it.
//!
//! # Files
//! `tables` defines the tables; `log` encodes the log's entries and the rows' heads and walks
//! a run's entries; `row` encodes a run's row; `upgrade` converts a file of format 1 or 2; `open` opens, creates and checks the file; `commit` is the
//! commit path (the leader on the caller's thread, the writer thread, one write transaction
//! per batch); `apply` gathers a write's facts and stores its effects; `read` answers reads
//! and says which runs are ready; `maintain` compacts, checks and prunes; `seed` bulk-writes
//! histories for benchmarks; `verify` checks a file that must not be written. This file holds
//! the store's handle and what its clones share, and implements [`Store`] with them.

mod apply;
mod commit;
mod log;
mod maintain;
mod open;
mod paths;
mod read;
mod row;
#[cfg(any(test, feature = "test-util"))]
mod seed;
pub(crate) mod socket;
mod step_keys;
mod tables;
mod upgrade;
mod verify;

pub use maintain::Compacted;
#[cfg(feature = "control")]
pub(crate) use paths::file_kind;
pub(in crate::store) use paths::refuse_special_file;
pub(in crate::store) use read::{ReadError, read_info};
pub use tables::STORE_FORMAT;
pub use upgrade::Upgraded;
#[cfg(test)]
mod format_tests;
pub(crate) use tables::{RUNS, SCHEMAS, STATUS};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;

use redb::{Database, ReadableDatabase};
use tokio::sync::{mpsc, oneshot};

use self::step_keys::StepKeys;
use super::protocol::{EventRecord, Reply, Write};
use super::{BoxFuture, Lease, RunInfo, RunStatus, SeqStep, Store};
use crate::error::Result;
use crate::record::{FailureRecord, StepRecord, TransitionRecord};

/// The embedded store: a redb file that one process owns.
///
/// Cheap to clone (an `Arc`). Reads run on the caller's thread in their own read transaction;
/// writes go through the writer thread (see the module docs). The file is closed, and its
/// lock released, when the last clone is dropped.
///
/// Leases are real across clones: each clone is a worker of its own (as each `PgStore` is),
/// the leases it takes are kept in memory in what the clones share, and a lease held by one
/// clone is refused to the others until it is released. Every write that carries a lease is
/// refused ([`Error::Fenced`](crate::Error::Fenced)) unless that lease is the run's current
/// one. So two `Runtime`s built on clones of one store never drive one run at once.
pub struct RedbStore {
    inner: Arc<Inner>,
    /// This handle's worker id in [`Leases`].
    worker: u64,
}

impl Clone for RedbStore {
    /// Another handle on the same store, as a worker of its own (see the type's docs).
    fn clone(&self) -> Self {
        RedbStore {
            inner: Arc::clone(&self.inner),
            worker: self.inner.leases.new_worker(),
        }
    }
}

impl RedbStore {
    /// A handle on `inner`, as a new worker.
    fn from_inner(inner: Inner) -> Self {
        let worker = inner.leases.new_worker();
        RedbStore {
            inner: Arc::new(inner),
            worker,
        }
    }
}

/// The leases of a store's runs, shared by its clones, in memory (leases never lapse: they
/// last until released, or until the process ends with the file lock).
#[derive(Default)]
pub(crate) struct Leases {
    /// Run id to `(worker, token)` of its current lease.
    held: Mutex<HashMap<String, (u64, u64)>>,
    /// The last worker id and the last token given out.
    last: Mutex<(u64, u64)>,
}

impl Leases {
    fn lock_held(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, u64)>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn new_worker(&self) -> u64 {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        last.0 = last.0.saturating_add(1);
        last.0
    }

    fn new_token(&self) -> u64 {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        last.1 = last.1.saturating_add(1);
        last.1
    }

    /// Takes the lease of `run_id` for `worker`: a new token, unless another worker holds
    /// it (then `None`). A worker that holds it already takes it over (its old token is
    /// fenced), as a PostgreSQL worker does.
    pub(crate) fn acquire(&self, worker: u64, run_id: &str) -> Option<Lease> {
        let mut held = self.lock_held();
        if held.get(run_id).is_some_and(|(w, _)| *w != worker) {
            return None;
        }
        let token = self.new_token();
        held.insert(run_id.to_owned(), (worker, token));
        Some(Lease {
            run_id: run_id.to_owned(),
            token,
            expires_ms: None,
        })
    }

    /// Leases of `worker` for each of `run_ids` that no worker holds, in their order, at
    /// most `limit` (`None` for the others).
    fn claim(
        &self,
        worker: u64,
        run_ids: impl Iterator<Item = String>,
        limit: usize,
    ) -> Vec<Option<Lease>> {
        let mut held = self.lock_held();
        let mut granted = 0usize;
        run_ids
            .map(|run_id| {
                if granted >= limit || held.contains_key(&run_id) {
                    return None;
                }
                granted = granted.saturating_add(1);
                let token = self.new_token();
                held.insert(run_id.clone(), (worker, token));
                Some(Lease {
                    run_id,
                    token,
                    expires_ms: None,
                })
            })
            .collect()
    }

    /// Frees the run of `lease`, if that lease is its current one.
    fn release(&self, lease: &Lease) {
        let mut held = self.lock_held();
        if held
            .get(&lease.run_id)
            .is_some_and(|(_, token)| *token == lease.token)
        {
            held.remove(&lease.run_id);
        }
    }

    /// The current ones among `leases`.
    fn current(&self, leases: &[Lease]) -> Vec<Lease> {
        let held = self.lock_held();
        leases
            .iter()
            .filter(|l| held.get(&l.run_id).is_some_and(|(_, t)| *t == l.token))
            .cloned()
            .collect()
    }

    /// The token of the run's current lease.
    pub(crate) fn token(&self, run_id: &str) -> Option<u64> {
        self.lock_held().get(run_id).map(|(_, token)| *token)
    }
}

struct Inner {
    /// Read transactions and commit batches hold the lock shared; compaction and the
    /// integrity check, which need redb's `&mut Database`, hold it exclusively.
    db: Arc<RwLock<Db>>,
    path: PathBuf,
    /// Opens the database again after an I/O error closed it (none when read-only).
    opener: Option<Opener>,
    /// Who commits now, and the writes waiting for a caller that commits on its own thread
    /// (see `submit`); shared with the writer thread.
    queue: Arc<Mutex<Queue>>,
    /// [`StoreOptions::commit_on_caller`].
    commit_on_caller: bool,
    tx: Option<mpsc::Sender<Request>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// The runs' leases (shared with the writer thread, which checks them at commit).
    leases: Arc<Leases>,
    /// The step keys of states with many steps, for the check of a new step record (shared
    /// with the writer thread).
    step_keys: Arc<StepKeys>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Close the queue, let the writer finish what it holds, and wait for it so that the
        // file lock is released when the store is dropped.
        self.tx.take();
        if let Ok(mut guard) = self.writer.lock()
            && let Some(handle) = guard.take()
        {
            let _ = handle.join();
        }
    }
}

/// A writable database, or a read-only handle (CLI inspection), or nothing while the writer
/// reopens the file after an I/O error.
enum Db {
    Writable(Database),
    ReadOnly(redb::ReadOnlyDatabase),
    Reopening(Arc<redb::Error>),
}

impl Db {
    fn begin_read(&self) -> std::result::Result<redb::ReadTransaction, redb::Error> {
        match self {
            Db::Writable(db) => db.begin_read().map_err(Into::into),
            Db::ReadOnly(db) => db.begin_read().map_err(Into::into),
            Db::Reopening(e) => Err(redb::Error::Io(std::io::Error::other(format!(
                "the store is being reopened after an I/O error: {e}"
            )))),
        }
    }
}

/// Opens the database again: after an I/O error redb refuses every further transaction until
/// the database is closed and opened again.
type Opener = Arc<dyn Fn() -> std::result::Result<Database, redb::DatabaseError> + Send + Sync>;

/// How a store opens its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// Verify the checksum of every page when the file is opened, so that a file altered
    /// outside redb (flipped bytes, a bad disk) fails to open with
    /// [`Error::Open`](crate::Error::Open) instead of being read. Reads the whole file: see
    /// `docs/benchmarks.md` for the cost. Default: on.
    pub verify_on_open: bool,
    /// On a multi-threaded tokio runtime, commit on the calling task's thread when no other
    /// commit is in progress, instead of handing the write to the writer thread and waiting
    /// to be woken: a lone transition then costs about 1.15x a raw redb commit instead of
    /// about 1.3x (`docs/benchmarks.md`). The thread is blocked for the commit (one fsync,
    /// about 0.2 ms here); tokio's other workers take over its queued tasks meanwhile. Turn
    /// it off if no task may ever block a worker for that long. Default: on.
    pub commit_on_caller: bool,
    /// The most memory, in bytes, that redb's cache of the file's pages may hold: pages read
    /// or written stay there until it is full. A process that reads many runs (a million
    /// parked runs woken over hours, listings of large stores) grows to about this much
    /// above its own needs; a smaller cache costs reads from the OS's page cache when the
    /// pages a run needs were evicted. Default: 256 MiB ([`DEFAULT_CACHE_BYTES`]).
    pub cache_bytes: usize,
}

/// The default [`StoreOptions::cache_bytes`]: 256 MiB (redb's own default is 1 GiB, which a
/// process that reads a large store fills: `docs/benchmarks.md`, scenario 9).
pub const DEFAULT_CACHE_BYTES: usize = 256 * 1024 * 1024;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            verify_on_open: true,
            commit_on_caller: true,
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.inner.path)
            .finish()
    }
}

/// Who commits now: nobody, a caller on its own thread (writes queue in `pending` for it),
/// or the writer thread (writes go to its channel until it finds the channel empty).
#[derive(Default)]
struct Queue {
    mode: Mode,
    pending: Vec<Request>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Mode {
    #[default]
    Idle,
    Inline,
    Thread,
}

struct Request {
    write: Write,
    /// The lease the write carries: checked against the run's current one at commit.
    lease: Option<Lease>,
    /// The write's answer, and the size of its batch when this write is the first of a
    /// batch the writer thread committed (0 otherwise): the caller records the batch in
    /// [`metrics`](crate::metrics), on its own task (where a test's local recorder sees it).
    reply: oneshot::Sender<(Result<Reply>, usize)>,
}

impl RedbStore {
    /// The ready runs of `workflows` that no clone holds, at most `limit`, each with a new
    /// lease of this clone. The index is read before any lease is taken: on an error, none
    /// is.
    fn claim_ready_runs(
        &self,
        workflows: &[crate::store::ClaimFilter],
        limit: usize,
        parked: Option<&mut Vec<crate::store::ParkedRun>>,
    ) -> Result<Vec<(RunInfo, Lease)>> {
        if limit == 0 && parked.is_none() {
            return Ok(Vec::new());
        }
        let ready = self.ready_runs(workflows, parked)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let leases = self.inner.leases.claim(
            self.worker,
            ready.iter().map(|info| info.run_id.clone()),
            limit,
        );
        Ok(ready
            .into_iter()
            .zip(leases)
            .filter_map(|(info, lease)| Some((info, lease?)))
            .collect())
    }

    /// [`Store::acquire`], without a future (it is ready at once).
    pub(crate) fn acquire_now(&self, run_id: &str) -> Option<Lease> {
        self.inner.leases.acquire(self.worker, run_id)
    }

    /// Forgets every lease of every clone, as the end of the process that held them would
    /// (the test kit's crash explorer, which "restarts" in one process).
    #[cfg(feature = "testing")]
    pub(crate) fn forget_leases(&self) {
        self.inner.leases.lock_held().clear();
    }

    /// The store file's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
}

impl Store for RedbStore {
    fn label(&self) -> String {
        self.inner.path.display().to_string()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    /// A write with a lease is refused unless the lease is the run's current one, checked
    /// by the plan in the write's transaction.
    fn write<'a>(&'a self, lease: Option<&'a Lease>, write: Write) -> BoxFuture<'a, Result<Reply>> {
        Box::pin(self.submit(write, lease.cloned()))
    }

    fn run_info<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunInfo>>> {
        Box::pin(std::future::ready(RedbStore::run(self, run_id)))
    }

    fn latest<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<(RunInfo, TransitionRecord)>>> {
        Box::pin(std::future::ready(RedbStore::latest(self, run_id)))
    }

    fn children<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<RunInfo>>> {
        Box::pin(std::future::ready(RedbStore::children(self, run_id)))
    }

    fn history<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<TransitionRecord>>> {
        Box::pin(std::future::ready(RedbStore::history(self, run_id)))
    }

    fn steps<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<Vec<(String, u32, StepRecord)>>> {
        Box::pin(std::future::ready(RedbStore::steps(self, run_id, seq)))
    }

    fn all_steps<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<SeqStep>>> {
        Box::pin(std::future::ready(RedbStore::all_steps(self, run_id)))
    }

    fn failures<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<(u64, FailureRecord)>>> {
        Box::pin(std::future::ready(RedbStore::failures(self, run_id)))
    }

    fn events<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(u64, EventRecord, bool)>>> {
        Box::pin(std::future::ready(RedbStore::events(self, run_id)))
    }

    fn has_pending<'a>(&'a self, run_id: &'a str, event: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(std::future::ready(RedbStore::has_pending(
            self, run_id, event,
        )))
    }

    fn list<'a>(
        &'a self,
        status: RunStatus,
        workflow: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<RunInfo>>> {
        Box::pin(std::future::ready(RedbStore::list(self, status, workflow)))
    }

    fn count_runs(&self) -> BoxFuture<'_, Result<Vec<crate::store::RunCount>>> {
        Box::pin(std::future::ready(RedbStore::count_runs(self)))
    }

    fn attributes<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<crate::Attributes>> {
        Box::pin(std::future::ready(RedbStore::attributes(self, run_id)))
    }

    fn search<'a>(
        &'a self,
        filter: &'a crate::RunFilter,
    ) -> BoxFuture<'a, Result<Vec<(RunInfo, crate::Attributes)>>> {
        Box::pin(std::future::ready(RedbStore::search(self, filter)))
    }

    fn schema(&self, hash: crate::SchemaHash) -> BoxFuture<'_, Result<Option<String>>> {
        Box::pin(std::future::ready(RedbStore::schema(self, hash)))
    }

    fn schemas(&self) -> BoxFuture<'_, Result<Vec<(crate::SchemaHash, String)>>> {
        Box::pin(std::future::ready(RedbStore::schemas(self)))
    }

    fn sealing_keys(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(std::future::ready(RedbStore::sealing_keys(self)))
    }

    fn sealing_checks(&self) -> BoxFuture<'_, Result<Vec<(String, String)>>> {
        Box::pin(std::future::ready(RedbStore::sealing_checks(self)))
    }

    fn schedules(&self) -> BoxFuture<'_, Result<Vec<crate::ScheduleInfo>>> {
        Box::pin(std::future::ready(RedbStore::schedules(self)))
    }

    /// One process owns the file; within it, a run's lease is held by one clone at a time
    /// and never lapses (`None` while another clone holds it). Ready at once.
    fn acquire<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<Lease>>> {
        Box::pin(std::future::ready(Ok(self.acquire_now(run_id))))
    }

    /// Ready at once.
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        self.inner.leases.release(lease);
        Box::pin(std::future::ready(Ok(())))
    }

    fn renew<'a>(&'a self, leases: &'a [Lease]) -> BoxFuture<'a, Result<Vec<Lease>>> {
        Box::pin(std::future::ready(Ok(self.inner.leases.current(leases))))
    }

    fn lease_ttl(&self) -> Option<std::time::Duration> {
        None
    }

    fn claim_ready<'a>(
        &'a self,
        workflows: &'a [super::ClaimFilter],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(RunInfo, Lease)>>> {
        // One process owns the file: its runtime takes every ready run of the workflows,
        // whatever its schema, and blocks those it cannot route.
        Box::pin(std::future::ready(
            self.claim_ready_runs(workflows, limit, None),
        ))
    }

    /// One pass over the waiting rows for both answers.
    fn claim_ready_and_parked<'a>(
        &'a self,
        workflows: &'a [super::ClaimFilter],
        limit: usize,
    ) -> BoxFuture<'a, Result<super::ReadyAndParked>> {
        let mut parked = Vec::new();
        let ready = self.claim_ready_runs(workflows, limit, Some(&mut parked));
        Box::pin(std::future::ready(ready.map(|ready| (ready, parked))))
    }
}

/// The error for a redb panic caught while doing `what` on a damaged file.
fn corrupted(what: &str) -> redb::Error {
    redb::Error::Corrupted(format!("redb panicked during {what}: the file is damaged"))
}
