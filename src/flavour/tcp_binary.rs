//! `tcp-binary`: raw TCP, the long-connection binary style of Dubbo or Ice.
//!
//! Frames are 4-byte big-endian length-delimited (tokio-util's codec); each carries
//! `[u64 request id][u16 method][protobuf body]`. Many calls are in flight on one connection and
//! the server answers each as soon as it is done, so replies come back out of order and are
//! matched by id. A reply's method is the request's on success, or `ERROR_FLAG | method` with a
//! UTF-8 message. When the connection is lost, every call still waiting fails with `reset`.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::codec::{FramedRead, FramedWrite};

use super::budget::{self, Budget, Charge, Frames};
use super::{BoxFuture, CallError, Client, Failure, Flavour, WireCounters, MAX_MESSAGE};
use crate::rig::{Call, Operation, Reply};
use crate::service::RigService;

/// Request id and method before the body.
const HEADER: usize = 8 + 2;
/// Set in a reply's method when the body is an error message.
pub(crate) const ERROR_FLAG: u16 = 0x8000;
/// Calls one server connection handles at once; past it, reading pauses (back-pressure).
const SERVER_IN_FLIGHT: usize = 4096;
/// Frames queued for a connection's writer before senders wait.
const WRITE_QUEUE: usize = 1024;

pub struct TcpBinary;

fn codec() -> Frames {
    Frames::new(MAX_MESSAGE + HEADER)
}

/// A frame for the writer, with the budget charge it releases once written (servers only).
type Outgoing = (Bytes, Option<Charge>);

/// `[id][method][body]` with the body written straight into the frame.
fn frame(id: u64, method: u16, body_len: usize, body: impl FnOnce(&mut BytesMut)) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER + body_len);
    buf.put_u64(id);
    buf.put_u16(method);
    body(&mut buf);
    buf.freeze()
}

/// An error reply: the method with [`ERROR_FLAG`], and a UTF-8 message.
fn error_frame(id: u64, method: u16, message: &str) -> Bytes {
    frame(id, ERROR_FLAG | method, message.len(), |b| {
        b.put_slice(message.as_bytes())
    })
}

/// Splits a frame into id, method and body.
fn parse(mut frame: BytesMut) -> Result<(u64, u16, Bytes), String> {
    if frame.len() < HEADER {
        return Err(format!(
            "frame of {} bytes is shorter than its {HEADER}-byte header",
            frame.len()
        ));
    }
    let id = frame.get_u64();
    let method = frame.get_u16();
    Ok((id, method, frame.freeze()))
}

impl Flavour for TcpBinary {
    fn name(&self) -> &'static str {
        "tcp-binary"
    }

    fn serve_connection(
        &self,
        stream: TcpStream,
        service: Arc<RigService>,
    ) -> BoxFuture<'static, ()> {
        Box::pin(serve_connection(stream, service))
    }

    fn connect<'a>(
        &'a self,
        target: &'a str,
        wire: &'a Arc<WireCounters>,
    ) -> BoxFuture<'a, Result<Arc<dyn Client>, CallError>> {
        Box::pin(async move {
            let stream = super::connect_tcp(target, wire, super::Framing::LengthPrefixed).await?;
            Ok(Arc::new(BinaryClient::start(stream)) as Arc<dyn Client>)
        })
    }
}

async fn serve_connection(stream: TcpStream, service: Arc<RigService>) {
    serve_connection_with(stream, service, Budget::default()).await
}

/// Serves one connection whose calls in flight (requests read, replies not yet written) are
/// charged to `budget`: when the connection's is spent, reading pauses until replies drain.
async fn serve_connection_with(stream: TcpStream, service: Arc<RigService>, budget: Budget) {
    let peer = stream.peer_addr().ok();
    let (r, w) = stream.into_split();
    let (tx, rx) = mpsc::channel::<Outgoing>(WRITE_QUEUE);
    let writer = write_frames(w, rx);
    let reader = async move {
        let mut frames = FramedRead::new(r, codec());
        let in_flight = Arc::new(Semaphore::new(SERVER_IN_FLIGHT));
        while let Some(frame) = frames.next().await {
            let cost = frame.as_ref().map_or(0, |f| budget::call_cost(f.len()));
            let parsed = frame.map_err(|e| e.to_string()).and_then(parse);
            let (id, method, body) = match parsed {
                Ok(parts) => parts,
                Err(e) => {
                    // Framing is lost: nothing after this can be trusted. Close this connection
                    // only; the server goes on serving the others.
                    tracing::warn!(
                        ?peer,
                        "tcp-binary: closing connection on a protocol error: {e}"
                    );
                    return;
                }
            };
            let charge = match budget.charge(cost).await {
                Ok(charge) => charge,
                Err(refused) => {
                    // The process's budget is spent: refuse this call cleanly and go on.
                    drop(body);
                    let reply = error_frame(id, method, &refused.to_string());
                    if tx.send((reply, None)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                return;
            };
            let (tx, service) = (tx.clone(), service.clone());
            tokio::spawn(async move {
                let reply = answer(&service, id, method, &body).await;
                drop(body);
                let _ = tx.send((reply, Some(charge))).await;
                drop(permit);
            });
        }
    };
    // The writer ends once the reader and every call it spawned have dropped their senders, so
    // replies to calls that arrived before the client's FIN are still delivered.
    let _ = tokio::join!(reader, writer);
}

async fn answer(service: &RigService, id: u64, method: u16, body: &[u8]) -> Bytes {
    let error = |message: String| error_frame(id, method, &message);
    let Some(op) = Operation::from_code(method) else {
        return error(format!("unknown method {method}"));
    };
    let call = match Call::decode_protobuf(op, body) {
        Ok(call) => call,
        Err(e) => return error(e.0),
    };
    match service.handle(call).await {
        Ok(reply) => frame(id, method, reply.protobuf_len(), |b| {
            reply.encode_protobuf_into(b)
        }),
        Err(e) => error(e.0),
    }
}

/// Drains `rx` into the socket, flushing only when the queue is empty so bursts of small frames
/// share syscalls. Budget charges are released once their frames are flushed to the socket.
async fn write_frames(
    w: impl AsyncWrite + Unpin,
    mut rx: mpsc::Receiver<Outgoing>,
) -> io::Result<()> {
    let mut out = FramedWrite::new(w, codec());
    let mut written = Vec::new();
    while let Some((frame, charge)) = rx.recv().await {
        out.feed(frame).await?;
        written.push(charge);
        while let Ok((frame, charge)) = rx.try_recv() {
            out.feed(frame).await?;
            written.push(charge);
        }
        SinkExt::<Bytes>::flush(&mut out).await?;
        written.clear();
    }
    SinkExt::<Bytes>::close(&mut out).await
}

type ReplySlot = oneshot::Sender<Result<(u16, Bytes), CallError>>;

/// Calls waiting for their replies, by request id.
#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, ReplySlot>,
    /// Set when the connection is gone: later calls fail at once with this.
    closed: Option<CallError>,
}

impl Pending {
    /// Fails every waiting call and every later one.
    fn close(&mut self, why: CallError) {
        for (_, slot) in self.waiting.drain() {
            let _ = slot.send(Err(why.clone()));
        }
        self.closed.get_or_insert(why);
    }
}

struct BinaryClient {
    /// Frames to the writer task.
    frames: mpsc::Sender<Outgoing>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    open: Arc<AtomicBool>,
    /// The reader task. Dropping the client ends the writer (its queue closes), but the reader
    /// would wait for the server's FIN, forever against a silent server, holding a task and the
    /// socket; so it is aborted on drop.
    reader: tokio::task::AbortHandle,
}

impl Drop for BinaryClient {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl BinaryClient {
    fn start<S>(stream: S) -> BinaryClient
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (r, w) = tokio::io::split(stream);
        let (frames, rx) = mpsc::channel(WRITE_QUEUE);
        let pending = Arc::new(Mutex::new(Pending::default()));
        let open = Arc::new(AtomicBool::new(true));
        let lost = {
            let (pending, open) = (pending.clone(), open.clone());
            move |why: CallError| {
                open.store(false, Ordering::Relaxed);
                lock(&pending).close(why);
            }
        };
        let on_write_error = lost.clone();
        tokio::spawn(async move {
            if let Err(e) = write_frames(w, rx).await {
                on_write_error(CallError::classify(&e));
            }
        });
        let replies = pending.clone();
        let reader = tokio::spawn(async move {
            let mut frames = FramedRead::new(r, codec());
            let why = loop {
                match frames.next().await {
                    Some(Ok(frame)) => match parse(frame) {
                        Ok((id, method, body)) => {
                            if let Some(slot) = lock(&replies).waiting.remove(&id) {
                                let _ = slot.send(Ok((method, body)));
                            }
                        }
                        Err(e) => break CallError::protocol(e),
                    },
                    Some(Err(e)) if e.kind() == io::ErrorKind::InvalidData => {
                        break CallError::protocol(e.to_string())
                    }
                    Some(Err(e)) => break CallError::classify(&e),
                    None => {
                        break CallError::new(Failure::Reset, "connection closed by the server")
                    }
                }
            };
            lost(why);
        });
        BinaryClient {
            frames,
            pending,
            next_id: AtomicU64::new(1),
            open,
            reader: reader.abort_handle(),
        }
    }

    async fn round_trip(&self, call: &Call) -> Result<Reply, CallError> {
        let op = call.operation();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (slot, reply) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            if let Some(why) = &pending.closed {
                return Err(why.clone());
            }
            pending.waiting.insert(id, slot);
        }
        // If this call is abandoned (timed out), forget its slot; a late reply is then dropped.
        let _forget = ForgetOnDrop {
            pending: &self.pending,
            id,
        };
        let request = frame(id, op.code(), call.protobuf_len(), |b| {
            call.encode_protobuf_into(b)
        });
        if self.frames.send((request, None)).await.is_err() {
            return Err(CallError::new(Failure::Reset, "connection closed"));
        }
        let (method, body) = reply
            .await
            .map_err(|_| CallError::new(Failure::Reset, "connection closed"))??;
        if method == op.code() {
            Ok(Reply::decode_protobuf(op, &body)?)
        } else if method == ERROR_FLAG | op.code() {
            Err(CallError::new(
                Failure::Other,
                format!("server error: {}", String::from_utf8_lossy(&body)),
            ))
        } else {
            Err(CallError::protocol(format!(
                "reply to {} (method {}) came back as method {method}",
                op.name(),
                op.code()
            )))
        }
    }
}

struct ForgetOnDrop<'a> {
    pending: &'a Mutex<Pending>,
    id: u64,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        lock(self.pending).waiting.remove(&self.id);
    }
}

fn lock(pending: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    pending.lock().unwrap_or_else(|e| e.into_inner())
}

impl Client for BinaryClient {
    fn call<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, CallError>> {
        Box::pin(self.round_trip(call))
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    fn multiplexed(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flavour::test_support::deduct_works;
    use crate::rig::pb;
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::codec::{Decoder, Encoder};

    /// A valid byte stream: `calls` as framed requests.
    fn stream_of(calls: &[Call]) -> Vec<u8> {
        let mut out = BytesMut::new();
        for (i, call) in calls.iter().enumerate() {
            let request = frame(
                i as u64,
                call.operation().code(),
                call.protobuf_len(),
                |b| call.encode_protobuf_into(b),
            );
            codec().encode(request, &mut out).unwrap();
        }
        out.to_vec()
    }

    proptest! {
        #![proptest_config(crate::fuzz::config())]

        /// What a server does with a peer's bytes: split frames, parse each, answer it. The
        /// read buffer never grows by a header's claim.
        #[test]
        fn fuzz_frames(bytes in crate::fuzz::hostile(
            proptest::collection::vec(crate::fuzz::call(), 1..4).prop_map(|c| stream_of(&c))
        )) {
            let service = RigService::default();
            let mut codec = codec();
            let mut buf = BytesMut::from(&bytes[..]);
            let capacity = buf.capacity();
            loop {
                match codec.decode(&mut buf) {
                    Ok(Some(f)) => {
                        let Ok((id, method, body)) = parse(f) else { break };
                        let reply = futures_util::FutureExt::now_or_never(
                            answer(&service, id, method, &body),
                        )
                        .expect("no backend: never waits");
                        prop_assert!(reply.len() >= HEADER);
                        // The client's side of the same bytes.
                        if let Some(op) = Operation::from_code(method & !ERROR_FLAG) {
                            let _ = Reply::decode_protobuf(op, &body);
                        }
                    }
                    Ok(None) | Err(_) => break,
                }
                prop_assert!(buf.capacity() <= capacity, "the decoder reserved memory");
            }
        }
    }

    /// A peer that sends calls and never reads the replies: its connection stops being read
    /// once its budget is spent, while another connection is served; a call that does not fit
    /// the process's budget is refused cleanly, and that connection goes on.
    #[tokio::test]
    async fn a_peer_that_never_reads_is_held_to_its_budget() {
        const CONNECTION: usize = 4 << 20;
        let process = Arc::new(Semaphore::new(5 << 20));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let budgets = Arc::new(Mutex::new(Vec::new()));
        let server = {
            let (process, budgets) = (process.clone(), budgets.clone());
            tokio::spawn(async move {
                let service = Arc::new(RigService::default());
                loop {
                    let (s, _) = listener.accept().await.unwrap();
                    let budget = Budget::new(CONNECTION, process.clone());
                    budgets.lock().unwrap().push(budget.clone());
                    tokio::spawn(serve_connection_with(s, service.clone(), budget));
                }
            })
        };
        let blob = |n: usize| {
            Call::EchoBlob(pb::Blob {
                data: Bytes::from(vec![7u8; n]),
            })
        };
        let one_mib = stream_of(&[blob(1 << 20)]);
        let mut hostile = TcpStream::connect(addr).await.unwrap();
        let mut sent = 0;
        let limit = 96 << 20;
        while sent < limit {
            let write = hostile.write_all(&one_mib);
            match tokio::time::timeout(std::time::Duration::from_secs(2), write).await {
                Ok(Ok(())) => sent += one_mib.len(),
                _ => break,
            }
        }
        // Without the budget the server reads on (4096 calls in flight, 1024 replies queued);
        // with it, what it took is the budget plus the sockets' buffers.
        assert!(
            sent < limit,
            "the server read {sent} bytes from a peer that never reads"
        );
        let held = budgets.lock().unwrap()[0].held();
        assert!(held > 0 && held <= CONNECTION, "held {held}");

        let wire = Arc::new(WireCounters::default());
        let client = TcpBinary.connect(&addr.to_string(), &wire).await.unwrap();
        let small = blob(100);
        assert!(
            client.call(&small).await.is_ok(),
            "another connection is served"
        );
        // 1.6 MiB costs 3.2: within a connection's budget, but more than the process has left
        // while the hostile peer holds a 1 MiB call (2 MiB).
        let big = (1 << 20) * 8 / 5;
        assert!(process.available_permits() < budget::call_cost(big));
        let err = client.call(&blob(big)).await.unwrap_err();
        assert!(err.detail.contains("server busy"), "{err}");
        assert!(
            client.call(&small).await.is_ok(),
            "and goes on after a refusal"
        );
        drop(hostile);
        server.abort();
    }

    async fn server() -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        crate::flavour::test_support::server(&TcpBinary).await
    }

    #[tokio::test]
    async fn many_calls_in_flight_on_one_connection() {
        let (addr, _stop) = server().await;
        let wire = Arc::new(WireCounters::default());
        let client = TcpBinary.connect(&addr.to_string(), &wire).await.unwrap();
        let calls: Vec<Call> = (0..200)
            .map(|i| {
                Call::EchoOrder(pb::Order {
                    order_id: i,
                    ..Default::default()
                })
            })
            .collect();
        let replies = futures_util::future::join_all(calls.iter().map(|c| client.call(c))).await;
        for (call, reply) in calls.iter().zip(replies) {
            match (call, reply.unwrap()) {
                (Call::EchoOrder(a), Reply::EchoOrder(b)) => assert_eq!(*a, b),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(wire.opened.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_malformed_frame_closes_only_that_connection() {
        let (addr, _stop) = server().await;
        let mut bad = TcpStream::connect(addr).await.unwrap();
        // A 3-byte frame: shorter than the header.
        bad.write_all(&[0, 0, 0, 3, 1, 2, 3]).await.unwrap();
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), bad.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0, "the server closed the bad connection");
        deduct_works(&TcpBinary, addr).await;
    }

    #[tokio::test]
    async fn unknown_method_is_an_error_reply_and_lost_connections_fail_waiting_calls() {
        let (addr, stop) = server().await;
        let mut raw = TcpStream::connect(addr).await.unwrap();
        raw.write_all(&[0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 7, 0, 99])
            .await
            .unwrap();
        let mut header = [0u8; 14];
        raw.read_exact(&mut header).await.unwrap();
        assert_eq!(
            u16::from_be_bytes([header[12], header[13]]),
            ERROR_FLAG | 99
        );

        // A server that accepts and then drops connections: waiting calls fail with `reset`.
        drop(stop);
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            drop(s);
        });
        let wire = Arc::new(WireCounters::default());
        let client = TcpBinary.connect(&addr.to_string(), &wire).await.unwrap();
        let call = Call::EchoBlob(pb::Blob {
            data: Bytes::from_static(b"x"),
        });
        let err = client.call(&call).await.unwrap_err();
        assert_eq!(err.kind, Failure::Reset, "{err}");
        assert!(!client.is_open());
        assert_eq!(client.call(&call).await.unwrap_err().kind, Failure::Reset);
    }

    /// A dropped client leaves nothing behind, even when the server never closes: per-call mode
    /// drops one client per call.
    #[tokio::test]
    async fn a_dropped_client_leaves_no_task_behind() {
        // A listener that never accepts: the kernel completes the handshake, and nothing ever
        // answers or closes.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        let wire = Arc::new(WireCounters::default());
        let client = TcpBinary.connect(&addr, &wire).await.unwrap();
        let call = Call::Deduct(pb::DeductRequest {
            sku: "x".into(),
            quantity: 1,
        });
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), client.call(&call));
        assert!(waited.await.is_err(), "the silent server never answers");
        assert!(metrics.num_alive_tasks() > before);
        drop(client);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while metrics.num_alive_tasks() > before {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} tasks still alive after the client was dropped",
                metrics.num_alive_tasks() - before
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}
