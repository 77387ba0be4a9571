//! The runtime: drives runs from their last recorded state to a terminal state, one at a
//! time on the caller's task or many in the background.
//!
//! `handle` holds [`Runtime`] and what its clones share; `claims` which runs it drives;
//! `scheduler` its background tasks and timers; `registered` the drivers of registered
//! workflows. The public operations are `impl Runtime` blocks in `builder`, `runs`,
//! `requests`, `queries`, `schedules` and `serve`. Every file imports `handle` or nothing of this folder;
//! `handle` imports none of them but `claims` and `scheduler`.

mod accepts;
mod builder;
mod children;
mod claims;
mod evolve;
mod gauges;
mod handle;
mod queries;
mod registered;
mod requests;
mod retention;
mod runs;
mod scheduler;
mod schedules;
mod serve;

pub use builder::RuntimeBuilder;
pub use evolve::Routed;
pub use gauges::DEFAULT_METRICS_INTERVAL;
pub use handle::Runtime;
pub use requests::{MAX_CANCEL_REASON_BYTES, Sent, check_cancel_reason, check_event};
pub use retention::DEFAULT_RETENTION_INTERVAL;
pub use runs::{Resumed, StartOptions};
pub use schedules::ScheduleStatus;
pub use serve::Drained;
