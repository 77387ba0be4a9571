//! Retry policies: how often, and after how long, a failed state is tried again.

use std::time::Duration;

/// Default of [`RetryPolicy::max_interruptions`].
pub const DEFAULT_MAX_INTERRUPTIONS: u32 = 10;

/// How a state whose handler fails (returns an error, times out, or is cut short by the
/// process stopping) is tried again.
///
/// Attempt `n` (from 1) that fails is followed, if `n < max_attempts`, by attempt `n + 1`
/// after `min(initial_delay * factor^(n-1), max_delay)`, spread by up to `jitter` of itself
/// either way. Attempt counts are durable. An attempt cut short by the process stopping is
/// an interruption, counted apart from failed attempts: the `max_interruptions`-th
/// interruption of a state ends its run as [`RunStatus::Failed`](crate::RunStatus::Failed)
/// (so a state that crashes the process on every attempt ends), without another attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts that may fail, at least 1 (1 means no retry).
    pub max_attempts: u32,
    /// Interruptions (attempts cut short by the process stopping) that end the run, at
    /// least 1: the run fails at the `max_interruptions`-th, so with 1 the first crash (a
    /// restart during a deploy included) ends it; the default is 10.
    pub max_interruptions: u32,
    /// Delay before the second attempt.
    pub initial_delay: Duration,
    /// Growth of the delay per attempt (1.0 for a constant delay).
    pub factor: f64,
    /// Upper bound of the delay.
    pub max_delay: Duration,
    /// Fraction (0.0 to 1.0) by which each delay is spread at random, either way.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    /// 3 attempts, 1 s then 2 s apart (factor 2, at most 60 s), with 10% jitter; 10
    /// interruptions.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            max_interruptions: DEFAULT_MAX_INTERRUPTIONS,
            initial_delay: Duration::from_secs(1),
            factor: 2.0,
            max_delay: Duration::from_secs(60),
            jitter: 0.1,
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retry after a failure (a restart after an interruption still resumes
    /// the state; the [`DEFAULT_MAX_INTERRUPTIONS`]-th interruption fails the run).
    pub const fn never() -> Self {
        RetryPolicy {
            max_attempts: 1,
            max_interruptions: DEFAULT_MAX_INTERRUPTIONS,
            initial_delay: Duration::ZERO,
            factor: 1.0,
            max_delay: Duration::ZERO,
            jitter: 0.0,
        }
    }

    /// The default policy with `max_attempts` attempts (at least 1).
    pub fn attempts(max_attempts: u32) -> Self {
        RetryPolicy {
            max_attempts: max_attempts.max(1),
            ..RetryPolicy::default()
        }
    }

    /// This policy with the given initial and maximum delays.
    pub fn with_delays(self, initial_delay: Duration, max_delay: Duration) -> Self {
        RetryPolicy {
            initial_delay,
            max_delay,
            ..self
        }
    }

    /// This policy with its run failed at the `n`-th interruption (at least 1; see
    /// [`max_interruptions`](Self::max_interruptions)).
    pub fn with_max_interruptions(self, n: u32) -> Self {
        RetryPolicy {
            max_interruptions: n.max(1),
            ..self
        }
    }

    /// This policy with the given jitter (clamped to 0.0..=1.0).
    pub fn with_jitter(self, jitter: f64) -> Self {
        RetryPolicy {
            jitter: jitter.clamp(0.0, 1.0),
            ..self
        }
    }

    /// The delay after failed attempt `attempt` (from 1); `unit` is a number in `0.0..1.0`
    /// that picks the point within the jitter band (0.5 is no jitter).
    pub fn delay_after(&self, attempt: u32, unit: f64) -> Duration {
        let exp = attempt.saturating_sub(1).min(64) as i32;
        let base = self.initial_delay.as_secs_f64() * self.factor.max(0.0).powi(exp);
        let capped = base.min(self.max_delay.as_secs_f64()).max(0.0);
        let jitter = self.jitter.clamp(0.0, 1.0);
        let spread = capped * jitter * (unit.clamp(0.0, 1.0) * 2.0 - 1.0);
        Duration::try_from_secs_f64((capped + spread).max(0.0)).unwrap_or(self.max_delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_cap() {
        let p = RetryPolicy {
            max_attempts: 10,
            max_interruptions: 10,
            initial_delay: Duration::from_millis(100),
            factor: 2.0,
            max_delay: Duration::from_millis(500),
            jitter: 0.0,
        };
        let ms: Vec<u128> = (1..=5).map(|a| p.delay_after(a, 0.9).as_millis()).collect();
        assert_eq!(ms, vec![100, 200, 400, 500, 500]);
    }

    #[test]
    fn jitter_stays_in_band() {
        let p = RetryPolicy::default().with_jitter(0.5);
        assert_eq!(p.delay_after(1, 0.0), Duration::from_millis(500));
        assert_eq!(p.delay_after(1, 0.5), Duration::from_secs(1));
        assert_eq!(p.delay_after(1, 1.0), Duration::from_millis(1500));
        assert_eq!(RetryPolicy::attempts(0).max_attempts, 1);
    }
}
