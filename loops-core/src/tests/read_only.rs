//! A read-only store answers a write that writes nothing, refusals first, with the file's
//! bytes left as they were: what lets the `loops` CLI refuse a write without opening the
//! file for writing (which rewrites part of it when it closes).

use serde_json::value::RawValue;

use super::{Job, temp_store};
use crate::*;

fn raw(text: &str) -> Box<RawValue> {
    serde_json::from_str(text).unwrap()
}

#[tokio::test]
async fn a_read_only_store_answers_refusals_and_unchanged_writes_and_writes_nothing() {
    let (_dir, path) = temp_store();
    {
        let rt = Runtime::open(&path).unwrap();
        let store = rt.redb().unwrap();
        store
            .__seed_history([
                ("live".to_owned(), Job::Start { n: 0 }),
                ("gone".to_owned(), Job::Start { n: 1 }),
            ])
            .unwrap();
        let sent = rt
            .send_json("live", "go", Some("k1"), &raw(r#"{"n":1}"#))
            .await
            .unwrap();
        assert_eq!((sent.event_seq, sent.duplicate), (0, false));
        let gone = rt.cancel("gone", "not needed").await.unwrap();
        assert_eq!(gone.status, RunStatus::Cancelled);
        rt.shutdown().await;
    }
    let before = std::fs::read(&path).unwrap();

    let rt = Runtime::builder().build(RedbStore::open_read_only(&path).unwrap());
    let refusal = |e: Error| e.to_string();
    assert_eq!(
        refusal(rt.cancel("gone", "again").await.unwrap_err()),
        "run `gone` has ended (cancelled); cancel is not possible"
    );
    assert!(matches!(
        rt.cancel("nope", "why").await.unwrap_err(),
        Error::RunNotFound { run_id } if run_id == "nope"
    ));
    assert!(matches!(
        rt.retry("live").await.unwrap_err(),
        Error::NotFailed { run_id, status: RunStatus::Running } if run_id == "live"
    ));
    assert!(matches!(
        rt.send_json("gone", "go", None, &raw("{}")).await.unwrap_err(),
        Error::RunEnded { run_id, .. } if run_id == "gone"
    ));
    // The same key again: the first send's receipt, as a writable store answers it.
    let again = rt
        .send_json("live", "go", Some("k1"), &raw(r#"{"n":2}"#))
        .await
        .unwrap();
    assert_eq!((again.event_seq, again.duplicate), (0, true));
    // Writes that would change the store.
    for written in [
        rt.send_json("live", "go", Some("k2"), &raw("{}"))
            .await
            .map(drop),
        rt.send_json("live", "go", None, &raw("{}")).await.map(drop),
        rt.cancel("live", "stop").await.map(drop),
    ] {
        assert!(
            matches!(&written, Err(Error::ReadOnly { path: p }) if *p == path),
            "{written:?}"
        );
    }
    rt.shutdown().await;
    drop(rt);
    assert!(
        std::fs::read(&path).unwrap() == before,
        "the read-only store changed the file"
    );
    // Nothing was written: the run is as it was, with its one event.
    let store = RedbStore::open_read_only(&path).unwrap();
    let live = Store::run_info(&store, "live").await.unwrap().unwrap();
    assert_eq!((live.status, live.cancel), (RunStatus::Running, None));
    assert_eq!(Store::events(&store, "live").await.unwrap().len(), 1);
}

/// A store read through a repair made in memory answers writes as a read-only store does:
/// a write would be lost with the view, so it is never answered as kept.
#[tokio::test]
async fn a_store_repaired_in_memory_answers_writes_as_a_read_only_one() {
    let (dir, path) = temp_store();
    let crashed = dir.path().join("crashed.redb");
    {
        let rt = Runtime::open(&path).unwrap();
        rt.redb()
            .unwrap()
            .__seed_history([
                ("live".to_owned(), Job::Start { n: 0 }),
                ("gone".to_owned(), Job::Start { n: 1 }),
            ])
            .unwrap();
        rt.cancel("gone", "not needed").await.unwrap();
        // A copy taken while a process has the file open is what a crash leaves behind.
        std::fs::copy(&path, &crashed).unwrap();
        rt.shutdown().await;
    }
    assert!(matches!(
        RedbStore::open_read_only(&crashed),
        Err(Error::NeedsRecovery { .. })
    ));
    let before = std::fs::read(&crashed).unwrap();
    let view = RedbStore::open_repaired_in_memory(&crashed, StoreOptions::default()).unwrap();
    let rt = Runtime::builder().build(view);
    assert!(matches!(
        rt.cancel("gone", "again").await.unwrap_err(),
        Error::RunEnded { run_id, .. } if run_id == "gone"
    ));
    for written in [
        rt.cancel("live", "stop").await.map(drop),
        rt.send_json("live", "go", None, &raw("{}")).await.map(drop),
    ] {
        assert!(
            matches!(&written, Err(Error::ReadOnly { path: p }) if *p == crashed),
            "{written:?}"
        );
    }
    let live = rt.run_info("live").await.unwrap().unwrap();
    assert_eq!((live.status, live.cancel), (RunStatus::Running, None));
    rt.shutdown().await;
    drop(rt);
    assert!(std::fs::read(&crashed).unwrap() == before);
}

/// `RuntimeBuilder::check_codec` makes `open`'s codec check on a store opened read-only,
/// so that a program can refuse a missing or foreign key file without opening the file for
/// writing: the same errors, and the file's bytes left as they were.
#[tokio::test]
async fn the_codec_check_is_made_on_a_read_only_store_as_open_makes_it() {
    let (_dir, path) = temp_store();
    {
        let store = RedbStore::open(&path).unwrap();
        let seal = Write::Seal {
            key: "k1".into(),
            check: None,
            at_ms: 1,
        };
        Store::write(&store, None, seal).await.unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let read = RedbStore::open_read_only(&path).unwrap();
    let k1 = Keyring::new("k1", [1; 32]).unwrap();
    let k9 = Keyring::new("k9", [9; 32]).unwrap();
    let checked = |builder: RuntimeBuilder| builder.check_codec(&read);
    assert!(matches!(
        checked(Runtime::builder()),
        Err(Error::Encrypted { keys, .. }) if keys == ["k1"]
    ));
    assert!(checked(Runtime::builder().read_sealed_redacted()).is_ok());
    assert!(checked(Runtime::builder().codec(k1)).is_ok());
    assert!(matches!(
        checked(Runtime::builder().codec(k9.clone())),
        Err(Error::KeyNotInStore { .. })
    ));
    drop(read);
    assert_eq!(std::fs::read(&path).unwrap(), before);
    // `open` refuses the same.
    assert!(matches!(
        Runtime::builder().codec(k9).open(&path),
        Err(Error::KeyNotInStore { .. })
    ));
}
