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
