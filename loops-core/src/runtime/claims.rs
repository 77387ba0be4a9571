//! Claims: which runs this runtime drives, at most one driver per run in this process, each
//! with the store's lease that fences its writes against other workers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures_util::FutureExt;
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;

use crate::error::{Error, Holder, Result};
use crate::run::settings::{Held, Signals};
use crate::store::{Lease, Store};

/// The runs being driven, by run id, with the signals their drivers listen to.
type Active = Arc<Mutex<HashMap<String, Signals>>>;

/// The runs this runtime drives now.
pub(crate) struct Claims {
    store: Arc<dyn Store>,
    active: Active,
    /// When the leases `claim_ready` granted were asked for, by run id, until their claims
    /// take them ([`Claims::asked_at`]).
    asked: Mutex<HashMap<String, Instant>>,
    /// Runs woken by their timer whose drivers have not claimed them yet ([`Waking`]).
    waking: Arc<AtomicUsize>,
    /// Notified when a claim ends, or a woken run's driver stops before claiming it: a place
    /// under `max_active_runs` may be free (the timer loop waits on it).
    freed: Arc<Notify>,
    /// The tasks giving leases back, which a drain waits for ([`Claims::released`]).
    releasing: TaskTracker,
}

/// A run woken by its timer, counted against `max_active_runs` from the wake until its
/// driver's claim counts instead (or the driver stops without one): dropped then.
pub(crate) struct Waking {
    waking: Arc<AtomicUsize>,
    freed: Arc<Notify>,
}

impl Drop for Waking {
    fn drop(&mut self) {
        self.waking.fetch_sub(1, Ordering::AcqRel);
        self.freed.notify_one();
    }
}

/// The right to drive one run: at most one per run id per runtime. Removed from the active
/// set when dropped, however the driver stops.
pub(crate) struct Claim {
    store: Arc<dyn Store>,
    active: Active,
    freed: Arc<Notify>,
    releasing: TaskTracker,
    held: Held,
}

impl Claim {
    /// The run held, its signals and its lease.
    pub(crate) fn held(&self) -> &Held {
        &self.held
    }

    /// The run held.
    pub(crate) fn run_id(&self) -> &str {
        &self.held.run_id
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.held.run_id);
        self.freed.notify_one();
        // Leases are given back, so that another worker (or runtime) may take the run at once.
        release_later(&self.store, &self.releasing, self.held.lease.clone());
    }
}

impl Claims {
    /// No run claimed yet, on `store`.
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Claims {
            store,
            active: Arc::new(Mutex::new(HashMap::new())),
            asked: Mutex::new(HashMap::new()),
            waking: Arc::new(AtomicUsize::new(0)),
            freed: Arc::new(Notify::new()),
            releasing: TaskTracker::new(),
        }
    }

    /// Resolves once every lease given back so far is released in the store (a drain waits
    /// for it, so that another worker can take its runs at once).
    pub(crate) async fn released(&self) {
        self.releasing.close();
        self.releasing.wait().await;
        self.releasing.reopen();
    }

    /// Counts a run woken by its timer until the returned [`Waking`] is dropped.
    pub(crate) fn waking(&self) -> Waking {
        self.waking.fetch_add(1, Ordering::AcqRel);
        Waking {
            waking: Arc::clone(&self.waking),
            freed: Arc::clone(&self.freed),
        }
    }

    /// How many runs count against `max_active_runs`: those driven here, and those woken by
    /// their timer whose drivers have not claimed them yet. (A driver that has just claimed
    /// its run and not yet dropped its [`Waking`] counts twice for that moment: never less
    /// than the truth.)
    pub(crate) fn driven_or_waking(&self) -> usize {
        // The waking count first: a driver's claim is added before its Waking goes.
        let waking = self.waking.load(Ordering::Acquire);
        self.count().saturating_add(waking)
    }

    /// Notified when a place under `max_active_runs` may have freed.
    pub(crate) fn freed(&self) -> Arc<Notify> {
        Arc::clone(&self.freed)
    }

    /// Notes that the lease of `run_id` that a claim will be given was asked for at `asked`
    /// (before the `claim_ready` that granted it), for its deadline.
    pub(crate) fn asked_at(&self, run_id: &str, asked: Instant) {
        self.asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(run_id.to_owned(), asked);
    }

    /// Sets the deadline of `signals`' lease, asked for at `asked`, if leases lapse.
    fn set_deadline(&self, signals: &Signals, asked: Instant) {
        if let Some(ttl) = self.store.lease_ttl() {
            *signals
                .deadline
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = asked.checked_add(ttl);
        }
    }

    /// The signals of the run's driver in this runtime, if it is driven here.
    pub(crate) fn signals(&self, run_id: &str) -> Option<Signals> {
        self.lock().get(run_id).cloned()
    }

    /// Whether a driver of this runtime holds the run.
    pub(crate) fn is_active(&self, run_id: &str) -> bool {
        self.lock().contains_key(run_id)
    }

    /// How many runs this runtime drives.
    pub(crate) fn count(&self) -> usize {
        self.lock().len()
    }

    /// Whether a driver of this runtime holds `run_id` now.
    pub(crate) fn holds(&self, run_id: &str) -> bool {
        self.lock().contains_key(run_id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Signals>> {
        self.active.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims the run, with a lease the store granted already (`claim_ready`) or one taken
    /// now.
    ///
    /// # Errors
    /// [`Error::RunActive`](crate::Error::RunActive) if a driver here holds the run, or another worker holds its
    /// lease; the store's error if the lease cannot be taken.
    pub(crate) async fn claim_with(&self, run_id: &str, lease: Option<Lease>) -> Result<Claim> {
        let signals = {
            let mut active = self.lock();
            if active.contains_key(run_id) {
                if let Some(lease) = lease {
                    // Granted by `claim_ready` while a driver here still held the run (its own
                    // lease lapsed): give it back, so that the run is free once that driver
                    // stops.
                    self.release_later(lease);
                }
                return Err(Error::RunActive {
                    run_id: run_id.to_owned(),
                    holder: Holder::ThisRuntime,
                });
            }
            let signals = Signals::new();
            active.insert(run_id.to_owned(), signals.clone());
            signals
        };
        // From here the claim exists: dropping it (on any error below) frees the run again.
        let mut claim = Claim {
            store: Arc::clone(&self.store),
            active: Arc::clone(&self.active),
            freed: Arc::clone(&self.freed),
            releasing: self.releasing.clone(),
            held: Held {
                run_id: run_id.to_owned(),
                signals,
                lease: Lease {
                    run_id: run_id.to_owned(),
                    token: 0,
                    expires_ms: None,
                },
            },
        };
        let noted = self
            .asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(run_id);
        let asked = noted.unwrap_or_else(Instant::now);
        claim.held.lease = match lease {
            Some(lease) => lease,
            None => self
                .store
                .acquire(run_id)
                .await?
                .ok_or_else(|| Error::RunActive {
                    run_id: run_id.to_owned(),
                    holder: Holder::Lease {
                        ttl_ms: self.store.lease_ttl().map(crate::clock::duration_ms),
                    },
                })?,
        };
        self.set_deadline(&claim.held.signals, asked);
        *claim
            .held
            .signals
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(claim.held.lease.clone());
        Ok(claim)
    }

    /// Gives `lease` back in a task of its own, when the store's leases lapse.
    pub(crate) fn release_later(&self, lease: Lease) {
        release_later(&self.store, &self.releasing, lease);
    }

    /// Renews the leases of the runs this runtime drives; a driver whose lease was lost is
    /// told to stop (its writes would be refused anyway: every write is fenced).
    ///
    /// # Errors
    /// The store's error if the renewal could not be made.
    pub(crate) async fn renew(&self) -> Result<()> {
        let held: Vec<(Signals, Lease)> = self
            .lock()
            .values()
            .filter_map(|s| {
                let lease = s
                    .lease
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                lease.map(|l| (s.clone(), l))
            })
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        let leases: Vec<Lease> = held.iter().map(|(_, l)| l.clone()).collect();
        let asked = Instant::now();
        let renewed = self.store.renew(&leases).await?;
        for (signals, lease) in held {
            match renewed
                .iter()
                .find(|r| r.run_id == lease.run_id && r.token == lease.token)
            {
                Some(new) => {
                    *signals.lease.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(new.clone());
                    self.set_deadline(&signals, asked);
                }
                None => {
                    tracing::warn!(run_id = %lease.run_id, "lease lost; stopping its driver");
                    signals.lost.cancel();
                }
            }
        }
        Ok(())
    }
}

/// Gives `lease` back to `store`: at once if the store's leases never lapse (the redb
/// store keeps them in memory, and its release is ready at once), else in a task of its own.
fn release_later(store: &Arc<dyn Store>, releasing: &TaskTracker, lease: Lease) {
    if store.lease_ttl().is_none() {
        match store.release(&lease).now_or_never() {
            Some(Ok(())) => return,
            Some(Err(e)) => {
                tracing::warn!(run_id = %lease.run_id, error = %e, "could not release a lease");
                return;
            }
            // Not ready at once: given back in a task, as for a store whose leases lapse.
            None => {}
        }
    }
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        let store = Arc::clone(store);
        releasing.spawn_on(
            async move {
                if let Err(e) = store.release(&lease).await {
                    tracing::warn!(run_id = %lease.run_id, error = %e, "could not release a lease");
                }
            },
            &handle,
        );
    }
}
