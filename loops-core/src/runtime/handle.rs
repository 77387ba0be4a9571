//! The runtime's handle: [`Runtime`], what it shares between its clones, and the few
//! functions every part of the runtime goes through (the store, claims, background drivers).
//! The public operations are `impl Runtime` blocks in the files of this folder, each
//! importing this one, never the reverse.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::migrate::Migration;
use crate::retention::RetentionPolicy;
use crate::route::KnownVersion;
use crate::row::RunInfo;
use crate::run::driver::{Drive, Entered};
use crate::run::settings::Settings;
use crate::runtime::claims::{Claim, Claims, Waking};
use crate::runtime::scheduler::{Background, Timer};
use crate::schema::SchemaHash;
use crate::store::precheck::SchemaCheck;
use crate::store::redb::RedbStore;
use crate::store::sealing::Payloads;
use crate::store::{BoxFuture, ClaimFilter, Lease, Store};
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
    /// The store beneath the codec (`store` itself without one): payloads as stored.
    #[cfg_attr(not(feature = "control"), allow(dead_code))]
    stored: Arc<dyn Store>,
    /// The codec's payloads, as `store` seals and opens them: to open a payload that
    /// arrives sealed before it is checked.
    pub(crate) payloads: Payloads,
    pub(crate) config: Config,
    /// The runs this runtime drives now.
    pub(crate) claims: Claims,
    /// The registered versions of each workflow, and the migrations.
    pub(crate) registry: RwLock<Registry>,
    pub(crate) background: Background,
    /// Whether blocked runs are to be looked at again (at the first `resume_all`, and after
    /// a version or a migration is registered).
    pub(crate) sweep: AtomicBool,
    /// Whether `resume_all` ran once (a registration then looks at blocked runs at once).
    pub(crate) started: AtomicBool,
    /// Whether the retention task was started (by the first `serve`).
    pub(crate) retaining: AtomicBool,
    /// Whether the task refreshing the gauges of runs was started (by the first `serve`).
    pub(crate) gauging: AtomicBool,
    /// The workflows the gauges of runs were set for, so that one gone is set to 0.
    pub(crate) gauged: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// The loops of the schedules this runtime registered, by name: what stops each one.
    pub(crate) schedules: std::sync::Mutex<BTreeMap<String, tokio_util::sync::CancellationToken>>,
    /// The child runs this process has given a driver (`Kin`), until they end: a parent's
    /// join looks after each unfinished child once per process, not at every wake-up.
    pub(crate) children: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The runs waiting for their children whose children this process looked after.
    pub(crate) parents: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The registered versions (by schema hash) whose claims to accept older schemas were
    /// checked against the store (`accepts`).
    pub(crate) accepts_checked: std::sync::Mutex<std::collections::HashSet<SchemaHash>>,
}

/// The runtime's configuration, as its builder left it.
#[derive(Clone)]
pub(crate) struct Config {
    /// How each run is driven.
    pub(crate) settings: Settings,
    pub(crate) max_active_runs: Option<usize>,
    /// The versions declared with `RuntimeBuilder::workflow` (and `register`): checked
    /// at open with strict schemas, and for their claims to accept older schemas.
    pub(crate) checks: Vec<SchemaCheck>,
    pub(crate) retention: RetentionPolicy,
    /// How often `serve` applies `retention`.
    pub(crate) retention_interval: Duration,
    /// How often `serve` refreshes the gauges of runs (`None`: it does not).
    pub(crate) metrics_interval: Option<Duration>,
    /// The Prometheus recorder's handle the control endpoint renders at `GET /metrics`.
    #[cfg(feature = "prometheus")]
    pub(crate) prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Whether `open` refuses a store holding unfinished runs of another schema.
    pub(crate) strict_schemas: bool,
    pub(crate) registry: Registry,
}

/// One registered version of a workflow: what routing needs of it, and its handler.
#[derive(Clone)]
pub(crate) struct Version {
    pub(crate) known: KnownVersion,
    pub(crate) driver: Arc<dyn Driver>,
}

/// A version's [`Workflow::read_event`](crate::Workflow::read_event).
pub(crate) type EventReader = fn(&str, &str) -> Option<Result<(), String>>;

/// The registered versions of every workflow (by name, each version once by schema hash)
/// and the registered migrations.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    workflows: BTreeMap<String, Vec<Version>>,
    migrations: Vec<Migration>,
    /// The event readers of the versions this runtime knows as types, registered or driven by
    /// [`Runtime::run`] (which registers no handler), by the stored schema hashes they drive:
    /// their own, and those they accept.
    readers: BTreeMap<SchemaHash, EventReader>,
    /// How many registrations changed it: a driver that routed a run before a registration
    /// looks at its blocked run again after (see `Runtime::after_background`).
    generation: u64,
}

impl Registry {
    /// Adds `version`, the version `W` of its workflow, replacing the one registered with the
    /// same hash, and keeps `W`'s event reader ([`add_reader`](Self::add_reader)).
    pub(crate) fn add_version<W: crate::Workflow>(&mut self, version: Version) {
        self.add_reader(&version.known, W::read_event);
        let versions = self.workflows.entry(W::NAME.to_owned()).or_default();
        let hash = version.known.stored.hash;
        match versions.iter_mut().find(|v| v.known.stored.hash == hash) {
            Some(v) => *v = version,
            None => versions.push(version),
        }
        self.generation += 1;
    }

    /// Adds `migration`, replacing one registered between the same two schemas.
    pub(crate) fn add_migration(&mut self, migration: Migration) {
        let same = |m: &Migration| {
            m.workflow() == migration.workflow()
                && m.from().hash == migration.from().hash
                && m.to().hash == migration.to().hash
        };
        match self.migrations.iter_mut().find(|m| same(m)) {
            Some(m) => *m = migration,
            None => self.migrations.push(migration),
        }
        self.generation += 1;
    }

    /// How many registrations (versions and migrations) changed the registry: unchanged
    /// between two reads, nothing was registered between them.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The registered versions of `workflow`.
    pub(crate) fn known(&self, workflow: &str) -> Vec<KnownVersion> {
        self.workflows
            .get(workflow)
            .map(|vs| vs.iter().map(|v| v.known).collect())
            .unwrap_or_default()
    }

    /// The registered migrations.
    pub(crate) fn migrations(&self) -> &[Migration] {
        &self.migrations
    }

    /// The handler of the version of `workflow` with schema `hash`.
    pub(crate) fn driver(&self, workflow: &str, hash: SchemaHash) -> Option<Arc<dyn Driver>> {
        self.workflows
            .get(workflow)?
            .iter()
            .find(|v| v.known.stored.hash == hash)
            .map(|v| Arc::clone(&v.driver))
    }

    /// Keeps `reader`, the event reader of the version `known`, for the schemas it drives:
    /// its own (replacing one kept), and those it accepts (unless another version's own).
    pub(crate) fn add_reader(&mut self, known: &KnownVersion, reader: EventReader) {
        self.readers.insert(known.stored.hash, reader);
        for &hash in known.accepts {
            self.readers.entry(hash).or_insert(reader);
        }
    }

    /// Whether an event reader is kept for the schema `hash`.
    pub(crate) fn has_reader(&self, hash: SchemaHash) -> bool {
        self.readers.contains_key(&hash)
    }

    /// Reads the payload of the event `event` sent to a run stored with schema `hash`, as the
    /// version this runtime knows for that schema declares it
    /// ([`Workflow::read_event`](crate::Workflow::read_event)). `None` if no version known
    /// here drives the schema as it is (a run to migrate first, or of a version this build
    /// does not compile), or it declares no such event.
    pub(crate) fn read_event(
        &self,
        hash: SchemaHash,
        event: &str,
        payload: &str,
    ) -> Option<Result<(), String>> {
        (self.readers.get(&hash)?)(event, payload)
    }

    /// The registered workflows' names, sorted.
    pub(crate) fn names(&self) -> Vec<String> {
        self.workflows.keys().cloned().collect()
    }

    /// Every registered version, with its workflow's name.
    pub(crate) fn versions(&self) -> impl Iterator<Item = (&str, &KnownVersion)> {
        self.workflows
            .iter()
            .flat_map(|(name, vs)| vs.iter().map(move |v| (name.as_str(), &v.known)))
    }

    /// For each registered workflow, the schemas this build can route: its versions' own,
    /// those they accept, and those a chain of migrations takes to one of them.
    pub(crate) fn claim_filters(&self) -> Vec<ClaimFilter> {
        self.workflows
            .iter()
            .map(|(name, versions)| {
                let compiled = |h: SchemaHash| versions.iter().any(|v| v.known.stored.hash == h);
                let mut schemas: Vec<SchemaHash> = versions
                    .iter()
                    .flat_map(|v| {
                        std::iter::once(v.known.stored.hash).chain(v.known.accepts.iter().copied())
                    })
                    .collect();
                for m in self.migrations.iter().filter(|m| m.workflow() == name) {
                    let from = m.from().hash;
                    if Migration::path(&self.migrations, name, from, compiled).is_some() {
                        schemas.push(from);
                    }
                }
                schemas.sort();
                schemas.dedup();
                ClaimFilter {
                    workflow: name.clone(),
                    schemas: Some(schemas),
                }
            })
            .collect()
    }
}

impl Inner {
    /// How many runs this runtime drives now.
    #[cfg(test)]
    pub(crate) fn active_count(&self) -> usize {
        self.claims.count()
    }
}

/// A run claimed and ready to be driven by one version: found and routed, or created.
pub(crate) struct Prepared {
    /// The run as entered.
    pub(crate) entered: Entered,
    /// The schema hash of the version that drives it.
    pub(crate) version: SchemaHash,
    /// The run's schema, when that version accepts it rather than has it.
    pub(crate) accepted: Option<SchemaHash>,
}

/// How a background driver starts.
pub(crate) enum Start {
    /// The run is claimed and prepared already (`Runtime::start`).
    Claimed(Box<(Claim, Prepared)>),
    /// Claim the run (with this lease, if the store granted one), enter it, drive it. A run
    /// woken by its timer counts against `max_active_runs` with `waking` until it is claimed.
    Find {
        run_id: String,
        lease: Option<Lease>,
        waking: Option<Waking>,
    },
}

/// Where a background driver stopped.
pub(crate) enum Stopped {
    /// The run is waiting and holds no task.
    Parked(Box<RunInfo>),
    /// The run reached a terminal state.
    Ended,
    /// The runtime drains: the driver let the run go at a state boundary.
    HandedOver,
}

/// Drives runs of one registered version of a workflow: its handler, type-erased.
pub(crate) trait Driver: Send + Sync {
    /// Drives the run `claim` holds from `prepared` until it ends or parks.
    fn drive<'a>(
        &'a self,
        runtime: &'a Runtime,
        claim: &'a Claim,
        prepared: Prepared,
    ) -> BoxFuture<'a, Result<Stopped>>;
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("store", &self.inner.store.label())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// The runtime over `store` (`stored`: the store beneath its codec, or `store` itself,
    /// and `payloads`: how `store` seals and opens them), with `config`.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        stored: Arc<dyn Store>,
        payloads: Payloads,
        config: Config,
    ) -> Runtime {
        let registry = config.registry.clone();
        Runtime {
            inner: Arc::new(Inner {
                claims: Claims::new(Arc::clone(&store)),
                store,
                stored,
                payloads,
                config,
                registry: RwLock::new(registry),
                background: Background::new(),
                sweep: AtomicBool::new(true),
                started: AtomicBool::new(false),
                retaining: AtomicBool::new(false),
                gauging: AtomicBool::new(false),
                gauged: std::sync::Mutex::default(),
                schedules: std::sync::Mutex::default(),
                children: std::sync::Mutex::default(),
                parents: std::sync::Mutex::default(),
                accepts_checked: std::sync::Mutex::default(),
            }),
        }
    }

    /// The store this runtime keeps its records in.
    pub fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// The store as it holds payloads: under a codec ([`RuntimeBuilder::codec`](crate::RuntimeBuilder::codec)),
    /// the store beneath it, whose reads return payloads sealed (`{"$sealed":..}`, as the
    /// control endpoint serves them: it never opens a payload for a caller); without one,
    /// the store itself. For tools that open payloads themselves
    /// ([`Payloads`](crate::Payloads)); write through the runtime, or through
    /// [`store`](Self::store), which seals.
    pub fn sealed_store(&self) -> &dyn Store {
        &*self.inner.stored
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
        let inner: std::sync::Weak<Inner> = Arc::downgrade(&self.inner);
        Drive {
            store: &self.inner.store,
            settings: &self.inner.config.settings,
            held: claim.held(),
            kin: Some(inner),
            draining: Some(self.inner.background.draining()),
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

    /// Changes the registry of versions and migrations.
    pub(crate) fn with_registry(&self, change: impl FnOnce(&mut Registry)) {
        change(
            &mut self
                .inner
                .registry
                .write()
                .unwrap_or_else(PoisonError::into_inner),
        );
    }

    /// Reads the registry of versions and migrations.
    pub(crate) fn registry<T>(&self, read: impl FnOnce(&Registry) -> T) -> T {
        read(
            &self
                .inner
                .registry
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Ms since the Unix epoch by the runtime's clock ([`RuntimeBuilder::clock`](crate::RuntimeBuilder::clock)).
    pub(crate) fn now_ms(&self) -> u64 {
        self.inner.config.settings.clock.now_ms()
    }

    /// The registered workflows' names, sorted.
    pub(crate) fn workflows(&self) -> Vec<String> {
        self.registry(Registry::names)
    }

    /// Arms a timer that starts a driver for the run at `until` (ms since the Unix epoch).
    pub(crate) fn add_timer(&self, until: u64, workflow: &str, run_id: &str) {
        self.arm_timers([(until, Arc::from(workflow), run_id.to_owned())]);
    }

    /// [`add_timer`](Self::add_timer) for many runs at once, `(until, workflow, run id)`:
    /// one lock and one wake-up of the timer task (`resume_all` arms a timer for every
    /// sleeping run, the workflow's name shared between them).
    pub(crate) fn arm_timers(&self, timers: impl IntoIterator<Item = Timer>) {
        let hooks: std::sync::Weak<Inner> = Arc::downgrade(&self.inner);
        self.inner
            .background
            .add_timers(hooks, &self.inner.config.settings.clock, timers);
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
