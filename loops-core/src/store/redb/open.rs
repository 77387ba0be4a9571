//! Opening the store: a writable file, memory, a backend of the caller's, or a read-only
//! file; creating a new file so that no crash leaves it half-made, and refusing files that
//! are not stores.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use redb::Database;
use redb::backends::FileBackend;
use tokio::sync::mpsc;

use super::Request;
use super::commit::{QUEUE, writer_loop};
use super::paths::{dangling_link_in, refuse_special_file};
use super::step_keys::StepKeys;
use super::tables::{Contents, ForeignDatabase, NotOpened, STORE_FORMAT, contents, ensure_tables};
use super::{Db, Inner, Leases, Opener, Queue, RedbStore, StoreOptions};
use crate::error::{Error, Result};

impl RedbStore {
    /// Opens the store file at `path`, creating it (mode 0600) and its parent directory
    /// (mode 0700) if they do not exist. A control endpoint's socket next to it
    /// (`PATH.sock`) that nobody answers on, left by a process that was killed while it served
    /// the store, is removed.
    ///
    /// # Errors
    /// - [`Error::StoreLocked`] at once if this or another process has the file open;
    /// - [`Error::Open`] if the file is empty or too short to be a store (under 9 bytes),
    ///   is not a redb file, is corrupt, or cannot be read; or is a redb file of another
    ///   application ([`Error::is_foreign_database`]: no table is added to it, though redb's
    ///   writable open rewrites its header and allocator state, as at every open and close;
    ///   [`open_read_only`](Self::open_read_only) refuses it without writing a byte).
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
            cause: source,
        };
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
            && !dir.exists()
        {
            create_private_dir(dir).map_err(|e| match dangling_link_in(dir) {
                // mkdir says only "File exists".
                Some((link, target)) => open_err(
                    format!(
                        "its directory {} is a symbolic link to {}, which does not exist: \
                         create that directory, or name another path",
                        link.display(),
                        target.display()
                    )
                    .into(),
                ),
                None => open_err(e.into()),
            })?;
        }
        if !path.exists() {
            create_atomically(&path).map_err(|e| open_err(e.into()))?;
        } else if let Some(name) = path.file_name() {
            remove_abandoned_new_files(
                &parent_dir(&path),
                &new_file_prefix(&name.to_string_lossy()),
            );
        }
        // redb would initialize an empty file as a new store: refuse, lest a truncated
        // store silently becomes an empty one. loops never leaves an empty file behind.
        if let Some(why) = too_short(&path) {
            return Err(open_err(why.into()));
        }
        let file_path = path.clone();
        let verified_path = path.clone();
        let store = Self::open_backend(
            path.clone(),
            store_options,
            move || {
                let file = OpenOptions::new().read(true).write(true).open(&file_path)?;
                FileBackend::new(file).map_err(|e| std::io::Error::other(e.to_string()))
            },
            Some(Box::new(move || {
                super::verify::verify_file(&verified_path).is_ok()
            })),
            true,
        )?;
        // Held by this process now: a control socket next to the file is a killed server's.
        super::socket::remove_stale(&path);
        Ok(store)
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
                ..StoreOptions::default()
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

    /// Opens the store file at `path` through a view whose writes stay in memory: if the file
    /// needs redb's repair (its process did not close it cleanly, or its length is not the
    /// one its header records), the repair is made there, and the file keeps its bytes. For
    /// reading a store that needs repair without changing it (the `loops` CLI's reading
    /// commands). A write is answered as [`open_read_only`](Self::open_read_only)'s store
    /// answers it: its refusal, or the answer of a write that changes nothing, and
    /// [`Error::ReadOnly`] for a write that would change the store (it would be lost with
    /// the view). Unlike
    /// [`open_read_only`](Self::open_read_only), it takes no lock on the file: keep writers
    /// away meanwhile. `options.verify_on_open` verifies every page's checksum as redb opens it.
    ///
    /// # Errors
    /// [`Error::Open`] if the file is not a redb file, cannot be read, or cannot be repaired.
    pub fn open_repaired_in_memory(path: impl AsRef<Path>, options: StoreOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        refuse_special_file(&path)?;
        let file = path.clone();
        // Without a writer: its writes would be lost when it is dropped, so it answers them
        // as a read-only store does, never as if they were kept.
        Self::open_backend(
            path,
            StoreOptions {
                commit_on_caller: false,
                ..options
            },
            move || super::verify::overlay(&file),
            None,
            false,
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
        Self::open_backend(label, options, make_backend, None, true)
    }

    /// As [`with_storage`](Self::with_storage). With `options.verify_on_open`,
    /// `verified_clean` (if given) is asked first: `true` if it verified every page of the
    /// file (`verify::verify_file`, on a view in memory, writing nothing). redb's own check
    /// on open is then not needed: it would verify the same pages again, rebuild the
    /// allocator state just checked, and commit it (three more fdatasyncs: most of the open
    /// of a small store). A file a crash left passes when the view's repair (in memory)
    /// verifies; the plain open then makes the same repair on the file, as every open of such
    /// a file does. Otherwise redb's check on open runs as without it, and reports the
    /// damage. (The check runs before redb takes the file's lock: a redb writer could commit
    /// in between, leaving a file written by redb, not altered outside it; a writer still
    /// holding the file makes the open fail as locked either way.) Without `writes`, no
    /// writer is started: every write is answered as a read-only store answers it
    /// ([`answer_read_only`](Self::answer_read_only)).
    fn open_backend<B, F>(
        label: PathBuf,
        options: StoreOptions,
        make_backend: F,
        verified_clean: Option<Box<dyn Fn() -> bool + Send + Sync>>,
        writes: bool,
    ) -> Result<Self>
    where
        B: redb::StorageBackend,
        F: Fn() -> std::io::Result<B> + Send + Sync + 'static,
    {
        let path = label;
        let opener: Opener = Arc::new(move || {
            let backend = make_backend()?;
            let check = options.verify_on_open
                && !verified_clean.as_ref().is_some_and(|verified| verified());
            let mut builder = Database::builder();
            builder.set_check_integrity_on_open(check);
            builder.set_cache_size(options.cache_bytes);
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
            cause: source,
        };
        let db = match opener() {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(Error::StoreLocked { path });
            }
            Err(e) => return Err(open_err(open_source(e))),
        };
        // redb may panic on reading a damaged file, as on opening it.
        let ensured = crate::panics::catch(|| ensure_tables(&db)).unwrap_or_else(|_| {
            Err(NotOpened::Redb(redb::Error::Corrupted(
                "redb panicked while reading the file's tables".to_owned(),
            )))
        });
        match ensured {
            Ok(()) => {}
            Err(NotOpened::Format(found)) => {
                return Err(Error::StoreFormat {
                    path,
                    found,
                    supported: STORE_FORMAT,
                });
            }
            Err(NotOpened::Foreign(tables)) => {
                return Err(open_err(Box::new(ForeignDatabase { tables })));
            }
            Err(NotOpened::Redb(e)) => return Err(open_err(e.into())),
        }
        let db = Arc::new(RwLock::new(Db::Writable(db)));
        let queue = Arc::new(Mutex::new(Queue::default()));
        let leases = Arc::new(Leases::default());
        let step_keys = Arc::new(StepKeys::default());
        let (tx, writer) = match writes {
            true => {
                let parts = (&db, &opener, &path, &queue, &leases, &step_keys);
                let (tx, writer) = spawn_writer(parts).map_err(|e| open_err(e.into()))?;
                (Some(tx), Some(writer))
            }
            false => (None, None),
        };
        Ok(RedbStore::from_inner(Inner {
            db,
            path,
            opener: Some(opener),
            queue,
            commit_on_caller: options.commit_on_caller,
            tx,
            writer: Mutex::new(writer),
            leases,
            step_keys,
        }))
    }

    /// Opens the store file at `path` for reading only: for inspection (the `loops` CLI)
    /// while no process drives it. A write ([`Store::write`](crate::Store::write)) gets the
    /// answer a writable store would give if that answer writes nothing: the write's
    /// refusal ([`Error::RunEnded`] for a cancellation of an ended run, say), or the answer
    /// of a write that changes nothing (an event sent again with its idempotency key); a
    /// write that would change the store returns [`Error::ReadOnly`]. So a caller can learn
    /// that a write is refused without opening the file for writing, which rewrites part of
    /// it (redb records its allocator's state when a writable file closes).
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
    /// - [`Error::Open`] if it does not exist, is empty or too short to be a store (under 9
    ///   bytes), is not a redb file, cannot be read, or fails
    ///   the verification (its source is then a [`redb::DatabaseError::Storage`]).
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_read_only_with(path, StoreOptions::default())
    }

    /// As [`open_read_only`](Self::open_read_only), verifying the file only if
    /// `options.verify_on_open` is set, with a cache of `options.cache_bytes`
    /// (`commit_on_caller` does not apply).
    ///
    /// # Errors
    /// As [`open_read_only`](Self::open_read_only).
    pub fn open_read_only_with(path: impl AsRef<Path>, options: StoreOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        refuse_special_file(&path)?;
        if let Some(why) = too_short(&path) {
            return Err(Error::Open {
                path,
                cause: why.into(),
            });
        }
        let opened = crate::panics::catch(|| {
            redb::Builder::new()
                .set_cache_size(options.cache_bytes)
                .open_read_only(&path)
        })
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
                    cause: open_source(e),
                });
            }
        };
        // Verified while the read-only handle holds the file, so that no writer changes it
        // between the check and the reads; before the format is read, so that a damaged
        // file is said to be damaged, not of another format.
        if options.verify_on_open
            && let Err(e) = super::verify::verify_file(&path)
        {
            return Err(damaged(path, e));
        }
        // A file of another format (one made before the format was recorded has format 1)
        // is refused before its tables are read.
        // redb may panic on reading a damaged file, as on opening it.
        let format = crate::panics::catch(|| {
            redb::ReadableDatabase::begin_read(&db)
                .map_err(redb::Error::from)
                .and_then(|txn| contents(&txn))
        })
        .unwrap_or_else(|_| {
            Err(redb::Error::Corrupted(
                "redb panicked while reading the file's format".to_owned(),
            ))
        });
        match format {
            Ok(Contents::Empty | Contents::Format(STORE_FORMAT)) => {}
            Ok(Contents::Format(found)) => {
                return Err(Error::StoreFormat {
                    path,
                    found,
                    supported: STORE_FORMAT,
                });
            }
            Ok(Contents::Foreign(tables)) => {
                return Err(Error::Open {
                    path,
                    cause: Box::new(ForeignDatabase { tables }),
                });
            }
            Err(e) => {
                return Err(Error::Open {
                    path,
                    cause: Box::new(e),
                });
            }
        }
        Ok(RedbStore::from_inner(Inner {
            db: Arc::new(RwLock::new(Db::ReadOnly(db))),
            path,
            opener: None,
            queue: Arc::new(Mutex::new(Queue::default())),
            commit_on_caller: false,
            tx: None,
            writer: Mutex::new(None),
            leases: Arc::new(Leases::default()),
            step_keys: Arc::new(StepKeys::default()),
        }))
    }
}

/// Bytes of redb's magic number, which every redb file, so every loops store, starts with.
const MAGIC_BYTES: u64 = 9;

/// Why the regular file at `path` cannot be a loops store by its length alone: it is empty,
/// or shorter than redb's magic number (redb would say only that the number does not match).
/// `None` for a longer file, or one whose metadata cannot be read (the open says why).
fn too_short(path: &Path) -> Option<String> {
    let len = std::fs::metadata(path)
        .ok()
        .filter(std::fs::Metadata::is_file)?
        .len();
    match len {
        0 => Some(
            "the file is empty (0 bytes), not a loops store; delete it to start a new store"
                .to_owned(),
        ),
        1..MAGIC_BYTES => Some(format!(
            "the file is too short to be a loops store ({len} bytes; every store starts with \
             redb's {MAGIC_BYTES}-byte magic number): it was cut short (a backup restores it), or is not a store"
        )),
        _ => None,
    }
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
        ensure_tables(&db).map_err(|e| match e {
            NotOpened::Redb(e) => e,
            // A file it just made records the format of this build.
            NotOpened::Format(found) => {
                redb::Error::Corrupted(format!("a new store file records format {found}"))
            }
            NotOpened::Foreign(_) => {
                redb::Error::Corrupted("a new store file has tables of another application".into())
            }
        })?;
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

/// The refusal of the file at `path`, which failed the verification of its pages with `e`:
/// said alike by the read-only open and the upgrade, which verify the file themselves.
pub(super) fn damaged(path: PathBuf, e: redb::Error) -> Error {
    Error::Open {
        path,
        cause: Box::new(redb::DatabaseError::Storage(match e {
            redb::Error::Io(io) => redb::StorageError::Io(io),
            redb::Error::Corrupted(what) => redb::StorageError::Corrupted(format!(
                "verifying the checksum of every page failed: {what}"
            )),
            other => redb::StorageError::Corrupted(format!(
                "verifying the checksum of every page failed: {other}"
            )),
        })),
    }
}

/// Why an open failed, with I/O errors kept as such (so that their kind, such as
/// `PermissionDenied`, can be matched) and the short-file case said plainly.
pub(super) fn open_source(e: redb::DatabaseError) -> crate::BoxError {
    match e {
        // Every loops store is of redb's current file format: a header that names an older
        // one was altered (a flipped bit), or the file is not a loops store.
        redb::DatabaseError::UpgradeRequired(version) => Box::new(redb::DatabaseError::Storage(
            redb::StorageError::Corrupted(format!(
                "redb's header names file format version {version}, which no loops store has: the file is damaged, or not a loops store"
            )),
        )),
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            Box::new(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file ends before redb's header does: it is truncated, or not a redb file",
            ))
        }
        // redb's "Not a redb database: magic number mismatch".
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::InvalidData
                && io.to_string().contains("magic number") =>
        {
            Box::new(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the file does not start with redb's magic number: it is not a loops store \
                 (another kind of file), or its first bytes were overwritten (a backup restores it)",
            ))
        }
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) => Box::new(io),
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(what)) => Box::new(
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(length_said(what))),
        ),
        other => other.into(),
    }
}

/// redb's refusal of a file whose length is not one its layout can have, said with what
/// happened and how a copy may be recovered; other damage as redb says it.
fn length_said(what: String) -> String {
    const PAGE: u64 = 4096;
    let Some(len) = what
        .strip_prefix("File length does not correspond to a valid region layout: file_len=")
        .and_then(|n| n.trim().parse::<u64>().ok())
    else {
        return what;
    };
    let whole = len / PAGE * PAGE;
    if whole == len || whole == 0 {
        return format!(
            "the file's length ({len} bytes) is not one redb lays out: it was cut short, or \
             bytes were added to it"
        );
    }
    format!(
        "the file's length ({len} bytes) is not one redb lays out, nor a whole number of its \
         {PAGE}-byte pages: bytes were added to its end, or it was cut short. A copy cut to \
         {whole} bytes may open (`cp FILE COPY && truncate -s {whole} COPY`, then `loops \
         --store COPY check`); the file itself is left as it is"
    )
}

/// What the writer thread shares with the store: its database, opener, path, queue, leases
/// and step keys.
type WriterParts<'a> = (
    &'a Arc<RwLock<Db>>,
    &'a Opener,
    &'a PathBuf,
    &'a Arc<Mutex<Queue>>,
    &'a Arc<Leases>,
    &'a Arc<StepKeys>,
);

/// Starts the writer thread ([`writer_loop`]) on `parts`; returns the sender of its requests
/// and its handle.
///
/// # Errors
/// If the thread cannot be spawned.
fn spawn_writer(
    (db, opener, path, queue, leases, step_keys): WriterParts<'_>,
) -> std::io::Result<(mpsc::Sender<Request>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let (db, opener, path) = (Arc::clone(db), Arc::clone(opener), path.clone());
    let (queue, leases, step_keys) = (Arc::clone(queue), Arc::clone(leases), Arc::clone(step_keys));
    let writer = std::thread::Builder::new()
        .name("loops-writer".into())
        .spawn(move || writer_loop(&db, &opener, &path, &queue, &leases, &step_keys, rx))?;
    Ok((tx, writer))
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::store::RedbStore;

    /// A file too short to hold redb's magic number is said to be so, with its length, by
    /// the writable and the read-only open, and a longer one without it not to be a store;
    /// the file is left as it is.
    #[test]
    fn a_file_shorter_than_the_magic_number_is_said_too_short() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.redb");
        for (bytes, why) in [
            (
                &b""[..],
                "the file is empty (0 bytes), not a loops store; delete it to start a new store"
                    .to_owned(),
            ),
            (
                b"abc",
                "the file is too short to be a loops store (3 bytes; every store starts with \
                 redb's 9-byte magic number): it was cut short (a backup restores it), or is not a store"
                    .to_owned(),
            ),
            (
                b"redb\x1a\x0a\xa9\x0d",
                "the file is too short to be a loops store (8 bytes; every store starts with \
                 redb's 9-byte magic number): it was cut short (a backup restores it), or is not a store"
                    .to_owned(),
            ),
            (
                b"[package]\nname = \"not-a-store\"\n",
                "the file does not start with redb's magic number: it is not a loops store \
                 (another kind of file), or its first bytes were overwritten (a backup restores it)"
                    .to_owned(),
            ),
        ] {
            std::fs::write(&path, bytes).unwrap();
            for read_only in [false, true] {
                let refused = if read_only {
                    RedbStore::open_read_only(&path)
                } else {
                    RedbStore::open(&path)
                }
                .map(drop)
                .unwrap_err();
                assert!(matches!(refused, Error::Open { .. }), "{refused:?}");
                assert_eq!(
                    refused.to_string(),
                    format!("cannot open store {}: {why}", path.display()),
                    "read-only: {read_only}"
                );
                assert!(!refused.is_store_damage(), "{refused:?}");
                assert_eq!(std::fs::read(&path).unwrap(), bytes);
            }
        }
    }
}
