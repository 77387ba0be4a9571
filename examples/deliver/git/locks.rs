//! Lock files git leaves behind.
//!
//! Git takes a lock by creating `<file>.lock` and removes it when done, also when it is
//! stopped by SIGTERM. A git process ended by SIGKILL (the OOM killer, a service manager's
//! last resort), or by a signal that comes before it set up its handlers, leaves the lock
//! behind for good: every later command that needs it fails with `Unable to create
//! '....lock': File exists`, and git says to remove the file by hand. This program removes
//! such a lock itself when it can tell that no git holds it: no git process (a process whose
//! name starts with `git`) works in the lock's repository (its working directory is in the
//! repository or in a work tree linked to it, or its arguments or its `GIT_DIR`,
//! `GIT_COMMON_DIR` or `GIT_WORK_TREE` name a path there), and none of another user, whose
//! place cannot be read, runs. That is known on Linux only (`/proc`); elsewhere the lock stays
//! ([`Kept::Unknowable`]). A lock on a temporary index of this program's own is removed
//! without a check: no other git uses that index.
//!
//! A git process that works in the repository is named ([`Kept::Held`]): it may hold the lock
//! and remove it when it ends, or it may be a git that only reads and takes no lock (an
//! editor's long-running `git cat-file --batch`), which this rule cannot tell apart.
//! [`Git::output`](super::Git::output) waits while there is one.

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

/// Why [`remove_left_behind`] kept a lock file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Kept {
    /// A git process works in the repository of the lock file `lock` and may hold it.
    Held { lock: PathBuf, holder: Holder },
    /// Whether a git process holds the lock file cannot be known here (not Linux, or `/proc`
    /// cannot be read).
    Unknowable(PathBuf),
    /// Git's message names no lock file, or it is gone, younger than [`MIN_AGE`], in no
    /// repository, or could not be removed.
    Other,
}

/// A git process that may hold a lock file: one that works in its repository
/// ([`git_working_in`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Holder {
    pub(super) pid: u32,
    /// Its command line, its arguments joined by spaces and cut at [`COMMAND_CHARS`] (its
    /// name if the command line cannot be read).
    pub(super) command: String,
    /// Its working directory; `None` for a process of another user, whose directory cannot be
    /// read.
    pub(super) cwd: Option<PathBuf>,
}

/// How much of a holder's command line is told.
const COMMAND_CHARS: usize = 200;

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Holder { pid, command, cwd } = self;
        match cwd {
            Some(cwd) => write!(f, "git process {pid} (`{command}`, in {})", cwd.display()),
            None => write!(f, "git process {pid} (`{command}`) of another user"),
        }
    }
}

/// Removes the lock file git's `stderr` names if no git process can hold it (module docs),
/// and returns its path. `private`: the lock is on a temporary index of this program's own
/// ([`on_index`]), removed without a check.
///
/// # Errors
/// Why the lock was kept ([`Kept`]).
pub(super) fn remove_left_behind(stderr: &str, private: bool) -> Result<PathBuf, Kept> {
    let lock = named_lock(stderr).ok_or(Kept::Other)?;
    if !private {
        let modified = std::fs::metadata(&lock).and_then(|m| m.modified());
        let age = modified.ok().and_then(|m| m.elapsed().ok());
        if age.is_none_or(|age| age < MIN_AGE) {
            return Err(Kept::Other);
        }
        let places = repository_places(&lock).ok_or(Kept::Other)?;
        match git_working_in(&places) {
            None => return Err(Kept::Unknowable(lock)),
            Some(Some(holder)) => return Err(Kept::Held { lock, holder }),
            Some(None) => {}
        }
    }
    std::fs::remove_file(&lock).map_err(|_| Kept::Other)?;
    Ok(lock)
}

/// The lock file in git's "Unable to create '<path>': File exists" (a `.lock` file).
fn named_lock(stderr: &str) -> Option<PathBuf> {
    let (_, rest) = stderr.split_once("Unable to create '")?;
    let (path, _) = rest.split_once("': File exists")?;
    path.ends_with(".lock").then(|| PathBuf::from(path))
}

/// The places a git working on the repository `lock` is in stands in or names, links
/// resolved: its git directory (the nearest directory above the lock that holds `HEAD` and
/// `objects/`), the work tree holding it if it is named `.git`, and the work trees linked to
/// it (`git worktree`: `worktrees/*/gitdir` names each one's `.git` file). `None` if the lock
/// is in no repository.
fn repository_places(lock: &Path) -> Option<Vec<PathBuf>> {
    let lock = std::fs::canonicalize(lock).ok()?;
    let git_dir = lock
        .ancestors()
        .skip(1)
        .find(|dir| dir.join("HEAD").is_file() && dir.join("objects").is_dir())?;
    let mut places = vec![git_dir.to_path_buf()];
    if git_dir.file_name().is_some_and(|n| n == ".git") {
        places.push(git_dir.parent()?.to_path_buf());
    }
    for linked in std::fs::read_dir(git_dir.join("worktrees"))
        .into_iter()
        .flatten()
    {
        let Ok(gitfile) = std::fs::read_to_string(linked.ok()?.path().join("gitdir")) else {
            continue;
        };
        if let Some(tree) = Path::new(gitfile.trim()).parent() {
            places.push(std::fs::canonicalize(tree).unwrap_or_else(|_| tree.to_path_buf()));
        }
    }
    Some(places)
}

/// A git process (one whose name starts with `git`: `git`, `git-receive-pack`, ...) that
/// works in `places` ([`repository_places`]): its working directory is in one, or its
/// arguments or environment name one ([`names_a_place`]). A git process of another user,
/// whose working directory cannot be read, counts: it could. `None` inside where there is
/// none; `None` outside where processes cannot be listed. Other processes (the shell this
/// program was started from, an editor) hold no git lock.
#[cfg(target_os = "linux")]
fn git_working_in(places: &[PathBuf]) -> Option<Option<Holder>> {
    let processes = std::fs::read_dir("/proc").ok()?;
    Some(processes.flatten().find_map(|entry| {
        let pid = entry.file_name().into_string().ok()?;
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let proc_dir = entry.path();
        let comm = std::fs::read_to_string(proc_dir.join("comm")).ok()?;
        let comm = comm.trim_end();
        if !comm.starts_with("git") {
            return None;
        }
        let cwd = match std::fs::read_link(proc_dir.join("cwd")) {
            Ok(cwd) => {
                let works_here = places.iter().any(|p| cwd.starts_with(p))
                    || names_a_place(&proc_dir, &cwd, places);
                Some(Some(cwd).filter(|_| works_here)?)
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => None,
            // Gone meanwhile: holds nothing.
            Err(_) => return None,
        };
        Some(Holder {
            pid: pid.parse().ok()?,
            command: command_line(&proc_dir).unwrap_or_else(|| comm.to_owned()),
            cwd,
        })
    }))
}

/// The command line of the process of `/proc/PID` `proc_dir`, its arguments joined by spaces
/// and cut at [`COMMAND_CHARS`]; `None` if it cannot be read or is empty (a process ended
/// meanwhile).
#[cfg(target_os = "linux")]
fn command_line(proc_dir: &Path) -> Option<String> {
    let raw = std::fs::read(proc_dir.join("cmdline")).ok()?;
    let args: Vec<_> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(String::from_utf8_lossy)
        .collect();
    let line = args.join(" ");
    if line.is_empty() {
        return None;
    }
    Some(match line.char_indices().nth(COMMAND_CHARS) {
        Some((end, _)) => format!("{}...", &line[..end]),
        None => line,
    })
}

/// Whether the process of `/proc/PID` `proc_dir`, working in `cwd`, names a path in `places`
/// in an argument (`--git-dir=PATH`, `-C PATH`, a remote's path) or in its `GIT_DIR`,
/// `GIT_COMMON_DIR` or `GIT_WORK_TREE`, a relative path taken from `cwd`.
#[cfg(target_os = "linux")]
fn names_a_place(proc_dir: &Path, cwd: &Path, places: &[PathBuf]) -> bool {
    let strings = |file: &str| -> Vec<String> {
        std::fs::read(proc_dir.join(file))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .filter_map(|s| std::str::from_utf8(s).ok().map(str::to_owned))
            .collect()
    };
    // An argument as a whole (`--git-dir PATH`, a remote's path: a path may hold `=`), and
    // what follows its first `=` (`--git-dir=PATH`).
    let arguments = strings("cmdline").into_iter().flat_map(|arg| {
        let value = arg.split_once('=').map(|(_, path)| path.to_owned());
        std::iter::once(arg).chain(value)
    });
    let environment = strings("environ").into_iter().filter_map(|var| {
        ["GIT_DIR=", "GIT_COMMON_DIR=", "GIT_WORK_TREE="]
            .iter()
            .find_map(|name| var.strip_prefix(name).map(str::to_owned))
    });
    arguments.chain(environment).any(|path| {
        let path = cwd.join(path);
        let path = std::fs::canonicalize(&path).unwrap_or(path);
        places.iter().any(|p| path.starts_with(p))
    })
}

#[cfg(not(target_os = "linux"))]
fn git_working_in(_places: &[PathBuf]) -> Option<Option<Holder>> {
    None
}

#[cfg(test)]
pub(super) mod tests {
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

    /// A bare repository `a=b/remote.git` (a `=` in its path) in a temporary directory,
    /// with a ref lock `age` old.
    fn bare_repository_with_lock(age: Duration) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let remote = dir.path().join("a=b/remote.git");
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
            remove_left_behind(&error_naming(&lock), false).ok(),
            Some(lock.clone())
        );
        assert!(!lock.exists());
        // Gone: nothing more to remove.
        assert_eq!(
            remove_left_behind(&error_naming(&lock), false),
            Err(Kept::Other)
        );
    }

    #[test]
    fn a_lock_made_a_moment_ago_stays() {
        let (_dir, lock) = bare_repository_with_lock(Duration::ZERO);
        assert_eq!(
            remove_left_behind(&error_naming(&lock), false),
            Err(Kept::Other)
        );
        assert!(lock.exists());
    }

    /// `git-hold`, a script that waits for its input (so a process whose name starts with
    /// `git`, whatever its arguments), started in `cwd` with `args` and `env`.
    #[cfg(target_os = "linux")]
    fn git_process(
        bin: &Path,
        cwd: &Path,
        args: &[&str],
        env: &[(&str, &Path)],
    ) -> std::process::Child {
        use std::os::unix::fs::PermissionsExt as _;
        let hold = bin.join("git-hold");
        if !hold.exists() {
            std::fs::write(&hold, "#!/bin/sh\nwhile read -r _; do :; done\n").unwrap();
            std::fs::set_permissions(&hold, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let mut cmd = std::process::Command::new(&hold);
        cmd.args(args)
            .current_dir(cwd)
            .stdin(std::process::Stdio::piped());
        for (name, value) in env {
            cmd.env(name, value);
        }
        named(cmd.spawn().unwrap(), "git-hold")
    }

    /// `child`, once it bears the name `name`: until it runs its program, a child bears the
    /// name of the test's thread (which may start with `git`, and count as a git). Killed,
    /// and the test failed, if it does not within 5 s.
    #[cfg(target_os = "linux")]
    pub(in crate::git) fn named(mut child: std::process::Child, name: &str) -> std::process::Child {
        let comm = Path::new("/proc").join(child.id().to_string()).join("comm");
        for _ in 0..5_000 {
            if std::fs::read_to_string(&comm).is_ok_and(|c| c.trim_end() == name) {
                return child;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        panic!("{name} did not start");
    }

    /// A git process that works in the repository may hold the lock: it stays, whether its
    /// working directory is there, in a work tree linked to it, or it names the repository
    /// in an argument or in `GIT_DIR`. Any other process there (a shell) holds none, nor does
    /// a git elsewhere: the lock goes.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_lock_in_a_repository_a_git_works_in_stays() {
        let (dir, lock) = bare_repository_with_lock(Duration::from_secs(5));
        let remote = dir.path().join("a=b/remote.git");
        let remote_path = remote.to_str().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        let linked = dir.path().join("linked");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::create_dir_all(&linked).unwrap();
        std::fs::create_dir_all(remote.join("worktrees/linked")).unwrap();
        std::fs::write(
            remote.join("worktrees/linked/gitdir"),
            format!("{}\n", linked.join(".git").display()),
        )
        .unwrap();
        let bin = dir.path();
        let remote_arg = format!("--git-dir={}", remote.display());
        type Place<'a> = (&'a Path, &'a [&'a str], &'a [(&'a str, &'a Path)]);
        let holders: [Place; 6] = [
            (&remote.join("refs"), &[], &[]),
            (&linked, &[], &[]),
            (&elsewhere, &[&remote_arg], &[]),
            (&elsewhere, &["--git-dir", remote_path], &[]),
            (&elsewhere, &["../a=b/remote.git"], &[]),
            (&elsewhere, &[], &[("GIT_DIR", &remote)]),
        ];
        for (i, (cwd, args, env)) in holders.into_iter().enumerate() {
            // One at a time: each alone keeps the lock.
            let mut holder = git_process(bin, cwd, args, env);
            let kept = remove_left_behind(&error_naming(&lock), false);
            holder.kill().unwrap();
            holder.wait().unwrap();
            // Named by its command line: the shell that runs the script, and its arguments.
            let script = bin.join("git-hold");
            let command = std::iter::once(format!("/bin/sh {}", script.display()))
                .chain(args.iter().map(|a| (*a).to_owned()))
                .collect::<Vec<_>>()
                .join(" ");
            let holder = Holder {
                pid: holder.id(),
                command,
                cwd: Some(cwd.canonicalize().unwrap()),
            };
            assert_eq!(
                kept,
                Err(Kept::Held {
                    lock: lock.clone(),
                    holder: holder.clone()
                }),
                "holder {i}"
            );
            assert_eq!(
                holder.to_string(),
                format!(
                    "git process {} (`{}`, in {})",
                    holder.pid,
                    holder.command,
                    cwd.canonicalize().unwrap().display()
                )
            );
            assert!(lock.exists());
        }
        let shell = std::process::Command::new("sleep")
            .arg("30")
            .current_dir(remote.join("refs"))
            .spawn()
            .unwrap();
        // `spawn` returns once the exec has begun, and the kernel gives the process its new
        // name last: until then it bears this test's thread's, which starts with `git`.
        let comm = Path::new("/proc").join(shell.id().to_string()).join("comm");
        for _ in 0..5_000 {
            if std::fs::read_to_string(&comm).is_ok_and(|c| c.trim_end() == "sleep") {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let git_elsewhere = git_process(bin, &elsewhere, &["push"], &[]);
        let removed = remove_left_behind(&error_naming(&lock), false);
        for mut process in [shell, git_elsewhere] {
            process.kill().unwrap();
            process.wait().unwrap();
        }
        assert_eq!(removed, Ok(lock.clone()));
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
        assert_eq!(remove_left_behind(&said, false), Err(Kept::Other));
        assert_eq!(remove_left_behind(&said, true).ok(), Some(lock.clone()));
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
        assert_eq!(
            remove_left_behind(&error_naming(&lock), false),
            Err(Kept::Other)
        );
        assert!(lock.exists());
    }
}
