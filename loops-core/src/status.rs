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
}

impl RunStatus {
    /// Every status, in index order.
    pub const ALL: [RunStatus; 5] = [
        RunStatus::Running,
        RunStatus::Waiting,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    /// Whether the run has ended (completed, failed or cancelled).
    pub fn is_ended(self) -> bool {
        !matches!(self, RunStatus::Running | RunStatus::Waiting)
    }

    /// The lowercase name (`"running"`).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            RunStatus::Running => 0,
            RunStatus::Completed => 1,
            RunStatus::Failed => 2,
            RunStatus::Cancelled => 3,
            RunStatus::Waiting => 4,
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
