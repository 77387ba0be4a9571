//! TLS: a store connected with `connect_tls` encrypts every connection of its pool and runs
//! workflows over it; `sslmode=require` without TLS, and a certificate the connector does not
//! trust, are refused at connect with `Error::Connect`. Plaintext is for the loopback: to
//! another host, `connect` is refused before connecting and `sslmode=prefer` does not fall
//! back to plaintext, unless `allow_plaintext` was called (then a WARN line says so).
//!
//! The server must have TLS on (Debian's PostgreSQL does, with its self-signed "snakeoil"
//! certificate, which the accepting connector below takes without checking).

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops::{Context, Runtime, Workflow};
use loops_postgres::{Error, PgStore};
use postgres_native_tls::MakeTlsConnector;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "tls_job")]
enum Job {
    #[initial]
    #[next(Done)]
    Start { n: u32 },
    #[terminal]
    Done { n: u32, effect: u32 },
}

struct Agent;

impl JobHandler for Agent {
    type Error = anyhow::Error;

    async fn start(&self, ctx: &Context, n: u32) -> Result<StartNext, Self::Error> {
        let effect: u32 = ctx.step("effect", || async { Ok(n * 2) }).await?;
        Ok(StartNext::Done { n, effect })
    }
}

/// A connector that accepts the server's self-signed test certificate.
fn accepting() -> MakeTlsConnector {
    MakeTlsConnector::new(
        native_tls::TlsConnector::builder()
            .danger_accept_invalid_certs(true)
            .danger_accept_invalid_hostnames(true)
            .build()
            .expect("a TLS connector"),
    )
}

/// Fails with a clear message if the test server has TLS off.
async fn require_server_tls() {
    let ssl: String = common::admin()
        .await
        .query_one("SHOW ssl", &[])
        .await
        .expect("SHOW ssl")
        .get(0);
    assert_eq!(
        ssl,
        "on",
        "the TLS tests need a server with `ssl = on` (Debian's default) at `{}`",
        common::pg_config()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_over_tls_encrypts_its_connections_and_runs_workflows() {
    require_server_tls().await;
    let schema = common::TestSchema::new("tls_run").await;
    let store = PgStore::builder(format!("{} sslmode=require", common::pg_config()))
        .schema(&schema.name)
        .pool_size(2)
        .application_name("loops-test-tls")
        .connect_tls(accepting())
        .await
        .expect("connect over TLS");

    let client = store.pool().get().await.unwrap();
    let row = client
        .query_one(
            "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    let (ssl, version): (bool, Option<String>) = (row.get(0), row.get(1));
    assert!(ssl, "the pool's connection is not encrypted");
    assert!(
        version.as_deref().is_some_and(|v| v.starts_with("TLS")),
        "protocol {version:?}"
    );
    drop(client);

    let runtime = Runtime::builder().build(store.clone());
    let end = runtime
        .run("tls-1", Job::Start { n: 21 }, &Agent)
        .await
        .expect("the run ends");
    assert_eq!(end, Job::Done { n: 21, effect: 42 });
    let history: Vec<(u64, Job)> = runtime
        .history::<Job>("tls-1")
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.seq, t.value))
        .collect();
    assert_eq!(
        history,
        vec![
            (0, Job::Start { n: 21 }),
            (1, Job::Done { n: 21, effect: 42 })
        ]
    );

    // Every connection the store opened is encrypted: none of its application_name is not.
    let plain: i64 = common::admin()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s ON s.pid = a.pid \
             WHERE a.application_name = $1 AND NOT s.ssl",
            &[&"loops-test-tls"],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plain, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_without_tls_is_refused_at_connect() {
    let schema = common::TestSchema::new("tls_notls").await;
    let err = PgStore::builder(format!("{} sslmode=require", common::pg_config()))
        .schema(&schema.name)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect_err("sslmode=require with NoTls");
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_the_connector_does_not_trust_is_refused_at_connect() {
    require_server_tls().await;
    let schema = common::TestSchema::new("tls_untrusted").await;
    // The default connector checks the chain against the system's roots: a self-signed
    // certificate fails the handshake.
    let verifying = MakeTlsConnector::new(native_tls::TlsConnector::new().unwrap());
    let err = PgStore::builder(format!("{} sslmode=require", common::pg_config()))
        .schema(&schema.name)
        .connect_tls(verifying)
        .await
        .expect_err("an untrusted certificate");
    let Error::Connect { label, cause } = &err else {
        panic!("expected Error::Connect, got {err:?}");
    };
    assert!(label.contains(&schema.name), "{label}");
    let chain = format!("{cause:?}");
    assert!(
        chain.to_lowercase().contains("certificate"),
        "the error should say why: {chain}"
    );
}

#[tokio::test]
async fn plaintext_to_another_host_is_refused_before_connecting() {
    // TEST-NET-3: nothing answers there; a connection attempt would end in `Error::Connect`
    // after the connect time-out, not at once.
    let err = PgStore::builder("host=203.0.113.7 user=loops dbname=loops")
        .connect_timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect_err("plaintext to another host");
    let Error::Plaintext { label, host } = &err else {
        panic!("expected Error::Plaintext, got {err:?}");
    };
    assert_eq!(host, "203.0.113.7");
    assert_eq!(
        label,
        "postgres://loops@203.0.113.7:5432/loops schema loops"
    );
    assert_eq!(
        err.to_string(),
        "refusing to connect to postgres://loops@203.0.113.7:5432/loops schema loops without \
         TLS: 203.0.113.7 is not a loopback address; use connect_tls with sslmode=require, or \
         call allow_plaintext() to send everything in the clear"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_to_the_loopback_needs_no_permission() {
    let schema = common::TestSchema::new("tls_loopback").await;
    let store = PgStore::builder(common::pg_config())
        .schema(&schema.name)
        .pool_size(1)
        .connect()
        .await
        .expect("plaintext to 127.0.0.1");
    let client = store.pool().get().await.unwrap();
    let ssl: bool = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!ssl);
}

/// This machine's address on its network (not a loopback one): the source address of a
/// route to a TEST-NET address (a UDP "connection" sends nothing).
fn network_address() -> IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket
        .connect("198.51.100.1:9")
        .expect("the TLS fall-back test needs a network interface with a route");
    let ip = socket.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "no address off the loopback: {ip}");
    ip
}

/// A proxy on this machine's network address in front of the test server that offers no TLS:
/// it answers a client's `SSLRequest` with `N` (as a server without TLS does) and forwards
/// everything else. Returns its address.
async fn proxy_without_tls() -> SocketAddr {
    let listener = TcpListener::bind((network_address(), 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server: tokio_postgres::Config = common::pg_config().parse().unwrap();
    let host = match &server.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        other => panic!("the test server is not on TCP: {other:?}"),
    };
    let port = server.get_ports().first().copied().unwrap_or(5432);
    tokio::spawn(async move {
        loop {
            let (mut client, _) = listener.accept().await.unwrap();
            let host = host.clone();
            tokio::spawn(async move {
                // SSLRequest: length 8, code 80877103.
                let mut first = [0u8; 8];
                if client.read_exact(&mut first).await.is_err() {
                    return;
                }
                let mut upstream = TcpStream::connect((host.as_str(), port)).await.unwrap();
                if first == [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f] {
                    client.write_all(b"N").await.unwrap();
                } else {
                    upstream.write_all(&first).await.unwrap();
                }
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    addr
}

/// Collects what a `tracing` subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The log lines of this test process at INFO and above, from every thread: one global
/// subscriber, installed once. (A subscriber set per test with `set_default` can miss lines
/// while other tests run: the callsites' interest is cached process-wide.) A test picks its
/// lines by its store's label.
fn captured() -> &'static Captured {
    static LOGS: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        logs
    })
}

#[tokio::test(flavor = "current_thread")]
async fn sslmode_prefer_does_not_fall_back_to_plaintext_unless_allowed() {
    let logs = captured();
    let schema = common::TestSchema::new("tls_prefer").await;
    let proxy = proxy_without_tls().await;
    let server: tokio_postgres::Config = common::pg_config().parse().unwrap();
    let config = format!(
        "host={} port={} user={} dbname={}",
        proxy.ip(),
        proxy.port(),
        server.get_user().unwrap_or("postgres"),
        server.get_dbname().unwrap_or("postgres"),
    );

    // `sslmode=prefer` (the default) to a server off the loopback that offers no TLS: refused.
    let err = PgStore::builder(&config)
        .schema(&schema.name)
        .connect_tls(accepting())
        .await
        .expect_err("a server without TLS under sslmode=prefer");
    let Error::Connect { cause: source, .. } = &err else {
        panic!("expected Error::Connect, got {err:?}");
    };
    let mut chain = vec![source.to_string()];
    let mut cause = source.source();
    while let Some(c) = cause {
        chain.push(c.to_string());
        cause = c.source();
    }
    assert_eq!(
        chain,
        [
            "error performing TLS handshake",
            "server does not support TLS"
        ]
    );

    // Allowed: connects in the clear, and says so in one WARN line.
    let store = PgStore::builder(&config)
        .schema(&schema.name)
        .pool_size(1)
        .allow_plaintext()
        .connect_tls(accepting())
        .await
        .expect("plaintext allowed");
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let ours = format!("store=\"{}\"", store.label());
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(&ours))
        .collect();
    assert_eq!(
        warnings,
        vec![format!(
            " WARN loops_postgres::connect: the connections of this store are unencrypted (no \
             TLS) store=\"{}\"",
            store.label()
        )],
        "{logs}"
    );
    let ssl: bool = store
        .pool()
        .get()
        .await
        .unwrap()
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!ssl);
}
