//! One change between two schema descriptions, and its class.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Whether a [`Change`] lets the records written before it be read by the new build.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Class {
    /// Every value the old build could have stored decodes with the new types to the same
    /// meaning. (A changed `#[workflow(version)]` is classed compatible: the version is not
    /// in the records, so only your declaration that the old version's runs mean the same
    /// brings them under the new one.)
    Compatible,
    /// Compatible while no pending (unfinished) run is in `state`, the state as the old build
    /// names it: a pending run there could not be resumed. The records of finished runs that
    /// went through it no longer decode as the new workflow type (`Runtime::history`); the
    /// CLI still shows them.
    IfNoPendingRun {
        /// The state, by its (old) Rust name, as runs record it.
        state: String,
    },
    /// Some stored values no longer decode, or decode to another meaning: runs recorded
    /// before need a migration.
    Breaking,
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Class::Compatible => f.write_str("compatible"),
            Class::IfNoPendingRun { state } => {
                write!(f, "compatible if no pending run is in `{state}`")
            }
            Class::Breaking => f.write_str("breaking"),
        }
    }
}

/// One difference between two schema descriptions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Change {
    /// What changed, such as ``state `Tested`: field `report.log: String` added``.
    pub text: String,
    /// Whether records written before the change still read.
    #[serde(flatten)]
    pub class: Class,
    /// Why, in a few words: ``records written before lack it; give it `#[serde(default)]` or
    /// make it an `Option` ``.
    pub reason: String,
}

impl Change {
    /// A change of `class`, for `text` and `reason`.
    pub fn new(text: impl Into<String>, class: Class, reason: impl Into<String>) -> Self {
        Change {
            text: text.into(),
            class,
            reason: reason.into(),
        }
    }

    /// Whether the change stops records from reading when pending runs are in the states
    /// for which `pending_in` is true.
    pub fn is_breaking(&self, pending_in: impl Fn(&str) -> bool) -> bool {
        match &self.class {
            Class::Compatible => false,
            Class::IfNoPendingRun { state } => pending_in(state),
            Class::Breaking => true,
        }
    }
}

/// `text (class: reason)`.
impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}: {})", self.text, self.class, self.reason)
    }
}
