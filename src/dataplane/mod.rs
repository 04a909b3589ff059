//! The data plane: client requests on `gateway.node_listen` and `gateway.ssl.listen`, checked for
//! framing, matched to routes, run through plugins, proxied to upstream nodes.
//!
//! Follow a request: `server` (accept; TLS with `resolver` over `certs`; HTTP/1.1 or HTTP/2) →
//! `guard` + `framing` (strict HTTP/1.1 framing) → `proxy::handle` (`normalize`, `router`, plugin
//! phases) → `upstream` (balancer) → `client` (pool, timeouts; HTTP/2 for gRPC) or `tunnel`
//! (WebSocket) → `body` (streaming back, log phase).

pub mod body;
pub mod certs;
pub mod client;
pub mod framing;
pub mod guard;
pub mod headers;
pub mod normalize;
pub mod proxy;
pub mod resolver;
pub mod router;
pub mod server;
pub mod tunnel;
pub mod upstream;

/// Seconds in-flight requests get to finish on SIGTERM.
pub const SHUTDOWN_GRACE_SECS: u64 = 30;
