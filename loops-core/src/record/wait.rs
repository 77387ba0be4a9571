//! The records a wait for an event writes, read and written here only: the wait's outcome as
//! a step record named `loops:wait:{event}` (its output `"due"`, or
//! `{"event": {"seq": N, "payload": ...}}`), and, for an event the wait set aside (a payload
//! its type does not read), a failure record of the same step and occurrence.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::names::RESERVED_PREFIX;
use crate::record::{FailureRecord, FailureSource, StepRecord};

/// What follows [`RESERVED_PREFIX`] in a wait's step name.
const WAIT: &str = "wait:";

/// The name of the step record of a wait for `event`: `loops:wait:{event}`.
pub fn wait_step_name(event: &str) -> String {
    format!("{RESERVED_PREFIX}{WAIT}{event}")
}

/// The event a step record named `name` waited for, if it is a wait's record.
pub fn waited_event(name: &str) -> Option<&str> {
    name.strip_prefix(RESERVED_PREFIX)?.strip_prefix(WAIT)
}

/// A wait's recorded outcome, as its step record's output holds it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WaitOutput<P> {
    /// The wait's time-out came first.
    Due,
    /// The event with sequence number `seq` in the run's inbox was delivered, with `payload`.
    Event {
        /// Its seq in the run's inbox.
        seq: u64,
        /// Its payload, as the store holds it.
        payload: P,
    },
}

/// The output recorded for a wait that took the event `event_seq` with `payload` (JSON).
pub(crate) fn delivered_output(event_seq: u64, payload: &str) -> String {
    format!(r#"{{"event":{{"seq":{event_seq},"payload":{payload}}}}}"#)
}

/// The seq of the event a wait's recorded `output` took; `None` for a time-out or an output
/// that is not a wait's.
pub fn taken_event(output: &RawValue) -> Option<u64> {
    match serde_json::from_str::<WaitOutput<&RawValue>>(output.get()) {
        Ok(WaitOutput::Event { seq, .. }) => Some(seq),
        _ => None,
    }
}

/// The events a run's waits set aside (payloads their type did not read), by event seq, each
/// with why (the innermost cause of its failure record), from the run's step records `steps`
/// (`(seq, name, occurrence, record)`, as a store's `all_steps` gives them) and its failure
/// records `failures` (`(seq, record)`): a wait records the event it takes as its step, and
/// one it sets aside with a failure record of the same step and occurrence at the same seq.
pub fn set_aside_events(
    steps: &[(u64, String, u32, StepRecord)],
    failures: &[(u64, FailureRecord)],
) -> BTreeMap<u64, String> {
    let mut set_aside = BTreeMap::new();
    for (seq, failure) in failures {
        let FailureSource::Step { name, occurrence } = &failure.source else {
            continue;
        };
        if waited_event(name).is_none() {
            continue;
        }
        let taken = steps
            .iter()
            .find(|(at, step, n, _)| at == seq && step == name && n == occurrence)
            .and_then(|(.., record)| taken_event(&record.output));
        if let Some(event_seq) = taken {
            let why = failure.errors.last().cloned().unwrap_or_default();
            set_aside.insert(event_seq, why);
        }
    }
    set_aside
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(seq: u64, name: &str, occurrence: u32, output: &str) -> (u64, String, u32, StepRecord) {
        let record = StepRecord {
            attempt: 1,
            at_ms: 0,
            duration_ms: 0,
            output: RawValue::from_string(output.to_owned()).unwrap(),
        };
        (seq, name.to_owned(), occurrence, record)
    }

    fn failure(name: &str, occurrence: u32, errors: &[&str]) -> FailureRecord {
        FailureRecord {
            attempt: 1,
            at_ms: 0,
            source: FailureSource::Step {
                name: name.to_owned(),
                occurrence,
            },
            errors: errors.iter().map(|e| (*e).to_owned()).collect(),
        }
    }

    #[test]
    fn names_and_outputs_read_back() {
        assert_eq!(wait_step_name("approve"), "loops:wait:approve");
        assert_eq!(waited_event("loops:wait:approve"), Some("approve"));
        assert_eq!(waited_event("loops:deadline:approve"), None);
        assert_eq!(waited_event("plan"), None);
        let output = delivered_output(7, r#"{"by":"ann"}"#);
        assert_eq!(output, r#"{"event":{"seq":7,"payload":{"by":"ann"}}}"#);
        let raw = RawValue::from_string(output).unwrap();
        assert_eq!(taken_event(&raw), Some(7));
        let due = RawValue::from_string(r#""due""#.to_owned()).unwrap();
        assert_eq!(taken_event(&due), None);
    }

    #[test]
    fn a_set_aside_event_is_paired_with_its_waits_step_at_the_same_seq() {
        let wait = "loops:wait:approve";
        let steps = [
            step(3, wait, 0, &delivered_output(0, r#"{"by":""}"#)),
            step(3, wait, 1, &delivered_output(1, r#"{"by":"ann"}"#)),
            // Another state's wait of the same name and occurrence.
            step(5, wait, 0, &delivered_output(2, r#"{"by":3}"#)),
            step(3, "plan", 0, r#"{"event":{"seq":9,"payload":1}}"#),
        ];
        let failures = [
            (3, failure(wait, 0, &["does not decode", "\"by\" is blank"])),
            // A step that is no wait's: not an event's.
            (3, failure("plan", 0, &["HTTP 500"])),
            (
                3,
                FailureRecord {
                    source: FailureSource::Handler,
                    ..failure(wait, 0, &["x"])
                },
            ),
        ];
        assert_eq!(
            set_aside_events(&steps, &failures),
            BTreeMap::from([(0, "\"by\" is blank".to_owned())])
        );
    }
}
