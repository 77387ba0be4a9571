//! The PostgreSQL store of [loops](https://docs.rs/loops): many worker processes, on many
//! machines, share one set of runs. Each run is driven by one worker at a time, through a
//! lease that every write is fenced by.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use loops::Runtime;
//! use loops_postgres::PgStore;
//! # use serde::{Deserialize, Serialize};
//! # #[derive(loops::Workflow, Serialize, Deserialize)]
//! # enum Job { #[initial] #[next(Done)] Start, #[terminal] Done }
//! # struct Agent;
//! # impl JobHandler for Agent {
//! #     type Error = loops::Error;
//! #     async fn start(&self, _: &loops::Context) -> Result<StartNext, loops::Error> {
//! #         Ok(StartNext::Done)
//! #     }
//! # }
//! // `Job` is a workflow (`#[derive(Workflow)]`); `Agent` implements its `JobHandler`.
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // TLS with the system's roots (postgres-native-tls); `connect()` is for this machine.
//!     let tls = postgres_native_tls::MakeTlsConnector::new(native_tls::TlsConnector::new()?);
//!     let store = PgStore::builder("host=db.internal user=loops dbname=loops sslmode=require")
//!         .schema("loops")                      // all tables in this PostgreSQL schema
//!         .pool_size(16)                        // connections per worker
//!         .lease_ttl(Duration::from_secs(10))   // a dead worker's runs move after this
//!         .connect_tls(tls)                     // applies the migrations it lacks
//!         .await?;
//!     let runtime = Runtime::builder()
//!         .register::<Job, _>(Agent)
//!         .build(store);
//!     runtime.start("job-1", Job::Start).await?;
//!     // Drive this worker's runs, and claim those no live worker holds, until shutdown.
//!     runtime.serve(Duration::from_millis(500)).await?;
//!     Ok(())
//! }
//! ```
//!
//! # How it works
//! - **Tables.** One PostgreSQL schema per store ([`PgStoreBuilder::schema`]), created and
//!   migrated on [`connect`](PgStoreBuilder::connect) (versioned; a schema newer than this
//!   build is refused with [`Error::SchemaTooNew`]). Records are the same JSON as in the redb
//!   store, kept as `text` so that they read back byte for byte.
//! - **Leases.** A worker drives a run only under a lease: a row of the `leases` table with a
//!   fencing token (from a sequence, never reused) and an expiry on the server's clock. The
//!   runtime renews its leases every third of the lease time, on a connection of their own
//!   (never behind the pool's writes); a worker that stops renewing
//!   (crashed, paused, cut off) loses its runs after the lease time, and another worker's
//!   `claim_ready` (`FOR UPDATE SKIP LOCKED`) takes them over.
//! - **Fencing.** Every write that carries a lease locks the lease row (`FOR UPDATE`) and the
//!   run's row in the transaction that writes, and commits only if the lease is still the
//!   run's, unexpired, and the write's sequence number is the run's next one; otherwise it is
//!   refused with [`loops_core::Error::Fenced`] and leaves no trace.
//! - **One round trip.** A lease holder's transitions and step records are planned against
//!   the run's row as its last write left it, and committed by one statement, a function of
//!   the schema that takes the same locks, checks that the lease and the row are unchanged
//!   and writes the effects; if they changed, it writes nothing and the write takes two
//!   round trips, reading the row ([`PgStoreBuilder::one_round_trip`], docs/postgres.md,
//!   "The commit path").
//! - **Durability.** Every connection runs with `synchronous_commit = on`: a write returns
//!   after its commit is flushed to the server's WAL. Concurrent commits share WAL flushes
//!   (PostgreSQL's own group commit).
//! - **Stopped workers.** A session idle inside a transaction for longer than the lease time
//!   is ended by the server, so a worker stopped between the two round trips of a write frees
//!   its row locks by the time its lease lapses; TCP keepalives notice a peer that is gone.
//! - **Wake-ups.** A write that makes a run ready for another worker (an event a parked run
//!   waits for, a retry, a cancellation of a waiting run, a run created without a driver)
//!   sends a notification on the store's channel (`pg_notify`, in its transaction: only if
//!   it commits), and so does the release of a lease whose run still needs a driver. Each
//!   worker `LISTEN`s on a connection of its own ([`PgStoreBuilder::listen`]), and a
//!   notification makes [`Runtime::serve`](loops_core::Runtime::serve) claim at once.
//!   Polling stays: times that come (a durable sleep's end) are found by the next poll, and
//!   so is everything while the listening connection is down. An attached driver re-reads
//!   its row every 200 ms.
//!
//! # Why deadpool-postgres
//! tokio-postgres is the async PostgreSQL client of the tokio ecosystem, with pipelining,
//! which the write path uses to send a transaction's statements in one round trip (a lease
//! holder's transitions and steps) or two.
//! deadpool-postgres is the pool most used with it: small, tokio-native, with a per-connection
//! statement cache, and it drops a connection the server closed instead of handing it out
//! again. bb8 would do as well; sqlx would bring its own driver and a compile-time query
//! checker that needs a database at build time.
//!
//! # TLS
//! [`PgStoreBuilder::connect`] connects without TLS, to a server on this machine (a loopback
//! address or a Unix socket); to another host it refuses ([`Error::Plaintext`]) unless
//! [`PgStoreBuilder::allow_plaintext`] says otherwise. Across machines, give a tokio-postgres
//! TLS connector (postgres-native-tls, postgres-openssl, tokio-postgres-rustls) to
//! [`PgStoreBuilder::connect_tls`] and put `sslmode=require` in the connection string; under
//! `sslmode=prefer` a remote server without TLS is refused too, not used in the clear. A
//! store whose connections are unencrypted after `allow_plaintext` says so in a WARN line.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod action;
mod attributes;
mod commit;
mod connect;
mod failpoint;
mod fast;
mod guard;
mod limits;
mod listen;
mod migrate;
mod pipeline;
mod read;
mod sql;
mod write;

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use loops_core::{BoxFuture, EventRecord, Lease, Reply, RunInfo, RunStatus, SeqStep, Store, Write};
use loops_core::{FailureRecord, SchemaHash, StepRecord, TransitionRecord};

pub use connect::PgStoreBuilder;
pub use fast::CommitCounts;
pub use migrate::SCHEMA_VERSION;

use crate::sql::Sql;

/// Default number of connections per store: 16.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// Default lease time: 10 s. A worker that dies loses its runs to other workers this long
/// after its last renewal.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// Default limit of one read or write, waiting for a connection included: 10 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Default limit of the difference between a worker's clock and the server's: 1 s
/// ([`PgStoreBuilder::max_clock_skew`]).
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(1);

/// Default PostgreSQL schema of the store's tables: `loops`.
pub const DEFAULT_SCHEMA: &str = "loops";

/// Default `application_name` of the store's connections: `loops`.
pub const DEFAULT_APPLICATION_NAME: &str = "loops";

/// Why a [`PgStore`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The connection string does not parse (either form of libpq's: `host=.. user=..` or a
    /// `postgres://` URL). The message names the parser's cause (`invalid value for option
    /// `port``), so `source()` is `None` (a chain printed whole says it once).
    #[error("invalid PostgreSQL connection string: {}", cause_text(source))]
    Config {
        /// The parser's error.
        source: tokio_postgres::Error,
    },

    /// The schema name is not one of lowercase ASCII letters, digits and `_` (at most 63
    /// bytes, not starting with a digit or `pg_`).
    #[error("invalid schema name {name:?}: {reason}")]
    InvalidSchema {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A setting is out of range (a pool of 0 connections, a lease time under 10 ms), or the
    /// connection string names no server (`setting` is then `host`).
    #[error("invalid setting `{setting}`: {reason}")]
    InvalidSetting {
        /// The builder method.
        setting: &'static str,
        /// What is wrong.
        reason: &'static str,
    },

    /// A connection without TLS to `host`, which is not this machine's loopback, and
    /// [`PgStoreBuilder::allow_plaintext`] was not called. Returned before connecting.
    #[error(
        "refusing to connect to {label} without TLS: {host} is not a loopback address; use \
         connect_tls with sslmode=require, or call allow_plaintext() to send everything in the \
         clear"
    )]
    Plaintext {
        /// The server, as [`PgStore::label`] names it.
        label: String,
        /// The host (or `hostaddr`) that is not a loopback one.
        host: String,
    },

    /// This machine's clock is further from the server's than
    /// [`PgStoreBuilder::max_clock_skew`] allows: the deadlines this worker records (durable
    /// sleeps' wake-up times, retry times) would make other workers, which claim by the
    /// server's clock, wake its runs that much early or late. Measured at connect.
    #[error(
        "the clock of this machine is {skew_ms} ms off the clock of {label} (give or take {slack_ms} ms), more than the {bound_ms} ms allowed (max_clock_skew); set the time right (NTP), or allow more"
    )]
    ClockSkew {
        /// The server, as [`PgStore::label`] names it.
        label: String,
        /// The server's clock minus this machine's, in ms.
        skew_ms: i64,
        /// How far the measurement may be off (half its round trip), in ms.
        slack_ms: u64,
        /// The limit, in ms.
        bound_ms: u64,
    },

    /// The server could not be reached, or refused the connection. The message names the
    /// cause: the server's own message and SQLSTATE code when the server answered (a
    /// database that does not exist, a login refused), else the client's error and its
    /// sources; so `source()` is `None` (a chain printed whole says it once).
    #[error("cannot connect to {label}: {}", cause_text(&**cause))]
    Connect {
        /// The server, as [`PgStore::label`] names it.
        label: String,
        /// The client's or the pool's error.
        cause: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A migration failed; the schema stays at the version it had (migrations run in one
    /// transaction).
    /// The message names the cause as [`Error::Connect`]'s does.
    #[error(
        "migrating schema {schema:?} to version {version} failed: {}",
        cause_text(cause)
    )]
    Migrate {
        /// The PostgreSQL schema.
        schema: String,
        /// The version being applied (0: before any, while reading the version).
        version: i32,
        /// The server's error.
        cause: tokio_postgres::Error,
    },

    /// [`PgStoreBuilder::migrate`] is `false`, and the schema does not exist or is not at
    /// this build's [`SCHEMA_VERSION`] (`found` 0: it holds no loops store). Nothing was
    /// changed.
    #[error("{}", not_migrated(schema, *found, *supported))]
    NotMigrated {
        /// The PostgreSQL schema.
        schema: String,
        /// The version found (0 if the schema or its `migrations` table does not exist).
        found: i32,
        /// The version this build needs.
        supported: i32,
    },

    /// The schema was migrated by a newer build of loops-postgres (to `found`, past the
    /// `supported` [`SCHEMA_VERSION`]): this build refuses to touch it. Nothing was changed.
    #[error(
        "schema {schema:?} is at version {found}, newer than the version {supported} this build knows; upgrade loops-postgres"
    )]
    SchemaTooNew {
        /// The PostgreSQL schema.
        schema: String,
        /// The version found in the schema's `migrations` table.
        found: i32,
        /// The newest version this build knows.
        supported: i32,
    },
}

impl From<Error> for loops_core::Error {
    /// An [`Error`] as [`loops_core::Error::Database`], for callers that use loops' error
    /// type throughout.
    fn from(e: Error) -> Self {
        loops_core::Error::database("connecting to PostgreSQL", e)
    }
}

/// The PostgreSQL store: implements [`Store`] for a [`Runtime`](loops_core::Runtime) shared
/// by many workers. Cheap to clone (an `Arc`); clones share one pool, and count as one worker
/// for leases.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    sql: Sql,
    /// The rows this store's leases last saw, for one-round-trip commits (fast.rs).
    cache: fast::Cache,
    /// The task that listens for wake-ups, unless [`PgStoreBuilder::listen`] is off.
    listener: Option<listen::Listener>,
    pool: Pool,
    /// One connection for lease renewals alone, so that they never queue behind the writes
    /// of `pool` (with a small pool and many runs, they did until leases lapsed).
    lease_pool: Pool,
    label: String,
    schema: String,
    lease_ttl: Duration,
    /// Longest read or write.
    timeout: Duration,
    /// The server's clock minus this machine's at connect, in ms.
    clock_skew_ms: i64,
    /// Names this store's leases: a lease of this store that is still live belongs to a
    /// driver of this process that stopped, and may be taken over by `acquire`. Also names
    /// this worker's rows in `workers`.
    owner: String,
    /// When this worker first announced the schemas it routes (its first `claim_ready`):
    /// it blocks runs no live worker routes only once it has been live for a lease time.
    live_since: std::sync::OnceLock<std::time::Instant>,
    /// When this worker last announced, and the `(workflow, schema)` pairs it announced:
    /// announced again after a third of the lease time, or at once if the pairs changed.
    announced: std::sync::Mutex<Option<(std::time::Instant, Announced)>>,
    /// The limits this process warned were declared differently by another worker.
    warned_limits: limits::Warned,
}

/// The `(workflow, schema hash)` pairs a worker routes, as `claim_ready` sends them (`None`:
/// every schema of the workflow).
type Announced = Vec<(String, Option<String>)>;

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("label", &self.inner.label)
            .field("lease_ttl", &self.inner.lease_ttl)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// A builder for a store on the server that `config` names: a libpq connection string
    /// (`"host=127.0.0.1 user=loops dbname=loops"`) or URL
    /// (`"postgres://loops@127.0.0.1/loops"`). Nothing is checked until
    /// [`connect`](PgStoreBuilder::connect).
    pub fn builder(config: impl Into<String>) -> PgStoreBuilder {
        PgStoreBuilder::new(config.into())
    }

    /// Connects with the default settings and without TLS, to a server on this machine:
    /// `PgStore::builder(config).connect()`.
    ///
    /// # Errors
    /// As [`PgStoreBuilder::connect`].
    pub async fn connect(config: impl Into<String>) -> Result<PgStore, Error> {
        Self::builder(config).connect().await
    }

    /// The PostgreSQL schema of the store's tables.
    pub fn schema_name(&self) -> &str {
        &self.inner.schema
    }

    /// The server, database and schema, without password (`postgres://loops@db:5432/loops
    /// schema loops`).
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// How far the server's clock was ahead of this machine's when the store connected, in
    /// ms (negative: behind); within [`PgStoreBuilder::max_clock_skew`].
    pub fn clock_skew_ms(&self) -> i64 {
        self.inner.clock_skew_ms
    }

    /// Whether this worker listens for wake-ups now: `false` with
    /// [`PgStoreBuilder::listen`] off, before its listening connection first `LISTEN`s, and
    /// while that connection is lost (polling carries on; it connects again after a
    /// back-off of 100 ms, doubling up to 10 s).
    pub fn is_listening(&self) -> bool {
        self.inner
            .listener
            .as_ref()
            .is_some_and(|l| l.listening.load(Ordering::Acquire))
    }

    /// The PostgreSQL channel of the store's wake-ups: its schema's name (see
    /// docs/postgres.md, "Wake-ups").
    pub fn channel(&self) -> &str {
        &self.inner.schema
    }

    /// The connection pool, for statements of your own on the store's server.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// `operation`, failed with [`loops_core::Error::Database`] if it takes longer than the
    /// store's timeout (dropping it closes the connection it used: see `guard::Guard`).
    async fn timed<T>(
        &self,
        action: impl Fn() -> String,
        operation: impl std::future::Future<Output = loops_core::Result<T>>,
    ) -> loops_core::Result<T> {
        match tokio::time::timeout(self.inner.timeout, operation).await {
            Ok(result) => result,
            Err(_) => Err(loops_core::Error::database(
                action(),
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer in {} ms", self.inner.timeout.as_millis()),
                ),
            )),
        }
    }

    /// A connection from the pool.
    async fn client(&self, action: impl Fn() -> String) -> loops_core::Result<Object> {
        self.client_from(&self.inner.pool, action).await
    }

    /// A connection from `pool`: the store's `pool` or `lease_pool`.
    async fn client_from(
        &self,
        pool: &Pool,
        action: impl Fn() -> String,
    ) -> loops_core::Result<Object> {
        pool.get()
            .await
            .map_err(|e| loops_core::Error::database(action(), e))
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.inner.lease_ttl.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A unique name for this store's leases: process id, start time and a counter.
fn owner_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn label(config: &tokio_postgres::Config, schema: &str) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("");
    let db = config.get_dbname().unwrap_or(user);
    format!("postgres://{user}@{host}:{port}/{db} schema {schema}")
}

fn validate_schema(name: &str) -> Result<(), Error> {
    let reason = if name.is_empty() {
        "empty"
    } else if name.len() > 63 {
        "longer than 63 bytes"
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        "only lowercase ASCII letters, digits and `_` are allowed"
    } else if name.as_bytes()[0].is_ascii_digit() {
        "starts with a digit"
    } else if name.starts_with("pg_") {
        "`pg_` names are reserved by PostgreSQL"
    } else {
        return Ok(());
    };
    Err(Error::InvalidSchema {
        name: name.to_owned(),
        reason,
    })
}

/// Whether `e` says the connection failed (rather than the statement): then nothing the
/// transaction sent before its commit took effect, and trying again on another connection
/// is safe.
pub(crate) fn is_connection_error(e: &tokio_postgres::Error) -> bool {
    match e.as_db_error() {
        None => {
            e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
        }
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || code.starts_with("57P")
        }
    }
}

/// Converts a sequence number or time to the `bigint` PostgreSQL stores.
pub(crate) fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Store for PgStore {
    fn label(&self) -> String {
        self.inner.label.clone()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn write<'a>(
        &'a self,
        lease: Option<&'a Lease>,
        write: Write,
    ) -> BoxFuture<'a, loops_core::Result<Reply>> {
        Box::pin(self.write_impl(lease, write))
    }

    fn run_info<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops_core::Result<Option<RunInfo>>> {
        Box::pin(self.read_run_info(run_id))
    }

    fn latest<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops_core::Result<Option<(RunInfo, TransitionRecord)>>> {
        Box::pin(self.read_latest(run_id))
    }

    fn history<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops_core::Result<Vec<TransitionRecord>>> {
        Box::pin(self.read_history(run_id))
    }

    fn steps<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, loops_core::Result<Vec<(String, u32, StepRecord)>>> {
        Box::pin(self.read_steps(run_id, seq))
    }

    fn all_steps<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, loops_core::Result<Vec<SeqStep>>> {
        Box::pin(self.read_all_steps(run_id))
    }

    fn failures<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops_core::Result<Vec<(u64, FailureRecord)>>> {
        Box::pin(self.read_failures(run_id))
    }

    fn events<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops_core::Result<Vec<(u64, EventRecord, bool)>>> {
        Box::pin(self.read_events(run_id))
    }

    fn has_pending<'a>(
        &'a self,
        run_id: &'a str,
        event: &'a str,
    ) -> BoxFuture<'a, loops_core::Result<bool>> {
        Box::pin(self.read_has_pending(run_id, event))
    }

    fn list<'a>(
        &'a self,
        status: RunStatus,
        workflow: Option<&'a str>,
    ) -> BoxFuture<'a, loops_core::Result<Vec<RunInfo>>> {
        Box::pin(self.read_list(status, workflow))
    }

    /// One statement on the index `runs_claim` (workflow, schema, run_id).
    fn list_of_schemas<'a>(
        &'a self,
        status: RunStatus,
        workflow: &'a str,
        schemas: &'a [SchemaHash],
    ) -> BoxFuture<'a, loops_core::Result<Vec<RunInfo>>> {
        Box::pin(self.read_list_of_schemas(status, workflow, schemas))
    }

    fn count_runs(&self) -> BoxFuture<'_, loops_core::Result<Vec<loops_core::RunCount>>> {
        Box::pin(self.read_count_runs())
    }

    fn children<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, loops_core::Result<Vec<RunInfo>>> {
        Box::pin(self.read_children(run_id))
    }

    fn attributes<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops_core::Result<loops_core::Attributes>> {
        Box::pin(self.read_attributes(run_id))
    }

    /// One statement: the index range of the filter's first attribute filter, joined to the
    /// runs (narrowed by status and workflow) and their attributes.
    fn search<'a>(
        &'a self,
        filter: &'a loops_core::RunFilter,
    ) -> BoxFuture<'a, loops_core::Result<Vec<(RunInfo, loops_core::Attributes)>>> {
        Box::pin(self.read_search(filter))
    }

    fn schema(&self, hash: SchemaHash) -> BoxFuture<'_, loops_core::Result<Option<String>>> {
        Box::pin(self.read_schema(hash))
    }

    fn schemas(&self) -> BoxFuture<'_, loops_core::Result<Vec<(SchemaHash, String)>>> {
        Box::pin(self.read_schemas())
    }

    fn sealing_keys(&self) -> BoxFuture<'_, loops_core::Result<Vec<String>>> {
        Box::pin(self.read_sealing_keys())
    }

    fn sealing_checks(&self) -> BoxFuture<'_, loops_core::Result<Vec<(String, String)>>> {
        Box::pin(self.read_sealing_checks())
    }

    fn schedules(&self) -> BoxFuture<'_, loops_core::Result<Vec<loops_core::ScheduleInfo>>> {
        Box::pin(self.read_schedules())
    }

    fn acquire<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, loops_core::Result<Option<Lease>>> {
        Box::pin(self.lease_acquire(run_id))
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, loops_core::Result<()>> {
        Box::pin(self.lease_release(lease))
    }

    fn renew<'a>(&'a self, leases: &'a [Lease]) -> BoxFuture<'a, loops_core::Result<Vec<Lease>>> {
        Box::pin(self.lease_renew(leases))
    }

    fn lease_ttl(&self) -> Option<Duration> {
        Some(self.inner.lease_ttl)
    }

    fn claim_ready<'a>(
        &'a self,
        workflows: &'a [loops_core::ClaimFilter],
        limit: usize,
    ) -> BoxFuture<'a, loops_core::Result<Vec<(RunInfo, Lease)>>> {
        Box::pin(self.lease_claim_ready(workflows, limit))
    }

    /// Every worker of the store counts its named limits in the store's tables.
    fn shared_limits(&self) -> Option<Arc<dyn loops_core::SharedLimits>> {
        Some(Arc::new(self.clone()))
    }

    /// The notifications of the store's channel, as the listener receives them; `None` with
    /// [`PgStoreBuilder::listen`] off.
    fn wakeups(&self) -> Option<loops_core::Wakeups> {
        self.inner.listener.as_ref().map(|l| l.wakeups.clone())
    }
}

/// The cause of a connection or migration error as its message says it: the server's
/// message, severity and SQLSTATE code when the server answered (tokio-postgres says only
/// "db error" and keeps them in its source), else the error and its sources.
fn cause_text(cause: &(dyn std::error::Error + 'static)) -> String {
    let db = cause
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::as_db_error);
    match db {
        Some(db) => format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        ),
        None => loops_core::error_chain(cause).join(": "),
    }
}

/// [`Error::NotMigrated`]'s message: plainly that the schema holds no store, or which
/// version it holds.
fn not_migrated(schema: &str, found: i32, supported: i32) -> String {
    if found == 0 {
        format!(
            "schema {schema:?} holds no loops store (no loops-postgres tables); a worker's connect creates it (`migrate` on, the default)"
        )
    } else {
        format!(
            "schema {schema:?} holds a loops store of version {found}, older than the version {supported} this build needs; a worker's connect migrates it (`migrate` on, the default)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_checked() {
        assert!(validate_schema("loops_test_1").is_ok());
        for (name, reason) in [
            ("", "empty"),
            (
                "Loops",
                "only lowercase ASCII letters, digits and `_` are allowed",
            ),
            (
                "a\"b",
                "only lowercase ASCII letters, digits and `_` are allowed",
            ),
            ("1abc", "starts with a digit"),
            ("pg_x", "`pg_` names are reserved by PostgreSQL"),
        ] {
            match validate_schema(name) {
                Err(Error::InvalidSchema { reason: r, .. }) => assert_eq!(r, reason, "{name}"),
                other => panic!("{name}: {other:?}"),
            }
        }
        assert!(validate_schema(&"a".repeat(64)).is_err());
    }

    #[test]
    fn labels_carry_no_password() {
        let config: tokio_postgres::Config =
            "postgres://u:secret@db.example:6543/app".parse().unwrap();
        assert_eq!(
            label(&config, "loops"),
            "postgres://u@db.example:6543/app schema loops"
        );
    }
}
