//! Child runs: a handler starts a run of any workflow exactly once
//! ([`Context::start_child`]) and joins it ([`Context::join_child`], [`Context::join_all`],
//! [`Context::join_first`]), each journaled like a step.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::attribute::AttributeValue;
use crate::error::{Error, RecordKind, Result};
use crate::names::{CHILD_ENDED, RESERVED_PREFIX, validate_run_id, validate_run_id_lookup};
use crate::row::{OnParentCancel, ParentLink};
use crate::run::context::Context;
use crate::status::RunStatus;
use crate::store::Write;
use crate::workflow::{StateId, Workflow};

/// What a context asks of the runtime that drives its run: to drive a child run it started.
/// Held weakly by the run's scope (the runtime implements it; this layer knows nothing of
/// it).
pub(crate) trait Kin: Send + Sync {
    /// Drive the run `run_id` of `workflow`, just created (or found) as a child, in the
    /// background if this process has a handler for it; else leave it to a worker that has.
    fn drive_child(self: Arc<Self>, workflow: &str, run_id: &str);

    /// Make sure the child run `run_id` of `workflow`, started in an earlier execution of
    /// the parent's handler (perhaps by a process that stopped), is driven: once per
    /// process, a driver for it if none drives it here already. That driver takes it up where
    /// it stands: a child parked on a timer parks again with its timer armed here, one that
    /// waits for an event looks at its inbox. Without it, a process that drives only the
    /// parent (`Runtime::run`, no `resume_all`) would join children nobody drives.
    fn look_after_child(self: Arc<Self>, workflow: &str, run_id: &str);

    /// Whether this process has not looked after the children of the run `parent` yet
    /// (marks it): a parent waiting for its children lists them once per process, not at
    /// each of its wake-ups.
    fn first_look_at_children(&self, parent: &str) -> bool;

    /// Whether a child of `workflow` with schema `schema` can be driven: this process has a
    /// handler for it, or the store is shared by workers (one that has a handler claims it).
    fn can_drive(&self, workflow: &str, schema: crate::SchemaHash) -> bool;
}

/// A child run started by [`Context::start_child`]: its id, typed by its workflow. Join it
/// with [`Context::join_child`]. A handle can be made again from the id alone
/// ([`ChildRun::new`]), for a child started in an earlier state.
pub struct ChildRun<W> {
    run_id: String,
    workflow: PhantomData<fn() -> W>,
}

impl<W> ChildRun<W> {
    /// The handle of the child run `run_id` (of workflow `W`).
    pub fn new(run_id: impl Into<String>) -> Self {
        ChildRun {
            run_id: run_id.into(),
            workflow: PhantomData,
        }
    }

    /// The child's run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }
}

impl<W> Clone for ChildRun<W> {
    fn clone(&self) -> Self {
        ChildRun::new(self.run_id.clone())
    }
}

impl<W> std::fmt::Debug for ChildRun<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ChildRun").field(&self.run_id).finish()
    }
}

/// How [`Context::start_child_with`] starts a child run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChildOptions {
    /// What the parent's cancellation does to the child (default: cancels it too).
    pub on_parent_cancel: OnParentCancel,
    /// The child's attributes, recorded with its first state.
    pub attributes: Vec<(String, AttributeValue)>,
}

impl ChildOptions {
    /// The child is not cancelled with its parent: it runs to its own end
    /// ([`OnParentCancel::Abandon`]).
    pub fn abandon(mut self) -> Self {
        self.on_parent_cancel = OnParentCancel::Abandon;
        self
    }

    /// Also records the child's attribute `key` = `value` (checked when it is created, by
    /// [`check_attribute`](crate::check_attribute); a key that starts with
    /// [`RESERVED_ATTRIBUTE_PREFIX`](crate::RESERVED_ATTRIBUTE_PREFIX) is refused).
    pub fn attribute(mut self, key: impl Into<String>, value: impl Into<AttributeValue>) -> Self {
        self.attributes.push((key.into(), value.into()));
        self
    }
}

/// How a joined child run ended when it did not complete: what the parent's handler
/// branches on. Journaled with the join, so a replay sees the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChildError {
    /// The child failed (its attempts ran out, or its handler gave up).
    #[error("child run `{run_id}` failed in state `{state}` (seq {seq}): {}", errors.join(": "))]
    Failed {
        /// The child's run id.
        run_id: String,
        /// The state it failed in.
        state: String,
        /// That state's sequence number.
        seq: u64,
        /// Its last error chain, outermost first.
        errors: Vec<String>,
    },
    /// The child was cancelled (by its parent's cancellation, or on its own).
    #[error("child run `{run_id}` was cancelled in state `{state}` (seq {seq}): {reason}")]
    Cancelled {
        /// The child's run id.
        run_id: String,
        /// The state it was in.
        state: String,
        /// That state's sequence number.
        seq: u64,
        /// The reason given.
        reason: String,
    },
}

/// One ended child, as a join records it.
#[derive(Debug, Serialize, Deserialize)]
struct Joined {
    /// Its place in the list the handler joined.
    index: usize,
    /// When it ended, ms since the Unix epoch (its row's last change).
    ended_ms: u64,
    /// How.
    outcome: Ended,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Ended {
    /// Its terminal state (the whole workflow value, JSON) and its seq.
    Completed { seq: u64, state: Box<RawValue> },
    /// It failed or was cancelled.
    Not(ChildError),
}

/// The step name a child's start is recorded under.
fn start_step(child: &str) -> String {
    format!("{RESERVED_PREFIX}child:{child}")
}

/// The step name joins are recorded under (one occurrence per join).
const JOIN_STEP: &str = "loops:join";

impl Context {
    /// Starts the child run `child_id` of workflow `W` in `initial` (its initial state),
    /// exactly once: see [`start_child_with`](Self::start_child_with), with the default
    /// options (the child is cancelled with this run).
    ///
    /// # Errors
    /// As [`start_child_with`](Self::start_child_with).
    pub async fn start_child<W: Workflow>(
        &self,
        child_id: &str,
        initial: W,
    ) -> Result<ChildRun<W>> {
        self.start_child_with(child_id, initial, ChildOptions::default())
            .await
    }

    /// Starts the child run `child_id` of workflow `W` in `initial`, with `options`, and
    /// returns its handle. The start is journaled like a step (under the reserved name
    /// `loops:child:{child_id}`): a re-execution of the handler returns the handle without
    /// writing anything. The child's row records this run as its parent
    /// ([`RunInfo::parent`](crate::RunInfo::parent)) with its cancel policy; its creation is idempotent by id: if the
    /// process stopped between the creation and the step's record, the re-execution finds
    /// the child (this run's, of `W`) and attaches to it. The runtime drives the child in the
    /// background if it has a handler registered for `W` (on a shared store, any worker that
    /// has one claims it).
    ///
    /// # Errors
    /// [`Error::Cancelled`] if this run was cancelled before the start (nothing is created;
    /// a start recorded before the cancellation replays); [`Error::InvalidRunId`];
    /// [`Error::NotInitial`] (naming the child) if `initial` is not
    /// `W`'s initial state; [`Error::ChildConflict`] if a run `child_id` exists that is not
    /// this run's child of `W` (nothing written), or if this state started a child
    /// `child_id` already; [`Error::NotRegistered`] if no handler for `W` is registered and
    /// the store is not shared by workers (nobody would drive the child); these come out the
    /// same at every try, so a handler that returns them fails at once
    /// ([`Error::repeats`]); [`Error::PayloadTooLarge`],
    /// [`Error::Encode`]; [`Error::Fenced`] or [`Error::LeaseExpired`] if this driver no
    /// longer holds the run; a store error.
    pub async fn start_child_with<W: Workflow>(
        &self,
        child_id: &str,
        initial: W,
        options: ChildOptions,
    ) -> Result<ChildRun<W>> {
        // A start recorded before `validate_run_id` refused more replays: the rules of a
        // lookup here, those of a new run before the child is created.
        validate_run_id_lookup(child_id)?;
        let name = start_step(child_id);
        let (occurrence, recorded) = self.next_occurrence(&name);
        if recorded.is_some() {
            self.look_after_child(W::NAME, child_id);
            return Ok(ChildRun::new(child_id));
        }
        validate_run_id(child_id)?;
        if occurrence > 0 {
            // A second start of the same id in this state: a bug of the handler (two
            // children meant, one id), not the re-execution that attaching is for.
            return Err(Error::ChildConflict {
                run_id: self.run.run_id.clone(),
                state: self.state,
                seq: self.seq,
                child: child_id.to_owned(),
                reason: "this state started a child with that id already; give each child an id of its own".to_owned(),
            });
        }
        if self.is_cancelled() {
            // As a step started after the cancellation: the child is not created.
            return Err(self.cancelled_error());
        }
        if let Some(kin) = self.run.kin.as_ref().and_then(std::sync::Weak::upgrade)
            && !kin.can_drive(W::NAME, W::SCHEMA_HASH.pinned())
        {
            // On a store that only this process opens, nobody would ever drive it.
            return Err(Error::NotRegistered {
                workflow: W::NAME.to_owned(),
            });
        }
        for (key, _) in &options.attributes {
            crate::attribute::refuse_reserved(key).map_err(|reason| Error::InvalidAttribute {
                run_id: child_id.to_owned(),
                state: initial.state().name().to_owned(),
                seq: 0,
                key: key.clone(),
                reason,
            })?;
        }
        // No attempt of the child has begun: the driver that takes it begins attempt 1
        // (`Write::BeginAttempt`). With attempt 1 here, that driver took the child for a
        // run whose first attempt was interrupted, and recorded a failure that never was.
        let (mut info, record) = crate::run::driver::first_record(
            child_id,
            &initial,
            &self.run.time,
            self.run.max_payload_bytes,
            false,
        )?;
        info.parent = Some(ParentLink {
            run_id: self.run.run_id.clone(),
            on_cancel: options.on_parent_cancel,
        });
        self.run.clock.check(self.seq)?;
        let created = self
            .run
            .store
            .write(
                None,
                Write::Create {
                    info,
                    record: record.to_bytes(),
                    schema_text: W::SCHEMA,
                    attributes: options.attributes,
                },
            )
            .await;
        match created {
            Ok(_) => tracing::info!(child = child_id, workflow = W::NAME, "child run started"),
            Err(Error::SequenceConflict { .. }) => self.attach::<W>(child_id).await?,
            Err(e) => return Err(e),
        }
        let output = serde_json::json!({ "child": child_id, "workflow": W::NAME });
        self.record_step(&name, occurrence, &output, 0).await?;
        if let Some(kin) = self.run.kin.as_ref().and_then(std::sync::Weak::upgrade) {
            kin.drive_child(W::NAME, child_id);
        }
        Ok(ChildRun::new(child_id))
    }

    /// Asks the runtime driving this run (if any) to look after the child `child_id` of
    /// `workflow`: [`Kin::look_after_child`].
    fn look_after_child(&self, workflow: &str, child_id: &str) {
        if let Some(kin) = self.run.kin.as_ref().and_then(std::sync::Weak::upgrade) {
            kin.look_after_child(workflow, child_id);
        }
    }

    /// Checks that the existing run `child_id` is this run's child of `W`.
    async fn attach<W: Workflow>(&self, child_id: &str) -> Result<()> {
        let conflict = |reason: String| Error::ChildConflict {
            run_id: self.run.run_id.clone(),
            state: self.state,
            seq: self.seq,
            child: child_id.to_owned(),
            reason,
        };
        let Some(found) = self.run.store.run_info(child_id).await? else {
            // Created and pruned meanwhile: it was ours (a creation refused for its id).
            return Err(conflict("its id is taken by a run that is gone".to_owned()));
        };
        if found.workflow != W::NAME {
            return Err(conflict(format!(
                "a run of workflow `{}` has that id",
                found.workflow
            )));
        }
        match &found.parent {
            Some(p) if p.run_id == self.run.run_id => {
                tracing::info!(child = child_id, "child run found; attached");
                Ok(())
            }
            Some(p) => Err(conflict(format!("it is the child of run `{}`", p.run_id))),
            None => Err(conflict("a run without a parent has that id".to_owned())),
        }
    }

    /// Waits durably until the child run has ended and returns its terminal state, or how it
    /// failed or was cancelled (the inner `Err`, to branch on). See
    /// [`join_first`](Self::join_first).
    ///
    /// # Errors
    /// As [`join_first`](Self::join_first).
    pub async fn join_child<W: Workflow>(
        &self,
        child: &ChildRun<W>,
    ) -> Result<std::result::Result<W, ChildError>> {
        let mut joined = self.join_first(1, std::slice::from_ref(child)).await?;
        match joined.pop() {
            Some((_, result)) => Ok(result),
            None => Err(Error::RunNotFound {
                run_id: child.run_id.clone(),
            }),
        }
    }

    /// Waits durably until every child in `children` has ended; returns their outcomes in
    /// the order of `children`. See [`join_first`](Self::join_first).
    ///
    /// # Errors
    /// As [`join_first`](Self::join_first).
    pub async fn join_all<W: Workflow>(
        &self,
        children: &[ChildRun<W>],
    ) -> Result<Vec<std::result::Result<W, ChildError>>> {
        let mut joined = self.join_first(children.len(), children).await?;
        joined.sort_by_key(|(index, _)| *index);
        Ok(joined.into_iter().map(|(_, result)| result).collect())
    }

    /// Waits durably until `k` of `children` have ended (all of them if there are fewer);
    /// returns those `k`, each with its place in `children`, in the order they ended (by the
    /// time each ended, then by place).
    ///
    /// The truth is the children's rows: a join reads them (one read of this run's
    /// children), and if fewer than `k` have ended it waits for the event
    /// [`CHILD_ENDED`](crate::CHILD_ENDED), which each child's end sends this run in the
    /// commit that ends it, then reads them again. With nothing to deliver the run parks: it
    /// holds no task, and the handler runs again when a child ends (its recorded steps,
    /// starts of children included, replay). N children that end together cost one wake-up,
    /// not N. Joins of one handler in flight at once (`tokio::join!`) take turns to look and
    /// wait, so that none takes the event meant to wake another. The outcome is journaled as
    /// a step (under `loops:join`), so a re-execution returns the same, even once the
    /// children are pruned.
    ///
    /// # Errors
    /// [`Error::RunNotFound`] for a child that does not exist; [`Error::WorkflowMismatch`]
    /// for one that is not of `W`; [`Error::Decode`] for a terminal state that does not
    /// decode as `W`; [`Error::StepDecode`] for a recorded join that does not decode;
    /// [`Error::Cancelled`] if this run is cancelled while it waits in place; the errors of a
    /// step's record (fence, lease, store).
    pub async fn join_first<W: Workflow>(
        &self,
        k: usize,
        children: &[ChildRun<W>],
    ) -> Result<Vec<(usize, std::result::Result<W, ChildError>)>> {
        let k = k.min(children.len());
        let (occurrence, recorded) = self.next_occurrence(JOIN_STEP);
        let joined: Vec<Joined> = match recorded {
            Some(record) => self.decode_step(JOIN_STEP, occurrence, &record.output)?,
            None => loop {
                // The look and the wait are one turn: a child that ends after the look sends
                // an event that this join's wait takes (or that wakes the parked run), as no
                // other join of the handler waits meanwhile.
                let turn = self.joins.lock().await;
                let mut ended = self.look(children).await?;
                if ended.len() >= k {
                    drop(turn);
                    ended.sort_by_key(|j| (j.ended_ms, j.index));
                    ended.truncate(k);
                    self.with_states(children, &mut ended).await?;
                    self.record_step(JOIN_STEP, occurrence, &ended, 0).await?;
                    break ended;
                }
                self.wait_for::<serde_json::Value>(CHILD_ENDED).await?;
            },
        };
        joined
            .into_iter()
            .map(|j| {
                let child = children.get(j.index).map_or("?", |c| c.run_id.as_str());
                let result = match j.outcome {
                    Ended::Completed { seq, state } => Ok(decode_state::<W>(child, seq, &state)?),
                    Ended::Not(e) => Err(e),
                };
                Ok((j.index, result))
            })
            .collect()
    }

    /// The children of `children` that have ended, read from their rows (one read of this
    /// run's children; a child linked to another parent is read on its own). A completed
    /// child's terminal state is not read here (see [`with_states`](Self::with_states)):
    /// a join looks at the rows once per wake-up, and reads the states once, at the end.
    async fn look<W: Workflow>(&self, children: &[ChildRun<W>]) -> Result<Vec<Joined>> {
        let rows = self.run.store.children(&self.run.run_id).await?;
        let mut ended = Vec::new();
        for (index, child) in children.iter().enumerate() {
            let info = match rows.iter().find(|r| r.run_id == child.run_id) {
                Some(info) => info.clone(),
                None => self
                    .run
                    .store
                    .run_info(&child.run_id)
                    .await?
                    .ok_or_else(|| Error::RunNotFound {
                        run_id: child.run_id.clone(),
                    })?,
            };
            if info.workflow != W::NAME {
                return Err(Error::WorkflowMismatch {
                    run_id: child.run_id.clone(),
                    stored: info.workflow,
                    requested: W::NAME,
                });
            }
            let outcome = match info.status {
                // The state is read once the join has its children (`with_states`).
                RunStatus::Completed => Ended::Completed {
                    seq: info.seq,
                    state: RawValue::from_string("null".to_owned()).map_err(|source| {
                        Error::Decode {
                            run_id: child.run_id.clone(),
                            record: RecordKind::Transition,
                            seq: info.seq,
                            state: info.state.clone(),
                            source,
                        }
                    })?,
                },
                RunStatus::Failed => Ended::Not(ChildError::Failed {
                    run_id: child.run_id.clone(),
                    state: info.state.clone(),
                    seq: info.seq,
                    errors: info.error.clone().unwrap_or_default(),
                }),
                RunStatus::Cancelled => Ended::Not(ChildError::Cancelled {
                    run_id: child.run_id.clone(),
                    state: info.state.clone(),
                    seq: info.seq,
                    reason: info.cancel.clone().unwrap_or_default(),
                }),
                RunStatus::Running | RunStatus::Waiting => {
                    self.look_after_child(W::NAME, &child.run_id);
                    continue;
                }
                // Waits for a build that can route it, which looks for it itself.
                RunStatus::Blocked => continue,
            };
            ended.push(Joined {
                index,
                ended_ms: info.updated_ms,
                outcome,
            });
        }
        Ok(ended)
    }

    /// Fills in the terminal state of each completed child of `joined` from its latest
    /// record (a completed run's record never changes).
    async fn with_states<W>(&self, children: &[ChildRun<W>], joined: &mut [Joined]) -> Result<()> {
        for j in joined {
            let Ended::Completed { seq, state } = &mut j.outcome else {
                continue;
            };
            let child = children.get(j.index).map_or("?", |c| c.run_id.as_str());
            let Some((_, record)) = self.run.store.latest(child).await? else {
                return Err(Error::RunNotFound {
                    run_id: child.to_owned(),
                });
            };
            *seq = record.seq;
            *state = record.payload;
        }
        Ok(())
    }
}

/// The terminal state `state` (JSON) of the child `child`, at `seq`, as `W`.
fn decode_state<W: Workflow>(child: &str, seq: u64, state: &RawValue) -> Result<W> {
    serde_json::from_str(state.get()).map_err(|source| Error::Decode {
        run_id: child.to_owned(),
        record: RecordKind::Transition,
        seq,
        state: String::new(),
        source,
    })
}
