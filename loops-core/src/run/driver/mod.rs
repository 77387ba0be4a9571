//! The drive loop: the one code path that takes a run from its last record to its end.
//!
//! A first run and a resume are the same: [`Drive::enter`] looks the run up (a miss creates
//! it), then [`Drive::drive_loop`] repeats: decode the latest record, run the state's handler
//! with the state's recorded steps preloaded (so completed steps hit and are skipped), commit
//! the transition. Failures, waits and cancellation are statuses of the run's row, handled at
//! the top of the loop ([`Drive::settle`]).
//!
//! The driver knows one run, the store and the settings it is given: nothing of the runtime
//! that claimed the run for it.

mod outcome;
mod settle;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::names::validate_run_id;
use crate::record::{StepRecord, TransitionRecord};
use crate::row::RunInfo;
use crate::run::attempts::failed_attempts;
use crate::run::context::{Context, Kin, RunScope};
use crate::run::dispatch::Dispatch;
use crate::run::settings::{Held, Settings};
use crate::schema::{SchemaDiff, SchemaHash};
use crate::store::{Store, Write};
use crate::workflow::{BoxError, StateId, Workflow};

/// How often an attached driver waiting on a store shared by several workers reads its run's
/// row again, to see an event or a cancellation that another process wrote.
pub(crate) const SHARED_POLL: Duration = Duration::from_millis(200);

/// How long a driver waits after a store fault (an [`Error::Storage`] or
/// [`Error::Database`] while it drives the run) before it looks at the run again: the first
/// wait, doubled after each fault that follows without the run moving to a next state, up
/// to the second.
pub(crate) const FAULT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(10));

/// How a driver treats a run that parks (waits for an event or a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The caller awaits the end of the run (`Runtime::run`): wait in place.
    Attached,
    /// A background driver of a registered workflow: stop, and let the scheduler or
    /// `Runtime::send` start a driver again when the wait can end.
    Background,
}

/// Where a driver stopped.
pub(crate) enum Driven<W> {
    /// The run reached a terminal state.
    Ended(W),
    /// The run is waiting and holds no task ([`Mode::Background`] only).
    Parked(Box<RunInfo>),
    /// The runtime drains: the driver let the run go at a state boundary, with no attempt of
    /// the current state begun ([`Mode::Background`] only).
    HandedOver,
}

/// A run as found (or created) by [`Drive::enter`].
pub(crate) struct Entered {
    pub(crate) info: RunInfo,
    pub(crate) record: TransitionRecord,
    /// Whether the current state's attempt was started by the commit that created it in this
    /// process (so no new attempt is counted before its first execution).
    pub(crate) fresh: bool,
    /// Whether this driver moved the run to its version (a migration's or an acceptance's
    /// record): a waiting run is then woken at once, so that its state's handler runs again
    /// under the new version and waits for what that version waits for.
    pub(crate) rerouted: bool,
}

/// What [`Drive::find_or_create`] found.
pub(crate) enum Found {
    /// The run existed: its row and latest record.
    Existing((RunInfo, TransitionRecord)),
    /// This call created it.
    Created(Entered),
}

enum Failure {
    Handler(BoxError),
    Timeout(Duration),
    /// The handler panicked: the panic's message.
    Panic(String),
}

enum Outcome<W> {
    Next(W),
    Failed(Failure),
    Parked,
    /// Another worker took the run over (its lease lapsed here).
    Lost,
}

/// One run's driver: the run it holds, the store and the settings it drives it with.
pub(crate) struct Drive<'a> {
    pub(crate) store: &'a Arc<dyn Store>,
    pub(crate) settings: &'a Settings,
    pub(crate) held: &'a Held,
    /// The runtime, for the child runs the handler starts.
    pub(crate) kin: Option<std::sync::Weak<dyn Kin>>,
    /// Cancelled when the runtime drains: a background driver lets its run go at the next
    /// state boundary. `None`: never (a driver outside a runtime).
    pub(crate) draining: Option<tokio_util::sync::CancellationToken>,
}

/// Where the drive loop stands between two looks at the run's row.
struct Progress {
    info: RunInfo,
    record: TransitionRecord,
    /// Whether the current attempt was started by a commit of this driver (a creation, a
    /// transition or a wake), so that its first execution counts no new attempt.
    fresh: bool,
    /// [`Entered::rerouted`], until the run is woken.
    rerouted: bool,
    /// Whether the current state was entered by a commit of this driver (the run's creation
    /// or a transition): then no step of it can be recorded yet, and the journal is not
    /// read. (Not after a wake: the handler ran before the run parked.)
    entered_here: bool,
    /// The last failed attempt's error, when it failed in this driver.
    last_error: Option<BoxError>,
    /// `(seq, attempt)` of the attempt this driver is executing (counted, by its own write
    /// or by the commit that entered the state), until its failure is recorded: after a
    /// store fault the driver executes that attempt again without counting another.
    ours: Option<(u64, u32)>,
}

/// What the drive loop does after a look at the run's row.
enum Settled<W> {
    /// Stop: the run ended or parked.
    Done(Driven<W>),
    /// The row changed: look again.
    Again,
    /// The run is running: run its handler.
    Handle,
}

impl Drive<'_> {
    fn run_id(&self) -> &str {
        &self.held.run_id
    }

    /// Whether this driver lets its run go at the next state boundary: a background driver
    /// of a runtime that drains ([`Runtime::drain`](crate::Runtime::drain)). It commits the
    /// state's transition with `hands_over`, leaving the next state's attempt not begun (and
    /// not counted), and stops; a driver that has begun no attempt (it resumed the run and
    /// has not run its handler) stops at once, and the next driver begins that attempt,
    /// counting what this one would have.
    fn drains(&self, mode: Mode) -> bool {
        mode == Mode::Background && self.draining.as_ref().is_some_and(|d| d.is_cancelled())
    }

    /// Ms since the Unix epoch by the runtime's clock.
    fn now(&self) -> u64 {
        self.settings.clock.now_ms()
    }

    /// The run's row and latest record, if the run exists.
    pub(crate) async fn find(&self) -> Result<Option<(RunInfo, TransitionRecord)>> {
        self.store.latest(self.run_id()).await
    }

    /// Checks that a found run can be driven as `W`: of `W`'s workflow, with `W`'s schema or
    /// with `accepted` (a schema the route found `W` accepts), in its row and its latest
    /// record; refuses without writing anything.
    pub(crate) async fn check<W: Workflow>(
        &self,
        found: Entered,
        accepted: Option<SchemaHash>,
    ) -> Result<Entered> {
        let Entered {
            info,
            record,
            rerouted,
            ..
        } = found;
        let run_id = self.run_id();
        if info.workflow != W::NAME {
            return Err(Error::WorkflowMismatch {
                run_id: run_id.to_owned(),
                stored: info.workflow,
                requested: W::NAME,
            });
        }
        let compiled = W::SCHEMA_HASH.pinned();
        let ok = |h: SchemaHash| h == compiled || Some(h) == accepted;
        if !ok(info.schema) || !ok(record.schema) {
            let stored = if ok(info.schema) {
                record.schema
            } else {
                info.schema
            };
            tracing::warn!(%stored, %compiled, status = %info.status, "schema changed; refusing to read the run's records");
            return Err(Error::SchemaMismatch {
                run_id: run_id.to_owned(),
                workflow: W::NAME.to_owned(),
                stored,
                compiled,
                changes: schema_changes::<W>(&**self.store, stored).await,
            });
        }
        if info.status.is_ended() {
            // `run(id, initial)` of an id whose run ended returns that end: the run id names
            // the run, so an `initial` other than its first state changes nothing (helper-131).
            tracing::info!(state = %record.state, seq = info.seq, status = %info.status, "run has ended already: its recorded end is returned, and a new initial state given for it is not used");
        } else {
            tracing::info!(state = %record.state, seq = info.seq, status = %info.status, "resuming run");
        }
        crate::failpoint::point("loops::resume::after_read");
        Ok(Entered {
            info,
            record,
            fresh: false,
            rerouted,
        })
    }

    /// The run, if it exists ([`Found::Existing`], to be checked and routed by the caller);
    /// else created in `initial` with the attributes `attributes` makes (asked for a
    /// creation only) as [`create`](Self::create) does ([`Found::Created`]). A creation that
    /// a concurrent one beat (an [`enqueue`](crate::Runtime::enqueue) of the same id in
    /// another process, which takes no lease, between this read and the creation:
    /// [`Error::SequenceConflict`]) finds the run that one made.
    ///
    /// # Errors
    /// A store error; what `attributes` or [`create`](Self::create) return.
    pub(crate) async fn find_or_create<W: Workflow>(
        &self,
        initial: W,
        attributes: impl FnOnce() -> Result<Vec<(String, crate::attribute::AttributeValue)>>,
    ) -> Result<Found> {
        if let Some(found) = self.find().await? {
            return Ok(Found::Existing(found));
        }
        match self.create(initial, attributes()?).await {
            Ok(entered) => Ok(Found::Created(entered)),
            Err(e @ Error::SequenceConflict { .. }) => match self.find().await? {
                Some(found) => Ok(Found::Existing(found)),
                None => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Creates the run in `initial`, which must be `W`'s initial state, with `attributes`.
    /// Its id must pass [`validate_run_id`], the rules for a new run (callers checked the
    /// ones of a lookup only: an existing run is found by its id).
    pub(crate) async fn create<W: Workflow>(
        &self,
        initial: W,
        attributes: Vec<(String, crate::attribute::AttributeValue)>,
    ) -> Result<Entered> {
        let run_id = self.run_id();
        validate_run_id(run_id)?;
        let store = &**self.store;
        let max = self.settings.max_payload_bytes;
        let (info, record) = first_record(run_id, &initial, &self.settings.clock, max, true)?;
        store
            .write(
                Some(&self.held.lease),
                Write::Create {
                    info: info.clone(),
                    record: record.to_bytes(),
                    schema_text: W::SCHEMA,
                    attributes,
                },
            )
            .await?;
        tracing::info!(state = %info.state, seq = 0, "run started");
        Ok(Entered {
            info,
            record,
            fresh: true,
            rerouted: false,
        })
    }

    /// Drives the run from `entered` until it ends (or, in [`Mode::Background`], parks).
    ///
    /// A store fault while it drives the run ([`Error::Storage`], [`Error::Database`],
    /// returned by the store or by the handler, whose error holds one when a step's write
    /// failed) is not the handler's failure: nothing is recorded, no attempt is counted, and
    /// the driver waits ([`FAULT_BACKOFF`]: 100 ms, doubling up to 10 s; each wait logged as a
    /// warning with the error), reads the run again and goes on where it was, for as long as
    /// the fault lasts. It stops only if its lease is lost.
    pub(crate) async fn drive_loop<W, H>(
        &self,
        entered: Entered,
        handler: &H,
        mode: Mode,
    ) -> Result<Driven<W>>
    where
        W: Dispatch<H>,
        H: ?Sized + Sync,
    {
        let run_id = self.run_id();
        let scope = Arc::new(RunScope {
            run_id: run_id.to_owned(),
            workflow: W::NAME,
            key_nonce: entered.info.key_nonce,
            schema: W::SCHEMA,
            store: Arc::clone(self.store),
            lease: self.held.lease.clone(),
            cancel: self.held.signals.cancel.clone(),
            max_payload_bytes: self.settings.max_payload_bytes,
            park_threshold: self.settings.park_threshold,
            clock: self.held.signals.clock(run_id),
            limits: Arc::clone(&self.settings.limits),
            time: self.settings.clock.clone(),
            observer: self.settings.observer.clone(),
            log_texts: self.settings.log_texts,
            kin: self.kin.clone(),
        });
        let mut run = Progress {
            info: entered.info,
            record: entered.record,
            fresh: entered.fresh,
            entered_here: entered.fresh,
            rerouted: entered.rerouted,
            last_error: None,
            ours: None,
        };
        let mut delay = FAULT_BACKOFF.0;
        let mut at_fault = run.info.seq;
        loop {
            let fault = match self.drive_from(&mut run, &scope, handler, mode).await {
                Err(e) if e.is_store_fault() => e,
                done => {
                    match &done {
                        Ok(Driven::Parked(info)) => {
                            crate::metrics::parked(W::NAME, info.state.clone());
                        }
                        Err(Error::Fenced { .. }) => crate::metrics::lease_lost(W::NAME),
                        _ => {}
                    }
                    return done;
                }
            };
            crate::metrics::failure(W::NAME, run.info.state.clone(), crate::metrics::STORE_FAULT);
            if run.info.seq != at_fault {
                delay = FAULT_BACKOFF.0;
                at_fault = run.info.seq;
            }
            self.ride_out(&mut run, fault, &mut delay).await?;
        }
    }

    /// What the attempt at `state` (entered at `seq`) starts from: its value (as
    /// [`current`] read it) and the state's recorded steps. `None` if either cannot be read,
    /// the attempt having failed with that error, recorded: a state that does not decode
    /// (which repeats, so the run fails once, saying why), a step or wait outcome that does
    /// not open (a key this process lacks, another key of the same id). Stopping the driver
    /// instead started it again every second, for ever.
    ///
    /// # Errors
    /// The store's, reading the steps or recording the failure.
    async fn attempt_from<W: Workflow>(
        &self,
        run: &mut Progress,
        state: W::State,
        value: Result<W>,
        seq: u64,
    ) -> Result<Option<(W, Vec<(String, u32, StepRecord)>)>> {
        let read = match value {
            Ok(value) if std::mem::take(&mut run.entered_here) => Ok((value, Vec::new())),
            Ok(value) => match self.store.steps(self.run_id(), seq).await {
                Ok(recorded) => Ok((value, recorded)),
                Err(e @ Error::Payload { .. }) => Err(e),
                Err(e) => return Err(e),
            },
            Err(e) => Err(e),
        };
        match read {
            Ok(read) => Ok(Some(read)),
            Err(e) => {
                let failure = Failure::Handler(Box::new(e));
                self.record_failure::<W>(run, state, failure).await?;
                Ok(None)
            }
        }
    }

    /// The drive loop proper, until the run ends, parks, or an error stops it.
    async fn drive_from<W, H>(
        &self,
        run: &mut Progress,
        scope: &Arc<RunScope>,
        handler: &H,
        mode: Mode,
    ) -> Result<Driven<W>>
    where
        W: Dispatch<H>,
        H: ?Sized + Sync,
    {
        let run_id = self.run_id();
        // The state this driver has just entered, decoded from its record before the commit
        // (`commit_transition`): decoded once.
        let mut entered: Option<(u64, W)> = None;
        loop {
            match self.settle::<W>(run, mode).await? {
                Settled::Done(driven) => return Ok(driven),
                Settled::Again => continue,
                Settled::Handle => {}
            }
            // Draining, with no attempt begun: the next driver begins it (see `drains`).
            if !run.fresh && self.drains(mode) {
                return Ok(Driven::HandedOver);
            }
            let (state, value) = current::<W>(run_id, &run.record, entered.take())?;
            if !run.fresh && !self.begin_attempt::<W>(run, state).await? {
                continue;
            }
            run.fresh = false;
            // The state's seq: steps, waits and failures of a migrated state stay keyed by
            // the seq it was entered at.
            let seq = run.info.state_seq();
            let attempt = run.info.attempt;
            run.ours = Some((seq, attempt));
            let Some((value, recorded)) = self.attempt_from::<W>(run, state, value, seq).await?
            else {
                continue;
            };
            let attempts_left = self
                .settings
                .retry_policy::<W>(state)
                .max_attempts
                .saturating_sub(failed_attempts(&run.info));
            let ctx = Context::new(
                Arc::clone(scope),
                state.name(),
                seq,
                attempt,
                attempts_left,
                recorded,
            );
            let span = tracing::info_span!("state", state = state.name(), seq, attempt);
            let started = Instant::now();
            let outcome = self.handle(value, handler, &ctx).instrument(span).await;
            drop(ctx);
            match outcome {
                Outcome::Lost => {
                    // Lost by its own clock (the lease lapsed), or told by a renewal.
                    self.held.signals.check_lease(run_id, seq)?;
                    return Err(Error::Fenced {
                        run_id: run_id.to_owned(),
                        seq,
                        current: seq,
                        status: run.info.status,
                    });
                }
                Outcome::Parked => {
                    // The wait committed the waiting status; read it back.
                    run.info = self.reread().await?;
                }
                Outcome::Next(next) => {
                    if self.held.signals.cancel.is_cancelled() {
                        // Cancelled while the state ran: the run ends where it is.
                        continue;
                    }
                    match self
                        .commit_transition(run, state, next, started, mode)
                        .await
                    {
                        // Draining: let go at this boundary (see `drains`).
                        Ok((true, _)) => return Ok(Driven::HandedOver),
                        Ok((false, value)) => entered = Some(value),
                        // The store refused the transition for a cancellation asked for
                        // meanwhile (another process's, say): read the row, which ends it.
                        Err(Error::RunCancelled { .. }) => run.info = self.reread().await?,
                        // A next state that cannot be recorded (over the payload limit, or
                        // not encodable): the attempt failed with that error, which comes out
                        // the same at every try, so the run fails now, saying why. (Stopping
                        // the driver instead counted each try as interrupted.)
                        Err(e) if e.repeats() => {
                            let failure = Failure::Handler(Box::new(e));
                            self.record_failure::<W>(run, state, failure).await?;
                        }
                        done => drop(done?),
                    }
                }
                Outcome::Failed(failure) => {
                    if self.held.signals.cancel.is_cancelled() {
                        continue;
                    }
                    if let Some(fault) = failure.store_fault() {
                        return Err(fault);
                    }
                    self.record_failure::<W>(run, state, failure).await?;
                }
            }
        }
    }
}

/// The run's current state and its value, from its latest `record`: the value
/// `commit_transition` decoded before committing it (`entered`, with its seq), else decoded
/// now. A record that does not decode as a `W` is handed back as the error, with the state it
/// names, for the attempt to fail with.
///
/// # Errors
/// As [`TransitionRecord::decode`], for a record naming no state of `W` or sealed.
fn current<W: Workflow>(
    run_id: &str,
    record: &TransitionRecord,
    entered: Option<(u64, W)>,
) -> Result<(W::State, Result<W>)> {
    // Records are immutable: the one of this seq is the one just committed.
    if let Some((seq, value)) = entered
        && seq == record.seq
    {
        return Ok((value.state(), Ok(value)));
    }
    match record.decode::<W>(run_id) {
        Ok(value) => Ok((value.state(), Ok(value))),
        Err(e @ Error::Decode { .. }) => match W::State::from_name(&record.state) {
            Some(state) => Ok((state, Err(e))),
            None => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// The row and first record of the run `run_id` in `initial`, created now by `clock`, with
/// the key nonce `clock` chooses ([`Clock::key_nonce`]): the one creation of a run, for a
/// driver's ([`Drive::create`]), a child's and a queued one's ([`Runtime::enqueue`](crate::Runtime::enqueue)). `begun`: whether the
/// commit that creates it begins its first attempt (a driver that goes on to handle the
/// state), or leaves it not begun (attempt 0) for whichever driver takes the run, which then
/// begins attempt 1 counting no interruption.
///
/// # Errors
/// [`Error::NotInitial`] if `initial` is not `W`'s initial state;
/// [`Error::PayloadTooLarge`] over `max_payload_bytes`; [`Error::Encode`] if `initial` does
/// not serialize, or not as JSON that decodes back as the same state.
pub(crate) fn first_record<W: Workflow>(
    run_id: &str,
    initial: &W,
    clock: &Clock,
    max_payload_bytes: usize,
    begun: bool,
) -> Result<(RunInfo, TransitionRecord)> {
    let now_ms = clock.now_ms();
    let given = initial.state();
    if given != <W::State as StateId>::INITIAL {
        return Err(Error::NotInitial {
            run_id: run_id.to_owned(),
            workflow: W::NAME,
            initial: <W::State as StateId>::INITIAL.name(),
            given: given.name(),
        });
    }
    // Read back before it is recorded, as every state a run enters is.
    let (record, _) = TransitionRecord::encode_read_back(run_id, 0, initial, now_ms)?;
    crate::run::settings::check_size(run_id, &record, max_payload_bytes)?;
    let nonce = clock.key_nonce(run_id, now_ms);
    let mut info = RunInfo::created::<W>(run_id, given, now_ms, nonce);
    if !begun {
        info.attempt = 0;
    }
    Ok((info, record))
}

/// What changed between the stored schema description of `stored` and `W`'s compiled one
/// (never empty: an unavailable stored description is a change of its own).
pub(crate) async fn schema_changes<W: Workflow>(
    store: &dyn Store,
    stored: SchemaHash,
) -> SchemaDiff {
    let old = store.schema(stored).await.ok().flatten();
    SchemaDiff::of_mismatch(old.as_deref(), W::SCHEMA).with_accepts_hint(stored)
}
