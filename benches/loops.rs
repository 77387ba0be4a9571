//! The benchmark suite of loops: every figure is a ratio against a floor measured in the same
//! run, on the same machine, with the absolute values beside it.
//!
//! ```text
//! cargo bench --bench loops                  # the full run (~11 minutes): docs/benchmarks.*
//! cargo bench --bench loops -- --quick       # a smoke run (~2 minutes): target/tmp/loops-bench/
//! cargo bench --bench loops -- --only latency,throughput --out /tmp/report
//! ```
//!
//! Scenarios: `latency` (1 and 3: a transition and a journaled step against a raw redb
//! commit), `throughput` (2: N concurrent runs against one commit per transition), `resume`
//! (4: resume after 10 to 1 000 000 transitions), `startup` (5: 100 000 unfinished runs),
//! `disk` (6: bytes per transition, prune and compact), `memory` (7: 10 000 waiting runs),
//! `search` (8: attribute search on 100 000 runs), `parked` (9: 1 000 000 parked runs: start,
//! memory and timer lateness), `compare` (10: a 200-step workflow, resume and 64 runs'
//! throughput, side by side with raw redb and a hand-rolled SQLite store).
//! See docs/benchmarks.md for what each measures and the results. Nothing here runs under
//! `cargo test`; no test asserts a time.

#[path = "loops/batches.rs"]
mod batches;
#[path = "loops/child.rs"]
mod child;
#[path = "loops/compare.rs"]
mod compare;
#[path = "loops/disk.rs"]
mod disk;
#[path = "loops/goals.rs"]
mod goals;
#[path = "loops/langgraph.rs"]
mod langgraph;
#[path = "loops/latency.rs"]
mod latency;
#[path = "loops/measure.rs"]
mod measure;
#[path = "loops/memory.rs"]
mod memory;
#[path = "loops/parked.rs"]
mod parked;
#[path = "loops/report.rs"]
mod report;
#[path = "loops/resume.rs"]
mod resume;
#[path = "loops/search.rs"]
mod search;
#[path = "loops/sqlite.rs"]
mod sqlite;
#[path = "loops/startup.rs"]
mod startup;
#[path = "loops/throughput.rs"]
mod throughput;
#[path = "loops/workload.rs"]
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Latency,
    Throughput,
    Resume,
    Startup,
    Disk,
    Memory,
    Search,
    Parked,
    /// Scenario 10.
    Compare,
}

/// The loops benchmark suite (run it with `cargo bench --bench loops -- [OPTIONS]`).
#[derive(Debug, Parser)]
#[command(about, long_about = None)]
struct Args {
    /// A smoke run of about a minute: fewer rounds, smaller sizes.
    #[arg(long)]
    quick: bool,
    /// Run only these scenarios (comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<Scenario>,
    /// Where to write benchmarks.md (its generated section), benchmarks.json and the charts.
    /// Default: docs/ for the full run of every scenario, else target/tmp/loops-bench/.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where the stores are created (default: target/tmp, on the disk the project is on).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Rounds of the latency scenario.
    #[arg(long)]
    rounds: Option<usize>,
    /// Slices (of a quarter of a second each) of the throughput scenario, per N.
    #[arg(long)]
    slices: Option<usize>,
    /// Concurrent runs of the throughput scenario.
    #[arg(long, value_delimiter = ',')]
    runs: Vec<usize>,
    /// History lengths of the resume scenario.
    #[arg(long, value_delimiter = ',')]
    resume_sizes: Vec<u64>,
    /// Unfinished runs of the startup scenario.
    #[arg(long)]
    startup_runs: Option<u64>,
    /// Waiting runs of the memory scenario.
    #[arg(long)]
    waiting_runs: Option<u64>,
    /// Runs of the search scenario.
    #[arg(long)]
    search_runs: Option<u64>,
    /// Parked runs of the parked scenario (half asleep, half waiting for an event).
    #[arg(long)]
    parked_runs: Option<u64>,
    /// Seconds over which the parked scenario's sleeping runs wake.
    #[arg(long)]
    parked_window: Option<f64>,
    /// Transitions of the large store of the disk scenario.
    #[arg(long)]
    disk_transitions: Option<u64>,
    /// Write the disk scenario's large store with `__seed_history` instead of the runtime.
    #[arg(long)]
    disk_seeded: bool,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
    /// Internal: run as a measuring child process (`resume`, `startup`, `waiting`, `parked`), with
    /// `--path P [--verify B] [--child-runs N]`.
    #[arg(long, hide = true)]
    child: Option<String>,
    #[arg(long, hide = true)]
    path: Option<PathBuf>,
    #[arg(long, hide = true)]
    verify: Option<bool>,
    #[arg(long = "child-runs", hide = true)]
    child_runs: Option<u64>,
}

/// The tokio runtime every scenario drives runs on: multi-threaded, one worker per core, as
/// `#[tokio::main]` makes it.
pub fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn main() {
    let args = Args::parse();
    if let Some(kind) = &args.child {
        let path = args.path.clone().expect("--path");
        match kind.as_str() {
            "resume" => child::finish(&resume::child_main(&path, args.verify.unwrap_or(true))),
            "startup" => child::finish(&startup::child_main(&path, args.child_runs.unwrap_or(0))),
            "waiting" => child::finish(&memory::child_main(&path, args.child_runs.unwrap_or(0))),
            "parked" => child::finish(&parked::child_main(
                &path,
                args.child_runs.unwrap_or(0),
                true,
            )),
            "parked-start" => child::finish(&parked::child_main(
                &path,
                args.child_runs.unwrap_or(0),
                false,
            )),
            "compare-sqlite" => child::finish(&sqlite::child_main(&path)),
            other => panic!("unknown child {other}"),
        }
    }
    if !args.bench {
        // `cargo test --benches` runs bench targets without `--bench`: measure nothing there.
        eprintln!("loops bench: run it with `cargo bench --bench loops`; nothing to test");
        return;
    }
    run(&args);
}

fn run(args: &Args) {
    let quick = args.quick;
    let wants = |s: Scenario| args.only.is_empty() || args.only.contains(&s);
    let defaults_only = !quick
        && args.only.is_empty()
        && args.rounds.is_none()
        && args.slices.is_none()
        && args.runs.is_empty()
        && args.resume_sizes.is_empty()
        && args.startup_runs.is_none()
        && args.waiting_runs.is_none()
        && args.disk_transitions.is_none()
        && args.search_runs.is_none()
        && args.parked_runs.is_none()
        && args.parked_window.is_none()
        && !args.disk_seeded;
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let out = args.out.clone().unwrap_or_else(|| {
        if defaults_only {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/docs"))
        } else {
            tmp.join("loops-bench")
        }
    });
    let base = args.dir.clone().unwrap_or_else(|| tmp.clone());
    std::fs::create_dir_all(&base).expect("create the work directory");
    let work = tempfile::Builder::new()
        .prefix("loops-bench-")
        .tempdir_in(&base)
        .expect("a work directory");
    let dir = work.path();
    let machine = measure::Machine::describe(dir);
    let command = std::iter::once("cargo bench --bench loops".to_owned())
        .chain(
            std::env::args()
                .skip(1)
                .filter(|a| a != "--bench")
                .enumerate()
                .map(|(i, a)| if i == 0 { format!("-- {a}") } else { a }),
        )
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!(
        "loops bench ({}) in {}",
        if quick { "quick" } else { "full" },
        dir.display()
    );
    eprintln!(
        "  {} ({} cores), {}",
        machine.cpu, machine.cores, machine.filesystem
    );
    let started = Instant::now();
    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let tokio = tokio_runtime();
    let pick = |full: u64, smoke: u64| if quick { smoke } else { full };

    let latency = (wants(Scenario::Latency) || wants(Scenario::Throughput)).then(|| {
        eprintln!("1, 3. latency of a transition and a step");
        let rounds = args.rounds.unwrap_or(pick(160, 10) as usize);
        let l = latency::run(&tokio, dir, rounds, pick(50, 30) as usize);
        for v in &l.variants {
            eprintln!(
                "  {:<36} p50 {:>6.0} µs  p99 {:>6.0} µs  ({:.2}x, {:.2}x)  CPU {:>5.0} µs",
                v.label, v.p50_us, v.p99_us, v.ratio_p50, v.ratio_p99, v.cpu_us_per_commit
            );
        }
        l
    });
    let throughput = wants(Scenario::Throughput).then(|| {
        eprintln!("2. throughput at N concurrent runs");
        let l = latency.as_ref().expect("measured with the latency");
        let cfg = throughput::Config {
            runs: if args.runs.is_empty() {
                vec![1, 8, 64, 256, 512]
            } else {
                args.runs.clone()
            },
            slices: args.slices.unwrap_or(pick(32, 3) as usize),
            slice: Duration::from_millis(pick(250, 150)),
            warmup: Duration::from_millis(pick(500, 200)),
        };
        throughput::run(&tokio, dir, &cfg, l.record_bytes, l.row_bytes)
    });
    let resume = wants(Scenario::Resume).then(|| {
        eprintln!("4. resume after a long history");
        let sizes = if args.resume_sizes.is_empty() {
            if quick {
                vec![10, 1_000, 100_000]
            } else {
                vec![10, 10_000, 1_000_000]
            }
        } else {
            args.resume_sizes.clone()
        };
        resume::run(dir, &sizes, pick(15, 2) as usize, pick(5, 1) as usize)
    });
    let startup = wants(Scenario::Startup).then(|| {
        eprintln!("5. startup with many unfinished runs");
        let runs = args.startup_runs.unwrap_or(pick(100_000, 10_000));
        startup::run(dir, runs, pick(5, 1) as usize)
    });
    let disk = wants(Scenario::Disk).then(|| {
        eprintln!("6. bytes on disk, prune and compact");
        let cfg = disk::Config {
            small_transitions: pick(100_000, 10_000),
            large_transitions: args.disk_transitions.unwrap_or(pick(1_000_000, 100_000)),
            records_per_run: 100,
            small_concurrency: 64,
            large_concurrency: 512,
            seeded: args.disk_seeded,
        };
        disk::run(&tokio, dir, &cfg)
    });
    let memory = wants(Scenario::Memory).then(|| {
        eprintln!("7. memory of waiting runs");
        let runs = args.waiting_runs.unwrap_or(pick(10_000, 1_000));
        memory::run(dir, runs, pick(5, 1) as usize)
    });
    let search = wants(Scenario::Search).then(|| {
        eprintln!("8. attribute search");
        let runs = args.search_runs.unwrap_or(pick(100_000, 10_000));
        search::run(&tokio, dir, runs, pick(200, 20) as usize)
    });
    let parked = wants(Scenario::Parked).then(|| {
        eprintln!("9. parked runs");
        let runs = args.parked_runs.unwrap_or(pick(1_000_000, 100_000));
        let window = args.parked_window.unwrap_or(pick(120, 20) as f64);
        parked::run(dir, runs, window, pick(5, 1) as usize)
    });
    let compare = wants(Scenario::Compare).then(|| {
        eprintln!("10. side by side: loops, raw redb, SQLite (WAL, synchronous=FULL)");
        let cfg = compare::Config {
            steps: 200,
            rounds: pick(40, 4) as usize,
            resume_sizes: vec![10, 1_000],
            resume_reps: pick(9, 2) as usize,
            runs: 64,
            slices: pick(24, 3) as usize,
            slice: Duration::from_millis(pick(250, 150)),
            warmup: Duration::from_millis(pick(500, 200)),
        };
        compare::run(&tokio, dir, &cfg)
    });
    drop(tokio);

    let report = report::Report {
        machine,
        command,
        mode: if quick { "quick" } else { "full" },
        started_unix_s,
        duration_s: started.elapsed().as_secs_f64(),
        latency: latency.filter(|_| wants(Scenario::Latency)),
        throughput,
        resume,
        startup,
        disk,
        memory,
        search,
        parked,
        compare,
    };
    print!("{}", report::markdown(&report));
    report::write(&report, &out).expect("write the report");
}
