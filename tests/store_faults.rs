//! Store faults met while runs are resumed or driven, injected by the test kit's `HookedStore`
//! around the redb store: a failed read of the status index resumes nothing (and `serve` tries
//! again by itself), and a failed step write is not the handler's failure (no attempt spent,
//! the run goes on once the store recovers).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops::testing::{Call, HookedStore, Verdict, WriteHook, WriteSeen};
use loops::{Context, Error, RedbStore, RunStatus, Runtime, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "flaky")]
enum Job {
    #[initial]
    #[next(Done)]
    Start { nap_ms: u64 },
    #[terminal]
    Done { effects: u32 },
}

/// Runs one journaled side effect (counted per run), then naps `nap_ms` (a durable sleep,
/// parked), then ends. With `hang`, it never gets past its entry.
#[derive(Clone, Default)]
struct Worker {
    hang: bool,
    effects: Arc<Mutex<HashMap<String, u32>>>,
}

impl Worker {
    fn effects(&self, run_id: &str) -> u32 {
        self.effects
            .lock()
            .unwrap()
            .get(run_id)
            .copied()
            .unwrap_or(0)
    }
}

impl JobHandler for Worker {
    type Error = Error;

    async fn start(&self, ctx: &Context, nap_ms: u64) -> Result<StartNext, Error> {
        if self.hang {
            std::future::pending::<()>().await;
        }
        let effects = Arc::clone(&self.effects);
        let run_id = ctx.run_id().to_owned();
        let n: u32 = ctx
            .step("effect", || async {
                let mut effects = effects.lock().unwrap();
                let n = effects.entry(run_id.clone()).or_insert(0);
                *n += 1;
                Ok(*n)
            })
            .await?;
        if nap_ms > 0 {
            ctx.sleep(Duration::from_millis(nap_ms)).await?;
        }
        Ok(StartNext::Done { effects: n })
    }
}

/// What the wrapper fails, and how often it did.
#[derive(Default)]
struct Faults {
    /// Reads of the waiting runs of the status index to fail, from now on.
    lists: AtomicU32,
    /// Step-record writes to fail, from now on.
    steps: AtomicU32,
    /// Failure-record writes seen.
    failure_writes: AtomicU32,
    /// Faults injected.
    injected: AtomicU32,
    /// Calls of `claim_ready` (each claims the runs it returns).
    claims: AtomicU32,
}

impl Faults {
    /// Takes one fault of `budget`, if any is left.
    fn take(&self, budget: &AtomicU32) -> bool {
        let taken = budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if taken {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        taken
    }
}

fn full(action: &str) -> Error {
    Error::Storage {
        action: action.to_owned(),
        cause: Arc::new(std::io::Error::from(std::io::ErrorKind::StorageFull)),
    }
}

/// Fails, on the redb store behind a `HookedStore`, what `faults` says.
struct Flaky(Arc<Faults>);

impl WriteHook for Flaky {
    fn before(&self, seen: &WriteSeen) -> Verdict {
        match seen.kind {
            "Step" if self.0.take(&self.0.steps) => {
                return Verdict::Fail(full("committing a step record"));
            }
            "Failure" => {
                self.0.failure_writes.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        Verdict::Go
    }

    fn call(&self, call: &Call<'_>) -> Verdict {
        match call {
            Call::List {
                status: RunStatus::Waiting,
                ..
            }
            | Call::ClaimReadyAndParked { .. }
                if self.0.take(&self.0.lists) =>
            {
                Verdict::Fail(full("listing waiting runs"))
            }
            Call::ClaimReady { .. } | Call::ClaimReadyAndParked { .. } => {
                self.0.claims.fetch_add(1, Ordering::SeqCst);
                Verdict::Go
            }
            _ => Verdict::Go,
        }
    }
}

/// [`Worker`], with a handler that returns `anyhow::Error`, as most applications' do.
#[derive(Clone)]
struct AnyhowWorker(Worker);

impl JobHandler for AnyhowWorker {
    type Error = anyhow::Error;

    async fn start(&self, ctx: &Context, nap_ms: u64) -> anyhow::Result<StartNext> {
        Ok(self.0.start(ctx, nap_ms).await?)
    }
}

/// A runtime on the store file `path`, failing what `faults` says, with `handler`.
fn flaky_runtime<H>(path: &Path, faults: &Arc<Faults>, handler: H) -> Runtime
where
    Job: loops::Dispatch<H>,
    H: Send + Sync + 'static,
{
    let store = HookedStore::with_hook(RedbStore::open(path).unwrap(), Flaky(Arc::clone(faults)));
    Runtime::builder()
        .park_threshold(Duration::ZERO)
        .register::<Job, _>(handler)
        .build(store)
}

/// A store where `busy` is running with no driver (stopped at its entry, before its effect)
/// and `sleepy` is parked on a 300 ms durable sleep after its effect.
async fn interrupted_store(path: &Path) -> Worker {
    let worker = Worker::default();
    let rt = Runtime::builder()
        .park_threshold(Duration::ZERO)
        .register::<Job, _>(Worker {
            hang: true,
            ..worker.clone()
        })
        .open(path)
        .unwrap();
    rt.start("busy", Job::Start { nap_ms: 0 }).await.unwrap();
    rt.shutdown().await;
    drop(rt);
    let rt = Runtime::builder()
        .park_threshold(Duration::ZERO)
        .register::<Job, _>(worker.clone())
        .open(path)
        .unwrap();
    rt.start("sleepy", Job::Start { nap_ms: 300 })
        .await
        .unwrap();
    rt.wait_for_status("sleepy", RunStatus::Waiting)
        .await
        .unwrap();
    rt.shutdown().await;
    drop(rt);
    assert_eq!((worker.effects("busy"), worker.effects("sleepy")), (0, 1));
    worker
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_while_resuming_resumes_nothing_and_a_second_call_resumes_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let worker = interrupted_store(&path).await;
    let faults = Arc::new(Faults::default());
    faults.lists.store(1, Ordering::SeqCst);
    let rt = flaky_runtime(&path, &faults, worker.clone());

    let err = rt.resume_all().await.unwrap_err();
    assert!(matches!(err, Error::Storage { .. }), "{err:?}");
    // Nothing was started: no run was claimed (so no driver started), and the running run
    // is as it was.
    assert_eq!(faults.claims.load(Ordering::SeqCst), 0);
    let busy = rt.run_info("busy").await.unwrap().unwrap();
    assert_eq!((busy.status, busy.attempt), (RunStatus::Running, 1));
    assert_eq!(worker.effects("busy"), 0);

    // The fault cleared: the same call resumes both.
    let found = rt.resume_all().await.unwrap();
    // `busy` gets a driver; `sleepy` too if its time has passed, else it stays parked with
    // a timer.
    let ids: Vec<&str> = found
        .driven
        .iter()
        .map(|info| info.run_id.as_str())
        .collect();
    assert_eq!(found.len(), 2);
    assert_eq!(ids[0], "busy");
    assert_eq!(found.timers, found.parked);
    assert_eq!(
        rt.wait::<Job>("busy").await.unwrap(),
        Job::Done { effects: 1 }
    );
    assert_eq!(
        rt.wait::<Job>("sleepy").await.unwrap(),
        Job::Done { effects: 1 }
    );
    assert_eq!((worker.effects("busy"), worker.effects("sleepy")), (1, 1));
    assert_eq!(faults.injected.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_retries_a_failed_first_resume_until_the_store_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let worker = interrupted_store(&path).await;
    let faults = Arc::new(Faults::default());
    faults.lists.store(3, Ordering::SeqCst);
    let rt = flaky_runtime(&path, &faults, worker.clone());
    let mut serving = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.serve(Duration::from_millis(50)).await })
    };
    // serve must not return on the fault: the parked run gets its timer once the read works.
    tokio::select! {
        served = &mut serving => panic!("serve returned before the runs ended: {served:?}"),
        ended = async {
            (rt.wait::<Job>("busy").await, rt.wait::<Job>("sleepy").await)
        } => {
            let (busy, sleepy) = ended;
            assert_eq!(busy.unwrap(), Job::Done { effects: 1 });
            assert_eq!(sleepy.unwrap(), Job::Done { effects: 1 });
        }
    }
    assert_eq!(faults.injected.load(Ordering::SeqCst), 3);
    assert_eq!((worker.effects("busy"), worker.effects("sleepy")), (1, 1));
    rt.shutdown().await;
    serving.await.unwrap().unwrap();
}

/// `Runtime::run` (attached) and a background driver: three failed step records each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_step_write_spends_no_attempt_and_the_run_goes_on_when_the_store_recovers() {
    let worker = Worker::default();
    failed_step_writes_spend_no_attempt(&worker, worker.clone()).await;
}

/// As above, with a handler that returns the store fault inside an `anyhow::Error` (with
/// `?`): still the store's fault, not the handler's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_step_write_returned_in_an_anyhow_error_spends_no_attempt() {
    let worker = Worker::default();
    failed_step_writes_spend_no_attempt(&worker, AnyhowWorker(worker.clone())).await;
}

/// Fails three step records of a run driven by `Runtime::run` with `handler`, then three
/// of a run started in the background; checks that each run ended with its effect run
/// once per failed record plus once, in its first attempt, with no failure recorded.
async fn failed_step_writes_spend_no_attempt<H>(worker: &Worker, handler: H)
where
    Job: loops::Dispatch<H>,
    H: Clone + Send + Sync + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let faults = Arc::new(Faults::default());
    let rt = flaky_runtime(&path, &faults, handler.clone());

    faults.steps.store(3, Ordering::SeqCst);
    let done = rt
        .run("attached", Job::Start { nap_ms: 0 }, &handler)
        .await
        .unwrap();
    // The effect ran once per failed record (each repeat under the same idempotency key),
    // and the fourth execution recorded it.
    assert_eq!(done, Job::Done { effects: 4 });

    faults.steps.store(3, Ordering::SeqCst);
    rt.start("background", Job::Start { nap_ms: 0 })
        .await
        .unwrap();
    assert_eq!(
        rt.wait::<Job>("background").await.unwrap(),
        Job::Done { effects: 4 }
    );

    assert_eq!(faults.injected.load(Ordering::SeqCst), 6);
    for id in ["attached", "background"] {
        let history = rt.history::<Job>(id).await.unwrap();
        let states: Vec<Job> = history.into_iter().map(|t| t.value).collect();
        assert_eq!(
            states,
            [Job::Start { nap_ms: 0 }, Job::Done { effects: 4 }],
            "{id}"
        );
        let info = rt.run_info(id).await.unwrap().unwrap();
        assert_eq!(
            (info.status, info.attempt, info.interrupted, info.error),
            (RunStatus::Completed, 1, 0, None),
            "{id}"
        );
        assert_eq!(rt.store().failures(id).await.unwrap(), vec![], "{id}");
        assert_eq!(worker.effects(id), 4, "{id}");
    }
    // No failure record was even tried: the faults were the store's, not the handler's.
    assert_eq!(faults.failure_writes.load(Ordering::SeqCst), 0);
}
