//! The schema check of the model's answers: the JSON object the prompts ask for, read into
//! the example's [`Decision`] and [`Change`] (with its [`Edit`]s), and each edit checked
//! against the sources it applies to, so that a plan the agent records can be committed.
//!
//! A review: `{"summary": S, "concerns": [S, ...]}`.
//! A plan: `{"decision": "plan", "summary": S, "edits": [E, ...]}` or
//! `{"decision": "decline", "reason": R}`. A fix: `{"decision": "fix", "summary": S,
//! "edits": [E, ...]}` or `{"decision": "none", "reason": R}`. An edit `E`:
//! `{"path": P, "find": F, "replace": T}`, where `P` names one of the sources and `F` occurs
//! exactly once in it (after the edits before it). Other keys are ignored.

use std::fmt;

use serde_json::{Map, Value};

use crate::git::{self, SourceFile};
use crate::model::Decision;
use crate::workflow::{Change, Edit, Review};

/// The most edits one answer may hold.
pub const MAX_EDITS: usize = 50;

/// What is wrong with an answer, and where: `at` is the path of the faulty value
/// (`edits[0].find`; empty for the whole answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// Where, as a path from the answer's root.
    pub at: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.at.is_empty() {
            write!(f, "{}", self.problem)
        } else {
            write!(f, "at `{}`: {}", self.at, self.problem)
        }
    }
}

impl std::error::Error for SchemaError {}

fn wrong(at: &str, problem: impl Into<String>) -> SchemaError {
    SchemaError {
        at: at.to_owned(),
        problem: problem.into(),
    }
}

/// The answer's text as JSON. A model that wraps its object in a Markdown code fence
/// (```` ```json ... ``` ````) despite the prompt is read all the same.
///
/// # Errors
/// The parser's message, with its line and column, if the text is not JSON.
pub fn parse(content: &str) -> Result<Value, String> {
    let text = content.trim();
    let text = text
        .strip_prefix("```json")
        .or_else(|| text.strip_prefix("```"))
        .and_then(|rest| rest.trim_end().strip_suffix("```"))
        .unwrap_or(text);
    serde_json::from_str(text.trim()).map_err(|e| {
        let start: String = content.trim().chars().take(80).collect();
        format!("{e}, in an answer that starts {start:?}")
    })
}

/// A plan: [`Decision::Plan`] with its change, or [`Decision::Decline`].
///
/// # Errors
/// A [`SchemaError`] saying what is missing, of the wrong type, or not applicable.
pub fn plan(answer: &Value, sources: &[SourceFile]) -> Result<Decision, SchemaError> {
    let root = object(answer, "")?;
    match decision(root, &["plan", "decline"])? {
        "plan" => Ok(Decision::Plan(change(root, sources)?)),
        _ => Ok(Decision::Decline {
            reason: text(root, "reason", "")?,
        }),
    }
}

/// A fix: the change, or `None` if the model has none.
///
/// # Errors
/// A [`SchemaError`] saying what is missing, of the wrong type, or not applicable.
pub fn fix(answer: &Value, sources: &[SourceFile]) -> Result<Option<Change>, SchemaError> {
    let root = object(answer, "")?;
    match decision(root, &["fix", "none"])? {
        "fix" => Ok(Some(change(root, sources)?)),
        _ => Ok(None),
    }
}

/// A review: `{"summary": S, "concerns": [S, ...]}` (`concerns` may be empty or missing).
///
/// # Errors
/// A [`SchemaError`] saying what is missing or of the wrong type.
pub fn review(answer: &Value) -> Result<Review, SchemaError> {
    let root = object(answer, "")?;
    let summary = text(root, "summary", "")?;
    let concerns = match root.get("concerns") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
                other => Err(wrong(
                    &format!("concerns[{i}]"),
                    format!("expected a non-empty string, found {}", describe(other)),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(wrong(
                "concerns",
                format!("expected an array of strings, found {}", describe(other)),
            ));
        }
    };
    Ok(Review { summary, concerns })
}

/// The `decision` of `root`, one of `allowed`.
fn decision<'a>(root: &'a Map<String, Value>, allowed: &[&str]) -> Result<&'a str, SchemaError> {
    let expected = || {
        let names: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
        names.join(" or ")
    };
    match root.get("decision") {
        None => Err(wrong(
            "decision",
            format!("missing (expected {})", expected()),
        )),
        Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(s),
        Some(other) => Err(wrong(
            "decision",
            format!("expected {}, found {}", expected(), describe(other)),
        )),
    }
}

/// The `summary` and `edits` of `root`, each edit checked against `sources`.
fn change(root: &Map<String, Value>, sources: &[SourceFile]) -> Result<Change, SchemaError> {
    let summary = text(root, "summary", "")?;
    if summary.contains('\n') {
        return Err(wrong("summary", "expected one line (a commit subject)"));
    }
    let edits = match root.get("edits") {
        None => return Err(wrong("edits", "missing (expected an array of edits)")),
        Some(Value::Array(edits)) if edits.is_empty() => {
            return Err(wrong("edits", "empty: a change needs at least one edit"));
        }
        Some(Value::Array(edits)) if edits.len() > MAX_EDITS => {
            return Err(wrong(
                "edits",
                format!("{} edits, more than {MAX_EDITS}", edits.len()),
            ));
        }
        Some(Value::Array(edits)) => edits,
        Some(other) => {
            return Err(wrong(
                "edits",
                format!("expected an array, found {}", describe(other)),
            ));
        }
    };
    // The files as the edits leave them, so that each edit is checked where it applies.
    let mut texts: Vec<(String, String)> = sources
        .iter()
        .map(|f| (f.path.clone(), f.text.clone()))
        .collect();
    let mut checked = Vec::with_capacity(edits.len());
    for (i, edit) in edits.iter().enumerate() {
        let at = format!("edits[{i}]");
        let fields = object(edit, &at)?;
        let edit = Edit {
            path: text(fields, "path", &at)?,
            find: text(fields, "find", &at)?,
            replace: string(fields, "replace", &at)?,
        };
        git::check_edit_path(&edit.path)
            .map_err(|e| wrong(&format!("{at}.path"), e.to_string()))?;
        let Some((_, file)) = texts.iter_mut().find(|(path, _)| *path == edit.path) else {
            let names: Vec<&str> = sources.iter().map(|f| f.path.as_str()).collect();
            return Err(wrong(
                &format!("{at}.path"),
                format!(
                    "{:?} is not one of the sources ({})",
                    edit.path,
                    names.join(", ")
                ),
            ));
        };
        *file = git::apply_edit(file, &edit)
            .map_err(|e| wrong(&format!("{at}.find"), e.to_string()))?;
        checked.push(edit);
    }
    Ok(Change {
        summary,
        edits: checked,
    })
}

/// `value` as an object.
fn object<'a>(value: &'a Value, at: &str) -> Result<&'a Map<String, Value>, SchemaError> {
    value
        .as_object()
        .ok_or_else(|| wrong(at, format!("expected an object, found {}", describe(value))))
}

/// The string `key` of `fields` (at `at`), which must not be blank; trimmed.
fn text(fields: &Map<String, Value>, key: &str, at: &str) -> Result<String, SchemaError> {
    let value = string(fields, key, at)?;
    if value.trim().is_empty() {
        return Err(wrong(&join(at, key), "empty"));
    }
    Ok(if key == "find" {
        // Edits are exact: only the summary and reasons are trimmed.
        value
    } else {
        value.trim().to_owned()
    })
}

/// The string `key` of `fields` (at `at`), as it is (it may be empty).
fn string(fields: &Map<String, Value>, key: &str, at: &str) -> Result<String, SchemaError> {
    match fields.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        None => Err(wrong(&join(at, key), "missing (expected a string)")),
        Some(other) => Err(wrong(
            &join(at, key),
            format!("expected a string, found {}", describe(other)),
        )),
    }
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    }
}

/// What kind of JSON value `value` is, with a short quote of it.
fn describe(value: &Value) -> String {
    let quoted = || {
        let text = value.to_string();
        let short: String = text.chars().take(40).collect();
        if short.len() < text.len() {
            format!("{short}...")
        } else {
            short
        }
    };
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(_) => format!("the number {}", quoted()),
        Value::String(_) => format!("the string {}", quoted()),
        Value::Array(_) => format!("an array {}", quoted()),
        Value::Object(_) => format!("an object {}", quoted()),
    }
}
