//! Where a run works, as the run records it: at its start, the attributes that name its work
//! directory and repository; when it is resumed, the checks that it is resumed there (or in a
//! copy that holds what it did), before anything is done in the work directory.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail, ensure};
use loops::{AttributeValue, Attributes, StartOptions};

use crate::Cli;
use crate::git::Git;
use crate::project::{MARKER, Paths, check_repo, same_dir};

/// The run attribute that records, at a run's start, its work directory's id
/// ([`Paths::workdir_id`]): the remote the run pushes to, the forge its pull request is filed
/// in and the demo's repository are there.
pub const WORKDIR_ID_ATTRIBUTE: &str = "workdir_id";

/// The run attribute that records, at a run's start, the path of its work directory
/// (absolute), to name it.
pub const WORKDIR_ATTRIBUTE: &str = "workdir";

/// The run attribute that records, at a run's start, the repository given with `--repo`
/// (absolute); a run on the demo's repository has none.
pub const REPO_ATTRIBUTE: &str = "repo";

/// `path` with every symbolic link in it resolved, one to nothing included (its target is
/// where a file would be made), and the part that does not exist kept as written.
pub fn resolved(path: &Path) -> PathBuf {
    fn resolve(path: &Path, links: u32) -> PathBuf {
        if let Ok(real) = path.canonicalize() {
            return real;
        }
        // A link to nothing (at most 40 in a row, as the kernel follows).
        if links < 40
            && let Ok(target) = std::fs::read_link(path)
        {
            let target = path
                .parent()
                .map_or(target.clone(), |dir| dir.join(&target));
            return resolve(&target, links + 1);
        }
        match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) => resolve(parent, links).join(name),
            _ => path.to_path_buf(),
        }
    }
    resolve(path, 0)
}

impl Paths {
    /// Refuses a store, or a work directory, inside what a work directory's runs build and
    /// clear ([`Paths::built`]: the demo's repository is built aside and renamed into place, the
    /// scratch space emptied at every start), this work directory's or another's; and a work
    /// directory inside another (marked) at all, whose `--fresh` deletes it whole. Compared
    /// with links resolved; a `--workdir` that is a link to nothing is refused too.
    ///
    /// # Errors
    /// If the store or the work directory is inside one of them.
    pub fn check_places(&self) -> Result<()> {
        if let Ok(target) = std::fs::read_link(&self.workdir)
            && let Err(followed) = std::fs::metadata(&self.workdir)
        {
            if followed.kind() != std::io::ErrorKind::NotFound {
                // A loop of links, a directory that cannot be searched: the system's words.
                bail!(
                    "--workdir {} is a symbolic link to {}, which cannot be followed ({followed}): \
                     name another --workdir",
                    self.workdir.display(),
                    target.display()
                );
            }
            bail!(
                "--workdir {} is a symbolic link to {}, which does not exist: create that \
                 directory, or name another --workdir",
                self.workdir.display(),
                target.display()
            );
        }
        let workdir = resolved(&self.workdir);
        let default = self.workdir.join(crate::project::STORE_FILE);
        // The work directory first: the default store is inside it.
        let checks = [
            (
                "--workdir",
                &self.workdir,
                "name a directory outside it".to_owned(),
            ),
            (
                "--store",
                &self.store,
                format!(
                    "put the store elsewhere (the default is {})",
                    default.display()
                ),
            ),
        ];
        for (flag, given, hint) in checks {
            let path = resolved(given);
            let homes = path
                .ancestors()
                .skip(1)
                .filter(|dir| *dir == workdir || dir.join(MARKER).is_file());
            for home in homes {
                for (what, dir) in Paths::new(home.to_path_buf(), None, None).built() {
                    ensure!(
                        !path.starts_with(&dir),
                        "{flag} {} is inside {what} {}, which this example builds and clears: \
                         {hint}",
                        given.display(),
                        dir.display()
                    );
                }
                // (A store in another work directory is its store, or one a run of it
                // records: the run's own check names that better, once the store is open.)
                ensure!(
                    home == workdir || flag == "--store",
                    "{flag} {} is inside another work directory, {}, which `--fresh` there \
                     deletes whole: {hint}",
                    given.display(),
                    home.display()
                );
            }
        }
        Ok(())
    }

    /// The other work directory the store is in, if it is in one (marked, not this one): its
    /// runs are recorded there, and `--fresh` here must not delete them.
    pub fn store_elsewhere(&self) -> Option<PathBuf> {
        let workdir = resolved(&self.workdir);
        resolved(&self.store)
            .ancestors()
            .skip(1)
            .find(|dir| *dir != workdir && dir.join(MARKER).is_file())
            .map(Path::to_path_buf)
    }

    /// `options` with the attributes that record where a new run works
    /// ([`WORKDIR_ID_ATTRIBUTE`], [`WORKDIR_ATTRIBUTE`], [`REPO_ATTRIBUTE`]): written with its
    /// first record, so a run never exists without them, and a start stopped before its run
    /// began binds nothing.
    ///
    /// # Errors
    /// If the work directory's marker cannot be read, or holds no id (it is
    /// [`mark`](Self::mark)ed before a run starts).
    pub fn recorded_in(&self, options: StartOptions) -> Result<StartOptions> {
        let text = |path: &Path| path.to_string_lossy().into_owned();
        let id = self
            .workdir_id()?
            .with_context(|| format!("{} has no id in its {MARKER}", self.workdir.display()))?;
        let options = options
            .attribute(WORKDIR_ID_ATTRIBUTE, id)
            .attribute(WORKDIR_ATTRIBUTE, text(&self.workdir));
        Ok(match self.repo_given {
            true => options.attribute(REPO_ATTRIBUTE, text(&self.repo)),
            false => options,
        })
    }

    /// Refuses a new run `run_id` (not in this store) whose work branch the work directory's
    /// remote has already: pushed by a run of that id recorded in another store (one the
    /// work directory recorded its runs in until it was moved away), in a store deleted or
    /// replaced since, or in this one and pruned since. The new run would push onto it and
    /// take that run's pull request as its own (the forge's idempotency key), and that run,
    /// resumed, the new one's.
    ///
    /// # Errors
    /// If the remote has the branch, or git fails.
    async fn check_new_run(&self, run_id: &str) -> Result<()> {
        if !self.remote.exists() {
            return Ok(());
        }
        let branch = crate::agent::work_branch(run_id);
        let pushed = Git::new(&self.remote)
            .resolve(&format!("refs/heads/{branch}"))
            .await?;
        ensure!(
            pushed.is_none(),
            "run {run_id} is not in the store {}, but the remote {} has its branch {branch}, \
             pushed by a run {run_id} of another store, of one deleted or replaced since, or of \
             this one and removed from it since (`loops prune`): a new run would take that \
             run's pull request as its own; go on with the store that records it, or use \
             another --run-id (or --fresh to start this work directory over)",
            self.store.display(),
            self.remote.display()
        );
        Ok(())
    }

    /// Settles where the run with `attributes` (`None`: it does not exist yet) works.
    ///
    /// A new run works where it is told. A run that exists goes on where it started: in
    /// another work directory than its own (or a copy of it) it is refused, its remote and
    /// forge being elsewhere; so is a `--repo` naming another repository than its own (unless
    /// its own is gone: moved, and `--repo` names its new place), and without `--repo` its
    /// own is used ([`repo_recorded`](Self::repo_recorded)). A run that
    /// records neither (started by an earlier version of this example) uses what it is given,
    /// as it did.
    ///
    /// # Errors
    /// If the run started in another work directory or on another repository than `--repo`
    /// names, the work directory's marker cannot be read, or the run's recorded repository is
    /// no longer a git work tree.
    pub async fn settle_run(
        &mut self,
        run_id: &str,
        attributes: Option<&Attributes>,
    ) -> Result<()> {
        let Some(attributes) = attributes else {
            return self.check_new_run(run_id).await;
        };
        let text = |key: &str| match attributes.get(key) {
            Some(AttributeValue::Str(text)) => Some(text.as_str()),
            _ => None,
        };
        let Some(id) = text(WORKDIR_ID_ATTRIBUTE) else {
            return Ok(());
        };
        let here = self.workdir_id()?;
        if here.as_deref() != Some(id) {
            let started = text(WORKDIR_ATTRIBUTE).unwrap_or("(not recorded)");
            let marker = self.workdir.join(MARKER);
            ensure!(
                !same_dir(Path::new(started), &self.workdir),
                "run {run_id} started in this work directory, {}, but its marker {} holds {} \
                 instead of the id the run recorded, {id} (the file was edited or replaced): \
                 write {id} back into it to go on",
                self.workdir.display(),
                marker.display(),
                here.map_or_else(|| "no id".to_owned(), |here| format!("the id {here}"))
            );
            bail!(
                "run {run_id} works in the work directory it started in, {started} (its remote \
                 and forge are there); --workdir {} is another: pass --workdir {started} (or a \
                 copy of it), or use another --run-id",
                self.workdir.display()
            );
        }
        let hint = "leave --repo out to go on with it, or use another --run-id";
        match (text(REPO_ATTRIBUTE).map(PathBuf::from), self.repo_given) {
            // The recorded repository is gone (moved): `--repo` names where it went, which
            // must hold the run's commits ([`check_holds`]).
            (Some(repo), true) if !repo.exists() => {
                say!(
                    "repo:   {} (given with --repo; the run's repository {} is gone)",
                    self.repo.display(),
                    repo.display()
                );
            }
            (Some(repo), true) if !same_dir(&repo, &self.repo) => bail!(
                "run {run_id} works on the repository {}; --repo {} is another: {hint}",
                repo.display(),
                self.repo.display()
            ),
            (Some(_), true) | (None, false) => {}
            (Some(repo), false) => {
                check_repo(&repo).await.with_context(|| {
                    format!(
                        "run {run_id} works on the repository recorded for it (moved? name its \
                         new place with --repo)"
                    )
                })?;
                self.repo = repo;
                self.repo_given = true;
                self.repo_recorded = true;
            }
            // `--repo` naming the demo's repository itself is no other one.
            (None, true) if same_dir(&self.workdir.join("repo"), &self.repo) => {
                self.repo_given = false;
            }
            (None, true) => bail!(
                "run {run_id} works on the demo's repository {}; --repo {} is another: {hint}",
                self.workdir.join("repo").display(),
                self.repo.display()
            ),
        }
        Ok(())
    }
}

/// Checks that the repository holds `head`, the last commit the run `run_id`'s state holds
/// (`None`: none yet, or none any more, in a terminal state), and, if the run recorded its push (`pushed`), that the remote
/// holds its work branch: a copy of the work directory made before the run did either has
/// the run's id but not what the run did since (its push, or its pull request, would fail).
///
/// # Errors
/// If the repository lacks `head` or the remote the branch, or git fails.
pub async fn check_holds(
    paths: &Paths,
    run_id: &str,
    head: Option<&str>,
    pushed: bool,
) -> Result<()> {
    if let Some(head) = head {
        let found = Git::new(&paths.repo)
            .resolve(&format!("{head}^{{commit}}"))
            .await?;
        // The demo's repository is the work directory's; a repository of the user's is not.
        let why = if paths.repo_given {
            "was it re-cloned or reset since? restore the commit there, or start over with \
             --fresh or another --run-id"
        } else {
            "is this work directory a copy made before the run made it? go on in the work \
             directory the run made it in"
        };
        ensure!(
            found.is_some(),
            "run {run_id} made commit {head}, which the repository {} lacks ({why})",
            paths.repo.display()
        );
    }
    if !pushed {
        return Ok(());
    }
    let branch = crate::agent::work_branch(run_id);
    let remote = Git::new(&paths.remote)
        .resolve(&format!("refs/heads/{branch}"))
        .await?;
    ensure!(
        remote.is_some(),
        "run {run_id} pushed its branch {branch}, which the remote {} lacks (is this work \
         directory a copy made before the run pushed?): go on in the work directory the run \
         pushed from",
        paths.remote.display()
    );
    Ok(())
}

/// Refuses a `--workdir`, `--store` or `--repo` that is not valid UTF-8, holds a line break
/// or a `..` after a directory that does not exist, a `--workdir` that is a file, and a
/// `--store` that is a URL (a file is meant).
///
/// # Errors
/// If one is.
pub fn check_given(cli: &Cli) -> Result<()> {
    for (flag, path) in [
        ("--workdir", Some(&cli.workdir)),
        ("--store", cli.store.as_ref()),
        ("--repo", cli.repo.as_ref()),
    ] {
        let Some(path) = path else { continue };
        let Some(text) = path.to_str() else {
            bail!("{flag} {path:?} is not valid UTF-8; this example needs UTF-8 paths");
        };
        // The work directory records its store's path and its own one a line each.
        ensure!(
            !text.contains(['\n', '\r']),
            "{flag} {text:?} holds a line break; this example needs paths without one"
        );
        // `a/missing/../x` is `a/x` to no system call: making it would make `a/missing` too.
        let mut before = PathBuf::new();
        for part in path.components() {
            if part == std::path::Component::ParentDir && !before.as_os_str().is_empty() {
                ensure!(
                    before.is_dir(),
                    "{flag} {}: {} is not a directory, so `..` after it names nothing; \
                     name the path without it",
                    path.display(),
                    before.display()
                );
            }
            before.push(part);
        }
    }
    // Else its files would be read through a file: "Not a directory".
    let nearest = (cli.workdir.ancestors())
        .find(|dir| !dir.as_os_str().is_empty() && dir.exists())
        .filter(|dir| !dir.is_dir());
    if let Some(file) = nearest {
        ensure!(
            file != cli.workdir,
            "--workdir {} is a file, not a directory: name a new or empty directory, or one \
             this example made",
            cli.workdir.display()
        );
        bail!(
            "--workdir {}: {} is a file, not a directory",
            cli.workdir.display(),
            file.display()
        );
    }
    // A URL would be taken for a relative path (`postgres:/host/db` under the current
    // directory): the `loops` CLI takes `postgres://` stores, this example only files.
    if let Some(store) = cli.store.as_ref().and_then(|p| p.to_str())
        && let Some((scheme, _)) = store.split_once("://")
    {
        bail!(
            "--store {store:?} is a {scheme}:// URL; this example runs on an embedded store file only (a PostgreSQL store is for programs of your own: docs/postgres.md)"
        );
    }
    Ok(())
}

/// Refuses the run `cli` names if it is not a deliver run, and settles where it works
/// ([`Paths::settle_run`]).
///
/// # Errors
/// If the run is of another workflow, works elsewhere, or the store cannot be read.
pub async fn settle_run(cli: &Cli, paths: &mut Paths, store: &dyn loops::Store) -> Result<()> {
    let Some(info) = store.run_info(&cli.run_id).await? else {
        // Approving or retrying a run that is not there would start a new one: most likely
        // the store or the id is not the one meant.
        ensure!(!cli.approve && !cli.retry, no_such_run(cli, &paths.store));
        return paths.settle_run(&cli.run_id, None).await;
    };
    if info.workflow != <crate::workflow::v2::Deliver as loops::Workflow>::NAME {
        // A child run (`deliver-1/edit-0`, of `deliver-edit`) or another program's run: its
        // parent drives it, and driving it as a deliver run would only be refused later for
        // a schema mismatch, a reason that misleads.
        bail!(
            "run {} is a run of the workflow {:?}, not a deliver run; pass the id of a deliver \
             run to --run-id (`loops --store {} runs` lists the runs and their workflows)",
            cli.run_id,
            info.workflow,
            paths.store.display()
        );
    }
    let attributes = store.attributes(&cli.run_id).await?;
    paths.settle_run(&cli.run_id, Some(&attributes)).await
}

/// The refusal of `--approve` or `--retry` (whichever `cli` has) for a run that is not in
/// `store`.
pub fn no_such_run(cli: &Cli, store: &Path) -> String {
    let (flag, verb) = if cli.approve {
        ("--approve", "approve")
    } else {
        ("--retry", "retry")
    };
    format!(
        "{flag}: there is no run {} in {} to {verb} (check --store and --run-id; a new run \
         starts without {flag})",
        cli.run_id,
        store.display()
    )
}
