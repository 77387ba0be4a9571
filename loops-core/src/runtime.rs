//! The runtime: drives runs from their last recorded state to a terminal state.

use std::any::TypeId;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::driver::{Driven, Mode};
use crate::error::{Error, Result};
pub use crate::names::{MAX_RUN_ID_BYTES, validate_run_id};
use crate::record::{Transition, TransitionRecord, now_ms};
use crate::retention::RetentionPolicy;
use crate::retry::RetryPolicy;
use crate::scheduler::{Background, Driver, Registered, Start};
use crate::store::redb::{SchemaCheck, check_schemas, precheck};
use crate::store::{
    Compacted, Lease, Pruned, RedbStore, Reply, RunInfo, RunStatus, Store, StoreOptions, Write,
};
use crate::workflow::{Dispatch, StateId, Workflow};

/// Default limit of one serialized state, step output or event payload: 2 MiB (Temporal's
/// payload cap).
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 2 * 1024 * 1024;

/// Default park threshold: sleeps shorter than this wait in place.
pub const DEFAULT_PARK_THRESHOLD: Duration = Duration::from_secs(1);

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

pub(crate) struct Inner {
    store: Arc<dyn Store>,
    config: Config,
    active: Mutex<HashMap<String, Signals>>,
    pub(crate) background: Background,
}

#[derive(Clone)]
pub(crate) struct Config {
    retry: RetryPolicy,
    state_retry: HashMap<(TypeId, &'static str), RetryPolicy>,
    workflow_retry: HashMap<TypeId, RetryPolicy>,
    timeout: Option<Duration>,
    state_timeout: HashMap<(TypeId, &'static str), Duration>,
    pub(crate) max_payload_bytes: usize,
    pub(crate) park_threshold: Duration,
    max_active_runs: Option<usize>,
    checks: Vec<SchemaCheck>,
    retention: RetentionPolicy,
    drivers: Vec<(&'static str, Arc<dyn Driver>)>,
}

impl Inner {
    /// How many runs this runtime drives now.
    #[cfg(test)]
    pub(crate) fn active_count(&self) -> usize {
        self.active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// What a driven run listens to, and the lease its driver holds.
#[derive(Clone)]
pub(crate) struct Signals {
    pub(crate) cancel: CancellationToken,
    pub(crate) wake: Arc<Notify>,
    /// Set once the store granted the lease; renewed by [`Runtime::serve`].
    pub(crate) lease: Arc<Mutex<Option<Lease>>>,
    /// Cancelled when the lease was lost to another worker: the driver stops at once.
    pub(crate) lost: CancellationToken,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("store", &self.inner.store.label())
            .finish_non_exhaustive()
    }
}

/// Configures a [`Runtime`]: retry policies, time-outs, limits and registered workflows.
/// Every setting has a default; `Runtime::open(path)` is `Runtime::builder().open(path)`.
#[derive(Clone)]
pub struct RuntimeBuilder {
    config: Config,
    store_options: StoreOptions,
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        RuntimeBuilder {
            store_options: StoreOptions::default(),
            config: Config {
                retry: RetryPolicy::default(),
                state_retry: HashMap::new(),
                workflow_retry: HashMap::new(),
                timeout: None,
                state_timeout: HashMap::new(),
                max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
                park_threshold: DEFAULT_PARK_THRESHOLD,
                max_active_runs: None,
                checks: Vec::new(),
                retention: RetentionPolicy::default(),
                drivers: Vec::new(),
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
    /// ([`workflow_retry`](Self::workflow_retry)). Default: [`RetryPolicy::default`],
    /// 3 attempts.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.config.retry = policy;
        self
    }

    /// The retry policy of every state of workflow `W` that has none of its own.
    pub fn workflow_retry<W: Workflow>(mut self, policy: RetryPolicy) -> Self {
        self.config
            .workflow_retry
            .insert(TypeId::of::<W::State>(), policy);
        self
    }

    /// The retry policy of one state of one workflow (`state` is a value of the generated
    /// `{Enum}State` type).
    pub fn state_retry<S: StateId>(mut self, state: S, policy: RetryPolicy) -> Self {
        self.config
            .state_retry
            .insert((TypeId::of::<S>(), state.name()), policy);
        self
    }

    /// A time-out for every state's handler that has none of its own (default: none). A
    /// handler that runs longer is abandoned, and the attempt fails with
    /// [`Error::StateTimeout`]. Time spent parked (waiting) does not count.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = Some(timeout);
        self
    }

    /// A time-out for one state's handler.
    pub fn state_timeout<S: StateId>(mut self, state: S, timeout: Duration) -> Self {
        self.config
            .state_timeout
            .insert((TypeId::of::<S>(), state.name()), timeout);
        self
    }

    /// The largest serialized state, step output or event payload, in bytes (default
    /// [`DEFAULT_MAX_PAYLOAD_BYTES`], 2 MiB). Larger ones fail with
    /// [`Error::PayloadTooLarge`] before anything is written.
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.config.max_payload_bytes = bytes;
        self
    }

    /// Sleeps shorter than this wait in place; longer ones park the run (default
    /// [`DEFAULT_PARK_THRESHOLD`], 1 s).
    pub fn park_threshold(mut self, threshold: Duration) -> Self {
        self.config.park_threshold = threshold;
        self
    }

    /// The retention policy [`Runtime::prune`] applies (default: keep everything).
    pub fn retention(mut self, policy: RetentionPolicy) -> Self {
        self.config.retention = policy;
        self
    }

    /// At most `n` runs driven at once by this runtime's claims: [`Runtime::resume_all`] (and
    /// so [`Runtime::serve`]) take no more than that (default: no limit). With a store shared
    /// by several workers, this spreads the runs over the workers. Runs started here
    /// ([`Runtime::start`], [`Runtime::run`]) or woken by an event do not count against it
    /// when they start, but do when claims are made.
    pub fn max_active_runs(mut self, n: usize) -> Self {
        self.config.max_active_runs = Some(n.max(1));
        self
    }

    /// Declares a workflow this runtime drives. When the store opens, every unfinished run of
    /// `W` must have been recorded with `W`'s compiled schema: otherwise
    /// [`open`](Self::open) refuses with [`Error::SchemaMismatch`] and the store file's bytes
    /// are left as they are. (Without this, each run is checked when it is driven, and refused
    /// then without writing a record.)
    pub fn workflow<W: Workflow>(mut self) -> Self {
        self.config.checks.push(SchemaCheck {
            workflow: W::NAME,
            pinned: W::SCHEMA_HASH.pinned(),
            schema: W::SCHEMA,
        });
        self
    }

    /// Registers `handler` as the driver of workflow `W`'s runs, as
    /// [`Runtime::register`] does, and declares `W` as [`workflow`](Self::workflow) does.
    pub fn register<W, H>(self, handler: H) -> Self
    where
        W: Dispatch<H>,
        H: Send + Sync + 'static,
    {
        let mut this = self.workflow::<W>();
        this.config
            .drivers
            .push((W::NAME, Arc::new(Registered::<W, H>::new(handler))));
        this
    }

    /// Opens (or creates) the store file at `path` and returns the runtime.
    ///
    /// # Errors
    /// - [`Error::SchemaMismatch`] if an unfinished run of a workflow declared with
    ///   [`workflow`](Self::workflow) or [`register`](Self::register) has another schema: the
    ///   file is not opened for writing, unless it needs redb's crash repair (it was not closed
    ///   cleanly), which the open then makes before checking; loops itself writes nothing;
    /// - as [`RedbStore::open`]: [`Error::StoreLocked`] if the file is open elsewhere,
    ///   [`Error::Open`] if it is not a loops store or cannot be read.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Runtime> {
        let checked = precheck(path.as_ref(), &self.config.checks)?;
        let store = RedbStore::open_with(path, self.store_options)?;
        if !checked {
            // The file needed redb's crash repair, which the writable open just made (as any
            // open would); check now, still before loops writes anything.
            check_schemas(&store, &self.config.checks)?;
        }
        Ok(self.build(store))
    }

    /// Verify every page's checksum when the store opens (default: on). See
    /// [`StoreOptions::verify_on_open`].
    pub fn verify_on_open(mut self, verify: bool) -> Self {
        self.store_options.verify_on_open = verify;
        self
    }

    /// Commit on the calling task's thread when no other commit is in progress (default:
    /// on). See [`StoreOptions::commit_on_caller`].
    pub fn commit_on_caller(mut self, on: bool) -> Self {
        self.store_options.commit_on_caller = on;
        self
    }

    /// Builds the runtime on a store opened elsewhere: [`RedbStore::with_storage`],
    /// [`RedbStore::in_memory`], or another [`Store`] such as the PostgreSQL one. The schema
    /// checks of [`workflow`](Self::workflow) are not made before such a store opens; each run
    /// is still checked when it is driven.
    pub fn build(self, store: impl Store) -> Runtime {
        let background = Background::new(self.config.drivers.iter().cloned());
        Runtime {
            inner: Arc::new(Inner {
                store: Arc::new(store),
                config: self.config,
                active: Mutex::new(HashMap::new()),
                background,
            }),
        }
    }
}

/// The right to drive one run: at most one per run id per runtime. Removed from the active
/// set when dropped, however the driver stops.
pub(crate) struct Claim {
    runtime: Runtime,
    run_id: String,
    signals: Signals,
    lease: Lease,
}

impl Claim {
    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    pub(crate) fn signals(&self) -> &Signals {
        &self.signals
    }

    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.runtime
            .inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.run_id);
        // Leases that lapse are given back, so that another worker may take the run at once.
        self.runtime.release_later(self.lease.clone());
    }
}

/// The receipt of [`Runtime::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// The event's sequence number in the run's inbox, from 0.
    pub event_seq: u64,
    /// Whether an event with the same idempotency key had been sent already (nothing was
    /// written; `event_seq` is that event's).
    pub duplicate: bool,
}

impl Runtime {
    /// Opens (or creates) the store file at `path` with the default configuration.
    ///
    /// # Errors
    /// [`Error::StoreLocked`] at once if this or another process has the file open;
    /// [`Error::Open`] if it is not a loops store or cannot be read.
    pub fn open(path: impl AsRef<Path>) -> Result<Runtime> {
        RuntimeBuilder::default().open(path)
    }

    /// A builder for a runtime with non-default retry policies, time-outs, limits or
    /// registered workflows.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
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

    pub(crate) fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Drives the run `run_id` to a terminal state and returns that state.
    ///
    /// If no run has this id, a run starts in `initial`. If one exists, it resumes from its
    /// last recorded state and `initial` is ignored: handlers of states that completed are not
    /// called again, and steps recorded by an interrupted handler return their recorded
    /// output. There is no separate recovery routine: a first run is a resume whose lookups
    /// all miss.
    ///
    /// Each transition is one durable commit (alone, or batched with other runs' commits).
    /// A failing handler is tried again under its retry policy; when the attempts run out
    /// the run ends as failed. A run that waits (for an event or a time) waits inside this
    /// call; to let waiting runs hold no task, [`register`](Self::register) the workflow
    /// and use [`start`](Self::start).
    ///
    /// # Errors
    /// - [`Error::InvalidRunId`]; [`Error::RunActive`] if this runtime drives the run already;
    /// - [`Error::WorkflowMismatch`] if the run is of another workflow;
    /// - [`Error::SchemaMismatch`] if it was recorded by a build whose workflow shape differs
    ///   (nothing is written, and it is never retried);
    /// - [`Error::NotInitial`] if a new run's `initial` is not the workflow's initial state;
    /// - [`Error::RunFailed`] when attempts run out (now or before), [`Error::RunCancelled`]
    ///   if the run was cancelled;
    /// - [`Error::Decode`], [`Error::Encode`], [`Error::PayloadTooLarge`],
    ///   [`Error::IllegalTransition`], [`Error::Storage`]: the run stays at its last recorded
    ///   state and can be resumed.
    pub async fn run<W, H>(&self, run_id: &str, initial: W, handler: &H) -> Result<W>
    where
        W: Dispatch<H>,
        H: ?Sized + Sync,
    {
        validate_run_id(run_id)?;
        let claim = self.claim(run_id).await?;
        let span = tracing::info_span!("run", run_id, workflow = W::NAME);
        let result = async {
            let entered = self.enter(&claim, Some(initial)).await?;
            self.drive_loop(&claim, entered, handler, Mode::Attached)
                .await
        }
        .instrument(span)
        .await;
        drop(claim);
        self.inner.background.notify_ended();
        match result? {
            Driven::Ended(value) => Ok(value),
            Driven::Parked(info) => Err(Error::RunNotFound {
                // Attached drivers wait in place and never park.
                run_id: info.run_id,
            }),
        }
    }

    /// Registers `handler` as the driver of workflow `W`'s runs: [`start`](Self::start),
    /// [`resume_all`](Self::resume_all), [`send`](Self::send) and the timer of a parked run
    /// then drive `W`'s runs in the background with it. Registering `W` again replaces the
    /// handler for runs started afterwards.
    pub fn register<W, H>(&self, handler: H)
    where
        W: Dispatch<H>,
        H: Send + Sync + 'static,
    {
        self.inner
            .background
            .register(W::NAME, Arc::new(Registered::<W, H>::new(handler)));
    }

    /// Starts the run `run_id` in `initial` (or finds it, if it exists) and drives it in the
    /// background with the handler registered for `W`; returns its status once the run is
    /// durably recorded. Await its end with [`wait`](Self::wait). A run that this runtime
    /// drives already (resumed by [`resume_all`](Self::resume_all), woken by an event or a
    /// timer, or started before) is left to its driver, and its status is returned.
    ///
    /// # Errors
    /// [`Error::NotRegistered`] if no handler is registered for `W`;
    /// [`Error::WorkflowMismatch`] if the run exists as another workflow, and
    /// [`Error::SchemaMismatch`] as another shape of it;
    /// [`Error::RunActive`] only while another call is creating the same run at this very
    /// moment; otherwise as [`run`](Self::run) for everything that happens before the first
    /// handler runs.
    pub async fn start<W: Workflow>(&self, run_id: &str, initial: W) -> Result<RunInfo> {
        validate_run_id(run_id)?;
        let driver = self.inner.background.driver(W::NAME)?;
        let claim = match self.claim(run_id).await {
            Ok(claim) => claim,
            Err(Error::RunActive { run_id: active }) => {
                // Driven here already: that is what `start` would have arranged.
                return match self.store().run_info(run_id).await? {
                    Some(info) => {
                        check_workflow::<W>(&info)?;
                        let compiled = W::SCHEMA_HASH.pinned();
                        if info.schema != compiled {
                            return Err(Error::SchemaMismatch {
                                run_id: run_id.to_owned(),
                                workflow: W::NAME.to_owned(),
                                stored: info.schema,
                                compiled,
                                changes: self.schema_changes::<W>(info.schema).await,
                            });
                        }
                        Ok(info)
                    }
                    None => Err(Error::RunActive { run_id: active }),
                };
            }
            Err(e) => return Err(e),
        };
        let entered = self
            .enter(&claim, Some(initial))
            .instrument(tracing::info_span!("run", run_id, workflow = W::NAME))
            .await?;
        let info = entered.info.clone();
        driver.spawn(self.clone(), Start::Claimed(Box::new((claim, entered))));
        Ok(info)
    }

    /// Waits until the run `run_id` has ended and returns its terminal state (a run ended
    /// by another worker of a shared store is seen within 200 ms).
    ///
    /// # Errors
    /// [`Error::RunNotFound`]; [`Error::WorkflowMismatch`]; [`Error::RunFailed`] or
    /// [`Error::RunCancelled`] if it ended so; [`Error::Decode`]; [`Error::Storage`].
    pub async fn wait<W: Workflow>(&self, run_id: &str) -> Result<W> {
        loop {
            let ended = self.inner.background.ended();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let Some((info, record)) = self.store().latest(run_id).await? else {
                return Err(Error::RunNotFound {
                    run_id: run_id.to_owned(),
                });
            };
            check_workflow::<W>(&info)?;
            match info.status {
                RunStatus::Completed => return record.decode(run_id),
                RunStatus::Failed => {
                    return Err(Error::RunFailed {
                        run_id: run_id.to_owned(),
                        state: info.state,
                        seq: info.seq,
                        attempts: info.attempt.saturating_sub(info.attempt_base),
                        interrupted: info.interrupted,
                        last_error: info.error.unwrap_or_default(),
                        source: None,
                    });
                }
                RunStatus::Cancelled => {
                    return Err(Error::RunCancelled {
                        run_id: run_id.to_owned(),
                        state: info.state,
                        seq: info.seq,
                        reason: info.cancel.unwrap_or_default(),
                    });
                }
                RunStatus::Running | RunStatus::Waiting => {
                    if self.store().lease_ttl().is_some() {
                        // Another worker may end it: look again now and then.
                        tokio::select! {
                            () = ended => {}
                            () = tokio::time::sleep(Duration::from_millis(200)) => {}
                        }
                    } else {
                        ended.await;
                    }
                }
            }
        }
    }

    /// Resumes every unfinished run of the registered workflows, reading the status index
    /// (never a history): running runs get a background driver at once; waiting runs whose
    /// event arrived or whose time passed too; the others stay parked, with a timer if they
    /// wait for a time. With a store shared by several workers, only runs no live worker holds
    /// are taken (each with its lease). Call it at startup (and, with a shared store,
    /// periodically: see [`serve`](Self::serve)).
    ///
    /// Returns the unfinished runs found, by workflow then run id.
    ///
    /// # Errors
    /// [`Error::Storage`] or [`Error::Decode`] if the index cannot be read.
    pub async fn resume_all(&self) -> Result<Vec<RunInfo>> {
        let workflows = self.inner.background.workflows();
        let limit = match self.inner.config.max_active_runs {
            Some(max) => max.saturating_sub(
                self.inner
                    .active
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .len(),
            ),
            None => usize::MAX,
        };
        let ready = if limit == 0 {
            Vec::new()
        } else {
            self.store().claim_ready(&workflows, limit).await?
        };
        let mut taken: HashSet<String> = HashSet::with_capacity(ready.len());
        let mut found: Vec<RunInfo> = Vec::with_capacity(ready.len());
        for (info, lease) in ready {
            self.spawn_driver_with(&info.workflow, &info.run_id, Some(lease));
            taken.insert(info.run_id.clone());
            found.push(info);
        }
        // A store only this process opens: arm the timers of the parked runs here. (With a
        // shared store, `claim_ready` returns waiting runs once their time has come.)
        if self.store().lease_ttl().is_none() {
            for workflow in &workflows {
                for info in self
                    .store()
                    .list(RunStatus::Waiting, Some(workflow))
                    .await?
                {
                    if taken.contains(&info.run_id) {
                        continue;
                    }
                    if let Some(until) = info.wait.as_ref().and_then(|w| w.until_ms) {
                        self.inner
                            .background
                            .add_timer(self, until, &info.workflow, &info.run_id);
                    }
                    found.push(info);
                }
            }
        }
        found.sort_by(|a, b| (&a.workflow, &a.run_id).cmp(&(&b.workflow, &b.run_id)));
        tracing::info!(runs = found.len(), "resumed unfinished runs");
        Ok(found)
    }

    /// Starts a background driver for the run unless one drives it already (in this process,
    /// or, through its lease, in another worker).
    pub(crate) fn spawn_driver(&self, workflow: &str, run_id: &str) {
        self.spawn_driver_with(workflow, run_id, None);
    }

    /// As [`spawn_driver`](Self::spawn_driver), with a lease the store granted already.
    pub(crate) fn spawn_driver_with(&self, workflow: &str, run_id: &str, lease: Option<Lease>) {
        let Ok(driver) = self.inner.background.driver(workflow) else {
            return;
        };
        if self
            .inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(run_id)
        {
            // Driven here already: a lease granted meanwhile goes back.
            if let Some(lease) = lease {
                self.release_later(lease);
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

    /// Sends the event `event` with `payload` to the run `run_id`: appended durably to the
    /// run's inbox, delivered to the run's next (or current) wait for `event`, once.
    ///
    /// # Errors
    /// [`Error::RunNotFound`] for an unknown run; [`Error::RunEnded`] for a run that has
    /// ended; [`Error::InvalidName`]; [`Error::EventEncode`] or [`Error::PayloadTooLarge`] for a
    /// payload that cannot be stored; [`Error::Storage`].
    pub async fn send<T: Serialize + ?Sized>(
        &self,
        run_id: &str,
        event: &str,
        payload: &T,
    ) -> Result<Sent> {
        self.send_inner(run_id, event, None, payload).await
    }

    /// As [`send`](Self::send), once per `key`: a second send with the same key for the same
    /// run writes nothing and returns the first event's receipt with `duplicate: true`.
    ///
    /// # Errors
    /// As [`send`](Self::send); [`Error::InvalidName`] for an invalid key.
    pub async fn send_with_key<T: Serialize + ?Sized>(
        &self,
        run_id: &str,
        event: &str,
        key: &str,
        payload: &T,
    ) -> Result<Sent> {
        self.send_inner(run_id, event, Some(key), payload).await
    }

    async fn send_inner<T: Serialize + ?Sized>(
        &self,
        run_id: &str,
        event: &str,
        key: Option<&str>,
        payload: &T,
    ) -> Result<Sent> {
        validate_run_id(run_id)?;
        let names =
            std::iter::once(("event name", event)).chain(key.map(|k| ("idempotency key", k)));
        for (what, name) in names {
            crate::names::validate_name(name).map_err(|reason| Error::InvalidName {
                run_id: run_id.to_owned(),
                what,
                name: name.to_owned(),
                reason,
            })?;
        }
        let json = serde_json::to_string(payload).map_err(|source| Error::EventEncode {
            run_id: run_id.to_owned(),
            event: event.to_owned(),
            source,
        })?;
        let limit = self.inner.config.max_payload_bytes;
        if json.len() > limit {
            return Err(Error::PayloadTooLarge {
                run_id: run_id.to_owned(),
                what: format!("payload of event `{event}`"),
                seq: None,
                bytes: json.len(),
                limit,
            });
        }
        let reply = self
            .store()
            .write(
                None,
                Write::Send {
                    run_id: run_id.to_owned(),
                    name: event.to_owned(),
                    payload: json,
                    key: key.map(str::to_owned),
                    at_ms: now_ms(),
                },
            )
            .await?;
        let Reply::Sent {
            event_seq,
            duplicate,
            info,
        } = reply
        else {
            return Err(Error::RunNotFound {
                run_id: run_id.to_owned(),
            });
        };
        tracing::info!(run_id, event, event_seq, duplicate, "event sent");
        if !duplicate {
            self.wake(&info);
        }
        Ok(Sent {
            event_seq,
            duplicate,
        })
    }

    /// Tells whoever drives the run that its wait may be over: the driver in this process,
    /// or a new background driver for a parked run of a registered workflow.
    fn wake(&self, info: &RunInfo) {
        let active = self
            .inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&info.run_id)
            .cloned();
        match active {
            Some(signals) => signals.wake.notify_one(),
            None if info.status == RunStatus::Waiting => {
                self.spawn_driver(&info.workflow, &info.run_id);
            }
            None => {}
        }
    }

    /// Keeps driving the registered workflows' runs until [`shutdown`](Self::shutdown):
    /// resumes them now ([`resume_all`](Self::resume_all)); then, with a store shared by
    /// several workers (one whose leases lapse), every `poll` (at most a third of the lease
    /// time) it claims the runs that need a driver: runs no worker holds, waiting runs whose
    /// event arrived or whose time came, and runs of a worker that died once its lease lapsed.
    /// With such a store, an event sent by a process that does not drive the run reaches it
    /// within `poll`. (The leases of the runs this runtime drives are renewed by a task of
    /// their own, every third of the lease time, whether `serve` runs or not.)
    /// With a store only this process opens, everything after the first resume is driven by
    /// events in this process, and `serve` just waits.
    ///
    /// A failed poll (a lost database connection, say) is logged and tried again at the next
    /// one.
    ///
    /// # Errors
    /// As [`resume_all`](Self::resume_all), for the first resume only.
    pub async fn serve(&self, poll: Duration) -> Result<()> {
        self.resume_all().await?;
        let stopped = self.inner.background.stopped();
        let Some(ttl) = self.store().lease_ttl() else {
            stopped.cancelled().await;
            return Ok(());
        };
        let every = poll.min(ttl / 3).max(Duration::from_millis(10));
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = stopped.cancelled() => return Ok(()),
            }
            if let Err(e) = self.resume_all().await {
                tracing::warn!(error = %e, "could not claim runs");
            }
        }
    }

    /// Renews the leases of the runs this runtime drives; a driver whose lease was lost is
    /// told to stop (its writes would be refused anyway: every write is fenced).
    pub(crate) async fn renew_leases(&self) -> Result<()> {
        let held: Vec<(Signals, Lease)> = self
            .inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
        let renewed = self.store().renew(&leases).await?;
        for (signals, lease) in held {
            match renewed
                .iter()
                .find(|r| r.run_id == lease.run_id && r.token == lease.token)
            {
                Some(new) => {
                    *signals.lease.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(new.clone());
                }
                None => {
                    tracing::warn!(run_id = %lease.run_id, "lease lost; stopping its driver");
                    signals.lost.cancel();
                }
            }
        }
        Ok(())
    }

    /// Claims the run for a driver of this runtime: at most one per run in this process,
    /// and, through the store's lease, one in all workers sharing the store.
    pub(crate) async fn claim(&self, run_id: &str) -> Result<Claim> {
        self.claim_with(run_id, None).await
    }

    /// As [`claim`](Self::claim), with a lease the store granted already (`claim_ready`).
    pub(crate) async fn claim_with(&self, run_id: &str, lease: Option<Lease>) -> Result<Claim> {
        let signals = {
            let mut active = self
                .inner
                .active
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if active.contains_key(run_id) {
                if let Some(lease) = lease {
                    // Granted by `claim_ready` while a driver here still held the run (its own
                    // lease lapsed): give it back, so that the run is free once that driver
                    // stops.
                    self.release_later(lease);
                }
                return Err(Error::RunActive {
                    run_id: run_id.to_owned(),
                });
            }
            let signals = Signals {
                cancel: CancellationToken::new(),
                wake: Arc::new(Notify::new()),
                lease: Arc::new(Mutex::new(None)),
                lost: CancellationToken::new(),
            };
            active.insert(run_id.to_owned(), signals.clone());
            signals
        };
        // From here the claim exists: dropping it (on any error below) frees the run again.
        let mut claim = Claim {
            runtime: self.clone(),
            run_id: run_id.to_owned(),
            signals,
            lease: Lease {
                run_id: run_id.to_owned(),
                token: 0,
                expires_ms: None,
            },
        };
        claim.lease = match lease {
            Some(lease) => lease,
            None => self
                .inner
                .store
                .acquire(run_id)
                .await?
                .ok_or_else(|| Error::RunActive {
                    run_id: run_id.to_owned(),
                })?,
        };
        *claim
            .signals
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(claim.lease.clone());
        if let Some(ttl) = self.inner.store.lease_ttl() {
            self.inner.background.start_renewer(self, ttl);
        }
        Ok(claim)
    }

    /// Gives `lease` back in a task of its own, when the store's leases lapse.
    fn release_later(&self, lease: Lease) {
        if self.inner.store.lease_ttl().is_none() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let store = self.store_arc();
            handle.spawn(async move {
                if let Err(e) = store.release(&lease).await {
                    tracing::warn!(run_id = %lease.run_id, error = %e, "could not release a lease");
                }
            });
        }
    }

    pub(crate) fn retry_policy<W: Workflow>(&self, state: W::State) -> RetryPolicy {
        let config = &self.inner.config;
        config
            .state_retry
            .get(&(TypeId::of::<W::State>(), state.name()))
            .or_else(|| config.workflow_retry.get(&TypeId::of::<W::State>()))
            .copied()
            .unwrap_or(config.retry)
    }

    pub(crate) fn state_timeout<W: Workflow>(&self, state: W::State) -> Option<Duration> {
        let config = &self.inner.config;
        config
            .state_timeout
            .get(&(TypeId::of::<W::State>(), state.name()))
            .copied()
            .or(config.timeout)
    }

    /// What changed between the stored schema description and the compiled one (never
    /// empty: an unavailable stored description is a change of its own).
    pub(crate) async fn schema_changes<W: Workflow>(
        &self,
        stored: crate::SchemaHash,
    ) -> crate::schema::SchemaDiff {
        let old = self.inner.store.schema(stored).await.ok().flatten();
        crate::schema::SchemaDiff::of_mismatch(old.as_deref(), W::SCHEMA)
    }

    pub(crate) fn check_size(&self, run_id: &str, record: &TransitionRecord) -> Result<()> {
        let bytes = record.payload.get().len();
        let limit = self.inner.config.max_payload_bytes;
        if bytes > limit {
            return Err(Error::PayloadTooLarge {
                run_id: run_id.to_owned(),
                what: format!("state `{}`", record.state),
                seq: Some(record.seq),
                bytes,
                limit,
            });
        }
        Ok(())
    }

    /// Cancels the run `run_id`, durably. A run this runtime is driving sees the cancellation
    /// through its [`Context`](crate::Context) and ends as cancelled at its next step or state
    /// boundary; a run nobody drives (parked, or not resumed since a crash) ends as cancelled
    /// at once. With a store shared by several workers, a run that another worker drives
    /// ends as cancelled at its next state boundary, or, if it waits, within 200 ms.
    ///
    /// # Errors
    /// [`Error::RunNotFound`]; [`Error::RunEnded`] if the run has ended already;
    /// [`Error::Storage`] if the request could not be committed.
    pub async fn cancel(&self, run_id: &str, reason: &str) -> Result<RunInfo> {
        validate_run_id(run_id)?;
        let signals = self
            .inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(run_id)
            .cloned();
        // A run nobody drives ends at once. With a store shared by several workers, another
        // worker may drive it: take its lease to know, and hold it meanwhile so that no worker
        // starts driving it. A run driven elsewhere sees the request in the row its next write
        // returns (or, waiting attached, when it reads the row again) and ends itself.
        let held = match &signals {
            None if self.store().lease_ttl().is_some() => self.store().acquire(run_id).await?,
            _ => None,
        };
        let end_now = signals.is_none() && (held.is_some() || self.store().lease_ttl().is_none());
        let written = self
            .store()
            .write(
                None,
                Write::Cancel {
                    run_id: run_id.to_owned(),
                    reason: reason.to_owned(),
                    end_now,
                    at_ms: now_ms(),
                },
            )
            .await;
        if let Some(lease) = &held
            && let Err(e) = self.store().release(lease).await
        {
            tracing::warn!(run_id, error = %e, "could not release a lease");
        }
        let mut info = written?.into_run(run_id)?;
        if let Some(signals) = signals {
            signals.cancel.cancel();
            // The driver may have been stopping (it parked the run, say) when the request
            // committed: if it no longer holds the run, nobody will see the signal.
            let still_driven = self
                .inner
                .active
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(run_id);
            if !still_driven && !info.status.is_ended() {
                info = self
                    .store()
                    .write(
                        None,
                        Write::EndCancelled {
                            run_id: run_id.to_owned(),
                            at_ms: now_ms(),
                        },
                    )
                    .await?
                    .into_run(run_id)?;
            }
        }
        if info.status.is_ended() {
            self.inner.background.notify_ended();
        }
        tracing::info!(run_id, reason, "cancellation requested");
        Ok(info)
    }

    /// Makes a failed run running again with a fresh budget of attempts; drive it again with
    /// [`run`](Self::run) (a registered workflow's run is driven in the background at once).
    /// Attempt numbers count on (each failure record keeps its own): after a failure at
    /// attempt 3, [`RunInfo::attempt`] stays 3 and the next attempt's
    /// [`Context::attempt`](crate::Context::attempt) is 4; the retry policy counts the budget
    /// from there.
    ///
    /// # Errors
    /// [`Error::RunNotFound`]; [`Error::NotFailed`] if the run is not failed;
    /// [`Error::Storage`] if the change could not be committed.
    pub async fn retry(&self, run_id: &str) -> Result<RunInfo> {
        validate_run_id(run_id)?;
        let info = self
            .store()
            .write(
                None,
                Write::Retry {
                    run_id: run_id.to_owned(),
                    at_ms: now_ms(),
                },
            )
            .await?
            .into_run(run_id)?;
        if self.inner.background.driver(&info.workflow).is_ok() {
            self.spawn_driver(&info.workflow, run_id);
        }
        Ok(info)
    }

    /// Stops every background driver (their handlers' futures are dropped at their next
    /// await, as a crash would stop them; what they recorded stands) and the timer task.
    /// Runs stay as they are, to be resumed by the next [`resume_all`](Self::resume_all).
    pub async fn shutdown(&self) {
        self.inner.background.shutdown().await;
    }

    /// Removes the ended runs that the configured retention policy
    /// ([`RuntimeBuilder::retention`]) expires now: their records, rows and events.
    ///
    /// # Errors
    /// As [`RedbStore::prune`].
    pub async fn prune(&self) -> Result<Pruned> {
        self.prune_with(&self.inner.config.retention, false).await
    }

    /// Removes (or, with `dry_run`, only lists) the ended runs `policy` expires now.
    ///
    /// # Errors
    /// As [`RedbStore::prune`].
    pub async fn prune_with(&self, policy: &RetentionPolicy, dry_run: bool) -> Result<Pruned> {
        let report = crate::store::prune(self.store(), policy, now_ms(), dry_run).await?;
        tracing::info!(
            runs = report.runs,
            records = report.records,
            dry_run,
            "pruned ended runs"
        );
        Ok(report)
    }

    /// Compacts the store file (see [`RedbStore::compact`]) on a blocking thread; reads and
    /// commits wait until it is done.
    ///
    /// # Errors
    /// As [`RedbStore::compact`]; [`Error::ReadOnly`] if the store is not a redb file.
    pub async fn compact(&self) -> Result<Compacted> {
        let store = self.store_arc();
        let label = store.label();
        tokio::task::spawn_blocking(move || match store.as_any().downcast_ref::<RedbStore>() {
            Some(redb) => redb.compact(),
            None => Err(Error::ReadOnly { path: label.into() }),
        })
        .await
        .map_err(|e| Error::Open {
            path: self.store().label().into(),
            source: e.into(),
        })?
    }

    /// The run's current standing, or `None` if no run has this id.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if the row is unreadable.
    pub async fn run_info(&self, run_id: &str) -> Result<Option<RunInfo>> {
        self.inner.store.run_info(run_id).await
    }

    /// The run's current state and its sequence number, decoded as `W`, or `None` if no run
    /// has this id.
    ///
    /// # Errors
    /// [`Error::WorkflowMismatch`] if the run is of another workflow; [`Error::Decode`] if the
    /// record does not decode as `W`; [`Error::Storage`] on a read error.
    pub async fn state<W: Workflow>(&self, run_id: &str) -> Result<Option<(u64, W)>> {
        let Some((info, record)) = self.inner.store.latest(run_id).await? else {
            return Ok(None);
        };
        check_workflow::<W>(&info)?;
        Ok(Some((record.seq, record.decode(run_id)?)))
    }

    /// Every transition of the run, in order, decoded as `W` (empty if no run has this id).
    ///
    /// # Errors
    /// [`Error::WorkflowMismatch`] if the run is of another workflow; [`Error::Decode`] naming
    /// the sequence number of a record that does not decode as `W`; [`Error::Storage`].
    pub async fn history<W: Workflow>(&self, run_id: &str) -> Result<Vec<Transition<W>>> {
        if let Some(info) = self.inner.store.run_info(run_id).await? {
            check_workflow::<W>(&info)?;
        }
        self.inner
            .store
            .history(run_id)
            .await?
            .into_iter()
            .map(|record| {
                let value: W = record.decode(run_id)?;
                Ok(Transition {
                    seq: record.seq,
                    state: value.state(),
                    at_ms: record.at_ms,
                    value,
                })
            })
            .collect()
    }

    /// The runs with `status`, optionally only those of workflow `workflow`, read from the
    /// status index.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a row is unreadable.
    pub async fn list_runs(
        &self,
        status: RunStatus,
        workflow: Option<&str>,
    ) -> Result<Vec<RunInfo>> {
        self.inner.store.list(status, workflow).await
    }
}

fn check_workflow<W: Workflow>(info: &RunInfo) -> Result<()> {
    if info.workflow != W::NAME {
        return Err(Error::WorkflowMismatch {
            run_id: info.run_id.clone(),
            stored: info.workflow.clone(),
            requested: W::NAME,
        });
    }
    Ok(())
}
