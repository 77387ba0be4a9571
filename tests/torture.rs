//! Crash torture: a child process (this test binary, re-run as `torture_child`) drives dozens of
//! runs of three workflows at once and is SIGKILLed at random moments, again and again, until
//! every run has ended. After every kill the parent reads the store and an outside ledger and
//! checks that nothing committed was lost and that no recorded step ran again; at the end it
//! compares every run with a reference run made without kills.
//!
//! The workload, per generation of 48 runs (`plan`):
//! - `torture_pipeline` (16 runs, driven by `Runtime::run` from spawned tasks): journaled steps
//!   in a loop, a short durable sleep that waits in place, a receipt made of an idempotency key;
//! - `torture_fix` (16 runs, registered, driven in the background): a fix loop of edit and test
//!   rounds; a test step that fails on its first attempt; a state that fails three attempts and
//!   is retried by the parent (`Runtime::retry`); a state that always fails (the run ends failed);
//! - `torture_approval` (16 runs, registered): waits for events the parent sends between
//!   restarts, a parked sleep woken by the timer, a wait that times out; a quarter of the runs are
//!   cancelled by the parent while they wait.
//!
//! The parent starts a new generation whenever the current one has ended, until it has killed
//! the child `LOOPS_TORTURE_KILLS` times (200 by default); the last generation then runs to its
//! end without kills. Each kill comes a seeded random 0–150 ms after the child opened its store,
//! or, one time in four, after the child started (so that some land while it opens and repairs
//! the store).
//!
//! Every side effect of a step appends one line to `ledger/<run id>` (outside the store) with
//! the step's idempotency key, its sequence number, name and occurrence; every handler entry and
//! every step the runtime acknowledged append one too. What is checked after every child
//! process, for every run of the current generation (and of all generations every 25th time and
//! at the end; the earlier ones have all ended):
//! - every transition seen before is still there with the same payload and time; sequence
//!   numbers have no gap, start at 0 with the planned initial state, follow the workflow's
//!   transition table and only grow; an ended run does not change (unless the parent retried it);
//! - every step record seen before is still there, unchanged; every step the runtime
//!   acknowledged to a handler is in the store; every handler entry's state is committed;
//! - no handler runs for a state whose successor had been seen committed;
//! - a step's side effect runs again only in a later process than the one that ran it, that
//!   process was killed, and the step's record had not been seen committed before the later
//!   process started; both executions carry the same idempotency key; every step record has
//!   its effect in the ledger, with the same value;
//! - every event sent is kept; each delivered event went to exactly one wait.
//!
//! At the end, each run's status, state, history, step outputs, events and the side effects a
//! deduplicating consumer applies (first line per idempotency key) equal the reference run's.
//!
//! Fast mode is part of `cargo test`. Long mode (for releases):
//! `LOOPS_TORTURE_KILLS=10000 cargo test --release --test torture -- --ignored torture_long --nocapture`.
//! Replay a seed with `LOOPS_TORTURE_SEED=<seed>` (the kill delays and the parent's choices
//! repeat; the child's scheduling does not).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use loops::{
    Context, Error, RedbStore, RetryPolicy, RunInfo, RunStatus, Runtime, Schema, StateId, Workflow,
};
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------------
// The workflows.

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "torture_pipeline")]
enum Pipeline {
    #[initial]
    #[next(Fetched)]
    Queued { job: u64, chunks: u32 },
    #[next(Transformed)]
    Fetched { job: u64, parts: Vec<u64> },
    #[next(Stored)]
    Transformed { job: u64, sum: u64 },
    #[terminal]
    Stored { job: u64, sum: u64, receipt: String },
}

/// What a fix run works on, and how its handlers behave (so that they depend on nothing else).
#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Ticket {
    number: u64,
    /// Test rounds until the tests pass.
    rounds: u32,
    /// The test step fails on the first attempt of each round.
    flaky: bool,
    /// `Tested` fails its first three attempts once the tests pass: the run fails, and passes
    /// after the parent retries it.
    stubborn: bool,
    /// `Tested` always fails: the run ends failed.
    hopeless: bool,
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "torture_fix")]
enum Fix {
    #[initial]
    #[next(Edited)]
    Received { ticket: Ticket },
    #[next(Tested)]
    Edited {
        ticket: Ticket,
        round: u32,
        commit: String,
    },
    #[next(Edited, Merged)]
    Tested {
        ticket: Ticket,
        round: u32,
        passed: bool,
    },
    #[terminal]
    Merged { ticket: Ticket, pr: String },
}

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "torture_approval")]
enum Approval {
    #[initial]
    #[next(Reviewing)]
    Requested { doc: u64, needed: u32 },
    #[next(Reviewing, Cooling)]
    Reviewing {
        doc: u64,
        needed: u32,
        approvals: Vec<String>,
    },
    #[next(Published)]
    Cooling { doc: u64, approvals: Vec<String> },
    #[terminal]
    Published {
        doc: u64,
        approvals: Vec<String>,
        nudged: bool,
        url: String,
    },
}

// ---------------------------------------------------------------------------------------------
// The plan: which runs exist and how each ends.

const PER_KIND: u32 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pipeline,
    Fix,
    Approval,
}

#[derive(Debug, Clone)]
struct Planned {
    id: String,
    gen_: u32,
    k: u32,
    kind: Kind,
}

fn plan(gen_: u32) -> Vec<Planned> {
    (0..PER_KIND * 3)
        .map(|i| {
            let k = i / 3;
            let (kind, tag) = match i % 3 {
                0 => (Kind::Pipeline, "pipe"),
                1 => (Kind::Fix, "fix"),
                _ => (Kind::Approval, "appr"),
            };
            Planned {
                id: format!("g{gen_}-{tag}-{k:02}"),
                gen_,
                k,
                kind,
            }
        })
        .collect()
}

impl Planned {
    fn number(&self) -> u64 {
        u64::from(self.gen_) * 1000 + u64::from(self.k)
    }

    fn pipeline(&self) -> Pipeline {
        Pipeline::Queued {
            job: self.number(),
            chunks: 2 + self.k % 4,
        }
    }

    fn fix(&self) -> Fix {
        Fix::Received {
            ticket: Ticket {
                number: self.number(),
                rounds: 1 + self.k % 3,
                flaky: self.k.is_multiple_of(2),
                stubborn: self.k % 4 == 1,
                hopeless: self.hopeless(),
            },
        }
    }

    fn approval(&self) -> Approval {
        Approval::Requested {
            doc: self.number(),
            needed: self.needed(),
        }
    }

    fn hopeless(&self) -> bool {
        self.kind == Kind::Fix && self.k % 8 == 7
    }

    fn cancelled(&self) -> bool {
        self.kind == Kind::Approval && self.k % 4 == 3
    }

    fn needed(&self) -> u32 {
        1 + self.k % 3
    }

    fn initial_json(&self) -> String {
        match self.kind {
            Kind::Pipeline => serde_json::to_string(&self.pipeline()),
            Kind::Fix => serde_json::to_string(&self.fix()),
            Kind::Approval => serde_json::to_string(&self.approval()),
        }
        .unwrap()
    }

    /// Whether the run has reached the end the plan gives it.
    fn done(&self, info: &RunInfo) -> bool {
        let want = if self.hopeless() {
            RunStatus::Failed
        } else if self.cancelled() {
            RunStatus::Cancelled
        } else {
            RunStatus::Completed
        };
        info.status == want
    }

    /// Decodes every record as this run's workflow and checks each move against its table.
    fn check_moves(&self, payloads: &[&str]) -> Result<(), String> {
        match self.kind {
            Kind::Pipeline => check_moves::<Pipeline>(payloads),
            Kind::Fix => check_moves::<Fix>(payloads),
            Kind::Approval => check_moves::<Approval>(payloads),
        }
    }
}

fn check_moves<W: Workflow>(payloads: &[&str]) -> Result<(), String> {
    let mut prev: Option<W::State> = None;
    for (seq, payload) in payloads.iter().enumerate() {
        let value: W = serde_json::from_str(payload)
            .map_err(|e| format!("record {seq} does not decode: {e}"))?;
        let state = value.state();
        if let Some(prev) = prev
            && !prev.can_move_to(state)
        {
            return Err(format!("illegal move {prev} -> {state} at seq {seq}"));
        }
        prev = Some(state);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The handlers, and the ledger they write outside the store.

/// Appends lines to `ledger/<run id>`, one `write(2)` per line. No fsync: a SIGKILL loses
/// nothing the process wrote, only an OS crash would.
struct Ledger {
    dir: PathBuf,
    /// Which child process this is, from 0.
    inc: u32,
}

impl Ledger {
    fn append(&self, run_id: &str, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(run_id))
            .expect("open the ledger");
        f.write_all(format!("{line}\n").as_bytes())
            .expect("append to the ledger");
    }

    /// `E inc seq state attempt`: a handler was entered.
    fn entered(&self, ctx: &Context) {
        self.append(
            ctx.run_id(),
            &format!(
                "E {} {} {} {}",
                self.inc,
                ctx.seq(),
                ctx.state(),
                ctx.attempt()
            ),
        );
    }

    /// A journaled step whose closure makes a side effect: `X inc seq name occ key value`
    /// when it runs, `A inc seq name occ key` once the runtime returned its (recorded) output.
    /// With `fail`, the closure fails before its effect.
    async fn effect(
        &self,
        ctx: &Context,
        name: &str,
        occ: u32,
        value: String,
        fail: bool,
    ) -> anyhow::Result<Effect> {
        let key = ctx.idempotency_key(name)?;
        let run_id = ctx.run_id().to_owned();
        let seq = ctx.seq();
        let output: String = ctx
            .step(name, || async {
                if fail {
                    return Err(format!("{name} fails on attempt {}", ctx.attempt()).into());
                }
                self.append(
                    &run_id,
                    &format!("X {} {seq} {name} {occ} {key} {value}", self.inc),
                );
                // Widens the window between the effect and its record.
                tokio::time::sleep(Duration::from_millis(1)).await;
                Ok(value.clone())
            })
            .await?;
        self.append(&run_id, &format!("A {} {seq} {name} {occ} {key}", self.inc));
        Ok(Effect { key, output })
    }
}

struct Effect {
    key: String,
    output: String,
}

#[derive(Clone)]
struct Agent {
    ledger: Arc<Ledger>,
}

/// A deterministic part of a pipeline's input.
fn part(job: u64, i: u32) -> u64 {
    (job.wrapping_mul(6_364_136_223_846_793_005)
        ^ u64::from(i).wrapping_mul(1_442_695_040_888_963_407))
        % 1_000_003
}

impl PipelineHandler for Agent {
    type Error = anyhow::Error;

    async fn queued(&self, ctx: &Context, job: u64, chunks: u32) -> anyhow::Result<QueuedNext> {
        self.ledger.entered(ctx);
        let mut parts = Vec::new();
        for i in 0..chunks {
            let out = self
                .ledger
                .effect(ctx, "fetch", i, part(job, i).to_string(), false)
                .await?;
            parts.push(out.output.parse()?);
        }
        Ok(QueuedNext::Fetched { job, parts })
    }

    async fn fetched(
        &self,
        ctx: &Context,
        job: u64,
        parts: Vec<u64>,
    ) -> anyhow::Result<FetchedNext> {
        self.ledger.entered(ctx);
        // Below the park threshold: a recorded sleep that waits in place.
        ctx.sleep(Duration::from_millis(15)).await?;
        let sum: u64 = parts.iter().sum();
        let out = self
            .ledger
            .effect(ctx, "transform", 0, sum.to_string(), false)
            .await?;
        Ok(FetchedNext::Transformed {
            job,
            sum: out.output.parse()?,
        })
    }

    async fn transformed(
        &self,
        ctx: &Context,
        job: u64,
        sum: u64,
    ) -> anyhow::Result<TransformedNext> {
        self.ledger.entered(ctx);
        let out = self
            .ledger
            .effect(ctx, "store", 0, format!("stored-{job}-{sum}"), false)
            .await?;
        Ok(TransformedNext::Stored {
            job,
            sum,
            receipt: out.key,
        })
    }
}

impl FixHandler for Agent {
    type Error = anyhow::Error;

    async fn received(&self, ctx: &Context, ticket: Ticket) -> anyhow::Result<ReceivedNext> {
        self.ledger.entered(ctx);
        let commit = self
            .ledger
            .effect(ctx, "edit", 0, format!("c{}-1", ticket.number), false)
            .await?
            .output;
        Ok(ReceivedNext::Edited {
            ticket,
            round: 1,
            commit,
        })
    }

    async fn edited(
        &self,
        ctx: &Context,
        ticket: Ticket,
        round: u32,
        _commit: String,
    ) -> anyhow::Result<EditedNext> {
        self.ledger.entered(ctx);
        let fail = ticket.flaky && ctx.attempt() == 1;
        let passed = round >= ticket.rounds;
        let out = self
            .ledger
            .effect(ctx, "test", 0, passed.to_string(), fail)
            .await?;
        Ok(EditedNext::Tested {
            ticket,
            round,
            passed: out.output == "true",
        })
    }

    async fn tested(
        &self,
        ctx: &Context,
        ticket: Ticket,
        round: u32,
        passed: bool,
    ) -> anyhow::Result<TestedNext> {
        self.ledger.entered(ctx);
        if ticket.hopeless {
            anyhow::bail!("the reviewer refuses ticket {}", ticket.number);
        }
        if !passed {
            let commit = self
                .ledger
                .effect(
                    ctx,
                    "edit",
                    0,
                    format!("c{}-{}", ticket.number, round + 1),
                    false,
                )
                .await?
                .output;
            return Ok(TestedNext::Edited {
                ticket,
                round: round + 1,
                commit,
            });
        }
        if ticket.stubborn && ctx.attempt() <= 3 {
            anyhow::bail!("CI is red on attempt {}", ctx.attempt());
        }
        let pr = self
            .ledger
            .effect(ctx, "open_pr", 0, format!("pr-{}", ticket.number), false)
            .await?
            .key;
        Ok(TestedNext::Merged { ticket, pr })
    }
}

impl ApprovalHandler for Agent {
    type Error = anyhow::Error;

    async fn requested(
        &self,
        ctx: &Context,
        doc: u64,
        needed: u32,
    ) -> anyhow::Result<RequestedNext> {
        self.ledger.entered(ctx);
        self.ledger
            .effect(ctx, "register", 0, format!("doc-{doc}"), false)
            .await?;
        Ok(RequestedNext::Reviewing {
            doc,
            needed,
            approvals: Vec::new(),
        })
    }

    async fn reviewing(
        &self,
        ctx: &Context,
        doc: u64,
        needed: u32,
        mut approvals: Vec<String>,
    ) -> anyhow::Result<ReviewingNext> {
        self.ledger.entered(ctx);
        let who: String = ctx.wait_for("approve").await?;
        self.ledger
            .effect(ctx, "notify", 0, format!("{who}-approved-{doc}"), false)
            .await?;
        approvals.push(who);
        Ok(if approvals.len() as u32 >= needed {
            ReviewingNext::Cooling { doc, approvals }
        } else {
            ReviewingNext::Reviewing {
                doc,
                needed,
                approvals,
            }
        })
    }

    async fn cooling(
        &self,
        ctx: &Context,
        doc: u64,
        approvals: Vec<String>,
    ) -> anyhow::Result<CoolingNext> {
        self.ledger.entered(ctx);
        // Above the park threshold: the run parks and the timer wakes it.
        ctx.sleep(Duration::from_millis(120)).await?;
        // Nobody sends `nudge`: the wait always times out.
        let nudge: Option<String> = ctx
            .wait_for_timeout("nudge", Duration::from_millis(40))
            .await?;
        let url = self
            .ledger
            .effect(ctx, "publish", 0, format!("published-{doc}"), false)
            .await?
            .key;
        Ok(CoolingNext::Published {
            doc,
            approvals,
            nudged: nudge.is_some(),
            url,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The child process.

/// The child: opens the store under `LOOPS_TORTURE_DIR`, resumes every unfinished run, starts
/// the planned runs of generations `LOOPS_TORTURE_GENS` (`a-b`) that do not exist yet, and
/// prints `quiet` once nothing is left that it can move without the parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the torture tests as their child process"]
async fn torture_child() {
    let Ok(dir) = std::env::var("LOOPS_TORTURE_DIR") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let gens = std::env::var("LOOPS_TORTURE_GENS").expect("LOOPS_TORTURE_GENS");
    let (a, b) = gens.split_once('-').expect("a-b");
    let (a, b): (u32, u32) = (a.parse().unwrap(), b.parse().unwrap());
    let inc: u32 = std::env::var("LOOPS_TORTURE_INC")
        .expect("LOOPS_TORTURE_INC")
        .parse()
        .unwrap();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("error"))
        .with_writer(std::io::stderr)
        .try_init();

    let agent = Agent {
        ledger: Arc::new(Ledger {
            dir: dir.join("ledger"),
            inc,
        }),
    };
    let fast = |attempts| {
        RetryPolicy::attempts(attempts)
            .with_delays(Duration::from_millis(1), Duration::from_millis(4))
    };
    let runtime = Runtime::builder()
        // Kills count as interrupted attempts: give every state room for them (the default
        // `max_interruptions` of 10 is reached under load, when kills come often) ...
        .retry(fast(100_000).with_max_interruptions(100_000))
        // ... but this one, so that kills, as well as the stubborn and hopeless runs, make
        // runs fail, for the parent to retry.
        .state_retry(FixState::Tested, fast(3))
        .park_threshold(Duration::from_millis(50))
        .register::<Fix, _>(agent.clone())
        .register::<Approval, _>(agent.clone())
        .open(dir.join("store.redb"))
        .expect("open the store");
    println!("opened");
    runtime.resume_all().await.expect("resume_all");

    let planned: Vec<Planned> = (a..=b).flat_map(plan).collect();
    let mut pipelines = tokio::task::JoinSet::new();
    for batch in planned.chunks(8) {
        for p in batch {
            match p.kind {
                Kind::Pipeline => {
                    let (rt, agent, p) = (runtime.clone(), agent.clone(), p.clone());
                    pipelines.spawn(async move {
                        let end = rt.run(&p.id, p.pipeline(), &agent).await;
                        (p.id, end)
                    });
                }
                Kind::Fix | Kind::Approval => {
                    if runtime.run_info(&p.id).await.expect("run_info").is_some() {
                        continue;
                    }
                    let started = match p.kind {
                        Kind::Fix => runtime.start(&p.id, p.fix()).await,
                        _ => runtime.start(&p.id, p.approval()).await,
                    };
                    if let Err(e) = started {
                        panic!("start {}: {e}", p.id);
                    }
                }
            }
        }
        // Staggered, so that kills also land among the creations.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }

    loop {
        while let Some(joined) = pipelines.try_join_next() {
            let (id, end) = joined.expect("a pipeline task");
            match end {
                Ok(Pipeline::Stored { .. }) => {}
                other => panic!("pipeline {id} ended with {other:?}"),
            }
        }
        if pipelines.is_empty() && planned.iter().all(|p| quiet(&runtime, p)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // `wait` returns at once for every ended background run, with what its status says.
    for p in planned.iter().filter(|p| p.kind != Kind::Pipeline) {
        let info = runtime.run_info(&p.id).await.unwrap().unwrap();
        if !info.status.is_ended() {
            continue;
        }
        let ended = match p.kind {
            Kind::Fix => runtime.wait::<Fix>(&p.id).await.map(drop),
            _ => runtime.wait::<Approval>(&p.id).await.map(drop),
        };
        match (info.status, ended) {
            (RunStatus::Completed, Ok(()))
            | (RunStatus::Failed, Err(Error::RunFailed { .. }))
            | (RunStatus::Cancelled, Err(Error::RunCancelled { .. })) => {}
            (status, other) => panic!("{}: {status}, but wait returned {other:?}", p.id),
        }
    }
    println!("quiet");
}

/// Whether the child can do nothing more for the run: it has ended, or it waits for an event
/// that only the parent sends.
fn quiet(runtime: &Runtime, p: &Planned) -> bool {
    let store = runtime.redb().expect("the torture runs on redb");
    let Some(info) = store.run(&p.id).expect("run_info") else {
        return p.kind == Kind::Pipeline;
    };
    match info.status {
        RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled => true,
        RunStatus::Running | RunStatus::Blocked => false,
        RunStatus::Waiting => match &info.wait {
            Some(wait) if wait.until_ms.is_none() => match &wait.event {
                Some(event) => !store.has_pending(&p.id, event).expect("inbox"),
                None => false,
            },
            _ => false,
        },
    }
}

// ---------------------------------------------------------------------------------------------
// The parent: observations and their checks.

/// A transition record as first seen.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    seq: u64,
    state: String,
    payload: String,
    at_ms: u64,
    schema: String,
}

/// A step record's key: (seq, name, occurrence).
type StepKey = (u64, String, u32);

/// A step record as first seen, and the check that first saw it.
#[derive(Debug, Clone, PartialEq)]
struct StepSeen {
    attempt: u32,
    at_ms: u64,
    output: String,
}

#[derive(Debug, Clone, PartialEq)]
struct EventSeen {
    name: String,
    key: Option<String>,
    at_ms: u64,
    payload: String,
}

/// One line of a run's ledger.
#[derive(Debug, Clone, PartialEq)]
enum Line {
    Entered {
        inc: u32,
        seq: u64,
        state: String,
    },
    Effect {
        inc: u32,
        step: StepKey,
        key: String,
        value: String,
    },
    Acked {
        inc: u32,
        step: StepKey,
        key: String,
    },
}

fn parse_line(line: &str) -> Option<Line> {
    let mut f = line.splitn(7, ' ');
    let tag = f.next()?;
    let inc = f.next()?.parse().ok()?;
    let seq = f.next()?.parse().ok()?;
    match tag {
        "E" => Some(Line::Entered {
            inc,
            seq,
            state: f.next()?.to_owned(),
        }),
        "X" | "A" => {
            let name = f.next()?.to_owned();
            let occ = f.next()?.parse().ok()?;
            let key = f.next()?.to_owned();
            if tag == "X" {
                Some(Line::Effect {
                    inc,
                    step: (seq, name, occ),
                    key,
                    value: f.next()?.to_owned(),
                })
            } else {
                Some(Line::Acked {
                    inc,
                    step: (seq, name, occ),
                    key,
                })
            }
        }
        _ => None,
    }
}

/// An executed side effect: which process ran it, its key and value.
#[derive(Debug, Clone)]
struct Executed {
    inc: u32,
    key: String,
    value: String,
}

/// What the parent knows of one run.
struct RunObs {
    plan: Planned,
    info: Option<RunInfo>,
    history: Vec<Seen>,
    /// `moved_past[seq]`: the check that first saw the record `seq + 1`.
    moved_past: Vec<usize>,
    /// Step records, with the check that first saw each.
    steps: BTreeMap<StepKey, (StepSeen, usize)>,
    events: Vec<(u64, EventSeen)>,
    /// Events the parent sent: (event seq, key); each must stay in the inbox.
    sent: Vec<(u64, String)>,
    cancelled_by_parent: bool,
    retried: bool,
    /// Bytes of the ledger file read so far.
    ledger_read: u64,
    effects: BTreeMap<StepKey, Vec<Executed>>,
    /// Ended and fully checked: later checks are cheap until something changes.
    settled: bool,
}

#[derive(Debug, Default, Clone)]
struct Stats {
    kills: u64,
    kills_before_open: u64,
    restarts: u64,
    quiet_exits: u64,
    grace_runs: u64,
    checks: u64,
    check_recoveries: u64,
    parent_opens: u64,
    transitions_checked: u64,
    steps_checked: u64,
    effects_executed: u64,
    effects_repeated: u64,
    entries: u64,
    events_sent: u64,
    cancels: u64,
    retries: u64,
    torn_lines: u64,
}

struct Harness {
    dir: PathBuf,
    runs: BTreeMap<String, RunObs>,
    gens: u32,
    /// Per child process: whether it exited by itself (it was not killed).
    clean: Vec<bool>,
    stats: Stats,
    /// The check running now (= the child process it follows).
    check: usize,
}

/// When to SIGKILL a child: `delay` after it started, or after it opened the store.
#[derive(Debug, Clone, Copy)]
struct Kill {
    delay: Duration,
    after_open: bool,
}

/// How a child process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Killed,
    Quiet,
}

type Checked<T = ()> = Result<T, String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

impl Harness {
    fn new(dir: &Path) -> Self {
        std::fs::create_dir_all(dir.join("ledger")).unwrap();
        Harness {
            dir: dir.to_path_buf(),
            runs: BTreeMap::new(),
            gens: 0,
            clean: Vec::new(),
            stats: Stats::default(),
            check: 0,
        }
    }

    fn store_path(&self) -> PathBuf {
        self.dir.join("store.redb")
    }

    fn add_gen(&mut self, gen_: u32) {
        for p in plan(gen_) {
            self.runs.insert(
                p.id.clone(),
                RunObs {
                    plan: p,
                    info: None,
                    history: Vec::new(),
                    moved_past: Vec::new(),
                    steps: BTreeMap::new(),
                    events: Vec::new(),
                    sent: Vec::new(),
                    cancelled_by_parent: false,
                    retried: false,
                    ledger_read: 0,
                    effects: BTreeMap::new(),
                    settled: false,
                },
            );
        }
        self.gens = self.gens.max(gen_ + 1);
    }

    /// Runs one child process for generations `gens` and SIGKILLs it as `kill` says, unless it
    /// went quiet first (without `kill`, waits until it is quiet).
    fn incarnation(&mut self, gens: (u32, u32), kill: Option<Kill>) -> End {
        let inc = self.clean.len() as u32;
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("child-stderr.log"))
            .unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "torture_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("LOOPS_TORTURE_DIR", &self.dir)
            .env("LOOPS_TORTURE_GENS", format!("{}-{}", gens.0, gens.1))
            .env("LOOPS_TORTURE_INC", inc.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .unwrap();
        self.stats.restarts += 1;
        let started = Instant::now();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (mut opened, mut quiet) = (None, false);
        let patience = Duration::from_secs(120);
        let end = loop {
            let now = started.elapsed();
            let due = kill.and_then(|k| match k.after_open {
                true => opened.map(|at| at + k.delay),
                false => Some(k.delay),
            });
            if let Some(due) = due
                && !quiet
                && now >= due
                && child.try_wait().unwrap().is_none()
            {
                child.kill().unwrap();
                child.wait().unwrap();
                self.stats.kills += 1;
                if opened.is_none() {
                    self.stats.kills_before_open += 1;
                }
                break End::Killed;
            }
            if now >= patience {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "child {inc} did not go quiet within {patience:?}\n{}",
                    self.stderr_tail()
                );
            }
            let wait = due
                .map_or(patience, |due| due.saturating_sub(now))
                .min(Duration::from_millis(50))
                .max(Duration::from_millis(1));
            match rx.recv_timeout(wait) {
                Ok(line) => {
                    if opened.is_none() && line.contains("opened") {
                        opened = Some(started.elapsed());
                    }
                    quiet |= line.contains("quiet");
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().unwrap();
                    assert!(
                        status.success() && quiet,
                        "child {inc} exited with {status:?} (quiet: {quiet})\n{}",
                        self.stderr_tail()
                    );
                    self.stats.quiet_exits += 1;
                    break End::Quiet;
                }
            }
        };
        self.clean.push(end == End::Quiet);
        end
    }

    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("child-stderr.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Opens the store as the last child left it: read-only, or, if it needs the repair of a
    /// writable open, a copy of it opened writable (so that the next child repairs the file
    /// itself, and kills land in that repair too). `None` if no store was created yet.
    fn open_for_check(&mut self) -> Option<RedbStore> {
        let path = self.store_path();
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if len == 0 {
            return None;
        }
        match RedbStore::open_read_only(&path) {
            Ok(store) => Some(store),
            Err(Error::NeedsRecovery { .. }) => {
                self.stats.check_recoveries += 1;
                let copy = self.dir.join("check.redb");
                let _ = std::fs::remove_file(&copy);
                std::fs::copy(&path, &copy).unwrap();
                Some(RedbStore::open(&copy).unwrap_or_else(|e| {
                    panic!(
                        "check {}: the store does not open after a kill: {e}",
                        self.check
                    )
                }))
            }
            Err(e) => panic!(
                "check {}: the store does not open after a kill: {e}",
                self.check
            ),
        }
    }

    /// Checks every run against what was seen before, after child process `self.clean.len() - 1`.
    /// Checks the runs of the current generation, and every 25th time (and with `all`) those
    /// of the earlier ones too, which have all ended: checking them every time would make the
    /// long mode quadratic in its kills.
    fn check_all(&mut self, all: bool) {
        self.check = self.clean.len() - 1;
        self.stats.checks += 1;
        let store = self.open_for_check();
        let all = all || self.check.is_multiple_of(25);
        let current = self.gens.saturating_sub(1);
        let ids: Vec<String> = self
            .runs
            .values()
            .filter(|r| all || r.plan.gen_ >= current)
            .map(|r| r.plan.id.clone())
            .collect();
        let mut failures = Vec::new();
        for id in ids {
            if let Err(e) = self.check_run(store.as_ref(), &id) {
                failures.push(format!("{id}: {e}"));
            }
        }
        assert!(
            failures.is_empty(),
            "check {} found {} violations:\n{}",
            self.check,
            failures.len(),
            failures.join("\n")
        );
    }

    fn check_run(&mut self, store: Option<&RedbStore>, id: &str) -> Checked {
        let c = self.check;
        let ledger_path = self.dir.join("ledger").join(id);
        let obs = self.runs.get_mut(id).unwrap();
        let stats = &mut self.stats;
        let info = match store {
            Some(store) => store.run(id).map_err(|e| e.to_string())?,
            None => None,
        };
        let Some(info) = info else {
            ensure!(obs.info.is_none(), "the run was seen before and is gone");
            let ledger_len = std::fs::metadata(&ledger_path).map_or(0, |m| m.len());
            ensure!(
                ledger_len == 0,
                "the run does not exist, but a handler ran for it"
            );
            return Ok(());
        };
        let store = store.unwrap();
        if obs.settled && !obs.retried && obs.info.as_ref() == Some(&info) {
            return obs.check_settled(store, &ledger_path, stats);
        }
        obs.check_row(&info)?;
        obs.check_transitions(store, &info, c, stats)?;
        obs.check_steps(store, &info, c, stats)?;
        obs.check_events(store)?;
        obs.check_ledger(&ledger_path, &self.clean, stats)?;
        obs.check_effects_of_records()?;
        obs.settled = info.status.is_ended();
        obs.retried = false;
        obs.info = Some(info);
        Ok(())
    }

    fn gen_done(&self, gen_: u32) -> bool {
        self.runs
            .values()
            .filter(|r| r.plan.gen_ == gen_)
            .all(|r| r.info.as_ref().is_some_and(|i| r.plan.done(i)))
    }

    /// What the parent does between two child processes: sends approvals (the next one per
    /// run, or all of them), cancels the runs planned to be cancelled once they wait in
    /// `Reviewing`, and retries failed fix runs that are not hopeless.
    fn act(&mut self, gen_: u32, all_events: bool) {
        self.stats.parent_opens += 1;
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let runtime = Runtime::open(self.store_path()).expect("the parent opens the store");
        tokio.block_on(async {
            for obs in self.runs.values_mut().filter(|r| r.plan.gen_ == gen_) {
                let p = &obs.plan;
                let Some(info) = runtime.run_info(&p.id).await.unwrap() else {
                    continue;
                };
                match p.kind {
                    // Cancelled once it waits for its first approval (which never comes), so
                    // that where it ends does not depend on timing.
                    Kind::Approval
                        if p.cancelled() && info.status == RunStatus::Waiting && info.seq == 1 =>
                    {
                        runtime.cancel(&p.id, "withdrawn").await.unwrap();
                        obs.cancelled_by_parent = true;
                        self.stats.cancels += 1;
                    }
                    Kind::Approval if p.cancelled() => {}
                    Kind::Approval if !info.status.is_ended() => {
                        let batch = if all_events { p.needed() } else { 1 };
                        for _ in 0..batch {
                            let j = obs.sent.len() as u32;
                            if j >= p.needed() {
                                break;
                            }
                            let key = format!("approve-{j}");
                            let sent = runtime
                                .send_with_key(&p.id, "approve", &key, &format!("reviewer{j}"))
                                .await
                                .unwrap();
                            assert!(!sent.duplicate, "{}: {key} sent twice", p.id);
                            obs.sent.push((sent.event_seq, key));
                            self.stats.events_sent += 1;
                        }
                    }
                    Kind::Fix if info.status == RunStatus::Failed && !p.hopeless() => {
                        runtime.retry(&p.id).await.unwrap();
                        obs.retried = true;
                        self.stats.retries += 1;
                    }
                    _ => {}
                }
            }
        });
    }

    /// What the run ended as, to compare with the reference run.
    fn summary(&self, id: &str) -> Summary {
        let obs = &self.runs[id];
        let info = obs.info.as_ref().unwrap();
        // A deduplicating consumer applies the first execution of each key.
        let mut applied = BTreeMap::new();
        let mut keys = BTreeSet::new();
        for (step, runs) in &obs.effects {
            for r in runs {
                if keys.insert(r.key.clone()) {
                    applied.insert(step.clone(), (r.key.clone(), r.value.clone()));
                }
            }
        }
        Summary {
            status: info.status,
            state: info.state.clone(),
            seq: info.seq,
            history: obs
                .history
                .iter()
                .map(|s| (s.state.clone(), s.payload.clone()))
                .collect(),
            steps: obs
                .steps
                .iter()
                .filter(|(k, _)| !k.1.starts_with("loops:"))
                .map(|(k, (s, _))| (k.clone(), s.output.clone()))
                .collect(),
            events: obs
                .events
                .iter()
                .map(|(seq, e)| (*seq, e.name.clone(), e.key.clone(), e.payload.clone()))
                .collect(),
            applied,
        }
    }
}

/// The checks of one run, in the order `Harness::check_run` makes them.
impl RunObs {
    /// An ended run, fully checked before: its row (compared by the caller), its last record
    /// and its ledger must not change.
    fn check_settled(&self, store: &RedbStore, ledger: &Path, stats: &mut Stats) -> Checked {
        let id = &self.plan.id;
        let history = store.history(id).map_err(|e| e.to_string())?;
        ensure!(
            history.len() == self.history.len(),
            "an ended run's history changed length"
        );
        ensure!(
            seen(history.last().unwrap()) == *self.history.last().unwrap(),
            "an ended run's last record changed"
        );
        let ledger_len = std::fs::metadata(ledger).map_or(0, |m| m.len());
        ensure!(
            ledger_len == self.ledger_read,
            "a handler ran for an ended run"
        );
        stats.transitions_checked += 1;
        Ok(())
    }

    /// The run's row: its seq only grows, its identity stays, an ended run does not change
    /// unless the parent retried it, a run the parent cancelled stays cancelled.
    fn check_row(&self, info: &RunInfo) -> Checked {
        if let Some(prev) = &self.info {
            ensure!(
                info.seq >= prev.seq,
                "seq went back from {} to {}",
                prev.seq,
                info.seq
            );
            ensure!(
                (&info.workflow, info.schema, info.created_ms)
                    == (&prev.workflow, prev.schema, prev.created_ms),
                "the run's identity changed"
            );
            if prev.status.is_ended() && !self.retried {
                ensure!(*info == *prev, "an ended run changed: {prev:?} -> {info:?}");
            }
        }
        if self.cancelled_by_parent {
            ensure!(
                info.status == RunStatus::Cancelled,
                "cancelled by the parent, but {}",
                info.status
            );
        }
        Ok(())
    }

    /// Transitions: nothing lost, nothing changed, no gap, the planned start, legal moves only.
    fn check_transitions(
        &mut self,
        store: &RedbStore,
        info: &RunInfo,
        c: usize,
        stats: &mut Stats,
    ) -> Checked {
        let history = store.history(&self.plan.id).map_err(|e| e.to_string())?;
        stats.transitions_checked += history.len() as u64;
        ensure!(
            history.len() as u64 == info.seq + 1,
            "the row is at seq {} but {} records exist",
            info.seq,
            history.len()
        );
        for (i, r) in history.iter().enumerate() {
            ensure!(r.seq == i as u64, "record {i} has seq {}", r.seq);
        }
        ensure!(
            history.last().unwrap().state == info.state,
            "the row's state is not the last record's"
        );
        ensure!(
            history[0].payload.get() == self.plan.initial_json(),
            "the initial record is not the planned initial state"
        );
        ensure!(
            history.len() >= self.history.len(),
            "committed transitions lost: {} seen, {} now",
            self.history.len(),
            history.len()
        );
        for (old, new) in self.history.iter().zip(&history) {
            ensure!(
                *old == seen(new),
                "the record at seq {} changed: {old:?} -> {:?}",
                old.seq,
                seen(new)
            );
        }
        let payloads: Vec<&str> = history.iter().map(|r| r.payload.get()).collect();
        self.plan.check_moves(&payloads)?;
        for r in &history[self.history.len()..] {
            self.history.push(seen(r));
        }
        while self.moved_past.len() + 1 < self.history.len() {
            self.moved_past.push(c);
        }
        Ok(())
    }

    /// Step records: nothing lost, nothing changed; new ones are noted with this check.
    fn check_steps(
        &mut self,
        store: &RedbStore,
        info: &RunInfo,
        c: usize,
        stats: &mut Stats,
    ) -> Checked {
        let mut now = BTreeMap::new();
        for seq in 0..=info.seq {
            for (name, occ, rec) in store.steps(&self.plan.id, seq).map_err(|e| e.to_string())? {
                let step = StepSeen {
                    attempt: rec.attempt,
                    at_ms: rec.at_ms,
                    output: rec.output.get().to_owned(),
                };
                now.insert((seq, name, occ), step);
            }
        }
        stats.steps_checked += now.len() as u64;
        for (key, (old, _)) in &self.steps {
            match now.get(key) {
                Some(new) => ensure!(new == old, "step {key:?} changed: {old:?} -> {new:?}"),
                None => return Err(format!("step record {key:?} lost")),
            }
        }
        for (key, step) in now {
            self.steps.entry(key).or_insert((step, c));
        }
        Ok(())
    }

    /// Events: nothing lost or changed, every event the parent sent is there, and each
    /// delivered event was taken by exactly one wait, with its payload.
    fn check_events(&mut self, store: &RedbStore) -> Checked {
        let now: Vec<(u64, EventSeen, bool)> = store
            .events(&self.plan.id)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|(seq, r, delivered)| {
                let event = EventSeen {
                    name: r.name,
                    key: r.key,
                    at_ms: r.at_ms,
                    payload: r.payload.get().to_owned(),
                };
                (seq, event, delivered)
            })
            .collect();
        ensure!(
            now.len() >= self.events.len(),
            "events lost: {} seen, {} now",
            self.events.len(),
            now.len()
        );
        for ((old_seq, old), (seq, new, _)) in self.events.iter().zip(&now) {
            ensure!(
                (old_seq, old) == (seq, new),
                "event {old_seq} changed or lost"
            );
        }
        for (seq, key) in &self.sent {
            ensure!(
                now.iter()
                    .any(|(s, e, _)| s == seq && e.key.as_deref() == Some(key.as_str())),
                "event {seq} ({key}) sent by the parent is missing"
            );
        }
        self.events = now.iter().map(|(seq, e, _)| (*seq, e.clone())).collect();
        let mut taken = BTreeSet::new();
        for ((_, name, _), (step, _)) in &self.steps {
            if !name.starts_with("loops:wait:") {
                continue;
            }
            let outcome: serde_json::Value =
                serde_json::from_str(&step.output).map_err(|e| e.to_string())?;
            if let Some(seq) = outcome.pointer("/event/seq").and_then(|s| s.as_u64()) {
                ensure!(taken.insert(seq), "event {seq} delivered to two waits");
                let payload = outcome.pointer("/event/payload");
                let event = now.iter().find(|(s, _, _)| *s == seq);
                ensure!(
                    matches!(event, Some((_, e, true))
                        if serde_json::from_str::<serde_json::Value>(&e.payload).ok().as_ref() == payload),
                    "wait took event {seq}, which is not a delivered event with that payload"
                );
            }
        }
        for (seq, _, delivered) in &now {
            ensure!(
                !*delivered || taken.contains(seq),
                "event {seq} is marked delivered but no wait took it"
            );
        }
        Ok(())
    }

    /// The ledger's new lines. A handler entry's state is committed, and its successor had not
    /// been seen committed before the process started. A step the runtime returned is in the
    /// store. An effect runs again only in a later process, after the one that ran it was
    /// killed, before its record had been seen committed, under the same idempotency key.
    fn check_ledger(&mut self, ledger: &Path, clean: &[bool], stats: &mut Stats) -> Checked {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(ledger)
            .map_err(|e| e.to_string())?;
        f.seek(std::io::SeekFrom::Start(self.ledger_read))
            .map_err(|e| e.to_string())?;
        let mut text = String::new();
        f.read_to_string(&mut text).map_err(|e| e.to_string())?;
        let complete = text.rfind('\n').map_or(0, |i| i + 1);
        if complete < text.len() {
            // A line torn by the kill: close it, so that the next child's lines stay whole.
            stats.torn_lines += 1;
            f.write_all(b"\n").map_err(|e| e.to_string())?;
            self.ledger_read += text.len() as u64 + 1;
        } else {
            self.ledger_read += complete as u64;
        }
        for line in text[..complete].lines() {
            match parse_line(line).ok_or_else(|| format!("bad ledger line {line:?}"))? {
                Line::Entered { inc, seq, state } => {
                    stats.entries += 1;
                    ensure!(
                        self.history.get(seq as usize).map(|s| s.state.as_str()) == Some(&state),
                        "process {inc} handled {state} at seq {seq}, which is not committed"
                    );
                    if let Some(&m) = self.moved_past.get(seq as usize) {
                        ensure!(
                            inc as usize <= m,
                            "process {inc} handled seq {seq} again after check {m} saw its successor committed"
                        );
                    }
                }
                Line::Effect {
                    inc,
                    step,
                    key,
                    value,
                } => {
                    stats.effects_executed += 1;
                    if let Some((_, m)) = self.steps.get(&step) {
                        ensure!(
                            inc as usize <= *m,
                            "process {inc} ran the effect of step {step:?} again after check {m} saw its record committed"
                        );
                    }
                    let runs = self.effects.entry(step.clone()).or_default();
                    if let Some(last) = runs.last() {
                        stats.effects_repeated += 1;
                        ensure!(
                            last.inc < inc,
                            "process {inc} ran the effect of step {step:?} twice"
                        );
                        ensure!(
                            !clean[last.inc as usize],
                            "step {step:?} ran again in process {inc}, but process {} that ran it first was not killed",
                            last.inc
                        );
                        ensure!(
                            last.key == key,
                            "step {step:?} ran with another idempotency key: {} then {key}",
                            last.key
                        );
                    }
                    runs.push(Executed { inc, key, value });
                }
                Line::Acked { inc, step, key } => {
                    ensure!(
                        self.steps.contains_key(&step),
                        "process {inc} was given the output of step {step:?} ({key}), whose record is not in the store"
                    );
                }
            }
        }
        Ok(())
    }

    /// Every user step record has its effect in the ledger, with the recorded value.
    fn check_effects_of_records(&self) -> Checked {
        for (step, (rec, _)) in &self.steps {
            if step.1.starts_with("loops:") {
                continue;
            }
            let runs = self
                .effects
                .get(step)
                .map(Vec::as_slice)
                .unwrap_or_default();
            ensure!(
                !runs.is_empty(),
                "step {step:?} is recorded but its effect never ran"
            );
            let output: String = serde_json::from_str(&rec.output).map_err(|e| e.to_string())?;
            ensure!(
                runs.iter().all(|r| r.value == output),
                "step {step:?} recorded {output:?}, its effects ran with {runs:?}"
            );
        }
        Ok(())
    }
}

fn seen(r: &loops::TransitionRecord) -> Seen {
    Seen {
        seq: r.seq,
        state: r.state.clone(),
        payload: r.payload.get().to_owned(),
        at_ms: r.at_ms,
        schema: r.schema.to_string(),
    }
}

#[derive(Debug, PartialEq)]
struct Summary {
    status: RunStatus,
    state: String,
    seq: u64,
    history: Vec<(String, String)>,
    steps: BTreeMap<StepKey, String>,
    events: Vec<(u64, String, Option<String>, String)>,
    applied: BTreeMap<StepKey, (String, String)>,
}

impl Summary {
    /// The summary with its idempotency keys (`lk-` and 32 hex digits) named by their order
    /// of first appearance (`<key 0>`, ...): each run gets a random key nonce, so the
    /// reference run (in a store of its own) has other keys; a run ends as the reference did
    /// when it uses the same keys in the same places.
    fn keys_named(self) -> Summary {
        let mut names: HashMap<String, String> = HashMap::new();
        let mut named = |text: &str| {
            let mut out = String::with_capacity(text.len());
            let mut rest = text;
            while let Some(at) = rest.find("lk-") {
                let digits = &rest[at + 3..];
                let hex = digits
                    .bytes()
                    .take_while(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
                    .count();
                out.push_str(&rest[..at]);
                if hex == 32 {
                    let n = names.len();
                    let key = &rest[at..at + 35];
                    out.push_str(names.entry(key.to_owned()).or_insert(format!("<key {n}>")));
                    rest = &rest[at + 35..];
                } else {
                    out.push_str("lk-");
                    rest = digits;
                }
            }
            out.push_str(rest);
            out
        };
        let history = (self.history.iter())
            .map(|(state, payload)| (state.clone(), named(payload)))
            .collect();
        let steps = (self.steps.iter())
            .map(|(k, output)| (k.clone(), named(output)))
            .collect();
        let applied = (self.applied.iter())
            .map(|(k, (key, value))| (k.clone(), (named(key), named(value))))
            .collect();
        Summary {
            history,
            steps,
            applied,
            ..self
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The tests.

/// The same generations, without kills: what every run must end as.
fn reference(gens: u32, dir: &Path) -> Harness {
    let mut h = Harness::new(dir);
    for g in 0..gens {
        h.add_gen(g);
    }
    for round in 0.. {
        assert!(round < 20, "the reference run does not end");
        h.incarnation((0, gens - 1), None);
        h.check_all(true);
        if (0..gens).all(|g| h.gen_done(g)) {
            break;
        }
        for g in 0..gens {
            h.act(g, true);
        }
    }
    assert_eq!(
        h.stats.effects_repeated, 0,
        "without kills no effect runs twice"
    );
    h
}

fn torture(kills_wanted: u64) {
    let seed = match std::env::var("LOOPS_TORTURE_SEED") {
        Ok(s) => s.parse().expect("LOOPS_TORTURE_SEED is a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    };
    println!("torture seed {seed} (replay with LOOPS_TORTURE_SEED={seed}), {kills_wanted} kills");
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);
    let tmp = tempfile::tempdir().unwrap();
    let mut h = Harness::new(tmp.path());
    let mut gen_ = 0;
    h.add_gen(0);
    let mut stalled = 0;
    let mut last_progress = String::new();
    const REPORT_EVERY: u64 = 500;
    let mut next_report = REPORT_EVERY;
    loop {
        let killing = h.stats.kills < kills_wanted;
        // A child that made no progress in many tries runs to quiet once (a slow machine).
        let grace = stalled >= 50;
        // One kill in four counts from the child's start, and may land while it opens (and
        // repairs) the store; the others count from the open, and land among the runs.
        let kill = (killing && !grace).then(|| Kill {
            delay: Duration::from_millis(rng.u64(0..=150)),
            after_open: rng.u8(0..4) != 0,
        });
        if grace {
            h.stats.grace_runs += 1;
            stalled = 0;
        }
        let end = h.incarnation((gen_, gen_), kill);
        h.check_all(false);
        // A long run says how far it got, so that one stopped early still tells something.
        if h.stats.kills >= next_report {
            println!(
                "torture: {} kills, generation {gen_}, {:.0?}, every check passed so far",
                h.stats.kills,
                started.elapsed()
            );
            next_report += REPORT_EVERY;
        }
        let progress = format!(
            "{:?}",
            h.runs
                .values()
                .map(|r| (
                    r.info.as_ref().map(|i| (i.seq, i.status, i.attempt)),
                    r.steps.len()
                ))
                .collect::<Vec<_>>()
        );
        if progress == last_progress {
            stalled += 1;
        } else {
            stalled = 0;
            last_progress = progress;
        }
        if h.gen_done(gen_) {
            if !killing {
                break;
            }
            gen_ += 1;
            h.add_gen(gen_);
            continue;
        }
        if end == End::Quiet || rng.bool() {
            h.act(gen_, !killing);
        }
    }
    // Once more, every run of every generation.
    h.check_all(true);
    let tortured = started.elapsed();

    let reference_started = Instant::now();
    let reference_dir = tempfile::tempdir().unwrap();
    let r = reference(h.gens, reference_dir.path());
    let mut differences = Vec::new();
    for id in h.runs.keys() {
        let (got, want) = (h.summary(id).keys_named(), r.summary(id).keys_named());
        if got != want {
            differences.push(format!("{id}:\n  got  {got:?}\n  want {want:?}"));
        }
    }
    assert!(
        differences.is_empty(),
        "{} runs differ from the reference run:\n{}",
        differences.len(),
        differences.join("\n")
    );
    let s = &h.stats;
    let transitions: usize = h.runs.values().map(|r| r.history.len()).sum();
    let steps: usize = h.runs.values().map(|r| r.steps.len()).sum();
    let mut report = String::new();
    writeln!(
        report,
        "torture seed {seed}: {} kills ({} before the store opened), {} restarts ({} quiet exits, {} grace runs), {} generations, {} runs",
        s.kills,
        s.kills_before_open,
        s.restarts,
        s.quiet_exits,
        s.grace_runs,
        h.gens,
        h.runs.len()
    )
    .unwrap();
    writeln!(
        report,
        "  {} checks ({} needed crash repair, made on a copy); {} transitions and {} step records at the end, {} transition and {} step checks in all",
        s.checks, s.check_recoveries, transitions, steps, s.transitions_checked, s.steps_checked
    )
    .unwrap();
    writeln!(
        report,
        "  {} handler entries, {} effects run, {} of them repeats in the crash window (refused by key), {} torn ledger lines",
        s.entries, s.effects_executed, s.effects_repeated, s.torn_lines
    )
    .unwrap();
    writeln!(
        report,
        "  parent: {} writable opens, {} events sent, {} cancels, {} retries; torture {:.1?}, reference {:.1?}",
        s.parent_opens,
        s.events_sent,
        s.cancels,
        s.retries,
        tortured,
        reference_started.elapsed()
    )
    .unwrap();
    writeln!(report, "  nothing lost; every run equals the reference run").unwrap();
    print!("{report}");
    assert!(s.kills >= kills_wanted);
}

#[test]
fn torture_kills_at_random_moments_lose_nothing_and_repeat_no_recorded_step() {
    let kills = std::env::var("LOOPS_TORTURE_KILLS")
        .ok()
        .map_or(200, |k| k.parse().expect("LOOPS_TORTURE_KILLS is a number"));
    torture(kills);
}

/// Long mode, for releases:
/// `cargo test --release --test torture -- --ignored torture_long --nocapture`
/// (10,000 kills, or `LOOPS_TORTURE_KILLS`).
#[test]
#[ignore = "long mode: 10,000 kills"]
fn torture_long() {
    let kills = std::env::var("LOOPS_TORTURE_KILLS")
        .ok()
        .map_or(10_000, |k| {
            k.parse().expect("LOOPS_TORTURE_KILLS is a number")
        });
    torture(kills);
}
