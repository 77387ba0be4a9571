//! Crash tests: a child process (this test binary, re-run as `child_process`) drives a run and
//! is SIGKILLed, or aborts, at a chosen point; the parent restarts it and asserts the exact
//! outcome: final state, history, attempts, and the count of side effects in a ledger kept
//! outside the store.
//!
//! The child holds (prints `holding <point>` and sleeps) at the point named by
//! `LOOPS_HOLD`, so that the kill lands exactly there.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use loops::{Context, RetryPolicy, RunStatus, Runtime, StepOptions, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "crash_job")]
enum Job {
    #[initial]
    #[next(Effect)]
    Start { n: u32 },
    #[next(Approval)]
    Effect { n: u32 },
    #[next(Done)]
    Approval { receipt: String },
    #[terminal]
    Done { receipt: String, approver: String },
}

/// The child's handler: every entry and side effect goes to files in `dir`.
struct Agent {
    dir: PathBuf,
    hold: String,
}

impl Agent {
    fn log(&self, file: &str, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(file))
            .unwrap();
        writeln!(f, "{line}").unwrap();
        f.sync_all().unwrap();
    }

    fn hold_at(&self, point: &str) {
        if self.hold == point {
            println!("holding {point}");
            std::io::stdout().flush().unwrap();
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

impl Agent {
    /// A step retried in place, 1.5 s apart, that fails its first two tries: each try is a
    /// line `try attempt` in `tries`, and the child prints `try N failed`.
    async fn flaky_step(&self, ctx: &Context) -> anyhow::Result<EffectNext> {
        let policy = RetryPolicy::attempts(3)
            .with_delays(Duration::from_millis(1500), Duration::from_millis(1500))
            .with_jitter(0.0);
        let receipt: String = ctx
            .step_with("flaky", StepOptions::retry(policy), || async {
                let n = lines(&self.dir, "tries").len() + 1;
                self.log("tries", &format!("{n} {}", ctx.attempt()));
                if n < 3 {
                    println!("try {n} failed");
                    std::io::stdout().flush()?;
                    return Err(format!("try {n} fails").into());
                }
                Ok(format!("receipt-{n}"))
            })
            .await?;
        Ok(EffectNext::Approval { receipt })
    }
}

impl JobHandler for Agent {
    type Error = anyhow::Error;

    async fn start(&self, ctx: &Context, n: u32) -> Result<StartNext, Self::Error> {
        self.log("entries", &format!("Start {} {}", ctx.seq(), ctx.attempt()));
        self.hold_at("start");
        Ok(StartNext::Effect { n })
    }

    async fn effect(&self, ctx: &Context, n: u32) -> Result<EffectNext, Self::Error> {
        self.log(
            "entries",
            &format!("Effect {} {}", ctx.seq(), ctx.attempt()),
        );
        if self.hold == "abort" {
            // Crashes the process on every attempt.
            std::process::abort();
        }
        if self.hold == "fail_first" && ctx.attempt() == 1 {
            println!("failing attempt 1");
            std::io::stdout().flush().unwrap();
            anyhow::bail!("attempt 1 fails");
        }
        if self.hold == "step_retry" {
            return self.flaky_step(ctx).await;
        }
        let key = ctx.idempotency_key("effect")?;
        self.log("keys", &key);
        let receipt: String = ctx
            .step("effect", || async {
                // The side effect: a ledger line carrying the idempotency key.
                self.log("ledger", &format!("{key} {n}"));
                self.hold_at("in_step");
                Ok(format!("receipt-{n}"))
            })
            .await?;
        self.hold_at("after_step");
        if std::env::var_os("LOOPS_ATTRIBUTE").is_some() {
            // Not a step: every execution of this handler sets it again.
            ctx.set_attribute("receipt", receipt.as_str()).await?;
            self.log("attribute_sets", &receipt);
            self.hold_at("after_attribute");
        }
        Ok(EffectNext::Approval { receipt })
    }

    async fn approval(&self, ctx: &Context, receipt: String) -> Result<ApprovalNext, Self::Error> {
        self.log(
            "entries",
            &format!("Approval {} {}", ctx.seq(), ctx.attempt()),
        );
        if self.hold == "sleep" {
            ctx.sleep(Duration::from_millis(2500)).await?;
            return Ok(ApprovalNext::Done {
                receipt,
                approver: "timer".into(),
            });
        }
        let approver: String = ctx.wait_for("approve").await?;
        Ok(ApprovalNext::Done { receipt, approver })
    }
}

/// The child: drives run `job` in the store under `LOOPS_DIR`, then prints its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the other tests of this file as their child process"]
async fn child_process() {
    // Reads FAILPOINTS (fault points exist with the `failpoints` feature only).
    let _scenario = fail::FailScenario::setup();
    if std::env::var_os("LOOPS_TRACE").is_some() {
        // loops's own events on stdout, where the parent waits for one of them.
        tracing_subscriber::fmt()
            .with_env_filter("loops_core=debug")
            .with_writer(std::io::stdout)
            .with_ansi(false)
            .init();
    }
    let dir = PathBuf::from(std::env::var("LOOPS_DIR").expect("LOOPS_DIR"));
    let hold = std::env::var("LOOPS_HOLD").unwrap_or_default();
    let runtime = Runtime::builder()
        .retry(
            RetryPolicy::attempts(3)
                .with_max_interruptions(3)
                .with_delays(Duration::from_millis(2000), Duration::from_secs(5))
                .with_jitter(0.0),
        )
        .park_threshold(Duration::from_millis(
            std::env::var("LOOPS_PARK_MS").map_or(100, |ms| ms.parse().unwrap()),
        ))
        .codec_if(std::env::var_os("LOOPS_SEALED").is_some())
        .open(dir.join("store.redb"))
        .unwrap();
    let handler = Agent { dir, hold };
    if std::env::var("LOOPS_VERSION").as_deref() == Ok("2") {
        // The next build: version 2 of the workflow, with a migration from version 1.
        runtime.migration::<Job, v2::Job>();
        match runtime.run("job", v2::Job::Start { n: 7 }, &handler).await {
            Ok(done) => println!("ended {}", serde_json::to_string(&done).unwrap()),
            Err(e) => println!("error {e}"),
        }
        return;
    }
    match runtime.run("job", Job::Start { n: 7 }, &handler).await {
        Ok(done) => println!("ended {}", serde_json::to_string(&done).unwrap()),
        Err(e) => println!("error {e}"),
    }
}

/// Version 2 of `crash_job`: `Effect` carries a priority (a breaking change), migrated from
/// version 1. Its handler does what version 1's does, under the same step names.
mod v2 {
    use loops::{BoxError, Context, Migrate, Workflow};
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "crash_job", version = 2)]
    pub enum Job {
        #[initial]
        #[next(Effect)]
        Start { n: u32 },
        #[next(Approval)]
        Effect { n: u32, priority: u8 },
        #[next(Done)]
        Approval { receipt: String },
        #[terminal]
        Done { receipt: String, approver: String },
    }

    impl Migrate<super::Job> for Job {
        fn migrate(old: super::Job) -> Result<Self, BoxError> {
            Ok(match old {
                super::Job::Start { n } => Job::Start { n },
                super::Job::Effect { n } => Job::Effect { n, priority: 1 },
                super::Job::Approval { receipt } => Job::Approval { receipt },
                super::Job::Done { receipt, approver } => Job::Done { receipt, approver },
            })
        }
    }

    impl JobHandler for super::Agent {
        type Error = anyhow::Error;

        async fn start(&self, ctx: &Context, n: u32) -> Result<StartNext, Self::Error> {
            self.log(
                "entries",
                &format!("v2 Start {} {}", ctx.seq(), ctx.attempt()),
            );
            Ok(StartNext::Effect { n, priority: 1 })
        }

        async fn effect(
            &self,
            ctx: &Context,
            n: u32,
            priority: u8,
        ) -> Result<EffectNext, Self::Error> {
            self.log(
                "entries",
                &format!("v2 Effect {} {}", ctx.seq(), ctx.attempt()),
            );
            let key = ctx.idempotency_key("effect")?;
            self.log("keys", &key);
            let receipt: String = ctx
                .step("effect", || async {
                    self.log("ledger", &format!("{key} {n} v2 {priority}"));
                    Ok(format!("receipt-{n}"))
                })
                .await?;
            Ok(EffectNext::Approval { receipt })
        }

        async fn approval(
            &self,
            ctx: &Context,
            receipt: String,
        ) -> Result<ApprovalNext, Self::Error> {
            self.log(
                "entries",
                &format!("v2 Approval {} {}", ctx.seq(), ctx.attempt()),
            );
            let approver: String = ctx.wait_for("approve").await?;
            Ok(ApprovalNext::Done { receipt, approver })
        }
    }
}

/// The key of the runs sealed at rest (`LOOPS_SEALED` in the child).
fn sealing_keys() -> loops::Keyring {
    loops::Keyring::new("k1", [3; 32]).unwrap()
}

/// A builder with the test's codec when `sealed`.
trait CodecIf {
    fn codec_if(self, sealed: bool) -> Self;
}

impl CodecIf for loops::RuntimeBuilder {
    fn codec_if(self, sealed: bool) -> Self {
        if sealed {
            self.codec(sealing_keys())
        } else {
            self
        }
    }
}

/// Starts the child; returns it and a channel of its stdout lines.
fn spawn_child(dir: &Path, hold: &str) -> (Child, mpsc::Receiver<String>) {
    spawn_child_with(dir, hold, "")
}

/// Starts the child with `FAILPOINTS` set to `failpoints`.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn spawn_child_with(dir: &Path, hold: &str, failpoints: &str) -> (Child, mpsc::Receiver<String>) {
    spawn_child_env(dir, hold, failpoints, &[])
}

/// Starts the child with `FAILPOINTS` set to `failpoints` and the variables `env` set.
fn spawn_child_env(
    dir: &Path,
    hold: &str,
    failpoints: &str,
    env: &[(&str, &str)],
) -> (Child, mpsc::Receiver<String>) {
    spawn_process(dir, hold, failpoints, "1", env)
}

/// Starts the child with `FAILPOINTS` set to `failpoints`, as the build of workflow version
/// `version` (`"1"`, or `"2"`: version 2 with a migration from version 1).
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn spawn_version(
    dir: &Path,
    hold: &str,
    failpoints: &str,
    version: &str,
) -> (Child, mpsc::Receiver<String>) {
    spawn_process(dir, hold, failpoints, version, &[])
}

/// Starts the child: `hold`, `FAILPOINTS`, the workflow version and extra variables.
fn spawn_process(
    dir: &Path,
    hold: &str,
    failpoints: &str,
    version: &str,
    env: &[(&str, &str)],
) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_process",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LOOPS_DIR", dir)
        .env("LOOPS_HOLD", hold)
        .env("LOOPS_VERSION", version)
        .env("FAILPOINTS", failpoints)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Waits for a line that contains `marker` and returns it from the marker on (libtest may
/// print `test child_process ... ` before it on the same line); panics after 30 s.
fn expect_line(rx: &mpsc::Receiver<String>, marker: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(at) = line.find(marker) {
                    return line[at..].to_owned();
                }
            }
            Err(e) => panic!("no line containing {marker:?}: {e}"),
        }
    }
}

/// Kills the child when dropped, so that a failing test leaves no process behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the child at `hold`, SIGKILLs it when it holds there.
fn kill_at(dir: &Path, hold: &str) {
    let (child, rx) = spawn_child(dir, hold);
    let _child = Killed(child);
    expect_line(&rx, &format!("holding {hold}"));
}

/// Runs the child without holding until it prints its end; returns that line.
fn finish(dir: &Path, hold: &str) -> String {
    finish_env(dir, hold, &[])
}

/// As [`finish`], with the variables `env` set.
fn finish_env(dir: &Path, hold: &str, env: &[(&str, &str)]) -> String {
    let (child, rx) = spawn_child_env(dir, hold, "", env);
    let mut child = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let end = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("the child never ended: {e}"));
        if let Some(at) = line.find("ended ").or_else(|| line.find("error ")) {
            break line[at..].to_owned();
        }
    };
    child.0.wait().unwrap();
    end
}

fn lines(dir: &Path, file: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Entries per (state, seq): how many times each handler was entered.
fn entries(dir: &Path) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in lines(dir, "entries") {
        let key = line.rsplit_once(' ').unwrap().0.to_owned();
        *out.entry(key).or_default() += 1;
    }
    out
}

fn history(dir: &Path) -> Vec<(u64, String)> {
    let store = loops::RedbStore::open(dir.join("store.redb")).unwrap();
    store
        .history("job")
        .unwrap()
        .into_iter()
        .map(|r| (r.seq, r.state))
        .collect()
}

fn full_history() -> Vec<(u64, String)> {
    ["Start", "Effect", "Approval", "Done"]
        .iter()
        .enumerate()
        .map(|(i, s)| (i as u64, (*s).to_owned()))
        .collect()
}

/// Sends the approval while no process drives the run.
async fn approve(dir: &Path, who: &str) {
    let runtime = Runtime::open(dir.join("store.redb")).unwrap();
    runtime.send("job", "approve", who).await.unwrap();
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

#[tokio::test]
async fn killed_inside_a_step_repeats_only_the_unrecorded_effect_under_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    kill_at(dir.path(), "in_step");
    // The effect happened, its record did not commit: the one window. It runs again on
    // resume, with the same idempotency key, so the outside system can refuse it.
    approve(dir.path(), "ann").await;
    let end = finish(dir.path(), "");
    assert_eq!(
        end,
        r#"ended {"Done":{"receipt":"receipt-7","approver":"ann"}}"#
    );
    let ledger = lines(dir.path(), "ledger");
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    assert_eq!(ledger[0], ledger[1], "both executions used the same key");
    assert_eq!(
        entries(dir.path()),
        counts(&[("Start 0", 1), ("Effect 1", 2), ("Approval 2", 1)])
    );
    assert_eq!(history(dir.path()), full_history());
}

/// The run's attributes, and the runs a search for `receipt = receipt-7` finds (read with no
/// process holding the store).
fn attributes(dir: &Path) -> (loops::Attributes, Vec<String>) {
    let store = loops::RedbStore::open(dir.join("store.redb")).unwrap();
    let found = store
        .search(&loops::RunFilter::new().attribute("receipt", "receipt-7"))
        .unwrap()
        .into_iter()
        .map(|(info, _)| info.run_id)
        .collect();
    (store.attributes("job").unwrap(), found)
}

#[tokio::test]
async fn killed_after_setting_an_attribute_sets_it_again_on_resume_as_one_entry() {
    let dir = tempfile::tempdir().unwrap();
    let with = [("LOOPS_ATTRIBUTE", "1")];
    {
        let (child, rx) = spawn_child_env(dir.path(), "after_attribute", "", &with);
        let _child = Killed(child);
        expect_line(&rx, "holding after_attribute");
    }
    let set: loops::Attributes = [(
        "receipt".to_owned(),
        loops::AttributeValue::Str("receipt-7".into()),
    )]
    .into();
    // Committed before the kill, and found through the index.
    assert_eq!(
        attributes(dir.path()),
        (set.clone(), vec!["job".to_owned()])
    );
    approve(dir.path(), "dee").await;
    let end = finish_env(dir.path(), "", &with);
    assert_eq!(
        end,
        r#"ended {"Done":{"receipt":"receipt-7","approver":"dee"}}"#
    );
    // The handler ran twice and set it twice (the step replayed its receipt); one value,
    // one index entry, one run found.
    assert_eq!(
        lines(dir.path(), "attribute_sets"),
        ["receipt-7", "receipt-7"]
    );
    assert_eq!(lines(dir.path(), "ledger").len(), 1);
    assert_eq!(attributes(dir.path()), (set, vec!["job".to_owned()]));
    assert_eq!(
        entries(dir.path()),
        counts(&[("Start 0", 1), ("Effect 1", 2), ("Approval 2", 1)])
    );
    assert_eq!(history(dir.path()), full_history());
}

#[tokio::test]
async fn killed_after_a_step_record_replays_the_step_without_running_it() {
    let dir = tempfile::tempdir().unwrap();
    kill_at(dir.path(), "after_step");
    approve(dir.path(), "bob").await;
    let end = finish(dir.path(), "");
    assert_eq!(
        end,
        r#"ended {"Done":{"receipt":"receipt-7","approver":"bob"}}"#
    );
    assert_eq!(
        lines(dir.path(), "ledger").len(),
        1,
        "the recorded step did not run again"
    );
    assert_eq!(
        entries(dir.path()),
        counts(&[("Start 0", 1), ("Effect 1", 2), ("Approval 2", 1)])
    );
    assert_eq!(history(dir.path()), full_history());
}

#[tokio::test]
async fn killed_after_a_transition_does_not_handle_the_committed_state_again() {
    let dir = tempfile::tempdir().unwrap();
    // Held at the entry of Start: nothing committed but the run's creation.
    kill_at(dir.path(), "start");
    approve(dir.path(), "cy").await;
    finish(dir.path(), "");
    assert_eq!(
        entries(dir.path()),
        counts(&[("Start 0", 2), ("Effect 1", 1), ("Approval 2", 1)])
    );
    assert_eq!(lines(dir.path(), "ledger").len(), 1);
    assert_eq!(history(dir.path()), full_history());
}

#[tokio::test]
async fn killed_while_waiting_gets_the_event_sent_while_it_was_down_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (child, _rx) = spawn_child(dir.path(), "");
    let child = Killed(child);
    // The child holds the store, so watch its entries: once Approval is entered, the wait
    // parks within a commit; leave it ample time, then check that it did.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !lines(dir.path(), "entries")
        .iter()
        .any(|l| l.starts_with("Approval"))
    {
        assert!(Instant::now() < deadline, "the run never reached Approval");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(500));
    drop(child);
    let runtime = Runtime::open(dir.path().join("store.redb")).unwrap();
    let info = runtime.run_info("job").await.unwrap().unwrap();
    assert_eq!(info.status, RunStatus::Waiting);
    assert_eq!(info.wait.unwrap().event.as_deref(), Some("approve"));
    let sent = runtime
        .send_with_key("job", "approve", "ticket-1", "dee")
        .await
        .unwrap();
    let again = runtime
        .send_with_key("job", "approve", "ticket-1", "dee")
        .await
        .unwrap();
    assert!(!sent.duplicate && again.duplicate);
    drop(runtime);
    let end = finish(dir.path(), "");
    assert_eq!(
        end,
        r#"ended {"Done":{"receipt":"receipt-7","approver":"dee"}}"#
    );
    let runtime = Runtime::open(dir.path().join("store.redb")).unwrap();
    let events = runtime.store().events("job").await.unwrap();
    assert_eq!(events.len(), 1, "the duplicate send wrote nothing");
    assert!(events[0].2, "delivered");
    assert_eq!(runtime.store().history("job").await.unwrap().len(), 4);
    drop(runtime);
    // Approval was entered twice: once to park, once after the restart to take the event.
    assert_eq!(
        entries(dir.path()),
        counts(&[("Start 0", 1), ("Effect 1", 1), ("Approval 2", 2)])
    );
}

#[tokio::test]
async fn killed_during_a_retry_back_off_waits_only_the_remainder() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (child, rx) = spawn_child(dir.path(), "fail_first");
    let child = Killed(child);
    expect_line(&rx, "failing attempt 1");
    std::thread::sleep(Duration::from_millis(700));
    drop(child);
    approve(dir.path(), "eve").await;
    let end = finish(dir.path(), "fail_first");
    let elapsed = started.elapsed();
    assert_eq!(
        end,
        r#"ended {"Done":{"receipt":"receipt-7","approver":"eve"}}"#
    );
    // The back-off is 2 s from the failure; a restart must not start it over.
    assert!(elapsed >= Duration::from_millis(2000), "{elapsed:?}");
    assert!(
        elapsed < Duration::from_millis(2000 + 700 + 1800),
        "{elapsed:?}"
    );
    let runtime = Runtime::open(dir.path().join("store.redb")).unwrap();
    let failures = runtime.store().failures("job").await.unwrap();
    let summary: Vec<(u64, u32, String)> = failures
        .iter()
        .map(|(seq, f)| (*seq, f.attempt, f.errors.join(": ")))
        .collect();
    assert_eq!(summary, vec![(1, 1, "attempt 1 fails".to_owned())]);
    assert_eq!(
        entries(dir.path()),
        counts(&[("Start 0", 1), ("Effect 1", 2), ("Approval 2", 1)])
    );
}

/// Kills the child during the back-off after the first failed try of a step retried in
/// place (parked when the back-off is over the park threshold of `park_ms`, in place
/// otherwise), restarts it, and checks that the schedule went on: try 2, not a fresh try 1,
/// not before its recorded time. Returns the handler's entries, the attempt of each try,
/// and the errors of the failure records, in order.
async fn step_back_off_killed(
    park_ms: &str,
) -> (BTreeMap<String, usize>, Vec<String>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let env = [("LOOPS_PARK_MS", park_ms), ("LOOPS_TRACE", "1")];
    let (child, rx) = spawn_child_env(dir.path(), "step_retry", "", &env);
    let child = Killed(child);
    expect_line(&rx, "try 1 failed");
    // Logged once the try is recorded and the back-off has begun.
    let waiting = if park_ms == "100" {
        "run parked until its wake-up time"
    } else {
        "waiting in place until the wake-up time"
    };
    expect_line(&rx, waiting);
    drop(child);
    approve(dir.path(), "eve").await;
    let (child, rx) = spawn_child_env(dir.path(), "step_retry", "", &env);
    let mut child = Killed(child);
    assert_eq!(
        expect_line(&rx, "ended "),
        r#"ended {"Done":{"receipt":"receipt-3","approver":"eve"}}"#
    );
    child.0.wait().unwrap();
    let runtime = Runtime::open(dir.path().join("store.redb")).unwrap();
    let store = runtime.store();
    let failures: Vec<(u64, u64, String)> = store
        .failures("job")
        .await
        .unwrap()
        .into_iter()
        .map(|(seq, f)| (seq, f.at_ms, f.errors.join(": ")))
        .collect();
    let errors: Vec<String> = failures.iter().map(|f| f.2.clone()).collect();
    let failed_tries: Vec<&(u64, u64, String)> = failures
        .iter()
        .filter(|f| f.2.starts_with("try "))
        .collect();
    assert_eq!(failed_tries.len(), 2, "{failures:?}");
    let steps = store.steps("job", 1).await.unwrap();
    let tries: Vec<(String, u32, serde_json::Value)> = steps
        .iter()
        .filter(|(name, _, _)| name == "loops:try:0:flaky")
        .map(|(name, occ, r)| {
            (
                name.clone(),
                *occ,
                serde_json::from_str(r.output.get()).unwrap(),
            )
        })
        .collect();
    assert_eq!(tries.len(), 2, "{tries:?}");
    assert_eq!(
        (tries[0].2["try"].as_u64(), tries[1].2["try"].as_u64()),
        (Some(1), Some(2))
    );
    // The second try ran no earlier than the time the first failure recorded for it.
    let retry_at = tries[0].2["retry_at_ms"].as_u64().unwrap();
    assert!(failed_tries[1].1 >= retry_at, "{failures:?} {retry_at}");
    drop(runtime);
    assert_eq!(history(dir.path()), full_history());
    (entries(dir.path()), lines(dir.path(), "tries"), errors)
}

#[tokio::test]
async fn killed_during_a_parked_step_back_off_resumes_the_schedule() {
    // Parked: each back-off parks the run and the handler runs again when it wakes (its
    // recorded steps replay); a wake is not a new attempt, so all three tries are attempt
    // 1's, across the kill.
    let (entries, tries, errors) = step_back_off_killed("100").await;
    assert_eq!(tries, ["1 1", "2 1", "3 1"]);
    assert_eq!(errors, ["try 1 fails", "try 2 fails"]);
    assert_eq!(
        entries,
        counts(&[("Start 0", 1), ("Effect 1", 3), ("Approval 2", 1)])
    );
}

#[tokio::test]
async fn killed_during_a_step_back_off_in_place_resumes_the_schedule() {
    // In place: the restart counts an attempt (interrupted) and enters the handler once
    // more; the step goes on with try 2, and try 3 follows in place.
    let (entries, tries, errors) = step_back_off_killed("5000").await;
    assert_eq!(tries, ["1 1", "2 2", "3 2"]);
    // Attempt 1 is recorded as interrupted (a step's failed try does not end an attempt).
    assert_eq!(errors, ["try 1 fails", loops::INTERRUPTED, "try 2 fails"]);
    assert_eq!(
        entries,
        counts(&[("Start 0", 1), ("Effect 1", 2), ("Approval 2", 1)])
    );
}

#[tokio::test]
async fn a_state_that_crashes_the_process_every_time_fails_after_its_attempts() {
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..3 {
        let (mut child, _rx) = spawn_child(dir.path(), "abort");
        let status = child.wait().unwrap();
        assert!(!status.success(), "the child aborts");
    }
    let end = finish(dir.path(), "abort");
    assert_eq!(
        end,
        "error run `job` failed in state `Effect` (seq 1) after 3 attempts, each cut short by the process stopping"
    );
    assert_eq!(
        entries(dir.path()),
        counts(&[("Start 0", 1), ("Effect 1", 3)])
    );
    let runtime = Runtime::open(dir.path().join("store.redb")).unwrap();
    let info = runtime.run_info("job").await.unwrap().unwrap();
    assert_eq!((info.status, info.attempt), (RunStatus::Failed, 3));
    let attempts: Vec<u32> = runtime
        .store()
        .failures("job")
        .await
        .unwrap()
        .iter()
        .map(|(_, f)| f.attempt)
        .collect();
    assert_eq!(attempts, vec![1, 2, 3]);
}

#[tokio::test]
async fn a_parked_sleep_killed_midway_sleeps_only_the_remainder() {
    let dir = tempfile::tempdir().unwrap();
    let (child, _rx) = spawn_child(dir.path(), "sleep");
    let child = Killed(child);
    let started = Instant::now();
    while !lines(dir.path(), "entries")
        .iter()
        .any(|l| l.starts_with("Approval"))
    {
        assert!(started.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(10));
    }
    let entered = Instant::now();
    std::thread::sleep(Duration::from_millis(1200));
    drop(child);
    let end = finish(dir.path(), "sleep");
    let elapsed = entered.elapsed();
    assert_eq!(
        end,
        r#"ended {"Done":{"receipt":"receipt-7","approver":"timer"}}"#
    );
    assert!(
        elapsed >= Duration::from_millis(2400),
        "woke early: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_millis(2500 + 1500),
        "slept again: {elapsed:?}"
    );
}

/// The same workflow name with a field added: a build whose workflow changed.
mod changed {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "crash_job")]
    pub enum Job {
        #[initial]
        #[next(Effect)]
        Start { n: u32, priority: u8 },
        #[next(Approval)]
        Effect { n: u32 },
        #[next(Done)]
        Approval { receipt: String },
        #[terminal]
        Done { receipt: String, approver: String },
    }
}

#[tokio::test]
async fn a_changed_workflow_is_refused_at_open_even_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    // SIGKILL leaves the file needing redb's repair: the read-only check cannot open it.
    kill_at(dir.path(), "start");
    match Runtime::builder()
        .workflow::<changed::Job>()
        .strict_schemas(true)
        .open(dir.path().join("store.redb"))
    {
        Err(loops::Error::SchemaMismatch {
            run_id,
            workflow,
            changes,
            ..
        }) => {
            assert_eq!((run_id.as_str(), workflow.as_str()), ("job", "crash_job"));
            assert_eq!(
                changes.texts(),
                ["state `Start`: field `priority: u8` added"]
            );
        }
        other => panic!("expected SchemaMismatch, got {other:?}"),
    }
    // Refused before loops wrote anything: the run is where the kill left it.
    assert_eq!(history(dir.path()), vec![(0, "Start".to_owned())]);
}

#[tokio::test]
async fn a_kill_while_the_store_is_created_never_leaves_a_broken_file() {
    // Kill the child at moments spread over its first milliseconds, when the store is being
    // created: the file is then either absent or a complete store.
    for delay_ms in (0..40).step_by(2) {
        let dir = tempfile::tempdir().unwrap();
        let (child, _rx) = spawn_child(dir.path(), "start");
        std::thread::sleep(Duration::from_millis(delay_ms));
        drop(Killed(child));
        let path = dir.path().join("store.redb");
        let rt = Runtime::open(&path).unwrap_or_else(|e| panic!("kill after {delay_ms} ms: {e}"));
        drop(rt);
        let leftovers: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".new-"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    }
}

/// One test per fault point of the commit path: the child aborts there (as a crash would stop
/// it), the approval is sent while it is down, and a restart finishes the run. Each asserts the
/// exact recovery: history, handler entries and side effects.
#[cfg(feature = "failpoints")]
mod failpoints {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    /// Runs the child until the fault point aborts it.
    fn abort_at(dir: &Path, failpoints: &str) {
        let (child, _rx) = spawn_child_with(dir, "", failpoints);
        let mut child = Killed(child);
        let status = child.0.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(6),
            "{failpoints}: expected SIGABRT, got {status:?}"
        );
    }

    async fn recover(dir: &Path) {
        approve(dir, "fp").await;
        let end = finish(dir, "");
        assert_eq!(
            end,
            r#"ended {"Done":{"receipt":"receipt-7","approver":"fp"}}"#
        );
        assert_eq!(history(dir), full_history());
    }

    #[tokio::test]
    async fn before_a_step_runs_its_effect() {
        let dir = tempfile::tempdir().unwrap();
        abort_at(dir.path(), "loops::step::before_effect=return");
        assert!(lines(dir.path(), "ledger").is_empty());
        recover(dir.path()).await;
        assert_eq!(lines(dir.path(), "ledger").len(), 1);
        assert_eq!(
            entries(dir.path()),
            counts(&[("Start 0", 1), ("Effect 1", 2), ("Approval 2", 1)])
        );
    }

    #[tokio::test]
    async fn after_a_step_effect_before_its_record() {
        let dir = tempfile::tempdir().unwrap();
        abort_at(dir.path(), "loops::step::after_effect=return");
        recover(dir.path()).await;
        let ledger = lines(dir.path(), "ledger");
        assert_eq!(ledger.len(), 2, "the one window: the effect ran again");
        assert_eq!(ledger[0], ledger[1], "with the same idempotency key");
        assert_eq!(
            entries(dir.path()),
            counts(&[("Start 0", 1), ("Effect 1", 2), ("Approval 2", 1)])
        );
    }

    /// A kill after the new store file was linked into place but before its temporary file
    /// was removed: the store is complete, and the next open removes the temporary file (it
    /// once stayed for good, as the existing store was opened without a sweep).
    #[tokio::test]
    async fn after_the_new_store_is_linked() {
        let dir = tempfile::tempdir().unwrap();
        abort_at(dir.path(), "loops::create::after_link=return");
        let leftovers = || -> Vec<String> {
            std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(".new-"))
                .collect()
        };
        assert_eq!(
            leftovers().len(),
            1,
            "the fault point leaves the temporary file"
        );
        let rt = Runtime::open(dir.path().join("store.redb")).unwrap();
        assert_eq!(leftovers(), Vec::<String>::new());
        assert!(rt.redb().unwrap().check_integrity().unwrap());
    }

    #[tokio::test]
    async fn after_a_step_record() {
        let dir = tempfile::tempdir().unwrap();
        abort_at(dir.path(), "loops::step::after_record=return");
        recover(dir.path()).await;
        assert_eq!(
            lines(dir.path(), "ledger").len(),
            1,
            "the recorded step replayed"
        );
        assert_eq!(
            entries(dir.path()),
            counts(&[("Start 0", 1), ("Effect 1", 2), ("Approval 2", 1)])
        );
    }

    #[tokio::test]
    async fn before_a_transition_commit() {
        let dir = tempfile::tempdir().unwrap();
        // The first transition (Start -> Effect) commits; the second aborts before its commit.
        abort_at(dir.path(), "loops::transition::before_commit=1*off->return");
        recover(dir.path()).await;
        assert_eq!(lines(dir.path(), "ledger").len(), 1);
        assert_eq!(
            entries(dir.path()),
            counts(&[("Start 0", 1), ("Effect 1", 2), ("Approval 2", 1)])
        );
    }

    #[tokio::test]
    async fn after_a_transition_commit() {
        let dir = tempfile::tempdir().unwrap();
        abort_at(dir.path(), "loops::transition::after_commit=1*off->return");
        recover(dir.path()).await;
        assert_eq!(lines(dir.path(), "ledger").len(), 1);
        // Effect's transition committed before the abort: Effect is not handled again.
        assert_eq!(
            entries(dir.path()),
            counts(&[("Start 0", 1), ("Effect 1", 1), ("Approval 2", 1)])
        );
    }

    #[tokio::test]
    async fn during_a_resume() {
        let dir = tempfile::tempdir().unwrap();
        kill_at(dir.path(), "after_step");
        abort_at(dir.path(), "loops::resume::after_read=return");
        recover(dir.path()).await;
        assert_eq!(lines(dir.path(), "ledger").len(), 1);
        assert_eq!(
            entries(dir.path()),
            counts(&[("Start 0", 1), ("Effect 1", 2), ("Approval 2", 1)])
        );
    }

    /// The run at `Effect`, its step recorded by version 1 (then killed); the version 2 build
    /// aborts at `point` of the migration; a restart of version 2 finishes the run. Exactly one
    /// migration record, the step never run again, the same idempotency key throughout.
    async fn migration_killed_at(point: &str, migrated_before_restart: bool) {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        kill_at(dir, "after_step");
        let (child, _rx) = spawn_version(dir, "", &format!("{point}=return"), "2");
        let status = Killed(child).0.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(6),
            "{point}: expected SIGABRT, got {status:?}"
        );
        let store = loops::RedbStore::open(dir.join("store.redb")).unwrap();
        let migrations = |store: &loops::RedbStore| {
            store
                .history("job")
                .unwrap()
                .into_iter()
                .filter(|r| r.migrated.is_some())
                .count()
        };
        assert_eq!(
            migrations(&store),
            usize::from(migrated_before_restart),
            "{point}"
        );
        drop(store);
        approve(dir, "fp").await;
        let (child, rx) = spawn_version(dir, "", "", "2");
        let mut child = Killed(child);
        assert_eq!(
            expect_line(&rx, "ended "),
            r#"ended {"Done":{"receipt":"receipt-7","approver":"fp"}}"#
        );
        child.0.wait().unwrap();
        let store = loops::RedbStore::open(dir.join("store.redb")).unwrap();
        let history: Vec<(u64, String, Option<u64>)> = store
            .history("job")
            .unwrap()
            .into_iter()
            .map(|r| (r.seq, r.state, r.migrated.map(|m| m.seq)))
            .collect();
        let expected: Vec<(u64, String, Option<u64>)> = [
            (0, "Start", None),
            (1, "Effect", None),
            (2, "Effect", Some(1)),
            (3, "Approval", None),
            (4, "Done", None),
        ]
        .into_iter()
        .map(|(seq, state, from)| (seq, state.to_owned(), from))
        .collect();
        assert_eq!(history, expected, "{point}");
        assert_eq!(migrations(&store), 1);
        let ledger = lines(dir, "ledger");
        assert_eq!(ledger.len(), 1, "{point}: the step ran again: {ledger:?}");
        let keys = lines(dir, "keys");
        assert_eq!(keys.len(), 2, "{point}: {keys:?}");
        assert_eq!(keys[0], keys[1], "{point}: the key changed");
        assert!(ledger[0].starts_with(&keys[0]));
        assert_eq!(
            entries(dir),
            counts(&[
                ("Start 0", 1),
                ("Effect 1", 1),
                // Version 2 handles the migrated state under its seq, 1.
                ("v2 Effect 1", 1),
                ("v2 Approval 3", 1),
            ])
        );
    }

    #[tokio::test]
    async fn before_a_migration_commit() {
        migration_killed_at("loops::migrate::before_commit", false).await;
    }

    #[tokio::test]
    async fn after_a_migration_commit() {
        migration_killed_at("loops::migrate::after_commit", true).await;
    }

    #[tokio::test]
    async fn after_the_writer_commits_before_it_answers() {
        let dir = tempfile::tempdir().unwrap();
        // Commits: the run's creation, Start -> Effect, then the step's record, whose caller
        // never hears back.
        abort_at(dir.path(), "loops::writer::after_commit=2*off->return");
        recover(dir.path()).await;
        assert_eq!(
            lines(dir.path(), "ledger").len(),
            1,
            "the step's record was durable"
        );
        assert_eq!(
            entries(dir.path()),
            counts(&[("Start 0", 1), ("Effect 1", 2), ("Approval 2", 1)])
        );
    }
}

#[tokio::test]
async fn a_sealed_run_killed_after_a_step_record_resumes_and_stores_nothing_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    let sealed = [("LOOPS_SEALED", "1")];
    {
        let (child, rx) = spawn_child_env(dir.path(), "after_step", "", &sealed);
        let _child = Killed(child);
        expect_line(&rx, "holding after_step");
    }
    let runtime = Runtime::builder()
        .codec(sealing_keys())
        .open(dir.path().join("store.redb"))
        .unwrap();
    runtime
        .send("job", "approve", "secret-approver")
        .await
        .unwrap();
    drop(runtime);
    let (child, rx) = spawn_child_env(dir.path(), "", "", &sealed);
    let mut child = Killed(child);
    let end = expect_line(&rx, "ended ");
    child.0.wait().unwrap();
    assert_eq!(
        end,
        r#"ended {"Done":{"receipt":"receipt-7","approver":"secret-approver"}}"#
    );
    assert_eq!(
        lines(dir.path(), "ledger").len(),
        1,
        "the recorded step ran again"
    );
    assert_eq!(
        entries(dir.path()),
        counts(&[("Start 0", 1), ("Effect 1", 2), ("Approval 2", 1)])
    );
    assert_eq!(history(dir.path()), full_history());
    let bytes = std::fs::read(dir.path().join("store.redb")).unwrap();
    for secret in [&b"receipt-7"[..], b"secret-approver"] {
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret),
            "{} is in the file in clear",
            String::from_utf8_lossy(secret)
        );
    }
}
