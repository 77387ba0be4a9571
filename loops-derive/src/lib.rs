//! `#[derive(Workflow)]` for loops.
#![forbid(unsafe_code)]

use proc_macro::TokenStream;

/// Derives a durable workflow from an annotated enum.
#[proc_macro_derive(Workflow, attributes(workflow, initial, next, terminal))]
pub fn derive_workflow(input: TokenStream) -> TokenStream {
    let _ = input;
    TokenStream::new()
}
