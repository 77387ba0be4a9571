//! Workflow evolution at run time (issue 14): versions side by side, migrations committed as
//! records of their own (v1 → v2 → v3), failing migrations that leave the run blocked with one
//! write, a refused run that stays blocked and quiet under a running `serve`, and compatible
//! changes accepted at open (a wrong claim refused with the diff).
//!
//! The quiet window of `a_refused_run_stays_blocked_and_quiet_under_serve` is 30 s of a running
//! `serve` (it costs wall time, not CPU: the binary's other tests run meanwhile); a shorter
//! one for local iteration: `LOOPS_EVOLUTION_WINDOW_MS=2000 cargo test --test evolution quiet`.

mod logs;
#[path = "evolution/ticket.rs"]
mod ticket;
#[path = "evolution/workflows.rs"]
mod workflows;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops::{
    Error, MigratedFrom, RedbStore, Route, RunStatus, Runtime, SchemaHash, Store, Workflow,
};

use logs::captured;
use loops::testing::HookedStore;
use workflows::{Handler, Log, v1, v2, v2_panics, v2_refuses, v2_ships, v3};

type Shared = HookedStore<RedbStore>;

fn memory() -> Shared {
    HookedStore::new(RedbStore::in_memory().unwrap())
}

fn hash<W: Workflow>() -> SchemaHash {
    W::SCHEMA_HASH.pinned()
}

/// Drives a new v1 run `id` on its own runtime over `store` until its handler has run its
/// step in `state`, then stops it there (as a crash would: the runtime goes away mid-handler).
async fn stop_v1_at(store: &Shared, log: &Log, id: &'static str, state: &'static str) {
    let rt = Runtime::builder().build(store.clone());
    let handler = Handler::new(1, log).stopping_at(state);
    let reached = Arc::clone(&handler.reached);
    let driving = {
        let rt = rt.clone();
        tokio::spawn(async move {
            rt.run(
                id,
                v1::Order::Placed {
                    item: id.to_owned(),
                },
                &handler,
            )
            .await
        })
    };
    reached.notified().await;
    driving.abort();
    assert!(driving.await.unwrap_err().is_cancelled());
    rt.shutdown().await;
}

/// The transition records of `id`, as `(seq, state, schema, migrated)`.
async fn records(store: &Shared, id: &str) -> Vec<(u64, String, SchemaHash, Option<MigratedFrom>)> {
    store
        .history(id)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.seq, r.state, r.schema, r.migrated))
        .collect()
}

fn rec(
    seq: u64,
    state: &str,
    schema: SchemaHash,
    migrated: Option<MigratedFrom>,
) -> (u64, String, SchemaHash, Option<MigratedFrom>) {
    (seq, state.to_owned(), schema, migrated)
}

fn from_v1(seq: u64) -> Option<MigratedFrom> {
    Some(MigratedFrom {
        schema: hash::<v1::Order>(),
        version: 1,
        seq,
        accepted: false,
    })
}

fn calls(list: &[(u32, &str)]) -> Vec<(u32, String)> {
    list.iter().map(|(v, s)| (*v, (*s).to_owned())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_of_every_v1_state_migrate_through_v2_to_v3_and_finish() {
    let store = memory();
    let log = Log::default();
    stop_v1_at(&store, &log, "at-placed", "Placed").await;
    stop_v1_at(&store, &log, "at-packed", "Packed").await;
    store.clear_writes();

    // The build of version 3 keeps no older handler, only the migrations v1 → v2 → v3.
    let rt = Runtime::builder()
        .register::<v3::Order, _>(Handler::new(3, &log))
        .migration::<v1::Order, v2::Order>()
        .migration::<v2::Order, v3::Order>()
        .build(store.clone());
    let routes: Vec<String> = rt
        .dry_run()
        .await
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r.run_id, r.route))
        .collect();
    let (h1, h3) = (hash::<v1::Order>(), hash::<v3::Order>());
    assert_eq!(
        routes,
        [
            format!("at-packed migrate from version 1 to 3 ({h1} -> {h3}) in 2 migrations"),
            format!("at-placed migrate from version 1 to 3 ({h1} -> {h3}) in 2 migrations"),
        ]
    );
    assert!(store.writes().is_empty(), "a dry run writes nothing");
    rt.resume_all().await.unwrap();
    for id in ["at-placed", "at-packed"] {
        assert_eq!(
            rt.wait::<v3::Order>(id).await.unwrap(),
            v3::Order::Shipped {
                sku: id.to_owned(),
                qty: 1
            }
        );
    }

    // One migration record each, continuing the state it interrupted; the old records as
    // they were.
    assert_eq!(
        records(&store, "at-placed").await,
        [
            rec(0, "Placed", h1, None),
            rec(1, "Placed", h3, from_v1(0)),
            rec(2, "Packed", h3, None),
            rec(3, "Checked", h3, None),
            rec(4, "Shipped", h3, None),
        ]
    );
    assert_eq!(
        records(&store, "at-packed").await,
        [
            rec(0, "Placed", h1, None),
            rec(1, "Packed", h1, None),
            rec(2, "Packed", h3, from_v1(1)),
            rec(3, "Checked", h3, None),
            rec(4, "Shipped", h3, None),
        ]
    );
    // No step ran twice: the step of the interrupted state replayed from its record.
    for id in ["at-placed", "at-packed"] {
        assert_eq!(log.effects_of(id), ["reserve", "weigh", "inspect"], "{id}");
    }
    assert_eq!(
        log.calls_of("at-placed"),
        calls(&[(1, "Placed"), (3, "Placed"), (3, "Packed"), (3, "Checked")])
    );
    assert_eq!(
        log.calls_of("at-packed"),
        calls(&[(1, "Placed"), (1, "Packed"), (3, "Packed"), (3, "Checked")])
    );
    // The migrated state's idempotency keys are the ones version 1 was given.
    let keys = log.keys.lock().unwrap().clone();
    for (id, seq) in [("at-placed", 0), ("at-packed", 1)] {
        let given = &keys[&(id.to_owned(), seq)];
        assert_eq!(given.len(), 2, "{id}: {given:?}");
        assert_eq!(given[0], given[1], "{id}");
    }
    // What the v3 build wrote: one migration, then the run as usual (the interrupted
    // attempt counted; no step record for the replayed step).
    assert_eq!(
        store.kinds_of("at-placed"),
        [
            "Migrate",
            "BeginAttempt",
            "Transition",
            "Step",
            "Transition",
            "Step",
            "Transition"
        ]
    );
    assert_eq!(
        store.kinds_of("at-packed"),
        [
            "Migrate",
            "BeginAttempt",
            "Transition",
            "Step",
            "Transition"
        ]
    );
    // The row follows its latest record.
    let info = store.run_info("at-packed").await.unwrap().unwrap();
    assert_eq!((info.schema, info.seq, info.entered), (h3, 4, None));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_side_by_side_each_drive_their_own_runs() {
    let store = memory();
    let log = Log::default();
    stop_v1_at(&store, &log, "old-placed", "Placed").await;
    stop_v1_at(&store, &log, "old-packed", "Packed").await;
    // Both versions registered, no migration: the old runs finish on version 1's handler,
    // new runs start on version 2.
    let rt = Runtime::builder()
        .register::<v1::Order, _>(Handler::new(1, &log))
        .register::<v2::Order, _>(Handler::new(2, &log))
        .build(store.clone());
    rt.resume_all().await.unwrap();
    rt.start(
        "new",
        v2::Order::Placed {
            item: "new".into(),
            qty: 5,
        },
    )
    .await
    .unwrap();
    for id in ["old-placed", "old-packed"] {
        assert_eq!(
            rt.wait::<v1::Order>(id).await.unwrap(),
            v1::Order::Shipped { item: id.into() }
        );
        assert!(
            records(&store, id)
                .await
                .iter()
                .all(|r| r.2 == hash::<v1::Order>() && r.3.is_none())
        );
    }
    assert_eq!(
        rt.wait::<v2::Order>("new").await.unwrap(),
        v2::Order::Shipped {
            item: "new".into(),
            qty: 5
        }
    );
    assert_eq!(
        log.calls_of("old-placed"),
        calls(&[(1, "Placed"), (1, "Placed"), (1, "Packed")])
    );
    assert_eq!(
        log.calls_of("new"),
        calls(&[(2, "Placed"), (2, "Packed"), (2, "Checked")])
    );
    assert_eq!(log.effects_of("old-placed"), ["reserve", "weigh"]);
    rt.shutdown().await;
}

/// A v1 run at `Placed`, then a build with only `New` and a migration to it that fails:
/// returns what the build's dry run said of the run, the run's row once blocked, and the
/// store's writes for it.
async fn failing_migration<New>() -> (Route, loops::RunInfo, Vec<&'static str>, usize)
where
    New: loops::Dispatch<Handler> + loops::Migrate<v1::Order>,
{
    let store = memory();
    let log = Log::default();
    stop_v1_at(&store, &log, "r", "Placed").await;
    store.clear_writes();
    let rt = Runtime::builder()
        .register::<New, _>(Handler::new(2, &log))
        .migration::<v1::Order, New>()
        .build(store.clone());
    let [dry] = <[_; 1]>::try_from(rt.dry_run().await.unwrap()).unwrap();
    assert!(store.writes().is_empty(), "a dry run writes nothing");
    rt.resume_all().await.unwrap();
    let info = rt.wait_for_status("r", RunStatus::Blocked).await.unwrap();
    // Resumed again, and the migration registered again: it fails again, and the run is
    // blocked for that already: nothing more is written.
    rt.resume_all().await.unwrap();
    rt.migration::<v1::Order, New>();
    rt.shutdown().await;
    let history = store.history("r").await.unwrap().len();
    (dry.route, info, store.kinds_of("r"), history)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_migration_blocks_the_run_with_one_write() {
    let (dry, info, writes, history) = failing_migration::<v2_refuses::Order>().await;
    assert_eq!(writes, ["Block"]);
    assert_eq!(history, 1);
    assert_eq!((info.state.as_str(), info.seq), ("Placed", 0));
    let block = info.block.unwrap();
    // The dry run tried the migration, and said the block the run then got.
    let Route::Block(dry) = dry else {
        panic!("the dry run says {dry}");
    };
    assert_eq!(
        dry,
        loops::Blocked {
            reason: block.reason.clone(),
            changes: Default::default(),
        }
    );
    assert_eq!(block.resume, RunStatus::Running);
    assert_eq!(block.schema, hash::<v1::Order>());
    assert!(
        block.reason.ends_with(
            "the migration returned an error: refusing to migrate Placed { item: \"r\" }"
        ),
        "{}",
        block.reason
    );
    assert!(block.changes.is_empty());

    let (dry, info, writes, history) = failing_migration::<v2_panics::Order>().await;
    assert_eq!(writes, ["Block"]);
    assert_eq!(history, 1);
    let reason = info.block.unwrap().reason;
    assert_eq!(dry.to_string(), format!("blocked: {reason}"));
    assert!(
        reason.ends_with("the migration panicked: cannot migrate Placed { item: \"r\" }"),
        "{reason}"
    );
}

/// A migration into a terminal state ends the run there, completed, as a transition into
/// it would: no handler of the terminal state is looked for (the run failed after three
/// attempts with "state `Shipped` is terminal and has no handler": helper-107 MEDIUM 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_into_a_terminal_state_completes_the_run() {
    let store = memory();
    let log = Log::default();
    stop_v1_at(&store, &log, "packed", "Packed").await;
    let rt = Runtime::builder()
        .register::<v2_ships::Order, _>(Handler::new(2, &log))
        .migration::<v1::Order, v2_ships::Order>()
        .build(store.clone());
    rt.resume_all().await.unwrap();
    let info = rt
        .wait_for_status("packed", RunStatus::Completed)
        .await
        .unwrap();
    assert_eq!(
        (info.state.as_str(), info.seq, info.error, info.wait),
        ("Shipped", 2, None, None)
    );
    assert_eq!(
        records(&store, "packed").await,
        [
            rec(0, "Placed", hash::<v1::Order>(), None),
            rec(1, "Packed", hash::<v1::Order>(), None),
            rec(2, "Shipped", hash::<v2_ships::Order>(), from_v1(1)),
        ]
    );
    // The background driver lets the run go just after its last commit, which the row shows
    // first: until then `run` says the run is being driven (`RunActive`, as documented; seen
    // once in CI under load).
    let handler = Handler::new(2, &log);
    let started = std::time::Instant::now();
    let ended = loop {
        let placed = v2_ships::Order::Placed {
            item: "packed".into(),
            by: "us".into(),
        };
        match rt.run("packed", placed, &handler).await {
            Err(Error::RunActive { .. }) if started.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => break other.unwrap(),
        }
    };
    assert_eq!(
        ended,
        v2_ships::Order::Shipped {
            item: "packed".into(),
            by: "carrier".into()
        }
    );
    assert!(store.failures("packed").await.unwrap().is_empty());
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_run_of_an_unknown_schema_is_refused_and_blocked_once() {
    let store = memory();
    let log = Log::default();
    stop_v1_at(&store, &log, "r", "Packed").await;
    store.clear_writes();
    let rt = Runtime::builder().build(store.clone());
    let handler = Handler::new(2, &log);
    for _ in 0..2 {
        match rt
            .run(
                "r",
                v2::Order::Placed {
                    item: "r".into(),
                    qty: 1,
                },
                &handler,
            )
            .await
        {
            Err(Error::SchemaMismatch { changes, .. }) => assert!(!changes.is_empty()),
            other => panic!("expected SchemaMismatch, got {other:?}"),
        }
    }
    assert_eq!(store.kinds_of("r"), ["Block"]);
    // With the migration registered, the same call migrates the blocked run and finishes it.
    rt.migration::<v1::Order, v2::Order>();
    let done = rt
        .run(
            "r",
            v2::Order::Placed {
                item: "r".into(),
                qty: 1,
            },
            &handler,
        )
        .await
        .unwrap();
    assert_eq!(
        done,
        v2::Order::Shipped {
            item: "r".into(),
            qty: 1
        }
    );
    let h2 = hash::<v2::Order>();
    assert_eq!(
        records(&store, "r").await,
        [
            rec(0, "Placed", hash::<v1::Order>(), None),
            rec(1, "Packed", hash::<v1::Order>(), None),
            rec(2, "Packed", h2, from_v1(1)),
            rec(3, "Checked", h2, None),
            rec(4, "Shipped", h2, None),
        ]
    );
    assert_eq!(log.effects_of("r"), ["reserve", "weigh", "inspect"]);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_refused_run_stays_blocked_and_quiet_under_serve() {
    let window: u64 = std::env::var("LOOPS_EVOLUTION_WINDOW_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30_000);
    let lines = captured();

    let store = memory();
    let log = Log::default();
    stop_v1_at(&store, &log, "quiet-run", "Placed").await;
    store.clear_writes();
    // Version 2 only, no migration: the old run is refused.
    let rt = Runtime::builder()
        .register::<v2::Order, _>(Handler::new(2, &log))
        .build(store.clone());
    let serving = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.serve(Duration::from_millis(20)).await })
    };
    rt.wait_for_status("quiet-run", RunStatus::Blocked)
        .await
        .unwrap();
    // Other runs progress meanwhile.
    rt.start(
        "fresh",
        v2::Order::Placed {
            item: "fresh".into(),
            qty: 2,
        },
    )
    .await
    .unwrap();
    assert!(matches!(
        rt.wait::<v2::Order>("fresh").await,
        Ok(v2::Order::Shipped { qty: 2, .. })
    ));
    tokio::time::sleep(Duration::from_millis(window)).await;
    rt.shutdown().await;
    serving.await.unwrap().unwrap();

    assert_eq!(store.kinds_of("quiet-run"), ["Block"]);
    assert_eq!(lines.matching("WARN", "quiet-run"), 1);
    assert_eq!(lines.matching("ERROR", "quiet-run"), 0);
    let info = store.run_info("quiet-run").await.unwrap().unwrap();
    assert_eq!(
        (info.status, info.block.map(|b| b.resume)),
        (RunStatus::Blocked, Some(RunStatus::Running))
    );
    assert_eq!(store.history("quiet-run").await.unwrap().len(), 1);
    // The dry run says why.
    let routed = rt.dry_run().await.unwrap();
    let old = routed.iter().find(|r| r.run_id == "quiet-run").unwrap();
    assert_eq!(old.status, RunStatus::Blocked);
    assert!(matches!(old.route, Route::Block(_)));
    assert!(
        old.route
            .to_string()
            .starts_with("blocked: no compiled version of `order` has schema"),
        "{}",
        old.route
    );
}

#[test]
fn the_claims_name_version_1() {
    assert_eq!(
        ticket::v2::Ticket::ACCEPTS,
        [ticket::v1::Ticket::SCHEMA_HASH.pinned()]
    );
    assert_eq!(
        ticket::V1_HASH,
        ticket::v1::Ticket::SCHEMA_HASH.pinned().to_string()
    );
    // The mistaken claim names version 1's hash before the format is folded in.
    assert_eq!(
        ticket::unpinned::Ticket::ACCEPTS,
        [ticket::v1::Ticket::SCHEMA_HASH]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compatible_change_is_accepted_at_open_and_a_wrong_claim_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tickets.loops");
    left_running_by_v1(&path, "t1").await;
    // A claim that is wrong (a field retyped) refuses the open, with the diff.
    let refused = |result: Result<(), Error>| match result {
        Err(Error::AcceptsRefused {
            workflow,
            version,
            accepts,
            changes,
        }) => {
            assert_eq!((workflow.as_str(), version), ("ticket", 2));
            assert_eq!(accepts, hash::<ticket::v1::Ticket>());
            assert_eq!(
                changes.texts(),
                ["state `Open`: field `title` changed from `String` to `u64`"]
            );
        }
        other => panic!("expected AcceptsRefused, got {other:?}"),
    };
    refused(
        Runtime::builder()
            .register::<ticket::wrong::Ticket, _>(ticket::Closer::default())
            .open(&path)
            .map(drop),
    );
    // A version only declared (`workflow`, as a caller of `run` declares it) is checked at
    // open too; one neither declared nor registered, before `run` drives its first run.
    refused(
        Runtime::builder()
            .workflow::<ticket::wrong::Ticket>()
            .open(&path)
            .map(drop),
    );
    {
        let rt = Runtime::open(&path).unwrap();
        let wrong = ticket::wrong::Ticket::Open { title: 1 };
        refused(
            rt.run("t9", wrong, &ticket::Closer::default())
                .await
                .map(drop),
        );
        assert!(rt.store().run_info("t9").await.unwrap().is_none());
        rt.shutdown().await;
    }
    // A store given to `build` (PostgreSQL's, say) is checked when the runtime resumes its
    // runs, as is a version registered after the store opened; nothing is resumed.
    {
        let rt = Runtime::builder().build(loops::RedbStore::open(&path).unwrap());
        rt.register::<ticket::wrong::Ticket, _>(ticket::Closer::default());
        refused(rt.resume_all().await.map(drop));
        let t1 = rt.store().run_info("t1").await.unwrap().unwrap();
        assert_eq!((t1.status, t1.seq), (RunStatus::Running, 0));
        rt.shutdown().await;
    }
    // A claim that breaks only runs in some states opens, and says so once at WARN, with
    // the changes.
    let lines = captured();
    let partly = Runtime::builder()
        .register::<ticket::partly::Ticket, _>(ticket::Closer::default())
        .open(&path)
        .unwrap();
    partly.shutdown().await;
    drop(partly);
    let warned: Vec<String> = lines
        .text()
        .lines()
        .filter(|l| {
            l.contains("a claim to accept an older schema holds only for runs in some states")
        })
        .map(str::to_owned)
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains(" WARN ")
            && warned[0].contains("workflow=\"ticket\"")
            && warned[0].contains("version=2")
            && warned[0].contains(&format!("accepts={}", hash::<ticket::v1::Ticket>()))
            && warned[0].contains("state `Closed`: now stored as"),
        "{}",
        warned[0]
    );
    // A claim that names version 1's hash before loops' format is folded in (the derive's
    // `SCHEMA_HASH`, printed and pasted) matches no run: the open says so once at WARN,
    // naming the hash the store holds.
    let unpinned = Runtime::builder()
        .register::<ticket::unpinned::Ticket, _>(ticket::Closer::default())
        .open(&path)
        .unwrap();
    unpinned.shutdown().await;
    drop(unpinned);
    let warned: Vec<String> = lines
        .text()
        .lines()
        .filter(|l| l.contains("a claim to accept an older schema names a hash no run can have"))
        .map(str::to_owned)
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains(" WARN ")
            && warned[0].contains(&format!("accepts={}", ticket::v1::Ticket::SCHEMA_HASH))
            && warned[0].contains(&format!("stored={}", hash::<ticket::v1::Ticket>()))
            && warned[0].contains("`SCHEMA_HASH.pinned()` in code"),
        "{}",
        warned[0]
    );
    // The right claim opens, and the v1 run finishes on version 2 as it is.
    let rt = Runtime::builder()
        .register::<ticket::v2::Ticket, _>(ticket::Closer::default())
        .open(&path)
        .unwrap();
    let routed = rt.dry_run().await.unwrap();
    assert_eq!(routed.len(), 1);
    assert!(
        routed[0].route.to_string().starts_with(&format!(
            "accept on version 2 ({})",
            hash::<ticket::v2::Ticket>()
        )),
        "{}",
        routed[0].route
    );
    rt.resume_all().await.unwrap();
    assert_eq!(
        rt.wait::<ticket::v2::Ticket>("t1").await.unwrap(),
        ticket::v2::Ticket::Closed { title: "t1".into() }
    );
    // Version 2 took the run with a record of its own: the same state and data under its
    // schema, marked accepted (no migration ran), continuing the state entered at seq 0.
    let history = rt.store().history("t1").await.unwrap();
    let shape: Vec<(&str, SchemaHash, Option<MigratedFrom>)> = history
        .iter()
        .map(|r| (r.state.as_str(), r.schema, r.migrated))
        .collect();
    let (v1, v2) = (hash::<ticket::v1::Ticket>(), hash::<ticket::v2::Ticket>());
    let accepted = MigratedFrom {
        schema: v1,
        version: 1,
        seq: 0,
        accepted: true,
    };
    assert_eq!(
        shape,
        [
            ("Open", v1, None),
            ("Open", v2, Some(accepted)),
            ("Closed", v2, None),
        ]
    );
    assert_eq!(history[0].payload.get(), history[1].payload.get());
    // The acceptance stored version 2's description (before, only a run created by version
    // 2 did: `loops schema`, `graph` and a later refusal's diff knew nothing of it).
    assert_eq!(
        rt.store()
            .schema(hash::<ticket::v2::Ticket>())
            .await
            .unwrap()
            .as_deref(),
        Some(ticket::v2::Ticket::SCHEMA)
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_says_when_only_the_record_format_changed() {
    // A run recorded by a build of loops with another record format: the same enum, a
    // description whose header names format 0, another pinned hash.
    let store = memory();
    let stored = SchemaHash::from_u64(0x0f0f);
    let text: &'static str = Box::leak(
        v2::Order::SCHEMA
            .replacen(
                &format!(" format {}", loops::FORMAT_VERSION),
                " format 0",
                1,
            )
            .into_boxed_str(),
    );
    assert_ne!(text, v2::Order::SCHEMA);
    let state = v2::Order::Placed {
        item: "r".into(),
        qty: 1,
    };
    let mut record = loops::TransitionRecord::encode("r", 0, &state, 1).unwrap();
    record.schema = stored;
    let mut info = loops::RunInfo::new_run::<v2::Order>("r", loops::StateId::INITIAL, 1);
    info.schema = stored;
    let lease = store.acquire("r").await.unwrap().unwrap();
    store
        .write(
            Some(&lease),
            loops::Write::Create {
                info,
                record: serde_json::to_vec(&record).unwrap(),
                schema_text: text,
                attributes: Vec::new(),
            },
        )
        .await
        .unwrap();
    store.release(&lease).await.unwrap();
    let rt = Runtime::builder().build(store.clone());
    let log = Log::default();
    match rt.run("r", state, &Handler::new(2, &log)).await {
        Err(Error::SchemaMismatch { changes, .. }) => assert_eq!(
            changes.texts(),
            [format!(
                "record format version changed from 0 to {}",
                loops::FORMAT_VERSION
            )]
        ),
        other => panic!("expected SchemaMismatch, got {other:?}"),
    }
    let block = store.run_info("r").await.unwrap().unwrap().block.unwrap();
    assert_eq!(block.changes.len(), 1);
    assert!(
        block.changes[0].starts_with("record format version changed from 0 to"),
        "{:?}",
        block.changes
    );
    assert!(log.calls_of("r").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_the_missing_version_on_a_running_runtime_unblocks_its_runs() {
    let store = memory();
    let log = Log::default();
    stop_v1_at(&store, &log, "r", "Packed").await;
    let rt = Runtime::builder()
        .register::<v2::Order, _>(Handler::new(2, &log))
        .build(store.clone());
    rt.resume_all().await.unwrap();
    rt.wait_for_status("r", RunStatus::Blocked).await.unwrap();
    assert!(matches!(
        rt.wait::<v1::Order>("r").await,
        Err(Error::RunBlocked { seq: 1, .. })
    ));
    store.clear_writes();
    // The old version, registered on the running runtime: the run is unblocked and finishes
    // on it, its recorded step replayed.
    rt.register::<v1::Order, _>(Handler::new(1, &log));
    rt.wait_for_status("r", RunStatus::Completed).await.unwrap();
    assert_eq!(
        rt.wait::<v1::Order>("r").await.unwrap(),
        v1::Order::Shipped { item: "r".into() }
    );
    assert_eq!(
        store.kinds_of("r"),
        ["Unblock", "BeginAttempt", "Transition"]
    );
    assert_eq!(log.effects_of("r"), ["reserve", "weigh"]);
    assert_eq!(
        log.calls_of("r"),
        calls(&[(1, "Placed"), (1, "Packed"), (1, "Packed")])
    );
    rt.shutdown().await;
}

/// A run that ended under version 1, run or started again by a build of version 2 with the
/// migration v1 -> v2: its terminal state is returned through the migration, in memory, and
/// nothing is written (an ended run is not migrated in the store). Before, the build tried to
/// commit the migration and the caller got `Error::Fenced` (found by a fresh user with the
/// example: a run finished by `--workflow-version 1`, then reported by the default build).
/// Without the migration, the refusal is `SchemaMismatch`, and the ended run is not blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_run_of_an_older_version_is_read_through_the_migration_and_not_written() {
    let store = memory();
    let log = Log::default();
    let old = Runtime::builder().build(store.clone());
    let ended = old
        .run(
            "ended",
            v1::Order::Placed {
                item: "ended".into(),
            },
            &Handler::new(1, &log),
        )
        .await
        .unwrap();
    assert_eq!(
        ended,
        v1::Order::Shipped {
            item: "ended".into()
        }
    );
    old.shutdown().await;
    let stored = store.run_info("ended").await.unwrap().unwrap();
    store.clear_writes();

    let rt = Runtime::builder()
        .register::<v2::Order, _>(Handler::new(2, &log))
        .migration::<v1::Order, v2::Order>()
        .build(store.clone());
    let initial = || v2::Order::Placed {
        item: "ended".into(),
        qty: 5,
    };
    assert_eq!(
        rt.run("ended", initial(), &Handler::new(2, &log))
            .await
            .unwrap(),
        v2::Order::Shipped {
            item: "ended".into(),
            qty: 1
        }
    );
    let started = rt.start("ended", initial()).await.unwrap();
    assert_eq!(
        (started.status, started.state.as_str(), started.seq),
        (RunStatus::Completed, "Shipped", stored.seq)
    );
    assert_eq!(
        rt.wait::<v2::Order>("ended").await.unwrap(),
        v2::Order::Shipped {
            item: "ended".into(),
            qty: 1
        }
    );
    assert!(store.writes().is_empty(), "{:?}", store.writes());
    assert_eq!(store.run_info("ended").await.unwrap().unwrap(), stored);
    assert!(
        log.calls_of("ended")
            .iter()
            .all(|(version, _)| *version == 1)
    );
    rt.shutdown().await;

    // No migration: refused with the diff; the ended run is not blocked.
    let refusing = Runtime::builder()
        .register::<v2::Order, _>(Handler::new(2, &log))
        .build(store.clone());
    let refused = refusing
        .run("ended", initial(), &Handler::new(2, &log))
        .await;
    assert!(
        matches!(refused, Err(Error::SchemaMismatch { .. })),
        "{refused:?}"
    );
    assert!(store.writes().is_empty(), "{:?}", store.writes());
    refusing.shutdown().await;
}

/// Where the driver that blocks a run stands, for
/// `a_version_registered_while_the_run_is_being_blocked_unblocks_it`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holding {
    Driving,
    /// The driver committed the block and holds the run (in the hook).
    Held,
    /// The version is being registered (while the driver holds the run).
    Registering,
    /// The registration's sweep listed the blocked runs while the driver held the run.
    Listed,
    /// The driver may go on.
    Released,
}

/// Holds the driver that commits a block, with the run claimed, until the test releases it;
/// notes the sweep's list of blocked runs meanwhile.
#[derive(Clone)]
struct HoldBlock(Arc<(Mutex<Holding>, std::sync::Condvar)>);

impl HoldBlock {
    fn set(&self, to: Holding) {
        *self.0.0.lock().unwrap() = to;
        self.0.1.notify_all();
    }

    /// Waits (on a blocking thread) until the driver stands at `at`, for at most 10 s.
    async fn reached(&self, at: Holding) {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let guard = this.0.0.lock().unwrap();
            let (guard, _) = this
                .0
                .1
                .wait_timeout_while(guard, Duration::from_secs(10), |h| *h != at)
                .unwrap();
            assert_eq!(*guard, at);
        })
        .await
        .unwrap();
    }
}

impl loops::testing::WriteHook for HoldBlock {
    fn after(
        &self,
        seen: &loops::testing::WriteSeen,
        _: &loops::Result<loops::Reply>,
    ) -> loops::testing::Verdict {
        if seen.kind == "Block" {
            self.set(Holding::Held);
            let guard = self.0.0.lock().unwrap();
            let _ = self
                .0
                .1
                .wait_timeout_while(guard, Duration::from_secs(10), |h| *h != Holding::Released)
                .unwrap();
        }
        loops::testing::Verdict::Go
    }

    fn call(&self, call: &loops::testing::Call<'_>) -> loops::testing::Verdict {
        if let loops::testing::Call::List {
            status: RunStatus::Blocked,
            ..
        } = call
        {
            let mut holding = self.0.0.lock().unwrap();
            if *holding == Holding::Registering {
                *holding = Holding::Listed;
                self.0.1.notify_all();
            }
        }
        loops::testing::Verdict::Go
    }
}

/// The race the test above runs into now and then, made certain: the version is registered
/// while the driver that blocked the run still holds it, so the registration's sweep finds
/// the run driven and leaves it; the driver, done, routes it again and it finishes on v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_registered_while_the_run_is_being_blocked_unblocks_it() {
    let base = memory();
    let log = Log::default();
    stop_v1_at(&base, &log, "r", "Packed").await;
    let hold = HoldBlock(Arc::new((
        Mutex::new(Holding::Driving),
        std::sync::Condvar::new(),
    )));
    let store = HookedStore::with_hook(base.inner().clone(), hold.clone());
    let rt = Runtime::builder()
        .register::<v2::Order, _>(Handler::new(2, &log))
        .build(store.clone());
    rt.resume_all().await.unwrap();
    hold.reached(Holding::Held).await;
    hold.set(Holding::Registering);
    rt.register::<v1::Order, _>(Handler::new(1, &log));
    hold.reached(Holding::Listed).await;
    // The sweep looks at the listed run while the driver holds it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    hold.set(Holding::Released);
    rt.wait_for_status("r", RunStatus::Completed).await.unwrap();
    assert_eq!(
        rt.wait::<v1::Order>("r").await.unwrap(),
        v1::Order::Shipped { item: "r".into() }
    );
    assert_eq!(
        store.kinds_of("r"),
        ["Block", "Unblock", "BeginAttempt", "Transition"]
    );
    assert_eq!(log.effects_of("r"), ["reserve", "weigh"]);
    rt.shutdown().await;
}

/// A refusal that `Runtime::start` or `Runtime::run` returns carries the changes itself: the
/// block is logged once at INFO, without them, not at WARN (which would print them twice).
#[tokio::test]
async fn a_refusal_returned_to_the_caller_is_logged_once_without_the_changes() {
    let lines = captured();

    let store = memory();
    let log = Log::default();
    stop_v1_at(&store, &log, "refused-run", "Packed").await;
    store.clear_writes();
    let rt = Runtime::builder()
        .register::<v2::Order, _>(Handler::new(2, &log))
        .build(store.clone());
    let initial = || v2::Order::Placed {
        item: "old".into(),
        qty: 1,
    };
    let started = rt.start("refused-run", initial()).await;
    let Err(Error::SchemaMismatch { changes, .. }) = started else {
        panic!("expected SchemaMismatch, got {started:?}");
    };
    assert!(!changes.is_empty());
    let ran = rt
        .run("refused-run", initial(), &Handler::new(2, &log))
        .await;
    assert!(matches!(ran, Err(Error::SchemaMismatch { .. })), "{ran:?}");
    rt.shutdown().await;

    assert_eq!(store.kinds_of("refused-run"), ["Block"]);
    assert_eq!(lines.matching("WARN", "refused-run"), 0);
    assert_eq!(lines.matching("run blocked", "refused-run"), 1);
    let text = lines.text();
    let ours: Vec<&str> = text.lines().filter(|l| l.contains("refused-run")).collect();
    assert!(
        ours.iter().all(|l| !l.contains(&changes.to_string())),
        "{ours:?}"
    );
}

/// The first version of a workflow registered on a runtime that has resumed its runs already
/// (a process that registers its workflows as it goes) resumes that workflow's running runs,
/// as a start with it would: before, a run left running by a process that died had no driver
/// until the next `resume_all`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_version_registered_on_a_running_runtime_resumes_its_running_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tickets.loops");
    left_running_by_v1(&path, "late-1").await;
    let rt = Runtime::open(&path).unwrap();
    assert!(rt.resume_all().await.unwrap().is_empty());
    assert_eq!(
        rt.run_info("late-1").await.unwrap().unwrap().status,
        RunStatus::Running
    );
    rt.register::<ticket::v1::Ticket, _>(ticket::Closer::default());
    assert_eq!(
        rt.wait::<ticket::v1::Ticket>("late-1").await.unwrap(),
        ticket::v1::Ticket::Closed {
            title: "late-1".into()
        }
    );
    rt.shutdown().await;
}

/// Version 1's ticket `run_id` in `path`, left in `Open` and running, its driver dropped (a
/// process that died there).
async fn left_running_by_v1(path: &std::path::Path, run_id: &str) {
    let rt = Runtime::open(path).unwrap();
    let closer = ticket::Closer {
        stop: true,
        ..ticket::Closer::default()
    };
    let reached = Arc::clone(&closer.reached);
    let driving = {
        let rt = rt.clone();
        let run_id = run_id.to_owned();
        tokio::spawn(async move {
            let open = ticket::v1::Ticket::Open {
                title: run_id.clone(),
            };
            rt.run(&run_id, open, &closer).await
        })
    };
    reached.notified().await;
    driving.abort();
    let _ = driving.await;
    rt.shutdown().await;
}
