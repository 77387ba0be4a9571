//! Migrations of three versions of one workflow, and of a second workflow beside them.

use loops_derive::Workflow;
use serde::{Deserialize, Serialize};

use crate::{BoxError, Migrate, Migration, MigrationFailure, SchemaHash, StoredVersion, Workflow};

/// Version 1: a count.
mod v1 {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "job", version = 1, crate = crate)]
    pub enum Job {
        #[initial]
        #[next(Done)]
        Start { n: u32 },
        #[terminal]
        Done { total: u32 },
    }
}

/// Version 2: the count widened, a label added.
mod v2 {
    use super::*;

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "job", version = 2, crate = crate)]
    pub enum Job {
        #[initial]
        #[next(Done)]
        Start { n: u64, label: String },
        #[terminal]
        Done { total: u64 },
    }

    impl Migrate<v1::Job> for Job {
        fn migrate(old: v1::Job) -> Result<Self, BoxError> {
            Ok(match old {
                v1::Job::Start { n } => Job::Start {
                    n: n.into(),
                    label: format!("job of {n}"),
                },
                v1::Job::Done { total } => Job::Done {
                    total: total.into(),
                },
            })
        }
    }
}

/// Version 3: a state split in two (`Start` becomes `Queued` or `Big`).
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "job", version = 3, crate = crate)]
enum Job {
    #[initial]
    #[next(Big, Done)]
    Queued { n: u64, label: String },
    #[next(Done)]
    Big { n: u64, label: String },
    #[terminal]
    Done { total: u64 },
}

impl Migrate<v2::Job> for Job {
    fn migrate(old: v2::Job) -> Result<Self, BoxError> {
        match old {
            v2::Job::Start { n: 13, .. } => Err("13 is not migrated".into()),
            v2::Job::Start { n: 666, .. } => panic!("666 panics"),
            v2::Job::Start { n, label } if n > 100 => Ok(Job::Big { n, label }),
            v2::Job::Start { n, label } => Ok(Job::Queued { n, label }),
            v2::Job::Done { total } => Ok(Job::Done { total }),
        }
    }
}

/// Another workflow whose own migration must never be taken for one of `job`'s.
#[allow(
    dead_code,
    reason = "never driven: the generated `BeginNext` enums go unused"
)]
mod other {
    use super::*;
    pub use old::Other;

    mod old {
        use super::*;

        #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
        #[workflow(name = "other", version = 1, crate = crate)]
        pub enum Other {
            #[initial]
            #[next(End)]
            Begin,
            #[terminal]
            End,
        }
    }

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "other", version = 2, crate = crate)]
    pub enum Other2 {
        #[initial]
        #[next(End)]
        Begin,
        #[terminal]
        End,
    }

    impl Migrate<Other> for Other2 {
        fn migrate(old: Other) -> Result<Self, BoxError> {
            Ok(match old {
                Other::Begin => Other2::Begin,
                Other::End => Other2::End,
            })
        }
    }
}

fn h1() -> SchemaHash {
    v1::Job::SCHEMA_HASH.pinned()
}
fn h2() -> SchemaHash {
    v2::Job::SCHEMA_HASH.pinned()
}
fn h3() -> SchemaHash {
    Job::SCHEMA_HASH.pinned()
}

fn all() -> Vec<Migration> {
    vec![
        Migration::of::<other::Other, other::Other2>(),
        Migration::of::<v2::Job, Job>(),
        Migration::of::<v1::Job, v2::Job>(),
    ]
}

#[test]
fn a_migration_names_its_two_stored_versions() {
    let m = Migration::of::<v1::Job, v2::Job>();
    assert_eq!(m.workflow(), "job");
    assert_eq!(
        m.from(),
        StoredVersion {
            hash: h1(),
            version: 1,
            type_name: std::any::type_name::<v1::Job>(),
        }
    );
    assert_eq!((m.to().hash, m.to().version), (h2(), 2));
    assert_ne!(h1(), h2());
}

#[test]
fn a_migration_decodes_the_old_state_and_encodes_the_new_one() {
    let m = Migration::of::<v1::Job, v2::Job>();
    let out = m.apply(r#"{"Start":{"n":7}}"#).unwrap();
    assert_eq!(out.state, "Start");
    assert_eq!(out.payload, r#"{"Start":{"n":7,"label":"job of 7"}}"#);
    let out = m.apply(r#"{"Done":{"total":9}}"#).unwrap();
    assert_eq!(
        (out.state, out.payload.as_str()),
        ("Done", r#"{"Done":{"total":9}}"#)
    );
}

#[test]
fn a_chain_goes_to_the_newest_reachable_version_in_as_few_steps_as_possible() {
    let migrations = all();
    // Only v3 is compiled in: v1 → v2 → v3.
    let chain = Migration::path(&migrations, "job", h1(), |h| h == h3()).unwrap();
    let hops: Vec<_> = chain
        .migrations()
        .iter()
        .map(|m| (m.from().version, m.to().version))
        .collect();
    assert_eq!(hops, vec![(1, 2), (2, 3)]);
    assert_eq!((chain.from().hash, chain.to().hash), (h1(), h3()));
    // v2 and v3 compiled in: still to v3, the newest.
    let chain = Migration::path(&migrations, "job", h1(), |h| h == h2() || h == h3()).unwrap();
    assert_eq!(chain.to().version, 3);
    assert_eq!(chain.migrations().len(), 2);
    // From v2: one step.
    let chain = Migration::path(&migrations, "job", h2(), |h| h == h3()).unwrap();
    assert_eq!(chain.migrations().len(), 1);
}

#[test]
fn no_chain_for_a_schema_that_is_driven_or_cannot_be_reached() {
    let migrations = all();
    // A schema the build drives needs none.
    assert!(Migration::path(&migrations, "job", h3(), |h| h == h3()).is_none());
    // Nothing leads back from v3 to v1.
    assert!(Migration::path(&migrations, "job", h3(), |h| h == h1()).is_none());
    // An unknown schema.
    assert!(Migration::path(&migrations, "job", SchemaHash::from_u64(1), |h| h == h3()).is_none());
    // Another workflow's migrations are not `job`'s, even asked under its hashes.
    let to = other::Other2::SCHEMA_HASH.pinned();
    let from = other::Other::SCHEMA_HASH.pinned();
    assert!(Migration::path(&migrations, "job", from, |h| h == to).is_none());
    assert_eq!(
        Migration::path(&migrations, "other", from, |h| h == to)
            .unwrap()
            .migrations()
            .len(),
        1
    );
}

#[test]
fn a_chain_applies_each_migration_to_what_the_one_before_wrote() {
    let migrations = all();
    let chain = Migration::path(&migrations, "job", h1(), |h| h == h3()).unwrap();
    let small = chain.apply(r#"{"Start":{"n":7}}"#).unwrap();
    assert_eq!(small.state, "Queued");
    assert_eq!(small.payload, r#"{"Queued":{"n":7,"label":"job of 7"}}"#);
    let big = chain.apply(r#"{"Start":{"n":700}}"#).unwrap();
    assert_eq!(big.state, "Big");
    assert_eq!(
        serde_json::from_str::<Job>(&big.payload).unwrap(),
        Job::Big {
            n: 700,
            label: "job of 700".into()
        }
    );
}

#[test]
fn a_failing_migration_is_a_typed_error_that_names_both_versions() {
    let migrations = all();
    let chain = Migration::path(&migrations, "job", h1(), |h| h == h3()).unwrap();

    let err = chain.apply(r#"{"Start":{"n":13}}"#).unwrap_err();
    assert!(matches!(err.cause, MigrationFailure::Failed(_)), "{err:?}");
    assert_eq!((err.from.version, err.to.version), (2, 3));
    assert_eq!(
        err.to_string(),
        format!(
            "migration of workflow `job` from schema {} (version 2) to {} (version 3) failed: the migration returned an error",
            h2(),
            h3()
        )
    );
    let source = std::error::Error::source(&err).unwrap();
    assert_eq!(
        std::error::Error::source(source).unwrap().to_string(),
        "13 is not migrated"
    );

    let err = chain.apply(r#"{"Start":{"n":666}}"#).unwrap_err();
    match &err.cause {
        MigrationFailure::Panicked(message) => assert_eq!(message, "666 panics"),
        other => panic!("expected a panic, got {other:?}"),
    }

    // A record that is not v1's: the first migration cannot read it.
    let err = chain.apply(r#"{"Start":{"n":"seven"}}"#).unwrap_err();
    assert_eq!((err.from.version, err.to.version), (1, 2));
    assert!(
        err.to_string().ends_with(&format!(
            "failed: the stored state does not decode as `{}`",
            std::any::type_name::<v1::Job>()
        )),
        "{err}"
    );
}

#[test]
#[allow(
    dead_code,
    reason = "never driven: the generated `StartNext` goes unused"
)]
fn accepts_defaults_to_none_and_is_generated_as_written() {
    #[derive(Workflow, Serialize, Deserialize)]
    #[workflow(name = "job", version = 4, accepts = ["00000000000000ff", "5A1F00000000beef"], crate = crate)]
    enum Accepting {
        #[initial]
        #[next(Done)]
        Start,
        #[terminal]
        Done,
    }
    assert!(<Job as Workflow>::ACCEPTS.is_empty());
    assert_eq!(
        Accepting::ACCEPTS,
        &[
            SchemaHash::from_u64(0xff),
            SchemaHash::from_u64(0x5a1f_0000_0000_beef)
        ]
    );
}
