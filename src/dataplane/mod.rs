//! The data plane: client requests on `gateway.node_listen` and `gateway.ssl.listen`, checked for
//! framing, matched to routes, run through plugins, proxied to upstream nodes.
//!
//! Follow a request: `server` (accept; TLS with `resolver` over `tables::certs`; HTTP/1.1 or
//! HTTP/2) → `h1server` (HTTP/1.1: each head parsed once by the strict `framing`) or `h2server` (HTTP/2) → `proxy::handle` (`normalize`,
//! `tables::router`, plugin phases) → `tables::upstream` (balancer) → `client` (pool; HTTP/2 for
//! gRPC) and `upstream_conn` (HTTP/1.1 exchange, timeouts; bytes by `h1codec`) or `tunnel` (WebSocket) → `body` (streaming back, log phase). The tables
//! come from the current snapshot (`crate::tables`); nothing here builds them.

pub mod body;
pub mod client;
pub mod framing;
pub mod h1codec;
pub mod h1server;
pub mod h2server;
pub mod h3;
pub mod headers;
pub mod idle;
pub use crate::normalize;
pub mod outbound;
pub mod proxy;
pub mod real_ip;
pub mod resolver;
pub mod server;
pub mod tunnel;
pub mod upstream_conn;

/// How long a connection may take to send a request head, and how long it may stay idle between
/// requests (nginx's `client_header_timeout`).
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Boxes the value `make` returns, made in its box: the box is allocated first, so the compiler
/// can build the value where it will live. `Box::new(make())` builds it on the stack and copies
/// it whole into the box allocated after it, and a request's future is several KiB: the HTTP/2
/// server's per-request box cost 700 instructions of copying per request in the release build,
/// and 8,200 in a build with line tables. For futures boxed once per request; on HTTP/1.1's
/// boxes (a connection's wake, `Finish`, a stream connection) it measured no difference.
pub(crate) fn boxed_in_place<T>(make: impl FnOnce() -> T) -> Box<T> {
    Box::write(Box::new_uninit(), make())
}
