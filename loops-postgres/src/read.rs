//! Reads and lease statements: one statement each, in autocommit, tried again on another
//! connection if the connection failed.

use deadpool_postgres::Pool;
use loops_core::{ClaimFilter, EventRecord, Lease, RunInfo, RunStatus};
use loops_core::{
    Error, FailureRecord, RecordKind, Result, SchemaHash, StepRecord, TransitionRecord,
};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::{Announced, PgStore, big, is_connection_error};

/// Attempts of a statement whose connection fails, on fresh connections.
const TRIES: usize = 3;

impl PgStore {
    /// Runs `statement` and returns its rows; a connection that fails is dropped and the
    /// statement tried again on another, up to [`TRIES`] times in all.
    pub(crate) async fn rows(
        &self,
        action: impl Fn() -> String,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        self.rows_on(&self.inner.pool, action, statement, params)
            .await
    }

    /// As [`rows`](Self::rows), on a connection of `pool`.
    pub(crate) async fn rows_on(
        &self,
        pool: &Pool,
        action: impl Fn() -> String,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        self.timed(&action, self.rows_untimed(pool, &action, statement, params))
            .await
    }

    async fn rows_untimed(
        &self,
        pool: &Pool,
        action: impl Fn() -> String,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let mut tries = 0;
        loop {
            tries += 1;
            // Closed if this future is dropped midway (a time-out): it may hang.
            let client = crate::guard::Guard(Some(self.client_from(pool, &action).await?));
            let result = async {
                let c = client.client();
                let prepared = c.prepare_cached(statement).await?;
                c.query(&prepared, params).await
            }
            .await;
            match result {
                Ok(rows) => {
                    client.keep();
                    return Ok(rows);
                }
                Err(e) if tries < TRIES && is_connection_error(&e) => {
                    tracing::debug!(error = %e, "connection failed; trying again");
                }
                Err(e) => {
                    if !is_connection_error(&e) {
                        client.keep();
                    }
                    return Err(Error::database(action(), e));
                }
            }
        }
    }

    pub(crate) async fn read_run_info(&self, run_id: &str) -> Result<Option<RunInfo>> {
        let rows = self
            .rows(
                || format!("reading run `{run_id}`"),
                &self.inner.sql.read_info,
                &[&run_id],
            )
            .await?;
        rows.first()
            .map(|row| RunInfo::decode(run_id, text(row, 0, run_id)?.as_bytes()))
            .transpose()
    }

    pub(crate) async fn read_latest(
        &self,
        run_id: &str,
    ) -> Result<Option<(RunInfo, TransitionRecord)>> {
        let rows = self
            .rows(
                || format!("reading run `{run_id}`"),
                &self.inner.sql.latest,
                &[&run_id],
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let info = RunInfo::decode(run_id, text(row, 0, run_id)?.as_bytes())?;
        let record: Option<String> = row.try_get(1).map_err(|e| column(run_id, e))?;
        let Some(record) = record else {
            return Err(Error::RecordMissing {
                run_id: run_id.to_owned(),
                seq: info.seq,
            });
        };
        let record = decode_transition(run_id, info.seq, &record)?;
        Ok(Some((info, record)))
    }

    pub(crate) async fn read_history(&self, run_id: &str) -> Result<Vec<TransitionRecord>> {
        let rows = self
            .rows(
                || format!("reading the history of run `{run_id}`"),
                &self.inner.sql.history,
                &[&run_id],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.try_get(0).map_err(|e| column(run_id, e))?;
                decode_transition(run_id, seq as u64, &text(row, 1, run_id)?)
            })
            .collect()
    }

    pub(crate) async fn read_steps(
        &self,
        run_id: &str,
        seq: u64,
    ) -> Result<Vec<(String, u32, StepRecord)>> {
        let rows = self
            .rows(
                || format!("reading the steps of run `{run_id}` seq {seq}"),
                &self.inner.sql.steps,
                &[&run_id, &big(seq)],
            )
            .await?;
        rows.iter()
            .map(|row| step_row(row, 0, run_id, seq))
            .collect()
    }

    /// The step records of every seq of the run, by seq, then name and occurrence: one query.
    pub(crate) async fn read_all_steps(
        &self,
        run_id: &str,
    ) -> Result<Vec<(u64, String, u32, StepRecord)>> {
        let rows = self
            .rows(
                || format!("reading the steps of run `{run_id}`"),
                &self.inner.sql.all_steps,
                &[&run_id],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.try_get(0).map_err(|e| column(run_id, e))?;
                let (name, occurrence, record) = step_row(row, 1, run_id, seq as u64)?;
                Ok((seq as u64, name, occurrence, record))
            })
            .collect()
    }

    pub(crate) async fn read_failures(&self, run_id: &str) -> Result<Vec<(u64, FailureRecord)>> {
        let rows = self
            .rows(
                || format!("reading the failures of run `{run_id}`"),
                &self.inner.sql.failures,
                &[&run_id],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.try_get(0).map_err(|e| column(run_id, e))?;
                let text = text(row, 1, run_id)?;
                let record = FailureRecord::decode(run_id, seq as u64, text.as_bytes())?;
                Ok((seq as u64, record))
            })
            .collect()
    }

    pub(crate) async fn read_events(&self, run_id: &str) -> Result<Vec<(u64, EventRecord, bool)>> {
        let rows = self
            .rows(
                || format!("reading the inbox of run `{run_id}`"),
                &self.inner.sql.events,
                &[&run_id],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let event_seq: i64 = row.try_get(0).map_err(|e| column(run_id, e))?;
                let record = decode_event(run_id, event_seq as u64, &text(row, 1, run_id)?)?;
                let delivered: bool = row.try_get(2).map_err(|e| column(run_id, e))?;
                Ok((event_seq as u64, record, delivered))
            })
            .collect()
    }

    pub(crate) async fn read_has_pending(&self, run_id: &str, event: &str) -> Result<bool> {
        let rows = self
            .rows(
                || format!("reading the inbox of run `{run_id}`"),
                &self.inner.sql.has_pending,
                &[&run_id, &event],
            )
            .await?;
        match rows.first() {
            Some(row) => row.try_get(0).map_err(|e| column(run_id, e)),
            None => Ok(false),
        }
    }

    pub(crate) async fn read_list(
        &self,
        status: RunStatus,
        workflow: Option<&str>,
    ) -> Result<Vec<RunInfo>> {
        let status_text = status.as_str();
        let action = || format!("listing {status} runs");
        let rows = match workflow {
            Some(w) => {
                self.rows(action, &self.inner.sql.list_workflow, &[&status_text, &w])
                    .await?
            }
            None => {
                self.rows(action, &self.inner.sql.list, &[&status_text])
                    .await?
            }
        };
        rows.iter().map(listed).collect()
    }

    pub(crate) async fn read_list_of_schemas(
        &self,
        status: RunStatus,
        workflow: &str,
        schemas: &[SchemaHash],
    ) -> Result<Vec<RunInfo>> {
        if schemas.is_empty() {
            return Ok(Vec::new());
        }
        let status_text = status.as_str();
        let hashes: Vec<String> = schemas.iter().map(ToString::to_string).collect();
        let rows = self
            .rows(
                || format!("listing {status} runs of {workflow} by schema"),
                &self.inner.sql.list_of_schemas,
                &[&status_text, &workflow, &hashes],
            )
            .await?;
        rows.iter().map(listed).collect()
    }

    pub(crate) async fn read_count_runs(&self) -> Result<Vec<loops_core::RunCount>> {
        let rows = self
            .rows(
                || "counting runs".to_owned(),
                &self.inner.sql.count_runs,
                &[],
            )
            .await?;
        let mut out = rows
            .iter()
            .map(|row| {
                let workflow = text(row, 0, "?")?;
                let status = text(row, 1, "?")?;
                let runs: i64 = row.try_get(2).map_err(|e| column("?", e))?;
                let status = RunStatus::ALL
                    .into_iter()
                    .find(|s| s.as_str() == status)
                    .ok_or_else(|| {
                        Error::database(
                            "counting runs",
                            std::io::Error::other(format!(
                                "a run has status `{status}`, which loops does not know"
                            )),
                        )
                    })?;
                Ok(loops_core::RunCount {
                    workflow,
                    status,
                    runs: u64::try_from(runs).unwrap_or(0),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        out.sort_by(|a, b| (&a.workflow, a.status.as_str()).cmp(&(&b.workflow, b.status.as_str())));
        Ok(out)
    }

    pub(crate) async fn read_children(&self, run_id: &str) -> Result<Vec<RunInfo>> {
        let action = || format!("listing the children of run `{run_id}`");
        let rows = self
            .rows(action, &self.inner.sql.children, &[&run_id])
            .await?;
        rows.iter()
            .map(|row| {
                let child = text(row, 0, "?")?;
                RunInfo::decode(&child, text(row, 1, &child)?.as_bytes())
            })
            .collect()
    }

    pub(crate) async fn read_schema(&self, hash: SchemaHash) -> Result<Option<String>> {
        let key = hash.to_string();
        let rows = self
            .rows(
                || format!("reading schema {hash}"),
                &self.inner.sql.schema,
                &[&key],
            )
            .await?;
        rows.first().map(|row| text(row, 0, "?")).transpose()
    }

    pub(crate) async fn read_schemas(&self) -> Result<Vec<(SchemaHash, String)>> {
        let rows = self
            .rows(
                || "reading schemas".to_owned(),
                &self.inner.sql.schemas,
                &[],
            )
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            // A key that is not a hash was not written by loops: skipped, as the redb store
            // skips it.
            if let Ok(hash) = text(row, 0, "?")?.parse() {
                out.push((hash, text(row, 1, "?")?));
            }
        }
        Ok(out)
    }

    pub(crate) async fn read_sealing_keys(&self) -> Result<Vec<String>> {
        let rows = self
            .rows(
                || "reading the keys that sealed payloads".to_owned(),
                &self.inner.sql.sealing_keys,
                &[],
            )
            .await?;
        rows.iter().map(|row| text(row, 0, "?")).collect()
    }

    pub(crate) async fn read_sealing_checks(&self) -> Result<Vec<(String, String)>> {
        let rows = self
            .rows(
                || "reading the check values of the sealing keys".to_owned(),
                &self.inner.sql.sealing_checks,
                &[],
            )
            .await?;
        rows.iter()
            .map(|row| Ok((text(row, 0, "?")?, text(row, 1, "?")?)))
            .collect()
    }

    pub(crate) async fn read_schedules(&self) -> Result<Vec<loops_core::ScheduleInfo>> {
        let rows = self
            .rows(
                || "reading schedules".to_owned(),
                &self.inner.sql.schedules,
                &[],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let name = text(row, 0, "?")?;
                loops_core::ScheduleInfo::decode(&name, text(row, 1, &name)?.as_bytes())
            })
            .collect()
    }

    pub(crate) async fn lease_acquire(&self, run_id: &str) -> Result<Option<Lease>> {
        let rows = self
            .rows(
                || format!("acquiring the lease of run `{run_id}`"),
                &self.inner.sql.acquire,
                &[&run_id, &self.inner.owner, &self.ttl_ms()],
            )
            .await?;
        rows.first()
            .map(|row| lease(row, run_id.to_owned(), 0))
            .transpose()
    }

    pub(crate) async fn lease_release(&self, lease: &Lease) -> Result<()> {
        self.inner.cache.forget(&lease.run_id);
        self.rows(
            || format!("releasing the lease of run `{}`", lease.run_id),
            &self.inner.sql.release,
            &[&lease.run_id, &big(lease.token)],
        )
        .await?;
        Ok(())
    }

    pub(crate) async fn lease_renew(&self, leases: &[Lease]) -> Result<Vec<Lease>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = leases.iter().map(|l| l.run_id.as_str()).collect();
        let tokens: Vec<i64> = leases.iter().map(|l| big(l.token)).collect();
        // On the renewals' own connection: never behind the writes waiting for the pool.
        let renewed = self
            .rows_on(
                &self.inner.lease_pool,
                || format!("renewing {} leases", leases.len()),
                &self.inner.sql.renew,
                &[&ids, &tokens, &self.ttl_ms()],
            )
            .await
            .and_then(|rows| {
                rows.iter()
                    .map(|row| {
                        let run_id = text(row, 0, "?")?;
                        lease(row, run_id, 1)
                    })
                    .collect::<Result<Vec<Lease>>>()
            });
        // A lease not renewed is lost (or may be): its row is not remembered.
        let kept: std::collections::HashSet<&str> = renewed
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|l| l.run_id.as_str())
            .collect();
        for lost in leases.iter().filter(|l| !kept.contains(l.run_id.as_str())) {
            self.inner.cache.forget(&lost.run_id);
        }
        renewed
    }

    pub(crate) async fn lease_claim_ready(
        &self,
        workflows: &[ClaimFilter],
        limit: usize,
    ) -> Result<Vec<(RunInfo, Lease)>> {
        if workflows.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<&str> = workflows.iter().map(|f| f.workflow.as_str()).collect();
        // (workflow, schema) pairs; a null schema admits every schema of the workflow.
        let mut pair_workflows: Vec<&str> = Vec::new();
        let mut pair_schemas: Vec<Option<String>> = Vec::new();
        for filter in workflows {
            match &filter.schemas {
                None => {
                    pair_workflows.push(&filter.workflow);
                    pair_schemas.push(None);
                }
                Some(schemas) => {
                    for hash in schemas {
                        pair_workflows.push(&filter.workflow);
                        pair_schemas.push(Some(hash.to_string()));
                    }
                }
            }
        }
        // This worker's sign of life, for the schemas it routes (docs/postgres.md, "Runs no
        // live worker can route"), every third of the lease time: `serve` polls at least
        // that often, so the rows are renewed well before they expire.
        let pairs: Announced = pair_workflows
            .iter()
            .map(|w| (*w).to_owned())
            .zip(pair_schemas.iter().cloned())
            .collect();
        let due = match &*self.announced() {
            Some((at, last)) => at.elapsed() >= self.inner.lease_ttl / 3 || *last != pairs,
            None => true,
        };
        if due {
            let asked = std::time::Instant::now();
            self.rows(
                || "announcing the schemas this worker routes".to_owned(),
                &self.inner.sql.announce,
                &[
                    &self.inner.owner,
                    &self.ttl_ms(),
                    &pair_workflows,
                    &pair_schemas,
                ],
            )
            .await?;
            *self.announced() = Some((asked, pairs));
        }
        let live_since = *self.inner.live_since.get_or_init(std::time::Instant::now);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let may_block = live_since.elapsed() >= self.inner.lease_ttl;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .rows(
                || "claiming runs that need a driver".to_owned(),
                &self.inner.sql.claim_ready,
                &[
                    &names,
                    &limit,
                    &self.inner.owner,
                    &self.ttl_ms(),
                    &pair_workflows,
                    &pair_schemas,
                    &may_block,
                ],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let run_id = text(row, 0, "?")?;
                let lease = lease(row, run_id.clone(), 1)?;
                let info = RunInfo::decode(&run_id, text(row, 3, &run_id)?.as_bytes())?;
                Ok((info, lease))
            })
            .collect()
    }
}

impl PgStore {
    /// The time and pairs of this worker's last announcement (a poisoned lock is taken as
    /// it is: the value is replaced whole).
    fn announced(&self) -> std::sync::MutexGuard<'_, Option<(std::time::Instant, Announced)>> {
        self.inner
            .announced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A lease from a row whose columns `first` and `first + 1` are its token and expiry.
fn lease(row: &Row, run_id: String, first: usize) -> Result<Lease> {
    let token: i64 = row.try_get(first).map_err(|e| column(&run_id, e))?;
    let expires: i64 = row.try_get(first + 1).map_err(|e| column(&run_id, e))?;
    Ok(Lease {
        run_id,
        token: token as u64,
        expires_ms: Some(expires.max(0) as u64),
    })
}

/// A row of a listing, `(run_id, info)`: the run's row.
fn listed(row: &Row) -> Result<RunInfo> {
    let run_id = text(row, 0, "?")?;
    RunInfo::decode(&run_id, text(row, 1, &run_id)?.as_bytes())
}

/// The text column `i` of `row`.
pub(crate) fn text(row: &Row, i: usize, run_id: &str) -> Result<String> {
    row.try_get(i).map_err(|e| column(run_id, e))
}

/// A column of an unexpected type: the schema was altered outside loops.
pub(crate) fn column(run_id: &str, e: tokio_postgres::Error) -> Error {
    Error::database(format!("reading a row of run `{run_id}`"), e)
}

pub(crate) fn decode_transition(run_id: &str, seq: u64, json: &str) -> Result<TransitionRecord> {
    TransitionRecord::from_stored(run_id, seq, json.as_bytes())
}

pub(crate) fn decode_event(run_id: &str, event_seq: u64, json: &str) -> Result<EventRecord> {
    serde_json::from_str(json).map_err(|source| Error::Decode {
        run_id: run_id.to_owned(),
        record: RecordKind::Event { name: None },
        seq: event_seq,
        state: String::new(),
        source,
    })
}

/// The `(name, occurrence, record)` of a step row whose columns start at `first`; `seq`
/// names the state in a decode error.
fn step_row(
    row: &tokio_postgres::Row,
    first: usize,
    run_id: &str,
    seq: u64,
) -> Result<(String, u32, StepRecord)> {
    let name = text(row, first, run_id)?;
    let occurrence: i32 = row.try_get(first + 1).map_err(|e| column(run_id, e))?;
    let record: StepRecord =
        serde_json::from_str(&text(row, first + 2, run_id)?).map_err(|source| Error::Decode {
            run_id: run_id.to_owned(),
            record: RecordKind::Step {
                name: name.clone(),
                occurrence: occurrence as u32,
            },
            seq,
            state: String::new(),
            source,
        })?;
    Ok((name, occurrence as u32, record))
}
