//! Upstreams ready for the data plane: resolved nodes, timeouts, and the balancer.
//!
//! Balancers pick among eligible nodes: weight > 0 and not already tried for this request (the
//! health-check issue adds "takes traffic" to that filter through [`CompiledUpstream::pick`]'s
//! `eligible` argument). Locks are held only for the arithmetic of one pick, never across awaits.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use parking_lot::Mutex;

use crate::dns::Query;
use crate::health::checker::Checker;
use crate::health::HealthRegistry;
use crate::mtls::ClientIdentity;
use crate::resources::model::{parse_node_key, secs, DiscoveryType, HashOn, LbType, Nodes, PassHost, Scheme, Upstream};

/// One upstream node.
#[derive(Debug, Clone)]
pub struct Node {
    /// Address to connect to.
    pub addr: SocketAddr,
    /// Host as configured (Host header with `pass_host: node`).
    pub host_header: HeaderValue,
    /// Relative weight (0: never picked).
    pub weight: u32,
    /// Which pooled connections may serve it (address, and for https the TLS server name: the
    /// node's DNS name, or its IP), computed once.
    pub pool_key: PoolKey,
}

/// Per-upstream timeouts.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Connect.
    pub connect: Duration,
    /// Send (request head and body).
    pub send: Duration,
    /// Read (response head, and each body read).
    pub read: Duration,
}

/// A compiled upstream.
pub struct CompiledUpstream {
    /// `(kind, id)` of the resource owning it, e.g. `("upstreams", "1")`.
    pub owner: (&'static str, Arc<str>),
    /// The configuration.
    pub conf: Arc<Upstream>,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// Attempts after the first one.
    pub retries: usize,
    /// Time budget for starting retries.
    pub retry_timeout: Option<Duration>,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// `http` or `https`.
    pub scheme: Scheme,
    /// Host header policy.
    pub pass_host: PassHost,
    /// Host header with `pass_host: rewrite`.
    pub upstream_host: Option<HeaderValue>,
    /// `keepalive_pool`, with APISIX's defaults.
    pub pool: PoolSettings,
    /// Its health checker, once it served a request (with `checks`).
    pub checker: std::sync::OnceLock<Arc<Checker>>,
    /// The DNS answers its nodes came from, with their generations (0: none yet).
    pub dns: Vec<(Query, u64)>,
    /// The `ssls` client certificate (`tls.client_cert_id`) it presents, as it was compiled.
    identity: Option<Arc<ClientIdentity>>,
    balancer: Balancer,
}

enum Balancer {
    RoundRobin(Mutex<Vec<i64>>),
    Chash(Vec<(u32, usize)>),
    LeastConn(Vec<AtomicUsize>),
}

/// Releases a least-connections slot when the request ends.
pub struct InFlight {
    upstream: Arc<CompiledUpstream>,
    node: usize,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Balancer::LeastConn(counts) = &self.upstream.balancer {
            counts[self.node].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// FNV-1a, 32 bits: tiny, fast, good enough spread for a hash ring.
pub fn fnv1a(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in data {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    // Final avalanche (murmur3 fmix32) so that similar keys land far apart on the ring.
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

impl CompiledUpstream {
    /// Its health checker (with `checks`), started on the first request and cached here, so
    /// that later requests take no lock.
    pub fn checker(&self, registry: &HealthRegistry) -> Option<Arc<Checker>> {
        if let Some(c) = self.checker.get() {
            return Some(c.clone());
        }
        let checks = self.conf.checks.as_ref()?;
        let c = registry.checker((self.owner.0, &self.owner.1), checks, &self.addrs());
        let _ = self.checker.set(c.clone());
        Some(c)
    }

    /// Whether the DNS answers it was compiled from are still the current ones (a snapshot
    /// build compiles it again when not).
    pub fn dns_current(&self) -> bool {
        let Some(service) = crate::dns::service() else { return true };
        self.dns.iter().all(|(q, g)| service.generation(q).unwrap_or(0) == *g)
    }

    /// Whether the client certificate `tls.client_cert_id` names is still the one it was
    /// compiled with (a snapshot build compiles it again when not).
    pub fn identity_current(&self, identities: &Identities) -> bool {
        let now = self.conf.tls.as_ref().and_then(|t| t.client_cert_id.as_ref()).and_then(|id| identities.get(&id.0));
        self.identity.as_deref() == now.map(|i| &**i)
    }

    /// The nodes' addresses.
    fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.addr).collect()
    }

    /// Compiles `conf`. Node names take the addresses the DNS service has for them now (every
    /// A and AAAA record a node); problems are returned as warnings (a name without an answer
    /// yet has no nodes until it has one).
    /// `identities` are the `type: client` certificates (`tls.client_cert_id`).
    pub fn compile(
        owner: (&'static str, Arc<str>),
        conf: Arc<Upstream>,
        identities: &Identities,
    ) -> (CompiledUpstream, Vec<String>) {
        let default_port = match conf.scheme {
            Scheme::Http | Scheme::Grpc => 80,
            Scheme::Https | Scheme::Grpcs => 443,
        };
        let mut warnings = Vec::new();
        let verify = conf.tls.as_ref().is_none_or(|t| t.verify);
        let (client, identity) = match client_tls(&conf, verify, identities) {
            Ok(pair) => pair,
            Err(e) => {
                warnings.push(e);
                (None, None)
            }
        };
        let mut dns = Vec::new();
        let mut nodes = Vec::new();
        for (host, port, weight) in configured_nodes(&conf) {
            let port = port.unwrap_or(default_port);
            let header = |host: &str, port: u16| {
                let text = if port == default_port { host.to_owned() } else { format!("{host}:{port}") };
                HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("localhost"))
            };
            let mut push = |addr: SocketAddr, name: &str, weight: u32| {
                let tls = conf.scheme.tls().then(|| {
                    let name = if name.parse::<IpAddr>().is_ok() { addr.ip().to_string() } else { name.to_owned() };
                    TlsKey { name: Arc::from(name), verify, client: client.clone() }
                });
                let pool_key = PoolKey { addr, tls, h2: conf.scheme.grpc() };
                nodes.push(Node { addr, host_header: header(name, addr.port()), weight, pool_key });
            };
            if let Ok(ip) = host.parse::<IpAddr>() {
                push(SocketAddr::new(ip, port), &host, weight);
                continue;
            }
            let Some(service) = crate::dns::service() else {
                // No resolver service (`weir -t`, unit tests): the system's resolver, once.
                match (host.as_str(), port).to_socket_addrs().ok().and_then(|mut a| a.next()) {
                    Some(addr) => push(addr, &host, weight),
                    None => warnings.push(format!("node `{host}:{port}` does not resolve; skipped")),
                }
                continue;
            };
            let query = Query::Host(Arc::from(host.as_str()));
            let answer = service.answer(&query);
            dns.push((query, answer.as_ref().map_or(0, |a| a.generation)));
            let Some(answer) = answer else {
                warnings.push(format!("node `{host}:{port}` does not resolve yet; it joins when it does"));
                continue;
            };
            for t in answer.targets.iter() {
                push(SocketAddr::new(t.ip, port), &host, weight);
            }
        }
        if let Some((query, port)) = service_query(&conf) {
            let answer = crate::dns::service().and_then(|s| s.answer(&query));
            dns.push((query.clone(), answer.as_ref().map_or(0, |a| a.generation)));
            match answer {
                None => warnings.push(format!("service `{query}` does not resolve yet; its nodes join when it does")),
                Some(answer) => {
                    for t in answer.targets.iter() {
                        let port = t.port.or(port).unwrap_or(default_port);
                        let addr = SocketAddr::new(t.ip, port);
                        let tls =
                            conf.scheme.tls().then(|| TlsKey { name: t.name.clone(), verify, client: client.clone() });
                        let pool_key = PoolKey { addr, tls, h2: conf.scheme.grpc() };
                        let text = if port == default_port { t.name.to_string() } else { format!("{}:{port}", t.name) };
                        let host_header =
                            HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("localhost"));
                        nodes.push(Node { addr, host_header, weight: t.weight.unwrap_or(1), pool_key });
                    }
                }
            }
        }
        let timeouts = conf.timeout.map_or(Timeouts { connect: secs(60.0), send: secs(60.0), read: secs(60.0) }, |t| {
            Timeouts { connect: secs(t.connect), send: secs(t.send), read: secs(t.read) }
        });
        let balancer = match conf.lb {
            LbType::Roundrobin => Balancer::RoundRobin(Mutex::new(vec![0; nodes.len()])),
            LbType::LeastConn => Balancer::LeastConn(nodes.iter().map(|_| AtomicUsize::new(0)).collect()),
            LbType::Chash => {
                let mut ring = Vec::new();
                for (i, n) in nodes.iter().enumerate() {
                    for v in 0..(n.weight.min(1000) * 40) {
                        ring.push((fnv1a(format!("{}#{v}", n.addr).as_bytes()), i));
                    }
                }
                ring.sort_unstable();
                Balancer::Chash(ring)
            }
        };
        let upstream_host = conf.upstream_host.as_deref().and_then(|h| HeaderValue::from_str(h).ok());
        let pool = match conf.keepalive_pool {
            Some(p) => PoolSettings { size: p.size as usize, idle_timeout: secs(p.idle_timeout), requests: p.requests },
            // APISIX's defaults.
            None => PoolSettings { size: 320, idle_timeout: Duration::from_secs(60), requests: 1000 },
        };
        let usable = nodes.iter().filter(|n| n.weight > 0).count();
        let compiled = CompiledUpstream {
            owner,
            dns,
            identity,
            retries: conf.retries.map_or(usable.saturating_sub(1), |r| r as usize),
            retry_timeout: conf.retry_timeout.filter(|t| *t > 0.0).map(secs),
            timeouts,
            scheme: conf.scheme,
            pass_host: conf.pass_host,
            upstream_host,
            pool,
            checker: std::sync::OnceLock::new(),
            nodes,
            balancer,
            conf,
        };
        (compiled, warnings)
    }

    /// Whether `chash` needs a key from the request, and which.
    pub fn hash_key_source(&self) -> Option<(HashOn, &str)> {
        match self.balancer {
            Balancer::Chash(_) => Some((self.conf.hash_on, self.conf.key.as_deref().unwrap_or("remote_addr"))),
            _ => None,
        }
    }

    /// The key `chash` hashes for a request (`None` for the other balancers): the `hash_on`
    /// source named by `key`, or the client address when the request has no such value.
    pub fn request_hash(&self, ctx: &weir_plugin::RequestCtx) -> Option<u32> {
        let (on, key) = self.hash_key_source()?;
        let value = match on {
            HashOn::Vars => ctx.var(key).map(|v| v.into_owned()),
            HashOn::Header => ctx.header(key).map(str::to_owned),
            HashOn::Cookie => ctx.header("cookie").and_then(|c| {
                c.split(';')
                    .find_map(|kv| kv.trim().split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v.to_owned()))
            }),
            HashOn::Consumer => ctx.consumer.as_ref().map(|c| c.username.to_string()),
        };
        Some(fnv1a(value.unwrap_or_else(|| ctx.remote_ip.to_string()).as_bytes()))
    }

    /// Whether some node with weight takes traffic by `checker` (none checked: all do).
    fn healthy_exists(&self, checker: Option<&Checker>) -> bool {
        checker.is_none_or(|c| self.nodes.iter().any(|n| n.weight > 0 && c.takes_traffic(n.addr)))
    }

    /// Picks a node for an attempt: not among `tried`, and healthy by `checker` unless no node is
    /// (then every node is a candidate, and the checker notes the fallback). The one rule the
    /// HTTP proxy and both stream proxies follow.
    pub fn pick_node(
        self: &Arc<Self>,
        checker: Option<&Checker>,
        hash: Option<u32>,
        tried: &[usize],
    ) -> Option<(usize, Option<InFlight>)> {
        let healthy_exists = self.healthy_exists(checker);
        if let Some(c) = checker {
            c.note_fallback(!healthy_exists);
        }
        self.pick(hash, |i| {
            !tried.contains(&i) && (!healthy_exists || checker.is_none_or(|c| c.takes_traffic(self.nodes[i].addr)))
        })
    }

    /// The node [`CompiledUpstream::pick_node`] would pick for a first attempt now, changing
    /// nothing (no balancer state moves, nothing is logged): `(node, whether every node is
    /// unhealthy and the pick falls back to all)`. For `POST /v1/explain`.
    pub fn peek_node(self: &Arc<Self>, checker: Option<&Checker>, hash: Option<u32>) -> Option<(usize, bool)> {
        let healthy_exists = self.healthy_exists(checker);
        let pick = self.choose(
            hash,
            |i| !healthy_exists || checker.is_none_or(|c| c.takes_traffic(self.nodes[i].addr)),
            false,
        )?;
        Some((pick.0, !healthy_exists))
    }

    /// Picks a node among those `eligible` accepts (and weight > 0). `hash` is the request's hash
    /// key for `chash`.
    pub fn pick(
        self: &Arc<Self>,
        hash: Option<u32>,
        eligible: impl Fn(usize) -> bool,
    ) -> Option<(usize, Option<InFlight>)> {
        self.choose(hash, eligible, true)
    }

    /// [`CompiledUpstream::pick`]; with `commit` false, the balancer's state is left as it was
    /// (round robin's weights, least_conn's count) and no slot is taken.
    #[inline]
    fn choose(
        self: &Arc<Self>,
        hash: Option<u32>,
        eligible: impl Fn(usize) -> bool,
        commit: bool,
    ) -> Option<(usize, Option<InFlight>)> {
        let ok = |i: usize| self.nodes[i].weight > 0 && eligible(i);
        match &self.balancer {
            Balancer::RoundRobin(state) => {
                let mut cw = state.lock();
                let mut total: i64 = 0;
                let mut best: Option<(usize, i64)> = None;
                for i in 0..self.nodes.len() {
                    if !ok(i) {
                        continue;
                    }
                    let w = i64::from(self.nodes[i].weight);
                    let current = cw[i] + w;
                    if commit {
                        cw[i] = current;
                    }
                    total += w;
                    if best.is_none_or(|(_, b)| current > b) {
                        best = Some((i, current));
                    }
                }
                let (b, _) = best?;
                if commit {
                    cw[b] -= total;
                }
                Some((b, None))
            }
            Balancer::Chash(ring) => {
                if ring.is_empty() {
                    return None;
                }
                let h = hash.unwrap_or(0);
                let start = ring.partition_point(|(p, _)| *p < h);
                (0..ring.len()).map(|k| ring[(start + k) % ring.len()].1).find(|&i| ok(i)).map(|i| (i, None))
            }
            Balancer::LeastConn(counts) => {
                let mut best: Option<(usize, f64)> = None;
                for (i, c) in counts.iter().enumerate() {
                    if !ok(i) {
                        continue;
                    }
                    let load = (c.load(Ordering::Relaxed) + 1) as f64 / f64::from(self.nodes[i].weight);
                    if best.is_none_or(|(_, l)| load < l) {
                        best = Some((i, load));
                    }
                }
                let (i, _) = best?;
                if !commit {
                    return Some((i, None));
                }
                counts[i].fetch_add(1, Ordering::Relaxed);
                Some((i, Some(InFlight { upstream: self.clone(), node: i })))
            }
        }
    }

    /// The balancer's name (`roundrobin`, `chash`, `least_conn`).
    pub fn balancer_name(&self) -> &'static str {
        match self.balancer {
            Balancer::RoundRobin(_) => "roundrobin",
            Balancer::Chash(_) => "chash",
            Balancer::LeastConn(_) => "least_conn",
        }
    }
}

/// The `(host, port, weight)` of `conf.nodes`.
fn configured_nodes(conf: &Upstream) -> Vec<(String, Option<u16>, u32)> {
    match &conf.nodes {
        Nodes::Map(map) => map.iter().filter_map(|(k, w)| parse_node_key(k).ok().map(|(h, p)| (h, p, *w))).collect(),
        Nodes::List(list) => list.iter().map(|n| (n.host.clone(), n.port, n.weight)).collect(),
    }
}

/// The DNS names `conf` depends on (for a build to ask for them all at once).
pub fn dns_queries(conf: &Upstream) -> impl Iterator<Item = Query> + '_ {
    let nodes = configured_nodes(conf).into_iter().filter(|(h, _, _)| h.parse::<IpAddr>().is_err());
    let nodes = nodes.map(|(h, _, _)| Query::Host(Arc::from(h)));
    nodes.chain(service_query(conf).map(|(q, _)| q))
}

/// The query of a `discovery_type: dns` upstream's `service_name`, and the port it names
/// (`name:port`: A and AAAA records on that port; `name`: SRV records).
fn service_query(conf: &Upstream) -> Option<(Query, Option<u16>)> {
    match (conf.discovery_type, conf.service_name.as_deref()) {
        (Some(DiscoveryType::Dns), Some(name)) => {
            let (name, port) = parse_node_key(name).ok()?;
            let name = Arc::from(name);
            Some((if port.is_some() { Query::Host(name) } else { Query::Srv(name) }, port))
        }
        _ => None,
    }
}

/// Brings the running health checkers in line with the upstreams of a snapshot about to be
/// published, and caches each surviving checker on its upstream.
pub fn reconcile_checkers(registry: &HealthRegistry, upstreams: &[Arc<CompiledUpstream>]) {
    let find = |kind: &str, id: &str| upstreams.iter().find(|u| u.owner.0 == kind && *u.owner.1 == *id);
    let kept = registry.reconcile(|kind, id| {
        let u = find(kind, id)?;
        Some((u.conf.checks.clone()?, u.addrs()))
    });
    for ((kind, id), checker) in kept {
        if let Some(u) = find(&kind, &id) {
            let _ = u.checker.set(checker);
        }
    }
}

/// Which connections may serve a request: same address, same TLS identity.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct PoolKey {
    /// Address to connect to.
    pub addr: SocketAddr,
    /// TLS to the node.
    pub tls: Option<TlsKey>,
    /// HTTP/2 (gRPC upstreams) rather than HTTP/1.1.
    pub h2: bool,
}

/// TLS towards a node: its server name, whether its certificate is verified, and the client
/// certificate Weir presents (mutual TLS).
#[derive(Clone, Debug)]
pub struct TlsKey {
    /// The server name sent and verified.
    pub name: Arc<str>,
    /// Whether the node's certificate is verified.
    pub verify: bool,
    /// The client configurations presenting a certificate (HTTP/1.1, HTTP/2).
    pub client: Option<Arc<ClientTls>>,
}

impl PartialEq for TlsKey {
    fn eq(&self, other: &Self) -> bool {
        let same_client = match (&self.client, &other.client) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        self.name == other.name && self.verify == other.verify && same_client
    }
}

impl Eq for TlsKey {}

impl std::hash::Hash for TlsKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.verify.hash(state);
        self.client.as_ref().map(|c| Arc::as_ptr(c) as usize).hash(state);
    }
}

/// Client configurations presenting an upstream's client certificate (ALPN `http/1.1`, `h2`).
pub struct ClientTls {
    /// By `h2`.
    pub configs: [Arc<rustls::ClientConfig>; 2],
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

/// `type: client` certificates of `ssls`, by id.
pub type Identities = std::collections::HashMap<String, Arc<ClientIdentity>>;

/// The client certificate `conf.tls` names (inline, or an `ssls` entry), ready for connections,
/// and the entry it came from.
#[allow(clippy::type_complexity)]
fn client_tls(
    conf: &Upstream,
    verify: bool,
    identities: &Identities,
) -> Result<(Option<Arc<ClientTls>>, Option<Arc<ClientIdentity>>), String> {
    let Some(tls) = conf.tls.as_ref() else { return Ok((None, None)) };
    let (identity, entry) = match (&tls.client_cert, &tls.client_key, &tls.client_cert_id) {
        (Some(cert), Some(key), None) => (Arc::new(ClientIdentity::from_pem(cert, key)?), None),
        (None, None, Some(id)) => {
            let found = identities.get(&id.0).ok_or_else(|| format!("client certificate `{id}` not found"))?;
            (found.clone(), Some(found.clone()))
        }
        (None, None, None) => return Ok((None, None)),
        _ => return Err("`tls`: `client_cert` with `client_key`, or `client_cert_id` alone".into()),
    };
    let config = |h2| identity.client_config(verify, h2).map(Arc::new);
    Ok((Some(Arc::new(ClientTls { configs: [config(false)?, config(true)?] })), entry))
}

/// `keepalive_pool` of an upstream.
#[derive(Clone, Copy, Debug)]
pub struct PoolSettings {
    /// Idle connections kept per key.
    pub size: usize,
    /// How long an idle connection is kept.
    pub idle_timeout: Duration,
    /// Requests one connection serves before it is closed.
    pub requests: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(v: serde_json::Value) -> Arc<CompiledUpstream> {
        let conf: Upstream = serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"));
        Arc::new(CompiledUpstream::compile(("upstreams", Arc::from("t")), Arc::new(conf), &Identities::new()).0)
    }

    #[test]
    fn smooth_weighted_round_robin_interleaves() {
        let u =
            up(serde_json::json!({"nodes": {"127.0.0.1:1": 5, "127.0.0.1:2": 1, "127.0.0.1:3": 1, "127.0.0.1:4": 0}}));
        let picks: Vec<usize> = (0..7).filter_map(|_| u.pick(None, |_| true).map(|p| p.0)).collect();
        assert_eq!(picks, vec![0, 0, 1, 0, 2, 0, 0], "nginx's smooth sequence for 5:1:1");
        assert_eq!(u.retries, 2, "default retries: usable nodes - 1");
    }

    #[test]
    fn peeking_names_the_next_pick_and_moves_nothing() {
        let u = up(serde_json::json!({"nodes": {"127.0.0.1:1": 5, "127.0.0.1:2": 1, "127.0.0.1:3": 1}}));
        for _ in 0..9 {
            let peeked = u.peek_node(None, None).map(|p| p.0);
            assert_eq!(peeked, u.peek_node(None, None).map(|p| p.0), "peeking twice gives the same node");
            assert_eq!(peeked, u.pick_node(None, None, &[]).map(|p| p.0), "the pick is the peeked node");
        }
        let lc = up(serde_json::json!({"type": "least_conn", "nodes": {"127.0.0.1:1": 1, "127.0.0.1:2": 1}}));
        let held = lc.pick(None, |_| true);
        let peeked = lc.peek_node(None, None).map(|p| p.0);
        assert_ne!(peeked, held.as_ref().map(|p| p.0));
        assert_eq!(peeked, lc.peek_node(None, None).map(|p| p.0));
    }

    #[test]
    fn tried_nodes_are_skipped() {
        let u = up(serde_json::json!({"nodes": {"127.0.0.1:1": 1, "127.0.0.1:2": 1}}));
        for _ in 0..10 {
            assert_eq!(u.pick(None, |i| i != 0).map(|p| p.0), Some(1));
        }
        assert!(u.pick(None, |_| false).is_none());
    }

    #[test]
    fn chash_is_stable_and_spreads() {
        let u = up(
            serde_json::json!({"type": "chash", "key": "remote_addr", "nodes": {"127.0.0.1:1": 1, "127.0.0.1:2": 1, "127.0.0.1:3": 1}}),
        );
        let mut hits = [0usize; 3];
        for k in 0..3000u32 {
            let h = fnv1a(format!("client-{k}").as_bytes());
            let a = u.pick(Some(h), |_| true).map(|p| p.0);
            assert_eq!(a, u.pick(Some(h), |_| true).map(|p| p.0));
            hits[a.unwrap_or(0)] += 1;
        }
        assert!(hits.iter().all(|&n| n > 700), "{hits:?}");
    }

    #[test]
    fn least_conn_prefers_idle_nodes() {
        let u = up(serde_json::json!({"type": "least_conn", "nodes": {"127.0.0.1:1": 1, "127.0.0.1:2": 1}}));
        let a = u.pick(None, |_| true);
        let b = u.pick(None, |_| true);
        assert_ne!(a.as_ref().map(|p| p.0), b.as_ref().map(|p| p.0));
        drop(a);
        let c = u.pick(None, |_| true);
        assert_ne!(c.as_ref().map(|p| p.0), b.as_ref().map(|p| p.0));
    }
}
