//! loops-core: the runtime, the redb store and the traits of loops.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod context;
pub mod record;
pub mod schema;
pub mod workflow;

pub use context::Context;
pub use schema::{Schema, SchemaHash, schema_diff};
pub use workflow::{BoxError, Dispatch, StateId, Workflow};

/// Items used by code that `#[derive(Workflow)]` generates. Not a public API: no stability
/// promise, may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use serde;

    pub use crate::context::__for_tests;
    pub use crate::schema::__describe::{describe, describe_len, utf8};

    /// The error a dispatch of a terminal state returns (the runtime never dispatches one).
    pub fn terminal_dispatched(workflow: &'static str, state: &'static str) -> crate::BoxError {
        format!("workflow `{workflow}`: state `{state}` is terminal and has no handler").into()
    }
}
