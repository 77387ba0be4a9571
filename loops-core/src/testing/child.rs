//! The crash explorer's child processes: how the parent starts one (the test binary run
//! again, on the same test, with the case in environment variables), what a child reports
//! back (a journal file of the writes and step runs it saw, written line by line so that an
//! abort loses none), and the hook that aborts the child at a boundary.
//!
//! The explorer itself (explore.rs) runs the workflow in a child and compares what the
//! children report; this module knows nothing of workflows.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::clock::ManualClock;
use crate::error::Result;
use crate::run::settings::StepRun;
use crate::store::{Reply, Write};
use crate::testing::report::{ONLY_ENV, When};
use crate::testing::store::{Verdict, WriteHook, WriteSeen};

/// Set in a child process of the explorer: the directory of its case (the store file
/// `store.redb`, the journal `journal.jsonl`, the child's standard error `stderr.txt`).
pub(crate) const CHILD_ENV: &str = "LOOPS_EXPLORE_CHILD";

/// Set in a child process: what it does (`reference`, `crash <write> <before|after>`,
/// `resume <clock ms>`).
const ROLE_ENV: &str = "LOOPS_EXPLORE_ROLE";

/// Set in a child process: the explored run, so that the child's explorer knows the case is
/// its own.
const RUN_ENV: &str = "LOOPS_EXPLORE_RUN";

/// How long the parent lets one child run, by the real clock, before it kills it: the
/// child's own limit on the run, plus its start.
const CHILD_LIMIT: Duration = Duration::from_secs(90);

/// How often the parent looks whether its child ended (real time).
const LOOK_EVERY: Duration = Duration::from_millis(5);

/// What a child process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Runs the workflow to its end on a new store: the run the others are compared with.
    Reference,
    /// Runs the workflow on a new store and aborts the process at write `.0`, `.1`.
    Crash(u64, When),
    /// Resumes the run in the store to its end, its manual clock at `.0` ms (where the
    /// crashed process's clock was).
    Resume(u64),
}

impl Role {
    fn to_env(self) -> String {
        match self {
            Role::Reference => "reference".to_owned(),
            Role::Crash(write, When::BeforeCommit) => format!("crash {write} before"),
            Role::Crash(write, When::AfterCommit) => format!("crash {write} after"),
            Role::Resume(clock_ms) => format!("resume {clock_ms}"),
        }
    }

    fn from_env(text: &str) -> Option<Role> {
        let mut words = text.split(' ');
        match (words.next()?, words.next(), words.next()) {
            ("reference", None, None) => Some(Role::Reference),
            ("crash", Some(write), Some(when)) => {
                let when = match when {
                    "before" => When::BeforeCommit,
                    "after" => When::AfterCommit,
                    _ => return None,
                };
                Some(Role::Crash(write.parse().ok()?, when))
            }
            ("resume", Some(clock_ms), None) => Some(Role::Resume(clock_ms.parse().ok()?)),
            _ => None,
        }
    }
}

/// The case this process is a child for, if it is one of an explorer of `run_id`: its
/// directory and role. `Err` names what is wrong with the variables of a child process.
pub(crate) fn role_from_env(run_id: &str) -> Option<std::result::Result<(PathBuf, Role), String>> {
    let dir = std::env::var_os(CHILD_ENV)?;
    let role = std::env::var(ROLE_ENV).unwrap_or_default();
    let run = std::env::var(RUN_ENV).unwrap_or_default();
    if run != run_id {
        return Some(Err(format!(
            "this child process explores run `{run}`, and this explorer run `{run_id}`: a test \
             runs one explorer in child processes"
        )));
    }
    Some(
        Role::from_env(&role)
            .map(|role| (PathBuf::from(dir), role))
            .ok_or_else(|| format!("{ROLE_ENV} is `{role}`, not a role of a child process")),
    )
}

/// One line of a child's journal.
#[derive(Debug, Serialize, Deserialize)]
enum Line {
    /// A write the child's store was given (before it went to the store), and the clock then.
    Write {
        n: u64,
        kind: String,
        run_id: Option<String>,
        what: String,
        step: Option<(u64, String, u32)>,
        clock_ms: u64,
    },
    /// A run of a step's closure.
    Step {
        run_id: String,
        seq: u64,
        name: String,
        occurrence: u32,
        key: String,
    },
    /// The child aborts now, at its boundary.
    Crash,
    /// The run ended.
    Ended,
    /// The run could not be run: why.
    Problem(String),
}

/// Where a child writes its journal: one line per event, each written through before the
/// child goes on, so that an abort loses none. Clones share the file.
#[derive(Clone)]
pub(crate) struct Journal(Arc<Mutex<File>>);

impl Journal {
    /// The journal of the case in `dir`, appended to.
    pub(crate) fn open(dir: &Path) -> std::io::Result<Journal> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("journal.jsonl"))?;
        Ok(Journal(Arc::new(Mutex::new(file))))
    }

    fn line(&self, line: &Line) {
        let mut text = serde_json::to_string(line).unwrap_or_default();
        text.push('\n');
        let mut file = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // A line that cannot be written shows in the parent as a journal that lacks it.
        let _ = file.write_all(text.as_bytes());
    }

    /// Notes a run of a step's closure.
    pub(crate) fn step(&self, run: &StepRun) {
        self.line(&Line::Step {
            run_id: run.run_id.clone(),
            seq: run.seq,
            name: run.name.clone(),
            occurrence: run.occurrence,
            key: run.key.clone(),
        });
    }

    /// Notes that the run ended, and ends the process with success.
    pub(crate) fn ended(&self) -> ! {
        self.line(&Line::Ended);
        std::process::exit(0)
    }

    /// Notes why the run could not be run, and ends the process with a failure.
    pub(crate) fn problem(&self, why: &str) -> ! {
        self.line(&Line::Problem(why.to_owned()));
        std::process::exit(1)
    }
}

/// A child's hook: journals every write with the clock, and aborts the process at the
/// boundary of a [`Role::Crash`]: `std::process::abort()`, no destructor, no flush of
/// anything but what the store committed.
pub(crate) struct AbortAt {
    pub(crate) journal: Journal,
    pub(crate) clock: ManualClock,
    pub(crate) at: Option<(u64, When)>,
}

impl AbortAt {
    fn abort(&self) -> ! {
        self.journal.line(&Line::Crash);
        std::process::abort()
    }
}

impl WriteHook for AbortAt {
    fn before(&self, seen: &WriteSeen) -> Verdict {
        self.journal.line(&Line::Write {
            n: seen.n,
            kind: seen.kind.to_owned(),
            run_id: seen.run_id.clone(),
            what: seen.what.clone(),
            step: seen.step.clone(),
            clock_ms: self.clock.now_ms(),
        });
        if self.at == Some((seen.n, When::BeforeCommit)) {
            self.abort();
        }
        Verdict::Go
    }

    fn after(&self, seen: &WriteSeen, _reply: &Result<Reply>) -> Verdict {
        if self.at == Some((seen.n, When::AfterCommit)) {
            self.abort();
        }
        Verdict::Go
    }
}

/// What a child reported, and how it ended.
pub(crate) struct Report {
    pub(crate) writes: Vec<WriteSeen>,
    pub(crate) steps: Vec<StepRun>,
    /// The clock at the last write, in ms (0 without a write).
    pub(crate) clock_ms: u64,
    /// Whether it aborted at its boundary (else the run ended).
    pub(crate) crashed: bool,
}

/// A directory of one case, removed when dropped.
pub(crate) struct CaseDir(PathBuf);

impl CaseDir {
    /// A new empty directory under the system's temporary directory.
    pub(crate) fn new() -> std::io::Result<CaseDir> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("loops-explore-{}-{n}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(CaseDir(dir))
    }

    /// Its path.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// The store file of the case.
    pub(crate) fn store(&self) -> PathBuf {
        self.0.join("store.redb")
    }
}

impl Drop for CaseDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs this test binary again on the test `test` alone, as the child of `role` for the run
/// `run_id` in `dir`, waits for it (killing it after 90 s), and reads what it reported.
///
/// # Errors
/// Why the child did not report a run that ended, or a crash at its boundary: it could not
/// be started, ran no explorer (a wrong test name), reported a problem, or died otherwise.
pub(crate) async fn run_child(
    test: &str,
    dir: &CaseDir,
    role: Role,
    run_id: &str,
) -> std::result::Result<Report, String> {
    // The journal of the child before (a crash) was read: this child's starts empty.
    let _ = std::fs::remove_file(dir.path().join("journal.jsonl"));
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this test binary: {e}"))?;
    let stderr = File::create(dir.path().join("stderr.txt"))
        .map_err(|e| format!("cannot create the child's stderr file: {e}"))?;
    let mut child = Command::new(&exe)
        .args([
            test,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .env(ROLE_ENV, role.to_env())
        .env(RUN_ENV, run_id)
        .env_remove(ONLY_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > CHILD_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the child process ({}) did not end within {} s; killed",
                    role.to_env(),
                    CHILD_LIMIT.as_secs()
                ));
            }
            Ok(None) => tokio::time::sleep(LOOK_EVERY).await,
            Err(e) => return Err(format!("cannot wait for the child process: {e}")),
        }
    };
    read_report(dir, role, status, test)
}

/// What the child of `role` in `dir`, ended with `status`, reported.
fn read_report(
    dir: &CaseDir,
    role: Role,
    status: ExitStatus,
    test: &str,
) -> std::result::Result<Report, String> {
    let mut report = Report {
        writes: Vec::new(),
        steps: Vec::new(),
        clock_ms: 0,
        crashed: false,
    };
    let mut ended = false;
    let mut problem = None;
    if let Ok(file) = File::open(dir.path().join("journal.jsonl")) {
        for text in BufReader::new(file).lines().map_while(std::io::Result::ok) {
            match serde_json::from_str::<Line>(&text) {
                Ok(Line::Write {
                    n,
                    kind,
                    run_id,
                    what,
                    step,
                    clock_ms,
                }) => {
                    report.clock_ms = report.clock_ms.max(clock_ms);
                    report.writes.push(WriteSeen {
                        n,
                        kind: Write::KINDS
                            .into_iter()
                            .find(|k| *k == kind)
                            .unwrap_or("Unknown"),
                        run_id,
                        what,
                        step,
                    });
                }
                Ok(Line::Step {
                    run_id,
                    seq,
                    name,
                    occurrence,
                    key,
                }) => report.steps.push(StepRun {
                    run_id,
                    seq,
                    name,
                    occurrence,
                    key,
                }),
                Ok(Line::Crash) => report.crashed = true,
                Ok(Line::Ended) => ended = true,
                Ok(Line::Problem(why)) => problem = Some(why),
                // A line cut short by the abort: the write it was about is not reported.
                Err(_) => {}
            }
        }
    }
    let crash_expected = matches!(role, Role::Crash(..));
    match (problem, report.crashed, ended) {
        (Some(why), ..) => Err(why),
        (None, true, _) if crash_expected && !status.success() => Ok(report),
        (None, false, true) if status.success() => Ok(report),
        (None, false, false) if status.success() => Err(format!(
            "the child process ran no crash explorer: is `{test}` the name of the test that \
             runs it (Explorer::in_child_processes_of)?"
        )),
        _ => {
            let stderr = std::fs::read_to_string(dir.path().join("stderr.txt")).unwrap_or_default();
            let tail: Vec<&str> = stderr.lines().rev().take(12).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            Err(format!(
                "the child process ({}) ended with {status} without reporting {}; its stderr \
                 ends with:\n{}",
                role.to_env(),
                if crash_expected {
                    "its crash or its end"
                } else {
                    "its end"
                },
                tail.join("\n")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_read_back_as_written() {
        for role in [
            Role::Reference,
            Role::Crash(7, When::BeforeCommit),
            Role::Crash(12, When::AfterCommit),
            Role::Resume(1_767_225_600_000),
        ] {
            assert_eq!(Role::from_env(&role.to_env()), Some(role));
        }
        assert_eq!(Role::from_env("crash 7 during"), None);
        assert_eq!(Role::from_env("resume"), None);
        assert_eq!(Role::from_env(""), None);
    }
}
