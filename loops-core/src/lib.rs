//! loops-core: the runtime, the redb store and the traits of loops.
//!
//! Users depend on the facade crate `loops`, which re-exports everything here together with
//! `#[derive(Workflow)]`; see its documentation for a runnable example.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod attribute;
mod bidi;
mod clock;
mod codec;
#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "control")]
pub mod control;
mod error;
mod event;
mod failpoint;
mod hint;
mod limit;
mod material;
pub mod metrics;
mod migrate;
mod names;
mod panics;
mod record;
mod retention;
mod retry;
mod route;
mod row;
mod run;
mod runtime;
mod schedule;
mod schema;
mod status;
mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod workflow;

#[cfg(test)]
mod tests;

pub use attribute::{
    AttributeFilter, AttributeValue, Attributes, MAX_ATTRIBUTE_KEY_BYTES,
    MAX_ATTRIBUTE_STRING_BYTES, RESERVED_ATTRIBUTE_PREFIX, RunFilter, check_attribute,
};
pub use clock::{Clock, ManualClock, duration_ms, epoch_ms, ms_after};
pub use codec::{
    CodecError, Keyring, KeyringError, PayloadCodec, Place, Sealed, envelope, parse_envelope,
    redacted,
};
pub use error::{Error, Holder, NO_KEY_HINT, RecordKind, Result, error_chain, retry_hint};
pub use event::{Event, EventName};
pub use hint::{Hinted, RetryHint};
pub use limit::{Admission, Limit};
pub use migrate::{
    Chain, Migrate, Migrated, Migration, MigrationError, MigrationFailure, SameWorkflow,
    StoredVersion, Versioned,
};
pub use names::{
    CHILD_ENDED, MAX_NAME_BYTES, MAX_RUN_ID_BYTES, RESERVED_PREFIX, escape_bidi_controls,
    is_bidi_control, replace_bidi_controls, validate_run_id, validate_run_id_lookup,
};
pub use panics::silence_caught_redb_panics;
pub use record::wait::{set_aside_events, taken_event, wait_step_name, waited_event};
pub use record::{
    FailureRecord, FailureSource, MigratedFrom, StepRecord, Transition, TransitionRecord, now_ms,
};
pub use retention::RetentionPolicy;
pub use retry::{DEFAULT_MAX_INTERRUPTIONS, RetryPolicy};
pub use route::{Blocked, KnownVersion, Route, StoredRun, route};
pub use row::{BlockInfo, INTERRUPTED, OnParentCancel, ParentLink, interrupted_attempt};
pub use run::context::{ChildError, ChildOptions, ChildRun, Context, StepOptions, StepOutput};
pub use run::dispatch::Dispatch;
pub use run::settings::{DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_PARK_THRESHOLD};
pub use runtime::{
    DEFAULT_METRICS_INTERVAL, DEFAULT_RETENTION_INTERVAL, Drained, MAX_CANCEL_REASON_BYTES,
    Resumed, Routed, Runtime, RuntimeBuilder, ScheduleStatus, Sent, StartOptions,
    check_cancel_reason, check_event,
};
pub use schedule::{
    CatchUp, InvalidSchedule, MAX_CATCH_UP, MAX_SCHEDULE_NAME_BYTES, SCHEDULE_ATTRIBUTE, Schedule,
    ScheduleInfo, Tick, check_schedule_name, tick_run_id,
};
pub use schema::{
    Change, Class, DeclaredEvent, DeclaredEvents, Enum, EventRefusal, EventShape, FORMAT_VERSION,
    Field, FieldFlags, Fields, ParseSchemaHashError, Repr, Schema, SchemaDiff, SchemaHash, Shape,
    StateShape, Struct, Variant, WorkflowShape, schema_diff,
};
pub use store::{
    AfterFailure, AttemptFailures, BoxFuture, ClaimFilter, Compacted, CurrentLease,
    DEFAULT_CACHE_BYTES, Effects, EventRecord, Facts, InboxChange, KEY_SEARCH_RUNS, KeyRead,
    KeySearch, Lease, LeaseCheck, Needs, ParkedRun, Payloads, PendingEvent, Pruned, Readiness,
    Ready, ReadyAndParked, Record, RecordKey, RedbStore, Reply, RowWrite, RunCount, RunInfo,
    RunStatus, STORE_FORMAT, ScheduleChange, SeqStep, SharedLimits, Store, StoreOptions, Take,
    Upgraded, WaitInfo, WaitOutcome, Wakeups, Write, check_keys, event_record, find_runs, plan,
    prune, prune_reporting, refuse_foreign_codec, seals_as_store_does,
};
pub use workflow::{BoxError, StateId, Workflow};

// A `Context` outside any run, for tests of handlers (feature `test-util`).
#[cfg(feature = "test-util")]
#[doc(hidden)]
pub use run::test_util::__for_tests;
// A wall clock moved by an offset, for tests of a worker whose clock is off.
#[cfg(feature = "test-util")]
#[doc(hidden)]
pub use record::__set_clock_offset_ms;

/// Items used by code that `#[derive(Workflow)]` and `#[derive(Schema)]` generate. Not a
/// public API: no stability promise, may change in any release.
///
/// The generated code names loops only through this module (`{path}::__private::...`, where
/// `path` is `::loops` or the derive's `crate = path`): a path that is not loops then fails
/// to resolve at this one segment, which the compiler reports once, at the path.
#[doc(hidden)]
pub mod __private {
    pub use serde;

    pub use crate::hint::handler_error;
    pub use crate::migrate::{Named, SameName};
    pub use crate::schema::__describe::{describe, describe_len, utf8};
    pub use crate::workflow::read_event_as;
    pub use crate::{
        BoxError, Context, Dispatch, Event, Schema, SchemaHash, StateId, Versioned, Workflow,
    };

    /// The shapes that `Schema` impls and `Workflow::SCHEMA_HASH` are built from.
    pub mod schema {
        pub use crate::schema::{
            Enum, EventShape, Field, FieldFlags, Fields, Repr, Shape, StateShape, Struct, Variant,
            WorkflowShape,
        };
    }

    /// The error a dispatch of a terminal state returns (the runtime never dispatches one).
    pub fn terminal_dispatched(workflow: &'static str, state: &'static str) -> crate::BoxError {
        format!("workflow `{workflow}`: state `{state}` is terminal and has no handler").into()
    }
}
