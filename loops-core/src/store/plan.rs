//! What every write means, once for every store: [`plan`] turns a [`Write`], its run's row
//! and the [`Facts`] it [`Needs`] into the [`Effects`] to store, or the refusal.
//!
//! A backend applies a write in three steps, all inside one atomic commit:
//! 1. read the row of [`Needs::run`] and the facts [`Write::needs`] asks for (under the
//!    write's locks);
//! 2. call [`plan`], which holds every check (fence, lease, refusals), every row change and
//!    every record encoding, and does no I/O;
//! 3. write the [`Effects`] out as they are, or nothing if the plan refused.
//!
//! Adding a write means a variant of [`Write`], its arm in [`Write::needs`] and in [`plan`]
//! (a function of its own here), and, only if it needs a new kind of fact or effect, the
//! code that reads or writes that in each backend.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use super::checks::{
    Given, check_lease, checked_attributes, existing, fence, fenced, fenced_journal, leased,
    not_asked_to_stop, run_ended,
};
use super::children;
use super::effects::{DUE_OUTPUT, Effects, InboxChange, Record, delivered_output, event_record};
use super::evolve;
use super::facts::{Facts, PendingEvent};
use super::protocol::{AfterFailure, EventRecord, Reply, WaitOutcome, Write};
use super::schedule_plan;
use super::{RunInfo, RunStatus, WaitInfo};
use crate::attribute::AttributeValue;
use crate::error::{Error, RecordKind, Result};
use crate::record::{FailureRecord, StepRecord, to_vec};
use crate::retention::family_top;

/// What `write` means: the [`Effects`] to store, given the run's current `row` (`None` if
/// the run does not exist; always `None` for [`Write::Prune`]) and the [`Facts`] that
/// [`Write::needs`] asked for. Pure: reads nothing, writes nothing.
///
/// # Errors
/// The write's refusal, which the store answers without writing anything:
/// [`Error::RunNotFound`] for a run that does not exist; [`Error::Fenced`] for a write of
/// a driver whose lease or seq is no longer current, or for a run that has ended;
/// [`Error::SequenceConflict`] and [`Error::StepExists`] for a record key that is taken;
/// [`Error::RunEnded`] (cancelling, or sending to, an ended run); [`Error::NotFailed`]
/// (retrying a run that has not failed); [`Error::RecordMissing`] and [`Error::Decode`]
/// for an inbox record a wait cannot read; [`Error::ScheduleNotFound`] (pausing, resuming or
/// removing a schedule that does not exist) and [`Error::InvalidSchedule`] (registering one
/// whose name or spec is refused).
// It is long because it has one arm per write of the protocol, each only unpacking the write's
// fields for the function that means it: splitting it would split the one list of writes.
pub fn plan<'w>(write: &'w Write, row: Option<&RunInfo>, facts: &Facts<'_>) -> Result<Effects<'w>> {
    let mut effects = own_effects(write, row, facts)?;
    children::add_follow_ups(write, facts, &mut effects);
    effects.wakes = super::ready::wakes(row, &effects, facts.lease.is_some());
    Ok(effects)
}

/// What `write` does to its own run (or, for `Prune` and `Seal`, to the store): [`plan`]
/// without the follow-ups for other runs and without [`Effects::wakes`], which `plan` derives
/// from these effects.
// This function is long because it is the one match over every write, one arm each that only
// unpacks the variant for its function: split, the arms would be farther from the variants.
fn own_effects<'w>(
    write: &'w Write,
    row: Option<&RunInfo>,
    facts: &Facts<'_>,
) -> Result<Effects<'w>> {
    let g = Given { row, facts };
    match write {
        Write::Create {
            info,
            record,
            schema_text,
            attributes,
        } => create(info, record, schema_text, attributes, &g),
        Write::Transition {
            run_id,
            seq,
            state,
            record,
            terminal,
            at_ms,
            hands_over,
        } => transition(
            run_id,
            *seq,
            (state, record),
            (*terminal, *hands_over),
            *at_ms,
            &g,
        ),
        Write::Step {
            run_id,
            seq,
            name,
            occurrence,
            record,
            clear_error_at_ms,
        } => step(
            run_id,
            *seq,
            (name, *occurrence),
            record,
            *clear_error_at_ms,
            &g,
        ),
        Write::Failure {
            run_id,
            seq,
            record,
            then,
        } => failure(run_id, *seq, record, *then, &g),
        Write::BeginAttempt {
            run_id,
            seq,
            max_attempts,
            max_interruptions,
            at_ms,
        } => begin_attempt(
            run_id,
            *seq,
            (*max_attempts, *max_interruptions),
            *at_ms,
            &g,
        ),
        Write::Cancel {
            run_id,
            reason,
            end_now,
            at_ms,
        } => cancel(run_id, reason, *end_now, *at_ms, &g),
        Write::EndCancelled { run_id, at_ms } => end_cancelled(run_id, *at_ms, &g),
        Write::Retry { run_id, at_ms } => retry(run_id, *at_ms, &g),
        Write::Wait {
            run_id,
            seq,
            attempt,
            step,
            event,
            until_ms,
            at_ms,
        } => wait(
            &WaitArgs {
                run_id,
                seq: *seq,
                attempt: *attempt,
                step: step
                    .as_ref()
                    .map(|(name, occurrence)| (name.as_str(), *occurrence)),
                event: event.as_deref(),
                until_ms: *until_ms,
                at_ms: *at_ms,
            },
            &g,
        ),
        Write::Send {
            run_id,
            name,
            payload,
            key,
            at_ms,
        } => send(run_id, name, payload, key.as_deref(), *at_ms, &g),
        Write::Wake { run_id, seq, at_ms } => wake(run_id, *seq, *at_ms, &g),
        Write::Block {
            run_id,
            schema,
            reason,
            changes,
            at_ms,
        } => evolve::block(run_id, *schema, reason, changes, *at_ms, &g),
        Write::Unblock { run_id, at_ms } => evolve::unblock(run_id, *at_ms, &g),
        Write::Migrate {
            run_id,
            seq,
            record,
            schema_text,
            terminal,
        } => evolve::migrate(run_id, *seq, (record, *terminal), schema_text, &g),
        Write::SetAttributes {
            run_id,
            seq,
            attributes,
        } => set_attributes(run_id, *seq, attributes, &g),
        Write::Prune { run_ids } => Ok(prune(run_ids, facts)),
        Write::Seal { key, check, at_ms } => {
            let mut effects = Effects::unchanged("", Reply::Done);
            effects.sealing = Some((key, check.as_deref(), *at_ms));
            Ok(effects)
        }
        Write::PutSchedule { .. }
        | Write::PauseSchedule { .. }
        | Write::RemoveSchedule { .. }
        | Write::TickSchedule { .. } => schedule_plan::plan(write, facts),
    }
}

fn create<'w>(
    info: &'w RunInfo,
    record: &'w [u8],
    schema_text: &'static str,
    attributes: &'w [(String, AttributeValue)],
    g: &Given<'_, '_>,
) -> Result<Effects<'w>> {
    check_lease(g, &info.run_id, 0)?;
    if g.row.is_some() || g.facts.record_taken {
        return Err(Error::SequenceConflict {
            run_id: info.run_id.clone(),
            seq: 0,
        });
    }
    let mut effects = Effects::with_row(&info.run_id, None, info.clone());
    effects.attributes = checked_attributes(info, attributes)?;
    effects.records.push(Record::Journal {
        seq: 0,
        bytes: Cow::Borrowed(record),
    });
    effects.store_schema(g.facts.schema_stored, info.schema, Some(schema_text));
    Ok(effects)
}

/// A handler's attributes: fenced like a step; the row is unchanged.
fn set_attributes<'w>(
    run_id: &'w str,
    seq: u64,
    attributes: &'w [(String, AttributeValue)],
    g: &Given<'_, '_>,
) -> Result<Effects<'w>> {
    let info = fenced(run_id, seq, g)?;
    let mut effects = Effects::unchanged(run_id, Reply::Done);
    effects.attributes = checked_attributes(info, attributes)?;
    Ok(effects)
}

/// `(terminal, hands_over)`: whether the new state ends the run; whether the driver lets the
/// run go after this commit, so that the new state's first attempt is not begun (attempt 0:
/// the next driver's `BeginAttempt` counts no interruption). The run keeps its schema: a
/// record is written by the version with the row's schema (a run of another is migrated or
/// accepted first, by a record of its own: [`Write::Migrate`]).
fn transition<'w>(
    run_id: &'w str,
    seq: u64,
    (state, record): (&str, &'w [u8]),
    (terminal, hands_over): (bool, bool),
    at_ms: u64,
    g: &Given<'_, '_>,
) -> Result<Effects<'w>> {
    let info = fenced_journal(run_id, seq, g)?;
    not_asked_to_stop(info)?;
    if g.facts.record_taken {
        return Err(Error::SequenceConflict {
            run_id: run_id.to_owned(),
            seq,
        });
    }
    let mut new = info.clone();
    new.seq = seq;
    new.entered = None;
    state.clone_into(&mut new.state);
    new.attempt = u32::from(!hands_over);
    new.attempt_base = 0;
    new.interrupted = 0;
    new.updated_ms = at_ms;
    new.retry_at_ms = None;
    new.error = None;
    if terminal {
        new.status = RunStatus::Completed;
    }
    let mut effects = Effects::with_row(run_id, Some(info.status), new);
    effects.records.push(Record::Journal {
        seq,
        bytes: Cow::Borrowed(record),
    });
    Ok(effects)
}

/// `clear_error_at_ms`: see [`Write::Step`]; the row is rewritten only if it shows an error.
fn step<'w>(
    run_id: &'w str,
    seq: u64,
    (name, occurrence): (&'w str, u32),
    record: &'w [u8],
    clear_error_at_ms: Option<u64>,
    g: &Given<'_, '_>,
) -> Result<Effects<'w>> {
    let info = fenced(run_id, seq, g)?;
    if g.facts.record_taken {
        return Err(step_exists(run_id, seq, name, occurrence));
    }
    let mut effects = match clear_error_at_ms {
        Some(at_ms) if info.error.is_some() => {
            let mut new = info.clone();
            new.error = None;
            new.updated_ms = at_ms;
            let mut effects = Effects::with_row(run_id, Some(info.status), new);
            effects.answer(Reply::Done);
            effects
        }
        _ => Effects::unchanged(run_id, Reply::Done),
    };
    effects.records.push(Record::Step {
        seq,
        name,
        occurrence,
        bytes: Cow::Borrowed(record),
    });
    Ok(effects)
}

fn failure<'w>(
    run_id: &'w str,
    seq: u64,
    record: &FailureRecord,
    then: AfterFailure,
    g: &Given<'_, '_>,
) -> Result<Effects<'w>> {
    let info = fenced(run_id, seq, g)?;
    let mut new = info.clone();
    new.error = Some(record.errors.clone());
    new.updated_ms = record.at_ms;
    match then {
        AfterFailure::Nothing => {}
        AfterFailure::RetryAt(at) => new.retry_at_ms = Some(at),
        AfterFailure::GiveUp => {
            new.status = RunStatus::Failed;
            new.retry_at_ms = None;
        }
    }
    let mut effects = Effects::with_row(run_id, Some(info.status), new);
    effects.records.push(Record::Failure {
        seq,
        attempt: record.attempt,
        index: g.facts.failure_index,
        bytes: to_vec(record),
    });
    Ok(effects)
}

/// `limits`: the retry policy's `(max_attempts, max_interruptions)`.
fn begin_attempt<'w>(
    run_id: &'w str,
    seq: u64,
    limits: (u32, u32),
    at_ms: u64,
    g: &Given<'_, '_>,
) -> Result<Effects<'w>> {
    check_lease(g, run_id, seq)?;
    let info = existing(run_id, g.row)?;
    if info.status != RunStatus::Running {
        return Ok(Effects::unchanged(run_id, Reply::Run(info.clone())));
    }
    fence(info, seq)?;
    let mut new = info.clone();
    // Failure records of a seq are only ever made for its current attempt or earlier ones.
    // An attempt with a step's failure record only did not end by failing: its handler may
    // have handled the step's error, and the process stopped later (interrupted); its
    // interruption's record takes the next index.
    let (has_failure, index) = match g.facts.last_attempt {
        Some(last) if last.attempt == info.attempt => (last.ended, last.next_index),
        _ => (false, 0),
    };
    let interrupted = new.begin_attempt(has_failure, at_ms, limits.0, limits.1)?;
    let mut effects = Effects::with_row(run_id, Some(info.status), new);
    if let Some(record) = interrupted {
        effects.records.push(Record::Failure {
            seq,
            attempt: record.attempt,
            index,
            bytes: to_vec(&record),
        });
    }
    Ok(effects)
}

fn cancel<'w>(
    run_id: &'w str,
    reason: &str,
    end_now: bool,
    at_ms: u64,
    g: &Given<'_, '_>,
) -> Result<Effects<'w>> {
    let info = leased(run_id, g)?;
    if info.status.is_ended() {
        return Err(run_ended(info, "cancel"));
    }
    let ends_now = end_now || info.status == RunStatus::Blocked;
    if info.cancel.is_some() && !ends_now {
        // Asked already: the first reason stands, and nothing changes (not even the row's
        // time).
        return Ok(Effects::unchanged(run_id, Reply::Run(info.clone())));
    }
    let mut new = info.clone();
    // The first reason stands: a second cancellation that ends the run at once keeps it.
    if new.cancel.is_none() {
        new.cancel = Some(reason.to_owned());
    }
    // Nobody drives a blocked run: it ends at once.
    if ends_now {
        end_as_cancelled(&mut new);
    }
    new.updated_ms = at_ms;
    Ok(Effects::with_row(run_id, Some(info.status), new))
}

/// Ends the row `new` as cancelled: an ended run waits for nothing, and is not blocked (a
/// blocked run's block, which says what to resume, and its wait go with it; before, a
/// cancelled blocked run kept both in its row).
fn end_as_cancelled(new: &mut RunInfo) {
    new.status = RunStatus::Cancelled;
    new.wait = None;
    new.block = None;
}

fn end_cancelled<'w>(run_id: &'w str, at_ms: u64, g: &Given<'_, '_>) -> Result<Effects<'w>> {
    let info = leased(run_id, g)?;
    if info.status.is_ended() || info.cancel.is_none() {
        return Ok(Effects::unchanged(run_id, Reply::Run(info.clone())));
    }
    let mut new = info.clone();
    end_as_cancelled(&mut new);
    new.updated_ms = at_ms;
    Ok(Effects::with_row(run_id, Some(info.status), new))
}

fn retry<'w>(run_id: &'w str, at_ms: u64, g: &Given<'_, '_>) -> Result<Effects<'w>> {
    let info = leased(run_id, g)?;
    if info.status != RunStatus::Failed {
        return Err(Error::NotFailed {
            run_id: run_id.to_owned(),
            status: info.status,
        });
    }
    // The retried run's next attempt needs a number.
    if info.attempt == u32::MAX {
        return Err(info.overflow("attempt", info.attempt, "retrying"));
    }
    let mut new = info.clone();
    new.status = RunStatus::Running;
    // The retry policy's budget counts afresh from here; attempt numbers (and the failure
    // records keyed by them) go on.
    new.attempt_base = info.attempt;
    new.interrupted = 0;
    new.retry_at_ms = None;
    new.updated_ms = at_ms;
    Ok(Effects::with_row(run_id, Some(info.status), new))
}

/// The fields of a [`Write::Wait`].
struct WaitArgs<'w> {
    run_id: &'w str,
    seq: u64,
    attempt: u32,
    step: Option<(&'w str, u32)>,
    event: Option<&'w str>,
    until_ms: Option<u64>,
    at_ms: u64,
}

/// [`Write::Wait`]: deliver the oldest pending event, or end the wait if its time passed,
/// or park the run.
fn wait<'w>(w: &WaitArgs<'w>, g: &Given<'_, '_>) -> Result<Effects<'w>> {
    let info = fenced(w.run_id, w.seq, g)?;
    if let Some((name, occurrence)) = w.step
        && g.facts.record_taken
    {
        return Err(step_exists(w.run_id, w.seq, name, occurrence));
    }
    let delivered = match (w.event, &g.facts.pending) {
        (Some(event), Some(pending)) => {
            Some((pending.event_seq, payload(w.run_id, event, pending)?))
        }
        _ => None,
    };
    let (outcome, output) = if let Some((event_seq, payload)) = delivered {
        let output = delivered_output(event_seq, &payload);
        (WaitOutcome::Delivered { event_seq, payload }, Some(output))
    } else if w.until_ms.is_some_and(|until| until <= w.at_ms) {
        (WaitOutcome::Due, Some(DUE_OUTPUT.to_owned()))
    } else {
        (WaitOutcome::Parked, None)
    };
    let mut new = info.clone();
    if outcome == WaitOutcome::Parked {
        new.status = RunStatus::Waiting;
        new.wait = Some(WaitInfo {
            event: w.event.map(str::to_owned),
            until_ms: w.until_ms,
        });
    } else {
        new.status = RunStatus::Running;
        new.wait = None;
    }
    new.updated_ms = w.at_ms;
    let reply = Reply::Waited(outcome.clone(), new.clone());
    let mut effects = Effects::with_row(w.run_id, Some(info.status), new);
    effects.answer(reply);
    if let (Some((name, occurrence)), Some(output)) = (w.step, output) {
        effects
            .records
            .push(wait_step(w, name, occurrence, output)?);
    }
    if let (Some(event), WaitOutcome::Delivered { event_seq, .. }) = (w.event, outcome) {
        effects.inbox.push(InboxChange::Deliver {
            event_seq,
            name: event,
        });
    }
    Ok(effects)
}

/// The step record of a wait's outcome (`output`, JSON), as the step `(name, occurrence)`.
fn wait_step<'w>(
    w: &WaitArgs<'w>,
    name: &'w str,
    occurrence: u32,
    output: String,
) -> Result<Record<'w>> {
    let output =
        serde_json::value::RawValue::from_string(output).map_err(|source| Error::Decode {
            run_id: w.run_id.to_owned(),
            record: RecordKind::Step {
                name: name.to_owned(),
                occurrence,
            },
            seq: w.seq,
            state: String::new(),
            source,
        })?;
    let record = StepRecord {
        attempt: w.attempt,
        at_ms: w.at_ms,
        duration_ms: 0,
        output,
    };
    Ok(Record::Step {
        seq: w.seq,
        name,
        occurrence,
        bytes: Cow::Owned(to_vec(&record)),
    })
}

fn send<'w>(
    run_id: &'w str,
    name: &'w str,
    payload: &str,
    key: Option<&'w str>,
    at_ms: u64,
    g: &Given<'_, '_>,
) -> Result<Effects<'w>> {
    let info = leased(run_id, g)?;
    // A key seen is the same event sent again (a client's retry after a lost answer): its
    // answer is the first send's, whether or not the run has ended since.
    if key.is_some()
        && let Some(existing) = g.facts.key_seen
    {
        let reply = Reply::Sent {
            event_seq: existing,
            duplicate: true,
            info: info.clone(),
        };
        return Ok(Effects::unchanged(run_id, reply));
    }
    if info.status.is_ended() {
        return Err(run_ended(info, super::SENDING_AN_EVENT));
    }
    let event_seq = g.facts.next_event_seq;
    let reply = Reply::Sent {
        event_seq,
        duplicate: false,
        info: info.clone(),
    };
    let mut effects = Effects::unchanged(run_id, reply);
    effects.inbox.push(InboxChange::Append {
        event_seq,
        name,
        key,
        record: event_record(name, key, at_ms, payload),
    });
    Ok(effects)
}

fn wake<'w>(run_id: &'w str, seq: u64, at_ms: u64, g: &Given<'_, '_>) -> Result<Effects<'w>> {
    check_lease(g, run_id, seq)?;
    let info = existing(run_id, g.row)?;
    if info.status != RunStatus::Waiting || info.state_seq() != seq {
        return Ok(Effects::unchanged(run_id, Reply::Run(info.clone())));
    }
    let mut new = info.clone();
    new.status = RunStatus::Running;
    new.wait = None;
    new.updated_ms = at_ms;
    Ok(Effects::with_row(run_id, Some(info.status), new))
}

/// [`Write::Prune`]: the ended runs among [`Facts::runs`] go, in the order `run_ids` names
/// them, except a family (runs linked by their parent links, among these) with a run that
/// has not ended, or with a child the write does not name ([`Facts::children_of_runs`]): it
/// stays whole. (A parent retried after its family was selected stays with its children,
/// and with a child it started since.)
fn prune(run_ids: &[String], facts: &Facts<'_>) -> Effects<'static> {
    let by_id: HashMap<&str, &RunInfo> = facts
        .runs
        .iter()
        .map(|info| (info.run_id.as_str(), info))
        .collect();
    let top = |info| family_top(&by_id, info).0.run_id.as_str();
    let unended = facts.runs.iter().filter(|info| !info.status.is_ended());
    let outside_parents = facts
        .children_of_runs
        .iter()
        .filter(|(_, child)| !by_id.contains_key(child.as_str()))
        .filter_map(|(parent, _)| by_id.get(parent.as_str()).copied());
    let kept: HashSet<&str> = unended.chain(outside_parents).map(&top).collect();
    let delete: Vec<RunInfo> = run_ids
        .iter()
        .filter_map(|id| by_id.get(id.as_str()))
        .filter(|info| info.status.is_ended() && !kept.contains(top(info)))
        .map(|info| (*info).clone())
        .collect();
    // A run's journal holds one record per seq, from 0 to its current seq. A count for the
    // report only: it saturates rather than refuse to prune a run whose row says seq u64::MAX.
    let records = delete
        .iter()
        .fold(0u64, |n, info| n.saturating_add(info.seq).saturating_add(1));
    let run_ids = delete.iter().map(|info| info.run_id.clone()).collect();
    let mut effects = Effects::unchanged("", Reply::Pruned { records, run_ids });
    effects.delete = delete;
    effects
}

/// The payload JSON of the pending event `event` of `run_id`.
fn payload(run_id: &str, event: &str, pending: &PendingEvent) -> Result<String> {
    let Some(bytes) = &pending.record else {
        return Err(Error::RecordMissing {
            run_id: run_id.to_owned(),
            seq: pending.event_seq,
        });
    };
    let record: EventRecord = serde_json::from_slice(bytes).map_err(|source| Error::Decode {
        run_id: run_id.to_owned(),
        record: RecordKind::Event {
            name: Some(event.to_owned()),
        },
        seq: pending.event_seq,
        state: String::new(),
        source,
    })?;
    Ok(record.payload.get().to_owned())
}

fn step_exists(run_id: &str, seq: u64, name: &str, occurrence: u32) -> Error {
    Error::StepExists {
        run_id: run_id.to_owned(),
        seq,
        step: name.to_owned(),
        occurrence,
    }
}
