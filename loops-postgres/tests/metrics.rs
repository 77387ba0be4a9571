//! Metrics on PostgreSQL: a lease lost under a running driver (its row deleted by another
//! hand, so that the next renewal does not extend it) is counted once in
//! `loops_lease_losses_total`, even though the run is then claimed and driven again; and every
//! commit is one write (`loops_commit_batch_size{store="postgres"}`).
//!
//! The recorder is local to the test's thread (`set_default_local_recorder`) on a
//! current-thread tokio runtime, so every task of the runtime records on it.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use loops::metrics::{self as m, facade};
use loops::{Context, Runtime, Workflow};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "pg_leased")]
enum Leased {
    #[initial]
    #[next(Done)]
    Hold,
    #[terminal]
    Done,
}

/// Enters its step and stays there: counts the entries.
#[derive(Default)]
struct Holder {
    entered: AtomicU32,
}

impl LeasedHandler for Arc<Holder> {
    type Error = loops::BoxError;

    async fn hold(&self, ctx: &Context) -> Result<HoldNext, Self::Error> {
        ctx.step("hold", || async {
            self.entered.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
            Ok(())
        })
        .await?;
        Ok(HoldNext::Done)
    }
}

/// Lease losses counted so far, and the samples of the PostgreSQL commit batches, added to
/// `seen` (a snapshot resets what it reads).
fn take(snapshotter: &Snapshotter, losses: &mut u64, batches: &mut Vec<f64>) {
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        match (key.name(), value) {
            (m::LEASE_LOSSES_TOTAL, DebugValue::Counter(n)) => {
                assert_eq!(labels, [("workflow".to_owned(), "pg_leased".to_owned())]);
                *losses += n;
            }
            (m::COMMIT_BATCH_SIZE, DebugValue::Histogram(samples)) => {
                assert_eq!(labels, [("store".to_owned(), "postgres".to_owned())]);
                batches.extend(samples.into_iter().map(|s| s.into_inner()));
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_lost_lease_is_counted_once() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = facade::set_default_local_recorder(&recorder);
    let (mut losses, mut batches) = (0, Vec::new());

    let schema = common::TestSchema::new("metrics_lease").await;
    let holder = Arc::new(Holder::default());
    let runtime = Runtime::builder()
        .register::<Leased, _>(Arc::clone(&holder))
        .build(schema.store(Duration::from_millis(600)).await);
    let serving = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.serve(Duration::from_millis(50)).await })
    };
    runtime.start("l-1", Leased::Hold).await.unwrap();
    while holder.entered.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Another hand takes the lease away: the next renewal does not extend it.
    common::admin()
        .await
        .execute(
            &format!(
                "DELETE FROM \"{}\".leases WHERE run_id = 'l-1'",
                schema.name
            ),
            &[],
        )
        .await
        .unwrap();
    while losses == 0 {
        take(&snapshotter, &mut losses, &mut batches);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The run is free again: this worker claims it and its step runs a second time.
    while holder.entered.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    take(&snapshotter, &mut losses, &mut batches);
    assert_eq!(losses, 1);
    // Create, begin attempt... each committed alone.
    assert!(!batches.is_empty());
    assert!(batches.iter().all(|&n| n == 1.0), "{batches:?}");

    runtime.shutdown().await;
    serving.await.unwrap().unwrap();
}
