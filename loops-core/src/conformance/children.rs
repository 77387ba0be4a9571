//! The cases of child runs: a child's end wakes its parent in the commit that ends it, and a
//! parent's cancellation cascades to its children in the commit that cancels it.

use crate::error::Error;
use crate::names::CHILD_ENDED;
use crate::record::FailureSource;
use crate::row::{OnParentCancel, ParentLink};
use crate::store::{AfterFailure, Lease, RunInfo, RunStatus, Store, WaitOutcome};

use super::factory::Factory;
use super::support::{cancel, failure, ids, info, record, transition};
use super::writes;

/// Creates `run_id` (state `A`, seq 0) as a child of `parent` with `on_cancel`, under a
/// lease of its own; returns the lease.
async fn create_child(
    store: &dyn Store,
    run_id: &str,
    parent: &str,
    on_cancel: OnParentCancel,
) -> Lease {
    let l = super::support::lease(store, run_id).await;
    let row = RunInfo {
        parent: Some(ParentLink {
            run_id: parent.to_owned(),
            on_cancel,
        }),
        ..info(run_id)
    };
    let create = writes::create(row, record(0, "A", r#"{"A":{"n":1}}"#), "workflow wf\n");
    store.write(Some(&l), create).await.unwrap();
    l
}

/// Parks `run_id` (its state at seq 0) waiting for the event `event`, at 10,000 ms.
async fn park(store: &dyn Store, l: &Lease, run_id: &str, event: &str) {
    let reply = store
        .write(
            Some(l),
            writes::wait(run_id, 0, 1, Some(("w", 0)), Some(event), None, 10_000),
        )
        .await
        .unwrap();
    match reply {
        crate::store::Reply::Waited(WaitOutcome::Parked, info) => {
            assert_eq!(info.status, RunStatus::Waiting);
        }
        other => panic!("expected the run parked, got {other:?}"),
    }
}

/// The `(name, payload, delivered)` of every event in `run_id`'s inbox.
async fn inbox(store: &dyn Store, run_id: &str) -> Vec<(String, String, bool)> {
    store
        .events(run_id)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, e, delivered)| (e.name, e.payload.get().to_owned(), delivered))
        .collect()
}

fn ended(child: &str) -> (String, String, bool) {
    (
        CHILD_ENDED.to_owned(),
        format!(r#"{{"child":"{child}"}}"#),
        false,
    )
}

pub(super) async fn child_end_wakes_parent(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let lp = super::support::create(store, "p").await;
    let la = create_child(store, "a", "p", OnParentCancel::Cancel).await;
    let lb = create_child(store, "b", "p", OnParentCancel::Abandon).await;
    // Abandoned, so that the parent's cancellation below leaves it to end on its own.
    let lc = create_child(store, "c", "p", OnParentCancel::Abandon).await;
    // The children are found by their parent, with their link, by run id.
    let children = store.children("p").await.unwrap();
    assert_eq!(ids(&children), ["a", "b", "c"]);
    assert_eq!(
        children
            .iter()
            .map(|c| c.parent.as_ref().map(|p| p.on_cancel))
            .collect::<Vec<_>>(),
        [
            Some(OnParentCancel::Cancel),
            Some(OnParentCancel::Abandon),
            Some(OnParentCancel::Abandon)
        ]
    );
    assert_eq!(
        children[1].parent,
        Some(ParentLink {
            run_id: "p".to_owned(),
            on_cancel: OnParentCancel::Abandon
        })
    );
    assert!(store.children("a").await.unwrap().is_empty());
    park(store, &lp, "p", CHILD_ENDED).await;
    // A step of a child, or a transition that does not end it, sends nothing.
    transition(store, &la, "a", 1, false).await.unwrap();
    assert!(inbox(store, "p").await.is_empty());
    // Its terminal transition sends CHILD_ENDED to the parent in the same commit: the parked
    // parent's event is in its inbox (what makes it ready, and claimable on a shared store).
    let a = transition(store, &la, "a", 2, true).await.unwrap();
    assert_eq!(a.status, RunStatus::Completed);
    assert_eq!(inbox(store, "p").await, [ended("a")]);
    assert!(store.has_pending("p", CHILD_ENDED).await.unwrap());
    // A child that fails for good wakes it too.
    let mut given_up = failure(1, "no");
    given_up.source = FailureSource::Handler;
    let b = store
        .write(
            Some(&lb),
            writes::failure("b", 0, given_up, AfterFailure::GiveUp),
        )
        .await
        .unwrap()
        .into_run("b")
        .unwrap();
    assert_eq!(b.status, RunStatus::Failed);
    assert_eq!(inbox(store, "p").await, [ended("a"), ended("b")]);
    // A parent that has ended gets nothing, and the child's end is not refused for it.
    let p = store
        .write(None, writes::cancel("p", "stop", true, 6_000))
        .await
        .unwrap()
        .into_run("p")
        .unwrap();
    assert_eq!(p.status, RunStatus::Cancelled);
    let c = transition(store, &lc, "c", 1, true).await.unwrap();
    assert_eq!(c.status, RunStatus::Completed);
    assert_eq!(inbox(store, "p").await, [ended("a"), ended("b")]);
}

pub(super) async fn cancel_cascades(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    super::support::create(store, "p").await;
    // Children of p: a waiting, b running, c waiting but abandoned, d running with a
    // waiting child e of its own.
    let la = create_child(store, "a", "p", OnParentCancel::Cancel).await;
    park(store, &la, "a", "go").await;
    let lb = create_child(store, "b", "p", OnParentCancel::Cancel).await;
    let lc = create_child(store, "c", "p", OnParentCancel::Abandon).await;
    park(store, &lc, "c", "go").await;
    create_child(store, "d", "p", OnParentCancel::Cancel).await;
    let le = create_child(store, "e", "d", OnParentCancel::Cancel).await;
    park(store, &le, "e", "go").await;
    // One commit: p is asked to stop (its driver ends it); a and e, waiting, end at once; b
    // and d, running, are asked to; c goes on.
    let p = cancel(store, "p", false).await.unwrap();
    assert_eq!(
        (p.status, p.cancel.as_deref()),
        (RunStatus::Running, Some("stop"))
    );
    let row = |id: &'static str| async move { store.run_info(id).await.unwrap().unwrap() };
    let by_p = "parent run `p` was cancelled";
    let by_d = "parent run `d` was cancelled";
    for (id, status, reason) in [
        ("a", RunStatus::Cancelled, Some(by_p)),
        ("b", RunStatus::Running, Some(by_p)),
        ("c", RunStatus::Waiting, None),
        ("d", RunStatus::Running, Some(by_p)),
        ("e", RunStatus::Cancelled, Some(by_d)),
    ] {
        let info = row(id).await;
        assert_eq!(
            (info.status, info.cancel.as_deref(), info.updated_ms),
            (
                status,
                reason,
                if reason.is_some() { 6_000 } else { 10_000 }
            ),
            "child {id}"
        );
    }
    // b, asked to stop while it ran, commits no next state, not even a terminal one: its
    // driver ends it as cancelled where it is.
    match transition(store, &lb, "b", 1, true).await {
        Err(Error::RunCancelled {
            run_id,
            state,
            seq: 0,
            reason,
        }) => assert_eq!(
            (run_id.as_str(), state.as_str(), reason.as_str()),
            ("b", "A", by_p)
        ),
        other => panic!("a transition of a run asked to stop: {other:?}"),
    }
    assert_eq!(
        (row("b").await.status, row("b").await.seq),
        (RunStatus::Running, 0)
    );
    // The children that ended woke their parents: a woke p, e woke d.
    assert_eq!(inbox(store, "p").await, [ended("a")]);
    assert_eq!(inbox(store, "d").await, [ended("e")]);
    assert!(inbox(store, "c").await.is_empty());
    // A second cancellation of p cascades again to the children not ended, and changes
    // nothing for those that ended.
    cancel(store, "p", true).await.unwrap();
    assert_eq!(row("p").await.status, RunStatus::Cancelled);
    assert_eq!(row("b").await.status, RunStatus::Running);
    assert_eq!(row("a").await.updated_ms, 6_000);
    assert_eq!(inbox(store, "p").await, [ended("a")]);
}
