//! Registered workflows: the handler of each, and the background task that drives one of
//! its runs until the run ends or parks.

use std::marker::PhantomData;
use std::sync::Arc;

use tracing::Instrument;

use crate::error::Error;
use crate::record::now_ms;
use crate::run::dispatch::Dispatch;
use crate::run::driver::{Driven, Mode, is_ready};
use crate::runtime::handle::{Driver, Runtime, Start};

/// A workflow's registered handler.
pub(crate) struct Registered<W, H> {
    handler: Arc<H>,
    _workflow: PhantomData<fn() -> W>,
}

impl<W, H> Registered<W, H> {
    pub(crate) fn new(handler: H) -> Self {
        Registered {
            handler: Arc::new(handler),
            _workflow: PhantomData,
        }
    }
}

impl<W, H> Driver for Registered<W, H>
where
    W: Dispatch<H>,
    H: Send + Sync + 'static,
{
    fn spawn(&self, runtime: Runtime, start: Start) {
        let handler = Arc::clone(&self.handler);
        let rt = runtime.clone();
        let task = async move {
            let (claim, entered) = match start {
                Start::Claimed(claimed) => {
                    let (claim, entered) = *claimed;
                    (claim, Some(entered))
                }
                Start::Find { run_id, lease } => match rt.claim_with(&run_id, lease).await {
                    Ok(claim) => (claim, None),
                    // Driven already, here or by another worker: it will see the news.
                    Err(Error::RunActive { .. }) => return,
                    Err(e) => {
                        tracing::warn!(run_id, error = %e, "cannot claim the run");
                        return;
                    }
                },
            };
            let run_id = claim.run_id().to_owned();
            let span = tracing::info_span!("run", run_id = %run_id, workflow = W::NAME);
            let result = async {
                let entered = match entered {
                    Some(entered) => entered,
                    None => rt.drive(&claim).enter::<W>(None).await?,
                };
                rt.drive(&claim)
                    .drive_loop::<W, H>(entered, &*handler, Mode::Background)
                    .await
            }
            .instrument(span)
            .await;
            drop(claim);
            let hand_off = match result {
                Ok(Driven::Parked(info)) => {
                    if let Some(until) = info.wait.as_ref().and_then(|w| w.until_ms) {
                        rt.add_timer(until, W::NAME, &run_id);
                    }
                    true
                }
                Ok(Driven::Ended(_)) => true,
                Err(e @ (Error::RunFailed { .. } | Error::RunCancelled { .. })) => {
                    tracing::info!(run_id, error = %e, "run ended");
                    true
                }
                // Its records are of a shape this build does not compile: trying again
                // changes nothing (issue 14). Said once; the run is left as it is, for a build
                // that knows its schema.
                Err(e @ (Error::SchemaMismatch { .. } | Error::WorkflowMismatch { .. })) => {
                    tracing::warn!(run_id, error = %e, "this build cannot drive the run; not retried");
                    false
                }
                Err(e) => {
                    // A storage error, say: try again in a second rather than at once.
                    tracing::error!(run_id, error = %e, "background driver stopped; retrying in 1 s");
                    rt.add_timer(now_ms() + 1000, W::NAME, &run_id);
                    false
                }
            };
            // Whatever reached the run while this driver still held it (an event, a
            // cancellation, a retry of the failed run) found it driven and only signalled the
            // driver, which was stopping. Look again now that the run is free.
            if hand_off && needs_driver(&rt, &run_id).await {
                rt.spawn_driver(W::NAME, &run_id);
            }
            rt.inner.background.notify_ended();
        };
        runtime.inner.background.spawn_task(task);
    }
}

/// Whether a run that no driver holds should be driven: it is running, or waiting with its
/// wait over, or its cancellation was asked for and it has not ended.
async fn needs_driver(rt: &Runtime, run_id: &str) -> bool {
    let Ok(Some(info)) = rt.store().run_info(run_id).await else {
        return false;
    };
    is_ready(rt.store(), &info).await.unwrap_or(false)
}

impl Runtime {
    /// Registers `handler` as the driver of workflow `W`'s runs: [`start`](Self::start),
    /// [`resume_all`](Self::resume_all), [`send`](Self::send) and the timer of a parked run
    /// then drive `W`'s runs in the background with it. Registering `W` again replaces the
    /// handler for runs started afterwards.
    pub fn register<W, H>(&self, handler: H)
    where
        W: Dispatch<H>,
        H: Send + Sync + 'static,
    {
        self.set_driver(W::NAME, Arc::new(Registered::<W, H>::new(handler)));
    }
}
