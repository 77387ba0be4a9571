//! Journaled steps: run once (tried again in place under a retry policy), recorded,
//! replayed.

use std::future::Future;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tracing::Instrument;

use crate::clock::{duration_ms, ms_after};
use crate::error::{Error, Result, error_chain, retry_hint};
use crate::metrics::{LimitWait, StepLabels};
use crate::record::{FailureRecord, FailureSource, StepRecord};
use crate::retry::RetryPolicy;
use crate::run::context::stale::Resolved;
use crate::run::context::{Context, StepOptions};
use crate::run::limits::Taken;
use crate::run::settings::{StepRun, logged_text};
use crate::store::{AfterFailure, Write};
use crate::workflow::BoxError;

/// What a step may return: a value that is recorded as JSON and read back on replay
/// (`Serialize + DeserializeOwned`) and that may cross threads (`Send`). Implemented for
/// every such type; it exists to say so when a type is not one.
///
/// An error can be such a value too: a step whose output is `Result<T, E>` (with `E:
/// Serialize + Deserialize`) records an `Err` like an `Ok`, and the handler branches on it
/// identically on every replay. See [`Context::step_with`].
#[diagnostic::on_unimplemented(
    message = "the output of a step must be recorded: `{Self}` is not `Serialize + DeserializeOwned + Send`",
    label = "this step's output",
    note = "a step's output is stored as JSON and read back when the handler runs again: derive `serde::Serialize` and `serde::Deserialize` for it, or return a type that has them"
)]
pub trait StepOutput: Serialize + DeserializeOwned + Send {}

impl<T: Serialize + DeserializeOwned + Send> StepOutput for T {}

/// The error of a step closure called a second time by options that try once (which never
/// happens: the retry loop calls it once per try).
fn called_twice() -> BoxError {
    "loops called a step's FnOnce closure a second time (a bug in loops)".into()
}

impl Context {
    /// Runs `f` once and journals its output: see [`step_with`](Self::step_with).
    ///
    /// Without options a step is tried once, so `f` is an `FnOnce`: it may move what it
    /// captured into its future (`move || async move { forge.open(branch).await }`).
    /// [`step_with`](Self::step_with) takes an `FnMut`, since its retry policy may call `f`
    /// again.
    ///
    /// # Errors
    /// As [`step_with`](Self::step_with).
    pub async fn step<T, F, Fut>(&self, name: impl Into<String>, f: F) -> Result<T>
    where
        T: StepOutput,
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<T, BoxError>> + Send,
    {
        let mut f = Some(f);
        let once = move || {
            let f = f.take();
            async move {
                match f {
                    Some(f) => f().await,
                    None => Err(called_twice()),
                }
            }
        };
        self.step_with(name, StepOptions::default(), once).await
    }

    /// Runs `f` and records its output under the key (run id, state seq, `name`,
    /// occurrence), where occurrence counts earlier uses of `name` in this execution of the
    /// handler (from 0). When the handler runs again (a retry, or a resume after a crash) the
    /// recorded output is returned and `f` is not called.
    ///
    /// `f` returns `Result<T, BoxError>`, so `?` works on any error inside it (an
    /// `anyhow::Error` too) and `Ok(value)` needs no annotation. An `Ok` is recorded, and the
    /// handler gets it decoded from its record, as every replay does (a value whose JSON
    /// does not decode back, such as a NaN float, is refused, not recorded); an
    /// `Err` is a failed try, recorded as a failure for inspection (error chain, attempt,
    /// time) and never replayed. Under `options`'s retry policy
    /// ([`StepOptions::with_retry`]) a failed try is tried again in place, without
    /// re-entering the state; with none, or when the tries are used up, or when the error is
    /// [permanent](crate::Error::permanent), the step returns [`Error::StepFailed`] with the
    /// last try's error as its source, and the state's retry policy decides (a permanent
    /// error is not retried by the state either).
    ///
    /// To record an outcome the handler must branch on, error or not, return it as the value:
    /// a step of type `Result<Reply, ApiError>` whose closure returns `Ok(Err(api_error))`
    /// records the `Err` like any output, and every replay hands back the same `Err`:
    ///
    /// ```no_run
    /// # extern crate loops_core as loops;
    /// # async fn example(ctx: &loops::Context) -> loops::Result<()> {
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// enum Review { Approved, ChangesRequested(String) }
    /// let review: Result<String, Review> = ctx
    ///     .step("review", || async { Ok(Err(Review::ChangesRequested("tests".into()))) })
    ///     .await?;
    /// match review {
    ///     Ok(merged) => println!("merged {merged}"),
    ///     Err(review) => { /* the same branch on every replay */ let _ = review; }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// The one window no store can close: if the process stops after `f`'s side effect but
    /// before its record commits, `f` runs again on resume. Give the outside system an
    /// idempotency key so that it can refuse the repeat: [`step_keyed`](Self::step_keyed)
    /// hands `f` the step's own.
    ///
    /// # Errors
    /// - [`Error::StepFailed`] if `f` failed on its last try (its error is the source; a
    ///   try that ran past `options`'s time-out failed with
    ///   [`Error::StepTimeout`](crate::Error::StepTimeout));
    /// - [`Error::InvalidName`](crate::Error::InvalidName) for an empty name, one longer than [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES) or with
    ///   control characters;
    /// - [`Error::StepDecode`](crate::Error::StepDecode) if a recorded output does not decode as `T` (the handler's code
    ///   changed since the record: never a silently wrong value);
    /// - [`Error::Cancelled`](crate::Error::Cancelled) if the run was cancelled before the step started or while it
    ///   waited between tries;
    /// - [`Error::StepEncode`](crate::Error::StepEncode) or [`Error::PayloadTooLarge`](crate::Error::PayloadTooLarge) if the output cannot be recorded (it does not
    ///   serialize, or not as JSON that decodes back as `T`, or is too large);
    /// - [`Error::Storage`](crate::Error::Storage) or [`Error::Fenced`](crate::Error::Fenced) if the record could not be committed.
    pub async fn step_with<T, F, Fut>(
        &self,
        name: impl Into<String>,
        options: StepOptions,
        f: F,
    ) -> Result<T>
    where
        T: StepOutput,
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = Result<T, BoxError>> + Send,
    {
        let name = name.into();
        self.check_user_name("step name", &name)?;
        let (occurrence, recorded) = self.next_occurrence(&name);
        let span = tracing::info_span!("step", step = name.as_str(), occurrence);
        async {
            match self.resolve(&name, occurrence, recorded, &options).await? {
                Resolved::Replay(record, as_named) => self.replay(&as_named, occurrence, &record),
                Resolved::Run(as_named) => self.run_step(&as_named, occurrence, &options, f).await,
            }
        }
        .instrument(span)
        .await
    }

    /// Runs `f` as the step `name`, handing it the step's idempotency key, and journals
    /// its output: [`step_keyed_with`](Self::step_keyed_with) with the default options. As
    /// in [`step`](Self::step), `f` is tried once and so is an `FnOnce`.
    ///
    /// # Errors
    /// As [`step_keyed_with`](Self::step_keyed_with).
    pub async fn step_keyed<'a, T, F, Fut>(&'a self, name: impl Into<String>, f: F) -> Result<T>
    where
        T: StepOutput,
        F: FnOnce(&'a str) -> Fut + Send,
        Fut: Future<Output = Result<T, BoxError>> + Send,
    {
        let mut f = Some(f);
        let once = move |key: &'a str| {
            let f = f.take();
            async move {
                match f {
                    Some(f) => f(key).await,
                    None => Err(called_twice()),
                }
            }
        };
        self.step_keyed_with(name, StepOptions::default(), once)
            .await
    }

    /// As [`step_with`](Self::step_with), and `f` gets the idempotency key of this step: the
    /// same on every execution of the handler (every retry, every resume) and every try,
    /// different for every other run (a run under an id used before too: see
    /// [`idempotency_key`](Self::idempotency_key)), state visit, name and occurrence. Pass it
    /// to the outside system so that it refuses a repeat of a side effect whose record a crash
    /// prevented. The key is borrowed from the context, so the future may borrow it too:
    /// `ctx.step_keyed("pr", |key| forge.open(key))` compiles with `open(&self, key: &str)`.
    ///
    /// The key of the `n`-th step named `name` in an execution is the `n`-th key that
    /// [`idempotency_key(name)`](Self::idempotency_key) would return, so code that moves from
    /// `idempotency_key` followed by `step` to `step_keyed` keeps its keys, and the outside
    /// system still recognises the side effects of runs recorded before the change. Unlike
    /// the pair, the key cannot drift from its step: both count the same occurrence.
    ///
    /// # Errors
    /// As [`step_with`](Self::step_with).
    pub async fn step_keyed_with<'a, T, F, Fut>(
        &'a self,
        name: impl Into<String>,
        options: StepOptions,
        mut f: F,
    ) -> Result<T>
    where
        T: StepOutput,
        F: FnMut(&'a str) -> Fut + Send,
        Fut: Future<Output = Result<T, BoxError>> + Send,
    {
        let name = name.into();
        self.check_user_name("step name", &name)?;
        let (occurrence, recorded) = self.next_occurrence(&name);
        let span = tracing::info_span!("step", step = name.as_str(), occurrence);
        async {
            match self.resolve(&name, occurrence, recorded, &options).await? {
                Resolved::Replay(record, as_named) => self.replay(&as_named, occurrence, &record),
                Resolved::Run(as_named) => {
                    // The key of the name the output is recorded under: a stale step that
                    // runs again gets a key of its own.
                    let key: &'a str = self.keys.keep(self.key_for(&as_named, occurrence));
                    self.run_step(&as_named, occurrence, &options, move || f(key))
                        .await
                }
            }
        }
        .instrument(span)
        .await
    }

    /// The recorded output of the step `(name, occurrence)`.
    fn replay<T: StepOutput>(&self, name: &str, occurrence: u32, record: &StepRecord) -> Result<T> {
        tracing::debug!(step = name, occurrence, "step replayed from the journal");
        self.decode_step(name, occurrence, &record.output)
    }

    /// Runs the step `(name, occurrence)`: `f` under `options` until a try succeeds or the
    /// tries are used up, and records the output.
    async fn run_step<T, F, Fut>(
        &self,
        name: &str,
        occurrence: u32,
        options: &StepOptions,
        mut f: F,
    ) -> Result<T>
    where
        T: StepOutput,
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = Result<T, BoxError>> + Send,
    {
        if self.is_cancelled() {
            return Err(self.cancelled_error());
        }
        let policy = options.retry.unwrap_or(RetryPolicy::never());
        let mut tries = self.tries(name, occurrence, policy)?;
        let metrics = StepLabels::new(self.run.workflow, self.state, name);
        loop {
            if let Some(at_ms) = tries.next_at_ms() {
                self.pause_until(at_ms).await?;
            }
            let try_no = tries.next_try();
            let taken = self.take_limit(name, options.limit.as_deref()).await?;
            crate::failpoint::point("loops::step::before_effect");
            self.run.clock.check(self.seq)?; // Not once the lease lapsed.
            if let Some(observer) = &self.run.observer {
                observer(&StepRun {
                    run_id: self.run.run_id.clone(),
                    seq: self.seq,
                    name: name.to_owned(),
                    occurrence,
                    key: self.key_for(name, occurrence),
                });
            }
            let started = Instant::now();
            let outcome = self
                .one_try(name, occurrence, options.timeout, &mut f)
                .await;
            let elapsed = started.elapsed();
            let duration_ms = duration_ms(elapsed);
            if let Some(taken) = taken {
                taken.release().await;
            }
            let err = match outcome {
                Ok(value) => {
                    crate::failpoint::point("loops::step::after_effect");
                    metrics.tried(elapsed, false, false);
                    let output = self.encode_output(name, occurrence, &value)?;
                    // The handler gets the output as every replay reads it: decoded from
                    // its record, which is refused if it does not decode back (a NaN float
                    // written as `null`), rather than failing every replay.
                    let value = self.decode_output(name, occurrence, &output)?;
                    // After failed tries, the record clears the error they showed.
                    self.write_step(name, occurrence, output, (duration_ms, try_no > 1))
                        .await?;
                    metrics.ended(true);
                    crate::failpoint::point("loops::step::after_record");
                    return Ok(value);
                }
                Err(err) => err,
            };
            let hint = retry_hint(&*err);
            let retry_at_ms = if hint.permanent || try_no >= policy.max_attempts {
                None
            } else {
                let unit = self.jitter_unit(name, occurrence, try_no);
                let delay = policy
                    .delay_after(try_no, unit)
                    .max(hint.retry_after.unwrap_or_default());
                Some(ms_after(self.run.time.now_ms(), delay))
            };
            metrics.tried(elapsed, true, retry_at_ms.is_some());
            self.record_failed_try(name, occurrence, try_no, &err, retry_at_ms)
                .await;
            tries.failed(self, try_no, retry_at_ms).await?;
            if retry_at_ms.is_none() {
                metrics.ended(false);
                return Err(Error::StepFailed {
                    run_id: self.run.run_id.clone(),
                    state: self.state,
                    seq: self.seq,
                    step: name.to_owned(),
                    occurrence,
                    tries: try_no,
                    source: err,
                });
            }
        }
    }

    /// Takes the named limit `limit` for one try of the step `name`, waiting while it is
    /// reached (cancelled with the run); nothing without a limit. Counted by the store when
    /// it shares limits among workers ([`Store::shared_limits`](crate::Store::shared_limits)),
    /// else in the process.
    ///
    /// # Errors
    /// [`Error::InvalidName`] if the runtime declares no limit of that name;
    /// [`Error::Cancelled`] if the run is cancelled while the step waits;
    /// [`Error::Fenced`] or [`Error::Database`] from a shared store.
    async fn take_limit(&self, name: &str, limit: Option<&str>) -> Result<Option<Taken>> {
        let Some(limit) = limit else {
            return Ok(None);
        };
        if !self.run.limits.has(limit) {
            return Err(Error::InvalidName {
                run_id: self.run.run_id.clone(),
                what: "limit name",
                name: limit.to_owned(),
                reason: "no limit of this name is declared (RuntimeBuilder::limit)",
            });
        }
        let wait = LimitWait::start(limit);
        let taken = tokio::select! {
            taken = self.run.limits.take(
                limit,
                self.run.store.shared_limits(),
                &self.run.lease,
                self.seq,
                &self.run.cancel,
            ) => taken?,
            () = self.run.cancel.cancelled() => return Err(self.cancelled_error()),
        };
        let waited_ms = duration_ms(wait.end());
        if waited_ms > 0 {
            tracing::info!(step = name, limit, waited_ms, "waited for the limit");
        }
        Ok(taken)
    }

    /// One try of `f`, under the time-out of a try.
    async fn one_try<T, F, Fut>(
        &self,
        name: &str,
        occurrence: u32,
        timeout: Option<Duration>,
        f: &mut F,
    ) -> Result<T, BoxError>
    where
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = Result<T, BoxError>> + Send,
    {
        match timeout {
            None => f().await,
            Some(limit) => match self.run.time.timeout(limit, f()).await {
                Some(outcome) => outcome,
                None => Err(Box::new(Error::StepTimeout {
                    run_id: self.run.run_id.clone(),
                    state: self.state,
                    seq: self.seq,
                    step: name.to_owned(),
                    occurrence,
                    after_ms: duration_ms(limit),
                })),
            },
        }
    }

    /// Decodes the recorded output of the step `(name, occurrence)`.
    pub(super) fn decode_step<T: DeserializeOwned>(
        &self,
        name: &str,
        occurrence: u32,
        output: &RawValue,
    ) -> Result<T> {
        serde_json::from_str(output.get()).map_err(|source| Error::StepDecode {
            run_id: self.run.run_id.clone(),
            state: self.state,
            seq: self.seq,
            step: name.to_owned(),
            occurrence,
            source,
        })
    }

    /// Records, best effort, the failed try `try_no` of the step `(name, occurrence)`: the
    /// failure is for inspection only, and the caller acts on the error either way.
    async fn record_failed_try(
        &self,
        name: &str,
        occurrence: u32,
        try_no: u32,
        err: &BoxError,
        retry_at_ms: Option<u64>,
    ) {
        let record = FailureRecord {
            attempt: self.attempt,
            at_ms: self.run.time.now_ms(),
            source: FailureSource::Step {
                name: name.to_owned(),
                occurrence,
            },
            errors: error_chain(&**err),
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
        if let Err(store_err) = written {
            tracing::warn!(step = name, occurrence, error = %store_err, "could not record a failed step");
        }
        tracing::warn!(
            step = name,
            occurrence,
            try_no,
            retry_at_ms,
            error_kind = "step",
            error = %logged_text(self.run.log_texts, || error_chain(&**err).join(": ")),
            "step failed"
        );
    }

    /// Records `value` as the output of the step `(name, occurrence)`.
    pub(super) async fn record_step<T: Serialize>(
        &self,
        name: &str,
        occurrence: u32,
        value: &T,
        duration_ms: u64,
    ) -> Result<()> {
        let output = self.encode_output(name, occurrence, value)?;
        self.write_step(name, occurrence, output, (duration_ms, false))
            .await
    }

    /// The [`Error::StepEncode`] of the step `(name, occurrence)`.
    fn step_encode(&self, name: &str, occurrence: u32, source: serde_json::Error) -> Error {
        Error::StepEncode {
            run_id: self.run.run_id.clone(),
            state: self.state,
            seq: self.seq,
            step: name.to_owned(),
            occurrence,
            source,
        }
    }

    /// `value` encoded as the output of the step `(name, occurrence)`, checked against the
    /// payload limit.
    ///
    /// # Errors
    /// [`Error::StepEncode`] if it does not serialize; [`Error::PayloadTooLarge`].
    fn encode_output<T: Serialize>(
        &self,
        name: &str,
        occurrence: u32,
        value: &T,
    ) -> Result<Box<RawValue>> {
        // Serialized straight into the raw value, not parsed again (see `TransitionRecord::encode`).
        let output = serde_json::value::to_raw_value(value)
            .map_err(|source| self.step_encode(name, occurrence, source))?;
        let bytes = output.get().len();
        if bytes > self.run.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                run_id: self.run.run_id.clone(),
                what: format!("output of step `{name}`#{occurrence}"),
                seq: Some(self.seq),
                bytes,
                limit: self.run.max_payload_bytes,
            });
        }
        Ok(output)
    }

    /// The step output `output` decoded back as a `T`, as a replay decodes it.
    ///
    /// # Errors
    /// [`Error::StepEncode`] if it does not decode back: recorded, it would fail every replay.
    fn decode_output<T: DeserializeOwned>(
        &self,
        name: &str,
        occurrence: u32,
        output: &RawValue,
    ) -> Result<T> {
        serde_json::from_str(output.get())
            .map_err(|source| self.step_encode(name, occurrence, source))
    }

    /// Writes `output` as the record of the step `(name, occurrence)`, which took
    /// `duration_ms`; `after_failed_tries`: earlier tries of it failed, and the record
    /// clears the run's error their failures set ([`Write::Step`]).
    async fn write_step(
        &self,
        name: &str,
        occurrence: u32,
        output: Box<RawValue>,
        (duration_ms, after_failed_tries): (u64, bool),
    ) -> Result<()> {
        let run_id = &self.run.run_id;
        let at_ms = self.run.time.now_ms();
        let record = StepRecord {
            attempt: self.attempt,
            at_ms,
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
                    record: crate::record::to_vec_sized(&record, record.output.get().len()),
                    clear_error_at_ms: after_failed_tries.then_some(at_ms),
                },
            )
            .await?;
        tracing::debug!(step = name, occurrence, duration_ms, "step recorded");
        Ok(())
    }

    /// Takes the next occurrence of `name` and its record, if any.
    pub(super) fn next_occurrence(&self, name: &str) -> (u32, Option<StepRecord>) {
        let mut journal = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
        let next = journal.next_occurrence.entry(name.to_owned()).or_insert(0);
        let occurrence = *next;
        *next = next.saturating_add(1);
        let recorded = journal.recorded.remove(&(name.to_owned(), occurrence));
        (occurrence, recorded)
    }

    /// Takes the record of `(name, occurrence)` out of the state's journal, if there is one
    /// (for the records loops keeps under reserved names beside a step).
    pub(super) fn take_record(&self, name: &str, occurrence: u32) -> Option<StepRecord> {
        let mut journal = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
        journal.recorded.remove(&(name.to_owned(), occurrence))
    }

    /// Records `value` as the step `(name, occurrence)` unless it was recorded already, and
    /// returns the recorded value: what the first execution decided stands.
    pub(super) async fn journaled_u64(&self, name: &str, value: u64) -> Result<u64> {
        let (occurrence, recorded) = self.next_occurrence(name);
        if let Some(record) = recorded {
            return self.decode_step(name, occurrence, &record.output);
        }
        self.record_step(name, occurrence, &value, 0).await?;
        Ok(value)
    }

    /// A number in `0.0..1.0` for the jitter of the back-off after try `try_no` of the step
    /// `(name, occurrence)`: the same on every execution, different per run, state and try.
    fn jitter_unit(&self, name: &str, occurrence: u32, try_no: u32) -> f64 {
        let key = self.key_for(name, occurrence);
        crate::material::Material::with_capacity(key.len() + 11)
            .raw(key.as_bytes())
            .raw(format!("/{try_no}").as_bytes())
            .unit()
    }
}
