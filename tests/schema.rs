//! The deep schema hash: one module per kind of change to the types stored in a state,
//! each compared with `base`. "Unchanged" cases also check that what one writes, the other
//! reads.

use loops::{Schema, SchemaHash, Workflow};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A module holding the payload types given and a two-state workflow storing a `Data`.
macro_rules! flow {
    ($name:ident { $($payload:item)* }) => {
        #[allow(dead_code)]
        pub mod $name {
            use super::*;

            $($payload)*

            #[derive(Workflow, Serialize, Deserialize)]
            pub enum Flow {
                #[initial]
                #[next(Done)]
                Start { data: Data },
                #[terminal]
                Done,
            }
        }
    };
}

flow!(base {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

fn hash<W: Workflow>() -> SchemaHash {
    W::SCHEMA_HASH
}

/// `A`'s default value, written to JSON, reads back as a `B`.
fn reads_as<A: Serialize + Default, B: DeserializeOwned>() {
    let json = serde_json::to_string(&A::default()).unwrap();
    if let Err(e) = serde_json::from_str::<B>(&json) {
        panic!("{json} does not read back: {e}");
    }
}

macro_rules! unchanged {
    ($test:ident, $name:ident { $($payload:item)* }) => {
        flow!($name { $($payload)* });

        #[test]
        fn $test() {
            assert_eq!(hash::<$name::Flow>(), hash::<base::Flow>(), "{}", $name::Flow::SCHEMA);
            // What the description shows beyond the hash (type names) is compatible.
            let diff = loops::schema_diff(base::Flow::SCHEMA, $name::Flow::SCHEMA);
            assert!(diff.is_compatible(|_| true), "{diff}");
            reads_as::<base::Data, $name::Data>();
            reads_as::<$name::Data, base::Data>();
        }
    };
}

macro_rules! changed {
    ($test:ident, $name:ident { $($payload:item)* }) => {
        flow!($name { $($payload)* });

        #[test]
        fn $test() {
            assert_ne!(hash::<$name::Flow>(), hash::<base::Flow>(), "{}", $name::Flow::SCHEMA);
            assert_ne!($name::Flow::SCHEMA, base::Flow::SCHEMA);
            // A refusal always says what changed.
            let diff = loops::schema_diff(base::Flow::SCHEMA, $name::Flow::SCHEMA);
            assert!(!diff.is_empty(), "{}", $name::Flow::SCHEMA);
        }
    };
}

// ---- What does not change the stored form does not change the hash. ----

unchanged!(docs_and_formatting, docs {
    /// The data.
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data {
        /// Its id.
        pub id:    u64,
        pub title: String,
        pub inner: Inner,
    }
    /// Inner.
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, /** Deep. */ pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { /// A.
        #[default] A, B(u8), C { x: i64 } }
});

unchanged!(field_and_variant_order, order {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub inner: Inner, pub title: String, pub id: u64 }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub deep: Deep, pub tags: Vec<String> }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub kind: Kind, pub count: u32 }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { C { x: i64 }, #[default] A, B(u8) }
});

unchanged!(paths_aliases_and_type_names, paths {
    pub type Tags = std::vec::Vec<std::string::String>;
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: core::primitive::u64, pub title: String, pub inner: Middle }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Middle { pub tags: Tags, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: self::Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

unchanged!(equivalent_containers_and_newtypes, containers {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Id(u64);
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: Id, pub title: Box<str>, pub inner: Box<Inner> }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: std::collections::VecDeque<String>, pub deep: Box<Deep> }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

unchanged!(renamed_field_with_the_same_stored_name, same_stored_name {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, #[serde(rename = "title")] pub heading: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    #[serde(rename_all = "snake_case")]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, #[serde(rename = "B")] Bee(u8), C { x: i64 } }
});

unchanged!(flattened_struct_is_the_same_object, flattened {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, #[serde(flatten)] pub rest: Rest }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Rest { pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

/// A type without a `Schema` impl (as if from another crate), stored as a string.
#[derive(Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct Foreign(String);

unchanged!(described_as_what_it_is_stored_as, described_as {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, #[schema(as = String)] pub title: super::Foreign, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<Tag>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    #[serde(transparent)]
    pub struct Tag { pub text: String }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

// ---- What changes the stored form changes the hash. ----

changed!(field_added_three_levels_down, deep_field_added {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind, pub extra: bool }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(field_removed, field_removed {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(nested_field_type, nested_type {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u64, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(field_renamed, field_renamed {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub total: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(serde_rename, serde_rename {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { #[serde(rename = "n")] pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(serde_rename_all, serde_rename_all {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    #[serde(rename_all = "snake_case")]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(serde_skip, serde_skip {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, #[serde(skip)] pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(serde_default, serde_default {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, #[serde(default)] pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(serde_tag, serde_tag {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    #[serde(tag = "type", content = "value")]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(serde_untagged, serde_untagged {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    #[serde(untagged)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(serde_flatten_of_a_map, serde_flatten_map {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data {
        pub id: u64,
        pub title: String,
        pub inner: Inner,
        #[serde(flatten)]
        pub other: std::collections::BTreeMap<String, serde_json::Value>,
    }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

/// Writes a `u32` as a string.
pub mod as_string {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&value.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

changed!(serde_with, serde_with {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { #[serde(with = "super::as_string")] pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(variant_added, variant_added {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 }, D }
});

changed!(option_wrapped, option_wrapped {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: Option<String>, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(sequence_became_a_set, sequence_to_set {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: std::collections::BTreeSet<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8), C { x: i64 } }
});

changed!(variant_kind, variant_kind {
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Data { pub id: u64, pub title: String, pub inner: Inner }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Inner { pub tags: Vec<String>, pub deep: Deep }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub struct Deep { pub count: u32, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Default)]
    pub enum Kind { #[default] A, B(u8, u8), C { x: i64 } }
});

// ---- The workflow itself. ----

/// The states of `base::Flow` in another order, stored under the same names.
#[allow(dead_code)]
mod states_reordered {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize)]
    pub enum Flow {
        #[terminal]
        Done,
        #[initial]
        #[next(Done)]
        Start { data: base::Data },
    }
}

/// `base::Flow` with its states stored in snake case.
#[allow(dead_code)]
mod states_renamed {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Flow {
        #[initial]
        #[next(Done)]
        Start { data: base::Data },
        #[terminal]
        Done,
    }
}

#[test]
fn state_order_does_not_count_stored_state_names_do() {
    assert_eq!(hash::<states_reordered::Flow>(), hash::<base::Flow>());
    assert_ne!(hash::<states_renamed::Flow>(), hash::<base::Flow>());
    assert!(states_renamed::Flow::SCHEMA.contains("state Start as \"start\" (struct, initial)"));
}

#[test]
fn the_hash_is_a_constant_pinned_across_builds() {
    const HASH: SchemaHash = <base::Flow as Workflow>::SCHEMA_HASH;
    // This value is what every build, platform and compiler computes for `base::Flow`; if it
    // changes, every stored run of every workflow is refused. Change it only with
    // `record::FORMAT_VERSION` in mind.
    assert_eq!(
        HASH.to_string(),
        "31ae818a5f7258ab",
        "{}",
        base::Flow::SCHEMA
    );
}

#[test]
fn the_diff_says_what_changed() {
    let texts = |new: &str| {
        let diff = loops::schema_diff(base::Flow::SCHEMA, new);
        diff.iter()
            .map(|c| format!("{} [{}]", c.text, c.class))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        texts(deep_field_added::Flow::SCHEMA),
        ["state `Start`: field `data.inner.deep.extra: bool` added [breaking]"]
    );
    assert_eq!(
        texts(nested_type::Flow::SCHEMA),
        ["state `Start`: field `data.inner.deep.count` changed from `u32` to `u64` [compatible]"]
    );
    assert_eq!(
        texts(serde_tag::Flow::SCHEMA),
        [
            "state `Start`: field `data.inner.deep.kind` changed from `Kind` to `Kind (tag = \"type\", content = \"value\")` [breaking]"
        ]
    );
    assert!(loops::schema_diff(base::Flow::SCHEMA, order::Flow::SCHEMA).is_empty());
    assert!(loops::schema_diff(base::Flow::SCHEMA, states_reordered::Flow::SCHEMA).is_empty());
}
