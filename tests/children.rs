//! Child runs (`Context::start_child`, `join_all`, `join_first`, `join_child`) on the embedded
//! store, in one process: fan-out and fan-in with exact results, each child started and run
//! once, typed failures and cancellations, and the cancellation of a parent cascading to its
//! children in the order docs/design.md gives.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops::{
    ChildError, ChildOptions, ChildRun, Context, Error, OnParentCancel, RedbStore, RunStatus,
    Runtime, Workflow,
};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "leaf")]
#[event(go: u64)]
enum Leaf {
    #[initial]
    #[next(Squared)]
    Start { i: u64, mode: Mode },
    #[terminal]
    Squared { i: u64, square: u64 },
}

/// What a leaf does before it ends.
#[derive(loops::Schema, Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Squares at once.
    Now,
    /// Fails for good.
    Fail,
    /// Waits for the event `go` (parked).
    Wait,
    /// Runs a step that lasts until the run is cancelled; says `busy ID` on stdout first.
    Busy,
    /// Sleeps durably for a second (parked on a timer); says `sleeping ID` on stdout first.
    Sleep,
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "fan")]
enum Fan {
    #[initial]
    #[next(Summed)]
    Split {
        modes: Vec<Mode>,
        first: usize,
        abandon_last: bool,
    },
    #[terminal]
    Summed { lines: Vec<String> },
}

/// Counts each leaf's executions of its square step, by child id; with a ledger, also
/// appends a line `CHILD KEY` to that file for each (the crash tests' count, outside the
/// store and the process).
#[derive(Clone, Default)]
struct Counts(Arc<Mutex<BTreeMap<String, u32>>>, Option<PathBuf>);

impl Counts {
    fn get(&self) -> BTreeMap<String, u32> {
        self.0.lock().unwrap().clone()
    }
}

impl LeafHandler for Counts {
    type Error = Error;
    async fn start(&self, ctx: &Context, i: u64, mode: Mode) -> Result<StartNext, Error> {
        match mode {
            Mode::Now => {}
            Mode::Fail => return Err(Error::permanent(std::io::Error::other("leaf says no"))),
            Mode::Wait => {
                ctx.wait_for(Leaf::GO).await?;
            }
            Mode::Busy => {
                ctx.step("busy", || async {
                    println!("busy {}", ctx.run_id());
                    ctx.cancelled().await;
                    Ok(0u64)
                })
                .await?;
            }
            Mode::Sleep => {
                println!("sleeping {}", ctx.run_id());
                ctx.sleep(Duration::from_secs(1)).await?;
            }
        }
        let counts = self.clone();
        let id = ctx.run_id().to_owned();
        let square = ctx
            .step_keyed("square", |key| async move {
                if let Some(ledger) = &counts.1 {
                    let mut f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(ledger)
                        .unwrap();
                    // One write call: `writeln!` writes in pieces, and an abort of the
                    // process (the crash tests') between them left a torn line.
                    f.write_all(format!("{id} {key}\n").as_bytes()).unwrap();
                    f.sync_all().unwrap();
                }
                *counts.0.lock().unwrap().entry(id).or_default() += 1;
                Ok(i * i)
            })
            .await?;
        Ok(StartNext::Squared { i, square })
    }
}

struct Parent;

impl FanHandler for Parent {
    type Error = Error;
    async fn split(
        &self,
        ctx: &Context,
        modes: Vec<Mode>,
        first: usize,
        abandon_last: bool,
    ) -> Result<SplitNext, Error> {
        let mut children: Vec<ChildRun<Leaf>> = Vec::new();
        for (i, mode) in modes.iter().enumerate() {
            let id = format!("{}/{i}", ctx.run_id());
            let mut options = ChildOptions::default();
            if abandon_last && i + 1 == modes.len() {
                options = options.abandon();
            }
            let initial = Leaf::Start {
                i: i as u64,
                mode: *mode,
            };
            children.push(ctx.start_child_with(&id, initial, options).await?);
        }
        let joined = if first < modes.len() {
            ctx.join_first(first, &children).await?
        } else {
            ctx.join_all(&children)
                .await?
                .into_iter()
                .enumerate()
                .collect()
        };
        let lines = joined
            .into_iter()
            .map(|(index, result)| match result {
                Ok(Leaf::Squared { i, square }) => format!("{index}: {i}^2 = {square}"),
                Ok(other) => format!("{index}: {other:?}"),
                Err(ChildError::Failed { errors, .. }) => format!("{index}: failed: {errors:?}"),
                Err(ChildError::Cancelled { reason, .. }) => {
                    format!("{index}: cancelled: {reason}")
                }
                Err(other) => format!("{index}: {other}"),
            })
            .collect();
        Ok(SplitNext::Summed { lines })
    }
}

fn runtime(counts: &Counts) -> Runtime {
    Runtime::builder()
        .register::<Leaf, _>(counts.clone())
        .register::<Fan, _>(Parent)
        .register::<Pair, _>(Joiner)
        .build(RedbStore::in_memory().unwrap())
}

/// The row of `run_id` once it exists and has `status`.
async fn wait_status(rt: &Runtime, run_id: &str, status: RunStatus) -> loops::RunInfo {
    loop {
        if let Some(info) = rt.store().run_info(run_id).await.unwrap()
            && info.status == status
        {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_and_join_all_gives_each_childs_result_in_order() {
    let counts = Counts::default();
    let rt = runtime(&counts);
    let modes = vec![Mode::Now; 20];
    rt.start(
        "p",
        Fan::Split {
            modes,
            first: usize::MAX,
            abandon_last: false,
        },
    )
    .await
    .unwrap();
    let done: Fan = rt.wait("p").await.unwrap();
    let expected: Vec<String> = (0..20u64)
        .map(|i| format!("{i}: {i}^2 = {}", i * i))
        .collect();
    assert_eq!(done, Fan::Summed { lines: expected });
    // Each child ran its step once, and records the parent.
    let once: BTreeMap<String, u32> = (0..20).map(|i| (format!("p/{i}"), 1)).collect();
    assert_eq!(counts.get(), once);
    let children = rt.store().children("p").await.unwrap();
    assert_eq!(children.len(), 20);
    for child in &children {
        assert_eq!(child.status, RunStatus::Completed);
        // One attempt, and no failure: no false "interrupted" attempt before it.
        assert_eq!(
            (child.attempt, child.interrupted),
            (1, 0),
            "{}",
            child.run_id
        );
        assert_eq!(
            rt.store().failures(&child.run_id).await.unwrap(),
            Vec::new(),
            "{}",
            child.run_id
        );
        let parent = child.parent.as_ref().unwrap();
        assert_eq!(
            (parent.run_id.as_str(), parent.on_cancel),
            ("p", OnParentCancel::Cancel)
        );
    }
    // The start and the join are journaled: one start step per child, one join.
    let steps = rt.store().steps("p", 0).await.unwrap();
    let starts = steps
        .iter()
        .filter(|(n, _, _)| n.starts_with("loops:child:"))
        .count();
    let joins = steps.iter().filter(|(n, _, _)| n == "loops:join").count();
    assert_eq!((starts, joins), (20, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_child_is_a_typed_error_and_join_first_orders_by_end() {
    let counts = Counts::default();
    let rt = runtime(&counts);
    rt.start(
        "p",
        Fan::Split {
            modes: vec![Mode::Wait, Mode::Fail, Mode::Now],
            first: 2,
            abandon_last: false,
        },
    )
    .await
    .unwrap();
    let done: Fan = rt.wait("p").await.unwrap();
    let Fan::Summed { lines } = done else {
        panic!("not summed")
    };
    // Child 0 waits for ever; 1 fails and 2 squares, in either order of ending.
    let mut sorted = lines.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec![
            "1: failed: [\"permanent error, not retried\", \"leaf says no\"]".to_owned(),
            "2: 2^2 = 4".to_owned()
        ]
    );
    let ended: Vec<u64> = {
        let mut v = Vec::new();
        for id in ["p/1", "p/2"] {
            v.push(rt.store().run_info(id).await.unwrap().unwrap().updated_ms);
        }
        v
    };
    let first = if ended[0] <= ended[1] { "1" } else { "2" };
    assert!(lines[0].starts_with(first), "{lines:?} ended at {ended:?}");
    assert_eq!(
        rt.store().run_info("p/0").await.unwrap().unwrap().status,
        RunStatus::Waiting
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parent_cancels_its_waiting_and_running_children_but_not_an_abandoned_one() {
    let counts = Counts::default();
    let rt = runtime(&counts);
    rt.start(
        "p",
        Fan::Split {
            modes: vec![Mode::Wait, Mode::Busy, Mode::Wait],
            first: usize::MAX,
            abandon_last: true,
        },
    )
    .await
    .unwrap();
    // The parent parks in its join; child 0 and 2 park at their waits; 1 runs its step.
    wait_status(&rt, "p", RunStatus::Waiting).await;
    wait_status(&rt, "p/0", RunStatus::Waiting).await;
    wait_status(&rt, "p/2", RunStatus::Waiting).await;
    let busy = wait_status(&rt, "p/1", RunStatus::Running).await;
    assert_eq!(busy.cancel, None);
    // The waiting child ends in the cancel's commit; so does the parent, unless its
    // driver holds it at this moment (a child's end made it look at its children again):
    // then that driver ends it on the signal.
    let info = rt.cancel("p", "enough").await.unwrap();
    assert_eq!(info.cancel.as_deref(), Some("enough"));
    let waiting = rt.store().run_info("p/0").await.unwrap().unwrap();
    assert_eq!(
        (waiting.status, waiting.cancel.as_deref()),
        (RunStatus::Cancelled, Some("parent run `p` was cancelled"))
    );
    // The running child ends when its driver sees the request (its step is cancelled).
    let busy = wait_status(&rt, "p/1", RunStatus::Cancelled).await;
    assert_eq!(busy.cancel.as_deref(), Some("parent run `p` was cancelled"));
    // The abandoned child goes on, and ends on its own.
    let abandoned = rt.store().run_info("p/2").await.unwrap().unwrap();
    assert_eq!(
        (abandoned.status, abandoned.cancel),
        (RunStatus::Waiting, None)
    );
    rt.send("p/2", Leaf::GO, &1).await.unwrap();
    let leaf: Leaf = rt.wait("p/2").await.unwrap();
    assert_eq!(leaf, Leaf::Squared { i: 2, square: 4 });
    assert_eq!(
        counts.get(),
        BTreeMap::from([("p/2".to_owned(), 1)]),
        "only the abandoned child squared"
    );
    match rt.wait::<Fan>("p").await {
        Err(Error::RunCancelled { reason, .. }) => assert_eq!(reason, "enough"),
        other => panic!("expected the parent cancelled, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_id_taken_by_another_run_is_a_typed_error() {
    let counts = Counts::default();
    let rt = runtime(&counts);
    // A run that is not the parent's child holds the id of child 0.
    rt.start(
        "p/0",
        Leaf::Start {
            i: 9,
            mode: Mode::Wait,
        },
    )
    .await
    .unwrap();
    rt.start(
        "p",
        Fan::Split {
            modes: vec![Mode::Now],
            first: usize::MAX,
            abandon_last: false,
        },
    )
    .await
    .unwrap();
    // The conflict comes out the same at every try: the parent fails at its first attempt.
    rt.wait::<Fan>("p").await.unwrap_err();
    let info = rt.store().run_info("p").await.unwrap().unwrap();
    assert_eq!((info.status, info.attempt), (RunStatus::Failed, 1));
    assert_eq!(
        info.error.unwrap(),
        vec![
            "run `p` (state `Split`, seq 0) cannot start child `p/0`: a run without a parent has that id"
                .to_owned()
        ]
    );
}

/// The crash tests' child process: drives the parent `p` with `LOOPS_CHILDREN` children on
/// the store file in `LOOPS_DIR` (resuming whatever is there), prints `ended STATE` at the
/// end. With `LOOPS_ABORT=N before|after`, aborts the process (a real crash: only what
/// committed survives) before or after the `N`-th write the parent's driver makes (its own
/// writes and its children's creations; the children's drivers' writes are not counted).
/// With `LOOPS_MODE=sleep` (or `busy`), the children sleep durably (`Mode::Sleep`, or run a
/// step until cancelled: `Mode::Busy`) and the process drives only the parent, with
/// `Runtime::run` (no `resume_all`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the crash tests of this file as their child process"]
async fn child_process() {
    let dir = PathBuf::from(std::env::var("LOOPS_DIR").expect("LOOPS_DIR"));
    let n: usize = std::env::var("LOOPS_CHILDREN").unwrap().parse().unwrap();
    let abort = std::env::var("LOOPS_ABORT").ok().map(|v| {
        let (n, when) = v.split_once(' ').unwrap();
        (n.parse::<u64>().unwrap(), when == "after")
    });
    let done = match std::env::var("LOOPS_MODE").as_deref() {
        Ok("sleep") => run_parent_only(&dir, n, Mode::Sleep).await,
        Ok("busy") => run_parent_only(&dir, n, Mode::Busy).await,
        _ => drive(&dir, n, abort).await,
    };
    println!("ended {}", serde_json::to_string(&done).unwrap());
}

/// Drives only the parent `p`, with `n` children in `mode`, on the store file in `dir` with
/// [`Runtime::run`]: the children are driven because the parent started or joins them.
async fn run_parent_only(dir: &Path, n: usize, mode: Mode) -> Fan {
    let store = RedbStore::open(dir.join("store.redb")).unwrap();
    let counts = Counts(Arc::default(), Some(dir.join("ledger")));
    let rt = Runtime::builder().register::<Leaf, _>(counts).build(store);
    let initial = Fan::Split {
        modes: vec![mode; n],
        first: usize::MAX,
        abandon_last: false,
    };
    let done = rt.run("p", initial, &Parent).await.unwrap();
    rt.shutdown().await;
    done
}

/// Drives the parent `p` with `n` children on the store file in `dir` (resuming whatever is
/// there) to its end, aborting the process at the parent driver's write `abort`, if given.
async fn drive(dir: &Path, n: usize, abort: Option<(u64, bool)>) -> Fan {
    let store = RedbStore::open(dir.join("store.redb")).unwrap();
    let hook = AbortAt {
        at: abort,
        seen: AtomicU64::new(0),
    };
    let store = loops::testing::HookedStore::with_hook(store, hook);
    let counts = Counts(Arc::default(), Some(dir.join("ledger")));
    let rt = Runtime::builder()
        .register::<Leaf, _>(counts)
        .register::<Fan, _>(Parent)
        .build(store);
    rt.resume_all().await.unwrap();
    let initial = Fan::Split {
        modes: vec![Mode::Now; n],
        first: usize::MAX,
        abandon_last: false,
    };
    rt.start("p", initial).await.unwrap();
    let done: Fan = rt.wait("p").await.unwrap();
    rt.shutdown().await;
    done
}

/// Aborts the process at the parent driver's `at` write (`(n, after)`).
struct AbortAt {
    at: Option<(u64, bool)>,
    seen: AtomicU64,
}

impl AbortAt {
    /// Whether `seen` is a write of the parent's driver: its own, or a child's creation.
    fn parents(seen: &loops::testing::WriteSeen) -> bool {
        let run = seen.run_id.as_deref().unwrap_or("");
        run == "p" || (seen.kind == "Create" && run.starts_with("p/"))
    }
}

impl loops::testing::WriteHook for AbortAt {
    fn before(&self, seen: &loops::testing::WriteSeen) -> loops::testing::Verdict {
        if Self::parents(seen) {
            let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
            if self.at == Some((n, false)) {
                println!("aborting before write {n}: {}", seen.what);
                std::process::abort();
            }
        }
        loops::testing::Verdict::Go
    }

    fn after(
        &self,
        seen: &loops::testing::WriteSeen,
        _: &loops::Result<loops::Reply>,
    ) -> loops::testing::Verdict {
        if Self::parents(seen) && self.at == Some((self.seen.load(Ordering::SeqCst), true)) {
            println!(
                "aborting after write {}: {}",
                self.seen.load(Ordering::SeqCst),
                seen.what
            );
            std::process::abort();
        }
        loops::testing::Verdict::Go
    }
}

/// The command that runs this file's `child_process` on the store in `dir` with `children`
/// children (its output and environment left to the caller).
fn child_command(dir: &Path, children: usize) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "child_process",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LOOPS_DIR", dir)
        .env("LOOPS_CHILDREN", children.to_string());
    command
}

/// Runs the child process on `dir` with `env`; returns its last line (`ended ...` if it
/// ended) once it exits (killed after 120 s without a line).
fn run_child(dir: &Path, children: usize, env: &[(&str, String)]) -> Option<String> {
    let mut child = child_command(dir, children)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut ended = None;
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(120)) {
        if let Some(at) = line.find("ended ") {
            ended = Some(line[at + 6..].to_owned());
        }
    }
    let _ = child.kill();
    child.wait().unwrap();
    ended
}

/// The lines `i: i^2 = square` of `n` children.
fn squares(n: u64) -> Vec<String> {
    (0..n).map(|i| format!("{i}: {i}^2 = {}", i * i)).collect()
}

/// What a crashed and resumed fan-out must show: the parent ended once with every child's
/// result, each child id one run (of `p`, completed), each child's effect made under one
/// idempotency key and recorded once.
async fn check_fan_out(dir: &Path, n: u64, ended: &str) {
    let done: Fan = serde_json::from_str(ended).unwrap();
    assert_eq!(done, Fan::Summed { lines: squares(n) });
    let store = RedbStore::open(dir.join("store.redb")).unwrap();
    let history: Vec<String> = store
        .history("p")
        .unwrap()
        .into_iter()
        .map(|r| r.state)
        .collect();
    assert_eq!(history, ["Split", "Summed"]);
    let children = store.children("p").unwrap();
    assert_eq!(children.len(), n as usize);
    for child in &children {
        assert_eq!(child.status, RunStatus::Completed, "{}", child.run_id);
        let steps = store.steps(&child.run_id, 0).unwrap();
        let squares = steps.iter().filter(|(name, _, _)| name == "square").count();
        assert_eq!(squares, 1, "{}", child.run_id);
    }
    // The parent recorded one start per child and one join.
    let steps = store.steps("p", 0).unwrap();
    let starts = steps
        .iter()
        .filter(|(n, _, _)| n.starts_with("loops:child:"))
        .count();
    let joins = steps.iter().filter(|(n, _, _)| n == "loops:join").count();
    assert_eq!((starts, joins), (n as usize, 1));
    // Each effect was made under its child's one key (twice only if a crash fell between
    // the effect and its record).
    let ledger = std::fs::read_to_string(dir.join("ledger")).unwrap_or_default();
    let mut keys: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for line in ledger.lines() {
        let (id, key) = line.split_once(' ').unwrap();
        keys.entry(id.to_owned())
            .or_default()
            .insert(key.to_owned());
    }
    assert_eq!(keys.len(), n as usize, "{ledger}");
    assert!(keys.values().all(|k| k.len() == 1), "{ledger}");
}

/// Kills the parent process before and after every write its driver makes around the
/// children's starts and the join (2 children: the parent's creation, 2 creations and 2
/// start records, the join's waits and record, the transition), resumes it in a new
/// process, and checks the outcome each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_write_around_start_and_join_ends_with_each_childs_result_once() {
    let mut explored = 0;
    'writes: for n in 1.. {
        for when in ["before", "after"] {
            let dir = tempfile::tempdir().unwrap();
            let crashed = run_child(dir.path(), 2, &[("LOOPS_ABORT", format!("{n} {when}"))]);
            if crashed.is_some() {
                // The run ended before its n-th write: every write was explored.
                break 'writes;
            }
            // Resumed in this process (a process of its own would only cost a start).
            let done = drive(dir.path(), 2, None).await;
            check_fan_out(dir.path(), 2, &serde_json::to_string(&done).unwrap()).await;
            explored += 1;
        }
    }
    // At least: p's creation, 2 creations, 2 start records, one join record, the
    // transition; before and after each.
    assert!(explored >= 14, "explored {explored}");
}

/// Fan-out of 50 children; the process is SIGKILLed at random times while they run (5
/// times by default, `LOOPS_FAN_KILLS` to change it), then resumed to the end: each child
/// ran once, the parent ended once, with every result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_of_50_under_random_kills_runs_each_child_once() {
    let kills: u32 = std::env::var("LOOPS_FAN_KILLS").map_or(5, |v| v.parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..kills {
        let mut child = child_command(dir.path(), 50)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(fastrand::u64(20..400)));
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let ended = run_child(dir.path(), 50, &[]).expect("the resumed run ends");
    check_fan_out(dir.path(), 50, &ended).await;
}

/// The process is SIGKILLed while the 3 children sleep (parked on their timers); the next
/// process drives only the parent (`Runtime::run`, no `resume_all`): its join gives each
/// child a driver, which re-arms the child's timer, and the parent ends with every result.
/// Before, the children were never driven again and the parent waited for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_run_alone_after_a_kill_drives_its_sleeping_children() {
    let dir = tempfile::tempdir().unwrap();
    kill_once_all_say(dir.path(), "sleep", 3);
    let ended = run_child(dir.path(), 3, &[("LOOPS_MODE", "sleep".to_owned())])
        .expect("the parent, run alone, ends");
    check_fan_out(dir.path(), 3, &ended).await;
}

/// Runs the child process driving only the parent with `n` children in `mode` (`sleep` or
/// `busy`), and SIGKILLs it once every child said so (each says `MODE ID` before its sleep or
/// inside its step), and a little more.
fn kill_once_all_say(dir: &Path, mode: &str, n: usize) {
    let mut child = child_command(dir, n)
        .env("LOOPS_MODE", mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let word = format!("{} ", if mode == "sleep" { "sleeping" } else { mode });
    let mut said = std::collections::BTreeSet::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        // The test harness's `test child_process ... ` may begin the line.
        if let Some(at) = line.find(&word) {
            said.insert(line[at + word.len()..].to_owned());
            if said.len() == n {
                break;
            }
        }
    }
    // A kill that falls before a sleeping child parked leaves it running: the next process
    // must take it up as well.
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(said.len(), n, "{said:?}");
}

/// The process is SIGKILLed while the 3 children run a step; a new process, which drives
/// nothing (no `resume_all`), cancels the parent: the parent and every child end cancelled at
/// once, since nobody drives them. Before, the children stayed running, their cancellation
/// asked of drivers that were gone, until some process resumed them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parent_after_a_kill_ends_the_children_nobody_drives_at_once() {
    let dir = tempfile::tempdir().unwrap();
    kill_once_all_say(dir.path(), "busy", 3);
    let rt = Runtime::builder()
        .register::<Leaf, _>(Counts::default())
        .register::<Fan, _>(Parent)
        .build(RedbStore::open(dir.path().join("store.redb")).unwrap());
    let p = rt.cancel("p", "stop").await.unwrap();
    assert_eq!(p.status, RunStatus::Cancelled);
    let children = rt.store().children("p").await.unwrap();
    let ended: Vec<(String, RunStatus, Option<String>)> = children
        .into_iter()
        .map(|c| (c.run_id, c.status, c.cancel))
        .collect();
    let by_p = Some("parent run `p` was cancelled".to_owned());
    assert_eq!(
        ended,
        [
            ("p/0".to_owned(), RunStatus::Cancelled, by_p.clone()),
            ("p/1".to_owned(), RunStatus::Cancelled, by_p.clone()),
            ("p/2".to_owned(), RunStatus::Cancelled, by_p),
        ]
    );
    rt.shutdown().await;
}

/// A child that ended is kept by pruning while its parent has not ended (the parent's join
/// reads it), and pruned with it once the parent ended: before, retention removed it and the
/// parent's join failed for good ("run `p/0` does not exist").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_keeps_an_ended_child_until_its_parent_ends() {
    let counts = Counts::default();
    let rt = runtime(&counts);
    rt.start(
        "p",
        Fan::Split {
            modes: vec![Mode::Now, Mode::Wait],
            first: usize::MAX,
            abandon_last: false,
        },
    )
    .await
    .unwrap();
    wait_status(&rt, "p/0", RunStatus::Completed).await;
    wait_status(&rt, "p/1", RunStatus::Waiting).await;
    let everything = loops::RetentionPolicy::older_than(Duration::ZERO);
    for dry_run in [true, false] {
        let pruned = rt.prune_with(&everything, dry_run).await.unwrap();
        assert_eq!(pruned.run_ids, Vec::<String>::new(), "dry run: {dry_run}");
        assert_eq!(pruned.kept_for_parents, 1, "p/0, dry run: {dry_run}");
    }
    rt.send("p/1", Leaf::GO, &1).await.unwrap();
    let done: Fan = rt.wait("p").await.unwrap();
    assert_eq!(
        done,
        Fan::Summed {
            lines: vec!["0: 0^2 = 0".to_owned(), "1: 1^2 = 1".to_owned()]
        }
    );
    // loops' own event is not for senders outside it.
    let refused = rt
        .send("p", loops::CHILD_ENDED, &serde_json::json!({"child": "x"}))
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("reserves for the events it sends itself"),
        "{refused}"
    );
    // A run is older than 0 once a millisecond has passed since it ended.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let pruned = rt.prune_with(&everything, false).await.unwrap();
    assert_eq!(pruned.kept_for_parents, 0);
    let mut pruned = pruned.run_ids;
    pruned.sort();
    assert_eq!(pruned, vec!["p", "p/0", "p/1"]);
}

/// Retention counts a run with the child runs it started, as one run that ended when the
/// last of them did, and removes them together: `keep_last(1)` keeps the newest parent
/// with its children (before, it counted each child as a run and could keep a parent while
/// removing the child its history names), and a child that ended long before its parent is
/// as old as the parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_keeps_or_removes_a_parent_with_its_children() {
    let counts = Counts::default();
    let rt = runtime(&counts);
    let split = |modes: Vec<Mode>| Fan::Split {
        modes,
        first: usize::MAX,
        abandon_last: false,
    };
    rt.start("p", split(vec![Mode::Now, Mode::Wait]))
        .await
        .unwrap();
    let early = wait_status(&rt, "p/0", RunStatus::Completed).await;
    wait_status(&rt, "p/1", RunStatus::Waiting).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    rt.send("p/1", Leaf::GO, &1).await.unwrap();
    let _: Fan = rt.wait("p").await.unwrap();
    let p = wait_status(&rt, "p", RunStatus::Completed).await;
    assert!(early.updated_ms < p.updated_ms, "{early:?} {p:?}");
    // By age, at a moment when p/0 alone is older than the cutoff: nothing goes.
    let cutoff = early.updated_ms + 1;
    let by_age = loops::RetentionPolicy::older_than(Duration::ZERO);
    let pruned = loops::prune(rt.store(), &by_age, cutoff, true)
        .await
        .unwrap();
    assert_eq!(pruned.run_ids, Vec::<String>::new());
    let pruned = loops::prune(rt.store(), &by_age, p.updated_ms + 1, true)
        .await
        .unwrap();
    assert_eq!(pruned.run_ids, ["p", "p/0", "p/1"], "parent first");
    assert_eq!(pruned.records, 2 + 2 + 2);

    tokio::time::sleep(Duration::from_millis(5)).await;
    rt.start("q", split(vec![Mode::Now])).await.unwrap();
    let _: Fan = rt.wait("q").await.unwrap();
    let newest = loops::RetentionPolicy::default().keep_last(1);
    let dry = rt.prune_with(&newest, true).await.unwrap();
    assert_eq!(dry.run_ids, ["p", "p/0", "p/1"]);
    let pruned = rt.prune_with(&newest, false).await.unwrap();
    assert_eq!((pruned.runs, pruned.run_ids), (3, dry.run_ids));
    for gone in ["p", "p/0", "p/1"] {
        assert_eq!(rt.run_info(gone).await.unwrap(), None, "{gone}");
    }
    for kept in ["q", "q/0"] {
        let info = rt.run_info(kept).await.unwrap().unwrap();
        assert_eq!(info.status, RunStatus::Completed, "{kept}");
    }
    let again = rt.prune_with(&newest, false).await.unwrap();
    assert_eq!(again.runs, 0, "q and its child are one run");
    rt.shutdown().await;
}

/// Starts the child `twin` twice in one state (`twice`), or the child `orphan` (a leaf,
/// which the second runtime of the test has no handler for).
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "careless")]
enum Careless {
    #[initial]
    #[next(Done)]
    Go { twice: bool },
    #[terminal]
    Done,
}

struct CarelessParent;

impl CarelessHandler for CarelessParent {
    type Error = Error;
    async fn go(&self, ctx: &Context, twice: bool) -> Result<GoNext, Error> {
        if twice {
            for mode in [Mode::Now, Mode::Wait] {
                ctx.start_child("twin", Leaf::Start { i: 0, mode }).await?;
            }
        } else {
            ctx.start_child(
                "orphan",
                Leaf::Start {
                    i: 0,
                    mode: Mode::Now,
                },
            )
            .await?;
        }
        Ok(GoNext::Done)
    }
}

/// A second start of one child id in one state, and a child no process here can drive, are
/// refused at once: the parent fails at its first attempt (those errors come out the same at
/// every try), and no second child nor an undriven one is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_started_twice_or_of_an_unregistered_workflow_fails_the_parent_at_once() {
    let counts = Counts::default();
    let with_careless = |store| {
        Runtime::builder()
            .register::<Leaf, _>(counts.clone())
            .register::<Careless, _>(CarelessParent)
            .build(store)
    };
    let rt = with_careless(RedbStore::in_memory().unwrap());
    rt.start("dup", Careless::Go { twice: true }).await.unwrap();
    let err = rt.wait::<Careless>("dup").await.unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot start child `twin`: this state started a child with that id already"),
        "{err}"
    );
    let info = rt.store().run_info("dup").await.unwrap().unwrap();
    assert_eq!((info.status, info.attempt), (RunStatus::Failed, 1));
    let children = rt.store().children("dup").await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");

    // `Leaf` is not registered in this runtime: its child would never be driven.
    let rt = Runtime::builder()
        .register::<Careless, _>(CarelessParent)
        .build(RedbStore::in_memory().unwrap());
    rt.start("lonely", Careless::Go { twice: false })
        .await
        .unwrap();
    rt.wait::<Careless>("lonely").await.unwrap_err();
    let info = rt.store().run_info("lonely").await.unwrap().unwrap();
    assert_eq!((info.status, info.attempt), (RunStatus::Failed, 1));
    let failures = rt.store().failures("lonely").await.unwrap();
    assert_eq!(failures.len(), 1);
    assert!(
        failures[0]
            .1
            .errors
            .join(": ")
            .contains("no handler is registered"),
        "{failures:?}"
    );
    assert_eq!(rt.store().run_info("orphan").await.unwrap(), None);
}

/// Waits for its cancellation, then tries what a handler might do next: start a child, sleep,
/// wait for an event, set an attribute. Each is refused (`Error::Cancelled`) and records
/// nothing.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "late")]
enum Late {
    #[initial]
    #[next(Done)]
    Hold,
    #[terminal]
    Done,
}

/// What `Late`'s handler got from each call after its cancellation.
#[derive(Clone, Default)]
struct Tries(Arc<Mutex<Vec<String>>>);

impl LateHandler for Tries {
    type Error = Error;
    async fn hold(&self, ctx: &Context) -> Result<HoldNext, Error> {
        self.0.lock().unwrap().push("entered".to_owned());
        ctx.cancelled().await;
        let child = ctx
            .start_child(
                "late/child",
                Leaf::Start {
                    i: 1,
                    mode: Mode::Now,
                },
            )
            .await
            .map(|c| c.run_id().to_owned());
        let slept = ctx.sleep(Duration::from_secs(60)).await;
        let got = ctx.wait_for::<u64>("go").await;
        let attribute = ctx.set_attribute("repo", "acme/api").await;
        let mut tries = self.0.lock().unwrap();
        for result in [child.map(drop), slept, got.map(drop), attribute] {
            tries.push(match result {
                Err(Error::Cancelled { run_id, state, seq }) => format!("{run_id} {state} {seq}"),
                other => format!("{other:?}"),
            });
        }
        Ok(HoldNext::Done)
    }
}

/// A handler that goes on after its run's cancellation starts no child, records no sleep, no
/// wait and no attribute: before, a child started then was created, was not cancelled, and
/// ran to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_started_or_recorded_after_a_cancellation() {
    let tries = Tries::default();
    let rt = Runtime::builder()
        .register::<Leaf, _>(Counts::default())
        .register::<Late, _>(tries.clone())
        .build(RedbStore::in_memory().unwrap());
    rt.start("late", Late::Hold).await.unwrap();
    while tries.0.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rt.cancel("late", "stop").await.unwrap();
    let info = wait_status(&rt, "late", RunStatus::Cancelled).await;
    assert_eq!((info.state.as_str(), info.seq), ("Hold", 0));
    while tries.0.lock().unwrap().len() < 5 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        *tries.0.lock().unwrap(),
        [
            "entered",
            "late Hold 0",
            "late Hold 0",
            "late Hold 0",
            "late Hold 0"
        ]
    );
    assert!(rt.run_info("late/child").await.unwrap().is_none());
    assert!(rt.store().children("late").await.unwrap().is_empty());
    assert!(rt.store().steps("late", 0).await.unwrap().is_empty());
    assert!(rt.store().attributes("late").await.unwrap().is_empty());
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "pair")]
enum Pair {
    #[initial]
    #[next(Joined)]
    Spread { n: u64 },
    #[terminal]
    Joined { squares: Vec<u64> },
}

/// Returns `anyhow::Error`, as most applications' handlers do.
struct Joiner;

impl PairHandler for Joiner {
    type Error = anyhow::Error;
    async fn spread(&self, ctx: &Context, n: u64) -> anyhow::Result<SpreadNext> {
        let mut children: Vec<ChildRun<Leaf>> = Vec::new();
        for i in 0..n {
            let id = format!("{}/{i}", ctx.run_id());
            let mode = if i % 2 == 0 { Mode::Now } else { Mode::Sleep };
            children.push(ctx.start_child(&id, Leaf::Start { i, mode }).await?);
        }
        // Every join in flight at once (steps may run concurrently).
        let joined =
            futures_util::future::join_all(children.iter().map(|c| ctx.join_child(c))).await;
        let mut squares = Vec::new();
        for result in joined {
            match result? {
                Ok(Leaf::Squared { square, .. }) => squares.push(square),
                other => panic!("{other:?}"),
            }
        }
        Ok(SpreadNext::Joined { squares })
    }
}

/// A handler that returns `anyhow::Error` and meets a child id taken with `?` fails at its
/// first attempt, as one returning loops' `Error` does (anyhow's own boxing hid the error:
/// its state spent every retry on a conflict that comes out the same each time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_id_taken_fails_an_anyhow_handler_at_its_first_attempt() {
    let counts = Counts::default();
    let rt = runtime(&counts);
    rt.start(
        "q/0",
        Leaf::Start {
            i: 9,
            mode: Mode::Wait,
        },
    )
    .await
    .unwrap();
    rt.start("q", Pair::Spread { n: 1 }).await.unwrap();
    let err = rt.wait::<Pair>("q").await.unwrap_err();
    let conflict = "run `q` (state `Spread`, seq 0) cannot start child `q/0`: a run without a parent has that id";
    assert!(err.to_string().contains(conflict), "{err}");
    let info = rt.store().run_info("q").await.unwrap().unwrap();
    assert_eq!(
        (info.status, info.attempt, info.error),
        (RunStatus::Failed, 1, Some(vec![conflict.to_owned()]))
    );
    assert_eq!(rt.store().failures("q").await.unwrap().len(), 1);
}

/// Joins of one handler in flight at once, over children that end at once and a second
/// later: each join gets its child's result and the parent ends (no wake-up is lost to
/// another join; a join that delivered every pending child-ended event lost one in 2 of 3
/// runs of this test, and before the joins took turns, one join's wait took the event
/// another join's child sent while that join's wait parked the run: under disk pressure,
/// 2 of 2 CI runs, and 1 in 8 runs beside a `dd` with `conv=fsync`;
/// `a_join_whose_wake_up_another_join_took_still_ends` makes that order every time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_joins_of_one_handler_each_get_their_child() {
    let counts = Counts::default();
    let rt = runtime(&counts);
    for p in 0..20 {
        rt.start(&format!("p{p}"), Pair::Spread { n: 6 })
            .await
            .unwrap();
    }
    for p in 0..20 {
        let done: Pair = tokio::time::timeout(Duration::from_secs(30), rt.wait(&format!("p{p}")))
            .await
            .unwrap_or_else(|_| panic!("p{p} did not end: a join lost its wake-up"))
            .unwrap();
        assert_eq!(
            done,
            Pair::Joined {
                squares: vec![0, 1, 4, 9, 16, 25]
            }
        );
    }
    // Each child ran its step once.
    let once: BTreeMap<String, u32> = (0..20)
        .flat_map(|p| (0..6).map(move |i| (format!("p{p}/{i}"), 1)))
        .collect();
    assert_eq!(counts.get(), once);
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
// `Pair` has states `Spread` and `Joined` too: the prefix keeps the generated enums apart
// (`DuoSpreadNext`, not a second `SpreadNext`).
#[workflow(name = "duo", next_prefix = "Duo")]
enum Duo {
    #[initial]
    #[next(Joined)]
    Spread,
    #[terminal]
    Joined { squares: Vec<u64> },
}

/// Joins its two children (`ID/0` and `ID/1`, each waiting for `go`) at once; the second
/// join starts 100 ms after the first, so that the first one looks and waits first.
struct TwoJoins;

impl DuoHandler for TwoJoins {
    type Error = Error;
    async fn spread(&self, ctx: &Context) -> Result<DuoSpreadNext, Error> {
        let mut children: Vec<ChildRun<Leaf>> = Vec::new();
        for i in 0..2 {
            let id = format!("{}/{i}", ctx.run_id());
            let initial = Leaf::Start {
                i: i + 2,
                mode: Mode::Wait,
            };
            children.push(ctx.start_child(&id, initial).await?);
        }
        let (first, second) = tokio::join!(ctx.join_child(&children[0]), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            ctx.join_child(&children[1]).await
        });
        let mut squares = Vec::new();
        for joined in [first?, second?] {
            match joined {
                Ok(Leaf::Squared { square, .. }) => squares.push(square),
                other => {
                    return Err(Error::permanent(std::io::Error::other(format!(
                        "{other:?}"
                    ))));
                }
            }
        }
        Ok(DuoSpreadNext::Joined { squares })
    }
}

/// Holds back the parent's waits for a child's end, by their occurrence: the first for 4 s,
/// the second for 1 s, the third for 1.5 s.
struct SlowJoinWaits;

impl loops::testing::WriteHook for SlowJoinWaits {
    fn before(&self, seen: &loops::testing::WriteSeen) -> loops::testing::Verdict {
        let ms = match &seen.step {
            Some((0, name, occurrence))
                if seen.run_id.as_deref() == Some("d") && name.ends_with(loops::CHILD_ENDED) =>
            {
                [4000, 1000, 1500].get(*occurrence as usize).copied()
            }
            _ => None,
        };
        match ms {
            Some(ms) => loops::testing::Verdict::Delay(Duration::from_millis(ms)),
            None => loops::testing::Verdict::Go,
        }
    }
}

/// Two joins of one handler, where one takes the wake-up the other's child sent: the first
/// join looks (child 0 running) and its wait reaches the store last (4 s); meanwhile child 0
/// ends (0.5 s) and the second join's wait takes its event (1 s), looks again (child 1
/// running), and takes child 1's event (2.5 s). Without turns between the joins, the first
/// join's wait then found nothing pending and parked the run for ever, with both children
/// ended (the lost wake-up `concurrent_joins_of_one_handler_each_get_their_child` met under
/// disk pressure, here every time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_whose_wake_up_another_join_took_still_ends() {
    let store =
        loops::testing::HookedStore::with_hook(RedbStore::in_memory().unwrap(), SlowJoinWaits);
    let counts = Counts::default();
    let rt = Runtime::builder()
        .register::<Leaf, _>(counts.clone())
        .register::<Duo, _>(TwoJoins)
        .build(store);
    rt.start("d", Duo::Spread).await.unwrap();
    wait_status(&rt, "d/1", RunStatus::Waiting).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    rt.send("d/0", Leaf::GO, &1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    rt.send("d/1", Leaf::GO, &1).await.unwrap();
    let done: Duo = tokio::time::timeout(Duration::from_secs(30), rt.wait("d"))
        .await
        .expect("d did not end: a join lost its wake-up")
        .unwrap();
    assert_eq!(
        done,
        Duo::Joined {
            squares: vec![4, 9]
        }
    );
    let once: BTreeMap<String, u32> = [("d/0".to_owned(), 1), ("d/1".to_owned(), 1)].into();
    assert_eq!(counts.get(), once);
}
