//! The classes of `schema_diff`: for each kind of change, a workflow before and after it, the
//! exact change text and class, and what serde really does with a record the old build wrote
//! (a compatible change reads it back to the same meaning; a breaking one does not).

use loops::{Class, SchemaDiff};
use loops::{Schema, Workflow, schema_diff};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A module holding the payload types given and a two-state workflow storing a `Data`.
macro_rules! flow {
    ($name:ident { $($payload:item)* }) => {
        #[allow(dead_code)]
        pub mod $name {
            use super::*;

            $($payload)*

            #[derive(Workflow, Serialize, Deserialize, Debug, PartialEq)]
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

/// The diff from `Old` to `New` as `(text, class)` pairs; the hashes must differ.
fn diff<Old: Workflow, New: Workflow>() -> SchemaDiff {
    assert_ne!(Old::SCHEMA_HASH, New::SCHEMA_HASH);
    schema_diff(Old::SCHEMA, New::SCHEMA)
}

fn assert_diff(diff: &SchemaDiff, expected: &[(&str, Class)]) {
    let got: Vec<(&str, &Class)> = diff.iter().map(|c| (c.text.as_str(), &c.class)).collect();
    let want: Vec<(&str, &Class)> = expected.iter().map(|(t, c)| (*t, c)).collect();
    assert_eq!(got, want, "{diff}");
}

/// `value`, written by the old build, read by the new one.
fn read_as<New: DeserializeOwned>(value: &impl Serialize) -> Result<New, serde_json::Error> {
    serde_json::from_str(&serde_json::to_string(value).unwrap())
}

const C: Class = Class::Compatible;
const B: Class = Class::Breaking;

fn pending(state: &str) -> Class {
    Class::IfNoPendingRun {
        state: state.into(),
    }
}

// ---- Compatible ----

flow!(v1 {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq, Clone)]
    pub struct Data { pub id: u32, pub title: String, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq, Clone)]
    pub enum Kind { A, B(u8) }
});

fn v1_value() -> v1::Flow {
    v1::Flow::Start {
        data: v1::Data {
            id: 7,
            title: "t".into(),
            kind: v1::Kind::B(3),
        },
    }
}

flow!(defaulted {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data { pub id: u32, pub title: String, pub kind: super::v1::Kind, #[serde(default)] pub tries: u32 }
});

#[test]
fn a_field_added_with_serde_default_is_compatible() {
    assert_diff(
        &diff::<v1::Flow, defaulted::Flow>(),
        &[("state `Start`: field `data.tries: u32 (default)` added", C)],
    );
    let defaulted::Flow::Start { data } = read_as(&v1_value()).unwrap() else {
        panic!()
    };
    assert_eq!((data.id, data.tries), (7, 0));
}

flow!(optional {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data { pub id: u32, pub title: String, pub kind: super::v1::Kind, pub note: Option<String> }
});

#[test]
fn an_option_field_added_without_default_is_compatible() {
    // serde's derive reads a missing `Option` field as `None`, `default` or not.
    assert_diff(
        &diff::<v1::Flow, optional::Flow>(),
        &[("state `Start`: field `data.note: Option<String>` added", C)],
    );
    let optional::Flow::Start { data } = read_as(&v1_value()).unwrap() else {
        panic!()
    };
    assert_eq!(data.note, None);
}

flow!(widened {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data { pub id: u64, pub title: Option<String>, pub kind: Sort }
    /// `Kind` renamed: type names are not stored.
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub enum Sort { A, B(u16), C }
});

#[test]
fn widened_numbers_options_renamed_types_and_new_variants_are_compatible() {
    assert_diff(
        &diff::<v1::Flow, widened::Flow>(),
        &[
            (
                "state `Start`: field `data.id` changed from `u32` to `u64`",
                C,
            ),
            (
                "state `Start`: field `data.title` changed from `String` to `Option<String>`",
                C,
            ),
            (
                "state `Start`: field `data.kind` changed from `Kind` to `Sort`",
                C,
            ),
            (
                "state `Start`: field `data.kind::B.0` changed from `u8` to `u16`",
                C,
            ),
            ("state `Start`: variant `data.kind::C: unit` added", C),
        ],
    );
    let widened::Flow::Start { data } = read_as(&v1_value()).unwrap() else {
        panic!()
    };
    assert_eq!(
        data,
        widened::Data {
            id: 7,
            title: Some("t".into()),
            kind: widened::Sort::B(3)
        }
    );
}

/// `v1` with a new state no old state reaches, and a new `#[next]` target of `Start`.
#[allow(dead_code)]
mod more_states {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, PartialEq)]
    pub enum Flow {
        #[initial]
        #[next(Done, Review)]
        Start { data: v1::Data },
        #[next(Done)]
        Review { data: v1::Data },
        #[terminal]
        Done,
    }
}

#[test]
fn a_new_state_and_a_new_next_target_are_compatible() {
    assert_diff(
        &diff::<v1::Flow, more_states::Flow>(),
        &[
            ("state `Start`: may now move to `Review`", C),
            ("state `Review` added", C),
        ],
    );
    assert!(matches!(
        read_as::<more_states::Flow>(&v1_value()),
        Ok(more_states::Flow::Start { .. })
    ));
}

#[test]
fn a_removed_state_is_compatible_while_no_pending_run_is_in_it() {
    let diff = diff::<more_states::Flow, v1::Flow>();
    assert_diff(
        &diff,
        &[
            ("state `Start`: may no longer move to `Review`", C),
            ("state `Review` removed", pending("Review")),
        ],
    );
    assert_eq!(diff.pending_states(), ["Review"]);
    assert!(diff.is_compatible(|state| state == "Start"));
    assert_eq!(
        diff.breaking(|state| state == "Review").texts(),
        ["state `Review` removed"]
    );
    // A record in the removed state does not read.
    let review = more_states::Flow::Review {
        data: v1::Data {
            id: 1,
            title: "t".into(),
            kind: v1::Kind::A,
        },
    };
    assert!(read_as::<v1::Flow>(&review).is_err());
}

flow!(documented {
    /// Docs and comments are not stored.
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data {
        /// The id.
        pub id: u32,
        // A comment.
        pub title: String,
        pub kind: super::v1::Kind,
    }
});

#[test]
fn doc_only_changes_are_no_change() {
    assert_eq!(documented::Flow::SCHEMA_HASH, v1::Flow::SCHEMA_HASH);
    assert!(schema_diff(v1::Flow::SCHEMA, documented::Flow::SCHEMA).is_empty());
}

/// `v1` as version 2.
#[allow(dead_code)]
mod version_2 {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize)]
    #[workflow(name = "flow", version = 2)]
    pub enum Flow {
        #[initial]
        #[next(Done)]
        Start { data: v1::Data },
        #[terminal]
        Done,
    }
}

#[test]
fn a_new_version_number_is_compatible() {
    assert_diff(
        &diff::<v1::Flow, version_2::Flow>(),
        &[("version changed from 1 to 2", C)],
    );
}

// ---- Breaking ----

flow!(removed {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data { pub id: u32, pub kind: super::v1::Kind }
});

#[test]
fn a_removed_field_is_breaking() {
    assert_diff(
        &diff::<v1::Flow, removed::Flow>(),
        &[("state `Start`: field `data.title: String` removed", B)],
    );
    // serde ignores the stored key: the record reads, but its title is gone.
    assert!(read_as::<removed::Flow>(&v1_value()).is_ok());
}

flow!(retyped {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data { pub id: u16, pub title: u64, pub kind: super::v1::Kind }
});

#[test]
fn a_retyped_or_narrowed_field_is_breaking() {
    assert_diff(
        &diff::<v1::Flow, retyped::Flow>(),
        &[
            (
                "state `Start`: field `data.id` changed from `u32` to `u16`",
                B,
            ),
            (
                "state `Start`: field `data.title` changed from `String` to `u64`",
                B,
            ),
        ],
    );
    assert!(read_as::<retyped::Flow>(&v1_value()).is_err());
}

flow!(required {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data { pub id: u32, pub title: String, pub kind: super::v1::Kind, pub tries: u32 }
});

#[test]
fn a_field_added_without_default_is_breaking() {
    let diff = diff::<v1::Flow, required::Flow>();
    assert_diff(
        &diff,
        &[("state `Start`: field `data.tries: u32` added", B)],
    );
    assert_eq!(
        diff.changes()[0].reason,
        "records written before lack it; give it `#[serde(default)]` or make it an `Option`"
    );
    assert!(read_as::<required::Flow>(&v1_value()).is_err());
}

/// `more_states` with `Review` renamed `Checking`.
#[allow(dead_code)]
mod renamed_state {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, PartialEq)]
    pub enum Flow {
        #[initial]
        #[next(Done, Checking)]
        Start { data: v1::Data },
        #[next(Done)]
        Checking { data: v1::Data },
        #[terminal]
        Done,
    }
}

#[test]
fn a_renamed_state_is_breaking_for_the_runs_in_it() {
    let diff = diff::<more_states::Flow, renamed_state::Flow>();
    assert_diff(
        &diff,
        &[
            ("state `Start`: may now move to `Checking`", C),
            ("state `Start`: may no longer move to `Review`", C),
            ("state `Checking` added", C),
            ("state `Review` removed", pending("Review")),
        ],
    );
    assert_eq!(
        diff.changes()[3].reason,
        "a pending run in it could not be resumed; if `Checking`, added with the same data, is its new name, runs in `Review` need a migration"
    );
    assert!(!diff.is_compatible(|state| state == "Review"));
}

flow!(tagged {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data { pub id: u32, pub title: String, pub kind: Kind }
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    #[serde(tag = "type", content = "value")]
    pub enum Kind { A, B(u8) }
});

#[test]
fn a_changed_enum_representation_is_breaking() {
    assert_diff(
        &diff::<v1::Flow, tagged::Flow>(),
        &[(
            "state `Start`: field `data.kind` changed from `Kind` to `Kind (tag = \"type\", content = \"value\")`",
            B,
        )],
    );
    assert!(read_as::<tagged::Flow>(&v1_value()).is_err());
}

flow!(untagged_v1 {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data { pub answers: Vec<Answer> }
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    #[serde(untagged)]
    pub enum Answer { Small(u8), Large(u64) }
});

flow!(untagged_reordered {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data { pub answers: Vec<Answer> }
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    #[serde(untagged)]
    pub enum Answer { Large(u64), Small(u8) }
});

#[test]
fn reordered_variants_of_a_nested_untagged_enum_are_breaking() {
    // The hash changes, and the diff says why (it used to list nothing).
    assert_diff(
        &diff::<untagged_v1::Flow, untagged_reordered::Flow>(),
        &[(
            "state `Start`: variants of untagged `data.answers[]` reordered from `Small, Large` to `Large, Small`",
            B,
        )],
    );
    // A stored `Small(3)` now reads as `Large(3)`.
    let old = untagged_v1::Flow::Start {
        data: untagged_v1::Data {
            answers: vec![untagged_v1::Answer::Small(3)],
        },
    };
    let untagged_reordered::Flow::Start { data } = read_as(&old).unwrap() else {
        panic!()
    };
    assert_eq!(data.answers, [untagged_reordered::Answer::Large(3)]);
}

flow!(untagged_inserted {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data { pub answers: Vec<Answer> }
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    #[serde(untagged)]
    pub enum Answer { Small(u8), Text(String), Large(u64), Flag(bool) }
});

#[test]
fn a_variant_inserted_into_an_untagged_enum_is_breaking_appended_is_not() {
    assert_diff(
        &diff::<untagged_v1::Flow, untagged_inserted::Flow>(),
        &[
            (
                "state `Start`: variant `data.answers[]::Text: newtype` added",
                B,
            ),
            (
                "state `Start`: variant `data.answers[]::Flag: newtype` added",
                C,
            ),
        ],
    );
}

#[test]
fn a_changed_record_format_version_is_breaking() {
    // A build of loops with another record format writes another number in the header.
    let next = v1::Flow::SCHEMA.replacen(" format 1", " format 2", 1);
    assert_ne!(next, v1::Flow::SCHEMA);
    assert_diff(
        &schema_diff(v1::Flow::SCHEMA, &next),
        &[("record format version changed from 1 to 2", B)],
    );
}

flow!(nested_v1 {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data { pub by_file: std::collections::BTreeMap<String, Vec<Edit>>, pub last: Option<Edit> }
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Edit { pub line: u32, pub op: Op }
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    #[serde(tag = "op")]
    pub enum Op { Insert { text: String }, Delete }
});

flow!(nested_v2 {
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Data { pub by_file: std::collections::BTreeMap<String, Vec<Edit>>, pub last: Option<Edit> }
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    pub struct Edit { pub line: u32, #[serde(default)] pub column: u32, pub op: Op }
    #[derive(Schema, Serialize, Deserialize, Debug, PartialEq)]
    #[serde(tag = "op")]
    pub enum Op { Insert { text: String, at: u64 }, Replace { text: String } }
});

#[test]
fn changes_inside_maps_sequences_options_and_enums_are_classified() {
    assert_diff(
        &diff::<nested_v1::Flow, nested_v2::Flow>(),
        &[
            (
                "state `Start`: field `data.by_file{}[].column: u32 (default)` added",
                C,
            ),
            (
                "state `Start`: field `data.by_file{}[].op::Insert.at: u64` added",
                B,
            ),
            (
                "state `Start`: variant `data.by_file{}[].op::Replace: struct` added",
                C,
            ),
            (
                "state `Start`: field `data.last.column: u32 (default)` added",
                C,
            ),
            (
                "state `Start`: field `data.last.op::Insert.at: u64` added",
                B,
            ),
            (
                "state `Start`: variant `data.last.op::Replace: struct` added",
                C,
            ),
            (
                "state `Start`: variant `data.by_file{}[].op::Delete: unit` removed",
                B,
            ),
            (
                "state `Start`: variant `data.last.op::Delete: unit` removed",
                B,
            ),
        ],
    );
    let edit = |op| nested_v1::Edit { line: 1, op };
    let old = nested_v1::Flow::Start {
        data: nested_v1::Data {
            by_file: [("a.rs".to_owned(), vec![edit(nested_v1::Op::Delete)])].into(),
            last: None,
        },
    };
    assert!(
        read_as::<nested_v2::Flow>(&old).is_err(),
        "`Delete` is gone"
    );
}
