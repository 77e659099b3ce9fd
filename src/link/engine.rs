//! The packet path: two TUN devices, and the engine moving every IP packet between them with a
//! profile's impairment.
//!
//! Each direction is two tasks: a reader that takes packets off one device as soon as the
//! kernel has them, stamps them and decides their fate ([`PacketImpairment`]), and a releaser
//! that hands each surviving packet to the other device at its time, on the precise timer
//! (tokio's timer would round a 100 µs LAN delay up to a millisecond). The devices live as long
//! as the tasks; dropping the [`Link`] ends both, and the kernel removes the devices.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tun_rs::{AsyncDevice, DeviceBuilder, SyncDevice};

use super::impair::{corrupt_bit, DropCause, Fate, PacketImpairment, Streams};
use super::netns::Namespace;
use crate::fault::{stream_rng, Direction};
use crate::profile::Profile;
use crate::timer::sleep_until;

/// Ethernet's MTU: the kernel's TCP then uses the 1448-byte segments the model assumes.
pub(crate) const MTU: u16 = 1500;
/// Largest packet read from a device (a TUN device without offloads hands over one IP packet,
/// at most the MTU; the margin costs nothing).
const READ_BUF: usize = 65_536;
/// The devices' transmit ring, in packets: room for a burst while the reader is scheduled.
const TX_QUEUE_LEN: u32 = 4096;

/// Counters of one direction of a link; read while it runs.
#[derive(Debug)]
pub struct DirectionCounters {
    /// Packets and bytes that entered the link.
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    /// Packets handed to the other end (duplicates included).
    pub delivered: AtomicU64,
    pub dropped_loss: AtomicU64,
    pub dropped_queue: AtomicU64,
    pub duplicated: AtomicU64,
    pub corrupted: AtomicU64,
    pub reordered: AtomicU64,
    /// The other end refused a packet (counted, never fatal).
    pub write_errors: AtomicU64,
    /// Sum of the time packets waited for the bottleneck, in nanoseconds.
    pub queue_delay_ns: AtomicU64,
    /// How late each packet was handed over, in nanoseconds past its time.
    lateness: Mutex<Histogram<u64>>,
}

impl Default for DirectionCounters {
    fn default() -> Self {
        DirectionCounters {
            packets: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            dropped_loss: AtomicU64::new(0),
            dropped_queue: AtomicU64::new(0),
            duplicated: AtomicU64::new(0),
            corrupted: AtomicU64::new(0),
            reordered: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            queue_delay_ns: AtomicU64::new(0),
            lateness: Mutex::new(Histogram::new(3).expect("3 significant figures is valid")),
        }
    }
}

impl DirectionCounters {
    /// A copy of the release-lateness histogram (ns).
    pub fn lateness(&self) -> Histogram<u64> {
        self.lateness.lock().expect("never poisoned").clone()
    }

    /// Packets dropped by either cause.
    pub fn dropped(&self) -> u64 {
        self.dropped_loss.load(Ordering::Relaxed) + self.dropped_queue.load(Ordering::Relaxed)
    }
}

/// Both directions: `a_to_b` carries the profile's upstream, `b_to_a` its downstream.
#[derive(Debug, Default)]
pub struct LinkStats {
    pub a_to_b: DirectionCounters,
    pub b_to_a: DirectionCounters,
}

/// Where one end's device is created.
#[derive(Clone, Copy)]
pub enum End<'a> {
    /// faultrig's own namespace (the host, for `faultrig shell`).
    Host,
    Namespace(&'a Namespace),
}

/// The point-to-point addresses of a link's two ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addrs {
    pub a: Ipv4Addr,
    pub b: Ipv4Addr,
}

/// A running link; dropping it stops the engine and removes both devices.
pub struct Link {
    pub addrs: Addrs,
    stats: Arc<LinkStats>,
    /// The profile both directions follow; [`Link::retune`] changes it under running traffic.
    profile: watch::Sender<Arc<Profile>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Link {
    /// Creates a device at each end (`a` gets `addrs.a`, `b` gets `addrs.b`, a /30 between
    /// them) and starts moving packets: a→b with the profile's upstream impairment, b→a with
    /// its downstream. The random streams are keyed by (seed, name, direction).
    pub async fn start(
        a: End<'_>,
        b: End<'_>,
        addrs: Addrs,
        profile: &Profile,
        seed: u64,
        name: &str,
    ) -> io::Result<Link> {
        let dev_a = Arc::new(AsyncDevice::new(create_device(a, addrs.a, addrs.b).await?)?);
        let dev_b = Arc::new(AsyncDevice::new(create_device(b, addrs.b, addrs.a).await?)?);
        let stats = Arc::new(LinkStats::default());
        let base = Instant::now();
        let (retune, _) = watch::channel(Arc::new(profile.clone()));
        let mut tasks = Vec::with_capacity(4);
        for (dir, params, src, dst) in [
            (Direction::Upstream, &profile.upstream, &dev_a, &dev_b),
            (Direction::Downstream, &profile.downstream, &dev_b, &dev_a),
        ] {
            let impairment = PacketImpairment::new(params, streams(seed, name, dir));
            let queue = Arc::new(Queue::default());
            let counters = stats.clone();
            tasks.push(tokio::spawn(read_loop(
                src.clone(),
                queue.clone(),
                Impairment {
                    now: impairment,
                    retune: retune.subscribe(),
                },
                base,
                counters.clone(),
                dir,
            )));
            tasks.push(tokio::spawn(release_loop(
                dst.clone(),
                queue,
                base,
                counters,
                dir,
            )));
        }
        Ok(Link {
            addrs,
            stats,
            profile: retune,
            tasks,
        })
    }

    /// From the next packet on, each direction follows `profile`'s impairment. Its random
    /// streams, loss state and bottleneck backlog carry on, so a change is a change of the
    /// path, not a new path; packets already on their way keep the delivery time they drew.
    pub fn retune(&self, profile: &Profile) {
        self.profile.send_replace(Arc::new(profile.clone()));
    }

    /// The live counters.
    pub fn stats(&self) -> Arc<LinkStats> {
        self.stats.clone()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The three random streams of one direction: (seed, name) picks the key, the direction and
/// purpose pick the stream, so each is independent of the others.
fn streams(seed: u64, name: &str, dir: Direction) -> Streams {
    let stream = |purpose: u64| stream_rng(seed, &format!("link:{name}"), purpose, dir);
    Streams {
        loss: stream(0),
        jitter: stream(1),
        faults: stream(2),
    }
}

/// A TUN device with `addr` (peer `peer`, a /30), MTU 1500, up, in `end`'s namespace.
async fn create_device(end: End<'_>, addr: Ipv4Addr, peer: Ipv4Addr) -> io::Result<SyncDevice> {
    let build = move || -> io::Result<SyncDevice> {
        DeviceBuilder::new()
            .name("frig%d")
            .mtu(MTU)
            .ipv4(addr, 30u8, Some(peer))
            .with(|b| {
                b.tx_queue_len(TX_QUEUE_LEN);
            })
            .build_sync()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot create a TUN device: {e}")))
    };
    let build = move || -> io::Result<SyncDevice> {
        let device = build()?;
        // Before the device is up: IPv6 would send router solicitations and MLD reports of its
        // own, which would take loss draws and shift every seeded drop by a packet.
        let name = device.name()?;
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
        device.enabled(true)?;
        Ok(device)
    };
    match end {
        End::Host => build(),
        End::Namespace(ns) => ns.within_async(build).await,
    }
}

fn counters_of(stats: &LinkStats, dir: Direction) -> &DirectionCounters {
    match dir {
        Direction::Upstream => &stats.a_to_b,
        Direction::Downstream => &stats.b_to_a,
    }
}

/// Packets in flight on one direction, by delivery time.
#[derive(Default)]
struct Queue {
    heap: Mutex<BinaryHeap<Reverse<Entry>>>,
    /// Wakes the releaser when a packet becomes the new head.
    head_changed: Notify,
}

struct Entry {
    at: Duration,
    /// Arrival order: equal times leave in the order they came.
    seq: u64,
    packet: Bytes,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl Queue {
    fn push(&self, entry: Entry) {
        let mut heap = self.heap.lock().expect("never poisoned");
        let new_head = heap.peek().is_none_or(|Reverse(head)| entry < *head);
        heap.push(Reverse(entry));
        drop(heap);
        if new_head {
            self.head_changed.notify_one();
        }
    }

    fn head(&self) -> Option<Duration> {
        let heap = self.heap.lock().expect("never poisoned");
        heap.peek().map(|Reverse(e)| e.at)
    }

    /// Takes every packet due by `now`, in order.
    fn pop_due(&self, now: Duration, out: &mut Vec<Entry>) {
        let mut heap = self.heap.lock().expect("never poisoned");
        while heap.peek().is_some_and(|Reverse(e)| e.at <= now) {
            out.push(heap.pop().expect("peeked").0);
        }
    }
}

/// One direction's impairment, and where a retuned profile comes from.
struct Impairment {
    now: PacketImpairment,
    retune: watch::Receiver<Arc<Profile>>,
}

async fn read_loop(
    src: Arc<AsyncDevice>,
    queue: Arc<Queue>,
    mut impairment: Impairment,
    base: Instant,
    stats: Arc<LinkStats>,
    dir: Direction,
) {
    let counters = counters_of(&stats, dir);
    let mut buf = vec![0u8; READ_BUF];
    let mut seq = 0u64;
    loop {
        let mut n = match src.recv(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(direction = dir.as_str(), "link device read failed: {e}");
                return;
            }
        };
        // Everything the kernel has queued, before sleeping again.
        loop {
            let now = Instant::now() - base;
            // The devices have IPv4 addresses only; what else appears is the kernel's IPv6
            // housekeeping (a router solicitation when a device comes up, sent before IPv6 can
            // be switched off on it). Carrying it would give it a loss draw and shift every
            // seeded drop after it by one packet, so it is not carried.
            let fate = if buf[0] >> 4 == 4 {
                counters.packets.fetch_add(1, Ordering::Relaxed);
                counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
                if impairment.retune.has_changed().unwrap_or(false) {
                    let profile = impairment.retune.borrow_and_update().clone();
                    impairment.now.retune(match dir {
                        Direction::Upstream => &profile.upstream,
                        Direction::Downstream => &profile.downstream,
                    });
                }
                Some(impairment.now.packet(now, n))
            } else {
                None
            };
            match fate {
                None => {}
                Some(Fate::Dropped(DropCause::Loss)) => {
                    counters.dropped_loss.fetch_add(1, Ordering::Relaxed);
                }
                Some(Fate::Dropped(DropCause::Queue)) => {
                    counters.dropped_queue.fetch_add(1, Ordering::Relaxed);
                }
                Some(Fate::Delivered(d)) => {
                    let mut packet = buf[..n].to_vec();
                    if let Some(bit) = d.corrupt.and_then(|draw| corrupt_bit(&packet, draw)) {
                        packet[bit / 8] ^= 1 << (bit % 8);
                        counters.corrupted.fetch_add(1, Ordering::Relaxed);
                    }
                    if d.reordered {
                        counters.reordered.fetch_add(1, Ordering::Relaxed);
                    }
                    counters
                        .queue_delay_ns
                        .fetch_add(d.queued.as_nanos() as u64, Ordering::Relaxed);
                    let packet = Bytes::from(packet);
                    if d.duplicate {
                        counters.duplicated.fetch_add(1, Ordering::Relaxed);
                        seq += 1;
                        queue.push(Entry {
                            at: d.at,
                            seq,
                            packet: packet.clone(),
                        });
                    }
                    seq += 1;
                    queue.push(Entry {
                        at: d.at,
                        seq,
                        packet,
                    });
                }
            }
            n = match src.try_recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!(direction = dir.as_str(), "link device read failed: {e}");
                    return;
                }
            };
        }
    }
}

async fn release_loop(
    dst: Arc<AsyncDevice>,
    queue: Arc<Queue>,
    base: Instant,
    stats: Arc<LinkStats>,
    dir: Direction,
) {
    let counters = counters_of(&stats, dir);
    let mut due = Vec::new();
    loop {
        let Some(at) = queue.head() else {
            queue.head_changed.notified().await;
            continue;
        };
        let deadline = base + at;
        if Instant::now() < deadline {
            tokio::select! {
                _ = sleep_until(deadline) => {}
                // An earlier packet (a reordered one) became the head: start again.
                _ = queue.head_changed.notified() => continue,
            }
        }
        let now = Instant::now();
        queue.pop_due(now - base, &mut due);
        for entry in due.drain(..) {
            let sent = match dst.try_send(&entry.packet) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => dst.send(&entry.packet).await,
                other => other,
            };
            match sent {
                Ok(_) => {
                    counters.delivered.fetch_add(1, Ordering::Relaxed);
                    let late = Instant::now().saturating_duration_since(base + entry.at);
                    counters
                        .lateness
                        .lock()
                        .expect("never poisoned")
                        .saturating_record(late.as_nanos() as u64);
                }
                Err(e) => {
                    counters.write_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(direction = dir.as_str(), "link device write failed: {e}");
                }
            }
        }
    }
}
