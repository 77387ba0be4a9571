//! One module per subcommand (or pair of related subcommands).

pub mod check;
pub mod graph;
pub mod history;
pub mod prune;
pub mod runs;
pub mod schedules;
pub mod schema;
pub mod show;
pub mod steer;
pub mod tree;
pub mod upgrade;

use std::future::Future;

use crate::failure::{Failure, Result};

/// Runs `future` to completion on a single-threaded tokio runtime (the runtime's API is
/// async; the CLI does one thing at a time).
pub fn block_on<F: Future>(future: F) -> Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(format!("cannot start the async runtime: {e}")))?;
    Ok(rt.block_on(future))
}
