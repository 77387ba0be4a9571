//! Statements sent together: a pipeline of futures polled in order, so that their
//! statements reach the server in that order, in one round trip.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use tokio_postgres::Row;

/// A statement's future in a pipeline: its rows, or nothing.
pub(crate) type Step<'a> =
    Pin<Box<dyn Future<Output = std::result::Result<Vec<Row>, tokio_postgres::Error>> + Send + 'a>>;

/// Awaits `futures` together, polling them in order: each sends its statement when first
/// polled, so they go to the server in this order, in one round trip.
pub(crate) async fn pipeline<T>(
    futures: Vec<Pin<Box<dyn Future<Output = T> + Send + '_>>>,
) -> Vec<T> {
    let mut futures = futures;
    let mut done: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in futures.iter_mut().zip(done.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}
