//! What the writes of workflow evolution mean: [`Write::Block`](super::Write::Block),
//! [`Write::Unblock`](super::Write::Unblock) and [`Write::Migrate`](super::Write::Migrate),
//! planned here for [`plan`](super::plan::plan) as every other write is.

use std::borrow::Cow;

use super::checks::{Given, check_lease, existing, leased, run_ended};
use super::effects::{Effects, Record};
use super::protocol::Reply;
use super::{RunInfo, RunStatus};
use crate::error::{Error, Result};
use crate::record::TransitionRecord;
use crate::row::BlockInfo;
use crate::schema::SchemaHash;

/// [`Write::Block`](super::Write::Block): the run becomes blocked, once.
pub(super) fn block<'w>(
    run_id: &'w str,
    schema: SchemaHash,
    reason: &str,
    changes: &[String],
    at_ms: u64,
    g: &Given<'_, '_>,
) -> Result<Effects<'w>> {
    let info = leased(run_id, g)?;
    if info.status.is_ended() {
        return Err(run_ended(info, "blocking"));
    }
    let same = info
        .block
        .as_ref()
        .is_some_and(|b| b.schema == schema && b.reason == reason);
    if info.schema != schema || (info.status == RunStatus::Blocked && same) {
        // Migrated meanwhile (another build drives it), or blocked already for this.
        return Ok(Effects::unchanged(run_id, Reply::Run(info.clone())));
    }
    let resume = match (&info.block, info.status) {
        (Some(block), RunStatus::Blocked) => block.resume,
        (_, status) => status,
    };
    let mut new = info.clone();
    new.status = RunStatus::Blocked;
    new.block = Some(BlockInfo::new(
        reason,
        changes.to_vec(),
        schema,
        at_ms,
        resume,
    ));
    new.updated_ms = at_ms;
    Ok(Effects::with_row(run_id, Some(info.status), new))
}

/// [`Write::Unblock`](super::Write::Unblock): a blocked run goes back to the status it had.
pub(super) fn unblock<'w>(run_id: &'w str, at_ms: u64, g: &Given<'_, '_>) -> Result<Effects<'w>> {
    let info = leased(run_id, g)?;
    if info.status != RunStatus::Blocked {
        return Ok(Effects::unchanged(run_id, Reply::Run(info.clone())));
    }
    let mut new = info.clone();
    new.status = resumed(info);
    new.block = None;
    new.updated_ms = at_ms;
    Ok(Effects::with_row(run_id, Some(info.status), new))
}

/// [`Write::Migrate`](super::Write::Migrate): the migration's record at `seq + 1`, and the row
/// moved to it, in the same state (entered where the migrated one was).
pub(super) fn migrate<'w>(
    run_id: &'w str,
    seq: u64,
    (record, terminal): (&'w TransitionRecord, bool),
    schema_text: &'static str,
    g: &Given<'_, '_>,
) -> Result<Effects<'w>> {
    check_lease(g, run_id, seq)?;
    let info = existing(run_id, g.row)?;
    let refused = |reason: String| Error::MigrationRefused {
        run_id: run_id.to_owned(),
        seq,
        reason,
    };
    let Some(next) = seq.checked_add(1) else {
        return Err(refused("the run's seq is at its limit".to_owned()));
    };
    if info.seq != seq || info.status.is_ended() {
        return Err(Error::Fenced {
            run_id: run_id.to_owned(),
            seq,
            current: info.seq,
            status: info.status,
        });
    }
    let Some(from) = record.migrated else {
        return Err(refused(
            "the record names no schema migrated from".to_owned(),
        ));
    };
    if from.schema != info.schema {
        return Err(refused(format!(
            "the migration reads schema {}, but the run is at schema {}",
            from.schema, info.schema
        )));
    }
    if record.seq != next || from.seq != info.state_seq() {
        return Err(refused(format!(
            "the record is for seq {} continuing seq {}; the run needs seq {next} continuing seq {}",
            record.seq,
            from.seq,
            info.state_seq()
        )));
    }
    if g.facts.record_taken {
        return Err(Error::SequenceConflict {
            run_id: run_id.to_owned(),
            seq: next,
        });
    }
    let mut new = info.clone();
    new.seq = next;
    new.entered = Some(info.state_seq());
    record.state.clone_into(&mut new.state);
    new.schema = record.schema;
    new.status = resumed(info);
    new.block = None;
    new.updated_ms = record.at_ms;
    // Into a terminal state: the run ends there, as a transition into it ends it.
    if terminal {
        new.status = RunStatus::Completed;
        new.wait = None;
        new.retry_at_ms = None;
        new.error = None;
    }
    let mut effects = Effects::with_row(run_id, Some(info.status), new);
    effects.records.push(Record::Journal {
        seq: next,
        bytes: Cow::Owned(record.to_bytes()),
    });
    effects.store_schema(g.facts.schema_stored, record.schema, Some(schema_text));
    Ok(effects)
}

/// The status a run has once it is no longer blocked: the one it had before, or its own.
fn resumed(info: &RunInfo) -> RunStatus {
    match (&info.block, info.status) {
        (Some(block), RunStatus::Blocked) => block.resume,
        // A blocked row without its block (edited by hand): running, to be routed again.
        (None, RunStatus::Blocked) => RunStatus::Running,
        (_, status) => status,
    }
}
