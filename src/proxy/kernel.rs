//! The proxy's kernel engine: each proxied connection crosses real kernel TCP over the link
//! engine, instead of the fault model.
//!
//! client → proxy → socket in namespace A → *TCP over the impaired link* → socket in namespace
//! B → proxy → upstream. The handshake, losses, retransmissions and congestion control of the
//! middle hop are the kernel's own; the two loopback legs at either end add only the proxy's
//! copy. All connections of a proxy share its link (one namespace pair), as flows share a real
//! path: one bottleneck queue, one loss process per direction.
//!
//! The two legs are copied independently, so the client's bytes enter the link as soon as A's
//! handshake completes (as a real client's would), and each leg owns its link socket: when one
//! leg ends with a reset, dropping its socket sends the RST across the link, where the other
//! leg sees it and resets its own end. Half-close crosses the same way, as a FIN.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::pipe::{self, Ends};
use super::ProxyStats;
use crate::link::{LinkStats, NamespaceError, NamespacePair, PAIR_ADDRS};
use crate::net::Throttle;
use crate::profile::{CongestionControl, Profile};

/// Connections waiting for their far end to be accepted in B, by A's local port.
type Pending = Arc<Mutex<HashMap<u16, oneshot::Sender<TcpStream>>>>;

/// One proxy's namespace pair and the listener in B its connections arrive at.
pub struct KernelPath {
    pair: NamespacePair,
    /// Where the server legs count: they move the bytes the client legs already counted. One
    /// per proxy, not per connection: its lateness histograms are tens of KiB.
    uncounted: ProxyStats,
    target: SocketAddr,
    pending: Pending,
    accept: JoinHandle<()>,
    upstream_cc: CongestionControl,
}

impl KernelPath {
    pub async fn new(
        profile: &Profile,
        seed: u64,
        name: &str,
    ) -> Result<KernelPath, NamespaceError> {
        let pair = NamespacePair::new(profile, seed, name).await?;
        let downstream_cc = profile.downstream.congestion_control;
        let listener = pair
            .b
            .within_async(move || -> io::Result<std::net::TcpListener> {
                let socket = link_socket(downstream_cc)?;
                socket.bind(&SocketAddr::from(SocketAddrV4::new(PAIR_ADDRS.b, 0)).into())?;
                socket.listen(1024)?;
                Ok(socket.into())
            })
            .await
            .map_err(NamespaceError::Setup)?;
        let listener = TcpListener::from_std(listener).map_err(NamespaceError::Setup)?;
        let target = listener.local_addr().map_err(NamespaceError::Setup)?;
        let pending = Pending::default();
        let accept = tokio::spawn(accept_loop(listener, pending.clone(), downstream_cc));
        Ok(KernelPath {
            pair,
            uncounted: ProxyStats::default(),
            target,
            pending,
            accept,
            upstream_cc: profile.upstream.congestion_control,
        })
    }

    /// From now on the link follows `profile` (see [`crate::link::Link::retune`]).
    pub fn retune(&self, profile: &Profile) {
        self.pair.link.retune(profile);
    }

    /// The link's counters.
    pub(crate) fn link_stats(&self) -> Arc<LinkStats> {
        self.pair.link.stats()
    }

    /// Opens a connection across the link: A's socket once its handshake completed, and B's
    /// end once B has accepted it.
    async fn connect(&self) -> io::Result<(TcpStream, oneshot::Receiver<TcpStream>)> {
        let cc = self.upstream_cc;
        let socket = self
            .pair
            .a
            .within_async(move || -> io::Result<Socket> {
                let socket = link_socket(cc)?;
                socket.bind(&SocketAddr::from(SocketAddrV4::new(PAIR_ADDRS.a, 0)).into())?;
                Ok(socket)
            })
            .await?;
        let port = socket
            .local_addr()?
            .as_socket()
            .map(|a| a.port())
            .ok_or_else(|| io::Error::other("link socket has no port"))?;
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .expect("never poisoned")
            .insert(port, tx);
        let connected = TcpSocket::from_std_stream(socket.into())
            .connect(self.target)
            .await;
        match connected {
            Ok(stream) => Ok((stream, rx)),
            Err(e) => {
                self.pending.lock().expect("never poisoned").remove(&port);
                Err(e)
            }
        }
    }
}

impl Drop for KernelPath {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A non-blocking TCP socket for the link: no Nagle (the proxy writes what its client wrote,
/// when it wrote it) and the profile's congestion control, which root may pin whatever
/// `tcp_allowed_congestion_control` says.
fn link_socket(cc: CongestionControl) -> io::Result<Socket> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_nonblocking(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.set_tcp_congestion(cc.as_str().as_bytes())?;
    Ok(socket)
}

/// Accepts the far ends of the connections the proxy opens across the link. It holds none
/// itself (each goes to the connection waiting for it, or is dropped), so it needs no cap of
/// its own: the proxy's accept loop caps the connections that open these.
async fn accept_loop(listener: TcpListener, pending: Pending, cc: CongestionControl) {
    let (mut failures, mut strangers) = (Throttle::new(), Throttle::new());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                if let Some(n) = failures.hit(Instant::now()) {
                    tracing::warn!(
                        "kernel engine: accept in the link namespace failed {n} time(s): {e}"
                    );
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let _ = socket2::SockRef::from(&stream).set_tcp_congestion(cc.as_str().as_bytes());
        let waiting = pending.lock().expect("never poisoned").remove(&peer.port());
        match waiting {
            Some(tx) => {
                let _ = tx.send(stream);
            }
            None => {
                if let Some(n) = strangers.hit(Instant::now()) {
                    tracing::warn!(%peer, "kernel engine: {n} connection(s) nobody opened");
                }
            }
        }
    }
}

/// Carries one proxied connection across the link until both directions are done.
pub async fn serve(
    path: &KernelPath,
    client: &TcpStream,
    upstream: &TcpStream,
    stats: &ProxyStats,
    cancel: &CancellationToken,
    setup_timeout: Duration,
) {
    let connected = tokio::select! {
        _ = cancel.cancelled() => return,
        r = tokio::time::timeout(setup_timeout, path.connect()) => r,
    };
    let (a, far_end) = match connected {
        Ok(Ok(ends)) => ends,
        Ok(Err(e)) => return fail(client, &format!("connecting across the link: {e}")),
        Err(_) => return fail(client, "the handshake across the link timed out"),
    };
    // Bytes are counted once, on the client's leg; the server's leg moves the same bytes.
    let uncounted = &path.uncounted;
    // The connection's own token (the accept loop makes one per connection): a failed far
    // end cancels both legs through it.
    let connection = cancel;
    let client_leg = async {
        let abort = connection.child_token();
        pipe::copy_both(Ends {
            client,
            upstream: &a,
            stats,
            abort: &abort,
        })
        .await;
        // `a` drops here, so a reset reaches the far side now, not when both legs are done.
        drop(a);
    };
    let server_leg = async {
        let b = match tokio::time::timeout(setup_timeout, far_end).await {
            Ok(Ok(b)) => b,
            _ => {
                pipe::reset_on_close(upstream);
                connection.cancel();
                return fail(client, "the link's far end never arrived");
            }
        };
        let abort = connection.child_token();
        pipe::copy_both(Ends {
            client: &b,
            upstream,
            stats: uncounted,
            abort: &abort,
        })
        .await;
        drop(b);
    };
    tokio::join!(client_leg, server_leg);
}

fn fail(client: &TcpStream, why: &str) {
    tracing::warn!("kernel engine: {why}; resetting the client connection");
    pipe::reset_on_close(client);
}
