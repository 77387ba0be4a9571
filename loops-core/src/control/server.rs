//! The control endpoint's server: axum routes over the runtime's public API.

use std::io::ErrorKind as IoKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{DefaultBodyLimit, Json, RawPathParams, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

use super::answer::{ApiError, Body, MAX_BODY_BYTES, Params, PathOf};
use super::wire::{
    CancelRequest, CompactReply, ErrorKind, Event, Failed, Found, LOOPS_VERSION, Latest, ListQuery,
    PROTOCOL, PruneReply, PruneRequest, RetryReply, Run, RunStep, SendRequest, SentReply, Step,
    StoredSchema, VERSION_HEADER, Version,
};
use super::{ControlError, Endpoint, check_socket_path, temporary_name};
use crate::error::Error;
use crate::retention::RetentionPolicy;
use crate::runtime::Runtime;
use crate::schema::SchemaHash;
use crate::store::RunStatus;
use crate::{Pruned, TransitionRecord};

/// A running control endpoint. Dropping it (or [`stop`](Self::stop)) stops the server and
/// removes its socket file.
#[derive(Debug)]
pub struct ControlServer {
    endpoint: Endpoint,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    socket: Option<PathBuf>,
}

impl ControlServer {
    /// Where it listens (for TCP with port 0, the port chosen).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Stops accepting, lets requests in progress finish, and removes the socket file.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.remove_socket();
    }

    fn remove_socket(&mut self) {
        if let Some(path) = self.socket.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.cancel();
        self.remove_socket();
    }
}

impl Runtime {
    /// Serves the control endpoint at `endpoint` until the returned server is stopped or
    /// dropped: the `loops` CLI (or a [`Client`](super::Client)) reads this runtime's store
    /// and steers its runs through it while this process holds the store. Must be called
    /// inside a tokio runtime.
    ///
    /// A Unix socket is created with mode 0600 (it is bound under a temporary name, made
    /// owner-only, then renamed into place); a stale socket left by a process that died is
    /// replaced, anything else at the path is not. A TCP endpoint reads its token file first.
    ///
    /// # Errors
    /// [`ControlError::Token`] if a TCP endpoint's token file is missing, empty or readable
    /// by others; [`ControlError::InUse`] if another process answers on the socket;
    /// [`ControlError::Bind`] if the socket or port cannot be bound, or a file, directory or
    /// link that is not a socket is at the socket's path.
    pub async fn serve_control(&self, endpoint: Endpoint) -> Result<ControlServer, ControlError> {
        let token = match &endpoint {
            Endpoint::Tcp { token_file, .. } => Some(read_token(token_file)?),
            Endpoint::Unix(_) => None,
        };
        let app = router(Arc::new(Served {
            runtime: self.clone(),
            token,
        }));
        let stop = CancellationToken::new();
        let stopped = stop.clone().cancelled_owned();
        let bind_error = |cause| ControlError::Bind {
            endpoint: endpoint.to_string(),
            cause,
        };
        let (bound, task, socket) = match &endpoint {
            Endpoint::Unix(path) => {
                let listener = bind_unix(path, &endpoint).await?;
                let task = tokio::spawn(async move {
                    axum::serve(listener, app)
                        .with_graceful_shutdown(stopped)
                        .await
                });
                (endpoint.clone(), task, Some(path.clone()))
            }
            Endpoint::Tcp { addr, token_file } => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(bind_error)?;
                let addr = listener.local_addr().map_err(bind_error)?;
                let task = tokio::spawn(async move {
                    axum::serve(listener, app)
                        .with_graceful_shutdown(stopped)
                        .await
                });
                let bound = Endpoint::Tcp {
                    addr,
                    token_file: token_file.clone(),
                };
                (bound, task, None)
            }
        };
        tracing::info!(endpoint = %bound, "serving the control endpoint");
        Ok(ControlServer {
            endpoint: bound,
            stop,
            task: Some(task),
            socket,
        })
    }

    /// [`serve_control`](Self::serve_control) on the Unix socket next to this runtime's
    /// redb store file ([`socket_path`](super::socket_path)), where `loops --store FILE`
    /// looks for it.
    ///
    /// # Errors
    /// [`ControlError::NoStoreFile`] if the store is not a redb file; otherwise as
    /// [`serve_control`](Self::serve_control).
    pub async fn serve_control_next_to_store(&self) -> Result<ControlServer, ControlError> {
        let Some(redb) = self.redb() else {
            return Err(ControlError::NoStoreFile {
                store: self.store().label(),
            });
        };
        let endpoint = Endpoint::next_to(redb.path());
        self.serve_control(endpoint).await
    }
}

/// Binds the socket at `path` with mode 0600: bound under a temporary name in the same
/// directory, made owner-only, then renamed into place, so that it is never reachable with
/// a wider mode. A socket at `path` that nobody answers on is a stale one and is replaced.
async fn bind_unix(
    path: &Path,
    endpoint: &Endpoint,
) -> Result<tokio::net::UnixListener, ControlError> {
    let bind_error = |cause| ControlError::Bind {
        endpoint: endpoint.to_string(),
        cause,
    };
    if tokio::net::UnixStream::connect(path).await.is_ok() {
        return Err(ControlError::InUse {
            endpoint: endpoint.to_string(),
        });
    }
    // Only a socket is replaced: a file, a directory or a link at the path is someone's.
    if let Some(kind) = not_a_socket(path) {
        return Err(bind_error(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "{kind} is at the socket's path, not a socket: it is left as it is (move it \
                 away, or name another endpoint)"
            ),
        )));
    }
    check_socket_path(path, endpoint)?;
    let temporary = temporary_name(path);
    let _ = std::fs::remove_file(&temporary);
    let listener = tokio::net::UnixListener::bind(&temporary).map_err(bind_error)?;
    let placed = owner_only(&temporary).and_then(|()| std::fs::rename(&temporary, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&temporary);
        return Err(bind_error(e));
    }
    Ok(listener)
}

/// What is at `path` if it is there and is not a socket ("a regular file", "a directory",
/// "a symbolic link", ...); `None` if nothing is, or a socket.
fn not_a_socket(path: &Path) -> Option<&'static str> {
    let kind = std::fs::symlink_metadata(path).ok()?.file_type();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if kind.is_socket() {
            return None;
        }
    }
    Some(crate::store::redb::file_kind(&kind))
}

#[cfg(unix)]
fn owner_only(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

#[cfg(not(unix))]
fn owner_only(_: &Path) -> std::io::Result<()> {
    Ok(())
}

/// The token in `path`: its contents without white space at either end. Refused if the file
/// is missing, empty, or (on Unix) readable or writable by its group or others.
pub(super) fn read_token(path: &Path) -> Result<String, ControlError> {
    let refuse = |reason: String| ControlError::Token {
        path: path.to_owned(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        IoKind::NotFound => refuse(
            "does not exist; a TCP control endpoint needs a bearer token: write one to the file (chmod 600)".to_owned(),
        ),
        _ => refuse(format!("cannot read it: {e}")),
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(refuse(format!(
                "its mode is {mode:o}, so others may read the token; chmod 600 it"
            )));
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    let token = std::fs::read_to_string(path)
        .map_err(|e| refuse(format!("cannot read it: {e}")))?
        .trim()
        .to_owned();
    if token.is_empty() {
        return Err(refuse("is empty; write a token to it".to_owned()));
    }
    Ok(token)
}

/// What the handlers share.
struct Served {
    runtime: Runtime,
    /// The bearer token every request must carry (TCP only).
    token: Option<String>,
}

type Shared = Arc<Served>;

fn router(served: Shared) -> Router {
    let v = |path: &str| format!("/{PROTOCOL}{path}");
    let routes = Router::new()
        .route(&v("/version"), get(version))
        .route(&v("/runs"), get(list))
        .route(&v("/runs/{run}"), get(run_info))
        .route(&v("/runs/{run}/latest"), get(latest))
        .route(&v("/runs/{run}/history"), get(history))
        .route(&v("/runs/{run}/steps/{seq}"), get(steps))
        .route(&v("/runs/{run}/steps"), get(all_steps))
        .route(&v("/runs/{run}/failures"), get(failures))
        .route(&v("/runs/{run}/events"), get(events).post(send))
        .route(&v("/runs/{run}/attributes"), get(attributes))
        .route(&v("/runs/{run}/children"), get(children))
        .route(&v("/search"), post(search))
        .route(&v("/runs/{run}/cancel"), post(cancel))
        .route(&v("/runs/{run}/retry"), post(retry))
        .route(&v("/schemas"), get(schemas))
        .route(&v("/sealing"), get(sealing))
        .route(&v("/sealing/checks"), get(sealing_checks))
        .route(&v("/schemas/{hash}"), get(schema))
        .route(&v("/schedules"), get(schedules))
        .route(&v("/schedules/{name}/pause"), post(pause_schedule))
        .route(&v("/schedules/{name}/resume"), post(resume_schedule))
        .route(&v("/schedules/{name}/remove"), post(remove_schedule))
        .route(&v("/prune"), post(prune))
        .route(&v("/compact"), post(compact));
    // Prometheus' conventional path, outside the versioned protocol: scrapers know it.
    #[cfg(feature = "prometheus")]
    let routes = routes.route("/metrics", get(scrape));
    routes
        .route_layer(middleware::from_fn(checked_run_id))
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(Arc::clone(&served), gate))
        .with_state(served)
}

/// A route with a run id in its path (`/runs/{run}/..`): the id is checked as every
/// reader and writer checks one ([`validate_run_id_lookup`](crate::validate_run_id_lookup)),
/// so that one that breaks loops' rules is answered `invalid_argument` (400) on every route,
/// a read as a write, not looked up and answered as a run that does not exist.
async fn checked_run_id(
    params: Result<RawPathParams, RawPathParamsRejection>,
    request: Request,
    next: Next,
) -> Response {
    // A path that is not UTF-8 once decoded: the same kind of answer, not axum's plain text.
    let params = match params {
        Ok(params) => params,
        Err(rejection) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorKind::InvalidArgument,
                format!("the path cannot be read: {}", rejection.body_text()),
            )
            .into_response();
        }
    };
    if let Some((_, run_id)) = params.iter().find(|(key, _)| *key == "run")
        && let Err(e) = crate::validate_run_id_lookup(run_id)
    {
        return ApiError::from(e).into_response();
    }
    next.run(request).await
}

/// Every request: the bearer token first (an unauthenticated caller learns nothing, not
/// even the version), then the version; every answer carries this build's version.
async fn gate(State(served): State<Shared>, request: Request, next: Next) -> Response {
    if let Some(token) = &served.token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|given| same(given.as_bytes(), token.as_bytes())) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                ErrorKind::Unauthorized,
                "the control endpoint refuses requests without its bearer token (Authorization: Bearer TOKEN, the token file's contents)".to_owned(),
            )
            .into_response();
        }
    }
    let theirs = request
        .headers()
        .get(VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut response = match theirs {
        Some(theirs) if theirs != LOOPS_VERSION => ApiError::new(
            StatusCode::CONFLICT,
            ErrorKind::VersionMismatch,
            format!(
                "the process runs loops {LOOPS_VERSION}, and the client is loops {theirs}: use a loops CLI of version {LOOPS_VERSION}"
            ),
        )
        .into_response(),
        _ => next.run(request).await,
    };
    response
        .headers_mut()
        .insert(VERSION_HEADER, HeaderValue::from_static(LOOPS_VERSION));
    response
}

/// Compares two tokens in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

type Answer<T> = Result<Json<T>, ApiError>;

async fn no_route() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorKind::NoRoute,
        format!("no such path in control protocol {PROTOCOL}"),
    )
}

/// `GET /metrics`: the Prometheus text exposition of the recorder whose handle was given to
/// [`RuntimeBuilder::prometheus`](crate::RuntimeBuilder::prometheus); 404 without one.
#[cfg(feature = "prometheus")]
async fn scrape(State(s): State<Shared>) -> Response {
    match &s.runtime.inner.config.prometheus {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            handle.render(),
        )
            .into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorKind::NoRoute,
            "this process serves no metrics: give RuntimeBuilder::prometheus the handle of the installed Prometheus recorder".to_owned(),
        )
        .into_response(),
    }
}

async fn version(State(s): State<Shared>) -> Json<Version> {
    Json(Version {
        loops_version: LOOPS_VERSION.to_owned(),
        protocol: PROTOCOL.to_owned(),
        store: s.runtime.store().label(),
    })
}

async fn list(State(s): State<Shared>, Params(q): Params<ListQuery>) -> Answer<Vec<Run>> {
    let statuses = match q.status {
        Some(status) => vec![status],
        None => RunStatus::ALL.to_vec(),
    };
    let mut runs = Vec::new();
    for status in statuses {
        let listed = s
            .runtime
            .sealed_store()
            .list(status, q.workflow.as_deref())
            .await?;
        runs.extend(listed.into_iter().map(Run::from));
    }
    Ok(Json(runs))
}

async fn run_info(State(s): State<Shared>, PathOf(run): PathOf<String>) -> Answer<Option<Run>> {
    Ok(Json(
        s.runtime
            .sealed_store()
            .run_info(&run)
            .await?
            .map(Run::from),
    ))
}

async fn latest(State(s): State<Shared>, PathOf(run): PathOf<String>) -> Answer<Option<Latest>> {
    let latest = s.runtime.sealed_store().latest(&run).await?;
    Ok(Json(latest.map(|(run, record)| Latest {
        run: run.into(),
        record,
    })))
}

async fn history(
    State(s): State<Shared>,
    PathOf(run): PathOf<String>,
) -> Answer<Vec<TransitionRecord>> {
    let history = s.runtime.sealed_store().history(&run).await?;
    Ok(Json(existing(&s, run, history, Vec::is_empty).await?))
}

/// `items`, read of `run`, unless they are none and the run does not exist: a path naming
/// an unknown run answers 404 `run_not_found` (as `loops` says), not an empty list that
/// reads like a run with nothing recorded. The row is read only when `empty` says `items`
/// holds nothing.
async fn existing<T>(
    s: &Shared,
    run: String,
    items: T,
    empty: impl FnOnce(&T) -> bool,
) -> Result<T, Error> {
    if empty(&items) && s.runtime.sealed_store().run_info(&run).await?.is_none() {
        return Err(Error::RunNotFound { run_id: run });
    }
    Ok(items)
}

async fn steps(
    State(s): State<Shared>,
    PathOf((run, seq)): PathOf<(String, u64)>,
) -> Answer<Vec<Step>> {
    let steps = s.runtime.sealed_store().steps(&run, seq).await?;
    let steps = existing(&s, run, steps, Vec::is_empty).await?;
    Ok(Json(
        steps
            .into_iter()
            .map(|(name, occurrence, record)| Step {
                name,
                occurrence,
                record,
            })
            .collect(),
    ))
}

async fn all_steps(State(s): State<Shared>, PathOf(run): PathOf<String>) -> Answer<Vec<RunStep>> {
    let steps = s.runtime.sealed_store().all_steps(&run).await?;
    let steps = existing(&s, run, steps, Vec::is_empty).await?;
    Ok(Json(
        steps
            .into_iter()
            .map(|(seq, name, occurrence, record)| RunStep {
                seq,
                name,
                occurrence,
                record,
            })
            .collect(),
    ))
}

async fn failures(State(s): State<Shared>, PathOf(run): PathOf<String>) -> Answer<Vec<Failed>> {
    let failures = s.runtime.sealed_store().failures(&run).await?;
    let failures = existing(&s, run, failures, Vec::is_empty).await?;
    Ok(Json(
        failures
            .into_iter()
            .map(|(seq, record)| Failed { seq, record })
            .collect(),
    ))
}

async fn events(State(s): State<Shared>, PathOf(run): PathOf<String>) -> Answer<Vec<Event>> {
    let events = s.runtime.sealed_store().events(&run).await?;
    let events = existing(&s, run, events, Vec::is_empty).await?;
    Ok(Json(
        events
            .into_iter()
            .map(|(event_seq, record, delivered)| Event {
                event_seq,
                record,
                delivered,
            })
            .collect(),
    ))
}

async fn schemas(State(s): State<Shared>) -> Answer<Vec<StoredSchema>> {
    let schemas = s.runtime.store().schemas().await?;
    Ok(Json(
        schemas
            .into_iter()
            .map(|(hash, description)| StoredSchema {
                hash,
                description: Some(description),
            })
            .collect(),
    ))
}

/// The ids of the keys that sealed payloads in the store (the store as stored, under the
/// process's codec): a CLI without the key refuses to send payloads in clear.
async fn sealing(State(s): State<Shared>) -> Answer<Vec<String>> {
    Ok(Json(s.runtime.sealed_store().sealing_keys().await?))
}

/// The check values recorded with those keys, `[key id, check]`: they say nothing of a key,
/// and let a CLI with a key file refuse a key of a listed id and other bytes before it seals.
async fn sealing_checks(State(s): State<Shared>) -> Answer<Vec<(String, String)>> {
    Ok(Json(s.runtime.sealed_store().sealing_checks().await?))
}

async fn schema(State(s): State<Shared>, PathOf(hash): PathOf<String>) -> Answer<StoredSchema> {
    let hash: SchemaHash = hash.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorKind::InvalidArgument,
            format!("invalid schema hash {hash:?}: expected 16 hex digits"),
        )
    })?;
    let description = s.runtime.store().schema(hash).await?;
    Ok(Json(StoredSchema { hash, description }))
}

async fn send(
    State(s): State<Shared>,
    PathOf(run): PathOf<String>,
    Body(request): Body<SendRequest>,
) -> Answer<SentReply> {
    // Checked against the events the run's workflow declares, as the CLI's other paths do.
    let (sent, info) = s
        .runtime
        .send_json_row(
            &run,
            &request.name,
            request.key.as_deref(),
            &request.payload,
        )
        .await?;
    Ok(Json(SentReply {
        event_seq: sent.event_seq,
        duplicate: sent.duplicate,
        taken_here: s.runtime.drives(&info),
    }))
}

async fn cancel(
    State(s): State<Shared>,
    PathOf(run): PathOf<String>,
    Body(request): Body<CancelRequest>,
) -> Answer<Run> {
    s.runtime.cancel(&run, &request.reason).await?;
    stored_row(&s, run).await
}

/// The run's row as stored: under a codec, its texts stay sealed (the endpoint never opens
/// a payload; the CLI does, with its own key).
async fn stored_row(s: &Shared, run: String) -> Answer<Run> {
    match s.runtime.sealed_store().run_info(&run).await? {
        Some(info) => Ok(Json(info.into())),
        None => Err(Error::RunNotFound { run_id: run }.into()),
    }
}

async fn retry(State(s): State<Shared>, PathOf(run): PathOf<String>) -> Answer<RetryReply> {
    let info = s.runtime.retry(&run).await?;
    let taken_here = s.runtime.drives(&info);
    let Json(run) = stored_row(&s, run).await?;
    Ok(Json(RetryReply { run, taken_here }))
}

async fn prune(State(s): State<Shared>, Body(request): Body<PruneRequest>) -> Answer<PruneReply> {
    let policy = RetentionPolicy {
        max_age: request.max_age_ms.map(Duration::from_millis),
        keep_last: request.keep_last,
        keep_failed: request.keep_failed,
    };
    let Pruned {
        runs,
        records,
        run_ids,
        kept_for_parents,
        kept_for_children,
        changed_since_selection,
    } = s.runtime.prune_with(&policy, request.dry_run).await?;
    Ok(Json(PruneReply {
        runs,
        records,
        run_ids,
        kept_for_parents,
        kept_for_children,
        changed_since_selection,
    }))
}

async fn attributes(
    State(s): State<Shared>,
    PathOf(run): PathOf<String>,
) -> Answer<crate::Attributes> {
    let attributes = s.runtime.sealed_store().attributes(&run).await?;
    Ok(Json(
        existing(&s, run, attributes, crate::Attributes::is_empty).await?,
    ))
}

/// The child runs of a run, by run id (none if it has none; 404 if it does not exist).
async fn children(State(s): State<Shared>, PathOf(run): PathOf<String>) -> Answer<Vec<Run>> {
    let children = s.runtime.sealed_store().children(&run).await?;
    let children = existing(&s, run, children, Vec::is_empty).await?;
    Ok(Json(children.into_iter().map(Run::from).collect()))
}

/// The runs a filter selects: [`find_runs`](crate::find_runs) on the stored data (the
/// attribute index when the filter has an attribute filter).
async fn search(
    State(s): State<Shared>,
    Body(filter): Body<crate::RunFilter>,
) -> Answer<Vec<Found>> {
    let found = crate::find_runs(s.runtime.sealed_store(), &filter).await?;
    Ok(Json(
        found
            .into_iter()
            .map(|(info, attributes)| Found {
                run: info.into(),
                attributes,
            })
            .collect(),
    ))
}

async fn schedules(State(s): State<Shared>) -> Answer<Vec<crate::ScheduleStatus>> {
    Ok(Json(s.runtime.schedules().await?))
}

async fn pause_schedule(
    State(s): State<Shared>,
    PathOf(name): PathOf<String>,
) -> Answer<crate::ScheduleStatus> {
    let info = s.runtime.pause_schedule(&name).await?;
    Ok(Json(crate::ScheduleStatus::of(info, s.runtime.now_ms())))
}

async fn resume_schedule(
    State(s): State<Shared>,
    PathOf(name): PathOf<String>,
) -> Answer<crate::ScheduleStatus> {
    let info = s.runtime.resume_schedule(&name).await?;
    Ok(Json(crate::ScheduleStatus::of(info, s.runtime.now_ms())))
}

async fn remove_schedule(
    State(s): State<Shared>,
    PathOf(name): PathOf<String>,
) -> Answer<serde_json::Value> {
    s.runtime.remove_schedule(&name).await?;
    Ok(Json(serde_json::json!({})))
}

async fn compact(State(s): State<Shared>) -> Answer<CompactReply> {
    let compacted = s.runtime.compact().await?;
    Ok(Json(CompactReply {
        bytes_before: compacted.bytes_before,
        bytes_after: compacted.bytes_after,
    }))
}
