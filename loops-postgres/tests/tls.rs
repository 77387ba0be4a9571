//! TLS: a store connected with `connect_tls` encrypts every connection of its pool and runs
//! workflows over it; `sslmode=require` without TLS, and a certificate the connector does not
//! trust, are refused at connect with `Error::Connect`.
//!
//! The server must have TLS on (Debian's PostgreSQL does, with its self-signed "snakeoil"
//! certificate, which the accepting connector below takes without checking).

mod common;

use std::time::Duration;

use loops::{Context, Runtime, Workflow};
use loops_postgres::{Error, PgStore};
use postgres_native_tls::MakeTlsConnector;
use serde::{Deserialize, Serialize};

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
        let effect: u32 = ctx
            .step("effect", || async { Ok::<_, anyhow::Error>(n * 2) })
            .await?;
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
    let Error::Connect { label, source } = &err else {
        panic!("expected Error::Connect, got {err:?}");
    };
    assert!(label.contains(&schema.name), "{label}");
    let chain = format!("{source:?}");
    assert!(
        chain.to_lowercase().contains("certificate"),
        "the error should say why: {chain}"
    );
}
