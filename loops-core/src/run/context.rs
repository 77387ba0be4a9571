//! The context a handler receives: the run's identity, journaled steps, idempotency keys and
//! cancellation.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{Error, RecordKind, Result};
use crate::names::{RESERVED_PREFIX, validate_name};
use crate::record::{FailureRecord, FailureSource, StepRecord, now_ms};
use crate::run::settings::LeaseClock;
use crate::store::{AfterFailure, Lease, Reply, Store, WaitOutcome, Write};

/// What a state handler receives besides the state's data: which run, state and attempt it is
/// handling, and the journal through which it runs steps.
///
/// One `Context` serves one attempt at one state. It is `Sync`: steps may run concurrently
/// (`tokio::join!`), each with its own name or occurrence.
pub struct Context {
    run: Arc<RunScope>,
    state: &'static str,
    seq: u64,
    attempt: u32,
    journal: Mutex<Journal>,
    parked: AtomicBool,
    park_signal: Notify,
}

/// What all contexts of one driven run share.
pub(crate) struct RunScope {
    pub(crate) run_id: String,
    pub(crate) workflow: &'static str,
    pub(crate) store: Arc<dyn Store>,
    /// The driver's lease: every write of this run carries it.
    pub(crate) lease: Lease,
    pub(crate) cancel: CancellationToken,
    pub(crate) max_payload_bytes: usize,
    pub(crate) park_threshold: Duration,
    /// The lease's deadline, checked before a step's closure and every commit.
    pub(crate) clock: LeaseClock,
}

#[derive(Default)]
struct Journal {
    /// Recorded step outputs of this state, loaded once per attempt.
    recorded: HashMap<(String, u32), Box<RawValue>>,
    /// Next occurrence per step name.
    next_occurrence: HashMap<String, u32>,
    /// Next occurrence per idempotency-key name.
    next_key: HashMap<String, u32>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("run_id", &self.run.run_id)
            .field("workflow", &self.run.workflow)
            .field("state", &self.state)
            .field("seq", &self.seq)
            .field("attempt", &self.attempt)
            .finish()
    }
}

/// Options of one step: see [`Context::step_with`](crate::Context::step_with).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepOptions {
    /// Abandon the step's closure after this long; the step then fails with
    /// [`Error::StepTimeout`](crate::Error::StepTimeout) (a failed attempt under the state's retry policy).
    pub timeout: Option<Duration>,
}

impl StepOptions {
    /// Options with a time-out.
    pub fn timeout(timeout: Duration) -> Self {
        StepOptions {
            timeout: Some(timeout),
        }
    }
}

impl Context {
    pub(crate) fn new(
        run: Arc<RunScope>,
        state: &'static str,
        seq: u64,
        attempt: u32,
        recorded: Vec<(String, u32, StepRecord)>,
    ) -> Self {
        let recorded = recorded
            .into_iter()
            .map(|(name, occurrence, record)| ((name, occurrence), record.output))
            .collect();
        Context {
            run,
            state,
            seq,
            attempt,
            journal: Mutex::new(Journal {
                recorded,
                ..Journal::default()
            }),
            parked: AtomicBool::new(false),
            park_signal: Notify::new(),
        }
    }

    /// Resolves when the handler parked the run (a wait with nothing to deliver yet); the
    /// runtime then drops the handler's future.
    pub(crate) async fn parked(&self) {
        loop {
            if self.parked.load(Ordering::Acquire) {
                return;
            }
            self.park_signal.notified().await;
        }
    }

    /// Marks the run parked and never resolves: the runtime drops the handler's future.
    async fn park<T>(&self) -> T {
        self.parked.store(true, Ordering::Release);
        self.park_signal.notify_one();
        std::future::pending::<T>().await
    }

    /// The run being driven.
    pub fn run_id(&self) -> &str {
        &self.run.run_id
    }

    /// The workflow's name.
    pub fn workflow(&self) -> &'static str {
        self.run.workflow
    }

    /// The name of the state being handled.
    pub fn state(&self) -> &'static str {
        self.state
    }

    /// The sequence number of the state being handled (0 for the initial state).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Which attempt at handling this state this is, from 1. Numbers count on after
    /// [`Runtime::retry`](crate::Runtime::retry), which resets the budget of attempts only.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether the run has been cancelled. Steps started after a cancellation return
    /// [`Error::Cancelled`](crate::Error::Cancelled) without running; a long step may poll this, or await
    /// [`cancelled`](Self::cancelled), to stop early.
    pub fn is_cancelled(&self) -> bool {
        self.run.cancel.is_cancelled()
    }

    /// Resolves when the run is cancelled.
    pub async fn cancelled(&self) {
        self.run.cancel.cancelled().await;
    }

    /// Runs `f` once and journals its output: see [`step_with`](Self::step_with).
    ///
    /// # Errors
    /// As [`step_with`](Self::step_with).
    pub async fn step<T, E, F, Fut>(&self, name: &str, f: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned + Send,
        E: From<Error> + Display,
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        self.step_with(name, StepOptions::default(), f).await
    }

    /// Runs `f` once and records its output under the key (run id, state seq, `name`,
    /// occurrence), where occurrence counts earlier uses of `name` in this execution of the
    /// handler (from 0). When the handler runs again (a retry, or a resume after a crash) the
    /// recorded output is returned and `f` is not called.
    ///
    /// Only successes are recorded as results. A failure is recorded for inspection (error
    /// text, attempt, time) and returned; the next attempt runs `f` again.
    ///
    /// The one window no store can close: if the process stops after `f`'s side effect but
    /// before its record commits, `f` runs again on resume. Give the outside system an
    /// idempotency key so that it can refuse the repeat: [`step_keyed`](Self::step_keyed)
    /// hands `f` the step's own.
    ///
    /// # Errors
    /// `f`'s own error; otherwise, converted into `E`:
    /// - [`Error::InvalidName`](crate::Error::InvalidName) for an empty name, one longer than [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES) or with
    ///   control characters;
    /// - [`Error::StepDecode`](crate::Error::StepDecode) if a recorded output does not decode as `T` (the handler's code
    ///   changed since the record: never a silently wrong value);
    /// - [`Error::Cancelled`](crate::Error::Cancelled) if the run was cancelled before the step started;
    /// - [`Error::StepTimeout`](crate::Error::StepTimeout) if `options.timeout` passed;
    /// - [`Error::StepEncode`](crate::Error::StepEncode) or [`Error::PayloadTooLarge`](crate::Error::PayloadTooLarge) if the output cannot be recorded;
    /// - [`Error::Storage`](crate::Error::Storage) or [`Error::Fenced`](crate::Error::Fenced) if the record could not be committed.
    pub async fn step_with<T, E, F, Fut>(
        &self,
        name: &str,
        options: StepOptions,
        f: F,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned + Send,
        E: From<Error> + Display,
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        self.journal_step(name, options, |_| f()).await
    }

    /// Runs `f` once as the step `name`, handing it the step's idempotency key, and journals
    /// its output: [`step_keyed_with`](Self::step_keyed_with) with the default options.
    ///
    /// # Errors
    /// As [`step_keyed_with`](Self::step_keyed_with).
    pub async fn step_keyed<T, E, F, Fut>(&self, name: &str, f: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned + Send,
        E: From<Error> + Display,
        F: FnOnce(String) -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        self.step_keyed_with(name, StepOptions::default(), f).await
    }

    /// As [`step_with`](Self::step_with), and `f` gets the idempotency key of this step: the
    /// same on every execution of the handler (every retry, every resume), different for
    /// every other run, state visit, name and occurrence. Pass it to the outside system so
    /// that it refuses a repeat of a side effect whose record a crash prevented.
    ///
    /// The key of the `n`-th step named `name` in an execution is the `n`-th key that
    /// [`idempotency_key(name)`](Self::idempotency_key) would return, so code that moves from
    /// `idempotency_key` followed by `step` to `step_keyed` keeps its keys, and the outside
    /// system still recognises the side effects of runs recorded before the change. Unlike
    /// the pair, the key cannot drift from its step: both count the same occurrence.
    ///
    /// # Errors
    /// As [`step_with`](Self::step_with).
    pub async fn step_keyed_with<T, E, F, Fut>(
        &self,
        name: &str,
        options: StepOptions,
        f: F,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned + Send,
        E: From<Error> + Display,
        F: FnOnce(String) -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        self.journal_step(
            name,
            options,
            |occurrence| f(self.key_for(name, occurrence)),
        )
        .await
    }

    /// The step `name`: checks the name, takes its next occurrence, and runs it (`f` gets the
    /// occurrence) or replays its record, in a span of its own.
    async fn journal_step<T, E, F, Fut>(
        &self,
        name: &str,
        options: StepOptions,
        f: F,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned + Send,
        E: From<Error> + Display,
        F: FnOnce(u32) -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        self.check_user_name("step name", name)?;
        let (occurrence, recorded) = self.next_occurrence(name);
        let span = tracing::info_span!("step", step = name, occurrence);
        self.run_step(name, occurrence, recorded, options, move || f(occurrence))
            .instrument(span)
            .await
    }

    async fn run_step<T, E, F, Fut>(
        &self,
        name: &str,
        occurrence: u32,
        recorded: Option<Box<RawValue>>,
        options: StepOptions,
        f: F,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned + Send,
        E: From<Error> + Display,
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        if let Some(output) = recorded {
            tracing::debug!(step = name, occurrence, "step replayed from the journal");
            return serde_json::from_str(output.get()).map_err(|source| {
                E::from(Error::StepDecode {
                    run_id: self.run.run_id.clone(),
                    state: self.state,
                    seq: self.seq,
                    step: name.to_owned(),
                    occurrence,
                    source,
                })
            });
        }
        if self.is_cancelled() {
            return Err(E::from(self.cancelled_error()));
        }
        crate::failpoint::point("loops::step::before_effect");
        self.run.clock.check(self.seq).map_err(E::from)?; // Not once the lease lapsed.
        let started = Instant::now();
        let outcome = match options.timeout {
            None => f().await,
            Some(limit) => match tokio::time::timeout(limit, f()).await {
                Ok(outcome) => outcome,
                Err(_) => Err(E::from(Error::StepTimeout {
                    run_id: self.run.run_id.clone(),
                    state: self.state,
                    seq: self.seq,
                    step: name.to_owned(),
                    occurrence,
                    after_ms: limit.as_millis() as u64,
                })),
            },
        };
        let duration_ms = started.elapsed().as_millis() as u64;
        match outcome {
            Ok(value) => {
                crate::failpoint::point("loops::step::after_effect");
                self.record_step(name, occurrence, &value, duration_ms)
                    .await
                    .map_err(E::from)?;
                crate::failpoint::point("loops::step::after_record");
                Ok(value)
            }
            Err(err) => {
                let record = FailureRecord {
                    attempt: self.attempt,
                    at_ms: now_ms(),
                    source: FailureSource::Step {
                        name: name.to_owned(),
                        occurrence,
                    },
                    errors: vec![err.to_string()],
                };
                // Best effort: the failure is for inspection only, and the caller gets the error
                // either way.
                if let Err(store_err) = self
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
                    .await
                {
                    tracing::warn!(step = name, occurrence, error = %store_err, "could not record a failed step");
                }
                tracing::warn!(step = name, occurrence, error = %err, "step failed");
                Err(err)
            }
        }
    }

    async fn record_step<T: Serialize>(
        &self,
        name: &str,
        occurrence: u32,
        value: &T,
        duration_ms: u64,
    ) -> Result<()> {
        let run_id = &self.run.run_id;
        let step_encode = |source| Error::StepEncode {
            run_id: run_id.clone(),
            state: self.state,
            seq: self.seq,
            step: name.to_owned(),
            occurrence,
            source,
        };
        let json = serde_json::to_string(value).map_err(step_encode)?;
        if json.len() > self.run.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                run_id: run_id.clone(),
                what: format!("output of step `{name}`#{occurrence}"),
                seq: Some(self.seq),
                bytes: json.len(),
                limit: self.run.max_payload_bytes,
            });
        }
        let output = RawValue::from_string(json).map_err(step_encode)?;
        let record = StepRecord {
            attempt: self.attempt,
            at_ms: now_ms(),
            duration_ms,
            output,
        };
        self.run.clock.check(self.seq)?;
        self.run
            .store
            .write(
                Some(&self.run.lease),
                Write::Step {
                    run_id: run_id.clone(),
                    seq: self.seq,
                    name: name.to_owned(),
                    occurrence,
                    record: crate::record::to_vec(&record),
                },
            )
            .await?;
        tracing::debug!(step = name, occurrence, duration_ms, "step recorded");
        Ok(())
    }

    /// Takes the next occurrence of `name` and its recorded output, if any.
    fn next_occurrence(&self, name: &str) -> (u32, Option<Box<RawValue>>) {
        let mut journal = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
        let next = journal.next_occurrence.entry(name.to_owned()).or_insert(0);
        let occurrence = *next;
        *next += 1;
        let recorded = journal.recorded.remove(&(name.to_owned(), occurrence));
        (occurrence, recorded)
    }

    /// Records `value` as the step `(name, occurrence)` unless it was recorded already, and
    /// returns the recorded value: what the first execution decided stands.
    async fn journaled_u64(&self, name: &str, value: u64) -> Result<u64> {
        let (occurrence, recorded) = self.next_occurrence(name);
        if let Some(output) = recorded {
            return serde_json::from_str(output.get()).map_err(|source| Error::StepDecode {
                run_id: self.run.run_id.clone(),
                state: self.state,
                seq: self.seq,
                step: name.to_owned(),
                occurrence,
                source,
            });
        }
        self.record_step(name, occurrence, &value, 0).await?;
        Ok(value)
    }

    /// Sleeps durably for `duration`: see [`sleep_until`](Self::sleep_until).
    ///
    /// # Errors
    /// As [`sleep_until`](Self::sleep_until).
    pub async fn sleep(&self, duration: Duration) -> Result<()> {
        self.sleep_until(crate::record::now_time() + duration).await
    }

    /// Sleeps durably until `wake` (wall-clock time).
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
    /// [`Error::Cancelled`](crate::Error::Cancelled) if the run is cancelled while it sleeps in place;
    /// [`Error::Storage`](crate::Error::Storage) if the wake-up time could not be recorded.
    pub async fn sleep_until(&self, wake: SystemTime) -> Result<()> {
        let wanted = wake
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let wake_ms = self.journaled_u64("loops:sleep", wanted).await?;
        let remaining = Duration::from_millis(wake_ms.saturating_sub(now_ms()));
        if remaining.is_zero() {
            return Ok(());
        }
        if remaining < self.run.park_threshold {
            tokio::select! {
                () = tokio::time::sleep(remaining) => return Ok(()),
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
                    at_ms: now_ms(),
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
    /// # Errors
    /// As [`wait_for_timeout`](Self::wait_for_timeout).
    pub async fn wait_for<T: DeserializeOwned>(&self, event: &str) -> Result<T> {
        match self.wait_inner(event, None).await? {
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
    /// `None` if the time-out passed first.
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
    /// - none for a payload that does not decode as `T`: such an event is set aside (recorded
    ///   as a failure of this wait, for inspection) and the wait goes on for the next one;
    /// - [`Error::Storage`](crate::Error::Storage) if the wait could not be recorded.
    pub async fn wait_for_timeout<T: DeserializeOwned>(
        &self,
        event: &str,
        timeout: Duration,
    ) -> Result<Option<T>> {
        self.wait_inner(event, Some(timeout)).await
    }

    async fn wait_inner<T: DeserializeOwned>(
        &self,
        event: &str,
        timeout: Option<Duration>,
    ) -> Result<Option<T>> {
        self.check_name("event name", event)?;
        let step_name = format!("{RESERVED_PREFIX}wait:{event}");
        // The deadline is journaled first, on every execution (a replay reads it back), so
        // that each wait of the handler keeps its own occurrence of it.
        let until_ms = match timeout {
            Some(timeout) => {
                let deadline = now_ms().saturating_add(timeout.as_millis() as u64);
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
                Some(output) => (output.get().to_owned(), false),
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
                                at_ms: now_ms(),
                            },
                        )
                        .await?;
                    match reply {
                        Reply::Waited(WaitOutcome::Delivered { event_seq, payload }, _) => {
                            tracing::info!(event, event_seq, "event delivered");
                            (
                                format!(r#"{{"event":{{"seq":{event_seq},"payload":{payload}}}}}"#),
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
                    // way.
                    tracing::warn!(event, error = %e.chain(), "event set aside: its payload does not decode");
                    if delivered_now {
                        self.record_set_aside(&step_name, occurrence, &e).await;
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
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        enum Outcome<'a> {
            Due,
            Event {
                seq: u64,
                #[serde(borrow)]
                payload: &'a RawValue,
            },
        }
        let outcome: Outcome<'_> =
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

    /// Records, best effort, that the event delivered to the wait `(step_name, occurrence)` was
    /// set aside.
    async fn record_set_aside(&self, step_name: &str, occurrence: u32, error: &Error) {
        let record = FailureRecord {
            attempt: self.attempt,
            at_ms: now_ms(),
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

    fn cancelled_error(&self) -> Error {
        Error::Cancelled {
            run_id: self.run.run_id.clone(),
            state: self.state,
            seq: self.seq,
        }
    }

    /// A key that names one side effect of this state, the same on every execution of the
    /// handler (every retry, every resume after a crash), and different for every other
    /// run, state, name and use.
    ///
    /// Pass it to the outside system (a forge, a payment API, a message broker) so that it can
    /// refuse a repeat: that closes the window between a side effect and its step record.
    /// [`step_keyed`](Self::step_keyed) hands a step its key, which ties the two together.
    /// The `n`-th call with the same `name` in one execution gets the `n`-th key, so call it
    /// in a fixed order. The key is the XXH3-128 hash of the workflow name, the run id and
    /// `name` (each prefixed by its length in bytes, as a little-endian u64), then the state's
    /// seq (u64) and `n` (u32, from 0), both little-endian; written as 32 hex digits after the
    /// prefix `lk-` (35 characters). It never changes between versions of loops.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for an empty name, one longer than [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES) or with
    /// control characters.
    pub fn idempotency_key(&self, name: &str) -> Result<String> {
        self.check_user_name("key name", name)?;
        let n = {
            let mut journal = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
            let next = journal.next_key.entry(name.to_owned()).or_insert(0);
            let n = *next;
            *next += 1;
            n
        };
        Ok(self.key_for(name, n))
    }

    /// The idempotency key of the `n`-th use of `name` in this state visit.
    fn key_for(&self, name: &str, n: u32) -> String {
        let mut material = Vec::with_capacity(64 + self.run.run_id.len() + name.len());
        for part in [
            self.run.workflow.as_bytes(),
            self.run.run_id.as_bytes(),
            name.as_bytes(),
        ] {
            material.extend_from_slice(&(part.len() as u64).to_le_bytes());
            material.extend_from_slice(part);
        }
        material.extend_from_slice(&self.seq.to_le_bytes());
        material.extend_from_slice(&n.to_le_bytes());
        format!("lk-{:032x}", xxhash_rust::xxh3::xxh3_128(&material))
    }

    /// Checks a name the handler chose (`what` it is, for the error).
    fn check_user_name(&self, what: &'static str, name: &str) -> Result<()> {
        if name.starts_with(RESERVED_PREFIX) {
            return Err(Error::InvalidName {
                run_id: self.run.run_id.clone(),
                what,
                name: name.to_owned(),
                reason: "starts with the reserved prefix `loops:`",
            });
        }
        self.check_name(what, name)
    }

    fn check_name(&self, what: &'static str, name: &str) -> Result<()> {
        validate_name(name).map_err(|reason| Error::InvalidName {
            run_id: self.run.run_id.clone(),
            what,
            name: name.to_owned(),
            reason,
        })
    }
}
