//! With the `failpoints` feature: while a worker's listening connection is down (lost, and
//! kept from connecting again by the fault point `loops_postgres::listen::connect`), its
//! poll still finds the run that another process's event made ready; once the fault clears,
//! the listener connects again on its own. A test binary of its own: the fault point is the
//! whole process's.
#![cfg(feature = "failpoints")]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::wake::{Wait, listener_pids, sender, until, worker};
use common::{TestSchema, admin};
use loops::RunStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_carries_on_while_the_listener_is_down() {
    let schema = TestSchema::new("notify_gap").await;
    let woken = Arc::new(Mutex::new(HashMap::new()));
    let ((a_store, a), serving) = worker(&schema, true, Duration::from_millis(200), &woken).await;
    until("worker A listens", || async { a_store.is_listening() }).await;
    let admin = admin().await;
    let pids = listener_pids(&admin, &schema.name).await;
    assert_eq!(pids.len(), 1, "one listening session: {pids:?}");

    // The listener loses its session and cannot connect again.
    fail::cfg("loops_postgres::listen::connect", "return").unwrap();
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pids[0]])
        .await
        .unwrap();
    until("the listener notices", || async { !a_store.is_listening() }).await;

    // Meanwhile an event from another process: worker A's poll drives the run.
    a.start("g1", Wait::Parked { n: 1 }).await.unwrap();
    until("g1 parks", || async {
        a.store().run_info("g1").await.unwrap().map(|i| i.status) == Some(RunStatus::Waiting)
    })
    .await;
    let b = sender(&schema).await;
    b.send("g1", "go", &5u32).await.unwrap();
    until("g1 ends", || async {
        b.state::<Wait>("g1").await.unwrap() == Some((1, Wait::Done { n: 1, go: 5 }))
    })
    .await;
    assert!(woken.lock().unwrap().contains_key("g1"));
    // Driven by the poll: the listener is still down, and no session listens.
    assert!(!a_store.is_listening());
    assert_eq!(listener_pids(&admin, &schema.name).await, Vec::<i32>::new());

    // The fault clears: the listener connects again after its back-off, on a new session.
    fail::remove("loops_postgres::listen::connect");
    until("the listener is back", || async {
        let now = listener_pids(&admin, &schema.name).await;
        a_store.is_listening() && now.len() == 1 && now[0] != pids[0]
    })
    .await;
    a.shutdown().await;
    serving.abort();
}
