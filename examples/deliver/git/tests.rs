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

/// The warnings this program's code logs on the thread that set it as the default, each its
/// message and then its fields (` name=value`), but for `error`: git's own message, which
/// differs between versions of git.
#[cfg(target_os = "linux")]
#[derive(Clone, Default)]
struct Warnings(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

#[cfg(target_os = "linux")]
impl Warnings {
    fn said(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

#[cfg(target_os = "linux")]
impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        #[derive(Default)]
        struct Said(String, String);
        impl tracing::field::Visit for Said {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                match field.name() {
                    "message" => self.0 = format!("{value:?}"),
                    "error" => {}
                    name => self.1.push_str(&format!(" {name}={value:?}")),
                }
            }
        }
        let meta = event.metadata();
        if *meta.level() == tracing::Level::WARN && meta.target().starts_with("deliver") {
            let mut said = Said::default();
            event.record(&mut said);
            self.0.lock().unwrap().push(said.0 + &said.1);
        }
    }
}

/// `git cat-file --batch` in `dir`, its input held open: a git that works in the repository
/// and takes no lock (as an editor's does), until it is killed.
#[cfg(target_os = "linux")]
fn reader_in(dir: &Path) -> std::process::Child {
    let child = std::process::Command::new("git")
        .args(["cat-file", "--batch"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    locks::tests::named(child, "git")
}

/// Makes the lock file `lock`, a minute old: not one a git has just taken.
#[cfg(target_os = "linux")]
fn take_old_lock(lock: &Path) {
    std::fs::write(lock, "").unwrap();
    let file = std::fs::File::options().write(true).open(lock).unwrap();
    file.set_modified(std::time::SystemTime::now() - Duration::from_secs(60))
        .unwrap();
}

/// Kills `holder` (and first removes `lock`, if given: the lock it held goes with it) once
/// `warnings` say that a command waits for it, and half a second more, in a thread.
#[cfg(target_os = "linux")]
fn end_when_waited_for(
    mut holder: std::process::Child,
    warnings: Warnings,
    lock: Option<PathBuf>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        // At most a minute: the test then fails on its warnings, not by hanging.
        for _ in 0..600 {
            if warnings.said().iter().any(|w| w.contains(" may hold (")) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(500));
        if let Some(lock) = lock {
            std::fs::remove_file(lock).unwrap();
        }
        holder.kill().unwrap();
        holder.wait().unwrap();
    })
}

/// What [`Git::output`] says while `what` waits for `lock`, which `holder`, a reader in
/// `dir`, may hold: that the lock is taken (1 s of waiting before the check), then the wait
/// for the holder (`held` s in all).
#[cfg(target_os = "linux")]
fn said_while_held(what: &str, lock: &Path, holder: u32, dir: &Path, held: u64) -> Vec<String> {
    vec![
        format!("`{what}` found a git lock file taken; trying again for up to 1 s"),
        format!(
            "`{what}` waits for a git lock file that git process {holder} (`git cat-file \
             --batch`, in {}) may hold (it works in the lock's repository); trying again until \
             that process ends, for up to {held} s in all lock={}",
            dir.display(),
            lock.display()
        ),
    ]
}

/// A lock kept because a live git works in the repository is waited for, not failed on: the
/// wait is said once, naming the process and the lock, and when the process ends the command
/// succeeds, whether the lock went with it or was left behind (then removed, as one a git
/// killed outright leaves).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_lock_a_live_git_may_hold_is_waited_for_until_it_ends() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let git = repo_with_file(&root)
        .await
        .with_lock_waits(Duration::from_secs(1), Duration::from_secs(60));
    let what = "git update-ref refs/heads/side HEAD";
    let lock = root.join(".git/refs/heads/side.lock");
    for left_behind in [false, true] {
        take_old_lock(&lock);
        let holder = reader_in(&root);
        let pid = holder.id();
        let warnings = Warnings::default();
        let subscriber = tracing_subscriber::registry().with(warnings.clone());
        let _default = tracing::subscriber::set_default(subscriber);
        let ender = end_when_waited_for(
            holder,
            warnings.clone(),
            (!left_behind).then(|| lock.clone()),
        );
        let done = git.run(&["update-ref", "refs/heads/side", "HEAD"]).await;
        ender.join().unwrap();
        done.unwrap();
        let mut expected = said_while_held(what, &lock, pid, &root, 60);
        if left_behind {
            expected.push(format!(
                "removed a git lock file no running git holds (a git process killed outright \
                 left it behind); trying `{what}` again lock={}",
                lock.display()
            ));
        }
        assert_eq!(warnings.said(), expected, "left behind: {left_behind}");
        assert!(!lock.exists());
        assert_eq!(
            git.rev_parse("side").await.unwrap(),
            git.rev_parse("HEAD").await.unwrap()
        );
    }
}

/// A live git that works in the repository for longer than the wait's bound (an editor's
/// reader, which never ends on its own) fails the command with an error that names the lock
/// and the process, and says what to do; the lock stays.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_lock_held_past_the_bound_fails_naming_the_holder() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let git = repo_with_file(&root)
        .await
        .with_lock_waits(Duration::from_secs(1), Duration::from_secs(2));
    let lock = root.join(".git/refs/heads/side.lock");
    take_old_lock(&lock);
    let mut holder = reader_in(&root);
    let warnings = Warnings::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let began = Instant::now();
    let failed = git.run(&["update-ref", "refs/heads/side", "HEAD"]).await;
    let waited = began.elapsed();
    holder.kill().unwrap();
    holder.wait().unwrap();
    let what = "git update-ref refs/heads/side HEAD";
    assert_eq!(
        failed.unwrap_err().to_string(),
        format!(
            "`{what}` in {root}: the git lock file {lock} is still taken after 2 s, and git \
             process {pid} (`git cat-file --batch`, in {root}) works in its repository and may \
             hold it: end that process, or remove {lock} if no git holds it (a git killed \
             outright left it behind)",
            root = root.display(),
            lock = lock.display(),
            pid = holder.id()
        )
    );
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
    assert_eq!(
        warnings.said(),
        said_while_held(what, &lock, holder.id(), &root, 2)
    );
    assert!(lock.exists());
}
