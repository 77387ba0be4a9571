//! The options of one step: a time-out per try and a retry policy in place.

use std::time::Duration;

use crate::retry::RetryPolicy;

/// Options of one step: see [`Context::step_with`](crate::Context::step_with). Built from
/// [`StepOptions::default()`] (one try, no time-out) with the methods below.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOptions {
    pub(crate) timeout: Option<Duration>,
    pub(crate) retry: Option<RetryPolicy>,
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
    /// so a restart neither shortens it nor gives the step a fresh budget.
    /// `policy.max_interruptions` is not used here: the state's policy counts interruptions.
    pub fn with_retry(self, policy: RetryPolicy) -> Self {
        StepOptions {
            retry: Some(policy),
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
