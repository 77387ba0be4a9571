//! Child runs on PostgreSQL: a parent's children are driven by any worker, and each child's
//! end wakes the parent through the store (the `loops:child-ended` event its end writes), so
//! that whichever worker claims the parent joins them.
//!
//! - Two worker processes (this test binary, re-run as `worker_process`) serve a parent that
//!   fans out to 50 children; random workers are SIGKILLed while they run and restarted.
//!   Every child ends once with its result, each child's effect is made under one key and
//!   recorded once, and the parent ends once with all 50 results.
//! - In one process: a parent's cancellation ends its waiting child in the same commit and
//!   its running child at its driver's next boundary; an abandoned child goes on.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::worker::Worker;
use loops::{ChildOptions, Context, Error, RunStatus, Runtime, Workflow};
use loops_core::Store;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "pg_leaf")]
enum Leaf {
    #[initial]
    #[next(Squared)]
    Start { i: u64, wait: bool },
    #[terminal]
    Squared { square: u64 },
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "pg_fan")]
enum Fan {
    #[initial]
    #[next(Summed)]
    Split { n: u64, waiting: bool },
    #[terminal]
    Summed { squares: Vec<u64> },
}

/// A leaf's effect appends `CHILD KEY` to the ledger file (if any); a waiting leaf waits for
/// the event `go` first.
struct Leaves {
    ledger: Option<PathBuf>,
}

impl LeafHandler for Leaves {
    type Error = Error;
    async fn start(&self, ctx: &Context, i: u64, wait: bool) -> Result<StartNext, Error> {
        if wait {
            ctx.wait_for::<u64>("go").await?;
        }
        let id = ctx.run_id().to_owned();
        let square = ctx
            .step_keyed("square", |key| async move {
                if let Some(ledger) = &self.ledger {
                    let mut f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(ledger)
                        .unwrap();
                    f.write_all(format!("{id} {key}\n").as_bytes()).unwrap();
                }
                Ok(i * i)
            })
            .await?;
        Ok(StartNext::Squared { square })
    }
}

/// Starts `n` children (`waiting`: child 0 waits for `go`, child 1 is abandoned and waits
/// too), joins them all.
struct Parent;

impl FanHandler for Parent {
    type Error = Error;
    async fn split(&self, ctx: &Context, n: u64, waiting: bool) -> Result<SplitNext, Error> {
        let mut children = Vec::new();
        for i in 0..n {
            let id = format!("{}/{i}", ctx.run_id());
            let wait = waiting && i < 2;
            let options = if waiting && i == 1 {
                ChildOptions::default().abandon()
            } else {
                ChildOptions::default()
            };
            let initial = Leaf::Start { i, wait };
            children.push(ctx.start_child_with(&id, initial, options).await?);
        }
        let mut squares = Vec::new();
        for result in ctx.join_all(&children).await? {
            match result {
                Ok(Leaf::Squared { square }) => squares.push(square),
                Ok(other) => panic!("not terminal: {other:?}"),
                Err(e) => return Err(Error::permanent(e)),
            }
        }
        Ok(SplitNext::Summed { squares })
    }
}

/// A worker: serves both workflows on `LOOPS_SCHEMA`; with `LOOPS_START`, starts the parent
/// `p` with `LOOPS_START` children first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the tests of this file as their worker process"]
async fn worker_process() {
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let store = loops_postgres::PgStore::builder(common::pg_config())
        .schema(env("LOOPS_SCHEMA"))
        .pool_size(4)
        .lease_ttl(Duration::from_millis(1000))
        .connect()
        .await
        .unwrap();
    let ledger = Some(PathBuf::from(env("LOOPS_LEDGER")));
    let runtime = Runtime::builder()
        .register::<Leaf, _>(Leaves { ledger })
        .register::<Fan, _>(Parent)
        .build(store);
    if let Ok(n) = env("LOOPS_START").parse::<u64>() {
        runtime
            .start("p", Fan::Split { n, waiting: false })
            .await
            .unwrap();
    }
    println!("serving");
    runtime.serve(Duration::from_millis(50)).await.unwrap();
}

/// Waits (up to 120 s) until the run has ended; returns its row.
async fn ended(store: &dyn Store, run_id: &str) -> loops::RunInfo {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(info) = store.run_info(run_id).await.unwrap()
            && info.status.is_ended()
        {
            return info;
        }
        assert!(Instant::now() < deadline, "run {run_id} did not end");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each child's effects by child id: the keys they were made under.
fn ledger(path: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        let (id, key) = line.split_once(' ').unwrap();
        keys.entry(id.to_owned())
            .or_default()
            .insert(key.to_owned());
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_of_50_over_two_workers_under_random_kills_ends_once_with_every_result() {
    let schema = common::TestSchema::new("kin_fan").await;
    let store = schema.store(Duration::from_secs(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger");
    let env = |start: bool| {
        let mut env = vec![
            ("LOOPS_SCHEMA", schema.name.clone()),
            ("LOOPS_LEDGER", path.display().to_string()),
        ];
        if start {
            env.push(("LOOPS_START", "50".to_owned()));
        }
        env
    };
    let mut workers = [
        Worker::spawn("worker_process", &env(true)),
        Worker::spawn("worker_process", &env(false)),
    ];
    for w in &workers {
        w.expect("serving");
    }
    let kills: u32 = std::env::var("LOOPS_FAN_KILLS").map_or(4, |v| v.parse().unwrap());
    for k in 0..kills {
        tokio::time::sleep(Duration::from_millis(fastrand_ms())).await;
        let victim = (k as usize + fastrand_ms() as usize) % workers.len();
        workers[victim].kill();
        workers[victim] = Worker::spawn("worker_process", &env(false));
    }
    let parent = ended(&store, "p").await;
    assert_eq!(parent.status, RunStatus::Completed);
    let (_, record) = store.latest("p").await.unwrap().unwrap();
    let done: Fan = record.decode("p").unwrap();
    let squares: Vec<u64> = (0..50).map(|i| i * i).collect();
    assert_eq!(done, Fan::Summed { squares });
    let history: Vec<String> = store
        .history("p")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.state)
        .collect();
    assert_eq!(history, ["Split", "Summed"]);
    let children = store.children("p").await.unwrap();
    assert_eq!(children.len(), 50);
    for child in &children {
        assert_eq!(child.status, RunStatus::Completed, "{}", child.run_id);
        let steps = store.steps(&child.run_id, 0).await.unwrap();
        let recorded = steps.iter().filter(|(n, _, _)| n == "square").count();
        assert_eq!(recorded, 1, "{}", child.run_id);
    }
    let keys = ledger(&path);
    assert_eq!(keys.len(), 50);
    assert!(keys.values().all(|k| k.len() == 1), "{keys:?}");
}

/// A pause of 150 to 650 ms, different in each test process.
fn fastrand_ms() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    150 + u64::from(nanos % 500)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parent_cascades_to_its_children_on_postgres() {
    let schema = common::TestSchema::new("kin_cancel").await;
    let store = schema.store(Duration::from_secs(2)).await;
    let runtime = Runtime::builder()
        .register::<Leaf, _>(Leaves { ledger: None })
        .register::<Fan, _>(Parent)
        .build(store.clone());
    let serving = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.serve(Duration::from_millis(50)).await })
    };
    runtime
        .start(
            "p",
            Fan::Split {
                n: 3,
                waiting: true,
            },
        )
        .await
        .unwrap();
    // Child 2 ends at once; 0 and 1 park at their waits; the parent parks in its join.
    for (id, status) in [
        ("p/2", RunStatus::Completed),
        ("p/0", RunStatus::Waiting),
        ("p/1", RunStatus::Waiting),
        ("p", RunStatus::Waiting),
    ] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while store.run_info(id).await.unwrap().map(|i| i.status) != Some(status) {
            assert!(Instant::now() < deadline, "{id} never {status}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // The parent may be driven at this moment (a child's end made it look at its
    // children again): then its driver ends it, at once, on the signal.
    let info = runtime.cancel("p", "enough").await.unwrap();
    assert_eq!(info.cancel.as_deref(), Some("enough"));
    let row = |id: &'static str| {
        let store = store.clone();
        async move { store.run_info(id).await.unwrap().unwrap() }
    };
    let waiting = row("p/0").await;
    assert_eq!(
        (waiting.status, waiting.cancel.as_deref()),
        (RunStatus::Cancelled, Some("parent run `p` was cancelled"))
    );
    let abandoned = row("p/1").await;
    assert_eq!(
        (abandoned.status, abandoned.cancel),
        (RunStatus::Waiting, None)
    );
    assert_eq!(row("p/2").await.status, RunStatus::Completed);
    match runtime.wait::<Fan>("p").await {
        Err(Error::RunCancelled { reason, .. }) => assert_eq!(reason, "enough"),
        other => panic!("expected the parent cancelled, got {other:?}"),
    }
    runtime.send("p/1", "go", &1u64).await.unwrap();
    let leaf: Leaf = runtime.wait("p/1").await.unwrap();
    assert_eq!(leaf, Leaf::Squared { square: 1 });
    runtime.shutdown().await;
    serving.await.unwrap().unwrap();
}
