//! The arithmetic of calibration, pure: a sample's summary, the model / kernel ratios with
//! their bootstrap intervals, the verdict, and the table. No clock, no sockets.

use std::fmt::Write;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One statistic compared between the engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    Mean,
    P50,
    P90,
    P99,
}

impl Stat {
    pub const ALL: [Stat; 4] = [Stat::Mean, Stat::P50, Stat::P90, Stat::P99];

    pub fn name(self) -> &'static str {
        match self {
            Stat::Mean => "mean",
            Stat::P50 => "p50",
            Stat::P90 => "p90",
            Stat::P99 => "p99",
        }
    }

    /// How far model / kernel may be from 1: the centre of a distribution is held tighter than
    /// its tail, which rests on far fewer samples.
    pub fn tolerance(self) -> f64 {
        match self {
            Stat::Mean | Stat::P50 => 0.10,
            Stat::P90 | Stat::P99 => 0.15,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What the samples measure, and so which statistics decide the verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Call latencies in ms: every statistic is checked.
    Latency,
    /// A bulk flow's rate in Mbit/s per time slice: only the mean rate is checked (the slices'
    /// quantiles are shown, but a slice is too short to be a call's worth of evidence).
    Throughput,
}

impl Kind {
    pub fn unit(self) -> &'static str {
        match self {
            Kind::Latency => "ms",
            Kind::Throughput => "Mbit/s",
        }
    }

    pub fn checked(self) -> &'static [Stat] {
        match self {
            Kind::Latency => &Stat::ALL,
            Kind::Throughput => &[Stat::Mean],
        }
    }
}

/// Mean and quantiles of one engine's samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub n: usize,
    /// Indexed by [`Stat`]: mean, p50, p90, p99.
    pub values: [f64; 4],
}

impl Summary {
    /// `None` for no samples.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Summary::of_sorted(&sorted))
    }

    fn of_sorted(sorted: &[f64]) -> Summary {
        let mean = sorted.iter().sum::<f64>() / sorted.len() as f64;
        Summary {
            n: sorted.len(),
            values: [
                mean,
                quantile(sorted, 0.50),
                quantile(sorted, 0.90),
                quantile(sorted, 0.99),
            ],
        }
    }

    pub fn get(&self, stat: Stat) -> f64 {
        self.values[stat.index()]
    }
}

/// Nearest-rank quantile of sorted, non-empty samples: the smallest sample with at least a
/// fraction `q` of the samples at or below it (so p99 of 100 samples is the 99th, not the max).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Model / kernel for each statistic, with a bootstrap 95 % interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ratios {
    pub point: [f64; 4],
    pub low: [f64; 4],
    pub high: [f64; 4],
}

impl Ratios {
    pub fn get(&self, stat: Stat) -> (f64, f64, f64) {
        let i = stat.index();
        (self.point[i], self.low[i], self.high[i])
    }
}

/// Resamples per bootstrap: enough that the 2.5 % and 97.5 % points each rest on 25 resamples.
pub(crate) const RESAMPLES: usize = 1000;

/// The ratios model / kernel of each statistic, and a percentile-bootstrap 95 % interval: both
/// sample sets are resampled with replacement (independently: the engines ran apart), the
/// ratio recomputed, and the 2.5th and 97.5th percentiles of the `resamples` ratios kept. The
/// same seed gives the same interval. `None` if either side has no samples.
pub fn ratios(model: &[f64], kernel: &[f64], seed: u64, resamples: usize) -> Option<Ratios> {
    let point_m = Summary::of(model)?;
    let point_k = Summary::of(kernel)?;
    let point = std::array::from_fn(|i| point_m.values[i] / point_k.values[i]);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut draws: [Vec<f64>; 4] = Default::default();
    let mut m = vec![0.0; model.len()];
    let mut k = vec![0.0; kernel.len()];
    for _ in 0..resamples.max(1) {
        for (into, from) in [(&mut m, model), (&mut k, kernel)] {
            for slot in into.iter_mut() {
                *slot = from[rng.random_range(0..from.len())];
            }
            into.sort_by(f64::total_cmp);
        }
        let (sm, sk) = (Summary::of_sorted(&m), Summary::of_sorted(&k));
        for (i, d) in draws.iter_mut().enumerate() {
            d.push(sm.values[i] / sk.values[i]);
        }
    }
    let mut low = [0.0; 4];
    let mut high = [0.0; 4];
    for (i, d) in draws.iter_mut().enumerate() {
        d.sort_by(f64::total_cmp);
        low[i] = quantile(d, 0.025);
        high[i] = quantile(d, 0.975);
    }
    Some(Ratios { point, low, high })
}

/// The statistics of `kind` whose point ratio is out of tolerance (not a number counts as out).
pub fn failing(kind: Kind, ratios: &Ratios) -> Vec<Stat> {
    kind.checked()
        .iter()
        .copied()
        .filter(|s| {
            let r = ratios.get(*s).0;
            // The edge is in (1.1 is within 10 %, whatever its last bit says), and a NaN ratio
            // compares as neither, so it is out.
            let edge = s.tolerance() + 1e-9;
            !matches!(
                (r - 1.0).abs().partial_cmp(&edge),
                Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
            )
        })
        .collect()
}

/// `ok`, or `OUT` and the failing statistics: `OUT mean p99`.
pub fn verdict(failing: &[Stat]) -> String {
    if failing.is_empty() {
        return "ok".into();
    }
    let names: Vec<_> = failing.iter().map(|s| s.name()).collect();
    format!("OUT {}", names.join(" "))
}

/// One workload's comparison on one profile.
#[derive(Clone, Debug)]
pub struct Comparison {
    pub workload: String,
    pub kind: Kind,
    pub model: Summary,
    pub kernel: Summary,
    pub ratios: Ratios,
}

impl Comparison {
    pub fn failing(&self) -> Vec<Stat> {
        failing(self.kind, &self.ratios)
    }
}

/// The table of one profile: the engines' statistics, the ratios with their intervals below
/// them, and the verdicts.
pub(crate) fn render(profile: &str, rows: &[Comparison]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{profile}: model / kernel (latency ms, bulk Mbit/s; ratio [bootstrap 95 % interval])"
    );
    let _ = writeln!(
        t,
        "{:<9} {:>6} | {:>8} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} {:>8} | {:>5} {:>5} {:>5} {:>5} | verdict",
        "workload", "unit", "m mean", "m p50", "m p90", "m p99", "k mean", "k p50", "k p90",
        "k p99", "mean", "p50", "p90", "p99"
    );
    for c in rows {
        let _ = write!(t, "{:<9} {:>6} |", c.workload, c.kind.unit());
        for s in [&c.model, &c.kernel] {
            for v in s.values {
                let _ = write!(t, " {v:>8.1}");
            }
            t += " |";
        }
        for v in c.ratios.point {
            let _ = write!(t, " {v:>5.2}");
        }
        let _ = writeln!(t, " | {}", verdict(&c.failing()));
        let _ = write!(t, "{:<16} |{:>36} |{:>36} |", "", "", "");
        for i in 0..4 {
            let _ = write!(t, " {:.2}-{:.2}", c.ratios.low[i], c.ratios.high[i]);
        }
        t += "\n";
    }
    t
}

/// The CDF of samples as (value, fraction at or below it), at most `points` points (every
/// k-th sample and the last), for plotting.
pub(crate) fn cdf(samples: &[f64], points: usize) -> Vec<(f64, f64)> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let step = n.div_ceil(points.max(1)).max(1);
    let mut out: Vec<(f64, f64)> = (step - 1..n)
        .step_by(step)
        .map(|i| (sorted[i], (i + 1) as f64 / n as f64))
        .collect();
    if n > 0 && out.last().map(|p| p.1) != Some(1.0) {
        out.push((sorted[n - 1], 1.0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.9), 90.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
        let s = Summary::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!(s.values, [4.0, 2.0, 10.0, 10.0]);
        assert_eq!(s.n, 4);
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn identical_samples_give_ratio_one_and_a_tight_interval() {
        let v: Vec<f64> = (0..500).map(|i| 20.0 + (i % 7) as f64).collect();
        let r = ratios(&v, &v, 1, RESAMPLES).unwrap();
        assert_eq!(r.point, [1.0; 4]);
        for i in 0..4 {
            assert!(r.low[i] <= 1.0 && r.high[i] >= 1.0, "{r:?}");
            assert!(r.high[i] - r.low[i] < 0.1, "{r:?}");
        }
        assert!(failing(Kind::Latency, &r).is_empty());
    }

    #[test]
    fn a_scaled_sample_has_that_ratio_inside_its_interval() {
        let kernel: Vec<f64> = (0..400).map(|i| 10.0 + (i * 37 % 101) as f64).collect();
        let model: Vec<f64> = kernel.iter().map(|v| v * 1.5).collect();
        let r = ratios(&model, &kernel, 7, RESAMPLES).unwrap();
        for i in 0..4 {
            assert!((r.point[i] - 1.5).abs() < 1e-9, "{r:?}");
            assert!(r.low[i] <= r.point[i] && r.point[i] <= r.high[i], "{r:?}");
        }
        assert_eq!(failing(Kind::Latency, &r), Stat::ALL.to_vec());
        assert_eq!(verdict(&failing(Kind::Latency, &r)), "OUT mean p50 p90 p99");
    }

    #[test]
    fn the_bootstrap_is_seeded_and_the_seed_matters() {
        let a: Vec<f64> = (0..300).map(|i| (i * 13 % 97) as f64 + 1.0).collect();
        let b: Vec<f64> = (0..300).map(|i| (i * 29 % 89) as f64 + 1.0).collect();
        assert_eq!(ratios(&a, &b, 3, 200), ratios(&a, &b, 3, 200));
        assert_ne!(ratios(&a, &b, 3, 200), ratios(&a, &b, 4, 200));
    }

    #[test]
    fn a_wide_noisy_sample_has_a_wide_interval() {
        // Ten samples with one far outlier: p99 of a resample swings between the outlier and
        // the rest, so its interval must span both.
        let mut kernel = vec![20.0; 9];
        kernel.push(200.0);
        let r = ratios(&kernel, &kernel, 5, RESAMPLES).unwrap();
        let (p, lo, hi) = r.get(Stat::P99);
        assert_eq!(p, 1.0);
        assert!(lo <= 0.2 && hi >= 5.0, "{lo} {hi}");
    }

    #[test]
    fn tolerances_at_their_edges() {
        let at = |point: [f64; 4]| Ratios {
            point,
            low: point,
            high: point,
        };
        assert!(failing(Kind::Latency, &at([1.1, 0.9, 1.15, 0.85])).is_empty());
        assert_eq!(
            failing(Kind::Latency, &at([1.11, 1.0, 1.0, 0.84])),
            [Stat::Mean, Stat::P99]
        );
        assert_eq!(
            failing(Kind::Latency, &at([1.0, 1.0, 1.16, 1.0])),
            [Stat::P90]
        );
        // Bulk: only the mean rate counts.
        assert!(failing(Kind::Throughput, &at([0.95, 3.0, 3.0, 3.0])).is_empty());
        assert_eq!(
            failing(Kind::Throughput, &at([40.0, 1.0, 1.0, 1.0])),
            [Stat::Mean]
        );
        // A ratio that is not a number (a zero on both sides) is out, never silently ok.
        assert_eq!(
            failing(Kind::Throughput, &at([f64::NAN, 1.0, 1.0, 1.0])),
            [Stat::Mean]
        );
        assert_eq!(verdict(&[]), "ok");
    }

    #[test]
    fn the_table_names_the_failing_statistics() {
        let kernel = Summary::of(&[20.0, 21.0, 40.0]).unwrap();
        let model = Summary::of(&[20.0, 21.0, 240.0]).unwrap();
        let c = Comparison {
            workload: "order".into(),
            kind: Kind::Latency,
            model,
            kernel,
            ratios: ratios(&[20.0, 21.0, 240.0], &[20.0, 21.0, 40.0], 0, 100).unwrap(),
        };
        let t = render("lossy-10ms-1pct", &[c]);
        let row = t.lines().nth(2).unwrap();
        assert!(row.starts_with("order"), "{t}");
        assert!(row.ends_with("OUT mean p90 p99"), "{t}");
        assert!(t.lines().nth(3).unwrap().contains('-'), "{t}");
    }

    #[test]
    fn cdf_points_rise_to_one() {
        let v: Vec<f64> = (0..1000).rev().map(f64::from).collect();
        let c = cdf(&v, 100);
        assert!(c.len() <= 101 && c.len() >= 100, "{}", c.len());
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert_eq!(*c.last().unwrap(), (999.0, 1.0));
        assert_eq!(cdf(&[5.0], 100), [(5.0, 1.0)]);
        assert!(cdf(&[], 100).is_empty());
    }
}
