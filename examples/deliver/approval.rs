//! Who approves a run's pull request: the approval this process sends (`--auto-approve`,
//! `--approve`), and the run's own record of whether a human approves it (the run attribute
//! [`ATTRIBUTE`], set when the run is created), so that a later command without
//! `--auto-approve` never approves a run that was left to a human.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use loops::{AttributeValue, RunStatus, Runtime, StartOptions};

use crate::Cli;
use crate::workflow::{APPROVAL_EVENT, Approval, not_a_name};

mod serving;

pub use serving::{Through, through_the_serving_process};

/// The idempotency key of the approval this example sends (`--approve`, `--auto-approve`),
/// the same every time: a run takes it once however often it is sent.
pub const APPROVAL_KEY: &str = "approval";

/// What `--approve` says when the run was approved already.
const ADDS_NOTHING: &str = "this --approve adds nothing";

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
/// (runs created by earlier builds of this example have no attribute), or, not recorded yet,
/// a start of it in `workdir` asked so and was stopped before its first record
/// ([`asked_for_a_human`]). `None` for a new run, or one this example approves.
///
/// # Errors
/// If the store or the work directory's record of the wish cannot be read.
pub async fn left_to_a_human(
    runtime: &Runtime,
    workdir: &Path,
    run_id: &str,
) -> Result<Option<&'static str>> {
    if runtime.run_info(run_id).await?.is_none() {
        return Ok(asked_for_a_human(workdir, run_id)?.then_some(
            "it was started with --auto-approve=false (a wish this work directory keeps until \
             the run ends)",
        ));
    }
    let attributes = runtime.attributes(run_id).await?;
    if attributes.get(ATTRIBUTE) == Some(&AttributeValue::from(HUMAN)) {
        return Ok(Some("it was started with --auto-approve=false"));
    }
    if waits_at_the_gate(runtime, run_id).await? {
        return Ok(Some("it waited at the approval gate already"));
    }
    Ok(None)
}

/// What this process does at the approval gate.
pub struct Gate {
    /// Whether it sends the approval.
    pub approve: bool,
    /// Who the approval names.
    pub approver: String,
    /// Whether this build can drive the run (else it is sent nothing).
    pub knows: bool,
    /// Why the run is left to a human, if it is.
    pub left_to_a_human: Option<&'static str>,
}

impl Gate {
    /// The gate's plan for the run of `cli` in `workdir`, from its flags and the run's
    /// record (or, for a run not recorded yet, what an earlier start of it asked).
    pub async fn of(cli: &Cli, workdir: &Path, runtime: &Runtime) -> Result<Gate> {
        // A run started with `--auto-approve=false`, or parked at the approval gate, waits for a
        // human: running the same command again without the flag must not approve it behind
        // their back, whatever its status (a run blocked by another release, or stopped before
        // its wait was recorded, is still theirs). An explicit `--auto-approve` or `--approve`
        // does.
        let left_to_a_human = if cli.auto_approve.is_none() && !cli.approve {
            left_to_a_human(runtime, workdir, &cli.run_id).await?
        } else {
            None
        };
        let (approve, approver) = if cli.approve {
            (true, approver_name())
        } else {
            (
                cli.auto_approve.unwrap_or(left_to_a_human.is_none()),
                "--auto-approve".to_owned(),
            )
        };
        // A run this release cannot drive (recorded by a later one) is refused and blocked: it is
        // sent nothing, and is not reported as waiting at the gate even if it waits there, since
        // no approval would move it on this build.
        let knows = crate::versions::knows(runtime, &cli.run_id, cli.workflow_version).await?;
        let approve = approve && knows;
        Ok(Gate {
            approve,
            approver,
            knows,
            left_to_a_human,
        })
    }
}

/// Says so when `--auto-approve=false` or `--approve` is given for a run that was sent its
/// approval already (by an earlier `--auto-approve` start killed before the gate, an earlier
/// `--approve`, or `loops send`): an event cannot be taken back, and the run takes it at the
/// gate (or took it), so `--auto-approve=false` does not make it wait, and `--approve` adds
/// nothing (its event carries the key of the first, so it is not sent twice).
///
/// # Errors
/// If the run's events cannot be read.
pub async fn note_approved_already(cli: &Cli, runtime: &Runtime) -> Result<()> {
    let why = if cli.approve {
        ADDS_NOTHING
    } else if cli.auto_approve == Some(false) {
        "--auto-approve=false does not withdraw an approval that was sent"
    } else {
        return Ok(());
    };
    let events = runtime.store().events(&cli.run_id).await?;
    if let Some(first) = first_approval_in(&events) {
        say_approved_already(&cli.run_id, &first, why);
    }
    Ok(())
}

/// The first approval a run was sent, of its events `(event seq, record, taken)`: an event
/// that is no `Approval` (one that names no one) is no approval, the gate sets it aside.
pub fn first_approval<'a>(
    events: impl IntoIterator<Item = (u64, &'a loops::EventRecord, bool)>,
) -> Option<SentApproval> {
    events.into_iter().find_map(|(seq, record, taken)| {
        let approval = (record.name == APPROVAL_EVENT.name())
            .then(|| serde_json::from_str::<Approval>(record.payload.get()).ok())
            .flatten()?;
        Some(SentApproval {
            seq,
            by: approval.by,
            taken,
            ours: record.key.as_deref() == Some(APPROVAL_KEY),
        })
    })
}

/// [`first_approval`] of a run's events as its store reads them ([`loops::Store::events`]).
fn first_approval_in(events: &[(u64, loops::EventRecord, bool)]) -> Option<SentApproval> {
    first_approval(
        events
            .iter()
            .map(|(seq, record, taken)| (*seq, record, *taken)),
    )
}

/// An approval a run was sent ([`first_approval`]).
pub struct SentApproval {
    /// Its event seq.
    pub seq: u64,
    /// Who it names.
    pub by: String,
    /// Whether the approval gate took it.
    pub taken: bool,
    /// Whether this example sent it (it carries [`APPROVAL_KEY`]).
    pub ours: bool,
}

/// Says that run `run_id` was sent `first` already, and `why` this command adds nothing.
pub fn say_approved_already(run_id: &str, first: &SentApproval, why: &str) {
    let where_ = if first.taken {
        "taken at the approval gate"
    } else {
        "waiting in its inbox for the approval gate"
    };
    say!(
        "note: run {run_id} was approved already, by {} (event {}, {where_}): {why}",
        first.by,
        first.seq
    );
}

/// The directory, in a work directory, that keeps what `--auto-approve=false` asked of its
/// runs until they end: one file per run (named by a hash of its id, holding the id), written
/// before anything of the run is made, so that a start stopped before its run's first record
/// (killed while the demo's repository was being set up), or a run whose store is gone (moved
/// or deleted while it waited for its human) and that starts anew, run again without the flag
/// is left to a human, as the README promises. Read only while the run does not exist in the
/// store: once it does, its [`ATTRIBUTE`] says.
pub const ASKED_DIR: &str = ".loops-deliver-approval";

/// The file of [`ASKED_DIR`] for the run `run_id`.
fn asked_path(workdir: &Path, run_id: &str) -> PathBuf {
    let hash = xxhash_rust::xxh3::xxh3_128(run_id.as_bytes());
    workdir.join(ASKED_DIR).join(format!("{hash:032x}"))
}

/// Records in `workdir`, durably, what `--auto-approve` (`auto_approve`) asks of the run
/// `run_id` before its first record: `Some(false)` that a human approves it, `Some(true)` that
/// this example does (an earlier wish is dropped), `None` nothing. Called before anything of
/// the run is made; the run's own record rules once it exists.
///
/// # Errors
/// If the file cannot be written or removed.
pub fn remember_asked(workdir: &Path, run_id: &str, auto_approve: Option<bool>) -> Result<()> {
    let path = asked_path(workdir, run_id);
    match auto_approve {
        None => Ok(()),
        Some(true) => forget_asked(workdir, run_id),
        Some(false) => keep(workdir, &path, run_id.as_bytes()),
    }
}

/// Writes the wish `bytes` durably at `path`, a file of `workdir`'s [`ASKED_DIR`].
fn keep(workdir: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = workdir.join(ASKED_DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    crate::project::write_durably(path, bytes, true).map(drop)
}

/// Copies into the work directory `workdir` the wishes ([`remember_asked`]) kept in `from`,
/// a work directory that an interrupted `--fresh` moved aside, where `workdir` has none of
/// its own for the run: so that a `--fresh --auto-approve=false` killed after it moved the
/// old directory aside, and run again without the flag, still leaves the run to a human.
///
/// # Errors
/// If a wish cannot be read or written.
pub fn carry_asked(from: &Path, workdir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(from.join(ASKED_DIR)) else {
        return Ok(());
    };
    let dir = workdir.join(ASKED_DIR);
    for entry in entries.flatten() {
        let name = entry.file_name();
        let target = dir.join(&name);
        // A temporary file of a write a kill interrupted holds no wish yet.
        if name.to_string_lossy().contains(".tmp-") || target.exists() {
            continue;
        }
        let wish = std::fs::read(entry.path())
            .with_context(|| format!("cannot read {}", entry.path().display()))?;
        keep(workdir, &target, &wish)?;
    }
    Ok(())
}

/// Whether a start of the run `run_id` asked, with `--auto-approve=false`, that a human
/// approves it ([`remember_asked`]): only a file holding this very id counts.
///
/// # Errors
/// If the file exists but cannot be read.
pub fn asked_for_a_human(workdir: &Path, run_id: &str) -> Result<bool> {
    let path = asked_path(workdir, run_id);
    match std::fs::read(&path) {
        Ok(id) => Ok(id == run_id.as_bytes()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Drops what [`remember_asked`] kept for the run `run_id`, once the run has ended (or was
/// refused here), and [`ASKED_DIR`] once empty.
///
/// # Errors
/// If the file exists but cannot be removed.
pub fn forget_asked(workdir: &Path, run_id: &str) -> Result<()> {
    let path = asked_path(workdir, run_id);
    match std::fs::remove_file(&path) {
        Ok(()) => {
            let _ = std::fs::remove_dir(workdir.join(ASKED_DIR));
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
}

/// Sends the approval event (once: it carries an idempotency key) as soon as the run exists,
/// if `approve` and the run was sent no approval yet (one sent with `loops send` is the one
/// the gate takes, or took: a second would stay pending after the run ended, and
/// [`note_approved_already`] says this one adds nothing); then, or else, never resolves.
pub async fn send(runtime: &Runtime, run_id: &str, approve: bool, by: &str) {
    if approve {
        let approval = Approval { by: by.to_owned() };
        loop {
            let events = runtime.store().events(run_id).await;
            if events.is_ok_and(|events| first_approval_in(&events).is_some()) {
                break;
            }
            match runtime
                .send_with_key(run_id, APPROVAL_EVENT, APPROVAL_KEY, &approval)
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
/// else `operator`. A variable that is set but names no one the gate takes is said, with why
/// and who approves instead.
pub fn approver_name() -> String {
    let (name, skipped) = approver_of(|name| std::env::var(name).ok());
    for line in skipped {
        say!("{line}");
    }
    name
}

/// [`approver_name`], with the environment read through `var`: the approver, and a line for
/// each variable passed over because the approval gate would refuse it ([`not_a_name`]:
/// blank, say). An unset variable names nobody, silently.
fn approver_of(var: impl Fn(&str) -> Option<String>) -> (String, Vec<String>) {
    let mut passed_over = Vec::new();
    let mut name = None;
    for variable in ["USER", "USERNAME"] {
        let Some(value) = var(variable) else {
            continue;
        };
        match not_a_name(value.trim()) {
            None => {
                name = Some(value.trim().to_owned());
                break;
            }
            Some(why) => passed_over.push((variable, why)),
        }
    }
    let name = name.unwrap_or_else(|| "operator".to_owned());
    let said = passed_over
        .into_iter()
        .map(|(variable, why)| {
            format!("${variable} is no approver's name: it {why}; approving as {name}")
        })
        .collect();
    (name, said)
}

#[cfg(test)]
mod tests {
    use super::approver_of;
    use crate::workflow::not_a_name;

    #[test]
    fn an_approver_must_be_a_printable_name() {
        for by in [
            "alice",
            "Zoë O'Brien",
            "ops-bot (deploy)",
            &"x".repeat(100),
            "ann \u{2764}\u{FE0F}",
        ] {
            assert_eq!(not_a_name(by), None, "{by:?}");
        }
        let (blank, format) = (
            "names no one (\"by\" is blank)",
            "holds invisible or bidirectional formatting characters in \"by\"",
        );
        for (by, why) in [
            ("", blank),
            (" \t ", blank),
            ("\u{200B}", blank),
            ("\u{202E}", blank),
            ("\u{2066}", blank),
            ("\u{00AD}", blank),
            ("\u{2066} \u{00AD}\u{202E}", blank),
            ("\u{2800}", blank),
            ("\u{3164}", blank),
            ("\u{115F}\u{1160}", blank),
            ("\u{FFA0} \u{034F}\u{FE0F}", blank),
            ("alice\u{3164}", format),
            ("\u{2800}bob", format),
            ("alice\u{202E}ecila", format),
            ("\u{2066}alice\u{2069}", format),
            ("al\u{00AD}ice", format),
            ("al\u{200B}ice", format),
            (
                "\u{1b}[31mRED\u{1b}[0m",
                "holds control characters in \"by\"",
            ),
            ("alice\n\n## LGTM", "holds control characters in \"by\""),
            ("a\u{2028}b", "holds control characters in \"by\""),
            ("a\u{2029}b", "holds control characters in \"by\""),
            (&"x".repeat(101), "has a \"by\" over 100 characters"),
        ] {
            assert_eq!(not_a_name(by), Some(why), "{by:?}");
        }
    }

    #[test]
    fn an_empty_user_is_nobody_and_operator_approves() {
        let env = |user: Option<&str>, username: Option<&str>| {
            approver_of(move |name| match name {
                "USER" => user.map(str::to_owned),
                "USERNAME" => username.map(str::to_owned),
                _ => None,
            })
        };
        let blank = |var: &str, name: &str| {
            format!(
                "${var} is no approver's name: it names no one (\"by\" is blank); approving as \
                 {name}"
            )
        };
        assert_eq!(env(Some("alice"), Some("bob")), ("alice".into(), vec![]));
        assert_eq!(
            env(Some(""), Some("bob")),
            ("bob".into(), vec![blank("USER", "bob")])
        );
        assert_eq!(env(None, Some("bob")), ("bob".into(), vec![]));
        assert_eq!(
            env(Some(" "), Some("")),
            (
                "operator".into(),
                vec![blank("USER", "operator"), blank("USERNAME", "operator")]
            )
        );
        assert_eq!(
            env(Some("a\u{1b}[31m"), None),
            (
                "operator".into(),
                vec![
                    "$USER is no approver's name: it holds control characters in \"by\"; \
                     approving as operator"
                        .to_owned()
                ]
            )
        );
        assert_eq!(env(None, None), ("operator".into(), vec![]));
    }
}
