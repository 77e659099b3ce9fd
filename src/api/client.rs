//! A client of the control API: [`Client`], typed over [`super::wire`], for the runner when it
//! drives remote proxies and for tests; and the raw [`request`] under it, for `faultrig ctl`
//! (people without a client library), which prints whatever JSON comes back.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::time::timeout;

use super::wire::{
    PopulateJson, ProxyJson, ProxyUpdate, StatsJson, ToxicJson, ToxicUpdate, VersionJson,
};
use super::ApiError;

/// How long the client waits, and how much it reads: an API that stalls or streams without end
/// must not hang `faultrig ctl` or a run driving remote proxies, nor fill its memory.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// To open the TCP connection.
    pub connect: Duration,
    /// From sending the request to the response's status and headers.
    pub response: Duration,
    /// To read the whole response body.
    pub body: Duration,
    /// Largest response body read; a longer one is an error.
    pub max_body: usize,
}

impl Default for Limits {
    /// Generous for an API on another host whose proxies take a moment to start or stop (a
    /// delete waits for every connection to close), tight enough that a dead one is noticed.
    fn default() -> Self {
        Limits {
            connect: Duration::from_secs(5),
            response: Duration::from_secs(30),
            body: Duration::from_secs(30),
            max_body: 16 << 20,
        }
    }
}

/// What went wrong talking to the API.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API could not be reached or broke the connection.
    #[error("control API at {addr}: {why}")]
    Unreachable { addr: String, why: String },
    /// The API did not connect, answer or finish its answer in time.
    #[error("control API at {addr}: no {what} within {after:?}")]
    TimedOut {
        addr: String,
        what: &'static str,
        after: Duration,
    },
    /// The answer was longer than [`Limits::max_body`].
    #[error("control API at {addr}: answer longer than {limit} bytes")]
    TooLarge { addr: String, limit: usize },
    /// The API answered with an error (`{"error": .., "status": ..}`).
    #[error("control API: {status} {message}")]
    Api { status: u16, message: String },
    /// The API answered, but not in the shape asked for: not faultrig's or Toxiproxy's API.
    #[error("control API at {addr}: unexpected answer to {request}: {why}")]
    Unexpected {
        addr: String,
        request: String,
        why: String,
    },
}

impl ClientError {
    /// Whether the API answered with `error` (one of [`ApiError`]'s named errors).
    pub fn is(&self, error: &ApiError) -> bool {
        matches!(self, ClientError::Api { status, message }
            if *status == error.status && *message == error.message)
    }
}

/// One request with the default [`Limits`]: `body` as JSON when given. Returns the JSON answer
/// (`Null` for 204).
pub async fn request(
    addr: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, ClientError> {
    request_with(addr, method, path, body, &Limits::default()).await
}

/// [`request`] within `limits`.
pub async fn request_with(
    addr: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
    limits: &Limits,
) -> Result<Value, ClientError> {
    let bytes = exchange(addr, method, path, body, limits).await?;
    Ok(parse(&bytes))
}

/// [`request`], the answer's body as the API sent it (empty for 204): for `faultrig ctl
/// --json`, which prints the API's own JSON.
pub async fn request_raw(
    addr: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Result<Bytes, ClientError> {
    exchange(addr, method, path, body, &Limits::default()).await
}

/// A body as JSON; one that is not JSON (`/metrics`) as a string, an empty one as `Null`.
fn parse(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
    }
}

/// One request and its whole answer's body; an error status is [`ClientError::Api`].
async fn exchange(
    addr: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
    limits: &Limits,
) -> Result<Bytes, ClientError> {
    let unreachable = |why: String| ClientError::Unreachable {
        addr: addr.to_string(),
        why,
    };
    let timed_out = |what, after| ClientError::TimedOut {
        addr: addr.to_string(),
        what,
        after,
    };
    let stream = timeout(limits.connect, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| timed_out("connection", limits.connect))?
        .map_err(|e| unreachable(e.to_string()))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    // Ends when the response is read and `sender` dropped, or when the server closes: so it
    // never outlives this call by more than the server's own close.
    let connection = tokio::spawn(connection);
    let _abort = AbortOnDrop(connection);
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(payload)))
        .map_err(|e| unreachable(e.to_string()))?;
    let resp = timeout(limits.response, sender.send_request(req))
        .await
        .map_err(|_| timed_out("answer", limits.response))?
        .map_err(|e| unreachable(e.to_string()))?;
    let status = resp.status().as_u16();
    let bytes = match timeout(
        limits.body,
        Limited::new(resp.into_body(), limits.max_body).collect(),
    )
    .await
    {
        Err(_) => return Err(timed_out("complete answer", limits.body)),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(ClientError::TooLarge {
                addr: addr.to_string(),
                limit: limits.max_body,
            })
        }
        Ok(Err(e)) => return Err(unreachable(e.to_string())),
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    if status >= 400 {
        let value = parse(&bytes);
        let message = value
            .get("error")
            .and_then(Value::as_str)
            .map_or_else(|| value.to_string(), str::to_string);
        return Err(ClientError::Api { status, message });
    }
    Ok(bytes)
}

/// Stops the connection task when the request is given up (a timeout, a cap), so a server that
/// never closes does not keep the socket open.
struct AbortOnDrop(tokio::task::JoinHandle<Result<(), hyper::Error>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A proxy or toxic name as one path segment (names may hold any character).
pub fn segment(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The control API at one address, typed: answers are [`super::wire`]'s structs, errors
/// [`ClientError`]s.
#[derive(Clone, Debug)]
pub struct Client {
    addr: String,
    limits: Limits,
}

impl Client {
    /// The API at `HOST:PORT`, with the default [`Limits`].
    pub fn new(addr: &str) -> Client {
        Client::with_limits(addr, Limits::default())
    }

    pub(crate) fn with_limits(addr: &str, limits: Limits) -> Client {
        Client {
            addr: addr.to_string(),
            limits,
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        let unexpected = |why: String| ClientError::Unexpected {
            addr: self.addr.clone(),
            request: format!("{method} {path}"),
            why,
        };
        let body = body
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| unexpected(e.to_string()))?;
        let answer = request_with(
            &self.addr,
            method.clone(),
            path,
            body.as_ref(),
            &self.limits,
        )
        .await?;
        serde_json::from_value(answer).map_err(|e| unexpected(e.to_string()))
    }

    /// `GET /version`.
    pub async fn version(&self) -> Result<String, ClientError> {
        let v: VersionJson = self.call(Method::GET, "/version", NO_BODY).await?;
        Ok(v.version)
    }

    /// `GET /proxies`: name → proxy.
    pub async fn proxies(&self) -> Result<BTreeMap<String, ProxyJson>, ClientError> {
        self.call(Method::GET, "/proxies", NO_BODY).await
    }

    /// `GET /proxies/{name}`.
    pub async fn proxy(&self, name: &str) -> Result<ProxyJson, ClientError> {
        self.call(Method::GET, &proxy_path(name), NO_BODY).await
    }

    /// `POST /proxies`: the proxy as created (with its bound `listen`).
    pub async fn create(&self, proxy: &ProxyJson) -> Result<ProxyJson, ClientError> {
        self.call(Method::POST, "/proxies", Some(proxy)).await
    }

    /// `POST /populate`: the proxies as created or kept.
    pub async fn populate(&self, proxies: &[ProxyJson]) -> Result<Vec<ProxyJson>, ClientError> {
        let done: PopulateJson = self.call(Method::POST, "/populate", Some(&proxies)).await?;
        Ok(done.proxies)
    }

    /// `POST /proxies/{name}` with `enabled`: starts or stops the proxy.
    pub async fn set_enabled(&self, name: &str, enabled: bool) -> Result<ProxyJson, ClientError> {
        let body = ProxyUpdate {
            enabled: Some(enabled.into()),
            ..ProxyUpdate::default()
        };
        self.call(Method::POST, &proxy_path(name), Some(&body))
            .await
    }

    /// `DELETE /proxies/{name}`.
    pub async fn delete(&self, name: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, &proxy_path(name), NO_BODY).await
    }

    /// `POST /reset`: every proxy enabled, every toxic removed.
    pub async fn reset(&self) -> Result<(), ClientError> {
        self.call(Method::POST, "/reset", NO_BODY).await
    }

    /// `GET /proxies/{name}/stats` (faultrig's).
    pub async fn stats(&self, proxy: &str) -> Result<StatsJson, ClientError> {
        let path = format!("{}/stats", proxy_path(proxy));
        self.call(Method::GET, &path, NO_BODY).await
    }

    /// `GET /proxies/{name}/toxics`.
    pub async fn toxics(&self, proxy: &str) -> Result<Vec<ToxicJson>, ClientError> {
        self.call(Method::GET, &toxics_path(proxy), NO_BODY).await
    }

    /// `GET /proxies/{proxy}/toxics/{name}`.
    pub async fn toxic(&self, proxy: &str, name: &str) -> Result<ToxicJson, ClientError> {
        self.call(Method::GET, &toxic_path(proxy, name), NO_BODY)
            .await
    }

    /// `POST /proxies/{proxy}/toxics`: the toxic as the API holds it (named, every attribute
    /// of its type present).
    pub async fn add_toxic(
        &self,
        proxy: &str,
        toxic: &ToxicJson,
    ) -> Result<ToxicJson, ClientError> {
        self.call(Method::POST, &toxics_path(proxy), Some(toxic))
            .await
    }

    /// `POST /proxies/{proxy}/toxics/{name}`: the attributes given replace the toxic's, the
    /// rest stay.
    pub async fn update_toxic(
        &self,
        proxy: &str,
        name: &str,
        update: &ToxicUpdate,
    ) -> Result<ToxicJson, ClientError> {
        self.call(Method::POST, &toxic_path(proxy, name), Some(update))
            .await
    }

    /// `DELETE /proxies/{proxy}/toxics/{name}`.
    pub(crate) async fn delete_toxic(&self, proxy: &str, name: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, &toxic_path(proxy, name), NO_BODY)
            .await
    }

    /// `GET /metrics`: Prometheus' text.
    pub async fn metrics_text(&self) -> Result<String, ClientError> {
        let bytes = exchange(&self.addr, Method::GET, "/metrics", None, &self.limits).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// For calls without a body: `None` of some serialisable type.
const NO_BODY: Option<&()> = None;

fn proxy_path(name: &str) -> String {
    format!("/proxies/{}", segment(name))
}

fn toxics_path(proxy: &str) -> String {
    format!("{}/toxics", proxy_path(proxy))
}

fn toxic_path(proxy: &str, name: &str) -> String {
    format!("{}/{}", toxics_path(proxy), segment(name))
}
