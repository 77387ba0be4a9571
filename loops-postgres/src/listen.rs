//! Wake-ups: each worker `LISTEN`s on the store's channel on a connection of its own, and a
//! notification (sent by a write that makes a run ready, or by the release of a lease whose
//! run still needs a driver) wakes its claim loop at once ([`loops_core::Store::wakeups`]).
//!
//! The listener is one task per store. A lost connection is logged and opened again after a
//! back-off (100 ms, doubling up to 10 s); while it is down, polling carries on, and once it
//! listens again it wakes the claim loop once, for what it may have missed. The task ends
//! when every receiver of its signal is gone (the store and the runtimes that serve it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Socket};

/// The first wait before the listener connects again; doubled after each failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The longest wait before the listener connects again.
const MOST_BACKOFF: Duration = Duration::from_secs(10);

/// What the listener task shares with its store.
pub(crate) struct Listener {
    /// Changed at each notification (and after each reconnection).
    pub(crate) wakeups: watch::Receiver<u64>,
    /// Whether the listener's `LISTEN` is in effect now.
    pub(crate) listening: Arc<AtomicBool>,
}

/// Starts the listener task of a store: connects with `config` (the pool's: the same
/// session settings, keepalives and time-outs) over `tls`, `LISTEN`s with `listen` (the
/// store's statement), and signals every notification. `label` names the store in logs.
pub(crate) fn spawn<T>(
    config: tokio_postgres::Config,
    tls: T,
    listen: String,
    label: String,
) -> Listener
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + Sync + 'static,
    T::TlsConnect: Send + Sync,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (tx, wakeups) = watch::channel(0u64);
    let listening = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&listening);
    tokio::spawn(async move {
        tokio::select! {
            () = run(&config, tls, &listen, &label, &tx, &flag) => {}
            () = tx.closed() => {}
        }
        flag.store(false, Ordering::Release);
    });
    Listener { wakeups, listening }
}

/// Wakes every receiver of `tx`.
fn wake(tx: &watch::Sender<u64>) {
    tx.send_modify(|n| *n = n.wrapping_add(1));
}

/// Listens, and listens again after each loss, for as long as it is not dropped.
async fn run<T>(
    config: &tokio_postgres::Config,
    tls: T,
    listen: &str,
    label: &str,
    tx: &watch::Sender<u64>,
    listening: &AtomicBool,
) where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + Sync + 'static,
    T::TlsConnect: Send + Sync,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let mut backoff = FIRST_BACKOFF;
    let mut lost_before = false;
    loop {
        let ended = session(config, tls.clone(), listen, tx, listening, || {
            if lost_before {
                tracing::info!(
                    store = label,
                    "listening for wake-ups again; claiming the runs made ready meanwhile"
                );
            }
            backoff = FIRST_BACKOFF;
        })
        .await;
        listening.store(false, Ordering::Release);
        lost_before = true;
        tracing::warn!(
            store = label,
            error = %ended,
            retry_in_ms = loops_core::duration_ms(backoff),
            "the connection that listens for wake-ups is lost; polling until it is back"
        );
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2).min(MOST_BACKOFF);
    }
}

/// One connection's life: connects, `LISTEN`s (then calls `listening_again` and wakes the
/// receivers once), and signals notifications until the connection ends; returns why.
async fn session<T>(
    config: &tokio_postgres::Config,
    tls: T,
    listen: &str,
    tx: &watch::Sender<u64>,
    listening: &AtomicBool,
    listening_again: impl FnOnce(),
) -> String
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + Sync + 'static,
    T::TlsConnect: Send + Sync,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    if crate::failpoint::listener_refused() {
        return "refused by the fault point loops_postgres::listen::connect".to_owned();
    }
    let (client, mut connection) = match config.connect(tls).await {
        Ok(pair) => pair,
        Err(e) => return format!("cannot connect: {}", crate::cause_text(&e)),
    };
    // Drives the connection, and signals each notification it brings.
    let driven = async {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(_))) => wake(tx),
                Some(Ok(_)) => {}
                Some(Err(e)) => return crate::cause_text(&e),
                None => return "the server closed the connection".to_owned(),
            }
        }
    };
    tokio::pin!(driven);
    let listened = tokio::select! {
        listened = client.batch_execute(listen) => listened,
        ended = &mut driven => return ended,
    };
    if let Err(e) = listened {
        return format!("LISTEN failed: {}", crate::cause_text(&e));
    }
    listening.store(true, Ordering::Release);
    listening_again();
    // Whatever was made ready while nobody listened is claimed now, not at the next poll.
    wake(tx);
    let ended = driven.await;
    drop(client);
    ended
}
