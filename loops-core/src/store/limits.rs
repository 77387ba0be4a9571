//! Limits counted by a store that many workers share: [`SharedLimits`].

use std::time::Duration;

use crate::error::Result;
use crate::limit::Limit;
use crate::store::{BoxFuture, Lease};

/// What [`SharedLimits::try_take`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// A place was taken: give it back with [`SharedLimits::release`] and this id.
    Taken {
        /// The place's id in the store.
        permit: u64,
    },
    /// [`Limit::admit`] said no: ask again after `retry_in` (the rate window frees a place
    /// then), or after a release (`None`).
    Full {
        /// How long until the rate window frees a place; `None`: every place is held.
        retry_in: Option<Duration>,
    },
    /// Nothing was taken: the run's cancellation was asked for (by another process: the
    /// waiting step learns it here, not only at its next write).
    Cancelled,
}

/// Named limits counted in a store, for every worker that shares it: the store keeps who
/// holds each limit and when tries started, and applies [`Limit::admit`] to them. A store
/// returns one from [`Store::shared_limits`](crate::Store::shared_limits); the runtime then
/// counts its limits there instead of in the process.
///
/// A place belongs to the lease of the run whose step took it: it counts only while that
/// lease is the run's current one and live, so a worker that dies holding a place loses it
/// when its lease lapses, and a run whose lease another worker took over holds none.
pub trait SharedLimits: Send + Sync + 'static {
    /// Takes a place of the limit `name` for a try of the step at `seq` of the run that
    /// `lease` drives, if [`Limit::admit`] lets it in now: `limit` is this worker's
    /// declaration, applied to the places held and the starts counted by all workers.
    /// One short transaction; it never waits for the limit. Takes nothing, and returns
    /// [`Take::Cancelled`], when the run's cancellation was asked for.
    ///
    /// # Errors
    /// [`Error::Fenced`](crate::Error::Fenced) if `lease` is not the run's live lease;
    /// [`Error::Database`](crate::Error::Database) if the store cannot be reached.
    fn try_take<'a>(
        &'a self,
        name: &'a str,
        limit: &'a Limit,
        lease: &'a Lease,
        seq: u64,
    ) -> BoxFuture<'a, Result<Take>>;

    /// Gives back the place `permit` of the limit `name` (nothing if it is gone already: its
    /// lease lapsed).
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if the store cannot be reached (the place
    /// is then freed when its lease ends).
    fn release<'a>(&'a self, name: &'a str, permit: u64) -> BoxFuture<'a, Result<()>>;
}
