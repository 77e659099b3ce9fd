//! What goes over the control API's wire, in Toxiproxy's shapes: the server answers with these
//! and [`super::client::Client`] reads them back; request bodies ([`ProxyRequest`],
//! [`ProxyUpdate`], [`ToxicRequest`], [`ToxicUpdate`]) are deserialised into these structs by
//! the server and built from them by the client. A request field of the wrong JSON type is kept
//! as [`Given::Other`] rather than refused by serde, so the server names it in Toxiproxy's
//! words and in the order it always checked fields ([`super::registry::ProxySpec`],
//! [`super::toxics::ToxicEntry`]).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use crate::fault::Direction;
use crate::toxic::ToxicKind;

/// A proxy: `GET /proxies/{name}`, and what `POST /proxies` and `/populate` take.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProxyJson {
    pub name: String,
    /// Empty in a request: a free port on loopback.
    #[serde(default)]
    pub listen: String,
    pub upstream: String,
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// Ours: `model` or `kernel`; empty in a request: `model`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub engine: String,
    /// Always given in answers. In a request, `None` creates the proxy without toxics and
    /// leaves those of a proxy `/populate` keeps running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toxics: Option<Vec<ToxicJson>>,
}

fn enabled() -> bool {
    true
}

impl ProxyJson {
    /// A request for an enabled model proxy `name` in front of `upstream`.
    pub fn new(name: &str, listen: &str, upstream: &str) -> ProxyJson {
        ProxyJson {
            name: name.to_string(),
            listen: listen.to_string(),
            upstream: upstream.to_string(),
            enabled: true,
            engine: String::new(),
            toxics: None,
        }
    }

    /// Its toxics (none when a request left them out).
    pub fn toxics(&self) -> &[ToxicJson] {
        self.toxics.as_deref().unwrap_or_default()
    }
}

/// A toxic: `{name, type, stream, toxicity, attributes}`. The attributes stay a map, since
/// beside its type's (see [`ToxicKind`]) a toxic carries any type's `clients` and whatever else
/// a client gave, which the server hands back as given.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToxicJson {
    /// Empty in a request: `TYPE_STREAM`.
    #[serde(default)]
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default = "downstream")]
    pub stream: String,
    #[serde(default = "always")]
    pub toxicity: f32,
    #[serde(default)]
    pub attributes: Map<String, Value>,
}

fn downstream() -> String {
    Direction::Downstream.as_str().to_string()
}

fn always() -> f32 {
    1.0
}

impl ToxicJson {
    /// A toxic of `kind` on `stream`, applying to every connection.
    pub fn new(name: &str, stream: Direction, kind: &ToxicKind) -> ToxicJson {
        let (kind, attributes) = kind.split();
        ToxicJson {
            name: name.to_string(),
            kind,
            stream: stream.as_str().to_string(),
            toxicity: 1.0,
            attributes,
        }
    }

    /// What the toxic does; `None` for a type or attributes faultrig does not know.
    pub fn kind(&self) -> Option<ToxicKind> {
        ToxicKind::join(&self.kind, &self.attributes).ok()
    }
}

/// `POST /populate`'s answer, and with [`ErrorJson`] the proxies done before an error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct PopulateJson {
    pub proxies: Vec<ProxyJson>,
}

/// `GET /version`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct VersionJson {
    pub version: String,
}

/// `GET /proxies/{name}/stats` (ours).
pub use crate::proxy::StatsSnapshot as StatsJson;

/// Every error: `{"error": message, "status": code}`; a failed `/populate` adds the proxies
/// it did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorJson {
    pub error: String,
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxies: Option<Vec<ProxyJson>>,
}

/// A request field as a client gave it: of its type, or any other JSON (kept for the error,
/// which the server words as Toxiproxy does: "name must be a string", "stream was invalid, ..."
/// with no `bad request body` prefix). An absent or `null` field is `None` around it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Given<T> {
    Is(T),
    Other(Value),
}

impl<T> From<T> for Given<T> {
    fn from(value: T) -> Given<T> {
        Given::Is(value)
    }
}

impl<T: Serialize> Given<T> {
    /// The field as JSON, for a message's "got ...".
    pub fn shown(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// A proxy to create: `POST /proxies`, each entry of `/populate` and of `--config`. Every
/// field may be left out; the server says which are required (`name`, `upstream`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ProxyRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Given<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<Given<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Given<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<Given<bool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<Given<String>>,
    /// Each entry a whole toxic body, read as `POST /proxies/{name}/toxics` reads one (so an
    /// entry that is not an object gets that endpoint's message, naming its place).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toxics: Option<Given<Vec<Value>>>,
}

/// A partial update of a proxy (`POST|PATCH /proxies/{name}`): what is given changes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProxyUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<Given<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Given<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<Given<bool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<Given<String>>,
}

/// A toxic to create (`POST /proxies/{proxy}/toxics`); left out: Toxiproxy's defaults.
///
/// `attributes` stays a JSON map, as in [`ToxicUpdate`]: each attribute is checked against its
/// type's bounds on the raw JSON (a latency of 2^63, -1 or "abc" each gets Toxiproxy's 400 naming
/// the attribute and its range, which a typed field would have refused or truncated in serde's
/// words), an update merges the attributes it gives over the toxic's, and attributes of no type
/// (`clients`, a client's own) are handed back as given.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToxicRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Given<String>>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Given<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<Given<String>>,
    /// A JSON number, so a message shows it as sent (`1e300`, not an f32's `inf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toxicity: Option<Given<Number>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<Given<Map<String, Value>>>,
}

/// An update of a toxic (`POST /proxies/{proxy}/toxics/{name}`): the attributes given replace
/// the toxic's, the rest stay; `toxicity` when given. Why `attributes` is a map: see
/// [`ToxicRequest`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToxicUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toxicity: Option<Given<Number>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<Given<Map<String, Value>>>,
}

impl ToxicUpdate {
    /// An update of these attributes only.
    pub fn of_attributes(attributes: Map<String, Value>) -> ToxicUpdate {
        ToxicUpdate {
            toxicity: None,
            attributes: Some(Given::Is(attributes)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toxic::LossAttributes;
    use serde_json::json;

    /// The shapes Toxiproxy's clients read, field for field.
    #[test]
    fn answers_have_toxiproxys_shapes() {
        let kind = ToxicKind::Latency {
            latency_ms: 100,
            jitter_ms: 0,
        };
        let toxic = ToxicJson::new("lat", Direction::Upstream, &kind);
        let proxy = ProxyJson {
            engine: "model".into(),
            toxics: Some(vec![toxic.clone()]),
            ..ProxyJson::new("p", "127.0.0.1:1", "127.0.0.1:2")
        };
        assert_eq!(
            serde_json::to_value(&proxy).unwrap(),
            json!({
                "name": "p",
                "listen": "127.0.0.1:1",
                "upstream": "127.0.0.1:2",
                "enabled": true,
                "engine": "model",
                "toxics": [{
                    "name": "lat",
                    "type": "latency",
                    "stream": "upstream",
                    "toxicity": 1.0,
                    "attributes": {"latency": 100, "jitter": 0},
                }],
            })
        );
        assert_eq!(toxic.kind(), Some(kind));
        let loss = ToxicKind::Loss(LossAttributes::bernoulli(0.25));
        let wire = ToxicJson::new("l", Direction::Downstream, &loss);
        assert_eq!(
            Value::Object(wire.attributes.clone()),
            json!({"probability": 0.25})
        );
        assert_eq!(wire.kind(), Some(loss));
        let percent = ToxicKind::Loss(LossAttributes {
            rate: crate::toxic::Rate {
                percent: Some(30.0),
                probability: None,
            },
            ..LossAttributes::default()
        });
        let wire = ToxicJson::new("l", Direction::Downstream, &percent);
        assert_eq!(
            Value::Object(wire.attributes),
            json!({"percent": 30}),
            "an integer, as Toxiproxy's clients read attributes"
        );
        // A request leaves out what Toxiproxy defaults.
        let request: ProxyJson =
            serde_json::from_value(json!({"name": "q", "upstream": "h:1"})).unwrap();
        assert_eq!(request, ProxyJson::new("q", "", "h:1"));
        assert_eq!(
            serde_json::to_value(ErrorJson {
                error: "proxy not found".into(),
                status: 404,
                proxies: None
            })
            .unwrap(),
            json!({"error": "proxy not found", "status": 404})
        );
    }
}
