//! What the end-to-end tests share: the two binaries, the child-process helpers, and the
//! fixtures built once per test process (a demo work directory stopped before its first
//! state, a run parked at the approval gate, the reference run) that tests copy instead of
//! running the example again, where they do not need a fresh one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Looks at `ready` every `every` of real time until it returns `Some`, for at most `limit`
/// (`None` then): the one polling loop of the tests that watch a child process (its exit, a
/// file, a fake server's requests). Tests in this process wait with the test kit instead
/// (`Runtime::wait_until`, `wait_for_status`).
pub fn poll<T>(
    limit: Duration,
    every: Duration,
    mut ready: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = ready() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// The `deliver` binary, built by cargo for this test target (with this build's features).
pub fn example() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_deliver"))
}

/// The `loops` binary of the `loops-cli` package, built once per test process.
pub fn loops_bin() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        cargo_build(&["-p", "loops-cli", "--bin", "loops"])
            .join(format!("loops{}", std::env::consts::EXE_SUFFIX))
    })
}

/// `loops --store STORE ARGS`, colour off: its output, whatever its exit status.
pub fn loops(store: &Path, args: &[&str]) -> Output {
    Command::new(loops_bin())
        .arg("--store")
        .arg(store)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run loops")
}

/// The ids of the runs in `store`, as `loops runs --json` lists them.
pub fn run_ids(store: &Path) -> Vec<String> {
    let runs = loops_json(store, &["runs", "--json"]);
    runs.as_array()
        .expect("a list")
        .iter()
        .filter_map(|run| run["run_id"].as_str().map(str::to_owned))
        .collect()
}

/// `loops --store STORE ARGS`, which must succeed.
fn loops_ok(store: &Path, args: &[&str]) -> Output {
    let out = loops(store, args);
    assert!(out.status.success(), "loops {args:?}: {}", describe(&out));
    out
}

/// `loops --store STORE ARGS`, which must succeed: its standard output.
pub fn loops_text(store: &Path, args: &[&str]) -> String {
    String::from_utf8_lossy(&loops_ok(store, args).stdout).into_owned()
}

/// `loops --store STORE ARGS`, which must succeed: its standard output as JSON.
pub fn loops_json(store: &Path, args: &[&str]) -> serde_json::Value {
    serde_json::from_slice(&loops_ok(store, args).stdout).expect("JSON on stdout")
}

/// Runs `$CARGO build --quiet ARGS` in the profile of this test binary, and returns that
/// profile's directory (`target/<profile>`): a no-op when the build is up to date, and never
/// a stale binary when it is not.
pub fn cargo_build(args: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash> -> target/<profile>
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    let profile = profile_dir
        .file_name()
        .expect("profile directory")
        .to_string_lossy()
        .into_owned();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut build = Command::new(cargo);
    build.args(["build", "--quiet"]).args(args);
    if profile != "debug" {
        build.args(["--profile", &profile]);
    }
    let output = build.output().expect("run cargo build");
    assert!(
        output.status.success(),
        "cargo build {} failed:\n{}",
        args.join(" "),
        describe(&output)
    );
    profile_dir.to_path_buf()
}

/// A child's exit status and output, for assertion messages.
pub fn describe(output: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The test hooks' variables (see `deliver --help`).
pub const HOLD_VAR: &str = "LOOPS_DELIVER_HOLD_AT_SEQ";
pub const STOP_VAR: &str = "LOOPS_DELIVER_STOP_AT_SEQ";
pub const HOLD_IN_SETUP_VAR: &str = "LOOPS_DELIVER_HOLD_IN_SETUP";

/// The example's command on the work directory `workdir`, without test hooks or log settings
/// from outside, and with no standard input.
pub fn deliver_in(workdir: &Path) -> Command {
    let mut cmd = Command::new(example());
    cmd.arg("--workdir")
        .arg(workdir)
        .env_remove(HOLD_VAR)
        .env_remove(STOP_VAR)
        .env_remove(HOLD_IN_SETUP_VAR)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    cmd
}

/// Runs `git args...` in `dir` (as a fixed user) and returns its standard output.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "user")
        .env("GIT_AUTHOR_EMAIL", "user@example.invalid")
        .env("GIT_COMMITTER_NAME", "user")
        .env("GIT_COMMITTER_EMAIL", "user@example.invalid")
        .output()
        .expect("run git");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        describe(&output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// How many times each seq's state was entered, from the hook's log in `workdir`.
pub fn entries(workdir: &Path) -> BTreeMap<u64, usize> {
    let log = std::fs::read_to_string(workdir.join("handler-entries.log")).expect("entries log");
    let mut counts = BTreeMap::new();
    for line in log.lines() {
        let seq = line
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad entries line {line:?}"));
        *counts.entry(seq).or_insert(0) += 1;
    }
    counts
}

/// The names of the entries of the directory `dir`, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// A new temporary directory holding a copy of the work directory `template` (as
/// `work`): the directory (dropped at the end of the test), the copy and its store.
pub fn copy_of(template: &Path) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = dir.path().join("work");
    copy_dir(template, &workdir);
    let store = workdir.join("deliver.redb");
    (dir, workdir, store)
}

/// Copies the directory `from` to `to` (which must not exist), recursively: files, and
/// symbolic links as links.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display()))
    {
        let entry = entry.expect("a directory entry");
        let kind = entry.file_type().expect("a file type");
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        if kind.is_dir() {
            copy_dir(&source, &target);
        } else if kind.is_symlink() {
            let link = std::fs::read_link(&source).expect("read a link");
            #[cfg(unix)]
            std::os::unix::fs::symlink(&link, &target).expect("make a link");
            #[cfg(not(unix))]
            panic!("cannot copy the link {} here", link.display());
        } else {
            std::fs::copy(&source, &target)
                .unwrap_or_else(|e| panic!("copy {}: {e}", source.display()));
        }
    }
}

/// The directory of this test process's fixtures: `<CARGO_TARGET_TMPDIR>/end_to_end-<pid>`.
///
/// It outlives the process (statics are never dropped), so each process holds an exclusive
/// lock on a file in its own, and the first fixture of a process removes every other such
/// directory whose lock it can take: the leftovers of processes that have ended.
fn fixtures_dir() -> &'static Path {
    static DIR: OnceLock<(PathBuf, std::fs::File)> = OnceLock::new();
    let (dir, _lock) = DIR.get_or_init(|| {
        let parent = Path::new(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(parent).expect("create the fixtures' parent");
        for entry in std::fs::read_dir(parent)
            .expect("read the fixtures' parent")
            .flatten()
        {
            let name = entry.file_name();
            if !name.to_string_lossy().starts_with("end_to_end-") {
                continue;
            }
            let ended = std::fs::File::open(entry.path().join("lock"))
                .map_or(true, |file| file.try_lock().is_ok());
            if ended {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = parent.join(format!("end_to_end-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the fixtures directory");
        let lock = std::fs::File::create(dir.join("lock")).expect("create the lock file");
        lock.lock().expect("lock the fixtures directory");
        (dir, lock)
    });
    dir
}

/// The fixture `name`, made once per test process by `make` in a new directory (which it
/// receives) and then only read: tests copy what they change.
fn fixture(
    cell: &'static OnceLock<PathBuf>,
    name: &str,
    make: impl FnOnce(&Path),
) -> &'static Path {
    // One fixture at a time: `make` runs the example, and two at once would only compete.
    static MAKING: Mutex<()> = Mutex::new(());
    cell.get_or_init(|| {
        let _one = MAKING.lock().unwrap_or_else(PoisonError::into_inner);
        let dir = fixtures_dir().join(name);
        // What a panicking `make` left, for the next test to make again.
        let _ = std::fs::remove_dir_all(&dir);
        make(&dir);
        dir
    })
}

/// A work directory of the demo in which the run `deliver-1` was started and stopped at
/// once, before its first state did anything (the stop hook at seq 0): its repository, remote
/// and forge exist. Clone its `repo` for a repository of the user's; copy it for a run that
/// resumes at seq 0.
pub fn demo_at_start() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    fixture(&DIR, "demo-at-start", |dir| {
        let output = deliver_in(dir)
            .env(STOP_VAR, "0")
            .output()
            .expect("run the example");
        assert!(output.status.success(), "{}", describe(&output));
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("stopping at seq 0"),
            "{}",
            describe(&output)
        );
    })
}

/// A clone of the demo's repository at `dir/user`, on `main`.
pub fn user_repo(dir: &Path) -> PathBuf {
    let repo = dir.join("user");
    let demo = demo_at_start().join("repo");
    git(
        dir,
        &[
            "clone",
            "--quiet",
            &demo.to_string_lossy(),
            &repo.to_string_lossy(),
        ],
    );
    repo
}

/// A work directory in which the run `deliver-1` went as far as the approval gate (run with
/// `--auto-approve=false`) and parked there, waiting for an approval.
pub fn parked_at_the_gate() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    fixture(&DIR, "parked-at-the-gate", |dir| {
        let output = deliver_in(dir)
            .arg("--auto-approve=false")
            .output()
            .expect("run the example");
        assert!(output.status.success(), "{}", describe(&output));
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("waiting for approval"),
            "{}",
            describe(&output)
        );
    })
}

/// The reference run: `deliver-1` run to its end once, never killed.
pub struct Reference {
    /// Its work directory (read it; copy what you change).
    pub workdir: PathBuf,
    /// A copy of its store file, made as it ended, that nothing opens (copy it to open it).
    pub store_copy: PathBuf,
    /// How long it took.
    pub took: Duration,
}

/// The happy path the demo takes (version 2 of the workflow): one test still fails after the
/// planned edit; once they pass, the model reviews the change.
pub const EXPECTED_STATES: [&str; 8] = [
    "Received", "Planned", "Edited", "Tested", "Edited", "Tested", "Reviewed", "PrOpened",
];

/// The reference run, made once per test process, and what holds for it: the happy path,
/// completed, one pull request, two commits on the base, every state entered once.
pub fn reference() -> &'static Reference {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    static TOOK: OnceLock<Duration> = OnceLock::new();
    let workdir = fixture(&DIR, "reference", |dir| {
        let started = Instant::now();
        let output = deliver_in(dir).output().expect("run the example");
        TOOK.set(started.elapsed()).expect("made once");
        assert!(output.status.success(), "{}", describe(&output));
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("pull request: forge://demo/pulls/1"),
            "{}",
            describe(&output)
        );
        let counts = entries(dir);
        assert!(counts.values().all(|&n| n == 1), "{counts:?}");
        std::fs::copy(dir.join("deliver.redb"), dir.with_extension("redb"))
            .expect("copy the store");
    });
    static REFERENCE: OnceLock<Reference> = OnceLock::new();
    REFERENCE.get_or_init(|| Reference {
        workdir: workdir.to_path_buf(),
        store_copy: workdir.with_extension("redb"),
        took: *TOOK.get().expect("the reference's duration"),
    })
}

/// `name`'s path on `PATH`.
#[cfg(unix)]
pub fn on_path(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").expect("PATH");
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no {name} on PATH"))
}

/// Waits for `child`, its standard error piped, and returns how it exited and what it wrote
/// to its standard error.
pub fn exit_and_stderr(child: &mut std::process::Child) -> (std::process::ExitStatus, String) {
    use std::io::Read as _;
    let status = child.wait().expect("wait for the example");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    (status, stderr)
}
