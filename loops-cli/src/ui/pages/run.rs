//! One run's page: what it is doing, the buttons that steer it, its graph, its timeline.

use loops_core::{Attributes, DeclaredEvents, FailureSource, RunInfo, RunStatus};
use maud::{Markup, html};

use super::{layout, run_href, status};
use crate::attrs::value_text;
use crate::commands::history::{HistoryView, TimelineItem, TransitionView, shown_under};
use crate::json::{pretty, preview};
use crate::output::{duration, relative, rfc3339, when};
use crate::ui::state::Ui;
use crate::view::RunView;
use crate::view::{EventFate, EventView, FailureView, StepView, waiting_text};

/// Longest preview of a payload or a step's output, in characters.
const PREVIEW: usize = 80;

/// What a run's page shows.
pub struct Shown<'a> {
    /// The run's row.
    pub info: &'a RunInfo,
    /// Its history.
    pub view: &'a HistoryView,
    /// The stored schema description of the run's schema, if the store has it: the declared
    /// events, whose payload shape fills the send form.
    pub description: Option<&'a str>,
}

/// The run's page; `note` says what the write that led here did.
pub fn page(ui: &Ui, shown: &Shown<'_>, note: Option<&str>, now: u64) -> Markup {
    let info = shown.info;
    let body = html! {
        h1 { "Run " code { (info.run_id) } }
        @if let Some(note) = note { p.note role="status" { (note) } }
        div #live data-live={ "/live" (run_href(&info.run_id)) } { (live(ui, shown, now)) }
    };
    layout(ui, &format!("Run {}", info.run_id), body)
}

/// The part of the run's page that refreshes: everything but the title, in parts that the
/// page's script replaces one by one, each only when it changed (so a form is not redrawn
/// under the user's pointer while only a time on the page moved on).
pub fn live(ui: &Ui, shown: &Shown<'_>, now: u64) -> Markup {
    let (info, view) = (shown.info, shown.view);
    let last = view.transitions.len().saturating_sub(1);
    html! {
        div.top {
            section.summary data-part="summary" { (summary(info, view.run.attributes.as_ref(), now)) }
            section.actions data-part="actions" { (actions(ui, shown)) }
        }
        section.graph data-part="graph" {
            h2 { "Graph" }
            img src={ (run_href(&info.run_id)) "/graph.svg?v=" (info.seq) "-" (info.status.as_str()) }
                alt={ "the states of workflow " (info.workflow) ", with this run's path" };
        }
        section.timeline data-part="timeline" {
            h2 { "Timeline" }
            @for (i, (t, items)) in view.transitions.iter().zip(shown_under(&view.transitions)).enumerate() {
                (transition(t, &items, view.transitions.get(i + 1), i == last && !info.status.is_ended(), now))
            }
        }
        section.events data-part="events" {
            h2 { "Events" }
            (events(&view.events, &view.run, now))
        }
    }
}

/// The run's row, and its attributes (`None`: not read).
fn summary(info: &RunInfo, attributes: Option<&Attributes>, now: u64) -> Markup {
    let waiting = waiting_text(info, now);
    let until = info
        .wait
        .as_ref()
        .filter(|_| info.status == RunStatus::Waiting)
        .and_then(|w| w.until_ms);
    html! {
        dl {
            dt { "status" } dd #status { (status(info.status)) }
            dt { "workflow" } dd { (info.workflow) }
            dt { "state" } dd { span #state { (info.state) } " (seq " (info.seq) ", " (crate::view::attempt_text(info.attempt)) ")" }
            @if !waiting.is_empty() {
                dt { "waiting for" } dd #waiting { (waiting) }
            }
            @if let Some(until) = until {
                dt { "deadline" } dd { (rfc3339(until)) }
            }
            @if let Some(at) = info.retry_at_ms.filter(|_| info.status == RunStatus::Running) {
                dt { "next attempt" } dd { (when(at, now)) }
            }
            @if let Some(errors) = &info.error {
                dt { "last error" } dd { (chain(errors)) }
            }
            @if let Some(reason) = &info.cancel {
                dt { "cancel reason" } dd { (reason) }
            }
            @if let Some(block) = info.block.as_ref().filter(|_| info.status == RunStatus::Blocked) {
                dt { "blocked" } dd {
                    (block.reason)
                    @if !block.changes.is_empty() { ul { @for c in &block.changes { li { (c) } } } }
                }
            }
            dt { "schema" } dd { code { (info.schema.to_string()) } }
            dt { "created" } dd { (rfc3339(info.created_ms)) }
            dt { "updated" } dd { (when(info.updated_ms, now)) }
            @for (key, value) in attributes.into_iter().flatten() {
                dt { "attribute" } dd.attribute { code { (key) } " = " (value_text(value)) " (" (value.kind()) ")" }
            }
        }
    }
}

/// The forms that steer the run, each behind a confirmation dialog (assets/ui.js opens it;
/// the server checks the token and the JSON again).
fn actions(ui: &Ui, shown: &Shown<'_>) -> Markup {
    let (info, view) = (shown.info, shown.view);
    let href = run_href(&info.run_id);
    let token = ui.guard.token();
    let waits_for = info
        .wait
        .as_ref()
        .filter(|_| info.status == RunStatus::Waiting)
        .and_then(|w| w.event.as_deref())
        .unwrap_or_default();
    // The same form sent twice (a double click, a resubmission) is one event: its key is
    // made of the state and the inbox's length when the page was drawn.
    let key = format!("ui-{}-{}", info.seq, view.events.len());
    let payload = skeleton(shown.description, waits_for);
    html! {
        @if !info.status.is_ended() {
            form #send-form method="post" action={ (href) "/send" } {
                h2 { "Send an event" }
                input type="hidden" name="token" value=(token);
                input type="hidden" name="key" value=(key);
                label { "event " input name="event" required value=(waits_for) placeholder="event name"; }
                label.payload { "payload (JSON)" textarea name="payload" rows=(payload.lines().count().clamp(4, 16)) spellcheck="false" { (payload) } }
                p.json-error role="alert" {}
                button type="button" data-confirm { "Send…" }
                dialog {
                    p { "Send event " code data-fill="event" {} " to run " code { (info.run_id) } " with this payload?" }
                    pre data-fill="payload" {}
                    button.confirm type="submit" { "Confirm: send" }
                    button type="button" data-close { "Back" }
                }
            }
            form #cancel-form method="post" action={ (href) "/cancel" } {
                h2 { "Cancel" }
                input type="hidden" name="token" value=(token);
                label { "reason " input name="reason" placeholder="cancelled by an operator"; }
                button type="button" data-confirm { "Cancel run…" }
                dialog {
                    p { "Cancel run " code { (info.run_id) } " in state " (info.state) "? A cancelled run does not resume." }
                    button.confirm.danger type="submit" { "Confirm: cancel the run" }
                    button type="button" data-close { "Back" }
                }
            }
        }
        @if info.status == RunStatus::Failed {
            form #retry-form method="post" action={ (href) "/retry" } {
                h2 { "Retry" }
                input type="hidden" name="token" value=(token);
                button type="button" data-confirm { "Retry…" }
                dialog {
                    p { "Make run " code { (info.run_id) } " running again in state " (info.state) ", with a fresh budget of attempts?" }
                    button.confirm type="submit" { "Confirm: retry" }
                    button type="button" data-close { "Back" }
                }
            }
        }
    }
}

/// The send form's payload for `event`: a skeleton of the payload shape the workflow declares
/// for it (`DeclaredEvent::skeleton`), pretty-printed; `{}` when no event is named, or the
/// description declares none of that name.
fn skeleton(description: Option<&str>, event: &str) -> String {
    let declared = description
        .filter(|_| !event.is_empty())
        .map(DeclaredEvents::from_description);
    declared
        .as_ref()
        .and_then(|d| d.get(event))
        .and_then(|e| serde_json::to_string_pretty(e.skeleton()).ok())
        .unwrap_or_else(|| "{}".to_owned())
}

/// One transition: the state entered, how long the run stayed, and `items`, the steps and
/// failures shown under it ([`shown_under`]).
fn transition(
    t: &TransitionView,
    items: &[TimelineItem<'_>],
    next: Option<&TransitionView>,
    current: bool,
    now: u64,
) -> Markup {
    let stayed = match next {
        Some(next) => format!("for {}", duration(next.at_ms.saturating_sub(t.at_ms))),
        None if current => format!("for {} so far", duration(now.saturating_sub(t.at_ms))),
        None => String::new(),
    };
    html! {
        article.transition data-seq=(t.seq) {
            h3 {
                span.seq { (t.seq) } " " span.state { (t.state) } " "
                span.when title=(t.at) { (relative(t.at_ms, now)) } " "
                span.stayed { (stayed) }
            }
            @if let Some(m) = &t.migrated_from {
                p.migrated {
                    (if m.accepted { "accepted as it is from schema " } else { "migrated from schema " })
                    code { (m.schema) } " (version " (m.version) "), continues seq " (m.seq)
                }
            }
            (json_details(&format!("t{}", t.seq), "data", t.payload.get()))
            @if items.iter().any(|i| matches!(i, TimelineItem::Step { .. })) {
                table.steps {
                    thead { tr { th { "step" } th { "attempt" } th { "took" } th { "recorded" } th { "output" } } }
                    tbody { @for i in items { @if let TimelineItem::Step { seq, step: s } = i { (step(*seq, s, now)) } } }
                }
            }
            @for i in items { @if let TimelineItem::Failure { failure: f } = i { (failure(f)) } }
        }
    }
}

fn step(seq: u64, s: &StepView, now: u64) -> Markup {
    let key = format!("t{seq}-{}-{}-{}", s.name, s.occurrence, s.attempt);
    html! {
        tr {
            td { code { (s.name) } @if s.occurrence > 0 { " #" (s.occurrence) } }
            td.num { (s.attempt) }
            td.num { (duration(s.duration_ms)) }
            td title=(s.at) { (relative(s.at_ms, now)) }
            td { (json_details(&key, &preview(s.output.get(), PREVIEW), s.output.get())) }
        }
    }
}

fn failure(f: &FailureView) -> Markup {
    let source = match &f.source {
        FailureSource::Step { name, occurrence } if *occurrence > 0 => {
            format!("step `{name}` #{occurrence}")
        }
        FailureSource::Step { name, .. } => format!("step `{name}`"),
        FailureSource::Handler => "the handler".to_owned(),
        FailureSource::Interrupted => format!("interrupted: {}", loops_core::INTERRUPTED),
    };
    html! {
        div.failure {
            p { "attempt " (f.attempt) " failed " span title=(f.at) { (f.at) } ": " (source) }
            (chain(&f.errors))
        }
    }
}

fn events(events: &[EventView], run: &RunView, now: u64) -> Markup {
    html! {
        @if events.is_empty() {
            p.empty { "no events sent" }
        } @else {
            table.events {
                thead { tr { th { "seq" } th { "event" } th { "key" } th { "sent" } th { "taken" } th { "payload" } } }
                tbody {
                    @for e in events {
                        tr data-event=(e.name) {
                            td.num { (e.event_seq) }
                            td { code { (e.name) } }
                            td { @if let Some(key) = &e.key { code { (key) } } }
                            td title=(e.at) { (relative(e.at_ms, now)) }
                            td { @match e.fate(run) { EventFate::Delivered => "yes", fate => (fate.text()) } }
                            td { (json_details(&format!("e{}", e.event_seq), &preview(e.payload.get(), PREVIEW), e.payload.get())) }
                        }
                    }
                }
            }
        }
    }
}

/// An error chain, outermost first.
fn chain(errors: &[String]) -> Markup {
    html! { ol.chain { @for e in errors { li { (e) } } } }
}

/// `raw` JSON folded under `summary`, indented when opened; `key` names it on the page, so
/// that a refresh keeps it open.
fn json_details(key: &str, summary: &str, raw: &str) -> Markup {
    html! { details.json data-key=(key) { summary { (summary) } pre { (pretty(raw)) } } }
}
