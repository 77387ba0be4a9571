//! Driving runs: cancellation, one driver at a time, time-outs, size limits, shared
//! commits, seeded runs, steps' types and idempotency keys, panicking handlers.

use super::*;

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
    for reason in ["two\nlines", "tab\there", "escape \u{1b}[2J", "del\u{7f}"] {
        match rt.cancel("idle", reason).await {
            Err(Error::InvalidName {
                what: "cancellation reason",
                name,
                reason: why,
                ..
            }) => assert_eq!(
                (name.as_str(), why),
                (
                    reason,
                    "contains control characters (a line break, a tab, a terminal escape): a reason is one line of text"
                )
            ),
            other => panic!("expected InvalidName, got {other:?}"),
        }
    }
    // A reason over the limit (it is kept in the run's row, read by every listing): refused,
    // the error naming its start, not all of it; one at the limit is taken.
    let long = "é".repeat(crate::MAX_CANCEL_REASON_BYTES / 2 + 1);
    match rt.cancel("idle", &long).await {
        Err(Error::InvalidName {
            what: "cancellation reason",
            name,
            reason: why,
            ..
        }) => {
            assert_eq!(name, format!("{}… (4098 bytes)", "é".repeat(40)));
            assert!(
                why.starts_with("over 4096 bytes: a reason is one line"),
                "{why}"
            );
        }
        other => panic!("expected InvalidName, got {other:?}"),
    }
    assert!(crate::check_cancel_reason("idle", &"a".repeat(4096)).is_ok());

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
    let b = b.unwrap_err();
    assert!(
        matches!(
            b,
            Error::RunActive {
                holder: crate::Holder::ThisRuntime,
                ..
            }
        ),
        "{b:?}"
    );
    assert_eq!(
        b.to_string(),
        "run `r` is already being driven, by this runtime (wait for its end with `Runtime::wait`)"
    );
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
        // Random, different for each run: that there is one is compared.
        info.key_nonce = info.key_nonce.map(|_| 0);
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

/// Creates run `run_id` of [`Job`] in its initial state as a build of loops before key
/// nonces did: its row has none ([`RunInfo::key_nonce`]).
async fn create_without_key_nonce(path: &std::path::Path, run_id: &str) {
    let store = RedbStore::open(path).unwrap();
    let lease = store.acquire_now(run_id).unwrap();
    let (mut info, record) = crate::run::driver::first_record(
        run_id,
        &Job::Start { n: 0 },
        &Clock::system(),
        crate::run::settings::DEFAULT_MAX_PAYLOAD_BYTES,
        false,
    )
    .unwrap();
    assert!(info.key_nonce.is_some(), "a new run's row has a nonce");
    info.key_nonce = None;
    let create = crate::store::Write::Create {
        info,
        record: record.to_bytes(),
        schema_text: Job::SCHEMA,
        attributes: Vec::new(),
    };
    store.write(Some(&lease), create).await.unwrap();
}

/// The key of a run of [`Job`] as `Context::idempotency_key` documents it.
fn documented_key(run_id: &str, name: &str, seq: u64, n: u32, nonce: Option<u64>) -> String {
    let mut material = Vec::new();
    for part in [Job::NAME, run_id, name] {
        material.extend_from_slice(&(part.len() as u64).to_le_bytes());
        material.extend_from_slice(part.as_bytes());
    }
    material.extend_from_slice(&seq.to_le_bytes());
    material.extend_from_slice(&n.to_le_bytes());
    if let Some(nonce) = nonce {
        material.extend_from_slice(&nonce.to_le_bytes());
    }
    format!("lk-{:032x}", xxhash_rust::xxh3::xxh3_128(&material))
}

#[tokio::test]
async fn a_run_under_an_id_used_before_gets_keys_of_its_own() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder().retry(fast_retry(1)).open(&path).unwrap();
    let keys = Mutex::new(Vec::new());
    let probe = KeyProbe(&keys);
    rt.run("r", Job::Start { n: 0 }, &probe).await.unwrap_err();
    let first = rt.run_info("r").await.unwrap().unwrap().key_nonce.unwrap();
    // A failed run's keys, once more after the runtime is opened again: its nonce is stored.
    drop(rt);
    let rt = Runtime::builder().retry(fast_retry(1)).open(&path).unwrap();
    rt.retry("r").await.unwrap();
    rt.run("r", Job::Start { n: 0 }, &probe).await.unwrap_err();
    let expected: Vec<String> = [("push", 0), ("push", 1), ("pr", 0)]
        .map(|(name, n)| documented_key("r", name, 0, n, Some(first)))
        .into();
    assert_eq!(
        keys.lock().unwrap()[..],
        [&expected[..], &expected[..]].concat()
    );
    // Pruned, and started again under the same id: a new nonce, new keys.
    let policy = RetentionPolicy::older_than(Duration::ZERO);
    assert_eq!(rt.prune_with(&policy, false).await.unwrap().runs, 1);
    rt.run("r", Job::Start { n: 0 }, &probe).await.unwrap_err();
    let second = rt.run_info("r").await.unwrap().unwrap().key_nonce.unwrap();
    assert_ne!(first, second);
    let again = keys.lock().unwrap()[6..].to_vec();
    assert_eq!(again.len(), 3);
    assert!(again.iter().all(|k| !expected.contains(k)), "{again:?}");
    assert_eq!(again[0], documented_key("r", "push", 0, 0, Some(second)));
    // The same id in another store: keys of its own too.
    let (_other_dir, other) = temp_store();
    let rt = Runtime::builder()
        .retry(fast_retry(1))
        .open(&other)
        .unwrap();
    rt.run("r", Job::Start { n: 0 }, &probe).await.unwrap_err();
    let third = &keys.lock().unwrap()[9];
    assert!(
        !expected.contains(third) && !again.contains(third),
        "{third}"
    );
}

/// With a manual clock, a run's keys are the same each time a test creates it at the same
/// time (in a store of its own): the crash explorer compares two runs without a crash, and
/// a test may check what a fake service was sent. Another time or id: other keys. The same
/// id again under the same clock, which has not moved (after a prune, or in a second store):
/// other keys too (helper-131: the old run's, when the nonce hashed only id and time).
#[tokio::test]
async fn with_a_manual_clock_a_run_created_at_the_same_time_gets_the_same_keys() {
    let at = |start_s: u64| ManualClock::new(std::time::UNIX_EPOCH + Duration::from_secs(start_s));
    let keys_of = async |clock: &ManualClock, path: &std::path::Path, run_id: &str| {
        let rt = Runtime::builder()
            .clock(clock.clone())
            .retry(fast_retry(1))
            .open(path)
            .unwrap();
        let keys = Mutex::new(Vec::new());
        rt.run(run_id, Job::Start { n: 0 }, &KeyProbe(&keys))
            .await
            .unwrap_err();
        let nonce = rt.run_info(run_id).await.unwrap().unwrap().key_nonce;
        let keys = keys.into_inner().unwrap();
        assert_eq!(keys[0], documented_key(run_id, "push", 0, 0, nonce));
        (rt, nonce.unwrap(), keys)
    };
    let fresh = async |start_s: u64, run_id: &str| {
        let (_dir, path) = temp_store();
        let (_, nonce, keys) = keys_of(&at(start_s), &path, run_id).await;
        (nonce, keys)
    };
    let (nonce, keys) = fresh(1_000, "r").await;
    assert_eq!(fresh(1_000, "r").await, (nonce, keys.clone()));
    let later = fresh(1_001, "r").await;
    let other = fresh(1_000, "r2").await;
    assert!(later.0 != nonce && other.0 != nonce && later.0 != other.0);
    assert!(!keys.contains(&later.1[0]) && !keys.contains(&other.1[0]));
    // One clock, not moved: the id again after a prune, then in a second store.
    let clock = at(1_000);
    let (_dir, path) = temp_store();
    let (rt, first, _) = keys_of(&clock, &path, "r").await;
    assert_eq!(first, nonce, "the clock's first run, as in a fresh test");
    drop(rt);
    // Pruned by a runtime on the system clock: this clock stays where it was.
    let pruner = Runtime::open(&path).unwrap();
    let policy = RetentionPolicy::older_than(Duration::ZERO);
    assert_eq!(pruner.prune_with(&policy, false).await.unwrap().runs, 1);
    drop(pruner);
    let (_, again, again_keys) = keys_of(&clock, &path, "r").await;
    let (_second_dir, second) = temp_store();
    let (_, elsewhere, elsewhere_keys) = keys_of(&clock, &second, "r").await;
    assert!(again != first && elsewhere != first && again != elsewhere);
    assert!(!keys.contains(&again_keys[0]) && !keys.contains(&elsewhere_keys[0]));
    assert_ne!(again_keys[0], elsewhere_keys[0]);
}

#[tokio::test]
async fn a_keyed_step_gets_the_same_key_on_every_execution() {
    let (_dir, path) = temp_store();
    // Created without a key nonce, as every run was before them: its keys are the ones it
    // always had.
    create_without_key_nonce(&path, "r").await;
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
    assert_eq!(documented_key("r", "push", 0, 0, None), *k0);
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

/// A cancellation reason may hold a bidirectional control (kept, as the CLI and the UI show
/// it escaped): the error a caller of the run gets shows it escaped too, so that a message
/// printed as it is (the example prints it) reads in its own order (helper-70).
#[test]
fn a_cancellation_message_shows_a_bidirectional_control_escaped() {
    let e = Error::RunCancelled {
        run_id: "r".into(),
        state: "S".into(),
        seq: 2,
        reason: "from \u{202e}elsewhere".into(),
    };
    assert_eq!(
        e.to_string(),
        "run `r` was cancelled in state `S` (seq 2): from \\u{202e}elsewhere"
    );
}

/// A record of a workflow's own schema is read back as the state it names, or refused as
/// undecodable: two states stored under one name (which the derive refuses, but a
/// hand-written `Deserialize` may make) would have the run driven on in a state it was not
/// in, and repeat its side effects (helper-123). A record of another schema, accepted as it
/// is, may name a state renamed since that keeps its stored name.
#[test]
fn a_record_read_as_another_state_than_it_names_is_refused() {
    let mut record = TransitionRecord::encode("r", 1, &Job::Work { n: 1, acc: 2 }, 0).unwrap();
    assert_eq!(
        record.decode::<Job>("r").unwrap(),
        Job::Work { n: 1, acc: 2 }
    );
    record.state = "Start".to_owned();
    let err = record.decode::<Job>("r").unwrap_err();
    assert!(
        matches!(&err, Error::Decode { seq: 1, state, .. } if state == "Start"),
        "{err:?}"
    );
    assert_eq!(
        err.chain(),
        "run `r`: transition record at seq 1 (state `Start`) does not decode: its data reads as \
         state `Work`: two states are stored under one name"
    );
    record.schema = v2::JobV2::SCHEMA_HASH.pinned();
    assert_eq!(
        record.decode::<Job>("r").unwrap(),
        Job::Work { n: 1, acc: 2 }
    );
}
