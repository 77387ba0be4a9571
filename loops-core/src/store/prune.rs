//! Pruning: which ended runs a [`RetentionPolicy`] removes, and their removal in batches of
//! whole families (a run with the child runs it started), for every store.

use std::collections::HashMap;

use serde::Serialize;

use super::{Reply, RunInfo, Store, Write};
use crate::error::Result;
use crate::retention::{Family, RetentionPolicy, family_top};

/// What [`prune`] removed (or, in a dry run, would remove).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Pruned {
    /// Runs removed.
    pub runs: u64,
    /// Transition records removed (step, failure and event records go with them).
    pub records: u64,
    /// The ids of the runs removed, oldest first; each parent run before its children.
    pub run_ids: Vec<String>,
    /// Ended child runs that the policy would remove, left alone because their parent (or
    /// its parent) is kept: it has not ended and may still join them (they are pruned once it
    /// has), or the policy keeps it (a failed parent under `keep_failed`: they go with it). A
    /// child that the policy keeps anyway (younger than its `max_age`) is not counted.
    pub kept_for_parents: u64,
    /// Runs the policy expires, left alone with their family because one of them has a child
    /// run outside it: a child that has not ended (a parent that ended before its children,
    /// after `join_first` or a cancellation) or that the policy keeps (a failed child under
    /// `keep_failed`). They are pruned with that child once it goes.
    pub kept_for_children: u64,
    /// Runs selected for removal that the writes left, because they changed after the
    /// selection: retried (so no longer ended), given a new child run, or removed meanwhile by
    /// another prune. Always 0 in a dry run.
    pub changed_since_selection: u64,
}

/// Most runs deleted by one write of [`prune`] (a family larger than this goes in one write
/// of its own).
const PRUNE_BATCH: usize = 256;

/// Writes a prune aims at, so that [`prune_reporting`]'s progress moves.
const PRUNE_STEPS: usize = 50;

/// Selects the ended runs `policy` expires at `now_ms` and, unless `dry_run`, deletes their
/// records, rows, index entries and events with [`Write::Prune`]. Runs that have not ended
/// are never touched. A run goes with the child runs it started (see [`RetentionPolicy`]),
/// in the same write: a parent is never left naming a child that is gone, nor a child
/// naming a parent that is gone. A child whose parent has not ended is kept, since the
/// parent may still join it (read its row and final state); a parent with a child that has
/// not ended, or that the policy keeps, is kept with it.
///
/// # Errors
/// [`Error::Storage`](crate::Error::Storage) if a read or a commit fails (runs deleted by
/// earlier writes stay deleted; each write removes whole families);
/// [`Error::ReadOnly`](crate::Error::ReadOnly) for a read-only store unless `dry_run`.
pub async fn prune(
    store: &dyn Store,
    policy: &RetentionPolicy,
    now_ms: u64,
    dry_run: bool,
) -> Result<Pruned> {
    prune_reporting(store, policy, now_ms, dry_run, |_, _| {}).await
}

/// [`prune`], calling `progress(removed, total)` (in runs) after each write: about 50
/// writes of at most 256 runs each, whole families in each.
///
/// # Errors
/// As [`prune`].
pub async fn prune_reporting(
    store: &dyn Store,
    policy: &RetentionPolicy,
    now_ms: u64,
    dry_run: bool,
    progress: impl Fn(u64, u64),
) -> Result<Pruned> {
    let mut ended = Vec::new();
    for status in policy.statuses() {
        ended.extend(store.list(status, None).await?);
    }
    let (families, held) = families(store, ended).await?;
    // A run held for its parent counts only if the policy would remove it otherwise: one
    // younger than `max_age` is not kept by its parent, but by the policy.
    let held = held
        .into_iter()
        .filter(|&ended_ms| policy.selects_alone(ended_ms, now_ms))
        .count() as u64;
    let (expired, kept_for_children) =
        without_outside_children(store, policy.select(families, now_ms)).await?;
    let selected: usize = expired.iter().map(|family| family.run_ids.len()).sum();
    let mut report = Pruned {
        kept_for_parents: held,
        kept_for_children,
        ..Pruned::default()
    };
    if dry_run {
        report.run_ids = expired.into_iter().flat_map(|f| f.run_ids).collect();
        for run_id in &report.run_ids {
            report.records = report
                .records
                .saturating_add(store.history(run_id).await?.len() as u64);
        }
        report.runs = report.run_ids.len() as u64;
        return Ok(report);
    }
    // What the writes deleted: a run retried since the selection (no longer ended), with its
    // family, and a run another prune removed meanwhile, are not in it.
    let mut done = 0u64;
    for run_ids in batches(expired, (selected / PRUNE_STEPS).clamp(1, PRUNE_BATCH)) {
        done = done.saturating_add(run_ids.len() as u64);
        if let Reply::Pruned { records, run_ids } =
            store.write(None, Write::Prune { run_ids }).await?
        {
            report.records = report.records.saturating_add(records);
            report.run_ids.extend(run_ids);
        }
        progress(done, selected as u64);
    }
    report.runs = report.run_ids.len() as u64;
    report.changed_since_selection = (selected as u64).saturating_sub(report.runs);
    Ok(report)
}

/// The ids of `families`, in writes of about `batch` runs: whole families each, so that a
/// prune that ends midway leaves no parent without the children its history names.
fn batches(families: Vec<Family>, batch: usize) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut current: Vec<String> = Vec::new();
    for family in families {
        if !current.is_empty() && current.len() + family.run_ids.len() > batch {
            out.push(std::mem::take(&mut current));
        }
        current.extend(family.run_ids);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// `expired` without the families of which a run has a child outside the family: one that
/// has not ended (a parent that ended before its children, after `join_first`, or cancelled
/// while they ran), or that the policy keeps (a failed child under `keep_failed`). Such a
/// family stays whole, with that child: a child is never left naming a parent that is gone.
/// Returns the families left and the number of runs in those kept. One read of the children
/// index per run of an expired family.
async fn without_outside_children(
    store: &dyn Store,
    expired: Vec<Family>,
) -> Result<(Vec<Family>, u64)> {
    let mut out = Vec::with_capacity(expired.len());
    let mut kept = 0u64;
    'families: for family in expired {
        for run_id in &family.run_ids {
            for child in store.children(run_id).await? {
                if !family.run_ids.contains(&child.run_id) {
                    kept = kept.saturating_add(family.run_ids.len() as u64);
                    continue 'families;
                }
            }
        }
        out.push(family);
    }
    Ok((out, kept))
}

/// Where an ended run stands among its ancestors.
enum Lineage {
    /// It heads a family: it has no parent, or its parent is gone. Holds its id.
    Top(String),
    /// It belongs to the family headed by the run named, `depth` generations below it.
    Under(String, usize),
    /// Its parent, or an ancestor, has not ended: it may still be joined.
    Joinable,
    /// Its parent has ended but is not a candidate (the policy keeps it): it stays too.
    Kept,
}

/// The ended runs of `ended` grouped in families, each parent before its children, and the
/// times (ms) at which the runs held by an ancestor (one that has not ended, or that the
/// policy keeps) ended. Each parent outside `ended` is read once.
async fn families(store: &dyn Store, ended: Vec<RunInfo>) -> Result<(Vec<Family>, Vec<u64>)> {
    let by_id: HashMap<&str, &RunInfo> = ended.iter().map(|i| (i.run_id.as_str(), i)).collect();
    // Parents outside `ended`: Some(true) if that parent has not ended, None if it is gone.
    let mut outside: HashMap<String, Option<bool>> = HashMap::new();
    let mut members: HashMap<String, Vec<(usize, &str)>> = HashMap::new();
    let mut held = Vec::new();
    for info in &ended {
        match lineage(store, &by_id, &mut outside, info).await? {
            Lineage::Top(top) => members.entry(top).or_default().push((0, &info.run_id)),
            Lineage::Under(top, depth) => {
                members.entry(top).or_default().push((depth, &info.run_id))
            }
            Lineage::Joinable | Lineage::Kept => held.push(info.updated_ms),
        }
    }
    let mut out = Vec::with_capacity(members.len());
    for mut ids in members.into_values() {
        ids.sort_unstable();
        let ended_ms = ids
            .iter()
            .filter_map(|(_, id)| by_id.get(id).map(|info| info.updated_ms))
            .max()
            .unwrap_or(0);
        out.push(Family {
            ended_ms,
            run_ids: ids.into_iter().map(|(_, id)| id.to_owned()).collect(),
        });
    }
    Ok((out, held))
}

/// `info`'s place among its ancestors: the top of its family among the candidates `by_id`
/// ([`family_top`]), and what the parent of that top, outside them, says (read from the
/// store, remembered in `outside`).
async fn lineage(
    store: &dyn Store,
    by_id: &HashMap<&str, &RunInfo>,
    outside: &mut HashMap<String, Option<bool>>,
    info: &RunInfo,
) -> Result<Lineage> {
    let (top, depth) = family_top(by_id, info);
    let Some(link) = &top.parent else {
        return Ok(top_or_under(top, depth));
    };
    let running = match outside.get(&link.run_id) {
        Some(known) => *known,
        None => {
            let running = store
                .run_info(&link.run_id)
                .await?
                .map(|p| !p.status.is_ended());
            outside.insert(link.run_id.clone(), running);
            running
        }
    };
    Ok(match running {
        // The parent is gone: the top heads a family of its own.
        None => top_or_under(top, depth),
        Some(true) => Lineage::Joinable,
        Some(false) => Lineage::Kept,
    })
}

/// `top` heads the family; a run `depth` generations below it belongs to it.
fn top_or_under(top: &RunInfo, depth: usize) -> Lineage {
    match depth {
        0 => Lineage::Top(top.run_id.clone()),
        _ => Lineage::Under(top.run_id.clone(), depth),
    }
}
