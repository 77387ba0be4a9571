//! [`Remote`]: the store held by a running process, reached through its control endpoint.

use loops_core::control::{Client, ControlError, ErrorKind, wire::PruneRequest};
use loops_core::{
    Compacted, EventRecord, Pruned, RetentionPolicy, RunInfo, RunStatus, SchemaHash, Sent,
};
use loops_core::{FailureRecord, StepRecord, TransitionRecord};
use serde_json::value::RawValue;

use super::{Operator, Taker, not_found};
use crate::failure::{Failure, Kind, Result};

/// The process's control endpoint: every operation is one request, and every write is made
/// by the process's runtime.
pub struct Remote {
    label: String,
    client: Client,
    tokio: tokio::runtime::Runtime,
}

impl Remote {
    /// The operator for store `label` over `client`.
    pub fn new(label: String, client: Client, tokio: tokio::runtime::Runtime) -> Remote {
        Remote {
            label,
            client,
            tokio,
        }
    }

    fn wait<T>(&self, future: impl Future<Output = Result<T, ControlError>>) -> Result<T> {
        self.tokio
            .block_on(future)
            .map_err(|e| remote_failure(&self.label, e))
    }
}

/// The failure for an error of the control endpoint of store `label`, as the same error
/// would be said for a store this process opened: no such run names the store, an invalid
/// argument is a bad argument (exit 2), and the process's other errors are its message.
pub fn remote_failure(label: &str, e: ControlError) -> Failure {
    match e {
        ControlError::Remote {
            kind: ErrorKind::RunNotFound,
            run_id: Some(run_id),
            ..
        } => not_found(label, &run_id),
        ControlError::Remote { kind, message, .. } => Failure::of(Kind::of_remote(&kind), message),
        other => Failure::new(format!("store {label}: {other}")),
    }
}

impl Operator for Remote {
    fn label(&self) -> &str {
        &self.label
    }

    fn reached(&self) -> String {
        format!(
            "through the control endpoint {} of the process that holds the store (loops {})",
            self.client.endpoint(),
            self.client.server().loops_version
        )
    }

    fn taker(&self) -> Taker {
        Taker::Serving
    }

    fn list(&self, status: RunStatus, workflow: Option<&str>) -> Result<Vec<RunInfo>> {
        self.wait(self.client.list(Some(status), workflow))
    }

    fn run(&self, run_id: &str) -> Result<Option<RunInfo>> {
        self.wait(self.client.run_info(run_id))
    }

    fn children(&self, run_id: &str) -> Result<Vec<RunInfo>> {
        self.wait(self.client.children(run_id))
    }

    fn attributes(&self, run_id: &str) -> Result<loops_core::Attributes> {
        self.wait(self.client.attributes(run_id))
    }

    fn search(
        &self,
        filter: &loops_core::RunFilter,
    ) -> Result<Vec<(RunInfo, loops_core::Attributes)>> {
        self.wait(self.client.search(filter))
    }

    fn latest(&self, run_id: &str) -> Result<Option<(RunInfo, TransitionRecord)>> {
        self.wait(self.client.latest(run_id))
    }

    fn history(&self, run_id: &str) -> Result<Vec<TransitionRecord>> {
        self.wait(self.client.history(run_id))
    }

    fn steps(&self, run_id: &str, seq: u64) -> Result<Vec<(String, u32, StepRecord)>> {
        let steps = self.wait(self.client.steps(run_id, seq))?;
        Ok(steps
            .into_iter()
            .map(|s| (s.name, s.occurrence, s.record))
            .collect())
    }

    fn all_steps(
        &self,
        run_id: &str,
        _: &[TransitionRecord],
    ) -> Result<Vec<(u64, String, u32, StepRecord)>> {
        let steps = self.wait(self.client.all_steps(run_id))?;
        Ok(steps
            .into_iter()
            .map(|s| (s.seq, s.name, s.occurrence, s.record))
            .collect())
    }

    fn failures(&self, run_id: &str) -> Result<Vec<(u64, FailureRecord)>> {
        let failures = self.wait(self.client.failures(run_id))?;
        Ok(failures.into_iter().map(|f| (f.seq, f.record)).collect())
    }

    fn events(&self, run_id: &str) -> Result<Vec<(u64, EventRecord, bool)>> {
        let events = self.wait(self.client.events(run_id))?;
        Ok(events
            .into_iter()
            .map(|e| (e.event_seq, e.record, e.delivered))
            .collect())
    }

    fn schemas(&self) -> Result<Vec<(SchemaHash, String)>> {
        self.wait(self.client.schemas())
    }

    fn schema(&self, hash: SchemaHash) -> Result<Option<String>> {
        self.wait(self.client.schema(hash))
    }

    fn sealing_keys(&self) -> Result<Vec<String>> {
        self.wait(self.client.sealing_keys())
    }

    fn schedules(&self) -> Result<Vec<loops_core::ScheduleStatus>> {
        self.wait(self.client.schedules())
    }

    fn pause_schedule(&self, name: &str, paused: bool) -> Result<loops_core::ScheduleStatus> {
        self.wait(self.client.pause_schedule(name, paused))
    }

    fn remove_schedule(&self, name: &str) -> Result<()> {
        self.wait(self.client.remove_schedule(name))
    }

    fn cancel(&self, run_id: &str, reason: &str) -> Result<RunInfo> {
        self.wait(self.client.cancel(run_id, reason))
    }

    fn retry(&self, run_id: &str) -> Result<RunInfo> {
        self.wait(self.client.retry(run_id))
    }

    fn send(
        &self,
        run_id: &str,
        event: &str,
        key: Option<&str>,
        payload: &RawValue,
    ) -> Result<Sent> {
        let sent = self.wait(self.client.send(run_id, event, key, payload))?;
        Ok(Sent {
            event_seq: sent.event_seq,
            duplicate: sent.duplicate,
        })
    }

    /// One request: the process selects and deletes (in its own batches); progress is told
    /// once, at the end.
    fn prune(
        &self,
        policy: &RetentionPolicy,
        dry_run: bool,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Pruned> {
        let request = PruneRequest {
            max_age_ms: policy
                .max_age
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            keep_last: policy.keep_last,
            keep_failed: policy.keep_failed,
            dry_run,
        };
        let reply = self.wait(self.client.prune(&request))?;
        if !dry_run {
            progress(reply.runs, reply.runs);
        }
        Ok(Pruned {
            runs: reply.runs,
            records: reply.records,
            run_ids: reply.run_ids,
            kept_for_parents: reply.kept_for_parents,
        })
    }

    fn compact(&self) -> Result<Compacted> {
        let reply = self.wait(self.client.compact())?;
        Ok(Compacted {
            bytes_before: reply.bytes_before,
            bytes_after: reply.bytes_after,
        })
    }
}
