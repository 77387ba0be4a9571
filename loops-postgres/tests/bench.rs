//! Measurements of the PostgreSQL store, printed as a table (figures in `docs/postgres.md`):
//!
//! - one durable commit of a raw single-row `INSERT` (the floor), and of one transition and
//!   one step record through `PgStore` (and through `RedbStore`, for comparison), one after
//!   another on one run: p50, p99 and mean, and the ratio to the raw `INSERT`;
//! - throughput, in transitions per second, of 8 and 64 concurrent runs driven by 1 and by 3
//!   workers (each worker a runtime with a `PgStore` and pool of its own, in this process).
//!
//! `cargo test --release -p loops-postgres --test bench -- --ignored --nocapture`
//! (`LOOPS_BENCH_N` sets the commits per latency figure, default 2000.)

mod common;

use std::time::{Duration, Instant};

use loops::{Context, Runtime, Workflow};
use loops_core::{Lease, RunInfo, RunStatus, Store, Write};
use loops_core::{SchemaHash, StepRecord, TransitionRecord};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "bench_count")]
enum Count {
    #[initial]
    #[next(Step)]
    Start { n: u32 },
    #[next(Step, Done)]
    Step { i: u32, n: u32, note: String },
    #[terminal]
    Done { n: u32 },
}

struct Counter;

impl CountHandler for Counter {
    type Error = std::convert::Infallible;

    async fn start(&self, _ctx: &Context, n: u32) -> Result<StartNext, Self::Error> {
        Ok(StartNext::Step {
            i: 0,
            n,
            note: "x".repeat(100),
        })
    }

    async fn step(
        &self,
        _ctx: &Context,
        i: u32,
        n: u32,
        note: String,
    ) -> Result<StepNext, Self::Error> {
        Ok(if i + 1 >= n {
            StepNext::Done { n }
        } else {
            StepNext::Step { i: i + 1, n, note }
        })
    }
}

struct Stats {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let n = samples.len();
    Stats {
        p50: samples[n / 2],
        p99: samples[(n * 99 / 100).min(n - 1)],
        mean: samples.iter().sum::<Duration>() / n as u32,
    }
}

fn us(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

fn info(run_id: &str) -> RunInfo {
    RunInfo {
        run_id: run_id.to_owned(),
        workflow: "bench".into(),
        schema: SchemaHash::from_u64(1),
        status: RunStatus::Running,
        state: "A".into(),
        seq: 0,
        attempt: 1,
        attempt_base: 0,
        interrupted: 0,
        created_ms: 0,
        updated_ms: 0,
        retry_at_ms: None,
        error: None,
        cancel: None,
        wait: None,
        block: None,
        entered: None,
        parent: None,
    }
}

fn record(seq: u64) -> Vec<u8> {
    let payload = format!(
        r#"{{"Step":{{"i":{seq},"n":1000000,"note":"{}"}}}}"#,
        "x".repeat(100)
    );
    serde_json::to_vec(&TransitionRecord {
        seq,
        state: "Step".into(),
        at_ms: 1,
        schema: SchemaHash::from_u64(1),
        payload: serde_json::value::RawValue::from_string(payload).unwrap(),
        migrated: None,
    })
    .unwrap()
}

/// p50/p99/mean of `n` transitions, then of `n` step records, committed one after another on
/// one run of `store`.
async fn store_latency(store: &dyn Store, n: usize) -> (Stats, Stats) {
    let lease: Lease = store.acquire("lat").await.unwrap().unwrap();
    store
        .write(
            Some(&lease),
            Write::Create {
                info: info("lat"),
                record: record(0),
                schema_text: "bench",
                attributes: Vec::new(),
            },
        )
        .await
        .unwrap();
    let mut transitions = Vec::with_capacity(n);
    for seq in 1..=n as u64 {
        let bytes = record(seq);
        let t = Instant::now();
        store
            .write(
                Some(&lease),
                Write::Transition {
                    run_id: "lat".into(),
                    seq,
                    state: "Step".into(),
                    record: bytes,
                    terminal: false,
                    schema: SchemaHash::from_u64(1),
                    at_ms: 1,
                },
            )
            .await
            .unwrap();
        transitions.push(t.elapsed());
    }
    let mut steps = Vec::with_capacity(n);
    for occurrence in 0..n as u32 {
        let bytes = serde_json::to_vec(&StepRecord {
            attempt: 1,
            at_ms: 1,
            duration_ms: 0,
            output: serde_json::value::RawValue::from_string(format!("\"{}\"", "y".repeat(100)))
                .unwrap(),
        })
        .unwrap();
        let t = Instant::now();
        store
            .write(
                Some(&lease),
                Write::Step {
                    run_id: "lat".into(),
                    seq: n as u64,
                    name: "effect".into(),
                    occurrence,
                    record: bytes,
                },
            )
            .await
            .unwrap();
        steps.push(t.elapsed());
    }
    (stats(transitions), stats(steps))
}

/// Transitions per second of `runs` concurrent runs of `transitions` each, spread over
/// `workers` runtimes (each with a store and pool of its own).
async fn throughput(
    schema: &common::TestSchema,
    workers: usize,
    runs: usize,
    transitions: u32,
) -> f64 {
    let mut runtimes = Vec::new();
    for _ in 0..workers {
        let store = loops_postgres::PgStore::builder(common::pg_config())
            .schema(schema.name.clone())
            .connect()
            .await
            .unwrap();
        runtimes.push(Runtime::builder().build(store));
    }
    let tag = format!("w{workers}-r{runs}");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..runs {
        let rt = runtimes[i % workers].clone();
        let id = format!("{tag}-{i}");
        tasks.push(tokio::spawn(async move {
            // Start .. Step x (transitions - 1) .. Done: `transitions` commits after the create.
            rt.run(&id, Count::Start { n: transitions - 1 }, &Counter)
                .await
                .unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    (runs as f64 * f64::from(transitions)) / elapsed.as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: cargo test --release -p loops-postgres --test bench -- --ignored --nocapture"]
async fn bench() {
    let n: usize = std::env::var("LOOPS_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let schema = common::TestSchema::new("bench").await;
    // The latency loops hold one lease without a runtime to renew it: make it outlast them.
    let store = schema.store(Duration::from_secs(3600)).await;

    // The floor: a raw single-row INSERT, one durable commit each, on the same server,
    // with the same settings (synchronous_commit = on).
    let mut config: tokio_postgres::Config = common::pg_config().parse().unwrap();
    config.options("-c synchronous_commit=on");
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "CREATE TABLE \"{}\".raw (id bigint PRIMARY KEY, payload text NOT NULL)",
            schema.name
        ))
        .await
        .unwrap();
    let insert = client
        .prepare(&format!(
            "INSERT INTO \"{}\".raw (id, payload) VALUES ($1, $2)",
            schema.name
        ))
        .await
        .unwrap();
    let payload = String::from_utf8(record(1)).unwrap();
    let mut raw = Vec::with_capacity(n);
    for id in 0..n as i64 {
        let t = Instant::now();
        client.execute(&insert, &[&id, &payload]).await.unwrap();
        raw.push(t.elapsed());
    }
    let raw = stats(raw);
    let (pg_transition, pg_step) = store_latency(&store, n).await;

    let dir = tempfile::tempdir().unwrap();
    let redb = loops_core::RedbStore::open(dir.path().join("bench.redb")).unwrap();
    let (redb_transition, redb_step) = store_latency(&redb, n).await;

    // One run driven by the runtime: handler, encoding, lease check and commit.
    let rt = Runtime::builder().build(schema.store(Duration::from_secs(10)).await);
    let t = Instant::now();
    rt.run("single", Count::Start { n: n as u32 - 1 }, &Counter)
        .await
        .unwrap();
    let runtime_mean = t.elapsed() / n as u32;

    let ratio = |d: Duration| d.as_secs_f64() / raw.p50.as_secs_f64();
    println!();
    println!("latency, one after another on one run ({n} commits each), µs");
    println!("| commit | p50 | p99 | mean | p50 / raw INSERT p50 |");
    println!("|---|---:|---:|---:|---:|");
    for (name, s) in [
        ("raw single-row INSERT (PostgreSQL)", &raw),
        ("PgStore transition", &pg_transition),
        ("PgStore step record", &pg_step),
        ("RedbStore transition", &redb_transition),
        ("RedbStore step record", &redb_step),
    ] {
        println!(
            "| {name} | {} | {} | {} | {:.2} |",
            us(s.p50),
            us(s.p99),
            us(s.mean),
            ratio(s.p50)
        );
    }
    println!(
        "| Runtime::run on PgStore, per transition (mean) | | | {} | {:.2} (mean) |",
        us(runtime_mean),
        runtime_mean.as_secs_f64() / raw.p50.as_secs_f64()
    );

    println!();
    println!("throughput, transitions/s (each run: 50 transitions)");
    println!("| concurrent runs | 1 worker | 3 workers |");
    println!("|---:|---:|---:|");
    for runs in [8, 64] {
        let one = throughput(&schema, 1, runs, 50).await;
        let three = throughput(&schema, 3, runs, 50).await;
        println!("| {runs} | {one:.0} | {three:.0} |");
    }
}

/// Attribute search on `LOOPS_BENCH_RUNS` runs (default 100 000), each created through
/// `PgStore` with three attributes (`repo`: 100 values; `issue`: one per run; `due`: a time):
/// `find_runs` by equality and by range, p50 and p99 of 200 calls each, and a scan of the
/// same runs without the index for comparison. Figures in docs/benchmarks.md.
///
/// `cargo test --release -p loops-postgres --test bench attribute_search -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: cargo test --release -p loops-postgres --test bench attribute_search -- --ignored --nocapture"]
async fn attribute_search() {
    use loops_core::{AttributeFilter, AttributeValue, RunFilter, find_runs};
    use std::sync::Arc;

    const T0: u64 = 1_767_225_600_000;
    let runs: u64 = std::env::var("LOOPS_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let schema = common::TestSchema::new("bench_search").await;
    let store: Arc<dyn Store> = Arc::new(schema.store(Duration::from_secs(60)).await);
    let t = Instant::now();
    let ids: Vec<u64> = (0..runs).collect();
    for chunk in ids.chunks(256) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|&i| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let id = format!("run-{i:07}");
                    let write = Write::Create {
                        info: info(&id),
                        record: record(0),
                        schema_text: "bench",
                        attributes: vec![
                            (
                                "repo".to_owned(),
                                AttributeValue::Str(format!("acme/repo-{}", i % 100)),
                            ),
                            ("issue".to_owned(), AttributeValue::Int(i as i64)),
                            ("due".to_owned(), AttributeValue::Time(T0 + i * 1000)),
                        ],
                    };
                    store.write(None, write).await.unwrap();
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    }
    let seed = t.elapsed();
    common::admin()
        .await
        .batch_execute(&format!("ANALYZE \"{}\".attributes", schema.name))
        .await
        .unwrap();
    let mid = runs / 2;
    let cases: Vec<(&str, RunFilter)> = vec![
        (
            "issue = one value (int, 1 run)",
            RunFilter::new().attribute("issue", mid as i64),
        ),
        (
            "issue in a range of 100 (int)",
            RunFilter::new().where_attribute(AttributeFilter::int_range(
                "issue",
                mid as i64..=mid as i64 + 99,
            )),
        ),
        (
            "due in a range of 100 s (time)",
            RunFilter::new().where_attribute(AttributeFilter::time_range(
                "due",
                T0 + mid * 1000..=T0 + (mid + 99) * 1000,
            )),
        ),
        (
            "repo = one of 100 values (str, 1 % of the runs)",
            RunFilter::new().attribute("repo", "acme/repo-7"),
        ),
        (
            "repo and status running and issue range (3 conditions)",
            RunFilter::new()
                .attribute("repo", "acme/repo-7")
                .status(RunStatus::Running)
                .where_attribute(AttributeFilter::int_range("issue", 0..=mid as i64)),
        ),
    ];
    println!();
    println!(
        "attribute search on {runs} PostgreSQL runs (created with their attributes in {:.1} s), µs",
        seed.as_secs_f64()
    );
    println!("| query | runs found | p50 | p99 |");
    println!("|---|---:|---:|---:|");
    for (label, filter) in &cases {
        let found = find_runs(&*store, filter).await.unwrap().len();
        let mut samples = Vec::with_capacity(200);
        for _ in 0..200 {
            let t = Instant::now();
            let n = find_runs(&*store, filter).await.unwrap().len();
            samples.push(t.elapsed());
            assert_eq!(n, found);
        }
        let s = stats(samples);
        println!("| {label} | {found} | {} | {} |", us(s.p50), us(s.p99));
    }
    // Without the index: every running run's row, then its attributes, filtered in memory.
    let t = Instant::now();
    let mut found = 0;
    for info in store.list(RunStatus::Running, None).await.unwrap() {
        let attributes = store.attributes(&info.run_id).await.unwrap();
        if attributes.get("repo") == Some(&AttributeValue::Str("acme/repo-7".into())) {
            found += 1;
        }
    }
    println!(
        "| scan: every running run, filtered by repo (no index; once) | {found} | {} | |",
        us(t.elapsed())
    );
}
