//! Toxics: faults switched on and off while a proxy runs, in Toxiproxy's vocabulary, and what
//! they amount to for one connection. Pure, like [`crate::fault`]: the control API edits a list
//! of [`Toxic`]s, and each connection [`resolve`]s that list against its own toxicity draws into
//! link parameters for the model plus the few connection-level effects the pipe carries out.
//!
//! How Toxiproxy's toxics map onto our model (no byte is ever dropped but under `timeout`, whose
//! point it is):
//! - `latency`: delay + uniform jitter in the model, so it keeps throughput (a delayed stream is
//!   not a slower one);
//! - `bandwidth`: the model's bottleneck rate, a first-in-first-out queue at line rate (KB/s,
//!   1 KB = 1000 bytes, as Toxiproxy);
//! - `loss` (ours): the packet-drop-like stall of the model, Bernoulli or Gilbert–Elliott;
//! - `syn_loss` (ours): lost SYNs (upstream) or SYN-ACKs (downstream) of new connections;
//! - `profile` (ours): a whole named profile's impairment for this direction, connection set-up
//!   included;
//! - `handshake` (ours): new connections pay the SYN / SYN-ACK round trip before their first
//!   byte (Toxiproxy's toxics charge a new connection nothing);
//! - `slicer`: each chunk is cut into pieces written `delay` µs apart;
//! - `slow_close`: the FIN waits `delay` ms;
//! - `bandwidth` with `rate` 0: no byte passes while it is there; they wait in the proxy and
//!   flow once it goes or gets a rate (as Toxiproxy's, whose rate-0 toxic stalls its chunk);
//! - `timeout`: as Toxiproxy's, the bytes are dropped (the toxic's whole point is a connection
//!   that is broken, and the only place a byte is ever dropped on purpose); after `timeout` ms
//!   (0 = never) the connection is closed with FIN, and removing the toxic closes it too;
//!   with our attribute `hold: true` the bytes are held instead (delivered if it goes), and
//!   after `timeout` ms the connection is reset, since held bytes cannot be delivered;
//! - `reset_peer`: `timeout` ms after the first bytes seen under the toxic, both ends are reset;
//! - `limit_data`: after `bytes` bytes the direction is closed and the connection with it.

use std::net::IpAddr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::fault::{Direction, HandshakeLoss, PathTiming, Setup};
use crate::profile::{JitterDistribution, LinkParams, LossProcess, Profile, MAX_PROFILE_DURATION};

/// The longest a timer toxic (slow_close, timeout, reset_peer) waits, alone or added up: a
/// day. No test means more, and deadlines a day ahead stay far from overflowing `Instant`s.
pub(crate) const MAX_TIMER: Duration = Duration::from_secs(24 * 3600);

/// `total + more`, at most `max`: toxics add up, but never past what the model (or a timer)
/// takes, however many a client stacks.
fn add_capped(total: Duration, more: Duration, max: Duration) -> Duration {
    total.saturating_add(more).min(max)
}

/// One toxic as the API holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Toxic {
    pub name: String,
    pub kind: ToxicKind,
    /// The direction of the bytes it affects.
    pub stream: Direction,
    /// Probability that a connection suffers it, drawn once per connection (and again when the
    /// toxic is updated), as in Toxiproxy.
    pub toxicity: f32,
    /// Bumped on every update, so connections draw their toxicity again.
    pub revision: u64,
    /// The client addresses it applies to (attribute `clients`); empty: every client.
    pub clients: Vec<Cidr>,
}

/// An address block, `ADDR/PREFIX` (or a bare address: that address alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

/// Why a string is not a client address block.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("\"{0}\" is not an address or ADDR/PREFIX block")]
    NotAnAddress(String),
    #[error("\"{given}\": the prefix must be 0 to {bits}")]
    Prefix { given: String, bits: u8 },
    #[error("\"{given}\": address bits set past the /{prefix} prefix")]
    HostBits { given: String, prefix: u8 },
}

/// Why attributes that are each within their bounds still make no usable toxic
/// ([`ToxicKind::settle`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettleError {
    #[error("give probability or percent, not both")]
    BothRates,
    #[error("syn_loss needs percent or probability")]
    NoSynLossRate,
    #[error("loss needs percent or probability (or Gilbert-Elliott p and r)")]
    NoLossRate,
    #[error("Gilbert-Elliott loss needs both p and r")]
    HalfGilbertElliott,
    #[error("unknown profile \"{name}\" (use {known})")]
    UnknownProfile { name: String, known: String },
    /// The profile file's text does not parse: its message, as the profile parser says it
    /// (kept as text so this error stays comparable, as the loss process's tests need).
    #[error("{0}")]
    ProfileText(String),
    #[error(
        "profile needs attribute profile (a built-in profile name) or toml (a profile file's \
         text)"
    )]
    NoProfile,
}

impl Cidr {
    /// Parses `127.0.0.2/32`, `10.0.0.0/8`, `::1/128`, `127.0.0.2`. Host bits set under the
    /// prefix are refused: `10.0.0.1/8` is more likely a typo than a block.
    pub fn parse(s: &str) -> Result<Cidr, CidrError> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| CidrError::NotAnAddress(s.to_string()))?;
        let bits = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) => match p.trim().parse::<u8>() {
                Ok(p) if p <= bits => p,
                _ => {
                    return Err(CidrError::Prefix {
                        given: s.to_string(),
                        bits,
                    })
                }
            },
        };
        let cidr = Cidr { net, prefix };
        if cidr.masked(net) != Some(net) {
            return Err(CidrError::HostBits {
                given: s.to_string(),
                prefix,
            });
        }
        Ok(cidr)
    }

    /// Whether `addr` is in the block. An IPv4 client reaching a dual-stack listener shows as
    /// `::ffff:a.b.c.d`, which counts as `a.b.c.d`.
    pub fn contains(&self, addr: IpAddr) -> bool {
        self.masked(addr.to_canonical()) == Some(self.net)
    }

    /// `addr` with the bits past the prefix cleared; `None` across address families.
    fn masked(&self, addr: IpAddr) -> Option<IpAddr> {
        match (self.net, addr) {
            (IpAddr::V4(_), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                Some(IpAddr::V4((u32::from(a) & mask).into()))
            }
            (IpAddr::V6(_), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                Some(IpAddr::V6((u128::from(a) & mask).into()))
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// The longest a latency or jitter may be: the fault model's bound on any duration (its
/// retransmission timeout backs off from the round trip up to 2^15 times, in `Duration`s).
const MAX_MODEL_MS: u64 = MAX_PROFILE_DURATION.as_millis() as u64;

/// The longest a timer toxic (slow_close, timeout, reset_peer) may wait.
const MAX_TIMER_MS: u64 = MAX_TIMER.as_millis() as u64;

/// The most a bandwidth toxic may allow, in KB/s (800 Gbit/s, past any NIC): `rate × 8000`
/// bits per second then stays far inside `u64`.
const MAX_RATE_KB_S: u64 = 100_000_000;

/// The largest slicer piece: above any read the pipe makes, so a larger one would not slice.
const MAX_SLICE: u64 = 16 << 20;

/// The longest slicer delay between pieces, in µs: a minute per piece.
const MAX_SLICE_DELAY_US: u64 = 60_000_000;

/// Toxiproxy's attributes are Go `int64`s: `limit_data` can count no further.
const MAX_BYTES: u64 = i64::MAX as u64;

/// What a toxic does, as the API carries it: `{"type": .., "attributes": {..}}` with
/// Toxiproxy's attribute names and integer units, an integer left out meaning 0. This enum is
/// the one list of toxic types: serde gives each its name and attributes, [`ToxicKind::bounds`]
/// what a client may send, and [`resolve`] its effect.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "attributes", rename_all = "snake_case")]
pub enum ToxicKind {
    Latency {
        #[serde(rename = "latency", default)]
        latency_ms: u64,
        #[serde(rename = "jitter", default)]
        jitter_ms: u64,
    },
    Bandwidth {
        #[serde(rename = "rate", default)]
        rate_kb_s: u64,
    },
    SlowClose {
        #[serde(rename = "delay", default)]
        delay_ms: u64,
    },
    Timeout {
        #[serde(rename = "timeout", default)]
        timeout_ms: u64,
        /// Ours: hold the bytes (delivered if the toxic goes) instead of dropping them, and
        /// reset rather than close after the timeout. Written only when set, so Toxiproxy's
        /// clients see Toxiproxy's attributes.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        hold: bool,
    },
    ResetPeer {
        #[serde(rename = "timeout", default)]
        timeout_ms: u64,
    },
    Slicer {
        #[serde(default)]
        average_size: u64,
        #[serde(default)]
        size_variation: u64,
        #[serde(rename = "delay", default)]
        delay_us: u64,
    },
    LimitData {
        #[serde(default)]
        bytes: u64,
    },
    Noop {},
    /// Segment loss turned into retransmission stalls.
    Loss(LossAttributes),
    /// Lost SYNs (upstream) or SYN-ACKs (downstream) of new connections.
    SynLoss(Rate),
    /// A whole profile's impairment of this direction (and its connection set-up).
    Profile(ProfileAttributes),
    /// New connections pay the SYN / SYN-ACK round trip of the path the other toxics make
    /// before their first byte leaves (whichever stream it is on).
    Handshake {},
}

impl ToxicKind {
    /// What a client may send for each attribute; a type's attributes are read only after
    /// these pass, so a bound is defined once, beside its type.
    pub fn bounds(&self) -> &'static [Bound] {
        match self {
            ToxicKind::Latency { .. } => {
                const {
                    &[
                        Bound::int("latency", 0, MAX_MODEL_MS, "ms"),
                        // A jitter wider than the latency is accepted, as Toxiproxy accepts it: the
                        // delay is clipped at zero (so its mean is then above the latency asked for).
                        Bound::int("jitter", 0, MAX_MODEL_MS, "ms"),
                    ]
                }
            }
            // Rate 0 (or none given) is taken, as Toxiproxy takes it: its bandwidth toxic then
            // sends its chunk on in empty pieces every 100 ms, for ever, so nothing passes until
            // the toxic goes or changes, and then everything does. A client may use it as a
            // "stop": refusing it would fail a test that passes against Toxiproxy.
            ToxicKind::Bandwidth { .. } => {
                const { &[Bound::int("rate", 0, MAX_RATE_KB_S, "KB/s")] }
            }
            ToxicKind::SlowClose { .. } => const { &[Bound::int("delay", 0, MAX_TIMER_MS, "ms")] },
            ToxicKind::Timeout { .. } => {
                const {
                    &[
                        Bound::int("timeout", 0, MAX_TIMER_MS, "ms"),
                        Bound::flag("hold"),
                    ]
                }
            }
            ToxicKind::ResetPeer { .. } => {
                const { &[Bound::int("timeout", 0, MAX_TIMER_MS, "ms")] }
            }
            ToxicKind::Slicer { .. } => {
                const {
                    &[
                        // Toxiproxy recurses without end on an average_size of 0, and cuts out of
                        // bounds (a panic) when size_variation exceeds average_size.
                        Bound::int("average_size", 1, MAX_SLICE, "bytes"),
                        Bound::int_at_most("size_variation", MAX_SLICE, "bytes", "average_size"),
                        Bound::int("delay", 0, MAX_SLICE_DELAY_US, "µs"),
                    ]
                }
            }
            ToxicKind::LimitData { .. } => const { &[Bound::int("bytes", 0, MAX_BYTES, "bytes")] },
            ToxicKind::Loss(_) => {
                const {
                    &[
                        Bound::number("percent", 100.0),
                        Bound::number("probability", 1.0),
                        Bound::number("p", 1.0),
                        Bound::number("r", 1.0),
                        Bound::number("h", 1.0),
                        Bound::number("k", 1.0),
                    ]
                }
            }
            ToxicKind::SynLoss(_) => {
                const {
                    &[
                        Bound::number("percent", 100.0),
                        Bound::number("probability", 1.0),
                    ]
                }
            }
            ToxicKind::Profile(_) => const { &[Bound::text("profile"), Bound::text("toml")] },
            ToxicKind::Noop {} | ToxicKind::Handshake {} => &[],
        }
    }

    /// The type named `name` with every attribute left out (so integers at 0); `None` for a
    /// name no variant has.
    pub fn empty(name: &str) -> Option<ToxicKind> {
        ToxicKind::join(name, &Map::new()).ok()
    }

    /// The `type` name on the API (serde's, so it is written once).
    pub(crate) fn type_name(&self) -> String {
        self.split().0
    }

    /// The kind as its `type` and `attributes` (every integer attribute present, as Toxiproxy
    /// answers).
    pub fn split(&self) -> (String, Map<String, Value>) {
        let Ok(Value::Object(mut m)) = serde_json::to_value(self) else {
            unreachable!("a toxic kind serialises to an object")
        };
        let Some(Value::String(name)) = m.remove("type") else {
            unreachable!("an adjacently tagged enum serialises its tag")
        };
        match m.remove("attributes") {
            Some(Value::Object(attributes)) => (name, attributes),
            _ => (name, Map::new()),
        }
    }

    /// The kind a `type` and `attributes` describe; attributes of no meaning to the type (and
    /// nulls, which mean left out) are passed over.
    pub fn join(type_name: &str, attributes: &Map<String, Value>) -> serde_json::Result<ToxicKind> {
        let given: Map<String, Value> = attributes
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        serde_json::from_value(serde_json::json!({"type": type_name, "attributes": given}))
    }

    /// Settles what the attributes mean beyond their bounds (which rate a loss gives, which
    /// profile a profile toxic names), so [`resolve`] never meets an unusable toxic.
    pub(crate) fn settle(&mut self) -> Result<(), SettleError> {
        match self {
            ToxicKind::Loss(loss) => loss.process().map(drop),
            ToxicKind::SynLoss(rate) => rate
                .probability()?
                .map(drop)
                .ok_or(SettleError::NoSynLossRate),
            ToxicKind::Profile(p) => p.settle(),
            _ => Ok(()),
        }
    }

    /// Whether the toxic describes the path (delay, rate, loss, a whole profile) rather than
    /// what happens to one connection's bytes or handshake. Only these can run on the kernel
    /// engine, whose connections share one real link.
    pub(crate) fn shapes_the_path(&self) -> bool {
        matches!(
            self,
            ToxicKind::Latency { .. }
                // Rate 0 holds one connection's bytes, which a shared link cannot.
                | ToxicKind::Bandwidth { rate_kb_s: 1.. }
                | ToxicKind::Loss(_)
                | ToxicKind::Profile(_)
                // The kernel's connections always pay their real handshake.
                | ToxicKind::Handshake {}
                | ToxicKind::Noop {}
        )
    }
}

/// What a client may send for one attribute.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    pub name: &'static str,
    pub range: Range,
    /// Another attribute of the same toxic this one may not exceed (size_variation ≤
    /// average_size).
    pub at_most: Option<&'static str>,
}

#[derive(Clone, Copy, Debug)]
pub enum Range {
    /// An integer in `min..=max`, in `unit` (Toxiproxy's integer units). A minimum above 0
    /// makes the attribute required, since left out it means 0.
    Int {
        min: u64,
        max: u64,
        unit: &'static str,
    },
    /// A number in `0..=max` (ours: loss rates), absent unless given.
    Number { max: f64 },
    /// Text (ours: a profile's name or file); absent unless given.
    Text,
    /// `true` or `false` (ours: timeout's `hold`); absent means false.
    Flag,
}

impl Bound {
    const fn int(name: &'static str, min: u64, max: u64, unit: &'static str) -> Bound {
        Bound {
            name,
            range: Range::Int { min, max, unit },
            at_most: None,
        }
    }

    const fn int_at_most(
        name: &'static str,
        max: u64,
        unit: &'static str,
        other: &'static str,
    ) -> Bound {
        Bound {
            name,
            range: Range::Int { min: 0, max, unit },
            at_most: Some(other),
        }
    }

    const fn number(name: &'static str, max: f64) -> Bound {
        Bound {
            name,
            range: Range::Number { max },
            at_most: None,
        }
    }

    const fn text(name: &'static str) -> Bound {
        Bound {
            name,
            range: Range::Text,
            at_most: None,
        }
    }

    const fn flag(name: &'static str) -> Bound {
        Bound {
            name,
            range: Range::Flag,
            at_most: None,
        }
    }
}

/// A loss rate (ours): `percent` (0..100, so Toxiproxy's clients can read it back) or
/// `probability` (0..1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole_as_integer"
    )]
    pub percent: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probability: Option<f64>,
}

impl Rate {
    /// The rate as a probability; `None` when neither is given.
    pub fn probability(&self) -> Result<Option<f64>, SettleError> {
        match (self.probability, self.percent) {
            (Some(_), Some(_)) => Err(SettleError::BothRates),
            (p, q) => Ok(p.or(q.map(|q| q / 100.0))),
        }
    }
}

/// A whole number of percent written as an integer: Toxiproxy's clients read attributes as
/// integers, and choke on `30.0`.
fn whole_as_integer<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match *v {
        Some(x) if x.fract() == 0.0 && (0.0..=100.0).contains(&x) => s.serialize_u64(x as u64),
        Some(x) => s.serialize_f64(x),
        None => s.serialize_none(),
    }
}

/// A `loss` toxic's attributes: a Bernoulli [`Rate`], or Gilbert–Elliott `p` and `r` (and
/// optional `h`, `k`) as in profiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LossAttributes {
    #[serde(flatten)]
    pub rate: Rate,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub h: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<f64>,
}

impl LossAttributes {
    pub fn bernoulli(p: f64) -> LossAttributes {
        LossAttributes {
            rate: Rate {
                percent: None,
                probability: Some(p),
            },
            ..LossAttributes::default()
        }
    }

    /// The loss process the attributes describe.
    pub fn process(&self) -> Result<LossProcess, SettleError> {
        match (self.p, self.r) {
            (Some(p), Some(r)) => Ok(LossProcess::GilbertElliott {
                p,
                r,
                h: self.h.unwrap_or(0.0),
                k: self.k.unwrap_or(1.0),
                step: None,
            }),
            (None, None) => match self.rate.probability()? {
                Some(p) => Ok(LossProcess::Bernoulli { p }),
                None => Err(SettleError::NoLossRate),
            },
            _ => Err(SettleError::HalfGilbertElliott),
        }
    }
}

/// A `profile` toxic's attributes: a built-in profile by name, or a whole profile file's text
/// (how a remote run sends a profile the proxy host does not have).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProfileAttributes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toml: Option<String>,
    /// The profile they name, once [`ToxicKind::settle`]d: parsed once, not per connection.
    #[serde(skip)]
    pub settled: Option<Box<Profile>>,
}

impl ProfileAttributes {
    pub fn named(name: &str) -> ProfileAttributes {
        ProfileAttributes {
            profile: Some(name.to_string()),
            ..ProfileAttributes::default()
        }
    }

    pub fn toml(text: &str) -> ProfileAttributes {
        ProfileAttributes {
            toml: Some(text.to_string()),
            ..ProfileAttributes::default()
        }
    }

    fn settle(&mut self) -> Result<(), SettleError> {
        let profile = match (&self.profile, &self.toml) {
            (Some(name), None) => {
                Profile::builtin(name).ok_or_else(|| SettleError::UnknownProfile {
                    name: name.clone(),
                    known: Profile::builtin_names().collect::<Vec<_>>().join(", "),
                })?
            }
            (None, Some(text)) => Profile::parse(text, "profile toxic attribute toml", "custom")
                .map_err(|e| SettleError::ProfileText(e.to_string()))?,
            _ => return Err(SettleError::NoProfile),
        };
        self.settled = Some(Box::new(profile));
        Ok(())
    }
}

/// How the slicer cuts a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slicer {
    pub average_size: u64,
    pub size_variation: u64,
    pub delay: Duration,
}

/// What one direction of one connection suffers right now.
#[derive(Clone, Debug, PartialEq)]
pub struct DirectionFaults {
    /// The model's parameters.
    pub link: LinkParams,
    /// Extra wait before the FIN is delivered.
    pub slow_close: Duration,
    /// Bytes wait in the proxy, delivered once this is gone (`timeout` with `hold`, bandwidth
    /// rate 0); `Some(d)`: the connection is reset `d` after it applied.
    pub hold: Option<Option<Duration>>,
    /// Toxiproxy's `timeout` toxic: bytes read are dropped; `Some(d)`: the connection is
    /// closed `d` after it applied.
    pub discard: Option<Option<Duration>>,
    /// `reset_peer` toxic: reset this long after the first bytes seen under it.
    pub reset_after: Option<Duration>,
    pub slicer: Option<Slicer>,
    /// `limit_data` toxic: bytes this direction may carry in all before it closes.
    pub limit: Option<u64>,
}

impl DirectionFaults {
    fn new(link: LinkParams) -> DirectionFaults {
        DirectionFaults {
            link,
            slow_close: Duration::ZERO,
            hold: None,
            discard: None,
            reset_after: None,
            slicer: None,
            limit: None,
        }
    }
}

/// Everything one connection suffers right now.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnectionFaults {
    /// Profile to build the connection's model from: the base, with the active toxics applied.
    pub profile: Profile,
    pub upstream: DirectionFaults,
    pub downstream: DirectionFaults,
    /// What a new connection's set-up costs: its round trip only under the proxy's own profile
    /// or a `handshake` or `profile` toxic; `syn_loss` toxics' losses of the SYN (upstream) and
    /// SYN-ACK (downstream).
    pub setup: Setup,
    pub timing: PathTiming,
}

impl ConnectionFaults {
    pub fn direction(&self, d: Direction) -> &DirectionFaults {
        match d {
            Direction::Upstream => &self.upstream,
            Direction::Downstream => &self.downstream,
        }
    }
}

/// A connection's toxicity draws: one per (toxic, revision), kept for the connection's life,
/// and its client's address, which a toxic's `clients` must take in.
#[derive(Debug)]
pub struct Draws {
    rng: ChaCha8Rng,
    drawn: Vec<(String, u64, bool)>,
    client: Option<IpAddr>,
}

impl Draws {
    pub fn new(rng: ChaCha8Rng) -> Draws {
        Draws {
            rng,
            drawn: Vec::new(),
            client: None,
        }
    }

    /// The draws of a connection from `client` (`None`: unknown, so a toxic limited to some
    /// clients never applies).
    pub fn from_client(mut self, client: Option<IpAddr>) -> Draws {
        self.client = client;
        self
    }

    /// Whether `toxic` is meant for this connection's client (it names none, or this one),
    /// before any toxicity draw.
    pub fn reaches(&self, toxic: &Toxic) -> bool {
        let listed = |c: IpAddr| toxic.clients.iter().any(|b| b.contains(c));
        toxic.clients.is_empty() || self.client.is_some_and(listed)
    }

    /// Whether `toxic` applies to this connection: its client is one the toxic names (if it
    /// names any), and it is drawn, on first sight of each revision.
    pub(crate) fn applies(&mut self, toxic: &Toxic) -> bool {
        if !self.reaches(toxic) {
            return false;
        }
        if let Some(&(_, _, on)) = self
            .drawn
            .iter()
            .find(|(n, r, _)| *n == toxic.name && *r == toxic.revision)
        {
            return on;
        }
        let on = self.rng.random::<f32>() < toxic.toxicity;
        self.drawn.retain(|(n, _, _)| *n != toxic.name);
        self.drawn.push((toxic.name.clone(), toxic.revision, on));
        on
    }
}

/// The path `toxics` make of `base` on the kernel engine. Every toxic applies: the control API
/// accepts only path toxics at toxicity 1 for every client on such a proxy, so no draw is
/// ever made.
pub(crate) fn resolve_path(base: &Profile, toxics: &[Toxic]) -> Profile {
    let mut every = Draws::new(ChaCha8Rng::seed_from_u64(0));
    resolve(base, toxics, &mut every).profile
}

/// What `toxics` do to a connection of a proxy whose own impairment is `base`, given its draws.
/// Toxics apply in list order: a `profile` toxic replaces what came before it in its direction,
/// latencies add up, the slowest bandwidth wins, loss probabilities combine as independent.
pub(crate) fn resolve(base: &Profile, toxics: &[Toxic], draws: &mut Draws) -> ConnectionFaults {
    let mut profile = base.clone();
    let mut up = DirectionFaults::new(base.upstream.clone());
    let mut down = DirectionFaults::new(base.downstream.clone());
    let mut handshake_loss = HandshakeLoss::default();
    // A proxy's own impairment is a profile, which sets its connections up over the path; on
    // an unimpaired proxy only faultrig's own toxics add the round trip.
    let mut round_trip = !base.is_unimpaired();
    for toxic in toxics {
        if !draws.applies(toxic) {
            continue;
        }
        let d = match toxic.stream {
            Direction::Upstream => &mut up,
            Direction::Downstream => &mut down,
        };
        match &toxic.kind {
            ToxicKind::Latency {
                latency_ms,
                jitter_ms,
            } => {
                let max = MAX_PROFILE_DURATION;
                d.link.delay = add_capped(d.link.delay, Duration::from_millis(*latency_ms), max);
                // Toxiproxy's jitter is uniform on ±jitter; several add their widths.
                if *jitter_ms > 0 {
                    d.link.jitter_distribution = JitterDistribution::Uniform;
                    let jitter = Duration::from_millis(*jitter_ms);
                    d.link.jitter = add_capped(d.link.jitter, jitter, max);
                }
            }
            ToxicKind::Bandwidth { rate_kb_s } if *rate_kb_s > 0 => {
                let bps = rate_kb_s.saturating_mul(8000);
                d.link.rate_bps = Some(d.link.rate_bps.map_or(bps, |r| r.min(bps)));
            }
            // Toxiproxy's rate 0: nothing passes while it is there, nothing is lost.
            ToxicKind::Bandwidth { .. } => {
                d.hold.get_or_insert(None);
            }
            ToxicKind::SlowClose { delay_ms } => {
                let delay = Duration::from_millis(*delay_ms);
                d.slow_close = add_capped(d.slow_close, delay, MAX_TIMER);
            }
            ToxicKind::Timeout { timeout_ms, hold } => {
                let limit = Duration::from_millis(*timeout_ms).min(MAX_TIMER);
                let limit = Some((*timeout_ms > 0).then_some(limit));
                if *hold {
                    d.hold = limit;
                } else {
                    d.discard = limit;
                }
            }
            ToxicKind::ResetPeer { timeout_ms } => {
                d.reset_after = Some(Duration::from_millis(*timeout_ms).min(MAX_TIMER));
            }
            ToxicKind::Slicer {
                average_size,
                size_variation,
                delay_us,
            } => {
                d.slicer = Some(Slicer {
                    average_size: (*average_size).max(1),
                    size_variation: *size_variation,
                    delay: Duration::from_micros(*delay_us),
                });
            }
            ToxicKind::LimitData { bytes } => {
                d.limit = Some(d.limit.map_or(*bytes, |l| l.min(*bytes)));
            }
            // Settled when the API took the toxic: an unusable one loses nothing.
            ToxicKind::Loss(loss) => {
                let loss = loss.process().unwrap_or(LossProcess::None);
                d.link.loss = combine_loss(d.link.loss, loss);
            }
            ToxicKind::SynLoss(rate) => {
                let probability = rate.probability().ok().flatten().unwrap_or(0.0);
                // The packet that travels the toxic's way: the client's SYN goes upstream, the
                // server's SYN-ACK downstream.
                let packet = match toxic.stream {
                    Direction::Upstream => &mut handshake_loss.syn,
                    Direction::Downstream => &mut handshake_loss.synack,
                };
                *packet = Some(combine_loss(
                    packet.unwrap_or(LossProcess::None),
                    LossProcess::Bernoulli { p: probability },
                ));
            }
            ToxicKind::Profile(ProfileAttributes {
                settled: Some(p), ..
            }) => {
                d.link = match toxic.stream {
                    Direction::Upstream => p.upstream.clone(),
                    Direction::Downstream => p.downstream.clone(),
                };
                profile.connect = p.connect.clone();
                round_trip = true;
            }
            ToxicKind::Profile(_) => {}
            ToxicKind::Handshake {} => round_trip = true,
            ToxicKind::Noop {} => {}
        }
    }
    profile.upstream = up.link.clone();
    profile.downstream = down.link.clone();
    ConnectionFaults {
        timing: PathTiming::of(&profile),
        profile,
        upstream: up,
        downstream: down,
        setup: Setup {
            round_trip,
            loss: handshake_loss,
        },
    }
}

/// Two loss processes at once. Bernoulli ones combine exactly (lost by either); a
/// Gilbert–Elliott process is kept whole and the other one dropped, since their product is
/// not a Gilbert–Elliott process.
fn combine_loss(a: LossProcess, b: LossProcess) -> LossProcess {
    match (a, b) {
        (LossProcess::None, x) | (x, LossProcess::None) => x,
        (LossProcess::Bernoulli { p: p1 }, LossProcess::Bernoulli { p: p2 }) => {
            LossProcess::Bernoulli {
                p: 1.0 - (1.0 - p1) * (1.0 - p2),
            }
        }
        (_, ge @ LossProcess::GilbertElliott { .. }) => ge,
        (ge @ LossProcess::GilbertElliott { .. }, _) => ge,
    }
}

impl Slicer {
    /// The smallest piece [`slice`] cuts (short of a chunk's last).
    pub(crate) fn min_piece(&self) -> usize {
        self.average_size
            .saturating_sub(self.size_variation.min(self.average_size))
            .max(1) as usize
    }
}

/// Cuts `len` bytes into slicer pieces: sizes uniform in `average ± variation` (at least 1), and
/// at most `max_pieces` of them (the last takes whatever is left), since each piece is an entry
/// in a queue: a 1-byte slicer would otherwise queue an entry per byte.
pub fn slice(len: usize, slicer: &Slicer, rng: &mut ChaCha8Rng, max_pieces: usize) -> Vec<usize> {
    let mut pieces = Vec::new();
    let mut left = len;
    while left > 0 {
        if pieces.len() + 1 >= max_pieces {
            pieces.push(left);
            break;
        }
        // Pieces beyond 4 GiB are never cut from a read, and the cap keeps `avg + var` in range
        // whatever a slicer holds.
        let avg = slicer.average_size.min(u64::from(u32::MAX)) as i64;
        let var = slicer.size_variation.min(avg as u64) as i64;
        let size = if var > 0 {
            rng.random_range(avg - var..=avg + var)
        } else {
            avg
        };
        let size = (size.max(1) as usize).min(left);
        pieces.push(size);
        left -= size;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::{stream_rng, LinkModel, Segment};
    use rand::SeedableRng;

    fn toxic(name: &str, stream: Direction, kind: ToxicKind) -> Toxic {
        Toxic {
            name: name.into(),
            kind,
            stream,
            toxicity: 1.0,
            revision: 0,
            clients: Vec::new(),
        }
    }

    fn draws() -> Draws {
        Draws::new(ChaCha8Rng::seed_from_u64(1))
    }

    fn local() -> Profile {
        Profile::builtin("local").unwrap()
    }

    /// Every type Toxiproxy's clients and ours send, by its wire name.
    const TYPES: [&str; 12] = [
        "latency",
        "bandwidth",
        "slow_close",
        "timeout",
        "reset_peer",
        "slicer",
        "limit_data",
        "noop",
        "loss",
        "syn_loss",
        "profile",
        "handshake",
    ];

    /// A bound names an attribute serde reads and writes back: otherwise the bound would check
    /// one name while the toxic took another.
    #[test]
    fn bounds_name_the_attributes_each_type_carries() {
        for name in TYPES {
            let empty = ToxicKind::empty(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(empty.type_name(), name);
            for bound in empty.bounds() {
                let value = match bound.range {
                    Range::Int { min, .. } => serde_json::json!(min.max(1)),
                    // Not a whole number: a whole percent is written as an integer.
                    Range::Number { max } => serde_json::json!(max / 4.0 + 0.125),
                    Range::Text => serde_json::json!("lan"),
                    Range::Flag => serde_json::json!(true),
                };
                let mut given = Map::new();
                given.insert(bound.name.to_string(), value.clone());
                let kind = ToxicKind::join(name, &given).unwrap();
                let (type_name, attributes) = kind.split();
                assert_eq!(type_name, name);
                assert_eq!(
                    attributes.get(bound.name),
                    Some(&value),
                    "{name}.{}",
                    bound.name
                );
            }
            // Toxiproxy answers with every integer attribute, 0 when never given.
            let ints: Vec<&str> = (empty.bounds().iter())
                .filter(|b| matches!(b.range, Range::Int { .. }))
                .map(|b| b.name)
                .collect();
            let (_, attributes) = empty.split();
            assert_eq!(
                attributes.keys().map(String::as_str).collect::<Vec<_>>(),
                {
                    let mut sorted = ints.clone();
                    sorted.sort();
                    sorted
                },
                "{name}"
            );
        }
        assert_eq!(ToxicKind::empty("melt"), None);
        assert_eq!(
            ToxicKind::empty("Latency"),
            None,
            "names are exact, as in Toxiproxy"
        );
    }

    #[test]
    fn toxics_compose_per_direction() {
        let toxics = [
            toxic(
                "l1",
                Direction::Downstream,
                ToxicKind::Latency {
                    latency_ms: 100,
                    jitter_ms: 10,
                },
            ),
            toxic(
                "l2",
                Direction::Downstream,
                ToxicKind::Latency {
                    latency_ms: 50,
                    jitter_ms: 0,
                },
            ),
            toxic(
                "b1",
                Direction::Upstream,
                ToxicKind::Bandwidth { rate_kb_s: 100 },
            ),
            toxic(
                "b2",
                Direction::Upstream,
                ToxicKind::Bandwidth { rate_kb_s: 50 },
            ),
            toxic(
                "loss",
                Direction::Upstream,
                ToxicKind::Loss(LossAttributes::bernoulli(0.5)),
            ),
            toxic(
                "loss2",
                Direction::Upstream,
                ToxicKind::Loss(LossAttributes::bernoulli(0.5)),
            ),
            toxic(
                "cut",
                Direction::Downstream,
                ToxicKind::LimitData { bytes: 10 },
            ),
            toxic(
                "hold",
                Direction::Upstream,
                ToxicKind::Timeout {
                    timeout_ms: 0,
                    hold: true,
                },
            ),
            toxic(
                "drop",
                Direction::Downstream,
                ToxicKind::Timeout {
                    timeout_ms: 300,
                    hold: false,
                },
            ),
        ];
        let f = resolve(&local(), &toxics, &mut draws());
        assert_eq!(f.downstream.link.delay, Duration::from_millis(150));
        assert_eq!(f.downstream.link.jitter, Duration::from_millis(10));
        assert_eq!(f.upstream.link.delay, Duration::ZERO);
        assert_eq!(f.upstream.link.rate_bps, Some(400_000), "50 KB/s");
        assert_eq!(f.upstream.link.loss, LossProcess::Bernoulli { p: 0.75 });
        assert_eq!(f.downstream.limit, Some(10));
        assert_eq!(f.upstream.hold, Some(None), "held forever");
        assert_eq!(f.upstream.discard, None);
        assert_eq!(
            (f.downstream.hold, f.downstream.discard),
            (None, Some(Some(Duration::from_millis(300)))),
            "Toxiproxy's timeout drops, and closes after it"
        );
        assert_eq!(f.timing.rtt, Duration::from_millis(150));
        assert_eq!(f.profile.downstream, f.downstream.link);
    }

    #[test]
    fn a_profile_toxic_brings_its_direction_and_set_up() {
        let lossy = Profile::builtin("lossy-10ms-1pct").unwrap();
        let toxics = [
            toxic(
                "p",
                Direction::Upstream,
                ToxicKind::Profile(ProfileAttributes {
                    settled: Some(Box::new(lossy.clone())),
                    ..ProfileAttributes::named("lossy-10ms-1pct")
                }),
            ),
            toxic(
                "syn",
                Direction::Upstream,
                ToxicKind::SynLoss(Rate {
                    percent: None,
                    probability: Some(0.2),
                }),
            ),
        ];
        let f = resolve(&local(), &toxics, &mut draws());
        assert_eq!(f.upstream.link, lossy.upstream);
        assert_eq!(f.downstream.link, local().downstream);
        assert_eq!(f.profile.connect, lossy.connect);
        assert_eq!(
            f.setup.loss,
            HandshakeLoss {
                syn: Some(LossProcess::Bernoulli { p: 0.2 }),
                synack: None
            }
        );
    }

    /// A `syn_loss` toxic loses what its stream carries: upstream the SYN, downstream the
    /// SYN-ACK, never both.
    #[test]
    fn syn_loss_applies_to_its_own_stream_only() {
        use crate::fault::ConnectionModel;
        let n = 20_000;
        for stream in [Direction::Upstream, Direction::Downstream] {
            let toxics = [toxic(
                "syn",
                stream,
                ToxicKind::SynLoss(Rate {
                    percent: None,
                    probability: Some(0.2),
                }),
            )];
            let f = resolve(&local(), &toxics, &mut draws());
            let (mut syn, mut synack) = (0i64, 0i64);
            for ordinal in 0..n {
                let m = ConnectionModel::with_setup(&f.profile, f.setup, 5, "syn", ordinal);
                syn += i64::from(m.syn_losses > 0);
                synack += i64::from(m.synack_losses > 0);
            }
            let (lost, spared) = match stream {
                Direction::Upstream => (syn, synack),
                Direction::Downstream => (synack, syn),
            };
            assert_eq!(spared, 0, "{stream:?}: the other direction is not lost");
            // 99 % binomial interval around 0.2 · 20,000 = 4000: ± 2.576·√(n·p·q) ≈ ± 146.
            assert!(
                (lost - 4000).abs() < 146,
                "{stream:?}: {lost} lost handshakes"
            );
        }
    }

    /// Toxicity is a per-connection draw: over many connections the share that suffers a toxic
    /// matches it, a connection keeps its draw, and an update draws again.
    #[test]
    fn toxicity_is_drawn_once_per_connection_and_revision() {
        let mut t = toxic(
            "lat",
            Direction::Downstream,
            ToxicKind::Latency {
                latency_ms: 1,
                jitter_ms: 0,
            },
        );
        t.toxicity = 0.3;
        let n = 20_000;
        let mut hit = 0;
        for i in 0..n {
            let mut d = Draws::new(stream_rng(9, "p", i, Direction::Upstream));
            let first = d.applies(&t);
            for _ in 0..5 {
                assert_eq!(d.applies(&t), first, "kept for the connection");
            }
            hit += u32::from(first);
        }
        // 99 % binomial interval around 0.3 · 20,000 = 6000: ± 2.576·√(n·p·q) ≈ ± 167.
        assert!((hit as i64 - 6000).abs() < 167, "{hit}");
        let mut d = draws();
        let mut changed = 0;
        for revision in 0..1000 {
            t.revision = revision;
            let before = d.applies(&t);
            t.revision = revision + 1;
            changed += u32::from(d.applies(&t) != before);
        }
        assert!(changed > 300, "updates draw again: {changed}");
        t.toxicity = 0.0;
        t.revision = 99_999;
        assert!(!d.applies(&t));
        t.toxicity = 1.0;
        t.revision = 100_000;
        assert!(d.applies(&t));
    }

    #[test]
    fn toxics_limited_to_clients_apply_to_those_only() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let block = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(block.contains(ip("10.1.200.3")));
        assert!(block.contains(ip("::ffff:10.1.0.9")), "mapped IPv4");
        assert!(!block.contains(ip("10.2.0.1")));
        assert!(!block.contains(ip("::1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        assert!(Cidr::parse("::1").unwrap().contains(ip("::1")));
        assert_eq!(
            Cidr::parse("127.0.0.2").unwrap().to_string(),
            "127.0.0.2/32"
        );
        for bad in [
            "10.0.0.1/8",
            "10.0.0.0/33",
            "::/129",
            "nope",
            "10.0.0.0/-1",
            "",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
        let mut t = toxic(
            "lat",
            Direction::Downstream,
            ToxicKind::Latency {
                latency_ms: 10,
                jitter_ms: 0,
            },
        );
        t.clients = vec![Cidr::parse("127.0.0.2/32").unwrap()];
        let from = |t: &Toxic, c: Option<&str>| draws().from_client(c.map(ip)).applies(t);
        assert!(from(&t, Some("127.0.0.2")));
        assert!(!from(&t, Some("127.0.0.1")));
        assert!(!from(&t, None), "an unknown client is not one of them");
        t.clients.clear();
        assert!(
            from(&t, None) && from(&t, Some("127.0.0.1")),
            "no clients: every client"
        );
    }

    #[test]
    fn slices_add_up_and_stay_in_bounds() {
        let s = Slicer {
            average_size: 100,
            size_variation: 30,
            delay: Duration::ZERO,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for len in [1, 99, 100, 1000, 65_536] {
            let pieces = slice(len, &s, &mut rng, usize::MAX);
            assert_eq!(pieces.iter().sum::<usize>(), len);
            let (last, rest) = pieces.split_last().unwrap();
            assert!(rest.iter().all(|&p| (70..=130).contains(&p)), "{pieces:?}");
            assert!(*last <= 130);
        }
        assert_eq!(s.min_piece(), 70);
        let bytewise = Slicer {
            average_size: 1,
            size_variation: 0,
            delay: Duration::ZERO,
        };
        assert_eq!(bytewise.min_piece(), 1);
        let pieces = slice(10_000, &bytewise, &mut rng, 100);
        assert_eq!(pieces.len(), 100);
        assert_eq!(pieces[..99], [1; 99]);
        assert_eq!(pieces.iter().sum::<usize>(), 10_000);
    }

    /// Retuning a live direction never lets later bytes overtake earlier ones.
    #[test]
    fn retuning_keeps_releases_in_order() {
        let slow = resolve(
            &local(),
            &[toxic(
                "l",
                Direction::Downstream,
                ToxicKind::Latency {
                    latency_ms: 500,
                    jitter_ms: 0,
                },
            )],
            &mut draws(),
        );
        let fast = resolve(&local(), &[], &mut draws());
        let mut m = LinkModel::new(
            &slow.downstream.link,
            slow.timing,
            ChaCha8Rng::seed_from_u64(1),
        );
        let mut segs: Vec<Segment> = Vec::new();
        m.send(Duration::ZERO, 100, &mut segs);
        assert_eq!(segs[0].release, Duration::from_millis(500));
        m.retune(&fast.downstream.link, fast.timing);
        m.send(Duration::from_millis(1), 100, &mut segs);
        assert_eq!(segs[1].release, Duration::from_millis(500), "held behind");
        m.send(Duration::from_millis(600), 100, &mut segs);
        assert_eq!(segs[2].release, Duration::from_millis(600), "then fast");
    }
}
