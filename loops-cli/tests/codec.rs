//! The `loops` binary on a store whose payloads are encrypted (`RuntimeBuilder::codec`):
//! with `--key-file` (or `LOOPS_KEY_FILE`) it shows them decrypted, without it it says which
//! key each needs and never prints ciphertext, and `send` encrypts the event it stores (or,
//! without the key, refuses to store it in clear).

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use loops_core::{BoxError, Context, Keyring, PayloadCodec, RetryPolicy, RunStatus, Runtime};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the CLI says to do when a store is encrypted and no key file was given.
const NO_KEY_HINT: &str = "give the key file with --key-file PATH (or LOOPS_KEY_FILE)";

const SECRET: &str = "secret-token=hunter2";
const KEY: &str = "k1 0707070707070707070707070707070707070707070707070707070707070707\n";

#[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = loops_core)]
#[event(approve: String)]
enum Vault {
    #[initial]
    #[next(Done)]
    Open { token: String },
    #[terminal]
    Done { approval: String },
}

struct Worker;

impl VaultHandler for Worker {
    type Error = BoxError;

    async fn open(&self, ctx: &Context, token: String) -> Result<OpenNext, BoxError> {
        let _: String = ctx
            .step("call", || async { Ok(format!("output {SECRET}")) })
            .await?;
        if ctx.attempt() == 1 {
            return Err(format!("refused {token}").into());
        }
        let approval: String = ctx.wait_for("approve").await?;
        Ok(OpenNext::Done { approval })
    }
}

/// A store with run `v` waiting for `approve` in `Open`, after one failed attempt; and the
/// key file (mode 0600).
fn encrypted_store() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let keys = key_file(dir.path(), "keys", KEY);
    waiting_store(&path, Some(Keyring::from_file(&keys).unwrap()), &["v"]);
    (dir, path, keys)
}

/// Runs `runs` of `Vault` (token [`SECRET`]) in the store at `path`, sealed with `keys` if
/// given, each waiting for `approve` in `Open` after one failed attempt.
fn waiting_store<C: PayloadCodec>(path: &Path, keys: Option<C>, runs: &[&str]) {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut builder = Runtime::builder().retry(RetryPolicy::attempts(3).with_delays(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(2),
        ));
        if let Some(keys) = keys {
            builder = builder.codec(keys);
        }
        let rt = builder.open(path).unwrap();
        rt.register::<Vault, _>(Worker);
        for run in runs {
            let token = SECRET.to_owned();
            rt.start(run, Vault::Open { token }).await.unwrap();
        }
        for run in runs {
            rt.wait_for_status(run, RunStatus::Waiting).await.unwrap();
        }
        rt.shutdown().await;
    });
}

fn loops(path: &Path) -> Command {
    let mut cmd = Command::cargo_bin("loops").unwrap();
    cmd.env("LOOPS_STORE", path)
        .env("NO_COLOR", "1")
        .env_remove("LOOPS_KEY_FILE");
    cmd
}

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn contains(bytes: &[u8], needle: &[u8]) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn the_cli_decrypts_with_the_key_and_says_encrypted_without_it() {
    let (_dir, path, keys) = encrypted_store();
    assert!(!contains(&std::fs::read(&path).unwrap(), b"hunter2"));

    // Without the key: every payload is named as encrypted, with its key id; no ciphertext.
    let (ok, out, err) = run(loops(&path).args(["history", "v", "--json"]));
    assert!(ok, "{err}");
    assert!(
        !out.contains("hunter2") && !out.contains("$sealed"),
        "{out}"
    );
    assert!(out.contains("<encrypted: key k1>"), "{out}");
    let (ok, out, err) = run(loops(&path).args(["show", "v"]));
    assert!(ok, "{err}");
    assert!(
        out.contains("<encrypted: key k1>") && !out.contains("hunter2"),
        "{out}"
    );

    // With the key (flag or environment): the payloads in clear.
    let (ok, out, err) = run(loops(&path)
        .args(["history", "v", "--json", "--key-file"])
        .arg(&keys));
    assert!(ok, "{err}");
    let history: Value = serde_json::from_str(&out).unwrap();
    let text = history.to_string();
    assert!(text.contains(&format!("refused {SECRET}")), "{text}");
    assert!(text.contains(&format!("output {SECRET}")), "{text}");
    assert!(!text.contains("<encrypted"), "{text}");
    let (ok, out, _) = run(loops(&path)
        .env("LOOPS_KEY_FILE", &keys)
        .args(["show", "v"]));
    assert!(ok && out.contains(SECRET), "{out}");

    // `send` without the key refuses to store the event in clear, and writes nothing.
    // The store says it is sealed, and what to pass.
    let out = loops(&path)
        .args(["send", "v", "approve", "--json", "\"ok\""])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "error: store {} holds payloads encrypted with key k1: {}",
            path.display(),
            NO_KEY_HINT
        )
    );
    // With the key, the declared event's shape is checked in clear before it is sealed: a
    // payload that cannot be a `String` is refused (exit 2) and nothing is written (had it
    // been queued, the run's wait below would take it first, oldest first, and not finish
    // with the approval sent after it).
    let wrong = loops(&path)
        .args(["send", "v", "approve", "--json", "{\"by\":1}", "--key-file"])
        .arg(&keys)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(2), "{err}");
    assert!(err.contains("event `approve` refused"), "{err}");
    // A right one is encrypted: the file holds no trace of it in clear, and the run (whose
    // process checks only the sealed payload's name) takes it.
    let approval = format!("\"approved {SECRET}\"");
    let (ok, _, err) = run(loops(&path)
        .args(["send", "v", "approve", "--json", &approval, "--key-file"])
        .arg(&keys));
    assert!(ok, "{err}");
    assert!(!contains(&std::fs::read(&path).unwrap(), b"hunter2"));

    // The run finishes with the event the CLI sealed.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let rt = Runtime::builder()
            .codec(Keyring::from_file(&keys).unwrap())
            .open(&path)
            .unwrap();
        rt.register::<Vault, _>(Worker);
        rt.resume_all().await.unwrap();
        assert_eq!(
            rt.wait::<Vault>("v").await.unwrap(),
            Vault::Done {
                approval: format!("approved {SECRET}")
            }
        );
        rt.shutdown().await;
    });
    assert!(!contains(&std::fs::read(&path).unwrap(), b"hunter2"));

    // A key file others can read is refused.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (ok, _, err) = run(loops(&path).args(["runs", "--key-file"]).arg(&keys));
        assert!(!ok);
        assert!(err.contains("must be readable by its owner only"), "{err}");
    }
}

#[test]
fn a_running_process_serves_payloads_sealed_and_the_cli_opens_them_with_its_key() {
    let (_dir, path, keys) = encrypted_store();
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (rt, server) = tokio.block_on(async {
        let rt = Runtime::builder()
            .codec(Keyring::from_file(&keys).unwrap())
            .open(&path)
            .unwrap();
        rt.register::<Vault, _>(Worker);
        rt.resume_all().await.unwrap();
        let server = rt.serve_control_next_to_store().await.unwrap();
        (rt, server)
    });
    // The process has the key, yet serves nothing in clear to a CLI without it.
    let (ok, out, err) = run(loops(&path).args(["history", "v", "--json", "--verbose"]));
    assert!(ok, "{err}");
    assert!(err.contains("through the control endpoint"), "{err}");
    assert!(
        !out.contains("hunter2") && out.contains("<encrypted: key k1>"),
        "{out}"
    );
    let (ok, out, err) = run(loops(&path).args(["runs", "--json"]));
    assert!(ok && !out.contains("hunter2"), "{out} {err}");
    // Without its key, the CLI refuses to send through the process in clear, with the one
    // message a CLI that opens the store says.
    let out = loops(&path)
        .args(["send", "v", "approve", "--json", "\"in clear\""])
        .output()
        .unwrap();
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        ),
        (
            Some(1),
            format!(
                "error: store {} holds payloads encrypted with key k1: {}",
                path.display(),
                NO_KEY_HINT
            )
            .as_str()
        )
    );
    // With its key, the CLI opens them.
    let (ok, out, err) = run(loops(&path)
        .args(["history", "v", "--json", "--key-file"])
        .arg(&keys));
    assert!(ok, "{err}");
    assert!(out.contains(&format!("refused {SECRET}")), "{out}");
    // An event sent through the process, sealed by the CLI: the run finishes with it.
    let approval = format!("\"via the endpoint {SECRET}\"");
    let (ok, _, err) = run(loops(&path)
        .args(["send", "v", "approve", "--json", &approval, "--key-file"])
        .arg(&keys));
    assert!(ok, "{err}");
    let done = tokio.block_on(async {
        let done = rt.wait::<Vault>("v").await.unwrap();
        server.stop().await;
        rt.shutdown().await;
        done
    });
    assert_eq!(
        done,
        Vault::Done {
            approval: format!("via the endpoint {SECRET}")
        }
    );
    drop(rt);
    assert!(!contains(&std::fs::read(&path).unwrap(), b"hunter2"));
}

/// A key file `name` in `dir` holding `text` (mode 0600).
fn key_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let keys = dir.join(name);
    std::fs::write(&keys, text).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    keys
}

#[test]
fn a_key_file_never_seals_into_a_store_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clear.redb");
    waiting_store(&path, None::<Keyring>, &["v", "w", "x"]);
    let keys = key_file(dir.path(), "keys", KEY);
    // On the file: the event is stored in clear, and no key is recorded in the store.
    let (ok, _, err) = run(loops(&path)
        .args([
            "send",
            "w",
            "approve",
            "--json",
            "\"on the file\"",
            "--key-file",
        ])
        .arg(&keys));
    assert!(ok, "{err}");
    // Through the endpoint of a process without a codec: the same.
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (rt, server) = tokio.block_on(async {
        let rt = Runtime::builder().open(&path).unwrap();
        rt.register::<Vault, _>(Worker);
        rt.resume_all().await.unwrap();
        let server = rt.serve_control_next_to_store().await.unwrap();
        (rt, server)
    });
    let (ok, _, err) = run(loops(&path)
        .args(["send", "v", "approve", "--json", "\"via the endpoint\""])
        .arg("--key-file")
        .arg(&keys)
        .arg("--verbose"));
    assert!(ok && err.contains("through the control endpoint"), "{err}");
    let (v, w, keys_recorded) = tokio.block_on(async {
        let v = rt.wait::<Vault>("v").await.unwrap();
        let w = rt.wait::<Vault>("w").await.unwrap();
        let keys = rt.store().sealing_keys().await.unwrap();
        server.stop().await;
        rt.shutdown().await;
        (v, w, keys)
    });
    assert_eq!(
        (v, w, keys_recorded),
        (
            Vault::Done {
                approval: "via the endpoint".into()
            },
            Vault::Done {
                approval: "on the file".into()
            },
            Vec::<String>::new()
        )
    );
    drop(rt);
    // A cancellation reason given with the key file is in clear too, and a runtime without
    // a codec still opens the store.
    let (ok, _, err) = run(loops(&path)
        .args([
            "cancel",
            "x",
            "--reason",
            "stuck since Tuesday",
            "--key-file",
        ])
        .arg(&keys));
    assert!(ok, "{err}");
    let bytes = std::fs::read(&path).unwrap();
    for clear in [
        &b"via the endpoint"[..],
        b"on the file",
        b"stuck since Tuesday",
    ] {
        assert!(
            contains(&bytes, clear),
            "{}",
            String::from_utf8_lossy(clear)
        );
    }
    let rt = Runtime::builder().open(&path).unwrap();
    let keys = tokio.block_on(rt.store().sealing_keys()).unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}

/// A keyring that gives no check values (as a codec of a loops before them, or one of
/// your own): its keys are recorded without one.
struct NoChecks(Keyring);

impl PayloadCodec for NoChecks {
    fn seal(
        &self,
        place: &loops_core::Place<'_>,
        plain: &[u8],
    ) -> Result<loops_core::Sealed, loops_core::CodecError> {
        self.0.seal(place, plain)
    }

    fn open(
        &self,
        place: &loops_core::Place<'_>,
        sealed: &loops_core::Sealed,
    ) -> Result<Vec<u8>, loops_core::CodecError> {
        self.0.open(place, sealed)
    }

    fn key_id(&self) -> String {
        self.0.key_id()
    }
}

/// A store whose key has no recorded check value: a key file of the right id and other
/// bytes is found out by opening a state sealed with the key, and refused.
#[test]
fn without_a_recorded_check_a_wrong_key_file_is_found_out_on_a_sealed_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    waiting_store(&path, None::<Keyring>, &["clear"]);
    waiting_store(
        &path,
        Some(NoChecks(Keyring::parse(KEY).unwrap())),
        &["sealed"],
    );
    let other_bytes = key_file(dir.path(), "other-bytes", OTHER_BYTES);
    assert_eq!(
        refused_send(&path, "clear", &other_bytes),
        (Some(2), format!("{}\n", other_bytes_refusal("sealed")))
    );
}

/// A key of id `k1` and other bytes than [`KEY`]'s.
const OTHER_BYTES: &str = "k1 0909090909090909090909090909090909090909090909090909090909090909\n";

/// `loops send RUN approve "x" --key-file KEYS`, expected to fail: its exit code and stderr.
fn refused_send(path: &Path, run_id: &str, keys: &Path) -> (Option<i32>, String) {
    let out = loops(path)
        .args(["send", run_id, "approve", "--json", "\"x\"", "--key-file"])
        .arg(keys)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8(out.stderr).unwrap())
}

/// The refusal of a key file whose `k1` is not the workers' `k1`, found by opening run
/// `sealed`'s state.
fn other_bytes_refusal(sealed: &str) -> String {
    format!(
        "error: the event is not sent: the key file's key `k1` does not open what the store holds sealed with `k1` (run `{sealed}`: the payload of the transition record at seq 0 cannot be opened: it does not authenticate under key `k1`: the payload was altered, moved from another record or run, or sealed with another key of the same id), so no worker could open what it seals; give the key file the workers use"
    )
}

/// A run stored in clear before the store was encrypted, every run sealed with the key
/// pruned since: a key file of the right id and other bytes is still refused, by the key's
/// check value that the store recorded with it.
#[test]
fn a_wrong_key_file_is_refused_for_a_run_in_clear_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    waiting_store(&path, None::<Keyring>, &["clear"]);
    let keys = key_file(dir.path(), "keys", KEY);
    waiting_store(&path, Some(Keyring::parse(KEY).unwrap()), &["sealed"]);
    for args in [
        &["cancel", "sealed", "--key-file"][..],
        &["prune", "--keep-last", "0", "--key-file"],
    ] {
        let (ok, _, err) = run(loops(&path).args(args).arg(&keys));
        assert!(ok, "{args:?}: {err}");
    }
    let (ok, out, err) = run(loops(&path).args(["runs", "--json"]));
    assert!(ok && !out.contains("\"sealed\""), "{out} {err}");
    let other_bytes = key_file(dir.path(), "other-bytes", OTHER_BYTES);
    assert_eq!(
        refused_send(&path, "clear", &other_bytes),
        (
            Some(2),
            format!(
                "error: store {}: key `k1` is not the key `k1` its payloads were sealed with (another key under the same id): give the runtime the key the workers use\n",
                path.display()
            )
        )
    );
    let (ok, out, err) = run(loops(&path).args(["show", "clear", "--json"]));
    assert!(ok, "{err}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["pending_events"], serde_json::json!([]));
}

#[test]
fn a_key_file_the_workers_do_not_use_seals_nothing() {
    let (dir, path, _) = encrypted_store();
    let other_id = key_file(
        dir.path(),
        "other-id",
        "k2 0808080808080808080808080808080808080808080808080808080808080808\n",
    );
    let other_bytes = key_file(dir.path(), "other-bytes", OTHER_BYTES);
    let refusal = |keys: &Path| {
        let (code, stderr) = refused_send(&path, "v", keys);
        (code, stderr.trim_end().to_owned())
    };
    let other_id_refused = (
        Some(2),
        format!(
            "error: store {} holds payloads encrypted with key k1 and none of them is held here: what key `k2` sealed, its workers may not open (give the key file the workers use; after a rotation it holds the old key too)",
            path.display()
        ),
    );
    // On the file and through a control endpoint alike, by the key's recorded check value.
    let other_bytes_refused = (
        Some(2),
        format!(
            "error: store {}: key `k1` is not the key `k1` its payloads were sealed with (another key under the same id): give the runtime the key the workers use",
            path.display()
        ),
    );
    assert_eq!(refusal(&other_id), other_id_refused);
    assert_eq!(refusal(&other_bytes), other_bytes_refused);
    // Read with such a key file, each payload it cannot open says why, and the rest reads.
    let (ok, out, err) = run(loops(&path)
        .args(["history", "v", "--json", "--key-file"])
        .arg(&other_id));
    assert!(ok, "{err}");
    let history: Value = serde_json::from_str(&out).unwrap();
    let transitions = history["transitions"].as_array().unwrap();
    assert_eq!(
        (transitions.len(), &transitions[0]["payload"]),
        (
            1,
            &Value::from(
                "<cannot open: it is encrypted with key `k1`, which is not in the keyring (it has k2)>"
            )
        )
    );
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (rt, server) = tokio.block_on(async {
        let rt = Runtime::builder()
            .codec(Keyring::parse(KEY).unwrap())
            .open(&path)
            .unwrap();
        rt.register::<Vault, _>(Worker);
        rt.resume_all().await.unwrap();
        let server = rt.serve_control_next_to_store().await.unwrap();
        (rt, server)
    });
    assert_eq!(refusal(&other_id), other_id_refused);
    assert_eq!(refusal(&other_bytes), other_bytes_refused);
    let (events, keys) = tokio.block_on(async {
        let events = rt.store().events("v").await.unwrap();
        let keys = rt.store().sealing_keys().await.unwrap();
        server.stop().await;
        rt.shutdown().await;
        (events.len(), keys)
    });
    assert_eq!((events, keys), (0, vec!["k1".to_owned()]));
}

/// After a rotation that no worker has sealed under yet (the store lists `k1`; the key file
/// writes with `k2` and reads `k1`), `send` seals with `k1`, the key the workers seal with
/// now: the worker, which holds `k1` alone, takes the event and finishes the run.
#[test]
fn a_rotated_key_file_seals_with_the_key_the_store_lists() {
    let (dir, path, _) = encrypted_store();
    let rotated = key_file(
        dir.path(),
        "rotated",
        &format!("k2 0808080808080808080808080808080808080808080808080808080808080808\n{KEY}"),
    );
    let (ok, _, err) = run(loops(&path)
        .args(["send", "v", "approve", "--json", "\"after the rotation\""])
        .arg("--key-file")
        .arg(&rotated));
    assert!(ok, "{err}");
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (done, keys, sealed_with) = tokio.block_on(async {
        let rt = Runtime::builder()
            .codec(Keyring::parse(KEY).unwrap())
            .open(&path)
            .unwrap();
        rt.register::<Vault, _>(Worker);
        rt.resume_all().await.unwrap();
        let done = rt.wait::<Vault>("v").await.unwrap();
        let events = rt.sealed_store().events("v").await.unwrap();
        let sealed_with: Vec<String> = events
            .iter()
            .filter_map(|(_, e, _)| loops_core::parse_envelope(e.payload.get()))
            .map(|sealed| sealed.unwrap().key)
            .collect();
        let keys = rt.store().sealing_keys().await.unwrap();
        rt.shutdown().await;
        (done, keys, sealed_with)
    });
    assert_eq!(
        (done, keys, sealed_with),
        (
            Vault::Done {
                approval: "after the rotation".into()
            },
            vec!["k1".to_owned()],
            vec!["k1".to_owned()]
        )
    );
}

/// `loops check --key-file` checks the key file as a worker's keys are checked: the right
/// one is said to hold the store's keys (or some of them), one with another key under the
/// id or none of the store's keys is refused with the worker's error (exit 2).
#[test]
fn check_with_a_key_file_says_whether_it_holds_the_stores_keys() {
    let (dir, path, keys) = encrypted_store();
    let second_line = |keys: &Path| {
        let (ok, out, err) = run(loops(&path).args(["check", "--key-file"]).arg(keys));
        assert!(ok, "{err}");
        out.lines().nth(1).unwrap().to_owned()
    };
    assert_eq!(
        second_line(&keys),
        "key file: holds every key the store's payloads were sealed with (k1)"
    );
    let other_bytes = key_file(dir.path(), "other-bytes", OTHER_BYTES);
    let other_id = key_file(
        dir.path(),
        "other-id",
        "k2 0808080808080808080808080808080808080808080808080808080808080808\n",
    );
    for (keys, wanted) in [
        (
            &other_bytes,
            format!(
                "error: store {}: key `k1` is not the key `k1` its payloads were sealed with (another key under the same id): give the runtime the key the workers use\n",
                path.display()
            ),
        ),
        (
            &other_id,
            format!(
                "error: store {} holds payloads encrypted with key k1 and none of them is held here: what key `k2` sealed, its workers may not open (give the key file the workers use; after a rotation it holds the old key too)\n",
                path.display()
            ),
        ),
    ] {
        let out = loops(&path)
            .args(["check", "--key-file"])
            .arg(keys)
            .output()
            .unwrap();
        assert_eq!(
            (out.status.code(), String::from_utf8(out.stderr).unwrap()),
            (Some(2), wanted)
        );
    }
    // After a rotation to k2, the old key file holds one of the two keys.
    let rotated = Keyring::parse(&format!("k2 {}\n{KEY}", "08".repeat(32))).unwrap();
    waiting_store(&path, Some(rotated), &["w"]);
    assert_eq!(
        second_line(&keys),
        "key file: holds key k1 of those the store's payloads were sealed with (k1, k2): payloads sealed with the others do not open"
    );
}

/// Every command that reads through the store checks the key file's keys against the
/// check values the store recorded, before it reads: one with another key under the id is
/// refused with the worker's error (exit 2) and prints nothing, instead of every payload
/// reading as altered.
#[test]
fn a_key_file_with_other_bytes_under_the_id_is_refused_before_a_read() {
    let (dir, path, keys) = encrypted_store();
    let other_bytes = key_file(dir.path(), "other-bytes", OTHER_BYTES);
    let wanted = format!(
        "error: store {}: key `k1` is not the key `k1` its payloads were sealed with (another key under the same id): give the runtime the key the workers use\n",
        path.display()
    );
    for args in [
        &["runs"][..],
        &["show", "v"],
        &["history", "v"],
        &["tree", "v"],
    ] {
        let (ok, out, err) = run(loops(&path).arg("--key-file").arg(&keys).args(args));
        assert!(ok, "{args:?}: {err}");
        assert!(out.contains('v'), "{args:?}: {out}");
        let out = loops(&path)
            .arg("--key-file")
            .arg(&other_bytes)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(
            (
                out.status.code(),
                String::from_utf8(out.stdout).unwrap(),
                String::from_utf8(out.stderr).unwrap()
            ),
            (Some(2), String::new(), wanted.clone()),
            "{args:?}"
        );
    }
}
