//! Registered versions of workflows: the handler of each, and the background task that
//! routes one run to the version that takes it (driving, migrating or blocking it) and drives
//! it until the run ends or parks.

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::Instrument;

use crate::error::{Error, Result};
use crate::migrate::{Migrate, Migration, Versioned};
use crate::route::KnownVersion;
use crate::row::RunInfo;
use crate::run::attempts::is_ready;
use crate::run::dispatch::Dispatch;
use crate::run::driver::{Driven, Mode};
use crate::runtime::claims::Claim;
use crate::runtime::evolve::{OnBlock, Routing};
use crate::runtime::handle::{Driver, Inner, Prepared, Registry, Runtime, Start, Stopped, Version};
use crate::runtime::scheduler::{Background, Hooks};
use crate::status::RunStatus;
use crate::store::{BoxFuture, Lease};

/// A registered version's handler.
pub(crate) struct Registered<W, H> {
    handler: Arc<H>,
    _workflow: PhantomData<fn() -> W>,
}

impl<W, H> Registered<W, H>
where
    W: Dispatch<H>,
    H: Send + Sync + 'static,
{
    /// Version `W` of its workflow, driven by `handler`.
    pub(crate) fn version(handler: H) -> Version {
        Version {
            known: KnownVersion::of::<W>(),
            driver: Arc::new(Registered::<W, H> {
                handler: Arc::new(handler),
                _workflow: PhantomData,
            }),
        }
    }
}

impl<W, H> Driver for Registered<W, H>
where
    W: Dispatch<H>,
    H: Send + Sync + 'static,
{
    fn drive<'a>(
        &'a self,
        runtime: &'a Runtime,
        claim: &'a Claim,
        prepared: Prepared,
    ) -> BoxFuture<'a, Result<Stopped>> {
        Box::pin(async move {
            let drive = runtime.drive(claim);
            let entered = if prepared.entered.fresh {
                prepared.entered
            } else {
                let Prepared {
                    entered, accepted, ..
                } = prepared;
                drive.check::<W>(entered, accepted).await?
            };
            match drive
                .drive_loop::<W, H>(entered, &*self.handler, Mode::Background)
                .await?
            {
                Driven::Parked(info) => Ok(Stopped::Parked(info)),
                Driven::Ended(_) => Ok(Stopped::Ended),
                Driven::HandedOver => Ok(Stopped::HandedOver),
            }
        })
    }
}

impl Runtime {
    /// Spawns the background task that claims the run (unless `start` holds it already),
    /// routes it to the version that takes it, and drives it until it ends or parks. While
    /// the runtime drains ([`Runtime::drain`]), a run to find is left to the next process or
    /// worker (a lease the store granted for it goes back).
    pub(crate) fn spawn_background(&self, start: Start) {
        let start = match start {
            Start::Find { lease, .. } if self.inner.background.is_draining() => {
                if let Some(lease) = lease {
                    self.inner.claims.release_later(lease);
                }
                return;
            }
            start => start,
        };
        let rt = self.clone();
        let task = async move {
            let registrations = rt.registry(Registry::generation);
            let (claim, prepared, granted) = match start {
                Start::Claimed(claimed) => {
                    let (claim, prepared) = *claimed;
                    (claim, Some(Box::new(prepared)), false)
                }
                Start::Find {
                    run_id,
                    lease,
                    waking,
                } => {
                    let granted = lease.is_some();
                    let claimed = Box::pin(rt.claim_with(&run_id, lease)).await;
                    // Claimed, the run counts as driven; not, it frees its place.
                    drop(waking);
                    match claimed {
                        Ok(claim) => (claim, None, granted),
                        // Driven already, here or by another worker: it will see the news.
                        Err(Error::RunActive { .. }) => return,
                        Err(e) => {
                            tracing::warn!(run_id, error = %e, "cannot claim the run");
                            return;
                        }
                    }
                }
            };
            let run_id = claim.run_id().to_owned();
            let span = tracing::info_span!("run", run_id = %run_id);
            let (workflow, parent, result) = rt
                .route_and_drive(&claim, prepared, granted)
                .instrument(span)
                .await;
            drop(claim);
            // Boxed, as the claim above and the routing in `route_and_drive` are: a task's
            // future is as large as its largest state, and these run only before and after
            // the drive, while a driver spends its life (a handler that waits on a model, a
            // hundred thousand drivers at a start) in the drive itself, whose future the
            // driver boxes. A driver's task went from 7.8 KiB to about 1 KiB.
            Box::pin(rt.after_background(
                &workflow,
                &run_id,
                parent.as_deref(),
                result,
                registrations,
            ))
            .await;
            rt.inner.background.notify_ended();
        };
        self.inner.background.spawn_driver(task);
    }

    /// Routes the run `claim` holds (unless `prepared` is given) and drives it; returns its
    /// workflow's name and its parent's run id (if it was driven and has one) with the outcome
    /// (`Ok(None)`: blocked, or gone). `granted`: the claim's lease came from
    /// [`Store::claim_ready`](crate::store::Store::claim_ready).
    ///
    /// `prepared` is boxed, and so is the routing: the future of a driver holds no more than
    /// the pointers while it drives (see `spawn_background`).
    async fn route_and_drive(
        &self,
        claim: &Claim,
        prepared: Option<Box<Prepared>>,
        granted: bool,
    ) -> (String, Option<String>, Result<Option<Stopped>>) {
        let prepared = match prepared {
            Some(p) => p,
            None => match Box::pin(self.find_and_route(claim, granted)).await {
                Ok(p) => p,
                Err(stopped) => return stopped,
            },
        };
        let workflow = prepared.entered.info.workflow.clone();
        // A run's parent never changes: known now, it need not be read again at the end.
        let parent = prepared
            .entered
            .info
            .parent
            .as_ref()
            .map(|p| p.run_id.clone());
        let Some(driver) = self.registry(|r| r.driver(&workflow, prepared.version)) else {
            let error = Error::NotRegistered {
                workflow: workflow.clone(),
            };
            return (workflow, parent, Err(error));
        };
        let span = tracing::info_span!("workflow", workflow = %workflow);
        let result = driver
            .drive(self, claim, *prepared)
            .instrument(span)
            .await
            .map(Some);
        (workflow, parent, result)
    }

    /// The routing half of [`route_and_drive`](Self::route_and_drive) for a run found by id:
    /// reads the run and routes it; `Err` is what `route_and_drive` returns when the run is
    /// not to be driven (blocked, gone, another worker's, or an error).
    async fn find_and_route(
        &self,
        claim: &Claim,
        granted: bool,
    ) -> Result<Box<Prepared>, (String, Option<String>, Result<Option<Stopped>>)> {
        let found = match self.drive(claim).find().await {
            Ok(Some(found)) => found,
            Ok(None) => return Err((String::new(), None, Ok(None))),
            Err(e) => return Err((String::new(), None, Err(e))),
        };
        let workflow = found.0.workflow.clone();
        // A store shared with other workers hands a worker a run of a schema it cannot route
        // only when no live worker can (`Store::claim_ready`): that run is blocked here, once.
        // Found otherwise (an event sent from here), a worker with the run's version takes
        // it: nothing written, nothing said.
        if !granted && !self.routes_here(&found.0) {
            tracing::debug!("not a schema this worker routes; left to another worker");
            return Err((workflow, None, Ok(None)));
        }
        let known = self.registry(|r| r.known(&workflow));
        match self.prepare(claim, found, &known, OnBlock::Warn).await {
            Ok(Routing::Ready(p)) => Ok(p),
            Ok(Routing::Blocked(_)) => Err((workflow, None, Ok(None))),
            Err(e) => Err((workflow, None, Err(e))),
        }
    }

    /// Whether this worker drives (or blocks) the run: always with a store only this process
    /// opens; with a shared one, only if its schema is one this build can route (what its
    /// claims ask for), so that a worker without the run's version leaves it to one that has
    /// it, during a rolling deploy.
    fn routes_here(&self, info: &RunInfo) -> bool {
        self.store().lease_ttl().is_none()
            || self.registry(|r| {
                r.claim_filters()
                    .iter()
                    .any(|f| f.workflow == info.workflow && f.admits(info.schema))
            })
    }

    /// What follows a background driver's end: a timer for a parked run, a log line for an
    /// error, another driver for news that reached the run while this one stopped.
    /// `registrations`: the registry's generation when the driver began.
    async fn after_background(
        &self,
        workflow: &str,
        run_id: &str,
        parent: Option<&str>,
        result: Result<Option<Stopped>>,
        registrations: u64,
    ) {
        let ended = matches!(
            result,
            Ok(Some(Stopped::Ended)) | Err(Error::RunFailed { .. } | Error::RunCancelled { .. })
        );
        // `hand_off`: the run is free for news that reached it meanwhile; `blocked`: this
        // build could not drive it (or it is gone).
        let (hand_off, blocked) = match result {
            Ok(Some(Stopped::Parked(info))) => {
                if let Some(until) = info.wait.as_ref().and_then(|w| w.until_ms) {
                    self.add_timer(until, workflow, run_id);
                }
                (true, false)
            }
            Ok(Some(Stopped::Ended)) => (true, false),
            // Let go for a drain: the next process or worker takes it up.
            Ok(Some(Stopped::HandedOver)) => {
                self.inner.background.count_handed_over();
                tracing::info!(run_id, "run let go at a state boundary (draining)");
                (false, false)
            }
            // Blocked (said once, by the block), or gone.
            Ok(None) => (false, true),
            Err(e @ (Error::RunFailed { .. } | Error::RunCancelled { .. })) => {
                tracing::info!(run_id, error = %e, "run ended");
                (true, false)
            }
            // Its records are of a shape this version does not compile, or another build
            // blocked it: trying again changes nothing (issue 14). Said once; the run is left
            // as it is, for a build that knows its schema.
            Err(
                e @ (Error::SchemaMismatch { .. }
                | Error::WorkflowMismatch { .. }
                | Error::RunBlocked { .. }
                | Error::MigrationRefused { .. }),
            ) => {
                tracing::warn!(run_id, error = %e, "this build cannot drive the run; not retried");
                (false, true)
            }
            Err(e) => {
                // A storage error, say: try again in a second rather than at once.
                tracing::error!(run_id, error = %e, "background driver stopped; retrying in 1 s");
                if !workflow.is_empty() {
                    self.add_timer(self.now_ms() + 1000, workflow, run_id);
                }
                (false, false)
            }
        };
        // Whatever reached the run while this driver still held it (an event, a
        // cancellation, a retry of the failed run) found it driven and only signalled the
        // driver, which was stopping. Look again now that the run is free.
        if hand_off && needs_driver(self, run_id).await {
            self.spawn_driver(workflow, run_id);
        }
        if blocked {
            self.route_again_if_registered(run_id, registrations).await;
        }
        if ended {
            self.forget_ended(run_id);
            if let Some(parent) = parent {
                self.wake_parent(run_id, parent).await;
            }
        }
    }

    /// Starts a background driver for the run unless one drives it already (in this process,
    /// or, through its lease, in another worker).
    pub(crate) fn spawn_driver(&self, workflow: &str, run_id: &str) {
        self.spawn_driver_with(workflow, run_id, None);
    }

    /// As [`spawn_driver`](Self::spawn_driver), with a lease the store granted already.
    pub(crate) fn spawn_driver_with(&self, workflow: &str, run_id: &str, lease: Option<Lease>) {
        self.spawn_finding(workflow, run_id, lease, false);
    }

    /// Starts a background driver that claims the run `run_id` of `workflow` (see
    /// [`spawn_driver_with`](Self::spawn_driver_with)); `woken`: by its timer, counted against
    /// `max_active_runs` from now.
    fn spawn_finding(&self, workflow: &str, run_id: &str, lease: Option<Lease>, woken: bool) {
        if !self.registry(|r| r.names().iter().any(|n| n == workflow)) {
            return;
        }
        if self.inner.claims.is_active(run_id) {
            // Driven here already: a lease granted meanwhile goes back.
            if let Some(lease) = lease {
                self.inner.claims.release_later(lease);
            }
            return;
        }
        self.spawn_background(Start::Find {
            run_id: run_id.to_owned(),
            lease,
            waking: woken.then(|| self.inner.claims.waking()),
        });
    }

    /// Whether this runtime takes up the run `info` when it is woken: it drives it now, or
    /// registers a version of its workflow (see [`wake`](Self::wake)). For the control
    /// endpoint's answer to a send.
    #[cfg(feature = "control")]
    pub(crate) fn drives(&self, info: &RunInfo) -> bool {
        self.inner.claims.signals(&info.run_id).is_some()
            || self.registry(|r| !r.known(&info.workflow).is_empty())
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

    /// Registers `handler` as the driver of version `W` of workflow `W::NAME`:
    /// [`start`](Self::start), [`resume_all`](Self::resume_all), [`send`](Self::send) and the
    /// timer of a parked run then drive, in the background, the runs whose schema is `W`'s
    /// (or that `W` accepts, or that a registered migration takes to `W`). Versions of one
    /// workflow live side by side, each driving the runs of its own schema; registering a
    /// version again (the same schema hash) replaces its handler, for runs driven afterwards.
    ///
    /// On a runtime that has resumed its runs already, the workflow's runs are resumed as
    /// [`resume_all`](Self::resume_all) resumes them at a start, in a background task: blocked
    /// runs this version lets the runtime route are unblocked and driven, waiting runs of a
    /// schema no registered version has are taken by the version that accepts or migrates
    /// them, or blocked; and, for the workflow's first version, on a store only this process
    /// opens, its running and ready runs get a driver and its sleeping runs a timer.
    pub fn register<W, H>(&self, handler: H)
    where
        W: Dispatch<H>,
        H: Send + Sync + 'static,
    {
        let first = !self.registry(|r| r.names().iter().any(|n| n == W::NAME));
        self.with_registry(|r| r.add_version::<W>(Registered::<W, H>::version(handler)));
        self.registered(W::NAME, first);
    }

    /// Registers the migration `impl Migrate<Old> for New`: a run stored by version `Old` is
    /// migrated to `New` when it is next driven (and through chains, `Old` → `New` → a later
    /// version that a migration reads `New` for), the migration committed as a record of its
    /// own. See [`Migrate`].
    ///
    /// On a runtime that has resumed its runs already, blocked runs that the migration lets
    /// the runtime route, and waiting runs of its `Old` schema that no registered version
    /// has, are migrated and driven at once (in a background task).
    pub fn migration<Old: Versioned, New: Migrate<Old>>(&self) {
        self.with_registry(|r| r.add_migration(Migration::of::<Old, New>()));
        self.registered(New::NAME, false);
    }

    /// After a registration: look at the blocked runs again, at once if the runtime is
    /// running.
    fn registered(&self, workflow: &'static str, first: bool) {
        self.inner.sweep.store(true, Ordering::Release);
        if self.inner.started.load(Ordering::Acquire)
            && tokio::runtime::Handle::try_current().is_ok()
        {
            let rt = self.clone();
            self.inner.background.spawn_task(async move {
                // A wrong claim is refused by each run's routing (the run is blocked);
                // said here once, at the registration.
                if let Err(e) = rt.check_accepts().await {
                    tracing::error!(error = %e, "a registered version's claim to accept an older schema is wrong");
                }
                if let Err(e) = rt.sweep_blocked().await {
                    tracing::warn!(error = %e, "could not look at the blocked runs");
                }
                // The workflow's runs, resumed as at a start: parked runs of a schema no
                // registered version has are taken now (or blocked), so that an event only
                // the new version declares can be sent, and a run this build cannot route
                // does not look healthy while it waits.
                if let Err(e) = rt.resume_registered(workflow, first).await {
                    tracing::warn!(error = %e, workflow, "could not resume the runs of a workflow registered on a running runtime");
                }
            });
        }
    }
}

impl Hooks for Inner {
    fn background(&self) -> &Background {
        &self.background
    }

    fn timer_due(self: Arc<Self>, workflow: &str, run_id: &str) {
        Runtime { inner: self }.spawn_finding(workflow, run_id, None, true);
    }

    fn wakes_allowed(&self) -> usize {
        match self.config.max_active_runs {
            Some(max) => max.saturating_sub(self.claims.driven_or_waking()),
            None => usize::MAX,
        }
    }

    fn freed(&self) -> Arc<tokio::sync::Notify> {
        self.claims.freed()
    }

    fn renew(self: Arc<Self>) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move { self.claims.renew().await })
    }
}

/// Whether a run that no driver holds should be driven: it is running, or waiting with its
/// wait over, or its cancellation was asked for and it has not ended.
async fn needs_driver(rt: &Runtime, run_id: &str) -> bool {
    let Ok(Some(info)) = rt.store().run_info(run_id).await else {
        return false;
    };
    is_ready(rt.store(), &info, rt.now_ms())
        .await
        .unwrap_or(false)
}
