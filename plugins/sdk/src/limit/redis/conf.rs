//! The Redis fields of limiter configurations (APISIX's `redis-schema`: the same names and
//! defaults in limit-count, limit-req and limit-conn), and the target they name.

use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

/// Where a limiter keeps its counters (limit-req and limit-conn; limit-count adds
/// `redis-sentinel`).
#[derive(Debug, Clone, Copy, Default, serde::Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// In this process, shared by its workers.
    #[default]
    Local,
    /// In one Redis server, shared by every instance naming it.
    Redis,
    /// In a Redis Cluster, shared by every instance naming it.
    RedisCluster,
}

/// The Redis fields, flattened into a plugin's configuration (`#[serde(flatten)]`).
#[derive(Debug, Clone, serde::Serialize, Deserialize, JsonSchema)]
pub struct RedisConf {
    /// `policy: redis`: server host name or address.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub redis_host: Option<String>,
    /// `policy: redis`: server port.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub redis_port: u16,
    /// ACL user name (Redis 6+); empty = the default user.
    #[serde(default)]
    pub redis_username: Option<String>,
    /// Password (`AUTH`); empty = none. Never logged.
    #[serde(default)]
    pub redis_password: Option<String>,
    /// `policy: redis`: database number.
    #[serde(default)]
    pub redis_database: u32,
    /// Connect and command timeout, milliseconds.
    #[serde(default = "default_timeout")]
    #[schemars(range(min = 1))]
    pub redis_timeout: u64,
    /// `policy: redis`: TLS to the server.
    #[serde(default)]
    pub redis_ssl: bool,
    /// `policy: redis`: verify the server's certificate (with `redis_ssl`).
    #[serde(default)]
    pub redis_ssl_verify: bool,
    /// Accepted for APISIX compatibility: Weir keeps one multiplexed connection per worker
    /// thread for the life of the process, not a pool of idle ones.
    #[serde(default = "default_keepalive_timeout")]
    #[schemars(range(min = 1000))]
    pub redis_keepalive_timeout: u64,
    /// Accepted for APISIX compatibility (see `redis_keepalive_timeout`).
    #[serde(default = "default_keepalive_pool")]
    #[schemars(range(min = 1))]
    pub redis_keepalive_pool: u64,
    /// `policy: redis-cluster`: seed nodes, `host:port` each.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub redis_cluster_nodes: Option<Vec<String>>,
    /// `policy: redis-cluster`: a name for the cluster (log lines).
    #[serde(default)]
    pub redis_cluster_name: Option<String>,
    /// `policy: redis-cluster`: TLS to the nodes.
    #[serde(default)]
    pub redis_cluster_ssl: bool,
    /// `policy: redis-cluster`: verify the nodes' certificates (with `redis_cluster_ssl`).
    #[serde(default)]
    pub redis_cluster_ssl_verify: bool,
}

fn default_port() -> u16 {
    6379
}
fn default_timeout() -> u64 {
    1000
}
fn default_keepalive_timeout() -> u64 {
    10_000
}
fn default_keepalive_pool() -> u64 {
    100
}

/// limit-count's `redis-sentinel` fields.
#[derive(Debug, Clone, Default, serde::Serialize, Deserialize, JsonSchema)]
pub struct SentinelConf {
    /// Sentinel nodes, asked in order for the master's address.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub redis_sentinels: Option<Vec<SentinelNode>>,
    /// The master name the sentinels monitor.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub redis_master_name: Option<String>,
    /// `master` (default) or `slave`: which node to count on.
    #[serde(default)]
    pub redis_role: Option<SentinelRole>,
    /// Connect timeout, milliseconds (default 1000).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub redis_connect_timeout: Option<u64>,
    /// Command timeout, milliseconds (default 1000).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub redis_read_timeout: Option<u64>,
    /// ACL user of the sentinels.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub sentinel_username: Option<String>,
    /// Password of the sentinels. Never logged.
    #[serde(default)]
    pub sentinel_password: Option<String>,
}

/// One sentinel.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SentinelNode {
    /// Host name or address.
    #[schemars(length(min = 2))]
    pub host: String,
    /// Port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
}

/// `redis_role`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SentinelRole {
    /// The master.
    #[default]
    Master,
    /// A replica.
    Slave,
}

/// Which shared store a configuration names.
#[derive(Debug, Clone, Copy)]
pub enum Shared<'c> {
    /// `redis`.
    Redis,
    /// `redis-cluster`.
    Cluster,
    /// `redis-sentinel` (limit-count).
    Sentinel(&'c SentinelConf),
}

/// Credentials (never printed).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Auth {
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
}

/// TLS to Redis: off, or on with or without certificate verification.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Tls {
    /// Plain TCP.
    Off,
    /// TLS, certificates verified against the system's roots.
    Verify,
    /// TLS without verification (APISIX's default with `redis_ssl: true`).
    NoVerify,
}

impl Tls {
    fn of(on: bool, verify: bool) -> Tls {
        match (on, verify) {
            (false, _) => Tls::Off,
            (true, true) => Tls::Verify,
            (true, false) => Tls::NoVerify,
        }
    }
}

/// Which Redis a configuration counts in: the identity under which connections are shared.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum RedisTarget {
    /// One server.
    Single { host: String, port: u16, db: u32, auth: Auth, tls: Tls, timeout: Duration },
    /// A Redis Cluster, by its seed nodes.
    Cluster { name: String, nodes: Vec<(String, u16)>, auth: Auth, tls: Tls, timeout: Duration },
    /// The master (or a replica) that Redis Sentinel names.
    Sentinel {
        sentinels: Vec<SentinelNode>,
        master: String,
        role: SentinelRole,
        db: u32,
        auth: Auth,
        sentinel_auth: Auth,
        connect_timeout: Duration,
        timeout: Duration,
    },
}

fn nonempty(s: &Option<String>) -> Option<String> {
    s.as_ref().filter(|s| !s.is_empty()).cloned()
}

/// `host:port` (`[v6]:port` too).
fn host_port(n: &str) -> Option<(String, u16)> {
    let (h, p) = n.rsplit_once(':')?;
    let h = h.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(h);
    let port = p.parse::<u16>().ok().filter(|p| *p != 0)?;
    (!h.is_empty()).then(|| (h.to_owned(), port))
}

impl RedisTarget {
    /// The target of a shared policy, or what is missing.
    pub fn from_conf(policy: Shared<'_>, conf: &RedisConf) -> Result<RedisTarget, String> {
        let auth = Auth { username: nonempty(&conf.redis_username), password: nonempty(&conf.redis_password) };
        let timeout = Duration::from_millis(conf.redis_timeout);
        match policy {
            Shared::Redis => {
                let host = nonempty(&conf.redis_host).ok_or("policy redis needs redis_host")?;
                let tls = Tls::of(conf.redis_ssl, conf.redis_ssl_verify);
                Ok(RedisTarget::Single { host, port: conf.redis_port, db: conf.redis_database, auth, tls, timeout })
            }
            Shared::Cluster => {
                let listed = conf.redis_cluster_nodes.clone().unwrap_or_default();
                if listed.is_empty() {
                    return Err("policy redis-cluster needs redis_cluster_nodes (host:port, at least one)".into());
                }
                let mut nodes = Vec::with_capacity(listed.len());
                for n in &listed {
                    nodes.push(host_port(n).ok_or_else(|| format!("redis_cluster_nodes: {n:?} is not host:port"))?);
                }
                let name = conf.redis_cluster_name.clone().unwrap_or_else(|| "redis-cluster".into());
                let tls = Tls::of(conf.redis_cluster_ssl, conf.redis_cluster_ssl_verify);
                Ok(RedisTarget::Cluster { name, nodes, auth, tls, timeout })
            }
            Shared::Sentinel(s) => {
                let sentinels = s.redis_sentinels.clone().unwrap_or_default();
                if sentinels.is_empty() {
                    return Err("policy redis-sentinel needs redis_sentinels (at least one {host, port})".into());
                }
                let master = nonempty(&s.redis_master_name).ok_or("policy redis-sentinel needs redis_master_name")?;
                let ms = |v: Option<u64>| Duration::from_millis(v.unwrap_or(1000));
                Ok(RedisTarget::Sentinel {
                    sentinels,
                    master,
                    role: s.redis_role.unwrap_or_default(),
                    db: conf.redis_database,
                    auth,
                    sentinel_auth: Auth {
                        username: nonempty(&s.sentinel_username),
                        password: nonempty(&s.sentinel_password),
                    },
                    connect_timeout: ms(s.redis_connect_timeout),
                    timeout: ms(s.redis_read_timeout),
                })
            }
        }
    }

    /// How long one call may take.
    pub fn timeout(&self) -> Duration {
        match self {
            RedisTarget::Single { timeout, .. }
            | RedisTarget::Cluster { timeout, .. }
            | RedisTarget::Sentinel { timeout, .. } => *timeout,
        }
    }
}

impl fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTarget::Single { host, port, db, tls, .. } => {
                let s = if *tls == Tls::Off { "redis" } else { "rediss" };
                write!(f, "{s} {host}:{port}/{db}")
            }
            RedisTarget::Cluster { name, nodes, .. } => {
                let nodes: Vec<String> = nodes.iter().map(|(h, p)| format!("{h}:{p}")).collect();
                write!(f, "redis-cluster {name} ({})", nodes.join(", "))
            }
            RedisTarget::Sentinel { master, sentinels, .. } => {
                let nodes: Vec<String> = sentinels.iter().map(|s| format!("{}:{}", s.host, s.port)).collect();
                write!(f, "redis-sentinel {master} ({})", nodes.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(v: serde_json::Value) -> RedisConf {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn shared_policies_need_their_servers() {
        let e = RedisTarget::from_conf(Shared::Redis, &conf(serde_json::json!({}))).err().unwrap_or_default();
        assert!(e.contains("redis_host"), "{e}");
        let e = RedisTarget::from_conf(Shared::Cluster, &conf(serde_json::json!({}))).err().unwrap_or_default();
        assert!(e.contains("redis_cluster_nodes"), "{e}");
        let e = RedisTarget::from_conf(Shared::Cluster, &conf(serde_json::json!({"redis_cluster_nodes": ["x"]})))
            .err()
            .unwrap_or_default();
        assert!(e.contains("\"x\" is not host:port"), "{e}");
        let ok = RedisTarget::from_conf(Shared::Redis, &conf(serde_json::json!({"redis_host": "127.0.0.1"})));
        assert!(ok.is_ok_and(|t| t.to_string() == "redis 127.0.0.1:6379/0"));
        let s = SentinelConf::default();
        let e = RedisTarget::from_conf(Shared::Sentinel(&s), &conf(serde_json::json!({}))).err().unwrap_or_default();
        assert!(e.contains("redis_sentinels"), "{e}");
        assert_eq!(host_port("[::1]:7000"), Some(("::1".into(), 7000)));
    }
}
