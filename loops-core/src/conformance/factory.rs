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

/// The stores of another factory with every payload sealed: each handle is wrapped in the
/// sealing store a runtime with [`RuntimeBuilder::codec`](crate::RuntimeBuilder::codec)
/// drives (here with a [`Keyring`](crate::Keyring) of one fixed test key, id `conformance`),
/// so that the suite checks every store behaviour with encryption on. The store underneath
/// holds sealed payloads; the cases see them opened.
///
/// ```
/// use std::sync::Arc;
///
/// use loops_core::RedbStore;
/// use loops_core::conformance::Sealed;
///
/// // In a test file: the whole suite, on an in-memory store whose payloads are sealed.
/// loops_core::conformance_suite!(|_case| async {
///     Sealed::new(Arc::new(RedbStore::in_memory().expect("an in-memory store")))
/// });
/// # fn main() {}
/// ```
pub struct Sealed<F> {
    inner: F,
    payloads: crate::store::Payloads,
}

impl<F: Factory> Sealed<F> {
    /// `inner`'s stores, with payloads sealed by the suite's test key.
    ///
    /// # Panics
    /// Never in practice: the fixed test key is a valid key.
    pub fn new(inner: F) -> Sealed<F> {
        let keys = crate::Keyring::new("conformance", [0x5a; 32]).expect("a valid test key");
        Sealed {
            inner,
            payloads: crate::store::Payloads::new(Arc::new(keys)),
        }
    }

    fn seal(&self, store: Arc<dyn Store>) -> Arc<dyn Store> {
        Arc::new(crate::store::sealing::SealedStore::new(
            store,
            self.payloads.clone(),
        ))
    }
}

impl<F: Factory> Factory for Sealed<F> {
    fn store(&self) -> Arc<dyn Store> {
        self.seal(self.inner.store())
    }

    fn second(&self) -> BoxFuture<'_, Option<Arc<dyn Store>>> {
        Box::pin(async { self.inner.second().await.map(|store| self.seal(store)) })
    }
}
