//! Reaching the store: the [`Operator`] a command works through, and one clear line for
//! each way that can fail.
//!
//! A redb file: the runtime opens redb in its default mode, in which the process that has
//! the file open holds an exclusive lock on it, so that no other process can read the file,
//! not even read-only. A process that serves its control endpoint next to the file
//! (`FILE.sock`) is asked instead; otherwise the file is opened here: read-only for
//! inspection, writable for commands that change it. A file whose process crashed (kill -9,
//! power loss) must be repaired by a writable open before a read-only open accepts it;
//! read-only commands make that repair once, say so on stderr, and go on read-only.
//!
//! A PostgreSQL store (`--store postgres://...`) is shared by its workers: it is opened
//! here, without creating or migrating anything, over TLS as the URL's `sslmode` says.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use loops_core::control::{Client, socket_path};
use loops_core::{Error, Payloads, RedbStore, RunStatus, Runtime, StoreOptions};

use crate::failure::{Failure, Result};
use crate::operator::{Local, Operator, Remote, Unsealing};
use crate::output::note;

/// Where the store is: `--store`'s value.
#[derive(Debug, Clone)]
pub enum Target {
    /// A redb store file.
    File(PathBuf),
    /// A PostgreSQL store: a `postgres://` URL and the schema of its tables.
    Postgres {
        /// The connection URL (as given: it may hold a password; never printed).
        url: String,
        /// The PostgreSQL schema (`--pg-schema`).
        schema: String,
    },
}

impl Target {
    /// The store file, for commands and messages that need one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Target::File(path) => Some(path),
            Target::Postgres { .. } => None,
        }
    }
}

/// The store from `--store` or `LOOPS_STORE` (a file path, or a `postgres://` or
/// `postgresql://` URL with `--pg-schema`), or a usage failure saying how to give it. A URL
/// of another scheme (`http://host/x`, `file:///x`) is refused as one, naming its scheme only
/// (the rest may hold a password), unless a file of that path exists. A PostgreSQL connection
/// string in libpq's `key=value` form (`host=db user=agent dbname=loops`, as
/// `PgStoreBuilder` takes it) is one too, unless a file of that path exists.
pub fn target(given: Option<PathBuf>, pg_schema: String) -> Result<Target> {
    let Some(path) = given.filter(|path| !path.as_os_str().is_empty()) else {
        return Err(Failure::usage(
            "no store given: pass --store PATH (or a postgres:// URL) or set LOOPS_STORE (the file the workflow's process opens with Runtime::open)",
        ));
    };
    let text = path.to_str().unwrap_or_default();
    let key_value = || is_libpq_key_value(text) && !path.exists();
    if text.starts_with("postgres://") || text.starts_with("postgresql://") || key_value() {
        return Ok(Target::Postgres {
            url: text.to_owned(),
            schema: pg_schema,
        });
    }
    if let Some(scheme) = url_scheme(text)
        && !path.exists()
    {
        return Err(Failure::usage(format!(
            "the store is a {scheme}:// URL, a scheme loops does not open: give the path of a redb store file, or a postgres:// (or postgresql://) URL for a PostgreSQL store"
        )));
    }
    Ok(Target::File(path))
}

/// Whether `text` starts as a libpq `key=value` connection string does: its first word is
/// `KEYWORD=...`, with one of libpq's connection keywords that a PostgreSQL store takes.
fn is_libpq_key_value(text: &str) -> bool {
    const KEYWORDS: [&str; 14] = [
        "host",
        "hostaddr",
        "port",
        "user",
        "password",
        "dbname",
        "options",
        "application_name",
        "sslmode",
        "sslrootcert",
        "connect_timeout",
        "keepalives",
        "target_session_attrs",
        "channel_binding",
    ];
    text.split_whitespace()
        .next()
        .and_then(|word| word.split_once('='))
        .is_some_and(|(key, _)| KEYWORDS.contains(&key))
}

/// The scheme of `text` if it starts as a URL does, `SCHEME://` (RFC 3986: a letter, then
/// letters, digits, `+`, `-` or `.`). One letter is not taken for a scheme: `C://` is a
/// Windows drive.
fn url_scheme(text: &str) -> Option<&str> {
    let (scheme, _) = text.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && scheme.len() > 1
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

/// What a command does to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// It only reads: a file is opened read-only, and nothing is written.
    Read,
    /// It writes.
    Write,
}

/// Whether `--verbose` was given: then the way the store was reached is said on stderr.
static VERBOSE: OnceLock<bool> = OnceLock::new();

/// Sets whether [`operator`] says how it reached the store.
pub fn set_verbose(verbose: bool) {
    let _ = VERBOSE.set(verbose);
}

/// How payloads are opened: with the keys of `--key-file`, or shown as encrypted.
static PAYLOADS: OnceLock<Payloads> = OnceLock::new();

/// The keys of `--key-file`, for the runtimes this tool opens.
static KEYS: OnceLock<loops_core::Keyring> = OnceLock::new();

/// The builder of every runtime this tool opens: with the keys of `--key-file`, sealing
/// only as the store's workers do (`seal_as_store_does`: in clear in a store in clear, and
/// never with a key the store does not list); without them, reading a store whose payloads
/// are sealed as `<encrypted: key K>` and refusing to store a payload in clear in it
/// (`Error::Encrypted`, which says to pass `--key-file`).
fn runtime_builder() -> loops_core::RuntimeBuilder {
    match KEYS.get() {
        Some(keys) => Runtime::builder().codec(keys.clone()).seal_as_store_does(),
        None => Runtime::builder().read_sealed_redacted(),
    }
}

/// The keys of `--key-file` (or `LOOPS_KEY_FILE`), if one was given.
pub fn key_file_keys() -> Option<loops_core::Keyring> {
    KEYS.get().cloned()
}

/// Reads the key file of `--key-file` (or `LOOPS_KEY_FILE`), if one is given: every
/// operator then opens sealed payloads with it and seals what `send` and `cancel` store in
/// a store whose payloads are sealed with its writing key (in a store in clear, they are
/// stored in clear). Without one, a sealed payload shows as `<encrypted: key K>`.
///
/// # Errors
/// The key file cannot be read, may be read by others, or is not a key file.
pub fn set_key_file(path: Option<&Path>) -> Result<()> {
    let payloads = match path {
        Some(path) => {
            let keys =
                loops_core::Keyring::from_file(path).map_err(|e| Failure::usage(e.to_string()))?;
            let _ = KEYS.set(keys.clone());
            Payloads::new(std::sync::Arc::new(keys)).showing_unopened()
        }
        None => Payloads::redacting(),
    };
    let _ = PAYLOADS.set(payloads);
    Ok(())
}

/// The operator for `target`, reached as [`Access`] allows: the control endpoint of the
/// process that holds a redb file if one answers next to it, else the file itself; a
/// PostgreSQL store directly.
pub fn operator(target: &Target, access: Access) -> Result<Box<dyn Operator>> {
    let operator = match target {
        Target::File(path) => file_operator(path, access)?,
        Target::Postgres { url, schema } => Box::new(postgres(url, schema)?),
    };
    let payloads = PAYLOADS.get().cloned().unwrap_or_else(Payloads::redacting);
    let operator: Box<dyn Operator> =
        Box::new(Unsealing::new(operator, payloads, KEYS.get().cloned())?);
    if VERBOSE.get().copied().unwrap_or(false) {
        note(&format!(
            "store {}: {}",
            operator.label(),
            operator.reached()
        ));
    }
    Ok(operator)
}

/// Whether the connection string's `sslmode` asks for TLS (anything but `disable` and
/// `prefer`, the default), as tokio-postgres reads it (a URL's `?sslmode=` or libpq's
/// `sslmode=`); a string it cannot parse is refused by the connect, which parses it again.
fn wants_tls(url: &str) -> bool {
    use tokio_postgres::config::SslMode;
    url.parse::<tokio_postgres::Config>()
        .is_ok_and(|c| !matches!(c.get_ssl_mode(), SslMode::Disable | SslMode::Prefer))
}

/// A tokio runtime for one command's async calls (the runtime's API is async; the CLI does
/// one thing at a time).
pub fn tokio() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(format!("cannot start the async runtime: {e}")))
}

/// How long a command waits for a store file that a running process holds while no control
/// endpoint answers next to it. A process that serves one holds the file a few milliseconds
/// before its endpoint answers, and a few after it stops answering, as it starts and stops;
/// a process that serves none holds it until it ends, and the command then fails.
const HELD_PATIENCE: Duration = Duration::from_secs(1);

/// How often a command looks again at a store file a running process holds.
const HELD_POLL: Duration = Duration::from_millis(20);

/// The operator of the store file at `path`: through the control endpoint of the process that
/// holds it, if one answers (falling back to the file should the process stop answering:
/// [`Remote`]), else on the file itself, opened as `access` allows. A file held by a
/// process whose endpoint does not answer (yet, or any more) is tried again for up to
/// [`HELD_PATIENCE`].
pub fn file_operator(path: &Path, access: Access) -> Result<Box<dyn Operator>> {
    check_file(path)?;
    let label = path.display().to_string();
    let deadline = Instant::now() + HELD_PATIENCE;
    loop {
        let tokio = tokio()?;
        if let Some(client) = served(path, &tokio)? {
            let fallback = (path.to_owned(), access);
            return Ok(Box::new(Remote::new(label, client, tokio, Some(fallback))));
        }
        let opened: Result<Box<dyn Operator>> = match access {
            Access::Read => {
                read_only(path).map(|store| Box::new(Local::read_only(store, tokio)) as _)
            }
            Access::Write => match (!WRITE_DIRECTLY.load(Ordering::Relaxed))
                .then(|| deferred(path))
                .flatten()
            {
                Some(runtime) => {
                    let reached = "opened the store file to read, and to write at the first write that changes it (no process holds it)".to_owned();
                    Ok(Box::new(Local::deferred(runtime, path.to_owned(), reached, tokio)) as _)
                }
                None => writable(path).map(|(runtime, _)| {
                    let reached =
                        "opened the store file for writing (no process holds it)".to_owned();
                    Box::new(Local::runtime(runtime, label.clone(), reached, tokio)) as _
                }),
            },
        };
        match opened {
            Err(failure) if failure.held && Instant::now() < deadline => {
                std::thread::sleep(HELD_POLL);
            }
            opened => return opened,
        }
    }
}

/// The client of the control endpoint next to the store file at `path`, if a process
/// answers on it; `None` if there is no socket, or a stale one (its process is gone).
pub fn served(path: &Path, tokio: &tokio::runtime::Runtime) -> Result<Option<Client>> {
    tokio
        .block_on(Client::next_to_store(path))
        .map_err(|e| crate::operator::remote_failure(&path.display().to_string(), e))
}

/// The operator of the PostgreSQL store at `url` (tables in `schema`): a runtime on a pool of
/// two connections, without creating or migrating anything. Fails with one line if the
/// server cannot be reached, refuses TLS or the login, or the schema holds no loops store.
pub fn postgres(url: &str, schema: &str) -> Result<Local> {
    let tokio = tokio()?;
    let builder = loops_postgres::PgStore::builder(url)
        .schema(schema)
        .pool_size(2)
        // A command never creates or migrates a store: a missing schema is refused.
        .migrate(false)
        // Nor serves: no session of its own for wake-ups (its writes still notify).
        .listen(false);
    // As loops-postgres takes TLS: with a connector when the URL asks for it
    // (`sslmode=require`), checking the server's certificate against the system's roots;
    // otherwise in the clear, as `connect` does.
    let connect = if wants_tls(url) {
        let tls = native_tls::TlsConnector::new()
            .map_err(|e| Failure::new(format!("cannot set up TLS for PostgreSQL: {e}")))?;
        tokio.block_on(builder.connect_tls(postgres_native_tls::MakeTlsConnector::new(tls)))
    } else {
        tokio.block_on(builder.connect())
    };
    let store = connect.map_err(|e| {
        if let loops_postgres::Error::Config { .. }
        | loops_postgres::Error::InvalidSetting {
            setting: "host", ..
        } = &e
        {
            // The URL itself: bad input, said without it (it may hold a password).
            return Failure::usage(format!("the store URL is not one loops can use: {e}"));
        }
        Failure::new(match &e {
            loops_postgres::Error::Connect { .. } => e.to_string(),
            // The library's remedy names its builder's methods; a command's is in the URL.
            loops_postgres::Error::Plaintext { label, host } => format!(
                "refusing to connect to {label} without TLS: {host:?} is not a loopback \
                 address; add sslmode=require to the URL to connect over TLS (the server's \
                 certificate is checked against the system's roots)"
            ),
            _ => format!("PostgreSQL store (schema {schema}): {e}"),
        })
    })?;
    let label = store.label().to_owned();
    let runtime = tokio.block_on(async { runtime_builder().build(store) });
    let reached = "connected to the PostgreSQL store (shared with its workers)".to_owned();
    Ok(Local::runtime(runtime, label, reached, tokio))
}

/// Whether read-only commands verify the file's checksums before they read it (`--no-verify`
/// turns it off).
static VERIFY: OnceLock<bool> = OnceLock::new();

/// Sets whether [`read_only`] verifies the file (by default it does).
pub fn set_verify(verify: bool) {
    let _ = VERIFY.set(verify);
}

/// Opens the store for reading only. A file that needs redb's repair (its process did not
/// close it cleanly, or its length is not what its header records) is read through a repair
/// made in memory: a reading command never changes the file. Unless `--no-verify` was given,
/// the checksum of every page is verified first (nothing is written to the file), so that
/// damage is refused rather than shown as data.
pub fn read_only(path: &Path) -> Result<RedbStore> {
    check_file(path)?;
    let options = StoreOptions {
        verify_on_open: VERIFY.get().copied().unwrap_or(true),
        ..StoreOptions::default()
    };
    let (store, repaired) = open_reading(path, options).map_err(|e| read_failure(path, e))?;
    if repaired {
        note(&format!(
            "{}; read through a repair made in memory, the file is unchanged; a writing command (or the process that drives it) repairs it",
            Error::needs_repair(path)
        ));
    }
    is_loops_store(path, &store)?;
    Ok(store)
}

/// Opens the file at `path` read-only with `options`, through a repair made in memory if
/// it needs one (its process did not close it cleanly); with whether it needed one.
fn open_reading(
    path: &Path,
    options: StoreOptions,
) -> std::result::Result<(RedbStore, bool), Error> {
    match RedbStore::open_read_only_with(path, options) {
        Ok(store) => Ok((store, false)),
        Err(Error::NeedsRecovery { .. }) => {
            RedbStore::open_repaired_in_memory(path, options).map(|store| (store, true))
        }
        Err(e) => Err(e),
    }
}

/// The failure of a read-only open: damage that redb found (a checksum that does not match)
/// is said to be damage, pointing to `loops check`; other errors as [`open_failure`] says.
fn read_failure(path: &Path, e: Error) -> Failure {
    let damaged = e.is_store_damage();
    match e {
        Error::Open { cause: source, .. } if damaged => Failure {
            damage: true,
            ..Failure::new(match source.downcast_ref::<redb::DatabaseError>() {
                // Without redb's "DB corrupted: ": the message says that it looks damaged.
                Some(redb::DatabaseError::Storage(redb::StorageError::Corrupted(what))) => {
                    what.clone()
                }
                _ => source.to_string(),
            })
        },
        other => open_failure(path, other),
    }
}

/// Set once a command's write found the store taken between its read-only and writable
/// opens ([`Failure::again`]): the command is made again opening the file for writing at
/// once, which waits for a process that is starting (and goes through its endpoint) as every
/// writable open does.
static WRITE_DIRECTLY: AtomicBool = AtomicBool::new(false);

/// Makes every later command's write open the file for writing at once (no read-only open
/// first): for the command made again after [`Failure::again`].
pub fn write_directly() {
    WRITE_DIRECTLY.store(true, Ordering::Relaxed);
}

/// A runtime on the loops store at `path` opened read-only (verified), for a command that
/// writes: a write that its store refuses, or that changes nothing, is answered there and
/// leaves the file's bytes as they were; [`Local`] opens the file for writing
/// ([`writable`]) at the first write that changes it. `None` if the file does not open
/// read-only as a loops store (held by a process, damaged, not a store): [`writable`] then
/// refuses it in its own words. `None` too for a file that needs redb's repair (left by a
/// crash): never read through a repair made in memory here, whose store takes writes into
/// memory and loses them (a cancellation answered as done and never written); the writable
/// open repairs the file.
fn deferred(path: &Path) -> Option<Runtime> {
    let store = RedbStore::open_read_only_with(path, StoreOptions::default()).ok()?;
    store.schemas().ok()?;
    Some(runtime_builder().build(store))
}

/// Opens the store for writing (cancel, retry, send, prune, compact, check). The file must
/// exist and be a loops store: this never creates one. Returns the runtime and whether redb
/// repaired the file on this open (its process had not closed it cleanly).
pub fn writable(path: &Path) -> Result<(Runtime, bool)> {
    check_file(path)?;
    // A read-only open first: it refuses a file that is not a redb file, or is locked,
    // without writing a byte to it. It does not verify the file: the writable open below
    // does (Runtime::open verifies every page by default).
    let probe = StoreOptions {
        verify_on_open: false,
        ..StoreOptions::default()
    };
    let repaired = match RedbStore::open_read_only_with(path, probe) {
        Ok(store) => match is_loops_store(path, &store) {
            Ok(()) => false,
            Err(failure) => {
                drop(store);
                return Err(damage_or(path, failure));
            }
        },
        Err(Error::NeedsRecovery { .. }) => true,
        Err(e @ Error::StoreFormat { .. }) => return Err(damage_or(path, open_failure(path, e))),
        Err(e) => return Err(open_failure(path, e)),
    };
    let runtime = runtime_builder()
        .open(path)
        .map_err(|e| open_failure(path, e))?;
    if repaired {
        is_loops_store(path, &redb(path, &runtime)?)?;
        note(&format!(
            "{}; redb repaired it on this open",
            Error::needs_repair(path)
        ));
    }
    Ok((runtime, repaired))
}

/// `failure` (of the unverified probe of [`writable`]), unless the file at `path` fails the
/// verification of its pages: then that damage, as a verifying open says it. A damaged page
/// can make a file look like another format (its record of the format unreadable), or like
/// no loops store.
fn damage_or(path: &Path, failure: Failure) -> Failure {
    match RedbStore::open_read_only(path) {
        Err(e) if e.is_store_damage() => open_failure(path, e),
        _ => failure,
    }
}

/// Refuses a store that is not there: no command creates one (the store's open would). What
/// is there and is no store (a directory, a FIFO, an empty file, a path ending with `/`, a
/// symbolic link that leads to no file) is refused by the store's open, in the library's
/// words, the same for every command and program.
fn check_file(path: &Path) -> Result<()> {
    if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
        // Named as a directory: the store's open says what was meant.
        return Ok(());
    }
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Failure::new(format!(
            "store {} does not exist",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// A redb file that is not a loops store lacks loops' tables; say so instead of failing on
/// the first read.
fn is_loops_store(path: &Path, store: &RedbStore) -> Result<()> {
    store.schemas().map(drop).map_err(|e| {
        Failure::new(format!(
            "store {} is not a loops store, or is damaged: {}",
            path.display(),
            e.chain()
        ))
    })
}

/// The one-line failure for an error of opening the store at `path`.
pub fn open_failure(path: &Path, e: Error) -> Failure {
    let damaged = e.is_store_damage();
    match e {
        Error::StoreLocked { .. } => {
            let socket = socket_path(path);
            let message = if std::fs::symlink_metadata(&socket).is_ok() {
                format!(
                    "store {} is in use by a running process, and nothing answers on the control endpoint {} (a socket an earlier process left, or one this process has not opened yet or has closed; redb allows no reader beside the process): run this command again once the process answers there, or has stopped",
                    path.display(),
                    socket.display()
                )
            } else {
                format!(
                    "store {} is in use by a running process that serves no control endpoint (none answers on {}; redb allows no reader beside the process): serve one in it (`Runtime::serve_control_next_to_store`; the example agent serves one with `deliver --serve`), or stop it, then run this command again",
                    path.display(),
                    socket.display()
                )
            };
            Failure {
                held: true,
                ..Failure::new(message)
            }
        }
        // The same words as for a panic of redb on a damaged file (see panics.rs), and what
        // may still be read before the file is replaced: `--no-verify` is advised only if an
        // unverified read lists the file's runs (tried here, read-only); a file shorter than
        // its own layout is named as such (redb's words for it are the only sign).
        Error::Open { cause: source, .. } if damaged => {
            let until = if reads_unverified(path) {
                "until then, `loops --no-verify runs` and `history RUN --json` read what they still can, unverified"
            } else if source.to_string().contains("truncated") {
                "the file is shorter than its own layout says, so nothing reads it, verified or not"
            } else {
                "an unverified open fails too, so `--no-verify` is no way round"
            };
            Failure::new(format!(
                "store {} is damaged: redb cannot open it ({source}); restore it from a backup ({until})",
                path.display()
            ))
        }
        // "cannot open store PATH: the cause", said once.
        e @ Error::Open { .. } => Failure::new(e.to_string()),
        other => Failure::from(other),
    }
}

/// Whether `loops --no-verify runs` reads the file at `path`: it opens read-only without
/// verification (through a repair made in memory if it needs one), reads its schemas and
/// lists its runs of every status. Whether that flag is a way to read what a damaged file still holds.
fn reads_unverified(path: &Path) -> bool {
    let options = StoreOptions {
        verify_on_open: false,
        ..StoreOptions::default()
    };
    let Ok((store, _)) = open_reading(path, options) else {
        return false;
    };
    // What an unverified reading command reads first: the schemas (`is_loops_store`), then
    // the runs.
    store.schemas().is_ok()
        && RunStatus::ALL
            .iter()
            .all(|&status| store.list(status, None).is_ok())
}

/// The redb store under a runtime this tool opened (always a redb file).
pub fn redb(path: &Path, runtime: &Runtime) -> Result<RedbStore> {
    runtime
        .redb()
        .cloned()
        .ok_or_else(|| Failure::new(format!("store {} is not a redb file", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_is_read_from_a_url_or_a_key_value_string() {
        for (given, tls) in [
            ("postgres://u@db/x", false),
            ("postgres://u@db/x?sslmode=require", true),
            (
                "postgres://u@db/x?application_name=a&sslmode=disable",
                false,
            ),
            ("host=db user=u dbname=x", false),
            ("host=db user=u sslmode=require dbname=x", true),
            ("host=db sslmode=prefer", false),
            ("host=db port=99999", false),
        ] {
            assert_eq!(wants_tls(given), tls, "{given}");
        }
    }

    #[test]
    fn a_libpq_key_value_string_is_told_from_a_path() {
        for (given, key_value) in [
            ("host=127.0.0.1 user=postgres dbname=x", true),
            ("dbname=x", true),
            ("sslmode=require host=db", true),
            ("store.redb", false),
            ("./data=1.redb", false),
            ("colour=blue.redb", false),
            ("", false),
        ] {
            assert_eq!(is_libpq_key_value(given), key_value, "{given}");
        }
    }
}
