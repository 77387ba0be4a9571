//! Verifying a store file that must not be written: redb's integrity check, run on a view of
//! the file whose writes stay in memory.
//!
//! redb verifies a file's checksums only on a writable handle (`Database::check_integrity`,
//! or an open with `set_check_integrity_on_open`): a read-only open trusts the pages it reads.
//! [`verify_file`] gives redb a storage backend that reads the file and keeps every write
//! (the allocator state the check rebuilds, the commit that records it) in memory, so that
//! the check reads every page of the committed trees and the file keeps its bytes.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// redb's page cache during the check (its default is 1 GiB, which the check would fill with
/// pages it reads once).
const CACHE: usize = 16 << 20;

/// The granularity of the in-memory copy of written bytes.
const BLOCK: u64 = 4096;

/// Verifies the checksum of every page of the committed trees of the file at `path`, without
/// writing to it. `Ok(())` if redb finds the file intact; otherwise the error redb reports, or
/// [`redb::StorageError::Corrupted`] if the check had to repair it (a page, or the allocator
/// state, that does not match the file). A file that a crash left (not closed cleanly) is
/// repaired by the view's open first, as any open of it repairs it, and that result is
/// checked.
///
/// The caller must keep other writers away (a read-only redb handle on the file does).
pub(crate) fn verify_file(path: &Path) -> Result<(), redb::Error> {
    let file = File::open(path).map_err(redb::Error::Io)?;
    let backend = Overlay::new(file).map_err(redb::Error::Io)?;
    let answered = Arc::clone(&backend.answered);
    let caught = crate::panics::catch(|| -> Result<bool, redb::Error> {
        let mut db = redb::Database::builder()
            // The check reads every page once: a small cache is enough.
            .set_cache_size(CACHE)
            .create_with_backend(backend)?;
        let intact = db.check_integrity()?;
        // redb's close would record the allocator state in a commit to the view, which is
        // dropped with it: half of the check's CPU for a small file. A backend that refuses
        // every access from here makes the close skip it (it writes nothing after an I/O
        // error). The answer is already taken; only the close sees the refusals.
        answered.store(true, Ordering::Release);
        drop(db);
        Ok(intact)
    });
    match caught {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => Err(redb::Error::Corrupted(
            "a committed page or redb's allocator state does not match the file; redb would have to repair it".to_owned(),
        )),
        // A damaged page number can point past the end of the file.
        Ok(Err(redb::Error::Io(io))) if io.kind() == std::io::ErrorKind::UnexpectedEof => Err(
            redb::Error::Corrupted("the file ends before data a page refers to".to_owned()),
        ),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(redb::Error::Corrupted(
            "redb panicked while verifying the file: the file is damaged".to_owned(),
        )),
    }
}

/// Opens the file at `path` (for reading only) as a storage backend whose writes stay in
/// memory: what [`RedbStore::open_repaired_in_memory`](super::RedbStore::open_repaired_in_memory)
/// reads through.
pub(crate) fn overlay(path: &Path) -> std::io::Result<Overlay> {
    Overlay::new(File::open(path)?)
}

/// The file as redb sees it through this backend: its bytes, overlaid by what redb wrote.
#[derive(Debug)]
pub(crate) struct Overlay {
    state: Mutex<State>,
    /// Set once [`verify_file`] has its answer: every access fails from then on.
    answered: Arc<AtomicBool>,
}

#[derive(Debug)]
struct State {
    file: File,
    /// The bytes of the file that still show through (it is never written).
    file_len: u64,
    /// The length redb sees.
    len: u64,
    /// Blocks redb wrote, by number.
    written: HashMap<u64, Vec<u8>>,
}

impl Overlay {
    fn new(file: File) -> std::io::Result<Self> {
        let file_len = file.metadata()?.len();
        Ok(Overlay {
            state: Mutex::new(State {
                file,
                file_len,
                len: file_len,
                written: HashMap::new(),
            }),
            answered: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The state, unless the check has answered: then the error every access gets.
    fn state(&self) -> std::io::Result<std::sync::MutexGuard<'_, State>> {
        if self.answered.load(Ordering::Acquire) {
            return Err(std::io::Error::other(
                "the verification has answered: the view is closed",
            ));
        }
        Ok(self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl State {
    /// Reads `out.len()` bytes of the file at `offset`, zeros past its end.
    fn read_file(&mut self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        out.fill(0);
        if offset >= self.file_len {
            return Ok(());
        }
        let n = usize::try_from((self.file_len - offset).min(out.len() as u64))
            .map_err(std::io::Error::other)?;
        read_at(&self.file, offset, &mut out[..n])
    }

    /// The written block `block`, copied from the file first if it is new.
    fn block(&mut self, block: u64) -> std::io::Result<&mut Vec<u8>> {
        if !self.written.contains_key(&block) {
            let mut bytes = vec![0; BLOCK as usize];
            self.read_file(block * BLOCK, &mut bytes)?;
            self.written.insert(block, bytes);
        }
        self.written
            .get_mut(&block)
            .ok_or_else(|| std::io::Error::other("a written block vanished"))
    }
}

/// Reads `out.len()` bytes of `file` at `offset`: one `pread` where there is one (the check
/// reads every page of the file through here).
#[cfg(unix)]
fn read_at(file: &File, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, out, offset)
}

#[cfg(not(unix))]
fn read_at(mut file: &File, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(out)
}

fn out_of_range() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "read past the end of the file",
    )
}

impl redb::StorageBackend for Overlay {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.state()?.len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let mut state = self.state()?;
        let end = offset
            .checked_add(out.len() as u64)
            .ok_or_else(out_of_range)?;
        if end > state.len {
            return Err(out_of_range());
        }
        state.read_file(offset, out)?;
        if state.written.is_empty() {
            return Ok(());
        }
        for block in offset / BLOCK..end.div_ceil(BLOCK) {
            let Some(bytes) = state.written.get(&block) else {
                continue;
            };
            let start = (block * BLOCK).max(offset);
            let stop = ((block + 1) * BLOCK).min(end);
            let from = (start - block * BLOCK) as usize..(stop - block * BLOCK) as usize;
            let to = (start - offset) as usize..(stop - offset) as usize;
            out[to].copy_from_slice(&bytes[from]);
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        let mut state = self.state()?;
        if len < state.len {
            // Bytes past the new end read as zeros if the length grows again.
            state.file_len = state.file_len.min(len);
            state.written.retain(|&block, _| block * BLOCK < len);
            if let Some(bytes) = state.written.get_mut(&(len / BLOCK)) {
                bytes[(len % BLOCK) as usize..].fill(0);
            }
        }
        state.len = len;
        Ok(())
    }

    fn sync_data(&self) -> std::io::Result<()> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut state = self.state()?;
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(out_of_range)?;
        for block in offset / BLOCK..end.div_ceil(BLOCK) {
            let start = (block * BLOCK).max(offset);
            let stop = ((block + 1) * BLOCK).min(end);
            let bytes = state.block(block)?;
            bytes[(start - block * BLOCK) as usize..(stop - block * BLOCK) as usize]
                .copy_from_slice(&data[(start - offset) as usize..(stop - offset) as usize]);
        }
        state.len = state.len.max(end);
        Ok(())
    }
}

impl crate::Error {
    /// Whether this error reports damage to a redb store file: at an open
    /// ([`Error::Open`](crate::Error::Open)) or a read or commit
    /// ([`Error::Storage`](crate::Error::Storage)), redb found a page whose checksum does not
    /// match, a file shorter than the layout its header records, or bytes it cannot read as
    /// its own. `false` for every other error (a lock, a missing file, permissions, a full
    /// disk, an error of another store). Trying again does not help a damaged file: `loops
    /// check` verifies it, and a backup restores it.
    pub fn is_store_damage(&self) -> bool {
        match self {
            crate::Error::Open { cause, .. } => crate::error::text::is_damage(&**cause),
            crate::Error::Storage { cause, .. } => crate::error::text::is_damage(&**cause),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::store::RedbStore;

    /// The check answers for an intact file, closed or left open as by a crash, and for a
    /// damaged one, and never writes to it; its view refuses every access once it has
    /// answered (so that redb's close commits nothing to it).
    #[test]
    fn the_check_answers_writes_nothing_and_closes_its_view() {
        use redb::StorageBackend as _;

        let dir = tempfile::tempdir().unwrap();
        let closed = dir.path().join("closed.redb");
        drop(RedbStore::open(&closed).unwrap());
        let left_open = dir.path().join("left-open.redb");
        let held = RedbStore::open(&left_open).unwrap();
        let image = std::fs::read(&left_open).unwrap();
        drop(held);
        std::fs::write(&left_open, &image).unwrap();
        for path in [&closed, &left_open] {
            let before = std::fs::read(path).unwrap();
            super::verify_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(std::fs::read(path).unwrap(), before, "{}", path.display());
        }

        let damaged = dir.path().join("damaged.redb");
        let mut bytes = std::fs::read(&closed).unwrap();
        let len = bytes.len();
        bytes[len / 2..].fill(0x5a);
        std::fs::write(&damaged, &bytes).unwrap();
        let err = super::verify_file(&damaged).unwrap_err();
        assert_eq!(std::fs::read(&damaged).unwrap(), bytes, "{err}");

        let view = super::overlay(&closed).unwrap();
        let mut page = [0u8; 16];
        view.read(0, &mut page).unwrap();
        assert_eq!(view.len().unwrap(), len as u64);
        view.answered
            .store(true, std::sync::atomic::Ordering::Release);
        assert!(view.read(0, &mut page).is_err());
        assert!(view.write(0, &page).is_err());
        assert!(view.len().is_err());
        assert!(view.set_len(0).is_err());
    }

    /// A truncated store is damage; a locked store and a file that is not redb's are not.
    #[test]
    fn damage_is_told_from_a_lock_and_a_foreign_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.redb");
        drop(RedbStore::open(&path).unwrap());
        let held = RedbStore::open(&path).unwrap();
        let locked = RedbStore::open(&path).map(drop).unwrap_err();
        assert!(matches!(locked, Error::StoreLocked { .. }), "{locked:?}");
        assert!(!locked.is_store_damage());
        drop(held);

        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        let truncated = RedbStore::open(&path).map(drop).unwrap_err();
        assert!(matches!(truncated, Error::Open { .. }), "{truncated:?}");
        assert!(truncated.is_store_damage(), "{truncated:?}");
        // Its message says what to do (helper-128: the CLI's did, the library's did not).
        let advice = format!(
            "; the file is damaged (nothing was written to it): `loops --store {} check` \
             verifies every page of it, and a backup restores it",
            path.display()
        );
        let said = truncated.to_string();
        assert!(said.starts_with(&format!("cannot open store {}: ", path.display())));
        assert!(said.ends_with(&advice), "{said}");

        let foreign = dir.path().join("notes.txt");
        std::fs::write(
            &foreign,
            "not a store, and long enough to hold a header ".repeat(100),
        )
        .unwrap();
        let refused = RedbStore::open(&foreign).map(drop).unwrap_err();
        assert!(matches!(refused, Error::Open { .. }), "{refused:?}");
        assert!(!refused.is_store_damage(), "{refused}");
        assert!(!refused.to_string().contains("damaged"), "{refused}");
    }
}
