//! The `loops` binary on runs of a changed workflow: a run blocked by a build that does not
//! know its schema (`runs --status blocked`, `show`), and a run migrated to a new version
//! (`history` shows the migration record), made through loops-core.

use std::path::{Path, PathBuf};
use std::time::Duration;

use assert_cmd::Command;
use loops_core::{BoxError, Context, Error, Migrate, RetryPolicy, RunStatus, Runtime, Workflow};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

mod v1 {
    use super::*;

    /// Version 1: fetches, then works (and hangs there, for the tests).
    #[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "job", version = 1, crate = loops_core)]
    pub enum Job {
        #[initial]
        #[next(Work)]
        Start { mode: String },
        #[next(Done)]
        Work { mode: String, items: Vec<String> },
        #[terminal]
        Done { delivered: u32 },
    }

    pub struct Hangs;

    impl JobHandler for Hangs {
        type Error = BoxError;

        async fn start(&self, _: &Context, mode: String) -> Result<StartNext, BoxError> {
            Ok(StartNext::Work {
                mode,
                items: vec!["a".into(), "b".into()],
            })
        }

        async fn work(
            &self,
            ctx: &Context,
            _: String,
            _: Vec<String>,
        ) -> Result<WorkNext, BoxError> {
            ctx.step("begin", || async { Ok(true) }).await?;
            std::future::pending::<()>().await;
            unreachable!()
        }
    }
}

mod v2 {
    use super::*;

    /// Version 2: `Work` counts its items.
    #[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "job", version = 2, crate = loops_core)]
    pub enum Job {
        #[initial]
        #[next(Work)]
        Start { mode: String },
        #[next(Done)]
        Work {
            mode: String,
            items: Vec<String>,
            count: u32,
        },
        #[terminal]
        Done { delivered: u32 },
    }

    impl Migrate<v1::Job> for Job {
        fn migrate(old: v1::Job) -> Result<Self, BoxError> {
            Ok(match old {
                v1::Job::Start { mode } => Job::Start { mode },
                v1::Job::Work { mode, items } => {
                    let count = u32::try_from(items.len())?;
                    Job::Work { mode, items, count }
                }
                v1::Job::Done { delivered } => Job::Done { delivered },
            })
        }
    }

    pub struct Counts;

    impl JobHandler for Counts {
        type Error = BoxError;

        async fn start(&self, _: &Context, mode: String) -> Result<StartNext, BoxError> {
            Ok(StartNext::Work {
                mode,
                items: vec![],
                count: 0,
            })
        }

        async fn work(
            &self,
            ctx: &Context,
            _: String,
            _: Vec<String>,
            count: u32,
        ) -> Result<WorkNext, BoxError> {
            ctx.step("deliver", || async { Ok(count) }).await?;
            Ok(WorkNext::Done { delivered: count })
        }
    }
}

fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Version 1's run `run_id`, left at `Work` (seq 1) with its step `begin` recorded, its
/// driver dropped.
async fn hung_at_work(path: &Path, run_id: &str) {
    let rt = Runtime::builder()
        .retry(RetryPolicy::never())
        .open(path)
        .unwrap();
    let driver = {
        let rt = rt.clone();
        let run_id = run_id.to_owned();
        tokio::spawn(async move {
            rt.run(&run_id, v1::Job::Start { mode: "m".into() }, &v1::Hangs)
                .await
        })
    };
    for _ in 0..1000 {
        if rt.store().steps(run_id, 1).await.unwrap().len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    driver.abort();
    let _ = driver.await;
    rt.shutdown().await;
}

/// A store with `blocked-1` (version 1, refused by a build of version 2 alone) and `moved-1`
/// (version 1, migrated to version 2 and finished there).
fn store() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    tokio().block_on(async {
        hung_at_work(&path, "blocked-1").await;
        hung_at_work(&path, "moved-1").await;
        // A build of version 2 without the migration refuses `blocked-1` and blocks it.
        let rt = Runtime::builder().open(&path).unwrap();
        let err = rt
            .run(
                "blocked-1",
                v2::Job::Start { mode: "m".into() },
                &v2::Counts,
            )
            .await
            .unwrap_err();
        assert!(matches!(err, Error::SchemaMismatch { .. }), "{err}");
        rt.shutdown().await;
        drop(rt);
        // With the migration, `moved-1` is migrated at `Work` and finishes on version 2.
        let rt = Runtime::builder()
            .migration::<v1::Job, v2::Job>()
            .open(&path)
            .unwrap();
        let done = rt
            .run("moved-1", v2::Job::Start { mode: "m".into() }, &v2::Counts)
            .await
            .unwrap();
        assert_eq!(done, v2::Job::Done { delivered: 2 });
        rt.shutdown().await;
    });
    (dir, path)
}

fn loops(path: &Path) -> Command {
    let mut cmd = Command::cargo_bin("loops").unwrap();
    cmd.env("LOOPS_STORE", path).env("NO_COLOR", "1");
    cmd
}

fn json(path: &Path, args: &[&str]) -> Value {
    let out = loops(path).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "loops {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn text(path: &Path, args: &[&str]) -> String {
    let out = loops(path).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "loops {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The changes a build of version 2 alone reports for a run of version 1.
const VERSION_CHANGE: &str = "version changed from 1 to 2 (compatible: the version is not in the records; accept the old version's runs only if their data means the same)";
/// The field change, whose reason names both steps with the run's schema.
fn field_change() -> String {
    format!(
        "state `Work`: field `count: u32` added (breaking: records written before lack it; give it `#[serde(default)]` or make it an `Option`, then list the old schema in the workflow's `accepts = [\"{}\"]`)",
        h1()
    )
}

fn h1() -> String {
    v1::Job::SCHEMA_HASH.pinned().to_string()
}

fn h2() -> String {
    v2::Job::SCHEMA_HASH.pinned().to_string()
}

#[test]
fn a_blocked_run_is_listed_as_blocked_and_shown_with_its_reason_and_changes() {
    let (_dir, path) = store();
    let blocked = json(&path, &["runs", "--status", "blocked", "--json"]);
    let runs = blocked.as_array().unwrap();
    assert_eq!(runs.len(), 1, "{blocked}");
    let run = &runs[0];
    assert_eq!(
        (&run["run_id"], &run["status"], &run["state"], &run["seq"]),
        (
            &json!("blocked-1"),
            &json!("blocked"),
            &json!("Work"),
            &json!(1)
        )
    );
    let block = &run["blocked"];
    assert_eq!(block["schema"], h1());
    assert_eq!(block["resume"], "running");
    assert_eq!(block["changes"], json!([VERSION_CHANGE, field_change()]));
    let reason = block["reason"].as_str().unwrap().to_owned();
    assert!(reason.contains(&h1()), "{reason}");
    // Every other listing has it too, and no other run is blocked.
    let all = json(&path, &["runs", "--json"]);
    let statuses: Vec<(&str, &str)> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["run_id"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        statuses,
        [("moved-1", "completed"), ("blocked-1", "blocked")]
    );
    assert_eq!(all[0]["blocked"], Value::Null);

    // The table says it under WAITING FOR; `show` says why, what changed, and what next.
    let table = text(&path, &["runs", "--status", "blocked"]);
    assert!(table.contains(&format!("blocked: {reason}")), "{table}");
    let shown = text(&path, &["show", "blocked-1"]);
    for line in [
        format!("status          {}\n", RunStatus::Blocked),
        format!("blocked         {reason}\n"),
        format!("change          {VERSION_CHANGE}\n"),
        format!("change          {}\n", field_change()),
        format!(
            "unblocked       goes back to running when a build that knows schema {} (or a \
             migration from it) drives it; see docs/evolution.md\n",
            h1()
        ),
    ] {
        assert!(shown.contains(&line), "{line:?} not in:\n{shown}");
    }
    let shown = json(&path, &["show", "blocked-1", "--json"]);
    assert_eq!(shown["run"]["blocked"], *block);
    // `retry` is for failed runs, and says what resumes a blocked one.
    let out = loops(&path).args(["retry", "blocked-1"]).output().unwrap();
    assert_eq!(
        (out.status.code(), String::from_utf8(out.stderr).unwrap()),
        (
            Some(1),
            "error: run `blocked-1` is blocked, not failed; only a failed run can be retried; a blocked run goes back to running when a build that knows its schema (or a migration from it) drives it: `loops show` says why it is blocked (docs/evolution.md)\n".to_owned()
        )
    );
}

#[test]
fn history_shows_a_migration_record_with_where_it_comes_from() {
    let (_dir, path) = store();
    let history = json(&path, &["history", "moved-1", "--json"]);
    let transitions = history["transitions"].as_array().unwrap();
    let shape: Vec<(u64, &str, &str, &Value)> = transitions
        .iter()
        .map(|t| {
            (
                t["seq"].as_u64().unwrap(),
                t["state"].as_str().unwrap(),
                t["schema"].as_str().unwrap(),
                &t["migrated_from"],
            )
        })
        .collect();
    let (h1, h2) = (h1(), h2());
    let from = json!({"schema": h1, "version": 1, "seq": 1, "accepted": false});
    assert_eq!(
        shape,
        [
            (0, "Start", h1.as_str(), &Value::Null),
            (1, "Work", h1.as_str(), &Value::Null),
            (2, "Work", h2.as_str(), &from),
            (3, "Done", h2.as_str(), &Value::Null),
        ]
    );
    // The migrated state's payload is version 2's; the steps of the state it continues are
    // recorded under that state's seq (1), before the migration (`begin`) and after it
    // (`deliver`, by version 2).
    assert_eq!(
        transitions[2]["payload"],
        json!({"Work": {"mode": "m", "items": ["a", "b"], "count": 2}})
    );
    let steps: Vec<&str> = transitions[1]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["begin", "deliver"]);

    let text = text(&path, &["history", "moved-1"]);
    // The text is a timeline: the step after the migration is listed after its record.
    let kinds: Vec<(&str, &str)> = text
        .lines()
        .skip(3)
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let first = words.next()?;
            if first.parse::<u64>().is_ok() {
                Some((words.next()?, words.next()?))
            } else {
                Some((first, words.next()?))
            }
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("state", "Start"),
            ("state", "Work"),
            ("step", "begin#0"),
            ("migrated", "Work"),
            // Version 1's attempt, cut short, is recorded as the new version resumes.
            ("stopped", "interrupted"),
            ("step", "deliver#0"),
            ("state", "Done"),
        ],
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.contains("migrated"))
        .unwrap_or_else(|| panic!("no migration line:\n{text}"));
    assert!(line.starts_with("2    migrated  Work "), "{line}");
    assert!(
        line.ends_with(&format!(
            "migrated from schema {h1} (version 1) to {h2} at seq 2 (continues seq 1)"
        )),
        "{line}"
    );
}

#[test]
fn graph_of_a_migrated_run_draws_no_move_for_the_migration() {
    let (_dir, path) = store();
    let graph = text(&path, &["graph", "--run", "moved-1", "--format", "mermaid"]);
    // Start -> Work -> (migrated at Work) -> Done: three states visited, two moves, no
    // Work -> Work.
    let moves: Vec<&str> = graph
        .lines()
        .map(str::trim)
        .filter(|l| l.contains(" --> "))
        .collect();
    assert_eq!(
        moves,
        [
            "[*] --> Start",
            "Start --> Work: 1×",
            "Work --> Done: 1×",
            "Done --> [*]"
        ],
        "{graph}"
    );
    assert!(graph.contains("after 2 transitions"), "{graph}");
}

/// A workflow whose version 2 adds an event (`reject`) and accepts version 1's runs as they
/// are: a v1 run taken by version 2 and waiting for `reject` is sent it by `Runtime::send`,
/// by `loops send` on the store, and by `loops send` through the serving process.
mod review {
    use super::*;

    /// An event's payload.
    #[derive(loops_derive::Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[schema(crate = loops_core)]
    pub struct Note {
        pub text: String,
    }

    pub mod v1 {
        use super::*;

        /// Version 1: waits for `approve` (the only event it declares), or, for the run
        /// `by-runtime`, hangs there (a run left running by a process that died).
        #[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
        #[workflow(name = "review", version = 1, crate = loops_core)]
        #[event(approve: Note)]
        pub enum Review {
            #[initial]
            #[next(Done)]
            Open { title: String },
            #[terminal]
            Done { verdict: String },
        }

        pub struct Hangs;

        impl ReviewHandler for Hangs {
            type Error = BoxError;

            async fn open(&self, ctx: &Context, title: String) -> Result<OpenNext, BoxError> {
                if title == "by-runtime" {
                    std::future::pending::<()>().await;
                }
                let note = ctx.wait_for(Review::APPROVE).await?;
                Ok(OpenNext::Done {
                    verdict: format!("{title} approved: {}", note.text),
                })
            }
        }
    }

    pub mod v2 {
        use super::*;

        /// Version 2: declares `reject` too, and waits for it; accepts version 1 (adding an
        /// event is compatible).
        #[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
        #[workflow(name = "review", version = 2, accepts = ["a483c65cf7cc8add"], crate = loops_core)]
        #[event(approve: Note)]
        #[event(reject: Note)]
        pub enum Review {
            #[initial]
            #[next(Done)]
            Open { title: String },
            #[terminal]
            Done { verdict: String },
        }

        pub struct Rejects;

        impl ReviewHandler for Rejects {
            type Error = BoxError;

            async fn open(&self, ctx: &Context, title: String) -> Result<OpenNext, BoxError> {
                let note = ctx.wait_for(Review::REJECT).await?;
                Ok(OpenNext::Done {
                    verdict: format!("{title} rejected: {}", note.text),
                })
            }
        }
    }

    pub mod v3 {
        use super::*;

        /// Version 3: a field added that must be present, no `accepts` and no migration: it
        /// cannot take version 1's runs.
        #[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
        #[workflow(name = "review", version = 3, crate = loops_core)]
        #[event(approve: Note)]
        pub enum Review {
            #[initial]
            #[next(Done)]
            Open { title: String, due_ms: u64 },
            #[terminal]
            Done { verdict: String },
        }

        pub struct Approves;

        impl ReviewHandler for Approves {
            type Error = BoxError;

            async fn open(
                &self,
                ctx: &Context,
                title: String,
                _: u64,
            ) -> Result<OpenNext, BoxError> {
                let note = ctx.wait_for(Review::APPROVE).await?;
                Ok(OpenNext::Done {
                    verdict: format!("{title} approved: {}", note.text),
                })
            }
        }
    }

    /// Version 1's run `run_id`, left in `Open` with its driver dropped: waiting for
    /// `approve`, or (`by-runtime`) running.
    pub async fn opened_by_v1(path: &Path, run_id: &str) {
        let rt = Runtime::open(path).unwrap();
        let driver = {
            let rt = rt.clone();
            let run_id = run_id.to_owned();
            tokio::spawn(async move {
                let open = v1::Review::Open {
                    title: run_id.clone(),
                };
                rt.run(&run_id, open, &v1::Hangs).await
            })
        };
        let status = if run_id == "by-runtime" {
            RunStatus::Running
        } else {
            RunStatus::Waiting
        };
        while rt.run_info(run_id).await.unwrap().map(|r| r.status) != Some(status) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        driver.abort();
        let _ = driver.await;
        rt.shutdown().await;
    }

    /// Version 2's runtime on `path`, its runs resumed: each v1 run, waiting or not, is
    /// accepted at once and waits for `reject`.
    pub async fn v2_waiting(path: &Path, run_ids: &[&str]) -> Runtime {
        let rt = Runtime::builder()
            .register::<v2::Review, _>(v2::Rejects)
            .open(path)
            .unwrap();
        rt.resume_all().await.unwrap();
        for run_id in run_ids {
            until_waiting_for(&rt, run_id, "reject").await;
        }
        rt
    }

    pub async fn until_waiting_for(rt: &Runtime, run_id: &str, event: &str) {
        for _ in 0..2000 {
            let info = rt.run_info(run_id).await.unwrap().unwrap();
            if info.status == RunStatus::Waiting
                && info.wait.and_then(|w| w.event).as_deref() == Some(event)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("run {run_id} never waited for {event}");
    }

    pub async fn verdict(rt: &Runtime, run_id: &str) -> String {
        match rt.wait::<v2::Review>(run_id).await.unwrap() {
            v2::Review::Done { verdict } => verdict,
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn the_accepts_claim_names_version_1() {
    assert_eq!(
        review::v2::Review::ACCEPTS,
        [review::v1::Review::SCHEMA_HASH.pinned()]
    );
}

#[test]
fn an_accepted_run_takes_the_events_of_the_version_that_accepted_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("review.redb");
    let tokio = tokio();
    let (h1, h2) = (
        review::v1::Review::SCHEMA_HASH.pinned().to_string(),
        review::v2::Review::SCHEMA_HASH.pinned().to_string(),
    );
    tokio.block_on(async {
        for run_id in ["by-runtime", "by-cli", "by-endpoint"] {
            review::opened_by_v1(&path, run_id).await;
        }
        // Version 2 takes them at its start (one acceptance record each: the two parked
        // waiting for `approve` too, whose handler runs again under version 2) and they wait
        // for `reject`, which version 1 does not declare; its own `send` reaches the first
        // (by name: a name is checked against the run's declared events, a typed event by
        // the compiler).
        let rt = review::v2_waiting(&path, &["by-runtime", "by-cli", "by-endpoint"]).await;
        let note = review::Note { text: "no".into() };
        rt.send("by-runtime", "reject", &note).await.unwrap();
        assert_eq!(
            review::verdict(&rt, "by-runtime").await,
            "by-runtime rejected: no"
        );
        rt.shutdown().await;
    });
    // The store says the run is version 2's: the CLI, with no build at hand, takes `reject`.
    let history = json(&path, &["history", "by-cli", "--json"]);
    let shape: Vec<(u64, &str, &str, &Value)> = history["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["seq"].as_u64().unwrap(),
                t["state"].as_str().unwrap(),
                t["schema"].as_str().unwrap(),
                &t["migrated_from"],
            )
        })
        .collect();
    let from = json!({"schema": h1, "version": 1, "seq": 0, "accepted": true});
    assert_eq!(
        shape,
        [
            (0, "Open", h1.as_str(), &Value::Null),
            (1, "Open", h2.as_str(), &from),
        ]
    );
    assert_eq!(history["run"]["schema"], json!(h2));
    assert_eq!(
        history["transitions"][0]["payload"],
        history["transitions"][1]["payload"]
    );
    let line = text(&path, &["history", "by-cli"])
        .lines()
        .find(|l| l.contains("accepted"))
        .map(str::to_owned)
        .unwrap();
    assert!(
        line.starts_with("1    accepted  Open ")
            && line.ends_with(&format!(
                "accepted as it is from schema {h1} (version 1) to {h2} at seq 1 (continues seq 0)"
            )),
        "{line}"
    );
    let sent = text(
        &path,
        &["send", "by-cli", "reject", "--json", r#"{"text": "late"}"#],
    );
    assert!(
        sent.starts_with("sent event `reject` to run by-cli"),
        "{sent}"
    );
    // A name neither version declares is still refused.
    let out = loops(&path)
        .args(["send", "by-cli", "retract", "--json", "{}"])
        .output()
        .unwrap();
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8(out.stderr).unwrap().as_str()
        ),
        (
            Some(2),
            "error: run `by-cli` (state `Open`, seq 1): event `retract` refused: workflow `review` declares no event `retract`; it declares approve: Note { text: String }, reject: Note { text: String }\n"
        )
    );
    tokio.block_on(async {
        let rt = review::v2_waiting(&path, &[]).await;
        assert_eq!(
            review::verdict(&rt, "by-cli").await,
            "by-cli rejected: late"
        );
        // Through the serving process (the CLI cannot open the store it holds).
        review::until_waiting_for(&rt, "by-endpoint", "reject").await;
        let server = rt.serve_control_next_to_store().await.unwrap();
        let sent = tokio::task::spawn_blocking({
            let path = path.clone();
            move || {
                text(
                    &path,
                    &[
                        "send",
                        "by-endpoint",
                        "reject",
                        "--json",
                        r#"{"text": "served"}"#,
                    ],
                )
            }
        })
        .await
        .unwrap();
        assert!(
            sent.starts_with("sent event `reject` to run by-endpoint"),
            "{sent}"
        );
        assert_eq!(
            review::verdict(&rt, "by-endpoint").await,
            "by-endpoint rejected: served"
        );
        server.stop().await;
        rt.shutdown().await;
    });
}

/// A version registered on a runtime that has resumed its runs already (a process that
/// registers its workflows as it goes) takes the parked runs of the schema it accepts at
/// once, as a start does: the run waits for `reject`, which only version 2 declares, and is
/// sent it by name. Before, the run stayed version 1's, parked on `approve`, and `reject` was
/// refused until something else woke it.
#[test]
fn a_version_registered_on_a_running_runtime_takes_the_parked_runs_it_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("review.redb");
    let tokio = tokio();
    tokio.block_on(async {
        review::opened_by_v1(&path, "late").await;
        let rt = Runtime::open(&path).unwrap();
        let resumed = rt.resume_all().await.unwrap();
        assert!(resumed.is_empty(), "{resumed:?}");
        rt.register::<review::v2::Review, _>(review::v2::Rejects);
        review::until_waiting_for(&rt, "late", "reject").await;
        let note = review::Note {
            text: "later".into(),
        };
        rt.send("late", "reject", &note).await.unwrap();
        assert_eq!(review::verdict(&rt, "late").await, "late rejected: later");
        let history = rt.store().history("late").await.unwrap();
        let shape: Vec<(&str, Option<bool>)> = history
            .iter()
            .map(|r| (r.state.as_str(), r.migrated.map(|m| m.accepted)))
            .collect();
        assert_eq!(
            shape,
            [("Open", None), ("Open", Some(true)), ("Done", None)]
        );
        rt.shutdown().await;
    });
}

/// A version registered on a running runtime that cannot take version 1's parked run (it
/// neither accepts nor migrates its schema) blocks it at once, with the reason, as a start
/// with that version would: before, the run stayed `waiting`, looking healthy, until an
/// event came (helper-70).
#[test]
fn a_version_registered_on_a_running_runtime_blocks_the_parked_runs_it_cannot_take() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("review.redb");
    let tokio = tokio();
    tokio.block_on(async {
        review::opened_by_v1(&path, "stuck").await;
        let rt = Runtime::open(&path).unwrap();
        assert!(rt.resume_all().await.unwrap().is_empty());
        rt.register::<review::v3::Review, _>(review::v3::Approves);
        let mut info = rt.run_info("stuck").await.unwrap().unwrap();
        for _ in 0..2000 {
            if info.status == RunStatus::Blocked {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            info = rt.run_info("stuck").await.unwrap().unwrap();
        }
        assert_eq!((info.status, info.seq), (RunStatus::Blocked, 0));
        let block = info.block.unwrap();
        assert_eq!(block.schema, review::v1::Review::SCHEMA_HASH.pinned());
        assert!(
            block.changes.iter().any(|c| c.contains("due_ms")),
            "{block:?}"
        );
        rt.shutdown().await;
    });
}
