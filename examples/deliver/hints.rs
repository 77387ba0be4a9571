//! What the example prints for a person to type next: the commands that approve a run
//! parked at the approval gate, written so that a POSIX shell reads them back as printed.

use std::path::Path;

use crate::workflow::APPROVAL_EVENT;
use crate::{Cli, DEFAULT_RUN_ID, DEFAULT_WORKDIR};

/// What to type to approve a run parked at the gate: this command again with the flags that
/// name the run (and `--approve`), or the `loops` CLI's `send`.
pub fn approval_hint(cli: &Cli, store: &Path) -> String {
    let (again, key) = this_command_again(cli);
    format!(
        "waiting for approval: the run is parked (it holds no task) until an approval arrives. \
         Approve and go on with:\n  {again} --approve\nor, while no deliver runs:\n  \
         cargo run -p loops-cli -- --store {}{key} send {} {APPROVAL_EVENT} --json {}",
        shell_word(&store.to_string_lossy()),
        shell_word(&cli.run_id),
        shell_word(r#"{"by":"you"}"#),
    )
}

/// What to type to approve a run parked at the gate while this process serves: this command
/// again with `--approve`, or the `loops` CLI's `send`; both reach this process through its
/// control endpoint.
pub fn serving_hint(cli: &Cli, store: &Path) -> String {
    let (again, key) = this_command_again(cli);
    format!(
        "waiting for approval, and serving: this process goes on once an approval arrives. \
         Approve with:\n  {again} --approve\nor:\n  cargo run -p loops-cli -- --store {}{key} \
         send {} {APPROVAL_EVENT} --json {}",
        shell_word(&store.to_string_lossy()),
        shell_word(&cli.run_id),
        shell_word(r#"{"by":"you"}"#),
    )
}

/// This command as a person types it again for the same run: `cargo run -p deliver --` with
/// the flags that name the run's work directory, store, repository, run id and key file;
/// and the ` --key-file K` part alone (empty without one), for the `loops` command.
pub fn this_command_again(cli: &Cli) -> (String, String) {
    let mut again = "cargo run -p deliver --".to_owned();
    let path = |p: &Path| shell_word(&p.to_string_lossy());
    if cli.workdir != Path::new(DEFAULT_WORKDIR) {
        again.push_str(&format!(" --workdir {}", path(&cli.workdir)));
    }
    if let Some(store) = &cli.store {
        again.push_str(&format!(" --store {}", path(store)));
    }
    if let Some(repo) = &cli.repo {
        again.push_str(&format!(" --repo {}", path(repo)));
    }
    if cli.run_id != DEFAULT_RUN_ID {
        again.push_str(&format!(" --run-id {}", shell_word(&cli.run_id)));
    }
    // An encrypted store is read (and an approval sealed) with the same key file.
    let key = cli
        .key_file
        .as_deref()
        .map(|k| format!(" --key-file {}", path(k)))
        .unwrap_or_default();
    again.push_str(&key);
    (again, key)
}

/// `word` as a POSIX shell reads it back: as it is if it is made of characters no shell
/// treats specially, else in single quotes.
pub fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
