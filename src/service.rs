//! What every flavour's server does with a call, written once: echo the three echo operations,
//! and keep real per-SKU stock for `Deduct`, optionally followed by a backend call (a fixed
//! wait, or a real Redis `DECRBY`) standing in for the database a real handler would update.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::rig::{pb, Call, Reply};

/// Stock each SKU starts with unless told otherwise.
pub(crate) const DEFAULT_STOCK: i64 = 1_000_000_000;

/// Distinct SKUs a server keeps stock for. SKUs appear on first use, so without a cap a peer
/// naming a new SKU per call would grow the map for ever; past it, a new SKU is refused (known
/// ones go on). With [`MAX_SKU_BYTES`], the map stays under about 12 MiB.
pub(crate) const MAX_SKUS: usize = 65_536;

/// Longest SKU accepted, in bytes.
pub(crate) const MAX_SKU_BYTES: usize = 128;

/// What `Deduct` does after updating the stock, as given on the command line or in an
/// experiment (`none`, `sleep:DUR`, `redis://HOST:PORT`).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Backend {
    #[default]
    None,
    /// A fixed wait.
    Sleep(Duration),
    /// A `DECRBY` on the Redis server at this URL.
    Redis(String),
}

impl Backend {
    /// Parses `none`, `sleep:DUR` or `redis://HOST:PORT`.
    pub fn parse(s: &str) -> Result<Backend, String> {
        if s == "none" {
            return Ok(Backend::None);
        }
        if let Some(d) = s.strip_prefix("sleep:") {
            return crate::units::parse_duration(d).map(Backend::Sleep);
        }
        if s.starts_with("redis://") {
            // Checked here so a typo is bad input, not a failure after the server started.
            redis::Client::open(s).map_err(|e| format!("bad Redis URL \"{s}\": {e}"))?;
            return Ok(Backend::Redis(s.to_string()));
        }
        Err(format!(
            "unknown backend \"{s}\" (use none, sleep:DUR such as sleep:2ms, or redis://HOST:PORT)"
        ))
    }

    /// Opens what the backend needs (a Redis connection), so a server whose backend is
    /// unreachable fails at start, naming the address, rather than failing every call.
    pub async fn connect(&self) -> Result<BackendClient, BackendError> {
        Ok(match self {
            Backend::None => BackendClient::None,
            Backend::Sleep(d) => BackendClient::Sleep(*d),
            Backend::Redis(url) => {
                let fail = |source| BackendError {
                    url: url.clone(),
                    source,
                };
                let client = redis::Client::open(url.as_str()).map_err(fail)?;
                let connect = client.get_multiplexed_async_connection();
                let conn = tokio::time::timeout(BACKEND_CONNECT_TIMEOUT, connect)
                    .await
                    .map_err(|_| {
                        fail(redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "no answer within",
                            format!("{BACKEND_CONNECT_TIMEOUT:?}"),
                        )))
                    })?
                    .map_err(fail)?;
                BackendClient::Redis(conn)
            }
        })
    }
}

/// How long a server waits for its Redis backend at start.
const BACKEND_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A backend a server could not reach at start.
#[derive(Debug, thiserror::Error)]
#[error("Redis at {url}: {source}")]
pub struct BackendError {
    pub url: String,
    pub source: redis::RedisError,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::None => write!(f, "none"),
            Backend::Sleep(d) => write!(f, "sleep:{}", crate::units::format_duration(*d)),
            Backend::Redis(url) => write!(f, "{url}"),
        }
    }
}

/// A connected backend, shared by every connection of a server.
#[derive(Clone, Default)]
pub enum BackendClient {
    #[default]
    None,
    Sleep(Duration),
    /// One multiplexed connection: concurrent calls pipeline on it instead of each opening
    /// their own, as a real service's client pool would.
    Redis(redis::aio::MultiplexedConnection),
}

impl std::fmt::Debug for BackendClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendClient::None => write!(f, "None"),
            BackendClient::Sleep(d) => write!(f, "Sleep({d:?})"),
            BackendClient::Redis(_) => write!(f, "Redis"),
        }
    }
}

/// The Redis key a SKU's stock is mirrored under.
pub fn redis_stock_key(sku: &str) -> String {
    format!("faultrig:stock:{sku}")
}

impl BackendClient {
    async fn deducted(&self, sku: &str, quantity: i64) -> Result<(), ServiceError> {
        match self {
            BackendClient::None => Ok(()),
            BackendClient::Sleep(d) => {
                // The precise timer: tokio's rounds up to the next millisecond and adds a
                // wake-up, which made sleep:2ms cost 3.5 ms a call. Yielding: a backend wait
                // must not hold up the server's other calls on this thread.
                crate::timer::sleep_until_yielding(std::time::Instant::now() + *d).await;
                Ok(())
            }
            BackendClient::Redis(conn) => {
                let mut conn = conn.clone();
                redis::cmd("DECRBY")
                    .arg(redis_stock_key(sku))
                    .arg(quantity)
                    .query_async::<i64>(&mut conn)
                    .await
                    .map(drop)
                    .map_err(|e| ServiceError(format!("backend Redis DECRBY failed: {e}")))
            }
        }
    }
}

/// A call the server refuses (bad argument): reported to the client as that flavour's error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ServiceError(pub String);

/// The server-side state shared by every connection of a server.
#[derive(Debug)]
pub struct RigService {
    /// Remaining stock per SKU; SKUs appear on first use with `initial_stock`.
    stock: Mutex<HashMap<String, i64>>,
    initial_stock: i64,
    /// Called after every successful stock update.
    backend: BackendClient,
}

impl Default for RigService {
    fn default() -> Self {
        RigService::new(DEFAULT_STOCK, BackendClient::None)
    }
}

impl RigService {
    pub fn new(initial_stock: i64, backend: BackendClient) -> RigService {
        RigService {
            stock: Mutex::new(HashMap::new()),
            initial_stock,
            backend,
        }
    }

    pub async fn handle(&self, call: Call) -> Result<Reply, ServiceError> {
        Ok(match call {
            Call::EchoOrder(m) => Reply::EchoOrder(m),
            Call::EchoBlob(m) => Reply::EchoBlob(m),
            Call::EchoWide(m) => Reply::EchoWide(m),
            Call::Deduct(req) => {
                let reply = self.deduct(&req)?;
                if reply.ok {
                    self.backend
                        .deducted(&req.sku, i64::from(req.quantity))
                        .await?;
                }
                Reply::Deduct(reply)
            }
        })
    }

    fn deduct(&self, req: &pb::DeductRequest) -> Result<pb::DeductReply, ServiceError> {
        if req.quantity <= 0 {
            return Err(ServiceError(format!(
                "quantity must be positive, got {}",
                req.quantity
            )));
        }
        if req.sku.len() > MAX_SKU_BYTES {
            return Err(ServiceError(format!(
                "SKU of {} bytes is longer than the {MAX_SKU_BYTES} allowed",
                req.sku.len()
            )));
        }
        let mut stock = self.stock.lock().unwrap_or_else(|e| e.into_inner());
        if stock.len() >= MAX_SKUS && !stock.contains_key(&req.sku) {
            return Err(ServiceError(format!(
                "the server keeps stock for {MAX_SKUS} SKUs at most, all taken; \"{}\" is new",
                req.sku
            )));
        }
        let remaining = stock.entry(req.sku.clone()).or_insert(self.initial_stock);
        let quantity = i64::from(req.quantity);
        let ok = *remaining >= quantity;
        if ok {
            *remaining -= quantity;
        }
        Ok(pb::DeductReply {
            remaining: *remaining,
            ok,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deduct(sku: &str, quantity: i32) -> Call {
        Call::Deduct(pb::DeductRequest {
            sku: sku.into(),
            quantity,
        })
    }

    #[tokio::test]
    async fn stock_runs_out_and_stays_consistent_under_concurrency() {
        let service = std::sync::Arc::new(RigService::new(1000, BackendClient::None));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let s = service.clone();
                tokio::spawn(async move {
                    let mut ok = 0;
                    for _ in 0..200 {
                        if let Reply::Deduct(r) = s.handle(deduct("sku-1", 1)).await.unwrap() {
                            ok += i64::from(r.ok);
                        }
                    }
                    ok
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        assert_eq!(total, 1000, "exactly the stock is sold, never more");
        let last = service.handle(deduct("sku-1", 1)).await.unwrap();
        assert_eq!(
            last,
            Reply::Deduct(pb::DeductReply {
                remaining: 0,
                ok: false
            })
        );
        assert!(service.handle(deduct("sku-1", 0)).await.is_err());
    }

    #[tokio::test]
    async fn new_skus_past_the_cap_are_refused_and_known_ones_go_on() {
        let service = RigService::default();
        for i in 0..MAX_SKUS {
            service.handle(deduct(&format!("s{i}"), 1)).await.unwrap();
        }
        let err = service.handle(deduct("one-more", 1)).await.unwrap_err();
        assert!(err.0.contains("65536 SKUs"), "{err}");
        assert_eq!(lock_len(&service), MAX_SKUS, "the refused SKU took no room");
        let known = service.handle(deduct("s7", 1)).await.unwrap();
        assert_eq!(
            known,
            Reply::Deduct(pb::DeductReply {
                remaining: DEFAULT_STOCK - 2,
                ok: true
            })
        );
        let long = "x".repeat(MAX_SKU_BYTES + 1);
        assert!(service.handle(deduct(&long, 1)).await.is_err());
    }

    fn lock_len(service: &RigService) -> usize {
        service.stock.lock().unwrap().len()
    }

    #[test]
    fn backend_parses() {
        assert_eq!(Backend::parse("none"), Ok(Backend::None));
        assert_eq!(
            Backend::parse("sleep:2ms"),
            Ok(Backend::Sleep(Duration::from_millis(2)))
        );
        assert_eq!(
            Backend::parse("redis://127.0.0.1:6380"),
            Ok(Backend::Redis("redis://127.0.0.1:6380".into()))
        );
        assert!(Backend::parse("redis").is_err());
        assert!(Backend::parse("redis://").is_err());
    }
}
