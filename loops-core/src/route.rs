//! Which compiled version of a workflow takes a stored run: the one rule the runtime, both
//! stores' claims and the dry run follow.
//!
//! For a run stored with schema hash `h`, in order: a compiled version with hash `h` drives it
//! ([`Route::Drive`]); else a chain of migrations from `h` to a compiled version migrates it
//! ([`Route::Migrate`]); else a compiled version that lists `h` in its
//! [`Workflow::ACCEPTS`] drives it as it is, if every difference between the stored
//! description and its own is compatible for a run in the run's state ([`Route::Accept`]);
//! else the run is blocked ([`Route::Block`]), with the changes that stop it.

use crate::migrate::{Chain, Migration, StoredVersion};
use crate::schema::{SchemaDiff, SchemaHash};
use crate::workflow::Workflow;

/// A version of a workflow that a build has compiled in and registered: what [`route`] needs
/// of it.
#[derive(Debug, Clone, Copy)]
pub struct KnownVersion {
    /// The version's stored side: hash (pinned), declared version, type name.
    pub stored: StoredVersion,
    /// Its schema description ([`Workflow::SCHEMA`]).
    pub schema: &'static str,
    /// The older stored schemas it accepts ([`Workflow::ACCEPTS`]).
    pub accepts: &'static [SchemaHash],
}

impl KnownVersion {
    /// The version `W`.
    pub fn of<W: Workflow>() -> Self {
        KnownVersion {
            stored: StoredVersion::of::<W>(),
            schema: W::SCHEMA,
            accepts: W::ACCEPTS,
        }
    }

    /// Checks this version's claim to accept the stored schema whose description is
    /// `stored_schema` (`None` if the store has none): the changes from it, all compatible
    /// for some run (those compatible only while no pending run is in a state are kept: each
    /// run's [`route`] decides them).
    ///
    /// # Errors
    /// The changes that are breaking whatever state a run is in (or the missing description),
    /// when there is one: the claim is wrong, and the runtime refuses it at open.
    pub fn check_accepts(&self, stored_schema: Option<&str>) -> Result<SchemaDiff, SchemaDiff> {
        let diff = SchemaDiff::of_mismatch(stored_schema, self.schema);
        let breaking = diff.breaking(|_| false);
        if breaking.is_empty() {
            Ok(diff)
        } else {
            Err(breaking)
        }
    }
}

/// A stored run, as [`route`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct StoredRun<'a> {
    /// Its workflow's name.
    pub workflow: &'a str,
    /// The schema hash stored with it.
    pub schema: SchemaHash,
    /// The state it is in, by the name its records use.
    pub state: &'a str,
    /// The description stored for its schema; `None` if the store has none.
    pub description: Option<&'a str>,
}

/// What a build does with a stored run.
#[derive(Debug, Clone)]
pub enum Route {
    /// Drive the run under the compiled version with the run's own schema.
    Drive(StoredVersion),
    /// Migrate the run through the chain, then drive it under the chain's last version.
    Migrate(Chain),
    /// Drive the run as it is under `version`, which accepts the run's schema; `changes` are
    /// the (compatible) differences. The runtime first commits the acceptance, a record of
    /// the same state and data under `version`'s schema
    /// ([`MigratedFrom::accepted`](crate::MigratedFrom::accepted)), unless the run has ended.
    Accept {
        /// The version that drives the run.
        version: StoredVersion,
        /// What differs between the run's schema and the version's, all compatible.
        changes: SchemaDiff,
    },
    /// Leave the run alone: this build cannot drive it.
    Block(Blocked),
}

/// Why a build cannot drive a run, and what changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// One sentence: what this build knows of the run's schema.
    pub reason: String,
    /// The changes that stop the run: from the run's schema to the version that accepts it
    /// but cannot take this run, or else to the newest compiled version; empty when the
    /// build compiles no version of the workflow.
    pub changes: SchemaDiff,
}

impl std::fmt::Display for Route {
    /// One line: `drive on version 1 (hash)`, `migrate from version 1 to 2 (hash -> hash)`,
    /// `accept on version 2 (hash), compatible: ...`, `blocked: reason`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Route::Drive(v) => write!(f, "drive on version {} ({})", v.version, v.hash),
            Route::Migrate(chain) => {
                let (from, to) = (chain.from(), chain.to());
                write!(
                    f,
                    "migrate from version {} to {} ({} -> {})",
                    from.version, to.version, from.hash, to.hash
                )?;
                if chain.migrations().len() > 1 {
                    write!(f, " in {} migrations", chain.migrations().len())?;
                }
                Ok(())
            }
            Route::Accept { version, changes } => {
                write!(
                    f,
                    "accept on version {} ({})",
                    version.version, version.hash
                )?;
                if !changes.is_empty() {
                    write!(f, ", compatible: {changes}")?;
                }
                Ok(())
            }
            Route::Block(blocked) => {
                write!(f, "blocked: {}", blocked.reason)?;
                if !blocked.changes.is_empty() {
                    write!(f, "; changes: {}", blocked.changes)?;
                }
                Ok(())
            }
        }
    }
}

/// Decides what a build that compiled `known` (the versions of `run.workflow` it registered)
/// and registered `migrations` does with `run`. In order: a version with the run's schema
/// hash drives it; else a chain of migrations to a compiled version migrates it; else a
/// version that lists the hash in its [`Workflow::ACCEPTS`] drives it as it is, if no
/// difference between the stored description and its own stops a run in the run's state;
/// else the run is blocked, with the changes that stop it, classed for a run in its state
/// ([`SchemaDiff::for_run_in`]).
pub fn route(run: &StoredRun<'_>, known: &[KnownVersion], migrations: &[Migration]) -> Route {
    if let Some(k) = known.iter().find(|k| k.stored.hash == run.schema) {
        return Route::Drive(k.stored);
    }
    let compiled = |h: SchemaHash| known.iter().any(|k| k.stored.hash == h);
    if let Some(chain) = Migration::path(migrations, run.workflow, run.schema, compiled) {
        return Route::Migrate(chain);
    }
    let mut newest_first: Vec<&KnownVersion> = known.iter().collect();
    newest_first.sort_by_key(|k| std::cmp::Reverse((k.stored.version, k.stored.hash)));
    let mut refused: Option<(&KnownVersion, SchemaDiff)> = None;
    for k in newest_first
        .iter()
        .filter(|k| k.accepts.contains(&run.schema))
    {
        let diff = SchemaDiff::of_mismatch(run.description, k.schema);
        let breaking = diff.breaking(|state| state == run.state);
        if breaking.is_empty() {
            return Route::Accept {
                version: k.stored,
                changes: diff,
            };
        }
        refused.get_or_insert((k, breaking));
    }
    let blocked = match (refused, newest_first.first()) {
        (Some((k, breaking)), _) => Blocked {
            reason: format!(
                "version {} ({}) accepts schema {}, but these changes stop a run in state `{}`",
                k.stored.version, k.stored.hash, run.schema, run.state
            ),
            changes: breaking.for_run_in(run.state),
        },
        (None, Some(newest)) => {
            let changes = SchemaDiff::of_mismatch(run.description, newest.schema)
                .for_run_in(run.state)
                .with_accepts_hint(run.schema);
            let mut reason = format!(
                "no compiled version of `{}` has schema {}, accepts it, or has a migration from it",
                run.workflow, run.schema
            );
            if changes.is_compatible(|_| false) {
                // The one step left: a compatible change alone does not route the run.
                reason.push_str(&format!(
                    "; every change to version {} is compatible: list the schema in its `accepts = [\"{}\"]` to drive the run as it is",
                    newest.stored.version, run.schema
                ));
            }
            Blocked { reason, changes }
        }
        (None, None) => Blocked {
            reason: format!("this build compiles no version of `{}`", run.workflow),
            changes: SchemaDiff::default(),
        },
    };
    Route::Block(blocked)
}

#[cfg(test)]
mod tests;
