//! The UI's requests: each reads or writes through the [`Operator`](crate::operator::Operator)
//! as the matching command does, and answers with a page (or the part of one that refreshes).

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use loops_core::{RunInfo, RunStatus, now_ms};
use serde::Deserialize;
use std::sync::Arc;

use super::pages;
use super::query::{Listed, RunsQuery};
use super::state::Ui;
use crate::commands::graph::run_graph;
use crate::commands::history::{HistoryView, gather};
use crate::commands::runs::select;
use crate::commands::steer::delivery;
use crate::description::Description;
use crate::failure::{Failure, Result};
use crate::graph::svg;
use crate::open::Access;
use crate::operator::{Operator, not_found};

/// The runs `query` selects, and the workflows for the filter; a filter that does not parse
/// fails the runs only, so that the page still offers every workflow.
async fn listed(ui: &Arc<Ui>, query: &RunsQuery) -> Result<Listed> {
    let selection = query.selection();
    let now = now_ms();
    ui.with(Access::Read, move |store| {
        let mut workflows: Vec<String> = store
            .schemas()?
            .iter()
            .filter_map(|(_, text)| Description::parse(text).workflow)
            .collect();
        workflows.sort();
        workflows.dedup();
        Ok(Listed {
            runs: selection.and_then(|selection| select(store, &selection, now)),
            workflows,
        })
    })
    .await
}

/// `GET /`: the runs, filtered by the query.
pub async fn runs_page(State(ui): State<Arc<Ui>>, Query(query): Query<RunsQuery>) -> Response {
    let listed = listed(&ui, &query).await;
    page(pages::runs(&ui, &query, &listed, now_ms())).into_response()
}

/// `GET /live/runs`: the rows of the runs page, for its refresh.
pub async fn runs_live(State(ui): State<Arc<Ui>>, Query(query): Query<RunsQuery>) -> Response {
    let listed = listed(&ui, &query).await;
    page(pages::runs_live(&listed, now_ms())).into_response()
}

/// The `?note=N` of the page a write redirects to.
#[derive(Debug, Deserialize)]
pub struct NoteQuery {
    note: Option<u64>,
}

/// A run as its page shows it: its row, its history and its stored schema description (for
/// the send form's payload; `None` if the store has none for the run's schema).
type Shown = (RunInfo, HistoryView, Option<String>);

/// The run's row, history and schema description, or `None` if there is no such run.
async fn history(ui: &Arc<Ui>, run_id: String) -> Result<Option<Shown>> {
    ui.with(Access::Read, move |store| {
        if store.run(&run_id)?.is_none() {
            return Ok(None);
        }
        let (info, view) = gather(store, &run_id)?;
        let description = store.schema(info.schema)?;
        Ok(Some((info, view, description)))
    })
    .await
}

/// `GET /runs/{run_id}`: one run.
pub async fn run_page(
    State(ui): State<Arc<Ui>>,
    RunId(run_id): RunId,
    Query(query): Query<NoteQuery>,
) -> Response {
    match history(&ui, run_id.clone()).await {
        Ok(Some((info, view, description))) => {
            let note = query.note.and_then(|n| ui.note(n, &run_id));
            let shown = pages::run::Shown {
                info: &info,
                view: &view,
                description: description.as_deref(),
            };
            let markup = pages::run::page(&ui, &shown, note.as_deref(), now_ms());
            page(markup).into_response()
        }
        Ok(None) => missing(&ui, &run_id),
        Err(failure) => failed(&ui, StatusCode::INTERNAL_SERVER_ERROR, &failure),
    }
}

/// `GET /live/runs/{run_id}`: the part of the run's page that refreshes.
pub async fn run_live(State(ui): State<Arc<Ui>>, RunId(run_id): RunId) -> Response {
    match history(&ui, run_id.clone()).await {
        Ok(Some((info, view, description))) => {
            let shown = pages::run::Shown {
                info: &info,
                view: &view,
                description: description.as_deref(),
            };
            page(pages::run::live(&ui, &shown, now_ms())).into_response()
        }
        Ok(None) => (
            StatusCode::NOT_FOUND,
            page(pages::problem(&not_found(&ui.label, &run_id).message)),
        )
            .into_response(),
        Err(failure) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            page(pages::problem(&failure.message)),
        )
            .into_response(),
    }
}

/// `GET /runs/{run_id}/graph.svg`: the workflow's graph with the run's path, as
/// `loops graph --run RUN --svg` draws it.
pub async fn graph(State(ui): State<Arc<Ui>>, RunId(run_id): RunId) -> Response {
    let drawn = ui
        .with(Access::Read, move |store| {
            let graph = run_graph(store, &run_id, None)?;
            svg::render(&graph).map_err(|panic| {
                Failure::new(format!(
                    "cannot lay out the graph of workflow `{}` (layout-rs failed: {panic})",
                    graph.workflow
                ))
            })
        })
        .await;
    match drawn {
        Ok(svg) => ([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response(),
        Err(failure) => (StatusCode::NOT_FOUND, failure.message).into_response(),
    }
}

/// The send form.
#[derive(Debug, Deserialize)]
pub struct SendForm {
    token: String,
    event: String,
    payload: String,
    #[serde(default)]
    key: String,
}

/// `POST /runs/{run_id}/send`: sends the event, as `loops send` does.
pub async fn send(
    State(ui): State<Arc<Ui>>,
    RunId(run_id): RunId,
    form: std::result::Result<Form<SendForm>, FormRejection>,
) -> Response {
    let form = match form {
        Ok(Form(form)) => form,
        Err(rejection) => return unreadable(&ui, &rejection),
    };
    if !ui.guard.token_ok(&form.token) {
        return stale_token(&ui);
    }
    // Checked before the store is reached: a bad payload writes nothing.
    let payload = match crate::json::payload(&form.payload) {
        Ok(payload) => payload,
        Err(problem) => {
            let failure = Failure::usage(format!("the payload {problem}"));
            return failed(&ui, StatusCode::BAD_REQUEST, &failure);
        }
    };
    // Every send form of the run's page carries its page key: a request without one would
    // be sent again as a second event, where the form's key makes it one.
    if form.key.trim().is_empty() {
        let failure = Failure::usage(
            "the form has no page key (the run's page puts one in its send form, so that a \
             form sent twice is one event): send it from the run's page"
                .to_owned(),
        );
        return failed(&ui, StatusCode::BAD_REQUEST, &failure);
    }
    steer(ui, run_id, &form.token.clone(), move |store, id| {
        let event = form.event.trim();
        let key = form_key(&form.key, event, &payload);
        exists(store, id)?;
        let (sent, taker) = store.send(id, event, Some(&key), &payload)?;
        let info = exists(store, id)?;
        Ok(if sent.duplicate {
            format!(
                "this form was sent already (event seq {}); nothing written",
                sent.event_seq
            )
        } else {
            format!(
                "sent event `{event}` (event seq {}); {}",
                sent.event_seq,
                delivery(&info, event, taker)
            )
        })
    })
    .await
}

/// The idempotency key of a send form: the page's key (`ui-SEQ-EVENTS`, the run's state and
/// inbox when the page was drawn) and a digest of the event and its payload (as a JSON value:
/// the same form sent twice is one event, whatever its spacing; another event or payload
/// typed on the same page, from a second tab or after a first send, is sent).
fn form_key(page_key: &str, event: &str, payload: &serde_json::value::RawValue) -> String {
    use std::hash::Hasher as _;
    let page_key = page_key.trim();
    let value = serde_json::from_str::<serde_json::Value>(payload.get())
        .map_or_else(|_| payload.get().to_owned(), |v| v.to_string());
    // FNV-1a: the same digest in every build (std's hasher may change between releases, and
    // the key outlives the process in the store).
    let mut digest = fnv::FnvHasher::default();
    digest.write(event.as_bytes());
    digest.write(&[0]);
    digest.write(value.as_bytes());
    format!("{page_key}-{:016x}", digest.finish())
}

/// The reason the UI's cancel form gives when its reason is left empty.
const UI_CANCEL_REASON: &str = "cancelled in the loops web UI";

/// The cancel form.
#[derive(Debug, Deserialize)]
pub struct CancelForm {
    token: String,
    #[serde(default)]
    reason: String,
}

/// `POST /runs/{run_id}/cancel`: cancels the run, as `loops cancel` does.
pub async fn cancel(
    State(ui): State<Arc<Ui>>,
    RunId(run_id): RunId,
    form: std::result::Result<Form<CancelForm>, FormRejection>,
) -> Response {
    let form = match form {
        Ok(Form(form)) => form,
        Err(rejection) => return unreadable(&ui, &rejection),
    };
    steer(ui, run_id, &form.token.clone(), move |store, id| {
        let reason = match form.reason.trim() {
            "" => UI_CANCEL_REASON,
            reason => reason,
        };
        let before = exists(store, id)?;
        let info = store.cancel(id, reason)?;
        Ok(format!(
            "{} (was {} in state {}, seq {}): {reason}",
            if info.status == RunStatus::Cancelled {
                "cancelled"
            } else {
                "cancellation asked: the process that drives it stops it at its next step"
            },
            before.status,
            before.state,
            before.seq
        ))
    })
    .await
}

/// The retry form.
#[derive(Debug, Deserialize)]
pub struct RetryForm {
    token: String,
}

/// `POST /runs/{run_id}/retry`: makes a failed run running again, as `loops retry` does.
pub async fn retry(
    State(ui): State<Arc<Ui>>,
    RunId(run_id): RunId,
    form: std::result::Result<Form<RetryForm>, FormRejection>,
) -> Response {
    let form = match form {
        Ok(Form(form)) => form,
        Err(rejection) => return unreadable(&ui, &rejection),
    };
    steer(ui, run_id, &form.token, move |store, id| {
        let (info, _) = store.retry(id)?;
        Ok(format!(
            "{} again in state {} (seq {}), with a fresh budget of attempts",
            info.status, info.state, info.seq
        ))
    })
    .await
}

/// `GET /assets/ui.js`.
pub async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/ui.js"),
    )
        .into_response()
}

/// `GET /assets/ui.css`.
pub async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/ui.css"),
    )
        .into_response()
}

/// The run's row, or the failure that it does not exist.
fn exists(store: &dyn Operator, run_id: &str) -> Result<RunInfo> {
    store
        .run(run_id)?
        .ok_or_else(|| not_found(store.label(), run_id))
}

/// A write to run `run_id` by a form that carries `token`: `f` makes it with the store
/// reached for writing and says what it did; the answer is the run's page with that note, or
/// the page of why not (403 for a wrong token).
async fn steer(
    ui: Arc<Ui>,
    run_id: String,
    token: &str,
    f: impl FnOnce(&dyn Operator, &str) -> Result<String> + Send + 'static,
) -> Response {
    if !ui.guard.token_ok(token) {
        return stale_token(&ui);
    }
    let id = run_id.clone();
    let done = ui.with(Access::Write, move |store| f(store, &id)).await;
    written(&ui, &run_id, done)
}

/// The answer to a write: back to the run's page with what it did, or the page of why not.
fn written(ui: &Ui, run_id: &str, done: Result<String>) -> Response {
    match done {
        Ok(text) => {
            let n = ui.keep_note(run_id, text);
            Redirect::to(&format!("{}?note={n}", pages::run_href(run_id))).into_response()
        }
        Err(failure) => failed(ui, StatusCode::CONFLICT, &failure),
    }
}

fn stale_token(ui: &Ui) -> Response {
    let failure = Failure::new(
        "this form's token is not this loops ui's (it was restarted, or the form came from elsewhere): reload the page and try again",
    );
    failed(ui, StatusCode::FORBIDDEN, &failure)
}

fn missing(ui: &Ui, run_id: &str) -> Response {
    failed(ui, StatusCode::NOT_FOUND, &not_found(&ui.label, run_id))
}

/// A run id from the URL, checked as every CLI command checks one
/// ([`loops_core::validate_run_id_lookup`], as `run_id_arg`): one the CLI refuses (a control
/// character, white space at an end, too long) is answered 400 on a failure page, not looked
/// up and echoed as a run that does not exist.
pub struct RunId(String);

impl FromRequestParts<Arc<Ui>> for RunId {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        ui: &Arc<Ui>,
    ) -> std::result::Result<Self, Response> {
        // A path axum cannot read as text (bytes that are not UTF-8): the same failure page.
        let Path(run_id) = Path::<String>::from_request_parts(parts, ui)
            .await
            .map_err(|rejection| {
                let why = format!(
                    "the run id in the URL cannot be read: {}",
                    rejection.body_text()
                );
                failed(ui, StatusCode::BAD_REQUEST, &Failure::usage(why))
            })?;
        loops_core::validate_run_id_lookup(&run_id)
            .map_err(|e| failed(ui, StatusCode::BAD_REQUEST, &Failure::usage(e.chain())))?;
        Ok(RunId(run_id))
    }
}

/// The page of a form that could not be read (a field missing, a body that is not a form):
/// 400, saying so on the page of a failure, not in axum's plain text; a form over
/// [`FORM_LIMIT_BYTES`](super::FORM_LIMIT_BYTES): 413, saying how to send that much.
fn unreadable(ui: &Ui, rejection: &FormRejection) -> Response {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return too_large(ui);
    }
    let failure = Failure::usage(format!(
        "this request is not a form this loops ui sends ({}): reload the run's page and use its forms",
        rejection.body_text()
    ));
    failed(ui, StatusCode::BAD_REQUEST, &failure)
}

/// A request that announces a body over [`FORM_LIMIT_BYTES`](super::FORM_LIMIT_BYTES):
/// refused at once (413, [`too_large`]), before a byte of it is read. (A body that does not
/// announce its length is cut at the limit as it is read, with the same answer.)
pub(super) async fn refuse_oversized(
    State(ui): State<Arc<Ui>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|bytes| bytes > super::FORM_LIMIT_BYTES as u64) {
        return too_large(&ui);
    }
    next.run(request).await
}

/// The page of a form over [`FORM_LIMIT_BYTES`](super::FORM_LIMIT_BYTES): 413, saying what
/// sends that much.
fn too_large(ui: &Ui) -> Response {
    let failure = Failure::usage(format!(
        "the form is over the {} MiB this page takes (an event's payload, percent-encoded, up to three bytes for each of its bytes): send a payload this large with `loops send RUN EVENT --json-file FILE`",
        super::FORM_LIMIT_BYTES / (1024 * 1024)
    ));
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        page(pages::failure(ui, &failure.message)),
    )
        .into_response()
}

/// The page of a failure; a bad argument is the request's fault (400), and a run that does
/// not exist is not found (404), whatever `status`.
fn failed(ui: &Ui, status: StatusCode, failure: &Failure) -> Response {
    let status = if failure.code == 2 {
        StatusCode::BAD_REQUEST
    } else if failure.missing {
        StatusCode::NOT_FOUND
    } else {
        status
    };
    (status, page(pages::failure(ui, &failure.message))).into_response()
}

/// A page's HTML, with bidirectional control characters shown escaped (`\u{202e}`), as the
/// CLI shows them: maud escapes what HTML would read as markup, but a payload's U+202E would
/// still make the browser show the text around it in another order.
fn page(markup: maud::Markup) -> Html<String> {
    let html = markup.into_string();
    match crate::output::shown(&html) {
        std::borrow::Cow::Borrowed(_) => Html(html),
        std::borrow::Cow::Owned(escaped) => Html(escaped),
    }
}
