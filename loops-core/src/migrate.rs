//! Typed migrations: how a state stored by one version of a workflow becomes a state of
//! another version of the same workflow.
//!
//! A migration is a Rust function the compiler checks ([`Migrate`]): its input is the old
//! version's enum, its output the new version's, and both must be versions of one workflow
//! (the same `#[workflow(name = "...")]`). The runtime holds migrations type-erased
//! ([`Migration`]): a migration from stored schema `from` to stored schema `to`, applied to a
//! run's latest record (its JSON payload). Chains (v1 → v2 → v3) are found by
//! [`Migration::path`] and applied hop by hop ([`Chain::apply`]).

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;

use crate::panics::panic_message;
use crate::schema::SchemaHash;
use crate::workflow::{BoxError, StateId, Workflow};

/// A workflow's name as a type: `Named<H>`, where `H` is the XXH3-64 of the name, so that two
/// versions of one workflow (in two modules, with two enums) have the same `Named` type and
/// two workflows of different names do not. Used by [`Versioned`]; not an API.
#[doc(hidden)]
pub struct Named<const H: u64>;

/// Implemented only for `Named<H>: SameName<Named<H>>`: the bound that makes a migration
/// between workflows of different names fail to compile. Not an API.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "a migration goes between two versions of one workflow, and these two enums are versions of different workflows",
    label = "the two enums have different `#[workflow(name = \"...\")]`",
    note = "give both enums the same `#[workflow(name = \"...\")]` and different `version`s; runs never move from one workflow to another"
)]
pub trait SameName<Other> {}

impl<const H: u64> SameName<Named<H>> for Named<H> {}

/// A version of a workflow, implemented by `#[derive(Workflow)]` for every workflow enum: it
/// gives the compiler the workflow's name as a type, so that a [`Migrate`] impl between two
/// workflows of different names does not compile. Do not implement it by hand.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a workflow: a migration goes from one `#[derive(Workflow)]` enum to another",
    label = "not a `#[derive(Workflow)]` enum",
    note = "both sides of `impl loops::Migrate<Old> for New` are versions of one workflow, each an enum with `#[derive(Workflow)]`"
)]
pub trait Versioned: Workflow {
    /// The workflow's name as a type (`Named<xxh3(name)>`). Not an API.
    #[doc(hidden)]
    type Name;
}

/// `Self` and `Old` are versions of one workflow (the same `#[workflow(name = "...")]`):
/// implemented for exactly those pairs, and required by [`Migrate`].
pub trait SameWorkflow<Old> {}

impl<Old: Versioned, New: Versioned> SameWorkflow<Old> for New where New::Name: SameName<Old::Name> {}

/// How a state of the older version `Old` of a workflow becomes a state of this version.
///
/// Implemented on the new version's enum, for the old version's enum (kept in a module of
/// its own, with its `#[workflow(name, version)]` unchanged):
///
/// ```
/// # extern crate loops_core as loops;
/// # use loops_derive::Workflow;
/// use loops::{BoxError, Migrate};
/// use serde::{Deserialize, Serialize};
///
/// mod v1 {
///     # use loops_derive::Workflow;
///     #[derive(Workflow, serde::Serialize, serde::Deserialize)]
///     #[workflow(name = "review", version = 1)]
///     pub enum Review {
///         #[initial]
///         #[next(Published)]
///         Drafted { draft: String },
///         #[terminal]
///         Published { url: String },
///     }
/// }
///
/// #[derive(Workflow, Serialize, Deserialize, Debug, PartialEq)]
/// #[workflow(name = "review", version = 2)]
/// enum Review {
///     #[initial]
///     #[next(Published)]
///     Drafted { draft: String, reviewer: Option<String> },
///     #[terminal]
///     Published { url: String },
/// }
///
/// impl Migrate<v1::Review> for Review {
///     fn migrate(old: v1::Review) -> Result<Self, BoxError> {
///         Ok(match old {
///             v1::Review::Drafted { draft } => Review::Drafted { draft, reviewer: None },
///             v1::Review::Published { url } => Review::Published { url },
///         })
///     }
/// }
///
/// let migration = loops::Migration::of::<v1::Review, Review>();
/// let migrated = migration.apply(r#"{"Drafted":{"draft":"notes"}}"#).unwrap();
/// assert_eq!(migrated.state, "Drafted");
/// assert_eq!(migrated.payload, r#"{"Drafted":{"draft":"notes","reviewer":null}}"#);
/// ```
///
/// The compiler checks that `Old` and `Self` are two versions of one workflow (the same
/// `#[workflow(name = "...")]`): a migration to a workflow of another name, or from a type
/// that is not a workflow, does not compile. A run is migrated at its current state and
/// sequence number: the steps already recorded for that state stay valid, and their
/// idempotency keys (which depend on the workflow's name, the run, the seq and the step's
/// name) stay the same, so the new version's handler must name its steps as the old one did
/// for them to replay.
///
/// `migrate` should be a pure function of `old`: it may run more than once for the same run
/// (a crash before its result is committed), and only one result is ever committed.
#[diagnostic::on_unimplemented(
    message = "no migration from `{Old}` to `{Self}`",
    label = "`{Self}` does not implement `loops::Migrate<{Old}>`",
    note = "write `impl loops::Migrate<{Old}> for {Self} {{ fn migrate(old: {Old}) -> Result<Self, loops::BoxError> {{ .. }} }}`"
)]
pub trait Migrate<Old: Versioned>: Versioned + SameWorkflow<Old> {
    /// The state of this version that the stored state `old` becomes.
    ///
    /// # Errors
    /// Any error of yours: the run is not migrated (nothing is written) and stays blocked,
    /// with this error recorded, until a build with a migration that succeeds resumes it.
    fn migrate(old: Old) -> Result<Self, BoxError>;
}

/// A registered migration, type-erased: from the stored schema [`from`](Self::from) to
/// [`to`](Self::to) of one workflow. Built by [`Migration::of`].
#[derive(Clone, Copy)]
pub struct Migration {
    workflow: &'static str,
    from: StoredVersion,
    to: StoredVersion,
    apply: fn(&str) -> Result<Migrated, MigrationFailure>,
}

/// One side of a [`Migration`]: a version of a workflow as it is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredVersion {
    /// The schema hash stored with the version's records (pinned: with loops' record format
    /// version folded in, as [`SchemaHash::pinned`] gives it).
    pub hash: SchemaHash,
    /// The version the enum declares (`#[workflow(version = N)]`).
    pub version: u32,
    /// The enum's Rust type name, for messages.
    pub type_name: &'static str,
}

impl StoredVersion {
    /// The stored side of workflow enum `W`.
    pub fn of<W: Workflow>() -> Self {
        StoredVersion {
            hash: W::SCHEMA_HASH.pinned(),
            version: W::VERSION,
            type_name: std::any::type_name::<W>(),
        }
    }
}

/// The outcome of a migration: the new state, encoded as the new version stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The new state's name (its variant of the new version's enum), as records store it.
    pub state: &'static str,
    /// Whether the new state is terminal in the new version: the run ends with the
    /// migration's record, completed.
    pub terminal: bool,
    /// The new state, as JSON (the whole enum value, as serde serializes it): the payload
    /// of the record the runtime commits.
    pub payload: String,
}

/// Why a migration failed; nothing was written. The run stays blocked.
#[derive(Debug, thiserror::Error)]
#[error(
    "migration of workflow `{workflow}` from schema {} (version {}) to {} (version {}) failed: {cause}",
    from.hash, from.version, to.hash, to.version
)]
pub struct MigrationError {
    /// The workflow.
    pub workflow: &'static str,
    /// The version migrated from.
    pub from: StoredVersion,
    /// The version migrated to.
    pub to: StoredVersion,
    /// What went wrong.
    #[source]
    pub cause: MigrationFailure,
}

/// What went wrong in a migration (the [`cause`](MigrationError::cause) of a
/// [`MigrationError`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrationFailure {
    /// The stored state does not decode as the old version's enum: the migration is
    /// registered for a schema whose records it cannot read (a bug in a hand-written
    /// `Serialize`/`Deserialize`, or a record damaged outside loops).
    #[error("the stored state does not decode as `{type_name}`")]
    Decode {
        /// The old version's enum.
        type_name: &'static str,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
    /// `Migrate::migrate` returned an error.
    #[error("the migration returned an error")]
    Failed(#[source] BoxError),
    /// `Migrate::migrate` panicked; the message is the panic's.
    #[error("the migration panicked: {0}")]
    Panicked(String),
    /// The new state does not encode (its `Serialize` impl failed).
    #[error("the new state does not encode")]
    Encode(#[source] serde_json::Error),
}

impl Migration {
    /// The migration of `impl Migrate<Old> for New`, type-erased.
    pub fn of<Old: Versioned, New: Migrate<Old>>() -> Self {
        Migration {
            workflow: New::NAME,
            from: StoredVersion::of::<Old>(),
            to: StoredVersion::of::<New>(),
            apply: apply::<Old, New>,
        }
    }

    /// The workflow both versions belong to.
    pub fn workflow(&self) -> &'static str {
        self.workflow
    }

    /// The version this migration reads.
    pub fn from(&self) -> StoredVersion {
        self.from
    }

    /// The version this migration writes.
    pub fn to(&self) -> StoredVersion {
        self.to
    }

    /// Migrates `payload`, a stored state of [`from`](Self::from) (the whole enum value as
    /// JSON, as a transition record's `payload` holds it).
    ///
    /// # Errors
    /// [`MigrationError`]: the payload does not decode, the migration returned an error or
    /// panicked, or the new state does not encode.
    pub fn apply(&self, payload: &str) -> Result<Migrated, MigrationError> {
        (self.apply)(payload).map_err(|cause| MigrationError {
            workflow: self.workflow,
            from: self.from,
            to: self.to,
            cause,
        })
    }

    /// The chain of `migrations` that takes a run stored with schema `from` to the newest
    /// version that `target` accepts (by [`StoredVersion::version`], then by hash), through as few
    /// migrations as possible; `None` when no such version is reachable, or when `from` is
    /// accepted itself (a run whose schema the build drives needs no migration).
    ///
    /// Migrations of workflows other than `workflow` are ignored.
    pub fn path(
        migrations: &[Migration],
        workflow: &str,
        from: SchemaHash,
        target: impl Fn(SchemaHash) -> bool,
    ) -> Option<Chain> {
        if target(from) {
            return None;
        }
        let ours: Vec<&Migration> = migrations
            .iter()
            .filter(|m| m.workflow == workflow)
            .collect();
        // Breadth first from `from`: `came` maps each schema reached to the migration that
        // reached it first (so through the fewest migrations; ties go to the migration
        // registered first).
        let mut came: HashMap<SchemaHash, &Migration> = HashMap::new();
        let mut queue = VecDeque::from([from]);
        let mut best: Option<StoredVersion> = None;
        while let Some(at) = queue.pop_front() {
            for m in ours.iter().filter(|m| m.from.hash == at) {
                let to = m.to.hash;
                if to == from || came.contains_key(&to) {
                    continue;
                }
                came.insert(to, m);
                queue.push_back(to);
                if target(to) && best.is_none_or(|b| (m.to.version, to) > (b.version, b.hash)) {
                    best = Some(m.to);
                }
            }
        }
        let mut chain = Vec::new();
        let mut at = best?.hash;
        while let Some(m) = came.get(&at) {
            chain.push(**m);
            at = m.from.hash;
        }
        chain.reverse();
        Some(Chain(chain))
    }
}

/// A non-empty chain of migrations, each reading what the one before writes: what
/// [`Migration::path`] finds.
#[derive(Debug, Clone)]
pub struct Chain(Vec<Migration>);

impl Chain {
    /// The migrations, in the order they apply.
    pub fn migrations(&self) -> &[Migration] {
        &self.0
    }

    /// The version the chain starts from.
    pub fn from(&self) -> StoredVersion {
        self.0[0].from
    }

    /// The version the chain ends at.
    pub fn to(&self) -> StoredVersion {
        self.0[self.0.len() - 1].to
    }

    /// Applies every migration of the chain to `payload`, a stored state of
    /// [`from`](Self::from), in order.
    ///
    /// # Errors
    /// The [`MigrationError`] of the first migration that fails.
    pub fn apply(&self, payload: &str) -> Result<Migrated, MigrationError> {
        let mut migrated = self.0[0].apply(payload)?;
        for migration in &self.0[1..] {
            migrated = migration.apply(&migrated.payload)?;
        }
        Ok(migrated)
    }
}

impl std::fmt::Debug for Migration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Migration")
            .field("workflow", &self.workflow)
            .field("from", &self.from)
            .field("to", &self.to)
            .finish_non_exhaustive()
    }
}

/// Decodes a stored `Old`, migrates it (catching a panic), encodes the `New`.
fn apply<Old: Versioned, New: Migrate<Old>>(payload: &str) -> Result<Migrated, MigrationFailure> {
    let old: Old = serde_json::from_str(payload).map_err(|source| MigrationFailure::Decode {
        type_name: std::any::type_name::<Old>(),
        source,
    })?;
    let new = match std::panic::catch_unwind(AssertUnwindSafe(|| New::migrate(old))) {
        Ok(Ok(new)) => new,
        Ok(Err(e)) => return Err(MigrationFailure::Failed(e)),
        Err(payload) => return Err(MigrationFailure::Panicked(panic_message(&*payload))),
    };
    let payload = serde_json::to_string(&new).map_err(MigrationFailure::Encode)?;
    Ok(Migrated {
        state: new.state().name(),
        terminal: new.state().is_terminal(),
        payload,
    })
}

#[cfg(test)]
mod tests;
