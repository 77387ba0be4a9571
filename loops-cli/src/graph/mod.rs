//! A workflow's state graph, built from a stored schema description (no workflow code
//! needed), optionally with one run's path through it; drawn as Mermaid ([`mermaid`]),
//! Graphviz DOT ([`dot`]) or SVG ([`svg`]).
//!
//! The graph has a start point (an edge to every initial state), the states in the order the
//! description lists them, every allowed transition, and an end point after every terminal
//! state. A run's path marks the states it went through (how many times each), the
//! transitions it took (how many times each: a loop such as Tested -> Edited -> Tested counts
//! each round) and its current state, coloured by the run's status. What each of these looks
//! like is decided here, once, by [`Graph::state_look`] and [`Graph::transition_look`]; the
//! three renderers only spell it in their format.

pub mod dot;
pub mod mermaid;
pub mod svg;

use loops_core::{RunStatus, SchemaHash};

use crate::description::Description;

/// One state of the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// The state's name (never contains white space).
    pub name: String,
    /// Whether runs start here.
    pub initial: bool,
    /// Whether runs end here.
    pub terminal: bool,
    /// Whether the description has a line for this state (false for a state only named as
    /// a next state, or only found in the run's history).
    pub described: bool,
    /// How many times the run entered it (0 without a run).
    pub visits: u64,
}

/// One end of a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Where runs start (drawn as a filled dot).
    Start,
    /// The state at this index of [`Graph::states`].
    State(usize),
    /// Where runs end: the end point after a terminal state (drawn as a ringed dot).
    Finish,
}

/// One edge of the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// Where it leaves from: [`End::Start`] or a state.
    pub from: End,
    /// Where it goes: a state, or [`End::Finish`] after a terminal state.
    pub to: End,
    /// Whether the description allows it (false for a move the run made that its schema's
    /// description does not list).
    pub declared: bool,
    /// How many times the run took it (0 without a run).
    pub taken: u64,
}

/// The run whose path the graph shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPath {
    /// The run id.
    pub run_id: String,
    /// Its status.
    pub status: RunStatus,
    /// The index of its current state in [`Graph::states`].
    pub current: usize,
    /// How many transition records it has.
    pub records: usize,
}

/// A workflow's state graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    /// The workflow's name, from the description's header line.
    pub workflow: String,
    /// Its declared version, if the header gives one.
    pub version: Option<String>,
    /// The schema the description belongs to.
    pub schema: SchemaHash,
    /// The states, in the description's order (then states found only in the run's history).
    pub states: Vec<State>,
    /// The edges: from the start point, then each state's allowed transitions in declared
    /// order (and its end point if it is terminal), then moves the run made that the
    /// description does not list, in the order first made.
    pub transitions: Vec<Transition>,
    /// The run whose path is shown, if any.
    pub run: Option<RunPath>,
}

/// How a node or an edge is drawn: colours as `0xRRGGBB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// The fill colour (nodes only).
    pub fill: u32,
    /// The line colour.
    pub stroke: u32,
    /// The line width in pixels.
    pub width: u8,
    /// Drawn dashed (a transition the description does not list).
    pub dashed: bool,
}

const WHITE: u32 = 0xffffff;
const BLACK: u32 = 0x000000;
/// Edges the run did not take, when a run is shown.
const UNTAKEN: u32 = 0x9ca3af;
/// States the run went through, and transitions it took.
const VISITED_FILL: u32 = 0xdbeafe;
const PATH: u32 = 0x2563eb;

impl Graph {
    /// The graph of the description `text`, stored for schema `schema`; `None` if the text
    /// has no header line or no state line (it is not in the description format).
    pub fn from_description(text: &str, schema: SchemaHash) -> Option<Graph> {
        let d = Description::parse(text);
        let workflow = d.workflow?;
        if d.states.is_empty() {
            return None;
        }
        let mut g = Graph {
            workflow,
            version: d.version,
            schema,
            states: Vec::new(),
            transitions: Vec::new(),
            run: None,
        };
        for line in &d.states {
            // A state listed twice keeps its first line.
            if g.index(&line.name).is_none() {
                g.states.push(State {
                    name: line.name.clone(),
                    initial: line.initial,
                    terminal: line.terminal,
                    described: true,
                    visits: 0,
                });
            }
        }
        for i in 0..g.states.len() {
            if g.states[i].initial {
                g.transitions.push(edge(End::Start, End::State(i), true));
            }
        }
        for line in &d.states {
            let Some(from) = g.index(&line.name) else {
                continue;
            };
            for next in &line.next {
                let to = g.state_index(next);
                if g.find(End::State(from), End::State(to)).is_none() {
                    g.transitions
                        .push(edge(End::State(from), End::State(to), true));
                }
            }
            if line.terminal && g.find(End::State(from), End::Finish).is_none() {
                g.transitions
                    .push(edge(End::State(from), End::Finish, true));
            }
        }
        Some(g)
    }

    /// Marks the path of run `run_id` (with `status`), whose transition records are in
    /// states `history` (in seq order): each state's visits, each transition's count, the
    /// start edge into its first state and, for a completed run, the end edge after its last.
    /// A state or move that the description does not have is added, marked undeclared. An
    /// empty history marks nothing.
    pub fn follow(&mut self, run_id: &str, status: RunStatus, history: &[&str]) {
        if history.is_empty() {
            return;
        }
        let mut previous = End::Start;
        for name in history {
            let i = self.state_index(name);
            self.states[i].visits += 1;
            self.take(previous, End::State(i));
            previous = End::State(i);
        }
        let End::State(current) = previous else {
            return;
        };
        if status == RunStatus::Completed && self.states[current].terminal {
            self.take(previous, End::Finish);
        }
        self.run = Some(RunPath {
            run_id: run_id.to_owned(),
            status,
            current,
            records: history.len(),
        });
    }

    /// How state `i` is drawn: plain; visited by the run; or the run's current state, in its
    /// status's colours with a thick line.
    pub fn state_look(&self, i: usize) -> Look {
        let plain = Look {
            fill: WHITE,
            stroke: BLACK,
            width: 1,
            dashed: !self.states[i].described,
        };
        match &self.run {
            Some(run) if run.current == i => {
                let (fill, stroke) = status_colours(run.status);
                Look {
                    fill,
                    stroke,
                    width: 3,
                    ..plain
                }
            }
            Some(_) if self.states[i].visits > 0 => Look {
                fill: VISITED_FILL,
                stroke: PATH,
                ..plain
            },
            _ => plain,
        }
    }

    /// How transition `t` is drawn: plain without a run; with one, in the path's colour and
    /// thicker if the run took it, grey if not; dashed if the description does not list it.
    pub fn transition_look(&self, t: &Transition) -> Look {
        let (stroke, width) = match (&self.run, t.taken) {
            (None, _) => (BLACK, 1),
            (Some(_), 0) => (UNTAKEN, 1),
            (Some(_), _) => (PATH, 2),
        };
        Look {
            fill: WHITE,
            stroke,
            width,
            dashed: !t.declared,
        }
    }

    /// The words on transition `t`: how many times the run took it (`2×`), and whether the
    /// description lists it; empty for an edge of the start or end point, and without a run.
    pub fn transition_label(&self, t: &Transition) -> String {
        let inner = matches!((t.from, t.to), (End::State(_), End::State(_)));
        match (inner && self.run.is_some() && t.taken > 0, t.declared) {
            (true, true) => format!("{}×", t.taken),
            (true, false) => format!("{}× (not in this schema)", t.taken),
            (false, _) => String::new(),
        }
    }

    /// A one-line title: the workflow, its version and schema; with a run, where it stands.
    pub fn title(&self) -> String {
        let version = self
            .version
            .as_ref()
            .map(|v| format!(" version {v}"))
            .unwrap_or_default();
        let workflow = format!("{}{version}, schema {}", self.workflow, self.schema);
        match &self.run {
            None => workflow,
            Some(run) => {
                format!(
                    "run {} ({workflow}) {} at {} after {}",
                    run.run_id,
                    run.status,
                    self.states[run.current].name,
                    crate::output::transitions(run.records)
                )
            }
        }
    }

    /// The states that no transition touches (a renderer must declare them on their own).
    pub fn isolated(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.states.len()).filter(|&i| {
            !self
                .transitions
                .iter()
                .any(|t| t.from == End::State(i) || t.to == End::State(i))
        })
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.states.iter().position(|s| s.name == name)
    }

    /// The index of state `name`, adding it (undescribed) if the graph does not have it.
    fn state_index(&mut self, name: &str) -> usize {
        self.index(name).unwrap_or_else(|| {
            self.states.push(State {
                name: name.to_owned(),
                initial: false,
                terminal: false,
                described: false,
                visits: 0,
            });
            self.states.len() - 1
        })
    }

    fn find(&self, from: End, to: End) -> Option<usize> {
        self.transitions
            .iter()
            .position(|t| t.from == from && t.to == to)
    }

    /// Counts one use of the edge `from -> to`, adding it (undeclared) if it is not there.
    fn take(&mut self, from: End, to: End) {
        let i = self.find(from, to).unwrap_or_else(|| {
            self.transitions.push(edge(from, to, false));
            self.transitions.len() - 1
        });
        self.transitions[i].taken += 1;
    }
}

fn edge(from: End, to: End, declared: bool) -> Transition {
    Transition {
        from,
        to,
        declared,
        taken: 0,
    }
}

/// The fill and line colours of a current state with `status`.
fn status_colours(status: RunStatus) -> (u32, u32) {
    match status {
        RunStatus::Running => (0xbfdbfe, 0x1d4ed8),
        RunStatus::Waiting => (0xfde68a, 0xb45309),
        RunStatus::Completed => (0xbbf7d0, 0x15803d),
        RunStatus::Failed => (0xfecaca, 0xb91c1c),
        RunStatus::Cancelled => (0xe5e7eb, 0x4b5563),
        RunStatus::Blocked => (0xfed7aa, 0xc2410c),
    }
}

/// `0xRRGGBB` as `#rrggbb`.
pub fn hex(colour: u32) -> String {
    format!("#{colour:06x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "workflow loop version 2\n\
        state A (struct, initial) -> B\n  x: u8\n\
        state B (unit) -> A | C | Z\n\
        state C (unit, terminal)\n\
        state Lone (unit)\n";

    fn graph() -> Graph {
        Graph::from_description(TEXT, SchemaHash::from_u64(0xab)).unwrap()
    }

    #[test]
    fn states_and_transitions_in_description_order() {
        let g = graph();
        let names: Vec<(&str, bool)> = g
            .states
            .iter()
            .map(|s| (s.name.as_str(), s.described))
            .collect();
        // Z is only named as a next state.
        assert_eq!(
            names,
            [
                ("A", true),
                ("B", true),
                ("C", true),
                ("Lone", true),
                ("Z", false)
            ]
        );
        let edges: Vec<(End, End)> = g.transitions.iter().map(|t| (t.from, t.to)).collect();
        use End::*;
        assert_eq!(
            edges,
            [
                (Start, State(0)),
                (State(0), State(1)),
                (State(1), State(0)),
                (State(1), State(2)),
                (State(1), State(4)),
                (State(2), Finish),
            ]
        );
        assert_eq!(g.isolated().collect::<Vec<_>>(), [3]);
        assert_eq!(g.title(), "loop version 2, schema 00000000000000ab");
        assert!(
            g.transitions
                .iter()
                .all(|t| g.transition_label(t).is_empty())
        );
    }

    #[test]
    fn a_run_path_counts_loops_and_adds_undeclared_moves() {
        let mut g = graph();
        g.follow(
            "r-1",
            RunStatus::Completed,
            &["A", "B", "A", "B", "Lone", "C"],
        );
        let visits: Vec<u64> = g.states.iter().map(|s| s.visits).collect();
        assert_eq!(visits, [2, 2, 1, 1, 0]);
        let taken: Vec<(End, End, bool, u64)> = g
            .transitions
            .iter()
            .map(|t| (t.from, t.to, t.declared, t.taken))
            .collect();
        use End::*;
        assert_eq!(
            taken,
            [
                (Start, State(0), true, 1),
                (State(0), State(1), true, 2),
                (State(1), State(0), true, 1),
                (State(1), State(2), true, 0),
                (State(1), State(4), true, 0),
                (State(2), Finish, true, 1),
                (State(1), State(3), false, 1),
                (State(3), State(2), false, 1),
            ]
        );
        assert_eq!(g.transition_label(&g.transitions[1]), "2×");
        assert_eq!(
            g.transition_label(&g.transitions[6]),
            "1× (not in this schema)"
        );
        assert_eq!(g.transition_label(&g.transitions[3]), "");
        assert_eq!(g.transition_label(&g.transitions[0]), "");
        assert_eq!(
            g.title(),
            "run r-1 (loop version 2, schema 00000000000000ab) completed at C after 5 transitions"
        );
        let current = g.state_look(2);
        assert_eq!((current.fill, current.width), (0xbbf7d0, 3));
        assert_eq!(g.state_look(0).fill, VISITED_FILL);
        assert_eq!(g.state_look(4).fill, WHITE);
        assert!(g.state_look(4).dashed);
        assert_eq!(g.transition_look(&g.transitions[3]).stroke, UNTAKEN);
        assert!(g.transition_look(&g.transitions[6]).dashed);
    }

    #[test]
    fn text_that_is_not_a_description_has_no_graph() {
        let hash = SchemaHash::from_u64(1);
        assert!(Graph::from_description("", hash).is_none());
        assert!(Graph::from_description("workflow w version 1\n", hash).is_none());
        assert!(Graph::from_description("state A (unit, initial)\n", hash).is_none());
    }
}
