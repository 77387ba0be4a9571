//! What `--json` prints: stable shapes with documented field names (see the README), built
//! from loops-core's records. Every field is always present (`null` when it has no value).

use loops_core::{Attributes, StepRecord};
use loops_core::{BlockInfo, EventRecord, FailureRecord, FailureSource, RunInfo, RunStatus};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::output::{coarse, relative, rfc3339};

/// One run's row.
#[derive(Debug, Serialize)]
pub struct RunView {
    /// The run id.
    pub run_id: String,
    /// The workflow's name.
    pub workflow: String,
    /// `running`, `waiting`, `completed`, `failed`, `cancelled` or `blocked`.
    pub status: RunStatus,
    /// The current state's name.
    pub state: String,
    /// The current state's sequence number.
    pub seq: u64,
    /// The number of the latest attempt started at the current state, from 1 (the handler's
    /// `ctx.attempt()`). It counts on after `loops retry`: the retry resets the budget of
    /// attempts, not their numbers.
    pub attempt: u32,
    /// When the run was created (RFC 3339, UTC).
    pub created_at: String,
    /// The same, in ms since the Unix epoch.
    pub created_ms: u64,
    /// When the run last changed (RFC 3339, UTC).
    pub updated_at: String,
    /// The same, in ms since the Unix epoch.
    pub updated_ms: u64,
    /// What a waiting run waits for.
    pub waiting_for: Option<WaitView>,
    /// When a run that failed an attempt may start the next one (RFC 3339, UTC; a time after
    /// year 9999 as `after year 9999 (MS ms since the Unix epoch)`).
    pub retry_at: Option<String>,
    /// The same, in ms since the Unix epoch.
    pub retry_at_ms: Option<u64>,
    /// The last failed attempt's error chain, outermost first.
    pub error: Option<Vec<String>>,
    /// The reason the run was cancelled (or asked to be).
    pub cancel_reason: Option<String>,
    /// The run that started this one as its child (`Context::start_child`), if any.
    pub parent: Option<String>,
    /// The schema hash the run was recorded with (16 hex digits).
    pub schema: String,
    /// Why a blocked run is blocked.
    pub blocked: Option<BlockView>,
    /// For a failed run: after how many attempts it gave up, and how many of them the
    /// process's stops cut short.
    pub gave_up: Option<GaveUpView>,
    /// The run's searchable attributes by key (`{"str": S}`, `{"int": N}` or
    /// `{"time_ms": MS}`; `{}` if none). Every command's `--json` reads them; `null` only
    /// where a view is built without them.
    pub attributes: Option<Attributes>,
}

impl RunView {
    /// Whether the run waits for its children now (a join: the event
    /// [`loops_core::CHILD_ENDED`]).
    pub fn waits_for_children(&self) -> bool {
        self.status == RunStatus::Waiting
            && self.waiting_for.as_ref().and_then(|w| w.event.as_deref())
                == Some(loops_core::CHILD_ENDED)
    }

    /// The view with the run's attributes.
    pub fn with_attributes(mut self, attributes: Attributes) -> Self {
        self.attributes = Some(attributes);
        self
    }
}

/// After how many attempts a failed run gave up: a last error of "the process stopped" alone
/// hides that the budget ran out on interruptions.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct GaveUpView {
    /// The attempts of its last budget (since `loops retry`, if it was retried).
    pub attempts: u32,
    /// How many of them were cut short by the process stopping.
    pub interrupted: u32,
}

impl GaveUpView {
    /// For a failed run, its attempts; `None` for any other.
    pub fn of(info: &RunInfo) -> Option<GaveUpView> {
        (info.status == RunStatus::Failed).then(|| GaveUpView {
            attempts: info.attempt.saturating_sub(info.attempt_base),
            interrupted: info.interrupted,
        })
    }

    /// In words: `after 10 attempts, 10 of them interrupted (...)`.
    pub fn text(&self) -> String {
        let attempts = self.attempts;
        let s = crate::output::plural(attempts);
        match self.interrupted {
            0 => format!("after {attempts} attempt{s}"),
            1 if attempts == 1 => {
                "after 1 attempt, interrupted (the process stopped, or lost the run's lease, while it ran)".to_owned()
            }
            n => format!(
                "after {attempts} attempt{s}, {n} of them interrupted (the process stopped, or lost the run's lease, while they ran)"
            ),
        }
    }
}

/// Why a run is blocked: what the build that blocked it said.
#[derive(Debug, Serialize)]
pub struct BlockView {
    /// One sentence: why that build cannot drive it.
    pub reason: String,
    /// The changes of the schema that stop it, one line each (may be empty).
    pub changes: Vec<String>,
    /// The run's schema hash when it was blocked.
    pub schema: String,
    /// When it was blocked (RFC 3339, UTC).
    pub at: String,
    /// The same, in ms since the Unix epoch.
    pub at_ms: u64,
    /// The status it goes back to when a build that can drive it takes it.
    pub resume: RunStatus,
}

impl From<&BlockInfo> for BlockView {
    fn from(block: &BlockInfo) -> Self {
        BlockView {
            reason: block.reason.clone(),
            changes: block.changes.clone(),
            schema: block.schema.to_string(),
            at: rfc3339(block.at_ms),
            at_ms: block.at_ms,
            resume: block.resume,
        }
    }
}

/// What a waiting run waits for.
#[derive(Debug, Serialize)]
pub struct WaitView {
    /// The event's name, if it waits for one.
    pub event: Option<String>,
    /// When the wait ends on its own (RFC 3339, UTC; a time after year 9999, as a sleep or
    /// time-out too long to count records, as `after year 9999 (MS ms since the Unix epoch)`),
    /// if it does.
    pub until: Option<String>,
    /// The same, in ms since the Unix epoch.
    pub until_ms: Option<u64>,
}

impl From<&RunInfo> for RunView {
    fn from(info: &RunInfo) -> Self {
        RunView {
            run_id: info.run_id.clone(),
            workflow: info.workflow.clone(),
            status: info.status,
            state: info.state.clone(),
            seq: info.seq,
            attempt: info.attempt,
            created_at: rfc3339(info.created_ms),
            created_ms: info.created_ms,
            updated_at: rfc3339(info.updated_ms),
            updated_ms: info.updated_ms,
            waiting_for: info
                .wait
                .as_ref()
                .filter(|_| info.status == RunStatus::Waiting)
                .map(|w| WaitView {
                    event: w.event.clone(),
                    until: w.until_ms.map(rfc3339),
                    until_ms: w.until_ms,
                }),
            retry_at: info.retry_at_ms.map(rfc3339),
            retry_at_ms: info.retry_at_ms,
            error: info.error.clone(),
            cancel_reason: info.cancel.clone(),
            parent: info.parent.as_ref().map(|p| p.run_id.clone()),
            schema: info.schema.to_string(),
            blocked: info
                .block
                .as_ref()
                .filter(|_| info.status == RunStatus::Blocked)
                .map(BlockView::from),
            gave_up: GaveUpView::of(info),
            attributes: None,
        }
    }
}

/// What the run waits for, in a few words (empty when nothing): `event approval`,
/// `event note, until in 29s`, `time, in 1m 20s`, `retry in 3s`, `cancellation`,
/// `blocked: REASON`.
pub fn waiting_text(info: &RunInfo, now_ms: u64) -> String {
    match info.status {
        RunStatus::Waiting => match info.wait.as_ref() {
            Some(w) => match (&w.event, w.until_ms) {
                (Some(event), Some(until)) => {
                    format!("event {event}, until {}", relative(until, now_ms))
                }
                (Some(event), None) => format!("event {event}"),
                (None, Some(until)) if until > now_ms => {
                    format!("time, {}", relative(until, now_ms))
                }
                (None, Some(until)) => format!("time, due {}", relative(until, now_ms)),
                (None, None) => String::new(),
            },
            None => String::new(),
        },
        RunStatus::Blocked => match &info.block {
            Some(block) => format!("blocked: {}", block.reason),
            None => "blocked".to_owned(),
        },
        RunStatus::Running if info.cancel.is_some() => "cancellation".to_owned(),
        RunStatus::Running => match info.retry_at_ms {
            Some(at) if at > now_ms => format!("retry in {}", coarse(at - now_ms)),
            _ => String::new(),
        },
        _ => String::new(),
    }
}

/// One step record.
#[derive(Debug, Serialize)]
pub struct StepView {
    /// The step's name.
    pub name: String,
    /// Which use of the name within the state's handler, from 0.
    pub occurrence: u32,
    /// The attempt that recorded it.
    pub attempt: u32,
    /// When it was recorded (RFC 3339, UTC).
    pub at: String,
    /// The same, in ms since the Unix epoch.
    pub at_ms: u64,
    /// How long the step ran, in ms.
    pub duration_ms: u64,
    /// Its output, as stored.
    pub output: Box<RawValue>,
}

impl StepView {
    /// The view of a step record.
    pub fn new(name: String, occurrence: u32, record: StepRecord) -> Self {
        StepView {
            name,
            occurrence,
            attempt: record.attempt,
            at: rfc3339(record.at_ms),
            at_ms: record.at_ms,
            duration_ms: record.duration_ms,
            output: record.output,
        }
    }
}

/// One failed attempt.
#[derive(Debug, Serialize)]
pub struct FailureView {
    /// The attempt, from 1.
    pub attempt: u32,
    /// When it failed (RFC 3339, UTC).
    pub at: String,
    /// The same, in ms since the Unix epoch.
    pub at_ms: u64,
    /// What failed: `{"kind": "handler"}`, `{"kind": "step", "name", "occurrence"}` or
    /// `{"kind": "interrupted"}` (the process stopped during the attempt).
    pub source: FailureSource,
    /// The error chain, outermost first.
    pub errors: Vec<String>,
}

impl From<FailureRecord> for FailureView {
    fn from(r: FailureRecord) -> Self {
        FailureView {
            attempt: r.attempt,
            at: rfc3339(r.at_ms),
            at_ms: r.at_ms,
            source: r.source,
            errors: r.errors,
        }
    }
}

/// One event in a run's inbox.
#[derive(Debug, Serialize)]
pub struct EventView {
    /// The event's sequence number in the run's inbox, from 0.
    pub event_seq: u64,
    /// The event's name.
    pub name: String,
    /// The idempotency key it was sent with.
    pub key: Option<String>,
    /// When it was sent (RFC 3339, UTC).
    pub at: String,
    /// The same, in ms since the Unix epoch.
    pub at_ms: u64,
    /// Whether a wait has taken it (otherwise it is pending).
    pub delivered: bool,
    /// Why the wait that took it set it aside (its payload is not the type the wait reads:
    /// the error's innermost cause), if it did: it was taken, and did not count as the event.
    /// Known to `loops history`, which reads the waits' records; `None` elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_aside: Option<String>,
    /// Its payload, as stored.
    pub payload: Box<RawValue>,
}

/// What became of an event in a run's inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFate {
    /// A wait took it.
    Delivered,
    /// A wait took it and set it aside: its payload is not the type the wait reads.
    SetAside,
    /// A wait of the run may still take it.
    Pending,
    /// The run completed or was cancelled before a wait took it, and no wait will: it stays
    /// in the inbox, for inspection, until the run is pruned (an approval sent twice).
    NotTaken,
    /// A child's end ([`loops_core::CHILD_ENDED`]) that no wait took, in a run that does not
    /// wait for its children now (it went on, or ended): a wake-up its join did not need (the
    /// join read the child's row), not an event the run missed or is yet to take.
    NotNeeded,
}

impl EventFate {
    /// Its word in the CLI's tables: `delivered`, `set aside (not its type)`, `pending`, `not
    /// taken (run ended)`, `not needed (join read the child)`.
    pub fn text(self) -> &'static str {
        match self {
            EventFate::Delivered => "delivered",
            EventFate::SetAside => "set aside (not its type)",
            EventFate::Pending => "pending",
            EventFate::NotTaken => "not taken (run ended)",
            EventFate::NotNeeded => "not needed (join read the child)",
        }
    }
}

impl EventView {
    /// What became of the event, in the run `run`: see [`EventFate`]. (The one rule `show`,
    /// `history` and the web UI follow.)
    pub fn fate(&self, run: &RunView) -> EventFate {
        if self.set_aside.is_some() {
            EventFate::SetAside
        } else if self.delivered {
            EventFate::Delivered
        } else if self.name == loops_core::CHILD_ENDED && !run.waits_for_children() {
            EventFate::NotNeeded
        } else if matches!(run.status, RunStatus::Completed | RunStatus::Cancelled) {
            EventFate::NotTaken
        } else {
            EventFate::Pending
        }
    }

    /// The view of an inbox entry.
    pub fn new(event_seq: u64, record: EventRecord, delivered: bool) -> Self {
        EventView {
            event_seq,
            name: record.name,
            key: record.key,
            at: rfc3339(record.at_ms),
            at_ms: record.at_ms,
            delivered,
            set_aside: None,
            payload: record.payload,
        }
    }
}

/// A run's current attempt in words: `attempt N`, or, for 0, that none is begun yet (a run
/// queued by `Runtime::enqueue`, or let go by a draining driver at a state it had just
/// entered). For `loops show` and the UI's run page.
pub fn attempt_text(attempt: u32) -> String {
    match attempt {
        0 => "no attempt begun yet".to_owned(),
        n => format!("attempt {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str, delivered: bool) -> EventView {
        EventView {
            event_seq: 0,
            name: name.to_owned(),
            key: None,
            at: String::new(),
            at_ms: 0,
            delivered,
            set_aside: None,
            payload: RawValue::from_string("null".to_owned()).unwrap(),
        }
    }

    /// A run in `status`, waiting (if it is) for `event`.
    fn run(status: RunStatus, event: Option<&str>) -> RunView {
        let mut info: RunInfo = serde_json::from_value(serde_json::json!({
            "run_id": "r", "workflow": "w", "schema": "0000000000000009",
            "status": status.as_str(), "state": "A", "seq": 0, "attempt": 1,
            "created_ms": 0, "updated_ms": 0,
        }))
        .unwrap();
        info.wait = event.map(|e| loops_core::WaitInfo {
            event: Some(e.to_owned()),
            until_ms: None,
        });
        RunView::from(&info)
    }

    #[test]
    fn a_childs_end_no_wait_took_was_not_needed_unless_the_run_waits_for_its_children() {
        let ended = event(loops_core::CHILD_ENDED, false);
        let approval = event("approve", false);
        for status in [RunStatus::Completed, RunStatus::Cancelled] {
            assert_eq!(ended.fate(&run(status, None)), EventFate::NotNeeded);
            assert_eq!(approval.fate(&run(status, None)), EventFate::NotTaken);
        }
        // A live run that went on from its join (waiting for an approval, say): a wake-up
        // the join did not need, not an event it is yet to take.
        for status in [RunStatus::Running, RunStatus::Failed] {
            assert_eq!(ended.fate(&run(status, None)), EventFate::NotNeeded);
            assert_eq!(approval.fate(&run(status, None)), EventFate::Pending);
        }
        let waiting = run(RunStatus::Waiting, Some("approve"));
        assert_eq!(ended.fate(&waiting), EventFate::NotNeeded);
        assert_eq!(approval.fate(&waiting), EventFate::Pending);
        let joining = run(RunStatus::Waiting, Some(loops_core::CHILD_ENDED));
        assert_eq!(ended.fate(&joining), EventFate::Pending);
        assert_eq!(
            event(loops_core::CHILD_ENDED, true).fate(&run(RunStatus::Completed, None)),
            EventFate::Delivered
        );
        assert_eq!(
            EventFate::NotNeeded.text(),
            "not needed (join read the child)"
        );
    }
}
