//! The changes between the field and variant lines of one state in two descriptions, and
//! their classes.

use super::change::{Change, Class};
use super::parse::{Line, Notes, Seg, State};
use super::ty::{Sides, Ty, Verdict, compat};

/// One line's difference, before it is classed.
enum Diff<'a> {
    Added(&'a Line),
    Removed(&'a Line),
    Changed(&'a Line, &'a Line),
}

impl Diff<'_> {
    fn segs(&self) -> &[Seg] {
        match self {
            Diff::Added(l) | Diff::Removed(l) | Diff::Changed(_, l) => &l.segs,
        }
    }
}

/// Pushes the changes between the lines of `a` (old) and `b` (new), both of `subject` (as
/// the changes name it: ``state `Planned` `` or ``event `approve`: payload `Approval` ``).
///
/// A line added (or removed) below one added (removed) is part of it, and a line below one
/// whose change is breaking adds nothing: neither is listed.
pub(super) fn compare(subject: &str, a: &State, b: &State, changes: &mut Vec<Change>) {
    let sides = Sides { old: a, new: b };
    let mut diffs = Vec::new();
    // The n-th line of a path matches the n-th line of the same path (a path appears twice
    // only when two flattened structs store the same key).
    let (old, new) = (numbered(a), numbered(b));
    for (key, line) in &new {
        match old.iter().find(|(k, _)| k == key) {
            None => diffs.push(Diff::Added(line)),
            Some((_, old)) if old.value != line.value => diffs.push(Diff::Changed(old, line)),
            Some(_) => {}
        }
    }
    for (key, line) in &old {
        if !new.iter().any(|(k, _)| k == key) {
            diffs.push(Diff::Removed(line));
        }
    }
    let mut classed: Vec<(Class, String)> = diffs.iter().map(|d| class(d, &sides)).collect();
    rename_hints(&diffs, &mut classed);
    for (i, d) in diffs.iter().enumerate() {
        let covered = diffs.iter().zip(&classed).any(|(other, (class, _))| {
            let above = other.segs().len() < d.segs().len() && d.segs().starts_with(other.segs());
            above
                && match (other, d) {
                    (Diff::Added(_), Diff::Added(_)) | (Diff::Removed(_), Diff::Removed(_)) => true,
                    (Diff::Changed(..), _) => *class == Class::Breaking,
                    _ => false,
                }
        });
        if covered {
            continue;
        }
        let (class, reason) = classed[i].clone();
        changes.push(Change::new(
            format!("{subject}: {}", text(d)),
            class,
            reason,
        ));
    }
    untagged_order(subject, &sides, changes);
}

/// A field removed and a field added beside it with the same type may be one field renamed,
/// which the two lines cannot tell: the added field's reason, when it is breaking, says how
/// to keep the records written before (the description names fields as stored, so a
/// `#[serde(rename)]` to the old name leaves no difference at all).
fn rename_hints(diffs: &[Diff], classed: &mut [(Class, String)]) {
    for (i, d) in diffs.iter().enumerate() {
        let Diff::Added(added) = d else { continue };
        let Some((Seg::Field(_), parent)) = added.segs.split_last() else {
            continue;
        };
        if classed[i].0 != Class::Breaking {
            continue;
        }
        let old = diffs.iter().find_map(|other| match other {
            Diff::Removed(removed) => match removed.segs.split_last() {
                Some((Seg::Field(name), at)) if at == parent && removed.ty == added.ty => {
                    Some(name)
                }
                _ => None,
            },
            _ => None,
        });
        if let Some(old) = old {
            classed[i].1 = format!(
                "{}; if it is `{old}` renamed (removed, of the same type), keep its stored name with `#[serde(rename = \"{old}\")]`, or write a migration",
                classed[i].1
            );
        }
    }
}

/// Each line of `state` with its path and how many lines of that path come before it.
fn numbered(state: &State) -> Vec<((&[Seg], usize), &Line)> {
    let mut out: Vec<((&[Seg], usize), &Line)> = Vec::with_capacity(state.lines.len());
    for line in &state.lines {
        let n = out
            .iter()
            .filter(|((segs, _), _)| *segs == line.segs)
            .count();
        out.push(((&line.segs, n), line));
    }
    out
}

fn text(d: &Diff) -> String {
    let what = |l: &Line| match l.segs.last() {
        Some(Seg::Variant(_)) => "variant",
        _ => "field",
    };
    let entry = |l: &Line| {
        if l.value.is_empty() {
            l.path.clone()
        } else {
            format!("{}: {}", l.path, l.value)
        }
    };
    let or_empty = |v: &str| if v.is_empty() { "(nothing)" } else { v }.to_owned();
    match d {
        Diff::Added(l) => format!("{} `{}` added", what(l), entry(l)),
        Diff::Removed(l) => format!("{} `{}` removed", what(l), entry(l)),
        Diff::Changed(a, b) => format!(
            "{} `{}` changed from `{}` to `{}`",
            what(b),
            b.path,
            or_empty(&a.value),
            or_empty(&b.value)
        ),
    }
}

/// The untagged enum whose variants `segs` is inside, in `state`: its path, if any.
fn inside_untagged<'a>(state: &State, segs: &'a [Seg]) -> Option<&'a [Seg]> {
    (0..segs.len()).find_map(|k| {
        let is_variant = matches!(segs[k], Seg::Variant(_));
        let enclosing = &segs[..k];
        let untagged = state
            .line(enclosing)
            .is_some_and(|l| l.notes.has("untagged"));
        (is_variant && untagged).then_some(enclosing)
    })
}

fn class(d: &Diff, sides: &Sides) -> (Class, String) {
    match d {
        Diff::Added(l) => added(l, sides),
        Diff::Removed(l) => removed(l, sides),
        Diff::Changed(a, b) => changed(a, b, sides),
    }
}

const UNTAGGED: &str =
    "inside an untagged enum's variants: which variant a stored value reads as may change";

fn breaking(reason: impl Into<String>) -> (Class, String) {
    (Class::Breaking, reason.into())
}

fn compatible(reason: impl Into<String>) -> (Class, String) {
    (Class::Compatible, reason.into())
}

fn added(l: &Line, sides: &Sides) -> (Class, String) {
    let segs = &l.segs[..];
    let Some((last, parent)) = segs.split_last() else {
        return breaking("the stored form changed");
    };
    if let Seg::Variant(name) = last {
        let Some(enclosing) = sides.new.line(parent) else {
            return compatible("records written before name only the variants there were");
        };
        if !enclosing.notes.has("untagged") {
            return compatible("records written before name only the variants there were");
        }
        let (was, now) = (sides.old.variants(parent), sides.new.variants(parent));
        let at = now.iter().position(|v| v == name);
        let appended = was.iter().all(|w| now.iter().position(|v| v == w) < at);
        return if appended {
            compatible(
                "appended to an untagged enum: stored values still read as the variants before it",
            )
        } else {
            breaking(format!(
                "added before variants of an untagged enum, which tries them in order: a stored value may now read as `{name}`"
            ))
        };
    }
    if inside_untagged(sides.new, segs).is_some() {
        return breaking(UNTAGGED);
    }
    let Seg::Field(field) = last else {
        return breaking("the stored form changed");
    };
    if let Some(count) = tuple_len(sides.old, parent) {
        let index: usize = field.parse().unwrap_or(0);
        return if l.notes.default && index >= count {
            compatible(
                "a trailing element with `#[serde(default)]`: a stored array without it reads",
            )
        } else {
            breaking("stored arrays have fewer elements")
        };
    }
    match may_be_missing(&l.notes, &l.ty) {
        Some(why) => compatible(format!("{why}: a record written before without it reads")),
        None => breaking(LACKS_FIELD),
    }
}

/// The reason a field added that must be present is breaking, with its fix: what
/// [`SchemaDiff::with_accepts_hint`](super::SchemaDiff::with_accepts_hint) finds and extends.
pub(super) const LACKS_FIELD: &str =
    "records written before lack it; give it `#[serde(default)]` or make it an `Option`";

/// Why a field may be missing from a stored object, if it may: what the new build does then.
fn may_be_missing(notes: &Notes, ty: &str) -> Option<&'static str> {
    if notes.default {
        Some("`#[serde(default)]`")
    } else if notes.skip_deserializing {
        Some("`skip_deserializing`")
    } else if ty.starts_with("Option<") && !notes.with() {
        // serde's derive reads a missing `Option` field as `None`.
        Some("an `Option`")
    } else {
        None
    }
}

/// If `parent` (in `state`) holds unnamed fields stored as a JSON array: how many.
fn tuple_len(state: &State, parent: &[Seg]) -> Option<usize> {
    let tuple = match parent.last() {
        None => state.kind == "tuple",
        Some(Seg::Variant(_)) => state.line(parent).is_some_and(|l| l.ty == "tuple"),
        Some(_) => state.line(parent).is_some_and(|l| l.notes.has("tuple")),
    };
    tuple.then(|| {
        state
            .lines
            .iter()
            .filter(|l| l.segs.len() == parent.len() + 1 && l.segs.starts_with(parent))
            .count()
    })
}

fn removed(l: &Line, sides: &Sides) -> (Class, String) {
    let Some((last, parent)) = l.segs.split_last() else {
        return breaking("the stored form changed");
    };
    if matches!(last, Seg::Variant(_)) {
        return breaking("records written before may hold it");
    }
    if inside_untagged(sides.old, &l.segs).is_some() {
        return breaking(UNTAGGED);
    }
    if tuple_len(sides.old, parent).is_some() {
        return breaking("stored arrays have more elements");
    }
    if l.notes.skip_serializing {
        return compatible("it was never written, so no record holds it");
    }
    breaking(
        "records written before hold it, and its data would be dropped (a migration can drop it)",
    )
}

fn changed(a: &Line, b: &Line, sides: &Sides) -> (Class, String) {
    if matches!(b.segs.last(), Some(Seg::Variant(_))) {
        return if a.ty != b.ty {
            breaking("the variant's data is stored in another form")
        } else {
            breaking("serde stores the variant differently")
        };
    }
    let untagged = inside_untagged(sides.new, &b.segs).is_some();
    let verdict = compat(&Ty::parse(&a.ty), &Ty::parse(&b.ty), &b.segs, true, sides);
    let (na, nb) = (&a.notes, &b.notes);
    if na.repr() != nb.repr() {
        return breaking("the enum's representation changed");
    }
    if na.rest != nb.rest {
        return breaking("serde stores it differently");
    }
    if na.flatten != nb.flatten {
        return breaking("a flattened value is stored in the enclosing object");
    }
    if nb.skip_deserializing && !na.skip_deserializing {
        return breaking("the stored value is no longer read");
    }
    // Records written without it read in the old build, and no longer would.
    let may_omit = na.skip_serializing || na.skip_serializing_if;
    if may_omit && may_be_missing(na, &a.ty).is_some() && may_be_missing(nb, &b.ty).is_none() {
        return breaking("records written before may lack it");
    }
    let flags_only = na != nb;
    match verdict {
        Verdict::Breaking(why) => breaking(why),
        _ if untagged && (flags_only || !is_rename(&a.ty, &b.ty, &b.segs, sides)) => {
            breaking(UNTAGGED)
        }
        Verdict::Compatible(why) => compatible(why),
        Verdict::Same if flags_only => {
            compatible("serde reads every record written before the same way")
        }
        Verdict::Same => compatible("type names are not stored"),
    }
}

/// Whether `a` to `b` only renames types (or changes their generic arguments as written).
fn is_rename(a: &str, b: &str, segs: &[Seg], sides: &Sides) -> bool {
    match compat(&Ty::parse(a), &Ty::parse(b), segs, true, sides) {
        Verdict::Same => true,
        Verdict::Compatible(why) => why == "type names are not stored",
        Verdict::Breaking(_) => false,
    }
}

/// The order of the variants of each untagged enum present on both sides: a value is read
/// as the first variant that fits, so reordering them changes what stored values mean.
fn untagged_order(subject: &str, sides: &Sides, changes: &mut Vec<Change>) {
    for line in &sides.new.lines {
        let Some(old) = sides.old.line(&line.segs) else {
            continue;
        };
        if !(line.notes.has("untagged") && old.notes.has("untagged")) {
            continue;
        }
        let (was, now) = (
            sides.old.variants(&line.segs),
            sides.new.variants(&line.segs),
        );
        let was: Vec<&str> = was.into_iter().filter(|v| now.contains(v)).collect();
        let now: Vec<&str> = now.into_iter().filter(|v| was.contains(v)).collect();
        if was != now {
            changes.push(Change::new(
                format!(
                    "{subject}: variants of untagged `{}` reordered from `{}` to `{}`",
                    line.path,
                    was.join(", "),
                    now.join(", ")
                ),
                Class::Breaking,
                "an untagged enum tries its variants in order: stored values may read as another variant",
            ));
        }
    }
}
