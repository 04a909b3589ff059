//! One health checker: the targets of one resource's upstream, their states, and their probes.
//!
//! A target is `(ip, port, hostname)`: `checks.active.port` overrides the node's port (so two nodes
//! can be one target) and `checks.active.host` is the Host / SNI of probes. A target's status is an
//! atomic (read on every request without locking); counters change under a mutex on reports.
//! Each target has one probe task on the probe runtime; stopping the checker aborts them all.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::AbortHandle;

use super::state::{apply, Report, Status};
use super::{Counter, Entry, NodeReport};
use crate::resources::checks::{Active, Checks, Passive, ProbeType};

/// Identity of a checked target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TargetKey {
    /// IP address.
    pub ip: IpAddr,
    /// Probed port.
    pub port: u16,
    /// Host header / SNI of probes.
    pub hostname: String,
}

struct TargetInner {
    counter: Counter,
    last_failure: Option<String>,
    changed_at: Option<String>,
}

/// One checked target.
pub struct Target {
    /// Identity.
    pub key: TargetKey,
    status: AtomicU8,
    inner: Mutex<TargetInner>,
    probe: Mutex<Option<AbortHandle>>,
}

impl Target {
    fn new(key: TargetKey) -> Arc<Target> {
        Arc::new(Target {
            key,
            status: AtomicU8::new(Status::Healthy as u8),
            inner: Mutex::new(TargetInner { counter: Counter::default(), last_failure: None, changed_at: None }),
            probe: Mutex::new(None),
        })
    }
    /// Current status.
    pub fn status(&self) -> Status {
        Status::from_u8(self.status.load(Ordering::Acquire))
    }
    fn stop_probe(&self) {
        if let Some(h) = self.probe.lock().take() {
            h.abort();
        }
    }
}

/// Where a report comes from (its thresholds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Active probes.
    Active,
    /// Real traffic.
    Passive,
}

#[derive(Default)]
struct Targets {
    list: Vec<Arc<Target>>,
    /// Node addresses are the operator's: foldhash, not SipHash (looked up twice per request).
    by_addr: crate::fastmap::FastMap<(IpAddr, u16), usize>,
    /// `checks.active.port`, kept here so that a node lookup takes this one lock only.
    port: Option<u16>,
}

impl Targets {
    fn of(&self, addr: SocketAddr) -> Option<&Arc<Target>> {
        let port = self.port.unwrap_or(addr.port());
        self.by_addr.get(&(addr.ip(), port)).map(|&i| &self.list[i])
    }
}

/// Counts live probe tasks (for tests and leak checks).
#[derive(Default)]
pub struct ProbeCount(AtomicUsize);

impl ProbeCount {
    /// Live probe tasks.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

struct ProbeGuard(Arc<ProbeCount>);
impl Drop for ProbeGuard {
    fn drop(&mut self) {
        (self.0).0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The checker of one resource.
pub struct Checker {
    /// `/<prefix>/<kind>/<id>`.
    pub name: String,
    /// `(kind, id)` of the resource.
    pub owner: (String, String),
    checks: RwLock<Arc<Checks>>,
    targets: RwLock<Targets>,
    semaphore: RwLock<Arc<Semaphore>>,
    runtime: Handle,
    probes: Arc<ProbeCount>,
    all_down: AtomicBool,
    stopped: AtomicBool,
}

fn target_key(checks: &Checks, node: SocketAddr) -> TargetKey {
    let port = checks.active.port.unwrap_or(node.port());
    let hostname = checks.active.host.clone().unwrap_or_else(|| node.ip().to_string());
    TargetKey { ip: node.ip(), port, hostname }
}

fn default_passive() -> Passive {
    Passive { check_type: ProbeType::Http, healthy: Default::default(), unhealthy: Default::default() }
}

impl Checker {
    /// Creates a checker for the nodes at `nodes` and starts its probes on `runtime`.
    pub fn start(
        name: String,
        owner: (String, String),
        checks: Arc<Checks>,
        nodes: &[SocketAddr],
        runtime: Handle,
        probes: Arc<ProbeCount>,
    ) -> Arc<Checker> {
        let checker = Arc::new(Checker {
            name,
            owner,
            semaphore: RwLock::new(Arc::new(Semaphore::new(checks.active.concurrency.max(1) as usize))),
            checks: RwLock::new(checks),
            targets: RwLock::new(Targets::default()),
            runtime,
            probes,
            all_down: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        });
        checker.sync_nodes(nodes);
        log::info!("health checker {} started", checker.name);
        checker
    }

    /// The configuration in force.
    pub fn checks(&self) -> Arc<Checks> {
        self.checks.read().clone()
    }

    /// Applies a new node set: surviving targets keep their state, new ones start healthy,
    /// removed ones stop being probed and reported at once.
    pub fn sync_nodes(self: &Arc<Self>, nodes: &[SocketAddr]) {
        let checks = self.checks();
        let mut wanted: Vec<TargetKey> = Vec::new();
        for n in nodes {
            let k = target_key(&checks, *n);
            if !wanted.contains(&k) {
                wanted.push(k);
            }
        }
        let mut targets = self.targets.write();
        let mut list = Vec::with_capacity(wanted.len());
        for key in wanted {
            match targets.list.iter().find(|t| t.key == key) {
                Some(t) => list.push(t.clone()),
                None => {
                    let t = Target::new(key);
                    self.spawn_probe(&t);
                    list.push(t);
                }
            }
        }
        for old in &targets.list {
            if !list.iter().any(|t| Arc::ptr_eq(t, old)) {
                old.stop_probe();
            }
        }
        let by_addr = list.iter().enumerate().map(|(i, t)| ((t.key.ip, t.key.port), i)).collect();
        *targets = Targets { list, by_addr, port: checks.active.port };
    }

    /// Applies a changed `checks`: thresholds and probe settings change; targets whose identity
    /// survives keep their state.
    pub fn update_checks(self: &Arc<Self>, checks: Arc<Checks>, nodes: &[SocketAddr]) {
        *self.semaphore.write() = Arc::new(Semaphore::new(checks.active.concurrency.max(1) as usize));
        *self.checks.write() = checks;
        self.sync_nodes(nodes);
        log::info!("health checker {}: checks changed, thresholds rebuilt", self.name);
    }

    /// Stops every probe; the checker reports nothing more.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        for t in &self.targets.read().list {
            t.stop_probe();
        }
        log::info!("health checker {} stopped", self.name);
    }

    fn spawn_probe(self: &Arc<Self>, target: &Arc<Target>) {
        let weak = Arc::downgrade(self);
        let t = target.clone();
        self.probes.0.fetch_add(1, Ordering::SeqCst);
        let guard = ProbeGuard(self.probes.clone());
        let handle = self.runtime.spawn(async move {
            let _guard = guard;
            probe_loop(weak, t).await;
        });
        *target.probe.lock() = Some(handle.abort_handle());
    }

    fn target(&self, addr: SocketAddr) -> Option<Arc<Target>> {
        self.targets.read().of(addr).cloned()
    }

    /// Whether the node at `addr` may take traffic (unknown nodes may).
    pub fn takes_traffic(&self, addr: SocketAddr) -> bool {
        self.targets.read().of(addr).is_none_or(|t| t.status().takes_traffic())
    }

    /// Notes whether the balancer had to fall back to all nodes; logs transitions only.
    pub fn note_fallback(&self, all_down: bool) {
        if self.all_down.swap(all_down, Ordering::Relaxed) != all_down {
            if all_down {
                log::warn!("{}: no node is healthy; using all nodes", self.name);
            } else {
                log::info!("{}: healthy nodes are back; unhealthy nodes avoided again", self.name);
            }
        }
    }

    /// Reports an observation about the node at `addr`; `reason` is written out only for a
    /// failure (a proxied request's success formats nothing).
    pub fn report(&self, addr: SocketAddr, report: Report, source: Source, reason: &dyn std::fmt::Display) {
        if let Some(t) = self.target(addr) {
            self.report_target(&t, report, source, reason);
        }
    }

    /// Reports the status a proxied request got (passive lists; only with `checks.passive`).
    pub fn report_status(&self, addr: SocketAddr, status: u16) {
        let checks = self.checks();
        let Some(passive) = &checks.passive else { return };
        let report = if passive.healthy.http_statuses.contains(&status) {
            Report::Success
        } else if passive.unhealthy.http_statuses.contains(&status) {
            Report::HttpFailure
        } else {
            return;
        };
        self.report(addr, report, Source::Passive, &format_args!("http status {status}"));
    }

    fn threshold(&self, report: Report, source: Source) -> u8 {
        let checks = self.checks();
        match source {
            Source::Active => {
                let a: &Active = &checks.active;
                match report {
                    Report::Success => a.healthy.successes,
                    Report::HttpFailure => a.unhealthy.http_failures,
                    Report::TcpFailure => a.unhealthy.tcp_failures,
                    Report::Timeout => a.unhealthy.timeouts,
                }
            }
            Source::Passive => {
                let fallback = default_passive();
                let p = checks.passive.as_ref().unwrap_or(&fallback);
                match report {
                    Report::Success => p.healthy.successes,
                    Report::HttpFailure => p.unhealthy.http_failures,
                    Report::TcpFailure => p.unhealthy.tcp_failures,
                    Report::Timeout => p.unhealthy.timeouts,
                }
            }
        }
    }

    fn report_target(&self, t: &Target, report: Report, source: Source, reason: &dyn std::fmt::Display) {
        if self.stopped.load(Ordering::Relaxed) {
            return;
        }
        let threshold = self.threshold(report, source);
        let mut inner = t.inner.lock();
        let Some(outcome) = apply(t.status(), &mut inner.counter, report, threshold) else { return };
        if report != Report::Success {
            inner.last_failure = Some(reason.to_string());
        }
        if outcome.to != outcome.from {
            t.status.store(outcome.to as u8, Ordering::Release);
            inner.changed_at = Some(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
            log::info!(
                "target {}:{} {}: {} {}/{}",
                t.key.ip,
                t.key.port,
                outcome.to.as_str(),
                report.label(),
                outcome.count,
                threshold
            );
        }
    }

    /// The entry `/v1/healthcheck` reports.
    pub fn entry(&self) -> Entry {
        let checks = self.checks();
        let check_type = match checks.active.probe_type {
            ProbeType::Http => "http",
            ProbeType::Https => "https",
            ProbeType::Tcp => "tcp",
        };
        let nodes = self
            .targets
            .read()
            .list
            .iter()
            .map(|t| {
                let inner = t.inner.lock();
                NodeReport {
                    ip: t.key.ip.to_string(),
                    port: t.key.port,
                    hostname: t.key.hostname.clone(),
                    status: t.status().as_str(),
                    counter: inner.counter,
                    last_failure: inner.last_failure.clone(),
                    changed_at: inner.changed_at.clone(),
                }
            })
            .collect();
        Entry { name: self.name.clone(), check_type, nodes, owner: self.owner.clone() }
    }
}

async fn probe_loop(checker: Weak<Checker>, target: Arc<Target>) {
    loop {
        let (interval, semaphore, active) = {
            let Some(c) = checker.upgrade() else { return };
            let checks = c.checks();
            let interval = if target.status().healthy_side() {
                checks.active.healthy.interval
            } else {
                checks.active.unhealthy.interval
            };
            let semaphore = c.semaphore.read().clone();
            (interval, semaphore, checks.active.clone())
        };
        tokio::time::sleep(Duration::from_secs(u64::from(interval.max(1)))).await;
        let Ok(_permit) = semaphore.acquire_owned().await else { return };
        let result = probe(&active, &target.key).await;
        let Some(c) = checker.upgrade() else { return };
        if let Some((report, reason)) = result {
            c.report_target(&target, report, Source::Active, &reason);
        }
    }
}

/// One probe: `None` when the answer is in neither status list.
async fn probe(active: &Active, key: &TargetKey) -> Option<(Report, String)> {
    let addr = SocketAddr::new(key.ip, key.port);
    let limit = crate::resources::model::secs(active.timeout);
    let tcp = match tokio::time::timeout(limit, TcpStream::connect(addr)).await {
        Err(_) => return Some((Report::Timeout, "timeout: connect".into())),
        Ok(Err(e)) => return Some((Report::TcpFailure, format!("tcp failure: connect: {e}"))),
        Ok(Ok(s)) => s,
    };
    let _ = tcp.set_nodelay(true);
    let status = match active.probe_type {
        ProbeType::Tcp => return Some((Report::Success, String::new())),
        ProbeType::Http => http_status(tcp, active, key, limit).await,
        ProbeType::Https => {
            let config = Arc::new(crate::tls::client_config(active.https_verify_certificate));
            let name = match key.hostname.parse::<IpAddr>() {
                Ok(ip) => rustls::pki_types::ServerName::IpAddress(ip.into()),
                Err(_) => match rustls::pki_types::ServerName::try_from(key.hostname.clone()) {
                    Ok(n) => n,
                    Err(e) => return Some((Report::TcpFailure, format!("tcp failure: bad host name: {e}"))),
                },
            };
            let tls = tokio_rustls::TlsConnector::from(config);
            match tokio::time::timeout(limit, tls.connect(name, tcp)).await {
                Err(_) => return Some((Report::Timeout, "timeout: tls handshake".into())),
                Ok(Err(e)) => return Some((Report::TcpFailure, format!("tcp failure: tls: {e}"))),
                Ok(Ok(s)) => http_status(s, active, key, limit).await,
            }
        }
    };
    let status = match status {
        Ok(s) => s,
        Err(failure) => return Some(failure),
    };
    if active.healthy.http_statuses.contains(&status) {
        Some((Report::Success, String::new()))
    } else if active.unhealthy.http_statuses.contains(&status) {
        Some((Report::HttpFailure, format!("http failure: status {status}")))
    } else {
        None
    }
}

/// Sends the probe request and reads the status line only (unparsable: status 0).
async fn http_status<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    active: &Active,
    key: &TargetKey,
    limit: Duration,
) -> Result<u16, (Report, String)> {
    let mut req = format!("GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", active.http_path, key.hostname);
    for h in &active.req_headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    let io = async {
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::with_capacity(64);
        let mut chunk = [0u8; 256];
        while !buf.contains(&b'\n') && buf.len() < 1024 {
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<Vec<u8>, std::io::Error>(buf)
    };
    match tokio::time::timeout(limit, io).await {
        Err(_) => Err((Report::Timeout, "timeout: http response".into())),
        Ok(Err(e)) => Err((Report::TcpFailure, format!("tcp failure: {e}"))),
        Ok(Ok(buf)) => {
            let line = String::from_utf8_lossy(&buf);
            let status = line
                .lines()
                .next()
                .filter(|l| l.starts_with("HTTP/"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            Ok(status)
        }
    }
}
