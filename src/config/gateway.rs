//! The `gateway:` section of config.yaml: data-plane, TLS and stream listeners, the control
//! server, the access and error logs, worker threads, path handling; with their defaults.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{loopback, yes};

/// `gateway:` section.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GatewaySection {
    /// Data-plane listeners: ports (on 0.0.0.0) or `{ip, port}`.
    #[serde(default = "default_node_listen")]
    #[schemars(length(min = 1))]
    pub node_listen: Vec<Listen>,
    /// Whether the control server runs.
    #[serde(default = "yes")]
    pub enable_control: bool,
    /// Control server listener.
    #[serde(default)]
    pub control: Control,
    /// Data-plane worker threads: `auto` (one per core) or a count.
    #[serde(default)]
    pub worker_processes: WorkerProcesses,
    /// Merge repeated slashes of request paths before routing and forwarding (nginx
    /// `merge_slashes`, default true).
    #[serde(default = "yes")]
    pub merge_slashes: bool,
    /// What to do with an encoded slash (`%2F`) in a request path: `keep` it encoded, as part of
    /// its segment (default), or `reject` the request with 400.
    #[serde(default)]
    pub escaped_slashes: EscapedSlashes,
    /// The TLS listener (certificates come from `ssls` resources).
    #[serde(default)]
    pub ssl: SslSection,
    /// TCP and UDP listeners of the stream proxy (`stream_routes`); off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_proxy: Option<StreamProxy>,
    /// The access log; off when absent (the shipped conf/config.yaml turns it on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log: Option<AccessLogSection>,
    /// Weir's own log; standard error when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_log: Option<ErrorLogSection>,
    /// Listeners whose clients speak the PROXY protocol (v1 or v2), as APISIX's
    /// `apisix.proxy_protocol`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocolSection>,
    /// The client's real address behind trusted proxies (nginx's realip); off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub real_ip: Option<RealIpSection>,
    /// Cache zones of the proxy-cache plugin (APISIX's `apisix.proxy_cache`); APISIX's two
    /// default zones when absent.
    #[serde(default)]
    pub proxy_cache: weir_plugin::cache_zones::ProxyCacheSection,
    /// Every response carries `X-Weir-Debug: route=<id>; plugins=<a,b>; node=<ip:port>` (a
    /// route alone: its label `debug_header: "true"`). Default false: it names internal nodes.
    #[serde(default)]
    pub debug_header: bool,
    /// `X-Weir-Upstream-Status` on every response the upstream produced, not only on 5xx ones
    /// (APISIX's `show_upstream_status_in_response_header`). Default false.
    #[serde(default)]
    pub show_upstream_status_in_response_header: bool,
    /// DNS servers for upstream host names and `discovery_type: dns` (`ip` or `ip:port`, port
    /// 53 by default); those of `/etc/resolv.conf` when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_resolver: Vec<String>,
    /// Seconds every DNS answer is used, whatever its TTL (APISIX's `dns_resolver_valid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub dns_resolver_valid: Option<u32>,
    /// The shortest a DNS answer is used before it is resolved again, in seconds (default 1).
    #[serde(default = "dns_min_ttl")]
    #[schemars(range(min = 1, max = 86400))]
    pub dns_min_ttl: u32,
    /// The longest, in seconds (default 3600).
    #[serde(default = "dns_max_ttl")]
    #[schemars(range(min = 1, max = 86400))]
    pub dns_max_ttl: u32,
    /// Seconds a stop (SIGTERM, or the old process of a binary upgrade) waits for in-flight
    /// requests and long-lived connections (WebSocket, gRPC streams, stream proxy) before it
    /// closes them (nginx's `worker_shutdown_timeout`; default 30).
    #[serde(default = "worker_shutdown_timeout")]
    #[schemars(range(min = 0, max = 86400))]
    pub worker_shutdown_timeout: u32,
    /// Seconds a request body may go without a byte from the client while the gateway reads it
    /// (a plugin asked for it, or it is small or chunked and read before the upstream is
    /// contacted): past it the request gets 408 and the connection closes (nginx's
    /// `client_body_timeout`; default 60).
    #[serde(default = "client_body_timeout")]
    #[schemars(range(min = 1, max = 3600))]
    pub client_body_timeout: u32,
    /// Defaults for `ssls[].acme` (directory, contact, challenge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acme: Option<SslAcme>,
}

fn worker_shutdown_timeout() -> u32 {
    30
}

fn client_body_timeout() -> u32 {
    60
}

fn dns_min_ttl() -> u32 {
    1
}
fn dns_max_ttl() -> u32 {
    3600
}

impl GatewaySection {
    /// `dns_resolver` as addresses (checked by the config rules; a bad entry is skipped here).
    pub fn dns_servers(&self) -> Vec<SocketAddr> {
        self.dns_resolver.iter().filter_map(|s| parse_dns_server(s).ok()).collect()
    }
}

/// A `dns_resolver` entry: `ip`, `ip:port` or `[v6]:port`.
pub fn parse_dns_server(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    text.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("`{text}` is not an IP address or ip:port"))
}

/// `gateway.proxy_protocol:` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxyProtocolSection {
    /// A further plain HTTP listener (on 0.0.0.0) whose connections open with a PROXY header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub listen_http_port: Option<u16>,
    /// A further TLS listener (on 0.0.0.0) whose connections open with a PROXY header (before
    /// the TLS handshake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub listen_https_port: Option<u16>,
    /// The stream proxy's TCP listeners expect a PROXY header.
    #[serde(default)]
    pub enable_tcp_pp: bool,
    /// The stream proxy sends a PROXY v1 header to its upstreams, naming the client.
    #[serde(default)]
    pub enable_tcp_pp_to_upstream: bool,
}

/// `gateway.real_ip:` section: which peers may name the client, and in which header.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RealIpSection {
    /// Peers (IPs or CIDRs) whose header is believed; nobody else's is.
    #[schemars(length(min = 1))]
    pub trusted_addresses: Vec<String>,
    /// The header naming the client: `X-Real-IP` (default, as nginx) or `X-Forwarded-For`.
    #[serde(default)]
    pub header: RealIpHeader,
    /// `X-Forwarded-For`: walk from the right past trusted addresses (default false: the last
    /// address), as nginx's `real_ip_recursive`.
    #[serde(default)]
    pub recursive: bool,
}

/// The header of `gateway.real_ip`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RealIpHeader {
    /// `X-Real-IP: 1.2.3.4`.
    #[default]
    #[serde(rename = "X-Real-IP")]
    XRealIp,
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[serde(rename = "X-Forwarded-For")]
    XForwardedFor,
}

/// `gateway.access_log:` section.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AccessLogSection {
    /// Whether the access log is written (default true once the section is present).
    #[serde(default = "yes")]
    pub enable: bool,
    /// The file, relative to the prefix directory unless absolute; reopened on SIGUSR1.
    #[serde(default = "default_access_log_path")]
    #[schemars(length(min = 1))]
    pub path: String,
    /// `combined` (nginx's), `json`, or a template of `$variables` and text.
    #[serde(default = "default_access_log_format")]
    #[schemars(length(min = 1))]
    pub format: String,
    /// Lines that may wait for the writer; when that many wait, further lines are dropped and
    /// counted (`access_log_dropped_total`) instead of slowing requests.
    #[serde(default = "default_access_log_buffer")]
    #[schemars(range(min = 1, max = 1048576))]
    pub buffer: usize,
}

fn default_access_log_path() -> String {
    "logs/access.log".into()
}
fn default_access_log_format() -> String {
    "combined".into()
}
fn default_access_log_buffer() -> usize {
    16384
}

/// `gateway.error_log:` section.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorLogSection {
    /// The file, relative to the prefix directory unless absolute; reopened on SIGUSR1.
    #[serde(default = "default_error_log_path")]
    #[schemars(length(min = 1))]
    pub path: String,
}

fn default_error_log_path() -> String {
    "logs/error.log".into()
}

/// `gateway.stream_proxy:` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamProxy {
    /// TCP listeners: ports (on 0.0.0.0) or `{ip, port, tls}`.
    #[serde(default)]
    pub tcp: Vec<StreamListen>,
    /// UDP listeners: ports (on 0.0.0.0) or `{ip, port}`.
    #[serde(default)]
    pub udp: Vec<Listen>,
}

/// One TCP listener of the stream proxy.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(untagged)]
pub enum StreamListen {
    /// A port on all IPv4 addresses.
    Port(#[schemars(range(min = 1))] u16),
    /// An explicit address.
    Addr(StreamListenAddr),
}

/// `{ip, port, tls}` stream listener.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StreamListenAddr {
    /// Address to bind (default 0.0.0.0).
    #[serde(default = "any_ip")]
    pub ip: IpAddr,
    /// Port.
    #[schemars(range(min = 1))]
    pub port: u16,
    /// Clients speak TLS: routes match on the SNI, and Weir terminates TLS with the `ssls`
    /// certificates unless the route sets `tls_passthrough`.
    #[serde(default)]
    pub tls: bool,
}

impl StreamListen {
    /// The socket address to bind.
    pub fn addr(&self) -> SocketAddr {
        match *self {
            StreamListen::Port(port) => SocketAddr::new(any_ip(), port),
            StreamListen::Addr(a) => SocketAddr::new(a.ip, a.port),
        }
    }
    /// Whether clients speak TLS.
    pub fn tls(&self) -> bool {
        matches!(self, StreamListen::Addr(a) if a.tls)
    }
}

/// `gateway.ssl:` section: where TLS is terminated.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SslSection {
    /// Whether the TLS listener runs (default true).
    #[serde(default = "yes")]
    pub enable: bool,
    /// TLS listeners: ports (on 0.0.0.0) or `{ip, port, enable_http2}`; HTTP/2 is offered by
    /// ALPN unless `enable_http2: false`.
    #[serde(default = "default_ssl_listen")]
    #[schemars(length(min = 1))]
    pub listen: Vec<Listen>,
    /// The SNI whose certificate is used when a client sends no SNI or one no `ssls` entry
    /// claims; without it such handshakes fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9.-]+$"))]
    pub fallback_sni: Option<String>,
    /// A PEM file of CA certificates trusted besides the system's, for the ACME directory's
    /// TLS (APISIX's key; relative to the prefix directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssl_trusted_certificate: Option<String>,
}

impl Default for SslSection {
    fn default() -> Self {
        SslSection { enable: true, listen: default_ssl_listen(), fallback_sni: None, ssl_trusted_certificate: None }
    }
}

fn default_ssl_listen() -> Vec<Listen> {
    vec![Listen::Port(9443)]
}

/// `gateway.escaped_slashes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EscapedSlashes {
    /// `%2F` stays encoded and is data inside its segment (for matching and forwarding).
    #[default]
    Keep,
    /// Requests whose path holds `%2F` answer 400.
    Reject,
}

impl Default for GatewaySection {
    fn default() -> Self {
        GatewaySection {
            node_listen: default_node_listen(),
            enable_control: true,
            control: Control::default(),
            worker_processes: WorkerProcesses::default(),
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::Keep,
            ssl: SslSection::default(),
            stream_proxy: None,
            access_log: None,
            error_log: None,
            proxy_protocol: None,
            real_ip: None,
            proxy_cache: Default::default(),
            debug_header: false,
            show_upstream_status_in_response_header: false,
            dns_resolver: Vec::new(),
            dns_resolver_valid: None,
            dns_min_ttl: dns_min_ttl(),
            dns_max_ttl: dns_max_ttl(),
            worker_shutdown_timeout: worker_shutdown_timeout(),
            client_body_timeout: client_body_timeout(),
            acme: None,
        }
    }
}

fn default_node_listen() -> Vec<Listen> {
    vec![Listen::Port(9080)]
}

/// One data-plane listener.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(untagged)]
pub enum Listen {
    /// A port on all IPv4 addresses.
    Port(#[schemars(range(min = 1))] u16),
    /// An explicit address.
    Addr(ListenAddr),
}

/// `{ip, port, enable_http2}` listener.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ListenAddr {
    /// Address to bind (default 0.0.0.0).
    #[serde(default = "any_ip")]
    pub ip: IpAddr,
    /// Port.
    #[schemars(range(min = 1))]
    pub port: u16,
    /// HTTP/2: on a plain listener, cleartext h2c with prior knowledge next to HTTP/1.1
    /// (default false); on a TLS listener, offered by ALPN (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_http2: Option<bool>,
    /// HTTP/3 over QUIC on the same port (UDP), advertised by `Alt-Svc`: TLS listeners only
    /// (default false, as APISIX's `gateway.ssl.listen[].enable_http3`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enable_http3: bool,
    /// HTTP/3: every new QUIC connection first proves its address with a Retry token (one more
    /// round trip; a defence against spoofed-source floods). Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quic_retry: bool,
}

fn any_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::UNSPECIFIED)
}

impl Listen {
    /// The socket address to bind.
    pub fn addr(&self) -> SocketAddr {
        match *self {
            Listen::Port(port) => SocketAddr::new(any_ip(), port),
            Listen::Addr(a) => SocketAddr::new(a.ip, a.port),
        }
    }
    /// Whether HTTP/3 is served on the same port (TLS listeners).
    pub fn http3(&self) -> bool {
        matches!(self, Listen::Addr(a) if a.enable_http3)
    }

    /// Whether new QUIC connections must answer a Retry first.
    pub fn quic_retry(&self) -> bool {
        matches!(self, Listen::Addr(a) if a.quic_retry)
    }

    /// Whether HTTP/2 is served, with `default` when the entry does not say.
    pub fn http2(&self, default: bool) -> bool {
        match *self {
            Listen::Port(_) => default,
            Listen::Addr(a) => a.enable_http2.unwrap_or(default),
        }
    }
}

/// `gateway.control:` section.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Control {
    /// Listen address; must be loopback (127.0.0.0/8 or ::1).
    #[serde(default = "loopback")]
    pub ip: IpAddr,
    /// Listen port.
    #[serde(default = "control_port")]
    #[schemars(range(min = 1))]
    pub port: u16,
    /// `radixtree_uri_with_parameter` enables `:name` parameters in plugin control URIs.
    #[serde(default)]
    pub router: Option<ControlRouter>,
}

impl Default for Control {
    fn default() -> Self {
        Control { ip: loopback(), port: control_port(), router: None }
    }
}

fn control_port() -> u16 {
    9090
}

/// Control router modes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ControlRouter {
    // `:name` segments of plugin control URIs capture one path segment.
    RadixtreeUriWithParameter,
}

/// `gateway.worker_processes`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(untagged)]
pub enum WorkerProcesses {
    /// One worker per core.
    Auto(AutoWord),
    /// A fixed count.
    Count(#[schemars(range(min = 1, max = 1024))] u16),
}

/// The word `auto`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
pub enum AutoWord {
    #[default]
    #[serde(rename = "auto")]
    Auto,
}

impl Default for WorkerProcesses {
    fn default() -> Self {
        WorkerProcesses::Auto(AutoWord::Auto)
    }
}

impl WorkerProcesses {
    /// The number of workers to run.
    pub fn count(&self) -> usize {
        match *self {
            WorkerProcesses::Count(n) => usize::from(n),
            WorkerProcesses::Auto(_) => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        }
    }
}

/// `ssls[].acme` (and `gateway.acme`, the defaults): what to order from which CA.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SslAcme {
    /// The names the certificate is for (default: the entry's `snis`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<String>,
    /// The account's contact address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// The CA's directory (`https://acme-v02.api.letsencrypt.org/directory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory_url: Option<String>,
    /// How the CA checks the names: `http-01` (on the data plane's port 80 listener) or
    /// `tls-alpn-01` (on the TLS listener); default `http-01`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<AcmeChallenge>,
    /// External account binding, for CAs that require one (ZeroSSL, Google).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eab: Option<AcmeEab>,
}

/// An ACME challenge type.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum AcmeChallenge {
    #[serde(rename = "http-01")]
    Http01,
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01,
}

/// ACME external account binding: the key id and the base64url HMAC key the CA gave.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AcmeEab {
    /// Key identifier.
    #[schemars(length(min = 1))]
    pub kid: String,
    /// HMAC key, base64url without padding.
    #[schemars(length(min = 1))]
    pub hmac_key: String,
}
