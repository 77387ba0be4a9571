//! The cases of events and waits: sends, idempotency keys, deliveries, deadlines, sleeps, and
//! the wake of a waiting run.

use crate::error::Error;
use crate::store::{RunStatus, WaitInfo, WaitOutcome};

use super::factory::Factory;
use super::support::{WF, create, ids, info, send, step_outputs, transition, wait};
use super::writes;

// This function is long because it is one story on one run (over 120 lines), each wait's expected outcome following from the
// events sent and delivered before it; cut in parts, each would repeat the sends before it.
pub(super) async fn events_and_waits(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let l = create(store, "r").await;
    assert!(matches!(
        send(store, "nope", "e", "1", None).await,
        Err(Error::RunNotFound { .. })
    ));
    assert_eq!(
        send(store, "r", "note", r#""n0""#, Some("k"))
            .await
            .unwrap(),
        (0, false)
    );
    assert_eq!(
        send(store, "r", "note", r#""again""#, Some("k"))
            .await
            .unwrap(),
        (0, true)
    );
    assert_eq!(
        send(store, "r", "note", r#""n1""#, None).await.unwrap(),
        (1, false)
    );
    assert!(store.has_pending("r", "note").await.unwrap());
    assert!(!store.has_pending("r", "approval").await.unwrap());
    // Nothing to deliver, no deadline: the run parks.
    let (outcome, row) = wait(
        store,
        &l,
        Some(("loops:wait:approval", 0)),
        Some("approval"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(outcome, WaitOutcome::Parked);
    assert_eq!(row.status, RunStatus::Waiting);
    assert_eq!(
        row.wait,
        Some(WaitInfo {
            event: Some("approval".into()),
            until_ms: None
        })
    );
    assert_eq!(
        ids(&store.list(RunStatus::Waiting, Some(WF)).await.unwrap()),
        vec!["r"]
    );
    assert!(store.steps("r", 0).await.unwrap().is_empty());
    // The oldest pending event of the name is delivered, and recorded as the wait's step.
    let (outcome, row) = wait(store, &l, Some(("loops:wait:note", 0)), Some("note"), None)
        .await
        .unwrap();
    assert_eq!(
        outcome,
        WaitOutcome::Delivered {
            event_seq: 0,
            payload: r#""n0""#.into()
        }
    );
    assert_eq!((row.status, row.wait.clone()), (RunStatus::Running, None));
    let steps = store.steps("r", 0).await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(
        (
            steps[0].0.as_str(),
            steps[0].1,
            steps[0].2.output.get(),
            steps[0].2.attempt
        ),
        (
            "loops:wait:note",
            0,
            r#"{"event":{"seq":0,"payload":"n0"}}"#,
            1
        )
    );
    // The same wait again is refused; nothing is delivered twice.
    assert!(matches!(
        wait(store, &l, Some(("loops:wait:note", 0)), Some("note"), None).await,
        Err(Error::StepExists { occurrence: 0, .. })
    ));
    let (outcome, _) = wait(store, &l, Some(("loops:wait:note", 1)), Some("note"), None)
        .await
        .unwrap();
    assert_eq!(
        outcome,
        WaitOutcome::Delivered {
            event_seq: 1,
            payload: r#""n1""#.into()
        }
    );
    assert!(!store.has_pending("r", "note").await.unwrap());
    // A deadline that passed, with nothing to deliver: due, recorded.
    let (outcome, _) = wait(
        store,
        &l,
        Some(("loops:wait:note", 2)),
        Some("note"),
        Some(9_000),
    )
    .await
    .unwrap();
    assert_eq!(outcome, WaitOutcome::Due);
    // A sleep (no step, no event) parks until its time, then is due.
    let (outcome, row) = wait(store, &l, None, None, Some(20_000)).await.unwrap();
    assert_eq!(outcome, WaitOutcome::Parked);
    assert_eq!(
        row.wait,
        Some(WaitInfo {
            event: None,
            until_ms: Some(20_000)
        })
    );
    let (outcome, row) = wait(store, &l, None, None, Some(10_000)).await.unwrap();
    assert_eq!(
        (outcome, row.status),
        (WaitOutcome::Due, RunStatus::Running)
    );
    let steps = step_outputs(store, "r", 0).await;
    assert_eq!(
        steps,
        vec![
            (
                "loops:wait:note".into(),
                0,
                r#"{"event":{"seq":0,"payload":"n0"}}"#.into()
            ),
            (
                "loops:wait:note".into(),
                1,
                r#"{"event":{"seq":1,"payload":"n1"}}"#.into()
            ),
            ("loops:wait:note".into(), 2, r#""due""#.into()),
        ]
    );
    let events: Vec<(u64, String, Option<String>, String, bool)> = store
        .events("r")
        .await
        .unwrap()
        .into_iter()
        .map(|(seq, e, delivered)| (seq, e.name, e.key, e.payload.get().to_owned(), delivered))
        .collect();
    assert_eq!(
        events,
        vec![
            (0, "note".into(), Some("k".into()), r#""n0""#.into(), true),
            (1, "note".into(), None, r#""n1""#.into(), true),
        ]
    );
    // An ended run takes no events; an event sent again with a key it took is a duplicate,
    // answered as the first send was (a client's retry after a lost answer).
    transition(store, &l, "r", 1, true).await.unwrap();
    assert!(matches!(
        send(store, "r", "note", "1", None).await,
        Err(Error::RunEnded {
            status: RunStatus::Completed,
            action: "sending an event",
            ..
        })
    ));
    assert_eq!(
        send(store, "r", "note", r#""again""#, Some("k"))
            .await
            .unwrap(),
        (0, true)
    );
    assert!(matches!(
        send(store, "r", "note", "1", Some("new")).await,
        Err(Error::RunEnded { .. })
    ));
    assert_eq!(store.events("r").await.unwrap().len(), 2);
}

pub(super) async fn wake(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let l = create(store, "r").await;
    let wake = |seq: u64| {
        let l = l.clone();
        async move {
            store
                .write(Some(&l), writes::wake("r", seq, 11_000))
                .await
                .unwrap()
                .into_run("r")
                .unwrap()
        }
    };
    // Not waiting: unchanged.
    assert_eq!(wake(0).await, info("r"));
    wait(store, &l, None, Some("e"), None).await.unwrap();
    // Another seq: unchanged.
    assert_eq!(wake(1).await.status, RunStatus::Waiting);
    let row = wake(0).await;
    assert_eq!(
        (row.status, row.wait, row.updated_ms),
        (RunStatus::Running, None, 11_000)
    );
}
