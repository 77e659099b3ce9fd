//! `faultrig shell`: a command run in a fresh namespace whose traffic to the host crosses the
//! link engine (mahimahi's `mm-delay` / `mm-loss`, with faultrig's profiles).
//!
//! The namespace's only way out is a TUN device whose peer lives on the host, with the address
//! exported as `FAULTRIG_HOST`: a service on the host listening on that address (or on every
//! interface) is reachable from inside through the impaired link, and nothing else is (no
//! default route, so the command cannot reach other networks by accident). The command's
//! packets going out are the profile's upstream, the host's replies its downstream.

use std::ffi::OsString;
use std::io;
use std::net::{Ipv4Addr, UdpSocket};
use std::process::{Command, ExitStatus};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::engine::{Addrs, End, Link, LinkStats};
use super::netns::{Namespace, NamespaceError};
use crate::profile::Profile;

/// What `faultrig shell` could not do.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error(transparent)]
    Namespace(#[from] NamespaceError),
    #[error("cannot set up the link: {0}")]
    Link(io::Error),
    #[error("cannot start `{command}`: {error}")]
    Spawn { command: String, error: io::Error },
}

/// Runs `command` (program and arguments) behind a link with `profile`, and returns its exit
/// code (128 + the signal's number when a signal ended it, as shells report it).
pub async fn run(profile: &Profile, seed: u64, command: &[OsString]) -> Result<i32, ShellError> {
    let (program, args) = command.split_first().expect("clap requires a command");
    let inside = Namespace::new()?;
    let cc = profile.upstream.congestion_control;
    if let Err(e) = inside.set_congestion_control(cc) {
        eprintln!(
            "faultrig shell: the command's TCP uses the host's default congestion control, not \
             {cc} ({e}): the kernel lets a namespace pick only algorithms in \
             net.ipv4.tcp_allowed_congestion_control",
            cc = cc.as_str()
        );
    }
    let addrs = free_host_subnet();
    let link = Link::start(
        End::Namespace(&inside),
        End::Host,
        addrs,
        profile,
        seed,
        "shell",
    )
    .await
    .map_err(ShellError::Link)?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("FAULTRIG_HOST", addrs.b.to_string())
        .env("FAULTRIG_ADDR", addrs.a.to_string())
        .env("FAULTRIG_PROFILE", &profile.name);
    let mut child = inside.spawn(cmd).map_err(|error| ShellError::Spawn {
        command: program.to_string_lossy().into_owned(),
        error,
    })?;
    let pid = Pid::from_raw(child.id() as i32);
    let mut wait = tokio::task::spawn_blocking(move || child.wait());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ShellError::Link)?;
    let status = loop {
        tokio::select! {
            status = &mut wait => break status.expect("wait does not panic"),
            // Ctrl-C reaches the command through the terminal's process group; SIGTERM is
            // passed on. Either way faultrig waits for the command, then cleans up.
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => { let _ = kill(pid, Signal::SIGTERM); }
        }
    };
    summarise(&link.stats(), profile);
    drop(link);
    drop(inside);
    Ok(exit_code(status.map_err(ShellError::Link)?))
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// One line on stderr: what the link did.
fn summarise(stats: &LinkStats, profile: &Profile) {
    use std::sync::atomic::Ordering::Relaxed;
    let side = |c: &super::engine::DirectionCounters| {
        // How late the engine handed packets over, past their time (read + delay + jitter):
        // the precise timer's error, without the wake-up that read the packet.
        let late = c.lateness();
        let us = |q: f64| late.value_at_quantile(q) as f64 / 1e3;
        format!(
            "{} packets, {} lost, {} queue drops, {} duplicated, {} corrupted, {} reordered, \
             {:.0} us late at the median, {:.0} us late at p99",
            c.packets.load(Relaxed),
            c.dropped_loss.load(Relaxed),
            c.dropped_queue.load(Relaxed),
            c.duplicated.load(Relaxed),
            c.corrupted.load(Relaxed),
            c.reordered.load(Relaxed),
            us(0.5),
            us(0.99),
        )
    };
    eprintln!(
        "faultrig shell ({}): up {}; down {}",
        profile.name,
        side(&stats.a_to_b),
        side(&stats.b_to_a)
    );
}

/// A /30 of 198.18.0.0/15 (set aside for benchmarking, RFC 2544) whose host address is not
/// already on this machine — another shell may be running. Starts from the process id so
/// concurrent shells usually pick different ones at the first try.
fn free_host_subnet() -> Addrs {
    const SUBNETS: u32 = 1 << 15;
    let base = u32::from(Ipv4Addr::new(198, 18, 0, 0));
    let start = std::process::id() % SUBNETS;
    (0..SUBNETS)
        .map(|i| base + ((start + i) % SUBNETS) * 4)
        .map(|net| Addrs {
            a: Ipv4Addr::from(net + 2),
            b: Ipv4Addr::from(net + 1),
        })
        // Binding succeeds only to an address this host already has.
        .find(|addrs| UdpSocket::bind((addrs.b, 0)).is_err())
        .expect("198.18.0.0/15 is not entirely in use")
}
