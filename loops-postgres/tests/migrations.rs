//! Migrations: applied once on connect, versioned, safe when workers start at once, and a
//! schema newer than this build is refused without a change.

mod common;

use std::time::Duration;

use loops_postgres::{Error, PgStore, SCHEMA_VERSION};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_starting_at_once_migrate_once() {
    let schema = common::TestSchema::new("m_once").await;
    let mut connects = Vec::new();
    for _ in 0..6 {
        let name = schema.name.clone();
        connects.push(tokio::spawn(async move {
            PgStore::builder(common::pg_config())
                .schema(name)
                .pool_size(1)
                .connect()
                .await
        }));
    }
    for c in connects {
        c.await.unwrap().unwrap();
    }
    let rows = common::admin()
        .await
        .query(
            &format!(
                "SELECT version, description FROM \"{}\".migrations ORDER BY version",
                schema.name
            ),
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        versions,
        vec![
            (
                1,
                "runs, journal, steps, failures, schemas, inbox, leases".to_owned()
            ),
            (
                2,
                "runs: status 'blocked', schema column (backfilled) and the claim's index"
                    .to_owned()
            ),
            (
                3,
                "workers: the schemas each live worker routes, with an expiry".to_owned()
            ),
            (
                4,
                "named limits: limits, limit_permits, limit_starts".to_owned()
            ),
            (5, "sealing_keys: the keys that sealed payloads".to_owned()),
            (
                6,
                "attributes: searchable run attributes and their index".to_owned()
            ),
            (
                7,
                "runs: parent column and its index (child runs)".to_owned()
            ),
            (8, "schedules: runs started per tick".to_owned()),
            (
                9,
                "commit_one: a lease holder's guarded commit in one statement".to_owned()
            ),
            (
                10,
                "sealing_keys.key_check: the check value of each sealing key".to_owned()
            ),
            (
                11,
                "commit_batch: the guarded commits of many lease holders in one statement"
                    .to_owned()
            )
        ]
    );
    assert_eq!(SCHEMA_VERSION, 11);
    let tables: Vec<String> = common::admin()
        .await
        .query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 \
             ORDER BY table_name",
            &[&schema.name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        tables,
        vec![
            "attributes",
            "failures",
            "inbox",
            "journal",
            "leases",
            "limit_permits",
            "limit_starts",
            "limits",
            "migrations",
            "runs",
            "schedules",
            "schemas",
            "sealing_keys",
            "steps",
            "workers"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_and_left_alone() {
    let schema = common::TestSchema::new("m_newer").await;
    drop(schema.store(Duration::from_secs(10)).await);
    let future = SCHEMA_VERSION + 1;
    let admin = common::admin().await;
    admin
        .execute(
            &format!(
                "INSERT INTO \"{}\".migrations (version, description) VALUES ({future}, 'from the future')",
                schema.name
            ),
            &[],
        )
        .await
        .unwrap();
    let err = PgStore::builder(common::pg_config())
        .schema(schema.name.clone())
        .connect()
        .await
        .unwrap_err();
    match &err {
        Error::SchemaTooNew {
            schema: s,
            found,
            supported,
        } => assert_eq!(
            (s.as_str(), *found, *supported),
            (schema.name.as_str(), future, SCHEMA_VERSION)
        ),
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!(
            "schema \"{}\" is at version {future}, newer than the version {SCHEMA_VERSION} this build knows; upgrade loops-postgres",
            schema.name
        )
    );
    let count: i64 = admin
        .query_one(
            &format!("SELECT count(*) FROM \"{}\".migrations", schema.name),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // Every migration this build knows, and the one from the future.
    assert_eq!(count, i64::from(SCHEMA_VERSION) + 1);
}

#[tokio::test]
async fn bad_settings_are_typed_errors() {
    let bad = |b: loops_postgres::PgStoreBuilder| async move { b.connect().await.unwrap_err() };
    assert!(matches!(
        bad(PgStore::builder(common::pg_config()).schema("Bad-Name")).await,
        Error::InvalidSchema { .. }
    ));
    assert!(matches!(
        bad(PgStore::builder(common::pg_config()).pool_size(0)).await,
        Error::InvalidSetting {
            setting: "pool_size",
            ..
        }
    ));
    assert!(matches!(
        bad(PgStore::builder(common::pg_config()).lease_ttl(Duration::from_millis(1))).await,
        Error::InvalidSetting {
            setting: "lease_ttl",
            ..
        }
    ));
    assert!(matches!(
        bad(PgStore::builder("host=127.0.0.1 port=notaport")).await,
        Error::Config { .. }
    ));
    // Nothing listens on port 1.
    match bad(PgStore::builder("host=127.0.0.1 port=1 user=postgres")
        .connect_timeout(Duration::from_secs(2)))
    .await
    {
        Error::Connect { label, .. } => {
            assert_eq!(
                label,
                "postgres://postgres@127.0.0.1:1/postgres schema loops"
            )
        }
        other => panic!("expected Connect, got {other:?}"),
    }
    // A database that does not exist: the server's message and code, not "db error".
    let err = bad(PgStore::builder(
        "host=127.0.0.1 port=5432 user=postgres dbname=loops_no_such_database",
    ))
    .await;
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "cannot connect to postgres://postgres@127.0.0.1:5432/loops_no_such_database schema loops: FATAL: database \"loops_no_such_database\" does not exist (SQLSTATE 3D000)"
    );
    assert!(std::error::Error::source(&err).is_none());
}

mod backfill {
    //! Table migration 2 on a populated store of version 1: every run's `schema` column is
    //! filled from its row, statuses are kept, and the claim filters on the filled column.

    use std::time::Duration;

    use loops::{ClaimFilter, RunInfo, RunStatus, SchemaHash, Store, WaitInfo, Workflow};

    use super::common;

    #[allow(
        dead_code,
        reason = "never driven: the generated handler trait and `{V}Next` enums go unused"
    )]
    mod a {
        #[derive(loops::Workflow, serde::Serialize, serde::Deserialize, Debug, Clone)]
        #[workflow(name = "pg_backfill", version = 1)]
        pub enum Job {
            #[initial]
            #[next(Done)]
            Start { n: u32 },
            #[terminal]
            Done,
        }
    }

    #[allow(
        dead_code,
        reason = "never driven: the generated handler trait and `{V}Next` enums go unused"
    )]
    mod b {
        #[derive(loops::Workflow, serde::Serialize, serde::Deserialize, Debug, Clone)]
        #[workflow(name = "pg_backfill", version = 2)]
        pub enum Job {
            #[initial]
            #[next(Done)]
            Start { n: u32, note: String },
            #[terminal]
            Done,
        }
    }

    /// The tables as loops-postgres's table migration 1 created them, frozen here as it was
    /// released (the store's own copy may change): the old code's schema.
    const VERSION_1: &str = r#"
CREATE SCHEMA {s};
CREATE TABLE {s}.migrations (
    version     integer PRIMARY KEY,
    description text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now());
INSERT INTO {s}.migrations (version, description)
    VALUES (1, 'runs, journal, steps, failures, schemas, inbox, leases');
CREATE TABLE {s}.runs (
    run_id        text COLLATE "C" PRIMARY KEY,
    workflow      text COLLATE "C" NOT NULL,
    status        text NOT NULL
                  CHECK (status IN ('running', 'waiting', 'completed', 'failed', 'cancelled')),
    seq           bigint NOT NULL,
    wait_event    text COLLATE "C",
    wait_until_ms bigint,
    info          text NOT NULL
);
CREATE INDEX runs_status ON {s}.runs (status, workflow, run_id);
CREATE TABLE {s}.journal (
    run_id text COLLATE "C" NOT NULL, seq bigint NOT NULL, record text NOT NULL,
    PRIMARY KEY (run_id, seq));
CREATE TABLE {s}.steps (
    run_id text COLLATE "C" NOT NULL, seq bigint NOT NULL, name text COLLATE "C" NOT NULL,
    occurrence integer NOT NULL, record text NOT NULL,
    PRIMARY KEY (run_id, seq, name, occurrence));
CREATE TABLE {s}.failures (
    run_id text COLLATE "C" NOT NULL, seq bigint NOT NULL, attempt integer NOT NULL,
    idx integer NOT NULL, record text NOT NULL,
    PRIMARY KEY (run_id, seq, attempt, idx));
CREATE TABLE {s}.schemas (hash text PRIMARY KEY, description text NOT NULL);
CREATE TABLE {s}.inbox (
    run_id text COLLATE "C" NOT NULL, event_seq bigint NOT NULL,
    name text COLLATE "C" NOT NULL, key text COLLATE "C",
    delivered boolean NOT NULL DEFAULT false, record text NOT NULL,
    PRIMARY KEY (run_id, event_seq));
CREATE INDEX inbox_pending ON {s}.inbox (run_id, name, event_seq) WHERE NOT delivered;
CREATE UNIQUE INDEX inbox_keys ON {s}.inbox (run_id, key) WHERE key IS NOT NULL;
CREATE TABLE {s}.leases (
    run_id text COLLATE "C" PRIMARY KEY, token bigint NOT NULL, owner text NOT NULL,
    expires_ms bigint NOT NULL);
CREATE SEQUENCE {s}.lease_tokens;
"#;

    /// A row of version 1: `(run id, schema, status)`, written as the old code wrote it.
    fn row(run_id: &str, schema: SchemaHash, status: RunStatus) -> RunInfo {
        let mut info = RunInfo::new_run::<a::Job>(run_id, a::Job::Start { n: 1 }.state(), 1_000);
        info.schema = schema;
        info.status = status;
        if status == RunStatus::Waiting {
            info.wait = Some(WaitInfo {
                event: Some("go".into()),
                until_ms: None,
            });
        }
        info
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn migration_2_fills_the_schema_column_of_every_run_of_a_version_1_store() {
        let schema = common::TestSchema::new("m_backfill").await;
        let admin = common::admin().await;
        let s = format!("\"{}\"", schema.name);
        admin
            .batch_execute(&VERSION_1.replace("{s}", &s))
            .await
            .unwrap();
        let (ha, hb) = (a::Job::SCHEMA_HASH.pinned(), b::Job::SCHEMA_HASH.pinned());
        let runs = [
            row("r1-running", ha, RunStatus::Running),
            row("r2-waiting", hb, RunStatus::Waiting),
            row("r3-completed", ha, RunStatus::Completed),
            row("r4-failed", hb, RunStatus::Failed),
            row("r5-cancelled", ha, RunStatus::Cancelled),
            row("r6-running", hb, RunStatus::Running),
        ];
        for info in &runs {
            let wait_event = info.wait.as_ref().and_then(|w| w.event.clone());
            admin
                .execute(
                    &format!(
                        "INSERT INTO {s}.runs \
                         (run_id, workflow, status, seq, wait_event, wait_until_ms, info) \
                         VALUES ($1, $2, $3, 0, $4, NULL, $5)"
                    ),
                    &[
                        &info.run_id,
                        &info.workflow,
                        &info.status.as_str(),
                        &wait_event,
                        &String::from_utf8(info.encode()).unwrap(),
                    ],
                )
                .await
                .unwrap();
        }

        // The new code opens it: migrations 2 and 3 run.
        let store = schema.store(Duration::from_secs(10)).await;
        let rows = admin
            .query(
                &format!("SELECT run_id, status, schema FROM {s}.runs ORDER BY run_id"),
                &[],
            )
            .await
            .unwrap();
        let found: Vec<(String, String, String)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let expected: Vec<(String, String, String)> = runs
            .iter()
            .map(|i| {
                (
                    i.run_id.clone(),
                    i.status.as_str().to_owned(),
                    i.schema.to_string(),
                )
            })
            .collect();
        assert_eq!(found, expected);
        // The rows read back as written.
        for info in &runs {
            assert_eq!(
                store.run_info(&info.run_id).await.unwrap().as_ref(),
                Some(info)
            );
        }
        // The claim filters on the filled column: a worker of schema `a` takes the running
        // run of `a` only; one of `b`, the running run of `b` only.
        let claim = |hash: SchemaHash| {
            let store = store.clone();
            async move {
                let filter = ClaimFilter {
                    workflow: "pg_backfill".into(),
                    schemas: Some(vec![hash]),
                };
                let claimed = store.claim_ready(&[filter], 10).await.unwrap();
                claimed
                    .into_iter()
                    .map(|(info, _)| info.run_id)
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(claim(ha).await, ["r1-running"]);
        assert_eq!(claim(hb).await, ["r6-running"]);
    }
}
