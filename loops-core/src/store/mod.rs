//! Run metadata and the store that keeps runs' records.
//!
//! [`RedbStore`] is the embedded store: one redb file, owned by one process. Its commit path
//! (group commit on a writer thread) is in [`redb`].

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::schema::SchemaHash;

pub mod redb;

pub use self::redb::{Compacted, EventRecord, Pruned, RedbStore, StoreOptions};

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The run has not ended: it is being driven, or will be when it is next resumed.
    Running,
    /// The run is parked until an event arrives or a time passes ([`RunInfo::wait`] says
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

/// A run's current standing: the one mutable row per run, updated in the same commit as the
/// immutable record that changes it. Listing and resuming read this, never the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    /// The run id (the row's key; not repeated in the stored value).
    #[serde(skip)]
    pub run_id: String,
    /// The workflow name.
    pub workflow: String,
    /// The pinned schema hash the run was started with.
    pub schema: SchemaHash,
    /// Where the run stands.
    pub status: RunStatus,
    /// The current state's name.
    pub state: String,
    /// The current state's sequence number (the latest transition record's key).
    pub seq: u64,
    /// Attempts started at handling the current state, from 1 (counting on across an
    /// explicit retry of a failed run).
    pub attempt: u32,
    /// Attempts made before the last explicit retry of a failed run: the retry policy's
    /// budget counts from here.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt_base: u32,
    /// When the run was created, in ms since the Unix epoch.
    pub created_ms: u64,
    /// When this row last changed, in ms since the Unix epoch.
    pub updated_ms: u64,
    /// When the next attempt may start (after a failure), in ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at_ms: Option<u64>,
    /// The last failed attempt's error chain, outermost first; cleared by a transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Vec<String>>,
    /// The reason given when the run was cancelled (or asked to be).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<String>,
    /// What a waiting run waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitInfo>,
}

/// What a [waiting](RunStatus::Waiting) run waits for: an event, a time, or an event until a
/// time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitInfo {
    /// The event's name, when it waits for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// When the wait ends on its own (a sleep's wake-up or a wait's time-out), in ms since
    /// the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
