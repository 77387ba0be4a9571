//! `loops upgrade [PATH]`: converting a store file of an older format to this build's.

use std::path::{Path, PathBuf};

use loops_core::{RedbStore, Upgraded};

use crate::cli::{Cli, UpgradeArgs};
use crate::failure::{Failure, Result};
use crate::open::{self, Target};
use crate::output::emit;

/// Converts the store file ([`RedbStore::upgrade`]) and says what was done: `args.path`, or
/// else the store (`--store` or LOOPS_STORE) of `cli`.
pub fn run(args: &UpgradeArgs, cli: &Cli) -> Result<()> {
    let path = file(args, cli)?;
    let upgraded = match RedbStore::upgrade(&path) {
        Err(loops_core::Error::StoreLocked { .. }) => {
            // As `loops check` says it: the command needs the file to itself.
            return Err(Failure::new(format!(
                "store {} is held by a running process: loops upgrade converts the file in place and needs it to itself; stop the process first",
                path.display()
            )));
        }
        // A damaged file as every other command says it (restore it from a backup).
        Err(e) if e.is_store_damage() => return Err(crate::open::open_failure(&path, e)),
        other => other?,
    };
    let text = match upgraded {
        Upgraded::Current { format } => format!(
            "{} has format {format} already: nothing to do\n",
            path.display()
        ),
        Upgraded::Repaired { format } => {
            crate::output::note(&format!(
                "{}; redb repaired it on this open",
                loops_core::Error::needs_repair(&path)
            ));
            format!(
                "{} has format {format} already: nothing else to do\n",
                path.display()
            )
        }
        Upgraded::Converted {
            from,
            to,
            backup,
            runs,
            records,
        } => {
            let moved = if records > 0 {
                format!(", {records} records moved to the log")
            } else {
                String::new()
            };
            format!(
                "upgraded {} from format {from} to format {to}: {runs} runs{moved}\n  backup of the file as it was: {}\n",
                path.display(),
                backup.display()
            )
        }
        // A later kind of outcome: said as it is.
        other => format!("{}: {other:?}\n", path.display()),
    };
    emit(&text)
}

/// The file to convert: PATH, which LOOPS_STORE does not override; else the store. PATH and
/// a `--store` that names another store are refused, and so is a PostgreSQL store (whose URL,
/// which may hold a password, is not printed).
fn file(args: &UpgradeArgs, cli: &Cli) -> Result<PathBuf> {
    const POSTGRES: &str = "a PostgreSQL database, which has no file format to convert";
    let given = cli.store.as_ref().filter(|s| !s.as_os_str().is_empty());
    let store = match given {
        Some(_) => Some(open::target(cli.store.clone(), cli.pg_schema.clone())?),
        None => None,
    };
    let flag = cli.store_on_command_line;
    match (&args.path, store) {
        (Some(path), Some(Target::File(store))) if flag && !same_file(path, &store) => {
            Err(Failure::usage(format!(
                "upgrade {} and --store {} name two files: give the file once, as PATH or as --store",
                path.display(),
                store.display()
            )))
        }
        (Some(path), Some(Target::Postgres { .. })) if flag => Err(Failure::usage(format!(
            "upgrade {} and --store name two stores (--store is {POSTGRES}): give the file once, as PATH or as --store",
            path.display()
        ))),
        (Some(path), _) => Ok(path.clone()),
        (None, Some(Target::File(store))) => Ok(store),
        // Exit code 1, as check and compact on a PostgreSQL store: the command is right,
        // the store is not one it works on.
        (None, Some(Target::Postgres { .. })) => Err(Failure::new(format!(
            "the store is {POSTGRES}: loops upgrade converts a redb file"
        ))),
        (None, None) => Err(Failure::usage(
            "no file to convert: pass PATH, or --store PATH, or set LOOPS_STORE",
        )),
    }
}

/// Whether `a` and `b` name the same file: the same path, or the same file once resolved.
fn same_file(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(a), Ok(b)) if a == b
        )
}
