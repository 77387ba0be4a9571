//! The control protocol's messages: JSON bodies over HTTP/1.1, on versioned paths.
//!
//! | method and path | body | answer |
//! | --- | --- | --- |
//! | `GET /v1/version` | | [`Version`] |
//! | `GET /v1/runs?status=S&workflow=W` | | `[`[`Run`]`]` (both filters optional) |
//! | `GET /v1/runs/{run}` | | [`Run`] or `null` |
//! | `GET /v1/runs/{run}/latest` | | [`Latest`] or `null` |
//! | `GET /v1/runs/{run}/history` | | `[TransitionRecord]` |
//! | `GET /v1/runs/{run}/steps/{seq}` | | `[`[`Step`]`]` |
//! | `GET /v1/runs/{run}/steps` | | `[`[`RunStep`]`]`: every state's, by seq |
//! | `GET /v1/runs/{run}/failures` | | `[`[`Failed`]`]` |
//! | `GET /v1/runs/{run}/events` | | `[`[`Event`]`]` |
//! | `GET /v1/runs/{run}/attributes` | | [`Attributes`](crate::Attributes) (`{}` if none) |
//! | `POST /v1/search` | [`RunFilter`](crate::RunFilter) | `[`[`Found`]`]`, by run id |
//! | `GET /v1/schemas` | | `[`[`StoredSchema`]`]` |
//! | `GET /v1/schemas/{hash}` | | [`StoredSchema`] (`description` `null` if none) |
//! | `POST /v1/runs/{run}/events` | [`SendRequest`] | [`SentReply`] |
//! | `POST /v1/runs/{run}/cancel` | [`CancelRequest`] | [`Run`] |
//! | `POST /v1/runs/{run}/retry` | `{}` | [`Run`] |
//! | `POST /v1/prune` | [`PruneRequest`] | [`PruneReply`] |
//! | `POST /v1/compact` | `{}` | [`CompactReply`] |
//!
//! Run ids are percent-encoded in paths. Every request carries the client's loops version
//! in the [`VERSION_HEADER`] header and every answer the server's; a request of another
//! version is refused (409, [`ErrorKind::VersionMismatch`]), and a client refuses an
//! answer of another version. A TCP endpoint refuses a request without its bearer token
//! (401, [`ErrorKind::Unauthorized`]) before anything else. Errors are [`ErrorBody`].

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::record::{FailureRecord, StepRecord, TransitionRecord};
use crate::schema::SchemaHash;
use crate::store::{EventRecord, RunInfo, RunStatus};

/// The protocol's version: the first segment of every path (`/v1/...`).
pub const PROTOCOL: &str = "v1";

/// The header with the sender's loops version, on every request and answer.
pub const VERSION_HEADER: &str = "loops-version";

/// This build's loops version (that of the loops-core crate).
pub const LOOPS_VERSION: &str = env!("CARGO_PKG_VERSION");

/// `GET /v1/version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// The process's loops version.
    pub loops_version: String,
    /// The protocol version, [`PROTOCOL`].
    pub protocol: String,
    /// The label of the process's store (a file path; a database without password).
    pub store: String,
}

/// The query of `GET /v1/runs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListQuery {
    /// Only runs with this status (all when absent).
    pub status: Option<RunStatus>,
    /// Only runs of this workflow.
    pub workflow: Option<String>,
}

/// A run's row with its id: [`RunInfo`]'s fields and `run_id` (which the stored row does
/// not repeat).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// The run id.
    pub run_id: String,
    /// The row.
    #[serde(flatten)]
    pub info: RunInfo,
}

impl From<RunInfo> for Run {
    fn from(info: RunInfo) -> Self {
        Run {
            run_id: info.run_id.clone(),
            info,
        }
    }
}

impl From<Run> for RunInfo {
    fn from(run: Run) -> Self {
        RunInfo {
            run_id: run.run_id,
            ..run.info
        }
    }
}

/// One run of `POST /v1/search`: its row and its attributes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Found {
    /// The run's row.
    pub run: Run,
    /// Its attributes, by key.
    pub attributes: crate::Attributes,
}

/// `GET /v1/runs/{run}/latest`: the run's row and latest transition record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Latest {
    /// The run's row.
    pub run: Run,
    /// Its latest transition record.
    pub record: TransitionRecord,
}

/// One step record of `GET /v1/runs/{run}/steps/{seq}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    /// The step's name.
    pub name: String,
    /// Which use of the name in the state's handler, from 0.
    pub occurrence: u32,
    /// The record.
    pub record: StepRecord,
}

/// One step record of `GET /v1/runs/{run}/steps`: every state's steps, by seq, then name
/// and occurrence.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunStep {
    /// The sequence number of the state that recorded it.
    pub seq: u64,
    /// The step's name.
    pub name: String,
    /// Which use of the name in the state's handler, from 0.
    pub occurrence: u32,
    /// The record.
    pub record: StepRecord,
}

/// One failed attempt of `GET /v1/runs/{run}/failures`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Failed {
    /// The sequence number of the state it failed in.
    pub seq: u64,
    /// The record.
    pub record: FailureRecord,
}

/// One inbox entry of `GET /v1/runs/{run}/events`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// Its sequence number in the run's inbox, from 0.
    pub event_seq: u64,
    /// The record.
    pub record: EventRecord,
    /// Whether a wait has taken it.
    pub delivered: bool,
}

/// One stored schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSchema {
    /// Its hash.
    pub hash: SchemaHash,
    /// Its description (`None`: none stored under the hash asked for).
    pub description: Option<String>,
}

/// `POST /v1/runs/{run}/events`: an event for the run, as
/// [`Runtime::send_json`](crate::Runtime::send_json) takes it: checked against the events the
/// run's workflow declares (refused with [`ErrorKind::EventRefused`], 422), then sent.
#[derive(Debug, Serialize, Deserialize)]
pub struct SendRequest {
    /// The event's name.
    pub name: String,
    /// The idempotency key, if any.
    pub key: Option<String>,
    /// The payload, as JSON.
    pub payload: Box<RawValue>,
}

/// The answer to a [`SendRequest`]: [`Sent`](crate::Sent) as JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentReply {
    /// The event's sequence number in the run's inbox.
    pub event_seq: u64,
    /// Whether an event with the same key had been sent already (nothing was written).
    pub duplicate: bool,
    /// Whether the serving process takes the event up itself: it drives the run now, or
    /// registers the run's workflow (`false`: the run waits until a process that drives its
    /// workflow drives it).
    pub taken_here: bool,
}

/// The answer to `POST /v1/runs/{run}/retry`: the run's row after the retry, and whether the
/// serving process takes it up (it drives the run now, or registers its workflow).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryReply {
    /// The run's row (its fields at the top level of the JSON object).
    #[serde(flatten)]
    pub run: Run,
    /// Whether the serving process drives the run (`false`: it waits for a process that
    /// drives its workflow).
    pub taken_here: bool,
}

/// `POST /v1/runs/{run}/cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    /// Why: kept with the run.
    pub reason: String,
}

/// `POST /v1/prune`: a [`RetentionPolicy`](crate::RetentionPolicy), applied (or, with
/// `dry_run`, only evaluated) by [`Runtime::prune_with`](crate::Runtime::prune_with).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneRequest {
    /// Remove runs that ended longer ago than this many ms.
    pub max_age_ms: Option<u64>,
    /// Keep at most this many ended runs.
    pub keep_last: Option<usize>,
    /// Keep failed runs whatever their age.
    pub keep_failed: bool,
    /// Only say what would be removed.
    pub dry_run: bool,
}

/// The answer to a [`PruneRequest`]: [`Pruned`](crate::Pruned) as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneReply {
    /// Runs removed (or that would be).
    pub runs: u64,
    /// Transition records removed (or that would be).
    pub records: u64,
    /// Their ids, oldest first.
    pub run_ids: Vec<String>,
    /// Ended child runs kept because their parent has not ended
    /// ([`Pruned::kept_for_parents`](crate::Pruned::kept_for_parents)); 0 from a server that
    /// predates the field.
    #[serde(default)]
    pub kept_for_parents: u64,
    /// Expired runs kept with a child run outside their family
    /// ([`Pruned::kept_for_children`](crate::Pruned::kept_for_children)); 0 from a server that
    /// predates the field.
    #[serde(default)]
    pub kept_for_children: u64,
    /// Selected runs the writes left because they changed after the selection
    /// ([`Pruned::changed_since_selection`](crate::Pruned::changed_since_selection)); 0 from
    /// a server that predates the field.
    #[serde(default)]
    pub changed_since_selection: u64,
}

/// The answer to `POST /v1/compact`: [`Compacted`](crate::Compacted) as JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactReply {
    /// File size before, in bytes.
    pub bytes_before: u64,
    /// File size after, in bytes.
    pub bytes_after: u64,
}

/// What kind of error an answer is, so that a client can act on it as it would on the
/// [`Error`](crate::Error) it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// No run has the id ([`Error::RunNotFound`](crate::Error::RunNotFound)); 404.
    RunNotFound,
    /// A run id, event name or key breaks loops' rules, or the request is malformed; 400 (a
    /// body the endpoint cannot read: 415 without a JSON content type, 413 over the body
    /// limit, 422 for JSON of the wrong shape).
    InvalidArgument,
    /// The request lacks the endpoint's bearer token, or has another; 401.
    Unauthorized,
    /// The request is of another loops version; 409.
    VersionMismatch,
    /// The runtime refused or failed the operation (a run that has ended, a payload too
    /// large, a store error); 409 or 500. The message is the error's chain.
    Failed,
    /// The event was refused ([`Error::EventRefused`](crate::Error::EventRefused)): its run's
    /// workflow does not declare it, or its payload cannot be the declared type; 422.
    EventRefused,
    /// No such path; 404.
    NoRoute,
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What kind of error.
    pub kind: ErrorKind,
    /// One line: the error and its causes.
    pub message: String,
    /// The run it is about, if any.
    pub run_id: Option<String>,
}
