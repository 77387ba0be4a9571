//! The cases of run attributes: set at creation and by a run's driver, replaced, found
//! through the index by equality and range and combined with the other filters, refused
//! when invalid or fenced, and removed with their run.

use crate::attribute::{AttributeFilter, AttributeValue, Attributes, RunFilter};
use crate::error::Error;
use crate::store::{self, Reply, RunInfo, RunStatus, Store};

use super::factory::Factory;
use super::support::{WF, create, info, lease, record, transition};
use super::writes;

/// The attributes `pairs`, as a store reads them back.
fn attrs(pairs: &[(&str, AttributeValue)]) -> Attributes {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

/// The run ids and attributes `found`, in order.
fn found(found: &[(RunInfo, Attributes)]) -> Vec<(&str, &Attributes)> {
    found
        .iter()
        .map(|(info, a)| (info.run_id.as_str(), a))
        .collect()
}

/// The run ids `filter` selects on `store`.
async fn search(store: &dyn Store, filter: &RunFilter) -> Vec<String> {
    store
        .search(filter)
        .await
        .unwrap()
        .into_iter()
        .map(|(info, _)| info.run_id)
        .collect()
}

fn str(s: &str) -> AttributeValue {
    AttributeValue::Str(s.to_owned())
}

/// A filter on the integer `n` from `lo` to `hi`.
fn range(lo: i64, hi: i64) -> RunFilter {
    RunFilter::new().where_attribute(AttributeFilter::int_range("n", lo..=hi))
}

/// A filter on `repo = acme/api`.
fn api() -> RunFilter {
    RunFilter::new().attribute("repo", "acme/api")
}

pub(super) async fn attributes_search(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let lc = seeded(store).await;
    found_by_value(store).await;
    replaced(store).await;
    combined(store, &lc).await;
    pruned(store).await;
}

/// Runs "a" and "b", with attributes from their creation, and "c", with attributes from its
/// driver; returns the lease of "c".
async fn seeded(store: &dyn Store) -> crate::store::Lease {
    // "a" and "b" get attributes at their creation, "c" from its driver afterwards.
    for (id, repo, n) in [("a", "acme/api", 3), ("b", "acme/web", 7)] {
        let l = lease(store, id).await;
        let reply = store
            .write(
                Some(&l),
                writes::create_with(
                    info(id),
                    record(0, "A", r#"{"A":{"n":1}}"#),
                    "workflow wf\n",
                    vec![
                        ("repo".to_owned(), str(repo)),
                        ("n".to_owned(), AttributeValue::Int(n)),
                    ],
                ),
            )
            .await
            .unwrap();
        assert_eq!(reply.into_run(id).unwrap(), info(id));
    }
    let lc = create(store, "c").await;
    assert_eq!(store.attributes("c").await.unwrap(), Attributes::new());
    let set = store
        .write(
            Some(&lc),
            writes::set_attributes(
                "c",
                0,
                vec![
                    ("repo".to_owned(), str("acme/api")),
                    ("n".to_owned(), AttributeValue::Int(12)),
                    ("due".to_owned(), AttributeValue::Time(5_000)),
                ],
            ),
        )
        .await
        .unwrap();
    assert!(matches!(set, Reply::Done), "{set:?}");
    // The row is unchanged by attributes.
    assert_eq!(store.run_info("c").await.unwrap(), Some(info("c")));
    assert_eq!(
        store.attributes("a").await.unwrap(),
        attrs(&[("n", AttributeValue::Int(3)), ("repo", str("acme/api"))])
    );
    assert_eq!(
        store.attributes("c").await.unwrap(),
        attrs(&[
            ("due", AttributeValue::Time(5_000)),
            ("n", AttributeValue::Int(12)),
            ("repo", str("acme/api")),
        ])
    );
    assert_eq!(store.attributes("ghost").await.unwrap(), Attributes::new());
    lc
}

/// Equality, with every attribute of each run found, by run id; ranges.
async fn found_by_value(store: &dyn Store) {
    let by_repo = store
        .search(&RunFilter::new().attribute("repo", "acme/api"))
        .await
        .unwrap();
    let c_attrs = store.attributes("c").await.unwrap();
    let a_attrs = store.attributes("a").await.unwrap();
    assert_eq!(found(&by_repo), vec![("a", &a_attrs), ("c", &c_attrs)]);
    assert_eq!(by_repo[0].0, info("a"));
    // A prefix, another type, a missing key: nothing.
    for filter in [
        RunFilter::new().attribute("repo", "acme"),
        RunFilter::new().attribute("n", "3"),
        RunFilter::new().attribute("owner", "acme/api"),
    ] {
        assert_eq!(
            search(store, &filter).await,
            Vec::<String>::new(),
            "{filter:?}"
        );
    }
    // Ranges, both ends included.
    assert_eq!(search(store, &range(3, 7)).await, ["a", "b"]);
    assert_eq!(search(store, &range(4, 12)).await, ["b", "c"]);
    assert_eq!(search(store, &range(-5, 2)).await, Vec::<String>::new());
    let due = RunFilter::new().where_attribute(AttributeFilter::time_range("due", 0..=5_000));
    assert_eq!(search(store, &due).await, ["c"]);
}

/// Setting a key again replaces its value (and its index entry); the same value again
/// leaves one entry.
async fn replaced(store: &dyn Store) {
    let la = lease(store, "a").await;
    for _ in 0..2 {
        store
            .write(
                Some(&la),
                writes::set_attributes("a", 0, vec![("n".to_owned(), AttributeValue::Int(5))]),
            )
            .await
            .unwrap();
    }
    assert_eq!(
        store.attributes("a").await.unwrap(),
        attrs(&[("n", AttributeValue::Int(5)), ("repo", str("acme/api"))])
    );
    assert_eq!(
        search(store, &RunFilter::new().attribute("n", 3)).await,
        Vec::<String>::new()
    );
    assert_eq!(
        search(store, &RunFilter::new().attribute("n", 5)).await,
        ["a"]
    );
    assert_eq!(search(store, &range(5, 5)).await, ["a"]);
}

/// Combined with status, workflow, last change and a second attribute.
async fn combined(store: &dyn Store, lc: &crate::store::Lease) {
    transition(store, lc, "c", 1, true).await.unwrap();
    assert_eq!(
        search(store, &api().status(RunStatus::Running)).await,
        ["a"]
    );
    assert_eq!(
        search(store, &api().status(RunStatus::Completed)).await,
        ["c"]
    );
    assert_eq!(
        search(
            store,
            &api()
                .status(RunStatus::Completed)
                .status(RunStatus::Running)
        )
        .await,
        ["a", "c"]
    );
    assert_eq!(search(store, &api().workflow(WF)).await, ["a", "c"]);
    assert_eq!(
        search(store, &api().workflow("other")).await,
        Vec::<String>::new()
    );
    let mut changed = api();
    changed.updated_from_ms = Some(2_000);
    assert_eq!(search(store, &changed).await, ["c"]);
    changed.updated_from_ms = None;
    changed.updated_before_ms = Some(2_000);
    assert_eq!(search(store, &changed).await, ["a"]);
    assert_eq!(
        search(
            store,
            &api().where_attribute(AttributeFilter::int_range("n", 10..=20))
        )
        .await,
        ["c"]
    );
    // Without an attribute filter, the store's search selects nothing; `find_runs` lists by
    // status instead, with each run's attributes.
    assert!(store.search(&RunFilter::new()).await.unwrap().is_empty());
    let all = store::find_runs(store, &RunFilter::new().status(RunStatus::Running))
        .await
        .unwrap();
    let b_attrs = store.attributes("b").await.unwrap();
    let a_attrs = store.attributes("a").await.unwrap();
    assert_eq!(found(&all), vec![("a", &a_attrs), ("b", &b_attrs)]);
}

/// A pruned run's attributes go with it.
async fn pruned(store: &dyn Store) {
    store.write(None, writes::prune(&["c"])).await.unwrap();
    assert_eq!(store.attributes("c").await.unwrap(), Attributes::new());
    assert_eq!(search(store, &api()).await, ["a"]);
    assert_eq!(
        search(
            store,
            &RunFilter::new().attribute("due", AttributeValue::Time(5_000))
        )
        .await,
        Vec::<String>::new()
    );
    // The id used again starts with no attributes.
    create(store, "c").await;
    assert_eq!(store.attributes("c").await.unwrap(), Attributes::new());
}

pub(super) async fn attributes_refused(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let l = create(store, "r").await;
    transition(store, &l, "r", 1, false).await.unwrap();
    let set = |seq, key: &str, value: AttributeValue| {
        writes::set_attributes("r", seq, vec![(key.to_owned(), value)])
    };
    // Invalid keys and values, named with the run, its state and seq; nothing written.
    for (key, value) in [
        ("", AttributeValue::Int(1)),
        ("has space", AttributeValue::Int(1)),
        ("k", str(&"x".repeat(513))),
    ] {
        let key_len = key.len();
        match store.write(Some(&l), set(1, key, value)).await {
            Err(Error::InvalidAttribute {
                run_id,
                state,
                seq,
                key,
                ..
            }) => assert_eq!(
                (run_id.as_str(), state.as_str(), seq, key.len()),
                ("r", "S1", 1, key_len)
            ),
            other => panic!("expected InvalidAttribute, got {other:?}"),
        }
    }
    // One bad attribute refuses the whole write.
    let mixed = writes::set_attributes(
        "r",
        1,
        vec![
            ("good".to_owned(), AttributeValue::Int(1)),
            ("b=d".to_owned(), AttributeValue::Int(2)),
        ],
    );
    assert!(matches!(
        store.write(Some(&l), mixed).await,
        Err(Error::InvalidAttribute { .. })
    ));
    assert_eq!(store.attributes("r").await.unwrap(), Attributes::new());
    // At creation too: the run is not created.
    let lx = lease(store, "x").await;
    let bad = writes::create_with(
        info("x"),
        record(0, "A", r#"{"A":{"n":1}}"#),
        "workflow wf\n",
        vec![("no/slash".to_owned(), str("v"))],
    );
    match store.write(Some(&lx), bad).await {
        Err(Error::InvalidAttribute {
            run_id, state, seq, ..
        }) => {
            assert_eq!((run_id.as_str(), state.as_str(), seq), ("x", "A", 0));
        }
        other => panic!("expected InvalidAttribute, got {other:?}"),
    }
    assert!(store.run_info("x").await.unwrap().is_none());
    // Fenced: a seq the run left, and a run that does not exist.
    match store
        .write(Some(&l), set(0, "k", AttributeValue::Int(1)))
        .await
    {
        Err(Error::Fenced {
            run_id,
            seq,
            current,
            ..
        }) => {
            assert_eq!((run_id.as_str(), seq, current), ("r", 0, 1));
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(matches!(
        store
            .write(
                None,
                writes::set_attributes("ghost", 0, vec![("k".to_owned(), AttributeValue::Int(1))])
            )
            .await,
        Err(Error::RunNotFound { .. })
    ));
    // A lease given back and taken again: the old one is fenced.
    store.release(&l).await.unwrap();
    let l2 = lease(store, "r").await;
    assert!(matches!(
        store
            .write(Some(&l), set(1, "k", AttributeValue::Int(1)))
            .await,
        Err(Error::Fenced { .. })
    ));
    store
        .write(Some(&l2), set(1, "k", AttributeValue::Int(1)))
        .await
        .unwrap();
    // An ended run takes no attributes.
    transition(store, &l2, "r", 2, true).await.unwrap();
    assert!(matches!(
        store
            .write(Some(&l2), set(2, "k", AttributeValue::Int(2)))
            .await,
        Err(Error::Fenced {
            status: RunStatus::Completed,
            ..
        })
    ));
    assert_eq!(
        store.attributes("r").await.unwrap(),
        attrs(&[("k", AttributeValue::Int(1))])
    );
}
