//! Where a run stands: [`RunStatus`], stored in every run's row and its status index.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The run has not ended: it is being driven, or will be when it is next resumed.
    Running,
    /// The run is parked until an event arrives or a time passes ([`RunInfo::wait`](crate::RunInfo::wait) says
    /// which); it holds no task while it waits.
    Waiting,
    /// The run reached a terminal state.
    Completed,
    /// The run's retry policy ran out of attempts; [`Runtime::retry`](crate::Runtime::retry)
    /// makes it running again.
    Failed,
    /// The run was cancelled.
    Cancelled,
    /// No version of its workflow that this build (or the last build that looked at it)
    /// compiles can drive the run: its records have a schema that no registered version
    /// has, accepts, or migrates from, or its migration failed.
    /// [`RunInfo::block`](crate::RunInfo::block) says why and what changed. A blocked run is
    /// not ended and never needs a driver: it is left alone (never retried) until a build
    /// that can route it starts, or registers the version or migration it lacks, and
    /// unblocks it. See docs/evolution.md.
    Blocked,
}

impl RunStatus {
    /// Every status, in index order.
    pub const ALL: [RunStatus; 6] = [
        RunStatus::Running,
        RunStatus::Waiting,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::Blocked,
    ];

    /// Whether the run has ended (completed, failed or cancelled). A blocked run has not.
    pub fn is_ended(self) -> bool {
        !matches!(
            self,
            RunStatus::Running | RunStatus::Waiting | RunStatus::Blocked
        )
    }

    /// The lowercase name (`"running"`).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Blocked => "blocked",
        }
    }

    /// The status whose [`code`](Self::code) is `code`; `None` for a code no status has.
    pub(crate) fn from_code(code: u8) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|s| s.code() == code)
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            RunStatus::Running => 0,
            RunStatus::Completed => 1,
            RunStatus::Failed => 2,
            RunStatus::Cancelled => 3,
            RunStatus::Waiting => 4,
            RunStatus::Blocked => 5,
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
