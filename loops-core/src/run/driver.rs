//! The drive loop: the one code path that takes a run from its last record to its end.
//!
//! A first run and a resume are the same: [`Drive::enter`] looks the run up (a miss creates
//! it), then [`Drive::drive_loop`] repeats: decode the latest record, run the state's handler
//! with the state's recorded steps preloaded (so completed steps hit and are skipped), commit
//! the transition. Failures, waits and cancellation are statuses of the run's row, handled at
//! the top of the loop ([`Drive::settle`]).
//!
//! The driver knows one run, the store and the settings it is given: nothing of the runtime
//! that claimed the run for it.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tracing::Instrument;

use crate::error::{Error, Result, error_chain};
use crate::hint::retry_hint;
use crate::panics::panic_message;
use crate::record::{FailureRecord, FailureSource, TransitionRecord};
use crate::row::RunInfo;
use crate::run::attempts::{failed_attempts, is_ready, jitter_unit};
use crate::run::context::{Context, RunScope};
use crate::run::dispatch::Dispatch;
use crate::run::settings::{Held, Settings, logged_text};
use crate::schema::{SchemaDiff, SchemaHash};
use crate::status::RunStatus;
use crate::store::{AfterFailure, Store, Write};
use crate::workflow::{BoxError, StateId, Workflow};

/// How often an attached driver waiting on a store shared by several workers reads its run's
/// row again, to see an event or a cancellation that another process wrote.
pub(crate) const SHARED_POLL: Duration = Duration::from_millis(200);

/// How long a driver waits after a store fault (an [`Error::Storage`] or
/// [`Error::Database`] while it drives the run) before it looks at the run again: the first
/// wait, doubled after each fault that follows without the run moving to a next state, up
/// to the second.
pub(crate) const FAULT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(10));

/// How a driver treats a run that parks (waits for an event or a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The caller awaits the end of the run (`Runtime::run`): wait in place.
    Attached,
    /// A background driver of a registered workflow: stop, and let the scheduler or
    /// `Runtime::send` start a driver again when the wait can end.
    Background,
}

/// Where a driver stopped.
pub(crate) enum Driven<W> {
    /// The run reached a terminal state.
    Ended(W),
    /// The run is waiting and holds no task ([`Mode::Background`] only).
    Parked(Box<RunInfo>),
}

/// A run as found (or created) by [`Drive::enter`].
pub(crate) struct Entered {
    pub(crate) info: RunInfo,
    pub(crate) record: TransitionRecord,
    /// Whether the current state's attempt was started by the commit that created it in this
    /// process (so no new attempt is counted before its first execution).
    pub(crate) fresh: bool,
}

enum Failure {
    Handler(BoxError),
    Timeout(Duration),
    /// The handler panicked: the panic's message.
    Panic(String),
}

enum Outcome<W> {
    Next(W),
    Failed(Failure),
    Parked,
    /// Another worker took the run over (its lease lapsed here).
    Lost,
}

/// One run's driver: the run it holds, the store and the settings it drives it with.
pub(crate) struct Drive<'a> {
    pub(crate) store: &'a Arc<dyn Store>,
    pub(crate) settings: &'a Settings,
    pub(crate) held: &'a Held,
}

/// Where the drive loop stands between two looks at the run's row.
struct Progress {
    info: RunInfo,
    record: TransitionRecord,
    /// Whether the current attempt was started by a commit of this driver (a creation, a
    /// transition or a wake), so that its first execution counts no new attempt.
    fresh: bool,
    /// Whether the current state was entered by a commit of this driver (the run's creation
    /// or a transition): then no step of it can be recorded yet, and the journal is not
    /// read. (Not after a wake: the handler ran before the run parked.)
    entered_here: bool,
    /// The last failed attempt's error, when it failed in this driver.
    last_error: Option<BoxError>,
    /// `(seq, attempt)` of the attempt this driver is executing (counted, by its own write
    /// or by the commit that entered the state), until its failure is recorded: after a
    /// store fault the driver executes that attempt again without counting another.
    ours: Option<(u64, u32)>,
}

/// What the drive loop does after a look at the run's row.
enum Settled<W> {
    /// Stop: the run ended or parked.
    Done(Driven<W>),
    /// The row changed: look again.
    Again,
    /// The run is running: run its handler.
    Handle,
}

impl Drive<'_> {
    fn run_id(&self) -> &str {
        &self.held.run_id
    }

    /// Ms since the Unix epoch by the runtime's clock.
    fn now(&self) -> u64 {
        self.settings.clock.now_ms()
    }

    /// The run's row and latest record, if the run exists.
    pub(crate) async fn find(&self) -> Result<Option<(RunInfo, TransitionRecord)>> {
        self.store.latest(self.run_id()).await
    }

    /// Checks that a found run can be driven as `W`: of `W`'s workflow, with `W`'s schema or
    /// with `accepted` (a schema the route found `W` accepts), in its row and its latest
    /// record; refuses without writing anything.
    pub(crate) async fn check<W: Workflow>(
        &self,
        info: RunInfo,
        record: TransitionRecord,
        accepted: Option<SchemaHash>,
    ) -> Result<Entered> {
        let run_id = self.run_id();
        if info.workflow != W::NAME {
            return Err(Error::WorkflowMismatch {
                run_id: run_id.to_owned(),
                stored: info.workflow,
                requested: W::NAME,
            });
        }
        let compiled = W::SCHEMA_HASH.pinned();
        let ok = |h: SchemaHash| h == compiled || Some(h) == accepted;
        if !ok(info.schema) || !ok(record.schema) {
            let stored = if ok(info.schema) {
                record.schema
            } else {
                info.schema
            };
            tracing::warn!(%stored, %compiled, "schema changed; refusing to resume");
            return Err(Error::SchemaMismatch {
                run_id: run_id.to_owned(),
                workflow: W::NAME.to_owned(),
                stored,
                compiled,
                changes: schema_changes::<W>(&**self.store, stored).await,
            });
        }
        tracing::info!(state = %record.state, seq = info.seq, status = %info.status, "resuming run");
        crate::failpoint::point("loops::resume::after_read");
        Ok(Entered {
            info,
            record,
            fresh: false,
        })
    }

    /// Creates the run in `initial`, which must be `W`'s initial state.
    pub(crate) async fn create<W: Workflow>(&self, initial: W) -> Result<Entered> {
        let run_id = self.run_id();
        let store = &**self.store;
        let given = initial.state();
        if given != <W::State as StateId>::INITIAL {
            return Err(Error::NotInitial {
                run_id: run_id.to_owned(),
                workflow: W::NAME,
                initial: <W::State as StateId>::INITIAL.name(),
                given: given.name(),
            });
        }
        let now = self.now();
        let record = TransitionRecord::encode(run_id, 0, &initial, now)?;
        self.settings.check_size(run_id, &record)?;
        let info = RunInfo::new_run::<W>(run_id, given, now);
        store
            .write(
                Some(&self.held.lease),
                Write::Create {
                    info: info.clone(),
                    record: record.to_bytes(),
                    schema_text: W::SCHEMA,
                },
            )
            .await?;
        tracing::info!(state = given.name(), seq = 0, "run started");
        Ok(Entered {
            info,
            record,
            fresh: true,
        })
    }

    /// Drives the run from `entered` until it ends (or, in [`Mode::Background`], parks).
    ///
    /// A store fault while it drives the run ([`Error::Storage`], [`Error::Database`],
    /// returned by the store or by the handler, whose error holds one when a step's write
    /// failed) is not the handler's failure: nothing is recorded, no attempt is counted, and
    /// the driver waits ([`FAULT_BACKOFF`]: 100 ms, doubling up to 10 s; each wait logged as a
    /// warning with the error), reads the run again and goes on where it was, for as long as
    /// the fault lasts. It stops only if its lease is lost.
    pub(crate) async fn drive_loop<W, H>(
        &self,
        entered: Entered,
        handler: &H,
        mode: Mode,
    ) -> Result<Driven<W>>
    where
        W: Dispatch<H>,
        H: ?Sized + Sync,
    {
        let run_id = self.run_id();
        let scope = Arc::new(RunScope {
            run_id: run_id.to_owned(),
            workflow: W::NAME,
            store: Arc::clone(self.store),
            lease: self.held.lease.clone(),
            cancel: self.held.signals.cancel.clone(),
            max_payload_bytes: self.settings.max_payload_bytes,
            park_threshold: self.settings.park_threshold,
            clock: self.held.signals.clock(run_id),
            limits: Arc::clone(&self.settings.limits),
            time: self.settings.clock.clone(),
            observer: self.settings.observer.clone(),
            log_texts: self.settings.log_texts,
        });
        let mut run = Progress {
            info: entered.info,
            record: entered.record,
            fresh: entered.fresh,
            entered_here: entered.fresh,
            last_error: None,
            ours: None,
        };
        let mut delay = FAULT_BACKOFF.0;
        let mut at_fault = run.info.seq;
        loop {
            let fault = match self.drive_from(&mut run, &scope, handler, mode).await {
                Err(e) if e.is_store_fault() => e,
                done => return done,
            };
            if run.info.seq != at_fault {
                delay = FAULT_BACKOFF.0;
                at_fault = run.info.seq;
            }
            self.ride_out(&mut run, fault, &mut delay).await?;
        }
    }

    /// The drive loop proper, until the run ends, parks, or an error stops it.
    async fn drive_from<W, H>(
        &self,
        run: &mut Progress,
        scope: &Arc<RunScope>,
        handler: &H,
        mode: Mode,
    ) -> Result<Driven<W>>
    where
        W: Dispatch<H>,
        H: ?Sized + Sync,
    {
        let run_id = self.run_id();
        loop {
            match self.settle::<W>(run, mode).await? {
                Settled::Done(driven) => return Ok(driven),
                Settled::Again => continue,
                Settled::Handle => {}
            }
            let value: W = run.record.decode(run_id)?;
            let state = value.state();
            if !run.fresh && !self.begin_attempt::<W>(run, state).await? {
                continue;
            }
            run.fresh = false;
            // The state's seq: steps, waits and failures of a migrated state stay keyed by
            // the seq it was entered at.
            let seq = run.info.state_seq();
            let attempt = run.info.attempt;
            run.ours = Some((seq, attempt));
            let recorded = if std::mem::take(&mut run.entered_here) {
                Vec::new()
            } else {
                self.store.steps(run_id, seq).await?
            };
            let attempts_left = self
                .settings
                .retry_policy::<W>(state)
                .max_attempts
                .saturating_sub(failed_attempts(&run.info));
            let ctx = Context::new(
                Arc::clone(scope),
                state.name(),
                seq,
                attempt,
                attempts_left,
                recorded,
            );
            let span = tracing::info_span!("state", state = state.name(), seq, attempt);
            let outcome = self.handle(value, handler, &ctx).instrument(span).await;
            drop(ctx);
            match outcome {
                Outcome::Lost => {
                    // Lost by its own clock (the lease lapsed), or told by a renewal.
                    self.held.signals.check_lease(run_id, seq)?;
                    return Err(Error::Fenced {
                        run_id: run_id.to_owned(),
                        seq,
                        current: seq,
                        status: run.info.status,
                    });
                }
                Outcome::Parked => {
                    // The wait committed the waiting status; read it back.
                    run.info = self.reread().await?;
                }
                Outcome::Next(next) => self.commit_transition(run, state, next).await?,
                Outcome::Failed(failure) => {
                    if self.held.signals.cancel.is_cancelled() {
                        continue;
                    }
                    if let Some(fault) = failure.store_fault() {
                        return Err(fault);
                    }
                    self.record_failure::<W>(run, state, failure).await?;
                    run.ours = None;
                }
            }
        }
    }

    /// Waits out the store fault `fault` (`delay`, then double that for the next one, up to
    /// [`FAULT_BACKOFF`]'s limit), then reads the run again into `run`, for as long as the
    /// store fails. The attempt this driver was executing stays its own (`run.fresh`): no
    /// new attempt is counted for it.
    ///
    /// # Errors
    /// [`Error::Fenced`] if the lease was lost meanwhile; an error of the read that is not a
    /// store fault; [`Error::RunNotFound`] if the run is gone.
    async fn ride_out(
        &self,
        run: &mut Progress,
        mut fault: Error,
        delay: &mut Duration,
    ) -> Result<()> {
        let run_id = self.run_id();
        loop {
            // A lease that lapsed (the fault outlasted it, or the process was paused):
            // another worker may hold the run; this driver stops.
            self.held.signals.check_lease(run_id, run.info.seq)?;
            tracing::warn!(
                error = %fault,
                retry_in_ms = delay.as_millis() as u64,
                "store fault: not the handler's failure; the run goes on when the store recovers"
            );
            tokio::select! {
                () = tokio::time::sleep(*delay) => {}
                () = self.held.signals.lost.cancelled() => {
                    self.held.signals.check_lease(run_id, run.info.seq)?;
                    return Err(Error::Fenced {
                        run_id: run_id.to_owned(),
                        seq: run.info.seq,
                        current: run.info.seq,
                        status: run.info.status,
                    });
                }
                () = self.held.signals.cancel.cancelled() => {}
            }
            *delay = delay.saturating_mul(2).min(FAULT_BACKOFF.1);
            self.held.signals.check_lease(run_id, run.info.seq)?;
            match self.store.latest(run_id).await {
                Ok(Some((info, record))) => {
                    // Only this driver (it holds the lease) counts attempts and moves the
                    // run on: a later seq is its own transition, which committed after all.
                    let ours = run.ours.is_some_and(|(seq, attempt)| {
                        info.seq > seq || (info.seq == seq && info.attempt == attempt)
                    });
                    run.fresh = run.fresh || ours;
                    run.entered_here = false;
                    run.info = info;
                    run.record = record;
                    return Ok(());
                }
                Ok(None) => {
                    return Err(Error::RunNotFound {
                        run_id: run_id.to_owned(),
                    });
                }
                Err(e) if e.is_store_fault() => fault = e,
                Err(e) => return Err(e),
            }
        }
    }

    /// Looks at the run's row: an ended run stops the loop (with its final state or its
    /// error), a cancellation asked for ends the run, a waiting run waits or wakes.
    async fn settle<W: Workflow>(&self, run: &mut Progress, mode: Mode) -> Result<Settled<W>> {
        let run_id = self.run_id();
        let info = &mut run.info;
        match info.status {
            RunStatus::Completed => run
                .record
                .decode(run_id)
                .map(|v| Settled::Done(Driven::Ended(v))),
            RunStatus::Failed => Err(Error::RunFailed {
                run_id: run_id.to_owned(),
                state: std::mem::take(&mut info.state),
                seq: info.seq,
                attempts: info.attempt.saturating_sub(info.attempt_base),
                interrupted: info.interrupted,
                last_error: info.error.take().unwrap_or_default(),
                source: run.last_error.take(),
            }),
            RunStatus::Cancelled => Err(Error::RunCancelled {
                run_id: run_id.to_owned(),
                state: std::mem::take(&mut info.state),
                seq: info.seq,
                reason: info.cancel.take().unwrap_or_default(),
            }),
            RunStatus::Running | RunStatus::Waiting
                if info.cancel.is_some() || self.held.signals.cancel.is_cancelled() =>
            {
                run.info = end_cancelled(&**self.store, self.held, run_id, self.now()).await?;
                Ok(Settled::Again)
            }
            RunStatus::Waiting => {
                if !is_ready(&**self.store, info, self.now()).await? {
                    match mode {
                        Mode::Background => {
                            return Ok(Settled::Done(Driven::Parked(Box::new(info.clone()))));
                        }
                        Mode::Attached => {
                            self.wait_in_place(info).await;
                            run.info = self.reread().await?;
                            return Ok(Settled::Again);
                        }
                    }
                }
                self.held.signals.check_lease(run_id, info.seq)?;
                run.info = self
                    .store
                    .write(
                        Some(&self.held.lease),
                        Write::Wake {
                            run_id: run_id.to_owned(),
                            seq: info.state_seq(),
                            at_ms: self.now(),
                        },
                    )
                    .await?
                    .into_run(run_id)?;
                // Waking is not a new attempt: waiting is not failing.
                run.fresh = true;
                Ok(Settled::Again)
            }
            RunStatus::Running => Ok(Settled::Handle),
            // Blocked by another build meanwhile: leave it to a build that can route it.
            RunStatus::Blocked => Err(Error::RunBlocked {
                run_id: run_id.to_owned(),
                state: info.state.clone(),
                seq: info.seq,
                reason: info
                    .block
                    .as_ref()
                    .map(|b| b.reason.clone())
                    .unwrap_or_default(),
            }),
        }
    }

    /// Waits, attached, until something may have ended the wait of `info`: a wake signal,
    /// its time, a cancellation, or (with a shared store) the next look at the row.
    async fn wait_in_place(&self, info: &RunInfo) {
        let signals = &self.held.signals;
        let until = info.wait.as_ref().and_then(|w| w.until_ms);
        let timer = async {
            match until {
                Some(at) => self.settings.clock.sleep_until_ms(at).await,
                None => std::future::pending().await,
            }
        };
        // With a store shared by several workers, an event or a cancellation may come from
        // another process, which cannot signal this one: look at the run's row now and then.
        let shared = async {
            match self.store.lease_ttl() {
                Some(ttl) => {
                    tokio::time::sleep(SHARED_POLL.min(ttl / 3)).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = signals.wake.notified() => {}
            () = timer => {}
            () = signals.cancel.cancelled() => {}
            () = shared => {}
        }
    }

    /// The run's row, read again.
    async fn reread(&self) -> Result<RunInfo> {
        let run_id = self.run_id();
        self.store
            .run_info(run_id)
            .await?
            .ok_or_else(|| Error::RunNotFound {
                run_id: run_id.to_owned(),
            })
    }

    /// Starts a new, durably counted attempt at `state` (after its retry delay); `false` if
    /// the run should be looked at again instead (cancelled while it waited, or no longer
    /// running: its budget ran out).
    ///
    /// Every execution but the first after an in-process commit starts one: a state that
    /// crashes the process on every attempt stops after `max_interruptions`.
    async fn begin_attempt<W: Workflow>(
        &self,
        run: &mut Progress,
        state: W::State,
    ) -> Result<bool> {
        let run_id = self.run_id();
        let policy = self.settings.retry_policy::<W>(state);
        if let Some(at) = run.info.retry_at_ms {
            let wait = Duration::from_millis(at.saturating_sub(self.now()));
            if !wait.is_zero() {
                tracing::info!(
                    state = state.name(),
                    wait_ms = wait.as_millis() as u64,
                    "waiting before the next attempt"
                );
                tokio::select! {
                    () = self.settings.clock.sleep_until_ms(at) => {}
                    () = self.held.signals.cancel.cancelled() => return Ok(false),
                }
            }
        }
        self.held.signals.check_lease(run_id, run.info.seq)?;
        run.info = self
            .store
            .write(
                Some(&self.held.lease),
                Write::BeginAttempt {
                    run_id: run_id.to_owned(),
                    seq: run.info.state_seq(),
                    max_attempts: policy.max_attempts,
                    max_interruptions: policy.max_interruptions,
                    at_ms: self.now(),
                },
            )
            .await?
            .into_run(run_id)?;
        Ok(run.info.status == RunStatus::Running)
    }

    /// Runs the handler of `value`'s state under its time-out, catching a panic, until it
    /// returns, parks the run, or the lease is lost.
    async fn handle<W, H>(&self, value: W, handler: &H, ctx: &Context) -> Outcome<W>
    where
        W: Dispatch<H>,
        H: ?Sized + Sync,
    {
        let timeout = self.settings.state_timeout::<W>(value.state());
        tracing::debug!("handler started");
        let handle = async {
            // A panic in the handler (or in a step's closure) is a failed attempt, not the
            // end of the driver: unwinding past it would leave the run `running` with nobody
            // driving it.
            let fut = AssertUnwindSafe(value.dispatch(handler, ctx)).catch_unwind();
            let result = match timeout {
                None => fut.await,
                Some(limit) => match self.settings.clock.timeout(limit, fut).await {
                    Some(result) => result,
                    None => return Err(Failure::Timeout(limit)),
                },
            };
            match result {
                Ok(result) => result.map_err(Failure::Handler),
                Err(payload) => Err(Failure::Panic(panic_message(&*payload))),
            }
        };
        tokio::select! {
            biased;
            () = self.held.signals.lost.cancelled() => Outcome::Lost,
            () = ctx.parked() => Outcome::Parked,
            result = handle => match result {
                Ok(next) => Outcome::Next(next),
                Err(failure) => Outcome::Failed(failure),
            },
        }
    }

    /// Commits the move from `state` to `next`, after checking it is an allowed one.
    async fn commit_transition<W: Workflow>(
        &self,
        run: &mut Progress,
        state: W::State,
        next: W,
    ) -> Result<()> {
        let run_id = self.run_id();
        let seq = run.info.seq;
        let to = next.state();
        if !state.can_move_to(to) {
            return Err(Error::IllegalTransition {
                run_id: run_id.to_owned(),
                from: state.name(),
                to: to.name(),
                seq,
            });
        }
        let next_seq = seq
            .checked_add(1)
            .ok_or_else(|| run.info.overflow_seq("moving to a next state"))?;
        let now = self.now();
        let next_record = TransitionRecord::encode(run_id, next_seq, &next, now)?;
        self.settings.check_size(run_id, &next_record)?;
        crate::failpoint::point("loops::transition::before_commit");
        self.held.signals.check_lease(run_id, seq)?;
        run.info = self
            .store
            .write(
                Some(&self.held.lease),
                Write::Transition {
                    run_id: run_id.to_owned(),
                    seq: next_seq,
                    state: to.name().to_owned(),
                    record: next_record.to_bytes(),
                    terminal: to.is_terminal(),
                    schema: W::SCHEMA_HASH.pinned(),
                    at_ms: now,
                },
            )
            .await?
            .into_run(run_id)?;
        crate::failpoint::point("loops::transition::after_commit");
        tracing::info!(
            from = state.name(),
            to = to.name(),
            seq = next_seq,
            "transition committed"
        );
        run.record = next_record;
        run.fresh = true;
        run.entered_here = true;
        run.last_error = None;
        Ok(())
    }

    /// Records the failed attempt at `state` and what follows it: a retry at a time its
    /// policy computes, or giving up.
    async fn record_failure<W: Workflow>(
        &self,
        run: &mut Progress,
        state: W::State,
        failure: Failure,
    ) -> Result<()> {
        let run_id = self.run_id();
        let (seq, attempt) = (run.info.state_seq(), run.info.attempt);
        let policy = self.settings.retry_policy::<W>(state);
        let err: BoxError = match failure {
            Failure::Handler(e) => e,
            Failure::Timeout(limit) => Box::new(Error::StateTimeout {
                run_id: run_id.to_owned(),
                state: state.name(),
                seq,
                attempt,
                after_ms: limit.as_millis() as u64,
            }),
            Failure::Panic(message) => Box::new(Error::HandlerPanicked {
                run_id: run_id.to_owned(),
                state: state.name(),
                seq,
                attempt,
                message,
            }),
        };
        let errors = error_chain(&*err);
        let used = failed_attempts(&run.info);
        let now = self.now();
        // An error marked permanent ends the run's tries; a retry-after hint lengthens the
        // back-off (`hint.rs`).
        let hint = retry_hint(&*err);
        let then = if used >= policy.max_attempts || hint.permanent {
            AfterFailure::GiveUp
        } else {
            let unit = jitter_unit(run_id, seq, attempt, now);
            let delay = policy
                .delay_after(used, unit)
                .max(hint.retry_after.unwrap_or_default());
            AfterFailure::RetryAt(
                now.saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
            )
        };
        tracing::warn!(
            state = state.name(),
            seq,
            attempt,
            error_kind = "handler",
            error = %logged_text(self.settings.log_texts, || errors.join(": ")),
            gave_up = then == AfterFailure::GiveUp,
            "handler failed"
        );
        self.held.signals.check_lease(run_id, seq)?;
        run.info = self
            .store
            .write(
                Some(&self.held.lease),
                Write::Failure {
                    run_id: run_id.to_owned(),
                    seq,
                    record: FailureRecord {
                        attempt,
                        at_ms: now,
                        source: FailureSource::Handler,
                        errors,
                    },
                    then,
                },
            )
            .await?
            .into_run(run_id)?;
        run.last_error = Some(err);
        Ok(())
    }
}

impl Failure {
    /// The store fault that failed the handler, when its error holds one in its source
    /// chain (a step whose record could not be written, returned with `?`).
    fn store_fault(&self) -> Option<Error> {
        let Failure::Handler(err) = self else {
            return None;
        };
        let first: &(dyn std::error::Error + 'static) = &**err;
        std::iter::successors(Some(first), |e| e.source())
            .find_map(|e| e.downcast_ref::<Error>()?.store_fault_copy())
    }
}

/// Ends the run `run_id` as cancelled, with the lease of the driver that holds it.
pub(crate) async fn end_cancelled(
    store: &dyn Store,
    held: &Held,
    run_id: &str,
    at_ms: u64,
) -> Result<RunInfo> {
    let info = store
        .write(
            Some(&held.lease),
            Write::EndCancelled {
                run_id: run_id.to_owned(),
                at_ms,
            },
        )
        .await?
        .into_run(run_id)?;
    tracing::info!(state = %info.state, seq = info.seq, "run cancelled");
    Ok(info)
}

/// What changed between the stored schema description of `stored` and `W`'s compiled one
/// (never empty: an unavailable stored description is a change of its own).
pub(crate) async fn schema_changes<W: Workflow>(
    store: &dyn Store,
    stored: SchemaHash,
) -> SchemaDiff {
    let old = store.schema(stored).await.ok().flatten();
    SchemaDiff::of_mismatch(old.as_deref(), W::SCHEMA)
}
