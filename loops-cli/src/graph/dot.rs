//! The graph in Graphviz's DOT language (`dot -Tsvg`, `dot -Tpng`, and every tool that reads
//! DOT).
//!
//! States are rounded boxes, the start point a filled dot, the end point after each terminal
//! state a ringed dot. Ids are quoted; the start and end points' ids contain a space, which
//! no state name does, so they never collide with a state.

use std::fmt::Write as _;

use super::{End, Graph, Look, hex};

/// The graph, ending in a newline.
pub fn render(g: &Graph) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph {} {{", quoted(&g.workflow));
    let _ = writeln!(out, "    label={};", quoted(&g.title()));
    out.push_str("    labelloc=t;\n");
    out.push_str("    node [shape=box, style=rounded];\n");
    if g.transitions.iter().any(|t| t.from == End::Start) {
        let _ = writeln!(
            out,
            "    {} [shape=circle, style=filled, fillcolor=\"#000000\", label=\"\", width=0.2];",
            id(g, End::Start)
        );
    }
    for (i, s) in g.states.iter().enumerate() {
        let look = g.state_look(i);
        let mut attrs = Vec::new();
        let plain = g.run.is_none() && s.described;
        if !plain {
            let style = if look.dashed {
                "rounded,filled,dashed"
            } else {
                "rounded,filled"
            };
            attrs.push(format!("style=\"{style}\""));
            attrs.extend(colours(look, true));
        }
        let _ = write!(out, "    {}", id(g, End::State(i)));
        if !attrs.is_empty() {
            let _ = write!(out, " [{}]", attrs.join(", "));
        }
        out.push_str(";\n");
        if s.terminal {
            let _ = writeln!(
                out,
                "    {} [shape=doublecircle, style=filled, fillcolor=\"#000000\", label=\"\", width=0.12];",
                end_id(&s.name)
            );
        }
    }
    for t in &g.transitions {
        let look = g.transition_look(t);
        let mut attrs = Vec::new();
        if g.run.is_some() {
            attrs.extend(colours(look, false));
        }
        if look.dashed {
            attrs.push("style=dashed".to_owned());
        }
        let label = g.transition_label(t);
        if !label.is_empty() {
            attrs.push(format!("label={}", quoted(&label)));
        }
        let to = match t.to {
            End::Finish => match t.from {
                End::State(i) => end_id(&g.states[i].name),
                _ => continue,
            },
            other => id(g, other),
        };
        let _ = write!(out, "    {} -> {to}", id(g, t.from));
        if !attrs.is_empty() {
            let _ = write!(out, " [{}]", attrs.join(", "));
        }
        out.push_str(";\n");
    }
    out.push_str("}\n");
    out
}

/// `color`, `penwidth` (when over 1) and, for a node, `fillcolor`.
fn colours(look: Look, node: bool) -> Vec<String> {
    let mut attrs = Vec::new();
    if node {
        attrs.push(format!("fillcolor=\"{}\"", hex(look.fill)));
    }
    attrs.push(format!("color=\"{}\"", hex(look.stroke)));
    if look.width > 1 {
        attrs.push(format!("penwidth={}", look.width));
    }
    attrs
}

/// The quoted DOT id of a state or of the start point.
fn id(g: &Graph, e: End) -> String {
    match e {
        End::Start => quoted("[*] start"),
        End::State(i) => quoted(&g.states[i].name),
        End::Finish => quoted("[*] end"),
    }
}

/// The end point after terminal state `name`.
fn end_id(name: &str) -> String {
    quoted(&format!("[*] end {name}"))
}

/// `text` as a DOT quoted string.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use loops_core::{RunStatus, SchemaHash};

    #[test]
    fn undeclared_moves_and_states_are_dashed_and_names_quoted() {
        let text = "workflow \"w \\\"x\\\"\" version 1\n\
            state A (unit, initial) -> B\n\
            state B (unit, terminal)\n";
        let mut g = Graph::from_description(text, SchemaHash::from_u64(1)).unwrap();
        g.follow("r", RunStatus::Failed, &["A", "Gone"]);
        assert_eq!(
            render(&g),
            "digraph \"w \\\"x\\\"\" {\n    \
             label=\"run r (w \\\"x\\\" version 1, schema 0000000000000001) failed at Gone after 1 transition\";\n    \
             labelloc=t;\n    \
             node [shape=box, style=rounded];\n    \
             \"[*] start\" [shape=circle, style=filled, fillcolor=\"#000000\", label=\"\", width=0.2];\n    \
             \"A\" [style=\"rounded,filled\", fillcolor=\"#dbeafe\", color=\"#2563eb\"];\n    \
             \"B\" [style=\"rounded,filled\", fillcolor=\"#ffffff\", color=\"#000000\"];\n    \
             \"[*] end B\" [shape=doublecircle, style=filled, fillcolor=\"#000000\", label=\"\", width=0.12];\n    \
             \"Gone\" [style=\"rounded,filled,dashed\", fillcolor=\"#fecaca\", color=\"#b91c1c\", penwidth=3];\n    \
             \"[*] start\" -> \"A\" [color=\"#2563eb\", penwidth=2];\n    \
             \"A\" -> \"B\" [color=\"#9ca3af\"];\n    \
             \"B\" -> \"[*] end B\" [color=\"#9ca3af\"];\n    \
             \"A\" -> \"Gone\" [color=\"#2563eb\", penwidth=2, style=dashed, label=\"1× (not in this schema)\"];\n\
             }\n"
        );
    }
}
