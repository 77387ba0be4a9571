//! `GET /metrics` on the control endpoint (feature `prometheus`): a running runtime's
//! endpoint renders the Prometheus recorder's series, with the exact values of a finished
//! run, under the endpoint's bearer token.
//!
//! The recorder is installed on this test's thread only (`set_default_local_recorder`) and
//! the test runs on a current-thread tokio runtime, so every task of the runtime and of the
//! endpoint records and renders on that thread; the scrapes are made from a blocking thread.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};

use loops::control::Endpoint;
use loops::metrics::{facade, prometheus::PrometheusBuilder};
use loops::{Context, RedbStore, Runtime, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "scraped")]
enum Scraped {
    #[initial]
    #[next(Done)]
    Start,
    #[terminal]
    Done { n: u32 },
}

struct Handler;

impl ScrapedHandler for Handler {
    type Error = loops::BoxError;

    async fn start(&self, ctx: &Context) -> Result<StartNext, Self::Error> {
        let n: u32 = ctx.step("call", || async { Ok(3) }).await?;
        Ok(StartNext::Done { n })
    }
}

/// `GET /metrics` with `token` (none: no `Authorization`), from a blocking thread so that the
/// runtime's thread serves it; the whole answer.
async fn scrape(addr: SocketAddr, token: Option<&str>) -> String {
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    tokio::task::spawn_blocking(move || {
        let mut conn = TcpStream::connect(addr).unwrap();
        write!(
            conn,
            "GET /metrics HTTP/1.1\r\nhost: x\r\n{auth}connection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        answer
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn the_control_endpoint_serves_prometheus_metrics() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = facade::set_default_local_recorder(&recorder);
    loops::metrics::describe();

    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "m3trics\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let runtime = Runtime::builder()
        .prometheus(handle)
        .build(RedbStore::in_memory().unwrap());
    let server = runtime
        .serve_control(Endpoint::loopback(0, &token))
        .await
        .unwrap();
    let Endpoint::Tcp { addr, .. } = server.endpoint().clone() else {
        panic!("not TCP: {}", server.endpoint());
    };

    let done = runtime.run("s-1", Scraped::Start, &Handler).await.unwrap();
    assert_eq!(done, Scraped::Done { n: 3 });
    runtime.refresh_metrics().await.unwrap();

    // Without the token: 401 and no series.
    let refused = scrape(addr, None).await;
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(!refused.contains("loops_"), "{refused}");

    let answer = scrape(addr, Some("m3trics")).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("content-type: text/plain; version=0.0.4"),
        "{answer}"
    );
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    let lines: Vec<&str> = body.lines().collect();
    for expected in [
        r#"loops_transitions_total{workflow="scraped",state="Start"} 1"#,
        r#"loops_steps_total{workflow="scraped",state="Start",step="call",status="ok"} 1"#,
        r#"loops_step_duration_seconds_count{workflow="scraped",state="Start",step="call"} 1"#,
        r#"loops_transition_duration_seconds_count{workflow="scraped",state="Start"} 1"#,
        r#"loops_runs{workflow="scraped",status="completed"} 1"#,
        r#"loops_runs{workflow="scraped",status="running"} 0"#,
        r#"loops_runs_parked{workflow="scraped"} 0"#,
        "# HELP loops_steps_total Steps executed to their end.",
        "# TYPE loops_steps_total counter",
    ] {
        assert!(lines.contains(&expected), "no `{expected}` in:\n{body}");
    }
    // No failure, retry or park happened: no such series.
    for absent in [
        "loops_failures_total",
        "loops_step_retries_total",
        "loops_parks_total",
    ] {
        assert!(
            !lines.iter().any(|l| l.starts_with(absent)),
            "{absent} in:\n{body}"
        );
    }
    server.stop().await;
    runtime.shutdown().await;
}
