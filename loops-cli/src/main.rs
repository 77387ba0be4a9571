//! `loops`: the command-line tool of loops. Lists, inspects, steers and cleans up the runs in
//! a store file, without the workflows' Rust types (records are JSON, with stored schema
//! descriptions).
//!
//! See `loops --help` and the crate's README for the commands and their JSON output.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod attrs;
mod cli;
mod commands;
mod description;
mod failure;
mod graph;
mod json;
mod open;
mod operator;
mod output;
mod panics;
mod ui;
mod usage;
mod view;

use std::io::Write as _;
use std::process::ExitCode;

use clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand;

use crate::cli::{Cli, ColorArg, Command};
use crate::failure::Failure;
use crate::output::{ERROR, paint};

fn main() -> ExitCode {
    panics::install();
    // Installed after ours, so that a redb panic loops catches (and reports as an error)
    // never reaches ours: on the store's writer thread, ours would end the process.
    loops_core::silence_caught_redb_panics();
    let cli = match usage::parse() {
        Ok(cli) => cli,
        // `--help`, `--version` (stdout, exit 0), and the help that `loops` alone prints.
        Err(e) if !e.use_stderr() || e.kind() == DisplayHelpOnMissingArgumentOrSubcommand => {
            e.exit()
        }
        Err(e) => {
            let message = usage::one_line(
                &e.render().to_string(),
                &usage::command_path(std::env::args_os()),
            );
            report(&message);
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    match cli.color {
        ColorArg::Auto => {}
        ColorArg::Always => anstream::ColorChoice::Always.write_global(),
        ColorArg::Never => anstream::ColorChoice::Never.write_global(),
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli)))
        .unwrap_or_else(|_| Err(panics::failure()));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            report(&failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// Writes the failure's one line to stderr: `error: message`.
fn report(message: &str) {
    let style = ERROR.effects(anstyle::Effects::BOLD);
    let _ = writeln!(
        anstream::stderr().lock(),
        "{}: {}",
        paint(style, "error"),
        crate::output::shown(message)
    );
}

fn run(cli: Cli) -> Result<(), Failure> {
    // The file to convert is the command's own argument: it cannot be opened as a store.
    if let Command::Upgrade(args) = &cli.command {
        return commands::upgrade::run(args, &cli);
    }
    let target = open::target(cli.store.clone(), cli.pg_schema.clone())?;
    if let Some(path) = target.file() {
        panics::set_store(path);
    }
    open::set_verify(!cli.no_verify);
    open::set_verbose(cli.verbose);
    open::set_key_file(cli.key_file.as_deref())?;
    let checking = matches!(cli.command, Command::Check(_));
    let dispatch = || match &cli.command {
        Command::Runs(args) => commands::runs::run(&target, args),
        Command::Show(args) => commands::show::run(&target, args),
        Command::History(args) => commands::history::run(&target, args),
        Command::Cancel(args) => commands::steer::cancel(&target, args),
        Command::Retry(args) => commands::steer::retry(&target, args),
        Command::Send(args) => commands::steer::send(&target, args),
        Command::Prune(args) => commands::prune::prune(&target, args),
        Command::Compact(args) => commands::prune::compact(&target, args),
        Command::Schema(args) => commands::schema::run(&target, args),
        Command::Check(args) => commands::check::run(&target, args),
        Command::Graph(args) => commands::graph::run(&target, args),
        Command::Tree(args) => commands::tree::run(&target, args),
        Command::Ui(args) => ui::serve(&target, args),
        Command::Schedules(args) => commands::schedules::run(&target, args),
        Command::Upgrade(args) => commands::upgrade::run(args, &cli),
    };
    let mut done = dispatch();
    // A process took the store between the command's read-only open and its writable one,
    // before anything was written (`Failure::again`): once more, through that process.
    if done.as_ref().is_err_and(|failure| failure.again) {
        // Opening for writing at once this time: that open waits for the process and finds
        // its endpoint; a read-only open first could meet the process's own read-only phase
        // again.
        open::write_directly();
        done = dispatch();
    }
    match target.file() {
        Some(path) => done.map_err(|failure| failure.in_store(path, checking)),
        None => done,
    }
}
