//! Making the work directory and taking it for this process. Nothing is written in a work
//! directory by a process that does not hold its lock (`<workdir>/.loops-deliver-workdir.lock`):
//! a new one is built whole beside its place, its lock taken there, and renamed into place
//! (so it appears held); one that exists, or that another process has just put in place, is
//! written to (the run's approval wish, the marker) only once its lock is taken. Two starts
//! with two stores on one new work directory thus never write, or delete, each other's wish.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};

use crate::project::{MARKER, Paths, made_here, new_workdir_id, sync_dir, write_durably};

/// How long a work directory held by another process is waited for (as a locked store is:
/// [`open_store`](crate::store::open_store)), and how often it is looked at meanwhile.
const LOCK_WAIT: Duration = Duration::from_secs(2);
const LOCK_PAUSE: Duration = Duration::from_millis(50);

/// How many times a start makes its work directory again when the one it waited for was
/// removed meanwhile (by another start, refused, taking back what it made).
const MAKE_TRIES: u32 = 5;

/// What [`Paths::lock`] found.
pub enum Taken {
    /// The work directory is this process's until `Paths::held` is dropped.
    Held,
    /// The work directory is gone (another process removed it while this one waited).
    Gone,
}

impl Paths {
    /// Creates the work directory, its marker and what `--auto-approve` (`auto_approve`) asks
    /// of the run `run_id` ([`approval::remember_asked`](crate::approval::remember_asked)),
    /// takes its lock ([`lock`](Self::lock)), and returns the topmost directory it made (the
    /// work directory, or a missing parent of it; `None` if the work directory existed, or
    /// another process made it), for [`remove_new_workdir`](Self::remove_new_workdir).
    /// Nothing else in it is touched: that waits for the store's lock
    /// ([`clear_leftovers`](Self::clear_leftovers)).
    ///
    /// The wish comes first, before anything of the run is made: a new directory is built
    /// whole beside its place (`<workdir>.new-<pid>`: the wish, the wishes kept beside it by
    /// a `--fresh` killed after moving the old directory aside or by a start killed before
    /// its rename, the marker, the lock taken) and renamed into it, so that a kill leaves the
    /// wish in one of those places; in a directory that exists, or that another process put
    /// in place first, the wish is written once its lock is taken and its binding checked
    /// ([`refuse_other_store`](Self::refuse_other_store)).
    ///
    /// # Errors
    /// If the directory cannot be created; exists, is not empty and was not made by this
    /// example (so that `--fresh` never deletes a directory of the user's); is held by
    /// another process after 2 s ([`lock`](Self::lock)); records the runs of another store.
    pub async fn create_workdir(
        &mut self,
        run_id: &str,
        auto_approve: Option<bool>,
    ) -> Result<Option<PathBuf>> {
        for _ in 0..MAKE_TRIES {
            if !self.workdir.exists() {
                self.wait_while_made_elsewhere().await?;
            }
            let existed = self.workdir.exists();
            if existed && !self.is_ours()? {
                bail!(
                    "{} is not empty and is not a work directory of this example (no {MARKER} \
                     in it); name a new or empty directory with --workdir (or, if its marker \
                     was deleted, write into {MARKER} the `workdir_id` its runs record: `loops \
                     --store STORE show RUN`)",
                    self.workdir.display()
                );
            }
            if !existed {
                let made = self
                    .workdir
                    .ancestors()
                    .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
                    .last()
                    .map(Path::to_path_buf);
                if let Some(lock) = self.build_workdir(run_id, auto_approve)? {
                    self.held = Some(Arc::new(lock));
                    return Ok(made);
                }
            }
            // Another process's directory, made before or a moment ago.
            if let Taken::Held = self.lock().await? {
                self.refuse_other_store(run_id)?;
                crate::approval::remember_asked(&self.workdir, run_id, auto_approve)?;
                self.mark()?;
                return Ok(None);
            }
        }
        bail!(
            "work directory {} was made and removed again {MAKE_TRIES} times while this \
             `deliver` started: are other `deliver`s starting there?",
            self.workdir.display()
        )
    }

    /// Builds a new work directory beside its place, takes its lock and renames it into place:
    /// see [`create_workdir`](Self::create_workdir). Returns the lock, held, if this
    /// process's directory was put in place; `None` if another process's was put there first
    /// (this one's is dropped).
    fn build_workdir(&self, run_id: &str, auto_approve: Option<bool>) -> Result<Option<File>> {
        let parent = self
            .workdir
            .parent()
            .with_context(|| format!("{} has no parent directory", self.workdir.display()))?;
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let building = self.aside("new")?;
        // One left by an earlier process of this id (ids are reused: in a container, a
        // process may have the same one at every start) is built in again, its wishes kept,
        // if it is this example's; any other is not touched.
        if building.exists() {
            ensure!(
                made_here(&building)?,
                "{} is not a directory of this example's, and a new work directory is built \
                 there: move it away",
                building.display()
            );
        } else {
            std::fs::create_dir(&building)
                .with_context(|| format!("cannot create {}", building.display()))?;
        }
        // First, so that another start sees it in use ([`wait_while_made_elsewhere`]); no
        // other process has this file: the lock is taken at once.
        let lock = open_lock(&lock_path(&building))?;
        lock.try_lock()
            .with_context(|| format!("cannot lock {}", lock_path(&building).display()))?;
        let built = (|| {
            // Of an interrupted `--fresh`, and of a start killed before its new directory
            // was renamed into place (whose wish was complete there).
            for aside in self
                .asides("deleting")
                .into_iter()
                .chain(self.asides("new"))
            {
                if aside != building {
                    crate::approval::carry_asked(&aside, &building)?;
                }
            }
            crate::approval::remember_asked(&building, run_id, auto_approve)?;
            write_durably(&building.join(MARKER), new_workdir_id().as_bytes(), true)?;
            crate::hooks::hold_in_setup("new");
            match std::fs::rename(&building, &self.workdir) {
                Ok(()) => sync_dir(parent).map(|()| true),
                // Made by another process meanwhile (not empty: a rename over an empty
                // directory replaces it).
                Err(_) if self.workdir.is_dir() => Ok(false),
                Err(e) => Err(e).with_context(|| {
                    format!(
                        "cannot move {} to {}",
                        building.display(),
                        self.workdir.display()
                    )
                }),
            }
        })();
        let _ = std::fs::remove_dir_all(&building);
        Ok(built?.then_some(lock))
    }

    /// Removes what [`create_workdir`](Self::create_workdir) has just made, up to `made` (the
    /// topmost directory it returned), when the store it was made for was refused: the
    /// marker, the approval asked for the run ([`ASKED_DIR`](crate::approval::ASKED_DIR)), the
    /// lock (held by this process, which made the directory) and each directory once empty,
    /// never anything else (best effort: a directory something was put in stays). A process
    /// waiting for the lock then finds the directory gone, and makes it anew.
    pub fn remove_new_workdir(&self, made: &Path) {
        let _ = std::fs::remove_file(self.workdir.join(MARKER));
        let _ = std::fs::remove_dir_all(self.workdir.join(crate::approval::ASKED_DIR));
        let _ = std::fs::remove_file(lock_path(&self.workdir));
        for dir in self.workdir.ancestors() {
            if std::fs::remove_dir(dir).is_err() || dir == made {
                break;
            }
        }
    }

    /// Takes the work directory for this process, until `self` is dropped: an exclusive lock
    /// on `<workdir>/.loops-deliver-workdir.lock`, waited for up to 2 s (as the store's), and
    /// still the work directory's file once taken (not one that another process removed
    /// meanwhile). Already held: nothing to do. Two `deliver`s with one store are kept apart
    /// by its lock too; with two stores, both would write their approval wishes, build the
    /// demo's repository and clear leftovers in one directory at once.
    ///
    /// # Errors
    /// If another process holds the directory after 2 s (said as a locked store when that
    /// process holds this store: [`store::Locked`](crate::store::Locked)), or the lock file
    /// cannot be opened.
    pub async fn lock(&mut self) -> Result<Taken> {
        let path = lock_path(&self.workdir);
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        loop {
            if self.held.as_deref().is_some_and(|held| is_at(held, &path)) {
                return Ok(Taken::Held);
            }
            self.held = None;
            let file = match open_lock(&path) {
                Ok(file) => file,
                Err(e) if !self.workdir.is_dir() => {
                    tracing::debug!(error = %e, "the work directory went while this start waited");
                    return Ok(Taken::Gone);
                }
                Err(e) => return Err(e),
            };
            match file.try_lock() {
                // Removed (or replaced) while this process waited: looked at again.
                Ok(()) if !is_at(&file, &path) => {}
                Ok(()) => {
                    self.held = Some(Arc::new(file));
                    return Ok(Taken::Held);
                }
                Err(std::fs::TryLockError::WouldBlock)
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(LOCK_PAUSE).await;
                }
                Err(std::fs::TryLockError::WouldBlock) => return Err(self.in_use()),
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("cannot lock {}", path.display()));
                }
            }
        }
    }

    /// Waits, up to 2 s, while another process makes or deletes this work directory: it
    /// holds the lock of a directory beside it, one it builds (`.new-<pid>`) or the work
    /// directory it has moved aside to delete (`.deleting-<pid>`, whose wishes its new one
    /// takes over). Meanwhile the work directory may not exist, and nobody holds it.
    ///
    /// # Errors
    /// If one is still held after 2 s: in use ([`in_use`](Self::in_use)).
    async fn wait_while_made_elsewhere(&self) -> Result<()> {
        let own = [self.aside("new").ok(), self.aside("deleting").ok()];
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        loop {
            let held = ["new", "deleting"]
                .into_iter()
                .flat_map(|kind| self.named_asides(kind))
                .any(|dir| !own.contains(&Some(dir.clone())) && is_held(&dir));
            if !held {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(self.in_use());
            }
            tokio::time::sleep(LOCK_PAUSE).await;
        }
    }

    /// Why the work directory is held by another process: a `deliver` of this very store
    /// (which holds it too) is said as the store's lock is.
    fn in_use(&self) -> anyhow::Error {
        if self.store.exists()
            && let Err(e @ loops::Error::StoreLocked { .. }) =
                loops::RedbStore::open_read_only(&self.store)
        {
            return crate::store::store_error(e);
        }
        anyhow::anyhow!(
            "work directory {} is in use by another `deliver`: wait for it to end, or name \
             another --workdir",
            self.workdir.display()
        )
    }

    /// `--fresh`: takes the lock of the work directory it is about to delete, if there is
    /// one of this example's, so that nothing is written in it (the run's approval wish) nor
    /// deleted while another `deliver` works there. The lock moves aside with the directory,
    /// and is let go once the new one is made ([`create_workdir`](Self::create_workdir)).
    ///
    /// # Errors
    /// As [`lock`](Self::lock) (said as `--fresh`'s).
    pub async fn lock_for_fresh(&mut self) -> Result<()> {
        for _ in 0..MAKE_TRIES {
            if !self.workdir.exists() {
                self.wait_while_made_elsewhere().await.context("--fresh")?;
            }
            // Not one of this example's: `delete` refuses it, with its own reason.
            if !self.workdir.is_dir() || !self.is_ours()? {
                return Ok(());
            }
            if let Taken::Held = self.lock().await.context("--fresh")? {
                return Ok(());
            }
        }
        bail!(
            "--fresh: work directory {} was made and removed again {MAKE_TRIES} times while \
             this `deliver` started (nothing was deleted): are other `deliver`s starting there?",
            self.workdir.display()
        )
    }

    /// Whether this process holds the work directory's lock ([`lock`](Self::lock)).
    pub fn holds_workdir(&self) -> bool {
        self.held
            .as_deref()
            .is_some_and(|held| is_at(held, &lock_path(&self.workdir)))
    }
}

/// The lock file of the work directory `workdir`.
fn lock_path(workdir: &Path) -> PathBuf {
    workdir.join(format!("{MARKER}.lock"))
}

/// Whether a process holds the lock of the work directory `dir` (or of one moved aside, or
/// being built): false if it has no lock file, or its lock is free.
pub fn is_held(dir: &Path) -> bool {
    match File::open(lock_path(dir)) {
        Ok(file) => matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

/// Opens (or creates) the lock file at `path`.
fn open_lock(path: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))
}

/// Whether `file` is the file at `path` still (not one removed, or replaced, since it was
/// opened). Always true where files have no inode numbers to compare.
fn is_at(file: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(open), Ok(named)) => crate::project::same_inode(&open, &named),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (file, path);
        true
    }
}
