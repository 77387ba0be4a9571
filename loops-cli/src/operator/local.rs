//! [`Local`]: the store opened by this process.

use std::cell::{Ref, RefCell};
use std::path::PathBuf;
use std::pin::Pin;

use loops_core::{
    Compacted, EventRecord, FailureRecord, Pruned, RedbStore, RetentionPolicy, RunInfo, RunStatus,
    Runtime, ScheduleStatus, SchemaHash, Sent, StepRecord, Store, TransitionRecord, now_ms,
};
use serde_json::value::RawValue;

use super::{Operator, Taker, core_failure};
use crate::failure::{Failure, Result};

/// A write on a runtime, run on this operator's tokio runtime (so it need not be `Send`).
type Op<'a, T> = Pin<Box<dyn Future<Output = loops_core::Result<T>> + 'a>>;

/// The store, opened by this process: reads go to the store, writes through a runtime on
/// it (the same commit path as the workflow's process).
pub struct Local {
    label: String,
    reached: String,
    /// Every async call of this operator runs here: a PostgreSQL pool's connections belong
    /// to the runtime they were made on.
    tokio: tokio::runtime::Runtime,
    /// Borrowed for each operation; replaced once, when a [`Opened::Deferred`] file opens
    /// for writing.
    opened: RefCell<Opened>,
}

enum Opened {
    /// A redb file opened read-only (no runtime: nothing can be written).
    ReadOnly(RedbStore),
    /// A redb file opened read-only for a command that writes, with a runtime on it: a
    /// write that its store refuses (a cancellation of an ended run, say) is refused there,
    /// and the file is opened for writing ([`crate::open::writable`]) only for a write that
    /// changes it. A writable open rewrites part of the file when it closes (redb records
    /// its allocator's state), so a refused command leaves the file's bytes as they were.
    Deferred { runtime: Runtime, path: PathBuf },
    /// A runtime on the store (a writable redb file, or PostgreSQL).
    Runtime(Runtime),
    /// Between a deferred runtime's shutdown and the writable open that replaces it (which
    /// failed, if this is seen).
    Closed,
}

impl Opened {
    /// The store as it holds payloads (sealed ones as stored: [`Unsealing`](super::Unsealing)
    /// opens them, as it does what a control endpoint serves).
    /// `None` once [`Closed`](Opened::Closed).
    fn store(&self) -> Option<&dyn Store> {
        match self {
            Opened::ReadOnly(store) => Some(store),
            Opened::Deferred { runtime, .. } | Opened::Runtime(runtime) => {
                Some(runtime.sealed_store())
            }
            Opened::Closed => None,
        }
    }
}

impl Local {
    /// A redb file opened read-only.
    pub fn read_only(store: RedbStore, tokio: tokio::runtime::Runtime) -> Local {
        Local {
            label: Store::label(&store),
            reached: "read the store file directly (no process holds it)".to_owned(),
            tokio,
            opened: RefCell::new(Opened::ReadOnly(store)),
        }
    }

    /// A runtime on a store; `reached` says how, for `--verbose`.
    pub fn runtime(
        runtime: Runtime,
        label: String,
        reached: String,
        tokio: tokio::runtime::Runtime,
    ) -> Local {
        Local {
            label,
            reached,
            tokio,
            opened: RefCell::new(Opened::Runtime(runtime)),
        }
    }

    /// The redb file at `path`, opened read-only as `runtime`'s store, for a command that
    /// writes: the file opens for writing at the first write that changes it (see
    /// [`Opened::Deferred`]).
    pub fn deferred(
        runtime: Runtime,
        path: PathBuf,
        reached: String,
        tokio: tokio::runtime::Runtime,
    ) -> Local {
        Local {
            label: path.display().to_string(),
            reached,
            tokio,
            opened: RefCell::new(Opened::Deferred { runtime, path }),
        }
    }

    /// The store as it holds payloads ([`Opened::store`]), borrowed for one operation.
    ///
    /// # Errors
    /// If a deferred file failed to open for writing: this operator has no store any more.
    fn store(&self) -> Result<Ref<'_, dyn Store>> {
        Ref::filter_map(self.opened.borrow(), Opened::store).map_err(|_| self.closed())
    }

    /// The failure of an operation after a deferred file failed to open for writing.
    fn closed(&self) -> Failure {
        Failure::new(format!(
            "store {} did not open for writing: it was closed",
            self.label
        ))
    }

    /// Runs the write `op` on the runtime: on a [deferred](Opened::Deferred) file, first on
    /// the file as it is, opened read-only, whose answer stands unless the write would
    /// change the file ([`loops_core::Error::ReadOnly`]); then on the file opened for
    /// writing. `what` names the operation, for a store opened read-only.
    fn write<'a, T>(&self, what: &str, op: impl Fn(Runtime) -> Op<'a, T>) -> Result<T> {
        // A clone of the runtime (a handle), so that no borrow is held across the writable
        // open; the operation's future owns it and drops it when it ends.
        let (runtime, deferred) = match &*self.opened.borrow() {
            Opened::Runtime(runtime) => (runtime.clone(), false),
            Opened::Deferred { runtime, .. } => (runtime.clone(), true),
            Opened::ReadOnly(_) | Opened::Closed => {
                return Err(Failure::new(format!(
                    "cannot {what}: store {} was opened read-only",
                    self.label
                )));
            }
        };
        if !deferred {
            return self.wait(op(runtime));
        }
        match self.tokio.block_on(op(runtime)) {
            // The write would change the file: open it for writing, and write.
            Err(loops_core::Error::ReadOnly { .. }) => {}
            // Refused, or answered without a change: the file stays as it is.
            answered => return answered.map_err(|e| core_failure(&self.label, e)),
        }
        self.open_for_writing()?;
        let runtime = match &*self.opened.borrow() {
            Opened::Runtime(runtime) => runtime.clone(),
            _ => return Err(self.closed()),
        };
        self.wait(op(runtime))
    }

    /// Opens a [deferred](Opened::Deferred) file for writing, in place of its read-only
    /// handle (closed first: the writable open takes the file's lock).
    fn open_for_writing(&self) -> Result<()> {
        let Opened::Deferred { runtime, path } = self.opened.replace(Opened::Closed) else {
            return Ok(());
        };
        self.tokio.block_on(runtime.shutdown());
        drop(runtime);
        // A process that took the file meanwhile (a `deliver --serve` starting, say) holds
        // it: nothing is written yet, and the command is made again from its open, which
        // goes through that process's endpoint or waits for it.
        let (runtime, _) = crate::open::writable(&path).map_err(|failure| Failure {
            again: failure.held,
            ..failure
        })?;
        *self.opened.borrow_mut() = Opened::Runtime(runtime);
        Ok(())
    }

    /// Runs `future` on this operator's tokio runtime; loops' errors as failures.
    fn wait<T>(&self, future: impl Future<Output = loops_core::Result<T>>) -> Result<T> {
        self.tokio
            .block_on(future)
            .map_err(|e| core_failure(&self.label, e))
    }
}

impl Operator for Local {
    fn label(&self) -> &str {
        &self.label
    }

    fn reached(&self) -> String {
        self.reached.clone()
    }

    fn taker(&self) -> Taker {
        match &*self.opened.borrow() {
            // A store whose leases lapse is shared by workers that claim its ready runs.
            Opened::Runtime(runtime) if runtime.store().lease_ttl().is_some() => Taker::Workers,
            _ => Taker::NextStart,
        }
    }

    fn list(&self, status: RunStatus, workflow: Option<&str>) -> Result<Vec<RunInfo>> {
        self.wait(self.store()?.list(status, workflow))
    }

    fn run(&self, run_id: &str) -> Result<Option<RunInfo>> {
        self.wait(self.store()?.run_info(run_id))
    }

    fn latest(&self, run_id: &str) -> Result<Option<(RunInfo, TransitionRecord)>> {
        self.wait(self.store()?.latest(run_id))
    }

    fn history(&self, run_id: &str) -> Result<Vec<TransitionRecord>> {
        self.wait(self.store()?.history(run_id))
    }

    fn steps(&self, run_id: &str, seq: u64) -> Result<Vec<(String, u32, StepRecord)>> {
        self.wait(self.store()?.steps(run_id, seq))
    }

    fn all_steps(
        &self,
        run_id: &str,
        history: &[TransitionRecord],
    ) -> Result<Vec<(u64, String, u32, StepRecord)>> {
        if let Opened::ReadOnly(store) = &*self.opened.borrow() {
            return store
                .all_steps(run_id)
                .map_err(|e| core_failure(&self.label, e));
        }
        super::steps_of_each_seq(self, run_id, history)
    }

    fn failures(&self, run_id: &str) -> Result<Vec<(u64, FailureRecord)>> {
        self.wait(self.store()?.failures(run_id))
    }

    fn events(&self, run_id: &str) -> Result<Vec<(u64, EventRecord, bool)>> {
        self.wait(self.store()?.events(run_id))
    }

    fn children(&self, run_id: &str) -> Result<Vec<RunInfo>> {
        self.wait(self.store()?.children(run_id))
    }

    fn attributes(&self, run_id: &str) -> Result<loops_core::Attributes> {
        self.wait(self.store()?.attributes(run_id))
    }

    fn search(
        &self,
        filter: &loops_core::RunFilter,
    ) -> Result<Vec<(RunInfo, loops_core::Attributes)>> {
        self.wait(loops_core::find_runs(&*self.store()?, filter))
    }

    fn schemas(&self) -> Result<Vec<(SchemaHash, String)>> {
        self.wait(self.store()?.schemas())
    }

    fn schema(&self, hash: SchemaHash) -> Result<Option<String>> {
        self.wait(self.store()?.schema(hash))
    }

    fn sealing_keys(&self) -> Result<Vec<String>> {
        self.wait(self.store()?.sealing_keys())
    }

    fn sealing_checks(&self) -> Result<Vec<(String, String)>> {
        self.wait(self.store()?.sealing_checks())
    }

    fn schedules(&self) -> Result<Vec<ScheduleStatus>> {
        let now = now_ms();
        let rows = self.wait(self.store()?.schedules())?;
        Ok(rows
            .into_iter()
            .map(|info| ScheduleStatus::of(info, now))
            .collect())
    }

    fn pause_schedule(&self, name: &str, paused: bool) -> Result<ScheduleStatus> {
        let info = if paused {
            self.write("pause a schedule", move |runtime| {
                Box::pin(async move { runtime.pause_schedule(name).await })
            })?
        } else {
            self.write("resume a schedule", move |runtime| {
                Box::pin(async move { runtime.resume_schedule(name).await })
            })?
        };
        Ok(ScheduleStatus::of(info, now_ms()))
    }

    fn remove_schedule(&self, name: &str) -> Result<()> {
        self.write("remove a schedule", move |runtime| {
            Box::pin(async move { runtime.remove_schedule(name).await })
        })
    }

    fn cancel(&self, run_id: &str, reason: &str) -> Result<RunInfo> {
        self.write("cancel a run", move |runtime| {
            Box::pin(async move { runtime.cancel(run_id, reason).await })
        })
    }

    fn retry(&self, run_id: &str) -> Result<(RunInfo, Taker)> {
        let info = self.write("retry a run", move |runtime| {
            Box::pin(async move { runtime.retry(run_id).await })
        })?;
        Ok((info, self.taker()))
    }

    fn send(
        &self,
        run_id: &str,
        event: &str,
        key: Option<&str>,
        payload: &RawValue,
    ) -> Result<(Sent, Taker)> {
        let sent = self.write("send an event", move |runtime| {
            Box::pin(async move { runtime.send_json(run_id, event, key, payload).await })
        })?;
        Ok((sent, self.taker()))
    }

    /// loops' own prune ([`loops_core::prune_reporting`]): whole families of runs per
    /// write, about 50 writes, for progress. Writing needs the store opened for writing; a
    /// prune that finds nothing to remove writes nothing, and leaves a deferred file closed
    /// to writing.
    fn prune(
        &self,
        policy: &RetentionPolicy,
        dry_run: bool,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Pruned> {
        let now = now_ms();
        if dry_run {
            return self.wait(loops_core::prune_reporting(
                &*self.store()?,
                policy,
                now,
                true,
                progress,
            ));
        }
        self.write("prune", move |runtime| {
            Box::pin(async move {
                loops_core::prune_reporting(runtime.sealed_store(), policy, now, false, progress)
                    .await
            })
        })
    }

    fn compact(&self) -> Result<Compacted> {
        if let Opened::Runtime(runtime) = &*self.opened.borrow()
            && runtime.redb().is_none()
        {
            return Err(Failure::new(format!(
                "store {} is a PostgreSQL store: compaction is for redb files (PostgreSQL's own VACUUM returns the space of pruned runs)",
                self.label
            )));
        }
        self.write("compact", |runtime| {
            Box::pin(async move { runtime.compact().await })
        })
    }

    fn close(self: Box<Self>) {
        let Local { tokio, opened, .. } = *self;
        match opened.into_inner() {
            Opened::Runtime(runtime) | Opened::Deferred { runtime, .. } => {
                tokio.block_on(runtime.shutdown());
                drop(runtime);
            }
            Opened::ReadOnly(store) => drop(store),
            Opened::Closed => {}
        }
        drop(tokio);
    }
}
