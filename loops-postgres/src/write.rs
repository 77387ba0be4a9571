//! The commit path: each [`Write`] in one PostgreSQL transaction, with the semantics of the
//! redb store's `apply` (every precondition, every error), plus the lease check.
//!
//! A write takes two round trips on one connection, each a pipeline of statements:
//! 1. `BEGIN`; lock the lease row (`FOR UPDATE`, if the write carries a lease); lock the run's
//!    row (`FOR UPDATE`); and the reads the write needs (the next failure index, the oldest
//!    pending event, ...), which run after the locks are held.
//! 2. After the checks, made here: the inserts and the row update, then `COMMIT`. If any
//!    statement fails, PostgreSQL aborts the transaction and the `COMMIT` rolls it back; a
//!    unique violation there is a taken key (`SequenceConflict`, `StepExists`).
//!
//! A write refused by its checks is rolled back and leaves no trace. If the connection fails
//! during the first round trip, nothing was written and the write is tried again on another
//! connection; if it fails during the second, whether it committed is unknown and the caller
//! gets [`Error::Database`].

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use deadpool_postgres::Object;
use loops_core::store::{
    AfterFailure, Lease, Reply, RunInfo, RunStatus, WaitInfo, WaitOutcome, Write,
};
use loops_core::{Error, RecordKind, Result, StepRecord};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};

use crate::guard::Guard;
use crate::read::{decode_event, decode_info, text};
use crate::sql::Sql;
use crate::{PgStore, big, is_connection_error};

/// Attempts of a write whose connection fails before its commit, on fresh connections.
const TRIES: usize = 3;

/// Why a write did not commit.
enum Fail {
    /// Refused by its checks; the connection has no transaction open.
    Rejected(Error),
    /// The connection failed before anything was sent for commit: nothing took effect, and
    /// the write may be tried again on another connection.
    Retry(tokio_postgres::Error),
    /// Failed otherwise; the connection's state is unknown and it is dropped.
    Broken(Error),
}

impl PgStore {
    pub(crate) async fn write_impl(&self, lease: Option<&Lease>, write: Write) -> Result<Reply> {
        let action = || describe(&write);
        self.timed(action, self.write_untimed(lease, &write)).await
    }

    async fn write_untimed(&self, lease: Option<&Lease>, write: &Write) -> Result<Reply> {
        let action = || describe(write);
        if let Write::Prune { run_ids } = &write {
            let rows = self.rows(action, &self.inner.sql.prune, &[run_ids]).await?;
            let records = rows
                .first()
                .map(|row| row.try_get::<_, i64>(1))
                .transpose()
                .map_err(|e| Error::database(action(), e))?
                .unwrap_or(0);
            return Ok(Reply::Pruned {
                records: records as u64,
            });
        }
        let mut tries = 0;
        loop {
            tries += 1;
            let guard = Guard(Some(self.client(action).await?));
            match apply(guard.client(), &self.inner.sql, lease, write).await {
                Ok(reply) => {
                    guard.keep();
                    return Ok(reply);
                }
                Err(Fail::Rejected(e)) => {
                    guard.keep();
                    return Err(e);
                }
                Err(Fail::Retry(e)) if tries < TRIES => {
                    tracing::debug!(error = %e, "connection failed before the commit; trying again");
                }
                Err(Fail::Retry(e)) => return Err(Error::database(action(), e)),
                Err(Fail::Broken(e)) => return Err(e),
            }
        }
    }
}

/// What a write is doing, for errors.
fn describe(write: &Write) -> String {
    match write {
        Write::Create { info, .. } => format!("creating run `{}`", info.run_id),
        Write::Transition { run_id, seq, .. } => {
            format!("committing seq {seq} of run `{run_id}`")
        }
        Write::Step {
            run_id, seq, name, ..
        } => format!("recording step `{name}` of run `{run_id}` seq {seq}"),
        Write::Failure { run_id, seq, .. } => {
            format!("recording a failure of run `{run_id}` seq {seq}")
        }
        Write::BeginAttempt { run_id, seq, .. } => {
            format!("starting an attempt of run `{run_id}` seq {seq}")
        }
        Write::Cancel { run_id, .. } => format!("cancelling run `{run_id}`"),
        Write::EndCancelled { run_id, .. } => format!("ending cancelled run `{run_id}`"),
        Write::Retry { run_id, .. } => format!("retrying run `{run_id}`"),
        Write::Wait { run_id, seq, .. } => format!("recording a wait of run `{run_id}` seq {seq}"),
        Write::Send { run_id, name, .. } => format!("sending event `{name}` to run `{run_id}`"),
        Write::Wake { run_id, .. } => format!("waking run `{run_id}`"),
        Write::Prune { run_ids } => format!("pruning {} runs", run_ids.len()),
    }
}

/// A failure of the first round trip (before anything was sent for commit).
fn early(action: &str, e: tokio_postgres::Error) -> Fail {
    if is_connection_error(&e)
        || e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED)
        || e.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE)
    {
        Fail::Retry(e)
    } else {
        Fail::Broken(Error::database(action, e))
    }
}

async fn prepare(
    c: &Object,
    action: &str,
    statements: &[&str],
) -> std::result::Result<Vec<Statement>, Fail> {
    let mut out = Vec::with_capacity(statements.len());
    for s in statements {
        out.push(c.prepare_cached(s).await.map_err(|e| early(action, e))?);
    }
    Ok(out)
}

/// Rolls the open transaction back and returns the refusal.
async fn reject(c: &Object, e: Error) -> Fail {
    match c.batch_execute("ROLLBACK").await {
        Ok(()) => Fail::Rejected(e),
        Err(_) => Fail::Broken(e),
    }
}

/// Rolls back a transaction that wrote nothing and returns `reply`.
async fn unchanged(c: &Object, reply: Reply) -> std::result::Result<Reply, Fail> {
    c.batch_execute("ROLLBACK")
        .await
        .map_err(|e| Fail::Broken(Error::database("rolling back", e)))?;
    Ok(reply)
}

/// What the first round trip read: the lease row (if a lease was given), the run's row, and
/// the write's own reads.
struct Locked {
    lease: Option<Option<Row>>,
    info: Option<RunInfo>,
    extra: Vec<Option<Row>>,
}

/// A statement's future in a pipeline: its rows (at most one is kept), or nothing.
type Step<'a> = Pin<
    Box<dyn Future<Output = std::result::Result<Option<Row>, tokio_postgres::Error>> + Send + 'a>,
>;

/// Awaits `futures` together, polling them in order: each sends its statement when first
/// polled, so they go to the server in this order, in one round trip.
async fn pipeline<T>(futures: Vec<Pin<Box<dyn Future<Output = T> + Send + '_>>>) -> Vec<T> {
    let mut futures = futures;
    let mut done: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in futures.iter_mut().zip(done.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

/// The first round trip: `BEGIN`, the locks, and `extra` (statement and parameters, each
/// answering at most one row), pipelined.
async fn begin(
    c: &Object,
    sql: &Sql,
    action: &str,
    lease: Option<&Lease>,
    run_id: &str,
    extra: &[(&str, &[&(dyn ToSql + Sync)])],
) -> std::result::Result<Locked, Fail> {
    let mut names: Vec<&str> = vec![&sql.lock_lease, &sql.lock_run];
    names.extend(extra.iter().map(|(s, _)| *s));
    let prepared = prepare(c, action, &names).await?;
    let client: &tokio_postgres::Client = c;
    let mut steps: Vec<Step<'_>> = vec![Box::pin(async move {
        client.batch_execute("BEGIN").await.map(|()| None)
    })];
    if let Some(l) = lease {
        let st = &prepared[0];
        steps.push(Box::pin(
            async move { client.query_opt(st, &[&l.run_id]).await },
        ));
    }
    let st = &prepared[1];
    steps.push(Box::pin(
        async move { client.query_opt(st, &[&run_id]).await },
    ));
    for ((_, params), st) in extra.iter().zip(&prepared[2..]) {
        steps.push(Box::pin(async move { client.query_opt(st, params).await }));
    }
    let mut results = pipeline(steps).await.into_iter();
    let mut next = || -> std::result::Result<Option<Row>, Fail> {
        match results.next() {
            Some(r) => r.map_err(|e| early(action, e)),
            None => Ok(None),
        }
    };
    next()?;
    let lease_row = match lease {
        Some(_) => Some(next()?),
        None => None,
    };
    let run_row = next()?;
    let mut extra_out = Vec::with_capacity(extra.len());
    for _ in extra {
        extra_out.push(next()?);
    }
    let info = match run_row {
        Some(row) => {
            let json = text(&row, 0, run_id).map_err(Fail::Broken)?;
            match decode_info(run_id, &json) {
                Ok(info) => Some(info),
                Err(e) => return Err(reject(c, e).await),
            }
        }
        None => None,
    };
    Ok(Locked {
        lease: lease_row,
        info,
        extra: extra_out,
    })
}

impl Locked {
    /// Refuses the write unless the lease given (if any) is the run's current, live lease.
    /// `seq` is the sequence number the write is for.
    fn check_lease(&self, lease: Option<&Lease>, run_id: &str, seq: u64) -> Result<()> {
        let (Some(lease), Some(row)) = (lease, &self.lease) else {
            return Ok(());
        };
        let held = lease.run_id == run_id
            && row.as_ref().is_some_and(|row| {
                row.try_get::<_, i64>(0).ok() == Some(big(lease.token))
                    && row.try_get::<_, bool>(1).unwrap_or(false)
            });
        if held {
            return Ok(());
        }
        Err(Error::Fenced {
            run_id: run_id.to_owned(),
            seq,
            current: self.info.as_ref().map_or(0, |i| i.seq),
            status: self.info.as_ref().map_or(RunStatus::Running, |i| i.status),
        })
    }

    /// The run's row, or `RunNotFound`.
    fn run(&self, run_id: &str) -> Result<RunInfo> {
        self.info.clone().ok_or_else(|| Error::RunNotFound {
            run_id: run_id.to_owned(),
        })
    }
}

/// Refuses a write for `seq` unless the run is at `seq` and has not ended.
fn fence(info: &RunInfo, seq: u64) -> Result<()> {
    if info.seq != seq || info.status.is_ended() {
        return Err(Error::Fenced {
            run_id: info.run_id.clone(),
            seq,
            current: info.seq,
            status: info.status,
        });
    }
    Ok(())
}

/// The columns of a run's row.
struct RowValues {
    status: &'static str,
    seq: i64,
    wait_event: Option<String>,
    wait_until_ms: Option<i64>,
    info: String,
}

fn row_values(info: &RunInfo) -> RowValues {
    RowValues {
        status: info.status.as_str(),
        seq: big(info.seq),
        wait_event: info.wait.as_ref().and_then(|w| w.event.clone()),
        wait_until_ms: info.wait.as_ref().and_then(|w| w.until_ms).map(big),
        info: json(info),
    }
}

fn json<T: serde::Serialize>(value: &T) -> String {
    // Our record types hold only strings, integers and valid raw JSON: they always serialize.
    serde_json::to_string(value).unwrap_or_else(|_| "{}".to_owned())
}

fn utf8(bytes: &[u8]) -> &str {
    // Records are serde_json output: always UTF-8.
    std::str::from_utf8(bytes).unwrap_or("{}")
}

/// The outcome of the second round trip: `results` of the writes pipelined with `COMMIT`.
/// The first failed write decides: a unique violation maps through `taken`, anything else is
/// an error of unknown outcome.
fn finish(
    action: &str,
    results: Vec<std::result::Result<u64, tokio_postgres::Error>>,
    commit: std::result::Result<(), tokio_postgres::Error>,
    taken: impl FnOnce(usize) -> Option<Error>,
) -> std::result::Result<(), Fail> {
    for (i, result) in results.into_iter().enumerate() {
        if let Err(e) = result {
            if e.code() == Some(&SqlState::UNIQUE_VIOLATION)
                && commit.is_ok()
                && let Some(refusal) = taken(i)
            {
                return Err(Fail::Rejected(refusal));
            }
            return Err(Fail::Broken(Error::database(action, e)));
        }
    }
    commit.map_err(|e| Fail::Broken(Error::database(action, e)))
}

/// Sends `writes` (each a prepared statement and its parameters) and `COMMIT`, pipelined.
async fn commit(
    c: &Object,
    writes: &[(&Statement, &[&(dyn ToSql + Sync)])],
) -> (
    Vec<std::result::Result<u64, tokio_postgres::Error>>,
    std::result::Result<(), tokio_postgres::Error>,
) {
    type Sent<'a> = Pin<
        Box<
            dyn Future<Output = std::result::Result<Option<u64>, tokio_postgres::Error>>
                + Send
                + 'a,
        >,
    >;
    let client: &tokio_postgres::Client = c;
    let mut steps: Vec<Sent<'_>> = writes
        .iter()
        .map(|(st, params)| -> Sent<'_> {
            let st: &Statement = st;
            let params: &[&(dyn ToSql + Sync)] = params;
            Box::pin(async move { client.execute(st, params).await.map(Some) })
        })
        .collect();
    steps.push(Box::pin(async move {
        client.batch_execute("COMMIT").await.map(|()| None)
    }));
    let mut results = pipeline(steps).await;
    let committed = results.pop().map_or(Ok(()), |r| r.map(|_| ()));
    let results = results
        .into_iter()
        .map(|r| r.map(|n| n.unwrap_or(0)))
        .collect();
    (results, committed)
}

/// Applies `write` in one transaction on `c`.
async fn apply(
    c: &Object,
    sql: &Sql,
    lease: Option<&Lease>,
    write: &Write,
) -> std::result::Result<Reply, Fail> {
    let action = describe(write);
    let action = action.as_str();
    match write {
        Write::Create {
            info,
            record,
            schema_text,
        } => {
            let run_id = info.run_id.as_str();
            let locked = begin(c, sql, action, lease, run_id, &[]).await?;
            if let Err(e) = locked.check_lease(lease, run_id, 0) {
                return Err(reject(c, e).await);
            }
            let conflict = || Error::SequenceConflict {
                run_id: run_id.to_owned(),
                seq: 0,
            };
            if locked.info.is_some() {
                return Err(reject(c, conflict()).await);
            }
            let st = prepare(
                c,
                action,
                &[&sql.insert_journal, &sql.insert_schema, &sql.insert_run],
            )
            .await?;
            let v = row_values(info);
            let hash = info.schema.to_string();
            let record = utf8(record);
            let (results, committed) = commit(
                c,
                &[
                    (&st[0], &[&run_id, &0i64, &record]),
                    (&st[1], &[&hash, schema_text]),
                    (
                        &st[2],
                        &[
                            &run_id,
                            &info.workflow,
                            &v.status,
                            &v.seq,
                            &v.wait_event,
                            &v.wait_until_ms,
                            &v.info,
                        ],
                    ),
                ],
            )
            .await;
            finish(action, results, committed, |i| (i != 1).then(conflict))?;
            Ok(Reply::Run(info.clone()))
        }
        Write::Transition {
            run_id,
            seq,
            state,
            record,
            terminal,
            at_ms,
        } => {
            let locked = begin(c, sql, action, lease, run_id, &[]).await?;
            let checked = locked
                .check_lease(lease, run_id, seq.wrapping_sub(1))
                .and_then(|()| locked.run(run_id))
                .and_then(|info| fence(&info, seq.wrapping_sub(1)).map(|()| info));
            let mut info = match checked {
                Ok(info) => info,
                Err(e) => return Err(reject(c, e).await),
            };
            info.seq = *seq;
            info.state.clone_from(state);
            info.attempt = 1;
            info.attempt_base = 0;
            info.interrupted = 0;
            info.updated_ms = *at_ms;
            info.retry_at_ms = None;
            info.error = None;
            if *terminal {
                info.status = RunStatus::Completed;
            }
            let st = prepare(c, action, &[&sql.insert_journal, &sql.update_run]).await?;
            let v = row_values(&info);
            let record = utf8(record);
            let seq_big = big(*seq);
            let (results, committed) = commit(
                c,
                &[
                    (&st[0], &[run_id, &seq_big, &record]),
                    (
                        &st[1],
                        &[
                            run_id,
                            &v.status,
                            &v.seq,
                            &v.wait_event,
                            &v.wait_until_ms,
                            &v.info,
                        ],
                    ),
                ],
            )
            .await;
            finish(action, results, committed, |i| {
                (i == 0).then(|| Error::SequenceConflict {
                    run_id: run_id.clone(),
                    seq: *seq,
                })
            })?;
            Ok(Reply::Run(info))
        }
        Write::Step {
            run_id,
            seq,
            name,
            occurrence,
            record,
        } => {
            let locked = begin(c, sql, action, lease, run_id, &[]).await?;
            let checked = locked
                .check_lease(lease, run_id, *seq)
                .and_then(|()| locked.run(run_id))
                .and_then(|info| fence(&info, *seq));
            if let Err(e) = checked {
                return Err(reject(c, e).await);
            }
            let st = prepare(c, action, &[&sql.insert_step]).await?;
            let record = utf8(record);
            let occ = *occurrence as i32;
            let seq_big = big(*seq);
            let (results, committed) =
                commit(c, &[(&st[0], &[run_id, &seq_big, name, &occ, &record])]).await;
            finish(action, results, committed, |_| {
                Some(Error::StepExists {
                    run_id: run_id.clone(),
                    seq: *seq,
                    step: name.clone(),
                    occurrence: *occurrence,
                })
            })?;
            Ok(Reply::Done)
        }
        Write::Failure {
            run_id,
            seq,
            record,
            then,
        } => {
            let seq_big = big(*seq);
            let attempt = record.attempt as i32;
            let locked = begin(
                c,
                sql,
                action,
                lease,
                run_id,
                &[(&sql.next_failure_index, &[run_id, &seq_big, &attempt])],
            )
            .await?;
            let checked = locked
                .check_lease(lease, run_id, *seq)
                .and_then(|()| locked.run(run_id))
                .and_then(|info| fence(&info, *seq).map(|()| info));
            let mut info = match checked {
                Ok(info) => info,
                Err(e) => return Err(reject(c, e).await),
            };
            let index: i32 = match locked.extra[0].as_ref().map(|r| r.try_get(0)) {
                Some(Ok(i)) => i,
                Some(Err(e)) => return Err(Fail::Broken(Error::database(action, e))),
                None => 0,
            };
            info.error = Some(record.errors.clone());
            info.updated_ms = record.at_ms;
            match then {
                AfterFailure::Nothing => {}
                AfterFailure::RetryAt(at) => info.retry_at_ms = Some(*at),
                AfterFailure::GiveUp => {
                    info.status = RunStatus::Failed;
                    info.retry_at_ms = None;
                }
            }
            let st = prepare(c, action, &[&sql.insert_failure, &sql.update_run]).await?;
            let v = row_values(&info);
            let failure = json(record);
            let (results, committed) = commit(
                c,
                &[
                    (&st[0], &[run_id, &seq_big, &attempt, &index, &failure]),
                    (
                        &st[1],
                        &[
                            run_id,
                            &v.status,
                            &v.seq,
                            &v.wait_event,
                            &v.wait_until_ms,
                            &v.info,
                        ],
                    ),
                ],
            )
            .await;
            finish(action, results, committed, |_| None)?;
            Ok(Reply::Run(info))
        }
        Write::BeginAttempt {
            run_id,
            seq,
            max_attempts,
            max_interruptions,
            at_ms,
        } => {
            let locked = begin(c, sql, action, lease, run_id, &[]).await?;
            let checked = locked
                .check_lease(lease, run_id, *seq)
                .and_then(|()| locked.run(run_id));
            let mut info = match checked {
                Ok(info) => info,
                Err(e) => return Err(reject(c, e).await),
            };
            if info.status != RunStatus::Running {
                return unchanged(c, Reply::Run(info)).await;
            }
            if let Err(e) = fence(&info, *seq) {
                return Err(reject(c, e).await);
            }
            let st = prepare(
                c,
                action,
                &[&sql.has_failure, &sql.insert_failure, &sql.update_run],
            )
            .await?;
            let seq_big = big(*seq);
            let attempt = info.attempt as i32;
            let failed: bool = c
                .query_one(&st[0], &[run_id, &seq_big, &attempt])
                .await
                .and_then(|row| row.try_get(0))
                .map_err(|e| early(action, e))?;
            let interrupted = info.begin_attempt(failed, *at_ms, *max_attempts, *max_interruptions);
            let v = row_values(&info);
            let failure = interrupted.as_ref().map(json);
            let update: (&Statement, &[&(dyn ToSql + Sync)]) = (
                &st[2],
                &[
                    run_id,
                    &v.status,
                    &v.seq,
                    &v.wait_event,
                    &v.wait_until_ms,
                    &v.info,
                ],
            );
            let (results, committed) = match &failure {
                Some(failure) => {
                    commit(
                        c,
                        &[
                            (&st[1], &[run_id, &seq_big, &attempt, &0i32, failure]),
                            update,
                        ],
                    )
                    .await
                }
                None => commit(c, &[update]).await,
            };
            finish(action, results, committed, |_| None)?;
            Ok(Reply::Run(info))
        }
        Write::Cancel {
            run_id,
            reason,
            end_now,
            at_ms,
        } => {
            let locked = begin(c, sql, action, lease, run_id, &[]).await?;
            let checked = locked
                .run(run_id)
                .and_then(|info| locked.check_lease(lease, run_id, info.seq).map(|()| info));
            let mut info = match checked {
                Ok(info) => info,
                Err(e) => return Err(reject(c, e).await),
            };
            if info.status.is_ended() {
                let e = Error::RunEnded {
                    run_id: run_id.clone(),
                    status: info.status,
                    action: "cancel",
                };
                return Err(reject(c, e).await);
            }
            info.cancel = Some(reason.clone());
            if *end_now {
                info.status = RunStatus::Cancelled;
            }
            info.updated_ms = *at_ms;
            update_only(c, sql, action, info).await
        }
        Write::EndCancelled { run_id, at_ms } => {
            let locked = begin(c, sql, action, lease, run_id, &[]).await?;
            let checked = locked
                .run(run_id)
                .and_then(|info| locked.check_lease(lease, run_id, info.seq).map(|()| info));
            let mut info = match checked {
                Ok(info) => info,
                Err(e) => return Err(reject(c, e).await),
            };
            if info.status.is_ended() || info.cancel.is_none() {
                return unchanged(c, Reply::Run(info)).await;
            }
            info.status = RunStatus::Cancelled;
            info.updated_ms = *at_ms;
            update_only(c, sql, action, info).await
        }
        Write::Retry { run_id, at_ms } => {
            let locked = begin(c, sql, action, lease, run_id, &[]).await?;
            let checked = locked
                .run(run_id)
                .and_then(|info| locked.check_lease(lease, run_id, info.seq).map(|()| info));
            let mut info = match checked {
                Ok(info) => info,
                Err(e) => return Err(reject(c, e).await),
            };
            if info.status != RunStatus::Failed {
                let e = Error::NotFailed {
                    run_id: run_id.clone(),
                    status: info.status,
                };
                return Err(reject(c, e).await);
            }
            info.status = RunStatus::Running;
            info.attempt_base = info.attempt;
            info.interrupted = 0;
            info.retry_at_ms = None;
            info.updated_ms = *at_ms;
            update_only(c, sql, action, info).await
        }
        Write::Wake { run_id, seq, at_ms } => {
            let locked = begin(c, sql, action, lease, run_id, &[]).await?;
            let checked = locked
                .check_lease(lease, run_id, *seq)
                .and_then(|()| locked.run(run_id));
            let mut info = match checked {
                Ok(info) => info,
                Err(e) => return Err(reject(c, e).await),
            };
            if info.status != RunStatus::Waiting || info.seq != *seq {
                return unchanged(c, Reply::Run(info)).await;
            }
            info.status = RunStatus::Running;
            info.wait = None;
            info.updated_ms = *at_ms;
            update_only(c, sql, action, info).await
        }
        Write::Wait {
            run_id,
            seq,
            attempt,
            step,
            event,
            until_ms,
            at_ms,
        } => {
            let seq_big = big(*seq);
            let (step_name, occurrence) = match step {
                Some((name, occurrence)) => (name.as_str(), *occurrence as i32),
                None => ("", 0),
            };
            let event_name = event.as_deref().unwrap_or_default();
            let mut extra: Vec<(&str, &[&(dyn ToSql + Sync)])> = Vec::new();
            let step_params: [&(dyn ToSql + Sync); 4] = [run_id, &seq_big, &step_name, &occurrence];
            let event_params: [&(dyn ToSql + Sync); 2] = [run_id, &event_name];
            if step.is_some() {
                extra.push((&sql.step_exists, &step_params));
            }
            if event.is_some() {
                extra.push((&sql.first_pending, &event_params));
            }
            let locked = begin(c, sql, action, lease, run_id, &extra).await?;
            let checked = locked
                .check_lease(lease, run_id, *seq)
                .and_then(|()| locked.run(run_id))
                .and_then(|info| fence(&info, *seq).map(|()| info));
            let mut info = match checked {
                Ok(info) => info,
                Err(e) => return Err(reject(c, e).await),
            };
            let mut rows = locked.extra.into_iter();
            if let Some((name, occurrence)) = step {
                let exists = rows
                    .next()
                    .flatten()
                    .is_some_and(|row| row.try_get::<_, bool>(0).unwrap_or(false));
                if exists {
                    let e = Error::StepExists {
                        run_id: run_id.clone(),
                        seq: *seq,
                        step: name.clone(),
                        occurrence: *occurrence,
                    };
                    return Err(reject(c, e).await);
                }
            }
            let delivered = match rows.next().flatten() {
                Some(row) if event.is_some() => {
                    let event_seq: i64 = row
                        .try_get(0)
                        .map_err(|e| Fail::Broken(Error::database(action, e)))?;
                    let record_text = text(&row, 1, run_id).map_err(Fail::Broken)?;
                    match decode_event(run_id, event_seq as u64, &record_text) {
                        Ok(record) => Some((event_seq as u64, record.payload.get().to_owned())),
                        Err(Error::Decode { source, .. }) => {
                            let e = Error::Decode {
                                run_id: run_id.clone(),
                                record: RecordKind::Event {
                                    name: Some(event_name.to_owned()),
                                },
                                seq: event_seq as u64,
                                state: String::new(),
                                source,
                            };
                            return Err(reject(c, e).await);
                        }
                        Err(e) => return Err(reject(c, e).await),
                    }
                }
                _ => None,
            };
            let (outcome, output) = if let Some((event_seq, payload)) = delivered {
                let output = format!(r#"{{"event":{{"seq":{event_seq},"payload":{payload}}}}}"#);
                (WaitOutcome::Delivered { event_seq, payload }, Some(output))
            } else if until_ms.is_some_and(|until| until <= *at_ms) {
                (WaitOutcome::Due, Some(r#""due""#.to_owned()))
            } else {
                (WaitOutcome::Parked, None)
            };
            if outcome == WaitOutcome::Parked {
                info.status = RunStatus::Waiting;
                info.wait = Some(WaitInfo {
                    event: event.clone(),
                    until_ms: *until_ms,
                });
            } else {
                info.status = RunStatus::Running;
                info.wait = None;
            }
            info.updated_ms = *at_ms;
            let step_record = match (step, output) {
                (Some(_), Some(output)) => {
                    let output = match serde_json::value::RawValue::from_string(output) {
                        Ok(output) => output,
                        Err(source) => {
                            let e = Error::Decode {
                                run_id: run_id.clone(),
                                record: RecordKind::Step {
                                    name: step_name.to_owned(),
                                    occurrence: occurrence as u32,
                                },
                                seq: *seq,
                                state: String::new(),
                                source,
                            };
                            return Err(reject(c, e).await);
                        }
                    };
                    Some(json(&StepRecord {
                        attempt: *attempt,
                        at_ms: *at_ms,
                        duration_ms: 0,
                        output,
                    }))
                }
                _ => None,
            };
            let st = prepare(
                c,
                action,
                &[&sql.insert_step, &sql.mark_delivered, &sql.update_run],
            )
            .await?;
            let v = row_values(&info);
            let delivered_seq = match &outcome {
                WaitOutcome::Delivered { event_seq, .. } => Some(big(*event_seq)),
                _ => None,
            };
            let mut writes: Vec<(&Statement, &[&(dyn ToSql + Sync)])> = Vec::new();
            let step_insert: [&(dyn ToSql + Sync); 5];
            if let Some(record) = &step_record {
                step_insert = [run_id, &seq_big, &step_name, &occurrence, record];
                writes.push((&st[0], &step_insert));
            }
            let mark: [&(dyn ToSql + Sync); 2];
            if let Some(event_seq) = &delivered_seq {
                mark = [run_id, event_seq];
                writes.push((&st[1], &mark));
            }
            let update: [&(dyn ToSql + Sync); 6] = [
                run_id,
                &v.status,
                &v.seq,
                &v.wait_event,
                &v.wait_until_ms,
                &v.info,
            ];
            writes.push((&st[2], &update));
            let (results, committed) = commit(c, &writes).await;
            let has_step = step_record.is_some();
            finish(action, results, committed, |i| {
                (has_step && i == 0).then(|| Error::StepExists {
                    run_id: run_id.clone(),
                    seq: *seq,
                    step: step_name.to_owned(),
                    occurrence: occurrence as u32,
                })
            })?;
            Ok(Reply::Waited(outcome, info))
        }
        Write::Send {
            run_id,
            name,
            payload,
            key,
            at_ms,
        } => {
            let key_text = key.as_deref().unwrap_or_default();
            let key_params: [&(dyn ToSql + Sync); 2] = [run_id, &key_text];
            let seq_params: [&(dyn ToSql + Sync); 1] = [run_id];
            let locked = begin(
                c,
                sql,
                action,
                lease,
                run_id,
                &[
                    (&sql.event_by_key, &key_params),
                    (&sql.next_event_seq, &seq_params),
                ],
            )
            .await?;
            let checked = locked
                .run(run_id)
                .and_then(|info| locked.check_lease(lease, run_id, info.seq).map(|()| info));
            let info = match checked {
                Ok(info) => info,
                Err(e) => return Err(reject(c, e).await),
            };
            if info.status.is_ended() {
                let e = Error::RunEnded {
                    run_id: run_id.clone(),
                    status: info.status,
                    action: "sending an event",
                };
                return Err(reject(c, e).await);
            }
            let mut rows = locked.extra.into_iter();
            let existing = rows.next().flatten();
            if key.is_some()
                && let Some(row) = existing
            {
                let event_seq: i64 = row
                    .try_get(0)
                    .map_err(|e| Fail::Broken(Error::database(action, e)))?;
                return unchanged(
                    c,
                    Reply::Sent {
                        event_seq: event_seq as u64,
                        duplicate: true,
                        info,
                    },
                )
                .await;
            }
            let event_seq: i64 = match rows.next().flatten().map(|row| row.try_get(0)) {
                Some(Ok(n)) => n,
                Some(Err(e)) => return Err(Fail::Broken(Error::database(action, e))),
                None => 0,
            };
            // The same bytes as the redb store writes.
            let record = format!(
                r#"{{"name":{},{}"at_ms":{at_ms},"payload":{payload}}}"#,
                json(name),
                key.as_ref()
                    .map(|k| format!(r#""key":{},"#, json(k)))
                    .unwrap_or_default(),
            );
            let st = prepare(c, action, &[&sql.insert_event]).await?;
            let (results, committed) =
                commit(c, &[(&st[0], &[run_id, &event_seq, name, key, &record])]).await;
            finish(action, results, committed, |_| None)?;
            Ok(Reply::Sent {
                event_seq: event_seq as u64,
                duplicate: false,
                info,
            })
        }
        // Handled by `write_impl` (one statement).
        Write::Prune { .. } => Err(Fail::Broken(Error::database(
            action,
            std::io::Error::other("prune is not applied in a transaction"),
        ))),
    }
}

/// The second round trip of a write that only changes the run's row.
async fn update_only(
    c: &Object,
    sql: &Sql,
    action: &str,
    info: RunInfo,
) -> std::result::Result<Reply, Fail> {
    let st = prepare(c, action, &[&sql.update_run]).await?;
    let v = row_values(&info);
    let (results, committed) = commit(
        c,
        &[(
            &st[0],
            &[
                &info.run_id,
                &v.status,
                &v.seq,
                &v.wait_event,
                &v.wait_until_ms,
                &v.info,
            ],
        )],
    )
    .await;
    finish(action, results, committed, |_| None)?;
    Ok(Reply::Run(info))
}
