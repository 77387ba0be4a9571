//! One execution of a state's handler and what it ends in: the transition committed, or
//! the failed attempt recorded with what follows it.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use futures_util::FutureExt;

use super::{Drive, Failure, Outcome, Progress};
use crate::error::{Error, Result, error_chain, retry_hint};
use crate::panics::panic_message;
use crate::record::{FailureRecord, FailureSource, TransitionRecord};
use crate::run::attempts::{failed_attempts, jitter_unit};
use crate::run::context::Context;
use crate::run::dispatch::Dispatch;
use crate::run::settings::logged_text;
use crate::store::{AfterFailure, Write};
use crate::workflow::{BoxError, StateId, Workflow};

impl Drive<'_> {
    /// Runs the handler of `value`'s state under its time-out, catching a panic, until it
    /// returns, parks the run, or the lease is lost.
    pub(super) async fn handle<W, H>(&self, value: W, handler: &H, ctx: &Context) -> Outcome<W>
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

    /// Commits the move from `state` to `next`, after checking it is an allowed one; returns
    /// whether the driver lets the run go now (`mode` drains, see `Drive::drains`: the
    /// transition was committed with `hands_over`, and the run goes on), and the new state's
    /// seq with its value as decoded from its record (what its handler gets).
    ///
    /// # Errors
    /// [`Error::Encode`] if `next` does not serialize, or its JSON does not decode back as
    /// a `W`; as the store's write.
    pub(super) async fn commit_transition<W: Workflow>(
        &self,
        run: &mut Progress,
        state: W::State,
        next: W,
        started: Instant,
        mode: super::Mode,
    ) -> Result<(bool, (u64, W))> {
        let run_id = self.run_id();
        let seq = run.info.seq;
        let to = next.state();
        let hands_over = self.drains(mode) && !to.is_terminal();
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
        // The next handler gets its state as a resume reads it: decoded from the record, and
        // before the commit (a state that does not decode back is refused, not recorded).
        let (next_record, entered) =
            TransitionRecord::encode_read_back(run_id, next_seq, &next, now)?;
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
                    at_ms: now,
                    hands_over,
                },
            )
            .await?
            .into_run(run_id)?;
        crate::failpoint::point("loops::transition::after_commit");
        crate::metrics::transition(W::NAME, state.name(), started.elapsed());
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
        Ok((
            hands_over && run.info.status == crate::status::RunStatus::Running,
            (next_seq, entered),
        ))
    }

    /// Records the failed attempt at `state` and what follows it: a retry at a time its
    /// policy computes, or giving up. The attempt is then no longer this driver's
    /// (`run.ours`).
    pub(super) async fn record_failure<W: Workflow>(
        &self,
        run: &mut Progress,
        state: W::State,
        failure: Failure,
    ) -> Result<()> {
        let run_id = self.run_id();
        let (seq, attempt) = (run.info.state_seq(), run.info.attempt);
        let policy = self.settings.retry_policy::<W>(state);
        let source = failure.source();
        let err: BoxError = match failure {
            Failure::Handler(e) => e,
            Failure::Timeout(limit) => Box::new(Error::StateTimeout {
                run_id: run_id.to_owned(),
                state: state.name(),
                seq,
                attempt,
                after_ms: crate::clock::duration_ms(limit),
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
        // An error marked permanent (or one of loops' own that comes out the same at every
        // try) ends the run's tries; a retry-after hint lengthens the back-off.
        let hint = retry_hint(&*err);
        let then = if used >= policy.max_attempts || hint.permanent {
            AfterFailure::GiveUp
        } else {
            let unit = jitter_unit(run_id, seq, attempt, now);
            let delay = policy
                .delay_after(used, unit)
                .max(hint.retry_after.unwrap_or_default());
            AfterFailure::RetryAt(crate::clock::ms_after(now, delay))
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
        crate::metrics::failure(W::NAME, state.name(), source);
        run.last_error = Some(err);
        run.ours = None;
        Ok(())
    }
}

impl Failure {
    /// What failed the attempt, as the `source` label of
    /// [`FAILURES_TOTAL`](crate::metrics::FAILURES_TOTAL): the one mapping of a failure to
    /// its kind.
    fn source(&self) -> &'static str {
        match self {
            Failure::Handler(_) => crate::metrics::HANDLER,
            Failure::Timeout(_) => crate::metrics::TIMEOUT,
            Failure::Panic(_) => crate::metrics::PANIC,
        }
    }

    /// The store fault that failed the handler, when its error holds one in its source
    /// chain (a step whose record could not be written, returned with `?`).
    pub(super) fn store_fault(&self) -> Option<Error> {
        let Failure::Handler(err) = self else {
            return None;
        };
        let first: &(dyn std::error::Error + 'static) = &**err;
        std::iter::successors(Some(first), |e| e.source())
            .find_map(|e| e.downcast_ref::<Error>()?.store_fault_copy())
    }
}
