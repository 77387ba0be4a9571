//! Running the crate's unit tests: `rustc --test`, then the test binary, as subprocesses.
//!
//! This needs no cargo, no registry and no network, and takes well under a second for the
//! demo crate. The report keeps what the model needs (which tests failed and why) and drops
//! what differs from one run to the next: timings, thread ids and temporary paths.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context as _, Result};
use tokio::process::Command;

use crate::child::output_in_recorded_group;
use crate::git::Git;
use crate::workflow::{TestCase, TestReport};

/// The crate root the tests are built from, relative to the repository.
pub const CRATE_ROOT: &str = "src/lib.rs";

/// Checks that `rustc` can be run.
///
/// # Errors
/// A message saying that the Rust toolchain is needed, if it cannot be started.
pub async fn check_rustc() -> Result<()> {
    crate::child::version_of(
        "rustc",
        "this example builds the demo crate's tests with rustc",
        "install Rust (https://rustup.rs)",
    )
    .await
    .map(drop)
}

/// Writes the files of `commit` to a fresh directory under `scratch` (the checkout is never
/// touched), builds the unit tests of [`CRATE_ROOT`] there, runs them and reports.
///
/// A failing build or failing tests are a report, not an error: the exit status of the test
/// process is what decides the next state.
///
/// # Errors
/// If git fails, or `rustc` or the test binary cannot be started.
pub async fn run_tests(git: &Git, commit: &str, scratch: &Path) -> Result<TestReport> {
    let build = tempfile::Builder::new()
        .prefix("tests-")
        .tempdir_in(scratch)
        .with_context(|| format!("cannot create a directory in {}", scratch.display()))?;
    let tree = build.path().join("tree");
    git.export(commit, &tree, &build.path().join("index"))
        .await?;
    let binary = build.path().join("unit-tests");
    let rustc = || {
        let mut rustc = killed_with_the_step("rustc", &tree);
        rustc
            .args(["--edition", "2021", "--test", CRATE_ROOT, "-o"])
            .arg(&binary);
        rustc
    };
    // Whether rustc can start was checked at the start ([`check_rustc`]).
    let compiled =
        output_in_recorded_group(rustc, "rustc --test", build_cut_short, build.path()).await?;
    if !compiled.status.success() {
        let stderr = String::from_utf8_lossy(&compiled.stderr)
            .replace(&build.path().to_string_lossy().into_owned(), "<build>");
        return Ok(TestReport {
            passed: false,
            exit_code: None,
            tests: Vec::new(),
            compile_error: Some(stderr.trim().to_owned()),
        });
    }
    let tests = || {
        let mut tests = killed_with_the_step(&binary, &tree);
        tests
            .args(["--test-threads=1", "--color=never"])
            .env("RUST_BACKTRACE", "0");
        tests
    };
    let ran =
        output_in_recorded_group(tests, "the demo's unit tests", |_| None, build.path()).await?;
    let stdout = String::from_utf8_lossy(&ran.stdout);
    Ok(parse(&stdout, ran.status.success(), ran.status.code()))
}

/// `program`, to run in `dir` with no input, in a process group of its own
/// ([`own_process_group`](crate::child::own_process_group)), and killed when its step is
/// dropped (Ctrl-C, a time-out): a build or a test run has nothing to finish. Run through
/// [`output_in_recorded_group`], so that the next start stops it if this program is killed.
fn killed_with_the_step(program: impl AsRef<std::ffi::OsStr>, dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(dir).stdin(Stdio::null()).kill_on_drop(true);
    crate::child::own_process_group(&mut cmd);
    cmd
}

/// How a build of the tests that failed was stopped from outside, if it was, by what rustc
/// said: its linker (`cc`, `collect2`, `ld`) killed by a signal (rustc then exits 1, saying
/// so), or a SIGINT it caught (it stops with "compilation was interrupted"). Neither is a
/// compile error of the code.
fn build_cut_short(output: &std::process::Output) -> Option<&'static str> {
    if output.status.success() {
        return None;
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("compilation was interrupted") {
        Some("SIGINT, which rustc caught")
    } else if (stderr.contains("linking with `") && stderr.contains("` failed: signal: "))
        || stderr.contains("terminated with signal")
        // gcc's "<Name> signal terminated program collect2" (Killed, Terminated, Interrupt,
        // Hangup, ...).
        || stderr.contains(" signal terminated program ")
    {
        Some("its linker, by a signal")
    } else {
        None
    }
}

/// Builds a report from libtest's human-readable output.
pub fn parse(stdout: &str, passed: bool, exit_code: Option<i32>) -> TestReport {
    let mut tests: Vec<TestCase> = Vec::new();
    for line in stdout.lines() {
        let Some(rest) = line.strip_prefix("test ") else {
            continue;
        };
        let Some((name, result)) = rest.rsplit_once(" ... ") else {
            continue;
        };
        let passed = match result {
            "ok" => true,
            "FAILED" => false,
            _ => continue, // ignored, bench
        };
        tests.push(TestCase {
            name: name.to_owned(),
            passed,
            output: None,
        });
    }
    for (name, output) in failure_sections(stdout) {
        if let Some(test) = tests.iter_mut().find(|t| t.name == name) {
            test.output = Some(output);
        }
    }
    TestReport {
        passed,
        exit_code,
        tests,
        compile_error: None,
    }
}

/// The `---- name stdout ----` sections of failed tests, normalized.
fn failure_sections(stdout: &str) -> Vec<(String, String)> {
    let mut sections = Vec::new();
    let mut current: Option<(String, Vec<String>)> = None;
    for line in stdout.lines() {
        let header = line
            .strip_prefix("---- ")
            .and_then(|l| l.strip_suffix(" stdout ----"));
        if header.is_some() || line == "failures:" {
            sections.extend(current.take().map(finish));
        }
        if let Some(name) = header {
            current = Some((name.to_owned(), Vec::new()));
        } else if let Some((_, lines)) = current.as_mut()
            && !line.starts_with("note: run with `RUST_BACKTRACE")
        {
            lines.push(strip_thread_id(line));
        }
    }
    sections.extend(current.map(finish));
    sections
}

fn finish((name, lines): (String, Vec<String>)) -> (String, String) {
    (name, lines.join("\n").trim().to_owned())
}

/// `thread 'x' (12345) panicked at ...` becomes `thread 'x' panicked at ...`: the thread id
/// differs on every run.
fn strip_thread_id(line: &str) -> String {
    if let Some(rest) = line.strip_prefix("thread '")
        && let Some(end) = rest.find("' (")
    {
        let after = &rest[end + 3..];
        if let Some(close) = after.find(')')
            && close > 0
            && after[..close].bytes().all(|b| b.is_ascii_digit())
        {
            return format!("thread '{}'{}", &rest[..end], &after[close + 1..]);
        }
    }
    line.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rustc's messages when its linker was killed, or it caught a SIGINT (from rustc 1.95,
    /// gcc and collect2), are a build cut short; a compile error, or success, is not.
    #[cfg(unix)]
    #[test]
    fn a_build_stopped_from_outside_is_told_from_a_compile_error() {
        use std::os::unix::process::ExitStatusExt as _;
        let failed = |stderr: &str| std::process::Output {
            status: std::process::ExitStatus::from_raw(1 << 8),
            stdout: Vec::new(),
            stderr: stderr.as_bytes().to_vec(),
        };
        let linker = Some("its linker, by a signal");
        for (stderr, how) in [
            (
                "error: linking with `cc` failed: signal: 9 (SIGKILL)\n  |\n  = note: ...",
                linker,
            ),
            (
                "collect2: fatal error: ld terminated with signal 9 [Killed]",
                linker,
            ),
            (
                "cc: fatal error: Killed signal terminated program collect2",
                linker,
            ),
            (
                "cc: fatal error: Terminated signal terminated program collect2",
                linker,
            ),
            (
                "cc: fatal error: Interrupt signal terminated program collect2",
                linker,
            ),
            (
                "cc: internal compiler error: Hangup signal terminated program collect2",
                linker,
            ),
            (
                "error[E0080]: compilation was interrupted\n --> src/lib.rs:3:1",
                Some("SIGINT, which rustc caught"),
            ),
            ("error[E0308]: mismatched types\n --> src/lib.rs:7:5", None),
        ] {
            assert_eq!(build_cut_short(&failed(stderr)), how, "{stderr}");
        }
        let mut passed = failed("error: linking with `cc` failed: signal: 9 (SIGKILL)");
        passed.status = std::process::ExitStatus::from_raw(0);
        assert_eq!(build_cut_short(&passed), None);
    }

    const OUTPUT: &str = "
running 2 tests
test tests::add_sums_its_arguments ... ok
test tests::mean_of_three_values ... FAILED

failures:

---- tests::mean_of_three_values stdout ----

thread 'tests::mean_of_three_values' (15245) panicked at src/lib.rs:27:9:
assertion `left == right` failed
  left: Some(4.5)
 right: Some(3.0)
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    tests::mean_of_three_values

test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s
";

    #[test]
    fn parses_results_and_drops_what_varies() {
        let report = parse(OUTPUT, false, Some(101));
        assert_eq!(report.describe(), "1 of 2 tests fail");
        assert_eq!(report.tests.len(), 2);
        assert!(report.tests[0].passed);
        assert_eq!(report.tests[0].output, None);
        let failed: Vec<_> = report.failed().collect();
        assert_eq!(failed[0].name, "tests::mean_of_three_values");
        assert_eq!(
            failed[0].output.as_deref(),
            Some(
                "thread 'tests::mean_of_three_values' panicked at src/lib.rs:27:9:\n\
                 assertion `left == right` failed\n  left: Some(4.5)\n right: Some(3.0)"
            )
        );
        let json = serde_json::to_string(&report).unwrap();
        assert!(
            !json.contains("finished in") && !json.contains("15245"),
            "{json}"
        );
    }

    #[test]
    fn thread_ids_only_are_stripped() {
        assert_eq!(
            strip_thread_id("thread 'main' (1) panicked at a.rs:1:1:"),
            "thread 'main' panicked at a.rs:1:1:"
        );
        assert_eq!(
            strip_thread_id("thread 'main' panicked"),
            "thread 'main' panicked"
        );
        assert_eq!(strip_thread_id("left: (1)"), "left: (1)");
    }
}
