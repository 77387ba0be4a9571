//! The cases of workflow evolution's writes: blocking and unblocking a run, and committing a
//! migration as a record of its own.

use crate::error::Error;
use crate::record::{MigratedFrom, TransitionRecord};
use crate::row::{BlockInfo, OnParentCancel};
use crate::schema::SchemaHash;
use crate::store::{RunInfo, RunStatus, WaitOutcome};

use super::children::{create_child, ended, inbox, park};
use super::factory::Factory;
use super::support::{HASH, WF, create, info, step, step_outputs, transition, wait};
use super::writes;

/// The schema a migration moves the suite's runs to.
const NEW: SchemaHash = SchemaHash::from_u64(0x5678);

// This function is long because it is one scenario: each step needs the state the steps
// before it left (blocked, blocked again, unblocked, waiting, cancelled).
pub(super) async fn block_and_unblock(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let l = create(store, "r").await;
    let blocked = store
        .write(
            Some(&l),
            writes::block("r", HASH, "no version", &["state `A`: gone"], 5_000),
        )
        .await
        .unwrap()
        .into_run("r")
        .unwrap();
    let expected = RunInfo {
        status: RunStatus::Blocked,
        updated_ms: 5_000,
        block: Some(BlockInfo::new(
            "no version",
            vec!["state `A`: gone".to_owned()],
            HASH,
            5_000,
            RunStatus::Running,
        )),
        ..info("r")
    };
    assert_eq!(blocked, expected);
    assert_eq!(store.run_info("r").await.unwrap(), Some(expected.clone()));
    // Listed as blocked, not as running; never claimed.
    let ids = |v: Vec<RunInfo>| v.into_iter().map(|i| i.run_id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.list(RunStatus::Blocked, Some(WF)).await.unwrap()),
        ["r"]
    );
    assert!(
        store
            .list(RunStatus::Running, None)
            .await
            .unwrap()
            .is_empty()
    );
    let filters = [crate::store::ClaimFilter::any(WF)];
    if store.lease_ttl().is_some() {
        store.release(&l).await.unwrap();
    }
    assert!(store.claim_ready(&filters, 10).await.unwrap().is_empty());
    let l = if store.lease_ttl().is_some() {
        super::support::lease(store, "r").await
    } else {
        l
    };
    // Blocked again for the same schema and reason: nothing changes (the row keeps its
    // time); for another reason, the block says the new one and keeps what to resume.
    let again = store
        .write(Some(&l), writes::block("r", HASH, "no version", &[], 6_000))
        .await
        .unwrap()
        .into_run("r")
        .unwrap();
    assert_eq!(again, expected);
    let other = store
        .write(
            Some(&l),
            writes::block("r", HASH, "migration failed", &[], 6_500),
        )
        .await
        .unwrap()
        .into_run("r")
        .unwrap();
    assert_eq!(
        other.block,
        Some(BlockInfo::new(
            "migration failed",
            Vec::new(),
            HASH,
            6_500,
            RunStatus::Running
        ))
    );
    // Driver writes made in the state are fenced while it is blocked.
    let fenced = step(store, &l, "r", 0, "s", 0).await;
    assert!(
        matches!(
            fenced,
            Err(Error::Fenced {
                status: RunStatus::Blocked,
                ..
            })
        ),
        "{fenced:?}"
    );
    assert!(step_outputs(store, "r", 0).await.is_empty());
    // A block for a schema the run no longer has changes nothing.
    let moved = store
        .write(Some(&l), writes::block("r", NEW, "stale", &[], 6_600))
        .await
        .unwrap()
        .into_run("r")
        .unwrap();
    assert_eq!(moved, other);
    // Unblocked: back to running, the block gone; unblocking again changes nothing.
    let back = store
        .write(Some(&l), writes::unblock("r", 7_000))
        .await
        .unwrap()
        .into_run("r")
        .unwrap();
    let running = RunInfo {
        updated_ms: 7_000,
        ..info("r")
    };
    assert_eq!(back, running);
    let same = store
        .write(Some(&l), writes::unblock("r", 7_500))
        .await
        .unwrap()
        .into_run("r")
        .unwrap();
    assert_eq!(same, running);
    assert!(
        store
            .list(RunStatus::Blocked, None)
            .await
            .unwrap()
            .is_empty()
    );
    // A waiting run goes back to waiting, what it waits for kept.
    let (outcome, _) = wait(store, &l, None, Some("go"), None).await.unwrap();
    assert_eq!(outcome, WaitOutcome::Parked);
    store
        .write(Some(&l), writes::block("r", HASH, "no version", &[], 8_000))
        .await
        .unwrap();
    let back = store
        .write(Some(&l), writes::unblock("r", 9_000))
        .await
        .unwrap()
        .into_run("r")
        .unwrap();
    assert_eq!(back.status, RunStatus::Waiting);
    assert_eq!(back.wait.and_then(|w| w.event).as_deref(), Some("go"));
    // A blocked run is cancelled at once (nobody drives it); an ended run cannot be blocked.
    store
        .write(Some(&l), writes::block("r", HASH, "no version", &[], 9_500))
        .await
        .unwrap();
    let cancelled = store
        .write(None, writes::cancel("r", "stop", false, 9_600))
        .await
        .unwrap()
        .into_run("r")
        .unwrap();
    // Ended: not blocked, waiting for nothing (it was blocked while waiting for `go`), in
    // the answer and in the stored row.
    assert_eq!(
        (cancelled.status, &cancelled.block, &cancelled.wait),
        (RunStatus::Cancelled, &None, &None)
    );
    assert_eq!(store.run_info("r").await.unwrap(), Some(cancelled));
    let ended = store
        .write(Some(&l), writes::block("r", HASH, "no version", &[], 9_700))
        .await;
    assert!(matches!(ended, Err(Error::RunEnded { .. })), "{ended:?}");
    let missing = store
        .write(None, writes::block("nope", HASH, "x", &[], 1))
        .await;
    assert!(
        matches!(missing, Err(Error::RunNotFound { .. })),
        "{missing:?}"
    );
}

/// The migration record of `run_id` at `seq`, continuing the state entered at `state_seq`.
fn migration(seq: u64, state_seq: u64, payload: &str) -> TransitionRecord {
    TransitionRecord {
        seq,
        state: "M".to_owned(),
        at_ms: 10_000 + seq,
        schema: NEW,
        payload: serde_json::value::RawValue::from_string(payload.to_owned()).unwrap(),
        migrated: Some(MigratedFrom {
            schema: HASH,
            version: 1,
            seq: state_seq,
            accepted: false,
        }),
    }
}

// This function is long because it is one scenario: the refusals, then the migration, then
// what the migrated state's writes and the next transition do.
pub(super) async fn migrations(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let l = create(store, "r").await;
    transition(store, &l, "r", 1, false).await.unwrap();
    step(store, &l, "r", 1, "s", 0).await.unwrap();
    store
        .write(Some(&l), writes::block("r", HASH, "no version", &[], 5_000))
        .await
        .unwrap();
    // Refused: another seq, a record for another seq, another schema migrated from.
    let fenced = store
        .write(
            Some(&l),
            writes::migrate("r", 0, migration(1, 0, "{}"), "v2"),
        )
        .await;
    assert!(
        matches!(fenced, Err(Error::Fenced { current: 1, .. })),
        "{fenced:?}"
    );
    let wrong_seq = store
        .write(
            Some(&l),
            writes::migrate("r", 1, migration(3, 1, "{}"), "v2"),
        )
        .await;
    assert!(
        matches!(wrong_seq, Err(Error::MigrationRefused { seq: 1, .. })),
        "{wrong_seq:?}"
    );
    let mut other = migration(2, 1, "{}");
    other.migrated = Some(MigratedFrom {
        schema: NEW,
        version: 1,
        seq: 1,
        accepted: false,
    });
    let wrong_from = store
        .write(Some(&l), writes::migrate("r", 1, other, "v2"))
        .await;
    assert!(
        matches!(wrong_from, Err(Error::MigrationRefused { .. })),
        "{wrong_from:?}"
    );
    assert_eq!(store.history("r").await.unwrap().len(), 2);
    // The migration: a record at seq 2, the row in its state and schema, unblocked; the
    // state's steps still under seq 1.
    let payload = r#"{"M": {"n" : 1}}"#;
    let migrated = store
        .write(
            Some(&l),
            writes::migrate("r", 1, migration(2, 1, payload), "workflow wf v2\n"),
        )
        .await
        .unwrap()
        .into_run("r")
        .unwrap();
    let expected = RunInfo {
        seq: 2,
        state: "M".to_owned(),
        schema: NEW,
        entered: Some(1),
        updated_ms: 10_002,
        ..info("r")
    };
    assert_eq!(migrated, expected);
    assert_eq!(migrated.state_seq(), 1);
    assert_eq!(store.run_info("r").await.unwrap(), Some(expected.clone()));
    // Listed by schema (`Store::list_of_schemas`): the migrated run under its new schema
    // only, a run still of the old one under that, by run id, of the status and workflow
    // asked for.
    create(store, "s").await;
    let ids = |v: Vec<RunInfo>| v.into_iter().map(|i| i.run_id).collect::<Vec<_>>();
    for (status, workflow, schemas, expected) in [
        (RunStatus::Running, WF, &[NEW][..], &["r"][..]),
        (RunStatus::Running, WF, &[HASH], &["s"]),
        (RunStatus::Running, WF, &[HASH, NEW], &["r", "s"]),
        (RunStatus::Running, WF, &[], &[]),
        (RunStatus::Waiting, WF, &[HASH, NEW], &[]),
        (RunStatus::Running, "other", &[HASH, NEW], &[]),
    ] {
        assert_eq!(
            ids(store
                .list_of_schemas(status, workflow, schemas)
                .await
                .unwrap()),
            expected,
            "{status} {workflow} {schemas:?}"
        );
    }
    let (row, latest) = store.latest("r").await.unwrap().unwrap();
    assert_eq!(row, expected);
    assert_eq!(
        (
            latest.seq,
            latest.state.as_str(),
            latest.schema,
            latest.payload.get()
        ),
        (2, "M", NEW, payload)
    );
    assert_eq!(latest.migrated, migration(2, 1, "{}").migrated);
    assert_eq!(latest.state_seq(), 1);
    let history = store.history("r").await.unwrap();
    assert_eq!(
        history
            .iter()
            .map(|r| (r.seq, r.schema))
            .collect::<Vec<_>>(),
        [(0, HASH), (1, HASH), (2, NEW)]
    );
    assert!(history[1].migrated.is_none());
    assert_eq!(
        store.schema(NEW).await.unwrap().as_deref(),
        Some("workflow wf v2\n")
    );
    assert_eq!(
        store.schema(HASH).await.unwrap().as_deref(),
        Some("workflow wf\n")
    );
    // The state goes on under seq 1: its steps are there, new ones are written there, and a
    // step under the migration's own seq is fenced.
    assert_eq!(
        step_outputs(store, "r", 1).await,
        [("s".to_owned(), 0, r#""s0""#.to_owned())]
    );
    step(store, &l, "r", 1, "s", 1).await.unwrap();
    let fenced = step(store, &l, "r", 2, "s", 0).await;
    assert!(
        matches!(
            fenced,
            Err(Error::Fenced {
                seq: 2,
                current: 2,
                ..
            })
        ),
        "{fenced:?}"
    );
    assert!(step_outputs(store, "r", 2).await.is_empty());
    // The same migration again is fenced (the run moved on), and changes nothing.
    let again = store
        .write(
            Some(&l),
            writes::migrate("r", 1, migration(2, 1, "{}"), "v2"),
        )
        .await;
    assert!(
        matches!(again, Err(Error::Fenced { current: 2, .. })),
        "{again:?}"
    );
    assert_eq!(store.history("r").await.unwrap().len(), 3);
    // The next transition leaves the migrated state: seq 3, entered there.
    let next = transition(store, &l, "r", 3, false).await.unwrap();
    assert_eq!((next.seq, next.entered, next.state_seq()), (3, None, 3));
    // An acceptance (a version that lists the run's schema in `accepts` takes it as it is)
    // is written as a migration: the same state and data under the accepting schema, the
    // state still the one entered at seq 3; the row carries that schema from then on, and
    // the store keeps its description.
    const ACCEPTING: SchemaHash = SchemaHash::from_u64(0x9abc);
    let current = store.history("r").await.unwrap().pop().unwrap();
    let acceptance = TransitionRecord {
        seq: 4,
        at_ms: 7_000,
        schema: ACCEPTING,
        migrated: Some(MigratedFrom {
            schema: NEW,
            version: 2,
            seq: 3,
            accepted: true,
        }),
        ..current.clone()
    };
    let row = store
        .write(
            Some(&l),
            writes::migrate("r", 3, acceptance.clone(), "workflow wf v3\n"),
        )
        .await
        .unwrap()
        .into_run("r")
        .unwrap();
    assert_eq!(
        (row.seq, row.schema, row.state.as_str(), row.state_seq()),
        (4, ACCEPTING, "S3", 3)
    );
    let latest = store.history("r").await.unwrap().pop().unwrap();
    assert_eq!(
        (latest.migrated, latest.payload.get(), latest.state_seq()),
        (acceptance.migrated, current.payload.get(), 3)
    );
    assert_eq!(
        store.schema(ACCEPTING).await.unwrap().as_deref(),
        Some("workflow wf v3\n")
    );
}

/// A migration into a terminal state (a version whose migration maps the run's state to one
/// of its terminal states): the run ends there as a transition into it ends it, with the
/// same follow-ups. Here a blocked child waiting for an event is migrated: its row is
/// completed, neither waiting nor blocked, in its new state and schema; its parent gets the
/// child's end in its inbox, in the same commit; the run takes no further write.
pub(super) async fn migration_into_a_terminal_state(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    create(store, "p").await;
    let l = create_child(store, "c", "p", OnParentCancel::Cancel).await;
    park(store, &l, "c", "go").await;
    let blocked = store
        .write(Some(&l), writes::block("c", HASH, "no version", &[], 5_000))
        .await
        .unwrap()
        .into_run("c")
        .unwrap();
    assert_eq!(blocked.status, RunStatus::Blocked);
    let payload = r#"{"M":{"gone":true}}"#;
    let ended_row = store
        .write(
            Some(&l),
            writes::migrate_into_terminal("c", 0, migration(1, 0, payload), "workflow wf v2\n"),
        )
        .await
        .unwrap()
        .into_run("c")
        .unwrap();
    let expected = RunInfo {
        seq: 1,
        state: "M".to_owned(),
        schema: NEW,
        status: RunStatus::Completed,
        entered: Some(0),
        updated_ms: 10_001,
        parent: blocked.parent.clone(),
        ..info("c")
    };
    assert_eq!(ended_row, expected);
    assert_eq!(store.run_info("c").await.unwrap(), Some(expected));
    // Listed as completed only.
    for (status, listed) in [
        (RunStatus::Completed, &["c"][..]),
        (RunStatus::Blocked, &[]),
        (RunStatus::Waiting, &[]),
    ] {
        let runs = store.list(status, Some(WF)).await.unwrap();
        let ids: Vec<&str> = runs
            .iter()
            .map(|r| r.run_id.as_str())
            .filter(|id| *id == "c")
            .collect();
        assert_eq!(ids, listed, "{status}");
    }
    // The record, byte for byte, after the state's own.
    let history = store.history("c").await.unwrap();
    assert_eq!(
        history
            .iter()
            .map(|r| (r.seq, r.state.as_str(), r.schema))
            .collect::<Vec<_>>(),
        [(0, "A", HASH), (1, "M", NEW)]
    );
    assert_eq!(history[1].payload.get(), payload);
    assert_eq!(history[1].migrated, migration(1, 0, "{}").migrated);
    // The parent learns of the end as of any child's.
    assert_eq!(inbox(store, "p").await, [ended("c")]);
    // An ended run takes no further write: a transition, the migration again, an event.
    let next = transition(store, &l, "c", 2, false).await;
    assert!(
        matches!(
            next,
            Err(Error::Fenced {
                status: RunStatus::Completed,
                ..
            })
        ),
        "{next:?}"
    );
    let again = store
        .write(
            Some(&l),
            writes::migrate_into_terminal("c", 1, migration(2, 0, "{}"), "v2"),
        )
        .await;
    assert!(
        matches!(
            again,
            Err(Error::Fenced {
                current: 1,
                status: RunStatus::Completed,
                ..
            })
        ),
        "{again:?}"
    );
    let sent = store
        .write(None, writes::send("c", "go", "{}", None, 20_000))
        .await;
    assert!(matches!(sent, Err(Error::RunEnded { .. })), "{sent:?}");
    assert_eq!(store.history("c").await.unwrap().len(), 2);
    assert_eq!(inbox(store, "p").await, [ended("c")]);
}
