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
    /// Attempts that may fail, at least 1 (1 means no retry; the runtime takes 0 as 1).
    pub max_attempts: u32,
    /// Interruptions (attempts cut short by the process stopping) that end the run, at
    /// least 1: the run fails at the `max_interruptions`-th, so with 1 the first crash (a
    /// restart during a deploy included) ends it; the default is 10. The runtime takes 0
    /// as 1.
    pub max_interruptions: u32,
    /// Delay before the second attempt.
    pub initial_delay: Duration,
    /// Growth of the delay per attempt (1.0 for a constant delay).
    pub factor: f64,
    /// Upper bound of the delay.
    pub max_delay: Duration,
    /// Fraction (0.0 to 1.0) by which each delay is spread at random, either way. A value
    /// out of that range counts as the nearest end of it; one that is not a finite number
    /// (NaN, an infinity) counts as 0.0, no spread.
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

    /// This policy with the given jitter (clamped to 0.0..=1.0; NaN or an infinity is 0.0:
    /// see [`jitter`](Self::jitter)).
    pub fn with_jitter(self, jitter: f64) -> Self {
        RetryPolicy {
            jitter: jitter_fraction(jitter),
            ..self
        }
    }

    /// The delay after failed attempt `attempt` (from 1); `unit` is a number in `0.0..1.0`
    /// that picks the point within the jitter band (0.5 is no jitter; out of range, the
    /// nearest end; NaN or an infinity, 0.5). The jitter is read as
    /// [`jitter`](Self::jitter) says.
    pub fn delay_after(&self, attempt: u32, unit: f64) -> Duration {
        let exp = attempt.saturating_sub(1).min(64) as i32;
        let base = self.initial_delay.as_secs_f64() * self.factor.max(0.0).powi(exp);
        let capped = base.min(self.max_delay.as_secs_f64()).max(0.0);
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.5
        };
        let spread = capped * jitter_fraction(self.jitter) * (unit * 2.0 - 1.0);
        Duration::try_from_secs_f64((capped + spread).max(0.0)).unwrap_or(self.max_delay)
    }

    /// This policy as the runtime applies it: `max_attempts` and `max_interruptions` at
    /// least 1 (a struct literal may give 0). The runtime reads every state's policy through
    /// here ([`Settings::retry_policy`](crate::run::settings::Settings::retry_policy)).
    pub(crate) fn in_force(self) -> Self {
        RetryPolicy {
            max_attempts: self.max_attempts.max(1),
            max_interruptions: self.max_interruptions.max(1),
            ..self
        }
    }
}

/// A jitter as [`RetryPolicy::jitter`] reads it: clamped to `0.0..=1.0`, and 0.0 (no spread)
/// for a value that is not a finite number (`clamp` would keep a NaN, which spreads a delay
/// to nothing).
fn jitter_fraction(jitter: f64) -> f64 {
    if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.0
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

    #[test]
    fn a_jitter_that_is_not_a_finite_number_spreads_nothing() {
        for jitter in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let p = RetryPolicy {
                jitter,
                ..RetryPolicy::default()
            };
            for unit in [0.0, 0.5, 1.0] {
                assert_eq!(
                    p.delay_after(1, unit),
                    Duration::from_secs(1),
                    "{jitter} {unit}"
                );
                assert_eq!(
                    p.delay_after(2, unit),
                    Duration::from_secs(2),
                    "{jitter} {unit}"
                );
            }
            assert_eq!(RetryPolicy::default().with_jitter(jitter).jitter, 0.0);
        }
        // Out of range, the nearest end.
        let p = RetryPolicy {
            jitter: 7.0,
            ..RetryPolicy::default()
        };
        assert_eq!(p.delay_after(1, 1.0), Duration::from_secs(2));
        assert_eq!(p.delay_after(1, 0.0), Duration::ZERO);
        // A unit that is not a finite number is the band's middle.
        let p = RetryPolicy::default().with_jitter(0.5);
        assert_eq!(p.delay_after(1, f64::NAN), Duration::from_secs(1));
        assert_eq!(p.delay_after(1, f64::INFINITY), Duration::from_secs(1));
    }

    #[test]
    fn the_runtime_takes_zero_attempts_or_interruptions_as_one() {
        let p = RetryPolicy {
            max_attempts: 0,
            max_interruptions: 0,
            ..RetryPolicy::never()
        };
        let applied = p.in_force();
        assert_eq!((applied.max_attempts, applied.max_interruptions), (1, 1));
        assert_eq!(
            applied
                .with_max_interruptions(4)
                .in_force()
                .max_interruptions,
            4
        );
    }
}
