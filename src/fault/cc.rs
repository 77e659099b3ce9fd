//! The congestion window: Linux's CUBIC (`tcp_cubic.c`) and Reno, in segments.
//!
//! Only what decides *when segments may leave* is here: slow start, the multiplicative decrease
//! on loss, CUBIC's growth curve with its Reno-friendly floor, and the restart after idle. Time is
//! in jiffies, as the kernel keeps it, so CUBIC's curve advances exactly as Linux's does.
//! HyStart (which may leave slow start early on a delay increase) is not modelled: the model's
//! paths have no queue for it to see.

use crate::profile::CongestionControl;

/// Linux's `TCP_INFINITE_SSTHRESH`.
pub(crate) const INFINITE_SSTHRESH: u32 = 0x7fff_ffff;
/// CUBIC's β = 717/1024 ≈ 0.7 (`beta` in tcp_cubic.c).
const CUBIC_BETA: u32 = 717;
const BETA_SCALE: u32 = 1024;
/// CUBIC's time unit: 1/2^10 s (`BICTCP_HZ`).
const BICTCP_HZ: u32 = 10;
/// C = 0.4 segments/s³ as tcp_cubic.c scales it: `bic_scale` (41/1024) times 10.
const CUBE_RTT_SCALE: u64 = 41 * 10;
/// `cube_factor`: K = ∛(cube_factor·(W_max − cwnd)) comes out in 1/1024 s.
const CUBE_FACTOR: u64 = (1 << (10 + 3 * BICTCP_HZ)) / (41 * 10);

#[derive(Clone, Debug)]
pub(crate) struct Window {
    algorithm: CongestionControl,
    /// `snd_cwnd`, segments.
    pub cwnd: u32,
    /// `snd_cwnd_cnt`: acknowledged segments towards the next additive increase.
    cwnd_cnt: u32,
    pub ssthresh: u32,
    cubic: Cubic,
}

/// `struct bictcp`.
#[derive(Clone, Debug, Default)]
struct Cubic {
    /// Increase cwnd by one per `cnt` acknowledged segments.
    cnt: u32,
    last_max_cwnd: u32,
    last_cwnd: u32,
    last_time: u64,
    origin_point: u32,
    /// Time to reach `origin_point`, 1/1024 s (`bic_K`).
    k: u64,
    /// Minimum RTT, jiffies.
    delay_min: u64,
    epoch_start: Option<u64>,
    ack_cnt: u32,
    /// Reno's window estimate (the TCP-friendly region).
    tcp_cwnd: u32,
}

impl Window {
    pub fn new(algorithm: CongestionControl, initial: u32) -> Window {
        Window {
            algorithm,
            cwnd: initial,
            cwnd_cnt: 0,
            ssthresh: INFINITE_SSTHRESH,
            cubic: Cubic::default(),
        }
    }

    pub(crate) fn in_slow_start(&self) -> bool {
        self.cwnd < self.ssthresh
    }

    /// The slow-start threshold after a loss (`ssthresh` op); also remembers the window CUBIC
    /// will grow back towards.
    pub(crate) fn loss_ssthresh(&mut self) -> u32 {
        match self.algorithm {
            CongestionControl::Reno => (self.cwnd >> 1).max(2),
            // The model refuses BBR (Profile::check_model_engine); CUBIC is the fallback.
            CongestionControl::Cubic | CongestionControl::Bbr => {
                let c = &mut self.cubic;
                c.epoch_start = None;
                // Fast convergence: give up bandwidth faster while the maximum keeps falling.
                c.last_max_cwnd = if self.cwnd < c.last_max_cwnd {
                    self.cwnd * (BETA_SCALE + CUBIC_BETA) / (2 * BETA_SCALE)
                } else {
                    self.cwnd
                };
                (self.cwnd * CUBIC_BETA / BETA_SCALE).max(2)
            }
        }
    }

    /// `tcp_current_ssthresh` outside a cwnd reduction.
    pub(crate) fn current_ssthresh(&self) -> u32 {
        self.ssthresh.max((self.cwnd >> 1) + (self.cwnd >> 2))
    }

    /// Entering the Loss state (after an RTO): CUBIC forgets everything (`bictcp_reset`).
    pub(crate) fn on_loss_state(&mut self) {
        self.cubic = Cubic::default();
        self.cwnd_cnt = 0;
    }

    /// `CA_EVENT_TX_START`: the first transmission after the pipe drained. CUBIC does not count
    /// the idle time towards its growth curve.
    pub(crate) fn on_tx_start(&mut self, now: u64, last_send: u64) {
        if let Some(start) = &mut self.cubic.epoch_start {
            let idle = now.saturating_sub(last_send);
            *start = (*start + idle).min(now);
        }
    }

    /// `cong_avoid`: `acked` segments newly delivered while the sender is cwnd-limited.
    pub(crate) fn on_ack(&mut self, acked: u32, now: u64, min_rtt_jiffies: u64) {
        let mut acked = acked;
        if self.in_slow_start() {
            let grown = (self.cwnd + acked).min(self.ssthresh);
            acked -= grown - self.cwnd;
            self.cwnd = grown;
            if acked == 0 {
                return;
            }
        }
        let cnt = match self.algorithm {
            CongestionControl::Reno => self.cwnd,
            CongestionControl::Cubic | CongestionControl::Bbr => {
                self.cubic_update(acked, now, min_rtt_jiffies)
            }
        };
        self.additive_increase(cnt, acked);
    }

    /// `tcp_cong_avoid_ai`: one segment more per `w` acknowledged.
    fn additive_increase(&mut self, w: u32, acked: u32) {
        if self.cwnd_cnt >= w {
            self.cwnd_cnt = 0;
            self.cwnd += 1;
        }
        self.cwnd_cnt += acked;
        if self.cwnd_cnt >= w {
            let delta = self.cwnd_cnt / w;
            self.cwnd_cnt -= delta * w;
            self.cwnd += delta;
        }
    }

    /// `bictcp_update`: how many acknowledged segments earn one more segment of window.
    ///
    /// In the kernel's fixed point, on purpose: time in 1/1024 s, the curve's offset truncated
    /// to whole segments. At the small windows of request-response traffic the truncation is
    /// what decides: after a cut from 4 to 2 segments the curve's target is still 3 (the
    /// offset, 0.95 of a segment, truncates to 0), so the window grows on the next ACKs, where
    /// exact arithmetic (target 2.05) would leave it at 2 for seconds.
    fn cubic_update(&mut self, acked: u32, now: u64, min_rtt_jiffies: u64) -> u32 {
        let cwnd = self.cwnd;
        let c = &mut self.cubic;
        c.delay_min = if c.delay_min == 0 {
            min_rtt_jiffies
        } else {
            c.delay_min.min(min_rtt_jiffies)
        };
        c.ack_cnt += acked;
        // While cwnd holds, Linux keeps `cnt` as it is for 1/32 s: not even the Reno-friendly
        // estimate below moves (the ACKs are only counted).
        if c.last_cwnd == cwnd && now.saturating_sub(c.last_time) <= hz_div(32) {
            return c.cnt;
        }
        // The cubic curve itself is recomputed at most once per jiffy.
        if !(c.epoch_start.is_some() && now == c.last_time) {
            c.last_cwnd = cwnd;
            c.last_time = now;
            if c.epoch_start.is_none() {
                c.epoch_start = Some(now);
                c.ack_cnt = acked;
                c.tcp_cwnd = cwnd;
                if c.last_max_cwnd <= cwnd {
                    c.k = 0;
                    c.origin_point = cwnd;
                } else {
                    c.k = cube_root(CUBE_FACTOR * u64::from(c.last_max_cwnd - cwnd));
                    c.origin_point = c.last_max_cwnd;
                }
            }
            let start = c.epoch_start.unwrap_or(now);
            // Jiffies to 1/1024 s, as `t <<= BICTCP_HZ; do_div(t, HZ)`.
            let t = ((now - start + c.delay_min) << BICTCP_HZ) / u64::from(super::tcp::HZ);
            let target = cubic_target(c.origin_point, c.k, t);
            c.cnt = if target > cwnd {
                cwnd / (target - cwnd)
            } else {
                100 * cwnd
            };
            // The first window of a connection grows at least like slow start's tail.
            if c.last_max_cwnd == 0 && c.cnt > 20 {
                c.cnt = 20;
            }
        }
        // TCP friendliness: never grow slower than Reno would with CUBIC's β.
        let beta_scale = 8 * (BETA_SCALE + CUBIC_BETA) / 3 / (BETA_SCALE - CUBIC_BETA);
        let delta = (cwnd * beta_scale) >> 3;
        if delta > 0 {
            while c.ack_cnt > delta {
                c.ack_cnt -= delta;
                c.tcp_cwnd += 1;
            }
        }
        if c.tcp_cwnd > cwnd {
            let max_cnt = cwnd / (c.tcp_cwnd - cwnd);
            c.cnt = c.cnt.min(max_cnt);
        }
        c.cnt = c.cnt.max(2);
        c.cnt
    }
}

/// The curve W(t) = W_max + C·(t − K)³ at `t` (1/1024 s since the epoch began), as
/// `bictcp_update` computes it: the offset C·|t − K|³ in u64 that wraps, truncated to whole
/// segments, so the target sits on W_max while the offset is under one segment.
fn cubic_target(origin: u32, k: u64, t: u64) -> u32 {
    let offs = t.abs_diff(k);
    let delta = (CUBE_RTT_SCALE
        .wrapping_mul(offs)
        .wrapping_mul(offs)
        .wrapping_mul(offs)
        >> (10 + 3 * BICTCP_HZ)) as u32;
    if t < k {
        origin.wrapping_sub(delta)
    } else {
        origin.wrapping_add(delta)
    }
}

/// ⌊∛x⌋. The kernel's `cubic_root` approximates this (a table and one Newton step, within
/// 0.2 %); K is in 1/1024 s, so the two differ by at most a few milliseconds of the curve.
fn cube_root(x: u64) -> u64 {
    let mut r = (x as f64).cbrt() as u64;
    // Mend the float's rounding in either direction.
    while r > 0 && r.saturating_mul(r).saturating_mul(r) > x {
        r -= 1;
    }
    while (r + 1).saturating_mul(r + 1).saturating_mul(r + 1) <= x {
        r += 1;
    }
    r
}

/// `HZ / n` in jiffies.
fn hz_div(n: u32) -> u64 {
    u64::from(super::tcp::HZ / n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_start_doubles_per_round_and_stops_at_ssthresh() {
        let mut w = Window::new(CongestionControl::Cubic, 10);
        w.on_ack(10, 1, 5);
        assert_eq!(w.cwnd, 20);
        w.ssthresh = 25;
        w.on_ack(20, 2, 5);
        assert!(w.cwnd >= 25 && w.cwnd < 30, "{}", w.cwnd);
    }

    #[test]
    fn cubic_decreases_by_beta_and_reno_by_half() {
        let mut w = Window::new(CongestionControl::Cubic, 100);
        assert_eq!(w.loss_ssthresh(), 70);
        let mut r = Window::new(CongestionControl::Reno, 100);
        assert_eq!(r.loss_ssthresh(), 50);
        let mut small = Window::new(CongestionControl::Cubic, 2);
        assert_eq!(small.loss_ssthresh(), 2, "never below two segments");
    }

    #[test]
    fn reno_grows_one_segment_per_window() {
        let mut w = Window::new(CongestionControl::Reno, 20);
        w.ssthresh = 20;
        for _ in 0..20 {
            w.on_ack(1, 0, 5);
        }
        assert_eq!(w.cwnd, 21);
    }

    /// After a loss, CUBIC's curve climbs back to the old maximum in K = ∛(W_max·(1−β)/C)
    /// seconds; the kernel's truncated offset reaches it ∛(1/C) ≈ 1.36 s before K, and the
    /// target is one RTT ahead of the clock.
    #[test]
    fn cubic_regains_its_maximum_after_k_seconds() {
        let mut w = Window::new(CongestionControl::Cubic, 100);
        w.ssthresh = w.loss_ssthresh();
        w.cwnd = w.ssthresh;
        // K for W_max = 100, β = 0.7: ∛(30/0.4) ≈ 4.22 s. Feed one window of ACKs per 100 ms
        // RTT: long enough that the Reno-friendly floor (≈ 0.53 segment per RTT) stays below
        // the cubic curve, which on short paths it overtakes, as in Linux.
        let hz = u64::from(crate::fault::tcp::HZ);
        let rtt = hz / 10;
        let mut now = 1;
        let mut reached = None;
        while now < 10 * hz {
            let cwnd = w.cwnd;
            for _ in 0..cwnd {
                w.on_ack(1, now, rtt);
            }
            if reached.is_none() && w.cwnd >= 100 {
                reached = Some(now as f64 / hz as f64);
            }
            now += rtt;
        }
        let k = (30.0f64 / 0.4).cbrt();
        let expected = k - (1.0f64 / 0.4).cbrt() - 0.1;
        let t = reached.expect("regains W_max");
        assert!(
            (t - expected).abs() < 0.15 * expected,
            "reached W_max after {t:.2} s, expected {expected:.2} s (K = {k:.2} s)"
        );
    }

    /// The curve in the kernel's fixed point: W_max = 100 cut to 70 gives K = ∛(30/C) = 4.216 s
    /// (4316/1024); the offset truncates to whole segments.
    #[test]
    fn cubic_target_truncates_its_offset_as_the_kernel_does() {
        let k = cube_root(CUBE_FACTOR * 30);
        assert_eq!(k, 4316);
        let at = |secs: f64| cubic_target(100, k, (secs * 1024.0) as u64);
        // At t = 0 the offset is 29.98 segments: 29.
        assert_eq!(at(0.0), 71);
        // 0.4·(4.216 − 2)³ = 4.36: four segments below.
        assert_eq!(at(2.0), 96);
        // Within ∛(1/C) ≈ 1.36 s of K on either side the offset is under one segment.
        assert_eq!(at(3.0), 100);
        assert_eq!(at(5.4), 100);
        // 0.4·2³ = 3.2 above.
        assert_eq!(at(4.216 + 2.0), 103);
        // A window cut from 4 to 2 (W_max 3 after fast convergence) starts with its target
        // still at 3, one RTT (20 ms) in: the offset 0.95 truncates to 0.
        let k = cube_root(CUBE_FACTOR);
        assert_eq!(cubic_target(3, k, 20), 3);
    }
}
