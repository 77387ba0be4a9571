//! Retention, compaction, read-only inspection.

use super::waits::{Gate, Gatekeeper, until_status};
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_removes_only_expired_ended_runs_and_compact_reclaims_space() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder()
        .retry(RetryPolicy::never())
        .retention(RetentionPolicy::default().keep_last(2))
        .open(&path)
        .unwrap();
    let worker = Worker::default();
    for i in 0..40 {
        rt.run(&format!("done-{i:02}"), Job::Start { n: 20 }, &worker)
            .await
            .unwrap();
    }
    // One run stays unfinished (waiting), with an event in its inbox.
    let keeper = std::sync::Arc::new(Gatekeeper::new(Duration::ZERO, Duration::from_secs(60)));
    let waiting = {
        let (rt, keeper) = (rt.clone(), keeper.clone());
        tokio::spawn(async move {
            rt.run("open", Gate::Ask { doc: "d".into() }, &*keeper)
                .await
        })
    };
    until_status(&rt, "open", RunStatus::Waiting).await;
    rt.send("open", "note", "kept").await.unwrap();

    let dry = rt
        .prune_with(&RetentionPolicy::default().keep_last(2), true)
        .await
        .unwrap();
    assert_eq!((dry.runs, dry.records), (38, 38 * 23));
    assert_eq!(
        rt.list_runs(RunStatus::Completed, None)
            .await
            .unwrap()
            .len(),
        40
    );

    let before = rt.redb().unwrap().file_bytes().unwrap();
    let pruned = rt.prune().await.unwrap();
    assert_eq!((pruned.runs, pruned.records), (38, 38 * 23));
    let kept: Vec<String> = rt
        .list_runs(RunStatus::Completed, None)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.run_id)
        .collect();
    assert_eq!(kept.len(), 2);
    for id in &pruned.run_ids {
        assert!(rt.run_info(id).await.unwrap().is_none());
        assert!(rt.store().history(id).await.unwrap().is_empty());
        assert!(rt.store().steps(id, 1).await.unwrap().is_empty());
    }
    for id in &kept {
        assert_eq!(rt.store().history(id).await.unwrap().len(), 23);
        assert_eq!(rt.store().steps(id, 1).await.unwrap().len(), 1);
    }
    // The unfinished run and its inbox are untouched.
    assert_eq!(
        rt.run_info("open").await.unwrap().unwrap().status,
        RunStatus::Waiting
    );
    assert_eq!(rt.store().events("open").await.unwrap().len(), 1);

    let compacted = rt.compact().await.unwrap();
    assert_eq!(compacted.bytes_before, before);
    assert!(
        compacted.bytes_after < compacted.bytes_before,
        "{compacted:?}"
    );
    // Everything still works after compaction.
    rt.send("open", "approval", "fay").await.unwrap();
    assert_eq!(
        waiting.await.unwrap().unwrap(),
        Gate::Done {
            by: "fay".into(),
            note: Some("kept".into())
        }
    );
    assert!(rt.redb().unwrap().check_integrity().unwrap());
}

#[test]
fn retention_selects_families_by_age_and_count() {
    use crate::retention::Family;
    let family = |ids: &[&str], ended_ms: u64| Family {
        ended_ms,
        run_ids: ids.iter().map(|id| (*id).to_owned()).collect(),
    };
    let ended = vec![
        family(&["a", "a/0"], 1_000),
        family(&["b"], 5_000),
        family(&["c", "c/0", "c/0/0"], 9_000),
    ];
    let by_age = RetentionPolicy::older_than(Duration::from_millis(4_000));
    assert_eq!(
        by_age.select(ended.clone(), 10_000),
        vec![family(&["a", "a/0"], 1_000), family(&["b"], 5_000)],
        "oldest first"
    );
    // A family counts as one run: the newest is kept with its two children.
    let by_count = RetentionPolicy::default().keep_last(1);
    assert_eq!(
        by_count.select(ended.clone(), 10_000),
        vec![family(&["a", "a/0"], 1_000), family(&["b"], 5_000)]
    );
    assert_eq!(
        RetentionPolicy::default()
            .keep_last(2)
            .select(ended.clone(), 10_000),
        vec![family(&["a", "a/0"], 1_000)]
    );
    // Ties in age go by the top-level run's id; a max_age past the epoch selects nothing.
    let tied = vec![family(&["y"], 7), family(&["x"], 7)];
    assert_eq!(
        RetentionPolicy::default().keep_last(1).select(tied, 10),
        vec![family(&["y"], 7)]
    );
    assert!(
        RetentionPolicy::older_than(Duration::MAX)
            .select(ended.clone(), 10_000)
            .is_empty()
    );
    assert!(RetentionPolicy::default().select(ended, 10_000).is_empty());
}

#[tokio::test]
async fn a_read_only_store_reads_and_refuses_writes() {
    let (_dir, path) = temp_store();
    {
        let rt = Runtime::open(&path).unwrap();
        rt.run("r", Job::Start { n: 1 }, &Worker::default())
            .await
            .unwrap();
        // A writer holds the file: read-only opens are refused at once.
        assert!(matches!(
            RedbStore::open_read_only(&path),
            Err(Error::StoreLocked { .. })
        ));
    }
    let store = RedbStore::open_read_only(&path).unwrap();
    assert_eq!(store.history("r").unwrap().len(), 4);
    assert_eq!(
        store.run("r").unwrap().unwrap().status,
        RunStatus::Completed
    );
    assert!(matches!(store.compact(), Err(Error::ReadOnly { .. })));
    let second = RedbStore::open_read_only(&path).unwrap();
    assert_eq!(second.list(RunStatus::Completed, None).unwrap().len(), 1);
    assert!(matches!(
        RedbStore::open_read_only(path.with_extension("missing")),
        Err(Error::Open { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_of_the_wrong_shape_is_set_aside_and_the_wait_goes_on() {
    let (_dir, path) = temp_store();
    let rt = Runtime::builder()
        .register::<Gate, _>(Gatekeeper::new(Duration::ZERO, Duration::from_millis(1)))
        .open(&path)
        .unwrap();
    rt.start("g", Gate::Ask { doc: "d".into() }).await.unwrap();
    // A mistyped approval (a number where the handler wants a name), then a good one.
    rt.send("g", "approval", &42).await.unwrap();
    let mut failures = Vec::new();
    for _ in 0..500 {
        failures = rt.store().failures("g").await.unwrap();
        if !failures.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(failures.len(), 1);
    assert_eq!(
        failures[0].1.source,
        FailureSource::Step {
            name: "loops:wait:approval".into(),
            occurrence: 0
        }
    );
    assert!(
        failures[0].1.errors[0].contains("event `approval` (event seq 0)"),
        "{:?}",
        failures[0].1.errors
    );
    rt.send("g", "approval", "gus").await.unwrap();
    let done: Gate = rt.wait("g").await.unwrap();
    assert_eq!(
        done,
        Gate::Done {
            by: "gus".into(),
            note: None
        }
    );
    // Both events were taken from the inbox, the bad one only to be set aside.
    let delivered: Vec<bool> = rt
        .store()
        .events("g")
        .await
        .unwrap()
        .iter()
        .map(|e| e.2)
        .collect();
    assert_eq!(delivered, vec![true, true]);
    assert_eq!(rt.store().failures("g").await.unwrap().len(), 1);
}

#[test]
fn messages_do_not_repeat_their_source() {
    let source = serde_json::from_str::<u32>("x").unwrap_err();
    let err = Error::Decode {
        run_id: "r".into(),
        record: RecordKind::Transition,
        seq: 3,
        state: "Work".into(),
        source,
    };
    assert_eq!(
        err.to_string(),
        "run `r`: transition record at seq 3 (state `Work`) does not decode"
    );
    assert_eq!(
        err.chain(),
        "run `r`: transition record at seq 3 (state `Work`) does not decode: expected value at line 1 column 1"
    );
    let long = "x".repeat(200);
    let err = crate::validate_run_id(&format!(" {long}")).unwrap_err();
    let text = err.to_string();
    assert!(
        text.len() < 160 && text.ends_with("(201 bytes): starts or ends with white space"),
        "{text}"
    );
}

#[test]
fn a_record_that_does_not_decode_is_named_for_what_it_is() {
    let decode = |record: RecordKind, seq: u64, state: &str| {
        Error::Decode {
            run_id: "r".into(),
            record,
            seq,
            state: state.into(),
            source: serde_json::from_str::<u32>("x").unwrap_err(),
        }
        .to_string()
    };
    let step = RecordKind::Step {
        name: "plan".into(),
        occurrence: 1,
    };
    for (got, want) in [
        (
            decode(RecordKind::Transition, 3, "?"),
            "run `r`: transition record at seq 3 does not decode",
        ),
        (
            decode(RecordKind::RunRow, 0, ""),
            "run `r`: run row does not decode",
        ),
        (
            decode(step, 3, ""),
            "run `r`: step record `plan`#1 of seq 3 does not decode",
        ),
        (
            decode(RecordKind::Failure, 2, ""),
            "run `r`: failure record of seq 2 does not decode",
        ),
        (
            decode(RecordKind::Event { name: None }, 0, ""),
            "run `r`: event record at event seq 0 does not decode",
        ),
        (
            decode(
                RecordKind::Event {
                    name: Some("approve".into()),
                },
                4,
                "",
            ),
            "run `r`: event record `approve` at event seq 4 does not decode",
        ),
        (
            decode(
                RecordKind::Wait {
                    event: "approve".into(),
                },
                5,
                "",
            ),
            "run `r`: recorded outcome of the wait for `approve` of seq 5 does not decode",
        ),
    ] {
        assert_eq!(got, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_all_claims_no_more_than_max_active_runs() {
    let (_dir, path) = temp_store();
    {
        let rt = Runtime::open(&path).unwrap();
        let slow = Worker {
            work_delay: Duration::from_secs(60),
            ..Worker::default()
        };
        for i in 0..5 {
            let id = format!("r{i}");
            let run = rt.run(&id, Job::Start { n: 0 }, &slow);
            assert!(
                tokio::time::timeout(Duration::from_millis(100), run)
                    .await
                    .is_err()
            );
        }
    }
    let rt = Runtime::builder()
        .max_active_runs(2)
        .register::<Job, _>(Worker {
            work_delay: Duration::from_secs(60),
            ..Worker::default()
        })
        .open(&path)
        .unwrap();
    assert_eq!(rt.resume_all().await.unwrap().len(), 2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rt.inner.active_count(), 2);
    // Full: a second pass claims nothing more.
    assert!(rt.resume_all().await.unwrap().is_empty());
    assert_eq!(rt.inner.active_count(), 2);
    rt.shutdown().await;
}

/// `silence_caught_redb_panics`: a redb panic that loops catches (a store file with one byte
/// flipped) no longer reaches the hook installed before, and the open still fails with a
/// typed error; a redb panic that loops does not catch, and any other panic, still do.
#[tokio::test]
async fn caught_redb_panics_are_silenced_and_others_passed_on() {
    use std::cell::RefCell;

    thread_local! {
        /// The locations of the panics the earlier hook saw on this thread, while recording.
        static SEEN: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
    }
    /// Runs `f`, and returns what it returned and the panics the earlier hook saw meanwhile.
    fn recorded<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
        SEEN.with(|s| *s.borrow_mut() = Some(Vec::new()));
        let out = f();
        (
            out,
            SEEN.with(|s| s.borrow_mut().take().unwrap_or_default()),
        )
    }
    let in_redb = |locations: &[String]| locations.iter().any(|l| l.contains("/redb-"));

    let (dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    for i in 0..3 {
        rt.run(&format!("r{i}"), Job::Start { n: 2 }, &Worker::default())
            .await
            .unwrap();
    }
    drop(rt);
    let good = std::fs::read(&path).unwrap();

    // The earlier hook: records this thread's panics while recording, passes others on.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let recorded = SEEN.with(|s| {
            s.borrow_mut().as_mut().map(|seen| {
                let location = info.location().map(ToString::to_string);
                seen.push(location.unwrap_or_default().replace('\\', "/"));
            })
        });
        if recorded.is_none() {
            default(info);
        }
    }));

    // A byte whose flip makes redb panic while it opens the file: the first page start (or,
    // failing that, 64-byte step) that does.
    let damaged = dir.path().join("damaged.redb");
    let flip = |offset: usize| {
        let mut bytes = good.clone();
        bytes[offset] ^= 0xff;
        std::fs::write(&damaged, bytes).unwrap();
    };
    // redb's own read-only open, without the verification that runs before it reads.
    let plain = |path: &std::path::Path| {
        RedbStore::open_read_only_with(
            path,
            StoreOptions {
                verify_on_open: false,
                ..StoreOptions::default()
            },
        )
    };
    let offset = (0..good.len())
        .step_by(4096)
        .chain((0..good.len()).step_by(64))
        .find(|&offset| {
            flip(offset);
            let (opened, seen) = recorded(|| plain(&damaged));
            // redb's open itself panics (not a later read of the file's format, which the
            // open also makes): the direct open below must panic the same way.
            let (direct, _) = recorded(|| {
                std::panic::catch_unwind(|| redb::Builder::new().open_read_only(&damaged))
            });
            in_redb(&seen) && matches!(opened, Err(Error::Open { .. })) && direct.is_err()
        })
        .expect("a flipped byte that makes redb panic");

    crate::silence_caught_redb_panics();
    crate::silence_caught_redb_panics(); // a second call changes nothing
    flip(offset);
    let (opened, seen) = recorded(|| plain(&damaged));
    assert!(
        matches!(&opened, Err(Error::Open { path, .. }) if *path == damaged),
        "{:?}",
        opened.err()
    );
    assert_eq!(seen, Vec::<String>::new(), "offset {offset}");
    // The verifying open refuses it too, as quietly.
    let (opened, seen) = recorded(|| RedbStore::open_read_only(&damaged));
    assert!(
        matches!(&opened, Err(Error::Open { .. })),
        "{:?}",
        opened.err()
    );
    assert_eq!(seen, Vec::<String>::new(), "offset {offset}");

    // Outside loops's catch, the same panic is passed on.
    let (direct, seen) =
        recorded(|| std::panic::catch_unwind(|| redb::Builder::new().open_read_only(&damaged)));
    assert!(direct.is_err());
    assert!(in_redb(&seen), "offset {offset}: {seen:?}");

    // So is any panic of other code.
    let line = line!() + 1;
    let (other, seen) = recorded(|| std::panic::catch_unwind(|| panic!("not redb")));
    assert!(other.is_err());
    assert_eq!(
        seen,
        [format!("loops-core/src/tests/retention.rs:{line}:65")]
    );
}
