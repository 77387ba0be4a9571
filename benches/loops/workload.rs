//! The workflow every scenario drives, and its handlers.
//!
//! `Bench` counts down: `Start { left }` and `Work { left }` move to `Work { left - 1 }` until
//! `left` is 0, then to `Done`. Each state carries a note of [`NOTE_BYTES`] characters, so
//! that a serialized state is about 200 bytes, the size of a small agent state (ids, a
//! status, a short summary).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use loops::{Context, Workflow};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// Characters in each state's note.
pub const NOTE_BYTES: usize = 160;

/// The note every state carries.
pub fn note() -> String {
    "lorem ipsum dolor sit amet, consectetur adipiscing elit "
        .chars()
        .cycle()
        .take(NOTE_BYTES)
        .collect()
}

/// Seeds `store` with `runs` unfinished runs `run-0000000`, … at `Bench::Start` (one record
/// each, written directly): the population of the startup and search scenarios.
pub fn seed_unfinished(store: &loops::RedbStore, runs: u64) {
    let note = note();
    store
        .__seed_history((0..runs).map(|i| {
            (
                format!("run-{i:07}"),
                Bench::Start {
                    left: 1,
                    note: note.clone(),
                },
            )
        }))
        .expect("seed the runs");
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "bench", version = 1)]
pub enum Bench {
    /// A run starts here.
    #[initial]
    #[next(Work, Done)]
    Start { left: u64, note: String },
    /// One transition per state, `left` times.
    #[next(Work, Done)]
    Work { left: u64, note: String },
    #[terminal]
    Done { note: String },
}

/// The states of one run with `records` transition records whose latest state is one
/// transition from the end: `Start`, then `Work` counting down to `Work { left: 0 }`.
pub fn history(run_id: &str, records: u64) -> impl Iterator<Item = (String, Bench)> + '_ {
    let note = note();
    (0..records).map(move |seq| {
        let left = records - 1 - seq;
        let value = if seq == 0 {
            Bench::Start {
                left,
                note: note.clone(),
            }
        } else {
            Bench::Work {
                left,
                note: note.clone(),
            }
        };
        (run_id.to_owned(), value)
    })
}

/// Counts down; optionally stamps each handler entry and runs journaled steps.
#[derive(Default)]
pub struct Looper {
    /// Handler entries so far (each one after a run's first follows a committed transition).
    pub entries: AtomicU64,
    /// When set, every run moves to `Done` at its next state.
    pub stop: AtomicBool,
    /// Record the time of each handler entry in `stamps`.
    pub stamp: bool,
    /// Journaled steps per state (each timed into `step_times`).
    pub steps: u32,
    pub stamps: Mutex<Vec<Instant>>,
    pub step_times: Mutex<Vec<Duration>>,
    /// While set, handlers wait at their entry (after counting it) until [`Looper::unpause`].
    paused: AtomicBool,
    resumed: Notify,
}

impl Looper {
    /// A handler that counts entries only.
    pub fn counting() -> Arc<Self> {
        Arc::new(Looper::default())
    }

    /// A handler that stamps entries and runs `steps` timed steps per state.
    pub fn stamping(steps: u32, capacity: usize) -> Arc<Self> {
        Arc::new(Looper {
            stamp: true,
            steps,
            stamps: Mutex::new(Vec::with_capacity(capacity + 2)),
            step_times: Mutex::new(Vec::with_capacity((capacity + 2) * steps as usize)),
            ..Looper::default()
        })
    }

    pub fn take_stamps(&self) -> Vec<Instant> {
        std::mem::take(&mut *self.stamps.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn take_step_times(&self) -> Vec<Duration> {
        std::mem::take(
            &mut *self
                .step_times
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Holds every run at its next handler entry, once its current transition is committed.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }

    pub fn unpause(&self) {
        self.paused.store(false, Ordering::SeqCst);
        self.resumed.notify_waiters();
    }

    /// The shared body of both handlers: `Some(left - 1)` to go on, `None` to finish.
    async fn advance(&self, ctx: &Context, left: u64, note: &str) -> loops::Result<Option<u64>> {
        self.entries.fetch_add(1, Ordering::Relaxed);
        while self.paused.load(Ordering::SeqCst) {
            let resumed = self.resumed.notified();
            tokio::pin!(resumed);
            resumed.as_mut().enable();
            if !self.paused.load(Ordering::SeqCst) {
                break;
            }
            resumed.await;
        }
        if self.stamp {
            let now = Instant::now();
            self.stamps
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(now);
        }
        for _ in 0..self.steps {
            let started = Instant::now();
            let _out: String = ctx.step("s", || async { Ok(note.to_owned()) }).await?;
            let took = started.elapsed();
            self.step_times
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(took);
        }
        Ok(if left == 0 || self.stop.load(Ordering::Relaxed) {
            None
        } else {
            Some(left - 1)
        })
    }
}

impl BenchHandler for Looper {
    type Error = loops::Error;

    async fn start(&self, ctx: &Context, left: u64, note: String) -> loops::Result<StartNext> {
        Ok(match self.advance(ctx, left, &note).await? {
            Some(left) => StartNext::Work { left, note },
            None => StartNext::Done { note },
        })
    }

    async fn work(&self, ctx: &Context, left: u64, note: String) -> loops::Result<WorkNext> {
        Ok(match self.advance(ctx, left, &note).await? {
            Some(left) => WorkNext::Work { left, note },
            None => WorkNext::Done { note },
        })
    }
}

/// Counts handler entries and then blocks forever: startup measures listing and spawning.
#[derive(Clone, Default)]
pub struct Blocker {
    pub entered: Arc<AtomicU64>,
}

impl BenchHandler for Blocker {
    type Error = loops::Error;

    async fn start(&self, _: &Context, _: u64, _: String) -> loops::Result<StartNext> {
        self.entered.fetch_add(1, Ordering::Relaxed);
        std::future::pending().await
    }

    async fn work(&self, _: &Context, _: u64, _: String) -> loops::Result<WorkNext> {
        self.entered.fetch_add(1, Ordering::Relaxed);
        std::future::pending().await
    }
}

/// Waits for an event that never comes: its runs park (status waiting, no task).
#[derive(Clone, Default)]
pub struct Parker {
    /// Handler futures dropped: runs parked.
    pub parked: Arc<AtomicU64>,
}

/// Counts one parked run when the handler's future is dropped.
struct OnDrop(Arc<AtomicU64>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

impl BenchHandler for Parker {
    type Error = loops::Error;

    async fn start(&self, ctx: &Context, _: u64, note: String) -> loops::Result<StartNext> {
        let _parked = OnDrop(Arc::clone(&self.parked));
        let _go: String = ctx.wait_for("go").await?;
        Ok(StartNext::Done { note })
    }

    async fn work(&self, _: &Context, _: u64, note: String) -> loops::Result<WorkNext> {
        Ok(WorkNext::Done { note })
    }
}
