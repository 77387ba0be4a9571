//! Scenario 6: bytes on disk per transition, and the file after a million transitions before
//! and after retention (`prune_with`) and compaction (`compact`).
//!
//! Runs are driven by the runtime (real commits, many runs at a time, as in production), each
//! from `Start` through `Work` states to `Done`; a state's serialized value is about 200
//! bytes. With `seeded`, the large store is written by `RedbStore::__seed_history` instead
//! (same records, far fewer commits), which is faster but lays the file out differently.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use loops::{RetentionPolicy, Runtime};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::workload::{Bench, Looper, note};

#[derive(Debug, Clone, Serialize)]
pub struct Filled {
    pub runs: u64,
    pub concurrency: usize,
    /// Transition records written (every state of every run, the initial one included).
    pub transitions: u64,
    pub how: &'static str,
    pub elapsed_s: f64,
    pub file_bytes: u64,
    pub bytes_per_transition: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Disk {
    /// A transition record as stored, and the state's serialized value inside it.
    pub record_bytes: usize,
    pub payload_bytes: usize,
    pub empty_file_bytes: u64,
    pub small: Filled,
    pub large: Filled,
    pub pruned_runs: u64,
    pub pruned_records: u64,
    pub prune_s: f64,
    pub after_prune_bytes: u64,
    pub compact_s: f64,
    pub after_compact_bytes: u64,
}

pub struct Config {
    pub small_transitions: u64,
    pub large_transitions: u64,
    pub records_per_run: u64,
    pub small_concurrency: usize,
    pub large_concurrency: usize,
    pub seeded: bool,
}

pub fn run(tokio: &tokio::runtime::Runtime, dir: &Path, cfg: &Config) -> Disk {
    let empty = dir.join("disk-empty.redb");
    let empty_file_bytes = {
        let rt = Runtime::open(&empty).expect("open");
        drop(rt);
        std::fs::metadata(&empty).map_or(0, |m| m.len())
    };
    let _ = std::fs::remove_file(&empty);

    let small_path = dir.join("disk-small.redb");
    let small = fill(
        tokio,
        &small_path,
        cfg.small_transitions / cfg.records_per_run,
        cfg.records_per_run,
        cfg.small_concurrency,
        false,
    );
    let (record_bytes, payload_bytes) = {
        let rt = Runtime::open(&small_path).expect("open");
        let store = rt.redb().expect("redb").clone();
        let record = &store.history("run-0000000").expect("history")[1];
        (
            serde_json::to_vec(record).expect("encode").len(),
            record.payload.get().len(),
        )
    };
    let _ = std::fs::remove_file(&small_path);

    let large_path = dir.join("disk-large.redb");
    let large = fill(
        tokio,
        &large_path,
        cfg.large_transitions / cfg.records_per_run,
        cfg.records_per_run,
        cfg.large_concurrency,
        cfg.seeded,
    );
    let rt = Runtime::builder()
        .verify_on_open(false)
        .open(&large_path)
        .expect("open");
    let started = Instant::now();
    let pruned = tokio
        .block_on(rt.prune_with(&RetentionPolicy::default().keep_last(0), false))
        .expect("prune");
    let prune_s = started.elapsed().as_secs_f64();
    let after_prune_bytes = std::fs::metadata(&large_path).map_or(0, |m| m.len());
    let started = Instant::now();
    let compacted = tokio.block_on(rt.compact()).expect("compact");
    let compact_s = started.elapsed().as_secs_f64();
    drop(rt);
    // The compacted file opens, verified page by page, and holds no run.
    let rt = Runtime::open(&large_path).expect("reopen the compacted store");
    let left = tokio
        .block_on(rt.list_runs(loops::RunStatus::Completed, None))
        .expect("list");
    assert!(left.is_empty(), "prune left {} runs", left.len());
    drop(rt);
    let _ = std::fs::remove_file(&large_path);
    Disk {
        record_bytes,
        payload_bytes,
        empty_file_bytes,
        small,
        large,
        pruned_runs: pruned.runs,
        pruned_records: pruned.records,
        prune_s,
        after_prune_bytes,
        compact_s,
        after_compact_bytes: compacted.bytes_after,
    }
}

/// Writes `runs` completed runs of `records` transition records each into a new store.
fn fill(
    tokio: &tokio::runtime::Runtime,
    path: &Path,
    runs: u64,
    records: u64,
    concurrency: usize,
    seeded: bool,
) -> Filled {
    let started = Instant::now();
    let rt = Runtime::open(path).expect("open");
    if seeded {
        let store = rt.redb().expect("redb").clone();
        let note = note();
        // Interleaved across `concurrency` runs at a time, as concurrent runs write.
        let items = (0..runs).step_by(concurrency).flat_map(move |first| {
            let ids: Vec<String> = (first..(first + concurrency as u64).min(runs))
                .map(|i| format!("run-{i:07}"))
                .collect();
            let note = note.clone();
            (0..records).flat_map(move |seq| {
                let note = note.clone();
                ids.clone().into_iter().map(move |id| {
                    let value = if seq == 0 {
                        Bench::Start {
                            left: records - 2,
                            note: note.clone(),
                        }
                    } else if seq == records - 1 {
                        Bench::Done { note: note.clone() }
                    } else {
                        Bench::Work {
                            left: records - 2 - seq,
                            note: note.clone(),
                        }
                    };
                    (id, value)
                })
            })
        });
        store.__seed_history(items).expect("seed");
    } else {
        let looper = Looper::counting();
        tokio.block_on(async {
            let gate = Arc::new(Semaphore::new(concurrency));
            let mut tasks = JoinSet::new();
            for i in 0..runs {
                let permit = Arc::clone(&gate).acquire_owned().await.expect("permit");
                let (rt, h) = (rt.clone(), Arc::clone(&looper));
                tasks.spawn(async move {
                    let start = Bench::Start {
                        left: records - 2,
                        note: note(),
                    };
                    let out = rt.run(&format!("run-{i:07}"), start, &*h).await;
                    drop(permit);
                    out.map(|_| ())
                });
                while let Some(done) = tasks.try_join_next() {
                    done.expect("a driver task").expect("a run ends");
                }
            }
            while let Some(done) = tasks.join_next().await {
                done.expect("a driver task").expect("a run ends");
            }
        });
    }
    drop(rt);
    let elapsed_s = started.elapsed().as_secs_f64();
    let file_bytes = std::fs::metadata(path).map_or(0, |m| m.len());
    let transitions = runs * records;
    eprintln!(
        "  {transitions} transitions in {runs} runs ({}) in {elapsed_s:.1} s: {file_bytes} bytes",
        if seeded { "seeded" } else { "runtime" }
    );
    Filled {
        runs,
        concurrency,
        transitions,
        how: if seeded { "seeded" } else { "runtime" },
        elapsed_s,
        file_bytes,
        bytes_per_transition: file_bytes as f64 / transitions as f64,
    }
}
