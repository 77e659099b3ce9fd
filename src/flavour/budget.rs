//! Memory a peer controls, bounded: the byte budgets of the servers, and the frame decoder that
//! never reserves more than has arrived.
//!
//! A server holds a call's bytes from the moment its request is read until its reply has been
//! written to the socket. Those bytes are charged to two budgets: the connection's own, which
//! makes a connection that sends faster than it reads wait (its reads pause: back-pressure, as
//! a full socket buffer would), and the process's, shared by every connection of every server
//! in the process, which is never waited for: a call that does not fit is refused with a clean
//! error, so connections that hog memory cannot stall the others, only fail their own calls.

use std::io;
use std::sync::{Arc, LazyLock};

use bytes::{Bytes, BytesMut};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

use super::MAX_MESSAGE;

/// Bytes one connection may hold in calls being answered: three largest messages with room for
/// framing, so a single largest call of any flavour always fits (a framed call holds its request
/// and its echo; a JSON call its body, the call decoded from it, and the reply).
pub(crate) const CONNECTION_BYTES: usize = 3 * (MAX_MESSAGE + (64 << 10));

/// Bytes every connection of the process may hold in all: eight largest calls at once.
pub(crate) const PROCESS_BYTES: usize = 8 * CONNECTION_BYTES;

/// Charged for a reply on top of the request's size. An echo's reply is the size of its
/// request; every other reply (a deduct's, an error message) is shorter than this.
const REPLY_SLACK: usize = 1024;

static PROCESS: LazyLock<Arc<Semaphore>> =
    LazyLock::new(|| Arc::new(Semaphore::new(PROCESS_BYTES)));

/// What one call is charged: its request, and a reply as large again.
pub(crate) fn call_cost(request_bytes: usize) -> usize {
    2 * request_bytes + REPLY_SLACK
}

/// Why a call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("the call needs {0} bytes, more than a connection's whole budget")]
    TooLarge(usize),
    #[error("server busy: the connection's memory budget for calls in flight is spent")]
    ConnectionBudget,
    #[error("server busy: the process's memory budget for calls in flight is spent")]
    ProcessBudget,
}

/// One connection's budget, drawing on the process's.
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    connection: Arc<Semaphore>,
    connection_bytes: usize,
    process: Arc<Semaphore>,
}

/// Bytes held by a call until this is dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    _connection: OwnedSemaphorePermit,
    _process: OwnedSemaphorePermit,
}

impl Default for Budget {
    /// A new connection's budget under the process-wide one.
    fn default() -> Self {
        Budget::new(CONNECTION_BYTES, PROCESS.clone())
    }
}

impl Budget {
    /// A budget of `connection_bytes` drawing on `process` (tests give small ones of their own).
    pub fn new(connection_bytes: usize, process: Arc<Semaphore>) -> Budget {
        Budget {
            connection: Arc::new(Semaphore::new(connection_bytes)),
            connection_bytes,
            process,
        }
    }

    /// Takes `bytes`, waiting for the connection's budget (the caller stops reading meanwhile)
    /// but not for the process's.
    pub async fn charge(&self, bytes: usize) -> Result<Charge, Refused> {
        let n = self.permits(bytes)?;
        let connection = self
            .connection
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("the semaphore is never closed");
        self.with_process(n, connection)
    }

    /// Takes `bytes` now, or refuses: for servers whose calls cannot wait (HTTP/2 streams).
    pub(crate) fn try_charge(&self, bytes: usize) -> Result<Charge, Refused> {
        let n = self.permits(bytes)?;
        let connection = self
            .connection
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| Refused::ConnectionBudget)?;
        self.with_process(n, connection)
    }

    fn permits(&self, bytes: usize) -> Result<u32, Refused> {
        if bytes > self.connection_bytes {
            return Err(Refused::TooLarge(bytes));
        }
        u32::try_from(bytes).map_err(|_| Refused::TooLarge(bytes))
    }

    fn with_process(&self, n: u32, connection: OwnedSemaphorePermit) -> Result<Charge, Refused> {
        let process = self
            .process
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| Refused::ProcessBudget)?;
        Ok(Charge {
            _connection: connection,
            _process: process,
        })
    }

    /// Bytes the connection holds now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.connection_bytes - self.connection.available_permits()
    }
}

/// 4-byte big-endian length-delimited frames (tokio-util's codec), except that a header does
/// not reserve its frame's length: tokio-util's reserves it at once, so four bytes claiming the
/// largest frame cost that much memory before a byte of it arrived. Here the buffer grows only
/// with the bytes that do arrive; a length over `max` is still an error at once.
#[derive(Debug)]
pub(crate) struct Frames {
    inner: LengthDelimitedCodec,
    max: usize,
}

impl Frames {
    pub fn new(max: usize) -> Frames {
        Frames {
            inner: LengthDelimitedCodec::builder()
                .length_field_length(4)
                .max_frame_length(max)
                .new_codec(),
            max,
        }
    }
}

impl Decoder for Frames {
    type Item = BytesMut;
    type Error = io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> io::Result<Option<BytesMut>> {
        if let Some(head) = src.get(..4) {
            let len = u32::from_be_bytes(head.try_into().expect("four bytes")) as usize;
            if len <= self.max && src.len() - 4 < len {
                // The inner codec is only ever handed whole frames (or a bad length), so it
                // never keeps a half-read header of its own.
                return Ok(None);
            }
        }
        self.inner.decode(src)
    }
}

impl Encoder<Bytes> for Frames {
    type Error = io::Error;

    fn encode(&mut self, frame: Bytes, dst: &mut BytesMut) -> io::Result<()> {
        self.inner.encode(frame, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_alone_reserves_nothing_and_frames_still_split() {
        let mut codec = Frames::new(MAX_MESSAGE);
        let mut buf = BytesMut::from(&(MAX_MESSAGE as u32).to_be_bytes()[..]);
        let before = buf.capacity();
        assert_eq!(codec.decode(&mut buf).unwrap(), None);
        assert_eq!(buf.capacity(), before, "no reservation from the header");
        let mut two = BytesMut::new();
        for body in [&b"abc"[..], b"", b"defgh"] {
            two.extend_from_slice(&(body.len() as u32).to_be_bytes());
            two.extend_from_slice(body);
        }
        two.extend_from_slice(&[0, 0]);
        let mut got = Vec::new();
        while let Some(f) = codec.decode(&mut two).unwrap() {
            got.push(f.to_vec());
        }
        assert_eq!(got, [b"abc".to_vec(), vec![], b"defgh".to_vec()]);
        assert_eq!(&two[..], &[0, 0]);
        let mut over = BytesMut::from(&((MAX_MESSAGE + 1) as u32).to_be_bytes()[..]);
        assert!(
            codec.decode(&mut over).is_err(),
            "too long is an error at once"
        );
    }

    #[tokio::test]
    async fn connections_wait_for_their_own_budget_and_are_refused_by_the_process() {
        let process = Arc::new(Semaphore::new(1000));
        let a = Budget::new(600, process.clone());
        let b = Budget::new(600, process.clone());
        assert_eq!(a.charge(601).await.unwrap_err(), Refused::TooLarge(601));
        let held = a.charge(500).await.unwrap();
        assert_eq!(a.held(), 500);
        // a's next call waits for a's own budget...
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), a.charge(200));
        assert!(waiting.await.is_err());
        assert_eq!(a.try_charge(200).unwrap_err(), Refused::ConnectionBudget);
        // ...b is refused once the process's is spent, without waiting.
        let b1 = b.charge(500).await.unwrap();
        assert_eq!(b.charge(1).await.unwrap_err(), Refused::ProcessBudget);
        assert_eq!(b.held(), 500, "a refused call holds nothing");
        drop(held);
        assert_eq!(a.held(), 0);
        let _again = a.charge(200).await.unwrap();
        drop(b1);
        assert_eq!(process.available_permits(), 800);
    }
}
