//! The runtime's handle: [`Runtime`], what it shares between its clones, and the few
//! functions every part of the runtime goes through (the store, claims, background drivers).
//! The public operations are `impl Runtime` blocks in the files of this folder, each
//! importing this one, never the reverse.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use crate::error::{Error, Result};
use crate::retention::RetentionPolicy;
use crate::row::RunInfo;
use crate::run::driver::{Drive, Entered};
use crate::run::settings::Settings;
use crate::runtime::claims::{Claim, Claims};
use crate::runtime::scheduler::{Background, Hooks};
use crate::status::RunStatus;
use crate::store::precheck::SchemaCheck;
use crate::store::redb::RedbStore;
use crate::store::{BoxFuture, Lease, Store};
use crate::workflow::Workflow;

/// Drives workflow runs and keeps their records in a store.
///
/// Cheap to clone (an `Arc`): one runtime serves any number of concurrent runs. Drive one run
/// and await its end with [`run`](Self::run); or [`register`](Self::register) a handler for a
/// workflow and let the runtime drive its runs in the background ([`start`](Self::start),
/// [`resume_all`](Self::resume_all)), parking waiting runs so that they hold no task. The
/// store file is closed when the last clone is dropped.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

/// What the clones of one runtime share.
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: Config,
    /// The runs this runtime drives now.
    pub(crate) claims: Claims,
    /// The registered workflows' background drivers, by workflow name.
    drivers: RwLock<HashMap<String, Arc<dyn Driver>>>,
    pub(crate) background: Background,
}

/// The runtime's configuration, as its builder left it.
#[derive(Clone)]
pub(crate) struct Config {
    /// How each run is driven.
    pub(crate) settings: Settings,
    pub(crate) max_active_runs: Option<usize>,
    pub(crate) checks: Vec<SchemaCheck>,
    pub(crate) retention: RetentionPolicy,
    pub(crate) drivers: Vec<(&'static str, Arc<dyn Driver>)>,
}

impl Inner {
    /// How many runs this runtime drives now.
    #[cfg(test)]
    pub(crate) fn active_count(&self) -> usize {
        self.claims.count()
    }
}

/// How a background driver starts.
pub(crate) enum Start {
    /// The run is claimed and entered already (`Runtime::start`).
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

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("store", &self.inner.store.label())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// The runtime over `store`, with `config`.
    pub(crate) fn new(store: Arc<dyn Store>, config: Config) -> Runtime {
        let drivers = config
            .drivers
            .iter()
            .map(|(name, d)| ((*name).to_owned(), Arc::clone(d)))
            .collect();
        Runtime {
            inner: Arc::new(Inner {
                claims: Claims::new(Arc::clone(&store)),
                store,
                config,
                drivers: RwLock::new(drivers),
                background: Background::new(),
            }),
        }
    }

    /// The store this runtime keeps its records in.
    pub fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// The store, shared (for tasks that outlive a borrow of the runtime).
    pub(crate) fn store_arc(&self) -> Arc<dyn Store> {
        Arc::clone(&self.inner.store)
    }

    /// The embedded store, when this runtime keeps its records in redb.
    pub fn redb(&self) -> Option<&RedbStore> {
        self.inner.store.as_any().downcast_ref::<RedbStore>()
    }

    /// The driver of the run `claim` holds.
    pub(crate) fn drive<'a>(&'a self, claim: &'a Claim) -> Drive<'a> {
        Drive {
            store: &self.inner.store,
            settings: &self.inner.config.settings,
            held: claim.held(),
        }
    }

    /// Claims the run for a driver of this runtime: at most one per run in this process,
    /// and, through the store's lease, one in all workers sharing the store.
    pub(crate) async fn claim(&self, run_id: &str) -> Result<Claim> {
        self.claim_with(run_id, None).await
    }

    /// As [`claim`](Self::claim), with a lease the store granted already (`claim_ready`).
    pub(crate) async fn claim_with(&self, run_id: &str, lease: Option<Lease>) -> Result<Claim> {
        let claim = self.inner.claims.claim_with(run_id, lease).await?;
        if let Some(ttl) = self.inner.store.lease_ttl() {
            let hooks: std::sync::Weak<Inner> = Arc::downgrade(&self.inner);
            self.inner.background.start_renewer(hooks, ttl);
        }
        Ok(claim)
    }

    /// Registers `driver` for `workflow`'s runs (replacing one registered before).
    pub(crate) fn set_driver(&self, workflow: &'static str, driver: Arc<dyn Driver>) {
        self.inner
            .drivers
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(workflow.to_owned(), driver);
    }

    /// The background driver registered for `workflow`.
    ///
    /// # Errors
    /// [`Error::NotRegistered`](crate::Error::NotRegistered) if there is none.
    pub(crate) fn driver(&self, workflow: &str) -> Result<Arc<dyn Driver>> {
        self.inner
            .drivers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(workflow)
            .cloned()
            .ok_or_else(|| Error::NotRegistered {
                workflow: workflow.to_owned(),
            })
    }

    /// The registered workflows' names, sorted.
    pub(crate) fn workflows(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .inner
            .drivers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// Arms a timer that starts a driver for the run at `until` (ms since the Unix epoch).
    pub(crate) fn add_timer(&self, until: u64, workflow: &str, run_id: &str) {
        let hooks: std::sync::Weak<Inner> = Arc::downgrade(&self.inner);
        self.inner
            .background
            .add_timer(hooks, until, workflow, run_id);
    }

    /// Starts a background driver for the run unless one drives it already (in this process,
    /// or, through its lease, in another worker).
    pub(crate) fn spawn_driver(&self, workflow: &str, run_id: &str) {
        self.spawn_driver_with(workflow, run_id, None);
    }

    /// As [`spawn_driver`](Self::spawn_driver), with a lease the store granted already.
    pub(crate) fn spawn_driver_with(&self, workflow: &str, run_id: &str, lease: Option<Lease>) {
        let Ok(driver) = self.driver(workflow) else {
            return;
        };
        if self.inner.claims.is_active(run_id) {
            // Driven here already: a lease granted meanwhile goes back.
            if let Some(lease) = lease {
                self.inner.claims.release_later(lease);
            }
            return;
        }
        driver.spawn(
            self.clone(),
            Start::Find {
                run_id: run_id.to_owned(),
                lease,
            },
        );
    }

    /// Tells whoever drives the run that its wait may be over: the driver in this process,
    /// or a new background driver for a parked run of a registered workflow.
    pub(crate) fn wake(&self, info: &RunInfo) {
        match self.inner.claims.signals(&info.run_id) {
            Some(signals) => signals.wake.notify_one(),
            None if info.status == RunStatus::Waiting => {
                self.spawn_driver(&info.workflow, &info.run_id);
            }
            None => {}
        }
    }
}

impl Hooks for Inner {
    fn background(&self) -> &Background {
        &self.background
    }

    fn timer_due(self: Arc<Self>, workflow: &str, run_id: &str) {
        Runtime { inner: self }.spawn_driver(workflow, run_id);
    }

    fn renew(self: Arc<Self>) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move { self.claims.renew().await })
    }
}

/// Refuses a run of another workflow than `W`.
///
/// # Errors
/// [`Error::WorkflowMismatch`](crate::Error::WorkflowMismatch).
pub(crate) fn check_workflow<W: Workflow>(info: &RunInfo) -> Result<()> {
    if info.workflow != W::NAME {
        return Err(Error::WorkflowMismatch {
            run_id: info.run_id.clone(),
            stored: info.workflow.clone(),
            requested: W::NAME,
        });
    }
    Ok(())
}
