//! What a command fails with: one line for stderr, and the exit code.

use std::ffi::OsStr;
use std::fmt;
use std::path::Path;

use loops_core::Error;

/// A command's failure: printed as `error: <message>` (one line) with exit code `code`.
#[derive(Debug)]
pub struct Failure {
    /// What went wrong, in one line.
    pub message: String,
    /// The process's exit code: 1 for a failed command, 2 for a bad argument.
    pub code: u8,
    /// Whether it is damage found in the store file (see [`Failure::in_store`]).
    pub damage: bool,
    /// Whether the store file is held by a running process (redb's lock), so that the same
    /// command may get through once the process answers on its endpoint or ends.
    pub held: bool,
    /// Whether the run the command names does not exist (the web UI answers 404).
    pub missing: bool,
    /// Whether a process took the store file between the command's read-only open and the
    /// writable one its write needed, before anything was written: the same command, made
    /// again, goes through that process (its control endpoint) or waits for it.
    pub again: bool,
}

/// What a command's failure is, for its exit code: the one place that maps kinds of failure
/// to exit codes (docs/operations.md, loops-cli/README.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The command failed: the store, the run's state, the system (exit code 1).
    Failed,
    /// The input was bad: an argument, a file or stdin it names that cannot be read, a
    /// payload that is not JSON, too large or not the declared event, a run id or name loops
    /// refuses, a key file the store's workers cannot have sealed with or a payload sealed
    /// with a key the process cannot open (exit code 2, as clap's own usage errors).
    BadInput,
}

impl Kind {
    /// The process's exit code for this kind.
    pub fn code(self) -> u8 {
        match self {
            Kind::Failed => 1,
            Kind::BadInput => 2,
        }
    }

    /// The kind of a loops error: bad input if it is about what the command was given.
    pub fn of(e: &Error) -> Kind {
        match e {
            Error::InvalidRunId { .. }
            | Error::InvalidName { .. }
            | Error::InvalidAttribute { .. }
            | Error::InvalidSchedule { .. }
            | Error::EventRefused { .. }
            | Error::EventEncode { .. }
            | Error::PayloadTooLarge { .. }
            | Error::SealedRefused { .. }
            | Error::KeyNotInStore { .. }
            | Error::KeyMismatch { .. } => Kind::BadInput,
            _ => Kind::Failed,
        }
    }

    /// The kind of an error a control endpoint answered with (its `kind`), as [`Kind::of`]
    /// says for the same error of a store this process opened.
    pub fn of_remote(kind: &loops_core::control::ErrorKind) -> Kind {
        use loops_core::control::ErrorKind;
        match kind {
            ErrorKind::InvalidArgument | ErrorKind::EventRefused => Kind::BadInput,
            _ => Kind::Failed,
        }
    }
}

impl Failure {
    /// A failure of `kind`, with its exit code.
    pub fn of(kind: Kind, message: impl Into<String>) -> Self {
        Failure {
            message: one_line(&message.into()),
            code: kind.code(),
            damage: false,
            held: false,
            missing: false,
            again: false,
        }
    }

    /// A failed command (exit code 1).
    pub fn new(message: impl Into<String>) -> Self {
        Failure::of(Kind::Failed, message)
    }

    /// This failure, said to be damage to the store file at `path` if it is: that the file
    /// looks damaged, and (unless the command is `loops check` itself) that `loops check`
    /// verifies it.
    pub fn in_store(self, path: &Path, checking: bool) -> Self {
        if !self.damage {
            return self;
        }
        let message = if checking {
            format!("store {} is damaged: {}", path.display(), self.message)
        } else {
            format!(
                "store {} looks damaged: {}; `loops check` verifies every page of the file",
                path.display(),
                self.message
            )
        };
        Failure {
            message: one_line(&message),
            ..self
        }
    }

    /// A bad argument (exit code 2, as clap's own usage errors).
    pub fn usage(message: impl Into<String>) -> Self {
        Failure::of(Kind::BadInput, message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What the CLI (and `loops ui`, which takes the key file when it starts) says to do when a
/// store's payloads are sealed and no key file was given, in place of
/// [`loops_core::NO_KEY_HINT`], which names the library's builder.
pub const NO_KEY_HINT: &str = "give the key file with --key-file PATH (or LOOPS_KEY_FILE)";

impl From<loops_core::Error> for Failure {
    fn from(e: loops_core::Error) -> Self {
        match &e {
            // A read that failed on the file's contents: said without the runtime's "store
            // error while", since the message will say that the store looks damaged.
            Error::Storage {
                action,
                cause: source,
            } if redb_error(&**source).is_some_and(is_damage) => Failure {
                damage: true,
                ..Failure::new(format!(
                    "{action} failed: {source}{}",
                    if redb_error(&**source).is_some_and(is_past_the_end) {
                        " (the file ends before data it refers to)"
                    } else {
                        ""
                    }
                ))
            },
            Error::Decode { .. } | Error::RecordMissing { .. } => Failure {
                damage: true,
                ..Failure::new(e.chain())
            },
            // The message and its source chain, on one line; the library's hint for a
            // missing key names its builder, this command's option is said instead.
            _ => Failure::of(
                Kind::of(&e),
                e.chain().replace(loops_core::NO_KEY_HINT, NO_KEY_HINT),
            ),
        }
    }
}

/// The redb error under a storage error of the redb store.
fn redb_error<'a>(
    source: &'a (dyn std::error::Error + Send + Sync + 'static),
) -> Option<&'a redb::Error> {
    source.downcast_ref::<redb::Error>()
}

/// Whether redb failed on what the file holds (rather than on the system: a full disk, a
/// permission): a page it cannot make sense of, a table missing or of another type, a
/// read past the end of the file.
fn is_damage(e: &redb::Error) -> bool {
    matches!(
        e,
        redb::Error::Corrupted(_)
            | redb::Error::TableDoesNotExist(_)
            | redb::Error::TableTypeMismatch { .. }
            | redb::Error::TypeDefinitionChanged { .. }
            | redb::Error::TableIsMultimap(_)
            | redb::Error::TableIsNotMultimap(_)
    ) || is_past_the_end(e)
}

/// A read past the end of the file (`I/O error: failed to fill whole buffer`): a damaged
/// page points there.
fn is_past_the_end(e: &redb::Error) -> bool {
    matches!(e, redb::Error::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof)
}

/// The result of a command.
pub type Result<T, E = Failure> = std::result::Result<T, E>;

/// `text` with its line breaks and runs of white space folded into single spaces.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A command-line argument as UTF-8 text, or a usage failure naming `what` and showing the
/// argument with its invalid bytes escaped.
pub fn utf8_arg(what: &str, arg: &OsStr) -> Result<String> {
    arg.to_str().map(str::to_owned).ok_or_else(|| {
        Failure::usage(format!(
            "{what} {arg:?} is not valid UTF-8 (loops keeps {what}s as UTF-8 text)"
        ))
    })
}

/// The RUN argument as a run id: UTF-8, and valid as loops-core's rules for finding a run say
/// (`validate_run_id_lookup`: not empty, not too long, no control characters, no white space
/// at either end), or a usage failure (exit code 2) saying which rule it breaks, for every
/// subcommand alike. Every command names a stored run: a run stored before loops refused
/// bidirectional controls in new ids is still reached.
pub fn run_id_arg(arg: &OsStr) -> Result<String> {
    let run_id = utf8_arg("run id", arg)?;
    loops_core::validate_run_id_lookup(&run_id).map_err(|e| Failure::usage(e.chain()))?;
    Ok(run_id)
}
