//! Retention that runs itself: while [`Runtime::serve`] runs, the builder's
//! [`RetentionPolicy`](crate::RetentionPolicy) is applied at once and then every
//! [`RuntimeBuilder::retention_interval`](crate::RuntimeBuilder::retention_interval).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::record::now_ms;
use crate::runtime::handle::Runtime;
use crate::store::prune;

/// How often [`Runtime::serve`] applies the retention policy unless
/// [`RuntimeBuilder::retention_interval`](crate::RuntimeBuilder::retention_interval) says
/// otherwise: every hour.
pub const DEFAULT_RETENTION_INTERVAL: Duration = Duration::from_secs(60 * 60);

impl Runtime {
    /// Starts the background task that applies the retention policy, once per runtime, if the
    /// policy expires anything (`max_age` or `keep_last` set). The task holds the runtime
    /// weakly: it ends with the runtime's last clone, or at [`shutdown`](Self::shutdown).
    pub(crate) fn start_retention(&self) {
        let policy = self.inner.config.retention.clone();
        if policy.max_age.is_none() && policy.keep_last.is_none() {
            return;
        }
        if self.inner.retaining.swap(true, Ordering::AcqRel) {
            return;
        }
        let every = self.inner.config.retention_interval;
        let weak = Arc::downgrade(&self.inner);
        self.inner.background.spawn_task(async move {
            loop {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let store = Arc::clone(&inner.store);
                drop(inner);
                match prune(&*store, &policy, now_ms(), false).await {
                    Ok(pruned) => {
                        crate::metrics::pruned(pruned.runs);
                        tracing::info!(
                            runs = pruned.runs,
                            records = pruned.records,
                            every_ms = crate::clock::duration_ms(every),
                            "retention removed ended runs"
                        );
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        every_ms = crate::clock::duration_ms(every),
                        "retention could not prune; trying again at the next interval"
                    ),
                }
                drop(store);
                tokio::time::sleep(every).await;
            }
        });
    }
}
