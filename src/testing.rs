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
//! - [`explore`] and [`Explorer`]: the crash explorer, in this process or, with
//!   [`Explorer::in_child_processes`], with a real process per crash.
//! - [`HookedStore`]: any store, with every write logged, and failed or stopped by a hook;
//!   the hook sees reads, claims and lease renewals too ([`Call`]).
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
//!
//! The same exploration with a real process per crash: the test binary runs again on this
//! test, and the explorer in it aborts the process at the boundary (`std::process::abort()`)
//! or resumes the run from the store file; the explorer is its own child entry, so nothing
//! else goes in the test. (Not run here: a documentation example has no test harness to run
//! again; `tests/testing.rs` runs this.)
//!
//! ```no_run
//! # use loops::{Context, Workflow};
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
//! # #[workflow(name = "greet", version = 1)]
//! # enum Greet {
//! #     #[initial]
//! #     #[next(Done)]
//! #     Start { name: String },
//! #     #[terminal]
//! #     Done { text: String },
//! # }
//! # struct Greeter;
//! # impl GreetHandler for Greeter {
//! #     type Error = loops::Error;
//! #     async fn start(&self, ctx: &Context, name: String) -> Result<StartNext, Self::Error> {
//! #         let text = ctx.step("greet", || async { Ok(format!("hello {name}")) }).await?;
//! #         Ok(StartNext::Done { text })
//! #     }
//! # }
//! use loops::testing::Explorer;
//!
//! #[tokio::test]
//! async fn every_crash_of_a_greeting_in_a_child_process() {
//!     let explored = Explorer::new(|| Greeter, Greet::Start { name: "ada".into() })
//!         .in_child_processes()
//!         .run()
//!         .await
//!         .unwrap_or_else(|e| panic!("{e}"));
//!     assert_eq!(explored.final_state, "Done");
//! }
//! # fn main() {}
//! ```

pub use loops_core::testing::*;
