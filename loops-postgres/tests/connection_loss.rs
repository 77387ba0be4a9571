//! Connection loss: while a worker drives runs, the server ends its sessions again and again
//! (`pg_terminate_backend`, as a failover or a restart would; the server itself is shared by
//! everyone on the machine, so it is not restarted); or the worker reaches the server through
//! a TCP proxy that stops forwarding (a blocked server, a partition) and then drops every
//! connection and refuses new ones (a server that went away). The worker recovers: every run
//! completes exactly once, with no gap or duplicate in its history and no effect run again
//! after its record committed.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::chain::{Chain, Ledger, Linker, verify};
use loops::{RetryPolicy, RunStatus, Runtime};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Default)]
struct MemLedger {
    lines: Mutex<Vec<String>>,
    next: AtomicU64,
}

impl Ledger for MemLedger {
    fn effect(&self, run_id: &str, seq: u64) -> String {
        let exec = format!("e{}", self.next.fetch_add(1, Ordering::SeqCst));
        self.lines
            .lock()
            .unwrap()
            .push(format!("{run_id} {seq} {exec}"));
        exec
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_recovers_when_its_sessions_are_terminated() {
    let schema = common::TestSchema::new("cut").await;
    let app = format!("loops-cut-{}", std::process::id());
    let store = schema.store_named(Duration::from_secs(1), &app).await;
    let ledger = Arc::new(MemLedger::default());
    let rt = Runtime::builder()
        // Each lost connection may cost the attempt in flight: allow many.
        .retry(
            RetryPolicy::attempts(1000)
                .with_delays(Duration::from_millis(1), Duration::from_millis(10)),
        )
        .register::<Chain, _>(Linker {
            ledger: ledger.clone(),
            delay: Duration::from_millis(30),
        })
        .build(store);
    let serving = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.serve(Duration::from_millis(50)).await })
    };
    let links = 30;
    let run_ids: Vec<String> = (0..8).map(|i| format!("cut-{i}")).collect();
    for run_id in &run_ids {
        rt.start(run_id, Chain::Start { links }).await.unwrap();
    }
    let admin = common::admin().await;
    let mut terminated = 0i64;
    let deadline = Instant::now() + Duration::from_secs(120);
    for round in 0.. {
        let mut done = true;
        for run_id in &run_ids {
            if rt.run_info(run_id).await.ok().flatten().map(|i| i.status)
                != Some(RunStatus::Completed)
            {
                done = false;
            }
        }
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "runs did not complete in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
        if round < 15 {
            let row = admin
                .query_one(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = $1 AND pid <> pg_backend_pid()",
                    &[&app],
                )
                .await
                .unwrap();
            terminated += row.get::<_, i64>(0);
        }
    }
    assert!(terminated > 0, "no session was terminated");
    let lines = ledger.lines.lock().unwrap().clone();
    let report = verify(rt.store(), &run_ids, links, &lines).await;
    println!(
        "{terminated} sessions terminated; {} effects ran again before their record committed",
        report.repeated_before_record
    );
    rt.shutdown().await;
    serving.await.unwrap().unwrap();
}

/// What the proxy does with the bytes between the worker and the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Forwards them.
    Forward,
    /// Holds them: connections stay open and nothing arrives (a blocked server).
    Hold,
    /// Closes every connection, and each new one at once (a server that went away).
    Down,
}

/// A TCP proxy to the test server on 127.0.0.1; returns its port.
async fn proxy(mode: watch::Receiver<Mode>) -> u16 {
    let config: tokio_postgres::Config = common::pg_config().parse().unwrap();
    let upstream = format!(
        "{}:{}",
        match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "127.0.0.1".to_owned(),
        },
        config.get_ports().first().copied().unwrap_or(5432)
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            if *mode.borrow() == Mode::Down {
                continue;
            }
            tokio::spawn(pipe(client, upstream.clone(), mode.clone()));
        }
    });
    port
}

async fn pipe(mut client: TcpStream, upstream: String, mut mode: watch::Receiver<Mode>) {
    let Ok(mut server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let copy = tokio::io::copy_bidirectional(&mut client, &mut server);
    tokio::pin!(copy);
    loop {
        let now = *mode.borrow_and_update();
        match now {
            Mode::Down => return,
            // Not polling the copy holds every byte where it is.
            Mode::Hold => {
                if mode.changed().await.is_err() {
                    return;
                }
            }
            Mode::Forward => {
                tokio::select! {
                    _ = &mut copy => return,
                    changed = mode.changed() => if changed.is_err() { return },
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_recovers_when_the_server_stops_answering_or_goes_away() {
    let schema = common::TestSchema::new("proxy").await;
    let (set_mode, mode) = watch::channel(Mode::Forward);
    let port = proxy(mode).await;
    let config: tokio_postgres::Config = common::pg_config().parse().unwrap();
    let through_proxy = format!(
        "host=127.0.0.1 port={port} user={} dbname={}",
        config.get_user().unwrap_or("postgres"),
        config.get_dbname().unwrap_or("postgres")
    );
    // Migrate directly; the worker goes through the proxy.
    drop(schema.store(Duration::from_secs(1)).await);
    let store = loops_postgres::PgStore::builder(through_proxy)
        .schema(schema.name.clone())
        .pool_size(4)
        .lease_ttl(Duration::from_secs(1))
        .timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let ledger = Arc::new(MemLedger::default());
    let rt = Runtime::builder()
        .retry(
            RetryPolicy::attempts(1000)
                .with_delays(Duration::from_millis(1), Duration::from_millis(10)),
        )
        .register::<Chain, _>(Linker {
            ledger: ledger.clone(),
            delay: Duration::from_millis(30),
        })
        .build(store);
    let serving = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.serve(Duration::from_millis(50)).await })
    };
    let links = 30;
    let run_ids: Vec<String> = (0..6).map(|i| format!("px-{i}")).collect();
    for run_id in &run_ids {
        rt.start(run_id, Chain::Start { links }).await.unwrap();
    }
    // Reads go around the proxy, so that the test sees the truth while the worker cannot.
    let observer = schema.store(Duration::from_secs(1)).await;
    let completed = || async {
        let mut n = 0;
        for run_id in &run_ids {
            if loops_core::Store::run_info(&observer, run_id)
                .await
                .unwrap()
                .map(|i| i.status)
                == Some(RunStatus::Completed)
            {
                n += 1;
            }
        }
        n
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = completed().await;
    set_mode.send(Mode::Hold).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    set_mode.send(Mode::Forward).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    set_mode.send(Mode::Down).unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    set_mode.send(Mode::Forward).unwrap();
    assert!(before < run_ids.len(), "the runs ended before the outages");
    let deadline = Instant::now() + Duration::from_secs(120);
    while completed().await < run_ids.len() {
        assert!(Instant::now() < deadline, "runs did not complete in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lines = ledger.lines.lock().unwrap().clone();
    let report = verify(&observer, &run_ids, links, &lines).await;
    println!(
        "through the proxy: {} effects ran again before their record committed",
        report.repeated_before_record
    );
    rt.shutdown().await;
    serving.await.unwrap().unwrap();
}
