//! Upstream health checking: the registry of checkers and the entries the control server reports.
//!
//! A checker exists per resource that owns an upstream with `checks`, once that upstream has served
//! a client request (the seed's inclusion rule). The data plane registers checkers; the control
//! server only reads [`HealthRegistry::entries`].

pub mod html;

use parking_lot::RwLock;
use serde::Serialize;

/// Counters of one target.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Counter {
    /// Successes.
    pub success: u8,
    /// HTTP failures.
    pub http_failure: u8,
    /// TCP failures.
    pub tcp_failure: u8,
    /// Timeouts.
    pub timeout_failure: u8,
}

/// One checked node as reported.
#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    /// IP address.
    pub ip: String,
    /// Port.
    pub port: u16,
    /// Host header / SNI of probes.
    pub hostname: String,
    /// `healthy`, `mostly_healthy`, `mostly_unhealthy`, `unhealthy`.
    pub status: &'static str,
    /// Counters.
    pub counter: Counter,
}

/// One health-check entry (`/v1/healthcheck`).
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// `/<prefix>/<kind>/<id>`.
    pub name: String,
    /// `http`, `https` or `tcp`.
    #[serde(rename = "type")]
    pub check_type: &'static str,
    /// Checked nodes.
    pub nodes: Vec<NodeReport>,
    #[serde(skip)]
    /// `(kind, id)` of the owning resource.
    pub owner: (String, String),
}

/// The checkers of this process.
#[derive(Default)]
pub struct HealthRegistry {
    entries: RwLock<Vec<Entry>>,
}

impl HealthRegistry {
    /// Every reported entry.
    pub fn entries(&self) -> Vec<Entry> {
        self.entries.read().clone()
    }
    /// The entry of one resource.
    pub fn entry(&self, kind: &str, id: &str) -> Option<Entry> {
        self.entries.read().iter().find(|e| e.owner.0 == kind && e.owner.1 == id).cloned()
    }
}
