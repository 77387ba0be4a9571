//! A refusal always says what changed: for random workflow shapes and one random change to
//! each (of anything the schema hash or the description covers, at any depth), two shapes
//! with different hashes have a non-empty `schema_diff`, and two with the same hash have
//! only compatible differences (type names, newtypes, order of what is not stored in order).
//!
//! Shapes are built at run time and leaked (`&'static` is what `Shape` holds); descriptions
//! come from `WorkflowShape::describe`, the same text `#[derive(Workflow)]` writes.
//! The shapes are those the derive can make: unnamed fields are named by position, and an
//! opaque (`#[serde(with)]`) shape is a field's whole shape. `PROPTEST_CASES` sets the
//! number of cases (default 512).

use loops::schema_diff;
use loops::{
    Enum, Field, FieldFlags, Fields, Repr, Shape, StateShape, Struct, Variant, WorkflowShape,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum S {
    Scalar(&'static str),
    Option(Box<S>),
    Seq(Box<S>),
    Set(Box<S>),
    Map(Box<S>, Box<S>),
    Array(Box<S>, usize),
    Tuple(Vec<S>),
    Struct {
        name: &'static str,
        tag: bool,
        fields: F,
        note: &'static str,
    },
    Enum {
        name: &'static str,
        repr: Repr,
        variants: Vec<V>,
        note: &'static str,
    },
    Opaque(&'static str),
}

#[derive(Clone, Debug)]
enum F {
    Unit,
    Newtype(Box<Fd>),
    Tuple(Vec<Fd>),
    Named(Vec<Fd>),
}

#[derive(Clone, Debug)]
struct Fd {
    name: String,
    shape: S,
    flags: u8,
    note: &'static str,
}

#[derive(Clone, Debug)]
struct V {
    name: String,
    fields: F,
    note: &'static str,
}

#[derive(Clone, Debug)]
struct St {
    name: String,
    stored: String,
    fields: F,
    initial: bool,
    terminal: bool,
    next: Vec<String>,
}

#[derive(Clone, Debug)]
struct W {
    version: u32,
    repr: Repr,
    note: &'static str,
    states: Vec<St>,
}

const SCALARS: &[&str] = &[
    "u8", "u32", "u64", "i64", "f64", "String", "bool", "()", "Value",
];
const TYPES: &[&str] = &["Issue", "Plan", "Step", "Report"];
const NOTES: &[&str] = &["", "", "", "other(a = 1)"];
const REPRS: &[Repr] = &[
    Repr::External,
    Repr::Internal { tag: "type" },
    Repr::Adjacent {
        tag: "t",
        content: "c",
    },
    Repr::Untagged,
];

fn shape() -> BoxedStrategy<S> {
    let leaf = prop::sample::select(SCALARS).prop_map(S::Scalar);
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            inner.clone().prop_map(|s| S::Option(Box::new(s))),
            inner.clone().prop_map(|s| S::Seq(Box::new(s))),
            inner.clone().prop_map(|s| S::Set(Box::new(s))),
            (inner.clone(), inner.clone()).prop_map(|(k, v)| S::Map(Box::new(k), Box::new(v))),
            (inner.clone(), 1..4usize).prop_map(|(s, n)| S::Array(Box::new(s), n)),
            prop::collection::vec(inner.clone(), 1..3).prop_map(S::Tuple),
            (
                prop::sample::select(TYPES),
                any::<bool>(),
                fields(inner.clone()),
                prop::sample::select(NOTES)
            )
                .prop_map(|(name, tag, fields, note)| S::Struct {
                    name,
                    tag,
                    fields,
                    note
                }),
            (
                prop::sample::select(TYPES),
                prop::sample::select(REPRS),
                prop::collection::vec((fields(inner), prop::sample::select(NOTES)), 0..4),
                prop::sample::select(NOTES)
            )
                .prop_map(|(name, repr, variants, note)| S::Enum {
                    name,
                    repr,
                    variants: variants
                        .into_iter()
                        .enumerate()
                        .map(|(i, (fields, note))| V {
                            name: format!("V{i}"),
                            fields,
                            note,
                        })
                        .collect(),
                    note,
                }),
        ]
    })
    .boxed()
}

fn fields(inner: BoxedStrategy<S>) -> impl Strategy<Value = F> {
    // `#[serde(with)]` applies to a field: an opaque shape is a field's whole shape.
    let opaque = prop::sample::select(&["DateTime<Utc>", "&'static str"][..]).prop_map(S::Opaque);
    let inner = prop_oneof![4 => inner, 1 => opaque];
    let field = (inner, 0u8..32, prop::sample::select(NOTES)).prop_map(|(shape, flags, note)| Fd {
        name: String::new(),
        shape,
        flags,
        note,
    });
    let named = |list: Vec<Fd>, prefix: &str| -> Vec<Fd> {
        let prefix = prefix.to_owned();
        list.into_iter()
            .enumerate()
            .map(|(i, f)| Fd {
                name: if prefix.is_empty() {
                    i.to_string()
                } else {
                    format!("{prefix}{i}")
                },
                ..f
            })
            .collect()
    };
    prop_oneof![
        Just(F::Unit),
        field
            .clone()
            .prop_map(move |f| F::Newtype(Box::new(named(vec![f], "").remove(0)))),
        prop::collection::vec(field.clone(), 0..3).prop_map(move |l| F::Tuple(named(l, ""))),
        (
            prop::collection::vec(field, 0..4),
            prop::sample::select(&["f", "x-y", "a b"][..])
        )
            .prop_map(move |(l, prefix)| F::Named(named(l, prefix))),
    ]
}

fn workflow() -> impl Strategy<Value = W> {
    (
        prop::collection::vec(fields(shape()), 2..4),
        prop::sample::select(REPRS),
        prop::sample::select(NOTES),
    )
        .prop_map(|(states, repr, note)| {
            let n = states.len();
            W {
                version: 1,
                repr,
                note,
                states: states
                    .into_iter()
                    .enumerate()
                    .map(|(i, fields)| St {
                        name: format!("S{i}"),
                        stored: format!("S{i}"),
                        fields,
                        initial: i == 0,
                        terminal: i == n - 1,
                        next: if i == n - 1 {
                            Vec::new()
                        } else {
                            vec![format!("S{}", i + 1)]
                        },
                    })
                    .collect(),
            }
        })
}

// ---- to `&'static` shapes ----

fn leak<T>(value: T) -> &'static T {
    Box::leak(Box::new(value))
}

fn text(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

fn to_shape(s: &S) -> &'static Shape {
    leak(match s {
        S::Scalar(name) => Shape::Scalar(name),
        S::Option(s) => Shape::Option(to_shape(s)),
        S::Seq(s) => Shape::Seq(to_shape(s)),
        S::Set(s) => Shape::Set(to_shape(s)),
        S::Map(k, v) => Shape::Map(to_shape(k), to_shape(v)),
        S::Array(s, n) => Shape::Array(to_shape(s), *n),
        S::Tuple(items) => Shape::Tuple(Box::leak(items.iter().map(to_shape).collect())),
        S::Struct {
            name,
            tag,
            fields,
            note,
        } => Shape::Struct(leak(Struct {
            name,
            params: &[],
            tag: tag.then_some(("kind", *name)),
            fields: to_fields(fields),
            note,
        })),
        S::Enum {
            name,
            repr,
            variants,
            note,
        } => Shape::Enum(leak(Enum {
            name,
            params: &[],
            repr: *repr,
            variants: Box::leak(variants.iter().map(to_variant).collect()),
            note,
        })),
        S::Opaque(ty) => Shape::Opaque { ty, with: "codec" },
    })
}

fn to_variant(v: &V) -> Variant {
    Variant {
        name: text(&v.name),
        fields: to_fields(&v.fields),
        note: v.note,
    }
}

fn to_fields(f: &F) -> Fields {
    match f {
        F::Unit => Fields::Unit,
        F::Newtype(f) => Fields::Newtype(leak(to_field(f))),
        F::Tuple(list) => Fields::Tuple(Box::leak(list.iter().map(to_field).collect())),
        F::Named(list) => Fields::Named(Box::leak(list.iter().map(to_field).collect())),
    }
}

fn to_field(f: &Fd) -> Field {
    let mut flags = FieldFlags::NONE;
    for (bit, flag) in [
        (1, FieldFlags::DEFAULT),
        (2, FieldFlags::FLATTEN),
        (4, FieldFlags::SKIP_SERIALIZING),
        (8, FieldFlags::SKIP_DESERIALIZING),
        (16, FieldFlags::SKIP_SERIALIZING_IF),
    ] {
        if f.flags & bit != 0 {
            flags = flags.with(flag);
        }
    }
    Field {
        name: text(&f.name),
        shape: to_shape(&f.shape),
        flags,
        note: f.note,
    }
}

fn to_workflow(w: &W) -> WorkflowShape {
    WorkflowShape {
        name: "flow",
        version: w.version,
        repr: w.repr,
        states: Box::leak(
            w.states
                .iter()
                .map(|s| StateShape {
                    name: text(&s.name),
                    variant: Variant {
                        name: text(&s.stored),
                        fields: to_fields(&s.fields),
                        note: "",
                    },
                    initial: s.initial,
                    terminal: s.terminal,
                    next: Box::leak(s.next.iter().map(|n| text(n)).collect()),
                })
                .collect(),
        ),
        note: w.note,
        events: &[],
    }
}

// ---- one change ----

/// A small deterministic random source for the choice of change.
struct Pick(u64);

impl Pick {
    fn below(&mut self, n: usize) -> usize {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n.max(1)
    }
}

/// What a change did that the diff may rightly call breaking although the hash is the same:
/// untagged variants are stored without their names and tried in order, so renaming one
/// (listed as removed and added) or swapping two with the same data changes what a stored
/// value reads as, and the diff says so.
#[derive(Default)]
struct Touched {
    untagged_names: bool,
}

fn change_fields(f: &mut F, p: &mut Pick, t: &mut Touched) {
    change_fields_once(f, p, t);
    // Unnamed fields are named by their position, as the derive names them.
    match f {
        F::Tuple(list) => {
            for (i, field) in list.iter_mut().enumerate() {
                field.name = i.to_string();
            }
        }
        F::Newtype(field) => field.name = "0".into(),
        F::Unit | F::Named(_) => {}
    }
}

fn change_fields_once(f: &mut F, p: &mut Pick, t: &mut Touched) {
    let list = match f {
        F::Unit => {
            *f = F::Named(Vec::new());
            return;
        }
        F::Newtype(field) => return change_field(field, p, t),
        F::Tuple(list) | F::Named(list) => list,
    };
    match p.below(6) {
        0 if !list.is_empty() => {
            let i = p.below(list.len());
            change_field(&mut list[i], p, t);
        }
        1 => list.push(Fd {
            name: "added".into(),
            shape: S::Scalar("u8"),
            flags: if p.below(2) == 0 { 1 } else { 0 },
            note: "",
        }),
        2 if !list.is_empty() => {
            list.remove(p.below(list.len()));
        }
        3 => list.reverse(),
        4 => {
            let taken = std::mem::take(list);
            *f = match f {
                F::Tuple(_) => F::Named(taken),
                _ => F::Tuple(taken),
            };
        }
        _ if !list.is_empty() => {
            let i = p.below(list.len());
            change_field(&mut list[i], p, t);
        }
        _ => *f = F::Unit,
    }
}

fn change_field(f: &mut Fd, p: &mut Pick, t: &mut Touched) {
    match p.below(5) {
        0 => f.name.push_str("_renamed"),
        1 => f.flags ^= 1 << p.below(5),
        2 => f.note = if f.note.is_empty() { "other(b)" } else { "" },
        _ => change_shape(&mut f.shape, p, t),
    }
}

fn change_shape(s: &mut S, p: &mut Pick, t: &mut Touched) {
    // Go deeper, or change this node.
    if p.below(3) != 0 {
        match s {
            S::Option(inner) | S::Seq(inner) | S::Set(inner) | S::Array(inner, _) => {
                return change_shape(inner, p, t);
            }
            S::Map(k, v) => return change_shape(if p.below(2) == 0 { k } else { v }, p, t),
            S::Tuple(items) => {
                let i = p.below(items.len());
                return change_shape(&mut items[i], p, t);
            }
            S::Struct { fields, .. } => return change_fields(fields, p, t),
            S::Enum { variants, repr, .. } if !variants.is_empty() => {
                if *repr == Repr::Untagged {
                    t.untagged_names = true;
                }
                let i = p.below(variants.len());
                return change_fields(&mut variants[i].fields, p, t);
            }
            _ => {}
        }
    }
    if let S::Opaque(ty) = s {
        *ty = if *ty == "String" { "u8" } else { "String" };
        return;
    }
    let old = std::mem::replace(s, S::Scalar("u8"));
    *s = match (p.below(8), old) {
        (0, old) => S::Option(Box::new(old)),
        // A newtype struct: stored as what it holds, so the hash stays.
        (1, old) => S::Struct {
            name: "Wrapper",
            tag: false,
            fields: F::Newtype(Box::new(Fd {
                name: "0".into(),
                shape: old,
                flags: 0,
                note: "",
            })),
            note: "",
        },
        (2, S::Option(inner)) => *inner,
        (2, S::Seq(inner)) => S::Set(inner),
        (2, S::Set(inner)) => S::Seq(inner),
        (2, S::Array(inner, n)) => S::Array(inner, n + 1),
        (
            3,
            S::Struct {
                name,
                tag,
                fields,
                note,
            },
        ) => S::Struct {
            name: if name == "Renamed" {
                "Other"
            } else {
                "Renamed"
            },
            tag: tag ^ (p.below(2) == 0),
            fields,
            note,
        },
        (
            4,
            S::Enum {
                name,
                repr,
                mut variants,
                note,
            },
        ) => {
            if repr == Repr::Untagged {
                t.untagged_names = true;
            }
            match p.below(5) {
                0 => variants.reverse(),
                1 => variants.insert(
                    p.below(variants.len() + 1),
                    V {
                        name: "New".into(),
                        fields: F::Unit,
                        note: "",
                    },
                ),
                2 if !variants.is_empty() => {
                    variants.remove(p.below(variants.len()));
                }
                3 if !variants.is_empty() => {
                    let i = p.below(variants.len());
                    variants[i].name.push_str("_renamed");
                }
                _ if !variants.is_empty() => {
                    let i = p.below(variants.len());
                    variants[i].note = if variants[i].note.is_empty() {
                        "other"
                    } else {
                        ""
                    };
                }
                _ => {}
            }
            let repr = if p.below(3) == 0 {
                REPRS[p.below(REPRS.len())]
            } else {
                repr
            };
            S::Enum {
                name,
                repr,
                variants,
                note,
            }
        }
        (5, S::Tuple(mut items)) => {
            items.reverse();
            S::Tuple(items)
        }
        (_, old) => {
            let other = SCALARS[p.below(SCALARS.len())];
            match old {
                S::Scalar(name) if name == other => S::Scalar("i8"),
                _ => S::Scalar(other),
            }
        }
    };
}

fn change_workflow(w: &mut W, p: &mut Pick, t: &mut Touched) {
    let i = p.below(w.states.len());
    match p.below(12) {
        0 => w.version += 1,
        1 => w.repr = REPRS[p.below(REPRS.len())],
        2 => w.note = if w.note.is_empty() { "other" } else { "" },
        3 => {
            if w.repr == Repr::Untagged {
                t.untagged_names = true;
            }
            w.states.reverse();
        }
        4 => w.states[i].name.push_str("_renamed"),
        5 => w.states[i].stored.push_str("_stored"),
        6 => w.states[i].terminal ^= true,
        7 => w.states[i].initial ^= true,
        8 => w.states[i].next.push("S0".into()),
        9 => {
            w.states[i].next.pop();
        }
        10 => w.states.push(St {
            name: "Extra".into(),
            stored: "Extra".into(),
            fields: F::Unit,
            initial: false,
            terminal: true,
            next: Vec::new(),
        }),
        _ => change_fields(&mut w.states[i].fields, p, t),
    }
}

fn untagged_anywhere(w: &W) -> bool {
    fn in_shape(s: &S) -> bool {
        match s {
            S::Option(s) | S::Seq(s) | S::Set(s) | S::Array(s, _) => in_shape(s),
            S::Map(k, v) => in_shape(k) || in_shape(v),
            S::Tuple(items) => items.iter().any(in_shape),
            S::Struct { fields, .. } => in_fields(fields),
            S::Enum { repr, variants, .. } => {
                *repr == Repr::Untagged || variants.iter().any(|v| in_fields(&v.fields))
            }
            S::Scalar(_) | S::Opaque(_) => false,
        }
    }
    fn in_fields(f: &F) -> bool {
        match f {
            F::Unit => false,
            F::Newtype(f) => in_shape(&f.shape),
            F::Tuple(l) | F::Named(l) => l.iter().any(|f| in_shape(&f.shape)),
        }
    }
    w.repr == Repr::Untagged || w.states.iter().any(|s| in_fields(&s.fields))
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(512)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn different_hashes_always_have_a_change(w in workflow(), seed in any::<u64>()) {
        let mut changed = w.clone();
        let mut touched = Touched::default();
        change_workflow(&mut changed, &mut Pick(seed | 1), &mut touched);
        let (a, b) = (to_workflow(&w), to_workflow(&changed));
        let (old, new) = (a.describe(), b.describe());
        let diff = schema_diff(&old, &new);
        if a.hash() != b.hash() {
            prop_assert!(!diff.is_empty(), "hashes differ, no change:\n{old}\n---\n{new}");
        } else if !(touched.untagged_names && untagged_anywhere(&w)) {
            prop_assert!(
                diff.is_compatible(|_| true),
                "same hash, breaking: {diff}\n{old}\n---\n{new}"
            );
        }
        // The diff of a description with itself is empty.
        prop_assert!(schema_diff(&new, &new).is_empty());
    }
}
