//! Every [`Write`] the suite sends, built in this one place: one function per variant, taking
//! the variant's fields in their declared order. When the protocol's writes change shape,
//! this file is what follows them; the cases only call these.

use crate::attribute::AttributeValue;
use crate::record::{FailureRecord, TransitionRecord};
use crate::schema::SchemaHash;
use crate::store::{AfterFailure, RunInfo, Write};

/// The schema hash of the suite's runs (and of the records its transitions write).
pub(super) const HASH: SchemaHash = SchemaHash::from_u64(0x1234);

/// [`Write::Create`].
pub(super) fn create(info: RunInfo, record: Vec<u8>, schema_text: &'static str) -> Write {
    Write::Create {
        info,
        record,
        schema_text,
        attributes: Vec::new(),
    }
}

/// [`Write::Create`] with attributes.
pub(super) fn create_with(
    info: RunInfo,
    record: Vec<u8>,
    schema_text: &'static str,
    attributes: Vec<(String, AttributeValue)>,
) -> Write {
    Write::Create {
        info,
        record,
        schema_text,
        attributes,
    }
}

/// [`Write::SetAttributes`].
pub(super) fn set_attributes(
    run_id: &str,
    seq: u64,
    attributes: Vec<(String, AttributeValue)>,
) -> Write {
    Write::SetAttributes {
        run_id: run_id.to_owned(),
        seq,
        attributes,
    }
}

/// [`Write::Transition`].
pub(super) fn transition(
    run_id: &str,
    seq: u64,
    state: &str,
    record: Vec<u8>,
    terminal: bool,
    at_ms: u64,
) -> Write {
    Write::Transition {
        run_id: run_id.to_owned(),
        seq,
        state: state.to_owned(),
        record,
        terminal,
        at_ms,
        hands_over: false,
    }
}

/// [`Write::Step`].
pub(super) fn step(run_id: &str, seq: u64, name: &str, occurrence: u32, record: Vec<u8>) -> Write {
    step_clearing(run_id, seq, (name, occurrence), record, None)
}

/// [`Write::Step`] of a step whose earlier tries failed, recorded at `at_ms`.
pub(super) fn step_after_failed_tries(
    run_id: &str,
    seq: u64,
    (name, occurrence): (&str, u32),
    record: Vec<u8>,
    at_ms: u64,
) -> Write {
    step_clearing(run_id, seq, (name, occurrence), record, Some(at_ms))
}

/// [`Write::Step`] with its `clear_error_at_ms`.
fn step_clearing(
    run_id: &str,
    seq: u64,
    (name, occurrence): (&str, u32),
    record: Vec<u8>,
    clear_error_at_ms: Option<u64>,
) -> Write {
    Write::Step {
        run_id: run_id.to_owned(),
        seq,
        name: name.to_owned(),
        occurrence,
        record,
        clear_error_at_ms,
    }
}

/// [`Write::Failure`].
pub(super) fn failure(run_id: &str, seq: u64, record: FailureRecord, then: AfterFailure) -> Write {
    Write::Failure {
        run_id: run_id.to_owned(),
        seq,
        record,
        then,
    }
}

/// [`Write::BeginAttempt`].
pub(super) fn begin_attempt(
    run_id: &str,
    seq: u64,
    max_attempts: u32,
    max_interruptions: u32,
    at_ms: u64,
) -> Write {
    Write::BeginAttempt {
        run_id: run_id.to_owned(),
        seq,
        max_attempts,
        max_interruptions,
        at_ms,
    }
}

/// [`Write::Cancel`].
pub(super) fn cancel(run_id: &str, reason: &str, end_now: bool, at_ms: u64) -> Write {
    Write::Cancel {
        run_id: run_id.to_owned(),
        reason: reason.to_owned(),
        end_now,
        at_ms,
    }
}

/// [`Write::EndCancelled`].
pub(super) fn end_cancelled(run_id: &str, at_ms: u64) -> Write {
    Write::EndCancelled {
        run_id: run_id.to_owned(),
        at_ms,
    }
}

/// [`Write::Retry`].
pub(super) fn retry(run_id: &str, at_ms: u64) -> Write {
    Write::Retry {
        run_id: run_id.to_owned(),
        at_ms,
    }
}

/// [`Write::Wait`].
pub(super) fn wait(
    run_id: &str,
    seq: u64,
    attempt: u32,
    step: Option<(&str, u32)>,
    event: Option<&str>,
    until_ms: Option<u64>,
    at_ms: u64,
) -> Write {
    Write::Wait {
        run_id: run_id.to_owned(),
        seq,
        attempt,
        step: step.map(|(name, occurrence)| (name.to_owned(), occurrence)),
        event: event.map(str::to_owned),
        until_ms,
        at_ms,
    }
}

/// [`Write::Send`].
pub(super) fn send(
    run_id: &str,
    name: &str,
    payload: &str,
    key: Option<&str>,
    at_ms: u64,
) -> Write {
    Write::Send {
        run_id: run_id.to_owned(),
        name: name.to_owned(),
        payload: payload.to_owned(),
        key: key.map(str::to_owned),
        at_ms,
    }
}

/// [`Write::Wake`].
pub(super) fn wake(run_id: &str, seq: u64, at_ms: u64) -> Write {
    Write::Wake {
        run_id: run_id.to_owned(),
        seq,
        at_ms,
    }
}

/// [`Write::Block`].
pub(super) fn block(
    run_id: &str,
    schema: SchemaHash,
    reason: &str,
    changes: &[&str],
    at_ms: u64,
) -> Write {
    Write::Block {
        run_id: run_id.to_owned(),
        schema,
        reason: reason.to_owned(),
        changes: changes.iter().map(|c| (*c).to_owned()).collect(),
        at_ms,
    }
}

/// [`Write::Unblock`].
pub(super) fn unblock(run_id: &str, at_ms: u64) -> Write {
    Write::Unblock {
        run_id: run_id.to_owned(),
        at_ms,
    }
}

/// [`Write::Migrate`] into a state that is not terminal.
pub(super) fn migrate(
    run_id: &str,
    seq: u64,
    record: TransitionRecord,
    schema_text: &'static str,
) -> Write {
    Write::Migrate {
        run_id: run_id.to_owned(),
        seq,
        record,
        schema_text,
        terminal: false,
    }
}

/// [`Write::Migrate`] into a terminal state: the run ends there.
pub(super) fn migrate_into_terminal(
    run_id: &str,
    seq: u64,
    record: TransitionRecord,
    schema_text: &'static str,
) -> Write {
    let mut write = migrate(run_id, seq, record, schema_text);
    if let Write::Migrate { terminal, .. } = &mut write {
        *terminal = true;
    }
    write
}

/// [`Write::Prune`].
pub(super) fn prune(run_ids: &[&str]) -> Write {
    Write::Prune {
        run_ids: run_ids.iter().map(|id| (*id).to_owned()).collect(),
    }
}
