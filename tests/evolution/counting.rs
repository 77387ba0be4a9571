//! A store that logs the kind of every write it is given (and of every claim), in front of
//! any other store.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use loops::{
    BoxFuture, ClaimFilter, EventRecord, FailureRecord, Lease, Reply, RunInfo, RunStatus,
    SchemaHash, StepRecord, Store, TransitionRecord, Write,
};

/// `inner`, with a log of the writes (`"Block r1"`, ...) it was given.
#[derive(Clone)]
pub struct Counting<S> {
    pub inner: S,
    pub writes: Arc<Mutex<Vec<String>>>,
}

impl<S> Counting<S> {
    pub fn new(inner: S) -> Self {
        Counting {
            inner,
            writes: Arc::default(),
        }
    }

    /// The writes of `run_id`, by kind (`"Block"`, `"Migrate"`, ...), in order.
    pub fn writes_of(&self, run_id: &str) -> Vec<String> {
        self.writes
            .lock()
            .unwrap()
            .iter()
            .filter_map(|w| {
                let (kind, run) = w.split_once(' ')?;
                (run == run_id).then(|| kind.to_owned())
            })
            .collect()
    }
}

fn kind(write: &Write) -> String {
    let debug = format!("{write:?}");
    let kind = debug.split([' ', '{', '(']).next().unwrap_or("").to_owned();
    format!("{kind} {}", write.run_id().unwrap_or("-"))
}

impl<S: Store> Store for Counting<S> {
    fn label(&self) -> String {
        self.inner.label()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn write<'a>(
        &'a self,
        lease: Option<&'a Lease>,
        write: Write,
    ) -> BoxFuture<'a, loops::Result<Reply>> {
        self.writes.lock().unwrap().push(kind(&write));
        self.inner.write(lease, write)
    }
    fn run_info<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, loops::Result<Option<RunInfo>>> {
        self.inner.run_info(run_id)
    }
    fn latest<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops::Result<Option<(RunInfo, TransitionRecord)>>> {
        self.inner.latest(run_id)
    }
    fn history<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops::Result<Vec<TransitionRecord>>> {
        self.inner.history(run_id)
    }
    fn steps<'a>(
        &'a self,
        run_id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, loops::Result<Vec<(String, u32, StepRecord)>>> {
        self.inner.steps(run_id, seq)
    }
    fn failures<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops::Result<Vec<(u64, FailureRecord)>>> {
        self.inner.failures(run_id)
    }
    fn events<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, loops::Result<Vec<(u64, EventRecord, bool)>>> {
        self.inner.events(run_id)
    }
    fn has_pending<'a>(
        &'a self,
        run_id: &'a str,
        event: &'a str,
    ) -> BoxFuture<'a, loops::Result<bool>> {
        self.inner.has_pending(run_id, event)
    }
    fn list<'a>(
        &'a self,
        status: RunStatus,
        workflow: Option<&'a str>,
    ) -> BoxFuture<'a, loops::Result<Vec<RunInfo>>> {
        self.inner.list(status, workflow)
    }
    fn schema(&self, hash: SchemaHash) -> BoxFuture<'_, loops::Result<Option<String>>> {
        self.inner.schema(hash)
    }
    fn schemas(&self) -> BoxFuture<'_, loops::Result<Vec<(SchemaHash, String)>>> {
        self.inner.schemas()
    }
    fn acquire<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, loops::Result<Option<Lease>>> {
        self.inner.acquire(run_id)
    }
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, loops::Result<()>> {
        self.inner.release(lease)
    }
    fn renew<'a>(&'a self, leases: &'a [Lease]) -> BoxFuture<'a, loops::Result<Vec<Lease>>> {
        self.inner.renew(leases)
    }
    fn lease_ttl(&self) -> Option<Duration> {
        self.inner.lease_ttl()
    }
    fn claim_ready<'a>(
        &'a self,
        workflows: &'a [ClaimFilter],
        limit: usize,
    ) -> BoxFuture<'a, loops::Result<Vec<(RunInfo, Lease)>>> {
        self.inner.claim_ready(workflows, limit)
    }
}
