//! The `deliver` example on a repository of the user's (`--repo`): it never changes the
//! checkout (work tree, index, HEAD), refuses to start a new run from a work tree with
//! uncommitted changes or a detached HEAD, and runs again and again with other run ids.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::{HOLD_VAR, STOP_VAR, describe, example, git, names_in, user_repo};

/// Runs the example on the work directory `workdir` and the repository `repo`, with `args`,
/// without test hooks.
fn deliver(workdir: &Path, repo: &Path, args: &[&str]) -> Output {
    Command::new(example())
        .arg("--workdir")
        .arg(workdir)
        .arg("--repo")
        .arg(repo)
        .args(args)
        .env_remove(HOLD_VAR)
        .env_remove(STOP_VAR)
        .env_remove("RUST_LOG")
        .output()
        .expect("run the example")
}

/// What the checkout looks like: HEAD, the index's and the work tree's state, and the text of
/// the files the user and the agent care about.
fn checkout(repo: &Path) -> (String, String, String, String) {
    (
        git(repo, &["rev-parse", "--symbolic-full-name", "HEAD"])
            + &git(repo, &["rev-parse", "HEAD"]),
        git(repo, &["status", "--porcelain=v1"]),
        std::fs::read_to_string(repo.join("Cargo.toml")).expect("read Cargo.toml"),
        std::fs::read_to_string(repo.join("src/lib.rs")).expect("read src/lib.rs"),
    )
}

/// The pull requests on the forge of `workdir`, by number.
fn pulls(workdir: &Path) -> Vec<String> {
    names_in(&workdir.join("forge/pulls"))
}

#[test]
fn a_given_repo_keeps_its_changes_and_its_branch_run_after_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let repo = user_repo(dir.path());
    let workdir = dir.path().join("work");
    let main = git(&repo, &["rev-parse", "main"]);

    // A tracked file changed, another file not yet tracked: a new run is refused.
    let mut cargo_toml = std::fs::read_to_string(repo.join("Cargo.toml")).expect("read");
    cargo_toml.push_str("# the user's edit\n");
    std::fs::write(repo.join("Cargo.toml"), &cargo_toml).expect("edit");
    std::fs::write(repo.join("notes.txt"), "mine\n").expect("write");
    let dirty = checkout(&repo);
    assert_eq!(dirty.1, " M Cargo.toml\n?? notes.txt\n");
    let output = deliver(&workdir, &repo, &[]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: --repo {} has uncommitted changes (M Cargo.toml); commit or stash them \
             first: a new run starts from the last commit of main\n",
            repo.display()
        )
    );
    assert_eq!(checkout(&repo), dirty);
    assert_eq!(git(&repo, &["branch", "--list", "loops/*"]), "");

    // Stashed, the run goes through; popped, the changes are back as they were.
    git(&repo, &["stash", "--quiet"]);
    let clean = checkout(&repo);
    let output = deliver(&workdir, &repo, &[]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(checkout(&repo), clean, "the run changed the checkout");
    git(&repo, &["stash", "pop", "--quiet"]);
    assert_eq!(checkout(&repo), dirty);
    assert_eq!(pulls(&workdir), ["1.json"]);
    // The agent's two commits are on its branch, on top of main, which did not move.
    assert_eq!(git(&repo, &["rev-parse", "main"]), main);
    assert_eq!(
        git(&repo, &["rev-list", "--count", "main..loops/deliver-1"]),
        "2\n"
    );

    // The run exists: with the changes back, running it again reports it.
    let output = deliver(&workdir, &repo, &[]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout)
            .contains("run deliver-1 completed already at PrOpened (seq 7)"),
        "{}",
        describe(&output)
    );
    assert_eq!(checkout(&repo), dirty);

    // Another run id, from a clean work tree again: a second pull request.
    git(&repo, &["stash", "--quiet"]);
    let output = deliver(&workdir, &repo, &["--run-id", "deliver-2"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(
        checkout(&repo),
        clean,
        "the second run changed the checkout"
    );
    git(&repo, &["stash", "pop", "--quiet"]);
    assert_eq!(pulls(&workdir), ["1.json", "2.json"]);

    // A detached HEAD (as earlier versions of this example left it): a new run is refused,
    // and HEAD stays where it is.
    git(&repo, &["stash", "--quiet"]);
    git(&repo, &["checkout", "--quiet", "--detach"]);
    let detached = checkout(&repo);
    let output = deliver(&workdir, &repo, &["--run-id", "deliver-3"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: HEAD of --repo {} is detached (earlier versions of this example left it so \
             after testing); a new run starts from the branch pull requests should target: \
             check it out (`git checkout <branch>`)\n",
            repo.display()
        )
    );
    assert_eq!(checkout(&repo), detached);
    assert_eq!(pulls(&workdir), ["1.json", "2.json"]);
}

/// Runs the example on the work directory `workdir` with `args` only (no `--repo` unless
/// they name one), stopping at seq `stop_at` if given.
fn deliver_without_repo(workdir: &Path, args: &[&str], stop_at: Option<u64>) -> Output {
    let mut cmd = Command::new(example());
    cmd.arg("--workdir")
        .arg(workdir)
        .args(args)
        .env_remove(HOLD_VAR)
        .env_remove(STOP_VAR)
        .env_remove("RUST_LOG");
    if let Some(seq) = stop_at {
        cmd.env(STOP_VAR, seq.to_string());
    }
    cmd.output().expect("run the example")
}

/// A run remembers the repository it works on: resumed without `--repo` it goes on there
/// (and says so), with another `--repo` it is refused naming both; so is another work
/// directory. A start refused before its run began binds nothing.
#[test]
fn a_run_remembers_its_repo() {
    let dir = tempfile::tempdir().expect("temp dir");
    let repo = user_repo(dir.path());
    let workdir = dir.path().join("work");
    let main = git(&repo, &["rev-parse", "main"]);

    // Recorded, then refused before the run starts: a repository with no commits.
    let empty = dir.path().join("empty");
    git(dir.path(), &["init", "--quiet", &empty.to_string_lossy()]);
    let output = deliver(&workdir, &empty, &[]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("has no commits on its branch"),
        "{}",
        describe(&output)
    );

    // The run starts on `repo`, and waits for approval.
    let output = deliver(&workdir, &repo, &["--auto-approve=false"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("waiting for approval"),
        "{}",
        describe(&output)
    );

    // Another repository is refused, naming both; nothing changes.
    let other = dir.path().join("other");
    git(
        dir.path(),
        &["clone", "--quiet", "user", &other.to_string_lossy()],
    );
    let output = deliver(&workdir, &other, &["--approve"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: run deliver-1 works on the repository {}; --repo {} is another: leave \
             --repo out to go on with it, or use another --run-id\n",
            repo.display(),
            other.display()
        )
    );
    assert_eq!(git(&other, &["branch", "--list", "loops/*"]), "");

    // Without --repo: the recorded one, said so.
    let output = deliver_without_repo(&workdir, &["--approve"], None);
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!(
            "run id: deliver-1\nrepo:   {} (recorded for this run)\n",
            repo.display()
        )),
        "{}",
        describe(&output)
    );
    assert!(
        stdout.ends_with(&format!(
            "pull request: forge://demo/pulls/1\n  stored in {}\n",
            workdir.join("forge/pulls/1.json").display()
        )),
        "{}",
        describe(&output)
    );
    assert_eq!(pulls(&workdir), ["1.json"]);
    assert_eq!(git(&repo, &["rev-parse", "main"]), main);
    assert_eq!(
        git(&repo, &["rev-list", "--count", "main..loops/deliver-1"]),
        "2\n"
    );
    // The same --repo again is the same repository: the run is reported.
    let output = deliver(&workdir, &repo, &[]);
    assert!(output.status.success(), "{}", describe(&output));

    // A run on the demo's repository refuses a --repo too.
    let output = deliver_without_repo(&workdir, &["--run-id", "demo-1"], Some(0));
    assert!(output.status.success(), "{}", describe(&output));
    // A refused run leaves the store's bytes as they were: it is checked on the store opened
    // read-only (a writable open's close makes redb rewrite part of the file).
    let store_file = workdir.join("deliver.redb");
    let bytes = || std::fs::read(&store_file).expect("the store");
    let before = bytes();
    let output = deliver(&workdir, &repo, &["--run-id", "demo-1"]);
    assert!(bytes() == before, "a refused start changed the store");
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: run demo-1 works on the demo's repository {}; --repo {} is another: leave \
             --repo out to go on with it, or use another --run-id\n",
            workdir.join("repo").display(),
            repo.display()
        )
    );
    // Naming the demo's repository itself is no other repository: the run goes on there.
    let output = deliver(&workdir, &workdir.join("repo"), &["--run-id", "demo-1"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("pull request: forge://demo/pulls/2"),
        "{}",
        describe(&output)
    );

    // Its work directory is recorded too: the store under another one is refused, naming
    // both, and nothing is made there.
    let elsewhere = dir.path().join("elsewhere");
    let store = workdir.join("deliver.redb");
    let store = ["--store", store.to_str().expect("a UTF-8 path")];
    let before = bytes();
    let output = deliver_without_repo(&elsewhere, &store, None);
    assert!(bytes() == before, "a refused start changed the store");
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: run deliver-1 works in the work directory it started in, {} (its remote \
             and forge are there); --workdir {} is another: pass --workdir {} (or a copy of \
             it), or use another --run-id\n",
            workdir.display(),
            elsewhere.display(),
            workdir.display()
        )
    );
    assert!(!elsewhere.exists(), "{}", describe(&output));
    assert_eq!(pulls(&workdir), ["1.json", "2.json"]);
    // A copy of the work directory (a backup restored elsewhere) is the same one.
    let copy = dir.path().join("copy");
    copy_dir(&workdir, &copy);
    let output = deliver_without_repo(&copy, &[], None);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).ends_with(&format!(
            "pull request: forge://demo/pulls/1\n  stored in {}\n",
            copy.join("forge/pulls/1.json").display()
        )),
        "{}",
        describe(&output)
    );
    // A marker edited in place is named as such, with the id to write back.
    let marker = workdir.join(".loops-deliver-workdir");
    let id = std::fs::read_to_string(&marker).expect("the marker");
    std::fs::write(&marker, "0000").expect("edit the marker");
    let before = bytes();
    let output = deliver_without_repo(&workdir, &[], None);
    assert!(bytes() == before, "a refused start changed the store");
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: run deliver-1 started in this work directory, {}, but its marker {} holds \
             the id 0000 instead of the id the run recorded, {id} (the file was edited or \
             replaced): write {id} back into it to go on\n",
            workdir.display(),
            marker.display()
        )
    );
    std::fs::write(&marker, &id).expect("restore the marker");
    let output = deliver_without_repo(&workdir, &[], None);
    assert!(output.status.success(), "{}", describe(&output));
}

/// A copy of the work directory made before a run made its commits has the run's id but not
/// its commits: the run is refused there (its push would fail), and goes on in its own.
#[test]
fn a_stale_copy_of_the_work_directory_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = dir.path().join("work");
    // The run starts and stops at its first state, before any commit; the copy is made then.
    let output = deliver_without_repo(&workdir, &["--auto-approve=false"], Some(0));
    assert!(output.status.success(), "{}", describe(&output));
    let copy = dir.path().join("copy");
    copy_dir(&workdir, &copy);
    // Without its store: a copy with one of its own is bound to it, and refuses another.
    std::fs::remove_file(copy.join("deliver.redb")).expect("remove the copy's store");
    let output = deliver_without_repo(&workdir, &[], None);
    assert!(output.status.success(), "{}", describe(&output));
    let head = git(&workdir.join("repo"), &["rev-parse", "loops/deliver-1"]);

    let store = workdir.join("deliver.redb");
    let args = [
        "--store",
        store.to_str().expect("a UTF-8 path"),
        "--approve",
    ];
    let output = deliver_without_repo(&copy, &args, None);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: run deliver-1 made commit {}, which the repository {} lacks (is this work \
             directory a copy made before the run made it? go on in the work directory the run \
             made it in)\n",
            head.trim(),
            copy.join("repo").display()
        )
    );
    assert_eq!(pulls(&copy), Vec::<String>::new());
    let output = deliver_without_repo(&workdir, &["--approve"], None);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(pulls(&workdir), ["1.json"]);
}

/// A copy of the work directory made before the run pushed has its commits but not its
/// pushed branch: the run is refused there (its pull request could not be opened).
#[test]
fn a_copy_made_before_the_push_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = dir.path().join("work");
    // Stopped as it enters `Reviewed` (seq 6), where it pushes once approved.
    let output = deliver_without_repo(&workdir, &["--auto-approve=false"], Some(6));
    assert!(output.status.success(), "{}", describe(&output));
    let copy = dir.path().join("copy");
    copy_dir(&workdir, &copy);
    // Without its store: a copy with one of its own is bound to it, and refuses another.
    std::fs::remove_file(copy.join("deliver.redb")).expect("remove the copy's store");
    let output = deliver_without_repo(&workdir, &["--approve"], None);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(pulls(&workdir), ["1.json"]);

    let store = workdir.join("deliver.redb");
    let output = deliver_without_repo(&copy, &["--store", store.to_str().expect("UTF-8")], None);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: run deliver-1 pushed its branch loops/deliver-1, which the remote {} lacks \
             (is this work directory a copy made before the run pushed?): go on in the work \
             directory the run pushed from\n",
            copy.join("remote.git").display()
        )
    );
    assert_eq!(pulls(&copy), Vec::<String>::new());
}

/// A run whose remote or demo repository was moved away is refused (a new one would lack
/// what the run pushed and started from, or its commits), with nothing made in its place; put
/// back, the run goes on to its one pull request. A run that has ended is reported without
/// either (helper-118, helper-119).
#[test]
fn a_run_whose_remote_or_repo_is_gone_is_refused_until_it_has_ended() {
    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = dir.path().join("work");
    // Stopped as it enters `Edited` (seq 2), before it pushes.
    let output = deliver_without_repo(&workdir, &[], Some(2));
    assert!(output.status.success(), "{}", describe(&output));
    for (name, what, lacks) in [
        (
            "remote.git",
            "remote",
            "what the run pushed and started from",
        ),
        ("repo", "repository", "the run's commits"),
    ] {
        let place = workdir.join(name);
        let aside = dir.path().join(format!("{name}-aside"));
        std::fs::rename(&place, &aside).expect("move it away");
        let output = deliver_without_repo(&workdir, &[], None);
        assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
        assert_eq!(
            String::from_utf8_lossy(&output.stderr),
            format!(
                "error: the {what} {} is gone (moved or deleted since the run of branch \
                 loops/deliver-1 made it); a new one would lack {lacks}: put it back, or start \
                 over with --fresh or another --run-id\n",
                place.display()
            )
        );
        assert!(!place.exists(), "no {what} made in its place");
        assert_eq!(pulls(&workdir), Vec::<String>::new());
        std::fs::rename(&aside, &place).expect("put it back");
    }

    let output = deliver_without_repo(&workdir, &[], None);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(pulls(&workdir), ["1.json"]);
    let remote = workdir.join("remote.git");
    let pushed = git(&remote, &["rev-parse", "refs/heads/loops/deliver-1"]);
    assert!(!pushed.trim().is_empty(), "the branch is on the remote");

    // Ended, the run is reported without its repository and remote, and neither is made.
    for name in ["remote.git", "repo"] {
        std::fs::rename(workdir.join(name), dir.path().join(name)).expect("move it away");
    }
    let output = deliver_without_repo(&workdir, &[], None);
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("pull request: forge://demo/pulls/1\n"),
        "{stdout}"
    );
    assert!(
        !remote.exists() && !workdir.join("repo").exists(),
        "{stdout}"
    );
    assert_eq!(pulls(&workdir), ["1.json"]);
}

/// A run whose repository moved goes on where `--repo` names its new place (which holds the
/// run's commits); without `--repo` the refusal says how.
#[test]
fn a_run_follows_its_moved_repo_where_repo_names_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let repo = user_repo(dir.path());
    let workdir = dir.path().join("work");
    let output = deliver(&workdir, &repo, &["--auto-approve=false"]);
    assert!(output.status.success(), "{}", describe(&output));
    let moved = dir.path().join("moved");
    std::fs::rename(&repo, &moved).expect("move the repository");

    let output = deliver_without_repo(&workdir, &["--approve"], None);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).starts_with(
            "error: run deliver-1 works on the repository recorded for it (moved? name its new \
             place with --repo): "
        ),
        "{}",
        describe(&output)
    );
    let output = deliver(&workdir, &moved, &["--approve"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains(&format!(
            "repo:   {} (given with --repo; the run's repository {} is gone)\n",
            moved.display(),
            repo.display()
        )),
        "{}",
        describe(&output)
    );
    assert_eq!(pulls(&workdir), ["1.json"]);
    assert_eq!(
        git(&moved, &["rev-list", "--count", "main..loops/deliver-1"]),
        "2\n"
    );
}

/// Copies the directory `from` to `to` as `cp -a` does (a backup restored elsewhere).
fn copy_dir(from: &Path, to: &Path) {
    let copied = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("run cp");
    assert!(
        copied.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}
