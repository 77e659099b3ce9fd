//! Toxics as the API's JSON carries them: `{name, type, stream, toxicity, attributes}`, with
//! Toxiproxy's attribute names and integer units, turned into [`crate::toxic::Toxic`]s.

use serde_json::{json, Map, Value};

use super::ApiError;
use crate::fault::Direction;
use crate::profile::{LossProcess, Profile, MAX_PROFILE_DURATION};
use crate::toxic::{Cidr, Toxic, ToxicKind, MAX_TIMER};

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

/// The most address blocks one toxic's `clients` may list: a few in practice, and each
/// connection checks them all whenever the toxics change.
const MAX_CLIENTS: usize = 256;

/// Attribute `clients` (any toxic type; ours, Toxiproxy issue #163): the client addresses or
/// `ADDR/PREFIX` blocks a toxic applies to; absent, null or empty: every client.
fn clients(type_name: &str, attributes: &Map<String, Value>) -> Result<Vec<Cidr>, ApiError> {
    let v = match attributes.get("clients") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(v) => v,
    };
    let bad = |why: String| {
        ApiError::bad_body(&format!(
            "attribute clients of a {type_name} toxic must be a list of at most {MAX_CLIENTS} \
             client addresses or ADDR/PREFIX blocks (e.g. [\"127.0.0.2/32\"]), got {v}: {why}"
        ))
    };
    let list = v.as_array().ok_or_else(|| bad("not a list".into()))?;
    if list.len() > MAX_CLIENTS {
        return Err(bad(format!("{} blocks", list.len())));
    }
    list.iter()
        .map(|c| match c {
            Value::String(s) => Cidr::parse(s).map_err(bad),
            other => Err(bad(format!("{other} is not a string"))),
        })
        .collect()
}

/// What a client may send for one attribute. Create and update both read attributes through
/// this table only, so a bound is defined once.
#[derive(Clone, Copy, Debug)]
struct Attr {
    name: &'static str,
    range: Range,
    /// Another attribute of the same toxic this one may not exceed (size_variation ≤
    /// average_size).
    at_most: Option<&'static str>,
}

#[derive(Clone, Copy, Debug)]
enum Range {
    /// An integer in `min..=max`, in `unit` (Toxiproxy's integer units).
    Int {
        min: u64,
        max: u64,
        unit: &'static str,
    },
    /// A number in `0..=max` (ours: loss rates), absent unless given.
    Number { max: f64 },
    /// Text (ours: a profile's name or file); absent unless given.
    Text,
}

const fn int(name: &'static str, min: u64, max: u64, unit: &'static str) -> Attr {
    Attr {
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
) -> Attr {
    Attr {
        name,
        range: Range::Int { min: 0, max, unit },
        at_most: Some(other),
    }
}

const fn number(name: &'static str, max: f64) -> Attr {
    Attr {
        name,
        range: Range::Number { max },
        at_most: None,
    }
}

const fn text(name: &'static str) -> Attr {
    Attr {
        name,
        range: Range::Text,
        at_most: None,
    }
}

/// Every toxic type with its attributes and their bounds. An integer attribute left out means
/// 0, as in Toxiproxy, and must then be allowed to be 0.
const TYPES: &[(&str, &[Attr])] = &[
    (
        "latency",
        &[
            int("latency", 0, MAX_MODEL_MS, "ms"),
            // A jitter wider than the latency is accepted, as Toxiproxy accepts it: the delay
            // is clipped at zero (so its mean is then above the latency asked for).
            int("jitter", 0, MAX_MODEL_MS, "ms"),
        ],
    ),
    // Toxiproxy takes rate 0 (and a missing rate) as no limit at all: refused here, since a
    // bandwidth toxic that limits nothing is a mistake, most often a hoped-for "stop".
    ("bandwidth", &[int("rate", 1, MAX_RATE_KB_S, "KB/s")]),
    ("slow_close", &[int("delay", 0, MAX_TIMER_MS, "ms")]),
    ("timeout", &[int("timeout", 0, MAX_TIMER_MS, "ms")]),
    ("reset_peer", &[int("timeout", 0, MAX_TIMER_MS, "ms")]),
    (
        "slicer",
        &[
            // Toxiproxy recurses without end on an average_size of 0, and cuts out of bounds
            // (a panic) when size_variation exceeds average_size.
            int("average_size", 1, MAX_SLICE, "bytes"),
            int_at_most("size_variation", MAX_SLICE, "bytes", "average_size"),
            int("delay", 0, MAX_SLICE_DELAY_US, "µs"),
        ],
    ),
    ("limit_data", &[int("bytes", 0, MAX_BYTES, "bytes")]),
    ("noop", &[]),
    // Ours. `loss`: `percent` (so Toxiproxy's clients can read it back) or `probability`;
    // Gilbert–Elliott with `p` and `r` (and optional `h`, `k`) as in profiles.
    (
        "loss",
        &[
            number("percent", 100.0),
            number("probability", 1.0),
            number("p", 1.0),
            number("r", 1.0),
            number("h", 1.0),
            number("k", 1.0),
        ],
    ),
    (
        "syn_loss",
        &[number("percent", 100.0), number("probability", 1.0)],
    ),
    ("profile", &[text("profile"), text("toml")]),
    ("handshake", &[]),
];

/// The attributes of `type_name`, read and checked against [`TYPES`].
struct Checked<'a> {
    type_name: &'a str,
    table: &'static [Attr],
    given: &'a Map<String, Value>,
}

impl<'a> Checked<'a> {
    fn new(type_name: &'a str, given: &'a Map<String, Value>) -> Result<Checked<'a>, ApiError> {
        let table = TYPES
            .iter()
            .find(|(t, _)| *t == type_name)
            .map(|(_, a)| *a)
            .ok_or_else(|| ApiError::new(400, "invalid toxic type"))?;
        let checked = Checked {
            type_name,
            table,
            given,
        };
        // Every bound checked up front, whether or not the type reads the attribute.
        for attr in table {
            checked.read(attr)?;
        }
        Ok(checked)
    }

    fn attr(&self, name: &str) -> &'static Attr {
        self.table
            .iter()
            .find(|a| a.name == name)
            .expect("the toxic types read only attributes their table lists")
    }

    fn bad(&self, attr: &Attr, v: &Value) -> ApiError {
        let allowed = match attr.range {
            Range::Int { min, max, unit } => {
                format!("an integer from {min} to {max} ({unit})")
            }
            Range::Number { max } => format!("a number from 0 to {max}"),
            Range::Text => "a string".to_string(),
        };
        let limit = attr
            .at_most
            .map(|o| format!(", at most {o}"))
            .unwrap_or_default();
        ApiError::bad_body(&format!(
            "attribute {} of a {} toxic must be {allowed}{limit}, got {v}",
            attr.name, self.type_name
        ))
    }

    /// One attribute as given (`None` when absent or null), in its bounds.
    fn read(&self, attr: &Attr) -> Result<Option<f64>, ApiError> {
        let v = match self.given.get(attr.name) {
            None | Some(Value::Null) => return Ok(None),
            Some(v) => v,
        };
        let n = match (attr.range, v) {
            (Range::Text, Value::String(_)) => return Ok(None),
            (Range::Int { min, max, .. }, _) => match v.as_u64() {
                Some(n) if (min..=max).contains(&n) => n as f64,
                _ => return Err(self.bad(attr, v)),
            },
            (Range::Number { max }, _) => match v.as_f64() {
                Some(n) if (0.0..=max).contains(&n) => n,
                _ => return Err(self.bad(attr, v)),
            },
            (Range::Text, _) => return Err(self.bad(attr, v)),
        };
        if let Some(other) = attr.at_most {
            let limit = self.int(other);
            if n > limit as f64 {
                return Err(self.bad(attr, v));
            }
        }
        Ok(Some(n))
    }

    /// An integer attribute; absent means 0 (Toxiproxy's zero default) unless 0 is out of its
    /// bounds, which makes it required.
    fn int(&self, name: &str) -> u64 {
        self.given.get(name).and_then(Value::as_u64).unwrap_or(0)
    }

    /// An integer attribute, present or required.
    fn required_int(&self, name: &str) -> Result<u64, ApiError> {
        let attr = self.attr(name);
        match (self.read(attr)?, attr.range) {
            (Some(n), _) => Ok(n as u64),
            (None, Range::Int { min: 0, .. }) => Ok(0),
            (None, _) => Err(self.bad(attr, &Value::Null)),
        }
    }

    fn number(&self, name: &str) -> Result<Option<f64>, ApiError> {
        self.read(self.attr(name))
    }
}

/// A toxic with the attributes it was given (kept so partial updates merge over them).
#[derive(Clone, Debug)]
pub struct ToxicEntry {
    pub toxic: Toxic,
    pub attributes: Map<String, Value>,
}

impl ToxicEntry {
    /// Builds a toxic from a create body (Toxiproxy's defaults: stream downstream, toxicity
    /// 1, name `TYPE_STREAM`). Errors carry Toxiproxy's messages and codes.
    pub fn create(body: &Value, revision: u64) -> Result<ToxicEntry, ApiError> {
        let obj = body
            .as_object()
            .ok_or_else(|| ApiError::bad_body("expected a JSON object"))?;
        let stream_text = match obj.get("stream") {
            None | Some(Value::Null) => "downstream".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(ApiError::invalid_stream()),
        };
        let stream = parse_stream(&stream_text)?;
        let kind_name = match obj.get("type") {
            Some(Value::String(t)) => t.clone(),
            _ => String::new(),
        };
        let name = match obj.get("name") {
            Some(Value::String(n)) if !n.is_empty() => n.clone(),
            Some(Value::String(_)) | None | Some(Value::Null) => {
                format!("{kind_name}_{stream_text}")
            }
            Some(_) => return Err(ApiError::bad_body("name must be a string")),
        };
        if !TYPES.iter().any(|(t, _)| *t == kind_name) {
            return Err(ApiError::new(400, "invalid toxic type"));
        }
        let toxicity = match obj.get("toxicity") {
            None | Some(Value::Null) => 1.0,
            Some(v) => toxicity(v)?,
        };
        let attributes = match obj.get("attributes") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => return Err(ApiError::bad_body("attributes must be an object")),
        };
        let kind = kind_of(&kind_name, &attributes)?;
        Ok(ToxicEntry {
            toxic: Toxic {
                name,
                kind,
                stream,
                toxicity,
                revision,
                clients: clients(&kind_name, &attributes)?,
            },
            attributes,
        })
    }

    /// Merges an update body over this toxic: given attributes replace theirs, the rest stay;
    /// name, type and stream cannot change (as in Toxiproxy).
    pub fn update(&self, body: &Value, revision: u64) -> Result<ToxicEntry, ApiError> {
        let obj = body
            .as_object()
            .ok_or_else(|| ApiError::bad_body("expected a JSON object"))?;
        let mut next = self.clone();
        if let Some(v) = obj.get("toxicity").filter(|v| !v.is_null()) {
            next.toxic.toxicity = toxicity(v)?;
        }
        match obj.get("attributes") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    next.attributes.insert(k.clone(), v.clone());
                }
            }
            Some(_) => return Err(ApiError::bad_body("attributes must be an object")),
        }
        let type_name = self.toxic.kind.type_name();
        next.toxic.kind = kind_of(type_name, &next.attributes)?;
        next.toxic.clients = clients(type_name, &next.attributes)?;
        next.toxic.revision = revision;
        Ok(next)
    }

    /// The toxic's JSON: every attribute of its type present (0 when never given), as
    /// Toxiproxy answers.
    pub fn to_json(&self) -> Value {
        let type_name = self.toxic.kind.type_name();
        let mut attributes = Map::new();
        if let Some((_, table)) = TYPES.iter().find(|(t, _)| *t == type_name) {
            for attr in table
                .iter()
                .filter(|a| matches!(a.range, Range::Int { .. }))
            {
                attributes.insert(attr.name.to_string(), json!(0));
            }
        }
        for (k, v) in &self.attributes {
            attributes.insert(k.clone(), v.clone());
        }
        json!({
            "name": self.toxic.name,
            "type": type_name,
            "stream": self.toxic.stream.as_str(),
            "toxicity": self.toxic.toxicity,
            "attributes": attributes,
        })
    }
}

pub fn parse_stream(s: &str) -> Result<Direction, ApiError> {
    match s.to_ascii_lowercase().as_str() {
        "upstream" => Ok(Direction::Upstream),
        "downstream" => Ok(Direction::Downstream),
        _ => Err(ApiError::invalid_stream()),
    }
}

fn toxicity(v: &Value) -> Result<f32, ApiError> {
    match v.as_f64() {
        Some(t) if (0.0..=1.0).contains(&t) => Ok(t as f32),
        _ => Err(ApiError::bad_body(&format!(
            "toxicity must be a number in [0, 1], got {v}"
        ))),
    }
}

/// `probability` (0..1) or `percent` (0..100): the loss rate of `loss` and `syn_loss`.
fn rate(a: &Checked) -> Result<Option<f64>, ApiError> {
    match (a.number("probability")?, a.number("percent")?) {
        (Some(_), Some(_)) => Err(ApiError::bad_body("give probability or percent, not both")),
        (p, q) => Ok(p.or(q.map(|q| q / 100.0))),
    }
}

fn kind_of(type_name: &str, attributes: &Map<String, Value>) -> Result<ToxicKind, ApiError> {
    let a = Checked::new(type_name, attributes)?;
    Ok(match type_name {
        "latency" => ToxicKind::Latency {
            latency_ms: a.required_int("latency")?,
            jitter_ms: a.required_int("jitter")?,
        },
        "bandwidth" => ToxicKind::Bandwidth {
            rate_kb_s: a.required_int("rate")?,
        },
        "slow_close" => ToxicKind::SlowClose {
            delay_ms: a.required_int("delay")?,
        },
        "timeout" => ToxicKind::Timeout {
            timeout_ms: a.required_int("timeout")?,
        },
        "reset_peer" => ToxicKind::ResetPeer {
            timeout_ms: a.required_int("timeout")?,
        },
        "slicer" => ToxicKind::Slicer {
            average_size: a.required_int("average_size")?,
            size_variation: a.required_int("size_variation")?,
            delay_us: a.required_int("delay")?,
        },
        "limit_data" => ToxicKind::LimitData {
            bytes: a.required_int("bytes")?,
        },
        "noop" => ToxicKind::Noop,
        "handshake" => ToxicKind::Handshake,
        "loss" => {
            let loss = match (a.number("p")?, a.number("r")?) {
                (Some(p), Some(r)) => LossProcess::GilbertElliott {
                    p,
                    r,
                    h: a.number("h")?.unwrap_or(0.0),
                    k: a.number("k")?.unwrap_or(1.0),
                    step: None,
                },
                (None, None) => match rate(&a)? {
                    Some(p) => LossProcess::Bernoulli { p },
                    None => {
                        return Err(ApiError::bad_body(
                            "loss needs percent or probability (or Gilbert-Elliott p and r)",
                        ))
                    }
                },
                _ => {
                    return Err(ApiError::bad_body(
                        "Gilbert-Elliott loss needs both p and r",
                    ))
                }
            };
            ToxicKind::Loss { loss }
        }
        "syn_loss" => ToxicKind::SynLoss {
            probability: rate(&a)?
                .ok_or_else(|| ApiError::bad_body("syn_loss needs percent or probability"))?,
        },
        "profile" => {
            // A built-in profile by name, or a whole profile file's text (how a remote run sends
            // a profile the proxy host does not have).
            let profile = match (attributes.get("profile"), attributes.get("toml")) {
                (Some(Value::String(name)), None) => Profile::builtin(name).ok_or_else(|| {
                    ApiError::bad_body(&format!(
                        "unknown profile \"{name}\" (use {})",
                        Profile::builtin_names().collect::<Vec<_>>().join(", ")
                    ))
                })?,
                (None, Some(Value::String(text))) => {
                    Profile::parse(text, "profile toxic attribute toml", "custom")
                        .map_err(|e| ApiError::bad_body(&e.to_string()))?
                }
                _ => {
                    return Err(ApiError::bad_body(
                        "profile needs attribute profile (a built-in profile name) or toml \
                         (a profile file's text)",
                    ))
                }
            };
            ToxicKind::Profile {
                profile: Box::new(profile),
            }
        }
        _ => return Err(ApiError::new(400, "invalid toxic type")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_partial_updates_follow_toxiproxy() {
        let e = ToxicEntry::create(
            &json!({"type": "latency", "attributes": {"latency": 100}}),
            1,
        )
        .unwrap();
        assert_eq!(e.toxic.name, "latency_downstream");
        assert_eq!(e.toxic.stream, Direction::Downstream);
        assert_eq!(e.toxic.toxicity, 1.0);
        assert_eq!(
            e.to_json()["attributes"],
            json!({"latency": 100, "jitter": 0})
        );
        let u = e.update(&json!({"attributes": {"jitter": 5}}), 2).unwrap();
        assert_eq!(
            u.toxic.kind,
            ToxicKind::Latency {
                latency_ms: 100,
                jitter_ms: 5
            }
        );
        assert_eq!(u.toxic.revision, 2);
        let u = u.update(&json!({"toxicity": 0.5}), 3).unwrap();
        assert_eq!(u.toxic.toxicity, 0.5);
        assert_eq!(u.attributes["latency"], json!(100), "kept");
    }

    #[test]
    fn a_profile_toxic_takes_a_profile_files_text() {
        let text = "name = \"mine\"\n[link]\ndelay = \"7ms\"\n";
        let e = ToxicEntry::create(
            &json!({"type": "profile", "stream": "downstream", "attributes": {"toml": text}}),
            0,
        )
        .unwrap();
        let ToxicKind::Profile { profile } = &e.toxic.kind else {
            panic!("{:?}", e.toxic.kind)
        };
        assert_eq!(profile.name, "mine");
        assert_eq!(
            profile.downstream.delay,
            std::time::Duration::from_millis(7)
        );
        let bad = json!({"type": "profile", "attributes": {"toml": "[link]\ndelay = 5\n"}});
        let e = ToxicEntry::create(&bad, 0).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("delay"), "{e:?}");
        let both = json!({"type": "profile", "attributes": {"toml": text, "profile": "lan"}});
        assert_eq!(ToxicEntry::create(&both, 0).unwrap_err().status, 400);
    }

    #[test]
    fn bad_toxics_get_toxiproxy_errors() {
        let err = |v: Value| ToxicEntry::create(&v, 0).unwrap_err();
        assert_eq!(
            err(json!({"type": "latency", "stream": "sideways"})).status,
            400
        );
        assert!(err(json!({"type": "latency", "stream": "sideways"}))
            .message
            .starts_with("stream was invalid"));
        assert_eq!(err(json!({"type": "melt"})).message, "invalid toxic type");
        assert_eq!(err(json!({})).message, "invalid toxic type");
        for v in [
            json!({"type": "latency", "toxicity": 2}),
            json!({"type": "latency", "attributes": {"latency": -1}}),
            // An hour is the most the model takes (its RTO backs off 2^15 times).
            json!({"type": "latency", "attributes": {"latency": 3_600_001}}),
            json!({"type": "latency", "attributes": {"jitter": u64::MAX}}),
            json!({"type": "loss"}),
            json!({"type": "loss", "attributes": {"percent": 101}}),
            json!({"type": "profile", "attributes": {"profile": "moon"}}),
        ] {
            let e = err(v.clone());
            assert_eq!(e.status, 400, "{v}");
            assert!(e.message.starts_with("bad request body"), "{v}: {e:?}");
        }
        let up = ToxicEntry::create(
            &json!({"type": "loss", "stream": "UPSTREAM", "attributes": {"percent": 1}}),
            0,
        )
        .unwrap();
        assert_eq!(
            up.toxic.name, "loss_UPSTREAM",
            "the stream as sent, like Toxiproxy"
        );
        assert_eq!(
            up.toxic.kind,
            ToxicKind::Loss {
                loss: LossProcess::Bernoulli { p: 0.01 }
            }
        );
    }
}
