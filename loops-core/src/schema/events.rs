//! The events a stored schema description declares (`#[event(name: Type)]`), and the check
//! of an event sent from outside the program (the CLI, the control endpoint) against them:
//! a name the workflow does not declare, or a payload that cannot be its declared type, is
//! refused before anything is written.
//!
//! The payload check reads the description, not the Rust type, so it is conservative: it
//! refuses only what serde's derive would refuse for sure (a missing field that must be
//! present, a JSON value of the wrong kind, an unknown variant of an externally tagged
//! enum), and lets through what the description does not model (enums with other
//! representations, `flatten`, `with`).

use std::fmt;

use serde_json::Value;

use super::diff::parse::{Description, EventDecl, Line, Seg};
use super::diff::ty::{STRINGS, Ty};

/// The events a workflow declares, as read from its stored schema description
/// ([`Workflow::SCHEMA`](crate::Workflow::SCHEMA)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeclaredEvents {
    workflow: String,
    events: Vec<DeclaredEvent>,
}

/// One declared event: its name and its payload's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeclaredEvent {
    /// The event's name.
    pub name: String,
    /// The payload's type as the description writes it (`Approval`, `Option<String>`).
    pub payload: String,
    /// The payload's top-level fields, as `name: Type` (empty for a payload without fields).
    pub fields: Vec<String>,
    /// A payload of the declared shape to start from ([`DeclaredEvent::skeleton`]).
    skeleton: Value,
}

/// Why [`DeclaredEvents::check`] refused an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventRefusal {
    /// The workflow declares events, but not this one.
    #[error("workflow `{workflow}` declares no event `{event}`; it declares {declared}")]
    Undeclared {
        /// The workflow's name.
        workflow: String,
        /// The name sent.
        event: String,
        /// The declared events and their shapes, `approve: Approval { by: String }`, joined.
        declared: String,
    },
    /// The payload cannot be the declared type.
    #[error("the payload does not match event `{event}`'s declared shape `{shape}`: {problem}")]
    Payload {
        /// The event's name.
        event: String,
        /// The declared shape, `Approval { by: String }`.
        shape: String,
        /// What does not match, with its path in the payload (`field `by` is missing`).
        problem: String,
    },
    /// The payload is not JSON that a payload type can read: a text whose syntax a
    /// [`RawValue`](serde_json::value::RawValue) takes can still hold a lone surrogate
    /// escape (`"\ud800"`, no character) or a number out of range, which no type reads.
    #[error("the payload is not valid JSON: {problem}")]
    NotJson {
        /// serde_json's error, with its line and column
        /// (`lone leading surrogate in hex escape at line 1 column 13`).
        problem: String,
    },
    /// The payload has the declared shape, but the declared type's own checks refuse it
    /// ([`Workflow::read_event`](crate::Workflow::read_event): a `#[serde(try_from = ..)]`
    /// conversion, say): the run would set it aside when it waits for it.
    #[error("event `{event}`'s payload type refuses the payload: {problem}")]
    Refused {
        /// The event's name.
        event: String,
        /// The type's error.
        problem: String,
    },
    /// An object of the payload names a key twice: a run's type would read one of them, or
    /// refuse the whole payload when the run takes it (a struct), after it was accepted.
    #[error("the payload names a key twice in one object: {problem}; send each key once")]
    DuplicateKey {
        /// The key and where, `duplicate key `by` at line 1 column 17`.
        problem: String,
    },
}

/// The first key that an object of the JSON text `json` names twice, with its line and
/// column (`duplicate key `by` at line 1 column 17`); `None` if there is none (or `json` is
/// not JSON: said by its parse).
pub(crate) fn duplicate_key(json: &str) -> Option<String> {
    use serde::de::{Error as _, MapAccess, SeqAccess, Visitor};

    /// Any JSON value, whose objects name each key once.
    struct Unique;

    impl<'de> serde::Deserialize<'de> for Unique {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Unique, D::Error> {
            d.deserialize_any(Unique)
        }
    }

    impl<'de> Visitor<'de> for Unique {
        type Value = Unique;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_unit<E>(self) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
            while seq.next_element::<Unique>()?.is_some() {}
            Ok(Unique)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                if seen.contains(&key) {
                    return Err(A::Error::custom(format!("duplicate key `{key}`")));
                }
                map.next_value::<Unique>()?;
                seen.insert(key);
            }
            Ok(Unique)
        }
    }

    match serde_json::from_str::<Unique>(json) {
        Err(e) if e.is_data() => Some(e.to_string()),
        _ => None,
    }
}

impl DeclaredEvents {
    /// The events the schema description `description` declares; none for a description
    /// without `event` lines (a workflow that declares no events, or one stored by an older
    /// build).
    pub fn from_description(description: &str) -> Self {
        let parsed = Description::new(description);
        DeclaredEvents {
            workflow: parsed.header.map(|h| h.name).unwrap_or_default(),
            events: parsed.events.iter().map(DeclaredEvent::of).collect(),
        }
    }

    /// The declared events, in the order written.
    pub fn events(&self) -> &[DeclaredEvent] {
        &self.events
    }

    /// Whether the workflow declares no events (then every name and payload is let through).
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The event named `name`.
    pub fn get(&self, name: &str) -> Option<&DeclaredEvent> {
        self.events.iter().find(|e| e.name == name)
    }

    /// Checks an event `event` with `payload` against the declarations (the description
    /// they were read from is needed again for the payload's lines: pass the same text).
    ///
    /// # Errors
    /// [`EventRefusal::Undeclared`] when events are declared and `event` is not one of them;
    /// [`EventRefusal::Payload`] when `payload` cannot be the declared type. A workflow that
    /// declares no events refuses nothing.
    pub fn check(
        &self,
        description: &str,
        event: &str,
        payload: &Value,
    ) -> Result<(), EventRefusal> {
        if self.is_empty() {
            return Ok(());
        }
        let Some(declared) = self.get(event) else {
            return Err(EventRefusal::Undeclared {
                workflow: self.workflow.clone(),
                event: event.to_owned(),
                declared: self.to_string(),
            });
        };
        let parsed = Description::new(description);
        let Some(decl) = parsed.event(event) else {
            return Ok(());
        };
        let checker = Checker { lines: &decl.lines };
        checker
            .value(payload, &Ty::parse(&decl.ty), &[], own_notes(decl))
            .map_err(|problem| EventRefusal::Payload {
                event: event.to_owned(),
                shape: declared.shape(),
                problem,
            })
    }
}

/// `approve: Approval { by: String }, reject: Rejection { reason: String }`.
impl fmt::Display for DeclaredEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.events.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl DeclaredEvent {
    fn of(e: &EventDecl) -> Self {
        DeclaredEvent {
            name: e.name.clone(),
            payload: e.ty.clone(),
            fields: e
                .lines
                .iter()
                .filter(|l| matches!(l.segs.as_slice(), [Seg::Field(_)]))
                .map(|l| format!("{}: {}", l.path, l.ty))
                .collect(),
            skeleton: Checker { lines: &e.lines }.skeleton(&Ty::parse(&e.ty), &[]),
        }
    }

    /// A payload of the declared shape to start from, for a form to fill in: every field the
    /// payload must have, each with an empty value of its type (`""`, `0`, `false`, `[]`,
    /// `{}`, `null` for an `Option` or a type the description does not model, the first
    /// variant's name for an enum), nested structs filled the same way. Fields that serde
    /// skips when reading are left out. `{"by": "", "note": null}` for `Approval { by:
    /// String, note: Option<String> }`.
    pub fn skeleton(&self) -> &Value {
        &self.skeleton
    }

    /// `Approval { by: String }`, or the type alone for a payload without fields.
    pub fn shape(&self) -> String {
        if self.fields.is_empty() {
            self.payload.clone()
        } else {
            format!("{} {{ {} }}", self.payload, self.fields.join(", "))
        }
    }
}

/// `approve: Approval { by: String }`.
impl fmt::Display for DeclaredEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.shape())
    }
}

/// Whether the payload's own notes are plain (nothing the check does not model).
fn own_notes(decl: &EventDecl) -> bool {
    decl.notes.rest.is_empty()
}

/// Checks JSON values against the lines of one event's payload.
struct Checker<'a> {
    lines: &'a [Line],
}

impl Checker<'_> {
    /// An empty value of `ty` at `path` ([`DeclaredEvent::skeleton`]).
    fn skeleton(&self, ty: &Ty, path: &[Seg]) -> Value {
        let inside = |seg: Seg| {
            let mut inside = path.to_vec();
            inside.push(seg);
            inside
        };
        match ty {
            Ty::Scalar(kind) => match kind.as_str() {
                "bool" => Value::Bool(false),
                "String" | "char" => Value::String(String::new()),
                k if STRINGS.contains(&k) => Value::String(String::new()),
                k if k.starts_with("NonZero") => Value::from(1),
                // A number kind: takes 0, refuses a boolean (unknown kinds take anything).
                k if scalar(&Value::from(0), k).is_ok()
                    && scalar(&Value::Bool(true), k).is_err() =>
                {
                    Value::from(0)
                }
                _ => Value::Null,
            },
            Ty::Option(_) | Ty::Text(_) => Value::Null,
            Ty::Newtype(inner) => self.skeleton(inner, path),
            Ty::Seq(_) | Ty::Set(_) => Value::Array(Vec::new()),
            Ty::Map(..) => Value::Object(serde_json::Map::new()),
            Ty::Array(inner, len) => {
                let item = self.skeleton(inner, &inside(Seg::Element));
                Value::Array(vec![item; len.parse().unwrap_or(0)])
            }
            Ty::Tuple(items) => Value::Array(
                items
                    .iter()
                    .map(|item| self.skeleton(item, &inside(Seg::Element)))
                    .collect(),
            ),
            Ty::Named(_) => {
                let below: Vec<&Line> = self.below(path).collect();
                if let Some(Seg::Variant(first)) = below.first().and_then(|l| l.segs.last()) {
                    return Value::String(first.clone());
                }
                if below.is_empty() {
                    return Value::Null;
                }
                let fields = below.iter().filter_map(|line| match line.segs.last() {
                    Some(Seg::Field(name))
                        if !line.notes.skip_deserializing && !line.notes.flatten =>
                    {
                        Some((
                            name.clone(),
                            self.skeleton(&Ty::parse(&line.ty), &line.segs),
                        ))
                    }
                    _ => None,
                });
                Value::Object(fields.collect())
            }
        }
    }

    /// The lines directly below `path`.
    fn below<'s>(&'s self, path: &'s [Seg]) -> impl Iterator<Item = &'s Line> + 's {
        self.lines
            .iter()
            .filter(move |l| l.segs.len() == path.len() + 1 && l.segs.starts_with(path))
    }

    /// Checks `v` as a `ty` at `path`; `plain` is whether the notes at `path` say nothing
    /// the check does not model.
    fn value(&self, v: &Value, ty: &Ty, path: &[Seg], plain: bool) -> Result<(), String> {
        match ty {
            Ty::Scalar(kind) => scalar(v, kind).map_err(|e| at(path, e)),
            Ty::Option(inner) if !v.is_null() => self.value(v, inner, path, plain),
            Ty::Option(_) | Ty::Text(_) => Ok(()),
            Ty::Newtype(inner) => self.value(v, inner, path, plain),
            Ty::Seq(inner) | Ty::Set(inner) | Ty::Array(inner, _) => {
                let items = v
                    .as_array()
                    .ok_or_else(|| at(path, expected("an array", v)))?;
                let mut inside = path.to_vec();
                inside.push(Seg::Element);
                items
                    .iter()
                    .try_for_each(|item| self.value(item, inner, &inside, true))
            }
            Ty::Map(_, inner) => {
                let map = v
                    .as_object()
                    .ok_or_else(|| at(path, expected("an object", v)))?;
                let mut inside = path.to_vec();
                inside.push(Seg::Value);
                map.values()
                    .try_for_each(|item| self.value(item, inner, &inside, true))
            }
            Ty::Tuple(items) => {
                let list = v
                    .as_array()
                    .ok_or_else(|| at(path, expected("an array", v)))?;
                if list.len() != items.len() {
                    return Err(at(
                        path,
                        format!("expected {} elements, found {}", items.len(), list.len()),
                    ));
                }
                Ok(())
            }
            Ty::Named(_) if plain => self.composite(v, path),
            Ty::Named(_) => Ok(()),
        }
    }

    /// A struct (fields below `path`) or an externally tagged enum (variants below it).
    fn composite(&self, v: &Value, path: &[Seg]) -> Result<(), String> {
        let below: Vec<&Line> = self.below(path).collect();
        if below.is_empty() || below.iter().any(|l| l.notes.flatten) {
            return Ok(());
        }
        let variants: Vec<&str> = below
            .iter()
            .filter_map(|l| match l.segs.last() {
                Some(Seg::Variant(name)) => Some(name.as_str()),
                _ => None,
            })
            .collect();
        if !variants.is_empty() {
            let name = match v {
                Value::String(name) => Some(name.as_str()),
                Value::Object(map) if map.len() == 1 => map.keys().next().map(String::as_str),
                _ => None,
            };
            return match name {
                Some(name) if variants.contains(&name) => Ok(()),
                _ => Err(at(
                    path,
                    format!(
                        "expected one of the variants {}, found {}",
                        variants
                            .iter()
                            .map(|n| format!("`{n}`"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        kind_of(v)
                    ),
                )),
            };
        }
        let map = v
            .as_object()
            .ok_or_else(|| at(path, expected("an object", v)))?;
        for line in below {
            let Some(Seg::Field(name)) = line.segs.last() else {
                continue;
            };
            let ty = Ty::parse(&line.ty);
            match map.get(name) {
                Some(field) => {
                    let plain = line.notes.rest.is_empty() && !line.notes.flatten;
                    self.value(field, &ty, &line.segs, plain)?;
                }
                None if line.notes.default
                    || line.notes.skip_deserializing
                    || matches!(ty, Ty::Option(_)) => {}
                None => {
                    return Err(format!(
                        "field `{}` ({}) is missing",
                        path_text(&line.segs),
                        line.ty
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Checks a JSON scalar of `kind`.
fn scalar(v: &Value, kind: &str) -> Result<(), String> {
    let ok = match kind {
        "bool" => v.is_boolean(),
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => v.is_u64(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => v.is_i64() || v.is_u64(),
        "f32" | "f64" | "Number" => v.is_number(),
        "String" => v.is_string(),
        "()" => v.is_null(),
        k if STRINGS.contains(&k) => v.is_string(),
        // `Value`, `NonZero<..>` and scalars the description does not know.
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(expected(&format!("a {kind}"), v))
    }
}

fn expected(what: &str, v: &Value) -> String {
    format!("expected {what}, found {}", kind_of(v))
}

/// `the number 1`, `a string`, `null`...
fn kind_of(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(_) => "a string".to_owned(),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

/// A problem at `path`: `` `by`: expected a String, found the number 1 ``.
fn at(path: &[Seg], problem: String) -> String {
    if path.is_empty() {
        problem
    } else {
        format!("`{}`: {problem}", path_text(path))
    }
}

/// `issue.labels[]`, as the description writes paths.
fn path_text(path: &[Seg]) -> String {
    let mut out = String::new();
    for (i, seg) in path.iter().enumerate() {
        match seg {
            Seg::Field(name) if i == 0 => out.push_str(name),
            Seg::Field(name) => {
                out.push('.');
                out.push_str(name);
            }
            Seg::Element => out.push_str("[]"),
            Seg::Key => out.push_str("{key}"),
            Seg::Value => out.push_str("{}"),
            Seg::Variant(name) => {
                out.push_str("::");
                out.push_str(name);
            }
        }
    }
    out
}
