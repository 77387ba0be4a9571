//! The readiness rule (`RunInfo::readiness`) is the same in both stores: a waiting run whose
//! cancellation was asked for needs a driver (which ends it), whatever it waits for, so
//! `claim_ready` hands it out; a waiting run without one waits on.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use loops_core::{RedbStore, RunInfo, RunStatus, SchemaHash};
use loops_core::{Reply, Store, WaitOutcome, Write};

const WF: &str = "wf";

fn info(run_id: &str) -> RunInfo {
    common::new_row(run_id, WF)
}

/// Creates `run_id` and parks it waiting for an event that never comes (no time-out).
async fn park(store: &dyn Store, run_id: &str) {
    let lease = store.acquire(run_id).await.unwrap().expect("free");
    let record = format!(
        r#"{{"seq":0,"state":"A","at_ms":1000,"schema":"{}","payload":{{"A":0}}}}"#,
        SchemaHash::from_u64(7)
    );
    let create = Write::Create {
        info: info(run_id),
        record: record.into_bytes(),
        schema_text: "x",
        attributes: Vec::new(),
    };
    store.write(Some(&lease), create).await.unwrap();
    let wait = Write::Wait {
        run_id: run_id.to_owned(),
        seq: 0,
        attempt: 1,
        step: Some(("wait".to_owned(), 0)),
        event: Some("never".to_owned()),
        until_ms: None,
        at_ms: 1_000,
    };
    let reply = store.write(Some(&lease), wait).await.unwrap();
    assert!(matches!(reply, Reply::Waited(WaitOutcome::Parked, _)));
    store.release(&lease).await.unwrap();
}

async fn a_waiting_run_with_a_pending_cancel_is_claimed(store: &dyn Store) {
    park(store, "asked").await;
    park(store, "left").await;
    let cancel = Write::Cancel {
        run_id: "asked".to_owned(),
        reason: "stop".to_owned(),
        end_now: false,
        at_ms: 2_000,
    };
    let asked = store.write(None, cancel).await.unwrap().into_run("asked");
    let asked = asked.unwrap();
    assert_eq!(
        (asked.status, asked.cancel.as_deref()),
        (RunStatus::Waiting, Some("stop"))
    );
    let claimed: BTreeMap<String, (RunStatus, Option<String>)> = store
        .claim_ready(&[loops_core::ClaimFilter::any(WF)], 10)
        .await
        .unwrap()
        .into_iter()
        .map(|(info, _)| (info.run_id, (info.status, info.cancel)))
        .collect();
    assert_eq!(
        claimed,
        BTreeMap::from([(
            "asked".to_owned(),
            (RunStatus::Waiting, Some("stop".to_owned()))
        )])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_claims_a_waiting_run_with_a_pending_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path().join("store.redb")).unwrap();
    a_waiting_run_with_a_pending_cancel_is_claimed(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claims_a_waiting_run_with_a_pending_cancel() {
    let schema = common::TestSchema::new("ready_cancel").await;
    let store = schema.store(Duration::from_secs(30)).await;
    a_waiting_run_with_a_pending_cancel_is_claimed(&store).await;
}
