//! Talking to a limiter's Redis: one connection per worker thread and target (so workers never
//! wait on each other; plain TCP ones are the pipelined `super::lean` connection, TLS and
//! Cluster ones the `redis` crate's), each call bounded by `redis_timeout`, and a breaker:
//! when a call fails the target is marked down for [`DOWN_FOR`], and calls in that time fail
//! at once instead of waiting (the caller rejects or lets through, by `allow_degradation`).
//! The change of state is logged once each way; credentials never appear in a message.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ConnectionAddr, FromRedisValue, IntoConnectionInfo, RedisConnectionInfo, RedisResult};

use super::conf::{Auth, RedisTarget, SentinelNode, SentinelRole, Tls};
use super::lean::{self, Lean};
use super::resp::ScriptCall;

/// How long a failed target is left alone before it is tried again.
pub const DOWN_FOR: Duration = Duration::from_secs(1);

/// A call that could not be made (the target is down or failed; already logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

#[derive(Clone)]
enum Conn {
    Lean(Lean),
    Single(ConnectionManager),
    Cluster(ClusterConnection),
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

fn addr(host: &str, port: u16, tls: Tls) -> ConnectionAddr {
    match tls {
        Tls::Off => ConnectionAddr::Tcp(host.to_owned(), port),
        Tls::Verify | Tls::NoVerify => {
            ConnectionAddr::TcpTls { host: host.to_owned(), port, insecure: tls == Tls::NoVerify, tls_params: None }
        }
    }
}

async fn single(addr: ConnectionAddr, auth: &Auth, db: u32, timeout: Duration) -> RedisResult<Conn> {
    let info = addr.into_connection_info()?.set_redis_settings(settings(auth, db));
    let client = redis::Client::open(info)?;
    // No response timeout of the client's own: each call is bounded by the caller (one timer per
    // call, not two), and no retries: a failure is reported, and the breaker decides.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None)
        .set_number_of_retries(0);
    Ok(Conn::Single(ConnectionManager::new_with_config(client, config).await?))
}

/// Asks the sentinels, in order, where `master` (or one of its replicas) is.
async fn locate(
    sentinels: &[SentinelNode],
    master: &str,
    role: SentinelRole,
    auth: &Auth,
    timeout: Duration,
) -> RedisResult<(String, u16)> {
    let mut last = None;
    for s in sentinels {
        let ask = async {
            let info = ConnectionAddr::Tcp(s.host.clone(), s.port)
                .into_connection_info()?
                .set_redis_settings(settings(auth, 0));
            let mut c: MultiplexedConnection = redis::Client::open(info)?.get_multiplexed_async_connection().await?;
            match role {
                SentinelRole::Master => {
                    let found: Option<(String, u16)> =
                        redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(master).query_async(&mut c).await?;
                    Ok::<_, redis::RedisError>(found)
                }
                SentinelRole::Slave => {
                    let replicas: Vec<HashMap<String, String>> =
                        redis::cmd("SENTINEL").arg("replicas").arg(master).query_async(&mut c).await?;
                    Ok(replicas.into_iter().find_map(|r| {
                        let flags = r.get("flags").map(String::as_str).unwrap_or("");
                        let healthy = !["s_down", "o_down", "disconnected"].iter().any(|f| flags.contains(f));
                        let port = r.get("port").and_then(|p| p.parse().ok());
                        healthy.then(|| r.get("ip").cloned().zip(port)).flatten()
                    }))
                }
            }
        };
        match tokio::time::timeout(timeout, ask).await {
            Ok(Ok(Some(found))) => return Ok(found),
            Ok(Ok(None)) => last = Some(format!("sentinel {}:{} knows no {role:?} of {master}", s.host, s.port)),
            Ok(Err(e)) => last = Some(format!("sentinel {}:{}: {e}", s.host, s.port)),
            Err(_) => last = Some(format!("sentinel {}:{}: no answer in time", s.host, s.port)),
        }
    }
    let why = last.unwrap_or_else(|| "no sentinel".into());
    Err(redis::RedisError::from((redis::ErrorKind::Io, "sentinels did not name a node", why)))
}

async fn connect(target: &RedisTarget) -> Result<Conn, String> {
    let lean = |host: String, port: u16, auth: Auth, db: u32, timeout: Duration| async move {
        Lean::connect(&host, port, &auth, db, timeout).await.map(Conn::Lean).map_err(|lean::Broken(e)| e)
    };
    match target {
        RedisTarget::Single { host, port, db, auth, tls: Tls::Off, timeout } => {
            lean(host.clone(), *port, auth.clone(), *db, *timeout).await
        }
        RedisTarget::Sentinel { sentinels, master, role, db, auth, sentinel_auth, connect_timeout, .. } => {
            let (host, port) =
                locate(sentinels, master, *role, sentinel_auth, *connect_timeout).await.map_err(|e| e.to_string())?;
            lean(host, port, auth.clone(), *db, *connect_timeout).await
        }
        _ => connect_redis_rs(target).await.map_err(|e| e.to_string()),
    }
}

/// A TLS or Cluster target's connection, by the `redis` crate.
async fn connect_redis_rs(target: &RedisTarget) -> RedisResult<Conn> {
    match target {
        RedisTarget::Single { host, port, db, auth, tls, timeout } => {
            single(addr(host, *port, *tls), auth, *db, *timeout).await
        }
        RedisTarget::Cluster { nodes, auth, tls, timeout, .. } => {
            let mut infos = Vec::with_capacity(nodes.len());
            for (host, port) in nodes {
                infos.push(addr(host, *port, Tls::Off).into_connection_info()?);
            }
            let mut b = ClusterClient::builder(infos).connection_timeout(*timeout).response_timeout(*timeout);
            match tls {
                Tls::Off => {}
                Tls::Verify => b = b.tls(redis::TlsMode::Secure),
                Tls::NoVerify => b = b.tls(redis::TlsMode::Insecure),
            }
            if let Some(u) = &auth.username {
                b = b.username(u);
            }
            if let Some(p) = &auth.password {
                b = b.password(p);
            }
            Ok(Conn::Cluster(b.build()?.get_async_connection().await?))
        }
        RedisTarget::Sentinel { .. } => {
            Err(redis::RedisError::from((redis::ErrorKind::Io, "sentinel targets are lean")))
        }
    }
}

/// One Redis target of one plugin: connections per worker thread and the breaker.
pub struct RedisStore {
    plugin: &'static str,
    target: RedisTarget,
    conns: Mutex<Vec<(ThreadId, Conn)>>,
    born: Instant,
    /// Milliseconds after `born` until which the target is not tried (0: up).
    down_until: AtomicU64,
    /// Whether the last attempt failed (to log changes of state once).
    failing: AtomicBool,
}

enum Call<'a> {
    Script(&'a ScriptCall<'a>),
    Cmd(&'a Cmd),
}

impl RedisStore {
    fn new(plugin: &'static str, target: RedisTarget) -> RedisStore {
        RedisStore {
            plugin,
            target,
            conns: Mutex::new(Vec::new()),
            born: Instant::now(),
            down_until: AtomicU64::new(0),
            failing: AtomicBool::new(false),
        }
    }

    /// The target.
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// Whether calls fail at once now (the breaker is open).
    pub fn is_down(&self) -> bool {
        let until = self.down_until.load(Ordering::Relaxed);
        until != 0 && self.now_ms() < until
    }

    /// Runs a script; `Err` when Redis could not be asked or failed (logged once per outage).
    pub async fn eval<T: FromRedisValue>(&self, script: &ScriptCall<'_>) -> Result<T, Unavailable> {
        self.call(Call::Script(script)).await
    }

    /// Runs a command (see [`RedisStore::eval`]).
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, Unavailable> {
        self.call(Call::Cmd(cmd)).await
    }

    async fn call<T: FromRedisValue>(&self, call: Call<'_>) -> Result<T, Unavailable> {
        if self.is_down() {
            return Err(Unavailable);
        }
        let timeout = self.target.timeout();
        let failure = match tokio::time::timeout(timeout, self.run(call)).await {
            Ok(Ok(v)) => {
                if self.down_until.load(Ordering::Relaxed) != 0 {
                    self.down_until.store(0, Ordering::Relaxed);
                }
                if self.failing.load(Ordering::Relaxed) && self.failing.swap(false, Ordering::Relaxed) {
                    log::info!("{}: {} is reachable again", self.plugin, self.target);
                }
                return Ok(v);
            }
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {} ms", timeout.as_millis()),
        };
        // A fresh connection next time (after a failover, Sentinel names the new master).
        let me = std::thread::current().id();
        self.conns.lock().retain(|(t, _)| *t != me);
        self.down_until.store(self.now_ms() + DOWN_FOR.as_millis() as u64, Ordering::Relaxed);
        if !self.failing.swap(true, Ordering::Relaxed) {
            log::error!(
                "{}: {} is unavailable ({failure}); routes reject with 503 unless allow_degradation is set",
                self.plugin,
                self.target
            );
        }
        Err(Unavailable)
    }

    async fn run<T: FromRedisValue>(&self, call: Call<'_>) -> Result<T, String> {
        let me = std::thread::current().id();
        let found = {
            let mut conns = self.conns.lock();
            // A pipelined connection the server closed while idle is replaced, not reported.
            conns.retain(|(t, c)| *t != me || !matches!(c, Conn::Lean(l) if l.is_closed()));
            conns.iter().find(|(t, _)| *t == me).map(|(_, c)| c.clone())
        };
        let mut conn = match found {
            Some(c) => c,
            None => {
                let c = connect(&self.target).await?;
                let mut conns = self.conns.lock();
                if !conns.iter().any(|(t, _)| *t == me) {
                    conns.push((me, c.clone()));
                }
                c
            }
        };
        let e = |e: redis::RedisError| e.to_string();
        match (&mut conn, call) {
            (Conn::Lean(c), Call::Script(s)) => c.eval(s).await.map_err(|lean::Broken(e)| e)?.and_then(lean::convert),
            (Conn::Lean(c), Call::Cmd(cmd)) => {
                c.call(|out| cmd.write_packed_command(out)).await.map_err(|lean::Broken(e)| e)?.and_then(lean::convert)
            }
            (Conn::Single(c), Call::Script(s)) => script_redis_rs(c, s).await.map_err(e),
            (Conn::Cluster(c), Call::Script(s)) => script_redis_rs(c, s).await.map_err(e),
            (Conn::Single(c), Call::Cmd(cmd)) => cmd.query_async(c).await.map_err(e),
            (Conn::Cluster(c), Call::Cmd(cmd)) => cmd.query_async(c).await.map_err(e),
        }
    }
}

/// A script call over a `redis` crate connection: by SHA1, in full when the server lacks it.
async fn script_redis_rs<T: FromRedisValue>(
    conn: &mut impl redis::aio::ConnectionLike,
    call: &ScriptCall<'_>,
) -> RedisResult<T> {
    let invocation = |cmd: &mut Cmd| {
        cmd.arg(call.key_count());
        for part in call.parts() {
            cmd.arg(part);
        }
    };
    let mut by_sha = redis::cmd("EVALSHA");
    by_sha.arg(call.script().redis().get_hash());
    invocation(&mut by_sha);
    match by_sha.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            let mut full = redis::cmd("EVAL");
            full.arg(call.script().code());
            invocation(&mut full);
            full.query_async(conn).await
        }
        other => other,
    }
}

/// A plugin's Redis targets in use: configurations naming the same target share its
/// connections and breaker.
pub struct Registry {
    plugin: &'static str,
    stores: Mutex<HashMap<RedisTarget, Weak<RedisStore>>>,
}

impl Registry {
    /// The registry of plugin `plugin` (the name its log lines carry).
    pub fn new(plugin: &'static str) -> Registry {
        Registry { plugin, stores: Mutex::new(HashMap::new()) }
    }

    /// The store of `target`, shared with every live configuration naming it.
    pub fn get(&self, target: RedisTarget) -> Arc<RedisStore> {
        let mut stores = self.stores.lock();
        if let Some(s) = stores.get(&target).and_then(Weak::upgrade) {
            return s;
        }
        stores.retain(|_, w| w.strong_count() > 0);
        let s = Arc::new(RedisStore::new(self.plugin, target.clone()));
        stores.insert(target, Arc::downgrade(&s));
        s
    }
}
