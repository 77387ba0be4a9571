//! `deliver`: an agent that takes an issue to a pull request, durably.
//!
//! It plans a change with a model, commits it, runs the tests, asks the model to fix what
//! still fails, and when the tests pass has the model review the change, then pushes a branch
//! and opens a pull request. Every
//! state it reaches is recorded in a loops store: kill the process at any moment, run the
//! same command again, and it resumes from its last completed step without repeating a
//! recorded side effect.
//!
//! ```text
//! cargo run -p deliver             # run (or resume, or report) run `deliver-1`
//! cargo run -p deliver -- --fresh  # start over
//! ```
//!
//! Everything is local and offline: a git repository holding a tiny Rust crate with two bugs,
//! a bare repository as its remote, a directory as the forge, and by default a scripted
//! stand-in for the model (`model.rs`). `--model openai`, in a build with the `openai`
//! feature, asks a real one through the OpenAI-compatible chat-completions API (`openai.rs`).

/// Prints a line on standard output like `println!`, but ignores write errors: when the output
/// is a closed pipe (`deliver | head -2`), the work goes on and only the printing stops.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::print_line(format_args!($($arg)*))
    };
}

mod agent;
mod approval;
mod binding;
mod child;
mod forge;
mod git;
mod hints;
mod hooks;
mod model;
mod model_args;
#[cfg(feature = "openai")]
mod openai;
mod place;
mod project;
mod stop;
mod store;
mod testrun;
mod tokens;
mod versions;
mod waits;
mod workdir;
mod workflow;

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use clap::Parser;
use loops::{RetryPolicy, RunStatus, Runtime};
use tracing_subscriber::EnvFilter;

use crate::agent::Agent;
use crate::forge::Forge;
use crate::git::Git;
use crate::hooks::Hooks;
use crate::model::AnyModel;
use crate::model_args::ModelArgs;
use crate::project::Paths;
use crate::stop::{Interrupt, Stop};
use crate::store::{delete_for_fresh, open_for_checks, open_store, store_error};
use crate::versions::{Finished, Release};
use crate::workflow::Base;

const HOOKS_HELP: &str = "\
Logging: RUST_LOG=loops=info shows the store's commits; RUST_LOG=loops=info,deliver=debug also
every git command. The default shows warnings only.

For tests only (environment variables):
  LOOPS_DELIVER_HOLD_AT_SEQ=k  at the entry of the state at seq k, print `holding at seq k`
                               and wait forever (for a test to SIGKILL the process there)
  LOOPS_DELIVER_STOP_AT_SEQ=k  at the entry of seq k, exit 0 without doing the state's work,
                               closing the store cleanly (version 2's Planned enters once its
                               child runs have ended: they are its work before the entry)
  LOOPS_DELIVER_HOLD_IN_SETUP=p  at point p of the setup, print `holding in setup at p` and
                               wait forever: `aside` (--fresh moved the old work directory
                               aside), `new` (a new work directory built beside its place, not
                               renamed into it), `made` (the work directory in place and held,
                               the store not opened), `repo` (before the demo's repository is
                               set up and the run recorded)
Every state entry is appended to <workdir>/handler-entries.log as `seq state attempt`.

Versions: this build starts new runs on version 2 of the workflow (a review of the change by
the model before the pull request). A run recorded by version 1 is migrated to version 2 at
its state if the migration takes it, and finishes on version 1's kept handler otherwise.
--workflow-version 1 makes it the previous release (version 1 only), for tests that play a
rolling upgrade; --dry-run says, for every run in the store, what this build would do.";

/// Takes an issue to a pull request with a durable agent: plan, edit, test, fix, push, open
/// the pull request. Kill it at any moment and run it again: it resumes where it stopped.
#[derive(Debug, Parser)]
#[command(name = "deliver", after_help = HOOKS_HELP)]
struct Cli {
    /// The store file [default: <WORKDIR>/deliver.redb]. A work directory's runs are
    /// recorded in one store: a run there of another is refused
    #[arg(long, value_name = "PATH", value_parser = path_arg())]
    store: Option<PathBuf>,

    /// Where the repository, its remote, the forge and the store live. A run works in the
    /// directory it started in (recorded with it): another is refused
    #[arg(long, value_name = "DIR", default_value = DEFAULT_WORKDIR, value_parser = path_arg())]
    workdir: PathBuf,

    /// The git repository to work on: the top directory of an existing work tree. A new run
    /// starts from the last commit of the branch checked out there, which its pull request
    /// targets; it is refused while HEAD is detached (as earlier versions of this example
    /// left it after testing: check your branch out again) or tracked files have uncommitted
    /// changes (commit or stash them). The checkout is never changed: the agent commits to
    /// its own branch (loops/<RUN_ID>) through git's object database and builds the tests in
    /// a copy under the work directory, so a run that exists goes on whatever is checked out.
    /// A run remembers its repository: resuming it needs no --repo, and another is refused
    /// [default: the run's recorded repository, else <WORKDIR>/repo, created with a tiny Rust
    /// crate]
    #[arg(long, value_name = "PATH", value_parser = path_arg())]
    repo: Option<PathBuf>,

    /// Encrypt payloads at rest with this key file (`KEY_ID HEX` lines, writing key first,
    /// mode 0600; docs/encryption.md); `loops --key-file` reads them [default: unencrypted]
    #[arg(long, env = "LOOPS_KEY_FILE", value_name = "PATH")]
    key_file: Option<PathBuf>,

    /// The run's id, its idempotency key: running the same id again resumes or reports it
    #[arg(long, value_name = "ID", default_value = DEFAULT_RUN_ID, value_parser = RunIdArg)]
    run_id: String,

    /// Whether `--run-id` was on the command line (a dry run then speaks of that run only).
    #[arg(skip)]
    run_id_given: bool,

    /// Delete the store and the work directory first, and start over
    #[arg(long)]
    fresh: bool,

    /// If the run failed (a state ran out of attempts), give it a fresh budget of attempts
    /// and resume it
    #[arg(long, conflicts_with = "fresh")]
    retry: bool,

    /// Approve the pull request automatically, by sending the approval event from this
    /// process (the one-command demo) [default: true, unless the run was started with
    /// `--auto-approve=false` or waits at the approval gate already]. With
    /// `--auto-approve=false` the run stops at the approval gate and waits, durably, for a
    /// human (the run records it: attribute `approval = human`); the same command without
    /// `--auto-approve` leaves it waiting, whatever happened to the run meanwhile. Approve
    /// with `--approve`, or while no `deliver` runs with
    /// `cargo run -p loops-cli -- --store <STORE> send <RUN> approve --json '{"by":"you"}'`
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    auto_approve: Option<bool>,

    /// Approve the run's pull request (as $USER, or `operator`) and go on; while another
    /// `deliver --serve` holds the store, through that process's control endpoint: if that
    /// process drives the run, it finishes it and this command follows it there to its end
    /// (and fails if that process ends first); otherwise this command ends at once
    #[arg(long, conflicts_with_all = ["auto_approve", "fresh"])]
    approve: bool,

    /// Serve the store's control endpoint (the socket <STORE>.sock) while this process runs,
    /// and keep running while the run waits at the approval gate, until the run ends (or
    /// Ctrl-C): meanwhile `loops --store <STORE> runs`, `show <RUN>` and
    /// `send <RUN> approve --json '{"by":"you"}'` work, and an approval sent so is taken by
    /// this process at once
    #[arg(long)]
    serve: bool,

    /// Say what this build would do with every unfinished or blocked run in the store (drive,
    /// migrate, or leave it blocked), or with the one `--run-id` names, and write nothing
    #[arg(long, conflicts_with_all = ["fresh", "retry", "approve", "auto_approve", "serve"])]
    dry_run: bool,

    /// Which release of the workflow this binary is: 2 (this one) or 1 (the previous, for
    /// tests that play a rolling upgrade; see the help's end)
    #[arg(
        long,
        value_enum,
        value_name = "N",
        default_value = "2",
        hide_short_help = true
    )]
    workflow_version: Release,

    #[command(flatten)]
    model: ModelArgs,
}

/// The default work directory.
const DEFAULT_WORKDIR: &str = "target/loops-demo";
/// The default run id.
const DEFAULT_RUN_ID: &str = "deliver-1";

/// `--run-id`'s parser: a run id loops takes and that is not an edit child's, else a usage
/// error (exit code 2, before anything is printed or touched).
fn run_id_arg(id: &str) -> Result<String, String> {
    loops::validate_run_id(id).map_err(|e| e.to_string())?;
    if let Some(parent) = agent::edit_parent(id) {
        return Err(format!(
            "invalid run id {id:?}: ids of the form <RUN_ID>/edit-<N> are those of the child runs that apply a plan's edits (run {parent:?} would start this one)"
        ));
    }
    Ok(id.to_owned())
}

/// `--run-id`'s value parser: [`run_id_arg`], whose refusal clap reports with the value in
/// it, except for a value longer than any run id, which is not echoed whole (a pasted file
/// would fill the screen, helper-133): the refusal shows its first 64 characters and length.
#[derive(Clone)]
struct RunIdArg;

impl clap::builder::TypedValueParser for RunIdArg {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        if value.len() <= loops::MAX_RUN_ID_BYTES {
            return clap::builder::StringValueParser::new()
                .try_map(|id| run_id_arg(&id))
                .parse_ref(cmd, arg, value);
        }
        let why = match value.to_str() {
            Some(id) => run_id_arg(id).err(),
            None => None,
        }
        .unwrap_or_else(|| format!("longer than {} bytes", loops::MAX_RUN_ID_BYTES));
        let error = clap::Error::raw(
            clap::error::ErrorKind::ValueValidation,
            format!("invalid value for '--run-id <ID>': {why}\n"),
        );
        Err(error.with_cmd(cmd))
    }
}

/// The parser of `--workdir`, `--store` and `--repo`: a path, not an empty one (clap's own
/// says of `--workdir ""` that no value was supplied). It takes paths that are not UTF-8,
/// which `place::check_given` refuses in words of its own, with the places' other checks.
fn path_arg() -> impl clap::builder::TypedValueParser<Value = PathBuf> {
    use clap::builder::TypedValueParser as _;
    clap::builder::OsStringValueParser::new().try_map(|path| match path.is_empty() {
        true => Err("empty: name a path (or leave the flag out for its default)"),
        false => Ok(PathBuf::from(path)),
    })
}

/// Failed attempts per state before the run fails (short delays, so that a state that really
/// fails gives up within seconds).
const MAX_ATTEMPTS: u32 = 3;

/// Attempts per state that may be cut short by the process stopping. loops counts them apart
/// from failures, so that a state that crashes the process every time ends the run instead of
/// looping; this demo is meant to be killed over and over (`kill-resume -n 20` at 0.1 s
/// intervals may land every kill in one state), hence a budget far above the default of 10.
const MAX_INTERRUPTIONS: u32 = 100;

#[tokio::main]
async fn main() -> ExitCode {
    // A damaged store file makes redb panic inside loops, which reports it as an error: that
    // error, on one line, is all the user should see.
    loops::silence_caught_redb_panics();
    let cli = {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let matches = match Cli::command().try_get_matches() {
            Ok(matches) => matches,
            // clap shows a refused value as it was given: a bidirectional control in it
            // would reorder the line on a terminal (the refusal itself says why), so it is
            // escaped, as the `loops` CLI shows one.
            Err(e) if e.use_stderr() => {
                eprint!("{}", loops::escape_bidi_controls(&e.render().to_string()));
                return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
            }
            Err(e) => e.exit(),
        };
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        cli.run_id_given =
            matches.value_source("run_id") == Some(clap::parser::ValueSource::CommandLine);
        cli
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // Run again with `--fresh`, a command would start over, not resume.
    let resume = if cli.fresh {
        "run the same command without --fresh to resume (with it, the run starts over)"
    } else {
        "run the same command again to resume"
    };
    let (store, run_id) = (
        project::store_path(&cli.workdir, cli.store.as_deref()),
        cli.run_id.clone(),
    );
    match run(cli).await {
        Ok(Ended::Done) => ExitCode::SUCCESS,
        Ok(Ended::Interrupted(stop)) => stopped(
            stop,
            &stop::after_a_stop(&store, &run_id).unwrap_or(resume.to_owned()),
        ),
        Ok(Ended::StoppedFollowing(stop, run_id)) => stopped(
            stop,
            &format!(
                "stopped following run {run_id}, which goes on in the serving process \
                 (--approve again follows it)"
            ),
        ),
        Err(err) => {
            // Written like `say!`: a closed standard error must not turn this into a panic.
            // One line, whatever the messages it quotes (a run's recorded failure may hold
            // git's several lines).
            let _ = writeln!(
                std::io::stderr(),
                "error: {}",
                loops::escape_bidi_controls(&git::one_line(&format!("{err:#}")))
            );
            ExitCode::FAILURE
        }
    }
}

/// Says that Ctrl-C or SIGTERM (`stop`) stopped this program, and `next`; returns the exit
/// code: 130 for Ctrl-C, 143 for SIGTERM.
fn stopped(stop: Stop, next: &str) -> ExitCode {
    let (said, code) = match stop {
        Stop::CtrlC => ("interrupted", 130),
        Stop::Terminate => ("terminated (SIGTERM)", 143),
    };
    // Written like `say!`: a closed standard error must not turn this into a panic.
    let _ = writeln!(std::io::stderr(), "{said}; {next}");
    ExitCode::from(code)
}

/// How this program ended, when it did not fail.
enum Ended {
    /// It did what it was asked: the run ended, parked at the approval gate, or a test hook
    /// stopped it.
    Done,
    /// Ctrl-C or SIGTERM stopped it.
    Interrupted(Stop),
    /// Ctrl-C or SIGTERM stopped `--approve` while it followed the run (its id) in the
    /// serving process, where the run goes on.
    StoppedFollowing(Stop, String),
}

/// Sets up, then drives the run until it ends or parks, or until Ctrl-C or SIGTERM: then it
/// stops driving (the handler's future is dropped, as a crash would drop it: rustc and the
/// tests are killed, a git command finishes) and closes the store cleanly, so that the same
/// command resumes the run.
async fn run(cli: Cli) -> Result<Ended> {
    // Refused before anything is printed or touched.
    let model = cli.model.choose()?;
    if cli.dry_run {
        return dry_run(&cli).await.map(|()| Ended::Done);
    }
    let store = project::store_path(&cli.workdir, cli.store.as_deref());
    if cli.serve {
        // A socket path too long is refused before a work directory or a store is made: the
        // store's path made absolute, as `set_up` opens it.
        let opened = std::path::absolute(&store).unwrap_or_else(|_| store.clone());
        loops::control::Endpoint::next_to(opened)
            .check_name()
            .context("--serve")?;
    }
    if cli.approve || cli.retry {
        // No store, no run: refused before a store or a work directory is made. A `deliver`
        // that holds the work directory (started a moment ago) may be making it: waited for.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !store.exists()
            && std::time::Instant::now() < deadline
            && workdir::is_held(&cli.workdir)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ensure!(store.exists(), place::no_such_run(&cli, &store));
    }
    let interrupt = Interrupt::listen();
    // `--approve`: another `deliver --serve` holding the store takes the approval instead.
    // Looked for again when the store is found locked: a process started a moment ago holds
    // the store before its endpoint exists.
    let mut looks = 0;
    let (paths, runtime) = loop {
        if cli.approve
            && let Some(ended) = approve_through(&cli, &store, &interrupt).await?
        {
            return Ok(ended);
        }
        let set_up = tokio::select! {
            biased;
            stop = interrupt.wait() => return Ok(Ended::Interrupted(stop)),
            set_up = set_up(&cli) => set_up,
        };
        match set_up {
            Err(e) if cli.approve && e.is::<store::Locked>() && looks < 3 => looks += 1,
            set_up => break set_up?,
        }
    };
    let control = if cli.serve {
        let served = runtime.serve_control_next_to_store().await;
        let served = served.context("--serve")?;
        if let loops::control::Endpoint::Unix(socket) = served.endpoint() {
            say!(
                "control: {} (`loops --store <STORE>` reaches this process through it)",
                socket.display()
            );
        }
        Some(served)
    } else {
        None
    };
    let ended = tokio::select! {
        biased;
        stop = interrupt.wait() => Ok(Ended::Interrupted(stop)),
        driven = drive(&cli, &paths, &runtime, model) => driven.map(|()| Ended::Done),
    };
    if let Some(control) = control {
        control.stop().await;
    }
    // Stops what still runs, and closes the store file cleanly.
    runtime.shutdown().await;
    drop(runtime);
    ended
}

/// `--approve` through another `deliver --serve` holding the store (`store`), if one answers
/// on its control endpoint: the approval goes to that process, and this follows the run there
/// if that process drives it, until it ends or Ctrl-C. `None`, having done nothing, if no
/// process answers.
///
/// # Errors
/// As [`approval::through_the_serving_process`] and `Following::until_it_ends` say them.
async fn approve_through(cli: &Cli, store: &Path, interrupt: &Interrupt) -> Result<Option<Ended>> {
    let through = tokio::select! {
        biased;
        stop = interrupt.wait() => return Ok(Some(Ended::Interrupted(stop))),
        through = approval::through_the_serving_process(cli, store) => through?,
    };
    match through {
        approval::Through::NoProcess => Ok(None),
        approval::Through::Said => Ok(Some(Ended::Done)),
        approval::Through::Follow(following) => tokio::select! {
            biased;
            stop = interrupt.wait() => Ok(Some(Ended::StoppedFollowing(stop, cli.run_id.clone()))),
            followed = following.until_it_ends(cli, store) => followed.map(|()| Some(Ended::Done)),
        },
    }
}

/// Checks the arguments and the tools, deletes what `--fresh` deletes, creates the work
/// directory and opens the store.
///
/// The work directory's lock is what keeps two `deliver` from working in one work directory
/// at once (`workdir.rs`): a new one appears held, one that exists is written to only once
/// held, so that a second process started at the same moment is refused, with "is another
/// `deliver` running?" when it holds the same store, before it touches what the first one is
/// building. Then the store's lock. `--fresh` holds the old store's lock while it deletes.
async fn set_up(cli: &Cli) -> Result<(Paths, Runtime)> {
    place::check_given(cli)?;
    git::check_installed().await?;
    testrun::check_rustc().await?;
    let absolute = |p: &Path| {
        std::path::absolute(p).with_context(|| format!("cannot resolve {}", p.display()))
    };
    if let Some(repo) = &cli.repo {
        project::check_repo(&absolute(repo)?).await?;
    }
    let mut paths = Paths::new(
        absolute(&cli.workdir)?,
        cli.store.as_deref().map(absolute).transpose()?,
        cli.repo.as_deref().map(absolute).transpose()?,
    );
    paths.check_places()?;
    // Refused before an approval wish is written or anything deleted: a run of another store
    // than the one the work directory records (the store's own run too), or a `--fresh`
    // that is refused anyway.
    match cli.fresh {
        true => store::check_for_fresh(&paths)?,
        false => paths.refuse_other_store(&cli.run_id)?,
    }
    // The key file is read before --fresh deletes anything: a bad one stops the command
    // with the old work directory still there.
    let keys = cli.key_file.as_deref().map(loops::Keyring::from_file);
    let keys = keys.transpose()?;
    // What `--auto-approve` asks is kept before anything is deleted or made: a start stopped
    // before its run's first record and run again without `--auto-approve=false` must still
    // leave the run to a human.
    if cli.fresh {
        // Nothing is written or deleted in a work directory before its lock is taken; its
        // binding is read again under the lock.
        paths.lock_for_fresh().await?;
        paths.check_fresh()?;
        paths.remember_before_fresh(&cli.run_id, cli.auto_approve)?;
        delete_for_fresh(&paths).await?;
    }
    let made = paths.create_workdir(&cli.run_id, cli.auto_approve).await?;
    hooks::hold_in_setup("made");
    let created = !paths.store.exists();
    if created && paths.bound_store_gone()? {
        say!(
            "the store {} that work directory {} recorded its runs in is gone (moved or \
             deleted): a new one is made there, which knows none of them (a run of theirs \
             starts anew: its steps find their commits and pull request by their idempotency \
             keys, and one left to a human stays so)",
            paths.store.display(),
            paths.workdir.display()
        );
    }
    let runtime = match open_settled(cli, &mut paths, keys, created).await {
        Ok(runtime) => runtime,
        Err(e) => {
            // A refused store (a directory, another program's file, a damaged one, one that
            // another process holds) or run leaves no work directory made for it: one this
            // process made is its own (held since it appeared), whoever holds the store.
            if let Some(made) = made.as_deref() {
                paths.remove_new_workdir(made);
            }
            return Err(e);
        }
    };
    if let Err(e) = paths.take_for(&cli.run_id).await {
        // A store made for a run that cannot take the work directory goes (it is open here
        // only: on Unix, an open file can be deleted).
        if created && cfg!(unix) {
            let _ = std::fs::remove_file(&paths.store);
        }
        return Err(e);
    }
    paths.clear_leftovers()?;
    Ok((paths, runtime))
}

/// The runtime this example opens its store with: the workflow's versions of `cli`'s
/// release, the key file's `keys` as its codec, the model calls' limit and the retry policy.
fn runtime_builder(cli: &Cli, keys: Option<loops::Keyring>) -> loops::RuntimeBuilder {
    let builder = versions::builder(cli.workflow_version);
    let builder = match keys {
        Some(keys) => builder.codec(keys),
        None => builder,
    };
    builder
        .limit(agent::MODEL_LIMIT_NAME, agent::model_limit())
        .retry(
            RetryPolicy::attempts(MAX_ATTEMPTS)
                .with_max_interruptions(MAX_INTERRUPTIONS)
                .with_delays(Duration::from_millis(100), Duration::from_secs(1)),
        )
}

/// Opens the store (`created`: it did not exist) and settles the run on it, before anything
/// is done in the work directory: whether the run is a deliver run, and where it works (a run
/// that exists goes on where it started; [`place::settle_run`]).
///
/// A store that exists is settled on opened read-only, before the writable open, so that a
/// refused run (one that works in another work directory, say) or key file leaves the file's
/// bytes as they were; a store that cannot be read so is settled after the writable open, which
/// refuses it or repairs it. A run refused on a store this made leaves no store: it is
/// deleted while open here.
///
/// # Errors
/// If the store cannot be opened (as [`store_error`] words it), or the run is refused.
async fn open_settled(
    cli: &Cli,
    paths: &mut Paths,
    keys: Option<loops::Keyring>,
    created: bool,
) -> Result<Runtime> {
    let checks = match created {
        true => None,
        false => open_for_checks(&paths.store).await.map_err(store_error)?,
    };
    let settled = checks.is_some();
    if let Some(read) = checks {
        place::settle_run(cli, paths, &read).await?;
        // The key file too: refused (none for an encrypted store, a foreign one) before the
        // writable open, as the run is.
        runtime_builder(cli, keys.clone())
            .check_codec(&read)
            .map_err(store_error)?;
    }
    let opened = open_store(|| runtime_builder(cli, keys.clone()).open(&paths.store)).await;
    let runtime = opened.map_err(|e| match e {
        loops::Error::SchemaMismatch { .. } => {
            anyhow::anyhow!("{e}. Run with --fresh to start over, or use another --run-id")
        }
        e => store_error(e),
    })?;
    if !settled && let Err(e) = place::settle_run(cli, paths, runtime.store()).await {
        if created && cfg!(unix) {
            let _ = std::fs::remove_file(&paths.store);
        }
        return Err(e);
    }
    Ok(runtime)
}

/// `--dry-run`: prints what this build would do with every unfinished or blocked run of the
/// store (`Runtime::dry_run`), writing nothing: the store is opened read-only, no work
/// directory is made, and a missing store is not created.
async fn dry_run(cli: &Cli) -> Result<()> {
    let store = project::store_path(&cli.workdir, cli.store.as_deref());
    if !store.exists() {
        say!("no store at {}: no run to drive", store.display());
        return Ok(());
    }
    // Read-only: not one byte of the file changes, even of one a crash left (when a dry run
    // is most wanted).
    let read_only = store::open_read_only(&store).await?;
    let builder = versions::dry_run_builder(cli.workflow_version);
    let keys = cli.key_file.as_deref().map(loops::Keyring::from_file);
    let runtime = match keys.transpose()? {
        Some(keys) => builder.codec(keys).build(read_only),
        None => builder.build(read_only),
    };
    let only = cli.run_id_given.then_some(cli.run_id.as_str());
    let lines = versions::dry_run(&runtime, only).await;
    let asked = match only {
        Some(id) => runtime.run_info(id).await.map(Some),
        None => Ok(None),
    };
    runtime.shutdown().await;
    let (lines, asked) = (lines?, asked?);
    let version = match cli.workflow_version {
        Release::V1 => 1,
        Release::V2 => 2,
    };
    if let Some(id) = only {
        if lines.is_empty() {
            match asked.flatten() {
                None => say!("dry run: no run {id} in {}", store.display()),
                Some(info) => say!(
                    "dry run: run {id} in {} is {} at {} (seq {}): nothing to do",
                    store.display(),
                    info.status,
                    info.state,
                    info.seq
                ),
            }
            return Ok(());
        }
        say!(
            "dry run: run {id} in {}; this build (version {version}) would:",
            store.display()
        );
    } else {
        say!(
            "{}",
            versions::dry_run_heading(lines.len(), &store, version)
        );
    }
    for line in lines {
        say!("  {line}");
    }
    Ok(())
}

/// Drives the run until it ends, parks at the approval gate, or a test hook stops it.
async fn drive(cli: &Cli, paths: &Paths, runtime: &Runtime, model: AnyModel) -> Result<()> {
    let shown_store = say_where(cli, paths, &model);
    hooks::hold_in_setup("repo");

    // A run that has ended is reported, not driven (a failed one is driven again with
    // --retry): that needs neither its repository nor its remote, either of which may be
    // gone since, and neither is made. One still there must hold what the run did (a copy
    // of the work directory made before is refused, as for a run that goes on).
    let ended = runtime.run_info(&cli.run_id).await?.is_some_and(|info| {
        info.status.is_ended() && !(cli.retry && info.status == RunStatus::Failed)
    });
    // A run this build does not know (recorded by a later release, or by another workflow of
    // the same name) is the runtime's to refuse: it marks the run blocked and says what
    // changed. Its records are not read here, and no repository is prepared for it; the
    // initial state's base is then never read (the run exists).
    let base = if ended {
        let head = match paths.repo.exists() {
            true => versions::recorded_head(runtime, &cli.run_id).await?,
            false => None,
        };
        let pushed = paths.remote.exists() && versions::recorded_push(runtime, &cli.run_id).await?;
        place::check_holds(paths, &cli.run_id, head.as_deref(), pushed).await?;
        Base::default()
    } else if versions::knows(runtime, &cli.run_id, cli.workflow_version).await? {
        let recorded = versions::recorded_base(runtime, &cli.run_id).await?;
        let base = project::prepare(paths, &agent::work_branch(&cli.run_id), recorded).await?;
        let head = versions::recorded_head(runtime, &cli.run_id).await?;
        let pushed = versions::recorded_push(runtime, &cli.run_id).await?;
        place::check_holds(paths, &cli.run_id, head.as_deref(), pushed).await?;
        base
    } else {
        Base::default()
    };
    let hooks = Hooks::from_env(paths.entries_log.clone())?;
    let agent = Agent {
        model,
        git: Git::new(&paths.repo),
        remote: paths.remote.clone(),
        forge: Forge::open(&paths.forge, &paths.remote, "demo")?,
        scratch: paths.scratch.clone(),
        hooks: hooks.clone(),
    };
    versions::drive_children(runtime, cli.workflow_version, &agent.git).await?;

    if cli.retry
        && let Some(info) = runtime.run_info(&cli.run_id).await?
        && info.status == RunStatus::Failed
    {
        runtime.retry(&cli.run_id).await?;
        say!(
            "run {} failed at {} (seq {}); retrying it with a fresh budget of attempts",
            cli.run_id,
            info.state,
            info.seq
        );
    }
    versions::report_start(runtime, &cli.run_id, cli.workflow_version).await?;
    let version = versions::choose(runtime, &cli.run_id, cli.workflow_version).await?;
    // What the journal holds before this process drives the run: on a resume, the model calls
    // that will not be made again.
    let resumed = runtime
        .run_info(&cli.run_id)
        .await?
        .is_some_and(|info| info.status != RunStatus::Completed);
    let saved = tokens::recorded_calls(runtime, &cli.run_id).await?;
    let report_tokens = async || -> Result<()> {
        let calls = tokens::recorded_calls(runtime, &cli.run_id).await?;
        for line in tokens::summary(&calls, &saved, resumed) {
            say!("{line}");
        }
        Ok(())
    };
    let gate = approval::Gate::of(cli, &paths.workdir, runtime).await?;
    approval::note_approved_already(cli, runtime).await?;
    if cli.approve && !gate.knows {
        say!(
            "note: --approve sends nothing: this build cannot drive run {} (below); approve it \
             with a build that can",
            cli.run_id
        );
    }
    // A new run's record of who approves it: as asked now, or by an earlier start of it
    // stopped before its first record.
    let auto_approve = cli.auto_approve.or(gate.left_to_a_human.map(|_| false));
    let run = versions::drive(
        runtime,
        &cli.run_id,
        version,
        project::issue(),
        base,
        &agent,
        paths.recorded_in(approval::start_options(auto_approve))?,
    );
    tokio::pin!(run);
    let outcome = tokio::select! {
        result = &mut run => Some(result),
        () = approval::send(runtime, &cli.run_id, gate.approve, &gate.approver) => None,
        () = approval::parked_at_the_gate(runtime, &cli.run_id, gate.approve), if gate.knows => {
            // The work directory keeps the wish while the run waits for its human: a store
            // moved away meanwhile must not let a run started anew approve itself.
            report_tokens().await?;
            if let Some(why) = gate.left_to_a_human {
                say!("not approving it automatically: {why} (--auto-approve approves it)");
            }
            if !cli.serve {
                say!("{}", hints::approval_hint(cli, &shown_store));
                return Ok(());
            }
            // --serve: the run waits in this process, which takes an approval sent through
            // the control endpoint at once.
            say!("{}", hints::serving_hint(cli, &shown_store));
            tokio::select! {
                result = &mut run => Some(result),
                () = hooks.stopped() => None,
            }
        }
        () = hooks.stopped() => None,
        never = waits::say_timer_waits(runtime, &cli.run_id) => match never {},
    };
    let Some(result) = outcome else {
        // The stop hook fired: the handler was dropped before doing anything; `run` closes
        // the store file cleanly.
        return Ok(());
    };
    approval::forget_asked(&paths.workdir, &cli.run_id)?;
    let last = versions::ended_with(runtime, &cli.run_id, result).await?;

    let seq = runtime
        .run_info(&cli.run_id)
        .await?
        .map_or(0, |info| info.seq);
    if hooks.stops_at(seq) {
        say!("stopping at seq {seq} ({})", hooks::STOP_VAR);
        return Ok(());
    }
    let state = last.state();
    match &last {
        Finished::PrOpened {
            number,
            url,
            branch,
            head,
        } => {
            let line = format!(
                "pull request #{number} {url} ({branch} at {})",
                agent::short(head)
            );
            hooks.enter(seq, state, None, &line).await?;
            report_tokens().await?;
            say!("{}", last.outcome());
            let file = agent.forge.path_of(*number);
            if file.exists() {
                say!("  stored in {}", file.display());
            } else {
                // Opened from a copy of this work directory, into that copy's forge.
                say!(
                    "  not in this work directory's forge ({} is missing: was it opened from a \
                     copy of this work directory?)",
                    file.display()
                );
            }
        }
        Finished::Abandoned { reason } => {
            hooks.enter(seq, state, None, reason).await?;
            report_tokens().await?;
            say!("{}", last.outcome());
        }
    }
    Ok(())
}

/// Prints where the run is stored, its id, its repository if recorded, and the model;
/// returns the store's path as shown.
fn say_where(cli: &Cli, paths: &Paths, model: &AnyModel) -> PathBuf {
    let shown_store = project::store_path(&cli.workdir, cli.store.as_deref());
    say!("store:  {}", shown_store.display());
    say!("run id: {}", cli.run_id);
    if paths.repo_recorded {
        say!("repo:   {} (recorded for this run)", paths.repo.display());
    }
    say!("model:  {}", model.describe());
    shown_store
}

/// Writes `args` and a newline to standard output, ignoring errors (see [`say!`]).
/// A bidirectional control in what is said (a path of the user's, a model's text) is
/// escaped (`\u{202e}`), as the `loops` CLI shows one: on a terminal it would reorder the line.
fn print_line(args: std::fmt::Arguments<'_>) {
    let line = args.to_string();
    let _ = writeln!(
        std::io::stdout().lock(),
        "{}",
        loops::escape_bidi_controls(&line)
    );
}
