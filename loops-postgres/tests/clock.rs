//! Issue 15, item 13: deadlines that other workers act on (a durable sleep's wake-up time, a
//! retry time) are recorded by the worker's clock and claimed by the server's. The skew
//! between the two is bounded: a store whose machine's clock is further off the server's than
//! `max_clock_skew` is refused at connect. The worker's clock is moved here with loops'
//! test hook (process-wide, so this file holds one test).

mod common;

use std::time::Duration;

use loops_postgres::{Error, PgStore};

async fn connect(schema: &common::TestSchema, bound: Option<Duration>) -> Result<PgStore, Error> {
    let builder = PgStore::builder(common::pg_config())
        .schema(&schema.name)
        .pool_size(1)
        .lease_ttl(Duration::from_secs(1));
    match bound {
        Some(bound) => builder.max_clock_skew(bound),
        None => builder,
    }
    .connect()
    .await
}

#[tokio::test]
async fn a_worker_whose_clock_is_off_the_servers_is_refused_beyond_the_bound() {
    let schema = common::TestSchema::new("clock").await;
    // The same machine: the clocks agree, give or take the query's round trip.
    let store = connect(&schema, None).await.unwrap();
    assert!(
        store.clock_skew_ms().abs() < 1_000,
        "{}",
        store.clock_skew_ms()
    );
    drop(store);

    // This worker's clock 5 s ahead of the server's.
    loops::__set_clock_offset_ms(5_000);
    let refused = connect(&schema, None).await;
    let moved = connect(&schema, Some(Duration::from_secs(10))).await;
    loops::__set_clock_offset_ms(0);
    match refused {
        Err(e @ Error::ClockSkew { .. }) => {
            let Error::ClockSkew {
                skew_ms,
                slack_ms,
                bound_ms,
                ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(*bound_ms, 1_000);
            assert!(
                (skew_ms + 5_000).unsigned_abs() <= slack_ms + 5,
                "{skew_ms} +- {slack_ms}"
            );
            let said = e.to_string();
            assert!(
                said.starts_with(&format!(
                    "the clock of this machine is {skew_ms} ms off the clock of "
                )),
                "{said}"
            );
            assert!(
                said.ends_with("more than the 1000 ms allowed (max_clock_skew); set the time right (NTP), or allow more"),
                "{said}"
            );
        }
        other => panic!("expected ClockSkew, got {other:?}"),
    }
    // Allowed more, it connects and says how far off it is.
    let moved = moved.unwrap();
    assert!(
        (moved.clock_skew_ms() + 5_000).abs() < 1_000,
        "{}",
        moved.clock_skew_ms()
    );
}
