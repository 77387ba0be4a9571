//! The runtime's named limits, live: counted in the process, or in a store shared by many
//! workers ([`SharedLimits`]); either way by [`Limit::admit`]'s rule.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::limit::{Admission, Limit};
use crate::store::{Lease, SharedLimits, Take};

/// First wait between two asks of a shared store while every place is held; it doubles up
/// to [`SHARED_POLL_MAX`]. A release by this process wakes its waiters at once.
const SHARED_POLL_MIN: Duration = Duration::from_millis(20);

/// Longest wait between two asks of a shared store while every place is held: a place that
/// another worker gives back is seen at most this late.
pub(crate) const SHARED_POLL_MAX: Duration = Duration::from_secs(1);

/// One limit, live.
#[derive(Debug)]
struct Gate {
    limit: Limit,
    /// The in-process count (unused when a shared store counts).
    counts: Mutex<Counts>,
    /// Told of every release by this process.
    released: Notify,
    /// The in-process clock's zero.
    epoch: Instant,
}

#[derive(Debug, Default)]
struct Counts {
    holding: u32,
    /// Start times (ms since `epoch`) that may still be in the rate window.
    starts: VecDeque<u64>,
}

impl Gate {
    fn now_ms(&self) -> u64 {
        crate::clock::duration_ms(self.epoch.elapsed())
    }

    /// Takes a place in the process if the rule lets one more in now.
    fn try_take_local(&self) -> Admission {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.now_ms();
        while counts
            .starts
            .front()
            .is_some_and(|t| !self.limit.counts(*t, now))
        {
            counts.starts.pop_front();
        }
        let admission = self
            .limit
            .admit(counts.holding, counts.starts.make_contiguous(), now);
        if admission == Admission::Enter {
            counts.holding = counts.holding.saturating_add(1);
            if self.limit.rate.is_some() {
                counts.starts.push_back(now);
            }
        }
        admission
    }
}

/// The limits of one runtime, by name.
#[derive(Debug, Default, Clone)]
pub(crate) struct Limits {
    gates: HashMap<String, Arc<Gate>>,
}

/// Where a taken place is counted.
#[derive(Debug)]
enum Held {
    Local,
    Shared {
        store: SharedHandle,
        name: String,
        permit: u64,
    },
}

/// A shared store's limits (a trait object, so `Debug` by hand).
#[derive(Clone)]
struct SharedHandle(Arc<dyn SharedLimits>);

impl std::fmt::Debug for SharedHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedLimits")
    }
}

/// A place of a limit, taken for one try: given back by [`Taken::release`], or when
/// dropped (a panic, a cancellation: then in a task of its own, best effort; a place of a
/// shared store that is not given back is freed when its run's lease ends).
#[derive(Debug)]
pub(crate) struct Taken {
    gate: Arc<Gate>,
    held: Option<Held>,
}

impl Taken {
    /// Gives the place back, and wakes this process's waiters for it.
    pub(crate) async fn release(mut self) {
        if let Some(held) = self.held.take() {
            give_back(&self.gate, held).await;
        }
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        match self.held.take() {
            None => {}
            Some(Held::Local) => release_local(&self.gate),
            Some(shared) => {
                if let Ok(handle) = tokio::runtime::Handle::try_current() {
                    let gate = Arc::clone(&self.gate);
                    handle.spawn(async move { give_back(&gate, shared).await });
                }
            }
        }
    }
}

fn release_local(gate: &Gate) {
    let mut counts = gate.counts.lock().unwrap_or_else(PoisonError::into_inner);
    counts.holding = counts.holding.saturating_sub(1);
    drop(counts);
    gate.released.notify_waiters();
}

async fn give_back(gate: &Gate, held: Held) {
    match held {
        Held::Local => release_local(gate),
        Held::Shared {
            store,
            name,
            permit,
        } => {
            if let Err(e) = store.0.release(&name, permit).await {
                tracing::warn!(limit = name.as_str(), permit, error = %e, "could not give a place of the limit back; it is freed when its run's lease ends");
            }
            gate.released.notify_waiters();
        }
    }
}

impl Limits {
    /// Declares (or replaces) the limit `name`.
    pub(crate) fn insert(&mut self, name: String, limit: Limit) {
        let gate = Gate {
            limit,
            counts: Mutex::default(),
            released: Notify::new(),
            epoch: Instant::now(),
        };
        self.gates.insert(name, Arc::new(gate));
    }

    /// Whether a limit of that name is declared.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.gates.contains_key(name)
    }

    /// Waits until the limit `name` lets one more try in, and takes a place; `None` if no
    /// limit of that name is declared. Counted in `shared` when the store has shared limits
    /// (for the step at `seq` of the run `lease` drives), else in the process. The wait
    /// holds no connection and nothing else; it is cancelled by dropping the future. Waiters
    /// are not served in order.
    ///
    /// Waiting on a shared store: until the rate window frees a place when the rate stops
    /// the try, else until this process releases a place or, at the latest, a back-off of
    /// 20 ms doubling to [`SHARED_POLL_MAX`] (a place freed by another worker is seen then).
    ///
    /// A cancellation of the run asked for in the store (by another process) cancels
    /// `cancel`, and the future never completes: the caller waits on `cancel` too.
    ///
    /// # Errors
    /// As [`SharedLimits::try_take`].
    pub(crate) async fn take(
        &self,
        name: &str,
        shared: Option<Arc<dyn SharedLimits>>,
        lease: &Lease,
        seq: u64,
        cancel: &CancellationToken,
    ) -> Result<Option<Taken>> {
        let Some(gate) = self.gates.get(name) else {
            return Ok(None);
        };
        let mut poll = SHARED_POLL_MIN;
        let mut waiting = false;
        loop {
            if waiting {
                tracing::trace!(limit = name, "asking for the limit again");
            }
            let released = gate.released.notified();
            tokio::pin!(released);
            // Registered before asking: a release after the ask still wakes this waiter.
            released.as_mut().enable();
            let wait = match &shared {
                None => match gate.try_take_local() {
                    Admission::Enter => {
                        return Ok(Some(Taken {
                            gate: Arc::clone(gate),
                            held: Some(Held::Local),
                        }));
                    }
                    Admission::Full { retry_at_ms } => retry_at_ms
                        .map(|at| Duration::from_millis(at.saturating_sub(gate.now_ms()))),
                },
                Some(store) => match store.try_take(name, &gate.limit, lease, seq).await? {
                    Take::Taken { permit } => {
                        return Ok(Some(Taken {
                            gate: Arc::clone(gate),
                            held: Some(Held::Shared {
                                store: SharedHandle(Arc::clone(store)),
                                name: name.to_owned(),
                                permit,
                            }),
                        }));
                    }
                    Take::Cancelled => {
                        // The caller stops waiting on the run's cancellation, which this
                        // tells the driver of.
                        cancel.cancel();
                        std::future::pending::<()>().await;
                        return Ok(None);
                    }
                    Take::Full { retry_in: Some(d) } => Some(d),
                    Take::Full { retry_in: None } => {
                        let wait = poll;
                        poll = poll.saturating_mul(2).min(SHARED_POLL_MAX);
                        Some(wait)
                    }
                },
            };
            if !waiting {
                waiting = true;
                tracing::debug!(
                    limit = name,
                    shared = shared.is_some(),
                    "step waits for the limit"
                );
            }
            match wait {
                None => released.await,
                Some(wait) => {
                    tokio::select! {
                        () = released => {}
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }
}
