//! The metrics loops records (`loops::metrics`), read with `metrics-util`'s debugging
//! recorder: a real registered workflow with steps, a step retried in place, a failed
//! attempt, a durable wait (a park) and a step waiting for a named limit; every counter,
//! histogram count and gauge asserted exactly, with its label set.
//!
//! Each test installs its recorder on its own thread only (`set_default_local_recorder`,
//! never a global one) and runs on a current-thread tokio runtime, so that every task of the
//! runtime records on that thread and tests do not see each other's metrics. (The redb
//! store's writer thread hands each batch's size back to the writing task, which records it.)

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops::metrics::{self as m, facade};
use loops::testing::HookedStore;
use loops::{Context, RedbStore, RetryPolicy, RunStatus, Runtime, StepOptions, Workflow};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "metered")]
#[event(go: u32)]
enum Metered {
    #[initial]
    #[next(Gate)]
    Work,
    #[next(Done)]
    Gate,
    #[terminal]
    Done { n: u32 },
}

/// The handler: `fetch` fails its first try in each run (then is tried again in place),
/// `model` takes the limit `model` (and, in the run `holder`, keeps it until the test lets
/// go), and `Gate` fails its first attempt in each run, then waits for `go`.
struct MeterState {
    fetched: Mutex<HashSet<String>>,
    gated: Mutex<HashSet<String>>,
    hold: tokio::sync::Semaphore,
    holding: AtomicU32,
}

impl Default for MeterState {
    fn default() -> Self {
        MeterState {
            fetched: Mutex::default(),
            gated: Mutex::default(),
            hold: tokio::sync::Semaphore::new(0),
            holding: AtomicU32::new(0),
        }
    }
}

/// The registered handler: the state the test shares with it.
struct Meter(Arc<MeterState>);

impl MeteredHandler for Meter {
    type Error = loops::BoxError;

    async fn work(&self, ctx: &Context) -> Result<WorkNext, Self::Error> {
        let me = &*self.0;
        let run = ctx.run_id().to_owned();
        let retry = RetryPolicy::attempts(3)
            .with_delays(Duration::from_millis(1), Duration::from_millis(2))
            .with_jitter(0.0);
        ctx.step_with("fetch", StepOptions::default().with_retry(retry), || {
            let first = me.fetched.lock().unwrap().insert(run.clone());
            async move {
                if first {
                    Err("429 too many requests".into())
                } else {
                    Ok(1u32)
                }
            }
        })
        .await?;
        let holder = run == "holder";
        ctx.step_with(
            "model",
            StepOptions::default().with_limit("model"),
            || async {
                if holder {
                    me.holding.store(1, Ordering::SeqCst);
                    drop(me.hold.acquire().await?);
                }
                Ok(2u32)
            },
        )
        .await?;
        Ok(WorkNext::Gate)
    }

    async fn gate(&self, ctx: &Context) -> Result<GateNext, Self::Error> {
        if self.0.gated.lock().unwrap().insert(ctx.run_id().to_owned()) {
            return Err("flaky gate".into());
        }
        let n = ctx.wait_for(Metered::GO).await?;
        Ok(GateNext::Done { n })
    }
}

/// What the recorder saw, merged over snapshots. A snapshot of the debugging recorder resets
/// what it reads (counters and gauges to 0, histograms emptied), so counters and gauges moved
/// up and down are summed over snapshots, histograms keep all their samples, and gauges
/// that loops sets (the gauges of runs) keep the value of the last snapshot. Keyed by name
/// and sorted labels.
/// A series: its name and its labels, sorted.
type Series = (String, Vec<(String, String)>);

#[derive(Default)]
struct Seen {
    counters: BTreeMap<Series, u64>,
    /// Gauges moved by increments (summed) and gauges set (the last snapshot's value).
    gauges: BTreeMap<Series, f64>,
    histograms: BTreeMap<Series, Vec<f64>>,
}

impl Seen {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let id = (key.name().to_owned(), labels);
            match value {
                DebugValue::Counter(n) => *self.counters.entry(id).or_default() += n,
                DebugValue::Gauge(g) if id.0 == m::RUNS || id.0 == m::RUNS_PARKED => {
                    self.gauges.insert(id, g.into_inner());
                }
                DebugValue::Gauge(g) => *self.gauges.entry(id).or_default() += g.into_inner(),
                DebugValue::Histogram(samples) => self
                    .histograms
                    .entry(id)
                    .or_default()
                    .extend(samples.into_iter().map(|s| s.into_inner())),
            }
        }
    }

    /// The series of `name`, as label sets (sorted) to values.
    fn counters_of(&self, name: &str) -> BTreeMap<Vec<(String, String)>, u64> {
        filter(&self.counters, name)
    }

    fn gauges_of(&self, name: &str) -> BTreeMap<Vec<(String, String)>, f64> {
        filter(&self.gauges, name)
    }

    /// The number of samples of each series of the histogram `name`.
    fn counts_of(&self, name: &str) -> BTreeMap<Vec<(String, String)>, usize> {
        filter(&self.histograms, name)
            .into_iter()
            .map(|(labels, samples)| (labels, samples.len()))
            .collect()
    }
}

fn filter<V: Clone>(map: &BTreeMap<Series, V>, name: &str) -> BTreeMap<Vec<(String, String)>, V> {
    map.iter()
        .filter(|((n, _), _)| n == name)
        .map(|((_, labels), v)| (labels.clone(), v.clone()))
        .collect()
}

/// A label set from `(key, value)` pairs, sorted as [`Seen`] keeps them.
fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    v.sort();
    v
}

async fn until_status(runtime: &Runtime, run_id: &str, status: RunStatus) {
    loop {
        if runtime
            .run_info(run_id)
            .await
            .unwrap()
            .is_some_and(|i| i.status == status)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_workflow_records_exact_metrics() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = facade::set_default_local_recorder(&recorder);
    let mut seen = Seen::default();

    let store = HookedStore::new(RedbStore::in_memory().unwrap());
    let meter = Arc::new(MeterState::default());
    let state_retry = RetryPolicy::attempts(2)
        .with_delays(Duration::from_millis(1), Duration::from_millis(2))
        .with_jitter(0.0);
    let runtime = Runtime::builder()
        .retry(state_retry)
        .limit("model", loops::Limit::concurrent(1))
        .register::<Metered, _>(Meter(Arc::clone(&meter)))
        .build(store.clone());

    // `holder` takes the limit and keeps it; `waiter` then waits for it.
    runtime.start("holder", Metered::Work).await.unwrap();
    while meter.holding.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    runtime.start("waiter", Metered::Work).await.unwrap();
    let model = labels(&[("limit", "model")]);
    loop {
        seen.take(&snapshotter);
        if seen.gauges_of(m::LIMIT_WAITERS).get(&model) == Some(&1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    meter.hold.add_permits(1);

    // Both runs park at `go`, then finish once it is sent.
    for run in ["holder", "waiter"] {
        until_status(&runtime, run, RunStatus::Waiting).await;
    }
    let runs = |status: &str| labels(&[("workflow", "metered"), ("status", status)]);
    let metered = labels(&[("workflow", "metered")]);
    // A run is parked once its driver, having committed the wait, let go of its task.
    loop {
        runtime.refresh_metrics().await.unwrap();
        seen.take(&snapshotter);
        if seen.gauges_of(m::RUNS_PARKED)[&metered] == 2.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(seen.gauges_of(m::RUNS)[&runs("waiting")], 2.0);
    assert_eq!(seen.gauges_of(m::RUNS)[&runs("completed")], 0.0);
    assert_eq!(seen.gauges_of(m::RUNS_PARKED)[&metered], 2.0);
    for (run, n) in [("holder", 7), ("waiter", 8)] {
        runtime.send(run, Metered::GO, &n).await.unwrap();
        assert_eq!(
            runtime.wait::<Metered>(run).await.unwrap(),
            Metered::Done { n }
        );
    }
    runtime.refresh_metrics().await.unwrap();
    seen.take(&snapshotter);

    let runs_gauge = seen.gauges_of(m::RUNS);
    assert_eq!(runs_gauge.len(), 6, "{runs_gauge:?}");
    for status in ["running", "waiting", "failed", "cancelled", "blocked"] {
        assert_eq!(runs_gauge[&runs(status)], 0.0, "{status}");
    }
    assert_eq!(runs_gauge[&runs("completed")], 2.0);
    assert_eq!(
        seen.gauges_of(m::RUNS_PARKED),
        BTreeMap::from([(metered.clone(), 0.0)])
    );

    let state = |s: &str| labels(&[("workflow", "metered"), ("state", s)]);
    assert_eq!(
        seen.counters_of(m::TRANSITIONS_TOTAL),
        BTreeMap::from([(state("Work"), 2), (state("Gate"), 2)])
    );
    assert_eq!(
        seen.counts_of(m::TRANSITION_SECONDS),
        BTreeMap::from([(state("Work"), 2), (state("Gate"), 2)])
    );
    let step = |s: &str| labels(&[("workflow", "metered"), ("state", "Work"), ("step", s)]);
    let step_ok = |s: &str| {
        labels(&[
            ("workflow", "metered"),
            ("state", "Work"),
            ("step", s),
            ("status", "ok"),
        ])
    };
    assert_eq!(
        seen.counters_of(m::STEPS_TOTAL),
        BTreeMap::from([(step_ok("fetch"), 2), (step_ok("model"), 2)])
    );
    // `fetch`: two tries per run; `model`: one.
    assert_eq!(
        seen.counts_of(m::STEP_SECONDS),
        BTreeMap::from([(step("fetch"), 4), (step("model"), 2)])
    );
    assert_eq!(
        seen.counters_of(m::STEP_RETRIES_TOTAL),
        BTreeMap::from([(step("fetch"), 2)])
    );
    assert_eq!(
        seen.counters_of(m::FAILURES_TOTAL),
        BTreeMap::from([(
            labels(&[
                ("workflow", "metered"),
                ("state", "Gate"),
                ("source", "handler")
            ]),
            2
        )])
    );
    assert_eq!(
        seen.counters_of(m::PARKS_TOTAL),
        BTreeMap::from([(state("Gate"), 2)])
    );
    assert_eq!(
        seen.counts_of(m::LIMIT_WAIT_SECONDS),
        BTreeMap::from([(model.clone(), 2)])
    );
    assert_eq!(
        seen.gauges_of(m::LIMIT_WAITERS),
        BTreeMap::from([(model, 0.0)])
    );
    // Every write the store was given was committed in a batch counted once.
    let batches = &seen.histograms[&(
        m::COMMIT_BATCH_SIZE.to_owned(),
        labels(&[("store", "redb")]),
    )];
    assert_eq!(batches.iter().sum::<f64>(), store.count() as f64);
    assert!(seen.counters_of(m::LEASE_LOSSES_TOTAL).is_empty());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn serve_refreshes_the_run_gauges_and_a_scheduled_prune_records_the_runs_it_removed() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = facade::set_default_local_recorder(&recorder);
    let mut seen = Seen::default();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    {
        let runtime = Runtime::builder()
            .metrics_interval(Duration::from_millis(10))
            .limit("model", loops::Limit::concurrent(1))
            .register::<Metered, _>(Meter(Arc::new(MeterState {
                gated: Mutex::new(HashSet::from(["a".to_owned(), "b".to_owned()])),
                ..MeterState::default()
            })))
            .open(&path)
            .unwrap();
        let serving = {
            let runtime = runtime.clone();
            tokio::spawn(async move { runtime.serve(Duration::from_secs(60)).await })
        };
        for run in ["a", "b"] {
            runtime.start(run, Metered::Work).await.unwrap();
            until_status(&runtime, run, RunStatus::Waiting).await;
            runtime.send(run, Metered::GO, &1).await.unwrap();
            runtime.wait::<Metered>(run).await.unwrap();
        }
        // `serve` refreshes the gauges of runs on its own, every `metrics_interval`.
        let completed = labels(&[("workflow", "metered"), ("status", "completed")]);
        loop {
            seen.take(&snapshotter);
            if seen.gauges_of(m::RUNS).get(&completed) == Some(&2.0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        runtime.shutdown().await;
        serving.await.unwrap().unwrap();
    }
    let runtime = Runtime::builder()
        .retention(loops::RetentionPolicy {
            keep_last: Some(0),
            ..loops::RetentionPolicy::default()
        })
        .open(&path)
        .unwrap();
    let serving = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.serve(Duration::from_secs(60)).await })
    };
    loop {
        seen.take(&snapshotter);
        if !seen.counts_of(m::PRUNE_PASS_RUNS).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        seen.counters_of(m::PRUNED_RUNS_TOTAL),
        BTreeMap::from([(vec![], 2)])
    );
    assert_eq!(
        seen.histograms[&(m::PRUNE_PASS_RUNS.to_owned(), vec![])],
        vec![2.0]
    );
    runtime.shutdown().await;
    serving.await.unwrap().unwrap();
}
