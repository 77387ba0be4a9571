//! What a run's model calls cost, read from its journal: the tokens each recorded model step
//! spent, and on a resume the tokens the journal saved (recorded calls are never made again).
//!
//! Everything here is computed from the recorded step outputs ([`Answer`]s of the steps in
//! [`MODEL_STEPS`]), so it says the same whichever process made the calls.

use anyhow::{Context as _, Result};
use loops::Runtime;
use serde::de::IgnoredAny;

use crate::agent::MODEL_STEPS;
use crate::model::{Answer, Usage};

/// One model call recorded in a run's journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCall {
    /// The seq of the state whose handler made it.
    pub seq: u64,
    /// The step's name (`plan`, `fix`).
    pub step: String,
    /// Which use of the name in that state, from 0.
    pub occurrence: u32,
    /// What it cost.
    pub usage: Usage,
}

/// Every model call recorded for the run `run_id`, by seq (none if the run does not exist).
///
/// # Errors
/// If the store cannot be read, or a model step's recorded output has no readable usage (it
/// was recorded by a build whose step output differed).
pub async fn recorded_calls(runtime: &Runtime, run_id: &str) -> Result<Vec<ModelCall>> {
    let Some(info) = runtime.run_info(run_id).await? else {
        return Ok(Vec::new());
    };
    let mut calls = Vec::new();
    for seq in 0..=info.seq {
        for (step, occurrence, record) in runtime.store().steps(run_id, seq).await? {
            if !MODEL_STEPS.contains(&step.as_str()) {
                continue;
            }
            let answer: Answer<IgnoredAny> = serde_json::from_str(record.output.get())
                .with_context(|| {
                    format!(
                        "run {run_id}, seq {seq}: the recorded output of step {step}#{occurrence} \
                     has no usage"
                    )
                })?;
            calls.push(ModelCall {
                seq,
                step,
                occurrence,
                usage: answer.usage,
            });
        }
    }
    Ok(calls)
}

/// The summary's lines: the tokens each call in `calls` (every recorded call of the run)
/// spent and their total; then, if `resumed` and `saved` (the calls recorded before this
/// process started driving the run) is not empty, what the journal saved:
///
/// ```text
/// tokens: plan (seq 0) 1,350, fix (seq 3) 1,590; 2,940 in all (2,700 prompt, 240 completion) over 2 model calls
/// resumed: 1 model call, 1,350 tokens not spent again
/// ```
///
/// (with the scripted model, which spends none: `resumed: 1 model call not made again`).
pub fn summary(calls: &[ModelCall], saved: &[ModelCall], resumed: bool) -> Vec<String> {
    let mut lines = Vec::new();
    if calls.is_empty() {
        return lines;
    }
    let each: Vec<String> = calls
        .iter()
        .map(|c| {
            let name = if c.occurrence == 0 {
                c.step.clone()
            } else {
                format!("{}#{}", c.step, c.occurrence)
            };
            format!(
                "{name} (seq {}) {}",
                c.seq,
                thousands(c.usage.total_tokens())
            )
        })
        .collect();
    let all = total(calls);
    if all.requests == 0 {
        lines.push(format!(
            "tokens: none: {} to a model that makes no requests (the scripted stand-in)",
            model_calls(calls.len())
        ));
    } else {
        lines.push(format!(
            "tokens: {}; {} in all ({} prompt, {} completion) over {}",
            each.join(", "),
            thousands(all.total_tokens()),
            thousands(all.prompt_tokens),
            thousands(all.completion_tokens),
            model_calls(calls.len()),
        ));
    }
    if resumed && !saved.is_empty() {
        let spent = total(saved);
        lines.push(if spent.requests == 0 {
            format!("resumed: {} not made again", model_calls(saved.len()))
        } else {
            format!(
                "resumed: {}, {} tokens not spent again",
                model_calls(saved.len()),
                thousands(spent.total_tokens())
            )
        });
    }
    lines
}

/// The usage of `calls` added up.
pub fn total(calls: &[ModelCall]) -> Usage {
    calls
        .iter()
        .fold(Usage::default(), |sum, c| sum.plus(c.usage))
}

/// "1 model call", "3 model calls".
fn model_calls(n: usize) -> String {
    if n == 1 {
        "1 model call".to_owned()
    } else {
        format!("{n} model calls")
    }
}

/// `n` with a comma between each group of three digits: `2,140`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(seq: u64, step: &str, prompt: u64, completion: u64) -> ModelCall {
        ModelCall {
            seq,
            step: step.to_owned(),
            occurrence: 0,
            usage: Usage {
                requests: 1,
                prompt_tokens: prompt,
                completion_tokens: completion,
            },
        }
    }

    #[test]
    fn thousands_are_grouped() {
        let cases = [
            (0, "0"),
            (7, "7"),
            (999, "999"),
            (1_000, "1,000"),
            (2_140, "2,140"),
            (123_456, "123,456"),
            (1_234_567, "1,234,567"),
            (u64::MAX, "18,446,744,073,709,551,615"),
        ];
        for (n, text) in cases {
            assert_eq!(thousands(n), text);
        }
    }

    #[test]
    fn the_summary_says_what_each_call_spent_and_what_a_resume_saved() {
        let calls = [call(0, "plan", 1_200, 150), call(3, "fix", 1_500, 90)];
        assert_eq!(
            summary(&calls, &calls[..1], true),
            [
                "tokens: plan (seq 0) 1,350, fix (seq 3) 1,590; 2,940 in all (2,700 prompt, 240 \
                 completion) over 2 model calls",
                "resumed: 1 model call, 1,350 tokens not spent again",
            ]
        );
        // Not resumed (a new run, or one reported after it ended): no saving is claimed.
        assert_eq!(summary(&calls, &calls, false).len(), 1);
        // Resumed before any model call was recorded: nothing saved.
        assert_eq!(summary(&calls, &[], true).len(), 1);
        assert!(summary(&[], &[], true).is_empty());
        let mut again = call(3, "fix", 1, 2);
        again.occurrence = 1;
        assert!(summary(&[again], &[], false)[0].starts_with("tokens: fix#1 (seq 3) 3; 3 in all"));
        // The scripted model's calls make no requests.
        let free = |seq, step: &str| ModelCall {
            usage: Usage::default(),
            ..call(seq, step, 0, 0)
        };
        let free = [free(0, "plan"), free(3, "fix")];
        assert_eq!(
            summary(&free, &free[..1], true),
            [
                "tokens: none: 2 model calls to a model that makes no requests (the scripted \
                 stand-in)",
                "resumed: 1 model call not made again",
            ]
        );
    }
}
