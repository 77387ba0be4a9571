//! `loops graph`: a workflow's state graph from its stored schema description, or the path
//! one run took through it.

use std::collections::BTreeMap;
use std::path::Path;

use loops_core::{RunStatus, SchemaHash};

use super::schema::resolve;
use crate::cli::{GraphArgs, GraphFormat};
use crate::description::Description;
use crate::failure::{Failure, Result, run_id_arg};
use crate::graph::{self, Graph};
use crate::open::{self, Access, Target};
use crate::operator::{Operator, not_found};
use crate::output::{emit, note};

/// Draws the graph `args` asks for.
pub fn run(target: &Target, args: &GraphArgs) -> Result<()> {
    let to_stdout = args.svg.as_deref() == Some(Path::new("-"));
    if to_stdout && args.format.is_some() {
        return Err(Failure::usage(
            "--svg - and --format both write to stdout; write the SVG to a file, or leave out --format",
        ));
    }
    let store = open::operator(target, Access::Read)?;
    let graph = match &args.run {
        Some(run) => run_graph(&*store, &run_id_arg(run)?, args.workflow.as_deref())?,
        None => {
            let (hash, text) = choose(&*store, args.workflow.as_deref(), args.schema.as_deref())?;
            graph_of(&text, hash)?
        }
    };
    let format = match (args.format, &args.svg) {
        (Some(format), _) => Some(format),
        (None, Some(_)) => None,
        (None, None) => Some(GraphFormat::Mermaid),
    };
    if let Some(file) = &args.svg {
        let svg = graph::svg::render(&graph).map_err(|panic| {
            Failure::new(format!(
                "cannot lay out the graph of workflow `{}` as SVG (layout-rs failed: {panic}); --format mermaid or --format dot still draw it",
                graph.workflow
            ))
        })?;
        if to_stdout {
            emit(&svg)?;
        } else {
            std::fs::write(file, svg).map_err(|e| {
                Failure::new(format!("cannot write the SVG to {}: {e}", file.display()))
            })?;
        }
    }
    match format {
        Some(GraphFormat::Mermaid) => emit(&graph::mermaid::render(&graph)),
        Some(GraphFormat::Dot) => emit(&graph::dot::render(&graph)),
        None => Ok(()),
    }
}

/// The graph of the description `text` of schema `hash`, or a failure saying that it is not
/// in the description format.
fn graph_of(text: &str, hash: SchemaHash) -> Result<Graph> {
    Graph::from_description(text, hash).ok_or_else(|| {
        Failure::new(format!(
            "the stored description of schema {hash} has no workflow line or no state line, so there is no graph to draw (`loops schema --hash {hash}` prints it)"
        ))
    })
}

/// The graph of run `run_id`'s schema, with the run's path through it (`loops graph --run`
/// and the web UI). Fails if the run does not exist, is not of `workflow` (when given), or its
/// schema's description is not stored or has no graph.
pub fn run_graph(store: &dyn Operator, run_id: &str, workflow: Option<&str>) -> Result<Graph> {
    let info = store
        .run(run_id)?
        .ok_or_else(|| not_found(store.label(), run_id))?;
    if let Some(want) = workflow.filter(|w| *w != info.workflow) {
        return Err(Failure::new(format!(
            "run `{run_id}` is a run of workflow `{}`, not `{want}`",
            info.workflow
        )));
    }
    let text = store.schema(info.schema)?.ok_or_else(|| {
        Failure::new(format!(
            "run `{run_id}` was recorded with schema {}, whose description is not stored, so there is no graph to draw",
            info.schema
        ))
    })?;
    let mut graph = graph_of(&text, info.schema)?;
    let history = store.history(run_id)?;
    // A migration's record re-records the run's state under the new schema: the run did
    // not move, so it is not drawn as a move (it is one only if the migration renamed it).
    let mut states: Vec<&str> = Vec::with_capacity(history.len());
    for r in &history {
        let same = states.last() == Some(&r.state.as_str());
        if !(r.migrated.is_some() && same) {
            states.push(&r.state);
        }
    }
    graph.follow(run_id, info.status, &states);
    Ok(graph)
}

/// The stored schema to draw: the one `--schema` names (which must be of `workflow`, if
/// given), else the newest of `workflow`'s.
///
/// Schemas carry no time of their own, so the newest is that of the workflow's most recently
/// created run; schemas whose runs are all gone come after those with runs, by declared
/// version. A tie between schemas without runs is refused with a list to pick from.
fn choose(
    store: &dyn Operator,
    workflow: Option<&str>,
    schema: Option<&str>,
) -> Result<(SchemaHash, String)> {
    let stored = store.schemas()?;
    if let Some(given) = schema {
        let (hash, text) = resolve(store.label(), &stored, given)?;
        let of = Description::parse(text).workflow;
        if let Some(want) = workflow.filter(|w| of.as_deref() != Some(*w)) {
            return Err(Failure::new(format!(
                "schema {hash} is a schema of workflow `{}`, not `{want}`",
                of.as_deref().unwrap_or("(unnamed)")
            )));
        }
        return Ok((hash, text.to_owned()));
    }
    let Some(workflow) = workflow else {
        return Err(Failure::usage(
            "give a WORKFLOW, --schema HASH or --run RUN",
        ));
    };
    let candidates: Vec<(SchemaHash, &str, Option<u32>)> = stored
        .iter()
        .filter_map(|(hash, text)| {
            let d = Description::parse(text);
            (d.workflow.as_deref() == Some(workflow))
                .then(|| (*hash, text.as_str(), d.version_number()))
        })
        .collect();
    if candidates.is_empty() {
        let mut names: Vec<String> = stored
            .iter()
            .filter_map(|(_, text)| Description::parse(text).workflow)
            .collect();
        names.sort();
        names.dedup();
        let known = if names.is_empty() {
            "none is stored".to_owned()
        } else {
            format!("stored: {}", names.join(", "))
        };
        return Err(Failure::new(format!(
            "no schema of workflow `{workflow}` is stored in {} ({known})",
            store.label()
        )));
    }
    if let [(hash, text, _)] = candidates.as_slice() {
        return Ok((*hash, (*text).to_owned()));
    }
    // The creation time of each schema's newest run.
    let mut newest: BTreeMap<SchemaHash, u64> = BTreeMap::new();
    for status in RunStatus::ALL {
        for info in store.list(status, Some(workflow))? {
            let at = newest.entry(info.schema).or_default();
            *at = (*at).max(info.created_ms);
        }
    }
    let rank = |&(hash, _, version): &(SchemaHash, &str, Option<u32>)| {
        (newest.get(&hash).copied(), version)
    };
    let best = candidates.iter().map(rank).max().unwrap_or_default();
    let picked: Vec<&(SchemaHash, &str, Option<u32>)> =
        candidates.iter().filter(|c| rank(c) == best).collect();
    let hashes: Vec<String> = candidates.iter().map(|(h, _, _)| h.to_string()).collect();
    match picked.as_slice() {
        [(hash, text, _)] => {
            let why = if best.0.is_some() {
                "that of its most recently created run"
            } else {
                "none has runs left; the highest version"
            };
            note(&format!(
                "workflow `{workflow}` has {} stored schemas ({}); drawing {hash} ({why}); --schema HASH draws another",
                candidates.len(),
                hashes.join(", ")
            ));
            Ok((*hash, (*text).to_owned()))
        }
        _ => Err(Failure::new(format!(
            "workflow `{workflow}` has {} stored schemas and no run tells which is the newest: pick one with --schema HASH ({})",
            candidates.len(),
            hashes.join(", ")
        ))),
    }
}
