//! Scenario 10's LangGraph peer for issue 19's goal 5: resume after a crash with LangGraph +
//! SqliteSaver (`durability="sync"`), run by `langgraph_resume.py` (beside this file) in a
//! Python that has LangGraph installed: `target/peers/bin/python` (made as docs/benchmarks.md,
//! "Run it", says), else `LOOPS_BENCH_PYTHON`, else none (the rows say "not measured").

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

/// One resume child's figures, in µs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Child {
    /// Connection, saver and compiled graph.
    pub open_us: f64,
    /// After the open, until the first new step is entered.
    pub entry_us: f64,
    /// After the open, until that step's checkpoint is committed.
    pub resume_us: f64,
}

/// The script, beside this file.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/loops/langgraph_resume.py")
}

/// A Python with LangGraph and its SQLite saver, if there is one.
pub fn python() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/peers/bin/python");
    let candidates = std::env::var_os("LOOPS_BENCH_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([venv]);
    candidates.into_iter().find(|python| {
        Command::new(python)
            .args(["-c", "import langgraph.checkpoint.sqlite"])
            .output()
            .is_ok_and(|out| out.status.success())
    })
}

/// The LangGraph version `python` has, for the report.
pub fn version(python: &Path) -> String {
    Command::new(python)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('langgraph'), m.version('langgraph-checkpoint-sqlite'))",
        ])
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Writes a thread of `records` checkpointed steps at `path` (which it replaces), stopped by
/// a crash in the step after them.
pub fn seed(python: &Path, path: &Path, records: u64) {
    remove(path);
    let out = Command::new(python)
        .arg(script())
        .arg("seed")
        .arg(path)
        .arg(records.to_string())
        .output()
        .expect("start Python");
    assert!(
        out.status.success(),
        "seeding LangGraph failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One resume of `path` (a fresh copy, removed afterwards).
pub fn resume(python: &Path, template: &Path, work: &Path) -> Child {
    remove(work);
    crate::child::copy_synced(template, work);
    let out = Command::new(python)
        .arg(script())
        .arg("resume")
        .arg(work)
        .output()
        .expect("start Python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "LangGraph's resume failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    remove(work);
    serde_json::from_str(stdout.trim()).expect("the resume's figures")
}

/// Removes a SQLite database and its WAL and shared-memory files.
pub fn remove(path: &Path) {
    let _ = std::fs::remove_file(path);
    for ext in ["-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(ext);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}
