//! The workflow and the worker of the wake-up tests (tests/wakeups.rs, tests/wakeup_gap.rs):
//! a run that parks until the event `go`, and notes when its handler runs again.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loops::{Context, Runtime, Workflow};
use loops_postgres::PgStore;
use serde::{Deserialize, Serialize};

use super::{TestSchema, pg_config};

/// Parks until `go`, then ends with its payload.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "pg_wake")]
pub enum Wait {
    #[initial]
    #[next(Done)]
    Parked { n: u32 },
    #[terminal]
    Done { n: u32, go: u32 },
}

/// When each run's handler got its event, by run id.
pub type Waiter = Arc<Mutex<HashMap<String, Instant>>>;

/// Notes in its [`Waiter`] when a run's wait returned.
pub struct Agent(pub Waiter);

impl WaitHandler for Agent {
    type Error = anyhow::Error;

    async fn parked(&self, ctx: &Context, n: u32) -> Result<ParkedNext, Self::Error> {
        let go: u32 = ctx.wait_for("go").await?;
        self.0
            .lock()
            .unwrap()
            .insert(ctx.run_id().to_owned(), Instant::now());
        Ok(ParkedNext::Done { n, go })
    }
}

/// A worker serving [`Wait`] on `schema`, polling every `poll`, listening for wake-ups if
/// `listen`: its store (leases of 300 s, so that a poll up to 100 s is not shortened to a
/// third of the lease time), its runtime, and the task of `serve`.
pub async fn worker(
    schema: &TestSchema,
    listen: bool,
    poll: Duration,
    woken: &Waiter,
) -> (
    (PgStore, Runtime),
    tokio::task::JoinHandle<loops::Result<()>>,
) {
    let store = PgStore::builder(pg_config())
        .schema(&schema.name)
        .pool_size(4)
        .lease_ttl(Duration::from_secs(300))
        .application_name("loops-test-worker-a")
        .listen(listen)
        .connect()
        .await
        .unwrap();
    let runtime = Runtime::builder().build(store.clone());
    runtime.register::<Wait, _>(Agent(Arc::clone(woken)));
    let serving = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.serve(poll).await })
    };
    ((store, runtime), serving)
}

/// Another process's runtime on `schema`: it sends events, and neither drives [`Wait`] nor
/// listens (so that the only listening session is the worker's).
pub async fn sender(schema: &TestSchema) -> Runtime {
    let store = PgStore::builder(pg_config())
        .schema(&schema.name)
        .pool_size(2)
        .application_name("loops-test-sender")
        .listen(false)
        .connect()
        .await
        .unwrap();
    assert!(!store.is_listening());
    Runtime::builder().build(store)
}

/// Waits until `done` says so; fails the test naming `what` if that takes 60 s (a liveness
/// bound, not a measure of speed).
pub async fn until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        while !done().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "waited 60 s for {what}");
}

/// The server's sessions that listen on the channel of the store in `schema`.
pub async fn listener_pids(admin: &tokio_postgres::Client, schema: &str) -> Vec<i32> {
    admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND query = $1 ORDER BY pid",
            &[&format!("LISTEN \"{schema}\"")],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}
