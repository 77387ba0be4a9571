use super::*;

async fn repo_with_file(dir: &Path) -> Git {
    let git = Git::new(dir);
    git.run(&["init", "--quiet"]).await.unwrap();
    git.run(&["symbolic-ref", "HEAD", "refs/heads/main"])
        .await
        .unwrap();
    std::fs::write(dir.join("a.txt"), "one\ntwo\n").unwrap();
    git.run(&["add", "a.txt"]).await.unwrap();
    git.run(&["commit", "--quiet", "-m", "first"])
        .await
        .unwrap();
    git
}

fn change(find: &str, replace: &str) -> Change {
    Change {
        summary: "Edit a.txt".into(),
        edits: vec![Edit {
            path: "a.txt".into(),
            find: find.into(),
            replace: replace.into(),
        }],
    }
}

#[tokio::test]
async fn commits_are_deterministic_and_found_by_key() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let scratch = tempfile::tempdir().unwrap();
    let (git_a, git_b) = (
        repo_with_file(a.path()).await,
        repo_with_file(b.path()).await,
    );
    let base = git_a.rev_parse("HEAD").await.unwrap();
    assert_eq!(base, git_b.rev_parse("HEAD").await.unwrap());

    let c = change("two", "three");
    let first = git_a
        .commit_change("work", &base, &c, "body", "lk-1", scratch.path())
        .await
        .unwrap();
    assert!(first.created);
    let other = git_b
        .commit_change("work", &base, &c, "body", "lk-1", scratch.path())
        .await
        .unwrap();
    assert_eq!(
        first.commit.id, other.commit.id,
        "same input, same commit id"
    );
    let message = git_a
        .run(&["log", "-1", "--format=%B", "work"])
        .await
        .unwrap();
    assert_eq!(message, "Edit a.txt\n\nbody\n\nLoops-Idempotency-Key: lk-1");

    // Re-executing the step finds the commit instead of committing again.
    let again = git_a
        .commit_change("work", &base, &c, "body", "lk-1", scratch.path())
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.commit.id, first.commit.id);
    let count = git_a.run(&["rev-list", "--count", "work"]).await.unwrap();
    assert_eq!(count, "2");
    // Nothing is left in the scratch directory.
    assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
}

/// In a clone that has the run's commits on `origin/<branch>` only, they are found by
/// their keys and the local branch is made to point at them.
#[tokio::test]
async fn commits_found_on_a_remote_branch_get_the_local_branch() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let scratch = tempfile::tempdir().unwrap();
    let git_a = repo_with_file(a.path()).await;
    let base = git_a.rev_parse("HEAD").await.unwrap();
    let first = git_a
        .commit_change(
            "work",
            &base,
            &change("two", "three"),
            "b",
            "lk-5",
            scratch.path(),
        )
        .await
        .unwrap();
    let second = git_a
        .commit_change(
            "work",
            &first.commit.id,
            &change("one", "zero"),
            "b",
            "lk-6",
            scratch.path(),
        )
        .await
        .unwrap();
    let clone = b.path().join("clone");
    Git::new(b.path())
        .run(&["clone", "--quiet", &a.path().to_string_lossy(), "clone"])
        .await
        .unwrap();
    let git_b = Git::new(&clone);
    assert_eq!(git_b.resolve("refs/heads/work").await.unwrap(), None);

    let found = git_b
        .commit_change(
            "work",
            &base,
            &change("two", "three"),
            "b",
            "lk-5",
            scratch.path(),
        )
        .await
        .unwrap();
    assert_eq!(
        found,
        Committed {
            created: false,
            ..first.clone()
        }
    );
    assert_eq!(
        git_b.resolve("refs/heads/work").await.unwrap(),
        Some(first.commit.id.clone())
    );
    let found = git_b
        .commit_change(
            "work",
            &first.commit.id,
            &change("one", "zero"),
            "b",
            "lk-6",
            scratch.path(),
        )
        .await
        .unwrap();
    assert!(!found.created);
    assert_eq!(found.commit.id, second.commit.id);
    assert_eq!(
        git_b.resolve("refs/heads/work").await.unwrap(),
        Some(second.commit.id.clone())
    );

    // The same key on another parent is another run's, not taken for this step: the edit
    // is applied to this parent (where its text is gone).
    let other = git_b
        .commit_change(
            "elsewhere",
            &second.commit.id,
            &change("two", "three"),
            "b",
            "lk-5",
            scratch.path(),
        )
        .await;
    let err = other.unwrap_err();
    assert_eq!(
        err.to_string(),
        "edit of a.txt: the text to replace occurs 0 times, expected once: \"two\""
    );
}

/// The user's checkout (HEAD, index, work tree) is the same after a commit as before:
/// the edit is made to the parent's file, not to the work tree's.
#[tokio::test]
async fn committing_never_touches_the_checkout() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let git = repo_with_file(dir.path()).await;
    let base = git.rev_parse("HEAD").await.unwrap();
    // A staged new file and an unstaged change: the user's work in progress.
    std::fs::write(dir.path().join("b.txt"), "staged\n").unwrap();
    git.run(&["add", "b.txt"]).await.unwrap();
    std::fs::write(dir.path().join("a.txt"), "one\ntwo\nmine\n").unwrap();
    let state = || async {
        (
            git.run(&["symbolic-ref", "HEAD"]).await.unwrap(),
            git.run(&["status", "--porcelain=v1"]).await.unwrap(),
            git.run(&["diff", "--cached"]).await.unwrap(),
            std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        )
    };
    let before = state().await;
    assert_eq!(before.1, " M a.txt\nA  b.txt");

    let mut c = change("two", "three");
    c.edits.push(Edit {
        path: "a.txt".into(),
        find: "one".into(),
        replace: "zero".into(),
    });
    let done = git
        .commit_change("work", &base, &c, "b", "lk-2", scratch.path())
        .await
        .unwrap();
    assert!(done.created);
    assert_eq!(
        git.run(&["show", "work:a.txt"]).await.unwrap(),
        "zero\nthree"
    );
    assert_eq!(
        git.run(&["ls-tree", "--name-only", "work"]).await.unwrap(),
        "a.txt"
    );
    assert_eq!(state().await, before);
    assert_eq!(git.rev_parse("main").await.unwrap(), base);

    // The commit's files, exported where the tests build; then again over a half-written
    // export (a git killed outright, run again): its files are overwritten, not refused as
    // already there.
    let out = scratch.path().join("tree");
    for half_written in [false, true] {
        if half_written {
            std::fs::write(out.join("a.txt"), "half").unwrap();
        }
        git.export(&done.commit.id, &out, &scratch.path().join("index"))
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(out.join("a.txt")).unwrap(),
            "zero\nthree\n"
        );
    }
    assert_eq!(state().await, before);
}

/// A push whose `git-receive-pack` was killed (git's own messages, from a kill of it) is cut
/// short from outside; a refused push, or a success, is not.
#[cfg(unix)]
#[test]
fn a_push_whose_other_end_was_killed_is_told_from_a_refusal() {
    use std::os::unix::process::ExitStatusExt as _;
    let ended = |code: i32, stderr: &str| Output {
        status: std::process::ExitStatus::from_raw(code << 8),
        stdout: Vec::new(),
        stderr: stderr.as_bytes().to_vec(),
    };
    let killed = "Killed\nsend-pack: unexpected disconnect while reading sideband packet\n\
                  fatal: the remote end hung up unexpectedly\n";
    assert_eq!(
        cut_short(&ended(1, killed)),
        Some("its other end, which hung up")
    );
    let refused = " ! [rejected]        x -> x (non-fast-forward)\n\
                   error: failed to push some refs to '/w/remote.git'\n";
    assert_eq!(cut_short(&ended(1, refused)), None);
    assert_eq!(cut_short(&ended(0, killed)), None);
}

#[test]
fn messages_are_put_on_one_line() {
    assert_eq!(
        one_line(
            "fatal: invalid gitfile format: x\nfatal: Could not read from remote.\n\n\
             Please make sure\n  and the repository exists.\n"
        ),
        "fatal: invalid gitfile format: x; fatal: Could not read from remote. Please make \
         sure; and the repository exists."
    );
    assert_eq!(one_line(" one \n"), "one");
    assert_eq!(one_line(""), "");
}

/// A command that fails without a word (`--quiet`) is not reported with a bare colon.
#[tokio::test]
async fn a_silent_failure_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let git = repo_with_file(dir.path()).await;
    let err = git
        .run(&["rev-parse", "--verify", "--quiet", "nope"])
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "`git rev-parse --verify --quiet nope` in {} failed (exit status: 1) and said \
             nothing",
            dir.path().display()
        )
    );
    let err = git.run(&["frobnicate"]).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "`git frobnicate` in {} failed: git: 'frobnicate' is not a git command. See \
             'git --help'.",
            dir.path().display()
        )
    );
}

#[tokio::test]
async fn edits_must_match_once_name_a_file_and_stay_inside() {
    let edit = |find: &str| Edit {
        path: "a.txt".into(),
        find: find.into(),
        replace: "y".into(),
    };
    assert_eq!(apply_edit("x z\n", &edit("x")).unwrap(), "y z\n");
    let err = apply_edit("x x\n", &edit("x")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "edit of a.txt: the text to replace occurs 2 times, expected once: \"x\""
    );
    for path in ["../a.txt", "/a.txt", "", "./a.txt", "a/../b"] {
        let err = check_edit_path(path).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("edit path {path:?} is not a plain relative path inside the repository")
        );
    }
    check_edit_path("src/lib.rs").unwrap();

    let dir = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let git = repo_with_file(dir.path()).await;
    let base = git.rev_parse("HEAD").await.unwrap();
    let mut missing = change("x", "y");
    missing.edits[0].path = "b.txt".into();
    let err = git
        .commit_change("work", &base, &missing, "b", "lk-3", scratch.path())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "edit of b.txt: there is no such file at commit {}",
            &base[..7]
        )
    );
    let err = git
        .commit_change(
            "work",
            &base,
            &change("nope", "y"),
            "b",
            "lk-4",
            scratch.path(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "edit of a.txt: the text to replace occurs 0 times, expected once: \"nope\""
    );
    assert_eq!(git.resolve("refs/heads/work").await.unwrap(), None);
}
