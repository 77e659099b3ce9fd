//! The impairment model: pure and seeded. Time and bytes in, release times out.
//!
//! Nothing here touches a socket or a clock. The proxy tells a [`LinkModel`] "`len` bytes were
//! read at virtual time `now`" and gets back, per virtual segment, the time the bytes may be
//! written to the other side. Tests drive the same code on a virtual clock.
//!
//! Each direction of a connection is a TCP sender ([`tcp`]) on a link ([`Path`]):
//! - bytes are cut into `mss`-sized segments; bytes are never dropped or reordered, and release
//!   times never decrease (a stalled segment holds back everything behind it, as TCP's in-order
//!   delivery does);
//! - the sender sends what its congestion window ([`cc`]: CUBIC or Reno, IW10, slow start)
//!   allows, not before the connection is set up; the link ([`wire`], shared with the packet
//!   engine) serialises segments with their headers at `rate`, drops what overflows
//!   `queue_limit`, and delivers in order `delay + jitter` later, or loses the segment;
//! - a lost segment is found and sent again by Linux's rules: RACK when later segments got
//!   through, a tail loss probe at 2·SRTT, the RTO (from the last ACK, backing off to 120 s),
//!   with SRTT and RTTVAR estimated as the kernel does and timers on the kernel's jiffies;
//! - a new connection costs one RTT, plus `syn_rto` (backing off) per lost SYN or SYN-ACK.
//!
//! ACKs are modelled from the other direction's delay, not from its traffic, so the two
//! directions stay independent: each is a pure function of (profile, seed, read times).

pub mod cc;
pub mod tcp;
pub mod wire;

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use wire::{Wire, SEGMENT_OVERHEAD};

use crate::profile::{
    ConnectParams, JitterDistribution, LinkParams, LossProcess, Profile, SynBackoff,
};

/// Linux `tcp_syn_retries`.
const MAX_SYN_RETRIES: u32 = 6;
/// Linux `tcp_syn_linear_timeouts` (≥ 6.5): with `syn_backoff = "linear"`, the client's first
/// retransmission timers this many times after the first do not back off.
const SYN_LINEAR_TIMEOUTS: u32 = 4;
/// Shape of the Lomax jitter: finite mean and variance, heavy tail.
const PARETO_SHAPE: f64 = 3.0;

/// Which way bytes flow through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client → server.
    Upstream = 0,
    /// Server → client.
    Downstream = 1,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Upstream => "upstream",
            Direction::Downstream => "downstream",
        }
    }
}

/// The emulated path's round trip: the handshake's RTT sample, and what each direction's ACKs
/// take to come back. (The RTO is the sender's own estimate, from its samples.)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PathTiming {
    /// Upstream + downstream delay + mean jitter of both.
    pub rtt: Duration,
}

impl PathTiming {
    pub fn of(profile: &Profile) -> PathTiming {
        let (up, down) = (&profile.upstream, &profile.downstream);
        let mean = jitter_mean(up) + jitter_mean(down);
        PathTiming {
            rtt: up.delay + down.delay + Duration::from_secs_f64(mean),
        }
    }
}

fn jitter_mean(p: &LinkParams) -> f64 {
    match p.jitter_distribution {
        JitterDistribution::Pareto => p.jitter.as_secs_f64(),
        JitterDistribution::Uniform | JitterDistribution::Normal => 0.0,
    }
}

/// One virtual segment's fate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Bytes in this segment (0 for a FIN).
    pub len: usize,
    /// Virtual time at which the segment may be delivered.
    pub release: Duration,
    /// Whether the segment was lost at least once (and so stalled).
    pub lost: bool,
}

/// The link of one direction: what carries the sender's segments.
#[derive(Clone, Debug)]
struct Path {
    params: LinkParams,
    /// From the receiver's ACK back to the sender: the other direction's delay and mean jitter.
    ack_delay: Duration,
    /// This direction's own stream: draws never depend on the other direction's traffic.
    rng: ChaCha8Rng,
    /// Gilbert–Elliott state.
    loss_state: LossState,
    /// The bottleneck and the wire.
    wire: Wire,
}

impl Path {
    fn new(params: &LinkParams, timing: PathTiming, rng: ChaCha8Rng) -> Path {
        Path {
            params: params.clone(),
            ack_delay: ack_delay(params, timing),
            rng,
            loss_state: LossState::default(),
            wire: Wire::default(),
        }
    }

    /// One draw of the loss process for a packet sent at `at` (advancing Gilbert–Elliott's
    /// state).
    fn draw_loss(&mut self, at: Duration) -> bool {
        draw_loss(&self.params.loss, &mut self.loss_state, &mut self.rng, at)
    }
}

/// The reverse path's share of the round trip.
fn ack_delay(params: &LinkParams, timing: PathTiming) -> Duration {
    timing
        .rtt
        .saturating_sub(params.delay + Duration::from_secs_f64(jitter_mean(params)))
}

impl tcp::Network for Path {
    fn carry(&mut self, at: Duration, len: usize, may_lose: bool) -> Option<Duration> {
        // The draws come first and are the same whatever happens to the segment, so a seed
        // loses the same segment ordinals whatever the rate and queue did.
        let delay = jittered(&self.params, self.params.delay, &mut self.rng);
        let lost = self.draw_loss(at) && may_lose;
        let serialised = self
            .wire
            .serialise(&self.params, at, len + SEGMENT_OVERHEAD, may_lose)?;
        (!lost).then(|| self.wire.arrive(serialised.done + delay))
    }

    fn ack_delay(&self) -> Duration {
        self.ack_delay
    }
}

/// The model of one direction of one connection: a TCP sender on a link.
#[derive(Clone, Debug)]
pub struct LinkModel {
    path: Path,
    /// Where the sender's kernel ticks fall: its own, drawn once.
    jiffies: tcp::Jiffies,
    sender: tcp::Sender,
    /// The path's RTT: the sender's first sample, from the handshake.
    rtt: Duration,
    /// No segment departs before this (the connection is still being set up).
    floor: Duration,
    /// Monotonicity: no release before the previous one.
    last_release: Duration,
    /// Reused between calls.
    arrivals: Vec<tcp::Arrival>,
}

impl LinkModel {
    pub fn new(params: &LinkParams, timing: PathTiming, mut rng: ChaCha8Rng) -> LinkModel {
        let jiffies = tcp::Jiffies::new(rng.random::<f64>());
        LinkModel {
            jiffies,
            sender: tcp::Sender::new(
                params.congestion_control,
                params.rto_min,
                jiffies,
                Duration::ZERO,
                Some(timing.rtt),
                0,
            ),
            path: Path::new(params, timing, rng),
            rtt: timing.rtt,
            floor: Duration::ZERO,
            last_release: Duration::ZERO,
            arrivals: Vec::new(),
        }
    }

    /// The connection is set up at `floor`, after the handshake packet this side sends was
    /// retransmitted `retransmissions` times.
    fn set_up(&mut self, floor: Duration, retransmissions: u32) {
        let p = &self.path.params;
        self.sender = tcp::Sender::new(
            p.congestion_control,
            p.rto_min,
            self.jiffies,
            floor,
            Some(self.rtt),
            retransmissions,
        );
        self.floor = floor;
    }

    /// Changes the impairment of a live direction (a toxic added, updated or removed). The
    /// random stream, the Gilbert–Elliott state, the sender's window and estimates and the
    /// release clock carry over, so bytes already scheduled keep their times and nothing
    /// released later can overtake them.
    pub fn retune(&mut self, params: &LinkParams, timing: PathTiming) {
        self.path.params = params.clone();
        self.path.ack_delay = ack_delay(params, timing);
        self.sender.set_rto_min(params.rto_min);
    }

    /// The retransmission timeout the sender would use now.
    pub fn rto(&self) -> Duration {
        self.sender.rto()
    }

    /// The sender's congestion window, segments.
    pub fn cwnd(&self) -> u32 {
        self.sender.cwnd()
    }

    /// `len` bytes read together at `now`. Appends one [`Segment`] per `mss` bytes.
    pub fn send(&mut self, now: Duration, len: usize, out: &mut Vec<Segment>) {
        let mss = self.path.params.mss as usize;
        let lens = (0..len.div_ceil(mss)).map(|i| mss.min(len - i * mss));
        self.hand_over(now, lens, out);
    }

    /// A FIN: it takes a sequence number, so it can be lost and stall like any tail.
    pub(crate) fn send_fin(&mut self, now: Duration) -> Segment {
        let mut out = Vec::with_capacity(1);
        self.hand_over(now, std::iter::once(0), &mut out);
        out[0]
    }

    /// A reset: delivered after the bytes before it, never lost (it ends the connection anyway).
    pub(crate) fn send_reset(&mut self, now: Duration) -> Duration {
        let backlog = self.path.wire.next_free(&self.path.params);
        let arrival = now.max(self.floor).max(backlog) + self.path.params.delay;
        self.last_release = self.last_release.max(arrival);
        self.last_release
    }

    fn hand_over(
        &mut self,
        now: Duration,
        lens: impl Iterator<Item = usize> + Clone,
        out: &mut Vec<Segment>,
    ) {
        let seqs = self.sender.push(now, lens.clone(), &mut self.path);
        self.arrivals.clear();
        self.sender.arrivals(seqs, &self.path, &mut self.arrivals);
        for (len, arrival) in lens.zip(&self.arrivals) {
            self.last_release = self.last_release.max(arrival.at);
            out.push(Segment {
                len,
                release: self.last_release,
                lost: arrival.lost,
            });
        }
    }

    /// Stall of a handshake packet (the client's SYN, or the server's SYN-ACK) sent in this
    /// direction, and how many times it was lost.
    fn handshake_stall(
        &mut self,
        connect: &ConnectParams,
        loss: Option<LossProcess>,
        packet: Handshake,
        start: Duration,
    ) -> (Duration, u32) {
        // A handshake-only loss process (a `syn_loss` toxic) stands in for the link's.
        let link_loss = self.path.params.loss;
        if let Some(loss) = loss {
            self.path.params.loss = loss;
        }
        let mut stall = Duration::ZERO;
        let mut losses = 0;
        // Each SYN (or SYN-ACK) is drawn at the time it is sent: the first at `start`, each
        // retransmission when the timers before it have fired.
        while losses < MAX_SYN_RETRIES && self.path.draw_loss(start + stall) {
            // Linux's tcp_retransmit_timer: in SYN-SENT, the first tcp_syn_linear_timeouts + 1
            // timers keep the initial RTO (1, 1, 1, 1, 1, 2, 4 s); the passive side's SYN-ACK
            // timer always doubles.
            let doublings = match (connect.syn_backoff, packet) {
                (SynBackoff::Linear, Handshake::Syn) => losses.saturating_sub(SYN_LINEAR_TIMEOUTS),
                _ => losses,
            };
            let timeout = connect.syn_rto * (1 << doublings);
            // The SYN timer is a kernel timer too: at a second or more it sits on the wheel's
            // coarser levels and fires up to 8 (then 64) jiffies late.
            stall = self.jiffies.fire(stall, tcp::Jiffies::ceil(timeout));
            losses += 1;
        }
        self.path.params.loss = link_loss;
        (stall, losses)
    }
}

/// Which handshake packet a direction sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Handshake {
    Syn,
    SynAck,
}

/// Loss processes that stand in for the links' own for the handshake's packets only (`syn_loss`
/// toxics), each for the packet that travels its way: the client's SYN upstream, the server's
/// SYN-ACK downstream.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HandshakeLoss {
    pub syn: Option<LossProcess>,
    pub synack: Option<LossProcess>,
}

/// What a new connection's set-up costs before its first byte may leave.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Setup {
    /// The SYN / SYN-ACK round trip is charged. A profile's connections pay it, as over a real
    /// path; Toxiproxy's toxics do not (a Toxiproxy `latency` toxic delays data only), so on the
    /// control API only faultrig's own toxics (`handshake`, `profile`) turn it on.
    pub round_trip: bool,
    /// Where the SYN and SYN-ACK are lost by their own processes instead of their links'.
    pub loss: HandshakeLoss,
}

impl Setup {
    /// A real path's set-up: the round trip, and the links' own loss.
    pub(crate) const HANDSHAKE: Setup = Setup {
        round_trip: true,
        loss: HandshakeLoss {
            syn: None,
            synack: None,
        },
    };
}

/// Both directions of one connection, with the handshake already drawn.
#[derive(Clone, Debug)]
pub struct ConnectionModel {
    pub upstream: LinkModel,
    pub downstream: LinkModel,
    /// From accept until the client's first byte may depart: the round trip (where charged)
    /// plus SYN/SYN-ACK stalls.
    pub setup: Duration,
    /// Lost SYNs (counted as upstream stalls).
    pub syn_losses: u32,
    /// Lost SYN-ACKs (counted as downstream stalls).
    pub synack_losses: u32,
}

impl ConnectionModel {
    /// The model of connection number `ordinal` of proxy `proxy` in a run seeded with `seed`.
    pub fn new(profile: &Profile, seed: u64, proxy: &str, ordinal: u64) -> ConnectionModel {
        ConnectionModel::with_setup(profile, Setup::HANDSHAKE, seed, proxy, ordinal)
    }

    /// Like [`ConnectionModel::new`], with the set-up `setup` says.
    pub(crate) fn with_setup(
        profile: &Profile,
        setup: Setup,
        seed: u64,
        proxy: &str,
        ordinal: u64,
    ) -> ConnectionModel {
        let mut model = ConnectionModel::established(profile, seed, proxy, ordinal);
        let ConnectionModel {
            upstream,
            downstream,
            ..
        } = &mut model;
        let (syn_stall, syn_losses) = upstream.handshake_stall(
            &profile.connect,
            setup.loss.syn,
            Handshake::Syn,
            Duration::ZERO,
        );
        // What the round trip's legs cost, where charged.
        let leg = |d: Duration| if setup.round_trip { d } else { Duration::ZERO };
        // The server answers the SYN that got through.
        let (synack_stall, synack_losses) = downstream.handshake_stall(
            &profile.connect,
            setup.loss.synack,
            Handshake::SynAck,
            syn_stall + leg(profile.upstream.delay),
        );
        let at = leg(PathTiming::of(profile).rtt) + syn_stall + synack_stall;
        // The client sends once the SYN-ACK arrived; the server can send once the client's final
        // ACK reached it, one upstream delay later.
        upstream.set_up(at, syn_losses);
        downstream.set_up(at + leg(profile.upstream.delay), synack_losses);
        model.setup = at;
        model.syn_losses = syn_losses;
        model.synack_losses = synack_losses;
        model
    }

    /// A connection already set up (one handed over to the model mid-life): no handshake is
    /// drawn or charged, and its bytes may leave at once.
    pub fn established(profile: &Profile, seed: u64, proxy: &str, ordinal: u64) -> ConnectionModel {
        let timing = PathTiming::of(profile);
        ConnectionModel {
            upstream: LinkModel::new(
                &profile.upstream,
                timing,
                stream_rng(seed, proxy, ordinal, Direction::Upstream),
            ),
            downstream: LinkModel::new(
                &profile.downstream,
                timing,
                stream_rng(seed, proxy, ordinal, Direction::Downstream),
            ),
            setup: Duration::ZERO,
            syn_losses: 0,
            synack_losses: 0,
        }
    }
}

/// `t` moved by one jitter draw of `params` (never before zero). Shared with the packet engine,
/// so a profile's jitter means the same thing on both.
pub(crate) fn jittered(params: &LinkParams, t: Duration, rng: &mut ChaCha8Rng) -> Duration {
    let j = params.jitter.as_secs_f64();
    if j == 0.0 {
        return t;
    }
    let offset = match params.jitter_distribution {
        JitterDistribution::Uniform => rng.random_range(-j..=j),
        JitterDistribution::Normal => {
            let z: f64 = StandardNormal.sample(rng);
            z * j
        }
        JitterDistribution::Pareto => {
            // Lomax: scale·(U^(-1/shape) − 1) with scale chosen for mean j.
            let u: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
            j * (PARETO_SHAPE - 1.0) * (u.powf(-1.0 / PARETO_SHAPE) - 1.0)
        }
    };
    if offset >= 0.0 {
        t + Duration::from_secs_f64(offset)
    } else {
        t.saturating_sub(Duration::from_secs_f64(-offset))
    }
}

/// Gilbert–Elliott's state of one direction. Stepped per packet it starts good, as netem's
/// does; stepped in time it starts from the chain's stationary distribution at the first
/// packet, since a connection (or a link) arrives at a random moment of a path that was there
/// before it: starting good would spare every new connection's first packets.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LossState {
    bad: bool,
    /// With a time step: whether the first packet has drawn the state.
    started: bool,
    /// With a time step: the time the state was last advanced to (a whole number of steps).
    at: Duration,
}

/// One draw of a loss process for a packet sent at `now`, advancing Gilbert–Elliott's state.
/// Shared with the packet engine, so a profile's loss means the same on both.
///
/// Per packet (netem's gemodel), the packet meets the current state, which then takes one step.
/// With a time `step`, the state first takes the steps that elapsed since the last packet, in
/// one draw from the n-step transition of the two-state chain: with λ = 1 − p − r and
/// π = p / (p + r) the stationary share of bad steps, P(bad after n | bad) = π + (1 − π)·λⁿ and
/// P(bad after n | good) = π·(1 − λⁿ). Packets within one step share its state.
pub(crate) fn draw_loss(
    loss: &LossProcess,
    state: &mut LossState,
    rng: &mut ChaCha8Rng,
    now: Duration,
) -> bool {
    match *loss {
        LossProcess::None => false,
        LossProcess::Bernoulli { p } => rng.random::<f64>() < p,
        LossProcess::GilbertElliott {
            p,
            r,
            h,
            k,
            step: None,
        } => {
            let delivered = if state.bad { h } else { k };
            let lost = rng.random::<f64>() >= delivered;
            let flip = rng.random::<f64>();
            state.bad = if state.bad { flip >= r } else { flip < p };
            lost
        }
        LossProcess::GilbertElliott {
            p,
            r,
            h,
            k,
            step: Some(step),
        } => {
            // Same number of draws for every packet, whatever the elapsed time.
            let flip = rng.random::<f64>();
            if !state.started {
                state.started = true;
                state.bad = p + r > 0.0 && flip < p / (p + r);
                state.at = now;
            }
            let elapsed = now.saturating_sub(state.at).as_nanos();
            let step_ns = step.as_nanos().max(1);
            let steps = elapsed / step_ns;
            if steps > 0 && p + r > 0.0 {
                let decay = (1.0 - p - r).powf(steps as f64);
                let stationary = p / (p + r);
                let bad = if state.bad {
                    stationary + (1.0 - stationary) * decay
                } else {
                    stationary * (1.0 - decay)
                };
                state.bad = flip < bad;
            }
            // Whole steps only, so the remainder counts towards the next one.
            if steps > 0 {
                state.at = now.saturating_sub(Duration::from_nanos((elapsed % step_ns) as u64));
            }
            let delivered = if state.bad { h } else { k };
            rng.random::<f64>() >= delivered
        }
    }
}

/// The RNG stream of one connection direction: keyed by (seed, proxy name), with the stream
/// number chosen by (connection ordinal, direction). ChaCha streams are independent, so two
/// connections never share draws, and the same run seed always gives the same schedule.
pub(crate) fn stream_rng(seed: u64, proxy: &str, ordinal: u64, direction: Direction) -> ChaCha8Rng {
    StreamKey::new(seed, proxy, ordinal, direction).rng()
}

/// What [`stream_rng`] builds its stream from, in 16 bytes: for a stream that may never be
/// drawn from, kept instead of the generator's few hundred bytes of buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamKey {
    key: u64,
    stream: u64,
}

impl StreamKey {
    pub fn new(seed: u64, proxy: &str, ordinal: u64, direction: Direction) -> StreamKey {
        StreamKey {
            key: splitmix64(seed ^ fnv1a(proxy.as_bytes())),
            stream: ordinal.wrapping_mul(2).wrapping_add(direction as u64),
        }
    }

    /// The stream from its first draw.
    pub fn rng(self) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.key);
        rng.set_stream(self.stream);
        rng
    }
}

/// FNV-1a: a stable (release-independent) hash of the proxy name.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// SplitMix64's finaliser: spreads related seeds apart.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn reference() -> Profile {
        Profile::builtin("lossy-10ms-1pct").unwrap()
    }

    fn profile(src: &str) -> Profile {
        Profile::parse(src, "test", "test").unwrap()
    }

    /// Half-width of the 99 % normal-approximation binomial interval.
    fn binomial_99(p: f64, n: usize) -> f64 {
        2.576 * (p * (1.0 - p) / n as f64).sqrt()
    }

    /// Sequential one-segment request/reply calls on one established connection; returns each
    /// call's duration and how many of its two segments were lost.
    fn calls(model: &mut ConnectionModel, n: usize) -> Vec<(Duration, usize)> {
        let mut t = model.setup;
        let mut segs = Vec::new();
        (0..n)
            .map(|_| {
                segs.clear();
                model.upstream.send(t, 200, &mut segs);
                let at_server = segs[0].release;
                model.downstream.send(at_server, 200, &mut segs);
                let done = segs[1].release;
                let lost = segs.iter().filter(|s| s.lost).count();
                let call = done - t;
                t = done;
                (call, lost)
            })
            .collect()
    }

    #[test]
    fn reference_call_stalls_with_the_closed_form_probability_and_length() {
        let mut model = ConnectionModel::new(&reference(), 7, "ref", 0);
        let rto = model.upstream.rto();
        assert_eq!(rto, 220 * MS, "RTO = RTT + rto_min");
        let n = 200_000;
        let results = calls(&mut model, n);
        let stalled = results.iter().filter(|(d, _)| *d > 20 * MS).count();
        let expected = 1.0 - 0.99f64.powi(2);
        let observed = stalled as f64 / n as f64;
        let half = binomial_99(expected, n);
        assert!(
            (observed - expected).abs() <= half,
            "P(stall) {observed:.5} outside {expected:.5} ± {half:.5}"
        );
        // A lone lost segment is probed at min(2·SRTT + rto_min, RTO) = RTO = 220 ms, on the
        // tick after expiry: 220 ms plus up to one jiffy (4 ms), 222 ms on average.
        let single = 240 * MS..=244 * MS;
        let mut single_stalls = Vec::new();
        for (d, lost) in &results {
            match lost {
                0 => assert_eq!(*d, 20 * MS),
                1 => {
                    assert!(single.contains(d) || *d >= 460 * MS, "{d:?}");
                    if single.contains(d) {
                        single_stalls.push(d.as_secs_f64() * 1e3 - 20.0);
                    }
                }
                _ => assert!(*d >= 460 * MS, "{d:?}"),
            }
        }
        // Every single loss whose retransmission was not lost again stalls one RTO.
        assert!(single_stalls.len() as f64 >= 0.97 * stalled as f64);
        let mean = single_stalls.iter().sum::<f64>() / single_stalls.len() as f64;
        assert!((220.0..=224.0).contains(&mean), "mean stall {mean:.2} ms");
        // The reference mean call: 20 ms + P(stall) · 222 ms ≈ 24.4 ms.
        let mean_call = results.iter().map(|(d, _)| d.as_secs_f64()).sum::<f64>() / n as f64;
        assert!(
            (mean_call * 1e3 - 24.4).abs() < 0.3,
            "mean call {mean_call}"
        );
    }

    #[test]
    fn new_connection_adds_one_rtt_and_a_second_per_lost_syn() {
        let p = reference();
        let n = 100_000;
        let mut lost_handshakes = 0;
        // The SYN timers at 1 s and 2 s (250 and 500 jiffies) are on the wheel's second level
        // (8 jiffies = 32 ms granularity), from 4 s on the third (256 ms); the bound allows
        // the third's rounding from 2 s, loose rather than wrong.
        let late = |k: u32| Duration::from_millis(if k >= 2 { 256 } else { 32 }) * k;
        for ordinal in 0..n {
            let mut m = ConnectionModel::new(&p, 11, "conn", ordinal);
            let losses = m.syn_losses + m.synack_losses;
            // Each packet's k losses back off 1 s, 2 s, 4 s, …: 2^k − 1 seconds in all.
            let backoff = |k: u32| Duration::from_secs((1 << k) - 1);
            let least = 20 * MS + backoff(m.syn_losses) + backoff(m.synack_losses);
            let most = least + late(m.syn_losses) + late(m.synack_losses);
            assert!(m.setup >= least && m.setup <= most, "{m:?}");
            if losses > 0 {
                lost_handshakes += 1;
            } else if ordinal < 1000 {
                assert_eq!(m.setup, 20 * MS);
                // A call on the new connection: 20 ms setup + 20 ms call, when nothing is lost.
                let mut segs = Vec::new();
                m.upstream.send(Duration::ZERO, 100, &mut segs);
                m.downstream.send(segs[0].release, 100, &mut segs);
                if !segs.iter().any(|s| s.lost) {
                    assert_eq!(segs[1].release, 40 * MS);
                }
            }
        }
        let expected = 1.0 - 0.99f64.powi(2);
        let observed = lost_handshakes as f64 / n as f64;
        assert!((observed - expected).abs() <= binomial_99(expected, n as usize));
    }

    #[test]
    fn linear_syn_backoff_keeps_five_syn_timeouts_and_the_syn_ack_doubles() {
        let p =
            profile("[link]\ndelay = \"10ms\"\nloss = 1.0\n[connect]\nsyn_backoff = \"linear\"\n");
        let m = ConnectionModel::new(&p, 1, "x", 0);
        assert_eq!(m.syn_losses, MAX_SYN_RETRIES);
        assert_eq!(m.synack_losses, MAX_SYN_RETRIES);
        // SYN: 1 + 1 + 1 + 1 + 1 + 2 s; SYN-ACK: 1 + 2 + 4 + 8 + 16 + 32 s. Timers of 2 s and more
        // sit on the wheel level that rounds up to 64 jiffies (256 ms).
        let least = 20 * MS + Duration::from_secs(7 + 63);
        let most = least + 2 * MAX_SYN_RETRIES * 256 * MS;
        assert!(m.setup > least && m.setup <= most, "{:?}", m.setup);
    }

    /// Every transmission lost: the probe, then RTOs doubling from 220 ms and capped at 120 s,
    /// until the 16th transmission (Linux's tcp_retries2 = 15), which the model delivers.
    #[test]
    fn repeated_loss_backs_off_to_the_cap() {
        let p = profile("[link]\ndelay = \"10ms\"\nloss = 1.0\n");
        let mut m = ConnectionModel::new(&p, 1, "x", 0);
        let mut segs = Vec::new();
        // After the handshake, which lost every SYN too.
        let t0 = m.setup + Duration::from_secs(1);
        m.upstream.send(t0, 10, &mut segs);
        // Probe at 220 ms, then RTOs of 220·2^k for k = 0..=9 and four of 120 s. Timers of
        // 14 s and more sit on the wheel's fourth level: up to 512 jiffies (2 s) late each.
        let least: Duration = 220 * MS
            + (0..10).map(|k| 220 * MS * (1 << k)).sum::<Duration>()
            + 4 * Duration::from_secs(120);
        let took = segs[0].release - t0 - 10 * MS;
        assert!(
            took >= least && took <= least + Duration::from_secs(16),
            "{took:?}, at least {least:?}"
        );
    }

    fn random_traffic(m: &mut LinkModel, seed: u64) -> (Vec<Segment>, usize) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut out = Vec::new();
        let mut t = Duration::ZERO;
        let mut sent = 0;
        for _ in 0..5_000 {
            t += Duration::from_micros(rng.random_range(0..3_000));
            let len = rng.random_range(1..70_000);
            sent += len;
            m.send(t, len, &mut out);
        }
        (out, sent)
    }

    #[test]
    fn release_times_never_decrease_and_bytes_are_conserved() {
        let profiles = [
            "[link]\ndelay = \"5ms\"\njitter = \"4ms\"\njitter_distribution = \"uniform\"\nloss = 0.05\n",
            "[link]\ndelay = \"1ms\"\njitter = \"3ms\"\njitter_distribution = \"normal\"\nrate = \"50Mbit\"\n",
            "[link]\ndelay = \"2ms\"\njitter = \"2ms\"\njitter_distribution = \"pareto\"\n[link.burst]\np = 0.05\nr = 0.2\n",
        ];
        for src in profiles {
            let p = profile(src);
            let mut m = ConnectionModel::new(&p, 5, "mono", 0);
            let (segs, sent) = random_traffic(&mut m.upstream, 9);
            assert!(
                segs.windows(2).all(|w| w[0].release <= w[1].release),
                "{src}"
            );
            assert_eq!(segs.iter().map(|s| s.len).sum::<usize>(), sent, "{src}");
            assert!(segs.iter().all(|s| s.len > 0 && s.len <= 1448));
        }
    }

    #[test]
    fn same_seed_same_schedule_different_seed_different() {
        let p = profile("[link]\ndelay = \"5ms\"\njitter = \"1ms\"\nloss = 0.02\n");
        let run = |seed, ordinal| {
            let mut m = ConnectionModel::new(&p, seed, "seeded", ordinal);
            random_traffic(&mut m.upstream, 1).0
        };
        assert_eq!(run(42, 0), run(42, 0));
        assert_ne!(run(42, 0), run(43, 0));
        assert_ne!(
            run(42, 0),
            run(42, 1),
            "connections draw from distinct streams"
        );
        let a = stream_rng(42, "a", 0, Direction::Upstream).random::<u64>();
        let b = stream_rng(42, "b", 0, Direction::Upstream).random::<u64>();
        let c = stream_rng(42, "a", 0, Direction::Downstream).random::<u64>();
        assert!(a != b && a != c && b != c);
    }

    /// A clean bulk flow is limited by its window alone: IW10 doubling every round trip.
    #[test]
    fn a_clean_bulk_flow_doubles_its_window_every_round_trip() {
        let p = profile("[link]\ndelay = \"10ms\"\n");
        let mut m = ConnectionModel::new(&p, 1, "d", 0);
        let mut segs = Vec::new();
        let start = Duration::from_secs(1);
        // 1000 segments: rounds of 10, 20, 40, 80, 160, 320 carry 630, the 7th the rest.
        m.upstream.send(start, 1000 * 1448, &mut segs);
        let round = |i: usize| (1..=7).find(|&r| i < 10 * ((1 << r) - 1)).unwrap() as u32 - 1;
        for (i, s) in segs.iter().enumerate() {
            assert_eq!(
                s.release,
                start + 10 * MS + 20 * MS * round(i),
                "segment {i}"
            );
        }
    }

    /// Mathis et al.: a long bulk flow at loss p delivers MSS/RTT · √(3/2p) — 7.1 Mbit/s at
    /// 1448 B, 20 ms and 1 % — and CUBIC's Reno-friendly region keeps it there on short paths.
    #[test]
    fn bulk_throughput_under_loss_follows_mathis() {
        for (cc, seed) in [("cubic", 1), ("reno", 2)] {
            let p = profile(&format!(
                "[upstream]\ndelay = \"10ms\"\nloss = 0.01\ncongestion_control = \"{cc}\"\n\
                 [downstream]\ndelay = \"10ms\"\n"
            ));
            let mut m = ConnectionModel::new(&p, seed, "mathis", 0);
            let mut segs = Vec::new();
            let start = Duration::from_secs(1);
            let bytes = 200 << 20;
            // Handed over as a proxy reads: 64 KiB at a time, as fast as it may.
            for _ in 0..bytes / 65536 {
                m.upstream.send(start, 65536, &mut segs);
            }
            let took = (segs.last().unwrap().release - start).as_secs_f64();
            let mbit = bytes as f64 * 8.0 / took / 1e6;
            let mathis = 1448.0 * 8.0 / 0.020 * (1.5f64 / 0.01).sqrt() / 1e6;
            assert!(
                (mbit / mathis - 1.0).abs() < 0.2,
                "{cc}: {mbit:.2} Mbit/s, Mathis {mathis:.2}"
            );
        }
    }

    #[test]
    fn bandwidth_serialises_segments_with_their_headers_at_the_rate() {
        // 1448-byte payloads plus 52 bytes of headers at 12 Mbit/s: exactly 1 ms each, the first
        // one included. The initial window fills the first 10 ms; the first ACK comes back at
        // 11 ms (1 ms on the bottleneck, 5 ms each way), so the link idles for one ms, and from
        // then on slow start keeps it busy.
        let p = profile("[link]\ndelay = \"5ms\"\nrate = \"12Mbit\"\n");
        let mut m = ConnectionModel::new(&p, 1, "bw", 0);
        let mut segs = Vec::new();
        let t0 = Duration::from_secs(1);
        m.upstream.send(t0, 100 * 1448, &mut segs);
        let near = |a: Duration, b: Duration| a.abs_diff(b) < Duration::from_micros(1);
        for (i, s) in segs.iter().enumerate() {
            let expected = t0 + 5 * MS + MS * (i as u32 + 1 + u32::from(i >= 10));
            assert!(
                near(s.release, expected),
                "segment {i}: {:?}",
                s.release - t0
            );
        }
    }

    #[test]
    fn gilbert_elliott_matches_its_stationary_loss_and_burst_length() {
        let p = profile("[link.burst]\np = 0.02\nr = 0.25\n");
        let mut m = ConnectionModel::new(&p, 8, "ge", 0).upstream;
        let n = 400_000;
        let draws: Vec<bool> = (0..n).map(|_| m.path.draw_loss(Duration::ZERO)).collect();
        let lost = draws.iter().filter(|&&l| l).count();
        let expected = p.upstream.loss.mean_loss();
        assert!((expected - 0.02 / 0.27).abs() < 1e-12);
        let observed = lost as f64 / n as f64;
        // Bursts correlate draws; allow a generous band around the stationary rate.
        assert!(
            (observed - expected).abs() < 0.1 * expected,
            "{observed} vs {expected}"
        );
        let bursts = draws.windows(2).filter(|w| !w[0] && w[1]).count();
        let mean_burst = lost as f64 / bursts as f64;
        assert!(
            (mean_burst - 4.0).abs() < 0.4,
            "mean burst {mean_burst}, expected 1/r = 4"
        );
    }

    #[test]
    fn gilbert_elliott_with_a_time_step_forgets_its_burst_over_time() {
        // p = 0.01, r = 0.3, a 1 ms step, everything lost in the bad state. Packets 1 ms apart
        // see the per-step chain: mean loss π = 0.01 / 0.31 and bursts of 1/r packets. Packets
        // 200 ms apart are nearly independent: after a loss, the next is lost with probability
        // π + (1 − π)·0.69^200 ≈ π. Packets sent together share one state.
        let p = profile("[link.burst]\np = 0.01\nr = 0.3\nstep = \"1ms\"\n");
        let loss = p.upstream.loss;
        let stationary = 0.01 / 0.31;
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let n = 400_000u32;
        let mut state = LossState::default();
        let close: Vec<bool> = (0..n)
            .map(|i| draw_loss(&loss, &mut state, &mut rng, MS * i))
            .collect();
        let lost = close.iter().filter(|&&l| l).count() as f64;
        assert!(
            (lost / f64::from(n) - stationary).abs() < 0.1 * stationary,
            "{}",
            lost / f64::from(n)
        );
        let bursts = close.windows(2).filter(|w| !w[0] && w[1]).count() as f64;
        assert!(
            (lost / bursts - 1.0 / 0.3).abs() < 0.4,
            "burst {}",
            lost / bursts
        );

        let mut state = LossState::default();
        let far: Vec<bool> = (0..n)
            .map(|i| draw_loss(&loss, &mut state, &mut rng, 200 * MS * i))
            .collect();
        let after_loss = far.windows(2).filter(|w| w[0]).count() as f64;
        let again = far.windows(2).filter(|w| w[0] && w[1]).count() as f64;
        assert!(
            (again / after_loss - stationary).abs() < 0.3 * stationary,
            "P(lost | lost before) = {}",
            again / after_loss
        );

        // A fresh state meets the path at its stationary distribution.
        let fresh = (0..n / 10)
            .filter(|_| draw_loss(&loss, &mut LossState::default(), &mut rng, MS))
            .count() as f64;
        assert!(
            (fresh / f64::from(n / 10) - stationary).abs() < 0.15 * stationary,
            "first packets lost: {}",
            fresh / f64::from(n / 10)
        );

        let mut state = LossState::default();
        for burst in 0..2000u32 {
            let t = 50 * MS * burst + Duration::from_micros(100);
            let first = draw_loss(&loss, &mut state, &mut rng, t);
            for _ in 0..5 {
                assert_eq!(draw_loss(&loss, &mut state, &mut rng, t), first);
            }
        }
    }

    #[test]
    fn jitter_distributions_have_their_documented_means() {
        for (dist, expected_mean_ms) in [("uniform", 0.0), ("normal", 0.0), ("pareto", 2.0)] {
            let p = profile(&format!(
                "[link]\ndelay = \"20ms\"\njitter = \"2ms\"\njitter_distribution = \"{dist}\"\n"
            ));
            let mut m = ConnectionModel::new(&p, 2, "j", 0).upstream;
            let n = 50_000;
            let mut segs = Vec::new();
            let mut total = 0.0;
            for i in 0..n {
                // Far apart, so monotonicity never binds.
                let t = Duration::from_secs(1 + i);
                segs.clear();
                m.send(t, 100, &mut segs);
                total += (segs[0].release - t).as_secs_f64() * 1e3 - 20.0;
            }
            let mean = total / n as f64;
            assert!(
                (mean - expected_mean_ms).abs() < 0.1,
                "{dist}: mean jitter {mean} ms"
            );
        }
        // Pareto's mean counts in the emulated RTT.
        let p = profile(
            "[link]\ndelay = \"20ms\"\njitter = \"2ms\"\njitter_distribution = \"pareto\"\n",
        );
        assert_eq!(PathTiming::of(&p).rtt, 44 * MS);
    }

    #[test]
    fn fin_and_reset_come_after_the_data() {
        let p = reference();
        let mut m = ConnectionModel::new(&p, 4, "fin", 0);
        let mut segs = Vec::new();
        m.upstream.send(Duration::from_secs(1), 5000, &mut segs);
        let last = segs.last().unwrap().release;
        assert!(m.upstream.send_fin(Duration::from_secs(1)).release >= last);
        assert!(m.upstream.send_reset(Duration::from_secs(1)) >= last);
    }
}
