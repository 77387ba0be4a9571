//! Scenario 10's baseline: the SQLite store a careful Rust user would hand-roll instead of
//! loops, through rusqlite (SQLite bundled, built from source).
//!
//! `journal_mode=WAL`, `synchronous=FULL` (every commit fsyncs the WAL: as durable as redb's
//! `Durability::Immediate`), a `records` table of one row per transition (the same bytes loops
//! stores: the workload's `TransitionRecord` as JSON), a `runs` table of one row per run, and
//! a `steps` table of journaled step outputs (the same bytes as loops' `StepRecord`).
//! Statements are cached (`prepare_cached`); every write is one `BEGIN IMMEDIATE` transaction
//! (a writer takes the lock up front, so that concurrent connections wait in the busy handler
//! instead of failing to upgrade a read lock).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

use crate::measure::{Raw, micros, percentile, process_cpu_ns};
use crate::workload::{Bench, note};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    status TEXT NOT NULL,
    state TEXT NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS records (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    name TEXT NOT NULL,
    occurrence INTEGER NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (run_id, seq, name, occurrence)
);";

const INSERT_RECORD: &str =
    "INSERT INTO records (run_id, seq, state, payload) VALUES (?1, ?2, ?3, ?4)";
const INSERT_RUN: &str =
    "INSERT INTO runs (run_id, seq, status, state, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5)";
const UPDATE_RUN: &str =
    "UPDATE runs SET seq = ?2, status = ?3, state = ?4, updated_ms = ?5 WHERE run_id = ?1";
const INSERT_STEP: &str =
    "INSERT INTO steps (run_id, seq, name, occurrence, payload) VALUES (?1, ?2, ?3, ?4, ?5)";

/// One connection to the hand-rolled store.
pub struct Sqlite {
    conn: Connection,
}

fn status(terminal: bool) -> &'static str {
    if terminal { "done" } else { "running" }
}

impl Sqlite {
    /// Opens (or creates) the store at `path`: WAL, `synchronous=FULL`, the tables.
    pub fn open(path: &Path) -> Sqlite {
        let conn = Connection::open(path).expect("open the SQLite database");
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .expect("journal_mode=WAL");
        assert_eq!(mode.to_ascii_lowercase(), "wal");
        conn.pragma_update(None, "synchronous", "FULL")
            .expect("synchronous=FULL");
        conn.busy_timeout(Duration::from_secs(30))
            .expect("busy_timeout");
        conn.execute_batch(SCHEMA).expect("create the tables");
        Sqlite { conn }
    }

    /// Creates a run: its first record (seq 0) and its row, in one transaction.
    pub fn create(&mut self, run_id: &str, state: &str, record: &[u8], at_ms: u64) {
        let txn = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        txn.prepare_cached(INSERT_RECORD)
            .expect("prepare")
            .execute(params![run_id, 0i64, state, record])
            .expect("insert the first record");
        txn.prepare_cached(INSERT_RUN)
            .expect("prepare")
            .execute(params![run_id, 0i64, "running", state, at_ms as i64])
            .expect("insert the run");
        txn.commit().expect("commit");
    }

    /// One transition: the record at `seq`, the run's row updated, one commit.
    pub fn transition(
        &mut self,
        run_id: &str,
        seq: u64,
        state: &str,
        record: &[u8],
        terminal: bool,
        at_ms: u64,
    ) {
        let txn = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        txn.prepare_cached(INSERT_RECORD)
            .expect("prepare")
            .execute(params![run_id, seq as i64, state, record])
            .expect("insert a record");
        let updated = txn
            .prepare_cached(UPDATE_RUN)
            .expect("prepare")
            .execute(params![
                run_id,
                seq as i64,
                status(terminal),
                state,
                at_ms as i64
            ])
            .expect("update the run");
        assert_eq!(updated, 1, "the run's row exists");
        txn.commit().expect("commit");
    }

    /// One journaled step's output, one commit.
    pub fn step(&mut self, run_id: &str, seq: u64, name: &str, occurrence: u32, payload: &[u8]) {
        let txn = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        txn.prepare_cached(INSERT_STEP)
            .expect("prepare")
            .execute(params![run_id, seq as i64, name, occurrence, payload])
            .expect("insert a step");
        txn.commit().expect("commit");
    }

    /// The run's row (seq, status) and its latest record's bytes.
    pub fn latest(&self, run_id: &str) -> Option<(u64, String, Vec<u8>)> {
        let (seq, status): (i64, String) = self
            .conn
            .prepare_cached("SELECT seq, status FROM runs WHERE run_id = ?1")
            .expect("prepare")
            .query_row(params![run_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .expect("read the run")?;
        let record: Vec<u8> = self
            .conn
            .prepare_cached("SELECT payload FROM records WHERE run_id = ?1 AND seq = ?2")
            .expect("prepare")
            .query_row(params![run_id, seq], |r| r.get(0))
            .expect("read the latest record");
        Some((seq as u64, status, record))
    }

    /// Writes a whole history of `run_id` in one transaction (the resume templates).
    pub fn seed(&mut self, run_id: &str, states: impl Iterator<Item = Bench>) {
        let txn = self.conn.transaction().expect("begin");
        let mut last = (0u64, String::new());
        for (seq, value) in states.enumerate() {
            let seq = seq as u64;
            let (state, bytes) = record(run_id, seq, &value);
            txn.prepare_cached(INSERT_RECORD)
                .expect("prepare")
                .execute(params![run_id, seq as i64, state, bytes])
                .expect("insert a record");
            last = (seq, state.to_owned());
        }
        txn.prepare_cached(INSERT_RUN)
            .expect("prepare")
            .execute(params![
                run_id,
                last.0 as i64,
                "running",
                last.1,
                loops::now_ms() as i64
            ])
            .expect("insert the run");
        txn.commit().expect("commit");
    }
}

/// The bytes loops stores for `value` entering at `seq` (a `TransitionRecord` as JSON), and
/// the state's name.
pub fn record(run_id: &str, seq: u64, value: &Bench) -> (&'static str, Vec<u8>) {
    let r = loops::TransitionRecord::encode(run_id, seq, value, loops::now_ms()).expect("encode");
    let state = match value {
        Bench::Start { .. } => "Start",
        Bench::Work { .. } => "Work",
        Bench::Done { .. } => "Done",
    };
    debug_assert_eq!(r.state, state);
    (state, serde_json::to_vec(&r).expect("encode"))
}

/// The bytes loops stores for a step whose output is `output` (a `StepRecord` as JSON).
pub fn step_record(output: &str) -> Vec<u8> {
    let json = serde_json::to_string(output).expect("encode");
    let r = loops::StepRecord {
        attempt: 1,
        at_ms: loops::now_ms(),
        duration_ms: 0,
        output: serde_json::value::RawValue::from_string(json).expect("raw JSON"),
    };
    serde_json::to_vec(&r).expect("encode")
}

/// What a resume child measured on the SQLite store (the fields mirror `resume::Child`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Child {
    /// `Connection::open`, the pragmas and `CREATE TABLE IF NOT EXISTS`.
    pub open_us: f64,
    /// The first read after the open: the run's row and its latest record.
    pub read_us: f64,
    /// Read, decode the state, compute the next one (the handler), commit the transition.
    pub resume_us: f64,
    /// CPU time of the process during `resume_us`.
    pub resume_cpu_us: f64,
    /// p50 of 9 raw redb single-record commits this child made just before the resume.
    pub floor_us: f64,
}

/// The SQLite resume child, in the steps of `resume::child_main`: open, its own floor, the
/// first read, then the resume of the run `target` (one transition from its end) to `Done`.
pub fn child_main(path: &Path) -> Child {
    let started = Instant::now();
    let mut db = Sqlite::open(path);
    let open_us = micros(started.elapsed());
    let floor_path = path.with_extension("floor.redb");
    let mut raw = Raw::create(&floor_path, 275, 159);
    let floor: Vec<f64> = (0..9).map(|_| micros(raw.commit(1, false))).collect();
    let floor_us = percentile(&floor, 50.0);
    drop(raw);
    let _ = std::fs::remove_file(&floor_path);

    let started = Instant::now();
    let (seq, _, _) = db.latest("target").expect("the run exists");
    let read_us = micros(started.elapsed());

    let cpu = process_cpu_ns();
    let started = Instant::now();
    let (seq2, status, bytes) = db.latest("target").expect("the run exists");
    assert_eq!((seq2, status.as_str()), (seq, "running"));
    let stored = loops::TransitionRecord::from_stored("target", seq, &bytes).expect("a record");
    let value: Bench = stored.decode("target").expect("a Bench");
    // The handler: `Work { left: 0 }` moves to `Done`.
    let next = match value {
        Bench::Start { left: 0, note } | Bench::Work { left: 0, note } => Bench::Done { note },
        other => panic!("the template ends one transition from Done, not at {other:?}"),
    };
    let (state, record) = record("target", seq + 1, &next);
    db.transition("target", seq + 1, state, &record, true, loops::now_ms());
    let resume_us = micros(started.elapsed());
    let resume_cpu_us = (process_cpu_ns() - cpu) as f64 / 1000.0;
    assert_eq!(db.latest("target").map(|l| l.0), Some(seq + 1));
    Child {
        open_us,
        read_us,
        resume_us,
        resume_cpu_us,
        floor_us,
    }
}

/// How the concurrent SQLite runs share the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// One connection per thread; SQLite's lock (and `busy_timeout`) orders the writers.
    Connections,
    /// One connection behind a `Mutex`, shared by every thread.
    Mutex,
}

/// Holds or releases the worker threads between measured slices.
struct Gate {
    go: Mutex<bool>,
    changed: Condvar,
    held: AtomicUsize,
    stop: AtomicBool,
}

impl Gate {
    /// Blocks while the gate is closed; `false` once the workers are to stop.
    fn pass(&self) -> bool {
        let mut go = self.go.lock().unwrap_or_else(PoisonError::into_inner);
        if !*go {
            self.held.fetch_add(1, Ordering::SeqCst);
            while !*go && !self.stop.load(Ordering::SeqCst) {
                go = self
                    .changed
                    .wait(go)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            self.held.fetch_sub(1, Ordering::SeqCst);
        }
        !self.stop.load(Ordering::SeqCst)
    }

    fn set(&self, go: bool) {
        *self.go.lock().unwrap_or_else(PoisonError::into_inner) = go;
        self.changed.notify_all();
    }
}

/// `n` threads, each driving one run through transitions on the SQLite store, held between
/// slices (a thread finishes its transaction before it is held).
pub struct Workers {
    gate: Arc<Gate>,
    done: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
    n: usize,
}

impl Workers {
    /// Creates the `n` runs and starts their threads, held.
    pub fn start(path: &Path, n: usize, sharing: Sharing) -> Workers {
        let gate = Arc::new(Gate {
            go: Mutex::new(false),
            changed: Condvar::new(),
            held: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let done = Arc::new(AtomicU64::new(0));
        let shared = Arc::new(Mutex::new(Sqlite::open(path)));
        let note = note();
        for i in 0..n {
            let id = format!("run-{i:06}");
            let first = Bench::Start {
                left: 1 << 40,
                note: note.clone(),
            };
            let (state, bytes) = record(&id, 0, &first);
            shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .create(&id, state, &bytes, loops::now_ms());
        }
        let threads = (0..n)
            .map(|i| {
                let (gate, done, path) = (Arc::clone(&gate), Arc::clone(&done), path.to_owned());
                let shared = (sharing == Sharing::Mutex).then(|| Arc::clone(&shared));
                let note = note.clone();
                std::thread::spawn(move || {
                    let mut own = shared.is_none().then(|| Sqlite::open(&path));
                    let id = format!("run-{i:06}");
                    let mut seq = 0u64;
                    while gate.pass() {
                        seq += 1;
                        let value = Bench::Work {
                            left: (1 << 40) - seq,
                            note: note.clone(),
                        };
                        let (state, bytes) = record(&id, seq, &value);
                        let at_ms = loops::now_ms();
                        match (&mut own, &shared) {
                            (Some(db), _) => db.transition(&id, seq, state, &bytes, false, at_ms),
                            (None, Some(db)) => db
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .transition(&id, seq, state, &bytes, false, at_ms),
                            (None, None) => unreachable!("a connection of its own or shared"),
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let w = Workers {
            gate,
            done,
            threads,
            n,
        };
        w.hold();
        w
    }

    /// Closes the gate and waits until every thread is held.
    fn hold(&self) {
        self.gate.set(false);
        while self.gate.held.load(Ordering::SeqCst) < self.n {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Lets the threads go for `window` (after a short ramp), then holds them again; returns
    /// transitions per second and the process's CPU time per transition.
    pub fn rate(&self, window: Duration) -> (f64, f64) {
        self.gate.set(true);
        std::thread::sleep(Duration::from_millis(10));
        let (c0, t0, cpu0) = (
            self.done.load(Ordering::Relaxed),
            Instant::now(),
            process_cpu_ns(),
        );
        std::thread::sleep(window);
        let (c1, t1, cpu1) = (
            self.done.load(Ordering::Relaxed),
            Instant::now(),
            process_cpu_ns(),
        );
        self.hold();
        let transitions = (c1 - c0) as f64;
        (
            transitions / (t1 - t0).as_secs_f64(),
            (cpu1 - cpu0) as f64 / 1000.0 / transitions.max(1.0),
        )
    }

    /// Stops and joins the threads.
    pub fn stop(self) {
        self.gate.stop.store(true, Ordering::SeqCst);
        self.gate.set(false);
        for t in self.threads {
            t.join().expect("a SQLite worker");
        }
    }
}
