//! A remote run's targets: servers on other hosts (`faultrig serve`, or any peer of a flavour)
//! and one fault proxy per flavour on a proxy host, created and driven through that host's
//! control API (`faultrig proxy --api`). The profile of a cell is a pair of `profile` toxics
//! (one per direction) switched between cells; the proxy's counters are read over the API
//! before and after each cell.
//!
//! Everything is checked before the first cell: the API answers and is faultrig's, the proxies
//! are created, every profile is accepted, and one call per flavour goes through its proxy to
//! its server. A failure names the address at fault. Once cells run, a host that dies only
//! costs the cells that need it: their calls fail and are counted.

use std::sync::Arc;
use std::time::Duration;

use super::Probe;
use crate::api::client::{Client, ClientError};
use crate::api::wire::{ProxyJson, ToxicJson};
use crate::api::ApiError;
use crate::experiment::{Cell, Experiment, Remote};
use crate::fault::Direction;
use crate::flavour::{Flavour, WireCounters};
use crate::proxy::StatsSnapshot;
use crate::toxic::{ProfileAttributes, ToxicKind};
use crate::workload::{Generator, Workload};

/// How long the first call through each proxy may take before its server counts as unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Names of the two toxics that carry a cell's profile.
const PROFILE_TOXICS: [(&str, Direction); 2] = [
    ("faultrig-profile-up", Direction::Upstream),
    ("faultrig-profile-down", Direction::Downstream),
];

pub(crate) struct RemoteTargets {
    api: Api,
    /// One proxy per flavour, in the experiment's flavour order.
    proxies: Vec<RemoteProxy>,
}

/// The proxy host's control API, as this run uses it.
struct Api {
    client: Client,
    /// The `profile` toxic attributes of each of the experiment's profiles.
    profile_toxics: Vec<ProfileAttributes>,
}

struct RemoteProxy {
    /// Its name on the proxy host: `faultrig-FLAVOUR`.
    name: String,
    /// Where this host's calls go: the proxy's listen address as seen from here.
    addr: String,
    /// Its upstream, for messages.
    server: String,
    /// The profile in place now (an index into the experiment's profiles); `None` when unknown,
    /// so the next cell sets it.
    profile: Option<usize>,
}

/// Why a remote run could not put its proxies in place on the proxy host.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error(
        "the control API at {api} is not faultrig's (version {version}): a remote run needs \
         `faultrig proxy --api` for its profile toxics"
    )]
    NotOurs { api: String, version: String },
    /// The client's error leads the message, which says what to check; it is not a cause
    /// below it (that would print it twice).
    #[error(
        "{error}: is `faultrig proxy --api {api}` running on the proxy host, and the port open \
         to this host?"
    )]
    NoApi { api: String, error: ClientError },
    #[error("{kind} {name}: a remote run has built-in flavours only")]
    NotBuiltin { kind: &'static str, name: String },
    #[error("create the proxies through the control API at {api}")]
    Populate { api: String, source: ClientError },
    /// `[remote] api` is not HOST:PORT (the message says why).
    #[error("{0}")]
    ApiAddress(String),
    #[error("the control API reported a proxy listening on {0}")]
    ProxyListenAddress(String),
    #[error("proxy {name}")]
    Proxy { name: String, source: ClientError },
    #[error("profile {profile}")]
    Profile {
        profile: String,
        source: Box<RemoteError>,
    },
    #[error("add toxic {toxic} to proxy {proxy}")]
    AddToxic {
        toxic: String,
        proxy: String,
        source: ClientError,
    },
    #[error("the toxics of proxy {proxy}")]
    Toxics { proxy: String, source: ClientError },
    #[error("delete toxic {toxic} of proxy {proxy}")]
    DeleteToxic {
        toxic: String,
        proxy: String,
        source: ClientError,
    },
    #[error(
        "the {flavour} server at {server} is unreachable from the proxy host: is `faultrig \
         serve --flavour {flavour} --listen {server}` running there, and the port open?"
    )]
    ServerUnreachable {
        flavour: &'static str,
        server: String,
    },
    #[error("the {flavour} proxy at {addr} is unreachable from this host: {why}")]
    ProxyUnreachable {
        flavour: &'static str,
        addr: String,
        why: String,
    },
    #[error("no answer from the {flavour} server at {server} through the proxy at {addr}: {why}")]
    NoAnswer {
        flavour: &'static str,
        server: String,
        addr: String,
        why: String,
    },
}

/// `error: its cause: its cause's cause`, for a log line (what `{:#}` shows for the error at
/// the binary's edge).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text += &format!(": {e}");
        source = e.source();
    }
    text
}

impl RemoteTargets {
    pub async fn start(exp: &Experiment, remote: &Remote) -> Result<RemoteTargets, RemoteError> {
        let api = remote.api.clone();
        let client = Client::new(&api);
        let not_ours = |version: String| RemoteError::NotOurs {
            api: api.clone(),
            version,
        };
        match client.version().await {
            Ok(version) if version.contains("faultrig") => {}
            Ok(version) => return Err(not_ours(version)),
            // Older Toxiproxy answers its version as plain text, not JSON.
            Err(e @ ClientError::Unexpected { .. }) => return Err(not_ours(e.to_string())),
            Err(error) => {
                return Err(RemoteError::NoApi {
                    api: api.clone(),
                    error,
                })
            }
        }
        // Validation refuses external flavours and targets with [remote]; this says so again rather than
        // trusting it.
        let flavours = exp
            .flavours
            .iter()
            .map(|f| {
                f.builtin().ok_or_else(|| RemoteError::NotBuiltin {
                    kind: f.kind(),
                    name: f.name().to_string(),
                })
            })
            .collect::<Result<Vec<&'static dyn Flavour>, RemoteError>>()?;
        let specs: Vec<ProxyJson> = flavours
            .iter()
            .zip(&remote.servers)
            .enumerate()
            .map(|(i, (f, server))| {
                let port = match remote.listen_port {
                    0 => 0,
                    first => first + i as u16,
                };
                let listen = format!("{}:{port}", remote.listen_host);
                ProxyJson::new(&proxy_name(*f), &listen, server)
            })
            .collect();
        client
            .populate(&specs)
            .await
            .map_err(|source| RemoteError::Populate {
                api: api.clone(),
                source,
            })?;
        let api_host = crate::net::split_host_port(&api)
            .map(|(h, _)| h.to_string())
            .map_err(RemoteError::ApiAddress)?;
        let api = Api {
            client,
            profile_toxics: remote.profile_toxics.clone(),
        };
        let mut proxies = Vec::new();
        for (&flavour, server) in flavours.iter().zip(&remote.servers) {
            match api.prepare(exp, flavour, server, &api_host).await {
                Ok(p) => proxies.push(p),
                Err(e) => {
                    // Leave the proxy host as it was found.
                    let names = flavours.iter().map(|&f| proxy_name(f));
                    api.remove(names).await;
                    return Err(e);
                }
            }
        }
        Ok(RemoteTargets { api, proxies })
    }

    /// Puts the cell's profile in place; returns where its calls go.
    pub(crate) async fn enter(&mut self, exp: &Experiment, cell: &Cell) -> String {
        let p = &mut self.proxies[exp.flavour_index(&cell.flavour)];
        if p.profile != Some(cell.profile) {
            if let Err(e) = self.api.set_profile(p, cell.profile).await {
                // The proxy host is unreachable or failing: its calls will fail and be counted.
                tracing::warn!(
                    "proxy {}: cannot set profile {}: {}",
                    p.name,
                    exp.profiles[cell.profile].name,
                    chain(&e)
                );
            }
        }
        p.addr.clone()
    }

    /// The cell's proxy counters, read on the proxy host: as its measured calls begin, and
    /// after them.
    pub async fn counters(&self, exp: &Experiment, cell: &Cell) -> Probe {
        let p = &self.proxies[exp.flavour_index(&cell.flavour)];
        Probe {
            proxy: self.api.stats(&p.name).await,
            ..Probe::default()
        }
    }

    /// Removes the run's proxies from the proxy host.
    pub async fn finish(self) {
        self.api
            .remove(self.proxies.into_iter().map(|p| p.name))
            .await;
    }
}

impl Api {
    /// Finds the flavour's proxy, clears its toxics, sends one call through it, and checks that
    /// every profile is accepted.
    async fn prepare(
        &self,
        exp: &Experiment,
        flavour: &'static dyn Flavour,
        server: &str,
        api_host: &str,
    ) -> Result<RemoteProxy, RemoteError> {
        let name = proxy_name(flavour);
        let proxy = self
            .client
            .proxy(&name)
            .await
            .map_err(|source| RemoteError::Proxy {
                name: name.clone(),
                source,
            })?;
        let mut p = RemoteProxy {
            addr: reachable(&proxy.listen, api_host)?,
            name,
            server: server.to_string(),
            profile: None,
        };
        // Ours from an earlier run, and anyone else's: the cells see only their profile.
        self.clear_toxics(&p).await?;
        self.probe(flavour, &p, exp.seed).await?;
        // Every profile once, so one the proxy host refuses fails the run now, not a cell. The
        // last stays in place (`p.profile` says so) until a cell wants another.
        for profile in 0..exp.profiles.len() {
            self.set_profile(&mut p, profile)
                .await
                .map_err(|source| RemoteError::Profile {
                    profile: exp.profiles[profile].name.clone(),
                    source: Box::new(source),
                })?;
        }
        Ok(p)
    }

    /// Deletes proxies (best effort: the proxy host may be gone).
    async fn remove(&self, names: impl Iterator<Item = String>) {
        for name in names {
            match self.client.delete(&name).await {
                Ok(()) => {}
                Err(e) if e.is(&ApiError::proxy_not_found()) => {}
                Err(e) => tracing::warn!("remove proxy {name}: {e}"),
            }
        }
    }

    async fn stats(&self, name: &str) -> Option<StatsSnapshot> {
        match self.client.stats(name).await {
            Ok(stats) => Some(stats),
            Err(e) => {
                tracing::warn!("proxy {name}: counters unavailable: {e:#}");
                None
            }
        }
    }

    /// Replaces the proxy's profile toxics with those of `profile`. Until it succeeds the
    /// proxy's profile is unknown, so a later cell tries again.
    async fn set_profile(&self, p: &mut RemoteProxy, profile: usize) -> Result<(), RemoteError> {
        p.profile = None;
        for (toxic, _) in PROFILE_TOXICS {
            self.delete_toxic(&p.name, toxic).await?;
        }
        for (toxic, stream) in PROFILE_TOXICS {
            let kind = ToxicKind::Profile(self.profile_toxics[profile].clone());
            self.client
                .add_toxic(&p.name, &ToxicJson::new(toxic, stream, &kind))
                .await
                .map_err(|source| RemoteError::AddToxic {
                    toxic: toxic.to_string(),
                    proxy: p.name.clone(),
                    source,
                })?;
        }
        p.profile = Some(profile);
        Ok(())
    }

    /// Removes every toxic of the proxy.
    async fn clear_toxics(&self, p: &RemoteProxy) -> Result<(), RemoteError> {
        let toxics = self
            .client
            .toxics(&p.name)
            .await
            .map_err(|source| RemoteError::Toxics {
                proxy: p.name.clone(),
                source,
            })?;
        for t in toxics {
            self.delete_toxic(&p.name, &t.name).await?;
        }
        Ok(())
    }

    /// Deletes one toxic; one already gone, or whose proxy is gone, is fine (as before the
    /// client was typed: any 404).
    async fn delete_toxic(&self, proxy: &str, toxic: &str) -> Result<(), RemoteError> {
        match self.client.delete_toxic(proxy, toxic).await {
            Ok(()) => Ok(()),
            Err(e) if e.is(&ApiError::toxic_not_found()) || e.is(&ApiError::proxy_not_found()) => {
                Ok(())
            }
            Err(source) => Err(RemoteError::DeleteToxic {
                toxic: toxic.to_string(),
                proxy: proxy.to_string(),
                source,
            }),
        }
    }

    /// One call through the proxy to its server, so an unreachable host fails the run before
    /// any cell, naming the address.
    async fn probe(
        &self,
        flavour: &'static dyn Flavour,
        p: &RemoteProxy,
        seed: u64,
    ) -> Result<(), RemoteError> {
        let before = self.stats(&p.name).await;
        let wire = Arc::new(WireCounters::default());
        let call = Generator::new(Workload::Order, seed).call(0);
        let answered = tokio::time::timeout(PROBE_TIMEOUT, async {
            let client = flavour.connect(&p.addr, &wire).await?;
            let reply = client.call(&call).await?;
            crate::flavour::check(&call, &reply)
        })
        .await;
        let why = match answered {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
        };
        let after = self.stats(&p.name).await;
        let refused_upstream = before
            .zip(after)
            .is_some_and(|(b, a)| a.connect_failures > b.connect_failures);
        let flavour = flavour.name();
        Err(if refused_upstream {
            RemoteError::ServerUnreachable {
                flavour,
                server: p.server.clone(),
            }
        } else if wire.opened.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            RemoteError::ProxyUnreachable {
                flavour,
                addr: p.addr.clone(),
                why,
            }
        } else {
            RemoteError::NoAnswer {
                flavour,
                server: p.server.clone(),
                addr: p.addr.clone(),
                why,
            }
        })
    }
}

fn proxy_name(flavour: &dyn Flavour) -> String {
    format!("faultrig-{}", flavour.name())
}

/// The proxy's bound address as this host reaches it: a wildcard address (`0.0.0.0`, `::`)
/// means the proxy host's own, which is the API's host.
fn reachable(listen: &str, api_host: &str) -> Result<String, RemoteError> {
    let (host, port) =
        crate::net::split_host_port(listen).map_err(RemoteError::ProxyListenAddress)?;
    let wildcard = host
        .trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified());
    Ok(if wildcard {
        format!("{api_host}:{port}")
    } else {
        listen.to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_listen_addresses_mean_the_api_host() {
        assert_eq!(
            reachable("0.0.0.0:7000", "10.1.1.2").unwrap(),
            "10.1.1.2:7000"
        );
        assert_eq!(
            reachable("[::]:7000", "proxyhost").unwrap(),
            "proxyhost:7000"
        );
        assert_eq!(reachable("10.1.1.2:7001", "x").unwrap(), "10.1.1.2:7001");
        assert!(reachable("", "x").is_err());
    }
}
