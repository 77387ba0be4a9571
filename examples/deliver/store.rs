//! The store file, as the command line meets it: opened while a killed process's lock lingers,
//! its errors said for a `deliver` user, and deleted by `--fresh` only if it is one.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::project::Paths;

/// `--fresh`: deletes the store and the work directory, holding the store's lock meanwhile,
/// so that a `deliver` started now is refused until the work directory is gone, and then
/// starts in a new one. (Not quite with a `--store` outside the work directory: that store
/// goes first, and a `deliver` started in the instant before the work directory goes would
/// find it gone under it.)
///
/// A store that cannot be opened for another reason than its lock (a damaged file) is not
/// open in any process: it is deleted all the same, as `--fresh` asks. The caller has made
/// the refusals that need no lock first ([`check_for_fresh`]), before anything was written.
pub async fn delete_for_fresh(paths: &Paths) -> Result<()> {
    let held = if paths.store.exists() {
        match open_store(|| loops::RedbStore::open(&paths.store)).await {
            Ok(store) => Some(store),
            Err(e @ loops::Error::StoreLocked { .. }) => {
                return Err(store_error(e).context("--fresh"));
            }
            // The probe above did not say (it found the file locked, or needing repair).
            Err(e) if e.is_foreign_database() => return Err(not_deleted(e)),
            // Its cause only: the library's advice for a damaged file (a check, a backup)
            // is not for a file about to be deleted.
            Err(loops::Error::Open { path, cause }) => {
                say!(
                    "--fresh: cannot open store {}: {}; deleting it all the same",
                    path.display(),
                    loops::error_chain(&*cause).join(": ")
                );
                None
            }
            Err(e) => {
                say!(
                    "--fresh: {:#}; deleting it all the same",
                    anyhow::Error::new(e)
                );
                None
            }
        }
    } else {
        None
    };
    // Elsewhere than on Unix, a directory that holds an open file cannot be renamed, nor an
    // open file deleted: there the lock is let go first.
    let held = held.filter(|_| cfg!(unix));
    paths.delete()?;
    drop(held);
    Ok(())
}

/// The refusals of `--fresh` that need no lock, made before anything is written or deleted
/// (an approval wish included): the store of another work directory; a work directory whose
/// runs another store records ([`Paths::check_fresh`]); a `--store` that is no store, or
/// another application's redb database.
///
/// # Errors
/// If one of them refuses.
pub fn check_for_fresh(paths: &Paths) -> Result<()> {
    // Another work directory's store holds its runs: not this one's to delete (nor opened).
    if let Some(home) = paths.store_elsewhere() {
        anyhow::bail!(
            "--fresh: --store {} is the store of another work directory, {}, whose runs it \
             holds; --fresh deletes this work directory's store only (nothing was deleted)",
            paths.store.display(),
            home.display()
        );
    }
    paths.check_fresh()?;
    check_is_a_store(&paths.store)?;
    // Another application's redb database starts as a store does: it is refused, and a
    // read-only open says so without writing to it (a writable one rewrites redb's header).
    if paths.store.exists()
        && let Err(e) = loops::RedbStore::open_read_only(&paths.store)
        && e.is_foreign_database()
    {
        return Err(not_deleted(e));
    }
    Ok(())
}

/// `--fresh`'s refusal of the store it cannot open for `e` (not a store of this example).
fn not_deleted(e: loops::Error) -> anyhow::Error {
    anyhow::anyhow!("--fresh: {e}; nothing was deleted (move it away, or name another --store)")
}

/// The first bytes of every redb file, so of every loops store (redb's file format:
/// `MAGICNUMBER` in its `tree_store/page_store/header.rs`).
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// Checks, for `--fresh`, that `store` is missing or a file that starts as a redb file does:
/// `--fresh` deletes a store, damaged or not, but never a file of the user's named with
/// `--store` by mistake, nor a directory. Nothing has been deleted yet when it refuses.
///
/// # Errors
/// If `store` exists and is not a regular file starting with redb's magic number, or cannot
/// be read; if it ends with `/` (a directory's name, whatever is there).
fn check_is_a_store(store: &Path) -> Result<()> {
    let refuse = |what: &str| {
        anyhow::anyhow!(
            "--fresh: --store {} {what}, not a loops store; nothing was deleted (move it away, \
             or name another --store)",
            store.display()
        )
    };
    if store.as_os_str().as_encoded_bytes().ends_with(b"/") {
        anyhow::bail!(
            "--fresh: --store {} ends with `/`, which names a directory; a store is a file: \
             name it without the `/` (nothing was deleted)",
            store.display()
        );
    }
    // A link is not deleted in the store's stead (nor a new store made in its place).
    if std::fs::symlink_metadata(store).is_ok_and(|m| m.file_type().is_symlink()) {
        anyhow::bail!(
            "--fresh: --store {} is a symbolic link; --fresh deletes a store file itself: name \
             the file it points to (nothing was deleted)",
            store.display()
        );
    }
    let metadata = match std::fs::metadata(store) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(e).with_context(|| format!("--fresh: cannot read {}", store.display()));
        }
    };
    if metadata.is_dir() {
        return Err(refuse("is a directory"));
    }
    if !metadata.is_file() {
        return Err(refuse("is not a regular file"));
    }
    let mut head = [0; REDB_MAGIC.len()];
    let read = std::fs::File::open(store).and_then(|mut f| {
        use std::io::Read as _;
        let mut filled = 0;
        while filled < head.len() {
            match f.read(&mut head[filled..])? {
                0 => break,
                n => filled += n,
            }
        }
        Ok(filled)
    });
    match read {
        Ok(n) if n == REDB_MAGIC.len() && head == REDB_MAGIC => Ok(()),
        Ok(_) => Err(refuse("does not start with redb's header")),
        Err(e) => Err(e).with_context(|| format!("--fresh: cannot read {}", store.display())),
    }
}

/// The store is open in another process (still, after [`open_store`]'s wait): told apart
/// from other refusals (`anyhow::Error::is`) by `--approve`, which then looks for that
/// process's control endpoint again.
#[derive(Debug)]
pub struct Locked(loops::Error);

impl std::fmt::Display for Locked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: is another `deliver` running?", self.0)
    }
}

impl std::error::Error for Locked {}

/// The error for a store that `open_store` could not open.
pub fn store_error(e: loops::Error) -> anyhow::Error {
    match e {
        loops::Error::StoreLocked { .. } => anyhow::Error::new(Locked(e)),
        // It says "cannot open store <path>" itself.
        // It says that the file is damaged, and how to check and restore it.
        loops::Error::Open { .. } if e.is_store_damage() => anyhow::anyhow!(
            "{e}; only as a last resort, --fresh starts over and discards the run recorded in \
             it (it deletes the file)"
        ),
        e @ loops::Error::Open { .. } => anyhow::Error::new(e),
        // Its own text names the library's setting: say this program's option instead.
        loops::Error::Encrypted { store, keys } => anyhow::anyhow!(
            "store {store} holds payloads encrypted with key {}: give this program the key file with --key-file PATH",
            keys.join(", ")
        ),
        // They say "store <path>: ..." themselves.
        e @ (loops::Error::KeyMismatch { .. } | loops::Error::KeyNotInStore { .. }) => {
            anyhow::Error::new(e)
        }
        e => anyhow::Error::new(e).context("cannot open the store"),
    }
}

/// The store file `store` opened read-only (not one byte of it changes), trying again while
/// it is locked as [`open_store`] does: a file its process did not close (a crash) is read
/// through redb's repair made in memory.
///
/// # Errors
/// As [`store_error`] says them: still locked after the wait, damaged, not a store.
pub async fn open_read_only(store: &Path) -> Result<loops::RedbStore> {
    open_reading(store).await.map_err(store_error)
}

/// The store file `store` opened read-only, waiting while it is locked, through redb's
/// repair made in memory if its process did not close it: [`open_read_only`] and
/// [`open_for_checks`], each saying its errors in its own way.
async fn open_reading(store: &Path) -> loops::Result<loops::RedbStore> {
    match open_store(|| loops::RedbStore::open_read_only(store)).await {
        Err(loops::Error::NeedsRecovery { .. }) => {
            loops::RedbStore::open_repaired_in_memory(store, loops::StoreOptions::default())
        }
        opened => opened,
    }
}

/// The store file `store` opened read-only for the checks of a start, before it is opened
/// for writing, so that a refused start leaves the file's bytes as they were (redb rewrites
/// part of a file when a writable handle closes). Waits while it is locked, as
/// [`open_store`] does; a file its process did not close is read through redb's repair
/// made in memory. `None` for a file that does not open read-only for another reason (a
/// damaged one, say): the writable open then refuses it in its own words.
///
/// # Errors
/// [`loops::Error::StoreLocked`] if it is still locked after the wait.
pub async fn open_for_checks(store: &Path) -> loops::Result<Option<loops::RedbStore>> {
    match open_reading(store).await {
        Ok(read) => Ok(Some(read)),
        Err(e @ loops::Error::StoreLocked { .. }) => Err(e),
        Err(_) => Ok(None),
    }
}

/// How long a store found locked is tried again, and how long apart.
const STORE_LOCK_WAIT: Duration = Duration::from_secs(2);
const STORE_LOCK_PAUSE: Duration = Duration::from_millis(50);

/// Opens the store with `open`, trying again for up to [`STORE_LOCK_WAIT`] while it is locked.
///
/// A process killed with SIGKILL gives its lock back at once, yet about one open in a
/// thousand right after `kill -9` found the store still locked: most likely a child (git,
/// rustc) that the killed process had just forked, holding a copy of the store's file
/// descriptor (and so its lock) until it executes its program, which closes it. That lasts
/// a moment; a store still locked after 2 s is open in a live process.
pub async fn open_store<T>(mut open: impl FnMut() -> loops::Result<T>) -> loops::Result<T> {
    let deadline = tokio::time::Instant::now() + STORE_LOCK_WAIT;
    loop {
        match open() {
            Err(loops::Error::StoreLocked { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(STORE_LOCK_PAUSE).await;
            }
            result => return result,
        }
    }
}
