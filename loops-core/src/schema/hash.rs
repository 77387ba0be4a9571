//! The schema hash, computed by `const fn`s over a shape.
//!
//! Every node is hashed as a chain of [`SchemaHash::combine`]s starting from a tag that names
//! its kind (`"struct"`, `"seq"`, ...), so that different structures cannot hash alike.
//! Unordered collections — the fields of a JSON object, the variants of a tagged enum, the
//! states of a workflow and a state's next states — are hashed as the wrapping sum of their
//! members' hashes, which does not depend on their order. A [`Shape::Recursive`] reference is
//! hashed as its distance to the enclosing type it refers to, so a recursive type hashes the
//! same wherever it appears.
//!
//! Changing anything here changes every stored hash and strands every stored run: the golden
//! values in the tests pin it.

use super::{
    Enum, Field, FieldFlags, Fields, Repr, SchemaHash, Shape, StateShape, Struct, WorkflowShape,
};

/// How deeply shapes may nest (each struct, enum, option, sequence, map, tuple or array is one
/// level) below a field of a state. Deeper shapes are hashed as "too deep" and described so.
/// Real payloads are far shallower; the limit keeps const evaluation well within the
/// compiler's call-depth limit.
pub(crate) const MAX_DEPTH: usize = 20;

/// The shapes being walked: their nesting depth, and the named types (structs and enums)
/// among them, outermost first, to resolve [`Shape::Recursive`] references.
pub(crate) struct Enclosing {
    names: [&'static str; MAX_DEPTH],
    len: usize,
    depth: usize,
}

impl Enclosing {
    pub(crate) const fn new() -> Self {
        Enclosing {
            names: [""; MAX_DEPTH],
            len: 0,
            depth: 0,
        }
    }

    /// Enters a shape; `false` (and nothing entered) if that would exceed [`MAX_DEPTH`].
    pub(crate) const fn enter(&mut self) -> bool {
        if self.depth == MAX_DEPTH {
            return false;
        }
        self.depth += 1;
        true
    }

    pub(crate) const fn leave(&mut self) {
        self.depth -= 1;
    }

    /// Enters a named type (after [`enter`](Self::enter), which bounds how many there are).
    pub(crate) const fn push(&mut self, name: &'static str) {
        self.names[self.len] = name;
        self.len += 1;
    }

    pub(crate) const fn pop(&mut self) {
        self.len -= 1;
    }

    /// How many types out the nearest enclosing type named `name` is (1 for the innermost).
    pub(crate) const fn distance(&self, name: &str) -> Option<usize> {
        let mut i = self.len;
        while i > 0 {
            i -= 1;
            if str_eq(self.names[i], name) {
                return Some(self.len - i);
            }
        }
        None
    }
}

pub(crate) const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn text(s: &str) -> u64 {
    SchemaHash::of(s.as_bytes()).0
}

const fn mix(a: u64, b: u64) -> u64 {
    SchemaHash(a).combine(SchemaHash(b)).0
}

const fn tagged(tag: &str, value: u64) -> u64 {
    mix(text(tag), value)
}

pub(crate) const fn shape(s: &Shape) -> u64 {
    shape_in(s, &mut Enclosing::new())
}

const fn shape_in(s: &Shape, enclosing: &mut Enclosing) -> u64 {
    if !enclosing.enter() {
        return text("too deep");
    }
    let h = match *s {
        Shape::Scalar(name) => tagged("scalar", text(name)),
        Shape::Option(inner) => tagged("option", shape_in(inner, enclosing)),
        Shape::Seq(inner) => tagged("seq", shape_in(inner, enclosing)),
        Shape::Set(inner) => tagged("set", shape_in(inner, enclosing)),
        Shape::Map(key, value) => mix(
            tagged("map", shape_in(key, enclosing)),
            shape_in(value, enclosing),
        ),
        Shape::Array(inner, len) => mix(tagged("array", len as u64), shape_in(inner, enclosing)),
        Shape::Tuple(items) => {
            let mut h = tagged("tuple", items.len() as u64);
            let mut i = 0;
            while i < items.len() {
                h = mix(h, shape_in(items[i], enclosing));
                i += 1;
            }
            h
        }
        Shape::Struct(s) => strukt(s, enclosing),
        Shape::Enum(e) => enumeration(e, enclosing),
        Shape::Recursive(name) => match enclosing.distance(name) {
            Some(d) => tagged("recursive", d as u64),
            None => tagged("recursive by name", text(name)),
        },
        Shape::Opaque { ty, with } => mix(tagged("opaque", text(ty)), text(with)),
    };
    enclosing.leave();
    h
}

const fn strukt(s: &Struct, enclosing: &mut Enclosing) -> u64 {
    enclosing.push(s.name);
    let mut h = match s.fields {
        // Stored as the field alone, so hashed as the field's value: `struct Id(u64)` is a
        // `u64` in storage.
        Fields::Newtype(field) => shape_in(field.shape, enclosing),
        Fields::Unit => tagged("scalar", text("()")),
        Fields::Tuple(_) | Fields::Named(_) => tagged("struct", fields(s.fields, enclosing)),
    };
    if let Some((tag, value)) = s.tag {
        h = mix(mix(tagged("struct tag", h), text(tag)), text(value));
    }
    if !s.note.is_empty() {
        h = mix(tagged("note", h), text(s.note));
    }
    enclosing.pop();
    h
}

const fn enumeration(e: &Enum, enclosing: &mut Enclosing) -> u64 {
    enclosing.push(e.name);
    let untagged = matches!(e.repr, Repr::Untagged);
    // Untagged: names are not stored and reading tries the variants in order, so the order
    // counts and the names do not. Otherwise: a set of named variants.
    let mut variants: u64 = 0;
    let mut i = 0;
    while i < e.variants.len() {
        let v = &e.variants[i];
        let mut h = fields(v.fields, enclosing);
        if !v.note.is_empty() {
            h = mix(tagged("note", h), text(v.note));
        }
        if untagged {
            variants = mix(variants, h);
        } else {
            variants = variants.wrapping_add(mix(tagged("variant", text(v.name)), h));
        }
        i += 1;
    }
    let mut h = mix(tagged("enum", repr(e.repr)), variants);
    if !e.note.is_empty() {
        h = mix(tagged("note", h), text(e.note));
    }
    enclosing.pop();
    h
}

const fn repr(r: Repr) -> u64 {
    match r {
        Repr::External => text("external"),
        Repr::Internal { tag } => tagged("internal", text(tag)),
        Repr::Adjacent { tag, content } => mix(tagged("adjacent", text(tag)), text(content)),
        Repr::Untagged => text("untagged"),
    }
}

/// The data of a struct, variant or state.
const fn fields(f: Fields, enclosing: &mut Enclosing) -> u64 {
    match f {
        Fields::Unit => text("unit"),
        Fields::Newtype(field) => tagged("newtype", field_hash(field, enclosing)),
        Fields::Tuple(list) => {
            let mut h = tagged("tuple fields", list.len() as u64);
            let mut i = 0;
            while i < list.len() {
                h = mix(h, field_hash(&list[i], enclosing));
                i += 1;
            }
            h
        }
        Fields::Named(list) => tagged("named fields", named(list, enclosing)),
    }
}

/// The order-independent sum of named fields, with the fields of flattened structs summed
/// in as if they were written in place.
const fn named(list: &[Field], enclosing: &mut Enclosing) -> u64 {
    let mut sum: u64 = 0;
    let mut i = 0;
    while i < list.len() {
        let field = &list[i];
        i += 1;
        if let Some((s, inner)) = flattened_struct(field) {
            if enclosing.enter() {
                enclosing.push(s.name);
                sum = sum.wrapping_add(named(inner, enclosing));
                enclosing.pop();
                enclosing.leave();
            } else {
                sum = sum.wrapping_add(text("too deep"));
            }
            continue;
        }
        sum = sum.wrapping_add(field_hash(field, enclosing));
    }
    sum
}

/// The struct a `#[serde(flatten)]` field inlines, if it is one with named fields and nothing
/// else that would change how its fields are written.
pub(crate) const fn flattened_struct(field: &Field) -> Option<(&'static Struct, &'static [Field])> {
    if !field.flags.contains(FieldFlags::FLATTEN)
        || field.flags.bits() != FieldFlags::FLATTEN.bits()
        || !field.note.is_empty()
    {
        return None;
    }
    match *field.shape {
        Shape::Struct(s) => match s.fields {
            Fields::Named(inner) if s.tag.is_none() && s.note.is_empty() => Some((s, inner)),
            _ => None,
        },
        _ => None,
    }
}

const fn field_hash(f: &Field, enclosing: &mut Enclosing) -> u64 {
    let mut h = mix(tagged("field", text(f.name)), f.flags.bits() as u64);
    if !f.note.is_empty() {
        h = mix(tagged("note", h), text(f.note));
    }
    mix(h, shape_in(f.shape, enclosing))
}

pub(crate) const fn workflow(w: &WorkflowShape) -> u64 {
    let mut h = mix(tagged("workflow", text(w.name)), w.version as u64);
    h = mix(h, repr(w.repr));
    if !w.note.is_empty() {
        h = mix(tagged("note", h), text(w.note));
    }
    let mut states: u64 = 0;
    let mut i = 0;
    while i < w.states.len() {
        states = states.wrapping_add(state(&w.states[i]));
        i += 1;
    }
    h = mix(h, states);
    // Folded in only when there are events: a workflow that declares none keeps the hash it
    // had before events were described, so its stored runs are not stranded.
    if w.events.is_empty() {
        return h;
    }
    let mut events: u64 = 0;
    let mut i = 0;
    while i < w.events.len() {
        let e = &w.events[i];
        events = events.wrapping_add(mix(tagged("event", text(e.name)), shape(e.payload)));
        i += 1;
    }
    mix(tagged("events", h), events)
}

const fn state(s: &StateShape) -> u64 {
    let mut enclosing = Enclosing::new();
    let mut h = mix(tagged("state", text(s.name)), text(s.variant.name));
    h = mix(h, fields(s.variant.fields, &mut enclosing));
    if !s.variant.note.is_empty() {
        h = mix(tagged("note", h), text(s.variant.note));
    }
    h = mix(h, (s.initial as u64) | (s.terminal as u64) << 1);
    let mut next: u64 = 0;
    let mut i = 0;
    while i < s.next.len() {
        next = next.wrapping_add(tagged("next", text(s.next[i])));
        i += 1;
    }
    mix(h, next)
}

impl Shape {
    /// The [`SchemaHash`] of this shape: what `#[derive(Workflow)]` folds in for a field of
    /// this type.
    pub const fn hash(&self) -> SchemaHash {
        SchemaHash::from_u64(shape(self))
    }
}

impl WorkflowShape {
    /// The [`SchemaHash`] of the workflow: [`Workflow::SCHEMA_HASH`](crate::Workflow::SCHEMA_HASH).
    pub const fn hash(&self) -> SchemaHash {
        SchemaHash::from_u64(workflow(self))
    }
}
