//! The two versions of the workflow in one binary: which one drives a run, the store's
//! runtime that knows both and the migration between them, and the dry run.
//!
//! This build starts new runs on version 2 ([`v2::Deliver`]). A run recorded by version 1
//! is migrated to version 2 at its current state when the migration takes that state
//! (`impl Migrate<v1::Deliver> for v2::Deliver`, in `workflow.rs`), and finishes on version
//! 1's kept handler otherwise (a `Tested` run whose tests pass: it may have been approved and
//! pushed already, in a state version 2 splits in two). `--workflow-version 1` makes the
//! binary the previous release: version 1 only, which refuses (and marks blocked) a run
//! recorded by version 2, for tests that play a rolling upgrade.

use std::path::Path;

use anyhow::{Result, bail};
use loops::{
    Context, Migration, MigrationFailure, Route, RunInfo, RunStatus, Runtime, RuntimeBuilder,
    StartOptions, TransitionRecord, Workflow as _,
};

use crate::agent::Agent;
use crate::agent::EditApplier;
use crate::git::Git;
use crate::model::Model;
use crate::workflow::edit::{EditRun, EditRunHandler, RequestedNext};
use crate::workflow::{
    APPROVAL_EVENT, Base, Change, Edit, Issue, Review, TestReport, Work, v1, v2,
};

/// The versions a build drives: `--workflow-version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Release {
    /// The previous release: version 1 only.
    #[value(name = "1")]
    V1,
    /// This release: version 2 for new runs, version 1's runs migrated or finished on it.
    #[value(name = "2")]
    V2,
}

/// The runtime's builder for `release`: the versions it declares and the migration.
pub fn builder(release: Release) -> RuntimeBuilder {
    match release {
        Release::V1 => Runtime::builder().workflow::<v1::Deliver>(),
        Release::V2 => Runtime::builder()
            .workflow::<v1::Deliver>()
            .workflow::<v2::Deliver>()
            .migration::<v1::Deliver, v2::Deliver>(),
    }
}

/// For `release` 2, whose `Planned` starts one child run per edit: registers their handler
/// ([`EditApplier`], on the repository `git`) so that `runtime` drives them in the background,
/// and resumes the children a killed process left unfinished (`Runtime::resume_all`, which
/// takes the runs of registered workflows only: the `deliver` run is driven by
/// [`drive`]). Version 1 starts no children: nothing is done for it.
///
/// # Errors
/// The store's, as `Runtime::resume_all` returns them.
pub async fn drive_children(runtime: &Runtime, release: Release, git: &Git) -> loops::Result<()> {
    if release == Release::V2 {
        runtime.register::<EditRun, _>(EditApplier { git: git.clone() });
        runtime.resume_all().await?;
    }
    Ok(())
}

/// How a run ended, whichever version drove it.
pub enum Finished {
    /// The pull request is open.
    PrOpened {
        /// Its number.
        number: u64,
        /// Its address.
        url: String,
        /// The pushed branch.
        branch: String,
        /// The commit the branch points at.
        head: String,
    },
    /// The agent gave up.
    Abandoned {
        /// Why.
        reason: String,
    },
}

impl Finished {
    /// The line that says how the run ended, wherever it was driven: `pull request: URL`, or
    /// that nothing was pushed.
    pub fn outcome(&self) -> String {
        match self {
            Finished::PrOpened { url, .. } => format!("pull request: {url}"),
            Finished::Abandoned { .. } => "abandoned: nothing was pushed".to_owned(),
        }
    }

    /// The terminal state's name.
    pub fn state(&self) -> &'static str {
        match self {
            Finished::PrOpened { .. } => "PrOpened",
            Finished::Abandoned { .. } => "Abandoned",
        }
    }
}

impl TryFrom<v1::Deliver> for Finished {
    type Error = anyhow::Error;

    fn try_from(last: v1::Deliver) -> Result<Finished> {
        Ok(match last {
            v1::Deliver::PrOpened {
                number,
                url,
                branch,
                head,
            } => Finished::PrOpened {
                number,
                url,
                branch,
                head,
            },
            v1::Deliver::Abandoned { reason } => Finished::Abandoned { reason },
            other => bail!("the run ended in a non-terminal state: {other:?}"),
        })
    }
}

impl TryFrom<v2::Deliver> for Finished {
    type Error = anyhow::Error;

    fn try_from(last: v2::Deliver) -> Result<Finished> {
        Ok(match last {
            v2::Deliver::PrOpened {
                number,
                url,
                branch,
                head,
            } => Finished::PrOpened {
                number,
                url,
                branch,
                head,
            },
            v2::Deliver::Abandoned { reason } => Finished::Abandoned { reason },
            other => bail!("the run ended in a non-terminal state: {other:?}"),
        })
    }
}

/// How the run `run_id` ended, from its terminal `record` (its payload opened), whichever
/// version wrote it.
///
/// # Errors
/// The payload is not a state of the version its schema names, or not a terminal one.
pub fn finished_of(run_id: &str, record: &TransitionRecord) -> Result<Finished> {
    if record.schema == v1::Deliver::SCHEMA_HASH.pinned() {
        Finished::try_from(record.decode::<v1::Deliver>(run_id)?)
    } else {
        Finished::try_from(record.decode::<v2::Deliver>(run_id)?)
    }
}

/// What to do with a run that failed (its states ran out of attempts), after the failure.
pub const AFTER_A_FAILED_RUN: &str =
    "Run with --retry to resume it with a fresh budget of attempts, or with --fresh to start over";

/// How the run `run_id` ended, from what driving it returned: its last state, or the error
/// to print (a schema refusal says whether the run is blocked or ended under another build;
/// a failed run says how to go on).
pub async fn ended_with(
    runtime: &Runtime,
    run_id: &str,
    result: loops::Result<Result<Finished>>,
) -> Result<Finished> {
    let result = match result {
        // A run of a version this build does not compile: blocked and left as it is, or, if
        // it has ended, only unreadable here. The refusal says why and what changed (the one
        // place that says it).
        Err(e @ loops::Error::SchemaMismatch { .. }) => {
            let ended = runtime
                .run_info(run_id)
                .await?
                .is_some_and(|info| info.status.is_ended());
            let what = if ended {
                "has ended under a version this build does not compile, so its result is not \
                 read here (run the build that ended it)"
            } else {
                "is blocked: this build cannot drive it, and leaves it as it is for a build \
                 that can"
            };
            return Err(anyhow::anyhow!("run {run_id} {what}: {e}"));
        }
        other => other,
    };
    result.map_err(|e| match e {
        loops::Error::RunFailed { .. } => anyhow::anyhow!(
            "{}. {AFTER_A_FAILED_RUN}",
            e.to_string().trim_end_matches('.')
        ),
        e => anyhow::Error::new(e),
    })?
}

/// Which version drives the run `run_id` in `release`, and why (for the first lines of the
/// output): a new run, or one of version 2, on version 2; one of version 1 on version 2 if
/// the migration takes its current state, else on version 1.
///
/// # Errors
/// If the store cannot be read.
pub async fn choose(runtime: &Runtime, run_id: &str, release: Release) -> Result<Release> {
    if release == Release::V1 {
        return Ok(Release::V1);
    }
    let Some((info, record)) = runtime.store().latest(run_id).await? else {
        return Ok(Release::V2);
    };
    if info.schema != v1::Deliver::SCHEMA_HASH.pinned() || info.status.is_ended() {
        return Ok(Release::V2);
    }
    let migration = Migration::of::<v1::Deliver, v2::Deliver>();
    match migration.apply(record.payload.get()) {
        Ok(_) => {
            say!(
                "version: run {run_id} was recorded by version 1; migrating it to version 2 at \
                 {} (seq {})",
                info.state,
                info.seq
            );
            Ok(Release::V2)
        }
        Err(e) => {
            let why = match &e.cause {
                MigrationFailure::Failed(cause) => cause.to_string(),
                other => other.to_string(),
            };
            say!(
                "version: run {run_id} was recorded by version 1 and stays on it ({why}); \
                 version 1's handler finishes it"
            );
            Ok(Release::V1)
        }
    }
}

/// Whether `release` can drive the run `run_id`: it is new, or was recorded by one of the
/// versions the release compiles (version 1 only, for the previous release), or by a schema
/// one of them accepts as a compatible change (`accepts = [...]`).
///
/// # Errors
/// If the store cannot be read.
pub async fn knows(runtime: &Runtime, run_id: &str, release: Release) -> Result<bool> {
    let Some(info) = runtime.run_info(run_id).await? else {
        return Ok(true);
    };
    let drives = |hash: loops::SchemaHash, accepts: &[loops::SchemaHash]| {
        info.schema == hash || accepts.contains(&info.schema)
    };
    let v1 = drives(v1::Deliver::SCHEMA_HASH.pinned(), v1::Deliver::ACCEPTS);
    Ok(match release {
        Release::V1 => v1,
        Release::V2 => v1 || drives(v2::Deliver::SCHEMA_HASH.pinned(), v2::Deliver::ACCEPTS),
    })
}

/// Drives the run `run_id` on `version` (chosen by [`choose`]) with `agent`, from `base` if
/// it is new (created with `options`), until it ends (or parks: then this waits, as
/// `Runtime::run` does).
///
/// # Errors
/// The runtime's, as `Runtime::run` returns them.
pub async fn drive<M: Model>(
    runtime: &Runtime,
    run_id: &str,
    version: Release,
    issue: Issue,
    base: Base,
    agent: &Agent<M>,
    options: StartOptions,
) -> loops::Result<Result<Finished>> {
    Ok(match version {
        Release::V1 => {
            let initial = v1::Deliver::Received { issue, base };
            Finished::try_from(runtime.run_with(run_id, initial, agent, options).await?)
        }
        Release::V2 => {
            let initial = v2::Deliver::Received { issue, base };
            Finished::try_from(runtime.run_with(run_id, initial, agent, options).await?)
        }
    })
}

/// The base the run `run_id` started from, if it exists: its first record's (`Received`, the
/// same in both versions), read as stored.
///
/// # Errors
/// If the store cannot be read, or the first record is not a `Received`.
pub async fn recorded_base(runtime: &Runtime, run_id: &str) -> Result<Option<Base>> {
    let history = runtime.store().history(run_id).await?;
    let Some(first) = history.first() else {
        return Ok(None);
    };
    #[derive(serde::Deserialize)]
    enum First {
        Received { base: Base },
    }
    match serde_json::from_str::<First>(first.payload.get()) {
        Ok(First::Received { base }) => Ok(Some(base)),
        Err(e) => bail!("run {run_id} did not start at Received ({e})"),
    }
}

/// The head commit of the run `run_id`'s work, if its latest state holds one (`work`, in
/// every state from `Edited` on, either version), read as stored.
///
/// # Errors
/// If the store cannot be read.
pub async fn recorded_head(runtime: &Runtime, run_id: &str) -> Result<Option<String>> {
    let Some((_, record)) = runtime.store().latest(run_id).await? else {
        return Ok(None);
    };
    let payload: serde_json::Value = serde_json::from_str(record.payload.get())?;
    // A state is `{"Name": {fields}}`; its work's commits are oldest first.
    let head = payload
        .as_object()
        .and_then(|state| state.values().next())
        .and_then(|fields| fields["work"]["commits"].as_array())
        .and_then(|commits| commits.last())
        .and_then(|commit| commit["id"].as_str());
    Ok(head.map(str::to_owned))
}

/// Whether the run `run_id` recorded a push of its work branch (the step `push`, in any
/// state).
///
/// # Errors
/// If the store cannot be read.
pub async fn recorded_push(runtime: &Runtime, run_id: &str) -> Result<bool> {
    let steps = runtime.store().all_steps(run_id).await?;
    Ok(steps.iter().any(|(_, name, _, _)| name == "push"))
}

/// Says whether the run is new, resumed (at which state, skipping which) or finished; read
/// from the records as stored, so the same for either version (and a migration's record is
/// named so). Says nothing of a run that `release` does not know ([`knows`]): this build
/// refuses and blocks it, and the refusal says why.
///
/// # Errors
/// If the store cannot be read.
pub async fn report_start(runtime: &Runtime, run_id: &str, release: Release) -> Result<()> {
    let Some(info) = runtime.run_info(run_id).await? else {
        say!("starting a new run at Received");
        return Ok(());
    };
    if !knows(runtime, run_id, release).await? {
        return Ok(());
    }
    let history = runtime.store().history(run_id).await?;
    let done: Vec<String> = history
        .iter()
        .filter(|t| t.seq < info.seq)
        .map(|t| match t.migrated {
            Some(m) => format!(
                "{} ({}, {} from version {})",
                t.state,
                t.seq,
                if m.accepted { "accepted" } else { "migrated" },
                m.version
            ),
            None => format!("{} ({})", t.state, t.seq),
        })
        .collect();
    // A blocked run that this build knows is unblocked by it, back to where it stood.
    let status = match &info.block {
        Some(block) if info.status == RunStatus::Blocked => {
            say!(
                "run {run_id} was blocked by a build that could not drive it ({}); this one \
                 can",
                block.reason
            );
            block.resume
        }
        _ => info.status,
    };
    match status {
        // Asked to cancel while a process drove it, which stopped before ending it: the
        // driver ends it at once, and runs nothing of the state.
        RunStatus::Running if info.cancel.is_some() => {
            say!(
                "run {run_id} was asked to cancel at {} (seq {}) while a process drove it; \
                 ending it as cancelled",
                info.state,
                info.seq
            );
        }
        RunStatus::Completed => {
            say!(
                "run {run_id} completed already at {} (seq {}); reporting its result",
                info.state,
                info.seq
            );
        }
        RunStatus::Running => {
            // An attempt begins when its state is entered; one that left no failure record
            // was cut short by the process stopping, cleanly (a test's stop hook, Ctrl-C) or
            // not. The row's error may be an earlier attempt's (the last one to fail), so the
            // current attempt's own records decide.
            let seq = info.state_seq();
            let failed = runtime
                .store()
                .failures(run_id)
                .await?
                .iter()
                .any(|(s, f)| *s == seq && f.attempt == info.attempt);
            let last_attempt = match &info.error {
                Some(errors) if failed => {
                    format!("attempt {} failed: {}", info.attempt, errors.join(": "))
                }
                _ => loops::interrupted_attempt(info.attempt),
            };
            // At the first state nothing is recorded before it to skip.
            let skipped = if done.is_empty() {
                String::new()
            } else {
                format!("; skipping {}: already recorded", done.join(", "))
            };
            say!(
                "resuming at {} (seq {}; {last_attempt}){skipped}",
                info.state,
                info.seq
            );
        }
        RunStatus::Waiting => say!("{}", waiting(&info)),
        status => {
            let is = match status {
                RunStatus::Failed => "failed".to_owned(),
                RunStatus::Cancelled => "was cancelled".to_owned(),
                status => format!("is {status}"),
            };
            say!("run {run_id} {is} at {} (seq {})", info.state, info.seq);
        }
    }
    Ok(())
}

/// What [`report_start`] says of a waiting run: what it waits for, its edits' child runs
/// (which this process drives on), the approval (the gate then says what comes next), or
/// a time (said while it waits, `waits.rs`).
fn waiting(info: &RunInfo) -> String {
    let event = info.wait.as_ref().and_then(|w| w.event.as_deref());
    let what = match event {
        Some(loops::CHILD_ENDED) => " for its child runs to end; driving them on",
        Some(e) if e == APPROVAL_EVENT.name() => " for an approval",
        _ => "",
    };
    format!(
        "run {} waits at {} (seq {}){what}",
        info.run_id, info.state, info.seq
    )
}

/// `--dry-run`: what this build would do with every unfinished or blocked run in the store,
/// as `Runtime::dry_run` says it for a runtime that registers the versions this build drives
/// and the migration; a migration it names is tried on the run's state (in memory), and a
/// run the migration refuses is said to finish on version 1, as [`choose`] decides. Writes
/// nothing. With `only`, of that run alone.
///
/// # Errors
/// If the store cannot be read.
pub async fn dry_run(runtime: &Runtime, only: Option<&str>) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    let routes = runtime.dry_run().await?;
    for routed in routes
        .into_iter()
        .filter(|r| only.is_none_or(|id| r.run_id == id))
    {
        let mut line = format!(
            "{} ({}, {} at {}, schema {}): {}",
            routed.run_id,
            routed.workflow,
            routed.status,
            routed.state,
            routed.schema,
            routed.route
        );
        // `Runtime::dry_run` tries the migration and says a run it refuses blocked; this
        // build finishes such a run on version 1 instead ([`choose`]), with the migration's
        // own reason.
        if routed.schema == v1::Deliver::SCHEMA_HASH.pinned()
            && matches!(routed.route, Route::Block(_))
            && let Some((_, record)) = runtime.store().latest(&routed.run_id).await?
            && let Err(e) = Migration::of::<v1::Deliver, v2::Deliver>().apply(record.payload.get())
        {
            let why = match &e.cause {
                MigrationFailure::Failed(cause) => cause.to_string(),
                other => other.to_string(),
            };
            line = format!(
                "{} ({}, {} at {}, schema {}): finish on version 1, its kept handler: the \
                 migration refuses it ({why})",
                routed.run_id, routed.workflow, routed.status, routed.state, routed.schema
            );
        }
        lines.push(line);
    }
    Ok(lines)
}

/// The first line of `--dry-run` over every run of the store at `store`, for `count` lines of
/// [`dry_run`] from a build of `version`: what follows, or that there is nothing to do.
pub fn dry_run_heading(count: usize, store: &Path, version: u32) -> String {
    match count {
        0 => format!(
            "dry run: no unfinished or blocked run in {}: nothing to do",
            store.display()
        ),
        n => format!(
            "dry run: {n} unfinished or blocked run{} in {}; this build (version {version}) would:",
            if n == 1 { "" } else { "s" },
            store.display()
        ),
    }
}

/// The dry run's handler: registered so that the runtime knows which versions this build
/// drives; a dry run drives nothing, so none of its methods is ever called.
pub struct NotDriven;

fn not_driven<T>(ctx: &Context) -> Result<T> {
    bail!(
        "run {}: a dry run drives nothing (state {} was not run)",
        ctx.run_id(),
        ctx.state()
    )
}

impl v1::DeliverHandler for NotDriven {
    type Error = anyhow::Error;

    async fn received(&self, ctx: &Context, _: Issue, _: Base) -> Result<v1::ReceivedNext> {
        not_driven(ctx)
    }
    async fn planned(
        &self,
        ctx: &Context,
        _: Issue,
        _: Base,
        _: Change,
    ) -> Result<v1::PlannedNext> {
        not_driven(ctx)
    }
    async fn edited(&self, ctx: &Context, _: Issue, _: Work, _: u32) -> Result<v1::EditedNext> {
        not_driven(ctx)
    }
    async fn tested(
        &self,
        ctx: &Context,
        _: Issue,
        _: Work,
        _: u32,
        _: TestReport,
    ) -> Result<v1::TestedNext> {
        not_driven(ctx)
    }
}

impl v2::DeliverHandler for NotDriven {
    type Error = anyhow::Error;

    async fn received(&self, ctx: &Context, _: Issue, _: Base) -> Result<v2::ReceivedNext> {
        not_driven(ctx)
    }
    async fn planned(
        &self,
        ctx: &Context,
        _: Issue,
        _: Base,
        _: Change,
    ) -> Result<v2::PlannedNext> {
        not_driven(ctx)
    }
    async fn edited(&self, ctx: &Context, _: Issue, _: Work, _: u32) -> Result<v2::EditedNext> {
        not_driven(ctx)
    }
    async fn tested(
        &self,
        ctx: &Context,
        _: Issue,
        _: Work,
        _: u32,
        _: TestReport,
    ) -> Result<v2::TestedNext> {
        not_driven(ctx)
    }
    async fn reviewed(
        &self,
        ctx: &Context,
        _: Issue,
        _: Work,
        _: Review,
    ) -> Result<v2::ReviewedNext> {
        not_driven(ctx)
    }
}

impl EditRunHandler for NotDriven {
    type Error = anyhow::Error;

    async fn requested(&self, ctx: &Context, _: String, _: Edit) -> Result<RequestedNext> {
        not_driven(ctx)
    }
}

/// The dry run's builder for `release`: the versions it drives registered (with
/// [`NotDriven`]), so that `Runtime::dry_run` routes among them. Version 1 is registered
/// only in the previous release: this one keeps version 1's handler for the runs the
/// migration refuses, which [`dry_run`] says.
pub fn dry_run_builder(release: Release) -> RuntimeBuilder {
    match release {
        Release::V1 => Runtime::builder().register::<v1::Deliver, _>(NotDriven),
        Release::V2 => Runtime::builder()
            .register::<v2::Deliver, _>(NotDriven)
            .register::<EditRun, _>(NotDriven)
            .migration::<v1::Deliver, v2::Deliver>(),
    }
}

#[cfg(test)]
mod tests {
    use super::waiting;
    use crate::waits::tests::row;

    #[test]
    fn a_waiting_run_is_said_to_wait_for_what_it_waits_for() {
        let join = row(serde_json::json!({"event": loops::CHILD_ENDED}));
        assert_eq!(
            waiting(&join),
            "run deliver-1 waits at Received (seq 0) for its child runs to end; driving them on"
        );
        let gate = row(serde_json::json!({"event": "approve"}));
        assert_eq!(
            waiting(&gate),
            "run deliver-1 waits at Received (seq 0) for an approval"
        );
        let timer = row(serde_json::json!({"until_ms": 61_000}));
        assert_eq!(waiting(&timer), "run deliver-1 waits at Received (seq 0)");
    }
}
