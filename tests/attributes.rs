//! Searchable run attributes through the public API: given at the start
//! (`Runtime::run_with`/`start_with` with `StartOptions::attribute`), set by handlers
//! (`Context::set_attribute`), replaced, set again by a handler that runs again (a retry),
//! refused when invalid with the run, state and seq, found by `Runtime::list_runs_where`
//! (equality, ranges, status and workflow), kept in plaintext and searchable under a payload
//! codec, and removed by `prune`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use loops::{
    AttributeFilter, AttributeValue, Attributes, BoxError, Context, Error, Keyring,
    RetentionPolicy, RetryPolicy, RunFilter, RunStatus, Runtime, StartOptions, Workflow,
};
use serde::{Deserialize, Serialize};

/// A triage of one issue: tags itself with the repository and issue number, then works
/// (failing its first attempt when `flaky`), then is done.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Triage {
    #[initial]
    #[next(Work)]
    Start { repo: String, issue: i64 },
    #[next(Done)]
    Work { flaky: bool },
    #[terminal]
    Done { label: String },
}

#[derive(Default)]
struct Triager {
    /// Executions of the `Work` handler.
    work_runs: AtomicU32,
    /// The errors `set_attribute` returned for the invalid keys tried in `Start`.
    refused: Mutex<Vec<Error>>,
}

impl TriageHandler for Triager {
    type Error = BoxError;

    async fn start(&self, ctx: &Context, repo: String, issue: i64) -> Result<StartNext, BoxError> {
        ctx.set_attribute("repo", repo.as_str()).await?;
        ctx.set_attribute("issue", issue).await?;
        // A key outside the character set is refused, and the handler goes on.
        if let Err(e) = ctx.set_attribute("bad key", 1).await {
            self.refused.lock().unwrap().push(e);
        }
        // So is a key of loops' own: a handler cannot pass its run off as a schedule's.
        if let Err(e) = ctx.set_attribute("loops.schedule", "nightly").await {
            self.refused.lock().unwrap().push(e);
        }
        Ok(StartNext::Work {
            flaky: issue % 2 == 1,
        })
    }

    async fn work(&self, ctx: &Context, flaky: bool) -> Result<WorkNext, BoxError> {
        let n = self.work_runs.fetch_add(1, Ordering::SeqCst);
        // Replaces the value given at the start; set again by the retry.
        ctx.set_attribute("phase", "work").await?;
        if flaky && ctx.attempt() == 1 {
            return Err(format!("flaky (execution {n})").into());
        }
        Ok(WorkNext::Done {
            label: "triaged".into(),
        })
    }
}

fn builder() -> loops::RuntimeBuilder {
    Runtime::builder().retry(
        RetryPolicy::attempts(3)
            .with_delays(Duration::from_millis(1), Duration::from_millis(2))
            .with_jitter(0.0),
    )
}

fn attrs(pairs: &[(&str, AttributeValue)]) -> Attributes {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn start(repo: &str, issue: i64) -> Triage {
    Triage::Start {
        repo: repo.to_owned(),
        issue,
    }
}

/// The run ids `filter` selects.
async fn ids(rt: &Runtime, filter: &RunFilter) -> Vec<String> {
    rt.list_runs_where(filter)
        .await
        .unwrap()
        .into_iter()
        .map(|(info, _)| info.run_id)
        .collect()
}

const DUE: u64 = 1_767_225_600_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_and_starts_set_attributes_that_searches_find() {
    let dir = tempfile::tempdir().unwrap();
    let rt = builder().open(dir.path().join("store.redb")).unwrap();
    let triager = Triager::default();
    for (id, repo, issue) in [
        ("t1", "acme/api", 10),
        ("t2", "acme/web", 11),
        ("t3", "acme/api", 13),
    ] {
        let options = StartOptions::default()
            .attribute("owner", "alice")
            .attribute("phase", "queued")
            .attribute("due", AttributeValue::Time(DUE + issue as u64));
        let done = rt.run_with(id, start(repo, issue), &triager, options).await;
        assert_eq!(
            done.unwrap(),
            Triage::Done {
                label: "triaged".into()
            }
        );
    }
    // t2 and t3 failed their first Work attempt: five executions for three runs.
    assert_eq!(triager.work_runs.load(Ordering::SeqCst), 5);
    assert_eq!(
        rt.attributes("t3").await.unwrap(),
        attrs(&[
            ("due", AttributeValue::Time(DUE + 13)),
            ("issue", AttributeValue::Int(13)),
            ("owner", AttributeValue::Str("alice".into())),
            ("phase", AttributeValue::Str("work".into())),
            ("repo", AttributeValue::Str("acme/api".into())),
        ])
    );
    // The invalid key: refused with the run, state and seq, once per run, nothing stored.
    let refused = std::mem::take(&mut *triager.refused.lock().unwrap());
    assert_eq!(refused.len(), 6);
    assert_eq!(
        refused[5].to_string(),
        "run `t3` at seq 0 (state `Start`): invalid attribute \"loops.schedule\": keys that start with `loops.` are loops' own (such as `loops.schedule`)"
    );
    match &refused[4] {
        Error::InvalidAttribute {
            run_id,
            state,
            seq,
            key,
            reason,
        } => assert_eq!(
            (run_id.as_str(), state.as_str(), *seq, key.as_str(), *reason),
            (
                "t3",
                "Start",
                0,
                "bad key",
                "the key has a character other than ASCII letters, digits, `_`, `-` and `.`"
            )
        ),
        other => panic!("expected InvalidAttribute, got {other:?}"),
    }
    assert_eq!(
        refused[0].to_string(),
        "run `t1` at seq 0 (state `Start`): invalid attribute \"bad key\": the key has a character other than ASCII letters, digits, `_`, `-` and `.`"
    );

    let api = || RunFilter::new().attribute("repo", "acme/api");
    assert_eq!(ids(&rt, &api()).await, ["t1", "t3"]);
    assert_eq!(
        ids(&rt, &RunFilter::new().attribute("phase", "work")).await,
        ["t1", "t2", "t3"]
    );
    assert!(
        ids(&rt, &RunFilter::new().attribute("phase", "queued"))
            .await
            .is_empty()
    );
    assert_eq!(
        ids(
            &rt,
            &RunFilter::new().where_attribute(AttributeFilter::int_range("issue", 11..=12))
        )
        .await,
        ["t2"]
    );
    assert_eq!(
        ids(
            &rt,
            &api().where_attribute(AttributeFilter::time_range("due", DUE + 11..=u64::MAX))
        )
        .await,
        ["t3"]
    );
    assert_eq!(
        ids(&rt, &api().status(RunStatus::Completed).workflow("triage")).await,
        ["t1", "t3"]
    );
    assert!(ids(&rt, &api().status(RunStatus::Running)).await.is_empty());
    // Without an attribute filter: from the status index, each run with its attributes.
    let all = rt
        .list_runs_where(&RunFilter::new().status(RunStatus::Completed))
        .await
        .unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all[1].1.get("issue"), Some(&AttributeValue::Int(11)));

    // Prune removes a run's attributes with it.
    let pruned = rt
        .prune_with(&RetentionPolicy::default().keep_last(1), false)
        .await
        .unwrap();
    assert_eq!(pruned.runs, 2);
    let kept = ids(&rt, &RunFilter::new().attribute("owner", "alice")).await;
    assert_eq!(kept.len(), 1);
    for gone in pruned.run_ids {
        assert_eq!(rt.attributes(&gone).await.unwrap(), Attributes::new());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_attributes_are_checked_and_a_run_that_exists_keeps_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let rt = builder().open(dir.path().join("store.redb")).unwrap();
    rt.register::<Triage, _>(Triager::default());
    let bad = StartOptions::default().attribute("k", "x".repeat(513));
    match rt.start_with("s1", start("acme/api", 2), bad).await {
        Err(Error::InvalidAttribute {
            run_id, state, seq, ..
        }) => {
            assert_eq!((run_id.as_str(), state.as_str(), seq), ("s1", "Start", 0));
        }
        other => panic!("expected InvalidAttribute, got {other:?}"),
    }
    assert!(rt.run_info("s1").await.unwrap().is_none());
    let reserved = StartOptions::default().attribute("loops.schedule", "nightly");
    match rt.start_with("s1", start("acme/api", 2), reserved).await {
        Err(Error::InvalidAttribute { key, reason, .. }) => assert_eq!(
            (key.as_str(), reason),
            (
                "loops.schedule",
                "keys that start with `loops.` are loops' own (such as `loops.schedule`)"
            )
        ),
        other => panic!("expected InvalidAttribute, got {other:?}"),
    }
    assert!(rt.run_info("s1").await.unwrap().is_none());
    let first = StartOptions::default().attribute("owner", "alice");
    rt.start_with("s1", start("acme/api", 2), first)
        .await
        .unwrap();
    rt.wait::<Triage>("s1").await.unwrap();
    // Started again (it exists): its attributes stay as they are.
    let again = StartOptions::default().attribute("owner", "bob");
    rt.start_with("s1", start("acme/api", 2), again)
        .await
        .unwrap();
    assert_eq!(
        rt.attributes("s1").await.unwrap().get("owner"),
        Some(&AttributeValue::Str("alice".into()))
    );
    assert_eq!(
        ids(&rt, &RunFilter::new().attribute("owner", "bob")).await,
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_stay_plaintext_and_searchable_under_a_payload_codec() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let rt = builder()
        .codec(Keyring::new("k1", [7; 32]).unwrap())
        .open(&path)
        .unwrap();
    rt.run_with(
        "c1",
        start("secret-org/vault", 4),
        &Triager::default(),
        StartOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        ids(&rt, &RunFilter::new().attribute("repo", "secret-org/vault")).await,
        ["c1"]
    );
    rt.shutdown().await;
    drop(rt);
    // Opened without the key (a runtime without a codec is refused a sealed store, so one
    // that reads it redacted): the attributes read the same (the payloads would not).
    let plain = builder().read_sealed_redacted().open(&path).unwrap();
    assert_eq!(
        plain.attributes("c1").await.unwrap().get("repo"),
        Some(&AttributeValue::Str("secret-org/vault".into()))
    );
}
