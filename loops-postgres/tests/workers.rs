//! Worker processes over one database: this test binary, re-run as `worker_process`, serves
//! the `chain` workflow on a PostgreSQL schema of the test's own, and appends every side
//! effect to a ledger file outside the database.
//!
//! - Three workers share the runs; random workers are SIGKILLed while runs progress and
//!   restarted. Every run ends exactly once, with no gap or duplicate in its history, and no
//!   effect runs again after its record committed.
//! - A worker is SIGSTOPped while it handles a state; its lease lapses and another worker
//!   finishes the run; resumed, the paused worker sees its lease lapsed by its own clock and
//!   sends no commit (which the store would refuse: fencing).
//! - With the `failpoints` feature: a worker is paused just before a step's closure for
//!   longer than its lease; another worker runs and records the step; resumed, the paused
//!   worker does not run the closure.
//! - With the `failpoints` feature: a worker is SIGSTOPped between the two round trips of a
//!   commit, holding its row locks; the server ends its session after the lease time, and
//!   another worker finishes the run while it is still stopped.
//!
//! A longer torture of the first kind (48 runs of 80 steps, up to 60 kills; under a minute):
//! `cargo test -p loops-postgres --test workers -- --ignored torture --nocapture`.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::chain::{Chain, Ledger, Linker, verify};
use common::worker::Worker;
use loops::{Context, RetryPolicy, RunStatus, Runtime, Workflow};
use loops_core::Store;
use serde::{Deserialize, Serialize};

/// Appends `run seq exec` lines to a file shared by the workers (one `write` per line, in
/// append mode: lines of several processes never interleave).
struct FileLedger {
    path: PathBuf,
    next: std::sync::atomic::AtomicU64,
}

impl Ledger for FileLedger {
    fn effect(&self, run_id: &str, seq: u64) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let exec = format!("{}-{n}", std::process::id());
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .unwrap();
        f.write_all(format!("{run_id} {seq} {exec}\n").as_bytes())
            .unwrap();
        exec
    }
}

/// The fencing test's workflow: `Hold` records a step, then (in the worker told to) blocks
/// until the test lets it go, then commits `End` naming the worker that committed it.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "fence")]
enum Fence {
    #[initial]
    #[next(Hold)]
    Start,
    #[next(End)]
    Hold,
    #[terminal]
    End { by: String },
}

struct Holder {
    ledger: Arc<dyn Ledger>,
    /// A file whose appearance lets a holding handler go on.
    hold_until: Option<PathBuf>,
    /// Set by `hold` once its step is recorded: the next commit stops at the fault point.
    arm: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl FenceHandler for Holder {
    type Error = anyhow::Error;

    async fn start(&self, _ctx: &Context) -> Result<StartNext, Self::Error> {
        Ok(StartNext::Hold)
    }

    async fn hold(&self, ctx: &Context) -> Result<HoldNext, Self::Error> {
        let _: String = ctx
            .step("before", || async {
                Ok(self.ledger.effect(ctx.run_id(), ctx.seq()))
            })
            .await?;
        if let Some(go) = &self.hold_until {
            println!("holding");
            std::io::stdout().flush().unwrap();
            // Blocks the worker's only thread: nothing of it runs (no lease renewal either)
            // until the file appears, as in a process paused by SIGSTOP or a long GC.
            while !go.exists() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if let Some(arm) = &self.arm {
            arm.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(HoldNext::End {
            by: format!("{}", std::process::id()),
        })
    }
}

/// The child: a worker. Reads its settings from the environment.
#[tokio::test]
#[ignore = "run by the other tests of this file as their worker process"]
async fn worker_process() {
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let schema = env("LOOPS_SCHEMA");
    let ttl = Duration::from_millis(env("LOOPS_TTL_MS").parse().unwrap());
    let ledger: Arc<dyn Ledger> = Arc::new(FileLedger {
        path: PathBuf::from(env("LOOPS_LEDGER")),
        next: 0.into(),
    });
    let store = loops_postgres::PgStore::builder(common::pg_config())
        .schema(schema)
        .pool_size(4)
        .lease_ttl(ttl)
        .application_name(format!("loops-worker-{}", std::process::id()))
        // A stall between the two round trips of a commit needs a commit that takes two.
        .one_round_trip(std::env::var("LOOPS_STALL").as_deref() != Ok("1"))
        .connect()
        .await
        .unwrap();
    if env("LOOPS_MODE") == "fence" {
        let go = Some(PathBuf::from(env("LOOPS_GO"))).filter(|_| !env("LOOPS_GO").is_empty());
        // "1": stall between the round trips of the commit after the step; "step": stall
        // just before the step's closure.
        let stall = !env("LOOPS_STALL").is_empty() && env("LOOPS_STALL") != "0";
        // Stalls hold at the fault point, not in the handler.
        let hold_until = go.clone().filter(|_| !stall);
        let attached = go.is_some();
        let runtime = Runtime::builder()
            .register::<Fence, _>(Holder {
                ledger,
                hold_until: hold_until.clone(),
                arm: None,
            })
            .build(store);
        if attached {
            let arm = stall.then(|| match env("LOOPS_STALL").as_str() {
                "step" => stall_at(
                    "loops::step::before_effect",
                    "paused before step",
                    go.clone().unwrap(),
                    true,
                ),
                _ => stall_at(
                    "loops_postgres::write::before_commit",
                    "paused before commit",
                    go.clone().unwrap(),
                    false,
                ),
            });
            // Drives the run attached, to print how it ended.
            let handler = Holder {
                ledger: Arc::new(FileLedger {
                    path: PathBuf::from(env("LOOPS_LEDGER")),
                    next: 100.into(),
                }),
                hold_until,
                arm,
            };
            match runtime.run("f", Fence::Start, &handler).await {
                Ok(end) => println!("ended {end:?}"),
                Err(e) => {
                    // With its causes, as `anyhow`'s `{:#}` shows them.
                    println!("error {:#}", anyhow::Error::from(e))
                }
            }
            return;
        }
        println!("serving");
        std::io::stdout().flush().unwrap();
        runtime.serve(Duration::from_millis(50)).await.unwrap();
        return;
    }
    let runtime = Runtime::builder()
        .retry(
            RetryPolicy::attempts(1000)
                .with_delays(Duration::from_millis(1), Duration::from_millis(10)),
        )
        .register::<Chain, _>(Linker {
            ledger,
            delay: Duration::from_millis(80),
        })
        .build(store);
    let links: u32 = env("LOOPS_LINKS").parse().unwrap();
    for run_id in env("LOOPS_RUNS").split(',').filter(|s| !s.is_empty()) {
        // Another worker may hold it (after a restart): it goes on there.
        let _ = runtime.start(run_id, Chain::Start { links }).await;
    }
    println!("serving");
    std::io::stdout().flush().unwrap();
    runtime.serve(Duration::from_millis(100)).await.unwrap();
}

/// Makes the first pass through the fault point `point` after the returned flag is set
/// (`armed`: set from the start) stop there: it prints `says` and blocks the worker's only
/// thread until `go` exists. At `loops_postgres::write::before_commit`, between the two
/// round trips of a commit; at `loops::step::before_effect`, just before a step's closure.
#[cfg(feature = "failpoints")]
fn stall_at(
    point: &str,
    says: &'static str,
    go: PathBuf,
    armed: bool,
) -> Arc<std::sync::atomic::AtomicBool> {
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(armed));
    let flag = armed.clone();
    fail::cfg_callback(point, move || {
        if flag.swap(false, std::sync::atomic::Ordering::SeqCst) {
            println!("{says}");
            std::io::stdout().flush().unwrap();
            while !go.exists() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    })
    .unwrap();
    armed
}

#[cfg(not(feature = "failpoints"))]
fn stall_at(
    _point: &str,
    _says: &'static str,
    _go: PathBuf,
    _armed: bool,
) -> Arc<std::sync::atomic::AtomicBool> {
    panic!("LOOPS_STALL needs the `failpoints` feature");
}

/// A small deterministic generator (xorshift), seeded from the clock and printed, so that a
/// failing schedule can be replayed with `LOOPS_SEED`.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("LOOPS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        println!("LOOPS_SEED={seed}");
        Rng(seed)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

async fn all_completed(store: &dyn Store, runs: &[String]) -> bool {
    for run in runs {
        match store.run_info(run).await.unwrap() {
            Some(info) if info.status == RunStatus::Completed => {}
            _ => return false,
        }
    }
    true
}

fn ledger_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Runs `runs` chains of `links` (80 ms each) over three workers, killing one at random every
/// 150-550 ms
/// (`kills` times) and restarting it; returns once every run completed and was verified.
async fn kill_workers(test: &str, runs: usize, links: u32, kills: usize) {
    let schema = common::TestSchema::new(test).await;
    let ttl_ms = 1000;
    // Migrate before the workers start (they would, one at a time, anyway).
    let store = schema.store(Duration::from_millis(ttl_ms)).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let run_ids: Vec<String> = (0..runs).map(|i| format!("run-{i:02}")).collect();
    let env = |k: usize| -> Vec<(&'static str, String)> {
        let mine: Vec<&str> = run_ids
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 == k)
            .map(|(_, r)| r.as_str())
            .collect();
        vec![
            ("LOOPS_SCHEMA", schema.name.clone()),
            ("LOOPS_TTL_MS", ttl_ms.to_string()),
            ("LOOPS_LEDGER", ledger.display().to_string()),
            ("LOOPS_LINKS", links.to_string()),
            ("LOOPS_RUNS", mine.join(",")),
            ("LOOPS_MODE", "chain".to_owned()),
        ]
    };
    let mut workers: Vec<Worker> = (0..3)
        .map(|k| Worker::spawn("worker_process", &env(k)))
        .collect();
    for w in &workers {
        w.expect("serving");
    }
    let mut rng = Rng::new();
    let mut killed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(150 + rng.below(400))).await;
        if all_completed(&store, &run_ids).await {
            break;
        }
        let k = rng.below(3) as usize;
        killed.push(workers[k].pid());
        // SIGKILL: no release of leases, no clean shutdown.
        workers[k].signal("-KILL");
        tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
        workers[k] = Worker::spawn("worker_process", &env(k));
    }
    while !all_completed(&store, &run_ids).await {
        assert!(
            Instant::now() < deadline,
            "runs did not complete in time; killed {killed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(workers);
    assert!(!killed.is_empty(), "no worker was killed");
    let lines = ledger_lines(&ledger);
    let report = verify(&store, &run_ids, links, &lines).await;
    // Runs whose effects were made by more than one process: taken over after a kill.
    let moved = run_ids
        .iter()
        .filter(|run| {
            let pids: std::collections::BTreeSet<&str> = lines
                .iter()
                .filter(|l| l.starts_with(&format!("{run} ")))
                .filter_map(|l| l.rsplit(' ').next()?.split('-').next())
                .collect();
            pids.len() > 1
        })
        .count();
    println!(
        "{} kills; {moved} runs moved to another process; {} effects ran again before their \
         record committed (the window)",
        killed.len(),
        report.repeated_before_record
    );
    assert!(moved > 0, "no run moved to another worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_killed_at_random_end_every_run_exactly_once() {
    kill_workers("w_kill", 12, 25, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "torture: cargo test -p loops-postgres --test workers -- --ignored torture --nocapture"]
async fn torture() {
    kill_workers("w_torture", 48, 80, 60).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_cannot_commit_after_its_lease_lapsed() {
    let schema = common::TestSchema::new("w_fence").await;
    let ttl = Duration::from_millis(500);
    let store = schema.store(ttl).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let go = dir.path().join("go");
    let env = |hold: bool| -> Vec<(&'static str, String)> {
        vec![
            ("LOOPS_SCHEMA", schema.name.clone()),
            ("LOOPS_TTL_MS", ttl.as_millis().to_string()),
            ("LOOPS_LEDGER", ledger.display().to_string()),
            ("LOOPS_MODE", "fence".to_owned()),
            (
                "LOOPS_GO",
                if hold {
                    go.display().to_string()
                } else {
                    String::new()
                },
            ),
        ]
    };
    let paused = Worker::spawn("worker_process", &env(true));
    paused.expect("holding");
    paused.signal("-STOP");
    // Three lease times: the paused worker's lease has lapsed.
    tokio::time::sleep(ttl * 3).await;
    let other = Worker::spawn("worker_process", &env(false));
    other.expect("serving");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !all_completed(&store, &["f".to_owned()]).await {
        assert!(
            Instant::now() < deadline,
            "the second worker never finished the run"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Resume the paused worker and let its handler return: its lease lapsed by its own
    // clock, so it does not even send its commit (the store would refuse it: fencing).
    paused.signal("-CONT");
    std::fs::write(&go, b"go").unwrap();
    let outcome = paused.expect("error ");
    assert!(
        outcome.starts_with("error run `f`: this worker's lease lapsed "),
        "{outcome}"
    );
    assert!(
        outcome.ends_with(
            " ms ago (by its own clock) before seq 1 could go on; another worker may hold the run"
        ),
        "{outcome}"
    );
    let history: Vec<(u64, String, String)> = store
        .history("f")
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.seq, r.state, r.payload.get().to_owned()))
        .collect();
    assert_eq!(
        history,
        vec![
            (0, "Start".into(), r#""Start""#.into()),
            (1, "Hold".into(), r#""Hold""#.into()),
            (
                2,
                "End".into(),
                format!(r#"{{"End":{{"by":"{}"}}}}"#, other.pid())
            ),
        ]
    );
    // The step the paused worker recorded before its pause stands, and was replayed.
    let steps = store.steps("f", 1).await.unwrap();
    assert_eq!(steps.len(), 1);
    let exec: String = serde_json::from_str(steps[0].2.output.get()).unwrap();
    assert!(exec.starts_with(&format!("{}-", paused.pid())), "{exec}");
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

/// Issue 15, item 10: a worker stopped inside a write transaction (after `BEGIN` and the row
/// locks, before `COMMIT`) kept its locks for good, and `claim_ready` (`SKIP LOCKED`) skipped
/// its run. The server now ends a session idle in a transaction for longer than the lease.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_between_the_round_trips_of_a_commit_loses_its_run() {
    let schema = common::TestSchema::new("w_stall").await;
    let ttl = Duration::from_millis(1000);
    let store = schema.store(ttl).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let go = dir.path().join("go");
    let env = |stall: bool| -> Vec<(&'static str, String)> {
        vec![
            ("LOOPS_SCHEMA", schema.name.clone()),
            ("LOOPS_TTL_MS", ttl.as_millis().to_string()),
            ("LOOPS_LEDGER", ledger.display().to_string()),
            ("LOOPS_MODE", "fence".to_owned()),
            (
                "LOOPS_GO",
                if stall {
                    go.display().to_string()
                } else {
                    String::new()
                },
            ),
            ("LOOPS_STALL", if stall { "1" } else { "0" }.to_owned()),
        ]
    };
    let paused = Worker::spawn("worker_process", &env(true));
    paused.expect("paused before commit");
    paused.signal("-STOP");
    let stopped = Instant::now();
    let admin = common::admin().await;
    let app = format!("loops-worker-{}", paused.pid());
    let in_transaction = || async {
        let n: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = $1 AND state = 'idle in transaction'",
                &[&app],
            )
            .await
            .unwrap()
            .get(0);
        n
    };
    // Stopped exactly there: its session holds an open transaction (the row locks).
    assert_eq!(in_transaction().await, 1);

    let other = Worker::spawn("worker_process", &env(false));
    other.expect("serving");
    // Before the fix the run stayed locked while the worker was stopped: never done.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !all_completed(&store, &["f".to_owned()]).await {
        assert!(
            Instant::now() < deadline,
            "the run was not taken over from the stopped worker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "taken over and finished {} ms after the worker stopped (lease {} ms)",
        stopped.elapsed().as_millis(),
        ttl.as_millis()
    );
    // The server ended the stopped worker's session; the worker is still stopped.
    assert_eq!(in_transaction().await, 0);

    paused.signal("-CONT");
    std::fs::write(&go, b"go").unwrap();
    let outcome = paused.expect("error ");
    // Its commit, sent on the session the server ended, did not land (the store error is
    // logged); its lease lapsed by its own clock meanwhile, so it stops instead of riding the
    // fault out.
    assert!(
        outcome.starts_with("error run `f`: this worker's lease lapsed "),
        "{outcome}"
    );
    assert!(
        outcome.ends_with(
            " ms ago (by its own clock) before seq 1 could go on; another worker may hold the run"
        ),
        "{outcome}"
    );
    let history: Vec<(u64, String, String)> = store
        .history("f")
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.seq, r.state, r.payload.get().to_owned()))
        .collect();
    assert_eq!(
        history,
        vec![
            (0, "Start".into(), r#""Start""#.into()),
            (1, "Hold".into(), r#""Hold""#.into()),
            (
                2,
                "End".into(),
                format!(r#"{{"End":{{"by":"{}"}}}}"#, other.pid())
            ),
        ]
    );
    // The step recorded before the stop stands, and was replayed, not run again.
    let steps = store.steps("f", 1).await.unwrap();
    assert_eq!(steps.len(), 1);
    let exec: String = serde_json::from_str(steps[0].2.output.get()).unwrap();
    assert!(exec.starts_with(&format!("{}-", paused.pid())), "{exec}");
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

/// Issue 15, item 11: a worker paused just before a step's closure, for longer than its
/// lease, used to run the closure when it woke, after the new owner had recorded the same
/// step. It now checks its lease's deadline on its monotonic clock first, and stops.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_before_a_step_does_not_run_it_after_its_lease_lapsed() {
    let schema = common::TestSchema::new("w_step").await;
    let ttl = Duration::from_millis(500);
    let store = schema.store(ttl).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let go = dir.path().join("go");
    let env = |stall: bool| -> Vec<(&'static str, String)> {
        vec![
            ("LOOPS_SCHEMA", schema.name.clone()),
            ("LOOPS_TTL_MS", ttl.as_millis().to_string()),
            ("LOOPS_LEDGER", ledger.display().to_string()),
            ("LOOPS_MODE", "fence".to_owned()),
            (
                "LOOPS_GO",
                if stall {
                    go.display().to_string()
                } else {
                    String::new()
                },
            ),
            ("LOOPS_STALL", if stall { "step" } else { "0" }.to_owned()),
        ]
    };
    let paused = Worker::spawn("worker_process", &env(true));
    paused.expect("paused before step");
    paused.signal("-STOP");
    let other = Worker::spawn("worker_process", &env(false));
    other.expect("serving");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !all_completed(&store, &["f".to_owned()]).await {
        assert!(
            Instant::now() < deadline,
            "the run was not taken over from the paused worker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    paused.signal("-CONT");
    std::fs::write(&go, b"go").unwrap();
    let outcome = paused.expect("error ");
    assert!(
        outcome.starts_with("error run `f`: this worker's lease lapsed "),
        "{outcome}"
    );
    assert!(
        outcome.ends_with(
            " ms ago (by its own clock) before seq 1 could go on; another worker may hold the run"
        ),
        "{outcome}"
    );
    // The step ran once, in the worker that took the run over; the paused one never ran it.
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!("f 1 {}-", other.pid())),
        "{lines:?}"
    );
    let steps = store.steps("f", 1).await.unwrap();
    assert_eq!(steps.len(), 1);
    let exec: String = serde_json::from_str(steps[0].2.output.get()).unwrap();
    assert!(exec.starts_with(&format!("{}-", other.pid())), "{exec}");
    let history: Vec<(u64, String)> = store
        .history("f")
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.seq, r.state))
        .collect();
    assert_eq!(
        history,
        [(0, "Start".into()), (1, "Hold".into()), (2, "End".into())]
    );
}
