//! `--approve` while another `deliver --serve` holds the store: the approval goes through
//! that process's control endpoint, and this command follows the run there until it ends, as
//! `--approve` does when it drives the run itself.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use loops::control::{Client, ControlError, ErrorKind, socket_path};
use loops::{Payloads, RunInfo, RunStatus, TransitionRecord};

use super::{
    ADDS_NOTHING, APPROVAL_KEY, SentApproval, approver_name, first_approval, say_approved_already,
};
use crate::Cli;
use crate::hints::this_command_again;
use crate::versions;
use crate::workflow::{APPROVAL_EVENT, Approval};

/// How long `--approve` looks for its run in a serving process that does not have it: a
/// `deliver --serve` serves its endpoint as it starts, and records a new run after its
/// setup (tens of milliseconds; more on a loaded machine).
const RECORDED_WITHIN: Duration = Duration::from_secs(2);

/// How long `--approve` asks again whether a serving process drives its run, when it first
/// answers that it does not: a process that serves a run it just recorded drives it a
/// moment later.
const DRIVEN_WITHIN: Duration = Duration::from_secs(1);

/// How often `--approve` looks again for a run the serving process does not have yet.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// How often the followed run is read through the control endpoint.
const FOLLOW_EVERY: Duration = Duration::from_millis(100);

/// What `--approve` did through a serving process ([`through_the_serving_process`]).
pub enum Through {
    /// No process answers on the store's control endpoint, or the one that did went away
    /// before it answered the approval: this command approves the run itself, as usual.
    NoProcess,
    /// The approval was sent, and all is said: the serving process drives another run.
    Said,
    /// The approval was sent to the process that drives the run: follow it there.
    Follow(Following),
}

/// The run a serving process drives, to follow until it ends ([`Following::until_it_ends`]).
pub struct Following {
    client: Client,
}

/// `--approve` while another `deliver --serve` holds the store (`store`): sends the approval
/// through that process's control endpoint (the socket next to `store`), with the idempotency
/// key the in-process approval carries, so that it is taken once however often it is sent.
///
/// A serving process drives its own run only. If it drives `cli.run_id`, it hands the
/// approval to the run at once, and [`Through::Follow`] is returned: the caller follows the
/// run there ([`Following::until_it_ends`]). Otherwise this says that the run takes the approval
/// when it is next driven ([`Through::Said`]). [`Through::NoProcess`] when no process answers
/// on the endpoint (having done nothing), or the process went away (stopping, or killed)
/// before it answered the approval (its idempotency key makes this command's own send of it
/// a duplicate, if the process had taken it).
///
/// # Errors
/// The process refuses the approval (no such run, or an ended one), or what answers on the
/// socket is not a loops control endpoint of this version.
pub async fn through_the_serving_process(cli: &Cli, store: &Path) -> Result<Through> {
    let run_id = &cli.run_id;
    let Some(client) = Client::next_to_store(store)
        .await
        .map_err(|e| anyhow::Error::new(e).context("--approve"))?
    else {
        return Ok(Through::NoProcess);
    };
    // A run sent another approval first (by `loops send`, without this command's key) is sent
    // nothing: said as when this command approves through the store itself. One this example
    // sent is sent again (a duplicate) and followed.
    if let Some(first) = sent_approval(&client, run_id, u64::MAX)
        .await
        .filter(|a| !a.ours)
    {
        say_approved_already(run_id, &first, ADDS_NOTHING);
        return Ok(Through::Said);
    }
    let by = approver_name();
    let payload = serde_json::value::to_raw_value(&Approval { by: by.clone() })?;
    // A process started a moment ago serves before it records its run: a run it does not
    // have is looked for again, for up to [`RECORDED_WITHIN`].
    let mut looks = 0;
    let sent = loop {
        let sent = client
            .send(run_id, APPROVAL_EVENT.name(), Some(APPROVAL_KEY), &payload)
            .await;
        match sent {
            Err(ControlError::Remote {
                kind: ErrorKind::RunNotFound,
                ..
            }) if looks < RECORDED_WITHIN.as_millis() / LOOK_EVERY.as_millis() => {
                looks += 1;
                tokio::time::sleep(LOOK_EVERY).await;
            }
            // The process went away (stopping, or killed) before it answered: whether it
            // took the approval is unknown, and need not be. The approval carries its
            // idempotency key, so this command sends it again itself, to the store once the
            // process has let it go, where a second send of it is a duplicate.
            Err(e @ (ControlError::Unreachable { .. } | ControlError::Dropped { .. })) => {
                say!(
                    "note: the `deliver` serving {} went away before it answered ({e}); \
                     approving run {run_id} through the store itself",
                    store.display()
                );
                return Ok(Through::NoProcess);
            }
            sent => break sent,
        }
    };
    let sent = sent.map_err(|e| {
        let hint = match &e {
            ControlError::Remote {
                kind: ErrorKind::RunNotFound,
                ..
            } => format!(
                " (looked for it for {} s: a `deliver --serve` started a moment ago records its \
                 run within that)",
                RECORDED_WITHIN.as_secs()
            ),
            _ => String::new(),
        };
        anyhow::Error::new(e).context(format!(
            "--approve: the process serving {} did not take the approval{hint}",
            store.display()
        ))
    })?;
    // The first approval up to this send's event (one read): this example's earlier one that
    // the send duplicates, whose it is; or another sent between the look above and this
    // send, which decides the run.
    let first = sent_approval(&client, run_id, sent.event_seq.saturating_add(1)).await;
    let earlier = first.as_ref().filter(|first| first.seq < sent.event_seq);
    let sent_as = if sent.duplicate {
        let by = (first.as_ref())
            .filter(|first| first.seq == sent.event_seq)
            .map_or_else(String::new, |first| format!(", by {}", first.by));
        format!(
            "run {run_id} was sent an approval already{by} (event {}), which the `deliver` \
             serving the store takes once",
            sent.event_seq
        )
    } else if let Some(earlier) = earlier {
        format!(
            "sent run {run_id} this approval (event {}), through the control endpoint {} of the \
             `deliver` serving the store, just after {}'s (event {}): the first approval decides",
            sent.event_seq,
            socket_path(store).display(),
            earlier.by,
            earlier.seq
        )
    } else {
        format!(
            "approved run {run_id} as {by}, through the control endpoint {} of the `deliver` \
             serving the store",
            socket_path(store).display()
        )
    };
    // The serving process drives its own run only (`taken_here` says whether it drives this
    // one): another run takes the approval when `deliver --run-id RUN` next drives it. A
    // process started a moment ago may have recorded its run and not drive it yet: asked
    // again (the same key: nothing is sent twice) for up to [`DRIVEN_WITHIN`].
    let mut taken_here = sent.taken_here;
    let mut asked = 0;
    while !taken_here && asked < DRIVEN_WITHIN.as_millis() / LOOK_EVERY.as_millis() {
        asked += 1;
        tokio::time::sleep(LOOK_EVERY).await;
        match client
            .send(run_id, APPROVAL_EVENT.name(), Some(APPROVAL_KEY), &payload)
            .await
        {
            Ok(again) => taken_here = again.taken_here,
            // Ended, or stopped answering: as first answered.
            Err(_) => break,
        }
    }
    if !taken_here {
        say!(
            "{sent_as}; run {run_id} takes it when `deliver --run-id {run_id}` drives it, once \
             the serving process has ended (that process drives another run)"
        );
        return Ok(Through::Said);
    }
    say!("{sent_as}; following the run there until it ends (Ctrl-C stops following only)");
    Ok(Through::Follow(Following { client }))
}

/// The first approval run `run_id` was sent before event `before`, read through `client`;
/// `None` if there is none, or the events cannot be read (the process going away: what
/// follows says what was sent).
async fn sent_approval(client: &Client, run_id: &str, before: u64) -> Option<SentApproval> {
    let events = client.events(run_id).await.ok()?;
    first_approval(
        (events.iter())
            .map(|e| (e.event_seq, &e.record, e.delivered))
            .filter(|(seq, _, _)| *seq < before),
    )
}

/// How long a read of the followed run may go unanswered before this says so: as long as
/// the `loops` CLI waits for a process's first answer.
const NOTICE_AFTER: Duration = loops::control::CONNECT_TIMEOUT;

impl Following {
    /// Follows the run `cli.run_id` in the process serving `store` until it ends, printing
    /// its state when followed and each state it enters after (`[seq N] State (in the
    /// serving process)`, read from its history when it entered several between two reads)
    /// and its outcome (`pull request: URL`) as a run driven here ends. A process that does
    /// not answer for [`NOTICE_AFTER`] (stopped, say) is said to, once per silence; a read
    /// unanswered for 5 minutes fails.
    ///
    /// The serving process stops its endpoint once its run has ended, maybe before this reads
    /// the end: when the endpoint stops answering, the store (the process lets it go as it
    /// exits) says whether the run ended or the process went away before it.
    ///
    /// # Errors
    /// The run failed or was cancelled in the serving process; the serving process ended
    /// before the run did (the approval is recorded: the error says the command that goes on
    /// with it); a read went unanswered for 5 minutes; the store cannot be read once the
    /// serving process has let it go.
    pub async fn until_it_ends(self, cli: &Cli, store: &Path) -> Result<()> {
        let run_id = &cli.run_id;
        let payloads = payloads(cli)?;
        let mut shown = None;
        loop {
            let Some((info, record)) = self.latest(run_id, store).await? else {
                // The process stopped answering: the store, which it has let go, says.
                return after_the_process(cli, store, &mut shown, payloads.as_ref()).await;
            };
            show_reached(&mut shown, &record, async || {
                match self.client.history(run_id).await {
                    Ok(history) => Ok(history),
                    // A process whose run has just ended stops answering: then the store says.
                    Err(_) => Ok(crate::store::open_read_only(store).await?.history(run_id)?),
                }
            })
            .await?;
            if info.status.is_ended() {
                return ended(run_id, &info, record, payloads.as_ref());
            }
            tokio::time::sleep(FOLLOW_EVERY).await;
        }
    }

    /// The run's row and latest record, as the serving process reads them; `None` if the
    /// process no longer answers. A process silent for [`NOTICE_AFTER`] is said to be, and
    /// waited for.
    ///
    /// # Errors
    /// The run is not in the store; another error of the endpoint (no answer in 5 minutes).
    async fn latest(
        &self,
        run_id: &str,
        store: &Path,
    ) -> Result<Option<(RunInfo, TransitionRecord)>> {
        let read = self.client.latest(run_id);
        tokio::pin!(read);
        let answered = match tokio::time::timeout(NOTICE_AFTER, &mut read).await {
            Ok(answered) => answered,
            Err(_) => {
                say!(
                    "the `deliver` serving {} has not answered for {} s (stopped? SIGSTOP, a \
                     debugger); still following run {run_id}",
                    store.display(),
                    NOTICE_AFTER.as_secs()
                );
                read.await
            }
        };
        match answered {
            Ok(Some(latest)) => Ok(Some(latest)),
            Ok(None) => bail!("run {run_id} is no longer in {}", store.display()),
            Err(ControlError::Unreachable { .. } | ControlError::Dropped { .. }) => Ok(None),
            Err(e) => Err(anyhow::Error::new(e).context(format!(
                "--approve: cannot follow run {run_id} in the process serving {}",
                store.display()
            ))),
        }
    }
}

/// Once the serving process has stopped answering: the run as the store holds it, ended (said
/// as when the process answers) or not (then the process went away first: an error naming
/// where the run stands and the command that goes on).
async fn after_the_process(
    cli: &Cli,
    store: &Path,
    shown: &mut Option<u64>,
    payloads: Option<&Payloads>,
) -> Result<()> {
    let run_id = &cli.run_id;
    let read = crate::store::open_read_only(store).await?;
    let Some((info, record)) = read.latest(run_id)? else {
        bail!("run {run_id} is no longer in {}", store.display());
    };
    if !info.status.is_ended() {
        let (again, _) = this_command_again(cli);
        // `cargo run -p deliver --` with no flag after it: the plain command.
        let again = again.trim_end_matches(" --");
        bail!(
            "the `deliver` serving {} ended before run {run_id} did: the run is {} at {} (seq \
             {}), with the approval recorded; `{again}` goes on with it",
            store.display(),
            info.status,
            info.state,
            info.seq
        );
    }
    show_reached(shown, &record, async || Ok(read.history(run_id)?)).await?;
    ended(run_id, &info, record, payloads)
}

/// Prints `[seq N] State (in the serving process)` for `latest` unless it was the last shown,
/// after the records between the last shown and it (from `history`, read only then), if any:
/// none at the first read, as the states before the approval are not followed.
async fn show_reached(
    shown: &mut Option<u64>,
    latest: &TransitionRecord,
    history: impl AsyncFnOnce() -> Result<Vec<TransitionRecord>>,
) -> Result<()> {
    if let Some(last) = *shown
        && latest.seq > last.saturating_add(1)
    {
        for record in history()
            .await?
            .iter()
            .filter(|r| r.seq > last && r.seq < latest.seq)
        {
            show(shown, record);
        }
    }
    show(shown, latest);
    Ok(())
}

/// Prints `[seq N] State (in the serving process)` for `record` unless it was the last shown.
fn show(shown: &mut Option<u64>, record: &TransitionRecord) {
    if *shown != Some(record.seq) {
        say!(
            "[seq {}] {} (in the serving process)",
            record.seq,
            record.state
        );
        *shown = Some(record.seq);
    }
}

/// What opens the payloads of an encrypted store: the key file's keys (the control endpoint
/// serves payloads as stored, sealed).
fn payloads(cli: &Cli) -> Result<Option<Payloads>> {
    let Some(file) = cli.key_file.as_deref() else {
        return Ok(None);
    };
    Ok(Some(Payloads::new(Arc::new(loops::Keyring::from_file(
        file,
    )?))))
}

/// Says how the run ended, from its row `info` and its terminal record: its pull request,
/// or that it gave up.
///
/// # Errors
/// The run failed or was cancelled; its record cannot be read.
fn ended(
    run_id: &str,
    info: &RunInfo,
    mut record: TransitionRecord,
    payloads: Option<&Payloads>,
) -> Result<()> {
    let at = format!("at {} (seq {})", info.state, info.seq);
    match info.status {
        RunStatus::Completed => {}
        RunStatus::Failed => bail!(
            "run {run_id} failed {at} in the serving process: {}. {}",
            info.error.as_deref().unwrap_or_default().join(": "),
            versions::AFTER_A_FAILED_RUN
        ),
        status => bail!("run {run_id} is {status} {at} in the serving process"),
    }
    // The serving process seals what it stores when it has a key file; the control endpoint
    // serves payloads as stored.
    if let Some(Ok(sealed)) = loops::parse_envelope(record.payload.get()) {
        let opened = payloads.map(|p| p.open_transition(run_id, &mut record));
        if !matches!(opened, Some(Ok(()))) {
            let why = match opened {
                Some(Err(e)) => format!("the key file given cannot open it ({e})"),
                _ => "give the key file with --key-file to read it".to_owned(),
            };
            say!(
                "run {run_id} ended at {} (seq {}) in the serving process; its result is \
                 encrypted with key {}: {why}",
                info.state,
                info.seq,
                sealed.key
            );
            return Ok(());
        }
    }
    say!("{}", versions::finished_of(run_id, &record)?.outcome());
    Ok(())
}
