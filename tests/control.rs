//! The control endpoint over TCP: a bearer token read from an owner-only file, refused
//! without it, and the version check, with raw HTTP requests as well as the client.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;

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

    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
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
