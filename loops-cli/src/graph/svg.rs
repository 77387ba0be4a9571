//! The graph as an SVG picture, laid out and drawn by `layout-rs` (a pure-Rust layered
//! layout in Graphviz's manner): no Graphviz on the user's machine.
//!
//! Each node's group carries `data-state` (the state's name; `[*] start` and `[*] end NAME`
//! for the start and end points) and a `class` (`state`, `visited`, `current`, `start`,
//! `end`); each edge's group carries `data-from`, `data-to` (the `data-state` of its ends)
//! and `data-taken`, so that a page can find them. Edge labels are drawn as text of their
//! own, beside the edge.
//!
//! layout-rs draws no dashed box, so a state that the description does not have (dashed in
//! Mermaid and DOT) is drawn with a solid line here; its edges are dashed all the same.

use std::panic::{AssertUnwindSafe, catch_unwind};

use layout::backends::svg::SVGWriter;
use layout::core::base::Orientation;
use layout::core::color::Color;
use layout::core::geometry::Point;
use layout::core::style::{LineStyleKind, StyleAttr};
use layout::std_shapes::render::get_shape_size;
use layout::std_shapes::shapes::{Arrow, Element, LineEndKind, ShapeKind};
use layout::topo::layout::VisualGraph;

use super::{End, Graph, Look};

/// The font size of state names and labels, in pixels.
const FONT: usize = 14;
/// How round the corners of a state's box are, in pixels.
const ROUNDED: usize = 8;

/// The picture, as an SVG document; `Err` with the layout's own message if `layout-rs`
/// panicked on this graph (it has not on any graph tried, see the tests).
pub fn render(g: &Graph) -> Result<String, String> {
    let drawn = catch_unwind(AssertUnwindSafe(|| {
        let mut vg = build(g);
        let mut svg = SVGWriter::new();
        vg.do_it(false, false, false, &mut svg);
        svg.finalize()
    }));
    drawn.map_err(|panic| {
        panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned())
    })
}

fn build(g: &Graph) -> VisualGraph {
    let dir = Orientation::TopToBottom;
    // As layout-rs's own DOT reader does: shapes are sized across the direction of the graph.
    let across = dir.flip();
    let mut vg = VisualGraph::new(dir);
    let dot = |filled: bool, size: f64| -> (StyleAttr, Point) {
        let fill = if filled {
            Color::new(0x000000ff)
        } else {
            Color::transparent()
        };
        (
            StyleAttr::new(Color::new(0x000000ff), 1, Some(fill), 0, FONT),
            Point::splat(size),
        )
    };
    let start = g.transitions.iter().any(|t| t.from == End::Start).then(|| {
        let (look, size) = dot(true, 18.);
        let shape = ShapeKind::Circle(String::new());
        vg.add_node(Element::create_with_properties(
            shape,
            look,
            across,
            size,
            props("start", "[*] start"),
        ))
    });
    let mut states = Vec::with_capacity(g.states.len());
    let mut ends = Vec::with_capacity(g.states.len());
    for (i, s) in g.states.iter().enumerate() {
        let look = g.state_look(i);
        let shape = ShapeKind::Box(s.name.clone());
        let size = get_shape_size(across, &shape, FONT, false);
        let class = match &g.run {
            Some(run) if run.current == i => "current",
            Some(_) if s.visits > 0 => "visited",
            _ => "state",
        };
        states.push(vg.add_node(Element::create_with_properties(
            shape,
            style(look, true),
            across,
            size,
            props(class, &s.name),
        )));
        ends.push(s.terminal.then(|| {
            let (look, size) = dot(true, 14.);
            vg.add_node(Element::create_with_properties(
                ShapeKind::DoubleCircle(String::new()),
                look,
                across,
                size,
                props("end", &format!("[*] end {}", s.name)),
            ))
        }));
    }
    for t in &g.transitions {
        let from = match t.from {
            End::Start => start,
            End::State(i) => Some(states[i]),
            End::Finish => None,
        };
        let to = match (t.from, t.to) {
            (_, End::State(i)) => Some(states[i]),
            (End::State(i), End::Finish) => ends[i],
            _ => None,
        };
        let (Some(from), Some(to)) = (from, to) else {
            continue;
        };
        let look = g.transition_look(t);
        let line = if look.dashed {
            LineStyleKind::Dashed
        } else {
            LineStyleKind::Normal
        };
        let name = |e: End| match (e, t.from) {
            (End::State(i), _) => g.states[i].name.clone(),
            (End::Finish, End::State(i)) => format!("[*] end {}", g.states[i].name),
            _ => "[*] start".to_owned(),
        };
        let properties = format!(
            "class=\"transition\" data-from=\"{}\" data-to=\"{}\" data-taken=\"{}\"",
            attr(&name(t.from)),
            attr(&name(t.to)),
            t.taken
        );
        let arrow = Arrow::with_properties(
            LineEndKind::None,
            LineEndKind::Arrow,
            line,
            &g.transition_label(t),
            &style(look, false),
            properties,
            &None,
            &None,
        );
        vg.add_edge(arrow, from, to);
    }
    vg
}

/// A look as layout-rs's style (a node is filled, an edge is not).
fn style(look: Look, node: bool) -> StyleAttr {
    let rgba = |c: u32| Color::new((c << 8) | 0xff);
    StyleAttr::new(
        rgba(look.stroke),
        usize::from(look.width),
        node.then(|| rgba(look.fill)),
        if node { ROUNDED } else { 0 },
        FONT,
    )
}

/// The attributes of a node's group.
fn props(class: &str, state: &str) -> String {
    format!("class=\"{class}\" data-state=\"{}\"", attr(state))
}

/// `text` escaped for an XML attribute value in double quotes.
fn attr(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use loops_core::{RunStatus, SchemaHash};

    /// A small deterministic generator (an LCG), so that a failure names its case.
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % n
        }
    }

    /// layout-rs asserts on its own invariants; these graphs (cycles, self-loops, states no
    /// edge reaches, moves outside the description, names to escape) lay out without one, and
    /// every result parses as XML and names every state.
    #[test]
    fn random_graphs_lay_out_and_parse() {
        let mut rng = Lcg(7);
        for case in 0..150 {
            let n = 1 + rng.below(14) as usize;
            let names: Vec<String> = (0..n)
                .map(|i| match rng.below(4) {
                    0 => format!("S{i}<&\"'>"),
                    1 => format!("Ünïcødé{i}"),
                    _ => format!("State{i}{}", "x".repeat(rng.below(10) as usize)),
                })
                .collect();
            let mut text = String::from("workflow random version 1\n");
            for (i, name) in names.iter().enumerate() {
                let flags = match (i == 0, rng.below(3) == 0) {
                    (true, _) => ", initial",
                    (false, true) => ", terminal",
                    _ => "",
                };
                text.push_str(&format!("state {name} (unit{flags})"));
                let next: Vec<&str> = (0..rng.below(4))
                    .map(|_| names[rng.below(n as u64) as usize].as_str())
                    .collect();
                if !next.is_empty() {
                    text.push_str(&format!(" -> {}", next.join(" | ")));
                }
                text.push('\n');
            }
            let mut g = Graph::from_description(&text, SchemaHash::from_u64(case)).unwrap();
            if rng.below(2) == 0 {
                let walk: Vec<&str> = (0..rng.below(12))
                    .map(|_| names[rng.below(n as u64) as usize].as_str())
                    .collect();
                g.follow("r", RunStatus::Running, &walk);
            }
            let svg = render(&g).unwrap_or_else(|e| panic!("case {case}: {e}\n{text}"));
            let doc = roxmltree::Document::parse(&svg)
                .unwrap_or_else(|e| panic!("case {case}: {e}\n{text}"));
            let drawn: Vec<&str> = doc
                .descendants()
                .filter_map(|n| n.attribute("data-state"))
                .collect();
            for name in &names {
                assert!(
                    drawn.contains(&name.as_str()),
                    "case {case}: {name}\n{text}"
                );
            }
        }
    }
}
