//! The cases of a run's own writes: creation and reads, transitions, steps, failures and
//! attempts, cancellation and retry.

use crate::error::Error;
use crate::record::{FailureRecord, FailureSource};
use crate::schema::SchemaHash;
use crate::store::{AfterFailure, Lease, Reply, RunCount, RunInfo, RunStatus, Store};

use super::factory::Factory;
use super::support::{
    HASH, WF, begin_attempt, cancel, create, fail, failure, ids, info, lease, record, retry, step,
    step_outputs, step_record, transition,
};
use super::writes;

pub(super) async fn create_and_read(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    assert!(store.run_info("r").await.unwrap().is_none());
    assert!(store.latest("r").await.unwrap().is_none());
    assert!(store.history("r").await.unwrap().is_empty());
    let l = create(store, "r").await;
    assert_eq!(store.run_info("r").await.unwrap(), Some(info("r")));
    let (row, latest) = store.latest("r").await.unwrap().unwrap();
    assert_eq!(row, info("r"));
    assert_eq!((latest.seq, latest.state.as_str()), (0, "A"));
    assert_eq!(latest.payload.get(), r#"{"A":{"n":1}}"#);
    assert_eq!(latest.schema, HASH);
    assert_eq!(store.history("r").await.unwrap().len(), 1);
    assert_eq!(
        store.schema(HASH).await.unwrap().as_deref(),
        Some("workflow wf\n")
    );
    assert_eq!(store.schema(SchemaHash::from_u64(9)).await.unwrap(), None);
    // A second create of the same id is refused, and changes nothing.
    let again = store
        .write(
            Some(&l),
            writes::create(
                RunInfo {
                    state: "B".into(),
                    ..info("r")
                },
                record(0, "B", "0"),
                "other",
            ),
        )
        .await;
    assert!(
        matches!(&again, Err(Error::SequenceConflict { run_id, seq: 0 }) if run_id == "r"),
        "{again:?}"
    );
    assert_eq!(store.run_info("r").await.unwrap(), Some(info("r")));
    assert_eq!(
        store.schema(HASH).await.unwrap().as_deref(),
        Some("workflow wf\n")
    );
    // Listing reads the status index, by workflow then run id.
    create(store, "b").await;
    let l3 = lease(store, "a").await;
    store
        .write(
            Some(&l3),
            writes::create(
                RunInfo {
                    workflow: "other".into(),
                    ..info("a")
                },
                record(0, "A", "0"),
                "workflow wf\n",
            ),
        )
        .await
        .unwrap();
    let all = store.list(RunStatus::Running, None).await.unwrap();
    assert_eq!(ids(&all), vec!["a", "b", "r"]);
    assert_eq!(
        ids(&store.list(RunStatus::Running, Some(WF)).await.unwrap()),
        vec!["b", "r"]
    );
    assert_eq!(
        ids(&store.list(RunStatus::Running, Some("other")).await.unwrap()),
        vec!["a"]
    );
    assert!(
        store
            .list(RunStatus::Completed, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .list(RunStatus::Running, Some("none"))
            .await
            .unwrap()
            .is_empty()
    );
    // The counts by workflow and status, by workflow then status.
    let count = |workflow: &str, status, runs| RunCount {
        workflow: workflow.to_owned(),
        status,
        runs,
    };
    assert_eq!(
        store.count_runs().await.unwrap(),
        vec![
            count("other", RunStatus::Running, 1),
            count(WF, RunStatus::Running, 2)
        ]
    );
}

pub(super) async fn transitions_append_in_order(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let l = create(store, "r").await;
    let one = transition(store, &l, "r", 1, false).await.unwrap();
    assert_eq!(
        (one.seq, one.state.as_str(), one.status, one.updated_ms),
        (1, "S1", RunStatus::Running, 2_001)
    );
    // Not the next sequence number: refused, naming where the run is.
    match transition(store, &l, "r", 5, false).await {
        Err(Error::Fenced {
            run_id,
            seq,
            current,
            status,
        }) => assert_eq!(
            (run_id.as_str(), seq, current, status),
            ("r", 4, 1, RunStatus::Running)
        ),
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(matches!(
        transition(store, &l, "r", 1, false).await,
        Err(Error::Fenced {
            seq: 0,
            current: 1,
            ..
        })
    ));
    let done = transition(store, &l, "r", 2, true).await.unwrap();
    assert_eq!((done.seq, done.status), (2, RunStatus::Completed));
    let history: Vec<(u64, String)> = store
        .history("r")
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.seq, r.state))
        .collect();
    assert_eq!(
        history,
        vec![(0, "A".into()), (1, "S1".into()), (2, "S2".into())]
    );
    let (row, latest) = store.latest("r").await.unwrap().unwrap();
    assert_eq!(
        (row.seq, latest.seq, latest.payload.get()),
        (2, 2, r#"{"S2":2}"#)
    );
    // An ended run takes no more transitions.
    assert!(matches!(
        transition(store, &l, "r", 3, false).await,
        Err(Error::Fenced {
            seq: 2,
            current: 2,
            status: RunStatus::Completed,
            ..
        })
    ));
    assert_eq!(
        ids(&store.list(RunStatus::Completed, Some(WF)).await.unwrap()),
        vec!["r"]
    );
    assert_eq!(
        store.count_runs().await.unwrap(),
        vec![RunCount {
            workflow: WF.to_owned(),
            status: RunStatus::Completed,
            runs: 1
        }]
    );
    assert!(
        store
            .list(RunStatus::Running, None)
            .await
            .unwrap()
            .is_empty()
    );
    let l2 = lease(store, "nope").await;
    assert!(matches!(
        transition(store, &l2, "nope", 1, false).await,
        Err(Error::RunNotFound { run_id }) if run_id == "nope"
    ));
}

pub(super) async fn steps_are_immutable(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let l = create(store, "r").await;
    for (name, occurrence) in [("b", 0), ("a", 1), ("a", 0)] {
        assert!(matches!(
            step(store, &l, "r", 0, name, occurrence).await,
            Ok(Reply::Done)
        ));
    }
    match step(store, &l, "r", 0, "a", 1).await {
        Err(Error::StepExists {
            run_id,
            seq,
            step,
            occurrence,
        }) => assert_eq!(
            (run_id.as_str(), seq, step.as_str(), occurrence),
            ("r", 0, "a", 1)
        ),
        other => panic!("expected StepExists, got {other:?}"),
    }
    let steps = step_outputs(store, "r", 0).await;
    assert_eq!(
        steps,
        vec![
            ("a".into(), 0, r#""a0""#.into()),
            ("a".into(), 1, r#""a1""#.into()),
            ("b".into(), 0, r#""b0""#.into()),
        ]
    );
    assert!(store.steps("r", 1).await.unwrap().is_empty());
    // A step of a state the run has left is refused.
    transition(store, &l, "r", 1, false).await.unwrap();
    assert!(matches!(
        step(store, &l, "r", 0, "c", 0).await,
        Err(Error::Fenced {
            seq: 0,
            current: 1,
            ..
        })
    ));
    assert_eq!(store.steps("r", 0).await.unwrap().len(), 3);
    let l2 = lease(store, "nope").await;
    assert!(matches!(
        step(store, &l2, "nope", 0, "a", 0).await,
        Err(Error::RunNotFound { .. })
    ));
    many_steps_in_one_state(store, &l).await;
}

/// A state of many steps (as an agent's loop of tool calls records): every key recorded is
/// refused again, whether it is the newest, the oldest or between, whether failures came
/// between them, and whether the copies come in one commit; the next state's keys start
/// afresh. `l`: the lease of run `r`, at seq 1.
async fn many_steps_in_one_state(store: &dyn Store, l: &Lease) {
    const STEPS: u32 = 120;
    let refused = |result: Result<Reply, Error>, name: &str, occurrence: u32| match result {
        Err(Error::StepExists {
            step: s,
            occurrence: o,
            seq: 1,
            ..
        }) if s == name && o == occurrence => {}
        other => panic!("step {name}#{occurrence} again: expected StepExists, got {other:?}"),
    };
    // The part is long for a lease of a second (a shared store's suite): renew as it goes.
    let renew = || async {
        let renewed = store.renew(std::slice::from_ref(l)).await.unwrap();
        assert_eq!(renewed.len(), 1, "the lease of run `r` lapsed");
    };
    for i in 0..STEPS {
        renew().await;
        let (name, occurrence) = (format!("s{}", i / 2), i % 2);
        assert!(matches!(
            step(store, l, "r", 1, &name, occurrence).await,
            Ok(Reply::Done)
        ));
        refused(
            step(store, l, "r", 1, &name, occurrence).await,
            &name,
            occurrence,
        );
        refused(step(store, l, "r", 1, "s0", 0).await, "s0", 0);
        let middle = i / 2;
        let name = format!("s{}", middle / 2);
        refused(
            step(store, l, "r", 1, &name, middle % 2).await,
            &name,
            middle % 2,
        );
        if i % 40 == 7 {
            fail(
                store,
                l,
                1,
                failure(1, "a tool failed"),
                AfterFailure::Nothing,
            )
            .await
            .unwrap();
        }
    }
    // A new key and a copy of it, and copies of old keys, at once: one of the new two is
    // recorded, every other is refused.
    let news = [("t", 0), ("t", 0), ("s3", 1), ("s59", 0)]
        .map(|(name, occurrence)| async move { step(store, l, "r", 1, name, occurrence).await });
    let answers = futures_util::future::join_all(news).await;
    let recorded = answers
        .iter()
        .filter(|a| matches!(a, Ok(Reply::Done)))
        .count();
    assert_eq!(recorded, 1, "{answers:?}");
    for answer in answers.into_iter().filter(Result::is_err) {
        assert!(
            matches!(answer, Err(Error::StepExists { .. })),
            "{answer:?}"
        );
    }
    let count = STEPS as usize + 1;
    assert_eq!(store.steps("r", 1).await.unwrap().len(), count);
    refused(step(store, l, "r", 1, "t", 0).await, "t", 0);
    // The next state: its keys are its own.
    renew().await;
    transition(store, l, "r", 2, false).await.unwrap();
    for occurrence in 0..20 {
        assert!(matches!(
            step(store, l, "r", 2, "s0", occurrence).await,
            Ok(Reply::Done)
        ));
    }
    assert!(matches!(
        step(store, l, "r", 2, "s0", 0).await,
        Err(Error::StepExists { seq: 2, .. })
    ));
    assert_eq!(store.steps("r", 1).await.unwrap().len(), count);
    assert_eq!(store.steps("r", 2).await.unwrap().len(), 20);
    // Every state's steps at once: those of each seq, by seq.
    let mut each_seq = Vec::new();
    for seq in 0..3 {
        for (name, occurrence, record) in store.steps("r", seq).await.unwrap() {
            each_seq.push((seq, name, occurrence, record.output.get().to_owned()));
        }
    }
    let all: Vec<_> = store
        .all_steps("r")
        .await
        .unwrap()
        .into_iter()
        .map(|(seq, name, occurrence, record)| {
            (seq, name, occurrence, record.output.get().to_owned())
        })
        .collect();
    assert_eq!(all.len(), 3 + count + 20);
    assert_eq!(all, each_seq);
    assert!(store.all_steps("ghost").await.unwrap().is_empty());
    // Ended, pruned and created again, the run id's steps start afresh.
    renew().await;
    transition(store, l, "r", 3, true).await.unwrap();
    store.release(l).await.unwrap();
    let pruned = store.write(None, writes::prune(&["r"])).await.unwrap();
    assert!(matches!(pruned, Reply::Pruned { .. }), "{pruned:?}");
    let l = create(store, "r").await;
    for occurrence in 0..20 {
        assert!(matches!(
            step(store, &l, "r", 0, "s0", occurrence).await,
            Ok(Reply::Done)
        ));
    }
    assert_eq!(store.steps("r", 0).await.unwrap().len(), 20);
}

// This function is long because it is one story on one run: each attempt's outcome (failed,
// interrupted, handled) follows from the failure records the steps before it left.
pub(super) async fn failures_and_attempts(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let l = create(store, "r").await;
    // A failed step: recorded, the run unchanged but for its error.
    let row = fail(
        store,
        &l,
        0,
        failure(1, "step broke"),
        AfterFailure::Nothing,
    )
    .await
    .unwrap();
    assert_eq!(
        (row.status, row.retry_at_ms, row.error.clone()),
        (
            RunStatus::Running,
            None,
            Some(vec!["step broke".to_owned(), "cause".to_owned()])
        )
    );
    // The handler's failure of the same attempt: the next index, and a retry time.
    let row = fail(
        store,
        &l,
        0,
        failure(1, "handler broke"),
        AfterFailure::RetryAt(9_999),
    )
    .await
    .unwrap();
    assert_eq!((row.retry_at_ms, row.updated_ms), (Some(9_999), 3_001));
    assert!(matches!(
        fail(store, &l, 3, failure(1, "x"), AfterFailure::Nothing).await,
        Err(Error::Fenced {
            seq: 3,
            current: 0,
            ..
        })
    ));
    // The next attempt: attempt 1 left failures, so nothing is added.
    let row = begin_attempt(store, &l, 0, 3).await;
    assert_eq!(
        (row.attempt, row.status, row.updated_ms),
        (2, RunStatus::Running, 4_000)
    );
    // A step of attempt 2 failed and its handler went on (it handled the error); then the
    // process stopped: attempt 2 did not fail, it was interrupted, and an interrupted
    // failure is recorded (a step's failure record does not end its attempt).
    let step_failed = FailureRecord {
        source: FailureSource::Step {
            name: "fetch".into(),
            occurrence: 0,
        },
        ..failure(2, "fetch broke")
    };
    fail(store, &l, 0, step_failed, AfterFailure::Nothing)
        .await
        .unwrap();
    // The row shows the step's error until the step's record, made after its failed try,
    // clears it (`updated_ms` its time); a step recorded at its first try leaves the row.
    let error = |row: Option<RunInfo>| row.and_then(|r| r.error);
    assert_eq!(
        error(store.run_info("r").await.unwrap()),
        Some(vec!["fetch broke".to_owned(), "cause".to_owned()])
    );
    step(store, &l, "r", 0, "parse", 0).await.unwrap();
    assert_eq!(
        error(store.run_info("r").await.unwrap()),
        Some(vec!["fetch broke".to_owned(), "cause".to_owned()])
    );
    let fetched = writes::step_after_failed_tries("r", 0, ("fetch", 0), step_record(2, "1"), 4_500);
    store.write(Some(&l), fetched).await.unwrap();
    let row = store.run_info("r").await.unwrap().unwrap();
    assert_eq!((row.error, row.updated_ms, row.attempt), (None, 4_500, 2));
    let row = begin_attempt(store, &l, 0, 3).await;
    assert_eq!((row.attempt, row.interrupted), (3, 1));
    assert_eq!(row.error, Some(vec![crate::INTERRUPTED.to_owned()]));
    let failures: Vec<(u64, u32, FailureSource, String)> = store
        .failures("r")
        .await
        .unwrap()
        .into_iter()
        .map(|(seq, f)| (seq, f.attempt, f.source, f.errors[0].clone()))
        .collect();
    assert_eq!(
        failures,
        vec![
            (0, 1, FailureSource::Handler, "step broke".into()),
            (0, 1, FailureSource::Handler, "handler broke".into()),
            (
                0,
                2,
                FailureSource::Step {
                    name: "fetch".into(),
                    occurrence: 0
                },
                "fetch broke".into()
            ),
            (0, 2, FailureSource::Interrupted, crate::INTERRUPTED.into()),
        ]
    );
    // Attempt 3 stopped too: two interruptions use up their budget of 2 (while one failed
    // attempt of 3 allowed does not), and the run fails.
    let row = begin_attempt(store, &l, 0, 3).await;
    assert_eq!((row.attempt, row.status), (3, RunStatus::Failed));
    assert_eq!(store.failures("r").await.unwrap().len(), 5);
    assert_eq!(
        ids(&store.list(RunStatus::Failed, None).await.unwrap()),
        vec!["r"]
    );
    // On a run that is not running, nothing changes.
    let again = begin_attempt(store, &l, 0, 3).await;
    assert_eq!(again, row);
    assert_eq!(store.failures("r").await.unwrap().len(), 5);
    // A failure that gives up ends the run: on a fresh run.
    let l2 = create(store, "g").await;
    let row = store
        .write(
            Some(&l2),
            writes::failure("g", 0, failure(1, "fatal"), AfterFailure::GiveUp),
        )
        .await
        .unwrap()
        .into_run("g")
        .unwrap();
    assert_eq!((row.status, row.retry_at_ms), (RunStatus::Failed, None));
    assert!(matches!(
        store
            .write(
                Some(&l2),
                writes::failure("g", 0, failure(2, "late"), AfterFailure::Nothing),
            )
            .await,
        Err(Error::Fenced {
            status: RunStatus::Failed,
            ..
        })
    ));
    handed_over(store).await;
}

/// A transition that hands the run over (a draining driver lets it go) leaves the new
/// state's attempt not begun (0): the next driver's `BeginAttempt` begins attempt 1 and
/// records no interruption; a plain transition's first attempt is begun (1) and is.
async fn handed_over(store: &dyn Store) {
    let l = create(store, "h").await;
    let mut write = writes::transition("h", 1, "S1", record(1, "S1", r#"{"S1":1}"#), false, 3_000);
    if let crate::store::Write::Transition { hands_over, .. } = &mut write {
        *hands_over = true;
    }
    let row = store
        .write(Some(&l), write)
        .await
        .unwrap()
        .into_run("h")
        .unwrap();
    assert_eq!(
        (row.seq, row.attempt, row.status),
        (1, 0, RunStatus::Running)
    );
    let begun = store
        .write(Some(&l), writes::begin_attempt("h", 1, 3, 2, 3_100))
        .await
        .unwrap()
        .into_run("h")
        .unwrap();
    assert_eq!(
        (begun.attempt, begun.interrupted, begun.error),
        (1, 0, None)
    );
    let row = transition(store, &l, "h", 2, false).await.unwrap();
    assert_eq!(row.attempt, 1);
    let begun = store
        .write(Some(&l), writes::begin_attempt("h", 2, 3, 2, 3_200))
        .await
        .unwrap()
        .into_run("h")
        .unwrap();
    assert_eq!((begun.attempt, begun.interrupted), (2, 1));
    let sources: Vec<(u64, u32, FailureSource)> = store
        .failures("h")
        .await
        .unwrap()
        .into_iter()
        .map(|(seq, f)| (seq, f.attempt, f.source))
        .collect();
    assert_eq!(sources, [(2, 1, FailureSource::Interrupted)]);
}

pub(super) async fn cancel_and_retry(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let l = create(store, "r").await;
    // Nothing to end: unchanged.
    let end = |l: Lease| async move {
        store
            .write(Some(&l), writes::end_cancelled(&l.run_id, 6_500))
            .await
            .unwrap()
            .into_run(&l.run_id)
            .unwrap()
    };
    assert_eq!(end(l.clone()).await, info("r"));
    let row = cancel(store, "r", false).await.unwrap();
    assert_eq!(
        (row.status, row.cancel.as_deref(), row.updated_ms),
        (RunStatus::Running, Some("stop"), 6_000)
    );
    let row = end(l.clone()).await;
    assert_eq!((row.status, row.updated_ms), (RunStatus::Cancelled, 6_500));
    assert!(matches!(
        cancel(store, "r", false).await,
        Err(Error::RunEnded {
            status: RunStatus::Cancelled,
            action: "cancel",
            ..
        })
    ));
    assert!(matches!(
        cancel(store, "nope", true).await,
        Err(Error::RunNotFound { .. })
    ));
    create(store, "idle").await;
    let row = cancel(store, "idle", true).await.unwrap();
    assert_eq!(row.status, RunStatus::Cancelled);
    assert_eq!(
        ids(&store.list(RunStatus::Cancelled, None).await.unwrap()),
        vec!["idle", "r"]
    );
    // Retry: only a failed run.
    match retry(store, "r").await {
        Err(Error::NotFailed { run_id, status }) => {
            assert_eq!((run_id.as_str(), status), ("r", RunStatus::Cancelled));
        }
        other => panic!("expected NotFailed, got {other:?}"),
    }
    assert!(matches!(
        retry(store, "nope").await,
        Err(Error::RunNotFound { .. })
    ));
    let l2 = create(store, "f").await;
    store
        .write(Some(&l2), writes::begin_attempt("f", 0, 1, 1, 4_000))
        .await
        .unwrap();
    assert_eq!(
        store.run_info("f").await.unwrap().unwrap().status,
        RunStatus::Failed
    );
    let row = retry(store, "f").await.unwrap();
    assert_eq!(
        (row.status, row.attempt, row.attempt_base, row.updated_ms),
        (RunStatus::Running, 1, 1, 8_000)
    );
    assert!(matches!(
        retry(store, "f").await,
        Err(Error::NotFailed {
            status: RunStatus::Running,
            ..
        })
    ));
}
