//! Socket set-up shared by every listener faultrig opens.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Accept queue length: per-call connection modes open connections in bursts, and a short
/// queue would turn a burst into SYN drops and one-second retransmission stalls that no profile
/// asked for. The kernel caps it at `net.core.somaxconn`.
const BACKLOG: u32 = 4096;

/// Splits `HOST:PORT` (a name, an IPv4 address or a bracketed IPv6 address, and a port).
pub(crate) fn split_host_port(s: &str) -> Result<(&str, u16), String> {
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() => match port.parse::<u16>() {
            Ok(port) => Ok((host, port)),
            Err(_) => Err(format!("\"{s}\" is not HOST:PORT (bad port \"{port}\")")),
        },
        _ => Err(format!("\"{s}\" is not HOST:PORT")),
    }
}

/// Binds a listener with a deep accept queue (and `SO_REUSEADDR`, so a restarted run can reuse
/// its port at once).
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Connections one accept loop holds at once unless told otherwise (`--max-connections`), and
/// never more than its file-descriptor limit leaves room for ([`connection_cap`]).
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 65_536;

/// Descriptors kept out of the connection budget: the runtime's own (epoll, eventfds, the
/// timer), standard streams, a downstream Redis connection, the reserve of [`accept_until`].
const FD_MARGIN: u64 = 64;

/// How long an HTTP/1.1 server waits for a request's headers, counted from when it starts
/// waiting for them: on a new connection and after each response. So it is also the idle limit
/// of a kept-alive connection, and what frees a slowloris client's connection. A header crosses
/// even a lossy profile in a few round trips; 10 s leaves room for several RTO back-offs.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 servers PING a connection that has been silent this long, and close it if the PING is
/// not answered within [`H2_KEEP_ALIVE_TIMEOUT`]: a peer that vanished (no FIN, no RST) stops
/// holding a connection slot. A live but idle client answers PINGs and keeps its connection, as
/// gRPC channels expect.
pub(crate) const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
pub(crate) const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// TCP keep-alive on every accepted connection: a peer silent this long is probed every
/// [`KEEPALIVE_INTERVAL`], and after [`KEEPALIVE_PROBES`] unanswered probes the connection
/// fails. So a peer that vanished without a FIN or RST (a crashed host, a dropped route) stops
/// holding a connection slot after about a minute and a half, whatever the protocol (tcp-binary
/// and Thrift have no PING of their own; a proxied connection may be quiet on purpose). The
/// probes carry no data: a live peer's kernel answers them, so nothing measured changes.
pub(crate) const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub(crate) const KEEPALIVE_PROBES: u32 = 3;

fn keep_alive(stream: &TcpStream) {
    let probes = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    // Best effort: a connection without it is still served.
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&probes);
}

/// The most connections a loop may hold: `requested` as given, or by default
/// [`DEFAULT_MAX_CONNECTIONS`] but no more than the soft `RLIMIT_NOFILE` leaves room for at
/// `fds_per_connection` each (a proxy holds two). Refusing at the cap is cheap and prompt;
/// running out of descriptors would also fail work for connections already held (a proxy's
/// upstream connect). A cap set above that room is honoured: past the descriptors,
/// [`accept_until`] still refuses what it cannot hold, only less cheaply.
pub(crate) fn connection_cap(requested: Option<usize>, fds_per_connection: usize) -> usize {
    use nix::sys::resource::{getrlimit, Resource};
    if let Some(n) = requested {
        return n.max(1);
    }
    let room = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => soft.saturating_sub(FD_MARGIN) / fds_per_connection.max(1) as u64,
        Err(_) => u64::MAX,
    };
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    DEFAULT_MAX_CONNECTIONS.min(room).max(1)
}

/// Counts one kind of event and says when to log it: the first at once, then at most one line
/// per [`Throttle::EVERY`] carrying the count of those held back, so a flood of refusals costs
/// a line a second rather than a line each.
#[derive(Debug)]
pub(crate) struct Throttle {
    last: Option<Instant>,
    held: u64,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new()
    }
}

impl Throttle {
    /// The shortest gap between two lines.
    pub(crate) const EVERY: Duration = Duration::from_secs(1);

    pub const fn new() -> Throttle {
        Throttle {
            last: None,
            held: 0,
        }
    }

    /// Counts one event at `now`; `Some(n)` when a line is due, for `n` events (this one and
    /// those held back since the last line).
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        self.held += 1;
        self.due(now)
    }

    /// `Some(n)` when events are held back and a line is due for them.
    pub(crate) fn due(&mut self, now: Instant) -> Option<u64> {
        if self.held == 0 || self.last.is_some_and(|l| now < l + Self::EVERY) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }

    /// When held-back events will be due, if any are held.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        match (self.held, self.last) {
            (0, _) => None,
            (_, last) => Some(last.map_or_else(Instant::now, |l| l + Self::EVERY)),
        }
    }
}

/// Why an accept loop turned connections away, one throttled log line per kind.
#[derive(Debug, Default)]
struct Refusals {
    /// Accepted and reset at once: the loop already holds its cap.
    over_cap: Throttle,
    /// Accepted with the reserve descriptor and reset: the process is out of descriptors.
    no_fds: Throttle,
    /// `accept` itself failed for another reason.
    failed: Throttle,
    last_error: String,
}

impl Refusals {
    fn log(&mut self, label: &str, cap: usize, now: Instant) {
        if let Some(n) = self.over_cap.due(now) {
            tracing::warn!("{label}: refused {n} connection(s): at the cap of {cap} connections");
        }
        if let Some(n) = self.no_fds.due(now) {
            tracing::warn!("{label}: refused {n} connection(s): out of file descriptors");
        }
        if let Some(n) = self.failed.due(now) {
            tracing::warn!("{label}: accept failed {n} time(s): {}", self.last_error);
        }
    }

    fn next_due(&self) -> Option<Instant> {
        [&self.over_cap, &self.no_fds, &self.failed]
            .iter()
            .filter_map(|t| t.next_due())
            .min()
    }
}

/// One single-threaded runtime per core, each on its own thread with its own epoll, over
/// which a proxy spreads its connections (all the process's proxies share them).
///
/// A proxy's work per call is a read and a write on each side, and much of its cost is in the
/// wake-ups around them: on tokio's work-stealing pool, whichever worker holds the shared I/O
/// driver takes every ready connection and may wake an idle worker to steal it, so a call's two
/// hops often cross threads. Kept on one thread with its own epoll, a connection is served
/// where its sockets' events land, as HAProxy's threads do. Measured side
/// by side on a two-core machine (`scripts/bench-proxy.sh --vs`, small calls): 12–18 % more
/// calls/s at 16 connections than the same proxy on the pool, 0–11 % at 64, sequential calls
/// unchanged (docs/engines.md has the figures). The cost is balance: a connection never moves,
/// so two bulk streams placed on one shard share a core while another may idle. Placing each
/// new connection on the shard holding the fewest keeps long-lived ones apart.
pub(crate) struct Shards {
    shards: Vec<Shard>,
}

struct Shard {
    runtime: tokio::runtime::Handle,
    /// Connections placed here and not yet ended.
    live: Arc<AtomicUsize>,
}

/// A connection's place on a shard: released (the shard's count dropped) with it.
struct Placed(Arc<AtomicUsize>);

impl Drop for Placed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Shards {
    /// The process's shards, one per available core, started on first use. `None` if they
    /// could not be started (no thread or runtime to be had): connections then run where they
    /// were accepted, as every other server's do.
    pub(crate) fn get() -> Option<&'static Shards> {
        static SHARDS: OnceLock<Option<Shards>> = OnceLock::new();
        SHARDS
            .get_or_init(|| {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                Shards::start(cores)
                    .inspect_err(|e| {
                        tracing::warn!("no connection shards ({e}); connections run unsharded")
                    })
                    .ok()
            })
            .as_ref()
    }

    /// `n` shards of their own, whose threads live as long as the process.
    fn start(n: usize) -> io::Result<Shards> {
        let shards = (0..n.max(1)).map(Shard::start).collect::<io::Result<_>>()?;
        Ok(Shards { shards })
    }

    fn least_loaded(&self) -> &Shard {
        self.shards
            .iter()
            .min_by_key(|s| s.live.load(Ordering::Relaxed))
            .expect("at least one shard")
    }
}

impl Shard {
    fn start(index: usize) -> io::Result<Shard> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        // The thread lives as long as the process: shards are shared by every proxy in it.
        std::thread::Builder::new()
            .name(format!("faultrig-shard-{index}"))
            .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
        Ok(Shard {
            runtime: handle,
            live: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// `stream`, accepted on another runtime, re-registered with this shard's I/O driver; the
    /// runtime to spawn it on, and its place here.
    fn adopt(&self, stream: TcpStream) -> io::Result<(TcpStream, tokio::runtime::Handle, Placed)> {
        let stream = stream.into_std()?;
        let _here = self.runtime.enter();
        let stream = TcpStream::from_std(stream)?;
        self.live.fetch_add(1, Ordering::Relaxed);
        Ok((stream, self.runtime.clone(), Placed(self.live.clone())))
    }
}

/// Closes a connection with a reset: the peer learns at once that it was refused, and no
/// TIME_WAIT is left behind on our side.
fn refuse(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
}

fn out_of_fds(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(nix::errno::Errno::from_raw),
        Some(nix::errno::Errno::EMFILE | nix::errno::Errno::ENFILE)
    )
}

/// A server running on its own task (a proxy, a flavour's server, the control API): where it
/// listens, and its stop. Dropped, it stops at once; [`Served::stop`] also waits until it has
/// closed every connection. Every in-process server a run, a test or a benchmark starts is held
/// in one of these, so none outlives its owner.
#[derive(Debug)]
pub struct Served {
    addr: SocketAddr,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<io::Result<()>>>,
}

impl Served {
    /// Spawns `serve(listener, shutdown)`, the shape of every server here (`Proxy::run`,
    /// `flavour::serve`, `api::run`).
    pub fn spawn<F, Fut>(listener: TcpListener, serve: F) -> io::Result<Served>
    where
        F: FnOnce(TcpListener, tokio_util::sync::WaitForCancellationFutureOwned) -> Fut,
        Fut: Future<Output = io::Result<()>> + Send + 'static,
    {
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(listener, stop.clone().cancelled_owned()));
        Ok(Served {
            addr,
            stop,
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes every connection, and returns once they are closed, with the
    /// server's own result.
    pub async fn stop(mut self) -> io::Result<()> {
        self.stop.cancel();
        let task = self.task.take().expect("taken only here");
        task.await.unwrap_or_else(|e| Err(io::Error::other(e)))
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Accepts connections until `shutdown` completes, running `handle(stream, peer, cancel)` for
/// each as its own task; then cancels every connection's token and waits for their tasks. Every
/// server in faultrig (proxies and RPC servers) accepts through here.
///
/// At most `max_connections` run at once. Past the cap a connection is accepted and reset at
/// once rather than left in the accept queue: a queued client would wait, believing itself
/// connected, until its own timeout, and the queue (thousands deep) would hand the loop stale
/// connections long after their clients gave up. A reset costs a peer one round trip to learn,
/// and us no more work than the peer spent opening it. Out of descriptors, the loop frees a
/// reserve descriptor to accept and reset the connection it cannot hold (instead of leaving it
/// to make `accept` fail again and again), then takes the reserve back. Refusals and failures
/// are logged at most once a second per kind, with their count.
///
/// With `shards`, each connection runs on the least loaded of them instead of on the runtime
/// that accepted it (see [`Shards`]).
pub(crate) async fn accept_until<F, Fut>(
    listener: TcpListener,
    shutdown: impl Future,
    label: &str,
    max_connections: usize,
    shards: Option<&'static Shards>,
    mut handle: F,
) -> io::Result<()>
where
    F: FnMut(TcpStream, SocketAddr, CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let cancel = CancellationToken::new();
    // Dropped rather than stopped (its runtime shutting down), the loop still ends every
    // connection: those on shards would otherwise outlive it.
    let _cancel_on_drop = cancel.clone().drop_guard();
    let tasks = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(max_connections));
    let mut reserve = std::fs::File::open("/dev/null").ok();
    let mut refusals = Refusals::default();
    tokio::pin!(shutdown);
    loop {
        let flush_at = refusals.next_due();
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep_until(flush_at.unwrap_or_else(Instant::now).into()),
                if flush_at.is_some() =>
            {
                refusals.log(label, max_connections, Instant::now());
                continue;
            }
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => match slots.clone().try_acquire_owned() {
                Ok(slot) => {
                    keep_alive(&stream);
                    // Where the connection runs: on the runtime that accepted it, or moved to
                    // the least loaded shard, holding its place there until it ends.
                    let placed = match shards {
                        None => Ok((stream, tokio::runtime::Handle::current(), None)),
                        Some(shards) => (shards.least_loaded().adopt(stream))
                            .map(|(stream, shard, place)| (stream, shard, Some(place))),
                    };
                    match placed {
                        Ok((stream, runtime, place)) => {
                            let connection = handle(stream, peer, cancel.child_token());
                            // `map`, not an async block awaiting it: the block would hold the
                            // future twice (captured, and again while awaited), doubling every
                            // connection's task.
                            let task = connection.map(move |()| drop((slot, place)));
                            tasks.spawn_on(task, &runtime);
                        }
                        Err(e) => {
                            // The socket is closed with the error; its peer sees a reset.
                            refusals.failed.held += 1;
                            refusals.last_error = format!("moving a connection to a shard: {e}");
                        }
                    }
                }
                Err(_) => {
                    refuse(stream);
                    refusals.over_cap.held += 1;
                }
            },
            Err(e) if out_of_fds(&e) && reserve.is_some() => {
                // The pending connection is still queued: take it with the reserve's slot.
                drop(reserve.take());
                if let Some(Ok((stream, _))) = listener.accept().now_or_never() {
                    refuse(stream);
                }
                refusals.no_fds.held += 1;
                reserve = std::fs::File::open("/dev/null").ok();
                if reserve.is_none() {
                    // Someone else took the descriptor: back off as for any other failure.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Err(e) => {
                // Out of descriptors with no reserve, or worse: keep serving the connections we
                // have, and try again shortly rather than spinning on the error.
                refusals.failed.held += 1;
                refusals.last_error = e.to_string();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        refusals.log(label, max_connections, Instant::now());
        if reserve.is_none() {
            reserve = std::fs::File::open("/dev/null").ok();
        }
    }
    refusals.log(label, max_connections, Instant::now() + Throttle::EVERY);
    cancel.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first event is logged at once; the rest of the second's are held and logged as one
    /// count when the second is up; a quiet throttle has nothing to log.
    #[test]
    fn a_throttle_logs_once_a_second_with_the_count() {
        let t0 = Instant::now();
        let mut t = Throttle::new();
        assert_eq!(t.due(t0), None);
        assert_eq!(t.next_due(), None);
        assert_eq!(t.hit(t0), Some(1));
        for i in 1..=500u32 {
            assert_eq!(t.hit(t0 + Duration::from_micros(i.into())), None);
        }
        assert_eq!(t.next_due(), Some(t0 + Throttle::EVERY));
        assert_eq!(t.due(t0 + Throttle::EVERY / 2), None);
        assert_eq!(t.due(t0 + Throttle::EVERY), Some(500));
        assert_eq!(t.due(t0 + Throttle::EVERY * 3), None);
        assert_eq!(t.hit(t0 + Throttle::EVERY * 3), Some(1));
    }

    /// The default cap fits the descriptor limit; a cap given is used as is.
    #[test]
    fn the_default_cap_fits_the_descriptor_limit() {
        use nix::sys::resource::{getrlimit, Resource};
        let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        for fds in [1, 2, 4] {
            let cap = connection_cap(None, fds) as u64;
            assert!(cap <= DEFAULT_MAX_CONNECTIONS as u64);
            assert!(cap * fds as u64 + FD_MARGIN <= soft.max(FD_MARGIN + fds as u64));
        }
        assert_eq!(connection_cap(Some(1_000_000), 2), 1_000_000);
    }

    /// [`accept_until`] on a free loopback port as its own task: the port, its stop, the task.
    fn accept_on_a_free_port<F, Fut>(
        cap: usize,
        shards: Option<&'static Shards>,
        handle: F,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<io::Result<()>>,
    )
    where
        F: FnMut(TcpStream, SocketAddr, CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(accept_until(listener, stopped, "test", cap, shards, handle));
        (addr, stop, server)
    }

    /// Accepted connections get TCP keep-alive with our timings; connections over the cap are
    /// reset at once while the held one stays served.
    #[tokio::test]
    async fn accepted_connections_keep_alive_and_the_cap_resets_the_rest() {
        use tokio::io::AsyncReadExt;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (addr, stop, server) = accept_on_a_free_port(1, None, move |s, _, c| {
            let sock = socket2::SockRef::from(&s);
            let _ = tx.send((
                sock.keepalive().unwrap(),
                sock.tcp_keepalive_time().unwrap(),
            ));
            async move {
                c.cancelled().await;
                drop(s);
            }
        });
        let _held = TcpStream::connect(addr).await.unwrap();
        assert_eq!(rx.recv().await, Some((true, KEEPALIVE_IDLE)));
        let mut refused = TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), refused.read(&mut byte));
        match read.await.expect("refused promptly") {
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset),
            Ok(n) => panic!("read {n} bytes instead of a reset"),
        }
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }

    /// With shards, each connection runs on a shard's thread, the next one on the shard holding
    /// the fewest (so connections held open spread over every shard); a connection ends with
    /// its loop when the loop is stopped, and also when the loop is only dropped (its runtime
    /// shutting down): a shard would otherwise keep it.
    #[tokio::test]
    async fn sharded_connections_spread_over_every_shard_and_end_with_their_loop() {
        use tokio::io::AsyncReadExt;
        // Shards of its own: tests running beside it place their connections on the
        // process's, which would skew where these go.
        let n = 3;
        let shards: &'static Shards = Box::leak(Box::new(Shards::start(n).unwrap()));
        for stop_by_drop in [false, true] {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let (addr, stop, server) = accept_on_a_free_port(100, Some(shards), move |s, _, c| {
                let tx = tx.clone();
                async move {
                    let thread = std::thread::current().name().map(String::from);
                    let _ = tx.send(thread);
                    c.cancelled().await;
                    drop(s);
                }
            });
            let mut clients = Vec::new();
            let mut threads = std::collections::BTreeSet::new();
            // One at a time, so each is placed knowing where the last went.
            for _ in 0..2 * n {
                clients.push(TcpStream::connect(addr).await.unwrap());
                let thread = rx.recv().await.unwrap().unwrap_or_default();
                assert!(thread.starts_with("faultrig-shard-"), "ran on {thread:?}");
                threads.insert(thread);
            }
            assert_eq!(threads.len(), n, "every shard holds some: {threads:?}");
            if stop_by_drop {
                server.abort();
                let _ = server.await;
            } else {
                let _ = stop.send(());
                server.await.unwrap().unwrap();
            }
            for mut c in clients {
                let mut byte = [0u8; 1];
                let read = tokio::time::timeout(Duration::from_secs(10), c.read(&mut byte));
                let ended = read.await.expect("closed with its loop");
                assert!(matches!(ended, Ok(0) | Err(_)), "closed, not {ended:?}");
            }
        }
        // Every connection above has ended: their places are given back.
        let deadline = Instant::now() + Duration::from_secs(10);
        while shards
            .shards
            .iter()
            .any(|s| s.live.load(Ordering::Relaxed) > 0)
        {
            assert!(Instant::now() < deadline, "places given back");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
