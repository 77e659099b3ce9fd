//! `grpc`: HTTP/2 + protobuf with tonic, as gRPC or Dubbo Triple would call a service.
//!
//! The server is tonic's generated service run by hyper on our own accept loop (so it shares
//! the socket set-up of every flavour). The client is a tonic channel over a connector we own,
//! so each TCP connection it opens is counted, including any it re-opens after a failure.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Collected, Limited};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::http2_json::Http2Connection;
use super::{BoxFuture, CallError, Client, Failure, Flavour, WireCounters, MAX_MESSAGE};
use crate::rig::pb::rig_client::RigClient;
use crate::rig::pb::rig_server::{Rig, RigServer};
use crate::rig::{pb, Call, Reply};
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
            let client = RigClient::with_origin(connection.clone(), connection.origin.clone())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE);
            Ok(Arc::new(GrpcClient { client, connection }) as Arc<dyn Client>)
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

struct GrpcClient {
    /// Cheap to clone; each clone shares the one connection.
    client: RigClient<GrpcConnection>,
    connection: GrpcConnection,
}

impl Client for GrpcClient {
    fn call<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, CallError>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let reply = match call {
                Call::EchoOrder(m) => c
                    .echo_order(m.clone())
                    .await
                    .map(|r| Reply::EchoOrder(r.into_inner())),
                Call::EchoBlob(m) => c
                    .echo_blob(m.clone())
                    .await
                    .map(|r| Reply::EchoBlob(r.into_inner())),
                Call::EchoWide(m) => c
                    .echo_wide((**m).clone())
                    .await
                    .map(|r| Reply::EchoWide(Box::new(r.into_inner()))),
                Call::Deduct(m) => c
                    .deduct(m.clone())
                    .await
                    .map(|r| Reply::Deduct(r.into_inner())),
            };
            reply.map_err(|s| status_error(&s))
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
