//! The data plane: client requests on `gateway.node_listen`, checked for framing, matched to
//! routes, run through plugins, proxied to upstream nodes.
//!
//! Follow a request: `server` (accept, hyper) → `guard` + `framing` (strict request framing)
//! → `proxy::handle` (`normalize`, `router`, plugin phases) → `upstream` (balancer) → `client`
//! (pool, timeouts) → `body` (streaming back, log phase).

pub mod body;
pub mod certs;
pub mod client;
pub mod framing;
pub mod guard;
pub mod headers;
pub mod normalize;
pub mod proxy;
pub mod router;
pub mod server;
pub mod tls;
pub mod tunnel;
pub mod upstream;

/// Seconds in-flight requests get to finish on SIGTERM.
pub const SHUTDOWN_GRACE_SECS: u64 = 30;
