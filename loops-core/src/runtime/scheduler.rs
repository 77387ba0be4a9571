//! Background machinery: the tasks that drive runs, the timers of parked runs, and the task
//! that renews leases.
//!
//! A registered workflow's run is driven by a task that ends when the run ends or parks. A
//! parked run holds no task: only an entry here if it waits for a time (one `BTreeSet` entry,
//! served by one timer task for the whole runtime), or nothing at all if it waits for an
//! event (`Runtime::send` starts its driver). The scheduler knows nothing of the runtime: its
//! timer and renewal tasks call back through [`Hooks`], holding the runtime only while they
//! work.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::error::Result;
use crate::store::BoxFuture;

/// A timer: (wake-up ms, workflow, run id).
pub(crate) type Timer = (u64, Arc<str>, String);

/// What the scheduler's tasks call back into: the runtime, reached through a weak reference
/// so that dropping the last runtime handle closes the store.
pub(crate) trait Hooks: Send + Sync + 'static {
    /// The machinery of the runtime.
    fn background(&self) -> &Background;

    /// A parked run's time came: start its driver.
    fn timer_due(self: Arc<Self>, workflow: &str, run_id: &str);

    /// How many more runs timers may wake now: the places left under `max_active_runs`
    /// (`usize::MAX` without a limit).
    fn wakes_allowed(&self) -> usize;

    /// Notified when a place under `max_active_runs` may have freed.
    fn freed(&self) -> Arc<Notify>;

    /// Renews the leases of the runs being driven.
    fn renew(self: Arc<Self>) -> BoxFuture<'static, Result<()>>;
}

/// The runtime's background machinery.
pub(crate) struct Background {
    /// The live background tasks (a finished task is freed at once).
    tasks: TaskTracker,
    /// Parked runs waiting for a time: (wake-up ms, workflow, run id). The workflow's name is
    /// shared by the timers `resume_all` arms.
    timers: Mutex<BTreeSet<Timer>>,
    timer_changed: Arc<Notify>,
    timer_task: AtomicBool,
    /// Whether the task that renews leases (stores shared by several workers) was started.
    renewer: AtomicBool,
    ended: Notify,
    shut_down: AtomicBool,
    stop: tokio_util::sync::CancellationToken,
    /// Cancelled by [`drain`](Self::drain) (and by [`shutdown`](Self::shutdown), whose
    /// token is its parent): no new driver starts, and drivers let their runs go at the next
    /// state boundary.
    draining: tokio_util::sync::CancellationToken,
    /// The live drivers of runs (a subset of `tasks`), which a drain waits for.
    drivers: TaskTracker,
    /// Drivers that let their run go at a state boundary since the drain began.
    handed_over: AtomicU64,
}

impl Drop for Background {
    fn drop(&mut self) {
        // Lets the timer task see that the runtime is gone.
        self.timer_changed.notify_one();
    }
}

impl Background {
    pub(crate) fn new() -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        Background {
            tasks: TaskTracker::new(),
            timers: Mutex::new(BTreeSet::new()),
            timer_changed: Arc::new(Notify::new()),
            timer_task: AtomicBool::new(false),
            renewer: AtomicBool::new(false),
            ended: Notify::new(),
            shut_down: AtomicBool::new(false),
            draining: stop.child_token(),
            stop,
            drivers: TaskTracker::new(),
            handed_over: AtomicU64::new(0),
        }
    }

    /// Resolves at the next end of a run (used with `enable` before a status check).
    pub(crate) fn ended(&self) -> tokio::sync::futures::Notified<'_> {
        self.ended.notified()
    }

    pub(crate) fn notify_ended(&self) {
        self.ended.notify_waiters();
    }

    pub(crate) fn spawn_task(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        if self.shut_down.load(Ordering::Acquire) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::error!("no tokio runtime: cannot drive a run in the background");
            return;
        };
        // Shutting down drops the task's future at its next await, as a crash would stop it.
        let stop = self.stop.clone();
        self.tasks.spawn_on(
            async move {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => {}
                    () = task => {}
                }
            },
            &handle,
        );
    }

    /// [`spawn_task`](Self::spawn_task) for a run's driver, which a drain waits for.
    pub(crate) fn spawn_driver(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let task = self.drivers.track_future(task);
        self.spawn_task(task);
    }

    /// Whether a drain (or a shutdown) began: no new driver should start.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// Cancelled when a drain or a shutdown begins.
    pub(crate) fn draining(&self) -> tokio_util::sync::CancellationToken {
        self.draining.clone()
    }

    /// Counts a driver that let its run go at a state boundary during a drain.
    pub(crate) fn count_handed_over(&self) {
        self.handed_over.fetch_add(1, Ordering::Relaxed);
    }

    /// Begins a drain and waits up to `grace` for the live drivers to stop; returns how many
    /// let their run go at a state boundary and how many were still driving at the end of
    /// `grace` (stopped by the shutdown that follows).
    pub(crate) async fn drain(&self, grace: Duration) -> (u64, u64) {
        self.draining.cancel();
        self.drivers.close();
        let _ = tokio::time::timeout(grace, self.drivers.wait()).await;
        let cut = self.drivers.len() as u64;
        // Counted once: a second drain reports only what it let go itself.
        (self.handed_over.swap(0, Ordering::Relaxed), cut)
    }

    /// Arms timers, each starting a driver for its run at its time (ms since the Unix
    /// epoch): under one lock, with one wake-up of the timer task (`resume_all` arms one
    /// for every sleeping run).
    pub(crate) fn add_timers(
        &self,
        hooks: Weak<dyn Hooks>,
        clock: &Clock,
        timers: impl IntoIterator<Item = Timer>,
    ) {
        let mut any = false;
        self.timers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(timers.into_iter().inspect(|_| any = true));
        if !any {
            return;
        }
        if !self.timer_task.swap(true, Ordering::AcqRel) {
            let changed = Arc::clone(&self.timer_changed);
            self.spawn_task(timer_loop(hooks, changed, clock.clone()));
        }
        self.timer_changed.notify_one();
    }

    /// Starts, once, the task that renews the leases of the runs this runtime drives every
    /// third of the lease time `ttl`.
    pub(crate) fn start_renewer(&self, hooks: Weak<dyn Hooks>, ttl: Duration) {
        if !self.renewer.swap(true, Ordering::AcqRel) {
            let stop = self.stop.clone();
            self.spawn_task(renew_loop(hooks, ttl, stop));
        }
    }

    /// How many timers are armed.
    #[cfg(test)]
    pub(crate) fn armed_timers(&self) -> usize {
        self.timers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// How many background tasks are alive.
    #[cfg(test)]
    pub(crate) fn live_tasks(&self) -> usize {
        self.tasks.len()
    }

    pub(crate) async fn shutdown(&self) {
        self.shut_down.store(true, Ordering::Release);
        self.stop.cancel();
        self.timer_changed.notify_one();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Renews the leases of the runs being driven, every third of the lease time, until the
/// runtime is dropped or shut down. Holds the runtime only while it renews.
async fn renew_loop(
    runtime: Weak<dyn Hooks>,
    ttl: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    let every = (ttl / 3).max(Duration::from_millis(10));
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
        let Some(hooks) = runtime.upgrade() else {
            return;
        };
        if let Err(e) = hooks.renew().await {
            tracing::warn!(error = %e, "could not renew leases");
        }
    }
}

/// Starts drivers for parked runs whose time came by `clock`. Holds the runtime only while it
/// works, so that dropping the last runtime handle closes the store.
async fn timer_loop(runtime: Weak<dyn Hooks>, changed: Arc<Notify>, clock: Clock) {
    let Some(freed) = runtime.upgrade().map(|hooks| hooks.freed()) else {
        return;
    };
    loop {
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let place_freed = freed.notified();
        tokio::pin!(place_freed);
        place_freed.as_mut().enable();
        let (next, held_back) = {
            let Some(hooks) = runtime.upgrade() else {
                return;
            };
            let background = hooks.background();
            if background.shut_down.load(Ordering::Acquire) {
                return;
            }
            let now = clock.now_ms();
            // Under `max_active_runs`, as many as there are places; the other due timers stay
            // armed until a place frees.
            let allowed = hooks.wakes_allowed();
            let (due, next) = {
                let mut timers = background
                    .timers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let mut due = Vec::new();
                while due.len() < allowed
                    && let Some(first) = timers.first()
                    && first.0 <= now
                {
                    if let Some(entry) = timers.pop_first() {
                        due.push(entry);
                    }
                }
                (due, timers.first().map(|t| t.0))
            };
            for (_, workflow, run_id) in due {
                Arc::clone(&hooks).timer_due(&workflow, &run_id);
            }
            (next, next.is_some_and(|at_ms| at_ms <= now))
        };
        match next {
            // Due but held back by the limit: until a place frees (or a timer changes).
            Some(_) if held_back => {
                tokio::select! {
                    () = &mut place_freed => {}
                    () = &mut notified => {}
                }
            }
            Some(at_ms) => {
                tokio::select! {
                    () = clock.sleep_until_ms(at_ms) => {}
                    () = &mut notified => {}
                }
            }
            None => notified.await,
        }
    }
}
