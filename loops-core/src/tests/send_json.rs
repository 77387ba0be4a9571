//! `Runtime::send_json`'s check of a payload that came as a `RawValue`: its parse checks the
//! syntax only, so a string's lone surrogate escape gets this far, and is refused as not
//! JSON (never as a mismatch with an empty shape), whether or not the workflow declares
//! events.

use loops_derive::{Schema, Workflow};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{Job, temp_store};
use crate::*;

/// Waits for an approval, and ends with its approver.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "gate", crate = crate)]
#[event(approve: Approval)]
enum Gate {
    #[initial]
    #[next(Done)]
    Ask,
    #[terminal]
    Done { by: String },
}

struct Approver;

impl GateHandler for Approver {
    type Error = Error;
    async fn ask(&self, ctx: &Context) -> Result<AskNext> {
        let approval = ctx.wait_for(Gate::APPROVE).await?;
        Ok(AskNext::Done { by: approval.by })
    }
}

#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[schema(crate = crate)]
struct Approval {
    by: String,
}

/// A runtime on a new store with run `gate` of [`Gate`] (declares `approve`) in `Ask`, and
/// run `job` of [`Job`] (declares no event) in `Start`.
fn seeded() -> (tempfile::TempDir, Runtime) {
    let (dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    let store = rt.redb().unwrap();
    store
        .__seed_history([("gate".to_owned(), Gate::Ask)])
        .unwrap();
    store
        .__seed_history([("job".to_owned(), Job::Start { n: 0 })])
        .unwrap();
    (dir, rt)
}

fn raw(text: &str) -> Box<RawValue> {
    serde_json::from_str(text).unwrap()
}

#[tokio::test]
async fn a_lone_surrogate_is_refused_as_not_json_whether_or_not_events_are_declared() {
    let (_dir, rt) = seeded();
    let problem = "unexpected end of hex escape at line 1 column 14";
    for (run, event, state) in [("gate", "approve", "Ask"), ("job", "go", "Start")] {
        let err = rt
            .send_json(run, event, None, &raw(r#"{"by":"\ud800"}"#))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "run `{run}` (state `{state}`, seq 0): event `{event}` refused: the payload is not valid JSON: {problem}"
            )
        );
        let Error::EventRefused { refusal, .. } = err else {
            panic!("expected EventRefused, got {err:?}");
        };
        assert_eq!(
            *refusal,
            EventRefusal::NotJson {
                problem: problem.to_owned()
            }
        );
        assert!(rt.store().events(run).await.unwrap().is_empty(), "{run}");
    }
    // A trailing surrogate alone, in a payload of the declared shape otherwise.
    let err = rt
        .send_json("gate", "approve", None, &raw(r#"{"by":"a\udc00"}"#))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "run `gate` (state `Ask`, seq 0): event `approve` refused: the payload is not valid JSON: lone leading surrogate in hex escape at line 1 column 14"
    );
    // A payload of another shape names the declared one.
    let err = rt
        .send_json("gate", "approve", None, &raw(r#"{"by":1}"#))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "run `gate` (state `Ask`, seq 0): event `approve` refused: the payload does not match event `approve`'s declared shape `Approval { by: String }`: `by`: expected a String, found the number 1"
    );
    // A pair of surrogates is one character: sent, and read by the run.
    let sent = rt
        .send_json("gate", "approve", None, &raw(r#"{"by":"\ud83d\ude00"}"#))
        .await
        .unwrap();
    assert_eq!((sent.event_seq, sent.duplicate), (0, false));
    let done = rt.run("gate", Gate::Ask, &Approver).await.unwrap();
    assert_eq!(
        done,
        Gate::Done {
            by: "\u{1F600}".to_owned()
        }
    );
}

/// A payload whose objects name a key twice is refused when it is sent, whether or not the
/// workflow declares events: a struct would refuse it only when the run takes it (the event
/// set aside after it was accepted), a map would keep one of the two. Nothing is stored.
#[tokio::test]
async fn a_payload_that_names_a_key_twice_is_refused_when_sent() {
    let (_dir, rt) = seeded();
    for (run, event, state, payload, at) in [
        (
            "gate",
            "approve",
            "Ask",
            r#"{"by":"a","by":"b"}"#,
            "line 1 column 14",
        ),
        (
            "job",
            "go",
            "Start",
            r#"[{"x":{"y":1,"y":2}}]"#,
            "line 1 column 16",
        ),
    ] {
        let err = rt
            .send_json(run, event, None, &raw(payload))
            .await
            .unwrap_err();
        let key = if run == "gate" { "by" } else { "y" };
        assert_eq!(
            err.to_string(),
            format!(
                "run `{run}` (state `{state}`, seq 0): event `{event}` refused: the payload names a key twice in one object: duplicate key `{key}` at {at}; send each key once"
            )
        );
        assert!(rt.store().events(run).await.unwrap().is_empty(), "{run}");
    }
    // The same key in two objects is no repeat.
    rt.send_json("job", "go", None, &raw(r#"[{"y":1},{"y":2}]"#))
        .await
        .unwrap();
    assert_eq!(rt.store().events("job").await.unwrap().len(), 1);
}

/// An idempotency key that starts or ends with white space or an invisible format character
/// is refused, whatever the path: keys are compared byte for byte, and a sender that trims
/// its key and one that does not would send the same request twice. Nothing is written.
#[tokio::test]
async fn a_key_with_white_space_at_either_end_is_refused() {
    let (_dir, rt) = seeded();
    for key in [
        "k ",
        " k",
        "k\u{a0}",
        "\u{3000}k",
        "k\u{200b}",
        "\u{feff}k",
        "k\u{2060}",
    ] {
        let err = rt
            .send_json("job", "go", Some(key), &raw("1"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidName { what: "idempotency key", name, .. } if name == key),
            "{key:?}: {err:?}"
        );
        let typed = rt.send_with_key("job", "go", key, &1).await.unwrap_err();
        assert!(matches!(typed, Error::InvalidName { .. }), "{typed:?}");
    }
    // Inner white space is part of the key (a joiner inside an emoji too).
    let sent = rt
        .send_json(
            "job",
            "go",
            Some("a key \u{1f468}\u{200d}\u{1f4bb}"),
            &raw("1"),
        )
        .await
        .unwrap();
    assert_eq!((sent.event_seq, sent.duplicate), (0, false));
    assert_eq!(rt.store().events("job").await.unwrap().len(), 1);
}
