//! Which store a work directory's runs are recorded in. A run's remote branch, its pull
//! request and the demo's repository are its work directory's; its record is its store's. A
//! run of another store driven in the same work directory would push its branch and file its
//! pull request beside theirs, under the same run ids: a run id of theirs would find their
//! pull request as its own (the forge's idempotency key), its approval gate passed by another
//! run. So the work directory names its store ([`STORE_BINDING`]), and a run of any other
//! store is refused there, new or not.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::place::resolved;
use crate::project::{Paths, write_durably};

/// The file in a work directory that names the store its runs are recorded in, written
/// when a run is driven there ([`Paths::bind_store`]): two lines, the store (symbolic links
/// resolved; relative to the work directory if inside it, so that a copy of the work
/// directory names its own store) and the work directory it was written in (resolved: a
/// store outside names the runs of that directory, not of a copy of it restored elsewhere).
pub const STORE_BINDING: &str = ".loops-deliver-store";

/// A work directory's binding, as read from its [`STORE_BINDING`].
struct Binding {
    /// The store, absolute (as resolved when written).
    store: PathBuf,
    /// Whether it was written in this directory, or names a store inside it: `false` in a
    /// copy (or a move) of the work directory whose store is outside, where it binds nothing.
    here: bool,
}

impl Paths {
    /// The binding's text for this store: see [`STORE_BINDING`].
    ///
    /// # Errors
    /// If a path is not valid UTF-8, or holds a line break.
    fn binding_text(&self) -> Result<String> {
        let workdir = resolved(&self.workdir);
        let store = resolved(&self.store);
        let store = store.strip_prefix(&workdir).unwrap_or(&store);
        let text = |path: &Path| {
            let text = path
                .to_str()
                .with_context(|| format!("{} is not valid UTF-8", path.display()))?;
            // A line of the binding each: a line break would cut the path.
            anyhow::ensure!(
                !text.contains(['\n', '\r']),
                "{text:?} holds a line break; this example needs paths without one"
            );
            Ok::<_, anyhow::Error>(text.to_owned())
        };
        Ok(format!("{}\n{}\n", text(store)?, text(&workdir)?))
    }

    /// The work directory's binding, if it has one.
    ///
    /// # Errors
    /// If it cannot be read, or names no store (damaged).
    fn binding(&self) -> Result<Option<Binding>> {
        let path = self.workdir.join(STORE_BINDING);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let mut lines = text.lines();
        // Written whole or not at all ([`write_durably`]): an empty store line is an edit,
        // which names no store to keep the work directory's runs apart by.
        let Some(store) = lines.next().filter(|line| !line.trim().is_empty()) else {
            bail!(
                "{} is damaged (it names no store): it names the store that records this work \
                 directory's runs; write that store's path on its first line (or delete the \
                 file if that store is gone)",
                path.display()
            );
        };
        let store = Path::new(store);
        // Without the directory it was written in (written so by hand), it is of this one.
        let here = store.is_relative()
            || lines
                .next()
                .is_none_or(|written| Path::new(written) == resolved(&self.workdir));
        Ok(Some(Binding {
            store: self.workdir.join(store),
            here,
        }))
    }

    /// Whether this work directory's runs were recorded in this very store (its binding names
    /// it), which is gone (moved or deleted): a store made at its path knows none of them.
    ///
    /// # Errors
    /// If the binding cannot be read, or a path is not valid UTF-8.
    pub fn bound_store_gone(&self) -> Result<bool> {
        if self.store.exists() {
            return Ok(false);
        }
        let path = self.workdir.join(STORE_BINDING);
        let text = self.binding_text()?;
        Ok(std::fs::read_to_string(&path).is_ok_and(|recorded| recorded == text))
    }

    /// The store other than this one that this work directory's runs are recorded in: bound
    /// here ([`Binding::here`]) and still there.
    ///
    /// # Errors
    /// If the binding cannot be read.
    fn other_store(&self) -> Result<Option<PathBuf>> {
        Ok(self
            .binding()?
            .filter(|b| b.here && b.store.exists() && !same_store(&b.store, &self.store))
            .map(|b| b.store))
    }

    /// Takes the work directory for the run `run_id` of this store: its lock
    /// ([`lock`](Self::lock)), its marker ([`mark`](Self::mark)) and its binding
    /// ([`bind_store`](Self::bind_store)).
    ///
    /// The store's lock and the work directory's are then this process's: what an earlier
    /// process left in the work directory is not in use. The directory is this process's
    /// too, and marked so: a `--fresh` of another process that deleted it (marker included)
    /// before this one took the lock, as this one made it, left it without its marker, which
    /// neither a rerun nor `--fresh` would then touch.
    ///
    /// # Errors
    /// If another process holds the work directory, another store records its runs, or its
    /// files cannot be read or written.
    pub async fn take_for(&mut self, run_id: &str) -> Result<()> {
        if let crate::workdir::Taken::Gone = self.lock().await? {
            bail!(
                "work directory {} was removed by another process while this `deliver` \
                 started: run the command again",
                self.workdir.display()
            );
        }
        self.mark()?;
        self.bind_store(run_id)
    }

    /// Records that this work directory's runs are recorded in this store, before the run
    /// `run_id` is driven in it (new or not); the caller holds the work directory's lock. A
    /// work directory whose runs another store records (still there) is refused. A binding
    /// whose store is gone, or of the directory this one is a copy of, is replaced, and said;
    /// one that names this store by another name (a hard link) is kept.
    ///
    /// # Errors
    /// If another store records this work directory's runs, or the binding cannot be read or
    /// written.
    fn bind_store(&self, run_id: &str) -> Result<()> {
        self.refuse_other_store(run_id)?;
        let path = self.workdir.join(STORE_BINDING);
        let text = self.binding_text()?;
        if std::fs::read_to_string(&path).is_ok_and(|recorded| recorded == text) {
            return Ok(());
        }
        match self.binding()? {
            // The same file under another name (a hard link): the binding keeps the name it
            // has, so that removing this one leaves the store bound.
            Some(b) if b.here && b.store.exists() && same_store(&b.store, &self.store) => {
                return Ok(());
            }
            Some(b) if !b.store.exists() => say!(
                "work directory {} recorded its runs in the store {}, which is gone: they are \
                 recorded in {} from now",
                self.workdir.display(),
                b.store.display(),
                self.store.display()
            ),
            Some(b) if !b.here && !same_store(&b.store, &self.store) => say!(
                "work directory {} is a copy of another, whose runs the store {} records: its \
                 own are recorded in {} from now",
                self.workdir.display(),
                b.store.display(),
                self.store.display()
            ),
            _ => {}
        }
        write_durably(&path, text.as_bytes(), true).map(drop)
    }

    /// Refuses the run `run_id` of this store in a work directory whose runs another store
    /// records: see [`bind_store`](Self::bind_store). Checked first before anything is written
    /// in the work directory, and again under its lock.
    ///
    /// # Errors
    /// If another store records its runs, or the binding is damaged or cannot be read.
    pub fn refuse_other_store(&self, run_id: &str) -> Result<()> {
        if let Some(other) = self.other_store()? {
            bail!(
                "work directory {} holds the runs of the store {} (their remote branches and \
                 pull requests are there); run {run_id} of --store {} would work beside them: \
                 pass --store {}, or name another --workdir (nothing was done)",
                self.workdir.display(),
                other.display(),
                self.store.display(),
                other.display()
            );
        }
        Ok(())
    }

    /// Refuses `--fresh` with this store in a work directory whose runs another store
    /// records ([`bind_store`](Self::bind_store)): deleting the work directory (their remote,
    /// forge and repository, and that store if it is inside) would strand or delete them.
    ///
    /// # Errors
    /// If another store records its runs, or the binding cannot be read.
    pub fn check_fresh(&self) -> Result<()> {
        let Some(other) = self.other_store()? else {
            return Ok(());
        };
        bail!(
            "--fresh: work directory {} holds the runs of the store {}; --fresh with --store {} \
             deletes their work directory (and a store inside it): pass --store {} to start \
             over there, or name another --workdir (nothing was deleted)",
            self.workdir.display(),
            other.display(),
            self.store.display(),
            other.display()
        )
    }
}

/// Whether `a` and `b` are one store file: the same path once links are resolved, or one file
/// under two names (a hard link: the same device and inode).
fn same_store(a: &Path, b: &Path) -> bool {
    if resolved(a) == resolved(b) {
        return true;
    }
    #[cfg(unix)]
    if let (Ok(a), Ok(b)) = (std::fs::metadata(a), std::fs::metadata(b)) {
        return crate::project::same_inode(&a, &b);
    }
    false
}
