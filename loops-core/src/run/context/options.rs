//! The options of one step.

use std::time::Duration;

/// Options of one step: see [`Context::step_with`](crate::Context::step_with).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepOptions {
    /// Abandon the step's closure after this long; the step then fails with
    /// [`Error::StepTimeout`](crate::Error::StepTimeout) (a failed attempt under the state's retry policy).
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
