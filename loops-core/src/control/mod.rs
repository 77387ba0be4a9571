//! The control endpoint: the running process answers the `loops` CLI's reads and steering
//! commands (list, show, history, schema, send, cancel, retry, prune, compact) over JSON on
//! HTTP, so that a store the process holds can be inspected and steered from outside while
//! it runs. Behind the `control` feature.
//!
//! - [`Runtime::serve_control`](crate::Runtime::serve_control) starts the server on an
//!   [`Endpoint`]: by default a Unix domain socket next to the store file
//!   ([`socket_path`]: `STORE.sock`), mode 0600, so that only the store's owner can connect;
//!   or TCP, with a bearer token read from a file that only its owner may read.
//! - Every read goes to the runtime's store ([`Runtime::store`](crate::Runtime::store)) and
//!   every write through the runtime's own API ([`Runtime::send`](crate::Runtime::send),
//!   [`cancel`](crate::Runtime::cancel), [`retry`](crate::Runtime::retry),
//!   [`prune_with`](crate::Runtime::prune_with), [`compact`](crate::Runtime::compact)): the
//!   same commit path, and the same wake-ups, as a call in the process.
//! - [`Client`] is the other end, which `loops` uses.
//!
//! The protocol (paths, bodies, errors, version check) is in [`wire`] and in
//! `docs/operations.md`.

mod answer;
mod client;
mod server;
pub mod wire;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use answer::MAX_BODY_BYTES;
pub use client::{CONNECT_TIMEOUT, Client};
pub use server::ControlServer;
pub use wire::ErrorKind;

/// Where a control endpoint listens (for [`Runtime::serve_control`](crate::Runtime::serve_control))
/// or where a [`Client`] connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix domain socket at this path. The server creates it with mode 0600 (owner only)
    /// and removes it when it stops; requests need no token (the file's mode is the check).
    Unix(PathBuf),
    /// TCP at this address, every request with `Authorization: Bearer TOKEN`, the token
    /// being the contents of `token_file` (white space at either end ignored). The server
    /// refuses to start without a token, and refuses a token file that others may read.
    Tcp {
        /// The address; [`Endpoint::loopback`] gives one on 127.0.0.1.
        addr: SocketAddr,
        /// The file holding the token (mode 0600 or stricter).
        token_file: PathBuf,
    },
}

impl Endpoint {
    /// The Unix socket next to the redb store file at `store`: [`socket_path`]`(store)`.
    pub fn next_to(store: impl AsRef<Path>) -> Endpoint {
        Endpoint::Unix(socket_path(store.as_ref()))
    }

    /// Checks what can be checked of the endpoint before anything is made for it: a Unix
    /// socket's path must fit the system's limit on one (107 bytes on Linux, 103 on macOS
    /// and the BSDs), less the suffix of the temporary name it is first bound under (the
    /// process id). [`Runtime::serve_control`](crate::Runtime::serve_control) makes the same
    /// check; a program that serves an endpoint after a setup of its own (a work directory,
    /// a store) can make it first, so that a path too long is refused before that setup.
    /// TCP endpoints pass.
    ///
    /// # Errors
    /// [`ControlError::Bind`] naming the path's length, the limit, and what to do.
    pub fn check_name(&self) -> Result<(), ControlError> {
        match self {
            Endpoint::Unix(path) => check_socket_path(path, self),
            Endpoint::Tcp { .. } => Ok(()),
        }
    }

    /// TCP on 127.0.0.1 at `port` (0: any free port; [`ControlServer::endpoint`] says
    /// which), with the token in `token_file`.
    pub fn loopback(port: u16, token_file: impl Into<PathBuf>) -> Endpoint {
        Endpoint::Tcp {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            token_file: token_file.into(),
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
            Endpoint::Tcp { addr, .. } => write!(f, "http://{addr}"),
        }
    }
}

/// The name the control server binds the socket at `path` under first: `path` with
/// `.PID.tmp` after it.
pub(crate) fn temporary_name(path: &Path) -> PathBuf {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".{}.tmp", std::process::id()));
    PathBuf::from(temporary)
}

/// [`Endpoint::check_name`] for the Unix socket at `path` (`endpoint`, for the error): its
/// temporary name ([`temporary_name`]) must fit [`SOCKET_PATH_MAX`]. The system's own
/// refusal says only "path must be shorter than SUN_LEN".
pub(crate) fn check_socket_path(path: &Path, endpoint: &Endpoint) -> Result<(), ControlError> {
    let temporary = temporary_name(path);
    let longer = temporary.as_os_str().len() - path.as_os_str().len();
    if temporary.as_os_str().len() <= SOCKET_PATH_MAX {
        return Ok(());
    }
    Err(ControlError::Bind {
        endpoint: endpoint.to_string(),
        cause: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "the socket's path is {} bytes, and a Unix socket's path may have at most {} \
                 here ({SOCKET_PATH_MAX} bytes, less the {longer} of the name it is bound under \
                 first): name a store at a shorter path, or give `Endpoint::Unix` a shorter one",
                path.as_os_str().len(),
                SOCKET_PATH_MAX - longer,
            ),
        ),
    })
}

/// The longest path a Unix socket can be bound at, in bytes: `sun_path` less its closing
/// NUL (108 bytes on Linux, 104 on the BSDs and macOS).
const SOCKET_PATH_MAX: usize = if cfg!(target_os = "linux") { 107 } else { 103 };

/// The socket a process serves next to its redb store file `store`, and where `loops`
/// looks for it: the file's path with `.sock` appended (`agent.redb` → `agent.redb.sock`),
/// in the same directory. A `store` that is a symbolic link to a file stands for that file:
/// the socket is next to the file, whichever of the two paths a process opened and a
/// command names.
///
/// A Unix socket's path is limited to about 100 bytes (108 on Linux, counting the end):
/// a store deeper than that needs [`Endpoint::Unix`] with a shorter path, given to both.
///
/// A socket left there by a killed process (nobody answers on it) is removed by the next
/// writable open of the store ([`RedbStore::open`](crate::RedbStore::open)), and replaced by
/// the next [`serve_control`](crate::Runtime::serve_control).
pub fn socket_path(store: &Path) -> PathBuf {
    crate::store::redb::socket::next_to(store)
}

/// Why the control endpoint could not be served, or a request to it failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The endpoint's socket or port could not be bound, or a file that is not a socket is at
    /// the socket's path (it is never replaced). The message names the cause, so `source()`
    /// is `None` (a chain printed from it says the cause once); the cause is in `cause`.
    #[error("cannot listen on control endpoint {endpoint}: {cause}")]
    Bind {
        /// The endpoint.
        endpoint: String,
        /// The system's error.
        cause: std::io::Error,
    },
    /// Another process answers on the endpoint's socket already.
    #[error("control endpoint {endpoint} is served by another process already")]
    InUse {
        /// The endpoint.
        endpoint: String,
    },
    /// The TCP endpoint's token file is missing, empty, unreadable or readable by others.
    #[error("control token file {path}: {reason}")]
    Token {
        /// The token file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The store is not a redb file, so there is no socket next to it: give an
    /// [`Endpoint`].
    #[error("store {store} is not a redb file: give the control endpoint's socket path or address")]
    NoStoreFile {
        /// The store's label.
        store: String,
    },
    /// Nothing answers on the endpoint (no socket, or no process behind it). The message
    /// names the cause, so `source()` is `None`; the cause is in `cause`.
    #[error("no process answers on control endpoint {endpoint}: {cause}")]
    Unreachable {
        /// The endpoint.
        endpoint: String,
        /// The system's error.
        cause: std::io::Error,
    },
    /// The connection closed before the whole answer came: the process stopped (or closed
    /// it) while it took the request. Whether the process carried a write out is unknown; a
    /// read can be made again.
    #[error(
        "control endpoint {endpoint}: the connection closed before the process answered ({what}): the process may have stopped; {}",
        if *write { "whether it carried the request out is unknown" } else { "the request only read, and can be made again" }
    )]
    Dropped {
        /// The endpoint.
        endpoint: String,
        /// What the connection said (hyper's words).
        what: String,
        /// Whether the request was a write (else a read, which changes nothing).
        write: bool,
    },
    /// The process took the connection but did not answer in time: it is stopped
    /// (`SIGSTOP`, a debugger), or too busy to answer. Whether it carries a write out (when
    /// it goes on) is unknown; a read can be made again.
    #[error(
        "control endpoint {endpoint}: the process took the connection but did not answer within {waited:?}: it may be stopped (SIGSTOP, a debugger) or overloaded; {}",
        if *write { "whether it carries the request out is unknown" } else { "the request only read, and can be made again" }
    )]
    NoAnswer {
        /// The endpoint.
        endpoint: String,
        /// How long the client waited.
        waited: std::time::Duration,
        /// Whether the request was a write (else a read, which changes nothing).
        write: bool,
    },
    /// The answer is not HTTP, or not the answer of a loops endpoint.
    #[error("control endpoint {endpoint}: {what}")]
    Protocol {
        /// The endpoint.
        endpoint: String,
        /// What went wrong.
        what: String,
    },
    /// The process and the client are of different loops versions.
    #[error(
        "the process on control endpoint {endpoint} runs loops {server}, and this client is loops {client}: use a loops CLI of version {server}"
    )]
    VersionMismatch {
        /// The endpoint.
        endpoint: String,
        /// The process's loops version.
        server: String,
        /// The client's loops version.
        client: String,
    },
    /// The process answered with an error.
    #[error("{message}")]
    Remote {
        /// What kind of error.
        kind: ErrorKind,
        /// The process's one-line message.
        message: String,
        /// The run it is about, if any.
        run_id: Option<String>,
    },
}
