//! One driver per run in every configuration the API allows: two `Runtime`s built on clones
//! of one `RedbStore` share its leases, so only one of them drives a run at a time.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use loops::{Context, Error, FailureSource, RedbStore, RunStatus, Runtime, Workflow};
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, mpsc};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "once")]
enum Once {
    #[initial]
    #[next(Done)]
    Start,
    #[terminal]
    Done { line: u32 },
}

/// Its one step appends a line to `ledger` (the side effect, counted outside the store),
/// after telling `entered` and waiting at `gate`.
#[derive(Clone)]
struct Effect {
    ledger: PathBuf,
    entered: mpsc::UnboundedSender<()>,
    gate: Arc<Semaphore>,
}

impl OnceHandler for Effect {
    type Error = Error;

    async fn start(&self, ctx: &Context) -> Result<StartNext, Error> {
        let this = self.clone();
        let line: u32 = ctx
            .step("append", || async {
                let _ = this.entered.send(());
                let _permit = this.gate.acquire().await.unwrap();
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&this.ledger)
                    .unwrap();
                writeln!(file, "effect").unwrap();
                Ok(lines(&this.ledger))
            })
            .await?;
        Ok(StartNext::Done { line })
    }
}

fn lines(path: &Path) -> u32 {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count() as u32)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runtimes_on_one_store_never_drive_one_run_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let (entered, mut entered_rx) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let effect = Effect {
        ledger: ledger.clone(),
        entered,
        gate: Arc::clone(&gate),
    };
    let store = RedbStore::open(dir.path().join("store.redb")).unwrap();
    let rt1 = Runtime::builder().build(store.clone());
    let rt2 = Runtime::builder().build(store);

    let first = {
        let (rt1, effect) = (rt1.clone(), effect.clone());
        tokio::spawn(async move { rt1.run("x", Once::Start, &effect).await })
    };
    entered_rx.recv().await.unwrap();
    // The first runtime is inside the step: the second may not drive the run too.
    let second = tokio::select! {
        second = rt2.run("x", Once::Start, &effect) => second,
        _ = entered_rx.recv() => panic!("a second driver ran the step while the first held the run"),
    };
    assert!(
        matches!(&second, Err(Error::RunActive { run_id, .. }) if run_id == "x"),
        "{second:?}"
    );
    let second = second.unwrap_err();
    assert!(second.is_transient());
    assert_eq!(
        second.to_string(),
        "run `x` is already being driven, by another runtime holding its lease on this store"
    );
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap(), Once::Done { line: 1 });

    // The run ended: the second runtime finds it completed, and runs nothing.
    gate.add_permits(1);
    assert_eq!(
        rt2.run("x", Once::Start, &effect).await.unwrap(),
        Once::Done { line: 1 }
    );
    assert_eq!(lines(&ledger), 1);
    let info = rt2.run_info("x").await.unwrap().unwrap();
    assert_eq!(
        (info.status, info.attempt, info.interrupted, info.error),
        (RunStatus::Completed, 1, 0, None)
    );
    // No false "the process stopped (or lost the run's lease) while this attempt ran".
    assert_eq!(rt1.store().failures("x").await.unwrap(), vec![]);
    assert!(entered_rx.try_recv().is_err());
}

/// `run` of an ended run whose lease another worker still holds (a driver letting go after
/// its last commit, or a PostgreSQL worker that exited after the end without `shutdown`,
/// whose lease lasts until it lapses) reports the run's end, as it does for a free run; a
/// run not ended is still refused (helper-132: `RunActive` for a completed run, 10 s long).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_of_an_ended_run_whose_lease_another_worker_holds_reports_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let (entered, _entered_rx) = mpsc::unbounded_channel();
    let effect = Effect {
        ledger: ledger.clone(),
        entered,
        gate: Arc::new(Semaphore::new(2)),
    };
    let store = RedbStore::open(dir.path().join("store.redb")).unwrap();
    let rt = Runtime::builder().build(store.clone());
    assert_eq!(
        rt.run("x", Once::Start, &effect).await.unwrap(),
        Once::Done { line: 1 }
    );
    // Another worker's lease of the ended run, and of a run not ended.
    let held = loops::Store::acquire(&store, "x").await.unwrap();
    assert!(held.is_some());
    assert_eq!(
        rt.run("x", Once::Start, &effect).await.unwrap(),
        Once::Done { line: 1 }
    );
    assert_eq!(lines(&ledger), 1, "nothing ran again");
    let queued = (rt
        .enqueue("y", Once::Start, loops::StartOptions::default())
        .await)
        .unwrap();
    assert_eq!(queued.status, RunStatus::Running);
    let _held_too = loops::Store::acquire(&store, "y").await.unwrap().unwrap();
    let refused = rt.run("y", Once::Start, &effect).await;
    assert!(
        matches!(
            &refused,
            Err(Error::RunActive { run_id, holder: loops::Holder::Lease { ttl_ms: None } })
                if run_id == "y"
        ),
        "{refused:?}"
    );
    assert_eq!(lines(&ledger), 1);
}

/// A run left running with no driver is taken by one of two runtimes that resume at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runtimes_resuming_one_store_take_each_run_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let ledger = dir.path().join("ledger");
    let (entered, mut entered_rx) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let effect = Effect {
        ledger: ledger.clone(),
        entered,
        gate: Arc::clone(&gate),
    };
    {
        // Started, then the runtime stops inside the step, before its effect.
        let rt = Runtime::builder()
            .register::<Once, _>(effect.clone())
            .open(&path)
            .unwrap();
        rt.start("r", Once::Start).await.unwrap();
        entered_rx.recv().await.unwrap();
        rt.shutdown().await;
    }
    let store = RedbStore::open(&path).unwrap();
    let rt1 = Runtime::builder()
        .register::<Once, _>(effect.clone())
        .build(store.clone());
    let rt2 = Runtime::builder()
        .register::<Once, _>(effect.clone())
        .build(store);
    let (a, b) = tokio::join!(rt1.resume_all(), rt2.resume_all());
    let (a, b) = (a.unwrap(), b.unwrap());
    // Only one claimed the run (the other found nothing to drive).
    let mut resumed: Vec<&str> = a
        .driven
        .iter()
        .chain(&b.driven)
        .map(|i| i.run_id.as_str())
        .collect();
    resumed.sort_unstable();
    assert_eq!(resumed, ["r"]);
    entered_rx.recv().await.unwrap();
    gate.add_permits(2);
    assert_eq!(rt1.wait::<Once>("r").await.unwrap(), Once::Done { line: 1 });
    assert_eq!(rt2.wait::<Once>("r").await.unwrap(), Once::Done { line: 1 });
    assert_eq!(lines(&ledger), 1);
    assert!(entered_rx.try_recv().is_err());
    // The attempt the first runtime's stop cut short is the one interruption.
    let failures = rt1.store().failures("r").await.unwrap();
    let failures: Vec<(u64, u32, FailureSource)> = failures
        .into_iter()
        .map(|(seq, f)| (seq, f.attempt, f.source))
        .collect();
    assert_eq!(failures, [(0, 1, FailureSource::Interrupted)]);
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "relay")]
enum Relay {
    #[initial]
    #[next(Middle)]
    Begin,
    #[next(Done)]
    Middle,
    #[terminal]
    Done,
}

/// Each state's one step appends the state's name to `ledger`; `Begin`'s tells `entered`
/// and waits at `gate` first.
#[derive(Clone)]
struct Relayer {
    ledger: PathBuf,
    entered: mpsc::UnboundedSender<()>,
    gate: Arc<Semaphore>,
}

impl Relayer {
    fn append(&self, line: &str) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.ledger)
            .unwrap();
        writeln!(file, "{line}").unwrap();
    }
}

impl RelayHandler for Relayer {
    type Error = Error;

    async fn begin(&self, ctx: &Context) -> Result<BeginNext, Error> {
        ctx.step("begin", || async {
            let _ = self.entered.send(());
            let _permit = self.gate.acquire().await.unwrap();
            self.append("begin");
            Ok(())
        })
        .await?;
        Ok(BeginNext::Middle)
    }

    async fn middle(&self, ctx: &Context) -> Result<MiddleNext, Error> {
        ctx.step("middle", || async {
            self.append("middle");
            Ok(())
        })
        .await?;
        Ok(MiddleNext::Done)
    }
}

fn ledger(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Starts run "r" in a runtime over `path` serving in the background, waits until `Begin`'s
/// step is entered, and drains with `grace` while `release` permits are added to the gate
/// (after the drain began). Returns what the drain said, what `serve` returned, and the row.
async fn drain_inside_begin(
    path: &Path,
    relayer: &Relayer,
    entered: &mut mpsc::UnboundedReceiver<()>,
    grace: std::time::Duration,
    release: usize,
) -> (loops::Drained, loops::Result<()>, loops::RunInfo) {
    let rt = Runtime::builder()
        .register::<Relay, _>(relayer.clone())
        .open(path)
        .unwrap();
    let serving = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.serve(std::time::Duration::from_millis(50)).await })
    };
    rt.start("r", Relay::Begin).await.unwrap();
    entered.recv().await.unwrap();
    // `join!` polls the drain first: it has begun when the gate opens.
    let (drained, ()) = tokio::join!(rt.drain(grace), async {
        relayer.gate.add_permits(release);
    });
    let served = serving.await.unwrap();
    // A second drain has nothing left to let go or cut.
    let again = rt.drain(grace).await;
    assert_eq!((again.handed_over, again.cut), (0, 0));
    let info = rt.run_info("r").await.unwrap().unwrap();
    (drained, served, info)
}

/// A drain lets a run finish the state it is in and go at the boundary: the next process
/// takes it up at the next state, runs no recorded step again, and counts no interruption
/// (a shutdown cuts the state: its attempt counts as interrupted, and its step in flight
/// runs again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_lets_a_run_go_after_its_state_and_the_next_process_counts_no_interruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (entered, mut entered_rx) = mpsc::unbounded_channel();
    let relayer = Relayer {
        ledger: dir.path().join("ledger"),
        entered,
        gate: Arc::new(Semaphore::new(0)),
    };
    let grace = std::time::Duration::from_secs(60);
    let (drained, served, info) =
        drain_inside_begin(&path, &relayer, &mut entered_rx, grace, 1).await;
    assert_eq!((drained.handed_over, drained.cut), (1, 0));
    assert!(served.is_ok(), "{served:?}");
    // Let go in `Middle` with its attempt not begun; `Middle` did not run here.
    assert_eq!(
        (info.status, info.state.as_str(), info.seq, info.attempt),
        (RunStatus::Running, "Middle", 1, 0)
    );
    assert_eq!(ledger(&relayer.ledger), ["begin"]);

    let rt = Runtime::builder()
        .register::<Relay, _>(relayer.clone())
        .open(&path)
        .unwrap();
    let resumed = rt.resume_all().await.unwrap();
    assert_eq!(resumed.driven.len(), 1);
    assert_eq!(rt.wait::<Relay>("r").await.unwrap(), Relay::Done);
    assert_eq!(ledger(&relayer.ledger), ["begin", "middle"]);
    assert_eq!(rt.store().failures("r").await.unwrap(), vec![]);
    let info = rt.run_info("r").await.unwrap().unwrap();
    assert_eq!((info.attempt, info.interrupted), (1, 0));
    let states: Vec<String> = rt
        .store()
        .history("r")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.state)
        .collect();
    assert_eq!(states, ["Begin", "Middle", "Done"]);
    assert!(entered_rx.try_recv().is_err());
}

/// A state that outlasts the drain's grace is cut as a shutdown cuts it: the next process
/// records the attempt as interrupted and runs the step in flight again (once in all, since
/// the cut came before its effect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_that_outlasts_the_grace_is_cut_and_counted_as_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (entered, mut entered_rx) = mpsc::unbounded_channel();
    let relayer = Relayer {
        ledger: dir.path().join("ledger"),
        entered,
        gate: Arc::new(Semaphore::new(0)),
    };
    let grace = std::time::Duration::from_millis(200);
    let (drained, served, info) =
        drain_inside_begin(&path, &relayer, &mut entered_rx, grace, 0).await;
    assert_eq!((drained.handed_over, drained.cut), (0, 1));
    assert!(served.is_ok(), "{served:?}");
    assert_eq!(
        (info.status, info.state.as_str(), info.attempt),
        (RunStatus::Running, "Begin", 1)
    );
    assert!(ledger(&relayer.ledger).is_empty());

    let rt = Runtime::builder()
        .register::<Relay, _>(relayer.clone())
        .open(&path)
        .unwrap();
    rt.resume_all().await.unwrap();
    entered_rx.recv().await.unwrap();
    relayer.gate.add_permits(1);
    assert_eq!(rt.wait::<Relay>("r").await.unwrap(), Relay::Done);
    assert_eq!(ledger(&relayer.ledger), ["begin", "middle"]);
    let failures: Vec<(u64, u32, FailureSource)> = rt
        .store()
        .failures("r")
        .await
        .unwrap()
        .into_iter()
        .map(|(seq, f)| (seq, f.attempt, f.source))
        .collect();
    assert_eq!(failures, [(0, 1, FailureSource::Interrupted)]);
}

/// `enqueue` records a run that a runtime without its workflow does not drive: its attempt
/// is not begun (0), queuing the id again returns that run, and the process that registers
/// the workflow takes it up, beginning attempt 1 with no interruption counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_is_driven_by_the_runtime_that_registers_its_workflow() {
    let dir = tempfile::tempdir().unwrap();
    let (entered, mut entered_rx) = mpsc::unbounded_channel();
    let relayer = Relayer {
        ledger: dir.path().join("ledger"),
        entered,
        gate: Arc::new(Semaphore::new(1)),
    };
    let store = RedbStore::open(dir.path().join("store.redb")).unwrap();
    let front = Runtime::builder().build(store.clone());
    let options = || loops::StartOptions::default().attribute("issue", 17);
    let queued = front.enqueue("q", Relay::Begin, options()).await.unwrap();
    assert_eq!(
        (
            queued.status,
            queued.state.as_str(),
            queued.seq,
            queued.attempt
        ),
        (RunStatus::Running, "Begin", 0, 0)
    );
    let again = front.enqueue("q", Relay::Begin, options()).await.unwrap();
    assert_eq!(again, queued);
    let refused = front
        .enqueue("q2", Relay::Middle, options())
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::NotInitial { .. }), "{refused:?}");
    assert!(front.run_info("q2").await.unwrap().is_none());
    assert!(
        entered_rx.try_recv().is_err(),
        "the front end drove the run"
    );

    let worker = Runtime::builder()
        .register::<Relay, _>(relayer.clone())
        .build(store);
    let resumed = worker.resume_all().await.unwrap();
    assert_eq!(resumed.driven.len(), 1);
    assert_eq!(worker.wait::<Relay>("q").await.unwrap(), Relay::Done);
    assert_eq!(ledger(&relayer.ledger), ["begin", "middle"]);
    assert_eq!(worker.store().failures("q").await.unwrap(), vec![]);
    let attributes = worker.store().attributes("q").await.unwrap();
    assert_eq!(
        attributes.get("issue"),
        Some(&loops::AttributeValue::from(17))
    );
    // A runtime that registers the workflow drives what it queues, as `start` does.
    relayer.gate.add_permits(1);
    worker
        .enqueue("q3", Relay::Begin, loops::StartOptions::default())
        .await
        .unwrap();
    assert_eq!(worker.wait::<Relay>("q3").await.unwrap(), Relay::Done);
    let info = worker.run_info("q3").await.unwrap().unwrap();
    assert_eq!((info.attempt, info.interrupted), (1, 0));
    assert_eq!(worker.store().failures("q3").await.unwrap(), vec![]);
}

/// Holds the first creation it sees for `DELAY`, telling `seen` that it does.
struct HoldFirstCreation {
    seen: std::sync::Mutex<Option<mpsc::UnboundedSender<()>>>,
}

impl loops::testing::WriteHook for HoldFirstCreation {
    fn before(&self, seen: &loops::testing::WriteSeen) -> loops::testing::Verdict {
        let mut tell = self.seen.lock().unwrap();
        match tell.take_if(|_| seen.kind == "Create") {
            Some(tell) => {
                let _ = tell.send(());
                loops::testing::Verdict::Delay(std::time::Duration::from_secs(2))
            }
            None => loops::testing::Verdict::Go,
        }
    }
}

/// A run that a front end queues between a driver's read (no such run) and its creation:
/// the driver's creation loses (the record of seq 0 is taken) and the driver takes the
/// queued run up instead of failing with `SequenceConflict`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_queued_while_a_driver_creates_it_is_driven_by_that_driver() {
    let dir = tempfile::tempdir().unwrap();
    let (entered, mut entered_rx) = mpsc::unbounded_channel();
    let effect = Effect {
        ledger: dir.path().join("ledger"),
        entered,
        gate: Arc::new(Semaphore::new(1)),
    };
    let store = RedbStore::open(dir.path().join("store.redb")).unwrap();
    let (tell, mut creating) = mpsc::unbounded_channel();
    let hook = HoldFirstCreation {
        seen: std::sync::Mutex::new(Some(tell)),
    };
    let driver =
        Runtime::builder().build(loops::testing::HookedStore::with_hook(store.clone(), hook));
    let front = Runtime::builder().build(store);
    let driving = {
        let (driver, effect) = (driver.clone(), effect.clone());
        tokio::spawn(async move { driver.run("x", Once::Start, &effect).await })
    };
    creating.recv().await.unwrap();
    let queued = front
        .enqueue("x", Once::Start, loops::StartOptions::default())
        .await
        .unwrap();
    // The front end's creation is the one recorded (the driver's is held back still).
    assert_eq!((queued.seq, queued.attempt), (0, 0));
    assert!(entered_rx.try_recv().is_err());
    assert_eq!(driving.await.unwrap().unwrap(), Once::Done { line: 1 });
    assert_eq!(lines(&effect.ledger), 1);
    let info = front.run_info("x").await.unwrap().unwrap();
    assert_eq!(
        (info.status, info.attempt, info.interrupted),
        (RunStatus::Completed, 1, 0)
    );
    assert_eq!(front.store().failures("x").await.unwrap(), vec![]);
    assert_eq!(front.store().history("x").await.unwrap().len(), 2);
}

/// A run started on a runtime that drained is recorded for the next process, its first
/// attempt not begun: that process drives it and counts no interruption (before, `start`
/// recorded attempt 1 as begun with no driver, and the next process counted it interrupted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_after_a_drain_is_left_for_the_next_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (entered, mut entered_rx) = mpsc::unbounded_channel();
    let relayer = Relayer {
        ledger: dir.path().join("ledger"),
        entered,
        gate: Arc::new(Semaphore::new(1)),
    };
    {
        let rt = Runtime::builder()
            .register::<Relay, _>(relayer.clone())
            .open(&path)
            .unwrap();
        let drained = rt.drain(std::time::Duration::from_secs(5)).await;
        assert_eq!((drained.handed_over, drained.cut), (0, 0));
        let late = rt.start("late", Relay::Begin).await.unwrap();
        assert_eq!((late.status, late.attempt), (RunStatus::Running, 0));
        assert!(
            entered_rx.try_recv().is_err(),
            "a drained runtime drove the run"
        );
    }
    let rt = Runtime::builder()
        .register::<Relay, _>(relayer.clone())
        .open(&path)
        .unwrap();
    rt.resume_all().await.unwrap();
    assert_eq!(rt.wait::<Relay>("late").await.unwrap(), Relay::Done);
    assert_eq!(ledger(&relayer.ledger), ["begin", "middle"]);
    assert_eq!(rt.store().failures("late").await.unwrap(), vec![]);
}
