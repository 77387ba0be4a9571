//! The on-disk record format: what one transition, one step and one failed attempt store.
//!
//! Every record is a JSON object (serde_json), so that a store can be read without the
//! workflow's Rust types (by the `loops` CLI, by `jq` over its output, by a human). The state
//! or step output is embedded as raw JSON, encoded once by the caller and never re-parsed on
//! the write path. See `docs/design.md` for the key layout.

pub(crate) mod wait;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::{Error, RecordKind, Result};
use crate::schema::SchemaHash;
use crate::workflow::{StateId, Workflow};

/// One immutable transition record: the run entered `state` at sequence number `seq`.
///
/// Stored under the key `(run id, seq)`; `seq` 0 is the initial state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TransitionRecord {
    /// Sequence number within the run, from 0, without gaps.
    pub seq: u64,
    /// The state's name (`"Planned"`).
    pub state: String,
    /// Wall-clock time of the commit, in ms since the Unix epoch.
    pub at_ms: u64,
    /// The pinned schema hash of the build that wrote it.
    pub schema: SchemaHash,
    /// The whole workflow value (the enum, serialized by serde_json).
    pub payload: Box<RawValue>,
    /// Set on a migration's record, and on an acceptance's: the run was migrated from
    /// another version of its workflow (or accepted as it is by a version that lists its
    /// schema in `accepts`: [`MigratedFrom::accepted`]), and this record continues the state
    /// entered at [`MigratedFrom::seq`] (whose steps and idempotency keys stay valid: see
    /// [`state_seq`](Self::state_seq)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrated: Option<MigratedFrom>,
}

/// Where a migration's (or an acceptance's) [`TransitionRecord`] comes from: the schema and
/// version the run was stored with, and the seq of the state the new record continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigratedFrom {
    /// The schema hash (pinned) of the record migrated from.
    pub schema: SchemaHash,
    /// The version (`#[workflow(version = N)]`) migrated from; for an acceptance, the
    /// version the stored description of [`schema`](Self::schema) names (0 if it names
    /// none).
    pub version: u32,
    /// The seq the state was entered at (the record before the migration, or the state
    /// that record continued, after migrations in a row).
    pub seq: u64,
    /// `true` for an acceptance: the version of the record's schema lists
    /// [`schema`](Self::schema) in its `accepts`, and took the run as it is (the same state
    /// and data; no migration ran). From this record on, the run is that version's: its
    /// row carries that version's schema hash, so the events it takes, and the workers
    /// that may claim it, are that version's. Absent (`false`) in a migration's record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accepted: bool,
}

impl TransitionRecord {
    /// Builds the record of `value` entering at `seq`.
    ///
    /// # Errors
    /// [`Error::Encode`] if `value` does not serialize.
    pub fn encode<W: Workflow>(run_id: &str, seq: u64, value: &W, at_ms: u64) -> Result<Self> {
        let state = value.state();
        // Serialized straight into the raw value: serde_json's output is JSON, so it is not
        // parsed again to be checked (`RawValue::from_string` would: 4% of a transition's
        // instructions at 64 runs).
        let payload = serde_json::value::to_raw_value(value).map_err(|source| Error::Encode {
            run_id: run_id.to_owned(),
            state: state.name().to_owned(),
            seq,
            source,
        })?;
        Ok(TransitionRecord {
            seq,
            state: state.name().to_owned(),
            at_ms,
            schema: W::SCHEMA_HASH.pinned(),
            payload,
            migrated: None,
        })
    }

    /// [`encode`](Self::encode), then the record decoded back as a `W`, as a resume reads it
    /// (the value a handler gets): a state whose JSON does not decode back (a NaN float
    /// written as `null`, a field skipped when serialized with no default, a state renamed
    /// for one direction only) is refused rather than recorded where no driver could read it
    /// again. The one check of every record a run enters, its first one included.
    ///
    /// # Errors
    /// [`Error::Encode`] if `value` does not serialize, or its JSON does not decode back as
    /// the same state.
    pub(crate) fn encode_read_back<W: Workflow>(
        run_id: &str,
        seq: u64,
        value: &W,
        at_ms: u64,
    ) -> Result<(Self, W)> {
        let record = TransitionRecord::encode(run_id, seq, value, at_ms)?;
        let read = record.decode(run_id).map_err(|e| match e {
            Error::Decode { source, .. } => Error::Encode {
                run_id: run_id.to_owned(),
                state: value.state().name().to_owned(),
                seq,
                source,
            },
            e => e,
        })?;
        Ok((record, read))
    }

    /// The seq the record's state was entered at: [`seq`](Self::seq), or for a migration's
    /// record the seq of the state it continues ([`MigratedFrom::seq`]).
    pub fn state_seq(&self) -> u64 {
        self.migrated.map_or(self.seq, |m| m.seq)
    }

    /// Decodes the payload as the workflow `W`.
    ///
    /// # Errors
    /// [`Error::Payload`] if the payload is sealed (a store written under a codec, read by
    /// a runtime without one); [`Error::Decode`] (naming run, seq and state) if the payload
    /// is not a `W`, or, in a record of `W`'s own schema, reads as another state than the
    /// one the record names (two states stored under one name).
    pub fn decode<W: Workflow>(&self, run_id: &str) -> Result<W> {
        if let Some(Ok(sealed)) = crate::codec::parse_envelope(self.payload.get()) {
            return Err(Error::Payload {
                run_id: run_id.to_owned(),
                record: RecordKind::Transition,
                seq: self.seq,
                field: "payload",
                action: "opened",
                cause: Box::new(crate::codec::CodecError::NoCodec { key: sealed.key }),
            });
        }
        let decode_error = |source| Error::Decode {
            run_id: run_id.to_owned(),
            record: RecordKind::Transition,
            seq: self.seq,
            state: self.state.clone(),
            source,
        };
        let decoded: W = serde_json::from_str(self.payload.get()).map_err(decode_error)?;
        // A record of this very schema is read back as the state it names, or not at all:
        // two states stored under one name (a serde rename or alias the derive could not
        // see, a hand-written `Deserialize`) would have the run driven on in a state it was
        // not in. (A record of another schema, accepted as it is, may name a state renamed
        // since, which keeps its stored name.)
        let read_as = decoded.state().name();
        if self.schema == W::SCHEMA_HASH.pinned() && read_as != self.state {
            return Err(decode_error(serde::de::Error::custom(format_args!(
                "its data reads as state `{read_as}`: two states are stored under one name"
            ))));
        }
        Ok(decoded)
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        to_vec_sized(self, self.payload.get().len() + self.state.len())
    }

    /// Decodes the record a store keeps under the key `(run_id, seq)`: what a [`Store`]
    /// returns from its reads goes through this, so every store checks records alike.
    ///
    /// # Errors
    /// [`Error::Decode`] naming the run and `seq` if the bytes are not a transition record,
    /// or if the record's own `seq` is not the key's (a record moved or edited by hand).
    ///
    /// [`Store`]: crate::store::Store
    pub fn from_stored(run_id: &str, seq: u64, bytes: &[u8]) -> Result<Self> {
        let decode_error = |state: &str, source| Error::Decode {
            run_id: run_id.to_owned(),
            record: RecordKind::Transition,
            seq,
            state: state.to_owned(),
            source,
        };
        let record: Self = serde_json::from_slice(bytes).map_err(|e| decode_error("?", e))?;
        if record.seq != seq {
            return Err(decode_error(
                &record.state,
                <serde_json::Error as serde::de::Error>::custom(format_args!(
                    "the record says seq {}, but it is stored under seq {seq}",
                    record.seq
                )),
            ));
        }
        Ok(record)
    }
}

/// A transition record decoded as its workflow type.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition<W: Workflow> {
    /// Sequence number within the run, from 0.
    pub seq: u64,
    /// The state entered.
    pub state: W::State,
    /// Wall-clock time of the commit, in ms since the Unix epoch.
    pub at_ms: u64,
    /// The workflow value (state and data).
    pub value: W,
}

/// One immutable step record: the output of a journaled step that succeeded.
///
/// Stored under the key `(run id, seq, step name, occurrence)`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepRecord {
    /// The attempt of the state's handler that ran the step, from 1.
    pub attempt: u32,
    /// Wall-clock time of the commit, in ms since the Unix epoch.
    pub at_ms: u64,
    /// How long the step's closure ran, in ms.
    pub duration_ms: u64,
    /// The step's output, serialized by serde_json.
    pub output: Box<RawValue>,
}

/// What a failed attempt was doing when it failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FailureSource {
    /// A journaled step returned an error (or timed out).
    Step {
        /// The step name.
        name: String,
        /// Which use of the name, from 0.
        occurrence: u32,
    },
    /// The state's handler returned an error (or timed out).
    Handler,
    /// The attempt was cut short (found on resume): the process stopped, or its worker lost
    /// the run's lease, while it ran; there is no error text.
    Interrupted,
}

/// One immutable record of a failed attempt, kept for inspection; it never replays.
///
/// Stored under the key `(run id, seq, attempt, index)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// The attempt, from 1.
    pub attempt: u32,
    /// Wall-clock time, in ms since the Unix epoch.
    pub at_ms: u64,
    /// What failed.
    pub source: FailureSource,
    /// The error and its `source()` chain, outermost first.
    pub errors: Vec<String>,
}

impl FailureRecord {
    /// Whether the stored failure record `bytes` (as a store holds it, sealed or not) ended
    /// its attempt: the handler's failure ([`FailureSource::Handler`]), or the record of an
    /// attempt the process stopped during ([`FailureSource::Interrupted`]). A step's failure
    /// ([`FailureSource::Step`]) does not: the handler may handle it and go on. What
    /// [`AttemptFailures::ended`](crate::store::AttemptFailures::ended) says, in every store.
    ///
    /// # Errors
    /// [`Error::Decode`] (naming `run_id` and `seq`) if the bytes hold no failure source.
    pub fn ends_attempt(run_id: &str, seq: u64, bytes: &[u8]) -> Result<bool> {
        #[derive(Deserialize)]
        struct Source {
            source: FailureSource,
        }
        let source: Source = decode_failure(run_id, seq, bytes)?;
        Ok(!matches!(source.source, FailureSource::Step { .. }))
    }

    /// Decodes the stored failure record `bytes` of the run `run_id`'s state at `seq` (as a
    /// store holds it: JSON, its texts sealed or not).
    ///
    /// # Errors
    /// [`Error::Decode`] (naming `run_id` and `seq`) if the bytes are no failure record.
    pub fn decode(run_id: &str, seq: u64, bytes: &[u8]) -> Result<FailureRecord> {
        decode_failure(run_id, seq, bytes)
    }
}

/// `bytes`, a stored failure record of `run_id`'s state at `seq`, decoded as `T`: the one
/// decoding of failure records, and its error, for every store's read.
fn decode_failure<T: serde::de::DeserializeOwned>(
    run_id: &str,
    seq: u64,
    bytes: &[u8],
) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|source| Error::Decode {
        run_id: run_id.to_owned(),
        record: RecordKind::Failure,
        seq,
        state: String::new(),
        source,
    })
}

pub(crate) fn to_vec<T: Serialize>(value: &T) -> Vec<u8> {
    to_vec_sized(value, 0)
}

/// [`to_vec`] of a value whose variable parts (a payload, a name) take about `variable`
/// bytes: the buffer is allocated once for them and the record's fixed fields, where
/// serde_json's own `to_vec` starts at 128 bytes and grows (two reallocations for a
/// 200-byte state).
pub(crate) fn to_vec_sized<T: Serialize>(value: &T, variable: usize) -> Vec<u8> {
    /// Room for a record's fixed fields: its keys, numbers and schema hash.
    const FIXED: usize = 128;
    let mut out = Vec::with_capacity(variable.saturating_add(FIXED));
    // Our record types hold only strings, integers and already-valid raw JSON: they cannot
    // fail to serialize. Fall back to an empty object rather than panicking all the same.
    match serde_json::to_writer(&mut out, value) {
        Ok(()) => out,
        Err(_) => b"{}".to_vec(),
    }
}

// The wall clock's reading lives with the clock; kept here too, where records read it.
#[cfg(feature = "test-util")]
pub use crate::clock::__set_clock_offset_ms;
pub use crate::clock::now_ms;
