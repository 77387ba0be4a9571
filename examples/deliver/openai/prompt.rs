//! The prompts: the issue, the sources and the failing tests, and the one JSON object the
//! answer must be (checked by [`schema`](super::schema)).

use serde::Serialize;

use super::ModelError;
use crate::git::SourceFile;
use crate::workflow::{Issue, TestReport};

/// The most source text a prompt carries, in bytes: a repository whose `.rs` files hold more
/// is refused rather than cut (a plan made from part of the code would be a guess).
pub const MAX_SOURCE_BYTES: usize = 256 * 1024;

/// The instructions every request starts with.
const SYSTEM: &str = "You are a careful software engineer who fixes bugs in a Rust repository \
    with the smallest change that works. You answer with one JSON object and nothing else: no \
    prose, no code fence.";

/// How an edit is written, in both prompts.
const EDIT_SHAPE: &str = r#"{"path": "<a file above, as named there>", "find": "<the exact text to replace, which must occur exactly once in that file; whole lines are best>", "replace": "<the text to put in its place>"}"#;

/// One request's messages: a system message and a user message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The system message.
    pub system: String,
    /// The user message.
    pub user: String,
}

/// The request body of `POST /chat/completions`.
#[derive(Serialize)]
struct Request<'a> {
    model: &'a str,
    messages: [Message<'a>; 2],
    temperature: f32,
    response_format: ResponseFormat,
    stream: bool,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct ResponseFormat {
    #[serde(rename = "type")]
    kind: &'static str,
}

impl Prompt {
    /// The prompt that asks for a plan for `issue`, given `sources`.
    ///
    /// # Errors
    /// [`ModelError::Config`] if the sources hold more than [`MAX_SOURCE_BYTES`].
    pub fn plan(issue: &Issue, sources: &[SourceFile]) -> Result<Prompt, ModelError> {
        let mut user = describe_issue(issue);
        user.push_str(&describe_sources(sources)?);
        user.push_str(&format!(
            "Plan a change that resolves the issue, as edits to these files. Answer with one \
             JSON object: either\n\
             {{\"decision\": \"plan\", \"summary\": \"<one line: the commit subject>\", \
             \"edits\": [{EDIT_SHAPE}]}}\n\
             or, if the issue should not be worked on,\n\
             {{\"decision\": \"decline\", \"reason\": \"<one sentence>\"}}\n"
        ));
        Ok(Prompt {
            system: SYSTEM.to_owned(),
            user,
        })
    }

    /// The prompt that asks for a fix of the failing tests of `report`, given `sources`.
    ///
    /// # Errors
    /// [`ModelError::Config`] if the sources hold more than [`MAX_SOURCE_BYTES`].
    pub fn fix(
        issue: &Issue,
        sources: &[SourceFile],
        report: &TestReport,
    ) -> Result<Prompt, ModelError> {
        let mut user = describe_issue(issue);
        user.push_str(&describe_sources(sources)?);
        user.push_str(&format!(
            "A change for this issue is committed, and the tests were run: {}.\n",
            report.describe()
        ));
        for test in report.failed() {
            user.push_str(&format!("\nFailing test {}", test.name));
            match &test.output {
                Some(output) => user.push_str(&format!(":\n{output}\n")),
                None => user.push('\n'),
            }
        }
        if let Some(errors) = &report.compile_error {
            user.push_str(&format!("\nThe compiler says:\n{errors}\n"));
        }
        user.push_str(&format!(
            "\nPropose a change that makes the tests pass, as edits to the files above. Answer \
             with one JSON object: either\n\
             {{\"decision\": \"fix\", \"summary\": \"<one line: the commit subject>\", \
             \"edits\": [{EDIT_SHAPE}]}}\n\
             or, if you have no fix,\n\
             {{\"decision\": \"none\", \"reason\": \"<one sentence>\"}}\n"
        ));
        Ok(Prompt {
            system: SYSTEM.to_owned(),
            user,
        })
    }

    /// The prompt that asks for a review of a change whose tests pass: the issue, the change
    /// as `git diff` prints it, the tests' outcome.
    ///
    /// # Errors
    /// [`ModelError::Config`] if the diff holds more than [`MAX_SOURCE_BYTES`].
    pub fn review(issue: &Issue, diff: &str, report: &TestReport) -> Result<Prompt, ModelError> {
        if diff.len() > MAX_SOURCE_BYTES {
            return Err(ModelError::Config(format!(
                "the change's diff holds {} bytes, more than the {MAX_SOURCE_BYTES} this client \
                 sends in one prompt",
                diff.len()
            )));
        }
        let mut user = describe_issue(issue);
        user.push_str(&format!(
            "A change for this issue is committed, and the tests pass ({}). The change:\n\n\
             {diff}\n\n\
             Review it before it goes to a human as a pull request: does it resolve the issue, \
             and what should the human look at? Answer with one JSON object:\n\
             {{\"summary\": \"<one paragraph: what the change does>\", \
             \"concerns\": [\"<one thing to look at>\", ...]}}\n\
             (`concerns` may be empty)\n",
            report.describe()
        ));
        Ok(Prompt {
            system: SYSTEM.to_owned(),
            user,
        })
    }

    /// The JSON body of the request to `model`: the two messages, temperature 0 (the same
    /// prompt should get the same answer), the JSON-object response format, no streaming.
    pub fn request_body(&self, model: &str) -> Vec<u8> {
        let request = Request {
            model,
            messages: [
                Message {
                    role: "system",
                    content: &self.system,
                },
                Message {
                    role: "user",
                    content: &self.user,
                },
            ],
            temperature: 0.0,
            response_format: ResponseFormat {
                kind: "json_object",
            },
            stream: false,
        };
        // Strings and numbers only: serializing cannot fail.
        serde_json::to_vec(&request).unwrap_or_default()
    }
}

fn describe_issue(issue: &Issue) -> String {
    format!(
        "Issue #{}: {}\n\n{}\n\n",
        issue.number, issue.title, issue.body
    )
}

/// The sources, each between a header and a footer line that name it.
fn describe_sources(sources: &[SourceFile]) -> Result<String, ModelError> {
    let bytes: usize = sources.iter().map(|f| f.text.len()).sum();
    if bytes > MAX_SOURCE_BYTES {
        return Err(ModelError::Config(format!(
            "the repository's Rust sources hold {bytes} bytes, more than the {MAX_SOURCE_BYTES} \
             this client sends in one prompt"
        )));
    }
    let mut text = format!("The repository's Rust sources ({} files):\n", sources.len());
    for file in sources {
        text.push_str(&format!(
            "\n--- {path}\n{}--- end of {path}\n",
            file.text,
            path = file.path
        ));
    }
    text.push('\n');
    Ok(text)
}
