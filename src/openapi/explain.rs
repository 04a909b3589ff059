//! The bodies of `POST /v1/explain`: what a caller asks about (a request, or a stream
//! connection) and the explanation the control server answers. Typed, so that the OpenAPI
//! document and the handler cannot drift.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `POST /v1/explain`: an HTTP request as a client would send it, or (with `stream`) a stream
/// connection. Nothing is sent anywhere: the request is matched against the loaded resources.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExplainRequest {
    /// The method (default `GET`).
    #[serde(default)]
    pub method: Option<String>,
    /// The request target as the client sends it: a path, with a query if any (`/a/b?x=1`).
    /// It is normalized exactly as the data plane does. Required for HTTP.
    #[serde(default)]
    pub uri: Option<String>,
    /// The Host (default: the `host` header, else none). A port is ignored, as in routing.
    #[serde(default)]
    pub host: Option<String>,
    /// Request headers: name to a value, or to a list of values.
    #[serde(default)]
    pub headers: BTreeMap<String, HeaderValues>,
    /// The client's address as the data plane sees it (after `gateway.real_ip`); default
    /// `127.0.0.1`.
    #[serde(default)]
    pub client_ip: Option<String>,
    /// Explain a stream (TCP/UDP) connection instead of an HTTP request; the other fields must
    /// then be absent.
    #[serde(default)]
    pub stream: Option<StreamExplainRequest>,
}

/// One header's value or values.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum HeaderValues {
    /// One value.
    One(String),
    /// Several values (the header repeated).
    Many(Vec<String>),
}

/// A stream connection to explain.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamExplainRequest {
    /// The listener address the connection arrives on (default `127.0.0.1`).
    #[serde(default)]
    pub server_addr: Option<String>,
    /// The listener port the connection arrives on.
    pub server_port: u16,
    /// The client's address (default `127.0.0.1`).
    #[serde(default)]
    pub client_ip: Option<String>,
    /// The SNI of the TLS ClientHello, if the client sends one.
    #[serde(default)]
    pub sni: Option<String>,
}

/// The answer of `POST /v1/explain`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Explanation {
    /// `http` or `stream`.
    pub kind: &'static str,
    /// What the data plane would do, in one sentence, and by whom the answer would be made.
    pub verdict: Verdict,
    /// The request as the data plane sees it (path normalized, host without port).
    pub request: ExplainedRequest,
    /// The route that takes the request, and why (`null`: none).
    pub route: Option<MatchedRoute>,
    /// Every route whose URI (stream: every stream route) matched, in the order the data plane
    /// considers them, with why each one that does not take the request does not.
    pub candidates: Vec<CandidateReport>,
    /// Routes loaded in all (those not listed do not match the path at all).
    pub routes_total: usize,
    /// The plugins that would run, in run order (global rules first, then the route's merged
    /// chain), each with its priority and the resource it comes from.
    pub plugins: Vec<PluginStep>,
    /// Who the consumer would be (auth plugins identify it while the request runs).
    pub consumer: ConsumerReport,
    /// Where the request would go (`null`: no upstream).
    pub upstream: Option<UpstreamReport>,
    /// The upstream timeouts in force (`null`: no upstream).
    pub timeouts: Option<TimeoutsReport>,
    /// Anything else worth knowing.
    pub notes: Vec<String>,
    /// Microseconds the explanation took.
    pub took_us: u64,
}

/// The outcome in short.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Verdict {
    /// The status the client would get when it is known without contacting the upstream
    /// (`null`: the upstream's answer).
    pub status: Option<u16>,
    /// `gateway` (the gateway answers itself: 400, 404, 503), `plugin` (a plugin answers),
    /// `upstream` (proxied) or `closed` (a stream connection no route takes).
    pub by: &'static str,
    /// One sentence.
    pub summary: String,
}

/// The request as routed.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ExplainedRequest {
    /// The method.
    pub method: String,
    /// The path as given.
    pub raw_path: String,
    /// The path after normalization (`null` when the data plane refuses it).
    pub path: Option<String>,
    /// Why the path is refused (the data plane answers 400), if it is.
    pub path_error: Option<String>,
    /// The query string.
    pub query: String,
    /// The host routes are matched against.
    pub host: String,
    /// The client address.
    pub client_ip: String,
    /// Stream: the listener address and port.
    pub server: Option<String>,
    /// Stream: the SNI.
    pub sni: Option<String>,
}

/// The route that takes the request.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MatchedRoute {
    /// Its id.
    pub id: String,
    /// Its name, if any.
    pub name: Option<String>,
    /// `exact`, `parameter` or `prefix` (HTTP); `stream` for a stream route.
    pub table: &'static str,
    /// The URI pattern that matched (HTTP).
    pub uri: Option<String>,
    /// Its priority.
    pub priority: i64,
    /// Path parameters.
    pub params: BTreeMap<String, String>,
    /// Its service, if any.
    pub service_id: Option<String>,
    /// Why it wins.
    pub why: String,
}

/// A route that was considered.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CandidateReport {
    /// Its id.
    pub id: String,
    /// `exact`, `parameter`, `prefix`, or `stream`.
    pub table: &'static str,
    /// The URI pattern that matched the path (HTTP).
    pub uri: Option<String>,
    /// Its priority (HTTP).
    pub priority: i64,
    /// `matched` (it takes the request), `rejected` (a filter refuses it) or `outranked` (it
    /// accepts the request but another route wins).
    pub result: &'static str,
    /// The field that refused it (`methods`, `hosts`, `remote_addrs`, `vars`, `status`; stream:
    /// `server_addr`, `server_port`, `remote_addr`, `sni`).
    pub field: Option<&'static str>,
    /// Why, for a person.
    pub reason: String,
}

/// One plugin of the chain.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PluginStep {
    /// The plugin.
    pub name: String,
    /// Its priority on this resource (`_meta.priority`, else the plugin's).
    pub priority: i32,
    /// Where it comes from: `global_rule`, `service`, `plugin_config`, `route`, `consumer`
    /// (stream: `stream_route`).
    pub source: &'static str,
    /// The id of that resource (a consumer's username).
    pub source_id: String,
    /// Whether it runs for this request (`false`: its `_meta.filter` does not hold).
    pub runs: bool,
    /// Anything about it (what it would answer, why it is skipped).
    pub note: Option<String>,
}

/// Who the consumer would be.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ConsumerReport {
    /// `none` (no auth plugin on the chain), `identified`, `anonymous` (auth plugins let the
    /// request through without a consumer), `refused` (an auth plugin answers instead), or
    /// `runtime` (an auth plugin decides by a remote call; not run here).
    pub status: &'static str,
    /// The consumer's username, when identified.
    pub username: Option<String>,
    /// The auth plugin that decided.
    pub by: Option<String>,
    /// For a person.
    pub note: String,
}

/// Where the request goes.
#[derive(Debug, Serialize, JsonSchema)]
pub struct UpstreamReport {
    /// The resource owning it, as `routes/1`, `services/s` or `upstreams/u`.
    pub owner: String,
    /// `roundrobin`, `chash` or `least_conn`.
    pub balancer: &'static str,
    /// `http`, `https`, `grpc`, `grpcs` (stream: `tcp`/`udp` upstreams use the same nodes).
    pub scheme: String,
    /// Attempts after the first one.
    pub retries: usize,
    /// Seconds within which retries may start (`null`: no limit).
    pub retry_timeout: Option<f64>,
    /// `running` (a health checker judges the nodes), `not started` (configured, starts with
    /// the first request), `none` (no `checks`).
    pub checker: &'static str,
    /// Every node.
    pub nodes: Vec<NodeHealth>,
    /// The node the balancer would pick for a first attempt now (`null`: none can be picked).
    pub pick: Option<String>,
    /// Why that node.
    pub pick_note: String,
}

/// One node and its health.
#[derive(Debug, Serialize, JsonSchema)]
pub struct NodeHealth {
    /// `ip:port`.
    pub address: String,
    /// Its weight (0: never picked).
    pub weight: u32,
    /// `healthy`, `mostly_healthy`, `mostly_unhealthy`, `unhealthy`, or `unchecked`.
    pub health: &'static str,
}

/// Upstream timeouts, in seconds.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TimeoutsReport {
    /// Connecting (and the TLS handshake).
    pub connect: f64,
    /// Sending the request (HTTP).
    pub send: f64,
    /// Reading the response (HTTP); how long a stream connection may idle (stream).
    pub read: f64,
    /// `route` (the route's `timeout`), `upstream` (the upstream's `timeout`) or `default` (60 s).
    pub from: &'static str,
}
