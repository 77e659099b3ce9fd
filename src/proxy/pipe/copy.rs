//! The copy path: bytes written as soon as they are read.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::socket::{
    forward_some, reset_and_abort, reset_on_close, shutdown_write, write_all, Forwarded, READ_CHUNK,
};
use super::splice::{Spliced, BULK_FILL};
use super::Ends;
use crate::proxy::DirectionStats;
use crate::toxic::Toxic;

/// Unimpaired profiles: copy bytes as soon as they are read.
pub async fn copy_both(ends: Ends<'_>) {
    copy_phase(ends, Never).await;
}

/// Where one direction stood when a copy phase handed its connection over.
#[derive(Debug, Default)]
pub struct HandOff {
    /// Its FIN was already passed on: nothing more will come.
    pub finished: bool,
    /// Read but not yet written when the hand-over came (it may have been waiting for its
    /// reader, which may be waiting for the other direction): delivered first.
    pub unsent: Bytes,
}

/// A control-API connection with nothing to apply: copied like an unimpaired one (as fast, and
/// holding no model) until the proxy's first toxic arrives, then handed over to the scheduled
/// pipe at once, each direction with what it had read and not yet written. `None` when the
/// connection ended first (closed, reset, or the proxy shutting down).
pub async fn copy_until_toxics(
    ends: Ends<'_>,
    toxics: &mut watch::Receiver<Arc<Vec<Toxic>>>,
) -> Option<[HandOff; 2]> {
    let handover = HandOver::default();
    let watch = async {
        loop {
            if toxics.changed().await.is_err() {
                // The proxy is gone; its shutdown closes this connection.
                return std::future::pending().await;
            }
            if !toxics.borrow_and_update().is_empty() {
                handover.now.store(true, Ordering::Relaxed);
                return std::future::pending::<()>().await;
            }
        }
    };
    let copied = std::pin::pin!(copy_phase(ends, &handover));
    // The watch is polled first on every wake-up: a toxic the API has confirmed is seen before
    // any byte read in the same wake-up is copied past it. Unbiased, a ping sent just after
    // the API's answer could be read and copied first (seen in CI). And the copies are polled
    // right after it, in the same task: the wake-up that brought the toxic is the one that
    // stops them, wherever they wait, with no bell of their own to ring.
    tokio::select! {
        biased;
        () = watch => unreachable!("the watch never returns"),
        ended = copied => ended,
    }
}

/// Tells both copying directions to stop where they are. A flag and no bell: the copies run
/// in the watch's own task and see it on the very poll that set it (see [`copy_until_toxics`]).
/// Atomic only because the task may move between threads.
#[derive(Default)]
struct HandOver {
    now: std::sync::atomic::AtomicBool,
}

/// What may stop a copying direction where it stands. The plain copy path is never stopped and
/// carries none of a hand-over's waiting in its state (its connections are the smallest).
trait Interrupt: Copy {
    /// `work` to its end, unless stopped first: then `None`. Given pinned in place, not by
    /// value: a future passed in would be held twice in the state (once as the argument, once
    /// where it is awaited), and these states are every connection's.
    fn unless<F: Future>(self, work: Pin<&mut F>) -> impl Future<Output = Option<F::Output>>;
}

/// The plain copy path's: nothing stops it.
#[derive(Clone, Copy)]
struct Never;

impl Interrupt for Never {
    async fn unless<F: Future>(self, work: Pin<&mut F>) -> Option<F::Output> {
        Some(work.await)
    }
}

impl Interrupt for &HandOver {
    async fn unless<F: Future>(self, mut work: Pin<&mut F>) -> Option<F::Output> {
        // Looked at before every poll of the work: the task's wake-up that set it polls this
        // too (every join and select on the way polls all its branches).
        std::future::poll_fn(|cx| {
            if self.now.load(Ordering::Relaxed) {
                return Poll::Ready(None);
            }
            work.as_mut().poll(cx).map(Some)
        })
        .await
    }
}

/// How one copied direction ended.
enum Copied {
    /// Its FIN was passed on.
    Finished,
    /// Stopped for a hand-over, with what it had read and not yet written.
    Stopped(Bytes),
    /// It reset the connection.
    Aborted,
}

/// Both directions copied; `Some` when they stopped for `handover` (neither reset).
async fn copy_phase(ends: Ends<'_>, stop: impl Interrupt) -> Option<[HandOff; 2]> {
    let Ends {
        client,
        upstream,
        stats,
        abort,
    } = ends;
    // The copies are made inside the pinned block, not bound first and moved in: a moved
    // future keeps its first slot in the task as well, doubling its size.
    let work = std::pin::pin!(async {
        tokio::join!(
            copy(client, upstream, &stats.upstream, abort, stop),
            copy(upstream, client, &stats.downstream, abort, stop),
        )
    });
    let ended = tokio::select! {
        ended = work => ended,
        _ = abort.cancelled() => return None,
    };
    let stopped = matches!(ended, (Copied::Stopped(_), _) | (_, Copied::Stopped(_)));
    if !stopped || abort.is_cancelled() {
        return None;
    }
    let handoff = |c: Copied| match c {
        Copied::Stopped(unsent) => HandOff {
            finished: false,
            unsent,
        },
        _ => HandOff {
            finished: true,
            unsent: Bytes::new(),
        },
    };
    Some([handoff(ended.0), handoff(ended.1)])
}

async fn copy(
    src: &TcpStream,
    dst: &TcpStream,
    stats: &DirectionStats,
    abort: &CancellationToken,
    stop: impl Interrupt,
) -> Copied {
    // Taken the first time a read fills the whole buffer (see `splice`), kept from then on.
    // Boxed, as is each bulk step below: every idle connection's state would otherwise carry
    // room for bulk it may never see.
    let mut pipe: Option<Box<Spliced>> = None;
    // Cleared when the system refuses a pipe (out of descriptors): reads and writes carry on.
    let mut spliceable = true;
    let mut bulk = false;
    loop {
        if let Some(pipe) = pipe.as_mut().filter(|_| bulk) {
            match Box::pin(spliced(src, dst, pipe, stats, abort, stop)).await {
                Ok(n) => bulk = n >= BULK_FILL,
                Err(ended) => return ended,
            }
            continue;
        }
        // Stopped while waiting for data, nothing is held: every byte read so far went on.
        let Some(step) = stop.unless(std::pin::pin!(forward_some(src, dst))).await else {
            return Copied::Stopped(Bytes::new());
        };
        let (read, mut rest) = match step {
            Ok(Forwarded::Passed(n)) => {
                stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
                (n, Bytes::new())
            }
            Ok(Forwarded::Left { passed, rest }) => {
                stats.bytes.fetch_add(passed as u64, Ordering::Relaxed);
                (passed + rest.len(), rest)
            }
            Ok(Forwarded::End) => {
                shutdown_write(dst);
                return Copied::Finished;
            }
            Ok(Forwarded::WriteFailed) => {
                reset_and_abort(src, abort);
                return Copied::Aborted;
            }
            Err(_) => {
                reset_and_abort(dst, abort);
                return Copied::Aborted;
            }
        };
        if !rest.is_empty() {
            // The destination is full: wait for it, stoppable, with what is left.
            let len = rest.len();
            let wrote = stop.unless(std::pin::pin!(write_all(dst, &mut rest))).await;
            stats
                .bytes
                .fetch_add((len - rest.len()) as u64, Ordering::Relaxed);
            match wrote {
                None => return Copied::Stopped(rest),
                Some(Ok(())) => {}
                Some(Err(_)) => {
                    reset_and_abort(src, abort);
                    return Copied::Aborted;
                }
            }
        }
        if read == READ_CHUNK && spliceable {
            if pipe.is_none() {
                match Spliced::new() {
                    Ok(p) => pipe = Some(Box::new(p)),
                    Err(e) => {
                        tracing::debug!("no pipe for bulk ({e}); reads and writes carry on");
                        spliceable = false;
                    }
                }
            }
            bulk = pipe.is_some();
        }
    }
}

/// One fill of `pipe` from `src` and its drain into `dst`: the bytes moved, or how the
/// direction ended.
async fn spliced(
    src: &TcpStream,
    dst: &TcpStream,
    pipe: &mut Spliced,
    stats: &DirectionStats,
    abort: &CancellationToken,
    stop: impl Interrupt,
) -> Result<usize, Copied> {
    // Stopped while waiting for data, the pipe is empty: every byte read so far went on.
    let n = match stop.unless(std::pin::pin!(pipe.fill(src))).await {
        None => return Err(Copied::Stopped(Bytes::new())),
        Some(Ok(0)) => {
            shutdown_write(dst);
            return Err(Copied::Finished);
        }
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            reset_and_abort(dst, abort);
            return Err(Copied::Aborted);
        }
    };
    let count = |n: usize| {
        stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
    };
    let drained = stop.unless(std::pin::pin!(pipe.drain(dst, count))).await;
    match drained {
        Some(Ok(())) => Ok(n),
        Some(Err(_)) => {
            reset_and_abort(src, abort);
            Err(Copied::Aborted)
        }
        // Stopped with bytes in the pipe: they are handed over with the direction.
        None => match pipe.take() {
            Ok(rest) => Err(Copied::Stopped(rest)),
            Err(e) => {
                // Bytes the connection cannot deliver: it must break, not carry on short.
                tracing::warn!("reading back a pipe failed ({e}); resetting the connection");
                reset_on_close(src);
                reset_and_abort(dst, abort);
                Err(Copied::Aborted)
            }
        },
    }
}
