//! The graph as a Mermaid state diagram (`stateDiagram-v2`): GitHub, GitLab and most
//! Markdown viewers draw it from a fenced ```` ```mermaid ```` block.
//!
//! `[*]` is the start point and the end point after each terminal state. A run's path is
//! shown with classes (`visited`, and `current` in the run's status's colours) and with the
//! number of times it took each transition as the transition's label: Mermaid's state
//! diagrams cannot colour one transition.

use std::fmt::Write as _;

use super::{End, Graph, Look};

/// The diagram, ending in a newline.
pub fn render(g: &Graph) -> String {
    let ids = ids(g);
    let mut out = String::new();
    let _ = writeln!(out, "---\ntitle: {}\n---", yaml_quoted(&g.title()));
    out.push_str("stateDiagram-v2\n");
    for (id, s) in ids.iter().zip(&g.states) {
        if *id != s.name {
            let _ = writeln!(out, "    state \"{}\" as {id}", label(&s.name));
        }
    }
    for i in g.isolated() {
        if ids[i] == g.states[i].name {
            let _ = writeln!(out, "    {}", ids[i]);
        }
    }
    let end = |e: End| match e {
        End::Start | End::Finish => "[*]",
        End::State(i) => ids[i].as_str(),
    };
    for t in &g.transitions {
        let _ = write!(out, "    {} --> {}", end(t.from), end(t.to));
        let label = g.transition_label(t);
        if !label.is_empty() {
            let _ = write!(out, ": {label}");
        }
        out.push('\n');
    }
    for class in CLASSES {
        let members: Vec<usize> = (0..g.states.len())
            .filter(|&i| class_of(g, i) == Some(class))
            .collect();
        let Some(&first) = members.first() else {
            continue;
        };
        let _ = writeln!(out, "    classDef {class} {}", style(g.state_look(first)));
        let names: Vec<&str> = members.iter().map(|&i| ids[i].as_str()).collect();
        let _ = writeln!(out, "    class {} {class}", names.join(","));
    }
    out
}

/// The classes a state can have, in the order they are defined.
const CLASSES: [&str; 4] = ["visited", "visited_undescribed", "undescribed", "current"];

/// The class of state `i`: its role in the run's path, and whether the description has it.
/// States of one class have the same [`Look`].
fn class_of(g: &Graph, i: usize) -> Option<&'static str> {
    let s = &g.states[i];
    let current = g.run.as_ref().is_some_and(|r| r.current == i);
    match (current, s.visits > 0, s.described) {
        (true, _, _) => Some("current"),
        (false, true, true) => Some("visited"),
        (false, true, false) => Some("visited_undescribed"),
        (false, false, false) => Some("undescribed"),
        (false, false, true) => None,
    }
}

/// A look as a Mermaid style: `fill:#dbeafe,stroke:#2563eb,stroke-width:1px`.
fn style(look: Look) -> String {
    let mut s = format!(
        "fill:{},stroke:{},stroke-width:{}px",
        super::hex(look.fill),
        super::hex(look.stroke),
        look.width
    );
    if look.dashed {
        s.push_str(",stroke-dasharray:5 5");
    }
    s
}

/// Each state's id in the diagram: its name where Mermaid takes it as an id (an ASCII
/// identifier that is not one of its keywords), else `state_N` (made unique), declared with
/// its name as the label.
fn ids(g: &Graph) -> Vec<String> {
    let mut ids: Vec<String> = Vec::with_capacity(g.states.len());
    for (i, s) in g.states.iter().enumerate() {
        let id = if plain(&s.name) {
            s.name.clone()
        } else {
            let mut id = format!("state_{i}");
            while g.states.iter().any(|s| s.name == id) || ids.contains(&id) {
                id.push('_');
            }
            id
        };
        ids.push(id);
    }
    ids
}

/// Words of Mermaid's state diagrams that an id may not be.
const KEYWORDS: [&str; 18] = [
    "as",
    "choice",
    "class",
    "classdef",
    "click",
    "concurrent",
    "default",
    "direction",
    "end",
    "fork",
    "hide",
    "join",
    "left",
    "note",
    "of",
    "right",
    "state",
    "style",
];

fn plain(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&name.to_ascii_lowercase().as_str())
}

/// A state's name inside `state "..."`: Mermaid's entity codes for `#` and `"`.
fn label(name: &str) -> String {
    name.replace('#', "#35;").replace('"', "#quot;")
}

/// `text` as a YAML double-quoted string (for the front matter's title).
fn yaml_quoted(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use loops_core::{RunStatus, SchemaHash};

    #[test]
    fn names_that_are_not_ids_are_declared_with_a_label() {
        let text = "workflow w version 1\n\
            state end (unit, initial) -> Ünï\n\
            state Ünï (unit) -> state_1\n\
            state state_1 (unit, terminal)\n";
        let mut g = Graph::from_description(text, SchemaHash::from_u64(1)).unwrap();
        g.follow("a \"b\"", RunStatus::Waiting, &["end", "Ünï"]);
        assert_eq!(
            render(&g),
            "---\n\
             title: \"run a \\\"b\\\" (w version 1, schema 0000000000000001) waiting at Ünï after 1 transition\"\n\
             ---\n\
             stateDiagram-v2\n    \
             state \"end\" as state_0\n    \
             state \"Ünï\" as state_1_\n    \
             [*] --> state_0\n    \
             state_0 --> state_1_: 1×\n    \
             state_1_ --> state_1\n    \
             state_1 --> [*]\n    \
             classDef visited fill:#dbeafe,stroke:#2563eb,stroke-width:1px\n    \
             class state_0 visited\n    \
             classDef current fill:#fde68a,stroke:#b45309,stroke-width:3px\n    \
             class state_1_ current\n"
        );
    }
}
