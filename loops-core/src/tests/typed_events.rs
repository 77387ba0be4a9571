//! An event's declared type's own checks run at the send: a payload of the declared shape
//! that the type refuses (`#[serde(try_from = ..)]`) is refused by `Runtime::send_json`
//! where the runtime registers the run's version, nothing written; without the version
//! registered, the shape alone is checked and the run's wait sets such a payload aside.

use loops_derive::{Schema, Workflow};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::temp_store;
use crate::*;

/// Waits for a sign-off, and ends with its signer.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "signed", crate = crate)]
#[event(sign: SignOff)]
enum Signed {
    #[initial]
    #[next(Done)]
    Ask,
    #[terminal]
    Done { by: String },
}

struct Signer;

impl SignedHandler for Signer {
    type Error = Error;
    async fn ask(&self, ctx: &Context) -> Result<AskNext> {
        let sign_off = ctx.wait_for(Signed::SIGN).await?;
        Ok(AskNext::Done { by: sign_off.by })
    }
}

/// A sign-off: who signed, never blank (its `Deserialize` checks).
#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[schema(crate = crate)]
#[serde(try_from = "SignOffFields")]
struct SignOff {
    by: String,
}

/// [`SignOff`] as it is sent, before its check.
#[derive(Schema, Deserialize)]
#[schema(crate = crate)]
struct SignOffFields {
    by: String,
}

impl TryFrom<SignOffFields> for SignOff {
    type Error = String;

    fn try_from(fields: SignOffFields) -> std::result::Result<SignOff, String> {
        if fields.by.trim().is_empty() {
            return Err("\"by\" is blank: a sign-off names who signed".to_owned());
        }
        Ok(SignOff { by: fields.by })
    }
}

fn raw(text: &str) -> Box<RawValue> {
    serde_json::from_str(text).unwrap()
}

/// `builder` with [`Signed`] registered, opened at `path`, with the run `s` waiting in `Ask`.
fn signing(builder: RuntimeBuilder, path: &std::path::Path) -> Runtime {
    let rt = builder.register::<Signed, _>(Signer).open(path).unwrap();
    rt.redb()
        .unwrap()
        .__seed_history([("s".to_owned(), Signed::Ask)])
        .unwrap();
    rt
}

/// What a send to `s` of a sign-off that names no one is refused with.
const BLANK_REFUSED: &str = "run `s` (state `Ask`, seq 0): event `sign` refused: event \
                             `sign`'s payload type refuses the payload: \"by\" is blank: a \
                             sign-off names who signed";

#[tokio::test]
async fn a_payload_its_type_refuses_is_refused_at_the_send_where_the_version_is_registered() {
    let (_dir, path) = temp_store();
    let rt = signing(Runtime::builder(), &path);
    // `Workflow::read_event`, as the derive implements it.
    assert_eq!(Signed::read_event("sign", r#"{"by":"ann"}"#), Some(Ok(())));
    assert_eq!(Signed::read_event("other", r#"{"by":"ann"}"#), None);

    let err = rt
        .send_json("s", "sign", None, &raw(r#"{"by":" "}"#))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), BLANK_REFUSED);
    let Error::EventRefused { refusal, .. } = err else {
        panic!("expected EventRefused, got {err:?}");
    };
    assert!(
        matches!(&*refusal, EventRefusal::Refused { event, .. } if event == "sign"),
        "{refusal:?}"
    );
    // Nothing was written; a good one is taken and ends the run.
    assert!(rt.store().events("s").await.unwrap().is_empty());
    rt.send_json("s", "sign", None, &raw(r#"{"by":"ann"}"#))
        .await
        .unwrap();
    let done = rt.run("s", Signed::Ask, &Signer).await.unwrap();
    assert_eq!(done, Signed::Done { by: "ann".into() });
    // An ended run takes no event: that is what a sender hears, whatever the payload (one of
    // the wrong shape, one its type refuses, a good one).
    for payload in [r#"{"by":3}"#, r#"{"by":" "}"#, r#"{"by":"ann"}"#] {
        let err = rt
            .send_json("s", "sign", None, &raw(payload))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::RunEnded { run_id, status: RunStatus::Completed, .. } if run_id == "s"),
            "{payload}: {err:?}"
        );
    }
    assert_eq!(rt.store().events("s").await.unwrap().len(), 1);
}

#[tokio::test]
async fn without_the_version_registered_the_shape_is_checked_and_the_wait_sets_it_aside() {
    let (_dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    rt.redb()
        .unwrap()
        .__seed_history([("s".to_owned(), Signed::Ask)])
        .unwrap();
    // Of the declared shape: taken, as this runtime does not know the type.
    rt.send_json("s", "sign", None, &raw(r#"{"by":""}"#))
        .await
        .unwrap();
    rt.send_json("s", "sign", None, &raw(r#"{"by":"bo"}"#))
        .await
        .unwrap();
    drop(rt);
    // The run's wait sets the blank one aside and takes the next.
    let rt = Runtime::open(&path).unwrap();
    let done = rt.run("s", Signed::Ask, &Signer).await.unwrap();
    assert_eq!(done, Signed::Done { by: "bo".into() });
    // The blank one, set aside: recorded as a failure of the wait, for inspection.
    let set_aside: Vec<Vec<String>> = rt
        .store()
        .failures("s")
        .await
        .unwrap()
        .into_iter()
        .filter(|(_, f)| matches!(&f.source, FailureSource::Step { name, .. } if name == "loops:wait:sign"))
        .map(|(_, f)| f.errors)
        .collect();
    assert_eq!(
        set_aside,
        [[
            "run `s`: event `sign` (event seq 0) delivered to state `Ask` (seq 0) does not \
             decode as the requested type",
            "\"by\" is blank: a sign-off names who signed"
        ]]
    );
}

#[tokio::test]
async fn a_run_driven_by_run_has_its_events_read_as_their_type_too() {
    let (_dir, path) = temp_store();
    let rt = Runtime::open(&path).unwrap();
    // Driven by `Runtime::run`, with no registration: it parks at its wait.
    let driving = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.run("s", Signed::Ask, &Signer).await })
    };
    while rt
        .run_info("s")
        .await
        .unwrap()
        .is_none_or(|info| info.status != RunStatus::Waiting)
    {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let err = rt
        .send_json("s", "sign", None, &raw(r#"{"by":""}"#))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::EventRefused { refusal, .. } if matches!(**refusal, EventRefusal::Refused { .. })),
        "{err:?}"
    );
    rt.send_json("s", "sign", None, &raw(r#"{"by":"cy"}"#))
        .await
        .unwrap();
    let done = driving.await.unwrap().unwrap();
    assert_eq!(done, Signed::Done { by: "cy".into() });
}

/// A payload that arrives sealed (the `loops` CLI with a key file seals it, checking it
/// against the stored schema only, and sends it through a serving process's endpoint) is
/// opened with the runtime's codec and checked as one in clear is: its shape and its type's
/// own checks refuse it at the send, nothing written (helper-121: it was stored, and the
/// run's wait set it aside, while the sender was told the run took it).
#[tokio::test]
async fn a_sealed_payload_is_checked_as_one_in_clear() {
    let (_dir, path) = temp_store();
    let keyring = Keyring::new("k1", [7; 32]).unwrap();
    let rt = signing(Runtime::builder().codec(keyring.clone()), &path);
    // Sealed as the CLI seals: with the same keys, following the store.
    let cli = Payloads::following(std::sync::Arc::new(keyring));
    let sealed = |payload: &str| raw(&cli.seal_event("s", "sign", payload).unwrap());
    assert!(sealed(r#"{"by":" "}"#).get().contains("$sealed"));

    let err = rt
        .send_json("s", "sign", None, &sealed(r#"{"by":" "}"#))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), BLANK_REFUSED);
    let err = rt
        .send_json("s", "sign", None, &sealed(r#"{"by":3}"#))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::EventRefused { refusal, .. }
            if !matches!(&**refusal, EventRefusal::Refused { .. })),
        "the shape refuses it: {err:?}"
    );
    assert!(rt.store().events("s").await.unwrap().is_empty());

    rt.send_json("s", "sign", None, &sealed(r#"{"by":"ann"}"#))
        .await
        .unwrap();
    let stored = rt.sealed_store().events("s").await.unwrap();
    assert_eq!(stored.len(), 1);
    assert!(stored[0].1.payload.get().contains("$sealed"), "kept sealed");
    let done = rt.run("s", Signed::Ask, &Signer).await.unwrap();
    assert_eq!(done, Signed::Done { by: "ann".into() });
}

/// A sealed payload a runtime cannot open (no codec: here one that shows sealed payloads as
/// `<encrypted: key K>`) is not checked as that stand-in text: the store refuses it as a
/// payload that arrived sealed and cannot be read back, nothing written.
#[tokio::test]
async fn a_sealed_payload_the_runtime_cannot_open_is_refused_as_such() {
    let (_dir, path) = temp_store();
    let rt = signing(Runtime::builder().read_sealed_redacted(), &path);
    let sealer = Payloads::new(std::sync::Arc::new(Keyring::new("k1", [7; 32]).unwrap()));
    let sealed = raw(&sealer.seal_event("s", "sign", r#"{"by":"ann"}"#).unwrap());
    let err = rt.send_json("s", "sign", None, &sealed).await.unwrap_err();
    assert!(matches!(err, Error::SealedRefused { .. }), "{err:?}");
    assert!(rt.store().events("s").await.unwrap().is_empty());
}
