//! Background driving: registered handlers, the tasks that drive runs, and the timers of
//! parked runs.
//!
//! A registered workflow's run is driven by a task that ends when the run ends or parks. A
//! parked run holds no task: only an entry here if it waits for a time (one `BTreeSet` entry,
//! served by one timer task for the whole runtime), or nothing at all if it waits for an
//! event ([`Runtime::send`] starts its driver).

use std::collections::{BTreeSet, HashMap};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::driver::{Driven, Entered, Mode};
use crate::error::{Error, Result};
use crate::record::now_ms;
use crate::runtime::{Claim, Inner, Runtime};
use crate::store::Lease;
use crate::workflow::Dispatch;

/// How a background driver starts.
pub(crate) enum Start {
    /// The run is claimed and entered already ([`Runtime::start`]).
    Claimed(Box<(Claim, Entered)>),
    /// Claim the run (with this lease, if the store granted one), enter it, drive it.
    Find {
        run_id: String,
        lease: Option<Lease>,
    },
}

/// Drives runs of one registered workflow in background tasks.
pub(crate) trait Driver: Send + Sync {
    /// Spawns a task that drives the run.
    fn spawn(&self, runtime: Runtime, start: Start);
}

/// A workflow's registered handler.
pub(crate) struct Registered<W, H> {
    handler: Arc<H>,
    _workflow: PhantomData<fn() -> W>,
}

impl<W, H> Registered<W, H> {
    pub(crate) fn new(handler: H) -> Self {
        Registered {
            handler: Arc::new(handler),
            _workflow: PhantomData,
        }
    }
}

impl<W, H> Driver for Registered<W, H>
where
    W: Dispatch<H>,
    H: Send + Sync + 'static,
{
    fn spawn(&self, runtime: Runtime, start: Start) {
        let handler = Arc::clone(&self.handler);
        let rt = runtime.clone();
        let task = async move {
            let (claim, entered) = match start {
                Start::Claimed(claimed) => {
                    let (claim, entered) = *claimed;
                    (claim, Some(entered))
                }
                Start::Find { run_id, lease } => match rt.claim_with(&run_id, lease).await {
                    Ok(claim) => (claim, None),
                    // Driven already, here or by another worker: it will see the news.
                    Err(Error::RunActive { .. }) => return,
                    Err(e) => {
                        tracing::warn!(run_id, error = %e, "cannot claim the run");
                        return;
                    }
                },
            };
            let run_id = claim.run_id().to_owned();
            let span = tracing::info_span!("run", run_id = %run_id, workflow = W::NAME);
            let result = async {
                let entered = match entered {
                    Some(entered) => entered,
                    None => rt.enter::<W>(&claim, None).await?,
                };
                rt.drive_loop::<W, H>(&claim, entered, &*handler, Mode::Background)
                    .await
            }
            .instrument(span)
            .await;
            drop(claim);
            let hand_off = match result {
                Ok(Driven::Parked(info)) => {
                    if let Some(until) = info.wait.as_ref().and_then(|w| w.until_ms) {
                        rt.inner.background.add_timer(&rt, until, W::NAME, &run_id);
                    }
                    true
                }
                Ok(Driven::Ended(_)) => true,
                Err(e @ (Error::RunFailed { .. } | Error::RunCancelled { .. })) => {
                    tracing::info!(run_id, error = %e, "run ended");
                    true
                }
                Err(e) => {
                    // A storage error, say: try again in a second rather than at once.
                    tracing::error!(run_id, error = %e, "background driver stopped; retrying in 1 s");
                    rt.inner
                        .background
                        .add_timer(&rt, now_ms() + 1000, W::NAME, &run_id);
                    false
                }
            };
            // Whatever reached the run while this driver still held it (an event, a
            // cancellation, a retry of the failed run) found it driven and only signalled the
            // driver, which was stopping. Look again now that the run is free.
            if hand_off && needs_driver(&rt, &run_id).await {
                rt.spawn_driver(W::NAME, &run_id);
            }
            rt.inner.background.notify_ended();
        };
        runtime.inner.background.spawn_task(task);
    }
}

/// Whether a run that no driver holds should be driven: it is running, or waiting with its
/// wait over, or its cancellation was asked for and it has not ended.
async fn needs_driver(rt: &Runtime, run_id: &str) -> bool {
    let Ok(Some(info)) = rt.store().run_info(run_id).await else {
        return false;
    };
    rt.is_ready(&info).await.unwrap_or(false)
}

/// The runtime's background machinery.
pub(crate) struct Background {
    drivers: RwLock<HashMap<String, Arc<dyn Driver>>>,
    /// The live background tasks (a finished task is freed at once).
    tasks: TaskTracker,
    /// Parked runs waiting for a time: (wake-up ms, workflow, run id).
    timers: Mutex<BTreeSet<(u64, String, String)>>,
    timer_changed: Arc<Notify>,
    timer_task: AtomicBool,
    /// Whether the task that renews leases (stores shared by several workers) was started.
    renewer: AtomicBool,
    ended: Notify,
    shut_down: AtomicBool,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for Background {
    fn drop(&mut self) {
        // Lets the timer task see that the runtime is gone.
        self.timer_changed.notify_one();
    }
}

impl Background {
    pub(crate) fn new(drivers: impl Iterator<Item = (&'static str, Arc<dyn Driver>)>) -> Self {
        Background {
            drivers: RwLock::new(drivers.map(|(name, d)| (name.to_owned(), d)).collect()),
            tasks: TaskTracker::new(),
            timers: Mutex::new(BTreeSet::new()),
            timer_changed: Arc::new(Notify::new()),
            timer_task: AtomicBool::new(false),
            renewer: AtomicBool::new(false),
            ended: Notify::new(),
            shut_down: AtomicBool::new(false),
            stop: tokio_util::sync::CancellationToken::new(),
        }
    }

    pub(crate) fn register(&self, workflow: &'static str, driver: Arc<dyn Driver>) {
        self.drivers
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(workflow.to_owned(), driver);
    }

    pub(crate) fn driver(&self, workflow: &str) -> Result<Arc<dyn Driver>> {
        self.drivers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(workflow)
            .cloned()
            .ok_or_else(|| Error::NotRegistered {
                workflow: workflow.to_owned(),
            })
    }

    pub(crate) fn workflows(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .drivers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// Resolves at the next end of a run (used with `enable` before a status check).
    pub(crate) fn ended(&self) -> tokio::sync::futures::Notified<'_> {
        self.ended.notified()
    }

    pub(crate) fn notify_ended(&self) {
        self.ended.notify_waiters();
    }

    fn spawn_task(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
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

    /// Arms a timer that starts a driver for the run at `until` (ms since the Unix epoch).
    pub(crate) fn add_timer(&self, runtime: &Runtime, until: u64, workflow: &str, run_id: &str) {
        self.timers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((until, workflow.to_owned(), run_id.to_owned()));
        if !self.timer_task.swap(true, Ordering::AcqRel) {
            let weak = Arc::downgrade(&runtime.inner);
            let changed = Arc::clone(&self.timer_changed);
            self.spawn_task(timer_loop(weak, changed));
        }
        self.timer_changed.notify_one();
    }

    /// Starts, once, the task that renews the leases of the runs this runtime drives every
    /// third of the lease time `ttl`.
    pub(crate) fn start_renewer(&self, runtime: &Runtime, ttl: Duration) {
        if !self.renewer.swap(true, Ordering::AcqRel) {
            let weak = Arc::downgrade(&runtime.inner);
            let stop = self.stop.clone();
            self.spawn_task(renew_loop(weak, ttl, stop));
        }
    }

    /// How many background tasks are alive.
    #[cfg(test)]
    pub(crate) fn live_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Cancelled by [`shutdown`](Self::shutdown).
    pub(crate) fn stopped(&self) -> tokio_util::sync::CancellationToken {
        self.stop.clone()
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
    runtime: Weak<Inner>,
    ttl: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    let every = (ttl / 3).max(Duration::from_millis(10));
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
        let Some(inner) = runtime.upgrade() else {
            return;
        };
        let rt = Runtime { inner };
        if let Err(e) = rt.renew_leases().await {
            tracing::warn!(error = %e, "could not renew leases");
        }
    }
}

/// Starts drivers for parked runs whose time came. Holds the runtime only while it works, so
/// that dropping the last [`Runtime`] closes the store.
async fn timer_loop(runtime: Weak<Inner>, changed: Arc<Notify>) {
    loop {
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let next = {
            let Some(inner) = runtime.upgrade() else {
                return;
            };
            let rt = Runtime { inner };
            let background = &rt.inner.background;
            if background.shut_down.load(Ordering::Acquire) {
                return;
            }
            let now = now_ms();
            let due: Vec<(u64, String, String)> = {
                let mut timers = background
                    .timers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let mut due = Vec::new();
                while let Some(first) = timers.first() {
                    if first.0 > now {
                        break;
                    }
                    if let Some(entry) = timers.pop_first() {
                        due.push(entry);
                    }
                }
                due
            };
            for (_, workflow, run_id) in due {
                rt.spawn_driver(&workflow, &run_id);
            }
            background
                .timers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .first()
                .map(|t| t.0.saturating_sub(now))
        };
        match next {
            Some(ms) => {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    () = &mut notified => {}
                }
            }
            None => notified.await,
        }
    }
}
