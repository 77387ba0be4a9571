//! Version 2's handler ([`v2::Deliver`](crate::workflow::v2::Deliver)): the states version 1
//! has are done as version 1 does them (`agent.rs`, same steps, same names), except that a
//! `Tested` run whose tests pass asks the model to review the change (the step `review`, its
//! answer recorded) and goes to `Reviewed`, which waits for the approval, pushes the branch and
//! opens the pull request, with the review in its description.

use anyhow::Result;
use loops::Context;

use super::{Agent, FixOutcome, MODEL_STEPS, short};
use crate::model::{Answer, Decision, Model};
use crate::workflow::v2::{
    DeliverHandler, EditedNext, PlannedNext, ReceivedNext, ReviewedNext, TestedNext,
};
use crate::workflow::{Approval, Base, Change, Issue, Review, TestReport, Work};

impl<M: Model> Agent<M> {
    /// `Tested` with passing tests: the model's review of the change from the run's base to
    /// the branch's head (the step `review`; the diff is read inside the step, so a replay
    /// reads nothing).
    async fn review(
        &self,
        ctx: &Context,
        issue: &Issue,
        work: &Work,
        report: &TestReport,
    ) -> Result<Review> {
        self.enter(
            ctx,
            &format!(
                "{}; asking the model to review {} before the pull request",
                report.describe(),
                work.branch
            ),
        )
        .await?;
        let head = work.head().to_owned();
        let (answer, _): (Answer<Review>, _) = self
            .step(ctx, MODEL_STEPS[2], self.model_step(), |_| async {
                let diff = self
                    .git
                    .run(&[
                        "diff",
                        "--no-color",
                        "--no-ext-diff",
                        &work.base.commit,
                        &head,
                    ])
                    .await?;
                self.model.review(issue, &diff, report).await
            })
            .await?;
        Ok(answer.value)
    }
}

impl<M: Model> DeliverHandler for Agent<M> {
    type Error = anyhow::Error;

    async fn received(&self, ctx: &Context, issue: Issue, base: Base) -> Result<ReceivedNext> {
        Ok(match self.plan_issue(ctx, &issue, &base).await? {
            Decision::Plan(plan) => ReceivedNext::Planned { issue, base, plan },
            Decision::Decline { reason } => ReceivedNext::Abandoned { reason },
        })
    }

    async fn planned(
        &self,
        ctx: &Context,
        issue: Issue,
        base: Base,
        plan: Change,
    ) -> Result<PlannedNext> {
        // One child run per edit, all joined, before the state's entry line: a handler that
        // parks in the join runs again when the children end, and enters once.
        let plan = self.apply_edits(ctx, &base, &plan).await?;
        let work = self.commit_plan(ctx, &issue, base, &plan).await?;
        Ok(PlannedNext::Edited {
            issue,
            work,
            round: 0,
        })
    }

    async fn edited(
        &self,
        ctx: &Context,
        issue: Issue,
        work: Work,
        round: u32,
    ) -> Result<EditedNext> {
        let report = self.run_tests(ctx, &work).await?;
        Ok(EditedNext::Tested {
            issue,
            work,
            round,
            report,
        })
    }

    async fn tested(
        &self,
        ctx: &Context,
        issue: Issue,
        work: Work,
        round: u32,
        report: TestReport,
    ) -> Result<TestedNext> {
        if !report.passed {
            return Ok(
                match self.fix_round(ctx, &issue, work, round, &report).await? {
                    FixOutcome::Edited { work, round } => TestedNext::Edited { issue, work, round },
                    FixOutcome::Abandoned { reason } => TestedNext::Abandoned { reason },
                },
            );
        }
        let review = self.review(ctx, &issue, &work, &report).await?;
        Ok(TestedNext::Reviewed {
            issue,
            work,
            review,
        })
    }

    async fn reviewed(
        &self,
        ctx: &Context,
        issue: Issue,
        work: Work,
        review: Review,
    ) -> Result<ReviewedNext> {
        self.enter(
            ctx,
            &format!(
                "reviewed ({}); once approved, it pushes {} and opens a pull request",
                concerns(review.concerns.len()),
                work.branch
            ),
        )
        .await?;
        let approval = self.approval(ctx).await?;
        let body = pull_request_body(&issue, &work, &review, &approval);
        let pull = self.push_and_open(ctx, &issue, &work, body).await?;
        Ok(ReviewedNext::PrOpened {
            number: pull.number,
            url: pull.url,
            branch: pull.branch,
            head: pull.head,
        })
    }
}

/// "no concern", "1 concern", "2 concerns".
fn concerns(n: usize) -> String {
    match n {
        0 => "no concern".to_owned(),
        1 => "1 concern".to_owned(),
        n => format!("{n} concerns"),
    }
}

/// Version 2's pull request description: the issue, the commits, the model's review, who
/// approved.
pub fn pull_request_body(
    issue: &Issue,
    work: &Work,
    review: &Review,
    approval: &Approval,
) -> String {
    let mut body = format!("Closes #{}.\n\n", issue.number);
    for commit in &work.commits {
        body.push_str(&format!("- {} {}\n", short(&commit.id), commit.subject));
    }
    body.push_str(&format!(
        "\nAll tests pass. The model's review: {}\n",
        review.summary
    ));
    for concern in &review.concerns {
        body.push_str(&format!("- concern: {concern}\n"));
    }
    body.push_str(&format!("\nApproved by {}.\n", approval.by));
    body
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use loops::{Runtime, StateId as _};

    use super::*;
    use crate::forge::Forge;
    use crate::git::Git;
    use crate::hooks::Hooks;
    use crate::model::ScriptedModel;
    use crate::project::{self, Paths};
    use crate::workflow::edit::EditRun;
    use crate::workflow::{APPROVAL_EVENT, v2::Deliver};

    /// Sends the approval as soon as the run exists.
    async fn approve(runtime: &Runtime, run_id: &str) {
        let approval = Approval { by: "test".into() };
        loop {
            match runtime
                .send_with_key(
                    run_id,
                    APPROVAL_EVENT,
                    crate::approval::APPROVAL_KEY,
                    &approval,
                )
                .await
            {
                Err(loops::Error::RunNotFound { .. }) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                sent => {
                    sent.expect("send the approval");
                    return;
                }
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn version_2_reviews_the_change_before_the_pull_request() {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = Paths::new(dir.path().to_path_buf(), None, None);
        paths.create_workdir("deliver-1", None).await.unwrap();
        paths.clear_leftovers().unwrap();
        let base = project::prepare(&paths, "loops/v2", None).await.unwrap();
        let agent = Agent {
            model: ScriptedModel::demo(),
            git: Git::new(&paths.repo),
            remote: paths.remote.clone(),
            forge: Forge::open(&paths.forge, &paths.remote, "demo").unwrap(),
            scratch: paths.scratch.clone(),
            hooks: Hooks::none(paths.entries_log.clone()),
        };
        let runtime = Runtime::builder()
            .limit(crate::agent::MODEL_LIMIT_NAME, crate::agent::model_limit())
            .open(&paths.store)
            .unwrap();
        // The children `Planned` starts, one per edit, are driven by the runtime.
        runtime.register::<EditRun, _>(crate::agent::EditApplier {
            git: agent.git.clone(),
        });
        let initial = Deliver::Received {
            issue: project::issue(),
            base,
        };
        let (last, ()) = tokio::join!(runtime.run("v2", initial, &agent), approve(&runtime, "v2"));
        let Deliver::PrOpened { number, .. } = last.unwrap() else {
            panic!("expected PrOpened");
        };
        let history = runtime.history::<Deliver>("v2").await.unwrap();
        let states: Vec<&str> = history.iter().map(|t| t.state.name()).collect();
        assert_eq!(
            states,
            [
                "Received", "Planned", "Edited", "Tested", "Edited", "Tested", "Reviewed",
                "PrOpened"
            ]
        );
        // The review is the scripted model's, of the two commits' diff, recorded as the
        // step `review` of the last `Tested` and carried by `Reviewed`.
        let Deliver::Reviewed { review, .. } = &history[6].value else {
            panic!("expected Reviewed at seq 6");
        };
        assert_eq!(
            review.concerns,
            ["no test was added or changed: the tests that pass are the ones that were there"]
        );
        assert!(
            review.summary.starts_with(
                "For issue #1 (\"add() returns the difference of its arguments\"), the change \
                 edits src/lib.rs (+2 -2 lines); all "
            ),
            "{}",
            review.summary
        );
        // `Planned` started one child per edit of the plan (the demo's has one), joined it,
        // and committed the edit it returned: the plan's edit, found at line 5 of the base.
        let Deliver::Planned { plan, base, .. } = &history[1].value else {
            panic!("expected Planned at seq 1");
        };
        let children = runtime.store().children("v2").await.unwrap();
        let ids: Vec<(&str, &str, loops::RunStatus)> = children
            .iter()
            .map(|c| (c.run_id.as_str(), c.state.as_str(), c.status))
            .collect();
        assert_eq!(ids, [("v2/edit-0", "Applied", loops::RunStatus::Completed)]);
        let child = runtime.history::<EditRun>("v2/edit-0").await.unwrap();
        assert_eq!(
            child.iter().map(|t| t.value.clone()).collect::<Vec<_>>(),
            [
                EditRun::Requested {
                    base: base.commit.clone(),
                    edit: plan.edits[0].clone(),
                },
                EditRun::Applied {
                    edit: plan.edits[0].clone(),
                    // `    a - b`, in `add`, at line 5 of the demo's `src/lib.rs`.
                    line: 5,
                },
            ]
        );
        let planned = runtime.store().steps("v2", 1).await.unwrap();
        let names: Vec<&str> = planned.iter().map(|(n, _, _)| n.as_str()).collect();
        // The state's steps, listed by name: the child's start, the join, the commit.
        assert_eq!(names, ["commit", "loops:child:v2/edit-0", "loops:join"]);
        let steps = runtime.store().steps("v2", 5).await.unwrap();
        let names: Vec<&str> = steps.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, ["review"]);
        let recorded: Answer<Review> = serde_json::from_str(steps[0].2.output.get()).unwrap();
        assert_eq!(&recorded.value, review);
        // One pull request, whose description has the review.
        let pulls = agent.forge.pull_requests().unwrap();
        assert_eq!(pulls.len(), 1);
        assert_eq!(pulls[0].number, number);
        assert!(pulls[0].body.contains(&review.summary), "{}", pulls[0].body);
        assert!(
            pulls[0].body.ends_with("\nApproved by test.\n"),
            "{}",
            pulls[0].body
        );
    }
}
