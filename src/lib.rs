//! loops: durable state machines for long-running work.
#![forbid(unsafe_code)]

pub use loops_core::*;
pub use loops_derive::{Schema, Workflow};
