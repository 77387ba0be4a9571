//! What the driver of one run is given: the runtime's settings for its states, and the
//! signals and lease of the run it holds.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::limit::Limits;
use crate::record::TransitionRecord;
use crate::retry::RetryPolicy;
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
        }
    }
}

impl Settings {
    /// The retry policy of `state`: its own, else its workflow's, else the default one.
    pub(crate) fn retry_policy<W: Workflow>(&self, state: W::State) -> RetryPolicy {
        self.state_retry
            .get(&(TypeId::of::<W::State>(), state.name()))
            .or_else(|| self.workflow_retry.get(&TypeId::of::<W::State>()))
            .copied()
            .unwrap_or(self.retry)
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
        let bytes = record.payload.get().len();
        let limit = self.max_payload_bytes;
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
}

impl Signals {
    /// Fresh signals: nothing cancelled, no lease yet.
    pub(crate) fn new() -> Self {
        Signals {
            cancel: CancellationToken::new(),
            wake: Arc::new(Notify::new()),
            lease: Arc::new(Mutex::new(None)),
            lost: CancellationToken::new(),
        }
    }
}

/// A run held by one driver: its id, its signals, and the lease every write of it carries.
pub(crate) struct Held {
    pub(crate) run_id: String,
    pub(crate) signals: Signals,
    pub(crate) lease: Lease,
}
