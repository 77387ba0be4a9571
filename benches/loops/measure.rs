//! Measuring tools: percentiles, the process's memory, the machine, and the raw redb floor.

use std::path::Path;
use std::time::{Duration, Instant};

use redb::{Database, TableDefinition};
use serde::Serialize;

/// The `p`-th percentile (0..=100) of `samples`, nearest rank.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn median(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// CPU time this process's threads have run so far, in ns (the sum over its threads of
/// `/proc/self/task/*/schedstat`'s first field; threads that ended are not counted, so take
/// differences over spans in which no thread ends).
pub fn process_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// A field of `/proc/self/status` in KiB (`VmHWM`: peak resident set; `VmRSS`: now).
pub fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Resets the peak resident set (`VmHWM`) to the current one (Linux 4.0+); `false` if the
/// kernel refused.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The machine the numbers were taken on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub disk: String,
    pub filesystem: String,
    pub kernel: String,
    pub rustc: String,
    pub redb: String,
    pub loops_commit: String,
}

impl Machine {
    pub fn describe(dir: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|| "unknown".to_owned());
        let memory_kib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            })
            .unwrap_or(0.0);
        let (device, filesystem) = mount_of(dir);
        let disk = describe_disk(&device);
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_gib: (memory_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            disk,
            filesystem,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "unknown".to_owned()),
            rustc: command_line("rustc", &["--version"]),
            redb: locked_version("redb"),
            loops_commit: {
                // Changes to docs/ (this report's own files) do not count.
                let commit = command_line("git", &["rev-parse", "--short", "HEAD"]);
                let changes = command_line("git", &["status", "--porcelain", "--", ".", ":!docs"]);
                if commit == "unknown" || changes.is_empty() {
                    commit
                } else {
                    format!("{commit}, with uncommitted changes")
                }
            },
        }
    }
}

fn command_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The version of `krate` in the workspace's `Cargo.lock`.
fn locked_version(krate: &str) -> String {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
        .unwrap_or_default();
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line == format!("name = \"{krate}\"")
            && let Some(v) = lines.next().and_then(|l| l.strip_prefix("version = "))
        {
            return v.trim_matches('"').to_owned();
        }
    }
    "unknown".to_owned()
}

/// The device and file system type of the mount holding `dir`.
fn mount_of(dir: &Path) -> (String, String) {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?, f.next()?, f.next()?))
        })
        .filter(|(_, point, _)| dir.starts_with(point))
        .max_by_key(|(_, point, _)| point.len())
        .map(|(dev, _, fs)| (dev.to_owned(), fs.to_owned()))
        .unwrap_or_else(|| ("unknown".to_owned(), "unknown".to_owned()))
}

fn describe_disk(device: &str) -> String {
    let name = device.trim_start_matches("/dev/");
    let base: String = name
        .trim_end_matches(|c: char| c.is_ascii_digit())
        .to_owned();
    let sys = format!("/sys/block/{base}");
    let read = |f: &str| {
        std::fs::read_to_string(format!("{sys}/{f}"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let size_gib = read("size").parse::<f64>().unwrap_or(0.0) * 512.0 / (1u64 << 30) as f64;
    let kind = if base.starts_with("vd") {
        "virtio block device"
    } else if base.starts_with("nvme") {
        "NVMe"
    } else {
        "block device"
    };
    format!(
        "{device}: {kind}, {size_gib:.0} GiB, rotational flag {} (as the VM reports it; the \
         host's storage is not visible)",
        read("queue/rotational"),
    )
}

const JOURNAL: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("journal");
const RUNS: TableDefinition<&str, &[u8]> = TableDefinition::new("runs");
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");

/// How [`Raw::commit`] lays out its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Keyed by (run id, seq), in one table per kind of record (store format 1's layout).
    ByRun,
    /// Appended to one log keyed by a global sequence (store format 2's layout).
    Log,
}

/// A plain redb database written the way loops' records are keyed, with
/// `Durability::Immediate` (redb's default): the floor a durable transition cannot beat.
pub struct Raw {
    db: Database,
    record: Vec<u8>,
    row: Vec<u8>,
    seq: u64,
    /// The next key of the log ([`Layout::Log`]).
    next: u64,
}

impl Raw {
    /// A new database at `path` whose records are `record_bytes` long and rows `row_bytes`.
    pub fn create(path: &Path, record_bytes: usize, row_bytes: usize) -> Raw {
        let db = Database::create(path).expect("create the raw redb database");
        Raw {
            db,
            record: vec![b'x'; record_bytes],
            row: vec![b'r'; row_bytes],
            seq: 0,
            next: 0,
        }
    }

    /// One write transaction holding `runs` records (one per run id, each at the next seq)
    /// and, with `rows`, each run's row in a second table; one Immediate commit. Returns its
    /// duration.
    pub fn commit(&mut self, runs: usize, rows: bool) -> Duration {
        self.commit_as(Layout::ByRun, runs, rows)
    }

    /// [`commit`](Self::commit), with the records laid out as `layout` says.
    pub fn commit_as(&mut self, layout: Layout, runs: usize, rows: bool) -> Duration {
        let started = Instant::now();
        let mut txn = self.db.begin_write().expect("begin a raw write");
        txn.set_durability(redb::Durability::Immediate)
            .expect("Immediate durability");
        {
            let mut journal = match layout {
                Layout::ByRun => Some(txn.open_table(JOURNAL).expect("open journal")),
                Layout::Log => None,
            };
            let mut log = match layout {
                Layout::ByRun => None,
                Layout::Log => Some(txn.open_table(LOG).expect("open log")),
            };
            let mut table = if rows {
                Some(txn.open_table(RUNS).expect("open runs"))
            } else {
                None
            };
            for i in 0..runs {
                let id = format!("run-{i:06}");
                if let Some(journal) = journal.as_mut() {
                    journal
                        .insert((id.as_str(), self.seq), self.record.as_slice())
                        .expect("insert a record");
                }
                if let Some(log) = log.as_mut() {
                    log.insert(self.next, self.record.as_slice())
                        .expect("append a record");
                    self.next += 1;
                }
                if let Some(t) = table.as_mut() {
                    t.insert(id.as_str(), self.row.as_slice())
                        .expect("insert a row");
                }
            }
        }
        txn.commit().expect("commit");
        self.seq += 1;
        started.elapsed()
    }
}
