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

use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The hidden flag that hands a child its parent's pid.
pub const PARENT_FLAG: &str = "--parent";

/// How long a child gets to stop on SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Arranges for SIGTERM when the parent `parent` dies. Fails when it already has: the signal
/// would then never come, and this process would outlive the run it belongs to.
pub fn die_with_parent(parent: u32) -> Result<(), String> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)
        .map_err(|e| format!("cannot ask for a signal when the parent dies: {e}"))?;
    // Set first, checked after: a parent that died in between is seen here.
    if nix::unistd::getppid().as_raw() as u32 != parent {
        return Err(format!(
            "the process that started this one (pid {parent}) has already exited"
        ));
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
