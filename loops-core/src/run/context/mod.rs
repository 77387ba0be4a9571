//! The context a handler receives: the run's identity, journaled steps, idempotency keys and
//! cancellation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::attribute::AttributeValue;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::material::Material;
use crate::names::{RESERVED_PREFIX, validate_name};
use crate::record::StepRecord;
use crate::run::limits::Limits;
use crate::run::settings::{LeaseClock, StepObserver};
use crate::store::{Lease, Store, Write};

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
    /// Attempts the state's retry policy allows after this one, should it fail.
    attempts_left: u32,
    journal: Mutex<Journal>,
    /// The keys handed to `step_keyed` closures, kept as long as the context.
    keys: KeyArena,
    parked: AtomicBool,
    park_signal: Notify,
    /// Held by a join from its look at the children's rows to the end of its wait for
    /// [`CHILD_ENDED`](crate::CHILD_ENDED): the joins of one handler look and wait one at a
    /// time, so that no join takes the event another one's child sent between that join's
    /// look and its wait (which would then park the run with nothing left to wake it).
    joins: tokio::sync::Mutex<()>,
}

/// What all contexts of one driven run share.
pub(crate) struct RunScope {
    pub(crate) run_id: String,
    pub(crate) workflow: &'static str,
    /// The run's key nonce ([`RunInfo::key_nonce`](crate::RunInfo::key_nonce)), mixed into
    /// its idempotency keys.
    pub(crate) key_nonce: Option<u64>,
    /// The workflow's schema description (`Workflow::SCHEMA`): the events a wait by a plain
    /// name is checked against.
    pub(crate) schema: &'static str,
    pub(crate) store: Arc<dyn Store>,
    /// The driver's lease: every write of this run carries it.
    pub(crate) lease: Lease,
    pub(crate) cancel: CancellationToken,
    pub(crate) max_payload_bytes: usize,
    pub(crate) park_threshold: Duration,
    /// The lease's deadline, checked before a step's closure and every commit.
    pub(crate) clock: LeaseClock,
    /// The runtime's named limits.
    pub(crate) limits: Arc<Limits>,
    /// The runtime's clock: recorded times, sleeps, deadlines, back-offs, time-outs.
    pub(crate) time: Clock,
    /// Whether log lines carry error texts ([`logged_text`](crate::run::settings::logged_text)).
    pub(crate) log_texts: bool,
    /// Told of every run of a step's closure (the test kit's crash explorer).
    pub(crate) observer: Option<StepObserver>,
    /// The runtime, to drive the child runs the handler starts (`None` outside a runtime).
    pub(crate) kin: Option<std::sync::Weak<dyn Kin>>,
}

#[derive(Default)]
struct Journal {
    /// Recorded step outputs of this state, loaded once per attempt.
    recorded: HashMap<(String, u32), StepRecord>,
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

mod children;
mod options;
mod stale;
mod step;
mod tries;
mod wait;

pub(crate) use children::Kin;
pub use children::{ChildError, ChildOptions, ChildRun};
pub use options::StepOptions;
pub use step::StepOutput;

/// Strings kept for as long as a [`Context`], each handed out once as a `&str` borrowed from
/// the context: the idempotency keys of `step_keyed`, so that a step's future may borrow its
/// key. Append-only, a list of `OnceLock`s: no lock is held while a step runs.
#[derive(Default)]
struct KeyArena {
    head: OnceLock<Box<KeyNode>>,
}

struct KeyNode {
    key: String,
    next: OnceLock<Box<KeyNode>>,
}

impl KeyArena {
    /// Keeps `key` and returns it, borrowed from the arena.
    fn keep(&self, key: String) -> &str {
        let mut pending = Some(key);
        let mut slot = &self.head;
        loop {
            let node = slot.get_or_init(|| {
                Box::new(KeyNode {
                    key: pending.take().unwrap_or_default(),
                    next: OnceLock::new(),
                })
            });
            if pending.is_none() {
                return &node.key;
            }
            // Another step took this slot first: go on to the next one.
            slot = &node.next;
        }
    }
}

impl Context {
    pub(crate) fn new(
        run: Arc<RunScope>,
        state: &'static str,
        seq: u64,
        attempt: u32,
        attempts_left: u32,
        recorded: Vec<(String, u32, StepRecord)>,
    ) -> Self {
        let recorded = recorded
            .into_iter()
            .map(|(name, occurrence, record)| ((name, occurrence), record))
            .collect();
        Context {
            run,
            state,
            seq,
            attempt,
            attempts_left,
            keys: KeyArena::default(),
            journal: Mutex::new(Journal {
                recorded,
                ..Journal::default()
            }),
            parked: AtomicBool::new(false),
            park_signal: Notify::new(),
            joins: tokio::sync::Mutex::new(()),
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

    /// How many more attempts at this state the state's retry policy allows should this one
    /// fail: 0 on the last attempt. Interruptions (the process stopping) count apart, under
    /// `max_interruptions`, and do not use this budget.
    pub fn attempts_left(&self) -> u32 {
        self.attempts_left
    }

    /// Whether this is the state's last attempt: if the handler fails now, the run fails.
    /// A handler that must end in a state of its own (`Failed { reason }`) rather than as a
    /// failed run returns that state on its last attempt instead of the error.
    pub fn is_last_attempt(&self) -> bool {
        self.attempts_left == 0
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

    fn cancelled_error(&self) -> Error {
        Error::Cancelled {
            run_id: self.run.run_id.clone(),
            state: self.state,
            seq: self.seq,
        }
    }

    /// Records the run's searchable attribute `key` = `value` (a string, an `i64`, or a time:
    /// [`AttributeValue`]), replacing the value `key` had. One durable write, made now and
    /// fenced by the run's lease like a step's record; the run's other attributes stay.
    /// Search with [`Runtime::list_runs_where`](crate::Runtime::list_runs_where) or
    /// `loops runs --attr`.
    ///
    /// Not journaled as a step: a handler that runs again (a retry, a resume after a crash)
    /// sets the attribute again, which writes the same entry over itself when the value is
    /// the same (no duplicate, nothing to undo), or replaces it when the handler now computes
    /// another value. Attributes are stored in plaintext even when a payload codec seals the
    /// records.
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`](crate::Error::InvalidAttribute) for a key or value that
    /// [`check_attribute`](crate::check_attribute) refuses, or a key that starts with
    /// [`RESERVED_ATTRIBUTE_PREFIX`](crate::RESERVED_ATTRIBUTE_PREFIX), naming the run, state
    /// and seq (nothing is written); [`Error::Cancelled`](crate::Error::Cancelled) if the run
    /// was cancelled (nothing is written); [`Error::Fenced`](crate::Error::Fenced) or
    /// [`Error::LeaseExpired`](crate::Error::LeaseExpired) if this driver no longer holds the
    /// run; a store error if the write fails.
    pub async fn set_attribute(&self, key: &str, value: impl Into<AttributeValue>) -> Result<()> {
        crate::attribute::refuse_reserved(key).map_err(|reason| Error::InvalidAttribute {
            run_id: self.run.run_id.clone(),
            state: self.state.to_owned(),
            seq: self.seq,
            key: key.to_owned(),
            reason,
        })?;
        if self.is_cancelled() {
            return Err(self.cancelled_error());
        }
        self.run.clock.check(self.seq)?;
        self.run
            .store
            .write(
                Some(&self.run.lease),
                Write::SetAttributes {
                    run_id: self.run.run_id.clone(),
                    seq: self.seq,
                    attributes: vec![(key.to_owned(), value.into())],
                },
            )
            .await?;
        tracing::debug!(attribute = key, "attribute set");
        Ok(())
    }

    /// A key that names one side effect of this state, the same on every execution of the
    /// handler (every retry, every resume after a crash), and different for every other
    /// run, state, name and use.
    ///
    /// Pass it to the outside system (a forge, a payment API, a message broker) so that it can
    /// refuse a repeat: that closes the window between a side effect and its step record.
    /// [`step_keyed`](Self::step_keyed) hands a step its key, which ties the two together.
    /// The `n`-th call with the same `name` in one execution gets the `n`-th key, so call it
    /// in a fixed order.
    ///
    /// "Every other run" includes a run whose id was used before (by a run pruned since, or
    /// in another store): each run gets a random key nonce when it is created
    /// ([`RunInfo::key_nonce`](crate::RunInfo::key_nonce); with a
    /// [`ManualClock`](crate::ManualClock), one hashed from its id, creation time and how
    /// many runs of that id the clock saw created before, the same on every run of a test),
    /// kept in its row, so an outside system that honours the old run's keys does not answer
    /// the new run's side effects with the old results.
    ///
    /// The key is the XXH3-128 hash of the workflow name, the run id and `name` (each
    /// prefixed by its length in bytes, as a little-endian u64), then the state's seq (u64),
    /// `n` (u32, from 0) and the run's key nonce (u64), all little-endian; written as 32 hex
    /// digits after the prefix `lk-` (35 characters). A run created before key nonces (its
    /// row has none) hashes the same without the nonce, as it always did: a run's keys never
    /// change between versions of loops.
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
        let material = Material::with_capacity(64 + self.run.run_id.len() + name.len())
            .text(self.run.workflow)
            .text(&self.run.run_id)
            .text(name)
            .u64(self.seq)
            .u32(n);
        let material = match self.run.key_nonce {
            Some(nonce) => material.u64(nonce),
            None => material,
        };
        format!("lk-{:032x}", material.hash128())
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
