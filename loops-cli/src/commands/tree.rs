//! `loops tree RUN`: a run and the child runs it started, and theirs.

use std::collections::BTreeMap;

use loops_core::RunInfo;
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
/// run id. Reads the root's row, then each run's children through the store's children index
/// (one read per run of the tree, not a scan of the store).
pub fn run(target: &Target, args: &TreeArgs) -> Result<()> {
    let run_id = run_id_arg(&args.run)?;
    let store = open::operator(target, Access::Read)?;
    let root = store
        .run(&run_id)?
        .ok_or_else(|| not_found(store.label(), &run_id))?;
    let mut children: BTreeMap<String, Vec<RunInfo>> = BTreeMap::new();
    let mut todo = vec![root.run_id.clone()];
    while let Some(parent) = todo.pop() {
        // A run is its own ancestor only in a corrupt store: each run is read once.
        if children.contains_key(&parent) {
            continue;
        }
        let mut own = store.children(&parent)?;
        own.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        todo.extend(own.iter().map(|c| c.run_id.clone()));
        children.insert(parent, own);
    }
    if args.json {
        return emit_json(&view(root, &mut children));
    }
    let mut t = Table::new();
    lines(&root, 0, &mut children, &mut t);
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
/// Each run's children are taken from `children` as they are shown, so each shows once.
fn lines(
    info: &RunInfo,
    depth: usize,
    children: &mut BTreeMap<String, Vec<RunInfo>>,
    t: &mut Table,
) {
    t.row(vec![
        Cell::new(format!("{}{}", "  ".repeat(depth), info.run_id), ID),
        Cell::new(info.workflow.clone(), PLAIN),
        Cell::new(info.status.to_string(), status_style(info.status)),
        Cell::new(format!("{} (seq {})", info.state, info.seq), PLAIN),
    ]);
    for child in children.remove(&info.run_id).unwrap_or_default() {
        lines(&child, depth + 1, children, t);
    }
}
