//! The model the agent asks for plans and fixes, and an offline, deterministic stand-in.
//!
//! [`Model`] is what a model client implements: [`ScriptedModel`] (the default) plays its
//! part without a network: it reads the issue, the sources and the failing tests, and answers
//! from a small playbook of known bugs with concrete find/replace edits. `openai.rs` (cargo
//! feature `openai`) is a client of the OpenAI-compatible chat-completions API.

use std::future::Future;
use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::git::SourceFile;
use crate::workflow::{Change, Edit, Issue, Review, TestReport};

/// Plans changes for issues, fixes for failing tests, and reviews changes whose tests pass.
///
/// Implementations are called from journaled steps: each call's answer is recorded, with what
/// it cost ([`Answer::usage`]), and a resumed run reuses it instead of asking again.
pub trait Model: Send + Sync {
    /// Reads the issue and the sources and proposes a change, or declines the issue.
    fn plan(
        &self,
        issue: &Issue,
        sources: &[SourceFile],
    ) -> impl Future<Output = Result<Answer<Decision>>> + Send;

    /// Reads the failing tests and proposes a change that makes them pass, or `None` if it
    /// has none.
    fn fix(
        &self,
        issue: &Issue,
        sources: &[SourceFile],
        report: &TestReport,
    ) -> impl Future<Output = Result<Answer<Option<Change>>>> + Send;

    /// Reads the issue, the change (`diff`: `git diff` from the run's base to the branch's
    /// head) and the passing tests' report, and says what the change does and what a human
    /// reviewer should look at (workflow version 2's `Tested` state, before the pull request).
    fn review(
        &self,
        issue: &Issue,
        diff: &str,
        report: &TestReport,
    ) -> impl Future<Output = Result<Answer<Review>>> + Send;

    /// The longest one call ([`plan`](Self::plan), [`fix`](Self::fix) or
    /// [`review`](Self::review)) may take, every try
    /// and wait inside it included: the time-out of the step that makes it.
    fn call_timeout(&self) -> Duration {
        DEFAULT_CALL_TIMEOUT
    }

    /// The retry policy of the step that makes a call, tried again in place by loops when
    /// a call fails with an error that is not permanent; `None` (the default): one try, and
    /// the state's retries decide.
    fn step_retry(&self) -> Option<loops::RetryPolicy> {
        None
    }
}

/// [`Model::call_timeout`] unless a model says otherwise.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// What a model answered, and what the answer cost: the output of a model step, recorded in
/// the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer<T> {
    /// The answer.
    pub value: T,
    /// What getting it cost.
    pub usage: Usage,
}

impl<T> Answer<T> {
    /// An answer that cost nothing (from a model that makes no requests).
    pub fn free(value: T) -> Self {
        Answer {
            value,
            usage: Usage::default(),
        }
    }
}

/// What one model call cost, as the API reported it: the requests it took (tries included)
/// and the tokens of every response that said (`usage.prompt_tokens`,
/// `usage.completion_tokens`), failed tries included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// HTTP requests sent (0 for a model that makes none).
    pub requests: u32,
    /// Tokens of the prompts.
    pub prompt_tokens: u64,
    /// Tokens of the completions.
    pub completion_tokens: u64,
}

impl Usage {
    /// Prompt and completion tokens together (saturating: never an overflow panic on a
    /// server's absurd counts).
    pub fn total_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    /// The sum of `self` and `other` (saturating).
    pub fn plus(self, other: Usage) -> Usage {
        Usage {
            requests: self.requests.saturating_add(other.requests),
            prompt_tokens: self.prompt_tokens.saturating_add(other.prompt_tokens),
            completion_tokens: self
                .completion_tokens
                .saturating_add(other.completion_tokens),
        }
    }
}

/// The model a run asks, as chosen with `--model`.
#[derive(Debug)]
pub enum AnyModel {
    /// The scripted, offline stand-in (the default).
    Scripted(ScriptedModel),
    /// A client of an OpenAI-compatible chat-completions API.
    #[cfg(feature = "openai")]
    OpenAi(crate::openai::OpenAiModel),
}

impl AnyModel {
    /// What it is, in a few words, for the start of the output.
    pub fn describe(&self) -> String {
        match self {
            AnyModel::Scripted(_) => {
                "scripted (an offline stand-in that knows the demo's bugs; --model openai for a \
                 real one)"
                    .to_owned()
            }
            #[cfg(feature = "openai")]
            AnyModel::OpenAi(model) => model.describe(),
        }
    }
}

impl Model for AnyModel {
    async fn plan(&self, issue: &Issue, sources: &[SourceFile]) -> Result<Answer<Decision>> {
        match self {
            AnyModel::Scripted(model) => model.plan(issue, sources).await,
            #[cfg(feature = "openai")]
            AnyModel::OpenAi(model) => model.plan(issue, sources).await,
        }
    }

    async fn fix(
        &self,
        issue: &Issue,
        sources: &[SourceFile],
        report: &TestReport,
    ) -> Result<Answer<Option<Change>>> {
        match self {
            AnyModel::Scripted(model) => model.fix(issue, sources, report).await,
            #[cfg(feature = "openai")]
            AnyModel::OpenAi(model) => model.fix(issue, sources, report).await,
        }
    }

    async fn review(
        &self,
        issue: &Issue,
        diff: &str,
        report: &TestReport,
    ) -> Result<Answer<Review>> {
        match self {
            AnyModel::Scripted(model) => model.review(issue, diff, report).await,
            #[cfg(feature = "openai")]
            AnyModel::OpenAi(model) => model.review(issue, diff, report).await,
        }
    }

    fn call_timeout(&self) -> Duration {
        match self {
            AnyModel::Scripted(model) => model.call_timeout(),
            #[cfg(feature = "openai")]
            AnyModel::OpenAi(model) => model.call_timeout(),
        }
    }

    fn step_retry(&self) -> Option<loops::RetryPolicy> {
        match self {
            AnyModel::Scripted(model) => model.step_retry(),
            #[cfg(feature = "openai")]
            AnyModel::OpenAi(model) => model.step_retry(),
        }
    }
}

/// The model's answer to an issue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Work on it: the planned change.
    Plan(Change),
    /// Do not work on it, and why.
    Decline {
        /// Why, in one sentence.
        reason: String,
    },
}

/// One bug the scripted model knows how to fix: inside function `function`, replace `find`
/// by `replace`.
#[derive(Debug, Clone)]
pub struct Recipe {
    /// The function the bug is in.
    pub function: &'static str,
    /// The faulty text.
    pub find: &'static str,
    /// The fixed text.
    pub replace: &'static str,
    /// The commit subject of the fix.
    pub summary: &'static str,
}

/// A deterministic, offline stand-in for a language model.
///
/// It plans a fix for each function the issue names (`add(2, 3)`), and fixes each function
/// a failing test is named after (`tests::mean_of_three_values` names `mean`), provided its
/// playbook has a recipe whose faulty text occurs in that function's body.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    playbook: Vec<Recipe>,
}

impl ScriptedModel {
    /// A model that knows the given recipes.
    pub fn new(playbook: Vec<Recipe>) -> Self {
        ScriptedModel { playbook }
    }

    /// A model that knows the two bugs of the demo crate.
    pub fn demo() -> Self {
        ScriptedModel::new(vec![
            Recipe {
                function: "add",
                find: "a - b",
                replace: "a + b",
                summary: "Fix add(): add the arguments instead of subtracting them",
            },
            Recipe {
                function: "mean",
                find: "(values.len() - 1) as f64",
                replace: "values.len() as f64",
                summary: "Fix mean(): divide by the number of values, not one less",
            },
        ])
    }

    /// The edits and summaries for the bugs it knows in `functions`.
    fn change_for(&self, functions: &[&str], sources: &[SourceFile]) -> Option<Change> {
        let mut summaries = Vec::new();
        let mut edits = Vec::new();
        for recipe in &self.playbook {
            if !functions.contains(&recipe.function) {
                continue;
            }
            if let Some(edit) = sources.iter().find_map(|f| edit_in(f, recipe)) {
                summaries.push(recipe.summary);
                edits.push(edit);
            }
        }
        (!edits.is_empty()).then(|| Change {
            summary: summaries.join("; "),
            edits,
        })
    }
}

impl Model for ScriptedModel {
    async fn plan(&self, issue: &Issue, sources: &[SourceFile]) -> Result<Answer<Decision>> {
        Ok(Answer::free(self.decide(issue, sources)))
    }

    async fn fix(
        &self,
        _issue: &Issue,
        sources: &[SourceFile],
        report: &TestReport,
    ) -> Result<Answer<Option<Change>>> {
        Ok(Answer::free(self.fix_for(sources, report)))
    }

    async fn review(
        &self,
        issue: &Issue,
        diff: &str,
        report: &TestReport,
    ) -> Result<Answer<Review>> {
        Ok(Answer::free(review_of(issue, diff, report)))
    }
}

/// The scripted model's review of `diff`: which files it changes and by how many lines, and
/// the concerns a reviewer would raise that can be read off the diff itself: no test added
/// or changed, an assertion removed, a possible panic added.
pub fn review_of(issue: &Issue, diff: &str, report: &TestReport) -> Review {
    let mut files: Vec<&str> = Vec::new();
    let (mut added, mut removed) = (0usize, 0usize);
    let mut concerns = Vec::new();
    let mut touches_tests = false;
    for line in diff.lines() {
        if let Some(paths) = line.strip_prefix("diff --git a/") {
            let path = paths.split(" b/").next().unwrap_or(paths);
            files.push(path);
            touches_tests |= path.starts_with("tests/");
        } else if line.starts_with("+++") || line.starts_with("---") {
            continue;
        } else if let Some(text) = line.strip_prefix('+') {
            added += 1;
            touches_tests |= text.contains("#[test]");
            if ["unwrap()", "expect(", "panic!("]
                .iter()
                .any(|p| text.contains(p))
            {
                concerns.push(format!("adds a possible panic: `{}`", text.trim()));
            }
        } else if let Some(text) = line.strip_prefix('-') {
            removed += 1;
            if text.contains("assert") {
                concerns.push(format!("removes an assertion: `{}`", text.trim()));
            }
        }
    }
    if !touches_tests {
        concerns.push(
            "no test was added or changed: the tests that pass are the ones that were there"
                .to_owned(),
        );
    }
    let files = if files.is_empty() {
        "no file".to_owned()
    } else {
        files.join(", ")
    };
    Review {
        summary: format!(
            "For issue #{} (\"{}\"), the change edits {files} (+{added} -{removed} lines); {}.",
            issue.number,
            issue.title,
            report.describe()
        ),
        concerns,
    }
}

impl ScriptedModel {
    /// The plan for `issue`: a fix of each function it names that has a known bug, or a
    /// refusal.
    fn decide(&self, issue: &Issue, sources: &[SourceFile]) -> Decision {
        let text = format!("{}\n{}", issue.title, issue.body);
        let named: Vec<&str> = functions(sources)
            .into_iter()
            .filter(|f| text.contains(&format!("{f}(")))
            .collect();
        if named.is_empty() {
            return Decision::Decline {
                reason: format!(
                    "issue #{} names no function of this crate, so there is nothing to fix",
                    issue.number
                ),
            };
        }
        match self.change_for(&named, sources) {
            Some(change) => Decision::Plan(change),
            None => Decision::Decline {
                reason: format!(
                    "issue #{} is about {}, but I see no bug there",
                    issue.number,
                    named.join(", ")
                ),
            },
        }
    }

    /// The fix of each function a failing test of `report` is named after that has a known
    /// bug, if any.
    fn fix_for(&self, sources: &[SourceFile], report: &TestReport) -> Option<Change> {
        let all = functions(sources);
        let failing: Vec<&str> = report
            .failed()
            .map(|t| t.name.rsplit("::").next().unwrap_or(&t.name))
            .collect();
        let named: Vec<&str> = all
            .into_iter()
            .filter(|f| {
                failing
                    .iter()
                    .any(|t| *t == *f || t.starts_with(&format!("{f}_")))
            })
            .collect();
        self.change_for(&named, sources)
    }
}

/// The names of the functions defined in `sources` (`fn name(`), in order.
fn functions(sources: &[SourceFile]) -> Vec<&str> {
    let mut names = Vec::new();
    for file in sources {
        let mut rest = file.text.as_str();
        while let Some(at) = rest.find("fn ") {
            rest = &rest[at + 3..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if end > 0 && rest[end..].starts_with('(') && !names.contains(&&rest[..end]) {
                names.push(&rest[..end]);
            }
        }
    }
    names
}

/// The body of function `name` in `text`: from its opening brace to the matching one.
fn body<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = text.find(&format!("fn {name}("))?;
    let open = start + text[start..].find('{')?;
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[open..=open + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// The edit that applies `recipe` to `file`: the whole line holding the faulty text (inside
/// the function), provided that line occurs exactly once in the file.
fn edit_in(file: &SourceFile, recipe: &Recipe) -> Option<Edit> {
    let body = body(&file.text, recipe.function)?;
    let line = body.lines().find(|l| l.contains(recipe.find))?;
    if file.text.matches(line).count() != 1 {
        return None;
    }
    Some(Edit {
        path: file.path.clone(),
        find: line.to_owned(),
        replace: line.replacen(recipe.find, recipe.replace, 1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project;
    use crate::workflow::TestCase;

    fn sources() -> Vec<SourceFile> {
        vec![SourceFile {
            path: "src/lib.rs".into(),
            text: project::LIB_RS.into(),
        }]
    }

    #[tokio::test]
    async fn plans_the_fix_of_the_function_the_issue_names() {
        let model = ScriptedModel::demo();
        let answer = model.plan(&project::issue(), &sources()).await.unwrap();
        assert_eq!(
            answer.usage,
            Usage::default(),
            "the scripted model spends nothing"
        );
        let Decision::Plan(change) = answer.value else {
            panic!("the demo issue is declined");
        };
        assert_eq!(change.edits.len(), 1);
        assert_eq!(change.edits[0].path, "src/lib.rs");
        assert_eq!(change.edits[0].find.trim(), "a - b");
        assert_eq!(change.edits[0].replace.trim(), "a + b");
    }

    #[tokio::test]
    async fn declines_an_issue_about_nothing_in_the_code() {
        let issue = Issue {
            number: 7,
            title: "Please add a logo".into(),
            body: "The README needs a logo.".into(),
        };
        let decision = ScriptedModel::demo()
            .plan(&issue, &sources())
            .await
            .unwrap()
            .value;
        assert!(matches!(decision, Decision::Decline { .. }), "{decision:?}");
    }

    #[tokio::test]
    async fn fixes_the_function_a_failing_test_is_named_after() {
        let report = TestReport {
            passed: false,
            exit_code: Some(101),
            tests: vec![
                TestCase {
                    name: "tests::add_sums_its_arguments".into(),
                    passed: true,
                    output: None,
                },
                TestCase {
                    name: "tests::mean_of_three_values".into(),
                    passed: false,
                    output: Some("assertion failed".into()),
                },
            ],
            compile_error: None,
        };
        let change = ScriptedModel::demo()
            .fix(&project::issue(), &sources(), &report)
            .await
            .unwrap()
            .value
            .expect("a fix for mean");
        assert_eq!(change.edits.len(), 1);
        assert!(change.edits[0].replace.contains("values.len() as f64"));
        assert!(change.summary.starts_with("Fix mean()"));

        // Applied, the edits leave nothing more to fix.
        let mut fixed = sources();
        for edit in &change.edits {
            fixed[0].text = fixed[0].text.replacen(&edit.find, &edit.replace, 1);
        }
        let none = ScriptedModel::demo()
            .fix(&project::issue(), &fixed, &report)
            .await
            .unwrap()
            .value;
        assert_eq!(none, None);
    }

    #[test]
    fn the_scripted_review_reads_the_diff() {
        let report = TestReport {
            passed: true,
            exit_code: Some(0),
            tests: vec![TestCase {
                name: "tests::add".into(),
                passed: true,
                output: None,
            }],
            compile_error: None,
        };
        let diff = "diff --git a/src/lib.rs b/src/lib.rs\n\
                    --- a/src/lib.rs\n\
                    +++ b/src/lib.rs\n\
                    @@ -1,3 +1,3 @@\n\
                    -    assert!(b != 0);\n\
                    +    let q = a.checked_div(b).unwrap();\n\
                    diff --git a/tests/div.rs b/tests/div.rs\n\
                    +#[test]\n";
        let review = review_of(&project::issue(), diff, &report);
        assert_eq!(
            review.summary,
            "For issue #1 (\"add() returns the difference of its arguments\"), the change edits \
             src/lib.rs, tests/div.rs (+2 -1 lines); all 1 tests pass."
        );
        assert_eq!(
            review.concerns,
            [
                "removes an assertion: `assert!(b != 0);`",
                "adds a possible panic: `let q = a.checked_div(b).unwrap();`"
            ]
        );
    }
}
