//! A model client for the OpenAI-compatible chat-completions API (cargo feature `openai`):
//! `POST {base}/chat/completions`, as vLLM, llama.cpp's server, Ollama and the hosted
//! services serve it, over reqwest with rustls (the ring provider; no OpenSSL).
//!
//! One model call ([`Model::plan`], [`Model::fix`]) is one journaled step of the agent. It
//! sends a prompt that asks for the answer as one JSON object ([`prompt`]), checks the
//! answer against that schema and against the sources it edits ([`schema`]), and returns it
//! with the tokens every response reported ([`Usage`]), which the step records.
//!
//! Errors are classified ([`ModelError::is_transient`]): 429, 408, 409 and 5xx, a time-out, a
//! connection failure, a response that is not a chat completion and an answer that is not
//! the JSON asked for are worth another try; 400, 401, 403, 404 and the other 4xx are not.
//! A 429 or 5xx may say when to try again (`Retry-After`, in seconds or as an HTTP date, or
//! `retry-after-ms`), which is honoured.
//!
//! **Retries in two layers.** Inside one call, [`OpenAiModel::ask`] retries quick failures
//! itself, in a small bounded loop ([`next_wait`]: `--model-tries` tries, waits of at most
//! [`MAX_WAIT`]), so that the tokens of every try are counted in the call's [`Usage`] and
//! recorded with its answer. A call that still fails goes to loops as an error with its hints
//! ([`for_loops`]): a refusal is `loops::Error::permanent` (neither the step nor the state
//! tries it again), a `Retry-After` is `loops::Error::retry_after`, and the model step's retry
//! policy ([`step_policy`]) makes the call again in place, after that wait; a wait
//! over the runtime's park threshold parks the run durably, so an hour's `Retry-After` holds
//! no process and survives a restart.

mod prompt;
pub mod schema;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::{CONTENT_TYPE, HeaderMap};
use serde::Deserialize;
use serde_json::Value;

use crate::git::SourceFile;
use crate::model::{Answer, Decision, Model, Usage};
use crate::tokens::thousands;
use crate::workflow::{Change, Issue, Review, TestReport};

pub use self::prompt::Prompt;
use self::schema::SchemaError;

/// The longest wait between two tries that the client waits itself, in a call. A server
/// that asks for more makes the call fail with the hint, and loops waits it durably
/// ([`for_loops`]).
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// The wait before the second try when the server gives no hint; it doubles for each
/// further try, up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait without a hint.
pub const MAX_BACKOFF: Duration = Duration::from_secs(8);

/// Longest error message quoted from a server, in characters.
const MAX_QUOTED: usize = 300;

/// How the client is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The API's base URL: what comes before `/chat/completions` (`http://127.0.0.1:8080/v1`,
    /// `https://api.openai.com/v1`).
    pub base_url: String,
    /// The API key, sent as a bearer token; `None` sends none (local servers need none).
    pub api_key: Option<String>,
    /// The model to ask, as the server names it.
    pub model: String,
    /// How long one request may take, from sending it to the last byte of the answer.
    pub request_timeout: Duration,
    /// Tries per call, from 1.
    pub tries: u32,
}

/// How the client waits between tries: `tokio::time::sleep`, or a test's stand-in.
pub type Wait = Arc<dyn Fn(Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A client of one chat-completions endpoint, for one model.
pub struct OpenAiModel {
    http: reqwest::Client,
    endpoint: reqwest::Url,
    config: Config,
    wait: Wait,
}

impl std::fmt::Debug for OpenAiModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiModel")
            .field("endpoint", &self.endpoint.as_str())
            .field("model", &self.config.model)
            .field("api_key", &self.config.api_key.as_ref().map(|_| "<set>"))
            .field("request_timeout", &self.config.request_timeout)
            .field("tries", &self.config.tries)
            .finish()
    }
}

/// Why a model call failed. Every variant says what was asked of whom and what came back.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The configuration cannot work; nothing was sent.
    #[error("{0}")]
    Config(String),
    /// HTTP 429: too many requests, or a quota.
    #[error(
        "{endpoint} answered HTTP 429 Too Many Requests{}: {message}",
        hint(retry_after)
    )]
    RateLimited {
        /// The URL asked.
        endpoint: String,
        /// When the server said to try again.
        retry_after: Option<Duration>,
        /// The server's error message.
        message: String,
    },
    /// HTTP 408, 409 or 5xx: the server could not answer now.
    #[error("{endpoint} answered HTTP {status}{}: {message}", hint(retry_after))]
    Unavailable {
        /// The URL asked.
        endpoint: String,
        /// The status code.
        status: u16,
        /// When the server said to try again.
        retry_after: Option<Duration>,
        /// The server's error message.
        message: String,
    },
    /// HTTP 400, 401, 403, 404 or another 4xx: the request itself is refused (a bad key, an
    /// unknown model, a malformed request), and no retry will change that.
    #[error("{endpoint} refused the request with HTTP {status}, which no retry changes: {message}")]
    Refused {
        /// The URL asked.
        endpoint: String,
        /// The status code.
        status: u16,
        /// The server's error message.
        message: String,
    },
    /// No complete answer within the request time-out.
    #[error("{endpoint} sent no complete answer within {} s (the request time-out)", secs(*timeout))]
    TimedOut {
        /// The URL asked.
        endpoint: String,
        /// The time-out.
        timeout: Duration,
    },
    /// The connection failed (refused, reset, a TLS error).
    #[error("cannot get an answer from {endpoint}: {}", chain(error))]
    Transport {
        /// The URL asked.
        endpoint: String,
        /// reqwest's error, whose causes the message quotes (so it is no `source`: the
        /// chain would be said twice).
        error: reqwest::Error,
    },
    /// HTTP 200, but the body is not a chat completion (not JSON, no `choices`, no content).
    #[error("{endpoint} answered with something that is not a chat completion: {what}")]
    NotACompletion {
        /// The URL asked.
        endpoint: String,
        /// What is wrong with it.
        what: String,
    },
    /// The model's answer is not JSON.
    #[error("the model's answer is not JSON: {what}")]
    Malformed {
        /// What the parser said, and where.
        what: String,
        /// What the response that carried it cost.
        usage: Usage,
    },
    /// The model's answer is JSON, but not the object asked for, or an edit that cannot be
    /// applied to the sources.
    #[error("the model's answer does not match the schema asked for: {problem}")]
    OffSchema {
        /// What is wrong, and where in the answer.
        problem: SchemaError,
        /// What the response that carried it cost.
        usage: Usage,
    },
    /// Every try failed, or the server asked to wait longer than [`MAX_WAIT`].
    #[error("{last}; gave up after {tries} {} ({why}; {} tokens spent)",
        if *tries == 1 { "try" } else { "tries" }, thousands(usage.total_tokens()))]
    GaveUp {
        /// Tries made.
        tries: u32,
        /// Why no further try is made.
        why: String,
        /// What the failed tries cost.
        usage: Usage,
        /// The last try's error.
        last: Box<ModelError>,
    },
}

impl ModelError {
    /// Whether another try may succeed: rate limits, server errors, time-outs, connection
    /// failures and unusable answers are transient; refusals and bad configurations are not.
    pub fn is_transient(&self) -> bool {
        match self {
            ModelError::RateLimited { .. }
            | ModelError::Unavailable { .. }
            | ModelError::TimedOut { .. }
            | ModelError::Transport { .. }
            | ModelError::NotACompletion { .. }
            | ModelError::Malformed { .. }
            | ModelError::OffSchema { .. } => true,
            ModelError::Config(_) | ModelError::Refused { .. } | ModelError::GaveUp { .. } => false,
        }
    }

    /// When the server said to try again, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ModelError::RateLimited { retry_after, .. }
            | ModelError::Unavailable { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// What the request that failed so cost, if it got an answer that said (an unusable
    /// answer).
    fn spent(&self) -> Option<Usage> {
        match self {
            ModelError::Malformed { usage, .. } | ModelError::OffSchema { usage, .. } => {
                Some(*usage)
            }
            _ => None,
        }
    }
}

fn hint(retry_after: &Option<Duration>) -> String {
    retry_after.map_or_else(String::new, |d| format!(" (Retry-After: {} s)", secs(d)))
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s:.3}").trim_end_matches('0').to_owned()
    }
}

/// `e` and its sources, joined by `: ` (reqwest's own message is often only "error sending
/// request").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// How long to wait before the try after try `try_no` (from 1) of `tries` failed with
/// `err`, or why to give up: `err` is permanent, this was the last try, or the server asked
/// to wait longer than [`MAX_WAIT`]. Without a hint the wait is [`FIRST_BACKOFF`], doubled
/// per further try, at most [`MAX_BACKOFF`].
///
pub fn next_wait(err: &ModelError, try_no: u32, tries: u32) -> Result<Duration, String> {
    if !err.is_transient() {
        return Err("no retry changes that".to_owned());
    }
    if try_no >= tries {
        return Err(format!("the last of {tries} tries"));
    }
    match err.retry_after() {
        Some(hint) if hint > MAX_WAIT => Err(format!(
            "asked to wait {} s, more than the {} s this client waits",
            secs(hint),
            secs(MAX_WAIT)
        )),
        Some(hint) => Ok(hint),
        None => {
            let doublings = (try_no - 1).min(16);
            Ok(FIRST_BACKOFF
                .saturating_mul(1 << doublings)
                .min(MAX_BACKOFF))
        }
    }
}

/// The error of a failed call as loops should treat it: marked
/// [permanent](loops::Error::permanent) when no retry changes it (a refusal, a bad
/// configuration), given the server's `Retry-After` as a
/// [hint](loops::Error::retry_after) when it sent one (a call that gave up on a wait over
/// [`MAX_WAIT`] is made again by the step after that wait), and as it is otherwise.
pub fn for_loops(err: ModelError) -> anyhow::Error {
    let cause = match &err {
        ModelError::GaveUp { last, .. } => &**last,
        other => other,
    };
    if !cause.is_transient() {
        return loops::Error::permanent(err).into();
    }
    match cause.retry_after() {
        Some(after) => loops::Error::retry_after(err, after).into(),
        None => err.into(),
    }
}

/// The retry policy of a model step, per call of [`OpenAiModel`]: 3 calls, 30 s then 60 s
/// apart (at least what a `Retry-After` asks), with 10% jitter.
pub fn step_policy() -> loops::RetryPolicy {
    loops::RetryPolicy::attempts(3)
        .with_delays(Duration::from_secs(30), Duration::from_secs(60))
        .with_jitter(0.1)
}

/// The wait a response's headers ask for before the next request: `retry-after-ms` (sent by
/// OpenAI), else `Retry-After` as delay-seconds or as an HTTP date (relative to `now`; a date
/// in the past is no wait). `None` if neither is there or readable.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && let Ok(wait) = Duration::try_from_secs_f64(ms / 1000.0)
    {
        return Some(wait);
    }
    parse_retry_after(text("retry-after")?, now)
}

/// A `Retry-After` value: delay-seconds (`120`; a fraction such as `1.5` is accepted too) or
/// an HTTP date (`Wed, 21 Oct 2015 07:28:00 GMT`, and the two obsolete forms), as a wait from
/// `now`. `None` if it is neither.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The parts of a chat completion this client reads.
#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
    usage: Option<ApiUsage>,
}

#[derive(Deserialize)]
struct Choice {
    message: Message,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    content: Option<String>,
    refusal: Option<String>,
}

#[derive(Deserialize)]
struct ApiUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
}

impl OpenAiModel {
    /// A client for `config`.
    ///
    /// # Errors
    /// [`ModelError::Config`] if the base URL is not an `http` or `https` URL, the model name
    /// is empty, `tries` is 0, the time-out is zero, or the HTTP client cannot be built.
    pub fn new(config: Config) -> Result<OpenAiModel, ModelError> {
        let bad = |what: String| Err(ModelError::Config(what));
        let config_error = ModelError::Config;
        let mut base = match reqwest::Url::parse(&config.base_url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => url,
            Ok(url) => return bad(format!("--base-url {url}: not an http or https URL")),
            Err(e) => return bad(format!("--base-url {:?}: {e}", config.base_url)),
        };
        if config.model.trim().is_empty() {
            return bad("--model-name is empty".to_owned());
        }
        if config.tries == 0 {
            return bad("--model-tries must be at least 1".to_owned());
        }
        if config.request_timeout.is_zero() {
            return bad("--model-timeout must be more than 0".to_owned());
        }
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        let endpoint = base
            .join("chat/completions")
            .map_err(|e| config_error(format!("--base-url {base}: {e}")))?;
        // reqwest's `rustls-no-provider`: the process's rustls provider is ring (an error
        // only says one is installed already).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout)
            .user_agent(concat!("loops-deliver/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| config_error(format!("cannot set up the HTTP client: {}", chain(&e))))?;
        Ok(OpenAiModel {
            http,
            endpoint,
            config,
            wait: Arc::new(|d| Box::pin(tokio::time::sleep(d))),
        })
    }

    /// The same client, waiting between tries with `wait` (tests record the waits instead
    /// of sleeping).
    #[cfg(test)]
    pub fn with_wait(mut self, wait: Wait) -> OpenAiModel {
        self.wait = wait;
        self
    }

    /// The model and the URL it posts to: `NAME at {base}/chat/completions`.
    pub fn describe(&self) -> String {
        format!("{} at {}", self.config.model, self.endpoint)
    }

    /// [`ask`](Self::ask), its error as loops should treat it ([`for_loops`]): what each of
    /// the model's calls (a [`Model`] method) returns.
    ///
    /// # Errors
    /// As [`ask`](Self::ask), permanent when no retry changes it.
    async fn call<T>(
        &self,
        prompt: &Prompt,
        read: impl Fn(&Value) -> Result<T, SchemaError>,
    ) -> anyhow::Result<Answer<T>> {
        self.ask(prompt, read).await.map_err(for_loops)
    }

    /// Asks `prompt`, reads the answer with `read` (the schema check), and tries again while
    /// [`next_wait`] allows, waiting as it says. The usage is that of every try.
    ///
    /// # Errors
    /// The first try's error if it is permanent, else [`ModelError::GaveUp`] with the last.
    pub async fn ask<T>(
        &self,
        prompt: &Prompt,
        read: impl Fn(&Value) -> Result<T, SchemaError>,
    ) -> Result<Answer<T>, ModelError> {
        let mut spent = Usage::default();
        let mut try_no = 1;
        loop {
            let (usage, result) = self.try_once(prompt, &read).await;
            spent = spent.plus(usage);
            let err = match result {
                Ok(value) => {
                    return Ok(Answer {
                        value,
                        usage: spent,
                    });
                }
                Err(err) => err,
            };
            match next_wait(&err, try_no, self.config.tries) {
                Ok(wait) => {
                    tracing::warn!(
                        "model call, try {try_no} of {}: {err}; trying again in {} s",
                        self.config.tries,
                        secs(wait)
                    );
                    (self.wait)(wait).await;
                    try_no += 1;
                }
                Err(_) if try_no == 1 && !err.is_transient() => return Err(err),
                Err(why) => {
                    return Err(ModelError::GaveUp {
                        tries: try_no,
                        why,
                        usage: spent,
                        last: Box::new(err),
                    });
                }
            }
        }
    }

    /// One request: posts `prompt`, and reads the answer with `read`. Returns what the
    /// request cost (one request, and the tokens its response reported, if any) beside the
    /// result.
    async fn try_once<T>(
        &self,
        prompt: &Prompt,
        read: &impl Fn(&Value) -> Result<T, SchemaError>,
    ) -> (Usage, Result<T, ModelError>) {
        let (content, usage) = match self.complete(prompt).await {
            Ok(answered) => answered,
            Err(err) => {
                let usage = err.spent().unwrap_or(Usage {
                    requests: 1,
                    ..Usage::default()
                });
                return (usage, Err(err));
            }
        };
        let value = match schema::parse(&content) {
            Ok(value) => value,
            Err(what) => return (usage, Err(ModelError::Malformed { what, usage })),
        };
        match read(&value) {
            Ok(answer) => (usage, Ok(answer)),
            Err(problem) => (usage, Err(ModelError::OffSchema { problem, usage })),
        }
    }

    /// Posts `prompt` and returns the answer's text and what the request cost: one request,
    /// and the tokens the response reported.
    async fn complete(&self, prompt: &Prompt) -> Result<(String, Usage), ModelError> {
        let endpoint = || self.endpoint.to_string();
        let body = prompt.request_body(&self.config.model);
        let mut request = self
            .http
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        let failed = |source: reqwest::Error| {
            if source.is_timeout() {
                ModelError::TimedOut {
                    endpoint: endpoint(),
                    timeout: self.config.request_timeout,
                }
            } else {
                ModelError::Transport {
                    endpoint: endpoint(),
                    error: source,
                }
            }
        };
        let response = request.send().await.map_err(failed)?;
        let status = response.status().as_u16();
        let hint = retry_after(response.headers(), SystemTime::now());
        let bytes = response.bytes().await.map_err(failed)?;
        if status != 200 {
            let message = error_message(&bytes);
            return Err(match status {
                429 => ModelError::RateLimited {
                    endpoint: endpoint(),
                    retry_after: hint,
                    message,
                },
                408 | 409 | 500..=599 => ModelError::Unavailable {
                    endpoint: endpoint(),
                    status,
                    retry_after: hint,
                    message,
                },
                _ => ModelError::Refused {
                    endpoint: endpoint(),
                    status,
                    message,
                },
            });
        }
        let not_a_completion = |what: String| ModelError::NotACompletion {
            endpoint: endpoint(),
            what,
        };
        let completion: Completion = serde_json::from_slice(&bytes)
            .map_err(|e| not_a_completion(format!("{e} in {}", quote(&bytes))))?;
        let usage = Usage {
            requests: 1,
            prompt_tokens: completion.usage.as_ref().map_or(0, |u| u.prompt_tokens),
            completion_tokens: completion.usage.as_ref().map_or(0, |u| u.completion_tokens),
        };
        let Some(choice) = completion.choices.into_iter().next() else {
            return Err(not_a_completion("no choices".to_owned()));
        };
        match (choice.message.content, choice.message.refusal) {
            (Some(content), _) if !content.trim().is_empty() => Ok((content, usage)),
            (_, Some(refusal)) => Err(ModelError::Malformed {
                what: format!("the model refused: {}", one_line(&refusal)),
                usage,
            }),
            _ => Err(ModelError::Malformed {
                what: format!(
                    "it is empty (finish_reason {})",
                    choice.finish_reason.as_deref().unwrap_or("none")
                ),
                usage,
            }),
        }
    }
}

/// The message of an error response: `error.message` (OpenAI's shape, which vLLM, llama.cpp
/// and Ollama follow), `error` as a string, or the body itself, on one line and cut short.
fn error_message(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("error"))
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
    });
    match message {
        Some(message) => cut(&one_line(message)),
        None if body.is_empty() => "(no body)".to_owned(),
        None => quote(body),
    }
}

/// `bytes` as text on one line, cut to [`MAX_QUOTED`] characters, in quotes.
fn quote(bytes: &[u8]) -> String {
    format!("{:?}", cut(&String::from_utf8_lossy(bytes)))
}

fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTED) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_owned(),
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Model for OpenAiModel {
    async fn plan(
        &self,
        issue: &Issue,
        sources: &[SourceFile],
    ) -> anyhow::Result<Answer<Decision>> {
        let prompt = Prompt::plan(issue, sources)?;
        self.call(&prompt, |answer| schema::plan(answer, sources))
            .await
    }

    async fn fix(
        &self,
        issue: &Issue,
        sources: &[SourceFile],
        report: &TestReport,
    ) -> anyhow::Result<Answer<Option<Change>>> {
        let prompt = Prompt::fix(issue, sources, report)?;
        self.call(&prompt, |answer| schema::fix(answer, sources))
            .await
    }

    async fn review(
        &self,
        issue: &Issue,
        diff: &str,
        report: &TestReport,
    ) -> anyhow::Result<Answer<Review>> {
        let prompt = Prompt::review(issue, diff, report)?;
        self.call(&prompt, schema::review).await
    }

    /// Every try at its time-out, and the longest waits between them, plus a minute for
    /// reading the sources.
    fn call_timeout(&self) -> Duration {
        let tries = self.config.tries;
        self.config
            .request_timeout
            .saturating_mul(tries)
            .saturating_add(MAX_WAIT.saturating_mul(tries - 1))
            .saturating_add(Duration::from_secs(60))
    }

    /// [`step_policy`]: failed calls are made again in place by loops.
    fn step_retry(&self) -> Option<loops::RetryPolicy> {
        Some(step_policy())
    }
}
