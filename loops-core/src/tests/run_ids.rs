//! The run id rules of a new run (`validate_run_id`) and of a lookup
//! (`validate_run_id_lookup`) where the runtime applies them: a new run, or a child, whose id
//! holds a bidirectional control or only invisible characters is refused with nothing
//! written; a run stored before those rules is still found, driven and steered by its id.

use loops_derive::Workflow;
use serde::{Deserialize, Serialize};

use super::{Job, Worker, temp_store};
use crate::*;

const BIDI: &str = "contains bidirectional control characters (Unicode Bidi_Control), which make text show in an order other than its own";

/// Starts the child named in its state, then ends.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "spawner", crate = crate)]
enum Spawner {
    #[initial]
    #[next(Spawned)]
    Spawn { child: String },
    #[terminal]
    Spawned,
}

struct Parent;

impl SpawnerHandler for Parent {
    type Error = Error;
    async fn spawn(&self, ctx: &Context, child: String) -> Result<SpawnNext> {
        ctx.start_child(&child, Job::Start { n: 0 }).await?;
        Ok(SpawnNext::Spawned)
    }
}

/// The reason of an `Error::InvalidRunId`, else a panic naming what came instead.
fn reason<T: std::fmt::Debug>(result: Result<T>) -> &'static str {
    match result {
        Err(Error::InvalidRunId { reason, .. }) => reason,
        other => panic!("expected InvalidRunId, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_run_is_refused_a_bidi_or_invisible_id_and_a_stored_one_is_still_reached() {
    let (_dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    let worker = Worker::default();
    // Two runs stored before the rules, as an older build let them be created.
    let (old, kept) = ("\u{202E}old", "\u{2066}kept\u{2069}");
    let seeded = [old, kept].map(|id| (id.to_owned(), Job::Start { n: 1 }));
    assert_eq!(rt.redb().unwrap().__seed_history(seeded).unwrap(), 2);
    let value = rt.run(old, Job::Start { n: 1 }, &worker).await.unwrap();
    assert_eq!(value, Job::Done { acc: 10 });
    assert_eq!(rt.send(kept, "go", &1).await.unwrap().event_seq, 0);
    let cancelled = rt.cancel(kept, "stored before the rule").await.unwrap();
    assert_eq!(cancelled.status, RunStatus::Cancelled);
    assert_eq!(rt.history::<Job>(kept).await.unwrap().len(), 1);

    // New ones: refused, nothing written.
    let new = "deliver-\u{202E}1-tset";
    assert_eq!(
        reason(rt.run(new, Job::Start { n: 0 }, &worker).await),
        BIDI
    );
    assert_eq!(rt.store().run_info(new).await.unwrap(), None);
    drop(rt);
    let rt = Runtime::builder()
        .register::<Job, _>(Worker::default())
        .open(&path)
        .unwrap();
    assert_eq!(
        reason(rt.start("\u{200B}\u{00AD}", Job::Start { n: 0 }).await),
        "holds only invisible characters (white space or Unicode format characters, Cf)"
    );
    assert_eq!(rt.store().run_info("\u{200B}\u{00AD}").await.unwrap(), None);
    // A joiner between visible characters (an emoji sequence) is a name like any other.
    let emoji = "deploy-\u{1F469}\u{200D}\u{1F4BB}";
    rt.start(emoji, Job::Start { n: 0 }).await.unwrap();
    assert_eq!(rt.wait::<Job>(emoji).await.unwrap(), Job::Done { acc: 0 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_is_refused_a_bidi_id_and_its_parent_fails_at_once() {
    let rt = Runtime::builder()
        .register::<Job, _>(Worker::default())
        .build(RedbStore::in_memory().unwrap());
    let child = "kid-\u{2067}1";
    let spawn = Spawner::Spawn {
        child: child.to_owned(),
    };
    let err = rt.run("parent", spawn, &Parent).await.unwrap_err();
    let Error::RunFailed {
        attempts,
        last_error,
        ..
    } = err
    else {
        panic!("expected RunFailed, got {err:?}");
    };
    assert_eq!(attempts, 1);
    assert_eq!(
        last_error,
        [format!("invalid run id \"kid-\\u{{2067}}1\": {BIDI}")]
    );
    assert_eq!(rt.store().run_info(child).await.unwrap(), None);
    assert!(rt.store().children("parent").await.unwrap().is_empty());
}
