//! A store in front of another that sees every write and every other call: it logs the
//! writes, and a hook may fail one or stop the store at one, as a crash would, fail a read,
//! and see what claims and lease renewals return.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::record::{FailureRecord, FailureSource, StepRecord, TransitionRecord};
use crate::schema::SchemaHash;
use crate::store::{
    BoxFuture, ClaimFilter, EventRecord, Lease, Reply, RunInfo, RunStatus, SeqStep, Store, Write,
};

/// One write a [`HookedStore`] was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteSeen {
    /// Its place among the writes the store was given, from 1.
    pub n: u64,
    /// Its kind ([`Write::kind`]: `"Transition"`, `"Step"`, ...).
    pub kind: &'static str,
    /// The run it is for (`None` for a prune).
    pub run_id: Option<String>,
    /// What it records, in words (`transition to `Planned` (seq 1)`, `step `plan` #0 of
    /// seq 0`, ...).
    pub what: String,
    /// For a step record, a step's failed try (its failure record), and a wait that records
    /// its outcome as a step (a wait for an event: `loops:wait:NAME`): `(seq, name,
    /// occurrence)`.
    pub step: Option<(u64, String, u32)>,
}

impl WriteSeen {
    fn of(n: u64, write: &Write) -> WriteSeen {
        let step = match write {
            Write::Step {
                seq,
                name,
                occurrence,
                ..
            } => Some((*seq, name.clone(), *occurrence)),
            Write::Wait {
                seq,
                step: Some((name, occurrence)),
                ..
            } => Some((*seq, name.clone(), *occurrence)),
            Write::Failure { seq, record, .. } => match &record.source {
                FailureSource::Step { name, occurrence } => Some((*seq, name.clone(), *occurrence)),
                _ => None,
            },
            _ => None,
        };
        WriteSeen {
            n,
            kind: write.kind(),
            run_id: write.run_id().map(str::to_owned),
            what: describe(write),
            step,
        }
    }
}

/// `write` in words, for logs and reports.
fn describe(write: &Write) -> String {
    match write {
        Write::Create { info, .. } => format!("creation of the run in `{}` (seq 0)", info.state),
        Write::Transition { state, seq, .. } => format!("transition to `{state}` (seq {seq})"),
        Write::Step {
            seq,
            name,
            occurrence,
            ..
        } => format!("record of step `{name}` #{occurrence} of seq {seq}"),
        Write::Failure { seq, record, .. } => match &record.source {
            FailureSource::Step { name, occurrence } => format!(
                "failed try of step `{name}` #{occurrence} in attempt {} at seq {seq}",
                record.attempt
            ),
            _ => format!("failure of attempt {} at seq {seq}", record.attempt),
        },
        Write::BeginAttempt { seq, .. } => format!("new attempt at seq {seq}"),
        Write::Wait {
            seq,
            event,
            until_ms,
            ..
        } => match (event, until_ms) {
            (Some(event), Some(until)) => {
                format!("wait at seq {seq} for event `{event}` until {until} ms")
            }
            (Some(event), None) => format!("wait at seq {seq} for event `{event}`"),
            (None, Some(until)) => format!("sleep at seq {seq} until {until} ms"),
            (None, None) => format!("wait at seq {seq}"),
        },
        Write::Send { name, .. } => format!("event `{name}` sent"),
        Write::Wake { seq, .. } => format!("wake-up at seq {seq}"),
        Write::Migrate { seq, .. } => format!("migration of seq {seq}"),
        Write::SetAttributes {
            seq, attributes, ..
        } => format!("{} attribute(s) set at seq {seq}", attributes.len()),
        other => other.kind().to_owned(),
    }
}

/// What a [`WriteHook`] decides about one write.
#[derive(Debug)]
#[non_exhaustive]
pub enum Verdict {
    /// Let it through (before), or answer it (after).
    Go,
    /// Let it through (before), or answer it (after), once this time has passed (tokio's
    /// clock): a slow store, or writes of concurrent steps that reach it in another order.
    Delay(Duration),
    /// Answer it with this error instead: before, the write is not made; after, it was
    /// committed all the same (a lost answer).
    Fail(Error),
    /// Stop the store here, as a crash would: this write (before: not committed; after:
    /// committed) and every later write and read never answer. See [`HookedStore::stopped`].
    Stop,
}

/// A call to a [`HookedStore`] other than a write, as its [`WriteHook`] sees it: the
/// [`Store`] method and its arguments.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Call<'a> {
    /// A read of one run: `method` is the [`Store`] method (`"run_info"`, `"latest"`,
    /// `"history"`, `"steps"`, `"all_steps"`, `"failures"`, `"events"`, `"has_pending"`,
    /// `"attributes"` or `"children"`).
    Read {
        /// The method.
        method: &'static str,
        /// The run read.
        run_id: &'a str,
    },
    /// [`Store::list`]: the runs with `status` (of `workflow`, if given).
    List {
        /// The status listed.
        status: RunStatus,
        /// The workflow the list is limited to.
        workflow: Option<&'a str>,
    },
    /// [`Store::list_of_schemas`]: the runs with `status` of `workflow` whose schema is one
    /// of `schemas`.
    ListOfSchemas {
        /// The status listed.
        status: RunStatus,
        /// The workflow listed.
        workflow: &'a str,
        /// The schemas the list is limited to.
        schemas: &'a [SchemaHash],
    },
    /// [`Store::count_runs`]: how many runs by workflow and status.
    CountRuns,
    /// [`Store::search`]: the runs `filter` selects, with their attributes.
    Search {
        /// The filter searched by.
        filter: &'a crate::RunFilter,
    },
    /// [`Store::schema`] (`Some`) or [`Store::schemas`] (`None`).
    Schema(Option<SchemaHash>),
    /// [`Store::sealing_keys`]: the key ids the store's payloads are sealed with.
    SealingKeys,
    /// [`Store::schedules`]: every stored schedule.
    Schedules,
    /// [`Store::acquire`] of the run's lease.
    Acquire {
        /// The run.
        run_id: &'a str,
    },
    /// [`Store::release`] of a lease.
    Release(&'a Lease),
    /// [`Store::renew`] of leases; [`WriteHook::renewed`] sees the answer.
    Renew(&'a [Lease]),
    /// [`Store::claim_ready`] of at most `limit` runs; [`WriteHook::claimed`] sees the answer.
    ClaimReady {
        /// The workflows and schemas claimed.
        workflows: &'a [ClaimFilter],
        /// The most runs to claim.
        limit: usize,
    },
    /// [`Store::claim_ready_and_parked`]: every waiting run of `workflows`, lean, and
    /// [`Store::claim_ready`]'s answer (which [`WriteHook::claimed`] sees).
    ClaimReadyAndParked {
        /// The workflows listed and claimed.
        workflows: &'a [ClaimFilter],
        /// The most runs to claim.
        limit: usize,
    },
}

/// Decides, write by write and call by call, what a [`HookedStore`] does, and sees what
/// claims and renewals return. The methods that decide default to [`Verdict::Go`], the
/// others to doing nothing.
pub trait WriteHook: Send + Sync + 'static {
    /// Before `seen` goes to the inner store.
    fn before(&self, seen: &WriteSeen) -> Verdict {
        let _ = seen;
        Verdict::Go
    }

    /// After the inner store answered `seen` with `reply`.
    fn after(&self, seen: &WriteSeen, reply: &Result<Reply>) -> Verdict {
        let _ = (seen, reply);
        Verdict::Go
    }

    /// Before `call` (any call but a write, [`Store::lease_ttl`] and
    /// [`Store::shared_limits`]) goes to the inner store: [`Verdict::Fail`] answers it with
    /// the error instead, [`Verdict::Delay`] makes it later, [`Verdict::Stop`] stops the
    /// store.
    fn call(&self, call: &Call<'_>) -> Verdict {
        let _ = call;
        Verdict::Go
    }

    /// After [`Store::renew`] of `asked` answered `reply` (the leases it extended).
    fn renewed(&self, asked: &[Lease], reply: &Result<Vec<Lease>>) {
        let _ = (asked, reply);
    }

    /// After [`Store::claim_ready`] answered `reply` (the runs it claimed).
    fn claimed(&self, reply: &Result<Vec<(RunInfo, Lease)>>) {
        let _ = reply;
    }
}

/// A hook that lets every write through.
struct PassThrough;

impl WriteHook for PassThrough {}

/// Another store, `S`, behind a hook that sees every write: [`writes`](Self::writes) logs
/// them in order, and the hook ([`WriteHook`]) may fail a write or stop the store at one
/// ([`Verdict::Stop`]), which is how the crash explorer stops a run at a boundary. Every
/// other call is put to the hook too ([`WriteHook::call`]), then goes to `S` unchanged
/// (until the store is stopped); [`Store::as_any`] is `S`'s, so that
/// [`Runtime::redb`](crate::Runtime::redb) reaches a redb store behind it. Clones share the
/// log, the hook and the stop.
pub struct HookedStore<S> {
    inner: S,
    hook: Arc<dyn WriteHook>,
    log: Arc<Mutex<Vec<WriteSeen>>>,
    count: Arc<AtomicU64>,
    stopped: Arc<AtomicBool>,
    stop: Arc<tokio::sync::Notify>,
}

impl<S: Clone> Clone for HookedStore<S> {
    fn clone(&self) -> Self {
        HookedStore {
            inner: self.inner.clone(),
            hook: Arc::clone(&self.hook),
            log: Arc::clone(&self.log),
            count: Arc::clone(&self.count),
            stopped: Arc::clone(&self.stopped),
            stop: Arc::clone(&self.stop),
        }
    }
}

impl<S: Store> HookedStore<S> {
    /// `inner`, with every write logged and let through.
    pub fn new(inner: S) -> Self {
        HookedStore::with_hook(inner, PassThrough)
    }

    /// `inner`, with every write logged and put to `hook`.
    pub fn with_hook(inner: S, hook: impl WriteHook) -> Self {
        HookedStore {
            inner,
            hook: Arc::new(hook),
            log: Arc::default(),
            count: Arc::default(),
            stopped: Arc::default(),
            stop: Arc::default(),
        }
    }

    /// The inner store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Every write the store was given, in order (those a hook failed or stopped too).
    pub fn writes(&self) -> Vec<WriteSeen> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Forgets the writes logged so far ([`writes`](Self::writes)); the count goes on.
    pub fn clear_writes(&self) {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The kinds of the writes given for `run_id`, in order (`["Create", "Step", ...]`).
    pub fn kinds_of(&self, run_id: &str) -> Vec<&'static str> {
        self.writes()
            .into_iter()
            .filter(|w| w.run_id.as_deref() == Some(run_id))
            .map(|w| w.kind)
            .collect()
    }

    /// How many writes the store was given.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Whether a hook stopped the store ([`Verdict::Stop`]).
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Returns once a hook stopped the store.
    pub async fn until_stopped(&self) {
        loop {
            let notified = self.stop.notified();
            if self.stopped() {
                return;
            }
            notified.await;
        }
    }

    fn halt(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.stop.notify_waiters();
    }

    /// `fut`, the inner store's answer to `call`, unless the store is stopped (then never)
    /// or the hook says otherwise.
    fn gate<'a, T: Send + 'a>(
        &'a self,
        call: Call<'_>,
        fut: BoxFuture<'a, Result<T>>,
    ) -> BoxFuture<'a, Result<T>> {
        if self.stopped() {
            return Box::pin(std::future::pending());
        }
        match self.hook.call(&call) {
            Verdict::Go => fut,
            Verdict::Delay(pause) => Box::pin(async move {
                tokio::time::sleep(pause).await;
                fut.await
            }),
            Verdict::Fail(e) => Box::pin(std::future::ready(Err(e))),
            Verdict::Stop => {
                self.halt();
                Box::pin(std::future::pending())
            }
        }
    }

    /// [`gate`](Self::gate) for a read of one run.
    fn read<'a, T: Send + 'a>(
        &'a self,
        method: &'static str,
        run_id: &str,
        fut: BoxFuture<'a, Result<T>>,
    ) -> BoxFuture<'a, Result<T>> {
        self.gate(Call::Read { method, run_id }, fut)
    }
}

impl<S: Store> Store for HookedStore<S> {
    fn label(&self) -> String {
        self.inner.label()
    }

    fn as_any(&self) -> &dyn Any {
        // The store behind, as SealedStore does: `Runtime::redb` and `compact` reach it.
        self.inner.as_any()
    }

    fn write<'a>(&'a self, lease: Option<&'a Lease>, write: Write) -> BoxFuture<'a, Result<Reply>> {
        Box::pin(async move {
            if self.stopped() {
                return std::future::pending().await;
            }
            let n = self.count.fetch_add(1, Ordering::SeqCst).saturating_add(1);
            let seen = WriteSeen::of(n, &write);
            self.log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(seen.clone());
            match self.hook.before(&seen) {
                Verdict::Go => {}
                Verdict::Delay(pause) => tokio::time::sleep(pause).await,
                Verdict::Fail(e) => return Err(e),
                Verdict::Stop => {
                    self.halt();
                    return std::future::pending().await;
                }
            }
            let reply = self.inner.write(lease, write).await;
            match self.hook.after(&seen, &reply) {
                Verdict::Go => reply,
                Verdict::Delay(pause) => {
                    tokio::time::sleep(pause).await;
                    reply
                }
                Verdict::Fail(e) => Err(e),
                Verdict::Stop => {
                    self.halt();
                    std::future::pending().await
                }
            }
        })
    }

    fn run_info<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunInfo>>> {
        self.read("run_info", run_id, self.inner.run_info(run_id))
    }

    fn latest<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<(RunInfo, TransitionRecord)>>> {
        self.read("latest", run_id, self.inner.latest(run_id))
    }

    fn history<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<TransitionRecord>>> {
        self.read("history", run_id, self.inner.history(run_id))
    }

    fn steps<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<Vec<(String, u32, StepRecord)>>> {
        self.read("steps", run_id, self.inner.steps(run_id, seq))
    }

    fn all_steps<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<SeqStep>>> {
        self.read("all_steps", run_id, self.inner.all_steps(run_id))
    }

    fn failures<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<(u64, FailureRecord)>>> {
        self.read("failures", run_id, self.inner.failures(run_id))
    }

    fn events<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(u64, EventRecord, bool)>>> {
        self.read("events", run_id, self.inner.events(run_id))
    }

    fn has_pending<'a>(&'a self, run_id: &'a str, event: &'a str) -> BoxFuture<'a, Result<bool>> {
        self.read("has_pending", run_id, self.inner.has_pending(run_id, event))
    }

    fn children<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<RunInfo>>> {
        self.read("children", run_id, self.inner.children(run_id))
    }

    fn list<'a>(
        &'a self,
        status: RunStatus,
        workflow: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<RunInfo>>> {
        self.gate(
            Call::List { status, workflow },
            self.inner.list(status, workflow),
        )
    }

    fn list_of_schemas<'a>(
        &'a self,
        status: RunStatus,
        workflow: &'a str,
        schemas: &'a [SchemaHash],
    ) -> BoxFuture<'a, Result<Vec<RunInfo>>> {
        self.gate(
            Call::ListOfSchemas {
                status,
                workflow,
                schemas,
            },
            self.inner.list_of_schemas(status, workflow, schemas),
        )
    }

    fn count_runs(&self) -> BoxFuture<'_, Result<Vec<crate::store::RunCount>>> {
        self.gate(Call::CountRuns, self.inner.count_runs())
    }

    fn attributes<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<crate::Attributes>> {
        self.read("attributes", run_id, self.inner.attributes(run_id))
    }

    fn search<'a>(
        &'a self,
        filter: &'a crate::RunFilter,
    ) -> BoxFuture<'a, Result<Vec<(RunInfo, crate::Attributes)>>> {
        self.gate(Call::Search { filter }, self.inner.search(filter))
    }

    fn schema(&self, hash: SchemaHash) -> BoxFuture<'_, Result<Option<String>>> {
        self.gate(Call::Schema(Some(hash)), self.inner.schema(hash))
    }

    fn schemas(&self) -> BoxFuture<'_, Result<Vec<(SchemaHash, String)>>> {
        self.gate(Call::Schema(None), self.inner.schemas())
    }

    fn sealing_keys(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        self.gate(Call::SealingKeys, self.inner.sealing_keys())
    }

    fn sealing_checks(&self) -> BoxFuture<'_, Result<Vec<(String, String)>>> {
        self.inner.sealing_checks()
    }

    fn schedules(&self) -> BoxFuture<'_, Result<Vec<crate::ScheduleInfo>>> {
        self.gate(Call::Schedules, self.inner.schedules())
    }

    fn acquire<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<Lease>>> {
        self.gate(Call::Acquire { run_id }, self.inner.acquire(run_id))
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        self.gate(Call::Release(lease), self.inner.release(lease))
    }

    fn renew<'a>(&'a self, leases: &'a [Lease]) -> BoxFuture<'a, Result<Vec<Lease>>> {
        let renew = Box::pin(async move {
            let reply = self.inner.renew(leases).await;
            self.hook.renewed(leases, &reply);
            reply
        });
        self.gate(Call::Renew(leases), renew)
    }

    fn lease_ttl(&self) -> Option<Duration> {
        self.inner.lease_ttl()
    }

    fn claim_ready<'a>(
        &'a self,
        workflows: &'a [ClaimFilter],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(RunInfo, Lease)>>> {
        let claim = Box::pin(async move {
            let reply = self.inner.claim_ready(workflows, limit).await;
            self.hook.claimed(&reply);
            reply
        });
        self.gate(Call::ClaimReady { workflows, limit }, claim)
    }

    fn claim_ready_and_parked<'a>(
        &'a self,
        workflows: &'a [ClaimFilter],
        limit: usize,
    ) -> BoxFuture<'a, Result<crate::store::ReadyAndParked>> {
        let claim = Box::pin(async move {
            let reply = self.inner.claim_ready_and_parked(workflows, limit).await;
            let (claimed, parked) = match reply {
                Ok((claimed, parked)) => (Ok(claimed), parked),
                Err(e) => (Err(e), Vec::new()),
            };
            self.hook.claimed(&claimed);
            claimed.map(|claimed| (claimed, parked))
        });
        self.gate(Call::ClaimReadyAndParked { workflows, limit }, claim)
    }

    fn shared_limits(&self) -> Option<std::sync::Arc<dyn crate::store::SharedLimits>> {
        self.inner.shared_limits()
    }

    fn wakeups(&self) -> Option<crate::store::Wakeups> {
        self.inner.wakeups()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::HookedStore;
    use crate::store::forwarding_tests::assert_forwards;

    #[tokio::test]
    async fn the_hooked_store_forwards_every_method() {
        assert_forwards("HookedStore", |probe| Arc::new(HookedStore::new(probe))).await;
    }
}
