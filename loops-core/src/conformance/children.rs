//! The cases of child runs: a child's end wakes its parent in the commit that ends it, and a
//! parent's cancellation cascades to its children in the commit that cancels it.

use crate::error::Error;
use crate::names::CHILD_ENDED;
use crate::record::FailureSource;
use crate::retention::RetentionPolicy;
use crate::row::{OnParentCancel, ParentLink};
use crate::store::{AfterFailure, Lease, RunInfo, RunStatus, Store, WaitOutcome};

use super::factory::Factory;
use super::support::{cancel, fail, failure, ids, info, record, transition};
use super::writes;

/// Creates `run_id` (state `A`, seq 0) as a child of `parent` with `on_cancel`, under a
/// lease of its own; returns the lease.
pub(super) async fn create_child(
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
pub(super) async fn park(store: &dyn Store, l: &Lease, run_id: &str, event: &str) {
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
pub(super) async fn inbox(store: &dyn Store, run_id: &str) -> Vec<(String, String, bool)> {
    store
        .events(run_id)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, e, delivered)| (e.name, e.payload.get().to_owned(), delivered))
        .collect()
}

pub(super) fn ended(child: &str) -> (String, String, bool) {
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

/// `prune_families`: retention keeps or removes a run with its children and grandchildren
/// as one run that ended when the last of them did, each parent listed before its
/// children; a child whose parent (or grandparent) has not ended is kept; a child whose
/// parent is gone is a run of its own.
pub(super) async fn prune_families(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    // n ends at 2,001 ms; o/c (its parent o never existed) at 2,002; t at 2,003, its child
    // t/c and grandchild t/c/g at 2,001; u runs on, its child and grandchild ended.
    let end = |l: Lease, id: &'static str, last: u64| async move {
        for seq in 1..=last {
            transition(store, &l, id, seq, seq == last).await.unwrap();
        }
        store.release(&l).await.unwrap();
    };
    end(super::support::create(store, "n").await, "n", 1).await;
    let o = create_child(store, "o/c", "o", OnParentCancel::Cancel).await;
    end(o, "o/c", 2).await;
    let t = super::support::create(store, "t").await;
    let tc = create_child(store, "t/c", "t", OnParentCancel::Cancel).await;
    let tcg = create_child(store, "t/c/g", "t/c", OnParentCancel::Cancel).await;
    end(tcg, "t/c/g", 1).await;
    end(tc, "t/c", 1).await;
    end(t, "t", 3).await;
    let u = super::support::create(store, "u").await;
    let uc = create_child(store, "u/c", "u", OnParentCancel::Cancel).await;
    let ucg = create_child(store, "u/c/g", "u/c", OnParentCancel::Cancel).await;
    end(ucg, "u/c/g", 1).await;
    end(uc, "u/c", 1).await;

    // The newest family is t's: kept whole, though t/c and t/c/g ended first.
    let newest = RetentionPolicy::default().keep_last(1);
    assert_eq!(
        pruned(store, newest, 10_000, true).await,
        (owned(&["n", "o/c"]), 2, 0, 2 + 3)
    );
    // By age, t's family is as old as t.
    let by_age = RetentionPolicy::older_than(std::time::Duration::ZERO);
    assert_eq!(
        pruned(store, by_age, 2_003, true).await,
        (owned(&["n", "o/c"]), 2, 0, 2 + 3)
    );
    let everything = RetentionPolicy::default().keep_last(0);
    assert_eq!(
        pruned(store, everything.clone(), 10_000, false).await,
        (
            owned(&["n", "o/c", "t", "t/c", "t/c/g"]),
            2,
            0,
            2 + 3 + 4 + 2 + 2
        )
    );
    for gone in ["n", "o/c", "t", "t/c", "t/c/g"] {
        assert!(store.run_info(gone).await.unwrap().is_none(), "{gone}");
        assert!(store.history(gone).await.unwrap().is_empty(), "{gone}");
    }
    for kept in ["u/c", "u/c/g"] {
        let info = store.run_info(kept).await.unwrap().unwrap();
        assert_eq!(info.status, RunStatus::Completed, "{kept}");
    }
    // A prune write naming u's family while u runs (a parent retried after a selection)
    // deletes none of it.
    let write = writes::prune(&["u", "u/c", "u/c/g"]);
    match store.write(None, write).await.unwrap() {
        crate::store::Reply::Pruned { records, run_ids } => {
            assert_eq!((records, run_ids.len()), (0, 0));
        }
        other => panic!("expected Pruned, got {other:?}"),
    }
    assert!(store.run_info("u/c/g").await.unwrap().is_some());
    end(u, "u", 1).await;
    assert_eq!(
        pruned(store, everything.clone(), 10_000, false).await,
        (owned(&["u", "u/c", "u/c/g"]), 0, 0, 2 + 2 + 2)
    );

    // A parent that ended before its child (v: after a join_first, or a cancellation) stays
    // with it; so does one whose failed child `keep_failed` keeps (k), which goes whole
    // without that flag.
    let v = super::support::create(store, "v").await;
    let vc = create_child(store, "v/c", "v", OnParentCancel::Abandon).await;
    end(v, "v", 1).await;
    let k = super::support::create(store, "k").await;
    let kc = create_child(store, "k/c", "k", OnParentCancel::Cancel).await;
    let failed = fail(store, &kc, 0, failure(1, "x"), AfterFailure::GiveUp)
        .await
        .unwrap();
    assert_eq!(failed.status, RunStatus::Failed);
    end(k, "k", 1).await;
    let keep_failed = RetentionPolicy::default().keep_last(0).keep_failed();
    // Both are reported as kept for a child: v for v/c, k for k/c.
    assert_eq!(
        pruned(store, keep_failed, 10_000, false).await,
        (Vec::new(), 0, 2, 0)
    );
    assert_eq!(
        pruned(store, everything.clone(), 10_000, false).await,
        (owned(&["k", "k/c"]), 0, 1, 2 + 1)
    );
    assert!(store.run_info("v").await.unwrap().is_some());
    // A prune write naming v alone keeps it (its child is outside the write: a child a
    // parent retried after the selection started), while v/c runs and after it ended.
    let only_v = || async {
        match store.write(None, writes::prune(&["v"])).await.unwrap() {
            crate::store::Reply::Pruned { records, run_ids } => (records, run_ids),
            other => panic!("expected Pruned, got {other:?}"),
        }
    };
    assert_eq!(only_v().await, (0, Vec::new()));
    end(vc, "v/c", 1).await;
    assert_eq!(only_v().await, (0, Vec::new()));
    assert!(store.run_info("v").await.unwrap().is_some());
    assert_eq!(
        pruned(store, everything.clone(), 10_000, false).await,
        (owned(&["v", "v/c"]), 0, 0, 2 + 2)
    );
}

/// `prune_families`, continued: what counts as kept for a parent. A child whose failed parent
/// `keep_failed` keeps is counted (it was reported as matching nothing); a child held by a
/// parent that runs on is counted only if the policy would remove it otherwise.
pub(super) async fn prune_kept_for_parents(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let end = |l: Lease, id: &'static str| async move {
        transition(store, &l, id, 1, true).await.unwrap();
        store.release(&l).await.unwrap();
    };
    let everything = RetentionPolicy::default().keep_last(0);
    let keep_failed = RetentionPolicy::default().keep_last(0).keep_failed();
    // Under `keep_failed`, a failed parent's child is kept with it; without the flag both go.
    let fp = super::support::create(store, "fp").await;
    let fpc = create_child(store, "fp/c", "fp", OnParentCancel::Cancel).await;
    end(fpc, "fp/c").await;
    fail(store, &fp, 0, failure(1, "x"), AfterFailure::GiveUp)
        .await
        .unwrap();
    assert_eq!(
        pruned(store, keep_failed, 10_000, true).await,
        (Vec::new(), 1, 0, 0)
    );
    assert_eq!(
        pruned(store, everything.clone(), 10_000, false).await,
        (owned(&["fp", "fp/c"]), 0, 0, 1 + 2)
    );

    // A child of a parent that runs on: not counted when it is younger than the policy's age.
    let _y = super::support::create(store, "y").await;
    let yc = create_child(store, "y/c", "y", OnParentCancel::Cancel).await;
    end(yc, "y/c").await;
    let an_hour = RetentionPolicy::older_than(std::time::Duration::from_secs(3_600));
    assert_eq!(
        pruned(store, an_hour, 10_000, true).await,
        (Vec::new(), 0, 0, 0)
    );
    assert_eq!(
        pruned(store, everything, 10_000, true).await,
        (Vec::new(), 1, 0, 0)
    );
}

/// [`prune`](crate::store::prune) of `store` by `policy` at `now_ms`: the runs it removed (or
/// would), the children kept for their parents, the runs kept for their children, and the
/// transition records removed.
async fn pruned(
    store: &dyn Store,
    policy: RetentionPolicy,
    now_ms: u64,
    dry_run: bool,
) -> (Vec<String>, u64, u64, u64) {
    let p = crate::store::prune(store, &policy, now_ms, dry_run)
        .await
        .unwrap();
    (
        p.run_ids,
        p.kept_for_parents,
        p.kept_for_children,
        p.records,
    )
}

fn owned(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| (*id).to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::super::support::{create, fail, failure, retry};
    use crate::retention::RetentionPolicy;
    use crate::store::{AfterFailure, RedbStore, Store, prune_reporting};

    /// A run retried between the selection and its write is left and counted as changed: two
    /// failed runs are selected; after the first write (one run each, as so few runs make),
    /// both are retried (the one already deleted refuses), so the second write finds its run
    /// running and deletes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_retried_after_the_selection_is_counted_as_changed() {
        let store = RedbStore::in_memory().unwrap();
        for id in ["a", "b"] {
            let l = create(&store, id).await;
            fail(&store, &l, 0, failure(1, "x"), AfterFailure::GiveUp)
                .await
                .unwrap();
        }
        let handle = tokio::runtime::Handle::current();
        let retried = std::sync::Mutex::new(Vec::new());
        let everything = RetentionPolicy::default().keep_last(0);
        let pruned = prune_reporting(&store, &everything, 10_000, false, |done, total| {
            assert_eq!(total, 2);
            if done == 1 {
                for id in ["a", "b"] {
                    let r = tokio::task::block_in_place(|| handle.block_on(retry(&store, id)));
                    if r.is_ok() {
                        retried.lock().unwrap().push(id);
                    }
                }
            }
        })
        .await
        .unwrap();
        let retried = retried.into_inner().unwrap();
        assert_eq!(retried.len(), 1, "{retried:?}");
        assert_eq!(pruned.runs, 1);
        assert_eq!(pruned.changed_since_selection, 1);
        assert_eq!(pruned.kept_for_children, 0);
        assert!(
            !pruned.run_ids.contains(&retried[0].to_owned()),
            "{pruned:?}"
        );
        let left = store.run_info(retried[0]).await.unwrap().unwrap();
        assert_eq!(left.status, crate::store::RunStatus::Running);
    }
}
