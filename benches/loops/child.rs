//! Child processes: scenarios that measure a process's memory or startup run in a process of
//! their own, so that they share no heap with the others.

use std::path::Path;
use std::process::Command;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The line prefix a child prints its result after, as JSON.
const RESULT: &str = "RESULT ";

/// Runs this benchmark binary as a child with `--child ARGS...` and returns its result.
pub fn run<T: DeserializeOwned>(args: &[&str]) -> T {
    let exe = std::env::current_exe().expect("the bench binary's path");
    let out = Command::new(exe)
        .arg("--child")
        .args(args)
        .output()
        .expect("start a child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(RESULT))
        .unwrap_or_else(|| panic!("child {args:?} printed no result:\n{stdout}"));
    serde_json::from_str(line).expect("a child's result")
}

/// Prints a child's result for [`run`] and ends the process at once (without tearing down
/// what the measurement left running).
pub fn finish<T: Serialize>(result: &T) -> ! {
    println!(
        "{RESULT}{}",
        serde_json::to_string(result).expect("encode a child's result")
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(0)
}

/// Copies `from` to `to` and syncs the copy, so that no write-back of it runs during the
/// measurement that follows.
pub fn copy_synced(from: &Path, to: &Path) {
    let _ = std::fs::remove_file(to);
    std::fs::copy(from, to).expect("copy a store file");
    std::fs::File::open(to)
        .and_then(|f| f.sync_all())
        .expect("sync the copy");
}
