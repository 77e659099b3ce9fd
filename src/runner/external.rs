//! An external flavour's processes in a local run ([`crate::external`]): its server, started
//! under `faultrig supervise` so it ends with the run however the run ends, and its client,
//! run once per cell with a time limit, its standard output read line by line into a row.
//! A client that fails, hangs or prints garbage fails its cell, with the reason; the run goes
//! on with the next cell.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

use super::{Measured, Probe};
use crate::bench::{BenchOutcome, Stop};
use crate::experiment::{Cell, Experiment};
use crate::external::{
    client_limit, ExternalFlavour, ExternalServer, Line, Placeholder, Tail, Tally, MAX_LINE,
};
use crate::results::Row;
use crate::workload::Generator;

/// How long a server may take to accept connections, and a client to start and stop beyond
/// its calls: a JVM's start is seconds.
const START: Duration = Duration::from_secs(30);

/// A started external server; stopped (SIGTERM, then SIGKILL) and reaped on drop.
#[derive(Debug)]
pub(crate) struct ServerProcess {
    child: Child,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // SIGTERM first: the supervisor stops its program on it, a SIGKILL would orphan it.
        crate::child::stop(&mut self.child);
    }
}

/// Why an external flavour's server is not there to call.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("find a free loopback port")]
    NoPort(#[source] std::io::Error),
    #[error("external flavour {name}: start its server")]
    Start {
        name: String,
        source: std::io::Error,
    },
    #[error("external flavour {name}: its server ({command}) {why}{stderr}")]
    Failed {
        name: String,
        command: String,
        why: String,
        /// `; its stderr ends: ...`, or empty ([`Tail::describe`]).
        stderr: String,
    },
}

/// The flavour's server: started on a free loopback port and waited for until it accepts, or
/// (`target`) the address given. Returns the process (if started) and the address.
pub(crate) fn start_server(
    bin: &Path,
    x: &ExternalFlavour,
    nodelay: bool,
) -> Result<(Option<ServerProcess>, String), ServerError> {
    let template = match &x.server {
        ExternalServer::Target(addr) => return Ok((None, addr.clone())),
        ExternalServer::Serve(t) => t,
    };
    // Found by binding and releasing: the server binds it again (another process could take it
    // in between; then the server fails to start, with its message).
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map_err(ServerError::NoPort)?
        .port();
    let argv = template.fill(|p| match p {
        Placeholder::Host => Ipv4Addr::LOCALHOST.to_string(),
        Placeholder::Port => port.to_string(),
        Placeholder::Nodelay => nodelay.to_string(),
        other => unreachable!(
            "serve was checked to hold only {:?}, not {other:?}",
            Placeholder::SERVE
        ),
    });
    let mut command = crate::child::supervised(bin);
    command
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|source| ServerError::Start {
        name: x.name.clone(),
        source,
    })?;
    let (tail, drained) = drain(child.stderr.take().map(|e| Box::new(e) as _));
    // Guarded from here: every early return stops and reaps it.
    let mut server = ServerProcess { child };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + START;
    let failed = |why: String| {
        let _ = drained.recv_timeout(Duration::from_secs(1));
        ServerError::Failed {
            name: x.name.clone(),
            command: argv.join(" "),
            why,
            stderr: tail.lock().expect("never poisoned").describe(),
        }
    };
    loop {
        if let Ok(Some(status)) = server.child.try_wait() {
            return Err(failed(format!(
                "exited ({status}) before accepting on {addr}"
            )));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok((Some(server), addr.to_string()));
        }
        if Instant::now() > deadline {
            crate::child::stop(&mut server.child);
            return Err(failed(format!(
                "did not accept connections on {addr} within {START:?}; stopped"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads a process's standard error to its end on a thread, keeping the last lines; the
/// receiver hears when it is done. Lines are cut at [`MAX_LINE`], so an endless one costs no
/// memory.
fn drain(pipe: Option<Box<dyn Read + Send>>) -> (Arc<Mutex<Tail>>, mpsc::Receiver<()>) {
    let tail = Arc::new(Mutex::new(Tail::default()));
    let (done, drained) = mpsc::channel();
    let kept = tail.clone();
    std::thread::spawn(move || {
        let Some(mut pipe) = pipe else {
            let _ = done.send(());
            return;
        };
        let mut line = Vec::new();
        let mut chunk = [0u8; 4096];
        let push = |line: &mut Vec<u8>| {
            kept.lock()
                .expect("never poisoned")
                .push(&String::from_utf8_lossy(line));
            line.clear();
        };
        while let Ok(n @ 1..) = pipe.read(&mut chunk) {
            for &b in &chunk[..n] {
                if b == b'\n' {
                    push(&mut line);
                } else if line.len() < MAX_LINE {
                    line.push(b);
                }
            }
        }
        if !line.is_empty() {
            push(&mut line);
        }
        let _ = done.send(());
    });
    (tail, drained)
}

/// Why a cell's client gave no row.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CellError {
    #[error("cannot start {program}: {source}")]
    Start {
        program: String,
        source: std::io::Error,
    },
    #[error("stdout line {number} is not in the format ({why}): {line:?}")]
    Garbage {
        number: u64,
        line: String,
        why: String,
    },
    #[error("exited ({status}) after {lines} lines of output")]
    Exit { status: ExitStatus, lines: u64 },
    #[error("still running after {0:?} (its warm-up, its calls at one timeout each, and {START:?} to start); stopped")]
    TimedOut(Duration),
    #[error("exited (0) without reporting a call")]
    NoCalls,
    #[error("reading its output: {0}")]
    Read(std::io::Error),
}

/// A cell's client failed: why, and the last lines of its standard error.
#[derive(Debug, thiserror::Error)]
#[error("{error}{stderr}")]
pub(crate) struct ClientFailed {
    pub error: CellError,
    /// `; its stderr ends: ...`, or empty ([`Tail::describe`]).
    pub stderr: String,
}

impl From<CellError> for ClientFailed {
    fn from(error: CellError) -> ClientFailed {
        ClientFailed {
            error,
            stderr: String::new(),
        }
    }
}

/// A cell's client, under its supervisor. Dropped while running (an interrupted run), it is
/// sent SIGTERM, which the supervisor passes on; tokio reaps it.
struct ClientProcess(tokio::process::Child);

impl ClientProcess {
    /// SIGTERM (the supervisor stops the client), SIGKILL if still there after a grace period.
    async fn stop(&mut self) {
        if let Some(pid) = self.0.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            if tokio::time::timeout(STOP_GRACE, self.0.wait())
                .await
                .is_err()
            {
                let _ = self.0.kill().await;
            }
        }
    }
}

impl Drop for ClientProcess {
    fn drop(&mut self) {
        // `id` is None once it has been waited for.
        if let Some(pid) = self.0.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
    }
}

/// How long a client gets to stop on SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Runs the cell's client against `addr` (the cell's proxy) and makes its row. `begin` reads
/// the counters: once before the client starts, and again when it says `begin`, so they cover
/// the same calls as the row. The client is killed if this future is dropped (an interrupted
/// run) or runs past its limit.
pub(crate) async fn run_cell<F: std::future::Future<Output = Probe>>(
    bin: &Path,
    x: &ExternalFlavour,
    exp: &Experiment,
    cell: &Cell,
    addr: &str,
    begin: impl Fn() -> F,
) -> Result<Measured, ClientFailed> {
    let (host, port) = crate::net::split_host_port(addr).unwrap_or((addr, 0));
    let (calls, duration_ms) = match exp.stop {
        Stop::Calls(n) => (n, 0),
        Stop::Duration(d) => (0, d.as_millis()),
    };
    let argv = x.client.fill(|p| match p {
        Placeholder::Host => host.to_string(),
        Placeholder::Port => port.to_string(),
        Placeholder::Target => addr.to_string(),
        Placeholder::Mode => cell.mode.to_string(),
        Placeholder::Calls => calls.to_string(),
        Placeholder::DurationMs => duration_ms.to_string(),
        Placeholder::Concurrency => cell.concurrency.to_string(),
        Placeholder::Workload => cell.workload.label.clone(),
        Placeholder::Seed => exp.seed.to_string(),
        Placeholder::TimeoutMs => exp.timeout.as_millis().to_string(),
        Placeholder::WarmupMs => exp.warmup.as_millis().to_string(),
        Placeholder::Nodelay => cell.nodelay.to_string(),
        Placeholder::WritePattern => cell.write_pattern.as_str().to_string(),
        Placeholder::Profile => exp.profiles[cell.profile].name.clone(),
    });
    let limit = client_limit(exp.stop, exp.warmup, exp.timeout, cell.concurrency, START);
    let mut before = begin().await;
    // The proxy's connection count, should the client not give its own, runs from here: a
    // reading at `begin` would race the client's first connection (it does not wait for us).
    let connections_at_start = before.proxy.as_ref().map(|p| p.connections);
    // Under `faultrig supervise`, as the server is: a run killed outright takes the client
    // with it ([`crate::child`]); spawned from the run's main thread, which the kernel's
    // parent-death signal is tied to.
    let mut child = ClientProcess(
        tokio::process::Command::from(crate::child::supervised(bin))
            .args(&argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| CellError::Start {
                program: bin.display().to_string(),
                source,
            })?,
    );
    let stderr = child
        .0
        .stderr
        .take()
        .and_then(|e| e.into_owned_fd().ok())
        .map(|fd| Box::new(std::fs::File::from(fd)) as _);
    let (tail, drained) = drain(stderr);
    let stderr_tail = || {
        // The process has ended (or been killed): its last words are in the pipe, or soon.
        let _ = drained.recv_timeout(Duration::from_secs(1));
        tail.lock().expect("never poisoned").describe()
    };
    let mut reader = tokio::io::BufReader::new(child.0.stdout.take().expect("piped"));
    let mut tally = Tally::default();
    let (mut started_at, mut start) = (SystemTime::now(), Instant::now());
    let mut last_call = start;
    let mut number = 0u64;
    let read = async {
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = (&mut reader)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut buf)
                .await
                .map_err(CellError::Read)?;
            if n == 0 {
                return Ok(());
            }
            number += 1;
            let garbage = |why: String| CellError::Garbage {
                number,
                line: String::from_utf8_lossy(&buf).trim_end().to_string(),
                why,
            };
            if buf.len() > MAX_LINE {
                return Err(garbage(format!("longer than {MAX_LINE} bytes")));
            }
            let text = std::str::from_utf8(&buf).map_err(|_| garbage("not UTF-8".into()))?;
            let line = Line::parse(text).map_err(|e| garbage(e.to_string()))?;
            match line {
                Line::Begin => {
                    before = begin().await;
                    (started_at, start) = (SystemTime::now(), Instant::now());
                    last_call = start;
                }
                Line::Call { .. } => last_call = Instant::now(),
                Line::Conns(_) | Line::Ignored => {}
            }
            tally.add(line);
        }
    };
    let ended = tokio::time::timeout(limit, async {
        read.await?;
        child.0.wait().await.map_err(CellError::Read)
    })
    .await
    .unwrap_or(Err(CellError::TimedOut(limit)));
    let failed = |error: CellError| ClientFailed {
        error,
        stderr: stderr_tail(),
    };
    let status = match ended {
        Ok(status) => status,
        Err(e) => {
            // Killed before its stderr is read: a client stopped mid-call has said why, if at all.
            child.stop().await;
            return Err(failed(e));
        }
    };
    if !status.success() {
        return Err(failed(CellError::Exit {
            status,
            lines: number,
        }));
    }
    let calls = tally.calls();
    if calls == 0 {
        return Err(failed(CellError::NoCalls));
    }
    let conns = tally.conns;
    let outcome = BenchOutcome {
        started_at,
        elapsed: last_call
            .duration_since(start)
            .max(Duration::from_micros(1)),
        calls,
        ok: tally.ok,
        errors: tally.errors,
        latency: tally.latency,
        conns_opened: conns.unwrap_or(0),
        bytes_out: 0,
        bytes_in: 0,
        payload_bytes: Generator::new(cell.workload.workload, exp.seed).payload_bytes(),
        sample_errors: Vec::new(),
    };
    let row = Row {
        flavour: x.name.clone(),
        mode: cell.mode.to_string(),
        workload: cell.workload.label.clone(),
        concurrency: cell.concurrency as u32,
        seed: exp.seed,
        nodelay: Some(cell.nodelay),
        write_pattern: Some(cell.write_pattern.as_str().to_string()),
        // The client's sockets are its own: what crossed the wire is the proxy's bytes_up and
        // bytes_down.
        req_bytes: None,
        resp_bytes: None,
        ..outcome.measured_row()
    };
    Ok(Measured {
        row,
        before,
        conns_since: match conns {
            Some(_) => None,
            None => connections_at_start,
        },
    })
}
