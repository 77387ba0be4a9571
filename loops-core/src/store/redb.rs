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

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;

use redb::backends::FileBackend;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use tokio::sync::{mpsc, oneshot};

use serde::Serialize;

use super::protocol::{EventRecord, Reply, Write};
use super::{
    BoxFuture, Effects, Facts, InboxChange, Lease, Needs, PendingEvent, Pruned, Ready, Record,
    RecordKey, RowWrite, RunInfo, RunStatus, Store, plan,
};
use crate::error::{Error, RecordKind, Result};
use crate::record::{FailureRecord, StepRecord, TransitionRecord};
#[cfg(any(test, feature = "test-util"))]
use crate::workflow::{StateId, Workflow};

pub(crate) const RUNS: TableDefinition<&str, &[u8]> = TableDefinition::new("runs");
pub(crate) const JOURNAL: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("journal");
pub(crate) const STEPS: TableDefinition<(&str, u64, &str, u32), &[u8]> =
    TableDefinition::new("steps");
pub(crate) const FAILURES: TableDefinition<(&str, u64, u32, u32), &[u8]> =
    TableDefinition::new("failures");
pub(crate) const STATUS: TableDefinition<(u8, &str, &str), ()> = TableDefinition::new("status");
pub(crate) const SCHEMAS: TableDefinition<&str, &str> = TableDefinition::new("schemas");
pub(crate) const INBOX: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("inbox");
pub(crate) const PENDING: TableDefinition<(&str, &str, u64), ()> = TableDefinition::new("pending");
pub(crate) const EVENT_KEYS: TableDefinition<(&str, &str), u64> =
    TableDefinition::new("event_keys");

const TABLES: [&str; 9] = [
    "runs",
    "journal",
    "steps",
    "failures",
    "status",
    "schemas",
    "inbox",
    "pending",
    "event_keys",
];

/// What [`RedbStore::compact`] reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Compacted {
    /// File size before, in bytes.
    pub bytes_before: u64,
    /// File size after, in bytes.
    pub bytes_after: u64,
}

/// Most writes committed in one write transaction.
pub(crate) const MAX_BATCH: usize = 1024;

/// Writes per write transaction of [`RedbStore::__seed_history`].
#[cfg(any(test, feature = "test-util"))]
pub(crate) const SEED_BATCH: usize = 8192;

/// Writes waiting for the writer thread before senders wait (backpressure).
const QUEUE: usize = 4096;

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
    /// outside redb (flipped bytes, a bad disk) fails to open with [`Error::Open`] instead of
    /// being read. Reads the whole file: see `docs/benchmarks.md` for the cost. Default: on.
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

/// Rounds a leader commits of others' writes before it hands the rest to the writer thread.
pub(crate) const LEADER_ROUNDS: usize = 4;

/// Whether a write may be committed on the caller's thread: inside a multi-threaded tokio
/// runtime, where `block_in_place` lets the runtime move its other tasks elsewhere.
fn inline_commit_allowed() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

struct Request {
    write: Write,
    reply: oneshot::Sender<Result<Reply>>,
}

impl RedbStore {
    /// Opens the store file at `path`, creating it (mode 0600) and its parent directory
    /// (mode 0700) if they do not exist.
    ///
    /// # Errors
    /// - [`Error::StoreLocked`] at once if this or another process has the file open;
    /// - [`Error::Open`] if the file is not a redb file, is corrupt, or cannot be read.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, StoreOptions::default())
    }

    /// As [`open`](Self::open), with `options`.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_with(path: impl AsRef<Path>, store_options: StoreOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        refuse_special_file(&path)?;
        let open_err = |source: crate::BoxError| Error::Open {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
            && !dir.exists()
        {
            create_private_dir(dir).map_err(|e| open_err(e.into()))?;
        }
        if !path.exists() {
            create_atomically(&path).map_err(|e| open_err(e.into()))?;
        } else if let Some(name) = path.file_name() {
            remove_abandoned_new_files(
                &parent_dir(&path),
                &new_file_prefix(&name.to_string_lossy()),
            );
        }
        if std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == 0) {
            // redb would initialize an empty file as a new store: refuse, lest a truncated
            // store silently becomes an empty one. loops never leaves an empty file behind.
            return Err(open_err(
                "the file is empty (0 bytes), not a loops store; delete it to start a new store"
                    .into(),
            ));
        }
        let file_path = path.clone();
        Self::with_storage(path, store_options, move || {
            let file = OpenOptions::new().read(true).write(true).open(&file_path)?;
            FileBackend::new(file).map_err(|e| std::io::Error::other(e.to_string()))
        })
    }

    /// A store kept in memory only: nothing survives the process. For tests of workflows
    /// and handlers, never for real runs.
    ///
    /// # Errors
    /// [`Error::Open`] if redb cannot initialize the memory backend.
    pub fn in_memory() -> Result<Self> {
        // Memory cannot be reopened: an I/O error (there are none in memory) would be final.
        let backend = Mutex::new(Some(redb::backends::InMemoryBackend::new()));
        Self::with_storage(
            PathBuf::from(":memory:"),
            StoreOptions {
                verify_on_open: false,
                commit_on_caller: true,
            },
            move || {
                backend
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take()
                    .ok_or_else(|| std::io::Error::other("an in-memory store cannot be reopened"))
            },
        )
    }

    /// A store on a storage backend of your own (encryption, a block device, fault injection
    /// in tests). `make_backend` is called to open the store, and again to reopen it after an
    /// I/O error; `label` names the store in errors and logs.
    ///
    /// # Errors
    /// [`Error::StoreLocked`] if the backend reports the database open elsewhere;
    /// [`Error::Open`] if it is not a redb database, is corrupt, or cannot be read.
    pub fn with_storage<B, F>(
        label: PathBuf,
        options: StoreOptions,
        make_backend: F,
    ) -> Result<Self>
    where
        B: redb::StorageBackend,
        F: Fn() -> std::io::Result<B> + Send + Sync + 'static,
    {
        let path = label;
        let opener: Opener = Arc::new(move || {
            let backend = make_backend()?;
            let mut builder = Database::builder();
            builder.set_check_integrity_on_open(options.verify_on_open);
            // redb documents that a plain open of an altered file may panic: never let that
            // reach the caller.
            crate::panics::catch(|| builder.create_with_backend(backend)).unwrap_or_else(|_| {
                Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(
                    "redb panicked while opening the file".to_owned(),
                )))
            })
        });
        let open_err = |source: crate::BoxError| Error::Open {
            path: path.clone(),
            source,
        };
        let db = match opener() {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(Error::StoreLocked { path });
            }
            Err(e) => return Err(open_err(open_source(e))),
        };
        ensure_tables(&db).map_err(|e| open_err(e.into()))?;
        let db = Arc::new(RwLock::new(Db::Writable(db)));
        let (tx, rx) = mpsc::channel(QUEUE);
        let writer_db = Arc::clone(&db);
        let writer_opener = Arc::clone(&opener);
        let queue = Arc::new(Mutex::new(Queue::default()));
        let writer_queue = Arc::clone(&queue);
        let writer_path = path.clone();
        let writer = std::thread::Builder::new()
            .name("loops-writer".into())
            .spawn(move || writer_loop(&writer_db, &writer_opener, &writer_path, &writer_queue, rx))
            .map_err(|e| open_err(e.into()))?;
        Ok(RedbStore {
            inner: Arc::new(Inner {
                db,
                path,
                opener: Some(opener),
                queue,
                commit_on_caller: options.commit_on_caller,
                tx: Some(tx),
                writer: Mutex::new(Some(writer)),
            }),
        })
    }

    /// Opens the store file at `path` for reading only: for inspection (the `loops` CLI)
    /// while no process drives it. Every write returns [`Error::ReadOnly`].
    ///
    /// As a writable open does by default ([`StoreOptions::verify_on_open`]), it first
    /// verifies the checksum of every page of the file, so that a file altered outside redb
    /// is refused instead of read. The check writes nothing to the file: redb's writes go to
    /// memory. [`open_read_only_with`](Self::open_read_only_with) can skip it.
    ///
    /// # Errors
    /// - [`Error::StoreLocked`] if a process has the file open for writing;
    /// - [`Error::NeedsRecovery`] if the file was not closed cleanly (a crash): redb repairs
    ///   it on the next writable open ([`RedbStore::open`]);
    /// - [`Error::Open`] if it does not exist, is not a redb file, cannot be read, or fails
    ///   the verification (its source is then a [`redb::DatabaseError::Storage`]).
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_read_only_with(path, StoreOptions::default())
    }

    /// As [`open_read_only`](Self::open_read_only), verifying the file only if
    /// `options.verify_on_open` is set (`commit_on_caller` does not apply).
    ///
    /// # Errors
    /// As [`open_read_only`](Self::open_read_only).
    pub fn open_read_only_with(path: impl AsRef<Path>, options: StoreOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        refuse_special_file(&path)?;
        let opened = crate::panics::catch(|| redb::Builder::new().open_read_only(&path))
            .unwrap_or_else(|_| {
                Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(
                    "redb panicked while opening the file".to_owned(),
                )))
            });
        let db = match opened {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(Error::StoreLocked { path });
            }
            Err(redb::DatabaseError::RepairAborted) => {
                return Err(Error::NeedsRecovery { path });
            }
            Err(e) => {
                return Err(Error::Open {
                    path,
                    source: open_source(e),
                });
            }
        };
        // Verified while the read-only handle holds the file, so that no writer changes it
        // between the check and the reads.
        if options.verify_on_open
            && let Err(e) = super::verify::verify_file(&path)
        {
            return Err(Error::Open {
                path,
                source: Box::new(redb::DatabaseError::Storage(match e {
                    redb::Error::Io(io) => redb::StorageError::Io(io),
                    redb::Error::Corrupted(what) => redb::StorageError::Corrupted(format!(
                        "verifying the checksum of every page failed: {what}"
                    )),
                    other => redb::StorageError::Corrupted(format!(
                        "verifying the checksum of every page failed: {other}"
                    )),
                })),
            });
        }
        Ok(RedbStore {
            inner: Arc::new(Inner {
                db: Arc::new(RwLock::new(Db::ReadOnly(db))),
                path,
                opener: None,
                queue: Arc::new(Mutex::new(Queue::default())),
                commit_on_caller: false,
                tx: None,
                writer: Mutex::new(None),
            }),
        })
    }

    /// The store file's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The store file's size on disk, in bytes (0 for an in-memory store).
    ///
    /// # Errors
    /// [`Error::Open`] if the file's metadata cannot be read.
    pub fn file_bytes(&self) -> Result<u64> {
        if self.inner.path == Path::new(":memory:") {
            return Ok(0);
        }
        std::fs::metadata(&self.inner.path)
            .map(|m| m.len())
            .map_err(|e| Error::Open {
                path: self.inner.path.clone(),
                source: e.into(),
            })
    }

    /// Compacts the file: moves pages to the front and truncates the free space at its end.
    /// Reads and commits wait while it runs (it needs the file to itself). Blocking: call it
    /// from a blocking thread ([`Runtime::compact`](crate::Runtime::compact) does).
    ///
    /// # Errors
    /// [`Error::ReadOnly`] for a read-only store; [`Error::Storage`] if redb fails.
    pub fn compact(&self) -> Result<Compacted> {
        let bytes_before = self.file_bytes()?;
        {
            let mut guard = self
                .inner
                .db
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let Db::Writable(db) = &mut *guard else {
                return Err(Error::ReadOnly {
                    path: self.inner.path.clone(),
                });
            };
            // Each pass moves what it can; a few passes reach the fixed point.
            for _ in 0..8 {
                let pass = crate::panics::catch(|| db.compact())
                    .map_err(|_| Error::storage("compacting the store", corrupted("compaction")))?;
                if !pass.map_err(|e| Error::storage("compacting the store", e))? {
                    break;
                }
            }
        }
        Ok(Compacted {
            bytes_before,
            bytes_after: self.file_bytes()?,
        })
    }

    /// Verifies the checksum of every page of the file and repairs redb's allocator state if
    /// needed. Returns `true` if the file was intact. Blocking, and exclusive like
    /// [`compact`](Self::compact).
    ///
    /// # Errors
    /// [`Error::ReadOnly`] for a read-only store; [`Error::Storage`] if the file is corrupt
    /// beyond repair or cannot be read.
    pub fn check_integrity(&self) -> Result<bool> {
        let mut guard = self
            .inner
            .db
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let Db::Writable(db) = &mut *guard else {
            return Err(Error::ReadOnly {
                path: self.inner.path.clone(),
            });
        };
        crate::panics::catch(|| db.check_integrity())
            .map_err(|_| {
                Error::storage(
                    "checking the store's integrity",
                    corrupted("the integrity check"),
                )
            })?
            .map_err(|e| Error::storage("checking the store's integrity", e))
    }

    /// Selects the ended runs `policy` expires at `now_ms` and, unless `dry_run`, deletes
    /// their records, rows, index entries and events, in batches, as [`prune`](crate::prune)
    /// does. Runs that have not ended are never touched.
    ///
    /// # Errors
    /// [`Error::Storage`] if a read or a commit fails (runs deleted by earlier batches stay
    /// deleted); [`Error::ReadOnly`] for a read-only store unless `dry_run`.
    pub async fn prune(
        &self,
        policy: &crate::retention::RetentionPolicy,
        now_ms: u64,
        dry_run: bool,
    ) -> Result<Pruned> {
        super::prune(self, policy, now_ms, dry_run).await
    }

    /// Deletes the records, rows, index entries and events of the runs in `run_ids` that have
    /// ended, in one write transaction; runs that have not ended, or do not exist, are
    /// skipped. Returns the number of transition records deleted. For callers that select runs
    /// themselves (and show progress); [`prune`](Self::prune) selects by policy.
    ///
    /// # Errors
    /// [`Error::Storage`] if the commit fails; [`Error::ReadOnly`] for a read-only store.
    pub async fn delete_ended_runs(&self, run_ids: &[String]) -> Result<u64> {
        match self
            .submit(Write::Prune {
                run_ids: run_ids.to_vec(),
            })
            .await?
        {
            Reply::Pruned { records } => Ok(records),
            _ => Ok(0),
        }
    }

    /// Bulk-writes transition records, for benchmarks and tests that need long histories or
    /// many runs without paying one durable commit per record. Not a public API.
    ///
    /// Each `(run id, value)` appends `value` as the run's next transition record: the first
    /// value of a run id creates the run (seq 0, status running), each further one moves it
    /// to the next seq, and a terminal state completes it. The records, rows and index
    /// entries are those the runtime writes: the same [`Write`]s, encoded by
    /// [`TransitionRecord::encode`] and applied by the writer's own `apply`, only many per
    /// write transaction ([`SEED_BATCH`]) and on the caller's thread. Run ids must be new to
    /// the store. Blocking. Returns the number of records written.
    ///
    /// # Errors
    /// The first write refused (for example [`Error::SequenceConflict`] for a run id that
    /// exists), after the transaction that held it committed the others;
    /// [`Error::Storage`] if a commit fails; [`Error::ReadOnly`] for a read-only store.
    #[cfg(any(test, feature = "test-util"))]
    #[doc(hidden)]
    pub fn __seed_history<W: Workflow>(
        &self,
        history: impl IntoIterator<Item = (String, W)>,
    ) -> Result<u64> {
        let mut next_seq: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        let mut batch: Vec<Write> = Vec::with_capacity(SEED_BATCH);
        let mut written = 0u64;
        let mut history = history.into_iter().peekable();
        while history.peek().is_some() {
            for (run_id, value) in history.by_ref().take(SEED_BATCH) {
                let now = crate::record::now_ms();
                let seq = next_seq.get(&run_id).copied().unwrap_or(0);
                let record = TransitionRecord::encode(&run_id, seq, &value, now)?;
                let state = value.state();
                let write = if seq == 0 {
                    Write::Create {
                        info: RunInfo::new_run::<W>(&run_id, state, now),
                        record: record.to_bytes(),
                        schema_text: W::SCHEMA,
                    }
                } else {
                    Write::Transition {
                        run_id: run_id.clone(),
                        seq,
                        state: state.name().to_owned(),
                        record: record.to_bytes(),
                        terminal: state.is_terminal(),
                        at_ms: now,
                    }
                };
                next_seq.insert(run_id, seq + 1);
                batch.push(write);
            }
            let results = {
                let guard = self.inner.db.read().unwrap_or_else(PoisonError::into_inner);
                match &*guard {
                    Db::Writable(db) => commit_batch(db, batch.iter()).0,
                    Db::ReadOnly(_) => {
                        return Err(Error::ReadOnly {
                            path: self.inner.path.clone(),
                        });
                    }
                    Db::Reopening(e) => {
                        return Err(Error::Storage {
                            action: "seeding records".to_owned(),
                            source: e.clone(),
                        });
                    }
                }
            };
            for result in results {
                result?;
                written += 1;
            }
            batch.clear();
        }
        Ok(written)
    }

    /// Every stored schema description, as `(hash, description)`, by hash.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error.
    pub fn schemas(&self) -> Result<Vec<(crate::SchemaHash, String)>> {
        self.read(
            || "reading schemas".to_owned(),
            |txn| {
                let schemas = txn.open_table(SCHEMAS)?;
                let mut out = Vec::new();
                for entry in schemas.iter()? {
                    let (key, value) = entry?;
                    if let Ok(hash) = key.value().parse() {
                        out.push((hash, value.value().to_owned()));
                    }
                }
                Ok(out)
            },
        )
    }

    /// Commits `write` (batched with concurrent writes) and returns the writer's answer.
    ///
    /// On a multi-threaded tokio runtime the commit is made on the caller's thread (inside
    /// `block_in_place`) when no other commit is in progress: a lone write then costs what a
    /// raw redb commit costs, without two thread hand-offs. Writes that arrive during that
    /// commit queue up, and the committing caller (the leader) commits them too, in one
    /// transaction, for up to [`LEADER_ROUNDS`] rounds before it hands what is left to the
    /// writer thread. Elsewhere (a current-thread runtime) every write goes to the writer
    /// thread, which batches the same way.
    async fn submit(&self, write: Write) -> Result<Reply> {
        let Some(tx) = self.inner.tx.as_ref() else {
            return Err(Error::ReadOnly {
                path: self.inner.path.clone(),
            });
        };
        if self.inner.commit_on_caller && inline_commit_allowed() {
            let queued = {
                let mut queue = self
                    .inner
                    .queue
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                match queue.mode {
                    Mode::Idle => {
                        queue.mode = Mode::Inline;
                        Ok(Ok(write))
                    }
                    Mode::Inline => {
                        let (reply, rx) = oneshot::channel();
                        queue.pending.push(Request { write, reply });
                        Ok(Err(rx))
                    }
                    Mode::Thread => Err(write),
                }
            };
            match queued {
                Ok(Ok(write)) => return self.lead(write),
                Ok(Err(rx)) => return rx.await.map_err(|_| Error::Closed)?,
                Err(write) => {
                    let (reply, rx) = oneshot::channel();
                    tx.send(Request { write, reply })
                        .await
                        .map_err(|_| Error::Closed)?;
                    return rx.await.map_err(|_| Error::Closed)?;
                }
            }
        }
        let (reply, rx) = oneshot::channel();
        tx.send(Request { write, reply })
            .await
            .map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }

    /// Commits `own` and what queues up meanwhile, as the leader (see [`submit`]); returns
    /// `own`'s answer. Blocking.
    fn lead(&self, own: Write) -> Result<Reply> {
        let inner = &*self.inner;
        let Some(opener) = inner.opener.as_ref() else {
            return Err(Error::Closed);
        };
        let mut own = Some(own);
        let mut own_result = Err(Error::Closed);
        for round in 0.. {
            let pending = {
                let mut queue = inner.queue.lock().unwrap_or_else(PoisonError::into_inner);
                let pending = std::mem::take(&mut queue.pending);
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
            let mut writes: Vec<&Write> = Vec::with_capacity(pending.len() + 1);
            if let Some(write) = &own {
                writes.push(write);
            }
            writes.extend(pending.iter().map(|r| &r.write));
            let mut results = commit_writes(&inner.db, opener, &inner.path, writes).into_iter();
            if own.take().is_some() {
                own_result = results.next().unwrap_or(Err(Error::Closed));
            }
            for (request, result) in pending.into_iter().zip(results) {
                let _ = request.reply.send(result);
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
        let results = commit_writes(
            &self.inner.db,
            opener,
            &self.inner.path,
            left.iter().map(|r| &r.write).collect(),
        );
        for (request, result) in left.into_iter().zip(results) {
            let _ = request.reply.send(result);
        }
    }

    pub(super) fn read<T>(
        &self,
        action: impl Fn() -> String,
        f: impl FnOnce(&redb::ReadTransaction) -> std::result::Result<T, ReadError>,
    ) -> Result<T> {
        if let Some(opener) = &self.inner.opener {
            // A store closed by a failed commit is opened again by the first read or write
            // after the fault clears.
            let _ = reopen_if_needed(&self.inner.db, opener, &self.inner.path);
        }
        // Held for the read, so that compaction waits for it.
        let db = self.inner.db.read().unwrap_or_else(PoisonError::into_inner);
        let txn = db.begin_read().map_err(|e| Error::storage(action(), e))?;
        // redb may panic on a page it cannot make sense of (a damaged file): a typed error.
        let read = crate::panics::catch(|| f(&txn))
            .unwrap_or_else(|_| Err(ReadError::Storage(corrupted("a read"))));
        read.map_err(|e| match e {
            ReadError::Storage(e) => Error::storage(action(), e),
            ReadError::Loops(e) => e,
        })
    }

    /// The run's current row, or `None` if no run has this id.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if the row is unreadable.
    pub fn run(&self, run_id: &str) -> Result<Option<RunInfo>> {
        self.read(
            || format!("reading run `{run_id}`"),
            |txn| {
                let runs = txn.open_table(RUNS)?;
                read_info(&runs, run_id)
            },
        )
    }

    /// The run's row and its latest transition record, read through the run's row: the cost
    /// does not depend on the length of the history.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a record is unreadable.
    pub fn latest(&self, run_id: &str) -> Result<Option<(RunInfo, TransitionRecord)>> {
        self.read(
            || format!("reading run `{run_id}`"),
            |txn| {
                let runs = txn.open_table(RUNS)?;
                let Some(info) = read_info(&runs, run_id)? else {
                    return Ok(None);
                };
                let journal = txn.open_table(JOURNAL)?;
                let bytes = journal.get((run_id, info.seq))?.ok_or_else(|| {
                    ReadError::Loops(Error::RecordMissing {
                        run_id: run_id.to_owned(),
                        seq: info.seq,
                    })
                })?;
                let record = TransitionRecord::from_stored(run_id, info.seq, bytes.value())?;
                Ok(Some((info, record)))
            },
        )
    }

    /// Every transition record of the run, by sequence number (empty if the run does not
    /// exist).
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a record is unreadable.
    pub fn history(&self, run_id: &str) -> Result<Vec<TransitionRecord>> {
        self.read(
            || format!("reading the history of run `{run_id}`"),
            |txn| {
                let journal = txn.open_table(JOURNAL)?;
                let mut out = Vec::new();
                for entry in journal.range((run_id, 0)..=(run_id, u64::MAX))? {
                    let (key, value) = entry?;
                    let seq = key.value().1;
                    out.push(TransitionRecord::from_stored(run_id, seq, value.value())?);
                }
                Ok(out)
            },
        )
    }

    /// The step records of the run's state at `seq`, as `(name, occurrence, record)`, ordered
    /// by name then occurrence.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a record is unreadable.
    pub fn steps(&self, run_id: &str, seq: u64) -> Result<Vec<(String, u32, StepRecord)>> {
        self.read(
            || format!("reading the steps of run `{run_id}` seq {seq}"),
            |txn| {
                let steps = txn.open_table(STEPS)?;
                let mut out = Vec::new();
                for entry in steps.range((run_id, seq, "", 0)..(run_id, seq + 1, "", 0))? {
                    let (key, value) = entry?;
                    let (_, _, name, occurrence) = key.value();
                    let record: StepRecord =
                        serde_json::from_slice(value.value()).map_err(|source| Error::Decode {
                            run_id: run_id.to_owned(),
                            record: RecordKind::Step {
                                name: name.to_owned(),
                                occurrence,
                            },
                            seq,
                            state: String::new(),
                            source,
                        })?;
                    out.push((name.to_owned(), occurrence, record));
                }
                Ok(out)
            },
        )
    }

    /// Every failed attempt of the run, as `(seq, record)`, by seq, attempt and order.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a record is unreadable.
    pub fn failures(&self, run_id: &str) -> Result<Vec<(u64, FailureRecord)>> {
        self.read(
            || format!("reading the failures of run `{run_id}`"),
            |txn| {
                let failures = txn.open_table(FAILURES)?;
                let mut out = Vec::new();
                for entry in
                    failures.range((run_id, 0, 0, 0)..=(run_id, u64::MAX, u32::MAX, u32::MAX))?
                {
                    let (key, value) = entry?;
                    let seq = key.value().1;
                    let record: FailureRecord =
                        serde_json::from_slice(value.value()).map_err(|source| Error::Decode {
                            run_id: run_id.to_owned(),
                            record: RecordKind::Failure,
                            seq,
                            state: String::new(),
                            source,
                        })?;
                    out.push((seq, record));
                }
                Ok(out)
            },
        )
    }

    /// The runs with `status`, optionally only those of `workflow`, ordered by workflow then
    /// run id. Reads the status index and each listed run's row, never a history.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a row is unreadable.
    pub fn list(&self, status: RunStatus, workflow: Option<&str>) -> Result<Vec<RunInfo>> {
        self.read(
            || format!("listing {status} runs"),
            |txn| {
                let index = txn.open_table(STATUS)?;
                let runs = txn.open_table(RUNS)?;
                let code = status.code();
                let range = match workflow {
                    Some(w) => index.range((code, w, "")..)?,
                    None => index.range((code, "", "")..)?,
                };
                let mut out = Vec::new();
                for entry in range {
                    let (key, _) = entry?;
                    let (c, w, run_id) = key.value();
                    if c != code || workflow.is_some_and(|want| want != w) {
                        break;
                    }
                    if let Some(info) = read_info(&runs, run_id)? {
                        out.push(info);
                    }
                }
                Ok(out)
            },
        )
    }

    /// Every event sent to the run, as `(event seq, record, delivered)`, by event seq.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a record is unreadable.
    pub fn events(&self, run_id: &str) -> Result<Vec<(u64, EventRecord, bool)>> {
        self.read(
            || format!("reading the inbox of run `{run_id}`"),
            |txn| {
                let inbox = txn.open_table(INBOX)?;
                let pending = txn.open_table(PENDING)?;
                let mut out = Vec::new();
                for entry in inbox.range((run_id, 0)..=(run_id, u64::MAX))? {
                    let (key, value) = entry?;
                    let event_seq = key.value().1;
                    let record: EventRecord =
                        serde_json::from_slice(value.value()).map_err(|source| Error::Decode {
                            run_id: run_id.to_owned(),
                            record: RecordKind::Event { name: None },
                            seq: event_seq,
                            state: String::new(),
                            source,
                        })?;
                    let waiting = pending
                        .get((run_id, record.name.as_str(), event_seq))?
                        .is_some();
                    out.push((event_seq, record, !waiting));
                }
                Ok(out)
            },
        )
    }

    /// Whether an event named `event` waits undelivered in the run's inbox.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error.
    pub fn has_pending(&self, run_id: &str, event: &str) -> Result<bool> {
        self.read(
            || format!("reading the inbox of run `{run_id}`"),
            |txn| {
                let pending = txn.open_table(PENDING)?;
                Ok(pending
                    .range((run_id, event, 0)..=(run_id, event, u64::MAX))?
                    .next()
                    .is_some())
            },
        )
    }

    /// The schema description stored for `hash` (written once per hash when a run starts).
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error.
    pub fn schema(&self, hash: crate::SchemaHash) -> Result<Option<String>> {
        self.read(
            || format!("reading schema {hash}"),
            |txn| {
                let schemas = txn.open_table(SCHEMAS)?;
                Ok(schemas
                    .get(hash.to_string().as_str())?
                    .map(|v| v.value().to_owned()))
            },
        )
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
        workflows: &'a [String],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(RunInfo, Lease)>>> {
        Box::pin(std::future::ready((|| {
            let now = crate::record::now_ms();
            let mut out = Vec::new();
            for workflow in workflows {
                for status in [RunStatus::Running, RunStatus::Waiting] {
                    for info in RedbStore::list(self, status, Some(workflow))? {
                        if out.len() >= limit {
                            return Ok(out);
                        }
                        let ready = match info.readiness().at(now) {
                            Ready::Now => true,
                            Ready::OnEvent(event) => {
                                RedbStore::has_pending(self, &info.run_id, event)?
                            }
                            Ready::No => false,
                        };
                        if ready {
                            let lease = Lease {
                                run_id: info.run_id.clone(),
                                token: 0,
                                expires_ms: None,
                            };
                            out.push((info, lease));
                        }
                    }
                }
            }
            Ok(out)
        })()))
    }
}

pub(super) enum ReadError {
    Storage(redb::Error),
    Loops(Error),
}

impl<E: Into<redb::Error>> From<E> for ReadError {
    fn from(e: E) -> Self {
        ReadError::Storage(e.into())
    }
}

impl From<Error> for ReadError {
    fn from(e: Error) -> Self {
        ReadError::Loops(e)
    }
}

pub(super) fn read_info(
    runs: &impl ReadableTable<&'static str, &'static [u8]>,
    run_id: &str,
) -> std::result::Result<Option<RunInfo>, ReadError> {
    let Some(bytes) = runs.get(run_id)? else {
        return Ok(None);
    };
    RunInfo::decode(run_id, bytes.value())
        .map(Some)
        .map_err(ReadError::Loops)
}

/// How old a temporary file of [`create_atomically`] must be for another creation to remove
/// it when its creator's process cannot be checked (another OS, or a process id that is in
/// use again): a creation that is still running holds its own for milliseconds.
const STALE_NEW_FILE: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the temporary file `path` of [`create_atomically`], named after `pid`, was left by
/// a creation that will not finish: nobody holds its lock (a running creation holds redb's
/// lock on it while it initializes it), and its process is gone or the file is
/// [`STALE_NEW_FILE`] old.
fn is_abandoned(path: &Path, pid: Option<u32>) -> bool {
    let old = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .is_ok_and(|at| at.elapsed().is_ok_and(|age| age >= STALE_NEW_FILE));
    // Linux: a process id without a /proc entry is not running on this machine (in this PID
    // namespace; the lock below covers creators in another one).
    let gone = cfg!(target_os = "linux")
        && pid.is_some_and(|pid| {
            pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists()
        });
    (old || gone) && std::fs::File::open(path).is_ok_and(|file| file.try_lock().is_ok())
}

/// Numbers the temporary files of creations in this process, so that threads creating the
/// same store at once each have their own.
static NEW_FILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Refuses a `path` that exists and is not a regular file (a FIFO, a socket, a device or a
/// directory), before any open touches it: opening a FIFO would block until a writer came.
/// A path that does not exist passes (the open that follows says so, or creates the store).
pub(super) fn refuse_special_file(path: &Path) -> Result<()> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    let file_type = meta.file_type();
    if file_type.is_file() {
        return Ok(());
    }
    let what = if file_type.is_dir() {
        "a directory"
    } else {
        special_file_kind(&file_type)
    };
    Err(Error::Open {
        path: path.to_path_buf(),
        source: format!("it is {what}, not a regular file; a store is a regular file").into(),
    })
}

#[cfg(unix)]
fn special_file_kind(file_type: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_fifo() {
        "a FIFO (named pipe)"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_char_device() {
        "a character device"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_file_kind(_: &std::fs::FileType) -> &'static str {
    "a special file"
}

/// The directory holding the store file `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The name prefix of [`create_atomically`]'s temporary files for the store file `name`.
fn new_file_prefix(name: &str) -> String {
    format!(".{name}.new-")
}

/// Removes the temporary files of [`create_atomically`] (named `{prefix}{pid}-{n}`) in `dir`
/// that were left by a creation that will not finish (see [`is_abandoned`]). Called by every
/// creation and by every writable open of an existing store: a kill between the link and the
/// removal of the temporary file leaves the store in place, so only an open can clean up.
fn remove_abandoned_new_files(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(suffix) = file_name.strip_prefix(prefix) else {
            continue;
        };
        // `{pid}-{n}`
        let pid = suffix.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if is_abandoned(&entry.path(), pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Creates a new store file at `path` so that no crash can leave it half-made: redb
/// initializes a temporary file beside it (mode 0600, named after the process and a counter),
/// which is then linked into place (an atomic create-if-absent: a concurrent creator gets
/// `AlreadyExists` and opens the winner's file) and its directory synced. A kill before the
/// link leaves only a temporary file, removed by a later creation once it is abandoned (see
/// [`is_abandoned`]); one that may belong to a creation still running is left alone.
fn create_atomically(path: &Path) -> std::io::Result<()> {
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the store path has no file name"))?
        .to_string_lossy()
        .into_owned();
    let prefix = new_file_prefix(&name);
    remove_abandoned_new_files(&dir, &prefix);
    let tmp = dir.join(format!(
        "{prefix}{}-{}",
        std::process::id(),
        NEW_FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let mut options = OpenOptions::new();
    options.read(true).write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(&tmp)?;
    let made = (|| -> std::result::Result<(), redb::Error> {
        let db = Database::builder().create_with_backend(FileBackend::new(file)?)?;
        ensure_tables(&db)?;
        Ok(())
    })();
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(std::io::Error::other(e.to_string()));
    }
    OpenOptions::new().read(true).open(&tmp)?.sync_all()?;
    let linked = match std::fs::hard_link(&tmp, path) {
        // A file system without hard links: rename, unless someone created it meanwhile.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::Unsupported | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            if path.exists() {
                Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists))
            } else {
                std::fs::rename(&tmp, path)
            }
        }
        other => other,
    };
    // A kill here leaves the store in place and the temporary file beside it: the next
    // writable open removes it (see `remove_abandoned_new_files`).
    crate::failpoint::point("loops::create::after_link");
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        // Another process created it meanwhile: open theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e),
    }
    std::fs::File::open(&dir)?.sync_all()
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Creates the tables a new file lacks; writes nothing to a file that has them all.
fn ensure_tables(db: &Database) -> std::result::Result<(), redb::Error> {
    let present: Vec<String> = {
        let txn = db.begin_read()?;
        txn.list_tables()?.map(|t| t.name().to_owned()).collect()
    };
    if TABLES.iter().all(|w| present.iter().any(|p| p == w)) {
        return Ok(());
    }
    let txn = db.begin_write()?;
    txn.open_table(RUNS)?;
    txn.open_table(JOURNAL)?;
    txn.open_table(STEPS)?;
    txn.open_table(FAILURES)?;
    txn.open_table(STATUS)?;
    txn.open_table(SCHEMAS)?;
    txn.open_table(INBOX)?;
    txn.open_table(PENDING)?;
    txn.open_table(EVENT_KEYS)?;
    txn.commit()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The writer thread.

fn writer_loop(
    db: &RwLock<Db>,
    opener: &Opener,
    path: &Path,
    queue: &Mutex<Queue>,
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
        let results = commit_writes(db, opener, path, batch.iter().map(|r| &r.write).collect());
        for (request, result) in batch.drain(..).zip(results) {
            // The caller may have stopped waiting (its task was dropped); the write stands.
            let _ = request.reply.send(result);
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
    writes: Vec<&Write>,
) -> Vec<Result<Reply>> {
    let n = writes.len();
    let reopened = reopen_if_needed(db, opener, path);
    let (results, storage_failed) = {
        let guard = db.read().unwrap_or_else(PoisonError::into_inner);
        match (&*guard, reopened) {
            (Db::Writable(db), _) => {
                crate::panics::catch(|| commit_batch(db, writes.iter().copied())).unwrap_or_else(
                    |_| {
                        let e = Arc::new(corrupted("a commit"));
                        let results = (0..n)
                            .map(|_| {
                                Err(Error::Storage {
                                    action: format!("committing {n} writes"),
                                    source: e.clone(),
                                })
                            })
                            .collect();
                        (results, true)
                    },
                )
            }
            (Db::Reopening(_), Err(e)) => (
                (0..n)
                    .map(|_| {
                        Err(Error::Storage {
                            action: format!("reopening {} after an I/O error", path.display()),
                            source: e.clone(),
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
fn reopen_if_needed(
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

/// An outcome of applying one write inside the batch's transaction.
enum Applied {
    /// Written; reply with this.
    Wrote(Reply),
    /// Nothing to write; reply with this.
    Unchanged(Reply),
}

enum ApplyError {
    /// The write failed its checks and wrote nothing.
    Rejected(Error),
    /// The transaction failed; the whole batch fails.
    Storage(redb::Error),
}

impl<E: Into<redb::Error>> From<E> for ApplyError {
    fn from(e: E) -> Self {
        ApplyError::Storage(e.into())
    }
}

/// The tables of one write transaction, each opened on its first use: redb does work for
/// every open table at the open and again at the commit (about 7 000 instructions per table),
/// and most writes touch two or three of the nine.
struct Tables<'t> {
    txn: &'t redb::WriteTransaction,
    runs: Lazy<'t, &'static str, &'static [u8]>,
    journal: Lazy<'t, (&'static str, u64), &'static [u8]>,
    steps: Lazy<'t, StepKey, &'static [u8]>,
    failures: Lazy<'t, FailureKey, &'static [u8]>,
    status: Lazy<'t, (u8, &'static str, &'static str), ()>,
    schemas: Lazy<'t, &'static str, &'static str>,
    inbox: Lazy<'t, (&'static str, u64), &'static [u8]>,
    pending: Lazy<'t, (&'static str, &'static str, u64), ()>,
    event_keys: Lazy<'t, (&'static str, &'static str), u64>,
}

/// A table of [`Tables`]: `None` until first used.
type Lazy<'t, K, V> = Option<redb::Table<'t, K, V>>;
type StepKey = (&'static str, u64, &'static str, u32);
type FailureKey = (&'static str, u64, u32, u32);

/// One accessor per table of [`Tables`], named after it, that opens it on first use.
macro_rules! table_accessors {
    ($($name:ident: $def:ident => ($k:ty, $v:ty);)*) => {
        impl<'t> Tables<'t> {
            fn new(txn: &'t redb::WriteTransaction) -> Self {
                Tables { txn, $($name: None),* }
            }

            $(
                fn $name(
                    &mut self,
                ) -> std::result::Result<&mut redb::Table<'t, $k, $v>, redb::TableError> {
                    let table = match self.$name.take() {
                        Some(table) => table,
                        None => self.txn.open_table($def)?,
                    };
                    Ok(self.$name.insert(table))
                }
            )*
        }
    };
}

table_accessors! {
    runs: RUNS => (&'static str, &'static [u8]);
    journal: JOURNAL => ((&'static str, u64), &'static [u8]);
    steps: STEPS => (StepKey, &'static [u8]);
    failures: FAILURES => (FailureKey, &'static [u8]);
    status: STATUS => ((u8, &'static str, &'static str), ());
    schemas: SCHEMAS => (&'static str, &'static str);
    inbox: INBOX => ((&'static str, u64), &'static [u8]);
    pending: PENDING => ((&'static str, &'static str, u64), ());
    event_keys: EVENT_KEYS => ((&'static str, &'static str), u64);
}

fn commit_batch<'a>(
    db: &Database,
    writes: impl ExactSizeIterator<Item = &'a Write>,
) -> (Vec<Result<Reply>>, bool) {
    let n = writes.len();
    let fail_all = |action: String, e: redb::Error| -> (Vec<Result<Reply>>, bool) {
        let shared = Arc::new(e);
        let results = (0..n)
            .map(|_| {
                Err(Error::Storage {
                    action: action.clone(),
                    source: shared.clone(),
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
        let mut t = Tables::new(&txn);
        for write in writes {
            match apply(&mut t, write) {
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

/// Applies one write inside the batch's transaction: reads the run's row and the facts the
/// write needs, asks [`plan`] what the write means, and writes its effects out.
fn apply(t: &mut Tables<'_>, write: &Write) -> std::result::Result<Applied, ApplyError> {
    let needs = write.needs();
    let row = match needs.run {
        Some(run_id) => load_row(t, run_id)?,
        None => None,
    };
    let facts = gather(t, &needs)?;
    let effects = plan(write, row.as_ref(), &facts).map_err(ApplyError::Rejected)?;
    if effects.is_empty() {
        return Ok(Applied::Unchanged(effects.reply));
    }
    store(t, &effects)?;
    Ok(Applied::Wrote(effects.reply))
}

fn load_row(t: &mut Tables<'_>, run_id: &str) -> std::result::Result<Option<RunInfo>, ApplyError> {
    match t.runs()?.get(run_id)? {
        Some(bytes) => RunInfo::decode(run_id, bytes.value())
            .map(Some)
            .map_err(ApplyError::Rejected),
        None => Ok(None),
    }
}

/// Reads the facts of `needs` in the write transaction.
fn gather<'w>(t: &mut Tables<'_>, needs: &Needs<'w>) -> std::result::Result<Facts<'w>, ApplyError> {
    let mut facts = Facts::default();
    let id = needs.run.unwrap_or_default();
    facts.record_taken = match needs.record {
        Some(RecordKey::Journal { seq }) => t.journal()?.get((id, seq))?.is_some(),
        Some(RecordKey::Step {
            seq,
            name,
            occurrence,
        }) => t.steps()?.get((id, seq, name, occurrence))?.is_some(),
        None => false,
    };
    if let Some(hash) = needs.schema {
        facts.schema_stored = t.schemas()?.get(hash.to_string().as_str())?.is_some();
    }
    if let Some((seq, attempt)) = needs.failure_index {
        let last = t
            .failures()?
            .range((id, seq, attempt, 0)..=(id, seq, attempt, u32::MAX))?
            .next_back()
            .transpose()?;
        facts.failure_index = last.map_or(0, |(key, _)| key.value().3 + 1);
    }
    if let Some(seq) = needs.failure_attempt {
        let last = t
            .failures()?
            .range((id, seq, 0, 0)..=(id, seq, u32::MAX, u32::MAX))?
            .next_back()
            .transpose()?;
        facts.failure_attempt = last.map(|(key, _)| key.value().2);
    }
    if let Some(event) = needs.pending {
        let first = t
            .pending()?
            .range((id, event, 0)..=(id, event, u64::MAX))?
            .next()
            .transpose()?
            .map(|(key, _)| key.value().2);
        if let Some(event_seq) = first {
            let record = t.inbox()?.get((id, event_seq))?.map(|b| b.value().to_vec());
            facts.pending = Some(PendingEvent { event_seq, record });
        }
    }
    if let Some(key) = needs.event_key {
        facts.key_seen = t.event_keys()?.get((id, key))?.map(|seq| seq.value());
    }
    if needs.next_event_seq {
        let last = t
            .inbox()?
            .range((id, 0)..=(id, u64::MAX))?
            .next_back()
            .transpose()?;
        facts.next_event_seq = last.map_or(0, |(key, _)| key.value().1 + 1);
    }
    for run_id in needs.runs {
        if let Some(info) = load_row(t, run_id)? {
            facts.runs.push(info);
        }
    }
    Ok(facts)
}

/// Writes `effects` out as table writes.
fn store(t: &mut Tables<'_>, effects: &Effects<'_>) -> std::result::Result<(), ApplyError> {
    let id = effects.run_id;
    for record in &effects.records {
        match record {
            Record::Journal { seq, bytes } => {
                t.journal()?.insert((id, *seq), *bytes)?;
            }
            Record::Step {
                seq,
                name,
                occurrence,
                bytes,
            } => {
                t.steps()?
                    .insert((id, *seq, *name, *occurrence), &**bytes)?;
            }
            Record::Failure {
                seq,
                attempt,
                index,
                bytes,
            } => {
                t.failures()?
                    .insert((id, *seq, *attempt, *index), bytes.as_slice())?;
            }
        }
    }
    for change in &effects.inbox {
        match change {
            InboxChange::Append {
                event_seq,
                name,
                key,
                record,
            } => {
                t.inbox()?.insert((id, *event_seq), record.as_slice())?;
                t.pending()?.insert((id, *name, *event_seq), ())?;
                if let Some(key) = key {
                    t.event_keys()?.insert((id, *key), *event_seq)?;
                }
            }
            InboxChange::Deliver { event_seq, name } => {
                t.pending()?.remove((id, *name, *event_seq))?;
            }
        }
    }
    if let Some((hash, text)) = &effects.schema {
        t.schemas()?.insert(hash.to_string().as_str(), *text)?;
    }
    if let Some(row) = &effects.row {
        store_row(t, row)?;
    }
    for info in &effects.delete {
        delete_run(t, info)?;
    }
    Ok(())
}

/// Writes the run's new row, moving its status index entry if the status changed.
fn store_row(t: &mut Tables<'_>, row: &RowWrite) -> std::result::Result<(), ApplyError> {
    let info = &row.info;
    let id = info.run_id.as_str();
    t.runs()?.insert(id, info.encode().as_slice())?;
    if let Some((from, to)) = row.status_move() {
        let workflow = info.workflow.as_str();
        if let Some(from) = from {
            t.status()?.remove((from.code(), workflow, id))?;
        }
        t.status()?.insert((to.code(), workflow, id), ())?;
    }
    Ok(())
}

/// Deletes the run's row, index entry, records and events.
fn delete_run(t: &mut Tables<'_>, info: &RunInfo) -> std::result::Result<(), ApplyError> {
    let id = info.run_id.as_str();
    t.runs()?.remove(id)?;
    t.status()?
        .remove((info.status.code(), info.workflow.as_str(), id))?;
    t.journal()?
        .retain_in((id, 0)..=(id, u64::MAX), |_, _| false)?;
    t.steps()?
        .retain_in((id, 0, "", 0)..(id, u64::MAX, "", 0), |_, _| false)?;
    t.failures()?.retain_in(
        (id, 0, 0, 0)..=(id, u64::MAX, u32::MAX, u32::MAX),
        |_, _| false,
    )?;
    t.inbox()?
        .retain_in((id, 0)..=(id, u64::MAX), |_, _| false)?;
    let top = name_upper_bound();
    t.pending()?
        .retain_in((id, "", 0)..(id, top.as_str(), 0), |_, _| false)?;
    t.event_keys()?
        .retain_in((id, "")..(id, top.as_str()), |_, _| false)?;
    Ok(())
}

/// A string above every valid event name or idempotency key (at most 256 bytes): 65 times
/// the highest code point, 260 bytes. Bounds range scans over `(run id, name, ..)` keys.
fn name_upper_bound() -> String {
    char::MAX.to_string().repeat(65)
}

/// Why an open failed, with I/O errors kept as such (so that their kind, such as
/// `PermissionDenied`, can be matched) and the short-file case said plainly.
fn open_source(e: redb::DatabaseError) -> crate::BoxError {
    match e {
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            Box::new(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file ends before redb's header does: it is truncated, or not a redb file",
            ))
        }
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) => Box::new(io),
        other => other.into(),
    }
}

/// The error for a redb panic caught while doing `what` on a damaged file.
fn corrupted(what: &str) -> redb::Error {
    redb::Error::Corrupted(format!("redb panicked during {what}: the file is damaged"))
}
