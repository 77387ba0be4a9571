//! Reads, each in its own read transaction, and which runs are ready to be driven.

use std::sync::{Arc, PoisonError};

use redb::ReadableTable;

use super::apply::{ApplyError, lease_check, planned};
use super::commit::reopen_if_needed;
use super::log::{self, Chain, Head, Kind, LOG, LogError};
use super::row;
use super::step_keys::StepKeys;
use super::tables::{
    ATTRIBUTE_INDEX, ATTRIBUTE_KEY_ABOVE, ATTRIBUTES, CHILDREN, INBOX, PENDING, RUNS, ReadTables,
    SCHEDULES, SCHEMAS, SEALING, SEALING_CHECKS, STATUS, name_upper_bound,
};
use super::{RedbStore, corrupted};
use crate::attribute::{AttributeValue, Attributes, RunFilter};
use crate::error::{Error, RecordKind, Result};
use crate::record::{FailureRecord, StepRecord, TransitionRecord};
use crate::store::protocol::{EventRecord, Reply, Write};
use crate::store::{Lease, ParkedRun, Readiness, Ready, RunInfo, RunStatus};

impl RedbStore {
    /// A read-only store's answer to `write`: what a writable store would answer, if that
    /// writes nothing. The write is planned on the file as it is: a write the plan refuses
    /// gets the refusal, and one that changes nothing gets its answer; one that would write
    /// is refused with [`Error::ReadOnly`]. Reads only: the file's bytes stay as they are.
    pub(super) fn answer_read_only(&self, write: &Write, lease: Option<&Lease>) -> Result<Reply> {
        // A cache of its own: the file may change under a read-only store between two writes.
        let step_keys = StepKeys::default();
        let answer = self.read(
            || format!("planning a write on {}", self.inner.path.display()),
            |txn| {
                let mut t = ReadTables::new(txn, &step_keys);
                let check = lease.map(|lease| lease_check(Some(&self.inner.leases), lease));
                match planned(&mut t, write, check) {
                    Ok((_, effects)) if effects.is_empty() => Ok(Some(effects.into_reply())),
                    Ok(_) => Ok(None),
                    Err(ApplyError::Rejected(e)) => Err(ReadError::Loops(e)),
                    Err(ApplyError::Storage(e)) => Err(ReadError::Storage(e)),
                }
            },
        )?;
        answer.ok_or_else(|| Error::ReadOnly {
            path: self.inner.path.clone(),
        })
    }

    pub(in crate::store) fn read<T>(
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
                let Some((head, info)) = read_row(&runs, run_id)? else {
                    return Ok(None);
                };
                // The newest transition is the row's (walked back to it, should the row have
                // been written ahead of it).
                let log = txn.open_table(LOG)?;
                let mut found = None;
                log::walk(
                    &log,
                    run_id,
                    head.last_transition,
                    Chain::Transitions,
                    |_, entry| {
                        if entry.seq == info.seq {
                            found = Some(entry.record.to_vec());
                        }
                        entry.seq > info.seq
                    },
                )?;
                let bytes = found.ok_or_else(|| {
                    ReadError::Loops(Error::RecordMissing {
                        run_id: run_id.to_owned(),
                        seq: info.seq,
                    })
                })?;
                let record = TransitionRecord::from_stored(run_id, info.seq, &bytes)?;
                Ok(Some((info, record)))
            },
        )
    }

    /// Every transition record of the run, by sequence number (empty if the run does not
    /// exist): its chain of transitions in the log, walked back from the newest.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a record is unreadable.
    pub fn history(&self, run_id: &str) -> Result<Vec<TransitionRecord>> {
        self.read(
            || format!("reading the history of run `{run_id}`"),
            |txn| {
                let mut out = Vec::new();
                let mut decoded = Ok(());
                walk_run(txn, run_id, Chain::Transitions, |entry| {
                    match TransitionRecord::from_stored(run_id, entry.seq, entry.record) {
                        Ok(record) => out.push(record),
                        Err(e) => decoded = Err(e),
                    }
                    decoded.is_ok()
                })?;
                decoded?;
                out.reverse();
                Ok(out)
            },
        )
    }

    /// The step records of the run's state at `seq`, as `(name, occurrence, record)`, ordered
    /// by name then occurrence: the run's entries walked back from the newest to the first
    /// of an earlier seq.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a record is unreadable.
    pub fn steps(&self, run_id: &str, seq: u64) -> Result<Vec<(String, u32, StepRecord)>> {
        let steps = self.steps_where(
            || format!("reading the steps of run `{run_id}` seq {seq}"),
            run_id,
            Some(seq),
        )?;
        Ok(steps.into_iter().map(|(_, n, o, r)| (n, o, r)).collect())
    }

    /// Every step record of the run, of every seq, as `(seq, name, occurrence, record)`, by
    /// seq, then name and occurrence: one walk of the run's entries, for a reader that shows
    /// the whole history (calling [`steps`](Self::steps) for each seq walks the newer entries
    /// again for each).
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a record is unreadable.
    pub fn all_steps(&self, run_id: &str) -> Result<Vec<(u64, String, u32, StepRecord)>> {
        self.steps_where(
            || format!("reading the steps of run `{run_id}`"),
            run_id,
            None,
        )
    }

    /// The run's step records of seq `only` (walking its entries back from the newest until
    /// they pass it), or of every seq if `None`; by seq, then name and occurrence.
    fn steps_where(
        &self,
        action: impl Fn() -> String,
        run_id: &str,
        only: Option<u64>,
    ) -> Result<Vec<(u64, String, u32, StepRecord)>> {
        let from = only.unwrap_or(0);
        let only = |seq: u64| only.is_none_or(|only| seq == only);
        self.read(action, |txn| {
            let mut found = Vec::new();
            walk_run(txn, run_id, Chain::All, |entry| {
                if let Kind::Step { name, occurrence } = entry.kind
                    && only(entry.seq)
                {
                    found.push((
                        entry.seq,
                        name.to_owned(),
                        occurrence,
                        entry.record.to_vec(),
                    ));
                }
                entry.seq >= from
            })?;
            found.sort_by(|a, b| (a.0, &a.1, a.2).cmp(&(b.0, &b.1, b.2)));
            let mut out = Vec::with_capacity(found.len());
            for (seq, name, occurrence, bytes) in found {
                let record: StepRecord =
                    serde_json::from_slice(&bytes).map_err(|source| Error::Decode {
                        run_id: run_id.to_owned(),
                        record: RecordKind::Step {
                            name: name.clone(),
                            occurrence,
                        },
                        seq,
                        state: String::new(),
                        source,
                    })?;
                out.push((seq, name, occurrence, record));
            }
            Ok(out)
        })
    }

    /// Every failed attempt of the run, as `(seq, record)`, by seq, attempt and order: its
    /// whole chain of entries in the log.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a record is unreadable.
    pub fn failures(&self, run_id: &str) -> Result<Vec<(u64, FailureRecord)>> {
        self.read(
            || format!("reading the failures of run `{run_id}`"),
            |txn| {
                let mut found = Vec::new();
                walk_run(txn, run_id, Chain::All, |entry| {
                    if let Kind::Failure { attempt, index } = entry.kind {
                        found.push(((entry.seq, attempt, index), entry.record.to_vec()));
                    }
                    true
                })?;
                found.sort_by_key(|(key, _)| *key);
                let mut out = Vec::with_capacity(found.len());
                for ((seq, _, _), bytes) in found {
                    out.push((seq, FailureRecord::decode(run_id, seq, &bytes)?));
                }
                Ok(out)
            },
        )
    }

    /// The rows of the run's children (the runs whose [`parent`](RunInfo::parent) is
    /// `run_id`), any status, by run id; empty for a run without children.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a row is unreadable.
    pub fn children(&self, run_id: &str) -> Result<Vec<RunInfo>> {
        self.read(
            || format!("listing the children of run `{run_id}`"),
            |txn| {
                // A file written before child runs has no such table: no run has children.
                let index = match txn.open_table(CHILDREN) {
                    Ok(index) => index,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(e.into()),
                };
                let runs = txn.open_table(RUNS)?;
                let top = name_upper_bound();
                let mut out = Vec::new();
                for entry in index.range((run_id, "")..(run_id, top.as_str()))? {
                    let (key, _) = entry?;
                    if let Some(info) = read_info(&runs, key.value().1)? {
                        out.push(info);
                    }
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
                let mut out = Vec::new();
                scan(txn, status, workflow, |info| {
                    out.push(info);
                    Ok(())
                })?;
                Ok(out)
            },
        )
    }

    /// How many runs there are by workflow and status ([`Store::count_runs`]): one pass
    /// over the status index's keys, no row read.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error, or for a status code no status has (a damaged
    /// index).
    ///
    /// [`Store::count_runs`]: crate::Store::count_runs
    pub fn count_runs(&self) -> Result<Vec<crate::store::RunCount>> {
        self.read(
            || "counting runs".to_owned(),
            |txn| {
                let index = txn.open_table(STATUS)?;
                // The index is ordered by (status code, workflow, run id): each (code,
                // workflow) pair is one stretch of keys.
                let mut counts: Vec<(u8, String, u64)> = Vec::new();
                for entry in index.iter()? {
                    let (key, _) = entry?;
                    let (code, workflow, _) = key.value();
                    match counts.last_mut() {
                        Some((c, w, n)) if *c == code && w == workflow => *n += 1,
                        _ => counts.push((code, workflow.to_owned(), 1)),
                    }
                }
                let mut out = counts
                    .into_iter()
                    .map(|(code, workflow, runs)| {
                        let status = RunStatus::from_code(code).ok_or_else(|| {
                            ReadError::Storage(redb::Error::Corrupted(format!(
                                "the status index holds status code {code}, which no status has: the file is damaged"
                            )))
                        })?;
                        Ok(crate::store::RunCount {
                            workflow,
                            status,
                            runs,
                        })
                    })
                    .collect::<std::result::Result<Vec<_>, ReadError>>()?;
                out.sort_by(|a, b| (&a.workflow, a.status.as_str()).cmp(&(&b.workflow, b.status.as_str())));
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

    /// The ids of the keys that sealed payloads in the store, by the time each was first
    /// recorded, then by id; empty for a store in clear, and for a file written before
    /// loops recorded them (it lacks the table).
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error.
    pub fn sealing_keys(&self) -> Result<Vec<String>> {
        self.read(
            || "reading the keys that sealed payloads".to_owned(),
            |txn| {
                let table = match txn.open_table(SEALING) {
                    Ok(table) => table,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(e.into()),
                };
                let mut keys = Vec::new();
                for entry in table.iter()? {
                    let (key, at_ms) = entry?;
                    keys.push((at_ms.value(), key.value().to_owned()));
                }
                keys.sort();
                Ok(keys.into_iter().map(|(_, key)| key).collect())
            },
        )
    }

    /// The check values of the keys that sealed payloads (`Write::Seal`), `(key id,
    /// check)`, by id; empty for a file written before they were recorded.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error.
    pub fn sealing_checks(&self) -> Result<Vec<(String, String)>> {
        self.read(
            || "reading the check values of the sealing keys".to_owned(),
            |txn| {
                let table = match txn.open_table(SEALING_CHECKS) {
                    Ok(table) => table,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(e.into()),
                };
                let mut checks = Vec::new();
                for entry in table.iter()? {
                    let (key, check) = entry?;
                    checks.push((key.value().to_owned(), check.value().to_owned()));
                }
                Ok(checks)
            },
        )
    }

    /// Every stored schedule, by name; empty for a file written before loops had schedules
    /// (it lacks the table).
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::InvalidSchedule`] for a row loops did not
    /// write.
    pub fn schedules(&self) -> Result<Vec<crate::ScheduleInfo>> {
        let rows = self.read(
            || "reading schedules".to_owned(),
            |txn| {
                let table = match txn.open_table(SCHEDULES) {
                    Ok(table) => table,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(e.into()),
                };
                let mut rows = Vec::new();
                for entry in table.iter()? {
                    let (name, bytes) = entry?;
                    rows.push((name.value().to_owned(), bytes.value().to_vec()));
                }
                Ok(rows)
            },
        )?;
        rows.iter()
            .map(|(name, bytes)| crate::ScheduleInfo::decode(name, bytes))
            .collect()
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

    /// The run's attributes (empty if it has none or does not exist; a file written before
    /// attributes existed has none).
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a stored value is unreadable.
    pub fn attributes(&self, run_id: &str) -> Result<Attributes> {
        self.read(
            || format!("reading the attributes of run `{run_id}`"),
            |txn| read_attributes(txn, run_id),
        )
    }

    /// The runs that `filter` selects, with their attributes, by run id: candidates from one
    /// range scan of the attribute index (by [`RunFilter::driving`]), each kept if
    /// [`RunFilter::matches`] accepts its row and attributes. No attribute filter: none.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a row or value is unreadable.
    pub fn search(&self, filter: &RunFilter) -> Result<Vec<(RunInfo, Attributes)>> {
        let Some(driving) = filter.driving() else {
            return Ok(Vec::new());
        };
        self.read(
            || format!("searching runs by attribute `{}`", driving.key),
            |txn| {
                let Some(index) = optional(txn.open_table(ATTRIBUTE_INDEX))? else {
                    return Ok(Vec::new());
                };
                let runs = txn.open_table(RUNS)?;
                let (lo, hi) = driving.index_range();
                let mut out = Vec::new();
                if lo >= hi {
                    return Ok(out);
                }
                let key = driving.key.as_str();
                for entry in index.range((key, lo.as_slice(), "")..(key, hi.as_slice(), ""))? {
                    let (entry, _) = entry?;
                    let run_id = entry.value().2;
                    let Some(info) = read_info(&runs, run_id)? else {
                        continue;
                    };
                    let attributes = read_attributes(txn, run_id)?;
                    if filter.matches(&info, &attributes) {
                        out.push((info, attributes));
                    }
                }
                out.sort_by(|a, b| a.0.run_id.cmp(&b.0.run_id));
                Ok(out)
            },
        )
    }

    /// The ready runs of `workflows` (running runs, and waiting runs whose wait can end or
    /// whose cancellation was asked for), by workflow then status: what
    /// [`Store::claim_ready`](crate::store::Store::claim_ready) takes leases of. With
    /// `parked`, also every waiting run, lean, read in the same pass
    /// ([`Store::claim_ready_and_parked`](crate::store::Store::claim_ready_and_parked)).
    pub(super) fn ready_runs(
        &self,
        workflows: &[crate::store::ClaimFilter],
        mut parked: Option<&mut Vec<ParkedRun>>,
    ) -> Result<Vec<RunInfo>> {
        let now = crate::record::now_ms();
        self.read(
            || "listing the ready runs".to_owned(),
            |txn| {
                let pending = txn.open_table(PENDING)?;
                let is_ready = |run_id: &str, readiness: Readiness<'_>| {
                    Ok::<_, ReadError>(match readiness.at(now) {
                        Ready::Now => true,
                        Ready::OnEvent(event) => pending
                            .range((run_id, event, 0)..=(run_id, event, u64::MAX))?
                            .next()
                            .is_some(),
                        Ready::No => false,
                    })
                };
                let mut out = Vec::new();
                for filter in workflows {
                    let workflow: Arc<str> = Arc::from(filter.workflow.as_str());
                    // A running run is ready, and claimed with its row: decoded whole.
                    scan(txn, RunStatus::Running, Some(&filter.workflow), |info| {
                        if is_ready(&info.run_id, info.readiness())? {
                            out.push(info);
                        }
                        Ok(())
                    })?;
                    // Row by row, and of a waiting run only what says when it is ready
                    // (most are not: parked, they are kept lean, if at all).
                    scan_rows(
                        txn,
                        RunStatus::Waiting,
                        Some(&filter.workflow),
                        |run_id, bytes| {
                            let (schema, readiness) =
                                row::readiness(run_id, bytes).map_err(ReadError::Loops)?;
                            if let Some(parked) = parked.as_deref_mut() {
                                parked.push(ParkedRun {
                                    workflow: Arc::clone(&workflow),
                                    run_id: run_id.to_owned(),
                                    schema,
                                    from_ms: readiness.from_ms,
                                });
                            }
                            if is_ready(run_id, readiness)? {
                                out.push(row::decode(run_id, bytes).map_err(ReadError::Loops)?.1);
                            }
                            Ok(())
                        },
                    )?;
                }
                Ok(out)
            },
        )
    }
}

/// Calls `each` with the row of every run with `status` (only of `workflow`, if given), in
/// the status index's order (by workflow, then run id), decoding one row at a time.
fn scan(
    txn: &redb::ReadTransaction,
    status: RunStatus,
    workflow: Option<&str>,
    mut each: impl FnMut(RunInfo) -> std::result::Result<(), ReadError>,
) -> std::result::Result<(), ReadError> {
    scan_rows(txn, status, workflow, |run_id, bytes| {
        each(row::decode(run_id, bytes).map_err(ReadError::Loops)?.1)
    })
}

/// [`scan`], with each row as stored: `(run id, bytes)` (see [`row`]).
fn scan_rows(
    txn: &redb::ReadTransaction,
    status: RunStatus,
    workflow: Option<&str>,
    mut each: impl FnMut(&str, &[u8]) -> std::result::Result<(), ReadError>,
) -> std::result::Result<(), ReadError> {
    let index = txn.open_table(STATUS)?;
    let runs = txn.open_table(RUNS)?;
    let code = status.code();
    let range = match workflow {
        Some(w) => index.range((code, w, "")..)?,
        None => index.range((code, "", "")..)?,
    };
    for entry in range {
        let (key, _) = entry?;
        let (c, w, run_id) = key.value();
        if c != code || workflow.is_some_and(|want| want != w) {
            break;
        }
        if let Some(bytes) = runs.get(run_id)? {
            each(run_id, bytes.value())?;
        }
    }
    Ok(())
}

pub(in crate::store) enum ReadError {
    Storage(redb::Error),
    Loops(Error),
}

impl<E: Into<redb::Error>> From<E> for ReadError {
    fn from(e: E) -> Self {
        ReadError::Storage(e.into())
    }
}

impl From<LogError> for ReadError {
    fn from(e: LogError) -> Self {
        ReadError::Storage(e.into_redb())
    }
}

impl From<Error> for ReadError {
    fn from(e: Error) -> Self {
        ReadError::Loops(e)
    }
}

/// The attributes of `run_id` in `txn`.
fn read_attributes(
    txn: &redb::ReadTransaction,
    run_id: &str,
) -> std::result::Result<Attributes, ReadError> {
    let mut out = Attributes::new();
    let Some(table) = optional(txn.open_table(ATTRIBUTES))? else {
        return Ok(out);
    };
    for entry in table.range((run_id, "")..(run_id, ATTRIBUTE_KEY_ABOVE))? {
        let (key, value) = entry?;
        let key = key.value().1;
        let value = AttributeValue::from_index_bytes(value.value()).ok_or_else(|| {
            ReadError::Storage(redb::Error::Corrupted(format!(
                "the value of attribute `{key}` of run `{run_id}` is not an attribute value"
            )))
        })?;
        out.insert(key.to_owned(), value);
    }
    Ok(out)
}

/// A table that a file written before it existed lacks: `None` then.
fn optional<T>(
    opened: std::result::Result<T, redb::TableError>,
) -> std::result::Result<Option<T>, ReadError> {
    match opened {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub(in crate::store) fn read_info(
    runs: &impl ReadableTable<&'static str, &'static [u8]>,
    run_id: &str,
) -> std::result::Result<Option<RunInfo>, ReadError> {
    Ok(read_row(runs, run_id)?.map(|(_, info)| info))
}

/// The run's head and row, if it has one.
fn read_row(
    runs: &impl ReadableTable<&'static str, &'static [u8]>,
    run_id: &str,
) -> std::result::Result<Option<(Head, RunInfo)>, ReadError> {
    let Some(bytes) = runs.get(run_id)? else {
        return Ok(None);
    };
    row::decode(run_id, bytes.value())
        .map(Some)
        .map_err(ReadError::Loops)
}

/// Calls `each` with the entries of run `run_id` along `chain`, newest first, from the
/// head of its row, until `each` answers `false` or the chain ends; nothing for a run that
/// does not exist.
fn walk_run(
    txn: &redb::ReadTransaction,
    run_id: &str,
    chain: Chain,
    mut each: impl FnMut(&log::Entry<'_>) -> bool,
) -> std::result::Result<(), ReadError> {
    let runs = txn.open_table(RUNS)?;
    let Some(head) = read_head(&runs, run_id)? else {
        return Ok(());
    };
    let from = match chain {
        Chain::All => head.last_entry,
        Chain::Transitions => head.last_transition,
    };
    let log = txn.open_table(LOG)?;
    log::walk(&log, run_id, from, chain, |_, entry| each(entry))?;
    Ok(())
}

/// The run's head, if it has a row (the rest of the row is not decoded).
fn read_head(
    runs: &impl ReadableTable<&'static str, &'static [u8]>,
    run_id: &str,
) -> std::result::Result<Option<Head>, ReadError> {
    let Some(bytes) = runs.get(run_id)? else {
        return Ok(None);
    };
    Ok(Some(row::head(run_id, bytes.value())?))
}
