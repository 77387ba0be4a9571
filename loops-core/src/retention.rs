//! Retention: which ended runs' records expire.

use std::collections::HashMap;
use std::time::Duration;

use crate::row::RunInfo;
use crate::status::RunStatus;

/// Which ended runs [`Runtime::prune`](crate::Runtime::prune) removes. Runs that have not
/// ended (running or waiting) are never removed.
///
/// A run expires if it ended more than `max_age` ago, or if it is not among the `keep_last`
/// most recently ended runs; with neither set, nothing expires.
///
/// A child run goes with its parent: a run and the child runs it started (and theirs) are kept
/// or removed together, as one run that ended when the last of them did, so `keep_last`
/// counts top-level runs, and a run's history never names a child that is gone. A child
/// whose parent has not ended is kept (the parent may still join it), as is one whose parent
/// the policy keeps (a failed parent under `keep_failed`); and a parent with a child that
/// has not ended or that the policy keeps (a failed child under `keep_failed`) is kept with
/// it.
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

    /// Whether a run that ended at `ended_ms` may expire at `now_ms` on its own, were it not
    /// held by its family: with a count (`keep_last`, which ranks families, not such a run),
    /// always; by age, if it ended before `max_age` ago.
    pub(crate) fn selects_alone(&self, ended_ms: u64, now_ms: u64) -> bool {
        self.keep_last.is_some() || self.cutoff(now_ms).is_some_and(|c| ended_ms < c)
    }

    /// The time (ms since the Unix epoch) before which a run ended is older than `max_age`
    /// at `now_ms`; `None` without an age.
    fn cutoff(&self, now_ms: u64) -> Option<u64> {
        self.max_age
            .map(|age| now_ms.saturating_sub(crate::clock::duration_ms(age)))
    }

    /// The families in `ended` that expire at `now_ms`, oldest first: by count, those not
    /// among the `keep_last` most recently ended; by age, those that ended before `max_age`
    /// ago.
    pub(crate) fn select(&self, mut ended: Vec<Family>, now_ms: u64) -> Vec<Family> {
        ended.sort_by(|a, b| {
            b.ended_ms
                .cmp(&a.ended_ms)
                .then_with(|| a.run_ids.cmp(&b.run_ids))
        });
        let cutoff = self.cutoff(now_ms);
        let mut out: Vec<Family> = ended
            .into_iter()
            .enumerate()
            .filter(|(rank, family)| {
                self.keep_last.is_some_and(|n| *rank >= n)
                    || cutoff.is_some_and(|c| family.ended_ms < c)
            })
            .map(|(_, family)| family)
            .collect();
        out.reverse();
        out
    }
}

/// A run that was not started by another (or whose parent is gone), with the child runs it
/// started, theirs, and so on: retention keeps or removes them together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Family {
    /// When the last of them ended (ms since the Unix epoch): a family's age and rank.
    pub ended_ms: u64,
    /// Their ids, each parent before its children (the top-level run first).
    pub run_ids: Vec<String>,
}

/// The top of `info`'s family among the runs `by_id` (by run id): its farthest ancestor
/// reached through parent links that stay among them, and how many generations below it
/// `info` is. The one walk up a family, for [`prune`](crate::prune)'s selection and for the
/// plan of its writes. Parent links are set when a child is created and never change, so
/// they cannot loop; the bound keeps a damaged row from looping anyway.
pub(crate) fn family_top<'a>(
    by_id: &HashMap<&str, &'a RunInfo>,
    info: &'a RunInfo,
) -> (&'a RunInfo, usize) {
    let mut current = info;
    for depth in 0..by_id.len() {
        match current
            .parent
            .as_ref()
            .and_then(|p| by_id.get(p.run_id.as_str()))
        {
            Some(parent) => current = parent,
            None => return (current, depth),
        }
    }
    (current, by_id.len())
}
