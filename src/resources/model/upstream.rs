//! Upstreams: nodes (and parsing their `host:port` keys), load balancing, scheme, Host header,
//! timeouts, connection pool, TLS to the nodes.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Id;

/// Load-balancing algorithms.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LbType {
    // Smooth weighted round robin.
    #[default]
    Roundrobin,
    // Consistent hashing on `hash_on` / `key`.
    Chash,
    // Fewest in-flight requests (weighted).
    LeastConn,
}

/// What `chash` hashes on.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HashOn {
    #[default]
    Vars,
    Header,
    Cookie,
    Consumer,
}

/// Upstream scheme.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    #[default]
    Http,
    Https,
    // gRPC over cleartext HTTP/2 (h2c, prior knowledge).
    Grpc,
    // gRPC over HTTP/2 with TLS (ALPN h2).
    Grpcs,
}

impl Scheme {
    /// Whether the upstream is reached over TLS.
    pub fn tls(self) -> bool {
        matches!(self, Scheme::Https | Scheme::Grpcs)
    }
    /// Whether the upstream speaks gRPC (HTTP/2).
    pub fn grpc(self) -> bool {
        matches!(self, Scheme::Grpc | Scheme::Grpcs)
    }
}

/// Host header sent upstream.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PassHost {
    // The client's Host header.
    #[default]
    Pass,
    // The node's host.
    Node,
    // `upstream_host`.
    Rewrite,
}

/// Where an upstream's nodes come from besides `nodes`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DiscoveryType {
    // `service_name` resolved through DNS: SRV records, or A/AAAA records with a port.
    Dns,
}

/// Upstream nodes: a map `"host:port": weight`, or a list of `{host, port, weight}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(untagged)]
pub enum Nodes {
    /// `"host:port": weight`.
    Map(BTreeMap<String, u32>),
    /// `{host, port, weight}` objects.
    List(Vec<Node>),
}

impl Default for Nodes {
    fn default() -> Self {
        Nodes::List(Vec::new())
    }
}

/// One upstream node.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// Host name or IP address.
    #[schemars(length(min = 1))]
    pub host: String,
    /// Port (default: 80 for http, 443 for https).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub port: Option<u16>,
    /// Relative weight; 0 means never picked.
    #[serde(default = "weight_one")]
    pub weight: u32,
}

fn weight_one() -> u32 {
    1
}

/// Upstream timeouts in seconds (default 60 each, as nginx; at most a year).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Timeout {
    /// Connect timeout.
    #[serde(default = "sixty")]
    #[schemars(range(min = 0.001, max = 31536000.0))]
    pub connect: f64,
    /// Send timeout.
    #[serde(default = "sixty")]
    #[schemars(range(min = 0.001, max = 31536000.0))]
    pub send: f64,
    /// Read timeout.
    #[serde(default = "sixty")]
    #[schemars(range(min = 0.001, max = 31536000.0))]
    pub read: f64,
}

fn sixty() -> f64 {
    60.0
}

/// Upstream connection pool.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KeepalivePool {
    /// Idle connections kept per node.
    #[serde(default = "pool_size")]
    #[schemars(range(min = 1))]
    pub size: u32,
    /// Seconds an idle connection is kept.
    #[serde(default = "sixty")]
    #[schemars(range(min = 0.0, max = 31536000.0))]
    pub idle_timeout: f64,
    /// Requests served by one connection before it is closed.
    #[serde(default = "pool_requests")]
    #[schemars(range(min = 1))]
    pub requests: u32,
}

fn pool_size() -> u32 {
    320
}
fn pool_requests() -> u32 {
    1000
}

/// Upstream TLS settings.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTls {
    /// Verify the upstream certificate (default true).
    #[serde(default = "yes")]
    pub verify: bool,
    /// A client certificate (PEM chain) presented to the nodes (mutual TLS), with `client_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub client_cert: Option<String>,
    /// The key of `client_cert` (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub client_key: Option<String>,
    /// An `ssls` entry of `type: client` whose certificate is presented instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_id: Option<Id>,
}

fn yes() -> bool {
    true
}

/// An upstream: nodes and how to reach them.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// Identity (required for upstream objects, absent for inline upstreams).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Id>,
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub name: Option<String>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub desc: Option<String>,
    /// Load-balancing algorithm.
    #[serde(default, rename = "type")]
    pub lb: LbType,
    /// Nodes.
    #[serde(default)]
    pub nodes: Nodes,
    /// Service discovery for the nodes (`dns`), with `service_name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_type: Option<DiscoveryType>,
    /// The service `discovery_type` looks up: `name` (its SRV records: targets, ports and
    /// weights) or `name:port` (its A and AAAA records, on that port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_name: Option<String>,
    /// What `chash` hashes on.
    #[serde(default)]
    pub hash_on: HashOn,
    /// The variable, header or cookie name `chash` hashes (required for `chash`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub key: Option<String>,
    /// Health checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<crate::resources::checks::Checks>,
    /// Retries on connection failure (default: number of nodes - 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// Seconds within which retries may still start (0 or absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 31536000.0))]
    pub retry_timeout: Option<f64>,
    /// Timeouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Timeout>,
    /// Scheme to the nodes.
    #[serde(default)]
    pub scheme: Scheme,
    /// Host header sent upstream.
    #[serde(default)]
    pub pass_host: PassHost,
    /// Host header when `pass_host` is `rewrite`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-zA-Z-._\[\]:]+$"))]
    pub upstream_host: Option<String>,
    /// Connection pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive_pool: Option<KeepalivePool>,
    /// TLS to the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// Parses a node map key: `host`, `host:port`, `[v6]` or `[v6]:port`.
/// A node's host: an IPv6 address (it has a `:`), or a name or IPv4 address of letters, digits,
/// `-`, `.` and `_` (APISIX's node host pattern, without its `[`/`]`, which only bracket IPv6).
/// A space, `/` or `@` never names a host: such a node would only fail to resolve, for ever.
pub fn valid_host(host: &str) -> bool {
    if host.contains(':') {
        return host.parse::<std::net::Ipv6Addr>().is_ok();
    }
    !host.is_empty() && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

pub fn parse_node_key(key: &str) -> Result<(String, Option<u16>), String> {
    let bad_port = |p: &str| format!("invalid port `{p}` in node `{key}`");
    let (host, port) = if let Some(rest) = key.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(|| format!("unclosed `[` in node `{key}`"))?;
        if h.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("`[{h}]` in node `{key}` is not an IPv6 address"));
        }
        match after.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if after.is_empty() => (h, None),
            None => return Err(format!("unexpected `{after}` after `]` in node `{key}`")),
        }
    } else {
        match key.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (key, None),
        }
    };
    if host.is_empty() {
        return Err(format!("empty host in node `{key}`"));
    }
    if !valid_host(host) {
        return Err(format!("`{host}` in node `{key}` is not a host name or IP address"));
    }
    let port = match port {
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(bad_port(p)),
            Ok(n) => Some(n),
        },
        None => None,
    };
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_keys_name_a_host_and_maybe_a_port() {
        assert_eq!(parse_node_key("a.example:8080"), Ok(("a.example".to_owned(), Some(8080))));
        assert_eq!(parse_node_key("_srv.x-1.example"), Ok(("_srv.x-1.example".to_owned(), None)));
        assert_eq!(parse_node_key("[::1]:80"), Ok(("::1".to_owned(), Some(80))));
        assert_eq!(parse_node_key("127.0.0.1"), Ok(("127.0.0.1".to_owned(), None)));
        for bad in ["bad host:80", "a/b:80", "user@a:80", "[::g]:80", "[zz]", ":80", "a:0", "a:x", "a:65536"] {
            assert!(parse_node_key(bad).is_err(), "{bad}");
        }
    }
}
