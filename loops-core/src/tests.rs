//! Unit tests of the runtime and the store, on workflows derived with `#[workflow(crate =
//! crate)]` (the derive has its own tests in the `loops` package).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use loops_derive::Workflow;
use serde::{Deserialize, Serialize};

use crate::*;

mod parked;
mod run_ids;
mod send_json;

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = crate)]
enum Job {
    #[initial]
    #[next(Work)]
    Start { n: u32 },
    #[next(Work, Done)]
    Work { n: u32, acc: u64 },
    #[terminal]
    Done { acc: u64 },
}

/// The same workflow name with another shape (a field type changed). In a module of its own:
/// its generated `StartNext` and `WorkNext` would clash with `Job`'s.
mod v2 {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "job", crate = crate)]
    pub(super) enum JobV2 {
        #[initial]
        #[next(Work)]
        Start { n: u64 },
        #[next(Work, Done)]
        Work { n: u32, acc: u64 },
        #[terminal]
        Done { acc: u64 },
    }

    impl JobV2Handler for Worker {
        type Error = BoxError;
        async fn start(&self, _: &Context, _: u64) -> Result<StartNext, BoxError> {
            Err("JobV2 is never driven in these tests".into())
        }
        async fn work(&self, _: &Context, _: u32, _: u64) -> Result<WorkNext, BoxError> {
            Err("JobV2 is never driven in these tests".into())
        }
    }
}
use v2::JobV2;

#[derive(Default)]
struct Worker {
    /// (state, seq, attempt) of every handler call.
    calls: Mutex<Vec<(&'static str, u64, u32)>>,
    /// Runs of the `effect` step's closure.
    effects: AtomicU32,
    /// `Work` fails on its first `fail_work` attempts, after its step.
    fail_work: u32,
    /// `Work` waits this long before returning (for cancellation and time-outs).
    work_delay: Duration,
}

#[derive(Debug, thiserror::Error)]
enum WorkError {
    #[error("work failed on attempt {0}")]
    Flaky(u32),
    #[error(transparent)]
    Loops(#[from] Error),
}

impl Worker {
    fn calls(&self) -> Vec<(&'static str, u64, u32)> {
        self.calls.lock().unwrap().clone()
    }

    async fn work(&self, ctx: &Context, n: u32, acc: u64) -> Result<WorkNext, WorkError> {
        let add: u64 = ctx
            .step("effect", || async {
                self.effects.fetch_add(1, Ordering::SeqCst);
                Ok(u64::from(n) * 10)
            })
            .await?;
        if !self.work_delay.is_zero() {
            tokio::time::sleep(self.work_delay).await;
        }
        if ctx.attempt() <= self.fail_work {
            return Err(WorkError::Flaky(ctx.attempt()));
        }
        Ok(if n == 0 {
            WorkNext::Done { acc: acc + add }
        } else {
            WorkNext::Work {
                n: n - 1,
                acc: acc + add,
            }
        })
    }
}

impl JobHandler for Worker {
    type Error = WorkError;
    async fn start(&self, ctx: &Context, n: u32) -> Result<StartNext, WorkError> {
        self.calls
            .lock()
            .unwrap()
            .push((ctx.state(), ctx.seq(), ctx.attempt()));
        Ok(StartNext::Work { n, acc: 0 })
    }
    async fn work(&self, ctx: &Context, n: u32, acc: u64) -> Result<WorkNext, WorkError> {
        self.calls
            .lock()
            .unwrap()
            .push((ctx.state(), ctx.seq(), ctx.attempt()));
        // The inherent `Worker::work` above.
        Worker::work(self, ctx, n, acc).await
    }
}

fn temp_store() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    (dir, path)
}

fn fast_retry(attempts: u32) -> RetryPolicy {
    RetryPolicy::attempts(attempts).with_delays(Duration::from_millis(1), Duration::from_millis(5))
}

#[tokio::test]
async fn new_run_completes_with_exact_history() {
    let (_dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    let worker = Worker::default();
    let done = rt.run("r1", Job::Start { n: 2 }, &worker).await.unwrap();
    assert_eq!(done, Job::Done { acc: 30 });
    let states: Vec<(u64, JobState, Job)> = rt
        .history::<Job>("r1")
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.seq, t.state, t.value))
        .collect();
    assert_eq!(
        states,
        vec![
            (0, JobState::Start, Job::Start { n: 2 }),
            (1, JobState::Work, Job::Work { n: 2, acc: 0 }),
            (2, JobState::Work, Job::Work { n: 1, acc: 20 }),
            (3, JobState::Work, Job::Work { n: 0, acc: 30 }),
            (4, JobState::Done, Job::Done { acc: 30 }),
        ]
    );
    assert_eq!(
        worker.calls(),
        vec![
            ("Start", 0, 1),
            ("Work", 1, 1),
            ("Work", 2, 1),
            ("Work", 3, 1)
        ]
    );
    assert_eq!(worker.effects.load(Ordering::SeqCst), 3);
    let info = rt.run_info("r1").await.unwrap().unwrap();
    assert_eq!(info.status, RunStatus::Completed);
    assert_eq!(
        (info.state.as_str(), info.seq, info.attempt),
        ("Done", 4, 1)
    );
    assert_eq!(
        rt.list_runs(RunStatus::Completed, Some("job"))
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        rt.list_runs(RunStatus::Running, None)
            .await
            .unwrap()
            .is_empty()
    );

    // Driving a completed run again returns its final state and calls nothing.
    let again = rt.run("r1", Job::Start { n: 9 }, &worker).await.unwrap();
    assert_eq!(again, Job::Done { acc: 30 });
    assert_eq!(worker.calls().len(), 4);
}

#[tokio::test]
async fn failed_attempts_retry_and_steps_replay() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder().retry(fast_retry(3)).open(&path).unwrap();
    let worker = Worker {
        fail_work: 2,
        ..Worker::default()
    };
    let done = rt.run("r", Job::Start { n: 0 }, &worker).await.unwrap();
    assert_eq!(done, Job::Done { acc: 0 });
    assert_eq!(
        worker.calls(),
        vec![
            ("Start", 0, 1),
            ("Work", 1, 1),
            ("Work", 1, 2),
            ("Work", 1, 3)
        ]
    );
    // The step succeeded on attempt 1 and was replayed from its record on attempts 2 and 3.
    assert_eq!(worker.effects.load(Ordering::SeqCst), 1);
    let failures = rt.store().failures("r").await.unwrap();
    assert_eq!(failures.len(), 2);
    assert_eq!(failures[0].0, 1);
    assert_eq!(failures[0].1.attempt, 1);
    assert_eq!(failures[0].1.source, FailureSource::Handler);
    assert_eq!(
        failures[0].1.errors,
        vec!["work failed on attempt 1".to_owned()]
    );
    assert_eq!(
        failures[1].1.errors,
        vec!["work failed on attempt 2".to_owned()]
    );
    let steps = rt.store().steps("r", 1).await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(
        (steps[0].0.as_str(), steps[0].1, steps[0].2.attempt),
        ("effect", 0, 1)
    );
    assert_eq!(steps[0].2.output.get(), "0");
}

#[tokio::test]
async fn attempts_run_out_then_explicit_retry_resumes() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder().retry(fast_retry(2)).open(&path).unwrap();
    let worker = Worker {
        fail_work: 5,
        ..Worker::default()
    };
    let err = rt.run("r", Job::Start { n: 0 }, &worker).await.unwrap_err();
    match &err {
        Error::RunFailed {
            run_id,
            state,
            seq,
            attempts,
            last_error,
            source,
            interrupted: 0,
        } => {
            assert_eq!(
                (run_id.as_str(), state.as_str(), *seq, *attempts),
                ("r", "Work", 1, 2)
            );
            assert_eq!(last_error, &vec!["work failed on attempt 2".to_owned()]);
            assert_eq!(
                source.as_ref().unwrap().to_string(),
                "work failed on attempt 2"
            );
        }
        other => panic!("expected RunFailed, got {other:?}"),
    }
    let info = rt.run_info("r").await.unwrap().unwrap();
    assert_eq!(info.status, RunStatus::Failed);
    assert_eq!(
        rt.list_runs(RunStatus::Failed, None).await.unwrap()[0].run_id,
        "r"
    );

    // A failed run stays failed until retried explicitly.
    let again = rt.run("r", Job::Start { n: 0 }, &worker).await.unwrap_err();
    assert!(matches!(
        again,
        Error::RunFailed {
            attempts: 2,
            source: None,
            ..
        }
    ));
    assert_eq!(worker.calls().len(), 3);

    let worker2 = Worker {
        fail_work: 3,
        ..Worker::default()
    };
    rt.retry("r").await.unwrap();
    assert!(matches!(
        rt.retry("r").await,
        Err(Error::NotFailed {
            status: RunStatus::Running,
            ..
        })
    ));
    let done = rt.run("r", Job::Start { n: 0 }, &worker2).await.unwrap();
    assert_eq!(done, Job::Done { acc: 0 });
    // Attempt numbers go on after the retry (3 and 4); attempt 4 passes `fail_work: 3`.
    assert_eq!(worker2.calls(), vec![("Work", 1, 3), ("Work", 1, 4)]);
    assert_eq!(
        worker2.effects.load(Ordering::SeqCst),
        0,
        "the step replays from attempt 1"
    );
    let seqs: Vec<u64> = rt
        .store()
        .history("r")
        .await
        .unwrap()
        .iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(seqs, vec![0, 1, 2]);
}

#[tokio::test]
async fn retry_policies_are_chosen_per_state_then_workflow_then_runtime() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder()
        .retry(RetryPolicy::attempts(9))
        .workflow_retry::<Job>(RetryPolicy::attempts(5))
        .state_retry(JobState::Work, RetryPolicy::attempts(2))
        .open(&path)
        .unwrap();
    assert_eq!(
        rt.inner
            .config
            .settings
            .retry_policy::<Job>(JobState::Work)
            .max_attempts,
        2
    );
    assert_eq!(
        rt.inner
            .config
            .settings
            .retry_policy::<Job>(JobState::Start)
            .max_attempts,
        5
    );
    assert_eq!(
        rt.inner
            .config
            .settings
            .retry_policy::<Gate>(GateState::Ask)
            .max_attempts,
        9
    );
}

#[tokio::test]
async fn interrupted_attempts_are_counted_durably() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder()
        .retry(fast_retry(5).with_max_interruptions(2))
        .open(&path)
        .unwrap();
    let slow = Worker {
        work_delay: Duration::from_secs(60),
        ..Worker::default()
    };
    // Drop the driver while `Work` runs: its attempt is cut short, as by a crash.
    for _ in 0..2 {
        let run = rt.run("r", Job::Start { n: 0 }, &slow);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), run)
                .await
                .is_err()
        );
    }
    let err = rt.run("r", Job::Start { n: 0 }, &slow).await.unwrap_err();
    assert!(
        matches!(err, Error::RunFailed { attempts: 2, .. }),
        "{err:?}"
    );
    let failures = rt.store().failures("r").await.unwrap();
    assert_eq!(failures.len(), 2);
    assert!(
        failures
            .iter()
            .all(|(_, f)| f.source == FailureSource::Interrupted)
    );
    assert_eq!(
        failures.iter().map(|(_, f)| f.attempt).collect::<Vec<_>>(),
        vec![1, 2]
    );
}

#[tokio::test]
async fn schema_change_is_refused_and_writes_nothing() {
    let (_dir, path) = temp_store();
    {
        // Leave the run unfinished: stop driving it while `Work` runs.
        let rt = Runtime::open(&path).unwrap();
        let slow = Worker {
            work_delay: Duration::from_secs(60),
            ..Worker::default()
        };
        let run = rt.run("r", Job::Start { n: 1 }, &slow);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), run)
                .await
                .is_err()
        );
    }
    let before = std::fs::read(&path).unwrap();
    // Declared at open, with the strict check: refused before the file is opened for
    // writing.
    let err = Runtime::builder()
        .workflow::<JobV2>()
        .strict_schemas(true)
        .open(&path)
        .unwrap_err();
    assert!(
        matches!(&err, Error::SchemaMismatch { run_id, changes, .. } if run_id == "r" && changes.len() == 1),
        "{err:?}"
    );
    assert!(
        std::fs::read(&path).unwrap() == before,
        "the refusal changed the file"
    );
    // Without the strict check (the default), the store opens; driven as `JobV2`, the run is
    // refused and marked blocked, its records unchanged.
    let history_before: Vec<String> = {
        let rt = Runtime::builder().workflow::<JobV2>().open(&path).unwrap();
        rt.history::<Job>("r")
            .await
            .unwrap()
            .iter()
            .map(|t| t.state.name().to_owned())
            .collect()
    };
    assert_eq!(history_before, ["Start", "Work"]);
    {
        let rt = Runtime::open(&path).unwrap();
        let err = rt
            .run("r", JobV2::Start { n: 1 }, &Worker::default())
            .await
            .unwrap_err();
        match err {
            Error::SchemaMismatch {
                run_id,
                workflow,
                stored,
                compiled,
                changes,
            } => {
                assert_eq!((run_id.as_str(), workflow.as_str()), ("r", "job"));
                assert_eq!(stored, Job::SCHEMA_HASH.pinned());
                assert_eq!(compiled, JobV2::SCHEMA_HASH.pinned());
                assert_eq!(
                    changes.texts(),
                    ["state `Start`: field `n` changed from `u32` to `u64`"]
                );
                assert_eq!(changes.changes()[0].class, crate::schema::Class::Compatible);
            }
            other => panic!("expected SchemaMismatch, got {other:?}"),
        }
    }
    let content_blocked = dump(&path);
    {
        let rt = Runtime::open(&path).unwrap();
        let info = rt.run_info("r").await.unwrap().unwrap();
        assert_eq!(
            (info.status, info.state.as_str(), info.seq),
            (RunStatus::Blocked, "Work", 1)
        );
        let block = info.block.expect("a blocked run says why");
        assert_eq!(block.resume, RunStatus::Running);
        assert_eq!(block.schema, Job::SCHEMA_HASH.pinned());
        assert_eq!(block.changes.len(), 1);
        assert!(
            block.changes[0].starts_with("state `Start`: field `n` changed from `u32` to `u64`"),
            "{:?}",
            block.changes
        );
        assert_eq!(rt.history::<Job>("r").await.unwrap().len(), 2);
        // Refused again: the run is blocked already, and nothing is written.
        assert!(matches!(
            rt.run("r", JobV2::Start { n: 1 }, &Worker::default()).await,
            Err(Error::SchemaMismatch { .. })
        ));
    }
    assert_eq!(dump(&path), content_blocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_driver_refused_for_its_schema_is_not_retried() {
    let (_dir, path) = temp_store();
    {
        // Leave the run unfinished: stop driving it while `Work` runs.
        let rt = Runtime::open(&path).unwrap();
        let slow = Worker {
            work_delay: Duration::from_secs(60),
            ..Worker::default()
        };
        let run = rt.run("r", Job::Start { n: 1 }, &slow);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), run)
                .await
                .is_err()
        );
    }
    let content_before = dump(&path);
    {
        // A build that registers another shape of `job` (no pre-check: `open`, then
        // `register`) and resumes its runs in the background.
        let rt = Runtime::open(&path).unwrap();
        rt.register::<JobV2, _>(Worker::default());
        let resumed = rt.resume_all().await.unwrap();
        assert_eq!(
            resumed
                .driven
                .iter()
                .map(|i| i.run_id.as_str())
                .collect::<Vec<_>>(),
            ["r"]
        );
        // Its driver refuses the run and ends; it arms no timer to try again.
        for _ in 0..500 {
            if rt.inner.background.live_tasks() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(rt.inner.background.live_tasks(), 0);
        assert_eq!(rt.inner.background.armed_timers(), 0);
        // Blocked, once; its records as they were.
        let info = rt.run_info("r").await.unwrap().unwrap();
        assert_eq!(
            (info.status, info.state.as_str(), info.seq),
            (RunStatus::Blocked, "Work", 1)
        );
        assert_eq!(info.block.map(|b| b.resume), Some(RunStatus::Running));
        assert_eq!(rt.history::<Job>("r").await.unwrap().len(), 2);
    }
    assert_ne!(dump(&path), content_before);
    let content_blocked = dump(&path);
    {
        // The same build again: the run is blocked already; nothing is written.
        let rt = Runtime::open(&path).unwrap();
        rt.register::<JobV2, _>(Worker::default());
        rt.resume_all().await.unwrap();
        for _ in 0..500 {
            if rt.inner.background.live_tasks() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(rt.inner.background.live_tasks(), 0);
    }
    assert_eq!(dump(&path), content_blocked);
}

/// Every key and value of every table, as text.
fn dump(path: &std::path::Path) -> Vec<String> {
    use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableHandle};
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let mut out = Vec::new();
    for handle in txn.list_tables().unwrap() {
        let name = handle.name().to_owned();
        let table = txn.open_untyped_table(handle).unwrap();
        out.push(format!("{name}: {} entries", table.len().unwrap()));
    }
    let runs = txn.open_table(crate::store::redb::RUNS).unwrap();
    for e in runs.iter().unwrap() {
        let (k, v) = e.unwrap();
        out.push(format!(
            "{} = {}",
            k.value(),
            String::from_utf8_lossy(v.value())
        ));
    }
    out
}

#[tokio::test]
async fn wrong_workflow_and_bad_input_are_refused() {
    let (_dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    let worker = Worker::default();
    rt.run("r", Job::Start { n: 0 }, &worker).await.unwrap();
    assert!(matches!(
        rt.history::<Other>("r").await,
        Err(Error::WorkflowMismatch {
            requested: "other",
            ..
        })
    ));
    for (id, reason) in [
        ("", "empty"),
        ("a\nb", "contains control characters"),
        (&"x".repeat(257)[..], "longer than 256 bytes"),
    ] {
        match rt.run(id, Job::Start { n: 0 }, &worker).await {
            Err(Error::InvalidRunId { reason: r, .. }) => assert_eq!(r, reason),
            other => panic!("expected InvalidRunId for {id:?}, got {other:?}"),
        }
    }
    // An invalid event name or idempotency key: the message says which of the two it is.
    let err = rt.send("r", "", &1).await.unwrap_err();
    assert_eq!(err.to_string(), "run `r`: invalid event name \"\": empty");
    let err = rt.send_with_key("r", "go", "", &1).await.unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidName {
            what: "idempotency key",
            reason: "empty",
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        "run `r`: invalid idempotency key \"\": empty"
    );
    assert!(matches!(
        rt.run("new", Job::Work { n: 0, acc: 0 }, &worker).await,
        Err(Error::NotInitial {
            initial: "Start",
            given: "Work",
            ..
        })
    ));
    assert!(rt.run_info("new").await.unwrap().is_none());
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = crate)]
enum Other {
    #[initial]
    #[terminal]
    Only,
}

#[tokio::test]
async fn second_open_is_refused_at_once() {
    let (_dir, path) = temp_store();
    let _rt = Runtime::open(&path).unwrap();
    match Runtime::open(&path) {
        Err(Error::StoreLocked { path: p }) => assert_eq!(p, path),
        other => panic!("expected StoreLocked, got {other:?}"),
    }
}

/// Threads that open a store that does not exist yet, all at once: one creates it and has it,
/// every other one is refused with `StoreLocked` (not an I/O error about another's temporary
/// file), and no temporary file is left beside it.
#[test]
fn concurrent_opens_of_a_new_store_lock_out_all_but_one() {
    const THREADS: usize = 8;
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let barrier = std::sync::Barrier::new(THREADS);
        let results: Vec<Result<RedbStore>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        RedbStore::open(&path)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let opened = results.iter().filter(|r| r.is_ok()).count();
        let locked = results
            .iter()
            .filter(|r| matches!(r, Err(Error::StoreLocked { path: p }) if *p == path))
            .count();
        let others: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .filter(|e| !matches!(e, Error::StoreLocked { .. }))
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            (opened, locked, others),
            (1, THREADS - 1, Vec::new()),
            "round {round}"
        );
        drop(results);
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["store.redb"], "round {round}");
    }
}

/// A temporary file left by a creation that was killed is removed by the next creation: at
/// once when its process is gone (Linux), else once it is a minute old. One whose process
/// runs, or that someone holds locked, may be a creation in progress and is left alone.
#[test]
fn a_creation_removes_only_abandoned_temporary_files() {
    let dir = tempfile::tempdir().unwrap();
    // A process id that is not running: a child that has exited.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let dead = child.id();
    let me = std::process::id();
    let name = |pid: u32, n: u32| format!(".store.redb.new-{pid}-{n}");
    let dead_young = dir.path().join(name(dead, 0));
    let dead_locked = dir.path().join(name(dead, 1));
    let live_young = dir.path().join(name(me, 900));
    let live_old = dir.path().join(name(me, 901));
    let unparsable_young = dir.path().join(".store.redb.new-x");
    for file in [
        &dead_young,
        &dead_locked,
        &live_young,
        &live_old,
        &unparsable_young,
    ] {
        std::fs::write(file, b"half made").unwrap();
    }
    let old = std::time::SystemTime::now() - Duration::from_secs(61);
    std::fs::File::options()
        .write(true)
        .open(&live_old)
        .unwrap()
        .set_modified(old)
        .unwrap();
    // Held as a running creation holds redb's lock on its file.
    let holder = std::fs::File::open(&dead_locked).unwrap();
    holder.lock().unwrap();
    drop(RedbStore::open(dir.path().join("store.redb")).unwrap());
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut expected = vec![
        name(dead, 1),
        name(me, 900),
        ".store.redb.new-x".to_owned(),
        "store.redb".to_owned(),
    ];
    if !cfg!(target_os = "linux") {
        // Without /proc, only age tells.
        expected.push(name(dead, 0));
    }
    expected.sort();
    assert_eq!(names, expected);
    drop(holder);
}

#[cfg(unix)]
#[tokio::test]
async fn store_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/deeper/store.redb");
    drop(Runtime::open(&path).unwrap());
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
}

#[tokio::test]
async fn cancel_ends_idle_runs_at_once_and_running_runs_at_a_boundary() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder()
        .retry(RetryPolicy::never())
        .open(&path)
        .unwrap();
    let failing = Worker {
        fail_work: 1,
        ..Worker::default()
    };
    rt.run("idle", Job::Start { n: 0 }, &failing)
        .await
        .unwrap_err();
    assert!(matches!(
        rt.cancel("idle", "no longer needed").await,
        Err(Error::RunEnded {
            status: RunStatus::Failed,
            ..
        })
    ));
    assert!(matches!(
        rt.cancel("nope", "x").await,
        Err(Error::RunNotFound { .. })
    ));
    match rt.cancel("idle", " ").await {
        Err(e @ Error::InvalidName { .. }) => assert_eq!(
            e.to_string(),
            "run `idle`: invalid cancellation reason \" \": empty: say why the run is cancelled"
        ),
        other => panic!("expected InvalidName, got {other:?}"),
    }

    let slow = Worker {
        work_delay: Duration::from_millis(300),
        ..Worker::default()
    };
    let driver = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.run("busy", Job::Start { n: 5 }, &slow).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let info = rt.cancel("busy", "operator said so").await.unwrap();
    assert_eq!(
        info.status,
        RunStatus::Running,
        "a driven run ends at its next boundary"
    );
    match driver.await.unwrap() {
        Err(Error::RunCancelled { run_id, reason, .. }) => {
            assert_eq!(
                (run_id.as_str(), reason.as_str()),
                ("busy", "operator said so")
            );
        }
        other => panic!("expected RunCancelled, got {other:?}"),
    }
    let info = rt.run_info("busy").await.unwrap().unwrap();
    assert_eq!(info.status, RunStatus::Cancelled);
    // The attempt in flight ran to its end, but its next state was not committed: the run
    // ended where the cancellation found it.
    assert_eq!((info.state.as_str(), info.seq), ("Work", 1));
    assert_eq!(
        rt.store()
            .history("busy")
            .await
            .unwrap()
            .iter()
            .map(|r| r.state.as_str())
            .collect::<Vec<_>>(),
        ["Start", "Work"]
    );
    assert!(matches!(
        rt.cancel("busy", "again").await,
        Err(Error::RunEnded {
            status: RunStatus::Cancelled,
            ..
        })
    ));
}

#[tokio::test]
async fn a_run_is_driven_once_at_a_time() {
    let (_dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    let slow = Worker {
        work_delay: Duration::from_millis(200),
        ..Worker::default()
    };
    let first = rt.run("r", Job::Start { n: 0 }, &slow);
    let second = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        rt.run("r", Job::Start { n: 0 }, &slow).await
    };
    let (a, b) = tokio::join!(first, second);
    assert_eq!(a.unwrap(), Job::Done { acc: 0 });
    assert!(matches!(b, Err(Error::RunActive { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_a_run_that_is_driven_already_returns_its_status() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder()
        .register::<Job, _>(Worker {
            work_delay: Duration::from_millis(300),
            ..Worker::default()
        })
        .open(&path)
        .unwrap();
    let first = rt.start("r", Job::Start { n: 0 }).await.unwrap();
    assert_eq!((first.status, first.seq), (RunStatus::Running, 0));
    // The background driver is inside `Work` (its handler sleeps): starting again finds it.
    until_state(&rt, "r", "Work").await;
    let again = rt.start("r", Job::Start { n: 0 }).await.unwrap();
    assert_eq!(
        (again.status, again.state.as_str(), again.seq),
        (RunStatus::Running, "Work", 1)
    );
    // Another version of the workflow, not registered, cannot start anything.
    assert!(matches!(
        rt.start("r", JobV2::Start { n: 0 }).await,
        Err(Error::NotRegistered { .. })
    ));
    assert_eq!(rt.wait::<Job>("r").await.unwrap(), Job::Done { acc: 0 });
    // One driver ran it: each state's handler once.
    let history: Vec<u64> = rt
        .history::<Job>("r")
        .await
        .unwrap()
        .iter()
        .map(|t| t.seq)
        .collect();
    assert_eq!(history, vec![0, 1, 2]);
}

async fn until_state(rt: &Runtime, run_id: &str, state: &str) {
    for _ in 0..500 {
        if rt
            .run_info(run_id)
            .await
            .unwrap()
            .is_some_and(|i| i.state == state)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("run {run_id} never reached {state}");
}

#[tokio::test]
async fn state_time_out_is_a_failed_attempt() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder()
        .retry(fast_retry(2))
        .state_timeout(JobState::Work, Duration::from_millis(50))
        .open(&path)
        .unwrap();
    let slow = Worker {
        work_delay: Duration::from_secs(10),
        ..Worker::default()
    };
    let err = rt.run("r", Job::Start { n: 0 }, &slow).await.unwrap_err();
    match err {
        Error::RunFailed {
            attempts,
            last_error,
            ..
        } => {
            assert_eq!(attempts, 2);
            assert_eq!(
                last_error,
                vec![
                    "run `r`: handler of state `Work` (seq 1, attempt 2) timed out after 50 ms"
                        .to_owned()
                ]
            );
        }
        other => panic!("expected RunFailed, got {other:?}"),
    }
}

#[tokio::test]
async fn oversized_state_is_refused_before_writing() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder().max_payload_bytes(8).open(&path).unwrap();
    let err = rt
        .run("r", Job::Start { n: 1 }, &Worker::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::PayloadTooLarge {
                bytes: 17,
                limit: 8,
                seq: Some(0),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "run `r`: state `Start` at seq 0 is 17 bytes, over the 8-byte limit"
    );
    assert!(rt.run_info("r").await.unwrap().is_none());
}

#[tokio::test]
async fn oversized_event_payload_is_refused_without_a_seq() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder().max_payload_bytes(8).open(&path).unwrap();
    let err = rt
        .send("r", "approve", &"a long approval")
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::PayloadTooLarge {
                bytes: 17,
                limit: 8,
                seq: None,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "run `r`: payload of event `approve` is 17 bytes, over the 8-byte limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_runs_share_commits() {
    let (_dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    let worker = std::sync::Arc::new(Worker::default());
    let mut tasks = Vec::new();
    for i in 0..64u32 {
        let rt = rt.clone();
        let worker = worker.clone();
        tasks.push(tokio::spawn(async move {
            rt.run(&format!("run-{i}"), Job::Start { n: i % 4 }, &*worker)
                .await
        }));
    }
    let mut finals = HashMap::new();
    for (i, t) in tasks.into_iter().enumerate() {
        finals.insert(i as u32, t.await.unwrap().unwrap());
    }
    for i in 0..64u32 {
        let n = u64::from(i % 4);
        let expect = (0..=n).map(|k| k * 10).sum::<u64>();
        assert_eq!(finals[&i], Job::Done { acc: expect });
        let seqs: Vec<u64> = rt
            .store()
            .history(&format!("run-{i}"))
            .await
            .unwrap()
            .iter()
            .map(|r| r.seq)
            .collect();
        assert_eq!(seqs, (0..=n + 2).collect::<Vec<_>>());
    }
    assert_eq!(
        rt.list_runs(RunStatus::Completed, Some("job"))
            .await
            .unwrap()
            .len(),
        64
    );
}

/// A transition record's stored bytes with its commit time zeroed.
fn record_bytes_but_time(record: &TransitionRecord) -> Vec<u8> {
    let mut record = record.clone();
    record.at_ms = 0;
    serde_json::to_vec(&record).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_run_is_stored_and_resumes_like_a_run_built_by_the_runtime() {
    let (_dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    rt.run("built", Job::Start { n: 2 }, &Worker::default())
        .await
        .unwrap();
    let built = rt.history::<Job>("built").await.unwrap();
    let values = |n: usize, id: &str| {
        built[..n]
            .iter()
            .map(|t| (id.to_owned(), t.value.clone()))
            .collect::<Vec<_>>()
    };
    let store = rt.redb().unwrap();
    assert_eq!(
        store.__seed_history(values(built.len(), "whole")).unwrap(),
        5
    );
    assert_eq!(store.__seed_history(values(3, "partial")).unwrap(), 3);

    // The same records and row as the runtime wrote, but for the times.
    let raw = |id: &str| store.history(id).unwrap();
    let built_raw: Vec<Vec<u8>> = raw("built").iter().map(record_bytes_but_time).collect();
    let whole_raw: Vec<Vec<u8>> = raw("whole").iter().map(record_bytes_but_time).collect();
    assert_eq!(whole_raw, built_raw);
    let row_but_times = |id: &str| {
        let mut info = store.run(id).unwrap().unwrap();
        info.run_id.clear();
        info.created_ms = 0;
        info.updated_ms = 0;
        info
    };
    assert_eq!(row_but_times("whole"), row_but_times("built"));
    let partial = store.run("partial").unwrap().unwrap();
    assert_eq!(
        (partial.status, partial.state.as_str(), partial.seq),
        (RunStatus::Running, "Work", 2)
    );

    // Resumed, it ends like the built run: only the states after the seed are handled, the
    // first one as a new attempt (as after a crash).
    let worker = Worker::default();
    let done = rt
        .run("partial", Job::Start { n: 9 }, &worker)
        .await
        .unwrap();
    assert_eq!(done, built.last().unwrap().value);
    assert_eq!(worker.calls(), vec![("Work", 2, 2), ("Work", 3, 1)]);
    let resumed: Vec<(u64, Job)> = rt
        .history::<Job>("partial")
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.seq, t.value))
        .collect();
    let expected: Vec<(u64, Job)> = built.iter().map(|t| (t.seq, t.value.clone())).collect();
    assert_eq!(resumed, expected);

    // Seeding an existing run is refused.
    assert!(matches!(
        store.__seed_history(values(1, "built")),
        Err(Error::SequenceConflict { seq: 0, .. })
    ));
}

#[tokio::test]
async fn a_step_whose_type_changed_is_a_typed_error() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder()
        .retry(RetryPolicy::never())
        .open(&path)
        .unwrap();
    let worker = Worker {
        fail_work: 1,
        ..Worker::default()
    };
    rt.run("r", Job::Start { n: 0 }, &worker).await.unwrap_err();
    rt.retry("r").await.unwrap();
    // Drive the run with a handler whose `effect` step now returns a String.
    let err = rt
        .run("r", Job::Start { n: 0 }, &Changed)
        .await
        .unwrap_err();
    let Error::RunFailed { source, .. } = err else {
        panic!("expected RunFailed, got {err:?}");
    };
    let source = source.unwrap();
    let inner = source.downcast_ref::<Error>().unwrap();
    assert!(
        matches!(inner, Error::StepDecode { step, occurrence: 0, seq: 1, state: "Work", .. } if step == "effect"),
        "{inner:?}"
    );
}

struct Changed;

impl Changed {
    /// What every state does.
    async fn dispatch<T>(ctx: &Context) -> Result<T, BoxError> {
        let s: String = ctx
            .step("effect", || async { Ok("new".to_owned()) })
            .await?;
        Err(format!("unreachable: {s}").into())
    }
}

impl JobHandler for Changed {
    type Error = BoxError;
    async fn start(&self, ctx: &Context, _: u32) -> Result<StartNext, BoxError> {
        Changed::dispatch(ctx).await
    }
    async fn work(&self, ctx: &Context, _: u32, _: u64) -> Result<WorkNext, BoxError> {
        Changed::dispatch(ctx).await
    }
}

#[tokio::test]
async fn idempotency_keys_are_stable_and_distinct() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder().retry(fast_retry(2)).open(&path).unwrap();
    let keys = Mutex::new(Vec::new());
    let probe = KeyProbe(&keys);
    rt.run("r", Job::Start { n: 0 }, &probe).await.unwrap_err();
    let k = keys.lock().unwrap().clone();
    assert_eq!(k.len(), 6, "two attempts, three keys each");
    assert_eq!(k[..3], k[3..], "every attempt gets the same keys");
    assert!(k[0].starts_with("lk-") && k[0].len() == 35);
    assert_ne!(k[0], k[1], "the second use of a name gets its own key");
    assert_ne!(k[0], k[2]);
    // Another run gets other keys.
    rt.run("r2", Job::Start { n: 0 }, &probe).await.unwrap_err();
    assert_ne!(keys.lock().unwrap()[6], k[0]);
}

struct KeyProbe<'a>(&'a Mutex<Vec<String>>);

impl JobHandler for KeyProbe<'_> {
    type Error = BoxError;
    async fn start(&self, ctx: &Context, _: u32) -> Result<StartNext, BoxError> {
        self.dispatch(ctx)
    }
    async fn work(&self, ctx: &Context, _: u32, _: u64) -> Result<WorkNext, BoxError> {
        self.dispatch(ctx)
    }
}

impl KeyProbe<'_> {
    /// What every state does.
    fn dispatch<T>(&self, ctx: &Context) -> Result<T, BoxError> {
        let p = self;
        let mut keys = p.0.lock().unwrap();
        keys.push(ctx.idempotency_key("push")?);
        keys.push(ctx.idempotency_key("push")?);
        keys.push(ctx.idempotency_key("pr")?);
        assert!(matches!(
            ctx.idempotency_key(""),
            Err(Error::InvalidName {
                what: "key name",
                ..
            })
        ));
        Err("stop".into())
    }
}

/// Panics in `Start` after its step, on attempts up to `panics_until`.
#[derive(Default)]
struct Panicker {
    panics_until: u32,
    effects: AtomicU32,
}

impl JobHandler for Panicker {
    type Error = BoxError;
    async fn start(&self, ctx: &Context, n: u32) -> Result<StartNext, BoxError> {
        let p = self;
        ctx.step("effect", || async {
            p.effects.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .await?;
        if ctx.attempt() <= p.panics_until {
            panic!("no plan in the model's answer for {n}");
        }
        Ok(StartNext::Work { n, acc: 0 })
    }
    async fn work(&self, _: &Context, _: u32, acc: u64) -> Result<WorkNext, BoxError> {
        Ok(WorkNext::Done { acc })
    }
}

#[tokio::test]
async fn a_panicking_handler_is_a_failed_attempt_and_retried() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder().retry(fast_retry(3)).open(&path).unwrap();
    let p = Panicker {
        panics_until: 1,
        ..Panicker::default()
    };
    let done = rt.run("r", Job::Start { n: 7 }, &p).await.unwrap();
    assert_eq!(done, Job::Done { acc: 0 });
    // The step before the panic was recorded, and replayed by attempt 2.
    assert_eq!(p.effects.load(Ordering::SeqCst), 1);
    let failures = rt.store().failures("r").await.unwrap();
    assert_eq!(failures.len(), 1);
    assert_eq!((failures[0].0, failures[0].1.attempt), (0, 1));
    assert_eq!(failures[0].1.source, FailureSource::Handler);
    assert_eq!(
        failures[0].1.errors,
        vec![
            "run `r`: handler of state `Start` (seq 0, attempt 1) panicked: no plan in the \
             model's answer for 7"
                .to_owned()
        ]
    );
    let states: Vec<_> = rt
        .history::<Job>("r")
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.seq, t.value))
        .collect();
    assert_eq!(
        states,
        vec![
            (0, Job::Start { n: 7 }),
            (1, Job::Work { n: 7, acc: 0 }),
            (2, Job::Done { acc: 0 })
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_run_whose_handler_always_panics_ends_failed() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder()
        .retry(fast_retry(2))
        .register::<Job, _>(Panicker {
            panics_until: u32::MAX,
            ..Panicker::default()
        })
        .open(&path)
        .unwrap();
    rt.start("bg", Job::Start { n: 1 }).await.unwrap();
    // Before panics were caught, the driver's task died and this waited forever.
    let err = tokio::time::timeout(Duration::from_secs(20), rt.wait::<Job>("bg"))
        .await
        .expect("the run ends")
        .unwrap_err();
    let Error::RunFailed {
        run_id,
        state,
        seq,
        attempts,
        last_error,
        ..
    } = &err
    else {
        panic!("expected RunFailed, got {err:?}");
    };
    assert_eq!(
        (run_id.as_str(), state.as_str(), *seq, *attempts),
        ("bg", "Start", 0, 2)
    );
    assert_eq!(
        last_error,
        &vec![
            "run `bg`: handler of state `Start` (seq 0, attempt 2) panicked: no plan in the \
             model's answer for 1"
                .to_owned()
        ]
    );
    let info = rt.run_info("bg").await.unwrap().unwrap();
    assert_eq!((info.status, info.attempt), (RunStatus::Failed, 2));
}

#[tokio::test]
async fn a_keyed_step_gets_the_same_key_on_every_execution() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder().retry(fast_retry(2)).open(&path).unwrap();
    let probe = KeyedProbe::default();
    rt.run("r", Job::Start { n: 0 }, &probe).await.unwrap_err();
    let seen = probe.seen.lock().unwrap().clone();
    let [k0, k1, k1_again, r0, plain0, plain1] = &seen[..] else {
        panic!("{seen:?}");
    };
    // Attempt 1 ran both steps (the second failed); attempt 2 replayed the first (its closure
    // did not run, its recorded output is its key) and ran the second again with its key.
    assert_eq!(k1, k1_again);
    assert_eq!(r0, k0);
    assert_ne!(k0, k1);
    // The same keys as `idempotency_key`'s first and second for the name.
    assert_eq!((plain0, plain1), (k0, k1));
    assert!(k0.starts_with("lk-") && k0.len() == 35);
    // Keys never change between versions of loops: outside systems hold them.
    assert_eq!(
        (k0.as_str(), k1.as_str()),
        (
            "lk-043a10901c564882dce7a99046dacaa8",
            "lk-e692be642c046a10dedb5d51c2ca884b"
        )
    );
    assert_eq!(probe.attempts.load(Ordering::SeqCst), 2);
}

#[derive(Default)]
struct KeyedProbe {
    /// Keys the closures saw, then the first step's output on attempt 2, then the plain keys.
    seen: Mutex<Vec<String>>,
    attempts: AtomicU32,
}

impl JobHandler for KeyedProbe {
    type Error = BoxError;
    async fn start(&self, ctx: &Context, _: u32) -> Result<StartNext, BoxError> {
        self.dispatch(ctx).await
    }
    async fn work(&self, ctx: &Context, _: u32, _: u64) -> Result<WorkNext, BoxError> {
        self.dispatch(ctx).await
    }
}

impl KeyedProbe {
    /// What every state does.
    async fn dispatch<T>(&self, ctx: &Context) -> Result<T, BoxError> {
        let p = self;
        let attempt = p.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        // Moved into the future and returned: a step without options takes an `FnOnce`.
        let mut out = String::new();
        let first: String = ctx
            .step_keyed("push", move |key| async move {
                p.seen.lock().unwrap().push(key.to_owned());
                out.push_str(key);
                Ok(out)
            })
            .await?;
        let second: Result<String, Error> = ctx
            .step_keyed("push", |key| async move {
                p.seen.lock().unwrap().push(key.to_owned());
                if attempt == 1 {
                    return Err("the push failed".into());
                }
                Ok(key.to_owned())
            })
            .await;
        if attempt == 1 {
            second.unwrap_err();
            return Err("stop".into());
        }
        second?;
        let mut seen = p.seen.lock().unwrap();
        seen.push(first);
        seen.push(ctx.idempotency_key("push")?);
        seen.push(ctx.idempotency_key("push")?);
        Err("stop".into())
    }
}

// ---------------------------------------------------------------------------------------------
// Waits, events and background driving.

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = crate)]
enum Gate {
    #[initial]
    #[next(Sleep)]
    Ask { doc: String },
    #[next(Done)]
    Sleep { by: String },
    #[terminal]
    Done { by: String, note: Option<String> },
}

struct Gatekeeper {
    sleep: Duration,
    note_timeout: Duration,
    /// (state, seq) of every handler entry.
    entries: Mutex<Vec<(&'static str, u64)>>,
}

impl Gatekeeper {
    fn new(sleep: Duration, note_timeout: Duration) -> Self {
        Gatekeeper {
            sleep,
            note_timeout,
            entries: Mutex::new(Vec::new()),
        }
    }
    fn entries(&self) -> Vec<(&'static str, u64)> {
        self.entries.lock().unwrap().clone()
    }
}

impl GateHandler for Gatekeeper {
    type Error = BoxError;
    async fn ask(&self, ctx: &Context, _: String) -> Result<AskNext, BoxError> {
        self.entries.lock().unwrap().push((ctx.state(), ctx.seq()));
        let by: String = ctx.wait_for("approval").await?;
        Ok(AskNext::Sleep { by })
    }
    async fn sleep(&self, ctx: &Context, by: String) -> Result<SleepNext, BoxError> {
        self.entries.lock().unwrap().push((ctx.state(), ctx.seq()));
        ctx.sleep(self.sleep).await?;
        let note: Option<String> = ctx.wait_for_timeout("note", self.note_timeout).await?;
        Ok(SleepNext::Done { by, note })
    }
}

async fn until_status(rt: &Runtime, run_id: &str, status: RunStatus) -> RunInfo {
    for _ in 0..500 {
        if let Some(info) = rt.run_info(run_id).await.unwrap()
            && info.status == status
        {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("run {run_id} never reached {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_run_waits_for_its_event() {
    let (_dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    let keeper = std::sync::Arc::new(Gatekeeper::new(Duration::ZERO, Duration::from_millis(50)));
    let driver = {
        let (rt, keeper) = (rt.clone(), keeper.clone());
        tokio::spawn(async move { rt.run("g", Gate::Ask { doc: "d".into() }, &*keeper).await })
    };
    let info = until_status(&rt, "g", RunStatus::Waiting).await;
    assert_eq!(
        info.wait,
        Some(WaitInfo {
            event: Some("approval".into()),
            until_ms: None
        })
    );
    let sent = rt.send("g", "approval", "alice").await.unwrap();
    assert_eq!(
        sent,
        Sent {
            event_seq: 0,
            duplicate: false
        }
    );
    let done = driver.await.unwrap().unwrap();
    assert_eq!(
        done,
        Gate::Done {
            by: "alice".into(),
            note: None
        }
    );
    // Ask was entered twice: once to park, once to take the event. Sleep's zero sleep returns
    // at once; its note wait parks and its time-out wakes it: two entries.
    assert_eq!(
        keeper.entries(),
        vec![("Ask", 0), ("Ask", 0), ("Sleep", 1), ("Sleep", 1)]
    );
    let events = rt.store().events("g").await.unwrap();
    assert_eq!(events.len(), 1);
    assert!(events[0].2, "delivered");
    assert_eq!(events[0].1.payload.get(), "\"alice\"");
    assert!(matches!(
        rt.send("g", "approval", "bob").await,
        Err(Error::RunEnded {
            status: RunStatus::Completed,
            ..
        })
    ));
    assert!(matches!(
        rt.send("nope", "approval", "bob").await,
        Err(Error::RunNotFound { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_sent_early_wait_in_order_and_duplicates_are_dropped() {
    let (_dir, path) = temp_store();
    let keeper = Gatekeeper::new(Duration::ZERO, Duration::from_secs(30));
    let rt = Runtime::builder()
        .register::<Gate, _>(keeper)
        .open(&path)
        .unwrap();
    rt.start("g", Gate::Ask { doc: "d".into() }).await.unwrap();
    let a = rt
        .send_with_key("g", "note", "k1", "first note")
        .await
        .unwrap();
    let b = rt
        .send_with_key("g", "note", "k1", "first note again")
        .await
        .unwrap();
    assert_eq!(
        a,
        Sent {
            event_seq: 0,
            duplicate: false
        }
    );
    assert_eq!(
        b,
        Sent {
            event_seq: 0,
            duplicate: true
        }
    );
    rt.send("g", "note", "second note").await.unwrap();
    rt.send("g", "approval", "carol").await.unwrap();
    let done: Gate = rt.wait("g").await.unwrap();
    assert_eq!(
        done,
        Gate::Done {
            by: "carol".into(),
            note: Some("first note".into())
        }
    );
    let events = rt.store().events("g").await.unwrap();
    let summary: Vec<(u64, &str, bool)> = events
        .iter()
        .map(|(seq, e, delivered)| (*seq, e.name.as_str(), *delivered))
        .collect();
    assert_eq!(
        summary,
        vec![(0, "note", true), (1, "note", false), (2, "approval", true)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_runs_hold_no_task_and_wake_on_events() {
    let (_dir, path) = temp_store();
    let keeper = Gatekeeper::new(Duration::ZERO, Duration::from_millis(1));
    let rt = Runtime::builder()
        .register::<Gate, _>(keeper)
        .open(&path)
        .unwrap();
    for i in 0..200 {
        rt.start(&format!("g{i}"), Gate::Ask { doc: "d".into() })
            .await
            .unwrap();
    }
    for i in 0..200 {
        until_status(&rt, &format!("g{i}"), RunStatus::Waiting).await;
    }
    // Give the parked drivers a moment to return, then count live tasks.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let live = rt.inner.background.live_tasks();
    assert_eq!(live, 0, "a waiting run holds no task");
    assert_eq!(
        rt.list_runs(RunStatus::Waiting, Some("gate"))
            .await
            .unwrap()
            .len(),
        200
    );
    for i in 0..200 {
        rt.send(&format!("g{i}"), "approval", &format!("user{i}"))
            .await
            .unwrap();
    }
    for i in 0..200 {
        let done: Gate = rt.wait(&format!("g{i}")).await.unwrap();
        assert_eq!(
            done,
            Gate::Done {
                by: format!("user{i}"),
                note: None
            }
        );
    }
    assert_eq!(
        rt.list_runs(RunStatus::Completed, Some("gate"))
            .await
            .unwrap()
            .len(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_survives_a_restart_and_sleeps_only_the_remainder() {
    // On a manual clock, so that load cannot move the times this test checks.
    let (_dir, path) = temp_store();
    let sleep = Duration::from_millis(1500);
    let clock = crate::ManualClock::new(std::time::UNIX_EPOCH + Duration::from_secs(1_000_000));
    let open = || {
        Runtime::builder()
            .clock(clock.clone())
            .park_threshold(Duration::from_millis(100))
            .register::<Gate, _>(Gatekeeper::new(sleep, Duration::from_millis(1)))
            .open(&path)
            .unwrap()
    };
    let slept_at = clock.now_ms();
    {
        let rt = open();
        rt.start("g", Gate::Ask { doc: "d".into() }).await.unwrap();
        rt.send("g", "approval", "dan").await.unwrap();
        let info = until(&rt, "g", |info| {
            info.state == "Sleep" && info.status == RunStatus::Waiting
        })
        .await;
        let wait = info.wait.unwrap();
        assert_eq!(wait.event, None);
        assert_eq!(
            wait.until_ms,
            Some(slept_at + 1500),
            "the wake-up is recorded 1.5 s ahead"
        );
        rt.shutdown().await;
    }
    // A new process, 0.5 s later: the run waits only for what remains of its sleep.
    clock.advance(Duration::from_millis(500));
    let rt = open();
    let found = rt.resume_all().await.unwrap();
    assert_eq!(found.len(), 1);
    clock.advance(Duration::from_millis(999));
    let info = rt.run_info("g").await.unwrap().unwrap();
    assert_eq!(
        (info.state.as_str(), info.status),
        ("Sleep", RunStatus::Waiting)
    );
    // At the recorded wake-up (not 1.5 s after the restart) it goes on to its note wait.
    clock.advance(Duration::from_millis(1));
    until(&rt, "g", |info| {
        info.state == "Sleep"
            && info
                .wait
                .as_ref()
                .is_some_and(|w| w.event.as_deref() == Some("note"))
    })
    .await;
    clock.advance(Duration::from_millis(1));
    let done: Gate = rt.wait("g").await.unwrap();
    assert_eq!(
        done,
        Gate::Done {
            by: "dan".into(),
            note: None
        }
    );
    let history = rt.history::<Gate>("g").await.unwrap();
    assert_eq!(history.last().map(|r| r.at_ms), Some(slept_at + 1501));
}

/// `Gate` with another shape (a field retyped) and no migration: a build that registers only
/// this version cannot route `Gate`'s runs.
mod gate_v2 {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "gate", crate = crate)]
    pub(super) enum GateV2 {
        #[initial]
        #[next(Done)]
        Ask { doc: u64 },
        #[terminal]
        Done { by: String },
    }

    impl GateV2Handler for Worker {
        type Error = BoxError;
        async fn ask(&self, _: &Context, _: u64) -> Result<AskNext, BoxError> {
            Err("GateV2 is never driven in these tests".into())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_all_blocks_a_waiting_run_that_no_registered_version_routes() {
    let (_dir, path) = temp_store();
    {
        let rt = Runtime::builder()
            .register::<Gate, _>(Gatekeeper::new(Duration::ZERO, Duration::from_millis(1)))
            .open(&path)
            .unwrap();
        rt.start("g", Gate::Ask { doc: "d".into() }).await.unwrap();
        until(&rt, "g", |info| info.status == RunStatus::Waiting).await;
        rt.shutdown().await;
    }
    // A build with another version only: the run waits for an event that may never come,
    // so it is blocked now, not when its event arrives.
    let rt = Runtime::builder()
        .register::<gate_v2::GateV2, _>(Worker::default())
        .open(&path)
        .unwrap();
    let found = rt.resume_all().await.unwrap();
    assert_eq!(found.len(), 1);
    let info = until(&rt, "g", |info| info.status == RunStatus::Blocked).await;
    assert_eq!((info.state.as_str(), info.seq), ("Ask", 0));
    assert!(info.block.is_some(), "{info:?}");
    let history = rt.store().history("g").await.unwrap();
    assert_eq!(history.len(), 1, "nothing but the block is written");
    rt.shutdown().await;
}

/// Polls the run every 10 ms until `cond` holds (at most 30 s of real time).
async fn until(rt: &Runtime, run_id: &str, cond: impl Fn(&RunInfo) -> bool) -> RunInfo {
    let mut last = None;
    for _ in 0..3000 {
        if let Some(info) = rt.run_info(run_id).await.unwrap() {
            if cond(&info) {
                return info;
            }
            last = Some(info);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("run {run_id} never met the condition; last {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_sent_while_no_runtime_drives_the_run_is_delivered_once() {
    let (_dir, path) = temp_store();
    {
        let rt = Runtime::builder()
            .register::<Gate, _>(Gatekeeper::new(Duration::ZERO, Duration::from_millis(1)))
            .open(&path)
            .unwrap();
        rt.start("g", Gate::Ask { doc: "d".into() }).await.unwrap();
        until_status(&rt, "g", RunStatus::Waiting).await;
        rt.shutdown().await;
    }
    {
        // An operator's process with no handler registered: the event is only recorded.
        let rt = Runtime::open(&path).unwrap();
        rt.send("g", "approval", "erin").await.unwrap();
        assert_eq!(
            rt.run_info("g").await.unwrap().unwrap().status,
            RunStatus::Waiting
        );
    }
    let keeper = std::sync::Arc::new(Gatekeeper::new(Duration::ZERO, Duration::from_millis(1)));
    let rt = Runtime::open(&path).unwrap();
    let done = rt
        .run(
            "g",
            Gate::Ask {
                doc: "ignored".into(),
            },
            &*keeper,
        )
        .await
        .unwrap();
    assert_eq!(
        done,
        Gate::Done {
            by: "erin".into(),
            note: None
        }
    );
    assert_eq!(keeper.entries()[0], ("Ask", 0));
    assert_eq!(rt.store().events("g").await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parked_run_ends_it() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder()
        .register::<Gate, _>(Gatekeeper::new(Duration::ZERO, Duration::from_millis(1)))
        .open(&path)
        .unwrap();
    rt.start("g", Gate::Ask { doc: "d".into() }).await.unwrap();
    until_status(&rt, "g", RunStatus::Waiting).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let info = rt.cancel("g", "not needed").await.unwrap();
    assert_eq!(info.status, RunStatus::Cancelled);
    assert!(matches!(
        rt.wait::<Gate>("g").await,
        Err(Error::RunCancelled { reason, .. }) if reason == "not needed"
    ));
}

// ---------------------------------------------------------------------------------------------
// Retention, compaction, read-only inspection.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_removes_only_expired_ended_runs_and_compact_reclaims_space() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder()
        .retry(RetryPolicy::never())
        .retention(RetentionPolicy::default().keep_last(2))
        .open(&path)
        .unwrap();
    let worker = Worker::default();
    for i in 0..40 {
        rt.run(&format!("done-{i:02}"), Job::Start { n: 20 }, &worker)
            .await
            .unwrap();
    }
    // One run stays unfinished (waiting), with an event in its inbox.
    let keeper = std::sync::Arc::new(Gatekeeper::new(Duration::ZERO, Duration::from_secs(60)));
    let waiting = {
        let (rt, keeper) = (rt.clone(), keeper.clone());
        tokio::spawn(async move {
            rt.run("open", Gate::Ask { doc: "d".into() }, &*keeper)
                .await
        })
    };
    until_status(&rt, "open", RunStatus::Waiting).await;
    rt.send("open", "note", "kept").await.unwrap();

    let dry = rt
        .prune_with(&RetentionPolicy::default().keep_last(2), true)
        .await
        .unwrap();
    assert_eq!((dry.runs, dry.records), (38, 38 * 23));
    assert_eq!(
        rt.list_runs(RunStatus::Completed, None)
            .await
            .unwrap()
            .len(),
        40
    );

    let before = rt.redb().unwrap().file_bytes().unwrap();
    let pruned = rt.prune().await.unwrap();
    assert_eq!((pruned.runs, pruned.records), (38, 38 * 23));
    let kept: Vec<String> = rt
        .list_runs(RunStatus::Completed, None)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.run_id)
        .collect();
    assert_eq!(kept.len(), 2);
    for id in &pruned.run_ids {
        assert!(rt.run_info(id).await.unwrap().is_none());
        assert!(rt.store().history(id).await.unwrap().is_empty());
        assert!(rt.store().steps(id, 1).await.unwrap().is_empty());
    }
    for id in &kept {
        assert_eq!(rt.store().history(id).await.unwrap().len(), 23);
        assert_eq!(rt.store().steps(id, 1).await.unwrap().len(), 1);
    }
    // The unfinished run and its inbox are untouched.
    assert_eq!(
        rt.run_info("open").await.unwrap().unwrap().status,
        RunStatus::Waiting
    );
    assert_eq!(rt.store().events("open").await.unwrap().len(), 1);

    let compacted = rt.compact().await.unwrap();
    assert_eq!(compacted.bytes_before, before);
    assert!(
        compacted.bytes_after < compacted.bytes_before,
        "{compacted:?}"
    );
    // Everything still works after compaction.
    rt.send("open", "approval", "fay").await.unwrap();
    assert_eq!(
        waiting.await.unwrap().unwrap(),
        Gate::Done {
            by: "fay".into(),
            note: Some("kept".into())
        }
    );
    assert!(rt.redb().unwrap().check_integrity().unwrap());
}

#[tokio::test]
async fn retention_selects_by_age_and_count() {
    let info = |id: &str, updated_ms: u64| RunInfo {
        run_id: id.into(),
        workflow: "w".into(),
        schema: SchemaHash::from_u64(0),
        status: RunStatus::Completed,
        state: "Done".into(),
        seq: 1,
        attempt: 1,
        attempt_base: 0,
        interrupted: 0,
        created_ms: 0,
        updated_ms,
        retry_at_ms: None,
        error: None,
        cancel: None,
        wait: None,
        block: None,
        entered: None,
        parent: None,
    };
    let runs = vec![info("a", 1_000), info("b", 5_000), info("c", 9_000)];
    let by_age = RetentionPolicy::older_than(Duration::from_millis(4_000));
    assert_eq!(
        by_age.select(runs.clone(), 10_000),
        vec!["a", "b"],
        "oldest first"
    );
    let by_count = RetentionPolicy::default().keep_last(1);
    assert_eq!(by_count.select(runs.clone(), 10_000), vec!["a", "b"]);
    assert!(RetentionPolicy::default().select(runs, 10_000).is_empty());
}

#[tokio::test]
async fn a_read_only_store_reads_and_refuses_writes() {
    let (_dir, path) = temp_store();
    {
        let rt = Runtime::open(&path).unwrap();
        rt.run("r", Job::Start { n: 1 }, &Worker::default())
            .await
            .unwrap();
        // A writer holds the file: read-only opens are refused at once.
        assert!(matches!(
            RedbStore::open_read_only(&path),
            Err(Error::StoreLocked { .. })
        ));
    }
    let store = RedbStore::open_read_only(&path).unwrap();
    assert_eq!(store.history("r").unwrap().len(), 4);
    assert_eq!(
        store.run("r").unwrap().unwrap().status,
        RunStatus::Completed
    );
    assert!(matches!(store.compact(), Err(Error::ReadOnly { .. })));
    let second = RedbStore::open_read_only(&path).unwrap();
    assert_eq!(second.list(RunStatus::Completed, None).unwrap().len(), 1);
    assert!(matches!(
        RedbStore::open_read_only(path.with_extension("missing")),
        Err(Error::Open { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_of_the_wrong_shape_is_set_aside_and_the_wait_goes_on() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder()
        .register::<Gate, _>(Gatekeeper::new(Duration::ZERO, Duration::from_millis(1)))
        .open(&path)
        .unwrap();
    rt.start("g", Gate::Ask { doc: "d".into() }).await.unwrap();
    // A mistyped approval (a number where the handler wants a name), then a good one.
    rt.send("g", "approval", &42).await.unwrap();
    let mut failures = Vec::new();
    for _ in 0..500 {
        failures = rt.store().failures("g").await.unwrap();
        if !failures.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(failures.len(), 1);
    assert_eq!(
        failures[0].1.source,
        FailureSource::Step {
            name: "loops:wait:approval".into(),
            occurrence: 0
        }
    );
    assert!(
        failures[0].1.errors[0].contains("event `approval` (event seq 0)"),
        "{:?}",
        failures[0].1.errors
    );
    rt.send("g", "approval", "gus").await.unwrap();
    let done: Gate = rt.wait("g").await.unwrap();
    assert_eq!(
        done,
        Gate::Done {
            by: "gus".into(),
            note: None
        }
    );
    // Both events were taken from the inbox, the bad one only to be set aside.
    let delivered: Vec<bool> = rt
        .store()
        .events("g")
        .await
        .unwrap()
        .iter()
        .map(|e| e.2)
        .collect();
    assert_eq!(delivered, vec![true, true]);
    assert_eq!(rt.store().failures("g").await.unwrap().len(), 1);
}

#[test]
fn messages_do_not_repeat_their_source() {
    let source = serde_json::from_str::<u32>("x").unwrap_err();
    let err = Error::Decode {
        run_id: "r".into(),
        record: RecordKind::Transition,
        seq: 3,
        state: "Work".into(),
        source,
    };
    assert_eq!(
        err.to_string(),
        "run `r`: transition record at seq 3 (state `Work`) does not decode"
    );
    assert_eq!(
        err.chain(),
        "run `r`: transition record at seq 3 (state `Work`) does not decode: expected value at line 1 column 1"
    );
    let long = "x".repeat(200);
    let err = crate::validate_run_id(&format!(" {long}")).unwrap_err();
    let text = err.to_string();
    assert!(
        text.len() < 160 && text.ends_with("(201 bytes): starts or ends with white space"),
        "{text}"
    );
}

#[test]
fn a_record_that_does_not_decode_is_named_for_what_it_is() {
    let decode = |record: RecordKind, seq: u64, state: &str| {
        Error::Decode {
            run_id: "r".into(),
            record,
            seq,
            state: state.into(),
            source: serde_json::from_str::<u32>("x").unwrap_err(),
        }
        .to_string()
    };
    let step = RecordKind::Step {
        name: "plan".into(),
        occurrence: 1,
    };
    for (got, want) in [
        (
            decode(RecordKind::Transition, 3, "?"),
            "run `r`: transition record at seq 3 does not decode",
        ),
        (
            decode(RecordKind::RunRow, 0, ""),
            "run `r`: run row does not decode",
        ),
        (
            decode(step, 3, ""),
            "run `r`: step record `plan`#1 of seq 3 does not decode",
        ),
        (
            decode(RecordKind::Failure, 2, ""),
            "run `r`: failure record of seq 2 does not decode",
        ),
        (
            decode(RecordKind::Event { name: None }, 0, ""),
            "run `r`: event record at event seq 0 does not decode",
        ),
        (
            decode(
                RecordKind::Event {
                    name: Some("approve".into()),
                },
                4,
                "",
            ),
            "run `r`: event record `approve` at event seq 4 does not decode",
        ),
        (
            decode(
                RecordKind::Wait {
                    event: "approve".into(),
                },
                5,
                "",
            ),
            "run `r`: recorded outcome of the wait for `approve` of seq 5 does not decode",
        ),
    ] {
        assert_eq!(got, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_all_claims_no_more_than_max_active_runs() {
    let (_dir, path) = temp_store();
    {
        let rt = Runtime::open(&path).unwrap();
        let slow = Worker {
            work_delay: Duration::from_secs(60),
            ..Worker::default()
        };
        for i in 0..5 {
            let id = format!("r{i}");
            let run = rt.run(&id, Job::Start { n: 0 }, &slow);
            assert!(
                tokio::time::timeout(Duration::from_millis(100), run)
                    .await
                    .is_err()
            );
        }
    }
    let rt = Runtime::builder()
        .max_active_runs(2)
        .register::<Job, _>(Worker {
            work_delay: Duration::from_secs(60),
            ..Worker::default()
        })
        .open(&path)
        .unwrap();
    assert_eq!(rt.resume_all().await.unwrap().len(), 2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rt.inner.active_count(), 2);
    // Full: a second pass claims nothing more.
    assert!(rt.resume_all().await.unwrap().is_empty());
    assert_eq!(rt.inner.active_count(), 2);
    rt.shutdown().await;
}

/// `silence_caught_redb_panics`: a redb panic that loops catches (a store file with one byte
/// flipped) no longer reaches the hook installed before, and the open still fails with a
/// typed error; a redb panic that loops does not catch, and any other panic, still do.
#[tokio::test]
async fn caught_redb_panics_are_silenced_and_others_passed_on() {
    use std::cell::RefCell;

    thread_local! {
        /// The locations of the panics the earlier hook saw on this thread, while recording.
        static SEEN: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
    }
    /// Runs `f`, and returns what it returned and the panics the earlier hook saw meanwhile.
    fn recorded<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
        SEEN.with(|s| *s.borrow_mut() = Some(Vec::new()));
        let out = f();
        (
            out,
            SEEN.with(|s| s.borrow_mut().take().unwrap_or_default()),
        )
    }
    let in_redb = |locations: &[String]| locations.iter().any(|l| l.contains("/redb-"));

    let (dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    for i in 0..3 {
        rt.run(&format!("r{i}"), Job::Start { n: 2 }, &Worker::default())
            .await
            .unwrap();
    }
    drop(rt);
    let good = std::fs::read(&path).unwrap();

    // The earlier hook: records this thread's panics while recording, passes others on.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let recorded = SEEN.with(|s| {
            s.borrow_mut().as_mut().map(|seen| {
                let location = info.location().map(ToString::to_string);
                seen.push(location.unwrap_or_default().replace('\\', "/"));
            })
        });
        if recorded.is_none() {
            default(info);
        }
    }));

    // A byte whose flip makes redb panic while it opens the file: the first page start (or,
    // failing that, 64-byte step) that does.
    let damaged = dir.path().join("damaged.redb");
    let flip = |offset: usize| {
        let mut bytes = good.clone();
        bytes[offset] ^= 0xff;
        std::fs::write(&damaged, bytes).unwrap();
    };
    // redb's own read-only open, without the verification that runs before it reads.
    let plain = |path: &std::path::Path| {
        RedbStore::open_read_only_with(
            path,
            StoreOptions {
                verify_on_open: false,
                ..StoreOptions::default()
            },
        )
    };
    let offset = (0..good.len())
        .step_by(4096)
        .chain((0..good.len()).step_by(64))
        .find(|&offset| {
            flip(offset);
            let (opened, seen) = recorded(|| plain(&damaged));
            // redb's open itself panics (not a later read of the file's format, which the
            // open also makes): the direct open below must panic the same way.
            let (direct, _) = recorded(|| {
                std::panic::catch_unwind(|| redb::Builder::new().open_read_only(&damaged))
            });
            in_redb(&seen) && matches!(opened, Err(Error::Open { .. })) && direct.is_err()
        })
        .expect("a flipped byte that makes redb panic");

    crate::silence_caught_redb_panics();
    crate::silence_caught_redb_panics(); // a second call changes nothing
    flip(offset);
    let (opened, seen) = recorded(|| plain(&damaged));
    assert!(
        matches!(&opened, Err(Error::Open { path, .. }) if *path == damaged),
        "{:?}",
        opened.err()
    );
    assert_eq!(seen, Vec::<String>::new(), "offset {offset}");
    // The verifying open refuses it too, as quietly.
    let (opened, seen) = recorded(|| RedbStore::open_read_only(&damaged));
    assert!(
        matches!(&opened, Err(Error::Open { .. })),
        "{:?}",
        opened.err()
    );
    assert_eq!(seen, Vec::<String>::new(), "offset {offset}");

    // Outside loops's catch, the same panic is passed on.
    let (direct, seen) =
        recorded(|| std::panic::catch_unwind(|| redb::Builder::new().open_read_only(&damaged)));
    assert!(direct.is_err());
    assert!(in_redb(&seen), "offset {offset}: {seen:?}");

    // So is any panic of other code.
    let line = line!() + 1;
    let (other, seen) = recorded(|| std::panic::catch_unwind(|| panic!("not redb")));
    assert!(other.is_err());
    assert_eq!(seen, [format!("loops-core/src/tests.rs:{line}:65")]);
}
