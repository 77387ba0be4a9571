//! The metrics loops records, in one place: every metric's name, type, unit, labels and
//! when it changes, as constants and the small functions that record them. The runtime, the
//! redb store and the PostgreSQL store all record through these functions; no metric name
//! is spelled anywhere else.
//!
//! loops records through the [`metrics`](https://docs.rs/metrics) facade: nothing is kept
//! or sent until the application installs a recorder (any recorder of the `metrics`
//! ecosystem: `metrics-exporter-prometheus`, `metrics-exporter-statsd`, an OpenTelemetry
//! bridge...). Without one every call below is a no-op whose cost is a look-up of the
//! (absent) recorder. Labels are `&'static str` (workflow and state names, statuses, label
//! values below); the one label built at run time is a step's name, made once per execution
//! of a step (never on a replay) and shared by the series that step records.
//!
//! | name | type | unit | labels | changes when |
//! |---|---|---|---|---|
//! | [`RUNS`] `loops_runs` | gauge | runs | `workflow`, `status` | the store's runs by workflow and status, refreshed by [`Runtime::refresh_metrics`](crate::Runtime::refresh_metrics), which [`Runtime::serve`](crate::Runtime::serve) calls at once and then every [`RuntimeBuilder::metrics_interval`](crate::RuntimeBuilder::metrics_interval) when one is set (with a Prometheus handle: [`DEFAULT_METRICS_INTERVAL`](crate::DEFAULT_METRICS_INTERVAL), 15 s, unless set) |
//! | [`RUNS_PARKED`] `loops_runs_parked` | gauge | runs | `workflow` | same refresh: the store's waiting runs that no task of this process holds (durable waits and sleeps) |
//! | [`PARKS_TOTAL`] `loops_parks_total` | counter | parks | `workflow`, `state` | a driver of this process parked a run (a wait or sleep committed) and freed its task |
//! | [`TRANSITIONS_TOTAL`] `loops_transitions_total` | counter | transitions | `workflow`, `state` | this process committed a transition out of `state` |
//! | [`TRANSITION_SECONDS`] `loops_transition_duration_seconds` | histogram | seconds | `workflow`, `state` | same: from the start of the attempt's handler to its transition committed |
//! | [`STEPS_TOTAL`] `loops_steps_total` | counter | steps | `workflow`, `state`, `step`, `status` | a step was executed (not replayed) to its end: `status` [`OK`] (output recorded) or [`FAILED`] (its last try failed) |
//! | [`STEP_SECONDS`] `loops_step_duration_seconds` | histogram | seconds | `workflow`, `state`, `step` | a try of a step's closure ended (success or failure) |
//! | [`STEP_RETRIES_TOTAL`] `loops_step_retries_total` | counter | tries | `workflow`, `state`, `step` | a step's try failed and is tried again in place |
//! | [`FAILURES_TOTAL`] `loops_failures_total` | counter | failures | `workflow`, `state`, `source` | an attempt at a state failed: `source` is [`HANDLER`], [`PANIC`] or [`TIMEOUT`] (the failure is recorded in the run's journal), or [`STORE_FAULT`] (the store failed under the driver: nothing recorded, the driver waits and goes on) |
//! | [`LEASE_LOSSES_TOTAL`] `loops_lease_losses_total` | counter | losses | `workflow` | a driver of this process stopped because its lease was lost (renewal refused, lapsed, or a write fenced): shared stores only |
//! | [`LIMIT_WAIT_SECONDS`] `loops_limit_wait_seconds` | histogram | seconds | `limit` | a step's try took a named limit: how long it waited for it (0 when free) |
//! | [`LIMIT_WAITERS`] `loops_limit_waiters` | gauge | tries | `limit` | tries of this process waiting for the limit now |
//! | [`COMMIT_BATCH_SIZE`] `loops_commit_batch_size` | histogram | writes | `store` | a commit transaction ended: the writes it held (redb's group commit; `postgres` commits one write per transaction) |
//! | [`PRUNED_RUNS_TOTAL`] `loops_pruned_runs_total` | counter | runs | | a scheduled retention pass removed runs |
//! | [`PRUNE_PASS_RUNS`] `loops_prune_pass_runs` | histogram | runs | | a scheduled retention pass ended: the runs it removed |
//!
//! Counters and histograms count what this process did; the two gauges of runs count the
//! whole store (every worker's runs), so every worker of a PostgreSQL store reports the same
//! `loops_runs`: aggregate them with `max`, not `sum`.

use std::time::Duration;

use ::metrics::{Label, SharedString, counter, gauge, histogram};

use crate::status::RunStatus;

/// Gauge: the store's runs, by `workflow` and `status` (`running`, `waiting`, `completed`,
/// `failed`, `cancelled`, `blocked`).
pub const RUNS: &str = "loops_runs";
/// Gauge: the store's waiting runs that no task of this process holds, by `workflow`.
pub const RUNS_PARKED: &str = "loops_runs_parked";
/// Counter: runs parked by a driver of this process, by `workflow` and `state`.
pub const PARKS_TOTAL: &str = "loops_parks_total";
/// Counter: transitions committed by this process, by `workflow` and `state` (the state left).
pub const TRANSITIONS_TOTAL: &str = "loops_transitions_total";
/// Histogram, seconds: from the start of an attempt's handler to its transition committed.
pub const TRANSITION_SECONDS: &str = "loops_transition_duration_seconds";
/// Counter: steps executed to their end, by `workflow`, `state`, `step` and `status`.
pub const STEPS_TOTAL: &str = "loops_steps_total";
/// Histogram, seconds: one try of a step's closure.
pub const STEP_SECONDS: &str = "loops_step_duration_seconds";
/// Counter: failed tries of a step that are tried again in place.
pub const STEP_RETRIES_TOTAL: &str = "loops_step_retries_total";
/// Counter: failed attempts at a state, by `workflow`, `state` and `source`.
pub const FAILURES_TOTAL: &str = "loops_failures_total";
/// Counter: drivers stopped by a lost lease, by `workflow`.
pub const LEASE_LOSSES_TOTAL: &str = "loops_lease_losses_total";
/// Histogram, seconds: how long a step's try waited for a named limit, by `limit`.
pub const LIMIT_WAIT_SECONDS: &str = "loops_limit_wait_seconds";
/// Gauge: tries of this process waiting for a named limit now, by `limit`.
pub const LIMIT_WAITERS: &str = "loops_limit_waiters";
/// Histogram, writes: the writes of one commit transaction, by `store`.
pub const COMMIT_BATCH_SIZE: &str = "loops_commit_batch_size";
/// Counter: runs removed by scheduled retention passes.
pub const PRUNED_RUNS_TOTAL: &str = "loops_pruned_runs_total";
/// Histogram, runs: the runs one scheduled retention pass removed.
pub const PRUNE_PASS_RUNS: &str = "loops_prune_pass_runs";

/// Label: the workflow's name.
pub const WORKFLOW: &str = "workflow";
/// Label: a state's name.
pub const STATE: &str = "state";
/// Label: a step's name.
pub const STEP: &str = "step";
/// Label: a run's status (in [`RUNS`]) or a step's outcome (in [`STEPS_TOTAL`]).
pub const STATUS: &str = "status";
/// Label: what failed an attempt (in [`FAILURES_TOTAL`]).
pub const SOURCE: &str = "source";
/// Label: a named limit.
pub const LIMIT: &str = "limit";
/// Label: the store (`redb` or `postgres`).
pub const STORE: &str = "store";

/// `status` of [`STEPS_TOTAL`]: the step's output was recorded.
pub const OK: &str = "ok";
/// `status` of [`STEPS_TOTAL`]: the step's last try failed.
pub const FAILED: &str = "failed";
/// `source` of [`FAILURES_TOTAL`]: the handler returned an error.
pub const HANDLER: &str = "handler";
/// `source` of [`FAILURES_TOTAL`]: the handler (or a step's closure) panicked.
pub const PANIC: &str = "panic";
/// `source` of [`FAILURES_TOTAL`]: the handler ran past the state's time-out.
pub const TIMEOUT: &str = "timeout";
/// `source` of [`FAILURES_TOTAL`]: the store failed under the driver (nothing recorded).
pub const STORE_FAULT: &str = "store_fault";

/// Every [`RunStatus`], in the order [`RUNS`] reports them.
pub(crate) const STATUSES: [RunStatus; 6] = [
    RunStatus::Running,
    RunStatus::Waiting,
    RunStatus::Completed,
    RunStatus::Failed,
    RunStatus::Cancelled,
    RunStatus::Blocked,
];

/// Describes every metric (unit and meaning) to the installed recorder, for exporters that
/// show descriptions (Prometheus' `# HELP`). Call it once after installing a recorder;
/// recording works without it.
pub fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        RUNS,
        Unit::Count,
        "The store's runs by workflow and status."
    );
    describe_gauge!(
        RUNS_PARKED,
        Unit::Count,
        "The store's waiting runs that no task of this process holds."
    );
    describe_counter!(PARKS_TOTAL, Unit::Count, "Runs parked by this process.");
    describe_counter!(
        TRANSITIONS_TOTAL,
        Unit::Count,
        "Transitions committed by this process, by the state left."
    );
    describe_histogram!(
        TRANSITION_SECONDS,
        Unit::Seconds,
        "From the start of an attempt's handler to its transition committed."
    );
    describe_counter!(STEPS_TOTAL, Unit::Count, "Steps executed to their end.");
    describe_histogram!(STEP_SECONDS, Unit::Seconds, "One try of a step's closure.");
    describe_counter!(
        STEP_RETRIES_TOTAL,
        Unit::Count,
        "Failed tries of a step tried again in place."
    );
    describe_counter!(FAILURES_TOTAL, Unit::Count, "Failed attempts at a state.");
    describe_counter!(
        LEASE_LOSSES_TOTAL,
        Unit::Count,
        "Drivers stopped by a lost lease."
    );
    describe_histogram!(
        LIMIT_WAIT_SECONDS,
        Unit::Seconds,
        "How long a step's try waited for a named limit."
    );
    describe_gauge!(
        LIMIT_WAITERS,
        Unit::Count,
        "Tries waiting for a named limit now."
    );
    describe_histogram!(
        COMMIT_BATCH_SIZE,
        Unit::Count,
        "The writes of one commit transaction."
    );
    describe_counter!(
        PRUNED_RUNS_TOTAL,
        Unit::Count,
        "Runs removed by scheduled retention passes."
    );
    describe_histogram!(
        PRUNE_PASS_RUNS,
        Unit::Count,
        "The runs one scheduled retention pass removed."
    );
}

/// Records a committed transition out of `state` of `workflow`, `elapsed` after its
/// attempt's handler started.
pub(crate) fn transition(workflow: &'static str, state: &'static str, elapsed: Duration) {
    counter!(TRANSITIONS_TOTAL, WORKFLOW => workflow, STATE => state).increment(1);
    histogram!(TRANSITION_SECONDS, WORKFLOW => workflow, STATE => state)
        .record(elapsed.as_secs_f64());
}

/// Records a failed attempt at `state` of `workflow`, failed by `source` (one of [`HANDLER`],
/// [`PANIC`], [`TIMEOUT`], [`STORE_FAULT`]). `state` is a `SharedString` because a store
/// fault knows the state only by its stored name.
pub(crate) fn failure(
    workflow: &'static str,
    state: impl Into<SharedString>,
    source: &'static str,
) {
    counter!(FAILURES_TOTAL, WORKFLOW => workflow, STATE => state.into(), SOURCE => source)
        .increment(1);
}

/// Records that a driver of this process parked a run of `workflow` in `state`.
pub(crate) fn parked(workflow: &'static str, state: impl Into<SharedString>) {
    counter!(PARKS_TOTAL, WORKFLOW => workflow, STATE => state.into()).increment(1);
}

/// Records that a driver of a run of `workflow` stopped because its lease was lost.
pub(crate) fn lease_lost(workflow: &'static str) {
    counter!(LEASE_LOSSES_TOTAL, WORKFLOW => workflow).increment(1);
}

/// The labels of one step's series: made once per execution of the step and cloned (a
/// reference count, not a copy of the name) for each series it records.
#[derive(Clone)]
pub(crate) struct StepLabels {
    workflow: &'static str,
    state: &'static str,
    step: SharedString,
}

impl StepLabels {
    /// The labels of the step `step` of `state` of `workflow`.
    pub(crate) fn new(workflow: &'static str, state: &'static str, step: &str) -> StepLabels {
        StepLabels {
            workflow,
            state,
            step: SharedString::from_shared(std::sync::Arc::<str>::from(step)),
        }
    }

    fn labels(&self) -> [Label; 3] {
        [
            Label::from_static_parts(WORKFLOW, self.workflow),
            Label::from_static_parts(STATE, self.state),
            Label::new(STEP, self.step.clone()),
        ]
    }

    /// Records one try of the step, `elapsed` long, and, when it failed and `retried`, that it
    /// is tried again in place.
    pub(crate) fn tried(&self, elapsed: Duration, failed: bool, retried: bool) {
        histogram!(STEP_SECONDS, self.labels().to_vec()).record(elapsed.as_secs_f64());
        if failed && retried {
            counter!(STEP_RETRIES_TOTAL, self.labels().to_vec()).increment(1);
        }
    }

    /// Records the step's end: its output recorded (`ok`) or its last try failed.
    pub(crate) fn ended(&self, ok: bool) {
        let mut labels = self.labels().to_vec();
        labels.push(Label::from_static_parts(
            STATUS,
            if ok { OK } else { FAILED },
        ));
        counter!(STEPS_TOTAL, labels).increment(1);
    }
}

/// A try waiting for the named limit `limit`: counted in [`LIMIT_WAITERS`] from
/// [`LimitWait::start`] until [`LimitWait::end`] (or its drop, when the wait is cancelled),
/// which records the wait in [`LIMIT_WAIT_SECONDS`].
pub(crate) struct LimitWait {
    limit: SharedString,
    started: std::time::Instant,
    ended: bool,
}

impl LimitWait {
    /// Starts the wait of a try for `limit`.
    pub(crate) fn start(limit: &str) -> LimitWait {
        let limit = SharedString::from_shared(std::sync::Arc::<str>::from(limit));
        gauge!(LIMIT_WAITERS, LIMIT => limit.clone()).increment(1.0);
        LimitWait {
            limit,
            started: std::time::Instant::now(),
            ended: false,
        }
    }

    /// Ends the wait: the limit was taken. Returns how long the try waited.
    pub(crate) fn end(mut self) -> Duration {
        self.ended = true;
        let waited = self.started.elapsed();
        gauge!(LIMIT_WAITERS, LIMIT => self.limit.clone()).decrement(1.0);
        histogram!(LIMIT_WAIT_SECONDS, LIMIT => self.limit.clone()).record(waited.as_secs_f64());
        waited
    }
}

impl Drop for LimitWait {
    fn drop(&mut self) {
        if !self.ended {
            gauge!(LIMIT_WAITERS, LIMIT => self.limit.clone()).decrement(1.0);
        }
    }
}

/// Records a commit transaction of `writes` writes in the store `store` (`"redb"` or
/// `"postgres"`). For stores: the redb store records each group commit, the PostgreSQL store
/// each committed write (one per transaction).
pub fn commit_batch(store: &'static str, writes: usize) {
    histogram!(COMMIT_BATCH_SIZE, STORE => store).record(writes as f64);
}

/// Records a scheduled retention pass that removed `runs` runs.
pub(crate) fn pruned(runs: u64) {
    counter!(PRUNED_RUNS_TOTAL).increment(runs);
    histogram!(PRUNE_PASS_RUNS).record(runs as f64);
}

/// Sets [`RUNS`] of `workflow` for every status, from `counts` (indexed as [`STATUSES`]),
/// and [`RUNS_PARKED`] to `parked`.
pub(crate) fn set_runs(workflow: &str, counts: [u64; 6], parked: u64) {
    let workflow = SharedString::from_shared(std::sync::Arc::<str>::from(workflow));
    for (status, count) in STATUSES.iter().zip(counts) {
        gauge!(RUNS, WORKFLOW => workflow.clone(), STATUS => status.as_str()).set(count as f64);
    }
    gauge!(RUNS_PARKED, WORKFLOW => workflow).set(parked as f64);
}

/// The `metrics` facade crate loops records through: install a recorder with this crate's
/// `set_global_recorder` (or use a recorder crate built for the same version).
pub use ::metrics as facade;

/// The Prometheus exporter (feature `prometheus`): build its recorder with
/// `prometheus::PrometheusBuilder::new().build_recorder()`, install it, and give its handle
/// to [`RuntimeBuilder::prometheus`](crate::RuntimeBuilder::prometheus).
#[cfg(feature = "prometheus")]
pub use metrics_exporter_prometheus as prometheus;
