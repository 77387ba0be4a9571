//! Who approves a run's pull request: the approval this process sends (`--auto-approve`,
//! `--approve`), and the run's own record of whether a human approves it (the run attribute
//! [`ATTRIBUTE`], set when the run is created), so that a later command without
//! `--auto-approve` never approves a run that was left to a human.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use loops::control::{Client, socket_path};
use loops::{AttributeValue, RunStatus, Runtime, StartOptions};

use crate::workflow::{APPROVAL_EVENT, Approval};

/// The run attribute that says who approves the run's pull request: [`HUMAN`] for a run
/// created with `--auto-approve=false`, [`AUTO`] otherwise (`loops runs --attr
/// approval=human` lists the runs left to people).
pub const ATTRIBUTE: &str = "approval";
/// [`ATTRIBUTE`]'s value for a run a human approves.
pub const HUMAN: &str = "human";
/// [`ATTRIBUTE`]'s value for a run this example approves by itself.
pub const AUTO: &str = "auto";

/// The options a new run is created with: [`ATTRIBUTE`] from `--auto-approve` (`None`: not
/// given, the one-command demo, approved automatically).
pub fn start_options(auto_approve: Option<bool>) -> StartOptions {
    let who = if auto_approve == Some(false) {
        HUMAN
    } else {
        AUTO
    };
    StartOptions::default().attribute(ATTRIBUTE, who)
}

/// Why the run `run_id` is left to a human when no flag says otherwise, if it is: it was
/// created with `--auto-approve=false` (its [`ATTRIBUTE`]), or it waits at the approval gate
/// (runs created by earlier builds of this example have no attribute). `None` for a run that
/// does not exist yet, or one this example approves.
///
/// # Errors
/// If the store cannot be read.
pub async fn left_to_a_human(runtime: &Runtime, run_id: &str) -> Result<Option<&'static str>> {
    let attributes = runtime.attributes(run_id).await?;
    if attributes.get(ATTRIBUTE) == Some(&AttributeValue::from(HUMAN)) {
        return Ok(Some("it was started with --auto-approve=false"));
    }
    if waits_at_the_gate(runtime, run_id).await? {
        return Ok(Some("it waited at the approval gate already"));
    }
    Ok(None)
}

/// Sends the approval event (once: it carries an idempotency key) as soon as the run exists,
/// if `approve` and no approval waits in its inbox already (one sent early with `loops send`
/// is the one the gate takes: a second would stay pending after the run ended); then, or
/// else, never resolves.
pub async fn send(runtime: &Runtime, run_id: &str, approve: bool, by: &str) {
    if approve {
        let approval = Approval { by: by.to_owned() };
        loop {
            if runtime
                .store()
                .has_pending(run_id, APPROVAL_EVENT.name())
                .await
                .unwrap_or(false)
            {
                break;
            }
            match runtime
                .send_with_key(run_id, APPROVAL_EVENT, "approval", &approval)
                .await
            {
                Ok(_) | Err(loops::Error::RunEnded { .. }) => break,
                // The run's first commit creates it.
                Err(loops::Error::RunNotFound { .. }) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => {
                    let _ = writeln!(std::io::stderr(), "warning: cannot send the approval: {e}");
                    break;
                }
            }
        }
    }
    std::future::pending::<()>().await;
}

/// `--approve` while another `deliver --serve` holds the store: the approval goes through
/// that process's control endpoint (the socket next to `store`), which hands it to the run at
/// once if it drives that run (a serving process drives its own run only), and this command
/// ends there. The approval carries the idempotency key the
/// in-process one does, so that it is taken once however often it is sent. Returns what to
/// say, or `None` when no process answers on the endpoint (this command then opens the
/// store itself, as usual).
///
/// # Errors
/// The process refuses the approval (no such run, or an ended one), or what answers on the
/// socket is not a loops control endpoint of this version.
pub async fn through_the_serving_process(store: &Path, run_id: &str) -> Result<Option<String>> {
    let Some(client) = Client::next_to_store(store)
        .await
        .map_err(|e| anyhow::Error::new(e).context("--approve"))?
    else {
        return Ok(None);
    };
    let by = approver_name();
    let payload = serde_json::value::to_raw_value(&Approval { by: by.clone() })?;
    let sent = client
        .send(run_id, APPROVAL_EVENT.name(), Some("approval"), &payload)
        .await
        .map_err(|e| {
            anyhow::Error::new(e).context(format!(
                "--approve: the process serving {} did not take the approval",
                store.display()
            ))
        })?;
    // The serving process drives its own run only (`taken_here` says whether it drives this
    // one): another run takes the approval when `deliver --run-id RUN` next drives it.
    let later = format!(
        "run {run_id} takes it when `deliver --run-id {run_id}` drives it, once the serving process has ended (that process drives another run)"
    );
    Ok(Some(match (sent.duplicate, sent.taken_here) {
        (true, true) => format!(
            "run {run_id} was sent an approval already (event {}); the `deliver` serving {} \
             takes it, once",
            sent.event_seq,
            store.display()
        ),
        (true, false) => format!(
            "run {run_id} was sent an approval already (event {}); {later}",
            sent.event_seq
        ),
        (false, true) => format!(
            "approved run {run_id} as {by}, through the control endpoint {} of the `deliver` \
             serving the store: it hands the approval to the run now, and ends when the run does",
            socket_path(store).display()
        ),
        (false, false) => format!(
            "approved run {run_id} as {by}, through the control endpoint {} of the `deliver` \
             serving the store; {later}",
            socket_path(store).display()
        ),
    }))
}

/// Whether the run is parked at the approval gate.
pub async fn waits_at_the_gate(runtime: &Runtime, run_id: &str) -> Result<bool> {
    Ok(runtime.run_info(run_id).await?.is_some_and(|info| {
        info.status == RunStatus::Waiting
            && info
                .wait
                .as_ref()
                .is_some_and(|w| w.event.as_deref() == Some(APPROVAL_EVENT.name()))
    }))
}

/// Resolves when the run is parked at the approval gate and nothing here will approve it.
pub async fn parked_at_the_gate(runtime: &Runtime, run_id: &str, approve: bool) {
    if approve {
        std::future::pending::<()>().await;
    }
    loop {
        if waits_at_the_gate(runtime, run_id).await.unwrap_or(false)
            // An approval sent while no deliver ran is taken as soon as the run is driven.
            && !runtime
                .store()
                .has_pending(run_id, APPROVAL_EVENT.name())
                .await
                .unwrap_or(true)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Who approves with `--approve`: the user running the command (`$USER`, else `$USERNAME`),
/// else `operator`.
pub fn approver_name() -> String {
    approver_of(|name| std::env::var(name).ok())
}

/// [`approver_name`], with the environment read through `var`: an unset variable, or one
/// the approval gate would refuse ([`not_a_name`](crate::agent::not_a_name): blank, say),
/// names nobody.
fn approver_of(var: impl Fn(&str) -> Option<String>) -> String {
    ["USER", "USERNAME"]
        .into_iter()
        .filter_map(var)
        .map(|name| name.trim().to_owned())
        .find(|name| crate::agent::not_a_name(name).is_none())
        .unwrap_or_else(|| "operator".to_owned())
}

#[cfg(test)]
mod tests {
    use super::approver_of;

    #[test]
    fn an_empty_user_is_nobody_and_operator_approves() {
        let env = |user: Option<&str>, username: Option<&str>| {
            approver_of(move |name| match name {
                "USER" => user.map(str::to_owned),
                "USERNAME" => username.map(str::to_owned),
                _ => None,
            })
        };
        assert_eq!(env(Some("alice"), Some("bob")), "alice");
        assert_eq!(env(Some(""), Some("bob")), "bob");
        assert_eq!(env(None, Some("bob")), "bob");
        assert_eq!(env(Some(" "), Some("")), "operator");
        assert_eq!(env(None, None), "operator");
    }
}
