//! Types as a description writes them (`Option<Vec<Issue>>`, `Map<String, u64>`, `Id(u64)`),
//! and whether every value stored as one type reads back, meaning the same, as another.

use super::parse::{Seg, State, split_top};

/// A type of a description line.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::schema) enum Ty {
    /// A JSON scalar, by kind: `u64`, `String`, `()`, `Value`, `NonZero<u8>`, `Uuid`...
    Scalar(String),
    Option(Box<Ty>),
    Seq(Box<Ty>),
    Set(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Array(Box<Ty>, String),
    Tuple(Vec<Ty>),
    /// A newtype struct, stored as what it holds (a unit struct holds `()`).
    Newtype(Box<Ty>),
    /// A struct or enum (or a type the description does not know: a hand-written scalar);
    /// the name only, which is not stored.
    Named(String),
    /// What the reader does not parse (`...`, a `with` type as written): compared as text.
    Text(String),
}

/// The scalar kinds loops' own `Schema` impls write.
const SCALARS: &[&str] = &[
    "bool",
    "char",
    "u8",
    "u16",
    "u32",
    "u64",
    "u128",
    "usize",
    "i8",
    "i16",
    "i32",
    "i64",
    "i128",
    "isize",
    "f32",
    "f64",
    "String",
    "()",
    "Value",
    "Number",
    "IpAddr",
    "Ipv4Addr",
    "Ipv6Addr",
    "SocketAddr",
    "SocketAddrV4",
    "SocketAddrV6",
    "Uuid",
    "DateTime",
    "NaiveDateTime",
    "NaiveDate",
    "NaiveTime",
];

/// The notes of a struct or enum that has no lines below it.
const COMPOSITE: &[&str] = &["recursive", "tuple", "no fields", "no variants"];

/// Scalars serde writes to JSON as strings.
pub(in crate::schema) const STRINGS: &[&str] = &[
    "char",
    "Uuid",
    "DateTime",
    "NaiveDateTime",
    "NaiveDate",
    "NaiveTime",
    "IpAddr",
    "Ipv4Addr",
    "Ipv6Addr",
    "SocketAddr",
    "SocketAddrV4",
    "SocketAddrV6",
];

impl Ty {
    pub(in crate::schema) fn parse(text: &str) -> Ty {
        parse(text.trim()).unwrap_or_else(|| Ty::Text(text.to_owned()))
    }

    /// Whether a value of the type at `path` (of the old side) may be stored as JSON `null`,
    /// which `Option` reads as `None`.
    fn nullable(&self, path: &[Seg], sides: &Sides) -> bool {
        match self {
            Ty::Scalar(s) => s == "()" || s == "Value",
            Ty::Option(_) | Ty::Text(_) => true,
            Ty::Newtype(inner) => inner.nullable(path, sides),
            // A struct or enum is an object, an array or a string, except an untagged enum
            // (a unit variant is `null`); a name without fields or variants may be anything.
            Ty::Named(_) => match sides.old.line(path) {
                Some(line) if line.notes.has("untagged") => true,
                _ => {
                    !sides.old.has_below(path)
                        && sides
                            .old
                            .line(path)
                            .is_none_or(|l| !COMPOSITE.iter().any(|n| l.notes.has(n)))
                }
            },
            _ => false,
        }
    }
}

fn parse(s: &str) -> Option<Ty> {
    if s == "()" {
        return Some(Ty::Scalar(s.to_owned()));
    }
    if let Some(inner) = s.strip_prefix('(').and_then(|r| r.strip_suffix(')')) {
        let inner = inner.strip_suffix(',').unwrap_or(inner);
        let items = split_top(inner, ", ");
        return items
            .into_iter()
            .map(parse)
            .collect::<Option<_>>()
            .map(Ty::Tuple);
    }
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        let (ty, len) = inner.rsplit_once("; ")?;
        return Some(Ty::Array(Box::new(parse(ty)?), len.to_owned()));
    }
    let name_end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    if name_end == 0 {
        return None;
    }
    let (name, mut rest) = s.split_at(name_end);
    let mut args = Vec::new();
    if let Some(r) = rest.strip_prefix('<') {
        let close = closing(r, '<', '>')?;
        args = split_top(&r[..close], ", ");
        rest = &r[close + 1..];
    }
    let one = |args: &[&str]| match args {
        [a] => parse(a).map(Box::new),
        _ => None,
    };
    let ty = match (name, args.as_slice()) {
        ("Option", a) => Ty::Option(one(a)?),
        ("Vec", a) => Ty::Seq(one(a)?),
        ("Set", a) => Ty::Set(one(a)?),
        ("Map", [k, v]) => Ty::Map(Box::new(parse(k)?), Box::new(parse(v)?)),
        ("NonZero", [_]) => Ty::Scalar(s[..s.len() - rest.len()].to_owned()),
        (name, []) if SCALARS.contains(&name) => Ty::Scalar(name.to_owned()),
        (name, _) => Ty::Named(name.to_owned()),
    };
    if rest.is_empty() {
        return Some(ty);
    }
    // `Id(u64)`: a newtype struct and what it holds.
    let inner = rest.strip_prefix('(')?.strip_suffix(')')?;
    matches!(ty, Ty::Named(_)).then_some(())?;
    Some(Ty::Newtype(Box::new(parse(inner)?)))
}

/// The index in `s` of the `close` that closes an `open` already passed.
fn closing(s: &str, open: char, close: char) -> Option<usize> {
    let mut depth = 1usize;
    for (i, c) in s.char_indices() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// Whether old values read as the new type, and why.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The same stored form.
    Same,
    /// Every value of the old type reads as the new one, to the same meaning.
    Compatible(String),
    /// Some do not.
    Breaking(String),
}

impl Verdict {
    /// Both verdicts: the first breaking one, else the first compatible one.
    fn and(self, other: Verdict) -> Verdict {
        match (self, other) {
            (b @ Verdict::Breaking(_), _) | (_, b @ Verdict::Breaking(_)) => b,
            (c @ Verdict::Compatible(_), _) | (_, c @ Verdict::Compatible(_)) => c,
            _ => Verdict::Same,
        }
    }
}

/// The two states whose lines the types belong to: to tell a struct or enum (whose fields
/// and variants are lines of their own) from a scalar that only has a name.
pub(super) struct Sides<'a> {
    pub(super) old: &'a State,
    pub(super) new: &'a State,
}

impl Sides<'_> {
    /// Whether the type at `path` has fields or variants of its own, on both sides.
    fn both_composite(&self, path: &[Seg], own: bool) -> bool {
        let composite = |state: &State| {
            state.has_below(path)
                || match state.line(path) {
                    Some(line) if own => COMPOSITE.iter().any(|n| line.notes.has(n)),
                    Some(_) => true,
                    None => false,
                }
        };
        composite(self.old) && composite(self.new)
    }
}

/// Whether every value stored as `old` at `path` reads as `new`. `own`: `path` is the line's
/// own path (not that of an element inside its type).
pub(super) fn compat(old: &Ty, new: &Ty, path: &[Seg], own: bool, sides: &Sides) -> Verdict {
    let at = |seg: Seg| {
        let mut p = path.to_vec();
        p.push(seg);
        p
    };
    match (old, new) {
        (Ty::Newtype(a), b) if !matches!(b, Ty::Newtype(_)) => compat(a, b, path, own, sides),
        (a, Ty::Newtype(b)) if !matches!(a, Ty::Newtype(_)) => compat(a, b, path, own, sides),
        (Ty::Newtype(a), Ty::Newtype(b)) => compat(a, b, path, own, sides),
        (_, Ty::Scalar(s)) if s == "Value" && old != new => {
            Verdict::Compatible("a `Value` reads any stored JSON".into())
        }
        (Ty::Option(a), Ty::Option(b)) => compat(a, b, path, own, sides),
        (a, Ty::Option(b)) => {
            if a.nullable(path, sides) {
                Verdict::Breaking(
                    "a stored `null` meant a value and would now read as `None`".into(),
                )
            } else {
                compat(a, b, path, own, sides).and(Verdict::Compatible(
                    "an `Option` reads every stored value as `Some`".into(),
                ))
            }
        }
        (Ty::Option(_), _) => Verdict::Breaking("a stored `null` (`None`) no longer reads".into()),
        (Ty::Seq(a), Ty::Seq(b)) | (Ty::Set(a), Ty::Set(b)) => {
            compat(a, b, &at(Seg::Element), false, sides)
        }
        (Ty::Set(a) | Ty::Array(a, _), Ty::Seq(b)) => compat(a, b, &at(Seg::Element), false, sides)
            .and(Verdict::Compatible("a `Vec` reads any stored array".into())),
        (Ty::Array(a, n), Ty::Array(b, m)) if n == m => {
            compat(a, b, &at(Seg::Element), false, sides)
        }
        (Ty::Map(k, v), Ty::Map(k2, v2)) => compat(k, k2, &at(Seg::Key), false, sides).and(compat(
            v,
            v2,
            &at(Seg::Value),
            false,
            sides,
        )),
        (Ty::Tuple(a), Ty::Tuple(b)) if a.len() == b.len() => {
            a.iter()
                .zip(b)
                .enumerate()
                .fold(Verdict::Same, |verdict, (i, (a, b))| {
                    verdict.and(compat(a, b, &at(Seg::Field(i.to_string())), true, sides))
                })
        }
        (Ty::Scalar(a), Ty::Scalar(b)) => scalar(a, b),
        (Ty::Named(a), Ty::Named(b)) => {
            if a == b {
                Verdict::Same
            } else if sides.both_composite(path, own) {
                Verdict::Compatible("type names are not stored".into())
            } else {
                Verdict::Breaking(format!("`{b}` is not stored as `{a}`"))
            }
        }
        (a, b) if a == b => Verdict::Same,
        _ => Verdict::Breaking("the stored form changed".into()),
    }
}

/// An integer kind: (signed, bits). `usize` and `isize` are taken as 64 bits.
fn int(s: &str) -> Option<(bool, u32)> {
    let s = s
        .strip_prefix("NonZero<")
        .and_then(|s| s.strip_suffix('>'))
        .unwrap_or(s);
    let (signed, bits) = match s.split_at_checked(1)? {
        ("u", "size") => return Some((false, 64)),
        ("i", "size") => return Some((true, 64)),
        ("u", bits) => (false, bits),
        ("i", bits) => (true, bits),
        _ => return None,
    };
    bits.parse().ok().map(|bits| (signed, bits))
}

fn scalar(old: &str, new: &str) -> Verdict {
    if old == new {
        return Verdict::Same;
    }
    let reads = || Verdict::Compatible(format!("a `{new}` reads every stored `{old}`"));
    let fits = match (int(old), int(new)) {
        // A non-zero integer is stored as the integer; an integer may be zero.
        _ if new.starts_with("NonZero<") => false,
        (Some((false, a)), Some((false, b))) | (Some((true, a)), Some((true, b))) => b >= a,
        (Some((false, a)), Some((true, b))) => b > a,
        (Some(_), Some(_)) => false,
        // Exact in the float's mantissa.
        (Some((_, bits)), None) if new == "f64" => bits <= 32,
        (Some((_, bits)), None) if new == "f32" => bits <= 16,
        (Some(_), None) => new == "Number",
        (None, _) if old == "f32" => new == "f64" || new == "Number",
        (None, _) if old == "f64" => new == "Number",
        _ => match new {
            "String" => STRINGS.contains(&old),
            "IpAddr" => old == "Ipv4Addr" || old == "Ipv6Addr",
            "SocketAddr" => old == "SocketAddrV4" || old == "SocketAddrV6",
            _ => false,
        },
    };
    if fits {
        reads()
    } else {
        Verdict::Breaking(format!("a `{new}` does not read every stored `{old}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(s: &str) -> Box<Ty> {
        Box::new(Ty::Named(s.into()))
    }

    fn scalar_ty(s: &str) -> Box<Ty> {
        Box::new(Ty::Scalar(s.into()))
    }

    #[test]
    fn types_parse() {
        assert_eq!(
            Ty::parse("Option<Vec<Issue>>"),
            Ty::Option(Box::new(Ty::Seq(named("Issue"))))
        );
        assert_eq!(
            Ty::parse("Map<String, Page<Issue>>"),
            Ty::Map(scalar_ty("String"), named("Page"))
        );
        assert_eq!(Ty::parse("Id(u64)"), Ty::Newtype(scalar_ty("u64")));
        assert_eq!(Ty::parse("Marker(())"), Ty::Newtype(scalar_ty("()")));
        assert_eq!(
            Ty::parse("Wrapper<u8>(Vec<u8>)"),
            Ty::Newtype(Box::new(Ty::Seq(scalar_ty("u8"))))
        );
        assert_eq!(
            Ty::parse("[(u8, String); 4]"),
            Ty::Array(
                Box::new(Ty::Tuple(vec![
                    Ty::Scalar("u8".into()),
                    Ty::Scalar("String".into())
                ])),
                "4".into()
            )
        );
        assert_eq!(Ty::parse("(u8,)"), Ty::Tuple(vec![Ty::Scalar("u8".into())]));
        assert_eq!(Ty::parse("NonZero<u8>"), Ty::Scalar("NonZero<u8>".into()));
        assert_eq!(Ty::parse("..."), Ty::Text("...".into()));
        assert_eq!(Ty::parse("&'static str"), Ty::Text("&'static str".into()));
    }

    #[test]
    fn scalars_that_read_each_other() {
        for (old, new) in [
            ("u8", "u64"),
            ("u32", "i64"),
            ("i32", "i128"),
            ("u32", "f64"),
            ("f32", "f64"),
            ("NonZero<u32>", "u32"),
            ("usize", "u64"),
            ("char", "String"),
            ("Uuid", "String"),
            ("Ipv4Addr", "IpAddr"),
        ] {
            assert!(
                matches!(scalar(old, new), Verdict::Compatible(_)),
                "{old} -> {new}"
            );
        }
        for (old, new) in [
            ("u64", "u32"),
            ("i8", "u64"),
            ("u64", "i64"),
            ("u64", "f64"),
            ("f64", "f32"),
            ("u32", "NonZero<u32>"),
            ("String", "char"),
            ("String", "Uuid"),
            ("bool", "u8"),
        ] {
            assert!(
                matches!(scalar(old, new), Verdict::Breaking(_)),
                "{old} -> {new}"
            );
        }
    }
}
