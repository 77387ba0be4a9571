//! The `loops` command-line tool on a store the `deliver` example produced: see a run parked
//! at the approval gate, approve it with `loops send`, let the example finish it, and inspect
//! the finished run.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::common::{
    copy_of, deliver_in, describe, loops, loops_json, loops_text, names_in, on_path,
    parked_at_the_gate, poll, run_ids,
};

fn deliver(workdir: &Path, args: &[&str]) -> Output {
    deliver_in(workdir)
        .args(args)
        .output()
        .expect("run the example")
}

#[test]
fn the_cli_sees_steers_and_inspects_a_run_of_the_example() {
    // The example run with `--auto-approve=false`: parked at the approval gate.
    let (_dir, workdir, store) = copy_of(parked_at_the_gate());
    let workdir = &workdir;

    // The run waits at the gate; its one child (the demo's plan has one edit) is done.
    let runs = loops_json(&store, &["runs", "--json"]);
    let runs = runs.as_array().expect("an array of runs");
    let ids: Vec<(&str, &str, &str)> = runs
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().expect("a string");
            (field("run_id"), field("workflow"), field("status"))
        })
        .collect();
    assert_eq!(
        ids,
        [
            ("deliver-1", "deliver", "waiting"),
            ("deliver-1/edit-0", "deliver-edit", "completed")
        ]
    );
    assert_eq!(runs[1]["parent"], "deliver-1");
    assert_eq!(runs[1]["state"], "Applied");
    assert_eq!(runs[0]["run_id"], "deliver-1");
    assert_eq!(runs[0]["workflow"], "deliver");
    assert_eq!(runs[0]["status"], "waiting");
    assert_eq!(runs[0]["state"], "Reviewed");
    assert_eq!(runs[0]["seq"], 6);
    assert_eq!(runs[0]["waiting_for"]["event"], "approve");

    let shown = loops_json(&store, &["show", "deliver-1", "--json"]);
    // The edit child ended before the join read it: its wake-up, never taken, is no event
    // the run waits for at the approval gate.
    assert_eq!(shown["pending_events"], serde_json::json!([]), "{shown}");
    let inbox = loops_json(&store, &["history", "deliver-1", "--json"]);
    assert!(
        inbox["events"]
            .as_array()
            .expect("events")
            .iter()
            .any(|e| e["name"] == "loops:child-ended"),
        "{inbox}"
    );
    assert_eq!(
        shown["payload"]["Reviewed"]["review"]["concerns"],
        serde_json::json!([
            "no test was added or changed: the tests that pass are the ones that were there"
        ])
    );
    assert!(
        shown["schema_description"]
            .as_str()
            .expect("a description")
            .starts_with("workflow deliver version 2 format 1\n")
    );

    let history = loops_json(&store, &["history", "deliver-1", "--json"]);
    let states: Vec<&str> = history["transitions"]
        .as_array()
        .expect("transitions")
        .iter()
        .map(|t| t["state"].as_str().expect("a state"))
        .collect();
    assert_eq!(
        states,
        [
            "Received", "Planned", "Edited", "Tested", "Edited", "Tested", "Reviewed"
        ]
    );

    // A child's id given to the example is refused for what it is (a usage error: ids of
    // that form are the edit runs'), and nothing moves.
    let child = deliver(workdir, &["--run-id", "deliver-1/edit-0"]);
    assert_eq!(child.status.code(), Some(2), "{}", describe(&child));
    let err = String::from_utf8_lossy(&child.stderr);
    assert!(
        err.contains(
            "invalid run id \"deliver-1/edit-0\": ids of the form <RUN_ID>/edit-<N> are those \
             of the child runs that apply a plan's edits (run \"deliver-1\" would start this one)"
        ),
        "{err}"
    );
    assert_eq!(
        loops_json(&store, &["runs", "--json"]),
        serde_json::Value::Array(runs.clone())
    );
    // Nor does retention take the ended child from its waiting parent, and it says why.
    let prune = loops(&store, &["prune", "--keep-last", "0", "--dry-run"]);
    assert!(prune.status.success(), "{}", describe(&prune));
    assert_eq!(
        String::from_utf8_lossy(&prune.stdout),
        "would remove nothing\nwould keep 1 ended child run whose parent has not ended (the \
         parent may still join it); pruned once it has\n"
    );

    // Approve through the CLI while no deliver runs; a bad payload first is refused.
    let bad = loops(&store, &["send", "deliver-1", "approve", "--json", "{by:"]);
    assert!(!bad.status.success());
    assert_eq!(String::from_utf8_lossy(&bad.stderr).lines().count(), 1);
    // An approval that names no one is taken from the inbox and refused by the run.
    let blank = send_approval(&store, r#"{"by":" "}"#);
    assert!(blank.status.success(), "{}", describe(&blank));
    let sent = send_approval(&store, r#"{"by":"cli-user"}"#);
    assert!(sent.status.success(), "{}", describe(&sent));

    // The run sets the blank one aside (its type refuses it), with a warning, and takes the
    // next.
    let out = deliver(workdir, &[]);
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("event set aside: its payload does not decode")
            && stderr.contains(r#"an approval that names no one ("by" is blank) is refused"#),
        "{stderr}"
    );
    assert!(stdout.contains("approved by cli-user"), "{stdout}");

    let runs = loops_json(&store, &["runs", "--json", "--status", "completed"]);
    assert_eq!(runs[0]["state"], "PrOpened");
    assert_eq!(runs[0]["seq"], 7);
    // `loops tree`: the run and its one child per edit, nothing under the child.
    let tree = loops_json(&store, &["tree", "deliver-1", "--json"]);
    assert_eq!(tree["run"]["run_id"], "deliver-1");
    let children = tree["children"].as_array().expect("children");
    assert_eq!(children.len(), 1);
    assert_eq!(children[0]["run"]["run_id"], "deliver-1/edit-0");
    assert_eq!(children[0]["run"]["state"], "Applied");
    assert_eq!(children[0]["children"], serde_json::json!([]));
    let pulls = std::fs::read_dir(workdir.join("forge/pulls"))
        .expect("the forge")
        .count();
    assert_eq!(pulls, 1, "one pull request");
    let pull = std::fs::read_to_string(workdir.join("forge/pulls/1.json")).expect("the pull");
    assert!(pull.contains("Approved by cli-user."), "{pull}");
    let history = loops_json(&store, &["history", "deliver-1", "--json"]);
    assert_eq!(history["transitions"].as_array().map(Vec::len), Some(8));
    // The two approvals (the blank one refused), and the end of the child (the event that
    // wakes a parent in a join).
    let events = history["events"].as_array().expect("events");
    let mut names: Vec<&str> = events
        .iter()
        .map(|e| e["name"].as_str().expect("an event name"))
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["approve", "approve", "loops:child-ended"],
        "{events:?}"
    );
    // The blank one is shown set aside, with why; the one that approved, delivered.
    let approvals: Vec<(&Value, &Value, &Value)> = events
        .iter()
        .filter(|e| e["name"] == "approve")
        .map(|e| (&e["payload"]["by"], &e["delivered"], &e["set_aside"]))
        .collect();
    assert_eq!(
        approvals,
        [
            (
                &Value::from(" "),
                &Value::Bool(true),
                &Value::from(r#"an approval that names no one ("by" is blank) is refused"#)
            ),
            (&Value::from("cli-user"), &Value::Bool(true), &Value::Null),
        ]
    );
    let table = loops_text(&store, &["history", "deliver-1"]);
    assert_eq!(
        table.matches("set aside (not its type)").count(),
        1,
        "{table}"
    );
    // The child ended before the join read it, so no wait took its event; once the run has
    // completed, `show` leaves that wake-up out (it said `pending`, then `not taken`, which
    // read as an event the run missed), and `history` says it was not needed.
    let shown = loops_text(&store, &["show", "deliver-1"]);
    assert!(
        !shown.contains("pending")
            && !shown.contains("not taken")
            && !shown.contains("child-ended"),
        "{shown}"
    );
    let lines = loops_text(&store, &["history", "deliver-1"]);
    let child_ended: Vec<&str> = lines
        .lines()
        .filter(|l| l.contains("{\"child\":\"deliver-1/edit-0\"}"))
        .collect();
    assert_eq!(child_ended.len(), 1, "{lines}");
    assert!(
        child_ended[0].contains(" not needed (join read the child) "),
        "{lines}"
    );
    let pruned = loops_json(
        &store,
        &["prune", "--older-than", "1d", "--dry-run", "--json"],
    );
    assert_eq!(pruned["runs"], 0);
    let checked = loops(&store, &["check"]);
    assert!(checked.status.success(), "{}", describe(&checked));
}

/// A process of the example that is killed if the test ends before it (a failed assertion),
/// so that it does not serve on for ever.
struct Serving(std::process::Child);

impl Drop for Serving {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The example started with `--auto-approve=false --serve` in `workdir`, once its run waits
/// at the approval gate: the process, the rest of its stdout, and what it said until then.
fn serving_at_the_gate(
    workdir: &std::path::Path,
) -> (
    Serving,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    Vec<String>,
) {
    serving_at_the_gate_as(deliver_in(workdir))
}

/// [`serving_at_the_gate`], the example started as `deliver` (in its work directory, with
/// its environment).
fn serving_at_the_gate_as(
    mut deliver: std::process::Command,
) -> (
    Serving,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    Vec<String>,
) {
    use std::io::{BufRead as _, BufReader};
    use std::process::Stdio;

    let mut child = deliver
        .args(["--auto-approve=false", "--serve"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the example");
    let mut lines = BufReader::new(child.stdout.take().expect("its stdout")).lines();
    let mut said = Vec::new();
    loop {
        let Some(line) = lines.next() else {
            let out = child.wait_with_output().expect("the example's output");
            panic!(
                "the example ended before it waited at the gate: {said:?} {}",
                describe(&out)
            );
        };
        let line = line.expect("a line of its stdout");
        let waits = line.contains("waiting for approval, and serving");
        said.push(line);
        if waits {
            return (Serving(child), lines, said);
        }
    }
}

/// `deliver --auto-approve=false --serve`: the process keeps serving while its run waits at
/// the approval gate; `loops runs`, `show` and `send` reach it through its control endpoint
/// (the file is the process's), and the run finishes in that process.
#[test]
fn the_cli_approves_a_run_while_the_example_serves_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = &dir.path().join("work");
    let store = workdir.join("deliver.redb");
    let (mut child, lines, said) = serving_at_the_gate(workdir);
    assert!(
        said.iter().any(|l| l.ends_with(
            "deliver.redb.sock (`loops --store <STORE>` reaches this process through it)"
        )),
        "{said:?}"
    );

    let verbose = loops(&store, &["runs", "--json", "--verbose"]);
    assert!(verbose.status.success(), "{}", describe(&verbose));
    assert!(
        String::from_utf8_lossy(&verbose.stderr).contains("through the control endpoint"),
        "{}",
        describe(&verbose)
    );
    let runs: Value = serde_json::from_slice(&verbose.stdout).expect("JSON on stdout");
    assert_eq!(runs[0]["run_id"], "deliver-1");
    assert_eq!(runs[0]["status"], "waiting");
    assert_eq!(runs[0]["waiting_for"]["event"], "approve");

    let shown = loops(&store, &["show", "deliver-1"]);
    assert!(shown.status.success(), "{}", describe(&shown));
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("event approve"), "{shown}");

    // An approval that names no one: the serving process, which knows the event's type,
    // refuses it at the send (exit 2, nothing written).
    let blank = send_approval(&store, r#"{"by":""}"#);
    assert_eq!(blank.status.code(), Some(2), "{}", describe(&blank));
    assert_eq!(
        String::from_utf8_lossy(&blank.stderr),
        "error: run `deliver-1` (state `Reviewed`, seq 6): event `approve` refused: event \
         `approve`'s payload type refuses the payload: an approval that names no one (\"by\" \
         is blank) is refused\n"
    );

    let sent = send_approval(&store, r#"{"by":"alice"}"#);
    assert!(sent.status.success(), "{}", describe(&sent));
    assert!(
        String::from_utf8_lossy(&sent.stdout).starts_with("sent event `approve` to run deliver-1"),
        "{}",
        describe(&sent)
    );

    // The process takes the approval and finishes the run, then exits.
    let rest: Vec<String> = lines.map(|l| l.expect("a line")).collect();
    let status = child.0.wait().expect("the example ends");
    assert!(status.success(), "{said:?} {rest:?}");
    assert!(
        rest.iter().any(|l| l.starts_with("pull request: ")),
        "{rest:?}"
    );
    assert!(rest.contains(&"  approved by alice".to_owned()), "{rest:?}");
    assert!(!workdir.join("deliver.redb.sock").exists());
    // Now no process holds the file: read directly.
    let done = loops_json(&store, &["show", "deliver-1", "--json"]);
    assert_eq!(done["run"]["status"], "completed");
    assert_eq!(done["run"]["state"], "PrOpened");
    // The one approval, delivered; the refused one was never written.
    let approvals: Vec<(Value, Value)> = approvals(&store, "deliver-1")
        .into_iter()
        .map(|e| (e["payload"].clone(), e["delivered"].clone()))
        .collect();
    assert_eq!(
        approvals,
        [(serde_json::json!({"by": "alice"}), Value::Bool(true))]
    );
}

/// Approvals that name no one, sent to the file while no process runs, are set aside by the
/// gate; `deliver --approve` then approves the run, and does not say it "was approved
/// already, by an approval this build cannot read" (helper-101 F1: a set-aside event was
/// taken for an approval).
#[test]
fn deliver_approve_after_approvals_set_aside_approves() {
    let (_dir, workdir, store) = copy_of(parked_at_the_gate());
    let workdir = &workdir;
    let blank = send_approval(&store, r#"{"by":""}"#);
    assert!(blank.status.success(), "{}", describe(&blank));
    // The gate sets it aside and waits on.
    let waits = deliver(workdir, &[]);
    assert!(waits.status.success(), "{}", describe(&waits));
    let approved = deliver_in(workdir)
        .arg("--approve")
        .env("USER", "carol")
        .output()
        .expect("run deliver --approve");
    assert!(approved.status.success(), "{}", describe(&approved));
    let stdout = String::from_utf8_lossy(&approved.stdout);
    assert!(
        !stdout.contains("approved already") && stdout.contains("  approved by carol\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("pull request: forge://demo/pulls/1"),
        "{stdout}"
    );
}

/// `deliver --approve` while another `deliver --serve` holds the store and waits at the gate:
/// the approval goes through the serving process's control endpoint, which finishes the run.
#[test]
fn deliver_approve_goes_through_the_example_that_serves_the_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = &dir.path().join("work");
    let store = workdir.join("deliver.redb");
    let (mut child, lines, said) = serving_at_the_gate(workdir);
    // What it says to type: this command again with --approve, first.
    let mut lines = lines;
    let hint: Vec<String> = (&mut lines).take(3).map(|l| l.expect("a line")).collect();
    assert_eq!(
        hint,
        [
            format!(
                "  cargo run -p deliver -- --workdir {} --approve",
                workdir.display()
            ),
            "or:".to_owned(),
            format!(
                "  cargo run -p loops-cli -- --store {} send deliver-1 approve --json '{{\"by\":\"you\"}}'",
                store.display()
            ),
        ],
        "{said:?}"
    );

    let approved = deliver_in(workdir)
        .arg("--approve")
        .env("USER", "carol")
        .output()
        .expect("run deliver --approve");
    assert!(approved.status.success(), "{}", describe(&approved));
    let rest: Vec<String> = lines.map(|l| l.expect("a line")).collect();
    let status = child.0.wait().expect("the example ends");
    assert!(status.success(), "{said:?} {rest:?}");
    let pull_request = rest
        .iter()
        .find(|l| l.starts_with("pull request: "))
        .unwrap_or_else(|| panic!("no pull request in {rest:?}"));
    // It follows the run in the serving process to its end, and says the same pull request.
    // It reads the run every 100 ms: the states it sees between the approval and the end
    // depend on when it reads, the last and the outcome do not.
    let followed = String::from_utf8_lossy(&approved.stdout);
    let followed: Vec<&str> = followed.lines().collect();
    assert_eq!(
        followed[0],
        format!(
            "approved run deliver-1 as carol, through the control endpoint {}.sock of the \
             `deliver` serving the store; following the run there until it ends (Ctrl-C stops \
             following only)",
            store.display()
        )
    );
    assert_eq!(
        followed[followed.len() - 2..],
        ["[seq 7] PrOpened (in the serving process)", pull_request],
        "{followed:?}"
    );
    assert!(
        followed[1..followed.len() - 2]
            .iter()
            .all(|l| l.starts_with("[seq 6] Reviewed (in the serving process)")),
        "{followed:?}"
    );
    let done = loops_json(&store, &["show", "deliver-1", "--json"]);
    assert_eq!(done["run"]["status"], "completed");
    let approvals = approvals(&store, "deliver-1");
    assert_eq!(approvals.len(), 1, "{approvals:?}");
    assert_eq!(approvals[0]["payload"], serde_json::json!({"by": "carol"}));
    assert_eq!(approvals[0]["delivered"], true);
}

/// `deliver --approve` that finds the store held by a process whose control endpoint is not
/// there yet (a `deliver --serve` started a moment before holds the store first) looks for
/// the endpoint again and sends the approval through it, where it failed with "already open
/// in another process" (helper-98 F4). Here this test's process holds the store, and serves
/// its endpoint a second after the command started.
#[test]
fn deliver_approve_looks_again_for_the_endpoint_of_the_process_that_holds_the_store() {
    use std::process::Stdio;
    use std::time::Duration;

    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = &dir.path().join("work");
    let store = workdir.join("deliver.redb");
    let parked = deliver(workdir, &["--auto-approve=false"]);
    assert!(parked.status.success(), "{}", describe(&parked));
    let approved = held_and_served_after(&store, Duration::from_secs(1), {
        let workdir = workdir.clone();
        move || {
            deliver_in(&workdir)
                .arg("--approve")
                .env("USER", "dora")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .output()
                .expect("run deliver --approve")
        }
    });
    assert!(approved.status.success(), "{}", describe(&approved));
    assert_eq!(
        String::from_utf8_lossy(&approved.stdout),
        format!(
            "approved run deliver-1 as dora, through the control endpoint {}.sock of the \
             `deliver` serving the store; run deliver-1 takes it when `deliver --run-id \
             deliver-1` drives it, once the serving process has ended (that process drives \
             another run)\n",
            store.display()
        )
    );
    let done = deliver(workdir, &[]);
    assert!(
        String::from_utf8_lossy(&done.stdout).contains("pull request: forge://demo/pulls/1"),
        "{}",
        describe(&done)
    );
    let approvals = approvals(&store, "deliver-1");
    assert_eq!(approvals.len(), 1, "{approvals:?}");
    assert_eq!(approvals[0]["payload"], serde_json::json!({"by": "dora"}));
}

/// `deliver --approve` through the control endpoint of a run another approval decided
/// already (`loops send`, without this command's key) says so, as it does when it approves
/// through the store itself, and sends nothing (helper-130: it said "approved run deliver-1 as
/// carol" while alice's approval was the one the run took; helper-131: then "adds nothing",
/// and sent carol's too).
#[test]
fn deliver_approve_through_the_endpoint_of_a_run_approved_already_says_so() {
    let (_dir, workdir, store) = copy_of(parked_at_the_gate());
    let alice = send_approval(&store, r#"{"by":"alice"}"#);
    assert!(alice.status.success(), "{}", describe(&alice));
    let approved = held_and_served_after(&store, std::time::Duration::ZERO, {
        let workdir = workdir.clone();
        move || {
            deliver_in(&workdir)
                .arg("--approve")
                .env("USER", "carol")
                .output()
                .expect("run deliver --approve")
        }
    });
    assert!(approved.status.success(), "{}", describe(&approved));
    assert_eq!(
        String::from_utf8_lossy(&approved.stdout),
        "note: run deliver-1 was approved already, by alice (event 1, waiting in its inbox for \
         the approval gate): this --approve adds nothing\n"
    );
    let done = deliver(&workdir, &[]);
    let stdout = String::from_utf8_lossy(&done.stdout);
    assert!(
        stdout.contains("  approved by alice\n")
            && stdout.contains("pull request: forge://demo/pulls/1"),
        "{}",
        describe(&done)
    );
    let approvals = approvals(&store, "deliver-1");
    let taken: Vec<(Value, Value)> = approvals
        .iter()
        .map(|a| (a["payload"]["by"].clone(), a["delivered"].clone()))
        .collect();
    assert_eq!(taken, [("alice".into(), true.into())]);
}

/// `deliver --approve` of a run that the process serving the store does not record within
/// 2 s (a `deliver --serve` started a moment ago serves before it records its run, so it is
/// looked for again that long) is refused saying so (helper-104 F2), and sends nothing.
#[test]
fn deliver_approve_of_a_run_not_recorded_within_2_s_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = &dir.path().join("work");
    let store = workdir.join("deliver.redb");
    let done = deliver(workdir, &["--run-id", "first"]);
    assert!(done.status.success(), "{}", describe(&done));
    let approved = held_and_served_after(&store, std::time::Duration::ZERO, {
        let workdir = workdir.clone();
        move || deliver(&workdir, &["--approve"])
    });
    assert_eq!(approved.status.code(), Some(1), "{}", describe(&approved));
    assert_eq!(
        String::from_utf8_lossy(&approved.stderr),
        format!(
            "error: --approve: the process serving {} did not take the approval (looked for \
             it for 2 s: a `deliver --serve` started a moment ago records its run within that): \
             run `deliver-1` does not exist\n",
            store.display()
        )
    );
    assert_eq!(run_ids(&store), ["first", "first/edit-0"]);
}

/// Runs `command` while this test's process holds `store` (as a `deliver --serve` does), and
/// serves the store's control endpoint `after` it started; returns what `command` returned
/// once it has, with the store let go.
fn held_and_served_after<T: Send + 'static>(
    store: &Path,
    after: std::time::Duration,
    command: impl FnOnce() -> T + Send + 'static,
) -> T {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(async {
        let runtime = loops::Runtime::open(store).expect("open the store");
        let command = tokio::task::spawn_blocking(command);
        tokio::time::sleep(after).await;
        let served = runtime.serve_control_next_to_store().await.expect("serve");
        let done = command.await.expect("join");
        served.stop().await;
        runtime.shutdown().await;
        done
    })
}

/// `deliver --approve` whose serving process goes away before it answers the approval
/// (stopping, or killed: here an endpoint that answers the version check, then closes the
/// connection on the send, as a process killed at that moment would) approves the run
/// through the store itself: it says so, and the run, parked at the gate, takes the approval
/// once and opens its pull request (helper-116 F3, F8: it failed, saying whether the process
/// took the approval was unknown).
#[test]
fn deliver_approve_goes_through_the_store_when_the_serving_process_goes_away() {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};
    use std::os::unix::net::UnixListener;

    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = &dir.path().join("work");
    let store = workdir.join("deliver.redb");
    let parked = deliver(workdir, &["--auto-approve=false"]);
    assert!(parked.status.success(), "{}", describe(&parked));
    let socket = workdir.join("deliver.redb.sock");
    let listener = UnixListener::bind(&socket).expect("bind the endpoint");
    let label = store.display().to_string();
    let endpoint = std::thread::spawn(move || {
        // One connection (HTTP/1.1 keeps it), or one per request: the version check is
        // answered, the next request (the send) is read and its connection closed.
        let mut answered = false;
        for conn in listener.incoming() {
            let conn = conn.expect("accept");
            let mut reader = BufReader::new(conn.try_clone().expect("clone"));
            loop {
                let mut length = 0;
                let mut line = String::new();
                let mut first = true;
                let mut path = String::new();
                loop {
                    line.clear();
                    if reader.read_line(&mut line).expect("read") == 0 {
                        break;
                    }
                    if first {
                        path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                        first = false;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(n) = lower.strip_prefix("content-length:") {
                        length = n.trim().parse().expect("a length");
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                if first {
                    break; // closed by the client
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).expect("the body");
                if answered || path != "/v1/version" {
                    drop(reader);
                    drop(conn);
                    return path;
                }
                let version = serde_json::json!({
                    "loops_version": loops::control::wire::LOOPS_VERSION,
                    "protocol": loops::control::wire::PROTOCOL,
                    "store": label,
                })
                .to_string();
                let mut out = conn.try_clone().expect("clone");
                write!(
                    out,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: \
                     {}\r\n\r\n{version}",
                    version.len()
                )
                .expect("answer");
                answered = true;
            }
        }
        String::new()
    });
    let approved = deliver_in(workdir)
        .arg("--approve")
        .env("USER", "erin")
        .output()
        .expect("run deliver --approve");
    assert_eq!(
        endpoint.join().expect("the endpoint"),
        "/v1/runs/deliver-1/events"
    );
    assert!(approved.status.success(), "{}", describe(&approved));
    let stdout = String::from_utf8_lossy(&approved.stdout);
    assert!(
        stdout.starts_with(&format!(
            "note: the `deliver` serving {} went away before it answered (",
            store.display()
        )) && stdout.contains("approving run deliver-1 through the store itself\n")
            && stdout.contains("approved by erin"),
        "{stdout}"
    );
    let done = loops_json(&store, &["show", "deliver-1", "--json"]);
    assert_eq!(done["run"]["status"], "completed");
    let approvals = approvals(&store, "deliver-1");
    assert_eq!(approvals.len(), 1, "{approvals:?}");
    assert_eq!(approvals[0]["payload"], serde_json::json!({"by": "erin"}));
    assert_eq!(names_in(&workdir.join("forge/pulls")), ["1.json"]);
}

/// `deliver --approve` sent while the serving process is still early in its run (before the
/// gate): the approval waits in the run's inbox, and the command follows the run through
/// every state it enters, none left out (it showed the state it read every 100 ms, and
/// missed those entered between two reads: helper-98 F7), to its pull request.
#[test]
fn deliver_approve_sent_early_follows_every_state_to_the_end() {
    use std::process::Stdio;
    use std::time::Duration;

    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = &dir.path().join("work");
    let mut child = Serving(
        deliver_in(workdir)
            .args(["--auto-approve=false", "--serve"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the example"),
    );
    // Sent as soon as the run exists: before, it is refused (no store, no run, or the store
    // held by the process before it serves).
    let mut last = String::new();
    let approved = poll(Duration::from_secs(60), Duration::from_millis(20), || {
        let out = deliver_in(workdir)
            .arg("--approve")
            .env("USER", "carol")
            .output()
            .expect("run deliver --approve");
        last = describe(&out);
        out.status.success().then_some(out)
    })
    .unwrap_or_else(|| panic!("never approved: {last}"));
    let stdout = String::from_utf8_lossy(&approved.stdout);
    let seqs: Vec<u64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("[seq ")?.split_once(']')?.0.parse().ok())
        .collect();
    let first = *seqs.first().unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(seqs, (first..=7).collect::<Vec<_>>(), "{stdout}");
    assert!(
        stdout.ends_with(
            "[seq 7] PrOpened (in the serving process)\npull request: forge://demo/pulls/1\n"
        ),
        "{stdout}"
    );
    assert!(child.0.wait().expect("it ends").success());
}

/// `deliver --approve` follows the run in the serving process (here while it pushes: a `git`
/// wrapper on its `PATH` holds the push). Ctrl-C stops following only, and says so; sent
/// again, the approval is a duplicate and the run is followed again; a serving process that
/// stops answering (SIGSTOP) is said to; when it is killed before the run ends, the command
/// says so and fails, naming where the run stands and the command that goes on with it
/// (before, it had said the process "ends when the run does" and exited 0). That command then
/// finishes the run, with the one approval.
#[cfg(unix)]
#[test]
fn deliver_approve_fails_when_the_serving_example_dies_before_the_run_ends() {
    use std::io::{BufRead as _, BufReader, Read as _};
    use std::os::unix::fs::PermissionsExt as _;
    use std::process::Stdio;
    use std::time::Duration;

    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = &dir.path().join("work");
    let store = workdir.join("deliver.redb");
    let (bin, marks) = (dir.path().join("bin"), dir.path().join("marks"));
    std::fs::create_dir_all(&bin).expect("bin");
    std::fs::create_dir_all(&marks).expect("marks");
    // The push of the run's branch (not the demo's setup's) waits while `hold` exists, and
    // says when it has begun and when it has ended.
    let m = marks.display();
    let script = format!(
        "#!/bin/sh\nheld=\ncase \"$1 $*\" in \"push \"*refs/heads/loops/*) held=1;; esac\n\
         if [ -n \"$held\" ]; then touch '{m}/pushing'; \
         while [ -e '{m}/hold' ]; do sleep 0.05; done; fi\n\
         '{}' \"$@\"\nstatus=$?\n[ -n \"$held\" ] && touch '{m}/pushed'\nexit $status\n",
        on_path("git").display()
    );
    std::fs::write(bin.join("git"), script).expect("write the wrapper");
    std::fs::set_permissions(bin.join("git"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    std::fs::write(marks.join("hold"), "").expect("hold");
    let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").expect("PATH"),
    )))
    .expect("PATH");
    let mut serving = deliver_in(workdir);
    serving.env("PATH", path);
    let (mut child, _lines, said) = serving_at_the_gate_as(serving);

    let approve = || {
        deliver_in(workdir)
            .arg("--approve")
            .env("USER", "carol")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run deliver --approve")
    };
    let ended = |mut approving: std::process::Child| {
        let status = approving.wait().expect("deliver --approve ends");
        let (mut stdout, mut stderr) = (String::new(), String::new());
        // Unless it was read already.
        if let Some(mut out) = approving.stdout.take() {
            out.read_to_string(&mut stdout).expect("stdout");
        }
        let mut err = approving.stderr.take().expect("stderr");
        err.read_to_string(&mut stderr).expect("stderr");
        (status.code(), stdout, stderr)
    };
    let following = "; following the run there until it ends (Ctrl-C stops following only)";

    // Ctrl-C while it follows: it stops following, and says the run goes on there.
    let first = approve();
    let pushing = poll(Duration::from_secs(60), Duration::from_millis(20), || {
        marks.join("pushing").exists().then_some(())
    });
    assert!(pushing.is_some(), "the run never pushed: {said:?}");
    signal("INT", first.id());
    let (code, stdout, stderr) = ended(first);
    assert_eq!(code, Some(130), "{stdout}{stderr}");
    assert_eq!(
        stdout.lines().next(),
        Some(
            format!(
                "approved run deliver-1 as carol, through the control endpoint {}.sock of the \
                 `deliver` serving the store{following}",
                store.display()
            )
            .as_str()
        ),
        "{stdout}"
    );
    assert_eq!(
        stderr,
        "interrupted; stopped following run deliver-1, which goes on in the serving process \
         (--approve again follows it)\n"
    );

    // Again: the approval is a duplicate, and it follows the run again. The serving process
    // stopped (SIGSTOP) is said to, after 10 s; then it is killed.
    let mut second = approve();
    let mut lines = BufReader::new(second.stdout.take().expect("stdout")).lines();
    let first_line = lines.next().expect("a line").expect("a line");
    assert!(
        first_line.starts_with("run deliver-1 was sent an approval already, by carol (event ")
            && first_line.ends_with(&format!(
                "), which the `deliver` serving the store takes once{following}"
            )),
        "{first_line}"
    );
    assert_eq!(
        lines.next().expect("a line").expect("a line"),
        "[seq 6] Reviewed (in the serving process)"
    );
    signal("STOP", child.0.id());
    assert_eq!(
        lines.next().expect("a line").expect("a line"),
        format!(
            "the `deliver` serving {} has not answered for 10 s (stopped? SIGSTOP, a \
             debugger); still following run deliver-1",
            store.display()
        )
    );
    child.0.kill().expect("SIGKILL the serving example");
    child.0.wait().expect("it ends");
    std::fs::remove_file(marks.join("hold")).expect("let the push go");
    assert!(lines.next().is_none(), "nothing more on stdout");
    let (code, _, stderr) = ended(second);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "error: the `deliver` serving {} ended before run deliver-1 did: the run is running \
             at Reviewed (seq 6), with the approval recorded; `cargo run -p deliver -- --workdir \
             {}` goes on with it\n",
            store.display(),
            workdir.display()
        )
    );

    // The push the killed process left running ends; then the command said finishes the run.
    let pushed = poll(Duration::from_secs(60), Duration::from_millis(20), || {
        marks.join("pushed").exists().then_some(())
    });
    assert!(pushed.is_some(), "the left push never ended");
    // The killed process could not remove its socket; the next process that opens the store
    // does.
    let socket = workdir.join("deliver.redb.sock");
    assert!(socket.exists(), "the killed process's socket");
    let finished = deliver_in(workdir).output().expect("run the example");
    assert!(finished.status.success(), "{}", describe(&finished));
    assert!(!socket.exists(), "the stale socket is removed");
    assert!(
        String::from_utf8_lossy(&finished.stdout).contains("pull request: forge://demo/pulls/1"),
        "{}",
        describe(&finished)
    );
    let done = loops_json(&store, &["show", "deliver-1", "--json"]);
    assert_eq!(done["run"]["status"], "completed", "{done}");
    assert_eq!(done["run"]["state"], "PrOpened", "{done}");
    let approvals = approvals(&store, "deliver-1");
    assert_eq!(approvals.len(), 1, "{approvals:?}");
    assert_eq!(approvals[0]["payload"], serde_json::json!({"by": "carol"}));
}

/// `deliver --approve` through a serving process whose store is encrypted (`--key-file`):
/// without the key file it approves and follows the run all the same, and says at the end
/// that the run's result needs the key (it had failed with the library's decryption error,
/// exit 1, after the pull request was opened); with it, it says the pull request.
#[cfg(unix)]
#[test]
fn deliver_approve_of_an_encrypted_store_needs_the_key_only_to_read_the_result() {
    use std::os::unix::fs::PermissionsExt as _;

    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = &dir.path().join("work");
    let key = dir.path().join("k1");
    std::fs::write(&key, format!("k1 {}\n", "07".repeat(32))).expect("write the key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let other_key = dir.path().join("k9");
    std::fs::write(&other_key, format!("k9 {}\n", "09".repeat(32))).expect("write the key");
    std::fs::set_permissions(&other_key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let approve = |run: &str, key_file: Option<&std::path::Path>| {
        let mut approve = deliver_in(workdir);
        approve
            .args(["--run-id", run, "--approve"])
            .env("USER", "carol");
        if let Some(key) = key_file {
            approve.arg("--key-file").arg(key);
        }
        let out = approve.output().expect("run deliver --approve");
        assert!(out.status.success(), "{}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for (run, key_file, last) in [
        (
            "deliver-1",
            None,
            "run deliver-1 ended at PrOpened (seq 7) in the serving process; its result is \
             encrypted with key k1: give the key file with --key-file to read it",
        ),
        (
            "other",
            Some(key.as_path()),
            "pull request: forge://demo/pulls/2",
        ),
        // A key file without the store's key: what opening the result said, after.
        (
            "third",
            Some(other_key.as_path()),
            "run third ended at PrOpened (seq 7) in the serving process; its result is \
             encrypted with key k1: the key file given cannot open it (",
        ),
    ] {
        let mut serving = deliver_in(workdir);
        serving.args(["--run-id", run]).arg("--key-file").arg(&key);
        let (mut child, lines, said) = serving_at_the_gate_as(serving);
        if run == "other" {
            // An approval that names no one, sealed by the CLI (which checks the stored
            // schema only): the serving process opens it and its type refuses it, as in
            // clear (exit 2, nothing written), where it was taken and set aside by the run.
            let store = workdir.join("deliver.redb");
            let key = key.to_str().expect("UTF-8");
            let args = [
                "--key-file",
                key,
                "send",
                run,
                "approve",
                "--json",
                r#"{"by":" "}"#,
            ];
            let blank = loops(&store, &args);
            assert_eq!(blank.status.code(), Some(2), "{}", describe(&blank));
            assert!(
                String::from_utf8_lossy(&blank.stderr).ends_with(
                    "payload type refuses the payload: an approval that names no one (\"by\" \
                     is blank) is refused\n"
                ),
                "{}",
                describe(&blank)
            );
        }
        let followed = approve(run, key_file);
        assert!(
            followed.lines().last().is_some_and(|l| l.starts_with(last)),
            "{followed}"
        );
        let rest: Vec<String> = lines.map(|l| l.expect("a line")).collect();
        assert!(
            child.0.wait().expect("it ends").success(),
            "{said:?} {rest:?}"
        );
    }
}

/// `deliver --run-id other --approve` while a `deliver --serve` of another run holds the
/// store: the serving process drives its own run only, so the command says that `other`
/// takes the approval when `deliver --run-id other` drives it (before, it said the process
/// handed it over, and `other` kept waiting); it then does, once.
#[test]
fn deliver_approve_of_a_run_the_serving_example_does_not_drive_says_so() {
    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = &dir.path().join("work");
    let store = workdir.join("deliver.redb");
    let parked = deliver_in(workdir)
        .args(["--run-id", "other", "--auto-approve=false"])
        .output()
        .expect("run the example");
    assert!(parked.status.success(), "{}", describe(&parked));
    let (mut child, lines, _) = serving_at_the_gate(workdir);
    let approve = |run: &str| {
        let out = deliver_in(workdir)
            .args(["--run-id", run, "--approve"])
            .env("USER", "carol")
            .output()
            .expect("run deliver --approve");
        assert!(out.status.success(), "{}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(
        approve("other"),
        format!(
            "approved run other as carol, through the control endpoint {}.sock of the `deliver` \
             serving the store; run other takes it when `deliver --run-id other` drives it, once \
             the serving process has ended (that process drives another run)\n",
            store.display()
        )
    );
    let other = loops_json(&store, &["show", "other", "--json"]);
    assert_eq!(other["run"]["status"], "waiting", "{other}");
    let followed = approve("deliver-1");
    assert!(
        followed.contains(
            "[seq 7] PrOpened (in the serving process)\npull request: forge://demo/pulls/"
        ),
        "{followed}"
    );
    let rest: Vec<String> = lines.map(|l| l.expect("a line")).collect();
    let status = child.0.wait().expect("the example ends");
    assert!(status.success(), "{rest:?}");
    let resumed = deliver_in(workdir)
        .args(["--run-id", "other"])
        .output()
        .expect("run the example");
    assert!(resumed.status.success(), "{}", describe(&resumed));
    let done = loops_json(&store, &["show", "other", "--json"]);
    assert_eq!(done["run"]["status"], "completed", "{done}");
    let approvals = approvals(&store, "other");
    assert_eq!(approvals.len(), 1, "{approvals:?}");
    assert_eq!(approvals[0]["payload"], serde_json::json!({"by": "carol"}));
}

/// Sends `signal` (`INT`, `STOP`, ...) to the process `pid`.
#[cfg(unix)]
fn signal(signal: &str, pid: u32) {
    let sent = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{signal} {pid}");
}

/// `loops send deliver-1 approve --json JSON` to the store `store` (or the process serving it).
fn send_approval(store: &Path, json: &str) -> Output {
    loops(store, &["send", "deliver-1", "approve", "--json", json])
}

/// The `approve` events of `run`'s history, as `loops history --json` shows them.
fn approvals(store: &std::path::Path, run: &str) -> Vec<Value> {
    let history = loops_json(store, &["history", run, "--json"]);
    history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["name"] == "approve")
        .cloned()
        .collect()
}

/// `deliver --serve` in a work directory whose store's socket path is longer than a Unix
/// socket's may be is refused before anything is made: no work directory, no store, no
/// approval wish (a plain rerun would otherwise go on with what the refused start set up).
#[cfg(unix)]
#[test]
fn serve_with_a_socket_path_too_long_is_refused_before_any_setup() {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().join("d".repeat(40));
    std::fs::create_dir(&base).expect("a directory");
    // Named absolute, and relative to the current directory: short enough as given (its
    // socket's path 88 bytes), too long once made absolute, as the store is opened.
    let long = "w".repeat(70);
    for (given, cwd) in [
        (base.join(&long), None),
        (PathBuf::from(&long), Some(base.as_path())),
    ] {
        let workdir = base.join(&long);
        let mut cmd = deliver_in(&given);
        cmd.args(["--auto-approve=false", "--serve"]);
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        let output = cmd.output().expect("run the example");
        assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
        let socket = workdir.join("deliver.redb.sock");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with(&format!(
                "error: --serve: cannot listen on control endpoint unix:{}: the socket's path is \
                 {} bytes, and a Unix socket's path may have at most",
                socket.display(),
                socket.as_os_str().len()
            )),
            "{given:?}: {stderr}"
        );
        assert!(!workdir.exists(), "{given:?}: the work directory was made");
    }
}
