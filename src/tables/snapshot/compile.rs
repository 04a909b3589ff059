//! From validated resources to what the data plane runs: compiled upstreams (reused from the
//! snapshot this one replaces while unchanged), merged plugin chains and the routing tables.

use std::collections::HashMap;
use std::sync::Arc;

use super::*;

impl Builder<'_> {
    /// Every DNS name the upstreams of this build name, but those of routes kept from the
    /// previous build (`kept`, by place), whose names are being resolved already.
    fn dns_queries(&self, kept: &[Option<&Arc<CompiledRoute>>]) -> Vec<crate::dns::Query> {
        let snap = &self.snap;
        let inline = snap.services.iter().filter_map(|s| s.upstream.as_deref());
        let changed = snap.routes.iter().zip(kept).filter(|(_, k)| k.is_none()).map(|(r, _)| r);
        let inline = inline.chain(changed.filter_map(|r| r.upstream.as_deref()));
        let inline = inline.chain(snap.stream_routes.iter().filter_map(|r| r.upstream.as_deref()));
        let all = snap.upstreams.iter().map(|u| &**u).chain(inline);
        all.flat_map(crate::tables::upstream::dns_queries).collect()
    }

    /// Compiles upstreams, merges plugin chains and builds the routing table.
    pub(super) fn compile_data_plane(&mut self, mut stream_chains: HashMap<String, StreamChain>) {
        let all = std::cell::RefCell::new(Vec::new());
        // An upstream equal to the one its owner had in the previous build is that same compiled
        // upstream: no recompiling, and its balancer state and checker carry over.
        let empty = Compiled::default();
        let previous = self.previous.map_or(&empty, |p| &p.compiled_by_owner);
        let current = std::cell::RefCell::new(FastMap::with_capacity_and_hasher(previous.len(), Default::default()));
        // The previous build's compiled route of each route made from the very same parsed
        // route, by place.
        let mut reuse = RouteReuse::new(self.previous);
        let kept: Vec<Option<&Arc<CompiledRoute>>> =
            self.snap.routes.iter().enumerate().map(|(i, r)| reuse.find(i, r)).collect();
        if let Some(dns) = crate::dns::service().filter(|_| !self.check_only) {
            dns.prefetch(self.dns_queries(&kept), crate::dns::FIRST_ANSWER_WAIT);
        }
        // Reused while its configuration and the DNS answers it was built from are the same
        // (`same_conf`: known to be, the owner being the very entry it was compiled from).
        let identities = &self.snap.certs.identities;
        let current_of =
            |c: &Arc<CompiledUpstream>, u: &Upstream, same_conf: bool| still_current(c, u, same_conf, identities);
        let fresh = |owner: (&'static str, &str), u: &Upstream| {
            let c = compile_upstream(owner, u, identities);
            all.borrow_mut().push(c.clone());
            c
        };
        // Upstreams of upstream objects, services and stream routes: found again by owner.
        let compile = |owner: (&'static str, &str), u: &Upstream| {
            let key = (owner.0, owner.1.to_owned());
            let c = match previous.get(&key).filter(|c| current_of(c, u, false)) {
                Some(c) => {
                    all.borrow_mut().push(c.clone());
                    c.clone()
                }
                None => fresh(owner, u),
            };
            current.borrow_mut().insert(key, c.clone());
            c
        };
        // A route's own upstream: found again through the previous build's route of that id
        // (no owner map to fill for 10,000 routes).
        let route_upstream = |r: &Route, u: &Upstream, kept: Option<&Arc<CompiledRoute>>| {
            let (before, same_conf) = match kept {
                Some(p) => (Some(p), true),
                None => (reuse.by_id(&r.id.0), false),
            };
            // (The previous route of this id may have used an upstream object or its service's.)
            let own = before.and_then(|p| p.upstream.as_ref()).filter(|c| c.owner.0 == "routes");
            match own.filter(|c| current_of(c, u, same_conf)) {
                Some(c) => {
                    all.borrow_mut().push(c.clone());
                    c.clone()
                }
                None => fresh(("routes", &r.id.0), u),
            }
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
        let empty: PluginChain = PluginChain::default();
        let mut compiled = Vec::with_capacity(self.snap.routes.len());
        for (r, &before) in self.snap.routes.iter().zip(&kept) {
            let service = r.service_id.as_ref().and_then(|sid| self.snap.service(&sid.0).cloned());
            let upstream = match (&r.upstream, &r.upstream_id) {
                (Some(u), _) => Some(route_upstream(r, u, before)),
                (None, Some(id)) => objects.get(&id.0).cloned(),
                (None, None) => service.as_ref().and_then(|s| service_upstreams.get(&s.id.0).cloned().flatten()),
            };
            // Routes without plugins have no chain entry: no lookup (and no key to build) for them.
            let route_chain = match r.plugins.is_empty() && r.plugin_config_id().is_none() {
                true => empty.clone(),
                false => self.route_chains.get(&r.id.0).cloned().unwrap_or_else(|| empty.clone()),
            };
            let plugins = match &service {
                None => route_chain,
                Some(s) => {
                    let service_chain =
                        self.snap.chains.get(&("services", s.id.0.clone())).cloned().unwrap_or_else(|| empty.clone());
                    merge_chains(&service_chain, &route_chain)
                }
            };
            // The previous build's route, when nothing it was compiled from changed: the same
            // parsed route, service, upstream and plugins.
            let kept = before.filter(|p| {
                let same_service = match (&service, self.previous) {
                    (None, _) => true,
                    (Some(s), Some(prev)) => prev.service(&s.id.0).is_some_and(|ps| Arc::ptr_eq(ps, s)),
                    (Some(_), None) => false,
                };
                let same_upstream = match (&p.upstream, &upstream) {
                    (None, None) => true,
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    _ => false,
                };
                same_service && same_upstream && p.plugins.same_as(&plugins)
            });
            match kept {
                Some(p) => compiled.push(p.clone()),
                None => {
                    let hosts = service.as_ref().and_then(|s| s.hosts.clone());
                    let mut c = CompiledRoute::new(r.clone(), hosts.as_deref(), plugins, upstream);
                    c.websocket |= service.as_ref().is_some_and(|s| s.enable_websocket);
                    compiled.push(Arc::new(c));
                }
            }
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
        self.snap.compiled_by_owner = current.into_inner();
        self.snap.upstream_objects = objects.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
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
        self.snap.global_chain = Arc::new(Chain::from(global));
    }
}

/// Whether `c`, compiled for `u` (`same_conf`: known to be; else compared), is still what
/// compiling it again would give: the same DNS answers and client identity.
pub(super) fn still_current(
    c: &CompiledUpstream,
    u: &Upstream,
    same_conf: bool,
    identities: &HashMap<String, Arc<crate::mtls::ClientIdentity>>,
) -> bool {
    (same_conf || *c.conf == *u) && c.dns_current() && c.identity_current(identities)
}

/// `u` compiled for `owner` (its warnings logged under the owner's name).
pub(super) fn compile_upstream(
    owner: (&'static str, &str),
    u: &Upstream,
    identities: &HashMap<String, Arc<crate::mtls::ClientIdentity>>,
) -> Arc<CompiledUpstream> {
    let (c, warnings) = CompiledUpstream::compile((owner.0, Arc::from(owner.1)), Arc::new(u.clone()), identities);
    for w in warnings {
        log::warn!("{}[{}]: upstream: {w}", owner.0, owner.1);
    }
    Arc::new(c)
}

/// Finds, for a route of this build, the previous snapshot's compiled route made from the very
/// same parsed route (the parse cache hands an unchanged entry back as the same `Arc`). Tried at
/// the same place first, shifted by as many routes as came or went before it so far, then by id
/// in the previous snapshot (whose routes are in its table's order).
struct RouteReuse<'p> {
    previous: Option<&'p Snapshot>,
    routes: &'p [Arc<CompiledRoute>],
    /// Where the last route found was in the previous snapshot, relative to its place now.
    shift: isize,
}

impl<'p> RouteReuse<'p> {
    fn new(previous: Option<&'p Snapshot>) -> Self {
        RouteReuse { previous, routes: previous.map_or(&[], |p| p.table.routes()), shift: 0 }
    }

    fn find(&mut self, order: usize, r: &Arc<Route>) -> Option<&'p Arc<CompiledRoute>> {
        let guess = order.checked_add_signed(self.shift).and_then(|i| self.routes.get(i));
        if let Some(p) = guess.filter(|p| Arc::ptr_eq(&p.route, r)) {
            return Some(p);
        }
        let (at, p) = self.place(&r.id.0)?;
        self.shift = at as isize - order as isize;
        Some(p).filter(|p| Arc::ptr_eq(&p.route, r))
    }

    /// The previous build's route of this id, whatever it was made from.
    fn by_id(&self, id: &str) -> Option<&'p Arc<CompiledRoute>> {
        self.place(id).map(|(_, p)| p)
    }

    fn place(&self, id: &str) -> Option<(usize, &'p Arc<CompiledRoute>)> {
        let at = self.previous?.route_place(id)?;
        self.routes.get(at).filter(|p| &*p.id == id).map(|p| (at, p))
    }
}
