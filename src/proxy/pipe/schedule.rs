//! The scheduled path: each direction's reader asks the model when its bytes are due, and its
//! writer delivers them then.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::Join;
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;

use super::copy::HandOff;
use super::live::{supervise, Armed, Ended, LiveDirection};
use super::socket::{
    enable_receive_timestamps, read_stamped, reset_and_abort, reset_on_close, shutdown_write,
    write_all_vectored, READ_CHUNK,
};
use super::Ends;
use crate::fault::{ConnectionModel, Direction as Dir, LinkModel, Segment, StreamKey};
use crate::profile::Profile;
use crate::proxy::DirectionStats;
use crate::timer::sleep_until;
use crate::toxic::{ConnectionFaults, Draws, Toxic};

/// Most slices handed to one vectored write.
const MAX_IOV: usize = 64;
/// Slicer pieces cut from one read; reads under a slicer are shortened to fit (a 1-byte slicer
/// reads at most this many bytes at a time).
pub(super) const MAX_SLICES_PER_READ: usize = 1024;
/// Slicer pieces queued in one direction, each a queue entry of about 50 bytes: with these two,
/// a slicer's queue stays under half a MiB whatever its piece size.
const MAX_QUEUED_SLICES: usize = 8 * MAX_SLICES_PER_READ;

/// Toxics that may change while the connection is open (the control API's proxies).
pub struct Live<'a> {
    /// The proxy's toxic list; every change is resolved again for this connection.
    pub toxics: watch::Receiver<Arc<Vec<Toxic>>>,
    /// The proxy's own impairment, under the toxics (the proxy's, not a copy per connection).
    pub base: &'a Profile,
    /// This connection's toxicity draws.
    pub draws: Draws,
    /// What the toxics amounted to when the connection was accepted.
    pub faults: ConnectionFaults,
    /// Slicer piece sizes, one stream per direction (made on the first slice).
    pub slicer_streams: [StreamKey; 2],
    /// Where each direction stood if a copy phase handed the connection over.
    pub handoff: [HandOff; 2],
}

/// Impaired profiles: each direction is a reader that timestamps reads and asks the model for
/// release times, and a writer that delivers at those times. With `live` toxics, a supervisor
/// resolves every change for this connection and carries out the timed ones (reset_peer,
/// timeout).
pub async fn schedule_both(
    ends: Ends<'_>,
    mut model: Box<ConnectionModel>,
    epoch: Instant,
    window: usize,
    live: Option<Box<Live<'_>>>,
) {
    let stats = ends.stats;
    stats
        .upstream
        .stalls
        .fetch_add(u64::from(model.syn_losses), Ordering::Relaxed);
    stats
        .downstream
        .stalls
        .fetch_add(u64::from(model.synack_losses), Ordering::Relaxed);
    enable_receive_timestamps(ends.client);
    enable_receive_timestamps(ends.upstream);
    let up = HalfPipe::new(Dir::Upstream, window, epoch, &stats.upstream);
    let down = HalfPipe::new(Dir::Downstream, window, epoch, &stats.downstream);
    let (mut sides, mut up_hold, mut down_hold) = (None, None, None);
    // Everything only a live connection needs is created here, each direction's view in one
    // allocation and the supervisor in another: the task itself holds only pointers, so a
    // connection without live toxics pays nothing for them.
    let supervisor = live.map(|live| {
        let Live {
            toxics,
            base,
            draws,
            faults,
            slicer_streams: [up_stream, down_stream],
            handoff: [up_handoff, down_handoff],
        } = *live;
        let faults = Arc::new(faults);
        let armed = Arc::new(Armed::default());
        let (tx, rx) = watch::channel(faults.clone());
        let side = |which: Dir, stream, handoff| LiveDirection {
            which,
            handoff,
            faults: rx.clone(),
            current: faults.clone(),
            slicer_stream: stream,
            slicer_rng: None,
            armed: armed.clone(),
            carried: 0,
            slice_floor: None,
        };
        sides = Some(Box::new([
            side(Dir::Upstream, up_stream, up_handoff),
            side(Dir::Downstream, down_stream, down_handoff),
        ]));
        up_hold = Some(rx.clone());
        down_hold = Some(rx);
        Box::pin(supervise(toxics, base, draws, tx, armed))
    });
    let (up_live, down_live) = match sides.as_deref_mut() {
        Some([up_side, down_side]) => (Some(up_side), Some(down_side)),
        None => (None, None),
    };
    let ConnectionModel {
        upstream: up_model,
        downstream: down_model,
        ..
    } = &mut *model;
    let abort = ends.abort;
    // The pipes are made inside the block, not bound first and moved in: a moved future keeps
    // its first slot in the task as well.
    let work = std::pin::pin!(async {
        tokio::join!(
            reader_then_writer(
                up.read(ends.client, up_model, up_live),
                up.write(ends.upstream, ends.client, abort, up_hold),
            ),
            reader_then_writer(
                down.read(ends.upstream, down_model, down_live),
                down.write(ends.client, ends.upstream, abort, down_hold),
            ),
        )
    });
    let supervise = std::pin::pin!(async {
        match supervisor {
            Some(supervisor) => supervisor.await,
            None => std::future::pending().await,
        }
    });
    // The supervisor is polled before the pipes on every wake-up, so a toxic change the API
    // has confirmed is published before any byte read in the same wake-up is scheduled (the
    // readers take it up in `catch_up`). Unbiased, a read could win the race and go out under
    // the old toxics even though it was sent after the change was acknowledged.
    let mut work = work;
    let ended = tokio::select! {
        biased;
        why = supervise => Some(why),
        _ = abort.cancelled() => None,
        _ = &mut work => None,
    };
    match ended {
        Some(Ended::Reset) => {
            reset_on_close(ends.client);
            reset_on_close(ends.upstream);
            abort.cancel();
        }
        Some(Ended::Close(d)) => {
            // The direction's writer delivers what was due before, then FIN, and ends the
            // connection (its reader drops whatever comes meanwhile).
            match d {
                Dir::Upstream => up.close_after_queued(),
                Dir::Downstream => down.close_after_queued(),
            }
            tokio::select! {
                _ = abort.cancelled() => {}
                _ = work => {}
            }
        }
        None => {}
    }
}

/// What the writer delivers, in order, each not before its time.
pub(super) enum Release {
    Data(Instant, Bytes),
    /// A slicer's piece: data counted against the direction's slice budget.
    Slice(Instant, Bytes),
    Fin(Instant),
    Reset(Instant),
    /// limit_data reached, or Toxiproxy's timeout toxic ended: FIN after the data before it,
    /// then close the whole connection.
    Close(Instant),
}

impl Release {
    fn at(&self) -> Instant {
        match *self {
            Release::Data(at, _)
            | Release::Slice(at, _)
            | Release::Fin(at)
            | Release::Reset(at)
            | Release::Close(at) => at,
        }
    }
}

/// One direction of the scheduled pipe (named apart from [`Dir`], which only says which way):
/// the queue between its reader and writer.
struct HalfPipe<'a> {
    which: Dir,
    /// Releases in non-decreasing time order (the model guarantees it, and slices keep it).
    queue: Mutex<VecDeque<Release>>,
    /// Bytes that may still be read before the writer catches up: the flow-control window.
    window: Semaphore,
    /// Slicer pieces that may still be queued.
    slices: Semaphore,
    /// The connection's time zero: model time is measured from it.
    epoch: Instant,
    stats: &'a DirectionStats,
}

impl<'a> HalfPipe<'a> {
    fn new(which: Dir, window: usize, epoch: Instant, stats: &'a DirectionStats) -> Self {
        HalfPipe {
            which,
            queue: Mutex::new(VecDeque::new()),
            window: Semaphore::new(window.max(READ_CHUNK)),
            slices: Semaphore::new(MAX_QUEUED_SLICES),
            epoch,
            stats,
        }
    }

    /// Queues releases. Nothing is woken: every push comes from the connection's own task (its
    /// reader, or the supervisor polled before the pipes), and [`reader_then_writer`] polls the
    /// writer right after. A wake-up would be the task waking itself, which tokio treats as a
    /// yield and answers by waking a second worker thread to share the queue: two needless
    /// context switches per release (measured, sequential calls through a 0 ms latency toxic:
    /// 4.1 context switches and 3.3 futex calls per call, against 2 and 0 without the toxic).
    fn push(&self, releases: impl IntoIterator<Item = Release>) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(releases);
    }

    /// Queues the end of the connection after everything already queued: a FIN to this
    /// direction's destination, then both sockets closed.
    fn close_after_queued(&self) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let at = queue
            .back()
            .map_or(Instant::now(), |r| r.at().max(Instant::now()));
        queue.push_back(Release::Close(at));
    }

    async fn read(
        &self,
        src: &TcpStream,
        model: &mut LinkModel,
        mut live: Option<&mut LiveDirection>,
    ) {
        if let Some(l) = &mut live {
            // What the copy phase had read and not written goes first, as it was read before
            // any toxic applied; a FIN it passed on ends the writer (repeating the shutdown
            // changes nothing).
            let HandOff { finished, unsent } = std::mem::take(&mut l.handoff);
            if !unsent.is_empty() {
                // Within the fresh window: the copy phase read at most one chunk.
                if let Ok(permit) = self.window.try_acquire_many(unsent.len() as u32) {
                    permit.forget();
                }
                self.push([Release::Data(Instant::now(), unsent)]);
            }
            if finished {
                return self.push([Release::Fin(Instant::now())]);
            }
        }
        let mut segments = Vec::new();
        loop {
            // Reserve room for a full read first: when the window is full we stop reading, and
            // the sender's kernel buffers fill up behind us.
            let Ok(permit) = self.window.acquire_many(READ_CHUNK as u32).await else {
                return;
            };
            permit.forget();
            let most = live
                .as_ref()
                .and_then(|l| l.now().slicer)
                .map_or(READ_CHUNK, |s| {
                    MAX_SLICES_PER_READ
                        .saturating_mul(s.min_piece())
                        .min(READ_CHUNK)
                });
            let read = read_stamped(src, most).await;
            let (read, arrived) = match read {
                Ok(Some((bytes, arrived))) => (Ok(Some(bytes)), arrived),
                other => (other.map(|_| None), Instant::now()),
            };
            let now = arrived.saturating_duration_since(self.epoch);
            if let Some(l) = &mut live {
                l.catch_up(model, arrived);
            }
            let slow_close = live.as_ref().map_or(Duration::ZERO, |l| l.now().slow_close);
            // Toxiproxy's timeout toxic drops what it reads, and closes on the end of stream.
            if live.as_ref().is_some_and(|l| l.now().discard.is_some()) {
                match read {
                    Ok(Some(_)) => {
                        self.window.add_permits(READ_CHUNK);
                        continue;
                    }
                    Ok(None) => {
                        self.window.add_permits(READ_CHUNK);
                        return self.close_after_queued();
                    }
                    // A reset is passed on, as without the toxic.
                    Err(_) => {}
                }
            }
            match read {
                Ok(Some(mut bytes)) => {
                    // limit_data: carry what is left of the limit, then close.
                    let limit_reached = live.as_mut().is_some_and(|l| l.clip(&mut bytes));
                    self.window.add_permits(READ_CHUNK - bytes.len());
                    segments.clear();
                    model.send(now, bytes.len(), &mut segments);
                    let lost = segments.iter().filter(|s| s.lost).count() as u64;
                    if lost > 0 {
                        self.stats.stalls.fetch_add(lost, Ordering::Relaxed);
                    }
                    let mut releases = coalesce(&segments, bytes, self.epoch);
                    if let Some(l) = &mut live {
                        releases = l.slice(releases);
                        let pieces = releases
                            .iter()
                            .filter(|r| matches!(r, Release::Slice(..)))
                            .count();
                        // At most MAX_SLICES_PER_READ, so the writer always frees enough.
                        if pieces > 0 {
                            let Ok(permit) = self.slices.acquire_many(pieces as u32).await else {
                                return;
                            };
                            permit.forget();
                        }
                    }
                    if limit_reached {
                        let at = releases.last().map_or(arrived, Release::at);
                        releases.push(Release::Close(at));
                        return self.push(releases);
                    }
                    self.push(releases);
                }
                Ok(None) => {
                    self.window.add_permits(READ_CHUNK);
                    let fin = model.send_fin(now);
                    if fin.lost {
                        self.stats.stalls.fetch_add(1, Ordering::Relaxed);
                    }
                    return self.push([Release::Fin(self.epoch + fin.release + slow_close)]);
                }
                Err(e) => {
                    tracing::debug!("read failed ({e}); propagating a reset");
                    return self.push([Release::Reset(self.epoch + model.send_reset(now))]);
                }
            }
        }
    }

    async fn write(
        &self,
        dst: &TcpStream,
        src: &TcpStream,
        abort: &CancellationToken,
        mut hold: Option<watch::Receiver<Arc<ConnectionFaults>>>,
    ) {
        let mut batch: VecDeque<Bytes> = VecDeque::new();
        let mut sliced = 0;
        loop {
            let head = self
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .front()
                .map(Release::at);
            let Some(at) = head else {
                // Polled again after the next push (see `push`); then look again.
                until_polled_again().await;
                continue;
            };
            if at > Instant::now() {
                // The precise sleep may spin rather than return Pending, and this writer shares
                // its task with the connection's reader and other direction: without a yield, a
                // paced stream (one release per segment) kept them from running until the whole
                // window was written, so reads came in window-sized bursts.
                tokio::task::yield_now().await;
            }
            sleep_until(at).await;
            if let Some(rx) = &mut hold {
                // A timeout toxic holds the bytes (back-pressure does the rest) until it goes.
                if rx.borrow_and_update().direction(self.which).hold.is_some() {
                    if rx.changed().await.is_err() {
                        hold = None;
                    }
                    continue;
                }
            }
            self.stats
                .record_lateness(Instant::now().saturating_duration_since(at));
            let mut end = None;
            {
                let now = Instant::now();
                let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                while batch.len() < MAX_IOV && queue.front().is_some_and(|r| r.at() <= now) {
                    match queue.pop_front().expect("front exists") {
                        Release::Data(_, bytes) => batch.push_back(bytes),
                        Release::Slice(_, bytes) => {
                            batch.push_back(bytes);
                            sliced += 1;
                        }
                        other => {
                            end = Some(other);
                            break;
                        }
                    }
                }
            }
            let len: usize = batch.iter().map(Bytes::len).sum();
            if write_all_vectored(dst, &mut batch).await.is_err() {
                return reset_and_abort(src, abort);
            }
            self.stats.bytes.fetch_add(len as u64, Ordering::Relaxed);
            self.window.add_permits(len);
            self.slices.add_permits(std::mem::take(&mut sliced));
            match end {
                Some(Release::Fin(_)) => return shutdown_write(dst),
                Some(Release::Reset(_)) => return reset_and_abort(dst, abort),
                Some(Release::Close(_)) => {
                    shutdown_write(dst);
                    abort.cancel();
                    return;
                }
                _ => {}
            }
        }
    }
}

/// One direction's reader and writer, run together with the reader polled first every time:
/// what the reader queued in a poll, the writer sees in the same poll (see [`HalfPipe::push`]).
/// `futures`' `join` polls its futures in argument order on every poll (tokio's `join!` rotates
/// the first, which would leave a release queued until the next wake-up). `Join` is a plain
/// struct; an async fn's state would hold each future twice and double an idle connection's task.
fn reader_then_writer<R, W>(read: R, write: W) -> Join<R, W>
where
    R: Future<Output = ()>,
    W: Future<Output = ()>,
{
    futures_util::future::join(read, write)
}

/// Pending once, without asking to be woken: the caller is polled again when something else
/// wakes its task.
async fn until_polled_again() {
    let mut polled = false;
    std::future::poll_fn(|_| {
        if std::mem::replace(&mut polled, true) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Turns the model's per-segment releases into queue entries, merging neighbours that share a
/// release time (the common case without jitter: one entry per read).
fn coalesce(segments: &[Segment], mut bytes: Bytes, epoch: Instant) -> Vec<Release> {
    let mut out = Vec::with_capacity(1);
    let mut i = 0;
    while i < segments.len() {
        let release = segments[i].release;
        let mut len = 0;
        while i < segments.len() && segments[i].release == release {
            len += segments[i].len;
            i += 1;
        }
        out.push(Release::Data(epoch + release, bytes.split_to(len)));
    }
    out
}
