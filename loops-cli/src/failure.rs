//! What a command fails with: one line for stderr, and the exit code.

use std::ffi::OsStr;
use std::fmt;

/// A command's failure: printed as `error: <message>` (one line) with exit code `code`.
#[derive(Debug)]
pub struct Failure {
    /// What went wrong, in one line.
    pub message: String,
    /// The process's exit code: 1 for a failed command, 2 for a bad argument.
    pub code: u8,
}

impl Failure {
    /// A failed command (exit code 1).
    pub fn new(message: impl Into<String>) -> Self {
        Failure {
            message: one_line(&message.into()),
            code: 1,
        }
    }

    /// A bad argument (exit code 2, as clap's own usage errors).
    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            code: 2,
            ..Failure::new(message)
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<loops_core::Error> for Failure {
    fn from(e: loops_core::Error) -> Self {
        // The message and its source chain, on one line.
        Failure::new(e.chain())
    }
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
