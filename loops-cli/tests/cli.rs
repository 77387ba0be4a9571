//! End-to-end tests of the `loops` binary: a store with a run in every status is produced
//! through loops-core (workflows derived with `#[workflow(crate = loops_core)]`, since this
//! package depends on loops-core rather than the `loops` facade), then the real binary is run
//! on a copy of it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use assert_cmd::Command;
use loops_core::{BoxError, Context, RedbStore, RetryPolicy, RunStatus, Runtime, Workflow};
use predicates::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Two tiny workflows.

/// Fetches items, delivers them (or fails, or hangs, as `mode` says), done.
#[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = loops_core)]
enum Job {
    #[initial]
    #[next(Work)]
    Start { mode: String },
    #[next(Done)]
    Work { mode: String, items: Vec<String> },
    #[terminal]
    Done { delivered: u32 },
}

/// What the derive describes `Job` as (`the_workflows_are_described_as_expected`), and so
/// what the binary must print for it.
const JOB_SCHEMA: &str = "workflow job version 1 format 1\nstate Start (struct, initial) -> Work\n  mode: String\nstate Work (struct) -> Done\n  mode: String\n  items: Vec<String>\nstate Done (struct, terminal)\n  delivered: u32\n";

/// An error with a cause, so that the failed run records a chain of two.
#[derive(Debug)]
struct DeployError(std::io::Error);

impl fmt::Display for DeployError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deploy failed")
    }
}

impl std::error::Error for DeployError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

struct Worker;

impl JobHandler for Worker {
    type Error = BoxError;

    async fn start(&self, ctx: &Context, mode: String) -> Result<StartNext, BoxError> {
        let items: Vec<String> = ctx
            .step("fetch", || async {
                Ok(vec!["a".to_owned(), "b".to_owned()])
            })
            .await?;
        Ok(StartNext::Work { mode, items })
    }

    async fn work(
        &self,
        ctx: &Context,
        mode: String,
        items: Vec<String>,
    ) -> Result<WorkNext, BoxError> {
        match mode.as_str() {
            "step-fails" => {
                ctx.step("deploy", || async {
                    Err::<u32, BoxError>("deploy refused".into())
                })
                .await?;
                unreachable!("the step fails")
            }
            "fail" => Err(Box::new(DeployError(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused",
            )))),
            "hang" => {
                ctx.step("begin", || async { Ok(true) }).await?;
                std::future::pending::<()>().await;
                unreachable!()
            }
            _ => {
                let n: u32 = ctx
                    .step("deliver", || async { Ok(items.len() as u32) })
                    .await?;
                Ok(WorkNext::Done { delivered: n })
            }
        }
    }
}

/// The same workflow name with another shape: a second stored schema to diff against. In a
/// module of its own: its generated `StartNext` would clash with `Job`'s.
mod v2 {
    use super::*;

    #[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "job", version = 2, crate = loops_core)]
    pub(super) enum JobV2 {
        #[initial]
        #[next(Done)]
        Start { mode: String },
        #[terminal]
        Done { delivered: u64 },
    }

    impl JobV2Handler for Worker {
        type Error = BoxError;
        async fn start(&self, _: &Context, _: String) -> Result<StartNext, BoxError> {
            Ok(StartNext::Done { delivered: 7 })
        }
    }
}
use v2::JobV2;

/// What the derive describes `JobV2` as.
const JOB_V2_SCHEMA: &str = "workflow job version 2 format 1\nstate Start (struct, initial) -> Done\n  mode: String\nstate Done (struct, terminal)\n  delivered: u64\n";

/// Waits for an approval.
#[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = loops_core)]
enum Gate {
    #[initial]
    #[next(Done)]
    Ask { doc: String },
    #[terminal]
    Done { by: String },
}

/// What the derive describes `Gate` as.
const GATE_SCHEMA: &str = "workflow gate version 1 format 1\nstate Ask (struct, initial) -> Done\n  doc: String\nstate Done (struct, terminal)\n  by: String\n";

impl GateHandler for Worker {
    type Error = BoxError;
    async fn ask(&self, ctx: &Context, _: String) -> Result<AskNext, BoxError> {
        let by: String = ctx.wait_for("approval").await?;
        Ok(AskNext::Done { by })
    }
}

/// The descriptions the tests below expect the binary to print are the derive's.
#[test]
fn the_workflows_are_described_as_expected() {
    assert_eq!(Job::SCHEMA, JOB_SCHEMA);
    assert_eq!(JobV2::SCHEMA, JOB_V2_SCHEMA);
    assert_eq!(Gate::SCHEMA, GATE_SCHEMA);
}

/// Edits and tests until the third round passes: a loop, for `loops graph --run`.
#[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = loops_core)]
enum Fix {
    #[initial]
    #[next(Test, Dropped)]
    Edit { round: u32 },
    #[next(Edit, Merged)]
    Test { round: u32 },
    #[terminal]
    Merged,
    #[terminal]
    Dropped,
}

impl FixHandler for Worker {
    type Error = BoxError;

    async fn edit(&self, _: &Context, round: u32) -> Result<EditNext, BoxError> {
        // Never reached by the tests' runs (they merge at round 2); the graph shows the edge.
        Ok(if round > 10 {
            EditNext::Dropped
        } else {
            EditNext::Test { round }
        })
    }

    async fn test(&self, _: &Context, round: u32) -> Result<TestNext, BoxError> {
        Ok(if round < 2 {
            TestNext::Edit { round: round + 1 }
        } else {
            TestNext::Merged
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The store every test starts from (built once, copied per test).

/// Runs, in the order they were last changed (oldest first):
/// `done-1` completed (job, 3 transitions), `v2-1` completed (job with the second schema, 2),
/// `failed-1` failed at Work (2), `running-1` running at Work (2, its driver dropped
/// mid-handler), `waiting-1` waiting for `approval` (1), `cancelled-1` cancelled while it
/// waited (1).
fn fixture() -> &'static Path {
    static FIXTURE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fixture.redb");
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(build_fixture(&path));
        (dir, path)
    });
    path
}

async fn until_status(rt: &Runtime, run_id: &str, status: RunStatus) {
    for _ in 0..500 {
        if rt
            .run_info(run_id)
            .await
            .unwrap()
            .is_some_and(|i| i.status == status)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("run {run_id} never reached {status}");
}

/// A pause, so that runs' last changes are strictly ordered.
async fn tick() {
    tokio::time::sleep(Duration::from_millis(3)).await;
}

async fn build_fixture(path: &Path) {
    let rt = Runtime::builder()
        .retry(RetryPolicy::never())
        .open(path)
        .unwrap();
    let start = |mode: &str| Job::Start { mode: mode.into() };
    rt.run("done-1", start("ok"), &Worker).await.unwrap();
    tick().await;
    rt.run("v2-1", JobV2::Start { mode: "ok".into() }, &Worker)
        .await
        .unwrap();
    tick().await;
    rt.run("failed-1", start("fail"), &Worker)
        .await
        .unwrap_err();
    tick().await;

    // Running: its driver is dropped in the middle of Work's handler, after its first step.
    let driver = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.run("running-1", start("hang"), &Worker).await })
    };
    for _ in 0..500 {
        if rt.store().steps("running-1", 1).await.unwrap().len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    driver.abort();
    let _ = driver.await;
    tick().await;

    // Waiting (and, once cancelled, cancelled): parked on `approval`, driver dropped.
    for id in ["waiting-1", "cancelled-1"] {
        let driver = {
            let rt = rt.clone();
            tokio::spawn(async move {
                rt.run(
                    id,
                    Gate::Ask {
                        doc: "spec.md".into(),
                    },
                    &Worker,
                )
                .await
            })
        };
        until_status(&rt, id, RunStatus::Waiting).await;
        driver.abort();
        let _ = driver.await;
        tick().await;
    }
    rt.cancel("cancelled-1", "not needed").await.unwrap();
    drop(rt);
}

/// A copy of the fixture in a fresh directory (kept alive by the returned guard).
fn store() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    std::fs::copy(fixture(), &path).unwrap();
    (dir, path)
}

/// The binary, with the store given by `LOOPS_STORE` and colour off.
fn loops(path: &Path) -> Command {
    let mut cmd = Command::cargo_bin("loops").unwrap();
    cmd.env("LOOPS_STORE", path).env("NO_COLOR", "1");
    cmd
}

/// Runs `loops ARGS --json` (or `ARGS` that already ask for JSON), expects success, parses
/// stdout.
fn json(path: &Path, args: &[&str]) -> Value {
    let out = loops(path).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "loops {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "loops {args:?}: stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Runs `loops ARGS`, expects success, returns stdout.
fn text(path: &Path, args: &[&str]) -> String {
    let out = loops(path).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "loops {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `loops ARGS`, expects exit code `code`, returns stderr.
fn fails(path: &Path, args: &[&str], code: i32) -> String {
    let out = loops(path).args(args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "loops {args:?}: stdout {} stderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stderr).unwrap()
}

fn ids(runs: &Value) -> Vec<&str> {
    runs.as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Reading.

#[test]
fn runs_lists_every_run_newest_first_with_stable_fields() {
    let (_dir, path) = store();
    let runs = json(&path, &["runs", "--json"]);
    assert_eq!(
        ids(&runs),
        [
            "cancelled-1",
            "waiting-1",
            "running-1",
            "failed-1",
            "v2-1",
            "done-1"
        ]
    );
    let by_id = |id: &str| {
        runs.as_array()
            .unwrap()
            .iter()
            .find(|r| r["run_id"] == id)
            .unwrap()
            .clone()
    };
    let summary = |id: &str| {
        let r = by_id(id);
        (
            r["workflow"].as_str().unwrap().to_owned(),
            r["status"].as_str().unwrap().to_owned(),
            r["state"].as_str().unwrap().to_owned(),
            r["seq"].as_u64().unwrap(),
            r["attempt"].as_u64().unwrap(),
        )
    };
    let s = |w: &str, st: &str, state: &str, seq, attempt| {
        (w.to_owned(), st.to_owned(), state.to_owned(), seq, attempt)
    };
    assert_eq!(summary("done-1"), s("job", "completed", "Done", 2, 1));
    assert_eq!(summary("v2-1"), s("job", "completed", "Done", 1, 1));
    assert_eq!(summary("failed-1"), s("job", "failed", "Work", 1, 1));
    assert_eq!(summary("running-1"), s("job", "running", "Work", 1, 1));
    assert_eq!(summary("waiting-1"), s("gate", "waiting", "Ask", 0, 1));
    assert_eq!(summary("cancelled-1"), s("gate", "cancelled", "Ask", 0, 1));

    // Every field is present, in every object.
    let fields = [
        "run_id",
        "workflow",
        "status",
        "state",
        "seq",
        "attempt",
        "created_at",
        "created_ms",
        "updated_at",
        "updated_ms",
        "waiting_for",
        "retry_at",
        "retry_at_ms",
        "error",
        "cancel_reason",
        "parent",
        "schema",
        "blocked",
        "gave_up",
        "attributes",
    ];
    for run in runs.as_array().unwrap() {
        let keys: Vec<&str> = run
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut want = fields.to_vec();
        want.sort_unstable();
        assert_eq!(keys, want, "{run}");
    }
    let waiting = by_id("waiting-1");
    assert_eq!(
        waiting["waiting_for"],
        json!({"event": "approval", "until": null, "until_ms": null})
    );
    let failed = by_id("failed-1");
    assert_eq!(
        failed["error"],
        json!(["deploy failed", "connection refused"])
    );
    assert_eq!(failed["waiting_for"], Value::Null);
    assert_eq!(failed["gave_up"], json!({"attempts": 1, "interrupted": 0}));
    assert_eq!(by_id("done-1")["gave_up"], Value::Null);
    assert_eq!(by_id("cancelled-1")["cancel_reason"], "not needed");
    assert_eq!(by_id("done-1")["schema"].as_str().unwrap().len(), 16);
    assert_ne!(by_id("done-1")["schema"], by_id("v2-1")["schema"]);
    let updated = by_id("done-1")["updated_at"].as_str().unwrap().to_owned();
    assert!(updated.ends_with('Z') && updated.len() == 24, "{updated}");
}

#[test]
fn runs_filters_by_status_workflow_and_age() {
    let (_dir, path) = store();
    let runs = json(
        &path,
        &[
            "runs", "--json", "--status", "failed", "--status", "waiting",
        ],
    );
    assert_eq!(ids(&runs), ["waiting-1", "failed-1"]);
    let runs = json(&path, &["runs", "--json", "--status", "running,completed"]);
    assert_eq!(ids(&runs), ["running-1", "v2-1", "done-1"]);
    let runs = json(&path, &["runs", "--json", "--workflow", "gate"]);
    assert_eq!(ids(&runs), ["cancelled-1", "waiting-1"]);
    let runs = json(
        &path,
        &[
            "runs",
            "--json",
            "--workflow",
            "gate",
            "--status",
            "waiting",
        ],
    );
    assert_eq!(ids(&runs), ["waiting-1"]);
    let runs = json(&path, &["runs", "--json", "--limit", "2"]);
    assert_eq!(ids(&runs), ["cancelled-1", "waiting-1"]);
    // A limit that leaves runs out says how many (on stderr; stdout stays JSON); 0 is all.
    let out = loops(&path)
        .args(["runs", "--json", "--limit", "2"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "note: 4 more runs match; the 2 most recently changed are shown (--limit N, or --limit 0 for all)\n"
    );
    for (limit, note) in [
        ("1", "5 more runs match; the most recently changed is shown"),
        (
            "5",
            "1 more run matches; the 5 most recently changed are shown",
        ),
    ] {
        let out = loops(&path)
            .args(["runs", "--limit", limit])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            format!("note: {note} (--limit N, or --limit 0 for all)\n")
        );
    }
    assert_eq!(
        ids(&json(&path, &["runs", "--json", "--limit", "0"])).len(),
        6
    );
    // Everything changed in the last day; nothing more than a day ago.
    assert_eq!(
        ids(&json(&path, &["runs", "--json", "--newer-than", "1d"])).len(),
        6
    );
    assert_eq!(
        json(&path, &["runs", "--json", "--older-than", "1d"]),
        json!([])
    );
    assert_eq!(
        json(&path, &["runs", "--json", "--workflow", "nope"]),
        json!([])
    );

    // An empty table is a success, with its header.
    let out = loops(&path)
        .args(["runs", "--older-than", "30d"])
        .assert()
        .success()
        .stderr("note: no runs match\n");
    let stdout = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert_eq!(
        stdout,
        "RUN  WORKFLOW  STATUS  STATE  SEQ  ATTEMPT  UPDATED  WAITING FOR\n"
    );
}

#[test]
fn runs_refuses_ages_that_exclude_each_other_and_takes_a_window() {
    let (_dir, path) = store();
    assert_eq!(
        fails(
            &path,
            &["runs", "--older-than", "2h", "--newer-than", "1h"],
            2
        ),
        "error: --older-than 2h and --newer-than 1h exclude each other: no run last changed both more than 2h ago and less than 1h ago (for runs last changed between 1h and 2h ago, give --older-than 1h --newer-than 2h)\n"
    );
    assert_eq!(
        fails(
            &path,
            &[
                "runs",
                "--json",
                "--older-than",
                "90m",
                "--newer-than",
                "1h 30m"
            ],
            2
        ),
        "error: --older-than 1h 30m and --newer-than 1h 30m exclude each other: no run last changed both more than 1h 30m ago and less than 1h 30m ago (--newer-than must be the longer age)\n"
    );
    // The other way round, a window: every run of the fixture changed less than an hour ago.
    assert_eq!(
        json(
            &path,
            &["runs", "--json", "--older-than", "1h", "--newer-than", "2h"]
        ),
        json!([])
    );
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(
        ids(&json(
            &path,
            &[
                "runs",
                "--json",
                "--older-than",
                "1ms",
                "--newer-than",
                "1d"
            ]
        )),
        [
            "cancelled-1",
            "waiting-1",
            "running-1",
            "failed-1",
            "v2-1",
            "done-1"
        ]
    );
}

#[test]
fn runs_table_is_aligned_and_uncoloured_without_a_terminal() {
    let (_dir, path) = store();
    let out = text(&path, &["runs"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 7, "{out}");
    assert!(!out.contains('\x1b'), "no colour codes when piped: {out:?}");
    let header = lines[0];
    assert!(header.starts_with("RUN          WORKFLOW  STATUS     STATE  SEQ  ATTEMPT  UPDATED"));
    // Each column starts at the same offset on every line.
    let col = |name: &str| header.find(name).unwrap();
    for line in &lines[1..] {
        for name in ["WORKFLOW", "STATUS", "STATE", "SEQ", "ATTEMPT", "UPDATED"] {
            let at = col(name);
            assert_ne!(&line[at - 1..at], "x", "{line}");
            assert_eq!(
                &line[at - 2..at],
                "  ",
                "column {name} misaligned: {line:?}"
            );
        }
    }
    let waiting = lines.iter().find(|l| l.starts_with("waiting-1")).unwrap();
    assert!(
        waiting.contains("gate      waiting    Ask    0    1"),
        "{waiting}"
    );
    assert!(waiting.ends_with("event approval"), "{waiting}");
    assert!(
        waiting.contains(" ago ") || waiting.contains("just now"),
        "{waiting}"
    );

    // --color always forces styles, NO_COLOR or not.
    let coloured = text(&path, &["runs", "--color", "always"]);
    assert!(coloured.contains("\x1b["), "{coloured:?}");
}

/// `text` with every relative time (`(5m ago)`, `(just now)`, `(in 3h)`) cut out of its lines.
fn without_relative_times(text: &str) -> String {
    text.lines()
        .map(|line| match line.rfind(" (") {
            Some(at)
                if line.ends_with(" ago)")
                    || line.ends_with("(just now)")
                    || line[at..].starts_with(" (in ") =>
            {
                &line[..at]
            }
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn show_prints_state_payload_wait_and_the_schema_only_when_asked() {
    let (_dir, path) = store();
    let out = text(&path, &["show", "waiting-1"]);
    let gate = Gate::SCHEMA_HASH.pinned();
    for want in [
        "run             waiting-1\n",
        "workflow        gate\n",
        "status          waiting\n",
        "state           Ask (seq 0, attempt 1)\n",
        "waiting for     event approval\n",
        &format!("schema          {gate}\n"),
        "state Ask (payload)\n  {\n    \"Ask\": {\n      \"doc\": \"spec.md\"\n    }\n  }\n",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    // The payload is the last thing shown; the description is not.
    assert!(
        out.ends_with(
            "state Ask (payload)\n  {\n    \"Ask\": {\n      \"doc\": \"spec.md\"\n    }\n  }\n"
        ),
        "{out}"
    );
    assert!(!out.contains("state Ask (struct, initial)"), "{out}");
    // With --schema, the same and then the description.
    let with = text(&path, &["show", "waiting-1", "--schema"]);
    // The two commands ran at different times: compare them without the relative times
    // ("(3s ago)"), which may differ by a second.
    assert_eq!(
        without_relative_times(&with),
        without_relative_times(&format!(
            "{out}\nschema {gate}\n  workflow gate version 1 format 1\n  state Ask (struct, initial) -> Done\n    doc: String\n  state Done (struct, terminal)\n    by: String\n"
        ))
    );
    let v = json(&path, &["show", "waiting-1", "--json"]);
    assert_eq!(v["run"]["run_id"], "waiting-1");
    assert_eq!(v["run"]["status"], "waiting");
    assert_eq!(v["run"]["waiting_for"]["event"], "approval");
    assert_eq!(v["payload"], json!({"Ask": {"doc": "spec.md"}}));
    assert_eq!(v["schema_description"], GATE_SCHEMA);
    // --schema changes only the text: the JSON always has the description.
    assert_eq!(json(&path, &["show", "waiting-1", "--json", "--schema"]), v);
    assert_eq!(v["pending_events"], json!([]));

    let v = json(&path, &["show", "failed-1", "--json"]);
    assert_eq!(
        v["payload"],
        json!({"Work": {"mode": "fail", "items": ["a", "b"]}})
    );
    assert_eq!(
        v["run"]["error"],
        json!(["deploy failed", "connection refused"])
    );
    let out = text(&path, &["show", "failed-1"]);
    assert!(
        out.contains("last error      deploy failed: connection refused\n"),
        "{out}"
    );
    assert!(out.contains("gave up         after 1 attempt\n"), "{out}");
    let out = text(&path, &["show", "cancelled-1"]);
    assert!(out.contains("cancelled       not needed\n"), "{out}");
    // Keys keep the order the workflow wrote them in.
    let out = text(&path, &["show", "running-1"]);
    assert!(
        out.contains("\"Work\": {\n      \"mode\": \"hang\",\n      \"items\": ["),
        "{out}"
    );
}

#[test]
fn history_merges_transitions_steps_failures_and_events() {
    let (_dir, path) = store();
    let v = json(&path, &["history", "done-1", "--json"]);
    assert_eq!(v["run"]["status"], "completed");
    let transitions = v["transitions"].as_array().unwrap();
    let states: Vec<(u64, &str)> = transitions
        .iter()
        .map(|t| (t["seq"].as_u64().unwrap(), t["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [(0, "Start"), (1, "Work"), (2, "Done")]);
    assert_eq!(transitions[0]["since_previous_ms"], Value::Null);
    assert!(transitions[1]["since_previous_ms"].is_u64());
    assert_eq!(transitions[2]["payload"], json!({"Done": {"delivered": 2}}));
    let step = &transitions[0]["steps"][0];
    assert_eq!(
        (
            &step["name"],
            &step["occurrence"],
            &step["attempt"],
            &step["output"]
        ),
        (&json!("fetch"), &json!(0), &json!(1), &json!(["a", "b"]))
    );
    assert!(step["duration_ms"].is_u64() && step["at"].is_string());
    assert_eq!(transitions[1]["steps"][0]["name"], "deliver");
    assert_eq!(transitions[1]["steps"][0]["output"], 2);
    assert_eq!(transitions[2]["steps"], json!([]));
    assert_eq!(v["events"], json!([]));

    let v = json(&path, &["history", "failed-1", "--json"]);
    let work = &v["transitions"][1];
    assert_eq!(work["state"], "Work");
    let failure = &work["failures"][0];
    assert_eq!(failure["attempt"], 1);
    assert_eq!(failure["source"], json!({"kind": "handler"}));
    assert_eq!(
        failure["errors"],
        json!(["deploy failed", "connection refused"])
    );
    assert_eq!(v["transitions"][0]["failures"], json!([]));

    let out = text(&path, &["history", "failed-1"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("run failed-1  workflow job  failed  1 transition, 1 failed attempt"),
        "{out}"
    );
    assert!(
        lines[2].starts_with("SEQ  KIND    NAME     ATTEMPT  AT"),
        "{out}"
    );
    assert!(lines[3].starts_with("0    state   Start"), "{out}");
    assert!(lines[3].ends_with(r#"{"Start":{"mode":"fail"}}"#), "{out}");
    assert!(lines[4].starts_with("     step    fetch#0  1"), "{out}");
    assert!(lines[5].starts_with("1    state   Work"), "{out}");
    assert!(lines[6].starts_with("     failed  handler  1"), "{out}");
    assert!(
        lines[6].ends_with("deploy failed: connection refused"),
        "{out}"
    );

    // A waiting run's history; then an event sent to it shows as pending.
    let v = json(&path, &["history", "waiting-1", "--json"]);
    assert_eq!(v["transitions"].as_array().unwrap().len(), 1);
    text(&path, &["send", "waiting-1", "note", "--json", "[1, 2]"]);
    let v = json(&path, &["history", "waiting-1", "--json"]);
    assert_eq!(
        v["events"],
        json!([{
            "event_seq": 0, "name": "note", "key": null,
            "at": v["events"][0]["at"], "at_ms": v["events"][0]["at_ms"],
            "delivered": false, "payload": [1, 2]
        }])
    );
    let out = text(&path, &["history", "waiting-1"]);
    assert!(
        out.starts_with("run waiting-1  workflow gate  waiting  0 transitions, 0 failed attempts; waiting for event approval\n"),
        "{out}"
    );
    assert!(out.contains("\nEVENT  NAME  KEY  SENT"), "{out}");
    assert!(out.contains("pending  [1,2]\n"), "{out}");
    // A long idempotency key is cut in the table (its column would widen every line), and
    // whole in `--json`.
    let key = "k".repeat(200);
    text(
        &path,
        &["send", "waiting-1", "note", "--json", "3", "--key", &key],
    );
    let out = text(&path, &["history", "waiting-1"]);
    let cut = format!("{}…", "k".repeat(31));
    let line = out.lines().find(|l| l.starts_with("1 ")).expect("event 1");
    assert!(line.starts_with(&format!("1      note  {cut}  ")), "{out}");
    assert!(!out.contains(&"k".repeat(32)), "{out}");
    let v = json(&path, &["history", "waiting-1", "--json"]);
    assert_eq!(v["events"][1]["key"], json!(key));

    // A cancelled run's history ends with its cancellation: where, when and why.
    let out = text(&path, &["history", "cancelled-1"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("run cancelled-1  workflow gate  cancelled  0 transitions"),
        "{out}"
    );
    assert!(lines[3].starts_with("0    state      Ask"), "{out}");
    assert!(lines[4].starts_with("     cancelled  Ask"), "{out}");
    assert!(lines[4].ends_with("not needed"), "{out}");
    assert_eq!(lines.len(), 5, "{out}");
}

/// Waits for ever: for `approval` with a time-out of `Duration::MAX`, or (`sleep`) sleeps
/// `Duration::MAX`. Either records a time of `u64::MAX` ms, after year 9999.
#[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = loops_core)]
enum Far {
    #[initial]
    #[next(Done)]
    Hold { sleep: bool },
    #[terminal]
    Done { by: Option<String> },
}

impl FarHandler for Worker {
    type Error = BoxError;
    async fn hold(&self, ctx: &Context, sleep: bool) -> Result<HoldNext, BoxError> {
        if sleep {
            ctx.sleep(Duration::MAX).await?;
            return Ok(HoldNext::Done { by: None });
        }
        let by: Option<String> = ctx.wait_for_timeout("approval", Duration::MAX).await?;
        Ok(HoldNext::Done { by })
    }
}

/// How the binary shows a time after year 9999 (RFC 3339 cannot spell it).
const FAR: &str = "after year 9999 (18446744073709551615 ms since the Unix epoch)";

#[test]
fn show_and_history_print_a_time_after_year_9999_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("far.redb");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let rt = Runtime::builder().open(&path).unwrap();
            for (id, sleep) in [("far-event", false), ("far-sleep", true)] {
                let driver = {
                    let rt = rt.clone();
                    tokio::spawn(async move { rt.run(id, Far::Hold { sleep }, &Worker).await })
                };
                until_status(&rt, id, RunStatus::Waiting).await;
                driver.abort();
                let _ = driver.await;
            }
            drop(rt);
        });

    let out = text(&path, &["show", "far-event"]);
    let line = format!("waiting for     event approval, until {FAR}\n");
    assert!(out.contains(&line), "missing {line:?} in:\n{out}");
    let v = json(&path, &["show", "far-event", "--json"]);
    assert_eq!(
        v["run"]["waiting_for"],
        json!({"event": "approval", "until": FAR, "until_ms": u64::MAX})
    );
    let out = text(&path, &["show", "far-sleep"]);
    let line = format!("waiting for     time, {FAR}\n");
    assert!(out.contains(&line), "missing {line:?} in:\n{out}");

    let out = text(&path, &["history", "far-event"]);
    let first = format!(
        "run far-event  workflow far  waiting  0 transitions, 0 failed attempts; waiting for event approval, until {FAR}\n"
    );
    assert!(out.starts_with(&first), "{out}");
    let v = json(&path, &["history", "far-sleep", "--json"]);
    assert_eq!(
        v["run"]["waiting_for"],
        json!({"event": null, "until": FAR, "until_ms": u64::MAX})
    );
}

#[test]
fn schema_lists_shows_and_diffs_stored_descriptions() {
    let (_dir, path) = store();
    let list = json(&path, &["schema", "--json"]);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 3);
    let by_desc = |d: &str| list.iter().find(|s| s["description"] == d).unwrap();
    let v1 = by_desc(JOB_SCHEMA);
    let v2 = by_desc(JOB_V2_SCHEMA);
    assert_eq!(
        (&v1["runs"], &v1["workflows"]),
        (&json!(3), &json!(["job"]))
    );
    assert_eq!(
        (&v2["runs"], &v2["workflows"]),
        (&json!(1), &json!(["job"]))
    );
    assert_eq!(by_desc(GATE_SCHEMA)["runs"], 2);
    // Each schema's workflow and version (from its description) and its runs by status.
    let statuses = |running, waiting, completed, failed, cancelled| {
        json!({"running": running, "waiting": waiting, "completed": completed,
               "failed": failed, "cancelled": cancelled, "blocked": 0})
    };
    let summary = |v: &Value| {
        (
            v["workflow"].clone(),
            v["version"].clone(),
            v["by_status"].clone(),
        )
    };
    assert_eq!(
        summary(v1),
        (json!("job"), json!(1), statuses(1, 0, 1, 1, 0))
    );
    assert_eq!(
        summary(v2),
        (json!("job"), json!(2), statuses(0, 0, 1, 0, 0))
    );
    assert_eq!(
        summary(by_desc(GATE_SCHEMA)),
        (json!("gate"), json!(1), statuses(0, 1, 0, 0, 1))
    );
    // Listed by workflow, then version.
    let (gate, job1, job2) = (
        Gate::SCHEMA_HASH.pinned().to_string(),
        Job::SCHEMA_HASH.pinned().to_string(),
        JobV2::SCHEMA_HASH.pinned().to_string(),
    );
    let hashes: Vec<&str> = list.iter().map(|s| s["hash"].as_str().unwrap()).collect();
    assert_eq!(hashes, [&gate, &job1, &job2]);
    let row = |cells: [&str; 10]| {
        let [
            h,
            w,
            v,
            r,
            running,
            waiting,
            completed,
            failed,
            cancelled,
            blocked,
        ] = cells;
        format!(
            "{h:<16}  {w:<8}  {v:<7}  {r:<4}  {running:<7}  {waiting:<7}  {completed:<9}  {failed:<6}  {cancelled:<9}  {blocked}\n"
        )
    };
    assert_eq!(
        text(&path, &["schema"]),
        [
            row([
                "SCHEMA",
                "WORKFLOW",
                "VERSION",
                "RUNS",
                "RUNNING",
                "WAITING",
                "COMPLETED",
                "FAILED",
                "CANCELLED",
                "BLOCKED"
            ]),
            row([&gate, "gate", "1", "2", "0", "1", "0", "0", "1", "0"]),
            row([&job1, "job", "1", "3", "1", "0", "1", "1", "0", "0"]),
            row([&job2, "job", "2", "1", "0", "0", "1", "0", "0", "0"]),
        ]
        .concat()
    );
    // One schema by hash (or prefix): its runs, then its description.
    assert_eq!(
        text(&path, &["schema", "--hash", &job1[..8]]),
        format!(
            "schema {job1}  (3 runs: 1 running, 1 completed, 1 failed)\n{}",
            JOB_SCHEMA
                .lines()
                .map(|l| format!("  {l}\n"))
                .collect::<String>()
        )
    );
    assert_eq!(json(&path, &["schema", "--hash", &job2, "--json"]), *v2);
    // A hash given where a run id goes: the error says `--hash` shows it.
    assert_eq!(
        fails(&path, &["schema", &job2], 1),
        format!(
            "error: run `{job2}` does not exist in store {} (`loops runs` lists the runs); {job2} is a stored schema's hash: `loops schema --hash {job2}` shows that schema\n",
            path.display()
        )
    );

    let run = json(&path, &["schema", "v2-1", "--json"]);
    assert_eq!(run["hash"], v2["hash"]);
    assert_eq!(run["description"], JOB_V2_SCHEMA);
    let out = text(&path, &["schema", "done-1"]);
    assert!(out.starts_with(&format!(
        "schema {} (run done-1, workflow job)\n  workflow job version 1 format 1\n",
        v1["hash"].as_str().unwrap()
    )));

    let (a, b) = (v1["hash"].as_str().unwrap(), v2["hash"].as_str().unwrap());
    let diff = json(&path, &["schema", "--diff", a, b, "--json"]);
    assert_eq!(
        diff,
        json!({
            "from": a, "to": b,
            "changes": [
                {
                    "text": "version changed from 1 to 2",
                    "class": "compatible",
                    "reason": "the version is not in the records; accept the old version's runs only if their data means the same",
                },
                {
                    "text": "state `Start`: may now move to `Done`",
                    "class": "compatible",
                    "reason": "where a run goes next is the new handler's to decide",
                },
                {
                    "text": "state `Start`: may no longer move to `Work`",
                    "class": "compatible",
                    "reason": "where a run goes next is the new handler's to decide",
                },
                {
                    "text": "state `Done`: field `delivered` changed from `u32` to `u64`",
                    "class": "compatible",
                    "reason": "a `u64` reads every stored `u32`",
                },
                {
                    "text": "state `Work` removed",
                    "class": "if_no_pending_run",
                    "state": "Work",
                    "reason": "a pending run in it could not be resumed (a state no pending run is in may go)",
                },
            ]
        })
    );
    // A unique prefix is enough; the text form has one line per change, with its class.
    let out = text(&path, &["schema", "--diff", &a[..6], &b[..6]]);
    assert_eq!(out.lines().count(), 6, "{out}");
    assert!(
        out.contains(
            "  [compatible if no pending run is in `Work`] state `Work` removed (a pending run"
        ),
        "{out}"
    );
    assert!(
        out.contains("  [compatible] version changed from 1 to 2 ("),
        "{out}"
    );
    let same = json(&path, &["schema", "--diff", a, a, "--json"]);
    assert_eq!(same["changes"], json!([]));

    let err = fails(&path, &["schema", "--diff", "0000000000000000", a], 1);
    assert!(
        err.starts_with("error: no schema 0000000000000000 is stored in"),
        "{err}"
    );
    let err = fails(&path, &["schema", "--diff", "xyz", a], 2);
    assert!(
        err.starts_with("error: invalid schema hash \"xyz\""),
        "{err}"
    );
}

#[test]
fn runs_filters_by_schema_hash_or_prefix() {
    let (_dir, path) = store();
    let (job1, job2) = (
        Job::SCHEMA_HASH.pinned().to_string(),
        JobV2::SCHEMA_HASH.pinned().to_string(),
    );
    let runs = json(&path, &["runs", "--schema", &job1, "--json"]);
    assert_eq!(ids(&runs), ["running-1", "failed-1", "done-1"]);
    let runs = json(&path, &["runs", "--schema", &job2[..5], "--json"]);
    assert_eq!(ids(&runs), ["v2-1"]);
    let runs = json(
        &path,
        &["runs", "--schema", &job1, "--status", "failed", "--json"],
    );
    assert_eq!(ids(&runs), ["failed-1"]);
    let runs = json(
        &path,
        &["runs", "--schema", &job1, "--workflow", "gate", "--json"],
    );
    assert_eq!(ids(&runs), Vec::<&str>::new());
    let out = text(&path, &["runs", "--schema", &job2.to_ascii_uppercase()]);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(out.lines().nth(1).unwrap().starts_with("v2-1  "), "{out}");

    let err = fails(&path, &["runs", "--schema", "0000000000000000"], 1);
    assert!(
        err.starts_with("error: no schema 0000000000000000 is stored in"),
        "{err}"
    );
    let err = fails(&path, &["runs", "--schema", "zz"], 2);
    assert!(
        err.starts_with("error: invalid schema hash \"zz\""),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Graphs.

/// `loops ARGS`: stdout and stderr, on success.
fn graph(path: &Path, args: &[&str]) -> (String, String) {
    out_err(path, args)
}

#[test]
fn graph_prints_mermaid_and_dot_from_the_stored_description() {
    let (_dir, path) = store();
    let gate = Gate::SCHEMA_HASH.pinned();
    let (out, err) = graph(&path, &["graph", "gate"]);
    assert_eq!(
        out,
        format!(
            "---\ntitle: \"gate version 1, schema {gate}\"\n---\nstateDiagram-v2\n    [*] --> Ask\n    Ask --> Done\n    Done --> [*]\n"
        )
    );
    assert_eq!(err, "");
    assert_eq!(text(&path, &["graph", "gate", "--format", "mermaid"]), out);
    assert_eq!(
        text(&path, &["graph", "gate", "--format", "dot"]),
        format!(
            "digraph \"gate\" {{\n    label=\"gate version 1, schema {gate}\";\n    labelloc=t;\n    node [shape=box, style=rounded];\n    \"[*] start\" [shape=circle, style=filled, fillcolor=\"#000000\", label=\"\", width=0.2];\n    \"Ask\";\n    \"Done\";\n    \"[*] end Done\" [shape=doublecircle, style=filled, fillcolor=\"#000000\", label=\"\", width=0.12];\n    \"[*] start\" -> \"Ask\";\n    \"Ask\" -> \"Done\";\n    \"Done\" -> \"[*] end Done\";\n}}\n"
        )
    );

    // `job` has two stored schemas: the newest is that of its most recently created run
    // (running-1, of the first), and a note says so.
    let (job1, job2) = (Job::SCHEMA_HASH.pinned(), JobV2::SCHEMA_HASH.pinned());
    let mut both = [job1.to_string(), job2.to_string()];
    both.sort();
    let (out, err) = graph(&path, &["graph", "job"]);
    assert_eq!(
        out,
        format!(
            "---\ntitle: \"job version 1, schema {job1}\"\n---\nstateDiagram-v2\n    [*] --> Start\n    Start --> Work\n    Work --> Done\n    Done --> [*]\n"
        )
    );
    assert_eq!(
        err,
        format!(
            "note: workflow `job` has 2 stored schemas ({}, {}); drawing {job1} (that of its most recently created run); --schema HASH draws another\n",
            both[0], both[1]
        )
    );
    // --schema picks one (a prefix is enough), with or without the workflow's name.
    let v2 = format!(
        "---\ntitle: \"job version 2, schema {job2}\"\n---\nstateDiagram-v2\n    [*] --> Start\n    Start --> Done\n    Done --> [*]\n"
    );
    let prefix = &job2.to_string()[..6];
    assert_eq!(
        graph(&path, &["graph", "job", "--schema", prefix]),
        (v2.clone(), String::new())
    );
    assert_eq!(graph(&path, &["graph", "--schema", prefix]).0, v2);

    let err = fails(&path, &["graph", "gate", "--schema", prefix], 1);
    assert_eq!(
        err,
        format!("error: schema {job2} is a schema of workflow `job`, not `gate`\n")
    );
    let err = fails(&path, &["graph", "nope"], 1);
    assert_eq!(
        err,
        format!(
            "error: no schema of workflow `nope` is stored in {} (stored: gate, job)\n",
            path.display()
        )
    );
    let err = fails(&path, &["graph"], 2);
    assert!(
        err.starts_with("error: the following required arguments were not provided"),
        "{err}"
    );
    let err = fails(&path, &["graph", "--run", "done-1", "--schema", prefix], 2);
    assert!(err.contains("cannot be used with"), "{err}");
    // Reading only: the file is unchanged.
    assert_eq!(
        std::fs::read(&path).unwrap(),
        std::fs::read(fixture()).unwrap()
    );

    // Once no run of `job` is left, its schemas are ranked by declared version.
    text(&path, &["cancel", "running-1"]);
    text(&path, &["prune", "--keep-last", "0"]);
    assert_eq!(
        ids(&json(&path, &["runs", "--workflow", "job", "--json"])).len(),
        0
    );
    let (out, err) = graph(&path, &["graph", "job"]);
    assert_eq!(out, v2);
    assert_eq!(
        err,
        format!(
            "note: workflow `job` has 2 stored schemas ({}, {}); drawing {job2} (none has runs left; the highest version); --schema HASH draws another\n",
            both[0], both[1]
        )
    );
}

/// A store with one run of `Fix`, which loops Edit -> Test -> Edit three times, then merges.
fn fix_store() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fix.redb");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let rt = Runtime::open(&path).unwrap();
            let last = rt
                .run("fix-1", Fix::Edit { round: 0 }, &Worker)
                .await
                .unwrap();
            assert_eq!(last, Fix::Merged);
        });
    (dir, path)
}

#[test]
fn graph_of_a_run_highlights_its_path_with_counts_and_its_current_state() {
    let (_dir, path) = fix_store();
    let fix = Fix::SCHEMA_HASH.pinned();
    // Edit, Test, Edit, Test, Edit, Test, Merged: 7 records.
    assert_eq!(
        text(&path, &["graph", "--run", "fix-1"]),
        format!(
            "---\ntitle: \"run fix-1 (fix version 1, schema {fix}) completed at Merged after 6 transitions\"\n---\n\
             stateDiagram-v2\n    \
             [*] --> Edit\n    \
             Edit --> Test: 3×\n    \
             Edit --> Dropped\n    \
             Test --> Edit: 2×\n    \
             Test --> Merged: 1×\n    \
             Merged --> [*]\n    \
             Dropped --> [*]\n    \
             classDef visited fill:#dbeafe,stroke:#2563eb,stroke-width:1px\n    \
             class Edit,Test visited\n    \
             classDef current fill:#bbf7d0,stroke:#15803d,stroke-width:3px\n    \
             class Merged current\n"
        )
    );
    assert_eq!(
        text(
            &path,
            &["graph", "fix", "--run", "fix-1", "--format", "dot"]
        ),
        format!(
            "digraph \"fix\" {{\n    \
             label=\"run fix-1 (fix version 1, schema {fix}) completed at Merged after 6 transitions\";\n    \
             labelloc=t;\n    \
             node [shape=box, style=rounded];\n    \
             \"[*] start\" [shape=circle, style=filled, fillcolor=\"#000000\", label=\"\", width=0.2];\n    \
             \"Edit\" [style=\"rounded,filled\", fillcolor=\"#dbeafe\", color=\"#2563eb\"];\n    \
             \"Test\" [style=\"rounded,filled\", fillcolor=\"#dbeafe\", color=\"#2563eb\"];\n    \
             \"Merged\" [style=\"rounded,filled\", fillcolor=\"#bbf7d0\", color=\"#15803d\", penwidth=3];\n    \
             \"[*] end Merged\" [shape=doublecircle, style=filled, fillcolor=\"#000000\", label=\"\", width=0.12];\n    \
             \"Dropped\" [style=\"rounded,filled\", fillcolor=\"#ffffff\", color=\"#000000\"];\n    \
             \"[*] end Dropped\" [shape=doublecircle, style=filled, fillcolor=\"#000000\", label=\"\", width=0.12];\n    \
             \"[*] start\" -> \"Edit\" [color=\"#2563eb\", penwidth=2];\n    \
             \"Edit\" -> \"Test\" [color=\"#2563eb\", penwidth=2, label=\"3×\"];\n    \
             \"Edit\" -> \"Dropped\" [color=\"#9ca3af\"];\n    \
             \"Test\" -> \"Edit\" [color=\"#2563eb\", penwidth=2, label=\"2×\"];\n    \
             \"Test\" -> \"Merged\" [color=\"#2563eb\", penwidth=2, label=\"1×\"];\n    \
             \"Merged\" -> \"[*] end Merged\" [color=\"#2563eb\", penwidth=2];\n    \
             \"Dropped\" -> \"[*] end Dropped\" [color=\"#9ca3af\"];\n\
             }}\n"
        )
    );

    // A failed run and a waiting one: the current state in the colour of the status.
    let (_dir, path) = store();
    let job1 = Job::SCHEMA_HASH.pinned();
    assert_eq!(
        text(&path, &["graph", "--run", "failed-1"]),
        format!(
            "---\ntitle: \"run failed-1 (job version 1, schema {job1}) failed at Work after 1 transition\"\n---\n\
             stateDiagram-v2\n    \
             [*] --> Start\n    \
             Start --> Work: 1×\n    \
             Work --> Done\n    \
             Done --> [*]\n    \
             classDef visited fill:#dbeafe,stroke:#2563eb,stroke-width:1px\n    \
             class Start visited\n    \
             classDef current fill:#fecaca,stroke:#b91c1c,stroke-width:3px\n    \
             class Work current\n"
        )
    );
    let out = text(&path, &["graph", "--run", "waiting-1"]);
    assert!(
        out.ends_with("    classDef current fill:#fde68a,stroke:#b45309,stroke-width:3px\n    class Ask current\n"),
        "{out}"
    );
    // The run of the second schema is drawn with its own schema.
    let out = text(&path, &["graph", "--run", "v2-1"]);
    assert!(out.contains("    Start --> Done: 1×\n"), "{out}");

    let err = fails(&path, &["graph", "gate", "--run", "failed-1"], 1);
    assert_eq!(
        err,
        "error: run `failed-1` is a run of workflow `job`, not `gate`\n"
    );
    let err = fails(&path, &["graph", "--run", "nope"], 1);
    assert!(
        err.starts_with("error: run `nope` does not exist in store"),
        "{err}"
    );
    let err = fails(&path, &["graph", "--run", " x"], 2);
    assert_eq!(
        err,
        "error: invalid run id \" x\": starts or ends with white space\n"
    );
}

/// The `data-*` attribute `name` of every element of `svg` with class `class`.
fn svg_attrs(svg: &roxmltree::Document, class: &str, name: &str) -> Vec<String> {
    svg.descendants()
        .filter(|n| n.attribute("class") == Some(class))
        .map(|n| n.attribute(name).unwrap().to_owned())
        .collect()
}

#[test]
fn graph_writes_an_svg_that_parses_and_names_every_state() {
    let (dir, path) = store();
    let file = dir.path().join("job.svg");
    let (out, err) = graph(
        &path,
        &[
            "graph",
            "job",
            "--schema",
            &Job::SCHEMA_HASH.pinned().to_string(),
            "--svg",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(
        (out.as_str(), err.as_str()),
        ("", ""),
        "--svg alone prints nothing"
    );
    let text_of = std::fs::read_to_string(&file).unwrap();
    let svg = roxmltree::Document::parse(&text_of).unwrap();
    assert_eq!(svg.root_element().tag_name().name(), "svg");
    assert_eq!(
        svg.root_element().tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    assert_eq!(
        svg_attrs(&svg, "state", "data-state"),
        ["Start", "Work", "Done"]
    );
    assert_eq!(svg_attrs(&svg, "start", "data-state"), ["[*] start"]);
    assert_eq!(svg_attrs(&svg, "end", "data-state"), ["[*] end Done"]);
    let words: Vec<&str> = svg
        .descendants()
        .filter(|n| n.tag_name().name() == "tspan")
        .filter_map(|n| n.text())
        .collect();
    assert_eq!(words, ["Start", "Work", "Done"]);
    let edges: Vec<(String, String)> = svg_attrs(&svg, "transition", "data-from")
        .into_iter()
        .zip(svg_attrs(&svg, "transition", "data-to"))
        .collect();
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        edges,
        [
            pair("[*] start", "Start"),
            pair("Start", "Work"),
            pair("Work", "Done"),
            pair("Done", "[*] end Done")
        ]
    );

    // A run's path, to stdout; with --format as well, the text goes with it (to a file).
    let (_fix_dir, fix) = fix_store();
    let out = text(&fix, &["graph", "--run", "fix-1", "--svg", "-"]);
    let svg = roxmltree::Document::parse(&out).unwrap();
    assert_eq!(svg_attrs(&svg, "current", "data-state"), ["Merged"]);
    assert_eq!(svg_attrs(&svg, "visited", "data-state"), ["Edit", "Test"]);
    assert_eq!(svg_attrs(&svg, "state", "data-state"), ["Dropped"]);
    let taken: Vec<u64> = svg_attrs(&svg, "transition", "data-taken")
        .iter()
        .map(|n| n.parse().unwrap())
        .collect();
    // Start, Edit -> Test, Edit -> Dropped, Test -> Edit, Test -> Merged, the two ends.
    assert_eq!(taken, [1, 3, 0, 2, 1, 1, 0]);
    // Every state's name, and the counts on the transitions taken, are written.
    let mut words: Vec<&str> = svg
        .descendants()
        .filter(|n| n.tag_name().name() == "tspan")
        .filter_map(|n| n.text())
        .collect();
    words.sort_unstable();
    assert_eq!(
        words,
        ["1×", "2×", "3×", "Dropped", "Edit", "Merged", "Test"]
    );
    let file = dir.path().join("fix.svg");
    let dot = text(
        &fix,
        &[
            "graph",
            "--run",
            "fix-1",
            "--format",
            "dot",
            "--svg",
            file.to_str().unwrap(),
        ],
    );
    assert!(dot.starts_with("digraph \"fix\" {\n"), "{dot}");
    roxmltree::Document::parse(&std::fs::read_to_string(&file).unwrap()).unwrap();

    let err = fails(&fix, &["graph", "fix", "--svg", "-", "--format", "dot"], 2);
    assert!(
        err.starts_with("error: --svg - and --format both write to stdout"),
        "{err}"
    );
    // A path under a regular file cannot be written, whoever runs the test (root too).
    let under_a_file = file.join("fix.svg");
    let err = fails(
        &fix,
        &["graph", "fix", "--svg", under_a_file.to_str().unwrap()],
        1,
    );
    assert!(
        err.starts_with(&format!(
            "error: cannot write the SVG to {}: ",
            under_a_file.display()
        )),
        "{err}"
    );
}

/// The deliver example's workflow (its file depends on `loops` and `serde` only).
#[allow(dead_code)]
#[path = "../../examples/deliver/workflow.rs"]
mod deliver;

/// Ends a deliver run at once: enough to store the workflow's schema description.
struct GiveUp;

impl deliver::v1::DeliverHandler for GiveUp {
    type Error = BoxError;

    async fn received(
        &self,
        _: &Context,
        _: deliver::Issue,
        _: deliver::Base,
    ) -> Result<deliver::v1::ReceivedNext, BoxError> {
        Ok(deliver::v1::ReceivedNext::Abandoned {
            reason: "a test".into(),
        })
    }

    async fn planned(
        &self,
        _: &Context,
        _: deliver::Issue,
        _: deliver::Base,
        _: deliver::Change,
    ) -> Result<deliver::v1::PlannedNext, BoxError> {
        Err("only Received is handled".into())
    }

    async fn edited(
        &self,
        _: &Context,
        _: deliver::Issue,
        _: deliver::Work,
        _: u32,
    ) -> Result<deliver::v1::EditedNext, BoxError> {
        Err("only Received is handled".into())
    }

    async fn tested(
        &self,
        _: &Context,
        _: deliver::Issue,
        _: deliver::Work,
        _: u32,
        _: deliver::TestReport,
    ) -> Result<deliver::v1::TestedNext, BoxError> {
        Err("only Received is handled".into())
    }
}

/// Version 2 of the example's workflow, which its binary starts new runs on: ends at once too.
impl deliver::v2::DeliverHandler for GiveUp {
    type Error = BoxError;

    async fn received(
        &self,
        _: &Context,
        _: deliver::Issue,
        _: deliver::Base,
    ) -> Result<deliver::v2::ReceivedNext, BoxError> {
        Ok(deliver::v2::ReceivedNext::Abandoned {
            reason: "a test".into(),
        })
    }

    async fn planned(
        &self,
        _: &Context,
        _: deliver::Issue,
        _: deliver::Base,
        _: deliver::Change,
    ) -> Result<deliver::v2::PlannedNext, BoxError> {
        Err("only Received is handled".into())
    }

    async fn edited(
        &self,
        _: &Context,
        _: deliver::Issue,
        _: deliver::Work,
        _: u32,
    ) -> Result<deliver::v2::EditedNext, BoxError> {
        Err("only Received is handled".into())
    }

    async fn tested(
        &self,
        _: &Context,
        _: deliver::Issue,
        _: deliver::Work,
        _: u32,
        _: deliver::TestReport,
    ) -> Result<deliver::v2::TestedNext, BoxError> {
        Err("only Received is handled".into())
    }

    async fn reviewed(
        &self,
        _: &Context,
        _: deliver::Issue,
        _: deliver::Work,
        _: deliver::Review,
    ) -> Result<deliver::v2::ReviewedNext, BoxError> {
        Err("only Received is handled".into())
    }
}

#[test]
fn the_readme_shows_the_graph_of_the_deliver_example() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deliver.redb");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let rt = Runtime::open(&path).unwrap();
            let issue = deliver::Issue {
                number: 1,
                title: "t".into(),
                body: "b".into(),
            };
            let base = deliver::Base {
                branch: "main".into(),
                commit: "0".repeat(40),
            };
            // The demo's store: a run of each version (the graph is the newest schema's).
            let initial = deliver::v1::Deliver::Received {
                issue: issue.clone(),
                base: base.clone(),
            };
            rt.run("deliver-0", initial, &GiveUp).await.unwrap();
            let initial = deliver::v2::Deliver::Received { issue, base };
            rt.run("deliver-1", initial, &GiveUp).await.unwrap();
        });
    let graph = text(&path, &["graph", "deliver"]);
    let block = format!("```mermaid\n{graph}```\n");
    let readme_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&readme_path).unwrap();
    let start = readme
        .find("```mermaid\n")
        .expect("a mermaid block in README.md");
    let end = start + readme[start..].find("\n```\n").expect("its end") + "\n```\n".len();
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        let updated = format!("{}{block}{}", &readme[..start], &readme[end..]);
        std::fs::write(&readme_path, updated).unwrap();
        return;
    }
    assert_eq!(
        &readme[start..end],
        block,
        "README.md's graph of the deliver workflow is out of date: run \
         `UPDATE_SNAPSHOTS=1 cargo test -p loops-cli --test cli the_readme`, or paste:\n{block}"
    );
}

// ---------------------------------------------------------------------------------------------
// Steering, checked through the library.

#[test]
fn cancel_retry_and_send_change_the_runs() {
    let (_dir, path) = store();
    let out = text(
        &path,
        &["cancel", "running-1", "--reason", "stuck since Tuesday"],
    );
    assert_eq!(
        out,
        "cancelled run running-1 (running in state Work, seq 1): stuck since Tuesday\n"
    );
    let v = json(&path, &["cancel", "waiting-1", "--json"]);
    assert_eq!(v["status"], "cancelled");
    assert_eq!(v["cancel_reason"], "cancelled with the loops CLI");
    let err = fails(&path, &["cancel", "done-1"], 1);
    assert_eq!(
        err,
        "error: run `done-1` has ended (completed); cancel is not possible\n"
    );

    let (_dir3, path3) = store();
    assert_eq!(
        text(&path3, &["retry", "failed-1"]),
        "run failed-1 is running again in state Work (seq 1); its next attempt, number 2, starts a fresh budget of attempts; the process that drives workflow `job` resumes it when it next starts (Runtime::resume_all) or drives it\n"
    );
    let v = json(&path, &["retry", "failed-1", "--json"]);
    assert_eq!(
        (&v["status"], &v["state"], &v["seq"]),
        (&json!("running"), &json!("Work"), &json!(1))
    );
    let err = fails(&path, &["retry", "done-1"], 1);
    assert_eq!(
        err,
        "error: run `done-1` is completed, not failed; only a failed run can be retried\n"
    );

    {
        let store = RedbStore::open_read_only(&path).unwrap();
        assert_eq!(
            store.run("running-1").unwrap().unwrap().status,
            RunStatus::Cancelled
        );
        let info = store.run("running-1").unwrap().unwrap();
        assert_eq!(info.cancel.as_deref(), Some("stuck since Tuesday"));
        assert_eq!(
            store.run("waiting-1").unwrap().unwrap().status,
            RunStatus::Cancelled
        );
        let failed = store.run("failed-1").unwrap().unwrap();
        assert_eq!(
            (failed.status, failed.attempt_base),
            (RunStatus::Running, 1)
        );
    }

    // A fresh copy, whose waiting run is still waiting.
    let (_dir2, path2) = store();
    let v = json(
        &path2,
        &[
            "send",
            "waiting-1",
            "approval",
            "--json",
            r#""alice""#,
            "--key",
            "k1",
            "--output",
            "json",
        ],
    );
    assert_eq!(
        (&v["run_id"], &v["event"], &v["event_seq"], &v["duplicate"]),
        (
            &json!("waiting-1"),
            &json!("approval"),
            &json!(0),
            &json!(false)
        )
    );
    assert_eq!(v["run"]["status"], "waiting");
    // The key again with another payload: nothing written, and stderr says the request the
    // key names was another one.
    let send_k1 = |payload: &str| {
        out_err(
            &path2,
            &[
                "send",
                "waiting-1",
                "approval",
                "--json",
                payload,
                "--key",
                "k1",
            ],
        )
    };
    let sent_already =
        "an event with key `k1` was sent to run waiting-1 already (event seq 0); nothing written\n";
    // Another request under the key: refused (exit 1), nothing on stdout.
    let refused = loops(&path2)
        .args([
            "send",
            "waiting-1",
            "approval",
            "--json",
            r#""bob""#,
            "--key",
            "k1",
        ])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(
        (
            String::from_utf8(refused.stdout).unwrap(),
            String::from_utf8(refused.stderr).unwrap()
        ),
        (
            String::new(),
            "error: run `waiting-1`: the event sent with key `k1` (event seq 0) was `approval` with another payload: \"alice\"; this one was not sent: send it with another key if it is a new request\n".to_owned()
        )
    );
    // The same request again (the same JSON value): a retry, said without a note.
    assert_eq!(
        send_k1(r#" "alice" "#),
        (sent_already.to_owned(), String::new())
    );
    let events = RedbStore::open_read_only(&path2)
        .unwrap()
        .events("waiting-1")
        .unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].1.payload.get(), r#""alice""#);
    assert_eq!(events[0].1.key.as_deref(), Some("k1"));
    assert!(!events[0].2, "pending until the run is driven");

    // The event reaches the run when its workflow's process drives it again.
    let done = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let rt = Runtime::open(&path2).unwrap();
            rt.run(
                "waiting-1",
                Gate::Ask {
                    doc: "ignored".into(),
                },
                &Worker,
            )
            .await
        })
        .unwrap();
    assert_eq!(done, Gate::Done { by: "alice".into() });

    let err = fails(&path2, &["send", "done-1", "approval", "--json", "1"], 1);
    assert_eq!(
        err,
        "error: run `done-1` has ended (completed); sending an event is not possible\n"
    );
}

/// Runs `loops ARGS`, expects success, returns stdout and stderr.
fn out_err(path: &Path, args: &[&str]) -> (String, String) {
    let out = loops(path).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "loops {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn send_notes_when_the_run_is_not_waiting_for_the_event_and_refuses_ended_runs() {
    let (_dir, path) = store();
    // waiting-1 waits for `approval`: `approve` is accepted (sending ahead of a wait is
    // legitimate), with a note on stderr.
    let (out, err) = out_err(
        &path,
        &[
            "send",
            "waiting-1",
            "approve",
            "--json",
            r#"{"by":"alice"}"#,
        ],
    );
    assert_eq!(out, "sent event `approve` to run waiting-1 (event seq 0)\n");
    assert_eq!(
        err,
        "note: run waiting-1 is not waiting for event `approve` now (it waits for event `approval` in state Ask); `approve` is kept in its inbox until a wait for `approve` takes it\n"
    );
    // The same note with --output json; stdout is the JSON receipt alone.
    let (out, err) = out_err(
        &path,
        &[
            "send",
            "waiting-1",
            "approve",
            "--json",
            "2",
            "--output",
            "json",
        ],
    );
    assert_eq!(
        err,
        "note: run waiting-1 is not waiting for event `approve` now (it waits for event `approval` in state Ask); `approve` is kept in its inbox until a wait for `approve` takes it\n"
    );
    let shown = json(&path, &["show", "waiting-1", "--json"]);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!({
            "run_id": "waiting-1", "event": "approve", "event_seq": 1, "duplicate": false,
            "run": shown["run"],
        })
    );
    let pending: Vec<(&Value, &Value)> = shown["pending_events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (&e["name"], &e["payload"]))
        .collect();
    assert_eq!(
        pending,
        [
            (&json!("approve"), &json!({"by": "alice"})),
            (&json!("approve"), &json!(2))
        ]
    );
    let shown = text(&path, &["show", "waiting-1"]);
    assert!(
        shown.contains("\npending events  approve (event seq 0), approve (event seq 1)\n"),
        "{shown}"
    );

    // The event it waits for, a duplicate key: no note; a running run: a note.
    let (out, err) = out_err(
        &path,
        &["send", "waiting-1", "approval", "--json", "\"bob\""],
    );
    assert_eq!(
        (out.as_str(), err.as_str()),
        (
            "sent event `approval` to run waiting-1 (event seq 2); the run waits for it and takes it when a process that drives workflow `gate` next starts, if the workflow's type reads it (checked here against the stored schema only: a value the type refuses is set aside, as `loops history` shows)\n",
            ""
        )
    );
    // Another behind it: the run takes `bob` first (events are taken in the order sent),
    // said once; the same key again is a duplicate, nothing said.
    let (out, err) = out_err(
        &path,
        &["send", "waiting-1", "approval", "--json", "1", "--key", "k"],
    );
    assert_eq!(
        (out.as_str(), err.as_str()),
        (
            "sent event `approval` to run waiting-1 (event seq 3)\n",
            "note: run waiting-1 takes the `approval` sent before this one (event seq 2) first; this one (event seq 3) is kept in its inbox until a wait for `approval` takes it\n"
        )
    );
    let (_, err) = out_err(
        &path,
        &["send", "waiting-1", "approval", "--json", "1", "--key", "k"],
    );
    assert_eq!(err, "");
    // A payload that starts with `-` is a payload, not an option.
    let (out, err) = out_err(&path, &["send", "waiting-1", "approval", "--json", "-5"]);
    assert!(
        out.starts_with("sent event `approval` to run waiting-1 (event seq 4)"),
        "{out}{err}"
    );
    let (out, err) = out_err(&path, &["send", "running-1", "approve", "--json", "1"]);
    assert_eq!(
        (out.as_str(), err.as_str()),
        (
            "sent event `approve` to run running-1 (event seq 0)\n",
            "note: run running-1 is not waiting for event `approve` now (it is running in state Work); `approve` is kept in its inbox until a wait for `approve` takes it\n"
        )
    );

    // A run that has ended takes no event: the runtime refuses, and its inbox stays empty.
    for (run, status) in [
        ("done-1", "completed"),
        ("failed-1", "failed"),
        ("cancelled-1", "cancelled"),
    ] {
        assert_eq!(
            fails(&path, &["send", run, "approve", "--json", "1"], 1),
            format!(
                "error: run `{run}` has ended ({status}); sending an event is not possible{}\n",
                if status == "failed" {
                    " while it is failed (a retry makes it running again: `Runtime::retry`, \
                     `loops retry`)"
                } else {
                    ""
                }
            )
        );
        let store = RedbStore::open_read_only(&path).unwrap();
        assert_eq!(store.events(run).unwrap().len(), 0, "{run}");
    }

    // A waiting run cancelled ends at once: the events it had not taken are shown as such,
    // in the column the other labels set.
    text(&path, &["cancel", "waiting-1", "--reason", "not needed"]);
    let shown = text(&path, &["show", "waiting-1"]);
    assert!(
        shown.contains("\nnot taken       approve (event seq 0), approve (event seq 1), approval (event seq 2), approval (event seq 3), approval (event seq 4) (the run ended first)\n"),
        "{shown}"
    );
    assert!(shown.contains("\nstatus          cancelled\n"), "{shown}");
}

#[test]
fn cancel_refuses_an_empty_reason_or_one_with_control_characters() {
    let (_dir, path) = store();
    for reason in ["", "  "] {
        assert_eq!(
            fails(&path, &["cancel", "waiting-1", "--reason", reason], 2),
            "error: --reason is empty: say why the run is cancelled, or leave --reason out for the default reason (\"cancelled with the loops CLI\")\n"
        );
    }
    // A reason is one line in `show`, `runs` and logs: a line break or a terminal escape in
    // it is refused (by loops-core's rule, as `Runtime::cancel` refuses it).
    for (reason, shown) in [("a\nb", r#""a\nb""#), ("a\u{1b}[2Jb", r#""a\u{1b}[2Jb""#)] {
        assert_eq!(
            fails(&path, &["cancel", "waiting-1", "--reason", reason], 2),
            format!(
                "error: run `waiting-1`: invalid cancellation reason {shown}: contains control characters (a line break, a tab, a terminal escape): a reason is one line of text\n"
            )
        );
    }
    let store = RedbStore::open_read_only(&path).unwrap();
    let info = store.run("waiting-1").unwrap().unwrap();
    assert_eq!((info.status, info.cancel), (RunStatus::Waiting, None));
    drop(store);
    assert_eq!(
        text(&path, &["cancel", "waiting-1"]),
        "cancelled run waiting-1 (waiting in state Ask, seq 0): cancelled with the loops CLI\n"
    );
}

/// Text a store holds with control characters (written before loops refused them in a
/// reason, or by hand) is shown escaped, on its line: `show` keeps its layout, and a terminal
/// escape is printed, not obeyed.
#[test]
fn show_escapes_control_characters_in_stored_text() {
    let (_dir, path) = store();
    let tokio = tokio::runtime::Runtime::new().unwrap();
    tokio.block_on(async {
        let rt = Runtime::open(&path).unwrap();
        rt.store()
            .write(
                None,
                loops_core::Write::Cancel {
                    run_id: "waiting-1".to_owned(),
                    reason: "first line\nsecond \u{1b}[2J\tend".to_owned(),
                    end_now: true,
                    at_ms: 1,
                },
            )
            .await
            .unwrap();
        rt.shutdown().await;
    });
    let shown = text(&path, &["show", "waiting-1"]);
    assert!(
        shown.contains("\ncancelled       first line\\nsecond \\u{1b}[2J\\tend\n"),
        "{shown}"
    );
    assert!(!shown.contains('\u{1b}'), "{shown:?}");
}

#[test]
fn retry_resets_the_budget_while_attempt_numbers_count_on() {
    let (_dir, path) = store();
    let attempts = |path: &Path| {
        let v = json(path, &["history", "failed-1", "--json"]);
        let failed: Vec<u64> = v["transitions"][1]["failures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["attempt"].as_u64().unwrap())
            .collect();
        (v["run"]["attempt"].as_u64().unwrap(), failed)
    };
    assert_eq!(attempts(&path), (1, vec![1]));
    text(&path, &["retry", "failed-1"]);
    // The row still names the last attempt made; the next one is number 2.
    assert_eq!(attempts(&path), (1, vec![1]));
    let out = text(&path, &["show", "failed-1"]);
    assert!(
        out.contains("\nstate           Work (seq 1, attempt 1; retried after attempt 1)\n"),
        "{out}"
    );

    // Driven again (its handler fails again, and the policy allows one attempt): attempt 2,
    // within a budget of its own.
    let err = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let rt = Runtime::builder()
                .retry(RetryPolicy::never())
                .open(&path)
                .unwrap();
            rt.run(
                "failed-1",
                Job::Start {
                    mode: "fail".into(),
                },
                &Worker,
            )
            .await
        })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "run `failed-1` failed in state `Work` (seq 1) after 1 attempt"
    );
    assert_eq!(attempts(&path), (2, vec![1, 2]));
    let out = text(&path, &["show", "failed-1"]);
    assert!(
        out.contains("\nstate           Work (seq 1, attempt 2; retried after attempt 1)\n"),
        "{out}"
    );
    let help = help(&["retry", "--help"]);
    assert!(
        help.contains(
            "attempt 3 until its next attempt, number 4 (ctx.attempt() in the handler), starts."
        ),
        "{help}"
    );
}

#[test]
fn send_names_what_is_invalid_an_event_name_or_a_key() {
    let (_dir, path) = store();
    let send = |event: &str, key: Option<&str>| {
        let mut args = vec!["send", "waiting-1", event, "--json", "1"];
        args.extend(key.map(|k| ["--key", k]).into_iter().flatten());
        fails(&path, &args, 2)
    };
    assert_eq!(
        send("approval", Some("")),
        "error: run `waiting-1`: invalid idempotency key \"\": empty\n"
    );
    assert_eq!(
        send("approval", Some("a\tb")),
        "error: run `waiting-1`: invalid idempotency key \"a\\tb\": contains control characters\n"
    );
    assert_eq!(
        send("", Some("k")),
        "error: run `waiting-1`: invalid event name \"\": empty\n"
    );
    assert_eq!(
        send(&"e".repeat(257), None),
        format!(
            "error: run `waiting-1`: invalid event name \"{}\"... (257 bytes): longer than 256 bytes\n",
            "e".repeat(64)
        )
    );
    let store = RedbStore::open_read_only(&path).unwrap();
    assert_eq!(store.events("waiting-1").unwrap().len(), 0);
}

#[test]
fn send_reads_a_large_payload_from_a_file_or_stdin() {
    let (dir, path) = store();
    // Longer than one command-line argument may be on Linux (128 KiB).
    let payload = |by: &str| format!(r#"{{"by":"{by}","log":"{}"}}"#, "x".repeat(300_000));
    let file = dir.path().join("approval.json");
    // With a byte order mark, as some editors write one: not part of the payload.
    std::fs::write(&file, format!("\u{feff}{}\n", payload("file"))).unwrap();
    let file_arg = file.to_str().unwrap();
    let (out, err) = out_err(
        &path,
        &["send", "waiting-1", "approval", "--json-file", file_arg],
    );
    assert_eq!(
        (out.as_str(), err.as_str()),
        (
            "sent event `approval` to run waiting-1 (event seq 0); the run waits for it and takes it when a process that drives workflow `gate` next starts, if the workflow's type reads it (checked here against the stored schema only: a value the type refuses is set aside, as `loops history` shows)\n",
            ""
        )
    );
    let out = loops(&path)
        .args([
            "send",
            "waiting-1",
            "note",
            "--json-file",
            "-",
            "--output",
            "json",
        ])
        .write_stdin(format!("\u{feff}{}", payload("stdin")))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let sent: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&sent["event"], &sent["event_seq"]),
        (&json!("note"), &json!(1))
    );

    let events = RedbStore::open_read_only(&path)
        .unwrap()
        .events("waiting-1")
        .unwrap();
    let stored: Vec<(&str, &str)> = events
        .iter()
        .map(|(_, e, _)| (e.name.as_str(), e.payload.get()))
        .collect();
    let (from_file, from_stdin) = (payload("file"), payload("stdin"));
    assert!(
        stored
            == [
                ("approval", from_file.as_str()),
                ("note", from_stdin.as_str())
            ],
        "the payloads are stored as sent"
    );

    // A missing file, a file that is not JSON, bad stdin: one line each, nothing written.
    let missing = dir.path().join("missing.json");
    assert_eq!(
        fails(
            &path,
            &[
                "send",
                "waiting-1",
                "approval",
                "--json-file",
                missing.to_str().unwrap()
            ],
            2
        ),
        format!(
            "error: cannot read --json-file {}: {}\n",
            missing.display(),
            std::io::Error::from_raw_os_error(2)
        )
    );
    std::fs::write(&file, "{\"by\": \"alice\",}\n").unwrap();
    assert_eq!(
        fails(
            &path,
            &["send", "waiting-1", "approval", "--json-file", file_arg],
            2
        ),
        format!(
            "error: --json-file {} is not valid JSON: key must be a string at line 1 column 16\n",
            file.display()
        )
    );
    let out = loops(&path)
        .args(["send", "waiting-1", "approval", "--json-file", "-"])
        .write_stdin("")
        .output()
        .unwrap();
    assert_eq!(
        (out.status.code(), String::from_utf8(out.stderr).unwrap()),
        (
            Some(2),
            "error: the payload on stdin (--json-file -) is not valid JSON: EOF while parsing a value at line 1 column 0\n".to_owned()
        )
    );
    let out = loops(&path)
        .args(["send", "waiting-1", "approval", "--json-file", "-"])
        .write_stdin(vec![b'"', 0xff, b'"'])
        .output()
        .unwrap();
    assert_eq!(
        (out.status.code(), String::from_utf8(out.stderr).unwrap()),
        (
            Some(2),
            "error: cannot read the payload on stdin (--json-file -): stream did not contain valid UTF-8\n".to_owned()
        )
    );
    // Over the runtime's limit (2 MiB).
    std::fs::write(&file, format!("\"{}\"", "x".repeat(2 * 1024 * 1024))).unwrap();
    assert_eq!(
        fails(
            &path,
            &["send", "waiting-1", "approval", "--json-file", file_arg],
            2
        ),
        "error: run `waiting-1`: payload of event `approval` is 2097154 bytes, over the 2097152-byte limit\n"
    );
    // Over what any loops process takes in one request: refused once that much is read, not
    // read whole (a file), nor read until memory runs out (a stream that never ends).
    let over = "error: cannot read {}: it is over 64 MiB, the most a loops process takes in one request; an event's payload is at most the runtime's max_payload_bytes (2 MiB by default): keep large data outside the store and send a reference to it\n";
    let huge = dir.path().join("huge.json");
    std::fs::write(&huge, vec![b' '; loops_core::control::MAX_BODY_BYTES + 1]).unwrap();
    assert_eq!(
        fails(
            &path,
            &[
                "send",
                "waiting-1",
                "approval",
                "--json-file",
                huge.to_str().unwrap()
            ],
            2
        ),
        over.replace("{}", &format!("--json-file {}", huge.display()))
    );
    std::fs::remove_file(&huge).unwrap();
    let mut endless = std::process::Command::new(assert_cmd::cargo::cargo_bin("loops"))
        .env("LOOPS_STORE", &path)
        .env("NO_COLOR", "1")
        .args(["send", "waiting-1", "approval", "--json-file", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = endless.stdin.take().unwrap();
    // Writes until the reader stops reading (a broken pipe).
    let writer = std::thread::spawn(move || {
        let chunk = vec![b' '; 1 << 20];
        while std::io::Write::write_all(&mut stdin, &chunk).is_ok() {}
    });
    let out = endless.wait_with_output().unwrap();
    writer.join().unwrap();
    assert_eq!(
        (out.status.code(), String::from_utf8(out.stderr).unwrap()),
        (
            Some(2),
            over.replace("{}", "the payload on stdin (--json-file -)")
        )
    );
    assert_eq!(
        RedbStore::open_read_only(&path)
            .unwrap()
            .events("waiting-1")
            .unwrap()
            .len(),
        2
    );

    // One payload, from one place.
    let err = fails(
        &path,
        &[
            "send",
            "waiting-1",
            "approval",
            "--json",
            "1",
            "--json-file",
            file_arg,
        ],
        2,
    );
    assert_eq!(
        err,
        "error: the argument '--json <PAYLOAD>' cannot be used with '--json-file <PATH>'; try 'loops send --help'\n"
    );
    let err = fails(&path, &["send", "waiting-1", "approval"], 2);
    assert_eq!(
        err,
        "error: the following required arguments were not provided: <--json <PAYLOAD>|--json-file <PATH>>; try 'loops send --help'\n"
    );
}

#[test]
fn send_refuses_invalid_json_and_writes_nothing() {
    let (_dir, path) = store();
    let before = std::fs::read(&path).unwrap();
    let err = fails(
        &path,
        &["send", "waiting-1", "approval", "--json", "{not json"],
        2,
    );
    assert_eq!(
        err,
        "error: --json is not valid JSON: key must be a string at line 1 column 2\n"
    );
    let err = fails(&path, &["send", "waiting-1", "approval", "--json", ""], 2);
    assert!(
        err.starts_with("error: --json is not valid JSON: EOF"),
        "{err}"
    );
    // Valid syntax, but a lone surrogate escape is no character: refused before the store is
    // opened, in one line that says so.
    for (payload, problem) in [
        (
            r#"{"by":"\ud800"}"#,
            "unexpected end of hex escape at line 1 column 14",
        ),
        (
            r#"{"by":"\udc00x"}"#,
            "lone leading surrogate in hex escape at line 1 column 13",
        ),
    ] {
        let err = fails(
            &path,
            &["send", "waiting-1", "approval", "--json", payload],
            2,
        );
        assert_eq!(
            err,
            format!(
                "error: --json holds a lone surrogate escape (such as \\ud800 without its \
                 pair), which is no character and no payload can hold: {problem}\n"
            )
        );
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the file is untouched"
    );
}

// ---------------------------------------------------------------------------------------------
// Maintenance.

#[test]
fn prune_dry_run_then_prune_with_exact_counts() {
    let (_dir, path) = store();
    // Ended: done-1, v2-1, failed-1, cancelled-1 (most recent). Keep the last one.
    let dry = json(&path, &["prune", "--keep-last", "1", "--dry-run", "--json"]);
    let size = std::fs::metadata(&path).unwrap().len();
    assert_eq!(
        dry,
        json!({
            "dry_run": true, "runs": 3, "records": 7,
            "run_ids": ["done-1", "v2-1", "failed-1"], "kept_for_parents": 0,
            "kept_for_children": 0, "changed_since_selection": 0,
            "bytes_before": size, "bytes_after": size,
        })
    );
    assert_eq!(
        ids(&json(&path, &["runs", "--json"])).len(),
        6,
        "a dry run removes nothing"
    );
    let out = text(
        &path,
        &["prune", "--keep-last", "1", "--keep-failed", "--dry-run"],
    );
    assert_eq!(
        out,
        "would remove 2 runs (5 transition records, with their steps, failures and events):\n  done-1\n  v2-1\n(dry run: nothing removed)\n"
    );

    let pruned = json(&path, &["prune", "--keep-last", "1", "--json"]);
    assert_eq!(
        (
            &pruned["dry_run"],
            &pruned["runs"],
            &pruned["records"],
            &pruned["run_ids"]
        ),
        (
            &json!(false),
            &json!(3),
            &json!(7),
            &json!(["done-1", "v2-1", "failed-1"])
        )
    );
    let store = RedbStore::open_read_only(&path).unwrap();
    for gone in ["done-1", "v2-1", "failed-1"] {
        assert!(store.run(gone).unwrap().is_none(), "{gone}");
        assert!(store.history(gone).unwrap().is_empty(), "{gone}");
        assert!(store.failures(gone).unwrap().is_empty(), "{gone}");
    }
    for kept in ["running-1", "waiting-1", "cancelled-1"] {
        assert!(store.run(kept).unwrap().is_some(), "{kept}");
    }
    drop(store);

    let out = text(&path, &["prune", "--older-than", "30d"]);
    assert_eq!(out, "no ended run matches; nothing removed\n");
    std::thread::sleep(Duration::from_millis(5));
    let out = text(&path, &["prune", "--older-than", "1ms"]);
    assert!(
        out.starts_with("removed 1 run (1 transition records, with their steps, failures and events):\n  cancelled-1\nstore file: "),
        "{out}"
    );
    assert_eq!(
        ids(&json(&path, &["runs", "--json"])),
        ["waiting-1", "running-1"]
    );

    let err = fails(&path, &["prune"], 2);
    assert!(
        err.starts_with("error: the following required arguments were not provided"),
        "{err}"
    );
}

#[test]
fn compact_and_check_report_on_a_good_file() {
    let (_dir, path) = store();
    json(&path, &["prune", "--keep-last", "0", "--json"]);
    let v = json(&path, &["compact", "--json"]);
    let (before, after) = (
        v["bytes_before"].as_u64().unwrap(),
        v["bytes_after"].as_u64().unwrap(),
    );
    assert!(after <= before, "{v}");
    assert_eq!(v["bytes_reclaimed"].as_u64().unwrap(), before - after);
    assert_eq!(after, std::fs::metadata(&path).unwrap().len());
    let out = text(&path, &["compact"]);
    assert!(
        out.starts_with(&format!("compacted {}\n  before     ", path.display())),
        "{out}"
    );
    assert!(out.contains("\n  reclaimed  "), "{out}");

    // A file closed cleanly is checked on a read-only open: it keeps its bytes.
    let bytes = std::fs::read(&path).unwrap();
    let v = json(&path, &["check", "--json"]);
    assert!(
        std::fs::read(&path).unwrap() == bytes,
        "check changed the file"
    );
    assert_eq!(
        v,
        json!({
            "path": path.display().to_string(), "intact": true, "repaired_on_open": false,
            "runs": 2,
            "by_status": {"running": 1, "waiting": 1, "completed": 0, "failed": 0, "cancelled": 0,
                          "blocked": 0},
        })
    );
    let out = text(&path, &["check"]);
    assert!(out.starts_with(&format!(
        "store {}: intact: every page's checksum verified\n2 runs read back",
        path.display()
    )));
}

// ---------------------------------------------------------------------------------------------
// Errors: one line, non-zero exit, nothing written.

/// A store file a newer loops wrote (its format recorded as 3) is refused in one line naming
/// both formats, by every command, and keeps its format.
#[test]
fn a_store_of_a_newer_format_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("newer.redb");
    drop(RedbStore::open(&path).unwrap());
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let meta: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("meta");
        txn.open_table(meta).unwrap().insert("format", 4).unwrap();
        txn.commit().unwrap();
    }
    for args in [&["runs"][..], &["show", "r1"], &["cancel", "r1"]] {
        loops(&path).args(args).assert().code(1).stderr(format!(
            "error: store {} has format 4, written by a newer loops; this build reads format 3 only: open it with a loops that reads format 4\n",
            path.display()
        ));
    }
}

/// A store file that a running process holds, with no control endpoint answering next to it,
/// is refused in one line by every command, after the command waited a second for the
/// process to answer or to end. The line says whether a socket is there that nothing answers
/// on.
#[test]
fn a_store_held_by_a_running_process_is_refused_in_one_line() {
    let (_dir, path) = store();
    let rt = Runtime::open(&path).unwrap();
    let commands = [
        &["runs"][..],
        &["show", "done-1"],
        &["history", "done-1", "--json"],
        &["graph", "job"],
        &["cancel", "waiting-1"],
        &["prune", "--keep-last", "0"],
        &["compact"],
        &["check"],
    ];
    // Each command waits a second before it fails: run them side by side.
    let refusals = |commands: &[&[&str]]| -> Vec<String> {
        std::thread::scope(|s| {
            let started: Vec<_> = commands
                .iter()
                .map(|args| s.spawn(|| fails(&path, args, 1)))
                .collect();
            started.into_iter().map(|t| t.join().unwrap()).collect()
        })
    };
    let want = format!(
        "error: store {} is in use by a running process that serves no control endpoint (none answers on {}.sock; redb allows no reader beside the process): serve one in it (`Runtime::serve_control_next_to_store`; the example agent serves one with `deliver --serve`), or stop it, then run this command again\n",
        path.display(),
        path.display()
    );
    for (args, got) in commands.iter().zip(refusals(&commands)) {
        assert_eq!(got, want, "loops {args:?}");
    }
    // A socket that an earlier process left, with nothing behind it.
    let socket = path.with_extension("redb.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let want = format!(
        "error: store {} is in use by a running process, and nothing answers on the control endpoint {} (a socket an earlier process left, or one this process has not opened yet or has closed; redb allows no reader beside the process): run this command again once the process answers there, or has stopped\n",
        path.display(),
        socket.display()
    );
    for (args, got) in commands[..2].iter().zip(refusals(&commands[..2])) {
        assert_eq!(got, want, "loops {args:?}");
    }
    drop(rt);
    text(&path, &["runs"]);
}

/// A command started while a process that serves no control endpoint still holds the store
/// (as one does for a few milliseconds as it ends) waits for the file, then reads it.
#[test]
fn a_command_waits_for_a_process_that_ends_to_release_the_store() {
    let (_dir, path) = store();
    let rt = Runtime::open(&path).unwrap();
    let command = std::process::Command::new(assert_cmd::cargo::cargo_bin("loops"))
        .env("LOOPS_STORE", &path)
        .args(["show", "done-1", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(rt);
    let out = command.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["run"]["run_id"], "done-1");
}

#[test]
fn a_store_left_open_by_a_crash_is_repaired_then_read() {
    let (dir, path) = store();
    // A copy taken while a process has the file open is what a crash leaves behind.
    let crashed = dir.path().join("crashed.redb");
    {
        let rt = Runtime::open(&path).unwrap();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(rt.cancel("waiting-1", "before the crash"))
            .unwrap();
        std::fs::copy(&path, &crashed).unwrap();
    }
    assert!(matches!(
        RedbStore::open_read_only(&crashed),
        Err(loops_core::Error::NeedsRecovery { .. })
    ));
    let crashed_too = dir.path().join("crashed-too.redb");
    std::fs::copy(&crashed, &crashed_too).unwrap();
    let before = std::fs::read(&crashed).unwrap();
    let out = loops(&crashed)
        .args(["runs", "--json", "--status", "cancelled"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let said = needs_repair(&crashed);
    assert_eq!(String::from_utf8(out.stderr).unwrap(), said);
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids(&runs), ["waiting-1", "cancelled-1"]);
    // Repaired in memory only: the file keeps its bytes, and the next reading command
    // repairs in memory again.
    assert_eq!(std::fs::read(&crashed).unwrap(), before);
    loops(&crashed).arg("runs").assert().success().stderr(said);
    assert_eq!(std::fs::read(&crashed).unwrap(), before);

    // Commands that write repair on their own open, and say so.
    let out = loops(&crashed_too)
        .args(["check", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        format!(
            "note: {}; redb repaired it on this open\n",
            loops_core::Error::needs_repair(&crashed_too)
        )
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&v["intact"], &v["repaired_on_open"], &v["runs"]),
        (&json!(true), &json!(true), &json!(6))
    );
}

#[test]
fn missing_empty_foreign_and_corrupt_files_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.redb");
    for args in [&["runs"][..], &["cancel", "x"], &["compact"], &["check"]] {
        assert_eq!(
            fails(&missing, args, 1),
            format!("error: store {} does not exist\n", missing.display())
        );
    }
    assert!(!missing.exists(), "no command creates a store");
    // A link to nothing is named as one, in the library's words (loops-core's faults test
    // has the chain and the loop of links).
    let link = dir.path().join("link.redb");
    std::os::unix::fs::symlink(&missing, &link).unwrap();
    for args in [&["runs"][..], &["show", "x"], &["cancel", "x"], &["check"]] {
        assert_eq!(
            fails(&link, args, 1),
            format!(
                "error: cannot open store {}: it is a symbolic link to {}, which does not exist; \
                 a store is not created through a link\n",
                link.display(),
                missing.display()
            )
        );
    }
    assert!(
        !missing.exists(),
        "no command creates a store through a link"
    );

    let empty = dir.path().join("empty.redb");
    std::fs::File::create(&empty).unwrap();
    assert_eq!(
        fails(&empty, &["check"], 1),
        format!(
            "error: cannot open store {}: the file is empty (0 bytes), not a loops store; \
             delete it to start a new store\n",
            empty.display()
        )
    );
    // Shorter than redb's magic number: said so, with its length, not as a number mismatch.
    // Longer, and not a redb file: said not to be a store, in loops' words. Left as they are.
    for (name, bytes, why) in [
        (
            "short.redb",
            &b"abc"[..],
            "the file is too short to be a loops store (3 bytes; every store starts with redb's 9-byte magic number): it was cut short (a backup restores it), or is not a store",
        ),
        (
            "Cargo.toml",
            b"[package]\nname = \"x\"\n",
            "the file does not start with redb's magic number: it is not a loops store (another kind of file), or its first bytes were overwritten (a backup restores it)",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        for args in [&["check"][..], &["runs"], &["cancel", "x"]] {
            assert_eq!(
                fails(&path, args, 1),
                format!("error: cannot open store {}: {why}\n", path.display()),
                "loops {args:?}"
            );
        }
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }

    // A FIFO is named as one, on the reading and the writing paths (it never blocks).
    #[cfg(unix)]
    {
        let fifo = dir.path().join("fifo.redb");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        for args in [&["runs"][..], &["cancel", "x"]] {
            assert_eq!(
                fails(&fifo, args, 1),
                format!(
                    "error: cannot open store {}: it is a FIFO (named pipe), not a regular file; a store is a regular file\n",
                    fifo.display()
                ),
                "loops {args:?}"
            );
        }
    }

    // Another application's redb file: named as one by every command, and never written.
    let foreign = dir.path().join("foreign.redb");
    {
        let db = redb::Database::create(&foreign).unwrap();
        let txn = db.begin_write().unwrap();
        let foo: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("foo");
        txn.open_table(foo).unwrap().insert(1, 2).unwrap();
        txn.commit().unwrap();
    }
    let bytes = std::fs::read(&foreign).unwrap();
    for args in [&["runs"][..], &["cancel", "x"], &["check"], &["upgrade"]] {
        assert_eq!(
            fails(&foreign, args, 1),
            format!(
                "error: cannot open store {}: not a loops store: a redb database of another application (its tables: foo)\n",
                foreign.display()
            ),
            "loops {args:?}"
        );
    }
    assert_eq!(std::fs::read(&foreign).unwrap(), bytes);

    // Random bytes (a fixed xorshift sequence).
    let random = dir.path().join("random.redb");
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let bytes: Vec<u8> = (0..16_384)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&random, &bytes).unwrap();
    for args in [
        &["runs"][..],
        &["show", "x"],
        &["send", "x", "e", "--json", "1"],
        &["check"],
    ] {
        let err = fails(&random, args, 1);
        assert!(
            err.starts_with(&format!("error: cannot open store {}: ", random.display())),
            "loops {args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        // The cause is said once (the error's message names it; its chain adds nothing).
        let parts: Vec<&str> = err.trim_end().split(": ").collect();
        let distinct: std::collections::HashSet<&str> = parts.iter().copied().collect();
        assert_eq!(distinct.len(), parts.len(), "a part said twice: {err}");
    }
    assert_eq!(
        std::fs::read(&random).unwrap(),
        bytes,
        "a foreign file is never written"
    );

    // A store cut in half.
    let (_keep, good) = store();
    let truncated = dir.path().join("truncated.redb");
    let full = std::fs::read(&good).unwrap();
    std::fs::write(&truncated, &full[..full.len() / 2]).unwrap();
    for args in [&["runs"][..], &["history", "done-1"], &["check"]] {
        let out = loops(&truncated).args(args).output().unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "loops {args:?}: {err}");
        assert!(err.starts_with("error: "), "loops {args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "loops {args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        // No advice to read it unverified: that fails on a truncated file too.
        assert!(!err.contains("--no-verify"), "loops {args:?}: {err}");
    }
    let err = String::from_utf8(loops(&truncated).arg("check").output().unwrap().stderr).unwrap();
    assert!(
        err.ends_with(
            "; restore it from a backup (the file is shorter than its own layout says, so nothing reads it, verified or not)\n"
        ),
        "{err}"
    );
    let out = loops(&truncated)
        .args(["--no-verify", "runs"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));

    // A store with a few bytes added to its end: refused, saying how a copy may be
    // recovered; the copy cut as said verifies intact.
    let appended = dir.path().join("appended.redb");
    let mut bytes = full.clone();
    bytes.extend_from_slice(b"abc");
    std::fs::write(&appended, &bytes).unwrap();
    let whole = full.len();
    assert_eq!(whole % 4096, 0);
    let out = loops(&appended).arg("runs").output().unwrap();
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        format!(
            "error: store {} looks damaged: the file's length ({} bytes) is not one redb lays \
             out, nor a whole number of its 4096-byte pages: bytes were added to its end, or it \
             was cut short. A copy cut to {whole} bytes may open (`cp FILE COPY && truncate -s \
             {whole} COPY`, then `loops --store COPY check`); the file itself is left as it is; \
             `loops check` verifies every page of the file\n",
            appended.display(),
            whole + 3
        )
    );
    assert_eq!(std::fs::read(&appended).unwrap(), bytes);
    let copy = dir.path().join("copy.redb");
    std::fs::write(&copy, &bytes[..whole]).unwrap();
    let out = loops(&copy).arg("check").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Every 4 KiB page in turn overwritten with zeros: some pages are free (the commands
    // work), others break the file; redb panics on some kinds of damage, which the tool
    // reports as one line too.
    let mut damaged = 0;
    for page in 0..full.len() / 4096 {
        let mut bytes = full.clone();
        bytes[page * 4096..(page + 1) * 4096].fill(0);
        let file = dir.path().join(format!("page-{page}.redb"));
        std::fs::write(&file, &bytes).unwrap();
        for args in [&["runs", "--json"][..], &["history", "done-1", "--json"]] {
            let out = loops(&file).args(args).output().unwrap();
            let err = String::from_utf8(out.stderr).unwrap();
            match out.status.code() {
                Some(0) => assert_eq!(err, "", "page {page}, loops {args:?}"),
                Some(1) => {
                    damaged += 1;
                    assert!(err.starts_with("error: "), "page {page}: {err}");
                    assert_eq!(err.lines().count(), 1, "page {page}: {err}");
                    assert!(!err.contains("a bug"), "page {page}: {err}");
                }
                other => panic!("page {page}, loops {args:?}: exit {other:?}: {err}"),
            }
        }
    }
    assert!(damaged > 0, "some page mattered");

    // A directory.
    assert_eq!(
        fails(dir.path(), &["runs"], 1),
        format!(
            "error: cannot open store {}: it is a directory, not a regular file; a store is a \
             regular file\n",
            dir.path().display()
        )
    );
    // A store file named as a directory (a trailing `/`), and a missing one.
    let plain = dir.path().join("plain.redb");
    std::fs::write(&plain, b"a file").unwrap();
    // The store's open says what was meant (the rule is loops-core's).
    for (named, meant) in [
        (
            &plain,
            format!(
                "which names a directory, and {} is a file: name the store without the `/`",
                plain.display()
            ),
        ),
        (
            &missing,
            "which names a directory; a store is a regular file: name one in that directory \
             (DIR/agent.redb)"
                .to_owned(),
        ),
    ] {
        let mut slashed = named.clone().into_os_string();
        slashed.push("/");
        let slashed = PathBuf::from(slashed);
        assert_eq!(
            fails(&slashed, &["runs"], 1),
            format!(
                "error: cannot open store {}: the path ends with `/`, {meant}\n",
                slashed.display()
            )
        );
    }
}

/// Overwrites records of the store at `path` by hand, as damage or a foreign tool might.
fn overwrite(path: &Path, edit: impl FnOnce(&redb::WriteTransaction)) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    edit(&txn);
    txn.commit().unwrap();
}

/// Replaces the record of `run`'s log entry of `seq` and `what` ("transition", "step
/// NAME#OCCURRENCE" or "failure ATTEMPT#INDEX") with `record`, in the log of store format
/// 2 (loops-core's `store/redb/log.rs`: kind, previous entry, previous transition for a
/// transition, seq, run id, the key's rest, the record).
fn replace_in_log(txn: &redb::WriteTransaction, run: &str, seq: u64, what: &str, record: &[u8]) {
    use redb::{ReadableTable, TableDefinition};
    let log: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
    let mut table = txn.open_table(log).unwrap();
    let u16_at = |b: &[u8], i: usize| usize::from(u16::from_le_bytes([b[i], b[i + 1]]));
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let mut found = None;
    for entry in table.iter().unwrap() {
        let (key, value) = entry.unwrap();
        let b = value.value();
        let mut at = if b[0] == 1 { 17 } else { 9 };
        let entry_seq = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        at += 8;
        let len = u16_at(b, at);
        let entry_run = std::str::from_utf8(&b[at + 2..at + 2 + len]).unwrap();
        at += 2 + len;
        let kind = match b[0] {
            1 => "transition".to_owned(),
            2 => {
                let len = u16_at(b, at);
                let name = std::str::from_utf8(&b[at + 2..at + 2 + len]).unwrap();
                at += 2 + len + 4;
                format!("step {name}#{}", u32_at(b, at - 4))
            }
            _ => {
                at += 8;
                format!("failure {}#{}", u32_at(b, at - 8), u32_at(b, at - 4))
            }
        };
        if entry_run == run && entry_seq == seq && kind == what {
            found = Some((key.value(), b[..at].to_vec()));
        }
    }
    let (key, mut entry) = found.unwrap_or_else(|| panic!("no {what} of {run} at seq {seq}"));
    entry.extend_from_slice(record);
    table.insert(key, entry.as_slice()).unwrap();
}

#[test]
fn a_record_that_does_not_decode_is_named_for_what_it_is_and_the_store_as_damaged() {
    use redb::{ReadableTable, TableDefinition};
    let (_dir, path) = store();
    overwrite(&path, |txn| {
        let bad = b"{oops".as_slice();
        let inbox: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("inbox");
        txn.open_table(inbox)
            .unwrap()
            .insert(("waiting-1", 0), bad)
            .unwrap();
        replace_in_log(txn, "done-1", 0, "step fetch#0", bad);
        replace_in_log(txn, "failed-1", 1, "failure 1#0", bad);
        replace_in_log(txn, "v2-1", 1, "transition", bad);
        let runs: TableDefinition<&str, &[u8]> = TableDefinition::new("runs");
        let mut runs = txn.open_table(runs).unwrap();
        // A row of format 3 keeps its head in the log (16 bytes), then the row: here the JSON
        // format 2 stored.
        let mut row = runs.get("running-1").unwrap().unwrap().value()[..16].to_vec();
        row.extend_from_slice(b"{}");
        runs.insert("running-1", row.as_slice()).unwrap();
    });
    let damaged = |what: &str| {
        format!(
            "error: store {} looks damaged: {what}; `loops check` verifies every page of the file\n",
            path.display()
        )
    };
    let not_json = "key must be a string at line 1 column 2";
    for (args, what) in [
        (
            &["history", "waiting-1"][..],
            format!("run `waiting-1`: event record at event seq 0 does not decode: {not_json}"),
        ),
        (
            &["show", "waiting-1", "--json"],
            format!("run `waiting-1`: event record at event seq 0 does not decode: {not_json}"),
        ),
        (
            &["history", "done-1", "--json"],
            format!("run `done-1`: step record `fetch`#0 of seq 0 does not decode: {not_json}"),
        ),
        (
            &["history", "failed-1"],
            format!("run `failed-1`: failure record of seq 1 does not decode: {not_json}"),
        ),
        (
            &["show", "v2-1"],
            format!("run `v2-1`: transition record at seq 1 does not decode: {not_json}"),
        ),
        (
            &["graph", "--run", "v2-1"],
            format!("run `v2-1`: transition record at seq 1 does not decode: {not_json}"),
        ),
        (
            &["runs"],
            "run `running-1`: run row does not decode: an encoding version this build does not read at byte 16"
                .to_owned(),
        ),
    ] {
        assert_eq!(fails(&path, args, 1), damaged(&what), "loops {args:?}");
    }
    // Every page's checksum holds (the records were written through redb), but reading the
    // runs back finds the row.
    assert_eq!(
        fails(&path, &["check"], 1),
        format!(
            "error: store {} is damaged: run `running-1`: run row does not decode: an encoding version this build does not read at byte 16\n",
            path.display()
        )
    );
}

#[test]
fn a_read_past_the_end_of_the_file_is_reported_as_damage() {
    let (dir, path) = store();
    let good = std::fs::read(&path).unwrap();
    // A byte flipped in the root page number of the `log` table (the records), in redb's
    // table of tables: the table definition ends with the key type's name, `u64`, preceded
    // by its classification byte, lengths, alignments and fixed sizes (23 bytes), which
    // follow the root's 32-byte header (page number first), and followed by the value
    // type's (`log`'s alone is `&[u8]` after `u64`). Stale copies of the table of tables
    // may be in the file too: every candidate is tried.
    let name = b"u64\x01&[u8]";
    let mut outcomes = Vec::new();
    for at in (56..good.len()).filter(|&i| good[i..].starts_with(name)) {
        let root = at - 23 - 32;
        if good[root - 1] != 1 {
            continue; // no root: an empty table
        }
        let mut bytes = good.clone();
        bytes[root + 3] ^= 0x80; // the page number's region: far past the end of the file
        let file = dir.path().join(format!("flipped-{at}.redb"));
        std::fs::write(&file, &bytes).unwrap();
        // Without the verification that refuses the file before any read (see below). The
        // command's first read of the log is of the run's failures.
        let out = loops(&file)
            .args(["--no-verify", "history", "done-1"])
            .output()
            .unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        outcomes.push((out.status.code(), err, file));
    }
    let want = |file: &Path| {
        format!(
            "error: store {} looks damaged: reading the failures of run `done-1` failed: I/O error: failed to fill whole buffer (the file ends before data it refers to); `loops check` verifies every page of the file\n",
            file.display()
        )
    };
    let hit: Vec<&PathBuf> = outcomes
        .iter()
        .filter(|(code, err, file)| *code == Some(1) && *err == want(file))
        .map(|(_, _, file)| file)
        .collect();
    assert_eq!(hit.len(), 1, "{outcomes:#?}");
    // The other flips hit stale copies of the table of tables: the command works, or fails
    // in one line.
    for (code, err, file) in &outcomes {
        match code {
            Some(0) => assert_eq!(err, "", "{}", file.display()),
            _ => assert_eq!(err.lines().count(), 1, "{}: {err}", file.display()),
        }
    }
    // Verified (the default), the same file is refused before anything is read.
    assert_eq!(
        fails(hit[0], &["history", "done-1"], 1),
        format!(
            "error: store {} looks damaged: verifying the checksum of every page failed: the file ends before data a page refers to; `loops check` verifies every page of the file\n",
            hit[0].display()
        )
    );
    // `loops check` then says how it stands: redb refuses to open it for writing.
    let err = fails(hit[0], &["check"], 1);
    let head = format!(
        "error: store {} is damaged: redb cannot open it (",
        hit[0].display()
    );
    assert!(
        err.starts_with(&head)
            && err.ends_with(
                "); restore it from a backup (until then, `loops --no-verify runs` and `history RUN --json` read what they still can, unverified)\n"
            ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    // As it says, the runs are still listed without the check.
    let listed = json(hit[0], &["--no-verify", "runs", "--json"]);
    assert!(ids(&listed).contains(&"done-1"), "{listed}");
}

/// `loops check` advises `--no-verify` for a file redb cannot open only when an unverified
/// read does open it: over one flipped byte in each 4 KiB of the file, every file `check`
/// says so of is listed by `--no-verify runs`, and every file it says `--no-verify` is no way
/// round for is refused by it too. (A flip in the header made `check` advise a read that
/// failed the same way.)
#[test]
fn check_advises_no_verify_only_when_an_unverified_read_opens_the_file() {
    let (dir, path) = store();
    let good = std::fs::read(&path).unwrap();
    let mut not_advised = 0;
    for offset in (0..good.len())
        .step_by(4096)
        .flat_map(|page| [page + 3, page + 35])
    {
        let Some(&byte) = good.get(offset) else {
            continue;
        };
        let file = dir.path().join(format!("flip-{offset}.redb"));
        let mut bytes = good.clone();
        bytes[offset] = !byte;
        std::fs::write(&file, &bytes).unwrap();
        let check = loops(&file).arg("check").output().unwrap();
        let err = String::from_utf8(check.stderr).unwrap();
        if !err.contains("redb cannot open it") {
            continue;
        }
        let unverified = loops(&file)
            .args(["--no-verify", "runs", "--json"])
            .output()
            .unwrap();
        if err.contains("read what they still can, unverified") {
            assert!(
                unverified.status.success(),
                "{}: {err}; --no-verify runs: {}",
                file.display(),
                String::from_utf8_lossy(&unverified.stderr)
            );
        } else {
            not_advised += 1;
            assert!(
                err.contains("`--no-verify` is no way round")
                    || err.contains("nothing reads it, verified or not"),
                "{err}"
            );
            assert_eq!(
                unverified.status.code(),
                Some(1),
                "{}: {err}",
                file.display()
            );
        }
    }
    // (A file it advises `--no-verify` for, and that reads, is made on purpose by the test
    // above.)
    assert!(
        not_advised > 0,
        "no flip made a file redb cannot open at all"
    );
}

#[test]
fn a_flipped_bit_in_a_record_is_refused_by_reading_commands_unless_no_verify() {
    let (dir, path) = store();
    let good = std::fs::read(&path).unwrap();
    // `done-1`'s last state is `{"Done":{"delivered":2}}`. A bit flipped in the 2 makes it a
    // 3: still JSON, still a record that decodes, and redb's plain read does not check the
    // page's checksum. The file may hold stale copies of the page: every copy is tried, and
    // the one the reads use is the one that changes what `--no-verify` shows.
    let needle = br#""delivered":2"#;
    let mut live = Vec::new();
    for at in (0..good.len()).filter(|&i| good[i..].starts_with(needle)) {
        let mut bytes = good.clone();
        bytes[at + needle.len() - 1] ^= 0x01;
        let file = dir.path().join(format!("flipped-{at}.redb"));
        std::fs::write(&file, &bytes).unwrap();
        let shown = json(&file, &["--no-verify", "history", "done-1", "--json"]);
        if shown["transitions"][2]["payload"] == json!({"Done": {"delivered": 3}}) {
            live.push(file);
        }
    }
    assert_eq!(live.len(), 1, "one copy of the record is read");
    let file = &live[0];
    for args in [
        &["history", "done-1", "--json"][..],
        &["history", "done-1"],
        &["runs", "--json"],
        &["runs"],
        &["show", "done-1", "--json"],
        &["schema"],
        &["graph", "job", "--svg", "-"],
    ] {
        let out = loops(file).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "loops {args:?}");
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "", "loops {args:?}");
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            format!(
                "error: store {} looks damaged: verifying the checksum of every page failed: Primary is corrupted despite 2-phase commit; `loops check` verifies every page of the file\n",
                file.display()
            ),
            "loops {args:?}"
        );
    }
    assert_eq!(
        std::fs::read(file).unwrap().len(),
        good.len(),
        "verifying writes nothing"
    );
    // The good file reads as before, verified.
    assert_eq!(
        json(&path, &["history", "done-1", "--json"])["transitions"][2]["payload"],
        json!({"Done": {"delivered": 2}})
    );
}

/// A flip in the format's own record (its key in the file's META table) is damage, to every
/// command: before, reading commands called the file "format 1" and sent the user to `loops
/// upgrade`, which backed it up and failed converting it.
#[test]
fn a_damaged_format_record_is_damage_not_an_older_format() {
    let (dir, path) = store();
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(6)
        .position(|w| w == b"format")
        .expect("the format's record");
    bytes[at + 1] ^= 0xff;
    let file = dir.path().join("format-flipped.redb");
    std::fs::write(&file, &bytes).unwrap();
    let verifying =
        "verifying the checksum of every page failed: Primary is corrupted despite 2-phase commit";
    let looks = format!(
        "error: store {} looks damaged: {verifying}; `loops check` verifies every page of the file\n",
        file.display()
    );
    let is = format!(
        "error: store {} is damaged: redb cannot open it (DB corrupted: {verifying}); restore it from a backup (an unverified open fails too, so `--no-verify` is no way round)\n",
        file.display()
    );
    for (args, said) in [
        (&["runs"][..], &looks),
        (&["show", "done-1"], &looks),
        (&["check"], &is),
        (&["cancel", "done-1"], &is),
    ] {
        let out = loops(&file).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "loops {args:?}");
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            *said,
            "loops {args:?}"
        );
    }
    let out = loops(&file)
        .args(["upgrade", &file.display().to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8(out.stderr).unwrap(), is);
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "nothing wrote to it");
    let backups: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".bak"))
        .collect();
    assert!(
        backups.is_empty(),
        "no backup of a damaged file: {backups:?}"
    );
}

#[test]
fn history_counts_a_failing_step_once_per_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let rt = Runtime::builder()
                .retry(
                    RetryPolicy::attempts(2)
                        .with_delays(Duration::from_millis(1), Duration::from_millis(1)),
                )
                .open(&path)
                .unwrap();
            let start = Job::Start {
                mode: "step-fails".into(),
            };
            rt.run("steps-1", start, &Worker).await.unwrap_err();
        });
    // Each attempt wrote two records: the step's failure and the handler's.
    let view = json(&path, &["history", "steps-1", "--json"]);
    let sources: Vec<(u64, &str)> = view["transitions"][1]["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["attempt"].as_u64().unwrap(),
                f["source"]["kind"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        sources,
        [(1, "step"), (1, "handler"), (2, "step"), (2, "handler")]
    );
    let out = text(&path, &["history", "steps-1"]);
    assert_eq!(
        out.lines().next().unwrap(),
        "run steps-1  workflow job  failed  1 transition, 2 failed attempts"
    );
}

#[test]
fn an_invalid_run_id_is_a_bad_argument_for_every_subcommand() {
    let (_dir, path) = store();
    let long = "x".repeat(257);
    for (id, reason) in [
        ("", r#""": empty"#.to_owned()),
        (
            "a\u{1}b",
            r#""a\u{1}b": contains control characters"#.to_owned(),
        ),
        (
            long.as_str(),
            format!(
                "\"{}\"... (257 bytes): longer than 256 bytes",
                "x".repeat(64)
            ),
        ),
        (" x", r#"" x": starts or ends with white space"#.to_owned()),
    ] {
        for args in [
            &["show", id][..],
            &["history", id],
            &["schema", id],
            &["cancel", id],
            &["retry", id],
            &["send", id, "approve", "--json", "{}"],
        ] {
            assert_eq!(
                fails(&path, args, 2),
                format!("error: invalid run id {reason}\n"),
                "loops {args:?}"
            );
        }
    }
    // Nothing was written.
    assert_eq!(
        std::fs::read(&path).unwrap(),
        std::fs::read(fixture()).unwrap()
    );
}

#[test]
fn bad_arguments_are_clear_errors() {
    let (_dir, path) = store();
    let err = fails(&path, &["show", "nope"], 1);
    assert_eq!(
        err,
        format!(
            "error: run `nope` does not exist in store {} (`loops runs` lists the runs)\n",
            path.display()
        )
    );
    for args in [
        &["history", "nope"][..],
        &["schema", "nope"],
        &["retry", "nope"],
        &["cancel", "nope"],
    ] {
        let err = fails(&path, args, 1);
        assert!(
            err.starts_with("error: run `nope` does not exist in store"),
            "{args:?}: {err}"
        );
    }

    // An age that does not parse: what is wrong, and the forms an age takes.
    let forms = "give a number and a unit, such as 30d, 12h, 90m or 1h 30m (units: s, m, h, d, w; M for months, y for years); try 'loops runs --help'";
    for (age, what) in [
        ("yesterday", "not an age"),
        ("soon", "not an age"),
        ("30", "30 has no unit"),
        ("5x", "unknown unit `x`"),
    ] {
        assert_eq!(
            fails(&path, &["runs", "--older-than", age], 2),
            format!("error: invalid value '{age}' for '--older-than <AGE>': {what}: {forms}\n")
        );
    }
    // clap's usage errors are one line too (its lines joined, usage left out), with where
    // to look; exit code 2.
    for (args, expected) in [
        (
            &["runs", "--status", "sleeping"][..],
            "error: invalid value 'sleeping' for '--status <STATUS>' [possible values: running, waiting, completed, failed, cancelled, blocked]; try 'loops runs --help'\n",
        ),
        (
            &["runs", "--statu", "failed"],
            "error: unexpected argument '--statu' found (a similar argument exists: '--status'); try 'loops runs --help'\n",
        ),
        (
            &["frobnicate"],
            "error: unrecognized subcommand 'frobnicate'; try 'loops --help'\n",
        ),
        (
            &["schedules", "pause"],
            "error: the following required arguments were not provided: <NAME>; try 'loops schedules pause --help'\n",
        ),
        (
            &["--color", "sometimes", "runs"],
            "error: invalid value 'sometimes' for '--color <WHEN>' [possible values: auto, always, never]; try 'loops runs --help'\n",
        ),
    ] {
        assert_eq!(fails(&path, args, 2), expected, "{args:?}");
    }

    // No store given.
    Command::cargo_bin("loops")
        .unwrap()
        .env_remove("LOOPS_STORE")
        .args(["runs"])
        .assert()
        .code(2)
        .stderr("error: no store given: pass --store PATH (or a postgres:// URL) or set LOOPS_STORE (the file the workflow's process opens with Runtime::open)\n");
    // An empty --store or --key-file given on the command line is said to be empty.
    for (args, flag) in [
        (["--store", "", "runs"], "--store <PATH|URL>"),
        (["--key-file", "", "runs"], "--key-file <PATH>"),
    ] {
        assert_eq!(
            fails(&path, &args, 2),
            format!(
                "error: invalid value '' for '{flag}': empty: name a path (or leave the flag \
                 out); try 'loops runs --help'\n"
            ),
            "{args:?}"
        );
    }
    // A variable set but empty is not set: no store given, no key file.
    Command::cargo_bin("loops")
        .unwrap()
        .env("LOOPS_STORE", "")
        .env("LOOPS_KEY_FILE", "")
        .args(["runs"])
        .assert()
        .code(2)
        .stderr("error: no store given: pass --store PATH (or a postgres:// URL) or set LOOPS_STORE (the file the workflow's process opens with Runtime::open)\n");
    loops(&path)
        .env("LOOPS_KEY_FILE", "")
        .args(["runs", "--json"])
        .assert()
        .success();
    // --store wins over the environment.
    Command::cargo_bin("loops")
        .unwrap()
        .env("LOOPS_STORE", "/nonexistent/loops.redb")
        .arg("--store")
        .arg(&path)
        .args(["runs", "--json"])
        .assert()
        .success();

    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let bad = std::ffi::OsStr::from_bytes(b"run-\xff");
        let out = loops(&path).arg("show").arg(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            "error: run id \"run-\\xFF\" is not valid UTF-8 (loops keeps run ids as UTF-8 text)\n"
        );
    }
}

#[test]
fn help_has_examples_for_every_command() {
    let out = Command::cargo_bin("loops")
        .unwrap()
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("Examples:\n  export LOOPS_STORE="), "{help}");
    assert!(help.contains("[env: LOOPS_STORE="), "{help}");
    for sub in [
        "runs",
        "show",
        "history",
        "cancel",
        "retry",
        "send",
        "prune",
        "compact",
        "schema",
        "check",
        "graph",
        "schedules",
    ] {
        assert!(help.contains(&format!("  {sub} ")), "{sub} listed");
        let out = Command::cargo_bin("loops")
            .unwrap()
            .args([sub, "--help"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{sub}");
        let help = String::from_utf8(out.stdout).unwrap();
        assert!(
            help.contains(&format!("Examples:\n  loops {sub}")),
            "loops {sub} --help:\n{help}"
        );
    }
    Command::cargo_bin("loops")
        .unwrap()
        .arg("--version")
        .assert()
        .success()
        .stdout(predicate::str::starts_with("loops 0.1.0"));
}

/// `loops ARGS` (no store needed): its stdout, on success.
fn help(args: &[&str]) -> String {
    let out = Command::cargo_bin("loops")
        .unwrap()
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "loops {args:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn help_sends_the_event_the_deliver_example_waits_for() {
    // The example's event name and payload, read from its source, so that the help follows
    // the example if it changes.
    let workflow = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/deliver/workflow.rs"),
    )
    .unwrap();
    assert!(
        workflow.contains("#[event(approve: Approval)]"),
        "the example waits for `approve`"
    );
    let approval = workflow
        .split_once("pub struct Approval {")
        .and_then(|(_, rest)| rest.split_once('}'))
        .unwrap()
        .0;
    let fields: Vec<&str> = approval
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("pub "))
        .collect();
    assert_eq!(
        fields,
        ["pub by: String,"],
        "its payload is {{\"by\": NAME}}"
    );
    let line = "  loops send deliver-1 approve --json '{\"by\":\"alice\"}'\n";
    let top = help(&["--help"]);
    assert!(top.contains(line), "{top}");
    let send = help(&["send", "--help"]);
    assert!(
        send.contains(&format!(
            "Examples:\n{line}  loops send deliver-1 approve --json '{{\"by\":\"alice\"}}' --key approve-1\n"
        )),
        "{send}"
    );
    // Every example of `loops send` (an indented line) sends that event.
    for text in [&top, &send] {
        let sends: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("  ") && l.contains("loops send "))
            .collect();
        assert!(!sends.is_empty());
        for line in sends {
            assert!(
                line.contains("loops send deliver-1 approve --json"),
                "{line}"
            );
        }
    }
}

#[test]
fn retry_of_a_run_at_the_largest_attempt_is_refused_without_writing_or_panicking() {
    use redb::{ReadableTable, TableDefinition};
    let (_dir, path) = store();
    let runs: TableDefinition<&str, &[u8]> = TableDefinition::new("runs");
    overwrite(&path, |txn| {
        let mut table = txn.open_table(runs).unwrap();
        // A row of format 3: the run's head in the log (16 bytes), the encoding's version,
        // status, fields present (4 bytes), schema hash, seq (16), then the attempt (u32).
        let mut row = table.get("failed-1").unwrap().unwrap().value().to_vec();
        row[36..40].copy_from_slice(&u32::MAX.to_le_bytes());
        table.insert("failed-1", row.as_slice()).unwrap();
    });
    let err = fails(&path, &["retry", "failed-1"], 1);
    assert_eq!(
        err,
        "error: run `failed-1`: attempt 4294967295 in the run row is the largest it can be, so retrying is not possible\n"
    );
    let v = json(&path, &["show", "failed-1", "--json"]);
    assert_eq!(
        (v["run"]["status"].as_str(), v["run"]["attempt"].as_u64()),
        (Some("failed"), Some(u64::from(u32::MAX)))
    );
}

/// The note of a reading command on a store that needs redb's repair.
fn needs_repair(path: &Path) -> String {
    format!(
        "note: {}; read through a repair made in memory, the file is unchanged; a writing command (or the process that drives it) repairs it\n",
        loops_core::Error::needs_repair(path)
    )
}

/// Issue 15, item 7: 4,096 zero bytes appended to a store closed cleanly made `loops runs`
/// say it "was not closed cleanly", then rewrite and truncate the file.
#[test]
fn a_store_with_trailing_bytes_is_read_without_changing_it() {
    let (_dir, path) = store();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend(std::iter::repeat_n(0u8, 4096));
    std::fs::write(&path, &bytes).unwrap();
    for args in [&["runs", "--json"][..], &["show", "done-1", "--json"]] {
        let out = loops(&path).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "loops {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8(out.stderr).unwrap(), needs_repair(&path));
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "loops {args:?} changed the file"
        );
    }
    let runs = json(&path, &["runs", "--json"]);
    assert_eq!(ids(&runs).len(), 6);
}

/// Starts two `Gate` children (`{run}/a`, `{run}/b`) and ends without joining them.
#[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = loops_core)]
enum Family {
    #[initial]
    #[next(Started)]
    Begin,
    #[terminal]
    Started { children: u32 },
}

impl FamilyHandler for Worker {
    type Error = BoxError;
    async fn begin(&self, ctx: &Context) -> Result<BeginNext, BoxError> {
        for name in ["a", "b"] {
            let id = format!("{}/{name}", ctx.run_id());
            let doc = format!("{name}.md");
            ctx.start_child(&id, Gate::Ask { doc }).await?;
        }
        Ok(BeginNext::Started { children: 2 })
    }
}

#[test]
fn tree_shows_a_run_and_its_children_and_show_names_the_parent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("family.redb");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let rt = Runtime::builder()
                .register::<Gate, _>(Worker)
                .open(&path)
                .unwrap();
            rt.run("root", Family::Begin, &Worker).await.unwrap();
            until_status(&rt, "root/a", RunStatus::Waiting).await;
            until_status(&rt, "root/b", RunStatus::Waiting).await;
            rt.shutdown().await;
        });
    assert_eq!(
        text(&path, &["tree", "root"]),
        "root      family  completed  Started (seq 1)\n  root/a  gate    waiting    Ask (seq 0)\n  root/b  gate    waiting    Ask (seq 0)\n"
    );
    let tree = json(&path, &["tree", "root", "--json"]);
    assert_eq!(tree["run"]["run_id"], "root");
    assert_eq!(tree["run"]["parent"], Value::Null);
    let children: Vec<(&str, &str)> = tree["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["run"]["run_id"].as_str().unwrap(),
                c["run"]["parent"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(children, [("root/a", "root"), ("root/b", "root")]);
    assert!(
        text(&path, &["show", "root/a"]).contains("parent          root\n"),
        "{}",
        text(&path, &["show", "root/a"])
    );
    assert_eq!(
        json(&path, &["show", "root/b", "--json"])["run"]["parent"],
        "root"
    );
    // The same tree through the control endpoint of a process that holds the store.
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (rt, server) = tokio.block_on(async {
        let rt = Runtime::builder()
            .register::<Gate, _>(Worker)
            .open(&path)
            .unwrap();
        let server = rt.serve_control_next_to_store().await.unwrap();
        (rt, server)
    });
    assert_eq!(
        text(&path, &["tree", "root"]),
        "root      family  completed  Started (seq 1)\n  root/a  gate    waiting    Ask (seq 0)\n  root/b  gate    waiting    Ask (seq 0)\n"
    );
    assert_eq!(
        json(&path, &["tree", "root/a", "--json"])["children"],
        json!([])
    );
    tokio.block_on(server.stop());
    tokio.block_on(rt.shutdown());
}

/// Runs a step until the run is cancelled (a side effect in flight when the cancel lands: it
/// is recorded), then asks to end (which the store refuses: a run asked to stop commits no
/// next state).
#[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = loops_core)]
enum Spin {
    #[initial]
    #[next(Done)]
    Spinning,
    #[terminal]
    Done,
}

/// Set once `Spin`'s handler runs: its run is driven from then on.
static SPINNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl SpinHandler for Worker {
    type Error = BoxError;

    async fn spinning(&self, ctx: &Context) -> Result<SpinningNext, BoxError> {
        ctx.step("open_pr", || async {
            SPINNING.store(true, std::sync::atomic::Ordering::SeqCst);
            ctx.cancelled().await;
            Ok(7u32)
        })
        .await?;
        Ok(SpinningNext::Done)
    }
}

/// `loops cancel` of a run a process drives says the cancellation was asked and where the
/// run will end; the run then ends cancelled in that state, its terminal state never
/// committed.
#[test]
fn cancel_of_a_driven_run_says_where_it_will_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spin.redb");
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (rt, server) = tokio.block_on(async {
        let rt = Runtime::builder()
            .register::<Spin, _>(Worker)
            .open(&path)
            .unwrap();
        let server = rt.serve_control_next_to_store().await.unwrap();
        rt.start("s1", Spin::Spinning).await.unwrap();
        while !SPINNING.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (rt, server)
    });
    assert_eq!(
        text(&path, &["cancel", "s1", "--reason", "enough"]),
        "cancellation of run s1 asked (running in state Spinning, seq 0): enough; it ends as cancelled at its next step or state boundary, in the state it is in\n"
    );
    tokio.block_on(until_status(&rt, "s1", RunStatus::Cancelled));
    let info = tokio.block_on(rt.run_info("s1")).unwrap().unwrap();
    assert_eq!((info.state.as_str(), info.seq), ("Spinning", 0));
    tokio.block_on(server.stop());
    tokio.block_on(rt.shutdown());
    drop(rt);
    // The step in flight when the cancel landed was recorded: `show` says its effect
    // happened, so that no one redoes it by hand.
    assert!(
        text(&path, &["show", "s1"]).contains(
            "\nsteps done      open_pr#0 (recorded in state Spinning before the run ended: their effects happened; `loops history s1` shows their outputs)\n"
        ),
        "{}",
        text(&path, &["show", "s1"])
    );
    let steps = &json(&path, &["show", "s1", "--json"])["state_steps"];
    assert_eq!(steps.as_array().unwrap().len(), 1, "{steps}");
    assert_eq!(
        (
            &steps[0]["name"],
            &steps[0]["occurrence"],
            &steps[0]["attempt"]
        ),
        (&json!("open_pr"), &json!(0), &json!(1))
    );
}

/// `loops cancel` of a waiting run that a process drives (its caller's `Runtime::run` waits
/// on it) says the driver ends it as soon as it sees the request, not at a step boundary;
/// the driver then returns `RunCancelled` in that state.
#[test]
fn cancel_of_a_waiting_driven_run_says_it_ends_when_its_driver_sees_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gate.redb");
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (rt, server) = tokio.block_on(async {
        let rt = Runtime::builder()
            .register::<Gate, _>(Worker)
            .open(&path)
            .unwrap();
        let server = rt.serve_control_next_to_store().await.unwrap();
        (rt, server)
    });
    let driver = rt.clone();
    let attached = tokio.spawn(async move {
        let initial = Gate::Ask { doc: "d".into() };
        driver.run("g1", initial, &Worker).await
    });
    tokio.block_on(until_status(&rt, "g1", RunStatus::Waiting));
    assert_eq!(
        text(&path, &["cancel", "g1", "--reason", "not needed"]),
        "cancellation of run g1 asked (waiting in state Ask, seq 0): not needed; its driver stops waiting and ends it as cancelled as soon as it sees the request (at once, or within 200 ms from another process sharing the store), in the state it is in\n"
    );
    match tokio.block_on(attached).unwrap() {
        Err(loops_core::Error::RunCancelled { state, seq, .. }) => {
            assert_eq!((state.as_str(), seq), ("Ask", 0));
        }
        other => panic!("expected RunCancelled, got {other:?}"),
    }
    let info = tokio.block_on(rt.run_info("g1")).unwrap().unwrap();
    assert_eq!(
        (info.status, info.state.as_str(), info.seq),
        (RunStatus::Cancelled, "Ask", 0)
    );
    tokio.block_on(server.stop());
    tokio.block_on(rt.shutdown());
}

/// `loops upgrade` of a store a running process holds says so, as `loops check` does (it said
/// redb's "already open in this or another process").
#[test]
fn upgrade_of_a_held_store_says_the_process_holds_it() {
    let (_dir, path) = store();
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let rt = tokio.block_on(async { Runtime::open(&path).unwrap() });
    Command::cargo_bin("loops")
        .unwrap()
        .env_remove("LOOPS_STORE")
        .arg("upgrade")
        .arg(&path)
        .assert()
        .code(1)
        .stdout("")
        .stderr(format!(
            "error: store {} is held by a running process: loops upgrade converts the file in place and needs it to itself; stop the process first\n",
            path.display()
        ));
    tokio.block_on(rt.shutdown());
}

/// `loops upgrade` without PATH converts the store (`--store` or LOOPS_STORE); PATH is
/// taken over LOOPS_STORE, and refused with a `--store` that names another store.
#[test]
fn upgrade_without_path_converts_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let format_1 =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/store-format-1.redb");
    let (a, b) = (dir.path().join("a.redb"), dir.path().join("b.redb"));
    std::fs::copy(&format_1, &a).unwrap();
    std::fs::copy(&format_1, &b).unwrap();
    let loops = || {
        let mut cmd = Command::cargo_bin("loops").unwrap();
        cmd.env_remove("LOOPS_STORE").env("NO_COLOR", "1");
        cmd
    };
    let upgraded = |path: &Path| {
        format!(
            "upgraded {} from format 1 to format 3: 3 runs, 23 records moved to the log\n  backup of the file as it was: {}.format-1.bak\n",
            path.display(),
            path.display()
        )
    };
    // --store names the file.
    loops()
        .arg("--store")
        .arg(&a)
        .arg("upgrade")
        .assert()
        .success()
        .stdout(upgraded(&a));
    // LOOPS_STORE names it.
    loops()
        .env("LOOPS_STORE", &b)
        .arg("upgrade")
        .assert()
        .success()
        .stdout(upgraded(&b));
    // PATH and --store naming the same file: one file.
    loops()
        .arg("--store")
        .arg(&a)
        .arg("upgrade")
        .arg(&a)
        .assert()
        .success()
        .stdout(format!(
            "{} has format 3 already: nothing to do\n",
            a.display()
        ));
    // PATH over LOOPS_STORE.
    std::fs::copy(&format_1, &a).unwrap();
    loops()
        .env("LOOPS_STORE", &b)
        .arg("upgrade")
        .arg(&a)
        .assert()
        .success()
        .stdout(predicate::str::starts_with(format!(
            "upgraded {} from format 1 to format 3",
            a.display()
        )));
    // Refused, exit 2, one line: two files, no file, a PostgreSQL store (its URL not said).
    loops()
        .arg("--store")
        .arg(&b)
        .arg("upgrade")
        .arg(&a)
        .assert()
        .code(2)
        .stdout("")
        .stderr(format!(
            "error: upgrade {} and --store {} name two files: give the file once, as PATH or as --store\n",
            a.display(),
            b.display()
        ));
    loops()
        .arg("upgrade")
        .assert()
        .code(2)
        .stderr("error: no file to convert: pass PATH, or --store PATH, or set LOOPS_STORE\n");
    loops()
        .args(["--store", "postgres://u:secret@localhost/db", "upgrade"])
        .assert()
        .code(1)
        .stderr("error: the store is a PostgreSQL database, which has no file format to convert: loops upgrade converts a redb file\n");
    loops()
        .args(["--store", "postgres://u:secret@localhost/db", "upgrade"])
        .arg(&a)
        .assert()
        .code(2)
        .stderr(format!(
            "error: upgrade {} and --store name two stores (--store is a PostgreSQL database, which has no file format to convert): give the file once, as PATH or as --store\n",
            a.display()
        ));
}

/// A PostgreSQL URL naming a host off this machine without `sslmode=require` is refused before
/// anything connects, in one line that names the host (the password not shown) and the
/// remedy a command has: the URL's `sslmode`.
#[test]
fn a_remote_postgres_url_without_tls_is_refused_with_the_remedy_in_the_url() {
    for (url, shown, host) in [
        (
            "postgres://u:secret@db.example.com/db",
            "postgres://u@db.example.com:5432/db",
            "db.example.com",
        ),
        // Not a host name at all: the refusal shows what the URL was read as.
        ("postgres://%%%", "postgres://@%%%:5432/", "%%%"),
        // libpq's key=value form, read as the same store.
        (
            "host=db.example.com user=u password=secret dbname=db",
            "postgres://u@db.example.com:5432/db",
            "db.example.com",
        ),
    ] {
        Command::cargo_bin("loops")
            .unwrap()
            .env_remove("LOOPS_STORE")
            .args(["--store", url, "runs"])
            .assert()
            .code(1)
            .stdout("")
            .stderr(format!(
                "error: refusing to connect to {shown} schema loops without TLS: {host:?} is not \
                 a loopback address; add sslmode=require to the URL to connect over TLS (the \
                 server's certificate is checked against the system's roots)\n"
            ));
    }
}

/// A PostgreSQL URL that does not parse, or names no server, is bad input (exit 2), said in
/// one line naming what is wrong and not the URL (it may hold a password); before, `postgres://`
/// was tried as `localhost` and failed as a connection (exit 1).
#[test]
fn a_postgres_url_that_names_no_server_or_does_not_parse_is_bad_input() {
    for (url, why) in [
        (
            "postgres://",
            "invalid setting `host`: the connection string names no server: give postgres://USER@HOST[:PORT]/DATABASE, or host=HOST",
        ),
        (
            "postgres://u:secret@127.0.0.1:99999/x",
            "invalid PostgreSQL connection string: invalid connection string: invalid value for option `port`",
        ),
        (
            "postgresql://127.0.0.1/x?sslmode=bogus",
            "invalid PostgreSQL connection string: invalid connection string: invalid value for option `sslmode`",
        ),
        // libpq's key=value form is a PostgreSQL store too (it was taken for a file path).
        (
            "host=127.0.0.1 port=99999 user=u dbname=x",
            "invalid PostgreSQL connection string: invalid connection string: invalid value for option `port`",
        ),
        (
            "user=u dbname=x",
            "invalid setting `host`: the connection string names no server: give postgres://USER@HOST[:PORT]/DATABASE, or host=HOST",
        ),
    ] {
        Command::cargo_bin("loops")
            .unwrap()
            .env_remove("LOOPS_STORE")
            .args(["--store", url, "runs"])
            .assert()
            .code(2)
            .stdout("")
            .stderr(format!(
                "error: the store URL is not one loops can use: {why}\n"
            ));
    }
}

/// A store given as a URL of a scheme loops does not open is refused as one, in one line that
/// names the scheme only (the rest may hold a password) and what loops opens; exit 2, a bad
/// argument, from `--store` and `LOOPS_STORE` alike. Before, it was taken for a file path
/// and said not to exist. A file at that path (`http:/x/y`, relative) is still opened.
#[test]
fn a_store_url_of_a_scheme_loops_does_not_open_is_refused_naming_what_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    let loops_in_dir = || {
        let mut cmd = Command::cargo_bin("loops").unwrap();
        cmd.env_remove("LOOPS_STORE")
            .env("NO_COLOR", "1")
            .current_dir(dir.path());
        cmd
    };
    for (store, scheme) in [
        ("http://x/y", "http"),
        ("https://u:secret@db.example.com/loops", "https"),
        ("file:///var/lib/agent/loops.redb", "file"),
        ("redis+tls://cache", "redis+tls"),
    ] {
        let line = format!(
            "error: the store is a {scheme}:// URL, a scheme loops does not open: give the path of a redb store file, or a postgres:// (or postgresql://) URL for a PostgreSQL store\n"
        );
        for args in [&["runs"][..], &["send", "r", "go", "--json", "1"]] {
            loops_in_dir()
                .arg("--store")
                .arg(store)
                .args(args)
                .assert()
                .code(2)
                .stdout("")
                .stderr(line.clone());
        }
        loops_in_dir()
            .env("LOOPS_STORE", store)
            .arg("runs")
            .assert()
            .code(2)
            .stdout("")
            .stderr(line);
    }
    let file = dir.path().join("http:/x/y");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::File::create(&file).unwrap();
    loops_in_dir()
        .args(["--store", "http://x/y", "runs"])
        .assert()
        .code(1)
        .stderr(
            "error: cannot open store http://x/y: the file is empty (0 bytes), not a loops \
             store; delete it to start a new store\n",
        );
}

/// `loops upgrade PATH`: converts the format-1 fixture of the workspace's tests, says what
/// it did and where the backup is; a second time it has nothing to do; a file it cannot
/// convert exits 1 with the error.
#[test]
fn upgrade_converts_a_store_of_format_1_and_keeps_a_backup() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let format_1 =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/store-format-1.redb");
    std::fs::copy(&format_1, &path).unwrap();
    // Refused by a reading command, with the way out.
    loops(&path)
        .args(["runs"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(format!(
            "run `loops upgrade {}`",
            path.display()
        )));
    let backup = dir.path().join("store.redb.format-1.bak");
    Command::cargo_bin("loops")
        .unwrap()
        .env_remove("LOOPS_STORE")
        .env("NO_COLOR", "1")
        .arg("upgrade")
        .arg(&path)
        .assert()
        .success()
        .stdout(format!(
            "upgraded {} from format 1 to format 3: 3 runs, 23 records moved to the log\n  backup of the file as it was: {}\n",
            path.display(),
            backup.display()
        ));
    assert!(std::fs::read(&backup).unwrap() == std::fs::read(&format_1).unwrap());
    let runs = json(&path, &["runs", "--json"]);
    assert_eq!(runs.as_array().unwrap().len(), 3, "{runs}");
    loops(&path)
        .arg("upgrade")
        .arg(&path)
        .assert()
        .success()
        .stdout(format!(
            "{} has format 3 already: nothing to do\n",
            path.display()
        ));
    // A current store followed by a whole free page (as a crash can leave it): redb repairs
    // it on the upgrade's open, which says so, and converts nothing.
    let mut padded = std::fs::read(&path).unwrap();
    padded.extend_from_slice(&[0; 4096]);
    std::fs::write(&path, &padded).unwrap();
    loops(&path)
        .arg("upgrade")
        .arg(&path)
        .assert()
        .success()
        .stdout(format!(
            "{} has format 3 already: nothing else to do\n",
            path.display()
        ))
        .stderr(format!(
            "note: {}; redb repaired it on this open\n",
            loops_core::Error::needs_repair(&path)
        ));
    assert_eq!(
        json(&path, &["runs", "--json"]).as_array().unwrap().len(),
        3
    );
    // A second copy of format 1 beside a backup (as after an upgrade interrupted after its
    // copy): the backup is kept, the new one takes the next name.
    std::fs::copy(&format_1, &path).unwrap();
    let next = dir.path().join("store.redb.format-1.bak.1");
    loops(&path)
        .arg("upgrade")
        .arg(&path)
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "backup of the file as it was: {}",
            next.display()
        )));
    assert!(std::fs::read(&backup).unwrap() == std::fs::read(&format_1).unwrap());
    assert!(std::fs::read(&next).unwrap() == std::fs::read(&format_1).unwrap());
    loops(&path)
        .arg("upgrade")
        .arg(dir.path().join("missing.redb"))
        .assert()
        .code(1);
}

/// Bidirectional control characters in text the CLI shows (a cancellation's reason, an
/// event's payload) are escaped, so that a terminal shows each line in its own order: as
/// `\u{202e}` in text, as a JSON escape (the same string to a JSON reader) with `--json`.
#[test]
fn bidirectional_controls_are_shown_escaped() {
    let (_dir, path) = store();
    let said = text(
        &path,
        &["cancel", "waiting-1", "--reason", "stop \u{202e}it now"],
    );
    assert_eq!(
        said,
        "cancelled run waiting-1 (waiting in state Ask, seq 0): stop \\u{202e}it now\n"
    );
    let shown = text(&path, &["show", "waiting-1"]);
    assert!(!shown.contains('\u{202e}'), "{shown}");
    assert!(shown.contains("stop \\u{202e}it now"), "{shown}");
    let out = loops(&path)
        .args(["show", "waiting-1", "--json"])
        .output()
        .unwrap();
    let raw = String::from_utf8(out.stdout).unwrap();
    assert!(!raw.contains('\u{202e}'), "{raw}");
    assert!(raw.contains(r"stop \u202eit now"), "{raw}");
    let v: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(v["run"]["cancel_reason"], "stop \u{202e}it now", "{raw}");
}

/// Runs until the test lets it go, whatever is asked meanwhile.
#[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = loops_core, next_prefix = "Stall")]
enum Stall {
    #[initial]
    #[next(Done)]
    Holding,
    #[terminal]
    Done,
}

/// Set once `Stall`'s handler runs; its handler returns once `RELEASED` is notified.
static HOLDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static RELEASED: tokio::sync::Notify = tokio::sync::Notify::const_new();

impl StallHandler for Worker {
    type Error = BoxError;

    async fn holding(&self, _: &Context) -> Result<StallHoldingNext, BoxError> {
        HOLDING.store(true, std::sync::atomic::Ordering::SeqCst);
        RELEASED.notified().await;
        Ok(StallHoldingNext::Done)
    }
}

/// A second `loops cancel` of a run that is ending says the cancellation was asked already,
/// with the first reason, which the run ends with; the second writes nothing.
#[test]
fn a_second_cancel_says_it_was_asked_already_with_the_first_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stall.redb");
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (rt, server) = tokio.block_on(async {
        let rt = Runtime::builder()
            .register::<Stall, _>(Worker)
            .open(&path)
            .unwrap();
        let server = rt.serve_control_next_to_store().await.unwrap();
        rt.start("h1", Stall::Holding).await.unwrap();
        while !HOLDING.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (rt, server)
    });
    let boundary = "it ends as cancelled at its next step or state boundary, in the state it is in";
    assert_eq!(
        text(&path, &["cancel", "h1", "--reason", "first"]),
        format!(
            "cancellation of run h1 asked (running in state Holding, seq 0): first; {boundary}\n"
        )
    );
    let asked = tokio.block_on(rt.run_info("h1")).unwrap().unwrap();
    assert_eq!(
        text(&path, &["cancel", "h1", "--reason", "second"]),
        format!(
            "cancellation of run h1 was asked already (running in state Holding, seq 0): first; {boundary}\n"
        )
    );
    // Nothing written: the row is as the first cancellation left it.
    assert_eq!(tokio.block_on(rt.run_info("h1")).unwrap().unwrap(), asked);
    RELEASED.notify_one();
    tokio.block_on(until_status(&rt, "h1", RunStatus::Cancelled));
    let info = tokio.block_on(rt.run_info("h1")).unwrap().unwrap();
    assert_eq!(info.cancel.as_deref(), Some("first"));
    tokio.block_on(server.stop());
    tokio.block_on(rt.shutdown());
}

/// `loops retry` through a process that holds the store says that process takes the run up
/// now (it does: the run's next attempt fails again at once, as its handler does).
#[test]
fn retry_through_a_serving_process_says_it_takes_the_run_up_now() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("retry.redb");
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (rt, server) = tokio.block_on(async {
        let rt = Runtime::builder()
            .retry(RetryPolicy::never())
            .register::<Job, _>(Worker)
            .open(&path)
            .unwrap();
        let server = rt.serve_control_next_to_store().await.unwrap();
        rt.run(
            "f1",
            Job::Start {
                mode: "fail".into(),
            },
            &Worker,
        )
        .await
        .unwrap_err();
        (rt, server)
    });
    let before = tokio.block_on(rt.run_info("f1")).unwrap().unwrap();
    assert_eq!(before.status, RunStatus::Failed);
    let said = text(&path, &["retry", "f1"]);
    assert!(
        said.ends_with(
            "starts a fresh budget of attempts; the process that holds the store takes it up now\n"
        ),
        "{said}"
    );
    // It did: the next attempt ran (and failed, as the handler always does).
    tokio.block_on(async {
        loop {
            let info = rt.run_info("f1").await.unwrap().unwrap();
            if info.status == RunStatus::Failed && info.attempt > before.attempt {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    tokio.block_on(server.stop());
    tokio.block_on(rt.shutdown());
}

/// A write the store refuses, or one that changes nothing, leaves the store file's bytes as
/// they were: the command answers from the file opened read-only, and opens it for writing
/// (which rewrites part of it when it closes: redb records its allocator's state) only for a
/// write that changes it.
#[test]
fn a_refused_or_unchanged_write_leaves_the_store_file_byte_for_byte() {
    let (_dir, path) = store();
    // A write that changes the store opens it for writing, and the runs it does not touch
    // stay: a duplicate's answer below then comes from the file as the first send left it.
    text(
        &path,
        &["send", "waiting-1", "approval", "--json", "1", "--key", "k"],
    );
    let before = std::fs::read(&path).unwrap();
    let refused: [(&[&str], i32, &str); 10] = [
        (
            &["cancel", "done-1"],
            1,
            "error: run `done-1` has ended (completed); cancel is not possible\n",
        ),
        (&["cancel", "nope"], 1, "does not exist in store"),
        (
            &["retry", "waiting-1"],
            1,
            "error: run `waiting-1` is waiting, not failed; only a failed run can be retried\n",
        ),
        (&["retry", "nope"], 1, "does not exist in store"),
        (
            &["send", "cancelled-1", "approval", "--json", "1"],
            1,
            "error: run `cancelled-1` has ended (cancelled); sending an event is not possible\n",
        ),
        (
            &["send", "nope", "approval", "--json", "1"],
            1,
            "does not exist in store",
        ),
        (
            &["schedules", "pause", "nosuch"],
            1,
            "error: schedule `nosuch` does not exist\n",
        ),
        (
            &["schedules", "remove", "nosuch"],
            1,
            "error: schedule `nosuch` does not exist\n",
        ),
        (
            &["cancel", "done-1", "--reason", "again"],
            1,
            "error: run `done-1` has ended (completed); cancel is not possible\n",
        ),
        (
            &["send", "waiting-1", "approval", "--json", "2", "--key", "k"],
            1,
            "was `approval` with another payload: 1; this one was not sent",
        ),
    ];
    for (args, code, said) in refused {
        let err = fails(&path, args, code);
        assert!(err.contains(said), "loops {args:?}: {err}");
        assert!(
            std::fs::read(&path).unwrap() == before,
            "loops {args:?} changed the store file"
        );
    }
    // Answered without a change: the duplicate key's first receipt, and a prune that finds
    // nothing to remove.
    let (out, _) = out_err(
        &path,
        &["send", "waiting-1", "approval", "--json", "1", "--key", "k"],
    );
    assert_eq!(
        out,
        "an event with key `k` was sent to run waiting-1 already (event seq 0); nothing written\n"
    );
    let pruned = text(&path, &["prune", "--older-than", "100000d"]);
    assert!(pruned.contains("nothing removed"), "{pruned}");
    assert!(
        std::fs::read(&path).unwrap() == before,
        "an unchanged write changed the store file"
    );
    // A write that changes it is made, on the file opened for writing.
    text(&path, &["cancel", "waiting-1", "--reason", "not needed"]);
    let store = RedbStore::open_read_only(&path).unwrap();
    let row = store.run("waiting-1").unwrap().unwrap();
    assert_eq!(
        (row.status, row.cancel.as_deref()),
        (RunStatus::Cancelled, Some("not needed"))
    );
    assert_eq!(store.events("waiting-1").unwrap().len(), 1);
}

/// A write to a store a crash left (it needs redb's repair) is written: the file is opened
/// for writing, which repairs it, and never answered from a repair made in memory, whose
/// writes are lost when it closes (helper-115 F1: a cancellation and an event were answered
/// as done, exit 0, and never written).
#[test]
fn a_write_to_a_store_left_by_a_crash_is_written() {
    let (dir, path) = store();
    let crashed = |name: &str| {
        let copy = dir.path().join(name);
        let rt = Runtime::open(&path).unwrap();
        // A copy taken while a process has the file open is what a crash leaves behind.
        std::fs::copy(&path, &copy).unwrap();
        drop(rt);
        assert!(matches!(
            RedbStore::open_read_only(&copy),
            Err(loops_core::Error::NeedsRecovery { .. })
        ));
        copy
    };
    let cancelled = crashed("cancelled.redb");
    text(
        &cancelled,
        &["cancel", "waiting-1", "--reason", "after the crash"],
    );
    let row = RedbStore::open_read_only(&cancelled)
        .unwrap()
        .run("waiting-1")
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.status, row.cancel.as_deref()),
        (RunStatus::Cancelled, Some("after the crash"))
    );
    let sent = crashed("sent.redb");
    text(&sent, &["send", "waiting-1", "approval", "--json", "1"]);
    let events = RedbStore::open_read_only(&sent)
        .unwrap()
        .events("waiting-1")
        .unwrap();
    assert_eq!(events.len(), 1);
    // A refusal is still refused (by the writable open, which repairs the file).
    let refused = crashed("refused.redb");
    assert_eq!(
        fails(&refused, &["cancel", "done-1"], 1),
        format!(
            "{}error: run `done-1` has ended (completed); cancel is not possible\n",
            needs_repair(&refused).replace(
                "read through a repair made in memory, the file is unchanged; a writing command (or the process that drives it) repairs it",
                "redb repaired it on this open"
            )
        )
    );
}
