//! What the crash explorer found: the boundaries it explored, and what differed at each.

use std::fmt;

use crate::store::RunStatus;

/// The environment variable that makes an explorer replay one boundary alone (its number,
/// as a report prints it): `LOOPS_EXPLORE_ONLY=4 cargo test my_test`.
pub const ONLY_ENV: &str = "LOOPS_EXPLORE_ONLY";

/// Where, around one write, a crash stops a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// The write did not commit: for a step record, the step's effect ran and its record
    /// is lost.
    BeforeCommit,
    /// The write committed, and nothing after it did.
    AfterCommit,
}

/// One place where the crash explorer stops a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boundary {
    /// Its number, from 1, in the order the uninterrupted run reaches it; what
    /// [`Explorer::only`](crate::testing::Explorer::only) takes.
    pub number: usize,
    /// The write it is at: its place among the writes the store was given, from 1.
    pub write: u64,
    /// Before or after that write's commit.
    pub when: When,
    /// That write, in words.
    pub what: String,
}

impl fmt::Display for Boundary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.when {
            When::BeforeCommit => write!(
                f,
                "boundary {}: between the effect and the {} (before write {} committed)",
                self.number, self.what, self.write
            ),
            When::AfterCommit => write!(
                f,
                "boundary {}: after the {} (write {}) committed",
                self.number, self.what, self.write
            ),
        }
    }
}

/// A crash explorer's run that found nothing wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exploration {
    /// The explored run.
    pub run_id: String,
    /// Every boundary of the uninterrupted run, in order.
    pub boundaries: Vec<Boundary>,
    /// How many of them were explored (fewer when chosen with `only` or
    /// `boundaries_where`).
    pub explored: usize,
    /// The state the run ended in.
    pub final_state: String,
    /// The status it ended with: completed, failed or cancelled (a run that fails, and
    /// fails the same way after every crash, passes: assert the status you expect).
    pub final_status: RunStatus,
    /// Its error, each cause after the one it caused, joined by `": "`, if it failed.
    pub error: Option<String>,
}

impl fmt::Display for Exploration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ends = match self.final_status {
            RunStatus::Completed => "ends".to_owned(),
            status => format!("ends {}", status.as_str()),
        };
        writeln!(
            f,
            "crash explorer: run `{}` {ends} in `{}` after a crash at each of {} boundaries \
             ({} explored)",
            self.run_id,
            self.final_state,
            self.boundaries.len(),
            self.explored
        )?;
        if let Some(error) = &self.error {
            writeln!(f, "  its error: {error}")?;
        }
        for boundary in &self.boundaries {
            writeln!(f, "  {boundary}")?;
        }
        Ok(())
    }
}

/// One boundary whose resumed run differed from the uninterrupted one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Where the run was stopped.
    pub boundary: Boundary,
    /// What differed, one sentence each.
    pub differences: Vec<String>,
}

/// Why the crash explorer failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExploreError {
    /// Some boundaries broke the workflow: see the report this prints.
    #[error("{}", found_report(run_id, *explored, findings))]
    Found {
        /// The explored run.
        run_id: String,
        /// How many boundaries were explored.
        explored: usize,
        /// The boundaries whose resumed run differed, in order.
        findings: Vec<Finding>,
    },
    /// Two runs without a crash did not do the same (a step that fails at random or reads
    /// the real clock, an outside world that [`Explorer::before_each`] does not reset), so
    /// what a crash changes cannot be told from what changes anyway: nothing was explored.
    ///
    /// [`Explorer::before_each`]: crate::testing::Explorer::before_each
    #[error(
        "crash explorer: run `{run_id}` did not do the same in two runs without a crash, so \
         what a crash changes cannot be told apart (nothing was explored): {}. Every case must \
         do the same without a crash: make the steps' outcomes (failures too) independent of \
         chance and the real clock, and reset the handler's outside world (files, a fake \
         service) in Explorer::before_each",
        differences.join("; ")
    )]
    NotRepeatable {
        /// The explored run.
        run_id: String,
        /// What differed, one sentence each.
        differences: Vec<String>,
    },
    /// [`Explorer::only`] or [`ONLY_ENV`] named a boundary the run does not have (or the
    /// variable is not a number): nothing was explored, and a replay must not pass for that.
    ///
    /// [`Explorer::only`]: crate::testing::Explorer::only
    #[error(
        "crash explorer: run `{run_id}` has no boundary {asked} to explore alone (it has \
         {boundaries}, numbered from 1; Explorer::only or {ONLY_ENV}): nothing was explored"
    )]
    NoSuchBoundary {
        /// The explored run.
        run_id: String,
        /// What was asked: the number, or the variable as it was set.
        asked: String,
        /// How many boundaries the run has.
        boundaries: usize,
    },
    /// An event given with [`Explorer::event`] is none the workflow declares, or its payload
    /// cannot be the declared type, or the run without a crash ended without taking it: a
    /// misspelt name or a stale script, which must not pass for an exploration of it.
    ///
    /// [`Explorer::event`]: crate::testing::Explorer::event
    #[error(
        "crash explorer: run `{run_id}`: the event `{event}` given to the explorer (Explorer::event) is never taken: {why}; nothing was explored"
    )]
    Event {
        /// The explored run.
        run_id: String,
        /// The event's name, as given.
        event: String,
        /// Why: the workflow's refusal, or that the run never waited for it.
        why: String,
    },
    /// The run without a crash, which the others are compared with, could not be run.
    #[error("crash explorer: run `{run_id}` could not be run without a crash: {message}")]
    Reference {
        /// The explored run.
        run_id: String,
        /// Why.
        message: String,
    },
}

/// The report of [`ExploreError::Found`].
fn found_report(run_id: &str, explored: usize, findings: &[Finding]) -> String {
    let mut out = format!(
        "crash explorer: a crash at {} of {explored} boundaries of run `{run_id}` changes what \
         the run does",
        findings.len()
    );
    for finding in findings {
        out.push_str(&format!("\n{}", finding.boundary));
        for difference in &finding.differences {
            out.push_str(&format!("\n  - {difference}"));
        }
        out.push_str(&format!(
            "\n  replay this case alone: {ONLY_ENV}={} cargo test <your test>, or \
             Explorer::only({})",
            finding.boundary.number, finding.boundary.number
        ));
    }
    out
}

/// Why a run that started child runs (`children`, their run ids) is not explored.
pub(crate) fn with_children(children: &[String]) -> String {
    let ids: Vec<String> = children.iter().map(|id| format!("`{id}`")).collect();
    format!(
        "it starts child runs ({}): the crash explorer explores one run, and not yet a run \
         that starts children (explore the children's workflows on their own; see \
         docs/testing.md)",
        ids.join(", ")
    )
}

/// Why a run that failed starting a child of `workflow`, which has no handler in the
/// explorer's runtime, is not explored.
pub(crate) fn with_unregistered_child(workflow: &str) -> String {
    format!(
        "it starts a child run of workflow `{workflow}`, which has no handler registered \
         (`Explorer::configure`), and fails there: the crash explorer explores one run, and \
         not yet a run that starts children (explore the children's workflows on their own; \
         see docs/testing.md)"
    )
}
