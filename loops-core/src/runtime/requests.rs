//! Requests to a run from outside its driver: events ([`Runtime::send`]), cancellation and
//! retry.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::event::EventName;
use crate::names::{RESERVED_PREFIX, validate_name, validate_run_id_lookup};
use crate::row::RunInfo;
use crate::runtime::handle::Runtime;
use crate::schema::{DeclaredEvents, EventRefusal};
use crate::store::{Reply, Write};

/// The receipt of [`Runtime::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// The event's sequence number in the run's inbox, from 0.
    pub event_seq: u64,
    /// Whether an event with the same idempotency key had been sent already (nothing was
    /// written; `event_seq` is that event's).
    pub duplicate: bool,
}

/// Checks an event from outside the program (its name `event` and its JSON `payload`)
/// against the events declared in `description`, the stored schema description of the run
/// `info`: the one check of [`Runtime::send_json`], for a sender that must check before it
/// seals the payload (the `loops` CLI with a key file). A sealed payload (the codec's
/// envelope) has its name checked only: its shape was checked by whoever sealed it, who holds
/// the key. A workflow that declares no events takes any name and any payload that is JSON
/// a type can read.
///
/// # Errors
/// [`Error::EventRefused`] naming the run, its state and seq, for a name the workflow does
/// not declare, a payload that is not JSON a type can read ([`EventRefusal::NotJson`]: a
/// lone surrogate escape, a number out of range; whether or not the workflow declares
/// events), one whose objects name a key twice ([`EventRefusal::DuplicateKey`]: a struct
/// would refuse it when the run takes it, a map keep one of them; likewise), or one that
/// cannot be the declared type; [`Error::RunEnded`] instead when the run has ended (it takes
/// no event).
pub fn check_event(info: &RunInfo, description: &str, event: &str, payload: &str) -> Result<()> {
    ended_first(info, check_declared(info, description, event, payload))
}

/// `checked`, the refusal of an event to the run `info`, as the sender must hear it: an ended
/// run takes no event at all, and that, not the name, shape or type, is what it is told
/// ([`Error::RunEnded`]). A valid event goes on to the store, which answers a keyed send made
/// before the run ended as the duplicate it is, and refuses another as ended.
fn ended_first(info: &RunInfo, checked: Result<()>) -> Result<()> {
    match checked {
        Err(Error::EventRefused { .. }) if info.status.is_ended() => Err(crate::store::run_ended(
            info,
            crate::store::SENDING_AN_EVENT,
        )),
        checked => checked,
    }
}

/// The checks of [`check_event`] on the event itself (its name and payload).
fn check_declared(info: &RunInfo, description: &str, event: &str, payload: &str) -> Result<()> {
    let declared = DeclaredEvents::from_description(description);
    let refused = |refusal| Error::EventRefused {
        run_id: info.run_id.clone(),
        state: info.state.clone(),
        seq: info.seq,
        event: event.to_owned(),
        refusal: Box::new(refusal),
    };
    if crate::codec::parse_envelope(payload).is_some() {
        if declared.is_empty() || declared.get(event).is_some() {
            return Ok(());
        }
        return declared
            .check(description, event, &serde_json::Value::Null)
            .map_err(refused);
    }
    // Parsed as a value: the payload came as a `RawValue`, whose parse checks the syntax
    // only and takes a string's lone surrogate escape, which no payload type reads.
    let value: serde_json::Value = serde_json::from_str(payload).map_err(|e| {
        refused(EventRefusal::NotJson {
            problem: e.to_string(),
        })
    })?;
    if let Some(problem) = crate::schema::duplicate_key(payload) {
        return Err(refused(EventRefusal::DuplicateKey { problem }));
    }
    declared.check(description, event, &value).map_err(refused)
}

/// The most bytes a cancellation reason may hold ([`check_cancel_reason`]).
pub const MAX_CANCEL_REASON_BYTES: usize = 4096;
// The refusal's text names the limit.
const _: () = assert!(MAX_CANCEL_REASON_BYTES == 4096);

/// Refuses an event's idempotency key `key` that starts or ends with white space or an
/// invisible format character (Unicode `Cf`: U+200B ZERO WIDTH SPACE, U+FEFF, U+2060 WORD
/// JOINER, ...): keys are compared byte for byte, so a sender that trims its key and one
/// that does not would send the same request twice, and a key ending in an invisible
/// character shows as the key without it.
///
/// # Errors
/// [`Error::InvalidName`] (`what`: `"idempotency key"`) naming the run and the rule.
fn check_event_key(run_id: &str, key: &str) -> Result<()> {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory as _};
    let unseen = |c: char| c.is_whitespace() || c.general_category() == GeneralCategory::Format;
    if key.starts_with(unseen) || key.ends_with(unseen) {
        return Err(Error::InvalidName {
            run_id: run_id.to_owned(),
            what: "idempotency key",
            name: key.to_owned(),
            reason: "starts or ends with white space or an invisible format character (keys \
                     are compared byte for byte: send it trimmed)",
        });
    }
    Ok(())
}

/// Checks `reason`, a cancellation reason for the run `run_id`: the one rule of
/// [`Runtime::cancel`], for a caller that must check before it seals the reason (the `loops`
/// CLI with a key file). A reason is kept with the run and shown on one line (`loops show`,
/// `loops runs`, logs, the error a caller of the run gets), so it must say something and hold
/// no control character (a line break, a tab, a terminal escape). A bidirectional control is
/// kept: the CLI and the web UI show it escaped (`\u{202e}`).
///
/// A reason of more than [`MAX_CANCEL_REASON_BYTES`] is refused too: it lives in the run's
/// row, which every listing reads.
///
/// # Errors
/// [`Error::InvalidName`] (`what`: `"cancellation reason"`) naming the run and the rule.
pub fn check_cancel_reason(run_id: &str, reason: &str) -> Result<()> {
    if reason.len() > MAX_CANCEL_REASON_BYTES {
        // Kept in the run's row, which every listing reads: a reason is a line, not a
        // payload. The error names its start, not all of it.
        let start: String = reason.chars().take(40).collect();
        return Err(Error::InvalidName {
            run_id: run_id.to_owned(),
            what: "cancellation reason",
            name: format!("{start}… ({} bytes)", reason.len()),
            reason: "over 4096 bytes: a reason is one line of text, kept in the run's row (give details in an event or an attribute)",
        });
    }
    let broken = if reason.trim().is_empty() {
        // Kept with the run to tell people why it ended: an empty one tells nothing.
        Some("empty: say why the run is cancelled")
    } else if reason.chars().any(char::is_control) {
        Some(
            "contains control characters (a line break, a tab, a terminal escape): a reason is one line of text",
        )
    } else {
        None
    };
    match broken {
        Some(rule) => Err(Error::InvalidName {
            run_id: run_id.to_owned(),
            what: "cancellation reason",
            name: reason.to_owned(),
            reason: rule,
        }),
        None => Ok(()),
    }
}

impl Runtime {
    /// Sends the event `event` with `payload` to the run `run_id`: appended durably to the
    /// run's inbox, delivered to the run's next (or current) wait for `event`, once. `event`
    /// is a declared event (`runtime.send(id, Deliver::APPROVE, &approval)`: the compiler
    /// checks the payload's type) or a name (`"approve"`). A name and its payload are
    /// checked, as [`send_json`](Self::send_json) checks them, against the events the run's
    /// workflow declares (`#[event(name: Type)]`, read from the run's stored schema
    /// description; one more read of the store): a misspelt name or a payload of another
    /// shape is refused before anything is written. A workflow that declares no events
    /// takes any name and payload.
    ///
    /// # Errors
    /// [`Error::EventRefused`](crate::Error::EventRefused) (nothing written) for a name the
    /// run's workflow does not declare, or a payload that cannot be the declared type (a
    /// name only); [`Error::RunNotFound`](crate::Error::RunNotFound) for an unknown run;
    /// [`Error::RunEnded`](crate::Error::RunEnded) for a run that has ended;
    /// [`Error::InvalidName`](crate::Error::InvalidName);
    /// [`Error::EventEncode`](crate::Error::EventEncode) or
    /// [`Error::PayloadTooLarge`](crate::Error::PayloadTooLarge) for a payload that cannot be
    /// stored; [`Error::Storage`](crate::Error::Storage).
    pub async fn send<T: Serialize + ?Sized>(
        &self,
        run_id: &str,
        event: impl EventName<T>,
        payload: &T,
    ) -> Result<Sent> {
        self.send_inner(
            run_id,
            event.event_name(),
            None,
            payload,
            !event.is_declared(),
        )
        .await
        .map(|(sent, _)| sent)
    }

    /// As [`send`](Self::send), once per `key`: a second send with the same key for the same
    /// run writes nothing and returns the first event's receipt with `duplicate: true`.
    ///
    /// # Errors
    /// As [`send`](Self::send); [`Error::InvalidName`](crate::Error::InvalidName) for an invalid key
    /// (empty, over 256 bytes, with control characters, or starting or ending with white
    /// space: keys are compared byte for byte, so `"k "` would be another request than `"k"`).
    pub async fn send_with_key<T: Serialize + ?Sized>(
        &self,
        run_id: &str,
        event: impl EventName<T>,
        key: &str,
        payload: &T,
    ) -> Result<Sent> {
        self.send_inner(
            run_id,
            event.event_name(),
            Some(key),
            payload,
            !event.is_declared(),
        )
        .await
        .map(|(sent, _)| sent)
    }

    /// Sends an event whose name and payload come from outside the program (the `loops`
    /// CLI, the control endpoint, a web form): as [`send`](Self::send) (with `key`, as
    /// [`send_with_key`](Self::send_with_key)), after checking them against the events the
    /// run's workflow declares (`#[event(name: Type)]`), read from the run's stored schema
    /// description ([`DeclaredEvents`](crate::DeclaredEvents)). A workflow that declares no
    /// events takes any name and any payload that is JSON a type can read (not a lone
    /// surrogate escape, `"\ud800"`, which a `RawValue` takes). The payload check refuses
    /// what serde's derive would refuse for sure (a missing field, a value of the wrong
    /// kind, an unknown variant); a field the declared type does not have is not refused
    /// (serde ignores it when the run reads the payload). Where this runtime registers the
    /// version that drives the run (its schema's, or one that accepts it), the payload is
    /// then read as the declared type ([`Workflow::read_event`](crate::Workflow::read_event)),
    /// whose own checks refuse what the run's wait would set aside: a
    /// `#[serde(try_from = ..)]` conversion's rules, `#[serde(deny_unknown_fields)]`. A
    /// payload that arrives sealed (the `loops` CLI with a key file seals it) is opened with
    /// this runtime's codec and checked as one in clear.
    ///
    /// # Errors
    /// [`Error::EventRefused`](crate::Error::EventRefused) (nothing written) for a name the
    /// workflow does not declare, a payload that is not JSON a type can read, or one that
    /// cannot be the declared type ([`check_event`]), or that the declared type refuses
    /// ([`EventRefusal::Refused`]);
    /// [`Error::RunNotFound`](crate::Error::RunNotFound); otherwise as [`send`](Self::send).
    pub async fn send_json(
        &self,
        run_id: &str,
        event: &str,
        key: Option<&str>,
        payload: &serde_json::value::RawValue,
    ) -> Result<Sent> {
        self.send_inner(run_id, event, key, payload, true)
            .await
            .map(|(sent, _)| sent)
    }

    /// [`send_json`](Self::send_json), with the run's row after the send (the control
    /// endpoint's answer says from it whether this process takes the event up).
    ///
    /// # Errors
    /// As [`send_json`](Self::send_json).
    #[cfg(feature = "control")]
    pub(crate) async fn send_json_row(
        &self,
        run_id: &str,
        event: &str,
        key: Option<&str>,
        payload: &serde_json::value::RawValue,
    ) -> Result<(Sent, RunInfo)> {
        self.send_inner(run_id, event, key, payload, true).await
    }

    /// Writes the event; with `check`, first checks its name and payload against the run's
    /// declared events ([`check_event`]). Returns the receipt and the run's row after it.
    async fn send_inner<T: Serialize + ?Sized>(
        &self,
        run_id: &str,
        event: &str,
        key: Option<&str>,
        payload: &T,
        check: bool,
    ) -> Result<(Sent, RunInfo)> {
        validate_run_id_lookup(run_id)?;
        let names =
            std::iter::once(("event name", event)).chain(key.map(|k| ("idempotency key", k)));
        for (what, name) in names {
            validate_name(name).map_err(|reason| Error::InvalidName {
                run_id: run_id.to_owned(),
                what,
                name: name.to_owned(),
                reason,
            })?;
        }
        key.map_or(Ok(()), |key| check_event_key(run_id, key))?;
        // loops' own events (a child's end, `CHILD_ENDED`) are sent by its writes only.
        if event.starts_with(RESERVED_PREFIX) {
            return Err(Error::InvalidName {
                run_id: run_id.to_owned(),
                what: "event name",
                name: event.to_owned(),
                reason: "starts with `loops:`, which loops reserves for the events it sends itself",
            });
        }
        let json = serde_json::to_string(payload).map_err(|source| Error::EventEncode {
            run_id: run_id.to_owned(),
            event: event.to_owned(),
            source,
        })?;
        let limit = self.inner.config.settings.max_payload_bytes;
        // A payload that arrives sealed (by a CLI with a key file) counts its sealed bytes,
        // not its envelope's base64 (a third more): the limit is the same with a codec.
        let envelope = crate::codec::parse_envelope(&json);
        let bytes = match &envelope {
            Some(Ok(sealed)) => sealed.data.len(),
            _ => json.len(),
        };
        if bytes > limit {
            return Err(Error::PayloadTooLarge {
                run_id: run_id.to_owned(),
                what: format!("payload of event `{event}`"),
                seq: None,
                bytes,
                limit,
            });
        }
        if check {
            self.check_sent(run_id, event, &json, envelope.is_some())
                .await?;
        }
        let reply = self
            .store()
            .write(
                None,
                Write::Send {
                    run_id: run_id.to_owned(),
                    name: event.to_owned(),
                    payload: json,
                    key: key.map(str::to_owned),
                    at_ms: self.now_ms(),
                },
            )
            .await?;
        let Reply::Sent {
            event_seq,
            duplicate,
            info,
        } = reply
        else {
            return Err(Error::RunNotFound {
                run_id: run_id.to_owned(),
            });
        };
        tracing::info!(run_id, event, event_seq, duplicate, "event sent");
        if !duplicate {
            self.wake(&info);
        }
        Ok((
            Sent {
                event_seq,
                duplicate,
            },
            info,
        ))
    }

    /// [`check_event`] of the event `event` with the payload `json` for the run `run_id`
    /// ([`send_inner`](Self::send_inner) with `check`), then the declared type's own checks
    /// where this build drives the run's version. A payload that arrived `sealed` (by the
    /// `loops` CLI with a key file, which can check it against the stored schema only) is
    /// opened with this runtime's codec first, so that the name, shape and type are checked
    /// as the run will read it; one this codec cannot open is checked by name only here, and
    /// refused by the store's own check of what arrives sealed.
    ///
    /// # Errors
    /// As [`check_event`]; [`Error::RunNotFound`] if the run does not exist.
    async fn check_sent(&self, run_id: &str, event: &str, json: &str, sealed: bool) -> Result<()> {
        let info = self
            .store()
            .run_info(run_id)
            .await?
            .ok_or_else(|| Error::RunNotFound {
                run_id: run_id.to_owned(),
            })?;
        let opened = match sealed {
            true => self
                .inner
                .payloads
                .open_event_payload(run_id, event, json)
                .ok()
                .flatten(),
            false => None,
        };
        let text = opened.as_deref().unwrap_or(json);
        let declared = match self.store().schema(info.schema).await? {
            Some(description) => check_declared(&info, &description, event, text),
            None => Ok(()),
        };
        let readable = !sealed || opened.is_some();
        let typed = || match readable
            .then(|| self.registry(|r| r.read_event(info.schema, event, text)))
            .flatten()
        {
            Some(Err(problem)) => Err(Error::EventRefused {
                run_id: run_id.to_owned(),
                state: info.state.clone(),
                seq: info.seq,
                event: event.to_owned(),
                refusal: Box::new(EventRefusal::Refused {
                    event: event.to_owned(),
                    problem,
                }),
            }),
            _ => Ok(()),
        };
        ended_first(&info, declared.and_then(|()| typed()))
    }

    /// Cancels the run `run_id`, durably. A run this runtime is driving sees the cancellation
    /// through its [`Context`](crate::Context) and ends as cancelled at its next step or state
    /// boundary; a run nobody drives (parked, or not resumed since a crash) ends as cancelled
    /// at once. With a store shared by several workers, a run that another worker drives
    /// ends as cancelled at its next state boundary, or, if it waits, within 200 ms. A driven
    /// run ends in the state it is in: the attempt in flight may finish its steps (their
    /// records stay), but the store refuses its next state, even a terminal one, so a run
    /// whose cancellation was asked never completes afterwards.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for an empty (or blank) `reason`, or
    /// one with control characters ([`check_cancel_reason`]);
    /// [`Error::RunNotFound`](crate::Error::RunNotFound); [`Error::RunEnded`](crate::Error::RunEnded) if the run has ended already;
    /// [`Error::Storage`](crate::Error::Storage) if the request could not be committed.
    pub async fn cancel(&self, run_id: &str, reason: &str) -> Result<RunInfo> {
        validate_run_id_lookup(run_id)?;
        check_cancel_reason(run_id, reason)?;
        let signals = self.inner.claims.signals(run_id);
        // A run nobody drives ends at once. Another worker (or another runtime on the same
        // store) may drive it: take its lease to know, and hold it meanwhile so that no worker
        // starts driving it. A run driven elsewhere sees the request in the row its next write
        // returns (or, waiting attached on a shared store, when it reads the row again) and
        // ends itself.
        let held = match &signals {
            None => self.store().acquire(run_id).await?,
            Some(_) => None,
        };
        let end_now = signals.is_none() && held.is_some();
        let written = self
            .store()
            .write(
                None,
                Write::Cancel {
                    run_id: run_id.to_owned(),
                    reason: reason.to_owned(),
                    end_now,
                    at_ms: self.now_ms(),
                },
            )
            .await;
        if let Some(lease) = &held
            && let Err(e) = self.store().release(lease).await
        {
            tracing::warn!(run_id, error = %e, "could not release a lease");
        }
        let mut info = written?.into_run(run_id)?;
        if let Some(signals) = signals {
            signals.cancel.cancel();
            // The driver may have been stopping (it parked the run, say) when the request
            // committed: if it no longer holds the run, nobody will see the signal.
            let still_driven = self.inner.claims.is_active(run_id);
            if !still_driven && !info.status.is_ended() {
                info = self
                    .store()
                    .write(
                        None,
                        Write::EndCancelled {
                            run_id: run_id.to_owned(),
                            at_ms: self.now_ms(),
                        },
                    )
                    .await?
                    .into_run(run_id)?;
            }
        }
        if info.status.is_ended() {
            self.inner.background.notify_ended();
            if let Some(parent) = &info.parent {
                self.wake_parent(run_id, &parent.run_id).await;
            }
        }
        self.signal_cancelled_children(run_id).await;
        tracing::info!(run_id, reason, "cancellation requested");
        Ok(info)
    }

    /// Makes a failed run running again with a fresh budget of attempts; drive it again with
    /// [`run`](Self::run) (a registered workflow's run is driven in the background at once).
    /// Attempt numbers count on (each failure record keeps its own): after a failure at
    /// attempt 3, [`RunInfo::attempt`](crate::RunInfo::attempt) stays 3 and the next attempt's
    /// [`Context::attempt`](crate::Context::attempt) is 4; the retry policy counts the budget
    /// from there.
    ///
    /// # Errors
    /// [`Error::RunNotFound`](crate::Error::RunNotFound); [`Error::NotFailed`](crate::Error::NotFailed) if the run is not failed;
    /// [`Error::Storage`](crate::Error::Storage) if the change could not be committed.
    pub async fn retry(&self, run_id: &str) -> Result<RunInfo> {
        validate_run_id_lookup(run_id)?;
        let info = self
            .store()
            .write(
                None,
                Write::Retry {
                    run_id: run_id.to_owned(),
                    at_ms: self.now_ms(),
                },
            )
            .await?
            .into_run(run_id)?;
        self.spawn_driver(&info.workflow, run_id);
        Ok(info)
    }
}
