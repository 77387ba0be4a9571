//! Named limits on steps ("model: 4 at once, 60 per minute"): their shape ([`Limit`]) and
//! their rule ([`Limit::admit`]), the one place that says how many tries may hold a limit and
//! how its rate window counts. Every counter of a limit applies this rule: the runtime's
//! in-process one (for a store one process opens) and a shared store's (the PostgreSQL
//! store's table, for all its workers: see
//! [`SharedLimits`](crate::SharedLimits)).
//!
//! A step names its limit ([`StepOptions::with_limit`](crate::StepOptions::with_limit)) and
//! takes a place before each try, giving it back when the try ends.

use std::time::Duration;

/// A limit's shape: see [`RuntimeBuilder::limit`](crate::RuntimeBuilder::limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limit {
    /// At most this many tries inside the limit at once (none: no bound).
    pub concurrent: Option<u32>,
    /// At most `n` tries started per `period` (none: no bound).
    pub rate: Option<(u32, Duration)>,
}

/// What [`Limit::admit`] says of one more try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// It may enter now.
    Enter,
    /// Not now. `retry_at_ms` (on the clock of the `now_ms` given): when the rate window
    /// frees a place; `None`: every place is held, and only a release frees one.
    Full {
        /// When to ask again, in ms on the caller's clock; `None`: after a release.
        retry_at_ms: Option<u64>,
    },
}

impl Limit {
    /// At most `n` tries inside the limit at once (`n` at least 1).
    pub fn concurrent(n: u32) -> Self {
        Limit {
            concurrent: Some(n.max(1)),
            rate: None,
        }
    }

    /// At most `n` tries started per `period` (`n` at least 1), counted over a sliding
    /// window.
    pub fn rate(n: u32, period: Duration) -> Self {
        Limit {
            concurrent: None,
            rate: Some((n.max(1), period)),
        }
    }

    /// This limit with at most `n` tries started per `period` as well.
    pub fn with_rate(self, n: u32, period: Duration) -> Self {
        Limit {
            rate: Some((n.max(1), period)),
            ..self
        }
    }

    /// The rule of the limit: whether one more try may enter at `now_ms`, given the number
    /// of tries `holding` it now and the start times `starts` (ms, on the same clock as
    /// `now_ms`, in any order) of the tries it let in that may still be in its window.
    ///
    /// - At most `concurrent` tries hold the limit at once: a try enters only while
    ///   `holding < concurrent`.
    /// - At most `n` tries start per `period`, over a sliding window: a start at `t` counts
    ///   while `now_ms - t < period` (so it stops counting exactly `period` after it), and a
    ///   try enters only while fewer than `n` starts count. A start in the future (a clock
    ///   stepped back) counts.
    ///
    /// A try that enters counts as holding until it ends and as a start at `now_ms`: the
    /// caller records both. Returns [`Admission::Full`] with the time the window frees a
    /// place when only the rate stops it, and `None` when every place is held.
    pub fn admit(&self, holding: u32, starts: &[u64], now_ms: u64) -> Admission {
        if self.concurrent.is_some_and(|n| holding >= n) {
            return Admission::Full { retry_at_ms: None };
        }
        let Some((n, period)) = self.rate else {
            return Admission::Enter;
        };
        let period_ms = crate::clock::duration_ms(period);
        let mut counted: Vec<u64> = starts
            .iter()
            .copied()
            .filter(|t| self.counts(*t, now_ms))
            .collect();
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        if counted.len() < n {
            return Admission::Enter;
        }
        // The window holds `len` starts; one more may enter once `len - n + 1` of them have
        // left it, the last of those being the `(len - n)`-th oldest.
        counted.sort_unstable();
        let leaving = counted[counted.len() - n];
        Admission::Full {
            retry_at_ms: Some(leaving.saturating_add(period_ms).max(now_ms)),
        }
    }

    /// Whether a start at `start_ms` still counts in the rate window at `now_ms` (see
    /// [`admit`](Self::admit)); `false` without a rate. Counters drop the starts that no
    /// longer count.
    pub fn counts(&self, start_ms: u64, now_ms: u64) -> bool {
        self.rate.is_some_and(|(_, period)| {
            u128::from(now_ms.saturating_sub(start_ms)) < period.as_millis()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_admits_while_places_are_free() {
        let limit = Limit::concurrent(2);
        assert_eq!(limit.admit(0, &[], 0), Admission::Enter);
        assert_eq!(limit.admit(1, &[], 0), Admission::Enter);
        assert_eq!(
            limit.admit(2, &[], 0),
            Admission::Full { retry_at_ms: None }
        );
        assert_eq!(Limit::concurrent(0).concurrent, Some(1));
    }

    #[test]
    fn the_rate_window_slides_and_says_when_a_place_frees() {
        let limit = Limit::rate(2, Duration::from_millis(100));
        assert_eq!(limit.admit(0, &[1_000], 1_050), Admission::Enter);
        assert_eq!(
            limit.admit(0, &[1_010, 1_000], 1_050),
            Admission::Full {
                retry_at_ms: Some(1_100)
            }
        );
        // A start stops counting exactly one period after it.
        assert_eq!(limit.admit(0, &[1_000, 1_010], 1_100), Admission::Enter);
        assert!(!limit.counts(1_000, 1_100));
        assert!(limit.counts(1_000, 1_099));
        // More starts than `n` in the window (another worker declared more): wait until
        // enough of them have left.
        assert_eq!(
            limit.admit(0, &[1_000, 1_020, 1_010], 1_050),
            Admission::Full {
                retry_at_ms: Some(1_110)
            }
        );
        // A start in the future counts.
        assert!(limit.counts(2_000, 1_000));
    }

    #[test]
    fn concurrency_is_checked_before_the_rate() {
        let limit = Limit::concurrent(1).with_rate(1, Duration::from_secs(1));
        assert_eq!(
            limit.admit(1, &[0], 10),
            Admission::Full { retry_at_ms: None }
        );
        assert_eq!(
            limit.admit(0, &[0], 10),
            Admission::Full {
                retry_at_ms: Some(1_000)
            }
        );
        assert_eq!(limit.admit(0, &[], 10), Admission::Enter);
        assert!(!Limit::concurrent(1).counts(0, 0));
    }
}
