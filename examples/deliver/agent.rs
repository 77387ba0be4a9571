//! The agent: the work of each state, and the handler of version 1 of the workflow
//! ([`v1::Deliver`](crate::workflow::v1::Deliver)); version 2's handler is in `agent/v2.rs`.
//! Both versions share the work of the states they have in common, step names included.
//!
//! Every action that costs money or touches the outside world runs inside a journaled step
//! (`ctx.step`): the model calls, each commit, each test run, the push and the pull request.
//! When a handler runs again after a crash, steps that completed return their recorded output
//! instead of running again. The two side effects that must not be repeated also carry the
//! step's idempotency key to the outside system: the commit (as a trailer that a repeated
//! commit step finds) and the pull request (as the forge's idempotency key). That closes the
//! window between a side effect and its record.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Result;
use loops::{Context, StepOptions, StepOutput};

use crate::forge::{Forge, NewPullRequest, Opened};
use crate::git::{Committed, Git};
use crate::hooks::Hooks;
use crate::model::{Answer, Decision, Model};
use crate::testrun;
use crate::workflow::v1::{DeliverHandler, EditedNext, PlannedNext, ReceivedNext, TestedNext};
use crate::workflow::{
    APPROVAL_EVENT, Approval, Base, Change, Issue, MAX_FIX_ROUNDS, TestReport, Work,
};

mod edits;
mod v2;

pub use edits::{EditApplier, edit_parent};

/// The names of the steps that call the model: their outputs are [`Answer`]s, whose usage
/// the summary adds up (`tokens.rs`). `review` is version 2's.
pub const MODEL_STEPS: [&str; 3] = ["plan", "fix", "review"];
/// The named limit model steps take ([`model_limit`]), across every run of the process
/// (declared on the runtime in `main.rs`).
pub const MODEL_LIMIT_NAME: &str = "model";
/// Model calls at once, across runs.
pub const MODEL_LIMIT: u32 = 4;

/// The limit [`MODEL_LIMIT_NAME`]: [`MODEL_LIMIT`] calls at once, 60 started per minute.
pub fn model_limit() -> loops::Limit {
    loops::Limit::concurrent(MODEL_LIMIT).with_rate(60, Duration::from_secs(60))
}
/// Longest a build and run of the tests may take.
const TEST_TIMEOUT: Duration = Duration::from_secs(300);

/// The agent and everything it works with.
pub struct Agent<M> {
    /// Plans changes and fixes.
    pub model: M,
    /// The repository it commits to (through git's object database: its checkout is never
    /// changed).
    pub git: Git,
    /// The bare repository it pushes to.
    pub remote: PathBuf,
    /// Where pull requests are opened.
    pub forge: Forge,
    /// Scratch space for test builds and temporary indexes.
    pub scratch: PathBuf,
    /// The entry hooks.
    pub hooks: Hooks,
}

impl<M: Model> Agent<M> {
    /// Marks the entry of the handler `ctx` belongs to, printing `line`.
    async fn enter(&self, ctx: &Context, line: &str) -> Result<()> {
        let mut line = line.to_owned();
        if ctx.attempt() > 1 {
            line.push_str(&format!(" [attempt {}]", ctx.attempt()));
        }
        self.hooks
            .enter(ctx.seq(), ctx.state(), Some(ctx.attempt()), &line)
            .await
    }

    /// Runs `f` as the journaled step `name`, handing it the step's idempotency key, and says
    /// whether it ran now (`false`: its output was recorded by an earlier attempt and `f` did
    /// not run).
    async fn step<'c, T, F, Fut>(
        &self,
        ctx: &'c Context,
        name: &str,
        options: StepOptions,
        mut f: F,
    ) -> Result<(T, bool)>
    where
        T: StepOutput,
        F: FnMut(&'c str) -> Fut + Send,
        Fut: Future<Output = Result<T>> + Send,
    {
        let ran = AtomicBool::new(false);
        let output = ctx
            .step_keyed_with(name, options, |key| {
                ran.store(true, Ordering::SeqCst);
                let tried = f(key);
                async move { tried.await.map_err(loops::BoxError::from) }
            })
            .await?;
        let ran = ran.load(Ordering::SeqCst);
        if !ran {
            say!("  {name}: recorded by an earlier attempt, not run again");
        }
        Ok((output, ran))
    }

    /// The options of a model step ([`MODEL_STEPS`]): a time-out that covers every request
    /// the model makes inside one call, and the model's retry policy in place: a call that
    /// fails with an error the model did not mark permanent is made again inside the same
    /// handler execution (a long `Retry-After` parks the run durably until then); each call
    /// takes the named limit [`MODEL_LIMIT_NAME`] first.
    fn model_step(&self) -> StepOptions {
        let options = StepOptions::timeout(self.model.call_timeout()).with_limit(MODEL_LIMIT_NAME);
        match self.model.step_retry() {
            Some(policy) => options.with_retry(policy),
            None => options,
        }
    }

    /// Commits `change` on top of `parent` as the step `commit`, exactly once.
    async fn commit(
        &self,
        ctx: &Context,
        branch: &str,
        parent: &str,
        change: &Change,
        body: &str,
    ) -> Result<Committed> {
        // The step's idempotency key: the same on every execution of this step.
        let (committed, ran) = self
            .step(ctx, "commit", StepOptions::default(), |key| {
                self.git
                    .commit_change(branch, parent, change, body, key, &self.scratch)
            })
            .await?;
        if ran && !committed.created {
            say!(
                "  commit: {} exists already (found by its idempotency key), not committed again",
                short(&committed.commit.id)
            );
        }
        Ok(committed)
    }
}

/// What a fix round came to ([`Agent::fix_round`]): a new commit to test, or the end.
pub enum FixOutcome {
    /// A fix is committed: the branch with it, and the round it was.
    Edited {
        /// The branch, its new commit last.
        work: Work,
        /// The round the fix was made in.
        round: u32,
    },
    /// No round left, or no fix: why the run gives up.
    Abandoned {
        /// Why, in one sentence.
        reason: String,
    },
}

/// The pull request [`Agent::push_and_open`] opened.
pub struct Delivered {
    /// Its number on the forge.
    pub number: u64,
    /// Its address.
    pub url: String,
    /// The pushed branch.
    pub branch: String,
    /// The commit the branch points at.
    pub head: String,
}

/// The work of the states both versions share (`Received`, `Planned`, `Edited`, and a
/// `Tested` whose tests fail), and the push and pull request, with the same step names, so
/// that a run migrated from version 1 replays what it recorded.
impl<M: Model> Agent<M> {
    /// `Received`: asks the model for a plan (the step `plan`).
    pub async fn plan_issue(&self, ctx: &Context, issue: &Issue, base: &Base) -> Result<Decision> {
        self.enter(
            ctx,
            &format!(
                "issue #{} \"{}\", asking the model for a plan",
                issue.number, issue.title
            ),
        )
        .await?;
        let (answer, _): (Answer<Decision>, _) = self
            .step(ctx, MODEL_STEPS[0], self.model_step(), |_| async {
                let sources = self.git.sources(&base.commit).await?;
                self.model.plan(issue, &sources).await
            })
            .await?;
        Ok(answer.value)
    }

    /// `Planned`: commits the plan on the run's work branch (the step `commit`).
    pub async fn commit_plan(
        &self,
        ctx: &Context,
        issue: &Issue,
        base: Base,
        plan: &Change,
    ) -> Result<Work> {
        let branch = work_branch(ctx.run_id());
        let files = files_of(plan);
        self.enter(
            ctx,
            &format!(
                "\"{}\": {} to {files}, committing on {branch}",
                plan.summary,
                count(plan.edits.len(), "edit")
            ),
        )
        .await?;
        let body = format!("Planned for issue #{}: {}", issue.number, issue.title);
        let committed = self.commit(ctx, &branch, &base.commit, plan, &body).await?;
        Ok(Work {
            base,
            branch,
            commits: vec![committed.commit],
        })
    }

    /// `Edited`: runs the tests on the branch's head (the step `test`).
    pub async fn run_tests(&self, ctx: &Context, work: &Work) -> Result<TestReport> {
        let head = work.head().to_owned();
        self.enter(
            ctx,
            &format!(
                "commit {} on {}, running the tests",
                short(&head),
                work.branch
            ),
        )
        .await?;
        let (report, _) = self
            .step(ctx, "test", StepOptions::timeout(TEST_TIMEOUT), |_| {
                testrun::run_tests(&self.git, &head, &self.scratch)
            })
            .await?;
        Ok(report)
    }

    /// `Tested` with failing tests: gives up after [`MAX_FIX_ROUNDS`], else asks the model
    /// for a fix (the step `fix`) and commits it (the step `commit`).
    pub async fn fix_round(
        &self,
        ctx: &Context,
        issue: &Issue,
        mut work: Work,
        round: u32,
        report: &TestReport,
    ) -> Result<FixOutcome> {
        let outcome = report.describe();
        if round >= MAX_FIX_ROUNDS {
            self.enter(
                ctx,
                &format!("{outcome} after {round} fix rounds, giving up"),
            )
            .await?;
            return Ok(FixOutcome::Abandoned {
                reason: format!("{outcome} after {round} fix rounds on {}", work.branch),
            });
        }
        let round = round + 1;
        self.enter(ctx, &format!("{outcome}, fixing (round {round})"))
            .await?;
        let head = work.head().to_owned();
        let (answer, _): (Answer<Option<Change>>, _) = self
            .step(ctx, MODEL_STEPS[1], self.model_step(), |_| async {
                let sources = self.git.sources(&head).await?;
                self.model.fix(issue, &sources, report).await
            })
            .await?;
        let Some(fix) = answer.value else {
            let failing: Vec<&str> = report.failed().map(|t| t.name.as_str()).collect();
            return Ok(FixOutcome::Abandoned {
                reason: format!(
                    "{outcome} and the model has no fix (failing: {})",
                    if failing.is_empty() {
                        "none named".to_owned()
                    } else {
                        failing.join(", ")
                    }
                ),
            });
        };
        let body = format!("Fix round {round} for issue #{}: {}", issue.number, outcome);
        let committed = self.commit(ctx, &work.branch, &head, &fix, &body).await?;
        work.commits.push(committed.commit);
        Ok(FixOutcome::Edited { work, round })
    }

    /// Waits, durably, for the approval event: with nothing to deliver yet, the run parks
    /// (status waiting) and its handler runs again, its recorded steps replayed, when the
    /// approval arrives. An approval whose `by` is not a name to print and put in the pull
    /// request is no [`Approval`] (its check refuses it): loops sets it aside and the run
    /// waits for the next, so a pull request says who approved it.
    pub async fn approval(&self, ctx: &Context) -> Result<Approval> {
        let approval = ctx.wait_for(APPROVAL_EVENT).await?;
        say!("  approved by {}", approval.by);
        Ok(approval)
    }

    /// Pushes the work branch and opens its pull request, described by `body`: two steps
    /// (`push`, `open_pr`), the second with the forge's idempotency key.
    pub async fn push_and_open(
        &self,
        ctx: &Context,
        issue: &Issue,
        work: &Work,
        body: String,
    ) -> Result<Delivered> {
        let head = work.head().to_owned();
        self.step(ctx, "push", StepOptions::default(), |_| async {
            self.git.push(&self.remote, &head, &work.branch).await
        })
        .await?;
        let request = NewPullRequest {
            title: format!("Fix #{}: {}", issue.number, issue.title),
            body,
            base: work.base.branch.clone(),
            head: work.branch.clone(),
            head_commit: head.clone(),
        };
        let (opened, ran): (Opened, bool) = self
            .step(ctx, "open_pr", StepOptions::default(), |key| {
                self.forge.open_pull_request(&request, key)
            })
            .await?;
        if ran && !opened.created {
            say!(
                "  open_pr: #{} exists already for this idempotency key, not opened again",
                opened.pull_request.number
            );
        }
        let pull = opened.pull_request;
        Ok(Delivered {
            number: pull.number,
            url: pull.url,
            branch: work.branch.clone(),
            head,
        })
    }
}

/// Version 1's handler: kept, unchanged in behaviour, for the runs version 1 recorded that
/// cannot migrate (those past their tests, which wait for the approval, push and open the
/// pull request in `Tested`).
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
        self.enter(
            ctx,
            &format!(
                "{}; once approved, it pushes {} and opens a pull request",
                report.describe(),
                work.branch
            ),
        )
        .await?;
        let approval = self.approval(ctx).await?;
        let body = pull_request_body(&issue, &work, &approval);
        let pull = self.push_and_open(ctx, &issue, &work, body).await?;
        Ok(TestedNext::PrOpened {
            number: pull.number,
            url: pull.url,
            branch: pull.branch,
            head: pull.head,
        })
    }
}

/// The pull request's description: the issue and the commits.
fn pull_request_body(issue: &Issue, work: &Work, approval: &Approval) -> String {
    let mut body = format!("Closes #{}.\n\n", issue.number);
    for commit in &work.commits {
        body.push_str(&format!("- {} {}\n", short(&commit.id), commit.subject));
    }
    body.push_str(&format!("\nAll tests pass. Approved by {}.\n", approval.by));
    body
}

/// The work branch of a run: `loops/<run id>` when the id is made of ASCII letters, digits,
/// `-` and `_` only and is at most [`MAX_PLAIN_BRANCH`] bytes long. Any other id has the
/// characters git refuses (or that could clash) replaced by `-`, is cut to
/// [`MAX_PLAIN_BRANCH`] bytes, and gets a `.` and 8 hex digits of the XXH3 hash of the whole
/// id: `a..b` and `a--b` get branches of their own (`loops/a--b.<hash>` and `loops/a--b`).
/// No id that is kept as it is contains a `.`, so a kept id never meets a hashed one; two
/// hashed ids meet only if they sanitize alike and their 32-bit hashes collide.
pub fn work_branch(run_id: &str) -> String {
    let name: String = run_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name == run_id && name.len() <= MAX_PLAIN_BRANCH {
        return format!("loops/{name}");
    }
    // All ASCII: any byte index is a character boundary.
    let kept = &name[..name.len().min(MAX_PLAIN_BRANCH)];
    let hash = xxhash_rust::xxh3::xxh3_64(run_id.as_bytes()) as u32;
    format!("loops/{kept}.{hash:08x}")
}

/// The longest run id used as its work branch's name as it is. Git keeps a branch as a file
/// named after it (and `<name>.lock` while it changes it), and file names are limited to 255
/// bytes; a run id may be 256.
const MAX_PLAIN_BRANCH: usize = 200;

/// The first 7 digits of a commit id.
pub fn short(id: &str) -> &str {
    id.get(..7).unwrap_or(id)
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn files_of(change: &Change) -> String {
    let mut files: Vec<&str> = change.edits.iter().map(|e| e.path.as_str()).collect();
    files.dedup();
    files.join(", ")
}

#[cfg(test)]
mod tests {
    use loops::{Runtime, StateId as _};

    use super::*;
    use crate::model::ScriptedModel;
    use crate::project::{self, Paths};
    use crate::workflow::Edit;
    use crate::workflow::v1::Deliver;

    #[test]
    fn work_branches_are_distinct_and_stable() {
        // Ids of letters, digits, `-` and `_` are kept as they are.
        assert_eq!(work_branch("deliver-1"), "loops/deliver-1");
        assert_eq!(work_branch("a--b"), "loops/a--b");
        assert_eq!(work_branch("A_b-9"), "loops/A_b-9");
        // Others get a hash of the whole id: the same on every call, machine and build.
        let hashed = work_branch("a..b");
        assert_eq!(
            hashed,
            format!(
                "loops/a--b.{:08x}",
                xxhash_rust::xxh3::xxh3_64(b"a..b") as u32
            )
        );
        assert_eq!(work_branch("a..b"), hashed);
        let ids = [
            "a--b",
            "a..b",
            "a//b",
            "a  b",
            "a.-b",
            "a-.b",
            "é",
            "è",
            "a",
            "a.",
            "a-",
            &"x".repeat(200),
            &"x".repeat(201),
            &"x".repeat(256),
            &format!("{}y", "x".repeat(255)),
        ];
        let branches: std::collections::BTreeSet<String> =
            ids.iter().map(|id| work_branch(id)).collect();
        assert_eq!(branches.len(), ids.len(), "{branches:#?}");
        // A kept id that looks like a hashed one is still kept, without a `.`: no clash.
        let looks_hashed = hashed.strip_prefix("loops/").unwrap().replace('.', "-");
        assert_eq!(work_branch(&looks_hashed), format!("loops/{looks_hashed}"));
        assert_ne!(work_branch(&looks_hashed), hashed);
        // Long ids are cut: the branch and its lock file stay within a file name's 255 bytes.
        assert!(
            ids.iter()
                .all(|id| work_branch(id).len() <= "loops/".len() + 209)
        );
    }

    #[tokio::test]
    async fn work_branches_are_valid_ref_names() {
        for id in [
            "deliver-1",
            "a b/..c~^:",
            "a..b",
            "x.lock",
            "@{1}",
            "-x",
            "é/ü",
            "a.",
        ] {
            let branch = work_branch(id);
            let output = tokio::process::Command::new("git")
                .args(["check-ref-format", "--branch", &branch])
                .output()
                .await
                .expect("run git");
            assert!(
                output.status.success(),
                "{id:?} -> {branch:?} is not a branch name"
            );
        }
    }

    /// Plans like the scripted model, but its "fixes" only touch a doc comment.
    struct Stubborn;

    impl Model for Stubborn {
        async fn plan(
            &self,
            issue: &Issue,
            sources: &[crate::git::SourceFile],
        ) -> Result<Answer<Decision>> {
            ScriptedModel::demo().plan(issue, sources).await
        }

        async fn fix(
            &self,
            _: &Issue,
            _: &[crate::git::SourceFile],
            _: &TestReport,
        ) -> Result<Answer<Option<Change>>> {
            Ok(Answer::free(Some(Change {
                summary: "Polish the docs".into(),
                edits: vec![Edit {
                    path: "src/lib.rs".into(),
                    find: "helpers.".into(),
                    replace: "helpers.!".into(),
                }],
            })))
        }

        async fn review(
            &self,
            issue: &Issue,
            diff: &str,
            report: &TestReport,
        ) -> Result<Answer<crate::workflow::Review>> {
            ScriptedModel::demo().review(issue, diff, report).await
        }
    }

    /// A fresh work directory with the demo repository, its remote and forge, prepared for
    /// the run `run_id` (on a runtime of its own: the crash explorer resets the world from
    /// a plain function).
    fn fresh_world(run_id: &str) -> (tempfile::TempDir, Paths, crate::workflow::Base) {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = Paths::new(dir.path().to_path_buf(), None, None);
        let branch = work_branch(run_id);
        let (paths, base) = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    paths.create_workdir("deliver-1", None).await.unwrap();
                    paths.clear_leftovers().unwrap();
                    let base = project::prepare(&paths, &branch, None).await;
                    (paths, base.unwrap())
                })
        })
        .join()
        .unwrap();
        (dir, paths, base)
    }

    fn agent_in(paths: &Paths) -> Agent<ScriptedModel> {
        Agent {
            model: ScriptedModel::demo(),
            git: Git::new(&paths.repo),
            remote: paths.remote.clone(),
            forge: Forge::open(&paths.forge, &paths.remote, "demo").unwrap(),
            scratch: paths.scratch.clone(),
            hooks: Hooks::none(paths.entries_log.clone()),
        }
    }

    /// The crash explorer over the real agent with its scripted model, in a temporary
    /// repository made afresh for each case: the boundaries of delivering the demo issue
    /// (each step before and after its record, each transition, the approval wait) are
    /// counted, and a crash at those of the push, the pull request and the approval resumes
    /// to the same pull request, the same history, and no step closure run twice but the
    /// one stopped between its effect and its record.
    #[tokio::test]
    async fn every_crash_of_a_delivery_resumes_to_the_same_pull_request() {
        let world = std::sync::Arc::new(std::sync::Mutex::new(fresh_world("explored")));
        let base = world.lock().unwrap().2.clone();
        let reset = std::sync::Arc::clone(&world);
        let current = std::sync::Arc::clone(&world);
        let explored = loops::testing::Explorer::new(
            move || agent_in(&current.lock().unwrap().1),
            Deliver::Received {
                issue: project::issue(),
                base,
            },
        )
        .configure(|b| b.limit(MODEL_LIMIT_NAME, model_limit()))
        .event(APPROVAL_EVENT, Approval { by: "ada".into() })
        .before_each(move || *reset.lock().unwrap() = fresh_world("explored"))
        // Each case runs the agent (two builds of the demo crate's tests): explore the
        // boundaries of its side effects on the outside world, the push and the pull
        // request, and of the approval wait before them; all are learned and counted.
        .boundaries_where(|b| {
            ["`push`", "`open_pr`", "event `approve`"]
                .iter()
                .any(|what| b.what.contains(what))
        })
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        println!("{explored}");
        println!(
            "deliver: the crash explorer found {} boundaries",
            explored.boundaries.len()
        );
        assert_eq!(explored.final_state, "PrOpened");
        assert_eq!(explored.boundaries.len(), 26);
        assert_eq!(explored.explored, 6);
    }

    #[tokio::test]
    async fn gives_up_when_the_fix_rounds_run_out() {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = Paths::new(dir.path().to_path_buf(), None, None);
        paths.create_workdir("deliver-1", None).await.unwrap();
        paths.clear_leftovers().unwrap();
        let base = project::prepare(&paths, "loops/stubborn", None)
            .await
            .unwrap();
        let agent = Agent {
            model: Stubborn,
            git: Git::new(&paths.repo),
            remote: paths.remote.clone(),
            forge: Forge::open(&paths.forge, &paths.remote, "demo").unwrap(),
            scratch: paths.scratch.clone(),
            hooks: Hooks::none(paths.entries_log.clone()),
        };
        let runtime = Runtime::builder()
            .limit(MODEL_LIMIT_NAME, model_limit())
            .open(&paths.store)
            .unwrap();
        let initial = Deliver::Received {
            issue: project::issue(),
            base,
        };
        let last = runtime.run("stubborn", initial, &agent).await.unwrap();
        let Deliver::Abandoned { reason } = last else {
            panic!("expected Abandoned, got {last:?}");
        };
        assert_eq!(
            reason,
            "1 of 2 tests fail after 3 fix rounds on loops/stubborn"
        );
        let states: Vec<&str> = runtime
            .history::<Deliver>("stubborn")
            .await
            .unwrap()
            .iter()
            .map(|t| t.state.name())
            .collect();
        let mut expected = vec!["Received", "Planned"];
        for _ in 0..=MAX_FIX_ROUNDS {
            expected.extend(["Edited", "Tested"]);
        }
        expected.push("Abandoned");
        assert_eq!(states, expected);
        assert!(agent.forge.pull_requests().unwrap().is_empty());
    }
}
