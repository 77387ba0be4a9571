//! `Chain`: a workflow of `links` states, each running one journaled side effect recorded in
//! a ledger kept outside the store; and the checks that every run ended exactly once, with no
//! gap or duplicate in its history and no effect run again after its record committed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use loops::{Context, RunStatus, Workflow};
use loops_core::Store;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(name = "chain")]
pub enum Chain {
    #[initial]
    #[next(Link)]
    Start { links: u32 },
    #[next(Link, End)]
    Link { i: u32, links: u32 },
    #[terminal]
    End { links: u32 },
}

/// Where side effects go: performs one and returns the id of this execution.
pub trait Ledger: Send + Sync {
    fn effect(&self, run_id: &str, seq: u64) -> String;
}

pub struct Linker {
    pub ledger: Arc<dyn Ledger>,
    /// How long each link takes after its effect.
    pub delay: Duration,
}

impl ChainHandler for Linker {
    type Error = anyhow::Error;

    async fn start(&self, _ctx: &Context, links: u32) -> Result<StartNext, Self::Error> {
        Ok(StartNext::Link { i: 0, links })
    }

    async fn link(&self, ctx: &Context, i: u32, links: u32) -> Result<LinkNext, Self::Error> {
        let exec: String = ctx
            .step("effect", || async {
                Ok(self.ledger.effect(ctx.run_id(), ctx.seq()))
            })
            .await?;
        anyhow::ensure!(!exec.is_empty(), "empty execution id");
        tokio::time::sleep(self.delay).await;
        Ok(if i + 1 == links {
            LinkNext::End { links }
        } else {
            LinkNext::Link { i: i + 1, links }
        })
    }
}

/// What the checks found.
#[derive(Debug, Default)]
pub struct Report {
    /// Effects that ran more than once for one link, before its record committed (the
    /// window no store can close).
    pub repeated_before_record: usize,
}

/// Checks every run of `run_ids` against the ledger's lines (`run seq exec`, in the order
/// they were appended). Panics on the first violation.
pub async fn verify(
    store: &dyn Store,
    run_ids: &[String],
    links: u32,
    ledger: &[String],
) -> Report {
    let mut lines: BTreeMap<(String, u64), Vec<String>> = BTreeMap::new();
    for line in ledger {
        let mut parts = line.split(' ');
        let (Some(run), Some(seq), Some(exec)) = (parts.next(), parts.next(), parts.next()) else {
            panic!("bad ledger line {line:?}");
        };
        lines
            .entry((run.to_owned(), seq.parse().unwrap()))
            .or_default()
            .push(exec.to_owned());
    }
    let mut report = Report::default();
    let mut seen = BTreeSet::new();
    for run_id in run_ids {
        let info = store.run_info(run_id).await.unwrap().unwrap();
        assert_eq!(info.status, RunStatus::Completed, "{run_id}: {info:?}");
        let history = store.history(run_id).await.unwrap();
        let states: Vec<(u64, String)> = history.iter().map(|r| (r.seq, r.state.clone())).collect();
        let mut expected = vec![(0, "Start".to_owned())];
        expected.extend((1..=u64::from(links)).map(|s| (s, "Link".to_owned())));
        expected.push((u64::from(links) + 1, "End".to_owned()));
        assert_eq!(
            states, expected,
            "{run_id}: a gap, a duplicate or a wrong state"
        );
        for (seq, record) in history.iter().enumerate() {
            assert_eq!(record.seq, seq as u64);
        }
        for seq in 1..=u64::from(links) {
            let steps = store.steps(run_id, seq).await.unwrap();
            assert_eq!(steps.len(), 1, "{run_id} seq {seq}: {steps:?}");
            let recorded: String = serde_json::from_str(steps[0].2.output.get()).unwrap();
            let execs = lines.get(&(run_id.clone(), seq)).unwrap_or_else(|| {
                panic!("{run_id} seq {seq}: recorded {recorded} but no effect ran")
            });
            let at = execs
                .iter()
                .position(|e| *e == recorded)
                .unwrap_or_else(|| {
                    panic!("{run_id} seq {seq}: recorded {recorded}, not in the ledger {execs:?}")
                });
            assert_eq!(
                at + 1,
                execs.len(),
                "{run_id} seq {seq}: the effect ran again after its record ({recorded}): {execs:?}"
            );
            report.repeated_before_record += at;
            seen.insert((run_id.clone(), seq));
        }
    }
    let extra: Vec<_> = lines.keys().filter(|k| !seen.contains(*k)).collect();
    assert!(
        extra.is_empty(),
        "effects of links that do not exist: {extra:?}"
    );
    report
}
