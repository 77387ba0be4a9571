//! Steps that agents need: retries in place, permanent errors and retry-after hints, the
//! attempt budget seen from a handler, error values recorded as data, and the ergonomics of
//! step closures (inferred error types, keys the future borrows, names built in a loop).
//! Every test counts tries, transitions and side effects exactly.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use loops::{
    Context, Error, FailureSource, RetryPolicy, RunStatus, Runtime, StepOptions, Workflow,
};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "steps")]
enum Agent {
    #[initial]
    #[next(Done, GaveUp)]
    Call { fail_tries: u32 },
    #[terminal]
    Done { answer: String },
    #[terminal]
    GaveUp { reason: String },
}

/// What the handler does in `Call`, and what it saw.
#[derive(Default)]
struct Probe {
    /// Executions of the handler.
    entries: AtomicU32,
    /// Runs of the `before` step's closure (a step that succeeds at once).
    before: AtomicU32,
    /// Tries of the `call` step's closure.
    tries: AtomicU32,
    /// Mark the `call` step's error permanent.
    permanent: bool,
    /// Fail the `call` step with one of loops' errors that repeat at every try
    /// ([`Error::repeats`]).
    repeats: bool,
    /// A retry-after hint on the `call` step's error.
    retry_after: Option<Duration>,
    /// The step's retry policy (none: one try).
    policy: Option<RetryPolicy>,
    /// Route to `GaveUp` on the state's last attempt instead of failing.
    route_on_last: bool,
    /// `(attempt, attempts_left, is_last_attempt)` per execution.
    budget: Mutex<Vec<(u32, u32, bool)>>,
}

impl AgentHandler for Probe {
    type Error = anyhow::Error;

    async fn call(&self, ctx: &Context, fail_tries: u32) -> Result<CallNext, Self::Error> {
        self.entries.fetch_add(1, Ordering::SeqCst);
        self.budget.lock().unwrap().push((
            ctx.attempt(),
            ctx.attempts_left(),
            ctx.is_last_attempt(),
        ));
        // No annotation: the closure's error type is fixed (`BoxError`), so `Ok` infers.
        let prompt: String = ctx
            .step("before", || async {
                self.before.fetch_add(1, Ordering::SeqCst);
                Ok("prompt".to_owned())
            })
            .await?;
        let mut options = StepOptions::default();
        if let Some(policy) = self.policy {
            options = options.with_retry(policy);
        }
        let answer = ctx
            .step_with("call", options, || async {
                let n = self.tries.fetch_add(1, Ordering::SeqCst) + 1;
                if n <= fail_tries {
                    let err = std::io::Error::other(format!("try {n} failed"));
                    return Err(if self.repeats {
                        Error::NotRegistered {
                            workflow: format!("nobody (try {n})"),
                        }
                        .into()
                    } else if self.permanent {
                        Error::permanent(err).into()
                    } else if let Some(after) = self.retry_after {
                        Error::retry_after(err, after).into()
                    } else {
                        err.into()
                    });
                }
                Ok(format!("answer to {prompt} after {n} tries"))
            })
            .await;
        match answer {
            Ok(answer) => Ok(CallNext::Done { answer }),
            Err(e) if self.route_on_last && (ctx.is_last_attempt() || e.hint().permanent) => {
                Ok(CallNext::GaveUp { reason: e.chain() })
            }
            Err(e) => Err(e.into()),
        }
    }
}

fn fast(attempts: u32) -> RetryPolicy {
    RetryPolicy::attempts(attempts)
        .with_delays(Duration::from_millis(5), Duration::from_millis(20))
        .with_jitter(0.0)
}

fn runtime(dir: &tempfile::TempDir, state_attempts: u32) -> Runtime {
    Runtime::builder()
        .retry(fast(state_attempts))
        .open(dir.path().join("store.redb"))
        .unwrap()
}

/// The failures recorded for `run`: (seq, attempt, source, errors).
async fn failures(rt: &Runtime, run: &str) -> Vec<(u64, u32, String, String)> {
    rt.store()
        .failures(run)
        .await
        .unwrap()
        .into_iter()
        .map(|(seq, f)| {
            let source = match f.source {
                FailureSource::Step { name, occurrence } => format!("step {name}#{occurrence}"),
                other => format!("{other:?}"),
            };
            (seq, f.attempt, source, f.errors.join(": "))
        })
        .collect()
}

/// The states of `run`'s history.
async fn states(rt: &Runtime, run: &str) -> Vec<String> {
    rt.store()
        .history(run)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.state)
        .collect()
}

/// The step records of `run` at `seq`: name#occurrence to output.
async fn steps(rt: &Runtime, run: &str, seq: u64) -> BTreeMap<String, String> {
    rt.store()
        .steps(run, seq)
        .await
        .unwrap()
        .into_iter()
        .map(|(name, occ, r)| (format!("{name}#{occ}"), r.output.get().to_owned()))
        .collect()
}

#[tokio::test]
async fn a_step_retried_in_place_records_each_try_and_commits_one_transition() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir, 1);
    let probe = Probe {
        policy: Some(fast(4)),
        ..Probe::default()
    };
    let done = rt
        .run("r", Agent::Call { fail_tries: 2 }, &probe)
        .await
        .unwrap();
    assert_eq!(
        done,
        Agent::Done {
            answer: "answer to prompt after 3 tries".into()
        }
    );
    // One execution of the handler (a state budget of 1 attempt would have failed the run
    // otherwise), the other step run once, three tries.
    assert_eq!(probe.entries.load(Ordering::SeqCst), 1);
    assert_eq!(probe.before.load(Ordering::SeqCst), 1);
    assert_eq!(probe.tries.load(Ordering::SeqCst), 3);
    assert_eq!(states(&rt, "r").await, ["Call", "Done"]);
    assert_eq!(
        failures(&rt, "r").await,
        vec![
            (0, 1, "step call#0".into(), "try 1 failed".into()),
            (0, 1, "step call#0".into(), "try 2 failed".into()),
        ]
    );
    let recorded = steps(&rt, "r", 0).await;
    let keys: Vec<&str> = recorded.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "before#0",
            "call#0",
            "loops:try:0:call#0",
            "loops:try:0:call#1"
        ]
    );
    assert!(recorded["loops:try:0:call#0"].starts_with(r#"{"try":1,"retry_at_ms":"#));
    assert!(recorded["loops:try:0:call#1"].starts_with(r#"{"try":2,"retry_at_ms":"#));
    let info = rt.run_info("r").await.unwrap().unwrap();
    assert_eq!((info.status, info.attempt), (RunStatus::Completed, 1));
}

#[tokio::test]
async fn a_step_out_of_tries_fails_the_attempt_and_the_next_attempt_starts_a_fresh_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir, 2);
    let probe = Probe {
        policy: Some(fast(2)),
        ..Probe::default()
    };
    // 2 tries per attempt, 2 attempts: tries 1-2 fail in attempt 1, 3 fails and 4
    // succeeds in attempt 2.
    let done = rt
        .run("r", Agent::Call { fail_tries: 3 }, &probe)
        .await
        .unwrap();
    assert_eq!(
        done,
        Agent::Done {
            answer: "answer to prompt after 4 tries".into()
        }
    );
    assert_eq!(probe.entries.load(Ordering::SeqCst), 2);
    assert_eq!(
        probe.before.load(Ordering::SeqCst),
        1,
        "replayed on attempt 2"
    );
    assert_eq!(probe.tries.load(Ordering::SeqCst), 4);
    let f = failures(&rt, "r").await;
    let summary: Vec<(u32, &str)> = f.iter().map(|(_, a, s, _)| (*a, s.as_str())).collect();
    assert_eq!(
        summary,
        [
            (1, "step call#0"),
            (1, "step call#0"),
            (1, "Handler"),
            (2, "step call#0")
        ]
    );
    assert_eq!(
        f[2].3,
        "run `r`: step `call`#0 of state `Call` (seq 0) failed after 2 tries: try 2 failed"
    );
    let recorded = steps(&rt, "r", 0).await;
    assert_eq!(
        recorded["loops:try:0:call#1"],
        r#"{"try":2,"retry_at_ms":null}"#
    );
    assert!(recorded["loops:try:0:call#2"].starts_with(r#"{"try":1,"retry_at_ms":"#));
    assert_eq!(states(&rt, "r").await, ["Call", "Done"]);
}

/// Runs `probe` (its `call` step failing at every try, with 5 tries for the step and 5
/// attempts for the state) and checks the run failed after one try of one execution: returns
/// the error of the step's failure record, and checks the handler's record after it.
async fn fails_after_one_try(probe: Probe) -> String {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir, 5);
    let probe = Probe {
        policy: Some(fast(5)),
        ..probe
    };
    let err = rt
        .run("r", Agent::Call { fail_tries: 10 }, &probe)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::RunFailed { attempts: 1, .. }),
        "{err}"
    );
    assert_eq!(probe.entries.load(Ordering::SeqCst), 1);
    assert_eq!(probe.tries.load(Ordering::SeqCst), 1);
    let f = failures(&rt, "r").await;
    assert_eq!(f.len(), 2, "{f:?}");
    assert_eq!(
        (f[0].2.as_str(), f[1].2.as_str()),
        ("step call#0", "Handler")
    );
    assert_eq!(states(&rt, "r").await, ["Call"]);
    assert_eq!(
        rt.run_info("r").await.unwrap().unwrap().status,
        RunStatus::Failed
    );
    f[0].3.clone()
}

#[tokio::test]
async fn a_permanent_error_is_retried_neither_by_the_step_nor_by_the_state() {
    let probe = Probe {
        permanent: true,
        ..Probe::default()
    };
    assert_eq!(
        fails_after_one_try(probe).await,
        "permanent error, not retried: try 1 failed"
    );
}

/// One of loops' own errors that comes out the same at every try (`Error::repeats`) is
/// permanent to a step's retries as to the state's: one try, one execution.
#[tokio::test]
async fn an_error_that_repeats_is_retried_neither_by_the_step_nor_by_the_state() {
    let probe = Probe {
        repeats: true,
        ..Probe::default()
    };
    assert_eq!(
        fails_after_one_try(probe).await,
        "no handler is registered for workflow `nobody (try 1)`"
    );
}

#[tokio::test]
async fn a_permanent_error_goes_where_the_handler_routes_it_after_one_try() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir, 5);
    let probe = Probe {
        policy: Some(fast(5)),
        permanent: true,
        route_on_last: true,
        ..Probe::default()
    };
    let done = rt
        .run("r", Agent::Call { fail_tries: 10 }, &probe)
        .await
        .unwrap();
    assert_eq!(
        done,
        Agent::GaveUp {
            reason: "run `r`: step `call`#0 of state `Call` (seq 0) failed after 1 try: \
                     permanent error, not retried: try 1 failed"
                .into()
        }
    );
    assert_eq!(probe.tries.load(Ordering::SeqCst), 1);
    assert_eq!(states(&rt, "r").await, ["Call", "GaveUp"]);
}

#[tokio::test]
async fn a_handler_routes_to_its_own_failure_state_on_its_last_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir, 3);
    let probe = Probe {
        route_on_last: true,
        ..Probe::default()
    };
    let done = rt
        .run("r", Agent::Call { fail_tries: 10 }, &probe)
        .await
        .unwrap();
    assert_eq!(
        done,
        Agent::GaveUp {
            reason: "run `r`: step `call`#0 of state `Call` (seq 0) failed after 1 try: \
                     try 3 failed"
                .into()
        }
    );
    assert_eq!(
        *probe.budget.lock().unwrap(),
        [(1, 2, false), (2, 1, false), (3, 0, true)]
    );
    assert_eq!(probe.tries.load(Ordering::SeqCst), 3);
    assert_eq!(states(&rt, "r").await, ["Call", "GaveUp"]);
    let sources: Vec<String> = failures(&rt, "r").await.into_iter().map(|f| f.2).collect();
    assert_eq!(
        sources,
        [
            "step call#0",
            "Handler",
            "step call#0",
            "Handler",
            "step call#0"
        ]
    );
}

#[tokio::test]
async fn a_retry_after_hint_sets_the_time_of_the_next_try() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir, 1);
    let probe = Probe {
        policy: Some(fast(3)),
        retry_after: Some(Duration::from_millis(300)),
        ..Probe::default()
    };
    rt.run("r", Agent::Call { fail_tries: 1 }, &probe)
        .await
        .unwrap();
    assert_eq!(probe.tries.load(Ordering::SeqCst), 2);
    let store = rt.store();
    let failure_at = store.failures("r").await.unwrap()[0].1.at_ms;
    let recorded = store.steps("r", 0).await.unwrap();
    let schedule = recorded
        .iter()
        .find(|(name, _, _)| name == "loops:try:0:call")
        .unwrap();
    let next: serde_json::Value = serde_json::from_str(schedule.2.output.get()).unwrap();
    let retry_at = next["retry_at_ms"].as_u64().unwrap();
    // The policy's back-off is 5 ms; the hint makes it 300 ms, counted from the failure.
    assert!(retry_at >= failure_at + 300 - 1, "{retry_at} {failure_at}");
    let call = recorded.iter().find(|(name, _, _)| name == "call").unwrap();
    assert!(call.2.at_ms >= retry_at, "the next try waited for its time");
}

#[tokio::test]
async fn a_state_level_retry_after_hint_sets_the_retry_time() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir, 2);
    let probe = Probe {
        retry_after: Some(Duration::from_millis(400)),
        ..Probe::default()
    };
    rt.run("r", Agent::Call { fail_tries: 1 }, &probe)
        .await
        .unwrap();
    assert_eq!(probe.entries.load(Ordering::SeqCst), 2);
    let f = rt.store().failures("r").await.unwrap();
    let handler_failed_at = f[1].1.at_ms;
    let second_try_at = rt
        .store()
        .steps("r", 0)
        .await
        .unwrap()
        .into_iter()
        .find(|(name, _, _)| name == "call")
        .unwrap()
        .2
        .at_ms;
    assert!(
        second_try_at >= handler_failed_at + 400,
        "{second_try_at} {handler_failed_at}"
    );
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "review")]
enum Review {
    #[initial]
    #[next(Merged, Rejected)]
    Ask,
    #[terminal]
    Merged,
    #[terminal]
    Rejected { why: String },
}

/// An API's refusal, recorded as data.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum ApiError {
    NotFound,
    Refused(String),
}

#[derive(Default)]
struct Reviewer {
    calls: AtomicU32,
    entries: AtomicU32,
}

impl ReviewHandler for Reviewer {
    type Error = loops::Error;

    async fn ask(&self, ctx: &Context) -> Result<AskNext, Self::Error> {
        self.entries.fetch_add(1, Ordering::SeqCst);
        let answer: Result<String, ApiError> = ctx
            .step("review", || async {
                let n = self.calls.fetch_add(1, Ordering::SeqCst);
                // The first call is refused, later ones would succeed: a replay must not ask.
                Ok(if n == 0 {
                    Err(ApiError::Refused("tests fail".into()))
                } else {
                    Ok("lgtm".into())
                })
            })
            .await?;
        if ctx.attempt() == 1 {
            // Fails after the step: the next attempt replays the recorded `Err`.
            return Err(Error::retry_after("flaky after the step", Duration::ZERO));
        }
        Ok(match answer {
            Ok(_) => AskNext::Merged,
            Err(ApiError::Refused(why)) => AskNext::Rejected { why },
            Err(ApiError::NotFound) => AskNext::Rejected {
                why: "not found".into(),
            },
        })
    }
}

#[tokio::test]
async fn an_error_returned_as_the_output_is_recorded_and_replays_the_same_branch() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir, 3);
    let reviewer = Reviewer::default();
    let done = rt.run("r", Review::Ask, &reviewer).await.unwrap();
    assert_eq!(
        done,
        Review::Rejected {
            why: "tests fail".into()
        }
    );
    assert_eq!(reviewer.entries.load(Ordering::SeqCst), 2);
    assert_eq!(reviewer.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        steps(&rt, "r", 0).await,
        BTreeMap::from([(
            "review#0".to_owned(),
            r#"{"Err":{"Refused":"tests fail"}}"#.to_owned()
        )])
    );
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "fanout")]
enum Fanout {
    #[initial]
    #[next(Sent)]
    Send { items: Vec<String> },
    #[terminal]
    Sent { receipts: Vec<String> },
}

/// An outside system that takes an idempotency key by reference.
#[derive(Default)]
struct Outbox {
    sent: Mutex<Vec<(String, String)>>,
}

impl Outbox {
    async fn send(&self, item: &str, key: &str) -> Result<String, std::io::Error> {
        self.sent
            .lock()
            .unwrap()
            .push((item.to_owned(), key.to_owned()));
        Ok(format!("{item}@{}", &key[..7]))
    }
}

impl FanoutHandler for Outbox {
    type Error = anyhow::Error;

    async fn send(&self, ctx: &Context, items: Vec<String>) -> Result<SendNext, Self::Error> {
        // Names built in a loop, steps run concurrently; each future borrows its key.
        let steps = items.iter().map(|item| {
            ctx.step_keyed(format!("send:{item}"), move |key| async move {
                Ok(self.send(item, key).await?)
            })
        });
        let receipts = futures_util::future::try_join_all(steps).await?;
        // The key alone, borrowed by a future: `send` takes `&str`.
        let again: String = ctx
            .step_keyed("send:again", |key| {
                let sent = self.send("again", key);
                async move { Ok(sent.await?) }
            })
            .await?;
        let mut receipts = receipts;
        receipts.push(again);
        Ok(SendNext::Sent { receipts })
    }
}

#[tokio::test]
async fn keyed_steps_borrow_their_keys_and_names_come_from_a_loop() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir, 1);
    let outbox = Outbox::default();
    let items = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
    let done = rt.run("r", Fanout::Send { items }, &outbox).await.unwrap();
    let sent = outbox.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 4);
    let Fanout::Sent { receipts } = done else {
        panic!("{done:?}")
    };
    let expected: Vec<String> = sent
        .iter()
        .map(|(item, key)| format!("{item}@{}", &key[..7]))
        .collect();
    let mut sorted = receipts.clone();
    sorted.sort();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(sorted, expected_sorted);
    let keys: std::collections::BTreeSet<&str> = sent.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(keys.len(), 4, "each step has its own key");
    assert!(keys.iter().all(|k| k.len() == 35 && k.starts_with("lk-")));
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "stale")]
enum Change {
    #[initial]
    #[next(Approved)]
    Planning,
    #[terminal]
    Approved { plan: Plan },
}

/// A plan made against a commit of the repository.
#[derive(Serialize, Deserialize, loops::Schema, Debug, Clone, PartialEq)]
struct Plan {
    base: u32,
    key: String,
}

/// A repository whose HEAD moves while a run waits for approval, and a planner.
#[derive(Default)]
struct Planner {
    head: std::sync::Arc<AtomicU32>,
    plans: AtomicU32,
    keys: Mutex<Vec<String>>,
    /// Fail once after the approval, so that a retry replays the plan step again.
    fail_after_approval: std::sync::atomic::AtomicBool,
    /// The plan step's record is valid for this long (none: checked against HEAD instead).
    valid_for: Option<Duration>,
}

impl ChangeHandler for Planner {
    type Error = anyhow::Error;

    async fn planning(&self, ctx: &Context) -> Result<PlanningNext, Self::Error> {
        let head = std::sync::Arc::clone(&self.head);
        let options = match self.valid_for {
            Some(age) => StepOptions::default().valid_for(age),
            // Still valid while the repository's HEAD is the commit it was planned against.
            None => StepOptions::default().revalidate(move |plan: Plan| {
                let head = std::sync::Arc::clone(&head);
                async move { head.load(Ordering::SeqCst) == plan.base }
            }),
        };
        let plan: Plan = ctx
            .step_keyed_with("plan", options, |key| async move {
                self.plans.fetch_add(1, Ordering::SeqCst);
                self.keys.lock().unwrap().push(key.to_owned());
                Ok(Plan {
                    base: self.head.load(Ordering::SeqCst),
                    key: key.to_owned(),
                })
            })
            .await?;
        let _: String = ctx.wait_for("approve").await?;
        if self.fail_after_approval.swap(false, Ordering::SeqCst) {
            anyhow::bail!("fails once after the approval");
        }
        Ok(PlanningNext::Approved { plan })
    }
}

/// Drives a `Change` run attached, moves HEAD to `moved_to` (if any) while it waits for the
/// approval, approves it, and returns the final state and the planner.
async fn plan_and_approve(
    planner: Planner,
    moved_to: Option<u32>,
    wait_before_approving: Duration,
) -> (Change, std::sync::Arc<Planner>, BTreeMap<String, String>) {
    let dir = tempfile::tempdir().unwrap();
    let rt = std::sync::Arc::new(runtime(&dir, 3));
    planner.head.store(1, Ordering::SeqCst);
    let planner = std::sync::Arc::new(planner);
    let driven = {
        let (rt, planner) = (std::sync::Arc::clone(&rt), std::sync::Arc::clone(&planner));
        tokio::spawn(async move { rt.run("r", Change::Planning, &*planner).await })
    };
    rt.wait_for_status("r", RunStatus::Waiting).await.unwrap();
    if let Some(head) = moved_to {
        planner.head.store(head, Ordering::SeqCst);
    }
    tokio::time::sleep(wait_before_approving).await;
    rt.send("r", "approve", "ann").await.unwrap();
    let done = driven.await.unwrap().unwrap();
    let recorded = steps(&rt, "r", 0).await;
    (done, planner, recorded)
}

#[tokio::test]
async fn a_plan_whose_repository_moved_on_runs_again_once_with_a_key_of_its_own() {
    let planner = Planner {
        fail_after_approval: true.into(),
        ..Planner::default()
    };
    let (done, planner, recorded) = plan_and_approve(planner, Some(2), Duration::ZERO).await;
    let keys = planner.keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1], "the new occurrence has a fresh key");
    assert_eq!(
        done,
        Change::Approved {
            plan: Plan {
                base: 2,
                key: keys[1].clone()
            }
        }
    );
    // Planned at HEAD 1; stale when the run woke at HEAD 2; planned again; the retry after
    // the failure replayed the new plan (still fresh) and did not check the old one again.
    assert_eq!(planner.plans.load(Ordering::SeqCst), 2);
    let names: Vec<&str> = recorded.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "loops:redo:1:plan#0",
            "loops:stale:0:plan#0",
            "loops:wait:approve#0",
            "plan#0"
        ]
    );
    assert_eq!(
        recorded["plan#0"],
        format!(r#"{{"base":1,"key":"{}"}}"#, keys[0])
    );
    assert_eq!(
        recorded["loops:redo:1:plan#0"],
        format!(r#"{{"base":2,"key":"{}"}}"#, keys[1])
    );
    let why: serde_json::Value = serde_json::from_str(&recorded["loops:stale:0:plan#0"]).unwrap();
    assert_eq!(
        (why["generation"].as_u64(), why["why"].as_str()),
        (
            Some(0),
            Some("its revalidation check says it no longer holds")
        )
    );
}

#[tokio::test]
async fn a_plan_that_still_holds_replays() {
    let (done, planner, recorded) =
        plan_and_approve(Planner::default(), None, Duration::ZERO).await;
    assert_eq!(planner.plans.load(Ordering::SeqCst), 1);
    let Change::Approved { plan } = done else {
        panic!("{done:?}")
    };
    assert_eq!(plan.base, 1);
    let names: Vec<&str> = recorded.keys().map(String::as_str).collect();
    assert_eq!(names, ["loops:wait:approve#0", "plan#0"]);
}

#[tokio::test]
async fn a_step_older_than_its_validity_runs_again_once() {
    let planner = Planner {
        valid_for: Some(Duration::from_millis(20)),
        ..Planner::default()
    };
    // The approval comes 60 ms after the plan: older than its 20 ms.
    let (_, planner, recorded) = plan_and_approve(planner, None, Duration::from_millis(60)).await;
    assert_eq!(planner.plans.load(Ordering::SeqCst), 2);
    let why: serde_json::Value = serde_json::from_str(&recorded["loops:stale:0:plan#0"]).unwrap();
    let why = why["why"].as_str().unwrap();
    assert!(
        why.starts_with("recorded ") && why.ends_with(" ms ago, valid for 20 ms"),
        "{why}"
    );
    assert!(recorded.contains_key("loops:redo:1:plan#0"));
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "limited")]
enum Limited {
    #[initial]
    #[next(Finished)]
    Query { n: u32 },
    #[terminal]
    Finished { n: u32 },
}

/// A model behind the limit "model": counts the calls inside it (outside the store).
#[derive(Default)]
struct Shared {
    inside: AtomicU32,
    most: AtomicU32,
    calls: AtomicU32,
    starts: Mutex<Vec<std::time::Instant>>,
    /// Calls wait for this before they return (none: 10 ms).
    hold: Option<tokio::sync::Semaphore>,
}

impl LimitedHandler for Shared {
    type Error = loops::Error;

    async fn query(&self, ctx: &Context, n: u32) -> Result<QueryNext, Self::Error> {
        let n: u32 = ctx
            .step_with(
                "model",
                StepOptions::default().with_limit("model"),
                || async {
                    self.starts.lock().unwrap().push(std::time::Instant::now());
                    let inside = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
                    self.most.fetch_max(inside, Ordering::SeqCst);
                    self.calls.fetch_add(1, Ordering::SeqCst);
                    match &self.hold {
                        Some(hold) => drop(hold.acquire().await),
                        None => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                    self.inside.fetch_sub(1, Ordering::SeqCst);
                    Ok(n * 2)
                },
            )
            .await?;
        Ok(QueryNext::Finished { n })
    }
}

fn limited_runtime(dir: &tempfile::TempDir, limit: loops::Limit) -> std::sync::Arc<Runtime> {
    std::sync::Arc::new(
        Runtime::builder()
            .retry(fast(1))
            .limit("model", limit)
            .open(dir.path().join("store.redb"))
            .unwrap(),
    )
}

/// Drives `runs` runs of `Limited` at once; returns their final states.
async fn drive_all(rt: &std::sync::Arc<Runtime>, shared: &std::sync::Arc<Shared>, runs: u32) {
    let tasks: Vec<_> = (0..runs)
        .map(|i| {
            let (rt, shared) = (std::sync::Arc::clone(rt), std::sync::Arc::clone(shared));
            tokio::spawn(async move {
                rt.run(&format!("r{i}"), Limited::Query { n: i }, &*shared)
                    .await
            })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let done = task.await.unwrap().unwrap();
        assert_eq!(done, Limited::Finished { n: 2 * i as u32 });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limit_of_two_holds_across_twenty_runs() {
    let dir = tempfile::tempdir().unwrap();
    let rt = limited_runtime(&dir, loops::Limit::concurrent(2));
    let shared = std::sync::Arc::new(Shared::default());
    drive_all(&rt, &shared, 20).await;
    assert_eq!(shared.calls.load(Ordering::SeqCst), 20);
    assert_eq!(shared.most.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_limit_starts_at_most_n_tries_per_period() {
    let dir = tempfile::tempdir().unwrap();
    let period = Duration::from_millis(100);
    let rt = limited_runtime(&dir, loops::Limit::rate(3, period));
    let shared = std::sync::Arc::new(Shared::default());
    drive_all(&rt, &shared, 7).await;
    let mut starts = shared.starts.lock().unwrap().clone();
    starts.sort();
    assert_eq!(starts.len(), 7);
    // Any 4 consecutive starts span at least the period: never 4 inside one window. The
    // limit keeps its starts in whole ms of the clock (`Limit::admit`), so two starts a
    // period apart by it may be up to 1 ms less apart by `Instant`.
    let resolution = Duration::from_millis(1);
    for w in starts.windows(4) {
        assert!(
            w[3].duration_since(w[0]) + resolution >= period,
            "{:?}",
            w[3].duration_since(w[0])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_waiting_for_its_limit_is_cancelled_with_its_run() {
    let dir = tempfile::tempdir().unwrap();
    let rt = limited_runtime(&dir, loops::Limit::concurrent(1));
    let shared = std::sync::Arc::new(Shared {
        hold: Some(tokio::sync::Semaphore::new(0)),
        ..Shared::default()
    });
    let first = {
        let (rt, shared) = (std::sync::Arc::clone(&rt), std::sync::Arc::clone(&shared));
        tokio::spawn(async move { rt.run("holder", Limited::Query { n: 1 }, &*shared).await })
    };
    while shared.calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let second = {
        let (rt, shared) = (std::sync::Arc::clone(&rt), std::sync::Arc::clone(&shared));
        tokio::spawn(async move { rt.run("waiter", Limited::Query { n: 2 }, &*shared).await })
    };
    rt.wait_until("waiter", |_| true).await.unwrap();
    // Time to reach the limit and wait there (were it not, the step would not start after
    // the cancellation either: the count below holds both ways).
    tokio::time::sleep(Duration::from_millis(50)).await;
    rt.cancel("waiter", "no longer needed").await.unwrap();
    let err = second.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::RunCancelled { .. }), "{err}");
    // The waiter never got in; the holder still holds the limit, then finishes.
    assert_eq!(shared.calls.load(Ordering::SeqCst), 1);
    shared.hold.as_ref().unwrap().add_permits(1);
    assert_eq!(first.await.unwrap().unwrap(), Limited::Finished { n: 2 });
    assert_eq!(shared.calls.load(Ordering::SeqCst), 1);
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "unrecordable")]
enum Unrecordable {
    #[initial]
    #[next(Kept)]
    Produce { big: bool },
    #[terminal]
    Kept { bytes: usize },
}

/// Counts the effects of a step whose output cannot be recorded: too large when `big`, not
/// encodable as JSON (a map with non-string keys) otherwise. Returns `anyhow::Error`, as most
/// handlers do.
#[derive(Default)]
struct Producer {
    effects: AtomicU32,
}

impl UnrecordableHandler for Producer {
    type Error = anyhow::Error;

    async fn produce(&self, ctx: &Context, big: bool) -> anyhow::Result<ProduceNext> {
        let bytes = if big {
            let out: String = ctx
                .step("transcript", || async {
                    self.effects.fetch_add(1, Ordering::SeqCst);
                    Ok("y".repeat(4096))
                })
                .await?;
            out.len()
        } else {
            let out: BTreeMap<(u32, u32), u32> = ctx
                .step("pairs", || async {
                    self.effects.fetch_add(1, Ordering::SeqCst);
                    Ok(BTreeMap::from([((1, 2), 3)]))
                })
                .await?;
            out.len()
        };
        Ok(ProduceNext::Kept { bytes })
    }
}

/// A step whose output cannot be recorded has run its effect, and every further try would
/// run it again for a record that cannot be made: the run fails at its first attempt, the
/// effect ran once (it ran at each of the state's 3 attempts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_output_that_cannot_be_recorded_fails_the_run_at_once() {
    let rt = Runtime::builder()
        .max_payload_bytes(1024)
        .retry(fast(3))
        .build(loops::RedbStore::in_memory().unwrap());
    for (id, big, error) in [
        (
            "big",
            true,
            "run `big`: output of step `transcript`#0 at seq 0 is 4098 bytes, over the 1024-byte limit",
        ),
        (
            "pairs",
            false,
            "run `pairs`: output of step `pairs`#0 of state `Produce` (seq 0) cannot be encoded as JSON that decodes back",
        ),
    ] {
        let producer = Producer::default();
        let err = rt
            .run(id, Unrecordable::Produce { big }, &producer)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::RunFailed { .. }), "{id}: {err:?}");
        assert_eq!(producer.effects.load(Ordering::SeqCst), 1, "{id}");
        let info = rt.run_info(id).await.unwrap().unwrap();
        assert_eq!((info.status, info.attempt), (RunStatus::Failed, 1), "{id}");
        let errors = info.error.unwrap();
        assert_eq!(errors[0], error, "{id}: {errors:?}");
        assert!(rt.store().steps(id, 0).await.unwrap().is_empty(), "{id}");
    }
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "lossy")]
enum Lossy {
    #[initial]
    #[next(Measured)]
    Measure { step: bool },
    #[terminal]
    Measured { x: f64 },
}

/// Measures a NaN, which JSON writes as `null`: as a step's output (`step`), or straight into
/// the next state's data. Counts its measurements.
#[derive(Default)]
struct Measurer {
    effects: AtomicU32,
}

impl LossyHandler for Measurer {
    type Error = anyhow::Error;

    async fn measure(&self, ctx: &Context, step: bool) -> anyhow::Result<MeasureNext> {
        let x = if step {
            ctx.step("measure", || async {
                self.effects.fetch_add(1, Ordering::SeqCst);
                Ok(f64::NAN)
            })
            .await?
        } else {
            self.effects.fetch_add(1, Ordering::SeqCst);
            f64::NAN
        };
        Ok(MeasureNext::Measured { x })
    }
}

/// A step output or a state whose JSON does not decode back (a NaN float is written as
/// `null`) is refused before it is recorded: the run fails at its first attempt, saying why,
/// with nothing recorded. (A NaN step output failed every replay; a NaN state was committed,
/// and the run was driven again every second, forever, unable to read it: helper-107.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_does_not_decode_back_is_not_recorded() {
    let rt = Runtime::builder()
        .retry(fast(3))
        .build(loops::RedbStore::in_memory().unwrap());
    for (id, step, error, cause) in [
        (
            "nan-step",
            true,
            "run `nan-step`: output of step `measure`#0 of state `Measure` (seq 0) cannot be encoded as JSON that decodes back",
            "invalid type: null, expected f64 at line 1 column 4",
        ),
        (
            "nan-state",
            false,
            "run `nan-state`: cannot encode state `Measured` (seq 1) as JSON that decodes back",
            "invalid type: null, expected f64 at line 1 column 21",
        ),
    ] {
        let measurer = Measurer::default();
        let err = rt
            .run(id, Lossy::Measure { step }, &measurer)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::RunFailed { .. }), "{id}: {err:?}");
        assert_eq!(measurer.effects.load(Ordering::SeqCst), 1, "{id}");
        let info = rt.run_info(id).await.unwrap().unwrap();
        assert_eq!(
            (info.status, info.seq, info.attempt),
            (RunStatus::Failed, 0, 1),
            "{id}"
        );
        let errors = info.error.unwrap();
        assert_eq!(errors, [error, cause], "{id}");
        assert!(rt.store().steps(id, 0).await.unwrap().is_empty(), "{id}");
        assert_eq!(rt.history::<Lossy>(id).await.unwrap().len(), 1, "{id}");
    }
}

/// Starts from a measurement: a run whose initial state holds a NaN.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "seeded", next_prefix = "Seeded")]
enum Seeded {
    #[initial]
    #[next(Done)]
    Start { x: f64 },
    #[terminal]
    Done,
}

struct Starter;

impl SeededHandler for Starter {
    type Error = anyhow::Error;

    async fn start(&self, _: &Context, _: f64) -> anyhow::Result<SeededStartNext> {
        Ok(SeededStartNext::Done)
    }
}

/// An initial state whose JSON does not decode back is refused before the run is created, as
/// every later state is: it was recorded, and the run could not be read again (helper-124).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initial_state_that_does_not_decode_back_creates_no_run() {
    let rt = Runtime::builder().build(loops::RedbStore::in_memory().unwrap());
    let err = rt
        .run("nan-start", Seeded::Start { x: f64::NAN }, &Starter)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Encode { seq: 0, state, .. } if state == "Start"),
        "{err:?}"
    );
    assert!(rt.run_info("nan-start").await.unwrap().is_none());
    assert_eq!(
        rt.run("ok", Seeded::Start { x: 1.5 }, &Starter)
            .await
            .unwrap(),
        Seeded::Done
    );
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "oversized")]
enum Oversized {
    #[initial]
    #[next(Grown)]
    Grow { bytes: usize },
    #[terminal]
    Grown { text: String },
}

/// Counts its entries; moves to a state of `bytes` bytes of text.
#[derive(Default)]
struct Grower {
    entries: AtomicU32,
}

impl OversizedHandler for Grower {
    type Error = anyhow::Error;

    async fn grow(&self, _: &Context, bytes: usize) -> anyhow::Result<GrowNext> {
        self.entries.fetch_add(1, Ordering::SeqCst);
        Ok(GrowNext::Grown {
            text: "z".repeat(bytes),
        })
    }
}

/// A next state over the payload limit fails its attempt with that error, once: the run
/// fails at once, saying why (the driver stopped instead, and each try was recorded as
/// interrupted, "the process stopped (or lost the run's lease) while this attempt ran", until the retries ran out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_state_over_the_payload_limit_fails_the_run_at_once_saying_why() {
    let rt = Runtime::builder()
        .max_payload_bytes(1024)
        .retry(fast(3))
        .register::<Oversized, _>(Grower::default())
        .build(loops::RedbStore::in_memory().unwrap());
    let grower = Grower::default();
    let err = rt
        .run("big", Oversized::Grow { bytes: 4096 }, &grower)
        .await
        .unwrap_err();
    let said = "run `big`: state `Grown` at seq 1 is 4117 bytes, over the 1024-byte limit";
    match &err {
        Error::RunFailed {
            attempts,
            interrupted,
            last_error,
            ..
        } => assert_eq!(
            (*attempts, *interrupted, last_error.as_slice()),
            (1, 0, [said.to_owned()].as_slice())
        ),
        other => panic!("expected RunFailed, got {other:?}"),
    }
    assert_eq!(grower.entries.load(Ordering::SeqCst), 1);
    let info = rt.run_info("big").await.unwrap().unwrap();
    assert_eq!(
        (
            info.status,
            info.attempt,
            info.interrupted,
            info.state.as_str()
        ),
        (RunStatus::Failed, 1, 0, "Grow")
    );
    let failures = rt.store().failures("big").await.unwrap();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].1.errors, vec![said.to_owned()]);
    assert_eq!(rt.store().history("big").await.unwrap().len(), 1);
    // Under the limit, the same handler moves on.
    let small = rt
        .run("small", Oversized::Grow { bytes: 10 }, &grower)
        .await
        .unwrap();
    assert_eq!(
        small,
        Oversized::Grown {
            text: "z".repeat(10)
        }
    );
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "paused")]
enum Paused {
    #[initial]
    #[next(Fetched)]
    Fetch { fail_tries: u32 },
    #[terminal]
    Fetched { page: String },
}

/// Fetches with a retried step, then sleeps a day before it moves on.
#[derive(Default)]
struct Fetcher {
    /// Tries of the step, by run.
    tries: Mutex<BTreeMap<String, u32>>,
}

impl PausedHandler for Fetcher {
    type Error = anyhow::Error;

    async fn fetch(&self, ctx: &Context, fail_tries: u32) -> Result<FetchNext, Self::Error> {
        let page: String = ctx
            .step_with(
                "fetch",
                StepOptions::default().with_retry(fast(3)),
                || async {
                    let n = {
                        let mut tries = self.tries.lock().unwrap();
                        let n = tries.entry(ctx.run_id().to_owned()).or_insert(0);
                        *n += 1;
                        *n
                    };
                    if n <= fail_tries {
                        return Err(std::io::Error::other(format!("try {n} failed")).into());
                    }
                    Ok(format!("page after {n} tries"))
                },
            )
            .await?;
        ctx.sleep(Duration::from_secs(86_400)).await?;
        Ok(FetchNext::Fetched { page })
    }
}

/// helper-126 MEDIUM 2: the run's row showed the failed try's error ("last error" in
/// `loops show`) after the step had succeeded, while the run slept; it is cleared with the
/// step's record. A step that succeeds at its first try leaves the row as it was.
#[tokio::test]
async fn a_step_that_succeeds_after_failed_tries_clears_the_error_they_showed() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder()
        .register::<Paused, _>(Fetcher::default())
        .open(dir.path().join("store.redb"))
        .unwrap();
    for (run, fail_tries) in [("retried", 2), ("first", 0)] {
        rt.start(run, Paused::Fetch { fail_tries }).await.unwrap();
        let info = rt.wait_for_status(run, RunStatus::Waiting).await.unwrap();
        assert_eq!(
            (info.state.as_str(), info.attempt, info.error),
            ("Fetch", 1, None),
            "{run}"
        );
        let fetched = steps(&rt, run, 0).await;
        assert_eq!(
            fetched["fetch#0"],
            format!(r#""page after {} tries""#, fail_tries + 1)
        );
    }
    // The failed tries are still on record.
    assert_eq!(
        failures(&rt, "retried").await,
        vec![
            (0, 1, "step fetch#0".into(), "try 1 failed".into()),
            (0, 1, "step fetch#0".into(), "try 2 failed".into()),
        ]
    );
    rt.shutdown().await;
}
