//! What the `deliver` example refuses up front: each refusal is one `error:` line, exit code
//! 1, nothing on standard output, and nothing created.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Output};

use common::{describe, example};

mod common;

/// Runs the example with `args` (in the work directory `dir/work` unless they name one),
/// without test hooks.
fn deliver(dir: &Path, args: &[OsString]) -> Output {
    let mut cmd = Command::new(example());
    if !args.iter().any(|a| a == "--workdir") {
        cmd.arg("--workdir").arg(dir.join("work"));
    }
    cmd.args(args)
        .env_remove("LOOPS_DELIVER_HOLD_AT_SEQ")
        .env_remove("LOOPS_DELIVER_STOP_AT_SEQ")
        .env_remove("RUST_LOG")
        .output()
        .expect("run the example")
}

/// Checks that `output` is a refusal: exit code 1, no standard output, one line on standard
/// error, starting `error: ` and containing `wanted`. And that nothing was created in `dir`
/// but what `existing` names.
fn assert_refused(output: &Output, wanted: &str, dir: &Path, existing: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.code() == Some(1)
            && output.stdout.is_empty()
            && stderr.lines().count() == 1
            && stderr.starts_with("error: ")
            && stderr.contains(wanted),
        "expected a one-line refusal containing {wanted:?}:\n{}",
        describe(output)
    );
    let mut made: Vec<String> = std::fs::read_dir(dir)
        .expect("read the directory")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    made.sort();
    assert_eq!(made, existing, "{}", describe(output));
}

#[test]
fn bad_run_ids_are_refused_in_one_line() {
    let long = "x".repeat(257);
    for id in ["", " deliver", "deliver ", "a\nb", "a\u{7}b", long.as_str()] {
        let dir = tempfile::tempdir().expect("temp dir");
        let output = deliver(dir.path(), &["--run-id".into(), id.into()]);
        assert_refused(&output, "error: --run-id: invalid run id", dir.path(), &[]);
    }
}

#[cfg(unix)]
#[test]
fn non_utf8_paths_are_refused_in_one_line() {
    use std::os::unix::ffi::OsStringExt as _;

    for flag in ["--workdir", "--store", "--repo"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut bad = dir.path().as_os_str().to_owned().into_vec();
        bad.extend_from_slice(b"/x\xff");
        let output = deliver(dir.path(), &[flag.into(), OsString::from_vec(bad)]);
        assert_refused(&output, &format!("{flag} \""), dir.path(), &[]);
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("is not valid UTF-8"),
            "{}",
            describe(&output)
        );
    }
}

/// `--repo` names the top directory of an existing git work tree: nothing is created there.
#[test]
fn a_repo_must_be_the_top_of_an_existing_work_tree() {
    let dir = tempfile::tempdir().expect("temp dir");
    let repo = |name: &str| vec!["--repo".into(), dir.path().join(name).into_os_string()];

    let output = deliver(dir.path(), &repo("nowhere"));
    assert_refused(&output, "no such directory", dir.path(), &[]);

    std::fs::create_dir(dir.path().join("plain")).expect("a directory");
    let output = deliver(dir.path(), &repo("plain"));
    assert_refused(&output, "is not a git work tree", dir.path(), &["plain"]);

    let git = Command::new("git")
        .args(["init", "--quiet"])
        .arg(dir.path().join("plain"))
        .output()
        .expect("run git init");
    assert!(git.status.success(), "{}", describe(&git));
    std::fs::create_dir(dir.path().join("plain/sub")).expect("a directory");
    let output = deliver(dir.path(), &repo("plain/sub"));
    assert_refused(&output, "name its top directory", dir.path(), &["plain"]);
}
