//! Moving one connection's bytes, both directions at once.
//!
//! Each direction ends in one of three ways, and the proxy mirrors what it saw:
//! - the source sends FIN: after every byte before it is delivered, the destination gets FIN
//!   (half-close; the other direction carries on);
//! - the source resets (or reading fails): after the bytes before it, the destination is reset;
//! - writing to the destination fails: its peer is gone, so the source is reset.
//!
//! A reset aborts the whole connection: the caller drops both sockets, and `SO_LINGER 0` turns
//! that close into an RST.
//!
//! No buffer is held while a direction waits for data, so idle connections cost only their
//! task and sockets.

use std::collections::VecDeque;
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use rand_chacha::ChaCha8Rng;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use super::{DirectionStats, ProxyStats};
use crate::fault::{ConnectionModel, Direction as Dir, LinkModel, Segment, StreamKey};
use crate::profile::Profile;
use crate::timer::sleep_until;
use crate::toxic::{self, ConnectionFaults, DirectionFaults, Draws, Toxic};

/// Largest single read. Big enough that bulk transfers cost few syscalls per megabyte.
const READ_CHUNK: usize = 128 * 1024;
/// Most slices handed to one vectored write.
const MAX_IOV: usize = 64;
/// Slicer pieces cut from one read; reads under a slicer are shortened to fit (a 1-byte slicer
/// reads at most this many bytes at a time).
const MAX_SLICES_PER_READ: usize = 1024;
/// Slicer pieces queued in one direction, each a queue entry of about 50 bytes: with these two,
/// a slicer's queue stays under half a MiB whatever its piece size.
const MAX_QUEUED_SLICES: usize = 8 * MAX_SLICES_PER_READ;

/// The two sockets of a connection and what the pipes report to.
#[derive(Clone, Copy)]
pub struct Ends<'a> {
    pub client: &'a TcpStream,
    pub upstream: &'a TcpStream,
    pub stats: &'a ProxyStats,
    /// Cancelled to end the connection now (a reset, or the proxy shutting down).
    pub abort: &'a CancellationToken,
}

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
                handover.bell.notify_waiters();
                return std::future::pending::<()>().await;
            }
        }
    };
    let copied = std::pin::pin!(copy_phase(ends, &handover));
    // The watch is polled first on every wake-up: a toxic the API has confirmed is seen before
    // any byte read in the same wake-up is copied past it. Unbiased, a ping sent just after
    // the API's answer could be read and copied first (seen in CI).
    tokio::select! {
        biased;
        () = watch => unreachable!("the watch never returns"),
        ended = copied => ended,
    }
}

/// Tells both copying directions to stop where they are.
#[derive(Default)]
struct HandOver {
    now: std::sync::atomic::AtomicBool,
    bell: Notify,
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
    async fn unless<F: Future>(self, work: Pin<&mut F>) -> Option<F::Output> {
        // The wait is registered before the flag is read, so a hand-over called in between
        // still rings it.
        let bell = self.bell.notified();
        if self.now.load(Ordering::Relaxed) {
            return None;
        }
        tokio::select! {
            biased;
            () = bell => None,
            done = work => Some(done),
        }
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
    loop {
        let Some(read) = stop.unless(std::pin::pin!(read_some(src))).await else {
            return Copied::Stopped(Bytes::new());
        };
        match read {
            Ok(Some(mut bytes)) => {
                let len = bytes.len();
                let wrote = stop
                    .unless(std::pin::pin!(write_all(dst, &mut bytes)))
                    .await;
                stats
                    .bytes
                    .fetch_add((len - bytes.len()) as u64, Ordering::Relaxed);
                match wrote {
                    None => return Copied::Stopped(bytes),
                    Some(Ok(())) => {}
                    Some(Err(_)) => {
                        reset_and_abort(src, abort);
                        return Copied::Aborted;
                    }
                }
            }
            Ok(None) => {
                shutdown_write(dst);
                return Copied::Finished;
            }
            Err(_) => {
                reset_and_abort(dst, abort);
                return Copied::Aborted;
            }
        }
    }
}

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
    let up = Direction::new(Dir::Upstream, window, epoch, &stats.upstream);
    let down = Direction::new(Dir::Downstream, window, epoch, &stats.downstream);
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
            up.read(ends.client, up_model, up_live),
            up.write(ends.upstream, ends.client, abort, up_hold),
            down.read(ends.upstream, down_model, down_live),
            down.write(ends.client, ends.upstream, abort, down_hold),
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
    tokio::select! {
        biased;
        () = supervise => {
            // A timed toxic ended the connection: both ends see a reset.
            reset_on_close(ends.client);
            reset_on_close(ends.upstream);
            abort.cancel();
        }
        _ = abort.cancelled() => {}
        _ = work => {}
    }
}

/// Follows a live connection's toxics: resolves each change and publishes it to the readers
/// and writers, and returns when a timed toxic (reset_peer, or timeout with a limit) says the
/// connection must be reset.
async fn supervise(
    mut toxics: watch::Receiver<Arc<Vec<Toxic>>>,
    base: &Profile,
    mut draws: Draws,
    faults: watch::Sender<Arc<ConnectionFaults>>,
    armed: Arc<Armed>,
) {
    // Per direction: when a timeout toxic's hold began, and when reset_peer was armed.
    let mut held_since: [Option<Instant>; 2] = [None; 2];
    let mut armed_at: [Option<Instant>; 2] = [None; 2];
    let now = Instant::now();
    for d in [Dir::Upstream, Dir::Downstream] {
        if faults.borrow().direction(d).hold.is_some() {
            held_since[d as usize] = Some(now);
        }
    }
    loop {
        let current = faults.borrow().clone();
        let mut deadline: Option<Instant> = None;
        for d in [Dir::Upstream, Dir::Downstream] {
            let f = current.direction(d);
            let i = d as usize;
            if let (Some(Some(limit)), Some(since)) = (f.hold, held_since[i]) {
                deadline = Some(deadline.map_or(since + limit, |x| x.min(since + limit)));
            }
            if let (Some(after), Some(at)) = (f.reset_after, armed_at[i]) {
                deadline = Some(deadline.map_or(at + after, |x| x.min(at + after)));
            }
        }
        let expire = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = toxics.changed() => {
                if changed.is_err() {
                    // The proxy is gone; its shutdown closes this connection.
                    return std::future::pending().await;
                }
                let list = toxics.borrow_and_update().clone();
                let next = toxic::resolve(base, &list, &mut draws);
                let now = Instant::now();
                for d in [Dir::Upstream, Dir::Downstream] {
                    let (before, after) = (current.direction(d), next.direction(d));
                    let i = d as usize;
                    match (before.hold.is_some(), after.hold.is_some()) {
                        (false, true) => held_since[i] = Some(now),
                        (_, false) => held_since[i] = None,
                        _ => {}
                    }
                    if after.reset_after.is_none() {
                        armed_at[i] = None;
                    }
                }
                faults.send_replace(Arc::new(next));
            }
            () = armed.rung.notified() => {
                let first = std::mem::take(&mut *armed.first.lock().unwrap_or_else(|e| e.into_inner()));
                for (at, seen) in armed_at.iter_mut().zip(first) {
                    if let Some(seen) = seen {
                        at.get_or_insert(seen);
                    }
                }
            }
            () = expire => return,
        }
    }
}

/// What the writer delivers, in order, each not before its time.
enum Release {
    Data(Instant, Bytes),
    /// A slicer's piece: data counted against the direction's slice budget.
    Slice(Instant, Bytes),
    Fin(Instant),
    Reset(Instant),
    /// limit_data reached: FIN after the data before it, then close the whole connection.
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

/// One scheduled direction: the queue between its reader and writer.
struct Direction<'a> {
    which: Dir,
    /// Releases in non-decreasing time order (the model guarantees it, and slices keep it).
    queue: Mutex<VecDeque<Release>>,
    /// Wakes the writer when the queue was empty and now is not.
    pushed: Notify,
    /// Bytes that may still be read before the writer catches up: the flow-control window.
    window: Semaphore,
    /// Slicer pieces that may still be queued.
    slices: Semaphore,
    /// The connection's time zero: model time is measured from it.
    epoch: Instant,
    stats: &'a DirectionStats,
}

/// When each direction's reset_peer saw its first bytes, for the supervisor: a slot and a bell,
/// where a channel would allocate a block of messages per connection.
#[derive(Default)]
struct Armed {
    /// Per direction, the first arrival under reset_peer not yet taken by the supervisor.
    first: Mutex<[Option<Instant>; 2]>,
    rung: Notify,
}

/// A direction's view of its connection's live toxics.
struct LiveDirection {
    which: Dir,
    /// Where it stood when a copy phase handed it over.
    handoff: HandOff,
    /// What applies now; the reader and the writer each keep a receiver.
    faults: watch::Receiver<Arc<ConnectionFaults>>,
    /// What the reader last took from it (this direction's part is `current.direction(which)`).
    current: Arc<ConnectionFaults>,
    slicer_stream: StreamKey,
    /// Made from `slicer_stream` when a slicer first cuts: most connections never need it.
    slicer_rng: Option<Box<ChaCha8Rng>>,
    /// Tells the supervisor when reset_peer saw its first bytes.
    armed: Arc<Armed>,
    /// Bytes carried so far, for limit_data.
    carried: u64,
    /// The last slice's release: later bytes wait for it, as behind a real slow sender.
    slice_floor: Option<Instant>,
}

impl<'a> Direction<'a> {
    fn new(which: Dir, window: usize, epoch: Instant, stats: &'a DirectionStats) -> Self {
        Direction {
            which,
            queue: Mutex::new(VecDeque::new()),
            pushed: Notify::new(),
            window: Semaphore::new(window.max(READ_CHUNK)),
            slices: Semaphore::new(MAX_QUEUED_SLICES),
            epoch,
            stats,
        }
    }

    fn push(&self, releases: impl IntoIterator<Item = Release>) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(releases);
        self.pushed.notify_one();
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
                self.pushed.notified().await;
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

impl LiveDirection {
    /// This direction's part of the toxics the reader applies now.
    fn now(&self) -> &DirectionFaults {
        self.current.direction(self.which)
    }

    /// Applies toxic changes published since the last read, and arms reset_peer on the first
    /// bytes (or end of stream) seen under it.
    fn catch_up(&mut self, model: &mut LinkModel, arrived: Instant) {
        if self.faults.has_changed().unwrap_or(false) {
            self.current = self.faults.borrow_and_update().clone();
            model.retune(&self.now().link, self.current.timing);
        }
        if self.now().reset_after.is_some() {
            let mut first = self.armed.first.lock().unwrap_or_else(|e| e.into_inner());
            if first[self.which as usize].is_none() {
                first[self.which as usize] = Some(arrived);
                self.armed.rung.notify_one();
            }
        }
    }

    /// Cuts `bytes` to what limit_data still allows; true when the limit is reached.
    fn clip(&mut self, bytes: &mut Bytes) -> bool {
        let Some(limit) = self.now().limit else {
            self.carried += bytes.len() as u64;
            return false;
        };
        let allowed = limit.saturating_sub(self.carried);
        if (bytes.len() as u64) < allowed {
            self.carried += bytes.len() as u64;
            return false;
        }
        bytes.truncate(allowed as usize);
        self.carried = limit;
        true
    }

    /// The slicer toxic: each release cut into pieces `delay` apart.
    fn slice(&mut self, releases: Vec<Release>) -> Vec<Release> {
        let floor = |at: Instant, floor: Option<Instant>| floor.map_or(at, |f| at.max(f));
        let Some(slicer) = self.now().slicer else {
            if self.slice_floor.is_none() {
                return releases;
            }
            return releases
                .into_iter()
                .map(|r| match r {
                    Release::Data(at, b) => Release::Data(floor(at, self.slice_floor), b),
                    other => other,
                })
                .collect();
        };
        let mut out = Vec::new();
        let mut budget = MAX_SLICES_PER_READ;
        for r in releases {
            let Release::Data(at, mut bytes) = r else {
                out.push(r);
                continue;
            };
            let mut t = floor(at, self.slice_floor);
            if budget == 0 {
                // Only when the slicer came on after this read was sized: carried whole.
                out.push(Release::Data(t, bytes));
                continue;
            }
            let stream = self.slicer_stream;
            let rng = self
                .slicer_rng
                .get_or_insert_with(|| Box::new(stream.rng()));
            let pieces = toxic::slice(bytes.len(), &slicer, rng, budget);
            budget -= pieces.len();
            for piece in pieces {
                out.push(Release::Slice(t, bytes.split_to(piece)));
                self.slice_floor = Some(t);
                t += slicer.delay;
            }
        }
        out
    }
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

/// One read (`read` returns the byte count and what else it got) under `src`'s current
/// readiness. A short read, under `asked` bytes, means the socket's queue is empty: the readiness
/// is cleared with it, as tokio's own `poll_read` does, so the next wait parks at once instead of
/// costing a read that only says EAGAIN (half of all reads on a request-response stream). The
/// clearing is tokio's own (an error of kind WouldBlock out of `try_io`), tied to the readiness
/// the read ran under, so data that arrived meanwhile still wakes the next wait.
fn read_clearing<T>(
    src: &TcpStream,
    asked: usize,
    read: impl FnOnce() -> io::Result<(usize, T)>,
) -> io::Result<(usize, T)> {
    let mut short = None;
    let result = src.try_io(Interest::READABLE, || {
        let (n, got) = read()?;
        if n > 0 && n < asked {
            short = Some((n, got));
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok((n, got))
    });
    match short {
        Some(got) => Ok(got),
        None => result,
    }
}

/// Waits for data and reads one chunk: `Ok(None)` at end of stream. The buffer is allocated only
/// once the socket is readable, and small reads are copied out so a queued chunk never pins a
/// mostly empty allocation.
async fn read_some(src: &TcpStream) -> io::Result<Option<Bytes>> {
    loop {
        src.readable().await?;
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        match read_clearing(src, READ_CHUNK, || Ok((src.try_read_buf(&mut buf)?, ()))) {
            Ok((0, ())) => return Ok(None),
            Ok((n, ())) if n < READ_CHUNK / 2 => return Ok(Some(Bytes::copy_from_slice(&buf))),
            Ok(_) => return Ok(Some(buf.freeze())),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Like [`read_some`], but also returns when the bytes reached the socket: the kernel's receive
/// timestamp, so the proxy's own wake-up latency does not add to the emulated delay.
async fn read_stamped(src: &TcpStream, most: usize) -> io::Result<Option<(Bytes, Instant)>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::AsRawFd;
    loop {
        src.readable().await?;
        // recvmsg needs initialised memory; zeroing costs far less than the syscall.
        let mut buf = BytesMut::zeroed(most);
        let result = read_clearing(src, most, || {
            let mut iov = [io::IoSliceMut::new(&mut buf[..])];
            let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec);
            let msg = recvmsg::<()>(
                src.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::empty(),
            )
            .map_err(io::Error::from)?;
            let stamp = msg.cmsgs().ok().and_then(|mut c| {
                c.find_map(|m| match m {
                    ControlMessageOwned::ScmTimestampns(ts) => Some(ts),
                    _ => None,
                })
            });
            Ok((msg.bytes, stamp))
        });
        let (n, stamp) = match result {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(None);
        }
        let arrived = stamp.map_or_else(Instant::now, kernel_stamp_to_instant);
        buf.truncate(n);
        let bytes = if n < READ_CHUNK / 2 {
            Bytes::copy_from_slice(&buf)
        } else {
            buf.freeze()
        };
        return Ok(Some((bytes, arrived)));
    }
}

/// Converts a `SO_TIMESTAMPNS` (wall clock) stamp to an `Instant` through its age. A stamp from
/// the future or older than a second means the wall clock moved: use "now" instead.
fn kernel_stamp_to_instant(stamp: nix::sys::time::TimeSpec) -> Instant {
    let now = Instant::now();
    let stamp = Duration::new(stamp.tv_sec() as u64, stamp.tv_nsec() as u32);
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    match wall.checked_sub(stamp) {
        Some(age) if age < Duration::from_secs(1) => now.checked_sub(age).unwrap_or(now),
        _ => now,
    }
}

/// Asks the kernel to stamp received data, for [`read_stamped`].
pub fn enable_receive_timestamps(sock: &TcpStream) {
    if let Err(e) =
        nix::sys::socket::setsockopt(sock, nix::sys::socket::sockopt::ReceiveTimestampns, &true)
    {
        tracing::debug!("no kernel receive timestamps ({e}); delays start when the proxy reads");
    }
}

/// Writes all of `data`, advancing it as it goes: dropped while waiting, `data` is what is
/// left to write.
async fn write_all(dst: &TcpStream, data: &mut Bytes) -> io::Result<()> {
    while !data.is_empty() {
        match dst.try_write(data) {
            Ok(n) => data.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => dst.writable().await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes and drains every buffer in `bufs`.
async fn write_all_vectored(dst: &TcpStream, bufs: &mut VecDeque<Bytes>) -> io::Result<()> {
    while !bufs.is_empty() {
        let result = {
            let slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
            dst.try_write_vectored(&slices)
        };
        match result {
            Ok(mut n) => {
                while n > 0 {
                    let front = bufs.front_mut().expect("wrote at most what was queued");
                    if n >= front.len() {
                        n -= front.len();
                        bufs.pop_front();
                    } else {
                        front.advance(n);
                        n = 0;
                    }
                }
                while bufs.front().is_some_and(Bytes::is_empty) {
                    bufs.pop_front();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => dst.writable().await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn shutdown_write(dst: &TcpStream) {
    // Fails only if the peer is already gone, which the other direction will notice.
    let _ = socket2::SockRef::from(dst).shutdown(std::net::Shutdown::Write);
}

/// Makes the eventual close of `sock` an RST instead of a FIN.
pub fn reset_on_close(sock: &TcpStream) {
    let _ = socket2::SockRef::from(sock).set_linger(Some(Duration::ZERO));
}

fn reset_and_abort(sock: &TcpStream, abort: &CancellationToken) {
    reset_on_close(sock);
    abort.cancel();
}
