//! Quiet panics: redb's panics that loops turns into errors, unprinted.
//!
//! redb panics, rather than returning an error, on some kinds of damage to a file (a page of
//! the wrong type, malformed allocator state). loops catches those panics around each of its
//! calls into redb and returns a typed error instead: [`Error::Open`](crate::Error::Open)
//! when a store opens, [`Error::Storage`](crate::Error::Storage) on a read or a commit. But
//! the process's panic hook runs before the panic is caught, and the default hook prints
//! `thread 'main' panicked at .../redb-.../page_manager.rs` and a backtrace hint above the
//! clean error a program then prints.
//!
//! [`silence_caught_redb_panics`] installs a hook that prints nothing for exactly those
//! panics, and hands every other one to the hook that was installed before it. loops never
//! installs a hook by itself: the panic hook belongs to the program, which opts in, typically
//! first thing in `main`.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::sync::Once;

thread_local! {
    /// How many [`catch`] calls this thread is inside.
    static CATCHING: Cell<u32> = const { Cell::new(0) };
}

/// Installs, once per process, a panic hook that prints nothing for a panic raised inside
/// redb while loops is catching it (loops returns a typed error for it instead), and passes
/// every other panic to the hook installed before it: the default one, or the program's own.
///
/// Call it after installing a hook of your own, if any, so that yours receives the panics
/// passed on. Calling it again does nothing. A panic in redb that loops does not catch, and
/// a panic of your own code or of loops, is passed on as before.
///
/// ```no_run
/// // First thing in `main`:
/// loops_core::silence_caught_redb_panics();
/// // A damaged store file is now one clean error, with no redb panic printed above it.
/// match loops_core::RedbStore::open("runs.redb") {
///     Ok(_store) => {}
///     Err(e) => eprintln!("error: {e}"),
/// }
/// ```
pub fn silence_caught_redb_panics() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !is_caught_redb_panic(info) {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, catching a panic it raises (as [`std::panic::catch_unwind`]); marks the thread
/// as inside loops's catch meanwhile, for the hook of [`silence_caught_redb_panics`].
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    /// Leaves the mark however `f` ends.
    struct Inside;
    impl Drop for Inside {
        fn drop(&mut self) {
            let _ = CATCHING.try_with(|c| c.set(c.get().saturating_sub(1)));
        }
    }
    let _ = CATCHING.try_with(|c| c.set(c.get() + 1));
    let _inside = Inside;
    std::panic::catch_unwind(AssertUnwindSafe(f))
}

/// Whether `info` is a panic raised in redb's code while this thread is inside [`catch`].
fn is_caught_redb_panic(info: &PanicHookInfo<'_>) -> bool {
    let catching = CATCHING.try_with(Cell::get).unwrap_or(0) > 0;
    catching && info.location().is_some_and(|l| in_redb(l.file()))
}

/// Whether the source file `file` (a panic's location) belongs to the redb crate: a path
/// with a crate directory `redb-<version>` (as cargo unpacks a registry crate) or `redb`,
/// holding `src`. loops's own `store/redb/` folder has no `src` in it, and is not redb.
fn in_redb(file: &str) -> bool {
    let dirs: Vec<&str> = file.split(['/', '\\']).collect();
    dirs.windows(2).any(|pair| {
        let (dir, next) = (pair[0], pair[1]);
        next == "src"
            && (dir == "redb"
                || dir
                    .strip_prefix("redb-")
                    .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit())))
    })
}

/// The message of a caught panic: its payload when it is a string.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic whose payload is not a string".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redb_sources_are_told_apart() {
        for file in [
            "/home/u/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/redb-4.6.0/src/db.rs",
            r"C:\Users\u\.cargo\registry\src\index.crates.io-1\redb-4.6.0\src\db.rs",
            "vendor/redb/src/tree_store/btree.rs",
        ] {
            assert!(in_redb(file), "{file}");
        }
        for file in [
            "loops-core/src/store/redb.rs",
            "loops-core/src/store/redb/read.rs",
            r"C:\loops\loops-core\src\store\redb\commit.rs",
            "/registry/src/index/redb-derive-1.0.0/src/lib.rs",
            "/registry/src/index/redbx-1.0.0/src/lib.rs",
            "src/main.rs",
        ] {
            assert!(!in_redb(file), "{file}");
        }
    }

    #[test]
    fn catch_marks_the_thread_while_it_runs_and_after_a_panic_no_longer() {
        let depth = || CATCHING.with(Cell::get);
        assert_eq!(depth(), 0);
        let inner = catch(|| (depth(), catch(depth).ok()));
        assert_eq!(inner.ok(), Some((1, Some(2))));
        assert_eq!(depth(), 0);
        let caught = catch(|| -> u32 { std::panic::panic_any(depth()) });
        let payload = caught.expect_err("it panicked");
        assert_eq!(payload.downcast_ref::<u32>(), Some(&1));
        assert_eq!(depth(), 0);
    }
}
