//! The pieces of [`Error`](super::Error)'s messages that several variants share: what a
//! record is ([`RecordKind`]), an error's chain ([`error_chain`]), and the texts made of them.

/// The record in [`Error::Decode`](crate::Error::Decode)'s message: `transition record at seq 3 (state `Work`)`,
/// `run row`, `event record at event seq 0`, ...
pub(super) fn decoded(record: &RecordKind, seq: u64, state: &str) -> String {
    match record {
        RecordKind::Transition if state.is_empty() || state == "?" => {
            format!("transition record at seq {seq}")
        }
        RecordKind::Transition => format!("transition record at seq {seq} (state `{state}`)"),
        RecordKind::RunRow => "run row".to_owned(),
        RecordKind::Step { name, occurrence } => {
            format!("step record `{name}`#{occurrence} of seq {seq}")
        }
        RecordKind::Failure => format!("failure record of seq {seq}"),
        RecordKind::Event { name: Some(name) } => {
            format!("event record `{name}` at event seq {seq}")
        }
        RecordKind::Event { name: None } => format!("event record at event seq {seq}"),
        RecordKind::Wait { event } => {
            format!("recorded outcome of the wait for `{event}` of seq {seq}")
        }
    }
}

/// A sealed field, for [`Error::Payload`](super::Error::Payload) and
/// [`Error::SealedRefused`](super::Error::SealedRefused): `payload of event `approve``,
/// `cancellation reason of the run row`, `output of the step record ...`. An event's place
/// has no seq (it is chosen after the payload is sealed), so none is said.
pub(super) fn sealed_field(record: &RecordKind, seq: u64, field: &str) -> String {
    match (record, field) {
        (RecordKind::Event { name: Some(name) }, _) => format!("{field} of event `{name}`"),
        (RecordKind::Event { name: None }, _) => format!("{field} of an event"),
        (RecordKind::RunRow, "cancel") => "cancellation reason of the run row".to_owned(),
        (RecordKind::RunRow, "block") => "block reason of the run row".to_owned(),
        (RecordKind::RunRow, "errors") => "error texts of the run row".to_owned(),
        _ => format!("{field} of the {}", decoded(record, seq, "")),
    }
}

/// The rest of [`Error::NotFailed`](super::Error::NotFailed)'s message for a run of `status`:
/// what retries, and for a blocked run, what resumes it.
pub(super) fn not_failed_text(status: crate::status::RunStatus) -> &'static str {
    match status {
        crate::status::RunStatus::Blocked => {
            "only a failed run can be retried; a blocked run goes back to running when a build that knows its schema (or a migration from it) drives it: `loops show` says why it is blocked (docs/evolution.md)"
        }
        _ => "only a failed run can be retried",
    }
}

/// What [`Error::RunEnded`](super::Error::RunEnded) adds for a run of `status`: a failed run
/// has ended, but a retry makes it running again.
pub(super) fn ended_text(status: crate::status::RunStatus) -> &'static str {
    match status {
        crate::status::RunStatus::Failed => {
            " while it is failed (a retry makes it running again: `Runtime::retry`, `loops retry`)"
        }
        _ => "",
    }
}

pub(super) fn attempts_text(
    attempts: u32,
    interrupted: u32,
    last_error: &[String],
    has_source: bool,
) -> String {
    let plural = |n: u32| if n == 1 { "" } else { "s" };
    if interrupted == 1 && attempts == 1 {
        return "1 attempt, cut short by the process stopping".to_owned();
    }
    if interrupted == attempts {
        return format!(
            "{attempts} attempt{}, each cut short by the process stopping",
            plural(attempts)
        );
    }
    let counted = match interrupted {
        0 => format!("{attempts} attempt{}", plural(attempts)),
        i => format!(
            "{attempts} attempt{} ({i} cut short by the process stopping)",
            plural(attempts)
        ),
    };
    // With a source, the chain is the source's to tell.
    if has_source || last_error.is_empty() {
        counted
    } else {
        format!("{counted}: {}", last_error.join(": "))
    }
}

/// The run id as shown in a message: at most 64 characters, then how long it was.
pub(super) fn shown_id(run_id: &str) -> String {
    if run_id.chars().count() <= 64 {
        format!("{run_id:?}")
    } else {
        let head: String = run_id.chars().take(64).collect();
        format!("{head:?}... ({} bytes)", run_id.len())
    }
}

pub(super) fn describe_changes(changes: &crate::schema::SchemaDiff) -> String {
    if changes.is_empty() {
        String::new()
    } else {
        format!("; changes: {changes}")
    }
}

/// What [`Error::SchemaMismatch`](crate::Error::SchemaMismatch)'s message says to do: when
/// every change is compatible, first the one step left, listing the `stored` schema in
/// `accepts` (a compatible change alone does not let the new version drive the run).
pub(super) fn mismatch_remedy(
    stored: &crate::SchemaHash,
    changes: &crate::schema::SchemaDiff,
) -> String {
    let fallback = "keep the old version registered, or write a migration";
    // A change compatible only while no pending run is in a state counts as breaking here:
    // the changes do not say which state the run is in.
    if !changes.is_empty() && changes.is_compatible(|_| true) {
        format!(
            "every change is compatible: list the old schema in the workflow's `accepts = [\"{stored}\"]` to drive the run as it is; or {fallback}"
        )
    } else {
        fallback.to_owned()
    }
}

/// `" at seq N"`, or nothing for `None`: for messages about a payload that may belong to no
/// state.
pub(super) fn at_seq(seq: Option<u64>) -> String {
    seq.map(|seq| format!(" at seq {seq}")).unwrap_or_default()
}

/// The cause of a store error as its message shows it: the cause and its own sources, as
/// [`error_chain`] gives them, joined by `": "`.
pub(super) fn cause_text(cause: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
    error_chain(cause).join(": ")
}

/// Whether `cause`, a store's error, is damage of the file: a page whose checksum does not
/// match, a length its layout cannot have, bytes redb cannot read as its own
/// ([`Error::is_store_damage`](crate::Error::is_store_damage)'s rule).
pub(crate) fn is_damage(cause: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    if let Some(e) = cause.downcast_ref::<redb::DatabaseError>() {
        matches!(
            e,
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(_))
        )
    } else if let Some(e) = cause.downcast_ref::<redb::StorageError>() {
        matches!(e, redb::StorageError::Corrupted(_))
    } else if let Some(e) = cause.downcast_ref::<redb::Error>() {
        matches!(e, redb::Error::Corrupted(_))
    } else {
        false
    }
}

/// [`Error::Open`](crate::Error::Open)'s message: the path and the cause, and for a damaged
/// file what to do (helper-128: the library's message gave no next step where the CLI's did).
pub(super) fn open_text(
    path: &std::path::Path,
    cause: &(dyn std::error::Error + Send + Sync + 'static),
) -> String {
    let advice = match is_damage(cause) {
        true => format!(
            "; the file is damaged (nothing was written to it): `loops --store {} check` verifies every page of it, and a backup restores it",
            path.display()
        ),
        false => String::new(),
    };
    format!(
        "cannot open store {}: {}{advice}",
        path.display(),
        cause_text(cause)
    )
}

/// Who holds a run that [`Error::RunActive`](crate::Error::RunActive) refused to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Holder {
    /// A driver of this runtime: another `run` of the id in flight, or a background driver
    /// (wait for its end with [`Runtime::wait`](crate::Runtime::wait)).
    ThisRuntime,
    /// The holder of the run's lease: another worker of a shared store (PostgreSQL), or
    /// another runtime on the same store. A worker that stopped without giving its leases
    /// back (a crash, an exit without `shutdown`) holds them until they lapse.
    Lease {
        /// How long a lease lasts without renewal, in milliseconds: a lease whose worker
        /// died has lapsed at most this long after the refusal. `None` for a store whose
        /// leases never lapse (an embedded store's runtime holds them while it is open).
        ttl_ms: Option<u64>,
    },
}

/// The rest of [`Error::RunActive`](crate::Error::RunActive)'s message: who holds the run.
pub(super) fn holder_text(holder: &Holder) -> String {
    match holder {
        Holder::ThisRuntime => "by this runtime (wait for its end with `Runtime::wait`)".into(),
        Holder::Lease { ttl_ms: Some(ttl) } => format!(
            "by a worker holding its lease (if that worker stopped, its lease lapses at most {:?} after this refusal, and the run can be driven then)",
            std::time::Duration::from_millis(*ttl)
        ),
        Holder::Lease { ttl_ms: None } => {
            "by another runtime holding its lease on this store".into()
        }
    }
}

/// What kind of stored record an [`Error::Decode`](crate::Error::Decode) is about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordKind {
    /// A transition record: the state the run entered at `seq`.
    Transition,
    /// The run's row: its current standing (status, state, seq, wait).
    RunRow,
    /// A step record of the state at `seq`.
    Step {
        /// The step's name.
        name: String,
        /// Which use of the name, from 0.
        occurrence: u32,
    },
    /// The record of a failed attempt at the state at `seq`.
    Failure,
    /// An event in the run's inbox (`seq` is its event seq).
    Event {
        /// The event's name, when it was known before its record was read.
        name: Option<String>,
    },
    /// The recorded outcome of a wait for an event, in the state at `seq`.
    Wait {
        /// The event waited for.
        event: String,
    },
}

/// The error and its `source()` chain as text, outermost first. A source whose message
/// the message before it already holds (an error that prints its source and returns it too,
/// perhaps with a note after it, as a TLS handshake error does) is left out, so that no
/// cause is said twice.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = vec![err.to_string()];
    let mut cur = err.source();
    while let Some(e) = cur {
        let text = e.to_string();
        if !out.last().is_some_and(|last| last.contains(&text)) {
            out.push(text);
        }
        cur = e.source();
    }
    out
}

/// The message of [`Error::StoreFormat`].
pub(super) fn format_text(path: &std::path::Path, found: u64, supported: u64) -> String {
    let path = path.display();
    if found > supported {
        format!(
            "store {path} has format {found}, written by a newer loops; this build reads format {supported} only: open it with a loops that reads format {found}"
        )
    } else {
        format!(
            "store {path} has format {found}, which this build does not read (it reads format {supported}): run `loops upgrade {path}` to convert it to format {supported} (it keeps a backup)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{attempts_text, error_chain};

    /// One attempt, cut short, is said in the singular; several, each.
    #[test]
    fn interrupted_attempts_are_counted_in_words() {
        assert_eq!(
            attempts_text(1, 1, &[], false),
            "1 attempt, cut short by the process stopping"
        );
        assert_eq!(
            attempts_text(3, 3, &[], false),
            "3 attempts, each cut short by the process stopping"
        );
    }

    #[derive(Debug)]
    struct Layer(String, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    /// A cause the message before it holds (at its end, or with a note after it) is said
    /// once; one it does not hold is said.
    #[test]
    fn a_cause_is_said_once() {
        let chain = |outer: &str, inner: &str| {
            error_chain(&Layer(
                outer.to_owned(),
                Some(Box::new(Layer(inner.to_owned(), None))),
            ))
        };
        assert_eq!(
            chain("handshake: bad cert", "bad cert"),
            ["handshake: bad cert"]
        );
        assert_eq!(
            chain("handshake: bad cert (IP address mismatch)", "bad cert"),
            ["handshake: bad cert (IP address mismatch)"]
        );
        assert_eq!(
            chain("handshake failed", "bad cert"),
            ["handshake failed", "bad cert"]
        );
    }
}
