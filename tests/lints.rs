//! Generated code is documented and lint-clean in a crate that denies missing docs and
//! clippy's pedantic lints (parts of it carry the user's spans, so lints see it as theirs).
#![deny(missing_docs, clippy::pedantic)]

use loops::{Context, Schema, Workflow};
use serde::{Deserialize, Serialize};

/// A report.
#[derive(Schema, Serialize, Deserialize, Debug)]
pub struct Report {
    /// Whether the tests passed.
    pub passed: bool,
    /// Child reports.
    pub children: Vec<Report>,
}

/// A documented workflow.
#[derive(Workflow, Serialize, Deserialize, Debug)]
#[workflow(name = "linted", version = 2)]
pub enum Linted {
    /// Waiting.
    #[initial]
    #[next(Checked, Linted2)]
    Waiting {
        /// How long.
        secs: u64,
    },
    /// Checked.
    #[next(Done)]
    Checked(
        /// The report.
        Report,
    ),
    /// A state named like the enum.
    #[next(Done)]
    Linted2,
    /// Done.
    #[terminal]
    Done,
}

struct Handler;

impl LintedHandler for Handler {
    type Error = std::io::Error;

    async fn waiting(&self, _ctx: &Context, secs: u64) -> Result<WaitingNext, Self::Error> {
        Ok(if secs > 0 {
            WaitingNext::Checked(Report {
                passed: true,
                children: Vec::new(),
            })
        } else {
            WaitingNext::Linted2
        })
    }

    async fn checked(&self, _ctx: &Context, _report: Report) -> Result<CheckedNext, Self::Error> {
        Ok(CheckedNext::Done)
    }

    async fn linted2(&self, _ctx: &Context) -> Result<Linted2Next, Self::Error> {
        Ok(Linted2Next::Done)
    }
}

#[test]
fn generated_code_passes_strict_lints() {
    use loops::Dispatch;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ctx = loops::__for_tests("lint", 0, 1);
    let next = runtime
        .block_on(Linted::Waiting { secs: 1 }.dispatch(&Handler, &ctx))
        .unwrap();
    assert!(matches!(next, Linted::Checked(_)));
    assert!(Linted::SCHEMA.contains("0.children[]: Report (recursive)"));
}
