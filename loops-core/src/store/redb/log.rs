//! Format 2's log: every transition, step and failure record of every run, in one
//! append-only table keyed by a global sequence number, each entry chained to its run's
//! previous one; and the head a run's row carries, that leads to its newest entries.
//!
//! A batch of transitions of many runs appends to the end of one tree (a few pages)
//! instead of inserting into one leaf per run of three trees keyed by run. The records are
//! the bytes format 1 stored in `journal`, `steps` and `failures`, unchanged.
//!
//! # Entry
//! | bytes | what |
//! |-------|------|
//! | 1     | kind: 1 transition, 2 step, 3 failure |
//! | 8     | the global sequence of the run's previous entry (any kind); 0: none |
//! | 8     | transitions only: that of the run's previous transition; 0: none |
//! | 8     | seq of the state the record belongs to |
//! | 2 + n | the run id (length, then UTF-8) |
//! | 2 + n, 4 | steps only: the step name, then its occurrence |
//! | 4, 4  | failures only: the attempt, then the failure's index |
//! | rest  | the record |
//!
//! All integers little-endian. Global sequences start at 1; each new one is one more than
//! the log's last key.
//!
//! # Row
//! A run's row in `runs` is its head ([`HEAD_LEN`] bytes: the global sequences of its
//! newest entry and of its newest transition, 0 for none), then its
//! [`RunInfo`](crate::RunInfo) (`row` encodes it).

use redb::{ReadableTable, TableDefinition};

/// The log: global sequence → entry.
pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");

/// The length of the head that leads a run's row.
pub(crate) const HEAD_LEN: usize = 16;

const TRANSITION: u8 = 1;
const STEP: u8 = 2;
const FAILURE: u8 = 3;

/// Where a run's newest entries are in the log: the prefix of its row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Head {
    /// The global sequence of the run's newest entry; 0: none.
    pub last_entry: u64,
    /// The global sequence of the run's newest transition; 0: none.
    pub last_transition: u64,
}

impl Head {
    /// A row: this head, then `info` (the [`RunInfo`](crate::RunInfo) bytes, as `row`
    /// encodes them).
    pub(crate) fn row(self, info: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEAD_LEN + info.len());
        out.extend_from_slice(&self.last_entry.to_le_bytes());
        out.extend_from_slice(&self.last_transition.to_le_bytes());
        out.extend_from_slice(info);
        out
    }

    /// A row split into its head and its [`RunInfo`](crate::RunInfo) bytes; `None` if it is
    /// too short to hold a head.
    pub(crate) fn split(row: &[u8]) -> Option<(Head, &[u8])> {
        let (head, info) = row.split_at_checked(HEAD_LEN)?;
        let (entry, transition) = head.split_at(8);
        Some((
            Head {
                last_entry: u64::from_le_bytes(entry.try_into().ok()?),
                last_transition: u64::from_le_bytes(transition.try_into().ok()?),
            },
            info,
        ))
    }

    /// Records that `entry` (a global sequence) is the run's newest entry, and its newest
    /// transition if `transition`.
    pub(crate) fn advance(&mut self, entry: u64, transition: bool) {
        self.last_entry = entry;
        if transition {
            self.last_transition = entry;
        }
    }
}

/// What a log entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind<'a> {
    /// The transition record of its seq.
    Transition,
    /// A step record of the state at its seq.
    Step {
        /// The step's name.
        name: &'a str,
        /// Which use of the name, from 0.
        occurrence: u32,
    },
    /// A failure record of the state at its seq.
    Failure {
        /// The attempt that failed.
        attempt: u32,
        /// The failure's index within the attempt.
        index: u32,
    },
}

/// One entry of the log, borrowed from its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry<'a> {
    /// The run.
    pub run_id: &'a str,
    /// The seq of the state the record belongs to.
    pub seq: u64,
    /// What the record is.
    pub kind: Kind<'a>,
    /// The global sequence of the run's previous entry; 0: none.
    pub prev: u64,
    /// For a transition, the global sequence of the run's previous transition; 0: none (and
    /// for other kinds).
    pub prev_transition: u64,
    /// The record's bytes.
    pub record: &'a [u8],
}

impl<'a> Entry<'a> {
    /// The entry's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40 + self.run_id.len() + self.record.len());
        let tag = match self.kind {
            Kind::Transition => TRANSITION,
            Kind::Step { .. } => STEP,
            Kind::Failure { .. } => FAILURE,
        };
        out.push(tag);
        out.extend_from_slice(&self.prev.to_le_bytes());
        if tag == TRANSITION {
            out.extend_from_slice(&self.prev_transition.to_le_bytes());
        }
        out.extend_from_slice(&self.seq.to_le_bytes());
        put_str(&mut out, self.run_id);
        match self.kind {
            Kind::Transition => {}
            Kind::Step { name, occurrence } => {
                put_str(&mut out, name);
                out.extend_from_slice(&occurrence.to_le_bytes());
            }
            Kind::Failure { attempt, index } => {
                out.extend_from_slice(&attempt.to_le_bytes());
                out.extend_from_slice(&index.to_le_bytes());
            }
        }
        out.extend_from_slice(self.record);
        out
    }

    /// The entry `bytes` holds; `None` if they are not an entry.
    pub(crate) fn decode(bytes: &'a [u8]) -> Option<Entry<'a>> {
        let mut r = Reader(bytes);
        let tag = r.take(1)?[0];
        let prev = r.u64()?;
        let prev_transition = if tag == TRANSITION { r.u64()? } else { 0 };
        let seq = r.u64()?;
        let run_id = r.str()?;
        let kind = match tag {
            TRANSITION => Kind::Transition,
            STEP => Kind::Step {
                name: r.str()?,
                occurrence: r.u32()?,
            },
            FAILURE => Kind::Failure {
                attempt: r.u32()?,
                index: r.u32()?,
            },
            _ => return None,
        };
        Some(Entry {
            run_id,
            seq,
            kind,
            prev,
            prev_transition,
            record: r.0,
        })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Run ids and step names are at most a few hundred bytes (checked before any write);
    // a longer one is cut to what the length can say, and would not decode as its own.
    let len = u16::try_from(s.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..usize::from(len)]);
}

/// Reads an entry's fields in order.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn str(&mut self) -> Option<&'a str> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().ok()?);
        std::str::from_utf8(self.take(usize::from(len))?).ok()
    }
}

/// Why a walk of a run's entries stopped short.
#[derive(Debug)]
pub(crate) enum LogError {
    /// redb failed.
    Storage(redb::Error),
    /// The log does not hold what the run's chain says it does: the file is damaged.
    Damaged(String),
}

impl<E: Into<redb::Error>> From<E> for LogError {
    fn from(e: E) -> Self {
        LogError::Storage(e.into())
    }
}

impl LogError {
    /// As a redb error: [`redb::Error::Corrupted`] for a damaged chain.
    pub(crate) fn into_redb(self) -> redb::Error {
        match self {
            LogError::Storage(e) => e,
            LogError::Damaged(what) => redb::Error::Corrupted(what),
        }
    }
}

/// Which entries of a run a walk visits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chain {
    /// Every entry, newest first.
    All,
    /// The transitions, newest first.
    Transitions,
}

/// Calls `each` with the run's entries from `from` (a global sequence; 0: none) backwards
/// along `chain`, newest first, until `each` answers `false` or the chain ends.
///
/// # Errors
/// [`LogError::Damaged`] (naming the run, the entry's global sequence and, when known, its
/// seq) if the chain points at a missing entry, at one that does not decode or belongs to
/// another run, or does not go strictly backwards (so that a walk always ends).
pub(crate) fn walk(
    log: &impl ReadableTable<u64, &'static [u8]>,
    run_id: &str,
    from: u64,
    chain: Chain,
    mut each: impl FnMut(u64, &Entry<'_>) -> bool,
) -> Result<(), LogError> {
    let mut at = from;
    while at != 0 {
        let Some(bytes) = log.get(at)? else {
            return Err(LogError::Damaged(format!(
                "run `{run_id}`: its chain in the log points at entry {at}, which does not exist: the file is damaged"
            )));
        };
        let entry = Entry::decode(bytes.value()).ok_or_else(|| {
            LogError::Damaged(format!(
                "run `{run_id}`: log entry {at} is malformed: the file is damaged"
            ))
        })?;
        if entry.run_id != run_id {
            return Err(LogError::Damaged(format!(
                "run `{run_id}`: log entry {at} (seq {}) belongs to run `{}`: the file is damaged",
                entry.seq, entry.run_id
            )));
        }
        let next = match chain {
            Chain::All => entry.prev,
            Chain::Transitions if entry.kind == Kind::Transition => entry.prev_transition,
            Chain::Transitions => {
                return Err(LogError::Damaged(format!(
                    "run `{run_id}`: log entry {at} (seq {}) is on its chain of transitions but is not one: the file is damaged",
                    entry.seq
                )));
            }
        };
        if next >= at {
            return Err(LogError::Damaged(format!(
                "run `{run_id}`: log entry {at} (seq {}) points forwards, at {next}: the file is damaged",
                entry.seq
            )));
        }
        if !each(at, &entry) {
            break;
        }
        at = next;
    }
    Ok(())
}

/// Appends the record `record` of the run `run_id` (its `seq` and `kind`) to the log at `at`
/// (a global sequence above every key of the log), chained to the run's entries by `head`,
/// which then leads to it.
///
/// # Errors
/// redb's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn append(
    log: &mut redb::Table<'_, u64, &'static [u8]>,
    at: u64,
    head: &mut Head,
    run_id: &str,
    seq: u64,
    kind: Kind<'_>,
    record: &[u8],
) -> Result<(), redb::Error> {
    let transition = kind == Kind::Transition;
    let entry = Entry {
        run_id,
        seq,
        kind,
        prev: head.last_entry,
        prev_transition: if transition { head.last_transition } else { 0 },
        record,
    };
    log.insert(at, entry.encode().as_slice())?;
    head.advance(at, transition);
    Ok(())
}

/// The global sequence numbers of every entry of the run, newest first: what deleting it
/// removes.
///
/// # Errors
/// As [`walk`].
pub(crate) fn chain_of(
    log: &impl ReadableTable<u64, &'static [u8]>,
    run_id: &str,
    head: Head,
) -> Result<Vec<u64>, LogError> {
    let mut out = Vec::new();
    walk(log, run_id, head.last_entry, Chain::All, |at, _| {
        out.push(at);
        true
    })?;
    Ok(out)
}

/// The global sequence the next entry gets: one more than the log's last key, 1 for an
/// empty log.
pub(crate) fn next_sequence(log: &impl ReadableTable<u64, &'static [u8]>) -> Result<u64, LogError> {
    let last = log.last()?.map(|(key, _)| key.value());
    match last {
        None => Ok(1),
        Some(last) => last.checked_add(1).ok_or_else(|| {
            LogError::Damaged("the log's last key is the highest there is".to_owned())
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_rows_read_back_as_written() {
        let kinds = [
            Kind::Transition,
            Kind::Step {
                name: "fetch",
                occurrence: 3,
            },
            Kind::Failure {
                attempt: 2,
                index: 1,
            },
        ];
        for kind in kinds {
            let entry = Entry {
                run_id: "run-1",
                seq: 7,
                kind,
                prev: 41,
                prev_transition: if kind == Kind::Transition { 40 } else { 0 },
                record: b"{\"a\":1}",
            };
            let bytes = entry.encode();
            assert_eq!(Entry::decode(&bytes), Some(entry));
            for cut in 0..bytes.len() - entry.record.len() {
                assert_eq!(Entry::decode(&bytes[..cut]), None, "{kind:?} cut at {cut}");
            }
        }
        assert_eq!(Entry::decode(&[9; 40]), None);
        let head = Head {
            last_entry: 9,
            last_transition: 5,
        };
        let row = head.row(b"info");
        assert_eq!(Head::split(&row), Some((head, &b"info"[..])));
        assert_eq!(Head::split(&row[..HEAD_LEN - 1]), None);
    }
}
