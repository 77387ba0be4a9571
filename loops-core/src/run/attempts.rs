//! How the driver counts a state's failed attempts, spreads its retries, and whether a run
//! needs a driver now.

use crate::error::Result;
use crate::row::RunInfo;
use crate::store::{Ready, Store};

/// Failed attempts at the run's current state so far, the current one included (a
/// failure of the current attempt counts it; interruptions count apart).
pub(crate) fn failed_attempts(info: &RunInfo) -> u32 {
    info.attempt
        .saturating_sub(info.attempt_base)
        .saturating_sub(info.interrupted)
}

/// A number in `0.0..1.0` for retry jitter, from the run, state, attempt and clock.
pub(crate) fn jitter_unit(run_id: &str, seq: u64, attempt: u32, now: u64) -> f64 {
    crate::material::Material::with_capacity(run_id.len() + 20)
        .raw(run_id.as_bytes())
        .u64(seq)
        .u32(attempt)
        .u64(now)
        .unit()
}

/// Whether the run needs a driver now, by [`RunInfo::readiness`]: for a waiting run, whether
/// its wait can end (its time passed, or its event is in the inbox) or its cancellation was
/// asked for.
pub(crate) async fn is_ready(store: &dyn Store, info: &RunInfo, now_ms: u64) -> Result<bool> {
    match info.readiness().at(now_ms) {
        Ready::Now => Ok(true),
        Ready::OnEvent(event) => store.has_pending(&info.run_id, event).await,
        Ready::No => Ok(false),
    }
}
