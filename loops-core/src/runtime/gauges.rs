//! The gauges of runs ([`RUNS`](crate::metrics::RUNS) and
//! [`RUNS_PARKED`](crate::metrics::RUNS_PARKED)), refreshed from the store's status index:
//! by [`Runtime::refresh_metrics`], and, when
//! [`RuntimeBuilder::metrics_interval`](crate::RuntimeBuilder::metrics_interval) (or
//! `RuntimeBuilder::prometheus`) asked for it, at once when [`Runtime::serve`] starts and then
//! at that interval.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use crate::error::Result;
use crate::metrics::{STATUSES, set_runs};
use crate::runtime::handle::Runtime;
use crate::status::RunStatus;

/// How often [`Runtime::serve`] refreshes the gauges of runs when the builder was given a
/// Prometheus handle and no [`RuntimeBuilder::metrics_interval`](crate::RuntimeBuilder::metrics_interval):
/// every 15 seconds.
pub const DEFAULT_METRICS_INTERVAL: Duration = Duration::from_secs(15);

impl Runtime {
    /// Sets the gauges [`loops_runs`](crate::metrics::RUNS) (the store's runs by workflow and
    /// status, every worker's) and [`loops_runs_parked`](crate::metrics::RUNS_PARKED) (the
    /// store's waiting runs that no task of this runtime holds) from the store's status
    /// index, now. A workflow seen by an earlier refresh and gone since (pruned) is set to 0.
    ///
    /// [`serve`](Self::serve) calls it on its own when the builder asked for it
    /// ([`RuntimeBuilder::metrics_interval`](crate::RuntimeBuilder::metrics_interval)); call it
    /// yourself for fresh figures between two refreshes (before a scrape, in a test). The
    /// counts come from the status index without reading rows
    /// ([`Store::count_runs`](crate::Store::count_runs): one pass over the index's keys on
    /// redb, one `GROUP BY` on PostgreSQL); the parked runs are told from the rows of the
    /// waiting runs, so a store with many waiting runs reads each of them per refresh.
    ///
    /// # Errors
    /// The store's error if the counts or the waiting runs could not be read
    /// ([`Error::Storage`](crate::Error::Storage), [`Error::Database`](crate::Error::Database));
    /// no gauge is changed then.
    pub async fn refresh_metrics(&self) -> Result<()> {
        let mut counts: BTreeMap<String, ([u64; 6], u64)> = BTreeMap::new();
        for count in self.inner.store.count_runs().await? {
            if let Some(i) = STATUSES.iter().position(|s| *s == count.status) {
                counts.entry(count.workflow).or_default().0[i] = count.runs;
            }
        }
        for run in self.inner.store.list(RunStatus::Waiting, None).await? {
            if !self.inner.claims.holds(&run.run_id) {
                let entry = counts.entry(run.workflow).or_default();
                entry.1 += 1;
            }
        }
        // Read apart, the two may disagree by the runs that moved in between: never more
        // parked runs than waiting ones.
        let waiting = STATUSES
            .iter()
            .position(|s| *s == RunStatus::Waiting)
            .unwrap_or_default();
        for (by_status, parked) in counts.values_mut() {
            *parked = (*parked).min(by_status[waiting]);
        }
        let mut seen = self
            .inner
            .gauged
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for gone in seen.iter().filter(|w| !counts.contains_key(*w)) {
            set_runs(gone, [0; 6], 0);
        }
        for (workflow, (by_status, parked)) in &counts {
            set_runs(workflow, *by_status, *parked);
        }
        seen.extend(counts.into_keys());
        Ok(())
    }

    /// Starts the background task that refreshes the gauges of runs, once per runtime, if the
    /// builder asked for it. The task holds the runtime weakly: it ends with the runtime's
    /// last clone, or at [`shutdown`](Self::shutdown).
    pub(crate) fn start_gauges(&self) {
        let Some(every) = self.inner.config.metrics_interval else {
            return;
        };
        if self.inner.gauging.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        self.inner.background.spawn_task(async move {
            loop {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                if let Err(e) = (Runtime { inner }).refresh_metrics().await {
                    tracing::warn!(
                        error = %e,
                        every_ms = crate::clock::duration_ms(every),
                        "could not refresh the gauges of runs; trying again at the next interval"
                    );
                }
                tokio::time::sleep(every).await;
            }
        });
    }
}
