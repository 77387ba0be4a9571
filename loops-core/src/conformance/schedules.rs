//! Cases of schedules: the rows [`Write::PutSchedule`], [`Write::PauseSchedule`],
//! [`Write::RemoveSchedule`] and [`Write::TickSchedule`] leave, and what they refuse.

use std::time::Duration;

use super::factory::Factory;
use crate::error::Error;
use crate::schedule::{CatchUp, Schedule, ScheduleInfo};
use crate::store::{Reply, Store, Write};

/// A row as a registration at `at_ms` would store it.
fn row(name: &str, spec: &Schedule, at_ms: u64) -> ScheduleInfo {
    ScheduleInfo::new(name, "wf", spec, at_ms)
}

fn minutes(n: u64, catch_up: CatchUp) -> Schedule {
    Schedule::every(Duration::from_secs(60 * n))
        .unwrap()
        .catch_up(catch_up)
}

async fn put(store: &dyn Store, info: ScheduleInfo) -> ScheduleInfo {
    match store
        .write(None, Write::PutSchedule { info })
        .await
        .unwrap()
    {
        Reply::Schedule(info) => info,
        other => panic!("PutSchedule replied {other:?}"),
    }
}

async fn tick(store: &dyn Store, name: &str, tick_ms: u64) -> Reply {
    let write = Write::TickSchedule {
        name: name.to_owned(),
        tick_ms,
        at_ms: tick_ms + 5,
    };
    store.write(None, write).await.unwrap()
}

async fn pause(store: &dyn Store, name: &str, paused: bool, at_ms: u64) -> crate::Result<Reply> {
    let write = Write::PauseSchedule {
        name: name.to_owned(),
        paused,
        at_ms,
    };
    store.write(None, write).await
}

/// [`Case::Schedules`](super::Case::Schedules).
pub(super) async fn schedules(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    assert_eq!(store.schedules().await.unwrap(), Vec::new());
    let first = row("s", &minutes(1, CatchUp::All), 1_000);
    assert_eq!(put(store, first.clone()).await, first);
    put(
        store,
        row(
            "a",
            &Schedule::cron_in("0 9 * * *", "Europe/Paris").unwrap(),
            2_000,
        ),
    )
    .await;
    // Ticks move the row forward only.
    let Reply::Schedule(r) = tick(store, "s", 60_000).await else {
        panic!()
    };
    assert_eq!(
        (r.through_ms, r.last_tick_ms, r.updated_ms),
        (60_000, Some(60_000), 60_005)
    );
    let Reply::Schedule(r) = tick(store, "s", 180_000).await else {
        panic!()
    };
    assert_eq!((r.through_ms, r.last_tick_ms), (180_000, Some(180_000)));
    let Reply::Schedule(r) = tick(store, "s", 120_000).await else {
        panic!()
    };
    assert_eq!(
        (r.through_ms, r.last_tick_ms, r.updated_ms),
        (180_000, Some(180_000), 180_005)
    );
    // Paused: a registration again keeps the pause, the ticks and the creation time.
    let Reply::Schedule(p) = pause(store, "s", true, 200_000).await.unwrap() else {
        panic!()
    };
    assert!(p.paused);
    let again = put(store, row("s", &minutes(2, CatchUp::Skip), 250_000)).await;
    let expected = ScheduleInfo {
        spec: "every 120000ms".to_owned(),
        catch_up: CatchUp::Skip,
        paused: true,
        through_ms: 180_000,
        last_tick_ms: Some(180_000),
        created_ms: 1_000,
        updated_ms: 250_000,
        ..first.clone()
    };
    assert_eq!(again, expected);
    // Resuming settles the paused ticks.
    let Reply::Schedule(r) = pause(store, "s", false, 400_000).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        (r.paused, r.through_ms, r.updated_ms),
        (false, 400_000, 400_000)
    );
    let listed = store.schedules().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a", "s"]);
    assert_eq!(listed[1], r);
    assert_eq!(listed[0].spec, "cron 0 9 * * * Europe/Paris");
    if let Some(second) = f.second().await {
        assert_eq!(second.schedules().await.unwrap(), listed);
    }
    // Removed: gone from the list; a late tick does not bring it back.
    let remove = |name: &str| Write::RemoveSchedule {
        name: name.to_owned(),
    };
    assert!(matches!(
        store.write(None, remove("s")).await.unwrap(),
        Reply::Done
    ));
    assert!(matches!(tick(store, "s", 500_000).await, Reply::Done));
    assert_eq!(store.schedules().await.unwrap(), vec![listed[0].clone()]);
}

/// [`Case::SchedulesRefused`](super::Case::SchedulesRefused).
pub(super) async fn schedules_refused(f: &dyn Factory) {
    let store = f.store();
    let store = &*store;
    let every = minutes(1, CatchUp::Latest);
    for name in ["", "a b", "a@b", &"n".repeat(129)] {
        let write = Write::PutSchedule {
            info: row(name, &every, 1),
        };
        let err = store.write(None, write).await.unwrap_err();
        assert!(
            matches!(&err, Error::InvalidSchedule { name: n, .. } if n == name),
            "{err}"
        );
    }
    let mut bad = row("s", &every, 1);
    bad.spec = "cron 0 9 * * * Mars/Olympus".to_owned();
    let err = store
        .write(None, Write::PutSchedule { info: bad })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidSchedule { name, .. } if name == "s"),
        "{err}"
    );
    for write in [
        Write::RemoveSchedule {
            name: "s".to_owned(),
        },
        Write::PauseSchedule {
            name: "s".to_owned(),
            paused: true,
            at_ms: 1,
        },
    ] {
        let err = store.write(None, write).await.unwrap_err();
        assert!(
            matches!(&err, Error::ScheduleNotFound { name } if name == "s"),
            "{err}"
        );
    }
    assert!(matches!(tick(store, "s", 60_000).await, Reply::Done));
    assert_eq!(store.schedules().await.unwrap(), Vec::new());
    // Two handles registering one schedule at once: both succeed, one row is kept.
    if let Some(second) = f.second().await {
        let (a, b) = tokio::join!(
            put(store, row("s", &every, 10)),
            put(&*second, row("s", &every, 20)),
        );
        let listed = store.schedules().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert!(
            listed[0] == a || listed[0] == b || listed[0].created_ms == 10,
            "{listed:?}"
        );
    }
}
