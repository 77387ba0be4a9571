//! Payloads encrypted at rest on PostgreSQL: with a codec (`RuntimeBuilder::codec`), the
//! store's tables hold no payload in clear (every row of every table, read raw as text, lacks
//! the secret), the run finishes with its exact state, and a runtime without the key is told
//! which key the payloads need.

mod common;

use std::time::Duration;

use common::{TestSchema, admin};
use loops::{CodecError, Context, Error, Keyring, RetryPolicy, Runtime, Store, Workflow};
use serde::{Deserialize, Serialize};

const SECRET: &str = "secret-token=hunter2";

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "pg_secrets")]
enum Secrets {
    #[initial]
    #[next(Done)]
    Open { token: String },
    #[terminal]
    Done { output: String, approval: String },
}

struct Agent;

impl SecretsHandler for Agent {
    type Error = anyhow::Error;

    async fn open(&self, ctx: &Context, token: String) -> Result<OpenNext, Self::Error> {
        let output: String = ctx
            .step("call", || async { Ok(format!("output {SECRET}")) })
            .await?;
        anyhow::ensure!(ctx.attempt() > 1, "refused {token}");
        let approval: String = ctx.wait_for("approve").await?;
        Ok(OpenNext::Done { output, approval })
    }
}

fn keys() -> Keyring {
    Keyring::new("k1", [5; 32]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tables_hold_no_payload_in_clear_and_the_run_finishes() {
    let schema = TestSchema::new("codec").await;
    let store = schema.store(Duration::from_secs(5)).await;
    let rt = Runtime::builder()
        .retry(
            RetryPolicy::attempts(3)
                .with_delays(Duration::from_millis(1), Duration::from_millis(2)),
        )
        .codec(keys())
        .build(store);
    rt.register::<Secrets, _>(Agent);
    rt.start(
        "s",
        Secrets::Open {
            token: SECRET.to_owned(),
        },
    )
    .await
    .unwrap();
    rt.send("s", "approve", &format!("yes {SECRET}"))
        .await
        .unwrap();
    let done = rt.wait::<Secrets>("s").await.unwrap();
    assert_eq!(
        done,
        Secrets::Done {
            output: format!("output {SECRET}"),
            approval: format!("yes {SECRET}"),
        }
    );
    let failures = rt.store().failures("s").await.unwrap();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].1.errors, vec![format!("refused {SECRET}")]);
    rt.shutdown().await;

    // Every row of every table, raw.
    let admin = admin().await;
    let mut seen = 0;
    for table in ["runs", "journal", "steps", "failures", "inbox"] {
        let rows = admin
            .query(
                &format!("SELECT t::text FROM \"{}\".{table} t", schema.name),
                &[],
            )
            .await
            .unwrap();
        for row in rows {
            let text: String = row.get(0);
            assert!(!text.contains("hunter2"), "{table}: {text}");
            seen += usize::from(text.contains("$sealed"));
        }
    }
    // 2 transitions, 2 steps (`call`, the wait), 1 failure, 1 event have sealed payloads.
    assert!(seen >= 6, "{seen} sealed rows");

    // The store lists the key that sealed it (table sealing_keys, migration 5).
    let store = schema.store(Duration::from_secs(5)).await;
    assert_eq!(store.sealing_keys().await.unwrap(), ["k1"]);

    // Without the codec: the store is refused at the first call, naming it and the key.
    let label = store.label().to_owned();
    let rt = Runtime::builder().build(store);
    let err = rt.state::<Secrets>("s").await.unwrap_err();
    assert!(
        matches!(&err, Error::Encrypted { store, keys } if *store == label && keys == &["k1"]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "store {label} holds payloads encrypted with key k1: {}",
            loops::NO_KEY_HINT
        )
    );
    assert!(matches!(
        rt.resume_all().await.unwrap_err(),
        Error::Encrypted { .. }
    ));
    rt.shutdown().await;

    // A sealed record read from the raw store without the key names its key.
    let raw = schema.store(Duration::from_secs(5)).await;
    let history = raw.history("s").await.unwrap();
    match history[1].decode::<Secrets>("s") {
        Err(Error::Payload { cause, run_id, .. }) => assert_eq!(
            (run_id.as_str(), *cause),
            ("s", CodecError::NoCodec { key: "k1".into() })
        ),
        other => panic!("expected a sealed payload, got {other:?}"),
    }

    // A worker with another key under `k1`, or with none of the store's keys: refused at
    // its first read (KeyMismatch, KeyNotInStore), never recording a second key.
    for (ring, wanted) in [
        (
            Keyring::new("k1", [6; 32]).unwrap(),
            format!(
                "store {label}: key `k1` is not the key `k1` its payloads were sealed with (another key under the same id): give the runtime the key the workers use"
            ),
        ),
        (
            Keyring::new("k9", [5; 32]).unwrap(),
            format!(
                "store {label} holds payloads encrypted with key k1 and none of them is held here: what key `k9` sealed, its workers may not open (give the key file the workers use; after a rotation it holds the old key too)"
            ),
        ),
    ] {
        let rt = Runtime::builder()
            .codec(ring)
            .build(schema.store(Duration::from_secs(5)).await);
        rt.register::<Secrets, _>(Agent);
        let read = rt.state::<Secrets>("s").await.unwrap_err();
        let started = rt
            .start("t", Secrets::Open { token: "t".into() })
            .await
            .unwrap_err();
        assert_eq!(
            (read.to_string(), started.to_string()),
            (wanted.clone(), wanted)
        );
        rt.shutdown().await;
    }
    assert_eq!(raw.sealing_keys().await.unwrap(), ["k1"]);
    assert_eq!(raw.run_info("t").await.unwrap(), None);
}
