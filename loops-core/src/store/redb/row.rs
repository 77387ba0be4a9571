//! Format 3's run row: a run's [head](Head) in the log, then its [`RunInfo`] in a compact
//! binary encoding (format 2 stored JSON there).
//!
//! Every write rewrites its run's row, and listing and resuming read rows by the thousand:
//! JSON cost a parse and a print per write inside the serial commit, and about 200 bytes a
//! run where this takes about 80 (a million parked runs, `docs/benchmarks.md`). Inspection
//! does not read these bytes: the CLI decodes rows through the store and prints JSON.
//!
//! # Layout
//! All integers little-endian; a string is its length (u32) then its UTF-8 bytes.
//!
//! | bytes | what |
//! |-------|------|
//! | 16    | the head: the run's newest entry and newest transition in the log ([`Head`]) |
//! | 1     | the encoding's version: [`VERSION`] |
//! | 1     | the status' code ([`RunStatus::code`]) |
//! | 2     | which optional fields follow (the `HAS_*` bits) |
//! | 8     | the schema hash |
//! | 8     | seq |
//! | 4, 4, 4 | attempt, attempt base, interruptions |
//! | 8, 8  | created, updated (ms since the Unix epoch) |
//! | str, str | the workflow's name, the state's name |
//! | 8     | if `HAS_RETRY_AT`: retry at (ms) |
//! | 8     | if `HAS_ENTERED`: the seq the state was entered at |
//! | 8     | if `HAS_WAIT_UNTIL`: the wait's end (ms) |
//! | str   | if `HAS_WAIT_EVENT`: the event waited for |
//! | str   | if `HAS_CANCEL`: the cancellation's reason |
//! | 4 + strs | if `HAS_ERROR`: the error chain (count, then each) |
//! | block | if `HAS_BLOCK`: reason (str), changes (count, strs), schema (8), at (8), status to resume (1) |
//! | parent | if `HAS_PARENT`: the parent's run id (str), what its cancellation does (1: 0 cancel, 1 abandon) |
//! | 8     | if `HAS_KEY_NONCE`: the run's key nonce ([`RunInfo::key_nonce`]) |
//!
//! The fields [`readiness`] needs (status, schema, the wait, whether a cancellation was
//! asked) are read without allocating.

use std::str;

use super::log::{HEAD_LEN, Head};
use crate::error::{Error, RecordKind};
use crate::row::{BlockInfo, OnParentCancel, ParentLink, RunInfo, WaitInfo};
use crate::schema::SchemaHash;
use crate::status::RunStatus;
use crate::store::ready::Readiness;

/// The version of the encoding after the head, its first byte.
const VERSION: u8 = 1;

const HAS_RETRY_AT: u16 = 1 << 0;
const HAS_ENTERED: u16 = 1 << 1;
const HAS_WAIT: u16 = 1 << 2;
const HAS_WAIT_UNTIL: u16 = 1 << 3;
const HAS_WAIT_EVENT: u16 = 1 << 4;
const HAS_CANCEL: u16 = 1 << 5;
const HAS_ERROR: u16 = 1 << 6;
const HAS_BLOCK: u16 = 1 << 7;
const HAS_PARENT: u16 = 1 << 8;
const HAS_KEY_NONCE: u16 = 1 << 9;
const ALL: u16 = (1 << 10) - 1;

/// The stored row of a run: `head`, then `info` encoded.
pub(crate) fn encode(head: Head, info: &RunInfo) -> Vec<u8> {
    let strings = info.workflow.len()
        + info.state.len()
        + info
            .wait
            .as_ref()
            .and_then(|w| w.event.as_ref())
            .map_or(0, String::len)
        + info.cancel.as_ref().map_or(0, String::len);
    let mut out = Row(Vec::with_capacity(HEAD_LEN + 80 + strings));
    out.u64(head.last_entry);
    out.u64(head.last_transition);
    let wait = info.wait.as_ref();
    let flags = [
        (info.retry_at_ms.is_some(), HAS_RETRY_AT),
        (info.entered.is_some(), HAS_ENTERED),
        (wait.is_some(), HAS_WAIT),
        (wait.is_some_and(|w| w.until_ms.is_some()), HAS_WAIT_UNTIL),
        (wait.is_some_and(|w| w.event.is_some()), HAS_WAIT_EVENT),
        (info.cancel.is_some(), HAS_CANCEL),
        (info.error.is_some(), HAS_ERROR),
        (info.block.is_some(), HAS_BLOCK),
        (info.parent.is_some(), HAS_PARENT),
        (info.key_nonce.is_some(), HAS_KEY_NONCE),
    ]
    .into_iter()
    .fold(
        0u16,
        |flags, (set, bit)| if set { flags | bit } else { flags },
    );
    out.0.push(VERSION);
    out.0.push(info.status.code());
    out.0.extend_from_slice(&flags.to_le_bytes());
    out.u64(info.schema.to_u64());
    out.u64(info.seq);
    out.u32(info.attempt);
    out.u32(info.attempt_base);
    out.u32(info.interrupted);
    out.u64(info.created_ms);
    out.u64(info.updated_ms);
    out.str(&info.workflow);
    out.str(&info.state);
    if let Some(at) = info.retry_at_ms {
        out.u64(at);
    }
    if let Some(entered) = info.entered {
        out.u64(entered);
    }
    if let Some(until) = wait.and_then(|w| w.until_ms) {
        out.u64(until);
    }
    if let Some(event) = wait.and_then(|w| w.event.as_deref()) {
        out.str(event);
    }
    if let Some(cancel) = &info.cancel {
        out.str(cancel);
    }
    if let Some(errors) = &info.error {
        out.strs(errors);
    }
    if let Some(block) = &info.block {
        out.str(&block.reason);
        out.strs(&block.changes);
        out.u64(block.schema.to_u64());
        out.u64(block.at_ms);
        out.0.push(block.resume.code());
    }
    if let Some(parent) = &info.parent {
        out.str(&parent.run_id);
        out.0.push(match parent.on_cancel {
            OnParentCancel::Cancel => 0,
            OnParentCancel::Abandon => 1,
        });
    }
    if let Some(nonce) = info.key_nonce {
        out.u64(nonce);
    }
    out.0
}

/// The head and the row of `run_id` from its stored row.
///
/// # Errors
/// [`Error::Decode`] (a run row; a damaged or altered file), saying what is wrong and at
/// which byte, if `row` is not a row of this encoding.
pub(crate) fn decode(run_id: &str, row: &[u8]) -> Result<(Head, RunInfo), Error> {
    let (head, view) = View::parse(row).map_err(|e| e.of(run_id))?;
    let mut info = RunInfo {
        run_id: run_id.to_owned(),
        workflow: view.workflow.to_owned(),
        schema: view.schema,
        status: view.status,
        state: view.state.to_owned(),
        seq: view.seq,
        attempt: view.attempt,
        attempt_base: view.attempt_base,
        interrupted: view.interrupted,
        created_ms: view.created_ms,
        updated_ms: view.updated_ms,
        retry_at_ms: view.retry_at_ms,
        error: None,
        cancel: view.cancel.map(str::to_owned),
        wait: view.wait.map(|(event, until_ms)| WaitInfo {
            event: event.map(str::to_owned),
            until_ms,
        }),
        block: None,
        entered: view.entered,
        parent: None,
        key_nonce: None,
    };
    // The rare fields, read on from where the view stopped.
    let mut rest = Reader {
        bytes: row,
        at: view.end,
    };
    let rare = (|| {
        if view.flags & HAS_ERROR != 0 {
            info.error = Some(rest.strs()?);
        }
        if view.flags & HAS_BLOCK != 0 {
            let reason = rest.str()?.to_owned();
            let changes = rest.strs()?;
            let schema = SchemaHash::from_u64(rest.u64()?);
            let at_ms = rest.u64()?;
            let resume = rest.status()?;
            info.block = Some(BlockInfo::new(reason, changes, schema, at_ms, resume));
        }
        if view.flags & HAS_PARENT != 0 {
            let run_id = rest.str()?.to_owned();
            let on_cancel = match rest.u8()? {
                0 => OnParentCancel::Cancel,
                1 => OnParentCancel::Abandon,
                _ => {
                    return Err(Damaged::new(
                        rest.at - 1,
                        "an unknown parent cancellation policy",
                    ));
                }
            };
            info.parent = Some(ParentLink { run_id, on_cancel });
        }
        if view.flags & HAS_KEY_NONCE != 0 {
            info.key_nonce = Some(rest.u64()?);
        }
        rest.end()
    })();
    rare.map_err(|e| e.of(run_id))?;
    Ok((head, info))
}

/// The head of `run_id`'s stored row, read without the rest.
///
/// # Errors
/// [`redb::Error::Corrupted`] (a damaged file) if the row is too short to hold a head.
pub(crate) fn head(run_id: &str, row: &[u8]) -> Result<Head, redb::Error> {
    Head::split(row).map(|(head, _)| head).ok_or_else(|| {
        redb::Error::Corrupted(format!(
            "the row of run `{run_id}` is too short to hold its head: the file is damaged"
        ))
    })
}

/// The schema of the run whose stored row is `row`, and when it needs a driver
/// ([`RunInfo::readiness`]), read without allocating (a store listing a million parked
/// runs).
///
/// # Errors
/// As [`decode`].
pub(crate) fn readiness<'a>(
    run_id: &str,
    row: &'a [u8],
) -> Result<(SchemaHash, Readiness<'a>), Error> {
    let (_, view) = View::parse(row).map_err(|e| e.of(run_id))?;
    Ok((
        view.schema,
        Readiness::of(view.status, view.cancel.is_some(), view.wait),
    ))
}

/// The fields of a row up to its rare ones, borrowed.
struct View<'a> {
    flags: u16,
    status: RunStatus,
    schema: SchemaHash,
    seq: u64,
    attempt: u32,
    attempt_base: u32,
    interrupted: u32,
    created_ms: u64,
    updated_ms: u64,
    workflow: &'a str,
    state: &'a str,
    retry_at_ms: Option<u64>,
    entered: Option<u64>,
    wait: Option<(Option<&'a str>, Option<u64>)>,
    cancel: Option<&'a str>,
    /// Where the rare fields (error, block, parent, key nonce) begin.
    end: usize,
}

impl<'a> View<'a> {
    fn parse(row: &'a [u8]) -> Result<(Head, View<'a>), Damaged> {
        let (head, _) = Head::split(row).ok_or(Damaged::new(0, "a head cut short"))?;
        let mut r = Reader {
            bytes: row,
            at: HEAD_LEN,
        };
        let version = r.u8()?;
        if version != VERSION {
            return Err(Damaged::new(
                HEAD_LEN,
                "an encoding version this build does not read",
            ));
        }
        let status = r.status()?;
        let flags = u16::from_le_bytes(r.take::<2>()?);
        if flags & !ALL != 0 {
            // An optional field a later build added (its bit), or a damaged byte.
            return Err(Damaged::new(
                HEAD_LEN + 2,
                "fields this build does not know (a row of a newer loops, or damaged)",
            ));
        }
        if flags & (HAS_WAIT_UNTIL | HAS_WAIT_EVENT) != 0 && flags & HAS_WAIT == 0 {
            return Err(Damaged::new(HEAD_LEN + 2, "a wait's fields without a wait"));
        }
        let has = |bit: u16| flags & bit != 0;
        let schema = SchemaHash::from_u64(r.u64()?);
        let (seq, attempt, attempt_base, interrupted) = (r.u64()?, r.u32()?, r.u32()?, r.u32()?);
        let (created_ms, updated_ms) = (r.u64()?, r.u64()?);
        let (workflow, state) = (r.str()?, r.str()?);
        let retry_at_ms = has(HAS_RETRY_AT).then(|| r.u64()).transpose()?;
        let entered = has(HAS_ENTERED).then(|| r.u64()).transpose()?;
        let until = has(HAS_WAIT_UNTIL).then(|| r.u64()).transpose()?;
        let event = has(HAS_WAIT_EVENT).then(|| r.str()).transpose()?;
        let cancel = has(HAS_CANCEL).then(|| r.str()).transpose()?;
        let view = View {
            flags,
            status,
            schema,
            seq,
            attempt,
            attempt_base,
            interrupted,
            created_ms,
            updated_ms,
            workflow,
            state,
            retry_at_ms,
            entered,
            wait: has(HAS_WAIT).then_some((event, until)),
            cancel,
            end: r.at,
        };
        Ok((head, view))
    }
}

/// A row being written.
struct Row(Vec<u8>);

impl Row {
    fn u32(&mut self, n: u32) {
        self.0.extend_from_slice(&n.to_le_bytes());
    }
    fn u64(&mut self, n: u64) {
        self.0.extend_from_slice(&n.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        // A string of 4 GiB or more cannot be in a row: redb's values are under 4 GiB.
        self.u32(u32::try_from(s.len()).unwrap_or(u32::MAX));
        self.0.extend_from_slice(s.as_bytes());
    }
    fn strs(&mut self, all: &[String]) {
        self.u32(u32::try_from(all.len()).unwrap_or(u32::MAX));
        for s in all {
            self.str(s);
        }
    }
}

/// What is wrong with a row: the field that did not decode, and where it began.
#[derive(Debug)]
struct Damaged {
    at: usize,
    what: &'static str,
}

impl Damaged {
    fn new(at: usize, what: &'static str) -> Damaged {
        Damaged { at, what }
    }

    /// The error of `run_id`'s row: [`Error::Decode`] of a run row, as a row of JSON that
    /// does not parse is.
    fn of(&self, run_id: &str) -> Error {
        Error::Decode {
            run_id: run_id.to_owned(),
            record: RecordKind::RunRow,
            seq: 0,
            state: String::new(),
            source: serde::de::Error::custom(format_args!("{} at byte {}", self.what, self.at)),
        }
    }
}

/// Reads a row's fields in order.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bad(&self, what: &'static str) -> Damaged {
        Damaged::new(self.at, what)
    }
    fn take<const N: usize>(&mut self) -> Result<[u8; N], Damaged> {
        let bytes = self
            .bytes
            .get(self.at..)
            .and_then(|rest| rest.first_chunk::<N>())
            .ok_or(self.bad("a field cut short"))?;
        self.at += N;
        Ok(*bytes)
    }
    fn u8(&mut self) -> Result<u8, Damaged> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, Damaged> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, Damaged> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn status(&mut self) -> Result<RunStatus, Damaged> {
        let at = self.at;
        RunStatus::from_code(self.u8()?).ok_or(Damaged::new(at, "an unknown status"))
    }
    fn str(&mut self) -> Result<&'a str, Damaged> {
        let at = self.at;
        let len = self.u32()? as usize;
        let bytes = self
            .at
            .checked_add(len)
            .and_then(|end| self.bytes.get(self.at..end))
            .ok_or(Damaged::new(at, "a string cut short"))?;
        let s = str::from_utf8(bytes).map_err(|_| Damaged::new(at, "a string not UTF-8"))?;
        self.at += len;
        Ok(s)
    }
    fn strs(&mut self) -> Result<Vec<String>, Damaged> {
        let at = self.at;
        let count = self.u32()? as usize;
        // Each string takes 4 bytes at least: a count beyond what is left is damage, and
        // no allocation is made from it.
        if count > self.bytes.len().saturating_sub(self.at) / 4 {
            return Err(Damaged::new(at, "a list longer than the row"));
        }
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            out.push(self.str()?.to_owned());
        }
        Ok(out)
    }
    fn end(&self) -> Result<(), Damaged> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(self.bad("bytes after the last field"))
        }
    }
}

#[cfg(test)]
#[path = "row_tests.rs"]
mod tests;
