//! The context a handler receives: the run's identity, journaled steps, idempotency keys and
//! cancellation.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::record::{FailureRecord, FailureSource, StepRecord, now_ms};
use crate::store::RedbStore;
use crate::store::redb::{AfterFailure, Write};

/// Longest step or event name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

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
}

/// What all contexts of one driven run share.
pub(crate) struct RunScope {
    pub(crate) run_id: String,
    pub(crate) workflow: &'static str,
    pub(crate) store: RedbStore,
    pub(crate) cancel: CancellationToken,
    pub(crate) max_payload_bytes: usize,
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

/// Options of one step: see [`Context::step_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepOptions {
    /// Abandon the step's closure after this long; the step then fails with
    /// [`Error::StepTimeout`] (a failed attempt under the state's retry policy).
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
        }
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

    /// Which attempt at handling this state this is, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether the run has been cancelled. Steps started after a cancellation return
    /// [`Error::Cancelled`] without running; a long step may poll this, or await
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
    /// [`idempotency_key`](Self::idempotency_key) so that it can refuse the repeat.
    ///
    /// # Errors
    /// `f`'s own error; otherwise, converted into `E`:
    /// - [`Error::InvalidName`] for an empty name, one longer than [`MAX_NAME_BYTES`] or with
    ///   control characters;
    /// - [`Error::StepDecode`] if a recorded output does not decode as `T` (the handler's code
    ///   changed since the record: never a silently wrong value);
    /// - [`Error::Cancelled`] if the run was cancelled before the step started;
    /// - [`Error::StepTimeout`] if `options.timeout` passed;
    /// - [`Error::StepEncode`] or [`Error::PayloadTooLarge`] if the output cannot be recorded;
    /// - [`Error::Storage`] or [`Error::Fenced`] if the record could not be committed.
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
        self.check_name(name)?;
        let (occurrence, recorded) = {
            let mut journal = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
            let next = journal.next_occurrence.entry(name.to_owned()).or_insert(0);
            let occurrence = *next;
            *next += 1;
            let recorded = journal.recorded.remove(&(name.to_owned(), occurrence));
            (occurrence, recorded)
        };
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
            return Err(E::from(Error::Cancelled {
                run_id: self.run.run_id.clone(),
                state: self.state,
                seq: self.seq,
            }));
        }
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
                self.record_step(name, occurrence, &value, duration_ms)
                    .await
                    .map_err(E::from)?;
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
                    .write(Write::Failure {
                        run_id: self.run.run_id.clone(),
                        seq: self.seq,
                        record,
                        then: AfterFailure::Nothing,
                    })
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
                seq: self.seq,
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
            .write(Write::Step {
                run_id: run_id.clone(),
                seq: self.seq,
                name: name.to_owned(),
                occurrence,
                record: crate::record::to_vec(&record),
            })
            .await?;
        tracing::debug!(step = name, occurrence, duration_ms, "step recorded");
        Ok(())
    }

    /// A key that names one side effect of this state, the same on every execution of the
    /// handler (every retry, every resume after a crash), and different for every other
    /// run, state, name and use.
    ///
    /// Pass it to the outside system (a forge, a payment API, a message broker) so that it can
    /// refuse a repeat: that closes the window between a side effect and its step record.
    /// The `n`-th call with the same `name` in one execution gets the `n`-th key, so call it
    /// in a fixed order. The key is `"{workflow}:{run id}:{seq}:{name}:{n}"` hashed with
    /// XXH3-128, as 32 hex digits after the prefix `lk-`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty name, one longer than [`MAX_NAME_BYTES`] or with
    /// control characters.
    pub fn idempotency_key(&self, name: &str) -> Result<String> {
        self.check_name(name)?;
        let n = {
            let mut journal = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
            let next = journal.next_key.entry(name.to_owned()).or_insert(0);
            let n = *next;
            *next += 1;
            n
        };
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
        Ok(format!(
            "lk-{:032x}",
            xxhash_rust::xxh3::xxh3_128(&material)
        ))
    }

    fn check_name(&self, name: &str) -> Result<()> {
        validate_name(name).map_err(|reason| Error::InvalidName {
            run_id: self.run.run_id.clone(),
            name: name.to_owned(),
            reason,
        })
    }
}

/// Checks a step or event name: not empty, at most [`MAX_NAME_BYTES`], no control characters.
pub(crate) fn validate_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() {
        Err("empty")
    } else if name.len() > MAX_NAME_BYTES {
        Err("longer than 256 bytes")
    } else if name.chars().any(char::is_control) {
        Err("contains control characters")
    } else {
        Ok(())
    }
}
