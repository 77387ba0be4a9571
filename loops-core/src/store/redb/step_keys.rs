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
    /// `(name, occurrence)` of each step recorded.
    keys: HashSet<(String, u32)>,
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
        // Entries are compared in place (a state of a few steps allocates nothing); owned
        // copies are kept only for a remembered state.
        let mut taken = false;
        let mut steps = 0usize;
        let mut added = Vec::new();
        let mut met = false;
        log::walk(log, run_id, newest, Chain::All, |at, entry| {
            if Some(at) == stop {
                met = true;
                return false;
            }
            if let Kind::Step {
                name: n,
                occurrence: o,
            } = entry.kind
                && entry.seq == seq
            {
                taken |= n == name && o == occurrence;
                steps += 1;
                if stop.is_some() {
                    added.push((n.to_owned(), o));
                }
            }
            entry.seq >= seq
        })?;
        let keys = match seen {
            Some(mut seen) if met => {
                seen.keys.extend(added);
                seen.keys
            }
            // The remembered entry is not on the chain: the walk read the whole state.
            Some(_) => added.into_iter().collect(),
            // A state of many steps, not remembered yet: its keys, read once.
            None if steps >= REMEMBERED_FROM => state_keys(log, run_id, newest, seq)?,
            None => return Ok(taken),
        };
        taken = taken || keys.contains(&(name.to_owned(), occurrence));
        if keys.len() >= REMEMBERED_FROM {
            if runs.len() >= MOST_RUNS {
                runs.clear();
            }
            runs.insert(
                run_id.to_owned(),
                Seen {
                    seq,
                    at: newest,
                    keys,
                },
            );
        }
        Ok(taken)
    }
}

/// The keys of the step records of the run's state at `seq`, walking back from `newest`.
fn state_keys(
    log: &impl ReadableTable<u64, &'static [u8]>,
    run_id: &str,
    newest: u64,
    seq: u64,
) -> Result<HashSet<(String, u32)>, LogError> {
    let mut keys = HashSet::new();
    log::walk(log, run_id, newest, Chain::All, |_, entry| {
        if let Kind::Step { name, occurrence } = entry.kind
            && entry.seq == seq
        {
            keys.insert((name.to_owned(), occurrence));
        }
        entry.seq >= seq
    })?;
    Ok(keys)
}
