//! What a case is given (a [`Factory`] of stores) and how it ends (an [`Outcome`]).

use std::sync::Arc;

use crate::store::{BoxFuture, Store};

/// Gives a case its store: a fresh, empty one per case, and for a store shared by several
/// workers, a second handle on the same data.
///
/// Implemented for `Arc<S>` of any [`Store`] `S` with one handle (its `second` is `None`).
pub trait Factory: Sync {
    /// The store under test. Every call returns a handle on the same data.
    fn store(&self) -> Arc<dyn Store>;

    /// A second handle on the same data, as another worker would open it; `None` for a store
    /// that one process owns. A store whose leases lapse ([`Store::lease_ttl`] is `Some`)
    /// must give one: the cases of leases, fencing and claims fail without it.
    fn second(&self) -> BoxFuture<'_, Option<Arc<dyn Store>>> {
        Box::pin(async { None })
    }
}

impl<S: Store> Factory for Arc<S> {
    fn store(&self) -> Arc<dyn Store> {
        Arc::clone(self) as Arc<dyn Store>
    }
}

/// How a case ended, when it did not fail (a failing case panics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every assertion of the case held.
    Passed,
    /// The case does not apply to this store, for the reason given (nothing was asserted).
    Skipped(&'static str),
}
