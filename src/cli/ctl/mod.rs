//! `faultrig ctl`: a client of the control API (ours, or Toxiproxy's) that stands in for
//! Toxiproxy's own CLI, toxiproxy-cli: its verbs, their aliases and short flags, and its
//! `TOXIPROXY_URL`. faultrig's earlier long forms (`--type`, `--attr`, `toxic update PROXY
//! TOXIC`, `enable`, `disable`) stay as aliases.
//!
//! Exit codes: 2 for bad input found here, before any request (a flag, `TOXIPROXY_URL`, a
//! populate file); 1 when the API refuses (its message, one line) or cannot be reached.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use http::Method;
use serde_json::{json, Map, Value};

mod show;

use super::{runtime, CliError, DEFAULT_API};
use crate::api::client::{self, segment};
use crate::api::registry::DEFAULT_LISTEN;
use show::Show;

/// Where toxiproxy-cli reads the API's address from when no flag names it.
const URL_VARIABLE: &str = "TOXIPROXY_URL";

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Address of the control API: HOST:PORT or http://HOST:PORT (toxiproxy-cli's --host).
    /// Default: $TOXIPROXY_URL, else 127.0.0.1:8474.
    #[arg(long, visible_alias = "host", global = true, value_name = "ADDR")]
    pub api: Option<String>,
    /// Print the API's JSON answer exactly as it came, in place of tables and messages.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub action: CtlAction,
}

#[derive(Debug, Subcommand)]
pub enum CtlAction {
    /// List the proxies: name, listen, upstream, enabled, number of toxics.
    #[command(visible_aliases = ["l", "li", "ls"])]
    List,
    /// Show one proxy and its toxics.
    #[command(visible_aliases = ["i", "ins"])]
    Inspect { name: String },
    /// Create a proxy.
    #[command(visible_aliases = ["c", "new"])]
    Create {
        name: String,
        /// Where it forwards to, HOST:PORT.
        #[arg(short, long)]
        upstream: String,
        /// Where it listens (port 0: a free port, printed in the answer).
        #[arg(short, long, default_value = DEFAULT_LISTEN)]
        listen: String,
        /// Create it without listening.
        #[arg(long)]
        disabled: bool,
    },
    /// Disable an enabled proxy, enable a disabled one.
    #[command(visible_alias = "tog")]
    Toggle { name: String },
    /// Delete a proxy (closing its connections).
    #[command(visible_alias = "d")]
    Delete { name: String },
    /// Start listening again.
    Enable { name: String },
    /// Close the listener and every connection.
    Disable { name: String },
    /// Add, update, remove or list toxics.
    #[command(visible_alias = "t")]
    Toxic {
        #[command(subcommand)]
        action: ToxicAction,
    },
    /// Create or replace proxies from FILE, a JSON array in Toxiproxy's populate format
    /// ([{"name", "listen", "upstream", "enabled"}, ...]).
    Populate { file: PathBuf },
    /// Enable every proxy and remove every toxic.
    Reset,
    /// Print the Prometheus metrics.
    Metrics,
}

#[derive(Debug, Subcommand)]
pub enum ToxicAction {
    /// Add a toxic: `toxic add PROXY -t latency -a latency=100 -a jitter=10`.
    #[command(visible_alias = "a")]
    Add {
        proxy: String,
        /// latency, bandwidth, slow_close, timeout, reset_peer, slicer, limit_data, loss,
        /// syn_loss, profile, handshake, noop.
        #[arg(short = 't', long = "type")]
        kind: String,
        /// Name (default TYPE_STREAM).
        #[arg(short = 'n', long, visible_alias = "toxicName")]
        name: Option<String>,
        /// upstream (client to server) or downstream (the default).
        #[arg(short = 's', long, conflicts_with_all = ["upstream", "downstream"])]
        stream: Option<String>,
        /// The upstream stream (toxiproxy-cli's form of --stream upstream).
        #[arg(short = 'u', long, conflicts_with = "downstream")]
        upstream: bool,
        /// The downstream stream (toxiproxy-cli's form of --stream downstream).
        #[arg(short = 'd', long)]
        downstream: bool,
        /// Share of connections that suffer it, 0..1 (default 1).
        #[arg(long, visible_alias = "tox")]
        toxicity: Option<f64>,
        /// An attribute, KEY=VALUE (repeat for more).
        #[arg(short = 'a', long = "attr", visible_alias = "attribute", value_parser = parse_attribute)]
        attributes: Vec<(String, Value)>,
    },
    /// Change a toxic's attributes or toxicity; the rest stay.
    #[command(visible_alias = "u")]
    #[command(group = clap::ArgGroup::new("which").required(true).args(["toxic", "name"]))]
    Update {
        proxy: String,
        /// The toxic (or -n).
        toxic: Option<String>,
        /// The toxic (toxiproxy-cli's form).
        #[arg(short = 'n', long, visible_alias = "toxicName")]
        name: Option<String>,
        #[arg(long, visible_alias = "tox")]
        toxicity: Option<f64>,
        #[arg(short = 'a', long = "attr", visible_alias = "attribute", value_parser = parse_attribute)]
        attributes: Vec<(String, Value)>,
    },
    /// Remove a toxic.
    #[command(visible_aliases = ["r", "delete", "d"])]
    #[command(group = clap::ArgGroup::new("which").required(true).args(["toxic", "name"]))]
    Remove {
        proxy: String,
        /// The toxic (or -n).
        toxic: Option<String>,
        /// The toxic (toxiproxy-cli's form).
        #[arg(short = 'n', long, visible_alias = "toxicName")]
        name: Option<String>,
    },
    /// List a proxy's toxics.
    List { proxy: String },
}

/// `KEY=VALUE`, the value a JSON number when it reads as one, else a string.
fn parse_attribute(s: &str) -> Result<(String, Value), String> {
    let (k, v) = s
        .split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("\"{s}\" is not KEY=VALUE"))?;
    let value = serde_json::from_str::<serde_json::Number>(v)
        .map(Value::Number)
        .unwrap_or_else(|_| Value::String(v.to_string()));
    Ok((k.to_string(), value))
}

/// `ctl`'s arguments, checked: the API's address resolved, the request built.
pub(crate) struct Ctl {
    api: String,
    json: bool,
    step: Step,
}

/// What `ctl` asks of the API.
enum Step {
    /// One request; its answer shown as `show` says.
    Call {
        method: Method,
        path: String,
        body: Option<Value>,
        show: Show,
    },
    /// Read the proxy, then write it back with `enabled` flipped (as toxiproxy-cli does).
    Toggle { name: String },
}

impl CtlArgs {
    pub(crate) fn validate(self) -> Result<Ctl, CliError> {
        let api = api_address(self.api)?;
        let step = step(self.action)?;
        Ok(Ctl {
            api,
            json: self.json,
            step,
        })
    }
}

/// `--api`, else `TOXIPROXY_URL`, else [`DEFAULT_API`]; a bad value names where it came from.
fn api_address(flag: Option<String>) -> Result<String, CliError> {
    let (value, source) = match flag {
        Some(v) => (v, "--api"),
        None => match std::env::var(URL_VARIABLE) {
            Ok(v) if !v.is_empty() => (v, URL_VARIABLE),
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(CliError::Usage(format!("{URL_VARIABLE}: not UTF-8")))
            }
            _ => return Ok(DEFAULT_API.to_string()),
        },
    };
    host_port(&value).map_err(|e| CliError::Usage(format!("{source}: {e}")))
}

/// `HOST:PORT` from `HOST:PORT`, `http://HOST:PORT` or `http://HOST:PORT/`: the forms
/// toxiproxy-cli takes. The API speaks plain HTTP at its root, so another scheme or a path is
/// a mistake, said at once rather than as a failed request.
fn host_port(url: &str) -> Result<String, String> {
    let use_instead = "use HOST:PORT or http://HOST:PORT";
    let rest = match url.split_once("://") {
        None => url,
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some((scheme, _)) => {
            return Err(format!(
                "\"{url}\": the control API speaks http, not {scheme} ({use_instead})"
            ))
        }
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') {
        return Err(format!("\"{url}\" has a path ({use_instead})"));
    }
    crate::net::split_host_port(rest)
        .map(|_| rest.to_string())
        .map_err(|e| format!("{e} ({use_instead})"))
}

/// The request an action makes; a populate file that cannot be read or is not JSON is bad
/// input naming the file.
fn step(action: CtlAction) -> Result<Step, CliError> {
    let switch = |name: &str, enabled: bool| {
        let body = json!({ "enabled": enabled });
        Step::call(Method::POST, proxy_path(name), Some(body), Show::Switched)
    };
    Ok(match action {
        CtlAction::List => Step::call(Method::GET, "/proxies".into(), None, Show::Proxies),
        CtlAction::Inspect { name } => {
            Step::call(Method::GET, proxy_path(&name), None, Show::Proxy)
        }
        CtlAction::Create {
            name,
            upstream,
            listen,
            disabled,
        } => {
            let body =
                json!({"name": name, "upstream": upstream, "listen": listen, "enabled": !disabled});
            Step::call(Method::POST, "/proxies".into(), Some(body), Show::Created)
        }
        CtlAction::Toggle { name } => Step::Toggle { name },
        CtlAction::Delete { name } => {
            Step::call(Method::DELETE, proxy_path(&name), None, Show::Deleted(name))
        }
        CtlAction::Enable { name } => switch(&name, true),
        CtlAction::Disable { name } => switch(&name, false),
        CtlAction::Populate { file } => {
            let body = read_populate(&file)?;
            Step::call(
                Method::POST,
                "/populate".into(),
                Some(body),
                Show::Populated,
            )
        }
        CtlAction::Reset => Step::call(Method::POST, "/reset".into(), None, Show::Reset),
        CtlAction::Metrics => Step::call(Method::GET, "/metrics".into(), None, Show::Text),
        CtlAction::Toxic { action } => toxic_step(action),
    })
}

/// The request of a `toxic` action.
fn toxic_step(action: ToxicAction) -> Step {
    let toxics_path = |proxy: &str| format!("{}/toxics", proxy_path(proxy));
    let toxic_path =
        |proxy: &str, toxic: &str| format!("{}/{}", toxics_path(proxy), segment(toxic));
    match action {
        ToxicAction::Add {
            proxy,
            kind,
            name,
            stream,
            upstream,
            downstream,
            toxicity,
            attributes,
        } => {
            // What is not given is left to the API's defaults (TYPE_STREAM, downstream, 1).
            let mut body = json!({"type": kind, "attributes": attributes_object(attributes)});
            let stream = match (upstream, downstream) {
                (true, _) => Some("upstream".to_string()),
                (_, true) => Some("downstream".to_string()),
                _ => stream,
            };
            if let Some(n) = name {
                body["name"] = json!(n);
            }
            if let Some(s) = stream {
                body["stream"] = json!(s);
            }
            if let Some(t) = toxicity {
                body["toxicity"] = json!(t);
            }
            let path = toxics_path(&proxy);
            Step::call(Method::POST, path, Some(body), Show::ToxicAdded(proxy))
        }
        ToxicAction::Update {
            proxy,
            toxic,
            name,
            toxicity,
            attributes,
        } => {
            let toxic = toxic.or(name).expect("clap requires the toxic or -n");
            let mut body = json!({"attributes": attributes_object(attributes)});
            if let Some(t) = toxicity {
                body["toxicity"] = json!(t);
            }
            let path = toxic_path(&proxy, &toxic);
            Step::call(Method::PATCH, path, Some(body), Show::ToxicUpdated(proxy))
        }
        ToxicAction::Remove { proxy, toxic, name } => {
            let toxic = toxic.or(name).expect("clap requires the toxic or -n");
            let path = toxic_path(&proxy, &toxic);
            Step::call(
                Method::DELETE,
                path,
                None,
                Show::ToxicRemoved { proxy, toxic },
            )
        }
        ToxicAction::List { proxy } => {
            Step::call(Method::GET, toxics_path(&proxy), None, Show::Toxics)
        }
    }
}

impl Step {
    fn call(method: Method, path: String, body: Option<Value>, show: Show) -> Step {
        Step::Call {
            method,
            path,
            body,
            show,
        }
    }
}

/// `/proxies/NAME`.
fn proxy_path(name: &str) -> String {
    format!("/proxies/{}", segment(name))
}

fn attributes_object(list: Vec<(String, Value)>) -> Value {
    Value::Object(list.into_iter().collect::<Map<_, _>>())
}

/// `populate FILE`: JSON, sent as it is (the API checks its shape, as it does any request's).
fn read_populate(file: &std::path::Path) -> Result<Value, CliError> {
    let bad =
        |e: &dyn std::fmt::Display| CliError::Usage(format!("populate {}: {e}", file.display()));
    let text = std::fs::read_to_string(file).map_err(|e| bad(&e))?;
    serde_json::from_str(&text).map_err(|e| bad(&e))
}

pub fn run(ctl: Ctl) -> Result<(), CliError> {
    let Ctl { api, json, step } = ctl;
    let (answer, show) = runtime()?
        .block_on(async {
            match step {
                Step::Call {
                    method,
                    path,
                    body,
                    show,
                } => client::request_raw(&api, method, &path, body.as_ref())
                    .await
                    .map(|a| (a, show)),
                Step::Toggle { name } => toggle(&api, &name).await.map(|a| (a, Show::Switched)),
            }
        })
        // The API refused (its message) or could not be reached (its address): exit 1.
        .map_err(|e| CliError::Failed(e.into()))?;
    let mut out = std::io::stdout();
    // A closed stdout (ctl list | head) is no failure of the request, which has happened.
    if json || matches!(show, Show::Text) {
        let _ = out.write_all(&answer);
    } else {
        let value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
        let _ = write!(out, "{}", show.render(&value));
    }
    Ok(())
}

/// toxiproxy-cli's `toggle`: the proxy as it is, then `enabled` flipped; the second answer.
async fn toggle(api: &str, name: &str) -> Result<bytes::Bytes, client::ClientError> {
    let path = proxy_path(name);
    let proxy = client::request(api, Method::GET, &path, None).await?;
    let enabled = proxy["enabled"].as_bool().unwrap_or(false);
    let body = json!({ "enabled": !enabled });
    client::request_raw(api, Method::POST, &path, Some(&body)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_take_toxiproxy_cli_forms() {
        for url in [
            "127.0.0.1:8474",
            "http://127.0.0.1:8474",
            "http://127.0.0.1:8474/",
            "HTTP://127.0.0.1:8474",
        ] {
            assert_eq!(host_port(url).as_deref(), Ok("127.0.0.1:8474"), "{url}");
        }
        assert_eq!(host_port("http://[::1]:1/").as_deref(), Ok("[::1]:1"));
        for bad in [
            "https://127.0.0.1:8474",
            "http://127.0.0.1:8474/api",
            "http://localhost",
            "nowhere",
            "",
        ] {
            assert!(host_port(bad).is_err(), "{bad}");
        }
    }
}
