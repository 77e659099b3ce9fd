//! The generic gRPC target: unary calls to any method of any service, its messages built at
//! run time from JSON against descriptors compiled from `.proto` files (protox) or fetched from
//! the server's reflection service.

use std::path::PathBuf;
use std::sync::Arc;

use crate::flavour::grpc::GrpcConnection;
use bytes::Buf;
use http::uri::PathAndQuery;
use prost::Message as _;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};
use serde::Deserialize;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::Status;

use super::{inline_or_file, TargetError, Template};
use crate::bench::{Session, Target};
use crate::flavour::{self, BoxFuture, CallError, Failure, WireCounters, MAX_MESSAGE};

/// A gRPC service to drive: `faultrig bench --flavour grpc` with these flags, or a TOML table
/// with these keys.
#[derive(Clone, Debug, Default, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcTargetSpec {
    /// Generic gRPC: .proto files defining the service, compiled at run time.
    #[arg(long, value_name = "FILE", num_args = 1.., requires = "call")]
    pub proto: Vec<PathBuf>,
    /// Generic gRPC: where the protos' imports are found (default: each proto's directory).
    #[arg(long, value_name = "DIR", num_args = 1.., requires = "proto")]
    pub import_path: Vec<PathBuf>,
    /// Generic gRPC: the unary method to call, pkg.Service/Method.
    #[arg(long, value_name = "pkg.Service/Method")]
    pub call: Option<String>,
    /// Generic gRPC: the request as JSON (protobuf's JSON mapping), or @FILE; a template
    /// (`{{index}}`, `{{worker}}`, `{{rand_int LO HI}}`, `{{rand_string N}}`). Default `{}`.
    #[arg(long, value_name = "JSON|@FILE", requires = "call")]
    pub data: Option<String>,
    /// Generic gRPC: request metadata, KEY=VALUE (ASCII), sent with every call.
    #[arg(long, value_name = "KEY=VALUE", num_args = 1.., requires = "call")]
    pub metadata: Vec<String>,
    /// Generic gRPC: learn the service from the server's reflection service (v1 or v1alpha).
    #[arg(long, conflicts_with = "proto", requires = "call")]
    pub reflect: bool,
    /// Generic gRPC: the reply every call must equal, as JSON or @FILE.
    #[arg(long, value_name = "JSON|@FILE", requires = "call")]
    pub expect: Option<String>,
}

impl GrpcTargetSpec {
    /// Whether any generic gRPC flag was given.
    pub(crate) fn is_set(&self) -> bool {
        self.call.is_some() || !self.proto.is_empty() || self.reflect
    }

    /// Checks and prepares everything before any load: the protos compiled (or the schema
    /// fetched from `addr`'s reflection service, within `timeout`), the method found and
    /// unary, the data parsed and checked against the request message (the first call's, as
    /// rendered with `seed`), the metadata and the expected reply parsed.
    pub(crate) async fn resolve(
        &self,
        addr: &str,
        seed: u64,
        timeout: std::time::Duration,
    ) -> Result<GrpcTarget, TargetError> {
        let call = self.call.as_deref().ok_or_else(|| {
            TargetError::new(
                "--call",
                "a generic gRPC target needs --call pkg.Service/Method",
            )
        })?;
        let (service, method) = call
            .rsplit_once('/')
            .or_else(|| call.rsplit_once('.'))
            .filter(|(s, m)| !s.is_empty() && !m.is_empty())
            .ok_or_else(|| TargetError::new(format!("--call {call}"), "use pkg.Service/Method"))?;
        let service = service.trim_start_matches('/');
        let pool = if self.reflect {
            reflected_pool(addr, service, timeout).await?
        } else if self.proto.is_empty() {
            return Err(TargetError::new(
                format!("--call {call}"),
                "say where the service is defined: --proto FILE… or --reflect",
            ));
        } else {
            self.compiled_pool()?
        };
        let what = format!("--call {call}");
        let svc = pool.get_service_by_name(service).ok_or_else(|| {
            let known: Vec<String> = pool.services().map(|s| s.full_name().to_string()).collect();
            TargetError::new(
                &what,
                format!(
                    "no service {service} in {} (services: {})",
                    self.source(),
                    list_or_none(&known)
                ),
            )
        })?;
        let method = svc.methods().find(|m| m.name() == method).ok_or_else(|| {
            let known: Vec<String> = svc.methods().map(|m| m.name().to_string()).collect();
            TargetError::new(
                &what,
                format!(
                    "service {service} has no method {method} (methods: {})",
                    list_or_none(&known)
                ),
            )
        })?;
        if method.is_client_streaming() || method.is_server_streaming() {
            return Err(TargetError::new(
                &what,
                "a streaming method; only unary methods are driven",
            ));
        }
        let (input, output) = (method.input(), method.output());

        let data_text = inline_or_file("--data", self.data.as_deref().unwrap_or("{}"))?;
        let template =
            Template::parse(&data_text).map_err(|e| TargetError::new("--data", e.to_string()))?;
        // The first call's data is checked here, so a message that does not fit is bad input,
        // found before any load; a template's later renders fit the same way.
        let first = message_from_json(&input, &template.render(seed, 0, 0)).map_err(|e| {
            TargetError::new("--data", format!("{e} (message {})", input.full_name()))
        })?;
        let payload_bytes = first.encoded_len();
        let data = if template.is_constant() {
            Data::Constant(first)
        } else {
            Data::Template(template)
        };

        let mut metadata = Vec::new();
        for kv in &self.metadata {
            let bad = |why: &str| TargetError::new(format!("--metadata {kv}"), why.to_string());
            let (k, v) = kv.split_once('=').ok_or_else(|| bad("use KEY=VALUE"))?;
            let key = AsciiMetadataKey::from_bytes(k.trim().to_ascii_lowercase().as_bytes())
                .map_err(|_| bad("not a valid metadata key (ASCII letters, digits, - _ .)"))?;
            let value = AsciiMetadataValue::try_from(v.trim())
                .map_err(|_| bad("not a valid metadata value (visible ASCII)"))?;
            metadata.push((key, value));
        }

        let expect = match &self.expect {
            Some(e) => {
                let text = inline_or_file("--expect", e)?;
                let message = message_from_json(&output, &text).map_err(|e| {
                    TargetError::new("--expect", format!("{e} (message {})", output.full_name()))
                })?;
                Some(canonical_json(&message))
            }
            None => None,
        };
        let path = format!("/{}/{}", svc.full_name(), method.name());
        Ok(GrpcTarget(Arc::new(Resolved {
            label: format!("{}/{}", svc.full_name(), method.name()),
            path: PathAndQuery::try_from(path.as_str())
                .map_err(|e| TargetError::new(&what, format!("not a valid method path: {e}")))?,
            input,
            output,
            data,
            seed,
            metadata,
            expect,
            payload_bytes,
        })))
    }

    fn source(&self) -> String {
        if self.reflect {
            "the server's reflection service".into()
        } else {
            let files: Vec<String> = self.proto.iter().map(|p| p.display().to_string()).collect();
            files.join(", ")
        }
    }

    /// The protos compiled with protox; imports are looked up in `--import-path`, or by default
    /// in each proto's own directory.
    fn compiled_pool(&self) -> Result<DescriptorPool, TargetError> {
        let what = format!("--proto {}", self.source());
        let includes: Vec<PathBuf> = if self.import_path.is_empty() {
            let mut dirs: Vec<PathBuf> = self
                .proto
                .iter()
                .map(|p| match p.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                    _ => PathBuf::from("."),
                })
                .collect();
            dirs.dedup();
            dirs
        } else {
            self.import_path.clone()
        };
        for p in &self.proto {
            if !p.is_file() {
                return Err(TargetError::new(
                    format!("--proto {}", p.display()),
                    "no such file",
                ));
            }
        }
        let set = protox::compile(&self.proto, &includes)
            .map_err(|e| TargetError::new(&what, format!("does not compile: {e}")))?;
        DescriptorPool::from_file_descriptor_set(set)
            .map_err(|e| TargetError::new(&what, e.to_string()))
    }
}

/// The descriptors of `service`, from `addr`'s reflection service.
async fn reflected_pool(
    addr: &str,
    service: &str,
    timeout: std::time::Duration,
) -> Result<DescriptorPool, TargetError> {
    let what = || format!("--reflect (reflection service at {addr})");
    // Its own counters: the look-up is not part of any cell's load.
    let wire = Arc::new(WireCounters::default());
    let files = tokio::time::timeout(timeout, async {
        let channel = flavour::grpc::channel(addr, &wire)
            .await
            .map_err(|e| format!("cannot connect: {}", e.detail))?;
        super::reflection::files_for(channel, service).await
    })
    .await
    .map_err(|_| TargetError::new(what(), format!("no answer within {timeout:?}")))?
    .map_err(|e| TargetError::new(what(), format!("{service}: {e}")))?;
    let mut pool = DescriptorPool::new();
    pool.add_file_descriptor_protos(files)
        .map_err(|e| TargetError::new(what(), format!("the descriptors it sent: {e}")))?;
    Ok(pool)
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// `text` as a message of type `desc`, by protobuf's JSON mapping; unknown fields refused.
fn message_from_json(desc: &MessageDescriptor, text: &str) -> Result<DynamicMessage, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let message = DynamicMessage::deserialize(desc.clone(), &mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(message)
}

/// A message as a JSON value: equal messages give equal values, whatever the order their map
/// entries or fields were set in.
fn canonical_json(message: &DynamicMessage) -> serde_json::Value {
    serde_json::to_value(message).unwrap_or(serde_json::Value::Null)
}

/// A resolved gRPC target; cheap to share between connections.
#[derive(Clone)]
pub struct GrpcTarget(Arc<Resolved>);

struct Resolved {
    /// `pkg.Service/Method`: the CSV's workload column.
    label: String,
    path: PathAndQuery,
    input: MessageDescriptor,
    output: MessageDescriptor,
    data: Data,
    seed: u64,
    metadata: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
    /// The expected reply, as [`canonical_json`].
    expect: Option<serde_json::Value>,
    payload_bytes: usize,
}

enum Data {
    /// The same message every call: built once.
    Constant(DynamicMessage),
    /// Rendered and parsed per call.
    Template(Template),
}

impl Resolved {
    fn request(&self, index: u64, worker: usize) -> Result<DynamicMessage, CallError> {
        match &self.data {
            Data::Constant(m) => Ok(m.clone()),
            Data::Template(t) => {
                message_from_json(&self.input, &t.render(self.seed, index, worker)).map_err(|e| {
                    CallError::new(Failure::Other, format!("call {index}: --data: {e}"))
                })
            }
        }
    }
}

impl Target for GrpcTarget {
    fn name(&self) -> &str {
        "grpc"
    }

    fn label(&self) -> String {
        self.0.label.clone()
    }

    fn payload_bytes(&self) -> usize {
        self.0.payload_bytes
    }

    fn connect<'a>(
        &'a self,
        addr: &'a str,
        wire: &'a Arc<WireCounters>,
    ) -> BoxFuture<'a, Result<Arc<dyn Session>, CallError>> {
        Box::pin(async move {
            let connection = GrpcConnection::open(addr, wire).await?;
            let grpc =
                tonic::client::Grpc::with_origin(connection.clone(), connection.origin.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE);
            Ok(Arc::new(GrpcSession {
                grpc,
                connection,
                target: self.0.clone(),
            }) as Arc<dyn Session>)
        })
    }
}

struct GrpcSession {
    /// Cheap to clone; each clone shares the one connection.
    grpc: tonic::client::Grpc<GrpcConnection>,
    connection: GrpcConnection,
    target: Arc<Resolved>,
}

impl Session for GrpcSession {
    fn call(&self, index: u64, worker: usize) -> BoxFuture<'_, Result<(), CallError>> {
        Box::pin(async move {
            let t = &self.target;
            let mut request = tonic::Request::new(t.request(index, worker)?);
            for (k, v) in &t.metadata {
                request.metadata_mut().insert(k.clone(), v.clone());
            }
            let mut grpc = self.grpc.clone();
            grpc.ready().await.map_err(|e| CallError::classify(&e))?;
            let reply = grpc
                .unary(request, t.path.clone(), DynamicCodec(t.output.clone()))
                .await
                .map_err(|s| flavour::grpc::status_error(&s))?
                .into_inner();
            match &t.expect {
                Some(want) if *want != canonical_json(&reply) => Err(CallError::protocol(format!(
                    "the reply differs from --expect: {}",
                    canonical_json(&reply)
                ))),
                _ => Ok(()),
            }
        })
    }

    fn is_open(&self) -> bool {
        self.connection.is_open()
    }

    fn multiplexed(&self) -> bool {
        true
    }
}

/// tonic's codec for messages known only at run time: requests encoded as they are, replies
/// decoded as the method's output type.
struct DynamicCodec(MessageDescriptor);

impl Codec for DynamicCodec {
    type Encode = DynamicMessage;
    type Decode = DynamicMessage;
    type Encoder = DynamicEncoder;
    type Decoder = DynamicDecoder;

    fn encoder(&mut self) -> DynamicEncoder {
        DynamicEncoder
    }

    fn decoder(&mut self) -> DynamicDecoder {
        DynamicDecoder(self.0.clone())
    }
}

struct DynamicEncoder;

impl Encoder for DynamicEncoder {
    type Item = DynamicMessage;
    type Error = Status;

    fn encode(&mut self, item: DynamicMessage, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("cannot encode the request: {e}")))?;
        Ok(())
    }
}

struct DynamicDecoder(MessageDescriptor);

impl Decoder for DynamicDecoder {
    type Item = DynamicMessage;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<DynamicMessage>, Status> {
        // A reply that is not a valid message of the output type is the peer's fault: INTERNAL,
        // a protocol outcome.
        DynamicMessage::decode(self.0.clone(), src.copy_to_bytes(src.remaining()))
            .map(Some)
            .map_err(|e| Status::internal(format!("cannot decode the reply: {e}")))
    }
}
