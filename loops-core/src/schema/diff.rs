//! What changed between two schema descriptions, in words.

use std::collections::BTreeMap;

/// What changed between the description `old` (as stored with a run) and `new` (the compiled
/// [`Workflow::SCHEMA`](crate::Workflow::SCHEMA)), one human-readable line per change, such as
/// ``state `Tested`: field `report.log: String` added``.
///
/// The runtime calls it when it refuses a run whose stored schema hash differs from the
/// compiled one. The result is empty when the descriptions are the same (for instance when
/// only loops' own record format changed). Lines of either text that are not in the
/// description format are compared as whole lines.
///
/// ```
/// let old = "workflow deliver version 1\n\
///            state Tested (struct) -> Done\n  report: Report\n  report.passed: bool\n";
/// let new = "workflow deliver version 1\n\
///            state Tested (struct) -> Done\n  report: Report\n  report.passed: bool\n  report.log: String\n";
/// assert_eq!(
///     loops_core::schema::schema_diff(old, new),
///     ["state `Tested`: field `report.log: String` added"]
/// );
/// ```
pub fn schema_diff(old: &str, new: &str) -> Vec<String> {
    let (old, new) = (Parsed::new(old), Parsed::new(new));
    let mut changes = Vec::new();
    match (&old.workflow, &new.workflow) {
        (Some(a), Some(b)) => {
            if a.name != b.name {
                changes.push(format!(
                    "workflow renamed from `{}` to `{}`",
                    a.name, b.name
                ));
            }
            if a.version != b.version {
                changes.push(format!(
                    "version changed from {} to {}",
                    a.version, b.version
                ));
            }
            if a.notes != b.notes {
                changes.push(format!(
                    "workflow storage changed from `{}` to `{}`",
                    or_none(&a.notes),
                    or_none(&b.notes)
                ));
            }
        }
        (a, b) if a != b => changes.push(format!(
            "workflow header changed from `{}` to `{}`",
            a.as_ref().map_or("", |h| &h.line),
            b.as_ref().map_or("", |h| &h.line)
        )),
        _ => {}
    }
    for state in &new.order {
        let b = &new.states[state];
        let Some(a) = old.states.get(state) else {
            changes.push(format!("state `{state}` added"));
            continue;
        };
        state_changes(state, a, b, &mut changes);
    }
    for state in &old.order {
        if !new.states.contains_key(state) {
            changes.push(format!("state `{state}` removed"));
        }
    }
    for line in &new.other {
        if !old.other.contains(line) {
            changes.push(format!("line `{line}` added"));
        }
    }
    for line in &old.other {
        if !new.other.contains(line) {
            changes.push(format!("line `{line}` removed"));
        }
    }
    changes
}

fn or_none(s: &str) -> &str {
    if s.is_empty() { "default" } else { s }
}

fn state_changes(name: &str, a: &State, b: &State, changes: &mut Vec<String>) {
    let mut say = |what: String| changes.push(format!("state `{name}`: {what}"));
    if a.stored != b.stored {
        say(format!("now stored as {} (was {})", b.stored, a.stored));
    }
    if a.kind != b.kind {
        say(format!("now a {} variant (was {})", b.kind, a.kind));
    }
    match (a.initial, b.initial) {
        (false, true) => say("now the initial state".to_owned()),
        (true, false) => say("no longer the initial state".to_owned()),
        _ => {}
    }
    match (a.terminal, b.terminal) {
        (false, true) => say("now terminal".to_owned()),
        (true, false) => say("no longer terminal".to_owned()),
        _ => {}
    }
    if a.notes != b.notes {
        say(format!(
            "serde attributes changed from `{}` to `{}`",
            or_none(&a.notes),
            or_none(&b.notes)
        ));
    }
    for next in &b.next {
        if !a.next.contains(next) {
            say(format!("may now move to `{next}`"));
        }
    }
    for next in &a.next {
        if !b.next.contains(next) {
            say(format!("may no longer move to `{next}`"));
        }
    }
    for (path, value) in &b.fields {
        let what = if is_variant(path) { "variant" } else { "field" };
        match a.fields.iter().find(|(p, _)| p == path) {
            None => say(format!("{what} `{}` added", entry(path, value))),
            Some((_, old)) if old != value => say(format!(
                "{what} `{path}` changed from `{}` to `{}`",
                or_empty(old),
                or_empty(value)
            )),
            Some(_) => {}
        }
    }
    for (path, value) in &a.fields {
        if !b.fields.iter().any(|(p, _)| p == path) {
            let what = if is_variant(path) { "variant" } else { "field" };
            say(format!("{what} `{}` removed", entry(path, value)));
        }
    }
}

fn entry(path: &str, value: &str) -> String {
    if value.is_empty() {
        path.to_owned()
    } else {
        format!("{path}: {value}")
    }
}

fn or_empty(value: &str) -> &str {
    if value.is_empty() { "(nothing)" } else { value }
}

/// Whether the last segment of a path is an enum variant (`kind::Edit`).
fn is_variant(path: &str) -> bool {
    match path.rfind("::") {
        Some(i) => !path[i..].contains(['.', '[', '{']),
        None => false,
    }
}

#[derive(PartialEq, Eq)]
struct Header {
    line: String,
    name: String,
    version: String,
    notes: String,
}

struct State {
    stored: String,
    kind: String,
    initial: bool,
    terminal: bool,
    notes: String,
    next: Vec<String>,
    /// `(path, type and notes)`, in order.
    fields: Vec<(String, String)>,
}

#[derive(Default)]
struct Parsed {
    workflow: Option<Header>,
    order: Vec<String>,
    states: BTreeMap<String, State>,
    /// Lines that are not in the description format.
    other: Vec<String>,
}

impl Parsed {
    fn new(text: &str) -> Self {
        let mut parsed = Parsed::default();
        let mut current: Option<String> = None;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if let Some(rest) = line.strip_prefix("workflow ") {
                parsed.workflow = Some(header(line, rest));
            } else if let Some(state) = line.strip_prefix("state ").and_then(state) {
                let (name, state) = state;
                current = Some(name.clone());
                parsed.order.push(name.clone());
                parsed.states.insert(name, state);
            } else if let (Some(field), Some(name)) = (line.strip_prefix("  "), &current) {
                let (path, value) = split_field(field);
                if let Some(state) = parsed.states.get_mut(name) {
                    state.fields.push((path.to_owned(), value.to_owned()));
                }
            } else {
                parsed.other.push(line.to_owned());
            }
        }
        parsed
    }
}

/// `deliver version 1 (tag = "state")`.
fn header(line: &str, rest: &str) -> Header {
    let (main, notes) = split_notes(rest);
    let (name, version) = main.split_once(" version ").unwrap_or((main, ""));
    Header {
        line: line.to_owned(),
        name: name.to_owned(),
        version: version.to_owned(),
        notes: notes.to_owned(),
    }
}

/// `Received as "received" (struct, initial, serde: ...) -> Planned | Abandoned`.
fn state(rest: &str) -> Option<(String, State)> {
    let (head, next) = match rest.split_once(" -> ") {
        Some((head, next)) => (head, next.split(" | ").map(str::to_owned).collect()),
        None => (rest, Vec::new()),
    };
    let open = head.find(" (")?;
    let (names, attrs) = (&head[..open], head[open + 2..].strip_suffix(')')?);
    let (name, stored) = match names.split_once(" as ") {
        Some((name, stored)) => (name, stored.to_owned()),
        None => (names, format!("\"{names}\"")),
    };
    let (attrs, notes) = match attrs.split_once(", serde: ") {
        Some((attrs, notes)) => (attrs, notes.to_owned()),
        None => (attrs, String::new()),
    };
    let mut attrs = attrs.split(", ");
    let kind = attrs.next()?.to_owned();
    let (mut initial, mut terminal) = (false, false);
    for attr in attrs {
        match attr {
            "initial" => initial = true,
            "terminal" => terminal = true,
            _ => return None,
        }
    }
    let state = State {
        stored,
        kind,
        initial,
        terminal,
        notes,
        next,
        fields: Vec::new(),
    };
    Some((name.to_owned(), state))
}

/// `path: Type (notes)` into the path and the rest; a quoted name may contain `": "`.
fn split_field(line: &str) -> (&str, &str) {
    let bytes = line.as_bytes();
    let mut quoted = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b':' if !quoted && bytes.get(i + 1) == Some(&b' ') => {
                return (&line[..i], &line[i + 2..]);
            }
            _ => {}
        }
        i += 1;
    }
    (line, "")
}

/// `main (notes)` into `main` and `notes`.
fn split_notes(s: &str) -> (&str, &str) {
    match s.find(" (") {
        Some(i) if s.ends_with(')') => (&s[..i], &s[i + 2..s.len() - 1]),
        _ => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "\
workflow deliver version 1
state Received (struct, initial) -> Planned | Abandoned
  issue: Issue
  issue.number: u64
state Tested (struct) -> Edited | Done
  report: Report
  report.passed: bool
  report.verdict: Verdict
  report.verdict::Pass: unit
state Done (unit, terminal)
state Abandoned (unit, terminal)
";

    #[test]
    fn the_same_text_has_no_changes() {
        assert!(schema_diff(OLD, OLD).is_empty());
    }

    #[test]
    fn every_kind_of_change_is_named() {
        let new = "\
workflow deliver version 2
state Received (struct, initial) -> Planned
  issue: Issue
  issue.number: u32
state Tested (tuple, terminal) -> Edited | Done | Tested
  report: Report
  report.passed: bool
  report.log: String (default)
  report.verdict: Verdict
  report.verdict::Fail: unit
state Done as \"done\" (unit, terminal)
state Merged (unit, terminal)
";
        assert_eq!(
            schema_diff(OLD, new),
            [
                "version changed from 1 to 2",
                "state `Received`: may no longer move to `Abandoned`",
                "state `Received`: field `issue.number` changed from `u64` to `u32`",
                "state `Tested`: now a tuple variant (was struct)",
                "state `Tested`: now terminal",
                "state `Tested`: may now move to `Tested`",
                "state `Tested`: field `report.log: String (default)` added",
                "state `Tested`: variant `report.verdict::Fail: unit` added",
                "state `Tested`: variant `report.verdict::Pass: unit` removed",
                "state `Done`: now stored as \"done\" (was \"Done\")",
                "state `Merged` added",
                "state `Abandoned` removed",
            ]
        );
    }

    #[test]
    fn quoted_names_and_unknown_lines() {
        let old = "workflow w version 1\nstate A (struct, initial, terminal)\n  \"a: b\": u8\nsomething else\n";
        let new = "workflow w version 1 (tag = \"t\")\nstate A (struct, initial, terminal)\n  \"a: b\": u16\n";
        assert_eq!(
            schema_diff(old, new),
            [
                "workflow storage changed from `default` to `tag = \"t\"`",
                "state `A`: field `\"a: b\"` changed from `u8` to `u16`",
                "line `something else` removed",
            ]
        );
    }

    #[test]
    fn variant_paths() {
        assert!(is_variant("report.verdict::Fail"));
        assert!(!is_variant("report.verdict::Fail.reason"));
        assert!(!is_variant("report"));
    }
}
