//! Named limits shared by PostgreSQL workers: worker processes (this test binary, re-run as
//! `limit_worker`) serve the `limited` workflow, whose one step takes the limit "model" and
//! counts itself in tables of the test's own (outside the store: `probe_inside` and
//! `probe_calls`, updated atomically by the step).
//!
//! - A limit of 2 across 20 runs on 3 workers: never more than 2 steps inside at once.
//! - A rate limit across 3 workers: at most `n` tries start per period.
//! - A worker SIGKILLed while it holds the only place: the place comes back once its lease
//!   lapses, and a step of another worker that waited for it runs.
//! - A step waiting for the limit on one worker is cancelled from another process: it stops
//!   waiting, never runs, and the run ends cancelled.
//! - A try that fails or panics inside a limit of 1 gives its place back: the runs behind it
//!   finish.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::worker::Worker;
use loops::{Context, Limit, RunStatus, Runtime, StepOptions, Workflow};
use loops_core::Store;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "limited")]
enum Limited {
    #[initial]
    #[next(Done)]
    Call,
    #[terminal]
    Done { by: u32 },
}

/// The step's world: the probe tables, how long a try stays inside, and the file that lets
/// the runs named `held*` leave the limit.
struct Caller {
    probe: tokio_postgres::Client,
    schema: String,
    hold: Duration,
    go: Option<PathBuf>,
}

impl LimitedHandler for Caller {
    type Error = anyhow::Error;

    async fn call(&self, ctx: &Context) -> Result<CallNext, Self::Error> {
        let options = StepOptions::default().with_limit("model");
        let by: u32 = ctx.step_with("call", options, || self.inside(ctx)).await?;
        Ok(CallNext::Done { by })
    }
}

impl Caller {
    /// A try of the step: inside the limit from start to end.
    async fn inside(&self, ctx: &Context) -> Result<u32, loops::BoxError> {
        let run_id = ctx.run_id();
        self.probe_sql(
            "INSERT INTO {s}.probe_calls (run_id, pid, at_ms) VALUES \
             ($1, $2, (extract(epoch from clock_timestamp()) * 1000)::bigint)",
            &[&run_id, &(std::process::id() as i32)],
        )
        .await?;
        // The runs named `panic*` and `fail*` fail their first try inside the limit.
        if ctx.attempt() == 1 && run_id.starts_with("panic") {
            panic!("the model crashed");
        }
        if ctx.attempt() == 1 && run_id.starts_with("fail") {
            return Err("the model said no".into());
        }
        self.probe_sql(
            "UPDATE {s}.probe_inside SET inside = inside + 1, most = greatest(most, inside + 1)",
            &[],
        )
        .await?;
        match &self.go {
            Some(go) if run_id.starts_with("held") => {
                println!("inside {run_id}");
                while !go.exists() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            _ => tokio::time::sleep(self.hold).await,
        }
        self.probe_sql("UPDATE {s}.probe_inside SET inside = inside - 1", &[])
            .await?;
        Ok(std::process::id())
    }

    /// Runs `sql` on the probe tables (`{s}`: the test's schema).
    async fn probe_sql(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        let sql = sql.replace("{s}", &format!("\"{}\"", self.schema));
        self.probe.execute(&sql, params).await
    }
}

/// The child: a worker. `LOOPS_LIMIT` is `concurrent:N` or `rate:N:PERIOD_MS`; it starts the
/// runs of `LOOPS_RUNS` (comma-separated) and serves.
#[tokio::test]
#[ignore = "run by the other tests of this file as their worker process"]
async fn limit_worker() {
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    tracing_subscriber::fmt()
        .with_writer(std::io::stdout)
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .init();
    let schema = env("LOOPS_SCHEMA");
    let store = loops_postgres::PgStore::builder(common::pg_config())
        .schema(schema.clone())
        .pool_size(4)
        .lease_ttl(Duration::from_millis(env("LOOPS_TTL_MS").parse().unwrap()))
        .connect()
        .await
        .unwrap();
    let parts: Vec<u64> = env("LOOPS_LIMIT")
        .split(':')
        .skip(1)
        .map(|n| n.parse().unwrap())
        .collect();
    let limit = match env("LOOPS_LIMIT").split(':').next() {
        Some("concurrent") => Limit::concurrent(parts[0] as u32),
        Some("rate") => Limit::rate(parts[0] as u32, Duration::from_millis(parts[1])),
        other => panic!("LOOPS_LIMIT {other:?}"),
    };
    let caller = Caller {
        probe: common::admin().await,
        schema,
        hold: Duration::from_millis(env("LOOPS_HOLD_MS").parse().unwrap_or(0)),
        go: Some(PathBuf::from(env("LOOPS_GO"))).filter(|_| !env("LOOPS_GO").is_empty()),
    };
    let runtime = Runtime::builder()
        .limit("model", limit)
        .register::<Limited, _>(caller)
        .build(store);
    for run_id in env("LOOPS_RUNS").split(',').filter(|s| !s.is_empty()) {
        runtime.start(run_id, Limited::Call).await.unwrap();
    }
    println!("serving");
    runtime.serve(Duration::from_millis(50)).await.unwrap();
}

/// A test's schema, store and probe tables.
struct Setup {
    schema: common::TestSchema,
    store: loops_postgres::PgStore,
    admin: tokio_postgres::Client,
    ttl_ms: u64,
    go: PathBuf,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn new(test: &str, ttl_ms: u64) -> Setup {
        let schema = common::TestSchema::new(test).await;
        // Migrates before the workers start.
        let store = schema.store(Duration::from_millis(ttl_ms)).await;
        let admin = common::admin().await;
        let s = &schema.name;
        admin
            .batch_execute(&format!(
                "CREATE TABLE \"{s}\".probe_inside (inside integer NOT NULL, most integer NOT NULL); \
                 INSERT INTO \"{s}\".probe_inside VALUES (0, 0); \
                 CREATE TABLE \"{s}\".probe_calls (run_id text NOT NULL, pid integer NOT NULL, \
                   at_ms bigint NOT NULL);"
            ))
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        Setup {
            go: dir.path().join("go"),
            schema,
            store,
            admin,
            ttl_ms,
            _dir: dir,
        }
    }

    fn worker(&self, limit: &str, runs: &[String], hold_ms: u64) -> Worker {
        let worker = Worker::spawn(
            "limit_worker",
            &[
                ("LOOPS_SCHEMA", self.schema.name.clone()),
                ("LOOPS_TTL_MS", self.ttl_ms.to_string()),
                ("LOOPS_LIMIT", limit.to_owned()),
                ("LOOPS_RUNS", runs.join(",")),
                ("LOOPS_HOLD_MS", hold_ms.to_string()),
                ("LOOPS_GO", self.go.display().to_string()),
            ],
        );
        worker.expect("serving");
        worker
    }

    /// `(inside, most)`: steps inside the limit now, and the most there ever were.
    async fn inside(&self) -> (i32, i32) {
        let row = self
            .admin
            .query_one(
                &format!(
                    "SELECT inside, most FROM \"{}\".probe_inside",
                    self.schema.name
                ),
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }

    /// Every call of the step as `(run_id, pid, at_ms)`, by time.
    async fn calls(&self) -> Vec<(String, i32, i64)> {
        self.admin
            .query(
                &format!(
                    "SELECT run_id, pid, at_ms FROM \"{}\".probe_calls ORDER BY at_ms, run_id",
                    self.schema.name
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    /// The places of the limit recorded in the store (live or not yet swept).
    async fn places(&self) -> i64 {
        self.admin
            .query_one(
                &format!(
                    "SELECT count(*) FROM \"{}\".limit_permits",
                    self.schema.name
                ),
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Waits until every run of `runs` has `status`.
    async fn until(&self, runs: &[String], status: RunStatus) {
        let deadline = Instant::now() + Duration::from_secs(120);
        'wait: loop {
            assert!(
                Instant::now() < deadline,
                "runs {runs:?} did not reach {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
            for run in runs {
                match self.store.run_info(run).await.unwrap() {
                    Some(info) if info.status == status => {}
                    _ => continue 'wait,
                }
            }
            return;
        }
    }
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:02}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_of_two_holds_across_twenty_runs_on_three_workers() {
    let setup = Setup::new("l_two", 2000).await;
    let runs = names("run", 20);
    let share = |k: usize| -> Vec<String> { runs.iter().skip(k).step_by(3).cloned().collect() };
    let workers: Vec<Worker> = (0..3)
        .map(|k| setup.worker("concurrent:2", &share(k), 100))
        .collect();
    setup.until(&runs, RunStatus::Completed).await;
    let calls = setup.calls().await;
    drop(workers);
    // Never more than 2 inside at once; 2 at some point (20 runs of 100 ms each).
    assert_eq!(setup.inside().await, (0, 2));
    // Every step ran once, on every worker.
    let mut called: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
    called.sort_unstable();
    assert_eq!(called, runs.iter().map(String::as_str).collect::<Vec<_>>());
    let pids: std::collections::BTreeSet<i32> = calls.iter().map(|c| c.1).collect();
    assert_eq!(pids.len(), 3, "{calls:?}");
    assert_eq!(setup.places().await, 0, "every place was given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_across_three_workers() {
    let setup = Setup::new("l_rate", 2000).await;
    let (n, period_ms) = (2, 1500);
    let runs = names("run", 6);
    let share = |k: usize| -> Vec<String> { runs.iter().skip(k).step_by(3).cloned().collect() };
    let workers: Vec<Worker> = (0..3)
        .map(|k| setup.worker(&format!("rate:{n}:{period_ms}"), &share(k), 0))
        .collect();
    setup.until(&runs, RunStatus::Completed).await;
    drop(workers);
    let calls = setup.calls().await;
    assert_eq!(calls.len(), runs.len(), "{calls:?}");
    // Any `n + 1` consecutive starts span at least a period. A call is probed a moment after
    // its start was admitted (both on the server's clock); a probe that lags by more than
    // SLACK_MS makes this fail, never pass wrongly.
    const SLACK_MS: i64 = 250;
    for window in calls.windows(n + 1) {
        let span = window[n].2 - window[0].2;
        assert!(span >= period_ms - SLACK_MS, "{span} ms: {calls:?}");
    }
    assert_eq!(setup.places().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_held_by_a_killed_worker_comes_back_after_its_lease() {
    let setup = Setup::new("l_kill", 1000).await;
    let mut holder = setup.worker("concurrent:1", &["held".to_owned()], 0);
    holder.expect("inside held");
    let waiter = setup.worker("concurrent:1", &["after".to_owned()], 0);
    // Two lease times: the holder renews its lease, so its place stays taken.
    tokio::time::sleep(Duration::from_millis(2 * setup.ttl_ms)).await;
    let calls = setup.calls().await;
    assert_eq!(
        calls.len(),
        1,
        "the waiter went in while the place was held: {calls:?}"
    );
    assert_eq!(setup.places().await, 1);
    holder.kill();
    std::fs::write(&setup.go, b"").unwrap();
    setup
        .until(
            &["after".to_owned(), "held".to_owned()],
            RunStatus::Completed,
        )
        .await;
    // The wait shows in the waiter's trace: the limit's name and the time waited.
    let line = waiter.expect_all(&["waited for the limit", "limit=\"model\""]);
    assert!(line.contains("waited_ms="), "{line}");
    let calls = setup.calls().await;
    // "held" once in the killed worker, then again in the other (its step was never
    // recorded), and "after" once, all one at a time.
    let by: Vec<(&str, bool)> = calls
        .iter()
        .map(|c| (c.0.as_str(), c.1 == waiter.pid() as i32))
        .collect();
    assert_eq!(by.len(), 3, "{calls:?}");
    assert_eq!(by[0], ("held", false));
    assert!(
        by[1..].contains(&("after", true)) && by[1..].contains(&("held", true)),
        "{calls:?}"
    );
    // The killed worker's step never left: its count stays, so each later step counted
    // itself beside it (2), never beside another live one (3).
    assert_eq!(setup.inside().await, (1, 2));
    assert_eq!(setup.places().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_waiting_for_the_limit_is_cancelled_from_another_process() {
    let setup = Setup::new("l_cancel", 2000).await;
    let holder = setup.worker("concurrent:1", &["held".to_owned()], 0);
    holder.expect("inside held");
    let waiter = setup.worker("concurrent:1", &["waiter".to_owned()], 0);
    waiter.expect_all(&["waits for the limit", "limit=\"model\""]);
    let info = setup.store.run_info("waiter").await.unwrap().unwrap();
    assert_eq!(info.status, RunStatus::Running);
    let other = Runtime::builder().build(setup.store.clone());
    other.cancel("waiter", "no longer needed").await.unwrap();
    setup
        .until(&["waiter".to_owned()], RunStatus::Cancelled)
        .await;
    let calls = setup.calls().await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].0, "held");
    assert_eq!(setup.places().await, 1, "the holder still holds its place");
    std::fs::write(&setup.go, b"").unwrap();
    setup
        .until(&["held".to_owned()], RunStatus::Completed)
        .await;
    assert_eq!(setup.inside().await, (0, 1));
    assert_eq!(setup.places().await, 0);
    drop((holder, waiter));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_that_fails_or_panics_gives_its_place_back() {
    let setup = Setup::new("l_fail", 2000).await;
    let runs = ["panic-0", "fail-0", "run-0"].map(str::to_owned);
    let worker = setup.worker("concurrent:1", &runs, 0);
    // A place kept by a failed try would stop every other step of this worker, whose lease
    // stays live: the runs would never end.
    setup.until(&runs, RunStatus::Completed).await;
    drop(worker);
    let mut tries: Vec<String> = setup.calls().await.into_iter().map(|c| c.0).collect();
    tries.sort_unstable();
    assert_eq!(tries, ["fail-0", "fail-0", "panic-0", "panic-0", "run-0"]);
    assert_eq!(setup.inside().await, (0, 1));
    assert_eq!(setup.places().await, 0);
}
