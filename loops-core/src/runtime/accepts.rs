//! The check of registered versions' claims to accept older schemas
//! ([`Workflow::ACCEPTS`](crate::Workflow::ACCEPTS)) against the store's descriptions of
//! them: once per version and runtime, on any store, for the versions registered or
//! declared ([`RuntimeBuilder::workflow`](crate::RuntimeBuilder::workflow)) when the store
//! opens ([`RuntimeBuilder::open`](crate::RuntimeBuilder::open), redb) and when the runtime
//! resumes its runs ([`Runtime::resume_all`], and so [`Runtime::serve`]: a store given to
//! [`RuntimeBuilder::build`](crate::RuntimeBuilder::build), such as PostgreSQL's, and
//! versions registered after the open), and for the version a caller drives a run with
//! ([`Runtime::run`]) before its first run.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::PoisonError;

use crate::error::{Error, Result};
use crate::route::KnownVersion;
use crate::runtime::handle::Runtime;
use crate::schema::SchemaHash;
use crate::workflow::Workflow;

impl Runtime {
    /// Checks the claims of every registered or declared version not checked yet, reading
    /// the descriptions from the runtime's store ([`judge_accepts`](Self::judge_accepts)).
    ///
    /// # Errors
    /// As [`judge_accepts`](Self::judge_accepts); the store's read errors.
    pub(crate) async fn check_accepts(&self) -> Result<()> {
        self.check_claims(self.unchecked_claims()).await
    }

    /// Checks the claim of `W`, the version a caller drives a run with
    /// ([`run`](Self::run)), if it makes one and was not checked yet: a version neither
    /// registered nor declared is checked before its first run is driven.
    ///
    /// # Errors
    /// As [`judge_accepts`](Self::judge_accepts); the store's read errors.
    pub(crate) async fn check_accepts_of<W: Workflow>(&self) -> Result<()> {
        let known = KnownVersion::of::<W>();
        if known.accepts.is_empty() || self.checked(known.stored.hash) {
            return Ok(());
        }
        self.check_claims(vec![(W::NAME.to_owned(), known)]).await
    }

    /// [`judge_accepts`](Self::judge_accepts) of `claims`, the descriptions read from the
    /// store first.
    async fn check_claims(&self, claims: Vec<(String, KnownVersion)>) -> Result<()> {
        let mut stored = BTreeMap::new();
        for (_, known) in &claims {
            for &hash in known.accepts {
                if let Entry::Vacant(entry) = stored.entry(hash) {
                    entry.insert(self.store().schema(hash).await?);
                }
                // A schema the store does not hold: also under its hash pinned, in case the
                // claim names it before loops' format is folded in (see `judge_accepts`).
                if stored.get(&hash).is_some_and(Option::is_none)
                    && let Entry::Vacant(entry) = stored.entry(hash.pinned())
                {
                    entry.insert(self.store().schema(hash.pinned()).await?);
                }
            }
        }
        self.judge_accepts(claims, |hash| Ok(stored.get(&hash).cloned().flatten()))
    }

    /// Checks `claims` (versions with their workflows' names), with `stored` giving the
    /// store's description of a schema (`None`: the store has never seen it, so has no run
    /// to accept, and the claim is not checked; logged at WARN if the store holds the schema
    /// under the claim's hash pinned, [`SchemaHash::pinned`]: a claim that names the
    /// derive's `SCHEMA_HASH` instead of the stored hash). A claim whose changes break a run only in
    /// some states stands, and is logged at WARN with those changes (a run in such a state
    /// is blocked when it is routed; said here so that a deploy hears of it before the first
    /// block). A version whose claims held is not checked again.
    ///
    /// # Errors
    /// [`Error::AcceptsRefused`], with the breaking changes, for the first wrong claim
    /// (its version stays unchecked: the next check refuses it again); `stored`'s errors.
    pub(crate) fn judge_accepts(
        &self,
        claims: Vec<(String, KnownVersion)>,
        mut stored: impl FnMut(SchemaHash) -> Result<Option<String>>,
    ) -> Result<()> {
        for (workflow, known) in claims {
            for &accepts in known.accepts {
                let Some(description) = stored(accepts)? else {
                    // A hash before loops' format is folded in (the derive's `SCHEMA_HASH`
                    // printed and pasted into `accepts`) names a schema no run can have; if
                    // the store holds it under its stored hash, say so now, at the open,
                    // before its runs are blocked when routed.
                    let pinned = accepts.pinned();
                    if pinned != accepts && stored(pinned)?.is_some() {
                        tracing::warn!(
                            workflow,
                            version = known.stored.version,
                            accepts = %accepts,
                            stored = %pinned,
                            "a claim to accept an older schema names a hash no run can have: the store holds that schema as {pinned}; `accepts` takes the hash `loops schema` lists (`SCHEMA_HASH.pinned()` in code, not `SCHEMA_HASH`)"
                        );
                    }
                    continue;
                };
                match known.check_accepts(Some(&description)) {
                    Err(changes) => {
                        return Err(Error::AcceptsRefused {
                            workflow,
                            version: known.stored.version,
                            accepts,
                            changes,
                        });
                    }
                    Ok(diff) => {
                        let partly = diff.breaking(|_| true);
                        if !partly.is_empty() {
                            tracing::warn!(
                                workflow,
                                version = known.stored.version,
                                accepts = %accepts,
                                changes = %partly,
                                "a claim to accept an older schema holds only for runs in some states: its runs in the states these changes name will be blocked, unless a registered migration from that schema takes them (a migration is tried before a claim; see docs/evolution.md)"
                            );
                        }
                    }
                }
            }
            self.inner
                .accepts_checked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(known.stored.hash);
        }
        Ok(())
    }

    /// Whether the version with schema `hash` had its claims checked.
    fn checked(&self, hash: SchemaHash) -> bool {
        self.inner
            .accepts_checked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&hash)
    }

    /// The registered and declared versions that claim to accept a schema and were not
    /// checked yet, each once, with their workflows' names.
    pub(crate) fn unchecked_claims(&self) -> Vec<(String, KnownVersion)> {
        let mut claims: Vec<(String, KnownVersion)> = self.registry(|r| {
            r.versions()
                .map(|(workflow, known)| (workflow.to_owned(), *known))
                .collect()
        });
        let declared = self.inner.config.checks.iter();
        claims.extend(declared.map(|check| (check.workflow.to_owned(), check.version)));
        let mut seen = std::collections::HashSet::new();
        claims.retain(|(_, known)| {
            !known.accepts.is_empty()
                && !self.checked(known.stored.hash)
                && seen.insert(known.stored.hash)
        });
        claims
    }
}
