//! Typed events (`#[event(name: Type)]`): the constants the derive generates, the events in
//! the schema description and hash, and the check of events sent from outside the program.

use loops::{Context, DeclaredEvents, Error, EventRefusal, RunStatus, Runtime, Schema, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Approval {
    by: String,
    note: Option<String>,
}

mod with_events {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "gate")]
    #[event(approve: Approval, reject: String)]
    pub enum Gate {
        #[initial]
        #[next(Done)]
        Open { n: u64 },
        #[terminal]
        Done { by: String },
    }
}

mod without_events {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "gate")]
    pub enum Gate {
        #[initial]
        #[next(Done)]
        Open { n: u64 },
        #[terminal]
        Done { by: String },
    }
}

use with_events::{Gate, GateHandler, OpenNext};

struct Handler;

impl GateHandler for Handler {
    type Error = loops::BoxError;
    async fn open(&self, ctx: &Context, _n: u64) -> Result<OpenNext, Self::Error> {
        // Typed: returns an `Approval`, no annotation needed.
        let approval = ctx.wait_for(Gate::APPROVE).await?;
        Ok(OpenNext::Done { by: approval.by })
    }
}

#[test]
fn the_constants_name_the_events() {
    assert_eq!(Gate::APPROVE.name(), "approve");
    assert_eq!(Gate::REJECT.name(), "reject");
}

#[test]
fn declared_events_are_described_and_hashed_and_no_events_keep_the_old_hash() {
    assert!(
        Gate::SCHEMA.ends_with(
            "event approve: Approval\n  by: String\n  note: Option<String>\nevent reject: String\n"
        ),
        "{}",
        Gate::SCHEMA
    );
    assert_ne!(Gate::SCHEMA_HASH, without_events::Gate::SCHEMA_HASH);
    // A workflow without events keeps the hash it had before events were described: the
    // pinned hashes of tests/schema.rs (written before) still hold.
    assert!(!without_events::Gate::SCHEMA.contains("event "));
}

#[test]
fn schema_diff_classes_events() {
    let diff = loops::schema_diff(without_events::Gate::SCHEMA, Gate::SCHEMA);
    assert_eq!(
        diff.texts(),
        [
            "event `approve: Approval` added",
            "event `reject: String` added"
        ]
    );
    assert!(diff.is_compatible(|_| true));
    let back = loops::schema_diff(Gate::SCHEMA, without_events::Gate::SCHEMA);
    assert_eq!(
        back.texts(),
        [
            "event `approve: Approval` removed",
            "event `reject: String` removed"
        ]
    );
    assert!(!back.is_compatible(|_| false));
    let retyped = Gate::SCHEMA.replace("event reject: String", "event reject: u64");
    let diff = loops::schema_diff(Gate::SCHEMA, &retyped);
    assert_eq!(
        diff.texts(),
        ["event `reject` retyped from `String` to `u64`"]
    );
    assert!(!diff.is_compatible(|_| false));
}

#[test]
fn payloads_are_checked_against_the_declared_shape() {
    let declared = DeclaredEvents::from_description(Gate::SCHEMA);
    assert_eq!(
        declared.to_string(),
        "approve: Approval { by: String, note: Option<String> }, reject: String"
    );
    let check =
        |event: &str, payload: serde_json::Value| declared.check(Gate::SCHEMA, event, &payload);
    assert_eq!(check("approve", serde_json::json!({"by": "alice"})), Ok(()));
    assert_eq!(
        check("approve", serde_json::json!({"by": "alice", "note": "ok"})),
        Ok(())
    );
    assert_eq!(check("reject", serde_json::json!("too big")), Ok(()));
    assert_eq!(
        check("aprove", serde_json::json!({"by": "alice"})),
        Err(EventRefusal::Undeclared {
            workflow: "gate".into(),
            event: "aprove".into(),
            declared: "approve: Approval { by: String, note: Option<String> }, reject: String"
                .into(),
        })
    );
    let refused = |problem: &str| EventRefusal::Payload {
        event: "approve".into(),
        shape: "Approval { by: String, note: Option<String> }".into(),
        problem: problem.into(),
    };
    assert_eq!(
        check("approve", serde_json::json!({"wrong": 1})),
        Err(refused("field `by` (String) is missing"))
    );
    assert_eq!(
        check("approve", serde_json::json!({"by": 1})),
        Err(refused("`by`: expected a String, found the number 1"))
    );
    assert_eq!(
        check("approve", serde_json::json!({"by": "a", "note": false})),
        Err(refused(
            "`note`: expected a String, found the boolean false"
        ))
    );
    assert_eq!(
        check("approve", serde_json::json!("alice")),
        Err(refused("expected an object, found a string"))
    );
    // A workflow without events refuses nothing.
    let none = DeclaredEvents::from_description(without_events::Gate::SCHEMA);
    assert!(none.is_empty());
    assert_eq!(
        none.check(
            without_events::Gate::SCHEMA,
            "anything",
            &serde_json::json!(1)
        ),
        Ok(())
    );
}

#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Verdict {
    Ship,
    Hold { reason: String },
}

#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Review {
    approval: Approval,
    verdict: Verdict,
    score: u8,
    ok: bool,
    tags: Vec<String>,
    pair: (u32, String),
    #[serde(skip_deserializing)]
    computed: u64,
}

mod reviewed {
    // Only its declared events are read: it is never run.
    #![allow(dead_code)]
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "reviewed")]
    #[event(review: Review, note: String, count: u64)]
    pub enum Reviewed {
        #[initial]
        #[next(Closed)]
        Reviewing,
        #[terminal]
        Closed,
    }
}
use reviewed::Reviewed;

#[test]
fn a_declared_event_gives_a_skeleton_of_its_payload_that_its_check_accepts() {
    let declared = DeclaredEvents::from_description(Gate::SCHEMA);
    let approve = declared.get("approve").unwrap();
    assert_eq!(
        approve.skeleton(),
        &serde_json::json!({"by": "", "note": null})
    );
    assert_eq!(
        declared.get("reject").unwrap().skeleton(),
        &serde_json::json!("")
    );
    let declared = DeclaredEvents::from_description(Reviewed::SCHEMA);
    let review = declared.get("review").unwrap().skeleton().clone();
    assert_eq!(
        review,
        serde_json::json!({
            "approval": {"by": "", "note": null},
            "verdict": "Ship",
            "score": 0,
            "ok": false,
            "tags": [],
            "pair": [0, ""],
        })
    );
    assert_eq!(
        declared.get("count").unwrap().skeleton(),
        &serde_json::json!(0)
    );
    // Each skeleton passes the check of its event, and deserializes as its type.
    for event in declared.events() {
        assert_eq!(
            declared.check(Reviewed::SCHEMA, &event.name, event.skeleton()),
            Ok(()),
            "{}",
            event.name
        );
    }
    let parsed: Review = serde_json::from_value(review).unwrap();
    assert_eq!(parsed.verdict, Verdict::Ship);
}

/// A runtime whose run `run_id` of `Gate` waits for its approval.
async fn waiting_gate(run_id: &str) -> Runtime {
    let runtime = Runtime::builder()
        .register::<Gate, _>(Handler)
        .build(loops::RedbStore::in_memory().unwrap());
    runtime.start(run_id, Gate::Open { n: 1 }).await.unwrap();
    runtime
        .wait_for_status(run_id, RunStatus::Waiting)
        .await
        .unwrap();
    runtime
}

#[tokio::test]
async fn typed_send_and_checked_send_json() {
    // Once it waits: a refused name, a refused payload: nothing written.
    let runtime = waiting_gate("g-1").await;
    let raw = |text: &str| serde_json::value::RawValue::from_string(text.to_owned()).unwrap();
    let err = runtime
        .send_json("g-1", "aprove", None, &raw(r#"{"by":"alice"}"#))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::EventRefused { run_id, state, seq: 0, event, refusal }
                if run_id == "g-1" && state == "Open" && event == "aprove"
                    && matches!(**refusal, EventRefusal::Undeclared { .. })
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "run `g-1` (state `Open`, seq 0): event `aprove` refused: workflow `gate` declares no \
         event `aprove`; it declares approve: Approval { by: String, note: Option<String> }, \
         reject: String"
    );
    let err = runtime
        .send_json("g-1", "approve", None, &raw(r#"{"wrong":1}"#))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::EventRefused { refusal, .. } if matches!(**refusal, EventRefusal::Payload { .. })
        ),
        "{err}"
    );
    let events = runtime.store().events("g-1").await.unwrap();
    assert!(events.is_empty(), "{events:?}");
    // The typed form: the compiler checks the payload's type.
    let approval = Approval {
        by: "alice".into(),
        note: None,
    };
    let sent = runtime.send("g-1", Gate::APPROVE, &approval).await.unwrap();
    assert_eq!(sent.event_seq, 0);
    let done: Gate = runtime.wait("g-1").await.unwrap();
    assert_eq!(done, Gate::Done { by: "alice".into() });
    runtime.shutdown().await;
}

/// `send` by a plain name checks the name and the payload as `send_json` does: a misspelt
/// name waited in the inbox for a wait that never came.
#[tokio::test]
async fn send_by_name_is_checked_against_the_declared_events() {
    let runtime = waiting_gate("g-2").await;
    let approval = Approval {
        by: "bob".into(),
        note: None,
    };
    let err = runtime.send("g-2", "aprove", &approval).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "run `g-2` (state `Open`, seq 0): event `aprove` refused: workflow `gate` declares no \
         event `aprove`; it declares approve: Approval { by: String, note: Option<String> }, \
         reject: String"
    );
    let err = runtime
        .send_with_key("g-2", "approve", "k-1", &serde_json::json!({"wrong": 1}))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::EventRefused { run_id, event, refusal, .. }
                if run_id == "g-2" && event == "approve"
                    && matches!(**refusal, EventRefusal::Payload { .. })
        ),
        "{err}"
    );
    let err = runtime
        .send("nobody", "approve", &approval)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::RunNotFound { run_id } if run_id == "nobody"),
        "{err}"
    );
    let events = runtime.store().events("g-2").await.unwrap();
    assert!(events.is_empty(), "{events:?}");
    // The declared name with a payload of its shape is taken.
    let sent = runtime
        .send_with_key("g-2", "approve", "k-2", &approval)
        .await
        .unwrap();
    assert_eq!((sent.event_seq, sent.duplicate), (0, false));
    let done: Gate = runtime.wait("g-2").await.unwrap();
    assert_eq!(done, Gate::Done { by: "bob".into() });
    // Ended, it takes no event: an undeclared name, a payload of the wrong shape and a
    // declared event are each refused as such (before, the first two were refused for their
    // name or shape, as if a fixed one could be sent); the keyed send it took is answered
    // again as the duplicate it is.
    let sends = [
        ("aprove", None, serde_json::json!({"by": "x"})),
        ("approve", None, serde_json::json!({"wrong": 1})),
        ("approve", None, serde_json::json!({"by": "x"})),
        ("approve", Some("k-3"), serde_json::json!({"by": "x"})),
    ];
    for (event, key, payload) in sends {
        let sent = match key {
            Some(key) => runtime.send_with_key("g-2", event, key, &payload).await,
            None => runtime.send("g-2", event, &payload).await,
        };
        assert!(
            matches!(
                &sent,
                Err(Error::RunEnded { run_id, status: RunStatus::Completed, action })
                    if run_id == "g-2" && *action == "sending an event"
            ),
            "{event} {key:?}: {sent:?}"
        );
    }
    let again = runtime
        .send_with_key("g-2", "approve", "k-2", &approval)
        .await
        .unwrap();
    assert_eq!((again.event_seq, again.duplicate), (0, true));
    runtime.shutdown().await;
}

/// A workflow that declares no events takes any name by `send`, as before.
#[tokio::test]
async fn send_by_name_to_a_workflow_without_events_takes_any_name() {
    struct Waits;
    impl without_events::GateHandler for Waits {
        type Error = loops::BoxError;
        async fn open(
            &self,
            ctx: &Context,
            _n: u64,
        ) -> Result<without_events::OpenNext, Self::Error> {
            let by: String = ctx.wait_for("anything").await?;
            Ok(without_events::OpenNext::Done { by })
        }
    }
    let runtime = Runtime::builder()
        .register::<without_events::Gate, _>(Waits)
        .build(loops::RedbStore::in_memory().unwrap());
    runtime
        .start("g-3", without_events::Gate::Open { n: 1 })
        .await
        .unwrap();
    let other = runtime.send("g-3", "other", &42u64).await.unwrap();
    assert_eq!(other.event_seq, 0);
    runtime.send("g-3", "anything", "carol").await.unwrap();
    let done: without_events::Gate = runtime.wait("g-3").await.unwrap();
    assert_eq!(done, without_events::Gate::Done { by: "carol".into() });
    runtime.shutdown().await;
}

mod strict {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "strict")]
    #[event(approve: Approval)]
    pub enum Strict {
        #[initial]
        #[next(Done)]
        Open { n: u64 },
        #[terminal]
        Done { by: String },
    }
}

/// A wait by a plain name that the workflow does not declare, when it declares events, fails
/// the run at its first attempt, naming the declared events: `send` refuses every such
/// event, so the run waited for ever.
#[tokio::test]
async fn a_wait_for_an_undeclared_name_fails_the_run_at_once() {
    struct Misspelt {
        entries: std::sync::atomic::AtomicU32,
    }
    impl strict::StrictHandler for Misspelt {
        type Error = loops::BoxError;
        async fn open(&self, ctx: &Context, _n: u64) -> Result<strict::OpenNext, Self::Error> {
            self.entries
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let approval: Approval = ctx.wait_for("aprove").await?;
            Ok(strict::OpenNext::Done { by: approval.by })
        }
    }
    let runtime = Runtime::builder()
        .register::<strict::Strict, _>(Misspelt {
            entries: Default::default(),
        })
        .build(loops::RedbStore::in_memory().unwrap());
    let handler = Misspelt {
        entries: Default::default(),
    };
    let err = runtime
        .run("s-1", strict::Strict::Open { n: 1 }, &handler)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::RunFailed { attempts: 1, .. }),
        "{err:?}"
    );
    assert_eq!(handler.entries.load(std::sync::atomic::Ordering::SeqCst), 1);
    let info = runtime.run_info("s-1").await.unwrap().unwrap();
    assert_eq!((info.status, info.attempt), (RunStatus::Failed, 1));
    assert_eq!(
        info.error.unwrap()[0],
        "run `s-1` (state `Open`, seq 0): event `aprove` refused: workflow `strict` declares no \
         event `aprove`; it declares approve: Approval { by: String, note: Option<String> }"
    );
    // Nothing was recorded for the wait.
    assert!(runtime.store().steps("s-1", 0).await.unwrap().is_empty());
    runtime.shutdown().await;
}
