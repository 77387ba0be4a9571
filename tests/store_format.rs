//! The store file's format: a file of format 1 (journal, steps and failures keyed by run)
//! is refused at the open, upgraded by `upgrade` to format 2 (one append-only log), and
//! reads the same afterwards: every record of `tests/fixtures/store-format-1.redb`, made by
//! [`make_format_1_fixture`] with the build of format 1, equals what that build read
//! (`tests/fixtures/store-format-1.expected.txt`), and the run it left waiting resumes to
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
    std::fs::copy(&path, fixtures().join("store-format-1.redb")).unwrap();
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(fixtures().join("store-format-1.expected.txt"), text).unwrap();
}
