//! Building a [`PgStore`]: the builder's settings, what every session of the store starts
//! with, and whether a connection may go without TLS.
//!
//! - **Sessions.** Every connection sets `synchronous_commit = on`; a session idle inside a
//!   transaction for longer than the lease time is ended by the server
//!   (`idle_in_transaction_session_timeout`), so that a worker stopped between the two round
//!   trips of a write (SIGSTOP, a dead network) frees its row locks once its lease lapsed;
//!   TCP keepalives on both ends notice a dead peer. The pool's connections also stop a
//!   statement, or a wait for a lock, after the store's time-out.
//! - **Wake-ups.** Unless [`PgStoreBuilder::listen`] is off, one more connection, with the
//!   pool's settings, `LISTEN`s for the notifications of writes that make runs ready
//!   (`listen.rs`).
//! - **Plaintext.** A connection without TLS to a host that is not this machine's loopback is
//!   refused unless [`PgStoreBuilder::allow_plaintext`] was called, and with `sslmode=prefer`
//!   [`connect_tls`](PgStoreBuilder::connect_tls) requires TLS of such a host instead of
//!   falling back. Allowed, an unencrypted store says so in one WARN line.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{NoTls, Socket};

use crate::sql::Sql;
use crate::{
    DEFAULT_APPLICATION_NAME, DEFAULT_LEASE_TTL, DEFAULT_MAX_CLOCK_SKEW, DEFAULT_POOL_SIZE,
    DEFAULT_SCHEMA, DEFAULT_TIMEOUT, Error, Inner, PgStore, label, migrate, owner_id,
    validate_schema,
};

/// Configures a [`PgStore`]: made by [`PgStore::builder`].
#[derive(Debug, Clone)]
pub struct PgStoreBuilder {
    config: String,
    pool_size: usize,
    lease_ttl: Duration,
    schema: String,
    application_name: String,
    connect_timeout: Duration,
    timeout: Duration,
    allow_plaintext: bool,
    migrate: bool,
    max_clock_skew: Duration,
    listen: bool,
    one_round_trip: bool,
}

impl PgStoreBuilder {
    pub(crate) fn new(config: String) -> PgStoreBuilder {
        PgStoreBuilder {
            config,
            pool_size: DEFAULT_POOL_SIZE,
            lease_ttl: DEFAULT_LEASE_TTL,
            schema: DEFAULT_SCHEMA.to_owned(),
            application_name: DEFAULT_APPLICATION_NAME.to_owned(),
            connect_timeout: Duration::from_secs(5),
            timeout: DEFAULT_TIMEOUT,
            allow_plaintext: false,
            migrate: true,
            max_clock_skew: DEFAULT_MAX_CLOCK_SKEW,
            listen: true,
            one_round_trip: true,
        }
    }

    /// The most this machine's clock may differ from the server's (default
    /// [`DEFAULT_MAX_CLOCK_SKEW`], 1 s), checked when the store connects
    /// ([`Error::ClockSkew`]). Deadlines that other workers act on are recorded by this
    /// worker's clock (a durable sleep's wake-up time, a retry time) and claimed by the
    /// server's: a timer of a run fires up to this much early or late on another worker.
    /// A clock stepped after the store connected is not seen.
    pub fn max_clock_skew(mut self, bound: Duration) -> Self {
        self.max_clock_skew = bound;
        self
    }

    /// Whether this worker listens for wake-ups (default `true`): a connection of its own
    /// (one more session) `LISTEN`s on the store's channel, and a notification wakes
    /// [`Runtime::serve`](loops_core::Runtime::serve) at once, when another process's write
    /// makes a run ready (docs/postgres.md, "Wake-ups"). With `false`, the worker finds such
    /// runs at its next poll only. Turn it off behind a pooler in transaction mode (PgBouncer
    /// `pool_mode = transaction`), where `LISTEN` does not work. Writes notify either way.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// Whether a lease holder's writes may commit in one round trip (default `true`): the
    /// store remembers the run's row each such write left, and the next write of the same
    /// lease that needs nothing else (a transition, a step record) commits in one statement
    /// that checks the lease and the row and writes its changes, falling back to two round
    /// trips if the lease or the row changed (docs/postgres.md, "The commit path";
    /// [`PgStore::commit_counts`]). With `false`, every write takes two round trips, as
    /// before schema version 9: for measurements, and for tests that stop a worker inside
    /// a transaction.
    pub fn one_round_trip(mut self, enabled: bool) -> Self {
        self.one_round_trip = enabled;
        self
    }

    /// Whether [`connect`](Self::connect) creates the schema and applies the migrations it
    /// lacks (the default, `true`). With `false`, connecting writes nothing: a schema that
    /// does not exist, or is not at this build's [`SCHEMA_VERSION`](crate::SCHEMA_VERSION),
    /// is refused with [`Error::NotMigrated`]. For tools that only look at a store (the
    /// `loops` CLI).
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Connections in the pool for reads and writes (default [`DEFAULT_POOL_SIZE`]). Each
    /// concurrent write or read holds one for its duration; more concurrent runs than
    /// connections wait for one. Lease renewals do not wait behind them: they have one more
    /// connection of their own, and wake-ups another ([`listen`](Self::listen)), so a store
    /// opens `connections + 2` sessions (`connections + 1` without listening).
    pub fn pool_size(mut self, connections: usize) -> Self {
        self.pool_size = connections;
        self
    }

    /// How long a lease lasts without renewal (default [`DEFAULT_LEASE_TTL`], 10 s; at least
    /// 10 ms). The runtime renews every third of it. Shorter moves a dead worker's runs
    /// sooner; longer tolerates longer pauses (GC, a slow network) without losing runs: a live
    /// worker that loses a lease stops the run's driver, and the worker that takes the run
    /// over counts the attempt as interrupted, against the retry policy's
    /// `max_interruptions`, so keep it well above the pauses you expect (under a second, a
    /// loaded machine's scheduling alone can outlast it). It is
    /// also how long the server lets a session of the store sit idle inside a transaction
    /// before it ends the session (`idle_in_transaction_session_timeout`), and the idle time
    /// before TCP keepalives start (at least 1 s).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// The PostgreSQL schema that holds every table (default [`DEFAULT_SCHEMA`]): lowercase
    /// ASCII letters, digits and `_`. Stores with different schemas share nothing, which
    /// isolates tenants or tests in one database.
    pub fn schema(mut self, name: impl Into<String>) -> Self {
        self.schema = name.into();
        self
    }

    /// The `application_name` of the store's connections (default
    /// [`DEFAULT_APPLICATION_NAME`]), as `pg_stat_activity` shows it.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// How long opening one connection may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one read or write may take, waiting for a connection included (default
    /// 10 s). One that takes longer (a server that stopped answering, a network that drops
    /// packets) fails with [`loops_core::Error::Database`] and its connection is closed, so
    /// that no worker hangs on a dead connection: its leases lapse and other workers go on.
    /// The server stops a statement of the pool's connections, or its wait for a lock, after
    /// the same time (`statement_timeout`, `lock_timeout`; statements of your own on
    /// [`PgStore::pool`] included). Keep it under the lease time for renewals to be of use.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Allows connections without TLS to a host that is not this machine's loopback
    /// (`localhost`, `127.0.0.0/8`, `::1`, a Unix socket): passwords, run states and step
    /// outputs then cross the network in the clear. Without this call, [`connect`]
    /// refuses such a host ([`Error::Plaintext`], before connecting), and [`connect_tls`]
    /// with `sslmode=prefer` (the default) requires TLS of it rather than falling back. With
    /// it, a store whose connections are unencrypted says so in one WARN line when it
    /// connects.
    ///
    /// [`connect`]: Self::connect
    /// [`connect_tls`]: Self::connect_tls
    pub fn allow_plaintext(mut self) -> Self {
        self.allow_plaintext = true;
        self
    }

    /// Connects without TLS, creates the schema and applies the migrations it lacks, and
    /// returns the store. Meant for a server on this machine; for a server on another
    /// machine, use [`connect_tls`](Self::connect_tls) (or call
    /// [`allow_plaintext`](Self::allow_plaintext) first).
    ///
    /// # Errors
    /// [`Error::Config`], [`Error::InvalidSchema`], [`Error::InvalidSetting`] for bad
    /// settings; [`Error::Plaintext`] if a host is not a loopback one and plaintext was not
    /// allowed; [`Error::Connect`] if the server cannot be reached, or if the connection
    /// string asks for TLS (`sslmode=require`); [`Error::Migrate`] if a migration fails;
    /// [`Error::SchemaTooNew`] if the schema was migrated by a newer build.
    pub async fn connect(self) -> Result<PgStore, Error> {
        self.open(NoTls, false).await
    }

    /// As [`connect`](Self::connect), over TLS made by `tls`: every connection of the store
    /// (the migration's and the pool's) uses it. `tls` is any of tokio-postgres' TLS
    /// connectors, such as `postgres_native_tls::MakeTlsConnector`, `postgres_openssl`'s or
    /// `tokio_postgres_rustls`'s; it checks the server's certificate as it is configured to.
    /// The connection string's `sslmode` decides whether TLS is required (`require`: a server
    /// without TLS is refused) or tried first (`prefer`, the default). A server on another
    /// machine that offers no TLS is refused under `prefer` too, unless
    /// [`allow_plaintext`](Self::allow_plaintext) was called: then it is used in the clear, as
    /// in libpq, and the store says so in a WARN line.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// // postgres-native-tls and native-tls as dependencies; the system's roots are trusted.
    /// let tls = postgres_native_tls::MakeTlsConnector::new(native_tls::TlsConnector::new()?);
    /// let store = loops_postgres::PgStore::builder("host=db user=loops dbname=loops sslmode=require")
    ///     .connect_tls(tls)
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`Error::Connect`] also when the TLS handshake fails
    /// (a certificate the connector does not trust, a server without TLS, say).
    pub async fn connect_tls<T>(self, tls: T) -> Result<PgStore, Error>
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + Sync + 'static,
        T::TlsConnect: Send + Sync,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        self.open(tls, true).await
    }

    /// The settings checked, and the connection string parsed: what [`open`](Self::open)
    /// connects with.
    ///
    /// # Errors
    /// [`Error::InvalidSchema`]; [`Error::InvalidSetting`] for a pool of 0 connections, a
    /// lease under 10 ms, or a connection string that names no server; [`Error::Config`] if
    /// it does not parse.
    fn checked_config(&self) -> Result<tokio_postgres::Config, Error> {
        validate_schema(&self.schema)?;
        if self.pool_size == 0 {
            return Err(Error::InvalidSetting {
                setting: "pool_size",
                reason: "a pool needs at least one connection",
            });
        }
        if self.lease_ttl < Duration::from_millis(10) {
            return Err(Error::InvalidSetting {
                setting: "lease_ttl",
                reason: "a lease must last at least 10 ms",
            });
        }
        let config: tokio_postgres::Config = self
            .config
            .parse()
            .map_err(|source| Error::Config { source })?;
        if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
            return Err(Error::InvalidSetting {
                setting: "host",
                reason: "the connection string names no server: give postgres://USER@HOST[:PORT]/DATABASE, or host=HOST",
            });
        }
        Ok(config)
    }

    /// [`connect`](Self::connect) (`with_tls` false) or [`connect_tls`](Self::connect_tls).
    async fn open<T>(self, tls: T, with_tls: bool) -> Result<PgStore, Error>
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + Sync + 'static,
        T::TlsConnect: Send + Sync,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let mut config = self.checked_config()?;
        let label = label(&config, &self.schema);
        let transport = transport(&mut config, with_tls, self.allow_plaintext, &label)?;
        let given = config.get_options().map(str::to_owned);
        config
            .options(session_options(given.as_deref(), self.lease_ttl, None))
            .application_name(self.application_name.clone())
            .connect_timeout(self.connect_timeout)
            .keepalives(true)
            .keepalives_idle(self.lease_ttl.max(Duration::from_secs(1)))
            .keepalives_interval((self.lease_ttl / 3).max(Duration::from_secs(1)))
            .keepalives_retries(KEEPALIVE_PROBES);
        let connect_err = |cause: Box<dyn std::error::Error + Send + Sync>| Error::Connect {
            label: label.clone(),
            cause,
        };
        // Migrations run on a connection of their own, before the pool exists.
        let (mut client, connection) = config
            .connect(tls.clone())
            .await
            .map_err(|e| connect_err(e.into()))?;
        let conn_task = tokio::spawn(connection);
        let migrated = if self.migrate {
            migrate::migrate(&mut client, &self.schema).await
        } else {
            migrate::check(&client, &self.schema).await
        };
        let reported = match migrated {
            Ok(_) => {
                let remote = remote_host(&config).is_some();
                report_transport(&client, transport, remote, &label).await
            }
            Err(_) => Ok(()),
        };
        let skew = match (&migrated, &reported) {
            (Ok(_), Ok(())) => clock_skew(&client, &label, self.max_clock_skew).await,
            _ => Ok(0),
        };
        drop(client);
        let _ = conn_task.await;
        migrated?;
        reported?;
        let clock_skew_ms = skew?;
        // The pool's sessions also stop what the client gave up on.
        config.options(session_options(
            given.as_deref(),
            self.lease_ttl,
            Some(self.timeout),
        ));
        let pool = |size: usize| {
            let manager = Manager::from_config(
                config.clone(),
                tls.clone(),
                ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                },
            );
            Pool::builder(manager)
                .max_size(size)
                .runtime(deadpool_postgres::Runtime::Tokio1)
                .create_timeout(Some(self.connect_timeout))
                .build()
                .map_err(|e| connect_err(e.into()))
        };
        let sql = Sql::new(&self.schema);
        let listener = self.listen.then(|| {
            crate::listen::spawn(
                config.clone(),
                tls.clone(),
                sql.listen.clone(),
                label.clone(),
            )
        });
        Ok(PgStore {
            inner: Arc::new(Inner {
                sql,
                cache: crate::fast::Cache::new(self.one_round_trip),
                listener,
                pool: pool(self.pool_size)?,
                lease_pool: pool(1)?,
                label,
                schema: self.schema,
                lease_ttl: self.lease_ttl,
                timeout: self.timeout,
                clock_skew_ms,
                owner: owner_id(),
                live_since: std::sync::OnceLock::new(),
                announced: std::sync::Mutex::new(None),
                warned_limits: Default::default(),
            }),
        })
    }
}

/// The server's clock minus this machine's (as loops reads it, `loops_core::now_ms`), in ms,
/// from one query between two readings of this clock.
///
/// # Errors
/// [`Error::ClockSkew`] beyond `bound` (give or take half the query's round trip);
/// [`Error::Connect`] if the query fails.
async fn clock_skew(
    client: &tokio_postgres::Client,
    label: &str,
    bound: Duration,
) -> Result<i64, Error> {
    let before = loops_core::now_ms();
    let row = client
        .query_one(&format!("SELECT {}", crate::sql::NOW_MS), &[])
        .await
        .map_err(|e| Error::Connect {
            label: label.to_owned(),
            cause: e.into(),
        })?;
    let after = loops_core::now_ms();
    let server: i64 = row.try_get(0).map_err(|e| Error::Connect {
        label: label.to_owned(),
        cause: e.into(),
    })?;
    let slack_ms = after.saturating_sub(before).div_ceil(2);
    let middle =
        i64::try_from(before.saturating_add(after.saturating_sub(before) / 2)).unwrap_or(i64::MAX);
    let skew_ms = server.saturating_sub(middle);
    let bound_ms = loops_core::duration_ms(bound);
    if skew_ms.unsigned_abs() > bound_ms.saturating_add(slack_ms) {
        return Err(Error::ClockSkew {
            label: label.to_owned(),
            skew_ms,
            slack_ms,
            bound_ms,
        });
    }
    Ok(skew_ms)
}

/// Keepalive probes without an answer before either end drops a connection.
const KEEPALIVE_PROBES: u32 = 3;

/// The `options` every session of the store starts with: `given` (the connection string's),
/// then ours, which win over it and over the server's and the role's defaults. `timeout`,
/// for the pool's sessions: the longest statement and the longest wait for a lock.
fn session_options(given: Option<&str>, lease_ttl: Duration, timeout: Option<Duration>) -> String {
    let ms = |d: Duration| d.as_millis().max(1);
    // The server's keepalive settings are in whole seconds; 0 would mean the system default.
    let secs = |d: Duration| d.as_secs().max(1);
    let mut options: Vec<String> = given.map(str::to_owned).into_iter().collect();
    options.push("-c synchronous_commit=on".to_owned());
    options.push(format!(
        "-c idle_in_transaction_session_timeout={}",
        ms(lease_ttl)
    ));
    options.push(format!("-c tcp_keepalives_idle={}", secs(lease_ttl)));
    options.push(format!(
        "-c tcp_keepalives_interval={}",
        secs(lease_ttl / 3)
    ));
    options.push(format!("-c tcp_keepalives_count={KEEPALIVE_PROBES}"));
    if let Some(timeout) = timeout {
        options.push(format!("-c statement_timeout={}", ms(timeout)));
        options.push(format!("-c lock_timeout={}", ms(timeout)));
    }
    options.join(" ")
}

/// What protects the store's connections, as far as is known before connecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// TLS is required: a connection is encrypted or not made.
    Tls,
    /// Without TLS (`connect`, or `sslmode=disable`).
    Plain,
    /// TLS if the server offers it, else in the clear (`sslmode=prefer`, allowed to fall
    /// back): which one the first connection shows.
    Either,
}

/// Decides, before connecting, whether the store may connect as `config` says: refuses
/// plaintext to a host off this machine unless `allow_plaintext`, and turns `sslmode=prefer`
/// into `require` for such a host. `with_tls`: a TLS connector was given.
fn transport(
    config: &mut tokio_postgres::Config,
    with_tls: bool,
    allow_plaintext: bool,
    label: &str,
) -> Result<Transport, Error> {
    let mode = config.get_ssl_mode();
    let plain = !with_tls || mode == SslMode::Disable;
    if mode == SslMode::Require {
        // Without a connector, the connection fails (`Error::Connect`): never in the clear.
        return Ok(Transport::Tls);
    }
    let remote = remote_host(config);
    match remote {
        Some(host) if !allow_plaintext => {
            if plain {
                return Err(Error::Plaintext {
                    label: label.to_owned(),
                    host,
                });
            }
            // No silent fall-back to plaintext.
            config.ssl_mode(SslMode::Require);
            Ok(Transport::Tls)
        }
        _ if plain => Ok(Transport::Plain),
        _ => Ok(Transport::Either),
    }
}

/// The first host of `config` that is not this machine's loopback, if any. A host counts by
/// the address its `hostaddr` gives, when there is one.
fn remote_host(config: &tokio_postgres::Config) -> Option<String> {
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    (0..hosts.len().max(addrs.len())).find_map(|i| {
        let local = match (addrs.get(i), hosts.get(i)) {
            (Some(addr), _) => addr.is_loopback(),
            (None, Some(Host::Tcp(name))) => {
                name.eq_ignore_ascii_case("localhost")
                    || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
            }
            #[cfg(unix)]
            (None, Some(Host::Unix(_))) => true,
            (None, None) => true,
        };
        if local {
            return None;
        }
        Some(match (addrs.get(i), hosts.get(i)) {
            (Some(addr), _) => addr.to_string(),
            (None, Some(Host::Tcp(name))) => name.clone(),
            _ => String::new(),
        })
    })
}

/// Says in one line if the store's connections are unencrypted: a WARN for a host off this
/// machine (`remote`: only when plaintext was allowed), a DEBUG for the loopback, where no
/// network carries the connection. `client` is the first connection, which shows whether
/// `sslmode=prefer` fell back.
async fn report_transport(
    client: &tokio_postgres::Client,
    transport: Transport,
    remote: bool,
    label: &str,
) -> Result<(), Error> {
    let plain = match transport {
        Transport::Tls => false,
        Transport::Plain => true,
        Transport::Either => {
            let row = client
                .query_opt(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                    &[],
                )
                .await
                .map_err(|e| Error::Connect {
                    label: label.to_owned(),
                    cause: e.into(),
                })?;
            !row.is_some_and(|r| r.try_get::<_, bool>(0).unwrap_or(false))
        }
    };
    if plain && remote {
        tracing::warn!(
            store = label,
            "the connections of this store are unencrypted (no TLS)"
        );
    } else if plain {
        tracing::debug!(
            store = label,
            "the connections of this store are unencrypted (no TLS), on this machine's loopback"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(config: &str, with_tls: bool, allow: bool) -> Result<(Transport, SslMode), String> {
        let mut config: tokio_postgres::Config = config.parse().unwrap();
        match transport(&mut config, with_tls, allow, "label") {
            Ok(t) => Ok((t, config.get_ssl_mode())),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn plaintext_to_the_loopback_is_allowed() {
        for host in [
            "host=127.0.0.1",
            "host=127.0.0.9",
            "host=localhost",
            "host=::1",
            "host=/run/postgresql",
            "host=db hostaddr=127.0.0.1",
            "postgres://u@localhost:5432/db",
        ] {
            assert_eq!(
                decide(host, false, false),
                Ok((Transport::Plain, SslMode::Prefer)),
                "{host}"
            );
        }
    }

    #[test]
    fn plaintext_to_another_host_is_refused_unless_allowed() {
        let refusal = |host: &str| {
            format!(
                "refusing to connect to label without TLS: {host} is not a loopback address; \
                 use connect_tls with sslmode=require, or call allow_plaintext() to send \
                 everything in the clear"
            )
        };
        assert_eq!(decide("host=db", false, false), Err(refusal("db")));
        assert_eq!(
            decide("host=127.0.0.1,10.0.0.5", false, false),
            Err(refusal("10.0.0.5"))
        );
        assert_eq!(
            decide("host=localhost hostaddr=192.0.2.2", false, false),
            Err(refusal("192.0.2.2"))
        );
        // A TLS connector told not to use it.
        assert_eq!(
            decide("host=db sslmode=disable", true, false),
            Err(refusal("db"))
        );
        assert_eq!(
            decide("host=db", false, true),
            Ok((Transport::Plain, SslMode::Prefer))
        );
        // `require` without a connector fails at connect, never in the clear.
        assert_eq!(
            decide("host=db sslmode=require", false, false),
            Ok((Transport::Tls, SslMode::Require))
        );
    }

    #[test]
    fn sslmode_prefer_does_not_fall_back_for_another_host() {
        assert_eq!(
            decide("host=db", true, false),
            Ok((Transport::Tls, SslMode::Require))
        );
        assert_eq!(
            decide("host=db sslmode=prefer", true, true),
            Ok((Transport::Either, SslMode::Prefer))
        );
        assert_eq!(
            decide("host=127.0.0.1 sslmode=prefer", true, false),
            Ok((Transport::Either, SslMode::Prefer))
        );
    }

    #[test]
    fn sessions_end_when_idle_in_a_transaction_past_the_lease() {
        assert_eq!(
            session_options(None, Duration::from_millis(1500), None),
            "-c synchronous_commit=on -c idle_in_transaction_session_timeout=1500 \
             -c tcp_keepalives_idle=1 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3"
        );
        assert_eq!(
            session_options(
                Some("-c search_path=x"),
                Duration::from_secs(30),
                Some(Duration::from_secs(10))
            ),
            "-c search_path=x -c synchronous_commit=on \
             -c idle_in_transaction_session_timeout=30000 -c tcp_keepalives_idle=30 \
             -c tcp_keepalives_interval=10 -c tcp_keepalives_count=3 \
             -c statement_timeout=10000 -c lock_timeout=10000"
        );
    }
}
