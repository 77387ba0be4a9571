//! `loops schema`: stored schema descriptions, and what changed between two of them.

use std::collections::BTreeMap;
use std::path::Path;

use loops_core::schema::{Class, SchemaDiff};
use loops_core::{RedbStore, RunStatus, SchemaHash};
use serde::Serialize;

use super::show::not_found;
use crate::cli::SchemaArgs;
use crate::failure::{Failure, Result, run_id_arg};
use crate::open;
use crate::output::{DIM, ERROR, HEADER, ID, emit, emit_json, paint};

/// One stored schema.
#[derive(Debug, Serialize)]
struct SchemaView {
    hash: String,
    description: String,
    runs: u64,
    workflows: Vec<String>,
}

/// One run's schema.
#[derive(Debug, Serialize)]
struct RunSchemaView {
    run_id: String,
    workflow: String,
    hash: String,
    description: Option<String>,
}

/// What changed between two schemas: each change's text, class (`compatible`, `breaking`,
/// or `if_no_pending_run` with its `state`) and reason.
#[derive(Debug, Serialize)]
struct DiffView {
    from: String,
    to: String,
    changes: SchemaDiff,
}

/// Lists schemas, shows a run's, or diffs two.
pub fn run(path: &Path, args: &SchemaArgs) -> Result<()> {
    if let Some(hashes) = &args.diff {
        return diff(path, hashes, args.json);
    }
    let store = open::read_only(path)?;
    match &args.run {
        Some(run) => {
            let run_id = run_id_arg(run)?;
            let info = store
                .run(&run_id)?
                .ok_or_else(|| not_found(path, &run_id))?;
            let view = RunSchemaView {
                description: store.schema(info.schema)?,
                hash: info.schema.to_string(),
                workflow: info.workflow,
                run_id,
            };
            if args.json {
                return emit_json(&view);
            }
            let mut out = format!(
                "{} {} (run {}, workflow {})\n",
                paint(HEADER, "schema"),
                view.hash,
                paint(ID, &view.run_id),
                view.workflow
            );
            out.push_str(&indent(view.description.as_deref()));
            emit(&out)
        }
        None => list(&store, args.json),
    }
}

fn list(store: &RedbStore, json: bool) -> Result<()> {
    let mut usage: BTreeMap<SchemaHash, (u64, Vec<String>)> = BTreeMap::new();
    for status in RunStatus::ALL {
        for info in store.list(status, None)? {
            let entry = usage.entry(info.schema).or_default();
            entry.0 += 1;
            if !entry.1.contains(&info.workflow) {
                entry.1.push(info.workflow);
            }
        }
    }
    let views: Vec<SchemaView> = store
        .schemas()?
        .into_iter()
        .map(|(hash, description)| {
            let (runs, mut workflows) = usage.remove(&hash).unwrap_or_default();
            workflows.sort();
            SchemaView {
                hash: hash.to_string(),
                description,
                runs,
                workflows,
            }
        })
        .collect();
    if json {
        return emit_json(&views);
    }
    let mut out = String::new();
    for (i, v) in views.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let used = if v.runs == 0 {
            "no runs".to_owned()
        } else {
            format!(
                "{} run{} of {}",
                v.runs,
                if v.runs == 1 { "" } else { "s" },
                v.workflows.join(", ")
            )
        };
        out.push_str(&format!(
            "{} {}  {}\n",
            paint(HEADER, "schema"),
            v.hash,
            paint(DIM, &format!("({used})"))
        ));
        out.push_str(&indent(Some(&v.description)));
    }
    if views.is_empty() {
        out.push_str("no schemas stored (no run was ever started in this store)\n");
    }
    emit(&out)
}

fn diff(path: &Path, hashes: &[String], json: bool) -> Result<()> {
    let [a, b] = hashes else {
        return Err(Failure::usage("--diff takes two schema hashes"));
    };
    let store = open::read_only(path)?;
    let stored = store.schemas()?;
    let (from, old) = resolve(path, &stored, a)?;
    let (to, new) = resolve(path, &stored, b)?;
    let view = DiffView {
        from: from.to_string(),
        to: to.to_string(),
        changes: loops_core::schema::schema_diff(old, new),
    };
    if json {
        return emit_json(&view);
    }
    let mut out = format!("{} {} → {}\n", paint(HEADER, "schema"), view.from, view.to);
    if view.changes.is_empty() {
        out.push_str("  no differences between the descriptions\n");
    }
    for change in &view.changes {
        let style = match change.class {
            Class::Compatible => crate::output::status_style(RunStatus::Completed),
            Class::IfNoPendingRun { .. } => crate::output::status_style(RunStatus::Waiting),
            _ => ERROR,
        };
        out.push_str(&format!(
            "  {} {} {}\n",
            paint(style, &format!("[{}]", change.class)),
            change.text,
            paint(DIM, &format!("({})", change.reason))
        ));
    }
    emit(&out)
}

/// The stored schema that `given` (a hash, or a unique prefix of at least 4 hex digits) names.
fn resolve<'a>(
    path: &Path,
    stored: &'a [(SchemaHash, String)],
    given: &str,
) -> Result<(SchemaHash, &'a str)> {
    let want = given.to_ascii_lowercase();
    if want.len() < 4 || want.len() > 16 || !want.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Failure::usage(format!(
            "invalid schema hash {given:?}: expected 16 hex digits (or a unique prefix of at least 4)"
        )));
    }
    let found: Vec<&(SchemaHash, String)> = stored
        .iter()
        .filter(|(h, _)| h.to_string().starts_with(&want))
        .collect();
    match found.as_slice() {
        [(hash, text)] => Ok((*hash, text.as_str())),
        [] => Err(Failure::new(format!(
            "no schema {given} is stored in {} (`loops schema` lists them)",
            path.display()
        ))),
        _ => Err(Failure::new(format!(
            "schema hash prefix {given} matches {} stored schemas; give more digits",
            found.len()
        ))),
    }
}

fn indent(text: Option<&str>) -> String {
    match text {
        Some(text) => text
            .lines()
            .map(|l| format!("  {}\n", paint(DIM, l)))
            .collect(),
        None => "  (no description stored)\n".to_owned(),
    }
}
