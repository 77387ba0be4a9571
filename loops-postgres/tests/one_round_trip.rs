//! The one-round-trip commit of a lease holder's writes (docs/postgres.md, "The commit
//! path"): taken by transitions and step records once the store knows the run's row; left,
//! with nothing written, when another writer changed the row or the lease moved, for the
//! two-round-trip path and its exact answer; the writes of many runs that queue together
//! committed in one statement, each guarded on its own; and taken on a store migrated from
//! schema version 8, which had no guard.

mod common;

use std::time::Duration;

use loops::{
    AfterFailure, Error, FailureRecord, FailureSource, Lease, Reply, RunStatus, SchemaHash,
    StepRecord, Store, TransitionRecord, Write,
};
use loops_postgres::{CommitCounts, PgStore};

/// The transition record of `seq` (state `S<seq>`).
fn record(seq: u64) -> Vec<u8> {
    serde_json::to_vec(&TransitionRecord {
        seq,
        state: format!("S{seq}"),
        at_ms: 1_000 + seq,
        schema: SchemaHash::from_u64(7),
        payload: serde_json::value::RawValue::from_string(format!("{seq}")).unwrap(),
        migrated: None,
    })
    .unwrap()
}

fn transition(run_id: &str, seq: u64) -> Write {
    Write::Transition {
        run_id: run_id.to_owned(),
        seq,
        state: format!("S{seq}"),
        record: record(seq),
        terminal: false,
        at_ms: 1_000 + seq,
        hands_over: false,
    }
}

fn step(run_id: &str, seq: u64, occurrence: u32) -> Write {
    let output = format!("\"out-{occurrence}\"");
    Write::Step {
        run_id: run_id.to_owned(),
        seq,
        name: "effect".to_owned(),
        occurrence,
        record: serde_json::to_vec(&StepRecord {
            attempt: 1,
            at_ms: 2_000,
            duration_ms: 0,
            output: serde_json::value::RawValue::from_string(output).unwrap(),
        })
        .unwrap(),
        clear_error_at_ms: None,
    }
}

/// A store of one connection (every write of the test on the same session), whose sessions
/// are named after the schema and `tag`.
async fn store(
    schema: &common::TestSchema,
    tag: &str,
    ttl: Duration,
    one_round_trip: bool,
) -> PgStore {
    PgStore::builder(common::pg_config())
        .schema(&schema.name)
        .application_name(format!("{}-{tag}", schema.name))
        .pool_size(1)
        .lease_ttl(ttl)
        .one_round_trip(one_round_trip)
        .connect()
        .await
        .unwrap()
}

/// Creates run `run_id` under a fresh lease of `store`.
async fn create(store: &PgStore, run_id: &str) -> Lease {
    let lease = store.acquire(run_id).await.unwrap().unwrap();
    let write = Write::Create {
        info: common::new_row(run_id, "w"),
        record: record(0),
        schema_text: "w",
        attributes: Vec::new(),
    };
    store.write(Some(&lease), write).await.unwrap();
    lease
}

/// The run's history as `(seq, state)`.
async fn history(store: &PgStore, run_id: &str) -> Vec<(u64, String)> {
    let records = store.history(run_id).await.unwrap();
    records.into_iter().map(|r| (r.seq, r.state)).collect()
}

/// A cancellation of `run_id`, with reason "stop".
fn cancel(run_id: &str) -> Write {
    Write::Cancel {
        run_id: run_id.into(),
        reason: "stop".into(),
        end_now: false,
        at_ms: 7_000,
    }
}

/// The writes of `store` committed in one round trip, and those that fell back from it.
fn trips(store: &PgStore) -> (u64, u64) {
    let counts: CommitCounts = store.commit_counts();
    (counts.one_round_trip, counts.fell_back)
}

/// The sessions of `store`'s pool that are inside a transaction (none once a write returned).
async fn in_transaction(store: &PgStore) -> i64 {
    let c = store.pool().get().await.unwrap();
    c.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
         AND application_name = current_setting('application_name') \
         AND state LIKE 'idle in transaction%'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_holders_transitions_and_steps_take_one_round_trip() {
    let schema = common::TestSchema::new("one_trip").await;
    let fast = store(&schema, "fast", Duration::from_secs(60), true).await;
    let lease = create(&fast, "r").await;
    // The create reads the row (none) and inserts it: two round trips; every write after it
    // knows the row.
    assert_eq!(trips(&fast), (0, 0));
    for seq in 1..=3 {
        let reply = fast
            .write(Some(&lease), transition("r", seq))
            .await
            .unwrap();
        match reply {
            Reply::Run(info) => {
                assert_eq!((info.seq, info.state.as_str()), (seq, &*format!("S{seq}")))
            }
            other => panic!("{other:?}"),
        }
    }
    for occurrence in 0..2 {
        let reply = fast.write(Some(&lease), step("r", 3, occurrence)).await;
        assert!(matches!(reply, Ok(Reply::Done)), "{reply:?}");
    }
    fast.write(Some(&lease), transition("r", 4)).await.unwrap();
    assert_eq!(trips(&fast), (6, 0));
    // The same writes as the two-round-trip path stores them.
    let slow = store(&schema, "slow", Duration::from_secs(60), false).await;
    let other = create(&slow, "s").await;
    for seq in 1..=3 {
        slow.write(Some(&other), transition("s", seq))
            .await
            .unwrap();
    }
    for occurrence in 0..2 {
        slow.write(Some(&other), step("s", 3, occurrence))
            .await
            .unwrap();
    }
    slow.write(Some(&other), transition("s", 4)).await.unwrap();
    assert_eq!(trips(&slow), (0, 0));
    let (mut a, mut b) = (
        fast.run_info("r").await.unwrap().unwrap(),
        slow.run_info("s").await.unwrap().unwrap(),
    );
    b.run_id = a.run_id.clone();
    a.created_ms = b.created_ms;
    assert_eq!(a, b);
    assert_eq!(
        history(&fast, "r").await,
        (0..=4).map(|s| (s, format!("S{s}"))).collect::<Vec<_>>()
    );
    let steps = |store: PgStore, run: &'static str| async move {
        let steps = store.steps(run, 3).await.unwrap();
        steps
            .into_iter()
            .map(|(name, n, r)| (name, n, r.output.get().to_owned()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        steps(fast.clone(), "r").await,
        steps(slow.clone(), "s").await
    );
    assert_eq!(steps(fast.clone(), "r").await.len(), 2);
    // A step record whose key is taken is refused as on two round trips, with nothing written.
    let taken = fast.write(Some(&lease), step("r", 4, 0)).await;
    assert!(matches!(taken, Ok(Reply::Done)), "{taken:?}");
    let again = fast.write(Some(&lease), step("r", 4, 0)).await;
    assert!(
        matches!(&again, Err(Error::StepExists { run_id, seq: 4, occurrence: 0, .. }) if run_id == "r"),
        "{again:?}"
    );
    // Its guard saw the key taken: nothing written, the connection out of the transaction.
    assert_eq!(trips(&fast), (7, 1));
    assert_eq!(in_transaction(&fast).await, 0);
    assert_eq!(fast.steps("r", 4).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_another_handle_between_two_commits_of_the_holder() {
    let schema = common::TestSchema::new("one_trip_other").await;
    let holder = store(&schema, "holder", Duration::from_secs(60), true).await;
    let other = store(&schema, "other", Duration::from_secs(60), true).await;
    let lease = create(&holder, "r").await;
    holder
        .write(Some(&lease), transition("r", 1))
        .await
        .unwrap();
    assert_eq!(trips(&holder), (1, 0));

    // An event leaves the row as it is: the next transition needs nothing of the inbox and
    // still commits in one round trip; the event stays pending.
    let send = Write::Send {
        run_id: "r".into(),
        name: "go".into(),
        payload: "1".into(),
        key: None,
        at_ms: 5_000,
    };
    other.write(None, send).await.unwrap();
    holder
        .write(Some(&lease), transition("r", 2))
        .await
        .unwrap();
    assert_eq!(trips(&holder), (2, 0));
    let events = holder.events("r").await.unwrap();
    assert_eq!(events.len(), 1);
    assert!(!events[0].2, "the event is still pending");

    // A failure recorded through the other handle (under the same lease) changes the row:
    // the holder's guard sees it, and its transition commits on two round trips, from the
    // row as it is (the error cleared).
    let failure = Write::Failure {
        run_id: "r".into(),
        seq: 2,
        record: FailureRecord {
            attempt: 1,
            at_ms: 6_000,
            source: FailureSource::Handler,
            errors: vec!["boom".into()],
        },
        then: AfterFailure::Nothing,
    };
    other.write(Some(&lease), failure).await.unwrap();
    assert!(holder.run_info("r").await.unwrap().unwrap().error.is_some());
    holder
        .write(Some(&lease), transition("r", 3))
        .await
        .unwrap();
    assert_eq!(trips(&holder), (2, 1));
    let info = holder.run_info("r").await.unwrap().unwrap();
    assert_eq!((info.seq, info.error.is_none()), (3, true));
    assert_eq!(holder.failures("r").await.unwrap().len(), 1);
    // The row it committed is known again: the next one takes one round trip.
    holder
        .write(Some(&lease), transition("r", 4))
        .await
        .unwrap();
    assert_eq!(trips(&holder), (3, 1));

    // A cancellation from the other handle: the holder's next transition falls back, and is
    // refused as on two round trips; nothing is written.
    other.write(None, cancel("r")).await.unwrap();
    let refused = holder.write(Some(&lease), transition("r", 5)).await;
    assert!(
        matches!(&refused, Err(Error::RunCancelled { run_id, seq: 4, reason, .. }) if run_id == "r" && reason == "stop"),
        "{refused:?}"
    );
    assert_eq!(trips(&holder), (3, 2));
    assert_eq!(in_transaction(&holder).await, 0);
    let info = holder.run_info("r").await.unwrap().unwrap();
    assert_eq!(
        (info.seq, info.status, info.cancel.as_deref()),
        (4, RunStatus::Running, Some("stop"))
    );
    let end = Write::EndCancelled {
        run_id: "r".into(),
        at_ms: 8_000,
    };
    holder.write(Some(&lease), end).await.unwrap();
    let info = holder.run_info("r").await.unwrap().unwrap();
    assert_eq!((info.seq, info.status), (4, RunStatus::Cancelled));
    assert_eq!(
        history(&holder, "r").await,
        vec![
            (0, "S0".into()),
            (1, "S1".into()),
            (2, "S2".into()),
            (3, "S3".into()),
            (4, "S4".into())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_over_fences_the_holders_one_round_trip() {
    let schema = common::TestSchema::new("one_trip_fence").await;
    let ttl = Duration::from_millis(300);
    let holder = store(&schema, "holder", ttl, true).await;
    let other = store(&schema, "other", ttl, true).await;
    let lease = create(&holder, "r").await;
    holder
        .write(Some(&lease), transition("r", 1))
        .await
        .unwrap();
    assert_eq!(trips(&holder), (1, 0));
    // The lease lapses; another worker takes the run over and writes nothing yet: the row
    // is the one the holder knows, only the lease moved.
    tokio::time::sleep(ttl * 2).await;
    let taken = other.acquire("r").await.unwrap().expect("the lease lapsed");
    let before = holder.run_info("r").await.unwrap().unwrap();
    for write in [transition("r", 2), step("r", 1, 0)] {
        let fenced = holder.write(Some(&lease), write).await;
        assert!(
            matches!(&fenced, Err(Error::Fenced { run_id, current: 1, status: RunStatus::Running, .. }) if run_id == "r"),
            "{fenced:?}"
        );
    }
    // The first fell back from its guard; the second found nothing remembered.
    assert_eq!(trips(&holder), (1, 1));
    assert_eq!(holder.run_info("r").await.unwrap().unwrap(), before);
    assert_eq!(history(&holder, "r").await.len(), 2);
    assert!(holder.steps("r", 1).await.unwrap().is_empty());
    assert_eq!(in_transaction(&holder).await, 0);
    // The new holder goes on.
    other.write(Some(&taken), transition("r", 2)).await.unwrap();
    other.write(Some(&taken), transition("r", 3)).await.unwrap();
    assert_eq!(trips(&other), (1, 0));
    assert_eq!(
        history(&other, "r").await,
        vec![
            (0, "S0".into()),
            (1, "S1".into()),
            (2, "S2".into()),
            (3, "S3".into())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_migrated_from_version_8_commits_in_one_round_trip() {
    let schema = common::TestSchema::new("one_trip_v8").await;
    let old = store(&schema, "old", Duration::from_secs(60), true).await;
    let lease = create(&old, "r").await;
    old.write(Some(&lease), transition("r", 1)).await.unwrap();
    // The schema as version 8 left it: migrations 9 and 11 only add the guards, 10 a column
    // of the sealing keys.
    let admin = common::admin().await;
    let s = format!("\"{}\"", schema.name);
    admin
        .batch_execute(&format!(
            "DROP FUNCTION {s}.commit_one; DROP FUNCTION {s}.commit_batch; ALTER TABLE {s}.sealing_keys DROP COLUMN key_check; \
             DELETE FROM {s}.migrations WHERE version >= 9"
        ))
        .await
        .unwrap();
    // A store whose guard is gone commits on two round trips.
    old.write(Some(&lease), transition("r", 2)).await.unwrap();
    assert_eq!(trips(&old), (1, 1));
    assert_eq!(in_transaction(&old).await, 0);

    let new = store(&schema, "new", Duration::from_secs(60), true).await;
    let versions: Vec<i32> = admin
        .query(
            &format!("SELECT version FROM {s}.migrations ORDER BY version"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        versions,
        (1..=loops_postgres::SCHEMA_VERSION).collect::<Vec<_>>()
    );
    // The run goes on under its lease, through the new store: the first write learns the
    // row, the others take one round trip.
    for seq in 3..=5 {
        new.write(Some(&lease), transition("r", seq)).await.unwrap();
    }
    assert_eq!(trips(&new), (2, 0));
    // And through the old one again, once the row it knew is stale.
    old.write(Some(&lease), transition("r", 6)).await.unwrap();
    old.write(Some(&lease), transition("r", 7)).await.unwrap();
    assert_eq!(trips(&old), (2, 1));
    assert_eq!(
        history(&new, "r").await,
        (0..=7).map(|s| (s, format!("S{s}"))).collect::<Vec<_>>()
    );
}

/// The pool of the store of the group-commit test: one connection for a write that waits
/// for a lock, one for the others.
const POOL: usize = 2;

/// A write under way, on a task of its own.
type Pending = tokio::task::JoinHandle<loops::Result<Reply>>;

/// Starts a transition to `seq` of each run of `leases` while the store's connections are
/// held (its pool has [`POOL`]), waits until all but the first (which holds the batch,
/// waiting for a connection) have queued, then lets the connections go. Returns the writes,
/// in the order of `leases`.
async fn queue_together(store: &PgStore, leases: &[Lease], seq: u64) -> Vec<Pending> {
    let mut held = Vec::new();
    for _ in 0..POOL {
        held.push(store.pool().get().await.unwrap());
    }
    let writes: Vec<Pending> = leases
        .iter()
        .map(|lease| {
            let (store, lease) = (store.clone(), lease.clone());
            tokio::spawn(async move {
                let write = transition(&lease.run_id, seq);
                store.write(Some(&lease), write).await
            })
        })
        .collect();
    let queued = leases.len() as u64 - 1;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while store.commit_counts().waiting < queued {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writes did not queue"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(held);
    writes
}

/// [`queue_together`], and each write's reply.
async fn queued_together(store: &PgStore, leases: &[Lease], seq: u64) -> Vec<loops::Result<Reply>> {
    let mut replies = Vec::new();
    for write in queue_together(store, leases, seq).await {
        replies.push(write.await.unwrap());
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_many_runs_queued_together_commit_in_one_statement_each_on_its_own_guard() {
    let schema = common::TestSchema::new("one_trip_batch").await;
    let store = PgStore::builder(common::pg_config())
        .schema(&schema.name)
        .application_name(format!("{}-batch", schema.name))
        .pool_size(POOL)
        .connect()
        .await
        .unwrap();
    let other = store_with(&schema, "other").await;
    let ids: Vec<String> = (0..12).map(|i| format!("r{i:02}")).collect();
    let mut leases = Vec::new();
    for id in &ids {
        let lease = create(&store, id).await;
        store.write(Some(&lease), transition(id, 1)).await.unwrap();
        leases.push(lease);
    }
    assert_eq!(trips(&store), (12, 0));
    // Run r05 is cancelled through another handle: its row changed, so its guard fails in
    // the batch and its write alone falls back, to be refused as on two round trips.
    other.write(None, cancel("r05")).await.unwrap();
    let batches = store.commit_counts().batches;
    let replies = queued_together(&store, &leases, 2).await;
    for (id, reply) in ids.iter().zip(&replies) {
        match (id.as_str(), reply) {
            ("r05", Err(Error::RunCancelled { run_id, seq: 1, .. })) if run_id == "r05" => {}
            (_, Ok(Reply::Run(info))) if id != "r05" => {
                assert_eq!((&info.run_id, info.seq, info.state.as_str()), (id, 2, "S2"))
            }
            _ => panic!("{id}: {reply:?}"),
        }
    }
    // The first commits alone, the others in one statement, in which r05's guard fails.
    let counts = store.commit_counts();
    assert_eq!((counts.one_round_trip, counts.fell_back), (23, 1));
    assert_eq!((counts.batches - batches, counts.waiting), (2, 0));
    for id in &ids {
        let expected = if id == "r05" { 1 } else { 2 };
        let states: Vec<_> = (0..=expected).map(|s| (s, format!("S{s}"))).collect();
        assert_eq!(history(&store, id).await, states, "{id}");
        assert_eq!(store.run_info(id).await.unwrap().unwrap().seq, expected);
    }
    assert_eq!(in_transaction(&store).await, 0);

    // A record key taken behind the store's back (the row still at seq 2): that write alone
    // is declined in its statement, with nothing written, and refused on two round trips;
    // the others commit.
    let admin = common::admin().await;
    let s = format!("\"{}\"", schema.name);
    admin
        .execute(
            &format!("INSERT INTO {s}.journal (run_id, seq, record) VALUES ('r07', 3, $1)"),
            &[&String::from_utf8(record(3)).unwrap()],
        )
        .await
        .unwrap();
    let live: Vec<Lease> = leases.into_iter().filter(|l| l.run_id != "r05").collect();
    let batches = store.commit_counts().batches;
    let replies = queued_together(&store, &live, 3).await;
    for (lease, reply) in live.iter().zip(&replies) {
        let id = lease.run_id.as_str();
        match reply {
            Err(Error::SequenceConflict { run_id, seq: 3 }) if id == "r07" && run_id == id => {}
            Ok(Reply::Run(info)) if id != "r07" => {
                assert_eq!((info.seq, info.state.as_str()), (3, "S3"))
            }
            _ => panic!("{id}: {reply:?}"),
        }
    }
    let counts = store.commit_counts();
    assert_eq!((counts.one_round_trip, counts.fell_back), (33, 2));
    assert_eq!(counts.batches - batches, 2);
    let r07 = store.run_info("r07").await.unwrap().unwrap();
    assert_eq!((r07.seq, r07.state.as_str()), (2, "S2"));
    for lease in live.iter().filter(|l| l.run_id != "r07") {
        assert_eq!(store.run_info(&lease.run_id).await.unwrap().unwrap().seq, 3);
        assert_eq!(history(&store, &lease.run_id).await.len(), 4);
    }
    assert_eq!(in_transaction(&store).await, 0);

    // A run's row locked by another transaction: the statement does not wait for it, its
    // write alone is declined and waits on two round trips, and the others commit.
    let live: Vec<Lease> = live.into_iter().filter(|l| l.run_id != "r07").collect();
    let mut locker = common::admin().await;
    let tx = locker.transaction().await.unwrap();
    tx.execute(
        &format!("SELECT 1 FROM {s}.runs WHERE run_id = 'r03' FOR UPDATE"),
        &[],
    )
    .await
    .unwrap();
    let batches = store.commit_counts().batches;
    let mut writes = queue_together(&store, &live, 4).await;
    let r03 = writes.remove(live.iter().position(|l| l.run_id == "r03").unwrap());
    for write in writes {
        let reply = write.await.unwrap();
        assert!(
            matches!(&reply, Ok(Reply::Run(info)) if info.seq == 4),
            "{reply:?}"
        );
    }
    // r03's task counts its fallback when it is next polled, which on a loaded machine may
    // be after the others' replies came back: wait for it (it is declined in any case).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.commit_counts().fell_back < 3 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let counts = store.commit_counts();
    assert_eq!((counts.one_round_trip, counts.fell_back), (42, 3));
    assert_eq!(counts.batches - batches, 2);
    assert!(
        !r03.is_finished(),
        "r03's write waits for the lock on two round trips"
    );
    tx.commit().await.unwrap();
    let reply = r03.await.unwrap();
    assert!(
        matches!(&reply, Ok(Reply::Run(info)) if info.seq == 4),
        "{reply:?}"
    );
    for lease in &live {
        assert_eq!(
            history(&store, &lease.run_id).await.len(),
            5,
            "{}",
            lease.run_id
        );
    }
}

/// A second store of `schema`, whose sessions are named after `tag`.
async fn store_with(schema: &common::TestSchema, tag: &str) -> PgStore {
    store(schema, tag, Duration::from_secs(60), true).await
}
