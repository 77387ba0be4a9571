//! loops: durable state machines for long-running work, such as AI agents that plan, edit,
//! run tests and open pull requests over minutes or hours. A run that is killed, restarted,
//! timed out or rolled by a deploy picks up from its last completed step, and never repeats
//! a side effect it recorded.
//!
//! ```
//! use loops::{Context, Runtime, Workflow};
//! use serde::{Deserialize, Serialize};
//!
//! // Each variant is a state; the attributes are the transition table.
//! #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
//! #[workflow(name = "review", version = 1)]
//! enum Review {
//!     #[initial]
//!     #[next(Drafted)]
//!     Requested { topic: String },
//!     #[next(Published)]
//!     Drafted { topic: String, draft: String },
//!     #[terminal]
//!     Published { url: String },
//! }
//!
//! struct Writer;
//!
//! // One async method per non-terminal state; it can only return an allowed next state.
//! impl ReviewHandler for Writer {
//!     type Error = loops::Error;
//!
//!     async fn requested(&self, ctx: &Context, topic: String) -> Result<RequestedNext, Self::Error> {
//!         // A journaled step: it runs once; a resume after a crash gets the recorded output.
//!         let draft = ctx
//!             .step("draft", || async { Ok(format!("Notes on {topic}")) })
//!             .await?;
//!         Ok(RequestedNext::Drafted { topic, draft })
//!     }
//!
//!     async fn drafted(
//!         &self,
//!         ctx: &Context,
//!         _topic: String,
//!         _draft: String,
//!     ) -> Result<DraftedNext, Self::Error> {
//!         // The same key on every re-execution: give it to the outside system.
//!         let key = ctx.idempotency_key("publish")?;
//!         Ok(DraftedNext::Published { url: format!("https://example.com/posts/{key}") })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("review.redb");
//! let runtime = Runtime::open(&path)?;
//! // A new run id starts a run; an existing one resumes from its last recorded state.
//! let done = runtime
//!     .run("review-1", Review::Requested { topic: "redb".into() }, &Writer)
//!     .await?;
//! assert!(matches!(done, Review::Published { .. }));
//! assert_eq!(runtime.history::<Review>("review-1").await?.len(), 3);
//! # Ok(())
//! # }
//! ```
//!
//! - [`Workflow`](macro@Workflow) derives the state machine; an illegal transition does not
//!   compile.
//! - [`Runtime`] drives runs and commits every transition durably to a [redb] file, with the
//!   workflow's [`SchemaHash`]; a run recorded by a build whose workflow changed is refused.
//! - [`Context`] gives handlers journaled steps, idempotency keys, durable sleeps, waits for
//!   events, and cancellation.
//!
//! See `docs/design.md` in the repository for the record format, the key layout and the
//! commit path.
//!
//! [redb]: https://docs.rs/redb
#![forbid(unsafe_code)]

pub use loops_core::*;
pub use loops_derive::{Schema, Workflow};

#[cfg(feature = "testing")]
pub mod testing;
