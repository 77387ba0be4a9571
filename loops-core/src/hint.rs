//! Retry hints an error can carry: that it is permanent (no retry will fix it), or when to
//! try again. Made by [`Error::permanent`](crate::Error::permanent) and
//! [`Error::retry_after`](crate::Error::retry_after); read, anywhere in an error's `source()`
//! chain, by [`retry_hint`](crate::retry_hint), which steps and the driver both call (it
//! lives beside [`Error`](crate::Error), whose own errors it also reads).

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

#[cfg(test)]
mod tests {
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
}
