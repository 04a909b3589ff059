//! The `deployment:` section of config.yaml: where resources come from (the yaml file or etcd,
//! the key prefix), the etcd cluster and its TLS, and the Admin API; with their defaults.

use std::net::IpAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{loopback, yes, Config};

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
