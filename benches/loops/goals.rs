//! The goals table of the results: every goal of issue 19 (and issue 13's resume goal, which
//! issue 19 keeps: resume flat in history length), each with its figure from this run and
//! met, missed, or not measured (a scenario this run left out, or a goal no figure decides).

use std::fmt::Write as _;

use crate::latency::Variant;
use crate::report::{Report, met, thousands};

const NOT_RUN: &str = "not measured in this run";

/// Appends the goals table of `r` to `s`.
pub fn table(s: &mut String, r: &Report) {
    let _ = writeln!(
        s,
        "### Goals\n\nIssue 19's goals, numbered as in the issue; each figure is from this run \
         (a goal whose scenario this run left out says so).\n\n\
         | goal | measured | |\n|---|---|---|"
    );
    throughput(s, r);
    resume_flat(s, r);
    lone(s, r);
    cpu(s, r);
    match &r.parked {
        Some(x) => crate::parked::goals(s, x, met, thousands),
        None => {
            let _ = writeln!(
                s,
                "| 3. 1 000 000 parked runs: started in under 2 s, under 1 GiB | {NOT_RUN} (`--only parked`) | |"
            );
        }
    }
    let _ = writeln!(
        s,
        "| 4. PostgreSQL: one round trip per commit, at least 0.8x pgbench's INSERT+COMMIT floor at the same connections; 1, 2, 4 workers | measured by loops-postgres's own benchmark, which needs a server (`cargo test --release -p loops-postgres --test bench -- --ignored --nocapture`): section 11 above and docs/postgres.md, \"Benchmarks\" | not measured in this run |"
    );
    langgraph(s, r);
    let _ = writeln!(
        s,
        "| 6. a store of the previous format upgraded by `loops upgrade` (backup beside it), or refused in one line naming both formats and the command | every open and command refuses a file of format 1 or 2 in one line naming both formats and `loops upgrade PATH`, which converts it to format {} after copying it to `<file>.format-N.bak`, N its format (tests/store_format.rs, with a fixture made by each older format's build; loops-cli's upgrade test) | **met** |",
        loops::STORE_FORMAT
    );
}

/// Goal 1: 20x at 64 runs, 30x at 256.
fn throughput(s: &mut String, r: &Report) {
    let Some(t) = &r.throughput else {
        let _ = writeln!(
            s,
            "| 1. at least 20x one-commit-per-transition at 64 runs, 30x at 256 | {NOT_RUN} | |"
        );
        return;
    };
    for &(runs, goal) in &t.goals {
        let Some(p) = t.points.iter().find(|p| p.runs == runs) else {
            let _ = writeln!(
                s,
                "| 1. at least {goal}x one-commit-per-transition at {runs} runs | {NOT_RUN} ({runs} runs not among `--runs`) | |"
            );
            continue;
        };
        let _ = writeln!(
            s,
            "| 1. at least {goal}x one-commit-per-transition at {runs} runs | {:.1}x (ceiling of this layout {:.1}x; {:.1} transitions per commit on average, p50 {}) | {} |",
            p.ratio,
            p.ceiling_per_s / p.floor_per_s,
            p.batches.mean,
            p.batches.p50,
            met(p.ratio >= goal)
        );
    }
}

/// Goal 1's "resume flat in history length" (issue 13's goal 4).
fn resume_flat(s: &mut String, r: &Report) {
    let Some(x) = &r.resume else {
        let _ = writeln!(
            s,
            "| 1. resume stays flat in history length | {NOT_RUN} | |"
        );
        return;
    };
    let (a, b) = (&x.points[0], &x.points[x.points.len() - 1]);
    let _ = writeln!(
        s,
        "| 1. resume stays flat: after {} transitions within {}x of after {} (time and memory) | time {:.2}x (in floors; wall {:.2}x, without `verify_on_open` {:.2}x), memory {:.2}x | {} |",
        thousands(b.records as f64),
        x.goal,
        thousands(a.records as f64),
        x.ratio_resume_floors,
        x.ratio_resume,
        x.ratio_resume_no_verify,
        x.ratio_memory,
        met(x.goal_met)
    );
}

/// Goal 2: a lone transition within 1.10x of a raw commit.
fn lone(s: &mut String, r: &Report) {
    let Some(l) = &r.latency else {
        let _ = writeln!(
            s,
            "| 2. a lone transition within 1.10x of a raw single-record commit, p50 and p99 | {NOT_RUN} | |"
        );
        return;
    };
    let t = l.variant(Variant::Transition);
    let _ = writeln!(
        s,
        "| 2. a lone transition within {}x of a raw single-record commit, p50 and p99 | p50 {:.2}x, p99 {:.2}x | {} |",
        l.goal,
        t.ratio_p50,
        t.ratio_p99,
        met(l.goal_met)
    );
}

/// Goal 2: CPU per transition at 64 runs within 1.3x a raw record's.
fn cpu(s: &mut String, r: &Report) {
    const GOAL: f64 = 1.3;
    let point = r
        .throughput
        .as_ref()
        .and_then(|t| t.points.iter().find(|p| p.runs == 64));
    let Some(p) = point else {
        let _ = writeln!(
            s,
            "| 2. CPU per transition at 64 runs within {GOAL}x a raw record's | {NOT_RUN} | |"
        );
        return;
    };
    let ratio = p.loops_cpu_us / p.ceiling_cpu_us;
    let _ = writeln!(
        s,
        "| 2. CPU per transition at 64 runs within {GOAL}x a raw record's (raw redb, 64 log records and rows per commit) | {:.1} µs against {:.1} µs: {:.2}x | {} |",
        p.loops_cpu_us,
        p.ceiling_cpu_us,
        ratio,
        met(ratio <= GOAL)
    );
}

/// Goal 5: resume at or below LangGraph + SqliteSaver's.
fn langgraph(s: &mut String, r: &Report) {
    let Some(c) = &r.compare else {
        let _ = writeln!(
            s,
            "| 5. resume (open to first new step) at or below LangGraph + SqliteSaver's | {NOT_RUN} (`--only compare`) | |"
        );
        return;
    };
    let rows: Vec<String> = c
        .resume
        .iter()
        .map(|row| match &row.langgraph {
            Some(lg) => format!(
                "{} transitions: loops {:.2} ms, LangGraph {:.2} ms ({:.2}x; to the step's commit {:.2} against {:.2} ms)",
                thousands(row.records as f64),
                row.loops_entry_us / 1000.0,
                lg.entry_total_us / 1000.0,
                row.loops_entry_us / lg.entry_total_us,
                row.loops_total_us / 1000.0,
                lg.total_us / 1000.0,
            ),
            None => format!(
                "{} transitions: loops {:.2} ms",
                thousands(row.records as f64),
                row.loops_entry_us / 1000.0
            ),
        })
        .collect();
    let measured = !c.resume.is_empty() && c.resume.iter().all(|row| row.langgraph.is_some());
    let verdict = if measured {
        met(c.resume.iter().all(|row| {
            row.langgraph
                .as_ref()
                .is_some_and(|lg| row.loops_entry_us <= lg.entry_total_us)
        }))
    } else {
        "not measured: LangGraph not installed (docs/benchmarks.md, \"Run it\")"
    };
    let _ = writeln!(
        s,
        "| 5. resume (open to first new step) at or below LangGraph + SqliteSaver's | {} | {} |",
        rows.join("; "),
        verdict
    );
}
