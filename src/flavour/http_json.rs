//! What the two JSON flavours share: `POST /rig/<Operation>` with a JSON body, answered with
//! `200` and a JSON body, or `400`/`404`/`405` with a text body. HTTP/1.1 and HTTP/2 differ only
//! in how a connection is opened and served (their own files).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::budget::{self, Budget, Charge};
use super::http1_json::Http1Connection;
use super::http2_json::Http2Connection;
use super::{check, BoxFuture, CallError, Client, Failure, WireCounters, MAX_MESSAGE};
use crate::rig::{Call, Operation, Reply};
use crate::service::RigService;

const PREFIX: &str = "/rig/";

/// Budget bytes charged per body byte: the body's chunks as read, the call decoded from them
/// (base64 and strings decode to no more than their JSON), and the reply (an echo's is the
/// body again).
const COST_PER_BODY_BYTE: usize = 3;

/// Body bytes are charged once this much cost has accumulated (and at the end).
const CHARGE_BATCH: usize = 64 << 10;

/// A response body holding its call's budget charge until hyper has taken the last bytes.
pub(crate) struct ChargedBody {
    body: Full<Bytes>,
    _charge: Vec<Charge>,
}

impl Body for ChargedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The server side: route, decode, handle, encode. What the call holds is charged to the
/// connection's `budget`; a call that does not fit is refused with `503` (HTTP/2 streams of
/// one connection run at once, so waiting would stall the connection's other calls).
pub async fn handle(
    req: Request<Incoming>,
    service: Arc<RigService>,
    budget: Budget,
) -> Result<Response<ChargedBody>, Infallible> {
    let mut charges = Vec::new();
    let response = respond(req, &service, &budget, &mut charges)
        .await
        .unwrap_or_else(|(status, message)| {
            charges.clear();
            Response::builder()
                .status(status)
                .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(Full::new(Bytes::from(message)))
                .expect("static response parts are valid")
        });
    Ok(response.map(|body| ChargedBody {
        body,
        _charge: charges,
    }))
}

/// The request's body, each chunk charged to `budget` as it arrives.
async fn read_body(
    body: Incoming,
    budget: &Budget,
    charges: &mut Vec<Charge>,
) -> Result<Bytes, (StatusCode, String)> {
    let busy = |refused: budget::Refused| (StatusCode::SERVICE_UNAVAILABLE, refused.to_string());
    charges.push(budget.try_charge(budget::call_cost(0)).map_err(busy)?);
    let mut body = Limited::new(body, MAX_MESSAGE);
    // Chunks are copied into one buffer as they come, and charged in batches: a body sent a
    // byte at a time (HTTP/1.1 chunks, h2 DATA frames) must not cost a queue entry and a
    // charge per byte.
    let mut all = bytes::BytesMut::new();
    let mut uncharged = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("cannot read the body: {e}"),
            )
        })?;
        if let Ok(data) = frame.into_data() {
            all.extend_from_slice(&data);
            uncharged += COST_PER_BODY_BYTE * data.len();
            if uncharged >= CHARGE_BATCH {
                charges.push(budget.try_charge(uncharged).map_err(busy)?);
                uncharged = 0;
            }
        }
    }
    if uncharged > 0 {
        charges.push(budget.try_charge(uncharged).map_err(busy)?);
    }
    Ok(all.freeze())
}

async fn respond(
    req: Request<Incoming>,
    service: &RigService,
    budget: &Budget,
    charges: &mut Vec<Charge>,
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
    let body = read_body(req.into_body(), budget, charges).await?;
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

/// The client side: the parts of a request that are the same on every call of a connection,
/// made once when it opens. HTTP/1.1 sends origin-form with a Host header; HTTP/2 needs the
/// scheme and authority in the URI (they become pseudo-headers).
pub struct Requests {
    /// One URI per operation, in [`Operation::ALL`] order.
    uris: [Uri; Operation::ALL.len()],
    /// The Host header (HTTP/1.1 only).
    host: Option<HeaderValue>,
}

/// One URI per operation, in [`Operation::ALL`] order (index it with `op as usize`), made once
/// per connection: what the HTTP flavours and the gRPC client send each call to.
pub(crate) fn operation_uris(
    text: impl Fn(Operation) -> String,
) -> Result<[Uri; Operation::ALL.len()], http::uri::InvalidUri> {
    let [a, b, c, d] = Operation::ALL.map(|op| Uri::try_from(text(op)));
    Ok([a?, b?, c?, d?])
}

impl Requests {
    pub fn new(authority: &str, absolute: bool) -> Result<Requests, CallError> {
        let bad = |e: &dyn std::fmt::Display| {
            CallError::new(
                Failure::Connect,
                format!("bad authority {authority:?}: {e}"),
            )
        };
        let uris = operation_uris(|op| {
            let path = format!("{PREFIX}{}", op.name());
            if absolute {
                format!("http://{authority}{path}")
            } else {
                path
            }
        })
        .map_err(|e| bad(&e))?;
        Ok(Requests {
            uris,
            host: if absolute {
                None
            } else {
                Some(HeaderValue::try_from(authority).map_err(|e| bad(&e))?)
            },
        })
    }

    /// The request for `call`, and its body (kept to check an echo's reply against).
    pub fn request(&self, call: &Call) -> (Request<Bytes>, Bytes) {
        let op = call.operation();
        // `ALL` lists the operations in declaration order.
        let uri = self.uris[op as usize].clone();
        let body = Bytes::from(call.encode_json());
        let mut request = Request::new(body.clone());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri;
        let headers = request.headers_mut();
        headers.insert(header::CONTENT_TYPE, APPLICATION_JSON);
        if let Some(host) = &self.host {
            headers.insert(header::HOST, host.clone());
        }
        (request, body)
    }
}

const APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");

/// Reads a reply: its body if the status is `200`, else the failure it says.
async fn reply_body<B>(resp: Response<B>) -> Result<Bytes, CallError>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_MESSAGE)
        .collect()
        .await
        .map_err(|e| CallError::classify(&*e))?
        .to_bytes();
    if status == StatusCode::BAD_REQUEST {
        return Err(CallError::new(
            Failure::Other,
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
    Ok(body)
}

/// Reads and decodes the reply to an `op` call.
pub async fn reply<B>(op: Operation, resp: Response<B>) -> Result<Reply, CallError>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let body = reply_body(resp).await?;
    Ok(Reply::decode_json(op, &body)?)
}

/// Reads the reply to `call`, whose request body was `sent`, and [`check`]s it. An echo whose
/// reply is the very bytes sent passes without decoding: decoding is a function of the bytes,
/// so they decode to the message sent. Any other reply is decoded and checked.
pub async fn checked_reply<B>(call: &Call, sent: &Bytes, resp: Response<B>) -> Result<(), CallError>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let op = call.operation();
    let body = reply_body(resp).await?;
    if op.echoes() && body == *sent {
        return Ok(());
    }
    check(call, &Reply::decode_json(op, &body)?)
}

/// A reply's body as either HTTP version's client reads it. An h2 stream's bytes are given
/// back to flow control as they are taken, so the peer may send more.
pub(crate) enum ReplyBody {
    Http1(Incoming),
    Http2(h2::RecvStream),
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let stream = match self.get_mut() {
            ReplyBody::Http1(body) => {
                return Pin::new(body).poll_frame(cx).map_err(|e| e.into());
            }
            ReplyBody::Http2(stream) => stream,
        };
        match stream.poll_data(cx) {
            Poll::Ready(Some(Ok(data))) => {
                // Only fails once the stream is gone, which the next poll reports.
                let _ = stream.flow_control().release_capacity(data.len());
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {}
            Poll::Pending => return Poll::Pending,
        }
        stream.poll_trailers(cx).map(|t| {
            t.map_err(Into::into)
                .transpose()
                .map(|t| t.map(Frame::trailers))
        })
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReplyBody::Http1(body) => body.is_end_stream(),
            ReplyBody::Http2(stream) => stream.is_end_stream(),
        }
    }
}

/// One HTTP client connection of either version: what the JSON flavours' client and the
/// generic HTTP target call through, so neither needs to know which version it speaks.
pub(crate) enum HttpConnection {
    Http1(Http1Connection),
    Http2(Http2Connection),
}

impl HttpConnection {
    /// Opens an h2c (prior knowledge) connection with `http2`, an HTTP/1.1 one otherwise.
    pub(crate) async fn open(
        target: &str,
        wire: &Arc<WireCounters>,
        http2: bool,
    ) -> Result<HttpConnection, CallError> {
        Ok(if http2 {
            HttpConnection::Http2(Http2Connection::open(target, wire).await?)
        } else {
            HttpConnection::Http1(Http1Connection::open(target, wire).await?)
        })
    }

    /// Sends `request` and hands its response to `read` (see each version's `exchange`). The
    /// body is whole bytes: HTTP/2 writes it with the headers, HTTP/1.1 gives hyper it as one
    /// chunk.
    pub(crate) async fn exchange<T, F>(
        &self,
        request: Request<Bytes>,
        read: impl FnOnce(Response<ReplyBody>) -> F,
    ) -> Result<T, CallError>
    where
        F: Future<Output = Result<T, CallError>>,
    {
        match self {
            HttpConnection::Http1(c) => c.exchange(request.map(Full::new), read).await,
            HttpConnection::Http2(c) => c.exchange(request, read).await,
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        match self {
            HttpConnection::Http1(c) => c.is_open(),
            HttpConnection::Http2(c) => c.is_open(),
        }
    }

    /// HTTP/2 carries calls at once, as streams; HTTP/1.1 one at a time.
    pub(crate) fn multiplexed(&self) -> bool {
        matches!(self, HttpConnection::Http2(_))
    }
}

/// The client of both JSON flavours: the rig's calls over one [`HttpConnection`].
pub(super) struct JsonClient {
    connection: HttpConnection,
    requests: Requests,
}

impl JsonClient {
    pub(super) async fn connect(
        target: &str,
        wire: &Arc<WireCounters>,
        http2: bool,
    ) -> Result<Arc<dyn Client>, CallError> {
        let requests = Requests::new(target, http2)?;
        Ok(Arc::new(JsonClient {
            connection: HttpConnection::open(target, wire, http2).await?,
            requests,
        }) as Arc<dyn Client>)
    }
}

impl Client for JsonClient {
    fn call<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, CallError>> {
        let (request, _) = self.requests.request(call);
        Box::pin(
            self.connection
                .exchange(request, |response| reply(call.operation(), response)),
        )
    }

    fn call_checked<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<(), CallError>> {
        let (request, sent) = self.requests.request(call);
        Box::pin(
            self.connection
                .exchange(request, move |response| async move {
                    checked_reply(call, &sent, response).await
                }),
        )
    }

    fn is_open(&self) -> bool {
        self.connection.is_open()
    }

    fn multiplexed(&self) -> bool {
        self.connection.multiplexed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flavour::Failure;
    use crate::workload::{Generator, Workload};

    fn response(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
        Response::builder()
            .status(status)
            .body(Full::new(body.into()))
            .unwrap()
    }

    fn checked(call: &Call, sent: &Bytes, reply: Response<Full<Bytes>>) -> Result<(), CallError> {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(checked_reply(call, sent, reply))
    }

    /// The byte comparison is a shortcut, never a looser check: a reply with other bytes is
    /// decoded and judged as a message.
    #[test]
    fn an_echo_is_checked_by_its_bytes_or_else_by_its_message() {
        let g = Generator::new(Workload::Order, 3);
        let call = g.call(7);
        let requests = Requests::new("127.0.0.1:1", false).unwrap();
        let (request, sent) = requests.request(&call);
        assert_eq!(request.uri(), "/rig/EchoOrder");
        assert_eq!(request.headers()[header::HOST], "127.0.0.1:1");

        // The very bytes sent.
        assert!(checked(&call, &sent, response(StatusCode::OK, sent.clone())).is_ok());
        // The same message written another way (spaces, fields reordered): decoded, equal.
        let value: serde_json::Value = serde_json::from_slice(&sent).unwrap();
        let mut fields: Vec<_> = value.as_object().unwrap().iter().collect();
        fields.reverse();
        let respelled = format!(
            "{{ {} }}",
            fields
                .iter()
                .map(|(k, v)| format!("\"{k}\" : {v}"))
                .collect::<Vec<_>>()
                .join(" , ")
        );
        assert_ne!(respelled.as_bytes(), &sent[..]);
        assert!(checked(&call, &sent, response(StatusCode::OK, respelled)).is_ok());
        // Another call's order: a protocol failure, as is JSON that is not an order.
        let other = Bytes::from(g.call(8).encode_json());
        let e = checked(&call, &sent, response(StatusCode::OK, other)).unwrap_err();
        assert_eq!(e.kind, Failure::Protocol, "{e}");
        let e = checked(&call, &sent, response(StatusCode::OK, "[]")).unwrap_err();
        assert_eq!(e.kind, Failure::Protocol, "{e}");
        // A refusal is the server's word, whatever its body.
        let e = checked(
            &call,
            &sent,
            response(StatusCode::BAD_REQUEST, sent.clone()),
        )
        .unwrap_err();
        assert_eq!(e.kind, Failure::Other, "{e}");
    }

    #[test]
    fn http2_requests_carry_the_authority_in_the_uri() {
        let call = Generator::new(Workload::Deduct, 1).call(0);
        let (request, _) = Requests::new("10.0.0.1:8080", true).unwrap().request(&call);
        assert_eq!(request.uri(), "http://10.0.0.1:8080/rig/Deduct");
        assert!(!request.headers().contains_key(header::HOST));
        let requests = Requests::new("h:1", false).unwrap();
        for w in [
            Workload::Order,
            Workload::Blob(128),
            Workload::Wide,
            Workload::Deduct,
        ] {
            let call = Generator::new(w, 1).call(0);
            let (request, _) = requests.request(&call);
            assert_eq!(
                request.uri().path(),
                format!("/rig/{}", call.operation().name())
            );
        }
        // Once per connection, as an error: never a panic per call.
        assert!(Requests::new("not an authority", true).is_err());
    }
}
