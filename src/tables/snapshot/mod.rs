//! Building an immutable, validated [`Snapshot`] from a raw resource document.
//!
//! Providers (the YAML file watcher today, etcd later) only produce raw documents; this module is
//! the single place where resources are validated: kind schemas, plugin schemas, references, and
//! construction of every plugin instance. A snapshot either builds completely or not at all.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use weir_plugin::PluginInstance;

mod checks;
mod compile;
mod parse;
mod patch;
mod plugins;

use parse::ParseCache;
pub use parse::{fingerprint, DocPrints, Fingerprint, Prints};
pub use patch::RouteChange;
pub use plugins::merge_chains;
use plugins::sort_chain;

use crate::config::unknown_plugin;
use crate::decimal::Decimal;
use crate::fastmap::FastMap;
use crate::plugins::{EnabledSet, PluginEntry};
use crate::resources::model::*;
use crate::tables::certs::CertTable;
use crate::tables::router::{CompiledRoute, RouteTable};
use crate::tables::stream_router::{BoundStreamPlugin, CompiledStreamRoute, StreamChain, StreamTable};
use crate::tables::upstream::CompiledUpstream;
use crate::validate::{CompiledSchema, Issue};

/// The top level of a resource document.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct ResourceFile {
    #[serde(default)]
    routes: Vec<Value>,
    #[serde(default)]
    services: Vec<Value>,
    #[serde(default)]
    upstreams: Vec<Value>,
    #[serde(default)]
    consumers: Vec<Value>,
    #[serde(default)]
    consumer_groups: Vec<Value>,
    #[serde(default)]
    credentials: Vec<Value>,
    #[serde(default)]
    global_rules: Vec<Value>,
    #[serde(default)]
    plugin_configs: Vec<Value>,
    #[serde(default)]
    plugin_metadata: Vec<Value>,
    #[serde(default)]
    ssls: Vec<Value>,
    #[serde(default)]
    stream_routes: Vec<Value>,
}

/// Compiled schemas of the resource kinds (compiled once per process).
pub struct KindSchemas {
    file: CompiledSchema,
    /// `(kind name, schema)`, in the order `/v1/schema` lists them.
    pub kinds: Vec<(&'static str, CompiledSchema)>,
}

impl KindSchemas {
    /// The process-wide instance.
    pub fn get() -> &'static KindSchemas {
        static SCHEMAS: OnceLock<KindSchemas> = OnceLock::new();
        SCHEMAS.get_or_init(|| {
            let compile = |v: Value| match CompiledSchema::new(v) {
                Ok(s) => s,
                // The schemas are derived from our own types; failing here is a programming error.
                Err(e) => panic!("built-in resource schema does not compile: {e}"),
            };
            KindSchemas {
                file: compile(weir_plugin::schema_of::<ResourceFile>()),
                kinds: vec![
                    ("route", compile(weir_plugin::schema_of::<Route>())),
                    ("service", compile(weir_plugin::schema_of::<Service>())),
                    ("upstream", compile(weir_plugin::schema_of::<Upstream>())),
                    ("consumer", compile(weir_plugin::schema_of::<Consumer>())),
                    ("consumer_group", compile(weir_plugin::schema_of::<ConsumerGroup>())),
                    ("credential", compile(weir_plugin::schema_of::<Credential>())),
                    ("global_rule", compile(weir_plugin::schema_of::<GlobalRule>())),
                    ("plugin_config", compile(weir_plugin::schema_of::<PluginConfig>())),
                    ("plugin_metadata", compile(weir_plugin::schema_of::<PluginMetadata>())),
                    ("ssl", compile(weir_plugin::schema_of::<Ssl>())),
                    ("stream_route", compile(weir_plugin::schema_of::<StreamRoute>())),
                ],
            }
        })
    }

    pub(crate) fn kind(&self, name: &str) -> &CompiledSchema {
        match self.kinds.iter().find(|(k, _)| *k == name) {
            Some((_, s)) => s,
            None => panic!("no schema for resource kind {name}"),
        }
    }

    /// The `main` object of `/v1/schema`.
    pub fn describe(&self) -> Value {
        Value::Object(self.kinds.iter().map(|(k, s)| ((*k).to_owned(), s.schema().clone())).collect())
    }
}

/// A plugin configuration bound to its runtime instance.
#[derive(Clone)]
pub struct BoundPlugin {
    /// The plugin.
    pub entry: Arc<PluginEntry>,
    /// The runtime instance built from the configuration.
    pub instance: Arc<dyn PluginInstance>,
    /// Its priority on this resource (`_meta.priority`, else the plugin's).
    pub priority: i32,
    /// The hooks after forwarding it uses (`PluginInstance::late`, read once).
    pub late: weir_plugin::Late,
    /// `_meta.error_response`: the body of this plugin's own error answers.
    pub error_response: Option<ErrorBody>,
    /// `_meta.filter`: the plugin runs only for the requests it holds for.
    pub filter: Option<Arc<weir_plugin::expr::Expr>>,
}

impl BoundPlugin {
    /// Whether the plugin runs for this request (its `_meta.filter`, if any, holds).
    #[inline]
    pub fn runs_for(&self, ctx: &weir_plugin::RequestCtx) -> bool {
        self.filter.as_ref().is_none_or(|f| f.matches(ctx))
    }
}

/// A body that replaces a plugin's own error answers (`_meta.error_response`).
#[derive(Clone)]
pub struct ErrorBody {
    /// The body.
    pub body: bytes::Bytes,
    /// Its `Content-Type`.
    pub content_type: &'static str,
}

/// Plugins of one resource (or of a request's merged resources), in priority order, with what
/// the data plane needs to know of them as a whole computed once.
#[derive(Default)]
pub struct Chain {
    plugins: Box<[BoundPlugin]>,
    /// Some plugin reads the request headers after forwarding (`Late::headers`).
    pub late_headers: bool,
    /// Some plugin needs the whole request body.
    pub wants_body: bool,
    /// Some plugin has a header filter.
    pub header_filters: bool,
    /// Some plugin has a log phase.
    pub logs: bool,
    /// Some plugin's log phase runs after every other's (`PluginInstance::log_last`).
    pub logs_last: bool,
}

impl std::ops::Deref for Chain {
    type Target = [BoundPlugin];
    fn deref(&self) -> &[BoundPlugin] {
        &self.plugins
    }
}

impl From<Vec<BoundPlugin>> for Chain {
    fn from(mut plugins: Vec<BoundPlugin>) -> Self {
        sort_chain(&mut plugins);
        Chain {
            late_headers: plugins.iter().any(|p| p.late.headers),
            wants_body: plugins.iter().any(|p| p.instance.wants_request_body()),
            header_filters: plugins.iter().any(|p| p.late.header_filter),
            logs: plugins.iter().any(|p| p.late.log),
            logs_last: plugins.iter().any(|p| p.late.log && p.instance.log_last()),
            plugins: plugins.into_boxed_slice(),
        }
    }
}

impl Chain {
    /// Whether `other` runs the same plugin instances, in the same order, the same way: a
    /// rebuild may then keep the chain (and what holds it) of the previous snapshot.
    pub fn same_as(&self, other: &Chain) -> bool {
        self.plugins.len() == other.plugins.len()
            && self.plugins.iter().zip(other.plugins.iter()).all(|(a, b)| {
                Arc::ptr_eq(&a.instance, &b.instance)
                    && a.priority == b.priority
                    && match (&a.filter, &b.filter) {
                        (None, None) => true,
                        (Some(x), Some(y)) => Arc::ptr_eq(x, y),
                        _ => false,
                    }
                    && a.error_response.as_ref().map(|e| (&e.body, e.content_type))
                        == b.error_response.as_ref().map(|e| (&e.body, e.content_type))
            })
    }
}

/// Plugins of one resource, in priority order.
pub type PluginChain = Arc<Chain>;

/// What a build is for.
#[derive(Clone, Copy)]
pub enum Mode<'p> {
    /// Checking a document (an Admin API write, `weir -t`): nothing real is built. Plugins
    /// build instances that open nothing, and no cache of the running snapshot is touched; what
    /// is compiled the same way in both (upstreams, routes) is taken from the snapshot given, the
    /// one serving, rather than compiled again (never its plugin instances or consumers).
    Validate(Option<&'p Snapshot>),
    /// Building the snapshot that will serve, reusing what is unchanged since `previous` (the one
    /// serving now): compiled upstreams with their balancer state, plugin instances, consumers.
    Apply(Option<&'p Snapshot>),
}

/// A plugin instance a later build may reuse: its plugin, the fingerprints of its configuration
/// and of the plugin's metadata, and whether it named upstream objects by id
/// (`Services::upstream_by_id`).
#[derive(Clone)]
pub(crate) struct Reusable {
    plugin: &'static str,
    conf: Fingerprint,
    meta: Fingerprint,
    instance: Arc<dyn PluginInstance>,
    names_upstreams: bool,
}

/// The key of a resource's reusable instances: `kind/id` (kinds have no `/`).
pub(crate) fn owner_key(kind: &str, id: &str) -> String {
    let mut key = String::with_capacity(kind.len() + 1 + id.len());
    key.push_str(kind);
    key.push('/');
    key.push_str(id);
    key
}

/// A complete, validated set of resources. Immutable: changes publish a new snapshot.
#[derive(Default)]
pub struct Snapshot {
    /// Routes, in file order.
    pub routes: Vec<Arc<Route>>,
    /// Services.
    pub services: Vec<Arc<Service>>,
    /// Upstream objects.
    pub upstreams: Vec<Arc<Upstream>>,
    /// Consumers.
    pub consumers: Vec<Arc<Consumer>>,
    /// Consumer groups.
    pub consumer_groups: Vec<Arc<ConsumerGroup>>,
    /// Global rules.
    pub global_rules: Vec<Arc<GlobalRule>>,
    /// Plugin configs.
    pub plugin_configs: Vec<Arc<PluginConfig>>,
    /// Plugin metadata of enabled plugins, in the order of the enabled list.
    pub plugin_metadata: Vec<PluginMetadata>,
    /// Plugin chains of services and global rules, keyed by `(kind, id)` (a route's own chain is
    /// merged into its compiled route, [`CompiledRoute::plugins`]).
    pub chains: FastMap<(&'static str, String), PluginChain>,
    /// The data plane's routing table.
    pub table: RouteTable,
    /// Plugins of every global rule, in priority order.
    pub global_chain: PluginChain,
    /// Every compiled upstream (objects, and inline ones of services and routes).
    pub compiled_upstreams: Vec<Arc<CompiledUpstream>>,
    /// `ssls` entries, as configured (keys included: never reported).
    pub ssls: Vec<Arc<Ssl>>,
    /// Certificates of the TLS listener, by server name.
    pub certs: CertTable,
    /// Stream routes, in file order.
    pub stream_routes: Vec<Arc<StreamRoute>>,
    /// The stream proxy's routing table.
    pub stream_table: StreamTable,
    /// Compiled upstream objects by id (what [`weir_plugin::UpstreamRef::Id`] names).
    pub upstream_objects: FastMap<String, Arc<CompiledUpstream>>,
    /// Every resource's place in its list by `(kind, id)`; routes too unless
    /// [`Snapshot::routes_by_id`]. Shared with the snapshots patched from this one.
    index: Arc<FastMap<(&'static str, String), usize>>,
    /// Routes are in id order with no id twice (a provider whose order is its keys', etcd): a
    /// route is found by a binary search of [`Snapshot::routes`] and is not in the index, so
    /// that a route added or removed moves no index entry (and a patch copies none).
    routes_by_id: bool,
    /// Compiled upstreams of upstream objects, services and stream routes by owner `(kind, id)`,
    /// for the next build to reuse (a route's own is reused with the route, `compile.rs`).
    compiled_by_owner: Compiled,
    /// Plugin instances by owner ([`owner_key`]), for the next build to reuse; in shards that a
    /// patched snapshot shares but for its changed routes'.
    instances: crate::tables::shards::Shards<String, Vec<Reusable>>,
    /// Fingerprint of the set of upstream ids: instances that named upstreams are rebuilt (and
    /// their names checked again) when it changes.
    upstream_ids: Fingerprint,
    /// Consumers as requests carry them, and each auth plugin's credential index, with the
    /// fingerprint of the consumer list they came from (reused while it is unchanged).
    consumer_state: Option<Arc<plugins::ConsumerState>>,
}

impl Snapshot {
    /// A route by id.
    pub fn route(&self, id: &str) -> Option<&Arc<Route>> {
        self.route_place(id).map(|i| &self.routes[i])
    }
    /// Where the route `id` is in [`Snapshot::routes`] (and in the route table's list).
    pub(crate) fn route_place(&self, id: &str) -> Option<usize> {
        match self.routes_by_id {
            true => by_id(&self.routes, id).ok(),
            false => self.index.get(&("routes", id.to_owned())).copied(),
        }
    }
    /// A service by id.
    pub fn service(&self, id: &str) -> Option<&Arc<Service>> {
        self.index.get(&("services", id.to_owned())).map(|&i| &self.services[i])
    }
    /// A stream route by id.
    pub fn stream_route(&self, id: &str) -> Option<&Arc<StreamRoute>> {
        self.index.get(&("stream_routes", id.to_owned())).map(|&i| &self.stream_routes[i])
    }
    /// An upstream object by id.
    pub fn upstream(&self, id: &str) -> Option<&Arc<Upstream>> {
        self.index.get(&("upstreams", id.to_owned())).map(|&i| &self.upstreams[i])
    }
    /// Metadata of a plugin.
    pub fn metadata(&self, plugin: &str) -> Option<&PluginMetadata> {
        self.plugin_metadata.iter().find(|m| m.id == plugin)
    }
    /// Number of resources of every kind, for logs.
    pub fn summary(&self) -> String {
        format!(
            "{} routes, {} services, {} upstreams, {} consumers, {} global rules, {} plugin metadata, {} ssls, {} stream routes",
            self.routes.len(),
            self.services.len(),
            self.upstreams.len(),
            self.consumers.len(),
            self.global_rules.len(),
            self.plugin_metadata.len(),
            self.ssls.len(),
            self.stream_routes.len()
        )
    }

    /// Validates `raw` and builds a snapshot with the `enabled` plugins (files named by
    /// resources are relative to the current directory).
    pub fn build(raw: &Value, enabled: &EnabledSet) -> Result<Snapshot, Vec<Issue>> {
        Self::build_at(raw, enabled, Path::new("."))
    }

    /// [`Snapshot::build`], with files named by resources (`ssls[].cert_file`) relative to `base`:
    /// a build that reuses nothing of a previous snapshot.
    pub fn build_at(raw: &Value, enabled: &EnabledSet, base: &Path) -> Result<Snapshot, Vec<Issue>> {
        Self::build_mode(raw, enabled, base, Mode::Apply(None), None)
    }

    /// [`Snapshot::build_at`] for a purpose ([`Mode`]), with the fingerprints of entries the
    /// provider already knows ([`DocPrints`]; the others are computed).
    pub fn build_mode(
        raw: &Value,
        enabled: &EnabledSet,
        base: &Path,
        mode: Mode<'_>,
        prints: Option<&DocPrints>,
    ) -> Result<Snapshot, Vec<Issue>> {
        let mut cache = ParseCache::take();
        let check_only = enabled.check_only || matches!(mode, Mode::Validate(_));
        let previous = match mode {
            Mode::Apply(p) => p,
            Mode::Validate(p) => p,
        };
        let builder = Builder {
            enabled,
            base,
            issues: Vec::new(),
            snap: Snapshot::default(),
            cache: &mut cache,
            check_only,
            previous,
            prints,
            together: Default::default(),
            patching: false,
            route_chains: FastMap::default(),
        };
        let result = builder.run(raw);
        // What this build parsed is what the next one may reuse (a failed build keeps its valid
        // entries too: the corrected document usually differs in one of them). The parse cache
        // is a memo of pure functions of each entry's JSON: a validation may fill it too.
        cache.put_back();
        result
    }
}

type Compiled = FastMap<(&'static str, String), Arc<CompiledUpstream>>;

struct Builder<'a> {
    enabled: &'a EnabledSet,
    base: &'a Path,
    issues: Vec<Issue>,
    snap: Snapshot,
    cache: &'a mut ParseCache,
    /// Plugins build instances that open nothing ([`Mode::Validate`], `weir -t`). Plugin
    /// instances of `previous` are then never reused.
    check_only: bool,
    /// The snapshot serving now, whose unchanged parts this build reuses ([`Mode::Apply`]; in a
    /// [`Mode::Validate`], its compiled upstreams and routes only).
    previous: Option<&'a Snapshot>,
    /// Fingerprints of entries the provider knows ([`DocPrints`]).
    prints: Option<&'a DocPrints>,
    /// The configurations of plugins that check theirs together (`Plugin::check_together`).
    together: plugins::Together,
    /// A patch of `previous` (`patch.rs`): what other resources exist is `previous`'s index,
    /// not this build's (which holds none).
    patching: bool,
    /// The chains of the routes' own plugins, by route id, until they are compiled.
    route_chains: FastMap<String, PluginChain>,
}

/// How an entry is named in messages: `routes[2] (id 7)`. Every entry of every build has one, and
/// few builds report anything, so the text is made the first time it is read (as a `&str`) and
/// not before: a function that only passes the name on takes `&EntryName`.
pub(super) struct EntryName<'r> {
    list: &'static str,
    at: usize,
    item: &'r Value,
    name: std::cell::OnceCell<String>,
}

impl<'r> EntryName<'r> {
    pub(super) fn new(list: &'static str, at: usize, item: &'r Value) -> Self {
        EntryName { list, at, item, name: std::cell::OnceCell::new() }
    }
}

impl std::ops::Deref for EntryName<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        self.name.get_or_init(|| owner(self.list, self.at, self.item))
    }
}

impl std::fmt::Display for EntryName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

/// `routes[2] (id 7)`: the text of an [`EntryName`].
fn owner(list: &str, i: usize, item: &Value) -> String {
    let id = item.get("id").or_else(|| item.get("username"));
    let mut o = String::with_capacity(list.len() + 32);
    o.push_str(list);
    o.push('[');
    o.push_str(Decimal::new(i as u64).as_str());
    o.push(']');
    match id {
        Some(Value::String(s)) => {
            o.push_str(" (id ");
            o.push_str(s);
            o.push(')');
        }
        Some(Value::Number(n)) => {
            o.push_str(" (id ");
            match n.as_u64() {
                Some(u) => o.push_str(Decimal::new(u).as_str()),
                None => o.push_str(&n.to_string()),
            }
            o.push(')');
        }
        _ => {}
    }
    o
}

impl Builder<'_> {
    fn run(mut self, raw: &Value) -> Result<Snapshot, Vec<Issue>> {
        let schemas = KindSchemas::get();
        schemas.file.check(raw)?;
        let (routes, routes_checked): (Vec<(EntryName<'_>, Arc<Route>)>, _) =
            self.parse_checked(raw, "routes", "route");
        let services: Vec<(EntryName<'_>, Arc<Service>)> = self.parse(raw, "services", "service");
        let upstreams: Vec<(EntryName<'_>, Arc<Upstream>)> = self.parse(raw, "upstreams", "upstream");
        let consumers: Vec<(EntryName<'_>, Arc<Consumer>)> = self.parse(raw, "consumers", "consumer");
        let groups: Vec<(EntryName<'_>, Arc<ConsumerGroup>)> = self.parse(raw, "consumer_groups", "consumer_group");
        let credentials: Vec<(EntryName<'_>, Arc<Credential>)> = self.parse(raw, "credentials", "credential");
        let global_rules: Vec<(EntryName<'_>, Arc<GlobalRule>)> = self.parse(raw, "global_rules", "global_rule");
        let plugin_configs: Vec<(EntryName<'_>, Arc<PluginConfig>)> =
            self.parse(raw, "plugin_configs", "plugin_config");
        let metadata: Vec<(EntryName<'_>, Arc<PluginMetadata>)> = self.parse(raw, "plugin_metadata", "plugin_metadata");
        let ssls: Vec<(EntryName<'_>, Arc<Ssl>)> = self.parse(raw, "ssls", "ssl");
        let stream_routes: Vec<(EntryName<'_>, Arc<StreamRoute>)> = self.parse(raw, "stream_routes", "stream_route");
        if !self.issues.is_empty() {
            return Err(self.issues);
        }

        // (Strictly increasing ids are unique, and found by a search: no index entries.)
        self.snap.routes_by_id = routes.windows(2).all(|w| w[0].1.id.0 < w[1].1.id.0);
        if !self.snap.routes_by_id {
            self.index("routes", routes.iter().map(|(o, r)| (o, r.id.0.clone())));
        }
        self.index("services", services.iter().map(|(o, s)| (o, s.id.0.clone())));
        self.index(
            "upstreams",
            upstreams.iter().map(|(o, u)| (o, u.id.as_ref().map(|i| i.0.clone()).unwrap_or_default())),
        );
        let mut ids: Vec<Value> = upstreams.iter().filter_map(|(_, u)| u.id.as_ref()).map(|i| json!(i.0)).collect();
        ids.sort_unstable_by(|a, b| a.as_str().cmp(&b.as_str()));
        self.snap.upstream_ids = fingerprint("upstreams", &Value::Array(ids));
        self.index("consumers", consumers.iter().map(|(o, c)| (o, c.username.clone())));
        self.index("consumer_groups", groups.iter().map(|(o, g)| (o, g.id.0.clone())));
        for (o, c) in &consumers {
            if let Some(g) = &c.group_id {
                if !self.snap.index.contains_key(&("consumer_groups", g.0.clone())) {
                    self.issue(o, "group_id", &format!("consumer group `{g}` does not exist"));
                }
            }
        }
        self.check_credentials(&consumers, &credentials);
        self.index("global_rules", global_rules.iter().map(|(o, g)| (o, g.id.0.clone())));
        self.index("plugin_configs", plugin_configs.iter().map(|(o, p)| (o, p.id.0.clone())));
        self.index("plugin_metadata", metadata.iter().map(|(o, m)| (o, m.id.clone())));
        self.index("ssls", ssls.iter().map(|(o, s)| (o, s.id.0.clone())));
        self.index("stream_routes", stream_routes.iter().map(|(o, r)| (o, r.id.0.clone())));
        let (certs, problems) = CertTable::build(&ssls, self.base);
        for (o, (key, why)) in problems {
            self.issue(&o, &key, &why);
        }
        self.snap.certs = certs;
        self.snap.ssls = ssls.into_iter().map(|(_, s)| s).collect();

        for (o, u) in &upstreams {
            if u.id.is_none() {
                self.issue(o, "id", "required key is missing");
            }
            self.check_upstream(o, "", u);
        }
        for (o, s) in &services {
            self.check_upstream_ref(o, s.upstream.as_deref(), s.upstream_id.as_ref());
        }
        for ((o, r), (print, checked)) in routes.iter().zip(routes_checked) {
            if !checked {
                let before = self.issues.len();
                self.check_route_itself(o, r);
                if self.issues.len() == before {
                    self.cache.passed(&print);
                }
            }
            self.check_route_refs(o, r);
        }
        let mut stream_chains = HashMap::new();
        for (o, r) in &stream_routes {
            self.check_stream_route(o, r);
            stream_chains.insert(r.id.0.clone(), self.stream_chain(o, &r.plugins));
        }
        if !self.issues.is_empty() {
            return Err(self.issues);
        }

        // Plugins: metadata and consumers first (auth plugins index credentials).
        let mut meta_by_plugin: HashMap<String, PluginMetadata> = HashMap::new();
        for (o, m) in metadata {
            if self.check_metadata(&o, &m) {
                meta_by_plugin.insert(m.id.clone(), PluginMetadata::clone(&m));
            }
        }
        let consumer_state = self.consumer_state(raw, &consumers, &groups, &credentials, &meta_by_plugin);
        let state = &consumer_state;
        // Plugin configs on their own first: a malformed one is reported once, under its own name.
        let mut shared_sets: HashMap<&str, &PluginConfs> = HashMap::new();
        for (o, p) in &plugin_configs {
            let before = self.issues.len();
            self.chain(("plugin_configs", &p.id.0, o), &p.plugins, state, &meta_by_plugin);
            if self.issues.len() == before {
                shared_sets.insert(&p.id.0, &p.plugins);
            }
        }
        // Resources without plugins get no entry: lookups fall back to an empty chain.
        for (o, r) in routes.iter().filter(|(_, r)| !r.plugins.is_empty() || r.plugin_config_id().is_some()) {
            // A plugin config's plugins under the route's own (the route's configuration wins).
            let merged;
            let confs = match r.plugin_config_id().map(|id| shared_sets.get(id.0.as_str())) {
                None => &r.plugins,
                Some(None) => continue,
                Some(Some(shared)) => {
                    let mut all = PluginConfs::clone(shared);
                    all.extend(r.plugins.iter().map(|(k, v)| (k.clone(), v.clone())));
                    merged = all;
                    &merged
                }
            };
            let chain = self.chain(("routes", &r.id.0, o), confs, state, &meta_by_plugin);
            self.route_chains.insert(r.id.0.clone(), chain);
        }
        for (o, s) in services.iter().filter(|(_, s)| !s.plugins.is_empty()) {
            let chain = self.chain(("services", &s.id.0, o), &s.plugins, state, &meta_by_plugin);
            self.snap.chains.insert(("services", s.id.0.clone()), chain);
        }
        for (o, g) in &global_rules {
            let chain = self.chain(("global_rules", &g.id.0, o), &g.plugins, state, &meta_by_plugin);
            self.snap.chains.insert(("global_rules", g.id.0.clone()), chain);
        }
        self.snap.consumer_state = Some(consumer_state);
        self.check_together();
        if !self.issues.is_empty() {
            return Err(self.issues);
        }
        for entry in &self.enabled.listed {
            if let Some(m) = meta_by_plugin.remove(entry.name) {
                self.snap.plugin_metadata.push(m);
            }
        }
        self.snap.routes = routes.into_iter().map(|(_, r)| r).collect();
        self.snap.services = services.into_iter().map(|(_, s)| s).collect();
        self.snap.upstreams = upstreams.into_iter().map(|(_, u)| u).collect();
        self.snap.consumers = consumers.into_iter().map(|(_, c)| c).collect();
        self.snap.consumer_groups = groups.into_iter().map(|(_, g)| g).collect();
        self.snap.global_rules = global_rules.into_iter().map(|(_, g)| g).collect();
        self.snap.plugin_configs = plugin_configs.into_iter().map(|(_, p)| p).collect();
        self.snap.stream_routes = stream_routes.into_iter().map(|(_, r)| r).collect();
        self.compile_data_plane(stream_chains);
        if !self.issues.is_empty() {
            return Err(self.issues);
        }
        Ok(self.snap)
    }
}

/// Where route `id` is in `routes` kept in id order ([`Snapshot::routes_by_id`]), or where it
/// would go.
fn by_id(routes: &[Arc<Route>], id: &str) -> Result<usize, usize> {
    routes.binary_search_by(|r| r.id.0.as_str().cmp(id))
}

/// A JSON dump of a resource, as the control server reports it (defaults filled, ids as strings).
pub fn dump<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or_else(|e| json!({ "error_msg": e.to_string() }))
}
