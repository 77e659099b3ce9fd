//! One direction's bottleneck and wire, shared by the model's path and the packet engine, so a
//! profile's `rate`, `queue_limit`, `delay` and `jitter` mean the same thing on both.
//!
//! A packet reaching the bottleneck waits until every packet before it has been serialised,
//! then takes its own serialisation time (`bits / rate`): the bottleneck is a FIFO at the line
//! rate, not a token bucket, since a link never sends a burst faster than its rate. A packet
//! that would take the bytes waiting past `queue_limit` is dropped (drop-tail) and takes no
//! time. The wire then delays it by `delay + jitter` (the caller's draw), never delivering it
//! before the packet in front: jitter alone does not reorder, as on a real path, where the
//! packets of one flow queue behind each other. Under back-to-back traffic each packet's delay
//! is therefore the larger of its own draw and its predecessor's, so the mean delay rises with
//! the jitter (unit-tested below); a lone packet's delay has the profile's mean.

use std::time::Duration;

use crate::profile::LinkParams;

/// What a TCP segment's payload takes on the wire: IPv4 (20) + TCP (20) + the timestamp option
/// (12, on by default in Linux). The packet engine sees whole packets; the model adds this.
pub(crate) const SEGMENT_OVERHEAD: usize = 52;

/// A packet that got through the bottleneck.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Serialised {
    /// Time spent waiting behind other packets.
    pub queued: Duration,
    /// When its last bit left the bottleneck.
    pub done: Duration,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Wire {
    /// When the bottleneck can start serialising the next packet.
    next_free: Duration,
    /// The latest arrival of a packet that kept its place in line.
    last_arrival: Duration,
}

impl Wire {
    /// A packet of `len` bytes (headers included) reaching the bottleneck at `now`; `None` when
    /// the queue is full. `enforce_limit: false` serialises it whatever the backlog (the model's
    /// last retransmission, which Linux would not send again, always gets through).
    pub(crate) fn serialise(
        &mut self,
        params: &LinkParams,
        now: Duration,
        len: usize,
        enforce_limit: bool,
    ) -> Option<Serialised> {
        let Some(bps) = params.rate_bps else {
            // No bottleneck: the packet goes on the wire as it comes.
            return Some(Serialised {
                queued: Duration::ZERO,
                done: now,
            });
        };
        let depart = now.max(self.next_free);
        let backlog_bits = (depart - now).as_secs_f64() * bps as f64;
        let len_bits = (len * 8) as f64;
        if enforce_limit && backlog_bits + len_bits > (params.queue_limit * 8) as f64 {
            return None;
        }
        self.next_free = depart + Duration::from_secs_f64(len_bits / bps as f64);
        Some(Serialised {
            queued: depart - now,
            done: self.next_free,
        })
    }

    /// When a packet that would arrive at `at` (its serialisation plus its delay) is delivered:
    /// never before the packet in front of it.
    pub fn arrive(&mut self, at: Duration) -> Duration {
        self.last_arrival = self.last_arrival.max(at);
        self.last_arrival
    }

    /// When the bottleneck is next free (a reset queues behind the bytes before it): zero
    /// without a rate, so a backlog left by a rate since removed holds nothing up.
    pub(crate) fn next_free(&self, params: &LinkParams) -> Duration {
        match params.rate_bps {
            Some(_) => self.next_free,
            None => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::jittered;
    use crate::profile::Profile;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    const MS: Duration = Duration::from_millis(1);

    fn link(toml: &str) -> LinkParams {
        Profile::parse(toml, "test", "test").unwrap().upstream
    }

    #[test]
    fn each_packet_is_charged_its_own_serialisation_time() {
        // 1500 bytes at 12 Mbit/s: 1 ms each. A lone packet is done 1 ms after it came; a
        // back-to-back train leaves one per ms; an idle gap is not credited to later packets.
        let params = link("[link]\nrate = \"12Mbit\"\n");
        let mut w = Wire::default();
        let done: Vec<_> = (0..3)
            .map(|_| w.serialise(&params, 10 * MS, 1500, true).unwrap())
            .collect();
        assert_eq!(done[0].done, 11 * MS);
        assert_eq!(done[1].done, 12 * MS);
        assert_eq!(done[2].queued, 2 * MS);
        let later = w.serialise(&params, 100 * MS, 1500, true).unwrap();
        assert_eq!((later.queued, later.done), (Duration::ZERO, 101 * MS));
    }

    #[test]
    fn drop_tail_beyond_the_limit_takes_no_time_unless_forced() {
        let params = link("[link]\nrate = \"12Mbit\"\nqueue_limit = 3000\n");
        let mut w = Wire::default();
        assert!(w.serialise(&params, Duration::ZERO, 1500, true).is_some());
        assert!(w.serialise(&params, Duration::ZERO, 1500, true).is_some());
        // The second fits exactly (1500 bytes waiting plus its own 1500); one byte more does not.
        assert!(w.serialise(&params, Duration::ZERO, 1, true).is_none());
        assert_eq!(w.next_free(&params), 2 * MS);
        let forced = w.serialise(&params, Duration::ZERO, 1500, false).unwrap();
        assert_eq!(forced.done, 3 * MS);
    }

    #[test]
    fn jitter_never_reorders_and_raises_the_mean_of_back_to_back_packets() {
        // Uniform ±5 ms around 10 ms. Spaced packets keep the 10 ms mean; a back-to-back train
        // (all at the same instant) is delivered in order at the running maximum of the draws,
        // whose mean over a long train tends to the top of the range.
        let params =
            link("[link]\ndelay = \"10ms\"\njitter = \"5ms\"\njitter_distribution = \"uniform\"\n");
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let n = 20_000u32;
        let mut spaced = Wire::default();
        let mut total = Duration::ZERO;
        for i in 0..n {
            let sent = Duration::from_millis(100) * i;
            let at = spaced.arrive(sent + jittered(&params, params.delay, &mut rng));
            total += at - sent;
        }
        let mean_spaced = total.as_secs_f64() * 1e3 / f64::from(n);
        assert!((mean_spaced - 10.0).abs() < 0.1, "{mean_spaced} ms");

        let mut train = Wire::default();
        let mut last = Duration::ZERO;
        let mut total = Duration::ZERO;
        for _ in 0..n {
            let at = train.arrive(jittered(&params, params.delay, &mut rng));
            assert!(at >= last, "reordered");
            last = at;
            total += at;
        }
        let mean_train = total.as_secs_f64() * 1e3 / f64::from(n);
        assert!(mean_train > 14.9, "{mean_train} ms");
    }
}
