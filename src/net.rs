//! Socket set-up shared by every listener faultrig opens.

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// Accept queue length: per-call connection modes open connections in bursts, and a short
/// queue would turn a burst into SYN drops and one-second retransmission stalls that no profile
/// asked for. The kernel caps it at `net.core.somaxconn`.
const BACKLOG: u32 = 4096;

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
