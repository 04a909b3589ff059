//! The Weir plugin SDK.
//!
//! Everything a plugin author needs, and nothing of the host: the [`Plugin`] trait (identity, a
//! typed configuration behind both schema and parser, control endpoints, construction of a
//! runtime instance), the request-phase hooks of [`PluginInstance`] (which may wait with the
//! request in hand), the per-request [`RequestCtx`] with typed [`slots`], the host's
//! [`services`] (its upstream client, upstream choice), waiting without blocking ([`timer`]),
//! bounded requests that outlive the client's ([`background`]), the credential kit of [`auth`], the
//! `$var` [`template`] engine, and the [`register_plugin!`] macro that makes a plugin visible to
//! the host at link time. `docs/plugin-sdk.md` (the [`guide`]) walks through each with examples.
//!
//! A plugin crate depends on this crate only. The host collects every registered plugin with
//! `inventory`, sorts them by priority (descending) and name, and rejects duplicates.

pub mod auth;
pub mod background;
pub mod batch;
pub mod body;
pub mod cache_zones;
pub mod cidr;
pub mod client_ip;
pub mod control;
pub mod expr;
pub mod headers;
pub mod jwt;
pub mod limit;
pub mod log_entry;
pub mod logfile;
pub mod measure;
pub mod meta;
pub mod metrics;
pub mod phase;
mod prehashed;
pub mod random;
pub mod resub;
pub mod schema;
pub mod services;
pub mod slots;
pub mod stream;
pub mod template;
#[cfg(feature = "testing")]
pub mod testing;
pub mod timer;

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

pub use bytes::Bytes;
pub use control::{ControlEndpoint, ControlFuture, ControlHandler, ControlRequest, ControlResponse};
pub use headers::{HeaderOps, NamedHeaderOps};
pub use http;
pub use phase::{
    version_str, BodyFilter, ClientCert, Consumer, Flow, Late, PluginInstance, PluginResponse, RequestCtx,
    ResponseHead, UpstreamAddrs, WaitFuture,
};
pub use schema::{schema_of, serialized_schema_of};
pub use schemars;
pub use serde_json::{self, Value};
pub use services::{HttpClient, NoServices, OutboundRequest, OutboundResponse, Services, UpstreamRef};
pub use stream::{StreamCtx, StreamFlow, StreamInstance, StreamPlugin};

#[doc(hidden)]
pub use inventory;

#[doc = include_str!("../../../docs/plugin-sdk.md")]
pub mod guide {}

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
    /// `gateway.proxy_cache` of config.yaml: the cache zones (checked, disk paths absolute).
    pub proxy_cache: cache_zones::ProxyCacheSection,
}

/// One consumer as seen by a plugin while a snapshot is being built.
pub struct ConsumerRef<'a> {
    /// The consumer's username (its identity).
    pub username: &'a str,
    /// The consumer as requests will carry it (attach it with [`auth::attach_consumer`]).
    pub consumer: &'a Arc<Consumer>,
    /// This plugin's configuration inside the consumer, validated against `consumer_schema`.
    pub conf: &'a Value,
}

/// Every consumer of the snapshot being built, by username: for plugins that name consumers in
/// their configuration (`anonymous_consumer`, consumer-restriction).
#[derive(Default)]
pub struct ConsumerDirectory {
    by_name: HashMap<Arc<str>, Arc<Consumer>>,
}

impl ConsumerDirectory {
    /// A directory of `consumers`.
    pub fn new(consumers: impl IntoIterator<Item = Arc<Consumer>>) -> Self {
        ConsumerDirectory { by_name: consumers.into_iter().map(|c| (c.username.clone(), c)).collect() }
    }
    /// The consumer named `username`.
    pub fn get(&self, username: &str) -> Option<&Arc<Consumer>> {
        self.by_name.get(username)
    }
}

/// The resource a plugin configuration belongs to.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    /// Its list: `routes`, `services`, `global_rules`, `consumers`, `consumer_groups`.
    pub kind: &'static str,
    /// Its id (a consumer's username); empty for an entry without one.
    pub id: &'a str,
    /// How messages name it: `routes[2] (id 7)`.
    pub label: &'a str,
}

impl fmt::Display for Owner<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label)
    }
}

/// What the host hands to [`Plugin::build`] besides the configuration itself.
pub struct BuildContext<'a> {
    /// The resource the configuration belongs to.
    pub owner: Owner<'a>,
    /// The configuration as written (`_meta` included): for a fingerprint of it that is the same
    /// on every instance (its keys are sorted).
    pub raw: &'a Value,
    /// The plugin's metadata object (validated against `metadata_schema`), if one is configured.
    pub metadata: Option<&'a Value>,
    /// The result of [`Plugin::prepare_consumers`] for this snapshot, if the plugin returned one.
    pub shared: Option<&'a SharedState>,
    /// Validation only (`weir -t`, an Admin API check): build an instance that validates its
    /// configuration but opens nothing (no files, no connections, no threads); it never serves
    /// a request.
    pub check_only: bool,
    /// Every consumer of the snapshot, by name.
    pub consumers: &'a ConsumerDirectory,
    /// The host's services: its upstream client, upstream choice.
    pub services: &'a dyn Services,
}

impl BuildContext<'_> {
    /// The plugin's shared consumer state as the type its [`Plugin::prepare_consumers`] made.
    /// `Ok(None)` when no consumer carries the plugin; an error (never a silent `None`) when the
    /// state is of another type.
    pub fn shared_as<T: Any + Send + Sync>(&self) -> Result<Option<Arc<T>>, String> {
        match self.shared {
            None => Ok(None),
            Some(s) => s
                .clone()
                .downcast::<T>()
                .map(Some)
                .map_err(|_| format!("internal error: the consumer state is not a {}", std::any::type_name::<T>())),
        }
    }
    /// The plugin's metadata parsed as `T` (`Ok(None)` when none is configured).
    pub fn metadata_as<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>, String> {
        self.metadata.map(|m| parse_conf(m).map_err(|e| format!("plugin metadata: {e}"))).transpose()
    }
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
/// The configuration type [`Plugin::Conf`] is the one source of truth: its JSON Schema (derived
/// with `schemars`, with APISIX's `_meta` added) is what `GET /v1/schema` reports and what
/// validates every configuration, and the same type is what [`Plugin::build`] receives.
pub trait Plugin: Send + Sync + 'static {
    /// The configuration on routes, services, global rules, consumers and consumer groups.
    type Conf: serde::de::DeserializeOwned + schemars::JsonSchema;
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
    /// JSON Schema of the plugin's credential inside a consumer (auth plugins).
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
    /// Derives per-snapshot state from every consumer carrying this plugin's credential. An error
    /// rejects the whole snapshot (for example two consumers with the same key).
    fn prepare_consumers(&self, _consumers: &[ConsumerRef<'_>]) -> Result<Option<SharedState>, String> {
        Ok(None)
    }
    /// Builds the runtime instance for one validated configuration. Called once per distinct
    /// configuration (instances are reused while their configuration, metadata and consumer
    /// state are unchanged), never per request.
    fn build(&self, conf: Self::Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String>;
    /// Whether [`Plugin::check_together`] is to be called (nothing is collected otherwise).
    fn checks_together(&self) -> bool {
        false
    }
    /// Whether this one configuration takes part in [`Plugin::check_together`] (limit-count's:
    /// only one with a `group`). A change to routes whose configurations all answer no is
    /// applied without checking the whole document again; the default is
    /// [`Plugin::checks_together`].
    fn checks_together_with(&self, _conf: &Value) -> bool {
        self.checks_together()
    }
    /// Checks every configuration of this plugin in one resource document together, once per
    /// build, after each was checked alone (and its instance built or reused): for rules that
    /// span resources, such as limit-count's `group` (routes sharing a group must configure it
    /// identically). The configurations come as written (`_meta` included). Returns the problems
    /// as (index into `confs`, message); any refuses the document.
    fn check_together(&self, _confs: &[(Owner<'_>, &Value)]) -> Vec<(usize, String)> {
        Vec::new()
    }
}

/// The host's view of a plugin: [`Plugin`] with its configuration type erased. Implemented for
/// every [`Plugin`]; plugin authors never implement it.
pub trait DynPlugin: Send + Sync + 'static {
    /// [`Plugin::name`].
    fn name(&self) -> &'static str;
    /// [`Plugin::priority`].
    fn priority(&self) -> i32;
    /// [`Plugin::version`].
    fn version(&self) -> f64;
    /// [`Plugin::plugin_type`].
    fn plugin_type(&self) -> Option<&'static str>;
    /// The schema of [`Plugin::Conf`], with `_meta` reserved.
    fn schema(&self) -> Value;
    /// [`Plugin::consumer_schema`].
    fn consumer_schema(&self) -> Option<Value>;
    /// [`Plugin::metadata_schema`].
    fn metadata_schema(&self) -> Option<Value>;
    /// [`Plugin::attr_schema`].
    fn attr_schema(&self) -> Option<Value>;
    /// [`Plugin::init`].
    fn init(&self, attr: Option<&Value>, env: &InitEnv) -> Result<(), String>;
    /// [`Plugin::shutdown`].
    fn shutdown(&self);
    /// [`Plugin::reopen_logs`].
    fn reopen_logs(&self);
    /// [`Plugin::control_endpoints`].
    fn control_endpoints(&self) -> Vec<ControlEndpoint>;
    /// [`Plugin::listener`].
    fn listener(&self, attr: Option<&Value>) -> Option<PluginListener>;
    /// [`Plugin::prepare_consumers`].
    fn prepare_consumers(&self, consumers: &[ConsumerRef<'_>]) -> Result<Option<SharedState>, String>;
    /// Parses a validated configuration (without its `_meta`) into [`Plugin::Conf`] and builds.
    fn build(&self, conf: &Value, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String>;
    /// [`Plugin::checks_together`].
    fn checks_together(&self) -> bool;
    /// [`Plugin::checks_together_with`].
    fn checks_together_with(&self, conf: &Value) -> bool;
    /// [`Plugin::check_together`].
    fn check_together(&self, confs: &[(Owner<'_>, &Value)]) -> Vec<(usize, String)>;
}

impl<P: Plugin> DynPlugin for P {
    fn name(&self) -> &'static str {
        Plugin::name(self)
    }
    fn priority(&self) -> i32 {
        Plugin::priority(self)
    }
    fn version(&self) -> f64 {
        Plugin::version(self)
    }
    fn plugin_type(&self) -> Option<&'static str> {
        Plugin::plugin_type(self)
    }
    fn schema(&self) -> Value {
        meta::with_meta(schema_of::<P::Conf>())
    }
    fn consumer_schema(&self) -> Option<Value> {
        Plugin::consumer_schema(self)
    }
    fn metadata_schema(&self) -> Option<Value> {
        Plugin::metadata_schema(self)
    }
    fn attr_schema(&self) -> Option<Value> {
        Plugin::attr_schema(self)
    }
    fn init(&self, attr: Option<&Value>, env: &InitEnv) -> Result<(), String> {
        Plugin::init(self, attr, env)
    }
    fn shutdown(&self) {
        Plugin::shutdown(self)
    }
    fn reopen_logs(&self) {
        Plugin::reopen_logs(self)
    }
    fn control_endpoints(&self) -> Vec<ControlEndpoint> {
        Plugin::control_endpoints(self)
    }
    fn listener(&self, attr: Option<&Value>) -> Option<PluginListener> {
        Plugin::listener(self, attr)
    }
    fn prepare_consumers(&self, consumers: &[ConsumerRef<'_>]) -> Result<Option<SharedState>, String> {
        Plugin::prepare_consumers(self, consumers)
    }
    fn build(&self, conf: &Value, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let parsed: P::Conf = match conf.get(meta::META) {
            None => parse_conf(conf)?,
            Some(_) => parse_conf(&meta::without_meta(conf))?,
        };
        Plugin::build(self, parsed, ctx)
    }
    fn checks_together(&self) -> bool {
        Plugin::checks_together(self)
    }
    fn checks_together_with(&self, conf: &Value) -> bool {
        Plugin::checks_together_with(self, conf)
    }
    fn check_together(&self, confs: &[(Owner<'_>, &Value)]) -> Vec<(usize, String)> {
        Plugin::check_together(self, confs)
    }
}

/// Link-time registration record; create it with [`register_plugin!`].
pub struct Registration {
    /// Constructs the plugin; called once per process.
    pub make: fn() -> Box<dyn DynPlugin>,
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
            $crate::Registration {
                make: || ::std::boxed::Box::new($make) as ::std::boxed::Box<dyn $crate::DynPlugin>
            }
        }
    };
}
