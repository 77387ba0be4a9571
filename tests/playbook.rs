//! The chapters of docs/evolution.md's playbook, checked: for each change a user makes to a
//! workflow with runs in flight, the code the chapter says to write compiles, and what loops
//! does with a stored run of the old version in each state (drive, migrate, accept, block:
//! `loops::route`, the rule the runtime, the PostgreSQL claims and the dry run follow) and
//! what the migration writes are those the chapter says.

use loops::{BoxError, Class, KnownVersion, Migrate, Migration, MigrationFailure, Route};
use loops::{StoredRun, Workflow};
use loops::{route, schema_diff};
use serde::{Deserialize, Serialize};

/// The version every chapter changes: a ticket that is opened, triaged, fixed and closed.
pub mod v1 {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 1)]
    pub enum Ticket {
        #[initial]
        #[next(Triaged)]
        Opened { title: String },
        #[next(Fixed, Closed)]
        Triaged { title: String, owner: String },
        #[next(Closed)]
        Fixed { title: String, commit: String },
        #[terminal]
        Closed { note: String },
    }
}

/// Version 1's pinned hash, as `loops schema` prints it: what `accepts = [..]` names.
const V1: &str = "a910bd3b2bf5a831";

/// Every state of version 1, by name.
const V1_STATES: [&str; 4] = ["Opened", "Triaged", "Fixed", "Closed"];

/// What a build compiling `known` (and `migrations`) does with a run of version 1 in `state`.
fn route_v1(state: &str, known: &[KnownVersion], migrations: &[Migration]) -> Route {
    let run = StoredRun {
        workflow: "ticket",
        schema: v1::Ticket::SCHEMA_HASH.pinned(),
        state,
        description: Some(v1::Ticket::SCHEMA),
    };
    route(&run, known, migrations)
}

/// `route_v1` in a word: "drive", "migrate", "accept", "block".
fn verdict(route: &Route) -> &'static str {
    match route {
        Route::Drive(_) => "drive",
        Route::Migrate(_) => "migrate",
        Route::Accept { .. } => "accept",
        Route::Block(_) => "block",
    }
}

/// The verdict for a run of version 1 in each of its states, in [`V1_STATES`]' order.
fn verdicts(known: &[KnownVersion], migrations: &[Migration]) -> Vec<&'static str> {
    V1_STATES
        .iter()
        .map(|s| verdict(&route_v1(s, known, migrations)))
        .collect()
}

/// A stored payload of version 1, read by `migration` (from version 1): the new payload, or
/// the migration's own error.
fn migrate(migration: &Migration, old: &v1::Ticket) -> Result<String, String> {
    match migration.apply(&serde_json::to_string(old).unwrap()) {
        Ok(migrated) => Ok(migrated.payload),
        Err(e) => match e.cause {
            MigrationFailure::Failed(cause) => Err(cause.to_string()),
            other => panic!("expected the migration's own error, got {other:?}"),
        },
    }
}

#[test]
fn version_1s_hash_is_the_one_the_chapters_accept() {
    assert_eq!(v1::Ticket::SCHEMA_HASH.pinned().to_string(), V1);
}

/// "Add a field", with a default: compatible; `accepts` the old schema, no old code kept.
mod add_a_field_with_a_default {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 2, accepts = ["a910bd3b2bf5a831"])]
    pub enum Ticket {
        #[initial]
        #[next(Triaged)]
        Opened {
            title: String,
            #[serde(default)]
            labels: Vec<String>,
        },
        #[next(Fixed, Closed)]
        Triaged { title: String, owner: String },
        #[next(Closed)]
        Fixed { title: String, commit: String },
        #[terminal]
        Closed { note: String },
    }

    #[test]
    fn every_run_of_version_1_is_accepted_as_it_is() {
        let known = [KnownVersion::of::<Ticket>()];
        assert!(known[0].check_accepts(Some(v1::Ticket::SCHEMA)).is_ok());
        assert_eq!(verdicts(&known, &[]), ["accept"; 4]);
        let old = serde_json::to_string(&v1::Ticket::Opened { title: "t".into() }).unwrap();
        let new: Ticket = serde_json::from_str(&old).unwrap();
        assert_eq!(
            new,
            Ticket::Opened {
                title: "t".into(),
                labels: vec![]
            }
        );
    }
}

/// "Add a field", without a default: breaking, whatever state a run is in; a migration
/// computes it.
mod add_a_field_without_a_default {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 2, accepts = ["a910bd3b2bf5a831"])]
    pub enum Ticket {
        #[initial]
        #[next(Triaged)]
        Opened { title: String, priority: u8 },
        #[next(Fixed, Closed)]
        Triaged { title: String, owner: String },
        #[next(Closed)]
        Fixed { title: String, commit: String },
        #[terminal]
        Closed { note: String },
    }

    impl Migrate<v1::Ticket> for Ticket {
        fn migrate(old: v1::Ticket) -> Result<Self, BoxError> {
            Ok(match old {
                v1::Ticket::Opened { title } => {
                    let priority = if title.contains("urgent") { 1 } else { 3 };
                    Ticket::Opened { title, priority }
                }
                v1::Ticket::Triaged { title, owner } => Ticket::Triaged { title, owner },
                v1::Ticket::Fixed { title, commit } => Ticket::Fixed { title, commit },
                v1::Ticket::Closed { note } => Ticket::Closed { note },
            })
        }
    }

    #[test]
    fn the_claim_is_refused_at_open_and_every_run_blocked_without_a_migration() {
        let known = [KnownVersion::of::<Ticket>()];
        let refused = known[0]
            .check_accepts(Some(v1::Ticket::SCHEMA))
            .unwrap_err();
        assert_eq!(
            refused.texts(),
            ["state `Opened`: field `priority: u8` added"]
        );
        // Even a run in `Triaged`, whose state did not change: the change is breaking.
        assert_eq!(verdicts(&known, &[]), ["block"; 4]);
    }

    #[test]
    fn with_the_migration_every_run_migrates_and_gets_its_priority() {
        let known = [KnownVersion::of::<Ticket>()];
        let migrations = [Migration::of::<v1::Ticket, Ticket>()];
        assert_eq!(verdicts(&known, &migrations), ["migrate"; 4]);
        let old = v1::Ticket::Opened {
            title: "urgent: down".into(),
        };
        assert_eq!(
            migrate(&migrations[0], &old).unwrap(),
            r#"{"Opened":{"title":"urgent: down","priority":1}}"#
        );
    }
}

/// "Add a state": a new `#[next]` target of an existing state is compatible.
mod add_a_state {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 2, accepts = ["a910bd3b2bf5a831"])]
    pub enum Ticket {
        #[initial]
        #[next(Triaged)]
        Opened { title: String },
        #[next(Fixed, Duplicate, Closed)]
        Triaged { title: String, owner: String },
        #[next(Closed)]
        Fixed { title: String, commit: String },
        #[terminal]
        Duplicate { of: u64 },
        #[terminal]
        Closed { note: String },
    }

    #[test]
    fn every_run_is_accepted_and_the_changes_are_compatible() {
        let diff = schema_diff(v1::Ticket::SCHEMA, Ticket::SCHEMA);
        assert!(diff.iter().all(|c| c.class == Class::Compatible), "{diff}");
        assert_eq!(
            diff.texts(),
            [
                "version changed from 1 to 2",
                "state `Triaged`: may now move to `Duplicate`",
                "state `Duplicate` added"
            ]
        );
        assert_eq!(
            verdicts(&[KnownVersion::of::<Ticket>()], &[]),
            ["accept"; 4]
        );
    }
}

/// "Remove a state": compatible while no unfinished run is in it; a run that is, is blocked
/// (or migrated elsewhere).
mod remove_a_state {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 2, accepts = ["a910bd3b2bf5a831"])]
    pub enum Ticket {
        #[initial]
        #[next(Triaged)]
        Opened { title: String },
        #[next(Closed)]
        Triaged { title: String, owner: String },
        #[terminal]
        Closed { note: String },
    }

    #[test]
    fn runs_elsewhere_are_accepted_and_a_run_in_it_is_blocked() {
        let known = [KnownVersion::of::<Ticket>()];
        // The claim holds at open: the removal stops only runs in `Fixed`.
        assert!(known[0].check_accepts(Some(v1::Ticket::SCHEMA)).is_ok());
        assert_eq!(
            verdicts(&known, &[]),
            ["accept", "accept", "block", "accept"]
        );
        let Route::Block(blocked) = route_v1("Fixed", &known, &[]) else {
            unreachable!()
        };
        assert_eq!(
            blocked.reason,
            format!(
                "version 2 ({}) accepts schema {V1}, but these changes stop a run in state `Fixed`",
                Ticket::SCHEMA_HASH.pinned()
            )
        );
        assert_eq!(blocked.changes.texts(), ["state `Fixed` removed"]);
    }
}

/// "Rename a state": a removal and an addition; runs in the old name need a migration.
mod rename_a_state {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 2, accepts = ["a910bd3b2bf5a831"])]
    pub enum Ticket {
        #[initial]
        #[next(Triaged)]
        Opened { title: String },
        #[next(Patched, Closed)]
        Triaged { title: String, owner: String },
        #[next(Closed)]
        Patched { title: String, commit: String },
        #[terminal]
        Closed { note: String },
    }

    impl Migrate<v1::Ticket> for Ticket {
        fn migrate(old: v1::Ticket) -> Result<Self, BoxError> {
            Ok(match old {
                v1::Ticket::Opened { title } => Ticket::Opened { title },
                v1::Ticket::Triaged { title, owner } => Ticket::Triaged { title, owner },
                v1::Ticket::Fixed { title, commit } => Ticket::Patched { title, commit },
                v1::Ticket::Closed { note } => Ticket::Closed { note },
            })
        }
    }

    #[test]
    fn accepts_covers_the_other_states_and_a_migration_the_renamed_one() {
        let known = [KnownVersion::of::<Ticket>()];
        assert_eq!(
            verdicts(&known, &[]),
            ["accept", "accept", "block", "accept"]
        );
        // A migration comes before `accepts`: every run migrates, `Fixed` to `Patched`.
        let migrations = [Migration::of::<v1::Ticket, Ticket>()];
        assert_eq!(verdicts(&known, &migrations), ["migrate"; 4]);
        let old = v1::Ticket::Fixed {
            title: "t".into(),
            commit: "c".into(),
        };
        let migrated = migrations[0]
            .apply(&serde_json::to_string(&old).unwrap())
            .unwrap();
        assert_eq!(
            (migrated.state, migrated.payload.as_str()),
            ("Patched", r#"{"Patched":{"title":"t","commit":"c"}}"#)
        );
    }
}

/// "Split one state in two": the migration refuses the runs inside the split, which finish
/// on the kept old version (`examples/deliver/workflow.rs` is the full example).
mod split_a_state {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 2)]
    pub enum Ticket {
        #[initial]
        #[next(Triaged)]
        Opened { title: String },
        #[next(Fixed, Closed)]
        Triaged { title: String, owner: String },
        #[next(Verified)]
        Fixed { title: String, commit: String },
        #[next(Closed)]
        Verified { title: String, commit: String },
        #[terminal]
        Closed { note: String },
    }

    impl Migrate<v1::Ticket> for Ticket {
        fn migrate(old: v1::Ticket) -> Result<Self, BoxError> {
            Ok(match old {
                v1::Ticket::Opened { title } => Ticket::Opened { title },
                v1::Ticket::Triaged { title, owner } => Ticket::Triaged { title, owner },
                v1::Ticket::Fixed { .. } => {
                    return Err("inside the split: finish it on version 1".into());
                }
                v1::Ticket::Closed { note } => Ticket::Closed { note },
            })
        }
    }

    #[test]
    fn the_migration_refuses_the_runs_inside_the_split() {
        let migration = Migration::of::<v1::Ticket, Ticket>();
        let inside = v1::Ticket::Fixed {
            title: "t".into(),
            commit: "c".into(),
        };
        let err = migrate(&migration, &inside).unwrap_err();
        assert_eq!(err, "inside the split: finish it on version 1");
        let before = v1::Ticket::Triaged {
            title: "t".into(),
            owner: "o".into(),
        };
        assert_eq!(
            migrate(&migration, &before).unwrap(),
            r#"{"Triaged":{"title":"t","owner":"o"}}"#
        );
        // A build that keeps version 1 drives version 1's runs on it.
        let known = [
            KnownVersion::of::<v1::Ticket>(),
            KnownVersion::of::<Ticket>(),
        ];
        assert_eq!(verdicts(&known, &[migration]), ["drive"; 4]);
    }
}

/// "Change a nested type": the rules of a field of a state, three levels down.
mod change_a_nested_type {
    use super::*;

    #[allow(dead_code, reason = "only their schemas are compared")]
    pub mod v1n {
        use super::*;

        #[derive(loops::Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
        pub struct Owner {
            pub name: String,
            pub team: Team,
        }

        #[derive(loops::Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
        pub struct Team {
            pub id: u32,
        }

        #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
        #[workflow(name = "assign", version = 1)]
        pub enum Assign {
            #[initial]
            #[next(Done)]
            Pending { owner: Owner },
            #[terminal]
            Done,
        }
    }

    #[allow(dead_code, reason = "only their schemas are compared")]
    pub mod widened {
        use super::*;

        #[derive(loops::Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
        pub struct Owner {
            pub name: String,
            pub team: Team,
        }

        #[derive(loops::Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
        pub struct Team {
            pub id: u64,
            #[serde(default)]
            pub lead: Option<String>,
        }

        #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
        #[workflow(name = "assign", version = 2)]
        pub enum Assign {
            #[initial]
            #[next(Done)]
            Pending { owner: Owner },
            #[terminal]
            Done,
        }
    }

    #[allow(dead_code, reason = "only their schemas are compared")]
    pub mod retyped {
        use super::*;

        #[derive(loops::Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
        pub struct Owner {
            pub name: String,
            pub team: Team,
        }

        #[derive(loops::Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
        pub struct Team {
            pub id: String,
        }

        #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
        #[workflow(name = "assign", version = 2)]
        pub enum Assign {
            #[initial]
            #[next(Done)]
            Pending { owner: Owner },
            #[terminal]
            Done,
        }
    }

    #[test]
    fn a_widened_number_and_a_defaulted_field_are_compatible_a_retyped_field_is_not() {
        let widened = schema_diff(v1n::Assign::SCHEMA, widened::Assign::SCHEMA);
        assert!(
            widened.iter().all(|c| c.class == Class::Compatible),
            "{widened}"
        );
        let retyped = schema_diff(v1n::Assign::SCHEMA, retyped::Assign::SCHEMA);
        let breaking: Vec<&str> = retyped
            .iter()
            .filter(|c| c.class == Class::Breaking)
            .map(|c| c.text.as_str())
            .collect();
        assert_eq!(breaking.len(), 1, "{retyped}");
        assert!(breaking[0].contains("owner.team.id"), "{retyped}");
    }
}
