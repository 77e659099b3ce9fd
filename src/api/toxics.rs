//! Toxics as the API's JSON carries them: `{name, type, stream, toxicity, attributes}`, with
//! Toxiproxy's attribute names and integer units, turned into [`crate::toxic::Toxic`]s. The
//! types, their attributes and bounds are [`ToxicKind`]'s; this module checks a body against
//! them with Toxiproxy's messages.

use serde_json::{Map, Number, Value};

use super::wire::{Given, ToxicJson, ToxicRequest, ToxicUpdate};
use super::ApiError;
use crate::fault::Direction;
use crate::toxic::{Bound, Cidr, Range, Toxic, ToxicKind};

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
            Value::String(s) => Cidr::parse(s).map_err(|e| bad(e.to_string())),
            other => Err(bad(format!("{other} is not a string"))),
        })
        .collect()
}

/// Attributes checked against their type's [`ToxicKind::bounds`].
struct Checked<'a> {
    type_name: &'a str,
    given: &'a Map<String, Value>,
}

impl Checked<'_> {
    fn bad(&self, bound: &Bound, v: &Value) -> ApiError {
        let allowed = match bound.range {
            Range::Int { min, max, unit } => {
                format!("an integer from {min} to {max} ({unit})")
            }
            Range::Number { max } => format!("a number from 0 to {max}"),
            Range::Text => "a string".to_string(),
            Range::Flag => "true or false".to_string(),
        };
        let limit = bound
            .at_most
            .map(|o| format!(", at most {o}"))
            .unwrap_or_default();
        ApiError::bad_body(&format!(
            "attribute {} of a {} toxic must be {allowed}{limit}, got {v}",
            bound.name, self.type_name
        ))
    }

    /// One attribute in its bounds; absent or null is 0 for an integer (Toxiproxy's zero
    /// default), so an integer whose bounds exclude 0 is required.
    fn check(&self, bound: &Bound) -> Result<(), ApiError> {
        let v = self.given.get(bound.name).unwrap_or(&Value::Null);
        let n = match (bound.range, v) {
            (
                Range::Int { min: 0, .. } | Range::Number { .. } | Range::Text | Range::Flag,
                Value::Null,
            ) => return Ok(()),
            (Range::Text, Value::String(_)) | (Range::Flag, Value::Bool(_)) => return Ok(()),
            (Range::Int { min, max, .. }, _) => match v.as_u64() {
                Some(n) if (min..=max).contains(&n) => n as f64,
                _ => return Err(self.bad(bound, v)),
            },
            (Range::Number { max }, _) => match v.as_f64() {
                Some(n) if (0.0..=max).contains(&n) => n,
                _ => return Err(self.bad(bound, v)),
            },
            (Range::Text | Range::Flag, _) => return Err(self.bad(bound, v)),
        };
        if let Some(other) = bound.at_most {
            let limit = self.given.get(other).and_then(Value::as_u64).unwrap_or(0);
            if n > limit as f64 {
                return Err(self.bad(bound, v));
            }
        }
        Ok(())
    }
}

/// The kind `type_name` and `attributes` describe, every bound checked and its meaning
/// settled. Errors carry Toxiproxy's messages and codes.
fn kind_of(type_name: &str, attributes: &Map<String, Value>) -> Result<ToxicKind, ApiError> {
    let empty = ToxicKind::empty(type_name).ok_or_else(ApiError::invalid_toxic_type)?;
    let checked = Checked {
        type_name,
        given: attributes,
    };
    for bound in empty.bounds() {
        checked.check(bound)?;
    }
    let mut kind =
        ToxicKind::join(type_name, attributes).map_err(|e| ApiError::bad_body(&e.to_string()))?;
    kind.settle()
        .map_err(|e| ApiError::bad_body(&e.to_string()))?;
    Ok(kind)
}

/// A toxic with the attributes it was given (kept so partial updates merge over them).
#[derive(Clone, Debug)]
pub struct ToxicEntry {
    pub toxic: Toxic,
    pub attributes: Map<String, Value>,
}

impl ToxicEntry {
    /// Builds a toxic from a create request (Toxiproxy's defaults: stream downstream, toxicity
    /// 1, name `TYPE_STREAM`). Fields are checked in this order, each with Toxiproxy's message
    /// and code.
    pub fn create(request: &ToxicRequest, revision: u64) -> Result<ToxicEntry, ApiError> {
        let stream_text = match &request.stream {
            None => Direction::Downstream.as_str().to_string(),
            Some(Given::Is(s)) => s.clone(),
            Some(Given::Other(_)) => return Err(ApiError::invalid_stream()),
        };
        let stream = parse_stream(&stream_text)?;
        let kind_name = match &request.kind {
            Some(Given::Is(t)) => t.clone(),
            _ => String::new(),
        };
        let name = match &request.name {
            Some(Given::Is(n)) if !n.is_empty() => n.clone(),
            Some(Given::Is(_)) | None => format!("{kind_name}_{stream_text}"),
            Some(Given::Other(_)) => return Err(ApiError::bad_body("name must be a string")),
        };
        if ToxicKind::empty(&kind_name).is_none() {
            return Err(ApiError::invalid_toxic_type());
        }
        let toxicity = request.toxicity.as_ref().map_or(Ok(1.0), toxicity)?;
        let attributes = match &request.attributes {
            None => Map::new(),
            Some(given) => attributes(given)?.clone(),
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

    /// Merges an update over this toxic: given attributes replace theirs, the rest stay;
    /// name, type and stream cannot change (as in Toxiproxy).
    pub fn update(&self, update: &ToxicUpdate, revision: u64) -> Result<ToxicEntry, ApiError> {
        let mut next = self.clone();
        if let Some(t) = &update.toxicity {
            next.toxic.toxicity = toxicity(t)?;
        }
        if let Some(given) = &update.attributes {
            for (k, v) in attributes(given)? {
                next.attributes.insert(k.clone(), v.clone());
            }
        }
        let type_name = self.toxic.kind.type_name();
        next.toxic.kind = kind_of(&type_name, &next.attributes)?;
        next.toxic.clients = clients(&type_name, &next.attributes)?;
        next.toxic.revision = revision;
        Ok(next)
    }

    /// The toxic on the wire: every attribute of its type present (0 when never given), as
    /// Toxiproxy answers, and whatever else was given as it was given.
    pub(crate) fn to_wire(&self) -> ToxicJson {
        let mut wire = ToxicJson::new(&self.toxic.name, self.toxic.stream, &self.toxic.kind);
        wire.toxicity = self.toxic.toxicity;
        for (k, v) in &self.attributes {
            wire.attributes.insert(k.clone(), v.clone());
        }
        wire
    }
}

pub(crate) fn parse_stream(s: &str) -> Result<Direction, ApiError> {
    match s.to_ascii_lowercase().as_str() {
        "upstream" => Ok(Direction::Upstream),
        "downstream" => Ok(Direction::Downstream),
        _ => Err(ApiError::invalid_stream()),
    }
}

fn toxicity(given: &Given<Number>) -> Result<f32, ApiError> {
    match given {
        Given::Is(n) => match n.as_f64() {
            Some(t) if (0.0..=1.0).contains(&t) => return Ok(t as f32),
            _ => {}
        },
        Given::Other(_) => {}
    }
    Err(ApiError::bad_body(&format!(
        "toxicity must be a number in [0, 1], got {}",
        given.shown()
    )))
}

fn attributes(given: &Given<Map<String, Value>>) -> Result<&Map<String, Value>, ApiError> {
    match given {
        Given::Is(m) => Ok(m),
        Given::Other(_) => Err(ApiError::bad_body("attributes must be an object")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::parse_body;
    use crate::profile::LossProcess;
    use crate::toxic::ProfileAttributes;
    use serde_json::json;

    /// A toxic from a create body, as the server reads one.
    fn create(body: &Value, revision: u64) -> Result<ToxicEntry, ApiError> {
        ToxicEntry::create(&parse_body(body.clone())?, revision)
    }

    /// `e` updated by an update body, as the server reads one.
    fn update(e: &ToxicEntry, body: &Value, revision: u64) -> Result<ToxicEntry, ApiError> {
        e.update(&parse_body(body.clone())?, revision)
    }

    #[test]
    fn defaults_and_partial_updates_follow_toxiproxy() {
        let e = create(
            &json!({"type": "latency", "attributes": {"latency": 100}}),
            1,
        )
        .unwrap();
        assert_eq!(e.toxic.name, "latency_downstream");
        assert_eq!(e.toxic.stream, Direction::Downstream);
        assert_eq!(e.toxic.toxicity, 1.0);
        assert_eq!(
            Value::Object(e.to_wire().attributes),
            json!({"latency": 100, "jitter": 0})
        );
        let u = update(&e, &json!({"attributes": {"jitter": 5}}), 2).unwrap();
        assert_eq!(
            u.toxic.kind,
            ToxicKind::Latency {
                latency_ms: 100,
                jitter_ms: 5
            }
        );
        assert_eq!(u.toxic.revision, 2);
        let u = update(&u, &json!({"toxicity": 0.5}), 3).unwrap();
        assert_eq!(u.toxic.toxicity, 0.5);
        assert_eq!(u.attributes["latency"], json!(100), "kept");
    }

    #[test]
    fn a_profile_toxic_takes_a_profile_files_text() {
        let text = "name = \"mine\"\n[link]\ndelay = \"7ms\"\n";
        let e = create(
            &json!({"type": "profile", "stream": "downstream", "attributes": {"toml": text}}),
            0,
        )
        .unwrap();
        let ToxicKind::Profile(ProfileAttributes {
            settled: Some(profile),
            ..
        }) = &e.toxic.kind
        else {
            panic!("{:?}", e.toxic.kind)
        };
        assert_eq!(profile.name, "mine");
        assert_eq!(
            profile.downstream.delay,
            std::time::Duration::from_millis(7)
        );
        let bad = json!({"type": "profile", "attributes": {"toml": "[link]\ndelay = 5\n"}});
        let e = create(&bad, 0).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("delay"), "{e:?}");
        let both = json!({"type": "profile", "attributes": {"toml": text, "profile": "lan"}});
        assert_eq!(create(&both, 0).unwrap_err().status, 400);
    }

    #[test]
    fn bad_toxics_get_toxiproxy_errors() {
        let err = |v: Value| create(&v, 0).unwrap_err();
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
        let up = create(
            &json!({"type": "loss", "stream": "UPSTREAM", "attributes": {"percent": 1}}),
            0,
        )
        .unwrap();
        assert_eq!(
            up.toxic.name, "loss_UPSTREAM",
            "the stream as sent, like Toxiproxy"
        );
        let ToxicKind::Loss(loss) = &up.toxic.kind else {
            panic!("{:?}", up.toxic.kind)
        };
        assert_eq!(loss.process(), Ok(LossProcess::Bernoulli { p: 0.01 }));
    }
}
