//! The client side of the gRPC server reflection service (`grpc.reflection.v1` and its older
//! name `v1alpha`, same messages): the file descriptors that define a service, and every file
//! they import. Only the two requests used are declared; prost skips the rest of a reply.

use std::collections::{HashMap, HashSet};

use http::uri::PathAndQuery;
use prost::Message as _;
use prost_types::FileDescriptorProto;
use tonic::transport::Channel;
use tonic::Code;

#[derive(Clone, PartialEq, prost::Message)]
struct ServerReflectionRequest {
    #[prost(string, tag = "1")]
    host: String,
    #[prost(oneof = "Request", tags = "3, 4")]
    message_request: Option<Request>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Request {
    #[prost(string, tag = "3")]
    FileByFilename(String),
    #[prost(string, tag = "4")]
    FileContainingSymbol(String),
}

#[derive(Clone, PartialEq, prost::Message)]
struct ServerReflectionResponse {
    #[prost(oneof = "Response", tags = "4, 7")]
    message_response: Option<Response>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Response {
    #[prost(message, tag = "4")]
    FileDescriptor(FileDescriptorResponse),
    #[prost(message, tag = "7")]
    Error(ErrorResponse),
}

#[derive(Clone, PartialEq, prost::Message)]
struct FileDescriptorResponse {
    #[prost(bytes = "vec", repeated, tag = "1")]
    file_descriptor_proto: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ErrorResponse {
    #[prost(int32, tag = "1")]
    error_code: i32,
    #[prost(string, tag = "2")]
    error_message: String,
}

/// The method path of each version, newest first.
const VERSIONS: [&str; 2] = [
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// The file defining `symbol` and every file it imports, in an order where each file comes
/// after its imports (as a descriptor pool takes them).
pub(crate) async fn files_for(
    channel: Channel,
    symbol: &str,
) -> Result<Vec<FileDescriptorProto>, String> {
    let mut client = Reflection {
        grpc: tonic::client::Grpc::new(channel),
        path: None,
    };
    let mut files: HashMap<String, FileDescriptorProto> = HashMap::new();
    let mut wanted: Vec<String> = Vec::new();
    for f in client
        .ask(Request::FileContainingSymbol(symbol.to_string()))
        .await?
    {
        wanted.extend(f.dependency.iter().cloned());
        files.insert(f.name().to_string(), f);
    }
    while let Some(name) = wanted.pop() {
        if files.contains_key(&name) {
            continue;
        }
        for f in client.ask(Request::FileByFilename(name.clone())).await? {
            wanted.extend(f.dependency.iter().cloned());
            files.insert(f.name().to_string(), f);
        }
        if !files.contains_key(&name) {
            return Err(format!("the server did not send {name}"));
        }
    }
    Ok(imports_first(files))
}

struct Reflection {
    grpc: tonic::client::Grpc<Channel>,
    /// The version the server answered on, once known.
    path: Option<&'static str>,
}

impl Reflection {
    /// One request on a stream of its own; a server without v1 is asked again on v1alpha.
    async fn ask(&mut self, request: Request) -> Result<Vec<FileDescriptorProto>, String> {
        let versions: Vec<&'static str> = match self.path {
            Some(p) => vec![p],
            None => VERSIONS.to_vec(),
        };
        let mut last = None;
        for path in versions {
            match self.ask_on(path, request.clone()).await {
                Err(s) if s.code() == Code::Unimplemented => last = Some(s),
                Err(s) => return Err(status_text(&s)),
                Ok(reply) => {
                    self.path = Some(path);
                    return match reply.message_response {
                        Some(Response::FileDescriptor(f)) => f
                            .file_descriptor_proto
                            .iter()
                            .map(|b| {
                                FileDescriptorProto::decode(b.as_slice())
                                    .map_err(|e| format!("a bad file descriptor: {e}"))
                            })
                            .collect(),
                        Some(Response::Error(e)) => Err(format!(
                            "{:?}: {}",
                            Code::from_i32(e.error_code),
                            e.error_message
                        )),
                        None => Err("an empty reflection reply".into()),
                    };
                }
            }
        }
        Err(match last {
            Some(_) => "the server has no reflection service (neither v1 nor v1alpha)".into(),
            None => "no reply".into(),
        })
    }

    async fn ask_on(
        &mut self,
        path: &'static str,
        request: Request,
    ) -> Result<ServerReflectionResponse, tonic::Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(crate::flavour::full_message(&e)))?;
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(request),
        };
        let codec =
            tonic_prost::ProstCodec::<ServerReflectionRequest, ServerReflectionResponse>::default();
        let mut replies = self
            .grpc
            .streaming(
                tonic::Request::new(tokio_stream::once(request)),
                PathAndQuery::from_static(path),
                codec,
            )
            .await?
            .into_inner();
        replies
            .message()
            .await?
            .ok_or_else(|| tonic::Status::unknown("the reflection stream ended without a reply"))
    }
}

fn status_text(s: &tonic::Status) -> String {
    match std::error::Error::source(s) {
        Some(source) => format!("{}: {}", s.message(), crate::flavour::full_message(source)),
        None => format!("{:?}: {}", s.code(), s.message()),
    }
}

/// `files` ordered so each comes after the files it imports.
fn imports_first(mut files: HashMap<String, FileDescriptorProto>) -> Vec<FileDescriptorProto> {
    let mut placed: HashSet<String> = HashSet::new();
    let mut out = Vec::with_capacity(files.len());
    let mut names: Vec<String> = files.keys().cloned().collect();
    names.sort();
    fn place(
        name: &str,
        files: &mut HashMap<String, FileDescriptorProto>,
        placed: &mut HashSet<String>,
        out: &mut Vec<FileDescriptorProto>,
    ) {
        if !placed.insert(name.to_string()) {
            return;
        }
        // Taken out first, so an import cycle (which protoc refuses anyway) cannot loop.
        if let Some(file) = files.remove(name) {
            for dep in &file.dependency {
                place(dep, files, placed, out);
            }
            out.push(file);
        }
    }
    for name in names {
        place(&name, &mut files, &mut placed, &mut out);
    }
    out
}
