//! `loops schedules`: listing, pausing, resuming and removing stored schedules, on a store
//! file no process holds, and through the control endpoint of the process that holds it
//! (whose runtime then makes the change, and whose loop sees it).

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use assert_cmd::Command;
use loops_core::{
    BoxError, CatchUp, Context, ManualClock, Runtime, Schedule, control::ControlServer,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = loops_core)]
enum Report {
    #[initial]
    #[next(Done)]
    Start { tick_ms: u64 },
    #[terminal]
    Done { tick_ms: u64 },
}

struct Reporter;

impl ReportHandler for Reporter {
    type Error = BoxError;

    async fn start(&self, _ctx: &Context, tick_ms: u64) -> Result<StartNext, BoxError> {
        Ok(StartNext::Done { tick_ms })
    }
}

/// 2026-12-02T00:00:00Z.
const T0: u64 = 1_796_169_600_000;

/// A runtime on the store file at `path`, on a manual clock at [`T0`] (no tick falls while
/// the test runs), with two schedules registered.
async fn runtime(path: &Path) -> Runtime {
    let rt = Runtime::builder()
        .clock(ManualClock::new(UNIX_EPOCH + Duration::from_millis(T0)))
        .register::<Report, _>(Reporter)
        .open(path)
        .unwrap();
    let hourly = Schedule::every(Duration::from_secs(3600))
        .unwrap()
        .catch_up(CatchUp::Latest);
    let paris = Schedule::cron_in("0 9 * * MON-FRI", "Europe/Paris")
        .unwrap()
        .catch_up(CatchUp::All);
    for (name, s) in [("nightly", hourly), ("morning", paris)] {
        rt.schedule::<Report, _>(name, s, |t| Report::Start { tick_ms: t.at_ms })
            .await
            .unwrap();
    }
    rt
}

fn loops(path: &Path, args: &[&str]) -> std::process::Output {
    Command::cargo_bin("loops")
        .unwrap()
        .env("LOOPS_STORE", path)
        .env("NO_COLOR", "1")
        .args(args)
        .output()
        .unwrap()
}

fn ok(path: &Path, args: &[&str]) -> String {
    let out = loops(path, args);
    assert!(
        out.status.success(),
        "loops {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json_of(path: &Path, args: &[&str]) -> Value {
    serde_json::from_str(&ok(path, args)).unwrap()
}

/// The listed schedules without `next_tick_ms` (which depends on the real clock of the CLI,
/// or of nothing through the process's manual clock), and those times.
fn split(listed: Value) -> (Value, Vec<Value>) {
    let mut listed = listed;
    let mut next = Vec::new();
    for s in listed.as_array_mut().unwrap() {
        next.push(s.as_object_mut().unwrap().remove("next_tick_ms").unwrap());
    }
    (listed, next)
}

fn row(name: &str, spec: &str, catch_up: &str, paused: bool, changed: u64) -> Value {
    json!({
        "name": name,
        "workflow": "report",
        "spec": spec,
        "catch_up": catch_up,
        "paused": paused,
        "through_ms": T0,
        "last_tick_ms": null,
        "created_ms": T0,
        "updated_ms": changed,
    })
}

/// Runs the steps of both tests on `path`: list, pause, resume, remove, and the refusals.
/// `now` is the clock the listing's next ticks are computed by.
fn steer(path: &Path, now: u64) {
    let (listed, next) = split(json_of(path, &["schedules", "--json"]));
    assert_eq!(
        listed,
        json!([
            row(
                "morning",
                "cron 0 9 * * MON-FRI Europe/Paris",
                "all",
                false,
                T0
            ),
            row("nightly", "every 3600000ms", "latest", false, T0),
        ])
    );
    // The next full hour after `now` (or the one after, if the hour turned since).
    let hour = 3_600_000;
    let first = (now / hour + 1) * hour;
    assert!(
        next[1] == json!(first) || next[1] == json!(first + hour),
        "{next:?}"
    );
    let table = ok(path, &["schedules"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "SCHEDULE", "WORKFLOW", "SPEC", "CATCH-UP", "PAUSED", "LAST", "TICK", "NEXT", "TICK"
        ]
    );
    let nightly: Vec<&str> = table.lines().nth(2).unwrap().split_whitespace().collect();
    assert_eq!(
        nightly[..5],
        ["nightly", "report", "every", "3600000ms", "latest"],
        "{table}"
    );

    let paused = json_of(path, &["schedules", "pause", "nightly", "--json"]);
    assert_eq!(
        (&paused["paused"], &paused["next_tick_ms"]),
        (&json!(true), &Value::Null)
    );
    let text = ok(path, &["schedules", "resume", "nightly"]);
    assert!(
        text.starts_with("schedule nightly is running; next tick "),
        "{text}"
    );
    let removed = ok(path, &["schedules", "remove", "morning"]);
    assert!(removed.starts_with("schedule morning removed"), "{removed}");
    let (listed, _) = split(json_of(path, &["schedules", "--json"]));
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["nightly"]);
    assert_eq!(listed[0]["paused"], json!(false));

    for action in ["pause", "resume", "remove"] {
        let out = loops(path, &["schedules", action, "morning"]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.contains("schedule `morning` does not exist"), "{err}");
    }
    // A name no schedule can have is bad input (exit 2), said with the rule it breaks.
    for action in ["pause", "resume", "remove"] {
        let out = loops(path, &["schedules", action, "bad name"]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(
            err.contains("schedule `bad name`: ") && !err.contains("does not exist"),
            "{err}"
        );
    }
}

#[test]
fn schedules_are_listed_paused_resumed_and_removed_in_a_store_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let tokio = tokio::runtime::Runtime::new().unwrap();
    tokio.block_on(async {
        let rt = runtime(&path).await;
        rt.shutdown().await;
    });
    steer(&path, loops_core::now_ms());
    // The process starts again: it registers both anew; `nightly` kept its row.
    tokio.block_on(async {
        let rt = runtime(&path).await;
        let listed = rt.schedules().await.unwrap();
        let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["morning", "nightly"]);
        assert_eq!(listed[0].info.created_ms, T0);
        rt.shutdown().await;
    });
}

#[test]
fn schedules_are_steered_through_the_process_that_holds_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (rt, server): (Runtime, ControlServer) = tokio.block_on(async {
        let rt = runtime(&path).await;
        let server = rt.serve_control_next_to_store().await.unwrap();
        (rt, server)
    });
    // Through the process: its clock (at T0) computes the next ticks.
    steer(&path, T0);
    let listed = tokio.block_on(rt.schedules()).unwrap();
    let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["nightly"]);
    assert!(!listed[0].info.paused);
    tokio.block_on(server.stop());
    tokio.block_on(rt.shutdown());
}
