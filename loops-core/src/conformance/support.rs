//! What the cases share: the rows and records they write, and the few writes most cases
//! make, each with the values every case expects back.

use std::sync::Arc;

use crate::error::Error;
use crate::record::{FailureRecord, FailureSource};
use crate::store::{AfterFailure, Lease, Reply, RunInfo, RunStatus, Store, WaitOutcome};

use super::factory::Factory;
use super::writes;

/// The workflow of the suite's runs.
pub(super) const WF: &str = "wf";
pub(super) use super::writes::HASH;

/// The row of a run of [`WF`] just created in state `A`.
pub(super) fn info(run_id: &str) -> RunInfo {
    RunInfo {
        run_id: run_id.to_owned(),
        workflow: WF.to_owned(),
        schema: HASH,
        status: RunStatus::Running,
        state: "A".to_owned(),
        seq: 0,
        attempt: 1,
        attempt_base: 0,
        interrupted: 0,
        created_ms: 1_000,
        updated_ms: 1_000,
        retry_at_ms: None,
        error: None,
        cancel: None,
        wait: None,
        block: None,
        entered: None,
        parent: None,
        // Above 2^53, where a JSON number read as a float would lose it: every write must
        // keep it as it is.
        key_nonce: Some(0xfedc_ba98_7654_3210),
    }
}

/// A transition record's bytes, as the runtime writes them.
pub(super) fn record(seq: u64, state: &str, payload: &str) -> Vec<u8> {
    format!(
        r#"{{"seq":{seq},"state":"{state}","at_ms":{},"schema":"{HASH}","payload":{payload}}}"#,
        1_000 + seq
    )
    .into_bytes()
}

/// A step record's bytes, as the runtime writes them.
pub(super) fn step_record(attempt: u32, output: &str) -> Vec<u8> {
    format!(r#"{{"attempt":{attempt},"at_ms":5,"duration_ms":1,"output":{output}}}"#).into_bytes()
}

/// A handler's failure of `attempt`, with a cause.
pub(super) fn failure(attempt: u32, text: &str) -> FailureRecord {
    FailureRecord {
        attempt,
        at_ms: 3_000 + u64::from(attempt),
        source: FailureSource::Handler,
        errors: vec![text.to_owned(), "cause".to_owned()],
    }
}

/// The run ids of `infos`, in their order.
pub(super) fn ids(infos: &[RunInfo]) -> Vec<&str> {
    infos.iter().map(|i| i.run_id.as_str()).collect()
}

/// The run's steps at `seq`, as `(name, occurrence, output JSON)`.
pub(super) async fn step_outputs(
    store: &dyn Store,
    run_id: &str,
    seq: u64,
) -> Vec<(String, u32, String)> {
    store
        .steps(run_id, seq)
        .await
        .unwrap()
        .into_iter()
        .map(|(n, o, r)| (n, o, r.output.get().to_owned()))
        .collect()
}

/// Takes the run's lease (always granted on a store one process owns).
pub(super) async fn lease(store: &dyn Store, run_id: &str) -> Lease {
    store
        .acquire(run_id)
        .await
        .unwrap()
        .expect("the lease is free")
}

/// Creates `run_id` under a lease of its own; returns the lease.
pub(super) async fn create(store: &dyn Store, run_id: &str) -> Lease {
    let l = lease(store, run_id).await;
    store
        .write(
            Some(&l),
            writes::create(
                info(run_id),
                record(0, "A", r#"{"A":{"n":1}}"#),
                "workflow wf\n",
            ),
        )
        .await
        .unwrap();
    l
}

/// Moves `run_id` to `S{seq}` at `2_000 + seq` ms.
pub(super) async fn transition(
    store: &dyn Store,
    l: &Lease,
    run_id: &str,
    seq: u64,
    terminal: bool,
) -> Result<RunInfo, Error> {
    let state = format!("S{seq}");
    let payload = format!(r#"{{"S{seq}":{seq}}}"#);
    store
        .write(
            Some(l),
            writes::transition(
                run_id,
                seq,
                &state,
                record(seq, &state, &payload),
                terminal,
                2_000 + seq,
            ),
        )
        .await
        .and_then(|r| r.into_run(run_id))
}

/// Records the step `(name, occurrence)` of attempt 1 at `seq`, with output
/// `"{name}{occurrence}"`.
pub(super) async fn step(
    store: &dyn Store,
    l: &Lease,
    run_id: &str,
    seq: u64,
    name: &str,
    occurrence: u32,
) -> Result<Reply, Error> {
    store
        .write(
            Some(l),
            writes::step(
                run_id,
                seq,
                name,
                occurrence,
                step_record(1, &format!(r#""{name}{occurrence}""#)),
            ),
        )
        .await
}

/// Sends an event at 7,000 ms; returns its event seq and whether it was a duplicate.
pub(super) async fn send(
    store: &dyn Store,
    run_id: &str,
    name: &str,
    payload: &str,
    key: Option<&str>,
) -> Result<(u64, bool), Error> {
    match store
        .write(None, writes::send(run_id, name, payload, key, 7_000))
        .await?
    {
        Reply::Sent {
            event_seq,
            duplicate,
            ..
        } => Ok((event_seq, duplicate)),
        other => panic!("expected Sent, got {other:?}"),
    }
}

/// Records a failure of the lease's run at `seq`.
pub(super) async fn fail(
    store: &dyn Store,
    l: &Lease,
    seq: u64,
    record: FailureRecord,
    then: AfterFailure,
) -> Result<RunInfo, Error> {
    store
        .write(Some(l), writes::failure(&l.run_id, seq, record, then))
        .await
        .and_then(|r| r.into_run(&l.run_id))
}

/// Begins the next attempt of "r" with `max` failed attempts and 2 interruptions allowed.
pub(super) async fn begin_attempt(store: &dyn Store, l: &Lease, seq: u64, max: u32) -> RunInfo {
    store
        .write(Some(l), writes::begin_attempt("r", seq, max, 2, 4_000))
        .await
        .unwrap()
        .into_run("r")
        .unwrap()
}

/// Asks for `run_id` to be cancelled ("stop") at 6,000 ms.
pub(super) async fn cancel(
    store: &dyn Store,
    run_id: &str,
    end_now: bool,
) -> Result<RunInfo, Error> {
    store
        .write(None, writes::cancel(run_id, "stop", end_now, 6_000))
        .await
        .and_then(|r| r.into_run(run_id))
}

/// Retries `run_id` at 8,000 ms.
pub(super) async fn retry(store: &dyn Store, run_id: &str) -> Result<RunInfo, Error> {
    store
        .write(None, writes::retry(run_id, 8_000))
        .await
        .and_then(|r| r.into_run(run_id))
}

/// A wait of "r" at seq 0, attempt 1, at 10,000 ms.
pub(super) async fn wait(
    store: &dyn Store,
    l: &Lease,
    step: Option<(&str, u32)>,
    event: Option<&str>,
    until_ms: Option<u64>,
) -> Result<(WaitOutcome, RunInfo), Error> {
    match store
        .write(
            Some(l),
            writes::wait("r", 0, 1, step, event, until_ms, 10_000),
        )
        .await?
    {
        Reply::Waited(outcome, info) => Ok((outcome, info)),
        other => panic!("expected Waited, got {other:?}"),
    }
}

/// The factory's second handle, which a store whose leases lapse must give: such a store is
/// shared by several workers, and its lease cases need one.
pub(super) async fn second(f: &dyn Factory) -> Arc<dyn Store> {
    f.second().await.expect(
        "a store whose leases lapse is shared by several workers: its Factory::second must give \
         a second handle on the same store",
    )
}
