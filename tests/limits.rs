//! Numbers read from a store at the limit of their type (a seq of `u64::MAX`, an attempt of
//! `u32::MAX`, an event seq of `u64::MAX`): every write that needs the next one is refused
//! with `Error::CounterOverflow` naming the run and the record, nothing is written, and
//! nothing panics.

use std::path::Path;

use loops::{Context, Error, RecordKind, RetryPolicy, RunStatus, Runtime, Workflow};
use redb::{ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "limits")]
enum Climb {
    #[initial]
    #[next(Top)]
    Start,
    #[terminal]
    Top,
}

/// Fails its first attempt (so that the run is left failed, for the test to edit), then
/// moves on.
struct Climber {
    fail: bool,
}

impl ClimbHandler for Climber {
    type Error = std::io::Error;

    async fn start(&self, _ctx: &Context) -> Result<StartNext, Self::Error> {
        if self.fail {
            Err(std::io::Error::other("not yet"))
        } else {
            Ok(StartNext::Top)
        }
    }
}

const RUNS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("runs");
/// The log of store formats 2 and 3 (see loops-core's `store/redb/log.rs`): global sequence
/// → entry.
const LOG: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log");
const STATUS: redb::TableDefinition<(u8, &str, &str), ()> = redb::TableDefinition::new("status");
const INBOX: redb::TableDefinition<(&str, u64), &[u8]> = redb::TableDefinition::new("inbox");

fn code(status: &str) -> u8 {
    match status {
        "running" => 0,
        "failed" => 2,
        other => panic!("status {other}"),
    }
}

/// Where a field of a stored row is, and its width, in store format 3's binary row
/// (loops-core's `store/redb/row.rs`): the head (16 bytes: the run's newest entry and newest
/// transition in the log), the encoding's version (1), the status' code (1: byte 17), the fields
/// present (2), the schema hash (8), then seq (8), attempt (4), attempt base (4).
fn field_at(field: &str) -> (usize, usize) {
    match field {
        "seq" => (28, 8),
        "attempt" => (36, 4),
        "attempt_base" => (40, 4),
        other => panic!("field {other}"),
    }
}

/// Edits the row of `run_id` (status `failed` now) as a foreign tool might: sets `fields`
/// (little-endian, each its field's width), moves the run to `status` in the row and the
/// status index, and, for a new seq, puts the run's record of seq 0 under it (with its own
/// `seq` changed to match).
fn edit(path: &Path, run_id: &str, status: &str, fields: &[(&str, u64)]) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut runs = txn.open_table(RUNS).unwrap();
        let mut row = runs.get(run_id).unwrap().unwrap().value().to_vec();
        let mut last_entry = u64::from_le_bytes(row[..8].try_into().unwrap());
        let mut last_transition = u64::from_le_bytes(row[8..16].try_into().unwrap());
        assert_eq!(row[17], code("failed"), "the run has failed");
        row[17] = code(status);
        for (field, value) in fields {
            let (at, width) = field_at(field);
            row[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
        }
        let seq = u64::from_le_bytes(row[28..36].try_into().unwrap());
        if seq != 0 {
            // The run's only transition is of seq 0: a copy of it at `seq`, appended to the
            // log as loops appends one (kind 1, previous entry, previous transition, seq,
            // run id, record).
            let mut log = txn.open_table(LOG).unwrap();
            let entry = log.get(last_transition).unwrap().unwrap().value().to_vec();
            assert_eq!(entry[0], 1, "a transition");
            let id_len = usize::from(u16::from_le_bytes(entry[25..27].try_into().unwrap()));
            let mut record: serde_json::Value =
                serde_json::from_slice(&entry[27 + id_len..]).unwrap();
            record["seq"] = seq.into();
            let mut new = vec![1u8];
            new.extend_from_slice(&last_entry.to_le_bytes());
            new.extend_from_slice(&last_transition.to_le_bytes());
            new.extend_from_slice(&seq.to_le_bytes());
            new.extend_from_slice(&entry[25..27 + id_len]);
            new.extend_from_slice(&serde_json::to_vec(&record).unwrap());
            let at = log.last().unwrap().unwrap().0.value() + 1;
            log.insert(at, new.as_slice()).unwrap();
            (last_entry, last_transition) = (at, at);
        }
        row[..8].copy_from_slice(&last_entry.to_le_bytes());
        row[8..16].copy_from_slice(&last_transition.to_le_bytes());
        runs.insert(run_id, row.as_slice()).unwrap();
        let mut index = txn.open_table(STATUS).unwrap();
        assert!(index.remove((2, "limits", run_id)).unwrap().is_some());
        index.insert((code(status), "limits", run_id), ()).unwrap();
    }
    txn.commit().unwrap();
}

/// A store with the runs `ids`, each failed after one attempt at `Start`.
async fn failed_runs(path: &Path, ids: &[&str]) {
    let rt = Runtime::builder()
        .retry(RetryPolicy::never())
        .open(path)
        .unwrap();
    for id in ids {
        let err = rt
            .run(id, Climb::Start, &Climber { fail: true })
            .await
            .unwrap_err();
        assert!(matches!(err, Error::RunFailed { .. }), "{err:?}");
    }
}

fn overflow(err: &Error) -> (&str, &RecordKind, u64, &'static str, u64, &'static str) {
    match err {
        Error::CounterOverflow {
            run_id,
            record,
            seq,
            counter,
            value,
            action,
        } => (run_id, record, *seq, counter, *value, action),
        other => panic!("expected CounterOverflow, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn values_at_their_limit_are_refused_with_a_typed_error_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    failed_runs(&path, &["seq", "attempt", "retry", "event"]).await;
    edit(&path, "seq", "running", &[("seq", u64::MAX)]);
    // attempt_base just below: the budget is not used up, so the next attempt needs a number.
    edit(
        &path,
        "attempt",
        "running",
        &[
            ("attempt", u32::MAX.into()),
            ("attempt_base", (u32::MAX - 1).into()),
        ],
    );
    edit(&path, "retry", "failed", &[("attempt", u32::MAX.into())]);
    edit(&path, "event", "running", &[]);
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(INBOX)
            .unwrap()
            .insert(
                ("event", u64::MAX),
                br#"{"name":"e","at_ms":1,"payload":1}"#.as_slice(),
            )
            .unwrap();
        txn.commit().unwrap();
    }

    let rt = Runtime::open(&path).unwrap();
    let go = Climber { fail: false };

    // A transition after seq u64::MAX.
    let err = rt.run("seq", Climb::Start, &go).await.unwrap_err();
    assert_eq!(
        overflow(&err),
        (
            "seq",
            &RecordKind::RunRow,
            u64::MAX,
            "seq",
            u64::MAX,
            "moving to a next state"
        )
    );
    assert_eq!(
        err.to_string(),
        "run `seq`: seq 18446744073709551615 in the run row is the largest it can be, so moving to a next state is not possible"
    );
    let info = rt.run_info("seq").await.unwrap().unwrap();
    assert_eq!(
        (
            info.status,
            info.seq,
            rt.history::<Climb>("seq").await.unwrap().len()
        ),
        (RunStatus::Running, u64::MAX, 2)
    );

    // A new attempt after attempt u32::MAX: refused before the handler runs.
    let err = rt.run("attempt", Climb::Start, &go).await.unwrap_err();
    assert_eq!(
        overflow(&err),
        (
            "attempt",
            &RecordKind::RunRow,
            0,
            "attempt",
            u64::from(u32::MAX),
            "starting a new attempt"
        )
    );
    let info = rt.run_info("attempt").await.unwrap().unwrap();
    assert_eq!(
        (info.status, info.attempt, info.interrupted),
        (RunStatus::Running, u32::MAX, 0)
    );

    // A retry of a run at attempt u32::MAX: refused, the run stays failed.
    let err = rt.retry("retry").await.unwrap_err();
    assert_eq!(
        overflow(&err),
        (
            "retry",
            &RecordKind::RunRow,
            0,
            "attempt",
            u64::from(u32::MAX),
            "retrying"
        )
    );
    let info = rt.run_info("retry").await.unwrap().unwrap();
    assert_eq!(
        (info.status, info.attempt, info.attempt_base),
        (RunStatus::Failed, u32::MAX, 0)
    );

    // An event after event seq u64::MAX.
    let err = rt.send("event", "e", &2).await.unwrap_err();
    assert_eq!(
        overflow(&err),
        (
            "event",
            &RecordKind::Event { name: None },
            u64::MAX,
            "event seq",
            u64::MAX,
            "sending an event"
        )
    );
    let db_events = {
        drop(rt);
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_read().unwrap();
        let inbox = txn.open_table(INBOX).unwrap();
        inbox
            .range(("event", 0)..=("event", u64::MAX))
            .unwrap()
            .count()
    };
    assert_eq!(db_events, 1);
}
