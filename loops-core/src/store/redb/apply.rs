//! One write inside a batch's transaction: the facts its plan needs are read from the tables,
//! and the effects the plan returns are written to them.

use redb::ReadableTable;

use super::tables::{ATTRIBUTE_KEY_ABOVE, Tables, name_upper_bound};
use crate::error::{Error, RecordKind};
use crate::schedule::ScheduleInfo;
use crate::store::protocol::{Reply, Write};
use crate::store::{
    Effects, Facts, InboxChange, LeaseCheck, Needs, PendingEvent, Record, RecordKey, RowWrite,
    RunInfo, ScheduleChange, plan,
};

/// An outcome of applying one write inside the batch's transaction.
pub(super) enum Applied {
    /// Written; reply with this.
    Wrote(Reply),
    /// Nothing to write; reply with this.
    Unchanged(Reply),
}

pub(super) enum ApplyError {
    /// The write failed its checks and wrote nothing.
    Rejected(Error),
    /// The transaction failed; the whole batch fails.
    Storage(redb::Error),
}

impl<E: Into<redb::Error>> From<E> for ApplyError {
    fn from(e: E) -> Self {
        ApplyError::Storage(e.into())
    }
}

/// Applies one write inside the batch's transaction: reads the run's row and the facts the
/// write needs, asks [`plan`] what the write means, and writes its effects out.
///
/// `lease`: the lease the write carries and the run's current one, for the plan's check.
pub(super) fn apply(
    t: &mut Tables<'_>,
    write: &Write,
    lease: Option<LeaseCheck<'_>>,
) -> std::result::Result<Applied, ApplyError> {
    let needs = write.needs();
    let row = match needs.run {
        Some(run_id) => load_row(t, run_id)?,
        None => None,
    };
    let mut facts = gather(t, &needs)?;
    facts.lease = lease;
    let effects = plan(write, row.as_ref(), &facts).map_err(ApplyError::Rejected)?;
    if effects.is_empty() {
        return Ok(Applied::Unchanged(effects.reply));
    }
    store(t, &effects)?;
    apply_follow_ups(t, &effects.follow_ups)?;
    Ok(Applied::Wrote(effects.reply))
}

/// Applies the [follow-up writes](Effects::follow_ups) of a write, after its effects, in the
/// same transaction; one that its plan refuses writes nothing and is skipped.
fn apply_follow_ups(t: &mut Tables<'_>, writes: &[Write]) -> std::result::Result<(), ApplyError> {
    for write in writes {
        match apply(t, write, None) {
            Ok(_) => {}
            Err(ApplyError::Rejected(e)) => {
                tracing::debug!(error = %e, "a follow-up write was refused; skipped");
            }
            Err(e @ ApplyError::Storage(_)) => return Err(e),
        }
    }
    Ok(())
}

fn load_row(t: &mut Tables<'_>, run_id: &str) -> std::result::Result<Option<RunInfo>, ApplyError> {
    match t.runs()?.get(run_id)? {
        Some(bytes) => RunInfo::decode(run_id, bytes.value())
            .map(Some)
            .map_err(ApplyError::Rejected),
        None => Ok(None),
    }
}

/// Reads the facts of `needs` in the write transaction.
fn gather<'w>(t: &mut Tables<'_>, needs: &Needs<'w>) -> std::result::Result<Facts<'w>, ApplyError> {
    let mut facts = Facts::default();
    let id = needs.run.unwrap_or_default();
    facts.record_taken = match needs.record {
        Some(RecordKey::Journal { seq }) => t.journal()?.get((id, seq))?.is_some(),
        Some(RecordKey::Step {
            seq,
            name,
            occurrence,
        }) => t.steps()?.get((id, seq, name, occurrence))?.is_some(),
        None => false,
    };
    if let Some(hash) = needs.schema {
        facts.schema_stored = t.schemas()?.get(hash.to_string().as_str())?.is_some();
    }
    if let Some((seq, attempt)) = needs.failure_index {
        let last = t
            .failures()?
            .range((id, seq, attempt, 0)..=(id, seq, attempt, u32::MAX))?
            .next_back()
            .transpose()?;
        facts.failure_index = match last {
            None => 0,
            Some((key, _)) => key.value().3.checked_add(1).ok_or_else(|| {
                ApplyError::Rejected(Error::counter_overflow(
                    id,
                    (RecordKind::Failure, seq),
                    "failure index",
                    u64::from(u32::MAX),
                    "recording a failure",
                ))
            })?,
        };
    }
    if let Some(seq) = needs.failure_attempt {
        let last = t
            .failures()?
            .range((id, seq, 0, 0)..=(id, seq, u32::MAX, u32::MAX))?
            .next_back()
            .transpose()?;
        facts.failure_attempt = last.map(|(key, _)| key.value().2);
    }
    if let Some(event) = needs.pending {
        let first = t
            .pending()?
            .range((id, event, 0)..=(id, event, u64::MAX))?
            .next()
            .transpose()?
            .map(|(key, _)| key.value().2);
        if let Some(event_seq) = first {
            let record = t.inbox()?.get((id, event_seq))?.map(|b| b.value().to_vec());
            facts.pending = Some(PendingEvent { event_seq, record });
        }
    }
    if let Some(key) = needs.event_key {
        facts.key_seen = t.event_keys()?.get((id, key))?.map(|seq| seq.value());
    }
    if needs.next_event_seq {
        let last = t
            .inbox()?
            .range((id, 0)..=(id, u64::MAX))?
            .next_back()
            .transpose()?;
        facts.next_event_seq = match last {
            None => 0,
            Some((key, _)) => key.value().1.checked_add(1).ok_or_else(|| {
                ApplyError::Rejected(Error::counter_overflow(
                    id,
                    (RecordKind::Event { name: None }, u64::MAX),
                    "event seq",
                    u64::MAX,
                    "sending an event",
                ))
            })?,
        };
    }
    for run_id in needs.runs {
        if let Some(info) = load_row(t, run_id)? {
            facts.runs.push(info);
        }
    }
    if needs.children {
        let top = name_upper_bound();
        let ids: Vec<String> = t
            .children()?
            .range((id, "")..(id, top.as_str()))?
            .map(|entry| entry.map(|(key, _)| key.value().1.to_owned()))
            .collect::<std::result::Result<_, _>>()?;
        for child in ids {
            if let Some(info) = load_row(t, &child)?
                && !info.status.is_ended()
            {
                facts.children.push(info);
            }
        }
    }
    if let Some(name) = needs.schedule {
        let row = t.schedules()?.get(name)?.map(|b| b.value().to_vec());
        facts.schedule = row
            .map(|bytes| ScheduleInfo::decode(name, &bytes))
            .transpose()
            .map_err(ApplyError::Rejected)?;
    }
    Ok(facts)
}

/// Writes `effects` out as table writes.
fn store(t: &mut Tables<'_>, effects: &Effects<'_>) -> std::result::Result<(), ApplyError> {
    let id = effects.run_id;
    for record in &effects.records {
        match record {
            Record::Journal { seq, bytes } => {
                t.journal()?.insert((id, *seq), bytes.as_ref())?;
            }
            Record::Step {
                seq,
                name,
                occurrence,
                bytes,
            } => {
                t.steps()?
                    .insert((id, *seq, *name, *occurrence), &**bytes)?;
            }
            Record::Failure {
                seq,
                attempt,
                index,
                bytes,
            } => {
                t.failures()?
                    .insert((id, *seq, *attempt, *index), bytes.as_slice())?;
            }
        }
    }
    for change in &effects.inbox {
        match change {
            InboxChange::Append {
                event_seq,
                name,
                key,
                record,
            } => {
                t.inbox()?.insert((id, *event_seq), record.as_slice())?;
                t.pending()?.insert((id, *name, *event_seq), ())?;
                if let Some(key) = key {
                    t.event_keys()?.insert((id, *key), *event_seq)?;
                }
            }
            InboxChange::Deliver { event_seq, name } => {
                t.pending()?.remove((id, *name, *event_seq))?;
            }
        }
    }
    if let Some((hash, text)) = &effects.schema {
        t.schemas()?.insert(hash.to_string().as_str(), *text)?;
    }
    if let Some((key, at_ms)) = effects.sealing
        && t.sealing()?.get(key)?.is_none()
    {
        t.sealing()?.insert(key, at_ms)?;
    }
    if let Some(row) = &effects.row {
        store_row(t, row)?;
    }
    for (key, value) in &effects.attributes {
        store_attribute(t, id, key, &value.index_bytes())?;
    }
    for info in &effects.delete {
        delete_run(t, info)?;
    }
    match &effects.schedule {
        Some(ScheduleChange::Put { info, .. }) => {
            t.schedules()?
                .insert(info.name.as_str(), info.encode().as_slice())?;
        }
        Some(ScheduleChange::Delete { name }) => {
            t.schedules()?.remove(*name)?;
        }
        None => {}
    }
    Ok(())
}

/// Writes the run's new row, moving its status index entry if the status changed.
fn store_row(t: &mut Tables<'_>, row: &RowWrite) -> std::result::Result<(), ApplyError> {
    let info = &row.info;
    let id = info.run_id.as_str();
    t.runs()?.insert(id, info.encode().as_slice())?;
    if row.was.is_none()
        && let Some(parent) = &info.parent
    {
        t.children()?.insert((parent.run_id.as_str(), id), ())?;
    }
    if let Some((from, to)) = row.status_move() {
        let workflow = info.workflow.as_str();
        if let Some(from) = from {
            t.status()?.remove((from.code(), workflow, id))?;
        }
        t.status()?.insert((to.code(), workflow, id), ())?;
    }
    Ok(())
}

/// Sets the run's attribute `key` to the value of index bytes `value`, moving its index entry
/// off the value it replaces.
fn store_attribute(
    t: &mut Tables<'_>,
    id: &str,
    key: &str,
    value: &[u8],
) -> std::result::Result<(), ApplyError> {
    let old = t
        .attributes()?
        .insert((id, key), value)?
        .map(|old| old.value().to_vec());
    if let Some(old) = old {
        t.attribute_index()?.remove((key, old.as_slice(), id))?;
    }
    t.attribute_index()?.insert((key, value, id), ())?;
    Ok(())
}

/// Deletes the run's row, index entries, records, attributes and events.
fn delete_run(t: &mut Tables<'_>, info: &RunInfo) -> std::result::Result<(), ApplyError> {
    let id = info.run_id.as_str();
    let mut attributes = Vec::new();
    for entry in t
        .attributes()?
        .extract_from_if((id, "")..(id, ATTRIBUTE_KEY_ABOVE), |_, _| true)?
    {
        let (key, value) = entry?;
        attributes.push((key.value().1.to_owned(), value.value().to_vec()));
    }
    for (key, value) in &attributes {
        t.attribute_index()?
            .remove((key.as_str(), value.as_slice(), id))?;
    }
    t.runs()?.remove(id)?;
    if let Some(parent) = &info.parent {
        t.children()?.remove((parent.run_id.as_str(), id))?;
    }
    t.status()?
        .remove((info.status.code(), info.workflow.as_str(), id))?;
    t.journal()?
        .retain_in((id, 0)..=(id, u64::MAX), |_, _| false)?;
    t.steps()?
        .retain_in((id, 0, "", 0)..(id, u64::MAX, "", 0), |_, _| false)?;
    t.failures()?.retain_in(
        (id, 0, 0, 0)..=(id, u64::MAX, u32::MAX, u32::MAX),
        |_, _| false,
    )?;
    t.inbox()?
        .retain_in((id, 0)..=(id, u64::MAX), |_, _| false)?;
    let top = name_upper_bound();
    t.pending()?
        .retain_in((id, "", 0)..(id, top.as_str(), 0), |_, _| false)?;
    t.event_keys()?
        .retain_in((id, "")..(id, top.as_str()), |_, _| false)?;
    Ok(())
}
