//! `loops schedules`: the stored schedules, and pausing, resuming or removing one.

use loops_core::{ScheduleStatus, now_ms};

use crate::cli::{ScheduleAction, SchedulesArgs};
use crate::failure::Result;
use crate::open::{self, Access, Target};
use crate::output::{Cell, DIM, ID, Table, emit, emit_json, note, paint, rfc3339, when};

/// Lists the schedules, or applies the action to one.
pub fn run(target: &Target, args: &SchedulesArgs) -> Result<()> {
    let Some(action) = &args.action else {
        return list(target, args.json);
    };
    let store = open::operator(target, Access::Write)?;
    let (name, done) = match action {
        ScheduleAction::Pause { name } => (name, store.pause_schedule(name, true).map(Some)?),
        ScheduleAction::Resume { name } => (name, store.pause_schedule(name, false).map(Some)?),
        ScheduleAction::Remove { name } => {
            store.remove_schedule(name)?;
            (name, None)
        }
    };
    match (done, args.json) {
        (Some(status), true) => emit_json(&status),
        (None, true) => emit_json(&serde_json::json!({ "removed": name })),
        (Some(status), false) => emit(&format!(
            "schedule {} is {}{}\n",
            paint(ID, name),
            if status.info.paused {
                "paused"
            } else {
                "running"
            },
            status
                .next_tick_ms
                .map(|t| format!("; next tick {}", rfc3339(t)))
                .unwrap_or_default()
        )),
        (None, false) => emit(&format!(
            "schedule {} removed (its runs stay; a process that registers it at its start registers it anew)\n",
            paint(ID, name)
        )),
    }
}

fn list(target: &Target, json: bool) -> Result<()> {
    let store = open::operator(target, Access::Read)?;
    let schedules = store.schedules()?;
    if json {
        return emit_json(&schedules);
    }
    if schedules.is_empty() {
        note("no schedules");
        return Ok(());
    }
    let now = now_ms();
    let mut table = Table::with_header(&[
        "SCHEDULE",
        "WORKFLOW",
        "SPEC",
        "CATCH-UP",
        "PAUSED",
        "LAST TICK",
        "NEXT TICK",
    ]);
    for ScheduleStatus {
        info, next_tick_ms, ..
    } in &schedules
    {
        let when = |t: Option<u64>| t.map_or_else(|| "-".to_owned(), |t| when(t, now));
        table.row(vec![
            Cell::new(&info.name, ID),
            Cell::plain(&info.workflow),
            Cell::plain(&info.spec),
            Cell::plain(info.catch_up.as_str()),
            Cell::plain(if info.paused { "yes" } else { "no" }),
            Cell::new(when(info.last_tick_ms), DIM),
            Cell::new(when(*next_tick_ms), DIM),
        ]);
    }
    emit(&table.render(0))
}
