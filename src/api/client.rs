//! A small client of the control API, for `faultrig ctl` (people without a client library)
//! and for the runner when it drives remote proxies.

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// What went wrong talking to the API.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API could not be reached or broke the connection.
    #[error("control API at {addr}: {why}")]
    Unreachable { addr: String, why: String },
    /// The API answered with an error (`{"error": .., "status": ..}`).
    #[error("control API: {status} {message}")]
    Api { status: u16, message: String },
}

/// One request: `body` as JSON when given. Returns the JSON answer (`Null` for 204).
pub async fn request(
    addr: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, ClientError> {
    let unreachable = |why: String| ClientError::Unreachable {
        addr: addr.to_string(),
        why,
    };
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    tokio::spawn(connection);
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(payload)))
        .map_err(|e| unreachable(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(e.to_string()))?
        .to_bytes();
    let value: Value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    if status >= 400 {
        let message = value
            .get("error")
            .and_then(Value::as_str)
            .map_or_else(|| value.to_string(), str::to_string);
        return Err(ClientError::Api { status, message });
    }
    Ok(value)
}

/// `GET` of a plain-text endpoint (`/metrics`).
pub async fn get_text(addr: &str, path: &str) -> Result<String, ClientError> {
    match request(addr, Method::GET, path, None).await? {
        Value::String(s) => Ok(s),
        other => Ok(other.to_string()),
    }
}
