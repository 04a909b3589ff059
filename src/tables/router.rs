//! Route matching.
//!
//! Exact URIs live in a hash map, parameter URIs (`:name` / `{name}` segments) in a `matchit`
//! router (parameters renamed positionally, so that routes naming them differently never
//! conflict), and prefix URIs (trailing `*`) in a hash map probed at the few distinct prefix
//! lengths that exist. Matching cost depends on the request path, not on the number of routes.
//!
//! Among the routes whose URI matches and whose filters (methods, hosts, remote addresses,
//! status, then `vars`, compiled once here and evaluated on the request's context) accept the
//! request, the winner is: higher `priority`, then exact over parameter over
//! prefix, then the longer prefix, then the route defined first.

use std::net::IpAddr;
use std::sync::Arc;

use crate::fastmap::FastMap;
use crate::resources::cidr::Cidr;
use crate::resources::model::{HttpMethod, Route};
use crate::tables::shards::Shards;
use crate::tables::snapshot::PluginChain;
use crate::tables::upstream::{CompiledUpstream, Timeouts};
use weir_plugin::expr::Expr;
use weir_plugin::RequestCtx;

/// A host filter.
#[derive(Debug, Clone)]
pub enum HostMatch {
    /// `example.com`.
    Exact(String),
    /// `*.example.com` → `.example.com`.
    Suffix(String),
}

impl HostMatch {
    fn parse(h: &str) -> HostMatch {
        let h = h.to_ascii_lowercase();
        match h.strip_prefix('*') {
            Some(rest) => HostMatch::Suffix(rest.to_owned()),
            None => HostMatch::Exact(h),
        }
    }
    fn matches(&self, host: &str) -> bool {
        match self {
            HostMatch::Exact(h) => h.eq_ignore_ascii_case(host),
            HostMatch::Suffix(s) => {
                host.len() > s.len()
                    && host.is_char_boundary(host.len() - s.len())
                    && host[host.len() - s.len()..].eq_ignore_ascii_case(s)
            }
        }
    }
}

/// A route ready for the data plane.
pub struct CompiledRoute {
    /// The route as configured.
    pub route: Arc<Route>,
    /// Its id.
    pub id: Arc<str>,
    /// Its service id.
    pub service_id: Option<Arc<str>>,
    /// Method bitmask (0: any).
    pub methods: u16,
    /// Host filters (empty: any).
    pub hosts: Box<[HostMatch]>,
    /// The host patterns as configured, index-aligned with `hosts` (`$matched_host`).
    pub host_names: Box<[Arc<str>]>,
    /// The URI patterns as configured (`$matched_uri`), indexed by the table's entries.
    pub uri_names: Box<[Arc<str>]>,
    /// Client address filters (empty: any).
    pub remote_addrs: Box<[Cidr]>,
    /// Service plugins merged with route plugins (route wins), in priority order.
    pub plugins: PluginChain,
    /// Where requests go (none: the route must be served by a plugin).
    pub upstream: Option<Arc<CompiledUpstream>>,
    /// WebSocket handshakes are tunnelled (`enable_websocket` of the route or its service).
    pub websocket: bool,
    /// `vars`, compiled (checked when the snapshot was built).
    pub vars: Option<Expr>,
    /// The route's own upstream timeouts (`timeout`), over the upstream's.
    pub timeouts: Option<Timeouts>,
    /// Responses carry `X-Weir-Debug` (the route's label `debug_header: "true"`; for every
    /// route, `gateway.debug_header: true`).
    pub debug_header: bool,
}

/// Bit of a method in [`CompiledRoute::methods`].
pub fn method_bit(m: &str) -> u16 {
    match m {
        "GET" => 1,
        "POST" => 1 << 1,
        "PUT" => 1 << 2,
        "DELETE" => 1 << 3,
        "PATCH" => 1 << 4,
        "HEAD" => 1 << 5,
        "OPTIONS" => 1 << 6,
        "CONNECT" => 1 << 7,
        "TRACE" => 1 << 8,
        "PURGE" => 1 << 9,
        _ => 1 << 15,
    }
}

/// `HttpMethod` is declared in the bit order of [`method_bit`] (checked by a test).
fn methods_mask(methods: &[HttpMethod]) -> u16 {
    methods.iter().fold(0, |acc, m| acc | 1 << (*m as u16))
}

impl CompiledRoute {
    /// Builds the filters of `route`.
    pub fn new(
        route: Arc<Route>,
        service_hosts: Option<&[String]>,
        plugins: PluginChain,
        upstream: Option<Arc<CompiledUpstream>>,
    ) -> CompiledRoute {
        let mut names: Vec<&String> = route.hosts().into_iter().flatten().chain(route.host()).collect();
        if names.is_empty() {
            names = service_hosts.unwrap_or(&[]).iter().collect();
        }
        let hosts = names.iter().map(|h| HostMatch::parse(h)).collect();
        let host_names = names.iter().map(|h| Arc::from(h.as_str())).collect();
        let uri_names = route.uri_list().iter().map(|u| Arc::from(u.as_str())).collect();
        CompiledRoute {
            host_names,
            uri_names,
            id: Arc::from(route.id.0.as_str()),
            service_id: route.service_id.as_ref().map(|s| Arc::from(s.0.as_str())),
            methods: route.methods().map(methods_mask).unwrap_or(0),
            hosts,
            remote_addrs: route.remote_addrs().into_iter().flatten().filter_map(|a| Cidr::parse(a).ok()).collect(),
            plugins,
            upstream,
            websocket: route.enable_websocket,
            vars: route.vars().and_then(|v| Expr::compile(v).ok()),
            timeouts: route.timeout().map(|t| Timeouts {
                connect: std::time::Duration::from_secs_f64(t.connect),
                send: std::time::Duration::from_secs_f64(t.send),
                read: std::time::Duration::from_secs_f64(t.read),
            }),
            debug_header: route
                .more
                .as_ref()
                .and_then(|m| m.labels.get("debug_header"))
                .is_some_and(|v| v == "true" || v == "on"),
            route,
        }
    }

    /// The configured host pattern `host` matched (`None` when the route names no hosts).
    pub fn matched_host(&self, host: &str) -> Option<Arc<str>> {
        let i = self.hosts.iter().position(|h| h.matches(host))?;
        self.host_names.get(i).cloned()
    }

    /// Why the route's filters refuse the request, in the order they are checked (`None`: they
    /// accept it). The one check both the data plane ([`RouteTable::find`]) and
    /// `POST /v1/explain` ([`RouteTable::explain`]) make.
    #[inline]
    fn refuses(&self, method_bit: u16, host: &str, ip: IpAddr, ctx: &RequestCtx) -> Option<Reject> {
        if self.route.status != 1 {
            Some(Reject::Disabled)
        } else if self.methods != 0 && self.methods & method_bit == 0 {
            Some(Reject::Method)
        } else if !(self.hosts.is_empty() || self.hosts.iter().any(|h| h.matches(host))) {
            Some(Reject::Host)
        } else if !(self.remote_addrs.is_empty() || self.remote_addrs.iter().any(|c| c.contains(ip))) {
            Some(Reject::RemoteAddrs)
        } else if !self.vars.as_ref().is_none_or(|v| v.matches(ctx)) {
            Some(Reject::Vars)
        } else {
            None
        }
    }

    #[inline]
    fn accepts(&self, method_bit: u16, host: &str, ip: IpAddr, ctx: &RequestCtx) -> bool {
        self.refuses(method_bit, host, ip, ctx).is_none()
    }
}

/// Why a route whose URI matches a request does not take it (the first filter that refuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// `status: 0`.
    Disabled,
    /// The method is not among `methods`.
    Method,
    /// The host matches none of `hosts` / `host` (or the service's `hosts`).
    Host,
    /// The client address is in none of `remote_addrs`.
    RemoteAddrs,
    /// `vars` does not hold.
    Vars,
}

impl Reject {
    /// `status`, `method`, `host`, `remote_addrs`, `vars`: the field that refused.
    pub fn field(self) -> &'static str {
        match self {
            Reject::Disabled => "status",
            Reject::Method => "methods",
            Reject::Host => "hosts",
            Reject::RemoteAddrs => "remote_addrs",
            Reject::Vars => "vars",
        }
    }
}

/// Which lookup table a candidate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableKind {
    /// The exact-URI map.
    Exact,
    /// The parameter router (`:name`, `{name}`).
    Parameter,
    /// The prefix map (`/a/*`).
    Prefix,
}

impl TableKind {
    /// `exact`, `parameter`, `prefix`.
    pub fn name(self) -> &'static str {
        match self {
            TableKind::Exact => "exact",
            TableKind::Parameter => "parameter",
            TableKind::Prefix => "prefix",
        }
    }
}

/// One route whose URI matches a request, as [`RouteTable::explain`] reports it.
pub struct Candidate {
    /// The route.
    pub route: Arc<CompiledRoute>,
    /// The table the URI matched in.
    pub table: TableKind,
    /// The URI pattern that matched.
    pub uri: Option<Arc<str>>,
    /// The prefix length (prefix table).
    pub prefix_len: usize,
    /// Why its filters refuse the request (`None`: they accept it).
    pub rejected: Option<Reject>,
    /// Path parameters, when it matched in the parameter table.
    pub params: Vec<(Arc<str>, String)>,
}

#[derive(Clone)]
struct Entry {
    route: Arc<CompiledRoute>,
    /// 3 exact, 2 parameter, 1 prefix.
    rank: u8,
    /// Which of the route's `uri_names` this entry is.
    uri: u16,
    /// Prefix length (prefix routes; a URI is at most 4096 bytes).
    len: u32,
    /// Parameter names by position.
    names: Arc<[Arc<str>]>,
    /// The route's rank in definition order among the entries of its list (ties: entries of
    /// different lists never tie, their rank, length or URI differ). A build numbers every
    /// route; a patch numbers again only the lists it adds to. Kept here rather than in the
    /// route, so that a route unchanged by a rebuild is the same `CompiledRoute` even when
    /// routes before it come or go.
    order: u32,
}

/// The entries of one exact URI or prefix: most belong to one route, held in place (no
/// allocation per route when a table is built, one pointer fewer to follow per request).
type Entries = smallvec::SmallVec<[Entry; 1]>;

/// The parameter URIs: matchit's router over the positional patterns, and each pattern's
/// entries. Shared by the tables patched from one another until a parameter route comes or goes.
#[derive(Default, Clone)]
struct ParamTable {
    router: matchit::Router<Vec<Entry>>,
    patterns: FastMap<String, usize>,
    lists: Vec<Vec<Entry>>,
}

impl ParamTable {
    /// Puts every pattern in a new router; the patterns matchit refuses.
    fn index(&mut self) -> Vec<String> {
        self.router = matchit::Router::new();
        let mut problems = Vec::new();
        for (pattern, &i) in &self.patterns {
            if let Err(e) = self.router.insert(pattern.clone(), self.lists[i].clone()) {
                problems.push(format!("route uri pattern `{pattern}`: {e}"));
            }
        }
        problems
    }

    /// Drops the patterns no route has any more.
    fn compact(&mut self) {
        let mut patterns: Vec<(String, usize)> = std::mem::take(&mut self.patterns).into_iter().collect();
        patterns.sort_unstable_by_key(|(_, i)| *i);
        let mut lists: Vec<Option<Vec<Entry>>> = std::mem::take(&mut self.lists).into_iter().map(Some).collect();
        for (pattern, i) in patterns {
            if let Some(list) = lists.get_mut(i).and_then(Option::take).filter(|l| !l.is_empty()) {
                self.patterns.insert(pattern, self.lists.len());
                self.lists.push(list);
            }
        }
    }
}

/// The routing table of one snapshot.
#[derive(Default)]
pub struct RouteTable {
    /// Keyed by the route's own `uri_names` entry (shared, not copied), in shards that a
    /// patched table shares with this one.
    exact: Shards<Arc<str>, Entries>,
    params: Arc<ParamTable>,
    prefix: Shards<String, Entries>,
    /// The distinct prefix lengths, longest first (what a request probes).
    prefix_lens: Vec<usize>,
    /// How many prefixes have each length.
    prefix_counts: Vec<(usize, u32)>,
    len: usize,
    reads_form: bool,
    /// Every route, in definition order (the dashboard lists them).
    routes: Vec<Arc<CompiledRoute>>,
}

/// A matched route and its path parameters.
pub struct Matched {
    /// The route.
    pub route: Arc<CompiledRoute>,
    /// Path parameters.
    pub params: Vec<(Arc<str>, String)>,
    /// The URI pattern that matched.
    pub uri: Option<Arc<str>>,
}

enum Pattern<'u> {
    Exact,
    Prefix(&'u str),
    Params { pattern: String, names: Vec<Arc<str>> },
}

fn classify(uri: &str) -> Pattern<'_> {
    let (base, prefix) = match uri.strip_suffix('*') {
        Some(b) => (b, true),
        None => (uri, false),
    };
    // (Most URIs have neither byte: no walk of their segments then.)
    let has_params = base.bytes().any(|b| b == b':' || b == b'{')
        && base.split('/').any(|s| s.starts_with(':') || (s.starts_with('{') && s.ends_with('}') && s.len() > 2));
    if !has_params {
        return if prefix { Pattern::Prefix(base) } else { Pattern::Exact };
    }
    let mut names = Vec::new();
    let segments: Vec<String> = base
        .split('/')
        .map(|s| {
            let name = s.strip_prefix(':').or_else(|| s.strip_prefix('{').and_then(|r| r.strip_suffix('}')));
            match name {
                Some(n) if !n.is_empty() => {
                    let p = format!("{{p{}}}", names.len());
                    names.push(Arc::from(n));
                    p
                }
                _ => s.replace('{', "{{").replace('}', "}}"),
            }
        })
        .collect();
    let mut pattern = segments.join("/");
    if prefix {
        pattern.push_str(&format!("{{*p{}}}", names.len()));
        names.push(Arc::from("*"));
    }
    Pattern::Params { pattern, names }
}

impl RouteTable {
    /// Builds the table; routes whose parameter pattern matchit refuses are reported.
    pub fn build(routes: Vec<Arc<CompiledRoute>>) -> (RouteTable, Vec<String>) {
        let mut t = RouteTable::default();
        // Most routes have one exact URI: no rehashing on the way to 10,000.
        t.exact.reserve(routes.len());
        t.routes.reserve_exact(routes.len());
        // Shared by every exact and prefix entry (an empty `Arc<[_]>` still allocates).
        let no_names: Arc<[Arc<str>]> = Arc::from([]);
        for (order, route) in routes.into_iter().enumerate() {
            t.add(&route, u32::try_from(order).unwrap_or(u32::MAX), &no_names);
            t.len += 1;
            t.routes.push(route);
        }
        let problems = Arc::make_mut(&mut t.params).index();
        t.sort_prefix_lens();
        (t, problems)
    }

    /// This table with the routes `gone` taken out and `added` put in, `routes` being the new
    /// list in definition order: what a change to a few of 10,000 routes costs without building
    /// every entry again (the shards of entries it does not touch are shared with this table).
    /// Definition order must be id order (a provider whose order is its keys', etcd): the
    /// entries of one URI that a change touches are ordered again by their routes' ids (ties are
    /// only ever broken within one list: one exact URI, one prefix or one parameter pattern).
    /// The parameter patterns matchit refuses are the error, as [`RouteTable::build`] reports
    /// them.
    pub fn patched(
        &self,
        gone: &[&Arc<CompiledRoute>],
        added: &[Arc<CompiledRoute>],
        routes: Vec<Arc<CompiledRoute>>,
    ) -> Result<RouteTable, Vec<String>> {
        // A parameter route coming or going builds matchit's router again (from the patterns'
        // lists, copied): the old router is not copied first.
        let touches_params = gone
            .iter()
            .copied()
            .chain(added)
            .any(|r| r.uri_names.iter().any(|u| matches!(classify(u), Pattern::Params { .. })));
        let params = match touches_params {
            true => Arc::new(ParamTable {
                router: matchit::Router::new(),
                patterns: self.params.patterns.clone(),
                lists: self.params.lists.clone(),
            }),
            false => self.params.clone(),
        };
        let mut t = RouteTable {
            exact: self.exact.clone(),
            params,
            prefix: self.prefix.clone(),
            prefix_lens: Vec::new(),
            prefix_counts: self.prefix_counts.clone(),
            len: routes.len(),
            reads_form: false,
            routes,
        };
        let same = |e: &Entry, r: &Arc<CompiledRoute>| Arc::ptr_eq(&e.route, r);
        for g in gone {
            for uri in g.uri_names.iter() {
                match classify(uri) {
                    Pattern::Exact => {
                        drop_entries(&mut t.exact, uri, |e| same(e, g));
                    }
                    Pattern::Prefix(p) => {
                        if drop_entries(&mut t.prefix, p, |e| same(e, g)) {
                            count_prefix(&mut t.prefix_counts, p.len(), false);
                        }
                    }
                    Pattern::Params { pattern, .. } => {
                        let params = Arc::make_mut(&mut t.params);
                        if let Some(&i) = params.patterns.get(&pattern) {
                            params.lists[i].retain(|e| !same(e, g));
                        }
                    }
                }
            }
        }
        let no_names: Arc<[Arc<str>]> = Arc::from([]);
        for a in added {
            t.add(a, 0, &no_names);
        }
        // The entries of each URI an added route has, in id order again.
        let by_id = |list: &mut [Entry]| {
            list.sort_by(|x, y| x.route.id.cmp(&y.route.id));
            for (order, e) in list.iter_mut().enumerate() {
                e.order = u32::try_from(order).unwrap_or(u32::MAX);
            }
        };
        for a in added {
            for uri in a.uri_names.iter() {
                match classify(uri) {
                    Pattern::Exact => t.exact.get_mut(uri).into_iter().for_each(|l| by_id(l)),
                    Pattern::Prefix(p) => t.prefix.get_mut(p).into_iter().for_each(|l| by_id(l)),
                    Pattern::Params { pattern, .. } => {
                        let params = Arc::make_mut(&mut t.params);
                        if let Some(&i) = params.patterns.get(&pattern) {
                            by_id(&mut params.lists[i]);
                        }
                    }
                }
            }
        }
        // matchit's router is built again only when a parameter route came or went.
        if touches_params {
            let params = Arc::make_mut(&mut t.params);
            params.compact();
            let problems = params.index();
            if !problems.is_empty() {
                return Err(problems);
            }
        }
        t.sort_prefix_lens();
        t.reads_form = match gone.iter().any(|r| reads_form(r)) {
            true => t.routes.iter().any(|r| reads_form(r)),
            false => self.reads_form || added.iter().any(|r| reads_form(r)),
        };
        Ok(t)
    }

    /// Puts the entries of `route` (one per URI) in the table, at place `order`.
    fn add(&mut self, route: &Arc<CompiledRoute>, order: u32, no_names: &Arc<[Arc<str>]>) {
        self.reads_form |= reads_form(route);
        for (i, uri) in route.uri_names.iter().enumerate() {
            let ui = u16::try_from(i).unwrap_or(u16::MAX);
            match classify(uri) {
                Pattern::Exact => {
                    let list = self.exact.get_or_insert_with(uri, || (uri.clone(), Entries::new()));
                    list.push(Entry { route: route.clone(), rank: 3, uri: ui, len: 0, names: no_names.clone(), order });
                }
                Pattern::Prefix(p) => {
                    let len = p.len();
                    let entry_len = u32::try_from(len).unwrap_or(u32::MAX);
                    let entry = Entry {
                        route: route.clone(),
                        rank: 1,
                        uri: ui,
                        len: entry_len,
                        names: no_names.clone(),
                        order,
                    };
                    // (The prefix is copied for its first route only.)
                    let mut new = false;
                    let list = self.prefix.get_or_insert_with(p, || {
                        new = true;
                        (p.to_owned(), Entries::new())
                    });
                    list.push(entry);
                    if new {
                        count_prefix(&mut self.prefix_counts, len, true);
                    }
                }
                Pattern::Params { pattern, names } => {
                    let entry = Entry { route: route.clone(), rank: 2, uri: ui, len: 0, names: names.into(), order };
                    let params = Arc::make_mut(&mut self.params);
                    match params.patterns.get(&pattern) {
                        Some(&i) => params.lists[i].push(entry),
                        None => {
                            params.patterns.insert(pattern, params.lists.len());
                            params.lists.push(vec![entry]);
                        }
                    }
                }
            }
        }
    }

    /// The prefix lengths a request probes, longest first.
    fn sort_prefix_lens(&mut self) {
        self.prefix_lens = self.prefix_counts.iter().map(|(len, _)| *len).collect();
        self.prefix_lens.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Number of routes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Every route, in definition order.
    pub fn routes(&self) -> &[Arc<CompiledRoute>] {
        &self.routes
    }

    /// Whether there are no routes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether some route's `vars` reads a form body argument (`post_arg_*`): the body of a
    /// form request is then read before routing.
    pub fn reads_form(&self) -> bool {
        self.reads_form
    }

    /// Every entry whose URI matches `path`, from the exact, parameter and prefix tables in
    /// that order (what both [`RouteTable::find`] and [`RouteTable::explain`] walk).
    #[inline]
    fn visit<'t, 'p>(
        &'t self,
        path: &'p str,
        mut f: impl FnMut(&'t Entry, TableKind, Option<&matchit::Params<'t, 'p>>),
    ) {
        if let Some(list) = self.exact.get(path) {
            for e in list {
                f(e, TableKind::Exact, None);
            }
        }
        if let Ok(m) = self.params.router.at(path) {
            for e in m.value {
                f(e, TableKind::Parameter, Some(&m.params));
            }
        }
        for &len in &self.prefix_lens {
            if len > path.len() || !path.is_char_boundary(len) {
                continue;
            }
            if let Some(list) = self.prefix.get(&path[..len]) {
                for e in list {
                    f(e, TableKind::Prefix, None);
                }
            }
        }
    }

    /// The best route for a request (`ctx` holds its method, path, headers and client address;
    /// `host` is its Host without the port, `ip` the client address routes filter on).
    pub fn find(&self, host: &str, ip: IpAddr, ctx: &RequestCtx) -> Option<Matched> {
        let (method, path) = (ctx.method.as_str(), ctx.path.as_str());
        let bit = method_bit(method);
        let mut best: Option<(&Entry, Option<matchit::Params<'_, '_>>)> = None;
        self.visit(path, |e, _, params| {
            if outranks(e, best.as_ref().map(|b| b.0)) && e.route.accepts(bit, host, ip, ctx) {
                best = Some((e, params.cloned()));
            }
        });
        let (entry, params) = best?;
        let params = match params {
            Some(p) => named_params(entry, &p),
            None => Vec::new(),
        };
        let uri = entry.route.uri_names.get(usize::from(entry.uri)).cloned();
        Some(Matched { route: entry.route.clone(), params, uri })
    }

    /// Every route whose URI matches the request, with why each filter-refused one is refused,
    /// in the order the data plane considers them (not on the request path: it checks every
    /// candidate, where [`RouteTable::find`] skips those that could not win). The winner is
    /// still [`RouteTable::find`]'s answer.
    pub fn explain(&self, host: &str, ip: IpAddr, ctx: &RequestCtx) -> Vec<Candidate> {
        let bit = method_bit(ctx.method.as_str());
        let mut out = Vec::new();
        self.visit(ctx.path.as_str(), |e, table, params| {
            out.push(Candidate {
                route: e.route.clone(),
                table,
                uri: e.route.uri_names.get(usize::from(e.uri)).cloned(),
                prefix_len: e.len as usize,
                rejected: e.route.refuses(bit, host, ip, ctx),
                params: params.map(|p| named_params(e, p)).unwrap_or_default(),
            });
        });
        out
    }
}

/// Whether `e` would win over the current best (`None`: nothing yet): higher priority, then
/// exact over parameter over prefix, then the longer prefix, then the route defined first.
#[inline]
fn outranks(e: &Entry, best: Option<&Entry>) -> bool {
    match best {
        None => true,
        Some(b) => {
            (e.route.route.priority, e.rank, e.len, std::cmp::Reverse(e.order))
                > (b.route.route.priority, b.rank, b.len, std::cmp::Reverse(b.order))
        }
    }
}

/// Removes the entries `gone` picks from `key`'s list, and the key when none is left (then
/// `true`).
fn drop_entries<K: std::borrow::Borrow<str> + Clone>(
    map: &mut Shards<K, Entries>,
    key: &str,
    gone: impl Fn(&Entry) -> bool,
) -> bool {
    let Some(list) = map.get_mut(key) else { return false };
    list.retain(|e| !gone(e));
    if list.is_empty() {
        map.remove(key);
        return true;
    }
    false
}

/// Whether some `vars` of `route` reads a form body argument (`post_arg_*`).
fn reads_form(route: &CompiledRoute) -> bool {
    route.vars.as_ref().is_some_and(|v| v.variables().iter().any(|n| n.starts_with("post_arg_")))
}

/// One prefix of length `len` more (`up`) or fewer in `counts`.
fn count_prefix(counts: &mut Vec<(usize, u32)>, len: usize, up: bool) {
    match counts.iter().position(|(l, _)| *l == len) {
        Some(at) if up => counts[at].1 += 1,
        Some(at) => {
            counts[at].1 = counts[at].1.saturating_sub(1);
            if counts[at].1 == 0 {
                counts.swap_remove(at);
            }
        }
        None if up => counts.push((len, 1)),
        None => {}
    }
}

/// matchit's positional parameters under the route's own names.
fn named_params(entry: &Entry, p: &matchit::Params<'_, '_>) -> Vec<(Arc<str>, String)> {
    p.iter()
        .filter_map(|(k, v)| {
            let i: usize = k.strip_prefix('p')?.parse().ok()?;
            Some((entry.names.get(i)?.clone(), v.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(id: &str, uri: &str, extra: serde_json::Value) -> Arc<CompiledRoute> {
        let mut v = serde_json::json!({"id": id, "uri": uri});
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        let r: Route = serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"));
        Arc::new(CompiledRoute::new(Arc::new(r), None, Default::default(), None))
    }

    fn table(routes: Vec<Arc<CompiledRoute>>) -> RouteTable {
        let routes = routes
            .into_iter()
            .map(|r| {
                let mut c = CompiledRoute::new(r.route.clone(), None, Default::default(), None);
                c.hosts = r.hosts.clone();
                Arc::new(c)
            })
            .collect();
        let (t, problems) = RouteTable::build(routes);
        assert!(problems.is_empty(), "{problems:?}");
        t
    }

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn ctx(m: &str, host: &str, path: &str, query: &str, headers: &[(&str, &str)]) -> RequestCtx {
        let mut map = http::HeaderMap::new();
        map.insert(http::header::HOST, http::HeaderValue::from_str(host).unwrap_or_else(|e| panic!("{e}")));
        for (k, v) in headers {
            let name = http::HeaderName::from_bytes(k.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
            map.append(name, http::HeaderValue::from_str(v).unwrap_or_else(|e| panic!("{e}")));
        }
        let method = http::Method::from_bytes(m.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        let addr = std::net::SocketAddr::new(IP, 40000);
        RequestCtx::new(method, path.into(), query.into(), map, addr, Arc::from("127.0.0.1"), addr)
    }

    fn find(t: &RouteTable, m: &str, host: &str, path: &str) -> Option<Matched> {
        t.find(host, IP, &ctx(m, host, path, "", &[]))
    }

    fn id(t: &RouteTable, m: &str, host: &str, path: &str) -> Option<String> {
        find(t, m, host, path).map(|m| m.route.id.to_string())
    }

    #[test]
    fn vars_pick_among_routes_of_one_uri() {
        let t = table(vec![
            route("plain", "/api", serde_json::json!({})),
            route(
                "canary",
                "/api",
                serde_json::json!({"priority": 1, "vars": [["arg_name", "==", "jack"], ["http_x_env", "~~", "^ca"]]}),
            ),
            route("or", "/or", serde_json::json!({"vars": ["OR", [["arg_a", "==", "1"]], [["cookie_b", "==", "2"]]]})),
        ]);
        let pick = |path: &str, query: &str, headers: &[(&str, &str)]| {
            t.find("h", IP, &ctx("GET", "h", path, query, headers)).map(|m| m.route.id.to_string())
        };
        assert_eq!(pick("/api", "name=jack", &[("x-env", "canary")]).as_deref(), Some("canary"));
        assert_eq!(pick("/api", "name=jack", &[("x-env", "prod")]).as_deref(), Some("plain"));
        assert_eq!(pick("/api", "name=jill", &[("x-env", "canary")]).as_deref(), Some("plain"));
        assert_eq!(pick("/or", "a=1", &[]).as_deref(), Some("or"));
        assert_eq!(pick("/or", "", &[("cookie", "x=1; b=2")]).as_deref(), Some("or"));
        assert_eq!(pick("/or", "a=2", &[]), None);
    }

    #[test]
    fn method_enum_order_matches_the_bits() {
        use HttpMethod::*;
        for (m, name) in [
            (GET, "GET"),
            (POST, "POST"),
            (PUT, "PUT"),
            (DELETE, "DELETE"),
            (PATCH, "PATCH"),
            (HEAD, "HEAD"),
            (OPTIONS, "OPTIONS"),
            (CONNECT, "CONNECT"),
            (TRACE, "TRACE"),
            (PURGE, "PURGE"),
        ] {
            assert_eq!(methods_mask(&[m]), method_bit(name), "{name}");
        }
    }

    #[test]
    fn exact_beats_param_beats_prefix() {
        let t = table(vec![
            route("prefix", "/a/*", serde_json::json!({})),
            route("param", "/a/:x", serde_json::json!({})),
            route("exact", "/a/b", serde_json::json!({})),
            route("longer", "/a/b/*", serde_json::json!({})),
        ]);
        assert_eq!(id(&t, "GET", "h", "/a/b").as_deref(), Some("exact"));
        assert_eq!(id(&t, "GET", "h", "/a/c").as_deref(), Some("param"));
        assert_eq!(id(&t, "GET", "h", "/a/c/d").as_deref(), Some("prefix"));
        assert_eq!(id(&t, "GET", "h", "/a/b/d").as_deref(), Some("longer"));
        assert_eq!(id(&t, "GET", "h", "/b"), None);
    }

    #[test]
    fn priority_wins_over_specificity() {
        let t = table(vec![
            route("exact", "/a/b", serde_json::json!({})),
            route("prefix", "/a/*", serde_json::json!({"priority": 10})),
        ]);
        assert_eq!(id(&t, "GET", "h", "/a/b").as_deref(), Some("prefix"));
    }

    #[test]
    fn filters_fall_through_to_the_next_candidate() {
        let t = table(vec![
            route("post-only", "/a/b", serde_json::json!({"methods": ["POST"]})),
            route("any", "/a/*", serde_json::json!({})),
            route("host", "/h", serde_json::json!({"hosts": ["*.example.com"]})),
            route("disabled", "/d", serde_json::json!({"status": 0})),
        ]);
        assert_eq!(id(&t, "POST", "h", "/a/b").as_deref(), Some("post-only"));
        assert_eq!(id(&t, "GET", "h", "/a/b").as_deref(), Some("any"));
        assert_eq!(id(&t, "GET", "api.example.com", "/h").as_deref(), Some("host"));
        assert_eq!(id(&t, "GET", "example.com", "/h"), None);
        assert_eq!(id(&t, "GET", "h", "/d"), None);
    }

    #[test]
    fn parameters_are_captured_by_name() {
        let t = table(vec![
            route("u", "/users/:id/posts/{post}", serde_json::json!({})),
            route("v", "/users/:uid", serde_json::json!({})),
        ]);
        let m = find(&t, "GET", "h", "/users/7/posts/9").unwrap_or_else(|| panic!("no match"));
        let params: Vec<(String, String)> = m.params.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        assert_eq!(params, vec![("id".into(), "7".into()), ("post".into(), "9".into())]);
        let m = find(&t, "GET", "h", "/users/8").unwrap_or_else(|| panic!("no match"));
        assert_eq!(m.params[0].0.as_ref(), "uid");
        assert_eq!(id(&t, "GET", "h", "/users/"), None);
    }
}
