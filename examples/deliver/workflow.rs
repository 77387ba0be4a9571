//! The `deliver` workflow: its states and the data each state carries, in two versions.
//!
//! Everything here is stored with every transition (as JSON), so it holds only what the next
//! handler needs and nothing that differs between two runs of the same issue: no clock times,
//! no durations, no absolute paths. An interrupted run and an uninterrupted one therefore
//! record byte-identical histories.
//!
//! [`v1::Deliver`] is the first version, kept as it was (with its handler, in `agent.rs`) so
//! that the runs it recorded can finish on the code that started them. [`v2::Deliver`] adds a
//! review of the change by the model before the pull request (the `Reviewed` state), and
//! `impl Migrate<v1::Deliver> for v2::Deliver` carries the runs of version 1 that have not
//! reached the approval over to it (see docs/evolution.md, "Split one state in two").
//!
//! This file depends on nothing but `loops` and `serde`, so that tests can include it.

use loops::{BoxError, Migrate, Schema};
use serde::{Deserialize, Serialize};
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory as _};

/// The event a run waits for, once its tests pass, before it pushes and opens the pull
/// request: `approve`, declared by version 2 (`#[event(approve: Approval)]`), so that
/// `ctx.wait_for` returns an `Approval`, `runtime.send` takes one, and `loops send` checks
/// the name and the payload's shape of a version 2 run. Version 1 declares no events: it
/// keeps the schema hash its stored runs recorded.
pub const APPROVAL_EVENT: loops::Event<Approval> = v2::Deliver::APPROVE;

/// The payload of the approval event: who approved. It is read through [`sent::Approval`]
/// and refused unless `by` is a name to print and put in a pull request
/// ([`not_a_name`]): a process that drives the run refuses such
/// an approval when it is sent (`loops send` through the control endpoint says why, exit 2),
/// and a run that finds one in its inbox (sent to the store file while no process held it)
/// sets it aside and waits for the next.
#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(try_from = "sent::Approval")]
pub struct Approval {
    /// Who approved (a user name, or `--auto-approve`).
    pub by: String,
}

/// The approval as it is sent, before [`Approval`]'s check.
pub mod sent {
    use loops::Schema;
    use serde::Deserialize;

    /// An approval as sent: who approved, unchecked.
    #[derive(Schema, Deserialize)]
    pub struct Approval {
        /// Who approved.
        pub by: String,
    }
}

impl TryFrom<sent::Approval> for Approval {
    type Error = String;

    fn try_from(sent: sent::Approval) -> Result<Approval, String> {
        match not_a_name(&sent.by) {
            Some(why) => Err(format!("an approval that {why} is refused")),
            None => Ok(Approval { by: sent.by }),
        }
    }
}

/// Why `by`, an approval's approver, is not a name to print and put in a pull request, if it
/// is not: blank (white space, format characters, or characters that show as nothing: see
/// [`shows_as_nothing`]), holding control characters or line and paragraph separators (a
/// terminal's escape sequences, new lines that would write the pull request's text), holding
/// format characters (Unicode
/// general category Cf: zero-width and bidirectional controls such as U+202E, which reverses
/// the text after it, soft hyphens, joiners) or fillers that show as a blank (Hangul fillers,
/// the blank Braille pattern), or over 100 characters.
pub fn not_a_name(by: &str) -> Option<&'static str> {
    let format = |c: char| c.general_category() == GeneralCategory::Format;
    let filler = |c: char| {
        matches!(
            c,
            '\u{115F}' | '\u{1160}' | '\u{2800}' | '\u{3164}' | '\u{FFA0}'
        )
    };
    if by
        .chars()
        .all(|c| c.is_whitespace() || format(c) || shows_as_nothing(c))
    {
        Some("names no one (\"by\" is blank)")
    } else if by
        .chars()
        .any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'))
    {
        Some("holds control characters in \"by\"")
    } else if by.chars().any(|c| format(c) || filler(c)) {
        Some("holds invisible or bidirectional formatting characters in \"by\"")
    } else if by.chars().count() > 100 {
        Some("has a \"by\" over 100 characters")
    } else {
        None
    }
}

/// Whether `c` shows as nothing, though it is neither white space nor a format character
/// (Cf): the Hangul fillers, the blank Braille pattern, the combining grapheme joiner,
/// variation selectors, Mongolian free variation selectors and Khmer's inherent vowels
/// (Unicode's Default_Ignorable_Code_Point characters outside Cf, and U+2800). A name of
/// these only is blank; inside a name, variation selectors are kept (an emoji's `U+FE0F`).
fn shows_as_nothing(c: char) -> bool {
    matches!(
        c,
        '\u{034F}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{17B4}'
            | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{2800}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FFA0}'
            | '\u{E0100}'..='\u{E01EF}'
    )
}

/// Fix rounds (test, fix, commit) a run may take after the planned edit before it gives up.
pub const MAX_FIX_ROUNDS: u32 = 3;

/// The first version of the workflow: approval, push and pull request in `Tested`.
pub mod v1 {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    use super::{Base, Change, Issue, TestReport, Work};

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
}

/// The second version: the model reviews the change once the tests pass (`Tested` goes to
/// `Reviewed`), and the approval, the push and the pull request move to `Reviewed`.
pub mod v2 {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    use super::{Approval, Base, Change, Issue, Review, TestReport, Work};

    /// An agent that takes an issue to a pull request: plan, edit, test, fix until the tests
    /// pass, have the model review the change, then push a branch and open the pull request.
    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    // Declaring `approve` changed the schema hash; the runs stored by the build before it
    // (schema ba6c55098a81b7b7) are accepted as they are: an added event is compatible.
    #[workflow(name = "deliver", version = 2, accepts = ["ba6c55098a81b7b7"])]
    #[event(approve: Approval)]
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
        #[next(Edited, Reviewed, Abandoned)]
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
        /// The tests pass and the model reviewed the change; the run waits for approval,
        /// then pushes the branch and opens the pull request.
        #[next(PrOpened)]
        Reviewed {
            /// The issue to resolve.
            issue: Issue,
            /// The branch and its commits.
            work: Work,
            /// What the model said of the change (it goes into the pull request).
            review: Review,
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
}

/// The child workflow version 2's `Planned` starts once per edit of its plan (run id
/// `<run id>/edit-<i>`, `i` from 0 in the plan's order): it checks that its one edit applies
/// to the run's base and records where. The parent joins all of them and commits their edits,
/// in the plan's order, in one commit (see the README, "One child run per edit").
pub mod edit {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    use super::Edit;

    /// One edit of a plan, checked against the commit the plan was made on.
    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "deliver-edit", version = 1)]
    pub enum EditRun {
        /// The parent asked for this edit; nothing has been read yet.
        #[initial]
        #[next(Applied)]
        Requested {
            /// The commit the edit applies to (the run's base).
            base: String,
            /// The edit.
            edit: Edit,
        },
        /// The edit applies to the base: its `find` text occurs exactly once in its file.
        #[terminal]
        Applied {
            /// The edit, as the parent commits it.
            edit: Edit,
            /// The line (from 1) of the base's file where its `find` text starts.
            line: u64,
        },
    }
}

/// What the model says of a change whose tests pass, before the pull request.
#[derive(Schema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Review {
    /// One paragraph: what the change does.
    pub summary: String,
    /// What a human reviewer should look at, one item each; may be empty.
    pub concerns: Vec<String>,
}

/// How a run of version 1 becomes a run of version 2, at the state it is in.
///
/// Every state but one exists in both versions with the same data, and the handlers of both
/// name their steps alike (`plan`, `commit`, `test`, `fix`), so a migrated run replays the
/// steps it recorded and keeps their idempotency keys. The exception is a `Tested` run whose
/// tests pass: version 1 waits for the approval, pushes and opens the pull request in that
/// state, version 2 does all three in `Reviewed`, a state (and a sequence number) of its own.
/// Such a run may already have been approved or pushed, which version 2 would not replay; it
/// is refused, and finishes on version 1.
impl Migrate<v1::Deliver> for v2::Deliver {
    fn migrate(old: v1::Deliver) -> Result<Self, BoxError> {
        use v1::Deliver as Old;
        use v2::Deliver as New;
        Ok(match old {
            Old::Received { issue, base } => New::Received { issue, base },
            Old::Planned { issue, base, plan } => New::Planned { issue, base, plan },
            Old::Edited { issue, work, round } => New::Edited { issue, work, round },
            Old::Tested { report, .. } if report.passed => {
                return Err(PastItsTests.into());
            }
            Old::Tested {
                issue,
                work,
                round,
                report,
            } => New::Tested {
                issue,
                work,
                round,
                report,
            },
            Old::PrOpened {
                number,
                url,
                branch,
                head,
            } => New::PrOpened {
                number,
                url,
                branch,
                head,
            },
            Old::Abandoned { reason } => New::Abandoned { reason },
        })
    }
}

/// The refusal of [`Migrate::migrate`] for a `Tested` run of version 1 whose tests pass.
#[derive(Debug)]
pub struct PastItsTests;

impl std::fmt::Display for PastItsTests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the run's tests pass: it may have been approved and pushed already, which version 2 \
             does in a state of its own; it finishes on version 1",
        )
    }
}

impl std::error::Error for PastItsTests {}

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

/// The commit a run starts from, on the branch the pull request will target (`Default`: empty,
/// for a run that exists, whose initial state is not read).
#[derive(Schema, Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
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

#[cfg(test)]
mod tests {
    use loops::{Migration, MigrationFailure, Workflow};

    use super::*;

    fn issue() -> Issue {
        Issue {
            number: 1,
            title: "Mean of no values".into(),
            body: "It panics.".into(),
        }
    }

    fn work() -> Work {
        Work {
            base: Base {
                branch: "main".into(),
                commit: "a".repeat(40),
            },
            branch: "loops/deliver-1".into(),
            commits: vec![Commit {
                id: "b".repeat(40),
                subject: "Fix the mean".into(),
            }],
        }
    }

    fn report(passed: bool) -> TestReport {
        TestReport {
            passed,
            exit_code: Some(if passed { 0 } else { 101 }),
            tests: vec![TestCase {
                name: "tests::mean".into(),
                passed,
                output: None,
            }],
            compile_error: None,
        }
    }

    #[test]
    fn version_1_kept_in_its_module_keeps_the_schema_its_runs_recorded() {
        // The hash of every run the example recorded before version 2 (README's graph).
        assert_eq!(
            v1::Deliver::SCHEMA_HASH.pinned().to_string(),
            "c668da90d200da4f"
        );
        assert_ne!(v1::Deliver::SCHEMA_HASH, v2::Deliver::SCHEMA_HASH);
        assert_eq!((v1::Deliver::VERSION, v2::Deliver::VERSION), (1, 2));
    }

    #[test]
    fn every_state_before_the_approval_migrates_with_its_data() {
        let migration = Migration::of::<v1::Deliver, v2::Deliver>();
        let cases = [
            v1::Deliver::Edited {
                issue: issue(),
                work: work(),
                round: 1,
            },
            v1::Deliver::Tested {
                issue: issue(),
                work: work(),
                round: 2,
                report: report(false),
            },
            v1::Deliver::Abandoned {
                reason: "no plan".into(),
            },
        ];
        for old in cases {
            let stored = serde_json::to_string(&old).unwrap();
            let migrated = migration.apply(&stored).unwrap();
            // Same state, same data: the JSON is the same, read as version 2.
            assert_eq!(migrated.payload, stored);
            let new: v2::Deliver = serde_json::from_str(&migrated.payload).unwrap();
            assert_eq!(migrated.state, old.state().to_string());
            assert_eq!(new.state().to_string(), old.state().to_string());
        }
    }

    #[test]
    fn a_run_whose_tests_pass_is_refused_and_stays_on_version_1() {
        let old = v1::Deliver::Tested {
            issue: issue(),
            work: work(),
            round: 0,
            report: report(true),
        };
        let err = Migration::of::<v1::Deliver, v2::Deliver>()
            .apply(&serde_json::to_string(&old).unwrap())
            .unwrap_err();
        let MigrationFailure::Failed(cause) = &err.cause else {
            panic!("expected the migration's own error, got {err:?}");
        };
        assert!(cause.is::<PastItsTests>(), "{cause}");
        assert_eq!((err.from.version, err.to.version), (1, 2));
    }
}
