//! Network namespaces that clean up after themselves.
//!
//! A namespace here has no name and no bind mount: it is made by `unshare(CLONE_NEWNET)` on a
//! thread of its own, which then stays in it and runs whatever must happen *inside* — creating a
//! TUN device or a socket (both belong to the namespace of the thread that creates them),
//! setting a sysctl, starting a process (a child inherits its parent thread's namespace). The
//! namespace lives while that thread, a socket or a device in it does, and not a moment longer:
//! however faultrig exits — Ctrl-C, SIGTERM, a panic, SIGKILL — the kernel removes the
//! namespace and its devices with the last file descriptor. Nothing can be left behind for
//! `ip netns list` to show.

use std::io;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::thread::JoinHandle;

use nix::sched::CloneFlags;

use crate::profile::CongestionControl;

type Job = Box<dyn FnOnce() + Send>;

/// Why a namespace could not be made: the one case a user can fix is the missing privilege.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error(
        "creating a network namespace needs CAP_NET_ADMIN (run as root, or grant the capability: \
         `sudo setcap cap_net_admin,cap_sys_admin+ep $(which faultrig)`): {0}"
    )]
    Privilege(nix::Error),
    #[error("cannot create a network namespace: {0}")]
    Other(nix::Error),
    #[error("cannot set up the namespace: {0}")]
    Setup(io::Error),
}

/// A private network namespace and the thread that lives in it.
pub struct Namespace {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Namespace {
    /// A new, empty network namespace with its loopback interface up.
    pub fn new() -> Result<Namespace, NamespaceError> {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (ready_tx, ready) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("faultrig-netns".into())
            .spawn(move || {
                if let Err(e) = nix::sched::unshare(CloneFlags::CLONE_NEWNET) {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                let _ = ready_tx.send(Ok(()));
                // Runs jobs until the namespace is dropped; the thread (and so its hold on the
                // namespace) ends with the channel.
                for job in inbox {
                    job();
                }
            })
            .map_err(NamespaceError::Setup)?;
        match ready.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(match e {
                    nix::Error::EPERM | nix::Error::EACCES => NamespaceError::Privilege(e),
                    e => NamespaceError::Other(e),
                });
            }
            Err(_) => return Err(NamespaceError::Setup(io::Error::other("netns thread died"))),
        }
        let ns = Namespace {
            jobs: Some(jobs),
            thread: Some(thread),
        };
        ns.within(|| run_ip(&["link", "set", "lo", "up"]))
            .map_err(NamespaceError::Setup)?;
        Ok(ns)
    }

    /// Runs `f` on the namespace's thread (so sockets and devices it creates belong to the
    /// namespace) and waits for its result. Blocks: from async code use [`Namespace::within_async`].
    pub fn within<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::sync_channel(1);
        self.submit(Box::new(move || {
            let _ = tx.send(f());
        }));
        rx.recv()
            .expect("the namespace thread runs every job it is given")
    }

    /// [`Namespace::within`] without blocking the async runtime.
    pub(crate) async fn within_async<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(Box::new(move || {
            let _ = tx.send(f());
        }));
        rx.await
            .expect("the namespace thread runs every job it is given")
    }

    fn submit(&self, job: Job) {
        self.jobs
            .as_ref()
            .expect("jobs are only taken on drop")
            .send(job)
            .expect("the namespace thread lives as long as the Namespace");
    }

    /// Sets a sysctl of this namespace (`/proc/sys/net/...` shows the namespace of the thread
    /// that opens it), e.g. `("net/ipv4/tcp_congestion_control", "cubic")`.
    pub(crate) fn sysctl(&self, key: &str, value: &str) -> io::Result<()> {
        let path = format!("/proc/sys/{key}");
        let value = value.to_string();
        self.within(move || {
            std::fs::write(&path, value)
                .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
        })
    }

    /// Makes `cc` the default congestion control of this namespace's TCP. The kernel lets a
    /// namespace other than the host's pick only algorithms listed in the (global)
    /// `net.ipv4.tcp_allowed_congestion_control`, so this can fail where a socket's own
    /// `TCP_CONGESTION` (which root may set to anything the kernel has) would not.
    pub(crate) fn set_congestion_control(&self, cc: CongestionControl) -> io::Result<()> {
        self.sysctl("net/ipv4/tcp_congestion_control", cc.as_str())
    }

    /// TCP segments this namespace's stack has retransmitted so far (`RetransSegs` of its
    /// `/proc/net/snmp`): every connection's, closed ones included, as `tcpi_total_retrans`
    /// would sum them, read without `getsockopt(TCP_INFO)`, which no safe API offers.
    pub(crate) async fn tcp_retransmissions(&self) -> io::Result<u64> {
        self.within_async(|| {
            // thread-self: /proc/self/net would show the namespace of the process's main thread.
            let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp")?;
            retrans_segs(&snmp).ok_or_else(|| io::Error::other("no Tcp: RetransSegs in snmp"))
        })
        .await
    }

    /// Starts `command` inside the namespace.
    pub fn spawn(&self, mut command: Command) -> io::Result<Child> {
        self.within(move || command.spawn())
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `RetransSegs` from the text of `/proc/net/snmp`: a `Tcp:` line of names, then one of values.
fn retrans_segs(snmp: &str) -> Option<u64> {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let at = names.split_whitespace().position(|n| n == "RetransSegs")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// Runs `ip ARGS` (iproute2) in the calling thread's namespace, failing with its stderr.
pub(crate) fn run_ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot run `ip` (iproute2 is needed to set up namespaces): {e}"),
        )
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retransmitted_segments_are_read_from_snmp() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Tcp: RtoAlgorithm ActiveOpens RetransSegs InErrs\nTcp: 1 5 17 0\n\
                    Udp: InDatagrams\nUdp: 3\n";
        assert_eq!(retrans_segs(snmp), Some(17));
        assert_eq!(retrans_segs("Tcp: RtoAlgorithm\nTcp: 1\n"), None);
        assert_eq!(retrans_segs(""), None);
    }
}
