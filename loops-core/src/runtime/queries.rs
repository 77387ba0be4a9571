//! Reading runs ([`Runtime::run_info`], [`Runtime::state`], [`Runtime::history`],
//! [`Runtime::list_runs`]) and keeping the store ([`Runtime::prune`], [`Runtime::compact`]).

use crate::attribute::{Attributes, RunFilter};
use crate::error::{Error, Result};
use crate::record::Transition;
use crate::retention::RetentionPolicy;
use crate::row::RunInfo;
use crate::runtime::handle::{Runtime, check_workflow};
use crate::status::RunStatus;
use crate::store::redb::{Compacted, RedbStore};
use crate::store::{Pruned, find_runs, prune};
use crate::workflow::Workflow;

impl Runtime {
    /// Removes the ended runs that the configured retention policy
    /// ([`RuntimeBuilder::retention`](crate::RuntimeBuilder::retention)) expires now: their records, rows and events.
    ///
    /// # Errors
    /// As [`RedbStore::prune`](crate::RedbStore::prune).
    pub async fn prune(&self) -> Result<Pruned> {
        self.prune_with(&self.inner.config.retention, false).await
    }

    /// Removes (or, with `dry_run`, only lists) the ended runs `policy` expires now.
    ///
    /// # Errors
    /// As [`RedbStore::prune`](crate::RedbStore::prune).
    pub async fn prune_with(&self, policy: &RetentionPolicy, dry_run: bool) -> Result<Pruned> {
        let report = prune(self.store(), policy, self.now_ms(), dry_run).await?;
        tracing::info!(
            runs = report.runs,
            records = report.records,
            dry_run,
            "pruned ended runs"
        );
        Ok(report)
    }

    /// Compacts the store file (see [`RedbStore::compact`](crate::RedbStore::compact)) on a blocking thread; reads and
    /// commits wait until it is done.
    ///
    /// # Errors
    /// As [`RedbStore::compact`](crate::RedbStore::compact); [`Error::ReadOnly`](crate::Error::ReadOnly) if the store is not a redb file.
    pub async fn compact(&self) -> Result<Compacted> {
        let store = self.store_arc();
        let label = store.label();
        tokio::task::spawn_blocking(move || match store.as_any().downcast_ref::<RedbStore>() {
            Some(redb) => redb.compact(),
            None => Err(Error::ReadOnly { path: label.into() }),
        })
        .await
        .map_err(|e| Error::Open {
            path: self.store().label().into(),
            cause: e.into(),
        })?
    }

    /// The run's current standing, or `None` if no run has this id.
    ///
    /// # Errors
    /// [`Error::Storage`](crate::Error::Storage) on a read error; [`Error::Decode`](crate::Error::Decode) if the row is unreadable.
    pub async fn run_info(&self, run_id: &str) -> Result<Option<RunInfo>> {
        self.inner.store.run_info(run_id).await
    }

    /// The run's current state and its sequence number, decoded as `W`, or `None` if no run
    /// has this id.
    ///
    /// # Errors
    /// [`Error::WorkflowMismatch`](crate::Error::WorkflowMismatch) if the run is of another workflow; [`Error::Decode`](crate::Error::Decode) if the
    /// record does not decode as `W`; [`Error::Storage`](crate::Error::Storage) on a read error.
    pub async fn state<W: Workflow>(&self, run_id: &str) -> Result<Option<(u64, W)>> {
        let Some((info, record)) = self.inner.store.latest(run_id).await? else {
            return Ok(None);
        };
        check_workflow::<W>(&info)?;
        Ok(Some((record.seq, record.decode(run_id)?)))
    }

    /// Every transition of the run, in order, decoded as `W` (empty if no run has this id).
    ///
    /// # Errors
    /// [`Error::WorkflowMismatch`](crate::Error::WorkflowMismatch) if the run is of another workflow; [`Error::Decode`](crate::Error::Decode) naming
    /// the sequence number of a record that does not decode as `W`; [`Error::Storage`](crate::Error::Storage).
    pub async fn history<W: Workflow>(&self, run_id: &str) -> Result<Vec<Transition<W>>> {
        if let Some(info) = self.inner.store.run_info(run_id).await? {
            check_workflow::<W>(&info)?;
        }
        self.inner
            .store
            .history(run_id)
            .await?
            .into_iter()
            .map(|record| {
                let value: W = record.decode(run_id)?;
                Ok(Transition {
                    seq: record.seq,
                    state: value.state(),
                    at_ms: record.at_ms,
                    value,
                })
            })
            .collect()
    }

    /// The runs with `status`, optionally only those of workflow `workflow`, read from the
    /// status index.
    ///
    /// # Errors
    /// [`Error::Storage`](crate::Error::Storage) on a read error; [`Error::Decode`](crate::Error::Decode) if a row is unreadable.
    pub async fn list_runs(
        &self,
        status: RunStatus,
        workflow: Option<&str>,
    ) -> Result<Vec<RunInfo>> {
        self.inner.store.list(status, workflow).await
    }

    /// The run's searchable attributes (empty if it has none or does not exist).
    ///
    /// # Errors
    /// [`Error::Storage`](crate::Error::Storage) or [`Error::Database`](crate::Error::Database)
    /// on a read error.
    pub async fn attributes(&self, run_id: &str) -> Result<Attributes> {
        self.inner.store.attributes(run_id).await
    }

    /// The runs that `filter` selects (status, workflow, last change, attributes), with their
    /// attributes, by run id. With an attribute filter, the runs come from the store's
    /// attribute index ([`find_runs`](crate::find_runs)), not from a scan.
    ///
    /// ```no_run
    /// # extern crate loops_core as loops;
    /// # async fn f(rt: loops::Runtime) -> loops::Result<()> {
    /// use loops::{AttributeFilter, RunFilter, RunStatus};
    /// let filter = RunFilter::new()
    ///     .status(RunStatus::Running)
    ///     .attribute("repo", "acme/api")
    ///     .where_attribute(AttributeFilter::int_range("issue", 10..=20));
    /// for (info, attributes) in rt.list_runs_where(&filter).await? {
    ///     println!("{} {:?}", info.run_id, attributes.get("issue"));
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::Storage`](crate::Error::Storage) or [`Error::Database`](crate::Error::Database)
    /// on a read error; [`Error::Decode`](crate::Error::Decode) if a row is unreadable.
    pub async fn list_runs_where(&self, filter: &RunFilter) -> Result<Vec<(RunInfo, Attributes)>> {
        find_runs(self.store(), filter).await
    }
}
