//! The generic HTTP target: any URL, over HTTP/1.1 or h2c (HTTP/2 with prior knowledge),
//! each reply's status checked.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, HOST};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Deserialize;

use super::{inline_or_file, TargetError, Template};
use crate::bench::{Session, Target};
use crate::flavour::http_json::HttpConnection;
use crate::flavour::{BoxFuture, CallError, Failure, WireCounters, MAX_MESSAGE};

/// An HTTP endpoint to drive: `faultrig bench --flavour http` with these flags, or a TOML table
/// with these keys.
#[derive(Clone, Debug, Default, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct HttpTargetSpec {
    /// Generic HTTP: the URL to call, http://HOST[:PORT]/PATH?QUERY; path and query may hold
    /// placeholders. Connects to HOST:PORT unless --target says otherwise (a proxy).
    #[arg(long, value_name = "URL", conflicts_with = "GrpcTargetSpec")]
    pub url: Option<String>,
    /// Generic HTTP: the request method (default GET, or POST with --body).
    #[arg(long, value_name = "METHOD", requires = "url")]
    pub method: Option<String>,
    /// Generic HTTP: a request header, NAME:VALUE, sent with every call.
    #[arg(long, value_name = "NAME:VALUE", num_args = 1.., requires = "url")]
    pub header: Vec<String>,
    /// Generic HTTP: the request body, or @FILE; a template like --data.
    #[arg(long, value_name = "STRING|@FILE", requires = "url")]
    pub body: Option<String>,
    /// Generic HTTP: HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    #[arg(long, requires = "url")]
    pub http2: bool,
    /// Generic HTTP: the status every reply must have (default 200); any other is a
    /// `protocol` outcome.
    #[arg(long, value_name = "CODE", requires = "url")]
    pub expect_status: Option<u16>,
}

impl HttpTargetSpec {
    /// Checks and prepares everything before any load. Returns the target and the address its
    /// URL names (HOST:PORT), which is where it connects unless told otherwise.
    pub(crate) fn resolve(&self, seed: u64) -> Result<(HttpTarget, String), TargetError> {
        let url = self
            .url
            .as_deref()
            .ok_or_else(|| TargetError::new("--url", "a generic HTTP target needs --url URL"))?;
        let what = format!("--url {url}");
        let rest = match url.split_once("://") {
            Some(("http", rest)) => rest,
            Some(("https", _)) => {
                return Err(TargetError::new(
                    &what,
                    "https:// is not supported: faultrig has no TLS client; call the \
                     service over plain http:// (or h2c with --http2)",
                ))
            }
            _ => return Err(TargetError::new(&what, "use http://HOST[:PORT]/PATH")),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let authority: http::uri::Authority = authority
            .parse()
            .map_err(|e| TargetError::new(&what, format!("bad host: {e}")))?;
        if authority.host().is_empty() || authority.as_str().contains('@') {
            return Err(TargetError::new(&what, "bad host"));
        }
        let path_text = path;
        let path = Template::parse(path).map_err(|e| TargetError::new(&what, e.to_string()))?;
        // Every render must be a valid path and query; the first is checked here.
        http::uri::PathAndQuery::try_from(path.render(seed, 0, 0))
            .map_err(|e| TargetError::new(&what, format!("bad path: {e}")))?;
        let addr = format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(80)
        );

        let body = match &self.body {
            Some(b) => Some(
                Template::parse(&inline_or_file("--body", b)?)
                    .map_err(|e| TargetError::new("--body", e.to_string()))?,
            ),
            None => None,
        };
        let method = match &self.method {
            Some(m) => Method::from_bytes(m.as_bytes())
                .map_err(|_| TargetError::new(format!("--method {m}"), "not an HTTP method"))?,
            None if body.is_some() => Method::POST,
            None => Method::GET,
        };
        let mut headers = Vec::new();
        for h in &self.header {
            let bad = |why: &str| TargetError::new(format!("--header {h}"), why.to_string());
            let (name, value) = h.split_once(':').ok_or_else(|| bad("use NAME:VALUE"))?;
            let name = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| bad("not a valid header name"))?;
            let value =
                HeaderValue::from_str(value.trim()).map_err(|_| bad("not a valid header value"))?;
            headers.push((name, value));
        }
        let expect_status = match self.expect_status {
            None => StatusCode::OK,
            Some(code) => StatusCode::from_u16(code).map_err(|_| {
                TargetError::new(
                    format!("--expect-status {code}"),
                    "not a status code (100-999)",
                )
            })?,
        };
        let payload_bytes = body.as_ref().map_or(0, |b| b.render(seed, 0, 0).len());
        let label = format!("{method} {path_text}");
        Ok((
            HttpTarget(Arc::new(Resolved {
                http2: self.http2,
                method,
                authority: authority.to_string(),
                path,
                headers,
                body,
                expect_status,
                seed,
                label,
                payload_bytes,
            })),
            addr,
        ))
    }
}

/// A resolved HTTP target; cheap to share between connections.
#[derive(Clone)]
pub struct HttpTarget(Arc<Resolved>);

struct Resolved {
    http2: bool,
    method: Method,
    /// HOST[:PORT] of the URL: the Host header (HTTP/1.1) or `:authority` (HTTP/2), also when
    /// the connection goes to a proxy.
    authority: String,
    path: Template,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Option<Template>,
    expect_status: StatusCode,
    seed: u64,
    /// `METHOD /path`: the CSV's workload column.
    label: String,
    payload_bytes: usize,
}

impl Resolved {
    fn request(&self, index: u64, worker: usize) -> Result<Request<Bytes>, CallError> {
        let path = self.path.render(self.seed, index, worker);
        // HTTP/1.1 sends origin-form with a Host header; HTTP/2 needs scheme and authority in
        // the URI (they become pseudo-headers).
        let uri = if self.http2 {
            format!("http://{}{path}", self.authority)
        } else {
            path
        };
        let mut builder = Request::builder().method(self.method.clone()).uri(uri);
        if !self.http2 {
            builder = builder.header(HOST, &self.authority);
        }
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let body = match &self.body {
            Some(b) => Bytes::from(b.render(self.seed, index, worker)),
            None => Bytes::new(),
        };
        builder
            .body(body)
            .map_err(|e| CallError::new(Failure::Other, format!("call {index}: {e}")))
    }
}

impl Target for HttpTarget {
    fn name(&self) -> &str {
        if self.0.http2 {
            "http2"
        } else {
            "http1"
        }
    }

    fn label(&self) -> String {
        self.0.label.clone()
    }

    fn payload_bytes(&self) -> usize {
        self.0.payload_bytes
    }

    fn connect<'a>(
        &'a self,
        addr: &'a str,
        wire: &'a Arc<WireCounters>,
    ) -> BoxFuture<'a, Result<Arc<dyn Session>, CallError>> {
        Box::pin(async move {
            let connection = HttpConnection::open(addr, wire, self.0.http2).await?;
            Ok(Arc::new(HttpSession {
                connection,
                target: self.0.clone(),
            }) as Arc<dyn Session>)
        })
    }
}

struct HttpSession {
    connection: HttpConnection,
    target: Arc<Resolved>,
}

impl Session for HttpSession {
    fn call(&self, index: u64, worker: usize) -> BoxFuture<'_, Result<(), CallError>> {
        Box::pin(async move {
            let request = self.target.request(index, worker)?;
            let expect = self.target.expect_status;
            self.connection
                .exchange(request, |response| check_reply(response, expect))
                .await
        })
    }

    fn is_open(&self) -> bool {
        self.connection.is_open()
    }

    fn multiplexed(&self) -> bool {
        self.connection.multiplexed()
    }
}

/// Reads the whole reply (so the connection is ready for the next exchange) and checks its
/// status.
async fn check_reply<B>(response: Response<B>, expect: StatusCode) -> Result<(), CallError>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_MESSAGE)
        .collect()
        .await
        .map_err(|e| CallError::classify(&*e))?
        .to_bytes();
    if status != expect {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err(CallError::protocol(format!(
            "status {status} (expected {expect}): {text}"
        )));
    }
    Ok(())
}
