//! Payloads through a [`PayloadCodec`], in one place for every store: [`Payloads`] says
//! which field of which record is a payload and seals or opens it, and [`SealedStore`] puts
//! it between the runtime and any [`Store`] (so redb and PostgreSQL store sealed payloads
//! alike, and neither knows). The CLI uses [`Payloads`] on what it reads.
//!
//! Sealed: a transition's `payload`, a step's `output`, a failure's `errors`, an event's
//! `payload`, and in the run's row its `error` (a failure's errors), `cancel` reason and
//! block `reason`. In clear: everything else (what stores index and workers route by).

mod search;
mod store;

pub use self::search::{KEY_SEARCH_RUNS, KeyRead, KeySearch};
pub(crate) use self::store::{SealedStore, refuse_sealed};
pub use self::store::{check_keys, refuse_foreign_codec, seals_as_store_does};

use std::sync::Arc;

use serde_json::value::RawValue;

use super::{EventRecord, Reply, RunInfo, WaitOutcome, Write};
use crate::codec::{CodecError, PayloadCodec, Place, envelope, parse_envelope, redacted};
use crate::error::{Error, RecordKind, Result};
use crate::record::{FailureRecord, StepRecord, TransitionRecord, to_vec};

/// Seals the payloads of writes and opens those of records read back, through a codec (or,
/// without one, says which key a sealed payload needs). Cheap to clone.
#[derive(Clone)]
pub struct Payloads {
    codec: Option<Arc<dyn PayloadCodec>>,
    /// Without a codec: show a sealed payload as `"<encrypted: key K>"` rather than fail.
    redact: bool,
    /// With a codec: seal only as the store does ([`seals_as_store_does`]).
    follow: bool,
    /// With a codec: show a payload it cannot open as `"<cannot open: why>"` rather than
    /// fail ([`showing_unopened`](Payloads::showing_unopened)).
    show_unopened: bool,
}

impl std::fmt::Debug for Payloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Payloads")
            .field("codec", &self.codec.is_some())
            .field("redact", &self.redact)
            .field("follow", &self.follow)
            .field("show_unopened", &self.show_unopened)
            .finish()
    }
}

/// What a field is, for the errors: the run, the record, its seq, the field.
type At<'a> = Place<'a>;

impl Payloads {
    /// Seals and opens with `codec`.
    pub fn new(codec: Arc<dyn PayloadCodec>) -> Payloads {
        Payloads {
            codec: Some(codec),
            redact: false,
            follow: false,
            show_unopened: false,
        }
    }

    /// Seals and opens with `codec`, as a writer into a store its workers own (a tool such
    /// as the `loops` CLI): a runtime's store over it
    /// ([`RuntimeBuilder::seal_as_store_does`](crate::RuntimeBuilder::seal_as_store_does))
    /// seals only as the store does ([`seals_as_store_does`]) and records no key of its own.
    pub fn following(codec: Arc<dyn PayloadCodec>) -> Payloads {
        Payloads {
            follow: true,
            ..Payloads::new(codec)
        }
    }

    /// No codec: payloads in clear pass as they are, and a sealed one reads as the JSON
    /// string `"<encrypted: key K>"` (for a reader without the key, such as the CLI); a
    /// write is never sealed.
    pub fn redacting() -> Payloads {
        Payloads {
            codec: None,
            redact: true,
            follow: false,
            show_unopened: false,
        }
    }

    /// These payloads, for a reader that shows what it reads (the `loops` CLI): a payload
    /// the codec cannot open (a key it lacks, another key of the same id, an altered
    /// record) reads as the text `<cannot open: why>` naming the key, rather than failing
    /// the whole read. Sealing is unchanged.
    pub fn showing_unopened(self) -> Payloads {
        Payloads {
            show_unopened: true,
            ..self
        }
    }

    /// Whether payloads are sealed on write.
    pub fn seals(&self) -> bool {
        self.codec.is_some()
    }

    /// Without a codec, a guard: a sealed payload is an error ([`Error::Payload`] naming
    /// its key), never passed on as it is stored. What a runtime without a codec reads
    /// through.
    pub(crate) fn guard() -> Payloads {
        Payloads {
            codec: None,
            redact: false,
            follow: false,
            show_unopened: false,
        }
    }

    /// The id of the codec's writing key, if there is a codec.
    pub fn key_id(&self) -> Option<String> {
        self.codec.as_ref().map(|codec| codec.key_id())
    }

    /// The ids of the codec's keys, the writing key first (none without a codec).
    pub fn key_ids(&self) -> Vec<String> {
        self.codec
            .as_ref()
            .map(|codec| codec.key_ids())
            .unwrap_or_default()
    }

    /// The codec's check value of its key `key`, if it has that key and gives one
    /// ([`PayloadCodec::key_check`]).
    pub fn key_check(&self, key: &str) -> Option<String> {
        self.codec.as_ref().and_then(|codec| codec.key_check(key))
    }

    /// Whether this seals only as the store does ([`following`](Self::following)).
    pub(crate) fn follows(&self) -> bool {
        self.follow
    }

    /// Whether a sealed payload is shown as `<encrypted: key K>` (no codec, redacting).
    pub(crate) fn redacts(&self) -> bool {
        self.redact
    }

    fn error(at: &At<'_>, action: &'static str, cause: CodecError) -> Error {
        Error::Payload {
            run_id: at.run_id.to_owned(),
            record: at.record.clone(),
            seq: at.seq,
            field: at.field,
            action,
            cause: Box::new(cause),
        }
    }

    /// Seals `plain` (JSON or text) for `at` into envelope text; a value already sealed
    /// (by a CLI that has the key) is kept as it is if the codec opens it
    /// ([`accept_sealed`](Self::accept_sealed)), and without a codec nothing changes.
    fn seal(&self, at: &At<'_>, plain: &str) -> Result<String> {
        let Some(codec) = &self.codec else {
            return Ok(plain.to_owned());
        };
        if self.accept_sealed(at, plain)? {
            return Ok(plain.to_owned());
        }
        let sealed = codec
            .seal(at, plain.as_bytes())
            .map_err(|cause| Self::error(at, "sealed", cause))?;
        Ok(envelope(&sealed))
    }

    /// Opens `stored` (envelope text, or a value in clear, returned as it is) read from
    /// `at`. `shown_as` turns a text shown instead of the payload (`<encrypted: key K>` to a
    /// reader without a codec, `<cannot open: why>` to one that
    /// [shows what it cannot open](Self::showing_unopened)) into the field's form.
    fn open(
        &self,
        at: &At<'_>,
        stored: &str,
        shown_as: fn(&str) -> String,
    ) -> Result<Option<String>> {
        let Some(parsed) = parse_envelope(stored) else {
            return Ok(None);
        };
        let fail = |cause| Self::error(at, "opened", cause);
        let sealed = parsed.map_err(fail)?;
        let Some(codec) = &self.codec else {
            if self.redact {
                return Ok(Some(shown_as(&redacted(&sealed.key))));
            }
            return Err(fail(CodecError::NoCodec { key: sealed.key }));
        };
        let plain = match codec.open(at, &sealed) {
            Ok(plain) => plain,
            Err(cause) if self.show_unopened => {
                return Ok(Some(shown_as(&format!("<cannot open: {cause}>"))));
            }
            Err(cause) => return Err(fail(cause)),
        };
        String::from_utf8(plain).map(Some).map_err(|_| {
            fail(CodecError::Malformed {
                reason: "it opens to bytes that are not UTF-8".to_owned(),
            })
        })
    }

    /// Whether `stored` arrived sealed (`false`: in clear), if it did and this codec opens
    /// it; else [`Error::SealedRefused`]: a payload that arrived sealed (from a CLI with a
    /// key file) and that this runtime could not read back (no codec, a key it lacks,
    /// another key of the same id) is never stored.
    fn accept_sealed(&self, at: &At<'_>, stored: &str) -> Result<bool> {
        let Some(parsed) = parse_envelope(stored) else {
            return Ok(false);
        };
        let refused = |cause| Error::SealedRefused {
            run_id: at.run_id.to_owned(),
            record: at.record.clone(),
            field: at.field,
            cause: Box::new(cause),
        };
        let sealed = parsed.map_err(refused)?;
        match &self.codec {
            None => Err(refused(CodecError::SealedForClear { key: sealed.key })),
            Some(codec) => codec.open(at, &sealed).map(|_| true).map_err(refused),
        }
    }

    /// The payload of `write` that comes from outside the program, with its place: an
    /// event's payload, a cancellation's reason (what a CLI with a key file may have sealed).
    fn from_outside(write: &Write) -> Option<(Place<'_>, &str)> {
        match write {
            Write::Send {
                run_id,
                name,
                payload,
                ..
            } => Some((event_at(run_id, name), payload)),
            Write::Cancel { run_id, reason, .. } => Some((row_at(run_id, "cancel"), reason)),
            _ => None,
        }
    }

    /// Whether `write` is an event or a cancellation whose payload arrived sealed (by a CLI
    /// with a key file).
    pub(crate) fn arrives_sealed(write: &Write) -> bool {
        Payloads::from_outside(write).is_some_and(|(_, stored)| parse_envelope(stored).is_some())
    }

    /// Refuses a write that is stored as it is (not sealed by this codec: no codec, or a
    /// store in clear that a [`following`](Self::following) writer leaves so) and carries a
    /// payload that arrived sealed from outside (an event, a cancellation reason): no run
    /// of such a store could open it.
    ///
    /// # Errors
    /// [`Error::SealedRefused`].
    pub(crate) fn refuse_sealed_from_outside(write: &Write) -> Result<()> {
        match Payloads::from_outside(write) {
            Some((at, stored)) => Payloads::guard().accept_sealed(&at, stored).map(drop),
            None => Ok(()),
        }
    }

    /// [`open`](Self::open) of a JSON value.
    fn open_raw(&self, at: &At<'_>, raw: &mut Box<RawValue>) -> Result<()> {
        let as_json = |text: &str| serde_json::Value::String(text.to_owned()).to_string();
        if let Some(json) = self.open(at, raw.get(), as_json)? {
            *raw = RawValue::from_string(json).map_err(|_| {
                Self::error(
                    at,
                    "opened",
                    CodecError::Malformed {
                        reason: "it opens to text that is not JSON".to_owned(),
                    },
                )
            })?;
        }
        Ok(())
    }

    fn seal_raw(&self, at: &At<'_>, raw: &mut Box<RawValue>) -> Result<()> {
        if self.codec.is_some() {
            let sealed = self.seal(at, raw.get())?;
            // An envelope is valid JSON.
            if let Ok(value) = RawValue::from_string(sealed) {
                *raw = value;
            }
        }
        Ok(())
    }

    /// [`open`](Self::open) of a text field.
    fn open_text(&self, at: &At<'_>, text: &mut String) -> Result<()> {
        if let Some(plain) = self.open(at, text, str::to_owned)? {
            *text = plain;
        }
        Ok(())
    }

    /// An error chain sealed as one envelope (a one-element list), opened back to the list.
    fn seal_errors(&self, at: &At<'_>, errors: &mut Vec<String>) -> Result<()> {
        if self.codec.is_some() && !errors.is_empty() {
            let json = serde_json::to_string(errors).unwrap_or_default();
            *errors = vec![self.seal(at, &json)?];
        }
        Ok(())
    }

    fn open_errors(&self, at: &At<'_>, errors: &mut Vec<String>) -> Result<()> {
        let [only] = errors.as_slice() else {
            return Ok(());
        };
        let as_list = |text: &str| serde_json::to_string(&[text]).unwrap_or_default();
        if let Some(json) = self.open(at, only, as_list)? {
            *errors = serde_json::from_str(&json).map_err(|_| {
                Self::error(
                    at,
                    "opened",
                    CodecError::Malformed {
                        reason: "it opens to something that is not a list of texts".to_owned(),
                    },
                )
            })?;
        }
        Ok(())
    }

    /// Opens the sealed fields of a run's row: its last error, its cancellation reason and
    /// its block reason.
    ///
    /// # Errors
    /// [`Error::Payload`] naming the run, the field and the key id when a field does not
    /// open (unknown key, altered or moved payload, no codec and no redaction).
    pub fn open_info(&self, info: &mut RunInfo) -> Result<()> {
        let seq = info.state_seq();
        let RunInfo {
            run_id,
            error,
            cancel,
            block,
            ..
        } = info;
        if let Some(errors) = error {
            self.open_errors(&failure_at(run_id, seq), errors)?;
        }
        if let Some(reason) = cancel {
            self.open_text(&row_at(run_id, "cancel"), reason)?;
        }
        if let Some(block) = block {
            self.open_text(&row_at(run_id, "block"), &mut block.reason)?;
        }
        Ok(())
    }

    /// Opens a transition record's payload (run `run_id`).
    ///
    /// # Errors
    /// [`Error::Payload`] as for [`open_info`](Self::open_info).
    pub fn open_transition(&self, run_id: &str, record: &mut TransitionRecord) -> Result<()> {
        self.open_raw(&transition_at(run_id, record.seq), &mut record.payload)
    }

    /// `Ok` if the transition record's payload is in clear or opens with the codec (however
    /// this reader [shows](Self::showing_unopened) what it cannot open): whether the codec's
    /// keys are the ones that sealed the run.
    ///
    /// # Errors
    /// [`Error::Payload`] as for [`open_info`](Self::open_info).
    pub fn verify_transition(&self, run_id: &str, record: &TransitionRecord) -> Result<()> {
        let strict = Payloads {
            show_unopened: false,
            ..self.clone()
        };
        let mut payload = record.payload.clone();
        strict.open_raw(&transition_at(run_id, record.seq), &mut payload)
    }

    /// Opens a step record's output: the step `(name, occurrence)` of the state at `seq`.
    /// A wait's output holds the event as sealed when it was sent; that is opened too.
    ///
    /// # Errors
    /// [`Error::Payload`] as for [`open_info`](Self::open_info).
    pub fn open_step(
        &self,
        run_id: &str,
        seq: u64,
        name: &str,
        occurrence: u32,
        record: &mut StepRecord,
    ) -> Result<()> {
        self.open_raw(&step_at(run_id, seq, name, occurrence), &mut record.output)?;
        let Some(event) = crate::record::wait::waited_event(name) else {
            return Ok(());
        };
        use crate::record::wait::WaitOutput;
        let Ok(WaitOutput::Event { seq, mut payload }) =
            serde_json::from_str::<WaitOutput<Box<RawValue>>>(record.output.get())
        else {
            return Ok(());
        };
        self.open_raw(&event_at(run_id, event), &mut payload)?;
        let output = crate::record::wait::delivered_output(seq, payload.get());
        if let Ok(output) = RawValue::from_string(output) {
            record.output = output;
        }
        Ok(())
    }

    /// Opens a failure record's error texts (state at `seq`).
    ///
    /// # Errors
    /// [`Error::Payload`] as for [`open_info`](Self::open_info).
    pub fn open_failure(&self, run_id: &str, seq: u64, record: &mut FailureRecord) -> Result<()> {
        self.open_errors(&failure_at(run_id, seq), &mut record.errors)
    }

    /// Opens an event record's payload.
    ///
    /// # Errors
    /// [`Error::Payload`] as for [`open_info`](Self::open_info).
    pub fn open_event(&self, run_id: &str, record: &mut EventRecord) -> Result<()> {
        self.open_raw(&event_at(run_id, &record.name), &mut record.payload)
    }

    /// The payload JSON of an event `name` sent to `run_id` as it arrived, `payload`,
    /// opened: `None` if it is in clear. Never a stand-in text: a payload these payloads
    /// would show as `<encrypted: ..>` or `<cannot open: ..>` is an error here.
    ///
    /// # Errors
    /// [`Error::Payload`] as for [`open_info`](Self::open_info): no codec, a key it lacks, an
    /// altered envelope.
    pub(crate) fn open_event_payload(
        &self,
        run_id: &str,
        name: &str,
        payload: &str,
    ) -> Result<Option<String>> {
        let strict = Payloads {
            redact: false,
            show_unopened: false,
            ..self.clone()
        };
        let as_json = |text: &str| serde_json::Value::String(text.to_owned()).to_string();
        strict.open(&event_at(run_id, name), payload, as_json)
    }

    /// Seals the payload JSON of an event `name` sent to `run_id` (a payload sealed
    /// already is kept; without a codec it is returned as it is).
    ///
    /// # Errors
    /// [`Error::Payload`] if the codec cannot seal.
    pub fn seal_event(&self, run_id: &str, name: &str, payload: &str) -> Result<String> {
        self.seal(&event_at(run_id, name), payload)
    }

    /// Seals a cancellation reason for `run_id` (as [`seal_event`](Self::seal_event)).
    ///
    /// # Errors
    /// [`Error::Payload`] if the codec cannot seal.
    pub fn seal_cancel(&self, run_id: &str, reason: &str) -> Result<String> {
        self.seal(&row_at(run_id, "cancel"), reason)
    }

    /// Seals the payloads `write` carries. A block reason is sealed by [`SealedStore`].
    fn seal_write(&self, write: Write) -> Result<Write> {
        Ok(match write {
            // Attributes stay plaintext: they are meant to be searched.
            Write::Create {
                info,
                record,
                schema_text,
                attributes,
            } => Write::Create {
                record: self.seal_record(&info.run_id, &record)?,
                info,
                schema_text,
                attributes,
            },
            Write::Transition {
                run_id,
                seq,
                state,
                record,
                terminal,
                at_ms,
                hands_over,
            } => Write::Transition {
                record: self.seal_record(&run_id, &record)?,
                run_id,
                seq,
                state,
                terminal,
                at_ms,
                hands_over,
            },
            Write::Step {
                run_id,
                seq,
                name,
                occurrence,
                record,
                clear_error_at_ms,
            } => {
                let mut step = decode_own::<StepRecord>(&run_id, seq, &record)?;
                self.seal_raw(&step_at(&run_id, seq, &name, occurrence), &mut step.output)?;
                Write::Step {
                    record: to_vec(&step),
                    run_id,
                    seq,
                    name,
                    occurrence,
                    clear_error_at_ms,
                }
            }
            Write::Failure {
                run_id,
                seq,
                mut record,
                then,
            } => {
                self.seal_errors(&failure_at(&run_id, seq), &mut record.errors)?;
                Write::Failure {
                    run_id,
                    seq,
                    record,
                    then,
                }
            }
            Write::Cancel {
                run_id,
                reason,
                end_now,
                at_ms,
            } => Write::Cancel {
                reason: self.seal_cancel(&run_id, &reason)?,
                run_id,
                end_now,
                at_ms,
            },
            Write::Send {
                run_id,
                name,
                payload,
                key,
                at_ms,
            } => Write::Send {
                payload: self.seal_event(&run_id, &name, &payload)?,
                run_id,
                name,
                key,
                at_ms,
            },
            Write::Migrate {
                run_id,
                seq,
                mut record,
                schema_text,
                terminal,
            } => {
                self.seal_raw(&transition_at(&run_id, record.seq), &mut record.payload)?;
                Write::Migrate {
                    run_id,
                    seq,
                    record,
                    schema_text,
                    terminal,
                }
            }
            other => other,
        })
    }

    /// A serialized transition record with its payload sealed.
    fn seal_record(&self, run_id: &str, bytes: &[u8]) -> Result<Vec<u8>> {
        if self.codec.is_none() {
            return Ok(bytes.to_vec());
        }
        let mut record: TransitionRecord =
            serde_json::from_slice(bytes).map_err(|source| Error::Decode {
                run_id: run_id.to_owned(),
                record: RecordKind::Transition,
                seq: 0,
                state: "?".to_owned(),
                source,
            })?;
        self.seal_raw(&transition_at(run_id, record.seq), &mut record.payload)?;
        Ok(to_vec(&record))
    }

    /// Opens what a reply carries: the row, and a delivered event's payload (`event`: the
    /// event the write waited for).
    fn open_reply(&self, reply: Reply, event: Option<&str>) -> Result<Reply> {
        Ok(match reply {
            Reply::Run(mut info) => {
                self.open_info(&mut info)?;
                Reply::Run(info)
            }
            Reply::Waited(outcome, mut info) => {
                self.open_info(&mut info)?;
                let outcome = match (outcome, event) {
                    (WaitOutcome::Delivered { event_seq, payload }, Some(event)) => {
                        let mut raw = RawValue::from_string(payload.clone())
                            .unwrap_or_else(|_| RawValue::NULL.to_owned());
                        self.open_raw(&event_at(&info.run_id, event), &mut raw)?;
                        WaitOutcome::Delivered {
                            event_seq,
                            payload: raw.get().to_owned(),
                        }
                    }
                    (other, _) => other,
                };
                Reply::Waited(outcome, info)
            }
            Reply::Sent {
                event_seq,
                duplicate,
                mut info,
            } => {
                self.open_info(&mut info)?;
                Reply::Sent {
                    event_seq,
                    duplicate,
                    info,
                }
            }
            other => other,
        })
    }
}

fn decode_own<T: serde::de::DeserializeOwned>(run_id: &str, seq: u64, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|source| Error::Decode {
        run_id: run_id.to_owned(),
        record: RecordKind::Transition,
        seq,
        state: String::new(),
        source,
    })
}

fn transition_at(run_id: &str, seq: u64) -> Place<'_> {
    Place {
        run_id,
        record: RecordKind::Transition,
        seq,
        field: "payload",
    }
}

fn step_at<'a>(run_id: &'a str, seq: u64, name: &str, occurrence: u32) -> Place<'a> {
    Place {
        run_id,
        record: RecordKind::Step {
            name: name.to_owned(),
            occurrence,
        },
        seq,
        field: "output",
    }
}

fn failure_at(run_id: &str, seq: u64) -> Place<'_> {
    Place {
        run_id,
        record: RecordKind::Failure,
        seq,
        field: "errors",
    }
}

fn event_at<'a>(run_id: &'a str, name: &str) -> Place<'a> {
    Place {
        run_id,
        record: RecordKind::Event {
            name: Some(name.to_owned()),
        },
        seq: 0,
        field: "payload",
    }
}

fn row_at<'a>(run_id: &'a str, field: &'static str) -> Place<'a> {
    Place {
        run_id,
        record: RecordKind::RunRow,
        seq: 0,
        field,
    }
}
