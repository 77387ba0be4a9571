//! What the schedule writes mean ([`Write::PutSchedule`], [`Write::PauseSchedule`],
//! [`Write::RemoveSchedule`], [`Write::TickSchedule`]), once for every store: the part of
//! [`plan`](super::plan::plan) about schedules, beside it so that `plan.rs` stays one
//! screenful of runs. Each function takes the schedule's row as the store read it
//! ([`Facts::schedule`]) and returns the [`Effects`] or the refusal.

use super::effects::{Effects, ScheduleChange};
use super::facts::Facts;
use super::protocol::{Reply, Write};
use crate::error::{Error, Result};
use crate::schedule::{ScheduleInfo, check_schedule_name};

/// What the schedule write `write` means, given the schedule's row in `facts`.
///
/// # Errors
/// As [`plan`](super::plan::plan) says for schedules.
pub(super) fn plan<'w>(write: &'w Write, facts: &Facts<'_>) -> Result<Effects<'w>> {
    match write {
        Write::PutSchedule { info } => put(info, facts),
        Write::PauseSchedule {
            name,
            paused,
            at_ms,
        } => pause(name, *paused, *at_ms, facts),
        Write::RemoveSchedule { name } => remove(name, facts),
        Write::TickSchedule { tick_ms, at_ms, .. } => Ok(tick(*tick_ms, *at_ms, facts)),
        // `plan` sends only the schedule writes here.
        other => Err(Error::InvalidSchedule {
            name: String::new(),
            reason: format!("`{}` is not a write of schedules", other.kind()),
        }),
    }
}

/// [`Write::PutSchedule`](super::Write::PutSchedule): a new row as given, or the existing
/// one with `info`'s definition (its pause, ticks and creation time kept).
pub(super) fn put<'w>(info: &ScheduleInfo, facts: &Facts<'_>) -> Result<Effects<'w>> {
    check_schedule_name(&info.name).map_err(|reason| Error::InvalidSchedule {
        name: info.name.clone(),
        reason: reason.to_owned(),
    })?;
    info.schedule().map_err(|e| Error::InvalidSchedule {
        name: info.name.clone(),
        reason: e.0,
    })?;
    let (row, new) = match &facts.schedule {
        None => (info.clone(), true),
        Some(old) => {
            let mut row = old.clone();
            row.workflow.clone_from(&info.workflow);
            row.spec.clone_from(&info.spec);
            row.catch_up = info.catch_up;
            row.updated_ms = info.updated_ms;
            (row, false)
        }
    };
    Ok(put_row(row, new))
}

/// [`Write::PauseSchedule`](super::Write::PauseSchedule).
pub(super) fn pause<'w>(
    name: &str,
    paused: bool,
    at_ms: u64,
    facts: &Facts<'_>,
) -> Result<Effects<'w>> {
    let mut row = existing(name, facts)?;
    if row.paused == paused {
        return Ok(Effects::unchanged("", Reply::Schedule(row)));
    }
    if !paused {
        // The ticks that fell while it was paused are settled: none is caught up.
        row.through_ms = row.through_ms.max(at_ms);
    }
    row.paused = paused;
    row.updated_ms = at_ms;
    Ok(put_row(row, false))
}

/// [`Write::RemoveSchedule`](super::Write::RemoveSchedule).
pub(super) fn remove<'w>(name: &'w str, facts: &Facts<'_>) -> Result<Effects<'w>> {
    existing(name, facts)?;
    let mut effects = Effects::unchanged("", Reply::Done);
    effects.schedule = Some(ScheduleChange::Delete { name });
    Ok(effects)
}

/// [`Write::TickSchedule`](super::Write::TickSchedule).
pub(super) fn tick<'w>(tick_ms: u64, at_ms: u64, facts: &Facts<'_>) -> Effects<'w> {
    let Some(old) = &facts.schedule else {
        // Removed meanwhile: a tick does not bring it back.
        return Effects::unchanged("", Reply::Done);
    };
    let mut row = old.clone();
    row.through_ms = row.through_ms.max(tick_ms);
    row.last_tick_ms = Some(row.last_tick_ms.map_or(tick_ms, |last| last.max(tick_ms)));
    if row == *old {
        return Effects::unchanged("", Reply::Schedule(row));
    }
    row.updated_ms = at_ms;
    put_row(row, false)
}

/// The schedule's row, or [`Error::ScheduleNotFound`].
/// The stored row of the schedule `name`. A name no schedule can have is said so (the rule it
/// breaks), not as a schedule that does not exist; a stored row is found whatever its name.
fn existing(name: &str, facts: &Facts<'_>) -> Result<ScheduleInfo> {
    if let Some(row) = &facts.schedule {
        return Ok(row.clone());
    }
    check_schedule_name(name).map_err(|reason| Error::InvalidSchedule {
        name: name.to_owned(),
        reason: reason.to_owned(),
    })?;
    Err(Error::ScheduleNotFound {
        name: name.to_owned(),
    })
}

/// Effects that write `row` (`new`: none was there) and answer it.
fn put_row<'w>(row: ScheduleInfo, new: bool) -> Effects<'w> {
    let mut effects = Effects::unchanged("", Reply::Schedule(row.clone()));
    effects.schedule = Some(ScheduleChange::Put { info: row, new });
    effects
}

#[cfg(test)]
mod tests {
    use super::super::plan::plan;
    use super::*;
    use crate::schedule::{CatchUp, Schedule};

    fn row(name: &str) -> ScheduleInfo {
        let every = Schedule::every(std::time::Duration::from_secs(60)).unwrap();
        ScheduleInfo::new(name, "wf", &every.catch_up(CatchUp::All), 1_000)
    }

    fn with(schedule: Option<ScheduleInfo>) -> Facts<'static> {
        Facts {
            schedule,
            ..Facts::default()
        }
    }

    fn put_of(effects: Effects<'_>) -> (ScheduleInfo, bool) {
        match effects.schedule {
            Some(ScheduleChange::Put { info, new }) => (info, new),
            other => panic!("not a put: {other:?}"),
        }
    }

    #[test]
    fn a_registration_keeps_the_pause_and_the_ticks_of_the_stored_row() {
        let w = Write::PutSchedule { info: row("s") };
        let (new, is_new) = put_of(plan(&w, None, &with(None)).unwrap());
        assert_eq!((new, is_new), (row("s"), true));
        let mut stored = row("s");
        stored.paused = true;
        stored.through_ms = 9_000;
        stored.last_tick_ms = Some(9_000);
        stored.created_ms = 5;
        let mut again = row("s");
        again.spec = "every 120000ms".to_owned();
        again.catch_up = CatchUp::Skip;
        again.updated_ms = 10_000;
        let w = Write::PutSchedule { info: again };
        let (kept, is_new) = put_of(plan(&w, None, &with(Some(stored.clone()))).unwrap());
        assert!(!is_new);
        assert_eq!(
            (
                kept.spec.as_str(),
                kept.catch_up,
                kept.paused,
                kept.through_ms
            ),
            ("every 120000ms", CatchUp::Skip, true, 9_000)
        );
        assert_eq!(
            (kept.last_tick_ms, kept.created_ms, kept.updated_ms),
            (Some(9_000), 5, 10_000)
        );
        let mut bad = row("a b");
        let w = Write::PutSchedule { info: bad.clone() };
        assert!(matches!(
            plan(&w, None, &with(None)),
            Err(Error::InvalidSchedule { .. })
        ));
        bad.name = "ok".to_owned();
        bad.spec = "hourly".to_owned();
        let w = Write::PutSchedule { info: bad };
        assert!(matches!(
            plan(&w, None, &with(None)),
            Err(Error::InvalidSchedule { .. })
        ));
    }

    #[test]
    fn ticks_move_forward_only_and_resume_skips_the_paused_ticks() {
        let tick = |ms| Write::TickSchedule {
            name: "s".to_owned(),
            tick_ms: ms,
            at_ms: 50_000,
        };
        let (r, _) = put_of(plan(&tick(60_000), None, &with(Some(row("s")))).unwrap());
        assert_eq!(
            (r.through_ms, r.last_tick_ms, r.updated_ms),
            (60_000, Some(60_000), 50_000)
        );
        let (r2, _) = put_of(plan(&tick(120_000), None, &with(Some(r.clone()))).unwrap());
        assert_eq!((r2.through_ms, r2.last_tick_ms), (120_000, Some(120_000)));
        let old_tick = tick(60_000);
        let older = plan(&old_tick, None, &with(Some(r2.clone()))).unwrap();
        assert!(older.is_empty());
        let gone = plan(&old_tick, None, &with(None)).unwrap();
        assert!(gone.is_empty() && matches!(gone.into_reply(), Reply::Done));

        let pause = |paused, at_ms| Write::PauseSchedule {
            name: "s".to_owned(),
            paused,
            at_ms,
        };
        let (p, _) = put_of(plan(&pause(true, 200_000), None, &with(Some(r2))).unwrap());
        assert!(p.paused);
        assert!(
            plan(&pause(true, 1), None, &with(Some(p.clone())))
                .unwrap()
                .is_empty()
        );
        let (resumed, _) = put_of(plan(&pause(false, 400_000), None, &with(Some(p))).unwrap());
        assert_eq!((resumed.paused, resumed.through_ms), (false, 400_000));
        assert!(matches!(
            plan(&pause(false, 1), None, &with(None)),
            Err(Error::ScheduleNotFound { name }) if name == "s"
        ));
        let remove = Write::RemoveSchedule {
            name: "s".to_owned(),
        };
        let removed = plan(&remove, None, &with(Some(resumed))).unwrap();
        assert_eq!(removed.schedule, Some(ScheduleChange::Delete { name: "s" }));
        assert!(matches!(
            plan(&remove, None, &with(None)),
            Err(Error::ScheduleNotFound { .. })
        ));
    }
}
