//! Storage faults, corrupt files and bad input: every one is a typed error, the process stays
//! usable, and nothing committed before is lost.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use loops::{Context, Error, RedbStore, RetryPolicy, RunStatus, Runtime, StoreOptions, Workflow};
use redb::backends::FileBackend;
use redb::{BackendError, ReadableTable, StorageBackend};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "faulty")]
enum Count {
    #[initial]
    #[next(Step, Done)]
    Step { n: u32 },
    #[terminal]
    Done { n: u32 },
}

struct Counter;

impl CountHandler for Counter {
    type Error = loops::Error;

    async fn step(&self, ctx: &Context, n: u32) -> Result<StepNext, Self::Error> {
        let n: u32 = ctx.step("inc", || async move { Ok(n + 1) }).await?;
        Ok(if n >= 5 {
            StepNext::Done { n }
        } else {
            StepNext::Step { n }
        })
    }
}

/// What the faulty backend fails: nothing, writes (ENOSPC), syncs (EIO) or reads (EIO).
const OK: u8 = 0;
const WRITE: u8 = 1;
const SYNC: u8 = 2;
const READ: u8 = 3;

/// A file backend that fails on demand.
#[derive(Debug)]
struct Faulty {
    inner: FileBackend,
    fault: Arc<AtomicU8>,
}

impl Faulty {
    fn check(&self, what: u8, kind: std::io::ErrorKind) -> std::io::Result<()> {
        if self.fault.load(Ordering::SeqCst) == what {
            return Err(std::io::Error::from(kind));
        }
        Ok(())
    }
}

impl StorageBackend for Faulty {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.check(READ, std::io::ErrorKind::Other)?;
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.check(WRITE, std::io::ErrorKind::StorageFull)?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.check(SYNC, std::io::ErrorKind::Other)?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.check(WRITE, std::io::ErrorKind::StorageFull)?;
        self.inner.write(offset, data)
    }
    fn close(&self) -> std::io::Result<()> {
        self.inner.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }
}

fn faulty_runtime(path: &Path, fault: &Arc<AtomicU8>) -> Runtime {
    let fault = Arc::clone(fault);
    let file_path = path.to_path_buf();
    let store = RedbStore::with_storage(path.to_path_buf(), StoreOptions::default(), move || {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&file_path)?;
        Ok(Faulty {
            inner: FileBackend::new(file).map_err(std::io::Error::other)?,
            fault: Arc::clone(&fault),
        })
    })
    .unwrap();
    // A failed fsync may still have persisted its commit (the classic ambiguity): the run it
    // created then counts one attempt as possibly started, as after a crash. Three attempts
    // absorb that.
    Runtime::builder()
        .retry(RetryPolicy::attempts(3).with_delays(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(5),
        ))
        .build(store)
}

fn seqs(rt: &Runtime, run_id: &str) -> Vec<u64> {
    rt.redb()
        .unwrap()
        .history(run_id)
        .unwrap()
        .iter()
        .map(|r| r.seq)
        .collect()
}

async fn fault_then_recover(fault_kind: u8) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let fault = Arc::new(AtomicU8::new(OK));
    let rt = faulty_runtime(&path, &fault);
    assert_eq!(
        rt.run("before", Count::Step { n: 0 }, &Counter)
            .await
            .unwrap(),
        Count::Done { n: 5 }
    );
    fault.store(fault_kind, Ordering::SeqCst);
    let during = rt.run("during", Count::Step { n: 0 }, &Counter).await;
    fault.store(OK, Ordering::SeqCst);
    if fault_kind == READ {
        // Reads of pages redb holds in its cache never reach the disk: a read fault may pass.
        if let Err(e) = &during {
            assert!(matches!(e, Error::Storage { .. }), "{e:?}");
        }
    } else {
        let err = during.unwrap_err();
        assert!(matches!(err, Error::Storage { .. }), "{err:?}");
    }
    // The fault cleared: the same process goes on, the interrupted run resumes, and what was
    // committed before the fault is all there.
    assert_eq!(
        rt.run("during", Count::Step { n: 0 }, &Counter)
            .await
            .unwrap(),
        Count::Done { n: 5 }
    );
    assert_eq!(
        rt.run("after", Count::Step { n: 0 }, &Counter)
            .await
            .unwrap(),
        Count::Done { n: 5 }
    );
    assert_eq!(seqs(&rt, "before"), (0..=5).collect::<Vec<_>>());
    assert_eq!(seqs(&rt, "during"), (0..=5).collect::<Vec<_>>());
    assert_eq!(seqs(&rt, "after"), (0..=5).collect::<Vec<_>>());
    drop(rt);
    // And after a restart.
    let rt = Runtime::open(&path).unwrap();
    assert_eq!(
        rt.list_runs(RunStatus::Completed, None)
            .await
            .unwrap()
            .len(),
        3
    );
}

#[tokio::test]
async fn enospc_on_write_is_a_typed_error_and_the_store_recovers() {
    fault_then_recover(WRITE).await;
}

#[tokio::test]
async fn eio_on_sync_is_a_typed_error_and_the_store_recovers() {
    fault_then_recover(SYNC).await;
}

#[tokio::test]
async fn eio_on_read_is_a_typed_error_and_the_store_recovers() {
    fault_then_recover(READ).await;
}

#[tokio::test]
async fn a_fault_that_lasts_fails_every_commit_without_losing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let fault = Arc::new(AtomicU8::new(OK));
    let rt = faulty_runtime(&path, &fault);
    rt.run("before", Count::Step { n: 0 }, &Counter)
        .await
        .unwrap();
    fault.store(WRITE, Ordering::SeqCst);
    for i in 0..3 {
        let err = rt
            .run(&format!("r{i}"), Count::Step { n: 0 }, &Counter)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Storage { .. }), "{err:?}");
        // A fault of the disk: worth trying again later. The message names the I/O error
        // once, and it stays reachable through `store_cause`, though redb's type is not in
        // the API.
        assert!(err.is_transient(), "{err:?}");
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull).to_string();
        assert!(err.to_string().ends_with(&format!(": {full}")), "{err}");
        assert_eq!(err.to_string().matches(&full).count(), 1, "{err}");
        assert!(std::error::Error::source(&err).is_none(), "{err:?}");
        let cause = err.store_cause().unwrap();
        assert!(cause.to_string().contains(&full), "{cause}");
    }
    fault.store(OK, Ordering::SeqCst);
    assert_eq!(seqs(&rt, "before"), (0..=5).collect::<Vec<_>>());
    rt.run("r0", Count::Step { n: 0 }, &Counter).await.unwrap();
    // An error about the request is not transient, and names its run.
    let err = rt.history::<Count>("no-such-run").await;
    let err = match err {
        Err(e) => e,
        Ok(h) if h.is_empty() => rt
            .retry("no-such-run")
            .await
            .expect_err("a retry of a run that does not exist"),
        Ok(h) => panic!("history of a run that does not exist: {h:?}"),
    };
    assert!(!err.is_transient(), "{err:?}");
    assert_eq!(err.run_id(), Some("no-such-run"), "{err:?}");
}

/// A store with three completed runs, closed cleanly.
async fn good_store(dir: &Path) -> PathBuf {
    let path = dir.join("store.redb");
    let rt = Runtime::open(&path).unwrap();
    for i in 0..3 {
        rt.run(&format!("r{i}"), Count::Step { n: 0 }, &Counter)
            .await
            .unwrap();
    }
    path
}

fn assert_open_fails(path: &Path, what: &str) {
    match Runtime::open(path) {
        Err(Error::Open { path: p, cause }) => {
            assert_eq!(p, path, "{what}");
            assert!(!cause.to_string().is_empty());
        }
        Err(other) => panic!("{what}: expected Error::Open, got {other:?}"),
        Ok(rt) => {
            let n = rt
                .redb()
                .unwrap()
                .list(RunStatus::Completed, None)
                .map(|v| v.len());
            panic!("{what}: opened (completed runs: {n:?})");
        }
    }
}

#[tokio::test]
async fn a_truncated_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path()).await;
    let len = std::fs::metadata(&path).unwrap().len();
    for keep in [len / 2, 4096, 100] {
        let copy = dir.path().join(format!("trunc-{keep}.redb"));
        std::fs::copy(&path, &copy).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&copy)
            .unwrap()
            .set_len(keep)
            .unwrap();
        assert_open_fails(&copy, &format!("truncated to {keep} bytes"));
    }
}

#[tokio::test]
async fn flipped_bytes_are_refused_or_harmless_never_silent() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path()).await;
    let original = std::fs::read(&path).unwrap();
    let mut refused = 0;
    // Every 512th byte of the file, one at a time.
    for offset in (0..original.len()).step_by(512) {
        let mut bytes = original.clone();
        bytes[offset] ^= 0x5a;
        let copy = dir.path().join("flipped.redb");
        std::fs::write(&copy, &bytes).unwrap();
        match Runtime::open(&copy) {
            Err(Error::Open { .. }) => refused += 1,
            Err(other) => panic!("flip at {offset}: unexpected error {other:?}"),
            Ok(rt) => {
                // The flip hit a byte no committed tree uses (free space, an old page):
                // every record must read back exactly as written.
                for i in 0..3 {
                    let run = format!("r{i}");
                    let history = rt
                        .history::<Count>(&run)
                        .await
                        .unwrap_or_else(|e| panic!("flip at {offset}: opened, then {e:?}"));
                    assert_eq!(history.len(), 6, "flip at {offset}");
                    assert_eq!(history[5].value, Count::Done { n: 5 });
                }
            }
        }
    }
    assert!(refused > 0, "no flip was detected at all");
}

#[tokio::test]
async fn a_file_that_is_not_a_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.redb");
    std::fs::write(&text, "just some notes\n").unwrap();
    assert_open_fails(&text, "a text file");
    let zeros = dir.path().join("zeros.redb");
    std::fs::write(&zeros, vec![0u8; 16384]).unwrap();
    assert_open_fails(&zeros, "zeros");
    // The refusal left the files alone.
    assert_eq!(std::fs::read(&text).unwrap(), b"just some notes\n");
    let dir_path = dir.path().join("a-directory");
    std::fs::create_dir(&dir_path).unwrap();
    assert_open_fails(&dir_path, "a directory");
}

/// Replaces the record of the transition of `run` at `seq` in the store's log (formats 2 and 3:
/// see loops-core's `store/redb/log.rs`) with what `edit` makes of it, as a foreign tool
/// might.
fn replace_transition(
    txn: &redb::WriteTransaction,
    run: &str,
    seq: u64,
    edit: impl FnOnce(&[u8]) -> Vec<u8>,
) {
    let log: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log");
    let mut table = txn.open_table(log).unwrap();
    let mut found = None;
    for entry in table.iter().unwrap() {
        let (key, value) = entry.unwrap();
        let bytes = value.value();
        // A transition: kind 1, previous entry, previous transition, seq, run id, record.
        if bytes[0] != 1 || u64::from_le_bytes(bytes[17..25].try_into().unwrap()) != seq {
            continue;
        }
        let len = usize::from(u16::from_le_bytes(bytes[25..27].try_into().unwrap()));
        if &bytes[27..27 + len] == run.as_bytes() {
            found = Some((
                key.value(),
                bytes[..27 + len].to_vec(),
                bytes[27 + len..].to_vec(),
            ));
        }
    }
    let (key, mut header, record) = found.expect("the transition is in the log");
    header.extend_from_slice(&edit(&record));
    table.insert(key, header.as_slice()).unwrap();
}

#[tokio::test]
async fn a_record_that_does_not_decode_names_its_run_and_seq_and_spares_other_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path()).await;
    {
        // Edit r1's record at seq 3 by hand, as a foreign tool might.
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        replace_transition(&txn, "r1", 3, |_| {
            br#"{"seq":3,"state":"Step","at_ms":1,"schema":"zz"}"#.to_vec()
        });
        replace_transition(&txn, "r2", 5, |_| {
            br#"{"seq":5,"state":"Done","at_ms":1,"schema":"0000000000000000","payload":{"Done":{"n":"five"}}}"#
                .to_vec()
        });
        txn.commit().unwrap();
    }
    let rt = Runtime::open(&path).unwrap();
    match rt.history::<Count>("r1").await {
        Err(Error::Decode { run_id, seq, .. }) => assert_eq!((run_id.as_str(), seq), ("r1", 3)),
        other => panic!("expected Decode for r1 seq 3, got {other:?}"),
    }
    match rt.run("r2", Count::Step { n: 0 }, &Counter).await {
        Err(Error::SchemaMismatch { run_id, .. }) => assert_eq!(run_id, "r2"),
        other => panic!("expected a refusal for r2, got {other:?}"),
    }
    match rt.history::<Count>("r2").await {
        Err(Error::Decode {
            run_id, seq, state, ..
        }) => {
            assert_eq!((run_id.as_str(), seq, state.as_str()), ("r2", 5, "Done"));
        }
        other => panic!("expected Decode for r2 seq 5, got {other:?}"),
    }
    // Other runs are unaffected.
    assert_eq!(rt.history::<Count>("r0").await.unwrap().len(), 6);
    assert_eq!(
        rt.run("r0", Count::Step { n: 0 }, &Counter).await.unwrap(),
        Count::Done { n: 5 }
    );
    assert_eq!(
        rt.run("r3", Count::Step { n: 0 }, &Counter).await.unwrap(),
        Count::Done { n: 5 }
    );
}

/// A run whose latest record does not decode as its workflow (edited outside loops, or a
/// `Deserialize` that changed without its schema) fails once, saying why: it was driven again
/// every second, forever, logging the error each time (helper-107 HIGH 1).
#[tokio::test]
async fn a_run_whose_state_does_not_decode_fails_once_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    Runtime::open(&path)
        .unwrap()
        .enqueue("r9", Count::Step { n: 0 }, loops::StartOptions::default())
        .await
        .unwrap();
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        replace_transition(&txn, "r9", 0, |record| {
            let mut record: serde_json::Value = serde_json::from_slice(record).unwrap();
            record["payload"] = serde_json::json!({"Step": {"n": "zero"}});
            serde_json::to_vec(&record).unwrap()
        });
        txn.commit().unwrap();
    }
    let rt = Runtime::builder()
        .retry(RetryPolicy::attempts(3).with_delays(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(1),
        ))
        .open(&path)
        .unwrap();
    let err = rt
        .run("r9", Count::Step { n: 0 }, &Counter)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::RunFailed { .. }), "{err:?}");
    let info = rt.run_info("r9").await.unwrap().unwrap();
    assert_eq!(
        (info.status, info.state.as_str(), info.seq, info.attempt),
        (RunStatus::Failed, "Step", 0, 1)
    );
    assert_eq!(
        info.error.unwrap(),
        [
            "run `r9`: transition record at seq 0 (state `Step`) does not decode",
            "invalid type: string \"zero\", expected u32 at line 1 column 19"
        ]
    );
}

#[tokio::test]
async fn a_record_whose_seq_is_not_its_key_is_refused_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path()).await;
    {
        // Put r1's record of seq 0 under the key of seq 3, as a foreign tool might.
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let mut first = Vec::new();
        replace_transition(&txn, "r1", 0, |record| {
            first = record.to_vec();
            record.to_vec()
        });
        assert!(String::from_utf8_lossy(&first).contains(r#""seq":0"#));
        replace_transition(&txn, "r1", 3, |_| first.clone());
        txn.commit().unwrap();
    }
    let rt = Runtime::open(&path).unwrap();
    match rt.history::<Count>("r1").await {
        Err(e @ Error::Decode { .. }) => {
            let Error::Decode { run_id, seq, .. } = &e else {
                unreachable!()
            };
            assert_eq!((run_id.as_str(), *seq), ("r1", 3));
            assert!(
                e.to_string()
                    .contains("the record says seq 0, but it is stored under seq 3")
                    || std::error::Error::source(&e)
                        .is_some_and(|s| s.to_string().contains("says seq 0")),
                "{e}"
            );
        }
        other => panic!("expected Decode for r1 seq 3, got {other:?}"),
    }
    // Other runs are unaffected.
    assert_eq!(rt.history::<Count>("r0").await.unwrap().len(), 6);
}

/// An open of a store file, with the error it returns, if any.
#[cfg(unix)]
type Open = fn(&Path) -> Option<Error>;

/// Every open of a store file, by name: writable (the runtime's and the store's) and read-only.
#[cfg(unix)]
const EVERY_OPEN: [(&str, Open); 3] = [
    ("Runtime::open", |p| Runtime::open(p).err()),
    ("RedbStore::open", |p| RedbStore::open(p).err()),
    ("RedbStore::open_read_only", |p| {
        RedbStore::open_read_only(p).err()
    }),
];

#[cfg(unix)]
#[test]
fn a_fifo_is_refused_by_every_open_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("store.redb");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    // Each open runs on a thread of its own: one that blocks fails the test instead of
    // hanging it.
    for (what, open) in EVERY_OPEN {
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(open(&path));
        });
        match rx.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(Some(Error::Open { path, cause })) => {
                assert_eq!(path, fifo, "{what}");
                assert_eq!(
                    cause.to_string(),
                    "it is a FIFO (named pipe), not a regular file; a store is a regular file",
                    "{what}"
                );
            }
            Ok(other) => panic!("{what}: expected Error::Open, got {other:?}"),
            Err(_) => panic!("{what}: still blocked on the FIFO after 20 s"),
        }
    }
}

#[cfg(unix)]
#[test]
fn a_path_that_names_a_directory_is_refused_by_every_open_making_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // A file named with a `/` after it: the store itself was meant.
    let file = dir.path().join("agent.redb");
    std::fs::write(&file, b"not touched").unwrap();
    let meant_file = format!(
        "which names a directory, and {} is a file: name the store without the `/`",
        file.display()
    );
    let meant_dir = "which names a directory; a store is a regular file: name one in that \
                     directory (DIR/agent.redb)";
    for (name, meant) in [("missing", meant_dir), ("agent.redb", meant_file.as_str())] {
        let mut named = dir.path().join(name).into_os_string();
        named.push("/");
        let named = std::path::PathBuf::from(named);
        for (what, open) in EVERY_OPEN {
            match open(&named) {
                Some(e @ Error::Open { .. }) => assert_eq!(
                    e.to_string(),
                    format!(
                        "cannot open store {}: the path ends with `/`, {meant}",
                        named.display()
                    ),
                    "{what}"
                ),
                other => panic!("{what}: expected Error::Open, got {other:?}"),
            }
        }
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(left, ["agent.redb"]);
    assert_eq!(std::fs::read(&file).unwrap(), b"not touched");
}

#[cfg(unix)]
#[test]
fn a_symbolic_link_to_nothing_is_refused_by_every_open_and_stays_one() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("store.redb");
    let target = dir.path().join("gone").join("store.redb");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    // A chain of links whose last one points to nothing, and two links that point to each
    // other (the system's words for the loop).
    let chain = dir.path().join("chain.redb");
    std::os::unix::fs::symlink("store.redb", &chain).unwrap();
    let (one, two) = (dir.path().join("one.redb"), dir.path().join("two.redb"));
    std::os::unix::fs::symlink("two.redb", &one).unwrap();
    std::os::unix::fs::symlink("one.redb", &two).unwrap();
    let mut cases = vec![
        (
            &link,
            format!(
                "it is a symbolic link to {}, which does not exist; a store is not created \
                 through a link",
                target.display()
            ),
        ),
        (
            &chain,
            "it is a symbolic link to store.redb, a link in a chain that ends at nothing; a \
             store is not created through a link"
                .to_owned(),
        ),
    ];
    // The system's words, with its error number.
    if cfg!(target_os = "linux") {
        cases.push((
            &one,
            "it is a symbolic link to two.redb, which cannot be followed (Too many levels of \
             symbolic links (os error 40))"
                .to_owned(),
        ));
    }
    for (named, why) in &cases {
        for (what, open) in EVERY_OPEN {
            match open(named) {
                Some(e @ Error::Open { .. }) => assert_eq!(
                    e.to_string(),
                    format!("cannot open store {}: {why}", named.display()),
                    "{what}"
                ),
                other => panic!("{what}: expected Error::Open, got {other:?}"),
            }
        }
    }
    assert_eq!(std::fs::read_link(&link).unwrap(), target);
    assert!(!dir.path().join("gone").exists());
    // A store in a directory that is a link to nothing: the open that would create it names
    // the link (mkdir says only "File exists").
    let link = dir.path().join("dir");
    std::os::unix::fs::symlink(dir.path().join("gone"), &link).unwrap();
    let store = link.join("sub").join("store.redb");
    match RedbStore::open(&store) {
        Err(e @ Error::Open { .. }) => assert_eq!(
            e.to_string(),
            format!(
                "cannot open store {}: its directory {} is a symbolic link to {}, which does not \
                 exist: create that directory, or name another path",
                store.display(),
                link.display(),
                dir.path().join("gone").display()
            )
        ),
        other => panic!("expected Error::Open, got {other:?}"),
    }
    assert!(!dir.path().join("gone").exists());
}

#[tokio::test]
async fn run_ids_and_payload_limits_are_enforced_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let rt = Runtime::builder()
        .max_payload_bytes(64)
        .open(&path)
        .unwrap();
    for (id, reason) in [
        ("", "empty"),
        ("tab\there", "contains control characters"),
        ("nul\0", "contains control characters"),
        (&"é".repeat(129)[..], "longer than 256 bytes"),
    ] {
        match rt.run(id, Count::Step { n: 0 }, &Counter).await {
            Err(Error::InvalidRunId { reason: r, .. }) => assert_eq!(r, reason, "{id:?}"),
            other => panic!("{id:?}: expected InvalidRunId, got {other:?}"),
        }
    }
    // Exactly 256 bytes, any Unicode: accepted.
    let long = "ü".repeat(128);
    rt.run(&long, Count::Step { n: 0 }, &Counter).await.unwrap();
    let big = "x".repeat(100);
    match rt.send(&long, "e", &big).await {
        Err(Error::RunEnded { .. }) | Err(Error::PayloadTooLarge { .. }) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        rt.list_runs(RunStatus::Completed, None)
            .await
            .unwrap()
            .len(),
        1
    );
}

/// The message of a store error names its cause once, however it is printed: `{e}`,
/// `Error::chain`, or anyhow's `{:#}` (which walks `source()`).
#[test]
fn store_errors_name_their_cause_once() {
    use std::io::{Error as IoError, ErrorKind};
    let full = IoError::from(ErrorKind::StorageFull).to_string();
    let denied = IoError::from(ErrorKind::PermissionDenied).to_string();
    let storage = Error::Storage {
        action: "committing 2 writes".to_owned(),
        cause: Arc::new(redb::Error::Io(IoError::from(ErrorKind::StorageFull))),
    };
    // redb's backend error prints its I/O error and returns it as its source too.
    let open = Error::Open {
        path: PathBuf::from("/srv/jobs.redb"),
        cause: Box::new(redb::BackendError::Io(IoError::from(
            ErrorKind::PermissionDenied,
        ))),
    };
    let database = Error::database(
        "committing a transition of run `r1`",
        IoError::new(ErrorKind::ConnectionReset, "connection reset by peer"),
    );
    for (err, said) in [
        (
            storage,
            format!("store error while committing 2 writes: I/O error: {full}"),
        ),
        (
            open,
            format!("cannot open store /srv/jobs.redb: I/O error: {denied}"),
        ),
        (
            database,
            "store error while committing a transition of run `r1`: connection reset by peer"
                .to_owned(),
        ),
    ] {
        assert_eq!(err.to_string(), said);
        assert_eq!(err.chain(), said);
        assert_eq!(loops::error_chain(&err), vec![said.clone()]);
        assert!(err.store_cause().is_some(), "{err:?}");
        assert_eq!(format!("{:#}", anyhow::Error::from(err)), said);
    }
}

/// A damaged page is said to be damage by every open, never another format (a flip can hide
/// the record of the format), and a writable open that succeeds reads every record back:
/// before, a page redb's check on open let through left the runtime open on a file whose
/// reads failed, and a read-only open called a damaged file "format 1" and sent the user to
/// `loops upgrade`.
#[tokio::test]
async fn a_flipped_byte_is_damage_to_every_open_never_another_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path()).await;
    let original = std::fs::read(&path).unwrap();
    let copy = dir.path().join("flipped.redb");
    let (mut refused, mut opened) = (0, 0);
    // The bytes of the format's record (its key), and one byte in every 64 (at 10 past,
    // where a page's first entries lie).
    let format_key = original
        .windows(6)
        .position(|w| w == b"format")
        .expect("the format's record");
    let offsets = (format_key..format_key + 6).chain((10..original.len()).step_by(64));
    for offset in offsets {
        let mut bytes = original.clone();
        bytes[offset] ^= 0xff;
        std::fs::write(&copy, &bytes).unwrap();
        match RedbStore::open_read_only(&copy) {
            // Damage, or (the header's magic number) not a redb file: refused either way.
            Err(Error::Open { .. }) => {}
            Err(other) => panic!("flip at {offset}, read-only: {other:?}"),
            Ok(store) => {
                for i in 0..3 {
                    let history = store.history(&format!("r{i}"));
                    assert_eq!(history.map(|h| h.len()).ok(), Some(6), "flip at {offset}");
                }
            }
        }
        match Runtime::open(&copy) {
            Err(Error::Open { .. }) => refused += 1,
            Err(other) => panic!("flip at {offset}, writable: {other:?}"),
            Ok(rt) => {
                opened += 1;
                for i in 0..3 {
                    let history = rt.history::<Count>(&format!("r{i}")).await;
                    let last = history.ok().and_then(|h| h.get(5).map(|t| t.value.clone()));
                    assert_eq!(last, Some(Count::Done { n: 5 }), "flip at {offset}");
                }
                rt.shutdown().await;
            }
        }
    }
    assert!(
        refused > 0 && opened > 0,
        "{refused} refused, {opened} opened"
    );
}

/// A header that names an older redb file format (a bit flipped in its version byte): every
/// loops store has redb's current format, so every open, and the upgrade, refuses it as
/// damage, with no backup made. Before, each said redb's "Manual upgrade required", and
/// `loops upgrade` said the same of itself.
#[tokio::test]
async fn a_header_naming_an_older_redb_format_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path()).await;
    let original = std::fs::read(&path).unwrap();
    assert_eq!(original[64], 3, "redb's file format version");
    for version in [1u8, 2] {
        let copy = dir.path().join(format!("version-{version}.redb"));
        let mut bytes = original.clone();
        bytes[64] = version;
        std::fs::write(&copy, &bytes).unwrap();
        let refusals = [
            Runtime::open(&copy).err(),
            RedbStore::open_read_only(&copy).err(),
            RedbStore::upgrade(&copy).err(),
        ];
        for refused in refusals {
            let refused = refused.expect("refused");
            assert!(refused.is_store_damage(), "{refused}");
            assert!(
                refused.to_string().contains(&format!(
                    "redb's header names file format version {version}, which no loops store has"
                )),
                "{refused}"
            );
        }
        assert_eq!(std::fs::read(&copy).unwrap(), bytes);
    }
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".bak"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
}
