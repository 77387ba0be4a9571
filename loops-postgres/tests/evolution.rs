//! Versions side by side on PostgreSQL (issue 14): a worker built with version 1 only and a
//! worker built with version 2 only, sharing one store during a "rolling deploy". Each claims
//! only the runs of the schema it has compiled in (the claim filters on the runs' `schema`
//! column), so every run finishes exactly once, on its own version, and the v2 worker never
//! claims a v1 run (nor blocks one, nor logs about one).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops::{
    BoxFuture, ClaimFilter, Context, EventRecord, FailureRecord, Lease, Reply, RunInfo, RunStatus,
    Runtime, SchemaHash, StepRecord, Store, TransitionRecord, Write,
};

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

/// `(run id, version)` of every side effect, shared by every worker of the test.
type Effects = Arc<Mutex<Vec<(String, u32)>>>;

/// Waits in `Start` for the event `go`, then runs its one side effect as a step.
#[derive(Clone)]
struct Worker {
    version: u32,
    effects: Effects,
}

impl Worker {
    async fn start(&self, ctx: &Context) -> anyhow::Result<()> {
        let _go: u32 = ctx.wait_for("go").await?;
        let (effects, run, version) = (self.effects.clone(), ctx.run_id().to_owned(), self.version);
        ctx.step("effect", || async move {
            effects.lock().unwrap().push((run, version));
            Ok::<_, anyhow::Error>(())
        })
        .await
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

/// A store that logs the runs its `claim_ready` handed out.
struct Claims {
    inner: loops_postgres::PgStore,
    claimed: Arc<Mutex<Vec<String>>>,
}

impl Store for Claims {
    fn label(&self) -> String {
        self.inner.label().to_owned()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn write<'a>(
        &'a self,
        lease: Option<&'a Lease>,
        write: Write,
    ) -> BoxFuture<'a, loops::Result<Reply>> {
        self.inner.write(lease, write)
    }
    fn run_info<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, loops::Result<Option<RunInfo>>> {
        self.inner.run_info(run_id)
    }
    fn latest<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops::Result<Option<(RunInfo, TransitionRecord)>>> {
        self.inner.latest(run_id)
    }
    fn history<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops::Result<Vec<TransitionRecord>>> {
        self.inner.history(run_id)
    }
    fn steps<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, loops::Result<Vec<(String, u32, StepRecord)>>> {
        self.inner.steps(run_id, seq)
    }
    fn failures<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops::Result<Vec<(u64, FailureRecord)>>> {
        self.inner.failures(run_id)
    }
    fn events<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops::Result<Vec<(u64, EventRecord, bool)>>> {
        self.inner.events(run_id)
    }
    fn has_pending<'a>(
        &'a self,
        run_id: &'a str,
        event: &'a str,
    ) -> BoxFuture<'a, loops::Result<bool>> {
        self.inner.has_pending(run_id, event)
    }
    fn list<'a>(
        &'a self,
        status: RunStatus,
        workflow: Option<&'a str>,
    ) -> BoxFuture<'a, loops::Result<Vec<RunInfo>>> {
        self.inner.list(status, workflow)
    }
    fn schema(&self, hash: SchemaHash) -> BoxFuture<'_, loops::Result<Option<String>>> {
        self.inner.schema(hash)
    }
    fn schemas(&self) -> BoxFuture<'_, loops::Result<Vec<(SchemaHash, String)>>> {
        self.inner.schemas()
    }
    fn acquire<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, loops::Result<Option<Lease>>> {
        self.inner.acquire(run_id)
    }
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, loops::Result<()>> {
        self.inner.release(lease)
    }
    fn renew<'a>(&'a self, leases: &'a [Lease]) -> BoxFuture<'a, loops::Result<Vec<Lease>>> {
        self.inner.renew(leases)
    }
    fn lease_ttl(&self) -> Option<Duration> {
        self.inner.lease_ttl()
    }
    fn claim_ready<'a>(
        &'a self,
        workflows: &'a [ClaimFilter],
        limit: usize,
    ) -> BoxFuture<'a, loops::Result<Vec<(RunInfo, Lease)>>> {
        Box::pin(async move {
            let claimed = self.inner.claim_ready(workflows, limit).await?;
            self.claimed
                .lock()
                .unwrap()
                .extend(claimed.iter().map(|(info, _)| info.run_id.clone()));
            Ok(claimed)
        })
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
        .build(Claims {
            inner: schema.store(ttl).await,
            claimed: Arc::clone(&claimed_by_v2),
        });
    let serve = |rt: &Runtime| {
        let rt = rt.clone();
        tokio::spawn(async move { rt.serve(Duration::from_millis(20)).await })
    };
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
