//! The context a handler receives: run identity, journaled steps, idempotency keys.

/// What a state handler receives besides the state's data.
#[derive(Debug)]
pub struct Context {
    run_id: String,
    seq: u64,
    attempt: u32,
}

impl Context {
    /// The run being driven.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }
    /// The sequence number of the state being handled (0 for the initial state).
    pub fn seq(&self) -> u64 {
        self.seq
    }
    /// Which attempt at handling this state this is, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// A context for tests outside loops-core, which cannot build one otherwise: re-exported as
/// `loops::__private::__for_tests`. Not a public API.
#[doc(hidden)]
pub fn __for_tests(run_id: impl Into<String>, seq: u64, attempt: u32) -> Context {
    Context {
        run_id: run_id.into(),
        seq,
        attempt,
    }
}
