//! Versions side by side on PostgreSQL (issue 14): a worker built with version 1 only and a
//! worker built with version 2 only, sharing one store during a "rolling deploy". Each claims
//! only the runs of the schema it has compiled in (the claim filters on the runs' `schema`
//! column), so every run finishes exactly once, on its own version, and the v2 worker never
//! claims a v1 run (nor blocks one, nor logs about one).

mod common;
// The root package's log capture: one global subscriber per test binary, lines picked by
// run id.
#[path = "../../tests/logs/mod.rs"]
mod logs;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use logs::{Lines, captured};
use loops::testing::{HookedStore, Verdict, WriteHook, WriteSeen};
use loops::{Context, Lease, RunInfo, RunStatus, Runtime, Store};

mod v1 {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "pg_evo", version = 1)]
    pub enum Order {
        #[initial]
        #[next(Done)]
        Start { n: u32 },
        #[terminal]
        Done { n: u32 },
    }
}

mod v2 {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "pg_evo", version = 2)]
    pub enum Order {
        #[initial]
        #[next(Done)]
        Start { n: u32, note: String },
        #[terminal]
        Done { n: u32, note: String },
    }
}

/// Version 2 with a wrong claim: it retypes `Start::n`, and claims to accept version 1.
mod wrong {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    /// Version 1's schema hash (asserted by `the_wrong_claim_names_version_1`).
    pub const V1_HASH: &str = "7351faedcfb607cd";

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "pg_evo", version = 2, accepts = ["7351faedcfb607cd"])]
    pub enum Order {
        #[initial]
        #[next(Done)]
        Start { n: String },
        #[terminal]
        Done { n: u32 },
    }
}

/// Version 2 that accepts version 1 as it is (only the version changed) and whose handler
/// waits for another event, `stop`, where version 1's waits for `go`.
mod accepting {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "pg_evo", version = 2, accepts = ["7351faedcfb607cd"])]
    pub enum Order {
        #[initial]
        #[next(Done)]
        Start { n: u32 },
        #[terminal]
        Done { n: u32 },
    }

    pub struct Stops;

    impl OrderHandler for Stops {
        type Error = anyhow::Error;
        async fn start(&self, ctx: &loops::Context, n: u32) -> anyhow::Result<StartNext> {
            let _stop: u32 = ctx.wait_for("stop").await?;
            Ok(StartNext::Done { n: n + 100 })
        }
    }
}

/// `(run id, version)` of every side effect, shared by every worker of the test.
type Effects = Arc<Mutex<Vec<(String, u32)>>>;

/// Waits in `Start` for the event `go`, then runs its one side effect as a step.
#[derive(Clone)]
struct Worker {
    version: u32,
    effects: Effects,
    /// If set, the handler counts itself in `at_gate` and waits for a permit before its
    /// side effect (a worker kept busy).
    gate: Option<(Arc<tokio::sync::Semaphore>, Arc<AtomicUsize>)>,
}

impl Worker {
    async fn start(&self, ctx: &Context) -> anyhow::Result<()> {
        let _go: u32 = ctx.wait_for("go").await?;
        if let Some((gate, at_gate)) = &self.gate {
            at_gate.fetch_add(1, Ordering::SeqCst);
            gate.acquire().await?.forget();
        }
        let (effects, run, version) = (self.effects.clone(), ctx.run_id().to_owned(), self.version);
        ctx.step("effect", || async {
            effects.lock().unwrap().push((run.clone(), version));
            Ok(())
        })
        .await?;
        Ok(())
    }
}

impl v1::OrderHandler for Worker {
    type Error = anyhow::Error;
    async fn start(&self, ctx: &Context, n: u32) -> anyhow::Result<v1::StartNext> {
        Worker::start(self, ctx).await?;
        Ok(v1::StartNext::Done { n })
    }
}

impl v2::OrderHandler for Worker {
    type Error = anyhow::Error;
    async fn start(&self, ctx: &Context, n: u32, note: String) -> anyhow::Result<v2::StartNext> {
        Worker::start(self, ctx).await?;
        Ok(v2::StartNext::Done { n, note })
    }
}

/// Logs, on the store behind a `HookedStore`, the runs its `claim_ready` handed out, and its
/// blocks and unblocks (`Block <run>`, `Unblock <run>`).
struct Claims {
    claimed: Arc<Mutex<Vec<String>>>,
    blocks: Arc<Mutex<Vec<String>>>,
}

impl WriteHook for Claims {
    fn before(&self, seen: &WriteSeen) -> Verdict {
        if let ("Block" | "Unblock", Some(run_id)) = (seen.kind, &seen.run_id) {
            self.blocks
                .lock()
                .unwrap()
                .push(format!("{} {run_id}", seen.kind));
        }
        Verdict::Go
    }

    fn claimed(&self, reply: &loops::Result<Vec<(RunInfo, Lease)>>) {
        if let Ok(claimed) = reply {
            self.claimed
                .lock()
                .unwrap()
                .extend(claimed.iter().map(|(info, _)| info.run_id.clone()));
        }
    }
}

const RUNS: u32 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_worker_and_a_v2_worker_each_finish_their_own_runs_once() {
    let schema = common::TestSchema::new("evo_side").await;
    let ttl = Duration::from_secs(5);
    let effects = Effects::default();
    let worker = |version| Worker {
        version,
        effects: Arc::clone(&effects),
        gate: None,
    };
    // Runs of both versions, created by a build that has both, parked in `Start`.
    {
        let creator = Runtime::builder()
            .register::<v1::Order, _>(worker(1))
            .register::<v2::Order, _>(worker(2))
            .build(schema.store(ttl).await);
        for i in 0..RUNS {
            creator
                .start(&format!("a{i}"), v1::Order::Start { n: i })
                .await
                .unwrap();
            let note = format!("b{i}");
            creator
                .start(&format!("b{i}"), v2::Order::Start { n: i, note })
                .await
                .unwrap();
        }
        for i in 0..RUNS {
            for id in [format!("a{i}"), format!("b{i}")] {
                while creator.run_info(&id).await.unwrap().unwrap().status != RunStatus::Waiting {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
        creator.shutdown().await;
    }
    // The rolling deploy: an old worker (v1 only) and a new one (v2 only).
    let claimed_by_v2 = Arc::new(Mutex::new(Vec::new()));
    let old = Runtime::builder()
        .register::<v1::Order, _>(worker(1))
        .build(schema.store(ttl).await);
    let new = Runtime::builder()
        .register::<v2::Order, _>(worker(2))
        .build(HookedStore::with_hook(
            schema.store(ttl).await,
            Claims {
                claimed: Arc::clone(&claimed_by_v2),
                blocks: Arc::default(),
            },
        ));
    let serve = |rt: &Runtime| {
        let rt = rt.clone();
        tokio::spawn(async move { rt.serve(Duration::from_millis(20)).await })
    };
    // The old worker is live (it announced the schemas it routes) before the new one
    // starts, as in a rolling deploy.
    old.resume_all().await.unwrap();
    let (serving_old, serving_new) = (serve(&old), serve(&new));
    // Every event is sent through the new worker: it wakes only what it can route, and the
    // old worker's poll claims the rest.
    for i in 0..RUNS {
        for id in [format!("a{i}"), format!("b{i}")] {
            new.send(&id, "go", &1u32).await.unwrap();
        }
    }
    for i in 0..RUNS {
        assert_eq!(
            old.wait::<v1::Order>(&format!("a{i}")).await.unwrap(),
            v1::Order::Done { n: i }
        );
        assert!(matches!(
            new.wait::<v2::Order>(&format!("b{i}")).await.unwrap(),
            v2::Order::Done { n, .. } if n == i
        ));
    }
    old.shutdown().await;
    new.shutdown().await;
    serving_old.await.unwrap().unwrap();
    serving_new.await.unwrap().unwrap();

    // Each run's side effect ran once, on its own version.
    let mut by_run: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (run, version) in effects.lock().unwrap().iter() {
        by_run.entry(run.clone()).or_default().push(*version);
    }
    let expected: BTreeMap<String, Vec<u32>> = (0..RUNS)
        .flat_map(|i| [(format!("a{i}"), vec![1]), (format!("b{i}"), vec![2])])
        .collect();
    assert_eq!(by_run, expected);
    // The new worker claimed no run of version 1, and nothing was blocked.
    let claimed = claimed_by_v2.lock().unwrap().clone();
    assert!(claimed.iter().all(|id| id.starts_with('b')), "{claimed:?}");
    let store = schema.store(ttl).await;
    assert!(
        store
            .list(RunStatus::Blocked, None)
            .await
            .unwrap()
            .is_empty()
    );
    for i in 0..RUNS {
        let history = store.history(&format!("a{i}")).await.unwrap();
        assert_eq!(history.len(), 2);
        assert!(
            history
                .iter()
                .all(|r| r.schema == <v1::Order as loops::Workflow>::SCHEMA_HASH.pinned())
        );
    }
}

async fn until_status(store: &loops_postgres::PgStore, run_id: &str, status: RunStatus) {
    while store.run_info(run_id).await.unwrap().unwrap().status != status {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A run that no live worker can route: blocked once (one Block write, one log line) by a
/// worker of another version, and only once the workers that route it are gone; a worker
/// that routes it and joins later unblocks it and finishes it. While a worker that routes a
/// run is live, even one too busy to take it, nothing is blocked.
///
/// Every worker is a runtime with a store (a pool and a lease owner) of its own.
#[tokio::test]
async fn a_run_no_live_worker_routes_is_blocked_once_and_a_worker_that_joins_finishes_it() {
    let lines = captured();
    // The lines that name run `run` and contain each of `words`.
    let count = |lines: &Lines, run: &str, words: &[&str]| {
        (lines.of(run).lines())
            .filter(|l| words.iter().all(|w| l.contains(w)))
            .count()
    };

    let schema = common::TestSchema::new("evo_block").await;
    let ttl = Duration::from_secs(1);
    let effects = Effects::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let at_gate = Arc::new(AtomicUsize::new(0));
    let worker = |version, gated: bool| Worker {
        version,
        effects: Arc::clone(&effects),
        gate: gated.then(|| (Arc::clone(&gate), Arc::clone(&at_gate))),
    };
    let serve = |rt: &Runtime| {
        let rt = rt.clone();
        tokio::spawn(async move { rt.serve(Duration::from_millis(50)).await })
    };
    let store = schema.store(ttl).await;

    // A v1 worker busy with one run (at its limit of one), and a v2-only worker.
    let old = Runtime::builder()
        .register::<v1::Order, _>(worker(1, true))
        .max_active_runs(1)
        .build(schema.store(ttl).await);
    for id in ["a0", "a1"] {
        old.start(id, v1::Order::Start { n: 0 }).await.unwrap();
        until_status(&store, id, RunStatus::Waiting).await;
    }
    old.resume_all().await.unwrap();
    let serving_old = serve(&old);
    let (claimed, blocks) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(Mutex::new(Vec::new())),
    );
    let new = Runtime::builder()
        .register::<v2::Order, _>(worker(2, false))
        .build(HookedStore::with_hook(
            schema.store(ttl).await,
            Claims {
                claimed: Arc::clone(&claimed),
                blocks: Arc::clone(&blocks),
            },
        ));
    let serving_new = serve(&new);
    new.send("a0", "go", &1u32).await.unwrap();
    while at_gate.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // `a1` is ready, and the v1 worker too busy to take it: the v2 worker, live for three
    // lease times, leaves it, as the v1 worker is live.
    new.send("a1", "go", &1u32).await.unwrap();
    tokio::time::sleep(ttl * 3).await;
    let a1 = store.run_info("a1").await.unwrap().unwrap();
    assert_eq!(a1.status, RunStatus::Waiting);
    assert!(store.has_pending("a1", "go").await.unwrap());
    assert!(blocks.lock().unwrap().is_empty());
    assert!(claimed.lock().unwrap().is_empty(), "{claimed:?}");
    gate.add_permits(10);
    for id in ["a0", "a1"] {
        assert_eq!(
            old.wait::<v1::Order>(id).await.unwrap(),
            v1::Order::Done { n: 0 }
        );
    }

    // The v1 worker goes, leaving `a2` parked; once it is ready and the v1 worker's last sign
    // of life is a lease time old, the v2 worker blocks it, once.
    old.start("a2", v1::Order::Start { n: 2 }).await.unwrap();
    until_status(&store, "a2", RunStatus::Waiting).await;
    old.shutdown().await;
    serving_old.await.unwrap().unwrap();
    new.send("a2", "go", &1u32).await.unwrap();
    until_status(&store, "a2", RunStatus::Blocked).await;
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(*blocks.lock().unwrap(), ["Block a2"]);
    assert_eq!(*claimed.lock().unwrap(), ["a2"]);
    assert_eq!(count(lines, "a2", &["run blocked"]), 1);
    assert_eq!(count(lines, "a2", &["WARN"]), 1);
    let a2 = store.run_info("a2").await.unwrap().unwrap();
    let block = a2.block.expect("the block");
    assert_eq!(
        (a2.status, block.resume, block.schema),
        (
            RunStatus::Blocked,
            RunStatus::Waiting,
            <v1::Order as loops::Workflow>::SCHEMA_HASH.pinned()
        )
    );

    // A v1 worker joins: it unblocks `a2` and finishes it, its side effect once.
    let joined = Runtime::builder()
        .register::<v1::Order, _>(worker(1, false))
        .build(schema.store(ttl).await);
    let serving_joined = serve(&joined);
    // (`wait` returns `RunBlocked` while the run is blocked.)
    while store.run_info("a2").await.unwrap().unwrap().status == RunStatus::Blocked {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        joined.wait::<v1::Order>("a2").await.unwrap(),
        v1::Order::Done { n: 2 }
    );
    joined.shutdown().await;
    new.shutdown().await;
    serving_joined.await.unwrap().unwrap();
    serving_new.await.unwrap().unwrap();

    assert_eq!(*blocks.lock().unwrap(), ["Block a2"]);
    let mut by_run: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (run, version) in effects.lock().unwrap().iter() {
        by_run.entry(run.clone()).or_default().push(*version);
    }
    let expected: BTreeMap<String, Vec<u32>> = [("a0", 1), ("a1", 1), ("a2", 1)]
        .into_iter()
        .map(|(run, v)| (run.to_owned(), vec![v]))
        .collect();
    assert_eq!(by_run, expected);
    assert_eq!(store.history("a2").await.unwrap().len(), 2);
    assert_eq!(count(lines, "a2", &["WARN"]), 1);
    assert_eq!(
        lines.text().lines().filter(|l| l.contains("ERROR")).count(),
        0
    );
}

impl wrong::OrderHandler for Worker {
    type Error = anyhow::Error;
    async fn start(&self, ctx: &Context, _n: String) -> anyhow::Result<wrong::StartNext> {
        Worker::start(self, ctx).await?;
        Ok(wrong::StartNext::Done { n: 0 })
    }
}

/// A worker whose version claims to accept version 1 with a breaking change (a field
/// retyped): on a store given to `build`, `serve` refuses at its start with the diff, and
/// nothing is claimed or written; the v1 run waits on, untouched.
#[tokio::test]
async fn a_wrong_accepts_claim_refuses_the_workers_start() {
    let schema = common::TestSchema::new("evo_wrong").await;
    let ttl = Duration::from_secs(5);
    let effects = Effects::default();
    let worker = |version| Worker {
        version,
        effects: Arc::clone(&effects),
        gate: None,
    };
    let creator = Runtime::builder()
        .register::<v1::Order, _>(worker(1))
        .build(schema.store(ttl).await);
    creator
        .start("w1", v1::Order::Start { n: 1 })
        .await
        .unwrap();
    creator.resume_all().await.unwrap();
    while creator.run_info("w1").await.unwrap().unwrap().status != RunStatus::Waiting {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    creator.shutdown().await;
    let before = creator.run_info("w1").await.unwrap().unwrap();

    let v2 = Runtime::builder()
        .register::<wrong::Order, _>(worker(2))
        .build(schema.store(ttl).await);
    match v2.serve(Duration::from_millis(50)).await {
        Err(loops::Error::AcceptsRefused {
            workflow,
            version,
            accepts,
            changes,
        }) => {
            assert_eq!((workflow.as_str(), version), ("pg_evo", 2));
            assert_eq!(accepts.to_string(), wrong::V1_HASH);
            assert_eq!(
                changes.texts(),
                ["state `Start`: field `n` changed from `u32` to `String`"]
            );
        }
        other => panic!("expected AcceptsRefused, got {other:?}"),
    }
    v2.shutdown().await;
    let after = schema
        .store(ttl)
        .await
        .run_info("w1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (after.status, after.seq, after.updated_ms, after.block),
        (RunStatus::Waiting, before.seq, before.updated_ms, None)
    );
    assert!(effects.lock().unwrap().is_empty());
}

/// A run version 1 parked (waiting for `go`) is taken by a worker of a version that accepts
/// it when that worker starts, not when the run's event comes: its acceptance is recorded,
/// its handler runs again under version 2 and it waits for `stop`, which then finishes it.
#[tokio::test]
async fn a_parked_run_of_an_accepted_version_is_taken_when_the_new_worker_starts() {
    parked_run_taken_by_version_2("evo_parked", false).await;
}

/// The same, with version 2 registered on a worker that has resumed its runs already (and
/// had no version of the workflow): the registration takes the parked run at once.
#[tokio::test]
async fn a_parked_run_of_an_accepted_version_is_taken_when_a_running_worker_registers_it() {
    parked_run_taken_by_version_2("evo_parked_late", true).await;
}

/// Parks a version 1 run on `go` in a schema of its own (`name`), then lets a version 2
/// worker take it: registered before the worker starts, or (`late`) after its first resume.
async fn parked_run_taken_by_version_2(name: &str, late: bool) {
    let schema = common::TestSchema::new(name).await;
    let ttl = Duration::from_secs(5);
    let creator = Runtime::builder()
        .register::<v1::Order, _>(Worker {
            version: 1,
            effects: Effects::default(),
            gate: None,
        })
        .build(schema.store(ttl).await);
    creator
        .start("p1", v1::Order::Start { n: 1 })
        .await
        .unwrap();
    let waits_for = |info: &RunInfo| info.wait.as_ref().and_then(|w| w.event.clone());
    while waits_for(&creator.run_info("p1").await.unwrap().unwrap()).as_deref() != Some("go") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    creator.shutdown().await;

    let v2 = if late {
        let v2 = Runtime::builder().build(schema.store(ttl).await);
        assert!(v2.resume_all().await.unwrap().is_empty());
        v2.register::<accepting::Order, _>(accepting::Stops);
        v2
    } else {
        Runtime::builder()
            .register::<accepting::Order, _>(accepting::Stops)
            .build(schema.store(ttl).await)
    };
    // Late, the worker does not serve: only the registration can take the run (`serve`
    // would take it at its own first resume).
    let serving = (!late).then(|| {
        let v2 = v2.clone();
        tokio::spawn(async move { v2.serve(Duration::from_millis(50)).await })
    });
    let mut info = v2.run_info("p1").await.unwrap().unwrap();
    for _ in 0..400 {
        if waits_for(&info).as_deref() == Some("stop") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        info = v2.run_info("p1").await.unwrap().unwrap();
    }
    assert_eq!(
        (info.status, info.seq, waits_for(&info).as_deref()),
        (RunStatus::Waiting, 1, Some("stop"))
    );
    use loops::Workflow;
    assert_eq!(info.schema, accepting::Order::SCHEMA_HASH.pinned());
    let history = v2.store().history("p1").await.unwrap();
    assert_eq!(
        history[1].migrated.map(|m| (m.schema, m.accepted)),
        Some((v1::Order::SCHEMA_HASH.pinned(), true))
    );
    v2.send("p1", "stop", &7u32).await.unwrap();
    assert_eq!(
        v2.wait::<accepting::Order>("p1").await.unwrap(),
        accepting::Order::Done { n: 101 }
    );
    v2.shutdown().await;
    if let Some(serving) = serving {
        serving.await.unwrap().unwrap();
    }
}

#[test]
fn the_wrong_claim_names_version_1() {
    use loops::Workflow;
    assert_eq!(wrong::V1_HASH, v1::Order::SCHEMA_HASH.pinned().to_string());
}
