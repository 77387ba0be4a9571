//! `loops prune` and `loops compact`: removing ended runs and returning the space.

use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use loops_core::RetentionPolicy;
use serde::Serialize;

use crate::cli::{JsonArg, PruneArgs};
use crate::failure::Result;
use crate::open::{self, Access, Target};
use crate::output::{ID, bytes, emit, emit_json, paint, plural};

/// `loops prune --json`.
#[derive(Debug, Serialize)]
struct PruneView {
    dry_run: bool,
    runs: u64,
    records: u64,
    run_ids: Vec<String>,
    kept_for_parents: u64,
    kept_for_children: u64,
    changed_since_selection: u64,
    bytes_before: u64,
    bytes_after: u64,
}

/// `loops compact --json`.
#[derive(Debug, Serialize)]
struct CompactView {
    bytes_before: u64,
    bytes_after: u64,
    bytes_reclaimed: u64,
}

/// A progress bar on stderr; hidden for `--json` (and by indicatif when stderr is not a
/// terminal).
fn bar(len: u64, json: bool) -> ProgressBar {
    if json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} runs ({eta} left)")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Removes (or lists, with `--dry-run`) the ended runs the policy expires. A dry run only
/// reads: a store file is opened read-only and its bytes stay as they are.
pub fn prune(target: &Target, args: &PruneArgs) -> Result<()> {
    let policy = RetentionPolicy {
        max_age: args.older_than,
        keep_last: args.keep_last,
        keep_failed: args.keep_failed,
    };
    let file = target.file();
    let bytes_before = file.map_or(0, file_bytes);
    let access = if args.dry_run {
        Access::Read
    } else {
        Access::Write
    };
    let store = open::operator(target, access)?;
    let progress = bar(0, args.json || args.dry_run);
    progress.set_message("pruning");
    let pruned = store.prune(&policy, args.dry_run, &|done, total| {
        progress.set_length(total);
        progress.set_position(done);
    });
    progress.finish_and_clear();
    let pruned = pruned?;
    // redb writes its allocator state when the file closes: measure after that.
    store.close();
    let view = PruneView {
        dry_run: args.dry_run,
        runs: pruned.runs,
        records: pruned.records,
        run_ids: pruned.run_ids,
        kept_for_parents: pruned.kept_for_parents,
        kept_for_children: pruned.kept_for_children,
        changed_since_selection: pruned.changed_since_selection,
        bytes_before,
        bytes_after: file.map_or(0, file_bytes),
    };
    report(&view, args.json, file.is_some(), args.keep_failed)
}

fn report(view: &PruneView, json: bool, file: bool, keep_failed: bool) -> Result<()> {
    if json {
        return emit_json(view);
    }
    emit(&text(view, file, keep_failed))
}

/// What `loops prune` says of `view` (`file`: the store is a file, whose sizes it gives;
/// `keep_failed`: the policy keeps failed runs).
fn text(view: &PruneView, file: bool, keep_failed: bool) -> String {
    let mut out = String::new();
    if view.runs == 0 && view.kept_for_parents + view.kept_for_children > 0 {
        // The lines below say what was kept, and why.
        out.push_str(match view.dry_run {
            true => "would remove nothing\n",
            false => "nothing removed\n",
        });
    } else if view.runs == 0 {
        out.push_str("no ended run matches; nothing removed\n");
    } else if view.dry_run {
        out.push_str(&format!(
            "would remove {} run{} ({} transition records, with their steps, failures and events):\n",
            view.runs,
            plural(view.runs),
            view.records
        ));
        for id in &view.run_ids {
            out.push_str(&format!("  {}\n", paint(ID, id)));
        }
        out.push_str("(dry run: nothing removed)\n");
    } else {
        out.push_str(&format!(
            "removed {} run{} ({} transition records, with their steps, failures and events):\n",
            view.runs,
            plural(view.runs),
            view.records,
        ));
        for id in &view.run_ids {
            out.push_str(&format!("  {}\n", paint(ID, id)));
        }
        if file {
            out.push_str(&format!(
                "store file: {} before, {} after; `loops compact` returns the free pages left inside it to the file system\n",
                bytes(view.bytes_before),
                bytes(view.bytes_after),
            ));
        }
    }
    // A dry run says what the prune would keep.
    let kept = if view.dry_run { "would keep" } else { "kept" };
    if view.kept_for_parents > 0 {
        let n = view.kept_for_parents;
        let them = if n == 1 { "it" } else { "them" };
        let why = if keep_failed {
            format!(
                "whose parent has not ended (the parent may still join {them}), or is a failed \
                 run that `--keep-failed` keeps; pruned once the parent has ended, or with it"
            )
        } else {
            format!(
                "whose parent has not ended (the parent may still join {them}); pruned once it has"
            )
        };
        out.push_str(&format!("{kept} {n} ended child run{} {why}\n", plural(n)));
    }
    if view.kept_for_children > 0 {
        let n = view.kept_for_children;
        let why = if keep_failed {
            "a child run that has not ended, or a failed one that `--keep-failed` keeps"
        } else {
            "a child run that has not ended"
        };
        out.push_str(&format!(
            "{kept} {n} ended run{} whose family has {why}; pruned once that child goes \
             (`loops tree RUN` shows a family)\n",
            plural(n),
        ));
    }
    if view.changed_since_selection > 0 {
        let n = view.changed_since_selection;
        out.push_str(&format!(
            "left {n} run{} that changed after the selection (retried, given a new child run, \
             or removed by another prune meanwhile)\n",
            plural(n),
        ));
    }
    out
}

/// Compacts the store file.
pub fn compact(target: &Target, args: &JsonArg) -> Result<()> {
    let Some(path) = target.file() else {
        return Err(crate::failure::Failure::new(
            "loops compact compacts a redb store file; a PostgreSQL store returns the space of pruned runs with its own VACUUM",
        ));
    };
    let bytes_before = file_bytes(path);
    let store = open::operator(target, Access::Write)?;
    let spinner = if args.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    spinner.set_message("compacting");
    spinner.enable_steady_tick(Duration::from_millis(100));
    let compacted = store.compact();
    spinner.finish_and_clear();
    compacted?;
    // Sizes as the file system sees them, before the command and once the file is closed
    // (redb writes its allocator state on close).
    store.close();
    let bytes_after = file_bytes(path);
    let view = CompactView {
        bytes_before,
        bytes_after,
        bytes_reclaimed: bytes_before.saturating_sub(bytes_after),
    };
    if args.json {
        return emit_json(&view);
    }
    emit(&format!(
        "compacted {}\n  before     {}\n  after      {}\n  reclaimed  {}\n",
        path.display(),
        bytes(view.bytes_before),
        bytes(view.bytes_after),
        bytes(view.bytes_reclaimed),
    ))
}

/// The file's size in bytes (0 if it cannot be read; the open that follows says why).
fn file_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

#[cfg(test)]
mod tests {
    use super::{PruneView, text};

    /// Runs kept for a child and runs changed since the selection are each said on a line.
    #[test]
    fn says_the_runs_kept_for_children_and_those_changed_since_the_selection() {
        let view = PruneView {
            dry_run: false,
            runs: 1,
            records: 3,
            run_ids: vec!["old".to_owned()],
            kept_for_parents: 0,
            kept_for_children: 2,
            changed_since_selection: 1,
            bytes_before: 0,
            bytes_after: 0,
        };
        let said = |keep_failed| {
            anstream::adapter::strip_str(&text(&view, false, keep_failed)).to_string()
        };
        assert_eq!(
            said(false),
            "removed 1 run (3 transition records, with their steps, failures and events):\n  old\n\
             kept 2 ended runs whose family has a child run that has not ended; pruned once \
             that child goes (`loops tree RUN` shows a family)\n\
             left 1 run that changed after the selection (retried, given a new child run, or \
             removed by another prune meanwhile)\n"
        );
        assert!(
            said(true).contains(
                "whose family has a child run that has not ended, or a failed one that \
                 `--keep-failed` keeps;"
            ),
            "{}",
            said(true)
        );
        // A dry run says what it would keep.
        let dry = PruneView {
            dry_run: true,
            kept_for_parents: 1,
            changed_since_selection: 0,
            ..view
        };
        let said = anstream::adapter::strip_str(&text(&dry, false, false)).to_string();
        assert!(
            said.ends_with(
                "(dry run: nothing removed)\nwould keep 1 ended child run whose parent has not \
                 ended (the parent may still join it); pruned once it has\nwould keep 2 ended \
                 runs whose family has a child run that has not ended; pruned once that child \
                 goes (`loops tree RUN` shows a family)\n"
            ),
            "{said}"
        );
    }
}
