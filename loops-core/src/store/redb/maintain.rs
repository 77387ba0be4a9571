//! Maintenance of the file: its size, compaction, the integrity check, and deleting ended
//! runs.

use std::path::Path;
use std::sync::PoisonError;

use serde::Serialize;

use super::{Db, RedbStore, corrupted};
use crate::error::{Error, Result};
use crate::store::Pruned;
use crate::store::protocol::{Reply, Write};

/// What [`RedbStore::compact`] reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Compacted {
    /// File size before, in bytes.
    pub bytes_before: u64,
    /// File size after, in bytes.
    pub bytes_after: u64,
}

impl RedbStore {
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
                cause: e.into(),
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
        crate::store::prune(self, policy, now_ms, dry_run).await
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
            .submit(
                Write::Prune {
                    run_ids: run_ids.to_vec(),
                },
                None,
            )
            .await?
        {
            Reply::Pruned { records, .. } => Ok(records),
            _ => Ok(0),
        }
    }
}
