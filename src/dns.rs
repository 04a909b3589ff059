//! Upstream host names resolved off the request path.
//!
//! Every name an upstream names (a node's `host`, or `service_name` with `discovery_type: dns`)
//! becomes a [`Query`] this module keeps fresh: one task per name on the `dns` thread resolves it
//! (every A and AAAA record, or every SRV record of the lowest priority and their targets'
//! addresses), sleeps for the answer's TTL (bounded by `dns_min_ttl`/`dns_max_ttl`, or fixed by
//! `dns_resolver_valid`), and resolves again. A failed lookup (NXDOMAIN, SERVFAIL, a timeout)
//! keeps the last good answer and retries with backoff.
//!
//! Snapshots read answers when they compile an upstream ([`Dns::answer`]) and note the
//! generation of each; when an answer changes, the change hook (set by `run`) rebuilds the
//! resources in force, and only the upstreams built from a stale answer are compiled again
//! (`CompiledUpstream::dns_current`). Requests never wait on DNS.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;
use parking_lot::Mutex;

/// A name to keep resolved.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Query {
    /// A and AAAA records of a host.
    Host(Arc<str>),
    /// SRV records of a service (`_http._tcp.example.com`, or a Consul-style name).
    Srv(Arc<str>),
}

impl std::fmt::Display for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Query::Host(h) => write!(f, "{h}"),
            Query::Srv(s) => write!(f, "SRV {s}"),
        }
    }
}

/// One address an answer names.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Target {
    /// The address.
    pub ip: IpAddr,
    /// The port (SRV answers only).
    pub port: Option<u16>,
    /// The weight (SRV answers only).
    pub weight: Option<u32>,
    /// The name the address belongs to (the SRV target, or the host itself).
    pub name: Arc<str>,
}

/// An answer and its generation (which changes whenever the targets do).
#[derive(Clone, Debug)]
pub struct Answer {
    /// The targets, in a stable order.
    pub targets: Arc<[Target]>,
    /// Bumped on every change of `targets`.
    pub generation: u64,
}

/// `gateway.dns_*` of config.yaml.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Name servers (`gateway.dns_resolver`); `/etc/resolv.conf`'s when empty.
    pub servers: Vec<SocketAddr>,
    /// A fixed validity for every answer (`gateway.dns_resolver_valid`), instead of its TTL.
    pub valid: Option<Duration>,
    /// The shortest time an answer is used before it is resolved again.
    pub min_ttl: Duration,
    /// The longest.
    pub max_ttl: Duration,
}

struct Entry {
    answer: Option<Answer>,
    /// Threads waiting for the first answer (a snapshot build that met the name first).
    waiters: Vec<std::sync::mpsc::Sender<()>>,
}

type Hook = Box<dyn Fn() + Send + Sync>;

/// The resolver service: the answers, and the thread that keeps them fresh.
pub struct Dns {
    entries: Mutex<HashMap<Query, Entry>>,
    watch: tokio::sync::mpsc::UnboundedSender<Query>,
    on_change: Mutex<Option<Arc<Hook>>>,
    settings: Settings,
}

/// How long a snapshot build waits for the first answers of names it meets for the first time.
pub const FIRST_ANSWER_WAIT: Duration = Duration::from_secs(2);

static SERVICE: OnceLock<Arc<Dns>> = OnceLock::new();

/// The process's resolver service, once [`start`] ran (not in `weir -t`, nor in unit tests:
/// there, names resolve once through the system's resolver).
pub fn service() -> Option<&'static Arc<Dns>> {
    SERVICE.get()
}

/// Starts the resolver service for the process (the first call wins; later calls return it).
pub fn start(settings: Settings) -> Result<&'static Arc<Dns>, String> {
    if let Some(s) = SERVICE.get() {
        return Ok(s);
    }
    let resolver = build_resolver(&settings)?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let dns = Arc::new(Dns { entries: Mutex::new(HashMap::new()), watch: tx, on_change: Mutex::new(None), settings });
    let service = SERVICE.get_or_init(|| dns);
    let weak = Arc::downgrade(service);
    std::thread::Builder::new()
        .name("dns".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    log::error!("the DNS resolver cannot start its runtime: {e}");
                    return;
                }
            };
            runtime.block_on(serve(weak, resolver, rx));
        })
        .map_err(|e| format!("cannot start the DNS thread: {e}"))?;
    Ok(service)
}

fn build_resolver(settings: &Settings) -> Result<TokioResolver, String> {
    let mut builder = if settings.servers.is_empty() {
        match TokioResolver::builder_tokio() {
            Ok(b) => b,
            Err(e) => {
                log::warn!("/etc/resolv.conf: {e}; only /etc/hosts names resolve (set gateway.dns_resolver)");
                TokioResolver::builder_with_config(ResolverConfig::from_name_servers(Vec::new()), Default::default())
            }
        }
    } else {
        let servers = settings
            .servers
            .iter()
            .map(|s| {
                let mut ns = NameServerConfig::udp_and_tcp(s.ip());
                for c in &mut ns.connections {
                    c.port = s.port();
                }
                ns
            })
            .collect();
        TokioResolver::builder_with_config(ResolverConfig::from_name_servers(servers), TokioRuntimeProvider::default())
    };
    let opts = builder.options_mut();
    // Our own loop re-resolves at the TTL; a cache below it would answer with what it had.
    opts.cache_size = 0;
    opts.timeout = Duration::from_secs(2);
    opts.attempts = 2;
    builder.build().map_err(|e| format!("DNS resolver: {e}"))
}

impl Dns {
    /// Starts keeping every name of `queries` not yet kept fresh, and waits up to `wait` for
    /// their first answers, together (a snapshot build that meets new names: it would otherwise
    /// publish their upstreams without those nodes, only to rebuild them a moment later). Names
    /// already kept, resolved or not, cost one map lookup and no wait.
    pub fn prefetch(&self, queries: impl IntoIterator<Item = Query>, wait: Duration) {
        let mut pending = Vec::new();
        {
            let mut entries = self.entries.lock();
            for query in queries {
                if entries.contains_key(&query) {
                    continue;
                }
                let (tx, rx) = std::sync::mpsc::channel();
                entries.insert(query.clone(), Entry { answer: None, waiters: vec![tx] });
                if self.watch.send(query).is_ok() {
                    pending.push(rx);
                }
            }
        }
        let deadline = Instant::now() + wait;
        for rx in pending {
            let _ = rx.recv_timeout(deadline.saturating_duration_since(Instant::now()));
        }
    }

    /// The answer for `query` now (a name not yet kept starts being kept; no wait).
    pub fn answer(&self, query: &Query) -> Option<Answer> {
        self.prefetch([query.clone()], Duration::ZERO);
        self.entries.lock().get(query).and_then(|e| e.answer.clone())
    }

    /// The generation of `query`'s current answer (`None`: not resolved, or no longer kept).
    pub fn generation(&self, query: &Query) -> Option<u64> {
        self.entries.lock().get(query).and_then(|e| e.answer.as_ref().map(|a| a.generation))
    }

    /// Stops keeping every name but those `keep` accepts (after a publish: the names the
    /// resources in force still name).
    pub fn retain(&self, keep: impl Fn(&Query) -> bool) {
        self.entries.lock().retain(|q, _| keep(q));
    }

    /// What runs when an answer changes (the gateway rebuilds its resources).
    pub fn set_on_change(&self, hook: impl Fn() + Send + Sync + 'static) {
        *self.on_change.lock() = Some(Arc::new(Box::new(hook)));
    }

    /// Records a lookup's result; whether the targets changed.
    fn record(&self, query: &Query, targets: Vec<Target>) -> bool {
        let mut entries = self.entries.lock();
        let Some(entry) = entries.get_mut(query) else { return false };
        let changed = entry.answer.as_ref().is_none_or(|a| *a.targets != *targets);
        if changed {
            let generation = entry.answer.as_ref().map_or(1, |a| a.generation + 1);
            entry.answer = Some(Answer { targets: targets.into(), generation });
        }
        for w in entry.waiters.drain(..) {
            let _ = w.send(());
        }
        changed
    }

    fn kept(&self, query: &Query) -> bool {
        self.entries.lock().contains_key(query)
    }

    /// How long an answer with records valid until `valid_until` is used.
    fn ttl(&self, valid_until: Instant) -> Duration {
        let s = &self.settings;
        s.valid.unwrap_or_else(|| valid_until.saturating_duration_since(Instant::now()).clamp(s.min_ttl, s.max_ttl))
    }
}

/// The `dns` thread: one task per kept name.
async fn serve(
    dns: std::sync::Weak<Dns>,
    resolver: TokioResolver,
    mut watch: tokio::sync::mpsc::UnboundedReceiver<Query>,
) {
    let resolver = Arc::new(resolver);
    while let Some(query) = watch.recv().await {
        tokio::spawn(keep_fresh(dns.clone(), resolver.clone(), query));
    }
}

/// Resolves `query` at its TTL for as long as it is kept.
async fn keep_fresh(dns: std::sync::Weak<Dns>, resolver: Arc<TokioResolver>, query: Query) {
    let mut failures = 0u32;
    loop {
        let result = lookup(&resolver, &query).await;
        let Some(service) = dns.upgrade() else { return };
        if !service.kept(&query) {
            return;
        }
        let wait = match result {
            Ok((targets, valid_until)) => {
                failures = 0;
                let wait = service.ttl(valid_until);
                if service.record(&query, targets) {
                    log::info!("DNS {query}: answer changed; next lookup in {:.0} s", wait.as_secs_f64());
                    let hook = service.on_change.lock().clone();
                    if let Some(hook) = hook {
                        hook();
                    }
                }
                wait
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                // The last good answer stays; retry soon, then less often.
                let wait =
                    (service.settings.min_ttl * 2u32.saturating_pow(failures.min(5))).min(Duration::from_secs(30));
                if failures == 1 || failures.is_power_of_two() {
                    log::warn!("DNS {query}: {e}; keeping the last answer, retrying in {:.0} s", wait.as_secs_f64());
                }
                // A waiting build need not wait for the timeout: there is nothing to give it.
                let mut entries = service.entries.lock();
                if let Some(entry) = entries.get_mut(&query) {
                    entry.waiters.clear();
                }
                wait
            }
        };
        drop(service);
        tokio::time::sleep(wait).await;
    }
}

/// One lookup: the targets (sorted) and until when they are valid.
async fn lookup(resolver: &TokioResolver, query: &Query) -> Result<(Vec<Target>, Instant), String> {
    match query {
        Query::Host(host) => {
            let found = resolver.lookup_ip(&**host).await.map_err(|e| e.to_string())?;
            let mut targets: Vec<Target> =
                found.iter().map(|ip| Target { ip, port: None, weight: None, name: host.clone() }).collect();
            if targets.is_empty() {
                return Err("no A or AAAA records".into());
            }
            targets.sort_by_key(|t| t.ip);
            targets.dedup();
            Ok((targets, found.valid_until()))
        }
        Query::Srv(service) => {
            let found = resolver.lookup(&**service, RecordType::SRV).await.map_err(|e| e.to_string())?;
            let srvs: Vec<_> = found
                .answers()
                .iter()
                .filter_map(|r| match &r.data {
                    RData::SRV(srv) => Some(srv.clone()),
                    _ => None,
                })
                .collect();
            // RFC 2782: the lowest priority is used while any of it exists.
            let best = srvs.iter().map(|s| s.priority).min().ok_or("no SRV records")?;
            let mut valid_until = found.valid_until();
            let mut targets = Vec::new();
            for srv in srvs.iter().filter(|s| s.priority == best) {
                let name = srv.target.to_string();
                let name: Arc<str> = Arc::from(name.strip_suffix('.').unwrap_or(&name));
                match resolver.lookup_ip(srv.target.clone()).await {
                    Ok(ips) => {
                        valid_until = valid_until.min(ips.valid_until());
                        // A weight of 0 means "rarely" in RFC 2782; a weight 0 node is never
                        // picked here, so it becomes 1.
                        let weight = Some(u32::from(srv.weight.max(1)));
                        targets.extend(ips.iter().map(|ip| Target {
                            ip,
                            port: Some(srv.port),
                            weight,
                            name: name.clone(),
                        }));
                    }
                    Err(e) => log::warn!("DNS SRV {service}: target {name}: {e}"),
                }
            }
            if targets.is_empty() {
                return Err("no SRV target resolves".into());
            }
            targets.sort_by_key(|t| (t.ip, t.port));
            targets.dedup();
            Ok((targets, valid_until))
        }
    }
}
