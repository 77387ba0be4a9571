//! Lock files git leaves behind.
//!
//! Git takes a lock by creating `<file>.lock` and removes it when done, also when it is
//! stopped by SIGTERM. A git process ended by SIGKILL (the OOM killer, a service manager's
//! last resort), or by a signal that comes before it set up its handlers, leaves the lock
//! behind for good: every later command that needs it fails with `Unable to create
//! '....lock': File exists`, and git says to remove the file by hand. This program removes
//! such a lock itself when it can tell that no git holds it: no git process (a process whose
//! name starts with `git`) has its working directory inside the lock's repository (a git
//! command works in its repository's directory: `git -C`, `git push` to a local path runs
//! `git-receive-pack` there). That is known on Linux only (`/proc`); elsewhere the lock stays
//! and git's message is the error. A lock on a temporary index of this program's own is
//! removed without a check: no other git uses that index.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How old a lock file must be before it can be taken for left behind: a lock a git command
/// has just made is never removed, even if the check of processes missed that command.
const MIN_AGE: Duration = Duration::from_secs(1);

/// Whether git's `stderr` says that a lock file it needed is taken.
pub(super) fn is_lock_error(stderr: &str) -> bool {
    stderr.contains(".lock': File exists")
        || stderr.contains("Unable to create '")
        || stderr.contains("cannot lock ref")
}

/// Whether the lock file git's `stderr` names is that of `index`, a temporary index of this
/// program's own (`GIT_INDEX_FILE`): `index.lock` beside it.
pub(super) fn on_index(stderr: &str, index: Option<&Path>) -> bool {
    let Some(index) = index else {
        return false;
    };
    let mut lock = index.as_os_str().to_owned();
    lock.push(".lock");
    named_lock(stderr).is_some_and(|named| named == Path::new(&lock))
}

/// Removes the lock file git's `stderr` names if no git process can hold it (module docs),
/// and returns its path; `None` if `stderr` names none, the lock is gone, is younger than
/// [`MIN_AGE`], a git works in its repository, or this cannot be known here. `private`: the
/// lock is on a temporary index of this program's own ([`on_index`]), removed without a
/// check.
pub(super) fn remove_left_behind(stderr: &str, private: bool) -> Option<PathBuf> {
    let lock = named_lock(stderr)?;
    if !private {
        let modified = std::fs::metadata(&lock).ok()?.modified().ok()?;
        if modified.elapsed().ok()? < MIN_AGE {
            return None;
        }
        let repository = repository_of(&lock)?;
        if git_works_in(&repository)? {
            return None;
        }
    }
    std::fs::remove_file(&lock).ok()?;
    Some(lock)
}

/// The lock file in git's "Unable to create '<path>': File exists" (a `.lock` file).
fn named_lock(stderr: &str) -> Option<PathBuf> {
    let (_, rest) = stderr.split_once("Unable to create '")?;
    let (path, _) = rest.split_once("': File exists")?;
    path.ends_with(".lock").then(|| PathBuf::from(path))
}

/// The directory of the repository `lock` is in, links resolved: the nearest directory above
/// it that is a git directory (holds `HEAD` and `objects/`), or the work tree holding that
/// directory if it is named `.git`.
fn repository_of(lock: &Path) -> Option<PathBuf> {
    let lock = std::fs::canonicalize(lock).ok()?;
    let git_dir = lock
        .ancestors()
        .skip(1)
        .find(|dir| dir.join("HEAD").is_file() && dir.join("objects").is_dir())?;
    Some(if git_dir.file_name().is_some_and(|n| n == ".git") {
        git_dir.parent()?.to_path_buf()
    } else {
        git_dir.to_path_buf()
    })
}

/// Whether a git process (one whose name starts with `git`: `git`, `git-receive-pack`, ...)
/// has its working directory in `repository` (or below): `None` where that cannot be known.
/// Other processes there (the shell this program was started from, an editor) hold no git
/// lock. Processes whose directory cannot be read (another user's) are not counted: this
/// program's git commands run as its own user.
#[cfg(target_os = "linux")]
fn git_works_in(repository: &Path) -> Option<bool> {
    let processes = std::fs::read_dir("/proc").ok()?;
    Some(processes.flatten().any(|entry| {
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit()));
        is_pid
            && std::fs::read_to_string(entry.path().join("comm"))
                .is_ok_and(|comm| comm.starts_with("git"))
            && std::fs::read_link(entry.path().join("cwd"))
                .is_ok_and(|cwd| cwd.starts_with(repository))
    }))
}

#[cfg(not(target_os = "linux"))]
fn git_works_in(_repository: &Path) -> Option<bool> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUSH_ERROR: &str = "remote: error: cannot lock ref 'refs/heads/loops/deliver-1': \
        Unable to create '/w/remote.git/./refs/heads/loops/deliver-1.lock': File exists.\n";

    #[test]
    fn the_lock_named_in_git_s_message_is_found() {
        assert!(is_lock_error(PUSH_ERROR));
        assert_eq!(
            named_lock(PUSH_ERROR),
            Some(PathBuf::from(
                "/w/remote.git/./refs/heads/loops/deliver-1.lock"
            ))
        );
        assert_eq!(
            named_lock("fatal: Unable to create 'x': File exists."),
            None
        );
        assert_eq!(named_lock("fatal: not a git repository"), None);
    }

    fn bare_repository_with_lock(age: Duration) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let remote = dir.path().join("remote.git");
        std::fs::create_dir_all(remote.join("objects")).unwrap();
        std::fs::create_dir_all(remote.join("refs/heads/loops")).unwrap();
        std::fs::write(remote.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        let lock = remote.join("refs/heads/loops/deliver-1.lock");
        std::fs::write(&lock, "").unwrap();
        let file = std::fs::File::options().write(true).open(&lock).unwrap();
        file.set_modified(std::time::SystemTime::now() - age)
            .unwrap();
        (dir, lock)
    }

    fn error_naming(lock: &Path) -> String {
        format!(
            "remote: error: cannot lock ref 'x': Unable to create '{}': File exists.",
            lock.display()
        )
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_lock_no_process_can_hold_is_removed() {
        let (_dir, lock) = bare_repository_with_lock(Duration::from_secs(5));
        assert_eq!(
            remove_left_behind(&error_naming(&lock), false),
            Some(lock.clone())
        );
        assert!(!lock.exists());
        // Gone: nothing more to remove.
        assert_eq!(remove_left_behind(&error_naming(&lock), false), None);
    }

    #[test]
    fn a_lock_made_a_moment_ago_stays() {
        let (_dir, lock) = bare_repository_with_lock(Duration::ZERO);
        assert_eq!(remove_left_behind(&error_naming(&lock), false), None);
        assert!(lock.exists());
    }

    /// A git process working in the repository may hold the lock: it stays. Any other
    /// process there (a shell) holds none: the lock goes.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_lock_in_a_repository_a_git_works_in_stays() {
        let (dir, lock) = bare_repository_with_lock(Duration::from_secs(5));
        let refs = dir.path().join("remote.git/refs");
        // `git cat-file --batch` waits for its input: a git process working in `refs`.
        let mut git = std::process::Command::new("git")
            .args(["cat-file", "--batch"])
            .current_dir(&refs)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut shell = std::process::Command::new("sleep")
            .arg("30")
            .current_dir(&refs)
            .spawn()
            .unwrap();
        let kept = remove_left_behind(&error_naming(&lock), false);
        git.kill().unwrap();
        git.wait().unwrap();
        let removed = remove_left_behind(&error_naming(&lock), false);
        shell.kill().unwrap();
        shell.wait().unwrap();
        assert_eq!((kept, removed), (None, Some(lock.clone())));
        assert!(!lock.exists());
    }

    #[test]
    fn a_lock_on_a_private_index_is_removed_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join("index");
        let lock = dir.path().join("index.lock");
        std::fs::write(&lock, "").unwrap();
        let said = error_naming(&lock);
        assert!(on_index(&said, Some(&index)));
        assert!(!on_index(&said, Some(&dir.path().join("other"))));
        assert!(!on_index(&said, None));
        // Not in a repository, and made a moment ago: kept unless private.
        assert_eq!(remove_left_behind(&said, false), None);
        assert_eq!(remove_left_behind(&said, true), Some(lock.clone()));
        assert!(!lock.exists());
    }

    #[test]
    fn a_lock_outside_any_repository_stays() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("x.lock");
        std::fs::write(&lock, "").unwrap();
        let file = std::fs::File::options().write(true).open(&lock).unwrap();
        file.set_modified(std::time::SystemTime::now() - Duration::from_secs(5))
            .unwrap();
        assert_eq!(remove_left_behind(&error_naming(&lock), false), None);
        assert!(lock.exists());
    }
}
