//! Scenario 2: transitions per second at N concurrent runs, against one commit per transition.
//!
//! The floor is the raw redb commit rate with one record per commit (redb runs one write
//! transaction at a time, so concurrent writers cannot beat it without batching). The
//! ceiling, for context, is raw redb committing N records appended to one log keyed by a
//! global sequence and N rows per commit (store format 2's layout): what a perfect group
//! commit of N runs' transitions could reach.
//!
//! For each N, the N runs are started once and then measured in short slices interleaved with
//! slices of the floor and of the ceiling (loops, floor, ceiling, in an order rotated slice by
//! slice); during the raw slices every run is held at its next handler entry, so that the
//! loops store is idle. Slices are short (a quarter of a second) because the disk's latency
//! drifts fast on a shared machine; each figure is the median over slices, and each ratio the
//! median of the ratios within a slice triple.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use loops::Runtime;
use serde::Serialize;
use tokio::task::JoinSet;

use crate::batches::{self, Distribution};
use crate::measure::{Layout, Raw, median, process_cpu_ns};
use crate::workload::{Bench, Looper, note};

#[derive(Debug, Clone, Serialize)]
pub struct Slice {
    pub loops_per_s: f64,
    pub floor_per_s: f64,
    pub ceiling_per_s: f64,
    /// CPU time of the whole process (all threads, user and kernel) per transition.
    pub loops_cpu_us: f64,
    /// CPU time per record of the ceiling's raw commits.
    pub ceiling_cpu_us: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub runs: usize,
    /// loops: transitions committed per second (median over slices).
    pub loops_per_s: f64,
    /// Raw redb, one record per commit: commits per second.
    pub floor_per_s: f64,
    /// Raw redb, `runs` records and rows per commit: records per second.
    pub ceiling_per_s: f64,
    /// Median over slices of loops / floor.
    pub ratio: f64,
    /// Median over slices of loops / ceiling.
    pub of_ceiling: f64,
    /// Median over slices: CPU time per transition (all threads), and per raw record at the
    /// ceiling.
    pub loops_cpu_us: f64,
    pub ceiling_cpu_us: f64,
    /// Transitions per group commit over all of loops' slices.
    pub batches: Distribution,
    pub slices: Vec<Slice>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub slices: usize,
    pub slice_s: f64,
    pub warmup_s: f64,
    pub points: Vec<Point>,
    /// Goals (issue 19, goal 1): at least `goal`x the floor at `goal_runs` runs, for each pair.
    pub goals: Vec<(usize, f64)>,
}

pub struct Config {
    pub runs: Vec<usize>,
    pub slices: usize,
    pub slice: Duration,
    pub warmup: Duration,
}

pub fn run(
    tokio: &tokio::runtime::Runtime,
    dir: &Path,
    cfg: &Config,
    record_bytes: usize,
    row_bytes: usize,
) -> Throughput {
    let points: Vec<Point> = cfg
        .runs
        .iter()
        .map(|&n| point(tokio, dir, cfg, n, record_bytes, row_bytes))
        .collect();
    Throughput {
        slices: cfg.slices,
        slice_s: cfg.slice.as_secs_f64(),
        warmup_s: cfg.warmup.as_secs_f64(),
        points,
        goals: vec![(64, 20.0), (256, 30.0)],
    }
}

fn point(
    tokio: &tokio::runtime::Runtime,
    dir: &Path,
    cfg: &Config,
    n: usize,
    record_bytes: usize,
    row_bytes: usize,
) -> Point {
    let loops_path = dir.join(format!("tp-{n}.redb"));
    let mut floor = Raw::create(
        &dir.join(format!("tp-{n}-floor.redb")),
        record_bytes,
        row_bytes,
    );
    let mut ceiling = Raw::create(
        &dir.join(format!("tp-{n}-ceiling.redb")),
        record_bytes,
        row_bytes,
    );
    for _ in 0..5 {
        floor.commit(1, false);
        ceiling.commit_as(Layout::Log, n, true);
    }
    let rt = Runtime::open(&loops_path).expect("open the loops store");
    let (looper, mut tasks) = start_runs(tokio, &rt, n, cfg.warmup);

    // Only loops' slices commit through loops (its runs are held during the others').
    batches::start();
    let mut slices = Vec::with_capacity(cfg.slices);
    for s in 0..cfg.slices {
        let mut slice = Slice {
            loops_per_s: 0.0,
            floor_per_s: 0.0,
            ceiling_per_s: 0.0,
            loops_cpu_us: 0.0,
            ceiling_cpu_us: 0.0,
        };
        for k in 0..3 {
            match (k + s) % 3 {
                0 => {
                    (slice.floor_per_s, _) =
                        raw_rate(&mut floor, Layout::ByRun, 1, false, cfg.slice)
                }
                1 => {
                    (slice.ceiling_per_s, slice.ceiling_cpu_us) =
                        raw_rate(&mut ceiling, Layout::Log, n, true, cfg.slice)
                }
                _ => (slice.loops_per_s, slice.loops_cpu_us) = loops_rate(&looper, cfg.slice),
            }
        }
        slices.push(slice);
    }
    batches::stop();
    let batches = batches::distribution();
    looper.stop.store(true, Ordering::Relaxed);
    looper.unpause();
    tokio.block_on(async {
        while let Some(done) = tasks.join_next().await {
            done.expect("a driver task").expect("a run ends");
        }
    });
    drop(rt);
    for f in ["tp-{n}.redb", "tp-{n}-floor.redb", "tp-{n}-ceiling.redb"] {
        let _ = std::fs::remove_file(dir.join(f.replace("{n}", &n.to_string())));
    }
    let m = |f: &dyn Fn(&Slice) -> f64| median(&slices.iter().map(f).collect::<Vec<_>>());
    let p = Point {
        runs: n,
        loops_per_s: m(&|r| r.loops_per_s),
        floor_per_s: m(&|r| r.floor_per_s),
        ceiling_per_s: m(&|r| r.ceiling_per_s),
        ratio: m(&|r| r.loops_per_s / r.floor_per_s),
        of_ceiling: m(&|r| r.loops_per_s / r.ceiling_per_s),
        loops_cpu_us: m(&|r| r.loops_cpu_us),
        ceiling_cpu_us: m(&|r| r.ceiling_cpu_us),
        batches,
        slices,
    };
    eprintln!(
        "  {n:>3} runs: loops {:>8.0}/s ({:>5.1} µs CPU each)  floor {:>6.0}/s  ratio {:>5.1}x  \
         ceiling {:>8.0}/s ({:>5.1} µs CPU each)  batch mean {:.1}, p50 {}, p90 {}",
        p.loops_per_s,
        p.loops_cpu_us,
        p.floor_per_s,
        p.ratio,
        p.ceiling_per_s,
        p.ceiling_cpu_us,
        p.batches.mean,
        p.batches.p50,
        p.batches.p90,
    );
    p
}

/// Waits until no handler has been entered for 20 ms: every run is held at its entry, no
/// write is in flight.
pub fn quiesce(looper: &Looper) {
    let mut last = looper.entries.load(Ordering::Relaxed);
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = looper.entries.load(Ordering::Relaxed);
        if now == last {
            return;
        }
        last = now;
    }
}

/// Records per second of raw commits of `runs` records (and rows) each, for `window`, and
/// the CPU time per record.
pub fn raw_rate(
    raw: &mut Raw,
    layout: Layout,
    runs: usize,
    rows: bool,
    window: Duration,
) -> (f64, f64) {
    let cpu = process_cpu_ns();
    let started = Instant::now();
    let mut commits = 0u64;
    while started.elapsed() < window {
        raw.commit_as(layout, runs, rows);
        commits += 1;
    }
    let records = (commits * runs as u64) as f64;
    let cpu_us = (process_cpu_ns() - cpu) as f64 / 1000.0 / records;
    (records / started.elapsed().as_secs_f64(), cpu_us)
}

/// Lets the held runs go for `window` (after a short ramp), then holds them again; returns
/// transitions per second and the process's CPU time per transition.
pub fn loops_rate(looper: &Looper, window: Duration) -> (f64, f64) {
    looper.unpause();
    std::thread::sleep(Duration::from_millis(10));
    let (c0, t0, cpu0) = (
        looper.entries.load(Ordering::Relaxed),
        Instant::now(),
        process_cpu_ns(),
    );
    std::thread::sleep(window);
    let (c1, t1, cpu1) = (
        looper.entries.load(Ordering::Relaxed),
        Instant::now(),
        process_cpu_ns(),
    );
    looper.pause();
    quiesce(looper);
    let transitions = (c1 - c0) as f64;
    (
        transitions / (t1 - t0).as_secs_f64(),
        (cpu1 - cpu0) as f64 / 1000.0 / transitions.max(1.0),
    )
}

/// Starts `n` runs that count down from far away, lets them go for `warmup`, then holds them
/// at their next handler entry (the throughput scenarios' runs).
pub fn start_runs(
    tokio: &tokio::runtime::Runtime,
    rt: &Runtime,
    n: usize,
    warmup: Duration,
) -> (Arc<Looper>, JoinSet<loops::Result<()>>) {
    let looper = Looper::counting();
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let (rt, h) = (rt.clone(), looper.clone());
        tasks.spawn_on(
            async move {
                let start = Bench::Start {
                    left: 1 << 40,
                    note: note(),
                };
                rt.run(&format!("run-{i:06}"), start, &*h).await.map(|_| ())
            },
            tokio.handle(),
        );
    }
    std::thread::sleep(warmup);
    looper.pause();
    quiesce(&looper);
    (looper, tasks)
}
