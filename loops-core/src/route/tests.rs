//! The routing rule on four versions of one workflow: each rule, and their order.

use loops_derive::Workflow;
use serde::{Deserialize, Serialize};

use super::*;
use crate::schema::Class;
use crate::{BoxError, Migrate};

#[allow(
    dead_code,
    reason = "never driven: the generated `{V}Next` enums go unused"
)]
mod v1 {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "job", version = 1, crate = crate)]
    pub enum Job {
        #[initial]
        #[next(Work)]
        Start { n: u32 },
        #[next(Done)]
        Work { n: u32 },
        #[terminal]
        Done,
    }
}

/// Compatible with v1: a field with a default.
#[allow(
    dead_code,
    reason = "never driven: the generated `{V}Next` enums go unused"
)]
mod v2 {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "job", version = 2, crate = crate)]
    pub enum Job {
        #[initial]
        #[next(Work)]
        Start {
            n: u32,
            #[serde(default)]
            note: String,
        },
        #[next(Done)]
        Work { n: u32 },
        #[terminal]
        Done,
    }
}

/// Compatible with v2 while no run is in `Work`, which it removes.
#[allow(
    dead_code,
    reason = "never driven: the generated `{V}Next` enums go unused"
)]
mod v3 {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "job", version = 3, crate = crate)]
    pub enum Job {
        #[initial]
        #[next(Done)]
        Start {
            n: u32,
            #[serde(default)]
            note: String,
        },
        #[terminal]
        Done,
    }

    impl Migrate<super::v2::Job> for Job {
        fn migrate(old: super::v2::Job) -> Result<Self, BoxError> {
            Ok(match old {
                super::v2::Job::Start { n, note } => Job::Start { n, note },
                super::v2::Job::Work { .. } | super::v2::Job::Done => Job::Done,
            })
        }
    }
}

/// Breaking for v3: a field retyped.
#[allow(
    dead_code,
    reason = "never driven: the generated `{V}Next` enums go unused"
)]
mod v4 {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "job", version = 4, crate = crate)]
    pub enum Job {
        #[initial]
        #[next(Done)]
        Start { n: String },
        #[terminal]
        Done,
    }
}

/// Breaking for v1: a field added that must be present.
#[allow(
    dead_code,
    reason = "never driven: the generated `{V}Next` enums go unused"
)]
mod v2_required {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "job", version = 1, crate = crate)]
    pub enum Job {
        #[initial]
        #[next(Work)]
        Start { n: u32, note: String },
        #[next(Done)]
        Work { n: u32 },
        #[terminal]
        Done,
    }
}

fn version<W: Workflow>(accepts: &[SchemaHash]) -> KnownVersion {
    KnownVersion {
        accepts: Box::leak(accepts.to_vec().into_boxed_slice()),
        ..KnownVersion::of::<W>()
    }
}

fn h<W: Workflow>() -> SchemaHash {
    W::SCHEMA_HASH.pinned()
}

fn run<W: Workflow>(state: &'static str) -> StoredRun<'static> {
    StoredRun {
        workflow: "job",
        schema: h::<W>(),
        state,
        description: Some(W::SCHEMA),
    }
}

#[test]
fn a_compiled_version_with_the_runs_schema_drives_it_even_when_a_migration_exists() {
    let known = [version::<v2::Job>(&[]), version::<v3::Job>(&[])];
    let migrations = [Migration::of::<v2::Job, v3::Job>()];
    match route(&run::<v2::Job>("Work"), &known, &migrations) {
        Route::Drive(version) => assert_eq!((version.version, version.hash), (2, h::<v2::Job>())),
        other => panic!("expected Drive, got {other:?}"),
    }
}

#[test]
fn without_the_runs_version_a_migration_takes_it() {
    let known = [version::<v3::Job>(&[h::<v2::Job>()])];
    let migrations = [Migration::of::<v2::Job, v3::Job>()];
    // Migrate comes before Accept, even for a run Accept would take.
    match route(&run::<v2::Job>("Start"), &known, &migrations) {
        Route::Migrate(chain) => {
            assert_eq!((chain.from().version, chain.to().version), (2, 3));
        }
        other => panic!("expected Migrate, got {other:?}"),
    }
}

#[test]
fn a_version_that_accepts_the_schema_drives_runs_the_changes_do_not_stop() {
    let known = [version::<v2::Job>(&[h::<v1::Job>()])];
    match route(&run::<v1::Job>("Start"), &known, &[]) {
        Route::Accept { version, changes } => {
            assert_eq!(version.version, 2);
            assert!(changes.is_compatible(|_| true), "{changes}");
            assert!(!changes.is_empty());
        }
        other => panic!("expected Accept, got {other:?}"),
    }
    // v3 removes `Work`: accepted for a run in `Start`, not for one in `Work`.
    let known = [version::<v3::Job>(&[h::<v2::Job>()])];
    assert!(matches!(
        route(&run::<v2::Job>("Start"), &known, &[]),
        Route::Accept { .. }
    ));
    let Route::Block(blocked) = route(&run::<v2::Job>("Work"), &known, &[]) else {
        panic!("a run in a removed state must be blocked");
    };
    assert_eq!(
        blocked.reason,
        format!(
            "version 3 ({}) accepts schema {}, but these changes stop a run in state `Work`",
            h::<v3::Job>(),
            h::<v2::Job>()
        )
    );
    assert_eq!(blocked.changes.len(), 1, "{}", blocked.changes);
    // Classed for this run, which is in `Work`: breaking, and the text says so.
    assert_eq!(blocked.changes.changes()[0].class, Class::Breaking);
    assert_eq!(
        blocked.changes.to_string(),
        "state `Work` removed (breaking: a pending run in it could not be resumed (a state no \
         pending run is in may go); this run is in `Work`)"
    );
}

#[test]
fn a_claim_to_accept_a_breaking_change_is_refused_with_the_change() {
    let v4 = version::<v4::Job>(&[h::<v3::Job>()]);
    let breaking = v4.check_accepts(Some(v3::Job::SCHEMA)).unwrap_err();
    assert_eq!(
        breaking.texts(),
        [
            "state `Start`: field `n` changed from `u32` to `String`",
            "state `Start`: field `note: String (default)` removed",
        ]
    );
    assert!(breaking.iter().all(|c| c.class == Class::Breaking));
    // A claim whose stored description is missing cannot be checked: refused.
    assert!(v4.check_accepts(None).is_err());
    // A compatible claim passes, with its changes; one that depends on pending runs too.
    let v2 = version::<v2::Job>(&[h::<v1::Job>()]);
    assert!(!v2.check_accepts(Some(v1::Job::SCHEMA)).unwrap().is_empty());
    let v3 = version::<v3::Job>(&[h::<v2::Job>()]);
    assert!(v3.check_accepts(Some(v2::Job::SCHEMA)).is_ok());
    // Routed, the breaking claim blocks every run.
    let Route::Block(blocked) = route(&run::<v3::Job>("Start"), &[v4], &[]) else {
        panic!("expected Block");
    };
    assert_eq!(blocked.changes, breaking);
}

#[test]
fn an_unknown_schema_is_blocked_with_what_changed_to_the_newest_version() {
    let known = [version::<v2::Job>(&[]), version::<v3::Job>(&[])];
    let Route::Block(blocked) = route(&run::<v1::Job>("Start"), &known, &[]) else {
        panic!("expected Block");
    };
    // Every change is compatible for a run in `Start`: the reason names the step left.
    assert_eq!(
        blocked.reason,
        format!(
            "no compiled version of `job` has schema {h1}, accepts it, or has a migration from it; \
             every change to version 3 is compatible: list the schema in its `accepts = [\"{h1}\"]` \
             to drive the run as it is",
            h1 = h::<v1::Job>()
        )
    );
    let diff = SchemaDiff::of_mismatch(Some(v1::Job::SCHEMA), v3::Job::SCHEMA);
    assert_eq!(blocked.changes, diff.for_run_in("Start"));
    // The changes are classed for the run's state: `Work`'s removal does not stop a run in
    // `Start`, and does stop one in `Work`.
    let removed = |changes: &SchemaDiff| {
        changes
            .iter()
            .find(|c| c.text == "state `Work` removed")
            .map(|c| (c.class.clone(), c.reason.clone()))
    };
    let reason = "a pending run in it could not be resumed (a state no pending run is in may go)";
    assert_eq!(
        removed(&diff),
        Some((
            Class::IfNoPendingRun {
                state: "Work".into()
            },
            reason.to_owned()
        ))
    );
    assert_eq!(
        removed(&blocked.changes),
        Some((
            Class::Compatible,
            format!("{reason}; this run is not in `Work`")
        ))
    );
    let Route::Block(in_work) = route(&run::<v1::Job>("Work"), &known, &[]) else {
        panic!("expected Block");
    };
    assert_eq!(
        removed(&in_work.changes),
        Some((Class::Breaking, format!("{reason}; this run is in `Work`")))
    );
    // A change stops this one: `accepts` alone would not drive it, and the reason says no more.
    assert_eq!(
        in_work.reason,
        format!(
            "no compiled version of `job` has schema {}, accepts it, or has a migration from it",
            h::<v1::Job>()
        )
    );
    // No stored description: still a change that says so.
    let mut bare = run::<v1::Job>("Start");
    bare.description = None;
    let Route::Block(blocked) = route(&bare, &known, &[]) else {
        panic!("expected Block");
    };
    assert_eq!(blocked.changes.len(), 1);
    // No version compiled at all.
    let Route::Block(blocked) = route(&run::<v1::Job>("Start"), &[], &[]) else {
        panic!("expected Block");
    };
    assert_eq!(blocked.reason, "this build compiles no version of `job`");
    assert!(blocked.changes.is_empty());
}

#[test]
fn a_field_added_that_must_be_present_names_both_steps_with_the_old_schema() {
    let h1 = h::<v1::Job>();
    let known = [version::<v2_required::Job>(&[])];
    let Route::Block(blocked) = route(&run::<v1::Job>("Start"), &known, &[]) else {
        panic!("expected Block");
    };
    assert_eq!(
        blocked.changes.to_string(),
        format!(
            "state `Start`: field `note: String` added (breaking: records written before lack \
             it; give it `#[serde(default)]` or make it an `Option`, then list the old schema \
             in the workflow's `accepts = [\"{h1}\"]`)"
        )
    );
    // With another breaking change, `accepts` would still be refused: no hint.
    let known = [version::<v2_required::Job>(&[])];
    let Route::Block(mixed) = route(&run::<v4::Job>("Start"), &known, &[]) else {
        panic!("expected Block");
    };
    let reasons: Vec<&str> = mixed.changes.iter().map(|c| c.reason.as_str()).collect();
    assert!(
        reasons.contains(
            &"records written before lack it; give it `#[serde(default)]` or make it an `Option`"
        ) && reasons.iter().all(|r| !r.contains("accepts")),
        "{}",
        mixed.changes
    );
    // Not compatible yet: the reason does not offer `accepts` alone.
    assert_eq!(
        blocked.reason,
        format!(
            "no compiled version of `job` has schema {h1}, accepts it, or has a migration from it"
        )
    );
    // A version that accepts the schema and still cannot take the run: the claim is there,
    // so the change says only what to fix.
    let known = [version::<v2_required::Job>(&[h1])];
    let Route::Block(blocked) = route(&run::<v1::Job>("Start"), &known, &[]) else {
        panic!("expected Block");
    };
    assert_eq!(
        blocked.changes.changes()[0].reason,
        "records written before lack it; give it `#[serde(default)]` or make it an `Option`"
    );
    // The error a caller gets for such a run carries the changes and what to do.
    let mismatch = |changes: SchemaDiff| crate::Error::SchemaMismatch {
        run_id: "r1".into(),
        workflow: "job".into(),
        stored: h1,
        compiled: h::<v2::Job>(),
        changes,
    };
    let compatible = SchemaDiff::of_mismatch(Some(v1::Job::SCHEMA), v2::Job::SCHEMA);
    assert_eq!(
        mismatch(compatible.clone()).to_string(),
        format!(
            "run `r1` of workflow `job` was recorded with schema {h1} but this build has {}; \
             refusing to read its records, to resume it or to report its end; changes: {compatible} (every change is compatible: list the \
             old schema in the workflow's `accepts = [\"{h1}\"]` to drive the run as it is; or \
             keep the old version registered, or write a migration: see docs/evolution.md)",
            h::<v2::Job>()
        )
    );
}
