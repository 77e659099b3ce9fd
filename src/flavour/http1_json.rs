//! `http1-json`: REST-style HTTP/1.1 with JSON bodies (hyper), as OpenFeign or a REST client
//! would call a service. One call at a time per connection: workers sharing a connection take
//! turns.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::budget::Budget;
use super::caller_driven::CallerDriven;
use super::http_json::{self, ReplyBody};
use super::{BoxFuture, CallError, Client, CountingStream, Flavour, WireCounters};
use crate::service::RigService;

pub struct Http1Json;

impl Flavour for Http1Json {
    fn name(&self) -> &'static str {
        "http1-json"
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
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(crate::net::HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), handler)
                .await;
        })
    }

    fn connect<'a>(
        &'a self,
        target: &'a str,
        wire: &'a Arc<WireCounters>,
    ) -> BoxFuture<'a, Result<Arc<dyn Client>, CallError>> {
        Box::pin(http_json::JsonClient::connect(target, wire, false))
    }
}

type Connection =
    hyper::client::conn::http1::Connection<TokioIo<CountingStream<TcpStream>>, Full<Bytes>>;

/// One HTTP/1.1 client connection, counted in the cell's [`WireCounters`]: the `http1-json`
/// flavour's, and the generic HTTP target's.
pub(crate) struct Http1Connection {
    /// HTTP/1.1 carries one exchange at a time: callers queue on this lock.
    sender: tokio::sync::Mutex<SendRequest<Full<Bytes>>>,
    connection: CallerDriven<Connection>,
}

impl Http1Connection {
    pub(crate) async fn open(
        target: &str,
        wire: &Arc<WireCounters>,
    ) -> Result<Http1Connection, CallError> {
        let stream = super::connect_tcp(target, wire, super::Framing::Buffers).await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| CallError::new(super::Failure::Connect, e.to_string()))?;
        Ok(Http1Connection {
            sender: tokio::sync::Mutex::new(sender),
            connection: CallerDriven::new(connection),
        })
    }

    /// Sends `request` and hands its response to `read`, holding the connection until `read`
    /// is done: only once the whole response body is read may the next request go out on it.
    pub(crate) async fn exchange<T, F>(
        &self,
        request: Request<Full<Bytes>>,
        read: impl FnOnce(Response<ReplyBody>) -> F,
    ) -> Result<T, CallError>
    where
        F: std::future::Future<Output = Result<T, CallError>>,
    {
        self.connection
            .drive(async move {
                let mut sender = self.sender.lock().await;
                sender.ready().await.map_err(|e| CallError::classify(&e))?;
                let response = sender
                    .send_request(request)
                    .await
                    .map_err(|e| CallError::classify(&e))?;
                read(response.map(ReplyBody::Http1)).await
            })
            .await
    }

    pub(crate) fn is_open(&self) -> bool {
        self.connection.is_open()
    }
}
