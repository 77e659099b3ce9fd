//! `http1-json`: REST-style HTTP/1.1 with JSON bodies (hyper), as OpenFeign or a REST client
//! would call a service. One call at a time per connection: workers sharing a connection take
//! turns.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::budget::Budget;
use super::http_json::{self, CallerDriven};
use super::{BoxFuture, CallError, Client, CountingStream, Flavour, WireCounters};
use crate::rig::{Call, Reply};
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
        Box::pin(async move {
            let stream = super::connect_tcp(target, wire, super::Framing::Buffers).await?;
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| CallError::new(super::Failure::Connect, e.to_string()))?;
            Ok(Arc::new(Http1Client {
                sender: tokio::sync::Mutex::new(sender),
                authority: target.to_string(),
                connection: CallerDriven::new(connection),
            }) as Arc<dyn Client>)
        })
    }
}

type Connection =
    hyper::client::conn::http1::Connection<TokioIo<CountingStream<TcpStream>>, Full<Bytes>>;

struct Http1Client {
    /// HTTP/1.1 carries one exchange at a time: callers queue on this lock.
    sender: tokio::sync::Mutex<SendRequest<Full<Bytes>>>,
    /// Sent as the Host header.
    authority: String,
    connection: CallerDriven<Connection>,
}

impl Client for Http1Client {
    fn call<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, CallError>> {
        Box::pin(self.connection.drive(async move {
            let request = http_json::request(call, &self.authority, false);
            // Hold the connection until the whole response body is read: only then may the next
            // request go out on it.
            let mut sender = self.sender.lock().await;
            sender.ready().await.map_err(|e| CallError::classify(&e))?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| CallError::classify(&e))?;
            http_json::reply(call.operation(), response).await
        }))
    }

    fn is_open(&self) -> bool {
        self.connection.is_open()
    }

    fn multiplexed(&self) -> bool {
        false
    }
}
