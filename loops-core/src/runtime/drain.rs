//! A drain: stopping a runtime the way a deploy should, letting each run go at a state
//! boundary rather than cutting its state short.

use std::time::Duration;

use super::handle::Runtime;

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
    /// A run started with [`start`](Self::start) during the drain is still driven (and let go
    /// at its first transition); runs the program awaits itself ([`run`](Self::run)) are its
    /// own to stop. Returns how many runs were let go and how many cut.
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
