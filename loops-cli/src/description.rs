//! Reading a stored schema description (the text `#[derive(Workflow)]` writes into
//! `Workflow::SCHEMA`, stored once per schema hash): its header line (workflow name and
//! version) and its state lines (initial, terminal, next states). Field lines are skipped.
//!
//! ```text
//! workflow deliver version 1
//! state Received (struct, initial) -> Planned | Abandoned
//!   issue: Issue
//! state Planned as "planned" (struct, serde: ...) -> Edited
//! state Abandoned (unit, terminal)
//! ```
//!
//! loops-core reads the same lines back in `schema_diff`, privately; this is the CLI's reader
//! of the header and state lines, which the graph and the schema listing share. Lines that
//! are not in the format are ignored, never an error: a description is data from a file.

/// What a description says about its workflow and states.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Description {
    /// The workflow's name, from the `workflow NAME version N` line (`None` without one).
    pub workflow: Option<String>,
    /// Its declared version, as written (`None` without a header line).
    pub version: Option<String>,
    /// The states, in the order the description lists them.
    pub states: Vec<StateLine>,
}

/// One `state` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateLine {
    /// The state's name (the enum variant's name; never contains white space).
    pub name: String,
    /// Whether runs start here (`initial`).
    pub initial: bool,
    /// Whether runs end here (`terminal`).
    pub terminal: bool,
    /// The states it may move to, in the order declared (`-> A | B`).
    pub next: Vec<String>,
}

impl Description {
    /// Reads the header and state lines of `text`.
    pub fn parse(text: &str) -> Description {
        let mut d = Description::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("workflow ") {
                if d.workflow.is_none() {
                    let (name, version) = header(rest);
                    d.workflow = Some(name);
                    d.version = version;
                }
            } else if let Some(state) = line.strip_prefix("state ").and_then(state) {
                d.states.push(state);
            }
        }
        d
    }

    /// The declared version as a number, if it is one.
    pub fn version_number(&self) -> Option<u32> {
        self.version.as_deref().and_then(|v| v.parse().ok())
    }
}

/// `NAME version N (notes)` or `"quoted name" version N`: the name and the version.
fn header(rest: &str) -> (String, Option<String>) {
    let (name, after) = match rest.strip_prefix('"') {
        Some(quoted) => unquote(quoted),
        None => match rest.split_once(' ') {
            Some((name, after)) => (name.to_owned(), after),
            None => (rest.to_owned(), ""),
        },
    };
    let version = after
        .trim_start()
        .strip_prefix("version ")
        .map(|v| v.split(' ').next().unwrap_or_default().to_owned())
        .filter(|v| !v.is_empty());
    (name, version)
}

/// The text of a quoted string whose opening quote is already consumed (escapes `\"`,
/// `\\`, `\n`, `\t`, `\r` undone), and what follows its closing quote.
fn unquote(s: &str) -> (String, &str) {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (out, &s[i + 1..]),
            '\\' => match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, 't')) => out.push('\t'),
                Some((_, 'r')) => out.push('\r'),
                Some((_, other)) => out.push(other),
                None => {}
            },
            c => out.push(c),
        }
    }
    (out, "")
}

/// `NAME [as "stored"] (kind[, initial][, terminal][, serde: ...])[ -> A | B]`.
fn state(rest: &str) -> Option<StateLine> {
    let (name, mut after) = rest.split_once(' ')?;
    if let Some(stored) = after.strip_prefix("as \"") {
        after = unquote(stored).1.strip_prefix(' ')?;
    }
    let attrs = after.strip_prefix('(')?;
    let close = closing_paren(attrs)?;
    let (attrs, tail) = (&attrs[..close], &attrs[close + 1..]);
    // The serde note comes last and may contain anything; the flags come before it.
    let flags = attrs
        .split_once(", serde: ")
        .map_or(attrs, |(flags, _)| flags);
    // The first is the kind of the variant's data (`struct`, `unit`, ...).
    let flags: Vec<&str> = flags.split(", ").skip(1).collect();
    let (initial, terminal) = (flags.contains(&"initial"), flags.contains(&"terminal"));
    let next = match tail.strip_prefix(" -> ") {
        Some(list) => list.split(" | ").map(str::to_owned).collect(),
        None => Vec::new(),
    };
    Some(StateLine {
        name: name.to_owned(),
        initial,
        terminal,
        next,
    })
}

/// The byte offset of the `)` that closes a group whose `(` is already consumed, skipping
/// quoted strings and nested groups.
fn closing_paren(s: &str) -> Option<usize> {
    let (mut depth, mut quoted, mut escaped) = (0usize, false, false);
    for (i, b) in s.bytes().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b'(' if !quoted => depth += 1,
            b')' if !quoted && depth == 0 => return Some(i),
            b')' if !quoted => depth -= 1,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_states() {
        let d = Description::parse(
            "workflow deliver version 3 (tag = \"t\")\n\
             state Received (struct, initial) -> Planned | Abandoned\n  issue: Issue\n  \
             issue.number: u64\n\
             state Planned as \"planned (x) -> y\" (struct, serde: rename = \"a) -> b\") -> Done\n\
             state Done (unit, terminal)\n\
             state Abandoned (unit, initial, terminal)\n\
             not a line of the format\n",
        );
        assert_eq!(d.workflow.as_deref(), Some("deliver"));
        assert_eq!(d.version_number(), Some(3));
        let got: Vec<(&str, bool, bool, Vec<&str>)> = d
            .states
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.initial,
                    s.terminal,
                    s.next.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("Received", true, false, vec!["Planned", "Abandoned"]),
                ("Planned", false, false, vec!["Done"]),
                ("Done", false, true, vec![]),
                ("Abandoned", true, true, vec![]),
            ]
        );
    }

    #[test]
    fn quoted_names_and_missing_parts() {
        let d = Description::parse("workflow \"my \\\"flow\\\"\" version 12\n");
        assert_eq!(d.workflow.as_deref(), Some("my \"flow\""));
        assert_eq!(d.version.as_deref(), Some("12"));
        let d = Description::parse("workflow w\nstate Broken (struct\nstate\n");
        assert_eq!(d.workflow.as_deref(), Some("w"));
        assert_eq!(d.version, None);
        assert!(d.states.is_empty());
        assert_eq!(Description::parse(""), Description::default());
    }
}
