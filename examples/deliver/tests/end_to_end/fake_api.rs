//! A fake of the OpenAI-compatible chat-completions API, for tests: an HTTP/1.1 server (hyper)
//! on 127.0.0.1, on a thread of its own, that records every request and answers each as the
//! test's responder says, in the API's documented shapes: a chat completion with `choices`
//! and `usage`, or an error object `{"error": {"message", "type", "code"}}` with any status
//! and headers (`Retry-After`), or no answer at all (a hang).
//!
//! It serves the unit tests of the client (`openai/tests.rs`) and the end-to-end tests of the
//! example (`tests/end_to_end/openai.rs`), which include this file. It stops when dropped.

#![allow(dead_code)] // each includer uses its part

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Request {
    /// `POST`, ...
    pub method: String,
    /// The path, `/v1/chat/completions`.
    pub path: String,
    /// The `Authorization` header.
    pub authorization: Option<String>,
    /// The `Content-Type` header.
    pub content_type: Option<String>,
    /// The body, as JSON (`Value::Null` if it is not JSON).
    pub body: Value,
}

impl Request {
    /// The content of the message with `role` (`system`, `user`), if any.
    pub fn message(&self, role: &str) -> Option<&str> {
        self.body["messages"]
            .as_array()?
            .iter()
            .find(|m| m["role"] == role)?["content"]
            .as_str()
    }
}

/// How the server answers one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A response: status, headers, body.
    Respond {
        /// The status code.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// The body.
        body: String,
    },
    /// No answer, ever (until the server stops): for time-outs and kills mid-call.
    Hang,
}

impl Reply {
    /// HTTP 200 with a chat completion whose message says `content`, reporting the tokens.
    pub fn completion(content: &str, prompt_tokens: u64, completion_tokens: u64) -> Reply {
        let body = json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1_735_689_600,
            "model": "fake-model",
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": content },
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        });
        Reply::raw(200, &body.to_string())
    }

    /// A completion whose content is `answer` as JSON text.
    pub fn answer(answer: &Value, prompt_tokens: u64, completion_tokens: u64) -> Reply {
        Reply::completion(&answer.to_string(), prompt_tokens, completion_tokens)
    }

    /// An error response in the API's shape.
    pub fn error(status: u16, message: &str) -> Reply {
        let body = json!({
            "error": { "message": message, "type": "fake_error", "param": null, "code": null },
        });
        Reply::raw(status, &body.to_string())
    }

    /// `status` with `body` as it is.
    pub fn raw(status: u16, body: &str) -> Reply {
        Reply::Respond {
            status,
            headers: vec![("content-type".to_owned(), "application/json".to_owned())],
            body: body.to_owned(),
        }
    }

    /// The same reply with the header `name: value` too.
    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        if let Reply::Respond { headers, .. } = &mut self {
            headers.push((name.to_owned(), value.to_owned()));
        }
        self
    }
}

/// What answers: given the number of requests received before this one and the request.
type Responder = dyn Fn(usize, &Request) -> Reply + Send + Sync;

struct Shared {
    requests: Mutex<Vec<Request>>,
    respond: Box<Responder>,
}

/// The running server. Dropping it stops it (and every request it holds unanswered).
pub struct FakeApi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl FakeApi {
    /// Starts a server on a free port of 127.0.0.1 that answers with `respond`.
    pub fn start(respond: impl Fn(usize, &Request) -> Reply + Send + Sync + 'static) -> FakeApi {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking socket");
        let addr = listener.local_addr().expect("the server's address");
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            respond: Box::new(respond),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = Arc::clone(&shared);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the server's runtime");
            runtime.block_on(serve(listener, serving, stopped));
        });
        FakeApi {
            addr,
            shared,
            _stop: stop,
        }
    }

    /// Starts a server that answers the `i`-th request with `replies[i]`, and any request
    /// beyond them with HTTP 500.
    pub fn scripted(replies: Vec<Reply>) -> FakeApi {
        FakeApi::start(move |i, _| {
            replies
                .get(i)
                .cloned()
                .unwrap_or_else(|| Reply::error(500, "the test's script has no more replies"))
        })
    }

    /// The base URL to give the client: `http://127.0.0.1:<port>/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(_) => continue,
            },
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(Arc::clone(&shared), request));
            // A client that goes away mid-request ends its connection: nothing to report.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    shared: Arc<Shared>,
    request: hyper::Request<Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let header = |name: hyper::header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let received = Request {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        authorization: header(hyper::header::AUTHORIZATION),
        content_type: header(hyper::header::CONTENT_TYPE),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    };
    let reply = {
        // Numbered and answered under one lock: concurrent requests get distinct numbers.
        let mut requests = shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let reply = (shared.respond)(requests.len(), &received);
        requests.push(received);
        reply
    };
    match reply {
        Reply::Hang => std::future::pending().await,
        Reply::Respond {
            status,
            headers,
            body,
        } => {
            let mut response = hyper::Response::builder().status(status);
            for (name, value) in headers {
                response = response.header(name, value);
            }
            Ok(response
                .body(Full::new(Bytes::from(body)))
                .expect("a valid response"))
        }
    }
}
