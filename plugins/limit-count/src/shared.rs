//! The `redis` and `redis-cluster` policies: fixed-window counters in Redis, so that every
//! instance naming the same server enforces one limit together.
//!
//! One request is one round trip: a server-side script increments the key and sets its expiry on
//! the window's first request, atomically (`INCR` + `PEXPIRE` in one `EVALSHA`), and returns the
//! count and the time left. Each worker thread keeps its own multiplexed connection per target, so
//! workers never wait on each other. When Redis fails, the target is marked down for a second:
//! requests in that second do not wait on it (they are rejected or let through at once, by
//! `allow_degradation`), and the change of state is logged once each way.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo, Script};

use crate::{Conf, Policy, Verdict};

/// How long a failed target is left alone before it is tried again.
const DOWN_FOR: Duration = Duration::from_secs(1);

/// Counts one request in the window of `KEYS[1]` (`ARGV[1]` milliseconds long); returns the
/// count so far and the milliseconds left.
const COUNT_SCRIPT: &str = r"
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {n, ttl}
";

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(COUNT_SCRIPT));

/// Which Redis a configuration counts in: the identity under which stores are shared.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum RedisTarget {
    /// One server.
    Single { host: String, port: u16, db: u32, auth: Auth, timeout: Duration },
    /// A Redis Cluster, by its seed nodes.
    Cluster { name: String, nodes: Vec<String>, auth: Auth, timeout: Duration },
}

/// Credentials (never printed).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Auth {
    username: Option<String>,
    password: Option<String>,
}

impl RedisTarget {
    /// The target of a `redis` / `redis-cluster` configuration, or what is missing.
    pub fn from_conf(conf: &Conf) -> Result<RedisTarget, String> {
        let nonempty = |s: &Option<String>| s.as_ref().filter(|s| !s.is_empty()).cloned();
        let auth = Auth { username: nonempty(&conf.redis_username), password: nonempty(&conf.redis_password) };
        let timeout = Duration::from_millis(conf.redis_timeout);
        match conf.policy {
            Policy::Redis => {
                let host = nonempty(&conf.redis_host).ok_or("policy redis needs redis_host")?;
                Ok(RedisTarget::Single { host, port: conf.redis_port, db: conf.redis_database, auth, timeout })
            }
            Policy::RedisCluster => {
                let nodes = conf.redis_cluster_nodes.clone().unwrap_or_default();
                if nodes.is_empty() {
                    return Err("policy redis-cluster needs redis_cluster_nodes (host:port, at least one)".into());
                }
                for n in &nodes {
                    let port = n.rsplit_once(':').and_then(|(h, p)| (!h.is_empty()).then_some(p));
                    if port.and_then(|p| p.parse::<u16>().ok()).is_none_or(|p| p == 0) {
                        return Err(format!("redis_cluster_nodes: {n:?} is not host:port"));
                    }
                }
                let name = conf.redis_cluster_name.clone().unwrap_or_else(|| "redis-cluster".into());
                Ok(RedisTarget::Cluster { name, nodes, auth, timeout })
            }
            Policy::Local => Err("policy local has no Redis target".into()),
        }
    }

    fn timeout(&self) -> Duration {
        match self {
            RedisTarget::Single { timeout, .. } | RedisTarget::Cluster { timeout, .. } => *timeout,
        }
    }

    fn settings(auth: &Auth, db: u32) -> RedisConnectionInfo {
        let mut s = RedisConnectionInfo::default().set_db(i64::from(db));
        if let Some(u) = &auth.username {
            s = s.set_username(u);
        }
        if let Some(p) = &auth.password {
            s = s.set_password(p);
        }
        s
    }

    async fn connect(&self) -> redis::RedisResult<Conn> {
        match self {
            RedisTarget::Single { host, port, db, auth, timeout } => {
                let info = ConnectionAddr::Tcp(host.clone(), *port)
                    .into_connection_info()?
                    .set_redis_settings(Self::settings(auth, *db));
                let client = redis::Client::open(info)?;
                // No response timeout of the client's own: `incoming` bounds the whole call (one
                // timer per request, not two).
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(*timeout))
                    .set_response_timeout(None)
                    .set_number_of_retries(0);
                Ok(Conn::Single(ConnectionManager::new_with_config(client, config).await?))
            }
            RedisTarget::Cluster { nodes, auth, timeout, .. } => {
                let mut infos = Vec::with_capacity(nodes.len());
                for n in nodes {
                    let (host, port) = n.rsplit_once(':').unwrap_or((n, "6379"));
                    let port = port.parse().unwrap_or(6379);
                    infos.push(ConnectionAddr::Tcp(host.to_owned(), port).into_connection_info()?);
                }
                let mut b = ClusterClient::builder(infos).connection_timeout(*timeout).response_timeout(*timeout);
                if let Some(u) = &auth.username {
                    b = b.username(u);
                }
                if let Some(p) = &auth.password {
                    b = b.password(p);
                }
                Ok(Conn::Cluster(b.build()?.get_async_connection().await?))
            }
        }
    }
}

impl fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTarget::Single { host, port, db, .. } => write!(f, "redis {host}:{port}/{db}"),
            RedisTarget::Cluster { name, nodes, .. } => write!(f, "redis-cluster {name} ({})", nodes.join(", ")),
        }
    }
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn count(&mut self, key: &str, window_ms: u64) -> redis::RedisResult<(u64, i64)> {
        let mut call = SCRIPT.key(key);
        call.arg(window_ms);
        match self {
            Conn::Single(c) => call.invoke_async(c).await,
            Conn::Cluster(c) => call.invoke_async(c).await,
        }
    }
}

/// Counters in one Redis target, with a connection per worker thread.
pub struct RedisStore {
    target: RedisTarget,
    conns: Mutex<Vec<(ThreadId, Conn)>>,
    born: Instant,
    /// Milliseconds after `born` until which the target is not tried (0: up).
    down_until: AtomicU64,
    /// Whether the last attempt failed (for logging changes of state once).
    failing: AtomicBool,
}

impl RedisStore {
    fn new(target: RedisTarget) -> RedisStore {
        RedisStore {
            target,
            conns: Mutex::new(Vec::new()),
            born: Instant::now(),
            down_until: AtomicU64::new(0),
            failing: AtomicBool::new(false),
        }
    }

    /// The Redis key of `key`'s counter in `scope`.
    pub fn key(&self, scope: &str, key: &str) -> String {
        format!("weir:limit-count:{scope}:{key}")
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// Counts one request; `Err` when Redis could not be asked (already logged).
    pub async fn incoming(&self, key: &str, limit: u64, window: Duration) -> Result<Verdict, ()> {
        let down_until = self.down_until.load(Ordering::Relaxed);
        if down_until != 0 && self.now_ms() < down_until {
            return Err(());
        }
        let window_ms = window.as_millis() as u64;
        let result = tokio::time::timeout(self.target.timeout(), self.count(key, window_ms)).await;
        let failure = match result {
            Ok(Ok((n, ttl_ms))) => {
                self.down_until.store(0, Ordering::Relaxed);
                if self.failing.swap(false, Ordering::Relaxed) {
                    log::info!("limit-count: {} is reachable again", self.target);
                }
                let reset = (ttl_ms.max(0) as u64).div_ceil(1000);
                return Ok(Verdict { allowed: n <= limit, remaining: limit.saturating_sub(n), reset });
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} ms", self.target.timeout().as_millis()),
        };
        self.conns.lock().retain(|(t, _)| *t != std::thread::current().id());
        self.down_until.store(self.now_ms() + DOWN_FOR.as_millis() as u64, Ordering::Relaxed);
        if !self.failing.swap(true, Ordering::Relaxed) {
            log::error!(
                "limit-count: {} is unavailable ({failure}); routes reject with 503 unless allow_degradation is set",
                self.target
            );
        }
        Err(())
    }

    async fn count(&self, key: &str, window_ms: u64) -> redis::RedisResult<(u64, i64)> {
        let me = std::thread::current().id();
        let found = self.conns.lock().iter().find(|(t, _)| *t == me).map(|(_, c)| c.clone());
        let mut conn = match found {
            Some(c) => c,
            None => {
                let c = self.target.connect().await?;
                let mut conns = self.conns.lock();
                if !conns.iter().any(|(t, _)| *t == me) {
                    conns.push((me, c.clone()));
                }
                c
            }
        };
        conn.count(key, window_ms).await
    }
}

/// The stores in use, by target: routes naming the same Redis share its connections.
#[derive(Default)]
pub struct Registry {
    stores: Mutex<HashMap<RedisTarget, Weak<RedisStore>>>,
}

impl Registry {
    /// The store of `target`, shared with every live configuration naming it.
    pub fn get(&self, target: RedisTarget) -> Arc<RedisStore> {
        let mut stores = self.stores.lock();
        if let Some(s) = stores.get(&target).and_then(Weak::upgrade) {
            return s;
        }
        stores.retain(|_, w| w.strong_count() > 0);
        let s = Arc::new(RedisStore::new(target.clone()));
        stores.insert(target, Arc::downgrade(&s));
        s
    }
}
