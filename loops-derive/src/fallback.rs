//! What the derive emits when the input has errors: the errors, and the generated items as far
//! as they can be built, so that the user sees the real mistake rather than a cascade of
//! "cannot find type `DeliverHandler`" in the code that uses them.

use proc_macro2::TokenStream;
use quote::quote;

use crate::ast::Workflow;
use crate::expand;

pub(crate) fn expand(workflow: Option<&Workflow>, error: syn::Error) -> TokenStream {
    let error = error.to_compile_error();
    // A generic enum's fields name type parameters the generated items would not declare.
    // A malformed `crate = ...`: every generated item would name a path that may not resolve.
    let Some(w) =
        workflow.filter(|w| !w.states.is_empty() && !w.is_generic() && !w.attrs.krate.is_invalid())
    else {
        return error;
    };
    let krate = &w.krate;
    let types = expand::types(w);
    // Stubs for what could fail in turn: the dispatch (calls handler methods) and the schema
    // constants (which, in an invalid enum, describe nothing meaningful).
    let dispatch = quote! {
        ::core::future::pending()
    };
    let schema = quote! {
        const SCHEMA_HASH: #krate::SchemaHash = #krate::SchemaHash::from_u64(0);
        const SCHEMA: &'static str = "";
    };
    let impls = expand::impls(w, dispatch, schema);
    quote! {
        #error
        #types
        const _: () = { #impls };
    }
}
