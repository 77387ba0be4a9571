//! The `deliver` example's end-to-end tests, in one test binary: each runs the example (and
//! the `loops` binary) as child processes, which are built once for all of them, and they
//! share the fixtures of `common` (the reference run, a demo stopped at its start, a run
//! parked at the approval gate) where they need no fresh one.
//!
//! `cargo test -p deliver --test end_to_end` runs them.

mod common;
mod crash;
mod loops_cli;
mod refusals;
mod repo;
mod schema_change;
