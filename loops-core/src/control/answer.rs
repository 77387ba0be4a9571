//! The control endpoint's answers to what goes wrong: [`ApiError`], which every error answer
//! is (an [`ErrorBody`] as JSON), and the extractors the routes take their arguments with,
//! which answer a malformed request with one too, not with axum's plain-text rejections.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Json, Path, Query, RawPathParams, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::wire::{ErrorBody, ErrorKind};
use crate::error::Error;

/// Largest request body the control endpoint takes, in bytes (64 MiB): a payload of the
/// runtime's default limit (2 MiB) many times over; the runtime refuses payloads over its own
/// limit. A client reading a payload to send need read no more than this.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// The refusal of a request body over [`MAX_BODY_BYTES`]: the process's, and the client's,
/// which refuses such a body before sending it.
pub(super) fn over_the_body_limit() -> String {
    format!(
        "the request is over the control endpoint's limit of {} MiB; an event's payload is at most the runtime's max_payload_bytes (2 MiB by default): keep large data outside the store and send a reference to it",
        MAX_BODY_BYTES / (1024 * 1024)
    )
}

/// An error answer: its status and its [`ErrorBody`].
pub(super) struct ApiError {
    status: StatusCode,
    body: ErrorBody,
}

impl ApiError {
    /// An answer of `status`, `kind` and `message`, about no run.
    pub(super) fn new(status: StatusCode, kind: ErrorKind, message: String) -> Self {
        ApiError {
            status,
            body: ErrorBody {
                kind,
                message,
                run_id: None,
            },
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, kind, run_id) = match &e {
            Error::RunNotFound { run_id } => (
                StatusCode::NOT_FOUND,
                ErrorKind::RunNotFound,
                Some(run_id.clone()),
            ),
            Error::InvalidRunId { run_id, .. } => (
                StatusCode::BAD_REQUEST,
                ErrorKind::InvalidArgument,
                Some(run_id.clone()),
            ),
            Error::InvalidName { run_id, .. } | Error::InvalidAttribute { run_id, .. } => (
                StatusCode::BAD_REQUEST,
                ErrorKind::InvalidArgument,
                Some(run_id.clone()),
            ),
            Error::InvalidSchedule { .. } => {
                (StatusCode::BAD_REQUEST, ErrorKind::InvalidArgument, None)
            }
            Error::ScheduleNotFound { .. } => (StatusCode::NOT_FOUND, ErrorKind::Failed, None),
            // What the caller sent: said as a bad argument, as the CLI says it locally.
            Error::EventEncode { run_id, .. } | Error::PayloadTooLarge { run_id, .. } => (
                StatusCode::BAD_REQUEST,
                ErrorKind::InvalidArgument,
                Some(run_id.clone()),
            ),
            Error::SealedRefused { run_id, .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorKind::InvalidArgument,
                Some(run_id.clone()),
            ),
            Error::EventRefused { run_id, .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorKind::EventRefused,
                Some(run_id.clone()),
            ),
            Error::Storage { .. } | Error::Database { .. } | Error::Open { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, ErrorKind::Failed, None)
            }
            _ => (StatusCode::CONFLICT, ErrorKind::Failed, None),
        };
        ApiError {
            status,
            body: ErrorBody {
                kind,
                message: e.chain(),
                run_id,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

/// The run a request's path names (its `{run}` segment), if it names one.
async fn run_of<S: Send + Sync>(parts: &mut Parts, state: &S) -> Option<String> {
    let params = RawPathParams::from_request_parts(parts, state).await.ok()?;
    params
        .iter()
        .find(|(name, _)| *name == "run")
        .map(|(_, value)| value.to_owned())
}

/// The answer to a request axum could not read: `InvalidArgument`, with the status axum
/// gives it (400; 413 over the body limit; 415 without a JSON content type; 422 for a body of
/// the wrong shape) and its reason.
fn malformed(status: StatusCode, reason: String, run_id: Option<String>) -> ApiError {
    let mut e = ApiError::new(status, ErrorKind::InvalidArgument, reason);
    e.body.run_id = run_id;
    e
}

/// A JSON body of type `T`; a body that is not one answers as [`malformed`].
pub(super) struct Body<T>(pub(super) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let (mut parts, body) = request.into_parts();
        let run = run_of(&mut parts, state).await;
        match Json::<T>::from_request(Request::from_parts(parts, body), state).await {
            Ok(Json(value)) => Ok(Body(value)),
            Err(e) => {
                let e: JsonRejection = e;
                let reason = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    // axum's words ("Failed to buffer the request body: length limit
                    // exceeded") name neither the limit nor what to do.
                    over_the_body_limit()
                } else {
                    e.body_text()
                };
                Err(malformed(e.status(), reason, run))
            }
        }
    }
}

/// The query string, as `T`; one that is not answers as [`malformed`].
pub(super) struct Params<T>(pub(super) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(Params(value)),
            Err(e) => {
                let e: QueryRejection = e;
                Err(malformed(e.status(), e.body_text(), None))
            }
        }
    }
}

/// The path's parameters, as `T`; parameters that are not (a seq that is not a number, a
/// segment that is not UTF-8) answer as [`malformed`].
pub(super) struct PathOf<T>(pub(super) T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathOf<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(PathOf(value)),
            Err(e) => {
                let e: PathRejection = e;
                let run = run_of(parts, state).await;
                Err(malformed(e.status(), e.body_text(), run))
            }
        }
    }
}
