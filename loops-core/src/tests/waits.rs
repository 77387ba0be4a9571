//! Waits, events and background driving.

use super::*;

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = crate)]
pub(super) enum Gate {
    #[initial]
    #[next(Sleep)]
    Ask { doc: String },
    #[next(Done)]
    Sleep { by: String },
    #[terminal]
    Done { by: String, note: Option<String> },
}

pub(super) struct Gatekeeper {
    sleep: Duration,
    note_timeout: Duration,
    /// (state, seq) of every handler entry.
    entries: Mutex<Vec<(&'static str, u64)>>,
}

impl Gatekeeper {
    pub(super) fn new(sleep: Duration, note_timeout: Duration) -> Self {
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

pub(super) async fn until_status(rt: &Runtime, run_id: &str, status: RunStatus) -> RunInfo {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_or_time_out_too_long_to_count_saturates_and_parks_for_ever() {
    // (sleep, note time-out, the event the run parks for): a wake-up or deadline past
    // `u64::MAX` ms is recorded as `u64::MAX` ms, never wrapped into the past nor a panic.
    let cases = [
        (Duration::MAX, Duration::ZERO, None),
        (Duration::from_millis(u64::MAX), Duration::ZERO, None),
        (Duration::ZERO, Duration::MAX, Some("note")),
        (
            Duration::ZERO,
            Duration::from_millis(u64::MAX),
            Some("note"),
        ),
    ];
    for (i, (sleep, note_timeout, event)) in cases.into_iter().enumerate() {
        let (_dir, path) = temp_store();
        let clock = crate::ManualClock::new(std::time::UNIX_EPOCH + Duration::from_secs(1_000_000));
        let rt = Runtime::builder()
            .clock(clock.clone())
            .register::<Gate, _>(Gatekeeper::new(sleep, note_timeout))
            .open(&path)
            .unwrap();
        rt.start("g", Gate::Ask { doc: "d".into() }).await.unwrap();
        rt.send("g", "approval", "dan").await.unwrap();
        let info = until(&rt, "g", |info| {
            info.state == "Sleep"
                && info.status == RunStatus::Waiting
                && info
                    .wait
                    .as_ref()
                    .is_some_and(|w| w.event.as_deref() == event)
        })
        .await;
        let wait = info.wait.unwrap();
        assert_eq!(wait.until_ms, Some(u64::MAX), "case {i}");
        assert_eq!(info.attempt, 1, "case {i}: no handler failure");
        // A thousand years on, the run still waits.
        clock.advance(Duration::from_secs(1_000 * 365 * 86_400));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let info = rt.run_info("g").await.unwrap().unwrap();
        assert_eq!(
            (info.state.as_str(), info.status),
            ("Sleep", RunStatus::Waiting),
            "case {i}"
        );
        assert_eq!(info.wait.unwrap().until_ms, Some(u64::MAX), "case {i}");
        rt.shutdown().await;
    }
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
