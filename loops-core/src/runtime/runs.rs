//! Driving runs: one to its end ([`Runtime::run`]), or in the background ([`Runtime::start`],
//! [`Runtime::resume_all`], [`Runtime::serve`]), and waiting for their ends.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::Instrument;

use crate::attribute::AttributeValue;
use crate::error::{Error, Result};
use crate::names::validate_run_id_lookup;
use crate::record::TransitionRecord;
use crate::route::{KnownVersion, Route};
use crate::row::RunInfo;
use crate::run::dispatch::Dispatch;
use crate::run::driver::{Driven, Entered, Found, Mode, schema_changes};
use crate::runtime::claims::Claim;
use crate::runtime::evolve::{OnBlock, Routing};
use crate::runtime::handle::{Prepared, Registry, Runtime, Start, check_workflow};
use crate::schema::{SchemaDiff, SchemaHash};
use crate::status::RunStatus;
use crate::store::{ClaimFilter, ParkedRun};
use crate::workflow::{StateId, Workflow};

/// How [`Runtime::run_with`] and [`Runtime::start_with`] start a run they create.
///
/// ```
/// # extern crate loops_core as loops;
/// use loops::StartOptions;
/// let options = StartOptions::default()
///     .attribute("repo", "acme/api")
///     .attribute("issue", 17);
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StartOptions {
    /// The run's attributes, in order (a key given twice keeps its last value). Keys that
    /// start with [`RESERVED_ATTRIBUTE_PREFIX`](crate::RESERVED_ATTRIBUTE_PREFIX) are refused.
    pub attributes: Vec<(String, AttributeValue)>,
    /// Attributes loops itself sets (a schedule's name on the runs of its ticks), after
    /// `attributes`.
    own: Vec<(String, AttributeValue)>,
}

impl StartOptions {
    /// Also records the attribute `key` = `value` (searchable:
    /// [`Runtime::list_runs_where`]). Checked when the run is created
    /// ([`check_attribute`](crate::check_attribute)); a key that starts with
    /// [`RESERVED_ATTRIBUTE_PREFIX`](crate::RESERVED_ATTRIBUTE_PREFIX) is refused then.
    pub fn attribute(mut self, key: impl Into<String>, value: impl Into<AttributeValue>) -> Self {
        self.attributes.push((key.into(), value.into()));
        self
    }

    /// Also records loops' own attribute `key` (one with the reserved prefix).
    pub(crate) fn own_attribute(mut self, key: &str, value: impl Into<AttributeValue>) -> Self {
        self.own.push((key.to_owned(), value.into()));
        self
    }

    /// The attributes to create the run `run_id` in `state` with: the caller's, then loops'
    /// own.
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`](crate::Error::InvalidAttribute) for a caller's key with the
    /// reserved prefix.
    fn into_attributes(self, run_id: &str, state: &str) -> Result<Vec<(String, AttributeValue)>> {
        for (key, _) in &self.attributes {
            crate::attribute::refuse_reserved(key).map_err(|reason| Error::InvalidAttribute {
                run_id: run_id.to_owned(),
                state: state.to_owned(),
                seq: 0,
                key: key.clone(),
                reason,
            })?;
        }
        let mut attributes = self.attributes;
        attributes.extend(self.own);
        Ok(attributes)
    }
}

/// What [`Runtime::resume_all`] did: the runs it gave a driver, and how many it left
/// parked.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Resumed {
    /// The runs given a background driver, by workflow then run id: running runs, waiting
    /// runs whose event arrived, whose time passed or whose cancellation was asked for,
    /// waiting runs recorded by a version this build does not compile (accepted or migrated
    /// now, or blocked), and blocked runs it can route now. Each row is as it was read,
    /// before its driver started: a blocked run's says `blocked` until its driver unblocks
    /// (or migrates) it, in the background.
    pub driven: Vec<RunInfo>,
    /// Waiting runs left parked, holding no task (a store only this process opens).
    pub parked: usize,
    /// Of those, the runs waiting for a time, each with a timer armed.
    pub timers: usize,
}

impl Resumed {
    /// The unfinished runs found: driven and parked.
    pub fn len(&self) -> usize {
        self.driven.len() + self.parked
    }

    /// Whether no unfinished run was found.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Runtime {
    /// Drives the run `run_id` to a terminal state and returns that state.
    ///
    /// If no run has this id, a run starts in `initial`. If one exists, it resumes from its
    /// last recorded state and `initial` is ignored: handlers of states that completed are not
    /// called again, and steps recorded by an interrupted handler return their recorded
    /// output. There is no separate recovery routine: a first run is a resume whose lookups
    /// all miss.
    ///
    /// A run stored by an older version of the workflow is migrated to `W` first (one
    /// record of its own), if [`migration`](Self::migration)s lead from its schema to `W`'s;
    /// a run whose schema `W` accepts (`#[workflow(accepts = [..])]`) is driven as it is.
    ///
    /// Each transition is one durable commit (alone, or batched with other runs' commits).
    /// A failing handler is tried again under its retry policy; when the attempts run out
    /// the run ends as failed. A run that waits (for an event or a time) waits inside this
    /// call; to let waiting runs hold no task, [`register`](Self::register) the workflow
    /// and use [`start`](Self::start).
    ///
    /// # Errors
    /// - [`Error::InvalidRunId`](crate::Error::InvalidRunId) (an existing run is found by an id that [`validate_run_id_lookup`](crate::validate_run_id_lookup) takes; a new run's id must pass [`validate_run_id`](crate::validate_run_id)); [`Error::RunActive`](crate::Error::RunActive) if the run, not ended, is driven already: by this runtime (another `run` of the same id in flight, or a background driver: wait for its end with [`wait`](Self::wait) instead), or by a worker holding its lease (a PostgreSQL worker that stopped holds it until it lapses, at most [`Store::lease_ttl`](crate::Store::lease_ttl) after the refusal); the error's [`Holder`](crate::Holder) says which; an ended run is reported as it ended, whoever holds it;
    /// - [`Error::AcceptsRefused`](crate::Error::AcceptsRefused) if `W` claims to accept a
    ///   stored schema whose differences from it are breaking in every state (checked once
    ///   per version and runtime, before anything is read or written);
    /// - [`Error::WorkflowMismatch`](crate::Error::WorkflowMismatch) if the run is of another workflow;
    /// - [`Error::SchemaMismatch`](crate::Error::SchemaMismatch) if it was recorded with another schema that `W` neither
    ///   accepts nor has a registered migration from (a failing migration included): the
    ///   run is then marked [blocked](crate::RunStatus::Blocked), unless a registered
    ///   version can drive it (then nothing is written, and it is left to that version);
    /// - [`Error::NotInitial`](crate::Error::NotInitial) if a new run's `initial` is not the workflow's initial state;
    /// - [`Error::RunFailed`](crate::Error::RunFailed) when attempts run out (now or before), [`Error::RunCancelled`](crate::Error::RunCancelled)
    ///   if the run was cancelled;
    /// - [`Error::Decode`](crate::Error::Decode), [`Error::Encode`](crate::Error::Encode), [`Error::PayloadTooLarge`](crate::Error::PayloadTooLarge),
    ///   [`Error::IllegalTransition`](crate::Error::IllegalTransition), [`Error::Storage`](crate::Error::Storage): the run stays at its last recorded
    ///   state and can be resumed.
    pub async fn run<W, H>(&self, run_id: &str, initial: W, handler: &H) -> Result<W>
    where
        W: Dispatch<H>,
        H: ?Sized + Sync,
    {
        self.run_with(run_id, initial, handler, StartOptions::default())
            .await
    }

    /// [`run`](Self::run), with `options` for a run this call creates: its
    /// [attributes](StartOptions::attribute), recorded in the same commit as its first state.
    /// A run that exists already keeps its attributes (as it ignores `initial`).
    ///
    /// # Errors
    /// As [`run`](Self::run); [`Error::InvalidAttribute`](crate::Error::InvalidAttribute) for
    /// an attribute [`check_attribute`](crate::check_attribute) refuses (nothing is written).
    pub async fn run_with<W, H>(
        &self,
        run_id: &str,
        initial: W,
        handler: &H,
        options: StartOptions,
    ) -> Result<W>
    where
        W: Dispatch<H>,
        H: ?Sized + Sync,
    {
        validate_run_id_lookup(run_id)?;
        self.check_accepts_of::<W>().await?;
        // `W` as a type, for the check of the events sent to its runs (`send_json`).
        let known = KnownVersion::of::<W>();
        self.with_registry(|r| {
            if !r.has_reader(known.stored.hash) {
                r.add_reader(&known, W::read_event);
            }
        });
        let registrations = self.registry(Registry::generation);
        let claim = match self.claim(run_id).await {
            Ok(claim) => claim,
            // An ended run needs no driver: one that holds it still (a background driver
            // letting go after its last commit, or the unlapsed lease of a worker that exited
            // after the end) is no reason to refuse it. Its end, as a drive would report it.
            Err(active @ Error::RunActive { .. }) => {
                if let Some((info, record)) = self.store().latest(run_id).await? {
                    check_workflow::<W>(&info)?;
                    if let Some(end) = self.end_as::<W>(&info, record) {
                        return end;
                    }
                }
                return Err(active);
            }
            Err(e) => return Err(e),
        };
        let span = tracing::info_span!("run", run_id, workflow = W::NAME);
        // A run's parent never changes: known at entry, it need not be read again at the end.
        let mut parent = None;
        let result = async {
            let state = initial.state().name();
            let attributes = || options.into_attributes(run_id, state);
            let entered = match self
                .drive(&claim)
                .find_or_create(initial, attributes)
                .await?
            {
                Found::Created(entered) => entered,
                Found::Existing(found) => {
                    let (entered, accepted) = self.route_attached::<W>(&claim, found).await?;
                    self.drive(&claim).check::<W>(entered, accepted).await?
                }
            };
            parent = entered.info.parent.as_ref().map(|p| p.run_id.clone());
            self.drive(&claim)
                .drive_loop(entered, handler, Mode::Attached)
                .await
        }
        .instrument(span)
        .await;
        drop(claim);
        self.inner.background.notify_ended();
        if matches!(result, Err(Error::SchemaMismatch { .. })) {
            self.route_again_if_registered(run_id, registrations).await;
        }
        if matches!(
            result,
            Ok(Driven::Ended(_)) | Err(Error::RunFailed { .. } | Error::RunCancelled { .. })
        ) && let Some(parent) = &parent
        {
            self.wake_parent(run_id, parent).await;
        }
        match result? {
            Driven::Ended(value) => Ok(value),
            Driven::Parked(info) => Err(Error::RunNotFound {
                // Attached drivers wait in place and never park.
                run_id: info.run_id,
            }),
            // Attached drivers are not let go by a drain.
            Driven::HandedOver => Err(Error::RunNotFound {
                run_id: run_id.to_owned(),
            }),
        }
    }

    /// Starts the run `run_id` in `initial` (or finds it, if it exists) and drives it in the
    /// background with the handler registered for `W`; returns its status once the run is
    /// durably recorded. Await its end with [`wait`](Self::wait). A run that this runtime
    /// drives already (resumed by [`resume_all`](Self::resume_all), woken by an event or a
    /// timer, or started before) is left to its driver, and its status is returned.
    ///
    /// # Errors
    /// [`Error::NotRegistered`](crate::Error::NotRegistered) if no handler is registered for `W`;
    /// [`Error::WorkflowMismatch`](crate::Error::WorkflowMismatch) if the run exists as another workflow, and
    /// [`Error::SchemaMismatch`](crate::Error::SchemaMismatch) as another shape of it;
    /// [`Error::RunActive`](crate::Error::RunActive) only while another call is creating the same run at this very
    /// moment; otherwise as [`run`](Self::run) for everything that happens before the first
    /// handler runs.
    ///
    /// On a runtime that drains or was shut down ([`drain`](Self::drain),
    /// [`shutdown`](Self::shutdown)), the run is recorded as [`enqueue`](Self::enqueue)
    /// records it, and left to the next process or worker that serves `W`.
    pub async fn start<W: Workflow>(&self, run_id: &str, initial: W) -> Result<RunInfo> {
        self.start_with(run_id, initial, StartOptions::default())
            .await
    }

    /// [`start`](Self::start), with `options` for a run this call creates: its
    /// [attributes](StartOptions::attribute), recorded in the same commit as its first state.
    /// A run that exists already keeps its attributes (as it ignores `initial`).
    ///
    /// # Errors
    /// As [`start`](Self::start); [`Error::InvalidAttribute`](crate::Error::InvalidAttribute)
    /// for an attribute [`check_attribute`](crate::check_attribute) refuses (nothing is
    /// written).
    pub async fn start_with<W: Workflow>(
        &self,
        run_id: &str,
        initial: W,
        options: StartOptions,
    ) -> Result<RunInfo> {
        validate_run_id_lookup(run_id)?;
        let compiled = W::SCHEMA_HASH.pinned();
        if self.registry(|r| r.driver(W::NAME, compiled)).is_none() {
            return Err(Error::NotRegistered {
                workflow: W::NAME.to_owned(),
            });
        }
        // Draining or shut down, this runtime drives no more runs: the run is recorded for
        // the next process or worker, its first attempt not begun (before, it was recorded
        // begun and left without a driver: the next process counted an interruption).
        if self.inner.background.is_draining() {
            return self.enqueue(run_id, initial, options).await;
        }
        let registrations = self.registry(Registry::generation);
        let claim = match self.claim(run_id).await {
            Ok(claim) => claim,
            Err(active @ Error::RunActive { .. }) => {
                // Driven here already: that is what `start` would have arranged.
                return match self.store().run_info(run_id).await? {
                    Some(info) => {
                        check_workflow::<W>(&info)?;
                        Ok(info)
                    }
                    None => Err(active),
                };
            }
            Err(e) => return Err(e),
        };
        let span = tracing::info_span!("run", run_id, workflow = W::NAME);
        let prepared = async {
            let state = initial.state().name();
            let attributes = || options.into_attributes(run_id, state);
            match self
                .drive(&claim)
                .find_or_create(initial, attributes)
                .await?
            {
                Found::Created(entered) => Ok(Prepared {
                    entered,
                    version: compiled,
                    accepted: None,
                }),
                Found::Existing(found) => {
                    check_workflow::<W>(&found.0)?;
                    let known = self.registry(|r| r.known(W::NAME));
                    let stored = found.0.schema;
                    match self.prepare(&claim, found, &known, OnBlock::Return).await? {
                        Routing::Ready(prepared) => Ok(*prepared),
                        Routing::Blocked(blocked) => Err(Error::SchemaMismatch {
                            run_id: run_id.to_owned(),
                            workflow: W::NAME.to_owned(),
                            stored,
                            compiled,
                            changes: changes_or::<W>(self, blocked.changes, stored).await,
                        }),
                    }
                }
            }
        }
        .instrument(span)
        .await;
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                drop(claim);
                if matches!(e, Error::SchemaMismatch { .. }) {
                    self.route_again_if_registered(run_id, registrations).await;
                }
                return Err(e);
            }
        };
        let info = prepared.entered.info.clone();
        self.spawn_background(Start::Claimed(Box::new((claim, prepared))));
        Ok(info)
    }

    /// Records the run `run_id` of workflow `W` in `initial` without driving it here: the
    /// process or worker that serves `W` takes it up, as it takes up any run that needs a
    /// driver (on PostgreSQL, at once: the commit notifies the workers that listen, and the
    /// others claim it at their next poll; on a redb store, at the next
    /// [`resume_all`](Self::resume_all) of the process that holds the file). For a program
    /// that only queues work, such as a web front-end of a fleet of workers: no handler need be
    /// registered. If this runtime registers `W`, it drives the run itself, as
    /// [`start`](Self::start) would. The run's first attempt is not begun (the row's attempt
    /// is 0): the driver that takes it up begins attempt 1, counting no interruption. A run
    /// that exists already is left as it is (`initial` is ignored) and its row returned, so
    /// queuing the same run id twice queues one run.
    ///
    /// # Errors
    /// [`Error::NotInitial`](crate::Error::NotInitial) if `initial` is not `W`'s initial
    /// state; [`Error::WorkflowMismatch`](crate::Error::WorkflowMismatch) if the run exists as
    /// another workflow; [`Error::InvalidRunId`](crate::Error::InvalidRunId),
    /// [`Error::InvalidAttribute`](crate::Error::InvalidAttribute) and
    /// [`Error::PayloadTooLarge`](crate::Error::PayloadTooLarge) for what a creation refuses
    /// (nothing is written); a store error.
    pub async fn enqueue<W: Workflow>(
        &self,
        run_id: &str,
        initial: W,
        options: StartOptions,
    ) -> Result<RunInfo> {
        crate::names::validate_run_id(run_id)?;
        let max = self.inner.config.settings.max_payload_bytes;
        let (info, record) = crate::run::driver::first_record(
            run_id,
            &initial,
            &self.inner.config.settings.clock,
            max,
            false,
        )?;
        let state = record.state.clone();
        let found = |info: RunInfo| {
            check_workflow::<W>(&info)?;
            Ok(info)
        };
        if let Some(info) = self.store().run_info(run_id).await? {
            return found(info);
        }
        let write = crate::store::Write::Create {
            attributes: options.into_attributes(run_id, &state)?,
            info,
            record: record.to_bytes(),
            schema_text: W::SCHEMA,
        };
        // No lease: the write tells the workers that a run needs a driver (`Effects::wakes`).
        let info = match self.store().write(None, write).await {
            Ok(reply) => reply.into_run(run_id)?,
            // Queued (or started) meanwhile by another caller: that run stands.
            Err(Error::SequenceConflict { .. }) => match self.store().run_info(run_id).await? {
                Some(info) => return found(info),
                None => {
                    return Err(Error::RunNotFound {
                        run_id: run_id.to_owned(),
                    });
                }
            },
            Err(e) => return Err(e),
        };
        tracing::info!(run_id, workflow = W::NAME, state, "run queued");
        if info.status == RunStatus::Running {
            self.spawn_driver(W::NAME, run_id);
        }
        Ok(info)
    }

    /// Routes a found run for an attached driver of `W`: to `W` itself (unblocking or
    /// migrating it as needed), returning it with the schema `W` accepts it as, if it does;
    /// else refuses with `SchemaMismatch`, blocking the run only if no registered version can
    /// drive it either.
    async fn route_attached<W: Workflow>(
        &self,
        claim: &Claim,
        found: (RunInfo, TransitionRecord),
    ) -> Result<(Entered, Option<SchemaHash>)> {
        check_workflow::<W>(&found.0)?;
        let compiled = W::SCHEMA_HASH.pinned();
        let stored = found.0.schema;
        let only_w = [KnownVersion::of::<W>()];
        let blocked = match self
            .prepare(claim, found.clone(), &only_w, OnBlock::Leave)
            .await?
        {
            Routing::Ready(prepared) => return Ok((prepared.entered, prepared.accepted)),
            Routing::Blocked(blocked) => blocked,
        };
        let mut known = self.registry(|r| r.known(W::NAME));
        if !known.iter().any(|k| k.stored.hash == compiled) {
            known.push(only_w[0]);
        }
        let (info, _) = &found;
        // Block it only if no registered version takes it either. (A failed migration blocked
        // it already; the store then writes nothing.)
        if matches!(self.route_of(info, &known).await?, Route::Block(_)) {
            self.block_run(claim, info, &blocked, false).await?;
        }
        Err(Error::SchemaMismatch {
            run_id: info.run_id.clone(),
            workflow: W::NAME.to_owned(),
            stored,
            compiled,
            changes: changes_or::<W>(self, blocked.changes, stored).await,
        })
    }

    /// How the run of row `info` (latest record `record`) ended, as `W`: its terminal state,
    /// or [`Error::RunFailed`](crate::Error::RunFailed) or
    /// [`Error::RunCancelled`](crate::Error::RunCancelled); `None` if it has not ended.
    fn end_as<W: Workflow>(&self, info: &RunInfo, record: TransitionRecord) -> Option<Result<W>> {
        let run_id = info.run_id.clone();
        Some(match info.status {
            RunStatus::Completed => self.terminal_as::<W>(info, record),
            RunStatus::Failed => Err(Error::RunFailed {
                run_id,
                state: info.state.clone(),
                seq: info.seq,
                attempts: info.attempt.saturating_sub(info.attempt_base),
                interrupted: info.interrupted,
                last_error: info.error.clone().unwrap_or_default(),
                source: None,
            }),
            RunStatus::Cancelled => Err(Error::RunCancelled {
                run_id,
                state: info.state.clone(),
                seq: info.seq,
                reason: info.cancel.clone().unwrap_or_default(),
            }),
            RunStatus::Running | RunStatus::Waiting | RunStatus::Blocked => return None,
        })
    }

    /// Waits until the run `run_id` has ended and returns its terminal state (a run ended
    /// by another worker of a shared store is seen within 200 ms).
    ///
    /// # Errors
    /// [`Error::RunNotFound`](crate::Error::RunNotFound); [`Error::WorkflowMismatch`](crate::Error::WorkflowMismatch); [`Error::RunFailed`](crate::Error::RunFailed) or
    /// [`Error::RunCancelled`](crate::Error::RunCancelled) if it ended so; [`Error::RunBlocked`](crate::Error::RunBlocked) if it is (or becomes)
    /// blocked: no registered version can drive it (wait again once one is registered);
    /// [`Error::Decode`](crate::Error::Decode); [`Error::Storage`](crate::Error::Storage).
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
            if let Some(end) = self.end_as::<W>(&info, record) {
                return end;
            }
            // Not ended, but nothing here will drive it until a version or migration that
            // routes it is registered: say so rather than wait for good.
            if info.status == RunStatus::Blocked {
                return Err(Error::RunBlocked {
                    run_id: run_id.to_owned(),
                    seq: info.seq,
                    reason: info.block.map(|b| b.reason).unwrap_or_default(),
                    state: info.state,
                });
            }
            // Running or waiting.
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

    /// Resumes every unfinished run of the registered workflows, reading the status index
    /// (never a history): running runs get a background driver at once; waiting runs whose
    /// event arrived or whose time passed too; the others stay parked, holding no task, with
    /// a timer if they wait for a time. With a store shared by several workers, only runs no
    /// live worker holds are taken (each with its lease). Call it at startup (and, with a
    /// shared store, periodically: see [`serve`](Self::serve)).
    ///
    /// Returns the runs given a driver, and how many were left parked ([`Resumed`]). The
    /// parked runs are read lean, in one pass with the ready ones
    /// ([`Store::claim_ready_and_parked`](crate::Store::claim_ready_and_parked)), and
    /// counted, not returned: a process may hold a million of them.
    ///
    /// All or nothing: every read comes first, then the drivers and timers start, which
    /// cannot fail. So when it returns an error it has resumed nothing (no driver started,
    /// no timer armed, no lease taken) and can be called again as it was; [`serve`](Self::serve)
    /// does so by itself until the fault clears.
    ///
    /// First, the registered versions' claims to accept older schemas are checked against
    /// the store's descriptions of them, once per version (as [`RuntimeBuilder::open`](crate::RuntimeBuilder::open)
    /// does for redb; here for any store, and for versions registered after the open).
    ///
    /// # Errors
    /// [`Error::AcceptsRefused`](crate::Error::AcceptsRefused) if a registered version claims
    /// to accept a stored schema whose differences from it are breaking;
    /// [`Error::Storage`](crate::Error::Storage) or [`Error::Decode`](crate::Error::Decode) if the index cannot be read.
    pub async fn resume_all(&self) -> Result<Resumed> {
        self.check_accepts().await?;
        self.inner.started.store(true, Ordering::Release);
        let filters = self.registry(|r| r.claim_filters());
        let (mut resumed, mut taken) = self.resume_from(&filters, self.places_left(), true).await?;
        // Blocked runs this build can route now (once per start and per registration: a run
        // whose migration still fails is not tried again at every poll).
        for info in self.sweep_blocked().await? {
            if taken.insert(info.run_id.clone()) {
                resumed.driven.push(info);
            }
        }
        resumed
            .driven
            .sort_by(|a, b| (&a.workflow, &a.run_id).cmp(&(&b.workflow, &b.run_id)));
        tracing::info!(
            driven = resumed.driven.len(),
            parked = resumed.parked,
            "resumed unfinished runs"
        );
        Ok(resumed)
    }

    /// What [`resume_all`](Self::resume_all) does for the workflows of `filters`, after its
    /// checks: reads the ready runs (at most `limit`, each claimed with its lease) and, on a
    /// store only this process opens, the parked ones, in one pass; on a shared store, the
    /// waiting runs of the older versions this build takes; then gives a driver to the ready
    /// runs and to the waiting runs recorded by a version this build does not compile, and a
    /// timer to each parked run waiting for a time (if `arm`). Returns what it did, and the
    /// run ids it gave a driver.
    ///
    /// All or nothing: every read comes first; a failed read gives the leases back and
    /// starts nothing.
    ///
    /// # Errors
    /// The store's errors, reading the runs.
    async fn resume_from(
        &self,
        filters: &[ClaimFilter],
        limit: usize,
        arm: bool,
    ) -> Result<(Resumed, HashSet<String>)> {
        // A store only this process opens: the parked runs, whose timers are armed here,
        // read in the same pass as the ready runs. (With a shared store, `claim_ready`
        // returns waiting runs once their time has come.) Asked even at the limit (for no
        // run): a shared store counts the call as this worker's sign of life, for the runs
        // of the schemas it routes (`Store::claim_ready`).
        let asked = std::time::Instant::now();
        let (ready, parked, older) = if self.store().lease_ttl().is_none() {
            let (ready, parked) = self.store().claim_ready_and_parked(filters, limit).await?;
            (ready, parked, HashMap::new())
        } else {
            // A shared store hands out waiting runs only once they are ready: the waiting
            // runs of the older versions this build takes are listed here (before any lease
            // is taken), to be taken now as on a store only this process opens.
            let older = self.waiting_of_older_versions(filters).await?;
            (
                self.store().claim_ready(filters, limit).await?,
                Vec::new(),
                older,
            )
        };
        // A waiting run recorded by a version this build does not compile is handed to a
        // driver now, rather than when its event or its time comes: one this build accepts
        // or migrates is taken by the new version (its record committed) and its state's
        // handler runs again under it, so that the run waits for what the new version waits
        // for (an event only it declares can be sent at once); one it cannot route is
        // blocked, visibly and once. Read before any driver starts: a failed read gives the
        // leases back, and leaves nothing resumed.
        let mut to_route = match self.to_route(&parked).await {
            Ok(mut rows) => {
                rows.extend(older);
                rows
            }
            Err(e) => {
                for (_, lease) in &ready {
                    let _ = self.store().release(lease).await;
                }
                return Err(e);
            }
        };
        let mut taken: HashSet<String> = HashSet::with_capacity(ready.len());
        let mut resumed = Resumed::default();
        for (info, lease) in ready {
            self.inner.claims.asked_at(&info.run_id, asked);
            self.spawn_driver_with(&info.workflow, &info.run_id, Some(lease));
            taken.insert(info.run_id.clone());
            resumed.driven.push(info);
        }
        let mut timers = Vec::new();
        for run in parked {
            if taken.contains(&run.run_id) {
                continue;
            }
            if let Some(info) = to_route.remove(&run.run_id) {
                self.spawn_driver_with(&run.workflow, &run.run_id, None);
                taken.insert(run.run_id);
                resumed.driven.push(info);
                continue;
            }
            resumed.parked += 1;
            if let (true, Some(from)) = (arm, run.from_ms) {
                timers.push((from, run.workflow, run.run_id));
            }
        }
        resumed.timers = timers.len();
        self.arm_timers(timers);
        // The rest to route: a shared store's waiting runs of older versions.
        for (run_id, info) in to_route {
            if taken.insert(run_id.clone()) {
                self.spawn_driver_with(&info.workflow, &run_id, None);
                resumed.driven.push(info);
            }
        }
        Ok((resumed, taken))
    }

    /// How many more runs this runtime may drive under
    /// [`max_active_runs`](crate::RuntimeBuilder::max_active_runs) (unbounded without it).
    fn places_left(&self) -> usize {
        match self.inner.config.max_active_runs {
            Some(max) => max.saturating_sub(self.inner.claims.count()),
            None => usize::MAX,
        }
    }

    /// After a registration (of a version or migration of `workflow`; `first`: the first
    /// version of it this runtime registers) on a running runtime: its runs are resumed as
    /// [`resume_all`](Self::resume_all) resumes them at a start ([`resume_from`](Self::resume_from)).
    /// The waiting runs whose schema no registered version has get a driver, which moves each
    /// to the version that accepts or migrates it (it then waits for what that version waits
    /// for) or blocks it, visibly and once (not left looking healthy while it waits). On a
    /// store only this process opens, a first version's running and ready runs get a driver
    /// too and its sleeping runs a timer; on a shared store, `serve`'s polls claim the ready
    /// runs. Returns how many runs got a driver.
    ///
    /// # Errors
    /// The store's errors, listing the runs.
    pub(crate) async fn resume_registered(&self, workflow: &str, first: bool) -> Result<usize> {
        let filters: Vec<ClaimFilter> = self
            .registry(|r| r.claim_filters())
            .into_iter()
            .filter(|f| f.workflow == workflow)
            .collect();
        let first_here = first && self.store().lease_ttl().is_none();
        let limit = if first_here { self.places_left() } else { 0 };
        let (resumed, _) = self.resume_from(&filters, limit, first_here).await?;
        Ok(resumed.driven.len())
    }

    /// The rows of the waiting runs (by run id), of the schemas `filters` route that no version
    /// this build compiles has (those its versions accept, and those its migrations start
    /// from). A build that routes no such schema reads nothing; one that does lists the
    /// waiting runs of those schemas once, at its start ([`Store::list_of_schemas`](crate::store::Store::list_of_schemas): on
    /// PostgreSQL one indexed statement, whose cost grows with the runs of the older schemas,
    /// not with the workflow's), and each is then taken by the new version, or by another
    /// worker's driver first: the lease decides.
    async fn waiting_of_older_versions(
        &self,
        filters: &[ClaimFilter],
    ) -> Result<HashMap<String, RunInfo>> {
        let mut out = HashMap::new();
        for filter in filters {
            let Some(schemas) = &filter.schemas else {
                continue;
            };
            let known = self.registry(|r| r.known(&filter.workflow));
            let older: Vec<SchemaHash> = schemas
                .iter()
                .copied()
                .filter(|h| !known.iter().any(|k| k.stored.hash == *h))
                .collect();
            if older.is_empty() {
                continue;
            }
            let waiting = self
                .store()
                .list_of_schemas(RunStatus::Waiting, &filter.workflow, &older)
                .await?;
            out.extend(waiting.into_iter().map(|info| (info.run_id.clone(), info)));
        }
        Ok(out)
    }

    /// The rows of the `parked` runs recorded by a version this build does not compile (it
    /// accepts or migrates them, or must block them), by run id. A run of a compiled version
    /// stays parked: no read, no routing (the common case, kept free of per-run work for
    /// many parked runs; after a deploy, each run of the old version is read once, since
    /// routing it moves it to the new version's schema or blocks it).
    async fn to_route(&self, parked: &[ParkedRun]) -> Result<HashMap<String, RunInfo>> {
        let mut known: HashMap<&str, Vec<KnownVersion>> = HashMap::new();
        let mut out = HashMap::new();
        for run in parked {
            let known = known
                .entry(&*run.workflow)
                .or_insert_with(|| self.registry(|r| r.known(&run.workflow)));
            if known.iter().any(|k| k.stored.hash == run.schema) {
                continue;
            }
            if let Some(info) = self.store().run_info(&run.run_id).await? {
                out.insert(run.run_id.clone(), info);
            }
        }
        Ok(out)
    }
}

/// `changes` (why the route blocked the run), or, when it lists nothing (a failed
/// migration), what changed from the stored schema to `W`'s.
async fn changes_or<W: Workflow>(
    rt: &Runtime,
    changes: SchemaDiff,
    stored: SchemaHash,
) -> SchemaDiff {
    if changes.is_empty() {
        return schema_changes::<W>(rt.store(), stored).await;
    }
    changes
}
