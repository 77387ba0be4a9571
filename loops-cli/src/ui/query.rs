//! The runs page's filters and what they select.

use std::time::Duration;

use loops_core::{RunInfo, RunStatus};
use serde::Deserialize;

use crate::cli::parse_age;
use crate::commands::runs::Selection;
use crate::failure::{Failure, Result};

/// The runs page's filters, as the query string gives them (empty means not given).
#[derive(Debug, Default, Clone, Deserialize)]
pub struct RunsQuery {
    /// A workflow's name.
    #[serde(default)]
    pub workflow: String,
    /// A status (`running`, `waiting`, ...).
    #[serde(default)]
    pub status: String,
    /// A schema hash or a prefix of one.
    #[serde(default)]
    pub schema: String,
    /// An age such as `1h` (humantime's syntax).
    #[serde(default)]
    pub newer_than: String,
    /// An age such as `30d`.
    #[serde(default)]
    pub older_than: String,
}

impl RunsQuery {
    /// The selection these filters make, as `loops runs` makes it from its flags; fails
    /// with a usage failure for an unknown status or an age that does not parse.
    pub fn selection(&self) -> Result<Selection> {
        let given = |s: &str| Some(s.trim().to_owned()).filter(|s| !s.is_empty());
        let age = |what: &str, s: &str| -> Result<Option<Duration>> {
            given(s)
                .map(|s| parse_age(&s).map_err(|e| Failure::usage(format!("{what}: {e}"))))
                .transpose()
        };
        let statuses = match given(&self.status) {
            None => Vec::new(),
            Some(s) => vec![
                RunStatus::ALL
                    .into_iter()
                    .find(|status| status.as_str() == s)
                    .ok_or_else(|| Failure::usage(format!("no status `{s}`")))?,
            ],
        };
        Ok(Selection {
            statuses,
            workflow: given(&self.workflow),
            schema: given(&self.schema),
            older_than: age("older than", &self.older_than)?,
            newer_than: age("newer than", &self.newer_than)?,
            limit: None,
            attributes: Vec::new(),
        })
    }
}

/// The runs a page lists, and the stored workflows' names (for the filter).
pub struct Listed {
    /// The selected runs, most recently changed first; or why they could not be (a filter
    /// that does not parse, a failed read).
    pub runs: Result<Vec<RunInfo>>,
    /// Every workflow with a stored schema, sorted.
    pub workflows: Vec<String>,
}
