//! The drive loop: the one code path that takes a run from its last record to its end.
//!
//! A first run and a resume are the same: [`Runtime::enter`] looks the run up (a miss creates
//! it), then [`Runtime::drive_loop`] repeats: decode the latest record, run the state's handler
//! with the state's recorded steps preloaded (so completed steps hit and are skipped), commit
//! the transition. Failures, waits and cancellation are statuses of the run's row, handled at
//! the top of the loop.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tracing::Instrument;

use crate::context::{Context, RunScope};
use crate::error::error_chain;
use crate::error::{Error, Result};
use crate::record::{FailureRecord, FailureSource, TransitionRecord, now_ms};
use crate::runtime::{Claim, Runtime};
use crate::store::{AfterFailure, Lease, RunInfo, RunStatus, Write};
use crate::workflow::{BoxError, Dispatch, StateId, Workflow};

/// How often an attached driver waiting on a store shared by several workers reads its run's
/// row again, to see an event or a cancellation that another process wrote.
pub(crate) const SHARED_POLL: Duration = Duration::from_millis(200);

/// How a driver treats a run that parks (waits for an event or a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The caller awaits the end of the run ([`Runtime::run`]): wait in place.
    Attached,
    /// A background driver of a registered workflow: stop, and let the scheduler or
    /// [`Runtime::send`] start a driver again when the wait can end.
    Background,
}

/// Where a driver stopped.
pub(crate) enum Driven<W> {
    /// The run reached a terminal state.
    Ended(W),
    /// The run is waiting and holds no task ([`Mode::Background`] only).
    Parked(Box<RunInfo>),
}

/// A run as found (or created) by [`Runtime::enter`].
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

/// The message of a caught panic: its payload when it is a string.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic whose payload is not a string".to_owned()
    }
}

enum Outcome<W> {
    Next(W),
    Failed(Failure),
    Parked,
    /// Another worker took the run over (its lease lapsed here).
    Lost,
}

impl Runtime {
    /// Finds the run or, when `initial` is given, creates it; refuses a run of another
    /// workflow or schema without writing anything.
    pub(crate) async fn enter<W: Workflow>(
        &self,
        claim: &Claim,
        initial: Option<W>,
    ) -> Result<Entered> {
        let run_id = claim.run_id();
        let store = self.store();
        let compiled = W::SCHEMA_HASH.pinned();
        if let Some((info, record)) = store.latest(run_id).await? {
            if info.workflow != W::NAME {
                return Err(Error::WorkflowMismatch {
                    run_id: run_id.to_owned(),
                    stored: info.workflow,
                    requested: W::NAME,
                });
            }
            if info.schema != compiled || record.schema != compiled {
                let stored = if info.schema != compiled {
                    info.schema
                } else {
                    record.schema
                };
                tracing::warn!(%stored, %compiled, "schema changed; refusing to resume");
                return Err(Error::SchemaMismatch {
                    run_id: run_id.to_owned(),
                    workflow: W::NAME.to_owned(),
                    stored,
                    compiled,
                    changes: self.schema_changes::<W>(stored).await,
                });
            }
            tracing::info!(state = %record.state, seq = info.seq, status = %info.status, "resuming run");
            crate::failpoint::point("loops::resume::after_read");
            return Ok(Entered {
                info,
                record,
                fresh: false,
            });
        }
        let Some(initial) = initial else {
            return Err(Error::RunNotFound {
                run_id: run_id.to_owned(),
            });
        };
        let given = initial.state();
        if given != <W::State as StateId>::INITIAL {
            return Err(Error::NotInitial {
                run_id: run_id.to_owned(),
                workflow: W::NAME,
                initial: <W::State as StateId>::INITIAL.name(),
                given: given.name(),
            });
        }
        let now = now_ms();
        let record = TransitionRecord::encode(run_id, 0, &initial, now)?;
        self.check_size(run_id, &record)?;
        let info = RunInfo::new_run::<W>(run_id, given, now);
        store
            .write(
                Some(claim.lease()),
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
    pub(crate) async fn drive_loop<W, H>(
        &self,
        claim: &Claim,
        entered: Entered,
        handler: &H,
        mode: Mode,
    ) -> Result<Driven<W>>
    where
        W: Dispatch<H>,
        H: ?Sized + Sync,
    {
        let run_id = claim.run_id();
        let store = self.store();
        let signals = claim.signals();
        let lease = Some(claim.lease());
        let Entered {
            mut info,
            mut record,
            mut fresh,
        } = entered;
        let scope = Arc::new(RunScope {
            run_id: run_id.to_owned(),
            workflow: W::NAME,
            store: self.store_arc(),
            lease: claim.lease().clone(),
            cancel: signals.cancel.clone(),
            max_payload_bytes: self.config().max_payload_bytes,
            park_threshold: self.config().park_threshold,
        });
        let mut last_error: Option<BoxError> = None;
        // Whether the current state was entered by a commit of this driver (the run's creation
        // or a transition): then no step of it can be recorded yet, and the journal is not
        // read. (Not after a wake: the handler ran before the run parked.)
        let mut entered_here = fresh;
        loop {
            match info.status {
                RunStatus::Completed => return record.decode(run_id).map(Driven::Ended),
                RunStatus::Failed => {
                    return Err(Error::RunFailed {
                        run_id: run_id.to_owned(),
                        state: info.state,
                        seq: info.seq,
                        attempts: info.attempt.saturating_sub(info.attempt_base),
                        interrupted: info.interrupted,
                        last_error: info.error.unwrap_or_default(),
                        source: last_error,
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
                RunStatus::Running | RunStatus::Waiting
                    if info.cancel.is_some() || signals.cancel.is_cancelled() =>
                {
                    info = self.end_cancelled(claim.lease(), run_id).await?;
                    continue;
                }
                RunStatus::Waiting => {
                    if !self.wait_is_over(&info).await? {
                        match mode {
                            Mode::Background => return Ok(Driven::Parked(Box::new(info))),
                            Mode::Attached => {
                                let until = info.wait.as_ref().and_then(|w| w.until_ms);
                                let timer = async {
                                    match until {
                                        Some(at) => {
                                            let ms = at.saturating_sub(now_ms());
                                            tokio::time::sleep(Duration::from_millis(ms)).await;
                                        }
                                        None => std::future::pending().await,
                                    }
                                };
                                // With a store shared by several workers, an event or a
                                // cancellation may come from another process, which cannot
                                // signal this one: look at the run's row now and then.
                                let shared = async {
                                    match store.lease_ttl() {
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
                                info = store.run_info(run_id).await?.ok_or_else(|| {
                                    Error::RunNotFound {
                                        run_id: run_id.to_owned(),
                                    }
                                })?;
                                continue;
                            }
                        }
                    }
                    info = store
                        .write(
                            lease,
                            Write::Wake {
                                run_id: run_id.to_owned(),
                                seq: info.seq,
                                at_ms: now_ms(),
                            },
                        )
                        .await?
                        .into_run(run_id)?;
                    // Waking is not a new attempt: waiting is not failing.
                    fresh = true;
                    continue;
                }
                RunStatus::Running => {}
            }

            let value: W = record.decode(run_id)?;
            let state = value.state();
            let policy = self.retry_policy::<W>(state);
            if !fresh {
                // Every execution but the first after an in-process commit starts a new,
                // durably counted attempt: a state that crashes the process on every attempt
                // stops after `max_interruptions`.
                if let Some(at) = info.retry_at_ms {
                    let wait = Duration::from_millis(at.saturating_sub(now_ms()));
                    if !wait.is_zero() {
                        tracing::info!(
                            state = state.name(),
                            wait_ms = wait.as_millis() as u64,
                            "waiting before the next attempt"
                        );
                        tokio::select! {
                            () = tokio::time::sleep(wait) => {}
                            () = signals.cancel.cancelled() => continue,
                        }
                    }
                }
                info = store
                    .write(
                        lease,
                        Write::BeginAttempt {
                            run_id: run_id.to_owned(),
                            seq: info.seq,
                            max_attempts: policy.max_attempts,
                            max_interruptions: policy.max_interruptions,
                            at_ms: now_ms(),
                        },
                    )
                    .await?
                    .into_run(run_id)?;
                if info.status != RunStatus::Running {
                    continue;
                }
            }
            fresh = false;
            let seq = info.seq;
            let attempt = info.attempt;
            let recorded = if std::mem::take(&mut entered_here) {
                Vec::new()
            } else {
                store.steps(run_id, seq).await?
            };
            let ctx = Context::new(Arc::clone(&scope), state.name(), seq, attempt, recorded);
            let span = tracing::info_span!("state", state = state.name(), seq, attempt);
            let timeout = self.state_timeout::<W>(state);
            let outcome = async {
                tracing::debug!("handler started");
                let handle = async {
                    // A panic in the handler (or in a step's closure) is a failed attempt, not
                    // the end of the driver: unwinding past it would leave the run `running`
                    // with nobody driving it.
                    let fut = AssertUnwindSafe(value.dispatch(handler, &ctx)).catch_unwind();
                    let result = match timeout {
                        None => fut.await,
                        Some(limit) => match tokio::time::timeout(limit, fut).await {
                            Ok(result) => result,
                            Err(_) => return Err(Failure::Timeout(limit)),
                        },
                    };
                    match result {
                        Ok(result) => result.map_err(Failure::Handler),
                        Err(payload) => Err(Failure::Panic(panic_message(&*payload))),
                    }
                };
                tokio::select! {
                    biased;
                    () = signals.lost.cancelled() => Outcome::Lost,
                    () = ctx.parked() => Outcome::Parked,
                    result = handle => match result {
                        Ok(next) => Outcome::Next(next),
                        Err(failure) => Outcome::Failed(failure),
                    },
                }
            }
            .instrument(span)
            .await;
            drop(ctx);
            match outcome {
                Outcome::Lost => {
                    return Err(Error::Fenced {
                        run_id: run_id.to_owned(),
                        seq,
                        current: seq,
                        status: info.status,
                    });
                }
                Outcome::Parked => {
                    // The wait committed the waiting status; read it back.
                    info = store
                        .run_info(run_id)
                        .await?
                        .ok_or_else(|| Error::RunNotFound {
                            run_id: run_id.to_owned(),
                        })?;
                }
                Outcome::Next(next) => {
                    let to = next.state();
                    if !state.can_move_to(to) {
                        return Err(Error::IllegalTransition {
                            run_id: run_id.to_owned(),
                            from: state.name(),
                            to: to.name(),
                            seq,
                        });
                    }
                    let now = now_ms();
                    let next_record = TransitionRecord::encode(run_id, seq + 1, &next, now)?;
                    self.check_size(run_id, &next_record)?;
                    crate::failpoint::point("loops::transition::before_commit");
                    info = store
                        .write(
                            lease,
                            Write::Transition {
                                run_id: run_id.to_owned(),
                                seq: seq + 1,
                                state: to.name().to_owned(),
                                record: next_record.to_bytes(),
                                terminal: to.is_terminal(),
                                at_ms: now,
                            },
                        )
                        .await?
                        .into_run(run_id)?;
                    crate::failpoint::point("loops::transition::after_commit");
                    tracing::info!(
                        from = state.name(),
                        to = to.name(),
                        seq = seq + 1,
                        "transition committed"
                    );
                    record = next_record;
                    fresh = true;
                    entered_here = true;
                    last_error = None;
                }
                Outcome::Failed(failure) => {
                    if signals.cancel.is_cancelled() {
                        continue;
                    }
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
                    // Failed attempts so far, this one included (interruptions count apart).
                    let used = attempt
                        .saturating_sub(info.attempt_base)
                        .saturating_sub(info.interrupted);
                    let now = now_ms();
                    let then = if used >= policy.max_attempts {
                        AfterFailure::GiveUp
                    } else {
                        let unit = jitter_unit(run_id, seq, attempt, now);
                        let delay = policy.delay_after(used, unit);
                        AfterFailure::RetryAt(now + delay.as_millis() as u64)
                    };
                    tracing::warn!(
                        state = state.name(),
                        seq,
                        attempt,
                        error = %errors.join(": "),
                        gave_up = then == AfterFailure::GiveUp,
                        "handler failed"
                    );
                    info = store
                        .write(
                            lease,
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
                    last_error = Some(err);
                }
            }
        }
    }

    /// Whether a waiting run's wait can end now: its time passed, or its event is in the inbox.
    pub(crate) async fn wait_is_over(&self, info: &RunInfo) -> Result<bool> {
        let Some(wait) = &info.wait else {
            return Ok(true);
        };
        if wait.until_ms.is_some_and(|until| until <= now_ms()) {
            return Ok(true);
        }
        match &wait.event {
            Some(event) => self.store().has_pending(&info.run_id, event).await,
            None => Ok(false),
        }
    }

    pub(crate) async fn end_cancelled(&self, lease: &Lease, run_id: &str) -> Result<RunInfo> {
        let info = self
            .store()
            .write(
                Some(lease),
                Write::EndCancelled {
                    run_id: run_id.to_owned(),
                    at_ms: now_ms(),
                },
            )
            .await?
            .into_run(run_id)?;
        tracing::info!(state = %info.state, seq = info.seq, "run cancelled");
        Ok(info)
    }
}

/// A number in `0.0..1.0` for retry jitter, from the run, state, attempt and clock.
fn jitter_unit(run_id: &str, seq: u64, attempt: u32, now: u64) -> f64 {
    let mut material = Vec::with_capacity(run_id.len() + 20);
    material.extend_from_slice(run_id.as_bytes());
    material.extend_from_slice(&seq.to_le_bytes());
    material.extend_from_slice(&attempt.to_le_bytes());
    material.extend_from_slice(&now.to_le_bytes());
    (xxhash_rust::xxh3::xxh3_64(&material) >> 11) as f64 / (1u64 << 53) as f64
}
