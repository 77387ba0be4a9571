//! Opening the store file: read-only for inspection, writable for commands that change it,
//! with one clear line for each way it can fail.
//!
//! The runtime opens redb in its default mode, in which the process that has the file open
//! holds an exclusive lock on it: while it runs, no other process can read the file, not even
//! read-only. A file whose process crashed (kill -9, power loss) must be repaired by a
//! writable open before a read-only open accepts it; read-only commands make that repair
//! once, say so on stderr, and go on read-only.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use loops_core::{Error, RedbStore, Runtime, StoreOptions};

use crate::failure::{Failure, Result};
use crate::output::note;

/// The store path from `--store` or `LOOPS_STORE`, or a usage failure saying how to give it.
pub fn store_path(given: Option<PathBuf>) -> Result<PathBuf> {
    match given {
        Some(path) if !path.as_os_str().is_empty() => Ok(path),
        _ => Err(Failure::usage(
            "no store file given: pass --store PATH or set LOOPS_STORE=PATH (the file the workflow's process opens with Runtime::open)",
        )),
    }
}

/// Whether read-only commands verify the file's checksums before they read it (`--no-verify`
/// turns it off).
static VERIFY: OnceLock<bool> = OnceLock::new();

/// Sets whether [`read_only`] verifies the file (by default it does).
pub fn set_verify(verify: bool) {
    let _ = VERIFY.set(verify);
}

/// Opens the store for reading only, repairing it first (with a writable open) if its process
/// did not close it cleanly. Unless `--no-verify` was given, the checksum of every page is
/// verified first (nothing is written to the file), so that damage is refused rather than
/// shown as data.
pub fn read_only(path: &Path) -> Result<RedbStore> {
    check_file(path)?;
    let options = StoreOptions {
        verify_on_open: VERIFY.get().copied().unwrap_or(true),
        ..StoreOptions::default()
    };
    let store = match RedbStore::open_read_only_with(path, options) {
        Ok(store) => store,
        Err(Error::NeedsRecovery { .. }) => {
            repair(path)?;
            note(&format!(
                "store {} was not closed cleanly (its process stopped without closing it); opened it for writing once to let redb repair it",
                path.display()
            ));
            RedbStore::open_read_only_with(path, options).map_err(|e| read_failure(path, e))?
        }
        Err(e) => return Err(read_failure(path, e)),
    };
    is_loops_store(path, &store)?;
    Ok(store)
}

/// The failure of a read-only open: damage that redb found (a checksum that does not match)
/// is said to be damage, pointing to `loops check`; other errors as [`open_failure`] says.
fn read_failure(path: &Path, e: Error) -> Failure {
    match e {
        Error::Open { source, .. } if is_corrupted(&*source) => Failure {
            damage: true,
            ..Failure::new(match source.downcast_ref::<redb::DatabaseError>() {
                // Without redb's "DB corrupted: ": the message says that it looks damaged.
                Some(redb::DatabaseError::Storage(redb::StorageError::Corrupted(what))) => {
                    what.clone()
                }
                _ => source.to_string(),
            })
        },
        other => open_failure(path, other),
    }
}

/// Opens the store for writing (cancel, retry, send, prune, compact, check). The file must
/// exist and be a loops store: this never creates one. Returns the runtime and whether redb
/// repaired the file on this open (its process had not closed it cleanly).
pub fn writable(path: &Path) -> Result<(Runtime, bool)> {
    check_file(path)?;
    // A read-only open first: it refuses a file that is not a redb file, or is locked,
    // without writing a byte to it. It does not verify the file: the writable open below
    // does (Runtime::open verifies every page by default).
    let probe = StoreOptions {
        verify_on_open: false,
        ..StoreOptions::default()
    };
    let repaired = match RedbStore::open_read_only_with(path, probe) {
        Ok(store) => {
            is_loops_store(path, &store)?;
            false
        }
        Err(Error::NeedsRecovery { .. }) => true,
        Err(e) => return Err(open_failure(path, e)),
    };
    let runtime = Runtime::open(path).map_err(|e| open_failure(path, e))?;
    if repaired {
        is_loops_store(path, &redb(path, &runtime)?)?;
        note(&format!(
            "store {} was not closed cleanly (its process stopped without closing it); redb repaired it on this open",
            path.display()
        ));
    }
    Ok((runtime, repaired))
}

fn repair(path: &Path) -> Result<()> {
    let store = RedbStore::open(path).map_err(|e| match &e {
        Error::Open { source, .. }
            if source
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied) =>
        {
            Failure::new(format!(
                "store {} was not closed cleanly and needs the repair that a writable open makes, but this user cannot write it: run this command as the store's owner",
                path.display()
            ))
        }
        _ => open_failure(path, e),
    })?;
    drop(store);
    Ok(())
}

fn check_file(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(Failure::new(format!(
            "store {} is a directory, not a store file",
            path.display()
        ))),
        Ok(meta) if meta.len() == 0 => Err(Failure::new(format!(
            "store {} is an empty file, not a loops store",
            path.display()
        ))),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Failure::new(format!(
            "store {} does not exist",
            path.display()
        ))),
        Err(e) => Err(Failure::new(format!(
            "cannot read store {}: {e}",
            path.display()
        ))),
    }
}

/// A redb file that is not a loops store lacks loops' tables; say so instead of failing on
/// the first read.
fn is_loops_store(path: &Path, store: &RedbStore) -> Result<()> {
    store.schemas().map(drop).map_err(|e| {
        Failure::new(format!(
            "store {} is not a loops store, or is damaged: {}",
            path.display(),
            e.chain()
        ))
    })
}

/// The one-line failure for an error of opening the store at `path`.
pub fn open_failure(path: &Path, e: Error) -> Failure {
    match e {
        Error::StoreLocked { .. } => Failure::new(format!(
            "store {} is in use by a running process (redb allows no reader beside it); stop the process or wait for it to exit, then run this command again",
            path.display()
        )),
        // The same words as for a panic of redb on a damaged file (see panics.rs).
        Error::Open { source, .. } if is_corrupted(&*source) => Failure::new(format!(
            "store {} is damaged: redb cannot open it ({source}); restore it from a backup",
            path.display()
        )),
        Error::Open { source, .. } => {
            Failure::new(format!("cannot open store {}: {source}", path.display()))
        }
        other => Failure::from(other),
    }
}

/// Whether opening failed because redb found the file's contents damaged (a checksum that
/// does not match, a layout the file does not have), rather than not a redb file at all.
fn is_corrupted(source: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        source.downcast_ref::<redb::DatabaseError>(),
        Some(redb::DatabaseError::Storage(redb::StorageError::Corrupted(
            _
        )))
    )
}

/// The redb store under a runtime this tool opened (always a redb file).
pub fn redb(path: &Path, runtime: &Runtime) -> Result<RedbStore> {
    runtime
        .redb()
        .cloned()
        .ok_or_else(|| Failure::new(format!("store {} is not a redb file", path.display())))
}
