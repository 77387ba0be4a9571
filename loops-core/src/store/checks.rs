//! The checks every write's plan makes: the lease a write carries, the run's existence, the
//! fence of a driver's writes, the attributes a write sets. Used by [`plan`](super::plan::plan) and the plans of the
//! evolution writes ([`evolve`](super::evolve)).

use super::facts::Facts;
use super::{RunInfo, RunStatus};
use crate::attribute::{AttributeValue, check_attribute};
use crate::error::{Error, Result};

/// What [`plan`] is given besides the write.
pub(super) struct Given<'a, 'f> {
    /// The run's row.
    pub(super) row: Option<&'a RunInfo>,
    /// The facts.
    pub(super) facts: &'a Facts<'f>,
}

/// The checks of a driver's write for `seq`: the lease, the run exists, the fence.
pub(super) fn fenced<'a>(run_id: &str, seq: u64, g: &Given<'a, '_>) -> Result<&'a RunInfo> {
    check_lease(g, run_id, seq)?;
    let info = existing(run_id, g.row)?;
    fence(info, seq)?;
    Ok(info)
}

/// The checks of a driver's write of the transition record at `seq`: the lease, the run
/// exists, its latest record is at `seq - 1` and it is neither ended nor blocked.
/// A refusal names the seq the driver was at (`seq - 1`).
pub(super) fn fenced_journal<'a>(run_id: &str, seq: u64, g: &Given<'a, '_>) -> Result<&'a RunInfo> {
    // Seq 0 is a run's creation, never a transition's.
    let Some(at) = seq.checked_sub(1) else {
        return Err(Error::SequenceConflict {
            run_id: run_id.to_owned(),
            seq,
        });
    };
    check_lease(g, run_id, at)?;
    let info = existing(run_id, g.row)?;
    if info.seq != at || info.status.is_ended() || info.status == RunStatus::Blocked {
        return Err(Error::Fenced {
            run_id: info.run_id.clone(),
            seq: at,
            current: info.seq,
            status: info.status,
        });
    }
    Ok(info)
}

/// Refuses to move on a run whose cancellation was asked while its state ran: the run ends
/// where it is (its driver ends it as cancelled), not in the state the handler chose, even a
/// terminal one. The attempt's step records stay: what it did is on record.
///
/// # Errors
/// [`Error::RunCancelled`], naming the state it is in and the reason.
pub(super) fn not_asked_to_stop(info: &RunInfo) -> Result<()> {
    match &info.cancel {
        Some(reason) => Err(Error::RunCancelled {
            run_id: info.run_id.clone(),
            state: info.state.clone(),
            seq: info.seq,
            reason: reason.clone(),
        }),
        None => Ok(()),
    }
}

/// The checks of a write for the run as it is (not for a seq): the run exists, the lease.
pub(super) fn leased<'a>(run_id: &str, g: &Given<'a, '_>) -> Result<&'a RunInfo> {
    let info = existing(run_id, g.row)?;
    check_lease(g, run_id, info.seq)?;
    Ok(info)
}

/// The run's row, or `RunNotFound`.
pub(super) fn existing<'r>(run_id: &str, row: Option<&'r RunInfo>) -> Result<&'r RunInfo> {
    row.ok_or_else(|| Error::RunNotFound {
        run_id: run_id.to_owned(),
    })
}

/// Refuses a write made in the state entered at `seq` unless the run is in that state
/// ([`RunInfo::state_seq`]) and is neither ended nor blocked.
pub(super) fn fence(info: &RunInfo, seq: u64) -> Result<()> {
    if info.state_seq() != seq || info.status.is_ended() || info.status == RunStatus::Blocked {
        return Err(Error::Fenced {
            run_id: info.run_id.clone(),
            seq,
            current: info.seq,
            status: info.status,
        });
    }
    Ok(())
}

/// Refuses the write (for `seq`) unless the lease it carries, if checked, is the run's
/// current, live lease.
pub(super) fn check_lease(g: &Given<'_, '_>, run_id: &str, seq: u64) -> Result<()> {
    let Some(check) = &g.facts.lease else {
        return Ok(());
    };
    let held = check.lease.run_id == run_id
        && check
            .current
            .is_some_and(|current| current.token == check.lease.token && current.live);
    if held {
        return Ok(());
    }
    Err(Error::Fenced {
        run_id: run_id.to_owned(),
        seq,
        current: g.row.map_or(0, |info| info.seq),
        status: g.row.map_or(RunStatus::Running, |info| info.status),
    })
}

/// The action of a send refused for a run that has ended ([`Error::RunEnded`]): one text for
/// the store's refusal and for [`check_event`](crate::check_event)'s.
pub(crate) const SENDING_AN_EVENT: &str = "sending an event";

pub(crate) fn run_ended(info: &RunInfo, action: &'static str) -> Error {
    Error::RunEnded {
        run_id: info.run_id.clone(),
        status: info.status,
        action,
    }
}

/// `attributes` of the run with row `info`, each checked by [`check_attribute`]; a key given
/// twice keeps its last value (one entry per key, so that a store writes each key once).
pub(super) fn checked_attributes<'w>(
    info: &RunInfo,
    attributes: &'w [(String, AttributeValue)],
) -> Result<Vec<(&'w str, &'w AttributeValue)>> {
    let mut out: Vec<(&'w str, &'w AttributeValue)> = Vec::with_capacity(attributes.len());
    for (key, value) in attributes {
        check_attribute(key, value).map_err(|reason| Error::InvalidAttribute {
            run_id: info.run_id.clone(),
            state: info.state.clone(),
            seq: info.state_seq(),
            key: key.clone(),
            reason,
        })?;
        out.retain(|(k, _)| *k != key.as_str());
        out.push((key, value));
    }
    Ok(out)
}
