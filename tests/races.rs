//! Races between a background driver that is stopping (it parked, or its run failed) and a
//! caller acting on the run at that moment. Each test repeats the race until it is lost or
//! `ROUNDS` times; the expected end follows at once, so a run still not ended after
//! `PATIENCE` is stuck.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use loops::{Context, Error, RetryPolicy, RunStatus, Runtime, Workflow};
use serde::{Deserialize, Serialize};

const ROUNDS: u32 = 300;
const PATIENCE: Duration = Duration::from_secs(3);

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "race_gate")]
enum Gate {
    #[initial]
    #[next(Approved)]
    Asked { doc: u32 },
    #[terminal]
    Approved { doc: u32, by: String },
}

struct Waiter;

impl GateHandler for Waiter {
    type Error = loops::Error;

    async fn asked(&self, ctx: &Context, doc: u32) -> Result<AskedNext, Self::Error> {
        let by: String = ctx.wait_for("approval").await?;
        Ok(AskedNext::Approved { doc, by })
    }
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "race_flaky")]
enum Flaky {
    #[initial]
    #[next(Passed)]
    Trying { n: u32 },
    #[terminal]
    Passed { n: u32 },
}

/// Fails every first attempt; passes after a retry.
struct FailsOnce {
    calls: AtomicU32,
}

impl FlakyHandler for FailsOnce {
    type Error = anyhow::Error;

    async fn trying(&self, ctx: &Context, n: u32) -> anyhow::Result<TryingNext> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        anyhow::ensure!(ctx.attempt() > 1, "attempt {} fails", ctx.attempt());
        Ok(TryingNext::Passed { n })
    }
}

async fn until_status(rt: &Runtime, id: &str, status: RunStatus) {
    loop {
        if rt
            .run_info(id)
            .await
            .unwrap()
            .is_some_and(|i| i.status == status)
        {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// What becomes of a stuck run once `resume_all` is called (as a restart would).
async fn after_resume_all(rt: &Runtime, id: &str) -> String {
    rt.resume_all().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let info = rt.run_info(id).await.unwrap().unwrap();
    format!("status {}, state {}", info.status, info.state)
}

/// `Runtime::cancel` chooses between ending the run at once (nobody drives it) and signalling
/// its driver by looking at the drivers of this runtime *before* it commits. A background
/// driver that has just parked the run (committed `waiting`) still holds the run for a few
/// microseconds; a cancel then only signals it, the driver stops without looking, and the run
/// stays `waiting` with its cancellation recorded, for as long as no event comes (or, for a
/// wait with a time-out, until it passes): `resume_all` does not drive it either (its wait is
/// not over), and `wait` does not return. A second cancel ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_the_background_driver_parks_ends_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder()
        .register::<Gate, _>(Waiter)
        .open(dir.path().join("store.redb"))
        .unwrap();
    for i in 0..ROUNDS {
        let id = format!("gate-{i}");
        rt.start(&id, Gate::Asked { doc: i }).await.unwrap();
        until_status(&rt, &id, RunStatus::Waiting).await;
        let info = rt.cancel(&id, "withdrawn").await.unwrap();
        assert_eq!(info.cancel.as_deref(), Some("withdrawn"));
        match tokio::time::timeout(PATIENCE, rt.wait::<Gate>(&id)).await {
            Ok(Err(Error::RunCancelled { .. })) => {}
            Ok(other) => panic!("{id}: expected RunCancelled, got {other:?}"),
            Err(_) => {
                let info = rt.run_info(&id).await.unwrap().unwrap();
                let after = after_resume_all(&rt, &id).await;
                let again = rt.cancel(&id, "withdrawn again").await.map(|i| i.status);
                panic!(
                    "{id} (round {i}): cancel returned Ok, but the run did not end: status {}, \
                     cancel {:?}, wait {:?}; after resume_all: {after}; a second cancel: {again:?}",
                    info.status, info.cancel, info.wait
                );
            }
        }
    }
}

/// `Runtime::retry` makes a failed run running and starts a background driver for it, unless
/// a driver of this runtime holds the run. The driver whose attempt just failed the run
/// (committed `failed`) still holds it for a few microseconds; a retry then starts nothing,
/// and the run stays `running` with no driver until the next `resume_all` (a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_as_soon_as_the_run_failed_drives_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder()
        .retry(RetryPolicy::never())
        .register::<Flaky, _>(FailsOnce {
            calls: AtomicU32::new(0),
        })
        .open(dir.path().join("store.redb"))
        .unwrap();
    for i in 0..ROUNDS {
        let id = format!("flaky-{i}");
        rt.start(&id, Flaky::Trying { n: i }).await.unwrap();
        until_status(&rt, &id, RunStatus::Failed).await;
        let info = rt.retry(&id).await.unwrap();
        assert_eq!(info.status, RunStatus::Running);
        match tokio::time::timeout(PATIENCE, rt.wait::<Flaky>(&id)).await {
            Ok(Ok(done)) => assert_eq!(done, Flaky::Passed { n: i }),
            Ok(Err(e)) => panic!("{id}: {e}"),
            Err(_) => {
                let info = rt.run_info(&id).await.unwrap().unwrap();
                let after = after_resume_all(&rt, &id).await;
                panic!(
                    "{id} (round {i}): retry returned Ok, but no driver took the run: status {}, \
                     attempt {}; after resume_all: {after}",
                    info.status, info.attempt
                );
            }
        }
    }
}
