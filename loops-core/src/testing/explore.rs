//! The crash explorer: runs a workflow once to learn its boundaries, then once per boundary
//! stops the run there as a crash would, resumes it from what was committed, and checks that
//! the resumed run ends as the uninterrupted one did.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::clock::ManualClock;
use crate::error::{Error, Result};

/// Why a case could not be run to its end, in words (it goes into a report).
#[derive(Debug)]
struct Problem(String);

impl From<Error> for Problem {
    fn from(e: Error) -> Self {
        Problem(e.to_string())
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

use crate::run::dispatch::Dispatch;
use crate::run::settings::StepRun;
use crate::runtime::{Runtime, RuntimeBuilder};
use crate::schema::DeclaredEvents;
use crate::store::{RedbStore, RunStatus, Store};
use crate::testing::child::{self, AbortAt, CaseDir, Journal, Role};
use crate::testing::compare::{
    Case, Ended, First, Outcome, boundaries, compare, repeat_differences,
};
use crate::testing::report::{
    Boundary, Exploration, ExploreError, Finding, ONLY_ENV, When, with_children,
    with_unregistered_child,
};
use crate::testing::store::{HookedStore, Verdict, WriteHook, WriteSeen};

/// How long one run of the workflow (before or after a crash) may take, by the real clock.
const PROCESS_LIMIT: Duration = Duration::from_secs(60);

/// How often, by the real clock, the explorer looks whether the run waits for time or for
/// an event it should send.
const TICK: Duration = Duration::from_millis(1);

/// Makes the runtime builder an explorer's runs are built with (limits, retry policies).
type Configure = dyn Fn(RuntimeBuilder) -> RuntimeBuilder + Send + Sync;

/// Says which boundaries an explorer explores ([`Explorer::boundaries_where`]).
type Keep = dyn Fn(&Boundary) -> bool + Send + Sync;

/// What a process of the workflow calls for each run of a step's closure.
type StepSink = Arc<dyn Fn(&StepRun) + Send + Sync>;

/// Explores the crashes of one run of `W`: see [`explore`], and the methods for events, the
/// runtime's configuration and replaying one case.
pub struct Explorer<W, H> {
    initial: W,
    factory: Box<dyn Fn() -> H + Send + Sync>,
    events: Vec<(String, serde_json::Value)>,
    configure: Box<Configure>,
    before_each: Box<dyn Fn() + Send + Sync>,
    run_id: String,
    /// The one boundary to explore; `Err` holds an [`ONLY_ENV`] that is not a number.
    only: std::result::Result<Option<usize>, String>,
    filter: Option<Box<Keep>>,
    start: SystemTime,
    /// In child processes: the name of the test that runs the explorer (`Err`: why it is
    /// not known).
    children: Option<std::result::Result<String, String>>,
}

/// Explores every crash of one run of `W` from `initial`, with a handler made by `factory`
/// for each process: see [`Explorer::run`]. Returns the boundaries it explored.
///
/// See `loops::testing` for an example.
///
/// # Errors
/// As [`Explorer::run`].
pub async fn explore<W, H>(
    factory: impl Fn() -> H + Send + Sync + 'static,
    initial: W,
) -> Result<Exploration, ExploreError>
where
    W: Dispatch<H> + Serialize + Clone,
    H: Sync + 'static,
{
    Explorer::new(factory, initial).run().await
}

impl<W, H> Explorer<W, H>
where
    W: Dispatch<H> + Serialize + Clone,
    H: Sync + 'static,
{
    /// An explorer of the run of `W` from `initial`, with a handler made by `factory` for
    /// the uninterrupted run and for each process before and after a crash (a handler's
    /// memory does not survive a crash; its factory is what a restart would run).
    pub fn new(factory: impl Fn() -> H + Send + Sync + 'static, initial: W) -> Self {
        Explorer {
            initial,
            factory: Box::new(factory),
            events: Vec::new(),
            configure: Box::new(|b| b),
            before_each: Box::new(|| {}),
            run_id: "explored".to_owned(),
            only: match std::env::var(ONLY_ENV) {
                Ok(text) => text.trim().parse().map(Some).map_err(|_| text),
                Err(_) => Ok(None),
            },
            filter: None,
            // A fixed start (2026-01-01 UTC), so that runs see the same times.
            start: UNIX_EPOCH + Duration::from_secs(1_767_225_600),
            children: None,
        }
    }

    /// Runs every case in child processes rather than in this one: the test binary runs
    /// again, on this test alone (its name is the name of the thread the test runs on, as
    /// the standard test harness and `#[tokio::test]` name it; see
    /// [`in_child_processes_of`](Self::in_child_processes_of) otherwise). The uninterrupted
    /// run is one child; each boundary is a child that runs the workflow on a store file
    /// and calls `std::process::abort()` at the boundary (a real crash: no destructor runs,
    /// only what the store committed survives), then a fresh child that reopens the file
    /// and resumes the run to its end. The parent reads the store file and the children's
    /// journals, and checks and reports exactly as in process ([`run`](Self::run)).
    ///
    /// In a child process, the test runs again up to this explorer's [`run`](Self::run),
    /// which plays the child's part and ends the process: nothing else is needed in the
    /// test. So the test must reach the explorer without depending on what the parent did
    /// (state a handler shares with the parent must live in files or a service both reach),
    /// and run one explorer in child processes.
    pub fn in_child_processes(self) -> Self {
        let name = std::thread::current()
            .name()
            .filter(|name| *name != "main")
            .map(str::to_owned)
            .ok_or_else(|| {
                "the test's name is not known (the explorer is not on a thread named by the \
                 test harness): name the test with Explorer::in_child_processes_of"
                    .to_owned()
            });
        Explorer {
            children: Some(name),
            ..self
        }
    }

    /// As [`in_child_processes`](Self::in_child_processes), the test being the one named
    /// `test` (its full path in the test binary, as `cargo test -- --list` prints it,
    /// without `: test`).
    pub fn in_child_processes_of(mut self, test: impl Into<String>) -> Self {
        self.children = Some(Ok(test.into()));
        self
    }

    /// Sends the event `name` (a declared [`Event`](crate::Event), whose payload type the
    /// compiler checks, or a `&str`) with `payload` when the run waits for an event of that
    /// name: events of one name are sent in the order given, one per wait. A payload that
    /// cannot be serialized is sent as `null`.
    pub fn event<T: Serialize>(mut self, name: impl crate::EventName<T>, payload: T) -> Self {
        let payload = serde_json::to_value(payload).unwrap_or(serde_json::Value::Null);
        self.events.push((name.event_name().to_owned(), payload));
        self
    }

    /// Applies `configure` to the builder of every runtime the explorer builds (limits,
    /// retry policies, time-outs). It must not set the clock or the park threshold: the
    /// explorer sets a manual clock and parks every sleep, so that every wait is a boundary.
    pub fn configure(
        mut self,
        configure: impl Fn(RuntimeBuilder) -> RuntimeBuilder + Send + Sync + 'static,
    ) -> Self {
        self.configure = Box::new(configure);
        self
    }

    /// Calls `reset` before the uninterrupted run and before each case (not between the
    /// two halves of a case: the outside world outlives a crash), so that a handler's
    /// outside world (a temporary repository, a fake service) starts afresh for each.
    pub fn before_each(mut self, reset: impl Fn() + Send + Sync + 'static) -> Self {
        self.before_each = Box::new(reset);
        self
    }

    /// Names the explored run (default `explored`).
    pub fn run_id(mut self, run_id: impl Into<String>) -> Self {
        self.run_id = run_id.into();
        self
    }

    /// Explores only the boundary numbered `boundary` (from 1, as a report prints it), to
    /// replay one failing case; the environment variable [`ONLY_ENV`] does the same. A number
    /// the run has no boundary for fails the exploration
    /// ([`ExploreError::NoSuchBoundary`]): a replay must not pass for exploring nothing.
    pub fn only(mut self, boundary: usize) -> Self {
        self.only = Ok(Some(boundary));
        self
    }

    /// Explores only the boundaries `keep` says yes to (all are still learned and
    /// reported): for a workflow whose every run is slow, the boundaries that matter most.
    pub fn boundaries_where(
        mut self,
        keep: impl Fn(&Boundary) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.filter = Some(Box::new(keep));
        self
    }

    /// Whether `boundary` is to be explored.
    fn chosen(&self, boundary: &Boundary) -> bool {
        self.only
            .as_ref()
            .is_ok_and(|only| only.is_none_or(|only| only == boundary.number))
            && self.filter.as_ref().is_none_or(|keep| keep(boundary))
    }

    /// Runs the workflow once without a crash, to learn its boundaries: after each commit
    /// of a write of the run (its creation, each transition, each step record, each wait,
    /// each attempt), and, for a step, between its effect and its record (before the
    /// record's commit). Then, for each boundary, from an empty in-memory store: runs the
    /// workflow and stops it there as a crash would (the runtime, its tasks and the
    /// handler dropped, the leases forgotten; the store keeps what was committed), then
    /// resumes it with a new runtime and a new handler from the factory until it ends, and
    /// checks: the final state and the history equal the uninterrupted run's; every step
    /// whose record committed ran its closure once; the closures that ran twice are exactly
    /// those stopped between their effect and their record, each with the same idempotency
    /// key both times. Time is a [`ManualClock`] that the explorer moves to each wake-up,
    /// deadline and retry time; events come from [`event`](Self::event).
    ///
    /// What this shows, and what not: a crash here drops memory and tasks, at a write's
    /// boundary; it cannot lose the operating system's page cache, tear a write, or crash
    /// inside the store's commit. Kill real processes for those (docs/testing.md).
    /// [`in_child_processes`](Self::in_child_processes) runs the same cases with a real
    /// process per crash, on a store file.
    ///
    /// In a child process of an explorer in child processes, this plays the child's part
    /// and ends the process: it does not return.
    ///
    /// # Errors
    /// [`ExploreError::Found`] listing each boundary whose resumed run differed, what
    /// differed, and how to replay it alone; [`ExploreError::Reference`] if the run without
    /// a crash could not be run to its end (an error of the runtime, an event it waits for
    /// that the explorer was not given, or more than 60 s of real time).
    pub async fn run(self) -> Result<Exploration, ExploreError> {
        if let Some(Ok(_)) = &self.children
            && let Some(case) = child::role_from_env(&self.run_id)
        {
            self.serve_as_child(case).await
        }
        if let Some(Err(why)) = &self.children {
            return Err(ExploreError::Reference {
                run_id: self.run_id.clone(),
                message: why.clone(),
            });
        }
        self.check_events()?;
        let reference = self.case(None).await.map_err(|e| ExploreError::Reference {
            run_id: self.run_id.clone(),
            message: e.to_string(),
        })?;
        let reference = match reference {
            Case::Ended(ended) => ended,
            Case::Stopped(..) => unreachable_stop(&self.run_id)?,
        };
        if !reference.children.is_empty() {
            return Err(ExploreError::Reference {
                run_id: self.run_id.clone(),
                message: with_children(&reference.children),
            });
        }
        if let Some(event) = self.unsent(&reference.sent) {
            return Err(ExploreError::Event {
                run_id: self.run_id.clone(),
                event: event.to_owned(),
                why: "the run ended without waiting for it".to_owned(),
            });
        }
        if reference.outcome.status == RunStatus::Failed
            && let Some(workflow) = reference.error.as_deref().and_then(unregistered_child)
        {
            // The start of a child the runtime had no handler for: a setup the explorer
            // cannot explore either way, not the workflow's failure.
            return Err(ExploreError::Reference {
                run_id: self.run_id.clone(),
                message: with_unregistered_child(workflow),
            });
        }
        // Every case is compared with the reference: a workflow that does not do the same
        // twice without a crash would have its chance taken for the crash's doing.
        let again = match self.case(None).await {
            Ok(Case::Ended(again)) => repeat_differences(&reference, &again),
            Ok(Case::Stopped(..)) => {
                repeat_differences(&reference, &unreachable_stop(&self.run_id)?)
            }
            Err(e) => vec![format!("the second could not be run: {e}")],
        };
        if !again.is_empty() {
            return Err(ExploreError::NotRepeatable {
                run_id: self.run_id.clone(),
                differences: again,
            });
        }
        let boundaries = boundaries(&reference, &self.run_id);
        let asked = match &self.only {
            Ok(Some(only)) if *only == 0 || *only > boundaries.len() => Some(only.to_string()),
            Ok(_) => None,
            Err(text) => Some(format!("{ONLY_ENV}={text:?}")),
        };
        if let Some(asked) = asked {
            return Err(ExploreError::NoSuchBoundary {
                run_id: self.run_id.clone(),
                asked,
                boundaries: boundaries.len(),
            });
        }
        let mut findings = Vec::new();
        for boundary in &boundaries {
            if !self.chosen(boundary) {
                continue;
            }
            let differences = match self.case(Some(boundary)).await {
                Ok(Case::Stopped(first, ended)) => compare(&reference, &first, &ended, boundary),
                Ok(Case::Ended(_)) => vec![format!(
                    "the run ended before write {}: it did not make the uninterrupted run's \
                     writes (a handler that decides by something other than its state, steps \
                     and events?)",
                    boundary.write
                )],
                Err(e) => vec![format!("the run could not be run: {e}")],
            };
            if !differences.is_empty() {
                findings.push(Finding {
                    boundary: boundary.clone(),
                    differences,
                });
            }
        }
        let explored = boundaries.iter().filter(|b| self.chosen(b)).count();
        if findings.is_empty() {
            Ok(Exploration {
                run_id: self.run_id.clone(),
                boundaries,
                explored,
                final_state: reference.outcome.state.clone(),
                final_status: reference.outcome.status,
                error: reference.error,
            })
        } else {
            Err(ExploreError::Found {
                run_id: self.run_id.clone(),
                explored,
                findings,
            })
        }
    }

    /// [`ExploreError::Event`] for an event given to the explorer that the workflow does not
    /// declare, or whose payload cannot be the declared type (a workflow that declares no
    /// events takes any).
    fn check_events(&self) -> Result<(), ExploreError> {
        let declared = DeclaredEvents::from_description(W::SCHEMA);
        for (event, payload) in &self.events {
            declared
                .check(W::SCHEMA, event, payload)
                .map_err(|refusal| ExploreError::Event {
                    run_id: self.run_id.clone(),
                    event: event.clone(),
                    why: refusal.to_string(),
                })?;
        }
        Ok(())
    }

    /// The name of an event given to the explorer more often than the run without a crash
    /// took one of that name (`sent`: the names of the events sent to it), if any.
    fn unsent(&self, sent: &[String]) -> Option<&str> {
        self.events
            .iter()
            .map(|(name, _)| name.as_str())
            .find(|name| {
                let given = self.events.iter().filter(|(n, _)| n == name).count();
                sent.iter().filter(|n| n == name).count() < given
            })
    }

    /// One case: the run without a crash (`None`), or stopped at `boundary` and resumed;
    /// in this process or in child processes.
    async fn case(&self, boundary: Option<&Boundary>) -> Result<Case, Problem> {
        (self.before_each)();
        match &self.children {
            Some(Ok(test)) => self.case_in_children(test, boundary).await,
            _ => self.case_in_process(boundary).await,
        }
    }

    /// [`case`](Self::case) in this process, on an in-memory store.
    async fn case_in_process(&self, boundary: Option<&Boundary>) -> Result<Case, Problem> {
        let base = RedbStore::in_memory()?;
        let clock = ManualClock::new(self.start);
        let steps: Arc<Mutex<Vec<StepRun>>> = Arc::default();
        let seen = Arc::clone(&steps);
        let sink: StepSink = Arc::new(move |run: &StepRun| {
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(run.clone());
        });
        let take = || std::mem::take(&mut *steps.lock().unwrap_or_else(PoisonError::into_inner));
        let hook = StopAt(boundary.map(|b| (b.write, b.when)));
        let store = HookedStore::with_hook(base.clone(), hook);
        let first = self.process(&store, &clock, &sink).await?;
        let first_writes = store.writes();
        let first_steps = take();
        let Some(()) = first else {
            return Ok(Case::Ended(
                self.ended(&base, first_writes, first_steps).await?,
            ));
        };
        // The crash: the runtime and the handler are gone; the leases die with the process.
        base.forget_leases();
        let store = HookedStore::new(base.clone());
        match self.process(&store, &clock, &sink).await? {
            Some(()) => Err(Problem("the store was stopped after the crash".to_owned())),
            None => {
                let ended = self.ended(&base, store.writes(), take()).await?;
                Ok(Case::Stopped(
                    First {
                        writes: first_writes,
                        steps: first_steps,
                    },
                    ended,
                ))
            }
        }
    }

    /// [`case`](Self::case) in child processes of the test `test`, on a store file: one
    /// child runs the workflow (and aborts at the boundary), another resumes it.
    async fn case_in_children(
        &self,
        test: &str,
        boundary: Option<&Boundary>,
    ) -> Result<Case, Problem> {
        let dir = CaseDir::new()
            .map_err(|e| Problem(format!("cannot create a directory for the case: {e}")))?;
        let role = boundary.map_or(Role::Reference, |b| Role::Crash(b.write, b.when));
        let first = child::run_child(test, &dir, role, &self.run_id)
            .await
            .map_err(Problem)?;
        if !first.crashed {
            let store = RedbStore::open(dir.store())?;
            return Ok(Case::Ended(
                self.ended(&store, first.writes, first.steps).await?,
            ));
        }
        let then = child::run_child(test, &dir, Role::Resume(first.clock_ms), &self.run_id)
            .await
            .map_err(|e| Problem(format!("after the crash: {e}")))?;
        let store = RedbStore::open(dir.store())?;
        let ended = self.ended(&store, then.writes, then.steps).await?;
        Ok(Case::Stopped(
            First {
                writes: first.writes,
                steps: first.steps,
            },
            ended,
        ))
    }

    /// The part of a child process: runs the workflow of `case` on its store file,
    /// journaling every write and step run, until it ends or the process aborts at the
    /// boundary; then ends the process.
    async fn serve_as_child(&self, case: std::result::Result<(PathBuf, Role), String>) -> ! {
        let (dir, role) = match case {
            Ok(case) => case,
            Err(why) => {
                eprintln!("crash explorer child: {why}");
                std::process::exit(2)
            }
        };
        let journal = match Journal::open(&dir) {
            Ok(journal) => journal,
            Err(e) => {
                eprintln!("crash explorer child: cannot open its journal: {e}");
                std::process::exit(2)
            }
        };
        let clock = ManualClock::new(self.start);
        let at = match role {
            Role::Reference => None,
            Role::Crash(write, when) => Some((write, when)),
            Role::Resume(clock_ms) => {
                // Time goes on from where the crashed process's clock was.
                clock.set(UNIX_EPOCH + Duration::from_millis(clock_ms));
                None
            }
        };
        let ran = async {
            let base = RedbStore::open(dir.join("store.redb"))?;
            let hook = AbortAt {
                journal: journal.clone(),
                clock: clock.clone(),
                at,
            };
            let store = HookedStore::with_hook(base, hook);
            let steps = journal.clone();
            let sink: StepSink = Arc::new(move |run: &StepRun| steps.step(run));
            self.process(&store, &clock, &sink).await
        };
        match ran.await {
            Ok(None) => journal.ended(),
            Ok(Some(())) => journal.problem("the store was stopped, not aborted"),
            Err(why) => journal.problem(&why.0),
        }
    }

    /// Runs the workflow in one "process" (a runtime and a handler of its own) until it
    /// ends (`None`) or the store is stopped at the boundary (`Some`).
    async fn process(
        &self,
        store: &HookedStore<RedbStore>,
        clock: &ManualClock,
        steps: &StepSink,
    ) -> Result<Option<()>, Problem> {
        let builder = Runtime::builder()
            .clock(clock.clone())
            .park_threshold(Duration::ZERO)
            .observe_steps(Arc::clone(steps));
        let runtime = (self.configure)(builder).build(store.clone());
        let handler = (self.factory)();
        let drive = runtime.run(&self.run_id, self.initial.clone(), &handler);
        tokio::pin!(drive);
        let started = Instant::now();
        loop {
            tokio::select! {
                biased;
                () = store.until_stopped() => return Ok(Some(())),
                _ = &mut drive => return Ok(None),
                () = tokio::time::sleep(TICK) => {
                    // A send to a stopped store never returns: race the stop.
                    tokio::select! {
                        biased;
                        () = store.until_stopped() => return Ok(Some(())),
                        nudged = self.nudge(&runtime, store.inner(), clock) => nudged?,
                    }
                }
            }
            if started.elapsed() > PROCESS_LIMIT {
                return Err(Problem(format!(
                    "the run did not end within {} s of real time",
                    PROCESS_LIMIT.as_secs()
                )));
            }
        }
    }

    /// Ends the run's wait the way the test said: sends the next scripted event it waits
    /// for, or moves the clock to its wake-up time, deadline or retry time.
    async fn nudge(
        &self,
        runtime: &Runtime,
        store: &RedbStore,
        clock: &ManualClock,
    ) -> Result<(), Problem> {
        let Some(info) = Store::run_info(store, &self.run_id).await? else {
            return Ok(());
        };
        let at = match info.status {
            RunStatus::Waiting => {
                let Some(wait) = &info.wait else {
                    return Ok(());
                };
                if let Some(event) = &wait.event {
                    if event == crate::CHILD_ENDED {
                        let children = Store::children(store, &self.run_id).await?;
                        let ids: Vec<String> = children.into_iter().map(|c| c.run_id).collect();
                        return Err(Problem(with_children(&ids)));
                    }
                    if Store::has_pending(store, &self.run_id, event).await? {
                        // Sent, not taken yet: the wait ends when the driver looks.
                        return Ok(());
                    }
                    let sent = Store::events(store, &self.run_id)
                        .await?
                        .iter()
                        .filter(|(_, record, _)| &record.name == event)
                        .count();
                    let next = self
                        .events
                        .iter()
                        .filter(|(name, _)| name == event)
                        .nth(sent);
                    if let Some((name, payload)) = next {
                        runtime.send(&self.run_id, name, payload).await?;
                        return Ok(());
                    }
                    if wait.until_ms.is_none() {
                        return Err(Problem(format!(
                            "run `{}` waits in state `{}` (seq {}) for event `{event}`, and the \
                             explorer has no more of it to send (Explorer::event)",
                            self.run_id, info.state, info.seq
                        )));
                    }
                }
                wait.until_ms
            }
            RunStatus::Running => info.retry_at_ms,
            _ => None,
        };
        if let Some(at) = at {
            clock.set(UNIX_EPOCH + Duration::from_millis(at));
        }
        Ok(())
    }

    /// What the run ended with.
    async fn ended(
        &self,
        base: &RedbStore,
        writes: Vec<WriteSeen>,
        steps: Vec<StepRun>,
    ) -> Result<Ended, Problem> {
        let info =
            Store::run_info(base, &self.run_id)
                .await?
                .ok_or_else(|| Error::RunNotFound {
                    run_id: self.run_id.clone(),
                })?;
        let history = Store::history(base, &self.run_id)
            .await?
            .into_iter()
            .map(|r| (r.seq, r.state, r.payload.get().to_owned()))
            .collect::<Vec<_>>();
        let payload = history.last().map(|h| h.2.clone()).unwrap_or_default();
        let children = Store::children(base, &self.run_id).await?;
        let sent = Store::events(base, &self.run_id)
            .await?
            .into_iter()
            .map(|(_, record, _)| record.name)
            .collect();
        Ok(Ended {
            children: children.into_iter().map(|c| c.run_id).collect(),
            sent,
            error: info.error.map(|chain| chain.join(": ")),
            outcome: Outcome {
                status: info.status,
                state: info.state,
                seq: info.seq,
                payload,
            },
            history,
            writes,
            steps,
        })
    }
}

/// The workflow named by an [`Error::NotRegistered`] in `error`, a failed run's joined
/// error chain: in a handler, the start of a child of a workflow with no handler. A failure
/// record keeps texts only; the message looked for is the error's own (`Display`), so that
/// the two cannot drift apart.
fn unregistered_child(error: &str) -> Option<&str> {
    let sample = Error::NotRegistered {
        workflow: "\u{0}".to_owned(),
    }
    .to_string();
    let (before, after) = sample.split_once('\u{0}')?;
    let rest = &error[error.find(before)? + before.len()..];
    Some(&rest[..rest.find(after)?])
}

/// A stop that cannot happen: the uninterrupted run has no boundary to stop at.
fn unreachable_stop(run_id: &str) -> Result<Ended, ExploreError> {
    Err(ExploreError::Reference {
        run_id: run_id.to_owned(),
        message: "the run without a crash was stopped".to_owned(),
    })
}

/// Stops the store at one write: `(n, when)`.
struct StopAt(Option<(u64, When)>);

impl WriteHook for StopAt {
    fn before(&self, seen: &WriteSeen) -> Verdict {
        match self.0 {
            Some((n, When::BeforeCommit)) if n == seen.n => Verdict::Stop,
            _ => Verdict::Go,
        }
    }

    fn after(&self, seen: &WriteSeen, _reply: &Result<crate::store::Reply>) -> Verdict {
        match self.0 {
            Some((n, When::AfterCommit)) if n == seen.n => Verdict::Stop,
            _ => Verdict::Go,
        }
    }
}
