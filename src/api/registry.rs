//! The named proxies the control API manages: each a fault proxy with its listener, upstream,
//! toxics and counters, started, stopped and edited as Toxiproxy's API says.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::toxics::ToxicEntry;
use super::wire::{
    Given, PopulateJson, ProxyJson, ProxyRequest, ProxyUpdate, ToxicJson, ToxicRequest, ToxicUpdate,
};
use super::ApiError;
use crate::fault::Direction;
use crate::link::Engine;
use crate::profile::Profile;
use crate::proxy::kernel::KernelPath;
use crate::proxy::{
    Faults, Proxy, ProxyOptions, ProxyStats, DEFAULT_CONNECT_TIMEOUT, DEFAULT_WINDOW,
};
use crate::toxic::{ProfileAttributes, Toxic, ToxicKind};

/// Where a proxy listens when a request leaves `listen` empty: loopback, a free port (Toxiproxy
/// would listen on every interface; we are safe by default).
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:0";

/// Settings every managed proxy shares.
#[derive(Clone, Debug)]
pub struct RegistryOptions {
    /// Run seed: with the name and connection number it keys every fault stream.
    pub seed: u64,
    /// Bytes buffered per direction (see [`ProxyOptions::window`]).
    pub window: usize,
    pub connect_timeout: Duration,
    /// Most client connections per proxy (see [`ProxyOptions::max_connections`]).
    pub max_connections: Option<usize>,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            seed: 0,
            window: DEFAULT_WINDOW,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_connections: None,
        }
    }
}

/// What creating a proxy takes.
#[derive(Clone, Debug)]
pub struct ProxySpec {
    pub name: String,
    pub listen: String,
    pub upstream: String,
    pub enabled: bool,
    /// The proxy's own impairment under its toxics (`local` over the API; `--profile` for the
    /// proxy named on the command line).
    pub base: Profile,
    /// `model` (the default) or `kernel`: real kernel TCP over the link engine, whose path the
    /// toxics retune live.
    pub engine: Engine,
    /// Toxics to create with the proxy, in force before its listener accepts anything (so no
    /// connection slips past them); `None` when the request gave none. On a proxy that
    /// `/populate` keeps running, `Some` replaces its toxics.
    pub toxics: Option<Vec<ToxicEntry>>,
}

impl ProxySpec {
    /// From a create or populate body (see [`ProxySpec::from_request`]).
    pub(crate) fn from_json(v: Value, at: Option<usize>) -> Result<ProxySpec, ApiError> {
        ProxySpec::from_request(super::parse_body(v)?, at)
    }

    /// From a create or populate request; `at` names the entry in a populate list
    /// (Toxiproxy's "missing required field: name at proxy 2"). Fields are checked in this
    /// order, each with its own message.
    pub(crate) fn from_request(
        request: ProxyRequest,
        at: Option<usize>,
    ) -> Result<ProxySpec, ApiError> {
        let text = |key: &str, given: Option<Given<String>>| -> Result<String, ApiError> {
            match given {
                None => Ok(String::new()),
                Some(Given::Is(s)) => Ok(s),
                Some(Given::Other(other)) => Err(ApiError::bad_body(&format!(
                    "{key} must be a string, got {other}"
                ))),
            }
        };
        let name = text("name", request.name)?;
        if name.is_empty() {
            return Err(ApiError::missing_field("name", at));
        }
        let upstream = text("upstream", request.upstream)?;
        if upstream.is_empty() {
            return Err(ApiError::missing_field("upstream", at));
        }
        let listen = match text("listen", request.listen)? {
            l if l.is_empty() => DEFAULT_LISTEN.to_string(),
            l => l,
        };
        let enabled = match request.enabled {
            None => true,
            Some(Given::Is(b)) => b,
            Some(Given::Other(other)) => {
                return Err(ApiError::bad_body(&format!(
                    "enabled must be true or false, got {other}"
                )))
            }
        };
        let engine = match text("engine", request.engine)?.as_str() {
            "" | "model" => Engine::Model,
            "kernel" => Engine::Kernel,
            other => {
                return Err(ApiError::bad_body(&format!(
                    "engine must be \"model\" or \"kernel\", got \"{other}\""
                )))
            }
        };
        let toxics = match request.toxics {
            None => None,
            Some(Given::Is(list)) => Some(toxic_list(&name, engine, list)?),
            Some(Given::Other(other)) => {
                return Err(ApiError::bad_body(&format!(
                    "toxics must be a JSON array of toxics, got {other}"
                )))
            }
        };
        Ok(ProxySpec {
            name,
            listen,
            upstream,
            enabled,
            base: Profile::builtin("local").expect("built in"),
            engine,
            toxics,
        })
    }
}

/// The toxics of a create or populate entry, each as `POST /proxies/{name}/toxics` takes it.
/// The first bad one refuses the whole proxy; its error names the proxy and the toxic.
fn toxic_list(proxy: &str, engine: Engine, list: Vec<Value>) -> Result<Vec<ToxicEntry>, ApiError> {
    let mut toxics: Vec<ToxicEntry> = Vec::new();
    for (i, body) in list.into_iter().enumerate() {
        let within = |e: ApiError, toxic: &str| {
            let toxic = match toxic {
                "" => format!("toxic {}", i + 1),
                name => format!("toxic {} \"{name}\"", i + 1),
            };
            e.within(&format!("(proxy \"{proxy}\", {toxic})"))
        };
        let request: ToxicRequest = super::parse_body(body).map_err(|e| within(e, ""))?;
        let given_name = match &request.name {
            Some(Given::Is(name)) => name.as_str(),
            _ => "",
        };
        // Revisions are stamped when the proxy is created.
        let entry = ToxicEntry::create(&request, 0).map_err(|e| within(e, given_name))?;
        let name = entry.toxic.name.clone();
        admits(engine, proxy, &entry.toxic).map_err(|e| within(e, &name))?;
        if toxics.iter().any(|e| e.toxic.name == name) {
            return Err(within(ApiError::toxic_exists(), &name));
        }
        toxics.push(entry);
    }
    Ok(toxics)
}

/// A running proxy's handle.
struct Running {
    stop: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
    /// The kernel engine's path, retuned as the toxics change.
    path: Option<Arc<KernelPath>>,
}

struct Managed {
    name: String,
    /// As given until the proxy first listens, then the address it is bound to.
    listen: String,
    upstream: String,
    base: Profile,
    engine: Engine,
    /// In the order they were added; each direction applies its own in this order.
    toxics: Vec<ToxicEntry>,
    /// What connections follow: a change here reaches every live connection.
    published: watch::Sender<Arc<Vec<Toxic>>>,
    /// Kept across restarts, so counters cover the proxy's whole life.
    stats: Arc<ProxyStats>,
    running: Option<Running>,
}

impl Managed {
    /// A stopped proxy with the spec's toxics already published, so its first connection
    /// meets them.
    fn new(spec: &ProxySpec) -> Managed {
        let p = Managed {
            name: spec.name.clone(),
            listen: spec.listen.clone(),
            upstream: spec.upstream.clone(),
            base: spec.base.clone(),
            engine: spec.engine,
            toxics: spec.toxics.clone().unwrap_or_default(),
            published: watch::channel(Arc::new(Vec::new())).0,
            stats: Arc::default(),
            running: None,
        };
        p.publish();
        p
    }

    fn enabled(&self) -> bool {
        self.running.is_some()
    }

    async fn start(&mut self, options: &RegistryOptions) -> Result<(), ApiError> {
        if self.running.is_some() {
            return Ok(());
        }
        let addr = resolve(&self.listen).await?;
        let listener = crate::net::bind(addr)
            .map_err(|e| ApiError::internal(&format!("listen tcp {}: {e}", self.listen)))?;
        let bound = listener
            .local_addr()
            .map_err(|e| ApiError::internal(&e.to_string()))?;
        self.listen = bound.to_string();
        let proxy = Proxy::with_faults(
            self.upstream.clone(),
            Faults::Live {
                base: self.base.clone(),
                toxics: self.published.subscribe(),
            },
            ProxyOptions {
                name: self.name.clone(),
                seed: options.seed,
                window: options.window,
                connect_timeout: options.connect_timeout,
                max_connections: options.max_connections,
            },
            self.stats.clone(),
        );
        let proxy = match self.engine {
            Engine::Kernel => proxy.with_kernel_engine().await.map_err(|e| {
                ApiError::internal(&format!("proxy {}: the kernel engine: {e}", self.name))
            })?,
            _ => proxy,
        };
        let path = proxy.kernel_path();
        let stop = CancellationToken::new();
        let task = tokio::spawn(proxy.run(listener, stop.clone().cancelled_owned()));
        tracing::info!(proxy = %self.name, listen = %self.listen, upstream = %self.upstream, "started");
        self.running = Some(Running { stop, task, path });
        Ok(())
    }

    /// Closes the listener and every connection, and returns once they are closed.
    async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop.cancel();
            let _ = r.task.await;
            tracing::info!(proxy = %self.name, "stopped");
        }
    }

    /// Puts the toxics in force before the API answers: the kernel engine's path is retuned
    /// here, and each model connection takes the change up before the next byte it reads.
    fn publish(&self) {
        let list: Vec<Toxic> = self.toxics.iter().map(|e| e.toxic.clone()).collect();
        if let Some(path) = self.running.as_ref().and_then(|r| r.path.as_ref()) {
            path.retune(&crate::toxic::resolve_path(&self.base, &list));
        }
        self.published.send_replace(Arc::new(list));
    }

    fn find_toxic(&self, name: &str) -> Result<usize, ApiError> {
        self.toxics
            .iter()
            .position(|e| e.toxic.name == name)
            .ok_or_else(ApiError::toxic_not_found)
    }

    /// Toxics as Toxiproxy lists them: upstream ones first, each direction in order.
    fn toxics_wire(&self) -> Vec<ToxicJson> {
        let mut list = Vec::new();
        for d in [Direction::Upstream, Direction::Downstream] {
            list.extend(
                self.toxics
                    .iter()
                    .filter(|e| e.toxic.stream == d)
                    .map(ToxicEntry::to_wire),
            );
        }
        list
    }

    fn to_wire(&self) -> ProxyJson {
        ProxyJson {
            name: self.name.clone(),
            listen: self.listen.clone(),
            upstream: self.upstream.clone(),
            enabled: self.enabled(),
            engine: self.engine.as_str().to_string(),
            toxics: Some(self.toxics_wire()),
        }
    }

    fn admits(&self, toxic: &Toxic) -> Result<(), ApiError> {
        admits(self.engine, &self.name, toxic)
    }
}

/// A model proxy works on a byte stream: a profile toxic there may not ask for what only
/// packets have (reorder, duplicate, corrupt) or for BBR, which the model's sender lacks; taken
/// silently, the toxic would run without them. A kernel-engine proxy's connections share one
/// real link: a toxic there must describe the path and apply to every connection.
fn admits(engine: Engine, proxy: &str, toxic: &Toxic) -> Result<(), ApiError> {
    if engine != Engine::Kernel {
        if let ToxicKind::Profile(ProfileAttributes {
            settled: Some(profile),
            ..
        }) = &toxic.kind
        {
            let origin = format!("toxic {} on proxy {proxy} (engine model)", toxic.name);
            profile
                .check_model_engine(&origin)
                .map_err(|e| ApiError::bad_body(&e.to_string()))?;
        }
        return Ok(());
    }
    if !toxic.kind.shapes_the_path() {
        return Err(ApiError::bad_body(&format!(
            "toxic type {} cannot run on proxy {proxy} (engine kernel): its connections share \
             one real link, which takes latency, bandwidth, loss, profile and noop toxics",
            toxic.kind.type_name(),
        )));
    }
    if !toxic.clients.is_empty() {
        return Err(ApiError::bad_body(&format!(
            "attribute clients cannot be used on proxy {proxy} (engine kernel): its connections \
             share one real link, so a toxic applies to all of them or none"
        )));
    }
    if toxic.toxicity < 1.0 {
        return Err(ApiError::bad_body(&format!(
            "toxicity {} cannot run on proxy {proxy} (engine kernel): its connections share one \
             real link, so a toxic applies to all of them or none",
            toxic.toxicity
        )));
    }
    Ok(())
}

async fn resolve(listen: &str) -> Result<SocketAddr, ApiError> {
    let fail = |why: String| ApiError::internal(&format!("listen tcp {listen}: {why}"));
    tokio::net::lookup_host(listen)
        .await
        .map_err(|e| fail(e.to_string()))?
        .next()
        .ok_or_else(|| fail("no address".into()))
}

/// Every managed proxy, by name.
pub struct Registry {
    proxies: Mutex<BTreeMap<String, Managed>>,
    options: RegistryOptions,
    /// Toxic revisions: every create and update gets a new one, so connections draw their
    /// toxicity again.
    revisions: AtomicU64,
}

impl Registry {
    pub fn new(options: RegistryOptions) -> Registry {
        Registry {
            proxies: Mutex::new(BTreeMap::new()),
            options,
            revisions: AtomicU64::new(0),
        }
    }

    fn revision(&self) -> u64 {
        self.revisions.fetch_add(1, Ordering::Relaxed)
    }

    /// `GET /proxies`: name → proxy.
    pub async fn list(&self) -> BTreeMap<String, ProxyJson> {
        let proxies = self.proxies.lock().await;
        proxies
            .iter()
            .map(|(name, p)| (name.clone(), p.to_wire()))
            .collect()
    }

    /// Gives the spec's toxics revisions of their own, so they draw like any toxic created
    /// over the API.
    fn stamp(&self, spec: &mut ProxySpec) {
        for e in spec.toxics.iter_mut().flatten() {
            e.toxic.revision = self.revision();
        }
    }

    /// `POST /proxies`: the proxy with its toxics, which are in force before it listens.
    pub async fn create(&self, mut spec: ProxySpec) -> Result<ProxyJson, ApiError> {
        let mut proxies = self.proxies.lock().await;
        if proxies.contains_key(&spec.name) {
            return Err(ApiError::proxy_exists());
        }
        self.stamp(&mut spec);
        let mut p = Managed::new(&spec);
        if spec.enabled {
            p.start(&self.options).await?;
        }
        let wire = p.to_wire();
        proxies.insert(spec.name, p);
        Ok(wire)
    }

    /// `POST /populate`: creates or replaces each proxy; one whose listen and upstream are
    /// unchanged keeps running with its toxics (or the entry's, when it gives `toxics`). On an
    /// error, the proxies done so far stay; bad toxics are refused before any is done, since
    /// every entry is parsed first.
    pub(crate) async fn populate_proxies(
        &self,
        specs: Vec<ProxySpec>,
    ) -> Result<PopulateJson, (ApiError, Vec<ProxyJson>)> {
        let mut proxies = self.proxies.lock().await;
        let mut done = Vec::new();
        for mut spec in specs {
            self.stamp(&mut spec);
            if let Some(existing) = proxies.get_mut(&spec.name) {
                if existing.upstream == spec.upstream
                    && same_listen(&existing.listen, &spec.listen)
                    && existing.engine == spec.engine
                {
                    if let Some(toxics) = spec.toxics.take() {
                        existing.toxics = toxics;
                        existing.publish();
                    }
                    if spec.enabled {
                        if let Err(e) = existing.start(&self.options).await {
                            return Err((e, done));
                        }
                    } else {
                        existing.stop().await;
                    }
                    done.push(existing.to_wire());
                    continue;
                }
                existing.stop().await;
                proxies.remove(&spec.name);
            }
            let mut p = Managed::new(&spec);
            if spec.enabled {
                if let Err(e) = p.start(&self.options).await {
                    return Err((e, done));
                }
            }
            done.push(p.to_wire());
            proxies.insert(spec.name, p);
        }
        Ok(PopulateJson { proxies: done })
    }

    /// `GET /proxies/{name}/stats` (ours): the proxy's counters since it was created, kept
    /// across restarts. The runner reads them before and after each cell of a remote run.
    pub async fn stats(&self, name: &str) -> Result<crate::proxy::StatsSnapshot, ApiError> {
        let proxies = self.proxies.lock().await;
        Ok(found(proxies.get(name))?.stats.snapshot())
    }

    /// `GET /proxies/{name}`.
    pub async fn get(&self, name: &str) -> Result<ProxyJson, ApiError> {
        let proxies = self.proxies.lock().await;
        Ok(found(proxies.get(name))?.to_wire())
    }

    /// `POST|PATCH /proxies/{name}`: a partial update. A new listen or upstream restarts the
    /// proxy (its connections close); `enabled` starts or stops it; toxics stay.
    pub async fn update(&self, name: &str, update: ProxyUpdate) -> Result<ProxyJson, ApiError> {
        let mut proxies = self.proxies.lock().await;
        let p = found(proxies.get_mut(name))?;
        let text = |key: &str, given: Option<Given<String>>, current: &str| match given {
            None => Ok(current.to_string()),
            Some(Given::Is(s)) if !s.is_empty() => Ok(s),
            Some(Given::Is(_)) if key == "listen" => Ok(DEFAULT_LISTEN.to_string()),
            Some(other) => Err(ApiError::bad_body(&format!(
                "{key} must be a non-empty string, got {}",
                other.shown()
            ))),
        };
        let listen = text("listen", update.listen, &p.listen)?;
        let upstream = text("upstream", update.upstream, &p.upstream)?;
        match update.engine {
            None => {}
            Some(Given::Is(e)) if e == p.engine.as_str() => {}
            Some(other) => {
                return Err(ApiError::bad_body(&format!(
                    "engine is {} and cannot change to {} on a running proxy: delete \
                     proxy {name} and create it again (or /populate it)",
                    p.engine.as_str(),
                    other.shown()
                )))
            }
        }
        let enabled = match update.enabled {
            None => p.enabled(),
            Some(Given::Is(b)) => b,
            Some(Given::Other(other)) => {
                return Err(ApiError::bad_body(&format!(
                    "enabled must be true or false, got {other}"
                )))
            }
        };
        if !same_listen(&p.listen, &listen) || upstream != p.upstream {
            // A restart: stopped here, started below if it is to be enabled.
            p.stop().await;
            p.listen = listen;
            p.upstream = upstream;
        }
        if enabled {
            p.start(&self.options).await?;
        } else {
            p.stop().await;
        }
        Ok(p.to_wire())
    }

    /// `DELETE /proxies/{name}`.
    pub async fn delete(&self, name: &str) -> Result<(), ApiError> {
        let mut proxies = self.proxies.lock().await;
        let mut p = proxies.remove(name).ok_or_else(ApiError::proxy_not_found)?;
        p.stop().await;
        Ok(())
    }

    /// `POST /reset`: every proxy enabled, every toxic removed.
    pub async fn reset(&self) -> Result<(), ApiError> {
        let mut proxies = self.proxies.lock().await;
        for p in proxies.values_mut() {
            p.start(&self.options).await?;
            p.toxics.clear();
            p.publish();
        }
        Ok(())
    }

    /// `GET /proxies/{name}/toxics`.
    pub async fn toxics(&self, name: &str) -> Result<Vec<ToxicJson>, ApiError> {
        let proxies = self.proxies.lock().await;
        Ok(found(proxies.get(name))?.toxics_wire())
    }

    /// `POST /proxies/{name}/toxics`; the toxic reaches live connections at once.
    pub async fn add_toxic(
        &self,
        name: &str,
        request: Result<ToxicRequest, ApiError>,
    ) -> Result<ToxicJson, ApiError> {
        let mut proxies = self.proxies.lock().await;
        let p = found(proxies.get_mut(name))?;
        let entry = ToxicEntry::create(&request?, self.revision())?;
        p.admits(&entry.toxic)?;
        if p.toxics.iter().any(|e| e.toxic.name == entry.toxic.name) {
            return Err(ApiError::toxic_exists());
        }
        let wire = entry.to_wire();
        p.toxics.push(entry);
        p.publish();
        Ok(wire)
    }

    /// `GET /proxies/{name}/toxics/{toxic}`.
    pub(crate) async fn get_toxic(&self, name: &str, toxic: &str) -> Result<ToxicJson, ApiError> {
        let proxies = self.proxies.lock().await;
        let p = found(proxies.get(name))?;
        Ok(p.toxics[p.find_toxic(toxic)?].to_wire())
    }

    /// `POST|PATCH /proxies/{name}/toxics/{toxic}`: omitted attributes keep their values.
    pub async fn update_toxic(
        &self,
        name: &str,
        toxic: &str,
        update: Result<ToxicUpdate, ApiError>,
    ) -> Result<ToxicJson, ApiError> {
        let mut proxies = self.proxies.lock().await;
        let p = found(proxies.get_mut(name))?;
        let i = p.find_toxic(toxic)?;
        let next = p.toxics[i].update(&update?, self.revision())?;
        p.admits(&next.toxic)?;
        let wire = next.to_wire();
        p.toxics[i] = next;
        p.publish();
        Ok(wire)
    }

    /// `DELETE /proxies/{name}/toxics/{toxic}`.
    pub(crate) async fn delete_toxic(&self, name: &str, toxic: &str) -> Result<(), ApiError> {
        let mut proxies = self.proxies.lock().await;
        let p = found(proxies.get_mut(name))?;
        let i = p.find_toxic(toxic)?;
        p.toxics.remove(i);
        p.publish();
        Ok(())
    }

    /// Every proxy's counters and toxics, for `/metrics`.
    pub async fn snapshot(&self) -> Vec<ProxyMetrics> {
        let proxies = self.proxies.lock().await;
        proxies
            .values()
            .map(|p| ProxyMetrics {
                name: p.name.clone(),
                enabled: p.enabled(),
                stats: p.stats.snapshot(),
                toxics: p
                    .toxics
                    .iter()
                    .map(|e| (e.toxic.kind.type_name(), e.toxic.stream))
                    .collect(),
            })
            .collect()
    }

    /// Stops every proxy (the API is shutting down).
    pub(crate) async fn stop_all(&self) {
        let mut proxies = self.proxies.lock().await;
        for p in proxies.values_mut() {
            p.stop().await;
        }
    }
}

/// One proxy's figures for `/metrics`.
pub struct ProxyMetrics {
    pub name: String,
    pub enabled: bool,
    pub stats: crate::proxy::StatsSnapshot,
    pub toxics: Vec<(String, Direction)>,
}

fn found<T>(p: Option<T>) -> Result<T, ApiError> {
    p.ok_or_else(ApiError::proxy_not_found)
}

/// Whether a requested listen address is the one a proxy has: equal strings, or a request for
/// port 0 on the host it is bound to (so populating the same file twice keeps proxies running).
fn same_listen(current: &str, requested: &str) -> bool {
    if current == requested {
        return true;
    }
    match (
        current.parse::<SocketAddr>(),
        requested.parse::<SocketAddr>(),
    ) {
        (Ok(c), Ok(r)) => r.port() == 0 && c.ip() == r.ip(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A wrongly-typed field gets its own message, and fields are checked in the same order
    /// whatever order the body gives them in.
    #[test]
    fn wrongly_typed_proxy_fields_get_their_own_messages() {
        let err = |v: Value| ProxySpec::from_json(v, None).unwrap_err().message;
        assert_eq!(
            err(json!({"name": 5, "upstream": "h:1"})),
            "bad request body: name must be a string, got 5"
        );
        assert_eq!(
            err(json!({"upstream": 5})),
            "missing required field: name",
            "a missing name before a bad upstream"
        );
        assert_eq!(
            err(json!({"name": "p", "upstream": "h:1", "enabled": "yes"})),
            "bad request body: enabled must be true or false, got \"yes\""
        );
        assert_eq!(
            err(json!({"name": "p", "upstream": "h:1", "toxics": [5]})),
            "bad request body: expected a JSON object (proxy \"p\", toxic 1)"
        );
        assert_eq!(err(json!([])), "bad request body: expected a JSON object");
        let spec = ProxySpec::from_json(
            json!({"name": "p", "upstream": "h:1", "listen": null}),
            Some(0),
        )
        .unwrap();
        assert_eq!(spec.listen, DEFAULT_LISTEN);
        assert!(spec.enabled);
    }

    #[test]
    fn wrongly_typed_toxic_fields_get_toxiproxys_messages() {
        let err = |v: Value| {
            super::super::parse_body(v)
                .and_then(|r: ToxicRequest| ToxicEntry::create(&r, 0))
                .unwrap_err()
                .message
        };
        assert_eq!(
            err(json!({"type": "noop", "stream": 1})),
            ApiError::invalid_stream().message
        );
        assert_eq!(
            err(json!({"type": "noop", "name": []})),
            "bad request body: name must be a string"
        );
        assert_eq!(err(json!({"type": 7})), "invalid toxic type");
        assert_eq!(
            err(json!({"type": "noop", "toxicity": 1e300})),
            "bad request body: toxicity must be a number in [0, 1], got 1e+300"
        );
        assert_eq!(
            err(json!({"type": "noop", "attributes": [1]})),
            "bad request body: attributes must be an object"
        );
    }
}
