//! Unit tests of [`plan`](super::plan): exact effects and refusals, without a store.

use super::*;
use crate::error::Error;

/// A row of run `run_id` with every field set.
pub(super) fn row(run_id: &str, status: RunStatus, seq: u64) -> RunInfo {
    RunInfo {
        run_id: run_id.to_owned(),
        workflow: "w".to_owned(),
        schema: crate::SchemaHash::from_u64(9),
        status,
        state: "A".to_owned(),
        seq,
        attempt: 2,
        attempt_base: 1,
        interrupted: 1,
        created_ms: 10,
        updated_ms: 20,
        retry_at_ms: Some(30),
        error: Some(vec!["boom".to_owned()]),
        cancel: None,
        wait: None,
        block: None,
        entered: None,
        parent: None,
        key_nonce: None,
    }
}

fn transition(seq: u64, terminal: bool) -> Write {
    Write::Transition {
        run_id: "r".to_owned(),
        seq,
        state: "B".to_owned(),
        record: b"{}".to_vec(),
        terminal,
        at_ms: 99,
        hands_over: false,
    }
}

#[test]
fn a_transition_moves_the_row_and_appends_its_record() {
    let current = row("r", RunStatus::Running, 3);
    let write = transition(4, true);
    let effects = plan(&write, Some(&current), &Facts::default()).unwrap();
    let expected = RunInfo {
        status: RunStatus::Completed,
        state: "B".to_owned(),
        seq: 4,
        attempt: 1,
        attempt_base: 0,
        interrupted: 0,
        updated_ms: 99,
        retry_at_ms: None,
        error: None,
        ..current.clone()
    };
    let new = effects.row().unwrap();
    assert_eq!(new.info, expected);
    assert_eq!(
        new.status_move(),
        Some((Some(RunStatus::Running), RunStatus::Completed))
    );
    assert_eq!(
        effects.records,
        vec![Record::Journal {
            seq: 4,
            bytes: std::borrow::Cow::Borrowed(b"{}")
        }]
    );
    assert!(effects.inbox.is_empty() && effects.schema.is_none() && effects.delete.is_empty());
    assert!(matches!(effects.into_reply(), Reply::Run(info) if info == expected));
}

#[test]
fn a_transition_is_refused_when_fenced_or_its_key_is_taken() {
    let current = row("r", RunStatus::Running, 3);
    match plan(&transition(5, false), Some(&current), &Facts::default()) {
        Err(Error::Fenced {
            run_id,
            seq: 4,
            current: 3,
            status: RunStatus::Running,
        }) => assert_eq!(run_id, "r"),
        other => panic!("expected Fenced, got {other:?}"),
    }
    let facts = Facts {
        record_taken: true,
        ..Facts::default()
    };
    match plan(&transition(4, false), Some(&current), &facts) {
        Err(Error::SequenceConflict { run_id, seq: 4 }) => assert_eq!(run_id, "r"),
        other => panic!("expected SequenceConflict, got {other:?}"),
    }
    match plan(&transition(4, false), None, &Facts::default()) {
        Err(Error::RunNotFound { run_id }) => assert_eq!(run_id, "r"),
        other => panic!("expected RunNotFound, got {other:?}"),
    }
}

#[test]
fn only_the_current_live_lease_may_write() {
    let current = row("r", RunStatus::Running, 3);
    let lease = Lease {
        run_id: "r".to_owned(),
        token: 7,
        expires_ms: Some(1),
    };
    let with = |token, live| {
        let facts = Facts {
            lease: Some(LeaseCheck {
                lease: &lease,
                current: Some(CurrentLease { token, live }),
            }),
            ..Facts::default()
        };
        plan(&transition(4, false), Some(&current), &facts).map(|e| e.records.len())
    };
    assert_eq!(with(7, true).unwrap(), 1);
    for (token, live) in [(8, true), (7, false)] {
        match with(token, live) {
            Err(Error::Fenced {
                seq: 3, current: 3, ..
            }) => {}
            other => panic!("expected Fenced, got {other:?}"),
        }
    }
}

#[test]
fn a_wait_takes_the_oldest_pending_event() {
    let current = row("r", RunStatus::Running, 3);
    let write = Write::Wait {
        run_id: "r".to_owned(),
        seq: 3,
        attempt: 2,
        step: Some(("w".to_owned(), 1)),
        event: Some("go".to_owned()),
        until_ms: Some(1_000),
        at_ms: 50,
    };
    let mut facts = Facts {
        pending: Some(PendingEvent {
            event_seq: 6,
            record: Some(event_record("go", None, 40, r#"{"n":1}"#)),
        }),
        ..Facts::default()
    };
    let effects = plan(&write, Some(&current), &facts).unwrap();
    let step = br#"{"attempt":2,"at_ms":50,"duration_ms":0,"output":{"event":{"seq":6,"payload":{"n":1}}}}"#;
    assert_eq!(
        effects.records,
        vec![Record::Step {
            seq: 3,
            name: "w",
            occurrence: 1,
            bytes: std::borrow::Cow::Owned(step.to_vec()),
        }]
    );
    assert_eq!(
        effects.inbox,
        vec![InboxChange::Deliver {
            event_seq: 6,
            name: "go"
        }]
    );
    let outcome = WaitOutcome::Delivered {
        event_seq: 6,
        payload: r#"{"n":1}"#.to_owned(),
    };
    assert!(matches!(effects.into_reply(), Reply::Waited(o, info)
        if o == outcome && info.status == RunStatus::Running && info.updated_ms == 50));
    // Without an event and before its time, the run parks.
    let effects = plan(&write, Some(&current), &Facts::default()).unwrap();
    assert!(effects.records.is_empty() && effects.inbox.is_empty());
    let parked = &effects.row().unwrap().info;
    assert_eq!(
        (parked.status, parked.wait.clone()),
        (
            RunStatus::Waiting,
            Some(WaitInfo {
                event: Some("go".to_owned()),
                until_ms: Some(1_000)
            })
        )
    );
    // An inbox entry without its record is refused.
    facts.pending = Some(PendingEvent {
        event_seq: 6,
        record: None,
    });
    match plan(&write, Some(&current), &facts) {
        Err(Error::RecordMissing { run_id, seq: 6 }) => assert_eq!(run_id, "r"),
        other => panic!("expected RecordMissing, got {other:?}"),
    }
}

#[test]
fn a_second_send_with_a_key_stores_nothing() {
    let current = row("r", RunStatus::Waiting, 3);
    let write = Write::Send {
        run_id: "r".to_owned(),
        name: "go".to_owned(),
        payload: "1".to_owned(),
        key: Some("k".to_owned()),
        at_ms: 5,
    };
    let mut facts = Facts {
        next_event_seq: 4,
        ..Facts::default()
    };
    let first = plan(&write, Some(&current), &facts).unwrap();
    assert_eq!(
        first.inbox,
        vec![InboxChange::Append {
            event_seq: 4,
            name: "go",
            key: Some("k"),
            record: br#"{"name":"go","key":"k","at_ms":5,"payload":1}"#.to_vec(),
        }]
    );
    assert!(first.row().is_none());
    facts.key_seen = Some(2);
    let again = plan(&write, Some(&current), &facts).unwrap();
    assert!(again.is_empty());
    assert!(matches!(
        again.into_reply(),
        Reply::Sent {
            event_seq: 2,
            duplicate: true,
            ..
        }
    ));
}

#[test]
fn prune_deletes_only_ended_runs() {
    let write = Write::Prune {
        run_ids: vec!["a".to_owned(), "b".to_owned(), "c".to_owned()],
    };
    assert_eq!(write.needs().runs.len(), 3);
    let facts = Facts {
        runs: vec![
            row("a", RunStatus::Completed, 2),
            row("b", RunStatus::Running, 5),
            row("c", RunStatus::Cancelled, 0),
        ],
        ..Facts::default()
    };
    let effects = plan(&write, None, &facts).unwrap();
    let deleted: Vec<&str> = effects.delete.iter().map(|i| i.run_id.as_str()).collect();
    assert_eq!(deleted, ["a", "c"]);
    assert!(matches!(
        effects.into_reply(),
        Reply::Pruned { records: 4, .. }
    ));
}

/// A prune deletes a family (runs linked by parent links among its runs) whole or not at
/// all: a parent retried after the selection keeps its ended child and grandchild; a child
/// retried keeps its ended parent; another family goes; the reply names what went, in the
/// write's order.
#[test]
fn prune_keeps_a_family_with_a_run_that_has_not_ended() {
    let child = |id: &str, parent: &str, status: RunStatus| RunInfo {
        parent: Some(crate::row::ParentLink {
            run_id: parent.to_owned(),
            on_cancel: crate::row::OnParentCancel::Cancel,
        }),
        ..row(id, status, 1)
    };
    let ids = ["p", "p/c", "p/c/g", "q", "q/c", "r", "r/c"];
    let write = Write::Prune {
        run_ids: ids.iter().map(|id| (*id).to_owned()).collect(),
    };
    let facts = Facts {
        runs: vec![
            child("p/c/g", "p/c", RunStatus::Completed),
            row("p", RunStatus::Running, 1),
            child("p/c", "p", RunStatus::Completed),
            row("q", RunStatus::Completed, 1),
            child("q/c", "q", RunStatus::Running),
            child("r/c", "r", RunStatus::Failed),
            row("r", RunStatus::Completed, 1),
        ],
        ..Facts::default()
    };
    let effects = plan(&write, None, &facts).unwrap();
    let deleted: Vec<&str> = effects.delete.iter().map(|i| i.run_id.as_str()).collect();
    assert_eq!(deleted, ["r", "r/c"]);
    match effects.into_reply() {
        Reply::Pruned { records, run_ids } => {
            assert_eq!(
                (records, run_ids),
                (4, vec!["r".to_owned(), "r/c".to_owned()])
            );
        }
        other => panic!("{other:?}"),
    }
}

/// A prune keeps a family with a child the write does not name (started by a parent retried
/// after the selection): the family whose grandchild has a child outside the write stays
/// whole; the family whose children are all named goes.
#[test]
fn prune_keeps_a_family_with_a_child_outside_the_write() {
    let child = |id: &str, parent: &str| RunInfo {
        parent: Some(crate::row::ParentLink {
            run_id: parent.to_owned(),
            on_cancel: crate::row::OnParentCancel::Cancel,
        }),
        ..row(id, RunStatus::Completed, 1)
    };
    let write = Write::Prune {
        run_ids: ["p", "p/c", "q", "q/c"].map(str::to_owned).to_vec(),
    };
    assert!(write.needs().children_of_runs);
    let link = |parent: &str, child: &str| (parent.to_owned(), child.to_owned());
    let facts = Facts {
        runs: vec![
            row("p", RunStatus::Completed, 1),
            child("p/c", "p"),
            row("q", RunStatus::Completed, 1),
            child("q/c", "q"),
        ],
        children_of_runs: vec![link("p", "p/c"), link("p/c", "p/c/new"), link("q", "q/c")],
        ..Facts::default()
    };
    let effects = plan(&write, None, &facts).unwrap();
    let deleted: Vec<&str> = effects.delete.iter().map(|i| i.run_id.as_str()).collect();
    assert_eq!(deleted, ["q", "q/c"]);
    assert!(matches!(
        effects.into_reply(),
        Reply::Pruned { records: 4, .. }
    ));
}

/// [`Effects::wakes`], for each kind of write that can make a run ready and for writes that
/// do not: set only when the run needs a driver afterwards that it did not need before (or
/// an event it waits for arrives), and never for a write under the run's lease.
#[test]
fn a_write_wakes_other_workers_only_when_it_makes_the_run_ready() {
    let waiting = |event: &str| RunInfo {
        wait: Some(WaitInfo {
            event: Some(event.to_owned()),
            until_ms: None,
        }),
        ..row("r", RunStatus::Waiting, 3)
    };
    let send = |name: &str| Write::Send {
        run_id: "r".to_owned(),
        name: name.to_owned(),
        payload: "1".to_owned(),
        key: None,
        at_ms: 5,
    };
    let wakes = |write: &Write, before: Option<&RunInfo>| {
        plan(write, before, &Facts::default()).unwrap().wakes
    };
    // An event the parked run waits for arrives; another event does not wake it.
    assert!(wakes(&send("go"), Some(&waiting("go"))));
    assert!(!wakes(&send("other"), Some(&waiting("go"))));
    // A send to a running run: its driver takes the event at its next wait.
    assert!(!wakes(&send("go"), Some(&row("r", RunStatus::Running, 3))));
    // A cancellation of a waiting run makes it ready (its driver ends it); one that ends
    // it at once does not.
    let cancel = |end_now| Write::Cancel {
        run_id: "r".to_owned(),
        reason: "stop".to_owned(),
        end_now,
        at_ms: 5,
    };
    assert!(wakes(&cancel(false), Some(&waiting("go"))));
    assert!(!wakes(&cancel(true), Some(&waiting("go"))));
    // A running run that is cancelled was ready already.
    assert!(!wakes(
        &cancel(false),
        Some(&row("r", RunStatus::Running, 3))
    ));
    // A retry makes a failed run running.
    let retry = Write::Retry {
        run_id: "r".to_owned(),
        at_ms: 5,
    };
    assert!(wakes(&retry, Some(&row("r", RunStatus::Failed, 3))));
    // A transition of a running run changes nothing of its readiness.
    assert!(!wakes(
        &transition(4, false),
        Some(&row("r", RunStatus::Running, 3))
    ));
    // A run created without a lease needs a driver; with the lease, its creator drives it.
    let info = RunInfo {
        retry_at_ms: None,
        error: None,
        ..row("r", RunStatus::Running, 0)
    };
    let create = Write::Create {
        info,
        record: b"{}".to_vec(),
        schema_text: "s",
        attributes: Vec::new(),
    };
    assert!(wakes(&create, None));
    // A creation reads its row unlocked: a refused one must not hold back the claims it woke.
    assert!(create.needs().run_unlocked);
    assert!(!transition(4, false).needs().run_unlocked);
    let lease = Lease {
        run_id: "r".to_owned(),
        token: 7,
        expires_ms: Some(1),
    };
    let leased = Facts {
        lease: Some(LeaseCheck {
            lease: &lease,
            current: Some(CurrentLease {
                token: 7,
                live: true,
            }),
        }),
        ..Facts::default()
    };
    assert!(!plan(&create, None, &leased).unwrap().wakes);
    // A wake under the driver's lease: the driver goes on itself.
    let wake = Write::Wake {
        run_id: "r".to_owned(),
        seq: 3,
        at_ms: 5,
    };
    let woken = plan(&wake, Some(&waiting("go")), &leased).unwrap();
    assert_eq!(
        (woken.row().map(|r| r.info.status), woken.wakes),
        (Some(RunStatus::Running), false)
    );
    // A refused write has no effects at all.
    let ended = row("r", RunStatus::Completed, 3);
    assert!(plan(&send("go"), Some(&ended), &Facts::default()).is_err());
}

fn child_of(parent: &str, on_cancel: crate::OnParentCancel) -> Option<crate::ParentLink> {
    Some(crate::ParentLink {
        run_id: parent.to_owned(),
        on_cancel,
    })
}

#[test]
fn a_childs_end_sends_child_ended_to_its_parent_and_nothing_else_does() {
    let child = RunInfo {
        parent: child_of("p", crate::OnParentCancel::Cancel),
        ..row("r", RunStatus::Running, 3)
    };
    // A transition that does not end the child: no follow-up.
    let (inner, last) = (transition(4, false), transition(4, true));
    let effects = plan(&inner, Some(&child), &Facts::default()).unwrap();
    assert!(effects.follow_ups.is_empty());
    // The terminal transition: one Send to the parent, at the child's commit time.
    let effects = plan(&last, Some(&child), &Facts::default()).unwrap();
    match effects.follow_ups.as_slice() {
        [
            Write::Send {
                run_id,
                name,
                payload,
                key,
                at_ms,
            },
        ] => assert_eq!(
            (
                run_id.as_str(),
                name.as_str(),
                payload.as_str(),
                key.as_deref(),
                *at_ms
            ),
            ("p", crate::CHILD_ENDED, r#"{"child":"r"}"#, None, 99)
        ),
        other => panic!("expected one Send, got {other:?}"),
    }
    // A run without a parent ends without a follow-up.
    let orphan = row("r", RunStatus::Running, 3);
    let effects = plan(&last, Some(&orphan), &Facts::default()).unwrap();
    assert!(effects.follow_ups.is_empty());
}

#[test]
fn a_cancel_cancels_the_children_whose_policy_is_cancel() {
    let parent = row("p", RunStatus::Running, 1);
    let kid = |id: &str, status, on_cancel| RunInfo {
        parent: child_of("p", on_cancel),
        ..row(id, status, 0)
    };
    let facts = Facts {
        children: vec![
            kid("a", RunStatus::Waiting, crate::OnParentCancel::Cancel),
            kid("b", RunStatus::Running, crate::OnParentCancel::Cancel),
            kid("c", RunStatus::Waiting, crate::OnParentCancel::Abandon),
        ],
        ..Facts::default()
    };
    let write = Write::Cancel {
        run_id: "p".to_owned(),
        reason: "stop".to_owned(),
        end_now: false,
        at_ms: 50,
    };
    assert!(write.needs().children);
    let effects = plan(&write, Some(&parent), &facts).unwrap();
    let cascaded: Vec<(&str, &str, bool, u64)> = effects
        .follow_ups
        .iter()
        .map(|w| match w {
            Write::Cancel {
                run_id,
                reason,
                end_now,
                at_ms,
            } => (run_id.as_str(), reason.as_str(), *end_now, *at_ms),
            other => panic!("expected a Cancel, got {other:?}"),
        })
        .collect();
    let reason = "parent run `p` was cancelled";
    assert_eq!(
        cascaded,
        [("a", reason, true, 50), ("b", reason, false, 50)]
    );
}

/// A second cancellation of a run being cancelled keeps the first reason; one that ends the
/// run at once still ends it.
#[test]
fn a_second_cancellation_keeps_the_first_reason() {
    let cancel = |reason: &str, end_now| Write::Cancel {
        run_id: "r".to_owned(),
        reason: reason.to_owned(),
        end_now,
        at_ms: 5,
    };
    let applied = |write: &Write, before: &RunInfo| -> RunInfo {
        match plan(write, Some(before), &Facts::default())
            .unwrap()
            .into_row_and_reply()
            .0
        {
            Some(row) => row.info,
            None => panic!("no row written"),
        }
    };
    let first = applied(
        &cancel("operator stop", false),
        &row("r", RunStatus::Running, 3),
    );
    assert_eq!(
        (first.status, first.cancel.as_deref()),
        (RunStatus::Running, Some("operator stop"))
    );
    // Asked again: nothing is written, and the answer is the row as it was.
    let write = cancel("again", false);
    let again = plan(&write, Some(&first), &Facts::default()).unwrap();
    assert!(again.row().is_none());
    assert!(matches!(again.into_reply(), Reply::Run(info) if info == first));
    let now = applied(&cancel("now", true), &first);
    assert_eq!(
        (now.status, now.cancel.as_deref()),
        (RunStatus::Cancelled, Some("operator stop"))
    );
}
