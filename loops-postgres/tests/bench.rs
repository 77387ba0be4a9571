//! Measurements of the PostgreSQL store, printed as tables (figures in `docs/postgres.md`):
//!
//! - one durable commit of a raw single-row `INSERT` (the floor), and of one transition and
//!   one step record through `PgStore` with two round trips per commit (`one_round_trip(false)`,
//!   as before schema version 9) and with one, and through `RedbStore` for comparison, one
//!   after another on one run: p50, p99 and mean, and the ratio to the raw `INSERT`;
//! - throughput, in transitions per second, of 1, 2 and 4 workers, each a runtime with a
//!   `PgStore` and a pool of its own of [`POOL`] connections, in this process, driving twice
//!   and sixteen times as many runs as connections ([`RUNS`]), with the mean number of
//!   writes per one-round-trip statement; against the floor at the same number of
//!   connections: the
//!   `pgbench` binary with a script of one single-row `INSERT` per transaction
//!   (`-M prepared -c N -j N -T secs -n`), run in the same process's benchmark, on a table
//!   of the bench's schema.
//!
//! `cargo test --release -p loops-postgres --test bench -- --ignored --nocapture`
//! (`LOOPS_BENCH_N` sets the commits per latency figure, default 2000; `LOOPS_BENCH_SECS`
//! the seconds of each throughput figure, default 10; `PGBENCH` the pgbench binary, default
//! `/usr/bin/pgbench`.)

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// Counts its steps, and ends each run at its next step once `stop` is set.
struct Timed {
    steps: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl CountHandler for Timed {
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
        self.steps.fetch_add(1, Ordering::Relaxed);
        Ok(if self.stop.load(Ordering::Relaxed) {
            StepNext::Done { n }
        } else {
            StepNext::Step { i: i + 1, n, note }
        })
    }
}

/// Connections in each worker's pool in the throughput figures.
const POOL: usize = 4;

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
        key_nonce: None,
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
/// one run `run_id` of `store`.
async fn store_latency(store: &dyn Store, run_id: &str, n: usize) -> (Stats, Stats) {
    let lease: Lease = store.acquire(run_id).await.unwrap().unwrap();
    store
        .write(
            Some(&lease),
            Write::Create {
                info: info(run_id),
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
                    run_id: run_id.into(),
                    seq,
                    state: "Step".into(),
                    record: bytes,
                    terminal: false,
                    at_ms: 1,
                    hands_over: false,
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
                    run_id: run_id.into(),
                    seq: n as u64,
                    name: "effect".into(),
                    occurrence,
                    record: bytes,
                    clear_error_at_ms: None,
                },
            )
            .await
            .unwrap();
        steps.push(t.elapsed());
    }
    (stats(transitions), stats(steps))
}

/// CPU time in clock ticks (1/100 s on Linux): `(this process, its waited-for children,
/// the PostgreSQL server)`; the server's is every live `postgres` process's plus the
/// children its postmaster reaped (ended sessions). Linux only; zeros elsewhere.
fn cpu_ticks() -> (u64, u64, u64) {
    // Fields 14-17 of /proc/<pid>/stat: utime, stime, cutime, cstime.
    let stat = |pid: &str| -> Option<(String, [u64; 4])> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (head, rest) = text.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_owned();
        let f: Vec<u64> = rest
            .split_whitespace()
            .skip(11)
            .take(4)
            .filter_map(|x| x.parse().ok())
            .collect();
        Some((comm, [*f.first()?, *f.get(1)?, *f.get(2)?, *f.get(3)?]))
    };
    let (me, children) = stat("self").map_or((0, 0), |(_, f)| (f[0] + f[1], f[2] + f[3]));
    let mut server = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.bytes().all(|b| b.is_ascii_digit())
            && let Some((comm, f)) = stat(&name)
            && comm == "postgres"
        {
            server += f[0] + f[1] + f[2] + f[3];
        }
    }
    (me, children, server)
}

/// A throughput figure: commits per second, and the CPU per commit, in µs, of the client
/// (loops' process, or pgbench) and of the server.
struct Rate {
    per_s: f64,
    client_us: f64,
    server_us: f64,
}

fn rate(commits: u64, elapsed: Duration, client_ticks: u64, server_ticks: u64) -> Rate {
    let us = |ticks: u64| ticks as f64 * 10_000.0 / commits.max(1) as f64;
    Rate {
        per_s: commits as f64 / elapsed.as_secs_f64(),
        client_us: us(client_ticks),
        server_us: us(server_ticks),
    }
}

/// Runs per worker in the throughput figures: as many as it has connections, twice as many
/// (the figure against the floor before group commit), and sixteen times as many (where
/// the writes of many runs share a statement).
const RUNS: [usize; 2] = [2 * POOL, 16 * POOL];

/// Transitions per second of `workers` runtimes, each with a store and pool of its own of
/// [`POOL`] connections and `runs` runs, over `secs` seconds (after one second of warm-up),
/// counted by the handler (one handler call per transition), and the commits' mean batch.
async fn throughput(
    schema: &common::TestSchema,
    (workers, runs): (usize, usize),
    secs: u64,
    one_round_trip: bool,
) -> (Rate, f64) {
    let steps = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    let mut stores = Vec::new();
    for w in 0..workers {
        let store = loops_postgres::PgStore::builder(common::pg_config())
            .schema(schema.name.clone())
            .pool_size(POOL)
            .one_round_trip(one_round_trip)
            .connect()
            .await
            .unwrap();
        stores.push(store.clone());
        let rt = Runtime::builder().build(store);
        for i in 0..runs {
            let rt = rt.clone();
            let id = format!("t{workers}-{runs}-{one_round_trip}-{w}-{i}");
            let handler = Timed {
                steps: Arc::clone(&steps),
                stop: Arc::clone(&stop),
            };
            tasks.push(tokio::spawn(async move {
                rt.run(&id, Count::Start { n: u32::MAX }, &handler)
                    .await
                    .unwrap();
            }));
        }
    }
    let counts = || {
        stores.iter().fold((0, 0), |(writes, batches), store| {
            let c = store.commit_counts();
            (writes + c.one_round_trip, batches + c.batches)
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (from, t, cpu) = (steps.load(Ordering::Relaxed), Instant::now(), cpu_ticks());
    let before = counts();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (to, elapsed, end) = (steps.load(Ordering::Relaxed), t.elapsed(), cpu_ticks());
    let after = counts();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let batch = (after.0 - before.0) as f64 / (after.1 - before.1).max(1) as f64;
    (
        rate(to - from, elapsed, end.0 - cpu.0, end.2 - cpu.2),
        batch,
    )
}

/// Transactions per second of `pgbench` at `clients` connections for `secs` seconds, each
/// transaction one single-row `INSERT` (of a payload the size of a transition record) into
/// a table of `schema`, committed durably (`synchronous_commit = on`).
fn pgbench_floor(schema: &str, clients: usize, secs: u64) -> Rate {
    let config: tokio_postgres::Config = common::pg_config().parse().unwrap();
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres").to_owned();
    let db = config.get_dbname().unwrap_or(&user).to_owned();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("insert.sql");
    std::fs::write(
        &script,
        format!(
            "INSERT INTO \"{schema}\".floor (payload) VALUES (repeat('x', {}));\n",
            record(1).len()
        ),
    )
    .unwrap();
    let bin = std::env::var("PGBENCH").unwrap_or_else(|_| "/usr/bin/pgbench".to_owned());
    let cpu = cpu_ticks();
    let out = std::process::Command::new(bin)
        .env("PGOPTIONS", "-c synchronous_commit=on")
        .args(["-h", &host, "-p", &port.to_string(), "-U", &user])
        .args(["-n", "-M", "prepared", "-f"])
        .arg(&script)
        .args(["-c", &clients.to_string(), "-j", &clients.to_string()])
        .args(["-T", &secs.to_string(), &db])
        .output()
        .expect("run pgbench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pgbench failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let end = cpu_ticks();
    // "tps = 1234.567890 (without initial connection time)"
    let tps: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no tps in pgbench's output: {stdout}"));
    // pgbench's CPU includes its connections' setup: a little over the run's own.
    let commits = (tps * secs as f64) as u64;
    rate(
        commits,
        Duration::from_secs(secs),
        end.1 - cpu.1,
        end.2 - cpu.2,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: cargo test --release -p loops-postgres --test bench -- --ignored --nocapture"]
async fn bench() {
    let n: usize = std::env::var("LOOPS_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let secs: u64 = std::env::var("LOOPS_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let schema = common::TestSchema::new("bench").await;
    // The latency loops hold one lease without a runtime to renew it: make it outlast them.
    let ttl = Duration::from_secs(3600);
    let one_trip = schema.store(ttl).await;
    let two_trips = loops_postgres::PgStore::builder(common::pg_config())
        .schema(schema.name.clone())
        .lease_ttl(ttl)
        .one_round_trip(false)
        .connect()
        .await
        .unwrap();

    // The floor: a raw single-row INSERT, one durable commit each, on the same server,
    // with the same settings (synchronous_commit = on).
    let mut config: tokio_postgres::Config = common::pg_config().parse().unwrap();
    config.options("-c synchronous_commit=on");
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "CREATE TABLE \"{s}\".raw (id bigint PRIMARY KEY, payload text NOT NULL); \
             CREATE TABLE \"{s}\".floor (id bigserial PRIMARY KEY, payload text NOT NULL)",
            s = schema.name
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
    let (two_transition, two_step) = store_latency(&two_trips, "lat2", n).await;
    let (one_transition, one_step) = store_latency(&one_trip, "lat1", n).await;
    // Every write after the create, on one round trip.
    assert_eq!(one_trip.commit_counts().one_round_trip, 2 * n as u64);

    let dir = tempfile::tempdir().unwrap();
    let redb = loops_core::RedbStore::open(dir.path().join("bench.redb")).unwrap();
    let (redb_transition, redb_step) = store_latency(&redb, "lat", n).await;

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
        ("PgStore transition, two round trips", &two_transition),
        ("PgStore transition, one round trip", &one_transition),
        ("PgStore step record, two round trips", &two_step),
        ("PgStore step record, one round trip", &one_step),
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
    println!(
        "throughput over {secs} s: loops transitions/s (workers of {POOL} connections, {} or {} \
         runs each) against pgbench single-row INSERT transactions/s at as many connections",
        RUNS[0], RUNS[1]
    );
    println!(
        "| workers | connections | pgbench floor tps | loops, two round trips, {a} runs | loops, one round trip, {a} runs | / floor | mean batch | loops, one round trip, {b} runs | / floor | mean batch | CPU µs per commit, client + server: pgbench | two round trips | one round trip, {a} runs | {b} runs |",
        a = RUNS[0],
        b = RUNS[1]
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let cpu = |r: &Rate| format!("{:.0} + {:.0}", r.client_us, r.server_us);
    for workers in [1, 2, 4] {
        let connections = workers * POOL;
        let floor = pgbench_floor(&schema.name, connections, secs);
        let (two, _) = throughput(&schema, (workers, RUNS[0]), secs, false).await;
        let (one, batch) = throughput(&schema, (workers, RUNS[0]), secs, true).await;
        let (many, many_batch) = throughput(&schema, (workers, RUNS[1]), secs, true).await;
        println!(
            "| {workers} | {connections} | {:.0} | {:.0} | {:.0} | {:.2} | {batch:.1} | {:.0} | {:.2} | {many_batch:.1} | {} | {} | {} | {} |",
            floor.per_s,
            two.per_s,
            one.per_s,
            one.per_s / floor.per_s,
            many.per_s,
            many.per_s / floor.per_s,
            cpu(&floor),
            cpu(&two),
            cpu(&one),
            cpu(&many)
        );
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
