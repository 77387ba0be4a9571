//! Stores: where runs' records live, behind the [`Store`] trait.
//!
//! [`RedbStore`] is the embedded store: one redb file, owned by one process; its commit path
//! (group commit on a writer thread) is in [`redb`]. Other stores (PostgreSQL, for many
//! workers sharing runs) implement the same trait with the same semantics: the
//! [`protocol`]'s writes, leases that fence every write of a run's driver, and the reads the
//! runtime needs.
//!
//! What each write means is [`plan`], once for every store: a store reads the run's row and
//! the [`Facts`] the write [`Needs`], calls [`plan`], and writes the [`Effects`] out. When a
//! run needs a driver is [`RunInfo::readiness`].

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::attribute::{Attributes, RunFilter};
use crate::error::Result;
use crate::record::{FailureRecord, StepRecord, TransitionRecord};
pub use crate::row::{RunInfo, WaitInfo};
use crate::schema::SchemaHash;
pub use crate::status::RunStatus;

mod checks;
pub(crate) use checks::{SENDING_AN_EVENT, run_ended};
mod children;
mod effects;
mod evolve;
mod facts;
#[cfg(test)]
pub(crate) mod forwarding_tests;
mod limits;
mod plan;
#[cfg(test)]
mod plan_tests;
pub(crate) mod precheck;
pub(crate) mod protocol;
mod prune;
mod ready;
pub(crate) mod redb;
mod schedule_plan;
pub(crate) mod sealing;

pub use self::effects::{Effects, InboxChange, Record, RowWrite, ScheduleChange, event_record};
pub use self::facts::{
    AttemptFailures, CurrentLease, Facts, LeaseCheck, Needs, PendingEvent, RecordKey,
};
pub use self::limits::{SharedLimits, Take};
pub use self::plan::plan;
pub use self::protocol::{AfterFailure, EventRecord, Reply, WaitOutcome, Write};
pub use self::prune::{Pruned, prune, prune_reporting};
pub use self::ready::{ParkedRun, Readiness, Ready};
pub use self::redb::{
    Compacted, DEFAULT_CACHE_BYTES, RedbStore, STORE_FORMAT, StoreOptions, Upgraded,
};
pub use self::sealing::{
    KEY_SEARCH_RUNS, KeyRead, KeySearch, Payloads, check_keys, refuse_foreign_codec,
    seals_as_store_does,
};

/// A boxed, `Send` future: what [`Store`] methods return, so that `dyn Store` works.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The right to drive one run, held by one worker at a time. Every write the driver makes
/// carries it, and a store refuses the write ([`Error::Fenced`](crate::Error::Fenced)) unless
/// the lease is still the run's current one: a paused worker whose lease lapsed can never
/// commit after another took the run over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The run.
    pub run_id: String,
    /// The fencing token: unique per acquisition of the run.
    pub token: u64,
    /// When the lease lapses unless renewed, in ms since the Unix epoch; `None` for a store
    /// that only one process can open (its file lock is the lease).
    pub expires_ms: Option<u64>,
}

/// A step record with the seq of the state that recorded it, as
/// [`Store::all_steps`] answers it: `(seq, name, occurrence, record)`.
pub type SeqStep = (u64, String, u32, StepRecord);

/// Where runs' records live. Implemented by [`RedbStore`] (embedded, one process) and by the
/// PostgreSQL store (many workers); the runtime drives runs through `dyn Store`.
///
/// Every method returns a boxed future; stores that do blocking I/O keep it short or move it
/// off the async threads. Semantics every implementation must give:
/// - [`write`](Self::write) applies one [`Write`] atomically, with the meaning [`plan`] gives
///   it; with a lease, it is refused unless the lease is the run's current one;
/// - records are immutable; reads see every write whose future has completed;
/// - a lease is held by one worker at a time; [`acquire`](Self::acquire) returns `None` while
///   another worker holds a live lease on the run.
pub trait Store: Send + Sync + 'static {
    /// Names the store in errors and logs (a file path; a database URL without password).
    fn label(&self) -> String;

    /// The store as `Any`, to reach its own API (for example [`RedbStore::compact`]).
    fn as_any(&self) -> &dyn Any;

    /// Applies `write` atomically (possibly in one commit with concurrent writes) and returns
    /// the store's reply, after the commit is durable.
    fn write<'a>(&'a self, lease: Option<&'a Lease>, write: Write) -> BoxFuture<'a, Result<Reply>>;

    /// The run's row, or `None`.
    fn run_info<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunInfo>>>;

    /// The run's row and its latest transition record, in time independent of the history.
    fn latest<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<(RunInfo, TransitionRecord)>>>;

    /// Every transition record of the run, by sequence number.
    fn history<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<TransitionRecord>>>;

    /// The step records of the run's state at `seq`, as `(name, occurrence, record)`.
    fn steps<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<Vec<(String, u32, StepRecord)>>>;

    /// The step records of every state of the run, as `(seq, name, occurrence, record)`, by
    /// seq, then name and occurrence (empty for an unknown run): what
    /// [`steps`](Self::steps) answers for each seq, in one read, for a run's whole history
    /// (the CLI's `history`, the control endpoint, the UI).
    ///
    /// By default [`history`](Self::history), then [`steps`](Self::steps) for each of its
    /// seqs; a store whose reads of one seq cost a pass over the run's records answers in
    /// one pass instead.
    fn all_steps<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<SeqStep>>> {
        Box::pin(async move {
            let mut all = Vec::new();
            let mut seqs: Vec<u64> = self.history(run_id).await?.iter().map(|r| r.seq).collect();
            seqs.dedup();
            for seq in seqs {
                for (name, occurrence, record) in self.steps(run_id, seq).await? {
                    all.push((seq, name, occurrence, record));
                }
            }
            Ok(all)
        })
    }

    /// Every failed attempt of the run, as `(seq, record)`.
    fn failures<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<(u64, FailureRecord)>>>;

    /// Every event sent to the run, as `(event seq, record, delivered)`.
    fn events<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(u64, EventRecord, bool)>>>;

    /// Whether an event named `event` waits undelivered in the run's inbox.
    fn has_pending<'a>(&'a self, run_id: &'a str, event: &'a str) -> BoxFuture<'a, Result<bool>>;

    /// The rows of the run's children (runs its handler started with
    /// [`Context::start_child`](crate::Context::start_child)), any status, by run id.
    fn children<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<RunInfo>>>;

    /// The runs with `status` (optionally of one workflow), from the status index.
    fn list<'a>(
        &'a self,
        status: RunStatus,
        workflow: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<RunInfo>>>;

    /// The runs with `status` of `workflow` whose row's schema is one of `schemas`, by run id:
    /// what [`list`](Self::list) returns for the workflow, narrowed to those schemas (a
    /// runtime lists the waiting runs of the older versions it accepts or migrates, at its
    /// start and when one is registered, without reading the runs of its own version). The
    /// default does just that; a store with an index by schema (PostgreSQL's) overrides it so
    /// that the cost grows with the runs returned, not with the workflow's runs.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    fn list_of_schemas<'a>(
        &'a self,
        status: RunStatus,
        workflow: &'a str,
        schemas: &'a [SchemaHash],
    ) -> BoxFuture<'a, Result<Vec<RunInfo>>> {
        Box::pin(async move {
            if schemas.is_empty() {
                return Ok(Vec::new());
            }
            let mut runs = self.list(status, Some(workflow)).await?;
            runs.retain(|info| schemas.contains(&info.schema));
            Ok(runs)
        })
    }

    /// How many runs the store holds, by workflow and status (only the pairs with runs), by
    /// workflow then status: from the status index, without reading any run's row (what the
    /// gauge [`loops_runs`](crate::metrics::RUNS) is refreshed from).
    fn count_runs(&self) -> BoxFuture<'_, Result<Vec<RunCount>>>;

    /// The run's attributes (empty if it has none or does not exist).
    fn attributes<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Attributes>>;

    /// The runs that `filter` selects, with their attributes, by run id. The candidates come
    /// from the store's attribute index, by the filter's first attribute filter
    /// ([`RunFilter::driving`]): the cost grows with the runs that match it, not with the
    /// store. Each candidate is kept if [`RunFilter::matches`] accepts it. A filter with no
    /// attribute filter selects nothing here: [`find_runs`] lists those by status.
    fn search<'a>(
        &'a self,
        filter: &'a RunFilter,
    ) -> BoxFuture<'a, Result<Vec<(RunInfo, Attributes)>>>;

    /// The schema description stored for `hash`.
    fn schema(&self, hash: SchemaHash) -> BoxFuture<'_, Result<Option<String>>>;

    /// Every stored schema description, as `(hash, description)`, by hash.
    fn schemas(&self) -> BoxFuture<'_, Result<Vec<(SchemaHash, String)>>>;

    /// Takes the lease of the run for this worker; `None` if another worker holds a live
    /// lease on it.
    fn acquire<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<Lease>>>;

    /// Gives the lease back (the run may be taken by any worker at once).
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>>;

    /// Extends `leases`; returns those renewed, with their new expiry. A lease missing from
    /// the answer was lost (it lapsed and another worker may hold the run).
    fn renew<'a>(&'a self, leases: &'a [Lease]) -> BoxFuture<'a, Result<Vec<Lease>>>;

    /// How long a lease lasts without renewal; `None` if leases never lapse.
    fn lease_ttl(&self) -> Option<Duration>;

    /// Runs of `workflows` that need a driver ([`RunInfo::readiness`]) and that no worker
    /// holds: running runs, and waiting runs whose wait is over or whose cancellation was
    /// asked for. Each comes with a lease for this worker (at most
    /// `limit`). A store with no other workers returns every such run.
    ///
    /// Each [`ClaimFilter`] names a workflow and, optionally, the schema hashes of its runs
    /// that the worker can route: a store shared by several workers returns no run of
    /// another schema that a live worker can route (so that a worker built without a version
    /// never claims, nor logs about, that version's runs during a rolling deploy). It counts
    /// each call (`limit` 0 included) as the caller's sign of life for the schemas it
    /// routes, and returns a ready run that no live worker can route to a worker that has
    /// been live for a lease time itself, which blocks it, once (`Write::Block`): the rule
    /// and its window are the store's to document (docs/postgres.md). A store only one
    /// process opens may ignore the schemas: its one worker takes every run, and blocks
    /// those it cannot route.
    fn claim_ready<'a>(
        &'a self,
        workflows: &'a [ClaimFilter],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(RunInfo, Lease)>>>;

    /// What [`Runtime::resume_all`](crate::Runtime::resume_all) reads from a store only
    /// this process opens ([`lease_ttl`](Self::lease_ttl) `None`): every
    /// [waiting](RunStatus::Waiting) run of `workflows`, lean ([`ParkedRun`], by workflow
    /// then run id, the ready ones included), and [`claim_ready`](Self::claim_ready)'s
    /// answer. Every read comes before any lease is taken. The default calls
    /// [`list`](Self::list), then `claim_ready`; a store that can read each waiting row once
    /// for both does (the redb store: a million parked runs are one pass over their rows,
    /// decoded one at a time).
    fn claim_ready_and_parked<'a>(
        &'a self,
        workflows: &'a [ClaimFilter],
        limit: usize,
    ) -> BoxFuture<'a, Result<ReadyAndParked>> {
        Box::pin(async move {
            let mut parked = Vec::new();
            for filter in workflows {
                let workflow: Arc<str> = Arc::from(filter.workflow.as_str());
                let runs = self
                    .list(RunStatus::Waiting, Some(&filter.workflow))
                    .await?;
                parked.extend(
                    runs.iter()
                        .map(|info| ParkedRun::of(Arc::clone(&workflow), info)),
                );
            }
            Ok((self.claim_ready(workflows, limit).await?, parked))
        })
    }

    /// The ids of the keys that sealed payloads in this store ([`Write::Seal`]), oldest first
    /// (by the time each was first recorded, then by id); empty for a store whose payloads
    /// are in clear. A runtime without a codec refuses a store that lists any
    /// ([`Error::Encrypted`](crate::Error::Encrypted)).
    fn sealing_keys(&self) -> BoxFuture<'_, Result<Vec<String>>>;

    /// The check values recorded with the [sealing keys](Self::sealing_keys), `(key id,
    /// check)` ([`PayloadCodec::key_check`](crate::PayloadCodec::key_check)): a runtime or
    /// CLI whose key of a listed id gives another check holds other bytes under that id, and
    /// is refused ([`Error::KeyMismatch`](crate::Error::KeyMismatch)). Empty for a store that
    /// records none (the default).
    fn sealing_checks(&self) -> BoxFuture<'_, Result<Vec<(String, String)>>> {
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// Every schedule stored ([`Write::PutSchedule`]), by name; empty for a store that has
    /// none (and for a file written before loops had schedules).
    ///
    /// # Errors
    /// [`Error::Storage`](crate::Error::Storage) or [`Error::Database`](crate::Error::Database)
    /// on a read error; [`Error::InvalidSchedule`](crate::Error::InvalidSchedule) for a
    /// stored row loops did not write.
    fn schedules(&self) -> BoxFuture<'_, Result<Vec<crate::ScheduleInfo>>>;

    /// The named limits this store counts for all the workers that share it, or `None` (the
    /// default): the runtime then counts its limits in the process, which is all a store
    /// that one process opens needs.
    fn shared_limits(&self) -> Option<Arc<dyn SharedLimits>> {
        None
    }

    /// A signal that another worker's write made a run need a driver (a write whose
    /// [`Effects::wakes`] is set), or `None` (the default): a store only one process opens
    /// wakes its drivers itself, and a shared store without one is polled. Each change of
    /// the value (a count, which only says that something happened: compare nothing but
    /// `changed`) asks [`Runtime::serve`](crate::Runtime::serve) to claim ready runs at
    /// once rather than at its next poll; several wake-ups before it looks count as one.
    /// The store may also change it when it cannot know what it missed (its listening
    /// connection came back). Each call returns a receiver of its own.
    fn wakeups(&self) -> Option<Wakeups> {
        None
    }
}

/// How many runs of a workflow have a status: one entry of [`Store::count_runs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCount {
    /// The workflow.
    pub workflow: String,
    /// The status.
    pub status: RunStatus,
    /// The number of runs of `workflow` with `status` (at least 1).
    pub runs: u64,
}

/// What [`Store::wakeups`] returns: a receiver whose value changes when runs may need a
/// driver.
pub type Wakeups = tokio::sync::watch::Receiver<u64>;

/// [`Store::claim_ready_and_parked`]'s answer: the ready runs claimed, with their leases,
/// and the waiting runs, lean.
pub type ReadyAndParked = (Vec<(RunInfo, Lease)>, Vec<ParkedRun>);

/// Which runs of a workflow a worker claims: what [`Store::claim_ready`] is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimFilter {
    /// The workflow's name.
    pub workflow: String,
    /// The schema hashes of its runs that the worker can route (the versions it compiles,
    /// the schemas they accept, and those it has migrations from); `None`: every schema.
    pub schemas: Option<Vec<SchemaHash>>,
}

impl ClaimFilter {
    /// Every run of `workflow`, whatever its schema.
    pub fn any(workflow: impl Into<String>) -> ClaimFilter {
        ClaimFilter {
            workflow: workflow.into(),
            schemas: None,
        }
    }

    /// Whether a run of schema `schema` passes the filter.
    pub fn admits(&self, schema: SchemaHash) -> bool {
        self.schemas.as_ref().is_none_or(|s| s.contains(&schema))
    }
}

/// The runs that `filter` selects, with their attributes, by run id: through the store's
/// attribute index ([`Store::search`]) when the filter has an attribute filter; otherwise
/// from the status index (every status the filter names, or all), each run's attributes
/// read one by one.
///
/// # Errors
/// As the store's reads fail ([`Error::Storage`](crate::Error::Storage),
/// [`Error::Database`](crate::Error::Database), [`Error::Decode`](crate::Error::Decode)).
pub async fn find_runs(
    store: &dyn Store,
    filter: &RunFilter,
) -> Result<Vec<(RunInfo, Attributes)>> {
    if filter.driving().is_some() {
        return store.search(filter).await;
    }
    let statuses = if filter.statuses.is_empty() {
        RunStatus::ALL.to_vec()
    } else {
        filter.statuses.clone()
    };
    let mut out = Vec::new();
    for status in statuses {
        for info in store.list(status, filter.workflow.as_deref()).await? {
            let attributes = store.attributes(&info.run_id).await?;
            if filter.matches(&info, &attributes) {
                out.push((info, attributes));
            }
        }
    }
    out.sort_by(|a, b| a.0.run_id.cmp(&b.0.run_id));
    out.dedup_by(|a, b| a.0.run_id == b.0.run_id);
    Ok(out)
}
