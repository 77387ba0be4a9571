//! Scenario 8: attribute search on many runs: `find_runs` (what `Runtime::list_runs_where`
//! and `loops runs --attr` call) on a store of N runs, each with three attributes, against a
//! scan of the same runs (every row of the status index and its attributes, filtered in
//! memory: what a search without the index would cost).
//!
//! The runs are seeded (status running, one record each); their attributes are set through
//! the store's own write path, `Write::SetAttributes`, many writes in flight so that group
//! commit batches them. Run `i` has `repo = acme/repo-{i % 100}` (1 % of the runs each),
//! `issue = i` (one run each) and `due = T0 + i s` (a time).

use std::path::Path;
use std::time::Instant;

use loops::{AttributeFilter, AttributeValue, RedbStore, RunFilter, RunStatus, Store, Write};
use serde::Serialize;

use crate::measure::{median, micros};
use crate::workload::seed_unfinished;

/// The first run's `due`, ms since the Unix epoch.
const T0: u64 = 1_767_225_600_000;

/// Writes in flight while the attributes are set.
const IN_FLIGHT: usize = 2048;

#[derive(Debug, Clone, Serialize)]
pub struct Query {
    pub label: &'static str,
    /// Runs the query returns.
    pub found: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub reps: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Search {
    pub runs: u64,
    pub seed_s: f64,
    /// Setting three attributes on every run, through `Write::SetAttributes`.
    pub attributes_s: f64,
    pub file_bytes: u64,
    pub queries: Vec<Query>,
    /// The scan: every running run's row and attributes, filtered by `repo` in memory.
    pub scan: Query,
}

pub fn run(tokio: &tokio::runtime::Runtime, dir: &Path, runs: u64, reps: usize) -> Search {
    let path = dir.join("search.redb");
    let store = RedbStore::open(&path).expect("open the search store");
    let started = Instant::now();
    seed_unfinished(&store, runs);
    let seed_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    tokio.block_on(async {
        let ids: Vec<u64> = (0..runs).collect();
        for chunk in ids.chunks(IN_FLIGHT) {
            let writes = chunk.iter().map(|&i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let write = Write::SetAttributes {
                        run_id: format!("run-{i:07}"),
                        seq: 0,
                        attributes: vec![
                            (
                                "repo".to_owned(),
                                AttributeValue::Str(format!("acme/repo-{}", i % 100)),
                            ),
                            ("issue".to_owned(), AttributeValue::Int(i as i64)),
                            ("due".to_owned(), AttributeValue::Time(T0 + i * 1000)),
                        ],
                    };
                    store.write(None, write).await.expect("set the attributes");
                })
            });
            for task in writes.collect::<Vec<_>>() {
                task.await.expect("the write's task");
            }
        }
    });
    let attributes_s = started.elapsed().as_secs_f64();
    let file_bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    eprintln!(
        "  seeded {runs} runs in {seed_s:.1} s, their attributes in {attributes_s:.1} s ({file_bytes} bytes)"
    );
    let mid = runs / 2;
    let cases: Vec<(&'static str, RunFilter)> = vec![
        (
            "issue = one value (int, 1 run)",
            RunFilter::new().attribute("issue", mid as i64),
        ),
        (
            "issue in a range of 100 (int)",
            RunFilter::new().where_attribute(AttributeFilter::int_range(
                "issue",
                mid as i64..=mid as i64 + 99,
            )),
        ),
        (
            "due in a range of 100 s (time)",
            RunFilter::new().where_attribute(AttributeFilter::time_range(
                "due",
                T0 + mid * 1000..=T0 + (mid + 99) * 1000,
            )),
        ),
        (
            "repo = one of 100 values (str, 1 % of the runs)",
            RunFilter::new().attribute("repo", "acme/repo-7"),
        ),
        (
            "repo and status running and issue range (3 conditions)",
            RunFilter::new()
                .attribute("repo", "acme/repo-7")
                .status(RunStatus::Running)
                .where_attribute(AttributeFilter::int_range("issue", 0..=mid as i64)),
        ),
    ];
    let queries = cases
        .into_iter()
        .map(|(label, filter)| {
            let q = measure(tokio, label, reps, || {
                tokio
                    .block_on(loops::find_runs(&store, &filter))
                    .expect("search")
                    .len()
            });
            eprintln!(
                "  {label:<58} {:>6} runs  p50 {:>9.0} µs  p99 {:>9.0} µs",
                q.found, q.p50_us, q.p99_us
            );
            q
        })
        .collect();
    let scan = measure(
        tokio,
        "scan: every running run, filtered by repo",
        3,
        || {
            tokio.block_on(async {
                let mut n = 0;
                for info in Store::list(&store, RunStatus::Running, None)
                    .await
                    .expect("list")
                {
                    let attributes = Store::attributes(&store, &info.run_id)
                        .await
                        .expect("attributes");
                    if attributes.get("repo") == Some(&AttributeValue::Str("acme/repo-7".into())) {
                        n += 1;
                    }
                }
                n
            })
        },
    );
    eprintln!(
        "  {:<58} {:>6} runs  p50 {:>9.0} µs",
        scan.label, scan.found, scan.p50_us
    );
    Search {
        runs,
        seed_s,
        attributes_s,
        file_bytes,
        queries,
        scan,
    }
}

/// `reps` timed calls of `f` (after one untimed call); `found` is what it returned.
fn measure(
    _tokio: &tokio::runtime::Runtime,
    label: &'static str,
    reps: usize,
    mut f: impl FnMut() -> usize,
) -> Query {
    let found = f();
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        let n = f();
        samples.push(micros(t.elapsed()));
        assert_eq!(n, found, "{label}: the same answer every time");
    }
    samples.sort_by(f64::total_cmp);
    let p99 = samples[((samples.len() as f64 * 0.99) as usize).min(samples.len() - 1)];
    Query {
        label,
        found,
        p50_us: median(&samples),
        p99_us: p99,
        reps,
    }
}
