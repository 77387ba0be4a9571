//! Retry hints an error can carry: that it is permanent (no retry will fix it), or when to
//! try again. Made by [`Error::permanent`](crate::Error::permanent) and
//! [`Error::retry_after`](crate::Error::retry_after); read, anywhere in an error's `source()`
//! chain, by [`retry_hint`](crate::retry_hint), which steps and the driver both call (it
//! lives beside [`Error`](crate::Error), whose own errors it also reads). Also the boxing of
//! a handler's error that keeps the chain readable to it: `handler_error`.

use std::fmt;
use std::time::Duration;

use crate::workflow::BoxError;

/// A user's error with a retry hint: the `source` of [`Error::Permanent`](crate::Error::Permanent) and
/// [`Error::RetryAfter`](crate::Error::RetryAfter). It shows as the error it holds (its `Display` and `source()` are
/// the inner error's); [`inner`](Self::inner) gives the error itself, to downcast.
///
/// It is a type of its own, found in the chain by [`retry_hint`](crate::retry_hint), so that the hint survives
/// the conversions a handler's `?` makes (into `anyhow::Error`, into a
/// [`BoxError`](crate::BoxError)), which may hide the outer error's type.
#[derive(Debug)]
pub struct Hinted {
    permanent: bool,
    retry_after: Option<Duration>,
    inner: BoxError,
}

impl Hinted {
    /// `inner` with its hints.
    pub(crate) fn new(permanent: bool, retry_after: Option<Duration>, inner: BoxError) -> Self {
        Hinted {
            permanent,
            retry_after,
            inner,
        }
    }

    /// The hints this error carries itself.
    pub(crate) fn own(&self) -> RetryHint {
        RetryHint {
            permanent: self.permanent,
            retry_after: self.retry_after,
        }
    }

    /// The error that carries the hint.
    pub fn inner(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.inner
    }

    /// The error that carries the hint, unwrapped.
    pub fn into_inner(self) -> BoxError {
        self.inner
    }
}

impl fmt::Display for Hinted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

impl std::error::Error for Hinted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source()
    }
}

/// What an error's chain says about trying again: see [`retry_hint`](crate::retry_hint).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryHint {
    /// No retry will fix it ([`Error::permanent`](crate::Error::permanent)): neither a step nor the state tries
    /// again.
    pub permanent: bool,
    /// The next try waits at least this long ([`Error::retry_after`](crate::Error::retry_after)); the longest hint when
    /// the chain holds several.
    pub retry_after: Option<Duration>,
}

/// The error a handler returned, boxed for the driver ([`BoxError`]). An
/// `anyhow::Error` is unwrapped into a box of the error it holds (without its
/// backtrace, which loops does not record): anyhow's own conversion boxes a wrapper
/// whose type hides that error, so that the driver would not see loops' errors returned
/// with `?` ([`Error::repeats`](crate::Error::repeats), a store fault) nor a caller
/// downcast its own. Every other error converts with its `Into`.
pub fn handler_error<E: Into<BoxError> + 'static>(error: E) -> BoxError {
    let mut slot = Some(error);
    let held = (&mut slot as &mut dyn std::any::Any)
        .downcast_mut::<Option<anyhow::Error>>()
        .and_then(Option::take);
    match (held, slot) {
        (Some(held), _) => held.reallocate_into_boxed_dyn_error_without_backtrace(),
        (None, Some(error)) => error.into(),
        // Cannot happen: `slot` is emptied only by taking its error into `held`.
        (None, None) => "a handler's error was lost while it was boxed".into(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::error::{Error, retry_hint};

    #[test]
    fn hints_survive_boxing_and_wrapping() {
        let perm = Error::permanent("refused");
        assert_eq!(error_text(&perm), "permanent error, not retried: refused");
        let boxed: BoxError = perm.into();
        assert!(retry_hint(&*boxed).permanent);
        let later = Error::retry_after("busy", Duration::from_millis(1500));
        assert_eq!(
            later.hint(),
            RetryHint {
                permanent: false,
                retry_after: Some(Duration::from_millis(1500))
            }
        );
        assert_eq!(retry_hint(&std::fmt::Error), RetryHint::default());
    }

    fn error_text(e: &Error) -> String {
        e.chain()
    }

    fn conflict() -> Error {
        Error::ChildConflict {
            run_id: "p".into(),
            state: "Split",
            seq: 0,
            child: "p/0".into(),
            reason: "a run without a parent has that id".into(),
        }
    }

    /// What the driver reads of a boxed handler error: its text, whether it repeats, and
    /// the store fault in it.
    fn seen(boxed: &BoxError) -> (String, bool, bool) {
        let first: &(dyn std::error::Error + 'static) = &**boxed;
        let store_fault = std::iter::successors(Some(first), |e| e.source())
            .any(|e| e.downcast_ref::<Error>().is_some_and(Error::is_store_fault));
        (boxed.to_string(), retry_hint(first).permanent, store_fault)
    }

    #[test]
    fn an_anyhow_error_is_boxed_as_the_error_it_holds() {
        let text = conflict().to_string();
        // anyhow's own conversion hides the error: what `handler_error` is for.
        let hidden: BoxError = anyhow::Error::from(conflict()).into();
        assert_eq!(seen(&hidden), (text.clone(), false, false));

        let boxed = handler_error(anyhow::Error::from(conflict()));
        assert_eq!(seen(&boxed), (text.clone(), true, false));
        assert!(matches!(
            boxed.downcast_ref::<Error>(),
            Some(Error::ChildConflict { child, .. }) if child == "p/0"
        ));

        // With context, the error is the context's source, as before.
        let wrapped = handler_error(anyhow::Error::from(conflict()).context("starting edits"));
        assert_eq!(seen(&wrapped), ("starting edits".to_owned(), true, false));

        let fault = Error::Storage {
            action: "committing a step record".into(),
            cause: Arc::new(std::io::Error::from(std::io::ErrorKind::StorageFull)),
        };
        let fault_text = fault.to_string();
        let boxed = handler_error(anyhow::Error::from(fault));
        assert_eq!(seen(&boxed), (fault_text, false, true));
    }

    #[test]
    fn other_errors_convert_with_their_into() {
        let boxed = handler_error(conflict());
        assert_eq!(seen(&boxed), (conflict().to_string(), true, false));
        let boxed = handler_error::<BoxError>("plain".into());
        assert_eq!(seen(&boxed), ("plain".to_owned(), false, false));
        let boxed = handler_error(std::fmt::Error);
        assert!(boxed.downcast_ref::<std::fmt::Error>().is_some());
    }
}
