//! The `deliver` example's end-to-end tests, in one test binary: each runs the example (and
//! the `loops` binary) as child processes, which are built once for all of them, and they
//! share the fixtures of `common` (the reference run, a demo stopped at its start, a run
//! parked at the approval gate) where they need no fresh one.
//!
//! `cargo test -p deliver --test end_to_end` runs them; with `--features openai`, the example
//! with `--model openai` against a fake chat-completions server (`openai.rs`) too.

mod common;
mod crash;
#[cfg(feature = "openai")]
mod fake_api;
mod loops_cli;
#[cfg(feature = "openai")]
mod openai;
mod refusals;
mod repo;
mod schema_change;
mod versions;
