//! Schedules: [`Runtime::schedule`] registers one and starts its loop, a background task
//! that sleeps on the runtime's clock until the next tick and starts that tick's run; the
//! catch-up of the ticks missed while no process ran the loop; and the operations on stored
//! schedules ([`Runtime::schedules`], [`pause_schedule`](Runtime::pause_schedule),
//! [`resume_schedule`](Runtime::resume_schedule), [`remove_schedule`](Runtime::remove_schedule)).
//!
//! A tick fires at most once because its run id is [`tick_run_id`] of the schedule and the
//! tick's time, and a store creates a run id once: a second process (or a restart) that
//! fires the same tick finds the run, or is refused its creation.

use std::sync::{Arc, PoisonError, Weak};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::runtime::handle::{Inner, Runtime};
use crate::runtime::runs::StartOptions;
use crate::schedule::{
    CatchUp, MAX_CATCH_UP, SCHEDULE_ATTRIBUTE, Schedule, ScheduleInfo, Tick, check_schedule_name,
    tick_run_id,
};
use crate::status::RunStatus;
use crate::store::{BoxFuture, Reply, Write};
use crate::workflow::Workflow;

/// A stored schedule and its next tick: what [`Runtime::schedules`] lists (and the control
/// endpoint's `GET /v1/schedules` answers, as JSON: the row's fields, `name` and
/// `next_tick_ms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ScheduleStatus {
    /// The stored row (name, workflow, spec, catch-up policy, paused, last tick).
    #[serde(flatten)]
    pub info: ScheduleInfo,
    /// The name, for JSON (the row's key).
    pub name: String,
    /// Its next tick after `now_ms` (ms since the Unix epoch); `None` while it is paused, or
    /// if its spec has no later tick or does not read back.
    pub next_tick_ms: Option<u64>,
}

impl ScheduleStatus {
    /// `self`, its row named after [`name`](Self::name) (the JSON form carries the name
    /// once, beside the row's fields).
    pub fn named(mut self) -> ScheduleStatus {
        self.info.name.clone_from(&self.name);
        self
    }

    /// The status of `info` at `now_ms` (ms since the Unix epoch).
    pub fn of(info: ScheduleInfo, now_ms: u64) -> ScheduleStatus {
        let next_tick_ms = if info.paused {
            None
        } else {
            info.next_tick_ms(now_ms)
        };
        ScheduleStatus {
            name: info.name.clone(),
            info,
            next_tick_ms,
        }
    }
}

/// Starts the run of one tick: `make` applied to the tick, started as a `W`.
type Starter = Arc<dyn Fn(Runtime, Tick) -> BoxFuture<'static, Result<()>> + Send + Sync>;

/// One schedule's loop: what it needs besides the runtime.
struct Loop {
    name: String,
    schedule: Schedule,
    start: Starter,
}

impl Runtime {
    /// Registers the schedule `name` and runs its loop in the background: at each tick of
    /// `schedule` (by the runtime's [clock](crate::RuntimeBuilder::clock)), the run
    /// [`tick_run_id`]`(name, tick)` starts as `make(&tick)`, with the attribute
    /// [`SCHEDULE_ATTRIBUTE`] = `name`, and is driven by the handler registered for `W`.
    ///
    /// A schedule is stored. A new one counts its ticks from now. One stored already (an
    /// earlier start of the process, or another worker of a shared store) keeps its pause
    /// and its last tick, takes this call's spec and catch-up policy, and its missed ticks
    /// (after its last settled tick, up to now) are handled at once, before this returns, as
    /// its [`CatchUp`] policy says. A tick fires at most once across restarts and workers:
    /// its run id is derived from the schedule and the tick, and a run id is created once.
    /// Calling this again with the same name in the same runtime replaces its loop.
    ///
    /// The runs of ticks are runs like any other, and [`resume_all`](Self::resume_all) or
    /// [`serve`](Self::serve) drive them after a crash; this call also gives a driver to each
    /// run of the schedule's earlier ticks that has not ended (found through the attribute
    /// index), so that a process that only registers its schedules finishes them too.
    ///
    /// Returns the stored row after the catch-up.
    ///
    /// # Errors
    /// [`Error::NotRegistered`] if no handler is registered for `W`;
    /// [`Error::InvalidSchedule`] for a name [`check_schedule_name`] refuses, or a schedule
    /// with no tick after now (a cron pattern whose times are all past);
    /// [`Error::Storage`]/[`Error::Database`] if the registration could not be written (a
    /// tick that could not start is logged and left to the next catch-up).
    pub async fn schedule<W, F>(
        &self,
        name: &str,
        schedule: Schedule,
        make: F,
    ) -> Result<ScheduleInfo>
    where
        W: Workflow,
        F: Fn(&Tick) -> W + Send + Sync + 'static,
    {
        check_schedule_name(name).map_err(|reason| Error::InvalidSchedule {
            name: name.to_owned(),
            reason: reason.to_owned(),
        })?;
        if self
            .registry(|r| r.driver(W::NAME, W::SCHEMA_HASH.pinned()))
            .is_none()
        {
            return Err(Error::NotRegistered {
                workflow: W::NAME.to_owned(),
            });
        }
        let now = self.now_ms();
        if schedule.next_after(now).is_none() {
            // A cron pattern whose times are all past (`* * * * * * 2020`): it would be
            // stored and never tick.
            return Err(Error::InvalidSchedule {
                name: name.to_owned(),
                reason: format!("`{schedule}` has no tick after now: its times are all past"),
            });
        }
        let info = ScheduleInfo::new(name, W::NAME, &schedule, now);
        self.store()
            .write(None, Write::PutSchedule { info })
            .await?;
        let make = Arc::new(make);
        let start: Starter = Arc::new(move |rt: Runtime, tick: Tick| {
            let initial = make(&tick);
            Box::pin(async move {
                let options = StartOptions::default()
                    .own_attribute(SCHEDULE_ATTRIBUTE, tick.schedule.as_str());
                rt.start_with::<W>(&tick.run_id, initial, options)
                    .await
                    .map(drop)
            })
        });
        let looped = Loop {
            name: name.to_owned(),
            schedule,
            start,
        };
        let row = self.catch_up(&looped, now).await?;
        self.drive_unfinished_ticks(name).await;
        let after = row.through_ms.max(now);
        let stop = tokio_util::sync::CancellationToken::new();
        let old = self
            .inner
            .schedules
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned(), stop.clone());
        if let Some(old) = old {
            old.cancel();
        }
        let weak = Arc::downgrade(&self.inner);
        let clock = self.inner.config.settings.clock.clone();
        self.inner.background.spawn_task(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = run_loop(weak, clock, looped, after) => {}
            }
        });
        Ok(row)
    }

    /// Gives a driver to each run of the schedule `name`'s earlier ticks that has not ended
    /// (a crash cut it short, in its handler or before its tick settled), found through the
    /// attribute index, unless one drives it here already (or, on a shared store, elsewhere):
    /// so that a process that registers its schedules but does not call `resume_all` still
    /// finishes them. A failed search is logged: `resume_all` or `serve` drives them anyway.
    async fn drive_unfinished_ticks(&self, name: &str) {
        let filter = crate::attribute::RunFilter::new()
            .attribute(SCHEDULE_ATTRIBUTE, name)
            .status(RunStatus::Running)
            .status(RunStatus::Waiting);
        match crate::store::find_runs(self.store(), &filter).await {
            Ok(runs) => {
                for (info, _) in runs {
                    self.spawn_driver(&info.workflow, &info.run_id);
                }
            }
            Err(e) => {
                tracing::warn!(schedule = name, error = %e, "could not look for the schedule's unfinished runs; resume_all drives them");
            }
        }
    }

    /// The catch-up at registration: the ticks after the stored row's last settled one, up
    /// to `now`, handled as the policy says. Returns the row after it.
    async fn catch_up(&self, l: &Loop, now: u64) -> Result<ScheduleInfo> {
        let row = self
            .schedule_row(&l.name)
            .await?
            .ok_or_else(|| Error::ScheduleNotFound {
                name: l.name.clone(),
            })?;
        if row.paused {
            return Ok(row);
        }
        let policy = l.schedule.catch_up_policy();
        let due = l.schedule.ticks_between(row.through_ms, now, MAX_CATCH_UP);
        if due.is_empty() {
            return Ok(row);
        }
        // Skipped ticks are not written down: a worker whose loop is late for one of them
        // (it woke for it) still fires it.
        let run: &[u64] = match policy {
            CatchUp::Skip => &[],
            CatchUp::Latest => &due[due.len() - 1..],
            CatchUp::All => &due,
        };
        if policy == CatchUp::All {
            warn_if_capped(l, &due, row.through_ms);
        }
        tracing::info!(
            schedule = l.name,
            missed = due.len(),
            running = run.len(),
            policy = policy.as_str(),
            "catching up the ticks missed while no process ran the schedule"
        );
        for &tick in run {
            self.fire(l, tick).await;
        }
        Ok(self.schedule_row(&l.name).await?.unwrap_or(row))
    }

    /// Fires the tick `tick_ms` of `l`: starts its run unless it exists, then records that
    /// it fired ([`Write::TickSchedule`]). A run that could not start is logged and the tick
    /// left as it was (the next catch-up sees it again).
    async fn fire(&self, l: &Loop, tick_ms: u64) {
        let run_id = tick_run_id(&l.name, tick_ms);
        let fired = match self.store().run_info(&run_id).await {
            Ok(Some(info)) => {
                // Started before a crash cut the tick short (it was not settled): drive it,
                // unless it ended or is driven here already.
                if matches!(info.status, RunStatus::Running | RunStatus::Waiting) {
                    self.spawn_driver(&info.workflow, &info.run_id);
                }
                Ok(())
            }
            Ok(None) => {
                let tick = Tick {
                    schedule: l.name.clone(),
                    at_ms: tick_ms,
                    run_id: run_id.clone(),
                };
                match (l.start)(self.clone(), tick).await {
                    // Another worker created it first, or is creating it now.
                    Err(Error::SequenceConflict { .. } | Error::RunActive { .. }) | Ok(()) => {
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        let settled = match fired {
            Ok(()) => self.settle(&l.name, tick_ms).await,
            Err(e) => Err(e),
        };
        if let Err(e) = settled {
            tracing::warn!(
                schedule = l.name,
                run_id,
                error = %e,
                "could not fire a tick; the next catch-up looks at it again"
            );
        }
    }

    /// Records that the tick `tick_ms` of schedule `name` fired.
    async fn settle(&self, name: &str, tick_ms: u64) -> Result<()> {
        let write = Write::TickSchedule {
            name: name.to_owned(),
            tick_ms,
            at_ms: self.now_ms(),
        };
        self.store().write(None, write).await.map(drop)
    }

    /// The stored row of schedule `name`, if it exists.
    async fn schedule_row(&self, name: &str) -> Result<Option<ScheduleInfo>> {
        let rows = self.store().schedules().await?;
        Ok(rows.into_iter().find(|r| r.name == name))
    }

    /// Every stored schedule, by name, with its next tick by the runtime's clock: those this
    /// runtime registered, and those other processes sharing the store did.
    ///
    /// # Errors
    /// [`Error::Storage`]/[`Error::Database`] on a read error; [`Error::InvalidSchedule`]
    /// for a stored row loops did not write.
    pub async fn schedules(&self) -> Result<Vec<ScheduleStatus>> {
        let now = self.now_ms();
        let rows = self.store().schedules().await?;
        Ok(rows
            .into_iter()
            .map(|info| ScheduleStatus::of(info, now))
            .collect())
    }

    /// Pauses the schedule `name`: its ticks start nothing until it is resumed, in every
    /// process that runs its loop (each sees the pause at its next tick). Pausing a paused
    /// schedule changes nothing. Returns the stored row.
    ///
    /// # Errors
    /// [`Error::ScheduleNotFound`]; [`Error::Storage`]/[`Error::Database`].
    pub async fn pause_schedule(&self, name: &str) -> Result<ScheduleInfo> {
        self.set_paused(name, true).await
    }

    /// Resumes the schedule `name`: the ticks that fell while it was paused are not caught
    /// up; its next tick fires. Returns the stored row.
    ///
    /// # Errors
    /// [`Error::ScheduleNotFound`]; [`Error::Storage`]/[`Error::Database`].
    pub async fn resume_schedule(&self, name: &str) -> Result<ScheduleInfo> {
        self.set_paused(name, false).await
    }

    async fn set_paused(&self, name: &str, paused: bool) -> Result<ScheduleInfo> {
        let write = Write::PauseSchedule {
            name: name.to_owned(),
            paused,
            at_ms: self.now_ms(),
        };
        match self.store().write(None, write).await? {
            Reply::Schedule(info) => Ok(info),
            _ => Err(Error::ScheduleNotFound {
                name: name.to_owned(),
            }),
        }
    }

    /// Removes the schedule `name` from the store and stops its loop here (another process
    /// running it stops at its next tick, when it finds the row gone). The runs its ticks
    /// started stay. A process that calls [`schedule`](Self::schedule) with this name again
    /// (its next start, if the code still does) registers it anew, counting ticks from
    /// then; to stop a schedule that the code registers at each start, pause it (the pause
    /// is kept) or take the call out of the code.
    ///
    /// # Errors
    /// [`Error::ScheduleNotFound`]; [`Error::Storage`]/[`Error::Database`].
    pub async fn remove_schedule(&self, name: &str) -> Result<()> {
        let write = Write::RemoveSchedule {
            name: name.to_owned(),
        };
        self.store().write(None, write).await?;
        let stop = self
            .inner
            .schedules
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
        if let Some(stop) = stop {
            stop.cancel();
        }
        Ok(())
    }
}

/// The loop of one schedule: sleeps until its next tick after `after` (by `clock`), then
/// fires the ticks that fell (the latest one, or with [`CatchUp::All`] each of them) and
/// that the stored row has not settled (fired by another worker, or fallen while the
/// schedule was paused: a resume settles them), unless the schedule is paused; ends when
/// the row is gone, the runtime dropped or no tick is left. Holds the runtime only while it
/// fires.
async fn run_loop(weak: Weak<Inner>, clock: crate::clock::Clock, l: Loop, mut after: u64) {
    while let Some(next) = l.schedule.next_after(after) {
        clock.sleep_until_ms(next).await;
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let rt = Runtime { inner };
        let now = rt.now_ms().max(next);
        let due = l.schedule.ticks_between(after, now, MAX_CATCH_UP);
        let after_before = after;
        after = now;
        let row = match rt.schedule_row(&l.name).await {
            Ok(Some(row)) => row,
            Ok(None) => {
                tracing::info!(schedule = l.name, "the schedule was removed; its loop ends");
                return;
            }
            Err(e) => {
                tracing::warn!(schedule = l.name, error = %e, "could not read the schedule; the next catch-up fires its missed ticks");
                continue;
            }
        };
        if row.paused {
            continue;
        }
        let fire: &[u64] = match l.schedule.catch_up_policy() {
            CatchUp::All => {
                warn_if_capped(&l, &due, row.through_ms.max(after_before));
                &due
            }
            CatchUp::Skip | CatchUp::Latest => &due[due.len().saturating_sub(1)..],
        };
        for &tick in fire.iter().filter(|t| **t > row.through_ms) {
            rt.fire(&l, tick).await;
        }
    }
}

/// Warns that ticks of `l` after `after_ms` were left out of `due` (the ticks up to now, at
/// most [`MAX_CATCH_UP`] of them, the latest kept): under [`CatchUp::All`], a loop or a
/// catch-up more than `MAX_CATCH_UP` ticks behind fires only the latest ones.
fn warn_if_capped(l: &Loop, due: &[u64], after_ms: u64) {
    if let Some(older) = due.first().and_then(|t| t.checked_sub(1))
        && l.schedule
            .last_at_or_before(older)
            .is_some_and(|t| t > after_ms)
    {
        tracing::warn!(
            schedule = l.name,
            max = MAX_CATCH_UP,
            "more missed ticks than catch-up runs: the older ones are skipped"
        );
    }
}
