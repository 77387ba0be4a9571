//! Payloads encrypted at rest: a runtime given a codec (`RuntimeBuilder::codec`, a
//! `Keyring`) stores no payload in clear (the redb file's bytes hold no secret), finishes its
//! runs, reads after a key rotation, and refuses a missing key, a wrong key and a payload
//! altered or moved to another record, with typed errors naming the run, record and key id.

use std::sync::atomic::{AtomicU32, Ordering};

use loops::{
    CodecError, Context, Error, Keyring, PayloadCodec, Payloads, RecordKind, RunStatus, Runtime,
    Workflow,
};
use serde::{Deserialize, Serialize};

const SECRET: &str = "secret-token=hunter2";

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "secrets")]
enum Secrets {
    #[initial]
    #[next(Waiting)]
    Start { token: String },
    #[next(Done)]
    Waiting { token: String, output: String },
    #[terminal]
    Done { output: String, approval: String },
}

/// Fails the first attempt of `Start` with the secret in its error; counts the step's runs.
#[derive(Default)]
struct Agent {
    attempts: AtomicU32,
    calls: AtomicU32,
}

impl SecretsHandler for Agent {
    type Error = anyhow::Error;

    async fn start(&self, ctx: &Context, token: String) -> Result<StartNext, Self::Error> {
        let output: String = ctx
            .step("call", || async {
                self.calls.fetch_add(1, Ordering::SeqCst);
                Ok(format!("model said {SECRET}"))
            })
            .await?;
        if self.attempts.fetch_add(1, Ordering::SeqCst) == 0 {
            anyhow::bail!("the API refused {token}");
        }
        Ok(StartNext::Waiting { token, output })
    }

    async fn waiting(
        &self,
        ctx: &Context,
        _token: String,
        output: String,
    ) -> Result<WaitingNext, Self::Error> {
        let approval: String = ctx.wait_for("approve").await?;
        Ok(WaitingNext::Done { output, approval })
    }
}

fn key1() -> Keyring {
    Keyring::new("k1", [7; 32]).unwrap()
}

fn rotated() -> Keyring {
    Keyring::new("k2", [8; 32])
        .unwrap()
        .with_reading_key("k1", [7; 32])
        .unwrap()
}

fn open(path: &std::path::Path, keys: Option<Keyring>) -> Runtime {
    let mut builder = Runtime::builder().retry(loops::RetryPolicy::attempts(3).with_delays(
        std::time::Duration::from_millis(1),
        std::time::Duration::from_millis(2),
    ));
    if let Some(keys) = keys {
        builder = builder.codec(keys);
    }
    builder.open(path).unwrap()
}

/// Starts run `id` and sends its approval; returns the final state.
async fn finish(rt: &Runtime, agent: Agent, id: &str) -> (Secrets, u32, u32) {
    let agent = std::sync::Arc::new(agent);
    rt.register::<Secrets, _>(Shared(agent.clone()));
    rt.start(
        id,
        Secrets::Start {
            token: SECRET.to_owned(),
        },
    )
    .await
    .unwrap();
    rt.send(id, "approve", &format!("approved, {SECRET}"))
        .await
        .unwrap();
    let done = rt.wait::<Secrets>(id).await.unwrap();
    (
        done,
        agent.attempts.load(Ordering::SeqCst),
        agent.calls.load(Ordering::SeqCst),
    )
}

struct Shared(std::sync::Arc<Agent>);

impl SecretsHandler for Shared {
    type Error = anyhow::Error;
    async fn start(&self, ctx: &Context, token: String) -> Result<StartNext, Self::Error> {
        self.0.start(ctx, token).await
    }
    async fn waiting(
        &self,
        ctx: &Context,
        token: String,
        output: String,
    ) -> Result<WaitingNext, Self::Error> {
        self.0.waiting(ctx, token, output).await
    }
}

fn expected_done() -> Secrets {
    Secrets::Done {
        output: format!("model said {SECRET}"),
        approval: format!("approved, {SECRET}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_payload_is_stored_in_clear_and_runs_finish_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let rt = open(&path, Some(key1()));
    let (done, attempts, calls) = finish(&rt, Agent::default(), "r1").await;
    assert_eq!(done, expected_done());
    // Two attempts of Start (the first failed after its step), the step ran once.
    assert_eq!((attempts, calls), (2, 1));
    // Read back through the codec: states, failure texts, events, step outputs.
    let history = rt.history::<Secrets>("r1").await.unwrap();
    let states: Vec<_> = history.iter().map(|t| t.value.clone()).collect();
    assert_eq!(
        states,
        vec![
            Secrets::Start {
                token: SECRET.to_owned()
            },
            Secrets::Waiting {
                token: SECRET.to_owned(),
                output: format!("model said {SECRET}")
            },
            expected_done(),
        ]
    );
    let failures = rt.store().failures("r1").await.unwrap();
    assert_eq!(failures.len(), 1);
    assert_eq!(
        failures[0].1.errors,
        vec![format!("the API refused {SECRET}")]
    );
    let events = rt.store().events("r1").await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].1.payload.get(), format!("\"approved, {SECRET}\""));
    let steps = rt.store().steps("r1", 0).await.unwrap();
    let call = steps.iter().find(|(name, _, _)| name == "call").unwrap();
    assert_eq!(call.2.output.get(), format!("\"model said {SECRET}\""));
    let wait = rt.store().steps("r1", 1).await.unwrap();
    assert_eq!(
        wait[0].2.output.get(),
        format!(r#"{{"event":{{"seq":0,"payload":"approved, {SECRET}"}}}}"#)
    );
    rt.shutdown().await;
    drop(rt);

    let bytes = std::fs::read(&path).unwrap();
    let find = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(!find(b"hunter2"), "the secret is in the file in clear");
    assert!(
        !find(b"model said"),
        "a step output is in the file in clear"
    );
    assert!(find(br#"{"$sealed":{"key":"k1","data":""#));
    // What stays in clear: run id, workflow, state names.
    assert!(find(b"r1") && find(b"secrets") && find(b"Waiting"));

    // Rotation: k2 writes, k1 still reads; a new run is sealed under k2.
    let rt = open(&path, Some(rotated()));
    assert_eq!(
        rt.state::<Secrets>("r1").await.unwrap(),
        Some((2, expected_done()))
    );
    let (done, _, _) = finish(&rt, Agent::default(), "r2").await;
    assert_eq!(done, expected_done());
    rt.shutdown().await;
    drop(rt);

    // The old keyring alone reads r1 but not r2 (sealed under k2).
    let rt = open(&path, Some(key1()));
    assert_eq!(
        rt.state::<Secrets>("r1").await.unwrap(),
        Some((2, expected_done()))
    );
    match rt.state::<Secrets>("r2").await {
        Err(Error::Payload {
            run_id,
            record: RecordKind::Transition,
            seq: 2,
            field: "payload",
            action: "opened",
            cause,
        }) => assert_eq!(
            (run_id.as_str(), *cause),
            (
                "r2",
                CodecError::UnknownKey {
                    key: "k2".into(),
                    known: "k1".into()
                }
            )
        ),
        other => panic!("expected an unknown key, got {other:?}"),
    }
    drop(rt);

    // A wrong key under the right id: refused when the store opens, by the check value the
    // store recorded with the id, before anything is read.
    let err = open_with(&path, Keyring::new("k1", [9; 32]).unwrap()).unwrap_err();
    assert_eq!(err.to_string(), mismatch(&path));

    // No codec: the store is refused when it opens, naming it and the keys that sealed it.
    let err = open_err(&path);
    assert!(
        matches!(&err, Error::Encrypted { store, keys } if *store == path.display().to_string() && keys == &["k1", "k2"]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "store {} holds payloads encrypted with key k1, k2: give the runtime the key with RuntimeBuilder::codec (the `loops` CLI: --key-file PATH or LOOPS_KEY_FILE)",
            path.display()
        )
    );
    // The raw store: a sealed record decoded without the key names its key, never a
    // decode error of the workflow's type.
    let store = loops::RedbStore::open(&path).unwrap();
    let stored = store.history("r1").unwrap();
    match stored[1].decode::<Secrets>("r1") {
        Err(Error::Payload { cause, .. }) => {
            assert_eq!(*cause, CodecError::NoCodec { key: "k1".into() })
        }
        other => panic!("expected a missing codec, got {other:?}"),
    }
    // The stored payloads, as stored: moved to another record or altered, they do not open.
    let payloads = Payloads::new(std::sync::Arc::new(key1()));
    let mut moved = stored[1].clone();
    moved.seq = 2;
    assert!(matches!(
        payloads.open_transition("r1", &mut moved),
        Err(Error::Payload { ref cause, seq: 2, .. }) if matches!(**cause, CodecError::Rejected { .. })
    ));
    let mut other_run = stored[1].clone();
    assert!(matches!(
        payloads.open_transition("r2", &mut other_run),
        Err(Error::Payload { ref cause, .. }) if matches!(**cause, CodecError::Rejected { .. })
    ));
    let mut altered = stored[1].clone();
    let text = altered.payload.get().replacen("data\":\"", "data\":\"A", 1);
    altered.payload = serde_json::value::RawValue::from_string(text).unwrap();
    assert!(matches!(
        payloads.open_transition("r1", &mut altered),
        Err(Error::Payload { .. })
    ));
    let mut intact = stored[1].clone();
    payloads.open_transition("r1", &mut intact).unwrap();
    assert_eq!(
        intact.decode::<Secrets>("r1").unwrap(),
        Secrets::Waiting {
            token: SECRET.to_owned(),
            output: format!("model said {SECRET}")
        }
    );
    // Without a key, a reader that redacts says which key it needs.
    let mut redacted = stored[1].clone();
    Payloads::redacting()
        .open_transition("r1", &mut redacted)
        .unwrap();
    assert_eq!(redacted.payload.get(), r#""<encrypted: key k1>""#);
    let info = store.run("r1").unwrap().unwrap();
    assert_eq!(info.status, RunStatus::Completed);
}

/// `Runtime::open` without a codec, for a store that must refuse it.
fn open_err(path: &std::path::Path) -> Error {
    Runtime::builder().open(path).unwrap_err()
}

/// `Runtime::open` with the codec `keys`.
fn open_with(path: &std::path::Path, keys: Keyring) -> Result<Runtime, Error> {
    Runtime::builder().codec(keys).open(path)
}

/// A runtime with the codec `keys` built on the store file at `path` opened elsewhere (as a
/// PostgreSQL store is), with [`Gate`] registered.
fn built_on(path: &std::path::Path, keys: Keyring) -> Runtime {
    let rt = Runtime::builder()
        .codec(keys)
        .build(loops::RedbStore::open(path).unwrap());
    rt.register::<Gate, _>(Approves);
    rt
}

/// [`Error::KeyMismatch`]'s text for key `k1` of the store at `path`.
fn mismatch(path: &std::path::Path) -> String {
    format!(
        "store {}: key `k1` is not the key `k1` its payloads were sealed with (another key under the same id): give the runtime the key the workers use",
        path.display()
    )
}

/// A store that knows it is encrypted: the codec's key ids are recorded before the first
/// sealed payload (after a rotation, both); runs stored in clear before the codec was given
/// stay readable by the runtime with the codec; a runtime built on the store without a codec
/// is refused at its first call, and one that reads it redacted reads on but refuses to store
/// a payload in clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_store_is_refused_without_the_key_and_clear_runs_stay_readable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");

    // Before encryption: r0 in clear; the store lists no key, and opens without a codec.
    let rt = open(&path, None);
    let (done, _, _) = finish(&rt, Agent::default(), "r0").await;
    assert_eq!(done, expected_done());
    assert_eq!(
        rt.redb().unwrap().sealing_keys().unwrap(),
        Vec::<String>::new()
    );
    rt.shutdown().await;
    drop(rt);

    // Encryption on: r0 still reads; r1 is sealed; k1 is recorded.
    let rt = open(&path, Some(key1()));
    assert_eq!(
        rt.state::<Secrets>("r0").await.unwrap(),
        Some((2, expected_done()))
    );
    finish(&rt, Agent::default(), "r1").await;
    assert_eq!(rt.redb().unwrap().sealing_keys().unwrap(), ["k1"]);
    rt.shutdown().await;
    drop(rt);
    let rt = open(&path, Some(rotated()));
    finish(&rt, Agent::default(), "r2").await;
    assert_eq!(rt.redb().unwrap().sealing_keys().unwrap(), ["k1", "k2"]);
    rt.shutdown().await;
    drop(rt);

    // A store built elsewhere, without a codec: refused at the first call, whichever.
    let rt = Runtime::builder().build(loops::RedbStore::open(&path).unwrap());
    for err in [
        rt.run_info("r0").await.unwrap_err(),
        rt.resume_all().await.unwrap_err(),
    ] {
        assert!(
            matches!(&err, Error::Encrypted { keys, .. } if keys == &["k1", "k2"]),
            "{err:?}"
        );
    }
    drop(rt);

    // Redacted: reads go on (a sealed text shows its key), a payload is not stored in clear,
    // a write without a payload goes on.
    let rt = Runtime::builder()
        .read_sealed_redacted()
        .open(&path)
        .unwrap();
    let r1 = rt.store().history("r1").await.unwrap();
    assert_eq!(r1[1].payload.get(), r#""<encrypted: key k1>""#);
    assert_eq!(
        rt.store().history("r0").await.unwrap()[2]
            .decode::<Secrets>("r0")
            .unwrap(),
        expected_done()
    );
    let err = rt.send("r1", "approve", &"in clear").await.unwrap_err();
    assert!(matches!(&err, Error::Encrypted { .. }), "{err:?}");
    assert_eq!(rt.store().events("r1").await.unwrap().len(), 1);
    assert!(matches!(
        rt.retry("r1").await.unwrap_err(),
        Error::NotFailed { .. }
    ));
}

/// A key file that does not exist: the OS's reason is said once, whether the error is
/// printed alone or with its chain (anyhow's `{:#}`).
#[test]
fn a_missing_key_file_says_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-keys");
    let err = Keyring::from_file(&path).unwrap_err();
    let expected = format!(
        "cannot read key file {}: No such file or directory (os error 2)",
        path.display()
    );
    assert_eq!(err.to_string(), expected);
    assert_eq!(loops::error_chain(&err), std::slice::from_ref(&expected));
    assert_eq!(format!("{:#}", anyhow::Error::from(err)), expected);
}

/// A key file that is a directory or a FIFO is refused as not a regular file, at once: a
/// FIFO made `deliver --key-file` wait forever, and a directory was blamed on its mode.
#[cfg(unix)]
#[test]
fn a_key_file_that_is_not_a_regular_file_is_refused_at_once() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo-keys");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let folder = dir.path().join("dir-keys");
    std::fs::create_dir(&folder).unwrap();
    for path in [&fifo, &folder] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = Keyring::from_file(path).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "cannot read key file {}: not a regular file",
                path.display()
            )
        );
    }
}

/// An event sealed outside the program (a CLI with a key file) is stored only by a runtime
/// that opens it: refused by one without a codec (its store is in clear) and by one whose
/// key of that id is another key, with nothing written; taken by the run under the right
/// key. A runtime that seals as the store does (the CLI's) records no key in a store in
/// clear and stores its payloads in clear, and refuses to seal into a store whose payloads
/// are sealed with other keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_sealed_elsewhere_is_stored_only_where_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    let sealed = Payloads::new(std::sync::Arc::new(key1()))
        .seal_event("r", "approve", &serde_json::to_string("approved").unwrap())
        .unwrap();
    let sealed = serde_json::value::RawValue::from_string(sealed).unwrap();
    let waiting = async |rt: &Runtime| {
        rt.register::<Secrets, _>(Agent::default());
        rt.start("r", Secrets::Start { token: "t".into() })
            .await
            .unwrap();
        for _ in 0..2000 {
            if rt.run_info("r").await.unwrap().unwrap().status == RunStatus::Waiting {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("run r never waited");
    };
    // No codec (a store in clear), then a key of the same id with other bytes: refused,
    // nothing written.
    let clear = "run `r`: the payload of event `approve` arrived encrypted and is refused: it is encrypted with key `k1`, and this runtime keeps payloads in clear (it has no codec): send it in clear";
    let other_bytes = "run `r`: the payload of event `approve` arrived encrypted and is refused: it does not authenticate under key `k1`: the payload was altered, moved from another record or run, or sealed with another key of the same id";
    for (file, keys, cause, message) in [
        (
            "clear.redb",
            None,
            CodecError::SealedForClear { key: "k1".into() },
            clear,
        ),
        (
            "other.redb",
            Some(Keyring::new("k1", [9; 32]).unwrap()),
            CodecError::Rejected { key: "k1".into() },
            other_bytes,
        ),
    ] {
        let rt = open(&dir.path().join(file), keys);
        waiting(&rt).await;
        let err = rt
            .send_json("r", "approve", None, &sealed)
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), message);
        let Error::SealedRefused {
            run_id,
            record,
            field,
            cause: got,
        } = err
        else {
            panic!("{err:?}");
        };
        let event = RecordKind::Event {
            name: Some("approve".into()),
        };
        assert_eq!(
            (run_id, record, field, *got),
            ("r".into(), event, "payload", cause)
        );
        assert_eq!(rt.store().events("r").await.unwrap().len(), 0);
        rt.shutdown().await;
        drop(rt);
    }

    // The right key: taken, and the run ends with it.
    let rt = open(&dir.path().join("sealed.redb"), Some(key1()));
    waiting(&rt).await;
    rt.send_json("r", "approve", None, &sealed).await.unwrap();
    let Secrets::Done { approval, .. } = rt.wait::<Secrets>("r").await.unwrap() else {
        panic!("not done");
    };
    assert_eq!(approval, "approved");
    rt.shutdown().await;
    drop(rt);

    // Sealing as the store does: in clear in the store in clear, no key recorded there...
    let following = |path: &std::path::Path, keys: Keyring| {
        Runtime::builder()
            .codec(keys)
            .seal_as_store_does()
            .open(path)
            .unwrap()
    };
    let rt = following(&dir.path().join("clear.redb"), key1());
    rt.send("r", "approve", &"in clear").await.unwrap();
    let events = rt.sealed_store().events("r").await.unwrap();
    assert_eq!(events[0].1.payload.get(), r#""in clear""#);
    assert_eq!(
        rt.sealed_store().sealing_keys().await.unwrap(),
        Vec::<String>::new()
    );
    rt.shutdown().await;
    drop(rt);
    // ... and never with a key the store does not list.
    let rt = following(&dir.path().join("sealed.redb"), rotated());
    rt.register::<Secrets, _>(Agent::default());
    let err = rt
        .start("r2", Secrets::Start { token: "t".into() })
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "store {} holds payloads encrypted with key k1 and none of them is held here: what key `k2` sealed, its workers may not open (give the key file the workers use; after a rotation it holds the old key too)",
            dir.path().join("sealed.redb").display()
        )
    );
    assert_eq!(rt.run_info("r2").await.unwrap(), None);
    assert_eq!(rt.sealed_store().sealing_keys().await.unwrap(), ["k1"]);
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "gate")]
enum Gate {
    #[initial]
    #[next(Done)]
    Open { n: u32 },
    #[terminal]
    Done { approval: String },
}

struct Approves;

impl GateHandler for Approves {
    type Error = Error;

    async fn open(&self, ctx: &Context, _n: u32) -> Result<OpenNext, Self::Error> {
        let approval: String = ctx.wait_for("approve").await?;
        Ok(OpenNext::Done { approval })
    }
}

/// A runtime sealing with [`key1`] on the store at `path`, with run `r` of [`Gate`]
/// waiting for `approve`.
async fn gate_waiting(path: &std::path::Path) -> Runtime {
    let rt = open(path, Some(key1()));
    rt.register::<Gate, _>(Approves);
    rt.start("r", Gate::Open { n: 1 }).await.unwrap();
    rt.wait_for_status("r", RunStatus::Waiting).await.unwrap();
    rt
}

/// An event stored sealed under another key of the same id (written past the runtime, as a
/// store altered outside loops would be): each attempt fails with the payload error, said as
/// it is, and the run fails when its retries are spent; never "interrupted" attempts a
/// second apart (a recorded wait outcome that did not open stopped the driver).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_payload_that_does_not_open_fails_its_attempts_with_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let rt = gate_waiting(&path).await;
    rt.shutdown().await;
    drop(rt);
    let raw = loops::RedbStore::open(&path).unwrap();
    let payload = Payloads::new(std::sync::Arc::new(Keyring::new("k1", [9; 32]).unwrap()))
        .seal_event("r", "approve", r#""approved""#)
        .unwrap();
    let send = loops::Write::Send {
        run_id: "r".into(),
        name: "approve".into(),
        payload,
        key: None,
        at_ms: 1,
    };
    loops::Store::write(&raw, None, send).await.unwrap();
    drop(raw);

    let rt = open(&path, Some(key1()));
    rt.register::<Gate, _>(Approves);
    rt.resume_all().await.unwrap();
    let info = rt.wait_for_status("r", RunStatus::Failed).await.unwrap();
    let cause = "run `r`: the payload of event `approve` cannot be opened: it does not authenticate under key `k1`: the payload was altered, moved from another record or run, or sealed with another key of the same id";
    assert_eq!((info.attempt, info.interrupted), (3, 0));
    let failures: Vec<(u32, loops::FailureSource, Vec<String>)> = rt
        .store()
        .failures("r")
        .await
        .unwrap()
        .into_iter()
        .map(|(_, f)| (f.attempt, f.source, f.errors))
        .collect();
    assert_eq!(
        failures,
        (1..=3)
            .map(|attempt| (
                attempt,
                loops::FailureSource::Handler,
                vec![cause.to_owned()]
            ))
            .collect::<Vec<_>>()
    );
    rt.shutdown().await;
}

/// An event that arrives sealed counts its sealed bytes against the payload limit, not its
/// envelope's base64: 1.8 MB in clear is under the 2 MiB default with a codec too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_that_arrives_sealed_counts_its_sealed_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let rt = gate_waiting(&dir.path().join("store.redb")).await;
    let seal = |text: &str| {
        let json = serde_json::to_string(text).unwrap();
        let sealed = Payloads::new(std::sync::Arc::new(key1()))
            .seal_event("r", "approve", &json)
            .unwrap();
        serde_json::value::RawValue::from_string(sealed).unwrap()
    };
    let over = "x".repeat(2 * 1024 * 1024);
    let Err(Error::PayloadTooLarge { bytes, .. }) =
        rt.send_json("r", "approve", None, &seal(&over)).await
    else {
        panic!("2 MiB of text is over the limit");
    };
    // The text, its two quotes, and the codec's nonce (24 bytes) and tag (16).
    assert_eq!(bytes, over.len() + 2 + 40);
    let approval = "x".repeat(1_800_000);
    rt.send_json("r", "approve", None, &seal(&approval))
        .await
        .unwrap();
    assert_eq!(rt.wait::<Gate>("r").await.unwrap(), Gate::Done { approval });
    rt.shutdown().await;
}

/// A worker whose key has the store's id and other bytes is refused, by the key's check
/// value the store recorded with the id, when its store file opens, or (a store opened
/// elsewhere) at its first read or write: resuming a run says so rather than that a payload
/// was altered, and it never seals what the other workers cannot open. Nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_same_id_and_other_bytes_is_refused_before_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let rt = gate_waiting(&path).await;
    let checks = rt.store().sealing_checks().await.unwrap();
    assert_eq!(checks, [("k1".to_owned(), key1().key_check("k1").unwrap())]);
    rt.shutdown().await;
    drop(rt);

    let other = || Keyring::new("k1", [9; 32]).unwrap();
    assert_ne!(other().key_check("k1"), key1().key_check("k1"));
    let err = open_with(&path, other()).unwrap_err();
    assert!(
        matches!(&err, Error::KeyMismatch { key, .. } if key == "k1"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), mismatch(&path));

    let rt = built_on(&path, other());
    let resumed = rt.resume_all().await.unwrap_err();
    let read = rt.state::<Gate>("r").await.unwrap_err();
    let started = rt.start("r2", Gate::Open { n: 2 }).await.unwrap_err();
    for err in [resumed, read, started] {
        assert_eq!(err.to_string(), mismatch(&path));
    }
    rt.shutdown().await;
    drop(rt);
    let rt = open(&path, Some(key1()));
    assert_eq!(rt.run_info("r2").await.unwrap(), None);
    assert_eq!(
        rt.run_info("r").await.unwrap().unwrap().status,
        RunStatus::Waiting
    );
    rt.shutdown().await;
}

/// A worker whose keyring holds none of the keys a store lists (`k9` on a store sealed with
/// `k1`) is refused: it could open none of the store's payloads, and the key it would
/// record splits the store (what it seals, the other workers cannot open). A rotated
/// keyring that keeps the old key beside the new opens it and records the new key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_holds_none_of_the_stores_keys_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    gate_waiting(&path).await.shutdown().await;
    let k9 = || Keyring::new("k9", [9; 32]).unwrap();
    let refused = format!(
        "store {} holds payloads encrypted with key k1 and none of them is held here: what key `k9` sealed, its workers may not open (give the key file the workers use; after a rotation it holds the old key too)",
        path.display()
    );
    let err = open_with(&path, k9()).unwrap_err();
    assert!(
        matches!(&err, Error::KeyNotInStore { key, keys, .. } if key == "k9" && keys == &["k1"]),
        "{err:?}"
    );
    assert_eq!(err.to_string(), refused);

    let rt = built_on(&path, k9());
    let read = rt.state::<Gate>("r").await.unwrap_err();
    let started = rt.start("r2", Gate::Open { n: 2 }).await.unwrap_err();
    for err in [read, started] {
        assert_eq!(err.to_string(), refused);
    }
    rt.shutdown().await;
    drop(rt);

    let rt = open_with(&path, rotated()).unwrap();
    assert_eq!(rt.store().sealing_keys().await.unwrap(), ["k1"]);
    assert_eq!(rt.run_info("r2").await.unwrap(), None);
    rt.register::<Gate, _>(Approves);
    rt.resume_all().await.unwrap();
    rt.send("r", "approve", &"yes".to_owned()).await.unwrap();
    assert_eq!(
        rt.wait::<Gate>("r").await.unwrap(),
        Gate::Done {
            approval: "yes".into()
        }
    );
    assert_eq!(rt.store().sealing_keys().await.unwrap(), ["k1", "k2"]);
    rt.shutdown().await;
}

/// A keyring that gives no check values (as a codec of a loops before them): its key is
/// recorded without one.
struct NoChecks(Keyring);

impl PayloadCodec for NoChecks {
    fn seal(&self, place: &loops::Place<'_>, plain: &[u8]) -> Result<loops::Sealed, CodecError> {
        self.0.seal(place, plain)
    }

    fn open(
        &self,
        place: &loops::Place<'_>,
        sealed: &loops::Sealed,
    ) -> Result<Vec<u8>, CodecError> {
        self.0.open(place, sealed)
    }

    fn key_id(&self) -> String {
        self.0.key_id()
    }
}

/// A store whose key was recorded without a check value (by a loops before them): the first
/// worker of this version that seals records the check only once its key opens the state
/// of the run it writes to (or, for a run it creates, of another run). One with another key
/// under the id is refused there, and records nothing that would lock the right workers
/// out; the right one records the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_value_is_recorded_only_for_a_key_that_opens_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let rt = Runtime::builder()
        .codec(NoChecks(key1()))
        .open(&path)
        .unwrap();
    rt.register::<Gate, _>(Approves);
    rt.start("r", Gate::Open { n: 1 }).await.unwrap();
    rt.wait_for_status("r", RunStatus::Waiting).await.unwrap();
    assert_eq!(rt.store().sealing_checks().await.unwrap(), []);
    rt.shutdown().await;
    drop(rt);

    let rt = open_with(&path, Keyring::new("k1", [9; 32]).unwrap()).unwrap();
    rt.register::<Gate, _>(Approves);
    let err = rt
        .send("r", "approve", &"wrong".to_owned())
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), mismatch(&path));
    assert_eq!(rt.store().sealing_checks().await.unwrap(), []);
    rt.shutdown().await;
    drop(rt);

    // Nor can it start a run: its first write creates a run with no state to open, so the
    // key is tried on the state of another run sealed with it, before anything is written.
    let rt = open_with(&path, Keyring::new("k1", [9; 32]).unwrap()).unwrap();
    rt.register::<Gate, _>(Approves);
    let err = rt.start("new", Gate::Open { n: 2 }).await.unwrap_err();
    assert_eq!(err.to_string(), mismatch(&path));
    assert_eq!(rt.store().run_info("new").await.unwrap(), None);
    assert_eq!(rt.store().sealing_checks().await.unwrap(), []);
    rt.shutdown().await;
    drop(rt);

    let rt = open_with(&path, key1()).unwrap();
    rt.register::<Gate, _>(Approves);
    rt.resume_all().await.unwrap();
    rt.send("r", "approve", &"right".to_owned()).await.unwrap();
    assert_eq!(
        rt.wait::<Gate>("r").await.unwrap(),
        Gate::Done {
            approval: "right".into()
        }
    );
    assert_eq!(
        rt.store().sealing_checks().await.unwrap(),
        [("k1".to_owned(), key1().key_check("k1").unwrap())]
    );
    rt.shutdown().await;
}
