//! `#[derive(Workflow)]` for loops: turns an enum whose variants are the states of a durable
//! state machine into a workflow, its state table, its handler trait and its schema hash.
//!
//! Re-exported by `loops`; see `loops::Workflow` for what the generated items are for.
//!
//! The source is split by phase: `ast` and `attr` model the input, `valid` checks it, `expand`
//! generates the code, and `fallback` still emits the generated items when the input has
//! errors, so that the user sees the real mistake rather than a cascade.
#![forbid(unsafe_code)]

mod ast;
mod attr;
mod case;
mod ctxt;
mod expand;
mod fallback;
mod schema;
mod serde_attr;
mod shape;
mod valid;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

/// Derives a durable workflow from an enum: one variant per state, `#[initial]` on the state
/// runs start in, `#[next(A, B)]` on every other state listing where it may go, `#[terminal]`
/// on the states that end runs, and optionally `#[workflow(name = "...", version = N)]` on the
/// enum.
///
/// Generates, for `enum Deliver`: `DeliverState` (the fieldless state enum, implementing
/// `loops::StateId`), one `{V}Next` enum per non-terminal state `V` (the states `V` may move
/// to), the `DeliverHandler` trait (one async method per non-terminal state), and the
/// `loops::Workflow` and `loops::Dispatch` impls.
#[proc_macro_derive(Workflow, attributes(workflow, initial, next, terminal, schema))]
pub fn derive_workflow(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive(&input).into()
}

/// Derives `loops::Schema` for a struct or enum used in workflow states: describes its stored
/// form from its fields' `Schema` impls and its serde attributes.
#[proc_macro_derive(Schema, attributes(schema))]
pub fn derive_schema(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    schema::derive(&input).into()
}
