//! [`SealedStore`]: the store a runtime drives, between it and any [`Store`], with payloads
//! through [`Payloads`]; and the one rule of a store that holds sealed payloads: a codec's
//! key is recorded before its first payload ([`Write::Seal`]), and a runtime without a codec
//! refuses a store that lists any key ([`Error::Encrypted`]).

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;

use super::{KeyRead, KeySearch, Payloads, row_at};
use crate::error::{Error, Result};
use crate::record::{FailureRecord, StepRecord, TransitionRecord};
use crate::schema::SchemaHash;
use crate::store::{
    BoxFuture, ClaimFilter, EventRecord, Lease, Reply, RunInfo, RunStatus, SeqStep, Store, Write,
};

/// A [`Store`] whose payloads go through [`Payloads`]: what the runtime drives, with its
/// codec ([`RuntimeBuilder::codec`](crate::RuntimeBuilder::codec)) or without one.
///
/// - With a codec: payloads are sealed on write and opened on read, and the codec's key id
///   is recorded in the store ([`Write::Seal`]) before the first write that carries a
///   payload (once per `SealedStore`). Before the first read or write, a store that lists
///   another key under one of the codec's ids, or only keys the codec does not hold, is
///   refused ([`refuse_foreign_codec`]). A payload that arrived sealed (an event a CLI
///   sealed) is stored only if the codec opens it ([`Error::SealedRefused`]).
/// - With a codec that follows the store ([`Payloads::following`]: a tool such as the CLI):
///   no key is recorded; payloads are sealed only in a store that lists the codec's key, in
///   clear in one that lists none ([`seals_as_store_does`]).
/// - Without a codec: the store's [`sealing_keys`](Store::sealing_keys) are read before the
///   first read or write; a store that lists any is refused with [`Error::Encrypted`]. A
///   sealed payload found anyway (a store sealed by a loops that did not record its keys)
///   is [`Error::Payload`] naming its key, never a decode error of the workflow's type. A
///   payload that arrives sealed is refused ([`Error::SealedRefused`]).
/// - Redacting (a reader such as the CLI): reads go on, a sealed payload reads as
///   `<encrypted: key K>`; a write that carries a payload into a store that lists keys is
///   refused with [`Error::Encrypted`] rather than stored in clear.
pub(crate) struct SealedStore {
    inner: Arc<dyn Store>,
    payloads: Payloads,
    /// Set once the rule above held, to how writes are sealed: the key recorded (codec),
    /// the store's sealing followed ([`Payloads::following`]), the store found in clear (no
    /// codec, redacting).
    checked: OnceCell<Sealing>,
    /// A runtime's codec (not following): set once [`refuse_foreign_codec`] held, before
    /// its first read or write, to whether the store lists its writing key without a check
    /// value (recorded by a loops before check values).
    verified: OnceCell<bool>,
}

/// How a [`SealedStore`]'s writes store their payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sealing {
    /// In clear; a payload that arrives sealed is refused.
    Clear,
    /// Sealed with the codec's writing key (one that arrives sealed is kept if it opens).
    Sealed,
    /// A writer that follows a store which lists another key the codec holds, not its
    /// writing key: only payloads that arrive sealed (under that key, by a CLI that chose
    /// it: [`seals_as_store_does`]) are stored, if they open; one in clear would be sealed
    /// with a key the workers may not hold, and is refused ([`Error::KeyNotInStore`]).
    ArrivingSealedOnly,
}

impl SealedStore {
    /// `inner` with payloads sealed and opened by `payloads`.
    pub(crate) fn new(inner: Arc<dyn Store>, payloads: Payloads) -> SealedStore {
        SealedStore {
            inner,
            payloads,
            checked: OnceCell::new(),
            verified: OnceCell::new(),
        }
    }

    /// The rule of the module's doc, before a read (`carries` false) or a write; returns
    /// how a write's payloads are stored.
    async fn check(&self, carries: bool) -> Result<Sealing> {
        self.check_for(carries, None).await
    }

    /// [`check`](Self::check), for a write to run `run_id` if it has one.
    async fn check_for(&self, carries: bool, run_id: Option<&str>) -> Result<Sealing> {
        let key = self.payloads.key_id();
        let mut unchecked = false;
        if let Some(key) = key.as_deref().filter(|_| !self.payloads.follows()) {
            unchecked = *settled(&self.verified, || async {
                let keys = self.inner.sealing_keys().await?;
                let recorded = self.inner.sealing_checks().await?;
                let unchecked =
                    keys.iter().any(|k| k == key) && !recorded.iter().any(|(id, _)| id == key);
                refuse_foreign_codec(self.inner.label(), keys, recorded, &self.payloads)?;
                Ok::<bool, Error>(unchecked)
            })
            .await?;
        }
        match (key, self.payloads.redacts()) {
            (Some(key), _) if carries => {
                let sealing = settled(&self.checked, || async {
                    if self.payloads.follows() {
                        let recorded = self.inner.sealing_checks().await?;
                        check_keys(self.inner.label(), recorded, &self.payloads)?;
                        let keys = self.inner.sealing_keys().await?;
                        let held = self.payloads.key_ids();
                        return Ok(
                            match seals_as_store_does(self.inner.label(), keys, &held)? {
                                None => Sealing::Clear,
                                Some(chosen) if chosen == key => Sealing::Sealed,
                                Some(_) => Sealing::ArrivingSealedOnly,
                            },
                        );
                    }
                    let at_ms = crate::record::now_ms();
                    let mut check = self.payloads.key_check(&key);
                    if unchecked && check.is_some() {
                        check = self.verified_check(&key, run_id, check).await?;
                    }
                    let seal = Write::Seal { key, check, at_ms };
                    self.inner.write(None, seal).await?;
                    Ok::<Sealing, Error>(Sealing::Sealed)
                })
                .await?;
                Ok(*sealing)
            }
            (Some(_), _) => Ok(Sealing::Sealed),
            (None, true) if !carries => Ok(Sealing::Clear),
            _ => {
                settled(&self.checked, || async {
                    clear(&*self.inner).await.map(|()| Sealing::Clear)
                })
                .await?;
                Ok(Sealing::Clear)
            }
        }
    }

    /// For the writing key `key` that the store lists without a check value (recorded by a
    /// loops before check values): `check`, its check value, if the key opens a state sealed
    /// with `key` ([`KeySearch`], from run `run_id`, that of the first write); `None` if no
    /// state sealed with it is found (the check is not recorded unverified: a worker with
    /// another key under the id would then lock the right ones out). The search lists the
    /// store's runs by status: once per process, and only on a store written before check
    /// values.
    ///
    /// # Errors
    /// [`Error::KeyMismatch`] if the key does not open the state found: the key has the id
    /// and other bytes, and what it sealed no other worker would open. The store's read
    /// errors.
    async fn verified_check(
        &self,
        key: &str,
        run_id: Option<&str>,
        check: Option<String>,
    ) -> Result<Option<String>> {
        let mut search = KeySearch::new(key, run_id);
        loop {
            match search.needs() {
                KeyRead::Runs(status) => {
                    let runs = self.inner.list(status, None).await?;
                    search.listed(runs.into_iter().map(|info| info.run_id));
                }
                KeyRead::Latest(run) => {
                    let latest = self.inner.latest(&run).await?;
                    let latest = latest.as_ref().map(|(_, record)| record);
                    if search.read(&self.payloads, &run, latest).is_err() {
                        return Err(Error::KeyMismatch {
                            store: self.inner.label(),
                            key: key.to_owned(),
                        });
                    }
                }
                KeyRead::Done(found) => return Ok(check.filter(|_| found)),
            }
        }
    }

    fn opened_rows(&self, rows: Result<Vec<RunInfo>>) -> Result<Vec<RunInfo>> {
        let mut rows = rows?;
        for info in &mut rows {
            self.payloads.open_info(info)?;
        }
        Ok(rows)
    }

    /// A block reason sealed, or the reason stored already if the run is blocked for the
    /// same schema and reason (so that the plan sees the block as a repeat and writes
    /// nothing, as it would in clear).
    async fn seal_block(&self, run_id: &str, schema: SchemaHash, reason: String) -> Result<String> {
        if let Some(info) = self.inner.run_info(run_id).await?
            && let Some(block) = info.block
            && block.schema == schema
        {
            let mut opened = block.reason.clone();
            if self
                .payloads
                .open_text(&row_at(run_id, "block"), &mut opened)
                .is_ok()
                && opened == reason
            {
                return Ok(block.reason);
            }
        }
        self.payloads.seal(&row_at(run_id, "block"), &reason)
    }
}

/// `Ok` unless a key of `payloads`' codec has another check value than the store `label`
/// recorded for its id (`recorded`: [`Store::sealing_checks`]): [`Error::KeyMismatch`],
/// the one check of a key's bytes, for a runtime before its first sealed payload and for
/// the CLI before it seals.
///
/// # Errors
/// [`Error::KeyMismatch`].
pub fn check_keys(
    label: String,
    recorded: Vec<(String, String)>,
    payloads: &Payloads,
) -> Result<()> {
    for (key, check) in recorded {
        if payloads.key_check(&key).is_some_and(|ours| ours != check) {
            return Err(Error::KeyMismatch { store: label, key });
        }
    }
    Ok(())
}

/// `Ok` if a runtime whose codec is `payloads` may read and seal the payloads of the store
/// `label`, which lists the keys `keys` ([`Store::sealing_keys`]) with the check values
/// `recorded` ([`Store::sealing_checks`]): the one check of a runtime's codec, at the open
/// of its store file and before the first read or write of a store built elsewhere (and of
/// a key file given to `loops check`).
///
/// # Errors
/// - [`Error::KeyMismatch`] if one of its keys has another check value than the store
///   recorded for that id ([`check_keys`]);
/// - [`Error::KeyNotInStore`] if the store lists keys and the codec holds none of them: it
///   could open none of the store's payloads, and would record a second key whose payloads
///   the other workers could not open (a rotation keeps the old key in the keyring beside
///   the new one).
pub fn refuse_foreign_codec(
    label: String,
    keys: Vec<String>,
    recorded: Vec<(String, String)>,
    payloads: &Payloads,
) -> Result<()> {
    check_keys(label.clone(), recorded, payloads)?;
    seals_as_store_does(label, keys, &payloads.key_ids()).map(drop)
}

/// `cell`'s value, set by `init` first if it has none. The initialization is boxed: it
/// runs once per [`SealedStore`], and inline it would count in the size of the future of
/// every read and write (a write's future held 1.1 KiB, too large for the allocator's
/// per-thread cache).
async fn settled<T, F>(cell: &OnceCell<T>, init: impl FnOnce() -> F) -> Result<&T>
where
    F: Future<Output = Result<T>>,
{
    match cell.get() {
        Some(value) => Ok(value),
        None => Box::pin(cell.get_or_try_init(init)).await,
    }
}

/// `Ok` if `store` lists no key that sealed payloads in it, else [`Error::Encrypted`]
/// naming it and its keys: the one check of a reader or writer without the key.
///
/// # Errors
/// [`Error::Encrypted`]; the store's error if its keys cannot be read.
async fn clear(store: &dyn Store) -> Result<()> {
    refuse_sealed(store.label(), store.sealing_keys().await?)
}

/// `Ok` if `keys` (a store's [`sealing_keys`](Store::sealing_keys)) is empty, else
/// [`Error::Encrypted`] naming the store `label` and the keys.
///
/// # Errors
/// [`Error::Encrypted`].
pub(crate) fn refuse_sealed(label: String, keys: Vec<String>) -> Result<()> {
    if keys.is_empty() {
        Ok(())
    } else {
        Err(Error::Encrypted { store: label, keys })
    }
}

/// The key a writer that follows a store's sealing (a tool such as the `loops` CLI with a
/// key file) seals with, in the store `label` whose payloads are sealed with `keys`
/// ([`Store::sealing_keys`], oldest first), given `held`, the ids of its own keys (the
/// writing key first): `None` in a store that lists no key (its workers keep payloads in
/// clear, and a sealed one would stop every one of them); the writing key if the store
/// lists it; else the newest key the store lists that it holds (after a rotation that no
/// worker has sealed under yet, the key the workers seal with now). The one rule of
/// [`Payloads::following`] and of the CLI's writes through a control endpoint.
///
/// # Errors
/// [`Error::KeyNotInStore`] when the store lists keys and none it holds: its workers may
/// not hold its key.
pub fn seals_as_store_does(
    label: String,
    keys: Vec<String>,
    held: &[String],
) -> Result<Option<String>> {
    let writing = held.first().cloned().unwrap_or_default();
    if keys.is_empty() {
        return Ok(None);
    }
    if keys.contains(&writing) {
        return Ok(Some(writing));
    }
    match keys.iter().rev().find(|k| held.contains(k)) {
        Some(older) => Ok(Some(older.clone())),
        None => Err(Error::KeyNotInStore {
            store: label,
            key: writing,
            keys,
        }),
    }
}

/// Whether `write` stores a payload (a state, a step output, an error text, an event, a
/// cancellation or block reason).
fn carries_payload(write: &Write) -> bool {
    matches!(
        write,
        Write::Create { .. }
            | Write::Transition { .. }
            | Write::Step { .. }
            | Write::Failure { .. }
            | Write::Cancel { .. }
            | Write::Send { .. }
            | Write::Block { .. }
            | Write::Migrate { .. }
    )
}

impl Store for SealedStore {
    fn label(&self) -> String {
        self.inner.label()
    }

    fn as_any(&self) -> &dyn Any {
        self.inner.as_any()
    }

    fn write<'a>(&'a self, lease: Option<&'a Lease>, write: Write) -> BoxFuture<'a, Result<Reply>> {
        Box::pin(async move {
            let sealing = self
                .check_for(carries_payload(&write), write.run_id())
                .await?;
            let event = match &write {
                Write::Wait { event, .. } => event.clone(),
                _ => None,
            };
            let write = match write {
                // Not sealed (no codec, or a store in clear that this writer follows): the
                // write goes as it is (no copy, no decoding of its records), unless it
                // carries a payload sealed outside that no run here could open.
                write if sealing == Sealing::Clear => {
                    Payloads::refuse_sealed_from_outside(&write)?;
                    write
                }
                write
                    if sealing == Sealing::ArrivingSealedOnly
                        && carries_payload(&write)
                        && !Payloads::arrives_sealed(&write) =>
                {
                    let keys = self.inner.sealing_keys().await?;
                    return Err(Error::KeyNotInStore {
                        store: self.inner.label(),
                        key: self.payloads.key_id().unwrap_or_default(),
                        keys,
                    });
                }
                Write::Block {
                    run_id,
                    schema,
                    reason,
                    changes,
                    at_ms,
                } => Write::Block {
                    // Boxed: it holds a row across its read, and blocks are rare.
                    reason: Box::pin(self.seal_block(&run_id, schema, reason)).await?,
                    run_id,
                    schema,
                    changes,
                    at_ms,
                },
                other => self.payloads.seal_write(other)?,
            };
            let reply = self.inner.write(lease, write).await?;
            self.payloads.open_reply(reply, event.as_deref())
        })
    }

    fn run_info<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunInfo>>> {
        Box::pin(async move {
            self.check(false).await?;
            let mut info = self.inner.run_info(run_id).await?;
            if let Some(info) = &mut info {
                self.payloads.open_info(info)?;
            }
            Ok(info)
        })
    }

    fn latest<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<(RunInfo, TransitionRecord)>>> {
        Box::pin(async move {
            self.check(false).await?;
            let mut latest = self.inner.latest(run_id).await?;
            if let Some((info, record)) = &mut latest {
                self.payloads.open_info(info)?;
                self.payloads.open_transition(run_id, record)?;
            }
            Ok(latest)
        })
    }

    fn history<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<TransitionRecord>>> {
        Box::pin(async move {
            self.check(false).await?;
            let mut records = self.inner.history(run_id).await?;
            for record in &mut records {
                self.payloads.open_transition(run_id, record)?;
            }
            Ok(records)
        })
    }

    fn steps<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<Vec<(String, u32, StepRecord)>>> {
        Box::pin(async move {
            self.check(false).await?;
            let mut steps = self.inner.steps(run_id, seq).await?;
            for (name, occurrence, record) in &mut steps {
                self.payloads
                    .open_step(run_id, seq, name, *occurrence, record)?;
            }
            Ok(steps)
        })
    }

    fn all_steps<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<SeqStep>>> {
        Box::pin(async move {
            self.check(false).await?;
            let mut steps = self.inner.all_steps(run_id).await?;
            for (seq, name, occurrence, record) in &mut steps {
                self.payloads
                    .open_step(run_id, *seq, name, *occurrence, record)?;
            }
            Ok(steps)
        })
    }

    fn failures<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<(u64, FailureRecord)>>> {
        Box::pin(async move {
            self.check(false).await?;
            let mut failures = self.inner.failures(run_id).await?;
            for (seq, record) in &mut failures {
                self.payloads.open_failure(run_id, *seq, record)?;
            }
            Ok(failures)
        })
    }

    fn events<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(u64, EventRecord, bool)>>> {
        Box::pin(async move {
            self.check(false).await?;
            let mut events = self.inner.events(run_id).await?;
            for (_, record, _) in &mut events {
                self.payloads.open_event(run_id, record)?;
            }
            Ok(events)
        })
    }

    fn has_pending<'a>(&'a self, run_id: &'a str, event: &'a str) -> BoxFuture<'a, Result<bool>> {
        self.inner.has_pending(run_id, event)
    }

    fn children<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<RunInfo>>> {
        Box::pin(async move {
            self.check(false).await?;
            self.opened_rows(self.inner.children(run_id).await)
        })
    }

    fn list<'a>(
        &'a self,
        status: RunStatus,
        workflow: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<RunInfo>>> {
        Box::pin(async move {
            self.check(false).await?;
            self.opened_rows(self.inner.list(status, workflow).await)
        })
    }

    fn list_of_schemas<'a>(
        &'a self,
        status: RunStatus,
        workflow: &'a str,
        schemas: &'a [SchemaHash],
    ) -> BoxFuture<'a, Result<Vec<RunInfo>>> {
        Box::pin(async move {
            self.check(false).await?;
            self.opened_rows(self.inner.list_of_schemas(status, workflow, schemas).await)
        })
    }

    /// Counts carry no payload: as they are.
    fn count_runs(&self) -> BoxFuture<'_, Result<Vec<crate::store::RunCount>>> {
        self.inner.count_runs()
    }

    /// Attributes are plaintext in the store (they are meant to be searched): as they are.
    fn attributes<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<crate::Attributes>> {
        self.inner.attributes(run_id)
    }

    /// The rows found are opened; attributes are plaintext.
    fn search<'a>(
        &'a self,
        filter: &'a crate::RunFilter,
    ) -> BoxFuture<'a, Result<Vec<(RunInfo, crate::Attributes)>>> {
        Box::pin(async move {
            self.check(false).await?;
            let mut found = self.inner.search(filter).await?;
            for (info, _) in &mut found {
                self.payloads.open_info(info)?;
            }
            Ok(found)
        })
    }

    fn schema(&self, hash: SchemaHash) -> BoxFuture<'_, Result<Option<String>>> {
        self.inner.schema(hash)
    }

    fn schemas(&self) -> BoxFuture<'_, Result<Vec<(SchemaHash, String)>>> {
        self.inner.schemas()
    }

    fn sealing_keys(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        self.inner.sealing_keys()
    }

    fn sealing_checks(&self) -> BoxFuture<'_, Result<Vec<(String, String)>>> {
        self.inner.sealing_checks()
    }

    fn schedules(&self) -> BoxFuture<'_, Result<Vec<crate::ScheduleInfo>>> {
        // Schedules hold no payload: they pass as they are.
        self.inner.schedules()
    }

    fn acquire<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<Lease>>> {
        self.inner.acquire(run_id)
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        self.inner.release(lease)
    }

    fn renew<'a>(&'a self, leases: &'a [Lease]) -> BoxFuture<'a, Result<Vec<Lease>>> {
        self.inner.renew(leases)
    }

    fn lease_ttl(&self) -> Option<Duration> {
        self.inner.lease_ttl()
    }

    fn claim_ready<'a>(
        &'a self,
        workflows: &'a [ClaimFilter],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(RunInfo, Lease)>>> {
        Box::pin(async move {
            self.check(false).await?;
            let mut claimed = self.inner.claim_ready(workflows, limit).await?;
            for (info, _) in &mut claimed {
                // The leases are taken: a row whose texts do not open is returned as
                // stored, and its driver meets the error when it reads the run.
                if let Err(e) = self.payloads.open_info(info) {
                    tracing::warn!(run_id = %info.run_id, error = %e, "claimed a run whose row does not open");
                }
            }
            Ok(claimed)
        })
    }

    /// A parked run's listing carries no payload: as it is; the claimed rows are opened as
    /// [`claim_ready`](Store::claim_ready)'s.
    fn claim_ready_and_parked<'a>(
        &'a self,
        workflows: &'a [ClaimFilter],
        limit: usize,
    ) -> BoxFuture<'a, Result<crate::store::ReadyAndParked>> {
        Box::pin(async move {
            self.check(false).await?;
            let (mut claimed, parked) = self.inner.claim_ready_and_parked(workflows, limit).await?;
            for (info, _) in &mut claimed {
                if let Err(e) = self.payloads.open_info(info) {
                    tracing::warn!(run_id = %info.run_id, error = %e, "claimed a run whose row does not open");
                }
            }
            Ok((claimed, parked))
        })
    }

    fn shared_limits(&self) -> Option<Arc<dyn crate::store::SharedLimits>> {
        self.inner.shared_limits()
    }

    fn wakeups(&self) -> Option<crate::store::Wakeups> {
        self.inner.wakeups()
    }
}
