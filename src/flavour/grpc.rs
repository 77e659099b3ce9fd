//! `grpc`: HTTP/2 + protobuf, as gRPC or Dubbo Triple would call a service.
//!
//! The server is tonic's generated service run by hyper on our own accept loop (so it shares
//! the socket set-up of every flavour). The client frames unary calls itself on an h2
//! connection whose socket is counted ([`GrpcClient`]); the generic gRPC target calls through
//! tonic over the same kind of connection ([`GrpcConnection`]).

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Collected, Limited};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::http2_json::Http2Connection;
use super::http_json::operation_uris;
use super::{check, BoxFuture, CallError, Client, Failure, Flavour, WireCounters, MAX_MESSAGE};
use crate::rig::pb::rig_server::{Rig, RigServer};
use crate::rig::{pb, Call, Operation, Reply};
use crate::service::RigService;

pub struct Grpc;

impl Flavour for Grpc {
    fn name(&self) -> &'static str {
        "grpc"
    }

    fn serve_connection(
        &self,
        stream: TcpStream,
        service: Arc<RigService>,
    ) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let rig = RigServer::new(GrpcService(service))
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE);
            let _ = super::http2_json::server_builder()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(rig))
                .await;
        })
    }

    fn connect<'a>(
        &'a self,
        target: &'a str,
        wire: &'a Arc<WireCounters>,
    ) -> BoxFuture<'a, Result<Arc<dyn Client>, CallError>> {
        Box::pin(async move {
            let connection = GrpcConnection::open(target, wire).await?;
            Ok(Arc::new(GrpcClient::new(connection)?) as Arc<dyn Client>)
        })
    }
}

/// One h2c connection as the service tonic's client calls through: the `grpc` flavour's and
/// the generic gRPC target's calls. tonic frames the messages, sets the headers and reads the
/// status; the exchange is [`Http2Connection`]'s, driven by the calls themselves.
///
/// Not tonic's `Channel`: it puts a buffer task and hyper's connection task between a call and
/// the socket (two task hand-offs each way per call) and sends each request's body in a write
/// of its own. Unary calls only: the request's message is whole before it is sent, and the
/// reply is read whole (data and trailers) before tonic sees it.
#[derive(Clone)]
pub(crate) struct GrpcConnection {
    connection: Arc<Http2Connection>,
    /// `http://target`: tonic makes each request's URI from it and the method's path.
    pub(crate) origin: http::Uri,
}

impl GrpcConnection {
    pub(crate) async fn open(
        target: &str,
        wire: &Arc<WireCounters>,
    ) -> Result<GrpcConnection, CallError> {
        let origin = http::Uri::try_from(format!("http://{target}"))
            .map_err(|e| CallError::new(Failure::Connect, format!("bad target {target}: {e}")))?;
        Ok(GrpcConnection {
            connection: Arc::new(Http2Connection::open(target, wire).await?),
            origin,
        })
    }

    /// False once the connection has closed: the driver opens another.
    pub(crate) fn is_open(&self) -> bool {
        self.connection.is_open()
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for GrpcConnection {
    type Response = http::Response<Collected<Bytes>>;
    type Error = CallError;
    type Future = BoxFuture<'static, Result<Self::Response, CallError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let connection = self.connection.clone();
        Box::pin(async move {
            let (head, body) = request.into_parts();
            // A unary request's body is its one encoded message, ready at once.
            let body = body
                .collect()
                .await
                .map_err(|s| status_error(&s))?
                .to_bytes();
            let request = http::Request::from_parts(head, body);
            connection
                .exchange(request, |response| async move {
                    let (head, body) = response.into_parts();
                    let body = Limited::new(body, MAX_MESSAGE + GRPC_FRAMING)
                        .collect()
                        .await
                        .map_err(|e| CallError::classify(&*e))?;
                    Ok(http::Response::from_parts(head, body))
                })
                .await
        })
    }
}

/// Bytes a gRPC reply carries beyond its message: the 5-byte length prefix.
const GRPC_FRAMING: usize = 5;

/// A tonic channel to `target` over a connector we own, so each TCP connection it opens
/// (including any it re-opens after a failure) is counted in `wire`: what the generic gRPC
/// target asks server reflection through (a streaming call, which [`GrpcConnection`] does not
/// carry).
pub(crate) async fn channel(target: &str, wire: &Arc<WireCounters>) -> Result<Channel, CallError> {
    let endpoint = Endpoint::from_shared(format!("http://{target}"))
        .map_err(|e| CallError::new(Failure::Connect, format!("bad target {target}: {e}")))?
        .initial_stream_window_size(super::http2_json::STREAM_WINDOW)
        .initial_connection_window_size(super::http2_json::CONNECTION_WINDOW);
    let (target, wire) = (target.to_string(), wire.clone());
    let connector = tower::service_fn(move |_: http::Uri| {
        let (target, wire) = (target.clone(), wire.clone());
        async move {
            super::connect_tcp(&target, &wire, super::Framing::Buffers)
                .await
                .map(TokioIo::new)
        }
    });
    endpoint
        .connect_with_connector(connector)
        .await
        .map_err(|e| CallError::new(Failure::Connect, super::full_message(&e)))
}

/// The tonic service: every method hands the call to the shared [`RigService`].
struct GrpcService(Arc<RigService>);

impl GrpcService {
    async fn handle(&self, call: Call) -> Result<Reply, Status> {
        self.0
            .handle(call)
            .await
            .map_err(|e| Status::invalid_argument(e.0))
    }
}

/// The reply variant a method must produce; anything else is a bug in [`RigService`].
fn mismatch() -> Status {
    Status::internal("reply does not match the operation")
}

#[tonic::async_trait]
impl Rig for GrpcService {
    async fn echo_order(&self, r: Request<pb::Order>) -> Result<Response<pb::Order>, Status> {
        match self.handle(Call::EchoOrder(r.into_inner())).await? {
            Reply::EchoOrder(m) => Ok(Response::new(m)),
            _ => Err(mismatch()),
        }
    }

    async fn echo_blob(&self, r: Request<pb::Blob>) -> Result<Response<pb::Blob>, Status> {
        match self.handle(Call::EchoBlob(r.into_inner())).await? {
            Reply::EchoBlob(m) => Ok(Response::new(m)),
            _ => Err(mismatch()),
        }
    }

    async fn echo_wide(&self, r: Request<pb::Wide>) -> Result<Response<pb::Wide>, Status> {
        match self
            .handle(Call::EchoWide(Box::new(r.into_inner())))
            .await?
        {
            Reply::EchoWide(m) => Ok(Response::new(*m)),
            _ => Err(mismatch()),
        }
    }

    async fn deduct(
        &self,
        r: Request<pb::DeductRequest>,
    ) -> Result<Response<pb::DeductReply>, Status> {
        match self.handle(Call::Deduct(r.into_inner())).await? {
            Reply::Deduct(m) => Ok(Response::new(m)),
            _ => Err(mismatch()),
        }
    }
}

/// The `grpc` flavour's client: unary calls framed here, on an [`Http2Connection`].
///
/// Not tonic's generated client: a call through it nests five async functions (unary,
/// client-streaming, streaming, the codec's encoder and the service call), and moving those
/// futures into place was 7 % of the load driver's time at 64 connections (`perf`, memmove
/// under the call). A unary gRPC call is one length-prefixed message each way and a status in
/// the trailers; tonic still reads a failed call's status ([`Status::from_header_map`]), and
/// the generic gRPC target still calls through tonic.
struct GrpcClient {
    connection: GrpcConnection,
    /// `http://target/rig.Rig/<Method>`, one per operation in [`Operation::ALL`] order.
    uris: [http::Uri; Operation::ALL.len()],
}

impl GrpcClient {
    fn new(connection: GrpcConnection) -> Result<GrpcClient, CallError> {
        let origin = &connection.origin;
        let uris = operation_uris(|op| format!("{origin}rig.Rig/{}", op.name()))
            .map_err(|e| CallError::new(Failure::Connect, format!("bad target {origin}: {e}")))?;
        Ok(GrpcClient { uris, connection })
    }

    /// Sends `call` and returns its reply's message (unframed) and the request's message.
    async fn exchange(&self, call: &Call) -> Result<(Bytes, Bytes), CallError> {
        let len = call.protobuf_len();
        if len > MAX_MESSAGE {
            return Err(CallError::new(
                Failure::Protocol,
                format!("a {len}-byte request is over the {MAX_MESSAGE}-byte limit"),
            ));
        }
        let mut framed = BytesMut::with_capacity(GRPC_FRAMING + len);
        framed.put_u8(0); // not compressed
        framed.put_u32(len as u32);
        call.encode_protobuf_into(&mut framed);
        let framed = framed.freeze();
        let sent = framed.slice(GRPC_FRAMING..);
        let mut request = http::Request::new(framed);
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = self.uris[call.operation() as usize].clone();
        let headers = request.headers_mut();
        headers.insert(http::header::CONTENT_TYPE, APPLICATION_GRPC);
        headers.insert(http::header::TE, TRAILERS);
        let reply = self
            .connection
            .connection
            .exchange(request, |response| async move {
                let (head, body) = response.into_parts();
                if head.status != http::StatusCode::OK {
                    return Err(CallError::new(
                        Failure::Protocol,
                        format!("HTTP status {} to a gRPC call", head.status),
                    ));
                }
                // A trailers-only reply carries its status in the headers.
                if head.headers.contains_key(GRPC_STATUS) {
                    return Err(failed_status(&head.headers).unwrap_or_else(|| {
                        CallError::new(Failure::Protocol, "a trailers-only OK reply has no message")
                    }));
                }
                let collected = Limited::new(body, MAX_MESSAGE + GRPC_FRAMING)
                    .collect()
                    .await
                    .map_err(|e| CallError::classify(&*e))?;
                match collected.trailers() {
                    Some(t) if t.contains_key(GRPC_STATUS) => {
                        if let Some(failed) = failed_status(t) {
                            return Err(failed);
                        }
                    }
                    _ => return Err(CallError::new(Failure::Protocol, "no grpc-status")),
                }
                unframe(collected.to_bytes())
            })
            .await?;
        Ok((reply, sent))
    }
}

const APPLICATION_GRPC: http::HeaderValue = http::HeaderValue::from_static("application/grpc");
const TRAILERS: http::HeaderValue = http::HeaderValue::from_static("trailers");
const GRPC_STATUS: &str = "grpc-status";

/// The failure a `grpc-status` other than 0 reports, classified; `None` for OK.
fn failed_status(headers: &http::HeaderMap) -> Option<CallError> {
    if headers.get(GRPC_STATUS).map(|v| v.as_bytes()) == Some(b"0") {
        return None;
    }
    let status = Status::from_header_map(headers)
        .unwrap_or_else(|| Status::unknown("no grpc-status in the reply"));
    Some(status_error(&status))
}

/// A unary reply's one message out of its gRPC frame: a flag byte (0, not compressed: none was
/// offered), a big-endian length, and exactly that many bytes.
fn unframe(mut data: Bytes) -> Result<Bytes, CallError> {
    let bad = |what: String| Err(CallError::new(Failure::Protocol, what));
    if data.len() < GRPC_FRAMING {
        return bad(format!("a {}-byte reply is no gRPC message", data.len()));
    }
    let compressed = data.get_u8();
    let len = data.get_u32() as usize;
    if compressed != 0 {
        return bad("a compressed reply, though no compression was offered".into());
    }
    if len != data.len() {
        return bad(format!(
            "a reply framed as {len} bytes carries {}",
            data.len()
        ));
    }
    Ok(data)
}

impl Client for GrpcClient {
    fn call<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, CallError>> {
        Box::pin(async move {
            let (reply, _) = self.exchange(call).await?;
            Ok(Reply::decode_protobuf(call.operation(), &reply)?)
        })
    }

    /// An echo whose reply is the very bytes sent passes without decoding (as the JSON
    /// flavours': decoding is a function of the bytes); any other reply is decoded and checked.
    fn call_checked<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move {
            let (reply, sent) = self.exchange(call).await?;
            let op = call.operation();
            if op.echoes() && reply == sent {
                return Ok(());
            }
            check(call, &Reply::decode_protobuf(op, &reply)?)
        })
    }

    fn is_open(&self) -> bool {
        self.connection.is_open()
    }

    fn multiplexed(&self) -> bool {
        true
    }
}

/// Classifies a failed gRPC call: by the transport error under it when there is one, else by
/// status code.
pub(crate) fn status_error(s: &Status) -> CallError {
    if let Some(source) = std::error::Error::source(s) {
        let classified = CallError::classify(source);
        if classified.kind != Failure::Other {
            return CallError::new(
                classified.kind,
                format!("{}: {}", s.message(), classified.detail),
            );
        }
    }
    use tonic::Code;
    let kind = match s.code() {
        Code::DeadlineExceeded => Failure::Timeout,
        Code::Unavailable | Code::Cancelled | Code::Aborted => Failure::Reset,
        Code::Internal | Code::Unimplemented | Code::DataLoss | Code::ResourceExhausted => {
            Failure::Protocol
        }
        _ => Failure::Other,
    };
    CallError::new(kind, format!("{:?}: {}", s.code(), s.message()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flavour::test_support::{self, server};

    /// A reply's frame is checked: long enough, not compressed, exactly its stated length.
    #[test]
    fn a_reply_is_unframed_only_when_its_frame_is_exact() {
        let frame = |flag: u8, len: u32, body: &[u8]| {
            let mut b = BytesMut::new();
            b.put_u8(flag);
            b.put_u32(len);
            b.put_slice(body);
            b.freeze()
        };
        assert_eq!(unframe(frame(0, 3, b"abc")).unwrap(), &b"abc"[..]);
        assert_eq!(unframe(frame(0, 0, b"")).unwrap(), &b""[..]);
        for bad in [
            Bytes::from_static(b"\0\0\0"),
            frame(1, 3, b"abc"),
            frame(0, 4, b"abc"),
            frame(0, 2, b"abc"),
        ] {
            let e = unframe(bad.clone()).unwrap_err();
            assert_eq!(e.kind, Failure::Protocol, "{bad:?}: {e:?}");
        }
    }

    /// `grpc-status: 0` is success; any other code is a failure classified by its code, with
    /// tonic's reading of the message.
    #[test]
    fn a_status_other_than_ok_is_a_classified_failure() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = http::HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, http::HeaderValue::from_static(v));
            }
            h
        };
        assert!(failed_status(&headers(&[("grpc-status", "0")])).is_none());
        let e = failed_status(&headers(&[
            ("grpc-status", "14"),
            ("grpc-message", "going%20away"),
        ]))
        .unwrap();
        assert_eq!(e.kind, Failure::Reset);
        assert!(e.detail.contains("going away"), "{e:?}");
        let e = failed_status(&headers(&[("grpc-status", "13")])).unwrap();
        assert_eq!(e.kind, Failure::Protocol);
    }

    /// Against tonic's server: every operation answers, a refused call comes back as its status
    /// (InvalidArgument, counted as `other`), and the connection serves the next call.
    #[tokio::test]
    async fn the_client_calls_tonics_server() {
        let (addr, _stop) = server(&Grpc).await;
        let wire = Arc::new(WireCounters::default());
        let client = Grpc.connect(&addr.to_string(), &wire).await.unwrap();
        use crate::workload::{Generator, Workload};
        let workloads = [Workload::Order, Workload::Blob(4096), Workload::Wide];
        for (i, workload) in workloads.into_iter().enumerate() {
            let call = Generator::new(workload, 3).call(i as u64);
            client.call_checked(&call).await.unwrap();
            let reply = client.call(&call).await.unwrap();
            check(&call, &reply).unwrap();
        }
        test_support::a_refused_deduct_is_counted_other(&*client).await;
        test_support::deduct_works(&Grpc, addr).await;
    }
}
