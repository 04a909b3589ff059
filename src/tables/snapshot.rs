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
use weir_plugin::{BuildContext, ConsumerRef, PluginInstance, SharedState};

use crate::config::unknown_plugin;
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
    global_rules: Vec<Value>,
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
                    ("global_rule", compile(weir_plugin::schema_of::<GlobalRule>())),
                    ("plugin_metadata", compile(weir_plugin::schema_of::<PluginMetadata>())),
                    ("ssl", compile(weir_plugin::schema_of::<Ssl>())),
                    ("stream_route", compile(weir_plugin::schema_of::<StreamRoute>())),
                ],
            }
        })
    }

    fn kind(&self, name: &str) -> &CompiledSchema {
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
}

/// Plugins of one resource, in priority order.
pub type PluginChain = Arc<[BoundPlugin]>;

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
    /// Global rules.
    pub global_rules: Vec<Arc<GlobalRule>>,
    /// Plugin metadata of enabled plugins, in the order of the enabled list.
    pub plugin_metadata: Vec<PluginMetadata>,
    /// Plugin chains of routes, services and global rules, keyed by `(kind, id)`.
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
    index: FastMap<(&'static str, String), usize>,
}

impl Snapshot {
    /// A route by id.
    pub fn route(&self, id: &str) -> Option<&Arc<Route>> {
        self.index.get(&("routes", id.to_owned())).map(|&i| &self.routes[i])
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

    /// [`Snapshot::build`], with files named by resources (`ssls[].cert_file`) relative to `base`.
    pub fn build_at(raw: &Value, enabled: &EnabledSet, base: &Path) -> Result<Snapshot, Vec<Issue>> {
        let previous = PARSED.lock().take().unwrap_or_default();
        let mut cache =
            ParseCache { current: FastMap::with_capacity_and_hasher(previous.len(), Default::default()), previous };
        let result =
            Builder { enabled, base, issues: Vec::new(), snap: Snapshot::default(), cache: &mut cache }.run(raw);
        // What this build parsed is what the next one may reuse (a failed build keeps its valid
        // entries too: the corrected document usually differs in one of them).
        *PARSED.lock() = Some(cache.current);
        result
    }
}

/// Parsed entries by the [`fingerprint`] of the list name and JSON they were parsed from. A parse
/// depends on nothing else, so the content is the key: no id is kept (a 40-byte slot per entry).
type Parsed = FastMap<Fingerprint, ParsedEntry>;

/// One cached entry: the parsed value, and whether it passed the checks that depend on nothing
/// but itself (so that a reused entry skips them too; one that failed them is checked again).
type ParsedEntry = (Arc<dyn std::any::Any + Send + Sync>, bool);

/// A 128-bit [`Fingerprint`] of a list name and a JSON value: SipHash under two random keys, over
/// a walk that tells types, lengths and keys apart. The cache keeps this rather than a copy of
/// every entry (as a tree, ~2 KB per route: 20 MB for 10,000 routes).
fn fingerprint(list: &str, v: &Value) -> Fingerprint {
    use std::hash::{BuildHasher, Hasher};
    static KEYS: std::sync::LazyLock<(std::hash::RandomState, std::hash::RandomState)> =
        std::sync::LazyLock::new(|| (std::hash::RandomState::new(), std::hash::RandomState::new()));
    struct Both<A, B>(A, B);
    impl<A: Hasher, B: Hasher> Hasher for Both<A, B> {
        fn write(&mut self, bytes: &[u8]) {
            self.0.write(bytes);
            self.1.write(bytes);
        }
        fn finish(&self) -> u64 {
            self.0.finish()
        }
    }
    fn feed(v: &Value, h: &mut impl Hasher) {
        match v {
            Value::Null => h.write_u8(0),
            Value::Bool(b) => h.write(&[1, u8::from(*b)]),
            Value::Number(n) => {
                h.write_u8(2);
                match (n.as_u64(), n.as_i64()) {
                    (Some(u), _) => {
                        h.write_u8(0);
                        h.write_u64(u);
                    }
                    (None, Some(i)) => {
                        h.write_u8(1);
                        h.write_i64(i);
                    }
                    _ => {
                        h.write_u8(2);
                        h.write_u64(n.as_f64().map_or(0, f64::to_bits));
                    }
                }
            }
            Value::String(s) => {
                h.write_u8(3);
                h.write_usize(s.len());
                h.write(s.as_bytes());
            }
            Value::Array(a) => {
                h.write_u8(4);
                h.write_usize(a.len());
                a.iter().for_each(|x| feed(x, h));
            }
            Value::Object(m) => {
                h.write_u8(5);
                h.write_usize(m.len());
                for (k, x) in m {
                    h.write_usize(k.len());
                    h.write(k.as_bytes());
                    feed(x, h);
                }
            }
        }
    }
    let mut both = Both(KEYS.0.build_hasher(), KEYS.1.build_hasher());
    both.write_usize(list.len());
    both.write(list.as_bytes());
    feed(v, &mut both);
    [both.0.finish(), both.1.finish()]
}

/// Two 64-bit halves rather than a `u128`, whose 16-byte alignment would pad a cache slot.
type Fingerprint = [u64; 2];

/// The entries the last build parsed. Validating an entry against its kind schema and
/// deserializing it is most of a build's cost, and depends on nothing but the entry's JSON (kind
/// schemas are fixed for the process), so an entry equal to last time's is reused: a change to
/// one route of 10,000 re-parses one route.
static PARSED: parking_lot::Mutex<Option<Parsed>> = parking_lot::Mutex::new(None);

/// The upstreams the last build compiled, by owner `(kind, id)`.
static COMPILED: parking_lot::Mutex<Option<Compiled>> = parking_lot::Mutex::new(None);

type Compiled = FastMap<(&'static str, String), Arc<CompiledUpstream>>;

struct ParseCache {
    previous: Parsed,
    current: Parsed,
}

struct Builder<'a> {
    enabled: &'a EnabledSet,
    base: &'a Path,
    issues: Vec<Issue>,
    snap: Snapshot,
    cache: &'a mut ParseCache,
}

/// `routes[2] (id 7)`: how a resource is named in messages. Built for every entry of every
/// build, so without the formatting machinery.
fn owner(list: &str, i: usize, item: &Value) -> String {
    let id = item.get("id").or_else(|| item.get("username"));
    let number;
    let id = match id {
        Some(Value::String(s)) => Some(s.as_str()),
        Some(Value::Number(n)) => {
            number = n.to_string();
            Some(number.as_str())
        }
        _ => None,
    };
    let index = i.to_string();
    let mut o = String::with_capacity(list.len() + index.len() + id.map_or(0, |s| s.len() + 6) + 2);
    o.push_str(list);
    o.push('[');
    o.push_str(&index);
    o.push(']');
    if let Some(id) = id {
        o.push_str(" (id ");
        o.push_str(id);
        o.push(')');
    }
    o
}

impl Builder<'_> {
    fn run(mut self, raw: &Value) -> Result<Snapshot, Vec<Issue>> {
        let schemas = KindSchemas::get();
        schemas.file.check(raw)?;
        let (routes, routes_checked): (Vec<(String, Arc<Route>)>, _) = self.parse_checked(raw, "routes", "route");
        let services: Vec<(String, Arc<Service>)> = self.parse(raw, "services", "service");
        let upstreams: Vec<(String, Arc<Upstream>)> = self.parse(raw, "upstreams", "upstream");
        let consumers: Vec<(String, Arc<Consumer>)> = self.parse(raw, "consumers", "consumer");
        let global_rules: Vec<(String, Arc<GlobalRule>)> = self.parse(raw, "global_rules", "global_rule");
        let metadata: Vec<(String, Arc<PluginMetadata>)> = self.parse(raw, "plugin_metadata", "plugin_metadata");
        let ssls: Vec<(String, Arc<Ssl>)> = self.parse(raw, "ssls", "ssl");
        let stream_routes: Vec<(String, Arc<StreamRoute>)> = self.parse(raw, "stream_routes", "stream_route");
        if !self.issues.is_empty() {
            return Err(self.issues);
        }

        self.index("routes", routes.iter().map(|(o, r)| (o, r.id.0.clone())));
        self.index("services", services.iter().map(|(o, s)| (o, s.id.0.clone())));
        self.index(
            "upstreams",
            upstreams.iter().map(|(o, u)| (o, u.id.as_ref().map(|i| i.0.clone()).unwrap_or_default())),
        );
        self.index("consumers", consumers.iter().map(|(o, c)| (o, c.username.clone())));
        self.index("global_rules", global_rules.iter().map(|(o, g)| (o, g.id.0.clone())));
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
                    if let Some(entry) = self.cache.current.get_mut(&print) {
                        entry.1 = true;
                    }
                }
            }
            if r.upstream.is_some() && r.upstream_id.is_some() {
                self.issue(o, "upstream_id", "`upstream` and `upstream_id` are mutually exclusive");
            }
            if let Some(id) = &r.upstream_id {
                self.check_upstream_id(o, id);
            }
            if let Some(sid) = &r.service_id {
                if !self.snap.index.contains_key(&("services", sid.0.clone())) {
                    self.issue(o, "service_id", &format!("service `{sid}` does not exist"));
                }
            }
        }
        let mut stream_chains = HashMap::new();
        for (o, r) in &stream_routes {
            self.check_stream_route(o, r);
            stream_chains.insert(r.id.0.clone(), self.stream_chain(o, &r.plugins));
        }
        if !self.issues.is_empty() {
            return Err(self.issues);
        }

        // Plugins: consumers first, so that auth plugins can index their credentials.
        let shared = self.consumer_state(&consumers);
        let mut meta_by_plugin: HashMap<String, PluginMetadata> = HashMap::new();
        for (o, m) in metadata {
            if self.check_metadata(&o, &m) {
                meta_by_plugin.insert(m.id.clone(), PluginMetadata::clone(&m));
            }
        }
        // Resources without plugins get no entry: lookups fall back to an empty chain.
        for (o, r) in routes.iter().filter(|(_, r)| !r.plugins.is_empty()) {
            let chain = self.chain(o, &r.plugins, &shared, &meta_by_plugin);
            self.snap.chains.insert(("routes", r.id.0.clone()), chain);
        }
        for (o, s) in services.iter().filter(|(_, s)| !s.plugins.is_empty()) {
            let chain = self.chain(o, &s.plugins, &shared, &meta_by_plugin);
            self.snap.chains.insert(("services", s.id.0.clone()), chain);
        }
        for (o, g) in &global_rules {
            let chain = self.chain(o, &g.plugins, &shared, &meta_by_plugin);
            self.snap.chains.insert(("global_rules", g.id.0.clone()), chain);
        }
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
        self.snap.global_rules = global_rules.into_iter().map(|(_, g)| g).collect();
        self.snap.stream_routes = stream_routes.into_iter().map(|(_, r)| r).collect();
        self.compile_data_plane(stream_chains);
        if !self.issues.is_empty() {
            return Err(self.issues);
        }
        Ok(self.snap)
    }

    /// The checks of a route that depend on nothing but the route.
    fn check_route_itself(&mut self, o: &str, r: &Route) {
        match (&r.uri, r.uris()) {
            (None, None) => self.issue(o, "uri", "a route needs `uri` or `uris`"),
            (Some(_), Some(_)) => self.issue(o, "uris", "`uri` and `uris` are mutually exclusive"),
            _ => {}
        }
        if r.host().is_some() && r.hosts().is_some() {
            self.issue(o, "hosts", "`host` and `hosts` are mutually exclusive");
        }
        for (i, addr) in r.remote_addrs().into_iter().flatten().enumerate() {
            if let Err(e) = crate::resources::cidr::Cidr::parse(addr) {
                self.issue(o, &format!("remote_addrs[{i}]"), &e);
            }
        }
        if let Some(u) = r.upstream.as_deref() {
            self.check_upstream(o, "upstream", u);
        }
    }

    /// Compiles upstreams, merges plugin chains and builds the routing table.
    fn compile_data_plane(&mut self, mut stream_chains: HashMap<String, StreamChain>) {
        let all = std::cell::RefCell::new(Vec::new());
        // An upstream equal to the one its owner had in the previous build is that same compiled
        // upstream: no recompiling, and its balancer state and checker carry over.
        let previous = COMPILED.lock().take().unwrap_or_default();
        let current = std::cell::RefCell::new(FastMap::with_capacity_and_hasher(previous.len(), Default::default()));
        let compile = |owner: (&'static str, &str), u: &Upstream| {
            let key = (owner.0, owner.1.to_owned());
            let c = match previous.get(&key).filter(|c: &&Arc<CompiledUpstream>| *c.conf == *u) {
                Some(c) => c.clone(),
                None => {
                    let (c, warnings) = CompiledUpstream::compile((owner.0, Arc::from(owner.1)), Arc::new(u.clone()));
                    for w in warnings {
                        log::warn!("{}[{}]: upstream: {w}", owner.0, owner.1);
                    }
                    Arc::new(c)
                }
            };
            current.borrow_mut().insert(key, c.clone());
            all.borrow_mut().push(c.clone());
            c
        };
        let objects: HashMap<String, Arc<CompiledUpstream>> = self
            .snap
            .upstreams
            .iter()
            .filter_map(|u| u.id.as_ref().map(|id| (id.0.clone(), compile(("upstreams", &id.0), u))))
            .collect();
        let mut service_upstreams: HashMap<String, Option<Arc<CompiledUpstream>>> = HashMap::new();
        for s in &self.snap.services {
            let up = match (&s.upstream, &s.upstream_id) {
                (Some(u), _) => Some(compile(("services", &s.id.0), u)),
                (None, Some(id)) => objects.get(&id.0).cloned(),
                (None, None) => None,
            };
            service_upstreams.insert(s.id.0.clone(), up);
        }
        let empty: PluginChain = Arc::from([]);
        let mut compiled = Vec::with_capacity(self.snap.routes.len());
        for (order, r) in self.snap.routes.iter().enumerate() {
            let service = r.service_id.as_ref().and_then(|sid| self.snap.service(&sid.0).cloned());
            let upstream = match (&r.upstream, &r.upstream_id) {
                (Some(u), _) => Some(compile(("routes", &r.id.0), u)),
                (None, Some(id)) => objects.get(&id.0).cloned(),
                (None, None) => service.as_ref().and_then(|s| service_upstreams.get(&s.id.0).cloned().flatten()),
            };
            // Routes without plugins have no chain entry: no lookup (and no key to build) for them.
            let route_chain = match r.plugins.is_empty() {
                true => empty.clone(),
                false => self.snap.chains.get(&("routes", r.id.0.clone())).cloned().unwrap_or_else(|| empty.clone()),
            };
            let plugins = match &service {
                None => route_chain,
                Some(s) => {
                    let service_chain =
                        self.snap.chains.get(&("services", s.id.0.clone())).cloned().unwrap_or_else(|| empty.clone());
                    merge_chains(&service_chain, &route_chain)
                }
            };
            let hosts = service.as_ref().and_then(|s| s.hosts.clone());
            compiled.push(Arc::new(CompiledRoute::new(r.clone(), hosts.as_deref(), plugins, upstream, order)));
        }
        let mut stream = Vec::with_capacity(self.snap.stream_routes.len());
        for (order, r) in self.snap.stream_routes.iter().enumerate() {
            let upstream = match (&r.upstream, &r.upstream_id, &r.service_id) {
                (Some(u), _, _) => Some(compile(("stream_routes", &r.id.0), u)),
                (None, Some(id), _) => objects.get(&id.0).cloned(),
                (None, None, Some(sid)) => service_upstreams.get(&sid.0).cloned().flatten(),
                (None, None, None) => None,
            };
            let chain = stream_chains.remove(&r.id.0).unwrap_or_default();
            stream.push(CompiledStreamRoute::new(r.clone(), upstream, chain, order));
        }
        self.snap.stream_table = StreamTable::new(stream);
        self.snap.compiled_upstreams = all.into_inner();
        *COMPILED.lock() = Some(current.into_inner());
        let (table, problems) = RouteTable::build(compiled);
        for p in problems {
            self.issues.push(Issue::new("routes", p));
        }
        self.snap.table = table;
        let mut global: Vec<BoundPlugin> = Vec::new();
        for g in &self.snap.global_rules {
            if let Some(chain) = self.snap.chains.get(&("global_rules", g.id.0.clone())) {
                global.extend(chain.iter().cloned());
            }
        }
        sort_chain(&mut global);
        self.snap.global_chain = global.into();
    }

    /// Addresses, SNI and references of a stream route.
    fn check_stream_route(&mut self, o: &str, r: &StreamRoute) {
        if let Some(a) = &r.server_addr {
            if a.parse::<std::net::IpAddr>().is_err() {
                self.issue(o, "server_addr", &format!("`{a}` is not an IP address"));
            }
        }
        if let Some(a) = &r.remote_addr {
            if let Err(e) = crate::resources::cidr::Cidr::parse(a) {
                self.issue(o, "remote_addr", &e);
            }
        }
        if let Some(sni) = &r.sni {
            if let Err(e) = crate::tables::certs::check_sni(sni) {
                self.issue(o, "sni", &e);
            }
        }
        if r.tls_passthrough && r.sni.is_none() {
            self.issue(o, "tls_passthrough", "routing on the SNI without terminating TLS needs `sni`");
        }
        self.check_upstream_ref(o, r.upstream.as_deref(), r.upstream_id.as_ref());
        match (&r.upstream, &r.upstream_id, &r.service_id) {
            (None, None, None) => {
                self.issue(o, "upstream", "a stream route needs `upstream`, `upstream_id` or `service_id`")
            }
            (None, None, Some(sid)) if !self.snap.index.contains_key(&("services", sid.0.clone())) => {
                self.issue(o, "service_id", &format!("service `{sid}` does not exist"));
            }
            _ => {}
        }
    }

    /// Builds the stream plugins of a stream route, in priority order.
    fn stream_chain(&mut self, o: &str, confs: &PluginConfs) -> StreamChain {
        let mut chain: Vec<BoundStreamPlugin> = Vec::with_capacity(confs.len());
        for (name, conf) in confs {
            let path = format!("plugins.{name}");
            let Some(entry) = self.enabled.stream_get(name).cloned() else {
                let catalog = crate::plugins_catalog();
                let reason = if catalog.get(name).is_some() {
                    format!("`{name}` is an HTTP plugin; stream routes take stream plugins")
                } else if catalog.stream_get(name).is_some() {
                    format!("stream plugin `{name}` is compiled in but not enabled (add it to `stream_plugins:` in config.yaml)")
                } else {
                    format!(
                        "unknown stream plugin `{name}`; compiled into this binary: {}",
                        catalog.stream_names().join(", ")
                    )
                };
                self.issue(o, &path, &reason);
                continue;
            };
            if let Err(found) = entry.schema.check(conf) {
                self.issues.extend(found.into_iter().map(|f| f.under(&path).in_resource(o)));
                continue;
            }
            match entry.plugin.build(conf) {
                Ok(instance) => chain.push(BoundStreamPlugin { entry, instance }),
                Err(e) => self.issue(o, &path, &e),
            }
        }
        chain.sort_by(|a, b| b.entry.priority.cmp(&a.entry.priority).then(a.entry.name.cmp(b.entry.name)));
        chain.into()
    }

    fn issue(&mut self, owner: &str, path: &str, reason: &str) {
        self.issues.push(Issue::new(path, reason).in_resource(owner));
    }

    /// Validates every item of one list against its kind schema, then deserializes it. An item
    /// equal to one the previous build parsed is taken from the [`ParseCache`] instead.
    fn parse<T>(&mut self, raw: &Value, list: &'static str, kind: &str) -> Vec<(String, Arc<T>)>
    where
        T: DeserializeOwned + Send + Sync + 'static,
    {
        self.parse_checked(raw, list, kind).0
    }

    /// [`Builder::parse`], with each entry's cache key and whether it is known to pass its own
    /// checks (see [`ParsedEntry`]).
    #[allow(clippy::type_complexity)]
    fn parse_checked<T>(
        &mut self,
        raw: &Value,
        list: &'static str,
        kind: &str,
    ) -> (Vec<(String, Arc<T>)>, Vec<(Fingerprint, bool)>)
    where
        T: DeserializeOwned + Send + Sync + 'static,
    {
        let mut checked = Vec::new();
        let schema = KindSchemas::get().kind(kind);
        let items = raw.get(list).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let o = owner(list, i, item);
            // Moved, not copied, from the previous build's cache to this one's.
            let print = fingerprint(list, item);
            if let Some((parsed, ok)) = self.cache.previous.remove(&print) {
                if let Ok(t) = parsed.clone().downcast::<T>() {
                    out.push((o, t));
                    checked.push((print, ok));
                    self.cache.current.insert(print, (parsed, ok));
                    continue;
                }
            }
            if let Err(found) = schema.check(item) {
                self.issues.extend(found.into_iter().map(|f| f.in_resource(&o)));
                continue;
            }
            match serde_json::from_value::<T>(item.clone()) {
                Ok(v) => {
                    let v = Arc::new(v);
                    self.cache.current.insert(print, (v.clone(), false));
                    out.push((o, v));
                    checked.push((print, false));
                }
                Err(e) => self.issue(&o, "", &e.to_string()),
            }
        }
        (out, checked)
    }

    fn index<'o>(&mut self, list: &'static str, ids: impl Iterator<Item = (&'o String, String)>) {
        for (i, (o, id)) in ids.enumerate() {
            if id.is_empty() {
                continue;
            }
            if self.snap.index.insert((list, id.clone()), i).is_some() {
                self.issue(o, "id", &format!("duplicate id `{id}` in {list}"));
            }
        }
    }

    fn check_upstream_ref(&mut self, o: &str, inline: Option<&Upstream>, id: Option<&Id>) {
        if inline.is_some() && id.is_some() {
            self.issue(o, "upstream_id", "`upstream` and `upstream_id` are mutually exclusive");
        }
        if let Some(u) = inline {
            self.check_upstream(o, "upstream", u);
        }
        if let Some(id) = id {
            self.check_upstream_id(o, id);
        }
    }

    fn check_upstream_id(&mut self, o: &str, id: &Id) {
        if !self.snap.index.contains_key(&("upstreams", id.0.clone())) {
            self.issue(o, "upstream_id", &format!("upstream `{id}` does not exist"));
        }
    }

    fn check_upstream(&mut self, o: &str, at: &str, u: &Upstream) {
        let field = |f: &str| if at.is_empty() { f.to_owned() } else { format!("{at}.{f}") };
        if let Nodes::Map(map) = &u.nodes {
            for key in map.keys() {
                if let Err(e) = parse_node_key(key) {
                    self.issue(o, &field(&format!("nodes.{key}")), &e);
                }
            }
        }
        if u.lb == LbType::Chash && u.key.is_none() && u.hash_on != HashOn::Consumer {
            self.issue(o, &field("key"), "required when `type` is `chash`");
        }
        if u.pass_host == PassHost::Rewrite && u.upstream_host.is_none() {
            self.issue(o, &field("upstream_host"), "required when `pass_host` is `rewrite`");
        }
    }

    fn enabled_plugin(&mut self, o: &str, path: &str, name: &str) -> Option<Arc<PluginEntry>> {
        if let Some(e) = self.enabled.get(name) {
            return Some(e.clone());
        }
        let known: Vec<String> = self.enabled.listed.iter().map(|e| e.name.to_owned()).collect();
        let reason = if crate::plugins_catalog().get(name).is_some() {
            format!("plugin `{name}` is compiled in but not enabled (add it to `plugins:` in config.yaml)")
        } else {
            unknown_plugin(name, &known)
        };
        self.issue(o, path, &reason);
        None
    }

    fn consumer_state(&mut self, consumers: &[(String, Arc<Consumer>)]) -> HashMap<&'static str, SharedState> {
        type Credentials = (Arc<PluginEntry>, Vec<(String, Value)>);
        let mut per_plugin: HashMap<&'static str, Credentials> = HashMap::new();
        for (o, c) in consumers {
            for (name, conf) in &c.plugins {
                let path = format!("plugins.{name}");
                let Some(entry) = self.enabled_plugin(o, &path, name) else { continue };
                let Some(schema) = &entry.consumer_schema else {
                    self.issue(o, &path, &format!("plugin `{name}` has no consumer configuration"));
                    continue;
                };
                if let Err(found) = schema.check(conf) {
                    self.issues.extend(found.into_iter().map(|f| f.under(&path).in_resource(o)));
                    continue;
                }
                per_plugin
                    .entry(entry.name)
                    .or_insert_with(|| (entry.clone(), Vec::new()))
                    .1
                    .push((c.username.clone(), conf.clone()));
            }
        }
        let mut shared = HashMap::new();
        for (name, (entry, confs)) in per_plugin {
            let refs: Vec<ConsumerRef<'_>> = confs.iter().map(|(u, c)| ConsumerRef { username: u, conf: c }).collect();
            match entry.plugin.prepare_consumers(&refs) {
                Ok(Some(state)) => {
                    shared.insert(name, state);
                }
                Ok(None) => {}
                Err(e) => self.issues.push(Issue::new(format!("consumers: plugins.{name}"), e)),
            }
        }
        shared
    }

    fn check_metadata(&mut self, o: &str, m: &PluginMetadata) -> bool {
        let Some(entry) = self.enabled.get(&m.id).cloned() else {
            if crate::plugins_catalog().get(&m.id).is_some() {
                log::info!("{o}: metadata of plugin `{}` is ignored: the plugin is not enabled", m.id);
            } else {
                let known: Vec<String> = self.enabled.listed.iter().map(|e| e.name.to_owned()).collect();
                self.issue(o, "id", &unknown_plugin(&m.id, &known));
            }
            return false;
        };
        let Some(schema) = &entry.metadata_schema else {
            self.issue(o, "id", &format!("plugin `{}` takes no metadata", m.id));
            return false;
        };
        if let Err(found) = schema.check(&Value::Object(m.fields.clone())) {
            self.issues.extend(found.into_iter().map(|f| f.in_resource(o)));
            return false;
        }
        true
    }

    fn chain(
        &mut self,
        o: &str,
        confs: &PluginConfs,
        shared: &HashMap<&'static str, SharedState>,
        metadata: &HashMap<String, PluginMetadata>,
    ) -> PluginChain {
        let mut chain = Vec::with_capacity(confs.len());
        for (name, conf) in confs {
            let path = format!("plugins.{name}");
            let Some(entry) = self.enabled_plugin(o, &path, name) else { continue };
            if let Err(found) = entry.schema.check(conf) {
                self.issues.extend(found.into_iter().map(|f| f.under(&path).in_resource(o)));
                continue;
            }
            let meta = metadata.get(name).map(|m| Value::Object(m.fields.clone()));
            let ctx = BuildContext {
                owner: o,
                metadata: meta.as_ref(),
                shared: shared.get(entry.name),
                check_only: self.enabled.check_only,
            };
            match entry.plugin.build(conf, &ctx) {
                Ok(instance) => chain.push(BoundPlugin { entry, instance }),
                Err(e) => self.issue(o, &path, &e),
            }
        }
        sort_chain(&mut chain);
        chain.into()
    }
}

fn sort_chain(chain: &mut [BoundPlugin]) {
    chain.sort_by(|a, b| b.entry.priority.cmp(&a.entry.priority).then(a.entry.name.cmp(b.entry.name)));
}

/// Service plugins overridden by route plugins of the same name.
fn merge_chains(service: &PluginChain, route: &PluginChain) -> PluginChain {
    let mut merged: Vec<BoundPlugin> =
        service.iter().filter(|s| !route.iter().any(|r| r.entry.name == s.entry.name)).cloned().collect();
    merged.extend(route.iter().cloned());
    sort_chain(&mut merged);
    merged.into()
}

/// A JSON dump of a resource, as the control server reports it (defaults filled, ids as strings).
pub fn dump<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or_else(|e| json!({ "error_msg": e.to_string() }))
}

#[cfg(test)]
mod tests {
    use super::fingerprint;
    use serde_json::json;

    #[test]
    fn fingerprints_tell_values_apart() {
        let a = json!({"uri": "/a", "upstream": {"nodes": {"127.0.0.1:80": 1}}});
        assert_eq!(fingerprint("routes", &a), fingerprint("routes", &a.clone()));
        for other in [
            json!({"uri": "/b", "upstream": {"nodes": {"127.0.0.1:80": 1}}}),
            json!({"uri": "/a", "upstream": {"nodes": {"127.0.0.1:80": 2}}}),
            json!({"uri": "/a", "upstream": {"nodes": {"127.0.0.1:80": 1.0}}}),
            json!({"uri": "/a", "upstream": {"nodes": {"127.0.0.1:80": "1"}}}),
            json!({"uri": "/a", "upstream": {"nodes": [["127.0.0.1:80", 1]]}}),
            json!({"uri": "/a"}),
            json!({"ur": "i/a", "upstream": {"nodes": {"127.0.0.1:80": 1}}}),
        ] {
            assert_ne!(fingerprint("routes", &a), fingerprint("routes", &other), "{other}");
        }
        assert_ne!(fingerprint("routes", &json!(["ab", "c"])), fingerprint("routes", &json!(["a", "bc"])));
        assert_ne!(fingerprint("routes", &json!(null)), fingerprint("routes", &json!(false)));
        // One JSON in two lists parses to two types: two cache entries.
        assert_ne!(fingerprint("routes", &a), fingerprint("services", &a));
    }
}
