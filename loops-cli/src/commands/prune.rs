//! `loops prune` and `loops compact`: removing ended runs and returning the space.

use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use loops_core::RetentionPolicy;
use loops_core::record::now_ms;
use loops_core::store::redb::PRUNE_BATCH;
use serde::Serialize;

use super::block_on;
use crate::cli::{JsonArg, PruneArgs};
use crate::failure::Result;
use crate::open;
use crate::output::{ID, bytes, emit, emit_json, paint};

/// `loops prune --json`.
#[derive(Debug, Serialize)]
struct PruneView {
    dry_run: bool,
    runs: u64,
    records: u64,
    run_ids: Vec<String>,
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

/// Removes (or lists, with `--dry-run`) the ended runs the policy expires.
pub fn prune(path: &Path, args: &PruneArgs) -> Result<()> {
    let policy = RetentionPolicy {
        max_age: args.older_than,
        keep_last: args.keep_last,
        keep_failed: args.keep_failed,
    };
    let bytes_before = file_bytes(path);
    if args.dry_run {
        // Selecting (and counting records) needs no write: a dry run opens read-only and
        // leaves the file's bytes as they are.
        let store = open::read_only(path)?;
        let selected = block_on(store.prune(&policy, now_ms(), true))??;
        let view = PruneView {
            dry_run: true,
            runs: selected.runs,
            records: selected.records,
            run_ids: selected.run_ids,
            bytes_before,
            bytes_after: bytes_before,
        };
        return report(&view, args.json);
    }
    let (rt, _) = open::writable(path)?;
    // Select as a dry run would, then delete in chunks to show progress.
    let selected = block_on(rt.prune_with(&policy, true))??;
    let mut view = PruneView {
        dry_run: false,
        runs: selected.runs,
        records: selected.records,
        run_ids: selected.run_ids,
        bytes_before,
        bytes_after: bytes_before,
    };
    if !view.run_ids.is_empty() {
        let progress = bar(view.runs, args.json);
        progress.set_message("pruning");
        // About 50 steps of progress, at most PRUNE_BATCH runs per commit.
        let chunk = (view.run_ids.len() / 50).clamp(1, PRUNE_BATCH);
        let store = open::redb(path, &rt)?;
        let mut records = 0;
        let outcome: loops_core::Result<()> = block_on(async {
            for ids in view.run_ids.chunks(chunk) {
                records += store.delete_ended_runs(ids).await?;
                progress.inc(ids.len() as u64);
            }
            Ok(())
        })?;
        progress.finish_and_clear();
        outcome?;
        view.records = records;
    }
    // redb writes its allocator state when the file closes: measure after that.
    drop(rt);
    view.bytes_after = file_bytes(path);
    report(&view, args.json)
}

fn report(view: &PruneView, json: bool) -> Result<()> {
    if json {
        return emit_json(view);
    }
    let mut out = String::new();
    if view.runs == 0 {
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
            "removed {} run{} ({} transition records, with their steps, failures and events)\nstore file: {} before, {} after; `loops compact` returns the free pages left inside it to the file system\n",
            view.runs,
            plural(view.runs),
            view.records,
            bytes(view.bytes_before),
            bytes(view.bytes_after),
        ));
    }
    emit(&out)
}

/// Compacts the store file.
pub fn compact(path: &Path, args: &JsonArg) -> Result<()> {
    let bytes_before = file_bytes(path);
    let (rt, _) = open::writable(path)?;
    let spinner = if args.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    spinner.set_message("compacting");
    spinner.enable_steady_tick(Duration::from_millis(100));
    let compacted = block_on(rt.compact());
    spinner.finish_and_clear();
    compacted??;
    // Sizes as the file system sees them, before the command and once the file is closed
    // (redb writes its allocator state on close).
    drop(rt);
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

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}
