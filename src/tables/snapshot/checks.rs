//! The checks of resources that depend on more than their schema: references between
//! resources, upstream nodes and keys, stream routes and their plugins.

use super::*;

impl Builder<'_> {
    /// Credentials: a top-level one names an existing consumer, a nested one names no other,
    /// and a consumer's credential ids are unique.
    pub(super) fn check_credentials(
        &mut self,
        consumers: &[(EntryName<'_>, Arc<Consumer>)],
        credentials: &[(EntryName<'_>, Arc<Credential>)],
    ) {
        let mut seen: std::collections::HashSet<(&str, &str)> = std::collections::HashSet::new();
        let known: std::collections::HashSet<&str> = consumers.iter().map(|(_, c)| c.username.as_str()).collect();
        for (o, c) in consumers {
            for (j, cred) in c.credentials.iter().enumerate() {
                if cred.consumer.as_ref().is_some_and(|n| *n != c.username) {
                    self.issue(o, &format!("credentials[{j}].consumer"), "a nested credential belongs to its consumer");
                }
                if !seen.insert((&c.username, &cred.id.0)) {
                    self.issue(o, &format!("credentials[{j}].id"), &format!("credential `{}` appears twice", cred.id));
                }
            }
        }
        for (o, cred) in credentials {
            let Some(name) = cred.consumer.as_deref() else {
                self.issue(o, "consumer", "required key is missing (the consumer the credential belongs to)");
                continue;
            };
            if !known.contains(name) {
                self.issue(o, "consumer", &format!("consumer `{name}` does not exist"));
            } else if !seen.insert((name, &cred.id.0)) {
                self.issue(o, "id", &format!("consumer `{name}` has credential `{}` twice", cred.id));
            }
        }
    }

    /// The checks of a route that depend on nothing but the route.
    pub(super) fn check_route_itself(&mut self, o: &EntryName<'_>, r: &Route) {
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
        if r.filter_func().is_some() {
            self.issue(
                o,
                "filter_func",
                "Lua filter functions cannot run in Weir; express the condition with `vars` (APISIX expressions)",
            );
        }
        if let Some(vars) = r.vars() {
            if let Err(e) = weir_plugin::expr::Expr::compile(vars) {
                self.issue(o, "vars", e.trim_start_matches(": "));
            }
        }
    }

    /// Addresses, SNI and references of a stream route.
    pub(super) fn check_stream_route(&mut self, o: &EntryName<'_>, r: &StreamRoute) {
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
    pub(super) fn stream_chain(&mut self, o: &EntryName<'_>, confs: &PluginConfs) -> StreamChain {
        let mut chain: Vec<BoundStreamPlugin> = Vec::with_capacity(confs.len());
        for (name, conf) in confs {
            let path = format!("plugins.{name}");
            let Some(entry) = self.enabled.stream_get(name).cloned() else {
                let catalog = crate::plugins_catalog();
                // A name may be both kinds (ip-restriction, limit-conn): the stream one is meant here.
                let reason = if catalog.stream_get(name).is_some() {
                    format!("stream plugin `{name}` is compiled in but not enabled (add it to `stream_plugins:` in config.yaml)")
                } else if catalog.get(name).is_some() {
                    format!("`{name}` is an HTTP plugin; stream routes take stream plugins")
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

    pub(super) fn issue(&mut self, owner: &str, path: &str, reason: &str) {
        self.issues.push(Issue::new(path, reason).in_resource(owner));
    }

    pub(super) fn check_upstream_ref(&mut self, o: &EntryName<'_>, inline: Option<&Upstream>, id: Option<&Id>) {
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

    /// A route's references: its upstream, service and plugin config exist.
    pub(super) fn check_route_refs(&mut self, o: &EntryName<'_>, r: &Route) {
        if r.upstream.is_some() && r.upstream_id.is_some() {
            self.issue(o, "upstream_id", "`upstream` and `upstream_id` are mutually exclusive");
        }
        if let Some(id) = &r.upstream_id {
            self.check_upstream_id(o, id);
        }
        if let Some(sid) = &r.service_id {
            if !self.known().contains_key(&("services", sid.0.clone())) {
                self.issue(o, "service_id", &format!("service `{sid}` does not exist"));
            }
        }
        if let Some(pid) = r.plugin_config_id() {
            if !self.known().contains_key(&("plugin_configs", pid.0.clone())) {
                self.issue(o, "plugin_config_id", &format!("plugin config `{pid}` does not exist"));
            }
        }
    }

    /// The resources that exist, by `(kind, id)`: this build's, or the patched snapshot's.
    pub(super) fn known(&self) -> &FastMap<(&'static str, String), usize> {
        match (self.patching, self.previous) {
            (true, Some(p)) => &p.index,
            _ => &self.snap.index,
        }
    }

    pub(super) fn check_upstream_id(&mut self, o: &EntryName<'_>, id: &Id) {
        if !self.known().contains_key(&("upstreams", id.0.clone())) {
            self.issue(o, "upstream_id", &format!("upstream `{id}` does not exist"));
        }
    }

    pub(super) fn check_upstream(&mut self, o: &EntryName<'_>, at: &str, u: &Upstream) {
        let field = |f: &str| if at.is_empty() { f.to_owned() } else { format!("{at}.{f}") };
        match &u.nodes {
            Nodes::Map(map) => {
                for key in map.keys() {
                    if let Err(e) = parse_node_key(key) {
                        self.issue(o, &field(&format!("nodes.{key}")), &e);
                    }
                }
            }
            Nodes::List(list) => {
                for (i, node) in list.iter().enumerate() {
                    if !valid_host(&node.host) {
                        let why = format!("`{}` is not a host name or IP address", node.host);
                        self.issue(o, &field(&format!("nodes[{i}].host")), &why);
                    }
                }
            }
        }
        match (&u.discovery_type, &u.service_name) {
            (Some(_), None) => self.issue(o, &field("service_name"), "required with `discovery_type`"),
            (None, Some(_)) => self.issue(o, &field("discovery_type"), "required with `service_name`"),
            (Some(_), Some(name)) => {
                if let Err(e) = parse_node_key(name) {
                    self.issue(o, &field("service_name"), &e);
                }
            }
            (None, None) => {}
        }
        if let Some(tls) = &u.tls {
            match (&tls.client_cert, &tls.client_key, &tls.client_cert_id) {
                (Some(cert), Some(key), None) => {
                    if let Err(e) = crate::mtls::ClientIdentity::from_pem(cert, key) {
                        self.issue(o, &field("tls.client_cert"), &e);
                    }
                }
                (None, None, Some(id)) => {
                    if !self.snap.certs.identities.contains_key(&id.0) {
                        let why = format!("ssl `{id}` does not exist, or is not a valid `type: client` entry");
                        self.issue(o, &field("tls.client_cert_id"), &why);
                    }
                }
                (None, None, None) => {}
                (Some(_), None, _) => self.issue(o, &field("tls.client_key"), "required with `client_cert`"),
                (None, Some(_), _) => self.issue(o, &field("tls.client_cert"), "required with `client_key`"),
                (Some(_), Some(_), Some(_)) => {
                    self.issue(o, &field("tls.client_cert_id"), "`client_cert_id` or `client_cert`, not both")
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
}
