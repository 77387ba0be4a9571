//! What the driver of one run is given: the runtime's settings for its states, and the
//! signals and lease of the run it holds.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::record::TransitionRecord;
use crate::retry::RetryPolicy;
use crate::run::limits::Limits;
use crate::store::Lease;
use crate::workflow::{StateId, Workflow};

/// Default limit of one serialized state, step output or event payload: 2 MiB (Temporal's
/// payload cap).
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 2 * 1024 * 1024;

/// Default park threshold: sleeps shorter than this wait in place.
pub const DEFAULT_PARK_THRESHOLD: Duration = Duration::from_secs(1);

/// The settings that decide how one run is driven: retry policies and time-outs per state,
/// and the limits its handler's context applies. Set through the runtime's builder.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) retry: RetryPolicy,
    pub(crate) state_retry: HashMap<(TypeId, &'static str), RetryPolicy>,
    pub(crate) workflow_retry: HashMap<TypeId, RetryPolicy>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) state_timeout: HashMap<(TypeId, &'static str), Duration>,
    pub(crate) max_payload_bytes: usize,
    pub(crate) park_threshold: Duration,
    /// The named limits steps take, shared by every run of the runtime.
    pub(crate) limits: Arc<Limits>,
    /// The clock its times are read from and its waits wait on.
    pub(crate) clock: Clock,
    /// Told of every run of a step's closure (the test kit).
    pub(crate) observer: Option<StepObserver>,
    /// Whether log lines carry error texts (which hold payloads); see [`logged_text`].
    pub(crate) log_texts: bool,
}

/// What a log line shows for an error text `text`: the text when `log_texts` (no codec, or
/// [`RuntimeBuilder::log_payloads`](crate::RuntimeBuilder::log_payloads)), else a mark that
/// it was left out, since a codec seals it in the store and a log is outside the codec. The
/// one rule for every log line of a handler's or a step's error text.
pub(crate) fn logged_text(log_texts: bool, text: impl FnOnce() -> String) -> String {
    if log_texts {
        text()
    } else {
        "<not logged: payloads are sealed; RuntimeBuilder::log_payloads logs them>".to_owned()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            retry: RetryPolicy::default(),
            state_retry: HashMap::new(),
            workflow_retry: HashMap::new(),
            timeout: None,
            state_timeout: HashMap::new(),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            park_threshold: DEFAULT_PARK_THRESHOLD,
            limits: Arc::default(),
            clock: Clock::system(),
            observer: None,
            log_texts: true,
        }
    }
}

impl Settings {
    /// The retry policy of `state`: its own, else its workflow's, else the default one; as
    /// the runtime applies it ([`RetryPolicy::in_force`]: 0 attempts or interruptions are 1).
    pub(crate) fn retry_policy<W: Workflow>(&self, state: W::State) -> RetryPolicy {
        self.state_retry
            .get(&(TypeId::of::<W::State>(), state.name()))
            .or_else(|| self.workflow_retry.get(&TypeId::of::<W::State>()))
            .copied()
            .unwrap_or(self.retry)
            .in_force()
    }

    /// The time-out of `state`'s handler: its own, else the default one, if any.
    pub(crate) fn state_timeout<W: Workflow>(&self, state: W::State) -> Option<Duration> {
        self.state_timeout
            .get(&(TypeId::of::<W::State>(), state.name()))
            .copied()
            .or(self.timeout)
    }

    /// Refuses a transition record whose state is over the payload limit.
    ///
    /// # Errors
    /// [`Error::PayloadTooLarge`](crate::Error::PayloadTooLarge) naming the state and its seq.
    pub(crate) fn check_size(&self, run_id: &str, record: &TransitionRecord) -> Result<()> {
        check_size(run_id, record, self.max_payload_bytes)
    }
}

/// Refuses a transition record whose state is over `limit` bytes.
///
/// # Errors
/// [`Error::PayloadTooLarge`](crate::Error::PayloadTooLarge) naming the state and its seq.
pub(crate) fn check_size(run_id: &str, record: &TransitionRecord, limit: usize) -> Result<()> {
    let bytes = record.payload.get().len();
    if bytes > limit {
        return Err(Error::PayloadTooLarge {
            run_id: run_id.to_owned(),
            what: format!("state `{}`", record.state),
            seq: Some(record.seq),
            bytes,
            limit,
        });
    }
    Ok(())
}

/// What a driven run listens to, and the lease its driver holds.
#[derive(Clone)]
pub(crate) struct Signals {
    pub(crate) cancel: CancellationToken,
    pub(crate) wake: Arc<Notify>,
    /// Set once the store granted the lease; renewed by the runtime's lease renewer.
    pub(crate) lease: Arc<Mutex<Option<Lease>>>,
    /// Cancelled when the lease was lost to another worker: the driver stops at once.
    pub(crate) lost: CancellationToken,
    /// When the lease lapses by this process's monotonic clock, for a store whose leases
    /// lapse: the time the lease (or its last renewal) was asked for, plus the lease time.
    /// The store's own expiry is no earlier (it counts from when it granted the request).
    pub(crate) deadline: Arc<Mutex<Option<Instant>>>,
}

impl Signals {
    /// Fresh signals: nothing cancelled, no lease yet.
    pub(crate) fn new() -> Self {
        Signals {
            cancel: CancellationToken::new(),
            wake: Arc::new(Notify::new()),
            lease: Arc::new(Mutex::new(None)),
            lost: CancellationToken::new(),
            deadline: Arc::new(Mutex::new(None)),
        }
    }

    /// Refuses what the driver of `run_id` is about to do at `seq`: see [`LeaseClock::check`].
    ///
    /// # Errors
    /// [`Error::LeaseExpired`].
    pub(crate) fn check_lease(&self, run_id: &str, seq: u64) -> Result<()> {
        // Not through a `LeaseClock`, which would copy the run id for each check (one per
        // transition).
        check_deadline(run_id, &self.deadline, &self.lost, seq)
    }

    /// The lease's deadline and the `lost` signal of the driver of `run_id`, for the run's
    /// [`Context`](crate::Context)s.
    pub(crate) fn clock(&self, run_id: &str) -> LeaseClock {
        LeaseClock {
            run_id: run_id.to_owned(),
            deadline: Arc::clone(&self.deadline),
            lost: self.lost.clone(),
        }
    }
}

/// A driver's lease deadline ([`Signals::deadline`]) and its `lost` signal.
#[derive(Clone)]
pub(crate) struct LeaseClock {
    run_id: String,
    deadline: Arc<Mutex<Option<Instant>>>,
    lost: CancellationToken,
}

impl LeaseClock {
    /// No deadline (a lease that never lapses), for contexts outside any run.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn none(run_id: &str) -> Self {
        LeaseClock {
            run_id: run_id.to_owned(),
            deadline: Arc::new(Mutex::new(None)),
            lost: CancellationToken::new(),
        }
    }

    /// Refuses what the driver of the run is about to do at `seq` (run a step's closure,
    /// commit a write) once the lease's deadline has passed by the monotonic clock, and
    /// tells the driver its lease is lost.
    ///
    /// # Errors
    /// [`Error::LeaseExpired`].
    pub(crate) fn check(&self, seq: u64) -> Result<()> {
        check_deadline(&self.run_id, &self.deadline, &self.lost, seq)
    }
}

/// The one rule of [`LeaseClock::check`] and [`Signals::check_lease`]: refuses what the
/// driver of `run_id` is about to do at `seq` once `deadline` has passed by the monotonic
/// clock, and cancels `lost`.
///
/// # Errors
/// [`Error::LeaseExpired`].
fn check_deadline(
    run_id: &str,
    deadline: &Mutex<Option<Instant>>,
    lost: &CancellationToken,
    seq: u64,
) -> Result<()> {
    let Some(at) = *deadline.lock().unwrap_or_else(PoisonError::into_inner) else {
        return Ok(());
    };
    let now = Instant::now();
    if now < at {
        return Ok(());
    }
    lost.cancel();
    Err(Error::LeaseExpired {
        run_id: run_id.to_owned(),
        seq,
        late_ms: crate::clock::duration_ms(now.duration_since(at)),
    })
}

/// A run held by one driver: its id, its signals, and the lease every write of it carries.
pub(crate) struct Held {
    pub(crate) run_id: String,
    pub(crate) signals: Signals,
    pub(crate) lease: Lease,
}

/// One run of a step's closure, as the test kit sees it: which run, state (`seq`), step
/// and occurrence, and the idempotency key the step has (the one `step_keyed` hands it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StepRun {
    /// The run.
    pub run_id: String,
    /// The sequence number of the state the step belongs to.
    pub seq: u64,
    /// The name the step's output is recorded under.
    pub name: String,
    /// Which use of the name in the state, from 0.
    pub occurrence: u32,
    /// The step's idempotency key.
    pub key: String,
}

/// What a runtime calls before each run of a step's closure.
pub(crate) type StepObserver = Arc<dyn Fn(&StepRun) + Send + Sync>;
