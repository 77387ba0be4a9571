//! [`Remote`]: the store held by a running process, reached through its control endpoint.

use loops_core::control::{Client, ControlError, ErrorKind, wire::PruneRequest};
use loops_core::{
    Compacted, EventRecord, Pruned, RetentionPolicy, RunInfo, RunStatus, SchemaHash, Sent,
};
use loops_core::{FailureRecord, StepRecord, TransitionRecord};
use serde_json::value::RawValue;

use std::cell::OnceCell;
use std::path::PathBuf;

use super::{Operator, Taker, not_found};
use crate::failure::{Failure, Kind, Result};
use crate::open::{self, Access};

/// The process's control endpoint: every operation is one request (one connection), and
/// every write is made by the process's runtime.
///
/// A process may stop between two operations of one command, or during one (its endpoint
/// closes as it ends). An operation that then reaches no process was not received by one,
/// and a read whose connection closed before its answer came changed nothing: either is made
/// on the store file instead (`fallback`: opened as [`open::file_operator`] does, which waits
/// for the ending process to release the file), and so is every operation after it. A write
/// whose request reached the process and got no answer is not made again: its outcome is
/// unknown, and the command fails saying so.
pub struct Remote {
    label: String,
    client: Client,
    tokio: tokio::runtime::Runtime,
    /// The store file and the access the command needs, to go on with when the process no
    /// longer answers.
    fallback: Option<(PathBuf, Access)>,
    /// The operator on the store file, once an operation fell back to it.
    local: OnceCell<Box<dyn Operator>>,
}

/// What an operation does to the store: whether it may be made again after its connection
/// closed unanswered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op<'a> {
    /// It reads: made again on the file.
    Read,
    /// It writes: its outcome is unknown, and it fails.
    Write,
    /// It sends an event to the run `run`, with an idempotency key or not (`keyed`): as
    /// [`Op::Write`], and the failure says how to find out and how to send again (a second
    /// send without the key is a second event).
    Send { run: &'a str, keyed: bool },
    /// It asks for the run `run`'s cancellation: as [`Op::Write`], and the failure says how
    /// to find out whether it was recorded.
    Cancel { run: &'a str },
}

impl Op<'_> {
    /// What the failure of this operation adds when its outcome is unknown: how to find it
    /// out, and how to make it again.
    fn unknown_hint(self) -> Option<String> {
        match self {
            Op::Send { run, keyed: true } => Some(format!(
                "; `loops history {run}` shows whether the event was sent (sent again with the \
                 same --key, it is taken once)"
            )),
            Op::Send { run, keyed: false } => Some(format!(
                "; `loops history {run}` shows whether the event was sent (sent again without \
                 --key, it would be a second event)"
            )),
            Op::Cancel { run } => Some(format!(
                "; `loops show {run}` shows whether the cancellation was recorded (a `cancel \
                 asked` or `cancelled` line with its reason)"
            )),
            Op::Read | Op::Write => None,
        }
    }
}

impl Remote {
    /// The operator for store `label` over `client`; `fallback` is the store file and the
    /// access the command needs, for when the process stops answering (`None`: fail then).
    pub fn new(
        label: String,
        client: Client,
        tokio: tokio::runtime::Runtime,
        fallback: Option<(PathBuf, Access)>,
    ) -> Remote {
        Remote {
            label,
            client,
            tokio,
            fallback,
            local: OnceCell::new(),
        }
    }

    /// One operation, `op`: `remote`, through the endpoint, or `local`, on the store file once
    /// the process no longer answers, or (a read) closed the connection before it answered
    /// (see [`Remote`]).
    fn call<'a, T, F>(
        &'a self,
        op: Op<'_>,
        remote: impl FnOnce(&'a Client) -> F,
        local: impl FnOnce(&dyn Operator) -> Result<T>,
    ) -> Result<T>
    where
        F: Future<Output = Result<T, ControlError>>,
    {
        if let Some(operator) = self.local.get() {
            return local(&**operator);
        }
        match self.tokio.block_on(remote(&self.client)) {
            Err(ControlError::Unreachable { .. }) if self.fallback.is_some() => {
                local(self.fallen_back()?)
            }
            Err(ControlError::Dropped { .. }) if op == Op::Read && self.fallback.is_some() => {
                local(self.fallen_back()?)
            }
            answered => answered.map_err(|e| {
                let unknown = matches!(
                    e,
                    ControlError::Dropped { .. } | ControlError::NoAnswer { .. }
                );
                let mut failure = remote_failure(&self.label, e);
                if let Some(hint) = op.unknown_hint().filter(|_| unknown) {
                    failure.message.push_str(&hint);
                }
                failure
            }),
        }
    }

    /// The operator on the store file, opened at the first call.
    fn fallen_back(&self) -> Result<&dyn Operator> {
        if let Some(operator) = self.local.get() {
            return Ok(&**operator);
        }
        let Some((path, access)) = &self.fallback else {
            return Err(Failure::new(format!(
                "store {}: the process that held it stopped answering",
                self.label
            )));
        };
        let operator = open::file_operator(path, *access)?;
        Ok(&**self.local.get_or_init(|| operator))
    }
}

/// Who takes up a run the serving process was sent an event for, or retried: it, if it says
/// it drives the run (`taken_here`).
fn taker(taken_here: bool) -> Taker {
    if taken_here {
        Taker::Serving
    } else {
        Taker::NotServed
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
        let served = format!(
            "through the control endpoint {} of the process that holds the store (loops {})",
            self.client.endpoint(),
            self.client.server().loops_version
        );
        match self.local.get() {
            Some(local) => format!(
                "{served}, then, once it stopped answering, {}",
                local.reached()
            ),
            None => served,
        }
    }

    fn taker(&self) -> Taker {
        self.local
            .get()
            .map_or(Taker::Serving, |local| local.taker())
    }

    fn list(&self, status: RunStatus, workflow: Option<&str>) -> Result<Vec<RunInfo>> {
        self.call(
            Op::Read,
            |c| c.list(Some(status), workflow),
            |l| l.list(status, workflow),
        )
    }

    fn run(&self, run_id: &str) -> Result<Option<RunInfo>> {
        self.call(Op::Read, |c| c.run_info(run_id), |l| l.run(run_id))
    }

    fn children(&self, run_id: &str) -> Result<Vec<RunInfo>> {
        self.call(Op::Read, |c| c.children(run_id), |l| l.children(run_id))
    }

    fn attributes(&self, run_id: &str) -> Result<loops_core::Attributes> {
        self.call(Op::Read, |c| c.attributes(run_id), |l| l.attributes(run_id))
    }

    fn search(
        &self,
        filter: &loops_core::RunFilter,
    ) -> Result<Vec<(RunInfo, loops_core::Attributes)>> {
        self.call(Op::Read, |c| c.search(filter), |l| l.search(filter))
    }

    fn latest(&self, run_id: &str) -> Result<Option<(RunInfo, TransitionRecord)>> {
        self.call(Op::Read, |c| c.latest(run_id), |l| l.latest(run_id))
    }

    fn history(&self, run_id: &str) -> Result<Vec<TransitionRecord>> {
        self.call(Op::Read, |c| c.history(run_id), |l| l.history(run_id))
    }

    fn steps(&self, run_id: &str, seq: u64) -> Result<Vec<(String, u32, StepRecord)>> {
        self.call(
            Op::Read,
            |c| async move {
                let steps = c.steps(run_id, seq).await?;
                Ok(steps
                    .into_iter()
                    .map(|s| (s.name, s.occurrence, s.record))
                    .collect())
            },
            |l| l.steps(run_id, seq),
        )
    }

    fn all_steps(
        &self,
        run_id: &str,
        history: &[TransitionRecord],
    ) -> Result<Vec<(u64, String, u32, StepRecord)>> {
        self.call(
            Op::Read,
            |c| async move {
                let steps = c.all_steps(run_id).await?;
                Ok(steps
                    .into_iter()
                    .map(|s| (s.seq, s.name, s.occurrence, s.record))
                    .collect())
            },
            |l| l.all_steps(run_id, history),
        )
    }

    fn failures(&self, run_id: &str) -> Result<Vec<(u64, FailureRecord)>> {
        self.call(
            Op::Read,
            |c| async move {
                let failures = c.failures(run_id).await?;
                Ok(failures.into_iter().map(|f| (f.seq, f.record)).collect())
            },
            |l| l.failures(run_id),
        )
    }

    fn events(&self, run_id: &str) -> Result<Vec<(u64, EventRecord, bool)>> {
        self.call(
            Op::Read,
            |c| async move {
                let events = c.events(run_id).await?;
                Ok(events
                    .into_iter()
                    .map(|e| (e.event_seq, e.record, e.delivered))
                    .collect())
            },
            |l| l.events(run_id),
        )
    }

    fn schemas(&self) -> Result<Vec<(SchemaHash, String)>> {
        self.call(Op::Read, |c| c.schemas(), |l| l.schemas())
    }

    fn schema(&self, hash: SchemaHash) -> Result<Option<String>> {
        self.call(Op::Read, |c| c.schema(hash), |l| l.schema(hash))
    }

    fn sealing_keys(&self) -> Result<Vec<String>> {
        self.call(Op::Read, |c| c.sealing_keys(), |l| l.sealing_keys())
    }

    fn sealing_checks(&self) -> Result<Vec<(String, String)>> {
        self.call(Op::Read, |c| c.sealing_checks(), |l| l.sealing_checks())
    }

    fn schedules(&self) -> Result<Vec<loops_core::ScheduleStatus>> {
        self.call(Op::Read, |c| c.schedules(), |l| l.schedules())
    }

    fn pause_schedule(&self, name: &str, paused: bool) -> Result<loops_core::ScheduleStatus> {
        self.call(
            Op::Write,
            |c| c.pause_schedule(name, paused),
            |l| l.pause_schedule(name, paused),
        )
    }

    fn remove_schedule(&self, name: &str) -> Result<()> {
        self.call(
            Op::Write,
            |c| c.remove_schedule(name),
            |l| l.remove_schedule(name),
        )
    }

    fn cancel(&self, run_id: &str, reason: &str) -> Result<RunInfo> {
        self.call(
            Op::Cancel { run: run_id },
            |c| c.cancel(run_id, reason),
            |l| l.cancel(run_id, reason),
        )
    }

    fn retry(&self, run_id: &str) -> Result<(RunInfo, Taker)> {
        self.call(
            Op::Write,
            |c| async move {
                let (info, taken_here) = c.retry(run_id).await?;
                Ok((info, taker(taken_here)))
            },
            |l| l.retry(run_id),
        )
    }

    fn send(
        &self,
        run_id: &str,
        event: &str,
        key: Option<&str>,
        payload: &RawValue,
    ) -> Result<(Sent, Taker)> {
        self.call(
            Op::Send {
                run: run_id,
                keyed: key.is_some(),
            },
            |c| async move {
                let sent = c.send(run_id, event, key, payload).await?;
                let taker = taker(sent.taken_here);
                let receipt = Sent {
                    event_seq: sent.event_seq,
                    duplicate: sent.duplicate,
                };
                Ok((receipt, taker))
            },
            |l| l.send(run_id, event, key, payload),
        )
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
            max_age_ms: policy.max_age.map(loops_core::duration_ms),
            keep_last: policy.keep_last,
            keep_failed: policy.keep_failed,
            dry_run,
        };
        let request = &request;
        self.call(
            Op::Write,
            |c| async move {
                let reply = c.prune(request).await?;
                if !dry_run {
                    progress(reply.runs, reply.runs);
                }
                Ok(Pruned {
                    runs: reply.runs,
                    records: reply.records,
                    run_ids: reply.run_ids,
                    kept_for_parents: reply.kept_for_parents,
                    kept_for_children: reply.kept_for_children,
                    changed_since_selection: reply.changed_since_selection,
                })
            },
            |l| l.prune(policy, dry_run, progress),
        )
    }

    fn compact(&self) -> Result<Compacted> {
        self.call(
            Op::Write,
            |c| async move {
                let reply = c.compact().await?;
                Ok(Compacted {
                    bytes_before: reply.bytes_before,
                    bytes_after: reply.bytes_after,
                })
            },
            |l| l.compact(),
        )
    }

    fn close(self: Box<Self>) {
        let Remote { local, tokio, .. } = *self;
        drop(tokio);
        if let Some(local) = local.into_inner() {
            local.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use loops_core::control::Endpoint;
    use loops_core::{BoxError, Context, Runtime};
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(crate = loops_core)]
    enum Job {
        #[initial]
        #[next(Done)]
        Start,
        #[terminal]
        Done,
    }

    struct Worker;

    impl JobHandler for Worker {
        type Error = BoxError;

        async fn start(&self, _: &Context) -> std::result::Result<StartNext, BoxError> {
            Ok(StartNext::Done)
        }
    }

    /// A write of a command that opened the file read-only first, and found it taken by a
    /// process when the write needed it for writing (a `deliver --serve` that started
    /// meanwhile): refused as held, marked to be made again from the open (which then goes
    /// through that process), with nothing written.
    #[test]
    fn a_deferred_write_whose_file_was_taken_meanwhile_is_to_be_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let rt = Runtime::open(&path).unwrap();
            let options = loops_core::StartOptions::default();
            rt.enqueue("j2", Job::Start, options).await.unwrap();
            rt.shutdown().await;
        });
        // The process takes the file between the read-only handle's close and the writable
        // open: here the read-only handle is on a copy of the file, so that the process can
        // hold the file itself from the start.
        let copy = dir.path().join("copy.redb");
        std::fs::copy(&path, &copy).unwrap();
        let read = loops_core::RedbStore::open_read_only(&copy).unwrap();
        let local = crate::operator::Local::deferred(
            Runtime::builder().build(read),
            path.clone(),
            String::new(),
            open::tokio().unwrap(),
        );
        let holder = Runtime::open(&path).unwrap();
        // Refused from the read-only open: not made again.
        let ended = local.cancel("nope", "why").unwrap_err();
        assert!(!ended.again && ended.missing, "{ended}");
        let taken = local.cancel("j2", "why").unwrap_err();
        assert!(taken.again && taken.held, "{taken}");
        let row = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(holder.run_info("j2"))
            .unwrap()
            .unwrap();
        assert_eq!(row.cancel, None);
        Box::new(local).close();
    }

    /// A process that holds the store at `path`, with the run `j1` completed in it, and
    /// serves its control endpoint: its tokio runtime, its runtime and its server.
    fn serving(
        path: &std::path::Path,
    ) -> (
        tokio::runtime::Runtime,
        Runtime,
        loops_core::control::ControlServer,
    ) {
        let process = tokio::runtime::Runtime::new().unwrap();
        let (rt, server) = process.block_on(async {
            let rt = Runtime::builder()
                .register::<Job, _>(Worker)
                .open(path)
                .unwrap();
            rt.run("j1", Job::Start, &Worker).await.unwrap();
            let server = rt.serve_control_next_to_store().await.unwrap();
            (rt, server)
        });
        (process, rt, server)
    }

    /// A process that stops between two operations of a command: the operation that finds
    /// no process answering is made on the store file, and so is every one after it.
    #[test]
    fn an_operation_falls_back_to_the_file_once_the_process_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let (process, rt, server) = serving(&path);
        let tokio = open::tokio().unwrap();
        let socket = loops_core::control::socket_path(&path);
        let client = tokio
            .block_on(Client::connect(Endpoint::Unix(socket)))
            .unwrap();
        let label = path.display().to_string();
        let remote = Remote::new(label, client, tokio, Some((path.clone(), Access::Write)));
        let served = remote.run("j1").unwrap().unwrap();
        assert_eq!((served.state.as_str(), served.seq), ("Done", 1));
        assert_eq!(remote.taker(), Taker::Serving);

        process.block_on(async {
            server.stop().await;
            rt.shutdown().await;
        });
        drop(rt);
        let read = remote.run("j1").unwrap().unwrap();
        assert_eq!((read.state.as_str(), read.seq), ("Done", 1));
        assert_eq!(remote.history("j1").unwrap().len(), 2);
        assert_eq!(remote.taker(), Taker::NextStart);
        assert!(
            remote.reached().ends_with(
                "then, once it stopped answering, opened the store file to read, and to write at the first write that changes it (no process holds it)"
            ),
            "{}",
            remote.reached()
        );
        Box::new(remote).close();
    }

    /// Without a store file to go on with, a process that stopped answering fails the
    /// operation, in one line naming the endpoint.
    #[test]
    fn without_a_fallback_an_operation_fails_once_the_process_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let process = tokio::runtime::Runtime::new().unwrap();
        let (rt, server) = process.block_on(async {
            let rt = Runtime::open(&path).unwrap();
            let server = rt.serve_control_next_to_store().await.unwrap();
            (rt, server)
        });
        let tokio = open::tokio().unwrap();
        let socket = loops_core::control::socket_path(&path);
        let client = tokio
            .block_on(Client::connect(Endpoint::Unix(socket.clone())))
            .unwrap();
        let remote = Remote::new("s".to_owned(), client, tokio, None);
        process.block_on(async {
            server.stop().await;
            rt.shutdown().await;
        });
        let failure = remote.run("j1").unwrap_err();
        assert_eq!(
            failure.message,
            format!(
                "store s: no process answers on control endpoint unix:{}: No such file or directory (os error 2)",
                socket.display()
            )
        );
    }

    /// A process that closes each connection before it answers (it is stopping): a read is
    /// made on the store file instead; a write fails, saying its outcome is unknown.
    #[test]
    fn a_dropped_read_falls_back_to_the_file_and_a_dropped_write_fails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let (process, rt, server) = serving(&path);
        let socket = loops_core::control::socket_path(&path);
        let remote = |access: Access| {
            let tokio = open::tokio().unwrap();
            let endpoint = Endpoint::Unix(socket.clone());
            let client = tokio.block_on(Client::connect(endpoint)).unwrap();
            let label = path.display().to_string();
            Remote::new(label, client, tokio, Some((path.clone(), access)))
        };
        let (reader, writer) = (remote(Access::Read), remote(Access::Write));
        process.block_on(async {
            server.stop().await;
            rt.shutdown().await;
        });
        drop(rt);
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let _ = std::io::Read::read(&mut stream, &mut [0; 64]);
            }
        });

        let said = format!(
            "store {}: control endpoint unix:{}: the connection closed before the process answered (",
            path.display(),
            socket.display()
        );
        let unknown =
            "): the process may have stopped; whether it carried the request out is unknown";
        // A send's outcome unknown: a second send without the key would be a second event.
        let payload = serde_json::value::RawValue::from_string("1".to_owned()).unwrap();
        let send_hint = format!(
            "{unknown}; `loops history j1` shows whether the event was sent (sent again without --key, it would be a second event)"
        );
        // A cancel's outcome unknown: `loops show` tells; other writes say only that it is.
        let cancel_hint = format!(
            "{unknown}; `loops show j1` shows whether the cancellation was recorded (a `cancel asked` or `cancelled` line with its reason)"
        );
        for (failure, ends) in [
            (writer.cancel("j1", "enough").unwrap_err(), cancel_hint),
            (writer.retry("j1").unwrap_err(), unknown.to_owned()),
            (
                writer.send("j1", "go", None, &payload).unwrap_err(),
                send_hint,
            ),
            (
                writer.send("j1", "go", Some("k"), &payload).unwrap_err(),
                format!(
                    "{unknown}; `loops history j1` shows whether the event was sent (sent again with the same --key, it is taken once)"
                ),
            ),
        ] {
            assert!(failure.message.starts_with(&said), "{}", failure.message);
            assert!(failure.message.ends_with(&ends), "{}", failure.message);
        }
        let read = reader.run("j1").unwrap().unwrap();
        assert_eq!((read.state.as_str(), read.seq), ("Done", 1));
        assert!(
            reader.reached().ends_with(
                "then, once it stopped answering, read the store file directly (no process holds it)"
            ),
            "{}",
            reader.reached()
        );
    }
}
