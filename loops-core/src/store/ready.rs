//! When a run needs a driver: the one rule both stores, the scheduler and the driver use.

use std::sync::Arc;

use super::effects::{Effects, InboxChange};
use super::{RunInfo, RunStatus};
use crate::schema::SchemaHash;

/// When a run needs a driver, as [`RunInfo::readiness`] computes it from the row alone: from a
/// time on, or once an event arrives, whichever comes first. A run with neither never needs
/// one (it has ended).
///
/// A store that filters runs in its query language can keep these two values as columns and
/// ask `from_ms <= now OR an undelivered event named event exists`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness<'a> {
    /// From when the run needs a driver, in ms since the Unix epoch (0: now).
    pub from_ms: Option<u64>,
    /// An event whose arrival (undelivered in the run's inbox) makes it need one.
    pub event: Option<&'a str>,
}

/// Whether a run needs a driver now: [`Readiness::at`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready<'a> {
    /// Yes.
    Now,
    /// If an undelivered event of this name is in its inbox.
    OnEvent(&'a str),
    /// No.
    No,
}

impl<'a> Readiness<'a> {
    /// Whether the run needs a driver at once, whatever the time (`from_ms` 0, the readiness
    /// of a running run): not only from a time on, nor only once an event arrives.
    pub fn is_immediate(&self) -> bool {
        self.from_ms == Some(0)
    }

    /// Whether the run needs a driver at `now_ms` (ms since the Unix epoch), as far as the
    /// row tells: at once, if an event is in its inbox, or not.
    pub fn at(&self, now_ms: u64) -> Ready<'a> {
        if self.from_ms.is_some_and(|from| from <= now_ms) {
            return Ready::Now;
        }
        match self.event {
            Some(event) => Ready::OnEvent(event),
            None => Ready::No,
        }
    }
}

impl RunInfo {
    /// When the run needs a driver: a running run at once; a waiting run at once if its
    /// cancellation was asked for (the driver ends it) or if it waits for nothing, else
    /// when its wait's time passes or its event arrives; an ended or blocked run never.
    pub fn readiness(&self) -> Readiness<'_> {
        let wait = self.wait.as_ref().map(|w| (w.event.as_deref(), w.until_ms));
        Readiness::of(self.status, self.cancel.is_some(), wait)
    }
}

impl<'a> Readiness<'a> {
    /// [`RunInfo::readiness`] from the fields of a row it reads: its status, whether a
    /// cancellation was asked for, and its wait as `(event, until_ms)`. (The rule is here
    /// once, for a reader that decodes only these fields of many rows.)
    pub(crate) fn of(
        status: RunStatus,
        cancel_asked: bool,
        wait: Option<(Option<&'a str>, Option<u64>)>,
    ) -> Readiness<'a> {
        const NOW: Readiness<'static> = Readiness {
            from_ms: Some(0),
            event: None,
        };
        match status {
            RunStatus::Running => NOW,
            RunStatus::Waiting if cancel_asked => NOW,
            RunStatus::Waiting => match wait {
                None => NOW,
                Some((event, until_ms)) => Readiness {
                    from_ms: until_ms,
                    event,
                },
            },
            // A blocked run waits for a build that can route it, which looks for it itself.
            RunStatus::Completed
            | RunStatus::Failed
            | RunStatus::Cancelled
            | RunStatus::Blocked => Readiness {
                from_ms: None,
                event: None,
            },
        }
    }
}

/// A waiting run, as much of it as [`Runtime::resume_all`](crate::Runtime::resume_all) needs
/// to leave it parked: its workflow, id and row's schema, and from when it needs a driver
/// ([`Store::claim_ready_and_parked`](crate::Store::claim_ready_and_parked)). A few dozen
/// bytes, where a [`RunInfo`] is a few hundred: a process may hold a million parked runs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedRun {
    /// The run's workflow (shared by the parked runs of a listing).
    pub workflow: Arc<str>,
    /// The run.
    pub run_id: String,
    /// The schema its row is recorded with.
    pub schema: SchemaHash,
    /// From when it needs a driver, in ms since the Unix epoch: its
    /// [`readiness`](RunInfo::readiness)'s `from_ms` (`None`: only once an event arrives).
    pub from_ms: Option<u64>,
}

impl ParkedRun {
    /// The parked run whose row is `info`, of `workflow` (`info.workflow`, shared).
    pub fn of(workflow: Arc<str>, info: &RunInfo) -> ParkedRun {
        ParkedRun {
            workflow,
            run_id: info.run_id.clone(),
            schema: info.schema,
            from_ms: info.readiness().from_ms,
        }
    }
}

/// Whether a write whose effects are `effects`, on the run whose row was `before` (`None`:
/// a new run), makes the run need a driver that nobody provides: what
/// [`Effects::wakes`] says, decided here once from the effects for every kind of write.
///
/// `leased`: the write carried a lease (its plan checked it), so its writer drives the run
/// (a driver's own writes, a run created by the runtime that drives it); if that driver
/// lets the run go while it still needs one, the store's lease release says so instead.
/// Otherwise the write wakes other workers when, after it, the run needs a driver at once
/// and did not before (a retry, a cancellation of a waiting run, a new run, a wake), or when
/// an event the run waits for is appended to its inbox (a send, a child's end). A time that
/// passes is not a write: a sleeping run's time comes at a poll.
pub(crate) fn wakes(before: Option<&RunInfo>, effects: &Effects<'_>, leased: bool) -> bool {
    if leased {
        return false;
    }
    let Some(after) = effects.row().map(|r| &r.info).or(before) else {
        return false;
    };
    let ready = after.readiness();
    let was_immediate = before.is_some_and(|b| b.readiness().is_immediate());
    if ready.is_immediate() && !was_immediate {
        return true;
    }
    ready.event.is_some_and(|event| {
        effects
            .inbox
            .iter()
            .any(|change| matches!(change, InboxChange::Append { name, .. } if *name == event))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::WaitInfo;

    fn row(status: RunStatus, wait: Option<WaitInfo>, cancel: bool) -> RunInfo {
        RunInfo {
            cancel: cancel.then(|| "stop".to_owned()),
            wait,
            ..crate::store::plan_tests::row("r", status, 3)
        }
    }

    fn wait(event: Option<&str>, until_ms: Option<u64>) -> Option<WaitInfo> {
        Some(WaitInfo {
            event: event.map(str::to_owned),
            until_ms,
        })
    }

    #[test]
    fn the_rule() {
        fn at(info: &RunInfo, now: u64) -> Ready<'_> {
            info.readiness().at(now)
        }
        assert_eq!(at(&row(RunStatus::Running, None, false), 5), Ready::Now);
        assert_eq!(at(&row(RunStatus::Waiting, None, false), 5), Ready::Now);
        let sleeping = row(RunStatus::Waiting, wait(None, Some(10)), false);
        assert_eq!(at(&sleeping, 9), Ready::No);
        assert_eq!(at(&sleeping, 10), Ready::Now);
        let waiting = row(RunStatus::Waiting, wait(Some("go"), Some(10)), false);
        assert_eq!(at(&waiting, 9), Ready::OnEvent("go"));
        assert_eq!(at(&waiting, 11), Ready::Now);
        let forever = row(RunStatus::Waiting, wait(Some("go"), None), false);
        assert_eq!(at(&forever, u64::MAX), Ready::OnEvent("go"));
        // A pending cancellation makes a waiting run ready whatever it waits for.
        let cancelled = row(RunStatus::Waiting, wait(Some("go"), None), true);
        assert_eq!(
            cancelled.readiness(),
            Readiness {
                from_ms: Some(0),
                event: None
            }
        );
        assert_eq!(at(&cancelled, 0), Ready::Now);
        for status in [
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::Cancelled,
            RunStatus::Blocked,
        ] {
            assert_eq!(
                at(&row(status, wait(Some("go"), Some(1)), true), 9),
                Ready::No
            );
        }
    }
}
