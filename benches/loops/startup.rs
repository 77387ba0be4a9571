//! Scenario 5: startup with many unfinished runs: open the store, list the unfinished runs
//! from the status index and start a driver for each.
//!
//! The runs are seeded (status running, one record each). Each measurement is a child
//! process on a fresh copy of the file: `Runtime::builder().register(..).open(path)`, then
//! `resume_all()`, until every run's handler has been entered (a driver claimed the run, read
//! its row and latest record, and committed its new attempt). The handler then blocks, so
//! that what is measured is listing and spawning, not work.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use loops::{RedbStore, Runtime};
use serde::{Deserialize, Serialize};

use crate::child;
use crate::measure::{median, micros, status_kib};
use crate::workload::{Bench, Blocker, seed_unfinished};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Child {
    pub runs: u64,
    /// `Runtime::builder().register(..).open(path)`: the schema pre-check of every
    /// unfinished run, then the open itself (verify_on_open on, the default).
    pub open_us: f64,
    /// `resume_all()` returned: every unfinished run listed and a driver spawned for each.
    pub resume_all_us: f64,
    /// From the start of `resume_all()` until every run's handler was entered.
    pub all_entered_us: f64,
    pub found: u64,
    pub process_peak_kib: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Startup {
    pub runs: u64,
    pub reps: usize,
    pub file_bytes: u64,
    pub seed_s: f64,
    pub open_ms: f64,
    pub resume_all_ms: f64,
    pub all_entered_ms: f64,
    /// Open plus all entered, per run.
    pub per_run_us: f64,
    pub resume_all_per_run_us: f64,
    pub process_peak_kib: f64,
    pub children: Vec<Child>,
}

pub fn run(dir: &Path, runs: u64, reps: usize) -> Startup {
    let template = dir.join("startup.redb");
    let started = Instant::now();
    {
        let store = RedbStore::open(&template).expect("open the template");
        seed_unfinished(&store, runs);
    }
    let seed_s = started.elapsed().as_secs_f64();
    let file_bytes = std::fs::metadata(&template).map_or(0, |m| m.len());
    eprintln!("  seeded {runs} unfinished runs in {seed_s:.1} s ({file_bytes} bytes)");
    let mut children = Vec::new();
    for _ in 0..reps {
        let work = dir.join("startup-work.redb");
        child::copy_synced(&template, &work);
        let out: Child = child::run(&[
            "startup",
            "--path",
            &work.display().to_string(),
            "--child-runs",
            &runs.to_string(),
        ]);
        eprintln!(
            "  open {:>7.0} ms  resume_all {:>7.0} ms  all entered {:>7.0} ms  peak {} KiB",
            out.open_us / 1000.0,
            out.resume_all_us / 1000.0,
            out.all_entered_us / 1000.0,
            out.process_peak_kib
        );
        children.push(out);
        let _ = std::fs::remove_file(&work);
    }
    let _ = std::fs::remove_file(&template);
    let m = |f: &dyn Fn(&Child) -> f64| median(&children.iter().map(f).collect::<Vec<_>>());
    Startup {
        runs,
        reps,
        file_bytes,
        seed_s,
        open_ms: m(&|c| c.open_us / 1000.0),
        resume_all_ms: m(&|c| c.resume_all_us / 1000.0),
        all_entered_ms: m(&|c| c.all_entered_us / 1000.0),
        per_run_us: m(&|c| (c.open_us + c.all_entered_us) / c.runs as f64),
        resume_all_per_run_us: m(&|c| c.resume_all_us / c.runs as f64),
        process_peak_kib: m(&|c| c.process_peak_kib as f64),
        children,
    }
}

pub fn child_main(path: &Path, runs: u64) -> Child {
    let tokio = crate::tokio_runtime();
    let blocker = Blocker::default();
    let entered = blocker.entered.clone();
    let started = Instant::now();
    let rt = Runtime::builder()
        .register::<Bench, _>(blocker)
        .open(path)
        .expect("open the store");
    let open_us = micros(started.elapsed());
    let (resume_all_us, all_entered_us, found) = tokio.block_on(async {
        let started = Instant::now();
        let found = rt.resume_all().await.expect("resume_all").len() as u64;
        let resume_all_us = micros(started.elapsed());
        let deadline = Instant::now() + Duration::from_secs(600);
        while entered.load(Ordering::Relaxed) < runs {
            assert!(Instant::now() < deadline, "the drivers did not all start");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        (resume_all_us, micros(started.elapsed()), found)
    });
    Child {
        runs,
        open_us,
        resume_all_us,
        all_entered_us,
        found,
        process_peak_kib: status_kib("VmHWM"),
    }
}
