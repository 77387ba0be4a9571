//! The statements that write a plan's [`Effects`] out, and the pipeline that sends them
//! with `COMMIT` ([`send`]), whose outcome [`finish`] reads: the second round trip of
//! `write.rs`. The one-round-trip path of lease holders (`fast.rs`) shares the row's
//! columns ([`row_columns`]).

use std::future::Future;
use std::pin::Pin;

use deadpool_postgres::Object;
use loops_core::{Effects, Error, InboxChange, Record, RowWrite, ScheduleChange};
use tokio_postgres::Statement;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::pipeline::pipeline;
use crate::sql::Sql;
use crate::{big, is_connection_error};

/// The `store` label of this store's metrics ([`loops_core::metrics`]).
pub(crate) const STORE_LABEL: &str = "postgres";

/// Why a write did not commit.
pub(crate) enum Fail {
    /// Refused by its checks; the connection has no transaction open.
    Rejected(Error),
    /// The connection failed before anything was sent for commit: nothing took effect, and
    /// the write may be tried again on another connection.
    Retry(tokio_postgres::Error),
    /// Failed otherwise; the connection's state is unknown and it is dropped.
    Broken(Error),
}

/// A failure of the first round trip (before anything was sent for commit).
pub(crate) fn early(action: &str, e: tokio_postgres::Error) -> Fail {
    if is_connection_error(&e)
        || e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED)
        || e.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE)
    {
        Fail::Retry(e)
    } else {
        Fail::Broken(Error::database(action, e))
    }
}

pub(crate) async fn prepare(
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

/// A parameter of a statement.
pub(crate) type Param = Box<dyn ToSql + Sync + Send>;

/// A statement and its parameters.
pub(crate) struct Stmt<'a> {
    pub(crate) sql: &'a str,
    pub(crate) params: Vec<Param>,
}

pub(crate) fn statement<'a>(sql: &'a str, params: Vec<Param>) -> Stmt<'a> {
    Stmt { sql, params }
}

impl Stmt<'_> {
    /// The parameters, as tokio-postgres takes them.
    pub(crate) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| &**p as &(dyn ToSql + Sync))
            .collect()
    }
}

/// The statements that write a plan's effects out.
pub(crate) struct Writes<'a> {
    /// Each statement, with the refusal a unique violation of it means.
    pub(crate) statements: Vec<(Stmt<'a>, Option<Error>)>,
    /// The run's new row as stored (its `info` text), if the effects change it.
    pub(crate) row_text: Option<String>,
}

/// The statement that makes `change` to run `id`'s inbox.
fn inbox_statement<'a>(sql: &'a Sql, id: &str, change: &InboxChange<'_>) -> Stmt<'a> {
    let run: Param = Box::new(id.to_owned());
    match change {
        InboxChange::Append {
            event_seq,
            name,
            key,
            record,
        } => statement(
            &sql.insert_event,
            vec![
                run,
                Box::new(big(*event_seq)),
                Box::new((*name).to_owned()),
                Box::new(key.map(str::to_owned)),
                Box::new(utf8(record).to_owned()),
            ],
        ),
        InboxChange::Deliver { event_seq, .. } => {
            statement(&sql.mark_delivered, vec![run, Box::new(big(*event_seq))])
        }
    }
}

/// The statements that write `effects` out.
pub(crate) fn writes<'a>(sql: &'a Sql, effects: &Effects<'_>) -> Writes<'a> {
    let id = effects.run_id;
    let run = || -> Param { Box::new(id.to_owned()) };
    let mut out = Vec::new();
    for record in &effects.records {
        let text: Param = Box::new(utf8(record.bytes()).to_owned());
        let st = match record {
            Record::Journal { seq, .. } => {
                statement(&sql.insert_journal, vec![run(), Box::new(big(*seq)), text])
            }
            Record::Step {
                seq,
                name,
                occurrence,
                ..
            } => statement(
                &sql.insert_step,
                vec![
                    run(),
                    Box::new(big(*seq)),
                    Box::new((*name).to_owned()),
                    Box::new(*occurrence as i32),
                    text,
                ],
            ),
            Record::Failure {
                seq,
                attempt,
                index,
                ..
            } => statement(
                &sql.insert_failure,
                vec![
                    run(),
                    Box::new(big(*seq)),
                    Box::new(*attempt as i32),
                    Box::new(*index as i32),
                    text,
                ],
            ),
        };
        out.push((st, record.refusal_if_taken(id)));
    }
    for change in &effects.inbox {
        out.push((inbox_statement(sql, id, change), None));
    }
    if let Some((hash, text)) = effects.schema {
        let params: Vec<Param> = vec![Box::new(hash.to_string()), Box::new(text.to_owned())];
        out.push((statement(&sql.insert_schema, params), None));
    }
    if let Some((key, check, at_ms)) = effects.sealing {
        let params: Vec<Param> = vec![
            Box::new(key.to_owned()),
            Box::new(big(at_ms)),
            Box::new(check.map(str::to_owned)),
        ];
        out.push((statement(&sql.insert_sealing_key, params), None));
    }
    let mut row_text = None;
    if let Some(row) = effects.row() {
        let (st, text) = row_statement(sql, row);
        out.push((st, row.refusal_if_taken()));
        row_text = Some(text);
    }
    for (key, value) in &effects.attributes {
        let params: Vec<Param> = vec![
            run(),
            Box::new((*key).to_owned()),
            Box::new(value.index_bytes()),
        ];
        out.push((statement(&sql.set_attribute, params), None));
    }
    if !effects.delete.is_empty() {
        let ids: Vec<String> = effects.delete.iter().map(|i| i.run_id.clone()).collect();
        out.push((statement(&sql.delete_runs, vec![Box::new(ids)]), None));
    }
    match &effects.schedule {
        Some(ScheduleChange::Put { info, new }) => {
            let json = utf8(&info.encode()).to_owned();
            let params: Vec<Param> = vec![Box::new(info.name.clone()), Box::new(json)];
            let sql = if *new {
                &sql.insert_schedule
            } else {
                &sql.update_schedule
            };
            out.push((statement(sql, params), None));
        }
        Some(ScheduleChange::Delete { name }) => {
            let params: Vec<Param> = vec![Box::new((*name).to_owned())];
            out.push((statement(&sql.delete_schedule, params), None));
        }
        None => {}
    }
    if effects.wakes {
        // Delivered to the other workers' listeners when (and only if) the write commits.
        out.push((statement(&sql.notify, Vec::new()), None));
    }
    Writes {
        statements: out,
        row_text,
    }
}

/// A run's row as stored: the text of its `info` column and its other columns.
pub(crate) struct RowColumns {
    /// The `info` column: the row's encoding.
    pub(crate) text: String,
    pub(crate) status: &'static str,
    pub(crate) seq: i64,
    /// `wait_event` and `wait_until_ms`: the row's
    /// [`readiness`](loops_core::RunInfo::readiness), which `claim_ready` filters on.
    pub(crate) wait_event: Option<String>,
    pub(crate) wait_until_ms: Option<i64>,
    /// The schema hash.
    pub(crate) schema: String,
}

/// The columns of `info`'s row, as stored.
pub(crate) fn row_columns(info: &loops_core::RunInfo) -> RowColumns {
    let ready = info.readiness();
    RowColumns {
        text: utf8(&info.encode()).to_owned(),
        status: info.status.as_str(),
        seq: big(info.seq),
        wait_event: ready.event.map(str::to_owned),
        wait_until_ms: ready.from_ms.map(big),
        schema: info.schema.to_string(),
    }
}

/// The insert or update of a run's row ([`row_columns`]). With the row's text, as stored.
fn row_statement<'a>(sql: &'a Sql, row: &RowWrite) -> (Stmt<'a>, String) {
    let info = &row.info;
    let columns = row_columns(info);
    let text = columns.text.clone();
    let json: Param = Box::new(columns.text);
    let run_id: Param = Box::new(info.run_id.clone());
    let status: Param = Box::new(columns.status);
    let seq: Param = Box::new(columns.seq);
    let event: Param = Box::new(columns.wait_event);
    let from: Param = Box::new(columns.wait_until_ms);
    let schema: Param = Box::new(columns.schema);
    let st = match row.was {
        None => {
            let workflow: Param = Box::new(info.workflow.clone());
            let parent: Param = Box::new(info.parent.as_ref().map(|p| p.run_id.clone()));
            statement(
                &sql.insert_run,
                vec![
                    run_id, workflow, status, seq, event, from, json, schema, parent,
                ],
            )
        }
        Some(_) => statement(
            &sql.update_run,
            vec![run_id, status, seq, event, from, json, schema],
        ),
    };
    (st, text)
}

pub(crate) fn utf8(bytes: &[u8]) -> &str {
    // Records are serde_json output: always UTF-8.
    std::str::from_utf8(bytes).unwrap_or("{}")
}

/// The outcome of the second round trip: `results` of the writes pipelined with `COMMIT`.
/// The first failed write decides: a unique violation maps through `taken`, anything else is
/// an error of unknown outcome.
pub(crate) fn finish(
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

/// The answers of a pipeline sent by [`commit`]: each write's result, then the `COMMIT`'s.
pub(crate) type Sent = (
    Vec<std::result::Result<u64, tokio_postgres::Error>>,
    std::result::Result<(), tokio_postgres::Error>,
);

/// Prepares `writes` (from the connection's statement cache: a round trip only for a
/// statement this connection has not prepared yet), then sends them and `COMMIT`, pipelined,
/// inside the transaction the caller opened.
pub(crate) async fn send(
    c: &Object,
    action: &str,
    writes: &[(Stmt<'_>, Option<Error>)],
) -> std::result::Result<Sent, Fail> {
    let sqls: Vec<&str> = writes.iter().map(|(s, _)| s.sql).collect();
    let prepared = prepare(c, action, &sqls).await?;
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = writes.iter().map(|(s, _)| s.params()).collect();
    let pairs: Vec<(&Statement, &[&(dyn ToSql + Sync)])> = prepared
        .iter()
        .zip(&params)
        .map(|(st, p)| (st, p.as_slice()))
        .collect();
    Ok(commit(c, &pairs).await)
}

/// Sends `writes` (each a prepared statement and its parameters) and `COMMIT`, pipelined.
async fn commit(c: &Object, writes: &[(&Statement, &[&(dyn ToSql + Sync)])]) -> Sent {
    type Step<'a> = Pin<
        Box<
            dyn Future<Output = std::result::Result<Option<u64>, tokio_postgres::Error>>
                + Send
                + 'a,
        >,
    >;
    crate::failpoint::before_commit();
    let client: &tokio_postgres::Client = c;
    let mut steps: Vec<Step<'_>> = Vec::with_capacity(writes.len() + 1);
    for (st, params) in writes {
        let st: &Statement = st;
        let params: &[&(dyn ToSql + Sync)] = params;
        steps.push(Box::pin(async move {
            client.execute(st, params).await.map(Some)
        }));
    }
    steps.push(Box::pin(async move {
        client.batch_execute("COMMIT").await.map(|()| None)
    }));
    let mut results = pipeline(steps).await;
    let committed = results.pop().map_or(Ok(()), |r| r.map(|_| ()));
    let results: Vec<_> = results
        .into_iter()
        .map(|r| r.map(|n| n.unwrap_or(0)))
        .collect();
    // A `COMMIT` after a failed statement succeeds, and rolls back: not a commit.
    if committed.is_ok() && results.iter().all(std::result::Result::is_ok) {
        // One write per transaction: PostgreSQL's own group commit batches the fsyncs.
        loops_core::metrics::commit_batch(STORE_LABEL, 1);
    }
    (results, committed)
}
