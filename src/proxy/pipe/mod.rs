//! Moving one connection's bytes, both directions at once.
//!
//! Each direction ends in one of three ways, and the proxy mirrors what it saw:
//! - the source sends FIN: after every byte before it is delivered, the destination gets FIN
//!   (half-close; the other direction carries on);
//! - the source resets (or reading fails): after the bytes before it, the destination is reset;
//! - writing to the destination fails: its peer is gone, so the source is reset.
//!
//! A reset aborts the whole connection: the caller drops both sockets, and `SO_LINGER 0` turns
//! that close into an RST.
//!
//! No buffer is held while a direction waits for data, so idle connections cost only their
//! task and sockets.

//!
//! - [`copy`]: unimpaired connections, and a control-API connection until its first toxic;
//! - [`schedule`]: impaired ones, each direction a reader that asks the model when its bytes
//!   are due and a writer that delivers them then;
//! - [`live`]: a control-API connection's toxics, followed while it is open;
//! - [`socket`]: the socket calls both paths share;
//! - [`splice`]: bulk on the copy path, moved through a pipe instead of the proxy's memory.

mod copy;
mod live;
mod schedule;
mod socket;
mod splice;

use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::ProxyStats;

pub use copy::{copy_both, copy_until_toxics, HandOff};
pub use schedule::{schedule_both, Live};
pub use socket::{enable_receive_timestamps, reset_on_close};

/// The two sockets of a connection and what the pipes report to.
#[derive(Clone, Copy)]
pub struct Ends<'a> {
    pub client: &'a TcpStream,
    pub upstream: &'a TcpStream,
    pub stats: &'a ProxyStats,
    /// Cancelled to end the connection now (a reset, or the proxy shutting down).
    pub abort: &'a CancellationToken,
}
