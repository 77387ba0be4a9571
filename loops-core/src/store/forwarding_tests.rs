//! Stores in front of another store ([`SealedStore`](super::sealing::SealedStore), the test
//! kit's `HookedStore`) restate the delegation of every [`Store`] method: a method added to
//! the trait with a default, and not forwarded by a wrapper, would silently answer with the
//! default (it happened with `shared_limits`). [`assert_forwards`] calls every method of
//! the trait, as read from this module's source, through a wrapper around a [`Probe`], and
//! fails unless each reached the probe.
//!
//! Why not one forwarding mechanism for both: `SealedStore` changes what most methods
//! return (it opens payloads in the rows and records read back), `HookedStore` changes none
//! and puts each call to a hook; a shared layer would have to be generic over every
//! method's answer, an abstraction larger than the two restatements it would replace.

use std::any::Any;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{
    BoxFuture, ClaimFilter, EventRecord, Lease, Reply, RunInfo, RunStatus, SeqStep, SharedLimits,
    Store, Write,
};
use crate::error::Result;
use crate::record::{FailureRecord, StepRecord, TransitionRecord};
use crate::schema::SchemaHash;

/// The methods of [`Store`], read from the trait's declaration in `store/mod.rs`.
fn store_methods() -> BTreeSet<String> {
    let source = include_str!("mod.rs");
    let start = source
        .find("pub trait Store: ")
        .expect("store/mod.rs declares `pub trait Store`");
    let body = &source[start..];
    let end = body.find("\n}\n").expect("the trait's closing brace");
    body[..end]
        .lines()
        .filter_map(|line| line.strip_prefix("    fn "))
        .map(|rest| rest.split(['<', '(']).next().unwrap_or_default().to_owned())
        .collect()
}

/// A store that notes which of its methods were called, and answers each with nothing.
/// Clones share the notes.
#[derive(Default, Clone)]
pub(crate) struct Probe {
    called: Arc<Mutex<BTreeSet<&'static str>>>,
}

impl Probe {
    fn note(&self, method: &'static str) {
        self.called.lock().unwrap().insert(method);
    }

    fn answer<'a, T: Send + 'a>(
        &'a self,
        method: &'static str,
        value: T,
    ) -> BoxFuture<'a, Result<T>> {
        self.note(method);
        Box::pin(async move { Ok(value) })
    }
}

impl Store for Probe {
    fn label(&self) -> String {
        self.note("label");
        "probe".to_owned()
    }

    fn as_any(&self) -> &dyn Any {
        self.note("as_any");
        self
    }

    fn write<'a>(&'a self, _: Option<&'a Lease>, _: Write) -> BoxFuture<'a, Result<Reply>> {
        self.answer("write", Reply::Done)
    }

    fn run_info<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<RunInfo>>> {
        self.answer("run_info", None)
    }

    fn children<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<RunInfo>>> {
        self.answer("children", Vec::new())
    }

    fn latest<'a>(
        &'a self,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Option<(RunInfo, TransitionRecord)>>> {
        self.answer("latest", None)
    }

    fn history<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<TransitionRecord>>> {
        self.answer("history", Vec::new())
    }

    fn steps<'a>(
        &'a self,
        _: &'a str,
        _: u64,
    ) -> BoxFuture<'a, Result<Vec<(String, u32, StepRecord)>>> {
        self.answer("steps", Vec::new())
    }

    fn all_steps<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<SeqStep>>> {
        self.answer("all_steps", Vec::new())
    }

    fn failures<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<(u64, FailureRecord)>>> {
        self.answer("failures", Vec::new())
    }

    fn events<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<(u64, EventRecord, bool)>>> {
        self.answer("events", Vec::new())
    }

    fn has_pending<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<bool>> {
        self.answer("has_pending", false)
    }

    fn list<'a>(&'a self, _: RunStatus, _: Option<&'a str>) -> BoxFuture<'a, Result<Vec<RunInfo>>> {
        self.answer("list", Vec::new())
    }

    fn list_of_schemas<'a>(
        &'a self,
        _: RunStatus,
        _: &'a str,
        _: &'a [SchemaHash],
    ) -> BoxFuture<'a, Result<Vec<RunInfo>>> {
        self.answer("list_of_schemas", Vec::new())
    }

    fn count_runs(&self) -> BoxFuture<'_, Result<Vec<super::RunCount>>> {
        self.answer("count_runs", Vec::new())
    }

    fn attributes<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<crate::Attributes>> {
        self.answer("attributes", crate::Attributes::default())
    }

    fn search<'a>(
        &'a self,
        _: &'a crate::RunFilter,
    ) -> BoxFuture<'a, Result<Vec<(RunInfo, crate::Attributes)>>> {
        self.answer("search", Vec::new())
    }

    fn schema(&self, _: SchemaHash) -> BoxFuture<'_, Result<Option<String>>> {
        self.answer("schema", None)
    }

    fn schemas(&self) -> BoxFuture<'_, Result<Vec<(SchemaHash, String)>>> {
        self.answer("schemas", Vec::new())
    }

    fn sealing_keys(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        self.answer("sealing_keys", Vec::new())
    }

    fn sealing_checks(&self) -> BoxFuture<'_, Result<Vec<(String, String)>>> {
        self.answer("sealing_checks", Vec::new())
    }

    fn schedules(&self) -> BoxFuture<'_, Result<Vec<crate::ScheduleInfo>>> {
        self.answer("schedules", Vec::new())
    }

    fn acquire<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<Lease>>> {
        self.answer("acquire", None)
    }

    fn release<'a>(&'a self, _: &'a Lease) -> BoxFuture<'a, Result<()>> {
        self.answer("release", ())
    }

    fn renew<'a>(&'a self, _: &'a [Lease]) -> BoxFuture<'a, Result<Vec<Lease>>> {
        self.answer("renew", Vec::new())
    }

    fn lease_ttl(&self) -> Option<Duration> {
        self.note("lease_ttl");
        Some(Duration::from_secs(7))
    }

    fn claim_ready<'a>(
        &'a self,
        _: &'a [ClaimFilter],
        _: usize,
    ) -> BoxFuture<'a, Result<Vec<(RunInfo, Lease)>>> {
        self.answer("claim_ready", Vec::new())
    }

    fn claim_ready_and_parked<'a>(
        &'a self,
        _: &'a [ClaimFilter],
        _: usize,
    ) -> BoxFuture<'a, Result<super::ReadyAndParked>> {
        self.answer("claim_ready_and_parked", (Vec::new(), Vec::new()))
    }

    fn shared_limits(&self) -> Option<Arc<dyn SharedLimits>> {
        self.note("shared_limits");
        None
    }

    fn wakeups(&self) -> Option<crate::store::Wakeups> {
        self.note("wakeups");
        None
    }
}

/// Calls every method of [`Store`] on the store `wrap` puts in front of a [`Probe`], and
/// fails naming each method that did not reach the probe, or that this check does not call
/// (a method added to the trait: call it below, and forward it in every wrapper).
pub(crate) async fn assert_forwards(wrapper: &str, wrap: impl FnOnce(Probe) -> Arc<dyn Store>) {
    let probe = Probe::default();
    let store = wrap(probe.clone());
    let lease = Lease {
        run_id: "r".to_owned(),
        token: 1,
        expires_ms: None,
    };
    let mut called = BTreeSet::new();
    let mut call = |method: &'static str| called.insert(method.to_owned());
    call("label");
    assert_eq!(store.label(), "probe", "{wrapper}::label");
    call("as_any");
    assert!(
        store.as_any().downcast_ref::<Probe>().is_some(),
        "{wrapper}::as_any does not reach the store behind it"
    );
    call("write");
    store
        .write(
            None,
            Write::Prune {
                run_ids: Vec::new(),
            },
        )
        .await
        .unwrap();
    call("run_info");
    store.run_info("r").await.unwrap();
    call("children");
    store.children("r").await.unwrap();
    call("latest");
    store.latest("r").await.unwrap();
    call("history");
    store.history("r").await.unwrap();
    call("steps");
    store.steps("r", 0).await.unwrap();
    call("all_steps");
    store.all_steps("r").await.unwrap();
    call("failures");
    store.failures("r").await.unwrap();
    call("events");
    store.events("r").await.unwrap();
    call("has_pending");
    store.has_pending("r", "e").await.unwrap();
    call("list");
    store.list(RunStatus::Waiting, None).await.unwrap();
    call("list_of_schemas");
    store
        .list_of_schemas(RunStatus::Waiting, "w", &[SchemaHash::from_u64(1)])
        .await
        .unwrap();
    call("count_runs");
    store.count_runs().await.unwrap();
    call("attributes");
    store.attributes("r").await.unwrap();
    call("search");
    store.search(&crate::RunFilter::new()).await.unwrap();
    call("schema");
    store.schema(SchemaHash::from_u64(1)).await.unwrap();
    call("schemas");
    store.schemas().await.unwrap();
    call("sealing_keys");
    store.sealing_keys().await.unwrap();
    call("sealing_checks");
    store.sealing_checks().await.unwrap();
    call("schedules");
    store.schedules().await.unwrap();
    call("acquire");
    store.acquire("r").await.unwrap();
    call("release");
    store.release(&lease).await.unwrap();
    call("renew");
    store.renew(std::slice::from_ref(&lease)).await.unwrap();
    call("lease_ttl");
    assert_eq!(
        store.lease_ttl(),
        Some(Duration::from_secs(7)),
        "{wrapper}::lease_ttl"
    );
    call("claim_ready");
    store
        .claim_ready(&[ClaimFilter::any("w")], 1)
        .await
        .unwrap();
    call("claim_ready_and_parked");
    store
        .claim_ready_and_parked(&[ClaimFilter::any("w")], 1)
        .await
        .unwrap();
    call("shared_limits");
    assert!(store.shared_limits().is_none());
    call("wakeups");
    assert!(store.wakeups().is_none());

    let methods = store_methods();
    let untested: Vec<&String> = methods.difference(&called).collect();
    assert!(
        untested.is_empty(),
        "Store methods this check does not call: {untested:?}; call them in assert_forwards"
    );
    let reached: BTreeSet<String> = probe
        .called
        .lock()
        .unwrap()
        .iter()
        .map(|m| (*m).to_owned())
        .collect();
    let missed: Vec<&String> = methods.difference(&reached).collect();
    assert!(
        missed.is_empty(),
        "{wrapper} does not forward these Store methods to the store behind it: {missed:?}"
    );
}

#[test]
fn the_method_list_is_read_from_the_trait() {
    let methods = store_methods();
    assert!(methods.contains("write") && methods.contains("shared_limits"));
    assert_eq!(methods.len(), 30, "{methods:?}");
}

#[tokio::test]
async fn the_sealed_store_forwards_every_method() {
    use super::sealing::{Payloads, SealedStore};
    assert_forwards("SealedStore", |probe| {
        Arc::new(SealedStore::new(Arc::new(probe), Payloads::redacting()))
    })
    .await;
}
