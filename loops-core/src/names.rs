//! The rules for the names a caller chooses: run ids, step and event names, idempotency keys.

use crate::error::{Error, Result};

/// Longest run id, in bytes.
pub const MAX_RUN_ID_BYTES: usize = 256;

/// Longest step or event name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Prefix of the step names loops records for sleeps and waits; user step names may not start
/// with it.
pub const RESERVED_PREFIX: &str = "loops:";

/// The event a child run's end sends to its parent, in the commit that ends the child (its
/// payload: `{"child": CHILD_ID}`): what wakes a parent waiting to join its children
/// ([`Context::join_child`](crate::Context::join_child)).
pub const CHILD_ENDED: &str = "loops:child-ended";

/// Checks a run id: not empty, at most [`MAX_RUN_ID_BYTES`] bytes, no control characters, no
/// white space at either end (any other Unicode is accepted).
///
/// # Errors
/// [`Error::InvalidRunId`](crate::Error::InvalidRunId) saying which rule the id breaks.
pub fn validate_run_id(run_id: &str) -> Result<()> {
    let reason = if run_id.is_empty() {
        "empty"
    } else if run_id.len() > MAX_RUN_ID_BYTES {
        "longer than 256 bytes"
    } else if run_id.chars().any(char::is_control) {
        "contains control characters"
    } else if run_id.starts_with(char::is_whitespace) || run_id.ends_with(char::is_whitespace) {
        "starts or ends with white space"
    } else {
        return Ok(());
    };
    Err(Error::InvalidRunId {
        run_id: run_id.to_owned(),
        reason,
    })
}

/// Checks a step or event name: not empty, at most [`MAX_NAME_BYTES`], no control characters.
pub(crate) fn validate_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() {
        Err("empty")
    } else if name.len() > MAX_NAME_BYTES {
        Err("longer than 256 bytes")
    } else if name.chars().any(char::is_control) {
        Err("contains control characters")
    } else {
        Ok(())
    }
}
