//! What the two JSON flavours share: `POST /rig/<Operation>` with a JSON body, answered with
//! `200` and a JSON body, or `400`/`404`/`405` with a text body. HTTP/1.1 and HTTP/2 differ only
//! in how a connection is opened and served (their own files).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;

use super::{CallError, ErrorKind, MAX_MESSAGE};
use crate::rig::{Call, Operation, Reply};
use crate::service::RigService;

const PREFIX: &str = "/rig/";

/// The server side: route, decode, handle, encode.
pub async fn handle(
    req: Request<Incoming>,
    service: Arc<RigService>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(respond(req, &service)
        .await
        .unwrap_or_else(|(status, message)| {
            Response::builder()
                .status(status)
                .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(Full::new(Bytes::from(message)))
                .expect("static response parts are valid")
        }))
}

async fn respond(
    req: Request<Incoming>,
    service: &RigService,
) -> Result<Response<Full<Bytes>>, (StatusCode, String)> {
    let op = req
        .uri()
        .path()
        .strip_prefix(PREFIX)
        .and_then(Operation::from_name)
        .ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                format!("no operation at {}", req.uri().path()),
            )
        })?;
    if req.method() != Method::POST {
        return Err((StatusCode::METHOD_NOT_ALLOWED, "use POST".into()));
    }
    let body = Limited::new(req.into_body(), MAX_MESSAGE)
        .collect()
        .await
        .map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("cannot read the body: {e}"),
            )
        })?
        .to_bytes();
    let call = Call::decode_json(op, &body).map_err(|e| (StatusCode::BAD_REQUEST, e.0))?;
    let reply = service
        .handle(call)
        .await
        .map_err(|e| (StatusCode::BAD_REQUEST, e.0))?;
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(reply.encode_json())))
        .expect("static response parts are valid"))
}

/// The client side: the request for `call`. HTTP/1.1 sends origin-form with a Host header;
/// HTTP/2 needs the scheme and authority in the URI (they become pseudo-headers).
pub fn request(call: &Call, authority: &str, absolute: bool) -> Request<Full<Bytes>> {
    let path = format!("{PREFIX}{}", call.operation().name());
    let uri = if absolute {
        format!("http://{authority}{path}")
    } else {
        path
    };
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json");
    if !absolute {
        builder = builder.header(header::HOST, authority);
    }
    builder
        .body(Full::new(Bytes::from(call.encode_json())))
        .expect("request parts are valid")
}

/// Reads and decodes the reply to an `op` call.
pub async fn reply(op: Operation, resp: Response<Incoming>) -> Result<Reply, CallError> {
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_MESSAGE)
        .collect()
        .await
        .map_err(|e| CallError::classify(&*e))?
        .to_bytes();
    if status == StatusCode::BAD_REQUEST {
        return Err(CallError::new(
            ErrorKind::Other,
            format!(
                "server refused the call: {}",
                String::from_utf8_lossy(&body)
            ),
        ));
    }
    if status != StatusCode::OK {
        return Err(CallError::protocol(format!(
            "status {status}: {}",
            String::from_utf8_lossy(&body)
        )));
    }
    Ok(Reply::decode_json(op, &body)?)
}

/// Runs hyper's connection task; the flag turns true when the connection has ended.
pub fn drive<F>(connection: F) -> Arc<AtomicBool>
where
    F: std::future::Future + Send + 'static,
{
    let closed = Arc::new(AtomicBool::new(false));
    let flag = closed.clone();
    tokio::spawn(async move {
        let _ = connection.await;
        flag.store(true, Ordering::Relaxed);
    });
    closed
}

/// Classifies a hyper client error.
pub fn hyper_error(e: &hyper::Error) -> CallError {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
        ErrorKind::Protocol
    } else if e.is_canceled() || e.is_closed() || e.is_incomplete_message() {
        ErrorKind::Reset
    } else {
        return CallError::classify(e);
    };
    CallError::new(kind, e.to_string())
}
