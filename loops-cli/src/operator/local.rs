//! [`Local`]: the store opened by this process.

use loops_core::{
    Compacted, EventRecord, FailureRecord, Pruned, RedbStore, RetentionPolicy, RunInfo, RunStatus,
    Runtime, ScheduleStatus, SchemaHash, Sent, StepRecord, Store, TransitionRecord, now_ms,
};
use serde_json::value::RawValue;

use super::{Operator, Taker, core_failure};
use crate::failure::{Failure, Result};

/// The store, opened by this process: reads go to the store, writes through a runtime on
/// it (the same commit path as the workflow's process).
pub struct Local {
    label: String,
    reached: String,
    /// Every async call of this operator runs here: a PostgreSQL pool's connections belong
    /// to the runtime they were made on.
    tokio: tokio::runtime::Runtime,
    opened: Opened,
}

enum Opened {
    /// A redb file opened read-only (no runtime: nothing can be written).
    ReadOnly(RedbStore),
    /// A runtime on the store (a writable redb file, or PostgreSQL).
    Runtime(Runtime),
}

impl Local {
    /// A redb file opened read-only.
    pub fn read_only(store: RedbStore, tokio: tokio::runtime::Runtime) -> Local {
        Local {
            label: Store::label(&store),
            reached: "read the store file directly (no process holds it)".to_owned(),
            tokio,
            opened: Opened::ReadOnly(store),
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
            opened: Opened::Runtime(runtime),
        }
    }

    /// The store as it holds payloads (sealed ones as stored: [`Unsealing`](super::Unsealing)
    /// opens them, as it does what a control endpoint serves).
    fn store(&self) -> &dyn Store {
        match &self.opened {
            Opened::ReadOnly(store) => store,
            Opened::Runtime(runtime) => runtime.sealed_store(),
        }
    }

    fn runtime_for(&self, what: &str) -> Result<&Runtime> {
        match &self.opened {
            Opened::Runtime(runtime) => Ok(runtime),
            Opened::ReadOnly(_) => Err(Failure::new(format!(
                "cannot {what}: store {} was opened read-only",
                self.label
            ))),
        }
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
        match &self.opened {
            // A store whose leases lapse is shared by workers that claim its ready runs.
            Opened::Runtime(runtime) if runtime.store().lease_ttl().is_some() => Taker::Workers,
            _ => Taker::NextStart,
        }
    }

    fn list(&self, status: RunStatus, workflow: Option<&str>) -> Result<Vec<RunInfo>> {
        self.wait(self.store().list(status, workflow))
    }

    fn run(&self, run_id: &str) -> Result<Option<RunInfo>> {
        self.wait(self.store().run_info(run_id))
    }

    fn latest(&self, run_id: &str) -> Result<Option<(RunInfo, TransitionRecord)>> {
        self.wait(self.store().latest(run_id))
    }

    fn history(&self, run_id: &str) -> Result<Vec<TransitionRecord>> {
        self.wait(self.store().history(run_id))
    }

    fn steps(&self, run_id: &str, seq: u64) -> Result<Vec<(String, u32, StepRecord)>> {
        self.wait(self.store().steps(run_id, seq))
    }

    fn all_steps(
        &self,
        run_id: &str,
        history: &[TransitionRecord],
    ) -> Result<Vec<(u64, String, u32, StepRecord)>> {
        match &self.opened {
            Opened::ReadOnly(store) => store
                .all_steps(run_id)
                .map_err(|e| core_failure(&self.label, e)),
            Opened::Runtime(_) => super::steps_of_each_seq(self, run_id, history),
        }
    }

    fn failures(&self, run_id: &str) -> Result<Vec<(u64, FailureRecord)>> {
        self.wait(self.store().failures(run_id))
    }

    fn events(&self, run_id: &str) -> Result<Vec<(u64, EventRecord, bool)>> {
        self.wait(self.store().events(run_id))
    }

    fn children(&self, run_id: &str) -> Result<Vec<RunInfo>> {
        self.wait(self.store().children(run_id))
    }

    fn attributes(&self, run_id: &str) -> Result<loops_core::Attributes> {
        self.wait(self.store().attributes(run_id))
    }

    fn search(
        &self,
        filter: &loops_core::RunFilter,
    ) -> Result<Vec<(RunInfo, loops_core::Attributes)>> {
        self.wait(loops_core::find_runs(self.store(), filter))
    }

    fn schemas(&self) -> Result<Vec<(SchemaHash, String)>> {
        self.wait(self.store().schemas())
    }

    fn schema(&self, hash: SchemaHash) -> Result<Option<String>> {
        self.wait(self.store().schema(hash))
    }

    fn sealing_keys(&self) -> Result<Vec<String>> {
        self.wait(self.store().sealing_keys())
    }

    fn sealing_checks(&self) -> Result<Vec<(String, String)>> {
        self.wait(self.store().sealing_checks())
    }

    fn schedules(&self) -> Result<Vec<ScheduleStatus>> {
        let now = now_ms();
        let rows = self.wait(self.store().schedules())?;
        Ok(rows
            .into_iter()
            .map(|info| ScheduleStatus::of(info, now))
            .collect())
    }

    fn pause_schedule(&self, name: &str, paused: bool) -> Result<ScheduleStatus> {
        let runtime = self.runtime_for(if paused {
            "pause a schedule"
        } else {
            "resume a schedule"
        })?;
        let info = if paused {
            self.wait(runtime.pause_schedule(name))?
        } else {
            self.wait(runtime.resume_schedule(name))?
        };
        Ok(ScheduleStatus::of(info, now_ms()))
    }

    fn remove_schedule(&self, name: &str) -> Result<()> {
        let runtime = self.runtime_for("remove a schedule")?;
        self.wait(runtime.remove_schedule(name))
    }

    fn cancel(&self, run_id: &str, reason: &str) -> Result<RunInfo> {
        let runtime = self.runtime_for("cancel a run")?;
        self.wait(runtime.cancel(run_id, reason))
    }

    fn retry(&self, run_id: &str) -> Result<(RunInfo, Taker)> {
        let runtime = self.runtime_for("retry a run")?;
        let info = self.wait(runtime.retry(run_id))?;
        Ok((info, self.taker()))
    }

    fn send(
        &self,
        run_id: &str,
        event: &str,
        key: Option<&str>,
        payload: &RawValue,
    ) -> Result<(Sent, Taker)> {
        let runtime = self.runtime_for("send an event")?;
        let sent = self.wait(runtime.send_json(run_id, event, key, payload))?;
        Ok((sent, self.taker()))
    }

    /// loops' own prune ([`loops_core::prune_reporting`]): whole families of runs per
    /// write, about 50 writes, for progress. Writing needs the store opened for writing.
    fn prune(
        &self,
        policy: &RetentionPolicy,
        dry_run: bool,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Pruned> {
        if !dry_run {
            self.runtime_for("prune")?;
        }
        self.wait(loops_core::prune_reporting(
            self.store(),
            policy,
            now_ms(),
            dry_run,
            progress,
        ))
    }

    fn compact(&self) -> Result<Compacted> {
        let runtime = self.runtime_for("compact")?;
        if runtime.redb().is_none() {
            return Err(Failure::new(format!(
                "store {} is a PostgreSQL store: compaction is for redb files (PostgreSQL's own VACUUM returns the space of pruned runs)",
                self.label
            )));
        }
        self.wait(runtime.compact())
    }

    fn close(self: Box<Self>) {
        let Local { tokio, opened, .. } = *self;
        match opened {
            Opened::Runtime(runtime) => {
                tokio.block_on(runtime.shutdown());
                drop(runtime);
            }
            Opened::ReadOnly(store) => drop(store),
        }
        drop(tokio);
    }
}
