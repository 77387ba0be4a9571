//! `loops schema`: the stored schemas with their runs by status, one schema's description,
//! and what changed between two of them.

use std::collections::BTreeMap;

use loops_core::{Class, SchemaDiff};
use loops_core::{RunStatus, SchemaHash};
use serde::Serialize;

use crate::cli::SchemaArgs;
use crate::description::Description;
use crate::failure::{Failure, Result, run_id_arg};
use crate::open::{self, Access, Target};
use crate::operator::{Operator, not_found};
use crate::output::{Cell, DIM, ERROR, HEADER, ID, Table, emit, emit_json, paint, status_style};

/// One stored schema, with its runs.
#[derive(Debug, Serialize)]
struct SchemaView {
    hash: String,
    /// The workflow its description names (`None` if it has no header line).
    workflow: Option<String>,
    /// The version its description declares, if it is a number.
    version: Option<u32>,
    description: String,
    runs: u64,
    /// The number of its runs in each status (every status present).
    by_status: BTreeMap<&'static str, u64>,
    /// The workflows its runs belong to.
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

/// Lists schemas, shows a run's or one by hash, or diffs two.
pub fn run(target: &Target, args: &SchemaArgs) -> Result<()> {
    let store = open::operator(target, Access::Read)?;
    if let Some(hashes) = &args.diff {
        return diff(&*store, hashes, args.json);
    }
    if let Some(given) = &args.hash {
        return by_hash(&*store, given, args.json);
    }
    match &args.run {
        Some(run) => {
            let run_id = run_id_arg(run)?;
            let Some(info) = store.run(&run_id)? else {
                return Err(run_or_hash_not_found(&*store, &run_id));
            };
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
        None => list(&*store, args.json),
    }
}

/// The failure of `loops schema RUN` for a run that does not exist: when `run_id` is a
/// stored schema's hash (or a unique prefix of one), it says `--hash` shows that schema.
fn run_or_hash_not_found(store: &dyn Operator, run_id: &str) -> Failure {
    let failure = not_found(store.label(), run_id);
    match store.schemas() {
        Ok(schemas) if resolve(store.label(), &schemas, run_id).is_ok() => Failure::new(format!(
            "{}; {run_id} is a stored schema's hash: `loops schema --hash {run_id}` shows that schema",
            failure.message
        )),
        _ => failure,
    }
}

/// Every stored schema with its runs, by workflow, version and hash.
fn views(store: &dyn Operator) -> Result<Vec<SchemaView>> {
    let mut views: BTreeMap<SchemaHash, SchemaView> = store
        .schemas()?
        .into_iter()
        .map(|(hash, description)| {
            let d = Description::parse(&description);
            let view = SchemaView {
                hash: hash.to_string(),
                version: d.version_number(),
                workflow: d.workflow,
                description,
                runs: 0,
                by_status: RunStatus::ALL.iter().map(|s| (s.as_str(), 0)).collect(),
                workflows: Vec::new(),
            };
            (hash, view)
        })
        .collect();
    for status in RunStatus::ALL {
        for info in store.list(status, None)? {
            // A run's schema is stored when the run starts; one without it is not listed.
            let Some(view) = views.get_mut(&info.schema) else {
                continue;
            };
            view.runs += 1;
            *view.by_status.entry(status.as_str()).or_default() += 1;
            if !view.workflows.contains(&info.workflow) {
                view.workflows.push(info.workflow);
            }
        }
    }
    let mut views: Vec<SchemaView> = views.into_values().collect();
    for v in &mut views {
        v.workflows.sort();
    }
    views.sort_by(|a, b| (&a.workflow, a.version, &a.hash).cmp(&(&b.workflow, b.version, &b.hash)));
    Ok(views)
}

fn list(store: &dyn Operator, json: bool) -> Result<()> {
    let views = views(store)?;
    if json {
        return emit_json(&views);
    }
    if views.is_empty() {
        return emit("no schemas stored (no run was ever started in this store)\n");
    }
    let mut header = vec!["SCHEMA", "WORKFLOW", "VERSION", "RUNS"];
    let statuses: Vec<String> = RunStatus::ALL
        .iter()
        .map(|s| s.as_str().to_ascii_uppercase())
        .collect();
    header.extend(statuses.iter().map(String::as_str));
    let mut t = Table::with_header(&header);
    for v in &views {
        let mut row = vec![
            Cell::new(&v.hash, ID),
            Cell::plain(v.workflow.clone().unwrap_or_default()),
            Cell::plain(v.version.map(|n| n.to_string()).unwrap_or_default()),
            Cell::new(v.runs.to_string(), HEADER),
        ];
        for status in RunStatus::ALL {
            let n = v.by_status.get(status.as_str()).copied().unwrap_or(0);
            let style = if n == 0 { DIM } else { status_style(status) };
            row.push(Cell::new(n.to_string(), style));
        }
        t.row(row);
    }
    emit(&t.render(0))
}

/// `loops schema --hash HASH`: one stored schema's description, with its runs.
fn by_hash(store: &dyn Operator, given: &str, json: bool) -> Result<()> {
    let (hash, _) = resolve(store.label(), &store.schemas()?, given)?;
    let hash = hash.to_string();
    let view = views(store)?
        .into_iter()
        .find(|v| v.hash == hash)
        .ok_or_else(|| Failure::new(format!("schema {hash} is no longer stored")))?;
    if json {
        return emit_json(&view);
    }
    let counts: Vec<String> = RunStatus::ALL
        .iter()
        .filter_map(|s| {
            let n = view.by_status.get(s.as_str()).copied().unwrap_or(0);
            (n > 0).then(|| format!("{n} {s}"))
        })
        .collect();
    let runs = match view.runs {
        0 => "no runs".to_owned(),
        n => format!(
            "{n} run{}: {}",
            if n == 1 { "" } else { "s" },
            counts.join(", ")
        ),
    };
    let mut out = format!(
        "{} {}  {}\n",
        paint(HEADER, "schema"),
        view.hash,
        paint(DIM, &format!("({runs})"))
    );
    out.push_str(&indent(Some(&view.description)));
    emit(&out)
}

fn diff(store: &dyn Operator, hashes: &[String], json: bool) -> Result<()> {
    let [a, b] = hashes else {
        return Err(Failure::usage("--diff takes two schema hashes"));
    };
    let stored = store.schemas()?;
    let (from, old) = resolve(store.label(), &stored, a)?;
    let (to, new) = resolve(store.label(), &stored, b)?;
    let view = DiffView {
        from: from.to_string(),
        to: to.to_string(),
        changes: loops_core::schema_diff(old, new),
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

/// The stored schema that `given` (a hash, or a unique prefix of at least 4 hex digits)
/// names, among `stored`; a usage failure if `given` is not hex of that length, a failure if
/// no stored schema or several match.
pub fn resolve<'a>(
    label: &str,
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
            "no schema {given} is stored in {label} (`loops schema` lists them)"
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

#[cfg(test)]
mod tests {
    use super::*;

    fn stored() -> Vec<(SchemaHash, String)> {
        [
            0x3f9c_0a1e_22b4_d5e6_u64,
            0x3f9c_0a1f_0000_0001,
            0x8a7b_6c5d_4e3f_2a1b,
        ]
        .into_iter()
        .map(|h| (SchemaHash::from_u64(h), format!("schema {h:x}")))
        .collect()
    }

    #[test]
    fn a_hash_or_a_unique_prefix_names_one_stored_schema() {
        let stored = stored();
        for given in ["3f9c0a1e22b4d5e6", "3f9c0a1e", "3F9C0A1E2", "8a7b"] {
            let (hash, text) = resolve("store.redb", &stored, given).unwrap();
            assert!(hash.to_string().starts_with(&given.to_ascii_lowercase()));
            assert_eq!(text, format!("schema {hash}"));
        }
    }

    #[test]
    fn an_ambiguous_or_unknown_prefix_is_a_failure_and_a_bad_one_a_usage_error() {
        let stored = stored();
        let err = resolve("store.redb", &stored, "3f9c0a1").unwrap_err();
        assert_eq!(
            (err.message.as_str(), err.code),
            (
                "schema hash prefix 3f9c0a1 matches 2 stored schemas; give more digits",
                1
            )
        );
        let err = resolve("store.redb", &stored, "0000").unwrap_err();
        assert_eq!(
            (err.message.as_str(), err.code),
            (
                "no schema 0000 is stored in store.redb (`loops schema` lists them)",
                1
            )
        );
        for bad in ["3f9", "3f9c0a1e22b4d5e6f", "xyz1"] {
            let err = resolve("store.redb", &stored, bad).unwrap_err();
            assert_eq!(err.code, 2, "{bad}: {}", err.message);
        }
    }
}
