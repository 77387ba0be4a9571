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
                "named limits: limits, limit_permits, limit_starts".to_owned()
            )
        ]
    );
    assert_eq!(SCHEMA_VERSION, 3);
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
            "failures",
            "inbox",
            "journal",
            "leases",
            "limit_permits",
            "limit_starts",
            "limits",
            "migrations",
            "runs",
            "schemas",
            "steps"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_and_left_alone() {
    let schema = common::TestSchema::new("m_newer").await;
    drop(schema.store(Duration::from_secs(10)).await);
    let admin = common::admin().await;
    admin
        .execute(
            &format!(
                "INSERT INTO \"{}\".migrations (version, description) VALUES (7, 'from the future')",
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
            (schema.name.as_str(), 7, SCHEMA_VERSION)
        ),
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!(
            "schema \"{}\" is at version 7, newer than the version 3 this build knows; upgrade loops-postgres",
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
}
