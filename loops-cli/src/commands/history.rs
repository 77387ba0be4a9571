//! `loops history RUN`: every transition, step, failed attempt and event of a run.

use std::collections::BTreeMap;

use loops_core::{FailureSource, MigratedFrom};
use loops_core::{RunInfo, now_ms};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::cli::HistoryArgs;
use crate::failure::{Result, run_id_arg};
use crate::json::{cut, preview};
use crate::open::{self, Access, Target};
use crate::operator::{Operator, not_found};
use crate::output::{
    Cell, DIM, ERROR, HEADER, ID, Table, duration, emit, emit_json, paint, plural, rfc3339,
    status_style,
};
use crate::view::{EventFate, EventView, FailureView, RunView, StepView, waiting_text};

/// Longest preview of a payload or step output in the text form.
const PREVIEW: usize = 60;

/// How many characters of an event's idempotency key the text table shows (a key may hold
/// 256 bytes; `--json` has all of it).
const KEY_WIDTH: usize = 32;

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
    let failure_records = store.failures(run_id)?;
    let history = store.history(run_id)?;
    let step_records = store.all_steps(run_id, &history)?;
    let set_aside = loops_core::set_aside_events(&step_records, &failure_records);
    let mut failures: BTreeMap<u64, Vec<FailureView>> = BTreeMap::new();
    for (seq, record) in failure_records {
        failures.entry(seq).or_default().push(record.into());
    }
    let mut steps_at: BTreeMap<u64, Vec<StepView>> = BTreeMap::new();
    for (seq, name, occurrence, r) in step_records {
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
        .map(|(seq, e, delivered)| {
            let mut view = EventView::new(seq, e, delivered);
            view.set_aside = set_aside.get(&seq).cloned();
            view
        })
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
    let (failed, interrupted) = ended_attempts(&view.transitions);
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
    if interrupted > 0 {
        out.push_str(&format!(", {interrupted} interrupted"));
    }
    if !waiting.is_empty() {
        out.push_str(&format!("; waiting for {waiting}"));
    }
    out.push_str("\n\n");
    let mut t = Table::with_header(&["SEQ", "KIND", "NAME", "ATTEMPT", "AT", "ELAPSED", "DETAIL"]);
    let shown = shown_under(&view.transitions);
    for (tr, items) in view.transitions.iter().zip(shown) {
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
        // Steps and failed attempts, in the order they happened.
        for item in items {
            t.row(item_row(item));
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

/// A step run or a failed attempt, shown under a transition ([`shown_under`]).
#[derive(Debug, Clone, Copy)]
pub enum TimelineItem<'a> {
    /// A step's run of the state entered at `seq`.
    Step {
        /// The seq of the state it belongs to.
        seq: u64,
        /// The step.
        step: &'a StepView,
    },
    /// A failure record.
    Failure {
        /// The failure.
        failure: &'a FailureView,
    },
}

impl TimelineItem<'_> {
    /// When it happened (ms since the Unix epoch), and its attempt: the timeline's order.
    fn when(&self) -> (u64, u32) {
        match self {
            TimelineItem::Step { step, .. } => (step.at_ms, step.attempt),
            TimelineItem::Failure { failure, .. } => (failure.at_ms, failure.attempt),
        }
    }
}

/// The steps and failed attempts to show under each of `transitions` (one list per
/// transition, in order), each list in the order they happened (by time, then attempt).
/// A state's own, except those recorded after a later record that continues the state (a
/// migration's or an acceptance's: the new version goes on in the same state, its records
/// keyed by the state's seq), which are shown under that record. The text of `loops
/// history` and the run page of `loops ui` both show them so.
pub fn shown_under(transitions: &[TransitionView]) -> Vec<Vec<TimelineItem<'_>>> {
    let mut out: Vec<Vec<TimelineItem<'_>>> = vec![Vec::new(); transitions.len()];
    for (i, tr) in transitions.iter().enumerate() {
        let items = (tr
            .steps
            .iter()
            .map(|step| TimelineItem::Step { seq: tr.seq, step }))
        .chain(
            tr.failures
                .iter()
                .map(|failure| TimelineItem::Failure { failure }),
        );
        for item in items {
            // The last record at or before the item that continues this state, if any.
            let under = (i + 1..transitions.len())
                .take_while(|&k| transitions[k].at_ms <= item.when().0)
                .filter(|&k| continues(&transitions[k], tr.seq, transitions))
                .last()
                .unwrap_or(i);
            out[under].push(item);
        }
    }
    for items in &mut out {
        items.sort_by_key(TimelineItem::when);
    }
    out
}

/// Whether the record `later` continues the state entered at `seq`: it was migrated (or
/// accepted) from it, or from a record that continues it.
fn continues(later: &TransitionView, seq: u64, transitions: &[TransitionView]) -> bool {
    let Some(m) = &later.migrated_from else {
        return false;
    };
    m.seq == seq
        || transitions
            .iter()
            .find(|t| t.seq == m.seq)
            .is_some_and(|from| from.seq != later.seq && continues(from, seq, transitions))
}

/// The text table's row of `item`.
fn item_row(item: TimelineItem<'_>) -> Vec<Cell> {
    match item {
        TimelineItem::Step { step: s, .. } => vec![
            Cell::plain(""),
            Cell::plain("step"),
            Cell::plain(format!("{}#{}", s.name, s.occurrence)),
            Cell::plain(s.attempt.to_string()),
            Cell::new(&s.at, DIM),
            Cell::plain(duration(s.duration_ms)),
            Cell::new(preview(s.output.get(), PREVIEW), DIM),
        ],
        TimelineItem::Failure { failure: f } => {
            // An attempt the process stopped during did not fail: the header counts it apart.
            let (kind, style, what) = match &f.source {
                FailureSource::Step { name, occurrence } => {
                    ("failed", ERROR, format!("step {name}#{occurrence}"))
                }
                FailureSource::Handler => ("failed", ERROR, "handler".to_owned()),
                FailureSource::Interrupted => ("stopped", DIM, "interrupted".to_owned()),
            };
            vec![
                Cell::plain(""),
                Cell::new(kind, style),
                Cell::plain(what),
                Cell::plain(f.attempt.to_string()),
                Cell::new(&f.at, DIM),
                Cell::plain(""),
                Cell::new(f.errors.join(": "), style),
            ]
        }
    }
}

/// The table of the run's events in `view`: each with its key, when it was sent, and whether
/// a wait took it.
fn events_table(view: &HistoryView) -> Table {
    let mut e = Table::with_header(&["EVENT", "NAME", "KEY", "SENT", "STATUS", "PAYLOAD"]);
    for ev in &view.events {
        e.row(vec![
            Cell::plain(ev.event_seq.to_string()),
            Cell::plain(&ev.name),
            Cell::plain(cut(ev.key.clone().unwrap_or_default(), KEY_WIDTH)),
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

/// The number of failed attempts, and of attempts interrupted (the process stopped, or lost
/// the run's lease, while they ran), counted apart as the retry policy counts them
/// (`max_attempts`, `max_interruptions`). One failing step writes two failure records for
/// its attempt (the step's and the handler's), and an event set aside by a wait writes a
/// step's record in an attempt that goes on: an attempt failed if its handler failed, and
/// was interrupted if it has an interruption's record and no handler's.
fn ended_attempts(transitions: &[TransitionView]) -> (usize, usize) {
    let mut failed = std::collections::BTreeSet::new();
    let mut interrupted = std::collections::BTreeSet::new();
    for t in transitions {
        for f in &t.failures {
            match f.source {
                FailureSource::Handler => failed.insert((t.seq, f.attempt)),
                FailureSource::Interrupted => interrupted.insert((t.seq, f.attempt)),
                _ => false,
            };
        }
    }
    (failed.len(), interrupted.difference(&failed).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> Box<RawValue> {
        RawValue::from_string("null".to_owned()).unwrap()
    }

    fn step(name: &str, at_ms: u64) -> StepView {
        StepView {
            name: name.to_owned(),
            occurrence: 0,
            attempt: 1,
            at: String::new(),
            at_ms,
            duration_ms: 0,
            output: raw(),
        }
    }

    fn transition(seq: u64, at_ms: u64, from: Option<u64>, steps: Vec<StepView>) -> TransitionView {
        TransitionView {
            seq,
            state: "Work".to_owned(),
            at: String::new(),
            at_ms,
            since_previous_ms: None,
            schema: String::new(),
            migrated_from: from.map(|seq| MigratedFromView {
                schema: String::new(),
                version: 1,
                seq,
                accepted: false,
            }),
            payload: raw(),
            steps,
            failures: Vec::new(),
        }
    }

    fn failure(attempt: u32, source: FailureSource) -> FailureView {
        FailureView {
            attempt,
            at: String::new(),
            at_ms: 0,
            source,
            errors: Vec::new(),
        }
    }

    /// An attempt the process stopped during is counted as interrupted, not failed (as the
    /// retry policy counts it); a failing step and its handler's failure are one failed
    /// attempt; the same attempt number at another seq is another attempt.
    #[test]
    fn interrupted_attempts_are_counted_apart_from_failed_ones() {
        let step = FailureSource::Step {
            name: "s".to_owned(),
            occurrence: 0,
        };
        let mut first = transition(0, 0, None, Vec::new());
        first.failures = vec![
            failure(1, step.clone()),
            failure(1, FailureSource::Handler),
            failure(2, FailureSource::Interrupted),
        ];
        let mut second = transition(1, 10, None, Vec::new());
        second.failures = vec![
            failure(1, FailureSource::Interrupted),
            failure(2, step),
            failure(3, FailureSource::Handler),
        ];
        assert_eq!(ended_attempts(&[first, second]), (2, 2));
        assert_eq!(
            ended_attempts(&[transition(0, 0, None, Vec::new())]),
            (0, 0)
        );
        // And its row says it stopped, not that it failed.
        let kind_and_name = |source: FailureSource| {
            let failure = failure(1, source);
            let row = item_row(TimelineItem::Failure { failure: &failure });
            (row[1].text().to_owned(), row[2].text().to_owned())
        };
        assert_eq!(
            kind_and_name(FailureSource::Interrupted),
            ("stopped".to_owned(), "interrupted".to_owned())
        );
        assert_eq!(
            kind_and_name(FailureSource::Handler),
            ("failed".to_owned(), "handler".to_owned())
        );
    }

    /// A state's steps go under the last record that continues it by their time: before
    /// the migration under the state, after it under the migration's record, after a second
    /// record that continues the first under that one; a record's own steps stay with it.
    #[test]
    fn steps_after_a_record_that_continues_their_state_are_shown_under_it() {
        let transitions = vec![
            transition(0, 0, None, vec![step("plan", 5)]),
            transition(
                1,
                10,
                None,
                vec![step("a", 15), step("b", 25), step("c", 45)],
            ),
            transition(2, 20, Some(1), vec![step("own", 30)]),
            transition(3, 40, Some(2), Vec::new()),
        ];
        let names: Vec<Vec<&str>> = shown_under(&transitions)
            .iter()
            .map(|items| {
                items
                    .iter()
                    .map(|item| match item {
                        TimelineItem::Step { step, .. } => step.name.as_str(),
                        TimelineItem::Failure { .. } => "failure",
                    })
                    .collect()
            })
            .collect();
        assert_eq!(
            names,
            [vec!["plan"], vec!["a"], vec!["b", "own"], vec!["c"]]
        );
    }
}
