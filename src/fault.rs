//! The impairment model: pure and seeded. Time and bytes in, release times out.
//!
//! Nothing here touches a socket or a clock. The proxy tells a [`LinkModel`] "`len` bytes were
//! read at virtual time `now`" and gets back, per virtual segment, the time the bytes may be
//! written to the other side. Tests drive the same code on a virtual clock.
//!
//! The model (README, "Profiles" and "Engines"):
//! - bytes are cut into `mss`-sized segments; bytes are never dropped or reordered, and release
//!   times never decrease (a stalled segment holds back everything behind it);
//! - a segment departs when it was read, but not before the connection is set up and not before
//!   the previous one finished serialising at `rate`; it arrives `delay + jitter` later;
//! - a "lost" segment arrives late by the time TCP would need to retransmit it: `RTO` when it is
//!   the tail of its flight, `RTT` when three or more segments follow it (fast retransmit),
//!   `RTT + RTT/4` when one or two follow, plus `RTO·2^k` for the k-th lost retransmission;
//! - a new connection costs one RTT, plus `syn_rto` (backing off) per lost SYN or SYN-ACK.
//!
//! A *flight* is the bytes of one read: the proxy reads whatever the sender's kernel has queued,
//! which is what one TCP send burst delivers.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::profile::{
    ConnectParams, JitterDistribution, LinkParams, LossProcess, Profile, SynBackoff,
};

/// Linux gives up on a segment after `tcp_retries2` = 15 retransmissions; we deliver it then
/// rather than drop it, because the model never loses bytes.
const MAX_RETRANSMISSIONS: u32 = 15;
/// Linux `tcp_syn_retries`.
const MAX_SYN_RETRIES: u32 = 6;
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

/// Round-trip figures of the emulated path, shared by both directions' retransmission logic.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PathTiming {
    /// Upstream + downstream delay + mean jitter of both.
    pub rtt: Duration,
    /// `rtt + max(4·rttvar, rto_min)`; `rto_min` of the direction that retransmits.
    rttvar: Duration,
}

impl PathTiming {
    pub fn of(profile: &Profile) -> PathTiming {
        let (up, down) = (&profile.upstream, &profile.downstream);
        let mean = jitter_mean(up) + jitter_mean(down);
        let var = jitter_sd(up).powi(2) + jitter_sd(down).powi(2);
        PathTiming {
            rtt: up.delay + down.delay + Duration::from_secs_f64(mean),
            rttvar: Duration::from_secs_f64(var.sqrt()),
        }
    }

    /// The retransmission timeout a sender on a link with this `rto_min` uses.
    pub fn rto(&self, rto_min: Duration) -> Duration {
        self.rtt + (self.rttvar * 4).max(rto_min)
    }
}

fn jitter_mean(p: &LinkParams) -> f64 {
    match p.jitter_distribution {
        JitterDistribution::Pareto => p.jitter.as_secs_f64(),
        JitterDistribution::Uniform | JitterDistribution::Normal => 0.0,
    }
}

fn jitter_sd(p: &LinkParams) -> f64 {
    let j = p.jitter.as_secs_f64();
    match p.jitter_distribution {
        JitterDistribution::Uniform => j / 3f64.sqrt(),
        JitterDistribution::Normal => j,
        // Lomax with shape 3 and mean j has variance 3·j².
        JitterDistribution::Pareto => j * 3f64.sqrt(),
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

/// The model of one direction of one connection.
#[derive(Clone, Debug)]
pub struct LinkModel {
    params: LinkParams,
    /// Cached from `params` and the path: used on every loss.
    rtt: Duration,
    rto: Duration,
    /// This direction's own stream: draws never depend on the other direction's traffic.
    rng: ChaCha8Rng,
    /// Gilbert–Elliott state (false = good).
    bad_state: bool,
    /// No segment departs before this (the connection is still being set up).
    floor: Duration,
    /// Bandwidth: when the link can start serialising the next segment.
    next_free: Duration,
    /// Monotonicity: no release before the previous one.
    last_release: Duration,
    /// Segments lost so far (each stall counted once, however often it was retransmitted).
    stalls: u64,
}

impl LinkModel {
    pub fn new(params: &LinkParams, timing: PathTiming, rng: ChaCha8Rng) -> LinkModel {
        LinkModel {
            params: params.clone(),
            rtt: timing.rtt,
            rto: timing.rto(params.rto_min),
            rng,
            bad_state: false,
            floor: Duration::ZERO,
            next_free: Duration::ZERO,
            last_release: Duration::ZERO,
            stalls: 0,
        }
    }

    /// Changes the impairment of a live direction (a toxic added, updated or removed). The
    /// random stream, the Gilbert–Elliott state and the release clock carry over, so bytes
    /// already scheduled keep their times and nothing released later can overtake them.
    pub fn retune(&mut self, params: &LinkParams, timing: PathTiming) {
        self.params = params.clone();
        self.rtt = timing.rtt;
        self.rto = timing.rto(params.rto_min);
        if params.rate_bps.is_none() {
            self.next_free = Duration::ZERO;
        }
    }

    /// Segments lost so far.
    pub fn stalls(&self) -> u64 {
        self.stalls
    }

    /// The retransmission timeout this direction uses.
    pub fn rto(&self) -> Duration {
        self.rto
    }

    /// One flight: `len` bytes read together at `now`. Appends one [`Segment`] per `mss` bytes.
    pub fn send(&mut self, now: Duration, len: usize, out: &mut Vec<Segment>) {
        let mss = self.params.mss as usize;
        let count = len.div_ceil(mss);
        for i in 0..count {
            let seg_len = mss.min(len - i * mss);
            let later = count - 1 - i;
            out.push(self.segment(now, seg_len, later));
        }
    }

    /// A FIN, treated as a lone segment (it can be lost and stall like any tail).
    pub fn send_fin(&mut self, now: Duration) -> Segment {
        self.segment(now, 0, 0)
    }

    /// A reset: delivered after the bytes before it, never lost (it ends the connection anyway).
    pub fn send_reset(&mut self, now: Duration) -> Duration {
        let arrival = now.max(self.floor).max(self.next_free) + self.params.delay;
        self.last_release = self.last_release.max(arrival);
        self.last_release
    }

    fn segment(&mut self, now: Duration, len: usize, later_in_flight: usize) -> Segment {
        let depart = now.max(self.floor).max(self.next_free);
        if let Some(bps) = self.params.rate_bps {
            let bits = (len.max(1) * 8) as f64;
            self.next_free = depart + Duration::from_secs_f64(bits / bps as f64);
        }
        let mut arrival = self.jittered(depart + self.params.delay).max(depart);
        let lost = self.draw_loss();
        if lost {
            self.stalls += 1;
            arrival += self.retransmission_delay(later_in_flight);
        }
        self.last_release = self.last_release.max(arrival);
        Segment {
            len,
            release: self.last_release,
            lost,
        }
    }

    fn jittered(&mut self, t: Duration) -> Duration {
        jittered(&self.params, t, &mut self.rng)
    }

    /// One draw of the loss process (advancing Gilbert–Elliott's state).
    fn draw_loss(&mut self) -> bool {
        draw_loss(&self.params.loss, &mut self.bad_state, &mut self.rng)
    }

    /// Extra time a lost segment needs, given how many segments follow it in its flight.
    fn retransmission_delay(&mut self, later_in_flight: usize) -> Duration {
        let mut extra = match later_in_flight {
            0 => self.rto,
            1 | 2 => self.rtt + self.rtt / 4,
            _ => self.rtt,
        };
        let mut k = 1;
        while k <= MAX_RETRANSMISSIONS && self.draw_loss() {
            extra += self.rto * (1 << k);
            k += 1;
        }
        extra
    }

    /// Stall of a handshake packet (SYN or SYN-ACK) sent in this direction, and how many times
    /// it was lost.
    fn handshake_stall(
        &mut self,
        connect: &ConnectParams,
        loss: Option<LossProcess>,
    ) -> (Duration, u32) {
        // A handshake-only loss process (a `syn_loss` toxic) stands in for the link's.
        let link_loss = self.params.loss;
        if let Some(loss) = loss {
            self.params.loss = loss;
        }
        let mut stall = Duration::ZERO;
        let mut losses = 0;
        while losses < MAX_SYN_RETRIES && self.draw_loss() {
            stall += match connect.syn_backoff {
                SynBackoff::Exponential => connect.syn_rto * (1 << losses),
                SynBackoff::Linear => connect.syn_rto,
            };
            losses += 1;
        }
        self.params.loss = link_loss;
        (stall, losses)
    }
}

/// Loss processes that stand in for the links' own for the handshake's packets only (`syn_loss`
/// toxics), each for the packet that travels its way: the client's SYN upstream, the server's
/// SYN-ACK downstream.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HandshakeLoss {
    pub syn: Option<LossProcess>,
    pub synack: Option<LossProcess>,
}

/// Both directions of one connection, with the handshake already drawn.
#[derive(Clone, Debug)]
pub struct ConnectionModel {
    pub upstream: LinkModel,
    pub downstream: LinkModel,
    /// From accept until the client's first byte may depart: one RTT plus SYN/SYN-ACK stalls.
    pub setup: Duration,
    /// Lost SYNs (counted as upstream stalls).
    pub syn_losses: u32,
    /// Lost SYN-ACKs (counted as downstream stalls).
    pub synack_losses: u32,
}

impl ConnectionModel {
    /// The model of connection number `ordinal` of proxy `proxy` in a run seeded with `seed`.
    pub fn new(profile: &Profile, seed: u64, proxy: &str, ordinal: u64) -> ConnectionModel {
        ConnectionModel::with_handshake_loss(
            profile,
            HandshakeLoss::default(),
            seed,
            proxy,
            ordinal,
        )
    }

    /// Like [`ConnectionModel::new`], with the SYN and the SYN-ACK lost by `handshake_loss`'s
    /// processes instead of their links' own (where given).
    pub fn with_handshake_loss(
        profile: &Profile,
        handshake_loss: HandshakeLoss,
        seed: u64,
        proxy: &str,
        ordinal: u64,
    ) -> ConnectionModel {
        let timing = PathTiming::of(profile);
        let mut upstream = LinkModel::new(
            &profile.upstream,
            timing,
            stream_rng(seed, proxy, ordinal, Direction::Upstream),
        );
        let mut downstream = LinkModel::new(
            &profile.downstream,
            timing,
            stream_rng(seed, proxy, ordinal, Direction::Downstream),
        );
        let (syn_stall, syn_losses) =
            upstream.handshake_stall(&profile.connect, handshake_loss.syn);
        let (synack_stall, synack_losses) =
            downstream.handshake_stall(&profile.connect, handshake_loss.synack);
        let setup = timing.rtt + syn_stall + synack_stall;
        // The client sends once the SYN-ACK arrived; the server can send once the client's final
        // ACK reached it, one upstream delay later.
        upstream.floor = setup;
        downstream.floor = setup + profile.upstream.delay;
        upstream.stalls += u64::from(syn_losses);
        downstream.stalls += u64::from(synack_losses);
        ConnectionModel {
            upstream,
            downstream,
            setup,
            syn_losses,
            synack_losses,
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

/// One draw of a loss process; `bad_state` is Gilbert–Elliott's state (false = good), advanced
/// by the draw. Shared with the packet engine, so a profile's loss means the same on both.
pub(crate) fn draw_loss(loss: &LossProcess, bad_state: &mut bool, rng: &mut ChaCha8Rng) -> bool {
    match *loss {
        LossProcess::None => false,
        LossProcess::Bernoulli { p } => rng.random::<f64>() < p,
        LossProcess::GilbertElliott { p, r, h, k } => {
            let delivered = if *bad_state { h } else { k };
            let lost = rng.random::<f64>() >= delivered;
            let flip = rng.random::<f64>();
            *bad_state = if *bad_state { flip >= r } else { flip < p };
            lost
        }
    }
}

/// The RNG stream of one connection direction: keyed by (seed, proxy name), with the stream
/// number chosen by (connection ordinal, direction). ChaCha streams are independent, so two
/// connections never share draws, and the same run seed always gives the same schedule.
pub fn stream_rng(seed: u64, proxy: &str, ordinal: u64, direction: Direction) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(splitmix64(seed ^ fnv1a(proxy.as_bytes())));
    rng.set_stream(ordinal.wrapping_mul(2).wrapping_add(direction as u64));
    rng
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
        for (d, lost) in &results {
            match lost {
                0 => assert_eq!(*d, 20 * MS),
                // One loss (and its retransmission got through, which is most of them): 220 ms.
                1 => assert!(*d == 240 * MS || *d >= 240 * MS + 2 * rto, "{d:?}"),
                _ => assert!(*d >= 460 * MS, "{d:?}"),
            }
        }
        let single_stalls = results.iter().filter(|(d, _)| *d == 240 * MS).count();
        // Every single loss whose retransmission was not lost again stalls exactly 220 ms.
        assert!(single_stalls as f64 >= 0.97 * stalled as f64);
    }

    #[test]
    fn new_connection_adds_one_rtt_and_a_second_per_lost_syn() {
        let p = reference();
        let n = 100_000;
        let mut lost_handshakes = 0;
        for ordinal in 0..n {
            let mut m = ConnectionModel::new(&p, 11, "conn", ordinal);
            let losses = m.syn_losses + m.synack_losses;
            // Each packet's k losses back off 1 s, 2 s, 4 s, …: 2^k − 1 seconds in all.
            let backoff = |k: u32| Duration::from_secs((1 << k) - 1);
            let expected_setup = 20 * MS + backoff(m.syn_losses) + backoff(m.synack_losses);
            assert_eq!(m.setup, expected_setup, "{m:?}");
            if losses > 0 {
                lost_handshakes += 1;
            } else if ordinal < 1000 {
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
    fn linear_syn_backoff_repeats_the_same_timeout() {
        let p =
            profile("[link]\ndelay = \"10ms\"\nloss = 1.0\n[connect]\nsyn_backoff = \"linear\"\n");
        let m = ConnectionModel::new(&p, 1, "x", 0);
        assert_eq!(m.syn_losses, MAX_SYN_RETRIES);
        assert_eq!(
            m.setup,
            20 * MS + 2 * MAX_SYN_RETRIES * Duration::from_secs(1)
        );
    }

    /// Loss position decides the stall: fast retransmit pays one RTT, a tail loss one RTO.
    #[test]
    fn twelve_segment_message_with_one_non_tail_loss_pays_one_rtt() {
        let p = reference();
        let mss = 1448;
        let mut seen = [0usize; 3];
        for ordinal in 0..20_000 {
            let mut m = ConnectionModel::new(&p, 3, "flight", ordinal);
            let t0 = Duration::from_secs(10); // well past setup
            let mut segs = Vec::new();
            m.upstream.send(t0, 12 * mss, &mut segs);
            assert_eq!(segs.len(), 12);
            let lost: Vec<usize> = (0..12).filter(|&i| segs[i].lost).collect();
            let last = segs[11].release - t0;
            if lost.len() != 1 {
                continue;
            }
            let (case, expected) = match lost[0] {
                0..=8 => (0, 30 * MS),  // delay + RTT (fast retransmit)
                9 | 10 => (1, 35 * MS), // delay + RTT + RTT/4
                _ => (2, 230 * MS),     // delay + RTO (tail loss)
            };
            if last == expected {
                seen[case] += 1;
            } else {
                // The retransmission was lost too: RTO·2 or more on top.
                assert!(last >= expected + 440 * MS, "loss at {}: {last:?}", lost[0]);
            }
        }
        assert!(
            seen.iter().all(|&n| n > 10),
            "every case exercised: {seen:?}"
        );
    }

    #[test]
    fn repeated_loss_backs_off() {
        let p = profile("[link]\ndelay = \"10ms\"\nloss = 1.0\n");
        let mut m = ConnectionModel::new(&p, 1, "x", 0);
        let mut segs = Vec::new();
        let t0 = Duration::from_secs(100_000);
        m.upstream.send(t0, 10, &mut segs);
        let rto = 220 * MS;
        let backoff: Duration = (1..=MAX_RETRANSMISSIONS).map(|k| rto * (1 << k)).sum();
        assert_eq!(segs[0].release - t0, 10 * MS + rto + backoff);
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

    #[test]
    fn constant_delay_keeps_throughput() {
        let p = profile("[link]\ndelay = \"10ms\"\n");
        let mut m = ConnectionModel::new(&p, 1, "d", 0);
        let mut segs = Vec::new();
        let start = Duration::from_secs(1);
        for i in 0..1000u32 {
            m.upstream.send(
                start + Duration::from_micros(u64::from(i)),
                65_536,
                &mut segs,
            );
        }
        let last = segs.last().unwrap().release;
        assert_eq!(last, start + Duration::from_micros(999) + 10 * MS);
    }

    #[test]
    fn bandwidth_serialises_segments_at_the_rate() {
        // 1448-byte segments at 11.584 Mbit/s: exactly 1 ms each.
        let p = profile("[link]\ndelay = \"5ms\"\nrate = \"11584kbit\"\n");
        let mut m = ConnectionModel::new(&p, 1, "bw", 0);
        let mut segs = Vec::new();
        let t0 = Duration::from_secs(1);
        m.upstream.send(t0, 100 * 1448, &mut segs);
        for (i, s) in segs.iter().enumerate() {
            let expected = t0 + 5 * MS + MS * i as u32;
            let diff = s.release.abs_diff(expected);
            assert!(
                diff < Duration::from_micros(1),
                "segment {i}: {:?}",
                s.release
            );
        }
    }

    #[test]
    fn gilbert_elliott_matches_its_stationary_loss_and_burst_length() {
        let p = profile("[link.burst]\np = 0.02\nr = 0.25\n");
        let mut m = ConnectionModel::new(&p, 8, "ge", 0).upstream;
        let n = 400_000;
        let draws: Vec<bool> = (0..n).map(|_| m.draw_loss()).collect();
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
