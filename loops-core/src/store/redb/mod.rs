//! The embedded store: one redb file, written by one writer thread with group commit.
//!
//! # Key layout
//! | table      | key                                   | value                          |
//! |------------|---------------------------------------|--------------------------------|
//! | `runs`     | run id                                | [`RunInfo`] (JSON), mutable    |
//! | `journal`  | (run id, seq)                         | [`TransitionRecord`] (JSON)    |
//! | `steps`    | (run id, seq, step name, occurrence)  | [`StepRecord`] (JSON)          |
//! | `failures` | (run id, seq, attempt, index)         | [`FailureRecord`] (JSON)       |
//! | `status`   | (status code, workflow, run id)       | `()`: the index runs are listed and resumed from |
//! | `schemas`  | schema hash (hex)                     | schema description             |
//! | `inbox`    | (run id, event seq)                   | [`EventRecord`] (JSON)         |
//! | `pending`  | (run id, event name, event seq)       | `()`: events not yet delivered |
//! | `event_keys` | (run id, idempotency key)           | event seq: duplicate sends     |
//!
//! Records in `journal`, `steps` and `failures` are immutable: every write checks that its key
//! is free and is refused otherwise. The `runs` row and the `status` index change in the same
//! write transaction as the record that changes them.
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
//! `tables` defines the tables; `open` opens, creates and checks the file; `commit` is the
//! commit path (the leader on the caller's thread, the writer thread, one write transaction
//! per batch); `apply` gathers a write's facts and stores its effects; `read` answers reads
//! and says which runs are ready; `maintain` compacts, checks and prunes; `seed` bulk-writes
//! histories for benchmarks; `verify` checks a file that must not be written. This file holds
//! the store's handle and what its clones share, and implements [`Store`] with them.

mod apply;
mod commit;
mod maintain;
mod open;
mod read;
#[cfg(any(test, feature = "test-util"))]
mod seed;
mod tables;
mod verify;

pub use maintain::Compacted;
pub(in crate::store) use open::refuse_special_file;
pub(in crate::store) use read::{ReadError, read_info};
pub(crate) use tables::{RUNS, SCHEMAS, STATUS};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use redb::{Database, ReadableDatabase};
use tokio::sync::{mpsc, oneshot};

use super::protocol::{EventRecord, Reply, Write};
use super::{BoxFuture, Lease, RunInfo, RunStatus, Store};
use crate::error::Result;
use crate::record::{FailureRecord, StepRecord, TransitionRecord};

/// The embedded store: a redb file that one process owns.
///
/// Cheap to clone (an `Arc`). Reads run on the caller's thread in their own read transaction;
/// writes go through the writer thread (see the module docs). The file is closed, and its
/// lock released, when the last clone is dropped.
#[derive(Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
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
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            verify_on_open: true,
            commit_on_caller: true,
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
    reply: oneshot::Sender<Result<Reply>>,
}

impl RedbStore {
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

    /// The file lock makes this process the only writer: leases are not checked.
    fn write<'a>(
        &'a self,
        _lease: Option<&'a Lease>,
        write: Write,
    ) -> BoxFuture<'a, Result<Reply>> {
        Box::pin(self.submit(write))
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

    fn schema(&self, hash: crate::SchemaHash) -> BoxFuture<'_, Result<Option<String>>> {
        Box::pin(std::future::ready(RedbStore::schema(self, hash)))
    }

    fn schemas(&self) -> BoxFuture<'_, Result<Vec<(crate::SchemaHash, String)>>> {
        Box::pin(std::future::ready(RedbStore::schemas(self)))
    }

    /// One process owns the file: every run's lease is granted, and never lapses.
    fn acquire<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<Lease>>> {
        Box::pin(std::future::ready(Ok(Some(Lease {
            run_id: run_id.to_owned(),
            token: 0,
            expires_ms: None,
        }))))
    }

    fn release<'a>(&'a self, _lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn renew<'a>(&'a self, leases: &'a [Lease]) -> BoxFuture<'a, Result<Vec<Lease>>> {
        Box::pin(std::future::ready(Ok(leases.to_vec())))
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
        Box::pin(std::future::ready(self.ready_runs(workflows, limit)))
    }
}

/// The error for a redb panic caught while doing `what` on a damaged file.
fn corrupted(what: &str) -> redb::Error {
    redb::Error::Corrupted(format!("redb panicked during {what}: the file is damaged"))
}
