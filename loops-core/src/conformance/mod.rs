//! The store conformance suite: what every [`Store`] must do, as cases a store runs against
//! itself (cargo feature `conformance`; `loops::conformance` in the facade crate, whose
//! feature of the same name turns it on).
//!
//! Each [`Case`] drives a fresh, empty store through the [`Store`] trait alone and asserts
//! exact values: every [`Write`](crate::store::Write)'s effect on the run's row and records,
//! every refusal with the run, sequence number and status it names, the reads, leases and
//! fencing, [`claim_ready`](crate::Store::claim_ready), pruning and byte-exact payloads. The redb
//! store (on a file and in memory) and the PostgreSQL store pass every case; a store that
//! passes them all gives the runtime what it relies on.
//!
//! # Running it against a store
//! Give the suite a *factory*: an async function that takes the case's name and returns a
//! [`Factory`] on a fresh, empty store, kept alive (with any files or database schema it
//! uses) until the case ends. [`conformance_suite!`](crate::conformance_suite) turns it into
//! one `#[test]` per case, named after the case. `Arc<S>` is the factory of a store with one
//! handle:
//!
//! ```
//! use std::sync::Arc;
//!
//! use loops_core::RedbStore;
//!
//! /// A fresh store for each case.
//! async fn fresh(_case: &'static str) -> Arc<RedbStore> {
//!     Arc::new(RedbStore::in_memory().expect("an in-memory store"))
//! }
//!
//! // In a test file: `create_and_read`, `leases`, ... each a `#[test]`.
//! loops_core::conformance_suite!(fresh);
//! # fn main() {}
//! ```
//!
//! A store shared by several workers (its leases lapse: [`Store::lease_ttl`] is `Some`) must
//! also give a second handle on the same data, as a second worker would open it, for the
//! cases of leases, fencing and claims:
//!
//! ```
//! use std::sync::Arc;
//!
//! use loops_core::conformance::Factory;
//! use loops_core::{BoxFuture, Store};
//! # use loops_core::RedbStore as MyStore;
//! # async fn open_my_store(_database: &str) -> MyStore { MyStore::in_memory().unwrap() }
//!
//! struct Shared {
//!     /// A database of this case's own, so that cases run in parallel.
//!     database: String,
//!     store: Arc<MyStore>,
//! }
//!
//! impl Factory for Shared {
//!     fn store(&self) -> Arc<dyn Store> {
//!         self.store.clone()
//!     }
//!
//!     fn second(&self) -> BoxFuture<'_, Option<Arc<dyn Store>>> {
//!         Box::pin(async { Some(Arc::new(open_my_store(&self.database).await) as Arc<dyn Store>) })
//!     }
//! }
//!
//! async fn fresh(case: &'static str) -> Shared {
//!     let database = format!("conformance_{case}");
//!     let store = Arc::new(open_my_store(&database).await);
//!     Shared { database, store }
//! }
//!
//! loops_core::conformance_suite!(fresh);
//! # fn main() {}
//! ```
//!
//! A failing case fails its test with the assertion that broke (its file and line name the
//! case's step). A case that only makes sense for a store whose leases lapse passes as
//! [skipped](Outcome::Skipped) on a store whose leases never lapse, and says so on stderr
//! (`cargo test -- --nocapture` shows it). To run the cases another way (one test, a harness
//! of your own), loop over [`Case::ALL`] with [`run`], or await [`Case::check`] on a runtime
//! of your own.
//!
//! Cases wait past short lease times (never measure them): a store's lease time should be
//! about a second for the suite to run in a few seconds.
//!
//! [`Store`]: crate::Store
//! [`Store::lease_ttl`]: crate::Store::lease_ttl
// The cases are test code: a panic is how a case reports what broke.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;

#[cfg(doc)]
use crate::store::Store;

mod attributes;
mod children;
mod data;
mod evolve;
mod factory;
mod leases;
mod runs;
mod schedules;
mod support;
mod waits;
mod writes;

pub use self::factory::{Factory, Outcome, Sealed};

/// One case of the suite: what it checks is on each variant. Its [`name`](Case::name) is
/// the name of its test in [`conformance_suite!`](crate::conformance_suite).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Case {
    /// `create_and_read`: a run that does not exist reads as nothing; a created run's row,
    /// latest record, history and schema text read back as written; a second create of the
    /// same id is refused ([`SequenceConflict`](crate::Error::SequenceConflict)) and changes
    /// nothing; [`list`](crate::Store::list) reads runs by status, optionally of one workflow, in
    /// run id order, and [`count_runs`](crate::Store::count_runs) counts them by workflow and
    /// status.
    CreateAndRead,
    /// `transitions_append_in_order`: a transition must take the run's next sequence number
    /// (else [`Fenced`](crate::Error::Fenced), naming the run's current seq and status); a
    /// terminal state completes the run, which takes no more transitions; history, latest,
    /// the status index and the counts follow; a transition of an unknown run is
    /// [`RunNotFound`](crate::Error::RunNotFound).
    TransitionsAppendInOrder,
    /// `steps_are_immutable`: a step is recorded once per (name, occurrence) (again is
    /// [`StepExists`](crate::Error::StepExists)), and read back by name, then occurrence; a
    /// step of a state the run has left is fenced and adds nothing; a step of an unknown run
    /// is `RunNotFound`. In a state of 121 steps (failures between them), every key is
    /// refused again, newest, oldest or between, also when copies come at once; the next
    /// state's keys, and those of a run id pruned and created again, start afresh.
    /// [`Store::all_steps`] answers what `steps` answers
    /// for each seq, by seq (nothing for an unknown run).
    StepsAreImmutable,
    /// `failures_and_attempts`: a failure keeps its record, sets the row's error and retry
    /// time, and is fenced at a seq the run is not at; beginning an attempt counts attempts,
    /// records an attempt that left no failure as interrupted, fails the run when the
    /// failures or interruptions allowed are used up, and changes nothing on a run that is
    /// not running; a failure that gives up fails the run, which takes no more failures.
    FailuresAndAttempts,
    /// `cancel_and_retry`: a cancellation is asked for, then ended by the run's driver, or
    /// ends an idle run at once; an ended run cannot be cancelled
    /// ([`RunEnded`](crate::Error::RunEnded)); only a failed run can be retried
    /// ([`NotFailed`](crate::Error::NotFailed)), and a retry gives it a fresh budget of
    /// attempts from its attempt base; unknown runs are `RunNotFound`.
    CancelAndRetry,
    /// `events_and_waits`: events get sequence numbers per run, once per idempotency key; a
    /// wait delivers the oldest pending event of its name and records it as its step (never
    /// twice), parks the run (status waiting, with what it waits for) when there is none,
    /// ends when its deadline passed; a sleep parks until its time; an ended run takes no
    /// events; delivered events stay readable, marked delivered.
    EventsAndWaits,
    /// `wake`: waking a waiting run at its current seq makes it running and clears its wait;
    /// a wake of a run that is not waiting, or at another seq, changes nothing.
    Wake,
    /// `leases`: where leases lapse, one worker holds a run's lease at a time, a worker that
    /// takes its own lease again gets a new token (the old one no longer renews), release
    /// frees the run at once (a stale token's release does nothing), a lapsed lease does not
    /// renew and another worker takes the run, renewal moves the expiry on and answers only
    /// the live leases; where leases never lapse, every lease is granted, has no expiry and
    /// renews, and the factory gives no second handle.
    Leases,
    /// `fenced_writes_leave_no_trace`: every write under a lapsed lease (or another run's
    /// lease) is refused as `Fenced` and changes nothing; the new holder's writes commit; a
    /// create under a lapsed lease is fenced too. Skipped for a store whose leases never
    /// lapse.
    FencedWritesLeaveNoTrace,
    /// `claim_ready`: claims return the running runs, and the waiting runs whose event came
    /// or whose time passed, of the workflows asked for, at most the limit, each with a lease
    /// of its own; a store shared by several workers hands each run to one of them at a time.
    ClaimReady,
    /// `prune`: only ended runs are pruned, with every record, step, failure, event and
    /// index entry; [`prune`](crate::store::prune) keeps the newest runs a policy keeps (ties
    /// broken by run id) and its dry run counts what it then removes; a pruned run id (and
    /// its events' idempotency keys) can be used again.
    Prune,
    /// `payloads_read_back_byte_for_byte`: record payloads, step outputs and event payloads
    /// read back exactly as written (key order, spacing, escapes, number forms), and run ids
    /// of 256 bytes work.
    PayloadsReadBackByteForByte,
    /// `block_and_unblock`: a block makes a run blocked with its reason, changes, schema,
    /// time and the status to resume; listed as blocked, never claimed; blocked again for the
    /// same schema and reason changes nothing, for another reason takes the new one; a
    /// driver's writes in the state are fenced; a block for a schema the run no longer has
    /// changes nothing; unblocking restores the status it had (waiting with its wait) and
    /// is a no-op on a run that is not blocked; a blocked run is cancelled at once (its row
    /// then neither blocked nor waiting); an ended
    /// run cannot be blocked ([`RunEnded`](crate::Error::RunEnded)).
    BlockAndUnblock,
    /// `migrations`: a migration needs the row at its seq (else `Fenced`), a record for the
    /// next seq continuing the state's seq from the run's schema (else
    /// [`MigrationRefused`](crate::Error::MigrationRefused)); it appends its record (byte for
    /// byte), moves the row to its state and schema with `entered` at the old state's seq,
    /// unblocks the run and stores the new schema's description; the state's steps stay
    /// under its seq; the next transition leaves it. An acceptance, written as a migration
    /// marked accepted, moves the row to the accepting schema and stores its description.
    /// [`list_of_schemas`](crate::Store::list_of_schemas) lists the runs of a status and
    /// workflow by the schema in their rows. A migration into a terminal state ends the run
    /// there (completed, neither waiting nor blocked), sends its parent the child's end in
    /// the same commit, and the run takes no further write.
    Migrations,
    /// A runtime given a retention policy and an interval
    /// ([`RuntimeBuilder::retention_interval`](crate::RuntimeBuilder::retention_interval))
    /// removes, while it serves, the ended runs there were when it started and those that end
    /// later, and keeps the runs that have not ended.
    ScheduledRetention,
    /// `sealing_keys`: a new store lists no key; [`Write::Seal`](crate::store::Write::Seal)
    /// adds a key id once (a key recorded again keeps its place), the list comes oldest
    /// first, a second handle sees it, and a prune leaves it.
    SealingKeys,
    /// Attributes given at a run's creation and set by its driver read back exactly; setting
    /// a key again replaces its value and index entry; a search by equality, by an integer
    /// or time range, and combined with status, workflow, last change and a second
    /// attribute returns exactly the runs that match, by run id, with their attributes; the
    /// row is unchanged; a pruned run's attributes go with it.
    AttributesSearch,
    /// Invalid attribute keys and values are refused with the run, state and seq (one bad
    /// attribute refuses the write, and a creation with one creates nothing); a seq the run
    /// left, an old lease and an ended run are fenced; nothing refused is written.
    AttributesRefused,
    /// A child run's end (a terminal transition, a failure that gives up, a cancellation)
    /// appends `loops:child-ended` (`{"child": ID}`) to its parent's inbox in the commit
    /// that ends it; an ended parent gets nothing, and the child's write is not refused for
    /// it. `Store::children` lists a run's children, with their links, by run id.
    ChildEndWakesParent,
    /// A parent's cancellation, in its one commit, ends its waiting children (policy
    /// cancel), asks its running children to stop, leaves its abandoned children alone, and
    /// cascades through grandchildren; the children that ended wake their parents.
    CancelCascades,
    /// `prune_families`: [`prune`](crate::store::prune) keeps or removes a run with its
    /// children and grandchildren, as one run that ended when the last of them did (each
    /// parent listed and removed before its children); a child whose parent or grandparent
    /// has not ended, or whose failed parent `keep_failed` keeps, is kept and counted; a
    /// child whose parent is gone is a run of its own;
    /// a [`Write::Prune`](crate::store::Write::Prune) naming a family with a run that has
    /// not ended deletes none of it.
    PruneFamilies,
    /// `schedules`: a registration stores its row as given; registered again, it takes the
    /// new spec and policy and keeps its pause, ticks and creation time; ticks move
    /// `through_ms` and `last_tick_ms` forward only; resuming settles the paused ticks; the
    /// list comes by name, the same from a second handle; a removed schedule is gone and a
    /// late tick does not bring it back.
    Schedules,
    /// `schedules_refused`: bad names and specs are refused
    /// ([`InvalidSchedule`](crate::Error::InvalidSchedule)), pausing or removing a schedule
    /// that does not exist is [`ScheduleNotFound`](crate::Error::ScheduleNotFound), nothing
    /// refused is written; two handles registering one schedule at once both succeed and
    /// leave one row.
    SchedulesRefused,
}

impl Case {
    /// Every case, in the order of their tests.
    pub const ALL: [Case; 23] = [
        Case::CreateAndRead,
        Case::TransitionsAppendInOrder,
        Case::StepsAreImmutable,
        Case::FailuresAndAttempts,
        Case::CancelAndRetry,
        Case::EventsAndWaits,
        Case::Wake,
        Case::Leases,
        Case::FencedWritesLeaveNoTrace,
        Case::ClaimReady,
        Case::Prune,
        Case::PayloadsReadBackByteForByte,
        Case::BlockAndUnblock,
        Case::Migrations,
        Case::ScheduledRetention,
        Case::SealingKeys,
        Case::AttributesSearch,
        Case::AttributesRefused,
        Case::ChildEndWakesParent,
        Case::CancelCascades,
        Case::PruneFamilies,
        Case::Schedules,
        Case::SchedulesRefused,
    ];

    /// The case's name (`"create_and_read"`): the name of its test.
    pub fn name(self) -> &'static str {
        match self {
            Case::CreateAndRead => "create_and_read",
            Case::TransitionsAppendInOrder => "transitions_append_in_order",
            Case::StepsAreImmutable => "steps_are_immutable",
            Case::FailuresAndAttempts => "failures_and_attempts",
            Case::CancelAndRetry => "cancel_and_retry",
            Case::EventsAndWaits => "events_and_waits",
            Case::Wake => "wake",
            Case::Leases => "leases",
            Case::FencedWritesLeaveNoTrace => "fenced_writes_leave_no_trace",
            Case::ClaimReady => "claim_ready",
            Case::Prune => "prune",
            Case::PayloadsReadBackByteForByte => "payloads_read_back_byte_for_byte",
            Case::BlockAndUnblock => "block_and_unblock",
            Case::Migrations => "migrations",
            Case::ScheduledRetention => "scheduled_retention",
            Case::SealingKeys => "sealing_keys",
            Case::AttributesSearch => "attributes_search",
            Case::AttributesRefused => "attributes_refused",
            Case::ChildEndWakesParent => "child_end_wakes_parent",
            Case::CancelCascades => "cancel_cascades",
            Case::PruneFamilies => "prune_families",
            Case::Schedules => "schedules",
            Case::SchedulesRefused => "schedules_refused",
        }
    }

    /// Runs the case against `factory`'s store, on the caller's tokio runtime (which must
    /// have its time driver enabled; a multi-threaded one, as some cases spawn a task).
    ///
    /// # Panics
    /// When the store does not do what the case checks: the panic is the failed assertion.
    pub async fn check(self, factory: &dyn Factory) -> Outcome {
        match self {
            Case::CreateAndRead => runs::create_and_read(factory).await,
            Case::TransitionsAppendInOrder => runs::transitions_append_in_order(factory).await,
            Case::StepsAreImmutable => runs::steps_are_immutable(factory).await,
            Case::FailuresAndAttempts => runs::failures_and_attempts(factory).await,
            Case::CancelAndRetry => runs::cancel_and_retry(factory).await,
            Case::EventsAndWaits => waits::events_and_waits(factory).await,
            Case::Wake => waits::wake(factory).await,
            Case::Leases => leases::leases(factory).await,
            Case::FencedWritesLeaveNoTrace => {
                return leases::fenced_writes_leave_no_trace(factory).await;
            }
            Case::ClaimReady => leases::claim_ready(factory).await,
            Case::Prune => data::prune(factory).await,
            Case::PayloadsReadBackByteForByte => {
                data::payloads_read_back_byte_for_byte(factory).await
            }
            Case::BlockAndUnblock => evolve::block_and_unblock(factory).await,
            Case::Migrations => {
                evolve::migrations(factory).await;
                evolve::migration_into_a_terminal_state(factory).await;
            }
            Case::ScheduledRetention => data::scheduled_retention(factory).await,
            Case::SealingKeys => data::sealing_keys(factory).await,
            Case::AttributesSearch => attributes::attributes_search(factory).await,
            Case::AttributesRefused => attributes::attributes_refused(factory).await,
            Case::ChildEndWakesParent => children::child_end_wakes_parent(factory).await,
            Case::CancelCascades => children::cancel_cascades(factory).await,
            Case::PruneFamilies => {
                children::prune_families(factory).await;
                children::prune_kept_for_parents(factory).await;
            }
            Case::Schedules => schedules::schedules(factory).await,
            Case::SchedulesRefused => schedules::schedules_refused(factory).await,
        }
        Outcome::Passed
    }
}

/// Runs `case` against a store of `make` (called with the case's name, on the runtime),
/// on a multi-threaded tokio runtime of its own with two workers; the factory is dropped on
/// that runtime when the case ends. A skipped case is reported on stderr. This is what each
/// test of [`conformance_suite!`](crate::conformance_suite) calls.
///
/// # Panics
/// When the store does not do what the case checks (the failed assertion), and if the
/// runtime cannot be built (the system refuses threads).
pub fn run<M, Fut, F>(case: Case, make: M) -> Outcome
where
    M: FnOnce(&'static str) -> Fut,
    Fut: Future<Output = F>,
    F: Factory,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for the conformance case");
    let outcome = runtime.block_on(async {
        let factory = make(case.name()).await;
        let outcome = case.check(&factory).await;
        drop(factory);
        outcome
    });
    if let Outcome::Skipped(reason) = outcome {
        eprintln!("conformance case `{}` skipped: {reason}", case.name());
    }
    outcome
}

/// Expands to one `#[test]` per [`Case`](crate::conformance::Case) of the conformance suite,
/// named after the case, each running it with [`run`](crate::conformance::run) against a
/// store of `factory`: an expression callable as `factory(case_name)` (an async fn or a
/// closure returning a future) giving a [`Factory`](crate::conformance::Factory) on a fresh,
/// empty store. Put it in a module of its own to run the suite on several stores in one test
/// file. See [the module](crate::conformance) for examples.
#[macro_export]
macro_rules! conformance_suite {
    ($factory:expr $(,)?) => {
        $crate::__conformance_tests! {
            $factory;
            create_and_read => CreateAndRead,
            transitions_append_in_order => TransitionsAppendInOrder,
            steps_are_immutable => StepsAreImmutable,
            failures_and_attempts => FailuresAndAttempts,
            cancel_and_retry => CancelAndRetry,
            events_and_waits => EventsAndWaits,
            wake => Wake,
            leases => Leases,
            fenced_writes_leave_no_trace => FencedWritesLeaveNoTrace,
            claim_ready => ClaimReady,
            prune => Prune,
            payloads_read_back_byte_for_byte => PayloadsReadBackByteForByte,
            block_and_unblock => BlockAndUnblock,
            migrations => Migrations,
            scheduled_retention => ScheduledRetention,
            sealing_keys => SealingKeys,
            attributes_search => AttributesSearch,
            attributes_refused => AttributesRefused,
            child_end_wakes_parent => ChildEndWakesParent,
            cancel_cascades => CancelCascades,
            prune_families => PruneFamilies,
            schedules => Schedules,
            schedules_refused => SchedulesRefused,
        }
    };
}

/// The tests of [`conformance_suite!`]; not a public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($factory:expr; $($name:ident => $case:ident,)*) => {
        $(
            #[test]
            fn $name() {
                ::core::assert_eq!(::core::stringify!($name), $crate::conformance::Case::$case.name());
                $crate::conformance::run($crate::conformance::Case::$case, $factory);
            }
        )*
        // Every case has its test: a case missing from the list above fails to compile here.
        const _: fn($crate::conformance::Case) = |case| match case {
            $($crate::conformance::Case::$case => {})*
        };
    };
}
