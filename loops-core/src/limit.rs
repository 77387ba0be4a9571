//! Named limits shared by every run of a runtime: at most so many steps inside at once, and
//! at most so many starts per period ("model: 4 at once, 60 per minute"). A step names its
//! limit ([`StepOptions::with_limit`](crate::StepOptions::with_limit)) and takes it before
//! each try, releasing it when the try ends.
//!
//! In-process: the limits of one runtime are shared by its runs, not by the workers of a
//! PostgreSQL store (each worker process counts its own).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A limit's shape: see [`RuntimeBuilder::limit`](crate::RuntimeBuilder::limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limit {
    /// At most this many tries inside the limit at once (none: no bound).
    pub concurrent: Option<u32>,
    /// At most `n` tries started per `period` (none: no bound).
    pub rate: Option<(u32, Duration)>,
}

impl Limit {
    /// At most `n` tries inside the limit at once (`n` at least 1).
    pub fn concurrent(n: u32) -> Self {
        Limit {
            concurrent: Some(n.max(1)),
            rate: None,
        }
    }

    /// At most `n` tries started per `period` (`n` at least 1), counted over a sliding
    /// window.
    pub fn rate(n: u32, period: Duration) -> Self {
        Limit {
            concurrent: None,
            rate: Some((n.max(1), period)),
        }
    }

    /// This limit with at most `n` tries started per `period` as well.
    pub fn with_rate(self, n: u32, period: Duration) -> Self {
        Limit {
            rate: Some((n.max(1), period)),
            ..self
        }
    }
}

/// One limit, live: its semaphore and the start times of its window.
#[derive(Debug)]
struct Gate {
    slots: Option<Arc<Semaphore>>,
    rate: Option<(u32, Duration)>,
    starts: Mutex<VecDeque<Instant>>,
}

/// The limits of one runtime, by name.
#[derive(Debug, Default, Clone)]
pub(crate) struct Limits {
    gates: HashMap<String, Arc<Gate>>,
}

/// A limit taken: released when dropped.
#[derive(Debug)]
pub(crate) struct Taken {
    _slot: Option<OwnedSemaphorePermit>,
}

impl Limits {
    /// Declares (or replaces) the limit `name`.
    pub(crate) fn insert(&mut self, name: String, limit: Limit) {
        let slots = limit
            .concurrent
            .map(|n| Arc::new(Semaphore::new(usize::try_from(n).unwrap_or(usize::MAX))));
        let gate = Gate {
            slots,
            rate: limit.rate,
            starts: Mutex::new(VecDeque::new()),
        };
        self.gates.insert(name, Arc::new(gate));
    }

    /// Whether a limit of that name is declared.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.gates.contains_key(name)
    }

    /// Waits until the limit `name` lets one more try in, and takes it; `None` if no limit
    /// of that name is declared. The wait holds nothing but its place in the queue, and is
    /// cancelled by dropping the future.
    pub(crate) async fn take(&self, name: &str) -> Option<Taken> {
        let gate = self.gates.get(name)?;
        let slot = match &gate.slots {
            // The semaphore is never closed, so `acquire_owned` cannot fail.
            Some(slots) => Arc::clone(slots).acquire_owned().await.ok(),
            None => None,
        };
        if let Some((n, period)) = gate.rate {
            loop {
                let wait = {
                    let mut starts = gate.starts.lock().unwrap_or_else(PoisonError::into_inner);
                    let now = Instant::now();
                    while starts
                        .front()
                        .is_some_and(|t| now.saturating_duration_since(*t) >= period)
                    {
                        starts.pop_front();
                    }
                    if starts.len() < usize::try_from(n).unwrap_or(usize::MAX) {
                        starts.push_back(now);
                        None
                    } else {
                        starts.front().map(|oldest| {
                            period.saturating_sub(now.saturating_duration_since(*oldest))
                        })
                    }
                };
                match wait {
                    None => break,
                    Some(wait) => tokio::time::sleep(wait).await,
                }
            }
        }
        Some(Taken { _slot: slot })
    }
}
