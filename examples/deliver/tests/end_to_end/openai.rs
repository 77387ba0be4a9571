//! The example with `--model openai` against a fake chat-completions server in the test
//! process (`fake_api.rs`) that answers as a model that knows the demo's two bugs: one pull
//! request and the reference's history, token totals exact in the summary and in the
//! recorded step outputs, and a SIGKILL mid-run (in the middle of a model call, and after
//! both calls were recorded) re-spends no tokens on recorded calls: the server counts the
//! requests.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::describe;
use crate::common::poll;
use crate::common::{deliver_in, exit_and_stderr};
use crate::crash::{check, reference, start_held};
use crate::fake_api::{FakeApi, Reply, Request};

const RUN_ID: &str = "deliver-1";
/// The environment variable the tests pass the API key in.
const KEY_VAR: &str = "LOOPS_DELIVER_TEST_API_KEY";
/// What the fake server reports each answer cost: (prompt, completion) tokens.
const PLAN_TOKENS: (u64, u64) = (1_200, 150);
const FIX_TOKENS: (u64, u64) = (1_500, 90);
const REVIEW_TOKENS: (u64, u64) = (900, 60);
/// The summary's line for the three calls.
const TOKENS_LINE: &str = "tokens: plan (seq 0) 1,350, fix (seq 3) 1,590, review (seq 5) 960; 3,900 in all (3,600 \
     prompt, 300 completion) over 3 model calls\n";

/// What a request asks for: a plan, a fix of the failing `mean` test, a review of the change,
/// or something else.
#[derive(Debug, PartialEq)]
enum Asked {
    Plan,
    Fix,
    Review,
    Other,
}

fn asked(request: &Request) -> Asked {
    let user = request.message("user").unwrap_or_default();
    if user.contains("Failing test tests::mean_of_three_values") {
        Asked::Fix
    } else if user.contains("Plan a change that resolves the issue") {
        Asked::Plan
    } else if user.contains("Review it before it goes to a human") {
        Asked::Review
    } else {
        Asked::Other
    }
}

/// The answers of a model that knows the demo: the scripted model's edits and summaries, so
/// that the run's history is the reference's, byte for byte.
fn demo_model(request: &Request) -> Reply {
    let (answer, (prompt, completion)) = match asked(request) {
        Asked::Plan => (
            json!({
                "decision": "plan",
                "summary": "Fix add(): add the arguments instead of subtracting them",
                "edits": [{ "path": "src/lib.rs", "find": "    a - b", "replace": "    a + b" }],
            }),
            PLAN_TOKENS,
        ),
        Asked::Fix => (
            json!({
                "decision": "fix",
                "summary": "Fix mean(): divide by the number of values, not one less",
                "edits": [{
                    "path": "src/lib.rs",
                    "find": "    Some(values.iter().sum::<f64>() / (values.len() - 1) as f64)",
                    "replace": "    Some(values.iter().sum::<f64>() / values.len() as f64)",
                }],
            }),
            FIX_TOKENS,
        ),
        Asked::Review => (
            json!({
                "summary": "For issue #1 (\"add() returns the difference of its arguments\"), \
                            the change edits src/lib.rs (+2 -2 lines); all 2 tests pass.",
                "concerns": [
                    "no test was added or changed: the tests that pass are the ones that were there"
                ],
            }),
            REVIEW_TOKENS,
        ),
        Asked::Other => return Reply::error(400, "the fake model has no answer to this prompt"),
    };
    Reply::answer(&answer, prompt, completion)
}

/// The example on `workdir` with `--model openai` against `api`, with the key in `KEY_VAR`.
fn deliver(workdir: &Path, api: &FakeApi) -> Command {
    let mut cmd = deliver_in(workdir);
    cmd.args(["--run-id", RUN_ID, "--model", "openai", "--base-url"])
        .arg(api.base_url())
        .args(["--api-key-env", KEY_VAR, "--model-name", "fake-model"])
        .env(KEY_VAR, "sk-test");
    cmd
}

fn run(cmd: &mut Command) -> Output {
    let output = cmd.output().expect("run the example");
    assert!(output.status.success(), "{}", describe(&output));
    output
}

/// What each request asked for, in order; and checks each has the documented shape.
fn asks(api: &FakeApi) -> Vec<Asked> {
    api.requests()
        .iter()
        .map(|r| {
            assert_eq!(
                (r.method.as_str(), r.path.as_str()),
                ("POST", "/v1/chat/completions")
            );
            assert_eq!(r.authorization.as_deref(), Some("Bearer sk-test"));
            assert_eq!(r.body["model"], "fake-model");
            asked(r)
        })
        .collect()
}

/// The usage recorded in the output of the step `name` (occurrence 0) at `seq`.
fn recorded_usage(workdir: &Path, seq: u64, name: &str) -> Value {
    let store = loops::RedbStore::open_read_only(workdir.join("deliver.redb")).expect("the store");
    let steps = store.steps(RUN_ID, seq).expect("the steps");
    let (_, _, record) = steps
        .iter()
        .find(|(step, occurrence, _)| step == name && *occurrence == 0)
        .unwrap_or_else(|| panic!("no step {name} at seq {seq}: {steps:?}"));
    let output: Value = serde_json::from_str(record.output.get()).expect("JSON");
    output["usage"].clone()
}

#[test]
fn against_a_local_api_one_pull_request_and_exact_token_totals() {
    let reference = &reference().outcome;
    // The first request is rate limited (come back at once); the rest answer.
    let api = FakeApi::start(|i, request| {
        if i == 0 {
            Reply::error(429, "Rate limit reached").with_header("retry-after", "0")
        } else {
            demo_model(request)
        }
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let output = run(&mut deliver(dir.path(), &api));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!(
            "model:  fake-model at {}/chat/completions\n",
            api.base_url()
        )),
        "{stdout}"
    );
    assert!(stdout.contains(TOKENS_LINE), "{stdout}");
    assert!(!stdout.contains("resumed:"), "{stdout}");
    assert!(
        stdout.ends_with(&format!(
            "{TOKENS_LINE}pull request: forge://demo/pulls/1\n  stored in {}\n",
            dir.path().join("forge/pulls/1.json").display()
        )),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("model call, try 1 of 4: ")
            && stderr.contains("answered HTTP 429 Too Many Requests (Retry-After: 0 s): Rate limit reached; trying again in 0 s"),
        "{stderr}"
    );
    assert_eq!(
        asks(&api),
        [Asked::Plan, Asked::Plan, Asked::Fix, Asked::Review]
    );
    // The reference's history (made by the scripted model), one pull request, each commit
    // once.
    check(dir.path(), reference, "--model openai");
    // The tokens, as recorded: the plan took two requests.
    assert_eq!(
        recorded_usage(dir.path(), 0, "plan"),
        json!({ "requests": 2, "prompt_tokens": 1_200, "completion_tokens": 150 })
    );
    assert_eq!(
        recorded_usage(dir.path(), 3, "fix"),
        json!({ "requests": 1, "prompt_tokens": 1_500, "completion_tokens": 90 })
    );
    assert_eq!(
        recorded_usage(dir.path(), 5, "review"),
        json!({ "requests": 1, "prompt_tokens": 900, "completion_tokens": 60 })
    );
}

/// Waits until `api` has received `n` requests (the child is still running).
fn await_requests(api: &FakeApi, n: usize, child: &mut std::process::Child) {
    let arrived = poll(Duration::from_secs(120), Duration::from_millis(10), || {
        if let Some(status) = child.try_wait().expect("poll the example") {
            panic!(
                "the example exited ({status}) after {} requests",
                api.requests().len()
            );
        }
        (api.requests().len() >= n).then_some(())
    });
    assert!(
        arrived.is_some(),
        "{} requests, waiting for {n}",
        api.requests().len()
    );
}

#[test]
fn a_sigkill_mid_run_re_spends_no_tokens_on_recorded_calls() {
    let reference = &reference().outcome;
    // Killed in the middle of the fix call (its request sent, its answer never coming): the
    // plan was recorded, the fix was not.
    let hung = AtomicBool::new(false);
    let api = FakeApi::start(move |_, request| {
        if asked(request) == Asked::Fix && !hung.swap(true, Ordering::SeqCst) {
            Reply::Hang
        } else {
            demo_model(request)
        }
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = deliver(dir.path(), &api)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the example");
    await_requests(&api, 2, &mut child);
    child.kill().expect("SIGKILL the example");
    child.wait().expect("reap the example");
    assert_eq!(asks(&api), [Asked::Plan, Asked::Fix]);

    let stdout = String::from_utf8_lossy(&run(&mut deliver(dir.path(), &api)).stdout).into_owned();
    assert!(
        stdout.contains("resuming at Tested (seq 3; attempt 1 did not finish: the process stopped (or lost the run's lease) while this attempt ran)"),
        "{stdout}"
    );
    // The plan is not asked again; the fix whose answer never came is.
    assert_eq!(
        asks(&api),
        [Asked::Plan, Asked::Fix, Asked::Fix, Asked::Review]
    );
    assert!(
        stdout.contains(&format!(
            "{TOKENS_LINE}resumed: 1 model call, 1,350 tokens not spent again\n"
        )),
        "{stdout}"
    );
    check(dir.path(), reference, "killed in the fix call");

    // Killed after both calls were recorded (held at the entry of seq 4): the resume asks
    // only for the review, which comes after.
    let api = FakeApi::start(|_, request| demo_model(request));
    let dir = tempfile::tempdir().expect("temp dir");
    let mut held = start_held(deliver(dir.path(), &api), 4);
    held.kill().expect("SIGKILL the example");
    held.wait().expect("reap the example");
    assert_eq!(asks(&api), [Asked::Plan, Asked::Fix]);
    let stdout = String::from_utf8_lossy(&run(&mut deliver(dir.path(), &api)).stdout).into_owned();
    assert_eq!(asks(&api), [Asked::Plan, Asked::Fix, Asked::Review]);
    assert!(
        stdout.contains(&format!(
            "{TOKENS_LINE}resumed: 2 model calls, 2,940 tokens not spent again\n"
        )),
        "{stdout}"
    );
    check(dir.path(), reference, "killed after both calls");
}

/// A run the model failed (a permanent error: HTTP 401 at the review) ends failed at once,
/// asked once (no retry of the step or the state changes a refusal), and says to run with
/// `--retry`; once the model answers again, `--retry` gives it a fresh budget of attempts and
/// it ends as the reference did, the recorded plan and fix not asked again.
#[test]
fn a_run_failed_by_the_model_resumes_with_retry() {
    let reference = &reference().outcome;
    let refuse = std::sync::Arc::new(AtomicBool::new(true));
    let api = FakeApi::start({
        let refuse = refuse.clone();
        move |_, request| {
            if asked(request) == Asked::Review && refuse.load(Ordering::SeqCst) {
                Reply::error(401, "Incorrect API key provided")
            } else {
                demo_model(request)
            }
        }
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let output = deliver(dir.path(), &api).output().expect("run the example");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.code() == Some(1)
            && stderr.contains(
                "error: run `deliver-1` failed in state `Tested` (seq 5) after 1 attempt"
            )
            && stderr.contains("Incorrect API key provided")
            && stderr.contains("Run with --retry to resume it with a fresh budget of attempts"),
        "{}",
        describe(&output)
    );
    assert_eq!(asks(&api), [Asked::Plan, Asked::Fix, Asked::Review]);
    // Run again as it was, it stays failed: no request made.
    let output = deliver(dir.path(), &api).output().expect("run the example");
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(asks(&api).len(), 3);

    refuse.store(false, Ordering::SeqCst);
    let output = run(deliver(dir.path(), &api).arg("--retry"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(
            "run deliver-1 failed at Tested (seq 5); retrying it with a fresh budget of attempts"
        ),
        "{stdout}"
    );
    assert_eq!(
        asks(&api),
        [Asked::Plan, Asked::Fix, Asked::Review, Asked::Review]
    );
    check(dir.path(), reference, "--retry after a failed review");
}

/// A `Retry-After` longer than the call's own waits (at most 60 s) parks the run until the
/// step's next try; the example says so, with the step and its error, and that Ctrl-C is safe
/// (it sat silent until the try before). Ctrl-C then stops it cleanly, the run parked.
#[cfg(unix)]
#[test]
fn a_long_retry_after_is_said_while_the_run_waits_for_it() {
    use std::io::{BufRead as _, BufReader};

    let api = FakeApi::start(|i, request| {
        if i == 0 {
            Reply::error(429, "Rate limit reached").with_header("retry-after", "600")
        } else {
            demo_model(request)
        }
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = deliver(dir.path(), &api)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the example");
    let lines = BufReader::new(child.stdout.take().expect("its stdout")).lines();
    let said = lines
        .map(|l| l.expect("a line"))
        .find(|l| l.contains(" waits at "));
    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(interrupted.success());
    let (status, stderr) = exit_and_stderr(&mut child);
    assert_eq!(status.code(), Some(130), "{said:?} {stderr}");
    assert!(
        stderr.ends_with("interrupted; run the same command again to resume\n"),
        "{stderr}"
    );

    // The seconds left when it was said: 600 unless this machine is very slow.
    let said = said.expect("the wait was said");
    let (start, rest) = said
        .split_once(" s, until ")
        .unwrap_or_else(|| panic!("{said}"));
    let secs: u64 = start
        .strip_prefix("run deliver-1 waits at Received (seq 0) for ")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!((590..=600).contains(&secs), "{said}");
    assert!(
        rest.starts_with("the next try of its step `plan` (it failed: ")
            && rest.contains(
                "answered HTTP 429 Too Many Requests (Retry-After: 600 s): Rate limit reached"
            )
            && rest.ends_with(
                "); it holds no task meanwhile: Ctrl-C is safe, and the same command goes on \
                 with it"
            ),
        "{said}"
    );
    assert_eq!(asks(&api), [Asked::Plan]);
    let store = loops::RedbStore::open_read_only(dir.path().join("deliver.redb")).expect("store");
    let (info, _) = store.latest(RUN_ID).expect("read").expect("the run");
    assert_eq!(
        (info.status, info.state.as_str(), info.seq),
        (loops::RunStatus::Waiting, "Received", 0)
    );
}
