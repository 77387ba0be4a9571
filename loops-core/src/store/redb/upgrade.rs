//! Converting a store file of format 1 (records in `journal`, `steps` and `failures`, keyed
//! by run) to format 2 (one append-only log): [`RedbStore::upgrade`].

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::RedbStore;
use super::log::{self, Head, Kind, LOG};
use super::open::refuse_special_file;
use super::tables::{RUNS, STORE_FORMAT, file_format, record_format};
use crate::error::{Error, Result};

/// Format 1's transition records: (run id, seq) → record.
const JOURNAL: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("journal");
/// Format 1's step records: (run id, seq, step name, occurrence) → record.
const STEPS: TableDefinition<(&str, u64, &str, u32), &[u8]> = TableDefinition::new("steps");
/// Format 1's failure records: (run id, seq, attempt, index) → record.
const FAILURES: TableDefinition<(&str, u64, u32, u32), &[u8]> = TableDefinition::new("failures");

/// The format [`RedbStore::upgrade`] converts from.
const FROM: u64 = 1;

/// What [`RedbStore::upgrade`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Upgraded {
    /// The file has this build's format ([`STORE_FORMAT`]) already: nothing was done.
    Current {
        /// The file's format.
        format: u64,
    },
    /// The file was converted.
    Converted {
        /// The format it had.
        from: u64,
        /// The format it has now ([`STORE_FORMAT`]).
        to: u64,
        /// The copy of the file as it was, made before the conversion.
        backup: PathBuf,
        /// Its runs.
        runs: u64,
        /// The records moved to the log.
        records: u64,
    },
}

/// The name of the backup [`RedbStore::upgrade`] makes of `path`: `<path>.format-1.bak`,
/// followed by `.N` for the `n`-th (from 1) when the names before it are taken.
pub(crate) fn backup_path(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".format-{FROM}.bak"));
    if n > 0 {
        name.push(format!(".{n}"));
    }
    PathBuf::from(name)
}

/// How many backup names [`back_up`] tries before it gives up.
const BACKUP_NAMES: u32 = 100;

impl RedbStore {
    /// Converts the store file at `path` from format 1 to this build's format
    /// ([`STORE_FORMAT`]): copies it to `<path>.format-1.bak` first (or, if that name is
    /// taken, as by the backup of an upgrade that was interrupted, `<path>.format-1.bak.1`,
    /// `.2`, ...: a backup is never overwritten), then moves every
    /// transition, step and failure record to the log in one write transaction, so that a
    /// crash leaves the file of format 1 as it was. `loops upgrade PATH` calls it.
    ///
    /// The file must not be open elsewhere: it is refused if it is, and held (shared, then
    /// exclusively) while it is copied and converted; another process that opens it between
    /// the copy and the conversion would make the backup older than what is converted.
    ///
    /// # Errors
    /// - [`Error::StoreLocked`] if the file is open in this or another process;
    /// - [`Error::StoreFormat`] if it has a format this build neither reads nor converts;
    /// - [`Error::Open`] if it does not exist, is not a loops store, or cannot be copied
    ///   (nothing is done then);
    /// - [`Error::Storage`] if redb fails, or if the file is damaged (nothing is converted).
    pub fn upgrade(path: impl AsRef<Path>) -> Result<Upgraded> {
        let path = path.as_ref().to_path_buf();
        refuse_special_file(&path)?;
        let open_err = |cause: crate::BoxError| Error::Open {
            path: path.clone(),
            cause,
        };
        // Held shared while the file's format is read and it is copied: no writer meanwhile.
        let held = match redb::Builder::new().open_read_only(&path) {
            Err(redb::DatabaseError::RepairAborted) => {
                // Not closed cleanly: redb repairs it at a writable open, then reads it.
                drop(open_writable(&path)?);
                redb::Builder::new().open_read_only(&path)
            }
            other => other,
        };
        let held = held.map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => Error::StoreLocked { path: path.clone() },
            e => open_err(e.into()),
        })?;
        let format = {
            let txn = held
                .begin_read()
                .map_err(|e| Error::storage("reading the store's format", e))?;
            file_format(&txn).map_err(|e| Error::storage("reading the store's format", e))?
        };
        match format {
            Some(STORE_FORMAT) => {
                return Ok(Upgraded::Current {
                    format: STORE_FORMAT,
                });
            }
            Some(FROM) => {}
            Some(found) => {
                return Err(Error::StoreFormat {
                    path,
                    found,
                    supported: STORE_FORMAT,
                });
            }
            None => return Err(open_err("not a loops store (it has no runs table)".into())),
        }
        let backup = back_up(&path)
            .map_err(|e| open_err(format!("copying it to a backup beside it: {e}").into()))?;
        drop(held);
        let db = open_writable(&path)?;
        let txn = db
            .begin_write()
            .map_err(|e| Error::storage("beginning the upgrade", e))?;
        let (runs, records) = convert(&txn)?;
        crate::failpoint::point("loops::upgrade::before_commit");
        txn.commit()
            .map_err(|e| Error::storage("committing the upgrade", e))?;
        Ok(Upgraded::Converted {
            from: FROM,
            to: STORE_FORMAT,
            backup,
            runs,
            records,
        })
    }
}

/// The file opened for writing with redb alone (loops' open refuses format 1).
fn open_writable(path: &Path) -> Result<Database> {
    Database::open(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => Error::StoreLocked {
            path: path.to_path_buf(),
        },
        e => Error::Open {
            path: path.to_path_buf(),
            cause: e.into(),
        },
    })
}

/// Copies `from` to a backup beside it under the first of its [backup names](backup_path)
/// that is free, and returns that name. The copy is written and synced under a temporary
/// name, then linked to the backup's name (which fails if the name exists): a crash never
/// leaves a partial copy under a backup's name, and no backup is overwritten.
fn back_up(from: &Path) -> std::io::Result<PathBuf> {
    let mut tmp = backup_path(from, 0).into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut source = std::fs::File::open(from)?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let copied = options.open(&tmp).and_then(|mut target| {
        std::io::copy(&mut source, &mut target)?;
        target.sync_all()
    });
    let linked = copied.and_then(|()| {
        for n in 0..BACKUP_NAMES {
            let name = backup_path(from, n);
            match std::fs::hard_link(&tmp, &name) {
                Ok(()) => return Ok(name),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other(format!(
            "{} and the {} names after it are taken: move earlier backups away",
            backup_path(from, 0).display(),
            BACKUP_NAMES - 1
        )))
    });
    let _ = std::fs::remove_file(&tmp);
    let name = linked?;
    // The link's directory entry, durable before the conversion begins.
    if let Some(dir) = from.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(name)
}

/// One record of format 1, in the order the log gets them: by seq, the transition, then
/// the steps by (name, occurrence), then the failures by (attempt, index).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Old {
    Transition,
    Step(String, u32),
    Failure(u32, u32),
}

/// Moves every record of format 1 to the log, sets each run's head, deletes format 1's
/// tables and records format 2, in `txn`. Returns the runs and the records converted.
///
/// # Errors
/// [`Error::Storage`] if redb fails or a key of format 1 names a run without a row.
pub(super) fn convert(txn: &redb::WriteTransaction) -> Result<(u64, u64)> {
    let storage = |e: redb::Error| Error::storage("converting the store to format 2", e);
    let ids: Vec<String> = {
        let runs = txn.open_table(RUNS).map_err(|e| storage(e.into()))?;
        let mut ids = Vec::new();
        for entry in runs.iter().map_err(|e| storage(e.into()))? {
            let (key, _) = entry.map_err(|e| storage(e.into()))?;
            ids.push(key.value().to_owned());
        }
        ids
    };
    let mut next = 1u64;
    let mut records = 0u64;
    let mut log_table = txn.open_table(LOG).map_err(|e| storage(e.into()))?;
    let mut runs = txn.open_table(RUNS).map_err(|e| storage(e.into()))?;
    for id in &ids {
        let mut old = old_records(txn, id).map_err(storage)?;
        old.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let mut head = Head::default();
        for (seq, which, bytes) in &old {
            let kind = match which {
                Old::Transition => Kind::Transition,
                Old::Step(name, occurrence) => Kind::Step {
                    name,
                    occurrence: *occurrence,
                },
                Old::Failure(attempt, index) => Kind::Failure {
                    attempt: *attempt,
                    index: *index,
                },
            };
            log::append(&mut log_table, next, &mut head, id, *seq, kind, bytes).map_err(storage)?;
            next += 1;
        }
        records += old.len() as u64;
        let row = runs
            .get(id.as_str())
            .map_err(|e| storage(e.into()))?
            .map(|row| row.value().to_vec())
            .unwrap_or_default();
        runs.insert(id.as_str(), head.row(&row).as_slice())
            .map_err(|e| storage(e.into()))?;
    }
    drop((log_table, runs));
    let orphans = old_records_left(txn, &ids).map_err(storage)?;
    if let Some(run) = orphans {
        return Err(storage(redb::Error::Corrupted(format!(
            "format 1's tables hold records of run `{run}`, which has no row: the file is damaged"
        ))));
    }
    for name in ["journal", "steps", "failures"] {
        let table: TableDefinition<(), ()> = TableDefinition::new(name);
        match txn.delete_table(table) {
            Ok(_) => {}
            Err(e) => return Err(storage(e.into())),
        }
    }
    record_format(txn).map_err(storage)?;
    Ok((ids.len() as u64, records))
}

type OldRecord = (u64, Old, Vec<u8>);

/// Every record of format 1 of the run `id`.
fn old_records(
    txn: &redb::WriteTransaction,
    id: &str,
) -> std::result::Result<Vec<OldRecord>, redb::Error> {
    let mut out = Vec::new();
    if let Some(journal) = optional(txn.open_table(JOURNAL))? {
        for entry in journal.range((id, 0)..=(id, u64::MAX))? {
            let (key, value) = entry?;
            out.push((key.value().1, Old::Transition, value.value().to_vec()));
        }
    }
    if let Some(steps) = optional(txn.open_table(STEPS))? {
        for entry in steps.range((id, 0, "", 0)..)? {
            let (key, value) = entry?;
            let (run, seq, name, occurrence) = key.value();
            if run != id {
                break;
            }
            out.push((
                seq,
                Old::Step(name.to_owned(), occurrence),
                value.value().to_vec(),
            ));
        }
    }
    if let Some(failures) = optional(txn.open_table(FAILURES))? {
        for entry in failures.range((id, 0, 0, 0)..=(id, u64::MAX, u32::MAX, u32::MAX))? {
            let (key, value) = entry?;
            let (_, seq, attempt, index) = key.value();
            out.push((seq, Old::Failure(attempt, index), value.value().to_vec()));
        }
    }
    Ok(out)
}

/// A run, if any, with records in format 1's tables and no row (among `ids`, the runs).
fn old_records_left(
    txn: &redb::WriteTransaction,
    ids: &[String],
) -> std::result::Result<Option<String>, redb::Error> {
    let known = |run: &str| ids.binary_search_by(|id| id.as_str().cmp(run)).is_ok();
    if let Some(journal) = optional(txn.open_table(JOURNAL))? {
        for entry in journal.iter()? {
            let run = entry?.0.value().0.to_owned();
            if !known(&run) {
                return Ok(Some(run));
            }
        }
    }
    if let Some(steps) = optional(txn.open_table(STEPS))? {
        for entry in steps.iter()? {
            let run = entry?.0.value().0.to_owned();
            if !known(&run) {
                return Ok(Some(run));
            }
        }
    }
    if let Some(failures) = optional(txn.open_table(FAILURES))? {
        for entry in failures.iter()? {
            let run = entry?.0.value().0.to_owned();
            if !known(&run) {
                return Ok(Some(run));
            }
        }
    }
    Ok(None)
}

/// A table a file may lack: `None` then.
fn optional<T>(
    opened: std::result::Result<T, redb::TableError>,
) -> std::result::Result<Option<T>, redb::Error> {
    match opened {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use redb::ReadableTableMetadata;

    use super::*;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/store-format-1.redb")
    }

    /// A conversion that is not committed (a crash before the commit) leaves the file of
    /// format 1 as it was.
    #[test]
    fn a_conversion_not_committed_leaves_format_1() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        std::fs::copy(fixture(), &path).unwrap();
        {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            let (runs, records) = convert(&txn).unwrap();
            assert_eq!(runs, 3);
            assert!(records > 10, "{records}");
            drop(txn);
        }
        let db = Database::open(&path).unwrap();
        let txn = db.begin_read().unwrap();
        assert_eq!(file_format(&txn).unwrap(), Some(FROM));
        assert!(txn.open_table(JOURNAL).unwrap().len().unwrap() > 0);
        assert!(matches!(
            txn.open_table(LOG),
            Err(redb::TableError::TableDoesNotExist(_))
        ));
        drop((txn, db));
        assert!(matches!(
            RedbStore::open(&path),
            Err(Error::StoreFormat { found: 1, .. })
        ));
    }
}
