//! Weir: a plugin-host API gateway.
//!
//! One process serves the data plane (client traffic through plugins to upstreams) and the control
//! server (the instance's state and controls, on loopback only). See `ARCHITECTURE.md` for the map.

// Plugin crates chosen with cargo features, linked by the list `build.rs` makes from
// Cargo.toml's `[features]` (each must be referenced, or the linker drops it and its
// `inventory` registration with it), and `PLUGIN_FEATURES`.
#![allow(unused_extern_crates)]
include!(concat!(env!("OUT_DIR"), "/plugins.rs"));

pub mod access_log;
pub mod acme;
pub mod admin;
pub mod cli;
pub mod config;
pub mod control;
pub mod control_routes;
pub mod dataplane;
pub mod deadline;
pub mod decimal;
pub mod dns;
pub mod error;
pub mod error_log;
pub mod etcd;
pub mod fastmap;
#[doc(hidden)]
pub mod fuzzing;
pub mod handover;
pub mod health;
pub mod memory;
pub mod metrics;
pub mod mtls;
pub mod normalize;
pub mod openapi;
pub mod plugins;
pub mod proxy_protocol;
pub mod resources;
pub mod route_stats;
pub mod run;
pub mod state;
pub mod stream;
pub mod tables;
pub mod tls;
pub mod validate;
pub mod watch;

use std::sync::OnceLock;

use plugins::Catalog;

static CATALOG: OnceLock<Result<Catalog, String>> = OnceLock::new();

/// The catalog of compiled-in plugins, or why it is unusable (e.g. two plugins with one name).
pub fn try_plugins_catalog() -> Result<&'static Catalog, &'static str> {
    match CATALOG.get_or_init(Catalog::discover) {
        Ok(c) => Ok(c),
        Err(e) => Err(e.as_str()),
    }
}

/// The catalog of compiled-in plugins. `main` checks [`try_plugins_catalog`] first, so an
/// unusable catalog never reaches a caller of this; it would read as empty.
pub fn plugins_catalog() -> &'static Catalog {
    static EMPTY: OnceLock<Catalog> = OnceLock::new();
    try_plugins_catalog().unwrap_or_else(|_| EMPTY.get_or_init(Catalog::empty))
}

/// Turns off `tracing` instrumentation inside dependencies (h2, actix). They are built with
/// tracing's `log` fallback, which, while no tracing subscriber is installed, builds and checks a
/// log record for every span h2 opens: about 9 % of the instructions of an HTTP/2 request. A
/// subscriber that is never interested makes each callsite a cached no-op. Weir logs through
/// `log`; the dependencies' tracing output is debug-level detail of their internals.
pub fn silence_tracing() {
    let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default());
}
