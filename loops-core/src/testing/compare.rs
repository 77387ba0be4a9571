//! What a case of the crash explorer did, and how it compares with the uninterrupted run:
//! the boundaries of a run's writes, and the differences a crash at one of them made.

use std::collections::{BTreeMap, BTreeSet};

use crate::run::settings::StepRun;
use crate::store::RunStatus;
use crate::testing::report::{Boundary, When};
use crate::testing::store::WriteSeen;

/// How a case went.
pub(super) enum Case {
    /// The run ended without being stopped.
    Ended(Ended),
    /// The run was stopped at the boundary, then resumed to its end.
    Stopped(First, Ended),
}

/// What the process stopped at the boundary did.
pub(super) struct First {
    pub(super) writes: Vec<WriteSeen>,
    pub(super) steps: Vec<StepRun>,
}

/// A run at its end, and what the (last) process did.
pub(super) struct Ended {
    pub(super) outcome: Outcome,
    /// The run ids of the child runs it started.
    pub(super) children: Vec<String>,
    /// Its error chain, joined, if it failed.
    pub(super) error: Option<String>,
    /// The names of the events sent to it, in order.
    pub(super) sent: Vec<String>,
    /// `(seq, state, payload)` of each transition record.
    pub(super) history: Vec<(u64, String, String)>,
    pub(super) writes: Vec<WriteSeen>,
    pub(super) steps: Vec<StepRun>,
}

#[derive(PartialEq)]
pub(super) struct Outcome {
    pub(super) status: RunStatus,
    pub(super) state: String,
    pub(super) seq: u64,
    pub(super) payload: String,
}

/// The boundaries of the uninterrupted run's writes (those of `run_id`, the events the
/// explorer sent left out): after each commit; before the commit of the record of a step
/// whose closure ran (not of a value the runtime journals itself, a sleep's wake-up time
/// say: nothing happens between its making and its record).
pub(super) fn boundaries(reference: &Ended, run_id: &str) -> Vec<Boundary> {
    let ran: BTreeSet<StepId> = reference.steps.iter().map(step_id).collect();
    let mut out = Vec::new();
    for write in &reference.writes {
        if write.run_id.as_deref() != Some(run_id) || write.kind == "Send" {
            continue;
        }
        let mut add = |when| {
            out.push(Boundary {
                number: out.len() + 1,
                write: write.n,
                when,
                what: write.what.clone(),
            });
        };
        if write.step.as_ref().is_some_and(|id| ran.contains(id)) {
            add(When::BeforeCommit);
        }
        add(When::AfterCommit);
    }
    out
}

/// The step of a step run, without its key.
type StepId = (u64, String, u32);

fn step_id(run: &StepRun) -> StepId {
    (run.seq, run.name.clone(), run.occurrence)
}

/// What differs between the uninterrupted run and the run stopped at `boundary` (`first`)
/// then resumed (`then`).
pub(super) fn compare(
    reference: &Ended,
    first: &First,
    then: &Ended,
    boundary: &Boundary,
) -> Vec<String> {
    let mut out = Vec::new();
    // The process stopped at the boundary must have made the same writes up to it.
    for (mine, theirs) in first.writes.iter().zip(&reference.writes) {
        if mine.what != theirs.what {
            out.push(format!(
                "before the crash, write {} was the {}, where the uninterrupted run made the {}",
                mine.n, mine.what, theirs.what
            ));
            break;
        }
    }
    if then.outcome != reference.outcome {
        out.push(format!(
            "final state differs: uninterrupted {} `{}` (seq {}) {}, after the crash {} `{}` \
             (seq {}) {}",
            reference.outcome.status,
            reference.outcome.state,
            reference.outcome.seq,
            reference.outcome.payload,
            then.outcome.status,
            then.outcome.state,
            then.outcome.seq,
            then.outcome.payload
        ));
    }
    if then.history != reference.history {
        let at = reference
            .history
            .iter()
            .zip(&then.history)
            .position(|(a, b)| a != b)
            .unwrap_or(reference.history.len().min(then.history.len()));
        let show = |h: &[(u64, String, String)]| {
            h.get(at).map_or_else(
                || "nothing".to_owned(),
                |(seq, state, payload)| format!("seq {seq} `{state}` {payload}"),
            )
        };
        out.push(format!(
            "history differs at record {at}: uninterrupted {}, after the crash {} ({} records \
             against {})",
            show(&reference.history),
            show(&then.history),
            reference.history.len(),
            then.history.len()
        ));
    }
    out.extend(compare_steps(reference, first, then, boundary));
    out
}

/// What differs between two runs without a crash (`first`, `second`), in the order of their
/// writes left aside (concurrent steps may commit in either order): their final state, their
/// history, the writes each made (the failed tries of a step included) and how often each
/// step's closure ran. Empty when the workflow did the same both times, which every
/// comparison of a crashed case with the uninterrupted run takes for granted.
pub(super) fn repeat_differences(first: &Ended, second: &Ended) -> Vec<String> {
    let mut out = Vec::new();
    if first.outcome != second.outcome {
        out.push(format!(
            "the first ended {} in `{}` (seq {}) {}, the second {} in `{}` (seq {}) {}",
            first.outcome.status,
            first.outcome.state,
            first.outcome.seq,
            first.outcome.payload,
            second.outcome.status,
            second.outcome.state,
            second.outcome.seq,
            second.outcome.payload
        ));
    } else if first.history != second.history {
        out.push(format!(
            "their histories differ ({} records against {})",
            first.history.len(),
            second.history.len()
        ));
    }
    let written = |ended: &Ended| ended.writes.iter().map(|w| w.what.clone()).collect();
    for (what, x, y) in count_differences(written(first), written(second)) {
        out.push(format!(
            "the {what} was written {x} time(s) in the first, {y} in the second"
        ));
    }
    let ran = |ended: &Ended| ended.steps.iter().map(step_id).collect();
    for ((seq, name, occurrence), x, y) in count_differences(ran(first), ran(second)) {
        out.push(format!(
            "step `{name}` #{occurrence} of seq {seq} ran its closure {x} time(s) in the \
             first, {y} in the second"
        ));
    }
    out
}

/// The items that `a` and `b` hold a different number of times, with both counts, in
/// order.
fn count_differences<K: Ord>(a: Vec<K>, b: Vec<K>) -> Vec<(K, usize, usize)> {
    let mut counts: BTreeMap<K, (usize, usize)> = BTreeMap::new();
    for k in a {
        counts.entry(k).or_default().0 += 1;
    }
    for k in b {
        counts.entry(k).or_default().1 += 1;
    }
    counts
        .into_iter()
        .filter(|(_, (x, y))| x != y)
        .map(|(k, (x, y))| (k, x, y))
        .collect()
}

/// Checks the runs of the step closures: see [`Explorer::run`].
fn compare_steps(
    reference: &Ended,
    first: &First,
    then: &Ended,
    boundary: &Boundary,
) -> Vec<String> {
    let count = |runs: &mut dyn Iterator<Item = &StepRun>| {
        let mut counts: BTreeMap<StepId, (usize, BTreeSet<String>)> = BTreeMap::new();
        for run in runs {
            let entry = counts.entry(step_id(run)).or_default();
            entry.0 += 1;
            entry.1.insert(run.key.clone());
        }
        counts
    };
    let recorded = |w: &&WriteSeen| matches!(w.kind, "Step" | "Failure");
    let committed: BTreeSet<StepId> = first
        .writes
        .iter()
        .filter(|w| !(w.n == boundary.write && boundary.when == When::BeforeCommit))
        .filter(recorded)
        .filter_map(|w| w.step.clone())
        .collect();
    // A step with a failed try runs again in a later attempt, and a crash can add an attempt
    // (an interrupted one does not count against the retry policy): how often its closure
    // runs is not compared, only its keys.
    let failed: BTreeSet<StepId> = (reference.writes.iter())
        .chain(&first.writes)
        .chain(&then.writes)
        .filter(|w| w.kind == "Failure")
        .filter_map(|w| w.step.clone())
        .collect();
    // Started before the crash, not recorded by it: the closures stopped between their
    // effect and their record, which run again after the crash.
    let stopped: BTreeSet<StepId> = first
        .steps
        .iter()
        .map(step_id)
        .filter(|id| !committed.contains(id))
        .collect();
    let expected = count(&mut reference.steps.iter());
    let actual = count(&mut first.steps.iter().chain(&then.steps));
    let mut out = Vec::new();
    if boundary.when == When::BeforeCommit {
        let own = first
            .writes
            .iter()
            .find(|w| w.n == boundary.write && recorded(w))
            .and_then(|w| w.step.clone());
        // (A step with failed tries has a record of an earlier try: its runs are not told
        // apart.)
        if let Some(own) = own.filter(|id| !stopped.contains(id) && !failed.contains(id)) {
            out.push(format!(
                "step `{}` #{} of seq {} was stopped before its record, but its closure had not run",
                own.1, own.2, own.0
            ));
        }
    }
    let ids: BTreeSet<&StepId> = expected.keys().chain(actual.keys()).collect();
    for id in ids {
        let want = expected.get(id).map_or(0, |e| e.0) + usize::from(stopped.contains(id));
        let (got, keys) = actual
            .get(id)
            .map_or((0, BTreeSet::new()), |a| (a.0, a.1.clone()));
        let (seq, name, occurrence) = id;
        if got != want && !failed.contains(id) {
            let why = if stopped.contains(id) {
                "it was stopped between its effect and its record"
            } else if committed.contains(id) {
                "its record had committed before the crash"
            } else {
                "it had not run before the crash"
            };
            out.push(format!(
                "step `{name}` #{occurrence} of seq {seq} ran its closure {got} times, expected \
                 {want} ({why})"
            ));
        }
        if keys.len() > 1 {
            out.push(format!(
                "step `{name}` #{occurrence} of seq {seq} got different idempotency keys: {}",
                keys.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    out
}
