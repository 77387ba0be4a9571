//! Git as a subprocess, with a fixed identity and fixed dates.
//!
//! Every command gets the same author, committer and dates and ignores the user's global and
//! system configuration, so that the same change on the same parent always yields the same
//! commit id: on any machine (even one where git has no user configured), and whether a run
//! was interrupted or not.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use tokio::process::Command;

use crate::workflow::{Change, Commit};

/// The name commits are authored and committed under.
pub const AGENT_NAME: &str = "loops agent";
/// The e-mail address commits are authored and committed under.
pub const AGENT_EMAIL: &str = "agent@loops.invalid";
/// The date of every commit (git's raw format: seconds since the epoch and a zone),
/// 2025-01-01T00:00:00Z.
pub const COMMIT_DATE: &str = "1735689600 +0000";
/// The trailer that ties a commit to the journaled step that made it.
pub const KEY_TRAILER: &str = "Loops-Idempotency-Key";

/// How often a command that found a git lock file taken is tried again, and how long apart.
const LOCK_RETRIES: u32 = 100;
const LOCK_PAUSE: Duration = Duration::from_millis(50);

/// Checks that git can be run and returns its version line.
///
/// # Errors
/// A message saying that git is needed, if it cannot be started.
pub async fn check_installed() -> Result<String> {
    let output = Command::new("git")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "this example needs git, and `git --version` could not run ({e}); install git \
                 (https://git-scm.com/downloads) and make sure it is on PATH"
            )
        })?;
    ensure!(
        output.status.success(),
        "`git --version` failed: {}",
        one_line(&String::from_utf8_lossy(&output.stderr))
    );
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// A git repository (a work tree or a bare repository) that commands run in.
#[derive(Debug, Clone)]
pub struct Git {
    dir: PathBuf,
}

impl Git {
    /// Commands will run in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Git { dir: dir.into() }
    }

    /// The directory commands run in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `git args...` and returns its standard output without the trailing newline.
    ///
    /// # Errors
    /// If git cannot start or exits with a failure: the command and git's own message.
    pub async fn run(&self, args: &[&str]) -> Result<String> {
        let output = self.output(args).await?;
        if !output.status.success() {
            bail!(
                "`git {}` in {} failed: {}",
                args.join(" "),
                self.dir.display(),
                one_line(&String::from_utf8_lossy(&output.stderr))
            );
        }
        let mut out = String::from_utf8(output.stdout)
            .with_context(|| format!("`git {}` printed invalid UTF-8", args.join(" ")))?;
        out.truncate(out.trim_end().len());
        Ok(out)
    }

    /// Runs `git args...` and returns its output whatever its exit status.
    ///
    /// A command that fails because a git lock file is taken is tried again for a few
    /// seconds: when this program is killed while git runs, git itself goes on (it is not
    /// killed with its parent) and holds `index.lock` until it finishes, possibly while the
    /// next run of this program starts.
    pub async fn output(&self, args: &[&str]) -> Result<Output> {
        let mut tries = 0;
        loop {
            tracing::debug!(dir = %self.dir.display(), "git {}", args.join(" "));
            let output = command(&self.dir)
                .args(args)
                .output()
                .await
                .with_context(|| format!("cannot run `git {}`", args.join(" ")))?;
            let stderr = String::from_utf8_lossy(&output.stderr);
            if output.status.success() || !is_lock_error(&stderr) || tries == LOCK_RETRIES {
                return Ok(output);
            }
            tries += 1;
            tracing::info!(tries, error = %stderr.trim(), "git lock taken, trying again");
            tokio::time::sleep(LOCK_PAUSE).await;
        }
    }

    /// The commit id `rev` names.
    ///
    /// # Errors
    /// If `rev` names no commit.
    pub async fn rev_parse(&self, rev: &str) -> Result<String> {
        self.run(&[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ])
        .await
        .with_context(|| format!("no commit `{rev}` in {}", self.dir.display()))
    }

    /// The commit `reference` points at, or `None` if there is no such reference.
    ///
    /// # Errors
    /// If git fails otherwise.
    pub async fn resolve(&self, reference: &str) -> Result<Option<String>> {
        let output = self
            .output(&["rev-parse", "--verify", "--quiet", reference])
            .await?;
        if output.status.success() {
            Ok(Some(
                String::from_utf8_lossy(&output.stdout).trim().to_owned(),
            ))
        } else {
            Ok(None)
        }
    }

    /// The Rust sources (`*.rs`) at `commit`, read from git's object store (not from the work
    /// tree, which an interrupted attempt may have left half-edited).
    ///
    /// # Errors
    /// If git fails or a file is not UTF-8.
    pub async fn sources(&self, commit: &str) -> Result<Vec<SourceFile>> {
        let listing = self.run(&["ls-tree", "-r", "--name-only", commit]).await?;
        let mut files = Vec::new();
        for path in listing.lines().filter(|p| p.ends_with(".rs")) {
            let text = self.run(&["show", &format!("{commit}:{path}")]).await?;
            files.push(SourceFile {
                path: path.to_owned(),
                text: format!("{text}\n"),
            });
        }
        Ok(files)
    }

    /// The commit whose message carries `key` in its idempotency-key trailer, if any branch
    /// or tag reaches one.
    ///
    /// # Errors
    /// If git fails.
    pub async fn find_commit_with_key(&self, key: &str) -> Result<Option<String>> {
        let grep = format!("--grep=^{KEY_TRAILER}: {key}$");
        let found = self.run(&["log", "--all", "--format=%H", &grep]).await?;
        Ok(found.lines().next().map(str::to_owned))
    }

    /// Moves `branch` to `commit` and checks it out, discarding changes in the work tree.
    ///
    /// # Errors
    /// If git fails.
    pub async fn checkout(&self, branch: &str, commit: &str) -> Result<()> {
        self.run(&["checkout", "--quiet", "--force", "-B", branch, commit])
            .await?;
        Ok(())
    }

    /// Checks out `commit` without moving any branch, discarding changes in the work tree.
    ///
    /// # Errors
    /// If git fails.
    pub async fn checkout_detached(&self, commit: &str) -> Result<()> {
        self.run(&["checkout", "--quiet", "--force", "--detach", commit])
            .await?;
        Ok(())
    }

    /// Commits `change` on `branch` on top of `parent`, exactly once per `key`.
    ///
    /// If a commit carrying `key` exists already (an earlier attempt committed, then the
    /// process stopped before the step's record), that commit is returned and nothing is
    /// committed. Otherwise the branch is reset to `parent` (dropping whatever an interrupted
    /// attempt left in the work tree), the edits are applied and committed with `key` as a
    /// trailer.
    ///
    /// # Errors
    /// If an edit does not apply or git fails.
    pub async fn commit_change(
        &self,
        branch: &str,
        parent: &str,
        change: &Change,
        body: &str,
        key: &str,
    ) -> Result<Committed> {
        if let Some(id) = self.find_commit_with_key(key).await? {
            tracing::info!(commit = %id, key, "commit found by its idempotency key");
            return Ok(Committed {
                commit: Commit {
                    id,
                    subject: change.summary.clone(),
                },
                created: false,
            });
        }
        self.checkout(branch, parent).await?;
        apply_edits(&self.dir, change).await?;
        let mut add = vec!["add", "--"];
        add.extend(change.edits.iter().map(|e| e.path.as_str()));
        self.run(&add).await?;
        let trailer = format!("{KEY_TRAILER}: {key}");
        self.run(&[
            "commit",
            "--quiet",
            "--no-verify",
            "-m",
            &change.summary,
            "-m",
            body,
            "-m",
            &trailer,
        ])
        .await?;
        let id = self.rev_parse("HEAD").await?;
        tracing::info!(commit = %id, branch, key, "committed");
        Ok(Committed {
            commit: Commit {
                id,
                subject: change.summary.clone(),
            },
            created: true,
        })
    }

    /// Pushes `commit` to `branch` of the repository at `remote`. Pushing the same commit
    /// again changes nothing, so a repeated push is harmless.
    ///
    /// # Errors
    /// If git refuses (the remote branch points elsewhere and is not an ancestor).
    pub async fn push(&self, remote: &Path, commit: &str, branch: &str) -> Result<()> {
        let remote = remote.to_string_lossy();
        self.run(&[
            "push",
            "--quiet",
            &remote,
            &format!("{commit}:refs/heads/{branch}"),
        ])
        .await?;
        Ok(())
    }
}

/// What [`Git::commit_change`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Committed {
    /// The commit.
    pub commit: Commit,
    /// Whether it was made now (`false`: it was found by its idempotency key).
    pub created: bool,
}

/// A source file and its text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceFile {
    /// The path, relative to the repository root.
    pub path: String,
    /// The file's text.
    pub text: String,
}

/// A `git` command in `dir` with a fixed identity and dates, no user or system configuration
/// (so no signing, hooks path or templates), no background maintenance, C messages, and no
/// prompts.
fn command(dir: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .env("GIT_AUTHOR_NAME", AGENT_NAME)
        .env("GIT_AUTHOR_EMAIL", AGENT_EMAIL)
        .env("GIT_AUTHOR_DATE", COMMIT_DATE)
        .env("GIT_COMMITTER_NAME", AGENT_NAME)
        .env("GIT_COMMITTER_EMAIL", AGENT_EMAIL)
        .env("GIT_COMMITTER_DATE", COMMIT_DATE)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", null_device())
        // No automatic maintenance: git would start it detached, in the background, where it
        // could still be writing in the repository after this program ended (or while
        // `--fresh` deletes it). The demo's repositories are far too small to need any.
        .env("GIT_CONFIG_COUNT", "2")
        .env("GIT_CONFIG_KEY_0", "maintenance.auto")
        .env("GIT_CONFIG_VALUE_0", "false")
        .env("GIT_CONFIG_KEY_1", "gc.auto")
        .env("GIT_CONFIG_VALUE_1", "0")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    // Not `kill_on_drop`: when a step is dropped (Ctrl-C, a time-out), git finishes its
    // command, as it does when this program is killed. Killed with SIGKILL, it would leave
    // its lock file (`HEAD.lock`, `index.lock`) behind for good, and every later command
    // in the repository would fail.
    own_process_group(&mut cmd);
    cmd
}

/// Starts `cmd` in a process group of its own, so that Ctrl-C in a terminal (SIGINT to the
/// whole foreground group) reaches this program only: it stops driving and drops the step
/// (a git command finishes, rustc and the tests are killed). Were the child interrupted
/// too, its failure could be recorded as the step's outcome (a compile error, a failed git
/// command) before this program saw the Ctrl-C.
pub fn own_process_group(cmd: &mut Command) {
    #[cfg(unix)]
    cmd.process_group(0);
    #[cfg(not(unix))]
    let _ = cmd;
}

fn null_device() -> &'static str {
    if cfg!(windows) { "NUL" } else { "/dev/null" }
}

fn is_lock_error(stderr: &str) -> bool {
    stderr.contains(".lock': File exists")
        || stderr.contains("Unable to create '")
        || stderr.contains("cannot lock ref")
}

/// `text` (a program's message) on one line: its lines trimmed, the empty ones dropped, the
/// others joined by a space after a full stop or a colon, by `; ` otherwise. An error is one
/// line, also when it quotes git.
pub fn one_line(text: &str) -> String {
    let mut joined = String::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !joined.is_empty() {
            joined.push_str(if joined.ends_with(['.', ':', ';']) {
                " "
            } else {
                "; "
            });
        }
        joined.push_str(line);
    }
    joined
}

/// Applies `change`'s edits to the files under `root`.
///
/// # Errors
/// If a path leaves the repository, a file cannot be read or written, or an edit's `find`
/// text does not occur exactly once.
pub async fn apply_edits(root: &Path, change: &Change) -> Result<()> {
    for edit in &change.edits {
        let relative = Path::new(&edit.path);
        ensure!(
            relative
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_))),
            "edit path {:?} is not a plain relative path inside the repository",
            edit.path
        );
        let path = root.join(relative);
        let text = tokio::fs::read_to_string(&path)
            .await
            .with_context(|| format!("cannot read {}", path.display()))?;
        let found = text.matches(edit.find.as_str()).count();
        ensure!(
            found == 1,
            "edit of {}: the text to replace occurs {found} times, expected once: {:?}",
            edit.path,
            edit.find
        );
        let text = text.replacen(&edit.find, &edit.replace, 1);
        tokio::fs::write(&path, text)
            .await
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::Edit;

    async fn repo_with_file(dir: &Path) -> Git {
        let git = Git::new(dir);
        git.run(&["init", "--quiet"]).await.unwrap();
        git.run(&["symbolic-ref", "HEAD", "refs/heads/main"])
            .await
            .unwrap();
        std::fs::write(dir.join("a.txt"), "one\ntwo\n").unwrap();
        git.run(&["add", "a.txt"]).await.unwrap();
        git.run(&["commit", "--quiet", "-m", "first"])
            .await
            .unwrap();
        git
    }

    fn change(find: &str, replace: &str) -> Change {
        Change {
            summary: "Edit a.txt".into(),
            edits: vec![Edit {
                path: "a.txt".into(),
                find: find.into(),
                replace: replace.into(),
            }],
        }
    }

    #[tokio::test]
    async fn commits_are_deterministic_and_found_by_key() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (git_a, git_b) = (
            repo_with_file(a.path()).await,
            repo_with_file(b.path()).await,
        );
        let base = git_a.rev_parse("HEAD").await.unwrap();
        assert_eq!(base, git_b.rev_parse("HEAD").await.unwrap());

        let c = change("two", "three");
        let first = git_a
            .commit_change("work", &base, &c, "body", "lk-1")
            .await
            .unwrap();
        assert!(first.created);
        let other = git_b
            .commit_change("work", &base, &c, "body", "lk-1")
            .await
            .unwrap();
        assert_eq!(
            first.commit.id, other.commit.id,
            "same input, same commit id"
        );

        // Re-executing the step finds the commit instead of committing again, also after
        // testing an older commit (which checks it out detached, moving no branch).
        git_a.checkout_detached(&base).await.unwrap();
        let again = git_a
            .commit_change("work", &base, &c, "body", "lk-1")
            .await
            .unwrap();
        assert!(!again.created);
        assert_eq!(again.commit.id, first.commit.id);
        let count = git_a.run(&["rev-list", "--count", "work"]).await.unwrap();
        assert_eq!(count, "2");
    }

    #[tokio::test]
    async fn a_half_applied_attempt_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let git = repo_with_file(dir.path()).await;
        let base = git.rev_parse("HEAD").await.unwrap();
        // An interrupted attempt edited the file but did not commit.
        std::fs::write(dir.path().join("a.txt"), "one\nthree\n").unwrap();
        let done = git
            .commit_change("work", &base, &change("two", "three"), "b", "lk-2")
            .await
            .unwrap();
        assert!(done.created);
        let text = git.run(&["show", "work:a.txt"]).await.unwrap();
        assert_eq!(text, "one\nthree");
    }

    #[test]
    fn messages_are_put_on_one_line() {
        assert_eq!(
            one_line(
                "fatal: invalid gitfile format: x\nfatal: Could not read from remote.\n\n\
                 Please make sure\n  and the repository exists.\n"
            ),
            "fatal: invalid gitfile format: x; fatal: Could not read from remote. Please make \
             sure; and the repository exists."
        );
        assert_eq!(one_line(" one \n"), "one");
        assert_eq!(one_line(""), "");
    }

    #[tokio::test]
    async fn edits_must_match_once_and_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "x x\n").unwrap();
        let err = apply_edits(dir.path(), &change("x", "y"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("occurs 2 times"), "{err}");
        let mut escape = change("x", "y");
        escape.edits[0].path = "../a.txt".into();
        let err = apply_edits(dir.path(), &escape).await.unwrap_err();
        assert!(err.to_string().contains("plain relative path"), "{err}");
    }
}
