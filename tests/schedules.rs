//! Schedules through the public API, on the embedded store, with a manual clock (no test
//! sleeps for a tick): a restart spanning several ticks runs exactly the ticks each catch-up
//! policy says; pause, resume and remove; two runtimes on clones of one store (the
//! single-driver rule) never start a tick twice. The same on PostgreSQL with two workers:
//! loops-postgres/tests/schedules.rs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use loops::testing::ManualClock;
use loops::{
    BoxError, CatchUp, Context, Error, RedbStore, RunFilter, RunStatus, Runtime, Schedule,
    ScheduleInfo, Workflow, tick_run_id,
};
use serde::{Deserialize, Serialize};

/// A report made at each tick.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Report {
    #[initial]
    #[next(Done)]
    Start { tick_ms: u64 },
    #[terminal]
    Done { tick_ms: u64 },
}

/// Counts the executions of `Start`'s handler, with the tick each one was for.
#[derive(Clone, Default)]
struct Reporter {
    starts: Arc<AtomicUsize>,
    ticks: Arc<Mutex<Vec<u64>>>,
}

impl ReportHandler for Reporter {
    type Error = BoxError;

    async fn start(&self, _ctx: &Context, tick_ms: u64) -> Result<StartNext, BoxError> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        self.ticks.lock().unwrap().push(tick_ms);
        Ok(StartNext::Done { tick_ms })
    }
}

/// 2026-12-02T00:00:00Z: a whole minute.
const T0: u64 = 1_796_169_600_000;
const MINUTE: u64 = 60_000;

fn every_minute(policy: CatchUp) -> Schedule {
    Schedule::every(Duration::from_secs(60))
        .unwrap()
        .catch_up(policy)
}

fn clock() -> ManualClock {
    ManualClock::new(UNIX_EPOCH + Duration::from_millis(T0))
}

fn advance(clock: &ManualClock, ms: u64) {
    clock.advance(Duration::from_millis(ms));
}

fn runtime(clock: &ManualClock, store: RedbStore, reporter: &Reporter) -> Runtime {
    Runtime::builder()
        .clock(clock.clone())
        .register::<Report, _>(reporter.clone())
        .build(store)
}

async fn schedule(rt: &Runtime, name: &str, s: Schedule) -> ScheduleInfo {
    rt.schedule::<Report, _>(name, s, |tick| Report::Start {
        tick_ms: tick.at_ms,
    })
    .await
    .unwrap()
}

/// The run id of tick `n` minutes after [`T0`] of schedule `name`.
fn tick(name: &str, n: u64) -> String {
    tick_run_id(name, T0 + n * MINUTE)
}

/// Waits until the run of tick `n` of `name` completed, and checks it was started for it.
async fn completed(rt: &Runtime, name: &str, n: u64) {
    let id = tick(name, n);
    rt.wait_for_status(&id, RunStatus::Completed).await.unwrap();
    let (_, state) = rt.state::<Report>(&id).await.unwrap().unwrap();
    assert_eq!(
        state,
        Report::Done {
            tick_ms: T0 + n * MINUTE
        }
    );
}

/// The ids of the runs schedule `name` started, sorted.
async fn runs_of(rt: &Runtime, name: &str) -> Vec<String> {
    let filter = RunFilter::new().attribute(loops::SCHEDULE_ATTRIBUTE, name);
    let mut ids: Vec<String> = rt
        .list_runs_where(&filter)
        .await
        .unwrap()
        .into_iter()
        .map(|(info, _)| info.run_id)
        .collect();
    ids.sort();
    ids
}

/// One restart of the process, 3.5 ticks long, under `policy`: returns the minutes whose
/// ticks ran, and checks the handler ran once per run and the row's last tick.
async fn across_a_restart(policy: CatchUp) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let clock = clock();
    let reporter = Reporter::default();
    let rt = runtime(&clock, RedbStore::open(&path).unwrap(), &reporter);
    let row = schedule(&rt, "s", every_minute(policy)).await;
    assert_eq!(
        (row.through_ms, row.last_tick_ms, row.paused),
        (T0, None, false)
    );
    advance(&clock, MINUTE);
    completed(&rt, "s", 1).await;
    rt.shutdown().await;
    drop(rt);

    // Down from T0+1m to T0+4.5m: the ticks of minutes 2, 3 and 4 are missed.
    advance(&clock, 3 * MINUTE + MINUTE / 2);
    let rt = runtime(&clock, RedbStore::open(&path).unwrap(), &reporter);
    let row = schedule(&rt, "s", every_minute(policy)).await;
    let caught: Vec<u64> = match policy {
        CatchUp::Skip => vec![],
        CatchUp::Latest => vec![4],
        CatchUp::All => vec![2, 3, 4],
    };
    for &n in &caught {
        completed(&rt, "s", n).await;
    }
    // The catch-up is done when `schedule` returns: its row says so.
    let last = caught.last().copied().unwrap_or(1);
    assert_eq!(row.last_tick_ms, Some(T0 + last * MINUTE));
    advance(&clock, MINUTE);
    completed(&rt, "s", 5).await;
    let mut ran = vec![1];
    ran.extend(&caught);
    ran.push(5);
    let expected: Vec<String> = ran.iter().map(|n| tick("s", *n)).collect();
    assert_eq!(runs_of(&rt, "s").await, expected);
    assert_eq!(reporter.starts.load(Ordering::SeqCst), ran.len());
    let mut ticks = reporter.ticks.lock().unwrap().clone();
    ticks.sort_unstable();
    let expected_ticks: Vec<u64> = ran.iter().map(|n| T0 + n * MINUTE).collect();
    assert_eq!(ticks, expected_ticks);
    let listed = rt.schedules().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].name.as_str(),
            listed[0].info.last_tick_ms,
            listed[0].next_tick_ms,
            listed[0].info.catch_up,
        ),
        ("s", Some(T0 + 5 * MINUTE), Some(T0 + 6 * MINUTE), policy)
    );
    rt.shutdown().await;
    ran
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_skips_the_missed_ticks_under_skip() {
    assert_eq!(across_a_restart(CatchUp::Skip).await, [1, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_runs_the_latest_missed_tick_once_under_latest() {
    assert_eq!(across_a_restart(CatchUp::Latest).await, [1, 4, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_runs_every_missed_tick_under_all() {
    assert_eq!(across_a_restart(CatchUp::All).await, [1, 2, 3, 4, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_remove() {
    let clock = clock();
    let reporter = Reporter::default();
    let rt = runtime(&clock, RedbStore::in_memory().unwrap(), &reporter);
    schedule(&rt, "p", every_minute(CatchUp::All)).await;
    advance(&clock, MINUTE);
    completed(&rt, "p", 1).await;

    let paused = rt.pause_schedule("p").await.unwrap();
    assert!(paused.paused);
    let listed = rt.schedules().await.unwrap();
    assert_eq!(
        (listed[0].info.paused, listed[0].next_tick_ms),
        (true, None)
    );
    // Registered again (a restart): still paused.
    assert!(schedule(&rt, "p", every_minute(CatchUp::All)).await.paused);
    // Minutes 2 and 3 fall while it is paused; resumed at 3.5, they are not caught up.
    advance(&clock, 2 * MINUTE + MINUTE / 2);
    let resumed = rt.resume_schedule("p").await.unwrap();
    assert_eq!(
        (resumed.paused, resumed.through_ms),
        (false, T0 + 3 * MINUTE + MINUTE / 2)
    );
    advance(&clock, MINUTE);
    completed(&rt, "p", 4).await;
    assert_eq!(runs_of(&rt, "p").await, [tick("p", 1), tick("p", 4)]);

    rt.remove_schedule("p").await.unwrap();
    assert_eq!(rt.schedules().await.unwrap(), Vec::new());
    assert!(matches!(
        rt.remove_schedule("p").await,
        Err(Error::ScheduleNotFound { name }) if name == "p"
    ));
    assert!(matches!(
        rt.pause_schedule("p").await,
        Err(Error::ScheduleNotFound { .. })
    ));
    // Its loop stopped with the removal: another schedule's tick at minute 5 runs, not its.
    schedule(&rt, "q", every_minute(CatchUp::All)).await;
    advance(&clock, MINUTE);
    completed(&rt, "q", 5).await;
    assert_eq!(runs_of(&rt, "p").await, [tick("p", 1), tick("p", 4)]);
    // Registered anew after a removal, it counts its ticks from then: minute 5 is not
    // caught up.
    let again = schedule(&rt, "p", every_minute(CatchUp::All)).await;
    assert_eq!(
        (again.last_tick_ms, again.through_ms),
        (None, T0 + 5 * MINUTE + MINUTE / 2)
    );
    assert_eq!(runs_of(&rt, "p").await, [tick("p", 1), tick("p", 4)]);
    assert_eq!(reporter.starts.load(Ordering::SeqCst), 3);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_refused_when_invalid() {
    let clock = clock();
    let reporter = Reporter::default();
    let rt = runtime(&clock, RedbStore::in_memory().unwrap(), &reporter);
    let err = rt
        .schedule::<Report, _>("a b", every_minute(CatchUp::Skip), |t| Report::Start {
            tick_ms: t.at_ms,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidSchedule { name, .. } if name == "a b"),
        "{err}"
    );
    let bare = Runtime::builder()
        .clock(clock.clone())
        .build(RedbStore::in_memory().unwrap());
    let err = bare
        .schedule::<Report, _>("s", every_minute(CatchUp::Skip), |t| Report::Start {
            tick_ms: t.at_ms,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotRegistered { .. }), "{err}");
    assert_eq!(bare.schedules().await.unwrap(), Vec::new());
    // A pattern whose times are all past (the clock is in 2026) is refused, nothing stored.
    let past = Schedule::cron("* * * * * * 2020").unwrap();
    let err = rt
        .schedule::<Report, _>("past", past, |t| Report::Start { tick_ms: t.at_ms })
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "schedule `past`: `cron * * * * * * 2020 UTC` has no tick after now: its times are \
         all past"
    );
    assert_eq!(rt.schedules().await.unwrap(), Vec::new());
    assert!(Schedule::cron("0 25 * * *").is_err());
    assert!(Schedule::cron_in("0 9 * * *", "Nowhere/City").is_err());
    assert!(Schedule::every(Duration::ZERO).is_err());
}

/// Two runtimes on clones of one embedded store (each clone a worker of its own, one lease
/// per run between them) run the same schedule: every tick starts one run, its handler
/// runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runtimes_on_one_store_start_each_tick_once() {
    let clock = clock();
    let reporter = Reporter::default();
    let store = RedbStore::in_memory().unwrap();
    let a = runtime(&clock, store.clone(), &reporter);
    let b = runtime(&clock, store, &reporter);
    schedule(&a, "r", every_minute(CatchUp::All)).await;
    schedule(&b, "r", every_minute(CatchUp::All)).await;
    for n in 1..=5 {
        advance(&clock, MINUTE);
        completed(&a, "r", n).await;
    }
    // A burst of three ticks at once: each runs once too.
    advance(&clock, 3 * MINUTE);
    for n in 6..=8 {
        completed(&b, "r", n).await;
    }
    let expected: Vec<String> = (1..=8).map(|n| tick("r", n)).collect();
    assert_eq!(runs_of(&a, "r").await, expected);
    assert_eq!(reporter.starts.load(Ordering::SeqCst), 8);
    a.shutdown().await;
    b.shutdown().await;
}

/// A handler that never returns: its run stays running until its process stops.
struct Stuck;

impl ReportHandler for Stuck {
    type Error = BoxError;

    async fn start(&self, _ctx: &Context, _tick_ms: u64) -> Result<StartNext, BoxError> {
        std::future::pending().await
    }
}

/// A tick whose run was started but not settled (the process stopped in between) is fired
/// again by the next catch-up and driven when the schedule is registered again: without
/// `resume_all`, it would stay running for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_cut_short_before_it_settled_is_driven_by_the_next_catch_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let clock = clock();
    let reporter = Reporter::default();
    let rt = runtime(&clock, RedbStore::open(&path).unwrap(), &reporter);
    schedule(&rt, "s", every_minute(CatchUp::All)).await;
    rt.shutdown().await;
    drop(rt);
    // What a process that stopped between the tick's creation and its settlement left: the
    // run of minute 1, created, never driven; the schedule's row still at T0.
    advance(&clock, MINUTE);
    let nobody = Runtime::builder()
        .clock(clock.clone())
        .register::<Report, _>(Stuck)
        .build(RedbStore::open(&path).unwrap());
    nobody
        .start(
            &tick("s", 1),
            Report::Start {
                tick_ms: T0 + MINUTE,
            },
        )
        .await
        .unwrap();
    // Shutting down drops the stuck driver as a crash would.
    nobody.shutdown().await;
    drop(nobody);

    finishes_tick_one_when_registered_again(&path, &clock).await;
}

/// A tick's run cut short in its handler (its tick settled) is driven when the process
/// registers the schedule again, without `resume_all`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticks_run_cut_short_in_its_handler_is_driven_when_the_schedule_is_registered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let clock = clock();
    let stuck = Runtime::builder()
        .clock(clock.clone())
        .register::<Report, _>(Stuck)
        .build(RedbStore::open(&path).unwrap());
    schedule(&stuck, "s", every_minute(CatchUp::All)).await;
    advance(&clock, MINUTE);
    // The tick fires, its run sticks in its handler, and the tick settles.
    loop {
        let listed = stuck.schedules().await.unwrap();
        if listed[0].info.last_tick_ms == Some(T0 + MINUTE) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Shutting down drops the stuck driver as a crash would.
    stuck.shutdown().await;
    drop(stuck);

    finishes_tick_one_when_registered_again(&path, &clock).await;
}

/// Half a minute later, a process registers schedule `s` again (no `resume_all`): the run of
/// its tick at minute 1, left unfinished in the store at `path`, is driven to its end, once.
async fn finishes_tick_one_when_registered_again(path: &std::path::Path, clock: &ManualClock) {
    advance(clock, MINUTE / 2);
    let reporter = Reporter::default();
    let rt = runtime(clock, RedbStore::open(path).unwrap(), &reporter);
    let row = schedule(&rt, "s", every_minute(CatchUp::All)).await;
    assert_eq!(row.last_tick_ms, Some(T0 + MINUTE));
    tokio::time::timeout(Duration::from_secs(30), completed(&rt, "s", 1))
        .await
        .expect("the tick's run is driven");
    assert_eq!(*reporter.ticks.lock().unwrap(), [T0 + MINUTE]);
    rt.shutdown().await;
}
