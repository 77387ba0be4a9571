//! A rolling upgrade of the `deliver` example: runs started by the previous release
//! (`--workflow-version 1`, the workflow's version 1) and stopped at every state, then finished
//! by this release (version 2: a review by the model before the pull request). A run that the
//! migration takes is migrated at its state (a migration record of its own, then version 2's
//! states, review included); a run past its tests (maybe approved, maybe pushed) finishes on
//! version 1's kept handler. Every run opens exactly one pull request and makes its two
//! commits once. A run that version 2 started is refused by the previous release, which marks
//! it blocked (`loops runs --status blocked`, `loops show`), and this release then finishes it.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use loops::{RunStatus, SchemaHash, TransitionRecord};
use serde_json::Value;

use crate::common::{
    HOLD_VAR, STOP_VAR, copy_dir, copy_of, deliver_in, demo_at_start, describe, git, loops_json,
    loops_text, parked_at_the_gate,
};

/// The example's own workflow, compiled into this test (by `schema_change`) for its two
/// hashes.
use crate::schema_change::recorded as workflow;

use loops::Workflow as _;

fn v1() -> SchemaHash {
    workflow::v1::Deliver::SCHEMA_HASH.pinned()
}

fn v2() -> SchemaHash {
    workflow::v2::Deliver::SCHEMA_HASH.pinned()
}

/// The example as the previous release (version 1 only), on run `run_id`.
fn previous(workdir: &Path, run_id: &str) -> Command {
    let mut cmd = deliver_in(workdir);
    cmd.args(["--workflow-version", "1", "--run-id", run_id]);
    cmd
}

/// The example as this release, on run `run_id`.
fn current(workdir: &Path, run_id: &str) -> Command {
    let mut cmd = deliver_in(workdir);
    cmd.args(["--run-id", run_id]);
    cmd
}

fn run(mut cmd: Command) -> Output {
    cmd.output().expect("run the example")
}

fn succeeds(cmd: Command, context: &str) -> String {
    let out = run(cmd);
    assert!(out.status.success(), "{context}: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The run's records, read from the store file (no process holds it).
fn records(workdir: &Path, run_id: &str) -> Vec<TransitionRecord> {
    let store = loops::RedbStore::open(workdir.join("deliver.redb")).expect("open the store");
    store.history(run_id).expect("read the history")
}

/// `(seq, state, schema is version 2's, migrated from seq)` of each record.
fn shape(records: &[TransitionRecord]) -> Vec<(u64, String, u32, Option<u64>)> {
    records
        .iter()
        .map(|r| {
            let version = if r.schema == v1() {
                1
            } else if r.schema == v2() {
                2
            } else {
                panic!(
                    "record {} has schema {}, neither version's",
                    r.seq, r.schema
                )
            };
            (r.seq, r.state.clone(), version, r.migrated.map(|m| m.seq))
        })
        .collect()
}

/// The pull requests of the forge, as `(head branch, body)`, by number.
fn pulls(workdir: &Path) -> Vec<(String, String)> {
    let mut pulls: Vec<(u64, String, String)> = std::fs::read_dir(workdir.join("forge/pulls"))
        .expect("forge directory")
        .map(|entry| {
            let text = std::fs::read_to_string(entry.expect("an entry").path()).expect("read");
            let pull: Value = serde_json::from_str(&text).expect("a pull request");
            (
                pull["number"].as_u64().expect("a number"),
                pull["head"].as_str().expect("a head").to_owned(),
                pull["body"].as_str().expect("a body").to_owned(),
            )
        })
        .collect();
    pulls.sort();
    pulls
        .into_iter()
        .map(|(_, head, body)| (head, body))
        .collect()
}

/// The version 1 states of the demo's happy path, by seq.
const V1_PATH: [&str; 7] = [
    "Received", "Planned", "Edited", "Tested", "Edited", "Tested", "PrOpened",
];

/// The records a run stopped by version 1 at the entry of seq `k` has once version 2 finished
/// it, when the migration takes state `V1_PATH[k]`: version 1's records up to `k`, the
/// migration's record at `k + 1` (the same state, version 2's schema, continuing seq `k`),
/// then version 2's states from there, with the review.
fn migrated_path(k: u64) -> Vec<(u64, String, u32, Option<u64>)> {
    let v2_path = [
        "Received", "Planned", "Edited", "Tested", "Edited", "Tested", "Reviewed", "PrOpened",
    ];
    let k_us = k as usize;
    let mut path: Vec<(u64, String, u32, Option<u64>)> = (0..=k_us)
        .map(|i| (i as u64, V1_PATH[i].to_owned(), 1, None))
        .collect();
    path.push((k + 1, V1_PATH[k_us].to_owned(), 2, Some(k)));
    for (i, state) in v2_path.iter().enumerate().skip(k_us + 1) {
        path.push((i as u64 + 1, (*state).to_owned(), 2, None));
    }
    path
}

#[test]
fn runs_of_the_previous_release_finish_on_this_one_by_migration_or_on_version_1() {
    let (_dir, workdir, store) = copy_of(demo_at_start());
    let workdir = &workdir;

    // The previous release starts one run per state of its path and stops it at the entry of
    // that state (`r3` is killed there instead, last: SIGKILL, not a clean stop).
    for k in (0..=5u64).filter(|&k| k != 3) {
        let run_id = format!("r{k}");
        let mut cmd = previous(workdir, &run_id);
        cmd.env(STOP_VAR, k.to_string());
        let out = succeeds(cmd, &run_id);
        assert!(out.contains(&format!("stopping at seq {k}")), "{out}");
    }
    // And one parked at the approval gate (version 1's `Tested`, waiting).
    let mut cmd = previous(workdir, "gate");
    cmd.arg("--auto-approve=false");
    let out = succeeds(cmd, "gate");
    assert!(out.contains("waiting for approval"), "{out}");
    // Killed last, so that the dry run below reads a file its process did not close (one
    // that needs redb's repair: the dry run reads it through a repair made in memory).
    hold_and_kill(workdir, "r3", 3);

    // The dry run of this release says, for each, what it will do, and writes nothing.
    let before = std::fs::read(&store).expect("read the store");
    let mut cmd = deliver_in(workdir);
    cmd.arg("--dry-run");
    let dry = succeeds(cmd, "dry run");
    assert!(
        dry.starts_with("dry run: 8 unfinished or blocked runs in "),
        "{dry}"
    );
    // Of one run, with `--run-id`.
    let mut cmd = current(workdir, "gate");
    cmd.arg("--dry-run");
    let gate = succeeds(cmd, "dry run of one run");
    let gate: Vec<&str> = gate.lines().collect();
    assert_eq!(gate.len(), 2, "{gate:?}");
    assert!(gate[0].starts_with("dry run: run gate in "), "{gate:?}");
    assert!(
        gate[1].trim_start().starts_with("gate (")
            && gate[1].contains("finish on version 1, its kept handler"),
        "{gate:?}"
    );
    assert!(
        std::fs::read(&store).expect("read the store") == before,
        "the dry run changed the store file"
    );
    let route_of = |run: &str| -> String {
        dry.lines()
            .find(|l| l.trim_start().starts_with(&format!("{run} (")))
            .unwrap_or_else(|| panic!("no dry-run line for {run}:\n{dry}"))
            .to_owned()
    };
    for k in 0..=4 {
        let line = route_of(&format!("r{k}"));
        assert!(line.contains("migrate from version 1 to 2"), "{line}");
    }
    for run in ["r5", "gate"] {
        let line = route_of(run);
        assert!(
            line.contains("finish on version 1, its kept handler"),
            "{line}"
        );
    }
    // `deliver-1` (the fixture's, started by this release, stopped at seq 0): driven as is.
    assert!(
        route_of("deliver-1").contains("drive on version 2"),
        "{dry}"
    );

    // This release finishes each.
    for k in 0..=5u64 {
        let run_id = format!("r{k}");
        let out = succeeds(current(workdir, &run_id), &run_id);
        let history = shape(&records(workdir, &run_id));
        if k <= 4 {
            assert!(out.contains("migrating it to version 2"), "{out}");
            assert_eq!(history, migrated_path(k), "{run_id}");
        } else {
            assert!(out.contains("stays on it"), "{out}");
            let expected: Vec<(u64, String, u32, Option<u64>)> = V1_PATH
                .iter()
                .enumerate()
                .map(|(i, s)| (i as u64, (*s).to_owned(), 1, None))
                .collect();
            assert_eq!(history, expected, "{run_id}");
        }
    }
    let mut cmd = current(workdir, "gate");
    cmd.arg("--approve");
    let out = succeeds(cmd, "gate");
    assert!(out.contains("stays on it"), "{out}");

    // One pull request per run; a migrated run's has the model's review, a run finished on
    // version 1 has none.
    let pulls = pulls(workdir);
    let heads: Vec<&str> = pulls.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(
        heads,
        [
            "loops/r0",
            "loops/r1",
            "loops/r2",
            "loops/r3",
            "loops/r4",
            "loops/r5",
            "loops/gate"
        ],
        "one pull request per run, in the order they were finished"
    );
    for (head, body) in &pulls {
        let reviewed = body.contains("The model's review:");
        let migrated = !matches!(head.as_str(), "loops/r5" | "loops/gate");
        assert_eq!(reviewed, migrated, "{head}: {body}");
    }
    // The base and two commits per run on the remote, each made once (their idempotency
    // keys are unique).
    for k in 0..=5 {
        let commits = git(
            &workdir.join("remote.git"),
            &["rev-list", &format!("refs/heads/loops/r{k}")],
        );
        assert_eq!(
            commits.lines().count(),
            3,
            "r{k}: the base commit and two fixes"
        );
    }
    let keys = git(
        &workdir.join("repo"),
        &[
            "log",
            "--all",
            "--format=%(trailers:key=Loops-Idempotency-Key,valueonly)",
        ],
    );
    let mut keys: Vec<&str> = keys.lines().filter(|l| !l.trim().is_empty()).collect();
    let total = keys.len();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(
        (keys.len(), total),
        (14, 14),
        "two commits per run, none twice"
    );

    // The CLI shows the migration records.
    let text = loops_text(&store, &["history", "r2"]);
    let line = text
        .lines()
        .find(|l| l.contains("migrated from schema"))
        .unwrap_or_else(|| panic!("no migration line:\n{text}"));
    assert!(
        line.contains(&format!(
            "migrated from schema {} (version 1) to {} at seq 3 (continues seq 2)",
            v1(),
            v2()
        )),
        "{line}"
    );
    let json = loops_json(&store, &["history", "r2", "--json"]);
    assert_eq!(
        json["transitions"][3]["migrated_from"],
        serde_json::json!({"schema": v1().to_string(), "version": 1, "seq": 2, "accepted": false})
    );
    assert_eq!(json["transitions"][2]["migrated_from"], Value::Null);
}

#[test]
fn the_previous_release_blocks_a_run_of_this_one_which_then_finishes_it() {
    // `deliver-1`, started by this release and stopped at seq 0.
    let (_dir, workdir, store) = copy_of(demo_at_start());
    let workdir = &workdir;

    let out = run(previous(workdir, "deliver-1"));
    assert!(!out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("schema"), "{err}");

    // Blocked, with the reason and the changes, and listed as such.
    let blocked = loops_json(&store, &["runs", "--status", "blocked", "--json"]);
    let blocked = blocked.as_array().expect("an array");
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0]["run_id"], "deliver-1");
    assert_eq!(blocked[0]["status"], "blocked");
    assert_eq!(blocked[0]["blocked"]["schema"], v2().to_string());
    assert_eq!(blocked[0]["blocked"]["resume"], "running");
    let changes = blocked[0]["blocked"]["changes"]
        .as_array()
        .expect("changes");
    assert!(
        changes
            .iter()
            .any(|c| c.as_str().is_some_and(|c| c.contains("Reviewed"))),
        "{changes:?}"
    );
    let shown = loops_text(&store, &["show", "deliver-1"]);
    let reason = blocked[0]["blocked"]["reason"].as_str().expect("a reason");
    assert!(
        shown.contains(&format!("blocked         {reason}")),
        "{shown}"
    );
    assert!(shown.contains("change          "), "{shown}");
    // Refused again, nothing more is written (the same block).
    let before = loops_json(&store, &["show", "deliver-1", "--json"]);
    let _ = run(previous(workdir, "deliver-1"));
    assert_eq!(loops_json(&store, &["show", "deliver-1", "--json"]), before);

    // This release knows the schema: it finishes the run, on version 2.
    let out = succeeds(current(workdir, "deliver-1"), "this release");
    assert!(out.contains("pull request: forge://demo/pulls/1"), "{out}");
    let history = shape(&records(workdir, "deliver-1"));
    let states: Vec<&str> = history.iter().map(|h| h.1.as_str()).collect();
    assert_eq!(
        states,
        [
            "Received", "Planned", "Edited", "Tested", "Edited", "Tested", "Reviewed", "PrOpened"
        ]
    );
    assert!(history.iter().all(|h| h.2 == 2 && h.3.is_none()));
    let done = loops_json(&store, &["runs", "--status", "blocked", "--json"]);
    assert_eq!(done.as_array().map(Vec::len), Some(0));
    assert_eq!(pulls(workdir).len(), 1);
    let info = loops_json(&store, &["show", "deliver-1", "--json"]);
    assert_eq!(info["run"]["status"], RunStatus::Completed.as_str());
    assert_eq!(info["run"]["blocked"], Value::Null);

    // The previous release, given the ended run: it cannot read its result, says so (not
    // "blocked"), and writes nothing.
    let out = run(previous(workdir, "deliver-1"));
    assert!(!out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(
            "error: run deliver-1 has ended under a version this build does not compile"
        ),
        "{err}"
    );
    assert_eq!(loops_json(&store, &["show", "deliver-1", "--json"]), info);
}

/// A run of this release stopped (cleanly) in `Reviewed`, a state the previous release lacks:
/// the previous release says nothing of resuming it, and refuses it in one line, which calls
/// the removal of `Reviewed` breaking for this run and lists the changes once (no WARN line
/// repeats them). This release then resumes it, and says the stopped attempt did not finish.
#[test]
fn the_previous_release_says_once_why_it_blocks_a_run_in_a_state_it_lacks() {
    let (_dir, workdir, store) = copy_of(demo_at_start());
    let workdir = &workdir;
    let mut stop = current(workdir, "deliver-1");
    stop.env(STOP_VAR, "6");
    let out = succeeds(stop, "this release, stopped at seq 6");
    assert!(out.contains("stopping at seq 6"), "{out}");
    // Resumed at its first state: nothing recorded before it is said skipped.
    assert!(
        out.contains(
            "resuming at Received (seq 0; attempt 1 did not finish: the process stopped (or \
             lost the run's lease) while this attempt ran)\n"
        ),
        "{out}"
    );

    let out = run(previous(workdir, "deliver-1"));
    assert!(!out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains("resuming") && !stdout.contains("skipping"),
        "{stdout}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(
            "error: run deliver-1 is blocked: this build cannot drive it, and leaves it as it \
             is for a build that can: "
        ),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("state `Reviewed` removed").count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("state `Reviewed` removed (breaking: ")
            && stderr.contains("this run is in `Reviewed`"),
        "{stderr}"
    );
    let blocked = loops_json(&store, &["runs", "--status", "blocked", "--json"]);
    let changes = blocked[0]["blocked"]["changes"]
        .as_array()
        .expect("changes");
    let reviewed: Vec<&str> = changes
        .iter()
        .filter_map(Value::as_str)
        .filter(|c| c.starts_with("state `Reviewed` removed"))
        .collect();
    assert_eq!(reviewed.len(), 1, "{changes:?}");
    assert!(
        reviewed[0].starts_with("state `Reviewed` removed (breaking: "),
        "{changes:?}"
    );

    let out = succeeds(current(workdir, "deliver-1"), "this release");
    assert!(
        out.contains(
            "resuming at Reviewed (seq 6; attempt 1 did not finish: the process stopped (or \
             lost the run's lease) while this attempt ran)"
        ),
        "{out}"
    );
    assert!(!out.contains("interrupted"), "{out}");
    assert!(out.contains("pull request: forge://demo/pulls/1"), "{out}");
    assert_eq!(pulls(workdir).len(), 1);
}

/// Starts the previous release on `run_id` held at seq `k`, waits for `holding at seq k`, and
/// kills it (SIGKILL).
fn hold_and_kill(workdir: &Path, run_id: &str, k: u64) {
    use std::io::{BufRead as _, BufReader};
    let mut cmd = previous(workdir, run_id);
    cmd.env(HOLD_VAR, k.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("start the example");
    let stdout = child.stdout.take().expect("its stdout");
    let want = format!("holding at seq {k}");
    let held = BufReader::new(stdout)
        .lines()
        .map_while(std::result::Result::ok)
        .any(|line| line == want);
    child.kill().expect("SIGKILL the example");
    child.wait().expect("reap the example");
    assert!(held, "{run_id}: the example never held at seq {k}");
}

/// A run of this release parked at the approval gate (`--auto-approve=false`): the previous
/// release does not say it waits for approval (no approval moves it on that build); it refuses
/// and blocks it in one line, exits with an error, and sends it nothing. This release then
/// approves it: the run is unblocked back to waiting, takes the approval, and opens one pull
/// request.
#[test]
fn the_previous_release_blocks_a_run_of_this_one_parked_at_the_approval_gate() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Which of the run's refusal and the gate's check came first was a race: five tries, each
    // on a fresh copy of the parked run, so that the gate winning would not pass unseen.
    for attempt in 0..5 {
        let workdir = &dir.path().join(format!("work-{attempt}"));
        copy_dir(parked_at_the_gate(), workdir);
        let store = workdir.join("deliver.redb");
        let waiting = loops_json(&store, &["show", "deliver-1", "--json"]);
        assert_eq!(waiting["run"]["status"], RunStatus::Waiting.as_str());

        let out = run(previous(workdir, "deliver-1"));
        assert!(!out.status.success(), "try {attempt}: {}", describe(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stdout.contains("waiting for approval"), "{stdout}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(
                "error: run deliver-1 is blocked: this build cannot drive it, and leaves it as it \
                 is for a build that can: "
            ),
            "{stderr}"
        );
        let blocked = loops_json(&store, &["runs", "--status", "blocked", "--json"]);
        let blocked = blocked.as_array().expect("an array");
        assert_eq!(blocked.len(), 1, "{blocked:?}");
        assert_eq!(blocked[0]["run_id"], "deliver-1");
        assert_eq!(blocked[0]["blocked"]["schema"], v2().to_string());
        assert_eq!(blocked[0]["blocked"]["resume"], "waiting");
        assert!(pulls(workdir).is_empty());
    }

    let workdir = &dir.path().join("work-4");
    let store = workdir.join("deliver.redb");
    // `--approve` through the previous release sends nothing, and says so before the refusal.
    let mut approve = previous(workdir, "deliver-1");
    approve.arg("--approve");
    let out = run(approve);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(
            "note: --approve sends nothing: this build cannot drive run deliver-1 (below); \
             approve it with a build that can\n"
        ),
        "{}",
        describe(&out)
    );
    let history = loops_json(&store, &["history", "deliver-1", "--json"]);
    let events = history["events"].as_array().expect("events");
    assert!(
        events.iter().all(|e| e["name"] != "approve"),
        "no approval sent: {events:?}"
    );
    // Blocked, the run is still the human's: this release without a flag drives it back to
    // the gate and leaves it there (it approved a blocked run, whose status is not
    // `waiting`, by itself).
    let out = succeeds(current(workdir, "deliver-1"), "this release, no flag");
    assert!(
        out.contains(
            "not approving it automatically: it was started with --auto-approve=false \
             (--auto-approve approves it)"
        ),
        "{out}"
    );
    assert!(pulls(workdir).is_empty(), "{out}");
    let info = loops_json(&store, &["show", "deliver-1", "--json"]);
    assert_eq!(info["run"]["status"], RunStatus::Waiting.as_str());
    assert_eq!(info["run"]["blocked"], Value::Null);
    assert_eq!(
        info["run"]["attributes"]["approval"],
        serde_json::json!({"str": "human"})
    );
    let mut approve = current(workdir, "deliver-1");
    approve.arg("--approve");
    let out = succeeds(approve, "this release, approving");
    assert!(out.contains("pull request: forge://demo/pulls/1"), "{out}");
    assert_eq!(pulls(workdir).len(), 1);
    let info = loops_json(&store, &["show", "deliver-1", "--json"]);
    assert_eq!(info["run"]["status"], RunStatus::Completed.as_str());
    assert_eq!(info["run"]["blocked"], Value::Null);
    let states: Vec<String> = shape(&records(workdir, "deliver-1"))
        .into_iter()
        .map(|h| h.1)
        .collect();
    assert_eq!(states.last().map(String::as_str), Some("PrOpened"));
}

/// `--dry-run` over a store that holds no unfinished or blocked run says there is nothing to
/// do (it said "0 unfinished or blocked runs in ...; this build would:", ending with a colon).
#[test]
fn a_dry_run_with_no_run_to_route_says_there_is_nothing_to_do() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("deliver.redb");
    drop(loops::RedbStore::open(&store).expect("create an empty store"));
    let mut cmd = deliver_in(dir.path());
    cmd.arg("--dry-run");
    assert_eq!(
        succeeds(cmd, "dry run"),
        format!(
            "dry run: no unfinished or blocked run in {}: nothing to do\n",
            store.display()
        )
    );
}
