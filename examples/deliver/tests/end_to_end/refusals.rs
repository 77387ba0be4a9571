//! What the `deliver` example refuses up front: each refusal is one `error:` line, exit code
//! 1, nothing on standard output, and nothing created.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{HOLD_VAR, STOP_VAR, describe, example, names_in, reference, run_ids};

/// Runs the example with `args` (in the work directory `dir/work` unless they name one),
/// without test hooks.
fn deliver(dir: &Path, args: &[OsString]) -> Output {
    let mut cmd = Command::new(example());
    if !args.iter().any(|a| a == "--workdir") {
        cmd.arg("--workdir").arg(dir.join("work"));
    }
    // In `dir`, so that whatever a refused command would create relative to the current
    // directory is seen there.
    cmd.args(args)
        .current_dir(dir)
        .env_remove(HOLD_VAR)
        .env_remove(STOP_VAR)
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
    assert_eq!(names_in(dir), existing, "{}", describe(output));
}

/// Asserts that `output` is of a run that ended at pull request 1 (opened now or before).
fn assert_pull_request_1(output: &Output) {
    assert!(
        output.status.success()
            && String::from_utf8_lossy(&output.stdout)
                .contains("pull request: forge://demo/pulls/1"),
        "{}",
        describe(output)
    );
}

/// A run id loops does not take, or one an edit's child run would need, is a usage error,
/// as clap reports one (exit 2, the rule it breaks), before anything is printed or made.
#[test]
fn bad_run_ids_are_usage_errors() {
    let long = "x".repeat(257);
    for (id, rule) in [
        ("", "empty"),
        (" deliver", "white space"),
        ("deliver ", "white space"),
        ("a\nb", "control character"),
        ("a\u{7}b", "control character"),
        (long.as_str(), "bytes"),
        // Shown escaped, as the `loops` CLI shows it: raw, it would reorder the line.
        ("\u{202e}abc", "'\\u{202e}abc'"),
        (
            "zz/edit-0",
            "child runs that apply a plan's edits (run \"zz\" would start this one)",
        ),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let output = deliver(dir.path(), &["--run-id".into(), id.into()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.code() == Some(2)
                && output.stdout.is_empty()
                && stderr.starts_with("error: invalid value ")
                && stderr.contains("for '--run-id <ID>': invalid run id ")
                && stderr.contains(rule)
                && !stderr.contains('\u{202e}'),
            "{id:?}: {}",
            describe(&output)
        );
        assert!(names_in(dir.path()).is_empty(), "{}", describe(&output));
    }
    // A value far longer than any run id is not echoed whole (helper-133): its first 64
    // characters and its length.
    let dir = tempfile::tempdir().expect("temp dir");
    let huge = "y".repeat(5000);
    let output = deliver(dir.path(), &["--run-id".into(), huge.into()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let said = format!(
        "error: invalid value for '--run-id <ID>': invalid run id \"{}\"... (5000 bytes): \
         longer than 256 bytes\n",
        "y".repeat(64)
    );
    assert!(
        output.status.code() == Some(2) && stderr.starts_with(&said) && stderr.len() < 500,
        "{}",
        describe(&output)
    );
    assert!(names_in(dir.path()).is_empty(), "{}", describe(&output));
}

/// `--approve` or `--retry` of a run that does not exist is refused (it would start a new
/// run, a mistyped id most likely): with no store, before anything is made; with a store,
/// nothing is added to it.
#[test]
fn approve_and_retry_refuse_a_run_that_is_not_there() {
    for (flag, verb) in [("--approve", "approve"), ("--retry", "retry")] {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = dir.path().join("work/deliver.redb");
        let refusal = format!(
            "error: {flag}: there is no run deliver-1 in {} to {verb} (check --store and \
             --run-id; a new run starts without {flag})\n",
            store.display()
        );
        let output = deliver(dir.path(), &[flag.into()]);
        assert_refused(&output, &refusal, dir.path(), &[]);
        // Nor a store of its own, outside the work directory.
        let outside = dir.path().join("outside.redb");
        let output = deliver(
            dir.path(),
            &[flag.into(), "--store".into(), outside.clone().into()],
        );
        let wanted = format!(
            "there is no run deliver-1 in {} to {verb}",
            outside.display()
        );
        assert_refused(&output, &wanted, dir.path(), &[]);
        let other = deliver(dir.path(), &["--run-id".into(), "other".into()]);
        assert!(other.status.success(), "{}", describe(&other));
        let output = deliver(dir.path(), &[flag.into()]);
        assert_refused(&output, &refusal, dir.path(), &["work"]);
        assert_eq!(run_ids(&store), ["other", "other/edit-0"], "{flag}");
    }
}

/// `--approve` with `--auto-approve` (either value) or `--fresh` (which would delete the run
/// to approve) is a usage error: exit 2, nothing made or deleted.
#[test]
fn approve_excludes_auto_approve_and_fresh() {
    for (other, named) in [
        ("--auto-approve=false", "--auto-approve [<BOOL>]"),
        ("--auto-approve", "--auto-approve [<BOOL>]"),
        ("--fresh", "--fresh"),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let output = deliver(dir.path(), &["--approve".into(), other.into()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.code() == Some(2)
                && output.stdout.is_empty()
                && stderr.starts_with(&format!(
                    "error: the argument '--approve' cannot be used with '{named}'"
                )),
            "{}",
            describe(&output)
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

/// A path with a line break is refused before anything is made: the work directory records
/// its store's path and its own on a line each (one cut by a line break named another store:
/// helper-103 F3).
#[test]
fn paths_with_line_breaks_are_refused_in_one_line() {
    for flag in ["--workdir", "--store", "--repo"] {
        for brk in ["\n", "\r"] {
            let dir = tempfile::tempdir().expect("temp dir");
            let bad = format!("{}/a{brk}b", dir.path().display());
            let output = deliver(dir.path(), &[flag.into(), bad.clone().into()]);
            let wanted =
                format!("{flag} {bad:?} holds a line break; this example needs paths without one");
            assert_refused(&output, &wanted, dir.path(), &[]);
        }
    }
}

/// A `--workdir` that is a file is refused in one line, before anything is made (it was read
/// as a directory: "Not a directory (os error 20)", helper-105); so is a path with `..` after
/// a directory that does not exist.
#[test]
fn paths_that_name_no_directory_are_refused_in_one_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "mine").expect("write a file");
    let output = deliver(dir.path(), &["--workdir".into(), file.clone().into()]);
    let wanted = format!(
        "--workdir {} is a file, not a directory: name a new or empty directory, or one this \
         example made",
        file.display()
    );
    assert_refused(&output, &wanted, dir.path(), &["notes.txt"]);
    assert_eq!(std::fs::read(&file).expect("read the file"), b"mine");
    let under = file.join("work");
    let output = deliver(dir.path(), &["--workdir".into(), under.clone().into()]);
    let wanted = format!(
        "--workdir {}: {} is a file, not a directory",
        under.display(),
        file.display()
    );
    assert_refused(&output, &wanted, dir.path(), &["notes.txt"]);
    // `..` after a directory that does not exist names nothing: making the path would make
    // that directory too (helper-105).
    for flag in ["--workdir", "--store"] {
        let bad = dir.path().join("missing/../x");
        let output = deliver(dir.path(), &[flag.into(), bad.clone().into()]);
        let wanted = format!(
            "{flag} {}: {} is not a directory, so `..` after it names nothing; name the path \
             without it",
            bad.display(),
            dir.path().join("missing").display()
        );
        assert_refused(&output, &wanted, dir.path(), &["notes.txt"]);
    }
}

/// A hard link to the store that records a work directory's runs is that store, not another
/// one: the run goes on through it (it was refused as another store's, helper-103 F8), and
/// the work directory stays bound to the store's first name.
#[test]
fn a_hard_link_to_the_store_is_the_same_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = deliver(dir.path(), &[]);
    assert!(output.status.success(), "{}", describe(&output));
    let link = dir.path().join("link.redb");
    std::fs::hard_link(dir.path().join("work/deliver.redb"), &link).expect("a hard link");
    let output = deliver(dir.path(), &["--store".into(), link.clone().into()]);
    assert_pull_request_1(&output);
    // The binding keeps the store's first name: with the link gone, the store is still the
    // work directory's, and another one is refused there (it took the work directory over,
    // and opened its own pull request #1 beside the first run's: helper-106 F5).
    std::fs::remove_file(&link).expect("remove the link");
    let other = dir.path().join("other.redb");
    let output = deliver(dir.path(), &["--store".into(), other.clone().into()]);
    let wanted = format!(
        "work directory {} holds the runs of the store {}",
        dir.path().join("work").display(),
        dir.path().join("work/deliver.redb").display()
    );
    assert_refused(&output, &wanted, dir.path(), &["work"]);
}

/// Directories of the user's beside the work directory named as this example's leftovers
/// (`<workdir>.new-<digits>`, `<workdir>.deleting-<digits>`) are not deleted by a start: only
/// those this example made (its marker, or nothing but its own files) and no process holds
/// are (every start deleted them whole: helper-106 F4).
#[test]
fn directories_of_the_user_beside_the_work_directory_are_not_deleted() {
    let dir = tempfile::tempdir().expect("temp dir");
    for name in ["work.new-2024", "work.deleting-77"] {
        std::fs::create_dir(dir.path().join(name)).expect("a directory of the user's");
        std::fs::write(dir.path().join(name).join("notes.txt"), "mine").expect("notes");
    }
    // One this example left (a start killed as it built its new work directory) goes.
    let left = dir.path().join("work.new-99");
    std::fs::create_dir(&left).expect("a leftover");
    std::fs::write(left.join(".loops-deliver-workdir"), "0123456789abcdef").expect("marker");
    let output = deliver(dir.path(), &[]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(
        names_in(dir.path()),
        ["work", "work.deleting-77", "work.new-2024"]
    );
    for name in ["work.new-2024", "work.deleting-77"] {
        let notes = std::fs::read(dir.path().join(name).join("notes.txt")).expect("notes");
        assert_eq!(notes, b"mine");
    }
}

/// A bidirectional control in a path is escaped where the path is said (on standard output,
/// and in an error), as run ids are: on a terminal it would reorder the line (helper-104 F3).
#[test]
fn bidirectional_controls_in_paths_are_shown_escaped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = dir.path().join("a\u{202e}b");
    let output = deliver(dir.path(), &["--workdir".into(), workdir.clone().into()]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let shown = format!("{}/a\\u{{202e}}b", dir.path().display());
    assert!(
        output.status.success()
            && stdout.contains(&format!("store:  {shown}/deliver.redb"))
            && !stdout.contains('\u{202e}'),
        "{}",
        describe(&output)
    );
    let output = deliver(
        dir.path(),
        &[
            "--workdir".into(),
            workdir.into(),
            "--retry".into(),
            "--run-id".into(),
            "nope".into(),
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.code() == Some(1) && stderr.contains(&shown) && !stderr.contains('\u{202e}'),
        "{}",
        describe(&output)
    );
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

/// An empty `--workdir`, `--store` or `--repo` is a usage error that says it is empty (clap
/// said no value was supplied), before anything is made.
#[test]
fn empty_paths_are_refused_as_empty() {
    for flag in ["--workdir", "--store", "--repo"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let output = deliver(dir.path(), &[flag.into(), "".into()]);
        assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
        let stderr = String::from_utf8_lossy(&output.stderr);
        let placeholder = if flag == "--workdir" { "DIR" } else { "PATH" };
        assert!(
            stderr.starts_with(&format!(
                "error: invalid value '' for '{flag} <{placeholder}>': empty: name a path (or \
                 leave the flag out for its default)\n"
            )),
            "{}",
            describe(&output)
        );
        assert_eq!(names_in(dir.path()), Vec::<String>::new());
    }
}

/// `--store` names a file: a URL (the `loops` CLI's PostgreSQL stores) is refused, not
/// taken for a relative path and created under the current directory.
#[test]
fn a_store_url_is_refused_in_one_line() {
    for url in [
        "postgres://postgres@127.0.0.1/test",
        "postgresql://h/db",
        "file:///tmp/x",
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let output = deliver(dir.path(), &["--store".into(), url.into()]);
        assert_refused(
            &output,
            "URL; this example runs on an embedded store file only",
            dir.path(),
            &[],
        );
    }
}

/// A store inside what the example builds and clears in its work directory (the demo's
/// repository, the remote, the forge, the scratch space) is refused before anything is made,
/// with `--fresh` too.
#[test]
fn a_store_inside_what_the_example_builds_is_refused() {
    for (inside, what) in [
        ("repo/s.redb", "the demo's repository"),
        ("remote.git/s.redb", "the remote"),
        ("forge/pulls/s.redb", "the forge"),
        ("scratch/s.redb", "the scratch space"),
    ] {
        for fresh in [false, true] {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = dir.path().join("work").join(inside);
            let mut args: Vec<OsString> = vec!["--store".into(), store.clone().into()];
            if fresh {
                args.push("--fresh".into());
            }
            let output = deliver(dir.path(), &args);
            assert_refused(
                &output,
                &format!(
                    "--store {} is inside {what} {}, which this example builds and clears",
                    store.display(),
                    dir.path()
                        .join("work")
                        .join(inside.split('/').next().unwrap())
                        .display()
                ),
                dir.path(),
                &[],
            );
        }
    }
}

/// The same through symbolic links (a link to the work directory, a link to its repository
/// not made yet), and a work directory inside another's scratch space or repository: refused
/// with links resolved, and nothing made.
#[test]
fn places_inside_what_a_work_directory_builds_are_refused_through_links() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().canonicalize().expect("the temp dir");
    let work = root.join("work");
    std::fs::create_dir(&work).expect("mkdir");
    std::fs::write(work.join(".loops-deliver-workdir"), "0123456789abcdef").expect("marker");
    std::os::unix::fs::symlink(&work, root.join("via")).expect("link");
    std::os::unix::fs::symlink(work.join("repo"), root.join("to-repo")).expect("link");
    let cases: [(&[&str], String, PathBuf); 4] = [
        (
            &["--store", "via/scratch/s.redb"],
            "--store via/scratch/s.redb is inside the scratch space".to_owned(),
            work.join("scratch"),
        ),
        (
            &["--store", "to-repo/s.redb"],
            "--store to-repo/s.redb is inside the demo's repository".to_owned(),
            work.join("repo"),
        ),
        (
            &["--workdir", "work/scratch/x"],
            "--workdir work/scratch/x is inside the scratch space".to_owned(),
            work.join("scratch"),
        ),
        (
            &["--workdir", "via/repo/x"],
            "--workdir via/repo/x is inside the demo's repository".to_owned(),
            work.join("repo"),
        ),
    ];
    // A work directory inside another, which `--fresh` there would delete with it, and a
    // link to nothing as one.
    let output = deliver(&root, &["--workdir".into(), "work/sub".into()]);
    assert_refused(
        &output,
        &format!(
            "--workdir {}/work/sub is inside another work directory, {}, which `--fresh` there \
             deletes whole",
            root.display(),
            work.display()
        ),
        &root,
        &["to-repo", "via", "work"],
    );
    std::os::unix::fs::symlink(root.join("gone"), root.join("dangling")).expect("link");
    let output = deliver(&root, &["--workdir".into(), "dangling".into()]);
    assert_refused(
        &output,
        &format!(
            "--workdir {}/dangling is a symbolic link to {}/gone, which does not exist",
            root.display(),
            root.display()
        ),
        &root,
        &["dangling", "to-repo", "via", "work"],
    );
    std::fs::remove_file(root.join("dangling")).expect("remove the link");
    // Two links that point to each other: a loop, in the system's words (Linux's here).
    if cfg!(target_os = "linux") {
        std::os::unix::fs::symlink("loop-b", root.join("loop-a")).expect("link");
        std::os::unix::fs::symlink("loop-a", root.join("loop-b")).expect("link");
        let output = deliver(&root, &["--workdir".into(), "loop-a".into()]);
        assert_refused(
            &output,
            &format!(
                "--workdir {}/loop-a is a symbolic link to loop-b, which cannot be followed (Too \
                 many levels of symbolic links (os error 40))",
                root.display()
            ),
            &root,
            &["loop-a", "loop-b", "to-repo", "via", "work"],
        );
        std::fs::remove_file(root.join("loop-a")).expect("remove the link");
        std::fs::remove_file(root.join("loop-b")).expect("remove the link");
    }
    // `--fresh` with another work directory's store: refused, the store left as it was.
    let store = work.join("deliver.redb");
    std::fs::write(&store, b"another directory's runs").expect("a store");
    let output = deliver(
        &root,
        &[
            "--workdir".into(),
            "other".into(),
            "--store".into(),
            store.clone().into(),
            "--fresh".into(),
        ],
    );
    assert_refused(
        &output,
        &format!(
            "--fresh: --store {} is the store of another work directory, {}, whose runs it \
             holds; --fresh deletes this work directory's store only (nothing was deleted)",
            store.display(),
            work.display()
        ),
        &root,
        &["to-repo", "via", "work"],
    );
    assert_eq!(
        std::fs::read(&store).expect("the store"),
        b"another directory's runs"
    );
    std::fs::remove_file(&store).expect("remove the store");
    for (args, wanted, inside) in cases {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let output = deliver(&root, &args);
        let wanted = format!(
            "{} {}, which this example builds and clears",
            wanted
                .replace("via/", &format!("{}/via/", root.display()))
                .replace("to-repo/", &format!("{}/to-repo/", root.display()))
                .replace(" work/", &format!(" {}/", work.display())),
            inside.display()
        );
        assert_refused(&output, &wanted, &root, &["to-repo", "via", "work"]);
        assert_eq!(names_in(&work), [".loops-deliver-workdir"]);
    }
}

/// A store whose payloads are sealed, and no `--key-file`: refused in one line naming this
/// program's option (not the library's setting), and nothing else made.
#[test]
fn an_encrypted_store_without_a_key_file_is_refused_in_one_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("sealed.redb");
    let store = loops::RedbStore::open(&path).expect("a store");
    let seal = loops::Write::Seal {
        key: "k1".into(),
        check: None,
        at_ms: 1,
    };
    let tokio = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio");
    tokio
        .block_on(loops::Store::write(&store, None, seal))
        .expect("record the key");
    drop(store);
    // Refused on the store opened read-only: not one byte of it changes (its writable open's
    // close rewrote part of it).
    let before = std::fs::read(&path).expect("read the store");
    let output = deliver(dir.path(), &["--store".into(), path.clone().into()]);
    assert_refused(
        &output,
        &format!(
            "error: store {} holds payloads encrypted with key k1: give this program the key file with --key-file PATH\n",
            path.display()
        ),
        dir.path(),
        &["sealed.redb"],
    );
    assert!(
        std::fs::read(&path).expect("read") == before,
        "the store changed"
    );
    // A key file that holds none of the store's keys: the library's refusal, as it is.
    let k9 = dir.path().join("k9");
    std::fs::write(&k9, format!("k9 {}\n", "09".repeat(32))).expect("write");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&k9, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let args: Vec<OsString> = vec![
        "--store".into(),
        path.clone().into(),
        "--key-file".into(),
        k9.into(),
    ];
    assert_refused(
        &deliver(dir.path(), &args),
        &format!(
            "error: store {} holds payloads encrypted with key k1 and none of them is held here: what key `k9` sealed",
            path.display()
        ),
        dir.path(),
        &["k9", "sealed.redb"],
    );
    assert!(
        std::fs::read(&path).expect("read") == before,
        "the store changed"
    );
}

/// `--repo` names the top directory of an existing git work tree: nothing is created there.
#[test]
fn a_repo_must_be_the_top_of_an_existing_work_tree() {
    let dir = tempfile::tempdir().expect("temp dir");
    let repo = |name: &str| vec!["--repo".into(), dir.path().join(name).into_os_string()];

    let output = deliver(dir.path(), &repo("nowhere"));
    assert_refused(&output, "no such directory", dir.path(), &[]);

    let files = tempfile::tempdir().expect("temp dir");
    let notes = files.path().join("notes.txt");
    std::fs::write(&notes, "not a repository\n").expect("a file");
    let output = deliver(files.path(), &["--repo".into(), notes.into_os_string()]);
    assert_refused(
        &output,
        "notes.txt: not a directory",
        files.path(),
        &["notes.txt"],
    );

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

/// A `--repo` made by `git init`, with no commit yet: one clear line, not git's silence after
/// a colon, and the repository is left as it was.
#[test]
fn a_repo_without_commits_is_refused_in_one_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let repo = dir.path().join("new");
    for args in [
        &["init", "--quiet", &repo.to_string_lossy()][..],
        &[
            "-C",
            &repo.to_string_lossy(),
            "symbolic-ref",
            "HEAD",
            "refs/heads/trunk",
        ],
    ] {
        let git = Command::new("git").args(args).output().expect("run git");
        assert!(git.status.success(), "{}", describe(&git));
    }
    let output = deliver(dir.path(), &["--repo".into(), repo.clone().into()]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: --repo {} has no commits on its branch trunk; commit something first: a new \
             run starts from the last commit of the branch checked out\n",
            repo.display()
        )
    );
    let refs = Command::new("git")
        .args(["-C", &repo.to_string_lossy(), "for-each-ref"])
        .output()
        .expect("run git");
    assert_eq!(String::from_utf8_lossy(&refs.stdout), "");
}

/// `--fresh` deletes a store, even a damaged one, but a `--store` that is not one (a file of
/// the user's named by mistake, a directory) is refused before anything is deleted.
#[test]
fn fresh_never_deletes_what_is_not_a_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let precious = dir.path().join("precious.txt");
    std::fs::write(&precious, "precious\n").expect("write");
    let store = |path: &Path| vec!["--store".into(), path.as_os_str().to_owned()];

    // Without --fresh, it is not opened as a store, and the work directory made for it is
    // removed.
    let output = deliver(dir.path(), &store(&precious));
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: cannot open store {}: the file does not start with redb's magic number: \
             it is not a loops store (another kind of file), or its first bytes were \
             overwritten (a backup restores it)\n",
            precious.display()
        )
    );
    assert_eq!(names_in(dir.path()), ["precious.txt"]);
    // So are the missing parents it was made in.
    let mut args = store(&precious);
    args.extend([
        "--workdir".into(),
        dir.path().join("a/b/work").into_os_string(),
    ]);
    let output = deliver(dir.path(), &args);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(names_in(dir.path()), ["precious.txt"]);
    // A work directory that existed stays.
    std::fs::create_dir(dir.path().join("work")).expect("a directory");
    let output = deliver(dir.path(), &store(&precious));
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(dir.path().join("work/.loops-deliver-workdir").exists());

    let mut args = store(&precious);
    args.push("--fresh".into());
    let output = deliver(dir.path(), &args);
    assert_refused(
        &output,
        &format!(
            "error: --fresh: --store {} does not start with redb's header, not a loops store; \
             nothing was deleted (move it away, or name another --store)\n",
            precious.display()
        ),
        dir.path(),
        &["precious.txt", "work"],
    );
    assert_eq!(
        std::fs::read_to_string(&precious).expect("read"),
        "precious\n"
    );
    assert!(dir.path().join("work/.loops-deliver-workdir").exists());

    // Shorter than the header, or empty: not a store either.
    for (name, text) in [("short", "redb"), ("empty", "")] {
        let file = dir.path().join(name);
        std::fs::write(&file, text).expect("write");
        let mut args = store(&file);
        args.push("--fresh".into());
        let output = deliver(dir.path(), &args);
        assert!(
            output.status.code() == Some(1)
                && String::from_utf8_lossy(&output.stderr)
                    .contains("does not start with redb's header"),
            "{}",
            describe(&output)
        );
        assert_eq!(std::fs::read_to_string(&file).expect("read"), text);
        std::fs::remove_file(&file).expect("remove");
    }

    let stores = dir.path().join("stores");
    std::fs::create_dir(&stores).expect("a directory");
    std::fs::write(stores.join("a.redb"), "mine\n").expect("write");
    let mut args = store(&stores);
    args.push("--fresh".into());
    let output = deliver(dir.path(), &args);
    assert_refused(
        &output,
        &format!(
            "error: --fresh: --store {} is a directory, not a loops store; nothing was deleted \
             (move it away, or name another --store)\n",
            stores.display()
        ),
        dir.path(),
        &["precious.txt", "stores", "work"],
    );
    assert_eq!(
        std::fs::read_to_string(stores.join("a.redb")).expect("read"),
        "mine\n"
    );
    assert!(dir.path().join("work/.loops-deliver-workdir").exists());

    // Another application's redb database starts as a store does: refused by its tables,
    // and not one byte of it changes.
    let foreign = dir.path().join("users.redb");
    {
        let db = redb::Database::create(&foreign).expect("a redb file");
        let txn = db.begin_write().expect("a write");
        let users: redb::TableDefinition<u64, &str> = redb::TableDefinition::new("users");
        txn.open_table(users)
            .expect("a table")
            .insert(1, "ada")
            .expect("a row");
        txn.commit().expect("commit");
    }
    let bytes = std::fs::read(&foreign).expect("read");
    let mut args = store(&foreign);
    args.push("--fresh".into());
    let output = deliver(dir.path(), &args);
    assert_refused(
        &output,
        &format!(
            "error: --fresh: cannot open store {}: not a loops store: a redb database of another \
             application (its tables: users); nothing was deleted (move it away, or name another \
             --store)\n",
            foreign.display()
        ),
        dir.path(),
        &["precious.txt", "stores", "users.redb", "work"],
    );
    assert!(std::fs::read(&foreign).expect("read") == bytes);

    // A store file named with a `/` after it.
    let mut slashed = foreign.clone().into_os_string();
    slashed.push("/");
    let mut args = store(Path::new(&slashed));
    args.push("--fresh".into());
    let output = deliver(dir.path(), &args);
    assert_refused(
        &output,
        &format!(
            "error: --fresh: --store {}/ ends with `/`, which names a directory; a store is a \
             file: name it without the `/` (nothing was deleted)\n",
            foreign.display()
        ),
        dir.path(),
        &["precious.txt", "stores", "users.redb", "work"],
    );
    assert!(std::fs::read(&foreign).expect("read") == bytes);

    // A symbolic link, to nothing or to a store, is not deleted (nor replaced by a store).
    #[cfg(unix)]
    {
        let link = dir.path().join("link.redb");
        std::os::unix::fs::symlink(dir.path().join("nowhere.redb"), &link).expect("a link");
        let mut args = store(&link);
        args.push("--fresh".into());
        let output = deliver(dir.path(), &args);
        assert_refused(
            &output,
            &format!(
                "error: --fresh: --store {} is a symbolic link; --fresh deletes a store file \
                 itself: name the file it points to (nothing was deleted)\n",
                link.display()
            ),
            dir.path(),
            &["link.redb", "precious.txt", "stores", "users.redb", "work"],
        );
        assert!(std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()));
        std::fs::remove_file(&link).expect("remove the link");
        // A work directory given as a link is not replaced by a new one either.
        let link = dir.path().join("work-link");
        std::os::unix::fs::symlink(dir.path().join("work"), &link).expect("a link");
        let args: Vec<OsString> = vec!["--workdir".into(), link.clone().into(), "--fresh".into()];
        let output = deliver(dir.path(), &args);
        assert_refused(
            &output,
            &format!(
                "error: --fresh: --workdir {} is a symbolic link; --fresh deletes a work \
                 directory itself: name the directory it points to (nothing was deleted)\n",
                link.display()
            ),
            dir.path(),
            &["precious.txt", "stores", "users.redb", "work", "work-link"],
        );
        std::fs::remove_file(&link).expect("remove the link");
    }

    // A key file that cannot be read stops --fresh before it deletes the work directory.
    let missing = dir.path().join("no-such-keys");
    let args: Vec<OsString> = vec![
        "--fresh".into(),
        "--key-file".into(),
        missing.clone().into(),
    ];
    let output = deliver(dir.path(), &args);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).starts_with(&format!(
            "error: cannot read key file {}: ",
            missing.display()
        )),
        "{}",
        describe(&output)
    );
    assert!(dir.path().join("work/.loops-deliver-workdir").exists());
}

/// A store file with one byte flipped, where the flip makes redb panic as it opens the file:
/// the example says it cannot open the store, in one line, and prints no panic.
#[test]
fn a_damaged_store_is_one_clean_error_without_a_panic() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The store of a finished run.
    let good = std::fs::read(&reference().store_copy).expect("read the store");

    // The first page start (or, failing that, 64-byte step) whose flip makes redb panic.
    let damaged = dir.path().join("damaged.redb");
    let flip = |offset: usize, to: &Path| {
        let mut bytes = good.clone();
        bytes[offset] ^= 0xff;
        std::fs::write(to, bytes).expect("write the damaged copy");
    };
    let offset = (0..good.len())
        .step_by(4096)
        .chain((0..good.len()).step_by(64))
        .find(|&offset| {
            flip(offset, &damaged);
            std::panic::catch_unwind(|| redb::Builder::new().open_read_only(&damaged)).is_err()
        })
        .expect("a flipped byte that makes redb panic");

    // What loops says of that file (opened here in a copy: opening may repair it).
    let copy = dir.path().join("copy.redb");
    flip(offset, &copy);
    let err = loops::RedbStore::open(&copy).expect_err("a damaged store");
    assert!(err.is_store_damage(), "{err:?}");
    let mut said = format!("error: {err}");
    let mut source = std::error::Error::source(&err);
    while let Some(e) = source {
        said.push_str(&format!(": {e}"));
        source = e.source();
    }
    // Said once: "cannot open store <path>: why", not "cannot open the store: cannot open ...".
    assert!(
        said.starts_with(&format!("error: cannot open store {}: ", copy.display())),
        "{said}"
    );
    said = said.replace(&copy.display().to_string(), &damaged.display().to_string());

    let output = deliver(dir.path(), &["--store".into(), damaged.clone().into()]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "",
        "offset {offset}"
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "{said}; only as a last resort, --fresh starts over and discards the run recorded \
             in it (it deletes the file)\n"
        ),
        "offset {offset}"
    );

    // `--fresh` deletes it all the same (no process has it open), and starts over.
    let output = deliver(
        dir.path(),
        &["--store".into(), damaged.clone().into(), "--fresh".into()],
    );
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The cause alone, without the library's advice for a file that stays (a check, a backup).
    let advice = format!(
        "; the file is damaged (nothing was written to it): `loops --store {0} check` verifies \
         every page of it, and a backup restores it",
        damaged.display()
    );
    assert!(said.ends_with(&advice), "{said}");
    let deleting = said.strip_prefix("error: ").expect("the error's prefix");
    let deleting = deleting.strip_suffix(&advice).expect("the advice");
    assert_eq!(
        stdout.lines().next(),
        Some(format!("--fresh: {deleting}; deleting it all the same").as_str()),
        "{stdout}"
    );
    let done = format!(
        "pull request: forge://demo/pulls/1\n  stored in {}\n",
        dir.path().join("work/forge/pulls/1.json").display()
    );
    assert!(stdout.ends_with(&done), "{stdout}");
}

/// A store with bytes added to its end: the recovery route (a copy cut to whole pages) comes
/// first, and `--fresh`, which discards the recorded run, last, said as a last resort.
#[test]
fn a_damaged_stores_recovery_route_comes_before_fresh() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut bytes = std::fs::read(&reference().store_copy).expect("read the store");
    let whole = bytes.len();
    assert_eq!(whole % 4096, 0);
    bytes.extend_from_slice(b"abc");
    let appended = dir.path().join("appended.redb");
    std::fs::write(&appended, &bytes).expect("write the appended copy");
    let output = deliver(dir.path(), &["--store".into(), appended.clone().into()]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: cannot open store {path}: DB corrupted: the file's length ({len} bytes) is \
             not one redb lays out, nor a whole number of its 4096-byte pages: bytes were added \
             to its end, or it was cut short. A copy cut to {whole} bytes may open (`cp FILE \
             COPY && truncate -s {whole} COPY`, then `loops --store COPY check`); the file \
             itself is left as it is; the file is damaged (nothing was written to it): `loops \
             --store {path} check` verifies every page of it, and a backup restores it; only as \
             a last resort, --fresh starts over and discards the run recorded in it (it \
             deletes the file)\n",
            path = appended.display(),
            len = whole + 3,
        )
    );
    assert_eq!(std::fs::read(&appended).expect("read it again"), bytes);
}

/// The model's flags are checked before anything is made: a flag of `--model openai` with the
/// scripted model, and, by the build: without the `openai` feature, `--model openai` names
/// the feature to build with, before (and whatever) its other flags; with it, `--model
/// openai` without its required flags (a usage error, exit 2), an API key variable that is
/// not set and a base URL that is not HTTP.
#[test]
fn the_openai_model_flags_are_checked_before_anything_is_made() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = deliver(
        dir.path(),
        &["--base-url".into(), "http://127.0.0.1:9/v1".into()],
    );
    assert_refused(
        &output,
        "error: --base-url is for --model openai; the scripted model takes no settings\n",
        dir.path(),
        &[],
    );

    let output = deliver(dir.path(), &["--model".into(), "openai".into()]);
    // The missing feature is said first: no flag is asked for that this build cannot use.
    #[cfg(not(feature = "openai"))]
    assert_refused(
        &output,
        "error: --model openai needs the `openai` feature, which this build lacks: build with \
         it and run, `cargo run -p deliver --features openai -- --model openai --base-url URL \
         --model-name NAME ...`\n",
        dir.path(),
        &[],
    );
    #[cfg(feature = "openai")]
    {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.code() == Some(2)
                && output.stdout.is_empty()
                && stderr.starts_with(
                    "error: the following required arguments were not provided:\n  --base-url \
                     <URL>\n  --model-name <NAME>\n"
                ),
            "{}",
            describe(&output)
        );
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    let openai = |more: &[&str]| {
        let mut args: Vec<OsString> = [
            "--model",
            "openai",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model-name",
            "m",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        args.extend(more.iter().map(OsString::from));
        deliver(dir.path(), &args)
    };
    #[cfg(not(feature = "openai"))]
    assert_refused(
        &openai(&["--api-key-env", "LOOPS_DELIVER_TEST_NO_SUCH_VARIABLE"]),
        "error: --model openai needs the `openai` feature, which this build lacks: build with \
         it and run, `cargo run -p deliver --features openai -- --model openai --base-url URL \
         --model-name NAME ...`\n",
        dir.path(),
        &[],
    );
    #[cfg(feature = "openai")]
    {
        assert_refused(
            &openai(&["--api-key-env", "LOOPS_DELIVER_TEST_NO_SUCH_VARIABLE"]),
            "error: --api-key-env LOOPS_DELIVER_TEST_NO_SUCH_VARIABLE: the variable is not set\n",
            dir.path(),
            &[],
        );
        let mut args = vec![OsString::from("--base-url"), "ftp://h/v1".into()];
        args.extend(
            ["--model", "openai", "--model-name", "m"]
                .iter()
                .map(OsString::from),
        );
        assert_refused(
            &deliver(dir.path(), &args),
            "error: --base-url ftp://h/v1: not an http or https URL\n",
            dir.path(),
            &[],
        );
    }
}

/// A work directory in use by another `deliver` with another store is refused after the
/// lock's wait (here the test holds the work directory's lock), with nothing done in it.
/// A work directory's runs are recorded in one store: a new run of another store is refused
/// there (it would push its branch and file its pull request beside theirs, and a run id of
/// theirs would find their pull request as its own, its approval gate passed by another run),
/// before that store is made; so is `--fresh` with another store, which would delete their
/// work directory. A store that is gone records nothing: the next store takes the work
/// directory over (kept from two at once by the work directory's lock).
#[test]
fn a_work_directory_is_the_runs_of_one_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = deliver(dir.path(), &["--run-id".into(), "first".into()]);
    assert!(output.status.success(), "{}", describe(&output));
    let workdir = dir.path().join("work");
    let store = workdir.join("deliver.redb");
    let other = dir.path().join("other.redb");
    for fresh in [false, true] {
        let mut args: Vec<OsString> = vec!["--store".into(), other.clone().into()];
        if fresh {
            args.push("--fresh".into());
        }
        let wanted = if fresh {
            format!(
                "--fresh: work directory {} holds the runs of the store {}; --fresh with \
                 --store {} deletes their work directory (and a store inside it): pass --store \
                 {} to start over there, or name another --workdir (nothing was deleted)",
                workdir.display(),
                store.display(),
                other.display(),
                store.display()
            )
        } else {
            format!(
                "work directory {} holds the runs of the store {} (their remote branches and \
                 pull requests are there); run deliver-1 of --store {} would work beside them: \
                 pass --store {}, or name another --workdir (nothing was done)",
                workdir.display(),
                store.display(),
                other.display(),
                store.display()
            )
        };
        let output = deliver(dir.path(), &args);
        assert_refused(&output, &wanted, dir.path(), &["work"]);
    }
    // A run that exists in another store (a copy of the first) is refused too: it would
    // take the first store's pull request as its own.
    let copy = dir.path().join("copy.redb");
    std::fs::copy(&store, &copy).expect("copy the store");
    let output = deliver(
        dir.path(),
        &[
            "--store".into(),
            copy.clone().into(),
            "--run-id".into(),
            "first".into(),
        ],
    );
    let wanted = format!(
        "run first of --store {} would work beside them: pass --store {}",
        copy.display(),
        store.display()
    );
    assert_refused(&output, &wanted, dir.path(), &["copy.redb", "work"]);
    std::fs::remove_file(&copy).expect("remove the copy");
    // A binding with no store (emptied by hand) is damaged: refused, not taken as none.
    let binding = workdir.join(".loops-deliver-store");
    let kept = std::fs::read(&binding).expect("read the binding");
    std::fs::write(&binding, "\n").expect("empty the binding");
    let output = deliver(dir.path(), &["--store".into(), other.clone().into()]);
    let wanted = format!("{} is damaged (it names no store)", binding.display());
    assert_refused(&output, &wanted, dir.path(), &["work"]);
    std::fs::write(&binding, kept).expect("restore the binding");
    // The first store's run is there still, and goes on (reports its end).
    let output = deliver(dir.path(), &["--run-id".into(), "first".into()]);
    assert_pull_request_1(&output);

    // Gone (moved away), it records nothing here: another store takes the work directory,
    // once no other `deliver` works in it.
    std::fs::rename(&store, dir.path().join("moved.redb")).expect("move the store");
    let lock = std::fs::File::open(workdir.join(".loops-deliver-workdir.lock")).expect("lock file");
    lock.lock().expect("take the lock");
    let output = deliver(dir.path(), &["--store".into(), other.clone().into()]);
    assert!(
        output.status.code() == Some(1)
            && String::from_utf8_lossy(&output.stderr)
                == format!(
                    "error: work directory {} is in use by another `deliver`: wait for it to \
                     end, or name another --workdir\n",
                    workdir.display()
                ),
        "{}",
        describe(&output)
    );
    drop(lock);
    // A run of the store gone, new in this one, is refused: the remote has its branch, and
    // it would take that run's pull request as its own.
    let output = deliver(
        dir.path(),
        &[
            "--store".into(),
            other.clone().into(),
            "--run-id".into(),
            "first".into(),
        ],
    );
    let wanted = format!(
        "run first is not in the store {}, but the remote {} has its branch loops/first",
        other.display(),
        workdir.join("remote.git").display()
    );
    assert_refused(&output, &wanted, dir.path(), &["moved.redb", "work"]);
    let output = deliver(dir.path(), &["--store".into(), other.clone().into()]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success()
            && stdout.contains(&format!(
                "work directory {} recorded its runs in the store {}, which is gone: they are \
                 recorded in {} from now",
                workdir.display(),
                store.display(),
                other.display()
            ))
            && stdout.contains("pull request: forge://demo/pulls/2"),
        "{}",
        describe(&output)
    );
}

/// The binding names stores and work directories with their links resolved: a store named
/// through a link to its work directory is that directory's own, and stays bound when the
/// link goes. A copy of a work directory whose store was outside, restored elsewhere with a
/// store of its own, is bound to that one (its original's store works elsewhere), and says so.
#[test]
fn a_binding_names_stores_as_resolved_and_a_copy_takes_its_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| -> OsString { dir.path().join(name).into() };
    let workdir = dir.path().join("wg");
    std::fs::create_dir(&workdir).expect("make the work directory");
    std::os::unix::fs::symlink(&workdir, dir.path().join("wg-link")).expect("link to it");
    let linked = dir.path().join("wg-link/deliver.redb");
    let gated = deliver(
        dir.path(),
        &[
            "--workdir".into(),
            path("wg"),
            "--store".into(),
            linked.into(),
            "--auto-approve=false".into(),
        ],
    );
    assert!(gated.status.success(), "{}", describe(&gated));
    let real = workdir.canonicalize().expect("resolve");
    assert_eq!(
        std::fs::read_to_string(workdir.join(".loops-deliver-store")).expect("the binding"),
        format!("deliver.redb\n{}\n", real.display())
    );
    std::fs::remove_file(dir.path().join("wg-link")).expect("remove the link");
    let output = deliver(
        dir.path(),
        &[
            "--workdir".into(),
            path("wg"),
            "--store".into(),
            path("other.redb"),
        ],
    );
    let wanted = format!(
        "work directory {} holds the runs of the store {}",
        workdir.display(),
        workdir.join("deliver.redb").display()
    );
    assert_refused(&output, &wanted, dir.path(), &["wg"]);

    // A work directory whose store is outside, copied with its store (put inside the copy).
    let outside = dir.path().join("store-e.redb");
    let output = deliver(
        dir.path(),
        &[
            "--workdir".into(),
            path("we"),
            "--store".into(),
            outside.clone().into(),
        ],
    );
    assert!(output.status.success(), "{}", describe(&output));
    let copy = dir.path().join("we-copy");
    crate::common::copy_dir(&dir.path().join("we"), &copy);
    std::fs::copy(&outside, copy.join("deliver.redb")).expect("copy the store");
    let output = deliver(
        dir.path(),
        &[
            "--workdir".into(),
            path("we-copy"),
            "--run-id".into(),
            "second".into(),
        ],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success()
            && stdout.contains(&format!(
                "work directory {} is a copy of another, whose runs the store {} records: its \
                 own are recorded in {} from now",
                copy.display(),
                outside.canonicalize().expect("resolve").display(),
                copy.join("deliver.redb").display()
            ))
            && stdout.contains("pull request: forge://demo/pulls/2"),
        "{}",
        describe(&output)
    );
    // The original is its own store's still.
    let output = deliver(
        dir.path(),
        &[
            "--workdir".into(),
            path("we"),
            "--store".into(),
            copy.join("deliver.redb").into(),
        ],
    );
    let wanted = format!(
        "work directory {} holds the runs of the store {}",
        dir.path().join("we").display(),
        outside.canonicalize().expect("resolve").display()
    );
    assert!(
        output.status.code() == Some(1)
            && String::from_utf8_lossy(&output.stderr).contains(&wanted),
        "{}",
        describe(&output)
    );
}
