//! [`KeySearch`]: the one rule for a writing key that a store lists without a check value
//! (recorded by a loops from before check values): before anything is sealed with it, the key
//! must open a state the store holds sealed with it, so that a key of the same id and other
//! bytes (a wrong key file, a botched rotation) never seals what no worker opens. The runtime
//! (before its first sealed write) and the CLI (`send`, `cancel` with `--key-file`) both
//! drive it, each over its own reads.

use std::collections::VecDeque;

use super::Payloads;
use crate::codec::parse_envelope;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::record::TransitionRecord;
use crate::status::RunStatus;

/// The most runs whose latest state a search reads: in a store sealed with the key that
/// keeps its runs, one of the first few holds a state sealed with it.
pub const KEY_SEARCH_RUNS: usize = 1_000;

/// The search for a state sealed with a key, as a sequence of reads its caller makes
/// (so that one rule serves callers whose reads are async and callers whose reads are
/// not): the latest state of the run being written, if any, then the latest states of the
/// store's runs in [`RunStatus::ALL`] order, at most [`KEY_SEARCH_RUNS`] of them, until one
/// is sealed with the key.
///
/// ```
/// # extern crate loops_core as loops;
/// use std::sync::Arc;
/// use loops::{KeyRead, KeySearch, Keyring, Payloads, RedbStore};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedbStore::in_memory()?;
/// let keys = "k1 0101010101010101010101010101010101010101010101010101010101010101\n";
/// let payloads = Payloads::new(Arc::new(Keyring::parse(keys)?));
/// let mut search = KeySearch::new("k1", Some("run-7"));
/// let found = loop {
///     match search.needs() {
///         KeyRead::Runs(status) => {
///             let runs = store.list(status, None)?;
///             search.listed(runs.into_iter().map(|info| info.run_id));
///         }
///         KeyRead::Latest(run) => {
///             let latest = store.latest(&run)?;
///             search.read(&payloads, &run, latest.as_ref().map(|(_, record)| record))?;
///         }
///         KeyRead::Done(found) => break found,
///     }
/// };
/// assert!(!found); // an empty store holds no state sealed with `k1`
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct KeySearch {
    key: String,
    /// The run being written, read first and skipped in the listings.
    first: Option<String>,
    /// Whether `first` was asked for.
    asked_first: bool,
    /// How many statuses of [`RunStatus::ALL`] were listed.
    statuses: usize,
    /// Listed runs not read yet.
    queued: VecDeque<String>,
    /// How many listed runs were asked for.
    looked: usize,
    /// Set once a state sealed with the key was read and opened.
    found: bool,
}

/// What a [`KeySearch`] needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRead {
    /// The ids of the store's runs in this status: give them to [`KeySearch::listed`].
    Runs(RunStatus),
    /// The latest state of this run: give it to [`KeySearch::read`].
    Latest(String),
    /// The search is over: `true` if the key opened a state sealed with it, `false` if no
    /// state sealed with it was found (nothing to check against: its runs were pruned, say).
    Done(bool),
}

impl KeySearch {
    /// A search for a state sealed with `key`, starting with the latest state of `run_id`
    /// (the run about to be written), if given.
    pub fn new(key: &str, run_id: Option<&str>) -> KeySearch {
        KeySearch {
            key: key.to_owned(),
            first: run_id.map(str::to_owned),
            asked_first: false,
            statuses: 0,
            queued: VecDeque::new(),
            looked: 0,
            found: false,
        }
    }

    /// The next read the search needs, or its end.
    pub fn needs(&mut self) -> KeyRead {
        if self.found {
            return KeyRead::Done(true);
        }
        if !self.asked_first
            && let Some(first) = &self.first
        {
            self.asked_first = true;
            return KeyRead::Latest(first.clone());
        }
        if self.looked == KEY_SEARCH_RUNS {
            return KeyRead::Done(false);
        }
        if let Some(run_id) = self.queued.pop_front() {
            self.looked += 1;
            return KeyRead::Latest(run_id);
        }
        match RunStatus::ALL.get(self.statuses) {
            Some(&status) => {
                self.statuses += 1;
                KeyRead::Runs(status)
            }
            None => KeyRead::Done(false),
        }
    }

    /// The answer to [`KeyRead::Runs`]: the ids of the runs in that status, in the store's
    /// order.
    pub fn listed(&mut self, run_ids: impl IntoIterator<Item = String>) {
        let first = self.first.as_deref();
        self.queued
            .extend(run_ids.into_iter().filter(|id| Some(id.as_str()) != first));
    }

    /// The answer to [`KeyRead::Latest`]: run `run_id`'s latest state (`None` if it has
    /// none), judged with `payloads` (the codec holding the key). A state sealed with the
    /// key that the key opens ends the search; one sealed with another key, or in clear, is
    /// passed over.
    ///
    /// # Errors
    /// The state is sealed with the key and the key does not open it: the key has the id
    /// and other bytes. The error is the opening's ([`Error::Payload`], naming the run,
    /// record and cause); the runtime refuses its key with [`Error::KeyMismatch`].
    pub fn read(
        &mut self,
        payloads: &Payloads,
        run_id: &str,
        latest: Option<&TransitionRecord>,
    ) -> Result<()> {
        let Some(record) = latest else {
            return Ok(());
        };
        match parse_envelope(record.payload.get()) {
            Some(Ok(sealed)) if sealed.key == self.key => {
                payloads.verify_transition(run_id, record)?;
                self.found = true;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::value::RawValue;

    use super::super::transition_at;
    use super::*;
    use crate::codec::Keyring;
    use crate::schema::SchemaHash;

    const K1: &str = "k1 0101010101010101010101010101010101010101010101010101010101010101\n";
    const K1_OTHER: &str = "k1 0909090909090909090909090909090909090909090909090909090909090909\n";
    const K2: &str = "k2 0202020202020202020202020202020202020202020202020202020202020202\n";

    fn payloads(keys: &str) -> Payloads {
        Payloads::new(Arc::new(Keyring::parse(keys).unwrap()))
    }

    /// Run `run_id`'s state at seq 0: sealed by `by`, or in clear.
    fn state(run_id: &str, by: Option<&Payloads>) -> TransitionRecord {
        let plain = r#"{"Open":{}}"#;
        let text = match by {
            Some(p) => p.seal(&transition_at(run_id, 0), plain).unwrap(),
            None => plain.to_owned(),
        };
        TransitionRecord {
            seq: 0,
            state: "Open".into(),
            at_ms: 0,
            schema: SchemaHash::from_u64(1),
            payload: RawValue::from_string(text).unwrap(),
            migrated: None,
        }
    }

    /// Drives `search` over `runs` (id, status, latest state), recording each read.
    fn drive(
        mut search: KeySearch,
        runs: &[(&str, RunStatus, Option<TransitionRecord>)],
        with: &Payloads,
    ) -> (Result<bool>, Vec<KeyRead>) {
        let mut reads = Vec::new();
        loop {
            let need = search.needs();
            reads.push(need.clone());
            match need {
                KeyRead::Runs(status) => search.listed(
                    runs.iter()
                        .filter(|(_, s, _)| *s == status)
                        .map(|(id, _, _)| (*id).to_owned()),
                ),
                KeyRead::Latest(run) => {
                    let latest = runs.iter().find(|(id, _, _)| *id == run);
                    if let Err(e) = search.read(with, &run, latest.and_then(|(_, _, r)| r.as_ref()))
                    {
                        return (Err(e), reads);
                    }
                }
                KeyRead::Done(found) => return (Ok(found), reads),
            }
        }
    }

    #[test]
    fn the_run_written_is_read_first_then_the_runs_by_status_passing_over_others() {
        let k1 = payloads(K1);
        let k2 = payloads(K2);
        let runs = [
            ("new", RunStatus::Running, None),
            ("clear", RunStatus::Running, Some(state("clear", None))),
            (
                "other-key",
                RunStatus::Waiting,
                Some(state("other-key", Some(&k2))),
            ),
            (
                "sealed",
                RunStatus::Completed,
                Some(state("sealed", Some(&k1))),
            ),
            (
                "later",
                RunStatus::Completed,
                Some(state("later", Some(&k1))),
            ),
        ];
        let (found, reads) = drive(KeySearch::new("k1", Some("new")), &runs, &k1);
        assert!(found.unwrap());
        let latest: Vec<&str> = reads
            .iter()
            .filter_map(|r| match r {
                KeyRead::Latest(id) => Some(id.as_str()),
                _ => None,
            })
            .collect();
        // `new` once (first, not again when listed); the search ends at `sealed`.
        assert_eq!(latest, ["new", "clear", "other-key", "sealed"]);
        assert_eq!(reads.last(), Some(&KeyRead::Done(true)));
    }

    #[test]
    fn a_key_of_the_same_id_and_other_bytes_is_refused_by_the_state_it_cannot_open() {
        let runs = [(
            "sealed",
            RunStatus::Waiting,
            Some(state("sealed", Some(&payloads(K1)))),
        )];
        let (found, _) = drive(KeySearch::new("k1", None), &runs, &payloads(K1_OTHER));
        let message = found.unwrap_err().to_string();
        assert!(message.contains("run `sealed`"), "{message}");
    }

    #[test]
    fn no_state_sealed_with_the_key_ends_not_found_after_every_status() {
        let runs = [("clear", RunStatus::Completed, Some(state("clear", None)))];
        let (found, reads) = drive(KeySearch::new("k1", None), &runs, &payloads(K1));
        assert!(!found.unwrap());
        let listed = reads
            .iter()
            .filter(|r| matches!(r, KeyRead::Runs(_)))
            .count();
        assert_eq!(listed, RunStatus::ALL.len());
    }

    #[test]
    fn at_most_key_search_runs_are_read() {
        let clear = state("r", None);
        let ids: Vec<String> = (0..KEY_SEARCH_RUNS + 10).map(|i| format!("r{i}")).collect();
        let runs: Vec<(&str, RunStatus, Option<TransitionRecord>)> = ids
            .iter()
            .map(|id| (id.as_str(), RunStatus::Completed, Some(clear.clone())))
            .collect();
        let (found, reads) = drive(KeySearch::new("k1", Some("r0")), &runs, &payloads(K1));
        assert!(!found.unwrap());
        let latest = reads
            .iter()
            .filter(|r| matches!(r, KeyRead::Latest(_)))
            .count();
        // `r0` first, then KEY_SEARCH_RUNS listed runs.
        assert_eq!(latest, KEY_SEARCH_RUNS + 1);
    }
}
