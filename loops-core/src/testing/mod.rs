//! A test kit for workflows (feature `testing`): a manual clock, waits for a run's state,
//! a store that sees every write, and a crash explorer that stops a run at each of its
//! boundaries and checks that it resumes to the same end. See `docs/testing.md`.
//!
//! - [`ManualClock`] and [`RuntimeBuilder::clock`](crate::RuntimeBuilder::clock): sleeps,
//!   wait deadlines, retry back-offs and time-outs end when the test advances the clock.
//! - [`Runtime::wait_until`](crate::Runtime::wait_until),
//!   [`wait_for_state`](crate::Runtime::wait_for_state),
//!   [`wait_for_status`](crate::Runtime::wait_for_status): wait for a run, with a time-out
//!   whose error names the run's last status, state and seq. Events are sent with
//!   [`Runtime::send`](crate::Runtime::send).
//! - [`explore`] and [`Explorer`]: the crash explorer.
//! - [`HookedStore`]: any store, with every write logged, and failed or stopped by a hook;
//!   the hook sees reads, claims and lease renewals too ([`Call`]).
//!
//! Users reach it as `loops::testing`, whose documentation has runnable examples.

mod child;
mod compare;
mod explore;
mod report;
mod store;
mod wait;

pub use crate::clock::{Clock, ManualClock};
pub use crate::run::settings::StepRun;
pub use explore::{Explorer, explore};
pub use report::ONLY_ENV;
pub use report::{Boundary, Exploration, ExploreError, Finding, When};
pub use store::{Call, HookedStore, Verdict, WriteHook, WriteSeen};
pub use wait::{DEFAULT_WAIT_TIMEOUT, LastSeen, WaitError};
