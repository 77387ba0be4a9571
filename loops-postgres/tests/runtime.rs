//! The runtime over `PgStore`: the behaviours of `loops-core`'s own runtime tests (a run
//! completes with its exact history, failed attempts retry and steps replay, waits and
//! events, cancellation), plus what only a shared store has: events and cancellations from
//! another process, and a run that moves to another worker when its driver stops. (Lapsed
//! leases of killed and paused workers: `tests/workers.rs`.)

mod common;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use loops::{Context, Error, RetryPolicy, RunStatus, Runtime, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "pg_job")]
enum Job {
    #[initial]
    #[next(Work)]
    Start { n: u32 },
    #[next(Work, Approve)]
    Work { n: u32, acc: u64 },
    #[next(Done)]
    Approve { acc: u64 },
    #[terminal]
    Done { acc: u64, by: String },
}

#[derive(Default)]
struct Agent {
    /// (state, seq, attempt) of every handler call.
    calls: Mutex<Vec<(&'static str, u64, u32)>>,
    /// Runs of the `effect` step's closure.
    effects: AtomicU32,
    /// `Work` fails on attempts up to this one, after its step.
    fail_work: u32,
    /// `Work` takes this long after its step.
    work_delay: Duration,
    /// `Work` waits for a permit of this after its step.
    work_gate: Option<Arc<tokio::sync::Semaphore>>,
}

impl Agent {
    fn calls(&self) -> Vec<(&'static str, u64, u32)> {
        self.calls.lock().unwrap().clone()
    }
    fn enter(&self, ctx: &Context) {
        self.calls
            .lock()
            .unwrap()
            .push((ctx.state(), ctx.seq(), ctx.attempt()));
    }
}

impl JobHandler for Arc<Agent> {
    type Error = anyhow::Error;

    async fn start(&self, ctx: &Context, n: u32) -> Result<StartNext, Self::Error> {
        self.enter(ctx);
        Ok(StartNext::Work { n, acc: 0 })
    }

    async fn work(&self, ctx: &Context, n: u32, acc: u64) -> Result<WorkNext, Self::Error> {
        self.enter(ctx);
        let add: u64 = ctx
            .step("effect", || async {
                self.effects.fetch_add(1, Ordering::SeqCst);
                Ok(u64::from(n) * 10)
            })
            .await?;
        if !self.work_delay.is_zero() {
            tokio::time::sleep(self.work_delay).await;
        }
        if let Some(gate) = &self.work_gate {
            let _permit = gate.acquire().await?;
        }
        anyhow::ensure!(
            ctx.attempt() > self.fail_work,
            "work failed on attempt {}",
            ctx.attempt()
        );
        Ok(if n == 0 {
            WorkNext::Approve { acc: acc + add }
        } else {
            WorkNext::Work {
                n: n - 1,
                acc: acc + add,
            }
        })
    }

    async fn approve(&self, ctx: &Context, acc: u64) -> Result<ApproveNext, Self::Error> {
        self.enter(ctx);
        let by: String = ctx.wait_for("approval").await?;
        Ok(ApproveNext::Done { acc, by })
    }
}

fn fast_retry(attempts: u32) -> RetryPolicy {
    RetryPolicy::attempts(attempts).with_delays(Duration::from_millis(1), Duration::from_millis(5))
}

const TTL: Duration = Duration::from_secs(2);

async fn until_status(rt: &Runtime, run_id: &str, status: RunStatus) -> loops::RunInfo {
    for _ in 0..1000 {
        if let Some(info) = rt.run_info(run_id).await.unwrap()
            && info.status == status
        {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("run {run_id} never reached {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_completes_with_its_exact_history() {
    let schema = common::TestSchema::new("r_complete").await;
    let rt = Runtime::builder().build(schema.store(TTL).await);
    let agent = Arc::new(Agent::default());
    let driver = {
        let (rt, agent) = (rt.clone(), agent.clone());
        tokio::spawn(async move { rt.run("r1", Job::Start { n: 2 }, &agent).await })
    };
    until_status(&rt, "r1", RunStatus::Waiting).await;
    rt.send("r1", "approval", "ann").await.unwrap();
    let done = driver.await.unwrap().unwrap();
    assert_eq!(
        done,
        Job::Done {
            acc: 30,
            by: "ann".into()
        }
    );
    let states: Vec<(u64, String)> = rt
        .history::<Job>("r1")
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.seq, t.state.to_string()))
        .collect();
    assert_eq!(
        states,
        vec![
            (0, "Start".into()),
            (1, "Work".into()),
            (2, "Work".into()),
            (3, "Work".into()),
            (4, "Approve".into()),
            (5, "Done".into()),
        ]
    );
    assert_eq!(agent.effects.load(Ordering::SeqCst), 3);
    let info = rt.run_info("r1").await.unwrap().unwrap();
    assert_eq!(
        (info.status, info.state.as_str(), info.seq, info.attempt),
        (RunStatus::Completed, "Done", 5, 1)
    );
    // Driving an ended run again returns its final state and calls nothing: its lease was
    // released (or is taken over) at once.
    let calls = agent.calls().len();
    let again = rt.run("r1", Job::Start { n: 9 }, &agent).await.unwrap();
    assert_eq!(
        again,
        Job::Done {
            acc: 30,
            by: "ann".into()
        }
    );
    assert_eq!(agent.calls().len(), calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_retry_and_steps_replay() {
    let schema = common::TestSchema::new("r_retry").await;
    let rt = Runtime::builder()
        .retry(fast_retry(3))
        .build(schema.store(TTL).await);
    let agent = Arc::new(Agent {
        fail_work: 2,
        ..Agent::default()
    });
    let driver = {
        let (rt, agent) = (rt.clone(), agent.clone());
        tokio::spawn(async move { rt.run("r", Job::Start { n: 0 }, &agent).await })
    };
    until_status(&rt, "r", RunStatus::Waiting).await;
    rt.send("r", "approval", "bo").await.unwrap();
    driver.await.unwrap().unwrap();
    assert_eq!(
        agent.calls(),
        vec![
            ("Start", 0, 1),
            ("Work", 1, 1),
            ("Work", 1, 2),
            ("Work", 1, 3),
            ("Approve", 2, 1),
            ("Approve", 2, 1),
        ]
    );
    assert_eq!(agent.effects.load(Ordering::SeqCst), 1, "the step replays");
    let failures = rt.store().failures("r").await.unwrap();
    let errors: Vec<(u64, u32, String)> = failures
        .into_iter()
        .map(|(seq, f)| (seq, f.attempt, f.errors[0].clone()))
        .collect();
    assert_eq!(
        errors,
        vec![
            (1, 1, "work failed on attempt 1".into()),
            (1, 2, "work failed on attempt 2".into()),
        ]
    );

    // Attempts run out; an explicit retry resumes.
    let agent = Arc::new(Agent {
        fail_work: 9,
        ..Agent::default()
    });
    let err = rt.run("f", Job::Start { n: 0 }, &agent).await.unwrap_err();
    assert!(
        matches!(&err, Error::RunFailed { attempts: 3, state, seq: 1, .. } if state == "Work"),
        "{err:?}"
    );
    assert_eq!(
        rt.list_runs(RunStatus::Failed, Some("pg_job"))
            .await
            .unwrap()
            .len(),
        1
    );
    rt.retry("f").await.unwrap();
    let agent = Arc::new(Agent {
        fail_work: 3,
        ..Agent::default()
    });
    let driver = {
        let (rt, agent) = (rt.clone(), agent.clone());
        tokio::spawn(async move { rt.run("f", Job::Start { n: 0 }, &agent).await })
    };
    until_status(&rt, "f", RunStatus::Waiting).await;
    rt.send("f", "approval", "cy").await.unwrap();
    driver.await.unwrap().unwrap();
    assert_eq!(agent.calls()[0], ("Work", 1, 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_from_another_process_reaches_a_parked_run() {
    let schema = common::TestSchema::new("r_event").await;
    let agent = Arc::new(Agent::default());
    let worker = Runtime::builder()
        .register::<Job, _>(agent.clone())
        .build(schema.store(TTL).await);
    let serving = {
        let worker = worker.clone();
        tokio::spawn(async move { worker.serve(Duration::from_millis(100)).await })
    };
    worker.start("p", Job::Start { n: 1 }).await.unwrap();
    // A client with no handler, on a pool of its own (as another process would be).
    let client = Runtime::builder().build(schema.store(TTL).await);
    until_status(&client, "p", RunStatus::Waiting).await;
    // Sent early, with a key: kept, delivered once.
    let sent = client
        .send_with_key("p", "approval", "k1", "dee")
        .await
        .unwrap();
    assert_eq!((sent.event_seq, sent.duplicate), (0, false));
    let again = client
        .send_with_key("p", "approval", "k1", "dee")
        .await
        .unwrap();
    assert_eq!((again.event_seq, again.duplicate), (0, true));
    let done: Job = client.wait("p").await.unwrap();
    assert_eq!(
        done,
        Job::Done {
            acc: 10,
            by: "dee".into()
        }
    );
    let events = client.store().events("p").await.unwrap();
    assert_eq!(events.len(), 1);
    assert!(events[0].2, "delivered");
    worker.shutdown().await;
    serving.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_run_sees_events_and_cancellations_from_another_process() {
    let schema = common::TestSchema::new("r_attached").await;
    let rt = Runtime::builder().build(schema.store(TTL).await);
    let client = Runtime::builder().build(schema.store(TTL).await);
    let agent = Arc::new(Agent::default());
    let driver = {
        let (rt, agent) = (rt.clone(), agent.clone());
        tokio::spawn(async move { rt.run("a", Job::Start { n: 0 }, &agent).await })
    };
    until_status(&client, "a", RunStatus::Waiting).await;
    client.send("a", "approval", "eve").await.unwrap();
    assert_eq!(
        driver.await.unwrap().unwrap(),
        Job::Done {
            acc: 0,
            by: "eve".into()
        }
    );
    // Another attached run waits; another process cancels it: the worker that holds it ends
    // it (the client sees the run held, so it does not end it itself).
    let driver = {
        let (rt, agent) = (rt.clone(), agent.clone());
        tokio::spawn(async move { rt.run("b", Job::Start { n: 0 }, &agent).await })
    };
    until_status(&client, "b", RunStatus::Waiting).await;
    let info = client.cancel("b", "not needed").await.unwrap();
    assert_eq!(info.status, RunStatus::Waiting, "held by the other worker");
    match driver.await.unwrap() {
        Err(Error::RunCancelled { run_id, reason, .. }) => {
            assert_eq!((run_id.as_str(), reason.as_str()), ("b", "not needed"));
        }
        other => panic!("expected RunCancelled, got {other:?}"),
    }
    assert_eq!(
        client.run_info("b").await.unwrap().unwrap().status,
        RunStatus::Cancelled
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_idle_runs_at_once_and_driven_runs_at_a_boundary() {
    let schema = common::TestSchema::new("r_cancel").await;
    let agent = Arc::new(Agent {
        work_delay: Duration::from_millis(300),
        ..Agent::default()
    });
    let worker = Runtime::builder()
        .register::<Job, _>(agent.clone())
        .build(schema.store(TTL).await);
    let client = Runtime::builder().build(schema.store(TTL).await);
    // Driven by the worker: ends at its next state boundary.
    worker.start("busy", Job::Start { n: 5 }).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let info = client.cancel("busy", "operator").await.unwrap();
    assert_eq!(info.status, RunStatus::Running);
    match client.wait::<Job>("busy").await {
        Err(Error::RunCancelled { reason, .. }) => assert_eq!(reason, "operator"),
        other => panic!("expected RunCancelled, got {other:?}"),
    }
    let info = client.run_info("busy").await.unwrap().unwrap();
    assert_eq!(
        (info.status, info.state.as_str()),
        (RunStatus::Cancelled, "Work")
    );
    assert!(info.seq <= 3, "ended at a boundary soon after: {info:?}");
    // Parked: nobody holds it, so it ends at once.
    let parked = Runtime::builder()
        .register::<Job, _>(Arc::new(Agent::default()))
        .build(schema.store(TTL).await);
    parked.start("idle", Job::Start { n: 0 }).await.unwrap();
    until_status(&client, "idle", RunStatus::Waiting).await;
    // Let the parked driver give its lease back.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let info = client.cancel("idle", "gone").await.unwrap();
    assert_eq!(info.status, RunStatus::Cancelled);
    assert!(matches!(
        client.cancel("idle", "again").await,
        Err(Error::RunEnded {
            status: RunStatus::Cancelled,
            ..
        })
    ));
    worker.shutdown().await;
    parked.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_moves_to_another_worker_when_its_driver_stops() {
    let schema = common::TestSchema::new("r_move").await;
    let ttl = Duration::from_millis(500);
    // The first worker stops while its handler runs, after the step's record.
    let stuck = Arc::new(Agent {
        work_delay: Duration::from_secs(3600),
        ..Agent::default()
    });
    let first = Runtime::builder()
        .register::<Job, _>(stuck.clone())
        .build(schema.store(ttl).await);
    first.start("m", Job::Start { n: 0 }).await.unwrap();
    // Wait for the step's record, not just its effect: stopping between the two is the
    // window in which an effect runs again.
    for _ in 0..500 {
        if !first.store().steps("m", 1).await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.shutdown().await;
    let agent = Arc::new(Agent::default());
    let second = Runtime::builder()
        .register::<Job, _>(agent.clone())
        .build(schema.store(ttl).await);
    let serving = {
        let second = second.clone();
        tokio::spawn(async move { second.serve(Duration::from_millis(50)).await })
    };
    until_status(&second, "m", RunStatus::Waiting).await;
    second.send("m", "approval", "fin").await.unwrap();
    assert_eq!(
        second.wait::<Job>("m").await.unwrap(),
        Job::Done {
            acc: 0,
            by: "fin".into()
        }
    );
    // The effect was recorded by the first worker and replayed by the second.
    assert_eq!(agent.effects.load(Ordering::SeqCst), 0);
    let failures = second.store().failures("m").await.unwrap();
    assert_eq!(
        failures
            .iter()
            .map(|(seq, f)| (*seq, f.attempt, f.source.clone()))
            .collect::<Vec<_>>(),
        vec![(1, 1, loops::FailureSource::Interrupted)]
    );
    second.shutdown().await;
    serving.await.unwrap().unwrap();
}

/// A drained worker lets its run go when the state it is in has committed its transition,
/// and gives the lease back: another worker takes the run at its next poll, long before the
/// lease (60 s) would lapse, runs nothing the first recorded, and counts no interruption.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_worker_hands_its_run_to_another_at_the_state_boundary() {
    let schema = common::TestSchema::new("r_drain").await;
    let ttl = Duration::from_secs(60);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let slow = Arc::new(Agent {
        work_gate: Some(Arc::clone(&gate)),
        ..Agent::default()
    });
    let first = Runtime::builder()
        .register::<Job, _>(slow.clone())
        .build(schema.store(ttl).await);
    first.start("m", Job::Start { n: 0 }).await.unwrap();
    for _ in 0..500 {
        if !first.store().steps("m", 1).await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Inside `Work`, after its step: the drain lets `Work` finish (`join!` polls the drain
    // first, so it has begun when the gate opens) and stops at `Approve`.
    let (drained, ()) = tokio::join!(first.drain(Duration::from_secs(30)), async {
        gate.add_permits(1);
    });
    assert_eq!((drained.handed_over, drained.cut), (1, 0));
    let info = first.run_info("m").await.unwrap().unwrap();
    assert_eq!(
        (info.state.as_str(), info.seq, info.attempt, info.status),
        ("Approve", 2, 0, RunStatus::Running)
    );

    let agent = Arc::new(Agent::default());
    let second = Runtime::builder()
        .register::<Job, _>(agent.clone())
        .build(schema.store(ttl).await);
    let serving = {
        let second = second.clone();
        tokio::spawn(async move { second.serve(Duration::from_millis(50)).await })
    };
    until_status(&second, "m", RunStatus::Waiting).await;
    second.send("m", "approval", "fin").await.unwrap();
    assert_eq!(
        second.wait::<Job>("m").await.unwrap(),
        Job::Done {
            acc: 0,
            by: "fin".into()
        }
    );
    assert_eq!(slow.calls(), [("Start", 0, 1), ("Work", 1, 1)]);
    assert_eq!(slow.effects.load(Ordering::SeqCst), 1);
    assert_eq!(agent.effects.load(Ordering::SeqCst), 0);
    assert_eq!(agent.calls(), [("Approve", 2, 1), ("Approve", 2, 1)]);
    assert_eq!(second.store().failures("m").await.unwrap(), vec![]);
    second.shutdown().await;
    serving.await.unwrap().unwrap();
}

/// A worker of `Job` with `agent` on `schema` that polls only every 20 s (a minute's lease,
/// twice the time `until_status` waits): a run it takes up in time, it took woken.
async fn slow_polling_worker(
    schema: &common::TestSchema,
    agent: &Arc<Agent>,
) -> (Runtime, tokio::task::JoinHandle<loops::Result<()>>) {
    let worker = Runtime::builder()
        .register::<Job, _>(agent.clone())
        .build(schema.store(Duration::from_secs(60)).await);
    let serving = {
        let worker = worker.clone();
        tokio::spawn(async move { worker.serve(Duration::from_secs(60)).await })
    };
    (worker, serving)
}

/// Eight front ends queue one run id at the same moment: the worker woken by the creation
/// takes it at once. (The creations that lose only read the new run's row: a lock held while
/// they were refused made the woken claim pass the run by, leaving it to the next poll.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_queued_by_several_front_ends_at_once_is_taken_up_at_once() {
    let schema = common::TestSchema::new("r_queue_many").await;
    let agent = Arc::new(Agent::default());
    let (worker, serving) = slow_polling_worker(&schema, &agent).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut fronts = Vec::new();
    for _ in 0..8 {
        fronts.push(Runtime::builder().build(schema.store(TTL).await));
    }
    let go = Arc::new(tokio::sync::Barrier::new(fronts.len()));
    let queuing: Vec<_> = fronts
        .into_iter()
        .map(|front| {
            let go = go.clone();
            tokio::spawn(async move {
                go.wait().await;
                front
                    .enqueue("c", Job::Start { n: 0 }, loops::StartOptions::default())
                    .await
            })
        })
        .collect();
    for queuing in queuing {
        // The run, as created or as read back (a worker may have driven it on by then).
        assert_eq!(queuing.await.unwrap().unwrap().run_id, "c");
    }
    until_status(&worker, "c", RunStatus::Waiting).await;
    assert_eq!(agent.calls()[..2], [("Start", 0, 1), ("Work", 1, 1)]);
    assert_eq!(worker.store().history("c").await.unwrap().len(), 3);
    worker.shutdown().await;
    serving.await.unwrap().unwrap();
}

/// A front end that registers no workflow queues a run; a worker that polls only every
/// minute takes it up at once, woken by the queuing commit's notification, and begins its
/// first attempt without counting an interruption.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_queued_by_a_front_end_is_taken_up_by_a_worker_at_once() {
    let schema = common::TestSchema::new("r_queue").await;
    let agent = Arc::new(Agent::default());
    let (worker, serving) = slow_polling_worker(&schema, &agent).await;
    // The worker's first resume is over (it found nothing) before the run is queued.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let front = Runtime::builder().build(schema.store(TTL).await);
    let queued = front
        .enqueue("q", Job::Start { n: 0 }, loops::StartOptions::default())
        .await
        .unwrap();
    assert_eq!((queued.status, queued.attempt), (RunStatus::Running, 0));
    until_status(&worker, "q", RunStatus::Waiting).await;
    front.send("q", "approval", "front").await.unwrap();
    assert_eq!(
        worker.wait::<Job>("q").await.unwrap(),
        Job::Done {
            acc: 0,
            by: "front".into()
        }
    );
    assert_eq!(agent.calls()[..2], [("Start", 0, 1), ("Work", 1, 1)]);
    assert_eq!(worker.store().failures("q").await.unwrap(), vec![]);
    worker.shutdown().await;
    serving.await.unwrap().unwrap();
}
