//! [`Unsealing`]: payloads opened with the CLI's own key (`--key-file`), whichever way the
//! store is reached. A running process's control endpoint serves payloads as stored (it
//! never opens them for a caller), so the key stays with whoever runs the CLI.

use loops_core::{
    Compacted, EventRecord, KeyRead, KeySearch, Keyring, Payloads, Pruned, RetentionPolicy,
    RunInfo, RunStatus, SchemaHash, Sent, parse_envelope,
};
use loops_core::{FailureRecord, StepRecord, TransitionRecord};
use serde_json::value::RawValue;

use super::{Operator, Taker};
use crate::failure::{Failure, Kind, Result};

/// An operator whose reads open sealed payloads (or, without a key, show
/// `<encrypted: key K>`), and whose `send` and `cancel` seal what they store.
pub struct Unsealing {
    inner: Box<dyn Operator>,
    payloads: Payloads,
    /// The key file's keys, which seal what `send` and `cancel` store (with the key the
    /// store's sealing calls for).
    keys: Option<Keyring>,
}

impl Unsealing {
    /// `inner`, its payloads opened by `payloads`; what it stores sealed with `keys`, if
    /// given. With `keys`, their check values are first checked against those the store
    /// recorded, as a worker's are: a key of a listed id and other bytes would read every
    /// payload as altered and seal what no worker opens. (Keys that hold none of the store's
    /// keys read on: each payload they cannot open says which key it needs; `send` and
    /// `cancel` refuse to seal with them.)
    ///
    /// # Errors
    /// `Error::KeyMismatch` (exit 2) for such a key; the store's errors reading its check
    /// values.
    pub fn new(
        inner: Box<dyn Operator>,
        payloads: Payloads,
        keys: Option<Keyring>,
    ) -> Result<Unsealing> {
        if keys.is_some() {
            loops_core::check_keys(inner.label().to_owned(), inner.sealing_checks()?, &payloads)?;
        }
        Ok(Unsealing {
            inner,
            payloads,
            keys,
        })
    }

    fn rows(&self, mut rows: Vec<RunInfo>) -> Result<Vec<RunInfo>> {
        for info in &mut rows {
            self.payloads.open_info(info)?;
        }
        Ok(rows)
    }

    fn row(&self, mut info: RunInfo) -> Result<RunInfo> {
        self.payloads.open_info(&mut info)?;
        Ok(info)
    }

    /// How the text `send` or `cancel` stores (`what`) in run `run_id` is sealed: as the
    /// store does (`loops_core::seals_as_store_does`, the rule of the CLI's own runtimes
    /// too). With a key file: in clear (`None`) in a store that lists no key; else sealed
    /// (the payloads returned) with its writing key if the store lists it, or the newest
    /// key of the file the store lists (after a rotation no worker has sealed under yet);
    /// refused in a store that lists none of its keys; and only if the key file opens a
    /// state the store holds sealed with that key ([`check_key`](Self::check_key)).
    /// Without a key file, refused in a store that lists sealing keys (the store's
    /// `Error::Encrypted`, the same on every path) or in a run whose payloads are sealed (a
    /// store sealed by a loops that did not record its keys).
    fn sealing(&self, run_id: &str, what: &str) -> Result<Option<Payloads>> {
        let keys = self.inner.sealing_keys()?;
        let label = self.inner.label().to_owned();
        if let Some(ring) = &self.keys {
            let held = self.payloads.key_ids();
            let Some(key) = loops_core::seals_as_store_does(label.clone(), keys, &held)? else {
                return Ok(None);
            };
            // The key file's check values were checked against the store's when this
            // operator was made (`new`).
            let checked = (self.inner.sealing_checks()?)
                .iter()
                .any(|(id, _)| *id == key);
            // A key the store records no check for (recorded by an older loops): checked
            // against a state sealed with it instead.
            if !checked && let Err(e) = self.check_key(run_id, &key) {
                return Err(Failure::of(
                    Kind::BadInput,
                    format!(
                        "the {what} is not sent: the key file's key `{key}` does not open what the store holds sealed with `{key}` ({}), so no worker could open what it seals; give the key file the workers use",
                        e.message
                    ),
                ));
            }
            let sealer = ring.writing_with(&key).unwrap_or_else(|| ring.clone());
            return Ok(Some(Payloads::new(std::sync::Arc::new(sealer))));
        }
        if !keys.is_empty() {
            return Err(loops_core::Error::Encrypted { store: label, keys }.into());
        }
        if let Some((_, record)) = self.inner.latest(run_id)?
            && let Some(Ok(sealed)) = parse_envelope(record.payload.get())
        {
            return Err(Failure::new(format!(
                "run `{run_id}` is encrypted (key `{}`), and the {what} would be stored in clear: {}",
                sealed.key,
                crate::failure::NO_KEY_HINT
            )));
        }
        Ok(None)
    }
}

impl Unsealing {
    /// `Ok` unless the key file's key `key` fails to open a state the store holds sealed
    /// with `key` (`loops_core::KeySearch`, the runtime's rule too: the latest state of run
    /// `run_id`, else of the first run, of at most `loops_core::KEY_SEARCH_RUNS`, whose
    /// latest state is sealed with it). A key of the same id with other bytes (a wrong key
    /// file, a botched rotation) would seal what no worker opens. `Ok` too if no such state
    /// is found (its runs were pruned, say): nothing to check against.
    ///
    /// # Errors
    /// The error opening the state found (naming its run and record) if the key does not
    /// open it; the store's errors.
    fn check_key(&self, run_id: &str, key: &str) -> Result<()> {
        let mut search = KeySearch::new(key, Some(run_id));
        loop {
            match search.needs() {
                KeyRead::Runs(status) => {
                    let runs = self.inner.list(status, None)?;
                    search.listed(runs.into_iter().map(|info| info.run_id));
                }
                KeyRead::Latest(run) => {
                    let latest = self.inner.latest(&run)?;
                    search.read(&self.payloads, &run, latest.as_ref().map(|(_, r)| r))?;
                }
                KeyRead::Done(_) => return Ok(()),
            }
        }
    }
}

impl Operator for Unsealing {
    fn label(&self) -> &str {
        self.inner.label()
    }

    fn reached(&self) -> String {
        self.inner.reached()
    }

    fn taker(&self) -> Taker {
        self.inner.taker()
    }

    fn list(&self, status: RunStatus, workflow: Option<&str>) -> Result<Vec<RunInfo>> {
        self.rows(self.inner.list(status, workflow)?)
    }

    fn run(&self, run_id: &str) -> Result<Option<RunInfo>> {
        self.inner
            .run(run_id)?
            .map(|info| self.row(info))
            .transpose()
    }

    /// Attributes are stored in plaintext: as they are.
    fn children(&self, run_id: &str) -> Result<Vec<RunInfo>> {
        self.inner
            .children(run_id)?
            .into_iter()
            .map(|info| self.row(info))
            .collect()
    }

    fn attributes(&self, run_id: &str) -> Result<loops_core::Attributes> {
        self.inner.attributes(run_id)
    }

    fn search(
        &self,
        filter: &loops_core::RunFilter,
    ) -> Result<Vec<(RunInfo, loops_core::Attributes)>> {
        self.inner
            .search(filter)?
            .into_iter()
            .map(|(info, attributes)| Ok((self.row(info)?, attributes)))
            .collect()
    }

    fn latest(&self, run_id: &str) -> Result<Option<(RunInfo, TransitionRecord)>> {
        let Some((info, mut record)) = self.inner.latest(run_id)? else {
            return Ok(None);
        };
        self.payloads.open_transition(run_id, &mut record)?;
        Ok(Some((self.row(info)?, record)))
    }

    fn history(&self, run_id: &str) -> Result<Vec<TransitionRecord>> {
        let mut records = self.inner.history(run_id)?;
        for record in &mut records {
            self.payloads.open_transition(run_id, record)?;
        }
        Ok(records)
    }

    fn steps(&self, run_id: &str, seq: u64) -> Result<Vec<(String, u32, StepRecord)>> {
        let mut steps = self.inner.steps(run_id, seq)?;
        for (name, occurrence, record) in &mut steps {
            self.payloads
                .open_step(run_id, seq, name, *occurrence, record)?;
        }
        Ok(steps)
    }

    fn all_steps(
        &self,
        run_id: &str,
        history: &[TransitionRecord],
    ) -> Result<Vec<(u64, String, u32, StepRecord)>> {
        let mut steps = self.inner.all_steps(run_id, history)?;
        for (seq, name, occurrence, record) in &mut steps {
            self.payloads
                .open_step(run_id, *seq, name, *occurrence, record)?;
        }
        Ok(steps)
    }

    fn failures(&self, run_id: &str) -> Result<Vec<(u64, FailureRecord)>> {
        let mut failures = self.inner.failures(run_id)?;
        for (seq, record) in &mut failures {
            self.payloads.open_failure(run_id, *seq, record)?;
        }
        Ok(failures)
    }

    fn events(&self, run_id: &str) -> Result<Vec<(u64, EventRecord, bool)>> {
        let mut events = self.inner.events(run_id)?;
        for (_, record, _) in &mut events {
            self.payloads.open_event(run_id, record)?;
        }
        Ok(events)
    }

    fn schemas(&self) -> Result<Vec<(SchemaHash, String)>> {
        self.inner.schemas()
    }

    fn schema(&self, hash: SchemaHash) -> Result<Option<String>> {
        self.inner.schema(hash)
    }

    fn sealing_keys(&self) -> Result<Vec<String>> {
        self.inner.sealing_keys()
    }

    fn sealing_checks(&self) -> Result<Vec<(String, String)>> {
        self.inner.sealing_checks()
    }

    // Schedules hold no payload: they pass as they are.
    fn schedules(&self) -> Result<Vec<loops_core::ScheduleStatus>> {
        self.inner.schedules()
    }

    fn pause_schedule(&self, name: &str, paused: bool) -> Result<loops_core::ScheduleStatus> {
        self.inner.pause_schedule(name, paused)
    }

    fn remove_schedule(&self, name: &str) -> Result<()> {
        self.inner.remove_schedule(name)
    }

    fn cancel(&self, run_id: &str, reason: &str) -> Result<RunInfo> {
        if let Some(sealer) = self.sealing(run_id, "cancellation reason")? {
            // Checked in clear, before it is sealed (the runtime sees the sealed text only).
            loops_core::check_cancel_reason(run_id, reason)
                .map_err(|e| super::core_failure(self.label(), e))?;
            let reason = sealer.seal_cancel(run_id, reason)?;
            return self.row(self.inner.cancel(run_id, &reason)?);
        }
        self.row(self.inner.cancel(run_id, reason)?)
    }

    fn retry(&self, run_id: &str) -> Result<(RunInfo, Taker)> {
        let (info, taker) = self.inner.retry(run_id)?;
        Ok((self.row(info)?, taker))
    }

    fn send(
        &self,
        run_id: &str,
        event: &str,
        key: Option<&str>,
        payload: &RawValue,
    ) -> Result<(Sent, Taker)> {
        let Some(sealer) = self.sealing(run_id, "event")? else {
            return self.inner.send(run_id, event, key, payload);
        };
        // The declared events are checked on the payload in clear, before it is sealed (the
        // receiver checks only a sealed payload's name).
        if let Some(info) = self.inner.run(run_id)?
            && let Some(description) = self.inner.schema(info.schema)?
        {
            loops_core::check_event(&info, &description, event, payload.get())
                .map_err(|e| super::core_failure(self.label(), e))?;
        }
        let sealed = sealer.seal_event(run_id, event, payload.get())?;
        let sealed = RawValue::from_string(sealed)
            .map_err(|e| Failure::new(format!("the sealed event is not JSON: {e}")))?;
        self.inner.send(run_id, event, key, &sealed)
    }

    fn prune(
        &self,
        policy: &RetentionPolicy,
        dry_run: bool,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Pruned> {
        self.inner.prune(policy, dry_run, progress)
    }

    fn compact(&self) -> Result<Compacted> {
        self.inner.compact()
    }

    fn close(self: Box<Self>) {
        self.inner.close();
    }
}
