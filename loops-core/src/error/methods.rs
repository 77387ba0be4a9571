//! [`Error`]'s constructors and queries: what a caller asks of an error (is it transient,
//! which run, which hint, which store cause) and how loops builds the common ones.

use super::*;

impl Error {
    /// An [`Error::Database`]: `action` says what the store was doing, `source` is the
    /// database client's error.
    pub fn database(
        action: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Database {
            action: action.into(),
            cause: Arc::new(source),
        }
    }

    /// An [`Error::CounterOverflow`]: `counter` (`value`, read from `record` of `run_id` at
    /// `seq`) has no successor, which `action` needed.
    pub(crate) fn counter_overflow(
        run_id: &str,
        (record, seq): (RecordKind, u64),
        counter: &'static str,
        value: u64,
        action: &'static str,
    ) -> Self {
        Error::CounterOverflow {
            run_id: run_id.to_owned(),
            record,
            seq,
            counter,
            value,
            action,
        }
    }

    /// An [`Error::Storage`] from a redb error (converted to `redb::Error`, so that a caller
    /// who downcasts the source finds one type).
    pub(crate) fn storage(action: impl Into<String>, source: impl Into<redb::Error>) -> Self {
        Error::Storage {
            action: action.into(),
            cause: Arc::new(source.into()),
        }
    }

    /// Whether the same call may succeed if it is made again later, unchanged: the store
    /// could not be reached or failed on the system (an I/O error, a lost connection:
    /// [`Storage`](Error::Storage), [`Database`](Error::Database)), the store file is open
    /// elsewhere ([`StoreLocked`](Error::StoreLocked)), or another driver in this process
    /// holds the run for now ([`RunActive`](Error::RunActive)). Every other error is about
    /// the request, the run or the stored records, and repeats until one of those changes.
    /// A write that failed transiently may still have committed when the connection was lost
    /// during its commit (see [`Database`](Error::Database)); the writes of loops are made so
    /// that repeating them is safe.
    pub fn is_transient(&self) -> bool {
        self.is_store_fault() || matches!(self, Error::StoreLocked { .. } | Error::RunActive { .. })
    }

    /// The run the error is about, when there is one.
    pub fn run_id(&self) -> Option<&str> {
        match self {
            Error::InvalidRunId { run_id, .. }
            | Error::InvalidName { run_id, .. }
            | Error::InvalidAttribute { run_id, .. }
            | Error::RunNotFound { run_id }
            | Error::WorkflowMismatch { run_id, .. }
            | Error::ChildConflict { run_id, .. }
            | Error::SchemaMismatch { run_id, .. }
            | Error::RunActive { run_id, .. }
            | Error::MigrationRefused { run_id, .. }
            | Error::RunBlocked { run_id, .. }
            | Error::NotInitial { run_id, .. }
            | Error::SequenceConflict { run_id, .. }
            | Error::RecordMissing { run_id, .. }
            | Error::StepExists { run_id, .. }
            | Error::Fenced { run_id, .. }
            | Error::LeaseExpired { run_id, .. }
            | Error::IllegalTransition { run_id, .. }
            | Error::EventEncode { run_id, .. }
            | Error::EventRefused { run_id, .. }
            | Error::Encode { run_id, .. }
            | Error::Decode { run_id, .. }
            | Error::Payload { run_id, .. }
            | Error::SealedRefused { run_id, .. }
            | Error::PayloadTooLarge { run_id, .. }
            | Error::CounterOverflow { run_id, .. }
            | Error::RunFailed { run_id, .. }
            | Error::RunCancelled { run_id, .. }
            | Error::RunEnded { run_id, .. }
            | Error::NotFailed { run_id, .. }
            | Error::StepDecode { run_id, .. }
            | Error::EventDecode { run_id, .. }
            | Error::StepEncode { run_id, .. }
            | Error::StepTimeout { run_id, .. }
            | Error::StateTimeout { run_id, .. }
            | Error::HandlerPanicked { run_id, .. }
            | Error::StepFailed { run_id, .. }
            | Error::Cancelled { run_id, .. } => Some(run_id),
            Error::StoreLocked { .. }
            | Error::StoreFormat { .. }
            | Error::NeedsRecovery { .. }
            | Error::ReadOnly { .. }
            | Error::Open { .. }
            | Error::Storage { .. }
            | Error::Database { .. }
            | Error::NotRegistered { .. }
            | Error::ScheduleNotFound { .. }
            | Error::InvalidSchedule { .. }
            | Error::Permanent { .. }
            | Error::RetryAfter { .. }
            | Error::AcceptsRefused { .. }
            | Error::Encrypted { .. }
            | Error::KeyNotInStore { .. }
            | Error::KeyMismatch { .. }
            | Error::Closed => None,
        }
    }
}

impl Error {
    /// Whether the error comes out the same at every try of a handler, whatever time passes:
    /// a bad run id or name, a child id taken by another run, a workflow no process here
    /// drives, a state that is not the initial one, an event the workflow does not declare
    /// (or a payload not of its declared shape, or sealed with a key this runtime cannot
    /// open), a state, step output or payload that
    /// cannot be recorded (over [`max_payload_bytes`](crate::RuntimeBuilder::max_payload_bytes),
    /// or not encodable as JSON that decodes back), and a recorded state or step output that
    /// does not decode (the code changed since, or the store was altered: a deploy, then
    /// `loops retry`). [`retry_hint`](crate::retry_hint) calls such an error
    /// permanent: a step that returns one is not tried again, and a handler that returns one
    /// (with `?`) fails its run at once instead of spending its retries, as if it were marked
    /// [`permanent`](Self::permanent). A step whose output cannot be recorded has run its
    /// effect already: each further try would run it again for a record that cannot be made.
    /// `loops retry` (after a deploy that raised the limit, say) tries again.
    pub fn repeats(&self) -> bool {
        matches!(
            self,
            Error::InvalidRunId { .. }
                | Error::InvalidName { .. }
                | Error::InvalidAttribute { .. }
                | Error::ChildConflict { .. }
                | Error::NotRegistered { .. }
                | Error::NotInitial { .. }
                | Error::PayloadTooLarge { .. }
                | Error::StepEncode { .. }
                | Error::StepDecode { .. }
                | Error::Encode { .. }
                | Error::Decode { .. }
                | Error::EventRefused { .. }
                | Error::SealedRefused { .. }
        )
    }

    /// What is wrong with the store file at `path` when it needs redb's repair: the one
    /// wording of [`NeedsRecovery`](Error::NeedsRecovery) and of the `loops` CLI's notes
    /// about such a file, whichever command meets it.
    pub fn needs_repair(path: &std::path::Path) -> String {
        format!(
            "store {} needs redb's repair (its process stopped without closing it, or the file was changed since: its length is not the one its header records)",
            path.display()
        )
    }

    /// Whether the error is a fault of the store while it was in use: a read or a commit
    /// that failed on the system, a lost connection ([`Storage`](Error::Storage),
    /// [`Database`](Error::Database)), rather than about the run, the request or the stored
    /// records. A driver rides such a fault out (it backs off and reads the run again, and
    /// the handler's attempt is not counted as failed); each is [transient](Self::is_transient)
    /// and has a [`store_cause`](Self::store_cause). The one place that says which errors
    /// are store faults.
    pub fn is_store_fault(&self) -> bool {
        matches!(self, Error::Storage { .. } | Error::Database { .. })
    }

    /// A copy of this error if it [is a store fault](Self::is_store_fault) (the cause is
    /// shared), for a driver that finds one inside a handler's error; `None` otherwise.
    pub(crate) fn store_fault_copy(&self) -> Option<Error> {
        match self {
            Error::Storage { action, cause } => Some(Error::Storage {
                action: action.clone(),
                cause: Arc::clone(cause),
            }),
            Error::Database { action, cause } => Some(Error::Database {
                action: action.clone(),
                cause: Arc::clone(cause),
            }),
            _ => None,
        }
    }

    /// The underlying error of a store's failure ([`Open`](Error::Open),
    /// [`Storage`](Error::Storage), [`Database`](Error::Database)), whose message names it
    /// already: for a caller who downcasts it (the `std::io::Error` of a full disk, inside
    /// redb's error). `None` for every other error.
    pub fn store_cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Error::Open { cause, .. } => Some(&**cause),
            Error::Storage { cause, .. } | Error::Database { cause, .. } => Some(&**cause),
            _ => None,
        }
    }

    /// The message and the messages of its `source()` chain, joined by `": "`: the whole
    /// story in one line, for logs and command-line tools.
    pub fn chain(&self) -> String {
        error_chain(self).join(": ")
    }
}

impl Error {
    /// Marks `error` permanent: a step's closure or a handler returns it (through `?` or
    /// `.into()`) for a failure that no retry will fix (a refusal, a 4xx other than 429, a
    /// malformed request). The step is not tried again by its retry policy, and the state's
    /// attempt that fails with it is its last: the run fails, unless the handler catches the
    /// error (see [`Error::hint`]) and moves to a state of its own.
    pub fn permanent(error: impl Into<BoxError>) -> Error {
        Error::Permanent {
            source: Hinted::new(true, None, error.into()),
        }
    }

    /// Gives `error` a retry-after hint (an HTTP `Retry-After`): the next try of the step,
    /// or the next attempt at the state, waits at least `after` (its policy's back-off when
    /// that is longer). A wait at or over the runtime's park threshold parks the run durably.
    pub fn retry_after(error: impl Into<BoxError>, after: Duration) -> Error {
        Error::RetryAfter {
            after_ms: crate::clock::duration_ms(after),
            source: Hinted::new(false, Some(after), error.into()),
        }
    }

    /// The retry hints in this error's chain: [`retry_hint`] of it. A handler that catches a
    /// step's error checks `err.hint().permanent` to route to a state of its own.
    pub fn hint(&self) -> RetryHint {
        retry_hint(self)
    }
}

/// The retry hints anywhere in `err`'s `source()` chain (`err` included): whether an error
/// in it was marked [permanent](crate::Error::permanent), and the longest
/// [retry-after](crate::Error::retry_after) hint in it. Steps and the driver read hints this way,
/// so a hint counts wherever a handler's conversions put it. One of loops' own errors that
/// comes out the same at every try ([`Error::repeats`]) counts as permanent too: neither a
/// step's retries nor the state's are spent on it.
pub fn retry_hint(err: &(dyn std::error::Error + 'static)) -> RetryHint {
    let mut hint = RetryHint::default();
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(own) = e.downcast_ref::<Hinted>().map(Hinted::own) {
            hint.permanent |= own.permanent;
            hint.retry_after = hint.retry_after.max(own.retry_after);
        }
        hint.permanent |= e.downcast_ref::<Error>().is_some_and(Error::repeats);
        cur = e.source();
    }
    hint
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_fault_is_transient_has_a_cause_and_copies() {
        let fault = Error::database("commit", std::io::Error::other("connection reset"));
        assert!(fault.is_store_fault() && fault.is_transient());
        assert_eq!(
            fault.store_cause().map(ToString::to_string).as_deref(),
            Some("connection reset")
        );
        let copy = fault.store_fault_copy().expect("a copy");
        assert!(copy.is_store_fault());
        assert_eq!(copy.to_string(), fault.to_string());
        let storage = Error::storage("read", redb::StorageError::Io(std::io::Error::other("eio")));
        assert!(storage.is_store_fault() && storage.store_fault_copy().is_some());
        // Transient, but not a fault of the store in use; nor is anything about a run.
        let active = Error::RunActive {
            run_id: "r".into(),
            holder: crate::Holder::ThisRuntime,
        };
        assert!(active.is_transient() && !active.is_store_fault());
        assert!(active.store_fault_copy().is_none());
        assert!(!Error::Closed.is_store_fault() && Error::Closed.store_fault_copy().is_none());
    }
}
