//! The cases of what a store keeps: retention's pruning, and payloads that read back byte for
//! byte.

use crate::record::now_ms;
use crate::retention::RetentionPolicy;
use crate::store::{self, AfterFailure, Reply, RunStatus};

use super::factory::Factory;
use super::support::{
    create, fail, failure, ids, info, lease, record, send, step, step_record, transition,
};
use super::writes;

pub(super) async fn prune(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    for id in ["c1", "c2", "open"] {
        let l = create(store, id).await;
        step(store, &l, id, 0, "s", 0).await.unwrap();
        send(store, id, "e", "1", Some("k")).await.unwrap();
        fail(store, &l, 0, failure(1, "x"), AfterFailure::Nothing)
            .await
            .unwrap();
        if id != "open" {
            transition(store, &l, id, 1, false).await.unwrap();
            transition(store, &l, id, 2, true).await.unwrap();
        }
    }
    // Only ended runs go; unknown ids are skipped.
    match store
        .write(None, writes::prune(&["open", "ghost"]))
        .await
        .unwrap()
    {
        Reply::Pruned { records, run_ids } => assert_eq!((records, run_ids.len()), (0, 0)),
        other => panic!("expected Pruned, got {other:?}"),
    }
    let dry = store::prune(
        store,
        &RetentionPolicy::default().keep_last(1),
        now_ms(),
        true,
    )
    .await
    .unwrap();
    // Both ended at the same time: the run id breaks the tie, and `c1` is kept.
    assert_eq!(
        (dry.runs, dry.records, dry.run_ids.clone()),
        (1, 3, vec!["c2".to_owned()])
    );
    assert!(store.run_info("c2").await.unwrap().is_some());
    let pruned = store::prune(
        store,
        &RetentionPolicy::default().keep_last(1),
        now_ms(),
        false,
    )
    .await
    .unwrap();
    assert_eq!(pruned, dry);
    assert!(store.run_info("c2").await.unwrap().is_none());
    assert!(store.latest("c2").await.unwrap().is_none());
    assert!(store.history("c2").await.unwrap().is_empty());
    assert!(store.steps("c2", 0).await.unwrap().is_empty());
    assert!(store.failures("c2").await.unwrap().is_empty());
    assert!(store.events("c2").await.unwrap().is_empty());
    assert_eq!(
        ids(&store.list(RunStatus::Completed, None).await.unwrap()),
        vec!["c1"]
    );
    assert_eq!(store.history("c1").await.unwrap().len(), 3);
    assert_eq!(store.failures("c1").await.unwrap().len(), 1);
    assert_eq!(store.history("open").await.unwrap().len(), 1);
    assert_eq!(store.steps("open", 0).await.unwrap().len(), 1);
    assert_eq!(store.events("open").await.unwrap().len(), 1);
    // A pruned id can be used again from scratch (its event keys went with it).
    let l = create(store, "c2").await;
    assert_eq!(
        send(store, "c2", "e", "1", Some("k")).await.unwrap(),
        (0, false)
    );
    store.release(&l).await.unwrap();
}

/// Retention that runs itself: a runtime given a policy and a short interval prunes, while
/// it serves, the ended runs there were when it started and those that end later, and
/// leaves the others.
pub(super) async fn scheduled_retention(f: &dyn Factory) {
    let store = f.store();
    for id in ["c1", "c2", "open"] {
        let l = create(&*store, id).await;
        if id != "open" {
            transition(&*store, &l, id, 1, true).await.unwrap();
        }
        store.release(&l).await.unwrap();
    }
    // Redacting: a factory's store may be a sealing store already (`conformance::Sealed`),
    // which opens every payload itself; this runtime only prunes.
    let runtime = crate::Runtime::builder()
        .read_sealed_redacted()
        .retention(RetentionPolicy::default().keep_last(0))
        .retention_interval(std::time::Duration::from_millis(20))
        .build_shared(store.clone());
    let serving = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.serve(std::time::Duration::from_millis(50)).await })
    };
    let gone = |id: &'static str| {
        let store = store.clone();
        async move {
            while store.run_info(id).await.unwrap().is_some() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    };
    gone("c1").await;
    gone("c2").await;
    // A run that ends later goes at a later prune: the policy runs on a schedule.
    let l = create(&*store, "c3").await;
    transition(&*store, &l, "c3", 1, true).await.unwrap();
    store.release(&l).await.unwrap();
    gone("c3").await;
    assert!(store.history("c3").await.unwrap().is_empty());
    assert_eq!(store.history("open").await.unwrap().len(), 1);
    assert!(store.run_info("open").await.unwrap().is_some());
    runtime.shutdown().await;
    serving.await.unwrap().unwrap();
}

pub(super) async fn payloads_read_back_byte_for_byte(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let l = lease(store, "r").await;
    // Key order, spacing, escapes and number forms as written, not as a JSON database
    // would normalize them.
    let payload = r#"{"Z":{"b":1.50,"a":"é\u00e9\n","n":null, "big":12345678901234567890}}"#;
    store
        .write(
            Some(&l),
            writes::create(info("r"), record(0, "Z", payload), "x"),
        )
        .await
        .unwrap();
    let (_, latest) = store.latest("r").await.unwrap().unwrap();
    assert_eq!(latest.payload.get(), payload);
    let out = r#"[1, 2.0,"\u0000"]"#;
    store
        .write(Some(&l), writes::step("r", 0, "s", 0, step_record(1, out)))
        .await
        .unwrap();
    assert_eq!(store.steps("r", 0).await.unwrap()[0].2.output.get(), out);
    send(store, "r", "e", out, None).await.unwrap();
    assert_eq!(store.events("r").await.unwrap()[0].1.payload.get(), out);
    let long_id = "x".repeat(256);
    let l2 = create(store, &long_id).await;
    assert_eq!(
        store.run_info(&long_id).await.unwrap().unwrap().run_id,
        long_id
    );
    store.release(&l2).await.unwrap();
}

/// The keys that sealed payloads: recorded once each with the first check value given,
/// listed oldest first, seen by every handle, kept by a prune. (No payload is written, so
/// that a sealing store adds no key of its own.)
pub(super) async fn sealing_keys(f: &dyn Factory) {
    let store = f.store();
    let seal = |key: &str, check: Option<&str>, at_ms: u64| store::Write::Seal {
        key: key.to_owned(),
        check: check.map(str::to_owned),
        at_ms,
    };
    assert_eq!(store.sealing_keys().await.unwrap(), Vec::<String>::new());
    for (key, check, at_ms) in [
        ("k1", None, 100),
        ("k0", Some("c0"), 200),
        ("k1", Some("c1"), 300),
        ("k1", Some("other"), 400),
        ("k0", Some("other"), 500),
    ] {
        let reply = store.write(None, seal(key, check, at_ms)).await.unwrap();
        assert!(matches!(reply, Reply::Done), "{reply:?}");
    }
    let both = vec!["k1".to_owned(), "k0".to_owned()];
    assert_eq!(store.sealing_keys().await.unwrap(), both);
    let mut checks = store.sealing_checks().await.unwrap();
    checks.sort();
    let recorded = vec![
        ("k0".to_owned(), "c0".to_owned()),
        ("k1".to_owned(), "c1".to_owned()),
    ];
    assert_eq!(checks, recorded);
    store.write(None, writes::prune(&["ghost"])).await.unwrap();
    assert_eq!(store.sealing_keys().await.unwrap(), both);
    if let Some(second) = f.second().await {
        assert_eq!(second.sealing_keys().await.unwrap(), both);
    }
}
