//! Named limits shared by every worker of the store: [`SharedLimits`] on three tables
//! (migration 4). A take is one short transaction on a pool connection: it locks the limit's
//! row (so takes of one limit go one at a time, across workers), drops the places whose
//! lease lapsed and the starts that left the rate window, applies [`Limit::admit`] to what
//! is left, and records the new place and start. The time is the server's.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use loops_core::{Admission, Error, Lease, Limit, Result, RunInfo, SharedLimits, Take};
use loops_core::{BoxFuture, RunStatus};
use tokio_postgres::Row;

use crate::guard::Guard;
use crate::{PgStore, big};

/// A limit's declaration as the `limits` table keeps it: `(concurrent, rate_n,
/// rate_period_ms)`.
type Declared = (Option<i32>, Option<i32>, Option<i64>);

fn declared(limit: &Limit) -> Declared {
    (
        limit.concurrent.map(clamp),
        limit.rate.map(|(n, _)| clamp(n)),
        limit
            .rate
            .map(|(_, period)| i64::try_from(period.as_millis()).unwrap_or(i64::MAX)),
    )
}

fn clamp(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The limit names this process warned about (two workers declaring one limit differently):
/// one WARN per name.
pub(crate) type Warned = Arc<Mutex<HashSet<String>>>;

impl SharedLimits for PgStore {
    fn try_take<'a>(
        &'a self,
        name: &'a str,
        limit: &'a Limit,
        lease: &'a Lease,
        seq: u64,
    ) -> BoxFuture<'a, Result<Take>> {
        let action = move || {
            format!(
                "taking a place of the limit `{name}` for run `{}`",
                lease.run_id
            )
        };
        Box::pin(self.timed(action, self.take_untimed(name, limit, lease, seq)))
    }

    fn release<'a>(&'a self, name: &'a str, permit: u64) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.rows(
                || format!("giving back place {permit} of the limit `{name}`"),
                &self.inner.sql.limit_release,
                &[&big(permit), &name],
            )
            .await?;
            Ok(())
        })
    }
}

impl PgStore {
    /// One take, in one transaction; a failure drops the connection (rolling it back).
    async fn take_untimed(
        &self,
        name: &str,
        limit: &Limit,
        lease: &Lease,
        seq: u64,
    ) -> Result<Take> {
        let action = || {
            format!(
                "taking a place of the limit `{name}` for run `{}`",
                lease.run_id
            )
        };
        let db = |e| Error::database(action(), e);
        // Closed if this future is dropped midway (cancelled, timed out): nothing is taken.
        let guard = Guard(Some(self.client(action).await?));
        let c = guard.client();
        let sql = &self.inner.sql;
        let mine = declared(limit);
        c.batch_execute("BEGIN").await.map_err(db)?;
        let prepared = c.prepare_cached(&sql.limit_declare).await.map_err(db)?;
        c.execute(&prepared, &[&name, &mine.0, &mine.1, &mine.2])
            .await
            .map_err(db)?;
        let row = query_one(c, &sql.limit_lock, &[&name]).await.map_err(db)?;
        let stored: Declared = (row.get(0), row.get(1), row.get(2));
        let now: i64 = row.get(3);
        let live: Option<bool> = query_opt(
            c,
            &sql.limit_lease_live,
            &[&lease.run_id, &big(lease.token), &now],
        )
        .await
        .map_err(db)?
        .map(|row| row.get(0));
        let info = query_opt(c, &sql.read_info, &[&lease.run_id])
            .await
            .map_err(db)?;
        let info = match info {
            Some(row) => Some(RunInfo::decode(
                &lease.run_id,
                row.get::<_, String>(0).as_bytes(),
            )?),
            None => None,
        };
        if live == Some(true) && info.as_ref().is_some_and(|i| i.cancel.is_some()) {
            drop(guard); // Rolled back: nothing taken.
            return Ok(Take::Cancelled);
        }
        if live != Some(true) {
            drop(guard); // Rolled back: nothing was written that matters.
            return Err(Error::Fenced {
                run_id: lease.run_id.clone(),
                seq,
                current: info.as_ref().map_or(0, |i| i.seq),
                status: info.map_or(RunStatus::Running, |i| i.status),
            });
        }
        if stored != mine {
            self.warn_redeclared(name, stored, mine);
            let prepared = c.prepare_cached(&sql.limit_redeclare).await.map_err(db)?;
            c.execute(&prepared, &[&name, &mine.0, &mine.1, &mine.2])
                .await
                .map_err(db)?;
        }
        let prepared = c.prepare_cached(&sql.limit_drop_lapsed).await.map_err(db)?;
        c.execute(&prepared, &[&name, &now]).await.map_err(db)?;
        let holding: i64 = query_one(c, &sql.limit_holding, &[&name])
            .await
            .map_err(db)?
            .get(0);
        // Starts are kept for the longer of the two windows, so that a worker that declares a
        // rate sees the starts of one that declares none (or a shorter one).
        let window_ms = mine.2.max(stored.2);
        let mut starts = Vec::new();
        if let Some(window_ms) = window_ms {
            let prepared = c.prepare_cached(&sql.limit_drop_starts).await.map_err(db)?;
            c.execute(&prepared, &[&name, &now.saturating_sub(window_ms)])
                .await
                .map_err(db)?;
            let prepared = c.prepare_cached(&sql.limit_starts).await.map_err(db)?;
            for row in c.query(&prepared, &[&name]).await.map_err(db)? {
                starts.push(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0));
            }
        }
        let now_ms = u64::try_from(now).unwrap_or(0);
        let holding = u32::try_from(holding).unwrap_or(u32::MAX);
        let take = match limit.admit(holding, &starts, now_ms) {
            Admission::Full { retry_at_ms } => Take::Full {
                retry_in: retry_at_ms.map(|at| Duration::from_millis(at.saturating_sub(now_ms))),
            },
            Admission::Enter => {
                let row = query_one(
                    c,
                    &sql.limit_insert_permit,
                    &[&name, &lease.run_id, &big(lease.token), &now],
                )
                .await
                .map_err(db)?;
                if window_ms.is_some() {
                    let prepared = c
                        .prepare_cached(&sql.limit_insert_start)
                        .await
                        .map_err(db)?;
                    c.execute(&prepared, &[&name, &now]).await.map_err(db)?;
                }
                Take::Taken {
                    permit: u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
                }
            }
        };
        c.batch_execute("COMMIT").await.map_err(db)?;
        guard.keep();
        Ok(take)
    }

    /// One WARN per limit name and process when the declaration stored by another worker
    /// differs from this one's.
    fn warn_redeclared(&self, name: &str, stored: Declared, mine: Declared) {
        let mut warned = self
            .inner
            .warned_limits
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if warned.insert(name.to_owned()) {
            tracing::warn!(
                limit = name,
                other = ?stored,
                this = ?mine,
                "another worker declared this limit differently (concurrent, rate n, rate period ms); each worker admits its own steps by its own declaration"
            );
        }
    }
}

async fn query_one(
    c: &deadpool_postgres::Object,
    statement: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> std::result::Result<Row, tokio_postgres::Error> {
    let prepared = c.prepare_cached(statement).await?;
    c.query_one(&prepared, params).await
}

async fn query_opt(
    c: &deadpool_postgres::Object,
    statement: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> std::result::Result<Option<Row>, tokio_postgres::Error> {
    let prepared = c.prepare_cached(statement).await?;
    c.query_opt(&prepared, params).await
}
