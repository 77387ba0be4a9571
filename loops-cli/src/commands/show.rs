//! `loops show RUN`: where one run stands.

use anstyle::Style;
use loops_core::now_ms;
use loops_core::{RunInfo, RunStatus, TransitionRecord};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::attrs::value_text;
use crate::cli::ShowArgs;
use crate::failure::{Result, run_id_arg};
use crate::json::pretty;
use crate::open::{self, Access, Target};
use crate::operator::{Operator, not_found};
use crate::output::{
    Cell, DIM, ERROR, HEADER, ID, PLAIN, Table, emit, emit_json, paint, status_style, when,
};
use crate::view::{EventFate, EventView, GaveUpView, RunView, waiting_text};

/// `loops show --json`.
#[derive(Debug, Serialize)]
struct ShowView {
    run: RunView,
    payload: Box<RawValue>,
    schema_description: Option<String>,
    pending_events: Vec<EventView>,
    state_steps: Vec<StateStep>,
}

/// A step the run's current state recorded (`loops show --json`'s `state_steps`).
#[derive(Debug, Serialize)]
struct StateStep {
    /// The step's name (`loops:`... for loops' own: a wait, a child's start, a join).
    name: String,
    /// Which use of the name in the state, from 0.
    occurrence: u32,
    /// The attempt of the state's handler that ran it, from 1.
    attempt: u32,
    /// When it was recorded, in ms since the Unix epoch.
    at_ms: u64,
}

/// The run's row and latest record, or a failure naming the run and the store.
pub fn find(store: &dyn Operator, run_id: &str) -> Result<(RunInfo, TransitionRecord)> {
    store
        .latest(run_id)?
        .ok_or_else(|| not_found(store.label(), run_id))
}

/// Shows the run's status, current state with its data, wait, and schema hash; with
/// `--schema`, the schema's description too (the JSON form always has it).
pub fn run(target: &Target, args: &ShowArgs) -> Result<()> {
    let run_id = run_id_arg(&args.run)?;
    let store = open::operator(target, Access::Read)?;
    let (info, record) = find(&*store, &run_id)?;
    let description = store.schema(info.schema)?;
    let attributes = store.attributes(&run_id)?;
    // A child's end that no wait took is left out unless the run waits for one: it only
    // says "look again" to a join, which read the child's row instead (docs/design.md,
    // "Join reads the truth from the rows"); listed for a run that waits for something else
    // or has ended, it read as an event the run missed or is yet to take. `loops history`
    // still lists it (as `not needed`: the same rule, `EventView::fate`).
    let run_view = RunView::from(&info);
    let pending: Vec<EventView> = store
        .events(&run_id)?
        .into_iter()
        .filter(|(_, _, delivered)| !delivered)
        .map(|(seq, e, delivered)| EventView::new(seq, e, delivered))
        .filter(|e| e.fate(&run_view) != EventFate::NotNeeded)
        .collect();
    let state_steps: Vec<StateStep> = store
        .steps(&run_id, info.seq)?
        .into_iter()
        .map(|(name, occurrence, step)| StateStep {
            name,
            occurrence,
            attempt: step.attempt,
            at_ms: step.at_ms,
        })
        .collect();

    if args.json {
        return emit_json(&ShowView {
            run: run_view.with_attributes(attributes),
            payload: record.payload,
            schema_description: description,
            pending_events: pending,
            state_steps,
        });
    }

    let now = now_ms();
    let mut out = fields(&info, &pending, &state_steps, &attributes, now).render(0);
    out.push('\n');
    push_indented(
        &mut out,
        &format!("state {} (payload)", info.state),
        &pretty(record.payload.get()),
        PLAIN,
    );
    if args.schema {
        out.push('\n');
        let (text, style) = match description.as_deref() {
            Some(text) => (text, DIM),
            None => ("(no description stored)", PLAIN),
        };
        push_indented(&mut out, &format!("schema {}", info.schema), text, style);
    }
    emit(&out)
}

/// Appends `title` as a header line, then each line of `text` indented by two, in `style`.
fn push_indented(out: &mut String, title: &str, text: &str, style: Style) {
    out.push_str(&paint(HEADER, title));
    out.push('\n');
    for line in text.lines() {
        out.push_str("  ");
        out.push_str(&paint(style, line));
        out.push('\n');
    }
}

/// The table of `loops show`: one labelled row per fact of the run `info` (status, state,
/// wait, times, error, cancellation, the current state's `steps` done before a cancel or
/// failure, `pending` events, block, `attributes`, schema), times relative to `now` (ms
/// since the epoch).
fn fields(
    info: &RunInfo,
    pending: &[EventView],
    steps: &[StateStep],
    attributes: &loops_core::Attributes,
    now: u64,
) -> Table {
    // As wide as the longest label, `pending events`.
    let mut t = Table::new().min_widths(&[14]);
    let mut field = |label: &str, value: String, style| {
        t.row(vec![Cell::new(label, HEADER), Cell::new(value, style)]);
    };
    field("run", info.run_id.clone(), ID);
    if let Some(parent) = &info.parent {
        field("parent", parent.run_id.clone(), ID);
    }
    field("workflow", info.workflow.clone(), PLAIN);
    field("status", info.status.to_string(), status_style(info.status));
    // After `loops retry`, attempt numbers count on; the budget counts from the retry.
    let retried = match info.attempt_base {
        0 => String::new(),
        base => format!("; retried after attempt {base}"),
    };
    field("state", state_text(info, &retried), PLAIN);
    let waiting = waiting_text(info, now);
    // A blocked run's reason has a row of its own, below.
    if !waiting.is_empty() && info.status != RunStatus::Blocked {
        field("waiting for", waiting, PLAIN);
    }
    if let Some(at) = info
        .retry_at_ms
        .filter(|_| info.status == RunStatus::Running)
    {
        field("next attempt", when(at, now), PLAIN);
    }
    field("created", when(info.created_ms, now), PLAIN);
    field("updated", when(info.updated_ms, now), PLAIN);
    if let Some(error) = &info.error {
        field("last error", error.join(": "), ERROR);
    }
    if let Some(gave_up) = GaveUpView::of(info) {
        field("gave up", gave_up.text(), ERROR);
    }
    if let Some(reason) = &info.cancel {
        let label = if info.status == RunStatus::Cancelled {
            "cancelled"
        } else {
            "cancel asked"
        };
        field(label, reason.clone(), PLAIN);
    }
    if let Some(done) = effects_before_the_end(info, steps) {
        field("steps done", done, ERROR);
    }
    if let Some(first) = pending.first() {
        let names: Vec<String> = pending
            .iter()
            .map(|e| format!("{} (event seq {})", e.name, e.event_seq))
            .collect();
        // Both labels fit the column's width, which the longest, `pending events`, sets.
        let (label, why) = match first.fate(&RunView::from(info)) {
            EventFate::NotTaken | EventFate::NotNeeded => ("not taken", " (the run ended first)"),
            _ => ("pending events", ""),
        };
        field(label, format!("{}{why}", names.join(", ")), PLAIN);
    }
    if let Some(block) = info
        .block
        .as_ref()
        .filter(|_| info.status == RunStatus::Blocked)
    {
        field("blocked", block.reason.clone(), ERROR);
        for change in &block.changes {
            field("change", change.clone(), PLAIN);
        }
        field("since", when(block.at_ms, now), PLAIN);
        field(
            "unblocked",
            format!(
                "goes back to {} when a build that knows schema {} (or a migration from it) \
                 drives it; see docs/evolution.md",
                block.resume, block.schema
            ),
            DIM,
        );
    }
    for (key, value) in attributes {
        field(
            "attribute",
            format!("{key} = {} ({})", value_text(value), value.kind()),
            PLAIN,
        );
    }
    field("schema", info.schema.to_string(), DIM);
    t
}

/// For a run that was cancelled or failed in a state whose handler had recorded steps of its
/// own (not loops' `loops:` ones): those steps, and that their effects happened though the
/// run never left the state (a cancel that landed while the last step ran refuses the next
/// state, not the step). `None` otherwise. Shown so that no one redoes by hand what the run
/// did (opened the pull request, say).
fn effects_before_the_end(info: &RunInfo, steps: &[StateStep]) -> Option<String> {
    if !matches!(info.status, RunStatus::Cancelled | RunStatus::Failed) {
        return None;
    }
    let own: Vec<String> = steps
        .iter()
        .filter(|s| !s.name.starts_with(loops_core::RESERVED_PREFIX))
        .map(|s| format!("{}#{}", s.name, s.occurrence))
        .collect();
    if own.is_empty() {
        return None;
    }
    Some(format!(
        "{} (recorded in state {} before the run ended: their effects happened; `loops history {}` shows their outputs)",
        own.join(", "),
        info.state,
        info.run_id
    ))
}

/// The run's state, seq and attempt (`retried`: what a retry adds), in words.
fn state_text(info: &RunInfo, retried: &str) -> String {
    let attempt = crate::view::attempt_text(info.attempt);
    format!("{} (seq {}, {attempt}{retried})", info.state, info.seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queued run (or one a drain let go) has no attempt begun: said so, not "attempt 0".
    #[test]
    fn a_run_with_no_attempt_begun_says_so() {
        let row = |attempt: u32| -> RunInfo {
            serde_json::from_value(serde_json::json!({
                "run_id": "q", "workflow": "work", "schema": "0000000000000009",
                "status": "running", "state": "Begin", "seq": 0, "attempt": attempt,
                "created_ms": 0, "updated_ms": 0,
            }))
            .unwrap()
        };
        assert_eq!(
            state_text(&row(0), ""),
            "Begin (seq 0, no attempt begun yet)"
        );
        assert_eq!(state_text(&row(2), ""), "Begin (seq 0, attempt 2)");
    }

    #[test]
    fn a_failed_run_says_after_how_many_attempts_and_interruptions_it_gave_up() {
        let row = |status: &str, attempt: u32, base: u32, interrupted: u32| -> RunInfo {
            serde_json::from_value(serde_json::json!({
                "run_id": "c0", "workflow": "work", "schema": "0000000000000009",
                "status": status, "state": "Run", "seq": 0, "attempt": attempt,
                "attempt_base": base, "interrupted": interrupted,
                "created_ms": 0, "updated_ms": 0,
            }))
            .unwrap()
        };
        let text = |info: RunInfo| GaveUpView::of(&info).map(|g| g.text());
        assert_eq!(
            text(row("failed", 10, 0, 10)).as_deref(),
            Some(
                "after 10 attempts, 10 of them interrupted (the process stopped, or lost the run's lease, while they ran)"
            )
        );
        assert_eq!(
            text(row("failed", 1, 0, 0)).as_deref(),
            Some("after 1 attempt")
        );
        assert_eq!(
            text(row("failed", 1, 0, 1)).as_deref(),
            Some(
                "after 1 attempt, interrupted (the process stopped, or lost the run's lease, while it ran)"
            )
        );
        // After `loops retry` at attempt 3, the budget counts from there.
        assert_eq!(
            GaveUpView::of(&row("failed", 5, 3, 1)),
            Some(GaveUpView {
                attempts: 2,
                interrupted: 1
            })
        );
        assert_eq!(text(row("running", 5, 0, 2)), None);
    }
}
