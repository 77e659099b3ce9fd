//! One direction's TCP sender, simulated on virtual time with Linux's rules: when each segment
//! may leave (the congestion window), how a lost one is found and sent again (RACK-TLP and the
//! RTO), and how the round-trip estimate and the window move.
//!
//! The receiver is not simulated: every segment that arrives is acknowledged, and the ACK
//! reaches the sender one reverse-path delay later. (Linux acknowledges every second full
//! segment, and at once when data is out of order; counting per segment gives the same window
//! growth and the same loss detection. ACKs are never lost: a lost ACK is covered by the next,
//! cumulative one.) With timestamps on (Linux's default), every ACK is an RTT sample, even of a
//! retransmitted segment.
//!
//! The kernel's timers run on jiffies (`HZ`), and the timer wheel fires a timer on the tick after
//! it expires and rounds far timers up to its level's granularity; the model does the same, with
//! a random tick phase per direction, so a 220 ms RTO lasts 220–224 ms here as it does there.
//!
//! What the sender is told is "these segments were handed over at `t`"; what it answers is when
//! each first arrives. Everything it knows about the future it has drawn itself, so the
//! simulation runs ahead only as far as the queued data needs, and a look-ahead on a copy finds
//! when lost segments get through without committing the sender to anything.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;

use super::cc::Window;
use crate::profile::CongestionControl;

/// Timer ticks per second: `CONFIG_HZ` of Debian's and Ubuntu's kernels (RHEL and Fedora use
/// 1000). It sets the granularity of every TCP timer below.
pub(crate) const HZ: u32 = 250;
/// RFC 6928 initial window, Linux's `TCP_INIT_CWND`.
const INITIAL_WINDOW: u32 = 10;
/// Linux's `tcp_reordering`: SACKed segments above a hole that make it a loss at once.
const DUPTHRESH: u32 = 3;
/// `TCP_RTO_MAX`.
const RTO_MAX: Duration = Duration::from_secs(120);
/// `TCP_TIMEOUT_INIT`: the RTO before any RTT sample.
const TIMEOUT_INIT: Duration = Duration::from_secs(1);
/// `TCP_TIMEOUT_MIN_US`: the slack a loss probe waits beyond 2·SRTT with several segments out,
/// and the RACK reordering timer beyond its window. Added before the conversion to jiffies, as
/// current kernels do (older ones added two whole jiffies: 8 ms at HZ 250, which made a lone
/// hole wait 16–20 ms instead of the 8–12 ms the kernel measured here does).
const TIMEOUT_MIN: Duration = Duration::from_millis(2);
/// Linux gives up on a segment after `tcp_retries2` = 15 retransmissions; the model delivers it
/// then rather than lose bytes.
const MAX_TRANSMISSIONS: u32 = 16;

/// What carries the sender's segments: the link model of this direction.
pub trait Network {
    /// Carries one transmission that leaves the sender at `at`: its arrival at the receiver, or
    /// `None` when the network loses it. `may_lose` false forces delivery.
    fn carry(&mut self, at: Duration, len: usize, may_lose: bool) -> Option<Duration>;
    /// From the receiver's ACK to the sender.
    fn ack_delay(&self) -> Duration;
}

/// The kernel's clock: jiffies with a phase, and the timer wheel's rounding.
#[derive(Clone, Copy, Debug)]
pub struct Jiffies {
    phase: Duration,
}

impl Jiffies {
    const TICK: Duration = Duration::from_nanos(1_000_000_000 / HZ as u64);

    /// `phase` in [0, 1): where the ticks fall relative to virtual time zero.
    pub fn new(phase: f64) -> Jiffies {
        Jiffies {
            phase: Self::TICK.mul_f64(phase.clamp(0.0, 0.999_999)),
        }
    }

    /// `jiffies` at virtual time `t`.
    pub fn at(&self, t: Duration) -> u64 {
        ((t + self.phase).as_nanos() / Self::TICK.as_nanos()) as u64
    }

    /// `usecs_to_jiffies`: rounds up.
    pub(crate) fn ceil(d: Duration) -> u64 {
        d.as_nanos().div_ceil(Self::TICK.as_nanos()) as u64
    }

    pub fn duration(j: u64) -> Duration {
        Self::TICK * j as u32
    }

    /// When a timer armed at `now` to expire `n` jiffies later fires. The wheel never fires
    /// early: level 0 (up to 63 jiffies) fires on the tick after expiry, and each further level
    /// rounds the expiry up to 8× the previous granularity (`calc_index` in kernel/time/timer.c).
    pub(crate) fn fire(&self, now: Duration, n: u64) -> Duration {
        let expires = self.at(now) + n;
        let mut shift = 0;
        let mut level_start = 63;
        while n >= level_start && shift < 24 {
            shift += 3;
            level_start <<= 3;
        }
        let bucket = ((expires >> shift) + 1) << shift;
        (Self::TICK * bucket as u32).saturating_sub(self.phase)
    }
}

/// Linux's congestion-avoidance states (`tcp_ca_state`) that change what the sender does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Open,
    Recovery,
    Loss,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimerKind {
    /// RACK's reordering window ran out.
    Reorder,
    /// Tail loss probe.
    Probe,
    Rto,
}

/// A copy of `seq` sent at `sent` was acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Ack {
    seq: u64,
    sent: Duration,
}

#[derive(Clone, Debug)]
struct Seg {
    len: usize,
    /// When its bytes were handed to the sender.
    queued: Duration,
    /// Last transmission.
    sent: Duration,
    transmissions: u32,
    sacked: bool,
    /// Marked lost and not acknowledged since.
    lost: bool,
    /// A retransmission of it is in flight.
    retrans: bool,
    /// The network lost its first transmission.
    first_dropped: bool,
    /// Whether the copy in flight (the last one sent) was lost: what a DSACK would tell.
    last_dropped: bool,
    arrived: bool,
}

/// Where a segment handed to the sender ends up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Arrival {
    pub at: Duration,
    /// The first transmission was lost.
    pub lost: bool,
}

/// One direction's TCP sender.
#[derive(Clone, Debug)]
pub struct Sender {
    jiffies: Jiffies,
    rto_min: Duration,
    /// No segment leaves before this (the handshake).
    floor: Duration,
    /// Virtual time of the last event handled.
    clock: Duration,
    /// Sequence numbers count segments. `segs[0]` is `snd_una`; those from `snd_nxt` on are
    /// queued, not yet sent.
    segs: VecDeque<Seg>,
    snd_una: u64,
    snd_nxt: u64,
    sacked_out: u32,
    lost_out: u32,
    retrans_out: u32,
    /// Lost segments not yet retransmitted.
    lost_waiting: u32,
    /// ACKs on their way back, by arrival (then by the order they were sent in).
    acks: BinaryHeap<Reverse<(Duration, u64, Ack)>>,
    order: u64,
    /// The retransmission timer: one slot, as in Linux (`icsk_pending`), and when it fires.
    timer: Option<(TimerKind, Duration)>,
    window: Window,
    state: State,
    /// `high_seq`: the recovery episode ends when everything before it is acknowledged.
    high_seq: u64,
    /// Open a recovery with one retransmission even if the window is full (PRR's first send).
    force_retransmit: bool,
    srtt: Option<Duration>,
    /// `mdev_us`, `mdev_max_us` and `rttvar_us`: four times the mean deviation.
    mdev: Duration,
    mdev_max: Duration,
    rttvar: Duration,
    rtt_seq: u64,
    min_rtt: Duration,
    /// `icsk_rto` before back-off, jiffies.
    rto: u64,
    backoff: u32,
    /// RACK: the latest (send time, seq) known delivered, and its RTT.
    rack_sent: (Duration, u64),
    rack_rtt: Duration,
    reordering_seen: bool,
    highest_sacked: Option<u64>,
    /// A loss probe is out: the sequence it covers, and whether its copy repaired a loss.
    tlp: Option<(u64, bool)>,
    /// `lsndtime`.
    last_send: Duration,
    max_packets_out: u32,
    cwnd_usage_seq: u64,
    is_cwnd_limited: bool,
    cwnd_used: u32,
    cwnd_stamp: u64,
    /// First arrivals of segments not yet reported to the caller.
    arrivals: BTreeMap<u64, Arrival>,
    /// Segments below this were reported already.
    reported: u64,
    /// First transmissions lost.
    stalls: u64,
}

impl Sender {
    /// A sender whose connection is set up at `floor`, with the handshake's RTT sample (`None`
    /// without one) and how many times its SYN or SYN-ACK was retransmitted.
    pub fn new(
        cc: CongestionControl,
        rto_min: Duration,
        jiffies: Jiffies,
        floor: Duration,
        handshake_rtt: Option<Duration>,
        handshake_retransmissions: u32,
    ) -> Sender {
        // RFC 6298 (5.7), `tcp_init_transfer`: a handshake retransmitted more than once starts
        // from a window of one.
        let initial = if handshake_retransmissions > 1 {
            1
        } else {
            INITIAL_WINDOW
        };
        let mut s = Sender {
            jiffies,
            rto_min,
            floor,
            clock: floor,
            segs: VecDeque::new(),
            snd_una: 0,
            snd_nxt: 0,
            sacked_out: 0,
            lost_out: 0,
            retrans_out: 0,
            lost_waiting: 0,
            acks: BinaryHeap::new(),
            order: 0,
            timer: None,
            window: Window::new(cc, initial),
            state: State::Open,
            high_seq: 0,
            force_retransmit: false,
            srtt: None,
            mdev: Duration::ZERO,
            mdev_max: Duration::ZERO,
            rttvar: Duration::ZERO,
            rtt_seq: 0,
            min_rtt: Duration::MAX,
            rto: Jiffies::ceil(TIMEOUT_INIT),
            backoff: 0,
            rack_sent: (Duration::ZERO, 0),
            rack_rtt: Duration::ZERO,
            reordering_seen: false,
            highest_sacked: None,
            tlp: None,
            last_send: floor,
            max_packets_out: 0,
            cwnd_usage_seq: 0,
            is_cwnd_limited: false,
            cwnd_used: 0,
            cwnd_stamp: 0,
            arrivals: BTreeMap::new(),
            reported: 0,
            stalls: 0,
        };
        if let Some(rtt) = handshake_rtt {
            s.sample_rtt(rtt);
        }
        s
    }

    pub(crate) fn set_rto_min(&mut self, rto_min: Duration) {
        self.rto_min = rto_min;
        self.set_rto();
    }

    /// Segments whose first transmission was lost.
    pub fn stalls(&self) -> u64 {
        self.stalls
    }

    /// The retransmission timeout now (before back-off).
    pub fn rto(&self) -> Duration {
        Jiffies::duration(self.rto)
    }

    pub fn cwnd(&self) -> u32 {
        self.window.cwnd
    }

    /// Hands segments of these lengths to the sender at `now` and sends what the window allows;
    /// returns their sequence numbers. Their arrivals are then known, except for lost ones:
    /// [`Sender::arrivals`] finds those.
    pub fn push(
        &mut self,
        now: Duration,
        lens: impl IntoIterator<Item = usize>,
        net: &mut impl Network,
    ) -> std::ops::Range<u64> {
        // Whatever the network did before these bytes existed happens first.
        self.run_until(now, net);
        // Bytes that come before the handshake is done wait for it.
        let now = now.max(self.clock).max(self.floor);
        self.clock = now;
        let first = self.snd_una + self.segs.len() as u64;
        if self.packets_out() == 0 && self.segs.is_empty() {
            self.restart_after_idle(now);
        }
        for len in lens {
            self.segs.push_back(Seg {
                len,
                queued: now,
                sent: Duration::ZERO,
                transmissions: 0,
                sacked: false,
                lost: false,
                retrans: false,
                first_dropped: false,
                last_dropped: false,
                arrived: false,
            });
        }
        let end = self.snd_una + self.segs.len() as u64;
        // Send, and keep handling ACKs and timers while queued data waits for the window.
        self.try_send(net);
        while self.snd_nxt < end {
            if !self.step(net) {
                break;
            }
        }
        first..end
    }

    /// The arrival of every segment in `seqs`, simulating ahead on a copy for those not yet
    /// through: the sender itself stays where it is, to take the next bytes at their time.
    pub(crate) fn arrivals<N: Network + Clone>(
        &mut self,
        seqs: std::ops::Range<u64>,
        net: &N,
        out: &mut Vec<Arrival>,
    ) {
        let mut missing: Vec<u64> = seqs
            .clone()
            .filter(|s| !self.arrivals.contains_key(s))
            .collect();
        let mut ahead = (!missing.is_empty()).then(|| (self.clone(), net.clone()));
        if let Some((sender, net)) = &mut ahead {
            while !missing.is_empty() && sender.step(net) {
                missing.retain(|s| !sender.arrivals.contains_key(s));
            }
        }
        for seq in seqs.clone() {
            let own = self.arrivals.remove(&seq);
            let found = own.or_else(|| ahead.as_mut().and_then(|(s, _)| s.arrivals.remove(&seq)));
            // Unreachable: every segment is delivered by its 16th transmission.
            out.push(found.unwrap_or(Arrival {
                at: self.clock,
                lost: true,
            }));
        }
        self.reported = self.reported.max(seqs.end);
    }

    fn packets_out(&self) -> u32 {
        (self.snd_nxt - self.snd_una) as u32
    }

    /// `tcp_packets_in_flight`.
    fn in_flight(&self) -> u32 {
        self.packets_out() + self.retrans_out - self.sacked_out - self.lost_out
    }

    /// When the next ACK arrives or the timer fires.
    fn next_event(&self) -> Option<Duration> {
        let ack = self.acks.peek().map(|Reverse((at, _, _))| *at);
        let timer = self.timer.map(|(_, at)| at);
        ack.into_iter().chain(timer).min()
    }

    /// Handles every event up to `t`.
    fn run_until(&mut self, t: Duration, net: &mut impl Network) {
        while self.next_event().is_some_and(|at| at <= t) {
            self.step(net);
        }
    }

    /// Handles the next event (an ACK before a timer due at the same instant); false when there
    /// is none.
    fn step(&mut self, net: &mut impl Network) -> bool {
        let ack = self.acks.peek().map(|Reverse((at, _, _))| *at);
        match (ack, self.timer) {
            (Some(at), timer) if timer.is_none_or(|(_, fire)| at <= fire) => {
                let Some(Reverse((_, _, ack))) = self.acks.pop() else {
                    return false;
                };
                self.clock = self.clock.max(at);
                self.on_ack(ack.seq, ack.sent, net);
            }
            (_, Some((kind, fire))) => {
                self.clock = self.clock.max(fire);
                match kind {
                    TimerKind::Reorder => self.on_reorder_timeout(net),
                    TimerKind::Probe => self.on_probe_timeout(net),
                    TimerKind::Rto => self.on_rto(net),
                }
            }
            _ => return false,
        }
        true
    }

    fn schedule_ack(&mut self, at: Duration, ack: Ack) {
        self.order += 1;
        self.acks.push(Reverse((at, self.order, ack)));
    }

    fn arm(&mut self, kind: TimerKind, jiffies: u64) {
        self.timer = Some((kind, self.jiffies.fire(self.clock, jiffies)));
    }

    /// `icsk_rto` with back-off, capped at `TCP_RTO_MAX`.
    fn backed_off_rto(&self) -> u64 {
        let max = Jiffies::ceil(RTO_MAX);
        self.rto
            .checked_shl(self.backoff)
            .unwrap_or(max)
            .min(max)
            .max(self.rto)
    }

    /// `tcp_rto_delta_us`: how far in the future the RTO of the oldest outstanding segment is.
    fn rto_delta(&self) -> Option<Duration> {
        let head = self.segs.front()?;
        (head.sent + Jiffies::duration(self.rto)).checked_sub(self.clock)
    }

    /// `tcp_rearm_rto`.
    fn rearm_rto(&mut self) {
        if self.packets_out() == 0 {
            self.timer = None;
            return;
        }
        let jiffies = match self.timer {
            Some((TimerKind::Reorder | TimerKind::Probe, _)) => {
                Jiffies::ceil(self.rto_delta().unwrap_or_default()).max(1)
            }
            _ => self.backed_off_rto(),
        };
        self.arm(TimerKind::Rto, jiffies);
    }

    /// `tcp_schedule_loss_probe`: false when no probe may be scheduled.
    fn schedule_probe(&mut self, advancing_rto: bool) -> bool {
        let packets_out = self.packets_out();
        if packets_out == 0 || self.state != State::Open {
            return false;
        }
        let mut jiffies = match self.srtt {
            // One segment out: the peer may be holding its ACK back (delayed ACK).
            Some(srtt) => Jiffies::ceil(
                2 * srtt
                    + if packets_out == 1 {
                        self.rto_min
                    } else {
                        TIMEOUT_MIN
                    },
            ),
            None => Jiffies::ceil(TIMEOUT_INIT),
        };
        let rto_delta = if advancing_rto {
            Some(Jiffies::duration(self.rto))
        } else {
            self.rto_delta()
        };
        if let Some(d) = rto_delta.filter(|d| !d.is_zero()) {
            jiffies = jiffies.min(Jiffies::ceil(d));
        }
        self.arm(TimerKind::Probe, jiffies);
        true
    }

    /// `tcp_rtt_estimator` and `tcp_set_rto`.
    fn sample_rtt(&mut self, m: Duration) {
        self.min_rtt = self.min_rtt.min(m);
        match self.srtt {
            None => {
                self.srtt = Some(m);
                self.mdev = 2 * m;
                self.rttvar = self.mdev.max(self.rto_min);
                self.mdev_max = self.rttvar;
                self.rtt_seq = self.snd_nxt;
            }
            Some(srtt) => {
                self.srtt = Some(srtt.mul_f64(7.0 / 8.0) + m / 8);
                let quarter = self.mdev / 4;
                if m < srtt {
                    // A sample below the average moves the deviation eight times less.
                    let err = srtt - m;
                    if err > quarter {
                        self.mdev += (err - quarter) / 8;
                    } else {
                        self.mdev -= quarter - err;
                    }
                } else {
                    let err = m - srtt;
                    self.mdev = self.mdev + err - quarter;
                }
                if self.mdev > self.mdev_max {
                    self.mdev_max = self.mdev;
                    self.rttvar = self.rttvar.max(self.mdev_max);
                }
                if self.snd_una > self.rtt_seq {
                    if self.mdev_max < self.rttvar {
                        self.rttvar -= (self.rttvar - self.mdev_max) / 4;
                    }
                    self.rtt_seq = self.snd_nxt;
                    self.mdev_max = self.rto_min;
                }
            }
        }
        self.set_rto();
        self.backoff = 0;
    }

    fn set_rto(&mut self) {
        if let Some(srtt) = self.srtt {
            self.rto =
                Jiffies::ceil(srtt + self.rttvar.max(self.rto_min)).min(Jiffies::ceil(RTO_MAX));
        }
    }

    /// `tcp_slow_start_after_idle_check`: a window unused for longer than an RTO restarts from
    /// the initial window, halved once per RTO of idleness on the way.
    fn restart_after_idle(&mut self, now: Duration) {
        let idle = self
            .jiffies
            .at(now)
            .saturating_sub(self.jiffies.at(self.last_send));
        if idle <= self.rto {
            return;
        }
        let restart = INITIAL_WINDOW.min(self.window.cwnd);
        self.window.ssthresh = self.window.current_ssthresh();
        let mut cwnd = self.window.cwnd;
        let mut left = idle as i64;
        loop {
            left -= self.rto as i64;
            if left <= 0 || cwnd <= restart {
                break;
            }
            cwnd >>= 1;
        }
        self.window.cwnd = cwnd.max(restart);
        self.cwnd_stamp = self.jiffies.at(now);
        self.cwnd_used = 0;
    }

    /// `tcp_write_xmit` and `tcp_xmit_retransmit_queue`: lost segments first, then new data, as
    /// far as the window allows.
    fn try_send(&mut self, net: &mut impl Network) {
        let now = self.clock;
        if now < self.floor {
            return;
        }
        let had_new = self.snd_una + (self.segs.len() as u64) > self.snd_nxt;
        let mut sent_new = false;
        let mut sent_head_retransmission = false;
        loop {
            if self.lost_waiting > 0 {
                if self.in_flight() >= self.window.cwnd && !self.force_retransmit {
                    break;
                }
                self.force_retransmit = false;
                let i = self
                    .segs
                    .iter()
                    .position(|s| s.lost && !s.retrans && !s.sacked)
                    .expect("a lost segment waits");
                sent_head_retransmission |= i == 0;
                self.segs[i].retrans = true;
                self.retrans_out += 1;
                self.lost_waiting -= 1;
                self.transmit(i, net);
                continue;
            }
            let i = (self.snd_nxt - self.snd_una) as usize;
            let Some(seg) = self.segs.get(i) else { break };
            if seg.queued > now || self.in_flight() >= self.window.cwnd {
                break;
            }
            if self.in_flight() == 0 {
                let (now_j, last_j) = (self.jiffies.at(now), self.jiffies.at(self.last_send));
                self.window.on_tx_start(now_j, last_j);
            }
            let prior_out = self.packets_out();
            self.snd_nxt += 1;
            self.transmit(i, net);
            sent_new = true;
            // `tcp_event_new_data_sent`: the first segment out arms the RTO.
            if prior_out == 0 || matches!(self.timer, Some((TimerKind::Probe, _))) {
                self.rearm_rto();
            }
        }
        if sent_head_retransmission && !matches!(self.timer, Some((TimerKind::Reorder, _))) {
            self.arm(TimerKind::Rto, self.backed_off_rto());
        }
        if had_new {
            let limited = self.in_flight() >= self.window.cwnd;
            self.cwnd_validate(limited);
        }
        if sent_new {
            self.schedule_probe(false);
        }
    }

    /// `tcp_cwnd_validate`: whether the window is what limits the sender, per window of data,
    /// and RFC 2861's decay of a window the application leaves unused.
    fn cwnd_validate(&mut self, is_cwnd_limited: bool) {
        let packets_out = self.packets_out();
        if self.snd_una >= self.cwnd_usage_seq
            || is_cwnd_limited
            || (!self.is_cwnd_limited && packets_out > self.max_packets_out)
        {
            self.is_cwnd_limited = is_cwnd_limited;
            self.max_packets_out = packets_out;
            self.cwnd_usage_seq = self.snd_nxt;
        }
        let now = self.jiffies.at(self.clock);
        if self.cwnd_limited() {
            self.cwnd_used = 0;
            self.cwnd_stamp = now;
        } else {
            self.cwnd_used = self.cwnd_used.max(packets_out);
            if now.saturating_sub(self.cwnd_stamp) >= self.rto {
                // `tcp_cwnd_application_limited`.
                if self.state == State::Open {
                    let used = self.cwnd_used.max(INITIAL_WINDOW);
                    if used < self.window.cwnd {
                        self.window.ssthresh = self.window.current_ssthresh();
                        self.window.cwnd = (self.window.cwnd + used) >> 1;
                    }
                    self.cwnd_used = 0;
                }
                self.cwnd_stamp = now;
            }
        }
    }

    /// `tcp_is_cwnd_limited`.
    fn cwnd_limited(&self) -> bool {
        self.is_cwnd_limited
            || (self.window.in_slow_start() && self.window.cwnd < 2 * self.max_packets_out)
    }

    fn transmit(&mut self, i: usize, net: &mut impl Network) {
        let now = self.clock;
        let seq = self.snd_una + i as u64;
        let seg = &mut self.segs[i];
        seg.transmissions += 1;
        seg.sent = now;
        let may_lose = seg.transmissions < MAX_TRANSMISSIONS;
        match net.carry(now, seg.len, may_lose) {
            Some(at) => {
                seg.last_dropped = false;
                if !seg.arrived {
                    seg.arrived = true;
                    if seq >= self.reported {
                        self.arrivals.insert(
                            seq,
                            Arrival {
                                at,
                                lost: seg.first_dropped,
                            },
                        );
                    }
                }
                let ack = at + net.ack_delay();
                self.schedule_ack(ack, Ack { seq, sent: now });
            }
            None => {
                seg.last_dropped = true;
                if seg.transmissions == 1 {
                    seg.first_dropped = true;
                    self.stalls += 1;
                }
            }
        }
        self.last_send = now;
    }

    fn on_ack(&mut self, seq: u64, sent: Duration, net: &mut impl Network) {
        if seq < self.snd_una {
            return;
        }
        let i = (seq - self.snd_una) as usize;
        let now = self.clock;
        {
            let seg = &mut self.segs[i];
            if seg.sacked {
                return;
            }
            seg.sacked = true;
            if seg.lost {
                seg.lost = false;
                self.lost_out -= 1;
                if seg.retrans {
                    self.retrans_out -= 1;
                } else {
                    self.lost_waiting -= 1;
                }
            } else if seg.retrans {
                self.retrans_out -= 1;
            }
            seg.retrans = false;
        }
        let never_retransmitted = self.segs[i].transmissions == 1;
        self.sacked_out += 1;
        if self.highest_sacked.is_some_and(|h| seq < h) && never_retransmitted {
            self.reordering_seen = true;
        }
        self.highest_sacked = Some(self.highest_sacked.map_or(seq, |h| h.max(seq)));
        let rtt = now - sent;
        self.sample_rtt(rtt);
        if (sent, seq) >= self.rack_sent {
            self.rack_sent = (sent, seq);
            self.rack_rtt = rtt;
        }
        let prior_una = self.snd_una;
        let was_sack = seq > prior_una;
        while self.segs.front().is_some_and(|s| s.sacked) {
            self.segs.pop_front();
            self.sacked_out -= 1;
            self.snd_una += 1;
        }
        let advanced = self.snd_una > prior_una;
        // `tcp_process_tlp_ack`: a probe that repaired a loss was a loss all the same.
        if let Some((high, repaired)) = self.tlp {
            if self.snd_una >= high {
                self.tlp = None;
                if repaired && self.state == State::Open {
                    self.window.ssthresh = self.window.loss_ssthresh();
                    self.window.cwnd = self.window.ssthresh;
                }
            }
        }
        let mut set_timer = advanced;
        if was_sack || self.state != State::Open {
            // `tcp_fastretrans_alert`: RACK, and the end of a recovery.
            if self.rack_detect() {
                set_timer = false;
            }
            if self.snd_una >= self.high_seq && self.state != State::Open {
                if self.state == State::Recovery {
                    self.window.cwnd = self.window.ssthresh;
                }
                self.state = State::Open;
            }
        }
        if set_timer && !self.schedule_probe(true) {
            self.rearm_rto();
        }
        // RFC 5681: the window grows on in-order delivery only (`tcp_may_raise_cwnd`).
        if advanced && self.state != State::Recovery && self.cwnd_limited() {
            let (now_j, min_j) = (self.jiffies.at(now), Jiffies::ceil(self.min_rtt).max(1));
            self.window.on_ack(1, now_j, min_j);
        }
        self.try_send(net);
    }

    /// RACK's reordering window (`tcp_rack_reo_wnd`): none while the losses are plain (no
    /// reordering seen, and either recovering or three segments SACKed above the hole).
    fn reorder_window(&self) -> Duration {
        if !self.reordering_seen && (self.state != State::Open || self.sacked_out >= DUPTHRESH) {
            return Duration::ZERO;
        }
        (self.min_rtt / 4).min(self.srtt.unwrap_or(Duration::MAX))
    }

    /// RACK (`tcp_rack_detect_loss`): a segment sent before one that was delivered, and older
    /// than the latter's RTT plus the reordering window, is lost. Returns whether any was
    /// marked, and how long until the next one not old enough yet would be.
    fn mark_overdue(&mut self) -> (bool, Duration) {
        let reo = self.reorder_window();
        let now = self.clock;
        let mut wait = Duration::ZERO;
        let mut marked = false;
        for i in 0..self.packets_out() as usize {
            let seq = self.snd_una + i as u64;
            let seg = &mut self.segs[i];
            // Lost and not resent yet: nothing to find. A retransmission in flight can be lost
            // too, and RACK finds it the same way once something sent after it is delivered.
            if seg.sacked || (seg.lost && !seg.retrans) {
                continue;
            }
            if (seg.sent, seq) >= self.rack_sent {
                if seg.transmissions == 1 {
                    // First transmissions leave in order: none of the rest is older.
                    break;
                }
                continue;
            }
            let deadline = seg.sent + self.rack_rtt + reo;
            if now >= deadline {
                if seg.retrans {
                    seg.retrans = false;
                    self.retrans_out -= 1;
                }
                if !seg.lost {
                    seg.lost = true;
                    self.lost_out += 1;
                }
                self.lost_waiting += 1;
                marked = true;
            } else {
                wait = wait.max(deadline - now);
            }
        }
        if marked && self.state == State::Open {
            self.enter_recovery();
        }
        (marked, wait)
    }

    /// `tcp_rack_mark_lost`: marks what is overdue and arms the reordering timer for the rest
    /// (true when it did).
    fn rack_detect(&mut self) -> bool {
        let (_, wait) = self.mark_overdue();
        if wait.is_zero() {
            return false;
        }
        self.arm(TimerKind::Reorder, Jiffies::ceil(wait + TIMEOUT_MIN));
        true
    }

    /// `tcp_enter_recovery`: the window drops to ssthresh (what PRR converges to) and the first
    /// retransmission goes out at once.
    fn enter_recovery(&mut self) {
        self.window.ssthresh = self.window.loss_ssthresh();
        self.window.cwnd = self.window.ssthresh;
        self.high_seq = self.snd_nxt;
        self.tlp = None;
        self.state = State::Recovery;
        self.force_retransmit = true;
    }

    /// `tcp_rack_reo_timeout`: whatever is still not due waits for the next ACK.
    fn on_reorder_timeout(&mut self, net: &mut impl Network) {
        self.mark_overdue();
        self.rearm_rto();
        self.try_send(net);
    }

    /// `tcp_send_loss_probe`: new data if there is any, else the last segment again.
    fn on_probe_timeout(&mut self, net: &mut impl Network) {
        if self.tlp.is_some() || self.packets_out() == 0 {
            self.rearm_rto();
            return;
        }
        let next = (self.snd_nxt - self.snd_una) as usize;
        if self.segs.get(next).is_some_and(|s| s.queued <= self.clock) {
            self.snd_nxt += 1;
            self.transmit(next, net);
            self.tlp = Some((self.snd_nxt, false));
        } else {
            let last = self.packets_out() as usize - 1;
            let repaired = self.segs[last].last_dropped;
            if !self.segs[last].sacked && !self.segs[last].retrans {
                self.segs[last].retrans = true;
                self.retrans_out += 1;
            }
            self.transmit(last, net);
            self.tlp = Some((self.snd_nxt, repaired));
        }
        // The probe restarts the RTO from now.
        self.timer = None;
        self.rearm_rto();
    }

    /// `tcp_retransmit_timer`: everything outstanding is lost, the window is one segment, and
    /// the timeout doubles.
    fn on_rto(&mut self, net: &mut impl Network) {
        self.timer = None;
        if self.packets_out() == 0 {
            return;
        }
        if self.state == State::Open || self.snd_una >= self.high_seq {
            self.window.ssthresh = self.window.loss_ssthresh();
        }
        let outstanding = self.packets_out() as usize;
        for seg in self.segs.iter_mut().take(outstanding) {
            if seg.sacked {
                continue;
            }
            if !seg.lost {
                seg.lost = true;
                self.lost_out += 1;
                self.lost_waiting += 1;
            } else if seg.retrans {
                self.lost_waiting += 1;
            }
            seg.retrans = false;
        }
        self.retrans_out = 0;
        self.window.cwnd = 1;
        self.window.on_loss_state();
        self.state = State::Loss;
        self.high_seq = self.snd_nxt;
        self.tlp = None;
        self.backoff += 1;
        self.force_retransmit = true;
        self.try_send(net);
        self.arm(TimerKind::Rto, self.backed_off_rto());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A path with a fixed one-way delay that loses the transmissions it is told to.
    #[derive(Clone)]
    struct Path {
        delay: Duration,
        back: Duration,
        /// (seq-independent) transmission ordinals to lose, counted from 0.
        lose: Vec<u32>,
        sent: u32,
    }

    impl Network for Path {
        fn carry(&mut self, at: Duration, _len: usize, may_lose: bool) -> Option<Duration> {
            let n = self.sent;
            self.sent += 1;
            (!(may_lose && self.lose.contains(&n))).then_some(at + self.delay)
        }
        fn ack_delay(&self) -> Duration {
            self.back
        }
    }

    fn path(lose: &[u32]) -> Path {
        Path {
            delay: 10 * MS,
            back: 10 * MS,
            lose: lose.to_vec(),
            sent: 0,
        }
    }

    /// A sender on a 10 ms + 10 ms path whose ticks fall exactly on whole milliseconds.
    fn sender() -> Sender {
        Sender::new(
            CongestionControl::Cubic,
            200 * MS,
            Jiffies::new(0.0),
            Duration::ZERO,
            Some(20 * MS),
            0,
        )
    }

    /// Sends `n` segments at `t` and returns when each arrives.
    fn flight(s: &mut Sender, p: &mut Path, t: Duration, n: usize) -> Vec<Arrival> {
        let seqs = s.push(t, std::iter::repeat_n(1448, n), p);
        let mut out = Vec::new();
        s.arrivals(seqs, p, &mut out);
        out
    }

    /// `fire` lands on the tick after expiry; `jiffies_after(t, n)` is that delay from `t`.
    fn timer(now: Duration, d: Duration) -> Duration {
        Jiffies::new(0.0).fire(now, Jiffies::ceil(d)) - now
    }

    #[test]
    fn the_timer_wheel_never_fires_early_and_rounds_far_timers_up() {
        let j = Jiffies::new(0.0);
        let tick = Jiffies::TICK;
        // 10 jiffies, armed on a tick: fires on the 11th.
        assert_eq!(j.fire(Duration::ZERO, 10), 11 * tick);
        // Armed mid-tick: still at least 10 jiffies later.
        assert_eq!(j.fire(tick / 2, 10), 11 * tick);
        // 250 jiffies (1 s at HZ 250) is on level 1, granularity 8: up to 8 ticks late.
        let f = j.fire(Duration::ZERO, 250);
        assert!(f > 250 * tick && f <= 258 * tick, "{f:?}");
        assert_eq!(f, 256 * tick);
    }

    #[test]
    fn rto_is_srtt_plus_rto_min_in_jiffies() {
        let s = sender();
        assert_eq!(s.rto(), 220 * MS);
    }

    /// IW10: twelve segments on a fresh connection need a second round trip.
    #[test]
    fn twelve_segments_take_two_round_trips_on_a_fresh_window() {
        let mut s = sender();
        let mut p = path(&[]);
        let a = flight(&mut s, &mut p, Duration::ZERO, 12);
        assert!(a[..10].iter().all(|a| a.at == 10 * MS), "{a:?}");
        // The first ACK is back at 20 ms; two more segments leave and arrive at 30 ms.
        assert_eq!(a[10].at, 30 * MS);
        assert_eq!(a[11].at, 30 * MS);
        // The window grew in slow start: the next twelve go in one round trip.
        let t = 100 * MS;
        let b = flight(&mut s, &mut p, t, 12);
        assert!(b.iter().all(|a| a.at == t + 10 * MS), "{b:?}");
        assert!(s.cwnd() >= 12, "cwnd {}", s.cwnd());
    }

    /// A lone segment lost: the probe waits min(2·SRTT + rto_min, RTO) = RTO, then resends.
    #[test]
    fn a_lost_lone_segment_waits_one_rto() {
        let mut s = sender();
        let mut p = path(&[0]);
        let a = flight(&mut s, &mut p, Duration::ZERO, 1);
        assert!(a[0].lost);
        assert_eq!(a[0].at, timer(Duration::ZERO, 220 * MS) + 10 * MS);
    }

    /// The tail of three lost, the first two acknowledged at 20 ms: the probe is re-armed from
    /// that ACK with one segment out, so min(2·SRTT + rto_min, RTO) = RTO from 20 ms.
    #[test]
    fn a_lost_tail_waits_one_rto_from_the_last_ack() {
        let mut s = sender();
        let mut p = path(&[2]);
        let a = flight(&mut s, &mut p, Duration::ZERO, 3);
        assert!(!a[0].lost && a[2].lost);
        assert_eq!(a[2].at, 20 * MS + timer(20 * MS, 220 * MS) + 10 * MS);
    }

    /// The last two of three lost: after the first ACK (20 ms), the probe waits 2·SRTT + 2 ms
    /// with two segments out and resends the last; its SACK (20 ms later) shows the middle one
    /// lost at once (RACK), which is resent then.
    #[test]
    fn the_last_two_lost_are_repaired_by_a_probe_and_rack() {
        let mut s = sender();
        let mut p = path(&[1, 2]);
        let a = flight(&mut s, &mut p, Duration::ZERO, 3);
        let probe = 20 * MS + timer(20 * MS, 42 * MS);
        assert_eq!(a[2].at, probe + 10 * MS, "the probe repairs the tail");
        assert_eq!(
            a[1].at,
            probe + 30 * MS,
            "RACK resends the middle on the probe's ACK"
        );
    }

    /// A hole with two later segments SACKed waits out RACK's reordering window (min_rtt/4) plus
    /// 2 ms; with three or more SACKed it is resent on the third SACK.
    #[test]
    fn a_hole_is_resent_after_the_reordering_window_or_on_the_third_sack() {
        let mut s = sender();
        let mut p = path(&[0]);
        let a = flight(&mut s, &mut p, Duration::ZERO, 3);
        // SACKs at 20 ms; the hole is due at 0 + 20 + 5 ms: a timer of ⌈(5 + 2) ms⌉ = 2 jiffies,
        // fired on the tick after: 12 ms later, resent at 32 ms.
        assert_eq!(a[0].at, 32 * MS + 10 * MS);

        let mut s = sender();
        let mut p = path(&[0]);
        let a = flight(&mut s, &mut p, Duration::ZERO, 5);
        assert_eq!(
            a[0].at,
            20 * MS + 10 * MS,
            "resent on the third SACK at 20 ms"
        );
    }

    /// A retransmission lost too, with new data sent after it delivered: RACK finds it on that
    /// data's SACK instead of waiting for the RTO.
    #[test]
    fn rack_finds_a_lost_retransmission() {
        let mut s = sender();
        // Segment 0 is lost. At 20 ms the first two SACKs each let a new segment out (10, 11),
        // the third starts recovery and resends segment 0 (the 13th transmission, lost too),
        // and as the window drains segments 12 and 13 leave after it.
        let mut p = path(&[0, 12]);
        let a = flight(&mut s, &mut p, Duration::ZERO, 14);
        // Their SACKs at 40 ms show the retransmission lost: resent then, in at 50 ms.
        assert_eq!(a[0].at, 50 * MS, "{a:?}");
    }

    #[test]
    fn a_lost_retransmission_backs_off() {
        let mut s = sender();
        // The segment, then its probe, then the RTO retransmission are lost; the fourth copy
        // gets through.
        let mut p = path(&[0, 1, 2]);
        let a = flight(&mut s, &mut p, Duration::ZERO, 1);
        let probe = timer(Duration::ZERO, 220 * MS);
        let rto = probe + timer(probe, 220 * MS);
        let backed_off = rto + timer(rto, 440 * MS);
        assert_eq!(a[0].at, backed_off + 10 * MS);
    }

    #[test]
    fn loss_halves_the_window_the_cubic_way() {
        let mut s = sender();
        let mut p = path(&[0]);
        flight(&mut s, &mut p, Duration::ZERO, 10);
        // Let recovery finish.
        flight(&mut s, &mut p, Duration::from_secs(1), 1);
        assert_eq!(s.cwnd(), 7, "β = 0.7 of the initial window");
    }

    #[test]
    fn an_idle_window_restarts() {
        let mut s = sender();
        let mut p = path(&[]);
        for k in 0..20u32 {
            flight(&mut s, &mut p, k * 40 * MS, 20);
        }
        assert!(s.cwnd() > 20, "grown: {}", s.cwnd());
        // Idle for many RTOs: back to the initial window.
        flight(&mut s, &mut p, Duration::from_secs(60), 1);
        assert_eq!(s.cwnd(), INITIAL_WINDOW);
    }
}
