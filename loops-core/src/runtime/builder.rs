//! [`RuntimeBuilder`]: a runtime's configuration, and the opening of its store.

use std::any::TypeId;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::codec::PayloadCodec;
use crate::error::Result;
use crate::migrate::{Migrate, Migration, Versioned};
use crate::retention::RetentionPolicy;
use crate::retry::RetryPolicy;
use crate::run::dispatch::Dispatch;
use crate::run::settings::Settings;
use crate::runtime::handle::{Config, Registry, Runtime};
use crate::runtime::registered::Registered;
use crate::store::Store;
use crate::store::precheck::{SchemaCheck, check_schemas, precheck};
use crate::store::redb::{RedbStore, StoreOptions};
use crate::store::refuse_foreign_codec;
use crate::store::sealing::{Payloads, SealedStore, refuse_sealed};
use crate::workflow::{StateId, Workflow};

/// Configures a [`Runtime`]: retry policies, time-outs, limits and registered workflows.
/// Every setting has a default; `Runtime::open(path)` is `Runtime::builder().open(path)`.
#[derive(Clone)]
pub struct RuntimeBuilder {
    config: Config,
    store_options: StoreOptions,
    codec: Option<Arc<dyn PayloadCodec>>,
    /// Whether log lines carry error texts; `None`: only without a codec.
    log_payloads: Option<bool>,
    /// Without a codec: read a sealed store anyway, its payloads shown as encrypted.
    redact_sealed: bool,
    /// With a codec: seal only as the store does ([`seal_as_store_does`](Self::seal_as_store_does)).
    follow_store: bool,
    /// Whether [`park_threshold`](Self::park_threshold) was set (else a manual clock parks
    /// every sleep).
    park_threshold_set: bool,
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        RuntimeBuilder {
            store_options: StoreOptions::default(),
            codec: None,
            log_payloads: None,
            redact_sealed: false,
            follow_store: false,
            park_threshold_set: false,
            config: Config {
                settings: Settings::default(),
                max_active_runs: None,
                checks: Vec::new(),
                retention: RetentionPolicy::default(),
                retention_interval: super::retention::DEFAULT_RETENTION_INTERVAL,
                metrics_interval: None,
                #[cfg(feature = "prometheus")]
                prometheus: None,
                strict_schemas: false,
                registry: Registry::default(),
            },
        }
    }
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder").finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// The retry policy of every state that has none of its own, neither for the state
    /// ([`state_retry`](Self::state_retry)) nor for its workflow
    /// ([`workflow_retry`](Self::workflow_retry)). Default: [`RetryPolicy::default`](crate::RetryPolicy::default),
    /// 3 attempts.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.config.settings.retry = policy;
        self
    }

    /// The retry policy of every state of workflow `W` that has none of its own.
    pub fn workflow_retry<W: Workflow>(mut self, policy: RetryPolicy) -> Self {
        self.config
            .settings
            .workflow_retry
            .insert(TypeId::of::<W::State>(), policy);
        self
    }

    /// The retry policy of one state of one workflow (`state` is a value of the generated
    /// `{Enum}State` type).
    pub fn state_retry<S: StateId>(mut self, state: S, policy: RetryPolicy) -> Self {
        self.config
            .settings
            .state_retry
            .insert((TypeId::of::<S>(), state.name()), policy);
        self
    }

    /// A time-out for every state's handler that has none of its own (default: none). A
    /// handler that runs longer is abandoned, and the attempt fails with
    /// [`Error::StateTimeout`](crate::Error::StateTimeout). Time spent parked (waiting) does not count.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.settings.timeout = Some(timeout);
        self
    }

    /// A time-out for one state's handler.
    pub fn state_timeout<S: StateId>(mut self, state: S, timeout: Duration) -> Self {
        self.config
            .settings
            .state_timeout
            .insert((TypeId::of::<S>(), state.name()), timeout);
        self
    }

    /// The largest serialized state, step output or event payload, in bytes (default
    /// [`DEFAULT_MAX_PAYLOAD_BYTES`](crate::DEFAULT_MAX_PAYLOAD_BYTES), 2 MiB), measured in
    /// clear, before a [`codec`](Self::codec) seals it (an event that arrives sealed counts
    /// its sealed bytes, not its envelope's base64). Larger ones fail with
    /// [`Error::PayloadTooLarge`](crate::Error::PayloadTooLarge) before anything is written.
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.config.settings.max_payload_bytes = bytes;
        self
    }

    /// Declares the named limit `name`, shared by every run of this runtime: steps that
    /// name it ([`StepOptions::with_limit`](crate::StepOptions::with_limit)) take a place
    /// before each try, waiting (cancellably, holding nothing else) while `limit` is
    /// reached, and give it back when the try ends: "model": `Limit::concurrent(4)
    /// .with_rate(60, Duration::from_secs(60))`, whose rule is [`Limit::admit`](crate::Limit::admit).
    ///
    /// Counted in this process, or, on a store shared by many workers
    /// ([`Store::shared_limits`](crate::Store::shared_limits): the PostgreSQL store), in the
    /// store for all of them: each worker admits its own steps by its own declaration
    /// against the places and starts of all, so declare a limit alike on every worker.
    pub fn limit(mut self, name: impl Into<String>, limit: crate::Limit) -> Self {
        std::sync::Arc::make_mut(&mut self.config.settings.limits).insert(name.into(), limit);
        self
    }

    /// Sleeps and step back-offs shorter than this wait in place, holding the run's task;
    /// longer ones park the run (status waiting, [`RunInfo::wait`](crate::RunInfo::wait)
    /// saying until when). Default [`DEFAULT_PARK_THRESHOLD`](crate::DEFAULT_PARK_THRESHOLD),
    /// 1 s; zero with a [`ManualClock`](crate::ManualClock) (see [`clock`](Self::clock)).
    pub fn park_threshold(mut self, threshold: Duration) -> Self {
        self.config.settings.park_threshold = threshold;
        self.park_threshold_set = true;
        self
    }

    /// The clock the runtime reads time from and waits on (default: [`Clock::system`]): a
    /// [`ManualClock`](crate::ManualClock) makes sleeps, wait deadlines, retry back-offs and
    /// time-outs end when a test advances it. The lease deadline, rate limits, store-fault
    /// back-offs and the polls of a shared store stay on real time (see `docs/testing.md`).
    ///
    /// With a manual clock every sleep and step back-off parks the run, however short,
    /// unless [`park_threshold`](Self::park_threshold) says otherwise: a test then sees
    /// what the run waits for, and until when (`wait_for_status(run, RunStatus::Waiting)`),
    /// before it advances the clock. A sleep in place shows nothing: its run stays running.
    ///
    /// A run created by a runtime with a manual clock gets a key nonce
    /// ([`RunInfo::key_nonce`](crate::RunInfo::key_nonce)) hashed from its id, its creation
    /// time and how many runs of that id the clock saw created before, not a random one: the
    /// same idempotency keys on every run of a test.
    pub fn clock(mut self, clock: impl Into<Clock>) -> Self {
        self.config.settings.clock = clock.into();
        self
    }

    /// Calls `observer` before every run of a step's closure (the test kit's explorer).
    #[cfg(feature = "testing")]
    pub(crate) fn observe_steps(mut self, observer: crate::run::settings::StepObserver) -> Self {
        self.config.settings.observer = Some(observer);
        self
    }

    /// The retention policy (default: keep everything): applied by [`Runtime::prune`], and
    /// by [`Runtime::serve`] on its own, at once and then every
    /// [`retention_interval`](Self::retention_interval), while it serves. Each scheduled
    /// prune logs one INFO event, "retention removed ended runs", with `runs` and `records`.
    /// With a store shared by several workers, every worker that is given the policy applies
    /// it; a prune removes each run once whoever runs it (the prune write skips runs already
    /// gone), so overlapping prunes cost a repeated list of the ended runs and nothing else.
    /// To have one worker prune, give the policy to that worker only.
    pub fn retention(mut self, policy: RetentionPolicy) -> Self {
        self.config.retention = policy;
        self
    }

    /// How often [`Runtime::serve`] applies the [`retention`](Self::retention) policy
    /// (default [`DEFAULT_RETENTION_INTERVAL`](crate::DEFAULT_RETENTION_INTERVAL), one hour;
    /// at least 10 ms).
    pub fn retention_interval(mut self, every: Duration) -> Self {
        self.config.retention_interval = every.max(Duration::from_millis(10));
        self
    }

    /// Has [`Runtime::serve`] refresh the gauges of runs
    /// ([`Runtime::refresh_metrics`](crate::Runtime::refresh_metrics)) at once and then every
    /// `every` (at least 10 ms; [`DEFAULT_METRICS_INTERVAL`](crate::DEFAULT_METRICS_INTERVAL),
    /// 15 s, is a good start). Off by default, since each refresh reads the store's status
    /// index (every run's row), which a process that installs no recorder should not pay
    /// for; `prometheus` (feature `prometheus`) turns it on at the default interval. Keep it
    /// long on a store of many runs. See [`metrics`](crate::metrics).
    pub fn metrics_interval(mut self, every: Duration) -> Self {
        self.config.metrics_interval = Some(every.max(Duration::from_millis(10)));
        self
    }

    /// Serves `handle`'s metrics at `GET /metrics` on this runtime's control endpoint
    /// ([`Runtime::serve_control`](crate::Runtime::serve_control)), in Prometheus' text
    /// format, under the endpoint's own rules (the bearer token on TCP). `handle` is the
    /// handle of a `metrics_exporter_prometheus::PrometheusRecorder` the application
    /// installed (no HTTP listener of its own is needed):
    ///
    /// ```no_run
    /// # extern crate loops_core as loops;
    /// # fn build(builder: loops::RuntimeBuilder) -> loops::RuntimeBuilder {
    /// use loops::metrics::{facade, prometheus::PrometheusBuilder};
    /// let recorder = PrometheusBuilder::new().build_recorder();
    /// let handle = recorder.handle();
    /// facade::set_global_recorder(recorder).expect("no other recorder installed");
    /// loops::metrics::describe();
    /// builder.prometheus(handle)
    /// # }
    /// ```
    ///
    /// The gauges of runs are then refreshed by [`Runtime::serve`] every
    /// [`DEFAULT_METRICS_INTERVAL`](crate::DEFAULT_METRICS_INTERVAL) unless
    /// [`metrics_interval`](Self::metrics_interval) names another interval.
    ///
    /// Feature `prometheus`. See [`metrics`](crate::metrics) for the series.
    #[cfg(feature = "prometheus")]
    pub fn prometheus(mut self, handle: metrics_exporter_prometheus::PrometheusHandle) -> Self {
        self.config.prometheus = Some(handle);
        self.config.metrics_interval = self
            .config
            .metrics_interval
            .or(Some(super::gauges::DEFAULT_METRICS_INTERVAL));
        self
    }

    /// At most `n` runs driven at once by this runtime's claims: [`Runtime::resume_all`] (and
    /// so [`Runtime::serve`]) take no more than that (default: no limit). With a store shared
    /// by several workers, this spreads the runs over the workers. Runs started here
    /// ([`Runtime::start`], [`Runtime::run`]) or woken by an event do not count against it
    /// when they start, but do when claims are made. A parked run woken by its timer takes a
    /// place as it wakes: when more timers come due than there are places, the others wait,
    /// holding no driver (their lateness grows), until a driven run ends, which bounds the
    /// memory a burst of timers takes.
    pub fn max_active_runs(mut self, n: usize) -> Self {
        self.config.max_active_runs = Some(n.max(1));
        self
    }

    /// Declares a workflow this runtime drives, for the strict check of
    /// [`strict_schemas`](Self::strict_schemas): with it on, when the store opens, every
    /// unfinished run of `W` must have been recorded with `W`'s compiled schema, otherwise
    /// [`open`](Self::open) refuses with [`Error::SchemaMismatch`](crate::Error::SchemaMismatch)
    /// and the store file's bytes are left as they are. Without it (the default), each run is
    /// routed when it is driven: a run that no registered version takes is
    /// [blocked](crate::RunStatus::Blocked), and the others go on.
    ///
    /// Its claim to accept older schemas ([`Workflow::ACCEPTS`]) is checked when the store
    /// opens and when the runtime resumes its runs, as a registered version's is.
    pub fn workflow<W: Workflow>(mut self) -> Self {
        self.config.checks.push(SchemaCheck::of::<W>());
        self
    }

    /// Registers `handler` as the driver of version `W` of workflow `W::NAME`, as
    /// [`Runtime::register`] does (several versions of one workflow live side by side; the
    /// same version again replaces its handler), and declares `W` as
    /// [`workflow`](Self::workflow) does.
    pub fn register<W, H>(self, handler: H) -> Self
    where
        W: Dispatch<H>,
        H: Send + Sync + 'static,
    {
        let mut this = self.workflow::<W>();
        this.config
            .registry
            .add_version::<W>(Registered::<W, H>::version(handler));
        this
    }

    /// Registers the migration `impl Migrate<Old> for New`, as [`Runtime::migration`] does.
    pub fn migration<Old: Versioned, New: Migrate<Old>>(mut self) -> Self {
        self.config
            .registry
            .add_migration(Migration::of::<Old, New>());
        self
    }

    /// Whether [`open`](Self::open) refuses a store that holds an unfinished run of a
    /// declared workflow ([`workflow`](Self::workflow), [`register`](Self::register)) recorded
    /// with another schema than the declared version's (default: `false`). Off, such runs are
    /// routed one by one when they are driven (migrated, accepted, or blocked), and the store
    /// opens whatever they hold.
    pub fn strict_schemas(mut self, strict: bool) -> Self {
        self.config.strict_schemas = strict;
        self
    }

    /// Opens (or creates) the store file at `path` and returns the runtime.
    ///
    /// # Errors
    /// - [`Error::AcceptsRefused`](crate::Error::AcceptsRefused) if a registered version claims to accept a stored schema
    ///   whose differences from it are breaking (the store file is opened, and nothing
    ///   written);
    /// - with [`strict_schemas`](Self::strict_schemas) only, [`Error::SchemaMismatch`](crate::Error::SchemaMismatch) if an unfinished run of a workflow declared with
    ///   [`workflow`](Self::workflow) or [`register`](Self::register) has another schema: the
    ///   file is not opened for writing, unless it needs redb's crash repair (it was not closed
    ///   cleanly), which the open then makes before checking; loops itself writes nothing;
    /// - without a [`codec`](Self::codec), [`Error::Encrypted`](crate::Error::Encrypted) if
    ///   the store lists keys (unless [`read_sealed_redacted`](Self::read_sealed_redacted));
    ///   with one, [`Error::KeyMismatch`](crate::Error::KeyMismatch) if the store recorded
    ///   another key under one of its ids, [`Error::KeyNotInStore`](crate::Error::KeyNotInStore)
    ///   if the store lists keys and it holds none of them (a store built elsewhere is
    ///   checked the same way before its first read or write); nothing written;
    /// - as [`RedbStore::open`](crate::RedbStore::open): [`Error::StoreLocked`](crate::Error::StoreLocked) if the file is open elsewhere,
    ///   [`Error::Open`](crate::Error::Open) if it is not a loops store or cannot be read.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Runtime> {
        let checks: &[SchemaCheck] = if self.config.strict_schemas {
            &self.config.checks
        } else {
            &[]
        };
        let checked = precheck(path.as_ref(), checks)?;
        let store = RedbStore::open_with(path, self.store_options)?;
        if !checked {
            // The file needed redb's crash repair, which the writable open just made (as any
            // open would); check now, still before loops writes anything.
            check_schemas(&store, checks)?;
        }
        self.check_codec(&store)?;
        let runtime = self.build(store);
        // The accepts claims, checked here (redb reads at once) so that a wrong one
        // refuses the open; `resume_all` checks those registered later, on any store.
        if let Some(store) = runtime.redb() {
            runtime.judge_accepts(runtime.unchecked_claims(), |hash| store.schema(hash))?;
        }
        Ok(runtime)
    }

    /// The codec check [`open`](Self::open) makes on the store file it opens, made on
    /// `store`: for a program that opens the file read-only first (to refuse what it can
    /// without opening it for writing, whose close makes redb rewrite part of the file).
    /// `store` is only read.
    ///
    /// # Errors
    /// As [`open`](Self::open) says them: without a [`codec`](Self::codec),
    /// [`Error::Encrypted`](crate::Error::Encrypted) if the store lists keys (unless
    /// [`read_sealed_redacted`](Self::read_sealed_redacted)); with one,
    /// [`Error::KeyMismatch`](crate::Error::KeyMismatch) or
    /// [`Error::KeyNotInStore`](crate::Error::KeyNotInStore) (unless
    /// [`seal_as_store_does`](Self::seal_as_store_does)); the store's error if its keys
    /// cannot be read.
    pub fn check_codec(&self, store: &RedbStore) -> Result<()> {
        match &self.codec {
            None if !self.redact_sealed => {
                refuse_sealed(Store::label(store), store.sealing_keys()?)
            }
            Some(codec) if !self.follow_store => refuse_foreign_codec(
                Store::label(store),
                store.sealing_keys()?,
                store.sealing_checks()?,
                &Payloads::new(Arc::clone(codec)),
            ),
            _ => Ok(()),
        }
    }

    /// Verify every page's checksum when the store opens (default: on). See
    /// [`StoreOptions::verify_on_open`](crate::StoreOptions::verify_on_open).
    pub fn verify_on_open(mut self, verify: bool) -> Self {
        self.store_options.verify_on_open = verify;
        self
    }

    /// Commit on the calling task's thread when no other commit is in progress (default:
    /// on). See [`StoreOptions::commit_on_caller`](crate::StoreOptions::commit_on_caller).
    pub fn commit_on_caller(mut self, on: bool) -> Self {
        self.store_options.commit_on_caller = on;
        self
    }

    /// The most memory, in bytes, redb's page cache may hold (default: 256 MiB). See
    /// [`StoreOptions::cache_bytes`](crate::StoreOptions::cache_bytes).
    pub fn cache_bytes(mut self, bytes: usize) -> Self {
        self.store_options.cache_bytes = bytes;
        self
    }

    /// Builds the runtime on a store opened elsewhere: [`RedbStore::with_storage`](crate::RedbStore::with_storage),
    /// [`RedbStore::in_memory`](crate::RedbStore::in_memory), or another [`Store`] such as the PostgreSQL one. The schema
    /// checks of [`workflow`](Self::workflow) are not made before such a store opens; each run
    /// is still checked when it is driven.
    pub fn build(self, store: impl Store) -> Runtime {
        self.build_shared(Arc::new(store))
    }

    /// Seals every payload a run stores with `codec` and opens it when read back: states,
    /// step outputs, events, failure texts, cancellation and block reasons (a
    /// [`Keyring`](crate::Keyring) is the ready codec). Run ids, workflow, state names,
    /// status, seqs, times, schema hashes and attempt counts stay in clear: stores index
    /// and route by them. Payloads stored in clear before (or texts loops writes itself)
    /// still read. Without a codec (the default), a sealed payload fails to decode with
    /// [`Error::Payload`](crate::Error::Payload) naming its key id. See docs/encryption.md.
    pub fn codec(mut self, codec: impl PayloadCodec) -> Self {
        self.codec = Some(Arc::new(codec));
        self
    }

    /// Without a codec, reads a store that holds sealed payloads anyway: each sealed payload
    /// reads as the text `<encrypted: key K>`, and a write that would store a payload (a
    /// start, an event, a cancellation, ...) is refused with
    /// [`Error::Encrypted`](crate::Error::Encrypted) rather than stored in clear; writes
    /// without a payload (retry, prune) go on. For tools that inspect runs without the key
    /// (the `loops` CLI without `--key-file`); not for a runtime that drives runs. Without
    /// it (the default), a runtime without a codec refuses a store whose payloads are sealed
    /// with [`Error::Encrypted`](crate::Error::Encrypted), naming the store and its key ids:
    /// [`open`](Self::open) at once, a store given to [`build`](Self::build) at its first
    /// read or write.
    pub fn read_sealed_redacted(mut self) -> Self {
        self.redact_sealed = true;
        self
    }

    /// With a [`codec`](Self::codec), seals what this runtime stores only as the store's
    /// workers do, and records no key of its own: in a store that lists the codec's writing
    /// key ([`Store::sealing_keys`](crate::Store::sealing_keys)) payloads are sealed, in a
    /// store that lists none they are stored in clear (its workers have no codec, and one
    /// sealed payload would stop all of them). For tools that write into a store others
    /// drive (the `loops` CLI with `--key-file`: `send`, `cancel`); not for a runtime that
    /// drives runs, which decides the store's sealing by having a codec. Without a codec it
    /// changes nothing.
    ///
    /// A write that would store a payload into a store that lists keys, none of them the
    /// codec's writing key, fails with [`Error::KeyNotInStore`](crate::Error::KeyNotInStore)
    /// (the workers may not hold that key); nothing is written.
    pub fn seal_as_store_does(mut self) -> Self {
        self.follow_store = true;
        self
    }

    /// Whether loops' log lines carry error texts: a handler's error, a step's error, why an
    /// event was set aside. They hold what payloads hold (a handler's `secret-token=...`).
    /// Default: yes without a codec; with a [`codec`](Self::codec), no: the store seals the
    /// text and a WARN line shows the run, state, seq, attempt and the error's kind
    /// (`error_kind`: `handler`, `step`, `event decode`), with the text replaced by
    /// `<not logged: ...>`. `log_payloads(true)` logs them anyway (your logs are then outside
    /// the encryption); `false` leaves them out without a codec too.
    pub fn log_payloads(mut self, on: bool) -> Self {
        self.log_payloads = Some(on);
        self
    }

    /// As [`build`](Self::build), on a store already shared (the conformance suite's): the
    /// runtime reads and writes through a `SealedStore` over it, with its codec (or, without
    /// one, as [`read_sealed_redacted`](Self::read_sealed_redacted) says).
    pub(crate) fn build_shared(mut self, store: Arc<dyn Store>) -> Runtime {
        self.config.settings.log_texts = self.log_payloads.unwrap_or(self.codec.is_none());
        if !self.park_threshold_set && self.config.settings.clock.is_manual() {
            self.config.settings.park_threshold = Duration::ZERO;
        }
        let payloads = match (self.codec, self.redact_sealed) {
            (Some(codec), _) if self.follow_store => Payloads::following(codec),
            (Some(codec), _) => Payloads::new(codec),
            (None, true) => Payloads::redacting(),
            (None, false) => Payloads::guard(),
        };
        let sealed: Arc<dyn Store> =
            Arc::new(SealedStore::new(Arc::clone(&store), payloads.clone()));
        Runtime::new(sealed, store, payloads, self.config)
    }
}

impl Runtime {
    /// Opens (or creates) the store file at `path` with the default configuration.
    ///
    /// # Errors
    /// [`Error::StoreLocked`](crate::Error::StoreLocked) at once if this or another process has the file open;
    /// [`Error::Open`](crate::Error::Open) if it is not a loops store or cannot be read.
    pub fn open(path: impl AsRef<Path>) -> Result<Runtime> {
        RuntimeBuilder::default().open(path)
    }

    /// A builder for a runtime with non-default retry policies, time-outs, limits or
    /// registered workflows.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }
}
