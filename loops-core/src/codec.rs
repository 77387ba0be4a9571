//! Payloads encrypted at rest: the [`PayloadCodec`] hook, the envelope a sealed payload is
//! stored in, and the place ([`Place`]) a payload is bound to.
//!
//! A codec seals every payload a run stores (states, step outputs, events, failure texts,
//! cancellation and block reasons) before a store sees it, and opens it when it is read back
//! (the runtime does both, in one place: `store/sealing.rs`). What the stores need to work
//! (run ids, workflow, state names, status, seq, times, schema hashes, attempt counts) stays
//! in clear. [`Keyring`] is the ready implementation (XChaCha20-Poly1305).
//!
//! A sealed payload is stored as the JSON object
//! `{"$sealed":{"key":"KEY_ID","data":"BASE64"}}` (a text field holds that object's JSON
//! text), so that a reader without the key can say that it is sealed, and under which key.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

pub use crate::error::CodecError;
use crate::error::RecordKind;

mod keyring;

pub use keyring::{Keyring, KeyringError};

/// Where a payload is stored: the run, the record and the field. A codec binds each payload
/// to its place (as the associated data of an AEAD), so that a payload copied to another
/// record, field or run no longer opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place<'a> {
    /// The run.
    pub run_id: &'a str,
    /// The record: a transition, a step `(name, occurrence)`, a failure, an event (by name),
    /// or the run's row.
    pub record: RecordKind,
    /// The state's seq for transitions, steps and failures; 0 for events (their event seq is
    /// chosen by the store after the payload is sealed) and for the run's row.
    pub seq: u64,
    /// The field within the record (`"payload"`, `"output"`, `"errors"`, `"cancel"`,
    /// `"block"`).
    pub field: &'static str,
}

impl Place<'_> {
    /// The associated data that binds a payload to this place: a version tag, the run id,
    /// the record kind and its name parts, the seq and the field, NUL-separated (run ids and
    /// names hold no NUL: `validate_run_id` and the name rules refuse it).
    pub fn associated_data(&self) -> Vec<u8> {
        let (kind, detail) = match &self.record {
            RecordKind::Transition => ("transition", String::new()),
            RecordKind::RunRow => ("row", String::new()),
            RecordKind::Step { name, occurrence } => ("step", format!("{name}\0{occurrence}")),
            RecordKind::Failure => ("failure", String::new()),
            RecordKind::Event { name } => ("event", name.clone().unwrap_or_default()),
            RecordKind::Wait { event } => ("wait", event.clone()),
        };
        format!(
            "loops-payload-1\0{}\0{kind}\0{detail}\0{}\0{}",
            self.run_id, self.seq, self.field
        )
        .into_bytes()
    }
}

/// A sealed payload: the id of the key that sealed it and the codec's bytes (for
/// [`Keyring`]: the nonce, then the ciphertext and its tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// The key's id, stored in clear next to the payload, so that a reader picks the key
    /// (and a reader without it can say which key it needs).
    pub key: String,
    /// The codec's output.
    pub data: Vec<u8>,
}

/// Seals and opens payloads: the hook a runtime is given with
/// [`RuntimeBuilder::codec`](crate::RuntimeBuilder::codec) (as a Temporal payload codec).
/// [`Keyring`] is the ready implementation; implement this for a key service of your own.
///
/// Both calls are synchronous and on the write path of every record: keep them fast (a
/// local AEAD, not a network round trip per payload; fetch data keys ahead).
pub trait PayloadCodec: Send + Sync + 'static {
    /// Seals `plain` for `place` with the key that writes now.
    ///
    /// # Errors
    /// [`CodecError::Random`] (or another variant) if it cannot seal; the write that
    /// carries the payload then fails and nothing is stored.
    fn seal(&self, place: &Place<'_>, plain: &[u8]) -> Result<Sealed, CodecError>;

    /// Opens `sealed`, read from `place`, and returns the plain bytes.
    ///
    /// # Errors
    /// [`CodecError::UnknownKey`] when the key is not there, [`CodecError::Rejected`]
    /// when the payload does not authenticate for `place` under it (altered, moved, or a
    /// different key under that id), [`CodecError::Malformed`] for damaged data.
    fn open(&self, place: &Place<'_>, sealed: &Sealed) -> Result<Vec<u8>, CodecError>;

    /// The id of the key that seals now, which the runtime records in the store before its
    /// first sealed payload ([`Store::sealing_keys`](crate::Store::sealing_keys)), so that a
    /// runtime or CLI without a key refuses the store at once. The default, `"codec"`, is for
    /// a codec without key ids; [`Keyring`] returns its writing key's id.
    fn key_id(&self) -> String {
        "codec".to_owned()
    }

    /// The ids of every key the codec opens with, the writing key first: what a writer that
    /// [seals as the store does](crate::RuntimeBuilder::seal_as_store_does) may accept
    /// payloads sealed under. The default is the writing key alone; [`Keyring`] lists its
    /// reading keys too.
    fn key_ids(&self) -> Vec<String> {
        vec![self.key_id()]
    }

    /// A check value of the codec's key `key` (one of [`key_ids`](Self::key_ids)): the same
    /// text for the same key bytes, another for other bytes under the same id, and nothing
    /// that helps recover the key. Recorded in the store with the key's id
    /// ([`Store::sealing_checks`](crate::Store::sealing_checks)), so that a key of the same
    /// id and other bytes is refused before it seals what no other worker opens. The
    /// default, `None`, records and checks nothing; [`Keyring`] returns the tag of an empty
    /// message sealed for the id under a fixed nonce.
    fn key_check(&self, key: &str) -> Option<String> {
        let _ = key;
        None
    }
}

/// The key of the envelope object (`$sealed`, as `Envelope` names its field) as a JSON
/// string: an envelope's text starts with it after its `{`.
const QUOTED_TAG: &str = "\"$sealed\"";

#[derive(Serialize, Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "$sealed", borrow)]
    sealed: Inner<'a>,
}

#[derive(Serialize, Deserialize)]
struct Inner<'a> {
    key: std::borrow::Cow<'a, str>,
    data: std::borrow::Cow<'a, str>,
}

/// The envelope JSON of `sealed`: `{"$sealed":{"key":"KEY_ID","data":"BASE64"}}`.
pub fn envelope(sealed: &Sealed) -> String {
    let data = base64::engine::general_purpose::STANDARD.encode(&sealed.data);
    let env = Envelope {
        sealed: Inner {
            key: sealed.key.as_str().into(),
            data: data.into(),
        },
    };
    // Two strings: serializing cannot fail.
    serde_json::to_string(&env).unwrap_or_default()
}

/// Whether `json` (a JSON value's text, or a text field) is a sealed envelope: `Some` with
/// its parts (or the reason it is damaged), `None` for a payload in clear.
///
/// A value is taken for an envelope when it is a JSON object whose first key is `"$sealed"`;
/// anything else is a payload in clear (written before a codec was given, or a text loops
/// wrote itself, such as [`INTERRUPTED`](crate::INTERRUPTED)).
pub fn parse_envelope(json: &str) -> Option<Result<Sealed, CodecError>> {
    let trimmed = json.trim_start();
    let rest = trimmed.strip_prefix('{')?.trim_start();
    if !rest.starts_with(QUOTED_TAG) {
        return None;
    }
    let parsed = serde_json::from_str::<Envelope<'_>>(trimmed)
        .map_err(|e| CodecError::Malformed {
            reason: e.to_string(),
        })
        .and_then(|env| {
            let data = base64::engine::general_purpose::STANDARD
                .decode(env.sealed.data.as_bytes())
                .map_err(|e| CodecError::Malformed {
                    reason: format!("its data is not base64: {e}"),
                })?;
            Ok(Sealed {
                key: env.sealed.key.into_owned(),
                data,
            })
        });
    Some(parsed)
}

/// What a reader without the key shows for a sealed payload: `<encrypted: key KEY_ID>`.
pub fn redacted(key: &str) -> String {
    format!("<encrypted: key {key}>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_clear_payloads_are_not_envelopes() {
        let sealed = Sealed {
            key: "k1".to_owned(),
            data: vec![1, 2, 3, 250],
        };
        let text = envelope(&sealed);
        assert_eq!(text, r#"{"$sealed":{"key":"k1","data":"AQID+g=="}}"#);
        assert_eq!(parse_envelope(&text), Some(Ok(sealed)));
        assert_eq!(parse_envelope(r#"{"Received":{"n":1}}"#), None);
        assert_eq!(parse_envelope(r#""$sealed""#), None);
        assert_eq!(parse_envelope("the process stopped"), None);
        assert!(matches!(
            parse_envelope(r#"{"$sealed":{"key":"k1","data":"!!"}}"#),
            Some(Err(CodecError::Malformed { .. }))
        ));
    }

    #[test]
    fn places_differ_in_their_associated_data() {
        let place = |run_id, record, seq, field| {
            Place {
                run_id,
                record,
                seq,
                field,
            }
            .associated_data()
        };
        let a = place("r", RecordKind::Transition, 1, "payload");
        assert_ne!(a, place("r", RecordKind::Transition, 2, "payload"));
        assert_ne!(a, place("s", RecordKind::Transition, 1, "payload"));
        assert_ne!(a, place("r", RecordKind::Failure, 1, "payload"));
        assert_ne!(
            place(
                "r",
                RecordKind::Step {
                    name: "a".into(),
                    occurrence: 0
                },
                1,
                "output"
            ),
            place(
                "r",
                RecordKind::Step {
                    name: "a".into(),
                    occurrence: 1
                },
                1,
                "output"
            )
        );
    }
}
