//! Schema hashes: the compile-time fingerprint of a workflow's stored shape, and the
//! [`Schema`] trait through which it reaches the types nested in the states.
//!
//! A run's records are JSON (`serde_json`). Whether records written by one build can be read
//! by another depends on the *stored form* of the workflow: state names, field names, field
//! types and everything nested in them, and the serde attributes that change how they are
//! written. `#[derive(Workflow)]` describes that form as a [`WorkflowShape`] — each field's
//! type through its [`Schema`] impl, so a field added to a struct three levels down is
//! seen — and computes at compile time:
//! - [`Workflow::SCHEMA_HASH`](crate::Workflow::SCHEMA_HASH), a [`SchemaHash`] of the shape;
//! - [`Workflow::SCHEMA`](crate::Workflow::SCHEMA), a line-per-field text of the same shape,
//!   which the runtime stores once per hash so that [`schema_diff`] can later say what
//!   changed, and whether each change is compatible with the records already stored
//!   ([`SchemaDiff`], [`Change`], [`Class`]).
//!
//! The hash is computed by `const fn`s from names and structure only (no `TypeId`, no
//! `type_name`), so it is the same in every build, on every platform and with every
//! compiler. It ignores what does not change the stored form: doc comments, formatting,
//! type names and paths (`Vec` or `std::vec::Vec`, aliases, renamed structs), and the order
//! of struct fields, enum variants and states (JSON objects are unordered). The changes that
//! alter it are listed in the documentation of `#[derive(Workflow)]`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Version of loops' on-disk record format, folded into every stored schema hash
/// ([`SchemaHash::pinned`]): a build with another format refuses old runs instead of
/// misreading them.
pub const FORMAT_VERSION: u32 = 1;

/// A 64-bit fingerprint of everything that decides how a workflow's records decode.
///
/// `#[derive(Workflow)]` computes it at compile time from the enum's shape (variants,
/// fields and their types, transitions, `version`), and the runtime folds in
/// [`FORMAT_VERSION`] before storing it with every record
/// (see [`SchemaHash::pinned`]). A run whose stored hash differs from the compiled one is
/// refused with [`Error::SchemaMismatch`](crate::Error::SchemaMismatch).
///
/// The hash function is XXH3-64 (the `xxhash-rust` crate), which is stable across builds,
/// platforms and compiler versions. Displayed and parsed as 16 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SchemaHash(u64);

impl SchemaHash {
    /// Wraps a raw 64-bit value.
    pub const fn from_u64(value: u64) -> Self {
        SchemaHash(value)
    }

    /// The raw 64-bit value.
    pub const fn to_u64(self) -> u64 {
        self.0
    }

    /// Hashes `bytes` with XXH3-64; usable in `const` context.
    pub const fn of(bytes: &[u8]) -> Self {
        SchemaHash(xxhash_rust::const_xxh3::xxh3_64(bytes))
    }

    /// Combines this hash with `other`, order-sensitively; usable in `const` context.
    ///
    /// `a.combine(b)` is the XXH3-64 of the 16 little-endian bytes of `a` then `b`.
    pub const fn combine(self, other: SchemaHash) -> Self {
        let a = self.0.to_le_bytes();
        let b = other.0.to_le_bytes();
        let mut buf = [0u8; 16];
        let mut i = 0;
        while i < 8 {
            buf[i] = a[i];
            buf[i + 8] = b[i];
            i += 1;
        }
        SchemaHash::of(&buf)
    }

    /// The hash stored with every record: this workflow hash with loops' own
    /// [`FORMAT_VERSION`] folded in, so that a change of the
    /// on-disk format is refused exactly like a change of the workflow.
    pub const fn pinned(self) -> Self {
        SchemaHash::from_u64(FORMAT_VERSION as u64).combine(self)
    }
}

mod describe;
mod diff;
mod events;
mod hash;
mod impls;

#[cfg(feature = "testing")]
pub(crate) use diff::described_states;
pub(crate) use diff::described_version;
pub use diff::{Change, Class, SchemaDiff, schema_diff};
pub(crate) use events::duplicate_key;
pub use events::{DeclaredEvent, DeclaredEvents, EventRefusal};

/// The `const fn`s that write a description at compile time, for the code
/// `#[derive(Workflow)]` generates.
pub(crate) mod __describe {
    pub use super::describe::{describe, describe_len, utf8};
}

/// A type whose stored (JSON) form loops can describe at compile time, so that the schema
/// hash of a workflow sees into the types nested in its states.
///
/// Derive it with `#[derive(Schema)]` (re-exported by `loops`) on the structs and enums
/// used in workflow states; loops implements it for the standard types (integers, floats,
/// `bool`, `char`, strings, `Option`, `Vec` and other sequences, sets, maps, tuples, arrays,
/// `Box`/`Rc`/`Arc`/`Cow`, `Duration`, `SystemTime`, IP addresses, `Result`) and for
/// `serde_json::Value`, and, behind the features of the same name, for `uuid::Uuid` and
/// `chrono`'s date and time types.
///
/// A hand-written impl describes what serde writes, not the Rust type. For example a type
/// with a custom `Serialize` that writes a string:
///
/// ```
/// use loops_core::{Schema, Shape};
///
/// struct Version(u16, u16);
///
/// impl Schema for Version {
///     // Serialized as "1.2": a string.
///     const SHAPE: &'static Shape = &Shape::Scalar("String");
/// }
/// ```
///
/// For a type from another crate (which neither crate can implement `Schema` for), describe
/// the field instead: `#[schema(as = String)] url: Url`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not implement `loops::Schema`, so the schema hash cannot see its stored form",
    label = "`{Self}` has no `Schema` impl",
    note = "derive it next to `Serialize`: `#[derive(loops::Schema)]`",
    note = "for a type from another crate, describe the field as the type it is stored as: `#[schema(as = String)]`"
)]
pub trait Schema {
    /// The stored form of `Self`.
    const SHAPE: &'static Shape;
}

/// The stored form of a type, as serde writes it to JSON: the data model `Schema` impls
/// describe and the schema hash is computed from.
///
/// Names given to types (`Struct::name`, `Enum::name`) are shown in descriptions but not
/// hashed; names that are stored (fields, variants, states, tags) are hashed.
#[derive(Debug, Clone, Copy)]
pub enum Shape {
    /// A value written as one JSON scalar, named by its kind: `"bool"`, `"u8"` to `"u128"`,
    /// `"i8"` to `"i128"`, `"usize"`, `"isize"`, `"f32"`, `"f64"`, `"char"`, `"String"`,
    /// `"()"` (null), `"Value"` (any JSON), or a domain name such as `"Uuid"`. Two types
    /// with the same name are stored the same way.
    Scalar(&'static str),
    /// `Option<T>`: null or the value.
    Option(&'static Shape),
    /// A sequence (`Vec`, `VecDeque`, slices...): a JSON array.
    Seq(&'static Shape),
    /// A set (`HashSet`, `BTreeSet`): a JSON array without duplicates.
    Set(&'static Shape),
    /// A map (`HashMap`, `BTreeMap`): a JSON object, keys then values.
    Map(&'static Shape, &'static Shape),
    /// An array `[T; N]`: a JSON array of exactly `N` values.
    Array(&'static Shape, usize),
    /// A tuple: a JSON array, one value per element, in order.
    Tuple(&'static [&'static Shape]),
    /// A struct.
    Struct(&'static Struct),
    /// An enum.
    Enum(&'static Enum),
    /// A reference back to the enclosing type of this name (`Struct::name` or
    /// `Enum::name`): how a recursive type refers to itself without an infinite shape.
    /// `#[derive(Schema)]` emits it for a type's own name inside its fields.
    Recursive(&'static str),
    /// A value whose stored form is decided by code the schema cannot see
    /// (`#[serde(with = "...")]`): described by the field's type as written and the
    /// serializer's path, and hashed by both.
    Opaque {
        /// The Rust type as written, normalized (`DateTime<Utc>`).
        ty: &'static str,
        /// The `with`, `serialize_with` or `deserialize_with` path.
        with: &'static str,
    },
}

/// A struct (or the data of a struct-like enum variant).
#[derive(Debug, Clone, Copy)]
pub struct Struct {
    /// The Rust name, for descriptions (not hashed).
    pub name: &'static str,
    /// The generic arguments, for descriptions (`Page<Issue>`); what they change in the
    /// stored form is in the fields.
    pub params: &'static [&'static Shape],
    /// `#[serde(tag = "...")]` on a struct: the tag key and the value written under it.
    pub tag: Option<(&'static str, &'static str)>,
    /// The fields. A newtype struct (`Fields::Newtype`) is stored as its field, a unit
    /// struct (`Fields::Unit`) as null.
    pub fields: Fields,
    /// Serde attributes that may change the stored form but that the schema does not
    /// model, as written (hashed as text); empty if none.
    pub note: &'static str,
}

/// The fields of a struct, an enum variant or a workflow state.
#[derive(Debug, Clone, Copy)]
pub enum Fields {
    /// No fields.
    Unit,
    /// One unnamed field (`Id(u64)`): stored as that field's value.
    Newtype(&'static Field),
    /// Two or more unnamed fields: a JSON array. Their names are `"0"`, `"1"`, ...
    Tuple(&'static [Field]),
    /// Named fields: a JSON object. Their names are the stored keys (after `rename`).
    Named(&'static [Field]),
}

/// One field.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The stored key (after `#[serde(rename)]` and `rename_all`), or the position of an
    /// unnamed field (`"0"`).
    pub name: &'static str,
    /// The stored form of the field's value.
    pub shape: &'static Shape,
    /// The serde attributes of the field that change how it is stored.
    pub flags: FieldFlags,
    /// Serde attributes that may change the stored form but that the schema does not
    /// model, as written (hashed as text); empty if none.
    pub note: &'static str,
}

impl Field {
    /// A field with no flags and no note.
    pub const fn new(name: &'static str, shape: &'static Shape) -> Self {
        Field {
            name,
            shape,
            flags: FieldFlags::NONE,
            note: "",
        }
    }
}

/// Serde field attributes that change how a field is stored or read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FieldFlags(u8);

impl FieldFlags {
    /// No attribute.
    pub const NONE: Self = FieldFlags(0);
    /// `#[serde(default)]` (on the field or its container): may be missing when read.
    pub const DEFAULT: Self = FieldFlags(1);
    /// `#[serde(flatten)]`: the value's keys are stored in the enclosing object. A flattened
    /// struct with named fields is described (and hashed) as if its fields were written in
    /// the enclosing struct.
    pub const FLATTEN: Self = FieldFlags(2);
    /// `#[serde(skip_serializing)]`: never written.
    pub const SKIP_SERIALIZING: Self = FieldFlags(4);
    /// `#[serde(skip_deserializing)]`: never read.
    pub const SKIP_DESERIALIZING: Self = FieldFlags(8);
    /// `#[serde(skip_serializing_if = "...")]`: sometimes not written.
    pub const SKIP_SERIALIZING_IF: Self = FieldFlags(16);

    /// Both sets of flags.
    pub const fn with(self, other: FieldFlags) -> Self {
        FieldFlags(self.0 | other.0)
    }

    /// Whether all of `other`'s flags are set.
    pub const fn contains(self, other: FieldFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bits (as hashed).
    pub const fn bits(self) -> u8 {
        self.0
    }
}

/// An enum.
#[derive(Debug, Clone, Copy)]
pub struct Enum {
    /// The Rust name, for descriptions (not hashed).
    pub name: &'static str,
    /// The generic arguments, for descriptions.
    pub params: &'static [&'static Shape],
    /// How the variant is stored.
    pub repr: Repr,
    /// The variants that can be stored (without `#[serde(skip)]` ones).
    pub variants: &'static [Variant],
    /// Serde attributes that may change the stored form but that the schema does not
    /// model, as written; empty if none.
    pub note: &'static str,
}

/// How an enum stores which variant a value is: serde's enum representations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    /// `{"Variant": data}`, or `"Variant"` for a unit variant (serde's default).
    External,
    /// `#[serde(tag = "t")]`: `{"t": "Variant", ...data}`.
    Internal {
        /// The tag key.
        tag: &'static str,
    },
    /// `#[serde(tag = "t", content = "c")]`: `{"t": "Variant", "c": data}`.
    Adjacent {
        /// The tag key.
        tag: &'static str,
        /// The content key.
        content: &'static str,
    },
    /// `#[serde(untagged)]`: the data alone; reading tries the variants in order.
    Untagged,
}

/// An enum variant.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    /// The stored name (after `rename` and `rename_all`).
    pub name: &'static str,
    /// The variant's data.
    pub fields: Fields,
    /// Serde attributes that may change the stored form but that the schema does not
    /// model, as written; empty if none.
    pub note: &'static str,
}

/// The stored form of a whole workflow, as `#[derive(Workflow)]` describes it; hashed into
/// [`Workflow::SCHEMA_HASH`](crate::Workflow::SCHEMA_HASH) and described into
/// [`Workflow::SCHEMA`](crate::Workflow::SCHEMA).
#[derive(Debug, Clone, Copy)]
pub struct WorkflowShape {
    /// The workflow's name (`Workflow::NAME`).
    pub name: &'static str,
    /// The declared version (`Workflow::VERSION`).
    pub version: u32,
    /// How the enum's variant is stored (`#[serde(tag = ...)]` on the workflow enum).
    pub repr: Repr,
    /// The states, in declaration order (the hash does not depend on the order).
    pub states: &'static [StateShape],
    /// Serde attributes of the enum that may change the stored form but that the schema
    /// does not model, as written; empty if none.
    pub note: &'static str,
    /// The events its states wait for (`#[event(name: Type)]`), in declaration order (the
    /// hash does not depend on the order). A workflow that declares none hashes as it did
    /// before events were described.
    pub events: &'static [EventShape],
}

/// An event a workflow declares (`#[event(approve: Approval)]`): its name and the stored form
/// of its payload.
#[derive(Debug, Clone, Copy)]
pub struct EventShape {
    /// The event's name, as `Runtime::send` and `Context::wait_for` take it.
    pub name: &'static str,
    /// The payload's stored form.
    pub payload: &'static Shape,
}

/// One state of a workflow: a variant of the workflow enum, and its transitions.
#[derive(Debug, Clone, Copy)]
pub struct StateShape {
    /// The state's name (`StateId::name`, the variant as written in Rust).
    pub name: &'static str,
    /// The variant as stored (its `name` is the serde name) with its data.
    pub variant: Variant,
    /// Whether runs start in this state.
    pub initial: bool,
    /// Whether the state ends runs.
    pub terminal: bool,
    /// The states it may move to (`#[next(...)]`), by name.
    pub next: &'static [&'static str],
}

impl SchemaHash {
    /// The 16 lowercase hex digits, most significant first, without the formatting
    /// machinery or an allocation: every record's schema is written and read as them.
    fn hex(self) -> [u8; 16] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 16];
        for (i, digit) in out.iter_mut().enumerate() {
            // The nibble `i` from the top: the shift is at most 60.
            let nibble = (self.0 >> (60 - 4 * i)) & 0xf;
            *digit = DIGITS[nibble as usize];
        }
        out
    }
}

impl fmt::Display for SchemaHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.hex();
        // ASCII digits: always UTF-8.
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

/// Serialized as its 16 lowercase hex digits, a string.
impl Serialize for SchemaHash {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let hex = self.hex();
        let text = std::str::from_utf8(&hex).map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(text)
    }
}

/// Deserialized from a string of 16 hex digits (either case), without allocating.
impl<'de> Deserialize<'de> for SchemaHash {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Hex;
        impl serde::de::Visitor<'_> for Hex {
            type Value = SchemaHash;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a schema hash of 16 hex digits")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<SchemaHash, E> {
                text.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Hex)
    }
}

impl fmt::Debug for SchemaHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SchemaHash({:016x})", self.0)
    }
}

/// The text was not 16 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid schema hash {0:?}: expected 16 hex digits")]
pub struct ParseSchemaHashError(pub String);

impl FromStr for SchemaHash {
    type Err = ParseSchemaHashError;

    /// Parses 16 hex digits (either case), as printed by `Display`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ParseSchemaHashError(s.to_owned()));
        }
        u64::from_str_radix(s, 16)
            .map(SchemaHash)
            .map_err(|_| ParseSchemaHashError(s.to_owned()))
    }
}

impl From<SchemaHash> for String {
    fn from(h: SchemaHash) -> String {
        h.to_string()
    }
}

impl TryFrom<String> for SchemaHash {
    type Error = ParseSchemaHashError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialized_as_its_hex_digits() {
        for value in [0, 1, 0x00ab_cdef_0123_4567, u64::MAX] {
            let h = SchemaHash::from_u64(value);
            let json = serde_json::to_string(&h).unwrap();
            assert_eq!(json, format!("\"{value:016x}\""));
            assert_eq!(h.to_string(), format!("{value:016x}"));
            assert_eq!(serde_json::from_str::<SchemaHash>(&json).unwrap(), h);
        }
        let upper: SchemaHash = serde_json::from_str("\"00ABCDEF01234567\"").unwrap();
        assert_eq!(upper, SchemaHash::from_u64(0x00ab_cdef_0123_4567));
        let short = serde_json::from_str::<SchemaHash>("\"abc\"").unwrap_err();
        assert_eq!(
            short.to_string(),
            "invalid schema hash \"abc\": expected 16 hex digits at line 1 column 5"
        );
        let number = serde_json::from_str::<SchemaHash>("12").unwrap_err();
        assert!(
            number
                .to_string()
                .contains("a schema hash of 16 hex digits"),
            "{number}"
        );
    }

    #[test]
    fn display_parse_round_trip() {
        let h = SchemaHash::from_u64(0x00ab_cdef_0123_4567);
        assert_eq!(h.to_string(), "00abcdef01234567");
        assert_eq!("00ABCDEF01234567".parse::<SchemaHash>(), Ok(h));
        assert!("xyz".parse::<SchemaHash>().is_err());
        assert!("00abcdef0123456".parse::<SchemaHash>().is_err());
    }

    #[test]
    fn hash_is_stable_and_const() {
        const H: SchemaHash = SchemaHash::of(b"loops");
        // XXH3-64 of "loops" with seed 0; a change here would strand every stored run.
        assert_eq!(H, SchemaHash::of(b"loops"));
        assert_eq!(
            H.to_u64(),
            xxhash_rust::xxh3::xxh3_64(b"loops"),
            "const and runtime XXH3 agree"
        );
        assert_ne!(
            H.combine(SchemaHash::of(b"a")),
            SchemaHash::of(b"a").combine(H)
        );
        assert_ne!(H.pinned(), H);
    }
}

#[cfg(test)]
mod shape_tests {
    use super::describe::{describe, describe_len, utf8};
    use super::*;

    const ISSUE: Shape = Shape::Struct(&Struct {
        name: "Issue",
        params: &[],
        tag: None,
        fields: Fields::Named(&[
            Field::new("number", u64::SHAPE),
            Field::new("labels", <Vec<String>>::SHAPE),
        ]),
        note: "",
    });

    const FLOW: WorkflowShape = WorkflowShape {
        name: "deliver",
        version: 1,
        repr: Repr::External,
        states: &[
            StateShape {
                name: "Received",
                variant: Variant {
                    name: "Received",
                    fields: Fields::Named(&[Field::new("issue", &ISSUE)]),
                    note: "",
                },
                initial: true,
                terminal: false,
                next: &["Done"],
            },
            StateShape {
                name: "Done",
                variant: Variant {
                    name: "Done",
                    fields: Fields::Unit,
                    note: "",
                },
                initial: false,
                terminal: true,
                next: &[],
            },
        ],
        note: "",
        events: &[],
    };

    const LEN: usize = describe_len(&FLOW);
    const TEXT: [u8; LEN] = describe(&FLOW);

    #[test]
    fn a_hand_built_workflow_hashes_and_describes_at_compile_time() {
        const HASH: SchemaHash = FLOW.hash();
        // Pinned: the hash function must never change by accident (it would strand every
        // stored run).
        assert_eq!(HASH.to_string(), "1314c21d0bdb5c0b");
        assert_eq!(
            utf8(&TEXT),
            "workflow deliver version 1 format 1\n\
             state Received (struct, initial) -> Done\n  \
               issue: Issue\n  \
               issue.number: u64\n  \
               issue.labels: Vec<String>\n\
             state Done (unit, terminal)\n"
        );
        assert_eq!(
            FLOW.describe(),
            utf8(&TEXT),
            "run time and compile time agree"
        );
    }

    #[test]
    fn transparent_types_hash_as_what_they_hold() {
        assert_eq!(<Box<u64>>::SHAPE.hash(), u64::SHAPE.hash());
        assert_eq!(<std::rc::Rc<str>>::SHAPE.hash(), String::SHAPE.hash());
        assert_eq!(
            <std::borrow::Cow<'_, str>>::SHAPE.hash(),
            String::SHAPE.hash()
        );
        assert_eq!(
            <std::collections::VecDeque<u8>>::SHAPE.hash(),
            <Vec<u8>>::SHAPE.hash()
        );
        const NEWTYPE: Shape = Shape::Struct(&Struct {
            name: "Id",
            params: &[],
            tag: None,
            fields: Fields::Newtype(&Field::new("0", u64::SHAPE)),
            note: "",
        });
        assert_eq!(NEWTYPE.hash(), u64::SHAPE.hash());
        assert_ne!(
            <Vec<u8>>::SHAPE.hash(),
            <std::collections::BTreeSet<u8>>::SHAPE.hash()
        );
        assert_ne!(<[u8; 4]>::SHAPE.hash(), <[u8; 5]>::SHAPE.hash());
        assert_ne!(<(u8, u16)>::SHAPE.hash(), <(u16, u8)>::SHAPE.hash());
    }

    /// 25 nested options: deeper than the hash and the description follow.
    type Deep = Deep20<Deep5<u8>>;

    /// 20 nested options around `T`.
    type Deep20<T> = Option<Option<Option<Option<Option<Deep15<T>>>>>>;
    type Deep15<T> = Option<Option<Option<Option<Option<Deep10<T>>>>>>;
    type Deep10<T> = Option<Option<Option<Option<Option<Deep5<T>>>>>>;
    type Deep5<T> = Option<Option<Option<Option<Option<T>>>>>;

    #[test]
    fn too_deep_shapes_are_cut_off_not_a_compile_error() {
        const DEEP: WorkflowShape = WorkflowShape {
            name: "deep",
            version: 1,
            repr: Repr::External,
            states: &[StateShape {
                name: "Only",
                variant: Variant {
                    name: "Only",
                    fields: Fields::Named(&[Field::new("x", Deep::SHAPE)]),
                    note: "",
                },
                initial: true,
                terminal: true,
                next: &[],
            }],
            note: "",
            events: &[],
        };
        const HASH: SchemaHash = DEEP.hash();
        const LEN: usize = describe_len(&DEEP);
        const TEXT: [u8; LEN] = describe(&DEEP);
        assert_ne!(HASH, FLOW.hash());
        let text = utf8(&TEXT);
        assert!(
            text.starts_with("workflow deep version 1 format 1\nstate Only"),
            "{text}"
        );
        assert!(text.contains("x: Option<Option<"), "{text}");
        // The limit: below 20 levels, the hash no longer sees the type.
        assert_eq!(Deep::SHAPE.hash(), <Deep20<u16>>::SHAPE.hash());
    }

    /// A struct with one named field: every level costs the most const-eval stack frames.
    #[derive(loops_derive::Schema)]
    #[schema(crate = crate)]
    struct Nest<T> {
        #[allow(dead_code)] // only its shape is used
        x: T,
    }

    type Nest5<T> = Nest<Nest<Nest<Nest<Nest<T>>>>>;
    type Nest24<T> = Nest5<Nest5<Nest5<Nest5<Nest<Nest<Nest<Nest<T>>>>>>>>;

    #[test]
    fn deeply_nested_structs_stay_within_the_compilers_limits() {
        const DEEP: WorkflowShape = WorkflowShape {
            name: "nested",
            version: 1,
            repr: Repr::External,
            states: &[StateShape {
                name: "Only",
                variant: Variant {
                    name: "Only",
                    fields: Fields::Named(&[Field::new("n", <Nest24<u8>>::SHAPE)]),
                    note: "",
                },
                initial: true,
                terminal: true,
                next: &[],
            }],
            note: "",
            events: &[],
        };
        const HASH: SchemaHash = DEEP.hash();
        const LEN: usize = describe_len(&DEEP);
        const TEXT: [u8; LEN] = describe(&DEEP);
        let text = utf8(&TEXT);
        assert!(
            text.contains("  n.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x: Nest<"),
            "{text}"
        );
        assert!(text.contains(": ... (too deep to describe)"), "{text}");
        assert_ne!(HASH, FLOW.hash());
    }

    #[cfg(feature = "uuid")]
    #[test]
    fn uuid_is_a_string_of_its_own() {
        assert!(matches!(uuid::Uuid::SHAPE, Shape::Scalar("Uuid")));
    }

    #[cfg(feature = "chrono")]
    #[test]
    fn chrono_dates_are_strings_of_their_own() {
        assert_eq!(
            <chrono::DateTime<chrono::Utc>>::SHAPE.hash(),
            <chrono::DateTime<chrono::FixedOffset>>::SHAPE.hash()
        );
        assert!(matches!(
            chrono::NaiveDate::SHAPE,
            Shape::Scalar("NaiveDate")
        ));
    }
}
