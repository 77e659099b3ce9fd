//! Socket set-up shared by every listener faultrig opens.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Accept queue length: per-call connection modes open connections in bursts, and a short
/// queue would turn a burst into SYN drops and one-second retransmission stalls that no profile
/// asked for. The kernel caps it at `net.core.somaxconn`.
const BACKLOG: u32 = 4096;

/// Splits `HOST:PORT` (a name, an IPv4 address or a bracketed IPv6 address, and a port).
pub fn split_host_port(s: &str) -> Result<(&str, u16), String> {
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

/// Accepts connections until `shutdown` completes, running `handle(stream, peer, cancel)` for
/// each as its own task; then cancels every connection's token and waits for their tasks. Every
/// server in faultrig (proxies and RPC servers) accepts through here.
pub async fn accept_until<F, Fut>(
    listener: TcpListener,
    shutdown: impl Future,
    label: &str,
    mut handle: F,
) -> io::Result<()>
where
    F: FnMut(TcpStream, SocketAddr, CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let cancel = CancellationToken::new();
    let tasks = TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                tasks.spawn(handle(stream, peer, cancel.child_token()));
            }
            Err(e) => {
                // Out of file descriptors and the like: keep serving the connections we have,
                // and try again shortly rather than spinning on the error.
                tracing::warn!("{label}: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    cancel.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}
