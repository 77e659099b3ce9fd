//! `thrift`: Apache Thrift's binary protocol (strict) over its framed transport, interoperable
//! with real Thrift peers generated from `proto/rig.thrift`.
//!
//! Framed Thrift carries one outstanding call per connection and pairs a reply with its call by
//! sequence id: the server answers a connection's calls in order, and workers sharing one client
//! connection take turns, as HTTP/1.1's do. A call the service fails is answered with a Thrift
//! `TApplicationException` (the IDL declares no exceptions); an unknown method gets one too, and
//! the connection goes on. Bytes that are not Thrift (a bad frame length, an unknown type tag, a
//! truncated string) close that connection with a logged protocol error; others are unaffected.
//!
//! The protocol itself is in [`protocol`], written from the Thrift specification: the Rust Thrift
//! crate is blocking, and its async alternatives need their own code generators.

pub mod protocol;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use self::protocol::{
    app_error, ApplicationException, Envelope, MessageType, Reader, ThriftError, ThriftStruct,
    Writer,
};
use super::budget::{self, Budget, Frames};
use super::{BoxFuture, CallError, Client, CountingStream, Failure, Flavour, WireCounters};
use crate::rig::{Call, Operation, Reply};
use crate::service::RigService;

pub struct Thrift;

/// TFramedTransport: a 4-byte big-endian length before each message.
fn codec() -> Frames {
    Frames::new(super::MAX_MESSAGE)
}

impl Flavour for Thrift {
    fn name(&self) -> &'static str {
        "thrift"
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
            Ok(Arc::new(ThriftClient {
                connection: tokio::sync::Mutex::new(Connection {
                    framed: Framed::new(stream, codec()),
                    next_seq_id: 1,
                    mid_exchange: false,
                }),
                open: AtomicBool::new(true),
            }) as Arc<dyn Client>)
        })
    }
}

async fn serve_connection(stream: TcpStream, service: Arc<RigService>) {
    let peer = stream.peer_addr().ok();
    let mut framed = Framed::new(stream, codec());
    // One call at a time, so the connection's own budget is never spent; the process's can be.
    let budget = Budget::default();
    while let Some(frame) = framed.next().await {
        // Held until the reply is written.
        let mut _charge = None;
        let answered = match frame {
            Ok(frame) => match budget.try_charge(budget::call_cost(frame.len())) {
                Ok(charge) => {
                    _charge = Some(charge);
                    answer(&service, frame.freeze()).await
                }
                Err(refused) => {
                    tracing::warn!(?peer, "thrift: closing connection: {refused}");
                    return;
                }
            },
            // A bad length; or (Other) a frame cut off by the peer's FIN, as tokio-util says it.
            Err(e) if matches!(e.kind(), io::ErrorKind::InvalidData | io::ErrorKind::Other) => {
                Err(ThriftError::malformed(e.to_string()))
            }
            Err(_) => return,
        };
        match answered {
            Ok(Some(reply)) => {
                if framed.send(reply).await.is_err() {
                    return;
                }
            }
            Ok(None) => {}
            Err(e) => {
                // Framing or encoding is lost: nothing after this can be trusted. Close this
                // connection only; the server goes on serving the others.
                tracing::warn!(?peer, "thrift: closing connection on a protocol error: {e}");
                return;
            }
        }
    }
}

/// The answer to one frame: a reply or exception, nothing for a oneway call, or an error when the
/// frame is not valid Thrift.
async fn answer(service: &RigService, frame: Bytes) -> Result<Option<Bytes>, ThriftError> {
    let mut r = Reader::new(frame);
    let call = r.envelope()?;
    if !matches!(call.kind, MessageType::Call | MessageType::Oneway) {
        return Err(ThriftError::malformed(format!(
            "a server expects calls, got a {:?} message",
            call.kind
        )));
    }
    let reply_to = |kind: MessageType| Envelope {
        kind,
        name: (*call.name).into(),
        seq_id: call.seq_id,
    };
    let Some(op) = Operation::from_name(&call.name) else {
        r.skip(protocol::STRUCT)?;
        expect_end(&r)?;
        let e = ApplicationException {
            message: format!("Invalid method name: '{}'", call.name),
            kind: app_error::UNKNOWN_METHOD,
        };
        return Ok(Some(message(&reply_to(MessageType::Exception), |w| {
            e.write(w)
        })));
    };
    let request = match read_arguments(op, &mut r) {
        Ok(request) => request,
        // Well-formed Thrift holding a value the record cannot: the peer's mistake, answered
        // as Thrift answers it; the connection is still in step.
        Err(e) if !e.malformed => {
            let e = ApplicationException {
                message: e.message,
                kind: app_error::PROTOCOL_ERROR,
            };
            return Ok(Some(message(&reply_to(MessageType::Exception), |w| {
                e.write(w)
            })));
        }
        Err(e) => return Err(e),
    };
    expect_end(&r)?;
    let outcome = service.handle(request).await;
    if call.kind == MessageType::Oneway {
        return Ok(None);
    }
    Ok(Some(match outcome {
        Ok(reply) => message(&reply_to(MessageType::Reply), |w| write_result(w, &reply)),
        Err(e) => {
            let e = ApplicationException {
                message: e.0,
                kind: app_error::INTERNAL_ERROR,
            };
            message(&reply_to(MessageType::Exception), |w| e.write(w))
        }
    }))
}

fn expect_end(r: &Reader) -> Result<(), ThriftError> {
    match r.remaining() {
        0 => Ok(()),
        n => Err(ThriftError::malformed(format!(
            "{n} bytes after the message's end"
        ))),
    }
}

/// One message: envelope then body.
fn message(envelope: &Envelope<'_>, body: impl FnOnce(&mut Writer<'_>)) -> Bytes {
    message_with_capacity(envelope, 64, body)
}

fn message_with_capacity(
    envelope: &Envelope<'_>,
    capacity: usize,
    body: impl FnOnce(&mut Writer<'_>),
) -> Bytes {
    let mut buf = BytesMut::with_capacity(capacity + envelope.name.len() + 16);
    let mut w = Writer::new(&mut buf);
    w.envelope(envelope);
    body(&mut w);
    buf.freeze()
}

/// A call's arguments struct: the request record as field 1.
fn write_arguments(w: &mut Writer<'_>, call: &Call) {
    match call {
        Call::EchoOrder(m) => w.single_field_struct(1, m),
        Call::EchoBlob(m) => w.single_field_struct(1, m),
        Call::EchoWide(m) => w.single_field_struct(1, &**m),
        Call::Deduct(m) => w.single_field_struct(1, m),
    }
}

/// Missing arguments are default records, as Thrift's default requiredness allows.
fn read_arguments(op: Operation, r: &mut Reader) -> Result<Call, ThriftError> {
    Ok(match op {
        Operation::EchoOrder => Call::EchoOrder(r.single_field_struct(1)?.unwrap_or_default()),
        Operation::EchoBlob => Call::EchoBlob(r.single_field_struct(1)?.unwrap_or_default()),
        Operation::EchoWide => {
            Call::EchoWide(Box::new(r.single_field_struct(1)?.unwrap_or_default()))
        }
        Operation::Deduct => Call::Deduct(r.single_field_struct(1)?.unwrap_or_default()),
    })
}

/// A reply's result struct: the answer as field 0 ("success").
fn write_result(w: &mut Writer<'_>, reply: &Reply) {
    match reply {
        Reply::EchoOrder(m) => w.single_field_struct(0, m),
        Reply::EchoBlob(m) => w.single_field_struct(0, m),
        Reply::EchoWide(m) => w.single_field_struct(0, &**m),
        Reply::Deduct(m) => w.single_field_struct(0, m),
    }
}

/// `None` when the result struct holds no success field (Thrift's MISSING_RESULT).
fn read_result(op: Operation, r: &mut Reader) -> Result<Option<Reply>, ThriftError> {
    Ok(match op {
        Operation::EchoOrder => r.single_field_struct(0)?.map(Reply::EchoOrder),
        Operation::EchoBlob => r.single_field_struct(0)?.map(Reply::EchoBlob),
        Operation::EchoWide => r
            .single_field_struct(0)?
            .map(|m| Reply::EchoWide(Box::new(m))),
        Operation::Deduct => r.single_field_struct(0)?.map(Reply::Deduct),
    })
}

struct ThriftClient {
    /// One exchange at a time: callers queue on this lock.
    connection: tokio::sync::Mutex<Connection>,
    /// False once the connection failed or lost its place in the exchange.
    open: AtomicBool,
}

struct Connection {
    framed: Framed<CountingStream<TcpStream>, Frames>,
    next_seq_id: i32,
    /// Set while a call is between sending and reading its reply. Still set when the next call
    /// takes the lock means the last one was abandoned (timed out) and its reply may still
    /// arrive: the connection can no longer pair replies with calls.
    mid_exchange: bool,
}

impl ThriftClient {
    fn lost(&self, why: CallError) -> CallError {
        self.open.store(false, Ordering::Relaxed);
        why
    }

    async fn round_trip(&self, call: &Call) -> Result<Reply, CallError> {
        let op = call.operation();
        let mut conn = self.connection.lock().await;
        if conn.mid_exchange || !self.is_open() {
            return Err(self.lost(CallError::new(
                Failure::Reset,
                "connection unusable: an earlier call on it was abandoned or failed",
            )));
        }
        let seq_id = conn.next_seq_id;
        conn.next_seq_id = seq_id.wrapping_add(1);
        let request = Envelope {
            kind: MessageType::Call,
            name: op.name().into(),
            seq_id,
        };
        let frame = message_with_capacity(&request, call.protobuf_len() + 64, |w| {
            write_arguments(w, call)
        });
        conn.mid_exchange = true;
        if let Err(e) = conn.framed.send(frame).await {
            return Err(self.lost(CallError::classify(&e)));
        }
        let frame = match conn.framed.next().await {
            Some(Ok(frame)) => frame.freeze(),
            Some(Err(e)) if e.kind() == io::ErrorKind::InvalidData => {
                return Err(self.lost(CallError::protocol(e.to_string())))
            }
            Some(Err(e)) => return Err(self.lost(CallError::classify(&e))),
            None => {
                return Err(self.lost(CallError::new(
                    Failure::Reset,
                    "connection closed by the server",
                )))
            }
        };
        conn.mid_exchange = false;
        let mut r = Reader::new(frame);
        let reply = r.envelope().map_err(|e| self.lost(e.into()))?;
        if reply.seq_id != seq_id || reply.name != request.name {
            return Err(self.lost(CallError::protocol(format!(
                "reply {} #{} to call {} #{seq_id}",
                reply.name, reply.seq_id, request.name
            ))));
        }
        match reply.kind {
            MessageType::Reply => match read_result(op, &mut r)? {
                Some(answer) => Ok(answer),
                None => Err(CallError::protocol(format!(
                    "{}: the reply holds no result",
                    op.name()
                ))),
            },
            MessageType::Exception => {
                let e = ApplicationException::read(&mut r)?;
                Err(CallError::new(
                    Failure::Other,
                    format!(
                        "server error (TApplicationException {}): {}",
                        e.kind, e.message
                    ),
                ))
            }
            other => Err(CallError::protocol(format!(
                "a {other:?} message where a reply was expected"
            ))),
        }
    }
}

impl From<ThriftError> for CallError {
    fn from(e: ThriftError) -> Self {
        CallError::protocol(e.to_string())
    }
}

impl Client for ThriftClient {
    fn call<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, CallError>> {
        Box::pin(self.round_trip(call))
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    fn multiplexed(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flavour::test_support;
    use crate::rig::pb;
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A valid call message (`oneway` as often as not) for `call`.
    fn call_message(call: &Call, seq_id: i32, oneway: bool) -> Vec<u8> {
        let envelope = Envelope {
            kind: if oneway {
                MessageType::Oneway
            } else {
                MessageType::Call
            },
            name: call.operation().name().into(),
            seq_id,
        };
        message(&envelope, |w| write_arguments(w, call)).to_vec()
    }

    proptest! {
        #![proptest_config(crate::fuzz::config())]

        /// A server's answer to a peer's frame, and a client's reading of the same bytes as a
        /// reply: a value or a clean error.
        #[test]
        fn fuzz_messages(
            frame in crate::fuzz::hostile(
                (crate::fuzz::call(), any::<i32>(), any::<bool>())
                    .prop_map(|(c, seq, oneway)| call_message(&c, seq, oneway))
            ),
            op in crate::fuzz::operation(),
        ) {
            let service = RigService::default();
            let answered = futures_util::FutureExt::now_or_never(
                answer(&service, Bytes::from(frame.clone())),
            )
            .expect("no backend: never waits");
            if let Ok(Some(reply)) = answered {
                prop_assert!(Reader::new(reply).envelope().is_ok());
            }
            let mut r = Reader::new(Bytes::from(frame));
            if r.envelope().is_ok() {
                let _ = read_result(op, &mut r).and_then(|reply| expect_end(&r).map(|()| reply));
            }
        }
    }

    async fn server() -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        test_support::server(&Thrift).await
    }

    async fn deduct_works(addr: std::net::SocketAddr) {
        test_support::deduct_works(&Thrift, addr).await
    }

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut out = (body.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(body);
        out
    }

    /// Reads to EOF (or reset): the server closed this connection.
    async fn closed(mut s: TcpStream) -> bool {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf));
        matches!(read.await, Ok(Ok(0)) | Ok(Err(_)))
    }

    #[tokio::test]
    async fn malformed_frames_close_only_their_connection() {
        let (addr, _stop) = server().await;
        let call = |body: &[u8]| {
            let mut b = BytesMut::new();
            Writer::new(&mut b).envelope(&Envelope {
                kind: MessageType::Call,
                name: "EchoOrder".into(),
                seq_id: 1,
            });
            b.extend_from_slice(body);
            framed(&b)
        };
        let cases: Vec<(&str, Vec<u8>)> = vec![
            // A length far past the frame limit (a negative i32 on the wire).
            ("bad length", vec![0xff, 0xff, 0xff, 0xf0, 1, 2, 3]),
            // Field type 0x63 is no Thrift type.
            ("wrong type tag", call(&[0x63, 0, 1, 0])),
            // The arguments' string claims 100 bytes and the frame ends after 3.
            (
                "truncated string",
                call(&[
                    protocol::STRUCT,
                    0,
                    1,
                    protocol::STRING,
                    0,
                    2,
                    0,
                    0,
                    0,
                    100,
                    b'a',
                    b'b',
                    b'c',
                ]),
            ),
            // A frame cut off by the client's FIN.
            ("truncated frame", vec![0, 0, 0, 50, 0x80, 1, 0]),
        ];
        for (what, bytes) in cases {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(&bytes).await.unwrap();
            if what == "truncated frame" {
                s.shutdown().await.unwrap();
            }
            assert!(closed(s).await, "{what}: the server closed the connection");
            deduct_works(addr).await;
        }
    }

    #[tokio::test]
    async fn unknown_methods_and_service_errors_are_application_exceptions() {
        let (addr, _stop) = server().await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut b = BytesMut::new();
        let mut w = Writer::new(&mut b);
        w.envelope(&Envelope {
            kind: MessageType::Call,
            name: "Frobnicate".into(),
            seq_id: 77,
        });
        w.stop();
        s.write_all(&framed(&b)).await.unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).await.unwrap();
        let mut r = Reader::new(Bytes::from(body));
        let e = r.envelope().unwrap();
        assert_eq!((e.kind, e.seq_id), (MessageType::Exception, 77));
        let ex = ApplicationException::read(&mut r).unwrap();
        assert_eq!(ex.kind, app_error::UNKNOWN_METHOD);
        assert!(ex.message.contains("Frobnicate"));

        // The connection goes on; a failed deduct (quantity 0) is an exception, counted `other`.
        let wire = Arc::new(WireCounters::default());
        let client = Thrift.connect(&addr.to_string(), &wire).await.unwrap();
        crate::flavour::test_support::a_refused_deduct_is_counted_other(&*client).await;
        deduct_works(addr).await;
    }

    #[tokio::test]
    async fn an_abandoned_call_retires_its_connection() {
        // A server that reads and never answers.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut sink = vec![0u8; 1 << 16];
            while s.read(&mut sink).await.unwrap_or(0) > 0 {}
        });
        let wire = Arc::new(WireCounters::default());
        let client = Thrift.connect(&addr.to_string(), &wire).await.unwrap();
        let call = Call::EchoOrder(pb::Order::default());
        let timed_out =
            tokio::time::timeout(std::time::Duration::from_millis(50), client.call(&call)).await;
        assert!(timed_out.is_err());
        let err = client.call(&call).await.unwrap_err();
        assert_eq!(err.kind, Failure::Reset, "{err}");
        assert!(!client.is_open());
    }
}
