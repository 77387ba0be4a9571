//! Test helpers for code outside loops-core: a [`Context`] that needs no run.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::run::context::{Context, RunScope};
use crate::run::settings::{DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_PARK_THRESHOLD, LeaseClock};
use crate::store::redb::RedbStore;

/// A context for tests outside loops-core, which cannot build one otherwise: re-exported as
/// `loops::__for_tests` with the feature `test-util`. Its store is in memory and holds no
/// run, so steps fail with [`Error::RunNotFound`](crate::Error::RunNotFound). Not a public
/// API.
///
/// # Panics
/// If redb cannot create an in-memory database (it allocates nothing up front).
#[doc(hidden)]
#[allow(clippy::expect_used)]
pub fn __for_tests(run_id: impl Into<String>, seq: u64, attempt: u32) -> Context {
    let store = RedbStore::in_memory().expect("an in-memory redb database");
    let run_id = run_id.into();
    // The store's own lease of the run (a fresh store holds none), so that its writes are
    // refused for the missing run rather than for the lease.
    let lease = store
        .acquire_now(&run_id)
        .expect("a fresh store's lease is free");
    let scope = RunScope {
        lease,
        clock: LeaseClock::none(&run_id),
        run_id,
        workflow: "test",
        key_nonce: None,
        schema: "",
        store: Arc::new(store),
        cancel: CancellationToken::new(),
        max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        park_threshold: DEFAULT_PARK_THRESHOLD,
        limits: Arc::default(),
        time: crate::clock::Clock::system(),
        observer: None,
        log_texts: true,
        kin: None,
    };
    Context::new(Arc::new(scope), "test", seq, attempt, 0, Vec::new())
}
