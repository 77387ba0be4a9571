//! The description: a line-per-field text of a workflow's stored form, written at compile
//! time into [`Workflow::SCHEMA`](crate::Workflow::SCHEMA). [`schema_diff`](super::schema_diff)
//! reads it back.
//!
//! ```text
//! workflow deliver version 1 format 1
//! state Received (struct, initial) -> Planned | Abandoned
//!   issue: Issue
//!   issue.number: u64
//!   issue.labels: Vec<String>
//!   issue.id: IssueId(u64)
//! state Planned (struct) -> Edited
//!   plan: Plan
//!   plan.steps: Vec<Step>
//!   plan.steps[]: Step
//!   plan.steps[].kind: StepKind (tag = "type")
//!   plan.steps[].kind::Edit: struct
//!   plan.steps[].kind::Edit.file: String
//!   plan.steps[].kind::Wait: unit
//!   plan.owners: Map<String, User>
//!   plan.owners{}: User
//!   plan.owners{}.name: String
//! state Abandoned (unit, terminal)
//! event approve: Approval
//!   by: String
//! ```
//!
//! The header names the workflow, its declared version and loops' record format version
//! ([`FORMAT_VERSION`](super::FORMAT_VERSION)), then how the enum is stored. One
//! header line per state (its kind, `initial`/`terminal`, its next states), then one line
//! per field at any depth: a path (`.field`, `[]` for the elements of a sequence, set or
//! array, `{}` for map values and `{key}` for map keys, `::Variant` for an enum's variants,
//! `.0` for unnamed fields), the stored type, and in parentheses the attributes that change
//! how it is stored. The names are the stored ones (after serde's `rename`); fields of a
//! flattened struct are listed in place. Type names are for the reader: sequences are
//! `Vec<T>`, sets `Set<T>`, maps `Map<K, V>`, whatever the Rust type; a newtype struct is
//! written with what it holds (`IssueId(u64)`), a unit struct as holding `()`; a tuple
//! struct is noted `tuple`, a struct without fields `no fields` and an enum without
//! variants `no variants`. After the states, one `event NAME: Type` line per declared event
//! (`#[event(name: Type)]`), followed by the lines of its payload, with paths from the
//! payload. Everything the
//! schema hash covers is in the text, so two shapes with different hashes have different
//! descriptions (up to the order of what the hash does not order: states, named fields,
//! variants of tagged enums, `#[next]` lists).

use super::hash::{Enclosing, MAX_DEPTH, flattened_struct, str_eq};
use super::{EventShape, FieldFlags, Fields, Repr, Shape, StateShape, WorkflowShape};
use super::{Field, Struct, Variant};

/// The length in bytes of the description of `w`: the `N` to pass to [`describe`].
pub const fn describe_len(w: &WorkflowShape) -> usize {
    let mut d = Describer::new(&mut []);
    d.workflow(w);
    d.len
}

/// The description of `w`, as UTF-8 bytes; `N` must be [`describe_len`]`(w)`.
pub const fn describe<const N: usize>(w: &WorkflowShape) -> [u8; N] {
    let mut buf = [0u8; N];
    let mut d = Describer::new(&mut buf);
    d.workflow(w);
    assert!(d.len == N, "describe::<N>: N must be describe_len(w)");
    buf
}

/// The description of `w`, written at run time (the same text as [`describe`]).
pub(crate) fn describe_string(w: &WorkflowShape) -> String {
    let mut buf = vec![0u8; describe_len(w)];
    let mut d = Describer::new(&mut buf);
    d.workflow(w);
    // Every byte comes from a `&str` or is ASCII, and strings are written whole.
    String::from_utf8_lossy(&buf).into_owned()
}

/// The bytes [`describe`] wrote, as a `&str`.
pub const fn utf8(bytes: &'static [u8]) -> &'static str {
    match core::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(_) => panic!("a schema description is UTF-8"),
    }
}

/// How many path segments a field line can have.
const MAX_PATH: usize = 64;

#[derive(Clone, Copy)]
enum Segment {
    Name(&'static str),
    Index(usize),
    Element,
    Key,
    Value,
    Variant(&'static str),
}

struct Describer<'a> {
    buf: &'a mut [u8],
    /// Bytes written so far (or that would have been, past the end of `buf`).
    len: usize,
    path: [Segment; MAX_PATH],
    path_len: usize,
    enclosing: Enclosing,
}

impl<'a> Describer<'a> {
    const fn new(buf: &'a mut [u8]) -> Self {
        Describer {
            buf,
            len: 0,
            path: [Segment::Element; MAX_PATH],
            path_len: 0,
            enclosing: Enclosing::new(),
        }
    }

    const fn byte(&mut self, b: u8) {
        if self.len < self.buf.len() {
            self.buf[self.len] = b;
        }
        self.len += 1;
    }

    const fn str(&mut self, s: &str) {
        let bytes = s.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            self.byte(bytes[i]);
            i += 1;
        }
    }

    const fn num(&mut self, n: u64) {
        let mut digits = [0u8; 20];
        let mut count = 0;
        let mut n = n;
        loop {
            digits[count] = b'0' + (n % 10) as u8;
            count += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        while count > 0 {
            count -= 1;
            self.byte(digits[count]);
        }
    }

    /// A JSON-style quoted string.
    const fn quoted(&mut self, s: &str) {
        self.byte(b'"');
        let bytes = s.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            match b {
                b'"' => self.str("\\\""),
                b'\\' => self.str("\\\\"),
                b'\n' => self.str("\\n"),
                b'\t' => self.str("\\t"),
                b'\r' => self.str("\\r"),
                _ => self.byte(b),
            }
            i += 1;
        }
        self.byte(b'"');
    }

    /// A stored name: as is when it is identifier-like, else quoted.
    const fn name(&mut self, s: &str) {
        if plain(s) {
            self.str(s);
        } else {
            self.quoted(s);
        }
    }

    const fn workflow(&mut self, w: &WorkflowShape) {
        self.str("workflow ");
        self.name(w.name);
        self.str(" version ");
        self.num(w.version as u64);
        self.str(" format ");
        self.num(super::FORMAT_VERSION as u64);
        let mut notes = Notes::new();
        self.repr_notes(&mut notes, w.repr);
        self.serde_note(&mut notes, w.note);
        self.end_notes(&notes);
        self.byte(b'\n');
        let mut i = 0;
        while i < w.states.len() {
            self.state(&w.states[i]);
            i += 1;
        }
        let mut i = 0;
        while i < w.events.len() {
            self.event(&w.events[i]);
            i += 1;
        }
    }

    /// `event approve: Approval (notes)` and the lines of what the payload contains, with
    /// paths from the payload (`by: String`).
    const fn event(&mut self, e: &EventShape) {
        self.str("event ");
        self.name(e.name);
        self.str(": ");
        self.ty(e.payload);
        let mut notes = Notes::new();
        self.shape_notes(&mut notes, e.payload);
        self.end_notes(&notes);
        self.byte(b'\n');
        self.inside(e.payload);
    }

    const fn state(&mut self, s: &StateShape) {
        self.str("state ");
        self.str(s.name);
        if !str_eq(s.name, s.variant.name) {
            self.str(" as ");
            self.quoted(s.variant.name);
        }
        self.str(" (");
        self.str(kind(s.variant.fields));
        if s.initial {
            self.str(", initial");
        }
        if s.terminal {
            self.str(", terminal");
        }
        if !s.variant.note.is_empty() {
            self.str(", serde: ");
            self.str(s.variant.note);
        }
        self.byte(b')');
        let mut i = 0;
        while i < s.next.len() {
            self.str(if i == 0 { " -> " } else { " | " });
            self.str(s.next[i]);
            i += 1;
        }
        self.byte(b'\n');
        self.fields(s.variant.fields);
    }

    // --- paths ---

    /// Enters a path segment; `false` (and nothing entered) if the path is full.
    const fn push(&mut self, segment: Segment) -> bool {
        if self.path_len == MAX_PATH {
            return false;
        }
        self.path[self.path_len] = segment;
        self.path_len += 1;
        true
    }

    const fn pop(&mut self) {
        self.path_len -= 1;
    }

    const fn write_path(&mut self) {
        let mut i = 0;
        while i < self.path_len {
            match self.path[i] {
                Segment::Name(name) => {
                    if i > 0 {
                        self.byte(b'.');
                    }
                    self.name(name);
                }
                Segment::Index(index) => {
                    if i > 0 {
                        self.byte(b'.');
                    }
                    self.num(index as u64);
                }
                Segment::Element => self.str("[]"),
                Segment::Key => self.str("{key}"),
                Segment::Value => self.str("{}"),
                Segment::Variant(name) => {
                    self.str("::");
                    self.name(name);
                }
            }
            i += 1;
        }
    }

    // --- lines ---

    /// `  path: Type (notes)` and the lines of what the type contains.
    const fn line(&mut self, shape: &Shape, flags: FieldFlags, note: &str) {
        self.str("  ");
        self.write_path();
        self.str(": ");
        self.ty(shape);
        let mut notes = Notes::new();
        self.flag_notes(&mut notes, flags);
        self.serde_note(&mut notes, note);
        self.shape_notes(&mut notes, shape);
        self.end_notes(&notes);
        self.byte(b'\n');
        self.inside(shape);
    }

    /// The lines of a struct's, variant's or state's fields, at the current path.
    const fn fields(&mut self, fields: Fields) {
        let list: &[Field] = match fields {
            Fields::Unit => &[],
            Fields::Newtype(field) => core::slice::from_ref(field),
            Fields::Tuple(list) | Fields::Named(list) => list,
        };
        let mut i = 0;
        while i < list.len() {
            let field = &list[i];
            i += 1;
            if let Some((s, inner)) = flattened_struct(field) {
                // Written in place: described in place.
                if self.enclosing.enter() {
                    self.enclosing.push(s.name);
                    self.fields(Fields::Named(inner));
                    self.enclosing.pop();
                    self.enclosing.leave();
                }
                continue;
            }
            if self.push(Segment::Name(field.name)) {
                self.line(field.shape, field.flags, field.note);
                self.pop();
            }
        }
    }

    /// The lines for what `shape` contains, at the current path.
    const fn inside(&mut self, shape: &Shape) {
        if !self.enclosing.enter() {
            if matches!(shape, Shape::Struct(_) | Shape::Enum(_) | Shape::Tuple(_)) {
                self.str("  ");
                self.write_path();
                self.str(": ... (too deep to describe)\n");
            }
            return;
        }
        match *shape {
            Shape::Option(inner) => self.inside(inner),
            Shape::Seq(inner) | Shape::Set(inner) | Shape::Array(inner, _) => {
                self.element(Segment::Element, inner)
            }
            Shape::Map(key, value) => {
                self.element(Segment::Key, key);
                self.element(Segment::Value, value);
            }
            Shape::Tuple(items) => {
                let mut i = 0;
                while i < items.len() {
                    if self.push(Segment::Index(i)) {
                        self.line(items[i], FieldFlags::NONE, "");
                        self.pop();
                    }
                    i += 1;
                }
            }
            Shape::Struct(s) => {
                self.enclosing.push(s.name);
                match s.fields {
                    // Stored as the field: what the field contains, at the same path.
                    Fields::Newtype(field) => self.inside(field.shape),
                    _ => self.fields(s.fields),
                }
                self.enclosing.pop();
            }
            Shape::Enum(e) => {
                self.enclosing.push(e.name);
                let mut i = 0;
                while i < e.variants.len() {
                    self.variant(&e.variants[i]);
                    i += 1;
                }
                self.enclosing.pop();
            }
            Shape::Scalar(_) | Shape::Recursive(_) | Shape::Opaque { .. } => {}
        }
        self.enclosing.leave();
    }

    /// An element of a sequence, set, array or map: a line of its own if it has fields or
    /// variants (so that its type and notes are shown), else just what it contains.
    const fn element(&mut self, segment: Segment, shape: &Shape) {
        if !self.push(segment) {
            return;
        }
        // Through `Option`s and newtype structs, which are stored as what they hold.
        let mut core = shape;
        loop {
            match *core {
                Shape::Option(inner) => core = inner,
                Shape::Struct(Struct {
                    fields: Fields::Newtype(field),
                    ..
                }) => core = field.shape,
                _ => break,
            }
        }
        let named = match *core {
            Shape::Struct(s) => matches!(s.fields, Fields::Named(_) | Fields::Tuple(_)),
            Shape::Enum(_) | Shape::Recursive(_) => true,
            _ => false,
        };
        if named {
            self.line(shape, FieldFlags::NONE, "");
        } else {
            self.inside(shape);
        }
        self.pop();
    }

    /// `  path::Variant: kind (notes)` and the variant's fields.
    const fn variant(&mut self, v: &Variant) {
        if !self.push(Segment::Variant(v.name)) {
            return;
        }
        self.str("  ");
        self.write_path();
        self.str(": ");
        self.str(kind(v.fields));
        let mut notes = Notes::new();
        self.serde_note(&mut notes, v.note);
        self.end_notes(&notes);
        self.byte(b'\n');
        self.fields(v.fields);
        self.pop();
    }

    // --- types ---

    /// A type as the reader knows it: `Option<Vec<Issue>>`, `Map<String, u64>`.
    const fn ty(&mut self, shape: &Shape) {
        self.ty_at(shape, 0);
    }

    const fn ty_at(&mut self, shape: &Shape, depth: usize) {
        if depth > MAX_DEPTH {
            self.str("...");
            return;
        }
        let depth = depth + 1;
        match *shape {
            Shape::Scalar(name) | Shape::Recursive(name) | Shape::Opaque { ty: name, .. } => {
                self.str(name)
            }
            Shape::Option(inner) => self.wrapped("Option<", inner, depth),
            Shape::Seq(inner) => self.wrapped("Vec<", inner, depth),
            Shape::Set(inner) => self.wrapped("Set<", inner, depth),
            Shape::Map(key, value) => {
                self.str("Map<");
                self.ty_at(key, depth);
                self.str(", ");
                self.ty_at(value, depth);
                self.byte(b'>');
            }
            Shape::Array(inner, len) => {
                self.byte(b'[');
                self.ty_at(inner, depth);
                self.str("; ");
                self.num(len as u64);
                self.byte(b']');
            }
            Shape::Tuple(items) => {
                self.byte(b'(');
                self.list(items, depth);
                if items.len() == 1 {
                    self.byte(b',');
                }
                self.byte(b')');
            }
            Shape::Struct(s) => {
                self.generic(s.name, s.params, depth);
                // Stored as what it holds: say what that is (a unit struct is stored as `()`).
                match s.fields {
                    Fields::Newtype(field) => {
                        self.byte(b'(');
                        self.ty_at(field.shape, depth);
                        self.byte(b')');
                    }
                    Fields::Unit => self.str("(())"),
                    Fields::Tuple(_) | Fields::Named(_) => {}
                }
            }
            Shape::Enum(e) => self.generic(e.name, e.params, depth),
        }
    }

    const fn wrapped(&mut self, open: &str, inner: &Shape, depth: usize) {
        self.str(open);
        self.ty_at(inner, depth);
        self.byte(b'>');
    }

    const fn generic(&mut self, name: &str, params: &[&Shape], depth: usize) {
        self.str(name);
        if !params.is_empty() {
            self.byte(b'<');
            self.list(params, depth);
            self.byte(b'>');
        }
    }

    const fn list(&mut self, items: &[&Shape], depth: usize) {
        let mut i = 0;
        while i < items.len() {
            if i > 0 {
                self.str(", ");
            }
            self.ty_at(items[i], depth);
            i += 1;
        }
    }

    // --- notes: ` (default, tag = "type")` ---

    const fn note(&mut self, notes: &mut Notes, text: &str) {
        self.str(if notes.any { ", " } else { " (" });
        notes.any = true;
        self.str(text);
    }

    const fn end_notes(&mut self, notes: &Notes) {
        if notes.any {
            self.byte(b')');
        }
    }

    const fn flag_notes(&mut self, notes: &mut Notes, flags: FieldFlags) {
        if flags.contains(FieldFlags::DEFAULT) {
            self.note(notes, "default");
        }
        if flags.contains(FieldFlags::FLATTEN) {
            self.note(notes, "flatten");
        }
        if flags.contains(FieldFlags::SKIP_SERIALIZING) {
            self.note(notes, "skip_serializing");
        }
        if flags.contains(FieldFlags::SKIP_DESERIALIZING) {
            self.note(notes, "skip_deserializing");
        }
        if flags.contains(FieldFlags::SKIP_SERIALIZING_IF) {
            self.note(notes, "skip_serializing_if");
        }
    }

    const fn serde_note(&mut self, notes: &mut Notes, note: &str) {
        if !note.is_empty() {
            self.note(notes, "serde: ");
            self.str(note);
        }
    }

    const fn repr_notes(&mut self, notes: &mut Notes, repr: Repr) {
        match repr {
            Repr::External => {}
            Repr::Internal { tag } => {
                self.note(notes, "tag = ");
                self.quoted(tag);
            }
            Repr::Adjacent { tag, content } => {
                self.note(notes, "tag = ");
                self.quoted(tag);
                self.str(", content = ");
                self.quoted(content);
            }
            Repr::Untagged => self.note(notes, "untagged"),
        }
    }

    /// What the type itself says about how it is stored, looking through `Option` and
    /// newtype structs (which are stored as what they hold).
    const fn shape_notes(&mut self, notes: &mut Notes, shape: &Shape) {
        let mut core = shape;
        loop {
            match *core {
                Shape::Option(inner) => core = inner,
                Shape::Struct(s) if matches!(s.fields, Fields::Newtype(_)) => {
                    self.struct_notes(notes, s);
                    if let Fields::Newtype(field) = s.fields {
                        core = field.shape;
                    }
                }
                _ => break,
            }
        }
        match *core {
            Shape::Recursive(_) => self.note(notes, "recursive"),
            Shape::Opaque { with, .. } => {
                self.note(notes, "with = ");
                self.quoted(with);
            }
            Shape::Enum(e) => {
                self.repr_notes(notes, e.repr);
                self.serde_note(notes, e.note);
                if e.variants.is_empty() {
                    // Else indistinguishable from an empty struct.
                    self.note(notes, "no variants");
                }
            }
            Shape::Struct(s) => {
                match s.fields {
                    // A JSON array: else its `.0` lines read as fields named "0".
                    Fields::Tuple(_) => self.note(notes, "tuple"),
                    // Else indistinguishable from a scalar that only has a name.
                    Fields::Named([]) => self.note(notes, "no fields"),
                    _ => {}
                }
                self.struct_notes(notes, s);
            }
            _ => {}
        }
    }

    const fn struct_notes(&mut self, notes: &mut Notes, s: &Struct) {
        if let Some((tag, value)) = s.tag {
            self.note(notes, "tag ");
            self.quoted(tag);
            self.str(" = ");
            self.quoted(value);
        }
        self.serde_note(notes, s.note);
    }
}

struct Notes {
    any: bool,
}

impl Notes {
    const fn new() -> Self {
        Notes { any: false }
    }
}

/// The kind of a variant's data, as the description names it.
const fn kind(fields: Fields) -> &'static str {
    match fields {
        Fields::Unit => "unit",
        Fields::Newtype(_) => "newtype",
        Fields::Tuple(_) => "tuple",
        Fields::Named(_) => "struct",
    }
}

/// Whether a name can be written unquoted: ASCII letters, digits, `_` and `-`.
const fn plain(s: &str) -> bool {
    let bytes = s.as_bytes();
    if bytes.is_empty() {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if !(b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            return false;
        }
        i += 1;
    }
    true
}

impl WorkflowShape {
    /// The description of the workflow, computed at run time: the same text as
    /// [`Workflow::SCHEMA`](crate::Workflow::SCHEMA), which `#[derive(Workflow)]` computes at
    /// compile time. For shapes built at run time (tests, tools).
    pub fn describe(&self) -> String {
        describe_string(self)
    }
}
