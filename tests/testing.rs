//! The test kit (`loops::testing`, feature `testing`): a manual clock that skips a day's
//! sleep and a week's approval deadline, waits for a run's state with clear time-outs, the
//! store that sees every write, and the crash explorer, which must find the bug of a handler
//! that keeps a counter in memory across a transition and pass on the correct handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use loops::testing::{ExploreError, Explorer, HookedStore, ManualClock, WaitError, When, explore};
use loops::{Context, FailureSource, RedbStore, RetryPolicy, RunStatus, Runtime, Workflow};
use serde::{Deserialize, Serialize};

const DAY: Duration = Duration::from_secs(24 * 3600);

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "approval")]
enum Approval {
    #[initial]
    #[next(Asked)]
    Drafted { text: String },
    #[next(Published, Abandoned)]
    Asked { text: String },
    #[terminal]
    Published { text: String, by: String },
    #[terminal]
    Abandoned { reason: String },
}

/// Waits a day before asking, then up to a week for an approval.
#[derive(Default)]
struct Desk {
    drafts: AtomicU32,
}

impl ApprovalHandler for Desk {
    type Error = loops::Error;

    async fn drafted(&self, ctx: &Context, text: String) -> Result<DraftedNext, Self::Error> {
        let text = ctx
            .step("polish", || async {
                self.drafts.fetch_add(1, Ordering::SeqCst);
                Ok(format!("{text}!"))
            })
            .await?;
        ctx.sleep(DAY).await?;
        Ok(DraftedNext::Asked { text })
    }

    async fn asked(&self, ctx: &Context, text: String) -> Result<AskedNext, Self::Error> {
        Ok(
            match ctx.wait_for_timeout::<String>("approve", 7 * DAY).await? {
                Some(by) => AskedNext::Published { text, by },
                None => AskedNext::Abandoned {
                    reason: "no approval within 7 days".into(),
                },
            },
        )
    }
}

fn runtime(clock: &ManualClock) -> Runtime {
    Runtime::builder()
        .clock(clock.clone())
        .register::<Approval, _>(Desk::default())
        .build(RedbStore::in_memory().unwrap())
}

#[tokio::test]
async fn a_days_sleep_and_a_weeks_deadline_pass_when_the_clock_is_advanced() {
    let clock = ManualClock::starting_now();
    let start = clock.now_ms();
    let rt = runtime(&clock);
    let draft = Approval::Drafted { text: "hi".into() };
    rt.start("late", draft.clone()).await.unwrap();
    let parked = rt
        .wait_for_status("late", RunStatus::Waiting)
        .await
        .unwrap();
    assert_eq!(parked.state, "Drafted");
    assert_eq!(parked.wait.unwrap().until_ms, Some(start + 86_400_000));
    // A millisecond short of the day: still asleep.
    clock.advance(DAY - Duration::from_millis(1));
    let info = rt.run_info("late").await.unwrap().unwrap();
    assert_eq!(
        (info.status, info.state.as_str()),
        (RunStatus::Waiting, "Drafted")
    );
    clock.advance(Duration::from_millis(1));
    let asked = rt
        .wait_until("late", |i| {
            i.state == "Asked" && i.status == RunStatus::Waiting
        })
        .await
        .unwrap();
    assert_eq!(asked.wait.unwrap().until_ms, Some(start + 8 * 86_400_000));
    clock.advance(7 * DAY);
    let done = rt.wait_for_state("late", "Abandoned").await.unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    let history = rt.history::<Approval>("late").await.unwrap();
    assert_eq!(
        states_of(&history),
        vec![
            draft,
            Approval::Asked { text: "hi!".into() },
            Approval::Abandoned {
                reason: "no approval within 7 days".into()
            },
        ]
    );
    // Recorded times are the manual clock's.
    assert_eq!(history[1].at_ms, start + 86_400_000);
    assert_eq!(history[2].at_ms, start + 8 * 86_400_000);
}

#[tokio::test]
async fn an_approval_sent_before_the_deadline_publishes() {
    let clock = ManualClock::starting_now();
    let rt = runtime(&clock);
    rt.start("on-time", Approval::Drafted { text: "hi".into() })
        .await
        .unwrap();
    rt.wait_for_status("on-time", RunStatus::Waiting)
        .await
        .unwrap();
    clock.advance(DAY);
    rt.wait_until("on-time", |i| {
        i.state == "Asked" && i.status == RunStatus::Waiting
    })
    .await
    .unwrap();
    clock.advance(6 * DAY);
    rt.send("on-time", "approve", "ada").await.unwrap();
    rt.wait_for_status("on-time", RunStatus::Completed)
        .await
        .unwrap();
    let last = rt
        .history::<Approval>("on-time")
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(
        last.value,
        Approval::Published {
            text: "hi!".into(),
            by: "ada".into()
        }
    );
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "payout")]
enum Payout {
    #[initial]
    #[next(Paid, Refused)]
    Owed { cents: u64 },
    #[terminal]
    Paid { receipt: String },
    #[terminal]
    Refused { reason: String },
}

/// A bank that is down: every transfer fails.
#[derive(Default)]
struct DownBank {
    transfers: Arc<AtomicU32>,
}

impl PayoutHandler for DownBank {
    type Error = loops::Error;

    async fn owed(&self, ctx: &Context, cents: u64) -> Result<OwedNext, Self::Error> {
        let sent = ctx
            .step("transfer", || async {
                self.transfers.fetch_add(1, Ordering::SeqCst);
                Err::<String, _>(format!("bank down: {cents} cents not sent").into())
            })
            .await;
        match sent {
            Ok(receipt) => Ok(OwedNext::Paid { receipt }),
            // The last attempt takes the failure route rather than failing the run.
            Err(e) if ctx.is_last_attempt() => Ok(OwedNext::Refused { reason: e.chain() }),
            Err(e) => Err(e),
        }
    }
}

/// A failure route: the step fails, the state is retried after a minute (by the manual
/// clock), and the last attempt routes to `Refused`; each failed attempt left its record.
#[tokio::test]
async fn a_failing_step_is_retried_by_the_clock_then_routed_to_refused() {
    let clock = ManualClock::starting_now();
    let start = clock.now_ms();
    let bank = DownBank::default();
    let transfers = Arc::clone(&bank.transfers);
    let rt = Runtime::builder()
        .clock(clock.clone())
        .retry(
            RetryPolicy::attempts(2)
                .with_delays(Duration::from_secs(60), Duration::from_secs(60))
                .with_jitter(0.0),
        )
        .register::<Payout, _>(bank)
        .build(RedbStore::in_memory().unwrap());
    rt.start("p-1", Payout::Owed { cents: 500 }).await.unwrap();
    // Attempt 1 failed: the run waits for its retry time, a minute on.
    let failed = rt
        .wait_until("p-1", |i| i.retry_at_ms.is_some())
        .await
        .unwrap();
    assert_eq!(failed.retry_at_ms, Some(start + 60_000));
    assert_eq!(transfers.load(Ordering::SeqCst), 1);
    clock.advance(Duration::from_secs(60));
    let done = rt
        .wait_for_status("p-1", RunStatus::Completed)
        .await
        .unwrap();
    assert_eq!(done.state, "Refused");
    // Each failed try of the step, and the attempt it failed, left a record; the last
    // attempt's routed, so it has no record of its own.
    let failures: Vec<(u64, u32, u64, FailureSource, Vec<String>)> = rt
        .store()
        .failures("p-1")
        .await
        .unwrap()
        .into_iter()
        .map(|(seq, f)| (seq, f.attempt, f.at_ms - start, f.source, f.errors))
        .collect();
    let transfer = || FailureSource::Step {
        name: "transfer".into(),
        occurrence: 0,
    };
    let down = "bank down: 500 cents not sent".to_owned();
    let failed_after_one_try =
        "run `p-1`: step `transfer`#0 of state `Owed` (seq 0) failed after 1 try".to_owned();
    assert_eq!(
        failures,
        vec![
            (0, 1, 0, transfer(), vec![down.clone()]),
            (
                0,
                1,
                0,
                FailureSource::Handler,
                vec![failed_after_one_try.clone(), down.clone()]
            ),
            (0, 2, 60_000, transfer(), vec![down.clone()]),
        ]
    );
    let history = rt.history::<Payout>("p-1").await.unwrap();
    assert_eq!(
        states_of(&history),
        vec![
            Payout::Owed { cents: 500 },
            Payout::Refused {
                reason: format!("{failed_after_one_try}: {down}")
            },
        ]
    );
    assert_eq!(transfers.load(Ordering::SeqCst), 2);
}

fn states_of<W: Workflow + Clone>(history: &[loops::Transition<W>]) -> Vec<W> {
    history.iter().map(|t| t.value.clone()).collect()
}

#[tokio::test]
async fn a_wait_that_times_out_names_the_run_and_where_it_is() {
    let clock = ManualClock::starting_now();
    let rt = runtime(&clock);
    rt.start("stuck", Approval::Drafted { text: "hi".into() })
        .await
        .unwrap();
    rt.wait_for_status("stuck", RunStatus::Waiting)
        .await
        .unwrap();
    let err = rt
        .wait_until_within("stuck", Duration::from_millis(20), "state `Asked`", |i| {
            i.state == "Asked"
        })
        .await
        .unwrap_err();
    let WaitError::TimedOut { run_id, last, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(run_id, "stuck");
    let last = last.as_ref().unwrap();
    assert_eq!(
        (last.status, last.state.as_str(), last.seq),
        (RunStatus::Waiting, "Drafted", 0)
    );
    let text = err.to_string();
    assert!(text.starts_with("run `stuck`: waited "), "{text}");
    assert!(
        text.ends_with("ms for state `Asked`; it never got there (last seen: status waiting, state `Drafted`, seq 0)"),
        "{text}"
    );
    // A state the workflow does not have is refused at once (helper-126 LOW 2: it waited the
    // full 10 s, then said the run never got there).
    let started = std::time::Instant::now();
    let err = rt.wait_for_state("stuck", "Publishd").await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        err.to_string(),
        "run `stuck`: workflow `approval` has no state `Publishd` to wait for (its states: \
         Drafted, Asked, Published, Abandoned)"
    );
    // A run that has ended cannot get there: said at once (helper-128 LOW 2: it waited 10 s).
    rt.cancel("stuck", "enough").await.unwrap();
    rt.wait_for_status("stuck", RunStatus::Cancelled)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let err = rt.wait_for_state("stuck", "Published").await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(matches!(err, WaitError::Ended { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "run `stuck`: waited for state `Published`, and the run has ended without getting \
         there (status cancelled, state `Drafted`, seq 0)"
    );
}

#[tokio::test]
async fn the_hooked_store_logs_every_write_of_a_run() {
    let clock = ManualClock::starting_now();
    let store = HookedStore::new(RedbStore::in_memory().unwrap());
    let rt = Runtime::builder()
        .clock(clock.clone())
        .register::<Approval, _>(Desk::default())
        .build(store.clone());
    rt.start("logged", Approval::Drafted { text: "hi".into() })
        .await
        .unwrap();
    rt.wait_for_status("logged", RunStatus::Waiting)
        .await
        .unwrap();
    assert_eq!(store.kinds_of("logged"), ["Create", "Step", "Step", "Wait"]);
    assert_eq!(store.count(), 4);
    assert!(!store.stopped());
}

/// The approval workflow, explored: a wait for a day, an event, every step and transition.
#[tokio::test]
async fn the_explorer_passes_on_a_correct_workflow_with_sleeps_and_events() {
    let explored = Explorer::new(Desk::default, Approval::Drafted { text: "hi".into() })
        .event("approve", "ada")
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!("{explored}");
    assert_eq!(explored.final_state, "Published");
    let shape: Vec<(When, &str)> = explored
        .boundaries
        .iter()
        .map(|b| (b.when, b.what.as_str()))
        .collect();
    assert_eq!(
        shape,
        vec![
            (
                When::AfterCommit,
                "creation of the run in `Drafted` (seq 0)"
            ),
            (When::BeforeCommit, "record of step `polish` #0 of seq 0"),
            (When::AfterCommit, "record of step `polish` #0 of seq 0"),
            (
                When::AfterCommit,
                "record of step `loops:sleep` #0 of seq 0"
            ),
            (When::AfterCommit, "sleep at seq 0 until 1767312000000 ms"),
            (When::AfterCommit, "wake-up at seq 0"),
            (When::AfterCommit, "transition to `Asked` (seq 1)"),
            (
                When::AfterCommit,
                "record of step `loops:deadline:approve` #0 of seq 1"
            ),
            (
                When::AfterCommit,
                "wait at seq 1 for event `approve` until 1767916800000 ms"
            ),
            (When::AfterCommit, "wake-up at seq 1"),
            // The handler runs again and its wait takes the event: the delivery is recorded.
            (
                When::AfterCommit,
                "wait at seq 1 for event `approve` until 1767916800000 ms"
            ),
            (When::AfterCommit, "transition to `Published` (seq 2)"),
        ]
    );
    assert_eq!(explored.explored, explored.boundaries.len());
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "tally")]
enum Tally {
    #[initial]
    #[next(Counted)]
    Start,
    #[next(Done)]
    Counted { seen: u32 },
    #[terminal]
    Done { seen: u32 },
}

/// Counts the states it handled in memory, and carries the count into the next state: a
/// restart loses the count. The bug the explorer must find.
#[derive(Default)]
struct Forgetful {
    handled: AtomicU32,
}

impl TallyHandler for Forgetful {
    type Error = loops::Error;

    async fn start(&self, _ctx: &Context) -> Result<StartNext, Self::Error> {
        let seen = self.handled.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(StartNext::Counted { seen })
    }

    async fn counted(&self, _ctx: &Context, _seen: u32) -> Result<CountedNext, Self::Error> {
        let seen = self.handled.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(CountedNext::Done { seen })
    }
}

/// The same, with the count carried in the state: what survives a crash.
struct Careful;

impl TallyHandler for Careful {
    type Error = loops::Error;

    async fn start(&self, _ctx: &Context) -> Result<StartNext, Self::Error> {
        Ok(StartNext::Counted { seen: 1 })
    }

    async fn counted(&self, _ctx: &Context, seen: u32) -> Result<CountedNext, Self::Error> {
        Ok(CountedNext::Done { seen: seen + 1 })
    }
}

#[tokio::test]
async fn the_explorer_finds_a_count_kept_in_memory_across_a_transition() {
    let err = explore(Forgetful::default, Tally::Start).await.unwrap_err();
    println!("{err}");
    let ExploreError::Found {
        run_id,
        explored,
        findings,
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!((run_id.as_str(), *explored), ("explored", 3));
    // A crash after the move to `Counted`: the rebuilt handler's count starts at 0 again.
    assert_eq!(findings.len(), 1);
    let finding = &findings[0];
    assert_eq!(finding.boundary.number, 2);
    assert_eq!(finding.boundary.when, When::AfterCommit);
    assert_eq!(finding.boundary.what, "transition to `Counted` (seq 1)");
    assert_eq!(
        finding.differences,
        vec![
            "final state differs: uninterrupted completed `Done` (seq 2) {\"Done\":{\"seen\":2}}, \
             after the crash completed `Done` (seq 2) {\"Done\":{\"seen\":1}}"
                .to_owned(),
            "history differs at record 2: uninterrupted seq 2 `Done` {\"Done\":{\"seen\":2}}, \
             after the crash seq 2 `Done` {\"Done\":{\"seen\":1}} (3 records against 3)"
                .to_owned(),
        ]
    );
    assert!(err.to_string().contains(
        "replay this case alone: LOOPS_EXPLORE_ONLY=2 cargo test <your test>, or Explorer::only(2)"
    ));
    // Replayed alone, the case fails the same way.
    let alone = Explorer::new(Forgetful::default, Tally::Start)
        .only(2)
        .run()
        .await
        .unwrap_err();
    let ExploreError::Found {
        explored,
        findings: again,
        ..
    } = alone
    else {
        panic!("{alone}")
    };
    assert_eq!((explored, again), (1, findings.clone()));
    // A boundary the run does not have explores nothing, and says so: the known bug must not
    // pass for it.
    for only in [0, 4] {
        let none = Explorer::new(Forgetful::default, Tally::Start)
            .only(only)
            .run()
            .await
            .unwrap_err();
        assert!(
            matches!(&none, ExploreError::NoSuchBoundary { boundaries: 3, .. }),
            "{none}"
        );
        assert_eq!(
            none.to_string(),
            format!(
                "crash explorer: run `explored` has no boundary {only} to explore alone (it has \
                 3, numbered from 1; Explorer::only or LOOPS_EXPLORE_ONLY): nothing was explored"
            )
        );
    }
}

#[tokio::test]
async fn the_explorer_passes_on_the_count_carried_in_the_state() {
    let explored = explore(|| Careful, Tally::Start)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(explored.final_state, "Done");
    assert_eq!(explored.boundaries.len(), 3);
}

/// A step whose effect is counted outside the handler, as an outside system would: after a
/// crash between its effect and its record it runs again, with the same key.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "charge")]
enum Charge {
    #[initial]
    #[next(Charged)]
    Due { cents: u64 },
    #[terminal]
    Charged { receipt: String },
}

struct Biller;

impl ChargeHandler for Biller {
    type Error = loops::Error;

    async fn due(&self, ctx: &Context, cents: u64) -> Result<DueNext, Self::Error> {
        let receipt = ctx
            .step_keyed(
                "charge",
                |key| async move { Ok(format!("{cents} under {key}")) },
            )
            .await?;
        Ok(DueNext::Charged { receipt })
    }
}

#[tokio::test]
async fn the_explorer_stops_a_step_between_its_effect_and_its_record() {
    let explored = explore(|| Biller, Charge::Due { cents: 500 })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let whens: Vec<When> = explored.boundaries.iter().map(|b| b.when).collect();
    assert_eq!(
        whens,
        [
            When::AfterCommit,
            When::BeforeCommit,
            When::AfterCommit,
            When::AfterCommit
        ]
    );
}

/// A biller whose bank refuses the first transfer of the whole test: the count is outside
/// the handler (a restart does not reset it, as a real bank's would not be), so the second
/// run without a crash charges at once where the first failed a try.
struct FlakyBiller(Arc<AtomicU32>);

impl ChargeHandler for FlakyBiller {
    type Error = loops::Error;

    async fn due(&self, ctx: &Context, cents: u64) -> Result<DueNext, Self::Error> {
        let calls = Arc::clone(&self.0);
        let receipt = ctx
            .step_keyed("charge", |key| async move {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err::<String, _>("bank busy".into());
                }
                Ok(format!("{cents} under {key}"))
            })
            .await?;
        Ok(DueNext::Charged { receipt })
    }
}

/// A workflow that does not do the same twice without a crash is reported as such, before
/// any crash is explored (its chance would be taken for the crash's doing); reset before
/// each case, the same workflow explores.
#[tokio::test]
async fn the_explorer_refuses_a_workflow_that_does_not_repeat_without_a_crash() {
    let policy = || {
        RetryPolicy::attempts(3)
            .with_delays(Duration::from_secs(1), Duration::from_secs(1))
            .with_jitter(0.0)
    };
    let calls = Arc::new(AtomicU32::new(0));
    let factory = {
        let calls = Arc::clone(&calls);
        move || FlakyBiller(Arc::clone(&calls))
    };
    let e = Explorer::new(factory.clone(), Charge::Due { cents: 500 })
        .configure(move |b| b.retry(policy()))
        .run()
        .await
        .unwrap_err();
    let ExploreError::NotRepeatable {
        run_id,
        differences,
    } = &e
    else {
        panic!("expected NotRepeatable, got {e}");
    };
    assert_eq!(run_id, "explored");
    assert_eq!(
        differences,
        &[
            "the failed try of step `charge` #0 in attempt 1 at seq 0 was written 1 time(s) in \
             the first, 0 in the second",
            "the failure of attempt 1 at seq 0 was written 1 time(s) in the first, 0 in the \
             second",
            "the new attempt at seq 0 was written 1 time(s) in the first, 0 in the second",
            "step `charge` #0 of seq 0 ran its closure 2 time(s) in the first, 1 in the second",
        ],
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("crash explorer: run `explored` did not do the same in two runs"),
        "{e}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "two runs, nothing explored"
    );

    let reset = Arc::clone(&calls);
    let explored = Explorer::new(factory, Charge::Due { cents: 500 })
        .configure(move |b| b.retry(policy()))
        .before_each(move || reset.store(0, Ordering::SeqCst))
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(explored.final_state, "Charged");
    assert_eq!(explored.explored, explored.boundaries.len());
}

// The same explorations with a real process per crash (`Explorer::in_child_processes`): this
// test binary runs again on the one test, whose explorer plays the child's part (aborting
// the process at the boundary, or resuming the run from the store file). A test runs one
// explorer in child processes; what it compares with runs after it, in this process.

/// The approval workflow's day of sleep, its event and its steps, each crash a real abort:
/// the same boundaries, the same end, as in process.
/// The failure route of a failing step, explored: a crash between the step's failed try
/// and the attempt's end is an interrupted attempt (not a failed one), so the run still
/// takes the route at its last counted attempt; a crash anywhere ends the run at `Refused`
/// with the same history, in process and in child processes (a real abort).
#[tokio::test]
async fn the_explorer_passes_on_a_failure_route_with_a_failing_step() {
    let policy = || {
        RetryPolicy::attempts(2)
            .with_delays(Duration::from_secs(60), Duration::from_secs(60))
            .with_jitter(0.0)
    };
    for children in [false, true] {
        let explorer = Explorer::new(DownBank::default, Payout::Owed { cents: 500 })
            .configure(move |b| b.retry(policy()));
        let explorer = if children {
            explorer.in_child_processes()
        } else {
            explorer
        };
        let explored = explorer.run().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (explored.final_state.as_str(), explored.final_status),
            ("Refused", RunStatus::Completed),
            "in child processes: {children}"
        );
        let what: Vec<&str> = explored
            .boundaries
            .iter()
            .map(|b| b.what.as_str())
            .collect();
        assert!(
            what.contains(&"failed try of step `transfer` #0 in attempt 1 at seq 0"),
            "{explored}"
        );
    }
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "fallback")]
enum Fallback {
    #[initial]
    #[next(Done)]
    Try,
    #[terminal]
    Done { via: String },
}

/// Never fails: a failed primary step falls back to the secondary.
struct Falls;

impl FallbackHandler for Falls {
    type Error = loops::Error;

    async fn r#try(&self, ctx: &Context) -> Result<TryNext, Self::Error> {
        let primary = ctx
            .step("primary", || async {
                Err::<String, _>("primary down".into())
            })
            .await;
        let via = match primary {
            Ok(via) => via,
            Err(_) => {
                ctx.step("secondary", || async { Ok("secondary".to_owned()) })
                    .await?
            }
        };
        Ok(TryNext::Done { via })
    }
}

/// A handled step failure with one attempt allowed: a crash after the failed try's record
/// (or after the fallback's) resumes the state and ends at `Done`, never `failed`.
#[tokio::test]
async fn the_explorer_passes_on_a_handled_step_failure_with_one_attempt() {
    let explored = Explorer::new(|| Falls, Fallback::Try)
        .configure(|b| b.retry(RetryPolicy::attempts(1)))
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (explored.final_state.as_str(), explored.final_status),
        ("Done", RunStatus::Completed)
    );
    assert_eq!(explored.explored, explored.boundaries.len());
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "fan")]
enum Fan {
    #[initial]
    #[next(Joined)]
    Go { fail: bool },
    #[terminal]
    Joined { seen: u32 },
}

/// Fails when its state says so; otherwise starts a `Tally` child run and joins it.
struct Fanner;

impl FanHandler for Fanner {
    type Error = std::io::Error;

    async fn go(&self, ctx: &Context, fail: bool) -> Result<GoNext, Self::Error> {
        if fail {
            return Err(std::io::Error::other("out of tokens"));
        }
        let child = ctx
            .start_child("fan-1/tally", Tally::Start)
            .await
            .map_err(std::io::Error::other)?;
        let seen = match ctx
            .join_child(&child)
            .await
            .map_err(std::io::Error::other)?
        {
            Ok(Tally::Done { seen }) => seen,
            other => return Err(std::io::Error::other(format!("{other:?}"))),
        };
        Ok(GoNext::Joined { seen })
    }
}

/// Explores run `fan-1` of `Fan` (failing if `fail`), with one attempt and no child
/// workflow registered.
async fn explore_fan(fail: bool) -> Result<loops::testing::Exploration, ExploreError> {
    Explorer::new(|| Fanner, Fan::Go { fail })
        .configure(|b| b.retry(RetryPolicy::attempts(1)))
        .run_id("fan-1")
        .run()
        .await
}

/// A run that fails, and fails the same way after every crash, passes, with its status and
/// error in the result and the report: never reported as if it had ended well.
#[tokio::test]
async fn the_explorer_reports_a_run_that_fails_as_failed() {
    let explored = explore_fan(true).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (explored.final_state.as_str(), explored.final_status),
        ("Go", RunStatus::Failed)
    );
    let error = explored.error.clone().expect("the run's error");
    assert!(error.ends_with("out of tokens"), "{error}");
    let report = explored.to_string();
    assert!(
        report.starts_with(&format!(
            "crash explorer: run `fan-1` ends failed in `Go` after a crash at each of {} \
             boundaries ({} explored)\n  its error: {error}\n",
            explored.boundaries.len(),
            explored.explored
        )),
        "{report}"
    );
}

/// A run that starts a child run is refused with what the explorer cannot do (never a hint
/// to send loops' own events); so is one whose child's workflow is not registered, which
/// fails to start it (helper-126 MEDIUM 3: it passed, as a run that fails the same way after
/// every crash, though the failure was the test's setup).
#[tokio::test]
async fn the_explorer_refuses_a_run_with_children_saying_so() {
    let unregistered = explore_fan(false).await.expect_err("a run with a child");
    assert!(matches!(unregistered, ExploreError::Reference { .. }));
    assert_eq!(
        unregistered.to_string(),
        "crash explorer: run `fan-1` could not be run without a crash: it starts a child run \
         of workflow `tally`, which has no handler registered (`Explorer::configure`), and \
         fails there: the crash explorer explores one run, and not yet a run that starts \
         children (explore the children's workflows on their own; see docs/testing.md)"
    );
    let registered = Explorer::new(|| Fanner, Fan::Go { fail: false })
        .configure(|b| b.register::<Tally, _>(Careful))
        .run_id("fan-1")
        .run()
        .await
        .expect_err("a run with children");
    assert!(matches!(registered, ExploreError::Reference { .. }));
    assert_eq!(
        registered.to_string(),
        "crash explorer: run `fan-1` could not be run without a crash: it starts child runs \
         (`fan-1/tally`): the crash explorer explores one run, and not yet a run that starts \
         children (explore the children's workflows on their own; see docs/testing.md)"
    );
}

#[tokio::test]
async fn in_child_processes_the_explorer_passes_on_a_correct_workflow_as_in_process() {
    let draft = || Approval::Drafted { text: "hi".into() };
    let in_children = Explorer::new(Desk::default, draft())
        .event("approve", "ada")
        .in_child_processes()
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let in_process = Explorer::new(Desk::default, draft())
        .event("approve", "ada")
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(in_children.final_state, "Published");
    assert_eq!(in_children.boundaries.len(), 12);
    assert_eq!(in_children, in_process);
}

/// The count kept in memory: a fresh process per crash loses it as a rebuilt handler does,
/// and the report is the in-process one, word for word.
#[tokio::test]
async fn in_child_processes_the_explorer_finds_a_count_kept_in_memory_as_in_process() {
    let in_children = Explorer::new(Forgetful::default, Tally::Start)
        .in_child_processes()
        .run()
        .await
        .unwrap_err();
    let in_process = explore(Forgetful::default, Tally::Start).await.unwrap_err();
    println!("{in_children}");
    let (
        ExploreError::Found {
            explored, findings, ..
        },
        ExploreError::Found {
            findings: expected, ..
        },
    ) = (&in_children, &in_process)
    else {
        panic!("{in_children}\n{in_process}")
    };
    assert_eq!(*explored, 3);
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].boundary.what, "transition to `Counted` (seq 1)");
    assert_eq!(findings, expected);
    assert_eq!(in_children.to_string(), in_process.to_string());
}

/// The count carried in the state passes in child processes too.
#[tokio::test]
async fn in_child_processes_the_explorer_passes_on_the_count_carried_in_the_state() {
    let explored = Explorer::new(|| Careful, Tally::Start)
        .in_child_processes()
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(explored.final_state, "Done");
    assert_eq!(explored.boundaries.len(), 3);
    assert_eq!(explored.explored, 3);
}

/// A step aborted between its effect and its record runs again in the next process, with
/// the same key: the children's journals of step runs reach the parent's checks.
#[tokio::test]
async fn in_child_processes_a_step_aborted_between_effect_and_record_runs_again() {
    let explored = Explorer::new(|| Biller, Charge::Due { cents: 500 })
        .in_child_processes()
        .only(2)
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(explored.explored, 1);
    assert_eq!(explored.boundaries[1].when, When::BeforeCommit);
    assert_eq!(
        explored.boundaries[1].what,
        "record of step `charge` #0 of seq 0"
    );
}

/// The wrong test name: the child runs no explorer, and the error says so.
#[tokio::test]
async fn in_child_processes_a_wrong_test_name_is_reported() {
    let err = Explorer::new(|| Careful, Tally::Start)
        .in_child_processes_of("no_such_test")
        .run()
        .await
        .unwrap_err();
    let ExploreError::Reference { message, .. } = &err else {
        panic!("{err}")
    };
    assert!(
        message.contains("the child process ran no crash explorer: is `no_such_test` the name"),
        "{message}"
    );
}

/// The blocks of `guide` fenced as ```` ```lang ````, each as its lines.
fn fenced<'a>(guide: &'a str, lang: &str) -> Vec<Vec<&'a str>> {
    let mut blocks = Vec::new();
    let mut open: Option<Vec<&str>> = None;
    for line in guide.lines() {
        match open.as_mut() {
            None if line.trim_start() == format!("```{lang}") => open = Some(Vec::new()),
            Some(_) if line.trim_start() == "```" => blocks.extend(open.take()),
            Some(block) => block.push(line),
            None => {}
        }
    }
    blocks
}

/// docs/testing.md shows code of this file and what the explorer prints: each ```` ```rust
/// ```` block of the guide, its lines trimmed, is a run of lines of this file (a line `//
/// ...` stands for lines left out), and its reports are the explorer's, word for word.
#[tokio::test]
async fn the_guide_shows_this_file_s_code_and_the_explorer_s_real_reports() {
    let guide = include_str!("../docs/testing.md");
    let this: Vec<&str> = include_str!("testing.rs")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let blocks = fenced(guide, "rust");
    assert_eq!(blocks.len(), 8, "the guide's Rust blocks");
    for block in &blocks {
        let lines: Vec<&str> = block
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
            .collect();
        for piece in lines.split(|l| *l == "// ...") {
            assert!(
                this.windows(piece.len()).any(|w| w == piece),
                "docs/testing.md shows code that is not in tests/testing.rs:\n{}",
                piece.join("\n")
            );
        }
    }
    let reports: Vec<String> = fenced(guide, "text")
        .into_iter()
        .map(|b| b.join("\n"))
        .collect();
    let explored = Explorer::new(Desk::default, Approval::Drafted { text: "hi".into() })
        .event("approve", "ada")
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let found = explore(Forgetful::default, Tally::Start).await.unwrap_err();
    assert_eq!(
        reports,
        [explored.to_string().trim_end(), &found.to_string()]
    );
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "nap")]
enum Nap {
    #[initial]
    #[next(Awake)]
    Napping { fail_tries: u32 },
    #[terminal]
    Awake { tries: u32 },
}

/// A step tried again after 10 ms, then a sleep of 300 ms: both shorter than the default
/// park threshold.
#[derive(Default)]
struct ShortWaits {
    tries: AtomicU32,
}

impl NapHandler for ShortWaits {
    type Error = loops::Error;

    async fn napping(&self, ctx: &Context, fail_tries: u32) -> Result<NappingNext, Self::Error> {
        let retry = RetryPolicy::attempts(2)
            .with_delays(Duration::from_millis(10), Duration::from_millis(10))
            .with_jitter(0.0);
        let tries = ctx
            .step_with(
                "call",
                loops::StepOptions::default().with_retry(retry),
                || async {
                    let n = self.tries.fetch_add(1, Ordering::SeqCst) + 1;
                    if n <= fail_tries {
                        return Err(format!("try {n} failed").into());
                    }
                    Ok(n)
                },
            )
            .await?;
        ctx.sleep(Duration::from_millis(300)).await?;
        Ok(NappingNext::Awake { tries })
    }
}

/// helper-126 MEDIUM 1: with a manual clock, a back-off or a sleep shorter than the park
/// threshold (1 s) waited in place, the run's row said running and nothing else, and a test
/// could not tell when to advance the clock. With a manual clock every one parks, and the
/// row says until when; an explicit `park_threshold` still waits in place.
#[tokio::test]
async fn with_a_manual_clock_short_sleeps_and_back_offs_park_where_a_test_sees_them() {
    let clock = ManualClock::starting_now();
    let start = clock.now_ms();
    let store = HookedStore::new(RedbStore::in_memory().unwrap());
    let rt = Runtime::builder()
        .clock(clock.clone())
        .register::<Nap, _>(ShortWaits::default())
        .build(store.clone());
    rt.start("n", Nap::Napping { fail_tries: 1 }).await.unwrap();
    let until = |info: loops::RunInfo| info.wait.and_then(|w| w.until_ms);
    let backing_off = rt.wait_for_status("n", RunStatus::Waiting).await.unwrap();
    assert_eq!(until(backing_off), Some(start + 10));
    clock.advance(Duration::from_millis(10));
    let sleeping = rt
        .wait_until("n", |i| {
            i.wait.as_ref().and_then(|w| w.until_ms) == Some(start + 310)
        })
        .await
        .unwrap();
    assert_eq!(sleeping.status, RunStatus::Waiting);
    clock.advance(Duration::from_millis(300));
    let done = rt.wait_for_status("n", RunStatus::Completed).await.unwrap();
    assert_eq!(done.state, "Awake");
    let waits = store.kinds_of("n").iter().filter(|k| **k == "Wait").count();
    assert_eq!(waits, 2);
    rt.shutdown().await;

    // Set, the threshold holds: both wait in place, and the run never parks.
    let store = HookedStore::new(RedbStore::in_memory().unwrap());
    let rt = Runtime::builder()
        .park_threshold(Duration::from_secs(1))
        .clock(clock.clone())
        .register::<Nap, _>(ShortWaits::default())
        .build(store.clone());
    rt.start("n", Nap::Napping { fail_tries: 1 }).await.unwrap();
    let ended = async {
        loop {
            let info = rt.run_info("n").await.unwrap().unwrap();
            if info.status == RunStatus::Completed {
                return info;
            }
            assert_eq!((info.status, info.wait), (RunStatus::Running, None));
            clock.advance(Duration::from_millis(10));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let done = tokio::time::timeout(Duration::from_secs(10), ended)
        .await
        .expect("the run ends as the clock moves");
    assert_eq!(done.state, "Awake");
    assert!(!store.kinds_of("n").contains(&"Wait"));
    rt.shutdown().await;
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "gate")]
#[event(open: String)]
enum Gate {
    #[initial]
    #[next(Opened)]
    Shut,
    #[terminal]
    Opened { by: String },
}

struct Keeper;

impl GateHandler for Keeper {
    type Error = loops::Error;

    async fn shut(&self, ctx: &Context) -> Result<ShutNext, Self::Error> {
        let by = ctx.wait_for(Gate::OPEN).await?;
        Ok(ShutNext::Opened { by })
    }
}

/// An event given to the explorer that the run never takes (a misspelt name, one the
/// workflow does not declare, or one more than it waits for) fails the exploration, naming
/// it (helper-126 LOW 1: it was ignored, and the exploration passed).
#[tokio::test]
async fn the_explorer_refuses_an_event_the_run_never_takes() {
    let explored = Explorer::new(|| Keeper, Gate::Shut)
        .event(Gate::OPEN, "ada".to_owned())
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(explored.final_state, "Opened");

    let misspelt = Explorer::new(|| Keeper, Gate::Shut)
        .event("opne", "ada")
        .run()
        .await
        .expect_err("an undeclared event");
    let ExploreError::Event { event, .. } = &misspelt else {
        panic!("{misspelt}")
    };
    assert_eq!(event, "opne");
    let text = misspelt.to_string();
    assert!(
        text.starts_with(
            "crash explorer: run `explored`: the event `opne` given to the explorer \
             (Explorer::event) is never taken: "
        ) && text.ends_with("; nothing was explored"),
        "{text}"
    );

    let one_too_many = Explorer::new(|| Keeper, Gate::Shut)
        .event(Gate::OPEN, "ada".to_owned())
        .event(Gate::OPEN, "bo".to_owned())
        .run()
        .await
        .expect_err("an event more than the run waits for");
    assert_eq!(
        one_too_many.to_string(),
        "crash explorer: run `explored`: the event `open` given to the explorer \
         (Explorer::event) is never taken: the run ended without waiting for it; nothing was \
         explored"
    );
    // A workflow that declares no events takes any name, but not one it never waits for.
    let never_waits = Explorer::new(|| Careful, Tally::Start)
        .event("approve", "ada")
        .run()
        .await
        .expect_err("a run that never waits");
    assert!(
        matches!(never_waits, ExploreError::Event { .. }),
        "{never_waits}"
    );
}
