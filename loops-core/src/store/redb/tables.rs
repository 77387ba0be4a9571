//! The tables of the store file, and the set of them a write transaction opens lazily.

use redb::{
    Database, MultimapTableHandle, ReadableDatabase, ReadableTable, TableDefinition, TableError,
    TableHandle,
};

use super::log::{LOG, LogError, next_sequence};
use super::step_keys::StepKeys;

/// The runs' rows: run id → the run's [`Head`](super::log::Head) in the log, then its
/// [`RunInfo`](crate::RunInfo) bytes.
pub(crate) const RUNS: TableDefinition<&str, &[u8]> = TableDefinition::new("runs");
pub(crate) const STATUS: TableDefinition<(u8, &str, &str), ()> = TableDefinition::new("status");
pub(crate) const SCHEMAS: TableDefinition<&str, &str> = TableDefinition::new("schemas");
pub(crate) const INBOX: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("inbox");
pub(crate) const PENDING: TableDefinition<(&str, &str, u64), ()> = TableDefinition::new("pending");
pub(crate) const EVENT_KEYS: TableDefinition<(&str, &str), u64> =
    TableDefinition::new("event_keys");
/// The ids of the keys that sealed payloads in the store, with the time each was first
/// recorded (ms since the Unix epoch): [`Write::Seal`](crate::store::Write::Seal).
pub(crate) const SEALING: TableDefinition<&str, u64> = TableDefinition::new("sealing");
/// Key id → its check value (`PayloadCodec::key_check`), for the keys of `sealing` whose
/// codec gives one. A file written before it lacks the table: its keys have no check.
pub(crate) const SEALING_CHECKS: TableDefinition<&str, &str> =
    TableDefinition::new("sealing_checks");

/// A run's attributes: (run id, key) → the value's index bytes
/// ([`AttributeValue::index_bytes`](crate::AttributeValue::index_bytes)), for display.
pub(crate) const ATTRIBUTES: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("attributes");
/// The attribute index: (key, the value's index bytes, run id) → `()`: a key's runs by value,
/// so an equality or a range is one range scan.
pub(crate) const ATTRIBUTE_INDEX: TableDefinition<(&str, &[u8], &str), ()> =
    TableDefinition::new("attribute_index");

/// A run's children: (parent run id, child run id) → `()`, written with the child's row
/// ([`RunInfo::parent`](crate::RunInfo::parent)), deleted when the child is pruned.
pub(crate) const CHILDREN: TableDefinition<(&str, &str), ()> = TableDefinition::new("children");
/// Schedules: name → the [`ScheduleInfo`](crate::ScheduleInfo) row (JSON).
pub(crate) const SCHEDULES: TableDefinition<&str, &[u8]> = TableDefinition::new("schedules");

/// What the file says of itself: `"format"` → [`STORE_FORMAT`], the layout its tables
/// follow.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The key of the file's format in [`META`].
const FORMAT_KEY: &str = "format";

/// The layout of the store file (its tables, their keys and values) that this build reads and
/// writes. A file records it when it is created, or when a build that knows the number first
/// opens a file made before it was recorded (those have this layout: the number came with it).
/// A file of another format is refused at the open ([`Error::StoreFormat`](crate::Error::StoreFormat)),
/// never misread; a change of the layout raises the number.
///
/// Format 1 kept each run's records in three tables keyed by run (`journal`, `steps`,
/// `failures`); format 2 keeps them in one append-only log; format 3 encodes each run's row
/// in binary instead of JSON ([`RedbStore::upgrade`](crate::RedbStore::upgrade) converts a
/// file of format 1 or 2).
pub const STORE_FORMAT: u64 = 3;

/// The format of a file that records none but has loops' tables: they came before the
/// number.
pub(crate) const UNRECORDED_FORMAT: u64 = 1;

const TABLES: [&str; 14] = [
    "meta",
    "runs",
    "log",
    "status",
    "schemas",
    "inbox",
    "pending",
    "event_keys",
    "sealing",
    "sealing_checks",
    "attributes",
    "attribute_index",
    "children",
    "schedules",
];

/// Why [`ensure_tables`] did not open a file.
#[derive(Debug)]
pub(super) enum NotOpened {
    /// The file records a format this build does not read (the number it records).
    Format(u64),
    /// The file is a redb database of another application: it has these tables, and neither
    /// a recorded format nor loops' tables.
    Foreign(Vec<String>),
    /// redb failed.
    Redb(redb::Error),
}

impl<E: Into<redb::Error>> From<E> for NotOpened {
    fn from(e: E) -> Self {
        NotOpened::Redb(e.into())
    }
}

/// The format the file records in [`META`], if it records one.
pub(super) fn stored_format(
    txn: &redb::ReadTransaction,
) -> std::result::Result<Option<u64>, redb::Error> {
    let table = match txn.open_table(META) {
        Ok(table) => table,
        // Another application's table of that name records no loops format.
        Err(
            redb::TableError::TableDoesNotExist(_)
            | redb::TableError::TableTypeMismatch { .. }
            | redb::TableError::TableIsMultimap(_),
        ) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(table.get(FORMAT_KEY)?.map(|v| v.value()))
}

/// What a redb file holds, by its tables and the format it records: the one rule that every
/// open (writable, read-only, `loops upgrade`) applies before it reads a loops table.
#[derive(Debug, PartialEq)]
pub(crate) enum Contents {
    /// No table: a new file.
    Empty,
    /// A loops store of this format: the one it records, or [`UNRECORDED_FORMAT`] for a file
    /// with the tables of loops' every format (`runs`, `status`, `schemas`) that records none.
    Format(u64),
    /// Another application's database: its tables (it has neither a recorded format nor
    /// loops' tables).
    Foreign(Vec<String>),
}

impl Contents {
    /// The contents of a file with the tables `present` that records `format`.
    fn of(present: &[String], format: Option<u64>) -> Contents {
        match format {
            Some(format) => Contents::Format(format),
            None if ["runs", "status", "schemas"]
                .iter()
                .all(|t| present.iter().any(|p| p == t)) =>
            {
                Contents::Format(UNRECORDED_FORMAT)
            }
            None if present.is_empty() => Contents::Empty,
            None => Contents::Foreign(present.to_vec()),
        }
    }
}

/// The names of the file's tables, multimap tables included (loops has none: a file with
/// only those is another application's, not an empty one).
pub(super) fn table_names(
    txn: &redb::ReadTransaction,
) -> std::result::Result<Vec<String>, redb::Error> {
    let mut names: Vec<String> = txn.list_tables()?.map(|t| t.name().to_owned()).collect();
    names.extend(txn.list_multimap_tables()?.map(|t| t.name().to_owned()));
    Ok(names)
}

/// What the file holds ([`Contents`]).
pub(crate) fn contents(txn: &redb::ReadTransaction) -> std::result::Result<Contents, redb::Error> {
    Ok(Contents::of(&table_names(txn)?, stored_format(txn)?))
}

/// The cause of the [`Error::Open`](crate::Error::Open) that refuses another application's
/// redb file, as every open says it ([`Error::is_foreign_database`](crate::Error::is_foreign_database)).
#[derive(Debug)]
pub(crate) struct ForeignDatabase {
    /// The file's tables.
    pub(crate) tables: Vec<String>,
}

impl std::fmt::Display for ForeignDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "not a loops store: a redb database of another application (its tables: {})",
            self.tables.join(", ")
        )
    }
}

impl std::error::Error for ForeignDatabase {}

impl crate::Error {
    /// Whether this is an open's refusal of a redb file of another application (one with
    /// tables, and neither loops' tables nor a loops format): no loops table was added to
    /// it. A program that deletes a store it cannot open (to start over) must not delete
    /// such a file: it is not a damaged store.
    pub fn is_foreign_database(&self) -> bool {
        matches!(self, crate::Error::Open { cause, .. } if cause.is::<ForeignDatabase>())
    }
}

/// Records in `txn` that the file has this build's format, [`STORE_FORMAT`].
pub(super) fn record_format(txn: &redb::WriteTransaction) -> std::result::Result<(), redb::Error> {
    txn.open_table(META)?.insert(FORMAT_KEY, STORE_FORMAT)?;
    Ok(())
}

/// Checks the file's format, then creates the tables a new file lacks and records the format
/// if it is not recorded; writes nothing to a file that has them all and its format.
///
/// # Errors
/// [`NotOpened::Format`] if the file records a format other than [`STORE_FORMAT`];
/// [`NotOpened::Foreign`] for another application's redb file (no table is added to either;
/// redb's writable open itself rewrites the file's header and allocator state, as it does at
/// every open and close).
pub(super) fn ensure_tables(db: &Database) -> std::result::Result<(), NotOpened> {
    let (present, format): (Vec<String>, Option<u64>) = {
        let txn = db.begin_read()?;
        (table_names(&txn)?, stored_format(&txn)?)
    };
    match Contents::of(&present, format) {
        Contents::Format(STORE_FORMAT) | Contents::Empty => {}
        Contents::Format(other) => return Err(NotOpened::Format(other)),
        Contents::Foreign(tables) => return Err(NotOpened::Foreign(tables)),
    }
    if format.is_some() && TABLES.iter().all(|w| present.iter().any(|p| p == w)) {
        return Ok(());
    }
    let txn = db.begin_write()?;
    if format.is_none() {
        record_format(&txn)?;
    }
    txn.open_table(RUNS)?;
    txn.open_table(LOG)?;
    txn.open_table(STATUS)?;
    txn.open_table(SCHEMAS)?;
    txn.open_table(INBOX)?;
    txn.open_table(PENDING)?;
    txn.open_table(EVENT_KEYS)?;
    txn.open_table(SEALING)?;
    txn.open_table(SEALING_CHECKS)?;
    txn.open_table(ATTRIBUTES)?;
    txn.open_table(ATTRIBUTE_INDEX)?;
    txn.open_table(CHILDREN)?;
    txn.open_table(SCHEDULES)?;
    txn.commit()?;
    Ok(())
}

/// The tables of one write transaction, each opened on its first use: redb does work for
/// every open table at the open and again at the commit (about 7 000 instructions per table),
/// and most writes touch two or three of the thirteen.
pub(super) struct Tables<'t> {
    txn: &'t redb::WriteTransaction,
    /// The store's cache of step keys, for [`record_taken`](super::apply).
    pub(super) step_keys: &'t StepKeys,
    /// The global sequence of the next entry appended to the log, once read.
    next: Option<u64>,
    runs: Lazy<'t, &'static str, &'static [u8]>,
    log: Lazy<'t, u64, &'static [u8]>,
    status: Lazy<'t, (u8, &'static str, &'static str), ()>,
    schemas: Lazy<'t, &'static str, &'static str>,
    inbox: Lazy<'t, (&'static str, u64), &'static [u8]>,
    pending: Lazy<'t, (&'static str, &'static str, u64), ()>,
    event_keys: Lazy<'t, (&'static str, &'static str), u64>,
    sealing: Lazy<'t, &'static str, u64>,
    sealing_checks: Lazy<'t, &'static str, &'static str>,
    attributes: Lazy<'t, (&'static str, &'static str), &'static [u8]>,
    attribute_index: Lazy<'t, AttributeIndexKey, ()>,
    children: Lazy<'t, (&'static str, &'static str), ()>,
    schedules: Lazy<'t, &'static str, &'static [u8]>,
}

/// A table of [`Tables`]: `None` until first used.
type Lazy<'t, K, V> = Option<redb::Table<'t, K, V>>;
type AttributeIndexKey = (&'static str, &'static [u8], &'static str);

/// One accessor per table of [`Tables`], named after it, that opens it on first use.
macro_rules! table_accessors {
    ($($name:ident: $def:ident => ($k:ty, $v:ty);)*) => {
        impl<'t> Tables<'t> {
            pub(super) fn new(txn: &'t redb::WriteTransaction, step_keys: &'t StepKeys) -> Self {
                Tables { txn, step_keys, next: None, $($name: None),* }
            }

            $(
                pub(super) fn $name(
                    &mut self,
                ) -> std::result::Result<&mut redb::Table<'t, $k, $v>, redb::TableError> {
                    let table = match self.$name.take() {
                        Some(table) => table,
                        None => self.txn.open_table($def)?,
                    };
                    Ok(self.$name.insert(table))
                }
            )*
        }
    };
}

table_accessors! {
    runs: RUNS => (&'static str, &'static [u8]);
    log: LOG => (u64, &'static [u8]);
    status: STATUS => ((u8, &'static str, &'static str), ());
    schemas: SCHEMAS => (&'static str, &'static str);
    inbox: INBOX => ((&'static str, u64), &'static [u8]);
    pending: PENDING => ((&'static str, &'static str, u64), ());
    event_keys: EVENT_KEYS => ((&'static str, &'static str), u64);
    sealing: SEALING => (&'static str, u64);
    sealing_checks: SEALING_CHECKS => (&'static str, &'static str);
    attributes: ATTRIBUTES => ((&'static str, &'static str), &'static [u8]);
    attribute_index: ATTRIBUTE_INDEX => (AttributeIndexKey, ());
    children: CHILDREN => ((&'static str, &'static str), ());
    schedules: SCHEDULES => (&'static str, &'static [u8]);
}

/// Read access to the tables a write's [plan](crate::store::plan) reads its facts from
/// ([`planned`](super::apply::planned)): a write transaction's [`Tables`], or a read
/// transaction's [`ReadTables`] (a read-only store's answer to a write). `'s`: the life of
/// the store's cache of step keys.
pub(super) trait Reads<'s> {
    /// The store's cache of step keys, for [`record_taken`](super::apply).
    fn step_keys(&self) -> &'s StepKeys;
    /// The runs' rows.
    fn runs(&mut self) -> Result<&impl ReadableTable<&'static str, &'static [u8]>, TableError>;
    /// The log of records.
    fn log(&mut self) -> Result<&impl ReadableTable<u64, &'static [u8]>, TableError>;
    /// The schema descriptions.
    fn schemas(&mut self) -> Result<&impl ReadableTable<&'static str, &'static str>, TableError>;
    /// The runs' events.
    fn inbox(
        &mut self,
    ) -> Result<&impl ReadableTable<(&'static str, u64), &'static [u8]>, TableError>;
    /// The events not yet taken by a wait.
    fn pending(
        &mut self,
    ) -> Result<&impl ReadableTable<(&'static str, &'static str, u64), ()>, TableError>;
    /// The idempotency keys of events.
    fn event_keys(
        &mut self,
    ) -> Result<&impl ReadableTable<(&'static str, &'static str), u64>, TableError>;
    /// The children index.
    fn children(
        &mut self,
    ) -> Result<&impl ReadableTable<(&'static str, &'static str), ()>, TableError>;
    /// The schedules' rows.
    fn schedules(&mut self)
    -> Result<&impl ReadableTable<&'static str, &'static [u8]>, TableError>;
}

/// The tables of one read transaction that a write's plan reads, each opened on its first
/// use (see [`Reads`]).
pub(super) struct ReadTables<'t> {
    txn: &'t redb::ReadTransaction,
    step_keys: &'t StepKeys,
    runs: Option<redb::ReadOnlyTable<&'static str, &'static [u8]>>,
    log: Option<redb::ReadOnlyTable<u64, &'static [u8]>>,
    schemas: Option<redb::ReadOnlyTable<&'static str, &'static str>>,
    inbox: Option<redb::ReadOnlyTable<(&'static str, u64), &'static [u8]>>,
    pending: Option<redb::ReadOnlyTable<(&'static str, &'static str, u64), ()>>,
    event_keys: Option<redb::ReadOnlyTable<(&'static str, &'static str), u64>>,
    children: Option<redb::ReadOnlyTable<(&'static str, &'static str), ()>>,
    schedules: Option<redb::ReadOnlyTable<&'static str, &'static [u8]>>,
}

impl<'t> ReadTables<'t> {
    /// The tables of `txn`, none opened yet; `step_keys`: a cache of step keys for this
    /// transaction's plans.
    pub(super) fn new(txn: &'t redb::ReadTransaction, step_keys: &'t StepKeys) -> Self {
        ReadTables {
            txn,
            step_keys,
            runs: None,
            log: None,
            schemas: None,
            inbox: None,
            pending: None,
            event_keys: None,
            children: None,
            schedules: None,
        }
    }
}

/// The [`Reads`] of [`Tables`] and [`ReadTables`]: one accessor per table, named after it,
/// the inherent one of [`Tables`] (which opens the table for writing), or one that opens it
/// read-only on first use.
macro_rules! reads {
    ($($name:ident: $def:ident => ($k:ty, $v:ty);)*) => {
        impl<'t> Reads<'t> for Tables<'t> {
            fn step_keys(&self) -> &'t StepKeys {
                self.step_keys
            }
            $(
                fn $name(&mut self) -> Result<&impl ReadableTable<$k, $v>, TableError> {
                    Tables::$name(self).map(|table| &*table)
                }
            )*
        }

        impl<'t> Reads<'t> for ReadTables<'t> {
            fn step_keys(&self) -> &'t StepKeys {
                self.step_keys
            }
            $(
                fn $name(&mut self) -> Result<&impl ReadableTable<$k, $v>, TableError> {
                    let table = match self.$name.take() {
                        Some(table) => table,
                        None => self.txn.open_table($def)?,
                    };
                    Ok(self.$name.insert(table))
                }
            )*
        }
    };
}

reads! {
    runs: RUNS => (&'static str, &'static [u8]);
    log: LOG => (u64, &'static [u8]);
    schemas: SCHEMAS => (&'static str, &'static str);
    inbox: INBOX => ((&'static str, u64), &'static [u8]);
    pending: PENDING => ((&'static str, &'static str, u64), ());
    event_keys: EVENT_KEYS => ((&'static str, &'static str), u64);
    children: CHILDREN => ((&'static str, &'static str), ());
    schedules: SCHEDULES => (&'static str, &'static [u8]);
}

impl Tables<'_> {
    /// Takes the global sequence of the next entry of the log: one more than the last
    /// key's the first time, then one more than the one taken before.
    pub(super) fn take_sequence(&mut self) -> std::result::Result<u64, LogError> {
        let next = match self.next {
            Some(next) => next,
            None => next_sequence(self.log()?)?,
        };
        self.next = Some(next.checked_add(1).ok_or_else(|| {
            LogError::Damaged("the log's sequence numbers are used up".to_owned())
        })?);
        Ok(next)
    }
}

/// A string above every valid event name, idempotency key or run id (at most 256 bytes): 65
/// times the highest code point, 260 bytes. Bounds range scans over `(run id, name, ..)`
/// and `(parent, child)` keys.
pub(super) fn name_upper_bound() -> String {
    char::MAX.to_string().repeat(65)
}

/// A string above every valid attribute key (ASCII, at most 64 bytes): bounds range scans
/// over `(run id, key)` keys.
pub(crate) const ATTRIBUTE_KEY_ABOVE: &str = "\u{7f}";
