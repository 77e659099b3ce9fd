//! Connection modes: which connection each call goes out on. The driver owns its connections
//! (no hidden pool, no retry), so the mode is exactly what was asked, and every connection it
//! opens is counted.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Mutex;

use super::{Session, Target};
use crate::flavour::{CallError, WireCounters};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One connection for the cell, shared by every worker.
    Single,
    /// A new connection (and protocol handshake) for every call, closed after it.
    PerCall,
    /// Each worker keeps its own connection.
    PerWorker,
    /// N connections shared by the workers, used in turn.
    Pool(usize),
}

impl Mode {
    pub fn parse(s: &str) -> Result<Mode, String> {
        match s {
            "single" => Ok(Mode::Single),
            "per-call" => Ok(Mode::PerCall),
            "per-worker" => Ok(Mode::PerWorker),
            _ => match s.strip_prefix("pool:").map(str::parse::<usize>) {
                Some(Ok(n)) if (1..=super::MAX_CONCURRENCY).contains(&n) => Ok(Mode::Pool(n)),
                Some(_) => Err(format!(
                    "bad pool size in \"{s}\" (use pool:N with N from 1 to {})",
                    super::MAX_CONCURRENCY
                )),
                None => Err(format!(
                    "unknown mode \"{s}\" (use single, per-call, per-worker or pool:N)"
                )),
            },
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Single => write!(f, "single"),
            Mode::PerCall => write!(f, "per-call"),
            Mode::PerWorker => write!(f, "per-worker"),
            Mode::Pool(n) => write!(f, "pool:{n}"),
        }
    }
}

/// A long-lived connection, opened on first use and re-opened only after it was lost.
type Slot = Mutex<Option<Arc<dyn Session>>>;

/// The connections of one cell.
pub struct Connections {
    load: Arc<dyn Target>,
    target: String,
    mode: Mode,
    /// Kept connections: one (single), one per worker, or N (pool); none for per-call.
    slots: Vec<Slot>,
    /// Pool round-robin position.
    next: AtomicUsize,
    wire: Arc<WireCounters>,
}

/// A connection lent to one call.
pub(crate) struct Lease {
    pub session: Arc<dyn Session>,
    /// The slot it came from (none: per-call, closed when the lease is dropped).
    slot: Option<usize>,
}

impl Connections {
    pub fn new(
        load: Arc<dyn Target>,
        target: &str,
        mode: Mode,
        concurrency: usize,
        wire: Arc<WireCounters>,
    ) -> Connections {
        let slots = match mode {
            Mode::Single => 1,
            Mode::PerCall => 0,
            Mode::PerWorker => concurrency,
            Mode::Pool(n) => n,
        };
        Connections {
            load,
            target: target.to_string(),
            mode,
            slots: (0..slots).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            wire,
        }
    }

    /// The connection for worker `worker`'s next call, opening it if needed. Workers waiting on
    /// the same slot wait for one connect rather than each opening their own.
    pub(crate) async fn lease(&self, worker: usize) -> Result<Lease, CallError> {
        let slot = match self.mode {
            Mode::PerCall => {
                let session = self.load.connect(&self.target, &self.wire).await?;
                return Ok(Lease {
                    session,
                    slot: None,
                });
            }
            Mode::Single => 0,
            Mode::PerWorker => worker,
            Mode::Pool(n) => self.next.fetch_add(1, Ordering::Relaxed) % n,
        };
        let mut kept = self.slots[slot].lock().await;
        if let Some(session) = kept.as_ref().filter(|c| c.is_open()) {
            return Ok(Lease {
                session: session.clone(),
                slot: Some(slot),
            });
        }
        let session = self.load.connect(&self.target, &self.wire).await?;
        *kept = Some(session.clone());
        Ok(Lease {
            session,
            slot: Some(slot),
        })
    }

    /// Drops a kept connection that must not be reused (reset, or a timed-out HTTP/1.1
    /// exchange); the next call on its slot opens a new one.
    pub(crate) async fn discard(&self, lease: &Lease) {
        if let Some(slot) = lease.slot {
            let mut kept = self.slots[slot].lock().await;
            if kept
                .as_ref()
                .is_some_and(|c| Arc::ptr_eq(c, &lease.session))
            {
                *kept = None;
            }
        }
    }

    /// Kept connections currently open.
    pub fn open(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| {
                s.try_lock()
                    .map(|c| c.as_ref().is_some_and(|c| c.is_open()))
                    .unwrap_or(true)
            })
            .count()
    }

    /// Closes every kept connection.
    pub async fn close(&self) {
        for slot in &self.slots {
            slot.lock().await.take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for s in ["single", "per-call", "per-worker", "pool:4"] {
            assert_eq!(Mode::parse(s).unwrap().to_string(), s);
        }
        assert!(Mode::parse("pool:0").is_err());
        assert!(Mode::parse("pool:100000").is_ok());
        assert!(Mode::parse("pool:100001")
            .unwrap_err()
            .contains("1 to 100000"));
        assert!(Mode::parse("pool:x").is_err());
        assert!(Mode::parse("shared").unwrap_err().contains("unknown mode"));
    }
}
