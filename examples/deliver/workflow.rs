//! The `deliver` workflow: its states and the data each state carries.
//!
//! Everything here is stored with every transition (as JSON), so it holds only what the next
//! handler needs and nothing that differs between two runs of the same issue: no clock times,
//! no durations, no absolute paths. An interrupted run and an uninterrupted one therefore
//! record byte-identical histories.
//!
//! This file depends on nothing but `loops` and `serde`, so that tests can include it.

use loops::{Schema, Workflow};
use serde::{Deserialize, Serialize};

/// The event a run waits for, once its tests pass, before it pushes and opens the pull
/// request.
pub const APPROVAL_EVENT: &str = "approve";

/// The payload of the approval event: who approved.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Approval {
    /// Who approved (a user name, or `--auto-approve`).
    pub by: String,
}

/// Fix rounds (test, fix, commit) a run may take after the planned edit before it gives up.
pub const MAX_FIX_ROUNDS: u32 = 3;

/// An agent that takes an issue to a pull request: plan, edit, test, fix until the tests pass,
/// then push a branch and open the pull request.
#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "deliver", version = 1)]
pub enum Deliver {
    /// The issue arrived; nothing has been done yet.
    #[initial]
    #[next(Planned, Abandoned)]
    Received {
        /// The issue to resolve.
        issue: Issue,
        /// Where the work starts.
        base: Base,
    },
    /// The model read the issue and the sources and planned a change.
    #[next(Edited)]
    Planned {
        /// The issue to resolve.
        issue: Issue,
        /// Where the work starts.
        base: Base,
        /// The planned change.
        plan: Change,
    },
    /// A change is committed on the work branch; its tests have not run yet.
    #[next(Tested)]
    Edited {
        /// The issue to resolve.
        issue: Issue,
        /// The branch and its commits so far.
        work: Work,
        /// Fix rounds taken so far (0 for the planned edit).
        round: u32,
    },
    /// The tests ran on the work branch's head.
    #[next(Edited, PrOpened, Abandoned)]
    Tested {
        /// The issue to resolve.
        issue: Issue,
        /// The branch and its commits so far.
        work: Work,
        /// Fix rounds taken so far.
        round: u32,
        /// What the tests said.
        report: TestReport,
    },
    /// The branch is pushed and the pull request is open.
    #[terminal]
    PrOpened {
        /// The pull request's number on the forge.
        number: u64,
        /// The pull request's address.
        url: String,
        /// The pushed branch.
        branch: String,
        /// The commit the branch points at.
        head: String,
    },
    /// The agent gave up; nothing was pushed.
    #[terminal]
    Abandoned {
        /// Why, in one sentence.
        reason: String,
    },
}

/// An issue, as the tracker gives it.
#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// The issue's number.
    pub number: u64,
    /// Its title.
    pub title: String,
    /// Its text.
    pub body: String,
}

/// The commit a run starts from, on the branch the pull request will target.
#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Base {
    /// The target branch (`main`).
    pub branch: String,
    /// Its commit id when the run started.
    pub commit: String,
}

/// A change the model proposes: what it does and the edits that do it.
#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// One line, used as the commit subject.
    pub summary: String,
    /// The edits, applied in order.
    pub edits: Vec<Edit>,
}

/// One textual edit: replace the only occurrence of `find` in `path` by `replace`.
#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// The file, relative to the repository root.
    pub path: String,
    /// The exact text to replace; it must occur exactly once.
    pub find: String,
    /// The text to put in its place.
    pub replace: String,
}

/// The work branch and what is committed on it.
#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Work {
    /// Where the work started.
    pub base: Base,
    /// The work branch (`loops/deliver-1`).
    pub branch: String,
    /// The commits on top of `base`, oldest first; never empty.
    pub commits: Vec<Commit>,
}

impl Work {
    /// The branch's head commit.
    pub fn head(&self) -> &str {
        self.commits
            .last()
            .map_or(self.base.commit.as_str(), |c| c.id.as_str())
    }
}

/// A commit the agent made.
#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// The commit id (40 hex digits).
    pub id: String,
    /// Its subject line.
    pub subject: String,
}

/// The outcome of one test run. Built from the test harness's output with everything that
/// varies between runs (timings, thread ids, temporary paths) removed.
#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct TestReport {
    /// Whether the test process exited with status 0: this alone decides what happens next.
    pub passed: bool,
    /// The test process's exit code (`None` if it did not compile or was killed by a signal).
    pub exit_code: Option<i32>,
    /// Every test that ran, in the order the harness reported them.
    pub tests: Vec<TestCase>,
    /// The compiler's errors, if the tests did not compile.
    pub compile_error: Option<String>,
}

impl TestReport {
    /// The tests that failed.
    pub fn failed(&self) -> impl Iterator<Item = &TestCase> {
        self.tests.iter().filter(|t| !t.passed)
    }

    /// One line: "1 of 2 tests fail", "all 2 tests pass", "the tests do not compile".
    pub fn describe(&self) -> String {
        let failed = self.failed().count();
        let total = self.tests.len();
        if self.compile_error.is_some() {
            "the tests do not compile".to_owned()
        } else if self.passed {
            format!("all {total} tests pass")
        } else if failed == 0 {
            format!(
                "the test process failed (exit code {})",
                self.exit_code
                    .map_or_else(|| "none".to_owned(), |c| c.to_string())
            )
        } else {
            format!("{failed} of {total} tests fail")
        }
    }
}

/// One test and its result.
#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct TestCase {
    /// The test's path (`tests::mean_of_three_values`).
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// For a failed test, its output (the panic message), normalized.
    pub output: Option<String>,
}
