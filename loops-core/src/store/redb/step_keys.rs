//! Whether a run has a step record: the check every new step record passes (records are
//! immutable), kept linear in the entries appended since the last check instead of in the
//! state's steps.
//!
//! A run's entries are chained in the log newest first, so the check walks back from the
//! run's newest entry through every entry of the step's seq. For a state that records
//! thousands of steps (an agent's loop of tool calls), that walk made each new step cost
//! a pass over all the state's steps before it, inside the serial commit: quadratic in the
//! state's steps, and every other run's commit waited for it. [`StepKeys`] remembers the
//! keys a walk found (for states with many steps only), with the log entry the walk started
//! from; the next check walks back only to that entry.
//!
//! The cache holds only what committed transactions wrote, or what the transaction being
//! applied wrote before the check: a batch that does not commit clears it (its log
//! positions are taken again by the next batch), and a run's deletion forgets the run.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

use redb::ReadableTable;

use super::log::{self, Chain, Kind, LogError};

/// Step keys of a state below this many are not remembered: walking them is cheap.
const REMEMBERED_FROM: usize = 16;

/// Most runs remembered at once; past it the cache starts again empty (the next check of
/// each run walks its state once more).
const MOST_RUNS: usize = 1024;

/// The step keys of the current state of runs with many steps (see the module's docs).
#[derive(Default)]
pub(super) struct StepKeys {
    runs: Mutex<HashMap<String, Seen>>,
}

/// The step keys of a run's state at `seq` in its chain of entries up to log entry `at`.
struct Seen {
    seq: u64,
    at: u64,
    /// Step name → the occurrences recorded.
    keys: HashMap<String, HashSet<u32>>,
    len: usize,
}

impl StepKeys {
    /// Forgets every run: after a batch that did not commit.
    pub(super) fn forget_all(&self) {
        self.runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Forgets `run_id`: after its deletion (its log entries are gone).
    pub(super) fn forget(&self, run_id: &str) {
        self.runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(run_id);
    }

    /// Whether the run `run_id`, whose newest log entry is `newest` (0: none), has the step
    /// record `(seq, name, occurrence)`: a walk back through `log` from `newest` to the
    /// first entry of an earlier seq, or to the entry a remembered walk started from.
    ///
    /// # Errors
    /// What [`log::walk`] returns for a damaged chain or a failed read.
    pub(super) fn taken(
        &self,
        log: &impl ReadableTable<u64, &'static [u8]>,
        run_id: &str,
        newest: u64,
        (seq, name, occurrence): (u64, &str, u32),
    ) -> Result<bool, LogError> {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        let seen = runs
            .remove(run_id)
            .filter(|seen| seen.seq == seq && seen.at <= newest);
        let stop = seen.as_ref().map(|seen| seen.at);
        let mut found: Vec<(String, u32)> = Vec::new();
        let mut met = false;
        log::walk(log, run_id, newest, Chain::All, |at, entry| {
            if Some(at) == stop {
                met = true;
                return false;
            }
            if let Kind::Step { name, occurrence } = entry.kind
                && entry.seq == seq
            {
                found.push((name.to_owned(), occurrence));
            }
            entry.seq >= seq
        })?;
        let mut seen = match seen {
            Some(seen) if met => seen,
            _ => Seen {
                seq,
                at: newest,
                keys: HashMap::new(),
                len: 0,
            },
        };
        seen.at = newest;
        for (name, occurrence) in found {
            if seen.keys.entry(name).or_default().insert(occurrence) {
                seen.len += 1;
            }
        }
        let taken = seen
            .keys
            .get(name)
            .is_some_and(|occurrences| occurrences.contains(&occurrence));
        if seen.len >= REMEMBERED_FROM {
            if runs.len() >= MOST_RUNS {
                runs.clear();
            }
            runs.insert(run_id.to_owned(), seen);
        }
        Ok(taken)
    }
}
