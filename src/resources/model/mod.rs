//! Resource types: routes, services, upstreams, consumers, global rules, plugin metadata.
//!
//! Shapes follow Apache APISIX's so that people coming from there feel at home. The JSON Schemas
//! reported under `main` of `/v1/schema` are derived from these types and validate resources.

use std::collections::BTreeMap;
use std::fmt;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// A resource id: an integer or a string in the file, always reported as a string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(pub String);

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Id(s)),
            Value::Number(n) => Ok(Id(n.to_string())),
            other => Err(serde::de::Error::custom(format!("id must be an integer or a string, got {other}"))),
        }
    }
}

impl JsonSchema for Id {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Id".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "integer, or string of 1-64 characters [a-zA-Z0-9-_.]",
            "anyOf": [
                {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[a-zA-Z0-9-_.]+$"},
                {"type": "integer", "minimum": 1}
            ]
        })
    }
}

/// Plugin configurations keyed by plugin name (each validated against that plugin's schema).
pub type PluginConfs = BTreeMap<String, Value>;

/// HTTP methods a route can match. The declaration order is the bit order of the router's method
/// mask: append new methods at the end.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms)]
pub enum HttpMethod {
    GET,
    POST,
    PUT,
    DELETE,
    PATCH,
    HEAD,
    OPTIONS,
    CONNECT,
    TRACE,
    PURGE,
}

// The document shape of a route (file, etcd, Admin API, `/v1/schema`); kept in memory as
// [`Route`]. Its doc comment below is the schema's description.
/// A route: which requests it matches, the plugins it runs, where it proxies.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Route")]
struct RouteDoc {
    /// Identity.
    id: Id,
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    name: Option<String>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    desc: Option<String>,
    /// Path to match: exact, trailing `*` for a prefix, `:name` or `{name}` segments as parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096), regex(pattern = "^/"))]
    uri: Option<String>,
    /// Several paths (any matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1), inner(length(min = 1, max = 4096), regex(pattern = "^/")))]
    uris: Option<Vec<String>>,
    /// Methods to match (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    methods: Option<Vec<HttpMethod>>,
    /// Host to match: exact, or `*.example.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\*?[0-9a-zA-Z-._\[\]:]+$"))]
    host: Option<String>,
    /// Several hosts (any matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1), inner(regex(pattern = r"^\*?[0-9a-zA-Z-._\[\]:]+$")))]
    hosts: Option<Vec<String>>,
    /// Client addresses to match: IPs or CIDRs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    remote_addrs: Option<Vec<String>>,
    /// Higher wins among routes matching one request.
    #[serde(default)]
    priority: i64,
    /// Plugins of this route.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    plugins: PluginConfs,
    /// Inline upstream (boxed: most routes name an upstream by id, and an inline `Upstream`
    /// is several hundred bytes that every route would otherwise carry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    upstream: Option<Box<Upstream>>,
    /// Reference to an upstream object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    upstream_id: Option<Id>,
    /// Reference to a service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    service_id: Option<Id>,
    /// 1 enabled, 0 disabled.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 1))]
    status: u8,
    /// Proxy `Upgrade: websocket` requests (HTTP/1.1); without it the upgrade is not performed
    /// and the request is proxied as plain HTTP.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    enable_websocket: bool,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
}

/// A route as kept in memory: what requests and the router read are fields; what most routes
/// leave out (names, labels, lists) sits behind one pointer, so that 10,000 routes cost 192
/// bytes each here rather than 384. Reads and writes the [`RouteDoc`] shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(from = "RouteDoc", into = "RouteDoc")]
pub struct Route {
    /// Identity.
    pub id: Id,
    /// Path to match (or `more.uris`).
    pub uri: Option<String>,
    /// Higher wins among routes matching one request.
    pub priority: i64,
    /// Plugins of this route.
    pub plugins: PluginConfs,
    /// Inline upstream.
    pub upstream: Option<Box<Upstream>>,
    /// Reference to an upstream object.
    pub upstream_id: Option<Id>,
    /// Reference to a service.
    pub service_id: Option<Id>,
    /// 1 enabled, 0 disabled.
    pub status: u8,
    /// Proxy `Upgrade: websocket` requests.
    pub enable_websocket: bool,
    /// The rarely set fields (`None` when all are absent).
    pub more: Option<Box<RouteMore>>,
}

/// The fields of a [`Route`] most routes leave out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteMore {
    pub name: Option<String>,
    pub desc: Option<String>,
    pub uris: Option<Vec<String>>,
    pub methods: Option<Vec<HttpMethod>>,
    pub host: Option<String>,
    pub hosts: Option<Vec<String>>,
    pub remote_addrs: Option<Vec<String>>,
    pub labels: BTreeMap<String, String>,
}

impl Route {
    /// The paths it matches: `uris` when present, else `uri`.
    pub fn uri_list(&self) -> &[String] {
        match (self.uris(), &self.uri) {
            (Some(list), _) => list,
            (None, Some(one)) => std::slice::from_ref(one),
            (None, None) => &[],
        }
    }
    /// Several paths (any matches).
    pub fn uris(&self) -> Option<&[String]> {
        self.more.as_ref()?.uris.as_deref()
    }
    /// Methods to match (all when absent).
    pub fn methods(&self) -> Option<&[HttpMethod]> {
        self.more.as_ref()?.methods.as_deref()
    }
    /// One host to match.
    pub fn host(&self) -> Option<&String> {
        self.more.as_ref()?.host.as_ref()
    }
    /// Several hosts (any matches).
    pub fn hosts(&self) -> Option<&[String]> {
        self.more.as_ref()?.hosts.as_deref()
    }
    /// Client addresses to match.
    pub fn remote_addrs(&self) -> Option<&[String]> {
        self.more.as_ref()?.remote_addrs.as_deref()
    }
}

impl From<RouteDoc> for Route {
    fn from(d: RouteDoc) -> Route {
        let more = RouteMore {
            name: d.name,
            desc: d.desc,
            uris: d.uris,
            methods: d.methods,
            host: d.host,
            hosts: d.hosts,
            remote_addrs: d.remote_addrs,
            labels: d.labels,
        };
        Route {
            id: d.id,
            uri: d.uri,
            priority: d.priority,
            plugins: d.plugins,
            upstream: d.upstream,
            upstream_id: d.upstream_id,
            service_id: d.service_id,
            status: d.status,
            enable_websocket: d.enable_websocket,
            more: (more != RouteMore::default()).then(|| Box::new(more)),
        }
    }
}

impl From<Route> for RouteDoc {
    fn from(r: Route) -> RouteDoc {
        let more = r.more.map(|m| *m).unwrap_or_default();
        RouteDoc {
            id: r.id,
            name: more.name,
            desc: more.desc,
            uri: r.uri,
            uris: more.uris,
            methods: more.methods,
            host: more.host,
            hosts: more.hosts,
            remote_addrs: more.remote_addrs,
            priority: r.priority,
            plugins: r.plugins,
            upstream: r.upstream,
            upstream_id: r.upstream_id,
            service_id: r.service_id,
            status: r.status,
            enable_websocket: r.enable_websocket,
            labels: more.labels,
        }
    }
}

impl JsonSchema for Route {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        RouteDoc::schema_name()
    }
    fn schema_id() -> std::borrow::Cow<'static, str> {
        RouteDoc::schema_id()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        RouteDoc::json_schema(g)
    }
}

fn one() -> u8 {
    1
}

/// A service: an upstream and plugins shared by several routes.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Service {
    /// Identity.
    pub id: Id,
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub name: Option<String>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub desc: Option<String>,
    /// Plugins shared by the service's routes (a route's own conf of the same plugin wins).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: PluginConfs,
    /// Inline upstream (boxed: most routes name an upstream by id, and an inline `Upstream`
    /// is several hundred bytes that every route would otherwise carry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Box<Upstream>>,
    /// Reference to an upstream object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_id: Option<Id>,
    /// Hosts the service's routes match when they name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub hosts: Option<Vec<String>>,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

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
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTls {
    /// Verify the upstream certificate (default true).
    #[serde(default = "yes")]
    pub verify: bool,
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

/// A consumer: an identity that authentication plugins map credentials to.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Consumer {
    /// Identity.
    #[schemars(length(min = 1, max = 100), regex(pattern = "^[a-zA-Z0-9_-]+$"))]
    pub username: String,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub desc: Option<String>,
    /// Plugins: credentials (validated against each plugin's consumer_schema).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: PluginConfs,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A global rule: plugins that run for every request.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobalRule {
    /// Identity.
    pub id: Id,
    /// Plugins.
    #[schemars(length(min = 1))]
    pub plugins: PluginConfs,
}

/// Plugin metadata: `id` is the plugin name; the other fields are the plugin's own.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PluginMetadata {
    /// The plugin name.
    #[schemars(length(min = 1))]
    pub id: String,
    /// The plugin's fields (validated against its metadata_schema).
    #[serde(flatten)]
    pub fields: serde_json::Map<String, Value>,
}

/// Parses a node map key: `host`, `host:port`, `[v6]` or `[v6]:port`.
pub fn parse_node_key(key: &str) -> Result<(String, Option<u16>), String> {
    let bad_port = |p: &str| format!("invalid port `{p}` in node `{key}`");
    let (host, port) = if let Some(rest) = key.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(|| format!("unclosed `[` in node `{key}`"))?;
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
    let port = match port {
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(bad_port(p)),
            Ok(n) => Some(n),
        },
        None => None,
    };
    Ok((host.to_owned(), port))
}

/// A server certificate for the TLS listener (APISIX `ssls`), chosen by the client's SNI.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Ssl {
    /// Identity.
    pub id: Id,
    /// Server names this certificate answers for: exact names, or `*.example.com` for any name
    /// ending in `.example.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub snis: Option<Vec<String>>,
    /// One server name (APISIX's older form of `snis`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// Certificate chain, PEM (the end-entity certificate first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// Private key of `cert`, PEM (PKCS#8, PKCS#1 or SEC1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `cert` from a file, relative to the prefix directory (watched for changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    /// `key` from a file, relative to the prefix directory (watched for changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    /// More certificates for the same names (for example ECDSA next to RSA); the handshake picks
    /// the first one the client can verify.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certs: Vec<String>,
    /// Keys of `certs`, in the same order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// `server` (the only kind: client certificates for upstream mTLS are not supported).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<SslType>,
    /// 1 enabled, 0 disabled.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 1))]
    pub status: u8,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// `ssls[].type`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SslType {
    // A server certificate.
    Server,
}

/// A stream route (APISIX `stream_routes`): which TCP connections or UDP sessions it takes, and
/// where they go.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamRoute {
    /// Identity.
    pub id: Id,
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub name: Option<String>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub desc: Option<String>,
    /// The listener address the connection arrived on (an IP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_addr: Option<String>,
    /// The listener port the connection arrived on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub server_port: Option<u16>,
    /// The client: an IP or a CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_addr: Option<String>,
    /// The TLS server name (TLS listeners only): exact, or `*.example.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// On a TLS listener: route on the SNI without terminating TLS (the upstream does).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls_passthrough: bool,
    /// Stream plugins of this route.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: PluginConfs,
    /// Inline upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Box<Upstream>>,
    /// Reference to an upstream object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_id: Option<Id>,
    /// Reference to a service (its upstream is used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_id: Option<Id>,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// Seconds of a (schema-checked) configuration value as a `Duration`; never panics, whatever
/// the float.
pub fn secs(s: f64) -> std::time::Duration {
    std::time::Duration::try_from_secs_f64(s.max(0.001)).unwrap_or(std::time::Duration::from_secs(31_536_000))
}

#[cfg(test)]
mod tests {
    use super::Route;
    use serde_json::json;

    #[test]
    fn a_route_reads_and_writes_its_document_shape() {
        let full = json!({
            "id": "r1", "name": "n", "desc": "d", "uris": ["/a", "/b/*"], "methods": ["GET", "POST"],
            "hosts": ["*.example.com"], "remote_addrs": ["10.0.0.0/8"], "priority": 3,
            "plugins": {"key-auth": {}}, "upstream_id": "u", "service_id": "s", "status": 0,
            "enable_websocket": true, "labels": {"team": "edge"}
        });
        let r: Route = serde_json::from_value(full.clone()).expect("full route");
        assert!(r.more.is_some());
        assert_eq!(r.uri_list(), ["/a", "/b/*"]);
        assert_eq!(serde_json::to_value(&r).expect("serialize"), full);

        let bare = json!({"id": "7", "uri": "/x", "upstream_id": "1"});
        let r: Route = serde_json::from_value(bare).expect("bare route");
        assert!(r.more.is_none(), "nothing rare set: no box");
        assert_eq!(r.uri_list(), ["/x"]);
        assert_eq!(
            serde_json::to_value(&r).expect("serialize"),
            json!({"id": "7", "uri": "/x", "upstream_id": "1", "priority": 0, "status": 1})
        );

        let e = serde_json::from_value::<Route>(json!({"id": 1, "uri": "/", "nope": 1})).expect_err("unknown key");
        assert!(e.to_string().contains("unknown field `nope`"), "{e}");
    }
}
