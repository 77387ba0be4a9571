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
        matches!(&second, Err(Error::RunActive { run_id }) if run_id == "x"),
        "{second:?}"
    );
    assert!(second.unwrap_err().is_transient());
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
