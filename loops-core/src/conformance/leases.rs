//! The cases of leases and claims: taking, renewing, releasing and losing a lease; writes
//! fenced by a lapsed lease; claiming the runs that need a driver.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Error;
use crate::record::now_ms;
use crate::store::{AfterFailure, ClaimFilter, Lease, Reply, RunInfo, RunStatus, WaitOutcome};

use super::factory::{Factory, Outcome};
use super::support::{
    WF, create, failure, info, lease, record, second, send, step, step_record, transition,
};
use super::writes;

/// Why a case that needs leases that lapse is skipped.
const NO_LAPSE: &str = "the store's leases never lapse (Store::lease_ttl is None)";

pub(super) async fn leases(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let Some(ttl) = store.lease_ttl() else {
        // One process owns the store: every lease is granted, never lapses, and renews.
        let a = lease(store, "r").await;
        let b = lease(store, "r").await;
        assert_eq!((a.expires_ms, b.expires_ms), (None, None));
        assert_eq!(
            store.renew(std::slice::from_ref(&a)).await.unwrap(),
            vec![a.clone()]
        );
        store.release(&a).await.unwrap();
        assert!(f.second().await.is_none());
        return;
    };
    let other = second(f).await;
    let other = &*other;
    let a = lease(store, "r").await;
    assert!(a.token > 0);
    assert!(a.expires_ms.is_some());
    // Another worker cannot take a live lease; this worker takes its own over (a new
    // token: the old one is fenced).
    assert_eq!(other.acquire("r").await.unwrap(), None);
    let a2 = lease(store, "r").await;
    assert!(a2.token > a.token);
    assert_eq!(store.renew(std::slice::from_ref(&a)).await.unwrap(), vec![]);
    let renewed = store.renew(std::slice::from_ref(&a2)).await.unwrap();
    assert_eq!(renewed.len(), 1);
    assert_eq!(
        (renewed[0].run_id.as_str(), renewed[0].token),
        ("r", a2.token)
    );
    assert!(renewed[0].expires_ms >= a2.expires_ms);
    // Released with a stale token: nothing happens; with the current one: free at once.
    store.release(&a).await.unwrap();
    assert_eq!(other.acquire("r").await.unwrap(), None);
    store.release(&a2).await.unwrap();
    let b = other
        .acquire("r")
        .await
        .unwrap()
        .expect("free after release");
    assert!(b.token > a2.token);
    // It lapses: renewal fails, and another worker takes it.
    tokio::time::sleep(ttl + ttl / 2).await;
    assert_eq!(other.renew(std::slice::from_ref(&b)).await.unwrap(), vec![]);
    let c = lease(store, "r").await;
    assert!(c.token > b.token);
    assert_eq!(other.acquire("r").await.unwrap(), None);
    // A renewal moves the expiry on (the server's clock has moved on meanwhile).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let renewed = store.renew(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(renewed.len(), 1);
    assert!(renewed[0].expires_ms > c.expires_ms, "{renewed:?} {c:?}");
    assert_eq!(other.acquire("r").await.unwrap(), None);
    // Several at once; only the live ones come back.
    let d = lease(store, "s").await;
    let renewed = store
        .renew(&[c.clone(), d.clone(), b.clone()])
        .await
        .unwrap();
    let mut got: Vec<(String, u64)> = renewed.into_iter().map(|l| (l.run_id, l.token)).collect();
    got.sort();
    assert_eq!(
        got,
        vec![("r".to_owned(), c.token), ("s".to_owned(), d.token)]
    );
}

pub(super) async fn fenced_writes_leave_no_trace(f: &dyn Factory) -> Outcome {
    let store = f.store();
    let store = &*store;
    let Some(ttl) = store.lease_ttl() else {
        // One process owns the store: the file lock is the fence; leases are not checked.
        return Outcome::Skipped(NO_LAPSE);
    };
    let other = second(f).await;
    let other = &*other;
    let old = create(store, "r").await;
    // The lease lapses and another worker takes the run over.
    tokio::time::sleep(ttl + ttl / 2).await;
    let new = other.acquire("r").await.unwrap().expect("lapsed");
    let before = (
        store.run_info("r").await.unwrap(),
        store.history("r").await.unwrap().len(),
        store.steps("r", 0).await.unwrap().len(),
        store.failures("r").await.unwrap().len(),
    );
    let fenced = |r: Result<Reply, Error>| {
        assert!(
            matches!(&r, Err(Error::Fenced { run_id, current: 0, status: RunStatus::Running, .. }) if run_id == "r"),
            "{r:?}"
        );
    };
    let every_write = || {
        vec![
            writes::transition("r", 1, "S1", record(1, "S1", "1"), false, 1),
            writes::step("r", 0, "s", 0, step_record(1, "1")),
            writes::failure("r", 0, failure(1, "x"), AfterFailure::GiveUp),
            writes::begin_attempt("r", 0, 1, 10, 1),
            writes::wait("r", 0, 1, Some(("loops:wait:e", 0)), Some("e"), None, 1),
            writes::wake("r", 0, 1),
            writes::end_cancelled("r", 1),
            writes::create(info("r"), record(0, "A", "0"), "x"),
        ]
    };
    for write in every_write() {
        fenced(store.write(Some(&old), write).await);
    }
    // A lease of another run does not fence this one either.
    let foreign = lease(store, "elsewhere").await;
    fenced(
        store
            .write(
                Some(&foreign),
                writes::step("r", 0, "s", 0, step_record(1, "1")),
            )
            .await,
    );
    let after = (
        store.run_info("r").await.unwrap(),
        store.history("r").await.unwrap().len(),
        store.steps("r", 0).await.unwrap().len(),
        store.failures("r").await.unwrap().len(),
    );
    assert_eq!(before, after);
    // The new holder writes.
    assert!(matches!(
        step(other, &new, "r", 0, "s", 0).await,
        Ok(Reply::Done)
    ));
    assert_eq!(transition(other, &new, "r", 1, false).await.unwrap().seq, 1);
    // A create under a lapsed lease of a run that does not exist yet is fenced too.
    let l = lease(store, "young").await;
    tokio::time::sleep(ttl + ttl / 2).await;
    other.acquire("young").await.unwrap().expect("lapsed");
    match store
        .write(
            Some(&l),
            writes::create(info("young"), record(0, "A", "0"), "x"),
        )
        .await
    {
        Err(Error::Fenced { run_id, seq: 0, .. }) => assert_eq!(run_id, "young"),
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(store.run_info("young").await.unwrap().is_none());
    Outcome::Passed
}

pub(super) async fn claim_ready(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let wfs = vec![ClaimFilter::any(WF)];
    // Running, waiting for an event (none yet), sleeping until a time that passed,
    // ended, and of another workflow.
    for id in ["run1", "run2", "evt", "slept", "done"] {
        let l = create(store, id).await;
        store.release(&l).await.unwrap();
    }
    let l = lease(store, "other");
    let l = l.await;
    store
        .write(
            Some(&l),
            writes::create(
                RunInfo {
                    workflow: "other".into(),
                    ..info("other")
                },
                record(0, "A", "0"),
                "x",
            ),
        )
        .await
        .unwrap();
    store.release(&l).await.unwrap();
    let park = |id: &'static str, event: Option<&'static str>, until: Option<u64>| async move {
        let l = lease(store, id).await;
        let reply = store
            .write(Some(&l), writes::wait(id, 0, 1, None, event, until, 1_000))
            .await
            .unwrap();
        assert!(matches!(reply, Reply::Waited(WaitOutcome::Parked, _)));
        store.release(&l).await.unwrap();
    };
    park("evt", Some("go"), None).await;
    park("slept", None, Some(now_ms() + 1_000)).await;
    let l = lease(store, "done").await;
    transition(store, &l, "done", 1, true).await.unwrap();
    store.release(&l).await.unwrap();

    // The leases claimed here are kept alive by renewal, as a worker's runtime does.
    let held = Arc::new(Mutex::new(Vec::<Lease>::new()));
    let claim = |v: Vec<(RunInfo, Lease)>| -> BTreeSet<String> {
        for (info, lease) in &v {
            assert_eq!(info.run_id, lease.run_id);
            held.lock().unwrap().push(lease.clone());
        }
        v.into_iter().map(|(i, _)| i.run_id).collect()
    };
    let set = |ids: &[&str]| -> BTreeSet<String> { ids.iter().map(|s| (*s).to_owned()).collect() };
    let shared = store.lease_ttl().is_some();
    // The limit is respected.
    assert_eq!(claim(store.claim_ready(&wfs, 1).await.unwrap()).len(), 1);
    if shared {
        // The run claimed above is held; the other running run is still ready.
        assert_eq!(claim(store.claim_ready(&wfs, 10).await.unwrap()).len(), 1);
        assert!(store.claim_ready(&wfs, 10).await.unwrap().is_empty());
    } else {
        assert_eq!(
            claim(store.claim_ready(&wfs, 10).await.unwrap()),
            set(&["run1", "run2"])
        );
    }
    let renewer = {
        let store = f.store();
        let held = Arc::clone(&held);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let leases = held.lock().unwrap().clone();
                let _ = store.renew(&leases).await;
            }
        })
    };
    // An event arrives, a time passes: those runs become ready.
    send(store, "evt", "go", "1", None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let got = claim(store.claim_ready(&wfs, 10).await.unwrap());
    if shared {
        assert_eq!(got, set(&["evt", "slept"]));
        let other = second(f).await;
        assert!(other.claim_ready(&wfs, 10).await.unwrap().is_empty());
        let all = vec![ClaimFilter::any(WF), ClaimFilter::any("other")];
        assert_eq!(
            claim(other.claim_ready(&all, 10).await.unwrap()),
            set(&["other"])
        );
    } else {
        assert_eq!(got, set(&["evt", "run1", "run2", "slept"]));
    }
    renewer.abort();
    assert!(store.claim_ready(&[], 10).await.unwrap().is_empty());
}
