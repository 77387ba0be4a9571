//! Snapshots of `Workflow::SCHEMA`, the description stored beside each schema hash, for a few
//! workflows: nested payloads, serde representations, recursive and generic types. The
//! snapshots are `tests/snapshots/NAME.txt`; after a deliberate change, regenerate them with
//! `UPDATE_SNAPSHOTS=1 cargo test --test describe` and read the diff.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use loops::{Schema, Workflow};
use serde::{Deserialize, Serialize};

fn snapshot(name: &str, text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.txt"));
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "no snapshot {}: run with UPDATE_SNAPSHOTS=1",
            path.display()
        )
    });
    assert_eq!(
        text, expected,
        "the description of `{name}` changed:\n{text}"
    );
}

#[allow(dead_code)]
mod deliver {
    use super::*;

    #[derive(Schema, Serialize, Deserialize)]
    pub struct Issue {
        pub number: u64,
        pub title: String,
        pub labels: Vec<String>,
        pub author: User,
    }

    #[derive(Schema, Serialize, Deserialize)]
    pub struct User {
        pub login: String,
        pub id: u64,
    }

    #[derive(Schema, Serialize, Deserialize)]
    pub struct Plan {
        pub steps: Vec<Step>,
        pub reviewers: BTreeMap<String, User>,
    }

    #[derive(Schema, Serialize, Deserialize)]
    pub struct Step {
        pub file: String,
        pub kind: StepKind,
    }

    #[derive(Schema, Serialize, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum StepKind {
        Edit { line: u32 },
        Run(RunSpec),
        Wait,
    }

    #[derive(Schema, Serialize, Deserialize)]
    pub struct RunSpec {
        pub command: String,
    }

    #[derive(Schema, Serialize, Deserialize)]
    pub struct TestReport {
        pub passed: bool,
        pub log: Option<String>,
        pub durations: BTreeMap<String, Duration>,
    }

    /// Delivers a fix for an issue.
    #[derive(Workflow, Serialize, Deserialize)]
    #[workflow(name = "deliver", version = 3)]
    pub enum Deliver {
        #[initial]
        #[next(Planned, Abandoned)]
        Received { issue: Issue },
        #[next(Edited)]
        Planned { issue: Issue, plan: Plan },
        #[next(Tested)]
        Edited(Issue, String),
        #[next(Edited, PrOpened)]
        Tested { commit: String, report: TestReport },
        #[terminal]
        PrOpened { url: String },
        #[terminal]
        Abandoned,
    }
}

#[test]
fn nested_payloads() {
    snapshot("deliver", deliver::Deliver::SCHEMA);
}

#[allow(dead_code)]
mod serde_forms {
    use super::*;

    #[derive(Schema, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Options {
        pub max_attempts: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub deadline_secs: Option<u64>,
        #[serde(flatten)]
        pub limits: Limits,
        #[serde(flatten)]
        pub extra: BTreeMap<String, serde_json::Value>,
        #[serde(skip)]
        pub cache: Vec<u8>,
        #[serde(with = "as_text")]
        pub threshold: u32,
        pub id: Ticket,
        pub color: Color,
        pub answer: Answer,
        pub key: Key,
        pub marker: Marker,
        pub pair: Pair,
        pub wrapped: Wrapped,
    }

    /// Stored as the number it holds.
    #[derive(Schema, Serialize, Deserialize)]
    pub struct Key(u64);

    /// Stored as `null`.
    #[derive(Schema, Serialize, Deserialize)]
    pub struct Marker;

    /// Stored as a JSON array.
    #[derive(Schema, Serialize, Deserialize)]
    pub struct Pair(u8, String);

    /// Stored as the optional enum it holds.
    #[derive(Schema, Serialize, Deserialize)]
    pub struct Wrapped(Option<Answer>);

    #[derive(Schema, Serialize, Deserialize)]
    pub struct Limits {
        pub cpu: f32,
        pub memory_mb: u64,
    }

    /// Stored as a string through `From`/`Into`.
    #[derive(Schema, Serialize, Deserialize, Clone)]
    #[serde(into = "String", try_from = "String")]
    pub struct Ticket {
        pub project: String,
        pub number: u32,
    }

    impl From<Ticket> for String {
        fn from(t: Ticket) -> String {
            format!("{}-{}", t.project, t.number)
        }
    }

    impl TryFrom<String> for Ticket {
        type Error = String;
        fn try_from(s: String) -> Result<Self, String> {
            let (project, number) = s.split_once('-').ok_or("no dash")?;
            let number = number.parse().map_err(|_| "not a number")?;
            Ok(Ticket {
                project: project.into(),
                number,
            })
        }
    }

    #[derive(Schema, Serialize, Deserialize)]
    #[serde(tag = "t", content = "c")]
    pub enum Color {
        Named(String),
        Rgb(u8, u8, u8),
    }

    #[derive(Schema, Serialize, Deserialize)]
    #[serde(untagged)]
    pub enum Answer {
        Number(i64),
        Text(String),
    }

    pub mod as_text {
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

    #[derive(Workflow, Serialize, Deserialize)]
    #[serde(tag = "state", rename_all = "kebab-case")]
    pub enum Configure {
        #[initial]
        #[next(Configured)]
        Start {
            /// Boxed (stored, and described, as what it holds) to keep the enum small.
            options: Box<Options>,
            #[serde(rename = "by")]
            requested_by: Option<String>,
        },
        #[terminal]
        Configured,
    }
}

#[test]
fn serde_representations() {
    snapshot("serde_forms", serde_forms::Configure::SCHEMA);
}

#[allow(dead_code)]
mod recursive {
    use super::*;

    #[derive(Schema, Serialize, Deserialize)]
    pub struct Tree {
        pub value: u32,
        pub children: Vec<Tree>,
    }

    #[derive(Schema, Serialize, Deserialize)]
    pub struct Comment {
        pub body: String,
        pub reply: Option<Box<Self>>,
    }

    /// `Folder` and `File` refer to each other: one of the two fields says so.
    #[derive(Schema, Serialize, Deserialize)]
    pub struct Folder {
        pub name: String,
        pub files: Vec<File>,
    }

    #[derive(Schema, Serialize, Deserialize)]
    pub struct File {
        pub name: String,
        #[schema(recursive = Folder)]
        pub subfolder: Option<Box<Folder>>,
    }

    /// A generic payload.
    #[derive(Schema, Serialize, Deserialize)]
    pub struct Page<T> {
        pub items: Vec<T>,
        pub next: Option<String>,
    }

    #[derive(Workflow, Serialize, Deserialize)]
    pub enum Browse {
        #[initial]
        #[next(Done)]
        Start {
            tree: Tree,
            thread: Comment,
            root: Folder,
            page: Page<Comment>,
        },
        #[terminal]
        Done,
    }
}

#[test]
fn recursive_and_generic_types() {
    snapshot("recursive", recursive::Browse::SCHEMA);
}
