//! The store file's format: a file of format 1 (journal, steps and failures keyed by run)
//! or 2 (one append-only log, rows in JSON) is refused at the open, upgraded by `upgrade` to
//! format 3 (rows in binary), and reads the same afterwards: every record of
//! `tests/fixtures/store-format-N.redb`, made by [`make_format_1_fixture`] or
//! [`make_format_2_fixture`] with the build of that format, equals what that build read
//! (`tests/fixtures/store-format-N.expected.txt`), and the run it left waiting resumes to
//! its end with no step executed again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use loops::{Context, Error, RetryPolicy, RunStatus, Runtime, StartOptions, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "fixture")]
#[event(approve: String)]
enum Job {
    #[initial]
    #[next(Work)]
    Start { n: u64 },
    /// Two steps; the first attempt fails after them (a failure record).
    #[next(Approval)]
    Work { n: u64 },
    /// A step, then a wait for `approve`.
    #[next(Finish)]
    Approval { n: u64 },
    /// Starts a child and joins it.
    #[next(Done)]
    Finish { n: u64, note: String },
    #[terminal]
    Done { total: u64, note: String },
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "fixture-child")]
enum Leaf {
    #[initial]
    #[next(Squared)]
    Square { i: u64 },
    #[terminal]
    Squared { square: u64 },
}

/// Counts the executions of every step closure (not replays).
#[derive(Clone, Default)]
struct Counts(Arc<[AtomicU32; 5]>);

const DOUBLE: usize = 0;
const TRIPLE: usize = 1;
const PREPARE: usize = 2;
const SQUARE: usize = 3;
const ADD: usize = 4;

impl Counts {
    fn bump(&self, which: usize) {
        self.0[which].fetch_add(1, Ordering::SeqCst);
    }
    fn get(&self) -> [u32; 5] {
        std::array::from_fn(|i| self.0[i].load(Ordering::SeqCst))
    }
}

impl JobHandler for Counts {
    type Error = anyhow::Error;

    async fn start(&self, ctx: &Context, n: u64) -> anyhow::Result<StartNext> {
        ctx.set_attribute("phase", "started").await?;
        Ok(StartNext::Work { n })
    }

    async fn work(&self, ctx: &Context, n: u64) -> anyhow::Result<WorkNext> {
        let doubled: u64 = ctx
            .step("double", || async {
                self.bump(DOUBLE);
                Ok(n * 2)
            })
            .await?;
        let tripled: u64 = ctx
            .step("triple", || async {
                self.bump(TRIPLE);
                Ok(doubled * 3)
            })
            .await?;
        if ctx.attempt() == 1 {
            anyhow::bail!("first attempt fails");
        }
        ctx.set_attribute("phase", "worked").await?;
        Ok(WorkNext::Approval { n: tripled })
    }

    async fn approval(&self, ctx: &Context, n: u64) -> anyhow::Result<ApprovalNext> {
        let prepared: u64 = ctx
            .step("prepare", || async {
                self.bump(PREPARE);
                Ok(n + 1)
            })
            .await?;
        let note: String = ctx.wait_for(Job::APPROVE).await?;
        Ok(ApprovalNext::Finish { n: prepared, note })
    }

    async fn finish(&self, ctx: &Context, n: u64, note: String) -> anyhow::Result<FinishNext> {
        let id = format!("{}/child", ctx.run_id());
        let child = ctx.start_child(&id, Leaf::Square { i: n }).await?;
        let joined = ctx.join_all(&[child]).await?;
        let square = match joined.into_iter().next() {
            Some(Ok(Leaf::Squared { square })) => square,
            other => panic!("the child did not square: {other:?}"),
        };
        let total: u64 = ctx
            .step("add", || async {
                self.bump(ADD);
                Ok(square + n)
            })
            .await?;
        Ok(FinishNext::Done { total, note })
    }
}

impl LeafHandler for Counts {
    type Error = Error;

    async fn square(&self, ctx: &Context, i: u64) -> Result<SquareNext, Error> {
        let square: u64 = ctx
            .step("square", || async {
                self.bump(SQUARE);
                Ok(i * i)
            })
            .await?;
        Ok(SquareNext::Squared { square })
    }
}

fn runtime(path: &Path, counts: &Counts) -> loops::Result<Runtime> {
    Runtime::builder()
        .retry(
            RetryPolicy::attempts(3)
                .with_delays(Duration::from_millis(5), Duration::from_millis(20))
                .with_jitter(0.0),
        )
        .register::<Job, _>(counts.clone())
        .register::<Leaf, _>(counts.clone())
        .open(path)
}

/// The runs of the fixture: `a` ran to its end; `b` waits for `approve` in `Approval`.
const RUNS: [&str; 4] = ["a", "a/child", "b", "b/child"];

/// Everything the store says of the fixture's runs, as text (`Debug`), one line a read.
async fn dump(rt: &Runtime) -> Vec<String> {
    let store = rt.store();
    let mut out = Vec::new();
    for run in RUNS {
        let Some(info) = store.run_info(run).await.unwrap() else {
            out.push(format!("{run} none"));
            continue;
        };
        out.push(format!("{run} info {info:?}"));
        out.push(format!(
            "{run} latest {:?}",
            store.latest(run).await.unwrap()
        ));
        out.push(format!(
            "{run} history {:?}",
            store.history(run).await.unwrap()
        ));
        for seq in 0..=info.seq + 1 {
            out.push(format!(
                "{run} steps {seq} {:?}",
                store.steps(run, seq).await.unwrap()
            ));
        }
        out.push(format!(
            "{run} failures {:?}",
            store.failures(run).await.unwrap()
        ));
        out.push(format!(
            "{run} events {:?}",
            store.events(run).await.unwrap()
        ));
        out.push(format!(
            "{run} attributes {:?}",
            store.attributes(run).await.unwrap()
        ));
        out.push(format!(
            "{run} children {:?}",
            store.children(run).await.unwrap()
        ));
    }
    out
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Makes `tests/fixtures/store-format-1.redb` and its expected reads with the build of
/// format 1 (run once, by hand, on that build: `cargo test --test store_format --
/// --ignored make_format_1_fixture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "makes the fixture; run by hand on a build of format 1"]
async fn make_format_1_fixture() {
    make_fixture(1).await;
}

/// Makes `tests/fixtures/store-format-2.redb` and its expected reads with the build of
/// format 2, as [`make_format_1_fixture`] (`-- --ignored make_format_2_fixture` on that
/// build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "makes the fixture; run by hand on a build of format 2"]
async fn make_format_2_fixture() {
    make_fixture(2).await;
}

/// Runs the fixture's runs on this build (`a` to its end, `b` to its wait) and writes the
/// store and its reads as the fixture of `format`, this build's format.
async fn make_fixture(format: u64) {
    assert_eq!(
        format,
        loops::STORE_FORMAT,
        "run it on the build of format {format}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let counts = Counts::default();
    let rt = runtime(&path, &counts).unwrap();
    for run in ["a", "b"] {
        let options = StartOptions::default().attribute("owner", "alice");
        rt.start_with(run, Job::Start { n: 7 }, options)
            .await
            .unwrap();
    }
    rt.send("a", Job::APPROVE, &"yes".to_owned()).await.unwrap();
    let done: Job = rt.wait("a").await.unwrap();
    assert_eq!(
        done,
        Job::Done {
            total: 43 * 43 + 43,
            note: "yes".to_owned()
        }
    );
    loop {
        let info = rt.run_info("b").await.unwrap().unwrap();
        if info.status == RunStatus::Waiting && !rt.store().steps("b", 2).await.unwrap().is_empty()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let lines = dump(&rt).await;
    rt.shutdown().await;
    rt.compact().await.unwrap();
    drop(rt);
    std::fs::create_dir_all(fixtures()).unwrap();
    std::fs::copy(
        &path,
        fixtures().join(format!("store-format-{format}.redb")),
    )
    .unwrap();
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(
        fixtures().join(format!("store-format-{format}.expected.txt")),
        text,
    )
    .unwrap();
}

/// The formats before this build's, each with a fixture.
const OLDER: [u64; 2] = [1, 2];

/// A copy of the fixture of `format` in a new directory.
fn fixture_copy(format: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    std::fs::copy(
        fixtures().join(format!("store-format-{format}.redb")),
        &path,
    )
    .unwrap();
    (dir, path)
}

/// What the build of `format` read of its fixture, with the fields `RunInfo` gained since
/// as an upgraded run reads them: `key_nonce: None` (its keys stay what they were).
fn expected(format: u64) -> Vec<String> {
    std::fs::read_to_string(fixtures().join(format!("store-format-{format}.expected.txt")))
        .unwrap()
        .lines()
        .map(with_no_key_nonce)
        .collect()
}

/// `line` with `, key_nonce: None` after each `RunInfo`'s last field before it, `parent`
/// (`None`, or `Some(..)` with its parentheses balanced).
fn with_no_key_nonce(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("parent: ") {
        let value = &rest[at + "parent: ".len()..];
        let len = if value.starts_with("None") {
            "None".len()
        } else {
            let mut depth = 0;
            value
                .char_indices()
                .find_map(|(i, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => return None,
                    }
                    (depth == 0).then_some(i + 1)
                })
                .expect("a parent's value closes")
        };
        let end = at + "parent: ".len() + len;
        out.push_str(&rest[..end]);
        out.push_str(", key_nonce: None");
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn refused_as_older(path: &Path, format: u64) {
    let counts = Counts::default();
    match runtime(path, &counts) {
        Err(
            e @ Error::StoreFormat {
                found,
                supported: 3,
                ..
            },
        ) if found == format => {
            let text = e.to_string();
            assert_eq!(
                text,
                format!(
                    "store {0} has format {format}, which this build does not read (it reads format 3): run `loops upgrade {0}` to convert it to format 3 (it keeps a backup)",
                    path.display()
                )
            );
            assert!(!text.contains('\n'));
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("opened a store of format {format}"),
    }
}

#[test]
fn a_store_of_an_older_format_is_refused_with_a_line_naming_loops_upgrade() {
    for format in OLDER {
        let (_dir, path) = fixture_copy(format);
        refused_as_older(&path, format);
        // Read-only too; nothing of loops was written (redb's writable open marks its
        // header, as any does): it is refused again.
        assert!(matches!(
            loops::RedbStore::open_read_only(&path),
            Err(Error::StoreFormat { found, .. }) if found == format
        ));
        refused_as_older(&path, format);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_store_of_format_1_reads_as_it_did_and_its_waiting_run_ends() {
    upgraded_reads_as_before_and_its_waiting_run_ends(1, 23).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_store_of_format_2_reads_as_it_did_and_its_waiting_run_ends() {
    upgraded_reads_as_before_and_its_waiting_run_ends(2, 0).await;
}

/// Upgrades the fixture of `format` (`moved`: the records it moves to the log), checks
/// every read against what the build of that format read, then ends its waiting run.
async fn upgraded_reads_as_before_and_its_waiting_run_ends(format: u64, moved: u64) {
    let (dir, path) = fixture_copy(format);
    let upgraded = loops::RedbStore::upgrade(&path).unwrap();
    let backup = dir.path().join(format!("store.redb.format-{format}.bak"));
    assert_eq!(
        upgraded,
        loops::Upgraded::Converted {
            from: format,
            to: 3,
            backup: backup.clone(),
            runs: 3,
            records: moved,
        }
    );
    assert!(
        std::fs::read(&backup).unwrap()
            == std::fs::read(fixtures().join(format!("store-format-{format}.redb"))).unwrap(),
        "the backup is the file as it was"
    );
    let counts = Counts::default();
    let rt = runtime(&path, &counts).unwrap();
    let before = dump(&rt).await;
    assert_eq!(before, expected(format));
    // `b` waits for `approve` in `Approval` (its step `prepare` recorded): sent, it ends,
    // replaying what it recorded and running only what it had not.
    rt.send("b", Job::APPROVE, &"ok".to_owned()).await.unwrap();
    rt.resume_all().await.unwrap();
    let done: Job = rt.wait("b").await.unwrap();
    assert_eq!(
        done,
        Job::Done {
            total: 43 * 43 + 43,
            note: "ok".to_owned()
        }
    );
    // No step of `b` ran again; its child squared once, and `add` ran once.
    assert_eq!(counts.get(), [0, 0, 0, 1, 1]);
    let history = rt.history::<Job>("b").await.unwrap();
    let states: Vec<(u64, Job)> = history.into_iter().map(|t| (t.seq, t.value)).collect();
    assert_eq!(
        states,
        [
            (0, Job::Start { n: 7 }),
            (1, Job::Work { n: 7 }),
            (2, Job::Approval { n: 42 }),
            (
                3,
                Job::Finish {
                    n: 43,
                    note: "ok".to_owned()
                }
            ),
            (
                4,
                Job::Done {
                    total: 43 * 43 + 43,
                    note: "ok".to_owned()
                }
            ),
        ]
    );
    let steps: Vec<String> = rt
        .store()
        .steps("b", 2)
        .await
        .unwrap()
        .into_iter()
        .map(|(name, occurrence, _)| format!("{name}#{occurrence}"))
        .collect();
    assert_eq!(steps, ["loops:wait:approve#0", "prepare#0"]);
    assert_eq!(rt.store().failures("b").await.unwrap().len(), 1);
    // The runs that ended before the upgrade read as they did.
    let after = dump(&rt).await;
    let of_a = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l.starts_with("a ") || l.starts_with("a/child "))
            .cloned()
            .collect()
    };
    assert_eq!(of_a(&after), of_a(&expected(format)));
    rt.shutdown().await;
    drop(rt);
    // Every step in one walk (what `loops history` reads) is every seq's steps, in order.
    let store = loops::RedbStore::open_read_only(&path).unwrap();
    for run in RUNS {
        let seqs = store.history(run).unwrap().into_iter().map(|t| t.seq);
        let mut each = Vec::new();
        for seq in seqs {
            for (name, occurrence, record) in store.steps(run, seq).unwrap() {
                each.push((seq, name, occurrence, record.output.get().to_owned()));
            }
        }
        let walked: Vec<_> = store
            .all_steps(run)
            .unwrap()
            .into_iter()
            .map(|(seq, name, occurrence, record)| {
                (seq, name, occurrence, record.output.get().to_owned())
            })
            .collect();
        assert_eq!(walked, each, "run {run}");
    }
    assert_eq!(
        store
            .all_steps("b")
            .unwrap()
            .iter()
            .filter(|s| s.0 == 2)
            .count(),
        2
    );
}

#[test]
fn upgrading_twice_says_there_is_nothing_to_do() {
    for format in OLDER {
        let (_dir, path) = fixture_copy(format);
        assert!(matches!(
            loops::RedbStore::upgrade(&path).unwrap(),
            loops::Upgraded::Converted { .. }
        ));
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            loops::RedbStore::upgrade(&path).unwrap(),
            loops::Upgraded::Current { format: 3 }
        );
        assert!(std::fs::read(&path).unwrap() == bytes, "nothing written");
    }
}

#[test]
fn an_upgrade_refused_leaves_the_store_of_format_1_as_it_was() {
    let (dir, path) = fixture_copy(1);
    let original = std::fs::read(&path).unwrap();
    // A backup from before (as an upgrade interrupted after its copy leaves): kept as it
    // is; this upgrade's backup takes the next name.
    let backup = dir.path().join("store.redb.format-1.bak");
    std::fs::write(&backup, b"an earlier backup").unwrap();
    {
        let (dir, path) = fixture_copy(1);
        let earlier = dir.path().join("store.redb.format-1.bak");
        std::fs::write(&earlier, b"an earlier backup").unwrap();
        let next = dir.path().join("store.redb.format-1.bak.1");
        match loops::RedbStore::upgrade(&path).unwrap() {
            loops::Upgraded::Converted { backup, .. } => assert_eq!(backup, next),
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read(&earlier).unwrap(), b"an earlier backup");
        assert!(
            std::fs::read(&next).unwrap() == original,
            "the file as it was"
        );
        assert!(!dir.path().join("store.redb.format-1.bak.tmp").exists());
    }
    assert!(std::fs::read(&path).unwrap() == original, "nothing written");
    refused_as_older(&path, 1);
    std::fs::remove_file(&backup).unwrap();
    // Open elsewhere: refused, nothing done.
    {
        let _held = redb::Database::open(&path).unwrap();
        assert!(matches!(
            loops::RedbStore::upgrade(&path),
            Err(Error::StoreLocked { .. })
        ));
        assert!(!backup.exists());
    }
    refused_as_older(&path, 1);
}

#[test]
fn upgrading_a_missing_or_empty_file_says_so_in_the_words_of_the_other_opens() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.redb");
    let empty = dir.path().join("empty.redb");
    std::fs::write(&empty, b"").unwrap();
    for (path, why) in [
        (&missing, "no such file: there is nothing to upgrade"),
        (
            &empty,
            "the file is empty (0 bytes), not a loops store: there is nothing to upgrade",
        ),
    ] {
        let e = loops::RedbStore::upgrade(path).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("cannot open store {}: {why}", path.display())
        );
    }
    assert!(!missing.exists(), "nothing created");
    assert_eq!(std::fs::read(&empty).unwrap(), b"", "nothing written");
}

/// A damaged page that makes redb panic while it reads a file of an older format (a byte of
/// the format-1 fixture that helper-74 found): the upgrade refuses it as damage, and
/// neither copies nor converts it. Before, redb's panic reached the CLI's panic hook
/// ("redb cannot read it (called `Result::unwrap()` ...)", naming no store).
#[test]
fn an_upgrade_of_a_damaged_file_that_makes_redb_panic_is_refused_as_damage() {
    loops::silence_caught_redb_panics();
    let (dir, path) = fixture_copy(1);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[61_631] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let refused = loops::RedbStore::upgrade(&path).unwrap_err();
    assert!(
        matches!(&refused, Error::Open { path: p, .. } if *p == path) && refused.is_store_damage(),
        "{refused:?}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the file is unchanged"
    );
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(files.len(), 1, "no backup: {files:?}");
}
