//! `loops cancel`, `loops retry` and `loops send`: the commands that change a run.

use std::io::Read;

use loops_core::{RunInfo, RunStatus};
use serde::Serialize;

use crate::cli::{CancelArgs, DEFAULT_CANCEL_REASON, OutputArg, RetryArgs, SendArgs};
use crate::failure::{Failure, Result, run_id_arg, utf8_arg};
use crate::open::{self, Access, Target};
use crate::operator::{Taker, not_found};
use crate::output::{ID, emit, emit_json, note, paint, status_style};
use crate::view::RunView;

/// Cancels the run.
pub fn cancel(target: &Target, args: &CancelArgs) -> Result<()> {
    let run_id = run_id_arg(&args.run)?;
    // A reason is kept with the run to tell people why it ended: an empty one tells nothing.
    if args.reason.trim().is_empty() {
        return Err(Failure::usage(format!(
            "--reason is empty: say why the run is cancelled, or leave --reason out for the default reason ({DEFAULT_CANCEL_REASON:?})"
        )));
    }
    let store = open::operator(target, Access::Write)?;
    let before = store
        .run(&run_id)?
        .ok_or_else(|| not_found(store.label(), &run_id))?;
    let info = store.cancel(&run_id, &args.reason)?;
    if args.json {
        return emit_json(&RunView::from(&info).with_attributes(store.attributes(&run_id)?));
    }
    // The first reason asked stands (a later one is not recorded).
    let reason = info.cancel.as_deref().unwrap_or(&args.reason);
    if info.status.is_ended() {
        return emit(&format!(
            "{} run {} ({} in state {}, seq {}): {reason}\n",
            paint(status_style(info.status), "cancelled"),
            paint(ID, &run_id),
            before.status,
            before.state,
            before.seq,
        ));
    }
    // Held by a driver (a process serving the store, or another worker of a shared store):
    // the driver ends it, in the state it is in. A waiting driver is woken by the request
    // (in its process) or sees it at its next look at the run's row (another process, every
    // 200 ms at most); a running one stops at its next step or state boundary.
    let when = if info.status == RunStatus::Waiting {
        "its driver stops waiting and ends it as cancelled as soon as it sees the request (at once, or within 200 ms from another process sharing the store)"
    } else {
        "it ends as cancelled at its next step or state boundary"
    };
    let asked = if asked_here(&before, &info, &args.reason) {
        "asked"
    } else {
        "was asked already"
    };
    emit(&format!(
        "cancellation of run {} {asked} ({} in state {}, seq {}): {reason}; {when}, in the state it is in\n",
        paint(ID, &run_id),
        info.status,
        info.state,
        info.seq,
    ))
}

/// Whether this call's cancellation is the one the run records: none was asked when the
/// command read the row (`before`), and the row after the write (`after`) holds this call's
/// `reason`. A concurrent `loops cancel` that committed between the read and the write
/// leaves its own reason (the first stands), so this call says it was asked already.
fn asked_here(before: &RunInfo, after: &RunInfo, reason: &str) -> bool {
    before.cancel.is_none() && after.cancel.as_deref() == Some(reason)
}

/// Makes a failed run running again.
pub fn retry(target: &Target, args: &RetryArgs) -> Result<()> {
    let run_id = run_id_arg(&args.run)?;
    let store = open::operator(target, Access::Write)?;
    let (info, taker) = store.retry(&run_id)?;
    if args.json {
        return emit_json(&RunView::from(&info).with_attributes(store.attributes(&run_id)?));
    }
    let workflow = &info.workflow;
    let who = match taker {
        Taker::Serving => "the process that holds the store takes it up now".to_owned(),
        Taker::NotServed => format!(
            "the process that holds the store does not take it up: it is not driving this run, and does not resume other runs of workflow `{workflow}` (it drives only the runs it was given; the workflow is not registered in it): a process that drives the workflow resumes it when it starts or drives it"
        ),
        Taker::Workers => format!(
            "a worker that serves workflow `{workflow}` takes it up when it next claims ready runs"
        ),
        Taker::NextStart => format!(
            "the process that drives workflow `{workflow}` resumes it when it next starts (Runtime::resume_all) or drives it"
        ),
    };
    emit(&format!(
        "run {} is {} again in state {} (seq {}); its next attempt, number {}, starts a fresh budget of attempts; {who}\n",
        paint(ID, &run_id),
        paint(status_style(info.status), info.status.as_str()),
        info.state,
        info.seq,
        // In u64: the printed number of an attempt that loops refuses to start (u32::MAX + 1).
        u64::from(info.attempt) + 1,
    ))
}

/// `loops send --output json`.
#[derive(Debug, Serialize)]
struct SentView {
    run_id: String,
    event: String,
    event_seq: u64,
    duplicate: bool,
    run: RunView,
}

/// Sends an event to the run.
pub fn send(target: &Target, args: &SendArgs) -> Result<()> {
    let run_id = run_id_arg(&args.run)?;
    let event = utf8_arg("event name", &args.event)?;
    let key = args
        .key
        .as_deref()
        .map(|k| utf8_arg("key", k))
        .transpose()?;
    // Read and checked before the store is opened: a bad payload writes nothing.
    let (from, text) = payload_text(args)?;
    let payload = crate::json::payload(&text)
        .map_err(|problem| Failure::usage(format!("{from} {problem}")))?;
    drop(text);
    let store = open::operator(target, Access::Write)?;
    let before = store
        .run(&run_id)?
        .ok_or_else(|| not_found(store.label(), &run_id))?;
    // The name and payload are checked against the events the run's workflow declares
    // (`Runtime::send_json`, on every path): a refusal writes nothing and exits 2.
    // The events of this name delivered before the send: any other of this name sent before
    // this one (pending then, or sent meanwhile by another sender) is taken first.
    let delivered_before: Vec<u64> = store
        .events(&run_id)?
        .into_iter()
        .filter(|(_, record, delivered)| record.name == event && *delivered)
        .map(|(seq, _, _)| seq)
        .collect();
    let (sent, taker) = store.send(&run_id, &event, key.as_deref(), &payload)?;
    let info = store
        .run(&run_id)?
        .ok_or_else(|| not_found(store.label(), &run_id))?;
    let events = store.events(&run_id)?;
    // The event of this name, sent before this one and not delivered before the send, that
    // a wait takes first (events are taken in the order they were sent): this one then stays
    // in the inbox. None if this one was taken, or is the next to be (a run woken for it that
    // has not read it yet takes it next).
    let delivered_now = events
        .iter()
        .any(|(seq, _, delivered)| *seq == sent.event_seq && *delivered);
    let ahead = (!sent.duplicate && !delivered_now)
        .then(|| {
            events
                .iter()
                .filter(|(seq, record, _)| {
                    record.name == event && *seq < sent.event_seq && !delivered_before.contains(seq)
                })
                .map(|(seq, _, _)| *seq)
                .min()
        })
        .flatten();
    // The key names a request already made, and this one's payload (or name) is not it:
    // this request was not carried out (exit 1), though nothing is wrong with the store.
    if sent.duplicate
        && let Some(other) = other_than_sent(&events, sent.event_seq, &event, payload.get())
    {
        return Err(Failure::new(format!(
            "run `{run_id}`: the event sent with key `{}` (event seq {}) was {other}; this one was not sent: send it with another key if it is a new request",
            key.as_deref().unwrap_or_default(),
            sent.event_seq
        )));
    }
    // Sending ahead of a wait is legitimate, but a run that does not wait for the event now
    // may have been sent the wrong one: said on stderr, in JSON mode too.
    if !sent.duplicate && !waits_for(&before, &event) {
        note(&format!(
            "run {run_id} is not waiting for event `{event}` now ({}); `{event}` is kept in its inbox until a wait for `{event}` takes it",
            now_doing(&before)
        ));
    } else if let Some(first) = ahead {
        // It waits for the event, but takes one sent before this one first.
        note(&format!(
            "run {run_id} takes the `{event}` sent before this one (event seq {first}) first; this one (event seq {}) is kept in its inbox until a wait for `{event}` takes it",
            sent.event_seq
        ));
    }
    if args.output == OutputArg::Json {
        let attributes = store.attributes(&run_id)?;
        return emit_json(&SentView {
            run_id,
            event,
            event_seq: sent.event_seq,
            duplicate: sent.duplicate,
            run: RunView::from(&info).with_attributes(attributes),
        });
    }
    let what = if sent.duplicate {
        format!(
            "an event with key `{}` was sent to run {} already (event seq {}); nothing written",
            key.unwrap_or_default(),
            paint(ID, &run_id),
            sent.event_seq
        )
    } else if ahead.is_some() {
        // Where the event stays was said on stderr above: once is enough.
        format!(
            "sent event `{event}` to run {} (event seq {})",
            paint(ID, &run_id),
            sent.event_seq,
        )
    } else if waits_for(&info, &event) {
        format!(
            "sent event `{event}` to run {} (event seq {}); {}",
            paint(ID, &run_id),
            sent.event_seq,
            delivery(&info, &event, taker)
        )
    } else if waits_for(&before, &event) {
        // A process that holds the store handed it over before the row was read again (the
        // run may be woken and not have read the event yet: it reads it next).
        format!(
            "sent event `{event}` to run {} (event seq {}); the run took it and is {} in state {}",
            paint(ID, &run_id),
            sent.event_seq,
            info.status,
            info.state
        )
    } else {
        // Where the event stays was said on stderr above: once is enough.
        format!(
            "sent event `{event}` to run {} (event seq {})",
            paint(ID, &run_id),
            sent.event_seq,
        )
    };
    emit(&format!("{what}\n"))
}

/// The payload's JSON text, from `--json` or `--json-file` (a file, or stdin for `-`), with
/// where it came from (for messages). A file's (or stdin's) leading UTF-8 byte order mark, as
/// some editors and PowerShell write one, is not part of the JSON text (RFC 8259 lets a
/// parser ignore it; serde_json would refuse it at column 1).
fn payload_text(args: &SendArgs) -> Result<(String, String)> {
    match (&args.payload, &args.json_file) {
        (Some(text), _) => Ok(("--json".to_owned(), text.clone())),
        (None, Some(file)) if file.as_os_str() == "-" => {
            let from = "the payload on stdin (--json-file -)".to_owned();
            let text = read_bounded(std::io::stdin(), &from)?;
            Ok((from, without_bom(text)))
        }
        (None, Some(file)) => {
            let from = format!("--json-file {}", file.display());
            let opened = std::fs::File::open(file)
                .map_err(|e| Failure::usage(format!("cannot read {from}: {e}")))?;
            let text = read_bounded(opened, &from)?;
            Ok((from, without_bom(text)))
        }
        (None, None) => Err(Failure::usage(
            "no payload given: pass --json PAYLOAD or --json-file PATH",
        )),
    }
}

/// What the stored event `event_seq` of `events` was, if not `event` with the same JSON value
/// as `payload` (`event `x` with another payload: {...}`); `None` if it was, or if its
/// payload cannot be read (sealed with a key this process lacks).
fn other_than_sent(
    events: &[(u64, loops_core::EventRecord, bool)],
    event_seq: u64,
    event: &str,
    payload: &str,
) -> Option<String> {
    let (_, stored, _) = events.iter().find(|(seq, _, _)| *seq == event_seq)?;
    let value = |text: &str| serde_json::from_str::<serde_json::Value>(text).ok();
    let (was, now) = (value(stored.payload.get())?, value(payload)?);
    if stored.name != event {
        Some(format!("event `{}`", stored.name))
    } else if was != now {
        Some(format!(
            "`{event}` with another payload: {}",
            crate::json::preview(stored.payload.get(), 60)
        ))
    } else {
        None
    }
}

/// The UTF-8 text `from` (a file, stdin) holds, read to at most
/// [`MAX_BODY_BYTES`](loops_core::control::MAX_BODY_BYTES), the most any loops process takes
/// in one request: an endless stream (`--json-file -` from a pipe that never ends) or a huge
/// file is refused once that much is read, not read into memory whole. A payload under it but
/// over the runtime's limit is refused by the send, with its size.
fn read_bounded(reader: impl Read, from: &str) -> Result<String> {
    let most = loops_core::control::MAX_BODY_BYTES;
    let mut bytes = Vec::new();
    reader
        .take(u64::try_from(most).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| Failure::usage(format!("cannot read {from}: {e}")))?;
    if bytes.len() > most {
        return Err(Failure::usage(format!(
            "cannot read {from}: it is over {} MiB, the most a loops process takes in one request; an event's payload is at most the runtime's max_payload_bytes (2 MiB by default): keep large data outside the store and send a reference to it",
            most / (1024 * 1024)
        )));
    }
    // Checked after the length: a cut at the bound may split a character.
    String::from_utf8(bytes).map_err(|_| {
        Failure::usage(format!(
            "cannot read {from}: stream did not contain valid UTF-8"
        ))
    })
}

/// `text` without its leading UTF-8 byte order mark, if it has one.
fn without_bom(text: String) -> String {
    match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_owned(),
        None => text,
    }
}

/// Whether the run waits for `event` now.
fn waits_for(info: &RunInfo, event: &str) -> bool {
    info.status == RunStatus::Waiting
        && info.wait.as_ref().and_then(|w| w.event.as_deref()) == Some(event)
}

/// What the run does instead of waiting for the event: `it waits for event `x``, `it is
/// running`.
fn now_doing(info: &RunInfo) -> String {
    match info.wait.as_ref().and_then(|w| w.event.as_deref()) {
        Some(other) if info.status == RunStatus::Waiting => {
            format!("it waits for event `{other}` in state {}", info.state)
        }
        _ if info.status == RunStatus::Waiting => {
            format!("it waits for a time in state {}", info.state)
        }
        _ => format!("it is {} in state {}", info.status, info.state),
    }
}

/// When the event will be taken, as far as the run's row and `taker` tell.
pub fn delivery(info: &RunInfo, event: &str, taker: Taker) -> String {
    let waits_for = info.wait.as_ref().and_then(|w| w.event.as_deref());
    match info.status {
        RunStatus::Waiting if waits_for == Some(event) => match taker {
            Taker::Serving => {
                "the run waits for it, and the process that holds the store hands it over now"
                    .to_owned()
            }
            Taker::NotServed => format!(
                "the run waits for it, but the process that holds the store does not take it up: it is not driving this run, and does not resume other runs of workflow `{}` (it drives only the runs it was given; the workflow is not registered in it): a process that drives the workflow takes it when it drives the run",
                info.workflow
            ),
            Taker::Workers => format!(
                "the run waits for it; a worker that serves workflow `{}` takes it when it next claims ready runs",
                info.workflow
            ),
            Taker::NextStart => format!(
                "the run waits for it and takes it when a process that drives workflow `{}` next starts, if the workflow's type reads it (checked here against the stored schema only: a value the type refuses is set aside, as `loops history` shows)",
                info.workflow
            ),
        },
        RunStatus::Waiting => format!(
            "the run waits for {} now; the event stays in its inbox until a wait for `{event}` takes it",
            waits_for.map_or_else(|| "a time".to_owned(), |e| format!("event `{e}`"))
        ),
        _ => format!(
            "the run is {}; the event stays in its inbox until a wait for `{event}` takes it",
            info.status
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::asked_here;
    use loops_core::RunInfo;

    fn row(cancel: Option<&str>) -> RunInfo {
        serde_json::from_value(serde_json::json!({
            "run_id": "m0", "workflow": "work", "schema": "0000000000000009",
            "status": "running", "state": "Run", "seq": 3, "attempt": 1,
            "created_ms": 0, "updated_ms": 0, "cancel": cancel,
        }))
        .unwrap()
    }

    /// Five concurrent `loops cancel`s: only the one whose reason the run records says it
    /// asked; one that read no cancellation but lost the race to another says it was asked
    /// already (before, it said "asked" and showed the winner's reason as its own).
    #[test]
    fn only_the_cancellation_recorded_says_it_was_asked() {
        assert!(asked_here(&row(None), &row(Some("r5")), "r5"));
        assert!(!asked_here(&row(None), &row(Some("r5")), "r1"));
        assert!(!asked_here(&row(Some("r5")), &row(Some("r5")), "r5"));
    }
}
