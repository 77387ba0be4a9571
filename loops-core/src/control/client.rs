//! The control endpoint's client: one HTTP/1.1 request per connection (hyper), over the
//! Unix socket or TCP.

use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::wire::{
    CancelRequest, CompactReply, ErrorBody, ErrorKind, Event, Failed, LOOPS_VERSION, Latest,
    PROTOCOL, PruneReply, PruneRequest, RetryReply, Run, RunStep, SendRequest, SentReply, Step,
    StoredSchema, VERSION_HEADER, Version,
};
use super::{ControlError, Endpoint};
use crate::record::TransitionRecord;
use crate::schema::SchemaHash;
use crate::store::{RunInfo, RunStatus};

/// What is left as it is in a path segment: RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Longest wait for an answer: 5 minutes (a prune or compaction of a large store takes a
/// while; a read takes milliseconds).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest wait for the answer to [`Client::connect`]'s version check, which a process
/// answers at once unless it is stopped or overloaded: a command against a frozen process
/// fails after this, not after the 5 minutes any other request may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of a process's control endpoint: what `loops` uses to read and steer the runs
/// of a store that a running process holds. Each method is one request; its errors are
/// [`ControlError`]s, the process's own errors as [`ControlError::Remote`].
#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
    token: Option<String>,
    server: Version,
}

impl Client {
    /// Connects to `endpoint` and checks that the process runs this loops version (a TCP
    /// endpoint's token is read from its token file first).
    ///
    /// # Errors
    /// [`ControlError::Unreachable`] if nothing answers (no socket, or no process behind
    /// it); [`ControlError::NoAnswer`] if the process took the connection but did not answer
    /// within [`CONNECT_TIMEOUT`] (it is stopped, or overloaded); [`ControlError::Token`] for a TCP endpoint whose token file cannot be used;
    /// [`ControlError::VersionMismatch`] naming both versions; [`ControlError::Remote`] if
    /// the process refuses the request (a wrong token: [`ErrorKind::Unauthorized`]).
    pub async fn connect(endpoint: Endpoint) -> Result<Client, ControlError> {
        Client::connect_within(endpoint, CONNECT_TIMEOUT).await
    }

    /// [`connect`](Self::connect), waiting at most `limit` for the process's answer to the
    /// version check.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), with [`ControlError::NoAnswer`] after `limit`.
    pub async fn connect_within(
        endpoint: Endpoint,
        limit: Duration,
    ) -> Result<Client, ControlError> {
        let token = match &endpoint {
            Endpoint::Tcp { token_file, .. } => Some(super::server::read_token(token_file)?),
            Endpoint::Unix(_) => None,
        };
        let mut client = Client {
            endpoint,
            token,
            server: Version {
                loops_version: LOOPS_VERSION.to_owned(),
                protocol: PROTOCOL.to_owned(),
                store: String::new(),
            },
        };
        client.server = client
            .request(Method::GET, "/version", Bytes::new(), limit)
            .await?;
        Ok(client)
    }

    /// The client of the process that serves the control endpoint next to the store file
    /// `store` ([`socket_path`](super::socket_path)), if one answers there: what a command
    /// that finds the file held asks first.
    ///
    /// Returns `Ok(None)` if there is no socket (a symbolic link there is none: it could lead
    /// to another store's process), or a socket whose process is gone
    /// ([`ControlError::Unreachable`]) or closed the connection unanswered, as a process
    /// that is stopping does ([`ControlError::Dropped`]).
    ///
    /// # Errors
    /// As [`connect`](Self::connect), but for those two.
    pub async fn next_to_store(store: &std::path::Path) -> Result<Option<Client>, ControlError> {
        let socket = super::socket_path(store);
        // A process binds a socket there, never a link (`serve_control` refuses to replace
        // one): a link may lead to another store's process, which is not this store's.
        match std::fs::symlink_metadata(&socket) {
            Ok(meta) if !meta.file_type().is_symlink() => {}
            _ => return Ok(None),
        }
        match Client::connect(Endpoint::Unix(socket)).await {
            Ok(client) => Ok(Some(client)),
            Err(ControlError::Unreachable { .. } | ControlError::Dropped { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// What the process said of itself: its loops version and its store's label.
    pub fn server(&self) -> &Version {
        &self.server
    }

    /// The runs with `status` (all if `None`), optionally of one workflow.
    ///
    /// # Errors
    /// As [`Client::connect`], and the process's store errors.
    pub async fn list(
        &self,
        status: Option<RunStatus>,
        workflow: Option<&str>,
    ) -> Result<Vec<RunInfo>, ControlError> {
        let mut query = Vec::new();
        if let Some(status) = status {
            query.push(format!("status={}", status.as_str()));
        }
        if let Some(workflow) = workflow {
            query.push(format!("workflow={}", encode(workflow)));
        }
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        let runs: Vec<Run> = self.get(&format!("/runs{query}")).await?;
        Ok(runs.into_iter().map(RunInfo::from).collect())
    }

    /// The run's row, or `None`.
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn run_info(&self, run_id: &str) -> Result<Option<RunInfo>, ControlError> {
        let run: Option<Run> = self.get(&run_path(run_id, "")).await?;
        Ok(run.map(RunInfo::from))
    }

    /// The run's row and latest transition record, or `None`.
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn latest(
        &self,
        run_id: &str,
    ) -> Result<Option<(RunInfo, TransitionRecord)>, ControlError> {
        let latest: Option<Latest> = self.get(&run_path(run_id, "/latest")).await?;
        Ok(latest.map(|l| (l.run.into(), l.record)))
    }

    /// Every transition record of the run.
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn history(&self, run_id: &str) -> Result<Vec<TransitionRecord>, ControlError> {
        self.get(&run_path(run_id, "/history")).await
    }

    /// The step records of the run's state at `seq`.
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn steps(&self, run_id: &str, seq: u64) -> Result<Vec<Step>, ControlError> {
        self.get(&run_path(run_id, &format!("/steps/{seq}"))).await
    }

    /// The step records of every state of the run, by seq, then name and occurrence (empty
    /// for an unknown run): [`steps`](Self::steps) of each seq, in one request.
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn all_steps(&self, run_id: &str) -> Result<Vec<RunStep>, ControlError> {
        self.get(&run_path(run_id, "/steps")).await
    }

    /// Every failed attempt of the run.
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn failures(&self, run_id: &str) -> Result<Vec<Failed>, ControlError> {
        self.get(&run_path(run_id, "/failures")).await
    }

    /// Every event sent to the run.
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn events(&self, run_id: &str) -> Result<Vec<Event>, ControlError> {
        self.get(&run_path(run_id, "/events")).await
    }

    /// The run's attributes (empty if it has none or does not exist).
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn attributes(&self, run_id: &str) -> Result<crate::Attributes, ControlError> {
        self.get(&run_path(run_id, "/attributes")).await
    }

    /// The child runs of the run `run_id` (those it started with
    /// [`Context::start_child`](crate::Context::start_child)), by run id; empty if it has none
    /// or does not exist.
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn children(&self, run_id: &str) -> Result<Vec<RunInfo>, ControlError> {
        let runs: Vec<Run> = self.get(&run_path(run_id, "/children")).await?;
        Ok(runs.into_iter().map(RunInfo::from).collect())
    }

    /// The runs `filter` selects, with their attributes, by run id
    /// ([`Runtime::list_runs_where`](crate::Runtime::list_runs_where) in the process).
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn search(
        &self,
        filter: &crate::RunFilter,
    ) -> Result<Vec<(RunInfo, crate::Attributes)>, ControlError> {
        let found: Vec<super::wire::Found> = self.post("/search", filter).await?;
        Ok(found
            .into_iter()
            .map(|f| (RunInfo::from(f.run), f.attributes))
            .collect())
    }

    /// Every stored schema.
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn schemas(&self) -> Result<Vec<(SchemaHash, String)>, ControlError> {
        let schemas: Vec<StoredSchema> = self.get("/schemas").await?;
        Ok(schemas
            .into_iter()
            .filter_map(|s| s.description.map(|d| (s.hash, d)))
            .collect())
    }

    /// The description stored for `hash`.
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn schema(&self, hash: SchemaHash) -> Result<Option<String>, ControlError> {
        let schema: StoredSchema = self.get(&format!("/schemas/{hash}")).await?;
        Ok(schema.description)
    }

    /// The ids of the keys that sealed payloads in the store, oldest first
    /// ([`Store::sealing_keys`](crate::Store::sealing_keys)); empty for a store in clear.
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn sealing_keys(&self) -> Result<Vec<String>, ControlError> {
        self.get("/sealing").await
    }

    /// The check values recorded with those keys, `(key id, check)`
    /// ([`Store::sealing_checks`](crate::Store::sealing_checks)): what
    /// [`check_keys`](crate::check_keys) compares a key file's keys with.
    ///
    /// # Errors
    /// As [`Client::list`].
    pub async fn sealing_checks(&self) -> Result<Vec<(String, String)>, ControlError> {
        self.get("/sealing/checks").await
    }

    /// Sends event `name` with `payload` (and idempotency key `key`) to the run, as
    /// [`Runtime::send`](crate::Runtime::send) in the process.
    ///
    /// # Errors
    /// As [`Client::list`]; the runtime's refusals as [`ControlError::Remote`].
    pub async fn send(
        &self,
        run_id: &str,
        name: &str,
        key: Option<&str>,
        payload: &RawValue,
    ) -> Result<SentReply, ControlError> {
        let body = SendRequest {
            name: name.to_owned(),
            key: key.map(str::to_owned),
            payload: payload.to_owned(),
        };
        self.post(&run_path(run_id, "/events"), &body).await
    }

    /// Cancels the run, as [`Runtime::cancel`](crate::Runtime::cancel) in the process.
    ///
    /// # Errors
    /// As [`Client::send`].
    pub async fn cancel(&self, run_id: &str, reason: &str) -> Result<RunInfo, ControlError> {
        let body = CancelRequest {
            reason: reason.to_owned(),
        };
        let run: Run = self.post(&run_path(run_id, "/cancel"), &body).await?;
        Ok(run.into())
    }

    /// Makes a failed run running again, as [`Runtime::retry`](crate::Runtime::retry);
    /// returns the run's row after it, and whether the serving process takes the run up
    /// ([`RetryReply::taken_here`]).
    ///
    /// # Errors
    /// As [`Client::send`].
    pub async fn retry(&self, run_id: &str) -> Result<(RunInfo, bool), ControlError> {
        let reply: RetryReply = self
            .post(&run_path(run_id, "/retry"), &serde_json::json!({}))
            .await?;
        Ok((reply.run.into(), reply.taken_here))
    }

    /// Every stored schedule with its next tick, as
    /// [`Runtime::schedules`](crate::Runtime::schedules).
    ///
    /// # Errors
    /// As [`Client::send`].
    pub async fn schedules(&self) -> Result<Vec<crate::ScheduleStatus>, ControlError> {
        let listed: Vec<crate::ScheduleStatus> = self.get("/schedules").await?;
        Ok(listed
            .into_iter()
            .map(crate::ScheduleStatus::named)
            .collect())
    }

    /// Pauses (`paused`) or resumes the schedule `name`, as
    /// [`Runtime::pause_schedule`](crate::Runtime::pause_schedule) and
    /// [`resume_schedule`](crate::Runtime::resume_schedule); returns it after.
    ///
    /// # Errors
    /// As [`Client::send`]; the process's `schedule ... does not exist` for a schedule it
    /// does not have.
    pub async fn pause_schedule(
        &self,
        name: &str,
        paused: bool,
    ) -> Result<crate::ScheduleStatus, ControlError> {
        let verb = if paused { "pause" } else { "resume" };
        let path = format!("/schedules/{}/{verb}", encode(name));
        let status: crate::ScheduleStatus = self.post(&path, &serde_json::json!({})).await?;
        Ok(status.named())
    }

    /// Removes the schedule `name`, as
    /// [`Runtime::remove_schedule`](crate::Runtime::remove_schedule).
    ///
    /// # Errors
    /// As [`pause_schedule`](Self::pause_schedule).
    pub async fn remove_schedule(&self, name: &str) -> Result<(), ControlError> {
        let path = format!("/schedules/{}/remove", encode(name));
        let _: serde_json::Value = self.post(&path, &serde_json::json!({})).await?;
        Ok(())
    }

    /// Prunes (or lists, with `dry_run`) ended runs, as
    /// [`Runtime::prune_with`](crate::Runtime::prune_with).
    ///
    /// # Errors
    /// As [`Client::send`].
    pub async fn prune(&self, request: &PruneRequest) -> Result<PruneReply, ControlError> {
        self.post("/prune", request).await
    }

    /// Compacts the store file, as [`Runtime::compact`](crate::Runtime::compact).
    ///
    /// # Errors
    /// As [`Client::send`].
    pub async fn compact(&self) -> Result<CompactReply, ControlError> {
        self.post("/compact", &serde_json::json!({})).await
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ControlError> {
        self.request(Method::GET, path, Bytes::new(), ANSWER_TIMEOUT)
            .await
    }

    async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ControlError> {
        let body = serde_json::to_vec(body).map_err(|e| self.protocol(format!("{e}")))?;
        if body.len() > super::answer::MAX_BODY_BYTES {
            // Refused here as the process would refuse it: sent, the process answers before it
            // has read the whole body, and the connection may close under the rest of it.
            return Err(ControlError::Remote {
                kind: ErrorKind::InvalidArgument,
                message: super::answer::over_the_body_limit(),
                run_id: None,
            });
        }
        self.request(Method::POST, path, Bytes::from(body), ANSWER_TIMEOUT)
            .await
    }

    fn protocol(&self, what: String) -> ControlError {
        ControlError::Protocol {
            endpoint: self.endpoint.to_string(),
            what,
        }
    }

    async fn request<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        limit: Duration,
    ) -> Result<T, ControlError> {
        let write = method != Method::GET;
        let mut request = Request::builder()
            .method(method)
            .uri(format!("/{PROTOCOL}{path}"))
            .header(header::HOST, "loops")
            .header(header::CONTENT_TYPE, "application/json")
            .header(VERSION_HEADER, LOOPS_VERSION);
        if let Some(token) = &self.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| self.protocol(format!("cannot build the request: {e}")))?;
        let exchange = async {
            match &self.endpoint {
                Endpoint::Unix(path) => {
                    let stream = tokio::net::UnixStream::connect(path).await;
                    exchange(stream.map_err(|e| self.unreachable(e))?, request).await
                }
                Endpoint::Tcp { addr, .. } => {
                    let stream = tokio::net::TcpStream::connect(addr).await;
                    exchange(stream.map_err(|e| self.unreachable(e))?, request).await
                }
            }
        };
        let (status, version, bytes) = tokio::time::timeout(limit, exchange)
            .await
            .map_err(|_| ControlError::NoAnswer {
                endpoint: self.endpoint.to_string(),
                waited: limit,
                write,
            })?
            .map_err(|e| match e {
                Exchange::Control(e) => e,
                Exchange::Http(e) => self.protocol(e),
                Exchange::Dropped(what) => ControlError::Dropped {
                    endpoint: self.endpoint.to_string(),
                    what,
                    write,
                },
            })?;
        if !status.is_success() {
            return Err(self.refusal(status, version, &bytes));
        }
        if let Some(server) = version.filter(|v| v != LOOPS_VERSION) {
            return Err(ControlError::VersionMismatch {
                endpoint: self.endpoint.to_string(),
                server,
                client: LOOPS_VERSION.to_owned(),
            });
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| self.protocol(format!("cannot read the answer to {path}: {e}")))
    }

    fn unreachable(&self, cause: std::io::Error) -> Exchange {
        Exchange::Control(ControlError::Unreachable {
            endpoint: self.endpoint.to_string(),
            cause,
        })
    }

    /// The error of a non-success answer: the process's [`ErrorBody`], or (from something
    /// that is not a loops endpoint of this protocol) its status and text.
    fn refusal(&self, status: StatusCode, version: Option<String>, bytes: &[u8]) -> ControlError {
        match serde_json::from_slice::<ErrorBody>(bytes) {
            Ok(body) if body.kind == ErrorKind::VersionMismatch => ControlError::VersionMismatch {
                endpoint: self.endpoint.to_string(),
                server: version.unwrap_or_else(|| "(unknown)".to_owned()),
                client: LOOPS_VERSION.to_owned(),
            },
            Ok(body) => ControlError::Remote {
                kind: body.kind,
                message: body.message,
                run_id: body.run_id,
            },
            Err(_) => {
                let text = String::from_utf8_lossy(bytes);
                let kind = match status {
                    StatusCode::UNAUTHORIZED => ErrorKind::Unauthorized,
                    StatusCode::BAD_REQUEST
                    | StatusCode::UNPROCESSABLE_ENTITY
                    | StatusCode::PAYLOAD_TOO_LARGE => ErrorKind::InvalidArgument,
                    StatusCode::NOT_FOUND => ErrorKind::NoRoute,
                    _ => ErrorKind::Failed,
                };
                ControlError::Remote {
                    kind,
                    message: format!(
                        "the control endpoint answered {status}: {}",
                        text.split_whitespace().collect::<Vec<_>>().join(" ")
                    ),
                    run_id: None,
                }
            }
        }
    }
}

/// How one exchange failed.
enum Exchange {
    Control(ControlError),
    Http(String),
    /// The connection closed (or failed) before the whole answer came.
    Dropped(String),
}

/// The failure of an exchange for hyper's error `e`: the connection closed or failed before
/// the answer was read whole ([`Exchange::Dropped`]: hyper's "connection closed before
/// message completed", "connection error", "error writing a body to connection"), or the
/// peer spoke something other than HTTP/1 ([`Exchange::Http`]).
fn failed_exchange(e: &hyper::Error) -> Exchange {
    let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
    if e.is_closed()
        || e.is_incomplete_message()
        || e.is_canceled()
        || e.is_body_write_aborted()
        || io
    {
        Exchange::Dropped(e.to_string())
    } else {
        Exchange::Http(e.to_string())
    }
}

/// Sends `request` on `stream` and reads the whole answer: its status, loops version
/// header and body.
async fn exchange<S>(
    stream: S,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, Option<String>, Bytes), Exchange>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let http = |e: hyper::Error| failed_exchange(&e);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    let connection = tokio::spawn(connection);
    let response = sender.send_request(request).await.map_err(http)?;
    let status = response.status();
    let version = response
        .headers()
        .get(VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(http)?
        .to_bytes();
    drop(sender);
    let _ = connection.await;
    Ok((status, version, body))
}

fn encode(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

fn run_path(run_id: &str, rest: &str) -> String {
    format!("/runs/{}{rest}", encode(run_id))
}
