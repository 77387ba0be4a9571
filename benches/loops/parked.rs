//! Scenario 9: a million parked runs in one process (issue 19, goal 3).
//!
//! N runs are seeded parked (`RedbStore::__seed_waiting`: the writes a handler makes when it
//! parks): half asleep until a time (`ctx.sleep_until`), spread evenly over a window that
//! starts a few seconds after the measuring child starts, half waiting for an event that
//! never comes (`ctx.wait_for`). A child process then opens the store and calls
//! `resume_all()`: its open and resume times, its peak resident set (against an idle
//! runtime's, the floor, measured in a child of its own) and the tasks alive right after
//! `resume_all()` (a parked run holds none) are taken; then every timer fires and its run
//! runs to its end. Each timer run's handler stamps when it was entered against its wake-up
//! time: its lateness (against the floor's: bare tokio sleeps to wall-clock times).

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use loops::{Context, RedbStore, RunStatus, Runtime, WaitInfo, Workflow};
use serde::{Deserialize, Serialize};

use crate::child;
use crate::measure::{median, micros, percentile, status_kib};

/// A run parks at once: until `until_ms` if set (a sleep), else for the event `go`.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "parked", version = 1)]
pub enum Park {
    #[initial]
    #[next(Done)]
    Park { until_ms: Option<u64> },
    #[terminal]
    Done { slept: bool },
}

/// Stamps each handler entry of a sleeping run against its wake-up time.
#[derive(Clone, Default)]
pub struct Stamper {
    /// Lateness of each entry, µs (wall clock at entry − wake-up time).
    pub late_us: Arc<Mutex<Vec<f64>>>,
    /// Entries of sleeping runs before their wake-up time (none expected).
    pub early: Arc<AtomicU64>,
    /// Sleeping runs whose handler returned (the run's end is its next commit).
    pub slept: Arc<AtomicU64>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl ParkHandler for Stamper {
    type Error = loops::Error;

    async fn park(&self, ctx: &Context, until_ms: Option<u64>) -> loops::Result<ParkNext> {
        let Some(until) = until_ms else {
            let _go: String = ctx.wait_for("go").await?;
            return Ok(ParkNext::Done { slept: false });
        };
        let late = now_us() as f64 - until as f64 * 1000.0;
        if late < 0.0 {
            self.early.fetch_add(1, Ordering::Relaxed);
        } else {
            self.late_us
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(late);
        }
        ctx.sleep_until(UNIX_EPOCH + Duration::from_millis(until))
            .await?;
        self.slept.fetch_add(1, Ordering::Relaxed);
        Ok(ParkNext::Done { slept: true })
    }
}

/// What a measuring child saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Child {
    /// Parked runs in the store (0: the idle floor).
    pub runs: u64,
    pub timers: u64,
    pub open_us: f64,
    pub resume_all_us: f64,
    /// Runs `resume_all()` returned.
    pub found: u64,
    /// Tokio tasks alive right after `resume_all()` returned.
    pub alive_tasks: u64,
    /// Peak resident set (`VmHWM`) right after `resume_all()` returned, and resident set.
    pub peak_kib: u64,
    pub rss_kib: u64,
    /// Seconds from `resume_all()`'s return to the first timer's wake-up time.
    pub lead_s: f64,
    /// Timer runs whose time had come by the end of `resume_all()`.
    pub due_at_resume: u64,
    pub early: u64,
    pub late_p50_us: f64,
    pub late_p99_us: f64,
    pub late_max_us: f64,
    /// From the first wake-up time until every timer run's handler returned.
    pub fire_s: f64,
    /// Runs still waiting at the end (the event runs) and runs completed.
    pub waiting_end: u64,
    pub completed_end: u64,
    /// Peak resident set over the child's life (the timers' runs included).
    pub peak_end_kib: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Parked {
    pub runs: u64,
    pub timers: u64,
    pub window_s: f64,
    pub file_bytes: u64,
    pub seed_s: f64,
    pub idle: Child,
    /// The child that let the timers fire.
    pub parked: Child,
    /// Children that only open and resume, then the timers' child.
    pub starts: Vec<Child>,
    /// Medians over `starts`: open, `resume_all()`, open plus `resume_all()` (seconds),
    /// and the peak resident set after `resume_all()`.
    pub open_ms: f64,
    pub resume_all_ms: f64,
    pub start_s: f64,
    pub peak_kib: f64,
    pub goal_start_s: f64,
    pub goal_peak_mib: f64,
}

/// Seeds `runs` parked runs (half of them asleep, spread over `window_s` from a start a few
/// seconds after seeding ends), then measures them in children: `reps - 1` that only open
/// and resume, then one that lets the timers fire, and an idle runtime.
pub fn run(dir: &Path, runs: u64, window_s: f64, reps: usize) -> Parked {
    let path = dir.join("parked.redb");
    let _ = std::fs::remove_file(&path);
    let timers = runs / 2;
    let events = runs - timers;
    let started = Instant::now();
    let store = RedbStore::open(&path).expect("open the store");
    let no_time = || WaitInfo {
        event: Some("go".to_owned()),
        until_ms: None,
    };
    store
        .__seed_waiting((0..events).map(|i| {
            (
                format!("event-{i:07}"),
                Park::Park { until_ms: None },
                no_time(),
            )
        }))
        .expect("seed the event runs");
    let events_s = started.elapsed().as_secs_f64();
    // The sleeping runs' times start a few seconds after the child has resumed them:
    // after the seeding still to come (estimated from the event runs' pace; a sleep writes
    // one more step), the child's start, and its open and resume (allowing 10 µs a run).
    let seed_guess_s = events_s * timers as f64 / events.max(1) as f64 * 1.5 + 1.0;
    // The children that only open and resume go first, while every run is still parked.
    let resume_guess_s = (2.0 + runs as f64 * 5e-6) * reps as f64 + 5.0;
    let first_ms = now_ms() + ((seed_guess_s + resume_guess_s) * 1000.0) as u64;
    let window_ms = (window_s * 1000.0) as u64;
    let until = move |i: u64| first_ms + i * window_ms / timers.max(1);
    let seeded = store
        .__seed_waiting((0..timers).map(|i| {
            let until_ms = Some(until(i));
            let wait = WaitInfo {
                event: None,
                until_ms,
            };
            (format!("sleep-{i:07}"), Park::Park { until_ms }, wait)
        }))
        .expect("seed the sleeping runs");
    assert_eq!(seeded, timers);
    drop(store);
    let seed_s = started.elapsed().as_secs_f64();
    let file_bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    eprintln!(
        "  seeded {runs} parked runs in {seed_s:.1} s ({file_bytes} bytes); first timer in {:.1} s",
        (first_ms as f64 - now_ms() as f64) / 1000.0
    );
    // More starts, for medians on a shared machine: resuming parked runs writes nothing,
    // so the same file serves, as long as no timer has fired (these go first).
    let mut starts = Vec::new();
    for _ in 1..reps {
        starts.push(measure(&path, runs, timers, false));
    }
    let parked = measure(&path, runs, timers, true);
    starts.push(parked.clone());
    let empty = dir.join("parked-idle.redb");
    let _ = std::fs::remove_file(&empty);
    let idle = measure(&empty, 0, 0, true);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&empty);
    let m = |f: &dyn Fn(&Child) -> f64| median(&starts.iter().map(f).collect::<Vec<_>>());
    Parked {
        runs,
        timers,
        window_s,
        file_bytes,
        seed_s,
        open_ms: m(&|c| c.open_us / 1000.0),
        resume_all_ms: m(&|c| c.resume_all_us / 1000.0),
        start_s: m(&|c| (c.open_us + c.resume_all_us) / 1e6),
        peak_kib: m(&|c| c.peak_kib as f64),
        starts,
        idle,
        parked,
        goal_start_s: 2.0,
        goal_peak_mib: 1024.0,
    }
}

fn now_ms() -> u64 {
    now_us() / 1000
}

fn measure(path: &Path, runs: u64, timers: u64, fire: bool) -> Child {
    let out: Child = child::run(&[
        if fire { "parked" } else { "parked-start" },
        "--path",
        &path.display().to_string(),
        "--child-runs",
        &runs.to_string(),
    ]);
    eprintln!(
        "  {runs:>7} parked: open {:.0} ms  resume_all {:.0} ms  {} tasks alive  peak {} KiB \
         (end {} KiB)  lateness p50 {:.1} ms p99 {:.1} ms max {:.1} ms  ({} early, {} due at resume, {} timers)",
        out.open_us / 1000.0,
        out.resume_all_us / 1000.0,
        out.alive_tasks,
        out.peak_kib,
        out.peak_end_kib,
        out.late_p50_us / 1000.0,
        out.late_p99_us / 1000.0,
        out.late_max_us / 1000.0,
        out.early,
        out.due_at_resume,
        timers,
    );
    out
}

/// The measuring child: `runs` parked runs (0: the idle floor, which times bare tokio
/// sleeps instead of the timers); unless `fire`, it stops after `resume_all()`.
pub fn child_main(path: &Path, runs: u64, fire: bool) -> Child {
    let tokio = crate::tokio_runtime();
    let stamper = Stamper::default();
    let started = Instant::now();
    // `LOOPS_BENCH_CACHE_MIB` sets redb's page cache, to compare sizes (default: loops').
    let cache = std::env::var("LOOPS_BENCH_CACHE_MIB")
        .ok()
        .and_then(|mib| mib.parse::<usize>().ok())
        .map_or(loops::DEFAULT_CACHE_BYTES, |mib| mib << 20);
    let rt = Runtime::builder()
        .register::<Park, _>(stamper.clone())
        .cache_bytes(cache)
        .open(path)
        .expect("open the store");
    let open_us = micros(started.elapsed());
    tokio.block_on(async {
        let started = Instant::now();
        let found = rt.resume_all().await.expect("resume_all").len() as u64;
        let resume_all_us = micros(started.elapsed());
        let alive_tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks() as u64;
        let (peak_kib, rss_kib) = (status_kib("VmHWM"), status_kib("VmRSS"));
        let resumed_ms = now_ms();
        if !fire {
            return Child {
                runs,
                open_us,
                resume_all_us,
                found,
                alive_tasks,
                peak_kib,
                rss_kib,
                ..Child::default()
            };
        }
        let sleeping = rt
            .list_runs(RunStatus::Waiting, Some(Park::NAME))
            .await
            .expect("list")
            .into_iter()
            .filter_map(|r| r.wait.and_then(|w| w.until_ms))
            .collect::<Vec<_>>();
        // As `run` seeds them (some may have woken already).
        let timers = runs / 2;
        let first = sleeping.iter().copied().min().unwrap_or(resumed_ms);
        let last = sleeping.iter().copied().max().unwrap_or(resumed_ms);
        let due_at_resume = sleeping.iter().filter(|&&u| u <= resumed_ms).count() as u64;
        drop(sleeping);
        let late = if runs == 0 {
            bare_sleeps(10_000).await
        } else {
            let deadline = Instant::now()
                + Duration::from_millis(last.saturating_sub(resumed_ms))
                + Duration::from_secs(900);
            while stamper.slept.load(Ordering::Relaxed) < timers {
                assert!(Instant::now() < deadline, "the timers did not all fire");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            std::mem::take(
                &mut *stamper
                    .late_us
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            )
        };
        let fire_s = (now_ms() as f64 - first as f64) / 1000.0;
        // Let the last runs commit their ends.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let count = |status| {
            let rt = rt.clone();
            async move {
                rt.list_runs(status, Some(Park::NAME))
                    .await
                    .expect("list")
                    .len() as u64
            }
        };
        Child {
            runs,
            timers,
            open_us,
            resume_all_us,
            found,
            alive_tasks,
            peak_kib,
            rss_kib,
            lead_s: (first as f64 - resumed_ms as f64) / 1000.0,
            due_at_resume,
            early: stamper.early.load(Ordering::Relaxed),
            late_p50_us: percentile(&late, 50.0),
            late_p99_us: percentile(&late, 99.0),
            late_max_us: percentile(&late, 100.0),
            fire_s,
            waiting_end: count(RunStatus::Waiting).await,
            completed_end: count(RunStatus::Completed).await,
            peak_end_kib: status_kib("VmHWM"),
        }
    })
}

/// The floor of lateness: `n` tasks each sleeping (tokio) until a wall-clock ms spread over
/// two seconds, as the runtime's timer task does; each one's lateness, µs.
async fn bare_sleeps(n: u64) -> Vec<f64> {
    let first = now_ms() + 500;
    let late = Arc::new(Mutex::new(Vec::with_capacity(n as usize)));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let late = Arc::clone(&late);
        tasks.spawn(async move {
            let at_ms = first + i * 2000 / n;
            let wait = Duration::from_micros((at_ms * 1000).saturating_sub(now_us()));
            tokio::time::sleep(wait).await;
            let l = now_us() as f64 - at_ms as f64 * 1000.0;
            late.lock().unwrap_or_else(PoisonError::into_inner).push(l);
        });
    }
    while tasks.join_next().await.is_some() {}
    std::mem::take(&mut *late.lock().unwrap_or_else(PoisonError::into_inner))
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Scenario 9's lines of the goals table.
pub fn goals(s: &mut String, x: &Parked, met: fn(bool) -> &'static str, n: fn(f64) -> String) {
    let at = if x.runs < 1_000_000 {
        format!(" (measured at {} runs)", n(x.runs as f64))
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "| 3. 1 000 000 parked runs started (open + `resume_all()`) in under {:.0} s{at} | {:.2} s, median of {} (idle runtime {:.3} s) | {} |",
        x.goal_start_s,
        x.start_s,
        x.starts.len(),
        (x.idle.open_us + x.idle.resume_all_us) / 1e6,
        met(x.start_s < x.goal_start_s)
    );
    let _ = writeln!(
        s,
        "| 3. peak resident memory under {:.0} GiB{at} | {:.0} MiB after `resume_all()`, {:.0} MiB after every timer fired (idle runtime {:.1} MiB) | {} |",
        x.goal_peak_mib / 1024.0,
        x.peak_kib / 1024.0,
        mib(x.parked.peak_end_kib),
        mib(x.idle.peak_end_kib),
        met(mib(x.parked.peak_end_kib).max(x.peak_kib / 1024.0) < x.goal_peak_mib)
    );
}

/// Scenario 9's section.
pub fn section(s: &mut String, x: &Parked, n: fn(f64) -> String) {
    let (p, i) = (&x.parked, &x.idle);
    let _ = writeln!(
        s,
        "### 9. {} parked runs in one process\n\n\
         {} runs seeded parked (`RedbStore::__seed_waiting`, the writes of a handler that \
         parks) in {:.0} s, a file of {:.0} MiB: {} asleep until a time (`ctx.sleep_until`), \
         spread evenly over {:.0} s starting {:.1} s after `resume_all()` returned, and {} \
         waiting for an event that never comes (`ctx.wait_for`). One child process opens the \
         store (`verify_on_open` on, the default) and calls `resume_all()`, then lets every \
         timer fire and its run end (a driver claims the run, commits its wake, re-enters the \
         handler, which stamps its entry against its wake-up time, and commits `Done`). The \
         floor is another child with an empty store: open, `resume_all()`, and 10 000 bare \
         tokio sleeps to wall-clock times spread over 2 s. Open, `resume_all()` and the peak \
         after it are medians over {} children on the same file (resuming parked runs writes \
         nothing); the others are the timers' child's.\n",
        n(x.runs as f64),
        n(x.runs as f64),
        x.seed_s,
        x.file_bytes as f64 / (1024.0 * 1024.0),
        n(x.timers as f64),
        x.window_s,
        p.lead_s,
        n((x.runs - x.timers) as f64),
        x.starts.len(),
    );
    let _ = writeln!(
        s,
        "| | {} parked runs | idle runtime (floor) |\n|---|---:|---:|\n\
         | open | {:.0} ms | {:.1} ms |\n\
         | `resume_all()` | {:.0} ms ({} runs found) | {:.1} ms |\n\
         | tasks alive after `resume_all()` | {} | {} |\n\
         | peak RSS after `resume_all()` | {:.1} MiB | {:.1} MiB |\n\
         | peak RSS after every timer fired | {:.1} MiB | {:.1} MiB |\n\
         | timer lateness p50 / p99 / max | {:.1} / {:.1} / {:.1} ms | {:.1} / {:.1} / {:.1} ms |\n",
        n(x.runs as f64),
        x.open_ms,
        i.open_us / 1000.0,
        x.resume_all_ms,
        n(p.found as f64),
        i.resume_all_us / 1000.0,
        p.alive_tasks,
        i.alive_tasks,
        x.peak_kib / 1024.0,
        mib(i.peak_kib),
        mib(p.peak_end_kib),
        mib(i.peak_end_kib),
        p.late_p50_us / 1000.0,
        p.late_p99_us / 1000.0,
        p.late_max_us / 1000.0,
        i.late_p50_us / 1000.0,
        i.late_p99_us / 1000.0,
        i.late_max_us / 1000.0,
    );
    let _ = writeln!(
        s,
        "Lateness: the handler's entry (wall clock) minus the run's wake-up time, over all {} \
         timer runs ({} entered early, {} already due when `resume_all()` returned); the \
         floor's, over its bare sleeps. The timers fired and their runs ended within {:.1} s \
         of the first wake-up time ({:.0} s window); at the end {} runs were completed and {} \
         still waiting for their event.\n",
        n(p.timers as f64),
        p.early,
        p.due_at_resume,
        p.fire_s,
        x.window_s,
        n(p.completed_end as f64),
        n(p.waiting_end as f64),
    );
}
