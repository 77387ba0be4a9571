//! Parked runs seeded by `RedbStore::__seed_waiting`: stored as the runtime parks them, and
//! resumed by `resume_all` without a task each.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use loops_derive::Workflow;
use serde::{Deserialize, Serialize};

use crate::*;

/// Sleeps until `until_ms` if set, else waits for the event `go`; then ends.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "nap", crate = crate)]
enum Nap {
    #[initial]
    #[next(Done)]
    Start { until_ms: Option<u64> },
    #[terminal]
    Done { slept: bool },
}

struct Napper;

impl NapHandler for Napper {
    type Error = Error;
    async fn start(&self, ctx: &Context, until_ms: Option<u64>) -> Result<StartNext> {
        match until_ms {
            Some(until) => {
                ctx.sleep_until(UNIX_EPOCH + Duration::from_millis(until))
                    .await?;
                Ok(StartNext::Done { slept: true })
            }
            None => {
                let _go: String = ctx.wait_for("go").await?;
                Ok(StartNext::Done { slept: false })
            }
        }
    }
}

fn now_ms() -> u64 {
    crate::epoch_ms(SystemTime::now())
}

fn sleep_wait(until_ms: u64) -> WaitInfo {
    WaitInfo {
        event: None,
        until_ms: Some(until_ms),
    }
}

fn event_wait() -> WaitInfo {
    WaitInfo {
        event: Some("go".to_owned()),
        until_ms: None,
    }
}

/// A stored run's row, records and steps, with every time (and the key nonce) zeroed.
fn stored_but_times(
    store: &RedbStore,
    id: &str,
) -> (RunInfo, Vec<u64>, Vec<(String, u32, String)>) {
    let mut info = store.run(id).unwrap().unwrap();
    info.run_id.clear();
    info.created_ms = 0;
    info.updated_ms = 0;
    // Random, different for each run: that there is one is compared.
    info.key_nonce = info.key_nonce.map(|_| 0);
    let seqs = store.history(id).unwrap().iter().map(|r| r.seq).collect();
    let steps = store
        .steps(id, 0)
        .unwrap()
        .into_iter()
        .map(|(name, occurrence, record)| (name, occurrence, record.output.get().to_owned()))
        .collect();
    (info, seqs, steps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_parked_runs_are_stored_like_runs_the_runtime_parked() {
    let (_dir, path) = super::temp_store();
    let rt = Runtime::builder()
        .register::<Nap, _>(Napper)
        .open(&path)
        .unwrap();
    let until = now_ms() + 3_600_000;
    for (id, until_ms) in [("built-sleep", Some(until)), ("built-event", None)] {
        rt.start(id, Nap::Start { until_ms }).await.unwrap();
    }
    for _ in 0..500 {
        let waiting = rt.list_runs(RunStatus::Waiting, Some("nap")).await.unwrap();
        if waiting.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let store = rt.redb().unwrap();
    let seeded = store
        .__seed_waiting([
            (
                "seeded-sleep".to_owned(),
                Nap::Start {
                    until_ms: Some(until),
                },
                sleep_wait(until),
            ),
            (
                "seeded-event".to_owned(),
                Nap::Start { until_ms: None },
                event_wait(),
            ),
        ])
        .unwrap();
    assert_eq!(seeded, 2);
    for kind in ["sleep", "event"] {
        let built = stored_but_times(store, &format!("built-{kind}"));
        assert_eq!(built.0.status, RunStatus::Waiting);
        assert_eq!(stored_but_times(store, &format!("seeded-{kind}")), built);
    }
    let (sleeping, _, steps) = stored_but_times(store, "seeded-sleep");
    assert_eq!(sleeping.wait, Some(sleep_wait(until)));
    assert_eq!(steps, [("loops:sleep".to_owned(), 0, until.to_string())]);
    assert!(matches!(
        store.__seed_waiting([(
            "seeded-event".to_owned(),
            Nap::Start { until_ms: None },
            event_wait()
        )]),
        Err(Error::SequenceConflict { seq: 0, .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_all_gives_parked_runs_no_task_and_their_timers_fire() {
    let (_dir, path) = super::temp_store();
    let (sleeping, waiting) = (60u64, 40u64);
    let first = now_ms() + 1_500;
    {
        let store = RedbStore::open(&path).unwrap();
        let runs = (0..sleeping)
            .map(|i| {
                let until = first + i * 10;
                let value = Nap::Start {
                    until_ms: Some(until),
                };
                (format!("sleep-{i:03}"), value, sleep_wait(until))
            })
            .chain((0..waiting).map(|i| {
                let value = Nap::Start { until_ms: None };
                (format!("event-{i:03}"), value, event_wait())
            }));
        assert_eq!(store.__seed_waiting(runs).unwrap(), sleeping + waiting);
    }
    let rt = Runtime::builder()
        .register::<Nap, _>(Napper)
        .open(&path)
        .unwrap();
    let found = rt.resume_all().await.unwrap();
    assert!(now_ms() < first, "resumed before the first timer was due");
    assert_eq!(found.len() as u64, sleeping + waiting);
    // No driver: one timer each for the sleeping runs, served by the one timer task.
    assert_eq!(rt.inner.background.armed_timers() as u64, sleeping);
    assert_eq!(rt.inner.background.live_tasks(), 1);
    assert_eq!(rt.inner.claims.count(), 0);
    // Every timer fires and its run ends; the event runs still wait, with no task.
    for i in 0..sleeping {
        let done = tokio::time::timeout(
            Duration::from_secs(60),
            rt.wait::<Nap>(&format!("sleep-{i:03}")),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(done, Nap::Done { slept: true });
    }
    assert_eq!(rt.inner.background.armed_timers(), 0);
    let still = rt.list_runs(RunStatus::Waiting, Some("nap")).await.unwrap();
    assert_eq!(still.len() as u64, waiting);
    for _ in 0..500 {
        if rt.inner.background.live_tasks() <= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rt.inner.background.live_tasks(), 1);
    // An event wakes its run, which ends.
    rt.send("event-007", "go", &"now").await.unwrap();
    let done = tokio::time::timeout(Duration::from_secs(60), rt.wait::<Nap>("event-007"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done, Nap::Done { slept: false });
}

/// Sleeps as [`Napper`] does, then counts itself in `inside` (and the most seen at once in
/// `most`) until `gate` lets it end.
struct GatedNapper {
    inside: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl NapHandler for GatedNapper {
    type Error = Error;
    async fn start(&self, ctx: &Context, until_ms: Option<u64>) -> Result<StartNext> {
        if let Some(until) = until_ms {
            ctx.sleep_until(UNIX_EPOCH + Duration::from_millis(until))
                .await?;
        }
        let now = self.inside.fetch_add(1, Ordering::AcqRel) + 1;
        self.most.fetch_max(now, Ordering::AcqRel);
        let permit = self.gate.acquire().await;
        self.inside.fetch_sub(1, Ordering::AcqRel);
        drop(permit);
        Ok(StartNext::Done {
            slept: until_ms.is_some(),
        })
    }
}

/// With `max_active_runs(3)` and 8 parked runs whose timers come due at once, the timers wake
/// 3 runs; the other 5 stay armed, holding no driver, until a place frees, and every run ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_wakes_take_no_more_places_than_max_active_runs() {
    let (_dir, path) = super::temp_store();
    let due = now_ms() + 1_500;
    {
        let store = RedbStore::open(&path).unwrap();
        let runs = (0..8).map(|i| {
            let value = Nap::Start {
                until_ms: Some(due),
            };
            (format!("sleep-{i}"), value, sleep_wait(due))
        });
        assert_eq!(store.__seed_waiting(runs).unwrap(), 8);
    }
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let rt = Runtime::builder()
        .max_active_runs(3)
        .register::<Nap, _>(GatedNapper {
            inside: Arc::clone(&inside),
            most: Arc::clone(&most),
            gate: Arc::clone(&gate),
        })
        .open(&path)
        .unwrap();
    let found = rt.resume_all().await.unwrap();
    assert!(now_ms() < due, "resumed before the timers were due");
    assert_eq!(found.timers, 8);
    for _ in 0..3000 {
        if inside.load(Ordering::Acquire) == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(inside.load(Ordering::Acquire), 3);
    // Held there: the other timers wait for a place, not for their time.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(inside.load(Ordering::Acquire), 3);
    assert_eq!(rt.inner.claims.count(), 3);
    assert_eq!(rt.inner.background.armed_timers(), 5);
    gate.add_permits(8);
    for i in 0..8 {
        let done = tokio::time::timeout(
            Duration::from_secs(60),
            rt.wait::<Nap>(&format!("sleep-{i}")),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(done, Nap::Done { slept: true });
    }
    assert_eq!(most.load(Ordering::Acquire), 3);
    assert_eq!(rt.inner.background.armed_timers(), 0);
}
