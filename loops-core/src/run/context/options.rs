//! The options of one step: a time-out per try, a retry policy in place, and when its
//! recorded output goes stale.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use crate::retry::RetryPolicy;

/// A check of a recorded output: `Ok(true)` while it holds, `Err` if it does not decode.
pub(crate) type Revalidate = Arc<
    dyn Fn(&RawValue) -> Pin<Box<dyn Future<Output = Result<bool, serde_json::Error>> + Send>>
        + Send
        + Sync,
>;

/// Options of one step: see [`Context::step_with`](crate::Context::step_with). Built from
/// [`StepOptions::default()`] (one try, no time-out) with the methods below.
#[derive(Clone, Default)]
pub struct StepOptions {
    pub(crate) timeout: Option<Duration>,
    pub(crate) retry: Option<RetryPolicy>,
    pub(crate) valid_for: Option<Duration>,
    pub(crate) revalidate: Option<Revalidate>,
    pub(crate) limit: Option<String>,
}

impl fmt::Debug for StepOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepOptions")
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .field("valid_for", &self.valid_for)
            .field("revalidate", &self.revalidate.as_ref().map(|_| "<check>"))
            .field("limit", &self.limit)
            .finish()
    }
}

impl StepOptions {
    /// Options with a time-out: see [`with_timeout`](Self::with_timeout).
    pub fn timeout(timeout: Duration) -> Self {
        StepOptions::default().with_timeout(timeout)
    }

    /// Options with a retry policy: see [`with_retry`](Self::with_retry).
    pub fn retry(policy: RetryPolicy) -> Self {
        StepOptions::default().with_retry(policy)
    }

    /// These options with a time-out of each try: a try still running after `timeout` is
    /// abandoned and fails with [`Error::StepTimeout`](crate::Error::StepTimeout), which
    /// the retry policy may try again.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        StepOptions {
            timeout: Some(timeout),
            ..self
        }
    }

    /// These options with a retry policy in place: a try that fails is tried again inside
    /// the same execution of the handler, without re-entering the state, up to
    /// `policy.max_attempts` tries, `policy.delay_after(n, ..)` after the `n`-th failure
    /// (exponential, with jitter, capped at `policy.max_delay`; at least an error's
    /// [retry-after hint](crate::Error::retry_after)). Each failed try is recorded as a
    /// failure. A back-off at or over the runtime's park threshold parks the run durably
    /// (its status becomes waiting until the next try's time), and the schedule is recorded,
    /// so a restart neither shortens it nor gives the step a fresh budget. A round whose
    /// tries were used up ends; the next attempt of the state (after its handler failed, or
    /// after a crash cut it short, even once the round's error was handled) starts a fresh
    /// round.
    /// `policy.max_interruptions` is not used here: the state's policy counts interruptions.
    pub fn with_retry(self, policy: RetryPolicy) -> Self {
        StepOptions {
            retry: Some(policy),
            ..self
        }
    }

    /// These options with an age after which the step's recorded output is stale: a
    /// re-execution of the handler (after a wait, a restart, a retry) that finds the record
    /// older than `age` runs the step again instead of replaying it. See
    /// [`revalidate`](Self::revalidate) for what a stale step does.
    pub fn valid_for(self, age: Duration) -> Self {
        StepOptions {
            valid_for: Some(age),
            ..self
        }
    }

    /// These options with a check of the recorded output, run when a re-execution of the
    /// handler replays the step: `check(recorded)` says whether it still holds ("the
    /// repository's HEAD is still the commit this plan was made against"). When it says
    /// `false` (or the record is older than [`valid_for`](Self::valid_for)) the step is
    /// stale, and runs again as a new occurrence of itself: the old record stays as it was,
    /// a record under `loops:stale:{generation}:{name}` says why it went stale, and the new
    /// output is recorded under `loops:redo:{generation}:{name}` (same occurrence), with an
    /// idempotency key of its own. Later replays use the newest fresh output; a record once
    /// found stale is never checked again. A recorded output that does not decode as `T` is
    /// [`Error::StepDecode`](crate::Error::StepDecode).
    ///
    /// The check must be `'static`: clone what it needs (a client, a path) into it.
    pub fn revalidate<T, F, Fut>(self, check: F) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = bool> + Send + 'static,
    {
        let check = Arc::new(check);
        let revalidate: Revalidate = Arc::new(move |raw: &RawValue| {
            let decoded = serde_json::from_str::<T>(raw.get());
            let check = Arc::clone(&check);
            Box::pin(async move {
                match decoded {
                    Ok(value) => Ok(check(value).await),
                    Err(e) => Err(e),
                }
            })
        });
        StepOptions {
            revalidate: Some(revalidate),
            ..self
        }
    }

    /// These options with the named limit `name` (declared with
    /// [`RuntimeBuilder::limit`](crate::RuntimeBuilder::limit)), taken before each try and
    /// released when it ends: a try waits while the limit is reached, shared by every run of
    /// the runtime. The wait is cancelled with the run, and a replayed step takes nothing.
    pub fn with_limit(self, name: impl Into<String>) -> Self {
        StepOptions {
            limit: Some(name.into()),
            ..self
        }
    }

    /// The time-out of each try, if any.
    pub fn try_timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The retry policy in place, if any (none: one try).
    pub fn retry_policy(&self) -> Option<&RetryPolicy> {
        self.retry.as_ref()
    }
}
