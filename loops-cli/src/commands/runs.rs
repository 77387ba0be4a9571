//! `loops runs`: the table of runs.

use std::time::Duration;

use humantime::format_duration;
use loops_core::now_ms;
use loops_core::{AttributeFilter, RunFilter, RunInfo, RunStatus};

use super::schema::resolve;
use crate::cli::RunsArgs;
use crate::failure::{Failure, Result};
use crate::open::{self, Access, Target};
use crate::operator::Operator;
use crate::output::{Cell, DIM, ID, Table, emit, emit_json, note, relative, status_style};
use crate::view::{RunView, waiting_text};

/// Which runs to list: `loops runs`' filters, and the web UI's (the same meaning in both).
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only runs with one of these statuses (every status when empty).
    pub statuses: Vec<RunStatus>,
    /// Only runs of this workflow.
    pub workflow: Option<String>,
    /// Only runs recorded with this schema: its hash, or a unique prefix of 4+ hex digits.
    pub schema: Option<String>,
    /// Only runs whose last change is older than this.
    pub older_than: Option<Duration>,
    /// Only runs whose last change is more recent than this.
    pub newer_than: Option<Duration>,
    /// At most this many runs (the most recently changed).
    pub limit: Option<usize>,
    /// Only runs whose attributes match all of these (found through the attribute index).
    pub attributes: Vec<AttributeFilter>,
}

impl From<&RunsArgs> for Selection {
    fn from(args: &RunsArgs) -> Self {
        Selection {
            statuses: args.status.iter().map(|&s| s.into()).collect(),
            workflow: args.workflow.clone(),
            schema: args.schema.clone(),
            older_than: args.older_than,
            newer_than: args.newer_than,
            limit: (args.limit > 0).then_some(args.limit),
            attributes: args.attr.clone(),
        }
    }
}

/// The runs of `store` that `selection` selects at `now` (ms since the Unix epoch), most
/// recently changed first. Fails with a usage failure for ages that exclude each other and
/// for a schema that no stored schema (or more than one) matches; otherwise as the store's
/// reads fail.
pub fn select(store: &dyn Operator, selection: &Selection, now: u64) -> Result<Vec<RunInfo>> {
    check_ages(selection)?;
    let statuses: Vec<RunStatus> = if selection.statuses.is_empty() {
        RunStatus::ALL.to_vec()
    } else {
        let mut s = selection.statuses.clone();
        s.sort();
        s.dedup();
        s
    };
    let mut runs: Vec<RunInfo> = Vec::new();
    if selection.attributes.is_empty() {
        for status in statuses {
            runs.extend(store.list(status, selection.workflow.as_deref())?);
        }
    } else {
        let filter = RunFilter {
            statuses,
            workflow: selection.workflow.clone(),
            attributes: selection.attributes.clone(),
            ..RunFilter::default()
        };
        runs.extend(store.search(&filter)?.into_iter().map(|(info, _)| info));
    }
    if let Some(given) = &selection.schema {
        let (hash, _) = resolve(store.label(), &store.schemas()?, given)?;
        runs.retain(|info| info.schema == hash);
    }
    let age = |d: Duration| now.saturating_sub(loops_core::duration_ms(d));
    runs.retain(|info| {
        selection
            .older_than
            .is_none_or(|d| info.updated_ms < age(d))
            && selection
                .newer_than
                .is_none_or(|d| info.updated_ms >= age(d))
    });
    runs.sort_by(|a, b| {
        b.updated_ms
            .cmp(&a.updated_ms)
            .then_with(|| a.run_id.cmp(&b.run_id))
    });
    if let Some(limit) = selection.limit {
        runs.truncate(limit);
    }
    Ok(runs)
}

/// Lists the runs that match `args`, most recently changed first.
pub fn run(target: &Target, args: &RunsArgs) -> Result<()> {
    check_ages(&Selection::from(args))?;
    let store = open::operator(target, Access::Read)?;
    let now = now_ms();
    let selection = Selection::from(args);
    let mut runs = select(
        &*store,
        &Selection {
            limit: None,
            ..selection.clone()
        },
        now,
    )?;
    if let Some(limit) = selection.limit
        && runs.len() > limit
    {
        let more = runs.len() - limit;
        let (more, shown) = (
            if more == 1 {
                "1 more run matches".to_owned()
            } else {
                format!("{more} more runs match")
            },
            if limit == 1 {
                "the most recently changed is shown".to_owned()
            } else {
                format!("the {limit} most recently changed are shown")
            },
        );
        note(&format!(
            "{more}; {shown} (--limit N, or --limit 0 for all)"
        ));
        runs.truncate(limit);
    }

    if args.json {
        let views = runs
            .iter()
            .map(|info| Ok(RunView::from(info).with_attributes(store.attributes(&info.run_id)?)))
            .collect::<Result<Vec<RunView>>>()?;
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
fn check_ages(selection: &Selection) -> Result<()> {
    let (Some(older), Some(newer)) = (selection.older_than, selection.newer_than) else {
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
