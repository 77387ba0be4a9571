//! `loops runs`: the table of runs.

use humantime::format_duration;
use loops_core::now_ms;
use loops_core::{RunInfo, RunStatus};

use super::schema::resolve;
use crate::cli::RunsArgs;
use crate::failure::{Failure, Result};
use crate::open::{self, Access, Target};
use crate::output::{Cell, DIM, ID, Table, emit, emit_json, note, relative, status_style};
use crate::view::{RunView, waiting_text};

/// Lists the runs that match `args`, most recently changed first.
pub fn run(target: &Target, args: &RunsArgs) -> Result<()> {
    check_ages(args)?;
    let store = open::operator(target, Access::Read)?;
    let statuses: Vec<RunStatus> = if args.status.is_empty() {
        RunStatus::ALL.to_vec()
    } else {
        let mut s: Vec<RunStatus> = args.status.iter().map(|&s| s.into()).collect();
        s.sort();
        s.dedup();
        s
    };
    let now = now_ms();
    let mut runs: Vec<RunInfo> = Vec::new();
    for status in statuses {
        runs.extend(store.list(status, args.workflow.as_deref())?);
    }
    if let Some(given) = &args.schema {
        let (hash, _) = resolve(store.label(), &store.schemas()?, given)?;
        runs.retain(|info| info.schema == hash);
    }
    let age = |d: std::time::Duration| now.saturating_sub(d.as_millis() as u64);
    runs.retain(|info| {
        args.older_than.is_none_or(|d| info.updated_ms < age(d))
            && args.newer_than.is_none_or(|d| info.updated_ms >= age(d))
    });
    runs.sort_by(|a, b| {
        b.updated_ms
            .cmp(&a.updated_ms)
            .then_with(|| a.run_id.cmp(&b.run_id))
    });
    if let Some(limit) = args.limit {
        runs.truncate(limit);
    }

    if args.json {
        let views: Vec<RunView> = runs.iter().map(RunView::from).collect();
        return emit_json(&views);
    }
    let mut table = Table::with_header(&[
        "RUN",
        "WORKFLOW",
        "STATUS",
        "STATE",
        "SEQ",
        "ATTEMPT",
        "UPDATED",
        "WAITING FOR",
    ]);
    for info in &runs {
        table.row(vec![
            Cell::new(&info.run_id, ID),
            Cell::plain(&info.workflow),
            Cell::new(info.status.as_str(), status_style(info.status)),
            Cell::plain(&info.state),
            Cell::plain(info.seq.to_string()),
            Cell::plain(info.attempt.to_string()),
            Cell::new(relative(info.updated_ms, now), DIM),
            Cell::plain(waiting_text(info, now)),
        ]);
    }
    emit(&table.render(0))?;
    if runs.is_empty() {
        note("no runs match");
    }
    Ok(())
}

/// Refuses `--older-than` and `--newer-than` that no run can match together: older than A
/// and newer than B select the runs last changed between B and A ago, which needs B > A.
fn check_ages(args: &RunsArgs) -> Result<()> {
    let (Some(older), Some(newer)) = (args.older_than, args.newer_than) else {
        return Ok(());
    };
    if older < newer {
        return Ok(());
    }
    let (o, n) = (format_duration(older), format_duration(newer));
    let hint = if older == newer {
        "--newer-than must be the longer age".to_owned()
    } else {
        format!(
            "for runs last changed between {n} and {o} ago, give --older-than {n} --newer-than {o}"
        )
    };
    Err(Failure::usage(format!(
        "--older-than {o} and --newer-than {n} exclude each other: no run last changed both more than {o} ago and less than {n} ago ({hint})"
    )))
}
