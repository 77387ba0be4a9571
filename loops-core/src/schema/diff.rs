//! What changed between two schema descriptions, in words, and whether each change is
//! compatible with the records already stored.
//!
//! A change is compatible when every value the old build could have stored decodes with the
//! new types, to the same meaning (serde_json, as loops stores records). The rules, by what
//! changed (each one checked against what serde's derive does):
//! - **compatible**: a field added that may be missing (`#[serde(default)]`, an `Option`
//!   without `with`, `skip_deserializing`); a trailing tuple element with `#[serde(default)]`;
//!   a variant added to a tagged enum, or appended after the variants of an untagged one; a
//!   field removed that was never written (`skip_serializing`); a type renamed (names of
//!   structs and enums are not stored); a number widened (`u32` to `u64` or `i64`, `f32` to
//!   `f64`, an integer of 32 bits or fewer to `f64`); `T` to `Option<T>` (unless `T` may be
//!   stored as `null`); an array or a set to a `Vec`; a string-like scalar to `String`;
//!   anything to `serde_json::Value`; `#[serde(default)]` or `skip_serializing(_if)` added;
//!   a state added; an event declared (`#[event]`); `#[next]` targets added or removed; the initial state moved; a state no
//!   longer terminal; the declared `version` (see [`Class::Compatible`]).
//! - **compatible if no pending run is in the state**: a state removed (a renamed state is
//!   one removed and one added); a state's stored name changed; a state now terminal.
//! - **breaking**: a field removed (its data would be dropped) or retyped otherwise; a field
//!   added that must be present; an enum variant removed, reshaped, or inserted before the
//!   end of an untagged enum; the variants of an untagged enum reordered; any change inside
//!   the variants of an untagged enum but a type rename (which variant a value reads as may
//!   change); an enum's representation (`tag`, `content`, `untagged`); `flatten`, `with`,
//!   `skip_deserializing` or an unmodeled serde attribute; a state's kind; a declared event
//!   removed or its payload retyped; the workflow's
//!   name or representation; loops' record format version.

mod change;
mod lines;
pub(super) mod parse;
pub(super) mod ty;

pub use change::{Change, Class};

use std::fmt;

use serde::{Deserialize, Serialize};

use parse::{Description, State};

use super::SchemaHash;

/// Every difference between two schema descriptions, classified: what [`schema_diff`]
/// returns.
///
/// The runtime asks one question of it: given the states that pending runs of the old
/// schema are in, which changes stop them? [`breaking`](Self::breaking) answers with those
/// changes (none: every difference is compatible).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SchemaDiff {
    changes: Vec<Change>,
}

impl SchemaDiff {
    /// The differences between the description `old` (stored with a run) and `new` (the
    /// compiled [`Workflow::SCHEMA`](crate::Workflow::SCHEMA)); the same as [`schema_diff`].
    pub fn new(old: &str, new: &str) -> Self {
        diff(&Description::new(old), &Description::new(new))
    }

    /// What the runtime reports when the stored schema hash of a run differs from the
    /// compiled one: the differences between `stored` (the stored description, `None` if the
    /// store has none) and `compiled`. Never empty: a missing description, or descriptions
    /// that show no difference (a hand-written `Workflow::SCHEMA` that does not describe
    /// the change), is one breaking change saying so.
    pub fn of_mismatch(stored: Option<&str>, compiled: &str) -> Self {
        let Some(stored) = stored else {
            return SchemaDiff::from(vec![Change::new(
                "the stored schema has no description in the store",
                Class::Breaking,
                "what changed is unknown",
            )]);
        };
        let diff = SchemaDiff::new(stored, compiled);
        if !diff.is_empty() {
            return diff;
        }
        SchemaDiff::from(vec![Change::new(
            "the schema hash changed but the descriptions show no difference",
            Class::Breaking,
            "what changed is not described (a hand-written `Workflow::SCHEMA`?)",
        )])
    }

    /// The changes, in the order of the new description (header, states, fields), then
    /// what was removed.
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    /// The changes, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Change> {
        self.changes.iter()
    }

    /// How many changes there are.
    pub fn len(&self) -> usize {
        self.changes.len()
    }

    /// Whether the descriptions are the same (up to the order of states, of named fields
    /// and of the variants of tagged enums, which are not stored).
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The text of each change, in order.
    pub fn texts(&self) -> Vec<&str> {
        self.changes.iter().map(|c| c.text.as_str()).collect()
    }

    /// The changes that stop the old schema's runs from being driven by the new build, given
    /// `pending_in(state)`: whether a pending run of the old schema is in `state` (an old
    /// state name). Empty when every difference is compatible.
    pub fn breaking(&self, pending_in: impl Fn(&str) -> bool) -> SchemaDiff {
        self.changes
            .iter()
            .filter(|c| c.is_breaking(&pending_in))
            .cloned()
            .collect::<Vec<_>>()
            .into()
    }

    /// The changes as they stand for one run in `state` (an old state name): a change that
    /// is compatible only while no pending run is in some state ([`Class::IfNoPendingRun`])
    /// becomes [`Class::Breaking`] if that state is `state`, else [`Class::Compatible`], its
    /// reason saying which. What a blocked run's [`BlockInfo::changes`](crate::BlockInfo)
    /// store, so that they call a change breaking for the run when it is.
    pub fn for_run_in(&self, state: &str) -> SchemaDiff {
        self.changes
            .iter()
            .map(|c| match &c.class {
                Class::IfNoPendingRun { state: s } if s == state => Change::new(
                    c.text.clone(),
                    Class::Breaking,
                    format!("{}; this run is in `{s}`", c.reason),
                ),
                Class::IfNoPendingRun { state: s } => Change::new(
                    c.text.clone(),
                    Class::Compatible,
                    format!("{}; this run is not in `{s}`", c.reason),
                ),
                _ => c.clone(),
            })
            .collect::<Vec<_>>()
            .into()
    }

    /// The same changes, for a run stored with the schema `stored` that no compiled version
    /// accepts: when the only breaking changes are fields added that must be present, the
    /// reason of each names both steps that let the run be driven as it is, the fix
    /// (`#[serde(default)]` or an `Option`) and then `accepts = ["<stored>"]`, since a
    /// compatible change alone does not bring the run under the new version. (A change
    /// compatible only while no pending run is in a state counts as breaking.)
    pub(crate) fn with_accepts_hint(self, stored: SchemaHash) -> SchemaDiff {
        let fixable = self
            .changes
            .iter()
            .filter(|c| c.is_breaking(|_| true))
            .all(|c| c.reason == lines::LACKS_FIELD);
        self.changes
            .into_iter()
            .map(|mut c| {
                if fixable && c.reason == lines::LACKS_FIELD {
                    c.reason = format!(
                        "{}, then list the old schema in the workflow's `accepts = [\"{stored}\"]`",
                        c.reason
                    );
                }
                c
            })
            .collect::<Vec<_>>()
            .into()
    }

    /// Whether every difference is compatible, given `pending_in` as for
    /// [`breaking`](Self::breaking).
    pub fn is_compatible(&self, pending_in: impl Fn(&str) -> bool) -> bool {
        !self.changes.iter().any(|c| c.is_breaking(&pending_in))
    }

    /// The states whose pending runs decide [`breaking`](Self::breaking): those named by
    /// [`Class::IfNoPendingRun`] changes, each once.
    pub fn pending_states(&self) -> Vec<&str> {
        let mut states = Vec::new();
        for change in &self.changes {
            if let Class::IfNoPendingRun { state } = &change.class
                && !states.contains(&state.as_str())
            {
                states.push(state.as_str());
            }
        }
        states
    }
}

impl From<Vec<Change>> for SchemaDiff {
    fn from(changes: Vec<Change>) -> Self {
        SchemaDiff { changes }
    }
}

impl<'a> IntoIterator for &'a SchemaDiff {
    type Item = &'a Change;
    type IntoIter = std::slice::Iter<'a, Change>;

    fn into_iter(self) -> Self::IntoIter {
        self.changes.iter()
    }
}

/// The changes, each as `text (class: reason)`, separated by `; `: the breaking ones first
/// (a change compatible only while no pending run is in a state counts as breaking here),
/// so that a refusal's one line leads with why, each group in the diff's order.
impl fmt::Display for SchemaDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let breaking = |c: &&Change| c.is_breaking(|_| true);
        let first = self.changes.iter().filter(breaking);
        let then = self.changes.iter().filter(|c| !breaking(c));
        for (i, change) in first.chain(then).enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{change}")?;
        }
        Ok(())
    }
}

/// What changed between the description `old` (as stored with a run) and `new` (the compiled
/// [`Workflow::SCHEMA`](crate::Workflow::SCHEMA)), each change with its text, its
/// [`Class`] and the reason for it.
///
/// The runtime calls it when it refuses a run whose stored schema hash differs from the
/// compiled one (through [`SchemaDiff::of_mismatch`]). The result is empty when the
/// descriptions are the same up to the order of what is not stored in order (states, named
/// fields, variants of tagged enums). Lines of either text that are not in the description
/// format are compared as whole lines (and are breaking).
///
/// ```
/// use loops_core::{Class, schema_diff};
///
/// let old = "workflow deliver version 1 format 1\n\
///            state Tested (struct) -> Done\n  report: Report\n  report.passed: bool\n";
/// let new = "workflow deliver version 1 format 1\n\
///            state Tested (struct) -> Done\n  report: Report\n  report.passed: bool\n  \
///            report.log: Option<String>\n  report.lines: u32\n";
/// let diff = schema_diff(old, new);
/// assert_eq!(
///     diff.texts(),
///     [
///         "state `Tested`: field `report.log: Option<String>` added",
///         "state `Tested`: field `report.lines: u32` added",
///     ]
/// );
/// assert_eq!(diff.changes()[0].class, Class::Compatible);
/// assert_eq!(diff.changes()[1].class, Class::Breaking);
/// // What stops the runs of the old schema, given the states they are in:
/// let breaking = diff.breaking(|state| state == "Tested");
/// assert_eq!(breaking.texts(), ["state `Tested`: field `report.lines: u32` added"]);
/// ```
pub fn schema_diff(old: &str, new: &str) -> SchemaDiff {
    SchemaDiff::new(old, new)
}

/// The version (`#[workflow(version = N)]`) the schema description `description` names in
/// its header; `None` if it names none (a description without a header, or edited by hand).
pub(crate) fn described_version(description: &str) -> Option<u32> {
    Description::new(description).header?.version.parse().ok()
}

/// The names of the states the schema description `description` declares, in its order;
/// empty if it declares none (a description edited by hand).
#[cfg(feature = "testing")]
pub(crate) fn described_states(description: &str) -> Vec<String> {
    Description::new(description)
        .states
        .into_iter()
        .map(|state| state.name)
        .collect()
}

fn diff(old: &Description, new: &Description) -> SchemaDiff {
    let mut changes = Vec::new();
    header_changes(old, new, &mut changes);
    for b in &new.states {
        match old.state(&b.name) {
            Some(a) => state_changes(a, b, &mut changes),
            None => changes.push(Change::new(
                format!("state `{}` added", b.name),
                Class::Compatible,
                "no record written before is in it",
            )),
        }
    }
    for a in &old.states {
        if new.state(&a.name).is_none() {
            changes.push(removed_state(a, old, new));
        }
    }
    event_changes(old, new, &mut changes);
    for (line, other, what) in [
        (&new.other, &old.other, "added"),
        (&old.other, &new.other, "removed"),
    ] {
        for l in line.iter().filter(|l| !other.contains(l)) {
            changes.push(Change::new(
                format!("line `{l}` {what}"),
                Class::Breaking,
                "the line is not in the description format",
            ));
        }
    }
    changes.into()
}

fn header_changes(old: &Description, new: &Description, changes: &mut Vec<Change>) {
    let (a, b) = match (&old.header, &new.header) {
        (Some(a), Some(b)) => (a, b),
        (a, b) if a != b => {
            changes.push(Change::new(
                format!(
                    "workflow header changed from `{}` to `{}`",
                    a.as_ref().map_or("", |h| h.line.as_str()),
                    b.as_ref().map_or("", |h| h.line.as_str())
                ),
                Class::Breaking,
                "the description has no workflow header",
            ));
            return;
        }
        _ => return,
    };
    if a.name != b.name {
        changes.push(Change::new(
            format!("workflow renamed from `{}` to `{}`", a.name, b.name),
            Class::Breaking,
            "runs belong to the workflow name they were started under",
        ));
    }
    if a.version != b.version {
        changes.push(Change::new(
            format!("version changed from {} to {}", a.version, b.version),
            Class::Compatible,
            "the version is not in the records; accept the old version's runs only if their data means the same",
        ));
    }
    if a.format != b.format {
        changes.push(Change::new(
            format!(
                "record format version changed from {} to {}",
                a.format, b.format
            ),
            Class::Breaking,
            "this build of loops reads records of its own format only",
        ));
    }
    if a.notes != b.notes {
        changes.push(Change::new(
            format!(
                "workflow storage changed from `{}` to `{}`",
                or_none(&a.notes),
                or_none(&b.notes)
            ),
            Class::Breaking,
            "the workflow enum's representation changed",
        ));
    } else if parse::split_top(&b.notes, ", ").contains(&"untagged") {
        let common = |d: &Description, other: &Description| -> Vec<String> {
            let names = d.states.iter().map(|s| s.name.clone());
            names.filter(|n| other.state(n).is_some()).collect()
        };
        let (was, now) = (common(old, new), common(new, old));
        if was != now {
            changes.push(Change::new(
                format!(
                    "states of the untagged workflow enum reordered from `{}` to `{}`",
                    was.join(", "),
                    now.join(", ")
                ),
                Class::Breaking,
                "an untagged enum tries its variants in order",
            ));
        }
    }
}

/// Events added (compatible: no run waits for them yet), removed or retyped (breaking: a
/// run waiting for one, or an event in an inbox, would not decode). A payload of the same
/// type whose fields or variants changed is classed line by line as a state's data is (a
/// field added with `#[serde(default)]` is compatible): events sent before, and waits
/// recorded before, are read by the new type as a state's records are.
fn event_changes(old: &Description, new: &Description, changes: &mut Vec<Change>) {
    for b in &new.events {
        match old.event(&b.name) {
            None => changes.push(Change::new(
                format!("event `{}: {}` added", b.name, b.value),
                Class::Compatible,
                "no run waits for it yet",
            )),
            Some(a) if a.value != b.value => changes.push(Change::new(
                format!(
                    "event `{}` retyped from `{}` to `{}`",
                    b.name, a.value, b.value
                ),
                Class::Breaking,
                "an event sent before, or a wait recorded before, holds the old payload",
            )),
            Some(a) => lines::compare(
                &format!("event `{}`: payload `{}`", b.name, b.value),
                &a.payload(),
                &b.payload(),
                changes,
            ),
        }
    }
    for a in old.events.iter().filter(|a| new.event(&a.name).is_none()) {
        changes.push(Change::new(
            format!("event `{}: {}` removed", a.name, a.value),
            Class::Breaking,
            "a run may wait for it, or hold it in its inbox",
        ));
    }
}

fn or_none(s: &str) -> &str {
    if s.is_empty() { "default" } else { s }
}

fn removed_state(a: &State, old: &Description, new: &Description) -> Change {
    let mut reason =
        "a pending run in it could not be resumed (a state no pending run is in may go)".to_owned();
    // A renamed state is one removed and one added: say so when the data is the same.
    let renamed = new
        .states
        .iter()
        .find(|b| old.state(&b.name).is_none() && b.data() == a.data());
    if let Some(b) = renamed {
        reason = format!(
            "a pending run in it could not be resumed; if `{}`, added with the same data, is its new name, runs in `{}` need a migration",
            b.name, a.name
        );
    }
    Change::new(
        format!("state `{}` removed", a.name),
        Class::IfNoPendingRun {
            state: a.name.clone(),
        },
        reason,
    )
}

fn state_changes(a: &State, b: &State, changes: &mut Vec<Change>) {
    let name = &a.name;
    let mut say = |what: String, class: Class, reason: &str| {
        changes.push(Change::new(
            format!("state `{name}`: {what}"),
            class,
            reason,
        ));
    };
    let pending = || Class::IfNoPendingRun {
        state: name.clone(),
    };
    if a.stored != b.stored {
        say(
            format!("now stored as {} (was {})", b.stored, a.stored),
            pending(),
            "the records of runs in it store the old name",
        );
    }
    if a.kind != b.kind {
        say(
            format!("now a {} variant (was {})", b.kind, a.kind),
            Class::Breaking,
            "its data is stored in another form",
        );
    }
    match (a.initial, b.initial) {
        (false, true) => say(
            "now the initial state".to_owned(),
            Class::Compatible,
            "only new runs start there",
        ),
        (true, false) => say(
            "no longer the initial state".to_owned(),
            Class::Compatible,
            "only new runs start there",
        ),
        _ => {}
    }
    match (a.terminal, b.terminal) {
        (false, true) => say(
            "now terminal".to_owned(),
            pending(),
            "a pending run in it would end instead of going on",
        ),
        (true, false) => say(
            "no longer terminal".to_owned(),
            Class::Compatible,
            "runs that ended in it stay ended",
        ),
        _ => {}
    }
    if a.notes != b.notes {
        say(
            format!(
                "serde attributes changed from `{}` to `{}`",
                or_none(&a.notes),
                or_none(&b.notes)
            ),
            Class::Breaking,
            "serde stores the state differently",
        );
    }
    for next in b.next.iter().filter(|n| !a.next.contains(n)) {
        say(
            format!("may now move to `{next}`"),
            Class::Compatible,
            "where a run goes next is the new handler's to decide",
        );
    }
    for next in a.next.iter().filter(|n| !b.next.contains(n)) {
        say(
            format!("may no longer move to `{next}`"),
            Class::Compatible,
            "where a run goes next is the new handler's to decide",
        );
    }
    lines::compare(&format!("state `{name}`"), a, b, changes);
}

#[cfg(test)]
mod tests;
