//! A private `redis-server` on a free loopback port: what an experiment's `deduct@redis` cells
//! and the tests call as their backend. It binds 127.0.0.1 only, saves nothing to disk, and
//! is stopped and reaped on drop.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a fresh redis-server gets to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct LocalRedis {
    child: Child,
    /// The loopback port it serves on.
    pub port: u16,
}

impl LocalRedis {
    /// Starts `redis-server` (found on PATH) and waits until it answers. With `supervisor`
    /// (the faultrig binary), it runs under `faultrig supervise`, so it ends when this process
    /// does, even killed outright ([`crate::child`]).
    pub fn start(supervisor: Option<&Path>) -> Result<LocalRedis, RedisStartError> {
        // The free port is found by binding and releasing it; another process can take it in
        // between, in which case redis-server exits and we try again with another.
        let mut last_error = None;
        for _ in 0..3 {
            let port = free_port().map_err(RedisStartError::NoPort)?;
            let mut command = match supervisor {
                Some(bin) => {
                    let mut c = crate::child::supervised(bin);
                    c.arg("redis-server");
                    c
                }
                None => Command::new("redis-server"),
            };
            let mut child = command
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "yes",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(RedisStartError::Spawn)?;
            match wait_for_pong(&mut child, port) {
                Ok(()) => return Ok(LocalRedis { child, port }),
                Err(e) => {
                    crate::child::stop(&mut child);
                    last_error = Some(e);
                }
            }
        }
        Err(RedisStartError::NoAnswer(
            last_error.expect("every attempt that got here failed"),
        ))
    }

    /// `redis://127.0.0.1:PORT`, for `--backend`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        // SIGTERM first: a supervisor stops its redis-server on it, a SIGKILL would orphan it.
        crate::child::stop(&mut self.child);
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// Why a private redis-server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RedisStartError {
    #[error("find a free port for Redis: {0}")]
    NoPort(std::io::Error),
    #[error("cannot start redis-server ({0}); install it (Debian: redis-server)")]
    Spawn(std::io::Error),
    #[error("redis-server did not start: {0}")]
    NoAnswer(NoPong),
}

/// Why one start of redis-server never answered.
#[derive(Debug, thiserror::Error)]
pub enum NoPong {
    #[error("redis-server exited at start ({0})")]
    Exited(std::process::ExitStatus),
    #[error("no PONG from {addr} within {within:?}")]
    Silent { addr: SocketAddr, within: Duration },
}

fn wait_for_pong(child: &mut Child, port: u16) -> Result<(), NoPong> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(NoPong::Exited(status));
        }
        if ping(addr).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(NoPong::Silent {
                addr,
                within: START_TIMEOUT,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One PING through the same client the servers use.
fn ping(addr: SocketAddr) -> redis::RedisResult<()> {
    let client = redis::Client::open(format!("redis://{addr}"))?;
    let mut conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
    redis::cmd("PING").query::<String>(&mut conn).map(drop)
}
