//! Scenario 4: resuming a run with 10, 10 000 or 1 000 000 transitions behind it.
//!
//! The histories are seeded with `RedbStore::__seed_history` (the writer's own encoding and
//! key layout, many records per commit). Each measurement is a child process on a fresh copy
//! of the seeded file (a resume writes): it opens the store, takes its own floor (raw redb
//! commits on the same disk, the drift of whose latency would otherwise swamp the comparison
//! of two resumes of two commits each), then resumes the run, whose
//! latest state is one transition from its end: read the row and the latest record, count
//! the attempt (a commit), run one handler, commit the terminal transition. Memory is the
//! peak resident set of that child during the resume (its peak counter reset after the open)
//! and over its whole life.

use std::path::Path;
use std::time::Instant;

use loops::{RedbStore, Runtime};
use serde::{Deserialize, Serialize};

use crate::child;
use crate::measure::{Raw, median, micros, percentile, process_cpu_ns, reset_peak_rss, status_kib};
use crate::workload::{Bench, Looper, history, note};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Child {
    pub verify_on_open: bool,
    /// Opening the store (`Runtime::builder().open`).
    pub open_us: f64,
    /// The first `runtime.state::<W>()` after the open: the run's row and latest record.
    pub read_us: f64,
    /// `Runtime::run` to the end: read, attempt commit, one handler, the last transition's
    /// commit.
    pub resume_us: f64,
    /// `Runtime::run` until its handler was entered (the first new step: read, attempt
    /// commit).
    pub entry_us: f64,
    /// CPU time of the whole process (all threads) during `resume_us`.
    pub resume_cpu_us: f64,
    /// p50 of 50 more `state()` reads afterwards (warm).
    pub read_warm_us: f64,
    /// p50 of 9 raw redb single-record commits this child made just before the resume.
    pub floor_us: f64,
    /// Resident set after the open, before the resume.
    pub rss_before_kib: u64,
    /// Peak resident set during the resume, minus `rss_before_kib`.
    pub resume_peak_growth_kib: u64,
    /// Peak resident set of the whole child (open included).
    pub process_peak_kib: u64,
    /// Whether the kernel let the peak counter be reset (else the growth is an upper bound).
    pub peak_reset: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub records: u64,
    pub file_bytes: u64,
    pub seed_s: f64,
    /// Medians over the children with verify_on_open on (the default).
    pub open_ms: f64,
    pub read_us: f64,
    pub resume_us: f64,
    /// Median over children of the whole resume over the child's own floor.
    pub resume_over_floor: f64,
    pub resume_cpu_us: f64,
    pub read_warm_us: f64,
    pub resume_peak_growth_kib: f64,
    pub process_peak_kib: f64,
    /// Medians over the children with verify_on_open off.
    pub open_no_verify_ms: f64,
    pub resume_no_verify_us: f64,
    pub process_peak_no_verify_kib: f64,
    pub children: Vec<Child>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Resume {
    pub reps: usize,
    pub reps_no_verify: usize,
    pub points: Vec<Point>,
    /// Largest over smallest history: the whole resume in units of its child's floor (the
    /// goal's figure), in wall time, in CPU time; the read; memory growth during the resume.
    pub ratio_resume_floors: f64,
    pub ratio_resume: f64,
    pub ratio_resume_cpu: f64,
    /// The whole resume's ratio with `verify_on_open` off.
    pub ratio_resume_no_verify: f64,
    pub ratio_read: f64,
    pub ratio_memory: f64,
    /// Goal: the largest history resumes within 1.5x of the smallest (time and memory).
    pub goal: f64,
    pub goal_met: bool,
}

pub fn run(dir: &Path, sizes: &[u64], reps: usize, reps_no_verify: usize) -> Resume {
    let mut templates = Vec::new();
    for &records in sizes {
        let path = dir.join(format!("resume-{records}.redb"));
        let started = Instant::now();
        {
            let store = RedbStore::open(&path).expect("open the template");
            store
                .__seed_history(history("target", records))
                .expect("seed the history");
        }
        let seed_s = started.elapsed().as_secs_f64();
        let file_bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
        eprintln!("  seeded {records} records in {seed_s:.1} s ({file_bytes} bytes)");
        templates.push((records, path, seed_s, file_bytes));
    }
    let mut children: Vec<Vec<Child>> = vec![Vec::new(); sizes.len()];
    let plan: Vec<bool> = std::iter::repeat_n(true, reps)
        .chain(std::iter::repeat_n(false, reps_no_verify))
        .collect();
    for (rep, &verify) in plan.iter().enumerate() {
        for k in 0..templates.len() {
            let i = (k + rep) % templates.len();
            let (records, template, ..) = &templates[i];
            let work = dir.join("resume-work.redb");
            child::copy_synced(template, &work);
            let out: Child = child::run(&[
                "resume",
                "--path",
                &work.display().to_string(),
                "--verify",
                if verify { "true" } else { "false" },
            ]);
            eprintln!(
                "  {records:>8} records, verify {verify:>5}: open {:>8.1} ms  read {:>6.0} µs  \
                 resume {:>7.0} µs ({:>5.0} µs CPU)  peak growth {:>6} KiB  process peak {:>7} KiB",
                out.open_us / 1000.0,
                out.read_us,
                out.resume_us,
                out.resume_cpu_us,
                out.resume_peak_growth_kib,
                out.process_peak_kib
            );
            children[i].push(out);
            let _ = std::fs::remove_file(&work);
        }
    }
    let points: Vec<Point> = templates
        .into_iter()
        .zip(children)
        .map(|((records, path, seed_s, file_bytes), children)| {
            let _ = std::fs::remove_file(path);
            let on: Vec<&Child> = children.iter().filter(|c| c.verify_on_open).collect();
            let off: Vec<&Child> = children.iter().filter(|c| !c.verify_on_open).collect();
            let m = |cs: &[&Child], f: &dyn Fn(&Child) -> f64| {
                median(&cs.iter().map(|c| f(c)).collect::<Vec<_>>())
            };
            Point {
                records,
                file_bytes,
                seed_s,
                open_ms: m(&on, &|c| c.open_us / 1000.0),
                read_us: m(&on, &|c| c.read_us),
                resume_us: m(&on, &|c| c.resume_us),
                resume_over_floor: m(&on, &|c| c.resume_us / c.floor_us),
                resume_cpu_us: m(&on, &|c| c.resume_cpu_us),
                read_warm_us: m(&on, &|c| c.read_warm_us),
                resume_peak_growth_kib: m(&on, &|c| c.resume_peak_growth_kib as f64),
                process_peak_kib: m(&on, &|c| c.process_peak_kib as f64),
                open_no_verify_ms: m(&off, &|c| c.open_us / 1000.0),
                resume_no_verify_us: m(&off, &|c| c.resume_us),
                process_peak_no_verify_kib: m(&off, &|c| c.process_peak_kib as f64),
                children,
            }
        })
        .collect();
    let (first, last) = (&points[0], &points[points.len() - 1]);
    let ratio_resume_floors = last.resume_over_floor / first.resume_over_floor;
    let ratio_resume = last.resume_us / first.resume_us;
    let ratio_resume_cpu = last.resume_cpu_us / first.resume_cpu_us;
    let ratio_resume_no_verify = last.resume_no_verify_us / first.resume_no_verify_us;
    let ratio_read = last.read_us / first.read_us;
    // Growth is a few pages; a difference of one page is noise, so compare with one page of
    // slack (4 KiB) on both sides.
    let ratio_memory = (last.resume_peak_growth_kib + 4.0) / (first.resume_peak_growth_kib + 4.0);
    let goal = 1.5;
    Resume {
        reps,
        reps_no_verify,
        ratio_resume_floors,
        ratio_resume,
        ratio_resume_cpu,
        ratio_resume_no_verify,
        ratio_read,
        ratio_memory,
        goal,
        goal_met: ratio_resume_floors <= goal && ratio_memory <= goal,
        points,
    }
}

/// The child: open, resume, report.
pub fn child_main(path: &Path, verify: bool) -> Child {
    let tokio = crate::tokio_runtime();
    let started = Instant::now();
    let rt = Runtime::builder()
        .verify_on_open(verify)
        .open(path)
        .expect("open the store");
    let open_us = micros(started.elapsed());
    // This child's own floor, taken just before the resume on the same disk: the whole resume
    // is two commits, and the disk's latency drifts between children.
    let floor_path = path.with_extension("floor.redb");
    let mut raw = Raw::create(&floor_path, 275, 159);
    let floor: Vec<f64> = (0..9).map(|_| micros(raw.commit(1, false))).collect();
    let floor_us = percentile(&floor, 50.0);
    drop(raw);
    let _ = std::fs::remove_file(&floor_path);
    let rss_before_kib = status_kib("VmRSS");
    let open_peak_kib = status_kib("VmHWM");
    let peak_reset = reset_peak_rss();
    let (read_us, resume_us, entry_us, resume_cpu_us, warm) = tokio.block_on(async {
        let started = Instant::now();
        let (seq, state) = rt
            .state::<Bench>("target")
            .await
            .expect("read")
            .expect("the run exists");
        let read_us = micros(started.elapsed());
        assert!(matches!(
            state,
            Bench::Work { left: 0, .. } | Bench::Start { left: 0, .. }
        ));
        let h = Looper::stamping(0, 1);
        let cpu = process_cpu_ns();
        let started = Instant::now();
        let done = rt
            .run(
                "target",
                Bench::Start {
                    left: 0,
                    note: note(),
                },
                &*h,
            )
            .await
            .expect("resume");
        let resume_us = micros(started.elapsed());
        let resume_cpu_us = (process_cpu_ns() - cpu) as f64 / 1000.0;
        assert!(matches!(done, Bench::Done { .. }));
        assert_eq!(h.entries.load(std::sync::atomic::Ordering::Relaxed), 1);
        let entered = h.take_stamps();
        let entry_us = micros(entered[0].duration_since(started));
        let mut warm = Vec::with_capacity(50);
        for _ in 0..50 {
            let started = Instant::now();
            let (s, _) = rt
                .state::<Bench>("target")
                .await
                .expect("read")
                .expect("the run exists");
            warm.push(micros(started.elapsed()));
            assert_eq!(s, seq + 1);
        }
        (read_us, resume_us, entry_us, resume_cpu_us, warm)
    });
    let resume_peak = status_kib("VmHWM");
    Child {
        verify_on_open: verify,
        open_us,
        read_us,
        resume_us,
        entry_us,
        resume_cpu_us,
        read_warm_us: percentile(&warm, 50.0),
        floor_us,
        rss_before_kib,
        resume_peak_growth_kib: resume_peak.saturating_sub(rss_before_kib),
        process_peak_kib: resume_peak.max(open_peak_kib),
        peak_reset,
    }
}
