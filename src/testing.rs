//! A test kit for your workflows (feature `testing`): a manual clock, waits for a run's
//! state, a store that sees every write, and a crash explorer that stops a run at each of
//! its boundaries and checks that it resumes to the same end. `docs/testing.md` in the
//! repository walks through it.
//!
//! - [`ManualClock`] and [`RuntimeBuilder::clock`](crate::RuntimeBuilder::clock): sleeps,
//!   wait deadlines, retry back-offs and step and state time-outs end when the test
//!   advances the clock, never by real waiting. The lease deadline, rate limits and the
//!   back-off after a store fault stay on real time.
//! - [`Runtime::wait_until`](crate::Runtime::wait_until),
//!   [`wait_for_state`](crate::Runtime::wait_for_state),
//!   [`wait_for_status`](crate::Runtime::wait_for_status): wait for a run, with a time-out
//!   ([`DEFAULT_WAIT_TIMEOUT`]) whose error names the run's last status, state and seq.
//!   Events are sent with [`Runtime::send`](crate::Runtime::send).
//! - [`explore`] and [`Explorer`]: the crash explorer.
//! - [`HookedStore`]: any store, with every write logged, and failed or stopped by a hook.
//!
//! A day's sleep, tested in no time:
//!
//! ```
//! use std::time::Duration;
//! use loops::testing::ManualClock;
//! use loops::{Context, RedbStore, RunStatus, Runtime, Workflow};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
//! #[workflow(name = "nap", version = 1)]
//! enum Nap {
//!     #[initial]
//!     #[next(Rested)]
//!     Tired,
//!     #[terminal]
//!     Rested,
//! }
//!
//! struct Napper;
//!
//! impl NapHandler for Napper {
//!     type Error = loops::Error;
//!     async fn tired(&self, ctx: &Context) -> Result<TiredNext, Self::Error> {
//!         ctx.sleep(Duration::from_secs(24 * 3600)).await?;
//!         Ok(TiredNext::Rested)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::starting_now();
//! let runtime = Runtime::builder()
//!     .clock(clock.clone())
//!     .register::<Nap, _>(Napper)
//!     .build(RedbStore::in_memory()?);
//! runtime.start("nap-1", Nap::Tired).await?;
//! runtime.wait_for_status("nap-1", RunStatus::Waiting).await?;
//! clock.advance(Duration::from_secs(24 * 3600));
//! runtime.wait_for_state("nap-1", "Rested").await?;
//! # Ok(())
//! # }
//! ```
//!
//! The crash explorer, on a workflow with one step:
//!
//! ```
//! use loops::{Context, Workflow};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
//! #[workflow(name = "greet", version = 1)]
//! enum Greet {
//!     #[initial]
//!     #[next(Done)]
//!     Start { name: String },
//!     #[terminal]
//!     Done { text: String },
//! }
//!
//! struct Greeter;
//!
//! impl GreetHandler for Greeter {
//!     type Error = loops::Error;
//!     async fn start(&self, ctx: &Context, name: String) -> Result<StartNext, Self::Error> {
//!         let text = ctx.step("greet", || async { Ok(format!("hello {name}")) }).await?;
//!         Ok(StartNext::Done { text })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let explored = loops::testing::explore(|| Greeter, Greet::Start { name: "ada".into() }).await?;
//! // The run's creation, the step (between its effect and its record, and after its
//! // record), the transition to `Done`.
//! assert_eq!(explored.boundaries.len(), 4);
//! # Ok(())
//! # }
//! ```

pub use loops_core::testing::*;
