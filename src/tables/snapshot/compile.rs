//! From validated resources to what the data plane runs: compiled upstreams (reused from the
//! snapshot this one replaces while unchanged), merged plugin chains and the routing tables.

use std::collections::HashMap;
use std::sync::Arc;

use super::*;

impl Builder<'_> {
    /// Every DNS name the upstreams of this build name.
    fn dns_queries(&self) -> Vec<crate::dns::Query> {
        let snap = &self.snap;
        let inline = snap.services.iter().filter_map(|s| s.upstream.as_deref());
        let inline = inline.chain(snap.routes.iter().filter_map(|r| r.upstream.as_deref()));
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
        if let Some(dns) = crate::dns::service().filter(|_| !self.check_only) {
            dns.prefetch(self.dns_queries(), crate::dns::FIRST_ANSWER_WAIT);
        }
        let compile = |owner: (&'static str, &str), u: &Upstream| {
            let key = (owner.0, owner.1.to_owned());
            // Reused while its configuration and the DNS answers it was built from are the same.
            let same = |c: &&Arc<CompiledUpstream>| {
                *c.conf == *u && c.dns_current() && c.identity_current(&self.snap.certs.identities)
            };
            let c = match previous.get(&key).filter(same) {
                Some(c) => c.clone(),
                None => {
                    let (c, warnings) = CompiledUpstream::compile(
                        (owner.0, Arc::from(owner.1)),
                        Arc::new(u.clone()),
                        &self.snap.certs.identities,
                    );
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
        let empty: PluginChain = PluginChain::default();
        let mut compiled = Vec::with_capacity(self.snap.routes.len());
        for (order, r) in self.snap.routes.iter().enumerate() {
            let service = r.service_id.as_ref().and_then(|sid| self.snap.service(&sid.0).cloned());
            let upstream = match (&r.upstream, &r.upstream_id) {
                (Some(u), _) => Some(compile(("routes", &r.id.0), u)),
                (None, Some(id)) => objects.get(&id.0).cloned(),
                (None, None) => service.as_ref().and_then(|s| service_upstreams.get(&s.id.0).cloned().flatten()),
            };
            // Routes without plugins have no chain entry: no lookup (and no key to build) for them.
            let route_chain = match r.plugins.is_empty() && r.plugin_config_id().is_none() {
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
            let mut c = CompiledRoute::new(r.clone(), hosts.as_deref(), plugins, upstream, order);
            c.websocket |= service.as_ref().is_some_and(|s| s.enable_websocket);
            compiled.push(Arc::new(c));
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
