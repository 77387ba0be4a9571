//! `loops check`: the integrity of the store file.

use std::collections::BTreeMap;

use loops_core::RunStatus;
use serde::Serialize;

use super::block_on;
use crate::cli::JsonArg;
use crate::failure::{Failure, Result};
use crate::open::{self, Target};
use crate::output::{Cell, HEADER, Table, emit, emit_json, status_style};

/// `loops check --json`.
#[derive(Debug, Serialize)]
struct CheckView {
    path: String,
    intact: bool,
    repaired_on_open: bool,
    runs: u64,
    by_status: BTreeMap<&'static str, u64>,
}

/// Verifies every page's checksum (redb), then reads every run's row and latest record back.
pub fn run(target: &Target, args: &JsonArg) -> Result<()> {
    let Some(path) = target.file() else {
        return Err(Failure::new(
            "loops check verifies the pages of a redb store file; a PostgreSQL server checks its own data (`loops runs` reads every run's row)",
        ));
    };
    if open::served(path, &open::tokio()?)?.is_some() {
        return Err(Failure::new(format!(
            "store {} is held by a running process (it answers on its control endpoint): loops check verifies the file page by page and needs it to itself; stop the process first",
            path.display()
        )));
    }
    // A file that needs no repair is checked on a read-only open, whose verification is
    // redb's integrity check on a view in memory: the file keeps its bytes (a writable open
    // rewrites part of it when it closes). A file that needs repair, or that this open
    // refuses (damaged, say), is opened for writing: redb repairs it, or says what is wrong.
    let (runtime, store, repaired_on_open) = match loops_core::RedbStore::open_read_only(path) {
        Ok(store) => (None, store, false),
        Err(_) => {
            let (rt, repaired_on_open) = open::writable(path)?;
            let store = open::redb(path, &rt)?;
            (Some(rt), store, repaired_on_open)
        }
    };
    let reader = store.clone();
    // With a key file: the workers' check of it (a key of a listed id and other bytes, or
    // none of the store's keys, is refused as a worker would be), before the pages.
    let sealing_keys = reader.sealing_keys()?;
    let key_file = match open::key_file_keys() {
        Some(ring) => {
            loops_core::refuse_foreign_codec(
                path.display().to_string(),
                sealing_keys.clone(),
                reader.sealing_checks()?,
                &loops_core::Payloads::new(std::sync::Arc::new(ring.clone())),
            )?;
            let held: Vec<&str> = sealing_keys
                .iter()
                .map(String::as_str)
                .filter(|k| ring.key_ids().contains(k))
                .collect();
            Some(if sealing_keys.is_empty() {
                "key file: not needed, the store's payloads are in clear\n".to_owned()
            } else if held.len() == sealing_keys.len() {
                format!(
                    "key file: holds every key the store's payloads were sealed with ({})\n",
                    held.join(", ")
                )
            } else {
                format!(
                    "key file: holds key {} of those the store's payloads were sealed with ({}): payloads sealed with the others do not open\n",
                    held.join(", "),
                    sealing_keys.join(", ")
                )
            })
        }
        None => None,
    };
    let intact =
        match runtime {
            // Verified on the read-only open.
            None => true,
            Some(_) => block_on(async move {
                tokio::task::spawn_blocking(move || store.check_integrity()).await
            })?
            .map_err(|e| Failure::new(format!("cannot check store {}: {e}", path.display())))??,
        };
    let mut by_status = BTreeMap::new();
    let mut runs = 0;
    for status in RunStatus::ALL {
        let listed = reader.list(status, None)?;
        for info in &listed {
            reader.latest(&info.run_id)?;
        }
        runs += listed.len() as u64;
        by_status.insert(status.as_str(), listed.len() as u64);
    }
    let view = CheckView {
        path: path.display().to_string(),
        intact,
        repaired_on_open,
        runs,
        by_status,
    };
    let by_status = &view.by_status;
    if args.json {
        return emit_json(&view);
    }
    let verdict = if intact && !repaired_on_open {
        "intact: every page's checksum verified".to_owned()
    } else if intact {
        "intact after redb repaired it on open (it had not been closed cleanly)".to_owned()
    } else {
        "damaged, and repaired by redb's integrity check".to_owned()
    };
    let mut out = format!("store {}: {verdict}\n", path.display());
    out.push_str(key_file.as_deref().unwrap_or(""));
    out.push_str(&format!(
        "{runs} run{} read back (row and latest record of each)\n",
        if runs == 1 { "" } else { "s" }
    ));
    let mut t = Table::new();
    for status in RunStatus::ALL {
        t.row(vec![
            Cell::new(status.as_str(), status_style(status)),
            Cell::new(
                by_status
                    .get(status.as_str())
                    .copied()
                    .unwrap_or(0)
                    .to_string(),
                HEADER,
            ),
        ]);
    }
    out.push_str(&t.render(2));
    emit(&out)
}
