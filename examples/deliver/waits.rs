//! What the example says while its run waits on a timer: the next try of a step that failed
//! (a model's rate limit or outage, once the call's own quick tries are spent), which loops
//! parks durably when it is longer than the runtime's park threshold. Without this the
//! program would sit silent until the try, for as long as a `Retry-After` asks.

use std::time::Duration;

use loops::{FailureSource, RunInfo, RunStatus, Runtime};

/// How often the run's row is read for a new wait.
const READ_EVERY: Duration = Duration::from_millis(500);

/// Says, once per wait, that the run `run_id` is parked on a timer: for how long, for which
/// step's next try and why it failed, and that stopping now is safe. Reads the run's row
/// every [`READ_EVERY`]; a store that cannot be read is read again later (the drive itself
/// reports store errors). Never returns: drop it to stop.
pub async fn say_timer_waits(runtime: &Runtime, run_id: &str) -> std::convert::Infallible {
    let mut said = None;
    loop {
        if let Ok(Some(info)) = runtime.run_info(run_id).await
            && let Some(until_ms) = timer_wait(&info)
            && said != Some(until_ms)
        {
            said = Some(until_ms);
            let failed = last_failed_step(runtime, &info).await;
            say!("{}", waiting(&info, until_ms, loops::now_ms(), failed));
        }
        tokio::time::sleep(READ_EVERY).await;
    }
}

/// When the run's wait on a timer alone ends (ms since the Unix epoch), if `info` is parked
/// on one: a wait for an event (the approval, a child's end) is said elsewhere.
fn timer_wait(info: &RunInfo) -> Option<u64> {
    let wait = info.wait.as_ref()?;
    (info.status == RunStatus::Waiting && wait.event.is_none())
        .then_some(wait.until_ms)
        .flatten()
}

/// The step of the run's current state that failed last, and its error chain on one line.
async fn last_failed_step(runtime: &Runtime, info: &RunInfo) -> Option<(String, String)> {
    let failures = runtime.store().failures(&info.run_id).await.ok()?;
    failures
        .into_iter()
        .rev()
        .filter(|(seq, _)| *seq == info.state_seq())
        .find_map(|(_, failure)| match failure.source {
            FailureSource::Step { name, .. } => Some((name, failure.errors.join(": "))),
            _ => None,
        })
}

/// The line said for a run parked until `until_ms`, at `now_ms`, after the step `failed`
/// (its name and error), if known.
fn waiting(info: &RunInfo, until_ms: u64, now_ms: u64, failed: Option<(String, String)>) -> String {
    let secs = until_ms.saturating_sub(now_ms).div_ceil(1000);
    let why = match failed {
        Some((step, error)) => format!(
            ", until the next try of its step `{step}` (it failed: {})",
            crate::git::one_line(&error)
        ),
        None => String::new(),
    };
    format!(
        "run {} waits at {} (seq {}) for {secs} s{why}; it holds no task meanwhile: Ctrl-C \
         is safe, and the same command goes on with it",
        info.run_id, info.state, info.seq
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The row of the run `deliver-1`, waiting at `Received` (seq 0) for `wait`.
    pub(crate) fn row(wait: serde_json::Value) -> RunInfo {
        let mut info: RunInfo = serde_json::from_value(serde_json::json!({
            "workflow": "deliver", "schema": "0".repeat(16), "status": "waiting",
            "state": "Received", "seq": 0, "attempt": 1, "created_ms": 0, "updated_ms": 0,
            "wait": wait,
        }))
        .expect("a row");
        // The id is the row's key, not a field of it.
        info.run_id = "deliver-1".to_owned();
        info
    }

    #[test]
    fn a_timer_wait_is_said_with_its_step_and_error() {
        let timer = row(serde_json::json!({"until_ms": 61_000}));
        assert_eq!(timer_wait(&timer), Some(61_000));
        assert_eq!(
            waiting(
                &timer,
                61_000,
                500,
                Some(("plan".to_owned(), "HTTP 429\nRate limit reached".to_owned()))
            ),
            "run deliver-1 waits at Received (seq 0) for 61 s, until the next try of its step \
             `plan` (it failed: HTTP 429; Rate limit reached); it holds no task meanwhile: \
             Ctrl-C is safe, and the same command goes on with it"
        );
        assert_eq!(
            waiting(&timer, 61_000, 61_500, None),
            "run deliver-1 waits at Received (seq 0) for 0 s; it holds no task meanwhile: \
             Ctrl-C is safe, and the same command goes on with it"
        );
        // A wait for an event, with or without a time-out, is not a timer's.
        let event = row(serde_json::json!({"event": "approve", "until_ms": 61_000}));
        assert_eq!(timer_wait(&event), None);
        let mut running = timer.clone();
        running.status = RunStatus::Running;
        assert_eq!(timer_wait(&running), None);
    }
}
