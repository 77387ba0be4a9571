//! Opening a store: bad input refused, one opener at a time, temporary files of killed
//! creations removed, the file private.

use super::*;

#[tokio::test]
async fn wrong_workflow_and_bad_input_are_refused() {
    let (_dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    let worker = Worker::default();
    rt.run("r", Job::Start { n: 0 }, &worker).await.unwrap();
    assert!(matches!(
        rt.history::<Other>("r").await,
        Err(Error::WorkflowMismatch {
            requested: "other",
            ..
        })
    ));
    for (id, reason) in [
        ("", "empty"),
        ("a\nb", "contains control characters"),
        (&"x".repeat(257)[..], "longer than 256 bytes"),
    ] {
        match rt.run(id, Job::Start { n: 0 }, &worker).await {
            Err(Error::InvalidRunId { reason: r, .. }) => assert_eq!(r, reason),
            other => panic!("expected InvalidRunId for {id:?}, got {other:?}"),
        }
    }
    // An invalid event name or idempotency key: the message says which of the two it is.
    let err = rt.send("r", "", &1).await.unwrap_err();
    assert_eq!(err.to_string(), "run `r`: invalid event name \"\": empty");
    let err = rt.send_with_key("r", "go", "", &1).await.unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidName {
            what: "idempotency key",
            reason: "empty",
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        "run `r`: invalid idempotency key \"\": empty"
    );
    assert!(matches!(
        rt.run("new", Job::Work { n: 0, acc: 0 }, &worker).await,
        Err(Error::NotInitial {
            initial: "Start",
            given: "Work",
            ..
        })
    ));
    assert!(rt.run_info("new").await.unwrap().is_none());
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = crate)]
enum Other {
    #[initial]
    #[terminal]
    Only,
}

#[tokio::test]
async fn second_open_is_refused_at_once() {
    let (_dir, path) = temp_store();
    let _rt = Runtime::open(&path).unwrap();
    match Runtime::open(&path) {
        Err(Error::StoreLocked { path: p }) => assert_eq!(p, path),
        other => panic!("expected StoreLocked, got {other:?}"),
    }
}

/// Threads that open a store that does not exist yet, all at once: one creates it and has it,
/// every other one is refused with `StoreLocked` (not an I/O error about another's temporary
/// file), and no temporary file is left beside it.
#[test]
fn concurrent_opens_of_a_new_store_lock_out_all_but_one() {
    const THREADS: usize = 8;
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let barrier = std::sync::Barrier::new(THREADS);
        let results: Vec<Result<RedbStore>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        RedbStore::open(&path)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let opened = results.iter().filter(|r| r.is_ok()).count();
        let locked = results
            .iter()
            .filter(|r| matches!(r, Err(Error::StoreLocked { path: p }) if *p == path))
            .count();
        let others: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .filter(|e| !matches!(e, Error::StoreLocked { .. }))
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            (opened, locked, others),
            (1, THREADS - 1, Vec::new()),
            "round {round}"
        );
        drop(results);
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["store.redb"], "round {round}");
    }
}

/// A temporary file left by a creation that was killed is removed by the next creation: at
/// once when its process is gone (Linux), else once it is a minute old. One whose process
/// runs, or that someone holds locked, may be a creation in progress and is left alone.
#[test]
fn a_creation_removes_only_abandoned_temporary_files() {
    let dir = tempfile::tempdir().unwrap();
    // A process id that is not running: a child that has exited.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let dead = child.id();
    let me = std::process::id();
    let name = |pid: u32, n: u32| format!(".store.redb.new-{pid}-{n}");
    let dead_young = dir.path().join(name(dead, 0));
    let dead_locked = dir.path().join(name(dead, 1));
    let live_young = dir.path().join(name(me, 900));
    let live_old = dir.path().join(name(me, 901));
    let unparsable_young = dir.path().join(".store.redb.new-x");
    for file in [
        &dead_young,
        &dead_locked,
        &live_young,
        &live_old,
        &unparsable_young,
    ] {
        std::fs::write(file, b"half made").unwrap();
    }
    let old = std::time::SystemTime::now() - Duration::from_secs(61);
    std::fs::File::options()
        .write(true)
        .open(&live_old)
        .unwrap()
        .set_modified(old)
        .unwrap();
    // Held as a running creation holds redb's lock on its file.
    let holder = std::fs::File::open(&dead_locked).unwrap();
    holder.lock().unwrap();
    drop(RedbStore::open(dir.path().join("store.redb")).unwrap());
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut expected = vec![
        name(dead, 1),
        name(me, 900),
        ".store.redb.new-x".to_owned(),
        "store.redb".to_owned(),
    ];
    if !cfg!(target_os = "linux") {
        // Without /proc, only age tells.
        expected.push(name(dead, 0));
    }
    expected.sort();
    assert_eq!(names, expected);
    drop(holder);
}

#[cfg(unix)]
#[tokio::test]
async fn store_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/deeper/store.redb");
    drop(Runtime::open(&path).unwrap());
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
}
