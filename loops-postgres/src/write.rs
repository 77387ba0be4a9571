//! The commit path: each [`Write`] in one PostgreSQL transaction. What the write means is
//! [`plan`]'s (loops-core); this module only gathers the [`Facts`] it [`Needs`] and writes
//! its [`Effects`] out as SQL.
//!
//! A write takes two round trips on one connection, each a pipeline of statements:
//! 1. `BEGIN`; lock the lease row (`FOR UPDATE`, if the write carries a lease); lock the run's
//!    row (`FOR UPDATE`, or the rows of the runs a prune names); and one statement per fact
//!    the write needs (the next failure index, the oldest pending event, ...), which run
//!    after the locks are held.
//! 2. After [`plan`]: the inserts, updates and deletes of its effects, then `COMMIT`. If any
//!    statement fails, PostgreSQL aborts the transaction and the `COMMIT` rolls it back; a
//!    unique violation there is a key a concurrent write took first (a create of the same
//!    run id), refused as the effect says ([`Record::refusal_if_taken`]).
//!
//! A write that makes a run ready for other workers ([`Effects::wakes`]) also sends the
//! store's notification in its transaction (`pg_notify`, with the changes), which the
//! server delivers to the listening workers when it commits (docs/postgres.md, "Wake-ups").
//!
//! A write refused by its checks is rolled back and leaves no trace. If the connection fails
//! during the first round trip, nothing was written and the write is tried again on another
//! connection; if it fails during the second, whether it committed is unknown and the caller
//! gets [`Error::Database`].

use std::future::Future;
use std::pin::Pin;

use deadpool_postgres::Object;
use loops_core::{
    CurrentLease, Effects, Facts, InboxChange, Lease, LeaseCheck, Needs, PendingEvent, Record,
    RecordKey, Reply, RowWrite, RunInfo, ScheduleChange, ScheduleInfo, Write, plan,
};
use loops_core::{Error, Result};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};

use crate::action::describe;
use crate::guard::Guard;
use crate::pipeline::{Step, pipeline};
use crate::read::text;
use crate::sql::Sql;
use crate::{PgStore, big, is_connection_error};

/// The `store` label of this store's metrics ([`loops_core::metrics`]).
const STORE_LABEL: &str = "postgres";

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

/// A parameter of a statement.
type Param = Box<dyn ToSql + Sync + Send>;

/// A statement and its parameters.
struct Stmt<'a> {
    sql: &'a str,
    params: Vec<Param>,
}

fn statement<'a>(sql: &'a str, params: Vec<Param>) -> Stmt<'a> {
    Stmt { sql, params }
}

impl Stmt<'_> {
    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| &**p as &(dyn ToSql + Sync))
            .collect()
    }
}

/// What a statement of the first round trip reads.
#[derive(Clone, Copy)]
enum Fact {
    Lease,
    Run,
    Runs,
    Record,
    Schema,
    FailureIndex,
    FailureAttempt,
    Pending,
    EventKey,
    NextEventSeq,
    Children,
    Schedule,
}

/// The statements of the first round trip after `BEGIN`: the locks, then one per fact.
fn reads<'a>(sql: &'a Sql, lease: Option<&Lease>, needs: &Needs<'_>) -> Vec<(Fact, Stmt<'a>)> {
    let mut out = Vec::new();
    if let Some(lease) = lease {
        out.push((
            Fact::Lease,
            statement(&sql.lock_lease, vec![Box::new(lease.run_id.clone())]),
        ));
    }
    let id = needs.run.unwrap_or_default().to_owned();
    let run = || -> Param { Box::new(id.clone()) };
    if needs.run.is_some() {
        out.push((Fact::Run, statement(&sql.lock_run, vec![run()])));
    }
    if !needs.runs.is_empty() {
        let ids = needs.runs.to_vec();
        out.push((Fact::Runs, statement(&sql.lock_runs, vec![Box::new(ids)])));
    }
    match needs.record {
        Some(RecordKey::Journal { seq }) => out.push((
            Fact::Record,
            statement(&sql.journal_exists, vec![run(), Box::new(big(seq))]),
        )),
        Some(RecordKey::Step {
            seq,
            name,
            occurrence,
        }) => out.push((
            Fact::Record,
            statement(
                &sql.step_exists,
                vec![
                    run(),
                    Box::new(big(seq)),
                    Box::new(name.to_owned()),
                    Box::new(occurrence as i32),
                ],
            ),
        )),
        None => {}
    }
    if let Some(hash) = needs.schema {
        let hash: Param = Box::new(hash.to_string());
        out.push((Fact::Schema, statement(&sql.schema_exists, vec![hash])));
    }
    if let Some((seq, attempt)) = needs.failure_index {
        let params: Vec<Param> = vec![run(), Box::new(big(seq)), Box::new(attempt as i32)];
        out.push((
            Fact::FailureIndex,
            statement(&sql.next_failure_index, params),
        ));
    }
    if let Some(seq) = needs.failure_attempt {
        let params: Vec<Param> = vec![run(), Box::new(big(seq))];
        out.push((
            Fact::FailureAttempt,
            statement(&sql.last_failure_attempt, params),
        ));
    }
    if let Some(event) = needs.pending {
        let params: Vec<Param> = vec![run(), Box::new(event.to_owned())];
        out.push((Fact::Pending, statement(&sql.first_pending, params)));
    }
    if let Some(key) = needs.event_key {
        let params: Vec<Param> = vec![run(), Box::new(key.to_owned())];
        out.push((Fact::EventKey, statement(&sql.event_by_key, params)));
    }
    if needs.next_event_seq {
        out.push((
            Fact::NextEventSeq,
            statement(&sql.next_event_seq, vec![run()]),
        ));
    }
    if needs.children {
        out.push((Fact::Children, statement(&sql.live_children, vec![run()])));
    }
    if let Some(name) = needs.schedule {
        let name: Param = Box::new(name.to_owned());
        out.push((Fact::Schedule, statement(&sql.lock_schedule, vec![name])));
    }
    out
}

/// Why the first round trip's answers could not be read.
enum Unreadable {
    /// A stored value is not what loops writes (a run row it cannot decode): refuse.
    Refused(Error),
    /// A column of an unexpected type: the schema was altered outside loops.
    Broken(Error),
}

/// The run's row and the facts, from the first round trip's answers to `reads`.
///
/// `(run_id, schedule)`: the run and the schedule the write needs, if any.
fn facts<'l>(
    reads: &[(Fact, Stmt<'_>)],
    answers: Vec<Vec<Row>>,
    lease: Option<&'l Lease>,
    (run_id, needs_schedule): (&str, Option<&str>),
) -> std::result::Result<(Option<RunInfo>, Facts<'l>), Unreadable> {
    let broken = |e: tokio_postgres::Error| {
        Unreadable::Broken(Error::database(
            format!("reading a row of run `{run_id}`"),
            e,
        ))
    };
    let info = |id: &str, row: &Row| -> std::result::Result<RunInfo, Unreadable> {
        let json = text(row, 0, id).map_err(Unreadable::Broken)?;
        RunInfo::decode(id, json.as_bytes()).map_err(Unreadable::Refused)
    };
    let mut row = None;
    let mut facts = Facts::default();
    for ((fact, _), rows) in reads.iter().zip(answers) {
        let first = rows.first();
        match fact {
            Fact::Lease => {
                let current = match first {
                    Some(r) => Some(CurrentLease {
                        token: r.try_get::<_, i64>(0).map_err(broken)? as u64,
                        live: r
                            .try_get::<_, Option<bool>>(1)
                            .map_err(broken)?
                            .unwrap_or(false),
                    }),
                    None => None,
                };
                if let Some(lease) = lease {
                    facts.lease = Some(LeaseCheck { lease, current });
                }
            }
            Fact::Run => row = first.map(|r| info(run_id, r)).transpose()?,
            Fact::Runs | Fact::Children => {
                let into = match fact {
                    Fact::Runs => &mut facts.runs,
                    _ => &mut facts.children,
                };
                for r in &rows {
                    let id = text(r, 1, "?").map_err(Unreadable::Broken)?;
                    let json = text(r, 0, &id).map_err(Unreadable::Broken)?;
                    let decoded = RunInfo::decode(&id, json.as_bytes());
                    into.push(decoded.map_err(Unreadable::Refused)?);
                }
            }
            Fact::Record => facts.record_taken = flag(first).map_err(broken)?,
            Fact::Schema => facts.schema_stored = flag(first).map_err(broken)?,
            Fact::FailureIndex => {
                facts.failure_index = number::<i32>(first).map_err(broken)?.unwrap_or(0) as u32;
            }
            Fact::FailureAttempt => {
                facts.failure_attempt = number::<i32>(first).map_err(broken)?.map(|n| n as u32);
            }
            Fact::Pending => {
                if let Some(r) = first {
                    let event_seq = r.try_get::<_, i64>(0).map_err(broken)? as u64;
                    let record = r.try_get::<_, Option<String>>(1).map_err(broken)?;
                    let record = record.map(String::into_bytes);
                    facts.pending = Some(PendingEvent { event_seq, record });
                }
            }
            Fact::EventKey => {
                facts.key_seen = number::<i64>(first).map_err(broken)?.map(|n| n as u64);
            }
            Fact::NextEventSeq => {
                facts.next_event_seq = number::<i64>(first).map_err(broken)?.unwrap_or(0) as u64;
            }
            Fact::Schedule => {
                if let (Some(r), Some(name)) = (first, needs_schedule) {
                    let json = text(r, 0, name).map_err(Unreadable::Broken)?;
                    let decoded = ScheduleInfo::decode(name, json.as_bytes());
                    facts.schedule = Some(decoded.map_err(Unreadable::Refused)?);
                }
            }
        }
    }
    Ok((row, facts))
}

/// The boolean in the first column of `row` (false without a row).
fn flag(row: Option<&Row>) -> std::result::Result<bool, tokio_postgres::Error> {
    Ok(row
        .map(|r| r.try_get::<_, bool>(0))
        .transpose()?
        .unwrap_or(false))
}

/// The number in the first column of `row`, if any.
fn number<T>(row: Option<&Row>) -> std::result::Result<Option<T>, tokio_postgres::Error>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    Ok(row
        .map(|r| r.try_get::<_, Option<T>>(0))
        .transpose()?
        .flatten())
}

/// The first round trip: `BEGIN` and `reads`, pipelined; their rows.
async fn begin(
    c: &Object,
    action: &str,
    reads: &[(Fact, Stmt<'_>)],
) -> std::result::Result<Vec<Vec<Row>>, Fail> {
    read_pipelined(c, action, Some("BEGIN"), reads).await
}

/// `reads` in one round trip, after `first` (a statement without rows, such as `BEGIN`) if
/// given; the rows of each read.
async fn read_pipelined(
    c: &Object,
    action: &str,
    first: Option<&'static str>,
    reads: &[(Fact, Stmt<'_>)],
) -> std::result::Result<Vec<Vec<Row>>, Fail> {
    let sqls: Vec<&str> = reads.iter().map(|(_, s)| s.sql).collect();
    let prepared = prepare(c, action, &sqls).await?;
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = reads.iter().map(|(_, s)| s.params()).collect();
    let client: &tokio_postgres::Client = c;
    let mut steps: Vec<Step<'_>> = Vec::with_capacity(reads.len() + 1);
    if let Some(first) = first {
        steps.push(Box::pin(async move {
            client.batch_execute(first).await.map(|()| Vec::new())
        }));
    }
    for (st, params) in prepared.iter().zip(&params) {
        steps.push(Box::pin(async move { client.query(st, params).await }));
    }
    let skip = usize::from(first.is_some());
    let mut answers = Vec::with_capacity(reads.len());
    for (i, result) in pipeline(steps).await.into_iter().enumerate() {
        let rows = result.map_err(|e| early(action, e))?;
        if i >= skip {
            answers.push(rows);
        }
    }
    Ok(answers)
}

/// The statements that write `effects` out, each with the refusal a unique violation of it
/// means.
fn writes<'a>(sql: &'a Sql, effects: &Effects<'_>) -> Vec<(Stmt<'a>, Option<Error>)> {
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
        let st = match change {
            InboxChange::Append {
                event_seq,
                name,
                key,
                record,
            } => statement(
                &sql.insert_event,
                vec![
                    run(),
                    Box::new(big(*event_seq)),
                    Box::new((*name).to_owned()),
                    Box::new(key.map(str::to_owned)),
                    Box::new(utf8(record).to_owned()),
                ],
            ),
            InboxChange::Deliver { event_seq, .. } => {
                statement(&sql.mark_delivered, vec![run(), Box::new(big(*event_seq))])
            }
        };
        out.push((st, None));
    }
    if let Some((hash, text)) = effects.schema {
        let params: Vec<Param> = vec![Box::new(hash.to_string()), Box::new(text.to_owned())];
        out.push((statement(&sql.insert_schema, params), None));
    }
    if let Some((key, at_ms)) = effects.sealing {
        let params: Vec<Param> = vec![Box::new(key.to_owned()), Box::new(big(at_ms))];
        out.push((statement(&sql.insert_sealing_key, params), None));
    }
    if let Some(row) = &effects.row {
        out.push((row_statement(sql, row), row.refusal_if_taken()));
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
    out
}

/// The insert or update of a run's row. The `wait_event` and `wait_until_ms` columns hold
/// the row's [`readiness`](RunInfo::readiness), and `schema` its schema hash, which
/// `claim_ready` filters on.
fn row_statement<'a>(sql: &'a Sql, row: &RowWrite) -> Stmt<'a> {
    let info = &row.info;
    let ready = info.readiness();
    let run_id: Param = Box::new(info.run_id.clone());
    let status: Param = Box::new(info.status.as_str());
    let seq: Param = Box::new(big(info.seq));
    let event: Param = Box::new(ready.event.map(str::to_owned));
    let from: Param = Box::new(ready.from_ms.map(big));
    let json: Param = Box::new(utf8(&info.encode()).to_owned());
    let schema: Param = Box::new(info.schema.to_string());
    match row.was {
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
    }
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
    crate::failpoint::before_commit();
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
    if committed.is_ok() {
        // One write per transaction: PostgreSQL's own group commit batches the fsyncs.
        loops_core::metrics::commit_batch(STORE_LABEL, 1);
    }
    let results = results
        .into_iter()
        .map(|r| r.map(|n| n.unwrap_or(0)))
        .collect();
    (results, committed)
}

/// Applies `write` in one transaction on `c`: the facts it needs (first round trip),
/// [`plan`], then its effects and `COMMIT` (second round trip).
async fn apply(
    c: &Object,
    sql: &Sql,
    lease: Option<&Lease>,
    write: &Write,
) -> std::result::Result<Reply, Fail> {
    let action = describe(write);
    let action = action.as_str();
    let needs = write.needs();
    let reads = reads(sql, lease, &needs);
    let answers = begin(c, action, &reads).await?;
    let needed = (needs.run.unwrap_or_default(), needs.schedule);
    let (row, facts) = match facts(&reads, answers, lease, needed) {
        Ok(read) => read,
        Err(Unreadable::Refused(e)) => return Err(reject(c, e).await),
        Err(Unreadable::Broken(e)) => return Err(Fail::Broken(e)),
    };
    let effects = match plan(write, row.as_ref(), &facts) {
        Ok(effects) => effects,
        Err(e) => return Err(reject(c, e).await),
    };
    if effects.is_empty() {
        return unchanged(c, effects.reply).await;
    }
    if !effects.follow_ups.is_empty() {
        return with_follow_ups(c, sql, action, effects).await;
    }
    let mut writes = writes(sql, &effects);
    let sqls: Vec<&str> = writes.iter().map(|(s, _)| s.sql).collect();
    let prepared = prepare(c, action, &sqls).await?;
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = writes.iter().map(|(s, _)| s.params()).collect();
    let pairs: Vec<(&Statement, &[&(dyn ToSql + Sync)])> = prepared
        .iter()
        .zip(&params)
        .map(|(st, p)| (st, p.as_slice()))
        .collect();
    let (results, committed) = commit(c, &pairs).await;
    finish(action, results, committed, |i| {
        writes.get_mut(i).and_then(|(_, refusal)| refusal.take())
    })?;
    Ok(effects.reply)
}

/// The rest of [`apply`] for a write with [follow-ups](Effects::follow_ups): its effects,
/// then each follow-up (its facts read, under its locks, after those effects), then
/// `COMMIT`: one transaction. Locks are taken in the order of the writes (a child's row, then
/// its parent's; a parent's, then its children's); a deadlock between two such transactions
/// aborts one, which is tried again on a fresh connection like a failed connection
/// ([`early`]): nothing of it was committed.
async fn with_follow_ups(
    c: &Object,
    sql: &Sql,
    action: &str,
    effects: Effects<'_>,
) -> std::result::Result<Reply, Fail> {
    execute(c, action, writes(sql, &effects)).await?;
    for write in &effects.follow_ups {
        follow_up(c, sql, write).await?;
    }
    crate::failpoint::before_commit();
    c.batch_execute("COMMIT")
        .await
        .map_err(|e| Fail::Broken(Error::database(action, e)))?;
    loops_core::metrics::commit_batch(STORE_LABEL, 1);
    Ok(effects.reply)
}

/// Applies one follow-up `write` inside the open transaction: its facts, [`plan`], its
/// effects, and its own follow-ups. A follow-up the plan refuses (or whose row does not
/// decode) writes nothing and is skipped.
fn follow_up<'a>(
    c: &'a Object,
    sql: &'a Sql,
    write: &'a Write,
) -> Pin<Box<dyn Future<Output = std::result::Result<(), Fail>> + Send + 'a>> {
    Box::pin(async move {
        let action = describe(write);
        let needs = write.needs();
        let reads = reads(sql, None, &needs);
        let answers = read_pipelined(c, &action, None, &reads).await?;
        let needed = (needs.run.unwrap_or_default(), needs.schedule);
        let (row, facts) = match facts(&reads, answers, None, needed) {
            Ok(read) => read,
            Err(Unreadable::Refused(e)) => {
                tracing::debug!(error = %e, "a follow-up write was refused; skipped");
                return Ok(());
            }
            Err(Unreadable::Broken(e)) => return Err(Fail::Broken(e)),
        };
        let effects = match plan(write, row.as_ref(), &facts) {
            Ok(effects) => effects,
            Err(e) => {
                tracing::debug!(error = %e, "a follow-up write was refused; skipped");
                return Ok(());
            }
        };
        if effects.is_empty() {
            return Ok(());
        }
        execute(c, &action, writes(sql, &effects)).await?;
        for next in &effects.follow_ups {
            follow_up(c, sql, next).await?;
        }
        Ok(())
    })
}

/// Executes `writes` inside the open transaction, pipelined, without committing. A unique
/// violation is the refusal its write names (the transaction is rolled back); any other
/// failure leaves nothing committed ([`early`]).
async fn execute(
    c: &Object,
    action: &str,
    mut writes: Vec<(Stmt<'_>, Option<Error>)>,
) -> std::result::Result<(), Fail> {
    let sqls: Vec<&str> = writes.iter().map(|(s, _)| s.sql).collect();
    let prepared = prepare(c, action, &sqls).await?;
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = writes.iter().map(|(s, _)| s.params()).collect();
    let client: &tokio_postgres::Client = c;
    let mut steps: Vec<Step<'_>> = Vec::with_capacity(writes.len());
    for (st, params) in prepared.iter().zip(&params) {
        steps.push(Box::pin(async move {
            client.execute(st, params).await.map(|_| Vec::new())
        }));
    }
    let results = pipeline(steps).await;
    drop(params);
    for (i, result) in results.into_iter().enumerate() {
        if let Err(e) = result {
            if e.code() == Some(&SqlState::UNIQUE_VIOLATION)
                && let Some(refusal) = writes.get_mut(i).and_then(|(_, r)| r.take())
            {
                return Err(reject(c, refusal).await);
            }
            return Err(early(action, e));
        }
    }
    Ok(())
}
