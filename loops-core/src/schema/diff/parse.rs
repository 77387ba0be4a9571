//! Reads a description (the text `describe` writes) back into its parts: the header, the
//! states, and each state's lines with their paths, types and notes.
//!
//! The reader is lenient: a line it cannot place is kept whole in [`Description::other`],
//! and a description written before the header carried the record format version reads as
//! format 1 (the only format there was).

/// A parsed description.
#[derive(Default)]
pub(in crate::schema) struct Description {
    pub(in crate::schema) header: Option<Header>,
    /// In the order written.
    pub(in crate::schema) states: Vec<State>,
    /// The declared events, in the order written.
    pub(in crate::schema) events: Vec<EventDecl>,
    /// Lines that are not in the description format.
    pub(in crate::schema) other: Vec<String>,
}

/// `workflow deliver version 1 format 1 (tag = "state")`.
#[derive(PartialEq, Eq)]
pub(in crate::schema) struct Header {
    pub(in crate::schema) line: String,
    pub(in crate::schema) name: String,
    pub(in crate::schema) version: String,
    /// loops' record format version; `"1"` when the description predates it.
    pub(in crate::schema) format: String,
    pub(in crate::schema) notes: String,
}

/// `state Received as "received" (struct, initial, serde: ...) -> Planned | Abandoned` and the
/// lines below it.
pub(in crate::schema) struct State {
    pub(in crate::schema) name: String,
    pub(in crate::schema) stored: String,
    pub(in crate::schema) kind: String,
    pub(in crate::schema) initial: bool,
    pub(in crate::schema) terminal: bool,
    pub(in crate::schema) notes: String,
    pub(in crate::schema) next: Vec<String>,
    /// In the order written.
    pub(in crate::schema) lines: Vec<Line>,
}

/// `event approve: Approval (notes)` and the lines of its payload below it (paths from the
/// payload).
pub(in crate::schema) struct EventDecl {
    pub(in crate::schema) name: String,
    /// Everything after `name: `: the payload's type and notes.
    pub(in crate::schema) value: String,
    /// The payload's type.
    pub(in crate::schema) ty: String,
    pub(in crate::schema) notes: Notes,
    /// In the order written.
    pub(in crate::schema) lines: Vec<Line>,
}

impl EventDecl {
    /// The payload's lines as the data of a state named after the event, for comparing
    /// two payloads by the rules of a state's data.
    pub(in crate::schema) fn payload(&self) -> State {
        State {
            name: self.name.clone(),
            stored: String::new(),
            kind: self.ty.clone(),
            initial: false,
            terminal: false,
            notes: String::new(),
            next: Vec::new(),
            lines: self.lines.clone(),
        }
    }
}

/// `  path: Type (notes)`.
#[derive(Clone)]
pub(in crate::schema) struct Line {
    /// As written.
    pub(in crate::schema) path: String,
    pub(in crate::schema) segs: Vec<Seg>,
    /// Everything after `path: `.
    pub(in crate::schema) value: String,
    /// The type (or, on a variant line, its kind).
    pub(in crate::schema) ty: String,
    pub(in crate::schema) notes: Notes,
}

/// One step of a path.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(in crate::schema) enum Seg {
    /// `.name` (or the first name), `.0` for an unnamed field.
    Field(String),
    /// `[]`: the elements of a sequence, set or array.
    Element,
    /// `{key}`: the keys of a map.
    Key,
    /// `{}`: the values of a map.
    Value,
    /// `::Name`: an enum variant.
    Variant(String),
}

/// The parenthesized notes of a line: the serde field flags, and the rest as written.
#[derive(Clone, Default, PartialEq, Eq)]
pub(in crate::schema) struct Notes {
    pub(in crate::schema) default: bool,
    pub(in crate::schema) flatten: bool,
    pub(in crate::schema) skip_serializing: bool,
    pub(in crate::schema) skip_deserializing: bool,
    pub(in crate::schema) skip_serializing_if: bool,
    /// Every other note, in order (`tag = "type"`, `serde: ...`, `with = "..."`, ...).
    pub(in crate::schema) rest: Vec<String>,
}

impl Notes {
    fn parse(text: &str) -> Notes {
        let mut notes = Notes::default();
        for item in split_top(text, ", ") {
            let flag = match item {
                "default" => &mut notes.default,
                "flatten" => &mut notes.flatten,
                "skip_serializing" => &mut notes.skip_serializing,
                "skip_deserializing" => &mut notes.skip_deserializing,
                "skip_serializing_if" => &mut notes.skip_serializing_if,
                _ => {
                    notes.rest.push(item.to_owned());
                    continue;
                }
            };
            // Flags come first; a word after the first other note belongs to that note.
            if notes.rest.is_empty() {
                *flag = true;
            } else {
                notes.rest.push(item.to_owned());
            }
        }
        notes
    }

    /// Whether one of the other notes is exactly `word` (`untagged`, `tuple`, ...).
    pub(in crate::schema) fn has(&self, word: &str) -> bool {
        self.rest.iter().any(|n| n == word)
    }

    /// Whether the value is written by `#[serde(with = ...)]` code.
    pub(in crate::schema) fn with(&self) -> bool {
        self.rest.iter().any(|n| n.starts_with("with = "))
    }

    /// The notes that say how an enum is stored.
    pub(in crate::schema) fn repr(&self) -> Vec<&str> {
        self.rest
            .iter()
            .map(String::as_str)
            .filter(|n| *n == "untagged" || n.starts_with("tag = ") || n.starts_with("content = "))
            .collect()
    }
}

impl Description {
    pub(in crate::schema) fn new(text: &str) -> Self {
        let mut parsed = Description::default();
        // Whether the lines below belong to the last event (else to the last state).
        let mut in_event = false;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if let Some(rest) = line.strip_prefix("workflow ") {
                parsed.header = Some(header(line, rest));
            } else if let Some(state) = line.strip_prefix("state ").and_then(state) {
                parsed.states.push(state);
                in_event = false;
            } else if let Some(event) = line.strip_prefix("event ").and_then(event) {
                parsed.events.push(event);
                in_event = true;
            } else if let (Some(field), true, Some(event)) =
                (line.strip_prefix("  "), in_event, parsed.events.last_mut())
            {
                event.lines.push(field_line(field));
            } else if let (Some(field), false, Some(state)) =
                (line.strip_prefix("  "), in_event, parsed.states.last_mut())
            {
                state.lines.push(field_line(field));
            } else {
                parsed.other.push(line.to_owned());
            }
        }
        parsed
    }

    pub(in crate::schema) fn state(&self, name: &str) -> Option<&State> {
        self.states.iter().find(|s| s.name == name)
    }

    pub(in crate::schema) fn event(&self, name: &str) -> Option<&EventDecl> {
        self.events.iter().find(|e| e.name == name)
    }
}

impl State {
    pub(in crate::schema) fn line(&self, segs: &[Seg]) -> Option<&Line> {
        self.lines.iter().find(|l| l.segs == segs)
    }

    /// Whether the state has a line strictly below `segs`.
    pub(in crate::schema) fn has_below(&self, segs: &[Seg]) -> bool {
        self.lines
            .iter()
            .any(|l| l.segs.len() > segs.len() && l.segs.starts_with(segs))
    }

    /// The names of the variants directly below `segs`, in order.
    pub(in crate::schema) fn variants(&self, segs: &[Seg]) -> Vec<&str> {
        self.lines
            .iter()
            .filter(|l| l.segs.len() == segs.len() + 1 && l.segs.starts_with(segs))
            .filter_map(|l| match l.segs.last() {
                Some(Seg::Variant(name)) => Some(name.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The fields, variants and stored name: what two states must share to be one renamed.
    pub(in crate::schema) fn data(&self) -> (&str, Vec<(&str, &str)>) {
        let lines = self
            .lines
            .iter()
            .map(|l| (l.path.as_str(), l.value.as_str()))
            .collect();
        (self.kind.as_str(), lines)
    }
}

/// `deliver version 1 format 1 (tag = "state")`.
fn header(line: &str, rest: &str) -> Header {
    let (main, notes) = split_notes(rest);
    let (name, version) = main.split_once(" version ").unwrap_or((main, ""));
    let (version, format) = version.split_once(" format ").unwrap_or((version, "1"));
    Header {
        line: line.to_owned(),
        name: name.to_owned(),
        version: version.to_owned(),
        format: format.to_owned(),
        notes: notes.to_owned(),
    }
}

/// `Received as "received" (struct, initial, serde: ...) -> Planned | Abandoned`.
fn state(rest: &str) -> Option<State> {
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
    Some(State {
        name: name.to_owned(),
        stored,
        kind,
        initial,
        terminal,
        notes,
        next,
        lines: Vec::new(),
    })
}

/// `approve: Approval (notes)`.
fn event(rest: &str) -> Option<EventDecl> {
    let line = field_line(rest);
    let name = match line.segs.as_slice() {
        [Seg::Field(name)] => name.clone(),
        _ => return None,
    };
    Some(EventDecl {
        name,
        value: line.value,
        ty: line.ty,
        notes: line.notes,
        lines: Vec::new(),
    })
}

fn field_line(text: &str) -> Line {
    let (path, value) = split_field(text);
    let (ty, notes) = split_notes(value);
    Line {
        path: path.to_owned(),
        segs: segments(path).unwrap_or_else(|| vec![Seg::Field(path.to_owned())]),
        value: value.to_owned(),
        ty: ty.to_owned(),
        notes: Notes::parse(notes),
    }
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

/// `main (notes)` into `main` and `notes`: the notes are the parenthesized group, after a
/// space, that ends the text (a type such as `Id(u64)` or `(u8, u8)` has none).
pub(in crate::schema) fn split_notes(s: &str) -> (&str, &str) {
    let bytes = s.as_bytes();
    let mut depth = 0usize;
    let mut quoted = false;
    let mut open = None;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b'(' | b'[' if !quoted => {
                if depth == 0 && bytes[i] == b'(' && i > 0 && bytes[i - 1] == b' ' {
                    open = Some(i);
                }
                depth += 1;
            }
            b')' | b']' if !quoted => {
                depth = depth.saturating_sub(1);
                if depth == 0
                    && let Some(start) = open.take()
                    && i == bytes.len() - 1
                {
                    return (&s[..start - 1], &s[start + 1..i]);
                }
            }
            _ => {}
        }
        i += 1;
    }
    (s, "")
}

/// Splits at `sep` outside quotes and brackets.
pub(in crate::schema) fn split_top<'a>(s: &'a str, sep: &str) -> Vec<&'a str> {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let (mut depth, mut quoted, mut start, mut i) = (0usize, false, 0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b'(' | b'[' | b'<' | b'{' if !quoted => depth += 1,
            b')' | b']' | b'>' | b'}' if !quoted => depth = depth.saturating_sub(1),
            _ if !quoted && depth == 0 && s[i..].starts_with(sep) => {
                out.push(&s[start..i]);
                i += sep.len();
                start = i;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    if start < s.len() || !out.is_empty() {
        out.push(&s[start..]);
    }
    out
}

/// The steps of a path as `describe` writes it; `None` if it is not one.
fn segments(path: &str) -> Option<Vec<Seg>> {
    let mut segs = Vec::new();
    let mut rest = path;
    let mut first = true;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("[]") {
            segs.push(Seg::Element);
            rest = r;
        } else if let Some(r) = rest.strip_prefix("{key}") {
            segs.push(Seg::Key);
            rest = r;
        } else if let Some(r) = rest.strip_prefix("{}") {
            segs.push(Seg::Value);
            rest = r;
        } else if let Some(r) = rest.strip_prefix("::") {
            let (name, r) = name(r)?;
            segs.push(Seg::Variant(name));
            rest = r;
        } else {
            let r = if first { rest } else { rest.strip_prefix('.')? };
            let (name, r) = name(r)?;
            segs.push(Seg::Field(name));
            rest = r;
        }
        first = false;
    }
    Some(segs)
}

/// A plain (`[A-Za-z0-9_-]+`) or quoted name at the start of `s`, unescaped, and the rest.
fn name(s: &str) -> Option<(String, &str)> {
    if let Some(quoted) = s.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = quoted.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => return Some((out, &quoted[i + 1..])),
                '\\' => match chars.next()?.1 {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    'r' => out.push('\r'),
                    other => out.push(other),
                },
                c => out.push(c),
            }
        }
        return None;
    }
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .unwrap_or(s.len());
    (end > 0).then(|| (s[..end].to_owned(), &s[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let segs = segments("plan.steps[].kind::edit.\"a: b\"{key}{}.0").unwrap();
        assert_eq!(
            segs,
            [
                Seg::Field("plan".into()),
                Seg::Field("steps".into()),
                Seg::Element,
                Seg::Field("kind".into()),
                Seg::Variant("edit".into()),
                Seg::Field("a: b".into()),
                Seg::Key,
                Seg::Value,
                Seg::Field("0".into()),
            ]
        );
        assert_eq!(segments("a..b"), None);
    }

    #[test]
    fn notes_end_the_value() {
        assert_eq!(split_notes("Id(u64)"), ("Id(u64)", ""));
        assert_eq!(split_notes("(u8, u8) (default)"), ("(u8, u8)", "default"));
        assert_eq!(
            split_notes("Foo<T = (A)> (with = \"a (b\")"),
            ("Foo<T = (A)>", "with = \"a (b\"")
        );
        assert_eq!(
            split_notes("Marker(()) (default)"),
            ("Marker(())", "default")
        );
        let notes = Notes::parse("default, skip_serializing_if, serde: x(a, b), tag = \"t\"");
        assert!(notes.default && notes.skip_serializing_if && !notes.flatten);
        assert_eq!(notes.rest, ["serde: x(a, b)", "tag = \"t\""]);
    }
}
