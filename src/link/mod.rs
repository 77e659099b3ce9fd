//! The link engine: real kernel TCP over an impaired packet path.
//!
//! The fault model ([`crate::fault`]) predicts what TCP would make of a lossy network; this
//! module *is* the lossy network, so the kernel's own handshakes, retransmissions and congestion
//! control run for real. Two TUN devices, each in a network namespace (or one on the host), and
//! an engine that moves every IP packet between them with the profile's delay, jitter, rate,
//! loss and the packet-only faults (`reorder`, `duplicate`, `corrupt`) — like mahimahi's shells
//! or netem, with faultrig's profiles, seeds and counters.
//!
//! - [`impair`]: what happens to each packet, pure and seeded (tested without privileges);
//! - [`netns`]: private namespaces that vanish with faultrig, however it exits;
//! - [`engine`]: the devices and the tasks that move packets, with their counters;
//! - [`shell`]: `faultrig shell`, a command run behind the link;
//! - [`NamespacePair`]: two namespaces joined by a link, the unit the proxy's kernel engine and
//!   end-to-end runs build on.
//!
//! Everything here needs CAP_NET_ADMIN; without it the first [`netns::Namespace::new`] fails
//! with [`netns::NamespaceError::Privilege`], before anything was created.

pub mod engine;
pub mod impair;
pub mod netns;
pub mod shell;

use std::net::Ipv4Addr;
use std::sync::Arc;

pub use engine::{Addrs, End, Link, LinkStats};
pub use netns::{Namespace, NamespaceError};

use crate::profile::Profile;

/// How a network is emulated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// The fault model inside the proxy: deterministic, unprivileged, cheap.
    #[default]
    Model,
    /// The proxy carries each connection over real kernel TCP through the link engine.
    Kernel,
    /// No proxy: the endpoints' own sockets cross the link engine.
    Link,
}

impl Engine {
    pub const ALL: [Engine; 3] = [Engine::Model, Engine::Kernel, Engine::Link];

    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Model => "model",
            Engine::Kernel => "kernel",
            Engine::Link => "link",
        }
    }

    pub fn parse(s: &str) -> Result<Engine, String> {
        Engine::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| format!("unknown engine `{s}` (model, kernel or link)"))
    }

    /// Whether this engine needs CAP_NET_ADMIN.
    pub(crate) fn is_privileged(self) -> bool {
        self != Engine::Model
    }
}

/// The addresses of a namespace pair: both namespaces are private, so every pair can use the
/// same ones (from 198.18.0.0/15, the range set aside for benchmarking, RFC 2544).
pub(crate) const PAIR_ADDRS: Addrs = Addrs {
    a: Ipv4Addr::new(198, 18, 0, 1),
    b: Ipv4Addr::new(198, 18, 0, 2),
};

/// Two private namespaces, `a` (the client side: its packets travel upstream) and `b` (the
/// server side), joined by an impaired link. Each namespace's TCP uses the congestion control
/// its direction's profile names. The namespaces are shared so that sockets can be made in
/// them from wherever a connection is opened (`--engine link` clients).
pub(crate) struct NamespacePair {
    pub link: Link,
    pub a: Arc<Namespace>,
    pub b: Arc<Namespace>,
}

impl NamespacePair {
    pub async fn new(
        profile: &Profile,
        seed: u64,
        name: &str,
    ) -> Result<NamespacePair, NamespaceError> {
        let a = Arc::new(Namespace::new()?);
        let b = Arc::new(Namespace::new()?);
        // The namespaces' default, for sockets that do not pin their own; faultrig's sockets
        // pin it with TCP_CONGESTION, so a refusal here (see `set_congestion_control`) only
        // matters to others.
        for (ns, cc) in [
            (&a, profile.upstream.congestion_control),
            (&b, profile.downstream.congestion_control),
        ] {
            if let Err(e) = ns.set_congestion_control(cc) {
                tracing::debug!("namespace congestion control {}: {e}", cc.as_str());
            }
        }
        let link = Link::start(
            End::Namespace(&a),
            End::Namespace(&b),
            PAIR_ADDRS,
            profile,
            seed,
            name,
        )
        .await
        .map_err(NamespaceError::Setup)?;
        Ok(NamespacePair { link, a, b })
    }
}
