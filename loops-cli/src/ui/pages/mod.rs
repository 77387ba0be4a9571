//! The UI's HTML. maud escapes every value it interpolates, so a payload's text (model
//! output, user input) is shown as text and never read as markup; the only markup not
//! written here is none (no `PreEscaped` of stored data).

pub mod run;

use loops_core::{RunInfo, RunStatus};
use maud::{DOCTYPE, Markup, html};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::query::{Listed, RunsQuery};
use super::state::Ui;
use crate::failure::Result;
use crate::output::relative;
use crate::view::waiting_text;

/// Milliseconds between two refreshes of a page's live parts (the script
/// reads it from `data-every`).
const REFRESH_MS: u64 = 1000;

/// A whole page titled `title` around `body`.
fn layout(ui: &Ui, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · loops" }
                link rel="stylesheet" href="/assets/ui.css";
                script src="/assets/ui.js" defer {}
            }
            body data-every=(REFRESH_MS) {
                header {
                    a.home href="/" { "loops" }
                    span.store title="the store" { (ui.label) }
                }
                main { (body) }
            }
        }
    }
}

/// The link to run `run_id`'s page (the id percent-encoded: it may hold any character).
pub fn run_href(run_id: &str) -> String {
    format!("/runs/{}", encode(run_id))
}

/// What a path segment or query value keeps as it is: RFC 3986's unreserved characters.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn encode(text: &str) -> String {
    utf8_percent_encode(text, UNRESERVED).to_string()
}

/// The runs page: the filters, and the table of the runs they select.
pub fn runs(ui: &Ui, query: &RunsQuery, listed: &Result<Listed>, now: u64) -> Markup {
    let workflows: &[String] = listed.as_ref().map_or(&[], |l| &l.workflows);
    let live = format!(
        "/live/runs?workflow={}&status={}&schema={}&newer_than={}&older_than={}",
        encode(&query.workflow),
        encode(&query.status),
        encode(&query.schema),
        encode(&query.newer_than),
        encode(&query.older_than)
    );
    let body = html! {
        h1 { "Runs" }
        form.filters method="get" action="/" {
            label { "workflow "
                select name="workflow" {
                    option value="" { "any" }
                    @for w in workflows {
                        option value=(w) selected[*w == query.workflow] { (w) }
                    }
                }
            }
            label { "status "
                select name="status" {
                    option value="" { "any" }
                    @for s in RunStatus::ALL {
                        option value=(s.as_str()) selected[s.as_str() == query.status] { (s.as_str()) }
                    }
                }
            }
            label { "changed within " input name="newer_than" size="6" placeholder="1h" value=(query.newer_than); }
            label { "changed before " input name="older_than" size="6" placeholder="30d" value=(query.older_than); }
            label { "schema " input name="schema" size="16" placeholder="hash or prefix" value=(query.schema); }
            button type="submit" { "Filter" }
        }
        table.runs data-live=(live) {
            thead { tr {
                th { "run" } th { "workflow" } th { "status" } th { "state" } th { "seq" }
                th { "attempt" } th { "updated" } th { "waiting for" }
            } }
            tbody #runs data-part="rows" { (runs_rows(listed, now)) }
        }
    };
    layout(ui, "Runs", body)
}

/// The runs table's rows, in a table of their own: the part of the runs page that refreshes.
pub fn runs_live(listed: &Result<Listed>, now: u64) -> Markup {
    html! { table { tbody data-part="rows" { (runs_rows(listed, now)) } } }
}

fn runs_rows(listed: &Result<Listed>, now: u64) -> Markup {
    match listed.as_ref().map(|listed| &listed.runs) {
        Err(failure) | Ok(Err(failure)) => {
            html! { tr { td.problem colspan="8" { (failure.message) } } }
        }
        Ok(Ok(runs)) if runs.is_empty() => {
            html! { tr { td.empty colspan="8" { "no runs match" } } }
        }
        Ok(Ok(runs)) => html! {
            @for info in runs { (run_row(info, now)) }
        },
    }
}

fn run_row(info: &RunInfo, now: u64) -> Markup {
    html! {
        tr data-run=(info.run_id) {
            td { a href=(run_href(&info.run_id)) { (info.run_id) } }
            td { (info.workflow) }
            td { (status(info.status)) }
            td.state { (info.state) }
            td.num { (info.seq) }
            td.num { (info.attempt) }
            td title=(crate::output::rfc3339(info.updated_ms)) { (relative(info.updated_ms, now)) }
            td { (waiting_text(info, now)) }
        }
    }
}

/// A status as a coloured word.
fn status(status: RunStatus) -> Markup {
    html! { span class={ "status " (status.as_str()) } data-status=(status.as_str()) { (status.as_str()) } }
}

/// A whole page saying why a request failed.
pub fn failure(ui: &Ui, message: &str) -> Markup {
    layout(
        ui,
        "Error",
        html! {
            h1 { "Not done" }
            (problem(message))
            p { a href="/" { "back to the runs" } }
        },
    )
}

/// One failure message, as a block.
pub fn problem(message: &str) -> Markup {
    html! { p.problem role="alert" { (message) } }
}
