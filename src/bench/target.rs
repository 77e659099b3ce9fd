//! What the load driver connects to, and how it makes and checks call number `index` of worker
//! `worker`: a [`Target`]. faultrig's own flavours with a workload are one kind
//! ([`RigTarget`]); the generic gRPC and HTTP targets ([`crate::target`]) are the others. The
//! driver, its connection modes and its counting know nothing else.

use std::sync::Arc;

use crate::flavour::{BoxFuture, CallError, Client, Flavour, WireCounters};
use crate::workload::{Generator, Workload};

/// A service to drive: how to open a connection to it, and its names for the CSV.
pub trait Target: Send + Sync {
    /// The CSV's flavour column.
    fn name(&self) -> &str;

    /// The CSV's workload column.
    fn label(&self) -> String;

    /// Bytes of payload one call carries (the CSV's `payload_bytes`).
    fn payload_bytes(&self) -> usize;

    /// Opens one connection (TCP and protocol handshake) to `addr`, counted in `wire`.
    fn connect<'a>(
        &'a self,
        addr: &'a str,
        wire: &'a Arc<WireCounters>,
    ) -> BoxFuture<'a, Result<Arc<dyn Session>, CallError>>;
}

/// One open connection to a [`Target`].
pub trait Session: Send + Sync {
    /// Makes call number `index` (worker `worker`'s) and checks its answer. Never retried.
    fn call(&self, index: u64, worker: usize) -> BoxFuture<'_, Result<(), CallError>>;

    /// False once the connection is known to be closed.
    fn is_open(&self) -> bool;

    /// Whether calls overlap on this connection. When they take turns (HTTP/1.1), a call that
    /// timed out leaves its connection mid-exchange, so it must not be reused.
    fn multiplexed(&self) -> bool;
}

/// One of faultrig's own flavours carrying a workload: the calls of `proto/rig.proto`, each
/// reply checked against its call.
pub struct RigTarget {
    flavour: &'static dyn Flavour,
    workload: Workload,
    /// Shared by every connection: a blob workload's data is made once.
    generator: Arc<Generator>,
}

impl RigTarget {
    pub fn new(flavour: &'static dyn Flavour, workload: Workload, seed: u64) -> RigTarget {
        RigTarget {
            flavour,
            workload,
            generator: Arc::new(Generator::new(workload, seed)),
        }
    }
}

impl Target for RigTarget {
    fn name(&self) -> &str {
        self.flavour.name()
    }

    fn label(&self) -> String {
        self.workload.to_string()
    }

    fn payload_bytes(&self) -> usize {
        self.generator.payload_bytes()
    }

    fn connect<'a>(
        &'a self,
        addr: &'a str,
        wire: &'a Arc<WireCounters>,
    ) -> BoxFuture<'a, Result<Arc<dyn Session>, CallError>> {
        Box::pin(async move {
            let client = self.flavour.connect(addr, wire).await?;
            Ok(Arc::new(RigSession {
                client,
                generator: self.generator.clone(),
            }) as Arc<dyn Session>)
        })
    }
}

struct RigSession {
    client: Arc<dyn Client>,
    generator: Arc<Generator>,
}

impl Session for RigSession {
    fn call(&self, index: u64, _worker: usize) -> BoxFuture<'_, Result<(), CallError>> {
        Box::pin(async move {
            let call = self.generator.call(index);
            self.client.call_checked(&call).await
        })
    }

    fn is_open(&self) -> bool {
        self.client.is_open()
    }

    fn multiplexed(&self) -> bool {
        self.client.multiplexed()
    }
}
