//! Child runs, as the runtime sees them: driving a child a handler started, waking a parent
//! when its child ends, and telling the drivers of a cancelled run's children.

use std::sync::Arc;

use crate::run::context::Kin;
use crate::runtime::handle::{Inner, Runtime};
use crate::store::Write;

impl Kin for Inner {
    fn drive_child(self: Arc<Self>, workflow: &str, run_id: &str) {
        self.looked_after(run_id);
        Runtime { inner: self }.spawn_driver(workflow, run_id);
    }

    fn look_after_child(self: Arc<Self>, workflow: &str, run_id: &str) {
        if self.looked_after(run_id) {
            Runtime { inner: self }.spawn_driver(workflow, run_id);
        }
    }

    fn first_look_at_children(&self, parent: &str) -> bool {
        self.parents
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(parent.to_owned())
    }

    fn can_drive(&self, workflow: &str, schema: crate::SchemaHash) -> bool {
        self.store.lease_ttl().is_some()
            || self
                .registry
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .driver(workflow, schema)
                .is_some()
    }
}

impl Inner {
    /// Marks the child `run_id` as looked after by this process; whether it was not yet.
    fn looked_after(&self, run_id: &str) -> bool {
        let mut children = self
            .children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A join looks at each unfinished child at every wake-up: no allocation once known.
        !children.contains(run_id) && children.insert(run_id.to_owned())
    }
}

impl Runtime {
    /// Forgets the run `run_id` (it ended) as a child and as a parent looked after.
    pub(crate) fn forget_ended(&self, run_id: &str) {
        for set in [&self.inner.children, &self.inner.parents] {
            set.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(run_id);
        }
    }

    /// After the run `run_id` ended here: wakes its parent `parent` in this process (the
    /// event that wakes it is in its inbox already, written with the child's end; this only
    /// starts or signals the parent's driver, as [`send`](Self::send) does). A store shared
    /// by several workers makes the parent claimable by any of them anyway.
    pub(crate) async fn wake_parent(&self, run_id: &str, parent: &str) {
        match self.store().run_info(parent).await {
            Ok(Some(parent)) => self.wake(&parent),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(run_id, parent, error = %e, "could not read the parent of an ended run; its next claim or resume wakes it");
            }
        }
    }

    /// After the run `run_id` was cancelled: signals the drivers in this process of its
    /// descendants whose cancellation the same commit asked for (those not ended), so that
    /// a running child stops at its next step, and a child waiting in place sees its row.
    /// Ends as cancelled the run `run_id`, whose cancellation was asked, if nobody drives it:
    /// a child left running by a process that stopped (its cancellation by the parent's
    /// cascade was asked of a driver that is gone), as [`cancel`](Self::cancel) ends a run
    /// nobody drives. Its lease is taken meanwhile, so that no worker starts driving it; a
    /// run some driver holds is left to it. A failure is logged: the run then ends when it is
    /// next driven.
    async fn end_undriven(&self, run_id: &str) {
        let lease = match self.store().acquire(run_id).await {
            Ok(Some(lease)) => lease,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(run_id, error = %e, "could not take a cancelled child; it ends when it is next driven");
                return;
            }
        };
        let end = Write::EndCancelled {
            run_id: run_id.to_owned(),
            at_ms: self.now_ms(),
        };
        match self.store().write(None, end).await {
            Ok(_) => self.inner.background.notify_ended(),
            Err(e) => {
                tracing::warn!(run_id, error = %e, "could not end a cancelled child; it ends when it is next driven");
            }
        }
        if let Err(e) = self.store().release(&lease).await {
            tracing::warn!(run_id, error = %e, "could not release a lease");
        }
    }

    pub(crate) async fn signal_cancelled_children(&self, run_id: &str) {
        let mut todo = vec![run_id.to_owned()];
        while let Some(parent) = todo.pop() {
            let children = match self.store().children(&parent).await {
                Ok(children) => children,
                Err(e) => {
                    tracing::warn!(run_id = %parent, error = %e, "could not list the children of a cancelled run; they end at their next boundary");
                    continue;
                }
            };
            for child in children {
                if child.cancel.is_none() {
                    continue;
                }
                if let Some(signals) = self.inner.claims.signals(&child.run_id) {
                    signals.cancel.cancel();
                    signals.wake.notify_one();
                } else if !child.status.is_ended() {
                    self.end_undriven(&child.run_id).await;
                }
                todo.push(child.run_id);
            }
        }
    }
}
