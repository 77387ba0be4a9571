//! One write inside a batch's transaction: the facts its plan needs are read from the tables,
//! and the effects the plan returns are written to them.

use redb::ReadableTable;

use super::Leases;
use super::log::{self, Chain, Head, Kind, LogError};
use super::row;
use super::tables::{ATTRIBUTE_KEY_ABOVE, Reads, Tables, name_upper_bound};
use crate::error::{Error, RecordKind};
use crate::schedule::ScheduleInfo;
use crate::store::protocol::{Reply, Write};
use crate::store::{
    AttemptFailures, CurrentLease, Effects, Facts, InboxChange, Lease, LeaseCheck, Needs,
    PendingEvent, Record, RecordKey, RowWrite, RunInfo, ScheduleChange, plan,
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

/// Applies one write inside the batch's transaction: asks [`planned`] what the write means,
/// and writes its effects out.
///
/// `lease`: the lease the write carries and the run's current one, for the plan's check.
pub(super) fn apply(
    t: &mut Tables<'_>,
    write: &Write,
    lease: Option<LeaseCheck<'_>>,
) -> std::result::Result<Applied, ApplyError> {
    let (run, effects) = planned(t, write, lease)?;
    if effects.is_empty() {
        return Ok(Applied::Unchanged(effects.into_reply()));
    }
    store(t, &effects, run)?;
    apply_follow_ups(t, &effects.follow_ups)?;
    Ok(Applied::Wrote(effects.into_reply()))
}

/// A write's run (its id and head; none for a write of no run) and the effects its plan
/// returned.
pub(super) type Planned<'w> = (Option<(&'w str, Head)>, Effects<'w>);

/// What `write` means on the tables `t` as they are: reads the run's row and the facts the
/// write needs, and asks [`plan`]. Returns the [`Planned`] effects, or the plan's refusal
/// ([`ApplyError::Rejected`]).
///
/// `lease`: the lease the write carries and the run's current one, for the plan's check.
pub(super) fn planned<'w, 's>(
    t: &mut impl Reads<'s>,
    write: &'w Write,
    lease: Option<LeaseCheck<'_>>,
) -> std::result::Result<Planned<'w>, ApplyError> {
    let needs = write.needs();
    let (head, row) = match needs.run {
        Some(run_id) => load_row(t, run_id)?.unzip(),
        None => (None, None),
    };
    let head = head.unwrap_or_default();
    let mut facts = gather(t, &needs, head, row.as_ref())?;
    facts.lease = lease;
    let effects = plan(write, row.as_ref(), &facts).map_err(ApplyError::Rejected)?;
    Ok((needs.run.map(|run_id| (run_id, head)), effects))
}

/// The check of `lease`, carried by a write, against the run's current lease in `leases`
/// (none given: no lease is current).
pub(super) fn lease_check<'a>(leases: Option<&Leases>, lease: &'a Lease) -> LeaseCheck<'a> {
    LeaseCheck {
        lease,
        current: leases
            .and_then(|leases| leases.token(&lease.run_id))
            .map(|token| CurrentLease { token, live: true }),
    }
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

/// The run's head and row, if it has one.
fn load_row<'s>(
    t: &mut impl Reads<'s>,
    run_id: &str,
) -> std::result::Result<Option<(Head, RunInfo)>, ApplyError> {
    match t.runs()?.get(run_id)? {
        Some(bytes) => row::decode(run_id, bytes.value())
            .map(Some)
            .map_err(ApplyError::Rejected),
        None => Ok(None),
    }
}

/// A walk of the run's log that failed: a damaged chain refuses the write (nothing is
/// written yet when facts are read); a failure of redb fails the batch.
fn refused(run_id: &str) -> impl Fn(LogError) -> ApplyError + '_ {
    move |e| match e {
        LogError::Storage(e) => ApplyError::Storage(e),
        e @ LogError::Damaged(_) => ApplyError::Rejected(Error::storage(
            format!("reading the log of run `{run_id}`"),
            e.into_redb(),
        )),
    }
}

/// A walk of the run's log that failed while the write's effects are written: the batch
/// fails, so that no write is half done.
fn failed(e: LogError) -> ApplyError {
    ApplyError::Storage(e.into_redb())
}

/// Whether the run whose newest entries `head` leads to has the record `key`: a walk back
/// from its newest transition (a transition) or entry (a step), that stops at the first
/// entry of an earlier seq (a run's entries are appended in the order of their seqs).
///
/// A transition record of a seq above the row's (`row`: the run's row, read in this
/// transaction) is not taken, without a walk: the row and the log are written in the same
/// transactions, and the row's seq is that of the run's newest transition record (every
/// write of a transition record sets it), so the walk would stop at its first entry. That
/// walk read one log entry per transition (about 3.5% of a transition's instructions at 64
/// runs).
fn record_taken<'s>(
    t: &mut impl Reads<'s>,
    id: &str,
    head: Head,
    row: Option<&RunInfo>,
    key: RecordKey<'_>,
) -> std::result::Result<bool, ApplyError> {
    let mut taken = false;
    let walked = match key {
        RecordKey::Journal { seq } if row.is_some_and(|row| seq > row.seq) => return Ok(false),
        RecordKey::Journal { seq } => log::walk(
            t.log()?,
            id,
            head.last_transition,
            Chain::Transitions,
            |_, entry| {
                taken = entry.seq == seq;
                entry.seq > seq
            },
        ),
        RecordKey::Step {
            seq,
            name,
            occurrence,
        } => {
            let step_keys = t.step_keys();
            step_keys
                .taken(t.log()?, id, head.last_entry, (seq, name, occurrence))
                .map(|found| taken = found)
        }
    };
    walked.map_err(refused(id))?;
    Ok(taken)
}

/// The highest index of the failure records of `attempt` of the state at `seq`, from a walk
/// back from the run's newest entry to the first of an earlier seq.
fn last_failure<'s>(
    t: &mut impl Reads<'s>,
    id: &str,
    head: Head,
    seq: u64,
    attempt: u32,
) -> std::result::Result<Option<u32>, ApplyError> {
    let mut last: Option<u32> = None;
    log::walk(t.log()?, id, head.last_entry, Chain::All, |_, entry| {
        if let Kind::Failure { attempt: a, index } = entry.kind
            && entry.seq == seq
            && a == attempt
        {
            last = last.max(Some(index));
        }
        entry.seq >= seq
    })
    .map_err(refused(id))?;
    Ok(last)
}

/// The failure records of the highest attempt of the state at `seq` that has any, from a
/// walk back from the run's newest entry to the first of an earlier attempt or seq.
fn last_attempt<'s>(
    t: &mut impl Reads<'s>,
    id: &str,
    head: Head,
    seq: u64,
) -> std::result::Result<Option<AttemptFailures>, ApplyError> {
    let mut last: Option<AttemptFailures> = None;
    let mut undecodable = None;
    log::walk(t.log()?, id, head.last_entry, Chain::All, |_, entry| {
        let Kind::Failure { attempt, index } = entry.kind else {
            return entry.seq >= seq;
        };
        if entry.seq != seq {
            return entry.seq > seq;
        }
        // Attempts only go up along the log: the first met, walking back, is the highest.
        match AttemptFailures::add(&mut last, (id, seq), (attempt, index), entry.record) {
            Ok(more) => more,
            Err(e) => {
                undecodable = Some(e);
                false
            }
        }
    })
    .map_err(refused(id))?;
    match undecodable {
        Some(e) => Err(ApplyError::Rejected(e)),
        None => Ok(last),
    }
}

/// Reads the facts of `needs` from the tables `t`; `head` and `row` are the run's.
fn gather<'w, 's>(
    t: &mut impl Reads<'s>,
    needs: &Needs<'w>,
    head: Head,
    row: Option<&RunInfo>,
) -> std::result::Result<Facts<'w>, ApplyError> {
    let mut facts = Facts::default();
    let id = needs.run.unwrap_or_default();
    if let Some(key) = needs.record {
        facts.record_taken = record_taken(t, id, head, row, key)?;
    }
    if let Some(hash) = needs.schema {
        facts.schema_stored = t.schemas()?.get(hash.to_string().as_str())?.is_some();
    }
    if let Some((seq, attempt)) = needs.failure_index {
        facts.failure_index = match last_failure(t, id, head, seq, attempt)? {
            None => 0,
            Some(index) => index.checked_add(1).ok_or_else(|| {
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
    if let Some(seq) = needs.last_attempt {
        facts.last_attempt = last_attempt(t, id, head, seq)?;
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
                    crate::store::SENDING_AN_EVENT,
                ))
            })?,
        };
    }
    for run_id in needs.runs {
        if let Some((_, info)) = load_row(t, run_id)? {
            facts.runs.push(info);
        }
    }
    if needs.children_of_runs {
        for parent in needs.runs {
            for child in children_of(t, parent)? {
                facts.children_of_runs.push((parent.clone(), child));
            }
        }
    }
    if needs.children {
        for child in children_of(t, id)? {
            if let Some((_, info)) = load_row(t, &child)?
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

/// The run ids of the children of `parent`, from the children index.
fn children_of<'s>(
    t: &mut impl Reads<'s>,
    parent: &str,
) -> std::result::Result<Vec<String>, ApplyError> {
    let top = name_upper_bound();
    let ids = t
        .children()?
        .range((parent, "")..(parent, top.as_str()))?
        .map(|entry| entry.map(|(key, _)| key.value().1.to_owned()))
        .collect::<std::result::Result<_, _>>()?;
    Ok(ids)
}

/// The head of `run_id` as its row stores it (a run without a row has none yet).
fn stored_head(t: &mut Tables<'_>, run_id: &str) -> std::result::Result<Head, ApplyError> {
    let Some(row) = t.runs()?.get(run_id)? else {
        return Ok(Head::default());
    };
    Ok(row::head(run_id, row.value())?)
}

/// A record of the plan as a log entry's seq, kind and record bytes.
fn entry_of<'r>(record: &'r Record<'_>) -> (u64, Kind<'r>, &'r [u8]) {
    match record {
        Record::Journal { seq, bytes } => (*seq, Kind::Transition, bytes.as_ref()),
        Record::Step {
            seq,
            name,
            occurrence,
            bytes,
        } => (
            *seq,
            Kind::Step {
                name,
                occurrence: *occurrence,
            },
            bytes.as_ref(),
        ),
        Record::Failure {
            seq,
            attempt,
            index,
            bytes,
        } => (
            *seq,
            Kind::Failure {
                attempt: *attempt,
                index: *index,
            },
            bytes.as_slice(),
        ),
    }
}

/// Appends the records of the run `id` to the log; returns the run's head after them.
/// `known`: a run's head as read by the write (`None`: read it from the row).
fn append_records(
    t: &mut Tables<'_>,
    id: &str,
    records: &[Record<'_>],
    known: Option<(&str, Head)>,
) -> std::result::Result<Head, ApplyError> {
    let mut head = match known {
        Some((run, head)) if run == id => head,
        _ => stored_head(t, id)?,
    };
    for record in records {
        let (seq, kind, bytes) = entry_of(record);
        let at = t.take_sequence().map_err(failed)?;
        log::append(t.log()?, at, &mut head, id, seq, kind, bytes)?;
    }
    Ok(head)
}

/// Writes `effects` out as table writes. `known`: the run the write read, with its head.
fn store<'a>(
    t: &mut Tables<'_>,
    effects: &'a Effects<'a>,
    mut known: Option<(&'a str, Head)>,
) -> std::result::Result<(), ApplyError> {
    let id = effects.run_id;
    if !effects.records.is_empty() {
        let head = append_records(t, id, &effects.records, known)?;
        known = Some((id, head));
        if effects.row().is_none_or(|row| row.info.run_id != id) {
            // The row is unchanged but for its head.
            let info = t.runs()?.get(id)?.map(|row| row.value().to_vec());
            let info = info
                .as_deref()
                .and_then(Head::split)
                .ok_or_else(|| {
                    ApplyError::Storage(redb::Error::Corrupted(format!(
                        "records of run `{id}` were written, and it has no row: the file is damaged"
                    )))
                })?
                .1;
            t.runs()?.insert(id, head.row(info).as_slice())?;
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
    if let Some((key, check, at_ms)) = effects.sealing {
        if t.sealing()?.get(key)?.is_none() {
            t.sealing()?.insert(key, at_ms)?;
        }
        if let Some(check) = check
            && t.sealing_checks()?.get(key)?.is_none()
        {
            t.sealing_checks()?.insert(key, check)?;
        }
    }
    if let Some(row) = effects.row() {
        let id = row.info.run_id.as_str();
        let head = match known {
            Some((run, head)) if run == id => head,
            _ => stored_head(t, id)?,
        };
        store_row(t, row, head)?;
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

/// Writes the run's new row with its head, moving its status index entry if the status
/// changed.
fn store_row(
    t: &mut Tables<'_>,
    row: &RowWrite,
    head: Head,
) -> std::result::Result<(), ApplyError> {
    let info = &row.info;
    let id = info.run_id.as_str();
    t.runs()?.insert(id, row::encode(head, info).as_slice())?;
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
    let row = t.runs()?.remove(id)?.map(|row| row.value().to_vec());
    t.step_keys.forget(id);
    if let Some(row) = row {
        let head = row::head(id, &row)?;
        for at in log::chain_of(&*t.log()?, id, head).map_err(failed)? {
            t.log()?.remove(at)?;
        }
    }
    if let Some(parent) = &info.parent {
        t.children()?.remove((parent.run_id.as_str(), id))?;
    }
    t.status()?
        .remove((info.status.code(), info.workflow.as_str(), id))?;
    t.inbox()?
        .retain_in((id, 0)..=(id, u64::MAX), |_, _| false)?;
    let top = name_upper_bound();
    t.pending()?
        .retain_in((id, "", 0)..(id, top.as_str(), 0), |_, _| false)?;
    t.event_keys()?
        .retain_in((id, "")..(id, top.as_str()), |_, _| false)?;
    Ok(())
}
