//! Helpers of the PostgreSQL tests: the server, a schema of its own per test, dropped when
//! the test ends (even by a panic).
#![allow(dead_code)]

use std::time::Duration;

use loops_postgres::PgStore;

/// The server the tests use: `LOOPS_PG` if set, else the CI machine's local server.
pub fn pg_config() -> String {
    std::env::var("LOOPS_PG")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".to_owned())
}

/// A connection of the test itself (not through a store), to look and to act behind the
/// store's back. Fails the test with a clear message if the server cannot be reached.
pub async fn admin() -> tokio_postgres::Client {
    let mut config: tokio_postgres::Config = pg_config().parse().expect("LOOPS_PG parses");
    config.application_name("loops-test-admin");
    let (client, connection) = match config.connect(tokio_postgres::NoTls).await {
        Ok(pair) => pair,
        Err(e) => panic!(
            "PostgreSQL is not reachable at `{}` ({e}). The PostgreSQL tests need a server: \
             start it (`.ci/run` does: pg_ctlcluster <version> main start) or point LOOPS_PG \
             at one.",
            pg_config()
        ),
    };
    tokio::spawn(connection);
    client
}

/// A PostgreSQL schema for one test: `lt_<name>_<pid>`, dropped (with everything in it)
/// when this value is dropped.
pub struct TestSchema {
    pub name: String,
}

impl TestSchema {
    /// Drops any schema left under the same name, and names a fresh one.
    pub async fn new(test: &str) -> TestSchema {
        let mut name = format!("lt_{}_{}", test, std::process::id());
        name.truncate(63);
        let name = name.to_lowercase();
        admin()
            .await
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
            .await
            .expect("drop a stale test schema");
        TestSchema { name }
    }

    /// A store on this schema, with its own pool (a worker of its own).
    pub async fn store(&self, ttl: Duration) -> PgStore {
        self.store_named(ttl, &format!("loops-test-{}", self.name))
            .await
    }

    /// A store on this schema whose connections carry `application_name`.
    pub async fn store_named(&self, ttl: Duration, application_name: &str) -> PgStore {
        PgStore::builder(pg_config())
            .schema(&self.name)
            .pool_size(4)
            .lease_ttl(ttl)
            .application_name(application_name)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("cannot open a store on schema {}: {e}", self.name))
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let name = self.name.clone();
        // A runtime of its own: the test's runtime may be gone or shutting down.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let Ok(mut config) = pg_config().parse::<tokio_postgres::Config>() else {
                    return;
                };
                config.application_name("loops-test-admin");
                if let Ok((client, connection)) = config.connect(tokio_postgres::NoTls).await {
                    let conn = tokio::spawn(connection);
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                        .await;
                    drop(client);
                    let _ = conn.await;
                }
            });
        })
        .join();
    }
}

pub mod chain;
pub mod wake;
pub mod worker;

/// The row of a new run `run_id` of `workflow` in state `A` (schema hash 7, created at 1 s):
/// what the tests that write through the `Store` trait create.
pub fn new_row(run_id: &str, workflow: &str) -> loops::RunInfo {
    loops::RunInfo {
        run_id: run_id.to_owned(),
        workflow: workflow.to_owned(),
        schema: loops::SchemaHash::from_u64(7),
        status: loops::RunStatus::Running,
        state: "A".to_owned(),
        seq: 0,
        attempt: 1,
        attempt_base: 0,
        interrupted: 0,
        created_ms: 1_000,
        updated_ms: 1_000,
        retry_at_ms: None,
        error: None,
        cancel: None,
        wait: None,
        block: None,
        entered: None,
        parent: None,
        key_nonce: Some(7),
    }
}
