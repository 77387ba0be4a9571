//! Panics, turned into one line and exit code 1.
//!
//! redb panics (rather than returning an error) on some kinds of damage to a file: a page of
//! the wrong type, malformed allocator state. Where loops catches such a panic it returns a
//! typed error, and `loops_core::silence_caught_redb_panics` (installed after this hook) keeps
//! the panic from reaching this hook. A redb panic that reaches it is reported as a damaged
//! store; any other panic is a bug, reported as one. Never a backtrace.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::failure::{Failure, one_line};

/// The store the command works on, for the message.
static STORE: OnceLock<PathBuf> = OnceLock::new();

/// What the last panic of the main thread said.
static LAST: Mutex<Option<Panic>> = Mutex::new(None);

#[derive(Debug, Clone)]
struct Panic {
    message: String,
    location: String,
    in_redb: bool,
}

/// Records the store path for panic messages.
pub fn set_store(path: &Path) {
    let _ = STORE.set(path.to_path_buf());
}

/// Replaces the default panic output: a panic of the main thread is kept for
/// [`failure`] (main catches it); a panic of another thread (the store's writer, a
/// blocking task) is printed at once and ends the process.
pub fn install() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned());
        let (location, in_redb) = info.location().map_or((String::new(), false), |l| {
            let file = l.file().replace('\\', "/");
            (
                format!("{}:{}", l.file(), l.line()),
                file.contains("/redb-"),
            )
        });
        let panic = Panic {
            message: one_line(&message),
            location,
            in_redb,
        };
        if std::thread::current().name() == Some("main") {
            *LAST.lock().unwrap_or_else(PoisonError::into_inner) = Some(panic);
        } else {
            let _ = writeln!(std::io::stderr().lock(), "error: {}", describe(&panic));
            std::process::exit(1);
        }
    }));
}

/// The failure for the panic the main thread just caught.
pub fn failure() -> Failure {
    let panic = LAST
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .unwrap_or(Panic {
            message: "unknown panic".to_owned(),
            location: String::new(),
            in_redb: false,
        });
    Failure::new(describe(&panic))
}

fn describe(panic: &Panic) -> String {
    let store = STORE.get().map_or_else(
        || "the store".to_owned(),
        |p| format!("store {}", p.display()),
    );
    if panic.in_redb {
        format!(
            "{store} is damaged: redb cannot read it ({}); restore it from a backup",
            panic.message
        )
    } else {
        format!(
            "internal error (a bug in loops; please report it): {} at {}",
            panic.message, panic.location
        )
    }
}
