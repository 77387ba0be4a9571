//! The control endpoint over TCP: a bearer token read from an owner-only file, refused
//! without it, and the version check, with raw HTTP requests as well as the client.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use loops::Runtime;
use loops::control::{Client, ControlError, Endpoint, ErrorKind};

fn token_file(dir: &Path, mode: u32, text: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(format!("token-{mode:o}"));
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// One raw HTTP/1.1 request; returns the whole answer.
fn raw(addr: std::net::SocketAddr, head: &str) -> String {
    let mut conn = TcpStream::connect(addr).unwrap();
    write!(conn, "{head}\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_endpoint_needs_its_token_and_the_same_version() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path().join("s.redb")).unwrap();

    // No token file, or one others may read: refused, in one line, before listening.
    let missing = rt
        .serve_control(Endpoint::loopback(0, dir.path().join("none")))
        .await
        .unwrap_err();
    assert!(matches!(missing, ControlError::Token { .. }), "{missing}");
    assert!(
        missing.to_string().contains("needs a bearer token"),
        "{missing}"
    );
    let open = token_file(dir.path(), 0o644, "secret\n");
    let wide = rt
        .serve_control(Endpoint::loopback(0, &open))
        .await
        .unwrap_err();
    assert!(wide.to_string().contains("mode is 644"), "{wide}");
    let empty = token_file(dir.path(), 0o600, " \n");
    let none = rt
        .serve_control(Endpoint::loopback(0, &empty))
        .await
        .unwrap_err();
    assert!(none.to_string().contains("is empty"), "{none}");

    let token = token_file(dir.path(), 0o600, "s3cret\n");
    let server = rt
        .serve_control(Endpoint::loopback(0, &token))
        .await
        .unwrap();
    let Endpoint::Tcp { addr, .. } = server.endpoint().clone() else {
        panic!("a TCP endpoint");
    };
    assert!(addr.ip().is_loopback());
    assert_ne!(addr.port(), 0);

    // Without the token, or with another: 401, and no payload.
    let answers = tokio::task::spawn_blocking(move || {
        [
            raw(addr, "GET /v1/runs HTTP/1.1"),
            raw(
                addr,
                "GET /v1/version HTTP/1.1\r\nauthorization: Bearer nope",
            ),
            raw(
                addr,
                "GET /v1/runs HTTP/1.1\r\nauthorization: Bearer s3cret\r\nloops-version: 0.0.1",
            ),
            raw(
                addr,
                "GET /v1/runs HTTP/1.1\r\nauthorization: Bearer s3cret",
            ),
        ]
    })
    .await
    .unwrap();
    for refused in &answers[..2] {
        assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
        assert!(refused.contains(r#""kind":"unauthorized""#), "{refused}");
        assert!(!refused.contains("store"), "{refused}");
    }
    assert!(answers[2].starts_with("HTTP/1.1 409"), "{}", answers[2]);
    assert!(
        answers[2].contains(&format!(
            "the process runs loops {}, and the client is loops 0.0.1",
            env!("CARGO_PKG_VERSION")
        )),
        "{}",
        answers[2]
    );
    assert!(answers[3].starts_with("HTTP/1.1 200"), "{}", answers[3]);
    assert!(answers[3].ends_with("[]"), "{}", answers[3]);

    // The client reads the token from the file.
    let client = Client::connect(Endpoint::Tcp {
        addr,
        token_file: token.clone(),
    })
    .await
    .unwrap();
    assert_eq!(client.server().loops_version, env!("CARGO_PKG_VERSION"));
    assert!(client.list(None, None).await.unwrap().is_empty());
    let missing = client.run_info("nope").await.unwrap();
    assert_eq!(missing, None);
    let refused = client.cancel("nope", "why").await.unwrap_err();
    assert!(
        matches!(refused, ControlError::Remote { kind: ErrorKind::RunNotFound, ref run_id, .. } if run_id.as_deref() == Some("nope")),
        "{refused:?}"
    );
    // A run's lists answer 404 for a run that does not exist, not an empty list.
    let not_found = |e: ControlError| matches!(e, ControlError::Remote { kind: ErrorKind::RunNotFound, ref run_id, .. } if run_id.as_deref() == Some("nope"));
    assert!(not_found(client.history("nope").await.unwrap_err()));
    assert!(not_found(client.steps("nope", 0).await.unwrap_err()));
    assert!(not_found(client.all_steps("nope").await.unwrap_err()));
    assert!(not_found(client.failures("nope").await.unwrap_err()));
    assert!(not_found(client.events("nope").await.unwrap_err()));
    assert!(not_found(client.attributes("nope").await.unwrap_err()));
    assert!(not_found(client.children("nope").await.unwrap_err()));
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "other").unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let unauthorized = Client::connect(Endpoint::Tcp {
        addr,
        token_file: wrong,
    })
    .await
    .unwrap_err();
    assert!(
        matches!(
            unauthorized,
            ControlError::Remote {
                kind: ErrorKind::Unauthorized,
                ..
            }
        ),
        "{unauthorized:?}"
    );
    server.stop().await;
    let gone = Client::connect(Endpoint::Tcp {
        addr,
        token_file: token,
    })
    .await
    .unwrap_err();
    assert!(matches!(gone, ControlError::Unreachable { .. }), "{gone:?}");
}

/// A runtime on a store in `dir`, serving its control endpoint on the loopback with the
/// token `t0ken` (what [`raw_body`] sends); and the endpoint's address.
async fn on_loopback(dir: &Path) -> (Runtime, loops::control::ControlServer, std::net::SocketAddr) {
    let rt = Runtime::open(dir.join("s.redb")).unwrap();
    let token = token_file(dir, 0o600, "t0ken\n");
    let server = rt
        .serve_control(Endpoint::loopback(0, &token))
        .await
        .unwrap();
    let Endpoint::Tcp { addr, .. } = server.endpoint().clone() else {
        panic!("a TCP endpoint");
    };
    (rt, server, addr)
}

/// One raw HTTP/1.1 request with `body` (and the headers in `head`); returns the status line
/// and the body of the answer.
fn raw_body(addr: std::net::SocketAddr, head: &str, body: &str) -> (String, String) {
    let mut conn = TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "{head}\r\nhost: x\r\nconnection: close\r\nauthorization: Bearer t0ken\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    status_and_body(&answer)
}

/// The status line and the body of a raw HTTP/1.1 answer.
fn status_and_body(answer: &str) -> (String, String) {
    let status = answer.lines().next().unwrap_or_default().to_owned();
    let body = answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    (status, body)
}

/// A request axum cannot read (no JSON content type, bad JSON, a missing field, a seq that is
/// not a number, an unknown status) answers as every error does: a JSON `ErrorBody` of kind
/// `invalid_argument`, naming the run of the path; before, axum's plain-text rejections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_request_answers_with_the_error_body() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, server, addr) = on_loopback(dir.path()).await;
    let json = "\r\ncontent-type: application/json";
    let answers = tokio::task::spawn_blocking(move || {
        [
            raw_body(
                addr,
                "POST /v1/runs/r1/cancel HTTP/1.1",
                r#"{"reason":"x"}"#,
            ),
            raw_body(
                addr,
                &format!("POST /v1/runs/r1/cancel HTTP/1.1{json}"),
                "{",
            ),
            raw_body(
                addr,
                &format!("POST /v1/runs/r1/cancel HTTP/1.1{json}"),
                "{}",
            ),
            raw_body(addr, "GET /v1/runs/r1/steps/first HTTP/1.1", ""),
            raw_body(addr, "GET /v1/runs?status=bogus HTTP/1.1", ""),
            raw_body(addr, &format!("POST /v1/search HTTP/1.1{json}"), "[1]"),
        ]
    })
    .await
    .unwrap();
    let got: Vec<(String, serde_json::Value)> = answers
        .iter()
        .map(|(status, body)| {
            let body: serde_json::Value = serde_json::from_str(body)
                .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {body}"));
            (status.clone(), body)
        })
        .collect();
    let statuses: Vec<&str> = got
        .iter()
        .map(|(s, _)| s.split(' ').nth(1).unwrap_or_default())
        .collect();
    assert_eq!(statuses, ["415", "400", "422", "400", "400", "422"]);
    for (status, body) in &got {
        assert_eq!(body["kind"], "invalid_argument", "{status}: {body}");
        assert!(
            !body["message"].as_str().unwrap_or_default().is_empty(),
            "{status}: {body}"
        );
    }
    let runs: Vec<&serde_json::Value> = got.iter().map(|(_, b)| &b["run_id"]).collect();
    assert_eq!(
        runs,
        [
            &serde_json::json!("r1"),
            &serde_json::json!("r1"),
            &serde_json::json!("r1"),
            &serde_json::json!("r1"),
            &serde_json::Value::Null,
            &serde_json::Value::Null
        ]
    );
    assert!(
        got[2].1["message"].as_str().unwrap().contains("reason"),
        "{:?}",
        got[2]
    );
    server.stop().await;
}

/// A run id that breaks loops' rules (a control character) is refused as `invalid_argument`
/// on every route that names a run, reads as writes, as the CLI and the UI refuse it; before,
/// the read routes looked it up and answered 200 with nothing (`null`, `[]`). A valid id of
/// no run still reads as nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_id_that_breaks_the_rules_is_refused_on_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, server, addr) = on_loopback(dir.path()).await;
    let json = "\r\ncontent-type: application/json";
    let answers = tokio::task::spawn_blocking(move || {
        let mut answers = Vec::new();
        for id in ["%00", "a%1b%5b31mb"] {
            for tail in [
                "",
                "/latest",
                "/history",
                "/steps/0",
                "/steps",
                "/failures",
                "/events",
                "/attributes",
                "/children",
            ] {
                answers.push(raw_body(
                    addr,
                    &format!("GET /v1/runs/{id}{tail} HTTP/1.1"),
                    "",
                ));
            }
            for (tail, body) in [
                ("/cancel", r#"{"reason":"x"}"#),
                ("/retry", "{}"),
                ("/events", r#"{"name":"e","payload":null}"#),
            ] {
                let head = format!("POST /v1/runs/{id}{tail} HTTP/1.1{json}");
                answers.push(raw_body(addr, &head, body));
            }
        }
        let unknown = raw_body(addr, "GET /v1/runs/no-such-run HTTP/1.1", "");
        let not_utf8 = raw_body(addr, "GET /v1/runs/%FF%FE/history HTTP/1.1", "");
        (answers, (unknown, not_utf8))
    })
    .await
    .unwrap();
    let (answers, (unknown, not_utf8)) = answers;
    // Bytes that are not UTF-8: refused the same way, in JSON (not axum's plain text).
    let body: serde_json::Value = serde_json::from_str(&not_utf8.1)
        .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {}", not_utf8.0, not_utf8.1));
    assert!(not_utf8.0.contains(" 400 "), "{not_utf8:?}");
    assert_eq!(body["kind"], "invalid_argument", "{body}");
    assert_eq!(answers.len(), 24);
    for (status, body) in &answers {
        let body: serde_json::Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {body}"));
        assert!(status.contains(" 400 "), "{status}: {body}");
        assert_eq!(body["kind"], "invalid_argument", "{status}: {body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap_or_default()
                .contains("control characters"),
            "{status}: {body}"
        );
    }
    assert!(unknown.0.contains(" 200 "), "{unknown:?}");
    assert_eq!(unknown.1, "null");
    server.stop().await;
}

/// A process that closes the connection before it answers (it stopped while it took the
/// request) is said to have dropped it, not to speak something other than HTTP: a read may be
/// made again; whether a write was carried out is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_before_the_answer_is_a_dropped_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let rt = Runtime::open(&path).unwrap();
    let server = rt.serve_control_next_to_store().await.unwrap();
    let socket = loops::control::socket_path(&path);
    let client = Client::connect(Endpoint::Unix(socket.clone()))
        .await
        .unwrap();
    server.stop().await;
    // In the socket's place, a process that takes each request and closes the connection,
    // having read the request or not.
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let closer = tokio::spawn(async move {
        for read_first in [true, false] {
            let (stream, _) = listener.accept().await.unwrap();
            if read_first {
                let mut head = [0; 64];
                stream.readable().await.unwrap();
                let _ = stream.try_read(&mut head);
            }
            drop(stream);
        }
    });
    for _ in 0..2 {
        match client.run_info("r1").await {
            Err(e @ ControlError::Dropped { write: false, .. }) => {
                // A read: made again, it changes nothing (helper-127 LOW 3: it said, as for
                // a write, that whether it was carried out was unknown).
                let text = e.to_string();
                let ControlError::Dropped { endpoint, what, .. } = e else {
                    unreachable!()
                };
                assert_eq!(endpoint, format!("unix:{}", socket.display()));
                assert!(!what.is_empty());
                assert!(
                    text.ends_with(
                        "the process may have stopped; the request only read, and can be made again"
                    ),
                    "{text}"
                );
            }
            other => panic!("expected Dropped, got {other:?}"),
        }
    }
    closer.await.unwrap();
    let e = client.run_info("r1").await.unwrap_err();
    assert!(matches!(e, ControlError::Unreachable { .. }), "{e:?}");
    rt.shutdown().await;
}

/// `Client::next_to_store` finds the process serving next to a store file, and nobody where
/// there is no socket, a socket its process left, or one whose process closes connections
/// unanswered (it is stopping).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_to_store_finds_the_serving_process_or_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    assert!(Client::next_to_store(&path).await.unwrap().is_none());
    let rt = Runtime::open(&path).unwrap();
    let server = rt.serve_control_next_to_store().await.unwrap();
    let client = Client::next_to_store(&path).await.unwrap().unwrap();
    let socket = loops::control::socket_path(&path);
    assert_eq!(client.endpoint(), &Endpoint::Unix(socket.clone()));
    assert_eq!(client.run_info("r1").await.unwrap(), None);
    server.stop().await;
    rt.shutdown().await;
    // A socket file with no process behind it.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    assert!(Client::next_to_store(&path).await.unwrap().is_none());
    std::fs::remove_file(&socket).unwrap();
    // A process that closes each connection unanswered.
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let closer = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        drop(stream);
    });
    assert!(Client::next_to_store(&path).await.unwrap().is_none());
    closer.await.unwrap();
}

/// Serving next to a store replaces a socket its process left, and nothing else: a regular
/// file, a directory or a symbolic link at the socket's path is refused (`Bind`, naming it
/// once) and left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_stale_socket_is_replaced_by_a_new_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let socket = loops::control::socket_path(&path);
    let rt = Runtime::open(&path).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let server = rt.serve_control_next_to_store().await.unwrap();
    let client = Client::next_to_store(&path).await.unwrap().unwrap();
    assert_eq!(client.run_info("r1").await.unwrap(), None);
    server.stop().await;
    assert!(!socket.exists());

    let target = dir.path().join("elsewhere");
    std::fs::write(&target, "kept").unwrap();
    let make: [(&str, &dyn Fn()); 3] = [
        ("a regular file", &|| {
            std::fs::write(&socket, "notes").unwrap()
        }),
        ("a directory", &|| std::fs::create_dir(&socket).unwrap()),
        ("a symbolic link", &|| {
            std::os::unix::fs::symlink(&target, &socket).unwrap();
        }),
    ];
    for (kind, make) in make {
        make();
        let e = rt.serve_control_next_to_store().await.unwrap_err();
        assert!(matches!(e, ControlError::Bind { .. }), "{kind}: {e:?}");
        assert!(std::error::Error::source(&e).is_none(), "{kind}");
        assert_eq!(
            e.to_string(),
            format!(
                "cannot listen on control endpoint unix:{}: {kind} is at the socket's path, not \
                 a socket: it is left as it is (move it away, or name another endpoint)",
                socket.display()
            )
        );
        let meta = std::fs::symlink_metadata(&socket).unwrap();
        match kind {
            "a regular file" => assert_eq!(std::fs::read_to_string(&socket).unwrap(), "notes"),
            "a directory" => assert!(meta.is_dir()),
            _ => assert_eq!(std::fs::read_link(&socket).unwrap(), target),
        }
        if meta.is_dir() {
            std::fs::remove_dir(&socket).unwrap();
        } else {
            std::fs::remove_file(&socket).unwrap();
        }
    }
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "kept");

    // A store reached through a link to its file: served and found next to the file.
    let link = dir.path().join("link.redb");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert_eq!(
        loops::control::socket_path(&link),
        loops::control::socket_path(&path.canonicalize().unwrap())
    );
    let server = rt.serve_control_next_to_store().await.unwrap();
    let client = Client::next_to_store(&link).await.unwrap().unwrap();
    assert_eq!(client.run_info("r1").await.unwrap(), None);
    // Another store whose socket path is a link to this process's socket: not its process.
    let other = dir.path().join("other.redb");
    std::os::unix::fs::symlink(&socket, loops::control::socket_path(&other)).unwrap();
    assert!(Client::next_to_store(&other).await.unwrap().is_none());
    server.stop().await;
    rt.shutdown().await;
}

/// A socket path longer than a Unix socket's may be is refused before anything is bound,
/// saying how long it is and how long it may be (the system says only "shorter than SUN_LEN").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_path_too_long_is_refused_naming_both_lengths() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path().join("store.redb")).unwrap();
    let base = dir.path().as_os_str().len() + 1;
    let pid = std::process::id().to_string().len();
    let fits = 107 - pid - 5; // `.{pid}.tmp` is appended while it is bound
    for (len, ok) in [(fits, true), (fits + 1, false), (200, false)] {
        let socket = dir.path().join("s".repeat(len - base));
        assert_eq!(socket.as_os_str().len(), len);
        // The same rule, checked before anything is made for the endpoint.
        let checked = Endpoint::Unix(socket.clone())
            .check_name()
            .map_err(|e| e.to_string());
        let served = rt.serve_control(Endpoint::Unix(socket.clone())).await;
        match served {
            Ok(server) if ok => {
                assert_eq!(checked, Ok(()));
                server.stop().await;
            }
            Err(e) if !ok => {
                assert!(matches!(e, ControlError::Bind { .. }), "{e:?}");
                assert_eq!(checked, Err(e.to_string()));
                assert_eq!(
                    e.to_string(),
                    format!(
                        "cannot listen on control endpoint unix:{}: the socket's path is {len} \
                         bytes, and a Unix socket's path may have at most {fits} here (107 \
                         bytes, less the {} of the name it is bound under first): name a store \
                         at a shorter path, or give `Endpoint::Unix` a shorter one",
                        socket.display(),
                        pid + 5
                    )
                );
                assert_eq!(
                    std::fs::read_dir(dir.path()).unwrap().count(),
                    1,
                    "only the store"
                );
            }
            other => panic!("{len} bytes: {:?}", other.map(|_| ())),
        }
    }
    rt.shutdown().await;
}

/// A process that takes the connection and never answers (stopped with SIGSTOP, say): the
/// version check of `connect` gives up with `NoAnswer` (after `CONNECT_TIMEOUT`, 10 s, for
/// `connect` and `next_to_store`: a command must not hang, nor take the file for free).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_never_answers_is_no_answer_after_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let socket = loops::control::socket_path(&path);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            held.push(stream);
        }
    });
    let limit = Duration::from_millis(300);
    let started = std::time::Instant::now();
    match Client::connect_within(Endpoint::Unix(socket.clone()), limit).await {
        Err(e @ ControlError::NoAnswer { .. }) => assert_eq!(
            e.to_string(),
            format!(
                "control endpoint unix:{}: the process took the connection but did not answer within 300ms: it may be stopped (SIGSTOP, a debugger) or overloaded; the request only read, and can be made again",
                socket.display()
            )
        ),
        other => panic!("expected NoAnswer, got {other:?}"),
    }
    assert!(started.elapsed() >= limit);
    assert_eq!(loops::control::CONNECT_TIMEOUT, Duration::from_secs(10));
    silent.abort();
}

/// How the client and the process refuse a request body over the endpoint's limit.
const OVER_THE_LIMIT: &str = "the request is over the control endpoint's limit of 64 MiB; an event's payload is at most the runtime's max_payload_bytes (2 MiB by default): keep large data outside the store and send a reference to it";

/// A request over the endpoint's body limit (64 MiB) is refused as an invalid argument that
/// names the limit and what to do, not in axum's words, by the client before it sends the
/// body (sent, the process answered before reading all of it, and the connection could close
/// under the rest: a dropped request, now and then, under load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_body_limit_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let rt = Runtime::open(&path).unwrap();
    let server = rt.serve_control_next_to_store().await.unwrap();
    let client = Client::next_to_store(&path).await.unwrap().unwrap();
    let huge = serde_json::value::to_raw_value(&"x".repeat(65 * 1024 * 1024)).unwrap();
    match client.send("r1", "go", None, &huge).await {
        Err(ControlError::Remote { kind, message, .. }) => {
            assert_eq!(kind, ErrorKind::InvalidArgument);
            assert_eq!(message, OVER_THE_LIMIT);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    server.stop().await;
    rt.shutdown().await;
}

/// The process's own refusal of a body over its limit, for a client other than loops' (curl,
/// a script): 413, with the same words as the client's. The body is one byte over the limit
/// and sent whole, so that the process has read all of it when it answers (bytes left unread
/// would make the kernel reset the connection under the answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_refuses_a_body_over_its_limit_in_its_own_words() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, server, addr) = on_loopback(dir.path()).await;
    let (status, body) = tokio::task::spawn_blocking(move || {
        let len = 64 * 1024 * 1024 + 1;
        let mut conn = TcpStream::connect(addr).unwrap();
        write!(
            conn,
            "POST /v1/runs/r1/events HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             authorization: Bearer t0ken\r\ncontent-type: application/json\r\n\
             content-length: {len}\r\n\r\n"
        )
        .unwrap();
        let mut writer = conn.try_clone().unwrap();
        // Written beside the read: the process may answer before the last byte is written.
        let sent = std::thread::spawn(move || writer.write_all(&vec![b' '; len]).is_ok());
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        let _ = sent.join();
        status_and_body(&answer)
    })
    .await
    .unwrap();
    assert_eq!(status, "HTTP/1.1 413 Payload Too Large");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["kind"], "invalid_argument", "{body}");
    assert_eq!(body["message"], OVER_THE_LIMIT, "{body}");
    server.stop().await;
    rt.shutdown().await;
}
