//! Bulk-writing histories for benchmarks and tests.

use std::sync::PoisonError;

use super::commit::commit_batch;
use super::{Db, RedbStore};
use crate::error::{Error, Result};
use crate::record::TransitionRecord;
use crate::store::RunInfo;
use crate::store::protocol::Write;
use crate::workflow::{StateId, Workflow};

/// Writes per write transaction of [`RedbStore::__seed_history`].
pub(crate) const SEED_BATCH: usize = 8192;

impl RedbStore {
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
                        attributes: Vec::new(),
                    }
                } else {
                    Write::Transition {
                        run_id: run_id.clone(),
                        seq,
                        state: state.name().to_owned(),
                        record: record.to_bytes(),
                        terminal: state.is_terminal(),
                        schema: W::SCHEMA_HASH.pinned(),
                        at_ms: now,
                    }
                };
                let after = seq.checked_add(1).ok_or_else(|| {
                    Error::counter_overflow(
                        &run_id,
                        (crate::error::RecordKind::Transition, seq),
                        "seq",
                        seq,
                        "seeding the next record",
                    )
                })?;
                next_seq.insert(run_id, after);
                batch.push(write);
            }
            let results = {
                let guard = self.inner.db.read().unwrap_or_else(PoisonError::into_inner);
                match &*guard {
                    Db::Writable(db) => commit_batch(db, None, batch.iter().map(|w| (w, None))).0,
                    Db::ReadOnly(_) => {
                        return Err(Error::ReadOnly {
                            path: self.inner.path.clone(),
                        });
                    }
                    Db::Reopening(e) => {
                        return Err(Error::Storage {
                            action: "seeding records".to_owned(),
                            cause: e.clone(),
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
}
