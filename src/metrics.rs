//! The host's own metrics: per-worker connection and request counters (written by their worker
//! only, summed at scrape time), and the metric sources that expose them, the health checkers'
//! view of upstream nodes, the node's identity and the access log's counters. The exporter (the
//! `prometheus` plugin) renders them through `weir_plugin::metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
pub use weir_plugin::metrics::bump;
use weir_plugin::metrics::{set_source, Exposition};

use crate::state::Gateway;

/// Counters of one data-plane worker. Each is written by its worker thread only (a load and a
/// store, no locked instruction) and read by the scrape.
#[derive(Default)]
pub struct WorkerStats {
    /// Client connections accepted (HTTP listeners).
    pub accepted: AtomicU64,
    /// Client connections open.
    pub active: AtomicU64,
    /// Connections in their TLS handshake or protocol detection.
    pub reading: AtomicU64,
    /// Requests being processed (from request head to response head).
    pub writing: AtomicU64,
    /// Requests received.
    pub requests: AtomicU64,
    /// Idle HTTP/1.1 connections parked (holding no server state; `h1server`).
    pub parked: AtomicU64,
    /// Of those, the ones parked outside any task (plain TCP: the worker's idle set holds the
    /// socket).
    pub parked_sockets: AtomicU64,
    /// Parked connections closed to make room when accept ran out of descriptors.
    pub reclaimed: AtomicU64,
}

/// A gauge raised by one while this lives: lowered however the scope ends (a drop guard).
pub struct Raised<'a>(&'a AtomicU64);

impl<'a> Raised<'a> {
    /// Raises `gauge` (a [`WorkerStats`] counter: written by its worker only).
    pub fn new(gauge: &'a AtomicU64) -> Self {
        bump(gauge, 1);
        Raised(gauge)
    }
}

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        bump(self.0, -1);
    }
}

static WORKERS: Mutex<Vec<Arc<WorkerStats>>> = Mutex::new(Vec::new());

impl WorkerStats {
    /// Counters for a new worker, included in every scrape from now on.
    pub fn register() -> Arc<WorkerStats> {
        let stats = Arc::new(WorkerStats::default());
        WORKERS.lock().push(stats.clone());
        stats
    }
}

/// The sum over every worker.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections open.
    pub active: u64,
    /// Connections handshaking.
    pub reading: u64,
    /// Requests in progress.
    pub writing: u64,
    /// Requests received.
    pub requests: u64,
    /// Connections parked.
    pub parked: u64,
    /// Of those, parked outside any task.
    pub parked_sockets: u64,
    /// Idle connections closed for want of descriptors.
    pub reclaimed: u64,
}

/// Sums the counters of every worker.
pub fn totals() -> Totals {
    let mut t = Totals::default();
    for w in WORKERS.lock().iter() {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        t.accepted += get(&w.accepted);
        t.active += get(&w.active);
        t.reading += get(&w.reading);
        t.writing += get(&w.writing);
        t.requests += get(&w.requests);
        t.parked += get(&w.parked);
        t.parked_sockets += get(&w.parked_sockets);
        t.reclaimed += get(&w.reclaimed);
    }
    t
}

/// This machine's host name (`node_info`).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Registers the host's sources; they hold the gateway weakly.
pub fn register_sources(gateway: &Arc<Gateway>) {
    set_source("connections", |e| write_connections(e, totals()));
    let host = hostname();
    set_source("node", move |e| {
        e.family("node_info", "gauge", "Info of the Weir node.");
        e.sample("node_info", &[("hostname", &host), ("version", env!("CARGO_PKG_VERSION"))], 1);
    });
    let gw: Weak<Gateway> = Arc::downgrade(gateway);
    set_source("upstream", move |e| {
        if let Some(gw) = gw.upgrade() {
            write_upstream_status(e, &gw);
        }
    });
    let gw: Weak<Gateway> = Arc::downgrade(gateway);
    set_source("provider", move |e| {
        if let Some(gw) = gw.upgrade() {
            let status = gw.provider_status.lock();
            if status.provider == "etcd" {
                e.family("etcd_reachable", "gauge", "Whether etcd is reachable (1) or not (0).");
                e.sample("etcd_reachable", &[], u8::from(status.connected));
                if let Some(rev) = status.revision {
                    e.family("etcd_modify_indexes", "gauge", "The etcd revision of the resources in force.");
                    e.sample("etcd_modify_indexes", &[("key", "prefix_index")], rev);
                }
            }
        }
    });
    let gw: Weak<Gateway> = Arc::downgrade(gateway);
    set_source("certificates", move |e| {
        if let Some(gw) = gw.upgrade() {
            let snap = gw.resources.load();
            let certs = snap.certs.expiries();
            if !certs.is_empty() {
                e.family(
                    "ssl_certificate_expiry_timestamp_seconds",
                    "gauge",
                    "When each served certificate expires (Unix seconds), by ssls entry and server name.",
                );
                for (id, sni, not_after) in certs {
                    e.sample("ssl_certificate_expiry_timestamp_seconds", &[("ssl_id", &id), ("sni", &sni)], not_after);
                }
            }
        }
    });
    set_source("access_log", |e| {
        if let Some(stats) = crate::access_log::stats() {
            e.family("access_log_lines_total", "counter", "Access log lines written.");
            e.sample("access_log_lines_total", &[], stats.written);
            e.family("access_log_dropped_total", "counter", "Access log lines dropped because the writer fell behind.");
            e.sample("access_log_dropped_total", &[], stats.dropped);
        }
    });
}

/// `http_requests_total` and the connection gauges, under nginx's names (what APISIX exports and
/// its dashboards read).
pub fn write_connections(e: &mut Exposition, t: Totals) {
    e.family("http_requests_total", "gauge", "The total number of client requests since Weir started.");
    e.sample("http_requests_total", &[], t.requests);
    e.family("nginx_http_current_connections", "gauge", "Number of HTTP connections.");
    // A connection serving several HTTP/2 streams counts once as active and once per stream as
    // writing: waiting never goes below zero.
    let waiting = t.active.saturating_sub(t.reading + t.writing);
    for (state, v) in [
        ("accepted", t.accepted),
        ("active", t.active),
        ("handled", t.accepted),
        ("reading", t.reading),
        ("waiting", waiting),
        ("writing", t.writing),
    ] {
        e.sample("nginx_http_current_connections", &[("state", state)], v);
    }
    e.family(
        "http_parked_connections",
        "gauge",
        "Idle HTTP/1.1 keep-alive connections that hold no server state or buffer (part of waiting).",
    );
    e.sample("http_parked_connections", &[], t.parked);
    e.family(
        "http_parked_sockets",
        "gauge",
        "Parked connections held as a bare socket in the worker's readiness set, outside any task (plain HTTP/1.1).",
    );
    e.sample("http_parked_sockets", &[], t.parked_sockets);
    e.family(
        "http_idle_connections_reclaimed_total",
        "counter",
        "Idle keep-alive connections closed to make room when accept ran out of file descriptors.",
    );
    e.sample("http_idle_connections_reclaimed_total", &[], t.reclaimed);
}

/// `upstream_status`: 1 for a node its checker finds healthy, 0 otherwise (checked upstreams only).
fn write_upstream_status(e: &mut Exposition, gw: &Gateway) {
    let entries = gw.health.entries();
    if entries.is_empty() {
        return;
    }
    e.family(
        "upstream_status",
        "gauge",
        "Upstream node health as the health checker sees it (1 healthy, 0 unhealthy).",
    );
    for entry in &entries {
        for node in &entry.nodes {
            let up = u8::from(node.status == "healthy" || node.status == "mostly_healthy");
            let port = node.port.to_string();
            e.sample("upstream_status", &[("name", &entry.name), ("ip", &node.ip), ("port", &port)], up);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_is_what_is_neither_reading_nor_writing() {
        let mut e = Exposition::new("weir_");
        write_connections(
            &mut e,
            Totals {
                accepted: 9,
                active: 5,
                reading: 1,
                writing: 3,
                requests: 40,
                parked: 0,
                parked_sockets: 0,
                reclaimed: 0,
            },
        );
        let text = e.into_text();
        assert!(text.contains("weir_http_requests_total 40\n"), "{text}");
        assert!(text.contains("weir_nginx_http_current_connections{state=\"waiting\"} 1\n"), "{text}");
        assert!(text.contains("weir_nginx_http_current_connections{state=\"accepted\"} 9\n"), "{text}");
    }

    #[test]
    fn bump_adds_and_subtracts() {
        let c = AtomicU64::new(0);
        bump(&c, 3);
        bump(&c, -1);
        assert_eq!(c.load(Ordering::Relaxed), 2);
    }
}
