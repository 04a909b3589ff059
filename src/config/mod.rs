//! `conf/config.yaml`: the process configuration (listeners, control server, enabled plugins,
//! plugin attributes, where resources come from). Parsed, validated against the schema derived
//! from these types, then checked for the rules a schema cannot express (loopback-only control
//! listener, port conflicts, plugin names).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ConfigError;
use crate::plugins::Catalog;
use crate::validate::{did_you_mean, CompiledSchema, Issue};

/// The whole of config.yaml.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listeners and process settings.
    #[serde(default)]
    pub gateway: GatewaySection,
    /// Enabled HTTP plugins; absent means every plugin compiled into this binary.
    #[serde(default)]
    pub plugins: Option<Vec<String>>,
    /// Enabled stream plugins; absent means every stream plugin compiled into this binary.
    #[serde(default)]
    pub stream_plugins: Option<Vec<String>>,
    /// Process-level settings of plugins, keyed by plugin name.
    #[serde(default)]
    pub plugin_attr: BTreeMap<String, Value>,
    /// Where resources come from.
    #[serde(default)]
    pub deployment: Deployment,
}

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
}

impl Default for SslSection {
    fn default() -> Self {
        SslSection { enable: true, listen: default_ssl_listen(), fallback_sni: None }
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
        }
    }
}

fn default_node_listen() -> Vec<Listen> {
    vec![Listen::Port(9080)]
}
fn yes() -> bool {
    true
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

fn loopback() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
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

/// `deployment:` section.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Deployment {
    /// Source of resources; `yaml` reads `conf/resources.yaml`.
    #[serde(default)]
    pub config_provider: ConfigProvider,
    /// Key prefix of resources (health-check names are `<prefix>/<kind>/<id>`).
    #[serde(default = "default_prefix")]
    #[schemars(regex(pattern = r"^/[A-Za-z0-9_./-]*$"))]
    pub prefix: String,
    /// The etcd cluster (`config_provider: etcd`).
    #[serde(default)]
    pub etcd: EtcdSection,
    /// The Admin API (with the etcd provider).
    #[serde(default)]
    pub admin: AdminSection,
}

/// `deployment.admin:` (APISIX keys).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// Whether the Admin API runs (default: with the etcd provider). It writes to etcd, so it
    /// cannot run with the yaml provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_admin: Option<bool>,
    /// Where it listens.
    #[serde(default = "default_admin_listen")]
    pub admin_listen: AdminListen,
    /// API keys (`X-API-KEY`): `admin` may write, `viewer` may only read.
    #[serde(default)]
    pub admin_key: Vec<AdminKey>,
    /// Client addresses allowed (IPs or CIDRs; default loopback only).
    #[serde(default = "default_allow_admin")]
    pub allow_admin: Vec<String>,
}

impl Default for AdminSection {
    fn default() -> Self {
        AdminSection {
            enable_admin: None,
            admin_listen: default_admin_listen(),
            admin_key: Vec::new(),
            allow_admin: default_allow_admin(),
        }
    }
}

/// `deployment.admin.admin_listen`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminListen {
    /// Address (default 127.0.0.1).
    #[serde(default = "loopback")]
    pub ip: IpAddr,
    /// Port (default 9180).
    #[serde(default = "admin_port")]
    #[schemars(range(min = 1))]
    pub port: u16,
}

/// One Admin API key.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminKey {
    /// Who holds it (for logs).
    #[schemars(length(min = 1))]
    pub name: String,
    /// The key clients send in `X-API-KEY`.
    pub key: String,
    /// What it may do.
    pub role: AdminRole,
}

/// `admin_key[].role`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AdminRole {
    // Read and write.
    Admin,
    // Read only.
    Viewer,
}

/// The key the documentation shows: refused when the Admin API listens beyond loopback.
pub const EXAMPLE_ADMIN_KEY: &str = "weir-example-admin-key";

fn default_admin_listen() -> AdminListen {
    AdminListen { ip: loopback(), port: admin_port() }
}
fn admin_port() -> u16 {
    9180
}
fn default_allow_admin() -> Vec<String> {
    vec!["127.0.0.0/8".into(), "::1".into()]
}

impl Config {
    /// Whether the Admin API runs.
    pub fn admin_enabled(&self) -> bool {
        self.deployment.admin.enable_admin.unwrap_or(self.deployment.config_provider == ConfigProvider::Etcd)
    }
}

impl Default for Deployment {
    fn default() -> Self {
        Deployment {
            config_provider: ConfigProvider::Yaml,
            prefix: default_prefix(),
            etcd: EtcdSection::default(),
            admin: AdminSection::default(),
        }
    }
}

/// `deployment.etcd:` (APISIX keys).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EtcdSection {
    /// Endpoints, e.g. `http://127.0.0.1:2379`.
    #[serde(default = "default_etcd_host")]
    #[schemars(length(min = 1), inner(regex(pattern = r"^https?://")))]
    pub host: Vec<String>,
    /// Seconds for connecting and for each request.
    #[serde(default = "default_etcd_timeout")]
    #[schemars(range(min = 0.1, max = 600.0))]
    pub timeout: f64,
    /// User of etcd's authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Password of `user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// TLS to etcd (for `https://` hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<EtcdTls>,
}

impl Default for EtcdSection {
    fn default() -> Self {
        EtcdSection {
            host: default_etcd_host(),
            timeout: default_etcd_timeout(),
            user: None,
            password: None,
            tls: None,
        }
    }
}

/// `deployment.etcd.tls:` (APISIX keys, plus `ca`). Relative paths are under the prefix directory.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EtcdTls {
    /// Client certificate (PEM) for etcd's `--client-cert-auth`; with `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub cert: Option<String>,
    /// Private key (PEM) of `cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub key: Option<String>,
    /// CA certificates (PEM) that sign etcd's server certificate; default: the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub ca: Option<String>,
    /// Verify etcd's certificate. Only `true` is accepted: give `ca` for a private CA.
    #[serde(default = "yes")]
    pub verify: bool,
    /// Host name to verify etcd's certificate against (default: the host of each endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub sni: Option<String>,
}

fn default_etcd_host() -> Vec<String> {
    vec!["http://127.0.0.1:2379".into()]
}
fn default_etcd_timeout() -> f64 {
    30.0
}

fn default_prefix() -> String {
    "/weir".into()
}

/// Resource providers.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ConfigProvider {
    // Resources from `conf/resources.yaml`, watched for changes.
    #[default]
    Yaml,
    // Resources from etcd (`deployment.etcd`), watched for changes.
    Etcd,
}

/// Paths of one Weir installation.
#[derive(Debug, Clone)]
pub struct Prefix {
    /// The prefix directory (`-p`).
    pub dir: PathBuf,
}

impl Prefix {
    /// A prefix directory.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Prefix { dir: dir.into() }
    }
    /// `conf/config.yaml`.
    pub fn config_file(&self) -> PathBuf {
        self.dir.join("conf").join("config.yaml")
    }
    /// `conf/resources.yaml`.
    pub fn resources_file(&self) -> PathBuf {
        self.dir.join("conf").join("resources.yaml")
    }
    /// `data/`, where plugins keep durable state.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }
}

/// Reads a YAML file into a JSON value; a missing file is `None`, an empty one is `{}`.
pub fn read_yaml(path: &Path) -> Result<Option<Value>, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ConfigError::one(path, "", format!("cannot read: {e}"))),
    };
    parse_yaml(path, &text).map(Some)
}

/// Parses YAML text into a JSON value (an empty document is `{}`).
pub fn parse_yaml(path: &Path, text: &str) -> Result<Value, ConfigError> {
    match serde_yaml::from_str::<Value>(text) {
        Ok(Value::Null) => Ok(Value::Object(Default::default())),
        Ok(v) => Ok(v),
        Err(e) => {
            let at = e.location().map(|l| format!("line {}, column {}", l.line(), l.column())).unwrap_or_default();
            Err(ConfigError::one(path, at, format!("invalid YAML: {e}")))
        }
    }
}

impl Config {
    /// The JSON Schema of config.yaml.
    pub fn schema() -> Value {
        weir_plugin::schema_of::<Config>()
    }

    /// Loads and checks `conf/config.yaml` of `prefix` (missing file: all defaults).
    pub fn load(prefix: &Prefix, catalog: &Catalog) -> Result<Config, ConfigError> {
        let path = prefix.config_file();
        let raw = read_yaml(&path)?.unwrap_or_else(|| Value::Object(Default::default()));
        let mut config = Self::from_value(&path, &raw, catalog)?;
        let issues = config.load_etcd_tls(&prefix.dir);
        if issues.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::new(&path, issues))
        }
    }

    /// Validates and checks a parsed config document.
    pub fn from_value(path: &Path, raw: &Value, catalog: &Catalog) -> Result<Config, ConfigError> {
        let schema = CompiledSchema::new(Self::schema()).map_err(|e| ConfigError::one(path, "", e))?;
        schema.check(raw).map_err(|issues| ConfigError::new(path, issues))?;
        let config: Config =
            serde_json::from_value(raw.clone()).map_err(|e| ConfigError::one(path, "", e.to_string()))?;
        let issues = config.check(catalog);
        if issues.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::new(path, issues))
        }
    }

    /// `deployment.etcd.tls` against the hosts it applies to.
    fn check_etcd_tls(&self, issues: &mut Vec<Issue>) {
        let etcd = &self.deployment.etcd;
        let Some(tls) = &etcd.tls else { return };
        if !tls.verify {
            issues.push(Issue::new(
                "deployment.etcd.tls.verify",
                "not verifying etcd's certificate would let anyone on the path serve this gateway's resources; give the CA that signs it in deployment.etcd.tls.ca instead",
            ));
        }
        if tls.cert.is_some() != tls.key.is_some() {
            let missing = if tls.cert.is_some() { "key" } else { "cert" };
            issues.push(Issue::new(
                format!("deployment.etcd.tls.{missing}"),
                "a client certificate needs both `cert` and `key`",
            ));
        }
        for (i, h) in etcd.host.iter().enumerate() {
            if !h.starts_with("https://") {
                issues.push(Issue::new(
                    format!("deployment.etcd.host[{i}]"),
                    format!("`{h}` is plain http but deployment.etcd.tls is set: use https:// endpoints"),
                ));
            }
        }
    }

    /// Makes `deployment.etcd.tls` paths absolute (relative ones are under `dir`) and checks that
    /// each names a readable PEM file of the right kind.
    fn load_etcd_tls(&mut self, dir: &Path) -> Vec<Issue> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut issues = Vec::new();
        let Some(tls) = &mut self.deployment.etcd.tls else { return issues };
        for (name, path) in [("cert", &mut tls.cert), ("key", &mut tls.key), ("ca", &mut tls.ca)] {
            let Some(p) = path else { continue };
            let abs = dir.join(&*p);
            *p = abs.to_string_lossy().into_owned();
            let key = format!("deployment.etcd.tls.{name}");
            let pem = match std::fs::read(&abs) {
                Ok(b) => b,
                Err(e) => {
                    issues.push(Issue::new(key, format!("cannot read {}: {e}", abs.display())));
                    continue;
                }
            };
            let ok = if name == "key" {
                PrivateKeyDer::from_pem_slice(&pem).is_ok()
            } else {
                CertificateDer::pem_slice_iter(&pem).next().is_some_and(|c| c.is_ok())
            };
            if !ok {
                let what = if name == "key" { "a PEM private key" } else { "PEM certificates" };
                issues.push(Issue::new(key, format!("{} does not hold {what}", abs.display())));
            }
        }
        issues
    }

    /// Rules the schema cannot express.
    fn check(&self, catalog: &Catalog) -> Vec<Issue> {
        let mut issues = Vec::new();
        if let Some(log) = &self.gateway.access_log {
            if let Err(e) = crate::access_log::Format::parse(&log.format) {
                issues.push(Issue::new("gateway.access_log.format", e));
            }
        }
        let control = &self.gateway.control;
        if !control.ip.is_loopback() {
            issues.push(Issue::new(
                "gateway.control.ip",
                format!(
                    "{} is not a loopback address; the control server may only listen on 127.0.0.0/8 or ::1",
                    control.ip
                ),
            ));
        }
        if self.gateway.enable_control && self.gateway.node_listen.iter().any(|l| l.addr().port() == control.port) {
            issues.push(Issue::new(
                "gateway.control.port",
                format!("control port {} conflicts with node_listen", control.port),
            ));
        }
        let ssl = &self.gateway.ssl;
        if self.gateway.enable_control && ssl.enable && ssl.listen.iter().any(|l| l.addr().port() == control.port) {
            issues.push(Issue::new(
                "gateway.control.port",
                format!("control port {} conflicts with gateway.ssl.listen", control.port),
            ));
        }
        let mut seen = Vec::new();
        let ssl_listen = if ssl.enable { &ssl.listen[..] } else { &[] };
        let all = self.gateway.node_listen.iter().map(|l| ("gateway.node_listen", l)).enumerate();
        let all = all.chain(ssl_listen.iter().map(|l| ("gateway.ssl.listen", l)).enumerate());
        let all = all.map(|(i, (key, l))| (i, key, l.addr()));
        let tcp: &[StreamListen] = self.gateway.stream_proxy.as_ref().map_or(&[], |s| &s.tcp[..]);
        let all = all.chain(tcp.iter().enumerate().map(|(i, l)| (i, "gateway.stream_proxy.tcp", l.addr())));
        let all: Vec<(usize, &str, SocketAddr)> = all.collect();
        if self.gateway.enable_control && tcp.iter().any(|l| l.addr().port() == control.port) {
            issues.push(Issue::new(
                "gateway.control.port",
                format!("control port {} conflicts with gateway.stream_proxy.tcp", control.port),
            ));
        }
        let mut udp_seen: Vec<SocketAddr> = Vec::new();
        for (i, l) in self.gateway.stream_proxy.iter().flat_map(|s| s.udp.iter()).enumerate() {
            if udp_seen.contains(&l.addr()) {
                issues.push(Issue::new(
                    format!("gateway.stream_proxy.udp[{i}]"),
                    format!("{} is listed twice", l.addr()),
                ));
            }
            udp_seen.push(l.addr());
        }
        for (i, key, addr) in all {
            let clash = seen.iter().any(|s: &SocketAddr| {
                s.port() == addr.port() && (*s == addr || s.ip().is_unspecified() || addr.ip().is_unspecified())
            });
            if clash {
                issues.push(Issue::new(format!("{key}[{i}]"), format!("{addr} is already a listener")));
            }
            seen.push(addr);
        }
        self.check_etcd_tls(&mut issues);
        let admin = &self.deployment.admin;
        if admin.enable_admin == Some(true) && self.deployment.config_provider == ConfigProvider::Yaml {
            issues.push(Issue::new(
                "deployment.admin.enable_admin",
                "the Admin API writes resources to etcd: it needs deployment.config_provider: etcd (with the yaml provider, edit conf/resources.yaml)",
            ));
        }
        if self.admin_enabled() {
            if admin.admin_key.is_empty() {
                issues.push(Issue::new(
                    "deployment.admin.admin_key",
                    "the Admin API needs at least one key (`{name, key, role: admin}`)",
                ));
            }
            for (i, k) in admin.admin_key.iter().enumerate() {
                if k.key.trim().is_empty() {
                    issues.push(Issue::new(
                        format!("deployment.admin.admin_key[{i}].key"),
                        "an admin key may not be empty",
                    ));
                } else if k.key == EXAMPLE_ADMIN_KEY && !admin.admin_listen.ip.is_loopback() {
                    issues.push(Issue::new(
                        format!("deployment.admin.admin_key[{i}].key"),
                        "this is the documented example key; choose your own before listening beyond loopback",
                    ));
                }
            }
            for (i, c) in admin.allow_admin.iter().enumerate() {
                if let Err(e) = weir_plugin::cidr::Cidr::parse(c) {
                    issues.push(Issue::new(format!("deployment.admin.allow_admin[{i}]"), e));
                }
            }
            let port = admin.admin_listen.port;
            let taken = self.gateway.node_listen.iter().any(|l| l.addr().port() == port)
                || (self.gateway.enable_control && control.port == port)
                || (ssl.enable && ssl.listen.iter().any(|l| l.addr().port() == port));
            if taken {
                issues.push(Issue::new(
                    "deployment.admin.admin_listen.port",
                    format!("port {port} is already a listener"),
                ));
            }
        }
        let names = catalog.names();
        if let Some(plugins) = &self.plugins {
            for (i, name) in plugins.iter().enumerate() {
                if catalog.get(name).is_none() {
                    let why = if catalog.stream_get(name).is_some() {
                        format!("`{name}` is a stream plugin: list it under `stream_plugins`")
                    } else {
                        unknown_plugin(name, &names)
                    };
                    issues.push(Issue::new(format!("plugins[{i}]"), why));
                } else if plugins[..i].contains(name) {
                    issues.push(Issue::new(format!("plugins[{i}]"), format!("plugin `{name}` is listed twice")));
                }
            }
        }
        let stream_names = catalog.stream_names();
        for (i, name) in self.stream_plugins.iter().flatten().enumerate() {
            let at = format!("stream_plugins[{i}]");
            if catalog.stream_get(name).is_some() {
                if self.stream_plugins.iter().flatten().take(i).any(|n| n == name) {
                    issues.push(Issue::new(at, format!("stream plugin `{name}` is listed twice")));
                }
            } else if catalog.get(name).is_some() {
                issues.push(Issue::new(at, format!("`{name}` is an HTTP plugin: list it under `plugins`")));
            } else if stream_names.is_empty() {
                issues
                    .push(Issue::new(at, format!("unknown stream plugin `{name}`: this build has no stream plugins")));
            } else {
                let why = match did_you_mean(name, &stream_names) {
                    Some(s) => format!("unknown stream plugin `{name}` (did you mean `{s}`?)"),
                    None => format!(
                        "unknown stream plugin `{name}`; compiled into this binary: {}",
                        stream_names.join(", ")
                    ),
                };
                issues.push(Issue::new(at, why));
            }
        }
        for (name, attr) in &self.plugin_attr {
            let path = format!("plugin_attr.{name}");
            match catalog.get(name) {
                None => issues.push(Issue::new(path, unknown_plugin(name, &names))),
                Some(entry) => match &entry.attr_schema {
                    None => issues.push(Issue::new(path, format!("plugin `{name}` takes no plugin_attr"))),
                    Some(schema) => {
                        if let Err(found) = schema.check(attr) {
                            issues.extend(found.into_iter().map(|i| i.under(&path)));
                        }
                    }
                },
            }
        }
        issues
    }

    /// Names of the enabled HTTP plugins: the `plugins:` list, or every compiled-in plugin.
    pub fn enabled_plugin_names(&self, catalog: &Catalog) -> Vec<String> {
        match &self.plugins {
            Some(list) => list.clone(),
            None => catalog.names(),
        }
    }

    /// Names of the enabled stream plugins: the `stream_plugins:` list, or every compiled-in one.
    pub fn enabled_stream_names(&self, catalog: &Catalog) -> Vec<String> {
        match &self.stream_plugins {
            Some(list) => list.clone(),
            None => catalog.stream_names(),
        }
    }
}

/// "unknown plugin" with a suggestion and the list of what is compiled in.
pub fn unknown_plugin(name: &str, known: &[String]) -> String {
    match did_you_mean(name, known) {
        Some(s) => format!("unknown plugin `{name}` (did you mean `{s}`?)"),
        None => format!("unknown plugin `{name}`; compiled into this binary: {}", known.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(raw: Value) -> Result<Config, String> {
        Config::from_value(Path::new("conf/config.yaml"), &raw, &Catalog::empty()).map_err(|e| e.to_string())
    }

    #[test]
    fn empty_document_is_all_defaults() {
        let c = check(json!({})).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.gateway.node_listen, vec![Listen::Port(9080)]);
        assert_eq!(c.gateway.control.port, 9090);
        assert!(c.gateway.enable_control);
        assert_eq!(c.deployment.prefix, "/weir");
        assert!(c.gateway.worker_processes.count() >= 1);
    }

    #[test]
    fn non_loopback_control_ip_is_refused() {
        let e = check(json!({"gateway": {"control": {"ip": "0.0.0.0"}}})).unwrap_err();
        assert!(e.contains("gateway.control.ip: 0.0.0.0 is not a loopback address"), "{e}");
        assert!(check(json!({"gateway": {"control": {"ip": "127.0.0.2"}}})).is_ok());
        assert!(check(json!({"gateway": {"control": {"ip": "::1"}}})).is_ok());
    }

    #[test]
    fn control_port_conflicting_with_node_listen_is_refused() {
        let e = check(json!({"gateway": {"node_listen": [9080, {"ip": "127.0.0.1", "port": 9090}]}})).unwrap_err();
        assert!(e.contains("control port 9090 conflicts with node_listen"), "{e}");
        assert!(check(json!({"gateway": {"enable_control": false, "node_listen": [9090]}})).is_ok());
    }

    #[test]
    fn unknown_keys_are_named_with_a_suggestion() {
        let e = check(json!({"gateway": {"control": {"prot": 1}}})).unwrap_err();
        assert!(e.contains("conf/config.yaml: gateway.control.prot: unknown key (did you mean `port`?)"), "{e}");
        let e = check(json!({"pluginz": []})).unwrap_err();
        assert!(e.contains("pluginz: unknown key (did you mean `plugins`?)"), "{e}");
    }

    #[test]
    fn router_and_worker_values_are_checked() {
        assert!(check(json!({"gateway": {"control": {"router": "radixtree_uri_with_parameter"}}})).is_ok());
        let e = check(json!({"gateway": {"control": {"router": "radix"}}})).unwrap_err();
        assert!(e.contains("gateway.control.router"), "{e}");
        assert!(check(json!({"gateway": {"worker_processes": 2}})).is_ok());
        assert!(check(json!({"gateway": {"worker_processes": 0}})).is_err());
        assert!(check(json!({"gateway": {"worker_processes": "many"}})).is_err());
    }

    #[test]
    fn unknown_plugins_are_refused() {
        let e = check(json!({"plugins": ["nope"]})).unwrap_err();
        assert!(e.contains("plugins[0]: unknown plugin `nope`"), "{e}");
        let e = check(json!({"plugin_attr": {"nope": {}}})).unwrap_err();
        assert!(e.contains("plugin_attr.nope: unknown plugin"), "{e}");
        let e = check(json!({"stream_plugins": ["mqtt-proxy"]})).unwrap_err();
        assert!(e.contains("stream_plugins[0]"), "{e}");
    }

    #[test]
    fn admin_api_rules() {
        let e = check(json!({"deployment": {"admin": {"enable_admin": true}}})).unwrap_err();
        assert!(e.contains("deployment.admin.enable_admin: the Admin API writes resources to etcd"), "{e}");
        let e = check(json!({"deployment": {"config_provider": "etcd"}})).unwrap_err();
        assert!(e.contains("deployment.admin.admin_key: the Admin API needs at least one key"), "{e}");
        let key = |k: &str, ip: &str| {
            json!({"deployment": {"config_provider": "etcd", "admin": {
                "admin_listen": {"ip": ip, "port": 9180},
                "admin_key": [{"name": "a", "key": k, "role": "admin"}]}}})
        };
        assert!(check(key("s3cret", "127.0.0.1")).is_ok());
        assert!(check(key(EXAMPLE_ADMIN_KEY, "127.0.0.1")).is_ok());
        let e = check(key(EXAMPLE_ADMIN_KEY, "0.0.0.0")).unwrap_err();
        assert!(e.contains("admin_key[0].key: this is the documented example key"), "{e}");
        let e = check(key(" ", "127.0.0.1")).unwrap_err();
        assert!(e.contains("admin_key[0].key: an admin key may not be empty"), "{e}");
        // Without the Admin API the etcd provider needs no key.
        assert!(check(json!({"deployment": {"config_provider": "etcd", "admin": {"enable_admin": false}}})).is_ok());
    }

    #[test]
    fn yaml_errors_carry_the_location() {
        let e = parse_yaml(Path::new("c.yaml"), "gateway:\n  control: [\n").unwrap_err().to_string();
        assert!(e.starts_with("c.yaml: line "), "{e}");
    }
}
