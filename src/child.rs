//! Child processes that end with the process that started them: `faultrig run`'s servers and
//! its private redis-server must not outlive it, however it ends.
//!
//! Ctrl-C, SIGTERM and errors reach the runner's drop guards, which stop every child. A runner
//! killed outright (SIGKILL, a crash) runs no code, so each child also asks the kernel for a
//! signal when its parent dies (`PR_SET_PDEATHSIG`, set from the child itself since `pre_exec`
//! would need unsafe code): `faultrig serve --parent PID` does it at start, and a program that
//! cannot (redis-server) runs under `faultrig supervise --parent PID -- PROGRAM`, which does it
//! and stops its program when the signal comes. The kernel sends it when the *thread* that
//! spawned the child ends, so the runner spawns children from the thread that runs its main
//! future, which lives as long as the process.

use std::io::{self, BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The hidden flag that hands a child its parent's pid.
pub(crate) const PARENT_FLAG: &str = "--parent";

/// `BIN supervise --parent PID --`, this process's pid as the parent: add the program to run
/// and its arguments. The one place that spells that command line (`bin` is the faultrig binary,
/// which holds the hidden `supervise` subcommand). For tokio, convert with
/// `tokio::process::Command::from`.
pub(crate) fn supervised(bin: &Path) -> Command {
    let mut command = Command::new(bin);
    command.args([
        "supervise",
        PARENT_FLAG,
        &std::process::id().to_string(),
        "--",
    ]);
    command
}

/// How long a child gets to stop on SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Why a child could not tie its life to its parent's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OrphanError {
    #[error("cannot ask for a signal when the parent dies: {0}")]
    Signal(#[from] nix::Error),
    #[error("the process that started this one (pid {0}) has already exited")]
    ParentGone(u32),
}

/// Arranges for SIGTERM when the parent `parent` dies. Fails when it already has: the signal
/// would then never come, and this process would outlive the run it belongs to.
pub(crate) fn die_with_parent(parent: u32) -> Result<(), OrphanError> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
    // Set first, checked after: a parent that died in between is seen here.
    if nix::unistd::getppid().as_raw() as u32 != parent {
        return Err(OrphanError::ParentGone(parent));
    }
    Ok(())
}

/// Stops a child and reaps it: SIGTERM, so it can stop what it started, then SIGKILL if it is
/// still there after a grace period.
pub fn stop(child: &mut Child) {
    let pid = Pid::from_raw(child.id() as i32);
    if matches!(child.try_wait(), Ok(None)) && kill(pid, Signal::SIGTERM).is_ok() {
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A child that said where it listens: the first line of its standard output ends in
/// `listening on ADDR` (what `faultrig serve` and `faultrig proxy` print, and scripts read).
/// Stopped and reaped on drop, as [`stop`] does.
#[derive(Debug)]
pub struct Announced {
    pub child: Child,
    pub addr: String,
    /// The rest of its standard output, for callers that read what it says next; kept open so
    /// the child never writes into a closed pipe.
    pub stdout: Option<BufReader<ChildStdout>>,
}

/// Why a child did not announce an address.
#[derive(Debug, thiserror::Error)]
pub enum AnnounceError {
    #[error("start {program}: {source}")]
    Start { program: String, source: io::Error },
    #[error("{program} said nothing within {within:?}; stopped")]
    Silent { program: String, within: Duration },
    #[error("{program} did not start: its first line was {line:?}")]
    NoAddress { program: String, line: String },
}

impl Announced {
    /// Starts `command` with its standard output piped, and waits up to `within` for the
    /// address line. A child that fails to announce is stopped before this returns.
    pub fn spawn(mut command: Command, within: Duration) -> Result<Announced, AnnounceError> {
        let program = command.get_program().to_string_lossy().into_owned();
        let mut child =
            command
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|source| AnnounceError::Start {
                    program: program.clone(),
                    source,
                })?;
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        // Guarded before anything can fail: every early return below stops and reaps it.
        let mut announced = Announced {
            child,
            addr: String::new(),
            stdout: None,
        };
        // Read on a thread, so a child that hangs before its first line is noticed.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = stdout.read_line(&mut line);
            let _ = tx.send((line, stdout));
        });
        let (line, stdout) = rx.recv_timeout(within).map_err(|_| AnnounceError::Silent {
            program: program.clone(),
            within,
        })?;
        let Some(addr) = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
        else {
            return Err(AnnounceError::NoAddress { program, line });
        };
        announced.addr = addr.to_string();
        announced.stdout = Some(stdout);
        Ok(announced)
    }

    /// A `kB` field of the child's `/proc/PID/status` (`VmRSS`, `VmHWM`), in KiB.
    pub fn status_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        status
            .lines()
            .find(|l| {
                l.strip_prefix(field)
                    .is_some_and(|rest| rest.starts_with(':'))
            })?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }
}

impl Drop for Announced {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}
