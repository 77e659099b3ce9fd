//! RPC flavours: one file each, behind the [`Flavour`] trait (server side: serve one accepted
//! connection; client side: open one connection, a [`Client`]). Adding a flavour is one new
//! file plus a line in [`ALL`].
//!
//! Shared here, once: the accept loop every server uses ([`serve`]), the TCP connect every client
//! uses ([`connect_tcp`], counting connections and wire bytes), and the classification of
//! failures into the outcome columns of the CSV ([`Failure`]).

pub mod budget;
pub(crate) mod caller_driven;
pub mod grpc;
pub mod http1_json;
pub mod http2_json;
pub(crate) mod http_json;
pub mod tcp_binary;
pub mod thrift;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::link::Namespace;
use crate::profile::CongestionControl;
use crate::rig::{Call, Reply};
use crate::service::RigService;

/// A boxed future: flavours are trait objects chosen at run time.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Largest message any flavour accepts: a 16 MiB blob as base64 JSON, with room to spare.
pub(crate) const MAX_MESSAGE: usize = 64 << 20;

/// Every flavour, in the order tables list them.
pub static ALL: &[&dyn Flavour] = &[
    &grpc::Grpc,
    &http1_json::Http1Json,
    &http2_json::Http2Json,
    &tcp_binary::TcpBinary,
    &thrift::Thrift,
];

/// A flavour by name.
pub(crate) fn by_name(name: &str) -> Option<&'static dyn Flavour> {
    ALL.iter().copied().find(|f| f.name() == name)
}

/// Names of all flavours, for error messages.
pub fn names() -> Vec<&'static str> {
    ALL.iter().map(|f| f.name()).collect()
}

/// One RPC style: a wire protocol and an encoding.
pub trait Flavour: Send + Sync + 'static {
    /// The name used on the command line and in CSV rows.
    fn name(&self) -> &'static str;

    /// Serves one accepted connection until the peer closes it.
    fn serve_connection(
        &self,
        stream: TcpStream,
        service: Arc<RigService>,
    ) -> BoxFuture<'static, ()>;

    /// Opens one connection (TCP and protocol handshake) to `target`.
    fn connect<'a>(
        &'a self,
        target: &'a str,
        wire: &'a Arc<WireCounters>,
    ) -> BoxFuture<'a, Result<Arc<dyn Client>, CallError>>;
}

impl std::fmt::Debug for dyn Flavour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One open client connection.
pub trait Client: Send + Sync {
    /// One call. Never retried here: a failure is the caller's data.
    fn call<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, CallError>>;

    /// One call with its reply [`check`]ed: what the load driver makes. A flavour may check
    /// without decoding when it can be sure of the same verdict (the JSON flavours compare an
    /// echo's reply body with the request body they sent: the same bytes decode to the same
    /// message).
    fn call_checked<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move { check(call, &self.call(call).await?) })
    }

    /// False once the connection is known to be closed.
    fn is_open(&self) -> bool;

    /// Whether calls overlap on this connection. When they take turns (HTTP/1.1), a call that
    /// timed out leaves its connection mid-exchange, so it must not be reused.
    fn multiplexed(&self) -> bool;
}

/// Checks a reply against its call: an echo must match exactly; a deduct answer must be
/// consistent. A mismatch is a `protocol` failure.
pub fn check(call: &Call, reply: &Reply) -> Result<(), CallError> {
    let fine = match (call, reply) {
        (Call::EchoOrder(a), Reply::EchoOrder(b)) => a == b,
        (Call::EchoBlob(a), Reply::EchoBlob(b)) => a == b,
        (Call::EchoWide(a), Reply::EchoWide(b)) => a == b,
        (Call::Deduct(req), Reply::Deduct(r)) => {
            r.remaining >= 0 && (r.ok || r.remaining < i64::from(req.quantity))
        }
        _ => false,
    };
    if fine {
        Ok(())
    } else {
        Err(CallError::protocol(format!(
            "the {} reply does not match the call",
            call.operation().name()
        )))
    }
}

/// Serves `listener` with `flavour` until `shutdown` completes; then closes every connection.
pub async fn serve(
    flavour: &'static dyn Flavour,
    listener: TcpListener,
    service: Arc<RigService>,
    shutdown: impl Future,
) -> io::Result<()> {
    serve_with(flavour, listener, service, shutdown, true, None).await
}

/// [`serve`] on its own task, stopped when the handle is dropped: a flavour's server inside a
/// test, a benchmark or a run.
pub fn spawn(
    flavour: &'static dyn Flavour,
    listener: TcpListener,
    service: Arc<RigService>,
) -> io::Result<crate::net::Served> {
    crate::net::Served::spawn(listener, |l, stop| serve(flavour, l, service, stop))
}

/// [`serve`], with `TCP_NODELAY` on every accepted connection or (`nodelay` false) Nagle's
/// algorithm left on, as a server that never sets the option would have it, and at most
/// `max_connections` at once (default: [`crate::net::connection_cap`]'s).
pub(crate) async fn serve_with(
    flavour: &'static dyn Flavour,
    listener: TcpListener,
    service: Arc<RigService>,
    shutdown: impl Future,
    nodelay: bool,
    max_connections: Option<usize>,
) -> io::Result<()> {
    // One descriptor per connection; a backend's are in the margin.
    let cap = crate::net::connection_cap(max_connections, 1);
    crate::net::accept_until(
        listener,
        shutdown,
        flavour.name(),
        cap,
        None,
        |stream, _, cancel| {
            let _ = stream.set_nodelay(nodelay);
            let connection = flavour.serve_connection(stream, service.clone());
            async move {
                tokio::select! {
                    _ = connection => {}
                    _ = cancel.cancelled() => {}
                }
            }
        },
    )
    .await
}

/// Why a call failed: the CSV's `err_*` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Failure {
    /// The connection could not be opened (refused, unreachable, handshake failed).
    Connect,
    /// No reply within the call timeout.
    Timeout,
    /// The connection was reset or closed under the call.
    Reset,
    /// The peer answered something we could not accept: bad framing, status or payload, or an
    /// echo that did not match what was sent.
    Protocol,
    /// Anything else.
    Other,
}

impl Failure {
    pub const ALL: [Failure; 5] = [
        Failure::Connect,
        Failure::Timeout,
        Failure::Reset,
        Failure::Protocol,
        Failure::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::Timeout => "timeout",
            Failure::Reset => "reset",
            Failure::Protocol => "protocol",
            Failure::Other => "other",
        }
    }
}

/// Failed calls counted by why: a field per `err_*` column, indexed by [`Failure`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailureCounts {
    pub connect: u64,
    pub timeout: u64,
    pub reset: u64,
    pub protocol: u64,
    pub other: u64,
}

impl FailureCounts {
    /// Every failure, of any kind.
    pub fn total(&self) -> u64 {
        Failure::ALL.iter().map(|&k| self[k]).sum()
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &FailureCounts) {
        for k in Failure::ALL {
            self[k] += other[k];
        }
    }
}

impl std::ops::Index<Failure> for FailureCounts {
    type Output = u64;

    fn index(&self, kind: Failure) -> &u64 {
        match kind {
            Failure::Connect => &self.connect,
            Failure::Timeout => &self.timeout,
            Failure::Reset => &self.reset,
            Failure::Protocol => &self.protocol,
            Failure::Other => &self.other,
        }
    }
}

impl std::ops::IndexMut<Failure> for FailureCounts {
    fn index_mut(&mut self, kind: Failure) -> &mut u64 {
        match kind {
            Failure::Connect => &mut self.connect,
            Failure::Timeout => &mut self.timeout,
            Failure::Reset => &mut self.reset,
            Failure::Protocol => &mut self.protocol,
            Failure::Other => &mut self.other,
        }
    }
}

/// A failed call: its kind, and a message for logs.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{}: {detail}", kind.label())]
pub struct CallError {
    pub kind: Failure,
    pub detail: String,
}

impl CallError {
    pub fn new(kind: Failure, detail: impl Into<String>) -> CallError {
        CallError {
            kind,
            detail: detail.into(),
        }
    }

    pub fn protocol(detail: impl Into<String>) -> CallError {
        CallError::new(Failure::Protocol, detail)
    }

    /// Classifies any error by the types in its source chain, outermost first: the first whose
    /// type says what happened (an I/O error's kind, hyper's and h2's predicates,
    /// a timer's expiry, a call error already made) decides. Never by message text: a message
    /// is for people, and reworded between versions. Nothing known in the chain: `other`.
    pub(crate) fn classify(e: &(dyn std::error::Error + 'static)) -> CallError {
        if let Some(call) = e.downcast_ref::<CallError>() {
            return call.clone();
        }
        CallError::new(failure_of(e), full_message(e))
    }
}

impl From<crate::rig::CodecError> for CallError {
    fn from(e: crate::rig::CodecError) -> Self {
        CallError::protocol(e.0)
    }
}

/// The kind of the first error in `e`'s chain whose type tells.
fn failure_of(e: &(dyn std::error::Error + 'static)) -> Failure {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(kind) = failure_by_type(err) {
            return kind;
        }
        source = err.source();
    }
    Failure::Other
}

/// What `err` itself says, if its type tells; `None` to look at its source.
fn failure_by_type(err: &(dyn std::error::Error + 'static)) -> Option<Failure> {
    if let Some(call) = err.downcast_ref::<CallError>() {
        return Some(call.kind);
    }
    if let Some(io) = err.downcast_ref::<io::Error>() {
        // An error carried inside an I/O error (a codec's, a body's) knows more than the
        // wrapper's kind; `source()` would skip it, so it is asked first.
        if let Some(inner) = io.get_ref().and_then(|inner| failure_by_type(inner)) {
            return Some(inner);
        }
        return Some(kind_of_io(io));
    }
    if let Some(h) = err.downcast_ref::<hyper::Error>() {
        return if h.is_timeout() {
            Some(Failure::Timeout)
        } else if h.is_parse() || h.is_parse_status() || h.is_parse_too_large() {
            Some(Failure::Protocol)
        } else if h.is_canceled() || h.is_closed() || h.is_incomplete_message() {
            Some(Failure::Reset)
        } else {
            // An h2 or I/O error beneath says more.
            None
        };
    }
    if let Some(h2) = err.downcast_ref::<h2::Error>() {
        if let Some(io) = h2.get_io() {
            return Some(kind_of_io(io));
        }
        return match h2.reason() {
            Some(
                h2::Reason::PROTOCOL_ERROR
                | h2::Reason::FRAME_SIZE_ERROR
                | h2::Reason::COMPRESSION_ERROR
                | h2::Reason::FLOW_CONTROL_ERROR,
            ) => Some(Failure::Protocol),
            // Any other reason ends a stream or the connection (RST_STREAM, GOAWAY, a cancel).
            Some(_) => Some(Failure::Reset),
            // Misuse of the h2 API by the client: not a network outcome.
            None => None,
        };
    }
    if err.is::<tokio::time::error::Elapsed>() {
        return Some(Failure::Timeout);
    }
    if err.is::<http_body_util::LengthLimitError>() {
        // A reply over the message limit.
        return Some(Failure::Protocol);
    }
    None
}

fn kind_of_io(e: &io::Error) -> Failure {
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused | K::AddrNotAvailable | K::HostUnreachable | K::NetworkUnreachable => {
            Failure::Connect
        }
        K::ConnectionReset
        | K::ConnectionAborted
        | K::BrokenPipe
        | K::UnexpectedEof
        | K::NotConnected => Failure::Reset,
        K::TimedOut => Failure::Timeout,
        K::InvalidData => Failure::Protocol,
        _ => Failure::Other,
    }
}

/// "outer: cause: root cause", skipping repeats.
pub(crate) fn full_message(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = err.source();
    }
    parts.join(": ")
}

/// What the client side of a cell put on and took off the wire, and how its sockets are made
/// (kept here because every connect is already handed the cell's counters).
#[derive(Debug, Default)]
pub struct WireCounters {
    /// TCP connections opened (successfully connected).
    pub opened: AtomicU64,
    /// Bytes written, all protocol framing included.
    pub bytes_out: AtomicU64,
    /// Bytes read.
    pub bytes_in: AtomicU64,
    /// Options of every client socket the cell opens.
    pub socket: SocketOptions,
}

impl WireCounters {
    pub(crate) fn with_socket(socket: SocketOptions) -> WireCounters {
        WireCounters {
            socket,
            ..WireCounters::default()
        }
    }
}

/// How a request leaves the client: the socket-option axes of an experiment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WritePattern {
    /// Each message in one `send()`, as a buffering client writes it.
    #[default]
    One,
    /// Header and body as separate `send()`s, as many real clients write them: a length-prefixed
    /// frame (tcp-binary, thrift) as its 4-byte length and then the rest; HTTP (http1-json,
    /// http2-json, grpc) as each buffer the protocol library hands over, so headers and body
    /// leave apart. With Nagle on, the second write waits for the first one's ACK.
    Split,
}

impl WritePattern {
    pub const ALL: [WritePattern; 2] = [WritePattern::One, WritePattern::Split];

    pub fn as_str(self) -> &'static str {
        match self {
            WritePattern::One => "one",
            WritePattern::Split => "split",
        }
    }

    pub fn parse(s: &str) -> Result<WritePattern, String> {
        WritePattern::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("unknown write pattern `{s}` (one or split)"))
    }
}

/// How the message boundaries of a flavour's byte stream can be found, for
/// [`WritePattern::Split`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// 4-byte big-endian length, then that many bytes (tcp-binary, Thrift's framed transport).
    LengthPrefixed,
    /// The protocol library hands headers and body over as separate buffers (hyper, h2).
    Buffers,
}

/// Options of a flavour's client sockets.
#[derive(Clone)]
pub struct SocketOptions {
    /// `TCP_NODELAY`; false leaves Nagle's algorithm on.
    pub nodelay: bool,
    pub write_pattern: WritePattern,
    /// Pinned with `TCP_CONGESTION`; `None` keeps the namespace's default.
    pub congestion: Option<CongestionControl>,
    /// The network namespace the sockets are made in (`--engine link`: the client side of the
    /// link); `None` is this process's own.
    pub namespace: Option<Arc<Namespace>>,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            nodelay: true,
            write_pattern: WritePattern::One,
            congestion: None,
            namespace: None,
        }
    }
}

impl std::fmt::Debug for SocketOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketOptions")
            .field("nodelay", &self.nodelay)
            .field("write_pattern", &self.write_pattern)
            .field("congestion", &self.congestion)
            .field("namespace", &self.namespace.is_some())
            .finish()
    }
}

/// Opens a TCP connection as the cell's [`SocketOptions`] say (by default `TCP_NODELAY`: RPCs
/// are latency-bound), counted in `wire`. Failure is always a `connect` outcome.
pub(crate) async fn connect_tcp(
    target: &str,
    wire: &Arc<WireCounters>,
    framing: Framing,
) -> Result<CountingStream<TcpStream>, CallError> {
    let options = &wire.socket;
    let fail = |e: io::Error| CallError::new(Failure::Connect, format!("connect {target}: {e}"));
    let stream = if options.namespace.is_none() && options.congestion.is_none() {
        TcpStream::connect(target).await.map_err(fail)?
    } else {
        let addr = tokio::net::lookup_host(target)
            .await
            .map_err(fail)?
            .next()
            .ok_or_else(|| fail(io::Error::other("no address")))?;
        // A socket belongs to the namespace of the thread that creates it, so it is made on the
        // namespace's own thread and connected from here.
        let cc = options.congestion;
        let make = move || new_socket(addr, cc);
        let socket = match &options.namespace {
            Some(ns) => ns.within_async(make).await,
            None => make(),
        }
        .map_err(fail)?;
        TcpSocket::from_std_stream(socket.into())
            .connect(addr)
            .await
            .map_err(fail)?
    };
    let _ = stream.set_nodelay(options.nodelay);
    wire.opened.fetch_add(1, Ordering::Relaxed);
    Ok(CountingStream {
        inner: stream,
        wire: wire.clone(),
        split: (options.write_pattern == WritePattern::Split).then_some(Splitter {
            framing,
            head: Vec::with_capacity(4),
            body_left: 0,
        }),
    })
}

/// A non-blocking TCP socket for `addr`, with `cc` pinned when given.
fn new_socket(addr: SocketAddr, cc: Option<CongestionControl>) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_nonblocking(true)?;
    if let Some(cc) = cc {
        socket.set_tcp_congestion(cc.as_str().as_bytes())?;
    }
    Ok(socket)
}

/// Where a split-writing stream is in its current message.
#[derive(Debug)]
struct Splitter {
    framing: Framing,
    /// The length prefix written so far of the current frame.
    head: Vec<u8>,
    /// Bytes of the current frame's body still to write.
    body_left: usize,
}

impl Splitter {
    /// How much of `buf` the next `send()` may carry: up to the end of the length prefix or of
    /// the body, so the two never share a segment.
    fn next_write(&self, buf: &[u8]) -> usize {
        match self.framing {
            Framing::Buffers => buf.len(),
            Framing::LengthPrefixed if self.body_left > 0 => buf.len().min(self.body_left),
            Framing::LengthPrefixed => buf.len().min(4 - self.head.len()),
        }
    }

    /// Records that `written` bytes (the start of what [`Splitter::next_write`] allowed) left.
    fn wrote(&mut self, written: &[u8]) {
        if self.framing == Framing::Buffers {
            return;
        }
        if self.body_left > 0 {
            self.body_left -= written.len();
            return;
        }
        self.head.extend_from_slice(written);
        if self.head.len() == 4 {
            let len = u32::from_be_bytes([self.head[0], self.head[1], self.head[2], self.head[3]]);
            self.body_left = len as usize;
            self.head.clear();
        }
    }
}

/// A stream that adds what passes through it to [`WireCounters`].
#[derive(Debug)]
pub(crate) struct CountingStream<S> {
    inner: S,
    wire: Arc<WireCounters>,
    /// Set for [`WritePattern::Split`].
    split: Option<Splitter>,
}

impl<S: AsyncRead + Unpin> AsyncRead for CountingStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        self.wire.bytes_in.fetch_add(read as u64, Ordering::Relaxed);
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for CountingStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let allowed = match &this.split {
            Some(split) => split.next_write(buf),
            None => buf.len(),
        };
        let result = Pin::new(&mut this.inner).poll_write(cx, &buf[..allowed]);
        if let Poll::Ready(Ok(n)) = &result {
            this.wire.bytes_out.fetch_add(*n as u64, Ordering::Relaxed);
            if let Some(split) = &mut this.split {
                split.wrote(&buf[..*n]);
            }
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.split.is_some() {
            // One buffer per `send()`: the writer comes back for the rest.
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &**b);
            return self.poll_write(cx, first);
        }
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &result {
            self.wire.bytes_out.fetch_add(*n as u64, Ordering::Relaxed);
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What the flavours' unit tests share: a server on port 0 and a check that it still answers.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use crate::rig::{pb, Call, Reply};

    /// A server of `flavour` on a free loopback port; stopped when the sender drops.
    pub async fn server(
        flavour: &'static dyn Flavour,
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(flavour, l, Arc::default(), stopped));
        (addr, stop)
    }

    /// A deduct of quantity 0, which the service refuses: an answer the client counts as an
    /// `other` failure naming the quantity, on a connection that stays open.
    pub(crate) async fn a_refused_deduct_is_counted_other(client: &dyn Client) {
        let refused = Call::Deduct(pb::DeductRequest {
            sku: "x".into(),
            quantity: 0,
        });
        let e = client.call(&refused).await.unwrap_err();
        assert_eq!(e.kind, Failure::Other, "{e}");
        assert!(e.detail.contains("quantity must be positive"), "{e}");
        assert!(client.is_open());
    }

    /// A deduct on a new connection succeeds: the server is still serving.
    pub(crate) async fn deduct_works(flavour: &'static dyn Flavour, addr: std::net::SocketAddr) {
        let wire = Arc::new(WireCounters::default());
        let client = flavour.connect(&addr.to_string(), &wire).await.unwrap();
        let call = Call::Deduct(pb::DeductRequest {
            sku: "x".into(),
            quantity: 1,
        });
        assert!(matches!(client.call(&call).await, Ok(Reply::Deduct(r)) if r.ok));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        let names = names();
        for n in &names {
            assert_eq!(by_name(n).unwrap().name(), *n);
        }
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
        assert!(by_name("soap").is_none());
    }

    /// Records each write it is given as one `send()`.
    #[derive(Default)]
    struct Sends(Vec<Vec<u8>>);

    impl AsyncWrite for Sends {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.0.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn counting(framing: Framing, split: bool) -> CountingStream<Sends> {
        CountingStream {
            inner: Sends::default(),
            wire: Arc::default(),
            split: split.then_some(Splitter {
                framing,
                head: Vec::new(),
                body_left: 0,
            }),
        }
    }

    #[tokio::test]
    async fn split_writes_send_each_frames_length_and_body_apart() {
        use tokio::io::AsyncWriteExt;
        // Two frames (3 and 2 bytes of body) handed over in one buffer, as a framed writer does.
        let frames = [0, 0, 0, 3, b'a', b'b', b'c', 0, 0, 0, 2, b'd', b'e'];
        let mut s = counting(Framing::LengthPrefixed, true);
        s.write_all(&frames).await.unwrap();
        let sends: Vec<&[u8]> = s.inner.0.iter().map(Vec::as_slice).collect();
        assert_eq!(
            sends,
            [&[0, 0, 0, 3][..], b"abc", &[0, 0, 0, 2], b"de"],
            "length, body, length, body"
        );
        assert_eq!(
            s.wire.bytes_out.load(Ordering::Relaxed),
            frames.len() as u64
        );

        // Without split: one send.
        let mut s = counting(Framing::LengthPrefixed, false);
        s.write_all(&frames).await.unwrap();
        assert_eq!(s.inner.0.len(), 1);

        // HTTP: each buffer of a vectored write is a send of its own.
        let mut s = counting(Framing::Buffers, true);
        let bufs = [io::IoSlice::new(b"HEADERS"), io::IoSlice::new(b"body")];
        let n = s.write_vectored(&bufs).await.unwrap();
        assert_eq!(n, 7, "only the first buffer left in this send");
        s.write_all(b"body").await.unwrap();
        assert_eq!(s.inner.0, [b"HEADERS".to_vec(), b"body".to_vec()]);
    }

    #[test]
    fn errors_classify_by_type_never_by_text() {
        let e = io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(CallError::classify(&e).kind, Failure::Reset);
        let e = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(CallError::classify(&e).kind, Failure::Connect);
        // Carried inside an I/O error, a call error keeps its kind.
        let wrapped = io::Error::other(CallError::new(Failure::Timeout, "slow"));
        assert_eq!(CallError::classify(&wrapped).kind, Failure::Timeout);
        // h2: a peer's protocol complaint, a stream reset.
        let e = h2::Error::from(h2::Reason::PROTOCOL_ERROR);
        assert_eq!(CallError::classify(&e).kind, Failure::Protocol);
        let e = h2::Error::from(h2::Reason::CANCEL);
        assert_eq!(CallError::classify(&e).kind, Failure::Reset);
        // A message that reads like a reset is still only a message.
        #[derive(Debug, thiserror::Error)]
        #[error("connection reset by peer (closed, eof)")]
        struct Words;
        assert_eq!(CallError::classify(&Words).kind, Failure::Other);
        let deep = io::Error::other(Words);
        assert_eq!(CallError::classify(&deep).kind, Failure::Other);
    }

    #[tokio::test]
    async fn an_expired_timer_is_a_timeout() {
        let e = tokio::time::timeout(std::time::Duration::ZERO, std::future::pending::<()>())
            .await
            .unwrap_err();
        assert_eq!(CallError::classify(&e).kind, Failure::Timeout);
    }

    #[test]
    fn failure_counts_are_indexed_by_kind() {
        let mut counts = FailureCounts::default();
        for (i, k) in Failure::ALL.into_iter().enumerate() {
            counts[k] += i as u64 + 1;
        }
        assert_eq!((counts.connect, counts.other), (1, 5));
        let mut sum = counts;
        sum.add(&counts);
        assert_eq!(sum.total(), 2 * counts.total());
        assert_eq!(counts.total(), 15);
    }
}
