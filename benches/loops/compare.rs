//! Scenario 10: side by side, loops against a raw redb commit (the floor) and against the
//! SQLite store a Rust user would hand-roll instead (`sqlite.rs`: WAL, `synchronous=FULL`).
//!
//! - **A 200-step workflow**, end to end, in rounds: each round runs one workflow of each
//!   variant, in an order rotated round by round (as the latency scenario does); figures are
//!   medians over rounds, ratios medians of the ratios within a round.
//! - **Resume** after 10 and 1 000 transitions: child processes on fresh copies of seeded
//!   files, loops (`resume::child_main`) and SQLite (`sqlite::child_main`) alternating; each
//!   child takes its own floor. With a Python that has LangGraph (`langgraph.rs`), LangGraph +
//!   SqliteSaver's resume of the same history length follows each pair (issue 19, goal 5).
//! - **64 concurrent runs**: transitions per second in slices rotated between loops, the
//!   floor, and SQLite with one connection per thread and with one shared connection.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use loops::{RedbStore, Runtime};
use serde::Serialize;

use crate::child;
use crate::langgraph;
use crate::latency::drive;
use crate::measure::{Layout, Raw, median, process_cpu_ns};
use crate::report::{size, thousands};
use crate::resume;
use crate::sqlite::{self, Sharing, Sqlite, Workers};
use crate::throughput::{loops_rate, raw_rate, start_runs};
use crate::workload::{Bench, Looper, history, note};

pub struct Config {
    /// Steps of the workflow.
    pub steps: u64,
    /// Rounds of the workflow rows.
    pub rounds: usize,
    pub resume_sizes: Vec<u64>,
    /// Child processes per history size and store.
    pub resume_reps: usize,
    /// Concurrent runs of the throughput rows.
    pub runs: usize,
    pub slices: usize,
    pub slice: Duration,
    pub warmup: Duration,
}

/// The variants of the workflow rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    LoopsTransitions,
    LoopsSteps,
    Raw,
    SqliteTransitions,
    SqliteSteps,
}

impl Flow {
    const ALL: [Flow; 5] = [
        Flow::LoopsTransitions,
        Flow::LoopsSteps,
        Flow::Raw,
        Flow::SqliteTransitions,
        Flow::SqliteSteps,
    ];

    fn key(self) -> &'static str {
        match self {
            Flow::LoopsTransitions => "loops_transitions",
            Flow::LoopsSteps => "loops_steps",
            Flow::Raw => "raw_redb",
            Flow::SqliteTransitions => "sqlite_transitions",
            Flow::SqliteSteps => "sqlite_steps",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Flow::LoopsTransitions => "loops, a transition per step",
            Flow::LoopsSteps => "loops, a `ctx.step` per step (one state)",
            Flow::Raw => "raw redb, a commit of the record per step (floor)",
            Flow::SqliteTransitions => "SQLite, a transaction per step (record + run row)",
            Flow::SqliteSteps => "SQLite, a transaction per step (steps table)",
        }
    }

    /// Durable commits one workflow of `steps` steps makes.
    fn commits(self, steps: u64) -> u64 {
        match self {
            // The run's creation, then one transition per step (the last to `Done`).
            Flow::LoopsTransitions | Flow::SqliteTransitions => steps + 1,
            // The creation, the steps, the transition to `Done`.
            Flow::LoopsSteps | Flow::SqliteSteps => steps + 2,
            Flow::Raw => steps,
        }
    }

    /// The SQLite variant a loops variant is compared with.
    fn sqlite_peer(self) -> Option<Flow> {
        match self {
            Flow::LoopsTransitions => Some(Flow::SqliteTransitions),
            Flow::LoopsSteps => Some(Flow::SqliteSteps),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FlowRow {
    pub key: &'static str,
    pub label: &'static str,
    pub commits: u64,
    /// Median over rounds of the whole workflow.
    pub total_ms: f64,
    /// `total_ms` over the steps.
    pub per_step_us: f64,
    /// Median over rounds of (this workflow / the raw redb one in the same round).
    pub over_raw: f64,
    /// For loops: median over rounds of (loops / its SQLite peer in the same round).
    pub over_sqlite: Option<f64>,
    /// CPU time of the whole process per durable commit, median over rounds.
    pub cpu_us_per_commit: f64,
    pub totals_ms: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ResumeRow {
    pub records: u64,
    pub loops_file_bytes: u64,
    pub sqlite_file_bytes: u64,
    /// Medians over children: the open, the first read, the resume after the open, and open
    /// plus resume (the "open to first new commit" figure).
    pub loops_open_us: f64,
    pub loops_read_us: f64,
    pub loops_resume_us: f64,
    pub loops_total_us: f64,
    /// Median over children of the total over the child's own floor.
    pub loops_in_floors: f64,
    pub sqlite_open_us: f64,
    pub sqlite_read_us: f64,
    pub sqlite_resume_us: f64,
    pub sqlite_total_us: f64,
    pub sqlite_in_floors: f64,
    /// Median over reps of (loops total / SQLite total), each in the child's floors.
    pub loops_over_sqlite: f64,
    /// Median over children of loops' open plus its resume until the handler is entered:
    /// open to the first new step.
    pub loops_entry_us: f64,
    /// LangGraph + SqliteSaver's resume of a thread of as many steps, if measured.
    pub langgraph: Option<LangGraphResume>,
    pub loops_children: Vec<resume::Child>,
    pub sqlite_children: Vec<sqlite::Child>,
}

/// LangGraph's resume figures of one history length (medians over children, µs).
#[derive(Debug, Clone, Serialize)]
pub struct LangGraphResume {
    pub file_bytes: u64,
    pub open_us: f64,
    /// Open to the first new step's entry.
    pub entry_total_us: f64,
    /// Open to that step's checkpoint committed.
    pub total_us: f64,
    pub children: Vec<langgraph::Child>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RateSlice {
    pub loops_per_s: f64,
    pub floor_per_s: f64,
    pub sqlite_connections_per_s: f64,
    pub sqlite_mutex_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Rates {
    pub runs: usize,
    pub slice_s: f64,
    /// Medians over slices.
    pub loops_per_s: f64,
    pub floor_per_s: f64,
    pub sqlite_connections_per_s: f64,
    pub sqlite_mutex_per_s: f64,
    pub loops_cpu_us: f64,
    pub sqlite_connections_cpu_us: f64,
    pub sqlite_mutex_cpu_us: f64,
    /// The faster SQLite sharing (by its median), the baseline of `loops_over_sqlite`.
    pub sqlite_baseline: &'static str,
    /// Medians over slices of the ratios within a slice.
    pub loops_over_floor: f64,
    pub sqlite_connections_over_floor: f64,
    pub sqlite_mutex_over_floor: f64,
    pub loops_over_sqlite: f64,
    pub slices: Vec<RateSlice>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Compare {
    pub sqlite_version: String,
    pub steps: u64,
    pub rounds: usize,
    pub record_bytes: usize,
    pub step_record_bytes: usize,
    pub flows: Vec<FlowRow>,
    pub resume_reps: usize,
    pub resume: Vec<ResumeRow>,
    /// The LangGraph and saver versions of the resume's peer rows, if measured.
    pub langgraph_version: Option<String>,
    pub rates: Rates,
}

pub fn run(tokio: &tokio::runtime::Runtime, dir: &Path, cfg: &Config) -> Compare {
    let rt = Runtime::open(dir.join("compare.redb")).expect("open the loops store");
    // Warm up, and learn the stored sizes of a transition record and of a step record.
    drive(tokio, &rt, "warm", 20, &Looper::stamping(1, 20));
    let store = rt.redb().expect("a redb store").clone();
    let record_bytes = serde_json::to_vec(&store.history("warm").expect("history")[1])
        .expect("encode")
        .len();
    let row = store.run("warm").expect("row").expect("the run exists");
    let row_bytes = serde_json::to_vec(&row).expect("encode").len();
    let step_record_bytes = serde_json::to_vec(&store.steps("warm", 1).expect("steps")[0].2)
        .expect("encode")
        .len();

    let flows = flows(tokio, &rt, dir, cfg, record_bytes, row_bytes);
    drop(store);
    drop(rt);
    let python = langgraph::python();
    if python.is_none() {
        eprintln!("  (no Python with LangGraph: its resume rows are left out)");
    }
    let resume = resumes(dir, cfg, python.as_deref());
    let rates = rates(tokio, dir, cfg, record_bytes, row_bytes);
    Compare {
        sqlite_version: rusqlite::version().to_owned(),
        steps: cfg.steps,
        rounds: cfg.rounds,
        record_bytes,
        step_record_bytes,
        flows,
        resume_reps: cfg.resume_reps,
        resume,
        langgraph_version: python.as_deref().map(langgraph::version),
        rates,
    }
}

/// The workflow rows: `cfg.rounds` rounds of one workflow of each variant.
fn flows(
    tokio: &tokio::runtime::Runtime,
    rt: &Runtime,
    dir: &Path,
    cfg: &Config,
    record_bytes: usize,
    row_bytes: usize,
) -> Vec<FlowRow> {
    let steps = cfg.steps;
    let mut raw = Raw::create(&dir.join("compare-raw.redb"), record_bytes, row_bytes);
    let mut db = Sqlite::open(&dir.join("compare.sqlite"));
    for _ in 0..20 {
        raw.commit(1, false);
    }
    sqlite_flow(&mut db, "warm", 20, false);
    let mut totals: Vec<Vec<f64>> = vec![Vec::new(); Flow::ALL.len()];
    let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); Flow::ALL.len()];
    for round in 0..cfg.rounds {
        for k in 0..Flow::ALL.len() {
            let i = (k + round) % Flow::ALL.len();
            let flow = Flow::ALL[i];
            let id = format!("{}-{round}", flow.key());
            let cpu = process_cpu_ns();
            let started = Instant::now();
            match flow {
                Flow::LoopsTransitions => drive(tokio, rt, &id, steps - 1, &Looper::counting()),
                Flow::LoopsSteps => drive(tokio, rt, &id, 0, &Looper::stamping(steps as u32, 1)),
                Flow::Raw => (0..steps).for_each(|_| {
                    raw.commit(1, false);
                }),
                Flow::SqliteTransitions => sqlite_flow(&mut db, &id, steps, false),
                Flow::SqliteSteps => sqlite_flow(&mut db, &id, steps, true),
            }
            totals[i].push(started.elapsed().as_secs_f64() * 1000.0);
            cpus[i].push((process_cpu_ns() - cpu) as f64 / 1000.0 / flow.commits(steps) as f64);
        }
    }
    drop(raw);
    drop(db);
    let ratio = |a: usize, b: usize| {
        median(
            &totals[a]
                .iter()
                .zip(&totals[b])
                .map(|(x, y)| x / y)
                .collect::<Vec<_>>(),
        )
    };
    let index = |f: Flow| Flow::ALL.iter().position(|&g| g == f).expect("a flow");
    let raw_i = index(Flow::Raw);
    Flow::ALL
        .iter()
        .enumerate()
        .map(|(i, &flow)| {
            let total_ms = median(&totals[i]);
            FlowRow {
                key: flow.key(),
                label: flow.label(),
                commits: flow.commits(steps),
                total_ms,
                per_step_us: total_ms * 1000.0 / steps as f64,
                over_raw: ratio(i, raw_i),
                over_sqlite: flow.sqlite_peer().map(|p| ratio(i, index(p))),
                cpu_us_per_commit: median(&cpus[i]),
                totals_ms: totals[i].clone(),
            }
        })
        .collect()
}

/// One workflow of `steps` steps on the SQLite store, in the shape loops runs it: the run's
/// creation at `Start`, then either a transition per step (to `Work`, the last to `Done`) or
/// `steps` step records in the first state and one transition to `Done`. Every record is
/// encoded as loops encodes it, inside the timed span.
fn sqlite_flow(db: &mut Sqlite, id: &str, steps: u64, journaled: bool) {
    let note = note();
    let first = Bench::Start {
        left: if journaled { 0 } else { steps - 1 },
        note: note.clone(),
    };
    let (state, bytes) = sqlite::record(id, 0, &first);
    db.create(id, state, &bytes, loops::now_ms());
    if journaled {
        for occurrence in 0..steps as u32 {
            db.step(id, 0, "s", occurrence, &sqlite::step_record(&note));
        }
        let (state, bytes) = sqlite::record(id, 1, &Bench::Done { note });
        db.transition(id, 1, state, &bytes, true, loops::now_ms());
        return;
    }
    for seq in 1..=steps {
        let value = if seq == steps {
            Bench::Done { note: note.clone() }
        } else {
            Bench::Work {
                left: steps - 1 - seq,
                note: note.clone(),
            }
        };
        let (state, bytes) = sqlite::record(id, seq, &value);
        db.transition(id, seq, state, &bytes, seq == steps, loops::now_ms());
    }
}

/// The resume rows: for each history size, `cfg.resume_reps` loops children and as many
/// SQLite children, alternating, each on a fresh copy of its template; and as many LangGraph
/// children after each pair, with `python`.
fn resumes(dir: &Path, cfg: &Config, python: Option<&Path>) -> Vec<ResumeRow> {
    let mut templates = Vec::new();
    for &records in &cfg.resume_sizes {
        let loops_path = dir.join(format!("compare-resume-{records}.redb"));
        RedbStore::open(&loops_path)
            .expect("open the template")
            .__seed_history(history("target", records))
            .expect("seed the history");
        let sqlite_path = dir.join(format!("compare-resume-{records}.sqlite"));
        // Closing the only connection checkpoints the WAL into the file and removes it.
        Sqlite::open(&sqlite_path).seed("target", history("target", records).map(|(_, v)| v));
        assert!(!sqlite_path.with_extension("sqlite-wal").exists());
        templates.push((records, loops_path, sqlite_path));
    }
    let n = templates.len();
    let lg_templates: Vec<std::path::PathBuf> = match python {
        Some(python) => cfg
            .resume_sizes
            .iter()
            .map(|&records| {
                let path = dir.join(format!("compare-resume-{records}.langgraph.sqlite"));
                langgraph::seed(python, &path, records);
                path
            })
            .collect(),
        None => Vec::new(),
    };
    let mut lg_children: Vec<Vec<langgraph::Child>> = vec![Vec::new(); n];
    let mut loops_children: Vec<Vec<resume::Child>> = vec![Vec::new(); n];
    let mut sqlite_children: Vec<Vec<sqlite::Child>> = vec![Vec::new(); n];
    for rep in 0..cfg.resume_reps {
        if let Some(python) = python {
            for (i, template) in lg_templates.iter().enumerate() {
                let work = dir.join("compare-resume-work.langgraph.sqlite");
                let out = langgraph::resume(python, template, &work);
                eprintln!(
                    "  {:>6} records, LangGraph: open {:>7.0} µs  first step {:>6.0} µs  \
                     committed {:>6.0} µs",
                    cfg.resume_sizes[i], out.open_us, out.entry_us, out.resume_us
                );
                lg_children[i].push(out);
            }
        }
        for k in 0..2 * n {
            // Rotate sizes and stores: loops first at even reps, SQLite first at odd ones.
            let j = (k + rep) % (2 * n);
            let (i, loops_turn) = (j / 2, (j % 2 == 0) == (rep % 2 == 0));
            let (records, loops_path, sqlite_path) = &templates[i];
            if loops_turn {
                let work = dir.join("compare-resume-work.redb");
                child::copy_synced(loops_path, &work);
                let w = work.display().to_string();
                let out: resume::Child = child::run(&["resume", "--path", &w, "--verify", "true"]);
                eprintln!(
                    "  {records:>6} records, loops:  open {:>7.0} µs  read {:>5.0} µs  \
                     resume {:>6.0} µs  floor {:>5.0} µs",
                    out.open_us, out.read_us, out.resume_us, out.floor_us
                );
                loops_children[i].push(out);
                let _ = std::fs::remove_file(&work);
            } else {
                let work = dir.join("compare-resume-work.sqlite");
                child::copy_synced(sqlite_path, &work);
                let w = work.display().to_string();
                let out: sqlite::Child = child::run(&["compare-sqlite", "--path", &w]);
                eprintln!(
                    "  {records:>6} records, SQLite: open {:>7.0} µs  read {:>5.0} µs  \
                     resume {:>6.0} µs  floor {:>5.0} µs",
                    out.open_us, out.read_us, out.resume_us, out.floor_us
                );
                sqlite_children[i].push(out);
                remove_sqlite(&work);
            }
        }
    }
    let mut lg_children = lg_children.into_iter();
    let mut lg_templates = lg_templates.into_iter();
    templates
        .into_iter()
        .zip(loops_children.into_iter().zip(sqlite_children))
        .map(|((records, loops_path, sqlite_path), (l, s))| {
            let file = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
            let (loops_file_bytes, sqlite_file_bytes) = (file(&loops_path), file(&sqlite_path));
            let _ = std::fs::remove_file(loops_path);
            let _ = std::fs::remove_file(sqlite_path);
            let lg = lg_children.next().unwrap_or_default();
            let langgraph = lg_templates.next().map(|template| {
                let file_bytes = file(&template);
                langgraph::remove(&template);
                let m = |f: &dyn Fn(&langgraph::Child) -> f64| {
                    median(&lg.iter().map(f).collect::<Vec<_>>())
                };
                LangGraphResume {
                    file_bytes,
                    open_us: m(&|c| c.open_us),
                    entry_total_us: m(&|c| c.open_us + c.entry_us),
                    total_us: m(&|c| c.open_us + c.resume_us),
                    children: lg.clone(),
                }
            });
            let ml =
                |f: &dyn Fn(&resume::Child) -> f64| median(&l.iter().map(f).collect::<Vec<_>>());
            let ms =
                |f: &dyn Fn(&sqlite::Child) -> f64| median(&s.iter().map(f).collect::<Vec<_>>());
            let loops_floors = |c: &resume::Child| (c.open_us + c.resume_us) / c.floor_us;
            let sqlite_floors = |c: &sqlite::Child| (c.open_us + c.resume_us) / c.floor_us;
            let per_rep: Vec<f64> = l
                .iter()
                .zip(&s)
                .map(|(a, b)| loops_floors(a) / sqlite_floors(b))
                .collect();
            ResumeRow {
                records,
                loops_file_bytes,
                sqlite_file_bytes,
                loops_open_us: ml(&|c| c.open_us),
                loops_read_us: ml(&|c| c.read_us),
                loops_resume_us: ml(&|c| c.resume_us),
                loops_total_us: ml(&|c| c.open_us + c.resume_us),
                loops_in_floors: ml(&loops_floors),
                sqlite_open_us: ms(&|c| c.open_us),
                sqlite_read_us: ms(&|c| c.read_us),
                sqlite_resume_us: ms(&|c| c.resume_us),
                sqlite_total_us: ms(&|c| c.open_us + c.resume_us),
                sqlite_in_floors: ms(&sqlite_floors),
                loops_over_sqlite: median(&per_rep),
                loops_entry_us: ml(&|c| c.open_us + c.entry_us),
                langgraph,
                loops_children: l,
                sqlite_children: s,
            }
        })
        .collect()
}

/// Removes a SQLite database and its WAL and shared-memory files.
fn remove_sqlite(path: &Path) {
    for ext in ["sqlite", "sqlite-wal", "sqlite-shm"] {
        let _ = std::fs::remove_file(path.with_extension(ext));
    }
}

/// The throughput rows: `cfg.runs` runs of each, measured in slices rotated between loops,
/// the floor, and SQLite's two ways of sharing the database.
fn rates(
    tokio: &tokio::runtime::Runtime,
    dir: &Path,
    cfg: &Config,
    record_bytes: usize,
    row_bytes: usize,
) -> Rates {
    let n = cfg.runs;
    let mut floor = Raw::create(&dir.join("compare-tp-floor.redb"), record_bytes, row_bytes);
    for _ in 0..5 {
        floor.commit(1, false);
    }
    let connections = Workers::start(
        &dir.join("compare-tp-conns.sqlite"),
        n,
        Sharing::Connections,
    );
    let mutex = Workers::start(&dir.join("compare-tp-mutex.sqlite"), n, Sharing::Mutex);
    connections.rate(cfg.warmup);
    mutex.rate(cfg.warmup);
    let rt = Runtime::open(dir.join("compare-tp.redb")).expect("open the loops store");
    let (looper, mut tasks) = start_runs(tokio, &rt, n, cfg.warmup);

    let mut slices = Vec::with_capacity(cfg.slices);
    let mut cpu: [Vec<f64>; 3] = Default::default();
    for s in 0..cfg.slices {
        let mut slice = RateSlice {
            loops_per_s: 0.0,
            floor_per_s: 0.0,
            sqlite_connections_per_s: 0.0,
            sqlite_mutex_per_s: 0.0,
        };
        for k in 0..4 {
            match (k + s) % 4 {
                0 => {
                    let (rate, c) = loops_rate(&looper, cfg.slice);
                    slice.loops_per_s = rate;
                    cpu[0].push(c);
                }
                1 => slice.floor_per_s = raw_rate(&mut floor, Layout::ByRun, 1, false, cfg.slice).0,
                2 => {
                    let (rate, c) = connections.rate(cfg.slice);
                    slice.sqlite_connections_per_s = rate;
                    cpu[1].push(c);
                }
                _ => {
                    let (rate, c) = mutex.rate(cfg.slice);
                    slice.sqlite_mutex_per_s = rate;
                    cpu[2].push(c);
                }
            }
        }
        slices.push(slice);
    }
    looper.stop.store(true, Ordering::Relaxed);
    looper.unpause();
    tokio.block_on(async {
        while let Some(done) = tasks.join_next().await {
            done.expect("a driver task").expect("a run ends");
        }
    });
    drop(rt);
    connections.stop();
    mutex.stop();
    drop(floor);
    for f in ["compare-tp.redb", "compare-tp-floor.redb"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    for f in ["compare-tp-conns", "compare-tp-mutex"] {
        remove_sqlite(&dir.join(f).with_extension("sqlite"));
    }

    let m = |f: &dyn Fn(&RateSlice) -> f64| median(&slices.iter().map(f).collect::<Vec<_>>());
    let (conns, mtx) = (
        m(&|r| r.sqlite_connections_per_s),
        m(&|r| r.sqlite_mutex_per_s),
    );
    let (baseline, best): (&'static str, fn(&RateSlice) -> f64) = if conns >= mtx {
        ("one connection per thread", |r| r.sqlite_connections_per_s)
    } else {
        ("one connection behind a mutex", |r| r.sqlite_mutex_per_s)
    };
    let r = Rates {
        runs: n,
        slice_s: cfg.slice.as_secs_f64(),
        loops_per_s: m(&|r| r.loops_per_s),
        floor_per_s: m(&|r| r.floor_per_s),
        sqlite_connections_per_s: conns,
        sqlite_mutex_per_s: mtx,
        loops_cpu_us: median(&cpu[0]),
        sqlite_connections_cpu_us: median(&cpu[1]),
        sqlite_mutex_cpu_us: median(&cpu[2]),
        sqlite_baseline: baseline,
        loops_over_floor: m(&|r| r.loops_per_s / r.floor_per_s),
        sqlite_connections_over_floor: m(&|r| r.sqlite_connections_per_s / r.floor_per_s),
        sqlite_mutex_over_floor: m(&|r| r.sqlite_mutex_per_s / r.floor_per_s),
        loops_over_sqlite: m(&|r| r.loops_per_s / best(r)),
        slices,
    };
    eprintln!(
        "  {n} runs: loops {:.0}/s  floor {:.0}/s  SQLite {:.0}/s (connections) \
         {:.0}/s (mutex)  loops / SQLite {:.2}x",
        r.loops_per_s, r.floor_per_s, conns, mtx, r.loops_over_sqlite
    );
    r
}

/// Scenario 10's section of the report.
pub fn section(s: &mut String, x: &Compare) {
    let _ = writeln!(
        s,
        "### 10. Side by side: loops, raw redb, SQLite (WAL, synchronous=FULL)\n\n\
         The SQLite store is what a Rust user would hand-roll instead (`benches/loops/sqlite.rs`): \
         SQLite {} (rusqlite, bundled), `journal_mode=WAL`, `synchronous=FULL`, cached \
         statements; a transition is one `BEGIN IMMEDIATE` transaction that inserts the record \
         (the same {}-byte `TransitionRecord` loops stores) and updates the run's row; a step \
         inserts its record ({} bytes, as loops' `StepRecord`) into a steps table. Every \
         record is encoded inside the timed span, as loops encodes it.\n",
        x.sqlite_version, x.record_bytes, x.step_record_bytes
    );
    flows_table(s, x);
    resume_table(s, x);
    langgraph_table(s, x);
    rates_table(s, &x.rates);
}

/// The workflow rows, with the text above them.
fn flows_table(s: &mut String, x: &Compare) {
    let _ = writeln!(
        s,
        "**A {}-step workflow**, end to end: {} of one workflow of each variant, in an \
         order rotated round by round; figures are medians over rounds, ratios medians of \
         the ratios within a round (loops is compared with the SQLite row of the same shape). \
         CPU: all the process's threads, per durable commit.\n",
        x.steps,
        crate::report::plural(x.rounds, "round", "rounds")
    );
    let _ = writeln!(
        s,
        "| what | commits | total | per step | / raw redb | / SQLite | CPU per commit |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    );
    for f in &x.flows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} ms | {:.0} µs | {:.2}x | {} | {:.0} µs |",
            f.label,
            f.commits,
            f.total_ms,
            f.per_step_us,
            f.over_raw,
            f.over_sqlite.map_or("".to_owned(), |r| format!("{r:.2}x")),
            f.cpu_us_per_commit
        );
    }
}

/// The resume rows, with the text above them.
fn resume_table(s: &mut String, x: &Compare) {
    let _ = writeln!(
        s,
        "\n**Resume**: a run whose latest state is one transition from its end, with N \
         transitions of history; {} child processes per store and size, alternating, each on \
         a fresh copy of the file. loops: `Runtime::builder().open` (with `verify_on_open`), \
         then `Runtime::run` to the end (read, the attempt's commit, one handler, the \
         transition's commit: two commits). SQLite: `Connection::open` with the pragmas, \
         then read the row and the latest record, decode it, commit the transition (one \
         commit). Both children make their first read (timed apart) before the resume, and \
         take their own floor (9 raw redb commits) after the open; \"in floors\" is open + \
         resume over it, and loops / SQLite the median of the ratios of those.\n",
        x.resume_reps
    );
    let _ = writeln!(
        s,
        "| history | store | file | open | first read | resume | open + resume | in floors | loops / SQLite |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in &x.resume {
        let _ = writeln!(
            s,
            "| {} | loops | {} | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.1} | {:.2}x |",
            thousands(r.records as f64),
            size(r.loops_file_bytes as f64),
            r.loops_open_us,
            r.loops_read_us,
            r.loops_resume_us,
            r.loops_total_us,
            r.loops_in_floors,
            r.loops_over_sqlite
        );
        let _ = writeln!(
            s,
            "| {} | SQLite | {} | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.1} | |",
            thousands(r.records as f64),
            size(r.sqlite_file_bytes as f64),
            r.sqlite_open_us,
            r.sqlite_read_us,
            r.sqlite_resume_us,
            r.sqlite_total_us,
            r.sqlite_in_floors,
        );
    }
}

/// The resume rows against LangGraph (issue 19, goal 5), with the text above them.
fn langgraph_table(s: &mut String, x: &Compare) {
    let Some(version) = &x.langgraph_version else {
        s.push_str(
            "\nLangGraph's resume was not measured in this run (no Python with LangGraph; \
             docs/benchmarks.md, \"Run it\").\n",
        );
        return;
    };
    let _ = writeln!(
        s,
        "\n**Resume against LangGraph** (langgraph and langgraph-checkpoint-sqlite {version}): a \
         thread of N steps of a one-node graph that loops, checkpointed by `SqliteSaver` with \
         `durability=\"sync\"`, killed in step N+1; {} Python children per size, each on a \
         fresh copy, after Python is warmed up (imports, and a run and a resume of the same \
         graph on an in-memory saver, uncounted). Open: the connection, the saver and \
         `compile`; first new step: until it is entered (loops: `Runtime::run` until the \
         handler is entered, which includes the attempt's commit); committed: until its \
         checkpoint is (LangGraph: the entry of the step after it; loops: the transition's \
         commit).\n",
        x.resume_reps
    );
    let _ = writeln!(
        s,
        "| history | open to first new step: loops | LangGraph | loops / LangGraph | open to its commit: loops | LangGraph | loops / LangGraph |\n\
         |---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in &x.resume {
        let Some(lg) = &r.langgraph else { continue };
        let _ = writeln!(
            s,
            "| {} | {:.0} µs | {:.0} µs | {:.2}x | {:.0} µs | {:.0} µs | {:.2}x |",
            thousands(r.records as f64),
            r.loops_entry_us,
            lg.entry_total_us,
            r.loops_entry_us / lg.entry_total_us,
            r.loops_total_us,
            lg.total_us,
            r.loops_total_us / lg.total_us,
        );
    }
}

/// The throughput rows, with the text above them.
fn rates_table(s: &mut String, t: &Rates) {
    let _ = writeln!(
        s,
        "\n**{} concurrent runs**: transitions per second, in {} slices of {:.2} s each of \
         loops (its group commit), the floor (raw redb, one record per commit) and SQLite \
         with {} threads, one connection each (`busy_timeout` 30 s), and with one connection \
         behind a `Mutex`, in an order rotated slice by slice (the others held meanwhile); \
         medians over slices, ratios medians of the ratios within a slice.\n",
        t.runs,
        t.slices.len(),
        t.slice_s,
        t.runs
    );
    let _ = writeln!(
        s,
        "| what | transitions/s | / floor | CPU per transition |\n|---|---:|---:|---:|"
    );
    let _ = writeln!(
        s,
        "| loops | {} | {:.1}x | {:.1} µs |",
        thousands(t.loops_per_s),
        t.loops_over_floor,
        t.loops_cpu_us
    );
    let _ = writeln!(
        s,
        "| raw redb, one record per commit (floor) | {} | 1.0x | |",
        thousands(t.floor_per_s)
    );
    for (label, rate, ratio, cpu) in [
        (
            "SQLite, one connection per thread",
            t.sqlite_connections_per_s,
            t.sqlite_connections_over_floor,
            t.sqlite_connections_cpu_us,
        ),
        (
            "SQLite, one connection behind a mutex",
            t.sqlite_mutex_per_s,
            t.sqlite_mutex_over_floor,
            t.sqlite_mutex_cpu_us,
        ),
    ] {
        let _ = writeln!(
            s,
            "| {label} | {} | {ratio:.1}x | {cpu:.1} µs |",
            thousands(rate)
        );
    }
    let _ = writeln!(
        s,
        "\nloops / SQLite at {} runs: {:.2}x (the baseline: SQLite with {}, the faster of \
         the two).\n",
        t.runs, t.loops_over_sqlite, t.sqlite_baseline
    );
}
