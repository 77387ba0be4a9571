//! `loops upgrade PATH`: converting a store file of an older format to this build's.

use loops_core::{RedbStore, Upgraded};

use crate::cli::UpgradeArgs;
use crate::failure::Result;
use crate::output::emit;

/// Converts the store file `args.path` ([`RedbStore::upgrade`]) and says what was done.
pub fn run(args: &UpgradeArgs) -> Result<()> {
    let path = &args.path;
    let text = match RedbStore::upgrade(path)? {
        Upgraded::Current { format } => format!(
            "{} has format {format} already: nothing to do\n",
            path.display()
        ),
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
