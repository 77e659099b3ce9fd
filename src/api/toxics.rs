//! Toxics as the API's JSON carries them: `{name, type, stream, toxicity, attributes}`, with
//! Toxiproxy's attribute names and integer units, turned into [`crate::toxic::Toxic`]s.

use serde_json::{json, Map, Value};

use super::ApiError;
use crate::fault::Direction;
use crate::profile::{LossProcess, Profile, MAX_PROFILE_DURATION};
use crate::toxic::{Toxic, ToxicKind};

/// Every toxic type, with its attributes and their defaults (what a missing one means).
const TYPES: &[(&str, &[&str])] = &[
    ("latency", &["latency", "jitter"]),
    ("bandwidth", &["rate"]),
    ("slow_close", &["delay"]),
    ("timeout", &["timeout"]),
    ("reset_peer", &["timeout"]),
    ("slicer", &["average_size", "size_variation", "delay"]),
    ("limit_data", &["bytes"]),
    ("noop", &[]),
    // Ours. `loss`: `percent` (integer, so Toxiproxy's clients can read it back) or
    // `probability`; Gilbert–Elliott with `p` and `r` (and optional `h`, `k`) as in profiles.
    ("loss", &[]),
    ("syn_loss", &[]),
    ("profile", &[]),
    ("handshake", &[]),
];

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
        next.toxic.kind = kind_of(self.toxic.kind.type_name(), &next.attributes)?;
        next.toxic.revision = revision;
        Ok(next)
    }

    /// The toxic's JSON: every attribute of its type present (0 when never given), as
    /// Toxiproxy answers.
    pub fn to_json(&self) -> Value {
        let type_name = self.toxic.kind.type_name();
        let mut attributes = Map::new();
        if let Some((_, names)) = TYPES.iter().find(|(t, _)| *t == type_name) {
            for n in *names {
                attributes.insert((*n).to_string(), json!(0));
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

/// An attribute in Toxiproxy's integer units; missing means 0.
fn int(attrs: &Map<String, Value>, key: &str) -> Result<u64, ApiError> {
    match attrs.get(key) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v.as_u64().ok_or_else(|| {
            ApiError::bad_body(&format!(
                "attribute {key} must be a non-negative integer, got {v}"
            ))
        }),
    }
}

/// A millisecond attribute the fault model multiplies (latency, jitter): bounded like a
/// profile's durations.
fn model_ms(attrs: &Map<String, Value>, key: &str) -> Result<u64, ApiError> {
    let max = MAX_PROFILE_DURATION.as_millis() as u64;
    match int(attrs, key)? {
        ms if ms > max => Err(ApiError::bad_body(&format!(
            "attribute {key} must be at most {max} ms, got {ms}"
        ))),
        ms => Ok(ms),
    }
}

/// A probability attribute; `None` when absent.
fn probability(attrs: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match attrs.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(p) if (0.0..=1.0).contains(&p) => Ok(Some(p)),
            _ => Err(ApiError::bad_body(&format!(
                "attribute {key} must be a probability in [0, 1], got {v}"
            ))),
        },
    }
}

/// `probability` (0..1) or `percent` (0..100): the loss rate of `loss` and `syn_loss`.
fn rate(attrs: &Map<String, Value>) -> Result<Option<f64>, ApiError> {
    let percent = match attrs.get("percent") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_f64() {
            Some(p) if (0.0..=100.0).contains(&p) => Some(p / 100.0),
            _ => {
                return Err(ApiError::bad_body(&format!(
                    "attribute percent must be in [0, 100], got {v}"
                )))
            }
        },
    };
    match (probability(attrs, "probability")?, percent) {
        (Some(_), Some(_)) => Err(ApiError::bad_body("give probability or percent, not both")),
        (p, q) => Ok(p.or(q)),
    }
}

fn kind_of(type_name: &str, a: &Map<String, Value>) -> Result<ToxicKind, ApiError> {
    Ok(match type_name {
        "latency" => ToxicKind::Latency {
            latency_ms: model_ms(a, "latency")?,
            jitter_ms: model_ms(a, "jitter")?,
        },
        "bandwidth" => ToxicKind::Bandwidth {
            rate_kb_s: int(a, "rate")?,
        },
        "slow_close" => ToxicKind::SlowClose {
            delay_ms: int(a, "delay")?,
        },
        "timeout" => ToxicKind::Timeout {
            timeout_ms: int(a, "timeout")?,
        },
        "reset_peer" => ToxicKind::ResetPeer {
            timeout_ms: int(a, "timeout")?,
        },
        "slicer" => ToxicKind::Slicer {
            average_size: int(a, "average_size")?,
            size_variation: int(a, "size_variation")?,
            delay_us: int(a, "delay")?,
        },
        "limit_data" => ToxicKind::LimitData {
            bytes: int(a, "bytes")?,
        },
        "noop" => ToxicKind::Noop,
        "handshake" => ToxicKind::Handshake,
        "loss" => {
            let loss = match (probability(a, "p")?, probability(a, "r")?) {
                (Some(p), Some(r)) => LossProcess::GilbertElliott {
                    p,
                    r,
                    h: probability(a, "h")?.unwrap_or(0.0),
                    k: probability(a, "k")?.unwrap_or(1.0),
                    step: None,
                },
                (None, None) => match rate(a)? {
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
            probability: rate(a)?
                .ok_or_else(|| ApiError::bad_body("syn_loss needs percent or probability"))?,
        },
        "profile" => {
            // A built-in profile by name, or a whole profile file's text (how a remote run sends
            // a profile the proxy host does not have).
            let profile = match (a.get("profile"), a.get("toml")) {
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
