//! Git as a subprocess, with a fixed identity and fixed dates.
//!
//! Every command gets the same author, committer and dates and ignores the user's global and
//! system configuration, so that the same change on the same parent always yields the same
//! commit id: on any machine (even one where git has no user configured), and whether a run
//! was interrupted or not.
//!
//! The agent never changes a checkout: not its work tree, not its index, not its HEAD. It
//! commits through git's object database (blobs, a tree built in a temporary index, a commit,
//! then one ref update of its own branch) and reads commits back the same way, so a
//! repository given with `--repo` can be worked in, or have uncommitted changes, while it
//! runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use tokio::process::Command;

use crate::child::own_process_group;
use crate::workflow::{Change, Commit, Edit};

mod locks;

/// The name commits are authored and committed under.
pub const AGENT_NAME: &str = "loops agent";
/// The e-mail address commits are authored and committed under.
pub const AGENT_EMAIL: &str = "agent@loops.invalid";
/// The date of every commit (git's raw format: seconds since the epoch and a zone),
/// 2025-01-01T00:00:00Z.
pub const COMMIT_DATE: &str = "1735689600 +0000";
/// The trailer that ties a commit to the journaled step that made it.
pub const KEY_TRAILER: &str = "Loops-Idempotency-Key";

/// How long a command that found a git lock file taken is tried again, and how long apart.
const LOCK_WAIT: Duration = Duration::from_secs(5);
const LOCK_PAUSE: Duration = Duration::from_millis(50);

/// How long in all (from its first failure) a command waits for a git lock file that a live
/// git process may hold ([`locks::Kept::Held`]), and how long apart it is tried again
/// meanwhile. A git that holds a lock for longer is stuck, or it is a git that takes no lock
/// but works in the repository (an editor's long-running `git cat-file --batch`, which the
/// check cannot tell from a holder) and may not end before the editor does: past this, the
/// command fails with an error naming that process, rather than hang a run for good.
const HELD_WAIT: Duration = Duration::from_secs(600);
const HELD_PAUSE: Duration = Duration::from_millis(500);
/// How often a wait for a lock a live git may hold is said again.
const HELD_REMINDER: Duration = Duration::from_secs(30);

/// How long [`Git::output`] waits for a git lock file that is taken: [`LOCK_WAIT`] before it
/// checks whether the lock is left behind, [`HELD_WAIT`] in all while a git may hold it.
/// Shorter in tests.
#[derive(Debug, Clone, Copy)]
struct LockWaits {
    taken: Duration,
    held: Duration,
}

impl Default for LockWaits {
    fn default() -> Self {
        LockWaits {
            taken: LOCK_WAIT,
            held: HELD_WAIT,
        }
    }
}

/// Checks that git can be run and returns its version line.
///
/// # Errors
/// A message saying that git is needed, if it cannot be started.
pub async fn check_installed() -> Result<String> {
    crate::child::version_of(
        "git",
        "this example needs git",
        "install git (https://git-scm.com/downloads)",
    )
    .await
}

/// A git repository (a work tree or a bare repository) that commands run in.
#[derive(Debug, Clone)]
pub struct Git {
    dir: PathBuf,
    /// The index file commands use instead of the repository's (`GIT_INDEX_FILE`).
    index: Option<PathBuf>,
    waits: LockWaits,
}

impl Git {
    /// Commands will run in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Git {
            dir: dir.into(),
            index: None,
            waits: LockWaits::default(),
        }
    }

    /// The same repository, with commands that wait `taken` for a lock file before they check
    /// whether it is left behind, and `held` in all while a git may hold it.
    #[cfg(test)]
    fn with_lock_waits(mut self, taken: Duration, held: Duration) -> Git {
        self.waits = LockWaits { taken, held };
        self
    }

    /// The same repository, with commands that use the index file `index` (created if
    /// missing) instead of the checkout's own.
    pub fn with_index(&self, index: &Path) -> Git {
        Git {
            dir: self.dir.clone(),
            index: Some(index.to_path_buf()),
            waits: self.waits,
        }
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
                "`git {}` in {} {}",
                args.join(" "),
                self.dir.display(),
                failure(&output)
            );
        }
        let mut out = String::from_utf8(output.stdout)
            .with_context(|| format!("`git {}` printed invalid UTF-8", args.join(" ")))?;
        out.truncate(out.trim_end().len());
        Ok(out)
    }

    /// Runs `git args...` and returns its output whatever its exit status.
    ///
    /// A command that fails because a git lock file is taken is tried again for
    /// [`LOCK_WAIT`] (with a warning when the wait begins): when this program is killed
    /// while git runs, git itself goes on (it is not killed with its parent) and holds
    /// `index.lock` until it finishes, possibly while the next run of this program starts.
    /// If the lock is still there then, and no git can be holding it (a git killed outright
    /// left it behind: [`locks`]), it is removed, with a warning, and the command tried once
    /// more; a lock on this program's own temporary index ([`with_index`](Self::with_index))
    /// is removed at once, since no other git uses that index. A git killed from outside, or
    /// whose other end was ([`cut_short`]), is run again
    /// ([`crate::child::output_unless_cut_short`]).
    ///
    /// A lock kept because a live git process works in its repository and may hold it is
    /// waited for, not failed on: the command is tried again every [`HELD_PAUSE`] while such
    /// a process runs, with a warning naming it and the lock when the wait begins (and again
    /// for another process), and a reminder every [`HELD_REMINDER`]. When it ends, its lock
    /// is gone (the command succeeds) or left behind (removed as above). The wait is a sleep:
    /// a stop (Ctrl-C, SIGTERM) drops it at once, as it drops any step.
    ///
    /// # Errors
    /// If git cannot start, or is killed from outside every time; if the lock is still taken
    /// after [`HELD_WAIT`] in all while a git may hold it, or after [`LOCK_WAIT`] where
    /// whether one does cannot be known (not Linux): an error naming the lock, the process,
    /// and what to do.
    pub async fn output(&self, args: &[&str]) -> Result<Output> {
        let what = format!("git {}", args.join(" "));
        let mut waiting_since = None;
        let mut removed_lock = false;
        // The git process that may hold the lock, as last named, and when that was said.
        let mut held = None;
        loop {
            tracing::debug!(dir = %self.dir.display(), "{what}");
            let make = || {
                let mut cmd = self.command();
                cmd.args(args);
                cmd
            };
            let output = crate::child::output_unless_cut_short(make, &what, cut_short).await?;
            let stderr = String::from_utf8_lossy(&output.stderr);
            if output.status.success() || !locks::is_lock_error(&stderr) {
                return Ok(output);
            }
            let private = locks::on_index(&stderr, self.index.as_deref());
            let waited = waiting_since.map_or(Duration::ZERO, |t: Instant| t.elapsed());
            let mut kept = locks::Kept::Other;
            if !removed_lock && (private || waited >= self.waits.taken) {
                match locks::remove_left_behind(&stderr, private) {
                    Ok(lock) => {
                        tracing::warn!(
                            lock = %lock.display(),
                            "removed a git lock file no running git holds (a git process \
                             killed outright left it behind); trying `{what}` again"
                        );
                        removed_lock = true;
                        continue;
                    }
                    Err(why) => kept = why,
                }
            }
            match kept {
                locks::Kept::Held { lock, holder } => {
                    if waited >= self.waits.held {
                        return Err(self.held_too_long(&what, &lock, &holder));
                    }
                    self.say_held(&what, &lock, holder, waited, &mut held);
                    // A lock left when this holder ends is removed as any other.
                    removed_lock = false;
                    tokio::time::sleep(HELD_PAUSE).await;
                    continue;
                }
                locks::Kept::Unknowable(lock) => {
                    return Err(anyhow!(
                        "`{what}` in {}: the git lock file {} is still taken after {} s, and \
                         whether a git process holds it cannot be known on this system: end \
                         the git process that holds it, or remove {} if none does (a git \
                         killed outright left it behind)",
                        self.dir.display(),
                        lock.display(),
                        self.waits.taken.as_secs(),
                        lock.display()
                    ));
                }
                locks::Kept::Other => {}
            }
            if waited >= self.waits.taken {
                // The git that may have held the lock ended between the command and the check:
                // its lock is gone (or a git that starts took one, to be checked when older).
                if held.is_some() && !removed_lock && waited < self.waits.held {
                    tokio::time::sleep(HELD_PAUSE).await;
                    continue;
                }
                return Ok(output);
            }
            if waiting_since.is_none() {
                tracing::warn!(
                    error = %one_line(&stderr),
                    "`{what}` found a git lock file taken; trying again for up to {} s",
                    self.waits.taken.as_secs()
                );
                waiting_since = Some(Instant::now());
            }
            tokio::time::sleep(LOCK_PAUSE).await;
        }
    }

    /// Says that `what` waits for `lock`, which `holder` may hold, `waited` after its first
    /// failure: when the wait begins, or another process is found; then every
    /// [`HELD_REMINDER`]. `held`: the process last named, and when it was said.
    fn say_held(
        &self,
        what: &str,
        lock: &Path,
        holder: locks::Holder,
        waited: Duration,
        held: &mut Option<(locks::Holder, Instant)>,
    ) {
        match held {
            Some((named, said)) if named.pid == holder.pid => {
                if said.elapsed() >= HELD_REMINDER {
                    tracing::warn!(
                        lock = %lock.display(),
                        "`{what}` still waits for a git lock file that {holder} may hold \
                         ({} s so far, up to {} s)",
                        waited.as_secs(),
                        self.waits.held.as_secs()
                    );
                    *said = Instant::now();
                }
            }
            _ => {
                tracing::warn!(
                    lock = %lock.display(),
                    "`{what}` waits for a git lock file that {holder} may hold (it works in \
                     the lock's repository); trying again until that process ends, for up to \
                     {} s in all",
                    self.waits.held.as_secs()
                );
                *held = Some((holder, Instant::now()));
            }
        }
    }

    /// The error of `what` when `lock` is still taken after [`HELD_WAIT`], `holder` alive.
    fn held_too_long(&self, what: &str, lock: &Path, holder: &locks::Holder) -> anyhow::Error {
        anyhow!(
            "`{what}` in {}: the git lock file {} is still taken after {} s, and {holder} works \
             in its repository and may hold it: end that process, or remove {} if no git holds \
             it (a git killed outright left it behind)",
            self.dir.display(),
            lock.display(),
            self.waits.held.as_secs(),
            lock.display()
        )
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

    /// The commit on top of `parent` (its only parent) whose message carries `key` in its
    /// idempotency-key trailer, if any ref reaches one. A commit with the same key on another
    /// parent is another run's (the same run id, on another base, in a repository this one
    /// was cloned from), not this step's.
    ///
    /// # Errors
    /// If git fails.
    pub async fn find_commit_with_key(&self, key: &str, parent: &str) -> Result<Option<String>> {
        let grep = format!("--grep=^{KEY_TRAILER}: {key}$");
        let found = self.run(&["log", "--all", "--format=%H %P", &grep]).await?;
        Ok(found.lines().find_map(|line| {
            let mut ids = line.split(' ');
            let id = ids.next()?;
            (ids.next() == Some(parent) && ids.next().is_none()).then(|| id.to_owned())
        }))
    }

    /// Commits `change` on `branch` on top of `parent`, exactly once per `key`, without
    /// touching the checkout.
    ///
    /// If a commit carrying `key` exists already (an earlier attempt committed, then the
    /// process stopped before the step's record), that commit is returned and nothing is
    /// committed. Otherwise the edited files are read from `parent`, edited, and written as
    /// blobs; a tree is built from `parent`'s in a temporary index under `scratch`; the commit
    /// (with `key` as a trailer) is made from it, and `branch` is set to it. A kill before that
    /// last step leaves only objects no ref reaches; the next attempt makes the same commit.
    ///
    /// # Errors
    /// If an edit does not apply, names no regular file of `parent`, or git fails.
    pub async fn commit_change(
        &self,
        branch: &str,
        parent: &str,
        change: &Change,
        body: &str,
        key: &str,
        scratch: &Path,
    ) -> Result<Committed> {
        if let Some(id) = self.find_commit_with_key(key, parent).await? {
            tracing::info!(commit = %id, key, "commit found by its idempotency key");
            // Found through another ref (`origin/<branch>` in a clone of a repository where
            // this run id ran before): `branch` is set to it as a commit made now would be,
            // if it is missing or at `parent`; a branch moved on is left alone.
            let local = format!("refs/heads/{branch}");
            let old = match self.resolve(&local).await? {
                None => Some(String::new()),
                Some(head) if head == parent => Some(head),
                Some(_) => None,
            };
            if let Some(old) = old {
                let reason = format!("deliver: {} (found by its key)", change.summary);
                self.run(&["update-ref", "-m", &reason, &local, &id, &old])
                    .await?;
            }
            return Ok(Committed {
                commit: Commit {
                    id,
                    subject: change.summary.clone(),
                },
                created: false,
            });
        }
        // Each file's mode and text, as the edits leave them.
        let mut files: BTreeMap<&str, (String, String)> = BTreeMap::new();
        for edit in &change.edits {
            check_edit_path(&edit.path)?;
            let (mode, text) = match files.remove(edit.path.as_str()) {
                Some(file) => file,
                None => self.file_at(parent, &edit.path).await?,
            };
            files.insert(&edit.path, (mode, apply_edit(&text, edit)?));
        }
        let work = tempfile::Builder::new()
            .prefix("commit-")
            .tempdir_in(scratch)
            .with_context(|| format!("cannot create a directory in {}", scratch.display()))?;
        let index = self.with_index(&work.path().join("index"));
        index.run(&["read-tree", parent]).await?;
        for (path, (mode, text)) in &files {
            // Written to the object database as it is (no end-of-line or other filters).
            let file = work.path().join("blob");
            std::fs::write(&file, text)
                .with_context(|| format!("cannot write {}", file.display()))?;
            let file = file.to_string_lossy();
            let blob = self
                .run(&["hash-object", "-w", "--no-filters", "--", &file])
                .await?;
            index
                .run(&[
                    "update-index",
                    "--cacheinfo",
                    &format!("{mode},{blob},{path}"),
                ])
                .await?;
        }
        let tree = index.run(&["write-tree"]).await?;
        let trailer = format!("{KEY_TRAILER}: {key}");
        let id = self
            .run(&[
                "commit-tree",
                &tree,
                "-p",
                parent,
                "-m",
                &change.summary,
                "-m",
                body,
                "-m",
                &trailer,
            ])
            .await?;
        let reason = format!("deliver: {}", change.summary);
        self.run(&[
            "update-ref",
            "-m",
            &reason,
            &format!("refs/heads/{branch}"),
            &id,
        ])
        .await?;
        tracing::info!(commit = %id, branch, key, "committed");
        Ok(Committed {
            commit: Commit {
                id,
                subject: change.summary.clone(),
            },
            created: true,
        })
    }

    /// The mode (`100644` or `100755`) and the text of the regular file `path` at `commit`.
    ///
    /// # Errors
    /// If `commit` has no regular file there, it is not UTF-8, or git fails.
    pub async fn file_at(&self, commit: &str, path: &str) -> Result<(String, String)> {
        let listing = self.run(&["ls-tree", "-z", commit, "--", path]).await?;
        // Entries `<mode> <type> <object>\t<path>`, each ended by a NUL.
        let entry = listing
            .split('\0')
            .find_map(|e| e.split_once('\t').filter(|(_, p)| *p == path))
            .map(|(info, _)| info.split(' ').collect::<Vec<_>>());
        let Some([mode, "blob", object]) = entry.as_deref() else {
            bail!(
                "edit of {path}: there is no such file at commit {}",
                crate::agent::short(commit)
            );
        };
        ensure!(
            matches!(*mode, "100644" | "100755"),
            "edit of {path}: not a regular file at commit {} (mode {mode})",
            crate::agent::short(commit)
        );
        let output = self.output(&["cat-file", "blob", object]).await?;
        ensure!(
            output.status.success(),
            "`git cat-file blob {object}` in {} {}",
            self.dir.display(),
            failure(&output)
        );
        let text = String::from_utf8(output.stdout)
            .with_context(|| format!("edit of {path}: the file is not UTF-8"))?;
        Ok(((*mode).to_owned(), text))
    }

    /// Writes the files of `commit` under `dir` (a new directory), using `index` as a
    /// temporary index: a copy to build and test, made without touching the checkout.
    ///
    /// # Errors
    /// If git fails.
    pub async fn export(&self, commit: &str, dir: &Path, index: &Path) -> Result<()> {
        let index = self.with_index(index);
        index.run(&["read-tree", commit]).await?;
        // `--prefix` is a string git prepends to each path: a trailing separator makes it a
        // directory.
        let prefix = format!("{}{}", dir.display(), std::path::MAIN_SEPARATOR);
        index
            // `--force`: a run again after a git killed outright finds its files there.
            .run(&[
                "checkout-index",
                "--all",
                "--force",
                &format!("--prefix={prefix}"),
            ])
            .await?;
        Ok(())
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

impl Git {
    /// A `git` command in this repository, as [`command`] makes it, with the index file of
    /// [`with_index`](Self::with_index) if any.
    fn command(&self) -> Command {
        let mut cmd = command(&self.dir);
        if let Some(index) = &self.index {
            cmd.env("GIT_INDEX_FILE", index);
        }
        cmd
    }
}

/// A `git` command in `dir` with a fixed identity and dates, no user or system configuration
/// (so no signing, hooks path or templates), no background maintenance, no optional locks (a
/// `git status` does not refresh the checkout's index), C messages, and no prompts.
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
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    // Not `kill_on_drop`: when a step is dropped (Ctrl-C, a time-out), git finishes its
    // command, as it does when this program is killed. Killed with SIGKILL, it would leave
    // its lock file (`HEAD.lock`, `index.lock`) behind, and every later command in the
    // repository would fail until the lock is found to be left behind ([`locks`]: after
    // seconds of waiting, and on Linux only).
    own_process_group(&mut cmd);
    cmd
}

/// How a git command that failed was cut short from outside, if it was: the other end of a
/// push or fetch (`git-receive-pack`, `git-upload-pack`, its own child) killed, which git
/// says as a hang-up, not as its own death by a signal.
fn cut_short(output: &Output) -> Option<&'static str> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let hung_up = stderr.contains("the remote end hung up unexpectedly")
        || stderr.contains("unexpected disconnect");
    (!output.status.success() && hung_up).then_some("its other end, which hung up")
}

fn null_device() -> &'static str {
    if cfg!(windows) { "NUL" } else { "/dev/null" }
}

/// How a program that ended with `output` failed, for an error: `failed: ` and its message
/// on one line, or, when it said nothing, `failed (exit status: 1) and said nothing`. Never a
/// bare colon.
pub fn failure(output: &Output) -> String {
    let said = one_line(&String::from_utf8_lossy(&output.stderr));
    if said.is_empty() {
        format!("failed ({}) and said nothing", output.status)
    } else {
        format!("failed: {said}")
    }
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

/// Checks that `path`, an edit's, is a plain relative path inside the repository.
///
/// # Errors
/// If it is absolute, empty, or has a `..` or `.` component.
pub fn check_edit_path(path: &str) -> Result<()> {
    let relative = Path::new(path);
    ensure!(
        relative.components().next().is_some()
            && relative
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_))),
        "edit path {path:?} is not a plain relative path inside the repository"
    );
    Ok(())
}

/// `text` with `edit` applied: its `find` text, which must occur exactly once, replaced.
///
/// # Errors
/// If the `find` text does not occur exactly once.
pub fn apply_edit(text: &str, edit: &Edit) -> Result<String> {
    let found = text.matches(edit.find.as_str()).count();
    ensure!(
        found == 1,
        "edit of {}: the text to replace occurs {found} times, expected once: {:?}",
        edit.path,
        edit.find
    );
    Ok(text.replacen(&edit.find, &edit.replace, 1))
}

#[cfg(test)]
mod tests;
