//! Network profiles: the TOML files of `profiles/`, parsed, validated and resolved into the
//! effective per-direction parameters the fault model runs on.
//!
//! A profile file has a `[link]` table that applies to both directions and optional
//! `[upstream]` / `[downstream]` tables that override single fields of it. Every error names the
//! file, the line and the key, because a profile is usually written by hand.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::units::{at_most, format_duration, format_rate, parse_duration, parse_rate, parse_size};

/// Default maximum segment size: a 1500-byte Ethernet MTU minus IP/TCP headers and timestamps.
pub(crate) const DEFAULT_MSS: u32 = 1448;
/// Linux `TCP_RTO_MIN`.
pub(crate) const DEFAULT_RTO_MIN: Duration = Duration::from_millis(200);
/// Linux `TCP_TIMEOUT_INIT`: the first SYN retransmission timeout.
pub(crate) const DEFAULT_SYN_RTO: Duration = Duration::from_secs(1);
/// The longest delay, jitter or timeout a profile (or a latency toxic) may set: an hour is past
/// any network, and the model multiplies these (an RTO backs off 2^15 times, a Pareto jitter
/// draw reaches some 10^5 times its mean), so their products must stay far inside `Duration`.
pub(crate) const MAX_PROFILE_DURATION: Duration = Duration::from_secs(3600);

/// The built-in profiles, embedded so `--profile NAME` works from any directory.
const BUILTIN: &[(&str, &str)] = &[
    ("local", include_str!("../profiles/local.toml")),
    ("lan", include_str!("../profiles/lan.toml")),
    ("lan-wifi", include_str!("../profiles/lan-wifi.toml")),
    (
        "lossy-10ms-1pct",
        include_str!("../profiles/lossy-10ms-1pct.toml"),
    ),
    ("wan", include_str!("../profiles/wan.toml")),
    ("longhaul", include_str!("../profiles/longhaul.toml")),
    ("bursty", include_str!("../profiles/bursty.toml")),
    ("clean-10ms", include_str!("../profiles/clean-10ms.toml")),
];

/// A fully resolved network condition: every field has its effective value.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Name used in CSV rows, logs and RNG stream derivation.
    pub name: String,
    /// Free text for `profiles list`.
    pub description: String,
    /// Client → server bytes.
    pub upstream: LinkParams,
    /// Server → client bytes.
    pub downstream: LinkParams,
    /// Cost of opening a connection.
    pub connect: ConnectParams,
}

/// The impairment of one direction of a connection.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkParams {
    /// Constant one-way propagation delay.
    pub delay: Duration,
    /// Spread of the per-segment jitter; its meaning depends on `jitter_distribution`.
    pub jitter: Duration,
    pub jitter_distribution: JitterDistribution,
    /// Which segments are "lost" (and so stall until retransmitted).
    pub loss: LossProcess,
    /// Bottleneck rate in bits per second; `None` is unlimited.
    pub rate_bps: Option<u64>,
    /// Bytes per virtual segment: the unit of loss and of jitter.
    pub mss: u32,
    /// Floor of the retransmission timeout.
    pub rto_min: Duration,
    /// The sender's congestion control: pinned on the packet engines' sockets.
    pub congestion_control: CongestionControl,
    /// Byte limit of the bottleneck's queue (drop-tail beyond it): the packet engines drop the
    /// packet, the model loses the segment (`fault::wire`).
    pub queue_limit: u64,
    /// Packet engines only: probability that a packet skips the delay (netem's `reorder`).
    pub reorder: f64,
    /// Packet engines only: probability that a packet is delivered twice.
    pub duplicate: f64,
    /// Packet engines only: probability that one bit of a packet is flipped.
    pub corrupt: f64,
}

/// A TCP congestion control algorithm, by its Linux name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CongestionControl {
    /// Linux's default on most distributions.
    Cubic,
    /// Paces every flight; treats random loss very differently from CUBIC.
    Bbr,
    Reno,
}

impl CongestionControl {
    pub const ALL: [CongestionControl; 3] = [
        CongestionControl::Cubic,
        CongestionControl::Bbr,
        CongestionControl::Reno,
    ];

    /// The name `TCP_CONGESTION` and `tcp_congestion_control` take.
    pub fn as_str(self) -> &'static str {
        match self {
            CongestionControl::Cubic => "cubic",
            CongestionControl::Bbr => "bbr",
            CongestionControl::Reno => "reno",
        }
    }
}

/// netem's default queue: 1000 full-size packets.
pub(crate) const DEFAULT_QUEUE_LIMIT: u64 = 1000 * 1500;

/// How a jitter draw is added to the one-way delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JitterDistribution {
    /// Uniform on `[-jitter, +jitter]` (netem's default), mean 0.
    Uniform,
    /// Normal with standard deviation `jitter`, mean 0.
    Normal,
    /// Heavy-tailed, never negative: Lomax (Pareto II, shape 3) with mean `jitter`.
    Pareto,
}

impl JitterDistribution {
    fn as_str(self) -> &'static str {
        match self {
            JitterDistribution::Uniform => "uniform",
            JitterDistribution::Normal => "normal",
            JitterDistribution::Pareto => "pareto",
        }
    }
}

/// The segment loss process of one direction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LossProcess {
    None,
    /// Each segment is lost independently with probability `p`.
    Bernoulli {
        p: f64,
    },
    /// Gilbert–Elliott, with tc-netem `gemodel`'s parameters: `p` good→bad, `r` bad→good,
    /// `h` probability a segment is *delivered* in the bad state, `k` in the good state
    /// (netem's command line takes `1-h` and `1-k`).
    GilbertElliott {
        p: f64,
        r: f64,
        h: f64,
        k: f64,
        /// `None`: the state takes one step per packet, as netem's does. `Some(d)`: one step
        /// per `d` of time whatever the traffic, so a burst is a stretch of time: a
        /// retransmission an RTO later meets a fresh state, not the burst that lost the
        /// original (see [`crate::fault::LossState`]).
        step: Option<Duration>,
    },
}

impl LossProcess {
    /// The long-run fraction of segments lost.
    pub(crate) fn mean_loss(&self) -> f64 {
        match *self {
            LossProcess::None => 0.0,
            LossProcess::Bernoulli { p } => p,
            LossProcess::GilbertElliott { p, r, h, k, .. } => {
                if p + r == 0.0 {
                    1.0 - k
                } else {
                    let bad = p / (p + r);
                    bad * (1.0 - h) + (1.0 - bad) * (1.0 - k)
                }
            }
        }
    }
}

/// The cost of a new connection's handshake.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnectParams {
    /// Retransmission timeout of a lost SYN or SYN-ACK.
    pub syn_rto: Duration,
    pub syn_backoff: SynBackoff,
}

/// How repeated SYN losses back off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SynBackoff {
    /// 1 s, 2 s, 4 s, … (classic Linux).
    Exponential,
    /// Linux ≥ 6.5 (`tcp_syn_linear_timeouts` = 4): the client's SYN waits `syn_rto` for its
    /// first five timeouts, then doubles (1, 1, 1, 1, 1, 2, 4 s); the SYN-ACK always doubles.
    Linear,
}

impl LinkParams {
    /// No impairment at all: the proxy may copy bytes straight through.
    pub(crate) fn is_unimpaired(&self) -> bool {
        self.delay.is_zero()
            && self.jitter.is_zero()
            && self.loss.mean_loss() == 0.0
            && self.rate_bps.is_none()
            && self.packet_only_keys().next().is_none()
    }

    /// The keys set here that only a packet engine can honour (a byte stream cannot be
    /// reordered, duplicated or corrupted without breaking TCP's promise).
    pub(crate) fn packet_only_keys(&self) -> impl Iterator<Item = &'static str> {
        [
            ("reorder", self.reorder),
            ("duplicate", self.duplicate),
            ("corrupt", self.corrupt),
        ]
        .into_iter()
        .filter(|(_, p)| *p > 0.0)
        .map(|(key, _)| key)
    }
}

impl Default for LinkParams {
    fn default() -> Self {
        LinkParams {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            jitter_distribution: JitterDistribution::Uniform,
            loss: LossProcess::None,
            rate_bps: None,
            mss: DEFAULT_MSS,
            rto_min: DEFAULT_RTO_MIN,
            congestion_control: CongestionControl::Cubic,
            queue_limit: DEFAULT_QUEUE_LIMIT,
            reorder: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
        }
    }
}

impl Profile {
    /// True when neither direction is impaired: the proxy's copy fast path applies.
    pub(crate) fn is_unimpaired(&self) -> bool {
        self.upstream.is_unimpaired() && self.downstream.is_unimpaired()
    }

    /// Names of the built-in profiles, in the order `profiles list` shows them.
    pub(crate) fn builtin_names() -> impl Iterator<Item = &'static str> {
        BUILTIN.iter().map(|(name, _)| *name)
    }

    /// Refuses a profile that needs a packet engine, naming the first such key: the model
    /// proxy works on a byte stream and cannot honour it. `origin` names where it came from.
    pub(crate) fn check_model_engine(&self, origin: &str) -> Result<(), ProfileError> {
        for (table, link) in [
            ("upstream", &self.upstream),
            ("downstream", &self.downstream),
        ] {
            if let Some(key) = link.packet_only_keys().next() {
                return Err(ProfileError {
                    origin: origin.to_string(),
                    line: None,
                    key: Some(format!("{table}.{key}")),
                    message: format!(
                        "`{key}` works on packets, which only the packet engines have; the model \
                         proxy works on a byte stream and cannot honour it: use --engine kernel \
                         (or link), or remove the key"
                    ),
                });
            }
            if link.congestion_control == CongestionControl::Bbr {
                return Err(ProfileError {
                    origin: origin.to_string(),
                    line: None,
                    key: Some(format!("{table}.congestion_control")),
                    message: "the model's sender implements cubic and reno; BBR paces its \
                              flights by a bandwidth model it does not have: use --engine kernel \
                              (or link) for bbr"
                        .to_string(),
                });
            }
        }
        Ok(())
    }

    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Option<Profile> {
        let (_, src) = BUILTIN.iter().find(|(n, _)| *n == name)?;
        let origin = format!("<built-in profile {name}>");
        Some(Profile::parse(src, &origin, name).expect("built-in profiles are valid"))
    }

    /// A built-in profile by name, or a profile file by path (anything containing a `/` or
    /// ending in `.toml` is a path).
    pub fn load(name_or_path: &str) -> Result<Profile, ProfileError> {
        let looks_like_path = name_or_path.contains('/') || name_or_path.ends_with(".toml");
        if !looks_like_path {
            if let Some(p) = Profile::builtin(name_or_path) {
                return Ok(p);
            }
            let known: Vec<_> = Profile::builtin_names().collect();
            return Err(ProfileError {
                origin: name_or_path.to_string(),
                line: None,
                key: None,
                message: format!(
                    "no built-in profile with this name (built-in: {}); a file path must end in .toml",
                    known.join(", ")
                ),
            });
        }
        Profile::load_file(Path::new(name_or_path))
    }

    /// Reads and validates a profile file.
    pub(crate) fn load_file(path: &Path) -> Result<Profile, ProfileError> {
        let origin = path.display().to_string();
        let src = std::fs::read_to_string(path).map_err(|e| ProfileError {
            origin: origin.clone(),
            line: None,
            key: None,
            message: format!("cannot read: {e}"),
        })?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Profile::parse(&src, &origin, &stem)
    }

    /// Parses profile TOML. `origin` names the source in errors; `default_name` is used when the
    /// file has no `name`.
    pub fn parse(src: &str, origin: &str, default_name: &str) -> Result<Profile, ProfileError> {
        let raw: RawProfile = toml::from_str(src).map_err(|e| {
            let (line, key) = match e.span() {
                Some(span) => {
                    let (line, key) = locate(src, span.start);
                    (Some(line), key)
                }
                None => (None, None),
            };
            ProfileError {
                origin: origin.to_string(),
                line,
                key,
                message: e.message().trim().to_string(),
            }
        })?;
        // A table that sets both would have one silently win: name the key instead.
        for table in [&raw.link, &raw.upstream, &raw.downstream]
            .into_iter()
            .flatten()
        {
            if let (Some(loss), Some(_)) = (&table.loss, &table.burst) {
                let (line, key) = locate(src, loss.span().start);
                return Err(ProfileError {
                    origin: origin.to_string(),
                    line: Some(line),
                    key,
                    message: "`loss` and a `burst` table in the same table: give one (burst is \
                              Gilbert–Elliott loss in place of loss)"
                        .into(),
                });
            }
        }
        let link = raw.link.unwrap_or_default();
        let base = link.apply(LinkParams::default());
        let upstream = raw.upstream.unwrap_or_default().apply(base.clone());
        let downstream = raw.downstream.unwrap_or_default().apply(base);
        for (table, params) in [("upstream", &upstream), ("downstream", &downstream)] {
            // A queue that cannot hold one full segment would drop every one of them.
            let packet = u64::from(params.mss) + crate::fault::wire::SEGMENT_OVERHEAD as u64;
            if params.queue_limit < packet {
                return Err(ProfileError {
                    origin: origin.to_string(),
                    line: None,
                    key: Some(format!("{table}.queue_limit")),
                    message: format!(
                        "queue_limit {} bytes cannot hold one full segment (mss {} + {} bytes \
                         of headers)",
                        params.queue_limit,
                        params.mss,
                        crate::fault::wire::SEGMENT_OVERHEAD
                    ),
                });
            }
        }
        Ok(Profile {
            name: raw.name.unwrap_or_else(|| default_name.to_string()),
            description: raw.description.unwrap_or_default(),
            upstream,
            downstream,
            connect: ConnectParams {
                syn_rto: raw
                    .connect
                    .as_ref()
                    .and_then(|c| c.syn_rto)
                    .map_or(DEFAULT_SYN_RTO, |d| d.0),
                syn_backoff: raw
                    .connect
                    .as_ref()
                    .and_then(|c| c.syn_backoff)
                    .unwrap_or(SynBackoff::Exponential),
            },
        })
    }
}

/// A profile that failed to load: where, which key, and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileError {
    /// The file path, or a description of where the text came from.
    pub origin: String,
    /// 1-based line of the offending key or value, when known.
    pub line: Option<usize>,
    /// Dotted key, e.g. `upstream.delay`, when known.
    pub key: Option<String>,
    pub message: String,
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.origin)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": key `{key}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ProfileError {}

/// Finds the 1-based line of byte offset `at` and the dotted key that owns it. toml reports a
/// bad value's span, an unknown key's span, or a table header's span; the key is recovered from
/// the line itself and the nearest `[table]` header above it.
fn locate(src: &str, at: usize) -> (usize, Option<String>) {
    let at = at.min(src.len());
    let line_no = src[..at].matches('\n').count() + 1;
    let line_start = src[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_end = src[at..].find('\n').map_or(src.len(), |i| at + i);
    let line = &src[line_start..line_end];
    let trimmed = line.trim_start();
    if trimmed.starts_with('[') {
        let header = trimmed.trim_matches(|c| c == '[' || c == ']' || c == ' ');
        return (
            line_no,
            Some(header.split(']').next().unwrap_or(header).to_string()),
        );
    }
    let key = match line.find('=') {
        Some(eq) => line[..eq].trim(),
        None => line.trim(),
    };
    let table = src[..line_start].lines().rev().find_map(|l| {
        let l = l.trim();
        l.starts_with('[')
            .then(|| l.trim_matches(|c| c == '[' || c == ']').trim().to_string())
    });
    let key = match table {
        Some(t) if !key.is_empty() => format!("{t}.{key}"),
        _ => key.to_string(),
    };
    (line_no, (!key.is_empty()).then_some(key))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: Option<String>,
    description: Option<String>,
    link: Option<RawLink>,
    upstream: Option<RawLink>,
    downstream: Option<RawLink>,
    connect: Option<RawConnect>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLink {
    delay: Option<Dur>,
    jitter: Option<Dur>,
    jitter_distribution: Option<JitterDistribution>,
    /// Spanned, so `loss` set next to `burst` can be pointed at.
    loss: Option<toml::Spanned<Probability>>,
    rate: Option<Rate>,
    mss: Option<Mss>,
    rto_min: Option<Dur>,
    burst: Option<RawBurst>,
    congestion_control: Option<CongestionControl>,
    queue_limit: Option<QueueLimit>,
    reorder: Option<Probability>,
    duplicate: Option<Probability>,
    corrupt: Option<Probability>,
}

impl RawLink {
    /// Overrides the fields this table sets. A table that sets `loss` replaces an inherited
    /// `burst`, and the reverse; a table may not set both ([`Profile::parse`] refuses it).
    fn apply(self, mut p: LinkParams) -> LinkParams {
        if let Some(d) = self.delay {
            p.delay = d.0;
        }
        if let Some(d) = self.jitter {
            p.jitter = d.0;
        }
        if let Some(d) = self.jitter_distribution {
            p.jitter_distribution = d;
        }
        if let Some(Probability(loss)) = self.loss.map(toml::Spanned::into_inner) {
            p.loss = if loss == 0.0 {
                LossProcess::None
            } else {
                LossProcess::Bernoulli { p: loss }
            };
        }
        if let Some(b) = self.burst {
            p.loss = LossProcess::GilbertElliott {
                p: b.p.0,
                r: b.r.0,
                h: b.h.map_or(0.0, |x| x.0),
                k: b.k.map_or(1.0, |x| x.0),
                step: b.step.map(|d| d.0),
            };
        }
        if let Some(r) = self.rate {
            p.rate_bps = r.0;
        }
        if let Some(m) = self.mss {
            p.mss = m.0;
        }
        if let Some(d) = self.rto_min {
            p.rto_min = d.0;
        }
        if let Some(cc) = self.congestion_control {
            p.congestion_control = cc;
        }
        if let Some(q) = self.queue_limit {
            p.queue_limit = q.0;
        }
        for (field, value) in [
            (&mut p.reorder, self.reorder),
            (&mut p.duplicate, self.duplicate),
            (&mut p.corrupt, self.corrupt),
        ] {
            if let Some(Probability(v)) = value {
                *field = v;
            }
        }
        p
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBurst {
    p: Probability,
    r: Probability,
    h: Option<Probability>,
    k: Option<Probability>,
    step: Option<Step>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConnect {
    syn_rto: Option<Dur>,
    syn_backoff: Option<SynBackoff>,
}

/// A humantime duration string ("250us", "10ms", "1s"); negative values and values over
/// [`MAX_PROFILE_DURATION`] are refused.
#[derive(Clone, Copy)]
struct Dur(Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let s = String::deserialize(d).map_err(|_| {
            D::Error::custom("a duration must be a string with a unit, like \"10ms\" or \"250us\"")
        })?;
        parse_duration(&s)
            .and_then(|d| {
                at_most(d, MAX_PROFILE_DURATION).map_err(|e| format!("duration \"{s}\" {e}"))
            })
            .map(Dur)
            .map_err(D::Error::custom)
    }
}

/// A Gilbert–Elliott time step: a duration of at least a microsecond (a finer step is a
/// per-packet chain in all but name, and a zero one would never end).
struct Step(Duration);

impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let Dur(step) = Dur::deserialize(d)?;
        if step < Duration::from_micros(1) {
            return Err(D::Error::custom(
                "a burst step must be at least \"1us\" (leave it out for one step per packet)",
            ));
        }
        Ok(Step(step))
    }
}

/// A probability in `[0, 1]`.
struct Probability(f64);

impl<'de> Deserialize<'de> for Probability {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let v = f64::deserialize(d)?;
        if !(0.0..=1.0).contains(&v) {
            return Err(D::Error::custom(format!(
                "probability {v} is outside [0, 1] (1 % is 0.01)"
            )));
        }
        Ok(Probability(v))
    }
}

/// A value written either as a bare integer or as text with a unit.
#[derive(Deserialize)]
#[serde(untagged)]
enum IntOrText {
    Int(i64),
    Str(String),
}

/// A bit rate: "300Mbit", "1Gbit", "20Mbps", "0" (unlimited), or an integer in bits/s.
struct Rate(Option<u64>);

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let bps = match IntOrText::deserialize(d)? {
            IntOrText::Int(n) if n < 0 => {
                return Err(D::Error::custom(format!("negative rate {n}")));
            }
            IntOrText::Int(n) => n as u64,
            IntOrText::Str(s) => parse_rate(&s).map_err(D::Error::custom)?,
        };
        Ok(Rate((bps > 0).then_some(bps)))
    }
}

/// A queue's byte limit: a size ("64KiB", "1MB") or an integer in bytes, at least one packet.
struct QueueLimit(u64);

impl<'de> Deserialize<'de> for QueueLimit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let bytes = match IntOrText::deserialize(d)? {
            IntOrText::Int(n) => u64::try_from(n).map_err(|_| D::Error::custom("negative size"))?,
            IntOrText::Str(s) => parse_size(&s).map_err(D::Error::custom)?,
        };
        if !(1500..=(1 << 32)).contains(&bytes) {
            return Err(D::Error::custom(format!(
                "queue_limit {bytes} bytes is outside 1500 B (one packet) ..= 4 GiB"
            )));
        }
        Ok(QueueLimit(bytes))
    }
}

/// A maximum segment size in a range real links use.
struct Mss(u32);

impl<'de> Deserialize<'de> for Mss {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let v = i64::deserialize(d)?;
        if !(64..=65_535).contains(&v) {
            return Err(D::Error::custom(format!("mss {v} is outside 64..=65535")));
        }
        Ok(Mss(v as u32))
    }
}

impl fmt::Display for LinkParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "delay = \"{}\"", format_duration(self.delay))?;
        writeln!(f, "jitter = \"{}\"", format_duration(self.jitter))?;
        writeln!(
            f,
            "jitter_distribution = \"{}\"",
            self.jitter_distribution.as_str()
        )?;
        match self.loss {
            LossProcess::None => writeln!(f, "loss = 0.0")?,
            LossProcess::Bernoulli { p } => writeln!(f, "loss = {p:?}")?,
            LossProcess::GilbertElliott { .. } => {}
        }
        writeln!(f, "rate = \"{}\"", format_rate(self.rate_bps))?;
        writeln!(f, "mss = {}", self.mss)?;
        writeln!(f, "rto_min = \"{}\"", format_duration(self.rto_min))?;
        writeln!(
            f,
            "congestion_control = \"{}\"",
            self.congestion_control.as_str()
        )?;
        writeln!(f, "queue_limit = {}", self.queue_limit)?;
        for (key, p) in [
            ("reorder", self.reorder),
            ("duplicate", self.duplicate),
            ("corrupt", self.corrupt),
        ] {
            if p > 0.0 {
                writeln!(f, "{key} = {p:?}")?;
            }
        }
        Ok(())
    }
}

/// The effective profile as a profile file: every value explicit, both directions spelled out.
/// Parsing the output gives back an equal profile.
impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "name = {:?}", self.name)?;
        writeln!(f, "description = {:?}", self.description)?;
        for (table, link) in [
            ("upstream", &self.upstream),
            ("downstream", &self.downstream),
        ] {
            writeln!(f, "\n[{table}]")?;
            write!(f, "{link}")?;
            if let LossProcess::GilbertElliott { p, r, h, k, step } = link.loss {
                writeln!(f, "\n[{table}.burst]")?;
                writeln!(f, "p = {p:?}\nr = {r:?}\nh = {h:?}\nk = {k:?}")?;
                if let Some(step) = step {
                    writeln!(f, "step = \"{}\"", format_duration(step))?;
                }
            }
        }
        writeln!(f, "\n[connect]")?;
        writeln!(f, "syn_rto = \"{}\"", format_duration(self.connect.syn_rto))?;
        let backoff = match self.connect.syn_backoff {
            SynBackoff::Exponential => "exponential",
            SynBackoff::Linear => "linear",
        };
        writeln!(f, "syn_backoff = \"{backoff}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> Result<Profile, ProfileError> {
        Profile::parse(src, "test.toml", "test")
    }

    #[test]
    fn builtins_parse_and_round_trip_through_show() {
        for name in Profile::builtin_names() {
            let p = Profile::builtin(name).unwrap();
            assert_eq!(p.name, name);
            let shown = p.to_string();
            let again = parse(&shown).unwrap_or_else(|e| panic!("{name}: {e}\n{shown}"));
            assert_eq!(again, p, "{name} does not round-trip:\n{shown}");
        }
    }

    #[test]
    fn reference_profile_has_the_design_values() {
        let p = Profile::builtin("lossy-10ms-1pct").unwrap();
        for link in [&p.upstream, &p.downstream] {
            assert_eq!(link.delay, Duration::from_millis(10));
            assert_eq!(link.loss, LossProcess::Bernoulli { p: 0.01 });
            assert_eq!(link.rto_min, Duration::from_millis(200));
            assert_eq!(link.mss, 1448);
        }
        assert_eq!(p.connect.syn_rto, Duration::from_secs(1));
        assert!(Profile::builtin("local").unwrap().is_unimpaired());
        assert!(!p.is_unimpaired());
    }

    #[test]
    fn direction_tables_override_single_fields() {
        let p = parse(
            "[link]\ndelay = \"5ms\"\nloss = 0.02\n[downstream]\ndelay = \"7ms\"\n[upstream.burst]\np = 0.1\nr = 0.5\n",
        )
        .unwrap();
        assert_eq!(p.upstream.delay, Duration::from_millis(5));
        assert_eq!(p.downstream.delay, Duration::from_millis(7));
        assert_eq!(p.downstream.loss, LossProcess::Bernoulli { p: 0.02 });
        assert_eq!(
            p.upstream.loss,
            LossProcess::GilbertElliott {
                p: 0.1,
                r: 0.5,
                h: 0.0,
                k: 1.0,
                step: None,
            }
        );
    }

    fn err(src: &str) -> ProfileError {
        parse(src).expect_err("must fail")
    }

    #[test]
    fn errors_name_line_and_key() {
        let e = err("name = \"x\"\n[link]\ndelay = \"10ms\"\nlos = 0.01\n");
        assert_eq!(e.line, Some(4));
        assert_eq!(e.key.as_deref(), Some("link.los"));
        assert!(e.message.contains("unknown field"), "{e}");

        let e = err("[link]\ndelay = \"10xs\"\n");
        assert_eq!((e.line, e.key.as_deref()), (Some(2), Some("link.delay")));
        assert!(
            e.to_string()
                .starts_with("test.toml:2: key `link.delay`: invalid duration"),
            "{e}"
        );

        let e = err("[upstream]\n\nloss = 1.5\n");
        assert_eq!((e.line, e.key.as_deref()), (Some(3), Some("upstream.loss")));
        assert!(e.message.contains("outside [0, 1]"), "{e}");

        let e = err("[link]\njitter = \"-3ms\"\n");
        assert_eq!((e.line, e.key.as_deref()), (Some(2), Some("link.jitter")));
        assert!(e.message.contains("negative"), "{e}");

        let e = err("[link]\nrate = \"12 furlongs\"\n");
        assert_eq!((e.line, e.key.as_deref()), (Some(2), Some("link.rate")));

        let e = err("[link]\ndelay = 10\n");
        assert!(e.message.contains("unit"), "{e}");

        let e = err("[link]\ndelay = \"2h\"\n");
        assert_eq!((e.line, e.key.as_deref()), (Some(2), Some("link.delay")));
        assert!(e.message.contains("longer than the 1h"), "{e}");

        let e = err("[upstream]\nrto_min = \"300000000000years\"\n");
        assert_eq!(e.key.as_deref(), Some("upstream.rto_min"), "{e}");

        let e = err("[link]\ndelay = \"1ms\"\nloss = 0.01\n[link.burst]\np = 0.1\nr = 0.2\n");
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(3), Some("link.loss")),
            "{e}"
        );
        assert!(e.message.contains("give one"), "{e}");

        let e = err("[link.burst]\np = 0.1\n");
        assert_eq!(e.key.as_deref(), Some("link.burst"), "{e}");
        assert!(e.message.contains("`r`"), "{e}");
    }

    #[test]
    fn a_queue_must_hold_one_full_segment_and_a_burst_step_be_positive() {
        let e = err("[link]\nmss = 8948\nqueue_limit = 8000\n");
        assert_eq!(e.key.as_deref(), Some("upstream.queue_limit"), "{e}");
        assert!(e.message.contains("8948"), "{e}");
        parse("[link]\nmss = 8948\nqueue_limit = 9000\n").unwrap();
        let e = err("[link.burst]\np = 0.1\nr = 0.2\nstep = \"0ms\"\n");
        assert_eq!(e.key.as_deref(), Some("link.burst.step"), "{e}");
    }

    #[test]
    fn unknown_builtin_lists_the_known_ones() {
        let e = Profile::load("nope").unwrap_err();
        assert!(e.message.contains("lossy-10ms-1pct"), "{e}");
    }
}
