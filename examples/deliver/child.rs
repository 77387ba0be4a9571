//! The programs this example runs (git, rustc, the demo's tests), and the signals that end
//! them from outside: a stop meant for this program too ([`await_stop_if_interrupted`]), or a
//! kill of the child alone ([`output`]). Neither says anything of the command, so neither may
//! become a step's outcome (a failed git command, a compile error, failing tests).

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tokio::process::Command;

/// How often a command killed from outside is run in all before [`output`] gives up, and how
/// long it waits before each run again.
const KILLED_TRIES: u32 = 3;
const KILLED_PAUSE: Duration = Duration::from_secs(1);

/// Runs the command `make` builds and returns its output whatever its exit status, running it
/// again (a new command from `make`, after [`KILLED_PAUSE`], [`KILLED_TRIES`] runs in all)
/// while it is killed from outside ([`killed_from_outside`]: SIGKILL from the OOM killer, an
/// operator or a container's limit; SIGTERM, SIGINT or SIGHUP sent to it alone, `pkill rustc`,
/// a watchdog), which says nothing of the command, whose run here is safe to repeat (git
/// commands this example makes are idempotent, a build and the tests are made again). A death
/// by SIGINT or SIGTERM waits for this program's own stop first
/// ([`await_stop_if_interrupted`]): if it comes, this future is dropped. `what` names the
/// command in messages.
///
/// # Errors
/// If the command cannot be started, or is killed from outside every time.
pub async fn output(make: impl FnMut() -> Command, what: &str) -> Result<Output> {
    output_unless_cut_short(make, what, |_| None).await
}

/// [`output`], for a command that can also end as if by its own failure when it, or a program
/// of its own, was stopped from outside: `cut_short` tells so from its output (rustc, whose
/// linker was killed, or which caught a SIGINT, exits 1 with a message), and says how.
///
/// # Errors
/// As [`output`].
pub async fn output_unless_cut_short(
    make: impl FnMut() -> Command,
    what: &str,
    cut_short: impl Fn(&Output) -> Option<&'static str>,
) -> Result<Output> {
    output_recorded(make, what, cut_short, None).await
}

/// [`output_unless_cut_short`], for a command started in a process group of its own
/// ([`own_process_group`]) that works in `dir`, a directory of the scratch space: while it
/// runs, its process group's id is in `dir`'s [`GROUP_FILE`], so that the next start can stop
/// it ([`stop_left_groups`]) if this program is killed meanwhile (SIGKILL runs no
/// `kill_on_drop`: a build would go on writing in the scratch space the next start clears).
///
/// # Errors
/// As [`output`].
pub async fn output_in_recorded_group(
    make: impl FnMut() -> Command,
    what: &str,
    cut_short: impl Fn(&Output) -> Option<&'static str>,
    dir: &Path,
) -> Result<Output> {
    output_recorded(make, what, cut_short, Some(&dir.join(GROUP_FILE))).await
}

/// The loop of [`output_unless_cut_short`] and [`output_in_recorded_group`]: `group_file`,
/// if given, holds the child's process id (its group's) while it runs.
async fn output_recorded(
    mut make: impl FnMut() -> Command,
    what: &str,
    cut_short: impl Fn(&Output) -> Option<&'static str>,
    group_file: Option<&Path>,
) -> Result<Output> {
    let mut runs = 1;
    loop {
        // Boxed: a spawned child's wait with its output is a large future, and a step's
        // future holds it (the crash explorer's test drives whole runs on a 2 MiB stack).
        let output = Box::pin(run_once(make(), group_file))
            .await
            .with_context(|| format!("cannot run `{what}`"))?;
        await_stop_if_interrupted(&output.status, what).await;
        let Some(how) = killed_from_outside(&output.status).or_else(|| cut_short(&output)) else {
            return Ok(output);
        };
        if runs == KILLED_TRIES {
            bail!(
                "`{what}` was killed ({how}) {runs} times in a row, from outside this program \
                 (the OOM killer? a memory limit? a watchdog?)"
            );
        }
        tracing::warn!(
            runs,
            "`{what}` was killed ({how}) from outside this program; running it again in {} s",
            KILLED_PAUSE.as_secs()
        );
        runs += 1;
        tokio::time::sleep(KILLED_PAUSE).await;
    }
}

/// Runs `cmd` as [`Command::output`] does (standard output and error captured), writing its
/// process id to `group_file`, if given, once it is started, and removing the file once it has
/// ended. (A kill between the start and the write leaves the child unrecorded: a window of
/// microseconds.)
async fn run_once(mut cmd: Command, group_file: Option<&Path>) -> std::io::Result<Output> {
    let Some(group_file) = group_file else {
        return cmd.output().await;
    };
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn()?;
    if let Some(pid) = child.id() {
        // Best effort: without the record, only a kill of this program leaves the child be.
        let _ = std::fs::write(group_file, pid.to_string());
    }
    let output = child.wait_with_output().await;
    let _ = std::fs::remove_file(group_file);
    output
}

/// The file in which [`output_in_recorded_group`] records the process group of the command
/// it runs.
pub const GROUP_FILE: &str = "process-group";

/// How long [`stop_left_groups`] waits for a group it killed to be gone.
const LEFT_GROUP_GRACE: Duration = Duration::from_secs(5);

/// Stops the commands a killed process of this example left running in `scratch`: for each
/// directory of `scratch` holding a [`GROUP_FILE`], kills (SIGKILL) the process group it
/// names if a process of that group still works in that directory (its working directory is
/// there: a group id reused since by another program's group is left alone), and waits up to
/// [`LEFT_GROUP_GRACE`] for the group to be gone, so that the caller can clear `scratch`
/// without the build writing there again. Each group stopped is said in a warning.
///
/// Only on Linux, where `/proc` tells a process's group and working directory; elsewhere
/// nothing is stopped, and a build left running ends by itself.
pub fn stop_left_groups(scratch: &Path) {
    let Ok(entries) = std::fs::read_dir(scratch) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let Ok(recorded) = std::fs::read_to_string(dir.join(GROUP_FILE)) else {
            continue;
        };
        if let Ok(pgid) = recorded.trim().parse::<i32>() {
            stop_group_working_in(pgid, &dir);
        }
    }
}

/// [`stop_left_groups`] for one recorded group.
#[cfg(target_os = "linux")]
fn stop_group_working_in(pgid: i32, dir: &Path) {
    use rustix::process::{Pid, Signal, getpgrp, kill_process_group};
    // kill(-1) would signal every process this one may: a group's id is above 1, and this
    // program's own group is never one it records.
    let Some(group) = Pid::from_raw(pgid).filter(|_| pgid > 1) else {
        return;
    };
    let Ok(dir) = dir.canonicalize() else {
        return;
    };
    if group == getpgrp() || !group_alive(pgid).iter().any(|cwd| cwd.starts_with(&dir)) {
        return;
    }
    tracing::warn!(
        process_group = pgid,
        dir = %dir.display(),
        "stopping a command a killed process of this example left running in the scratch space"
    );
    if let Err(e) = kill_process_group(group, Signal::KILL) {
        tracing::warn!(process_group = pgid, error = %e, "cannot kill the process group");
        return;
    }
    let deadline = std::time::Instant::now() + LEFT_GROUP_GRACE;
    while !group_alive(pgid).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(not(target_os = "linux"))]
fn stop_group_working_in(_pgid: i32, _dir: &Path) {}

/// The working directories of the live processes (zombies left out) of process group `pgid`,
/// from `/proc` (a directory that cannot be read, a process of another user's, is an empty
/// path, which is within no directory).
#[cfg(target_os = "linux")]
fn group_alive(pgid: i32) -> Vec<std::path::PathBuf> {
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    processes
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.parse::<u32>().is_ok())
        })
        .filter_map(|entry| {
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
            let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
            let state = fields.next()?;
            let pgrp: i32 = fields.nth(1)?.parse().ok()?;
            (pgrp == pgid && !matches!(state, "Z" | "X"))
                .then(|| std::fs::read_link(entry.path().join("cwd")).unwrap_or_default())
        })
        .collect()
}

/// Runs `program --version` ([`output`]: run again if killed from outside) and returns what
/// it printed, trimmed: a check, at the start, that a program this example needs is there.
/// `needs` says what it is needed for and `install` how to install it, for the error.
///
/// # Errors
/// If the program cannot be started (named with `needs` and `install`), fails, or is killed
/// every time.
pub async fn version_of(program: &str, needs: &str, install: &str) -> Result<String> {
    let version = || {
        let mut cmd = Command::new(program);
        cmd.arg("--version").stdin(std::process::Stdio::null());
        cmd
    };
    let what = format!("{program} --version");
    let output = output(version, &what).await.map_err(|e| {
        match e.root_cause().downcast_ref::<std::io::Error>() {
            Some(cause) => anyhow::anyhow!(
                "{needs}, and `{what}` could not run ({cause}); {install} and make sure \
                 {program} is on PATH"
            ),
            None => e,
        }
    })?;
    if !output.status.success() {
        bail!("`{what}` {}", crate::git::failure(&output));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The signal that killed the child whose exit status is `status`, if it is one that comes
/// from outside and never from the program itself: SIGKILL, SIGTERM, SIGINT, SIGHUP. A
/// program's own crash (SIGSEGV, SIGABRT: a test binary that overflows its stack) is its
/// outcome.
fn killed_from_outside(status: &std::process::ExitStatus) -> Option<&'static str> {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        match status.signal()? {
            1 => Some("SIGHUP"),
            2 => Some("SIGINT"),
            9 => Some("SIGKILL"),
            15 => Some("SIGTERM"),
            _ => None,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        None
    }
}

/// Starts `cmd` in a process group of its own, so that Ctrl-C in a terminal (SIGINT to the
/// whole foreground group), or a SIGTERM sent to this program's group (`kill -- -PGID`, a
/// service manager stopping it), reaches this program only: it stops driving and drops the
/// step (a git command finishes, rustc and the tests are killed). Were the child stopped too,
/// its failure could be recorded as the step's outcome (a compile error, a failed git
/// command) before this program saw the signal.
pub fn own_process_group(cmd: &mut Command) {
    #[cfg(unix)]
    cmd.process_group(0);
    #[cfg(not(unix))]
    let _ = cmd;
}

/// How long a step that started a child which died of SIGINT or SIGTERM waits for the same
/// signal to reach this program ([`await_stop_if_interrupted`]).
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Whether `status` is that of a child killed by SIGINT or SIGTERM, the two signals this
/// program stops cleanly on (`main`'s `Interrupt`).
pub fn died_of_stop_signal(status: &std::process::ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        matches!(status.signal(), Some(2 | 15))
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        false
    }
}

/// If the child whose exit status is `status` died of SIGINT or SIGTERM, waits
/// [`STOP_GRACE`] before the caller goes on to report it.
///
/// A child started in a process group of its own ([`own_process_group`]) moves there in the
/// instant between its fork and its exec: a Ctrl-C, or a SIGTERM sent to this program's
/// whole group, that lands in that instant stops it too. Its death must not become the step's
/// outcome (a failed git command, a compile error recorded as the test report): the same
/// signal reaches this program, which stops driving and drops the waiting step meanwhile.
/// The same holds when a service manager stops every process of the service at once (systemd
/// sends SIGTERM to its whole control group, children in their own process groups
/// included). A signal sent to the child alone is known so after the wait ([`output`] runs
/// the command again).
///
/// Past its first 3 s (by when a stop sent with the child's would have come), the wait is said
/// in a warning naming the child (`what`): it was stopped alone.
pub async fn await_stop_if_interrupted(status: &std::process::ExitStatus, what: &str) {
    if died_of_stop_signal(status) {
        tracing::debug!("`{what}` died of SIGINT or SIGTERM: waiting for this program's own");
        let first = Duration::from_secs(3).min(STOP_GRACE);
        tokio::time::sleep(first).await;
        tracing::warn!(
            "`{what}` died of SIGINT or SIGTERM and this program was not stopped with it: \
             waiting {} s more for this program's own stop before going on",
            (STOP_GRACE - first).as_secs()
        );
        tokio::time::sleep(STOP_GRACE - first).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[tokio::test]
    async fn a_child_killed_by_sigint_or_sigterm_is_told_from_one_that_failed() {
        use std::os::unix::process::ExitStatusExt as _;
        let status = |script: &str| {
            std::process::Command::new("sh")
                .args(["-c", script])
                .status()
                .expect("run sh")
        };
        // Deaths by a signal as `wait` reports them (the signal's number as the raw status): a
        // shell that sends itself SIGINT does not die of it where SIGINT is ignored on entry (a
        // job started in the background by a non-interactive shell, as some CI runners do).
        let killed_by = |signal: i32| std::process::ExitStatus::from_raw(signal);
        assert!(died_of_stop_signal(&killed_by(2))); // SIGINT
        assert!(died_of_stop_signal(&killed_by(15))); // SIGTERM
        assert!(!died_of_stop_signal(&killed_by(9))); // SIGKILL
        assert!(died_of_stop_signal(&status("kill -TERM $$")));
        assert!(!died_of_stop_signal(&status("kill -KILL $$")));
        assert!(!died_of_stop_signal(&status("exit 130")));
        assert!(!died_of_stop_signal(&status("exit 143")));
        assert!(!died_of_stop_signal(&status("true")));
    }

    #[cfg(unix)]
    #[test]
    fn signals_from_outside_are_told_from_a_program_s_own_crash() {
        use std::os::unix::process::ExitStatusExt as _;
        let killed_by = |signal: i32| std::process::ExitStatus::from_raw(signal);
        let named: Vec<_> = [1, 2, 9, 15, 6, 11]
            .into_iter()
            .map(|signal| killed_from_outside(&killed_by(signal)))
            .collect();
        assert_eq!(
            named,
            [
                Some("SIGHUP"),
                Some("SIGINT"),
                Some("SIGKILL"),
                Some("SIGTERM"),
                None, // SIGABRT: a panic that aborts, the program's own
                None, // SIGSEGV: a stack overflow, the program's own
            ]
        );
        // An exit status (`exit 1`, 137 as a shell reports a killed child) is no signal.
        for code in [0, 1, 137, 143] {
            assert_eq!(
                killed_from_outside(&std::process::ExitStatus::from_raw(code << 8)),
                None
            );
        }
    }

    /// `sh -c script` in `dir`, as [`output`] runs it.
    fn sh(dir: &std::path::Path, script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]).current_dir(dir);
        cmd
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_command_killed_outright_is_run_again_and_its_output_returned() {
        let dir = tempfile::tempdir().unwrap();
        // Killed on its first two runs, then it answers. (SIGKILL: a shell can be started
        // with SIGHUP, SIGINT or SIGTERM ignored, by `nohup` or a CI runner, and then does
        // not die of them; those are told apart below, from statuses as `wait` reports them.)
        let script = "echo run >> runs; [ $(wc -l < runs) -ge 3 ] && echo done || kill -KILL $$";
        let output = output(|| sh(dir.path(), script), "the script")
            .await
            .unwrap();
        assert!(output.status.success());
        assert_eq!(String::from_utf8_lossy(&output.stdout), "done\n");
        let runs = std::fs::read_to_string(dir.path().join("runs")).unwrap();
        assert_eq!(runs.lines().count(), 3);
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_command_killed_every_time_is_an_error_and_a_failure_is_not_run_again() {
        let dir = tempfile::tempdir().unwrap();
        let err = output(
            || sh(dir.path(), "echo run >> runs; kill -KILL $$"),
            "the script",
        )
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "`the script` was killed (SIGKILL) 3 times in a row, from outside this program \
             (the OOM killer? a memory limit? a watchdog?)"
        );
        let runs = std::fs::read_to_string(dir.path().join("runs")).unwrap();
        assert_eq!(runs.lines().count(), 3);
        // A failure of its own (exit 1, a segfault) is the command's outcome: run once.
        for script in [
            "echo run >> once; exit 1",
            "echo run >> once; kill -SEGV $$",
        ] {
            std::fs::remove_file(dir.path().join("once")).ok();
            let failed = output(|| sh(dir.path(), script), "the script")
                .await
                .unwrap();
            assert!(!failed.status.success());
            let runs = std::fs::read_to_string(dir.path().join("once")).unwrap();
            assert_eq!(runs.lines().count(), 1, "{script}");
        }
    }
}
