//! Stream plugins: plugins of the TCP/UDP proxy (`stream_routes`), the `stream` kind.
//!
//! A stream plugin sees connections, not requests. Its phases, per connection:
//! - `preread`, before any upstream is contacted (for TLS listeners, after the SNI is known):
//!   may let the connection go on, delay it, or close it;
//! - `connect`, once the upstream connection is established;
//! - `log`, when both directions have closed, with the byte counts and why it ended.
//!
//! They are listed under `stream-plugins` in `/v1/schema`, enabled by `stream_plugins:` in
//! config.yaml, and registered with [`register_stream_plugin!`](crate::register_stream_plugin).

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::InitEnv;

/// A stream plugin: identity, schema, and construction of instances.
pub trait StreamPlugin: Send + Sync + 'static {
    /// Unique name among stream plugins, e.g. `limit-conn`.
    fn name(&self) -> &'static str;
    /// Higher runs first within a phase.
    fn priority(&self) -> i32;
    /// Plugin version, reported in `/v1/schema`.
    fn version(&self) -> f64 {
        0.1
    }
    /// JSON Schema of the plugin's configuration on stream routes.
    fn schema(&self) -> Value;
    /// Called when the plugin is enabled (start-up and plugin reload). Must be idempotent.
    fn init(&self, _env: &InitEnv) -> Result<(), String> {
        Ok(())
    }
    /// Called once when the process stops gracefully.
    fn shutdown(&self) {}
    /// Called on SIGUSR1: reopen log files.
    fn reopen_logs(&self) {}
    /// Builds the runtime instance for one validated configuration (once per snapshot).
    fn build(&self, conf: &Value) -> Result<Arc<dyn StreamInstance>, String>;
}

/// What `preread` decided.
#[derive(Debug)]
pub enum StreamFlow {
    /// Go on with the next plugin, then the upstream.
    Continue,
    /// Go on after this delay (for example a connection over a soft limit).
    Delay(Duration),
    /// Close the connection; the reason is logged and given to the log phase.
    Close(String),
}

/// The hooks of a configured stream plugin. Every method has a do-nothing default.
pub trait StreamInstance: Send + Sync {
    /// Before the upstream is contacted.
    fn preread(&self, _ctx: &mut StreamCtx) -> StreamFlow {
        StreamFlow::Continue
    }
    /// The upstream connection is established (`ctx.upstream_addr` is set).
    fn connect(&self, _ctx: &mut StreamCtx) {}
    /// The connection has ended.
    fn log(&self, _ctx: &StreamCtx) {}
}

/// One proxied connection (TCP) or session (UDP), as plugins see it.
pub struct StreamCtx {
    /// `tcp` or `udp`.
    pub protocol: &'static str,
    /// The client.
    pub remote_addr: SocketAddr,
    /// The listener's address.
    pub local_addr: SocketAddr,
    /// The TLS server name the client asked for (TLS listeners).
    pub sni: Option<String>,
    /// The matched stream route.
    pub route_id: Option<Arc<str>>,
    /// The upstream node, once connected.
    pub upstream_addr: Option<SocketAddr>,
    /// Bytes received from the client.
    pub bytes_from_client: u64,
    /// Bytes sent to the client.
    pub bytes_to_client: u64,
    /// When the connection was accepted.
    pub started: Instant,
    /// Why the connection ended (`client closed`, `upstream closed`, `idle timeout`, a plugin's
    /// reason, a connect error).
    pub close_reason: String,
    held: Vec<Box<dyn Any + Send>>,
}

impl StreamCtx {
    /// A fresh context for a connection from `remote_addr` on `local_addr`.
    pub fn new(protocol: &'static str, remote_addr: SocketAddr, local_addr: SocketAddr) -> Self {
        StreamCtx {
            protocol,
            remote_addr,
            local_addr,
            sni: None,
            route_id: None,
            upstream_addr: None,
            bytes_from_client: 0,
            bytes_to_client: 0,
            started: Instant::now(),
            close_reason: String::new(),
            held: Vec::new(),
        }
    }

    /// Keeps `guard` for as long as the connection lives (dropped after the log phase), for
    /// example a slot of a connection limit.
    pub fn hold(&mut self, guard: Box<dyn Any + Send>) {
        self.held.push(guard);
    }
}

/// Link-time registration record of a stream plugin; create it with [`register_stream_plugin!`](crate::register_stream_plugin).
pub struct StreamRegistration {
    /// Constructs the plugin; called once per process.
    pub make: fn() -> Box<dyn StreamPlugin>,
}

inventory::collect!(StreamRegistration);

/// Every stream plugin registered in the final binary.
pub fn registered_stream() -> impl Iterator<Item = &'static StreamRegistration> {
    inventory::iter::<StreamRegistration>.into_iter()
}

/// Registers a stream plugin with the host. `$make` is an expression producing the plugin value.
#[macro_export]
macro_rules! register_stream_plugin {
    ($make:expr) => {
        $crate::inventory::submit! {
            $crate::stream::StreamRegistration { make: || ::std::boxed::Box::new($make) }
        }
    };
}
