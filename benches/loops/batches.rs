//! How many transitions each group commit holds: a `metrics` recorder that keeps only loops'
//! `loops_commit_batch_size` histogram, as counts by batch size, while a measurement asks for
//! it (every other metric is dropped, and nothing is kept between measurements).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use loops::metrics::facade::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use serde::Serialize;

/// Batch sizes counted one by one up to this; larger batches share the last slot.
const SIZES: usize = 1025;

/// Counts of commits by the number of writes they held.
struct Counts {
    on: AtomicBool,
    by_size: Vec<AtomicU64>,
}

impl HistogramFn for Counts {
    fn record(&self, value: f64) {
        if self.on.load(Ordering::Relaxed) {
            let size = (value.max(0.0) as usize).min(SIZES - 1);
            self.by_size[size].fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Batches(Arc<Counts>);

impl Recorder for Batches {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        if key.name() == loops::metrics::COMMIT_BATCH_SIZE {
            Histogram::from_arc(Arc::clone(&self.0))
        } else {
            Histogram::noop()
        }
    }
}

/// The recorder, installed as the process's on first use.
fn counts() -> &'static Arc<Counts> {
    static COUNTS: OnceLock<Arc<Counts>> = OnceLock::new();
    COUNTS.get_or_init(|| {
        let counts = Arc::new(Counts {
            on: AtomicBool::new(false),
            by_size: (0..SIZES).map(|_| AtomicU64::new(0)).collect(),
        });
        if loops::metrics::facade::set_global_recorder(Batches(Arc::clone(&counts))).is_err() {
            eprintln!("  (another metrics recorder is installed: batch sizes not counted)");
        }
        counts
    })
}

/// Starts counting batch sizes (from zero).
pub fn start() {
    let c = counts();
    for n in &c.by_size {
        n.store(0, Ordering::Relaxed);
    }
    c.on.store(true, Ordering::Relaxed);
}

/// Stops counting; the counts stay until the next [`start`].
pub fn stop() {
    counts().on.store(false, Ordering::Relaxed);
}

/// The distribution of batch sizes counted between [`start`] and [`stop`] (and any earlier
/// counts since the last `start`), weighted by writes: the share of transitions committed in a
/// batch of at most a size, which is what a transition sees.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Distribution {
    /// Commits counted.
    pub commits: u64,
    /// Writes they held.
    pub writes: u64,
    /// Writes per commit, on average.
    pub mean: f64,
    /// The batch size at or below which half (9 in 10, 99 in 100) of the writes committed.
    pub p50: usize,
    pub p90: usize,
    pub p99: usize,
    /// The largest batch.
    pub max: usize,
    /// Share of the writes by batch size: `(largest size, share)` for sizes 1, 2-3, 4-7, ...
    /// (powers of two), up to the largest batch seen.
    pub shares: Vec<(usize, f64)>,
}

/// The counts since the last [`start`].
pub fn distribution() -> Distribution {
    let by_size: Vec<u64> = counts()
        .by_size
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .collect();
    let commits: u64 = by_size.iter().sum();
    let writes: u64 = by_size
        .iter()
        .enumerate()
        .map(|(size, n)| size as u64 * n)
        .sum();
    let at = |share: f64| {
        let mut seen = 0u64;
        for (size, n) in by_size.iter().enumerate() {
            seen += size as u64 * n;
            if writes > 0 && seen as f64 >= share * writes as f64 {
                return size;
            }
        }
        0
    };
    let mut shares = Vec::new();
    let mut lower = 1usize;
    while lower < SIZES {
        let upper = (lower * 2 - 1).min(SIZES - 1);
        let within: u64 = (lower..=upper)
            .map(|size| size as u64 * by_size[size])
            .sum();
        if writes > 0 {
            shares.push((upper, within as f64 / writes as f64));
        }
        lower = upper + 1;
    }
    while shares.last().is_some_and(|&(_, s)| s == 0.0) {
        shares.pop();
    }
    Distribution {
        commits,
        writes,
        mean: if commits > 0 {
            writes as f64 / commits as f64
        } else {
            0.0
        },
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        max: by_size.iter().rposition(|&n| n > 0).unwrap_or(0),
        shares,
    }
}
