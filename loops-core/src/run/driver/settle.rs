//! The drive loop's looks at the run's row: riding out a store fault, settling a row that
//! ended, waits or was cancelled, and starting a counted attempt.

use std::sync::Arc;
use std::time::Duration;

use super::{Drive, Driven, FAULT_BACKOFF, Mode, Progress, SHARED_POLL, Settled};
use crate::error::{Error, Result};
use crate::names::CHILD_ENDED;
use crate::row::RunInfo;
use crate::run::attempts::is_ready;
use crate::run::settings::Held;
use crate::status::RunStatus;
use crate::store::{Store, Write};
use crate::workflow::{StateId, Workflow};

impl Drive<'_> {
    /// Waits out the store fault `fault` (`delay`, then double that for the next one, up to
    /// [`FAULT_BACKOFF`]'s limit), then reads the run again into `run`, for as long as the
    /// store fails. The attempt this driver was executing stays its own (`run.fresh`): no
    /// new attempt is counted for it.
    ///
    /// # Errors
    /// [`Error::Fenced`] if the lease was lost meanwhile; an error of the read that is not a
    /// store fault; [`Error::RunNotFound`] if the run is gone.
    pub(super) async fn ride_out(
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
                retry_in_ms = crate::clock::duration_ms(*delay),
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
    pub(super) async fn settle<W: Workflow>(
        &self,
        run: &mut Progress,
        mode: Mode,
    ) -> Result<Settled<W>> {
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
                if !run.rerouted && !is_ready(&**self.store, info, self.now()).await? {
                    self.look_after_children(info).await;
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
                run.rerouted = false;
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

    /// If the run `info` waits for its children ([`CHILD_ENDED`]): makes sure, once per
    /// process and run, that each child not ended has a driver here (`Kin::look_after_child`).
    /// A process that only drives the parent (`Runtime::run`, or `start` of a run that
    /// exists, without `resume_all`) would otherwise wait for children nobody drives: their
    /// drivers stopped with the process that started them. A failed read is logged: the
    /// children are then driven as any run is (`resume_all`, `serve`, another worker).
    async fn look_after_children(&self, info: &RunInfo) {
        // Most parked runs wait for something else: settled by a field, before anything else.
        let waits_for_children = info
            .wait
            .as_ref()
            .is_some_and(|w| w.event.as_deref() == Some(CHILD_ENDED));
        if !waits_for_children {
            return;
        }
        let Some(kin) = self.kin.as_ref().and_then(std::sync::Weak::upgrade) else {
            return;
        };
        if !kin.first_look_at_children(&info.run_id) {
            return;
        }
        match self.store.children(&info.run_id).await {
            Ok(children) => {
                for child in children {
                    if matches!(child.status, RunStatus::Running | RunStatus::Waiting) {
                        Arc::clone(&kin).look_after_child(&child.workflow, &child.run_id);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not list the children this run waits for; they are driven when runs are resumed");
            }
        }
    }

    /// Waits, attached, until something may have ended the wait of `info`: a wake signal,
    /// its time, a cancellation, or (with a shared store) the next look at the row.
    pub(super) async fn wait_in_place(&self, info: &RunInfo) {
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
    pub(super) async fn reread(&self) -> Result<RunInfo> {
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
    pub(super) async fn begin_attempt<W: Workflow>(
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
                    wait_ms = crate::clock::duration_ms(wait),
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
}

/// Ends the run `run_id` as cancelled, with the lease of the driver that holds it.
async fn end_cancelled(
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
