//! The control API: Toxiproxy's REST API (so its client libraries drive faultrig unchanged),
//! with faultrig's fault model behind it, plus Prometheus metrics.
//!
//! - [`registry`]: the named proxies, their toxics and counters, and every operation on them;
//! - [`toxics`]: toxic bodies checked against [`crate::toxic::ToxicKind`]'s types and bounds;
//! - [`wire`]: the JSON requests and answers, in Toxiproxy's shapes, shared with [`client`];
//! - [`client`]: a typed client of the API (the runner's, the tests');
//! - [`metrics`]: `GET /metrics` in Prometheus' text format;
//! - this module: HTTP (hyper), routing, body limits and Toxiproxy's error bodies.
//!
//! [`run`] serves a listener until `shutdown` completes, like every server here.

pub mod client;
pub mod metrics;
pub mod registry;
pub mod toxics;
pub mod wire;

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use serde_json::Value;
use tokio::net::TcpListener;

pub use registry::{ProxySpec, Registry, RegistryOptions};
use wire::{ErrorJson, VersionJson};

/// Largest request body accepted; larger ones get 413.
pub(crate) const MAX_BODY: usize = 1 << 20;

/// Connections the API serves at once: its clients are a few programs driving proxies, so a
/// small cap, well under the descriptors its proxies need.
pub(crate) const MAX_CONNECTIONS: usize = 256;

/// The version `GET /version` reports (faultrig's; clients treat it as opaque text).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "-faultrig");

/// An error as Toxiproxy reports it: `{"error": message, "status": code}`. The constructors
/// are the one place Toxiproxy's messages and codes are written (its `api.go` errors), so the
/// server and [`client::ClientError::is`] agree.
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

    pub(crate) fn proxy_not_found() -> ApiError {
        ApiError::new(404, "proxy not found")
    }

    pub(crate) fn proxy_exists() -> ApiError {
        ApiError::new(409, "proxy already exists")
    }

    pub(crate) fn toxic_not_found() -> ApiError {
        ApiError::new(404, "toxic not found")
    }

    pub(crate) fn toxic_exists() -> ApiError {
        ApiError::new(409, "toxic already exists")
    }

    pub(crate) fn invalid_toxic_type() -> ApiError {
        ApiError::new(400, "invalid toxic type")
    }

    pub(crate) fn invalid_stream() -> ApiError {
        ApiError::new(
            400,
            "stream was invalid, can be either upstream or downstream",
        )
    }

    pub(crate) fn bad_body(detail: &str) -> ApiError {
        ApiError::new(400, &format!("bad request body: {detail}"))
    }

    /// `at`: where in a `/populate` list (Toxiproxy's "missing required field: name at proxy
    /// 2").
    pub(crate) fn missing_field(field: &str, at: Option<usize>) -> ApiError {
        let at = at
            .map(|i| format!(" at proxy {}", i + 1))
            .unwrap_or_default();
        ApiError::new(400, &format!("missing required field: {field}{at}"))
    }

    pub(crate) fn no_endpoint(path: &str) -> ApiError {
        ApiError::new(404, &format!("no such endpoint: {path}"))
    }

    pub(crate) fn method_not_allowed(method: &Method, path: &str) -> ApiError {
        ApiError::new(405, &format!("method not allowed: {method} {path}"))
    }

    pub(crate) fn too_large(limit: usize) -> ApiError {
        ApiError::new(413, &format!("request body larger than {limit} bytes"))
    }

    /// The proxy host failed (a listener, the kernel engine), not the request.
    pub(crate) fn internal(message: &str) -> ApiError {
        ApiError::new(500, message)
    }

    /// The same error with `context` after its message.
    pub fn within(self, context: &str) -> ApiError {
        ApiError::new(self.status, &format!("{} {context}", self.message))
    }

    pub fn body(&self) -> ErrorJson {
        ErrorJson {
            error: self.message.clone(),
            status: self.status,
            proxies: None,
        }
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
        None,
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
        ["proxies"] if method == Method::GET => Ok(ok(registry.list().await)),
        ["proxies"] if method == Method::POST => {
            match json(&body).and_then(|v| ProxySpec::from_json(v, None)) {
                Ok(spec) => registry
                    .create(spec)
                    .await
                    .map(|p| (StatusCode::CREATED, Some(to_json(p)))),
                Err(e) => Err(e),
            }
        }
        ["populate"] if method == Method::POST => return populate(registry, &body).await,
        ["reset"] if method == Method::POST => registry
            .reset()
            .await
            .map(|()| (StatusCode::NO_CONTENT, None)),
        ["version"] if method == Method::GET => Ok(ok(VersionJson {
            version: VERSION.to_string(),
        })),
        ["metrics"] if method == Method::GET => {
            let text = metrics::render(&registry.snapshot().await);
            return Response::builder()
                .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                .body(Full::new(Bytes::from(text)))
                .expect("valid response");
        }
        ["proxies", name] if method == Method::GET => registry.get(name).await.map(ok),
        // An unknown proxy is reported before a bad body, as Toxiproxy does.
        ["proxies", name] if is_update => match json(&body).and_then(parse_body) {
            Ok(update) => registry.update(name, update).await.map(ok),
            Err(e) => registry.get(name).await.and(Err(e)),
        },
        ["proxies", name] if method == Method::DELETE => registry
            .delete(name)
            .await
            .map(|()| (StatusCode::NO_CONTENT, None)),
        ["proxies", name, "stats"] if method == Method::GET => registry.stats(name).await.map(ok),
        ["proxies", name, "toxics"] if method == Method::GET => registry.toxics(name).await.map(ok),
        ["proxies", name, "toxics"] if method == Method::POST => {
            let request = json(&body).and_then(parse_body);
            registry.add_toxic(name, request).await.map(ok)
        }
        ["proxies", name, "toxics", toxic] if method == Method::GET => {
            registry.get_toxic(name, toxic).await.map(ok)
        }
        ["proxies", name, "toxics", toxic] if is_update => registry
            .update_toxic(name, toxic, json(&body).and_then(parse_body))
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
        | ["proxies", _, "toxics", _] => Err(ApiError::method_not_allowed(&method, &path)),
        _ => Err(ApiError::no_endpoint(&path)),
    };
    match result {
        Ok((status, value)) => respond(status, value),
        Err(e) => error(&e),
    }
}

fn ok(answer: impl Serialize) -> (StatusCode, Option<Value>) {
    (StatusCode::OK, Some(to_json(answer)))
}

fn to_json(answer: impl Serialize) -> Value {
    serde_json::to_value(answer).expect("wire types serialise to JSON")
}

async fn populate(registry: &Registry, body: &Bytes) -> Reply {
    let specs = json(body).and_then(|v| {
        let Value::Array(list) = v else {
            return Err(ApiError::bad_body("expected a JSON array of proxies"));
        };
        list.into_iter()
            .enumerate()
            .map(|(i, p)| ProxySpec::from_json(p, Some(i)))
            .collect::<Result<Vec<_>, _>>()
    });
    match specs {
        Err(e) => error(&e),
        Ok(specs) => match registry.populate_proxies(specs).await {
            Ok(done) => respond(StatusCode::CREATED, Some(to_json(done))),
            Err((e, done)) => {
                let body = ErrorJson {
                    proxies: Some(done),
                    ..e.body()
                };
                respond(status_of(&e), Some(to_json(body)))
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
            Err(ApiError::too_large(MAX_BODY))
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

/// A request body (one of [`wire`]'s request structs) from its JSON, which must be an object.
/// The JSON is parsed on its own first, so a syntax error is reported in serde_json's words
/// and a repeated key counts once, with its last value (as Go's decoder in Toxiproxy takes
/// it). Every request field is a [`wire::Given`], so no object is refused here: the caller
/// checks each field, with Toxiproxy's message.
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    if !v.is_object() {
        return Err(ApiError::bad_body("expected a JSON object"));
    }
    serde_json::from_value(v).map_err(|e| ApiError::bad_body(&e.to_string()))
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
    respond(status_of(e), Some(to_json(e.body())))
}

/// Decodes `%XX` escapes in a path segment (proxy and toxic names may hold any character).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}
