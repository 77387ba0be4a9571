//! The control endpoint's socket next to a store file: its name, and the removal of one a
//! killed process left. Always compiled (the `control` feature serves and reaches the socket;
//! every writable open cleans up after a killed server, with the feature or without it).

use std::path::{Path, PathBuf};

/// The socket next to the redb store file `store`: the file's path with `.sock` appended,
/// the target's when `store` is a symbolic link (see
/// [`control::socket_path`](crate::control::socket_path), which is this).
pub(crate) fn next_to(store: &Path) -> PathBuf {
    let linked = std::fs::symlink_metadata(store).is_ok_and(|meta| meta.file_type().is_symlink());
    let store = match linked.then(|| store.canonicalize()) {
        Some(Ok(file)) => file,
        _ => store.to_path_buf(),
    };
    let mut name = store.into_os_string();
    name.push(".sock");
    PathBuf::from(name)
}

/// Removes the socket next to `store` if it is a socket that nobody answers on: a process
/// serving the store's control endpoint was killed (SIGKILL) and could not remove it. Called
/// by a writable open, which holds the store's lock, so that no process serving the store can
/// be running. A socket that answers (another endpoint given that path), and anything that is
/// not a socket, is left as it is. Best effort: a failure to remove it changes nothing else.
#[cfg(unix)]
pub(super) fn remove_stale(store: &Path) {
    use std::os::unix::fs::FileTypeExt as _;
    let socket = next_to(store);
    let is_socket = std::fs::symlink_metadata(&socket).is_ok_and(|m| m.file_type().is_socket());
    if !is_socket {
        return;
    }
    let refused = std::os::unix::net::UnixStream::connect(&socket)
        .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
    if refused && std::fs::remove_file(&socket).is_ok() {
        tracing::info!(socket = %socket.display(), "removed the control socket a killed process left");
    }
}

#[cfg(not(unix))]
pub(super) fn remove_stale(_: &Path) {}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::store::redb::RedbStore;

    /// A new store `agent.redb` in a directory of its own (kept while the guard lives).
    fn new_store() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("agent.redb");
        drop(RedbStore::open(&store).unwrap());
        (dir, store)
    }

    /// A socket bound and closed without removing its file, as a killed server leaves it.
    fn stale_socket(path: &Path) {
        drop(std::os::unix::net::UnixListener::bind(path).unwrap());
        assert!(path.exists());
    }

    #[test]
    fn a_writable_open_removes_a_stale_socket_and_keeps_a_live_one() {
        let (dir, store) = new_store();
        let socket = dir.path().join("agent.redb.sock");
        assert_eq!(next_to(&store), socket);

        stale_socket(&socket);
        drop(RedbStore::open(&store).unwrap());
        assert!(!socket.exists(), "the stale socket is removed");

        // Answered: another endpoint was given this path; it stays.
        let live = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        drop(RedbStore::open(&store).unwrap());
        assert!(socket.exists(), "a socket that answers stays");
        drop(live);
        std::fs::remove_file(&socket).unwrap();

        // Not a socket: someone's file.
        std::fs::write(&socket, "mine").unwrap();
        drop(RedbStore::open(&store).unwrap());
        assert_eq!(std::fs::read_to_string(&socket).unwrap(), "mine");
    }

    #[test]
    fn a_read_only_open_leaves_a_stale_socket() {
        let (_dir, store) = new_store();
        let socket = next_to(&store);
        stale_socket(&socket);
        drop(RedbStore::open_read_only(&store).unwrap());
        assert!(socket.exists());
    }

    #[test]
    fn a_link_to_the_store_names_the_socket_next_to_its_target() {
        let (dir, store) = new_store();
        let link = dir.path().join("link.redb");
        std::os::unix::fs::symlink(&store, &link).unwrap();
        let socket = next_to(&store);
        stale_socket(&socket);
        drop(RedbStore::open(&link).unwrap());
        assert!(!socket.exists());
    }
}
