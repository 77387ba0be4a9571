//! The runtime's schema check before a redb store file opens for writing: every unfinished
//! run of a declared workflow must have been recorded with the compiled schema.

use std::path::Path;

use redb::ReadableDatabase;

use super::redb::{RUNS, ReadError, RedbStore, SCHEMAS, STATUS, read_info};
use crate::error::{Error, Result};
use crate::panics::catch;
use crate::route::KnownVersion;
use crate::row::RunInfo;
use crate::schema::SchemaDiff;
use crate::status::RunStatus;
use crate::workflow::Workflow;

/// A declared workflow version (`RuntimeBuilder::workflow`): with strict schemas, its
/// unfinished runs must match its schema for the store to open; its claims to accept older
/// schemas are checked as a registered version's are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SchemaCheck {
    pub(crate) workflow: &'static str,
    pub(crate) version: KnownVersion,
}

impl SchemaCheck {
    /// The declared version `W`.
    pub(crate) fn of<W: Workflow>() -> SchemaCheck {
        SchemaCheck {
            workflow: W::NAME,
            version: KnownVersion::of::<W>(),
        }
    }
}

/// Before the file is opened for writing: refuses, leaving the file's bytes as they are, if an
/// unfinished run of a checked workflow was recorded with another schema.
///
/// The check opens the file read-only. A file that needs redb's crash repair (it was not
/// closed cleanly) cannot be opened read-only: then this returns `Ok(false)`, and the caller
/// must check with [`check_schemas`] once the writable open has repaired it.
pub(crate) fn precheck(path: &Path, checks: &[SchemaCheck]) -> Result<bool> {
    super::redb::refuse_special_file(path)?;
    if checks.is_empty() || !path.exists() {
        return Ok(true);
    }
    // redb may panic on a damaged file: then the writable open below reports it properly.
    let opened = catch(|| redb::Builder::new().open_read_only(path));
    let db = match opened {
        Ok(Ok(db)) => db,
        Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => {
            return Err(Error::StoreLocked {
                path: path.to_path_buf(),
            });
        }
        Ok(Err(_)) | Err(_) => return Ok(false),
    };
    let checked = catch(|| {
        let txn = db
            .begin_read()
            .map_err(|e| Error::storage("checking schemas before opening", e))?;
        schemas_match(&txn, checks)
    });
    match checked {
        Ok(result) => result.map(|()| true),
        // A damaged file: leave it to the writable open, which verifies every page.
        Err(_) => Ok(false),
    }
}

/// Refuses if an unfinished run of a checked workflow was recorded with another schema.
pub(crate) fn check_schemas(store: &RedbStore, checks: &[SchemaCheck]) -> Result<()> {
    if checks.is_empty() {
        return Ok(());
    }
    store.read(
        || "checking schemas".to_owned(),
        |txn| schemas_match(txn, checks).map_err(ReadError::Loops),
    )
}

fn schemas_match(txn: &redb::ReadTransaction, checks: &[SchemaCheck]) -> Result<()> {
    let found: std::result::Result<Option<(RunInfo, SchemaCheck, Option<String>)>, ReadError> =
        (|| {
            let (index, runs, schemas) = match (
                txn.open_table(STATUS),
                txn.open_table(RUNS),
                txn.open_table(SCHEMAS),
            ) {
                (Ok(i), Ok(r), Ok(s)) => (i, r, s),
                _ => return Ok(None),
            };
            for status in [RunStatus::Running, RunStatus::Waiting] {
                let code = status.code();
                for check in checks {
                    for entry in index.range((code, check.workflow, "")..)? {
                        let (key, _) = entry?;
                        let (c, w, run_id) = key.value();
                        if c != code || w != check.workflow {
                            break;
                        }
                        if let Some(info) = read_info(&runs, run_id)?
                            && info.schema != check.version.stored.hash
                        {
                            let stored = schemas
                                .get(info.schema.to_string().as_str())?
                                .map(|v| v.value().to_owned());
                            return Ok(Some((info, *check, stored)));
                        }
                    }
                }
            }
            Ok(None)
        })();
    match found {
        Ok(None) => Ok(()),
        Ok(Some((info, check, stored))) => Err(Error::SchemaMismatch {
            changes: SchemaDiff::of_mismatch(stored.as_deref(), check.version.schema),
            run_id: info.run_id,
            workflow: info.workflow,
            stored: info.schema,
            compiled: check.version.stored.hash,
        }),
        Err(ReadError::Loops(e)) => Err(e),
        Err(ReadError::Storage(e)) => Err(Error::storage("checking schemas", e)),
    }
}
