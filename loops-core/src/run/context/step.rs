//! Journaled steps: run once, recorded, replayed.

use std::fmt::Display;
use std::future::Future;
use std::sync::PoisonError;
use std::time::Instant;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::record::{FailureRecord, FailureSource, StepRecord, now_ms};
use crate::run::context::{Context, StepOptions};
use crate::store::{AfterFailure, Write};

impl Context {
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
    pub(super) fn next_occurrence(&self, name: &str) -> (u32, Option<Box<RawValue>>) {
        let mut journal = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
        let next = journal.next_occurrence.entry(name.to_owned()).or_insert(0);
        let occurrence = *next;
        *next += 1;
        let recorded = journal.recorded.remove(&(name.to_owned(), occurrence));
        (occurrence, recorded)
    }

    /// Records `value` as the step `(name, occurrence)` unless it was recorded already, and
    /// returns the recorded value: what the first execution decided stands.
    pub(super) async fn journaled_u64(&self, name: &str, value: u64) -> Result<u64> {
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
}
