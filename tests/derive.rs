//! What `#[derive(Workflow)]` generates: the state table, names, transitions, `Display`, and
//! when the schema hash changes.

use loops::{Schema, StateId, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Issue {
    pub number: u64,
    pub title: String,
}

#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Plan {
    pub steps: Vec<String>,
}

#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TestReport {
    pub passed: bool,
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "deliver", version = 1)]
pub enum Deliver {
    /// An issue arrived.
    #[initial]
    #[next(Planned, Abandoned)]
    Received { issue: Issue },
    #[next(Edited)]
    Planned { issue: Issue, plan: Plan },
    #[next(Tested)]
    Edited { issue: Issue, commit: String },
    #[next(Edited, PrOpened)] // the fix loop
    Tested {
        issue: Issue,
        commit: String,
        report: TestReport,
    },
    #[terminal]
    PrOpened { url: String },
    #[terminal]
    Abandoned { reason: String },
}

#[test]
fn state_table() {
    use DeliverState::*;
    assert_eq!(
        DeliverState::ALL,
        &[Received, Planned, Edited, Tested, PrOpened, Abandoned]
    );
    assert_eq!(DeliverState::INITIAL, Received);
    assert_eq!(Received.next(), &[Planned, Abandoned]);
    assert_eq!(Planned.next(), &[Edited]);
    assert_eq!(Edited.next(), &[Tested]);
    assert_eq!(Tested.next(), &[Edited, PrOpened]);
    assert_eq!(PrOpened.next(), &[] as &[DeliverState]);
    assert_eq!(Abandoned.next(), &[] as &[DeliverState]);
    let terminal: Vec<_> = DeliverState::ALL.iter().map(|s| s.is_terminal()).collect();
    assert_eq!(terminal, [false, false, false, false, true, true]);
    assert!(Tested.can_move_to(Edited));
    assert!(!Received.can_move_to(Edited));
}

#[test]
fn names_and_display() {
    let names: Vec<_> = DeliverState::ALL.iter().map(|s| s.name()).collect();
    assert_eq!(
        names,
        [
            "Received",
            "Planned",
            "Edited",
            "Tested",
            "PrOpened",
            "Abandoned"
        ]
    );
    let displayed: Vec<_> = DeliverState::ALL.iter().map(|s| s.to_string()).collect();
    assert_eq!(displayed, names);
    assert_eq!(
        DeliverState::from_name("PrOpened"),
        Some(DeliverState::PrOpened)
    );
    assert_eq!(DeliverState::from_name("Merged"), None);
    assert_eq!(format!("{:?}", DeliverState::Tested), "Tested");
}

#[test]
fn workflow_constants() {
    assert_eq!(Deliver::NAME, "deliver");
    assert_eq!(Deliver::VERSION, 1);
    let value = Deliver::PrOpened { url: "u".into() };
    assert_eq!(value.state(), DeliverState::PrOpened);
    println!("{}", Deliver::SCHEMA);
    println!("{}", Deliver::SCHEMA_HASH);
}

#[test]
fn next_converts_into_the_workflow() {
    let issue = Issue {
        number: 7,
        title: "t".into(),
    };
    let next: Deliver = ReceivedNext::Abandoned {
        reason: "dup".into(),
    }
    .into();
    assert_eq!(
        next,
        Deliver::Abandoned {
            reason: "dup".into()
        }
    );
    let next: Deliver = TestedNext::Edited {
        issue: issue.clone(),
        commit: "c".into(),
    }
    .into();
    assert_eq!(next.state(), DeliverState::Edited);
}

/// The same small workflow, five times over, each differing from `base` in one way.
mod hash {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    pub mod base {
        use super::*;
        #[derive(Workflow, Serialize, Deserialize)]
        pub enum Review {
            #[initial]
            #[next(Approved, Rejected)]
            Open { pr: u64, author: String },
            #[terminal]
            Approved { by: String },
            #[terminal]
            Rejected,
        }
    }

    /// Only doc comments and formatting differ.
    pub mod docs {
        use super::*;
        /// A code review.
        #[derive(Workflow, Serialize, Deserialize)]
        pub enum Review {
            /// Waiting for a reviewer.
            #[initial]
            #[next(Approved, Rejected)]
            Open {
                /// The pull request.
                pr: u64,
                author: String,
            },
            /// Merged.
            #[terminal]
            Approved { by: String },
            #[terminal]
            Rejected,
        }
    }

    /// `pr: u64` became `pr: u32`.
    pub mod field_type {
        use super::*;
        #[derive(Workflow, Serialize, Deserialize)]
        pub enum Review {
            #[initial]
            #[next(Approved, Rejected)]
            Open { pr: u32, author: String },
            #[terminal]
            Approved { by: String },
            #[terminal]
            Rejected,
        }
    }

    /// `Open` may also move to itself.
    pub mod transition {
        use super::*;
        #[derive(Workflow, Serialize, Deserialize)]
        pub enum Review {
            #[initial]
            #[next(Approved, Rejected, Open)]
            Open { pr: u64, author: String },
            #[terminal]
            Approved { by: String },
            #[terminal]
            Rejected,
        }
    }

    /// `version = 2`.
    pub mod version {
        use super::*;
        #[derive(Workflow, Serialize, Deserialize)]
        #[workflow(version = 2)]
        pub enum Review {
            #[initial]
            #[next(Approved, Rejected)]
            Open { pr: u64, author: String },
            #[terminal]
            Approved { by: String },
            #[terminal]
            Rejected,
        }
    }

    /// `crate = path`: the generated code names loops through another path (a re-export
    /// here, as in a crate that reaches loops under another name); nothing else differs.
    pub mod crate_path {
        use loops::Schema;
        use serde::{Deserialize, Serialize};

        mod renamed {
            pub use ::loops as facade;
        }

        #[derive(loops::Workflow, Serialize, Deserialize)]
        #[workflow(crate = renamed::facade)]
        pub enum Review {
            #[initial]
            #[next(Approved, Rejected)]
            Open { pr: u64, author: String },
            #[terminal]
            Approved { by: String },
            #[terminal]
            Rejected,
        }

        /// The path as a string, as serde's `#[serde(crate = "...")]` writes it.
        pub mod quoted {
            use super::*;
            #[derive(loops::Workflow, Serialize, Deserialize)]
            #[workflow(crate = "super::renamed::facade")]
            pub enum Review {
                #[initial]
                #[next(Approved, Rejected)]
                Open { pr: u64, author: String },
                #[terminal]
                Approved { by: String },
                #[terminal]
                Rejected,
            }
        }

        #[derive(Schema, Serialize)]
        #[schema(crate = renamed::facade)]
        pub struct Author {
            pub name: String,
            pub pr: Option<Box<Author>>,
        }

        #[derive(Schema, Serialize)]
        pub struct AuthorByDefault {
            pub name: String,
            pub pr: Option<Box<AuthorByDefault>>,
        }
    }

    #[test]
    fn unchanged_by_the_crate_path() {
        use loops::{Schema, StateId};
        assert_eq!(crate_path::Review::SCHEMA_HASH, base::Review::SCHEMA_HASH);
        assert_eq!(crate_path::Review::SCHEMA, base::Review::SCHEMA);
        assert_eq!(
            crate_path::quoted::Review::SCHEMA_HASH,
            base::Review::SCHEMA_HASH
        );
        assert_eq!(crate_path::quoted::Review::SCHEMA, base::Review::SCHEMA);
        let names: Vec<_> = crate_path::ReviewState::ALL
            .iter()
            .map(|s| s.name())
            .collect();
        assert_eq!(names, ["Open", "Approved", "Rejected"]);
        assert_eq!(
            crate_path::ReviewState::Open.next(),
            &[
                crate_path::ReviewState::Approved,
                crate_path::ReviewState::Rejected
            ]
        );
        assert_eq!(
            crate_path::Author::SHAPE.hash(),
            crate_path::AuthorByDefault::SHAPE.hash()
        );
    }

    #[test]
    fn unchanged_by_docs_and_formatting() {
        assert_eq!(docs::Review::SCHEMA_HASH, base::Review::SCHEMA_HASH);
        assert_eq!(docs::Review::SCHEMA, base::Review::SCHEMA);
    }

    #[test]
    fn changed_by_a_field_type() {
        assert_ne!(field_type::Review::SCHEMA_HASH, base::Review::SCHEMA_HASH);
    }

    #[test]
    fn changed_by_a_transition() {
        assert_ne!(transition::Review::SCHEMA_HASH, base::Review::SCHEMA_HASH);
    }

    #[test]
    fn changed_by_the_version() {
        assert_ne!(version::Review::SCHEMA_HASH, base::Review::SCHEMA_HASH);
        assert_eq!(version::Review::VERSION, 2);
    }

    #[test]
    fn the_description_is_the_text_the_hash_was_computed_from() {
        assert_eq!(
            base::Review::SCHEMA,
            "workflow review version 1 format 1\n\
             state Open (struct, initial) -> Approved | Rejected\n  \
               pr: u64\n  \
               author: String\n\
             state Approved (struct, terminal)\n  \
               by: String\n\
             state Rejected (unit, terminal)\n"
        );
    }
}

/// `next_prefix` renames the generated `{V}Next` enums (two workflows of one module may then
/// share a state name) and changes nothing else: not the states, not the schema hash.
mod next_prefix {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    mod plain {
        use super::*;
        #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
        #[workflow(name = "review", version = 1)]
        pub enum Review {
            #[initial]
            #[next(Done)]
            Open { pr: u64 },
            #[terminal]
            Done,
        }
    }

    // Beside `Ticket`, which has a state `Open` too.
    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "review", version = 1, next_prefix = "Review")]
    pub enum Review {
        #[initial]
        #[next(Done)]
        Open { pr: u64 },
        #[terminal]
        Done,
    }

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 1)]
    pub enum Ticket {
        #[initial]
        #[next(Done)]
        Open { id: u64 },
        #[terminal]
        Done,
    }

    #[test]
    fn renames_the_next_enums_and_keeps_the_schema() {
        assert_eq!(Review::SCHEMA_HASH, plain::Review::SCHEMA_HASH);
        assert_eq!(Review::SCHEMA, plain::Review::SCHEMA);
        let next: Review = ReviewOpenNext::Done.into();
        assert_eq!(next, Review::Done);
        let next: Ticket = OpenNext::Done.into();
        assert_eq!(next, Ticket::Done);
        let _: plain::OpenNext = plain::OpenNext::Done;
    }
}

/// `accepts` and `version` given through `macro_rules!` fragments (`$h:literal`,
/// `$v:literal`, which the macro wraps in invisible groups) read as the literals written in
/// place; before, `accepts = [$h]` was refused as "not 16 hex digits" (helper-70).
mod through_a_macro {
    use super::*;

    macro_rules! accepting {
        ($v:literal, $h:literal) => {
            #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
            #[workflow(name = "gate", version = $v, accepts = [$h])]
            pub enum Gate {
                #[initial]
                #[next(Done)]
                Ask { topic: String },
                #[terminal]
                Done { by: String },
            }
        };
    }

    accepting!(2, "96974c84a095a465");

    #[test]
    fn the_fragments_read_as_literals() {
        assert_eq!(Gate::VERSION, 2);
        assert_eq!(
            Gate::ACCEPTS,
            [loops::SchemaHash::from_u64(0x9697_4c84_a095_a465)]
        );
        let done: Gate = AskNext::Done { by: "me".into() }.into();
        assert!(done.state().is_terminal());
        assert_ne!(Gate::Ask { topic: "t".into() }, done);
    }
}
