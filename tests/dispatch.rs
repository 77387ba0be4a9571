//! A generated handler trait implemented with `async fn`s, dispatched on a multi-threaded
//! runtime from `tokio::spawn` (which requires the dispatch future to be `Send`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use loops::{Context, Dispatch, StateId, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Countdown {
    /// Start counting down from `from`.
    #[initial]
    #[next(Tick)]
    Start { from: u32 },
    /// A tuple state; it loops on itself until zero.
    #[next(Tick, Liftoff)]
    Tick(u32),
    #[terminal]
    Liftoff,
}

struct Counter {
    ticks: AtomicU32,
}

impl CountdownHandler for Counter {
    type Error = anyhow::Error;

    async fn start(&self, ctx: &Context, from: u32) -> Result<StartNext, Self::Error> {
        anyhow::ensure!(ctx.attempt() >= 1, "attempts count from 1");
        tokio::task::yield_now().await;
        Ok(StartNext::Tick(from))
    }

    async fn tick(&self, _ctx: &Context, field0: u32) -> Result<TickNext, Self::Error> {
        self.ticks.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        match field0 {
            0 => Ok(TickNext::Liftoff),
            n => Ok(TickNext::Tick(n - 1)),
        }
    }
}

/// Drives a run to its end the way the runtime will: dispatch, store, repeat.
async fn run(
    handler: Arc<Counter>,
    mut state: Countdown,
) -> Result<Vec<CountdownState>, loops::BoxError> {
    let mut trail = vec![state.state()];
    let mut seq = 0;
    while !state.state().is_terminal() {
        let ctx = loops::__for_tests("run-1", seq, 1);
        let next = state.dispatch(&*handler, &ctx).await?;
        assert!(trail.last().unwrap().can_move_to(next.state()));
        trail.push(next.state());
        state = next;
        seq += 1;
    }
    Ok(trail)
}

#[test]
fn dispatch_is_send_on_a_multi_threaded_runtime() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let handler = Arc::new(Counter {
        ticks: AtomicU32::new(0),
    });
    let task = run(handler.clone(), Countdown::Start { from: 2 });
    let trail = runtime
        .block_on(async { tokio::spawn(task).await })
        .unwrap()
        .unwrap();
    use CountdownState::*;
    assert_eq!(trail, [Start, Tick, Tick, Tick, Liftoff]);
    assert_eq!(handler.ticks.load(Ordering::SeqCst), 3);
}

#[test]
fn handler_errors_are_boxed_with_their_message() {
    struct Failing;
    impl CountdownHandler for Failing {
        type Error = std::io::Error;
        async fn start(&self, _: &Context, _: u32) -> Result<StartNext, Self::Error> {
            Err(std::io::Error::other("disk on fire"))
        }
        async fn tick(&self, _: &Context, _: u32) -> Result<TickNext, Self::Error> {
            unreachable!()
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ctx = loops::__for_tests("run-2", 0, 1);
    let error = runtime
        .block_on(Countdown::Start { from: 1 }.dispatch(&Failing, &ctx))
        .unwrap_err();
    assert_eq!(error.to_string(), "disk on fire");
    assert!(error.downcast_ref::<std::io::Error>().is_some());
}

#[test]
fn dispatching_a_terminal_state_is_an_error() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ctx = loops::__for_tests("run-3", 0, 1);
    let handler = Counter {
        ticks: AtomicU32::new(0),
    };
    let error = runtime
        .block_on(Countdown::Liftoff.dispatch(&handler, &ctx))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "workflow `countdown`: state `Liftoff` is terminal and has no handler"
    );
}

#[test]
fn every_handler_implementation_can_be_dispatched() {
    fn assert_dispatch<W: Dispatch<H>, H: ?Sized>() {}
    assert_dispatch::<Countdown, Counter>();
    assert_eq!(Countdown::NAME, "countdown");
}
