//! The store conformance suite: every behaviour of the `Store` trait, written once
//! (`suite`) and run against both stores: `redb::*` on a temporary redb file, `postgres::*` on
//! a PostgreSQL schema of the test's own. Where the stores differ by design (leases never
//! lapse in redb, which one process owns), the suite says so and checks each.
//!
//! Assertions are on exact values; lease expiry is reached by waiting past a short lease
//! time, never by measuring one.

mod common;

use std::sync::Arc;
use std::time::Duration;

use loops_core::store::{BoxFuture, Store};

/// Makes the stores a test needs, on one set of data.
pub trait Factory: Sync {
    /// The store under test (leases of `ttl` where leases lapse).
    fn store(&self) -> Arc<dyn Store>;
    /// A second worker on the same data, for stores shared by several workers.
    fn second(&self) -> BoxFuture<'_, Option<Arc<dyn Store>>>;
}

struct RedbFactory {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
}

impl RedbFactory {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = loops_core::RedbStore::open(dir.path().join("store.redb")).unwrap();
        RedbFactory {
            _dir: dir,
            store: Arc::new(store),
        }
    }
}

impl Factory for RedbFactory {
    fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.store)
    }
    fn second(&self) -> BoxFuture<'_, Option<Arc<dyn Store>>> {
        Box::pin(async { None })
    }
}

/// The lease time of the PostgreSQL stores of this suite.
const TTL: Duration = Duration::from_secs(1);

struct PgFactory {
    schema: common::TestSchema,
    store: Arc<dyn Store>,
}

impl PgFactory {
    async fn new(test: &str) -> Self {
        let schema = common::TestSchema::new(&format!("c_{test}")).await;
        let store = Arc::new(schema.store(TTL).await);
        PgFactory { schema, store }
    }
}

impl Factory for PgFactory {
    fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.store)
    }
    fn second(&self) -> BoxFuture<'_, Option<Arc<dyn Store>>> {
        Box::pin(async { Some(Arc::new(self.schema.store(TTL).await) as Arc<dyn Store>) })
    }
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod redb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::suite::$name(&super::RedbFactory::new()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let factory = super::PgFactory::new(stringify!($name)).await;
                    super::suite::$name(&factory).await;
                }
            )*
        }
    };
}

conformance!(
    create_and_read,
    transitions_append_in_order,
    steps_are_immutable,
    failures_and_attempts,
    cancel_and_retry,
    events_and_waits,
    wake,
    leases,
    fenced_writes_leave_no_trace,
    claim_ready,
    prune,
    payloads_read_back_byte_for_byte,
);

mod suite {
    use std::collections::BTreeSet;

    use loops_core::record::now_ms;
    use loops_core::store::{
        AfterFailure, Lease, Reply, RunInfo, RunStatus, Store, WaitInfo, WaitOutcome, Write,
    };
    use loops_core::{Error, FailureRecord, FailureSource, RetentionPolicy, SchemaHash};
    use std::time::Duration;

    use super::Factory;

    const WF: &str = "wf";
    const HASH: SchemaHash = SchemaHash::from_u64(0x1234);

    fn info(run_id: &str) -> RunInfo {
        RunInfo {
            run_id: run_id.to_owned(),
            workflow: WF.to_owned(),
            schema: HASH,
            status: RunStatus::Running,
            state: "A".to_owned(),
            seq: 0,
            attempt: 1,
            attempt_base: 0,
            interrupted: 0,
            created_ms: 1_000,
            updated_ms: 1_000,
            retry_at_ms: None,
            error: None,
            cancel: None,
            wait: None,
        }
    }

    /// A transition record's bytes, as the runtime writes them.
    fn record(seq: u64, state: &str, payload: &str) -> Vec<u8> {
        format!(
            r#"{{"seq":{seq},"state":"{state}","at_ms":{},"schema":"{HASH}","payload":{payload}}}"#,
            1_000 + seq
        )
        .into_bytes()
    }

    fn step_record(attempt: u32, output: &str) -> Vec<u8> {
        format!(r#"{{"attempt":{attempt},"at_ms":5,"duration_ms":1,"output":{output}}}"#)
            .into_bytes()
    }

    /// Takes the run's lease (always granted on a store one process owns).
    async fn lease(store: &dyn Store, run_id: &str) -> Lease {
        store
            .acquire(run_id)
            .await
            .unwrap()
            .expect("the lease is free")
    }

    /// Creates `run_id` under a lease of its own; returns the lease.
    async fn create(store: &dyn Store, run_id: &str) -> Lease {
        let l = lease(store, run_id).await;
        store
            .write(
                Some(&l),
                Write::Create {
                    info: info(run_id),
                    record: record(0, "A", r#"{"A":{"n":1}}"#),
                    schema_text: "workflow wf\n",
                },
            )
            .await
            .unwrap();
        l
    }

    async fn transition(
        store: &dyn Store,
        l: &Lease,
        run_id: &str,
        seq: u64,
        terminal: bool,
    ) -> Result<RunInfo, Error> {
        store
            .write(
                Some(l),
                Write::Transition {
                    run_id: run_id.to_owned(),
                    seq,
                    state: format!("S{seq}"),
                    record: record(seq, &format!("S{seq}"), &format!(r#"{{"S{seq}":{seq}}}"#)),
                    terminal,
                    at_ms: 2_000 + seq,
                },
            )
            .await
            .and_then(|r| r.into_run(run_id))
    }

    async fn step(
        store: &dyn Store,
        l: &Lease,
        run_id: &str,
        seq: u64,
        name: &str,
        occurrence: u32,
    ) -> Result<Reply, Error> {
        store
            .write(
                Some(l),
                Write::Step {
                    run_id: run_id.to_owned(),
                    seq,
                    name: name.to_owned(),
                    occurrence,
                    record: step_record(1, &format!(r#""{name}{occurrence}""#)),
                },
            )
            .await
    }

    async fn send(
        store: &dyn Store,
        run_id: &str,
        name: &str,
        payload: &str,
        key: Option<&str>,
    ) -> Result<(u64, bool), Error> {
        match store
            .write(
                None,
                Write::Send {
                    run_id: run_id.to_owned(),
                    name: name.to_owned(),
                    payload: payload.to_owned(),
                    key: key.map(str::to_owned),
                    at_ms: 7_000,
                },
            )
            .await?
        {
            Reply::Sent {
                event_seq,
                duplicate,
                ..
            } => Ok((event_seq, duplicate)),
            other => panic!("expected Sent, got {other:?}"),
        }
    }

    fn ids(infos: &[RunInfo]) -> Vec<&str> {
        infos.iter().map(|i| i.run_id.as_str()).collect()
    }

    pub async fn create_and_read(f: &dyn Factory) {
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
                Write::Create {
                    info: RunInfo {
                        state: "B".into(),
                        ..info("r")
                    },
                    record: record(0, "B", "0"),
                    schema_text: "other",
                },
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
                Write::Create {
                    info: RunInfo {
                        workflow: "other".into(),
                        ..info("a")
                    },
                    record: record(0, "A", "0"),
                    schema_text: "workflow wf\n",
                },
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
    }

    pub async fn transitions_append_in_order(f: &dyn Factory) {
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

    pub async fn steps_are_immutable(f: &dyn Factory) {
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
        let steps: Vec<(String, u32, String)> = store
            .steps("r", 0)
            .await
            .unwrap()
            .into_iter()
            .map(|(n, o, r)| (n, o, r.output.get().to_owned()))
            .collect();
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
    }

    fn failure(attempt: u32, text: &str) -> FailureRecord {
        FailureRecord {
            attempt,
            at_ms: 3_000 + u64::from(attempt),
            source: FailureSource::Handler,
            errors: vec![text.to_owned(), "cause".to_owned()],
        }
    }

    async fn fail(
        store: &dyn Store,
        l: &Lease,
        seq: u64,
        record: FailureRecord,
        then: AfterFailure,
    ) -> Result<RunInfo, Error> {
        store
            .write(
                Some(l),
                Write::Failure {
                    run_id: l.run_id.clone(),
                    seq,
                    record,
                    then,
                },
            )
            .await
            .and_then(|r| r.into_run(&l.run_id))
    }

    /// Begins the next attempt of "r" with `max` failed attempts and 2 interruptions allowed.
    async fn begin_attempt(store: &dyn Store, l: &Lease, seq: u64, max: u32) -> RunInfo {
        store
            .write(
                Some(l),
                Write::BeginAttempt {
                    run_id: "r".into(),
                    seq,
                    max_attempts: max,
                    max_interruptions: 2,
                    at_ms: 4_000,
                },
            )
            .await
            .unwrap()
            .into_run("r")
            .unwrap()
    }

    pub async fn failures_and_attempts(f: &dyn Factory) {
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
        // Attempt 2 stopped without a failure record: an interrupted failure is recorded.
        let row = begin_attempt(store, &l, 0, 3).await;
        assert_eq!(row.attempt, 3);
        assert_eq!(
            row.error,
            Some(vec![
                "the process stopped while this attempt ran".to_owned()
            ])
        );
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
                    FailureSource::Interrupted,
                    "the process stopped while this attempt ran".into()
                ),
            ]
        );
        // Attempt 3 stopped too: two interruptions use up their budget of 2 (while one failed
        // attempt of 3 allowed does not), and the run fails.
        let row = begin_attempt(store, &l, 0, 3).await;
        assert_eq!((row.attempt, row.status), (3, RunStatus::Failed));
        assert_eq!(store.failures("r").await.unwrap().len(), 4);
        assert_eq!(
            ids(&store.list(RunStatus::Failed, None).await.unwrap()),
            vec!["r"]
        );
        // On a run that is not running, nothing changes.
        let again = begin_attempt(store, &l, 0, 3).await;
        assert_eq!(again, row);
        assert_eq!(store.failures("r").await.unwrap().len(), 4);
        // A failure that gives up ends the run: on a fresh run.
        let l2 = create(store, "g").await;
        let row = store
            .write(
                Some(&l2),
                Write::Failure {
                    run_id: "g".into(),
                    seq: 0,
                    record: failure(1, "fatal"),
                    then: AfterFailure::GiveUp,
                },
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
                    Write::Failure {
                        run_id: "g".into(),
                        seq: 0,
                        record: failure(2, "late"),
                        then: AfterFailure::Nothing,
                    },
                )
                .await,
            Err(Error::Fenced {
                status: RunStatus::Failed,
                ..
            })
        ));
    }

    async fn cancel(store: &dyn Store, run_id: &str, end_now: bool) -> Result<RunInfo, Error> {
        store
            .write(
                None,
                Write::Cancel {
                    run_id: run_id.into(),
                    reason: "stop".into(),
                    end_now,
                    at_ms: 6_000,
                },
            )
            .await
            .and_then(|r| r.into_run(run_id))
    }

    async fn retry(store: &dyn Store, run_id: &str) -> Result<RunInfo, Error> {
        store
            .write(
                None,
                Write::Retry {
                    run_id: run_id.into(),
                    at_ms: 8_000,
                },
            )
            .await
            .and_then(|r| r.into_run(run_id))
    }

    pub async fn cancel_and_retry(f: &dyn Factory) {
        let store = f.store();
        let store = &*store;
        let l = create(store, "r").await;
        // Nothing to end: unchanged.
        let end = |l: Lease| async move {
            store
                .write(
                    Some(&l),
                    Write::EndCancelled {
                        run_id: l.run_id.clone(),
                        at_ms: 6_500,
                    },
                )
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
            .write(
                Some(&l2),
                Write::BeginAttempt {
                    run_id: "f".into(),
                    seq: 0,
                    max_attempts: 1,
                    max_interruptions: 1,
                    at_ms: 4_000,
                },
            )
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

    async fn wait(
        store: &dyn Store,
        l: &Lease,
        step: Option<(&str, u32)>,
        event: Option<&str>,
        until_ms: Option<u64>,
    ) -> Result<(WaitOutcome, RunInfo), Error> {
        match store
            .write(
                Some(l),
                Write::Wait {
                    run_id: "r".into(),
                    seq: 0,
                    attempt: 1,
                    step: step.map(|(n, o)| (n.to_owned(), o)),
                    event: event.map(str::to_owned),
                    until_ms,
                    at_ms: 10_000,
                },
            )
            .await?
        {
            Reply::Waited(outcome, info) => Ok((outcome, info)),
            other => panic!("expected Waited, got {other:?}"),
        }
    }

    pub async fn events_and_waits(f: &dyn Factory) {
        let store = f.store();
        let store = &*store;
        let l = create(store, "r").await;
        assert!(matches!(
            send(store, "nope", "e", "1", None).await,
            Err(Error::RunNotFound { .. })
        ));
        assert_eq!(
            send(store, "r", "note", r#""n0""#, Some("k"))
                .await
                .unwrap(),
            (0, false)
        );
        assert_eq!(
            send(store, "r", "note", r#""again""#, Some("k"))
                .await
                .unwrap(),
            (0, true)
        );
        assert_eq!(
            send(store, "r", "note", r#""n1""#, None).await.unwrap(),
            (1, false)
        );
        assert!(store.has_pending("r", "note").await.unwrap());
        assert!(!store.has_pending("r", "approval").await.unwrap());
        // Nothing to deliver, no deadline: the run parks.
        let (outcome, row) = wait(
            store,
            &l,
            Some(("loops:wait:approval", 0)),
            Some("approval"),
            None,
        )
        .await
        .unwrap();
        assert_eq!(outcome, WaitOutcome::Parked);
        assert_eq!(row.status, RunStatus::Waiting);
        assert_eq!(
            row.wait,
            Some(WaitInfo {
                event: Some("approval".into()),
                until_ms: None
            })
        );
        assert_eq!(
            ids(&store.list(RunStatus::Waiting, Some(WF)).await.unwrap()),
            vec!["r"]
        );
        assert!(store.steps("r", 0).await.unwrap().is_empty());
        // The oldest pending event of the name is delivered, and recorded as the wait's step.
        let (outcome, row) = wait(store, &l, Some(("loops:wait:note", 0)), Some("note"), None)
            .await
            .unwrap();
        assert_eq!(
            outcome,
            WaitOutcome::Delivered {
                event_seq: 0,
                payload: r#""n0""#.into()
            }
        );
        assert_eq!((row.status, row.wait.clone()), (RunStatus::Running, None));
        let steps = store.steps("r", 0).await.unwrap();
        assert_eq!(steps.len(), 1);
        assert_eq!(
            (
                steps[0].0.as_str(),
                steps[0].1,
                steps[0].2.output.get(),
                steps[0].2.attempt
            ),
            (
                "loops:wait:note",
                0,
                r#"{"event":{"seq":0,"payload":"n0"}}"#,
                1
            )
        );
        // The same wait again is refused; nothing is delivered twice.
        assert!(matches!(
            wait(store, &l, Some(("loops:wait:note", 0)), Some("note"), None).await,
            Err(Error::StepExists { occurrence: 0, .. })
        ));
        let (outcome, _) = wait(store, &l, Some(("loops:wait:note", 1)), Some("note"), None)
            .await
            .unwrap();
        assert_eq!(
            outcome,
            WaitOutcome::Delivered {
                event_seq: 1,
                payload: r#""n1""#.into()
            }
        );
        assert!(!store.has_pending("r", "note").await.unwrap());
        // A deadline that passed, with nothing to deliver: due, recorded.
        let (outcome, _) = wait(
            store,
            &l,
            Some(("loops:wait:note", 2)),
            Some("note"),
            Some(9_000),
        )
        .await
        .unwrap();
        assert_eq!(outcome, WaitOutcome::Due);
        // A sleep (no step, no event) parks until its time, then is due.
        let (outcome, row) = wait(store, &l, None, None, Some(20_000)).await.unwrap();
        assert_eq!(outcome, WaitOutcome::Parked);
        assert_eq!(
            row.wait,
            Some(WaitInfo {
                event: None,
                until_ms: Some(20_000)
            })
        );
        let (outcome, row) = wait(store, &l, None, None, Some(10_000)).await.unwrap();
        assert_eq!(
            (outcome, row.status),
            (WaitOutcome::Due, RunStatus::Running)
        );
        let steps: Vec<(String, u32, String)> = store
            .steps("r", 0)
            .await
            .unwrap()
            .into_iter()
            .map(|(n, o, r)| (n, o, r.output.get().to_owned()))
            .collect();
        assert_eq!(
            steps,
            vec![
                (
                    "loops:wait:note".into(),
                    0,
                    r#"{"event":{"seq":0,"payload":"n0"}}"#.into()
                ),
                (
                    "loops:wait:note".into(),
                    1,
                    r#"{"event":{"seq":1,"payload":"n1"}}"#.into()
                ),
                ("loops:wait:note".into(), 2, r#""due""#.into()),
            ]
        );
        let events: Vec<(u64, String, Option<String>, String, bool)> = store
            .events("r")
            .await
            .unwrap()
            .into_iter()
            .map(|(seq, e, delivered)| (seq, e.name, e.key, e.payload.get().to_owned(), delivered))
            .collect();
        assert_eq!(
            events,
            vec![
                (0, "note".into(), Some("k".into()), r#""n0""#.into(), true),
                (1, "note".into(), None, r#""n1""#.into(), true),
            ]
        );
        // An ended run takes no events.
        transition(store, &l, "r", 1, true).await.unwrap();
        assert!(matches!(
            send(store, "r", "note", "1", None).await,
            Err(Error::RunEnded {
                status: RunStatus::Completed,
                action: "sending an event",
                ..
            })
        ));
    }

    pub async fn wake(f: &dyn Factory) {
        let store = f.store();
        let store = &*store;
        let l = create(store, "r").await;
        let wake = |seq: u64| {
            let l = l.clone();
            async move {
                store
                    .write(
                        Some(&l),
                        Write::Wake {
                            run_id: "r".into(),
                            seq,
                            at_ms: 11_000,
                        },
                    )
                    .await
                    .unwrap()
                    .into_run("r")
                    .unwrap()
            }
        };
        // Not waiting: unchanged.
        assert_eq!(wake(0).await, info("r"));
        wait(store, &l, None, Some("e"), None).await.unwrap();
        // Another seq: unchanged.
        assert_eq!(wake(1).await.status, RunStatus::Waiting);
        let row = wake(0).await;
        assert_eq!(
            (row.status, row.wait, row.updated_ms),
            (RunStatus::Running, None, 11_000)
        );
    }

    pub async fn leases(f: &dyn Factory) {
        let store = f.store();
        let store = &*store;
        let Some(ttl) = store.lease_ttl() else {
            // One process owns the store: every lease is granted, never lapses, and renews.
            let a = lease(store, "r").await;
            let b = lease(store, "r").await;
            assert_eq!((a.expires_ms, b.expires_ms), (None, None));
            assert_eq!(
                store.renew(std::slice::from_ref(&a)).await.unwrap(),
                vec![a.clone()]
            );
            store.release(&a).await.unwrap();
            assert!(f.second().await.is_none());
            return;
        };
        let other = f.second().await.expect("a second worker");
        let other = &*other;
        let a = lease(store, "r").await;
        assert!(a.token > 0);
        assert!(a.expires_ms.is_some());
        // Another worker cannot take a live lease; this worker takes its own over (a new
        // token: the old one is fenced).
        assert_eq!(other.acquire("r").await.unwrap(), None);
        let a2 = lease(store, "r").await;
        assert!(a2.token > a.token);
        assert_eq!(store.renew(std::slice::from_ref(&a)).await.unwrap(), vec![]);
        let renewed = store.renew(std::slice::from_ref(&a2)).await.unwrap();
        assert_eq!(renewed.len(), 1);
        assert_eq!(
            (renewed[0].run_id.as_str(), renewed[0].token),
            ("r", a2.token)
        );
        assert!(renewed[0].expires_ms >= a2.expires_ms);
        // Released with a stale token: nothing happens; with the current one: free at once.
        store.release(&a).await.unwrap();
        assert_eq!(other.acquire("r").await.unwrap(), None);
        store.release(&a2).await.unwrap();
        let b = other
            .acquire("r")
            .await
            .unwrap()
            .expect("free after release");
        assert!(b.token > a2.token);
        // It lapses: renewal fails, and another worker takes it.
        tokio::time::sleep(ttl + ttl / 2).await;
        assert_eq!(other.renew(std::slice::from_ref(&b)).await.unwrap(), vec![]);
        let c = lease(store, "r").await;
        assert!(c.token > b.token);
        assert_eq!(other.acquire("r").await.unwrap(), None);
        // A renewal moves the expiry on (the server's clock has moved on meanwhile).
        tokio::time::sleep(Duration::from_millis(20)).await;
        let renewed = store.renew(std::slice::from_ref(&c)).await.unwrap();
        assert_eq!(renewed.len(), 1);
        assert!(renewed[0].expires_ms > c.expires_ms, "{renewed:?} {c:?}");
        assert_eq!(other.acquire("r").await.unwrap(), None);
        // Several at once; only the live ones come back.
        let d = lease(store, "s").await;
        let renewed = store
            .renew(&[c.clone(), d.clone(), b.clone()])
            .await
            .unwrap();
        let mut got: Vec<(String, u64)> =
            renewed.into_iter().map(|l| (l.run_id, l.token)).collect();
        got.sort();
        assert_eq!(
            got,
            vec![("r".to_owned(), c.token), ("s".to_owned(), d.token)]
        );
    }

    pub async fn fenced_writes_leave_no_trace(f: &dyn Factory) {
        let store = f.store();
        let store = &*store;
        let Some(ttl) = store.lease_ttl() else {
            // One process owns the store: the file lock is the fence; leases are not checked.
            return;
        };
        let other = f.second().await.expect("a second worker");
        let other = &*other;
        let old = create(store, "r").await;
        // The lease lapses and another worker takes the run over.
        tokio::time::sleep(ttl + ttl / 2).await;
        let new = other.acquire("r").await.unwrap().expect("lapsed");
        let before = (
            store.run_info("r").await.unwrap(),
            store.history("r").await.unwrap().len(),
            store.steps("r", 0).await.unwrap().len(),
            store.failures("r").await.unwrap().len(),
        );
        let fenced = |r: Result<Reply, Error>| {
            assert!(
                matches!(&r, Err(Error::Fenced { run_id, current: 0, status: RunStatus::Running, .. }) if run_id == "r"),
                "{r:?}"
            );
        };
        let writes = || {
            vec![
                Write::Transition {
                    run_id: "r".into(),
                    seq: 1,
                    state: "S1".into(),
                    record: record(1, "S1", "1"),
                    terminal: false,
                    at_ms: 1,
                },
                Write::Step {
                    run_id: "r".into(),
                    seq: 0,
                    name: "s".into(),
                    occurrence: 0,
                    record: step_record(1, "1"),
                },
                Write::Failure {
                    run_id: "r".into(),
                    seq: 0,
                    record: failure(1, "x"),
                    then: AfterFailure::GiveUp,
                },
                Write::BeginAttempt {
                    run_id: "r".into(),
                    seq: 0,
                    max_attempts: 1,
                    max_interruptions: 10,
                    at_ms: 1,
                },
                Write::Wait {
                    run_id: "r".into(),
                    seq: 0,
                    attempt: 1,
                    step: Some(("loops:wait:e".into(), 0)),
                    event: Some("e".into()),
                    until_ms: None,
                    at_ms: 1,
                },
                Write::Wake {
                    run_id: "r".into(),
                    seq: 0,
                    at_ms: 1,
                },
                Write::EndCancelled {
                    run_id: "r".into(),
                    at_ms: 1,
                },
                Write::Create {
                    info: info("r"),
                    record: record(0, "A", "0"),
                    schema_text: "x",
                },
            ]
        };
        for write in writes() {
            fenced(store.write(Some(&old), write).await);
        }
        // A lease of another run does not fence this one either.
        let foreign = lease(store, "elsewhere").await;
        fenced(
            store
                .write(
                    Some(&foreign),
                    Write::Step {
                        run_id: "r".into(),
                        seq: 0,
                        name: "s".into(),
                        occurrence: 0,
                        record: step_record(1, "1"),
                    },
                )
                .await,
        );
        let after = (
            store.run_info("r").await.unwrap(),
            store.history("r").await.unwrap().len(),
            store.steps("r", 0).await.unwrap().len(),
            store.failures("r").await.unwrap().len(),
        );
        assert_eq!(before, after);
        // The new holder writes.
        assert!(matches!(
            step(other, &new, "r", 0, "s", 0).await,
            Ok(Reply::Done)
        ));
        assert_eq!(transition(other, &new, "r", 1, false).await.unwrap().seq, 1);
        // A create under a lapsed lease of a run that does not exist yet is fenced too.
        let l = lease(store, "young").await;
        tokio::time::sleep(ttl + ttl / 2).await;
        other.acquire("young").await.unwrap().expect("lapsed");
        match store
            .write(
                Some(&l),
                Write::Create {
                    info: info("young"),
                    record: record(0, "A", "0"),
                    schema_text: "x",
                },
            )
            .await
        {
            Err(Error::Fenced { run_id, seq: 0, .. }) => assert_eq!(run_id, "young"),
            other => panic!("expected Fenced, got {other:?}"),
        }
        assert!(store.run_info("young").await.unwrap().is_none());
    }

    pub async fn claim_ready(f: &dyn Factory) {
        let store = f.store();
        let store = &*store;
        let wfs = vec![WF.to_owned()];
        // Running, waiting for an event (none yet), sleeping until a time that passed,
        // ended, and of another workflow.
        for id in ["run1", "run2", "evt", "slept", "done"] {
            let l = create(store, id).await;
            store.release(&l).await.unwrap();
        }
        let l = lease(store, "other");
        let l = l.await;
        store
            .write(
                Some(&l),
                Write::Create {
                    info: RunInfo {
                        workflow: "other".into(),
                        ..info("other")
                    },
                    record: record(0, "A", "0"),
                    schema_text: "x",
                },
            )
            .await
            .unwrap();
        store.release(&l).await.unwrap();
        let park = |id: &'static str, event: Option<&'static str>, until: Option<u64>| async move {
            let l = lease(store, id).await;
            let reply = store
                .write(
                    Some(&l),
                    Write::Wait {
                        run_id: id.into(),
                        seq: 0,
                        attempt: 1,
                        step: None,
                        event: event.map(str::to_owned),
                        until_ms: until,
                        at_ms: 1_000,
                    },
                )
                .await
                .unwrap();
            assert!(matches!(reply, Reply::Waited(WaitOutcome::Parked, _)));
            store.release(&l).await.unwrap();
        };
        park("evt", Some("go"), None).await;
        park("slept", None, Some(now_ms() + 1_000)).await;
        let l = lease(store, "done").await;
        transition(store, &l, "done", 1, true).await.unwrap();
        store.release(&l).await.unwrap();

        // The leases claimed here are kept alive by renewal, as a worker's runtime does.
        let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Lease>::new()));
        let claim = |v: Vec<(RunInfo, Lease)>| -> BTreeSet<String> {
            for (info, lease) in &v {
                assert_eq!(info.run_id, lease.run_id);
                held.lock().unwrap().push(lease.clone());
            }
            v.into_iter().map(|(i, _)| i.run_id).collect()
        };
        let set =
            |ids: &[&str]| -> BTreeSet<String> { ids.iter().map(|s| (*s).to_owned()).collect() };
        let shared = store.lease_ttl().is_some();
        // The limit is respected.
        assert_eq!(claim(store.claim_ready(&wfs, 1).await.unwrap()).len(), 1);
        if shared {
            // The run claimed above is held; the other running run is still ready.
            assert_eq!(claim(store.claim_ready(&wfs, 10).await.unwrap()).len(), 1);
            assert!(store.claim_ready(&wfs, 10).await.unwrap().is_empty());
        } else {
            assert_eq!(
                claim(store.claim_ready(&wfs, 10).await.unwrap()),
                set(&["run1", "run2"])
            );
        }
        let renewer = {
            let store = f.store();
            let held = std::sync::Arc::clone(&held);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    let leases = held.lock().unwrap().clone();
                    let _ = store.renew(&leases).await;
                }
            })
        };
        // An event arrives, a time passes: those runs become ready.
        send(store, "evt", "go", "1", None).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
        let got = claim(store.claim_ready(&wfs, 10).await.unwrap());
        if shared {
            assert_eq!(got, set(&["evt", "slept"]));
            let other = f.second().await.expect("a second worker");
            assert!(other.claim_ready(&wfs, 10).await.unwrap().is_empty());
            let all = vec![WF.to_owned(), "other".to_owned()];
            assert_eq!(
                claim(other.claim_ready(&all, 10).await.unwrap()),
                set(&["other"])
            );
        } else {
            assert_eq!(got, set(&["evt", "run1", "run2", "slept"]));
        }
        renewer.abort();
        assert!(store.claim_ready(&[], 10).await.unwrap().is_empty());
    }

    pub async fn prune(f: &dyn Factory) {
        let store = f.store();
        let store = &*store;
        for id in ["c1", "c2", "open"] {
            let l = create(store, id).await;
            step(store, &l, id, 0, "s", 0).await.unwrap();
            send(store, id, "e", "1", Some("k")).await.unwrap();
            fail(store, &l, 0, failure(1, "x"), AfterFailure::Nothing)
                .await
                .unwrap();
            if id != "open" {
                transition(store, &l, id, 1, false).await.unwrap();
                transition(store, &l, id, 2, true).await.unwrap();
            }
        }
        // Only ended runs go; unknown ids are skipped.
        match store
            .write(
                None,
                Write::Prune {
                    run_ids: vec!["open".into(), "ghost".into()],
                },
            )
            .await
            .unwrap()
        {
            Reply::Pruned { records } => assert_eq!(records, 0),
            other => panic!("expected Pruned, got {other:?}"),
        }
        let dry = loops_core::store::prune(
            store,
            &RetentionPolicy::default().keep_last(1),
            now_ms(),
            true,
        )
        .await
        .unwrap();
        // Both ended at the same time: the run id breaks the tie, and `c1` is kept.
        assert_eq!(
            (dry.runs, dry.records, dry.run_ids.clone()),
            (1, 3, vec!["c2".to_owned()])
        );
        assert!(store.run_info("c2").await.unwrap().is_some());
        let pruned = loops_core::store::prune(
            store,
            &RetentionPolicy::default().keep_last(1),
            now_ms(),
            false,
        )
        .await
        .unwrap();
        assert_eq!(pruned, dry);
        assert!(store.run_info("c2").await.unwrap().is_none());
        assert!(store.latest("c2").await.unwrap().is_none());
        assert!(store.history("c2").await.unwrap().is_empty());
        assert!(store.steps("c2", 0).await.unwrap().is_empty());
        assert!(store.failures("c2").await.unwrap().is_empty());
        assert!(store.events("c2").await.unwrap().is_empty());
        assert_eq!(
            ids(&store.list(RunStatus::Completed, None).await.unwrap()),
            vec!["c1"]
        );
        assert_eq!(store.history("c1").await.unwrap().len(), 3);
        assert_eq!(store.failures("c1").await.unwrap().len(), 1);
        assert_eq!(store.history("open").await.unwrap().len(), 1);
        assert_eq!(store.steps("open", 0).await.unwrap().len(), 1);
        assert_eq!(store.events("open").await.unwrap().len(), 1);
        // A pruned id can be used again from scratch (its event keys went with it).
        let l = create(store, "c2").await;
        assert_eq!(
            send(store, "c2", "e", "1", Some("k")).await.unwrap(),
            (0, false)
        );
        store.release(&l).await.unwrap();
    }

    pub async fn payloads_read_back_byte_for_byte(f: &dyn Factory) {
        let store = f.store();
        let store = &*store;
        let l = lease(store, "r").await;
        // Key order, spacing, escapes and number forms as written, not as a JSON database
        // would normalize them.
        let payload = r#"{"Z":{"b":1.50,"a":"é\u00e9\n","n":null, "big":12345678901234567890}}"#;
        store
            .write(
                Some(&l),
                Write::Create {
                    info: info("r"),
                    record: record(0, "Z", payload),
                    schema_text: "x",
                },
            )
            .await
            .unwrap();
        let (_, latest) = store.latest("r").await.unwrap().unwrap();
        assert_eq!(latest.payload.get(), payload);
        let out = r#"[1, 2.0,"\u0000"]"#;
        store
            .write(
                Some(&l),
                Write::Step {
                    run_id: "r".into(),
                    seq: 0,
                    name: "s".into(),
                    occurrence: 0,
                    record: step_record(1, out),
                },
            )
            .await
            .unwrap();
        assert_eq!(store.steps("r", 0).await.unwrap()[0].2.output.get(), out);
        send(store, "r", "e", out, None).await.unwrap();
        assert_eq!(store.events("r").await.unwrap()[0].1.payload.get(), out);
        let long_id = "x".repeat(256);
        let l2 = create(store, &long_id).await;
        assert_eq!(
            store.run_info(&long_id).await.unwrap().unwrap().run_id,
            long_id
        );
        store.release(&l2).await.unwrap();
    }
}
