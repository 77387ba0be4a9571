#![doc = include_str!("guide.md")]
//!
//! # Source layout
//!
//! One phase per file: `ast` and `attr` model the input and its attributes (with `serde_attr`
//! for serde's), `valid` checks the model, `expand` generates the workflow's code, `shape`
//! the schema shapes (shared with `schema`, the `Schema` derive), and `fallback` the items
//! still emitted after an error. `ctxt` accumulates errors so all are reported at once.
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
mod tokens;
mod valid;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

/// Derives a durable workflow from an enum: one variant per state, `#[initial]` on the state
/// runs start in, `#[next(A, B)]` on every other state listing where it may go, `#[terminal]`
/// on the states that end runs, and optionally `#[workflow(name = "...", version = N, accepts
/// = ["HASH", ...], crate = path)]` on the enum; `#[schema(as = T)]` and `#[schema(recursive
/// = T)]` on fields. The whole guide (every attribute, what is generated, what changes the
/// schema hash) follows the example below.
///
/// Generates, for `enum Deliver`: `DeliverState` (the fieldless state enum, implementing
/// `loops::StateId`), one `{V}Next` enum per non-terminal state `V` (the states `V` may move
/// to), the `DeliverHandler` trait (one async method per non-terminal state), and the
/// `loops::Workflow`, `loops::Dispatch` and `loops::Versioned` impls. The types stored in
/// states must implement `loops::Schema`.
///
/// ```
/// use loops::{StateId, Workflow};
///
/// #[derive(Workflow, serde::Serialize, serde::Deserialize)]
/// enum Review {
///     #[initial]
///     #[next(Approved, Open)]
///     Open { pr: u64 },
///     #[terminal]
///     Approved,
/// }
///
/// assert_eq!(ReviewState::INITIAL.next(), &[ReviewState::Approved, ReviewState::Open]);
/// assert_eq!(Review::NAME, "review");
/// ```
///
#[doc = include_str!("guide.md")]
#[proc_macro_derive(Workflow, attributes(workflow, initial, next, terminal, schema, event))]
pub fn derive_workflow(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    derive(&input).into()
}

/// Derives `loops::Schema` for a struct or enum stored in workflow states: describes its
/// stored form from its fields' `Schema` impls and its serde attributes, so that the schema
/// hash of the workflows storing it sees into it. `#[schema(as = T)]` and
/// `#[schema(recursive = T)]` on fields, `#[schema(crate = path)]` on the type.
///
/// ```
/// #[derive(loops::Schema, serde::Serialize, serde::Deserialize)]
/// struct Tree {
///     value: u32,
///     children: Vec<Tree>,
/// }
/// ```
#[proc_macro_derive(Schema, attributes(schema))]
pub fn derive_schema(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    schema::derive(&input).into()
}

/// Entry point: model, validate, generate; on errors, the errors plus the fallback items.
fn derive(input: &DeriveInput) -> proc_macro2::TokenStream {
    let cx = ctxt::Errors::default();
    let workflow = ast::Workflow::from_syn(&cx, input);
    if let Some(workflow) = &workflow {
        workflow.validate(&cx);
    }
    match (cx.finish(), workflow) {
        (None, Some(workflow)) => expand::expand(&workflow),
        (Some(error), workflow) => fallback::expand(workflow.as_ref(), error),
        // `from_syn` only returns `None` after recording an error.
        (None, None) => proc_macro2::TokenStream::new(),
    }
}
