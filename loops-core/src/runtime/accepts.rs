//! The check of registered versions' claims to accept older schemas
//! ([`Workflow::ACCEPTS`](crate::Workflow::ACCEPTS)) against the store's descriptions of
//! them: once per version and runtime, on any store, when the store opens
//! ([`RuntimeBuilder::open`](crate::RuntimeBuilder::open), redb) and when the runtime
//! resumes its runs ([`Runtime::resume_all`], and so [`Runtime::serve`]: a store given to
//! [`RuntimeBuilder::build`](crate::RuntimeBuilder::build), such as PostgreSQL's, and
//! versions registered after the open).

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::PoisonError;

use crate::error::{Error, Result};
use crate::route::KnownVersion;
use crate::runtime::handle::Runtime;
use crate::schema::SchemaHash;

impl Runtime {
    /// Checks the claims of every registered version not checked yet, reading the
    /// descriptions from the runtime's store ([`judge_accepts`](Self::judge_accepts)).
    ///
    /// # Errors
    /// As [`judge_accepts`](Self::judge_accepts); the store's read errors.
    pub(crate) async fn check_accepts(&self) -> Result<()> {
        let mut stored = BTreeMap::new();
        for (_, known) in self.unchecked_claims() {
            for &hash in known.accepts {
                if let Entry::Vacant(entry) = stored.entry(hash) {
                    entry.insert(self.store().schema(hash).await?);
                }
            }
        }
        self.judge_accepts(|hash| Ok(stored.get(&hash).cloned().flatten()))
    }

    /// Checks the claims of every registered version not checked yet, with `stored`
    /// giving the store's description of a schema (`None`: the store has never seen it,
    /// so has no run to accept, and the claim is not checked). A claim whose changes break
    /// a run only in some states stands, and is logged at WARN with those changes (a run
    /// in such a state is blocked when it is routed; said here so that a deploy hears of it
    /// before the first block). A version whose claims held is not checked again.
    ///
    /// # Errors
    /// [`Error::AcceptsRefused`], with the breaking changes, for the first wrong claim
    /// (its version stays unchecked: the next check refuses it again); `stored`'s errors.
    pub(crate) fn judge_accepts(
        &self,
        mut stored: impl FnMut(SchemaHash) -> Result<Option<String>>,
    ) -> Result<()> {
        for (workflow, known) in self.unchecked_claims() {
            for &accepts in known.accepts {
                let Some(description) = stored(accepts)? else {
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
                                "a claim to accept an older schema holds only for runs in some states: its runs in the states these changes name will be blocked (see docs/evolution.md)"
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

    /// The registered versions that claim to accept a schema and were not checked yet,
    /// with their workflows' names.
    fn unchecked_claims(&self) -> Vec<(String, KnownVersion)> {
        let checked = self
            .inner
            .accepts_checked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        self.registry(|r| {
            r.versions()
                .filter(|(_, known)| {
                    !known.accepts.is_empty() && !checked.contains(&known.stored.hash)
                })
                .map(|(workflow, known)| (workflow.to_owned(), *known))
                .collect()
        })
    }
}
