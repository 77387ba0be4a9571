//! `loops tree RUN`: a run and the child runs it started, and theirs.

use std::collections::BTreeMap;

use loops_core::{RunInfo, RunStatus};
use serde::Serialize;

use crate::cli::TreeArgs;
use crate::failure::{Result, run_id_arg};
use crate::open::{self, Access, Target};
use crate::operator::not_found;
use crate::output::{Cell, ID, PLAIN, Table, emit, emit_json, status_style};
use crate::view::RunView;

/// `loops tree --json`: a run and its children, each a tree of its own.
#[derive(Debug, Serialize)]
struct TreeView {
    run: RunView,
    children: Vec<TreeView>,
}

/// Prints the run `args.run` and its descendants, each child under its parent, children by
/// run id. Reads every run's row once (the parent links are in the rows).
pub fn run(target: &Target, args: &TreeArgs) -> Result<()> {
    let run_id = run_id_arg(&args.run)?;
    let store = open::operator(target, Access::Read)?;
    let root = store
        .run(&run_id)?
        .ok_or_else(|| not_found(store.label(), &run_id))?;
    let mut children: BTreeMap<String, Vec<RunInfo>> = BTreeMap::new();
    for status in RunStatus::ALL {
        for info in store.list(status, None)? {
            if let Some(parent) = &info.parent {
                children
                    .entry(parent.run_id.clone())
                    .or_default()
                    .push(info);
            }
        }
    }
    for list in children.values_mut() {
        list.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    }
    if args.json {
        return emit_json(&view(root, &mut children));
    }
    let mut t = Table::new();
    lines(&root, 0, &children, &mut t);
    emit(&t.render(0))
}

fn view(info: RunInfo, children: &mut BTreeMap<String, Vec<RunInfo>>) -> TreeView {
    let own = children.remove(&info.run_id).unwrap_or_default();
    TreeView {
        run: RunView::from(&info),
        children: own.into_iter().map(|c| view(c, children)).collect(),
    }
}

/// One row per run, its id indented two spaces per generation below the root.
fn lines(info: &RunInfo, depth: usize, children: &BTreeMap<String, Vec<RunInfo>>, t: &mut Table) {
    t.row(vec![
        Cell::new(format!("{}{}", "  ".repeat(depth), info.run_id), ID),
        Cell::new(info.workflow.clone(), PLAIN),
        Cell::new(info.status.to_string(), status_style(info.status)),
        Cell::new(format!("{} (seq {})", info.state, info.seq), PLAIN),
    ]);
    for child in children.get(&info.run_id).into_iter().flatten() {
        lines(child, depth + 1, children, t);
    }
}
