//! The Weir plugin SDK.
//!
//! Everything a plugin author needs, and nothing of the host: the [`Plugin`] trait (identity, schemas,
//! control endpoints, construction of a runtime instance from a validated configuration), the
//! request-phase hooks of [`PluginInstance`], the per-request [`RequestCtx`], and the
//! [`register_plugin!`] macro that makes a plugin visible to the host at link time.
//!
//! A plugin crate depends on this crate only. The host collects every registered plugin with
//! `inventory`, sorts them by priority (descending) and name, and rejects duplicates.

pub mod cidr;
pub mod control;
pub mod headers;
pub mod logfile;
pub mod metrics;
pub mod phase;
pub mod schema;
pub mod stream;

use std::any::Any;
use std::sync::Arc;

pub use bytes::Bytes;
pub use control::{ControlEndpoint, ControlFuture, ControlHandler, ControlRequest, ControlResponse};
pub use headers::{HeaderOps, NamedHeaderOps};
pub use http;
pub use phase::{version_str, Consumer, Flow, FlowFuture, PluginInstance, PluginResponse, RequestCtx, ResponseHead};
pub use schema::{schema_of, serialized_schema_of};
pub use schemars;
pub use serde_json::{self, Value};
pub use stream::{StreamCtx, StreamFlow, StreamInstance, StreamPlugin};

#[doc(hidden)]
pub use inventory;

/// Deserializes a validated plugin configuration (or metadata) into its Rust type, without
/// copying the JSON value.
pub fn parse_conf<T: serde::de::DeserializeOwned>(conf: &Value) -> Result<T, String> {
    T::deserialize(conf).map_err(|e| e.to_string())
}

/// The raw value of argument `name` in a query string (`""` when it has no value).
pub fn query_arg<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}

/// Shared, per-snapshot state a plugin derives from all consumers (for example an index from
/// credential to consumer). Built once per resource snapshot, handed to every [`Plugin::build`].
pub type SharedState = Arc<dyn Any + Send + Sync>;

/// Where the plugin may keep state: given to [`Plugin::init`].
#[derive(Debug, Clone)]
pub struct InitEnv {
    /// `<prefix>/data`: durable files of plugins (created on demand by the plugin).
    pub data_dir: std::path::PathBuf,
    /// `weir -t`: validate only. The plugin must not open databases, create files or
    /// directories, or start threads; it reports what is malformed and returns.
    pub check_only: bool,
}

/// One consumer as seen by a plugin while a snapshot is being built.
pub struct ConsumerRef<'a> {
    /// The consumer's username (its identity).
    pub username: &'a str,
    /// This plugin's configuration inside the consumer, validated against `consumer_schema`.
    pub conf: &'a Value,
}

/// What the host hands to [`Plugin::build`] besides the configuration itself.
pub struct BuildContext<'a> {
    /// Where the configuration comes from, e.g. `routes[3]`; for messages.
    pub owner: &'a str,
    /// The plugin's metadata object (validated against `metadata_schema`), if one is configured.
    pub metadata: Option<&'a Value>,
    /// The result of [`Plugin::prepare_consumers`] for this snapshot, if the plugin returned one.
    pub shared: Option<&'a SharedState>,
    /// `weir -t`: build an instance that validates its configuration but opens nothing (no
    /// files, no connections); it never serves a request.
    pub check_only: bool,
}

/// A listener a plugin asks the host to serve: its endpoints answer exact URIs (a trailing `*`
/// matches a prefix); anything else is a JSON 404.
pub struct PluginListener {
    /// Address to bind.
    pub addr: std::net::SocketAddr,
    /// The configuration key the address comes from, for messages
    /// (`plugin_attr.prometheus.export_addr`).
    pub key: String,
    /// What it serves.
    pub endpoints: Vec<ControlEndpoint>,
}

/// A gateway plugin. Implementations are registered with [`register_plugin!`].
///
/// Identity and schemas are reported verbatim by the control server's `GET /v1/schema`, and the very
/// same schemas validate configuration: there is one source of truth.
pub trait Plugin: Send + Sync + 'static {
    /// Unique name, e.g. `key-auth`; the key under a resource's `plugins`.
    fn name(&self) -> &'static str;
    /// Higher runs first within a phase.
    fn priority(&self) -> i32;
    /// Plugin version, reported in `/v1/schema`.
    fn version(&self) -> f64 {
        0.1
    }
    /// Optional plugin type (`auth` for authentication plugins).
    fn plugin_type(&self) -> Option<&'static str> {
        None
    }
    /// JSON Schema of the plugin's configuration on routes, services and global rules.
    fn schema(&self) -> Value;
    /// JSON Schema of the plugin's configuration inside a consumer.
    fn consumer_schema(&self) -> Option<Value> {
        None
    }
    /// JSON Schema of the plugin's metadata object (`plugin_metadata` resources, `id` excluded).
    fn metadata_schema(&self) -> Option<Value> {
        None
    }
    /// JSON Schema of `plugin_attr.<name>` in config.yaml (process-level settings).
    fn attr_schema(&self) -> Option<Value> {
        None
    }
    /// Called when the plugin is enabled (at start-up and on `PUT /v1/plugins/reload`) with its
    /// validated `plugin_attr`, before any instance is built. Must be idempotent.
    fn init(&self, _attr: Option<&Value>, _env: &InitEnv) -> Result<(), String> {
        Ok(())
    }
    /// Called once when the process stops gracefully, after in-flight requests finished: flush
    /// and close what the plugin holds (e.g. log files).
    fn shutdown(&self) {}
    /// Called on SIGUSR1: reopen log files (after rotation).
    fn reopen_logs(&self) {}
    /// Endpoints mounted on the control server while the plugin is enabled.
    fn control_endpoints(&self) -> Vec<ControlEndpoint> {
        Vec::new()
    }
    /// A listener of its own that the host serves for the plugin (a metrics exporter), given
    /// the plugin's validated `plugin_attr`. Bound at start-up when the plugin is enabled; a
    /// failure to bind refuses the start, naming [`PluginListener::key`].
    fn listener(&self, _attr: Option<&Value>) -> Option<PluginListener> {
        None
    }
    /// Derives per-snapshot state from every consumer carrying this plugin. An error rejects the
    /// whole snapshot (for example two consumers with the same key).
    fn prepare_consumers(&self, _consumers: &[ConsumerRef<'_>]) -> Result<Option<SharedState>, String> {
        Ok(None)
    }
    /// Builds the runtime instance for one validated configuration. Called once per configuration
    /// per snapshot, never per request.
    fn build(&self, conf: &Value, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String>;
}

/// Link-time registration record; create it with [`register_plugin!`].
pub struct Registration {
    /// Constructs the plugin; called once per process.
    pub make: fn() -> Box<dyn Plugin>,
}

inventory::collect!(Registration);

/// Every plugin registered in the final binary, in link order (unsorted, possibly with duplicates:
/// the host sorts and rejects duplicates).
pub fn registered() -> impl Iterator<Item = &'static Registration> {
    inventory::iter::<Registration>.into_iter()
}

/// Registers a plugin with the host. `$make` is an expression producing the plugin value.
///
/// ```ignore
/// weir_plugin::register_plugin!(MyPlugin);
/// ```
#[macro_export]
macro_rules! register_plugin {
    ($make:expr) => {
        $crate::inventory::submit! {
            $crate::Registration { make: || ::std::boxed::Box::new($make) }
        }
    };
}
