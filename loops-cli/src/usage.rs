//! clap's usage errors in one line, as every failure of `loops` is (docs/operations.md, "Exit
//! codes and failures"): clap renders them over several lines (the error, the accepted
//! values, a tip, the usage, a pointer to `--help`).

use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

use crate::cli::Cli;

/// Parses the process's arguments as `Cli::try_parse` does, noting whether `--store` was
/// given on the command line (rather than by LOOPS_STORE).
///
/// # Errors
/// clap's error, as `Cli::try_parse` returns it (help and version are errors too).
pub fn parse() -> Result<Cli, clap::Error> {
    let mut command = Cli::command();
    // A variable set but empty (`LOOPS_KEY_FILE=`, as a shell unsets one for a command) is
    // taken as not set, as the shell's own variables are, rather than as an empty value.
    for (arg, var) in [("store", "LOOPS_STORE"), ("key_file", "LOOPS_KEY_FILE")] {
        if std::env::var_os(var).is_some_and(|value| value.is_empty()) {
            command = command.mut_arg(arg, |a| a.env(None::<&str>));
        }
    }
    let matches = command.try_get_matches_from_mut(std::env::args_os())?;
    let mut cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))?;
    cli.store_on_command_line = matches.value_source("store") == Some(ValueSource::CommandLine);
    Ok(cli)
}

/// The words of the (sub)command that `args` (the process's arguments, the program first)
/// name: `loops`, `loops runs`, `loops schedules pause`. Each argument that names a
/// subcommand of the command reached so far goes one level down.
pub fn command_path(args: impl IntoIterator<Item = OsString>) -> String {
    let mut command = Cli::command();
    let mut path = vec![command.get_name().to_owned()];
    for arg in args.into_iter().skip(1) {
        let Some(arg) = arg.to_str() else {
            continue;
        };
        let Some(sub) = command.find_subcommand(arg).cloned() else {
            continue;
        };
        path.push(sub.get_name().to_owned());
        command = sub;
    }
    path.join(" ")
}

/// The message of clap's `rendered` error (its plain text) in one line, without the leading
/// `error: `, ending with where to look: `try 'COMMAND --help'`.
///
/// The lines under the first are joined to it (a list after a colon separated by commas),
/// clap's tips put in parentheses, and the usage and its pointer to `--help` left out.
pub fn one_line(rendered: &str, command: &str) -> String {
    let mut lines = rendered.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("invalid arguments");
    let mut message = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    let (mut items, mut tips) = (Vec::new(), Vec::new());
    for line in lines {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        match line.strip_prefix("tip: ") {
            Some(tip) => tips.push(tip),
            None => items.push(line),
        }
    }
    if !items.is_empty() {
        let separator = if message.ends_with(':') { ", " } else { " " };
        message.push(' ');
        message.push_str(&items.join(separator));
    }
    if !tips.is_empty() {
        message.push_str(&format!(" ({})", tips.join("; ")));
    }
    format!("{message}; try '{command} --help'")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_of_a_clap_error_joins_the_line() {
        let rendered = "error: invalid value 'runing' for '--status <STATUS>'\n  [possible values: running, waiting]\n\n  tip: a similar value exists: 'running'\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line(rendered, "loops runs"),
            "invalid value 'runing' for '--status <STATUS>' [possible values: running, waiting] (a similar value exists: 'running'); try 'loops runs --help'"
        );
        let rendered = "error: the following required arguments were not provided:\n  <A>\n  <B>\n\nUsage: loops x <A> <B>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line(rendered, "loops x"),
            "the following required arguments were not provided: <A>, <B>; try 'loops x --help'"
        );
    }

    #[test]
    fn the_command_path_follows_subcommands() {
        let path = |args: &[&str]| command_path(args.iter().map(OsString::from));
        assert_eq!(path(&["loops"]), "loops");
        assert_eq!(
            path(&["loops", "--store", "x", "runs", "--bad"]),
            "loops runs"
        );
        assert_eq!(
            path(&["loops", "schedules", "pause", "--json"]),
            "loops schedules pause"
        );
        assert_eq!(path(&["loops", "frobnicate"]), "loops");
    }
}
