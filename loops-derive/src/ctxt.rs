//! The error accumulator: every phase records its errors here, so that all the mistakes in
//! one input are reported together instead of one per build.

use std::cell::RefCell;
use std::fmt::Display;

use quote::ToTokens;

/// Collects `syn::Error`s; consumed by [`Errors::finish`].
#[derive(Default)]
pub(crate) struct Errors {
    errors: RefCell<Vec<syn::Error>>,
}

impl Errors {
    /// An error spanned at the tokens of `node` (the first and last token, where the compiler
    /// can join them).
    pub(crate) fn spanned<T: ToTokens, M: Display>(&self, node: T, message: M) {
        self.push(syn::Error::new_spanned(node.into_token_stream(), message));
    }

    /// An error syn produced (a parse error, already spanned).
    pub(crate) fn push(&self, error: syn::Error) {
        self.errors.borrow_mut().push(error);
    }

    /// All recorded errors combined into one, or `None`.
    pub(crate) fn finish(self) -> Option<syn::Error> {
        self.errors
            .into_inner()
            .into_iter()
            .reduce(|mut all, next| {
                all.combine(next);
                all
            })
    }
}
