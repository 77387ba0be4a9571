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
    /// Its child runs, theirs after them, and so on (each listed after its parent), with
    /// their ends: compared as the explored run's own.
    pub(super) descendants: Vec<Member>,
    /// Its error chain, joined, if it failed.
    pub(super) error: Option<String>,
    /// `(seq, state, payload)` of each transition record.
    pub(super) history: Vec<(u64, String, String)>,
    pub(super) writes: Vec<WriteSeen>,
    pub(super) steps: Vec<StepRun>,
}

/// A descendant of the explored run at the end of a case.
#[derive(PartialEq)]
pub(super) struct Member {
    pub(super) run_id: String,
    pub(super) outcome: Outcome,
    pub(super) history: Vec<(u64, String, String)>,
}

impl Ended {
    /// The explored run `run_id` and its descendants.
    pub(super) fn family<'a>(&'a self, run_id: &'a str) -> BTreeSet<&'a str> {
        std::iter::once(run_id)
            .chain(self.descendants.iter().map(|m| m.run_id.as_str()))
            .collect()
    }
}

#[derive(PartialEq)]
pub(super) struct Outcome {
    pub(super) status: RunStatus,
    pub(super) state: String,
    pub(super) seq: u64,
    pub(super) payload: String,
}

/// The boundaries of the uninterrupted run's writes (those of `run_id` and of its
/// descendants, the events the explorer sent left out): after each commit; before the commit
/// of the record of a step whose closure ran (not of a value the runtime journals itself, a
/// sleep's wake-up time say: nothing happens between its making and its record). A
/// descendant's boundary names its run.
pub(super) fn boundaries(reference: &Ended, run_id: &str) -> Vec<Boundary> {
    let ran: BTreeSet<StepId> = reference.steps.iter().map(step_id).collect();
    let family = reference.family(run_id);
    let mut out = Vec::new();
    for write in &reference.writes {
        let Some(run) = write.run_id.as_deref().filter(|run| family.contains(run)) else {
            continue;
        };
        if write.kind == "Send" {
            continue;
        }
        let what = if run == run_id {
            write.what.clone()
        } else {
            format!("{} of run `{run}`", write.what)
        };
        let mut add = |when| {
            out.push(Boundary {
                number: out.len() + 1,
                write: write.n,
                run_id: run.to_owned(),
                nth: write.nth,
                when,
                what: what.clone(),
            });
        };
        if written_step(write).is_some_and(|id| ran.contains(&id)) {
            add(When::BeforeCommit);
        }
        add(When::AfterCommit);
    }
    out
}

/// The step of a step run, without its key: its run, seq, name and occurrence.
type StepId = (String, u64, String, u32);

fn step_id(run: &StepRun) -> StepId {
    (
        run.run_id.clone(),
        run.seq,
        run.name.clone(),
        run.occurrence,
    )
}

/// The step `write` records (a step's record, a failed try, a wait's outcome), if any.
fn written_step(write: &WriteSeen) -> Option<StepId> {
    let (seq, name, occurrence) = write.step.clone()?;
    Some((write.run_id.clone()?, seq, name, occurrence))
}

/// Whether `write` is the write `boundary` is at.
fn is_at(write: &WriteSeen, boundary: &Boundary) -> bool {
    write.nth == boundary.nth && write.run_id.as_deref() == Some(boundary.run_id.as_str())
}

/// What differs between the uninterrupted run and the run stopped at `boundary` (`first`)
/// then resumed (`then`).
pub(super) fn compare(
    explored: &str,
    reference: &Ended,
    first: &First,
    then: &Ended,
    boundary: &Boundary,
) -> Vec<String> {
    let mut out = Vec::new();
    // The process stopped at the boundary must have made the same writes up to it, run by
    // run (a parent's and its children's writes may interleave otherwise).
    for run in reference.family(explored) {
        let of = |writes: &[WriteSeen]| -> Vec<(u64, String)> {
            writes
                .iter()
                .filter(|w| w.run_id.as_deref() == Some(run))
                .map(|w| (w.nth, w.what.clone()))
                .collect()
        };
        let (mine, theirs) = (of(&first.writes), of(&reference.writes));
        if let Some(((nth, mine), (_, theirs))) = mine
            .iter()
            .zip(&theirs)
            .find(|(mine, theirs)| mine.1 != theirs.1)
        {
            out.push(format!(
                "before the crash, write {nth} of run `{run}` was the {mine}, where the \
                 uninterrupted run made the {theirs}"
            ));
        }
    }
    for (theirs, mine) in reference.descendants.iter().zip(&then.descendants) {
        if theirs.run_id != mine.run_id {
            out.push(format!(
                "after the crash the run has the descendant `{}` where the uninterrupted run \
                 had `{}`",
                mine.run_id, theirs.run_id
            ));
        } else if theirs.outcome != mine.outcome {
            let (a, b) = (&theirs.outcome, &mine.outcome);
            out.push(format!(
                "child run `{}` ended {} `{}` (seq {}) {}, where the uninterrupted run's ended \
                 {} `{}` (seq {}) {}",
                mine.run_id,
                b.status,
                b.state,
                b.seq,
                b.payload,
                a.status,
                a.state,
                a.seq,
                a.payload
            ));
        } else if theirs.history != mine.history {
            out.push(format!(
                "child run `{}`'s history differs from the uninterrupted run's ({} records \
                 against {})",
                mine.run_id,
                mine.history.len(),
                theirs.history.len()
            ));
        }
    }
    if reference.descendants.len() != then.descendants.len() {
        out.push(format!(
            "the run has {} descendant run(s) after the crash, where the uninterrupted run had {}",
            then.descendants.len(),
            reference.descendants.len()
        ));
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
    out.extend(compare_steps(explored, reference, first, then, boundary));
    out
}

/// What differs between two runs without a crash (`first`, `second`), in the order of their
/// writes left aside (concurrent steps may commit in either order): their final state, their
/// history, the writes each made (the failed tries of a step included) and how often each
/// step's closure ran. Empty when the workflow did the same both times, which every
/// comparison of a crashed case with the uninterrupted run takes for granted.
pub(super) fn repeat_differences(explored: &str, first: &Ended, second: &Ended) -> Vec<String> {
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
    for ((run, seq, name, occurrence), x, y) in count_differences(ran(first), ran(second)) {
        let run = of_run(explored, &run);
        out.push(format!(
            "step `{name}` #{occurrence} of seq {seq}{run} ran its closure {x} time(s) in the \
             first, {y} in the second"
        ));
    }
    out
}

/// ` of run `RUN`` for a run other than the explored one, `explored`; nothing for it.
fn of_run(explored: &str, run: &str) -> String {
    if run == explored {
        String::new()
    } else {
        format!(" of run `{run}`")
    }
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
    explored: &str,
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
        .filter(|w| !(is_at(w, boundary) && boundary.when == When::BeforeCommit))
        .filter(recorded)
        .filter_map(written_step)
        .collect();
    // A step with a failed try runs again in a later attempt, and a crash can add an attempt
    // (an interrupted one does not count against the retry policy): how often its closure
    // runs is not compared, only its keys.
    let failed: BTreeSet<StepId> = (reference.writes.iter())
        .chain(&first.writes)
        .chain(&then.writes)
        .filter(|w| w.kind == "Failure")
        .filter_map(written_step)
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
            .find(|w| is_at(w, boundary) && recorded(w))
            .and_then(written_step);
        // (A step with failed tries has a record of an earlier try: its runs are not told
        // apart.)
        if let Some(own) = own.filter(|id| !stopped.contains(id) && !failed.contains(id)) {
            out.push(format!(
                "step `{}` #{} of seq {}{} was stopped before its record, but its closure had \
                 not run",
                own.2,
                own.3,
                own.1,
                of_run(explored, &own.0)
            ));
        }
    }
    let ids: BTreeSet<&StepId> = expected.keys().chain(actual.keys()).collect();
    for id in ids {
        let want = expected.get(id).map_or(0, |e| e.0) + usize::from(stopped.contains(id));
        let (got, keys) = actual
            .get(id)
            .map_or((0, BTreeSet::new()), |a| (a.0, a.1.clone()));
        let (run, seq, name, occurrence) = id;
        let run = of_run(explored, run);
        if got != want && !failed.contains(id) {
            let why = if stopped.contains(id) {
                "it was stopped between its effect and its record"
            } else if committed.contains(id) {
                "its record had committed before the crash"
            } else {
                "it had not run before the crash"
            };
            out.push(format!(
                "step `{name}` #{occurrence} of seq {seq}{run} ran its closure {got} times, expected \
                 {want} ({why})"
            ));
        }
        if keys.len() > 1 {
            out.push(format!(
                "step `{name}` #{occurrence} of seq {seq}{run} got different idempotency keys: {}",
                keys.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    out
}
