//! A change to a few routes, applied to the snapshot serving without building the rest again.
//!
//! A route is a leaf: no other resource names it. So when an etcd change (or an Admin API write)
//! touches routes only, the next snapshot is the serving one with those routes taken out and
//! their new versions, checked and compiled the way a full build checks and compiles them, put
//! in; everything else is the serving snapshot's own (`Arc`s and cheap copies), and the routing
//! table is patched rather than built ([`RouteTable::patched`]). One change among 10,000 routes
//! then costs what its own route costs, plus copies of the snapshot's route lists.
//!
//! A patch is all or nothing and never reports: whenever it cannot tell the result is what a
//! full build of the same set would be (a changed route is invalid, names what does not exist,
//! or carries a plugin that checks its configuration together with other resources' as
//! limit-count does), it gives up and the caller builds the whole set, whose messages name the
//! entry and the reason. The snapshot patched must hold the provider's whole set (etcd, with
//! nothing skipped): the caller knows that, this module cannot; that its routes are in id order
//! with no id twice (the provider's key order) it checks (`Snapshot::routes_by_id`).

use std::collections::HashMap;

use super::*;

/// One route changed: its id, and its new value (with its id, as the provider's document has
/// it), or `None` when it was deleted.
pub struct RouteChange<'v> {
    /// The route's id.
    pub id: &'v str,
    /// Its new value, or `None`: deleted.
    pub value: Option<&'v Value>,
}

/// At most this many routes in one patch: a larger burst is built whole.
const MAX_CHANGES: usize = 64;

/// A changed route, checked and compiled.
struct NewRoute {
    route: Arc<Route>,
    compiled: Arc<CompiledRoute>,
}

impl Snapshot {
    /// This snapshot with `changes` applied to its routes, or `None` when the change must be
    /// built whole (see the module's doc). `validate`: an Admin API write's check, where plugins
    /// build instances that open nothing ([`Mode::Validate`]) and no cache is touched.
    pub fn patch_routes(
        &self,
        changes: &[RouteChange<'_>],
        enabled: &EnabledSet,
        base: &Path,
        validate: bool,
    ) -> Option<Snapshot> {
        if changes.is_empty() || changes.len() > MAX_CHANGES || enabled.check_only {
            return None;
        }
        let mut cache = ParseCache::default();
        let builder = Builder {
            enabled,
            base,
            issues: Vec::new(),
            snap: Snapshot {
                certs: self.certs.clone(),
                upstream_ids: self.upstream_ids,
                // The instances a patch keeps: all but the changed routes' (which it builds or
                // takes over again, as a build does).
                instances: {
                    let mut kept = self.instances.clone();
                    for change in changes {
                        kept.remove(&owner_key("routes", change.id));
                    }
                    kept
                },
                ..Snapshot::default()
            },
            cache: &mut cache,
            check_only: validate,
            previous: Some(self),
            prints: None,
            together: Default::default(),
            patching: true,
            route_chains: FastMap::default(),
        };
        let snapshot = builder.patch(changes)?;
        if !validate {
            let changed: Vec<&str> = changes.iter().map(|c| c.id).collect();
            cache.fold_patch(&changed);
        }
        Some(snapshot)
    }
}

impl Builder<'_> {
    /// The patched snapshot.
    fn patch(mut self, changes: &[RouteChange<'_>]) -> Option<Snapshot> {
        let prev = self.previous?;
        // Routes found by their ids: no index entry moves when one comes or goes.
        if !prev.routes_by_id {
            return None;
        }
        let consumers = prev.consumer_state.clone()?;
        let meta: HashMap<String, PluginMetadata> =
            prev.plugin_metadata.iter().map(|m| (m.id.clone(), m.clone())).collect();
        // The serving routes, in id order, and their compiled forms at the same places.
        let serving = prev.table.routes();
        if serving.len() != prev.routes.len() {
            return None;
        }
        self.prefetch(changes);
        let mut gone: Vec<Arc<CompiledRoute>> = Vec::new();
        let mut fresh: Vec<Option<NewRoute>> = Vec::with_capacity(changes.len());
        for (n, change) in changes.iter().enumerate() {
            if changes[..n].iter().any(|c| c.id == change.id) {
                return None;
            }
            let (before, at) = match by_id(&prev.routes, change.id) {
                Ok(at) => (Some(serving.get(at).filter(|c| &*c.id == change.id)?), at),
                Err(at) => (None, at),
            };
            // A configuration checked together with others' comes and goes with a full build.
            if before.is_some_and(|b| self.checked_together(&b.route)) {
                return None;
            }
            if let Some(b) = before {
                gone.push(b.clone());
            }
            fresh.push(match change.value {
                None => None,
                Some(item) => Some(self.route((at, item), change.id, before, &consumers, &meta)?),
            });
        }
        if !self.issues.is_empty() {
            return None;
        }

        // The lists, by place: a route replaced keeps its place, one added or removed moves the
        // places after it (routes are found by id, not by an index of places).
        let room = prev.routes.len() + changes.len();
        let mut routes = Vec::with_capacity(room);
        routes.extend(prev.routes.iter().cloned());
        let mut compiled: Vec<Arc<CompiledRoute>> = Vec::with_capacity(room);
        compiled.extend(serving.iter().cloned());
        let mut upstreams = Vec::with_capacity(prev.compiled_upstreams.len() + changes.len());
        upstreams.extend(prev.compiled_upstreams.iter().cloned());
        let mut added = Vec::new();
        for (change, new) in changes.iter().zip(fresh) {
            let before = match by_id(&routes, change.id) {
                Ok(at) => {
                    let old = compiled[at].clone();
                    match &new {
                        Some(n) => {
                            routes[at] = n.route.clone();
                            compiled[at] = n.compiled.clone();
                        }
                        None => {
                            routes.remove(at);
                            compiled.remove(at);
                        }
                    }
                    Some(old)
                }
                Err(at) => {
                    if let Some(n) = &new {
                        routes.insert(at, n.route.clone());
                        compiled.insert(at, n.compiled.clone());
                    }
                    None
                }
            };
            // The route's own upstream (not an upstream object's or its service's).
            let own = |c: &Arc<CompiledRoute>| c.upstream.clone().filter(|u| u.owner.0 == "routes");
            let old_own = before.as_ref().and_then(own);
            let new_own = new.as_ref().and_then(|n| own(&n.compiled));
            if !matches!((&old_own, &new_own), (Some(a), Some(b)) if Arc::ptr_eq(a, b)) {
                if let Some(old) = old_own {
                    upstreams.retain(|u| !Arc::ptr_eq(u, &old));
                }
                upstreams.extend(new_own);
            }
            if let Some(n) = new {
                added.push(n.compiled);
            }
        }
        let gone_refs: Vec<&Arc<CompiledRoute>> = gone.iter().collect();
        let table = prev.table.patched(&gone_refs, &added, compiled).ok()?;

        let snap = Snapshot {
            routes,
            services: prev.services.clone(),
            upstreams: prev.upstreams.clone(),
            consumers: prev.consumers.clone(),
            consumer_groups: prev.consumer_groups.clone(),
            global_rules: prev.global_rules.clone(),
            plugin_configs: prev.plugin_configs.clone(),
            plugin_metadata: prev.plugin_metadata.clone(),
            chains: prev.chains.clone(),
            table,
            global_chain: prev.global_chain.clone(),
            compiled_upstreams: upstreams,
            ssls: prev.ssls.clone(),
            certs: std::mem::take(&mut self.snap.certs),
            stream_routes: prev.stream_routes.clone(),
            stream_table: prev.stream_table.clone(),
            upstream_objects: prev.upstream_objects.clone(),
            index: prev.index.clone(),
            routes_by_id: true,
            compiled_by_owner: prev.compiled_by_owner.clone(),
            instances: std::mem::take(&mut self.snap.instances),
            upstream_ids: prev.upstream_ids,
            consumer_state: prev.consumer_state.clone(),
        };
        Some(snap)
    }

    /// Resolves the names the changed routes' own upstreams have, all at once (as a full
    /// build prefetches every name it meets) and before they are compiled.
    fn prefetch(&self, changes: &[RouteChange<'_>]) {
        let Some(dns) = crate::dns::service().filter(|_| !self.check_only) else { return };
        let mut queries = Vec::new();
        for item in changes.iter().filter_map(|c| c.value) {
            let Some(conf) = item.get("upstream") else { continue };
            // (A value that does not parse is refused when its route is checked.)
            if let Ok(u) = serde_json::from_value::<Upstream>(conf.clone()) {
                queries.extend(crate::tables::upstream::dns_queries(&u));
            }
        }
        if !queries.is_empty() {
            dns.prefetch(queries, crate::dns::FIRST_ANSWER_WAIT);
        }
    }

    /// One changed route, checked and compiled as a full build would (its upstream reused from
    /// `before`, its previous version, while the same).
    fn route(
        &mut self,
        (at, item): (usize, &Value),
        id: &str,
        before: Option<&Arc<CompiledRoute>>,
        consumers: &plugins::ConsumerState,
        meta: &HashMap<String, PluginMetadata>,
    ) -> Option<NewRoute> {
        let prev = self.previous?;
        let schema = KindSchemas::get().kind("route");
        let (o, r, (print, _)) = self.parse_entry::<Route>(schema, ("routes", at, item), None)?;
        if r.id.0 != id {
            return None;
        }
        self.check_route_itself(&o, &r);
        self.check_route_refs(&o, &r);
        if !self.issues.is_empty() || self.checked_together(&r) {
            return None;
        }
        self.cache.passed(&print);
        let service = match &r.service_id {
            Some(sid) => Some(prev.service(&sid.0)?.clone()),
            None => None,
        };
        // The route's plugins (under its plugin config's), as a full build chains them.
        let merged;
        let confs = match r.plugin_config_id() {
            None => &r.plugins,
            Some(pid) => {
                let shared = prev.plugin_configs.iter().find(|p| p.id.0 == pid.0)?;
                let mut all = PluginConfs::clone(&shared.plugins);
                all.extend(r.plugins.iter().map(|(k, v)| (k.clone(), v.clone())));
                merged = all;
                &merged
            }
        };
        let route_chain = match r.plugins.is_empty() && r.plugin_config_id().is_none() {
            true => PluginChain::default(),
            false => self.chain(("routes", &r.id.0, &o), confs, consumers, meta),
        };
        if !self.issues.is_empty() {
            return None;
        }
        let plugins = match &service {
            None => route_chain,
            Some(s) => {
                let service_chain = prev.chains.get(&("services", s.id.0.clone())).cloned().unwrap_or_default();
                merge_chains(&service_chain, &route_chain)
            }
        };
        // A shared upstream whose DNS answers changed since it was compiled would be compiled
        // again by a full build: that is one to leave to it.
        let shared = |c: Option<&Arc<CompiledUpstream>>| c.filter(|c| c.dns_current()).cloned();
        let upstream = match (&r.upstream, &r.upstream_id) {
            (Some(u), _) => Some(self.own_upstream(&r, u, before)),
            (None, Some(uid)) => Some(shared(prev.upstream_objects.get(&uid.0))?),
            (None, None) => match &service {
                None => None,
                Some(s) => match (&s.upstream, &s.upstream_id) {
                    (Some(_), _) => Some(shared(prev.compiled_by_owner.get(&("services", s.id.0.clone())))?),
                    (None, Some(uid)) => Some(shared(prev.upstream_objects.get(&uid.0))?),
                    (None, None) => None,
                },
            },
        };
        let hosts = service.as_ref().and_then(|s| s.hosts.clone());
        let mut c = CompiledRoute::new(r.clone(), hosts.as_deref(), plugins, upstream);
        c.websocket |= service.as_ref().is_some_and(|s| s.enable_websocket);
        Some(NewRoute { route: r, compiled: Arc::new(c) })
    }

    /// Whether a configuration of `r`'s plugins (its plugin config's included) takes part in a
    /// plugin's check of every configuration together (`Plugin::checks_together_with`).
    fn checked_together(&self, r: &Route) -> bool {
        let Some(prev) = self.previous else { return true };
        let pid = r.plugin_config_id();
        let shared = pid.and_then(|pid| prev.plugin_configs.iter().find(|p| p.id.0 == pid.0));
        let confs = r.plugins.iter().chain(shared.into_iter().flat_map(|p| p.plugins.iter()));
        confs
            .into_iter()
            .any(|(name, conf)| self.enabled.get(name).is_some_and(|e| e.plugin.checks_together_with(conf)))
    }

    /// A route's own upstream: its previous version's while the configuration and the DNS
    /// answers it was built from are the same, else compiled (its names resolved beforehand,
    /// [`Builder::prefetch`]).
    fn own_upstream(&self, r: &Route, u: &Upstream, before: Option<&Arc<CompiledRoute>>) -> Arc<CompiledUpstream> {
        let identities = &self.snap.certs.identities;
        let old = before.and_then(|p| p.upstream.as_ref()).filter(|c| c.owner.0 == "routes");
        match old.filter(|c| compile::still_current(c, u, false, identities)) {
            Some(c) => c.clone(),
            None => compile::compile_upstream(("routes", &r.id.0), u, identities),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    use serde_json::json;

    use super::*;

    fn enabled() -> EnabledSet {
        let catalog = crate::plugins_catalog();
        catalog.enable(&catalog.names())
    }

    /// A set as etcd gives it: routes in id order, every other kind one of each.
    fn set(routes: &[Value]) -> Value {
        let mut routes = routes.to_vec();
        routes.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
        json!({
            "upstreams": [{"id": "u1", "nodes": {"127.0.0.1:1981": 1}}],
            "services": [{
                "id": "s1", "upstream_id": "u1", "hosts": ["s.example"], "enable_websocket": true,
                "plugins": {"proxy-rewrite": {"headers": {"set": {"x-s": "1"}}}},
            }],
            "plugin_configs": [{"id": "pc", "plugins": {"response-rewrite": {"headers": {"set": {"x-p": "1"}}}}}],
            "routes": routes,
        })
    }

    fn route(id: &str, uri: &str, extra: Value) -> Value {
        let mut r = json!({"id": id, "uri": uri, "upstream": {"nodes": {"127.0.0.1:1980": 1}}});
        if let (Some(o), Some(e)) = (r.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
            // (`null` in `extra`: the key is left out.)
            o.retain(|_, v| !v.is_null());
        }
        r
    }

    fn base_routes() -> Vec<Value> {
        vec![
            route("a", "/a", json!({})),
            route("b", "/same", json!({"plugins": {"proxy-rewrite": {"uri": "/x"}}})),
            route("d", "/svc", json!({"upstream": null, "service_id": "s1"})),
            route("f", "/pc", json!({"plugin_config_id": "pc"})),
            route("h", "/p/:x", json!({})),
            route("j", "/pre/*", json!({})),
            route("l", "/up", json!({"upstream": null, "upstream_id": "u1"})),
        ]
    }

    /// Which route each request lands on, and what it carries.
    fn served(s: &Snapshot) -> Vec<String> {
        let mut requests: Vec<(&str, &str, &str)> = [
            ("s.example", "/x"),
            ("h", "/x"),
            ("h", "/y"),
            ("h", "/x/y"),
            ("h", "/p/1/c"),
            ("s.example", "/pre/x/q"),
            ("h", "/q/z"),
            ("h", "/x/q"),
        ]
        .iter()
        .flat_map(|(h, p)| [("GET", *h, *p), ("POST", *h, *p)])
        .collect();
        let fixed = [
            ("s.example", "/a"),
            ("h", "/same"),
            ("s.example", "/svc"),
            ("h", "/svc"),
            ("h", "/pc"),
            ("h", "/p/7"),
            ("h", "/p/7/8"),
            ("h", "/pre/x/y"),
            ("h", "/pre2/x"),
            ("h", "/q/1"),
            ("h", "/up"),
            ("h", "/new"),
        ];
        requests.extend(fixed.iter().map(|(h, p)| ("GET", *h, *p)));
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let addr = SocketAddr::new(ip, 40000);
        requests
            .iter()
            .map(|(method, host, path)| {
                let mut headers = http::HeaderMap::new();
                headers.insert(http::header::HOST, http::HeaderValue::from_static("h"));
                let method = if *method == "POST" { http::Method::POST } else { http::Method::GET };
                let ctx = weir_plugin::RequestCtx::new(
                    method,
                    (*path).into(),
                    "".into(),
                    headers,
                    addr,
                    Arc::from("127.0.0.1"),
                    addr,
                );
                match s.table.find(host, ip, &ctx) {
                    None => format!("{host}{path}: none"),
                    Some(m) => {
                        let plugins: Vec<&str> = m.route.plugins.iter().map(|p| p.entry.name).collect();
                        let up = m.route.upstream.as_ref().map(|u| format!("{}/{}", u.owner.0, u.owner.1));
                        let (id, ws) = (&m.route.id, m.route.websocket);
                        format!("{host}{path}: {id} {plugins:?} {up:?} ws={ws} {:?} {:?}", m.params, m.uri)
                    }
                }
            })
            .collect()
    }

    /// What two snapshots must share for one to stand for the other.
    fn same(patched: &Snapshot, built: &Snapshot) {
        let ids = |s: &Snapshot| s.routes.iter().map(|r| r.id.0.clone()).collect::<Vec<_>>();
        assert_eq!(ids(patched), ids(built));
        let table_ids = |s: &Snapshot| s.table.routes().iter().map(|r| r.id.to_string()).collect::<Vec<_>>();
        assert_eq!(table_ids(patched), ids(built));
        for r in &built.routes {
            assert_eq!(patched.route(&r.id.0).map(|p| &p.id), Some(&r.id), "index of {}", r.id);
        }
        assert_eq!(patched.table.len(), built.table.len());
        assert_eq!(served(patched), served(built));
        let keys = |s: &Snapshot| s.chains.keys().cloned().collect::<BTreeSet<_>>();
        assert_eq!(keys(patched), keys(built));
        let owners = |s: &Snapshot| {
            let mut o: Vec<String> =
                s.compiled_upstreams.iter().map(|u| format!("{}/{}", u.owner.0, u.owner.1)).collect();
            o.sort();
            o
        };
        assert_eq!(owners(patched), owners(built));
        let instances = |s: &Snapshot| {
            let mut all = BTreeSet::new();
            for owner in s.instances.keys() {
                for r in s.instances.get(owner).into_iter().flatten() {
                    all.insert((owner.clone(), r.plugin, r.conf));
                }
            }
            all
        };
        assert_eq!(instances(patched), instances(built));
        assert_eq!(patched.table.reads_form(), built.table.reads_form());
    }

    /// Applies `changes` as a patch of the build of `before` and checks it against a build of
    /// the set after them.
    fn check(before: &[Value], changes: &[(&str, Option<Value>)]) -> Snapshot {
        let enabled = enabled();
        let serving = Snapshot::build(&set(before), &enabled).unwrap_or_else(|e| panic!("{e:?}"));
        let list: Vec<RouteChange<'_>> = changes.iter().map(|(id, v)| RouteChange { id, value: v.as_ref() }).collect();
        let patched = serving.patch_routes(&list, &enabled, Path::new("."), false).expect("a patch");
        assert!(serving.patch_routes(&list, &enabled, Path::new("."), true).is_some(), "the validation patch");
        let mut after: Vec<Value> =
            before.iter().filter(|r| !changes.iter().any(|(id, _)| r["id"] == *id)).cloned().collect();
        after.extend(changes.iter().filter_map(|(_, v)| v.clone()));
        let built = Snapshot::build(&set(&after), &enabled).unwrap_or_else(|e| panic!("{e:?}"));
        same(&patched, &built);
        patched
    }

    #[test]
    fn a_patch_serves_what_a_full_build_of_the_same_set_serves() {
        let base = base_routes();
        // Replaced in place: a new URI, plugins, a service, a plugin config.
        check(&base, &[("a", Some(route("a", "/a2", json!({}))))]);
        check(&base, &[("b", Some(route("b", "/same", json!({"plugins": {"proxy-rewrite": {"uri": "/y"}}}))))]);
        check(&base, &[("a", Some(route("a", "/a", json!({"upstream": null, "service_id": "s1"}))))]);
        check(&base, &[("d", Some(route("d", "/svc", json!({"plugin_config_id": "pc"}))))]);
        // Added before, between and after the others; added with a URI another route has (the
        // route defined first, the lower id, wins the tie either way).
        check(&base, &[("0", Some(route("0", "/same", json!({}))))]);
        check(&base, &[("c", Some(route("c", "/same", json!({}))))]);
        check(&base, &[("z", Some(route("z", "/new", json!({}))))]);
        // Parameter and prefix routes come and go.
        check(&base, &[("i", Some(route("i", "/q/:y", json!({}))))]);
        check(&base, &[("h", None)]);
        check(&base, &[("j", None), ("k", Some(route("k", "/pre2/*", json!({}))))]);
        check(&base, &[("h", Some(route("h", "/p/:x/:y", json!({}))))]);
        // Removed, and several at once.
        check(&base, &[("a", None)]);
        check(&base, &[("b", None), ("0", Some(route("0", "/same", json!({})))), ("l", None)]);
        // A form-reading route comes and goes.
        let form = route("m", "/form", json!({"vars": [["post_arg_name", "==", "x"]]}));
        let with_form = check(&base, &[("m", Some(form.clone()))]);
        assert!(with_form.table.reads_form());
        let mut more = base.clone();
        more.push(form);
        check(&more, &[("m", None)]);
    }

    /// A small deterministic generator (xorshift): the same scenarios on every run.
    struct Dice(u64);

    impl Dice {
        fn roll(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[self.roll(from.len())]
        }
    }

    /// A random route from a small pool of URIs and options, so that routes often share a URI,
    /// a prefix or a parameter pattern.
    fn random_route(dice: &mut Dice, id: &str) -> Value {
        let uri = dice.pick(&["/x", "/y", "/x/y", "/p/:a/c", "/p/{b}/c", "/pre/*", "/pre/x/*", "/:q/z", "/x/*"]);
        let mut r = route(id, uri, json!({}));
        if dice.roll(3) == 0 {
            r["priority"] = json!(dice.roll(3));
        }
        if dice.roll(4) == 0 {
            r["methods"] = json!(["POST"]);
        }
        if dice.roll(5) == 0 {
            r["hosts"] = json!(["s.example"]);
        }
        if dice.roll(6) == 0 {
            // Several URIs: entries in several lists.
            let second = dice.pick(&["/y", "/pre/*", "/p/:z/c", "/x"]);
            r.as_object_mut().map(|o| o.remove("uri"));
            r["uris"] = json!([uri, second]);
        }
        match dice.roll(8) {
            0 => {
                r.as_object_mut().map(|o| o.remove("upstream"));
                r["service_id"] = json!("s1");
            }
            1 => {
                r.as_object_mut().map(|o| o.remove("upstream"));
                r["upstream_id"] = json!("u1");
            }
            2 => r["plugin_config_id"] = json!("pc"),
            3 => r["plugins"] = json!({"proxy-rewrite": {"headers": {"set": {"x-r": id}}}}),
            4 => r["vars"] = json!([["post_arg_a", "==", "1"]]),
            // What a full build refuses: the patch must give up on it.
            5 => r["upstream_id"] = json!("missing"),
            _ => {}
        }
        r
    }

    #[test]
    fn random_patches_serve_what_full_builds_serve() {
        let enabled = enabled();
        let ids = ["a", "b", "c", "d", "e", "f", "g", "10", "9", "a1"];
        let mut dice = Dice(0x9e37_79b9_7f4a_7c15);
        let (mut patched, mut gave_up) = (0, 0);
        for _ in 0..800 {
            let mut before = Vec::new();
            for id in ids {
                if dice.roll(3) != 0 {
                    before.push(random_route(&mut dice, id));
                }
            }
            let Ok(serving) = Snapshot::build(&set(&before), &enabled) else { continue };
            let changes: Vec<(&str, Option<Value>)> = {
                let mut picked: Vec<&str> = Vec::new();
                for _ in 0..1 + dice.roll(3) {
                    let id = dice.pick(&ids);
                    if !picked.contains(&id) {
                        picked.push(id);
                    }
                }
                picked.into_iter().map(|id| (id, (dice.roll(4) != 0).then(|| random_route(&mut dice, id)))).collect()
            };
            let list: Vec<RouteChange<'_>> =
                changes.iter().map(|(id, v)| RouteChange { id, value: v.as_ref() }).collect();
            let mut after: Vec<Value> =
                before.iter().filter(|r| !changes.iter().any(|(id, _)| r["id"] == *id)).cloned().collect();
            after.extend(changes.iter().filter_map(|(_, v)| v.clone()));
            let built = Snapshot::build(&set(&after), &enabled);
            let patch = serving.patch_routes(&list, &enabled, Path::new("."), false);
            let check = serving.patch_routes(&list, &enabled, Path::new("."), true);
            assert_eq!(patch.is_some(), check.is_some(), "{changes:?}");
            match (built, patch) {
                (Ok(built), Some(p)) => {
                    same(&p, &built);
                    patched += 1;
                }
                (Ok(_), None) => gave_up += 1,
                (Err(issues), Some(_)) => panic!("patched a set that does not build: {issues:?} {changes:?}"),
                (Err(_), None) => {}
            }
        }
        // (Giving up is always safe; a test that patched nothing would prove nothing.)
        assert!(patched > 200, "{patched} patched, {gave_up} gave up");
    }

    #[test]
    fn an_unchanged_plugin_configuration_keeps_its_instance_and_upstream() {
        let enabled = enabled();
        let serving = Snapshot::build(&set(&base_routes()), &enabled).unwrap_or_else(|e| panic!("{e:?}"));
        let moved = route("b", "/moved", json!({"plugins": {"proxy-rewrite": {"uri": "/x"}}}));
        let change = [RouteChange { id: "b", value: Some(&moved) }];
        let patched = serving.patch_routes(&change, &enabled, Path::new("."), false).expect("a patch");
        let instance =
            |s: &Snapshot| s.table.routes().iter().find(|r| &*r.id == "b").map(|r| r.plugins[0].instance.clone());
        let instance = |s: &Snapshot| instance(s).expect("route b and its plugin");
        assert!(Arc::ptr_eq(&instance(&serving), &instance(&patched)), "the instance was built again");
        let upstream = |s: &Snapshot| s.route("b").and(s.table.routes().iter().find(|r| &*r.id == "b")).cloned();
        let (before, after) = (upstream(&serving), upstream(&patched));
        let same_upstream = match (before.and_then(|r| r.upstream.clone()), after.and_then(|r| r.upstream.clone())) {
            (Some(a), Some(b)) => Arc::ptr_eq(&a, &b),
            _ => false,
        };
        assert!(same_upstream, "the upstream was compiled again (its balancer state lost)");
    }

    #[test]
    fn a_patch_gives_up_where_a_full_build_must_judge() {
        let enabled = enabled();
        let mut base = base_routes();
        base.push(route("g", "/g", json!({"plugins": {"limit-count": {"count": 1, "time_window": 60, "group": "g"}}})));
        let serving = Snapshot::build(&set(&base), &enabled).unwrap_or_else(|e| panic!("{e:?}"));
        let patch = |id: &str, v: Option<Value>| {
            let change = [RouteChange { id, value: v.as_ref() }];
            serving.patch_routes(&change, &enabled, Path::new("."), false).is_some()
        };
        assert!(patch("n", Some(route("n", "/n", json!({})))), "a plain route is patched");
        let grouped = json!({"plugins": {"limit-count": {"count": 2, "time_window": 60, "group": "g"}}});
        assert!(!patch("n", Some(route("n", "/n", grouped))), "a group checked together with another route's");
        assert!(!patch("g", None), "the route holding a group");
        let ungrouped = json!({"plugins": {"limit-count": {"count": 2, "time_window": 60}}});
        assert!(patch("n", Some(route("n", "/n", ungrouped))), "limit-count without a group is patched");
        assert!(!patch("n", Some(route("n", "no-slash", json!({})))), "an invalid URI");
        assert!(!patch("n", Some(route("n", "/n", json!({"upstream": null, "upstream_id": "nope"})))));
        assert!(!patch("n", Some(route("n", "/n", json!({"upstream": null, "service_id": "nope"})))));
        assert!(!patch("n", Some(route("n", "/n", json!({"plugin_config_id": "nope"})))));
        assert!(!patch("n", Some(route("n", "/n", json!({"plugins": {"no-such-plugin": {}}})))));
        assert!(!patch("n", Some(route("n", "/n", json!({"plugins": {"proxy-rewrite": {"uri": 7}}})))));
        assert!(!patch("n", Some(route("other-id", "/n", json!({})))), "an id its key does not name");
    }
}
