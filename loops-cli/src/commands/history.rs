//! `loops history RUN`: every transition, step, failed attempt and event of a run.

use std::collections::BTreeMap;

use loops_core::{FailureSource, MigratedFrom};
use loops_core::{RunInfo, now_ms};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::cli::HistoryArgs;
use crate::failure::{Result, run_id_arg};
use crate::json::preview;
use crate::open::{self, Access, Target};
use crate::operator::{Operator, not_found};
use crate::output::{
    Cell, DIM, ERROR, HEADER, ID, Table, duration, emit, emit_json, paint, plural, rfc3339,
    status_style,
};
use crate::view::{EventFate, EventView, FailureView, RunView, StepView, waiting_text};

/// Longest preview of a payload or step output in the text form.
const PREVIEW: usize = 60;

/// `loops history --json`, and what the web UI's timeline shows.
#[derive(Debug, Serialize)]
pub struct HistoryView {
    /// The run's row.
    pub run: RunView,
    /// Every transition, oldest first.
    pub transitions: Vec<TransitionView>,
    /// Every event in the run's inbox, in the order sent.
    pub events: Vec<EventView>,
}

/// One transition with the steps and failed attempts of its state.
#[derive(Debug, Serialize)]
pub struct TransitionView {
    /// The transition's sequence number, from 0.
    pub seq: u64,
    /// The state it entered.
    pub state: String,
    /// When it was recorded (RFC 3339, UTC).
    pub at: String,
    /// The same, in ms since the Unix epoch.
    pub at_ms: u64,
    /// Milliseconds since the previous transition (`None` for the first).
    pub since_previous_ms: Option<u64>,
    /// The schema hash it was recorded with.
    pub schema: String,
    /// For a migration's (or an acceptance's) record: the schema, version and seq it took the
    /// run from.
    pub migrated_from: Option<MigratedFromView>,
    /// The state's data, as stored.
    pub payload: Box<RawValue>,
    /// The steps recorded in this state, in the order recorded.
    pub steps: Vec<StepView>,
    /// The failed attempts of this state, in order.
    pub failures: Vec<FailureView>,
}

/// Where a migration's (or an acceptance's) record comes from.
#[derive(Debug, Serialize)]
pub struct MigratedFromView {
    /// The schema hash it was migrated from.
    pub schema: String,
    /// That schema's declared version (for an acceptance, the version its stored description
    /// names; 0 if none).
    pub version: u32,
    /// The seq of the state it continues.
    pub seq: u64,
    /// Whether the record is an acceptance: the version of the record's schema accepts the
    /// old schema (`accepts`) and took the run as it is, with no migration.
    pub accepted: bool,
}

impl From<MigratedFrom> for MigratedFromView {
    fn from(m: MigratedFrom) -> Self {
        MigratedFromView {
            schema: m.schema.to_string(),
            version: m.version,
            seq: m.seq,
            accepted: m.accepted,
        }
    }
}

/// Reads run `run_id`'s row and whole history from `store`: transitions with their steps and
/// failed attempts, and events. Fails if the run does not exist, or as the store's reads fail.
pub fn gather(store: &dyn Operator, run_id: &str) -> Result<(RunInfo, HistoryView)> {
    let info = store
        .run(run_id)?
        .ok_or_else(|| not_found(store.label(), run_id))?;
    let mut failures: BTreeMap<u64, Vec<FailureView>> = BTreeMap::new();
    for (seq, record) in store.failures(run_id)? {
        failures.entry(seq).or_default().push(record.into());
    }
    let history = store.history(run_id)?;
    let mut steps_at: BTreeMap<u64, Vec<StepView>> = BTreeMap::new();
    for (seq, name, occurrence, r) in store.all_steps(run_id, &history)? {
        steps_at
            .entry(seq)
            .or_default()
            .push(StepView::new(name, occurrence, r));
    }
    let mut transitions = Vec::new();
    let mut previous: Option<u64> = None;
    for record in history {
        let mut steps = steps_at.remove(&record.seq).unwrap_or_default();
        // Stored by name; shown in the order they were recorded.
        steps.sort_by_key(|s| (s.at_ms, s.attempt));
        transitions.push(TransitionView {
            seq: record.seq,
            state: record.state,
            at: rfc3339(record.at_ms),
            at_ms: record.at_ms,
            since_previous_ms: previous.map(|p| record.at_ms.saturating_sub(p)),
            schema: record.schema.to_string(),
            migrated_from: record.migrated.map(MigratedFromView::from),
            payload: record.payload,
            steps,
            failures: failures.remove(&record.seq).unwrap_or_default(),
        });
        previous = Some(record.at_ms);
    }
    let events: Vec<EventView> = store
        .events(run_id)?
        .into_iter()
        .map(|(seq, e, delivered)| EventView::new(seq, e, delivered))
        .collect();
    let view = HistoryView {
        run: RunView::from(&info).with_attributes(store.attributes(run_id)?),
        transitions,
        events,
    };
    Ok((info, view))
}

/// Shows the run's history.
pub fn run(target: &Target, args: &HistoryArgs) -> Result<()> {
    let run_id = run_id_arg(&args.run)?;
    let store = open::operator(target, Access::Read)?;
    let (info, view) = gather(&*store, &run_id)?;
    if args.json {
        return emit_json(&view);
    }
    emit(&render(&view, &waiting_text(&info, now_ms())))
}

fn render(view: &HistoryView, waiting: &str) -> String {
    let run = &view.run;
    let failed = failed_attempts(&view.transitions);
    let mut out = format!(
        "{} {}  workflow {}  {}  {}, {} failed attempt{}",
        paint(HEADER, "run"),
        paint(ID, &run.run_id),
        run.workflow,
        paint(status_style(run.status), run.status.as_str()),
        crate::output::transitions(view.transitions.len()),
        failed,
        plural(failed),
    );
    if !waiting.is_empty() {
        out.push_str(&format!("; waiting for {waiting}"));
    }
    out.push_str("\n\n");
    let mut t = Table::with_header(&["SEQ", "KIND", "NAME", "ATTEMPT", "AT", "ELAPSED", "DETAIL"]);
    // A migration's (or acceptance's) record continues the state entered at an earlier seq,
    // whose steps and failures go on after it: those are shown after its row, in time order.
    let mut continued: BTreeMap<u64, Vec<(u64, Vec<Cell>)>> = BTreeMap::new();
    for tr in &view.transitions {
        // A migration's (or acceptance's) record says where it comes from instead of its
        // payload (the same state's data, read by the new version).
        let (kind, detail) = match &tr.migrated_from {
            Some(m) => (
                Cell::new(
                    if m.accepted { "accepted" } else { "migrated" },
                    status_style(loops_core::RunStatus::Blocked),
                ),
                Cell::plain(migration_text(m, tr)),
            ),
            None => (
                Cell::plain("state"),
                Cell::new(preview(tr.payload.get(), PREVIEW), DIM),
            ),
        };
        t.row(vec![
            Cell::new(tr.seq.to_string(), HEADER),
            kind,
            Cell::new(&tr.state, HEADER),
            Cell::plain(""),
            Cell::new(&tr.at, DIM),
            Cell::plain(
                tr.since_previous_ms
                    .map(|ms| format!("+{}", duration(ms)))
                    .unwrap_or_default(),
            ),
            detail,
        ]);
        // Steps and failed attempts of this state (and of the one it continues, after this
        // record), in the order they happened; those after a later record that continues it
        // are kept for that record's row.
        let mut rows = attempt_rows(tr);
        if let Some(m) = &tr.migrated_from {
            rows.extend(continued.remove(&m.seq).unwrap_or_default());
            rows.sort_by_key(|(at, _)| *at);
        }
        let until = view
            .transitions
            .iter()
            .find(|later| {
                later
                    .migrated_from
                    .as_ref()
                    .is_some_and(|m| m.seq == tr.seq)
            })
            .map_or(u64::MAX, |later| later.at_ms);
        let (before, after): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(at, _)| *at < until);
        for (_, cells) in before {
            t.row(cells);
        }
        if !after.is_empty() {
            continued.insert(tr.seq, after);
        }
    }
    // A cancellation is no transition (the run ends where it is): its row says when and why.
    if run.status == loops_core::RunStatus::Cancelled {
        t.row(vec![
            Cell::plain(""),
            Cell::new("cancelled", status_style(run.status)),
            Cell::new(&run.state, HEADER),
            Cell::plain(""),
            Cell::new(&run.updated_at, DIM),
            Cell::plain(""),
            Cell::plain(run.cancel_reason.clone().unwrap_or_default()),
        ]);
    }
    out.push_str(&t.render(0));
    if !view.events.is_empty() {
        out.push('\n');
        out.push_str(&events_table(view).render(0));
    }
    out
}

/// The rows of the steps and failed attempts of the state `tr`, in the order they happened
/// (by time, then attempt), each with its time (ms since the Unix epoch).
fn attempt_rows(tr: &TransitionView) -> Vec<(u64, Vec<Cell>)> {
    let mut lines: Vec<(u64, u32, Vec<Cell>)> = Vec::new();
    for s in &tr.steps {
        lines.push((
            s.at_ms,
            s.attempt,
            vec![
                Cell::plain(""),
                Cell::plain("step"),
                Cell::plain(format!("{}#{}", s.name, s.occurrence)),
                Cell::plain(s.attempt.to_string()),
                Cell::new(&s.at, DIM),
                Cell::plain(duration(s.duration_ms)),
                Cell::new(preview(s.output.get(), PREVIEW), DIM),
            ],
        ));
    }
    for f in &tr.failures {
        let what = match &f.source {
            FailureSource::Step { name, occurrence } => format!("step {name}#{occurrence}"),
            FailureSource::Handler => "handler".to_owned(),
            FailureSource::Interrupted => "interrupted".to_owned(),
        };
        lines.push((
            f.at_ms,
            f.attempt,
            vec![
                Cell::plain(""),
                Cell::new("failed", ERROR),
                Cell::plain(what),
                Cell::plain(f.attempt.to_string()),
                Cell::new(&f.at, DIM),
                Cell::plain(""),
                Cell::new(f.errors.join(": "), ERROR),
            ],
        ));
    }
    lines.sort_by_key(|(at, attempt, _)| (*at, *attempt));
    lines
        .into_iter()
        .map(|(at, _, cells)| (at, cells))
        .collect()
}

/// The table of the run's events in `view`: each with its key, when it was sent, and whether
/// a wait took it.
fn events_table(view: &HistoryView) -> Table {
    let mut e = Table::with_header(&["EVENT", "NAME", "KEY", "SENT", "STATUS", "PAYLOAD"]);
    for ev in &view.events {
        e.row(vec![
            Cell::plain(ev.event_seq.to_string()),
            Cell::plain(&ev.name),
            Cell::plain(ev.key.clone().unwrap_or_default()),
            Cell::new(&ev.at, DIM),
            match ev.fate(&view.run) {
                EventFate::Pending => Cell::new(
                    EventFate::Pending.text(),
                    status_style(loops_core::RunStatus::Waiting),
                ),
                fate => Cell::plain(fate.text()),
            },
            Cell::new(preview(ev.payload.get(), PREVIEW), DIM),
        ]);
    }
    e
}

/// `migrated from schema X (version N) to Y at seq M (continues seq K)`: the record at seq
/// `M` carries the run over to schema `Y`, in the state entered at seq `K`; an acceptance
/// says `accepted as it is from ...`.
fn migration_text(m: &MigratedFromView, tr: &TransitionView) -> String {
    format!(
        "{} schema {} (version {}) to {} at seq {} (continues seq {})",
        if m.accepted {
            "accepted as it is from"
        } else {
            "migrated from"
        },
        m.schema,
        m.version,
        tr.schema,
        tr.seq,
        m.seq
    )
}

/// The number of failed attempts: one failing step writes two failure records for its
/// attempt (the step's and the handler's), and an event set aside by a wait writes a step's
/// record in an attempt that goes on; an attempt failed if its handler failed or the process
/// stopped during it.
fn failed_attempts(transitions: &[TransitionView]) -> usize {
    let mut attempts = std::collections::BTreeSet::new();
    for t in transitions {
        for f in &t.failures {
            if matches!(
                f.source,
                FailureSource::Handler | FailureSource::Interrupted
            ) {
                attempts.insert((t.seq, f.attempt));
            }
        }
    }
    attempts.len()
}
