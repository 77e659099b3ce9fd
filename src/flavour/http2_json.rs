//! `http2-json`: JSON over h2c with prior knowledge (hyper), as Feign over HTTP/2 would call a
//! service. Calls are multiplexed as HTTP/2 streams on one connection.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::budget::Budget;
use super::caller_driven::CallerDriven;
use super::http_json::{self, ReplyBody};
use super::{BoxFuture, CallError, Client, CountingStream, Flavour, WireCounters};
use crate::service::RigService;

/// HTTP/2 flow-control windows. The 64 KiB defaults would make a 1 MiB blob wait for several
/// WINDOW_UPDATE round trips, which on a 10 ms link measures flow control, not the RPC.
pub(crate) const STREAM_WINDOW: u32 = 4 << 20;
pub(crate) const CONNECTION_WINDOW: u32 = 16 << 20;

/// Streams one HTTP/2 connection may have open: ten times the largest concurrency the
/// experiments use. A client past it waits for a stream to close (h2 flow control).
pub(crate) const MAX_STREAMS: u32 = 1024;

/// Largest header block a stream may send (hyper's default, stated): with [`MAX_STREAMS`],
/// 16 MiB of headers per connection at most.
pub(crate) const MAX_HEADER_LIST: u32 = 16 << 10;

/// The HTTP/2 server settings both h2 flavours (grpc, http2-json) serve with: big windows, and
/// room for every call a load generator keeps in flight. Request bytes not yet read by a
/// handler are bounded by the connection window; what handlers hold is charged to the
/// connection's byte budget (`http2-json`, see [`super::budget`]). Dead peers are found by PING
/// ([`crate::net::H2_KEEP_ALIVE_INTERVAL`]).
pub(crate) fn server_builder() -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST)
        .timer(TokioTimer::new())
        .keep_alive_interval(crate::net::H2_KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(crate::net::H2_KEEP_ALIVE_TIMEOUT);
    builder
}

pub struct Http2Json;

impl Flavour for Http2Json {
    fn name(&self) -> &'static str {
        "http2-json"
    }

    fn serve_connection(
        &self,
        stream: TcpStream,
        service: Arc<RigService>,
    ) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let budget = Budget::default();
            let handler = hyper::service::service_fn(move |req| {
                http_json::handle(req, service.clone(), budget.clone())
            });
            let _ = server_builder()
                .serve_connection(TokioIo::new(stream), handler)
                .await;
        })
    }

    fn connect<'a>(
        &'a self,
        target: &'a str,
        wire: &'a Arc<WireCounters>,
    ) -> BoxFuture<'a, Result<Arc<dyn Client>, CallError>> {
        Box::pin(http_json::JsonClient::connect(target, wire, true))
    }
}

type Connection = h2::client::Connection<CountingStream<TcpStream>, Bytes>;

/// One h2c (prior knowledge) client connection, counted in the cell's [`WireCounters`]: the
/// `http2-json` flavour's, and the generic HTTP target's with `--http2`.
///
/// On the h2 crate itself rather than hyper's HTTP/2 client: hyper sends a request's body from
/// a task of its own once the stream has flow-control capacity, so every call cost a spawned
/// task and a second write (HEADERS, then DATA), and the server a second read. Here the body is
/// handed to the stream with its headers and both leave in one write (measured with
/// `strace -c`: two `writev` per call before, one after).
pub(crate) struct Http2Connection {
    /// Cloned per call: each clone opens its own stream on the one connection.
    sender: h2::client::SendRequest<Bytes>,
    connection: CallerDriven<Connection>,
    /// `write_pattern = "split"`: a request's HEADERS are written before its body is handed
    /// to the stream, so they leave in a write of their own.
    headers_apart: bool,
}

impl Http2Connection {
    pub(crate) async fn open(
        target: &str,
        wire: &Arc<WireCounters>,
    ) -> Result<Http2Connection, CallError> {
        let stream = super::connect_tcp(target, wire, super::Framing::Buffers).await?;
        let (sender, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_header_list_size(MAX_HEADER_LIST)
            .handshake(stream)
            .await
            .map_err(|e| CallError::new(super::Failure::Connect, e.to_string()))?;
        Ok(Http2Connection {
            sender,
            connection: CallerDriven::new(connection),
            headers_apart: wire.socket.write_pattern == super::WritePattern::Split,
        })
    }

    /// Sends `request` on a stream of its own and hands its response to `read`. The request's
    /// URI must be absolute: scheme and authority become pseudo-headers.
    pub(crate) async fn exchange<T, F>(
        &self,
        request: Request<Bytes>,
        read: impl FnOnce(Response<ReplyBody>) -> F,
    ) -> Result<T, CallError>
    where
        F: std::future::Future<Output = Result<T, CallError>>,
    {
        let (mut head, body) = request.into_parts();
        // As hyper does: a body's length is announced.
        if !body.is_empty() {
            head.headers
                .entry(http::header::CONTENT_LENGTH)
                .or_insert_with(|| http::HeaderValue::from(body.len()));
        }
        self.connection
            .drive(async move {
                let mut sender = self
                    .sender
                    .clone()
                    .ready()
                    .await
                    .map_err(|e| CallError::classify(&e))?;
                let end = body.is_empty();
                let (response, mut send) = sender
                    .send_request(Request::from_parts(head, ()), end)
                    .map_err(|e| CallError::classify(&e))?;
                if !end {
                    if self.headers_apart {
                        // Pending once: `drive` polls the connection, which writes the HEADERS.
                        tokio::task::yield_now().await;
                    }
                    // Buffered by the stream, sent as flow control allows (our bodies fit the
                    // initial windows).
                    send.send_data(body, true)
                        .map_err(|e| CallError::classify(&e))?;
                }
                let response = response.await.map_err(|e| CallError::classify(&e))?;
                read(response.map(ReplyBody::Http2)).await
            })
            .await
    }

    pub(crate) fn is_open(&self) -> bool {
        self.connection.is_open()
    }
}
