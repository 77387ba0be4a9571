//! A runtime's life as a process's main loop: serving a store ([`Runtime::serve`]), and
//! stopping, cut short ([`Runtime::shutdown`]) or gently, each run let go at a state boundary
//! ([`Runtime::drain`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::handle::Runtime;
use crate::error::{Error, Result};
use crate::run::driver::FAULT_BACKOFF;

/// The least time a drain waits for the leases it gives back, past `grace` if need be.
const RELEASES: Duration = Duration::from_secs(1);

/// What [`Runtime::drain`] did with the runs it drove in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Drained {
    /// Runs let go at a state boundary: the state's transition was committed (or the run had
    /// no attempt begun), so the process or worker that takes the run up begins its next
    /// attempt without counting an interruption, and no recorded step runs again.
    pub handed_over: u64,
    /// Runs still in a state when the grace period ended: stopped as
    /// [`shutdown`](Runtime::shutdown) stops them, as a crash would (the attempt counts as
    /// interrupted where the run is taken up; the steps it recorded are not run again).
    pub cut: u64,
}

impl Runtime {
    /// Keeps driving the registered workflows' runs until [`shutdown`](Self::shutdown) or
    /// [`drain`](Self::drain):
    /// resumes them now ([`resume_all`](Self::resume_all)); then, with a store shared by
    /// several workers (one whose leases lapse), every `poll` (at most a third of the lease
    /// time) it claims the runs that need a driver: runs no worker holds, waiting runs whose
    /// event arrived or whose time came, and runs of a worker that died once its lease lapsed;
    /// a run that no live worker can route is blocked, once, by one of them (see
    /// [`Store::claim_ready`](crate::store::Store::claim_ready) and docs/postgres.md).
    /// With such a store, an event sent by a process that does not drive the run reaches it
    /// within `poll`, or at once if the store wakes its workers ([`Store::wakeups`](crate::store::Store::wakeups):
    /// PostgreSQL's `LISTEN`/`NOTIFY`). (The leases of the runs this runtime drives are renewed by a task of
    /// their own, every third of the lease time, whether `serve` runs or not.)
    /// With a store only this process opens, everything after the first resume is driven by
    /// events in this process, and `serve` just waits.
    ///
    /// A failed poll (a lost database connection, say) is logged and tried again at the next
    /// one. A store fault of the first resume ([`Error::Storage`](crate::Error::Storage),
    /// [`Error::Database`](crate::Error::Database)) is logged as a warning and the resume
    /// tried again after 100 ms, doubling up to 10 s, until it succeeds (or
    /// [`shutdown`](Self::shutdown)): a failed resume resumed nothing (see
    /// [`resume_all`](Self::resume_all)), so nothing is left half done.
    ///
    /// # Errors
    /// As [`resume_all`](Self::resume_all), for the first resume only, but for store faults.
    pub async fn serve(&self, poll: Duration) -> Result<()> {
        // A drain ends serving too: it claims no more runs.
        let stopped = self.inner.background.draining();
        let (mut delay, most) = FAULT_BACKOFF;
        loop {
            match self.resume_all().await {
                Ok(_) => break,
                Err(e @ (Error::Storage { .. } | Error::Database { .. })) => {
                    tracing::warn!(
                        error = %e,
                        retry_in_ms = crate::clock::duration_ms(delay),
                        "could not resume the unfinished runs; trying again"
                    );
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = stopped.cancelled() => return Ok(()),
                    }
                    delay = delay.saturating_mul(2).min(most);
                }
                Err(e) => return Err(e),
            }
        }
        self.start_retention();
        self.start_gauges();
        let Some(ttl) = self.store().lease_ttl() else {
            stopped.cancelled().await;
            return Ok(());
        };
        let every = poll.min(ttl / 3).max(Duration::from_millis(10));
        // The blocked runs are looked at again once, one lease time after the first resume:
        // a worker of a shared store that blocked a run of a schema this one routes (it saw
        // no live worker that routes it) committed that block within its lease, so by then
        // (docs/postgres.md, "Runs no live worker can route").
        // A lease too long to add to the present time is never over: no second look.
        let mut sweep_again = tokio::time::Instant::now().checked_add(ttl);
        // Another worker's write that makes a run ready wakes the claim at once
        // (`Store::wakeups`); the poll stays, for times that come and for a store whose
        // signal is down or gone.
        let mut wakeups = self.store().wakeups();
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                woken = woken(&mut wakeups) => {
                    if !woken {
                        tracing::debug!("the store's wake-ups ended; polling only");
                        wakeups = None;
                    }
                }
                () = stopped.cancelled() => return Ok(()),
            }
            if sweep_again.is_some_and(|at| tokio::time::Instant::now() >= at) {
                sweep_again = None;
                self.inner.sweep.store(true, Ordering::Release);
            }
            if let Err(e) = self.resume_all().await {
                tracing::warn!(error = %e, "could not claim runs");
            }
        }
    }

    /// Stops every background driver (their handlers' futures are dropped at their next
    /// await, as a crash would stop them; what they recorded stands) and the timer task.
    /// Runs stay as they are, to be resumed by the next [`resume_all`](Self::resume_all).
    pub async fn shutdown(&self) {
        self.inner.background.shutdown().await;
    }

    /// Stops this runtime for a deploy or a restart, gently: from now on it claims, wakes
    /// and resumes no run ([`serve`](Self::serve) returns; timers, events and
    /// [`resume_all`](Self::resume_all) leave runs for the next process or worker), and each
    /// run it drives in the background finishes the state it is in: when the state's
    /// transition is committed, its driver lets the run go (with its lease, so another
    /// worker of a shared store takes it up at its next poll) instead of entering the next
    /// state. A run that parks or ends meanwhile does so as usual. After `grace`, or as soon
    /// as every driver has stopped, the runtime is [shut down](Self::shutdown): a run still in
    /// its state then is cut as a crash would cut it.
    ///
    /// Without a drain, a deploy's shutdown cuts every running state: its steps recorded so
    /// far are replayed, the step in flight runs again, and the attempt counts as interrupted
    /// (against the retry policy's `max_interruptions`). A drain avoids all three for every
    /// state that ends within `grace`. Give it what the deploy allows (Kubernetes'
    /// `terminationGracePeriodSeconds`, less a margin).
    ///
    /// A run started with [`start`](Self::start) during the drain or after it is recorded as
    /// [`enqueue`](Self::enqueue) records it, for the next process or worker; runs the
    /// program awaits itself ([`run`](Self::run)) are its own to stop. Returns how many runs
    /// were let go and how many cut. Await it before the process exits: `serve` returns as
    /// the drain begins, and a process that exits then cuts the states still running (their
    /// steps in flight run again elsewhere); docs/postgres.md shows a worker's `main`. Calls that overlap share one drain: the first grace to
    /// end shuts the runtime down for all of them, and each run let go or cut is counted by
    /// one of them.
    pub async fn drain(&self, grace: Duration) -> Drained {
        let began = tokio::time::Instant::now();
        let (handed_over, cut) = self.inner.background.drain(grace).await;
        self.shutdown().await;
        // The leases of the runs let go (or cut) are given back in tasks of their own: waited
        // for, within what is left of `grace` but at least a second, so that a process that
        // exits after the drain leaves its runs free for another worker at once, not after
        // the lease time.
        let left = grace.saturating_sub(began.elapsed()).max(RELEASES);
        let _ = tokio::time::timeout(left, self.inner.claims.released()).await;
        Drained { handed_over, cut }
    }
}

/// Resolves when `wakeups` changes (`true`), or when its sender is gone (`false`); never
/// without a signal.
async fn woken(wakeups: &mut Option<crate::store::Wakeups>) -> bool {
    match wakeups {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}
