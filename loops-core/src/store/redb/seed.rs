//! Bulk-writing histories for benchmarks and tests.

use std::sync::PoisonError;

use super::commit::commit_batch;
use super::{Db, RedbStore};
use crate::error::{Error, Result};
use crate::names::RESERVED_PREFIX;
use crate::record::{StepRecord, TransitionRecord};
use crate::store::protocol::Write;
use crate::store::{RunInfo, WaitInfo};
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
                        at_ms: now,
                        hands_over: false,
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
            written += self.commit_seeded(&batch)?;
            batch.clear();
        }
        Ok(written)
    }

    /// Bulk-writes parked runs, for benchmarks and tests that need many waiting runs. Not a
    /// public API.
    ///
    /// Each `(run id, value, wait)` creates the run in `value` (its workflow's initial
    /// state, seq 0) and records what its handler's first execution writes before it parks,
    /// as `Context` writes it: for a wait for `wait.event`, the deadline journaled as the
    /// step `loops:deadline:{event}` if `wait.until_ms` is set (`wait_for_timeout`), then
    /// the [`Write::Wait`] recorded as the step `loops:wait:{event}` (`wait_for`); for a
    /// sleep (no event), the wake-up time journaled as the step `loops:sleep`, then the
    /// [`Write::Wait`] until it (`sleep_until`). The same [`Write`]s as the runtime's,
    /// applied by the writer's own `apply`, many per write transaction ([`SEED_BATCH`]). A
    /// sleep whose time has passed at seeding does not park, as in the runtime (the run stays
    /// running). Run ids must be new to the store. Blocking. Returns the number of runs
    /// written.
    ///
    /// # Errors
    /// As [`__seed_history`](Self::__seed_history).
    #[doc(hidden)]
    pub fn __seed_waiting<W: Workflow>(
        &self,
        runs: impl IntoIterator<Item = (String, W, WaitInfo)>,
    ) -> Result<u64> {
        let mut batch: Vec<Write> = Vec::with_capacity(SEED_BATCH + 3);
        let mut written = 0u64;
        let mut runs = runs.into_iter().peekable();
        while runs.peek().is_some() {
            let mut in_batch = 0u64;
            while batch.len() < SEED_BATCH {
                let Some((run_id, value, wait)) = runs.next() else {
                    break;
                };
                let now = crate::record::now_ms();
                let record = TransitionRecord::encode(&run_id, 0, &value, now)?;
                batch.push(Write::Create {
                    info: RunInfo::new_run::<W>(&run_id, value.state(), now),
                    record: record.to_bytes(),
                    schema_text: W::SCHEMA,
                    attributes: Vec::new(),
                });
                let journal = match (&wait.event, wait.until_ms) {
                    (Some(event), Some(until)) => {
                        Some((format!("{RESERVED_PREFIX}deadline:{event}"), until))
                    }
                    (None, Some(until)) => Some((format!("{RESERVED_PREFIX}sleep"), until)),
                    (_, None) => None,
                };
                if let Some((name, until)) = journal {
                    let record = journaled(&run_id, value.state().name(), &name, until, now)?;
                    batch.push(Write::Step {
                        run_id: run_id.clone(),
                        seq: 0,
                        name,
                        occurrence: 0,
                        record,
                        clear_error_at_ms: None,
                    });
                }
                batch.push(Write::Wait {
                    step: wait
                        .event
                        .as_ref()
                        .map(|event| (crate::record::wait::wait_step_name(event), 0)),
                    run_id,
                    seq: 0,
                    attempt: 1,
                    event: wait.event,
                    until_ms: wait.until_ms,
                    at_ms: now,
                });
                in_batch += 1;
            }
            self.commit_seeded(&batch)?;
            written += in_batch;
            batch.clear();
        }
        Ok(written)
    }

    /// The length in bytes of `run_id`'s row as stored (its head included), for benchmarks
    /// whose raw floor writes rows of the same size. Not a public API.
    ///
    /// # Errors
    /// [`Error::Storage`] if redb fails to read it.
    #[doc(hidden)]
    pub fn __stored_row_len(&self, run_id: &str) -> Result<Option<usize>> {
        self.read(
            || format!("reading the row of run `{run_id}`"),
            |txn| {
                let runs = txn.open_table(super::tables::RUNS)?;
                Ok(runs.get(run_id)?.map(|row| row.value().len()))
            },
        )
    }

    /// Commits `batch` in one write transaction; returns the number of writes applied.
    fn commit_seeded(&self, batch: &[Write]) -> Result<u64> {
        let mut written = 0u64;
        let results = {
            let guard = self.inner.db.read().unwrap_or_else(PoisonError::into_inner);
            match &*guard {
                Db::Writable(db) => {
                    commit_batch(
                        db,
                        None,
                        &self.inner.step_keys,
                        batch.iter().map(|w| (w, None)),
                    )
                    .0
                }
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
        Ok(written)
    }
}

/// The step record `Context::journaled_u64` writes for `value` as the step `name`#0 of
/// `run_id`'s handler of `state` at seq 0, attempt 1, at `at_ms`.
fn journaled(
    run_id: &str,
    state: &'static str,
    name: &str,
    value: u64,
    at_ms: u64,
) -> Result<Vec<u8>> {
    let output = serde_json::value::to_raw_value(&value).map_err(|source| Error::StepEncode {
        run_id: run_id.to_owned(),
        state,
        seq: 0,
        step: name.to_owned(),
        occurrence: 0,
        source,
    })?;
    Ok(crate::record::to_vec(&StepRecord {
        attempt: 1,
        at_ms,
        duration_ms: 0,
        output,
    }))
}
