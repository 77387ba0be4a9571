//! The demo's world: a tiny Rust crate with two bugs in a git repository, the bare repository
//! it is pushed to, and the issue the agent is given.
//!
//! Setting up is safe to interrupt: the repository and the remote are built in temporary
//! directories and renamed into place when complete, so a killed setup leaves either nothing
//! or a finished repository.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail, ensure};

use crate::git::{self, Git};
use crate::workflow::{Base, Issue};

/// `Cargo.toml` of the demo crate.
pub const CARGO_TOML: &str = r#"[package]
name = "tiny-math"
version = "0.1.0"
edition = "2021"
"#;

/// `src/lib.rs` of the demo crate: `add` and `mean` are both wrong, and both tests fail.
pub const LIB_RS: &str = r#"//! Tiny arithmetic helpers.

/// Adds two numbers.
pub fn add(a: i64, b: i64) -> i64 {
    a - b
}

/// The arithmetic mean of `values`, or `None` if there are none.
pub fn mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    Some(values.iter().sum::<f64>() / (values.len() - 1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_sums_its_arguments() {
        assert_eq!(add(2, 3), 5);
    }

    #[test]
    fn mean_of_three_values() {
        assert_eq!(mean(&[1.0, 2.0, 6.0]), Some(3.0));
    }
}
"#;

/// The branch the demo repository starts on, and pull requests target.
pub const BASE_BRANCH: &str = "main";

/// The issue the agent works on. It names one bug; the tests reveal the other.
pub fn issue() -> Issue {
    Issue {
        number: 1,
        title: "add() returns the difference of its arguments".to_owned(),
        body: "`add(2, 3)` returns -1; it should return 5. The unit test \
               `tests::add_sums_its_arguments` fails."
            .to_owned(),
    }
}

/// Where everything the demo uses lives.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The work directory (absolute).
    pub workdir: PathBuf,
    /// The store file.
    pub store: PathBuf,
    /// The repository the agent commits to (its checkout is never changed).
    pub repo: PathBuf,
    /// Whether `repo` was given by the user (`--repo`, or recorded for the run when it was
    /// started so) rather than the demo's own.
    pub repo_given: bool,
    /// Whether `repo` was read from the run's attributes ([`settle_run`](Self::settle_run))
    /// rather than given with `--repo`.
    pub repo_recorded: bool,
    /// The bare repository branches are pushed to.
    pub remote: PathBuf,
    /// The forge's directory.
    pub forge: PathBuf,
    /// Scratch space for test binaries.
    pub scratch: PathBuf,
    /// The test hook's log of handler entries.
    pub entries_log: PathBuf,
    /// The work directory's lock, once this process holds it ([`lock`](Self::lock)).
    pub held: Option<std::sync::Arc<std::fs::File>>,
}

/// The file that marks a directory as a work directory of this example, so that `--fresh`
/// never deletes a directory it did not create.
pub const MARKER: &str = ".loops-deliver-workdir";

/// How the names of this example's own files in a work directory begin (the marker, its
/// lock, the approval wishes).
const OWN_PREFIX: &str = ".loops-deliver-";

/// The store's file name in a work directory, where `--store` does not name another.
pub const STORE_FILE: &str = "deliver.redb";

/// The store `store` names (`--store`), else [`STORE_FILE`] in `workdir`.
pub fn store_path(workdir: &Path, store: Option<&Path>) -> PathBuf {
    store.map_or_else(|| workdir.join(STORE_FILE), Path::to_path_buf)
}

impl Paths {
    /// The layout under `workdir`, with the store and the repository where given.
    pub fn new(workdir: PathBuf, store: Option<PathBuf>, repo: Option<PathBuf>) -> Self {
        Paths {
            store: store.unwrap_or_else(|| workdir.join(STORE_FILE)),
            repo_given: repo.is_some(),
            repo_recorded: false,
            repo: repo.unwrap_or_else(|| workdir.join("repo")),
            remote: workdir.join("remote.git"),
            forge: workdir.join("forge"),
            scratch: workdir.join("scratch"),
            entries_log: workdir.join("handler-entries.log"),
            held: None,
            workdir,
        }
    }

    /// What this example builds, clears or deletes in the work directory, each with its name
    /// for messages: the demo's repository (whatever `--repo` says), the remote, the forge,
    /// the scratch space. A store or a work directory inside one of them would be lost.
    pub fn built(&self) -> [(&'static str, PathBuf); 4] {
        [
            ("the demo's repository", self.workdir.join("repo")),
            ("the remote", self.remote.clone()),
            ("the forge", self.forge.clone()),
            ("the scratch space", self.scratch.clone()),
        ]
    }

    /// Deletes the store and the work directory (`--fresh`). A repository given with
    /// `--repo` is left alone. The caller holds the store's lock meanwhile, where it can.
    ///
    /// Safe to interrupt. A store in the work directory (the default) goes with it: the work
    /// directory is renamed aside to `<workdir>.deleting-<pid>` (one rename), and removed
    /// from there once the new work directory has taken over its approval wishes
    /// ([`create_workdir`](Self::create_workdir), then
    /// [`clear_leftovers`](Self::clear_leftovers)). A store elsewhere goes first (one
    /// unlink), then the work directory the same way. A kill leaves the work directory either
    /// whole (with its store, whose run the next start resumes or reports; or without it, and
    /// the next start begins a new run there, whose steps find their commits and pull request
    /// by their idempotency keys) or aside; never half deleted.
    ///
    /// # Errors
    /// If the work directory exists, is not empty and was not made by this example, holds
    /// the repository given with `--repo`, is not held by this process (another start made
    /// it meanwhile), or if deleting fails.
    pub fn delete(&self) -> Result<()> {
        // A link would be renamed aside in the directory's stead, and a new directory made in
        // its place, beside the old one.
        if std::fs::symlink_metadata(&self.workdir).is_ok_and(|m| m.file_type().is_symlink()) {
            bail!(
                "--fresh: --workdir {} is a symbolic link; --fresh deletes a work directory \
                 itself: name the directory it points to (nothing was deleted)",
                self.workdir.display()
            );
        }
        if self.repo_given && self.repo.starts_with(&self.workdir) {
            bail!(
                "refusing to delete {}: the repository given with --repo is inside it",
                self.workdir.display()
            );
        }
        if self.workdir.exists() && !self.is_ours()? {
            bail!(
                "refusing to delete {}: it is not a work directory of this example (no \
                 {MARKER} in it)",
                self.workdir.display()
            );
        }
        // Put in place by another start since this one looked
        // ([`lock_for_fresh`](Self::lock_for_fresh)).
        ensure!(
            !self.workdir.exists() || self.holds_workdir(),
            "--fresh: work directory {} was made by another `deliver` while this one started \
             (nothing was deleted): wait for it to end, or run the command again",
            self.workdir.display()
        );
        // Where the work directory goes: one left there by an earlier process of this id is
        // taken over only if it is this example's.
        let aside = self.aside("deleting")?;
        ensure!(
            !aside.exists() || made_here(&aside)?,
            "--fresh: {} is not a directory of this example's, and --fresh moves the work \
             directory there to delete it: move it away (nothing was deleted)",
            aside.display()
        );
        if !self.store.starts_with(&self.workdir) {
            match std::fs::remove_file(&self.store) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).context(format!("cannot delete {}", self.store.display()));
                }
            }
        }
        if !self.workdir.exists() {
            return Ok(());
        }
        if aside.exists() {
            // Left by an earlier process of the same id (ids are reused: in a container, a
            // process may have the same one at every start): its wishes stay, in the
            // directory about to go aside.
            crate::approval::carry_asked(&aside, &self.workdir)?;
            let _ = remove_marker_last(&aside);
        }
        std::fs::rename(&self.workdir, &aside).with_context(|| {
            format!("cannot move {} aside to delete it", self.workdir.display())
        })?;
        crate::hooks::hold_in_setup("aside");
        // Removed once the new work directory has taken its wishes over
        // ([`clear_leftovers`](Self::clear_leftovers)).
        Ok(())
    }

    /// Keeps in the work directory, if it exists and is this example's, what `--auto-approve`
    /// asks of the run `run_id` ([`approval::remember_asked`](crate::approval::remember_asked)):
    /// `--fresh` calls it before it deletes anything, so that a kill at any point of the
    /// deletion leaves the wish in the directory, or in the directory moved aside, whose
    /// wishes the next start takes over ([`create_workdir`](Self::create_workdir)).
    ///
    /// # Errors
    /// If the directory cannot be read, or the wish written.
    pub fn remember_before_fresh(&self, run_id: &str, auto_approve: Option<bool>) -> Result<()> {
        if self.workdir.is_dir() && self.is_ours()? {
            crate::approval::remember_asked(&self.workdir, run_id, auto_approve)?;
        }
        Ok(())
    }

    /// Whether the work directory (which exists) is empty or marked as made by this example:
    /// it holds the marker, or nothing but this example's own files (the marker being written
    /// by another process that made it a moment ago, or a run's approval wish written just
    /// before the marker).
    pub(crate) fn is_ours(&self) -> Result<bool> {
        made_here(&self.workdir)
    }

    /// A directory beside the work directory, `<workdir>.<kind>-<pid>` (a rename within one
    /// directory is atomic): `deleting`, where [`delete`](Self::delete) moves it; `new`,
    /// where [`create_workdir`](Self::create_workdir) builds it.
    pub(crate) fn aside(&self, kind: &str) -> Result<PathBuf> {
        let name = self.workdir.file_name().with_context(|| {
            format!(
                "{} has no name to make a directory beside it",
                self.workdir.display()
            )
        })?;
        Ok(self.workdir.with_file_name(format!(
            "{}.{kind}-{}",
            name.to_string_lossy(),
            std::process::id()
        )))
    }

    /// The directories of `kind` beside the work directory ([`aside`](Self::aside)) that
    /// earlier processes left: this example's ([`made_here`]: a directory of the user's that
    /// happens to have such a name is not one), and not held by a process still at work
    /// there (a start building it, a `--fresh` deleting it: each holds the lock inside), but
    /// this process's own.
    pub(crate) fn asides(&self, kind: &str) -> Vec<PathBuf> {
        let own = self.aside(kind).ok();
        self.named_asides(kind)
            .into_iter()
            .filter(|dir| {
                made_here(dir).unwrap_or(false)
                    && (own.as_ref() == Some(dir) || !crate::workdir::is_held(dir))
            })
            .collect()
    }

    /// The directories beside the work directory named as [`aside`](Self::aside) names those
    /// of `kind`, whoever made them.
    pub(crate) fn named_asides(&self, kind: &str) -> Vec<PathBuf> {
        let (Some(parent), Some(name)) = (self.workdir.parent(), self.workdir.file_name()) else {
            return Vec::new();
        };
        let prefix = format!("{}.{kind}-", name.to_string_lossy());
        let Ok(entries) = std::fs::read_dir(parent) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|entry| {
                entry
                    .file_name()
                    .to_str()
                    .and_then(|f| f.strip_prefix(&prefix))
                    .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
            })
            .map(|entry| entry.path())
            .collect()
    }

    /// Removes what interrupted deletions and creations left beside the work directory
    /// (`<workdir>.deleting-<pid>`, `<workdir>.new-<pid>`). Best effort: a failure is logged
    /// and tried again at the next start.
    fn clear_asides(&self) {
        for dir in self
            .asides("deleting")
            .into_iter()
            .chain(self.asides("new"))
        {
            crate::child::stop_left_groups(&dir.join("scratch"));
            if let Err(e) = remove_marker_last(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot delete");
            }
        }
    }

    /// Writes the work directory's marker ([`MARKER`]), which says that it is this example's
    /// and holds its id ([`workdir_id`](Self::workdir_id)), if it has no id yet (a new
    /// directory, or one whose marker an earlier version of this example left empty). Written
    /// durably: runs record the id.
    ///
    /// # Errors
    /// If it cannot be read or written.
    pub fn mark(&self) -> Result<()> {
        if self.workdir_id()?.is_some() {
            return Ok(());
        }
        // Linked into place in a new directory: of two processes that mark it at once, the
        // first one's id stands, and the second's is dropped (before either records a run).
        let marker = self.workdir.join(MARKER);
        let replace = marker.exists();
        write_durably(&marker, new_workdir_id().as_bytes(), replace).map(drop)
    }

    /// The work directory's id, in its marker: made with the directory, the same in a copy of
    /// it (a backup restored elsewhere, with its remote and forge), another in any other
    /// directory. `None` if the directory has no marker, or an empty one.
    ///
    /// # Errors
    /// If the marker cannot be read.
    pub fn workdir_id(&self) -> Result<Option<String>> {
        let marker = self.workdir.join(MARKER);
        match std::fs::read_to_string(&marker) {
            Ok(id) => Ok(Some(id.trim().to_owned()).filter(|id| !id.is_empty())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", marker.display())),
        }
    }

    /// Clears what interrupted runs left behind: a work directory moved aside to be deleted,
    /// half-built repositories, test builds (and a build or test run still going on there,
    /// stopped first: [`stop_left_groups`](crate::child::stop_left_groups)). Only for the
    /// holder of the store's lock: another process's work in progress looks the same.
    ///
    /// # Errors
    /// If the scratch directory cannot be made anew.
    pub fn clear_leftovers(&self) -> Result<()> {
        self.clear_asides();
        // Best effort: a process killed earlier may still be writing there.
        let asked = self.workdir.join(crate::approval::ASKED_DIR);
        for dir in [&self.workdir, &asked] {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().contains(".tmp-") {
                    let path = entry.path();
                    let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
                }
            }
        }
        crate::child::stop_left_groups(&self.scratch);
        let _ = std::fs::remove_dir_all(&self.scratch);
        std::fs::create_dir_all(&self.scratch)
            .with_context(|| format!("cannot create {}", self.scratch.display()))
    }
}

/// A new work directory id: 16 hex digits hashed from the time, the process id and the
/// random keys of std's hash maps.
pub(crate) fn new_workdir_id() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    hasher.write_u128(now.map_or(0, |d| d.as_nanos()));
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish())
}

/// Whether the directory `dir` (which exists) is empty or marked as made by this example: it
/// holds the marker, or nothing but this example's own files.
///
/// # Errors
/// If it cannot be read.
pub(crate) fn made_here(dir: &Path) -> Result<bool> {
    let mut entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    let marking = entries.all(|entry| {
        entry.is_ok_and(|entry| entry.file_name().to_string_lossy().starts_with(OWN_PREFIX))
    });
    Ok(marking || dir.join(MARKER).exists())
}

/// Deletes the work directory `dir` (one moved aside) with its [`MARKER`] last: a kill in the
/// middle of the deletion leaves a directory that is still known as this example's
/// ([`made_here`]), which the next start deletes, never a half-deleted one without its
/// marker, which would stay for good.
///
/// # Errors
/// If an entry or the directory cannot be deleted.
fn remove_marker_last(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name() == MARKER {
            continue;
        }
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    std::fs::remove_dir_all(dir)
}

/// Whether `a` and `b` are the metadata of one file (the same device and inode, whatever
/// its names).
#[cfg(unix)]
pub(crate) fn same_inode(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// Whether `a` and `b` name the same directory (compared as they are if either cannot be
/// resolved).
pub fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Writes `bytes` to `path` so that a crash leaves the file as it was or the new one,
/// complete: written to `<path>.tmp-<pid>` beside it and synced, then moved into place
/// (renamed over `path` if `replace`; else linked to it, which leaves a file there as it is,
/// and returns `false`), and the directory synced.
pub fn write_durably(path: &Path, bytes: &[u8], replace: bool) -> Result<bool> {
    use std::io::Write as _;
    let dir = path
        .parent()
        .with_context(|| format!("{} has no parent directory", path.display()))?;
    let tmp = temp_sibling(path)?;
    let written = std::fs::File::create(&tmp).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", tmp.display()));
    }
    let placed = if replace {
        std::fs::rename(&tmp, path)
    } else {
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        linked
    };
    match placed {
        Ok(()) => sync_dir(dir).map(|()| true),
        Err(e) if !replace && e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => {
            Err(e).with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
        }
    }
}

/// Makes the entries of directory `dir` durable (a no-op where directories cannot be opened).
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Checks that `repo`, given with `--repo`, is the top directory of an existing git work
/// tree (the agent edits files by their paths from there). Nothing is ever created there.
///
/// # Errors
/// Saying which of these it is not.
pub async fn check_repo(repo: &Path) -> Result<()> {
    match std::fs::metadata(repo) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => bail!(
            "--repo {}: not a directory; name the top directory of an existing git repository",
            repo.display()
        ),
        Err(e) => bail!(
            "--repo {}: {}; name an existing git repository",
            repo.display(),
            if e.kind() == std::io::ErrorKind::NotFound {
                "no such directory".to_owned()
            } else {
                e.to_string()
            }
        ),
    }
    let output = Git::new(repo)
        .output(&["rev-parse", "--show-toplevel"])
        .await?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!(
            "--repo {} is not a git work tree ({})",
            repo.display(),
            stderr.lines().next().unwrap_or("git said nothing").trim()
        );
    }
    let top = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let same = |a: &Path, b: &Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b);
    ensure!(
        same(&top, repo),
        "--repo {} is inside the git work tree {}; name its top directory",
        repo.display(),
        top.display()
    );
    Ok(())
}

/// Makes sure the repository and the remote exist, creating the demo's, and returns the base
/// of the run whose work branch is `work_branch`: `recorded`, the base a run that exists
/// started from; or, for a new run, the branch checked out in the repository (`main` in the
/// demo's) and its last commit.
///
/// Nothing in a checkout is changed. In a repository given with `--repo`, a new run is
/// refused while HEAD is detached, on a work branch of this example, or the work tree has
/// uncommitted changes to tracked files (they would not be in the pull request: commit or
/// stash them). A run that exists goes on whatever is checked out, unless it is the run's own
/// work branch (which its commits move).
///
/// # Errors
/// If git fails, the repository is not a git work tree, a new run is refused as above, or
/// the demo's repository or the remote of a run that exists is gone (it made them before its
/// first record).
pub async fn prepare(paths: &Paths, work_branch: &str, recorded: Option<Base>) -> Result<Base> {
    let run_exists = recorded.is_some();
    if !paths.repo_given && !paths.repo.exists() {
        // As the remote below: the run made the demo's repository before its first record.
        ensure!(
            !run_exists,
            "the repository {} is gone (moved or deleted since the run of branch \
             {work_branch} made it); a new one would lack the run's commits: put it back, or \
             start over with --fresh or another --run-id",
            paths.repo.display()
        );
        create_demo_repo(&paths.repo).await?;
    }
    let git = Git::new(&paths.repo);
    let inside = git
        .run(&["rev-parse", "--is-inside-work-tree"])
        .await
        .with_context(|| format!("{} is not a git repository", paths.repo.display()))?;
    ensure!(
        inside == "true",
        "{} is not a git work tree",
        paths.repo.display()
    );
    let base = match recorded {
        Some(base) => base,
        None if paths.repo_given => new_base(&git).await?,
        None => Base {
            branch: BASE_BRANCH.to_owned(),
            commit: git.rev_parse(BASE_BRANCH).await?,
        },
    };
    if paths.repo_given && checked_out_branch(&git).await?.as_deref() == Some(work_branch) {
        bail!(
            "--repo {} has the run's work branch {work_branch} checked out (an earlier version \
             of this example left it so); check out {} again (`git checkout {}`)",
            paths.repo.display(),
            base.branch,
            base.branch
        );
    }
    if !paths.remote.exists() {
        // A run that exists made its remote before its first record: a new one in its place
        // would take the run's push and pull request without the base it was made with.
        ensure!(
            !run_exists,
            "the remote {} is gone (moved or deleted since the run of branch {work_branch} \
             made it); a new one would lack what the run pushed and started from: put it \
             back, or start over with --fresh or another --run-id",
            paths.remote.display()
        );
        create_remote(&git, &paths.remote, &base.branch, &base.commit).await?;
    }
    Ok(base)
}

/// Where a new run in the repository given with `--repo` starts: the branch checked out
/// there, at its last commit.
///
/// # Errors
/// If HEAD is detached, on a work branch of this example or on a branch with no commits, if
/// tracked files have uncommitted changes, or if git fails.
async fn new_base(git: &Git) -> Result<Base> {
    let repo = git.dir().display();
    let Some(branch) = checked_out_branch(git).await? else {
        bail!(
            "HEAD of --repo {repo} is detached (earlier versions of this example left it so \
             after testing); a new run starts from the branch pull requests should target: \
             check it out (`git checkout <branch>`)"
        );
    };
    if branch.starts_with("loops/") {
        bail!(
            "--repo {repo} has the agent's work branch {branch} checked out; check out the \
             branch pull requests should target"
        );
    }
    // A branch with no commits yet (a new `git init`, or `git checkout --orphan`).
    let Some(commit) = git
        .resolve(&format!("refs/heads/{branch}^{{commit}}"))
        .await?
    else {
        bail!(
            "--repo {repo} has no commits on its branch {branch}; commit something first: a \
             new run starts from the last commit of the branch checked out"
        );
    };
    let status = git
        .run(&["status", "--porcelain=v1", "--untracked-files=no"])
        .await?;
    let changed: Vec<&str> = status.lines().map(str::trim).collect();
    if !changed.is_empty() {
        const SHOWN: usize = 3;
        let mut list = changed[..changed.len().min(SHOWN)].join(", ");
        if changed.len() > SHOWN {
            list.push_str(&format!(" and {} more", changed.len() - SHOWN));
        }
        bail!(
            "--repo {repo} has uncommitted changes ({list}); commit or stash them first: a new \
             run starts from the last commit of {branch}"
        );
    }
    Ok(Base { branch, commit })
}

/// The branch checked out in `git`'s work tree, or `None` if HEAD is detached.
///
/// # Errors
/// If git fails otherwise.
async fn checked_out_branch(git: &Git) -> Result<Option<String>> {
    let output = git
        .output(&["symbolic-ref", "--quiet", "--short", "HEAD"])
        .await?;
    match output.status.code() {
        Some(0) => Ok(Some(
            String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        )),
        // `--quiet`: exit code 1, and nothing said, for a detached HEAD.
        Some(1) if output.stderr.is_empty() => Ok(None),
        _ => bail!(
            "`git symbolic-ref HEAD` in {} {}",
            git.dir().display(),
            git::failure(&output)
        ),
    }
}

/// A sibling of `path` to build it in: `<name>.tmp-<pid>`.
fn temp_sibling(path: &Path) -> Result<PathBuf> {
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    Ok(path.with_file_name(format!(
        "{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Creates the demo crate's repository at `path`, with one commit on `main` whose id is the
/// same everywhere.
async fn create_demo_repo(path: &Path) -> Result<()> {
    let tmp = temp_sibling(path)?;
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(tmp.join("src"))
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    for (file, text) in [
        ("Cargo.toml", CARGO_TOML),
        ("src/lib.rs", LIB_RS),
        (".gitignore", "/target\n"),
    ] {
        std::fs::write(tmp.join(file), text)
            .with_context(|| format!("cannot write {}", tmp.join(file).display()))?;
    }
    let git = Git::new(&tmp);
    git.run(&["init", "--quiet"]).await?;
    git.run(&["symbolic-ref", "HEAD", &format!("refs/heads/{BASE_BRANCH}")])
        .await?;
    git.run(&["add", "--all"]).await?;
    git.run(&[
        "commit",
        "--quiet",
        "--no-verify",
        "-m",
        "tiny-math: add() and mean(), with tests",
    ])
    .await?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
}

/// Creates the bare repository at `path` holding `branch` at `commit`.
async fn create_remote(repo: &Git, path: &Path, branch: &str, commit: &str) -> Result<()> {
    let tmp = temp_sibling(path)?;
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let remote = Git::new(&tmp);
    remote.run(&["init", "--quiet", "--bare"]).await?;
    // A push runs the receiving side without our environment: no background maintenance
    // after a push either (see `git::command`).
    remote.run(&["config", "receive.autogc", "false"]).await?;
    remote
        .run(&["symbolic-ref", "HEAD", &format!("refs/heads/{branch}")])
        .await?;
    repo.push(&tmp, commit, branch).await?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
}
