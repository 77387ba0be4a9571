//! A write with follow-up writes ([`Effects::follow_ups`]): its effects, then each
//! follow-up planned and applied in the same open transaction, then `COMMIT`.

use std::future::Future;
use std::pin::Pin;

use deadpool_postgres::Object;
use loops_core::{Effects, Error, Reply, Write, plan};
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::{
    Fact, Fail, STORE_LABEL, Step, Stmt, Unreadable, describe, early, facts, pipeline, prepare,
    reads, reject, writes,
};
use crate::sql::Sql;

/// The rest of [`apply`](super::apply) for a write with [follow-ups](Effects::follow_ups): its effects,
/// then each follow-up (its facts read, under its locks, after those effects), then
/// `COMMIT`: one transaction. Locks are taken in the order of the writes (a child's row, then
/// its parent's; a parent's, then its children's); a deadlock between two such transactions
/// aborts one, which is tried again on a fresh connection like a failed connection
/// ([`early`]): nothing of it was committed.
pub(super) async fn with_follow_ups(
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
        let answers = query(c, &action, &reads).await?;
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

/// The statements of `reads`, pipelined inside the open transaction; their rows.
async fn query(
    c: &Object,
    action: &str,
    reads: &[(Fact, Stmt<'_>)],
) -> std::result::Result<Vec<Vec<Row>>, Fail> {
    let sqls: Vec<&str> = reads.iter().map(|(_, s)| s.sql).collect();
    let prepared = prepare(c, action, &sqls).await?;
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = reads.iter().map(|(_, s)| s.params()).collect();
    let client: &tokio_postgres::Client = c;
    let mut steps: Vec<Step<'_>> = Vec::with_capacity(reads.len());
    for (st, params) in prepared.iter().zip(&params) {
        steps.push(Box::pin(async move { client.query(st, params).await }));
    }
    pipeline(steps)
        .await
        .into_iter()
        .map(|result| result.map_err(|e| early(action, e)))
        .collect()
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
