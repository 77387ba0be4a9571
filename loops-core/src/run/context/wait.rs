//! Durable sleeps and waits for events.

use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use crate::clock::{epoch_ms, ms_after};
use crate::error::{Error, RecordKind, Result};
use crate::event::EventName;
use crate::names::RESERVED_PREFIX;
use crate::record::{FailureRecord, FailureSource};
use crate::run::context::Context;
use crate::run::settings::logged_text;
use crate::store::{AfterFailure, Reply, WaitOutcome, Write};

impl Context {
    /// Sleeps durably for `duration` (whole ms; sub-millisecond parts dropped): see
    /// [`sleep_until`](Self::sleep_until). The wake-up time saturates at `u64::MAX` ms since
    /// the Unix epoch ([`ms_after`](crate::ms_after)): a sleep that long
    /// ([`Duration::MAX`] among others) parks the run for ever, until it is cancelled.
    ///
    /// # Errors
    /// As [`sleep_until`](Self::sleep_until).
    pub async fn sleep(&self, duration: Duration) -> Result<()> {
        self.sleep_until_ms(ms_after(self.run.time.now_ms(), duration))
            .await
    }

    /// Sleeps durably until `wake` (wall-clock time, in whole ms since the Unix epoch as
    /// [`epoch_ms`](crate::epoch_ms) counts them: a time before the epoch has passed).
    ///
    /// The wake-up time is recorded the first time the handler gets here; a re-execution
    /// (after a restart, or a retry) waits for the recorded time, so a run sleeps only the
    /// time that remains, and continues at once if it passed while the process was down.
    /// Sleeps shorter than the runtime's park threshold (1 s by default,
    /// [`RuntimeBuilder::park_threshold`](crate::RuntimeBuilder::park_threshold)) wait in
    /// place; longer ones park the run: its status becomes
    /// [`Waiting`](crate::RunStatus::Waiting), the handler's future is dropped, and the
    /// handler runs again at the wake-up time (recorded steps replay from the journal).
    ///
    /// # Errors
    /// [`Error::Cancelled`](crate::Error::Cancelled) if the run was cancelled before the sleep
    /// (nothing is recorded) or is cancelled while it sleeps in place;
    /// [`Error::Storage`](crate::Error::Storage) if the wake-up time could not be recorded.
    pub async fn sleep_until(&self, wake: SystemTime) -> Result<()> {
        self.sleep_until_ms(epoch_ms(wake)).await
    }

    /// [`sleep_until`](Self::sleep_until) `wanted` (ms since the Unix epoch; `u64::MAX` ms,
    /// what a sleep too long to count saturates to, is never reached: the run stays parked).
    async fn sleep_until_ms(&self, wanted: u64) -> Result<()> {
        if self.is_cancelled() {
            return Err(self.cancelled_error());
        }
        let wake_ms = self.journaled_u64("loops:sleep", wanted).await?;
        self.pause_until(wake_ms).await
    }

    /// Waits until `wake_ms` (ms since the Unix epoch): in place if that is less than the
    /// park threshold away, else by parking the run until then (the handler's future is
    /// dropped and the handler runs again at that time). A sleep's wake-up time and a
    /// step's next try wait this way.
    pub(super) async fn pause_until(&self, wake_ms: u64) -> Result<()> {
        let remaining = Duration::from_millis(wake_ms.saturating_sub(self.run.time.now_ms()));
        if remaining.is_zero() {
            return Ok(());
        }
        if remaining < self.run.park_threshold {
            tracing::debug!(wake_ms, "waiting in place until the wake-up time");
            tokio::select! {
                () = self.run.time.sleep_until_ms(wake_ms) => return Ok(()),
                () = self.run.cancel.cancelled() => return Err(self.cancelled_error()),
            }
        }
        self.run.clock.check(self.seq)?;
        let reply = self
            .run
            .store
            .write(
                Some(&self.run.lease),
                Write::Wait {
                    run_id: self.run.run_id.clone(),
                    seq: self.seq,
                    attempt: self.attempt,
                    step: None,
                    event: None,
                    until_ms: Some(wake_ms),
                    at_ms: self.run.time.now_ms(),
                },
            )
            .await?;
        match reply {
            Reply::Waited(WaitOutcome::Parked, _) => {
                tracing::info!(wake_ms, "run parked until its wake-up time");
                self.park().await
            }
            _ => Ok(()),
        }
    }

    /// Waits durably for the event `event`, sent by
    /// [`Runtime::send`](crate::Runtime::send), and returns its payload: see
    /// [`wait_for_timeout`](Self::wait_for_timeout), without a time-out.
    ///
    /// `event` is a declared event (`ctx.wait_for(Deliver::APPROVE)`, which returns its
    /// payload type) or a name (`ctx.wait_for::<Approval>("approve")`).
    ///
    /// # Errors
    /// As [`wait_for_timeout`](Self::wait_for_timeout).
    pub async fn wait_for<T: DeserializeOwned>(&self, event: impl EventName<T>) -> Result<T> {
        let declared = event.is_declared();
        let event = event.event_name();
        match self.wait_inner(event, declared, None).await? {
            Some(value) => Ok(value),
            None => Err(Error::Decode {
                run_id: self.run.run_id.clone(),
                record: RecordKind::Wait {
                    event: event.to_owned(),
                },
                seq: self.seq,
                state: String::new(),
                source: serde::de::Error::custom(
                    "recorded as timed out, but the wait has no time-out",
                ),
            }),
        }
    }

    /// Waits durably for the event `event` for at most `timeout`; returns its payload, or
    /// `None` if the time-out passed first. `event` is a declared event (`Deliver::APPROVE`)
    /// or a name, as for [`wait_for`](Self::wait_for).
    ///
    /// Events sent before the handler gets here are kept and delivered; each event is
    /// delivered exactly once, to one wait, oldest first. The delivery (or the time-out) is
    /// recorded like a step, in the same transaction that takes the event from the inbox, so a
    /// re-execution of the handler gets the same answer. The deadline is recorded the first
    /// time, so a restart does not extend it. With nothing to deliver the run parks: its
    /// status becomes [`Waiting`](crate::RunStatus::Waiting) with the event and deadline, the
    /// handler's future is dropped, and the handler runs again when the event arrives or the
    /// deadline passes (recorded steps replay from the journal). Code of the handler between
    /// its last step and the wait therefore runs again: keep it free of side effects.
    ///
    /// # Errors
    /// - [`Error::InvalidName`](crate::Error::InvalidName) for an empty, over-long or control-character name;
    /// - [`Error::EventRefused`](crate::Error::EventRefused), nothing recorded, for a plain
    ///   name the workflow does not declare when it declares events (no send could reach
    ///   such a wait); the run fails at once ([`Error::repeats`](crate::Error::repeats));
    /// - [`Error::Cancelled`](crate::Error::Cancelled) if the run was cancelled before the wait
    ///   (nothing is recorded) or while it waits in place;
    /// - none for a payload that does not decode as `T`: such an event is set aside (recorded
    ///   as a failure of this wait, for inspection) and the wait goes on for the next one;
    /// - [`Error::Storage`](crate::Error::Storage) if the wait could not be recorded.
    pub async fn wait_for_timeout<T: DeserializeOwned>(
        &self,
        event: impl EventName<T>,
        timeout: Duration,
    ) -> Result<Option<T>> {
        self.wait_inner(event.event_name(), event.is_declared(), Some(timeout))
            .await
    }

    /// The wait; `declared` if `event` is an [`Event<T>`](crate::Event), which names an event
    /// its workflow declares: a plain name is checked first ([`check_declared`](Self::check_declared)).
    async fn wait_inner<T: DeserializeOwned>(
        &self,
        event: &str,
        declared: bool,
        timeout: Option<Duration>,
    ) -> Result<Option<T>> {
        self.check_name("event name", event)?;
        if !declared {
            self.check_declared(event)?;
        }
        if self.is_cancelled() {
            // As a step started after the cancellation: nothing is recorded, nothing taken.
            return Err(self.cancelled_error());
        }
        let step_name = crate::record::wait::wait_step_name(event);
        // The deadline is journaled first, on every execution (a replay reads it back), so
        // that each wait of the handler keeps its own occurrence of it.
        let until_ms = match timeout {
            Some(timeout) => {
                let deadline = ms_after(self.run.time.now_ms(), timeout);
                Some(
                    self.journaled_u64(&format!("{RESERVED_PREFIX}deadline:{event}"), deadline)
                        .await?,
                )
            }
            None => None,
        };
        loop {
            let (occurrence, recorded) = self.next_occurrence(&step_name);
            let (outcome, delivered_now) = match recorded {
                Some(record) => (record.output.get().to_owned(), false),
                None => {
                    self.run.clock.check(self.seq)?;
                    let reply = self
                        .run
                        .store
                        .write(
                            Some(&self.run.lease),
                            Write::Wait {
                                run_id: self.run.run_id.clone(),
                                seq: self.seq,
                                attempt: self.attempt,
                                step: Some((step_name.clone(), occurrence)),
                                event: Some(event.to_owned()),
                                until_ms,
                                at_ms: self.run.time.now_ms(),
                            },
                        )
                        .await?;
                    match reply {
                        Reply::Waited(WaitOutcome::Delivered { event_seq, payload }, _) => {
                            tracing::info!(event, event_seq, "event delivered");
                            (
                                crate::record::wait::delivered_output(event_seq, &payload),
                                true,
                            )
                        }
                        Reply::Waited(WaitOutcome::Due, _) => {
                            tracing::info!(event, "wait timed out");
                            return Ok(None);
                        }
                        _ => {
                            tracing::info!(event, until_ms, "run parked until an event arrives");
                            return self.park().await;
                        }
                    }
                }
            };
            match self.decode_wait::<T>(event, &step_name, occurrence, &outcome) {
                Err(e @ Error::EventDecode { .. }) => {
                    // A payload of the wrong shape (a mistyped `loops send`) must not poison
                    // the run: it is set aside, recorded as a failure for inspection, and the
                    // wait goes on. Its delivery record stays, so a replay skips it the same
                    // way, said once: when it is set aside, not at every replay (helper-127
                    // LOW 2: each resume warned again of every event set aside before).
                    if delivered_now {
                        tracing::warn!(event, error_kind = "event decode", error = %logged_text(self.run.log_texts, || e.chain()), "event set aside: its payload does not decode");
                        self.record_set_aside(&step_name, occurrence, &e).await;
                    } else {
                        tracing::debug!(event, "event set aside before, skipped on replay");
                    }
                }
                other => return other,
            }
        }
    }

    /// Decodes a wait's recorded outcome: `"due"`, or the delivered event.
    fn decode_wait<T: DeserializeOwned>(
        &self,
        event: &str,
        step_name: &str,
        occurrence: u32,
        output: &str,
    ) -> Result<Option<T>> {
        use crate::record::wait::WaitOutput as Outcome;
        let outcome: Outcome<&RawValue> =
            serde_json::from_str(output).map_err(|source| Error::StepDecode {
                run_id: self.run.run_id.clone(),
                state: self.state,
                seq: self.seq,
                step: step_name.to_owned(),
                occurrence,
                source,
            })?;
        match outcome {
            Outcome::Due => Ok(None),
            Outcome::Event { seq, payload } => serde_json::from_str(payload.get())
                .map(Some)
                .map_err(|source| Error::EventDecode {
                    run_id: self.run.run_id.clone(),
                    state: self.state,
                    seq: self.seq,
                    event: event.to_owned(),
                    event_seq: seq,
                    source,
                }),
        }
    }

    /// Refuses a wait by the plain name `event` in a workflow that declares events but not
    /// this one: [`Runtime::send`](crate::Runtime::send) refuses such an event, so the run
    /// would wait for ever. A workflow that declares no events waits for any name, and
    /// loops' own events (`loops:`) are not declared.
    fn check_declared(&self, event: &str) -> Result<()> {
        if event.starts_with(RESERVED_PREFIX) {
            return Ok(());
        }
        let declared = crate::schema::DeclaredEvents::from_description(self.run.schema);
        if declared.get(event).is_some() {
            return Ok(());
        }
        // The name only: no payload is at hand (`check` passes a workflow without events).
        declared
            .check(self.run.schema, event, &serde_json::Value::Null)
            .map_err(|refusal| Error::EventRefused {
                run_id: self.run.run_id.clone(),
                state: self.state.to_owned(),
                seq: self.seq,
                event: event.to_owned(),
                refusal: Box::new(refusal),
            })
    }

    /// Records, best effort, that the event delivered to the wait `(step_name, occurrence)` was
    /// set aside.
    async fn record_set_aside(&self, step_name: &str, occurrence: u32, error: &Error) {
        let record = FailureRecord {
            attempt: self.attempt,
            at_ms: self.run.time.now_ms(),
            source: FailureSource::Step {
                name: step_name.to_owned(),
                occurrence,
            },
            errors: crate::error::error_chain(error),
        };
        let written = self
            .run
            .store
            .write(
                Some(&self.run.lease),
                Write::Failure {
                    run_id: self.run.run_id.clone(),
                    seq: self.seq,
                    record,
                    then: AfterFailure::Nothing,
                },
            )
            .await;
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not record an event set aside");
        }
    }
}
