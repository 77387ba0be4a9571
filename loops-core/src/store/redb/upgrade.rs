//! Converting a store file of an earlier format to this build's: [`RedbStore::upgrade`].
//! Format 1 kept records in `journal`, `steps` and `failures`, keyed by run; format 2 moved
//! them to one append-only log, with each run's row its head then JSON; format 3 encodes
//! the rest of the row in binary (`row`).

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::RedbStore;
use super::log::{self, Head, Kind, LOG};
use super::paths::refuse_special_file;
use super::row;
use super::tables::{Contents, ForeignDatabase, RUNS, STORE_FORMAT, contents, record_format};
use crate::error::{Error, Result};
use crate::row::RunInfo;

/// Format 1's transition records: (run id, seq) → record.
const JOURNAL: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("journal");
/// Format 1's step records: (run id, seq, step name, occurrence) → record.
const STEPS: TableDefinition<(&str, u64, &str, u32), &[u8]> = TableDefinition::new("steps");
/// Format 1's failure records: (run id, seq, attempt, index) → record.
const FAILURES: TableDefinition<(&str, u64, u32, u32), &[u8]> = TableDefinition::new("failures");

/// The formats [`RedbStore::upgrade`] converts from.
const FROM: [u64; 2] = [1, 2];

/// What [`RedbStore::upgrade`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Upgraded {
    /// The file has this build's format ([`STORE_FORMAT`]) already: nothing was done.
    Current {
        /// The file's format.
        format: u64,
    },
    /// The file has this build's format already, and redb repaired it on this open (the
    /// process that wrote it last had not closed it cleanly, or whole free pages followed its
    /// end): its committed data is as it was; nothing else was done.
    Repaired {
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
        /// The records moved to the log (none from format 2, which has it).
        records: u64,
    },
}

/// The name of the backup [`RedbStore::upgrade`] makes of `path`, a file of format `from`:
/// `<path>.format-<from>.bak`, followed by `.N` for the `n`-th (from 1) when the names
/// before it are taken.
pub(crate) fn backup_path(path: &Path, from: u64, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".format-{from}.bak"));
    if n > 0 {
        name.push(format!(".{n}"));
    }
    PathBuf::from(name)
}

/// How many backup names [`back_up`] tries before it gives up.
const BACKUP_NAMES: u32 = 100;

impl RedbStore {
    /// Converts the store file at `path` from format 1 or 2 to this build's format
    /// ([`STORE_FORMAT`]): copies it to `<path>.format-N.bak` first, N its format (or, if
    /// that name is taken, as by the backup of an upgrade that was interrupted,
    /// `<path>.format-N.bak.1`, `.2`, ...: a backup is never overwritten), then, in one
    /// write transaction, so that a crash leaves the file as it was: from format 1, moves
    /// every transition, step and failure record to the log; from either, encodes every
    /// run's row anew. `loops upgrade PATH` calls it.
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
        // Said as the other opens say it, not as redb's I/O errors.
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(open_err("no such file: there is nothing to upgrade".into()));
            }
            Ok(m) if m.is_file() && m.len() == 0 => {
                return Err(open_err(
                    "the file is empty (0 bytes), not a loops store: there is nothing to upgrade"
                        .into(),
                ));
            }
            _ => {}
        }
        // redb may panic on reading a damaged file (its documented behaviour for a file
        // altered outside it): said as damage, as every other open says it.
        crate::panics::catch(|| upgrade_file(path.clone())).unwrap_or_else(|_| {
            Err(Error::Open {
                path,
                cause: Box::new(redb::DatabaseError::Storage(redb::StorageError::Corrupted(
                    "redb panicked while upgrading the file: the file is damaged".to_owned(),
                ))),
            })
        })
    }
}

/// [`RedbStore::upgrade`] of the file at `path`, which exists and is not empty.
fn upgrade_file(path: PathBuf) -> Result<Upgraded> {
    let open_err = |cause: crate::BoxError| Error::Open {
        path: path.clone(),
        cause,
    };
    // Held shared while the file's format is read and it is copied: no writer meanwhile.
    let mut repaired = false;
    let held = match redb::Builder::new().open_read_only(&path) {
        Err(redb::DatabaseError::RepairAborted) => {
            // Not closed cleanly: redb repairs it at a writable open, then reads it.
            drop(open_writable(&path)?);
            repaired = true;
            redb::Builder::new().open_read_only(&path)
        }
        other => other,
    };
    let held = held.map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => Error::StoreLocked { path: path.clone() },
        e => open_err(super::open::open_source(e)),
    })?;
    // A damaged file is said to be damaged, not of another format (a damaged page can
    // hide the format's record), and is not copied or converted.
    super::verify::verify_file(&path).map_err(|e| super::open::damaged(path.clone(), e))?;
    let format = {
        let txn = held
            .begin_read()
            .map_err(|e| Error::storage("reading the store's format", e))?;
        contents(&txn).map_err(|e| Error::storage("reading the store's format", e))?
    };
    let from = match format {
        Contents::Format(STORE_FORMAT) if repaired => {
            return Ok(Upgraded::Repaired {
                format: STORE_FORMAT,
            });
        }
        Contents::Format(STORE_FORMAT) => {
            return Ok(Upgraded::Current {
                format: STORE_FORMAT,
            });
        }
        Contents::Format(from) if FROM.contains(&from) => from,
        Contents::Format(found) => {
            return Err(Error::StoreFormat {
                path,
                found,
                supported: STORE_FORMAT,
            });
        }
        Contents::Foreign(tables) => return Err(open_err(Box::new(ForeignDatabase { tables }))),
        Contents::Empty => return Err(open_err("not a loops store (it has no tables)".into())),
    };
    let backup = back_up(&path, from)
        .map_err(|e| open_err(format!("copying it to a backup beside it: {e}").into()))?;
    drop(held);
    let db = open_writable(&path)?;
    let txn = db
        .begin_write()
        .map_err(|e| Error::storage("beginning the upgrade", e))?;
    let (runs, records) = convert(&txn, from)?;
    crate::failpoint::point("loops::upgrade::before_commit");
    txn.commit()
        .map_err(|e| Error::storage("committing the upgrade", e))?;
    Ok(Upgraded::Converted {
        from,
        to: STORE_FORMAT,
        backup,
        runs,
        records,
    })
}

/// The file opened for writing with redb alone (loops' open refuses format 1).
fn open_writable(path: &Path) -> Result<Database> {
    Database::open(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => Error::StoreLocked {
            path: path.to_path_buf(),
        },
        e => Error::Open {
            path: path.to_path_buf(),
            cause: super::open::open_source(e),
        },
    })
}

/// Copies `from`, a file of format `format`, to a backup beside it under the first of its
/// [backup names](backup_path) that is free, and returns that name. The copy is written and synced under a temporary
/// name, then linked to the backup's name (which fails if the name exists): a crash never
/// leaves a partial copy under a backup's name, and no backup is overwritten.
fn back_up(from: &Path, format: u64) -> std::io::Result<PathBuf> {
    let mut tmp = backup_path(from, format, 0).into_os_string();
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
            let name = backup_path(from, format, n);
            match std::fs::hard_link(&tmp, &name) {
                Ok(()) => return Ok(name),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other(format!(
            "{} and the {} names after it are taken: move earlier backups away",
            backup_path(from, format, 0).display(),
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

/// Converts the file of format `from` in `txn` to this build's: from format 1, moves every
/// record to the log (each run's head then leads to them) and deletes format 1's tables;
/// from either, encodes every run's row as [`row`] does; then records [`STORE_FORMAT`].
/// Returns the runs and the records moved to the log.
///
/// # Errors
/// [`Error::Storage`] if redb fails, a key of format 1 names a run without a row, or a row
/// of format 2 is too short to hold its head; [`Error::Decode`] if a row's JSON does not
/// decode. Nothing is converted then (the caller does not commit).
pub(super) fn convert(txn: &redb::WriteTransaction, from: u64) -> Result<(u64, u64)> {
    let ids: Vec<String> = {
        let runs = txn.open_table(RUNS).map_err(|e| storage(e.into()))?;
        let mut ids = Vec::new();
        for entry in runs.iter().map_err(|e| storage(e.into()))? {
            let (key, _) = entry.map_err(|e| storage(e.into()))?;
            ids.push(key.value().to_owned());
        }
        ids
    };
    let (heads, records) = if from == 1 {
        move_to_log(txn, &ids)?
    } else {
        (Vec::new(), 0)
    };
    let mut runs = txn.open_table(RUNS).map_err(|e| storage(e.into()))?;
    for (i, id) in ids.iter().enumerate() {
        let stored = runs
            .get(id.as_str())
            .map_err(|e| storage(e.into()))?
            .map(|row| row.value().to_vec())
            .unwrap_or_default();
        let (head, json) = match heads.get(i) {
            Some(head) => (*head, stored.as_slice()),
            None => (
                row::head(id, &stored).map_err(storage)?,
                &stored[log::HEAD_LEN..],
            ),
        };
        let info = RunInfo::decode(id, json)?;
        let row = row::encode(head, &info);
        runs.insert(id.as_str(), row.as_slice())
            .map_err(|e| storage(e.into()))?;
    }
    drop(runs);
    record_format(txn).map_err(storage)?;
    Ok((ids.len() as u64, records))
}

/// The error of a conversion that redb failed, or that found the file damaged.
fn storage(e: redb::Error) -> Error {
    Error::storage(format!("converting the store to format {STORE_FORMAT}"), e)
}

/// Moves every record of format 1 to the log and deletes format 1's tables, in `txn`.
/// Returns the head of each of `ids` (the runs, in order) and the records moved.
fn move_to_log(txn: &redb::WriteTransaction, ids: &[String]) -> Result<(Vec<Head>, u64)> {
    let mut next = 1u64;
    let mut records = 0u64;
    let mut heads = Vec::with_capacity(ids.len());
    let mut log_table = txn.open_table(LOG).map_err(|e| storage(e.into()))?;
    for id in ids {
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
        heads.push(head);
    }
    drop(log_table);
    let orphans = old_records_left(txn, ids).map_err(storage)?;
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
    Ok((heads, records))
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
        fixture_of(1)
    }

    fn fixture_of(format: u64) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../tests/fixtures/store-format-{format}.redb"))
    }

    /// The same from format 2: its rows keep their JSON until the conversion commits.
    #[test]
    fn a_conversion_of_format_2_not_committed_leaves_format_2() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        std::fs::copy(fixture_of(2), &path).unwrap();
        let row_of_b = |db: &Database| {
            let txn = db.begin_read().unwrap();
            let runs = txn.open_table(RUNS).unwrap();
            runs.get("b").unwrap().unwrap().value().to_vec()
        };
        let before = row_of_b(&Database::open(&path).unwrap());
        assert_eq!(before[HEAD], b'{', "format 2's row: its head, then JSON");
        {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            assert_eq!(convert(&txn, 2).unwrap(), (3, 0));
            drop(txn);
            assert_eq!(row_of_b(&db), before);
        }
        let db = Database::open(&path).unwrap();
        assert_eq!(
            contents(&db.begin_read().unwrap()).unwrap(),
            Contents::Format(2)
        );
        drop(db);
        assert!(matches!(
            RedbStore::open(&path),
            Err(Error::StoreFormat { found: 2, .. })
        ));
    }

    const HEAD: usize = log::HEAD_LEN;

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
            let (runs, records) = convert(&txn, 1).unwrap();
            assert_eq!(runs, 3);
            assert!(records > 10, "{records}");
            drop(txn);
        }
        let db = Database::open(&path).unwrap();
        let txn = db.begin_read().unwrap();
        assert_eq!(contents(&txn).unwrap(), Contents::Format(1));
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
