//! The command line: every subcommand, option and help text (clap's derive).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use loops_core::RunStatus;

const EXAMPLES: &str = "\
Examples:
  export LOOPS_STORE=/var/lib/agent/loops.redb
  loops runs --status failed,waiting        # what needs attention
  loops show deliver-1                      # where one run stands, with its state's data
  loops history deliver-1                   # every transition, step and failed attempt
  loops graph deliver                       # the workflow's states and transitions (Mermaid)
  loops graph --run deliver-1 --svg run.svg # a picture of the path one run took
  loops retry deliver-1                     # a failed run becomes running again
  loops send deliver-1 approve --json '{\"by\":\"alice\"}'
  loops prune --older-than 30d --dry-run    # what retention would remove
  loops runs --json | jq '.[].run_id'

The store is the redb file the workflow's process opens with Runtime::open, or a PostgreSQL
store (--store postgres://USER@HOST/DB --pg-schema NAME). redb lets one process hold a file:
while a process holds it, this tool goes through the control endpoint the process serves
next to it (FILE.sock; Runtime::serve_control_next_to_store), with the same output and exit
codes. --verbose says which way it took.

Exit codes: 0 done; 1 the command failed (no such run, a store that is missing, damaged,
locked by a process without a control endpoint, a PostgreSQL server that is down, a process
of another loops version); 2 a bad argument.";

/// Inspect, steer and clean up the runs in a loops store file.
///
/// Needs no workflow code: records are JSON, stored with their schema descriptions.
#[derive(Debug, Parser)]
#[command(name = "loops", version, after_help = EXAMPLES, max_term_width = 100)]
pub struct Cli {
    /// The store: the redb file the workflow's process gives to Runtime::open, or a
    /// PostgreSQL URL (postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?sslmode=require]) or
    /// connection string in libpq's key=value form ("host=HOST user=USER dbname=DB").
    #[arg(long, global = true, env = "LOOPS_STORE", value_name = "PATH|URL", value_parser = non_empty_path())]
    pub store: Option<PathBuf>,

    /// Whether `store` came from `--store` on the command line rather than from
    /// LOOPS_STORE (set by [`usage::parse`](crate::usage::parse)): `upgrade PATH` refuses
    /// a `--store` that names another file, and takes PATH over LOOPS_STORE.
    #[arg(skip)]
    pub store_on_command_line: bool,

    /// The PostgreSQL schema that holds the store's tables (with a postgres:// store).
    #[arg(
        long,
        global = true,
        env = "LOOPS_PG_SCHEMA",
        value_name = "NAME",
        default_value = "loops"
    )]
    pub pg_schema: String,

    /// Say on stderr how the store was reached: the file directly, a running process's
    /// control endpoint, or PostgreSQL.
    #[arg(long, short, global = true)]
    pub verbose: bool,

    /// When to colour the output: auto colours a terminal unless NO_COLOR is set.
    #[arg(long, global = true, value_enum, default_value_t = ColorArg::Auto, value_name = "WHEN")]
    pub color: ColorArg,

    /// The payload key file (one `KEY_ID HEX` line per key, the writing key first; mode
    /// 0600) of a store whose payloads are encrypted (RuntimeBuilder::codec): payloads are
    /// shown decrypted, and `send` and `cancel` encrypt what they store. Without it, an
    /// encrypted payload shows as <encrypted: key K>.
    #[arg(long, global = true, env = "LOOPS_KEY_FILE", value_name = "PATH", value_parser = non_empty_path())]
    pub key_file: Option<PathBuf>,

    /// Read the store without first verifying the checksum of every page. Commands that only
    /// read (runs, show, history, schema, graph) verify by default, so that a damaged file is
    /// refused instead of shown. The check reads every page of the file, and writes nothing
    /// to it: 0.4 s for a 540 MB store here with the file in the OS's cache, as long as
    /// reading the file takes from disk. Commands that write verify on their writable open,
    /// always.
    #[arg(long, global = true)]
    pub no_verify: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The `--color` choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorArg {
    /// Colour a terminal, unless NO_COLOR is set (CLICOLOR_FORCE forces colour).
    Auto,
    /// Always colour.
    Always,
    /// Never colour.
    Never,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List runs, most recently changed first: id, workflow, status, current state, attempt,
    /// last change, what it waits for.
    #[command(after_help = RUNS_EXAMPLES)]
    Runs(RunsArgs),
    /// Show one run: status, current state and its data, what it waits for, its schema.
    #[command(after_help = SHOW_EXAMPLES)]
    Show(ShowArgs),
    /// Show a run's history: transitions, steps, failed attempts and events, in order.
    #[command(after_help = HISTORY_EXAMPLES)]
    History(HistoryArgs),
    /// Cancel a run that has not ended.
    #[command(after_help = CANCEL_EXAMPLES)]
    Cancel(CancelArgs),
    /// Make a failed run running again, with a fresh budget of attempts (numbers count on).
    #[command(after_help = RETRY_EXAMPLES)]
    Retry(RetryArgs),
    /// Send an event to a run (delivered to its wait for that event, once).
    #[command(after_help = SEND_EXAMPLES)]
    Send(SendArgs),
    /// Remove the records of ended runs: by age, by count, or both.
    #[command(after_help = PRUNE_EXAMPLES)]
    Prune(PruneArgs),
    /// Compact the store file, returning the space freed by pruning to the file system.
    #[command(after_help = COMPACT_EXAMPLES)]
    Compact(JsonArg),
    /// List stored schemas with their runs by status; show one's description; diff two.
    #[command(after_help = SCHEMA_EXAMPLES)]
    Schema(SchemaArgs),
    /// Show a run and its child runs, and theirs: the tree of runs it started.
    #[command(after_help = TREE_EXAMPLES)]
    Tree(TreeArgs),
    /// Draw a workflow's state graph (Mermaid, DOT or SVG), or the path one run took.
    #[command(after_help = GRAPH_EXAMPLES)]
    Graph(GraphArgs),
    /// Verify the checksum of every page of the store file and read every run back.
    #[command(after_help = CHECK_EXAMPLES)]
    Check(JsonArg),
    /// Serve a local web page of the runs: filter them, follow one live (timeline, graph),
    /// send an event, cancel, retry.
    #[command(after_help = UI_EXAMPLES)]
    Ui(UiArgs),
    /// Convert a store file of an older format to this build's (format 1 or 2 to 3),
    /// keeping a copy of it beside it (FILE.format-N.bak, N its format, or .bak.1, .bak.2,
    /// ... if taken). The file must not be open elsewhere.
    #[command(after_help = UPGRADE_EXAMPLES)]
    Upgrade(UpgradeArgs),
    /// List the stored schedules (runs started per tick), or pause, resume or remove one.
    #[command(after_help = SCHEDULES_EXAMPLES)]
    Schedules(SchedulesArgs),
}

/// `loops schedules`.
#[derive(Debug, Args)]
pub struct SchedulesArgs {
    /// What to do; without one, list the schedules.
    #[command(subcommand)]
    pub action: Option<ScheduleAction>,

    /// Print JSON (the list, or the schedule after the change) instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `loops schedules pause|resume|remove NAME`.
#[derive(Debug, Subcommand)]
pub enum ScheduleAction {
    /// Pause a schedule: its ticks start nothing until it is resumed (a process running it
    /// sees the pause at its next tick; registering it again keeps the pause).
    Pause {
        /// The schedule's name.
        name: String,
    },
    /// Resume a paused schedule: the ticks that fell while it was paused are not caught up.
    Resume {
        /// The schedule's name.
        name: String,
    },
    /// Remove a schedule from the store (its runs stay). A process whose code registers it
    /// at each start registers it anew then: pause it instead to stop it for good.
    Remove {
        /// The schedule's name.
        name: String,
    },
}

const SCHEDULES_EXAMPLES: &str = "\
Examples:
  loops schedules                      # name, workflow, spec, catch-up, paused, last and next tick
  loops schedules --json
  loops schedules pause nightly
  loops schedules resume nightly
  loops schedules remove nightly
  loops runs --attr loops.schedule=nightly   # the runs its ticks started";

const UPGRADE_EXAMPLES: &str = "\
Examples:
  loops upgrade /var/lib/agent/loops.redb
  loops --store /var/lib/agent/loops.redb upgrade
  LOOPS_STORE=/var/lib/agent/loops.redb loops upgrade

Without PATH, the file is the store (--store or LOOPS_STORE). PATH is taken over LOOPS_STORE;
PATH and a --store that names another file are refused.";

/// `loops upgrade [PATH]`.
#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// The store file to convert (a redb file; a PostgreSQL store has no format to convert);
    /// without it, the store (--store or LOOPS_STORE).
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,
}

/// `--json` alone.
#[derive(Debug, Args)]
pub struct JsonArg {
    /// Print JSON (stable field names; see the loops-cli README) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Statuses as `--status` accepts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusArg {
    /// Being driven, or to be driven when its process resumes it.
    Running,
    /// Parked until an event arrives or a time passes.
    Waiting,
    /// Reached a terminal state.
    Completed,
    /// Ran out of attempts (`loops retry` resumes it).
    Failed,
    /// Cancelled.
    Cancelled,
    /// Recorded with a schema that the build that last tried to drive it does not know, and
    /// has no migration from: it waits for a build that does (`loops show` says why).
    Blocked,
}

impl From<StatusArg> for RunStatus {
    fn from(s: StatusArg) -> Self {
        match s {
            StatusArg::Running => RunStatus::Running,
            StatusArg::Waiting => RunStatus::Waiting,
            StatusArg::Completed => RunStatus::Completed,
            StatusArg::Failed => RunStatus::Failed,
            StatusArg::Cancelled => RunStatus::Cancelled,
            StatusArg::Blocked => RunStatus::Blocked,
        }
    }
}

const RUNS_EXAMPLES: &str = "\
Examples:
  loops runs
  loops runs --status failed --status waiting
  loops runs --status running,waiting --workflow deliver
  loops runs --older-than 7d --status waiting   # stuck for a week
  loops runs --newer-than 1h --json
  loops runs --older-than 1h --newer-than 1d    # last changed between 1h and 1d ago
  loops runs --schema 3f9c0a1e                  # runs recorded with one schema
  loops runs --status blocked                   # runs no deployed build can drive
  loops runs --attr repo=acme/api               # runs with the attribute repo = acme/api
  loops runs --attr repo=acme/api --attr issue:int>=10 --status running
  loops runs --attr due:time<=2026-01-01T00:00:00Z

Runs are listed by last change, newest first. ATTEMPT is the number of the latest attempt
at the current state, from 1 (0 while none is begun: a run queued by Runtime::enqueue, or let
go by a draining worker at a state it had just entered); it counts on after `loops retry`, which gives the run a fresh
budget of attempts, not new numbers. --json prints an array of objects with the
fields run_id, workflow, status, state, seq, attempt, created_at, created_ms, updated_at,
updated_ms, waiting_for, retry_at, retry_at_ms, error, cancel_reason, schema, blocked
(null, or {reason, changes, schema, at, at_ms, resume} for a blocked run: why, what changed
in the schema, and the status it goes back to when a build that knows its schema drives it),
attributes (the run's searchable attributes by key, each {\"str\": S}, {\"int\": N} or
{\"time_ms\": MS}).
A blocked run shows `blocked: REASON` under WAITING FOR; docs/evolution.md says what to do.";

/// `loops runs`.
#[derive(Debug, Args)]
pub struct RunsArgs {
    /// Only runs with this status (repeat it, or separate with commas).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "STATUS")]
    pub status: Vec<StatusArg>,

    /// Only runs of this workflow.
    #[arg(long, value_name = "NAME")]
    pub workflow: Option<String>,

    /// Only runs recorded with this schema (its hash, or a unique prefix of at least 4 hex
    /// digits; `loops schema` lists them).
    #[arg(long, value_name = "HASH")]
    pub schema: Option<String>,

    /// Only runs whose last change is older than this (e.g. 30d, 12h, 90m).
    #[arg(long, value_parser = parse_age, value_name = "AGE")]
    pub older_than: Option<Duration>,

    /// Only runs whose last change is more recent than this (e.g. 1h); with --older-than, a
    /// window, so it must be the longer age.
    #[arg(long, value_parser = parse_age, value_name = "AGE")]
    pub newer_than: Option<Duration>,

    /// At most this many runs, the most recently changed (0: all of them). When more match,
    /// a note on stderr says how many were left out.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: usize,

    /// Only runs with this attribute (repeat it: all must hold). `KEY=VALUE` for a string;
    /// `KEY:int=42` for an integer, `KEY:time=2026-01-01T00:00:00Z` (or ms since the epoch)
    /// for a time; `>=` and `<=` instead of `=` for a range of integers or times (both ends
    /// included). Found through the store's attribute index.
    #[arg(long = "attr", value_parser = crate::attrs::parse_attr, value_name = "KEY[:TYPE]=VALUE")]
    pub attr: Vec<loops_core::AttributeFilter>,

    /// Print JSON (an array; stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
}

const SHOW_EXAMPLES: &str = "\
Examples:
  loops show deliver-1
  loops show deliver-1 --schema               # and the schema description it was recorded with
  loops show deliver-1 --json | jq .payload

The text form names the run's schema by its hash; --schema adds its description (one line
per field, as `loops schema RUN` prints it). A blocked run shows why (`blocked`), each change
of its schema that stops it (`change`), and the status it goes back to when unblocked. A cancelled
or failed run lists the steps its last state recorded (`steps done`: their effects happened). --json
prints {run, payload, schema_description, pending_events, state_steps}, with the description
always; run has the fields of `loops runs --json`.";

/// `loops show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The run id.
    #[arg(value_name = "RUN", value_parser = clap::value_parser!(OsString))]
    pub run: OsString,

    /// Also print the description of the schema the run was recorded with.
    #[arg(long)]
    pub schema: bool,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `loops tree`.
#[derive(Debug, Args)]
pub struct TreeArgs {
    /// The run at the root of the tree.
    #[arg(value_name = "RUN", value_parser = clap::value_parser!(OsString))]
    pub run: OsString,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

const TREE_EXAMPLES: &str = "\
Examples:
  loops tree deliver-1
  loops tree deliver-1 --json | jq '.children[].run.status'

One line per run: its id, workflow, status and state, each child indented under the run that
started it (ctx.start_child), children by run id. A child's parent is in `loops show` too.";

const HISTORY_EXAMPLES: &str = "\
Examples:
  loops history deliver-1
  loops history deliver-1 --json | jq '.transitions[].state'

One line per transition (KIND state; ELAPSED is the time since the previous transition),
per recorded step (ELAPSED is how long it ran) and per failed attempt (with its error chain),
then the run's events. A migration is a record of its own, shown as `migrated from schema X
(version N) to Y at seq M (continues seq K)`: the state it continues was entered at seq K,
whose steps it keeps; so is an acceptance (a version whose `accepts` lists X took the run as
it is: `accepted as it is from schema X ...`). --json prints {run, transitions: [{seq, state,
at, at_ms, since_previous_ms, schema, migrated_from, payload, steps, failures}], events},
where migrated_from is null or {schema, version, seq, accepted}.";

/// `loops history`.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The run id.
    #[arg(value_name = "RUN", value_parser = clap::value_parser!(OsString))]
    pub run: OsString,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

const CANCEL_EXAMPLES: &str = "\
Examples:
  loops cancel deliver-2 --reason 'duplicate of deliver-1'

A run no process drives ends as cancelled at once. One a process drives (through its control
endpoint, or another worker of a shared PostgreSQL store) ends in the state it is in: a waiting
run as soon as its driver sees the request, a running one at its next step or state boundary.";

/// The reason `loops cancel` gives without `--reason`.
pub const DEFAULT_CANCEL_REASON: &str = "cancelled with the loops CLI";

/// `loops cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The run id.
    #[arg(value_name = "RUN", value_parser = clap::value_parser!(OsString))]
    pub run: OsString,

    /// Why: kept with the run and shown by `loops show`: one line of text (it may not be empty,
    /// nor hold a line break, a tab or another control character).
    #[arg(long, default_value = DEFAULT_CANCEL_REASON, value_name = "TEXT")]
    pub reason: String,

    /// Print the run (as `loops runs --json` prints one) instead of text.
    #[arg(long)]
    pub json: bool,
}

const RETRY_EXAMPLES: &str = "\
Examples:
  loops retry deliver-1

The run becomes running again in the state it failed in; the process that drives its
workflow picks it up when it next starts (Runtime::resume_all) or drives it.

The retry policy's budget of attempts starts afresh, but attempt numbers count on, so that
each failed attempt in `loops history` keeps its own: a run that failed at attempt 3 shows
attempt 3 until its next attempt, number 4 (ctx.attempt() in the handler), starts.";

/// `loops retry`.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The run id of a failed run.
    #[arg(value_name = "RUN", value_parser = clap::value_parser!(OsString))]
    pub run: OsString,

    /// Print the run (as `loops runs --json` prints one) instead of text.
    #[arg(long)]
    pub json: bool,
}

const SEND_EXAMPLES: &str = "\
Examples:
  loops send deliver-1 approve --json '{\"by\":\"alice\"}'
  loops send deliver-1 approve --json '{\"by\":\"alice\"}' --key approve-1
  loops send deliver-1 approve --json-file approval.json
  jq -n '{by: \"alice\"}' | loops send deliver-1 approve --json-file -

--json-file reads the payload from a file (or from stdin, with -): for payloads longer
than a command-line argument may be. Payloads are limited to 2 MiB (the runtime's default);
no more than 64 MiB of a file or of stdin is read (more is refused at once).
The event is kept in the run's inbox and delivered to the run's wait for it when the
run is next driven; it may be sent before the run waits for it. If the run is not waiting
for this event now, a note on stderr says so (the event is still sent). A run that has
ended (completed, failed or cancelled) takes no event. With --key, sending the same key
again writes nothing: the same event again is a success (exit 0), another payload or name
under that key is refused (exit 1; send it with another key). When the run's workflow
declares its events (#[event(name: Type)]), a name it does not declare, or a payload that
does not match the declared shape, is refused with exit code 2 and a line listing the
declared events; nothing is written.
Exit codes: 0 sent (or sent already with that key), 1 the run has ended, the key names
another event, or the store failed, 2 a bad argument or a refused event. (Here --json is
the payload; --output json prints the receipt as JSON.)";

/// `loops send`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("payload_from").required(true).args(["payload", "json_file"])))]
pub struct SendArgs {
    /// The run id.
    #[arg(value_name = "RUN", value_parser = clap::value_parser!(OsString))]
    pub run: OsString,

    /// The event's name (what the run's handler waits for).
    #[arg(value_name = "EVENT", value_parser = clap::value_parser!(OsString))]
    pub event: OsString,

    /// The event's payload, as JSON text.
    #[arg(long = "json", value_name = "PAYLOAD", allow_hyphen_values = true)]
    pub payload: Option<String>,

    /// Read the payload (JSON text) from this file instead; `-` reads stdin.
    #[arg(long, value_name = "PATH")]
    pub json_file: Option<PathBuf>,

    /// An idempotency key: a second send with the same key writes nothing.
    #[arg(long, value_name = "KEY", value_parser = clap::value_parser!(OsString))]
    pub key: Option<OsString>,

    /// How to print the receipt.
    #[arg(long, value_enum, default_value_t = OutputArg::Text, value_name = "FORMAT")]
    pub output: OutputArg,
}

/// `--output` of `send`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputArg {
    /// One line for a person.
    Text,
    /// A JSON object: {run_id, event, event_seq, duplicate, run}.
    Json,
}

const PRUNE_EXAMPLES: &str = "\
Examples:
  loops prune --older-than 30d --dry-run
  loops prune --older-than 30d --keep-failed
  loops prune --keep-last 1000
  loops prune --older-than 90d && loops compact
  loops prune --older-than 30d --keep-last 1000   # at most 1000 runs, none over 30 days

Only ended runs (completed, failed, cancelled) are removed, with their transitions, steps,
failures and events; running and waiting runs are never touched. Age counts from when the
run ended. With both rules, a run is removed if either selects it: --keep-last caps how
many are kept, it does not keep runs that --older-than removes. A child run counts with
its parent: the two are kept or removed together (--keep-last counts top-level runs, and
a family's age is its last run's), a child whose parent has not ended is kept, and so is
a parent with a child that has not ended or that --keep-failed keeps. The file shrinks by
the free pages at its end, if any; `loops compact` returns the free pages left inside it.";

/// `loops prune`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("policy").required(true).multiple(true).args(["older_than", "keep_last"])))]
pub struct PruneArgs {
    /// Remove ended runs that ended longer ago than this (e.g. 30d, 12h).
    #[arg(long, value_parser = parse_age, value_name = "AGE")]
    pub older_than: Option<Duration>,

    /// Keep at most this many ended top-level runs (the most recently ended), each with
    /// its child runs; with --older-than, the runs it removes are removed too.
    #[arg(long, value_name = "N")]
    pub keep_last: Option<usize>,

    /// Keep failed runs, whatever their age (they can still be retried).
    #[arg(long)]
    pub keep_failed: bool,

    /// Only say what would be removed.
    #[arg(long)]
    pub dry_run: bool,

    /// Print JSON: {dry_run, runs, records, run_ids, kept_for_parents, kept_for_children,
    /// changed_since_selection, bytes_before, bytes_after}.
    #[arg(long)]
    pub json: bool,
}

const COMPACT_EXAMPLES: &str = "\
Examples:
  loops compact
  loops compact --json    # {bytes_before, bytes_after, bytes_reclaimed}";

const SCHEMA_EXAMPLES: &str = "\
Examples:
  loops schema                                   # every stored schema, its runs by status
  loops schema deliver-1                        # the schema a run was recorded with
  loops schema --hash 3f9c0a1e                  # one stored schema's description
  loops schema --diff 3f9c0a1e22b4d5e6 8a7b6c5d4e3f2a1b
  loops runs --schema 3f9c0a1e                  # the runs of one schema

The list has one line per stored schema: its hash, workflow and version, its number of
runs and how many are in each status. --json prints an array of {hash, workflow, version,
description, runs, by_status, workflows}. Hashes may be shortened to a unique prefix of at
least 4 hex digits.";

/// `loops schema`.
#[derive(Debug, Args)]
pub struct SchemaArgs {
    /// Show this run's schema (omit to list every stored schema).
    #[arg(value_name = "RUN", value_parser = clap::value_parser!(OsString), conflicts_with_all = ["diff", "hash"])]
    pub run: Option<OsString>,

    /// Show the description of the stored schema with this hash (or unique prefix).
    #[arg(long, value_name = "HASH", conflicts_with = "diff")]
    pub hash: Option<String>,

    /// Say what changed from the first stored schema to the second, and whether each change
    /// is compatible with the runs recorded under the first.
    #[arg(long, num_args = 2, value_names = ["HASH_A", "HASH_B"])]
    pub diff: Option<Vec<String>>,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

const GRAPH_EXAMPLES: &str = "\
Examples:
  loops graph deliver                           # Mermaid (paste it in a ```mermaid block)
  loops graph deliver --format dot | dot -Tpng -o deliver.png
  loops graph deliver --svg deliver.svg         # an SVG picture, without Graphviz
  loops graph deliver --schema 3f9c0a1e         # a workflow with several stored schemas
  loops graph --run deliver-1                   # the path one run took, its current state
  loops graph --run deliver-1 --svg -           # the SVG on stdout

The graph comes from the stored schema description, so it needs no workflow code: a start
point leads to the initial state, every allowed transition is an edge, and each terminal
state leads to an end point. By default the workflow's newest stored schema is drawn: that
of its most recently created run (a note on stderr says so when it has several).

With --run, the graph is that of the run's schema, and shows the run's path from its
history: the states it went through, the transitions it took labelled with how many times
(a loop such as Tested -> Edited -> Tested counts every round), and its current state in
the colour of its status. A move the description does not list is drawn dashed.

--svg writes the picture to a file (`-` for stdout) instead of printing Mermaid or DOT;
give --format as well to have both.";

/// `--format` of `graph`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// A Mermaid state diagram (stateDiagram-v2).
    Mermaid,
    /// Graphviz's DOT language.
    Dot,
}

/// `loops graph`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("what").required(true).multiple(true).args(["workflow", "schema", "run"])))]
pub struct GraphArgs {
    /// The workflow to draw (its name, as `loops runs` shows it).
    #[arg(value_name = "WORKFLOW")]
    pub workflow: Option<String>,

    /// Draw this stored schema (its hash, or a unique prefix of at least 4 hex digits)
    /// instead of the workflow's newest.
    #[arg(long, value_name = "HASH", conflicts_with = "run")]
    pub schema: Option<String>,

    /// Show this run's path: the states it went through, the transitions it took and how
    /// many times, its current state.
    #[arg(long, value_name = "RUN", value_parser = clap::value_parser!(OsString))]
    pub run: Option<OsString>,

    /// The text format on stdout [default: mermaid, unless --svg is given].
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<GraphFormat>,

    /// Write an SVG picture to this file (`-`: to stdout).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

const UI_EXAMPLES: &str = "\
Examples:
  loops ui                                   # http://127.0.0.1:7878/
  loops ui --listen 127.0.0.1:0              # a free port (the address is printed)
  loops --store postgres://loops@db/loops ui

Serves until Ctrl-C. Every page reads the store as `loops runs`/`history`/`graph` do, and
its buttons make the writes `loops send`/`cancel`/`retry` make (through the process that
holds a store file, when one serves its control endpoint). Pages refresh while runs
progress. Writes need the page's per-process token and a same-origin request; anyone who
can reach the address can read the runs' payloads, so it listens on loopback unless told
otherwise (docs/operations.md).";

/// `loops ui`.
#[derive(Debug, Args)]
pub struct UiArgs {
    /// The address to listen on (port 0: a free port, printed at start). Anyone who can
    /// reach it can read every run's data and steer runs: keep it on loopback unless the
    /// network is yours.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7878")]
    pub listen: std::net::SocketAddr,
}

const CHECK_EXAMPLES: &str = "\
Examples:
  loops check
  loops check --json    # {path, intact, repaired_on_open, runs, by_status}
  loops check --key-file keys   # also: does the key file hold the store's keys?

Exits 1 if the file is damaged beyond repair; 2 if --key-file holds another key under an id
the store lists, or none of the store's keys (a worker with those keys is refused the same
way). Opens the file for writing: redb repairs
what it can (a file left by a crash, damaged allocator state) and may give free pages at
the end of the file back (the file can get smaller; its runs and records are unchanged).
To keep a suspect file exactly as it is, copy it first and check the copy.";

/// Parses an age such as `30d`, `12h`, `1h 30m` (humantime's syntax); the error says what is
/// wrong in the user's words (humantime's own, such as `expected number at 0`, name a byte
/// offset) and which forms are accepted.
pub fn parse_age(s: &str) -> Result<Duration, String> {
    use humantime::DurationError as E;
    const FORMS: &str = "give a number and a unit, such as 30d, 12h, 90m or 1h 30m \
                         (units: s, m, h, d, w; M for months, y for years)";
    humantime::parse_duration(s).map_err(|e| match e {
        E::UnknownUnit { unit, value, .. } if unit.is_empty() => {
            format!("{value} has no unit: {FORMS}")
        }
        E::UnknownUnit { unit, .. } => format!("unknown unit `{unit}`: {FORMS}"),
        E::NumberOverflow => format!("too long an age: {FORMS}"),
        E::Empty | E::InvalidCharacter(_) | E::NumberExpected(_) => format!("not an age: {FORMS}"),
    })
}

/// The parser of `--store` and `--key-file`: a path, not an empty one (clap's own says of
/// `--store ""` that no value was supplied). It takes paths that are not UTF-8, which the
/// commands refuse in words of their own.
fn non_empty_path() -> impl clap::builder::TypedValueParser<Value = PathBuf> {
    use clap::builder::TypedValueParser as _;
    clap::builder::OsStringValueParser::new().try_map(|path| match path.is_empty() {
        true => Err("empty: name a path (or leave the flag out)"),
        false => Ok(PathBuf::from(path)),
    })
}
