//! The store file's format: recorded by a new file and by the first open of a file made
//! before the format was recorded; a file of another format is refused, read-only or not,
//! and keeps the format it records.

use redb::{Database, ReadableDatabase};

use super::tables::{META, STORE_FORMAT};
use crate::error::Error;
use crate::store::RedbStore;

/// The format `path` records, read with redb alone.
fn recorded(path: &std::path::Path) -> Option<u64> {
    let db = Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    super::tables::stored_format(&txn).unwrap()
}

/// Sets (or, with `None`, removes) the format `path` records, with redb alone.
fn record(path: &std::path::Path, format: Option<u64>) {
    let db = Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    match format {
        Some(format) => {
            txn.open_table(META)
                .unwrap()
                .insert("format", format)
                .unwrap();
        }
        None => {
            txn.delete_table(META).unwrap();
        }
    }
    txn.commit().unwrap();
}

/// Asserts that opening `path`, writable and read-only, is refused as a store of format
/// `found`, with the message `expected`.
fn refused_both_ways(path: &std::path::Path, found: u64, expected: &str) {
    for read_only in [false, true] {
        let opened = if read_only {
            RedbStore::open_read_only(path)
        } else {
            RedbStore::open(path)
        };
        match opened {
            Err(
                e @ Error::StoreFormat {
                    found: f,
                    supported: 3,
                    ..
                },
            ) if f == found => {
                assert_eq!(e.to_string(), expected);
            }
            Err(other) => panic!("read-only {read_only}: {other}"),
            Ok(_) => panic!("read-only {read_only}: opened a store of format {found}"),
        }
    }
}

#[test]
fn a_new_store_records_its_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    drop(RedbStore::open(&path).unwrap());
    assert_eq!(recorded(&path), Some(STORE_FORMAT));
    assert_eq!(STORE_FORMAT, 3);
}

#[test]
fn a_store_made_before_the_format_was_recorded_is_format_1_and_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    drop(RedbStore::open(&path).unwrap());
    record(&path, None);
    assert_eq!(recorded(&path), None);
    let expected = format!(
        "store {0} has format 1, which this build does not read (it reads format 3): run `loops upgrade {0}` to convert it to format 3 (it keeps a backup)",
        path.display()
    );
    refused_both_ways(&path, 1, &expected);
    // Nothing was recorded.
    assert_eq!(recorded(&path), None);
}

#[test]
fn a_store_of_a_newer_format_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    drop(RedbStore::open(&path).unwrap());
    record(&path, Some(4));
    let expected = format!(
        "store {} has format 4, written by a newer loops; this build reads format 3 only: open it with a loops that reads format 4",
        path.display()
    );
    refused_both_ways(&path, 4, &expected);
    // Nothing of loops was written to it (redb's own open marks its header, as any
    // writable open does): it still records format 4.
    assert_eq!(recorded(&path), Some(4));
}

/// What makes another application's tables in a new redb file.
type MakeTables = fn(&redb::WriteTransaction);

/// Another application's redb file with `make`'s tables, at `path`.
fn foreign_file(path: &std::path::Path, make: MakeTables) {
    let db = Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    make(&txn);
    txn.commit().unwrap();
}

/// The names of the tables of the file at `path`, as the store lists them.
fn table_names(path: &std::path::Path) -> Vec<String> {
    let db = Database::open(path).unwrap();
    super::tables::table_names(&db.begin_read().unwrap()).unwrap()
}

#[test]
fn a_redb_file_of_another_application_is_refused_and_left_as_it_is() {
    // Plain tables; only multimap tables (no plain table to list); a table named like one
    // of loops' (`runs`, without `status` and `schemas`); a `meta` table of other types than
    // loops'.
    let files: [(&str, MakeTables); 4] = [
        ("foo", |txn| {
            let foo: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("foo");
            txn.open_table(foo).unwrap().insert(1, 2).unwrap();
        }),
        ("tags", |txn| {
            let tags: redb::MultimapTableDefinition<u64, u64> =
                redb::MultimapTableDefinition::new("tags");
            txn.open_multimap_table(tags).unwrap().insert(1, 2).unwrap();
        }),
        ("runs", |txn| {
            let runs: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("runs");
            txn.open_table(runs).unwrap().insert("a", 2).unwrap();
        }),
        ("meta", |txn| {
            let meta: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("meta");
            txn.open_table(meta).unwrap().insert("format", "x").unwrap();
        }),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (table, make) in files {
        let path = dir.path().join(format!("{table}.redb"));
        foreign_file(&path, make);
        // The writable and the read-only open say the same.
        for opened in [RedbStore::open(&path), RedbStore::open_read_only(&path)] {
            match opened {
                Err(e @ Error::Open { .. }) => {
                    assert!(e.is_foreign_database(), "{e}");
                    assert_eq!(
                        e.to_string(),
                        format!(
                            "cannot open store {}: not a loops store: a redb database of another application (its tables: {table})",
                            path.display()
                        )
                    );
                }
                Err(other) => panic!("{table}: {other}"),
                Ok(_) => panic!("{table}: opened another application's database"),
            }
        }
        // Nothing of loops was added to it.
        assert_eq!(table_names(&path), [table]);
    }
}
