//! The control API: Toxiproxy's REST API (so its client libraries drive faultrig unchanged),
//! with faultrig's fault model behind it, plus Prometheus metrics.
//!
//! - [`registry`]: the named proxies, their toxics and counters, and every operation on them;
//! - [`toxics`]: toxics as JSON, in Toxiproxy's shapes and units;
//! - [`metrics`]: `GET /metrics` in Prometheus' text format;
//! - this module: HTTP (hyper), routing, body limits and Toxiproxy's error bodies.
//!
//! [`run`] serves a listener until `shutdown` completes, like every server here.

pub mod client;
pub mod metrics;
pub mod registry;
pub mod toxics;

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use tokio::net::TcpListener;

pub use registry::{ProxySpec, Registry, RegistryOptions};

/// Largest request body accepted; larger ones get 413.
pub const MAX_BODY: usize = 1 << 20;

/// Connections the API serves at once: its clients are a few programs driving proxies, so a
/// small cap, well under the descriptors its proxies need.
pub const MAX_CONNECTIONS: usize = 256;

/// The version `GET /version` reports (faultrig's; clients treat it as opaque text).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "-faultrig");

/// An error as Toxiproxy reports it: `{"error": message, "status": code}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, message: &str) -> ApiError {
        ApiError {
            status,
            message: message.to_string(),
        }
    }

    pub fn bad_body(detail: &str) -> ApiError {
        ApiError::new(400, &format!("bad request body: {detail}"))
    }

    pub fn invalid_stream() -> ApiError {
        ApiError::new(
            400,
            "stream was invalid, can be either upstream or downstream",
        )
    }

    fn body(&self) -> Value {
        serde_json::json!({"error": self.message, "status": self.status})
    }
}

/// Serves the API on `listener` until `shutdown` completes; then stops every proxy.
pub async fn run(
    listener: TcpListener,
    registry: Arc<Registry>,
    shutdown: impl Future,
) -> std::io::Result<()> {
    let served = registry.clone();
    let result = crate::net::accept_until(
        listener,
        shutdown,
        "control API",
        MAX_CONNECTIONS.min(crate::net::connection_cap(None, 1)),
        move |stream, _, cancel| {
            let registry = served.clone();
            async move {
                let service = hyper::service::service_fn(move |req| {
                    let registry = registry.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(&registry, req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(crate::net::HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = cancel.cancelled() => conn.as_mut().graceful_shutdown(),
                }
            }
        },
    )
    .await;
    registry.stop_all().await;
    result
}

type Reply = Response<Full<Bytes>>;

/// Routes one request. Every outcome is a response: no input can make the API panic.
pub async fn handle(registry: &Registry, req: Request<Incoming>) -> Reply {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let segments: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(percent_decode)
        .collect();
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(e) => return error(&e),
    };
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    let is_update = method == Method::POST || method == Method::PATCH;
    let result: Result<(StatusCode, Option<Value>), ApiError> = match segs.as_slice() {
        ["proxies"] if method == Method::GET => Ok((StatusCode::OK, Some(registry.list().await))),
        ["proxies"] if method == Method::POST => {
            match json(&body).and_then(|v| ProxySpec::from_json(&v, None)) {
                Ok(spec) => registry
                    .create(spec)
                    .await
                    .map(|v| (StatusCode::CREATED, Some(v))),
                Err(e) => Err(e),
            }
        }
        ["populate"] if method == Method::POST => return populate(registry, &body).await,
        ["reset"] if method == Method::POST => registry
            .reset()
            .await
            .map(|()| (StatusCode::NO_CONTENT, None)),
        ["version"] if method == Method::GET => Ok((
            StatusCode::OK,
            Some(serde_json::json!({"version": VERSION})),
        )),
        ["metrics"] if method == Method::GET => {
            let text = metrics::render(&registry.snapshot().await);
            return Response::builder()
                .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                .body(Full::new(Bytes::from(text)))
                .expect("valid response");
        }
        ["proxies", name] if method == Method::GET => registry.get(name).await.map(ok),
        // An unknown proxy is reported before a bad body, as Toxiproxy does.
        ["proxies", name] if is_update => match json(&body) {
            Ok(v) => registry.update(name, &v).await.map(ok),
            Err(e) => registry.get(name).await.and(Err(e)),
        },
        ["proxies", name] if method == Method::DELETE => registry
            .delete(name)
            .await
            .map(|()| (StatusCode::NO_CONTENT, None)),
        ["proxies", name, "stats"] if method == Method::GET => registry
            .stats(name)
            .await
            .map(|s| ok(serde_json::to_value(s).expect("counters serialise"))),
        ["proxies", name, "toxics"] if method == Method::GET => registry.toxics(name).await.map(ok),
        ["proxies", name, "toxics"] if method == Method::POST => {
            registry.add_toxic(name, json(&body)).await.map(ok)
        }
        ["proxies", name, "toxics", toxic] if method == Method::GET => {
            registry.get_toxic(name, toxic).await.map(ok)
        }
        ["proxies", name, "toxics", toxic] if is_update => registry
            .update_toxic(name, toxic, json(&body))
            .await
            .map(ok),
        ["proxies", name, "toxics", toxic] if method == Method::DELETE => registry
            .delete_toxic(name, toxic)
            .await
            .map(|()| (StatusCode::NO_CONTENT, None)),
        ["proxies"]
        | ["populate"]
        | ["reset"]
        | ["version"]
        | ["metrics"]
        | ["proxies", _]
        | ["proxies", _, "stats"]
        | ["proxies", _, "toxics"]
        | ["proxies", _, "toxics", _] => Err(ApiError::new(
            405,
            &format!("method not allowed: {method} {path}"),
        )),
        _ => Err(ApiError::new(404, &format!("no such endpoint: {path}"))),
    };
    match result {
        Ok((status, value)) => respond(status, value),
        Err(e) => error(&e),
    }
}

fn ok(v: Value) -> (StatusCode, Option<Value>) {
    (StatusCode::OK, Some(v))
}

async fn populate(registry: &Registry, body: &Bytes) -> Reply {
    let specs = json(body).and_then(|v| {
        let list = v
            .as_array()
            .ok_or_else(|| ApiError::bad_body("expected a JSON array of proxies"))?;
        list.iter()
            .enumerate()
            .map(|(i, p)| ProxySpec::from_json(p, Some(i)))
            .collect::<Result<Vec<_>, _>>()
    });
    match specs {
        Err(e) => error(&e),
        Ok(specs) => match registry.populate(specs).await {
            Ok(v) => respond(StatusCode::CREATED, Some(v)),
            Err((e, done)) => {
                let mut body = e.body();
                body["proxies"] = done;
                respond(status_of(&e), Some(body))
            }
        },
    }
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::new(
                413,
                &format!("request body larger than {MAX_BODY} bytes"),
            ))
        }
        Err(e) => Err(ApiError::bad_body(&e.to_string())),
    }
}

/// The body as JSON; an empty body is an empty object (clients send none for some POSTs).
fn json(body: &Bytes) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_body(&e.to_string()))
}

fn status_of(e: &ApiError) -> StatusCode {
    StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn respond(status: StatusCode, value: Option<Value>) -> Reply {
    let builder = Response::builder().status(status);
    match value {
        Some(v) => builder
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(format!("{v}\n")))),
        None => builder.body(Full::new(Bytes::new())),
    }
    .expect("valid response")
}

fn error(e: &ApiError) -> Reply {
    if e.status >= 500 {
        tracing::warn!("control API: {}", e.message);
    }
    respond(status_of(e), Some(e.body()))
}

/// Decodes `%XX` escapes in a path segment (proxy and toxic names may hold any character).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}
