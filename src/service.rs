//! What every flavour's server does with a call, written once: echo the three echo operations,
//! and keep real per-SKU stock for `Deduct`, optionally followed by a downstream call.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::rig::{pb, Call, Reply};

/// Stock each SKU starts with unless told otherwise.
pub const DEFAULT_STOCK: i64 = 1_000_000_000;

/// What `Deduct` does after updating the stock, standing in for the database or service a real
/// handler would call.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Downstream {
    #[default]
    None,
    /// A fixed wait.
    Sleep(Duration),
}

impl Downstream {
    /// Parses `none` or `sleep:DUR`.
    pub fn parse(s: &str) -> Result<Downstream, String> {
        if s == "none" {
            return Ok(Downstream::None);
        }
        if let Some(d) = s.strip_prefix("sleep:") {
            return crate::units::parse_duration(d).map(Downstream::Sleep);
        }
        Err(format!(
            "unknown downstream \"{s}\" (use none or sleep:DUR, e.g. sleep:2ms)"
        ))
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
    downstream: Downstream,
}

impl Default for RigService {
    fn default() -> Self {
        RigService::new(DEFAULT_STOCK, Downstream::None)
    }
}

impl RigService {
    pub fn new(initial_stock: i64, downstream: Downstream) -> RigService {
        RigService {
            stock: Mutex::new(HashMap::new()),
            initial_stock,
            downstream,
        }
    }

    pub async fn handle(&self, call: Call) -> Result<Reply, ServiceError> {
        Ok(match call {
            Call::EchoOrder(m) => Reply::EchoOrder(m),
            Call::EchoBlob(m) => Reply::EchoBlob(m),
            Call::EchoWide(m) => Reply::EchoWide(m),
            Call::Deduct(req) => {
                let reply = self.deduct(&req)?;
                if let Downstream::Sleep(d) = self.downstream {
                    tokio::time::sleep(d).await;
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
        let mut stock = self.stock.lock().unwrap_or_else(|e| e.into_inner());
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
        let service = std::sync::Arc::new(RigService::new(1000, Downstream::None));
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

    #[test]
    fn downstream_parses() {
        assert_eq!(Downstream::parse("none"), Ok(Downstream::None));
        assert_eq!(
            Downstream::parse("sleep:2ms"),
            Ok(Downstream::Sleep(Duration::from_millis(2)))
        );
        assert!(Downstream::parse("redis").is_err());
    }
}
