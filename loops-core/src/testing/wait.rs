//! Waiting, in a test, until a run reaches a state, a status or any condition.

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::runtime::Runtime;
use crate::store::{RunInfo, RunStatus};

/// How long the `wait_*` methods of [`Runtime`] wait, by the real clock, before they give
/// up: 10 s. A wait that should succeed returns as soon as the run gets there; this only
/// bounds a test that would otherwise hang.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the `wait_*` methods look at the run's row (real time).
const LOOK_EVERY: Duration = Duration::from_millis(2);

/// What a run looked like when a wait gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastSeen {
    /// Its status.
    pub status: RunStatus,
    /// Its current state.
    pub state: String,
    /// Its latest sequence number.
    pub seq: u64,
    /// Its last error, outermost first, if it failed an attempt.
    pub error: Option<Vec<String>>,
}

impl LastSeen {
    fn of(info: RunInfo) -> LastSeen {
        LastSeen {
            status: info.status,
            state: info.state,
            seq: info.seq,
            error: info.error,
        }
    }
}

impl std::fmt::Display for LastSeen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status {}, state `{}`, seq {}",
            self.status.as_str(),
            self.state,
            self.seq
        )?;
        if let Some(error) = &self.error {
            write!(f, ", last error: {}", error.join(": "))?;
        }
        Ok(())
    }
}

/// Why a `wait_*` method of [`Runtime`] returned without the run getting there.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The time-out passed first.
    #[error(
        "run `{run_id}`: waited {waited_ms} ms for {what}; it never got there (last seen: {})",
        last.as_ref().map_or_else(|| "no such run".to_owned(), ToString::to_string)
    )]
    TimedOut {
        /// The run.
        run_id: String,
        /// What the wait waited for, in words.
        what: String,
        /// How long it waited, real time, in ms.
        waited_ms: u64,
        /// The run as last seen (`None`: the run does not exist).
        last: Option<LastSeen>,
    },
    /// The run ended (completed or cancelled: it moves no more) without getting there: said
    /// at once. (A failed run may be retried, and is waited for.)
    #[error(
        "run `{run_id}`: waited for {what}, and the run has ended without getting there ({last})"
    )]
    Ended {
        /// The run.
        run_id: String,
        /// What the wait waited for, in words.
        what: String,
        /// The run as it ended.
        last: LastSeen,
    },
    /// The state waited for is none of the run's workflow (a misspelt name): said at once.
    #[error(
        "run `{run_id}`: workflow `{workflow}` has no state `{state}` to wait for (its states: {})",
        states.join(", ")
    )]
    NoSuchState {
        /// The run.
        run_id: String,
        /// Its workflow.
        workflow: String,
        /// The state asked for.
        state: String,
        /// The workflow's states, as its schema (the run's) declares them.
        states: Vec<String>,
    },
    /// Reading the run's row failed.
    #[error("run `{run_id}`: could not read the run while waiting for {what}: {source}")]
    Store {
        /// The run.
        run_id: String,
        /// What the wait waited for.
        what: String,
        /// The store's error.
        source: Error,
    },
}

impl Runtime {
    /// Waits until `condition` holds for the row of `run_id` (looked at every 2 ms of real
    /// time), for at most [`DEFAULT_WAIT_TIMEOUT`]; returns the row it held for. For tests
    /// (feature `testing`): a replacement for a loop over [`run_info`](Self::run_info).
    ///
    /// # Errors
    /// [`WaitError::TimedOut`] naming the run's last status, state and seq;
    /// [`WaitError::Ended`] at once if the run has completed or been cancelled without the
    /// condition holding; [`WaitError::Store`] if its row cannot be read.
    pub async fn wait_until(
        &self,
        run_id: &str,
        condition: impl Fn(&RunInfo) -> bool,
    ) -> Result<RunInfo, WaitError> {
        self.wait_until_within(run_id, DEFAULT_WAIT_TIMEOUT, "the condition", condition)
            .await
    }

    /// Waits until the run `run_id` is in the state named `state` (its Rust name, as
    /// [`RunInfo::state`]): see [`wait_until`](Self::wait_until).
    ///
    /// # Errors
    /// As [`wait_until`](Self::wait_until); [`WaitError::NoSuchState`] as soon as the run is
    /// seen, if its workflow (by the schema its row names) has no state `state`.
    pub async fn wait_for_state(&self, run_id: &str, state: &str) -> Result<RunInfo, WaitError> {
        let what = format!("state `{state}`");
        let mut checked = false;
        self.wait_checked(
            run_id,
            DEFAULT_WAIT_TIMEOUT,
            &what,
            async |info: &RunInfo| {
                if !checked {
                    self.refuse_unknown_state(info, state, &what).await?;
                    checked = true;
                }
                Ok(info.state == state)
            },
        )
        .await
    }

    /// [`WaitError::NoSuchState`] if the schema of `info` declares states and none is named
    /// `state`.
    async fn refuse_unknown_state(
        &self,
        info: &RunInfo,
        state: &str,
        what: &str,
    ) -> Result<(), WaitError> {
        let description =
            self.store()
                .schema(info.schema)
                .await
                .map_err(|source| WaitError::Store {
                    run_id: info.run_id.clone(),
                    what: what.to_owned(),
                    source,
                })?;
        let states = description
            .as_deref()
            .map(crate::schema::described_states)
            .unwrap_or_default();
        if states.is_empty() || states.iter().any(|s| s == state) {
            return Ok(());
        }
        Err(WaitError::NoSuchState {
            run_id: info.run_id.clone(),
            workflow: info.workflow.clone(),
            state: state.to_owned(),
            states,
        })
    }

    /// Waits until the run `run_id` has `status`: see [`wait_until`](Self::wait_until).
    ///
    /// # Errors
    /// As [`wait_until`](Self::wait_until).
    pub async fn wait_for_status(
        &self,
        run_id: &str,
        status: RunStatus,
    ) -> Result<RunInfo, WaitError> {
        let what = format!("status {}", status.as_str());
        self.wait_until_within(run_id, DEFAULT_WAIT_TIMEOUT, &what, |info| {
            info.status == status
        })
        .await
    }

    /// As [`wait_until`](Self::wait_until), for at most `timeout` of real time; `what` says
    /// what is waited for in the error.
    ///
    /// # Errors
    /// As [`wait_until`](Self::wait_until).
    pub async fn wait_until_within(
        &self,
        run_id: &str,
        timeout: Duration,
        what: &str,
        condition: impl Fn(&RunInfo) -> bool,
    ) -> Result<RunInfo, WaitError> {
        self.wait_checked(run_id, timeout, what, async |info: &RunInfo| {
            Ok(condition(info))
        })
        .await
    }

    /// As [`wait_until_within`](Self::wait_until_within), with a condition that may look
    /// further (in the store) and refuse the wait.
    async fn wait_checked(
        &self,
        run_id: &str,
        timeout: Duration,
        what: &str,
        mut holds: impl AsyncFnMut(&RunInfo) -> Result<bool, WaitError>,
    ) -> Result<RunInfo, WaitError> {
        let started = Instant::now();
        loop {
            let info = self
                .run_info(run_id)
                .await
                .map_err(|source| WaitError::Store {
                    run_id: run_id.to_owned(),
                    what: what.to_owned(),
                    source,
                })?;
            if let Some(info) = &info {
                if holds(info).await? {
                    return Ok(info.clone());
                }
                if matches!(info.status, RunStatus::Completed | RunStatus::Cancelled) {
                    return Err(WaitError::Ended {
                        run_id: run_id.to_owned(),
                        what: what.to_owned(),
                        last: LastSeen::of(info.clone()),
                    });
                }
            }
            if started.elapsed() >= timeout {
                return Err(WaitError::TimedOut {
                    run_id: run_id.to_owned(),
                    what: what.to_owned(),
                    waited_ms: crate::clock::duration_ms(started.elapsed()),
                    last: info.map(LastSeen::of),
                });
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }
}
