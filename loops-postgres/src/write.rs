//! The commit path: each [`Write`] in one PostgreSQL transaction. What the write means is
//! [`plan`]'s (loops-core); this module only gathers the [`Facts`] it [`Needs`] and writes
//! its [`Effects`] out as SQL (with `commit.rs`).
//!
//! A lease holder's write whose run's row the store remembers first tries one round trip
//! (`fast.rs`, one statement); it falls back here, having written nothing, if the lease or
//! the row changed. Here a write takes two round trips on one connection, each a pipeline of
//! statements:
//! 1. `BEGIN`; lock the lease row (`FOR UPDATE`, if the write carries a lease); lock the run's
//!    row (`FOR UPDATE`, or the rows of the runs a prune names; a creation only reads it:
//!    [`Needs::run_unlocked`]); and one statement per fact
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
//! connection; if it fails during the second (or once the one-round-trip statement was
//! sent), whether it committed is unknown and the caller gets [`Error::Database`].

use std::future::Future;
use std::pin::Pin;

use deadpool_postgres::Object;
use loops_core::{
    AttemptFailures, CurrentLease, Effects, Facts, Lease, LeaseCheck, Needs, PendingEvent,
    RecordKey, Reply, RunInfo, ScheduleInfo, Write, plan,
};
use loops_core::{Error, Result};
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::action::describe;
use crate::commit::{
    Fail, Param, STORE_LABEL, Stmt, early, finish, prepare, send, statement, writes,
};
use crate::fast::Cache;
use crate::guard::Guard;
use crate::pipeline::{Step, pipeline};
use crate::read::text;
use crate::sql::Sql;
use crate::{PgStore, big};

/// Attempts of a write whose connection fails before its commit, on fresh connections.
const TRIES: usize = 3;

impl PgStore {
    pub(crate) async fn write_impl(&self, lease: Option<&Lease>, write: Write) -> Result<Reply> {
        let action = || describe(&write);
        self.timed(action, self.write_untimed(lease, &write)).await
    }

    async fn write_untimed(&self, lease: Option<&Lease>, write: &Write) -> Result<Reply> {
        let action = || describe(write);
        // Taken out for the time of the write: put back only by a commit.
        let remembered = lease.and_then(|lease| Some((lease, self.inner.cache.take(lease)?)));
        if let Some((lease, entry)) = remembered
            && let Some(reply) = crate::fast::commit(self, lease, write, entry).await?
        {
            return Ok(reply);
        }
        let mut tries = 0;
        loop {
            tries += 1;
            let guard = Guard(Some(self.client(action).await?));
            let (sql, cache) = (&self.inner.sql, &self.inner.cache);
            match apply(guard.client(), sql, cache, lease, write).await {
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

/// What a statement of the first round trip reads.
#[derive(Clone, Copy)]
enum Fact {
    Lease,
    Run,
    Runs,
    Record,
    Schema,
    FailureIndex,
    /// The failure records of a seq's highest attempt with any.
    LastAttempt(u64),
    Pending,
    EventKey,
    NextEventSeq,
    Children,
    ChildrenOfRuns,
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
        let read = if needs.run_unlocked {
            &sql.read_run
        } else {
            &sql.lock_run
        };
        out.push((Fact::Run, statement(read, vec![run()])));
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
    if let Some(seq) = needs.last_attempt {
        let params: Vec<Param> = vec![run(), Box::new(big(seq))];
        out.push((
            Fact::LastAttempt(seq),
            statement(&sql.failures_of_seq, params),
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
    if needs.children_of_runs && !needs.runs.is_empty() {
        let ids = needs.runs.to_vec();
        out.push((
            Fact::ChildrenOfRuns,
            statement(&sql.children_of_runs, vec![Box::new(ids)]),
        ));
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

/// The run's row (decoded, and as stored) and the facts, from the first round trip's
/// answers to `reads`.
///
/// `(run_id, schedule)`: the run and the schedule the write needs, if any.
fn facts<'l>(
    reads: &[(Fact, Stmt<'_>)],
    answers: Vec<Vec<Row>>,
    lease: Option<&'l Lease>,
    (run_id, needs_schedule): (&str, Option<&str>),
) -> std::result::Result<(Option<(RunInfo, String)>, Facts<'l>), Unreadable> {
    let broken = |e: tokio_postgres::Error| {
        Unreadable::Broken(Error::database(
            format!("reading a row of run `{run_id}`"),
            e,
        ))
    };
    let info = |id: &str, row: &Row| -> std::result::Result<(RunInfo, String), Unreadable> {
        let json = text(row, 0, id).map_err(Unreadable::Broken)?;
        let info = RunInfo::decode(id, json.as_bytes()).map_err(Unreadable::Refused)?;
        Ok((info, json))
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
            Fact::ChildrenOfRuns => {
                for r in &rows {
                    let parent = text(r, 0, "?").map_err(Unreadable::Broken)?;
                    let child = text(r, 1, &parent).map_err(Unreadable::Broken)?;
                    facts.children_of_runs.push((parent, child));
                }
            }
            Fact::Record => facts.record_taken = flag(first).map_err(broken)?,
            Fact::Schema => facts.schema_stored = flag(first).map_err(broken)?,
            Fact::FailureIndex => {
                facts.failure_index = number::<i32>(first).map_err(broken)?.unwrap_or(0) as u32;
            }
            Fact::LastAttempt(seq) => {
                for r in &rows {
                    let attempt = r.try_get::<_, i32>(0).map_err(broken)? as u32;
                    let index = r.try_get::<_, i32>(1).map_err(broken)? as u32;
                    let record = text(r, 2, run_id).map_err(Unreadable::Broken)?;
                    let at = (run_id, *seq);
                    AttemptFailures::add(
                        &mut facts.last_attempt,
                        at,
                        (attempt, index),
                        record.as_bytes(),
                    )
                    .map_err(Unreadable::Refused)?;
                }
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

/// Applies `write` in one transaction on `c`, in two round trips: the facts it needs,
/// [`plan`], then its effects and `COMMIT`. A write under a lease that commits leaves its
/// run's row remembered for the next, which may then commit in one round trip
/// (`fast.rs`).
async fn apply(
    c: &Object,
    sql: &Sql,
    cache: &Cache,
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
    let effects = match plan(write, row.as_ref().map(|(info, _)| info), &facts) {
        Ok(effects) => effects,
        Err(e) => return Err(reject(c, e).await),
    };
    if effects.is_empty() {
        return unchanged(c, effects.into_reply()).await;
    }
    if !effects.follow_ups.is_empty() {
        return with_follow_ups(c, sql, action, effects).await;
    }
    let mut planned = writes(sql, &effects);
    let (results, committed) = send(c, action, &planned.statements).await?;
    finish(action, results, committed, |i| {
        let refusal = planned.statements.get_mut(i).map(|(_, r)| r.take());
        refusal.flatten()
    })?;
    let Some(lease) = lease.filter(|l| needs.run == Some(l.run_id.as_str())) else {
        return Ok(effects.into_reply());
    };
    let row_text = planned.row_text;
    let (new, reply) = effects.into_row_and_reply();
    let now = match (new, row_text) {
        (Some(new), Some(text)) => Some((text, new.info)),
        _ => row.map(|(info, text)| (text, info)),
    };
    if let Some((text, info)) = now {
        cache.put(lease, text, info);
    }
    Ok(reply)
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
    execute(c, action, writes(sql, &effects).statements).await?;
    for write in &effects.follow_ups {
        follow_up(c, sql, write).await?;
    }
    crate::failpoint::before_commit();
    c.batch_execute("COMMIT")
        .await
        .map_err(|e| Fail::Broken(Error::database(action, e)))?;
    loops_core::metrics::commit_batch(STORE_LABEL, 1);
    Ok(effects.into_reply())
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
        let effects = match plan(write, row.as_ref().map(|(info, _)| info), &facts) {
            Ok(effects) => effects,
            Err(e) => {
                tracing::debug!(error = %e, "a follow-up write was refused; skipped");
                return Ok(());
            }
        };
        if effects.is_empty() {
            return Ok(());
        }
        execute(c, &action, writes(sql, &effects).statements).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The run's row is locked by every write of a run but a creation, which only reads it
    /// ([`Needs::run_unlocked`]).
    #[test]
    fn a_creation_reads_its_run_row_without_a_lock() {
        let sql = Sql::new("s");
        let first = |unlocked: bool| {
            let mut needs = Needs::default();
            needs.run = Some("r");
            needs.run_unlocked = unlocked;
            reads(&sql, None, &needs)[0].1.sql.to_owned()
        };
        assert_eq!(
            first(true),
            r#"SELECT info FROM "s".runs WHERE run_id = $1"#
        );
        assert_eq!(
            first(false),
            r#"SELECT info FROM "s".runs WHERE run_id = $1 FOR UPDATE"#
        );
    }
}
