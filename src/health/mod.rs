//! Upstream health checking: the registry of checkers and the entries the control server reports.
//!
//! A checker exists per resource that owns an upstream with `checks`, from the first client
//! request that upstream serves (the seed's inclusion rule). All workers share one state per
//! target. Probes run on a dedicated thread with its own runtime, never on request workers.
//! When resources change, [`HealthRegistry::reconcile`] updates, rebuilds or stops checkers before
//! the new snapshot is published.

pub mod checker;
pub mod html;
pub mod state;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use schemars::JsonSchema;
use serde::Serialize;
use tokio::runtime::Handle;

use crate::resources::checks::Checks;
use checker::{Checker, ProbeCount};

/// Counters of one target.
#[derive(Debug, Clone, Copy, Default, Serialize, JsonSchema, PartialEq, Eq)]
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
#[derive(Debug, Clone, Serialize, JsonSchema)]
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
    /// Why the last failure was counted (Weir extra).
    pub last_failure: Option<String>,
    /// When the status last changed, RFC 3339 (Weir extra; null: never).
    pub changed_at: Option<String>,
}

/// One health-check entry (`/v1/healthcheck`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
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
pub struct HealthRegistry {
    prefix: String,
    checkers: RwLock<HashMap<(String, String), Arc<Checker>>>,
    runtime: OnceLock<Handle>,
    /// Live probe tasks.
    pub probes: Arc<ProbeCount>,
}

impl HealthRegistry {
    /// A registry naming entries under `prefix` (`deployment.prefix`).
    pub fn new(prefix: &str) -> Self {
        HealthRegistry {
            prefix: prefix.trim_end_matches('/').to_owned(),
            checkers: RwLock::new(HashMap::new()),
            runtime: OnceLock::new(),
            probes: Arc::new(ProbeCount::default()),
        }
    }

    /// The probe runtime (a thread started on first use).
    fn runtime(&self) -> Handle {
        self.runtime
            .get_or_init(|| {
                let (tx, rx) = std::sync::mpsc::channel();
                let spawned = std::thread::Builder::new().name("health-probes".into()).spawn(move || {
                    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(rt) => {
                            let _ = tx.send(Some(rt.handle().clone()));
                            rt.block_on(std::future::pending::<()>());
                        }
                        Err(e) => {
                            log::error!("health probes: cannot build runtime: {e}");
                            let _ = tx.send(None);
                        }
                    }
                });
                let handle = spawned.ok().and_then(|_| rx.recv().ok().flatten());
                // Without a probe runtime, fall back to the caller's runtime (probes still run).
                handle.unwrap_or_else(Handle::current)
            })
            .clone()
    }

    /// The checker of the upstream owned by `owner` (`(kind, id)`), started with `checks` over
    /// the nodes at `nodes` unless it runs already.
    pub fn checker(&self, owner: (&str, &str), checks: &Checks, nodes: &[SocketAddr]) -> Arc<Checker> {
        let key = (owner.0.to_owned(), owner.1.to_owned());
        let mut checkers = self.checkers.write();
        if let Some(c) = checkers.get(&key) {
            return c.clone();
        }
        let name = format!("{}/{}/{}", self.prefix, key.0, key.1);
        let c = Checker::start(name, key.clone(), Arc::new(checks.clone()), nodes, self.runtime(), self.probes.clone());
        checkers.insert(key, c.clone());
        c
    }

    /// Brings the running checkers in line with a new configuration: `wanted(kind, id)` gives
    /// the checks and node addresses of the upstream that resource owns now (`None`: gone, or no
    /// longer checked). Checkers no longer wanted stop; the others take the new checks or nodes,
    /// keeping their targets' state. Returns the survivors by owner.
    pub fn reconcile(
        &self,
        wanted: impl Fn(&str, &str) -> Option<(Checks, Vec<SocketAddr>)>,
    ) -> Vec<((String, String), Arc<Checker>)> {
        let mut checkers = self.checkers.write();
        let mut kept = Vec::new();
        checkers.retain(|owner, checker| match wanted(&owner.0, &owner.1) {
            None => {
                checker.stop();
                false
            }
            Some((checks, nodes)) => {
                if *checker.checks() != checks {
                    checker.update_checks(Arc::new(checks), &nodes);
                } else {
                    checker.sync_nodes(&nodes);
                }
                kept.push((owner.clone(), checker.clone()));
                true
            }
        });
        kept
    }

    /// Every reported entry, ordered by name.
    pub fn entries(&self) -> Vec<Entry> {
        let mut entries: Vec<Entry> = self.checkers.read().values().map(|c| c.entry()).collect();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        entries
    }

    /// The entry of one resource.
    pub fn entry(&self, kind: &str, id: &str) -> Option<Entry> {
        self.checkers.read().get(&(kind.to_owned(), id.to_owned())).map(|c| c.entry())
    }
}
