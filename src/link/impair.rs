//! What happens to each packet on one direction of a link: pure and seeded, like the fault
//! model, so it is tested on a virtual clock with no devices.
//!
//! A packet arriving at time `now` meets, in order:
//! 1. the bottleneck queue ([`Wire`], the same as the model's): with a `rate`, it is serialised
//!    once every packet before it has been, taking `bits / rate`; if the bytes still waiting for
//!    the wire would exceed `queue_limit`, it is dropped (drop-tail);
//! 2. the wire: lost with the loss process (Bernoulli or Gilbert–Elliott, on *every* packet:
//!    SYNs, pure ACKs, UDP); otherwise delivered `delay + jitter` after it finished serialising,
//!    never before the packet in front of it (jitter alone does not reorder, as on a real path);
//! 3. the packet-only faults, netem's meanings: `reorder` — the packet skips the delay and may
//!    overtake those in flight; `duplicate` — delivered twice; `corrupt` — one bit flipped.
//!
//! Every packet takes the same draws from each stream whatever happens to it, so the same seed
//! loses the same packet *ordinals* however the timing went.

use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::fault::wire::Wire;
use crate::fault::{draw_loss, jittered, LossState};
use crate::profile::LinkParams;

/// Why the engine dropped a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DropCause {
    /// The loss process.
    Loss,
    /// The bottleneck queue was full.
    Queue,
}

/// One packet's fate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fate {
    Dropped(DropCause),
    Delivered(Delivery),
}

/// A packet that reaches the other end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Delivery {
    /// When it is handed to the other end (time since the link started).
    pub at: Duration,
    /// Time spent waiting for the bottleneck before serialising.
    pub queued: Duration,
    /// Delivered a second time, right behind the first.
    pub duplicate: bool,
    /// Skipped the delay (`reorder`).
    pub reordered: bool,
    /// Flip one bit: this draw picks which (see [`corrupt_bit`]).
    pub corrupt: Option<u64>,
}

/// The random streams of one direction: one per concern, so adding a fault to a profile never
/// moves another fault's draws.
pub(crate) struct Streams {
    pub loss: ChaCha8Rng,
    pub jitter: ChaCha8Rng,
    pub faults: ChaCha8Rng,
}

/// One direction of a link.
pub(crate) struct PacketImpairment {
    params: LinkParams,
    streams: Streams,
    /// Gilbert–Elliott state.
    loss_state: LossState,
    /// The bottleneck queue and the in-order wire.
    wire: Wire,
}

impl PacketImpairment {
    pub fn new(params: &LinkParams, streams: Streams) -> PacketImpairment {
        PacketImpairment {
            params: params.clone(),
            streams,
            loss_state: LossState::default(),
            wire: Wire::default(),
        }
    }

    /// New parameters for the packets from now on (see [`super::Link::retune`]).
    pub fn retune(&mut self, params: &LinkParams) {
        self.params = params.clone();
    }

    /// The fate of a packet of `len` bytes that arrived at `now`.
    pub fn packet(&mut self, now: Duration, len: usize) -> Fate {
        // Draws first, the same number for every packet.
        let lost = draw_loss(
            &self.params.loss,
            &mut self.loss_state,
            &mut self.streams.loss,
            now,
        );
        let faults = &mut self.streams.faults;
        let reordered = faults.random::<f64>() < self.params.reorder;
        let duplicate = faults.random::<f64>() < self.params.duplicate;
        let corrupt_draw: u64 = faults.random();
        let corrupt = (faults.random::<f64>() < self.params.corrupt).then_some(corrupt_draw);
        let jittered_delay = jittered(&self.params, self.params.delay, &mut self.streams.jitter);

        let Some(serialised) = self.wire.serialise(&self.params, now, len, true) else {
            return Fate::Dropped(DropCause::Queue);
        };
        if lost {
            return Fate::Dropped(DropCause::Loss);
        }
        let at = if reordered {
            serialised.done
        } else {
            self.wire.arrive(serialised.done + jittered_delay)
        };
        Fate::Delivered(Delivery {
            at,
            queued: serialised.queued,
            duplicate,
            reordered,
            corrupt,
        })
    }
}

/// The bit a corruption flips in an IP packet: one of the bits after the IP header, so the
/// transport's checksum is what notices (a flipped header bit would make the packet unwritable
/// rather than corrupt). `None` for a packet with nothing after its header.
pub(crate) fn corrupt_bit(packet: &[u8], draw: u64) -> Option<usize> {
    let header = match packet.first()? >> 4 {
        4 => usize::from(packet[0] & 0x0f) * 4,
        6 => 40,
        _ => return None,
    };
    let payload_bits = packet.len().checked_sub(header)?.checked_mul(8)?;
    (payload_bits > 0).then(|| header * 8 + (draw % payload_bits as u64) as usize)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::profile::{LossProcess, Profile};

    const MS: Duration = Duration::from_millis(1);

    fn streams(seed: u64) -> Streams {
        let rng = |n| {
            let mut r = ChaCha8Rng::seed_from_u64(seed);
            r.set_stream(n);
            r
        };
        Streams {
            loss: rng(0),
            jitter: rng(1),
            faults: rng(2),
        }
    }

    fn link(src: &str) -> LinkParams {
        Profile::parse(src, "test", "test").unwrap().upstream
    }

    /// Half-width of the 99.9 % normal-approximation binomial interval.
    fn binomial(p: f64, n: usize) -> f64 {
        3.29 * (p * (1.0 - p) / n as f64).sqrt()
    }

    /// What becomes of `n` full-size packets sent `gap` apart.
    fn send_packets(params: &LinkParams, seed: u64, n: usize, gap: Duration) -> Vec<Fate> {
        let mut imp = PacketImpairment::new(params, streams(seed));
        (0..n).map(|i| imp.packet(gap * i as u32, 1500)).collect()
    }

    fn delivered(fates: &[Fate]) -> impl Iterator<Item = &Delivery> {
        fates.iter().filter_map(|f| match f {
            Fate::Delivered(d) => Some(d),
            Fate::Dropped(_) => None,
        })
    }

    #[test]
    fn delay_and_loss_rate_match_the_profile_over_many_packets() {
        let params = link("[link]\ndelay = \"10ms\"\nloss = 0.01\n");
        let n = 100_000;
        let fates = send_packets(&params, 3, n, MS / 10);
        let lost = fates
            .iter()
            .filter(|f| **f == Fate::Dropped(DropCause::Loss))
            .count();
        let rate = lost as f64 / n as f64;
        assert!((rate - 0.01).abs() < binomial(0.01, n), "loss {rate}");
        for (i, f) in fates.iter().enumerate() {
            if let Fate::Delivered(d) = f {
                assert_eq!(d.at, MS / 10 * i as u32 + 10 * MS, "packet {i}");
            }
        }
    }

    #[test]
    fn same_seed_drops_the_same_ordinals_whatever_the_timing() {
        // A queue that never fills: only the timing differs between the two runs.
        let params = link("[link]\nloss = 0.05\nrate = \"10Mbit\"\nqueue_limit = \"20MB\"\n");
        let drops = |seed, gap| -> Vec<usize> {
            send_packets(&params, seed, 10_000, gap)
                .iter()
                .enumerate()
                .filter(|(_, f)| **f == Fate::Dropped(DropCause::Loss))
                .map(|(i, _)| i)
                .collect()
        };
        assert_eq!(drops(9, MS), drops(9, MS / 1000));
        assert_ne!(drops(9, MS), drops(10, MS));
    }

    #[test]
    fn gilbert_elliott_loses_in_bursts_at_its_stationary_rate() {
        let params = link("[link.burst]\np = 0.01\nr = 0.3\n");
        let n = 200_000;
        let fates = send_packets(&params, 5, n, MS);
        let lost: Vec<bool> = fates
            .iter()
            .map(|f| matches!(f, Fate::Dropped(_)))
            .collect();
        let rate = lost.iter().filter(|l| **l).count() as f64 / n as f64;
        let expect = LossProcess::GilbertElliott {
            p: 0.01,
            r: 0.3,
            h: 0.0,
            k: 1.0,
            step: None,
        }
        .mean_loss();
        assert!((rate - expect).abs() < 0.1 * expect, "{rate} vs {expect}");
        // Mean burst length 1/r.
        let bursts = lost.windows(2).filter(|w| !w[0] && w[1]).count();
        let mean_burst = lost.iter().filter(|l| **l).count() as f64 / bursts as f64;
        assert!((mean_burst - 1.0 / 0.3).abs() < 0.4, "burst {mean_burst}");
    }

    #[test]
    fn the_queue_serialises_at_the_rate_and_drops_beyond_its_limit() {
        // 12 Mbit/s: a 1500-byte packet takes exactly 1 ms on the wire.
        let params = link("[link]\nrate = \"12Mbit\"\nqueue_limit = 15000\n");
        let mut imp = PacketImpairment::new(&params, streams(1));
        // 20 packets at once: the first 10 fit in 15 000 bytes, the rest are dropped.
        let fates: Vec<Fate> = (0..20).map(|_| imp.packet(Duration::ZERO, 1500)).collect();
        for (i, f) in fates.iter().enumerate() {
            match f {
                Fate::Delivered(d) => {
                    assert!(i < 10, "packet {i} should have been dropped");
                    assert_eq!(d.at, MS * (i as u32 + 1));
                    assert_eq!(d.queued, MS * i as u32);
                }
                Fate::Dropped(cause) => {
                    assert!(i >= 10, "packet {i} dropped");
                    assert_eq!(*cause, DropCause::Queue);
                }
            }
        }
        // Once the queue has drained, packets flow again.
        assert!(matches!(imp.packet(20 * MS, 1500), Fate::Delivered(_)));
    }

    #[test]
    fn jitter_never_reorders_but_reorder_does() {
        let params = link("[link]\ndelay = \"10ms\"\njitter = \"5ms\"\n");
        let fates = send_packets(&params, 2, 10_000, MS / 10);
        let times: Vec<Duration> = delivered(&fates).map(|d| d.at).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));

        let params = link("[link]\ndelay = \"10ms\"\nreorder = 0.25\n");
        let n = 40_000;
        let fates = send_packets(&params, 2, n, MS / 10);
        let reordered = delivered(&fates).filter(|d| d.reordered).count();
        let rate = reordered as f64 / n as f64;
        assert!((rate - 0.25).abs() < binomial(0.25, n), "reorder {rate}");
        for (i, f) in fates.iter().enumerate() {
            if let Fate::Delivered(d) = f {
                // A reordered packet skips the 10 ms, so it overtakes those sent before it.
                let delay = if d.reordered { Duration::ZERO } else { 10 * MS };
                assert_eq!(d.at, MS / 10 * i as u32 + delay, "packet {i}");
            }
        }
        let times: Vec<Duration> = delivered(&fates).map(|d| d.at).collect();
        assert!(times.windows(2).any(|w| w[0] > w[1]), "nothing overtaken");
    }

    #[test]
    fn duplicate_and_corrupt_at_their_rates() {
        let params = link("[link]\nduplicate = 0.1\ncorrupt = 0.02\n");
        let n = 50_000;
        let fates = send_packets(&params, 4, n, MS);
        let dup = delivered(&fates).filter(|d| d.duplicate).count() as f64 / n as f64;
        let bad = delivered(&fates).filter(|d| d.corrupt.is_some()).count() as f64 / n as f64;
        assert!((dup - 0.1).abs() < binomial(0.1, n), "duplicate {dup}");
        assert!((bad - 0.02).abs() < binomial(0.02, n), "corrupt {bad}");
    }

    #[test]
    fn corruption_lands_after_the_ip_header() {
        let mut v4 = vec![0u8; 60];
        v4[0] = 0x46; // IPv4, 24-byte header
        for draw in [0, 1, 7, 12_345, u64::MAX] {
            let bit = corrupt_bit(&v4, draw).unwrap();
            assert!((24 * 8..60 * 8).contains(&bit), "{bit}");
        }
        let mut v6 = vec![0u8; 41];
        v6[0] = 0x60;
        assert_eq!(corrupt_bit(&v6, 3), Some(40 * 8 + 3));
        assert_eq!(corrupt_bit(&v6[..40], 3), None);
        assert_eq!(corrupt_bit(&[0x10, 0, 0], 3), None);
        assert_eq!(corrupt_bit(&[], 3), None);
    }
}
