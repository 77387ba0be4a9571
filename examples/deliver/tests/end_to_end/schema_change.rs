//! A run recorded by the `deliver` example's version 1 (`--workflow-version 1`), resumed by a
//! build whose workflow changed shape: the same `#[workflow(name = "deliver", version = 1)]`
//! with one field added, and no migration. loops must refuse it with `Error::SchemaMismatch`:
//! with the strict check at open, leaving the file's bytes as they were; when it is driven,
//! marking the run blocked (once, with the change) and writing nothing else.

use loops::{Context, Error, Runtime, SchemaHash, StateId as _, Workflow};

use crate::common::{STOP_VAR, deliver_in, describe};

/// The example's own workflow, compiled into this test: the build that recorded the run.
#[path = "../../workflow.rs"]
#[allow(dead_code)]
pub(crate) mod recorded;

/// The example's workflow with one field added (`Received::priority`); nothing else differs.
mod changed {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    use super::recorded::{Base, Change, Issue, TestReport, Work};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "deliver", version = 1)]
    pub enum Deliver {
        #[initial]
        #[next(Planned, Abandoned)]
        Received {
            issue: Issue,
            base: Base,
            priority: u8,
        },
        #[next(Edited)]
        Planned {
            issue: Issue,
            base: Base,
            plan: Change,
        },
        #[next(Tested)]
        Edited {
            issue: Issue,
            work: Work,
            round: u32,
        },
        #[next(Edited, PrOpened, Abandoned)]
        Tested {
            issue: Issue,
            work: Work,
            round: u32,
            report: TestReport,
        },
        #[terminal]
        PrOpened {
            number: u64,
            url: String,
            branch: String,
            head: String,
        },
        #[terminal]
        Abandoned { reason: String },
    }
}

/// Another workflow of the name `deliver`: its first state holds no `base`, which the example
/// reads from a run's first record. (`Done` is declared, never reached.)
#[allow(dead_code)]
mod another {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "deliver", version = 1)]
    pub enum Deliver {
        #[initial]
        #[next(Done)]
        Received { note: String },
        #[terminal]
        Done,
    }
}

/// A handler for the changed workflow that must never run.
struct MustNotRun;

impl changed::DeliverHandler for MustNotRun {
    type Error = anyhow::Error;

    async fn received(
        &self,
        _: &Context,
        _: recorded::Issue,
        _: recorded::Base,
        _: u8,
    ) -> anyhow::Result<changed::ReceivedNext> {
        anyhow::bail!("the changed build ran a handler")
    }
    async fn planned(
        &self,
        _: &Context,
        _: recorded::Issue,
        _: recorded::Base,
        _: recorded::Change,
    ) -> anyhow::Result<changed::PlannedNext> {
        anyhow::bail!("the changed build ran a handler")
    }
    async fn edited(
        &self,
        _: &Context,
        _: recorded::Issue,
        _: recorded::Work,
        _: u32,
    ) -> anyhow::Result<changed::EditedNext> {
        anyhow::bail!("the changed build ran a handler")
    }
    async fn tested(
        &self,
        _: &Context,
        _: recorded::Issue,
        _: recorded::Work,
        _: u32,
        _: recorded::TestReport,
    ) -> anyhow::Result<changed::TestedNext> {
        anyhow::bail!("the changed build ran a handler")
    }
}

const RUN_ID: &str = "recorded-1";
/// The example stops at the entry of this seq (`Tested`, one test still failing).
const STOP_AT: u64 = 3;

/// Checks that `err` is the refusal of run `deliver-1`, and returns (stored, compiled).
fn expect_mismatch(err: &Error) -> (SchemaHash, SchemaHash) {
    let Error::SchemaMismatch {
        run_id,
        workflow,
        stored,
        compiled,
        changes,
    } = err
    else {
        panic!("expected SchemaMismatch, got: {err}");
    };
    assert_eq!(run_id, RUN_ID);
    assert_eq!(workflow, "deliver");
    assert_eq!(*stored, recorded::v1::Deliver::SCHEMA_HASH.pinned());
    assert_eq!(*compiled, changed::Deliver::SCHEMA_HASH.pinned());
    assert_ne!(stored, compiled);
    assert_eq!(changes.len(), 1, "one change: {changes:?}");
    assert_eq!(
        changes.texts(),
        ["state `Received`: field `priority: u8` added"]
    );
    // No default, not an `Option`: runs recorded before cannot supply it.
    assert_eq!(changes.changes()[0].class, loops::Class::Breaking);
    let message = err.to_string();
    assert!(
        message.contains(RUN_ID)
            && message.contains(&stored.to_string())
            && message.contains(&compiled.to_string()),
        "{message}"
    );
    (*stored, *compiled)
}

/// A first state of the changed workflow (never used: the run exists).
fn initial_of_changed() -> changed::Deliver {
    changed::Deliver::Received {
        issue: recorded::Issue {
            number: 1,
            title: "t".into(),
            body: "b".into(),
        },
        base: recorded::Base {
            branch: "main".into(),
            commit: "0".repeat(40),
        },
        priority: 1,
    }
}

#[tokio::test]
async fn a_changed_workflow_is_refused_and_the_run_blocked_with_nothing_else_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A run of version 1, alone in a new demo, goes to seq 3 and stops there.
    let output = deliver_in(dir.path())
        .args(["--workflow-version", "1", "--run-id", RUN_ID])
        .env(STOP_VAR, STOP_AT.to_string())
        .output()
        .expect("run the example");
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("stopping at seq 3"),
        "{}",
        describe(&output)
    );
    let store = dir.path().join("deliver.redb");
    let bytes = std::fs::read(&store).expect("read the store");

    // Declared up front with the strict check: refused at open, before the file is opened
    // for writing.
    let err = Runtime::builder()
        .workflow::<changed::Deliver>()
        .strict_schemas(true)
        .open(&store)
        .expect_err("a changed workflow must be refused");
    let refused = expect_mismatch(&err);
    assert!(
        std::fs::read(&store).expect("read the store") == bytes,
        "the refused open changed the store file"
    );

    // Not declared: refused when the run is driven, without a record; the run is blocked.
    let runtime = Runtime::open(&store).expect("open the store");
    let info = runtime
        .run_info(RUN_ID)
        .await
        .expect("run info")
        .expect("the run");
    assert_eq!((info.seq, info.state.as_str()), (STOP_AT, "Tested"));
    let history = runtime
        .store()
        .history(RUN_ID)
        .await
        .expect("history")
        .len();
    let failures = runtime
        .store()
        .failures(RUN_ID)
        .await
        .expect("failures")
        .len();
    assert_eq!(history as u64, STOP_AT + 1);
    let err = runtime
        .run(RUN_ID, initial_of_changed(), &MustNotRun)
        .await
        .expect_err("a changed workflow must not drive the run");
    assert_eq!(expect_mismatch(&err), refused);
    assert_eq!(
        runtime
            .store()
            .history(RUN_ID)
            .await
            .expect("history")
            .len(),
        history
    );
    assert_eq!(
        runtime
            .store()
            .failures(RUN_ID)
            .await
            .expect("failures")
            .len(),
        failures
    );
    let blocked = runtime
        .run_info(RUN_ID)
        .await
        .expect("run info")
        .expect("the run");
    assert_eq!(
        (blocked.status, blocked.seq, blocked.state.as_str()),
        (loops::RunStatus::Blocked, info.seq, "Tested")
    );
    let block = blocked.block.clone().expect("why it is blocked");
    assert_eq!(
        (block.schema, block.resume, block.changes.clone()),
        (
            refused.0,
            loops::RunStatus::Running,
            vec![format!(
                "state `Received`: field `priority: u8` added (breaking: records written before \
                 lack it; give it `#[serde(default)]` or make it an `Option`, then list the old \
                 schema in the workflow's `accepts = [\"{}\"]`)",
                refused.0
            )]
        )
    );
    // Refused again: nothing more is written.
    let err = runtime
        .run(RUN_ID, initial_of_changed(), &MustNotRun)
        .await
        .expect_err("refused again");
    assert_eq!(expect_mismatch(&err), refused);
    assert_eq!(
        runtime.run_info(RUN_ID).await.expect("run info"),
        Some(blocked)
    );
    drop(runtime);

    // Control: the build that recorded the run opens the same file and reads the run.
    let runtime = Runtime::builder()
        .workflow::<recorded::v1::Deliver>()
        .open(&store)
        .expect("the recording build opens its store");
    let (seq, state) = runtime
        .state::<recorded::v1::Deliver>(RUN_ID)
        .await
        .expect("read the state")
        .expect("the run");
    assert_eq!(seq, STOP_AT);
    assert_eq!(state.state().name(), "Tested");
}

/// A run recorded by another workflow of the same name, whose first record the example cannot
/// read, is refused as any run of a schema the build does not know: blocked, with what
/// changed, and nothing prepared for it (no demo repository is made).
#[tokio::test]
async fn a_run_of_another_workflow_named_deliver_is_blocked_with_its_changes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("shared.redb");
    let runtime = Runtime::open(&store).expect("create the store");
    let first = another::Deliver::Received { note: "n".into() };
    let queued = runtime
        .enqueue("deliver-1", first, loops::StartOptions::default())
        .await
        .expect("record the run");
    runtime.shutdown().await;
    drop(runtime);

    let workdir = dir.path().join("work");
    let output = deliver_in(&workdir)
        .arg("--store")
        .arg(&store)
        .output()
        .expect("run the example");
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with(
            "error: run deliver-1 is blocked: this build cannot drive it, and leaves it as it \
             is for a build that can: "
        ),
        "{}",
        describe(&output)
    );
    assert!(
        stderr.contains(&another::Deliver::SCHEMA_HASH.pinned().to_string()),
        "{}",
        describe(&output)
    );
    assert!(!workdir.join("repo").exists(), "{}", describe(&output));

    let runtime = Runtime::open(&store).expect("open the store");
    let blocked = runtime
        .run_info("deliver-1")
        .await
        .expect("run info")
        .expect("the run");
    assert_eq!(
        (blocked.status, blocked.seq, blocked.state.as_str()),
        (loops::RunStatus::Blocked, 0, "Received")
    );
    let block = blocked.block.expect("why it is blocked");
    assert_eq!(
        (block.schema, block.resume),
        (queued.schema, loops::RunStatus::Running)
    );
    let removed = "state `Received`: field `note: String` removed (breaking: records written \
                   before hold it, and its data would be dropped (a migration can drop it))";
    assert!(block.changes.iter().any(|c| c == removed), "{block:?}");
    assert!(stderr.contains(removed), "{}", describe(&output));
}
