//! Schedules on PostgreSQL: two workers (two runtimes, each on a store with its own pool and
//! lease owner) run the same schedule on one manual clock, tick after tick, through a burst
//! of ticks and across a restart of both whose catch-up they race; every tick starts one
//! run, whose handler runs once, exactly as the catch-up policy says.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use loops::testing::ManualClock;
use loops::{
    BoxError, CatchUp, Context, RunFilter, RunStatus, Runtime, Schedule, Workflow, tick_run_id,
};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Report {
    #[initial]
    #[next(Done)]
    Start { tick_ms: u64 },
    #[terminal]
    Done { tick_ms: u64 },
}

/// Counts the executions of `Start`'s handler, in both workers.
#[derive(Clone, Default)]
struct Reporter {
    starts: Arc<AtomicUsize>,
}

impl ReportHandler for Reporter {
    type Error = BoxError;

    async fn start(&self, _ctx: &Context, tick_ms: u64) -> Result<StartNext, BoxError> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        Ok(StartNext::Done { tick_ms })
    }
}

/// 2026-12-02T00:00:00Z.
const T0: u64 = 1_796_169_600_000;
const MINUTE: u64 = 60_000;

fn tick(n: u64) -> String {
    tick_run_id("race", T0 + n * MINUTE)
}

async fn worker(schema: &common::TestSchema, clock: &ManualClock, r: &Reporter) -> Runtime {
    let store = schema.store(Duration::from_secs(10)).await;
    Runtime::builder()
        .clock(clock.clone())
        .register::<Report, _>(r.clone())
        .build(store)
}

async fn register(rt: &Runtime, policy: CatchUp) {
    let every = Schedule::every(Duration::from_secs(60))
        .unwrap()
        .catch_up(policy);
    rt.schedule::<Report, _>("race", every, |t| Report::Start { tick_ms: t.at_ms })
        .await
        .unwrap();
}

async fn completed(rt: &Runtime, n: u64) {
    rt.wait_for_status(&tick(n), RunStatus::Completed)
        .await
        .unwrap();
}

async fn runs(rt: &Runtime) -> Vec<String> {
    let filter = RunFilter::new().attribute(loops::SCHEDULE_ATTRIBUTE, "race");
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

/// Both workers run the schedule for 6 ticks one by one and a burst of 3, stop, and start
/// again 3.5 ticks later, registering at once: the 3 missed ticks run as `policy` says.
async fn two_workers(test: &str, policy: CatchUp) -> Vec<u64> {
    let schema = common::TestSchema::new(test).await;
    let clock = ManualClock::new(UNIX_EPOCH + Duration::from_millis(T0));
    let reporter = Reporter::default();
    let a = worker(&schema, &clock, &reporter).await;
    let b = worker(&schema, &clock, &reporter).await;
    tokio::join!(register(&a, policy), register(&b, policy));
    for n in 1..=6 {
        clock.advance(Duration::from_millis(MINUTE));
        completed(if n % 2 == 0 { &a } else { &b }, n).await;
    }
    clock.advance(Duration::from_millis(3 * MINUTE));
    // A loop that wakes late fires the latest tick, or, under `All`, each one.
    let burst: Vec<u64> = match policy {
        CatchUp::All => vec![7, 8, 9],
        CatchUp::Skip | CatchUp::Latest => vec![9],
    };
    for &n in &burst {
        completed(&a, n).await;
    }
    a.shutdown().await;
    b.shutdown().await;
    drop((a, b));

    // Down from minute 9 to 12.5: the ticks of minutes 10, 11 and 12 are missed.
    clock.advance(Duration::from_millis(3 * MINUTE + MINUTE / 2));
    let a = worker(&schema, &clock, &reporter).await;
    let b = worker(&schema, &clock, &reporter).await;
    tokio::join!(register(&a, policy), register(&b, policy));
    let caught: Vec<u64> = match policy {
        CatchUp::Skip => vec![],
        CatchUp::Latest => vec![12],
        CatchUp::All => vec![10, 11, 12],
    };
    for &n in &caught {
        completed(&b, n).await;
    }
    clock.advance(Duration::from_millis(MINUTE));
    completed(&a, 13).await;
    let mut ran: Vec<u64> = (1..=6).collect();
    ran.extend(burst);
    ran.extend(caught);
    ran.push(13);
    let expected: Vec<String> = ran.iter().map(|n| tick(*n)).collect();
    assert_eq!(runs(&a).await, expected);
    // One execution of the first handler per tick, across both workers.
    assert_eq!(reporter.starts.load(Ordering::SeqCst), ran.len());
    let listed = b.schedules().await.unwrap();
    assert_eq!(listed[0].info.last_tick_ms, Some(T0 + 13 * MINUTE));
    a.shutdown().await;
    b.shutdown().await;
    ran
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_start_each_tick_once_and_catch_up_every_missed_tick() {
    let ran = two_workers("sched_all", CatchUp::All).await;
    assert_eq!(ran, (1..=13).collect::<Vec<u64>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_catch_up_the_latest_missed_tick_once() {
    let ran = two_workers("sched_latest", CatchUp::Latest).await;
    assert_eq!(ran, [1, 2, 3, 4, 5, 6, 9, 12, 13]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_skip_the_missed_ticks() {
    let ran = two_workers("sched_skip", CatchUp::Skip).await;
    assert_eq!(ran, [1, 2, 3, 4, 5, 6, 9, 13]);
}
