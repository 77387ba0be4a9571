//! Unit tests of the runtime and the store, on workflows derived with `#[workflow(crate =
//! crate)]` (the derive has its own tests in the `loops` package).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use loops_derive::Workflow;
use serde::{Deserialize, Serialize};

use crate::*;

mod driving;
mod parked;
mod read_only;
mod retention;
mod run_ids;
mod send_json;
mod store_file;
mod typed_events;
mod waits;

use waits::{Gate, GateState};

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
async fn a_policy_of_zero_attempts_and_interruptions_is_applied_as_one() {
    let (_dir, path) = temp_store();
    let zero = RetryPolicy {
        max_attempts: 0,
        max_interruptions: 0,
        ..RetryPolicy::never()
    };
    let rt = Runtime::builder().retry(zero).open(&path).unwrap();
    let applied = rt
        .inner
        .config
        .settings
        .retry_policy::<Job>(JobState::Start);
    assert_eq!((applied.max_attempts, applied.max_interruptions), (1, 1));
    // With 0 taken as it is, the first attempt would fail the run before its handler ran.
    let done = rt
        .run("r", Job::Start { n: 2 }, &Worker::default())
        .await
        .unwrap();
    assert_eq!(done, Job::Done { acc: 30 });
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
