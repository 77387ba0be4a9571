//! The runtime: drives runs from their last recorded state to a terminal state.

use std::any::TypeId;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::context::{Context, RunScope};
use crate::error::{Error, Result};
use crate::record::{
    FailureRecord, FailureSource, Transition, TransitionRecord, error_chain, now_ms,
};
use crate::retry::RetryPolicy;
use crate::store::redb::{AfterFailure, SchemaCheck, Write, precheck};
use crate::store::{RedbStore, RunInfo, RunStatus};
use crate::workflow::{Dispatch, StateId, Workflow};

/// Longest run id, in bytes.
pub const MAX_RUN_ID_BYTES: usize = 256;

/// Default limit of one serialized state or step output: 2 MiB (as Temporal's payload cap).
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 2 * 1024 * 1024;

/// Drives workflow runs and keeps their records in a store.
///
/// Cheap to clone (an `Arc`): one runtime serves any number of concurrent runs. The store
/// file is closed when the last clone is dropped.
///
/// ```no_run
/// # async fn demo() -> Result<(), loops_core::Error> {
/// let runtime = loops_core::Runtime::open("target/agent.redb")?;
/// // runtime.run("issue-42", Deliver::Received { .. }, &agent).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    store: RedbStore,
    config: Config,
    active: Mutex<HashMap<String, CancellationToken>>,
}

#[derive(Clone)]
struct Config {
    retry: RetryPolicy,
    state_retry: HashMap<(TypeId, &'static str), RetryPolicy>,
    timeout: Option<Duration>,
    state_timeout: HashMap<(TypeId, &'static str), Duration>,
    max_payload_bytes: usize,
    checks: Vec<SchemaCheck>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("store", &self.inner.store)
            .finish_non_exhaustive()
    }
}

/// Configures a [`Runtime`]: retry policies, time-outs and limits. Every setting has a
/// default; `Runtime::open(path)` is `Runtime::builder().open(path)`.
#[derive(Clone)]
pub struct RuntimeBuilder {
    config: Config,
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        RuntimeBuilder {
            config: Config {
                retry: RetryPolicy::default(),
                state_retry: HashMap::new(),
                timeout: None,
                state_timeout: HashMap::new(),
                max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
                checks: Vec::new(),
            },
        }
    }
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder").finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// The retry policy of every state that has none of its own (default:
    /// [`RetryPolicy::default`], 3 attempts).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.config.retry = policy;
        self
    }

    /// The retry policy of one state of one workflow.
    pub fn state_retry<S: StateId>(mut self, state: S, policy: RetryPolicy) -> Self {
        self.config
            .state_retry
            .insert((TypeId::of::<S>(), state.name()), policy);
        self
    }

    /// A time-out for every state's handler that has none of its own (default: none). A
    /// handler that runs longer is abandoned, and the attempt fails with
    /// [`Error::StateTimeout`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = Some(timeout);
        self
    }

    /// A time-out for one state's handler.
    pub fn state_timeout<S: StateId>(mut self, state: S, timeout: Duration) -> Self {
        self.config
            .state_timeout
            .insert((TypeId::of::<S>(), state.name()), timeout);
        self
    }

    /// The largest serialized state or step output, in bytes (default
    /// [`DEFAULT_MAX_PAYLOAD_BYTES`], 2 MiB). Larger ones fail with
    /// [`Error::PayloadTooLarge`] before anything is written.
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.config.max_payload_bytes = bytes;
        self
    }

    /// Declares a workflow this runtime drives. When the store opens, every unfinished run of
    /// `W` must have been recorded with `W`'s compiled schema: otherwise
    /// [`open`](Self::open) refuses with [`Error::SchemaMismatch`] and the store file's bytes
    /// are left as they are. (Without this, each run is checked when it is driven, and refused
    /// then without writing a record.)
    pub fn workflow<W: Workflow>(mut self) -> Self {
        self.config.checks.push(SchemaCheck {
            workflow: W::NAME,
            pinned: W::SCHEMA_HASH.pinned(),
            schema: W::SCHEMA,
        });
        self
    }

    /// Opens (or creates) the store file at `path` and returns the runtime.
    ///
    /// # Errors
    /// - [`Error::SchemaMismatch`] if an unfinished run of a workflow declared with
    ///   [`workflow`](Self::workflow) has another schema (the file is not opened for writing);
    /// - as [`RedbStore::open`]: [`Error::StoreLocked`] if the file is open elsewhere,
    ///   [`Error::Open`] if it is not a loops store or cannot be read.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Runtime> {
        precheck(path.as_ref(), &self.config.checks)?;
        let store = RedbStore::open(path)?;
        Ok(Runtime {
            inner: Arc::new(Inner {
                store,
                config: self.config,
                active: Mutex::new(HashMap::new()),
            }),
        })
    }
}

/// Removes a run from the active set when its driver stops, however it stops.
struct Claim<'a> {
    runtime: &'a Runtime,
    run_id: String,
    token: CancellationToken,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.runtime
            .inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.run_id);
    }
}

impl Runtime {
    /// Opens (or creates) the store file at `path` with the default configuration.
    ///
    /// # Errors
    /// [`Error::StoreLocked`] at once if this or another process has the file open;
    /// [`Error::Open`] if it is not a loops store or cannot be read.
    pub fn open(path: impl AsRef<Path>) -> Result<Runtime> {
        RuntimeBuilder::default().open(path)
    }

    /// A builder for a runtime with non-default retry policies, time-outs or limits.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// The store this runtime keeps its records in.
    pub fn store(&self) -> &RedbStore {
        &self.inner.store
    }

    /// Drives the run `run_id` to a terminal state and returns that state.
    ///
    /// If no run has this id, a run starts in `initial`. If one exists, it resumes from its
    /// last recorded state and `initial` is ignored: handlers of states that completed are not
    /// called again, and steps recorded by an interrupted handler return their recorded
    /// output. There is no separate recovery routine: a first run is a resume whose lookups
    /// all miss.
    ///
    /// Each transition is one durable commit (alone, or batched with other runs' commits).
    /// A failing handler is tried again under its retry policy; when the attempts run out
    /// the run ends as failed.
    ///
    /// # Errors
    /// - [`Error::InvalidRunId`]; [`Error::RunActive`] if this runtime drives the run already;
    /// - [`Error::WorkflowMismatch`] if the run is of another workflow;
    /// - [`Error::SchemaMismatch`] if it was recorded by a build whose workflow shape differs
    ///   (nothing is written, and it is never retried);
    /// - [`Error::NotInitial`] if a new run's `initial` is not the workflow's initial state;
    /// - [`Error::RunFailed`] when attempts run out (now or before), [`Error::RunCancelled`]
    ///   if the run was cancelled;
    /// - [`Error::Decode`], [`Error::Encode`], [`Error::PayloadTooLarge`],
    ///   [`Error::IllegalTransition`], [`Error::Storage`]: the run stays at its last recorded
    ///   state and can be resumed.
    pub async fn run<W, H>(&self, run_id: &str, initial: W, handler: &H) -> Result<W>
    where
        W: Dispatch<H>,
        H: ?Sized + Sync,
    {
        validate_run_id(run_id)?;
        let claim = self.claim(run_id)?;
        let span = tracing::info_span!("run", run_id, workflow = W::NAME);
        self.drive(&claim, initial, handler).instrument(span).await
    }

    fn claim(&self, run_id: &str) -> Result<Claim<'_>> {
        let mut active = self
            .inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if active.contains_key(run_id) {
            return Err(Error::RunActive {
                run_id: run_id.to_owned(),
            });
        }
        let token = CancellationToken::new();
        active.insert(run_id.to_owned(), token.clone());
        Ok(Claim {
            runtime: self,
            run_id: run_id.to_owned(),
            token,
        })
    }

    fn retry_policy<W: Workflow>(&self, state: W::State) -> RetryPolicy {
        let config = &self.inner.config;
        config
            .state_retry
            .get(&(TypeId::of::<W::State>(), state.name()))
            .copied()
            .unwrap_or(config.retry)
    }

    fn state_timeout<W: Workflow>(&self, state: W::State) -> Option<Duration> {
        let config = &self.inner.config;
        config
            .state_timeout
            .get(&(TypeId::of::<W::State>(), state.name()))
            .copied()
            .or(config.timeout)
    }

    /// Finds the run or creates it; refuses a run of another workflow or schema.
    async fn enter<W: Workflow>(
        &self,
        run_id: &str,
        initial: W,
    ) -> Result<(RunInfo, TransitionRecord, bool)> {
        let store = &self.inner.store;
        let compiled = W::SCHEMA_HASH.pinned();
        if let Some((info, record)) = store.latest(run_id)? {
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
                return Err(Error::SchemaMismatch {
                    run_id: run_id.to_owned(),
                    workflow: W::NAME.to_owned(),
                    stored,
                    compiled,
                    changes: self.schema_changes::<W>(stored),
                });
            }
            tracing::info!(
                state = %record.state,
                seq = info.seq,
                status = %info.status,
                "resuming run"
            );
            return Ok((info, record, false));
        }
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
        let info = RunInfo {
            run_id: run_id.to_owned(),
            workflow: W::NAME.to_owned(),
            schema: compiled,
            status: if given.is_terminal() {
                RunStatus::Completed
            } else {
                RunStatus::Running
            },
            state: given.name().to_owned(),
            seq: 0,
            attempt: 1,
            attempt_base: 0,
            created_ms: now,
            updated_ms: now,
            retry_at_ms: None,
            error: None,
            cancel: None,
        };
        store
            .write(Write::Create {
                info: info.clone(),
                record: record.to_bytes(),
                schema_text: W::SCHEMA,
            })
            .await?;
        tracing::info!(state = given.name(), seq = 0, "run started");
        Ok((info, record, true))
    }

    /// What changed between the stored schema description and the compiled one, one line
    /// each; empty when the stored description is unavailable.
    fn schema_changes<W: Workflow>(&self, stored: crate::SchemaHash) -> Vec<String> {
        match self.inner.store.schema(stored) {
            Ok(Some(old)) => crate::schema::diff_descriptions(&old, W::SCHEMA),
            _ => Vec::new(),
        }
    }

    fn check_size(&self, run_id: &str, record: &TransitionRecord) -> Result<()> {
        let bytes = record.payload.get().len();
        let limit = self.inner.config.max_payload_bytes;
        if bytes > limit {
            return Err(Error::PayloadTooLarge {
                run_id: run_id.to_owned(),
                what: format!("state `{}`", record.state),
                seq: record.seq,
                bytes,
                limit,
            });
        }
        Ok(())
    }

    async fn drive<W, H>(&self, claim: &Claim<'_>, initial: W, handler: &H) -> Result<W>
    where
        W: Dispatch<H>,
        H: ?Sized + Sync,
    {
        let run_id = claim.run_id.as_str();
        let store = &self.inner.store;
        let (mut info, mut record, mut fresh) = self.enter(run_id, initial).await?;
        let scope = Arc::new(RunScope {
            run_id: run_id.to_owned(),
            workflow: W::NAME,
            store: store.clone(),
            cancel: claim.token.clone(),
            max_payload_bytes: self.inner.config.max_payload_bytes,
        });
        let mut last_error: Option<crate::BoxError> = None;
        loop {
            match info.status {
                RunStatus::Completed => return record.decode(run_id),
                RunStatus::Failed => {
                    return Err(Error::RunFailed {
                        run_id: run_id.to_owned(),
                        state: info.state,
                        seq: info.seq,
                        attempts: info.attempt.saturating_sub(info.attempt_base),
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
                RunStatus::Running => {}
            }
            if info.cancel.is_some() || claim.token.is_cancelled() {
                info = self.end_cancelled(run_id).await?;
                continue;
            }
            let value: W = record.decode(run_id)?;
            let state = value.state();
            let policy = self.retry_policy::<W>(state);
            if !fresh {
                // Every execution but the first after an in-process commit starts a new,
                // durably counted attempt: a state that crashes the process on every attempt
                // stops after `max_attempts` too.
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
                            () = claim.token.cancelled() => continue,
                        }
                    }
                }
                info = expect_info(
                    store
                        .write(Write::BeginAttempt {
                            run_id: run_id.to_owned(),
                            seq: info.seq,
                            max_attempts: policy.max_attempts,
                            at_ms: now_ms(),
                        })
                        .await?,
                    run_id,
                )?;
                if info.status != RunStatus::Running {
                    continue;
                }
            }
            fresh = false;
            let seq = info.seq;
            let attempt = info.attempt;
            let ctx = Context::new(
                Arc::clone(&scope),
                state.name(),
                seq,
                attempt,
                store.steps(run_id, seq)?,
            );
            let span = tracing::info_span!("state", state = state.name(), seq, attempt);
            let outcome = async {
                tracing::debug!("handler started");
                let fut = value.dispatch(handler, &ctx);
                match self.state_timeout::<W>(state) {
                    None => fut.await.map_err(Failure::Handler),
                    Some(limit) => match tokio::time::timeout(limit, fut).await {
                        Ok(result) => result.map_err(Failure::Handler),
                        Err(_) => Err(Failure::Timeout(limit)),
                    },
                }
            }
            .instrument(span)
            .await;
            drop(ctx);
            match outcome {
                Ok(next) => {
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
                    info = expect_info(
                        store
                            .write(Write::Transition {
                                run_id: run_id.to_owned(),
                                seq: seq + 1,
                                state: to.name().to_owned(),
                                record: next_record.to_bytes(),
                                terminal: to.is_terminal(),
                                at_ms: now,
                            })
                            .await?,
                        run_id,
                    )?;
                    tracing::info!(
                        from = state.name(),
                        to = to.name(),
                        seq = seq + 1,
                        "transition committed"
                    );
                    record = next_record;
                    fresh = true;
                    last_error = None;
                }
                Err(failure) => {
                    if claim.token.is_cancelled() {
                        continue;
                    }
                    let err: crate::BoxError = match failure {
                        Failure::Handler(e) => e,
                        Failure::Timeout(limit) => Box::new(Error::StateTimeout {
                            run_id: run_id.to_owned(),
                            state: state.name(),
                            seq,
                            attempt,
                            after_ms: limit.as_millis() as u64,
                        }),
                    };
                    let errors = error_chain(&*err);
                    let used = attempt.saturating_sub(info.attempt_base);
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
                    info = expect_info(
                        store
                            .write(Write::Failure {
                                run_id: run_id.to_owned(),
                                seq,
                                record: FailureRecord {
                                    attempt,
                                    at_ms: now,
                                    source: FailureSource::Handler,
                                    errors,
                                },
                                then,
                            })
                            .await?,
                        run_id,
                    )?;
                    last_error = Some(err);
                }
            }
        }
    }

    async fn end_cancelled(&self, run_id: &str) -> Result<RunInfo> {
        let info = expect_info(
            self.inner
                .store
                .write(Write::EndCancelled {
                    run_id: run_id.to_owned(),
                    at_ms: now_ms(),
                })
                .await?,
            run_id,
        )?;
        tracing::info!(state = %info.state, seq = info.seq, "run cancelled");
        Ok(info)
    }

    /// Cancels the run `run_id`, durably. A run this runtime is driving sees the cancellation
    /// through its [`Context`] and ends as cancelled at its next step or state boundary; a run
    /// nobody drives ends as cancelled at once.
    ///
    /// # Errors
    /// [`Error::RunNotFound`]; [`Error::RunEnded`] if the run has ended already;
    /// [`Error::Storage`] if the request could not be committed.
    pub async fn cancel(&self, run_id: &str, reason: &str) -> Result<RunInfo> {
        validate_run_id(run_id)?;
        let token = self
            .inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(run_id)
            .cloned();
        let info = expect_info(
            self.inner
                .store
                .write(Write::Cancel {
                    run_id: run_id.to_owned(),
                    reason: reason.to_owned(),
                    end_now: token.is_none(),
                    at_ms: now_ms(),
                })
                .await?,
            run_id,
        )?;
        if let Some(token) = token {
            token.cancel();
        }
        tracing::info!(run_id, reason, "cancellation requested");
        Ok(info)
    }

    /// Makes a failed run running again with a fresh budget of attempts; drive it again with
    /// [`run`](Self::run).
    ///
    /// # Errors
    /// [`Error::RunNotFound`]; [`Error::NotFailed`] if the run is not failed;
    /// [`Error::Storage`] if the change could not be committed.
    pub async fn retry(&self, run_id: &str) -> Result<RunInfo> {
        validate_run_id(run_id)?;
        expect_info(
            self.inner
                .store
                .write(Write::Retry {
                    run_id: run_id.to_owned(),
                    at_ms: now_ms(),
                })
                .await?,
            run_id,
        )
    }

    /// The run's current standing, or `None` if no run has this id.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if the row is unreadable.
    pub fn run_info(&self, run_id: &str) -> Result<Option<RunInfo>> {
        self.inner.store.run(run_id)
    }

    /// The run's current state and its sequence number, decoded as `W`, or `None` if no run
    /// has this id.
    ///
    /// # Errors
    /// [`Error::WorkflowMismatch`] if the run is of another workflow; [`Error::Decode`] if the
    /// record does not decode as `W`; [`Error::Storage`] on a read error.
    pub fn state<W: Workflow>(&self, run_id: &str) -> Result<Option<(u64, W)>> {
        let Some((info, record)) = self.inner.store.latest(run_id)? else {
            return Ok(None);
        };
        check_workflow::<W>(&info)?;
        Ok(Some((record.seq, record.decode(run_id)?)))
    }

    /// Every transition of the run, in order, decoded as `W` (empty if no run has this id).
    ///
    /// # Errors
    /// [`Error::WorkflowMismatch`] if the run is of another workflow; [`Error::Decode`] naming
    /// the sequence number of a record that does not decode as `W`; [`Error::Storage`].
    pub fn history<W: Workflow>(&self, run_id: &str) -> Result<Vec<Transition<W>>> {
        if let Some(info) = self.inner.store.run(run_id)? {
            check_workflow::<W>(&info)?;
        }
        self.inner
            .store
            .history(run_id)?
            .into_iter()
            .map(|record| {
                let value: W = record.decode(run_id)?;
                Ok(Transition {
                    seq: record.seq,
                    state: value.state(),
                    at_ms: record.at_ms,
                    value,
                })
            })
            .collect()
    }

    /// The runs with `status`, optionally only those of workflow `workflow`, read from the
    /// status index.
    ///
    /// # Errors
    /// [`Error::Storage`] on a read error; [`Error::Decode`] if a row is unreadable.
    pub fn list_runs(&self, status: RunStatus, workflow: Option<&str>) -> Result<Vec<RunInfo>> {
        self.inner.store.list(status, workflow)
    }
}

enum Failure {
    Handler(crate::BoxError),
    Timeout(Duration),
}

fn check_workflow<W: Workflow>(info: &RunInfo) -> Result<()> {
    if info.workflow != W::NAME {
        return Err(Error::WorkflowMismatch {
            run_id: info.run_id.clone(),
            stored: info.workflow.clone(),
            requested: W::NAME,
        });
    }
    Ok(())
}

fn expect_info(info: Option<RunInfo>, run_id: &str) -> Result<RunInfo> {
    info.ok_or_else(|| Error::RunNotFound {
        run_id: run_id.to_owned(),
    })
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

/// Checks a run id: not empty, at most [`MAX_RUN_ID_BYTES`] bytes, no control characters.
///
/// # Errors
/// [`Error::InvalidRunId`] saying which rule the id breaks.
pub fn validate_run_id(run_id: &str) -> Result<()> {
    let reason = if run_id.is_empty() {
        "empty"
    } else if run_id.len() > MAX_RUN_ID_BYTES {
        "longer than 256 bytes"
    } else if run_id.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    Err(Error::InvalidRunId {
        run_id: run_id.to_owned(),
        reason,
    })
}
