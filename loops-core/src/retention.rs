//! Retention: which ended runs' records expire.

use std::time::Duration;

use crate::row::RunInfo;
use crate::status::RunStatus;

/// Which ended runs [`Runtime::prune`](crate::Runtime::prune) removes. Runs that have not
/// ended (running or waiting) are never removed.
///
/// A run expires if it ended more than `max_age` ago, or if it is not among the `keep_last`
/// most recently ended runs; with neither set, nothing expires.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RetentionPolicy {
    /// Remove runs that ended longer ago than this.
    pub max_age: Option<Duration>,
    /// Keep at most this many ended runs (the most recently ended).
    pub keep_last: Option<usize>,
    /// Keep failed runs (which [`Runtime::retry`](crate::Runtime::retry) could resume)
    /// whatever their age.
    pub keep_failed: bool,
}

impl RetentionPolicy {
    /// Runs that ended more than `max_age` ago expire.
    pub fn older_than(max_age: Duration) -> Self {
        RetentionPolicy {
            max_age: Some(max_age),
            ..RetentionPolicy::default()
        }
    }

    /// This policy, also keeping at most `n` ended runs.
    pub fn keep_last(self, n: usize) -> Self {
        RetentionPolicy {
            keep_last: Some(n),
            ..self
        }
    }

    /// This policy, keeping failed runs whatever their age.
    pub fn keep_failed(self) -> Self {
        RetentionPolicy {
            keep_failed: true,
            ..self
        }
    }

    pub(crate) fn statuses(&self) -> Vec<RunStatus> {
        let mut out = vec![RunStatus::Completed, RunStatus::Cancelled];
        if !self.keep_failed {
            out.push(RunStatus::Failed);
        }
        out
    }

    /// The ids of the runs in `ended` that expire at `now_ms`, oldest first.
    pub(crate) fn select(&self, mut ended: Vec<RunInfo>, now_ms: u64) -> Vec<String> {
        ended.sort_by(|a, b| {
            b.updated_ms
                .cmp(&a.updated_ms)
                .then_with(|| a.run_id.cmp(&b.run_id))
        });
        let cutoff = self
            .max_age
            .map(|age| now_ms.saturating_sub(age.as_millis() as u64));
        let mut out: Vec<String> = ended
            .into_iter()
            .enumerate()
            .filter(|(rank, info)| {
                self.keep_last.is_some_and(|n| *rank >= n)
                    || cutoff.is_some_and(|c| info.updated_ms < c)
            })
            .map(|(_, info)| info.run_id)
            .collect();
        out.reverse();
        out
    }
}
