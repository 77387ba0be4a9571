//! Every `loops` command on each of the three ways to a store: a redb file that no process
//! holds (read directly), a redb file held by a process that serves its control endpoint
//! (this test process; the binary talks to it over the socket), and a PostgreSQL store
//! (127.0.0.1:5432, database `test`, a schema of its own per test) with workers serving.
//! The same runs are made on each; the answers must be the same, and so must the exit codes.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;
use loops_core::control::ControlServer;
use loops_core::{BoxError, Context, RetryPolicy, RunStatus, Runtime, StartOptions};
use loops_postgres::PgStore;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What the CLI says to do when a store is encrypted and no key file was given.
const NO_KEY_HINT: &str = "give the key file with --key-file PATH (or LOOPS_KEY_FILE)";

/// Waits for an approval; an approval by `fail` fails the handler. Declares its events, so
/// that `loops send` checks names and payloads on every path.
#[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = loops_core)]
#[event(approve: Approval, note: u64)]
enum Gate {
    #[initial]
    #[next(Done)]
    Ask { doc: String },
    #[terminal]
    Done { by: String },
}

#[derive(loops_derive::Schema, Debug, Serialize, Deserialize)]
#[schema(crate = loops_core)]
struct Approval {
    by: String,
}

struct Worker;

impl GateHandler for Worker {
    type Error = BoxError;
    async fn ask(&self, ctx: &Context, doc: String) -> Result<AskNext, BoxError> {
        // An attribute from the handler (set again, to the same value, when the handler runs
        // again after the wait).
        ctx.set_attribute("doc", doc).await?;
        let approval = ctx.wait_for(Gate::APPROVE).await?;
        if approval.by == "fail" {
            return Err("approved by nobody".into());
        }
        Ok(AskNext::Done { by: approval.by })
    }
}

fn builder() -> loops_core::RuntimeBuilder {
    Runtime::builder()
        .retry(RetryPolicy::never())
        .register::<Gate, _>(Worker)
}

fn ask() -> Gate {
    Gate::Ask {
        doc: "spec.md".into(),
    }
}

async fn until(rt: &Runtime, run_id: &str, status: RunStatus) {
    for _ in 0..2000 {
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

/// The runs every path starts with: `done-1` completed (approved by bob), `failed-1`
/// failed, `cancelled-1` cancelled, `waiting-1` and `waiting-2` waiting for `approve`.
/// Each has the attributes `team` (`alpha` for `done-1` and `waiting-1`, else `beta`) and
/// `n` (its place in this list, from 0), given at its start, and `doc` (`spec.md`), set by
/// its handler.
async fn populate(rt: &Runtime) {
    for (n, id) in [
        "done-1",
        "failed-1",
        "cancelled-1",
        "waiting-1",
        "waiting-2",
    ]
    .into_iter()
    .enumerate()
    {
        let team = if n % 3 == 0 { "alpha" } else { "beta" };
        let options = StartOptions::default()
            .attribute("team", team)
            .attribute("n", n as i64);
        rt.start_with(id, ask(), options).await.unwrap();
        until(rt, id, RunStatus::Waiting).await;
    }
    rt.send("done-1", "approve", &json!({"by": "bob"}))
        .await
        .unwrap();
    until(rt, "done-1", RunStatus::Completed).await;
    rt.send("failed-1", "approve", &json!({"by": "fail"}))
        .await
        .unwrap();
    until(rt, "failed-1", RunStatus::Failed).await;
    rt.cancel("cancelled-1", "not needed").await.unwrap();
}

fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// How the binary is told where the store is.
struct Store {
    args: Vec<String>,
}

impl Store {
    fn file(path: &Path) -> Store {
        Store {
            args: vec!["--store".into(), path.display().to_string()],
        }
    }

    fn postgres(schema: &str) -> Store {
        Store {
            args: vec![
                "--store".into(),
                pg_url(),
                "--pg-schema".into(),
                schema.to_owned(),
            ],
        }
    }

    fn loops(&self, args: &[&str]) -> Output {
        Command::cargo_bin("loops")
            .unwrap()
            .env_remove("LOOPS_STORE")
            .env("NO_COLOR", "1")
            .args(&self.args)
            .args(args)
            .output()
            .unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.loops(args);
        assert!(
            out.status.success(),
            "loops {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "loops {args:?}: not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    fn text(&self, args: &[&str]) -> String {
        let out = self.loops(args);
        assert!(
            out.status.success(),
            "loops {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs `args`, expects exit code `code`, returns stderr.
    fn fails(&self, args: &[&str], code: i32) -> String {
        let out = self.loops(args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "loops {args:?}: stdout {} stderr {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stderr).unwrap()
    }
}

fn pg_url() -> String {
    std::env::var("LOOPS_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// `(run_id, status)` of `loops runs --json`, by run id.
fn statuses(runs: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap().to_owned(),
                r["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// What the reading commands answer, as JSON (no relative times in it), for comparing paths.
fn reads(store: &Store) -> Vec<Value> {
    [
        &["runs", "--json"][..],
        &[
            "runs",
            "--status",
            "waiting",
            "--workflow",
            "gate",
            "--json",
        ],
        &["show", "done-1", "--json"],
        &["show", "waiting-1", "--json"],
        &["history", "done-1", "--json"],
        &["history", "failed-1", "--json"],
        &["schema", "--json"],
        &["schema", "waiting-1", "--json"],
        &["prune", "--older-than", "0s", "--dry-run", "--json"],
        &["runs", "--attr", "team=alpha", "--json"],
        &[
            "runs",
            "--attr",
            "n:int>=2",
            "--attr",
            "doc=spec.md",
            "--json",
        ],
    ]
    .iter()
    .map(|args| store.json(args))
    .collect()
}

/// Every read command on `store`, with the values the populated runs have.
fn check_reads(store: &Store, label: &str) {
    let runs = store.json(&["runs", "--json"]);
    assert_eq!(
        statuses(&runs),
        pairs(&[
            ("cancelled-1", "cancelled"),
            ("done-1", "completed"),
            ("failed-1", "failed"),
            ("waiting-1", "waiting"),
            ("waiting-2", "waiting"),
        ])
    );
    let waiting = store.json(&["runs", "--status", "waiting", "--json"]);
    assert_eq!(waiting.as_array().unwrap().len(), 2);
    assert_eq!(waiting[0]["waiting_for"]["event"], "approve");

    let show = store.json(&["show", "done-1", "--json"]);
    assert_eq!(show["run"]["state"], "Done");
    assert_eq!(show["payload"], json!({"Done": {"by": "bob"}}));
    let show = store.text(&["show", "waiting-1"]);
    assert!(show.contains("event approve"), "{show}");

    let history = store.json(&["history", "done-1", "--json"]);
    let states: Vec<&str> = history["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["Ask", "Done"]);
    assert_eq!(history["events"][0]["name"], "approve");
    assert_eq!(history["events"][0]["delivered"], true);
    let failed = store.json(&["history", "failed-1", "--json"]);
    assert_eq!(
        failed["transitions"][0]["failures"][0]["errors"][0],
        "approved by nobody"
    );
    let text = store.text(&["history", "failed-1"]);
    assert!(text.contains("approved by nobody"), "{text}");

    let schemas = store.json(&["schema", "--json"]);
    assert_eq!(schemas.as_array().unwrap().len(), 1);
    assert_eq!(schemas[0]["workflow"], "gate");
    assert_eq!(schemas[0]["runs"], 5);
    let hash = schemas[0]["hash"].as_str().unwrap().to_owned();
    let by_hash = store.text(&["schema", "--hash", &hash[..6]]);
    assert!(
        by_hash.contains("state Ask (struct, initial) -> Done"),
        "{by_hash}"
    );
    let of_run = store.json(&["schema", "waiting-1", "--json"]);
    assert_eq!(of_run["hash"], hash.as_str());
    // The runs of one schema, named by a prefix of its hash; none for a schema not stored.
    let of_schema = store.json(&[
        "runs",
        "--schema",
        &hash[..8],
        "--status",
        "waiting",
        "--json",
    ]);
    assert_eq!(
        statuses(&of_schema),
        pairs(&[("waiting-1", "waiting"), ("waiting-2", "waiting")])
    );
    let unknown = store.fails(&["runs", "--schema", "00000000"], 1);
    assert_eq!(
        unknown,
        format!("error: no schema 00000000 is stored in {label} (`loops schema` lists them)\n")
    );

    check_attributes(store);

    let mermaid = store.text(&["graph", "gate"]);
    assert!(mermaid.contains("Ask --> Done"), "{mermaid}");
    let path = store.text(&["graph", "--run", "done-1", "--format", "dot"]);
    assert!(path.contains("digraph"), "{path}");

    let dry = store.json(&["prune", "--older-than", "0s", "--dry-run", "--json"]);
    assert_eq!(dry["runs"], 3, "{dry}");

    // The same failures, with the same exit codes, on every path.
    let missing = store.fails(&["show", "nope"], 1);
    assert_eq!(
        missing,
        format!(
            "error: run `nope` does not exist in store {label} (`loops runs` lists the runs)\n"
        )
    );
    let bad = store.fails(&["history", " padded"], 2);
    assert!(bad.contains("starts or ends with white space"), "{bad}");
}

/// `loops runs --attr` and the attributes `show` and `--json` print, as `populate` set them.
fn check_attributes(store: &Store) {
    let runs = |args: &[&str]| {
        let mut all = vec!["runs", "--json"];
        all.extend_from_slice(args);
        statuses(&store.json(&all))
    };
    assert_eq!(
        runs(&["--attr", "team=alpha"]),
        pairs(&[("done-1", "completed"), ("waiting-1", "waiting")])
    );
    assert_eq!(
        runs(&["--attr", "team=beta", "--status", "waiting"]),
        pairs(&[("waiting-2", "waiting")])
    );
    assert_eq!(
        runs(&["--attr", "n:int>=1", "--attr", "n:int<=2"]),
        pairs(&[("cancelled-1", "cancelled"), ("failed-1", "failed")])
    );
    assert_eq!(
        runs(&[
            "--attr",
            "doc=spec.md",
            "--workflow",
            "gate",
            "--status",
            "waiting,failed"
        ]),
        pairs(&[
            ("failed-1", "failed"),
            ("waiting-1", "waiting"),
            ("waiting-2", "waiting")
        ])
    );
    // Another type, another value, another key: none.
    for attr in ["n=3", "team=gamma", "owner=alpha", "n:int>=5"] {
        assert_eq!(
            runs(&["--attr", attr]),
            Vec::<(String, String)>::new(),
            "{attr}"
        );
    }
    let found = store.json(&["runs", "--attr", "n:int=3", "--json"]);
    assert_eq!(
        found[0]["attributes"],
        json!({"doc": {"str": "spec.md"}, "n": {"int": 3}, "team": {"str": "alpha"}})
    );
    let show = store.json(&["show", "waiting-2", "--json"]);
    assert_eq!(
        show["run"]["attributes"],
        json!({"doc": {"str": "spec.md"}, "n": {"int": 4}, "team": {"str": "beta"}})
    );
    let text = store.text(&["show", "waiting-2"]);
    for line in ["doc = spec.md (str)", "n = 4 (int)", "team = beta (str)"] {
        assert!(text.contains(line), "{line} in {text}");
    }
    let bad = store.fails(&["runs", "--attr", "n:int=x"], 2);
    assert!(bad.contains("`x` is not an integer"), "{bad}");
}

/// The steering commands on `store`; `driven` is the runtime that drives the runs, if one
/// does (then an approval sent makes the run finish in it); `waiting` is what `send` says of a
/// run that waits for the event it is sent.
fn check_steering(
    store: &Store,
    driven: Option<(&Runtime, &tokio::runtime::Runtime)>,
    waiting: &str,
) {
    let bad = store.fails(&["send", "waiting-1", "", "--json", "{}"], 2);
    assert!(bad.starts_with("error: "), "{bad}");
    // A name the workflow does not declare, and a payload that does not match: exit 2, the
    // declared events listed, nothing written.
    let typo = store.fails(
        &["send", "waiting-1", "aprove", "--json", r#"{"by":"al"}"#],
        2,
    );
    assert_eq!(
        typo,
        "error: run `waiting-1` (state `Ask`, seq 0): event `aprove` refused: workflow `gate` \
         declares no event `aprove`; it declares approve: Approval { by: String }, note: u64\n"
    );
    let shape = store.fails(
        &["send", "waiting-1", "approve", "--json", r#"{"wrong":1}"#],
        2,
    );
    assert_eq!(
        shape,
        "error: run `waiting-1` (state `Ask`, seq 0): event `approve` refused: the payload does \
         not match event `approve`'s declared shape `Approval { by: String }`: field `by` \
         (String) is missing\n"
    );
    let shown = store.json(&["show", "waiting-1", "--json"]);
    assert_eq!(shown["pending_events"], json!([]), "{shown}");
    let ended = store.fails(&["send", "done-1", "approve", "--json", r#"{"by":"x"}"#], 1);
    assert_eq!(
        ended,
        "error: run `done-1` has ended (completed); sending an event is not possible\n"
    );
    // An event the run does not wait for stays in its inbox; its key makes a second send a
    // no-op.
    let note = ["send", "waiting-2", "note", "--json", "1", "--key", "n-1"];
    let sent = store.json(&[&note[..], &["--output", "json"]].concat());
    assert_eq!(
        (sent["event_seq"].as_u64(), sent["duplicate"].as_bool()),
        (Some(0), Some(false))
    );
    let again = store.json(&[&note[..], &["--output", "json"]].concat());
    assert_eq!(
        (again["event_seq"].as_u64(), again["duplicate"].as_bool()),
        (Some(0), Some(true))
    );
    // What `send` promises depends on who takes the event: the next process to start, the
    // process that holds the file (which may have handed it over already), or a worker.
    let sent = store.text(&[
        "send",
        "waiting-1",
        "approve",
        "--json",
        r#"{"by":"alice"}"#,
    ]);
    let head = "sent event `approve` to run waiting-1 (event seq 0); ";
    let took = format!("{head}the run took it and is ");
    assert!(
        sent == format!("{head}{waiting}\n") || (driven.is_some() && sent.starts_with(&took)),
        "{sent}"
    );
    if let Some((rt, tokio)) = driven {
        tokio.block_on(until(rt, "waiting-1", RunStatus::Completed));
        let show = store.json(&["show", "waiting-1", "--json"]);
        assert_eq!(show["payload"], json!({"Done": {"by": "alice"}}));
    } else {
        let show = store.json(&["show", "waiting-1", "--json"]);
        assert_eq!(show["pending_events"][0]["name"], "approve");
    }

    let cancelled = store.json(&["cancel", "waiting-2", "--reason", "dup", "--json"]);
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["cancel_reason"], "dup");
    let retried = store.json(&["retry", "failed-1", "--json"]);
    assert_eq!(retried["status"], "running");
    if let Some((rt, tokio)) = driven {
        // Its handler's wait replays the recorded approval by `fail`: it fails again.
        tokio.block_on(until(rt, "failed-1", RunStatus::Failed));
    }
    assert_eq!(store.fails(&["retry", "done-1"], 1).lines().count(), 1);

    // Every ended run but the failed one (retried: it is running or waiting again).
    let pruned = store.json(&["prune", "--keep-last", "0", "--keep-failed", "--json"]);
    assert_eq!(pruned["dry_run"], false);
    let mut ids: Vec<String> = pruned["run_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    let mut want = vec!["cancelled-1", "done-1", "waiting-2"];
    if driven.is_some() {
        want.push("waiting-1");
    }
    want.sort_unstable();
    assert_eq!(ids, want);
    let left: Vec<String> = statuses(&store.json(&["runs", "--json"]))
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let want: &[&str] = if driven.is_some() {
        &["failed-1"]
    } else {
        &["failed-1", "waiting-1"]
    };
    assert_eq!(left, want);
}

fn redb_store(dir: &Path) -> PathBuf {
    let path = dir.join("store.redb");
    let tokio = tokio();
    tokio.block_on(async {
        let rt = builder().open(&path).unwrap();
        populate(&rt).await;
        rt.shutdown().await;
    });
    path
}

#[test]
fn every_command_on_a_store_file_that_no_process_holds() {
    let dir = tempfile::tempdir().unwrap();
    let path = redb_store(dir.path());
    let store = Store::file(&path);
    let verbose = store.loops(&["runs", "--verbose"]);
    assert!(
        String::from_utf8_lossy(&verbose.stderr)
            .contains("read the store file directly (no process holds it)"),
        "{verbose:?}"
    );
    let before = std::fs::read(&path).unwrap();
    check_reads(&store, &path.display().to_string());
    assert!(
        std::fs::read(&path).unwrap() == before,
        "a read wrote to the file"
    );
    check_steering(
        &store,
        None,
        "the run waits for it and takes it when a process that drives workflow `gate` next starts, if the workflow's type reads it (checked here against the stored schema only: a value the type refuses is set aside, as `loops history` shows)",
    );
    let check = store.json(&["check", "--json"]);
    assert_eq!(check["intact"], true);
    store.text(&["compact"]);
}

#[test]
fn every_command_through_the_control_endpoint_of_the_process_that_holds_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = redb_store(dir.path());
    let store = Store::file(&path);
    // What the file answers when read directly, to compare with the process's answers.
    let direct = reads(&store);

    let tokio = tokio();
    let (rt, server): (Runtime, ControlServer) = tokio.block_on(async {
        let rt = builder().open(&path).unwrap();
        rt.resume_all().await.unwrap();
        let server = rt.serve_control_next_to_store().await.unwrap();
        (rt, server)
    });
    let socket = dir.path().join("store.redb.sock");
    assert_eq!(
        server.endpoint(),
        &loops_core::control::Endpoint::Unix(socket.clone())
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    let verbose = store.loops(&["runs", "--verbose"]);
    assert!(
        String::from_utf8_lossy(&verbose.stderr).contains(&format!(
            "through the control endpoint unix:{} of the process that holds the store",
            socket.display()
        )),
        "{verbose:?}"
    );
    assert_eq!(reads(&store), direct);
    check_reads(&store, &path.display().to_string());
    check_steering(
        &store,
        Some((&rt, &tokio)),
        "the run waits for it, and the process that holds the store hands it over now",
    );
    // The file needs to be the checker's alone; compaction is made by the process.
    let check = store.fails(&["check"], 1);
    assert!(check.contains("held by a running process"), "{check}");
    store.text(&["compact"]);

    tokio.block_on(server.stop());
    assert!(
        !socket.exists(),
        "the socket is removed when the server stops"
    );
    // Without the endpoint, a held store is refused in one line.
    let locked = store.fails(&["runs"], 1);
    assert!(locked.contains("serves no control endpoint"), "{locked}");
    tokio.block_on(rt.shutdown());
    drop(rt);
    // Once the process is gone, the file is read directly again.
    assert_eq!(
        statuses(&store.json(&["runs", "--json"])),
        pairs(&[("failed-1", "failed")])
    );
}

/// A process that serves the control endpoint but does not drive the run's workflow: a send
/// and a retry say that it does not take the run up (before, a send said it handed the event
/// over, and a retry that it did if it drove the workflow, while the run kept waiting).
#[test]
fn a_send_through_a_process_that_does_not_drive_the_workflow_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = redb_store(dir.path());
    let store = Store::file(&path);
    let tokio = tokio();
    let (rt, server): (Runtime, ControlServer) = tokio.block_on(async {
        let rt = Runtime::builder().open(&path).unwrap();
        let server = rt.serve_control_next_to_store().await.unwrap();
        (rt, server)
    });
    let said = store.text(&["send", "waiting-1", "approve", "--json", r#"{"by":"al"}"#]);
    assert_eq!(
        said,
        "sent event `approve` to run waiting-1 (event seq 0); the run waits for it, but the \
         process that holds the store does not take it up: it is not driving this run, and \
         does not resume other runs of workflow `gate` (it drives only the runs it was given; \
         the workflow is not registered in it): a process that drives the workflow takes it \
         when it drives the run\n"
    );
    let shown = store.json(&["show", "waiting-1", "--json"]);
    assert_eq!(shown["run"]["status"], "waiting", "{shown}");
    assert_eq!(shown["pending_events"][0]["delivered"], false, "{shown}");
    // So is a retry: the run stays running, with nobody driving it here.
    let retried = store.text(&["retry", "failed-1"]);
    assert!(
        retried.ends_with(
            "the process that holds the store does not take it up: it is not driving this run, \
             and does not resume other runs of workflow `gate` (it drives only the runs it was \
             given; the workflow is not registered in it): a process that drives the workflow \
             resumes it when it starts or drives it\n"
        ),
        "{retried}"
    );
    tokio.block_on(async {
        server.stop().await;
        rt.shutdown().await;
    });
}

/// A socket left by a process that died is not answered on: the file is read directly.
#[test]
fn a_stale_socket_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = redb_store(dir.path());
    let socket = dir.path().join("store.redb.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let store = Store::file(&path);
    assert_eq!(statuses(&store.json(&["runs", "--json"])).len(), 5);
}

/// A process of another loops version is refused, naming both versions.
#[test]
fn a_process_of_another_loops_version_is_refused_naming_both() {
    use std::io::{Read as _, Write as _};
    let dir = tempfile::tempdir().unwrap();
    let path = redb_store(dir.path());
    let socket = dir.path().join("store.redb.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        let _ = conn.read(&mut buf).unwrap();
        let body = r#"{"loops_version":"9.9.9","protocol":"v1","store":"x"}"#;
        write!(
            conn,
            "HTTP/1.1 200 OK\r\nloops-version: 9.9.9\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
    });
    let store = Store::file(&path);
    let err = store.fails(&["runs"], 1);
    server.join().unwrap();
    assert_eq!(
        err,
        format!(
            "error: store {}: the process on control endpoint unix:{} runs loops 9.9.9, and this client is loops {}: use a loops CLI of version 9.9.9\n",
            path.display(),
            socket.display(),
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// A schema of the test server's database for one test, dropped when the test ends.
struct PgSchema {
    name: String,
}

impl PgSchema {
    fn new(test: &str) -> PgSchema {
        let name = format!("lc_{test}_{}", std::process::id());
        let schema = PgSchema { name };
        schema.drop_it();
        schema
    }

    async fn store(&self) -> PgStore {
        PgStore::builder(pg_url())
            .schema(&self.name)
            .pool_size(4)
            .lease_ttl(Duration::from_millis(600))
            .connect()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL is not reachable at {} ({e}); the tests need it",
                    pg_url()
                )
            })
    }

    fn drop_it(&self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let Ok((client, connection)) =
                    tokio_postgres::connect(&pg_url(), tokio_postgres::NoTls).await
                else {
                    return;
                };
                tokio::spawn(connection);
                let _ = client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                    .await;
            });
        })
        .join();
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        self.drop_it();
    }
}

#[test]
fn every_command_on_a_postgresql_store_with_three_workers_serving() {
    let schema = PgSchema::new("every_command");
    let tokio = tokio();
    let workers: Vec<Runtime> = tokio.block_on(async {
        let first = builder().build(schema.store().await);
        populate(&first).await;
        let mut workers = vec![first];
        for _ in 0..2 {
            workers.push(builder().build(schema.store().await));
        }
        for worker in &workers {
            let worker = worker.clone();
            tokio::spawn(async move { worker.serve(Duration::from_millis(50)).await });
        }
        workers
    });
    let store = Store::postgres(&schema.name);
    let verbose = store.loops(&["runs", "--verbose"]);
    assert!(
        String::from_utf8_lossy(&verbose.stderr).contains("connected to the PostgreSQL store"),
        "{verbose:?}"
    );
    let label = tokio.block_on(async { schema.store().await.label().to_owned() });
    check_reads(&store, &label);
    check_steering(
        &store,
        Some((&workers[1], &tokio)),
        "the run waits for it; a worker that serves workflow `gate` takes it when it next claims ready runs",
    );
    let compact = store.fails(&["compact"], 1);
    assert!(compact.contains("VACUUM"), "{compact}");
    let check = store.fails(&["check"], 1);
    assert!(check.contains("redb store file"), "{check}");
    tokio.block_on(async {
        for worker in &workers {
            worker.shutdown().await;
        }
    });
}

/// A schema with no store, and a server that is down: one line, exit code 1, nothing
/// created.
#[test]
fn a_missing_postgresql_store_or_a_server_that_is_down_is_one_line() {
    let schema = PgSchema::new("missing");
    let store = Store::postgres(&schema.name);
    let err = store.fails(&["runs"], 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("holds no loops store"), "{err}");
    // Still nothing there: the read created nothing.
    let again = store.fails(&["runs"], 1);
    assert!(
        again.trim_end().ends_with(&format!(
            "schema \"{}\" holds no loops store (no loops-postgres tables); a worker's connect creates it (`migrate` on, the default)",
            schema.name
        )),
        "{again}"
    );

    let down = Store {
        args: vec![
            "--store".into(),
            "postgres://postgres@127.0.0.1:1/test".into(),
        ],
    };
    let err = down.fails(&["runs"], 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: cannot connect to postgres://postgres@127.0.0.1:1/test"),
        "{err}"
    );
}

/// An encrypted PostgreSQL store and the CLI without the key: reads go on, each sealed
/// payload shown as `<encrypted: key k1>`; a command that would store a payload in clear is
/// refused with the store's one message (exit 1), and nothing is written; with the key, the
/// payload is shown in clear.
#[test]
fn an_encrypted_postgresql_store_is_read_redacted_and_not_written_in_clear_without_the_key() {
    let schema = PgSchema::new("encrypted");
    let tokio = tokio();
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("k1 {}\n", "0b".repeat(32))).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let label = tokio.block_on(async {
        let store = schema.store().await;
        let label = store.label().to_owned();
        let rt = builder()
            .codec(loops_core::Keyring::from_file(&keys).unwrap())
            .build(store);
        rt.start("waiting-1", ask()).await.unwrap();
        until(&rt, "waiting-1", RunStatus::Waiting).await;
        rt.shutdown().await;
        label
    });
    let store = Store::postgres(&schema.name);
    let latest = store.json(&["show", "waiting-1", "--json"]);
    assert_eq!(latest["payload"], json!("<encrypted: key k1>"), "{latest}");
    let err = store.fails(
        &["send", "waiting-1", "approve", "--json", r#"{"by":"eve"}"#],
        1,
    );
    assert_eq!(
        err,
        format!(
            "error: store {label} holds payloads encrypted with key k1: {}\n",
            NO_KEY_HINT
        )
    );
    let keyed = Store {
        args: [
            store.args.clone(),
            vec!["--key-file".into(), keys.display().to_string()],
        ]
        .concat(),
    };
    assert_eq!(
        keyed.json(&["show", "waiting-1", "--json"])["payload"],
        json!({"Ask": {"doc": "spec.md"}})
    );
    // The refused event was not written.
    let history = keyed.json(&["history", "waiting-1", "--json"]);
    assert_eq!(history["events"], json!([]), "{history}");
}
