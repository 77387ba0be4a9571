//! The schedule of a step's tries under a retry policy in place. Each failed try is
//! recorded beside the step, under the reserved name `loops:try:{occurrence}:{name}` (its
//! own occurrences count the failed tries), with its number and the time of the next try
//! (none when the step gave up). A re-execution of the handler (after a parked back-off, a
//! restart, a retry of the state) reads them back: in the middle of a schedule it waits for
//! the recorded time and goes on with the next try; after a schedule that ended, the step
//! starts a fresh one.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::names::RESERVED_PREFIX;
use crate::retry::RetryPolicy;
use crate::run::context::Context;

/// One failed try, as recorded.
#[derive(Debug, Serialize, Deserialize)]
struct TryRecord {
    /// The try, from 1, in its schedule.
    #[serde(rename = "try")]
    try_no: u32,
    /// When the next try may start, ms since the Unix epoch; `None`: the step gave up.
    retry_at_ms: Option<u64>,
}

/// Where a step stands in its schedule of tries.
pub(super) struct Tries {
    /// The reserved name its failed tries are recorded under.
    record_name: String,
    /// The occurrence of the next failed-try record.
    next_record: u32,
    /// Failed tries of the current schedule.
    failed: u32,
    /// When the next try may start, if the current schedule set a time.
    next_at_ms: Option<u64>,
    /// Whether failed tries are recorded: only under a policy of more than one try (a
    /// single try has no schedule to keep).
    keep: bool,
}

impl Tries {
    /// When the next try may start, if it must wait.
    pub(super) fn next_at_ms(&self) -> Option<u64> {
        self.next_at_ms
    }

    /// The number of the next try, from 1.
    pub(super) fn next_try(&self) -> u32 {
        self.failed.saturating_add(1)
    }

    /// Records that try `try_no` failed, with the time of the next try (`None`: the step
    /// gives up, and its next execution starts a fresh schedule).
    pub(super) async fn failed(
        &mut self,
        ctx: &Context,
        try_no: u32,
        retry_at_ms: Option<u64>,
    ) -> Result<()> {
        if self.keep {
            let record = TryRecord {
                try_no,
                retry_at_ms,
            };
            ctx.record_step(&self.record_name, self.next_record, &record, 0)
                .await?;
            self.next_record = self.next_record.saturating_add(1);
        }
        (self.failed, self.next_at_ms) = match retry_at_ms {
            Some(at) => (try_no, Some(at)),
            None => (0, None),
        };
        Ok(())
    }
}

impl Context {
    /// The schedule of the step `(name, occurrence)`, from its recorded failed tries.
    ///
    /// # Errors
    /// [`Error::StepDecode`](crate::Error::StepDecode) if a failed-try record does not
    /// decode.
    pub(super) fn tries(&self, name: &str, occurrence: u32, policy: RetryPolicy) -> Result<Tries> {
        let record_name = format!("{RESERVED_PREFIX}try:{occurrence}:{name}");
        let mut tries = Tries {
            record_name,
            next_record: 0,
            failed: 0,
            next_at_ms: None,
            keep: policy.max_attempts > 1,
        };
        while let Some(record) = self.take_record(&tries.record_name, tries.next_record) {
            let done: TryRecord =
                self.decode_step(&tries.record_name, tries.next_record, &record.output)?;
            tries.next_record = tries.next_record.saturating_add(1);
            (tries.failed, tries.next_at_ms) = match done.retry_at_ms {
                Some(at) => (done.try_no, Some(at)),
                None => (0, None),
            };
        }
        if tries.failed > 0 {
            tracing::info!(
                step = name,
                occurrence,
                failed = tries.failed,
                next_at_ms = tries.next_at_ms,
                "step resumes its schedule of tries"
            );
        }
        Ok(tries)
    }
}
