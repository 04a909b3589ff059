//! `POST /v1/explain`: what the data plane would do with a request (or a stream connection), and
//! why. Nothing here decides anything itself: the path goes through the data plane's own
//! normalization (`crate::normalize`), routes through the route table's own filters
//! (`RouteTable::explain` and `find`), the node through the balancer's own choice without moving
//! it (`CompiledUpstream::peek_node`), and the consumer through the auth plugins' own `rewrite`
//! on a copy of the request. So the explanation cannot disagree with what a request gets.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use weir_plugin::{Flow, RequestCtx};

use crate::config::{Config, EscapedSlashes, Listen};
use crate::normalize::{normalize, strip_port, PathRules};
use crate::openapi::explain::*;
use crate::tables::router::{Candidate, CompiledRoute, TableKind};
use crate::tables::snapshot::{merge_chains, BoundPlugin, PluginChain};
use crate::tables::upstream::{fnv1a, CompiledUpstream};
use crate::tables::Snapshot;

/// Explains `body` (the request's JSON); `Err` is a 400's message.
pub fn explain(body: &[u8], snap: &Snapshot, config: &Config) -> Result<Explanation, String> {
    let started = Instant::now();
    let req: ExplainRequest = serde_json::from_slice(body).map_err(|e| format!("invalid body: {e}"))?;
    let mut out = match req.stream {
        Some(ref s) => {
            if req.method.is_some() || req.uri.is_some() || req.host.is_some() || !req.headers.is_empty() {
                return Err("`stream` explains a stream connection: leave out method, uri, host and headers".into());
            }
            if req.client_ip.is_some() {
                return Err("with `stream`, give the client as `stream.client_ip`".into());
            }
            explain_stream(s, snap)?
        }
        None => explain_http(req, snap, config)?,
    };
    out.took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    Ok(out)
}

fn parse_ip(what: &str, v: Option<&str>) -> Result<IpAddr, String> {
    match v {
        None => Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        Some(s) => s.parse().map_err(|_| format!("{what}: `{s}` is not an IP address")),
    }
}

/// The data plane's path rules of `config` (`merge_slashes`, `escaped_slashes`).
fn path_rules(config: &Config) -> PathRules {
    PathRules {
        merge_slashes: config.gateway.merge_slashes,
        reject_escaped_slashes: config.gateway.escaped_slashes == EscapedSlashes::Reject,
    }
}

/// The address of the first data-plane listener (what `$server_port` would read).
fn local_addr(config: &Config) -> SocketAddr {
    match config.gateway.node_listen.first() {
        Some(Listen::Port(p)) => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), *p),
        Some(Listen::Addr(a)) => SocketAddr::new(a.ip, a.port),
        None => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9080),
    }
}

fn headers_of(req: &ExplainRequest) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, values) in &req.headers {
        let n =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("headers: `{name}` is not a header name"))?;
        let list: Vec<&String> = match values {
            HeaderValues::One(v) => vec![v],
            HeaderValues::Many(vs) => vs.iter().collect(),
        };
        for v in list {
            let value = HeaderValue::from_str(v).map_err(|_| format!("headers.{name}: not a valid header value"))?;
            map.append(n.clone(), value);
        }
    }
    Ok(map)
}

fn explain_http(req: ExplainRequest, snap: &Snapshot, config: &Config) -> Result<Explanation, String> {
    let method_text = req.method.clone().unwrap_or_else(|| "GET".into());
    let method =
        Method::from_bytes(method_text.as_bytes()).map_err(|_| format!("method: `{method_text}` is not a method"))?;
    let uri_text = req.uri.clone().ok_or("uri: required (a path such as /a/b?x=1), or give `stream`")?;
    let uri: http::Uri = uri_text.parse().map_err(|e| format!("uri: `{uri_text}`: {e}"))?;
    let ip = parse_ip("client_ip", req.client_ip.as_deref())?;
    let mut headers = headers_of(&req)?;
    let host_text = match (&req.host, headers.get(http::header::HOST).and_then(|v| v.to_str().ok())) {
        (Some(h), _) => h.clone(),
        (None, Some(h)) => h.to_owned(),
        (None, None) => uri.authority().map(|a| a.as_str().to_owned()).unwrap_or_default(),
    };
    if !host_text.is_empty() {
        let v = HeaderValue::from_str(&host_text).map_err(|_| format!("host: `{host_text}` is not a valid host"))?;
        headers.insert(http::header::HOST, v);
    }
    let host = strip_port(&host_text).to_owned();
    let raw_path = uri.path().to_owned();
    let query = uri.query().unwrap_or("").to_owned();
    let mut notes = Vec::new();
    let mut request = ExplainedRequest {
        method: method.as_str().to_owned(),
        raw_path: raw_path.clone(),
        path: None,
        path_error: None,
        query: query.clone(),
        host: host.clone(),
        client_ip: ip.to_string(),
        server: None,
        sni: None,
    };
    let empty = |verdict: Verdict, request: ExplainedRequest, notes: Vec<String>| Explanation {
        kind: "http",
        verdict,
        request,
        route: None,
        candidates: Vec::new(),
        routes_total: snap.table.len(),
        plugins: Vec::new(),
        consumer: ConsumerReport { status: "none", username: None, by: None, note: "no route ran".into() },
        upstream: None,
        timeouts: None,
        notes,
        took_us: 0,
    };
    let path = match normalize(&raw_path, path_rules(config)) {
        Ok(p) => p.into_owned(),
        Err(e) => {
            request.path_error = Some(e.to_string());
            let verdict = Verdict {
                status: Some(400),
                by: "gateway",
                summary: format!("the data plane refuses this path before routing: 400 invalid path: {e}"),
            };
            return Ok(empty(verdict, request, notes));
        }
    };
    if path != raw_path {
        notes.push(format!("the path is normalized from `{raw_path}` to `{path}` before routing and forwarding"));
    }
    request.path = Some(path.clone());
    let remote = SocketAddr::new(ip, 0);
    let mut ctx = RequestCtx::new(method, path, query, headers, remote, Arc::from(ip.to_string()), local_addr(config));
    let found = snap.table.find(&host, ip, &ctx);
    let listed = snap.table.explain(&host, ip, &ctx);
    let winner = found.as_ref().map(|m| m.route.clone());
    let mut candidates = Vec::with_capacity(listed.len());
    for c in &listed {
        candidates.push(candidate_report(c, winner.as_ref(), &host, ip, &ctx));
    }
    let Some(matched) = found else {
        let global = chain_steps(&snap.global_chain, snap, None, &ctx);
        let refused = candidates.len();
        let summary = if refused == 0 {
            format!("no route's URI matches `{}`: the gateway answers 404 Route Not Found", ctx.path)
        } else {
            format!("{refused} route(s) match the URI but their filters refuse the request: the gateway answers 404 Route Not Found")
        };
        if !global.is_empty() {
            notes.push("global rules run before the 404 (a plugin of theirs may answer first)".into());
        }
        let mut e = empty(Verdict { status: Some(404), by: "gateway", summary }, request, notes);
        e.candidates = candidates;
        e.plugins = global;
        return Ok(e);
    };
    let route = matched.route.clone();
    ctx.route_id = Some(route.id.clone());
    ctx.matched_uri = matched.uri.clone();
    ctx.service_id = route.service_id.clone();
    ctx.params = matched.params.clone();
    let table = listed
        .iter()
        .find(|c| Arc::ptr_eq(&c.route, &route) && c.uri == matched.uri && c.rejected.is_none())
        .map_or(TableKind::Exact, |c| c.table);
    let outranked = candidates.iter().filter(|c| c.result == "outranked").count();
    let why = format!(
        "its URI `{}` matches in the {} table and its filters accept the request{}",
        matched.uri.as_deref().unwrap_or(""),
        table.name(),
        if outranked > 0 {
            format!("; it outranks {outranked} other accepting route(s) (priority, then exact over parameter over prefix, then the longer prefix, then the route defined first)")
        } else {
            String::new()
        }
    );
    let route_report = MatchedRoute {
        id: route.id.to_string(),
        name: route.route.more.as_ref().and_then(|m| m.name.clone()),
        table: table.name(),
        uri: matched.uri.as_deref().map(str::to_owned),
        priority: route.route.priority,
        params: matched.params.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        service_id: route.service_id.as_deref().map(str::to_owned),
        why,
    };

    // The plugin chain: global rules, then the route's (service ⊕ plugin config ⊕ route), with
    // the consumer's merged in once an auth plugin identifies one.
    let (consumer, answer, consumer_chain) = consumer_of(&snap.global_chain, &route.plugins, &ctx);
    let route_chain = match &consumer_chain {
        Some((_, extra)) => merge_chains(&route.plugins, extra),
        None => route.plugins.clone(),
    };
    let mut plugins = chain_steps(&snap.global_chain, snap, None, &ctx);
    plugins.extend(chain_steps(&route_chain, snap, Some((&route, consumer_chain.as_ref())), &ctx));
    if let Some((name, status)) = &answer {
        if let Some(step) = plugins.iter_mut().find(|s| s.name == *name) {
            step.note = Some(format!("answers {status} for this request (its rewrite phase ran here on a copy)"));
        }
    }

    let upstream = route.upstream.clone();
    if route.plugins.iter().any(|p| p.entry.name == "traffic-split") {
        notes.push(
            "traffic-split is on this route: it may send the request to another upstream than the one below".into(),
        );
    }
    let (upstream_report, timeouts) = match &upstream {
        Some(u) => {
            if let Some((c, _)) = &consumer_chain {
                ctx.consumer = Some(c.clone());
            }
            let hash = u.request_hash(&ctx);
            let report = upstream_report(u, hash);
            let timeouts = match (route.timeouts, u.conf.timeout) {
                (Some(t), _) => timeouts_report(t, "route"),
                (None, Some(_)) => timeouts_report(u.timeouts, "upstream"),
                (None, None) => timeouts_report(u.timeouts, "default"),
            };
            (Some(report), Some(timeouts))
        }
        None => (None, None),
    };
    let verdict = match (&answer, &upstream_report) {
        (Some((name, status)), _) => Verdict {
            status: Some(*status),
            by: "plugin",
            summary: format!("route `{}` matches; plugin {name} answers {status} itself (not the upstream)", route.id),
        },
        (None, None) => Verdict {
            status: Some(503),
            by: "gateway",
            summary: format!(
                "route `{}` matches but has no upstream: the gateway answers 503 unless a plugin answers or chooses an upstream",
                route.id
            ),
        },
        (None, Some(u)) => Verdict {
            status: None,
            by: "upstream",
            summary: match &u.pick {
                Some(node) => format!("route `{}` matches; proxied to {node} ({})", route.id, u.owner),
                None => format!(
                    "route `{}` matches but no node of {} can be picked: the gateway answers 502",
                    route.id, u.owner
                ),
            },
        },
    };
    Ok(Explanation {
        kind: "http",
        verdict,
        request,
        route: Some(route_report),
        candidates,
        routes_total: snap.table.len(),
        plugins,
        consumer,
        upstream: upstream_report,
        timeouts,
        notes,
        took_us: 0,
    })
}

/// One candidate: matched, refused by a filter (which, and why), or outranked (by what).
fn candidate_report(
    c: &Candidate,
    winner: Option<&Arc<CompiledRoute>>,
    host: &str,
    ip: IpAddr,
    ctx: &RequestCtx,
) -> CandidateReport {
    let r = &c.route;
    let (result, field, reason) = match (c.rejected, winner) {
        (Some(why), _) => ("rejected", Some(why.field()), rejection(r, why, host, ip, ctx)),
        (None, Some(w)) if Arc::ptr_eq(w, r) => ("matched", None, "its filters accept the request".to_owned()),
        (None, Some(w)) => ("outranked", None, outranked_by(r, c, w)),
        (None, None) => ("rejected", None, "no route takes the request".to_owned()),
    };
    CandidateReport {
        id: r.id.to_string(),
        table: c.table.name(),
        uri: c.uri.as_deref().map(str::to_owned),
        priority: r.route.priority,
        result,
        field,
        reason,
    }
}

fn rejection(
    r: &CompiledRoute,
    why: crate::tables::router::Reject,
    host: &str,
    ip: IpAddr,
    ctx: &RequestCtx,
) -> String {
    use crate::tables::router::Reject;
    match why {
        Reject::Disabled => "the route is disabled (status 0)".into(),
        Reject::Method => {
            let allowed: Vec<String> = r.route.methods().unwrap_or(&[]).iter().map(|m| format!("{m:?}")).collect();
            format!("method {} is not among methods [{}]", ctx.method, allowed.join(", "))
        }
        Reject::Host => {
            let names: Vec<&str> = r.host_names.iter().map(|h| &**h).collect();
            let from =
                if r.route.hosts().is_none() && r.route.host().is_none() { " (the service's hosts)" } else { "" };
            format!("host `{host}` matches none of [{}]{from}", names.join(", "))
        }
        Reject::RemoteAddrs => {
            format!("client {ip} is in none of remote_addrs [{}]", r.route.remote_addrs().unwrap_or(&[]).join(", "))
        }
        Reject::Vars => {
            format!("vars {} does not hold for this request", r.route.vars().map(|v| v.to_string()).unwrap_or_default())
        }
    }
}

fn outranked_by(r: &CompiledRoute, c: &Candidate, w: &CompiledRoute) -> String {
    let rank = |t: TableKind| match t {
        TableKind::Exact => 3,
        TableKind::Parameter => 2,
        TableKind::Prefix => 1,
    };
    let because = if w.route.priority != r.route.priority {
        format!("a higher priority ({} > {})", w.route.priority, r.route.priority)
    } else if rank(c.table) < 3 {
        "the same priority, and a more specific or longer URI match, or an earlier definition".to_owned()
    } else {
        "the same priority and URI kind, and an earlier definition".to_owned()
    };
    format!("it accepts the request, but route `{}` wins: {because}", w.id)
}

/// The steps of `chain` in run order. `route` is the matched route (with the consumer's chain,
/// if one was identified) when `chain` is the route's, `None` for global rules.
fn chain_steps(
    chain: &PluginChain,
    snap: &Snapshot,
    route: Option<(&Arc<CompiledRoute>, Option<&ConsumerChain>)>,
    ctx: &RequestCtx,
) -> Vec<PluginStep> {
    chain
        .iter()
        .map(|p| {
            let (source, source_id) = match route {
                None => ("global_rule", global_rule_of(p, snap)),
                Some((r, consumer)) => source_of(p, r, consumer, snap),
            };
            let runs = p.runs_for(ctx);
            PluginStep {
                name: p.entry.name.to_owned(),
                priority: p.priority,
                source,
                source_id,
                runs,
                note: (!runs).then(|| "skipped: its _meta.filter does not hold for this request".to_owned()),
            }
        })
        .collect()
}

fn same(a: &BoundPlugin, b: &BoundPlugin) -> bool {
    Arc::ptr_eq(&a.instance, &b.instance)
}

fn global_rule_of(p: &BoundPlugin, snap: &Snapshot) -> String {
    snap.global_rules
        .iter()
        .find(|g| snap.chains.get(&("global_rules", g.id.0.clone())).is_some_and(|c| c.iter().any(|q| same(p, q))))
        .map(|g| g.id.0.clone())
        .unwrap_or_default()
}

fn source_of(
    p: &BoundPlugin,
    r: &CompiledRoute,
    consumer: Option<&ConsumerChain>,
    snap: &Snapshot,
) -> (&'static str, String) {
    if let Some((who, chain)) = consumer {
        if chain.iter().any(|q| same(p, q)) {
            return ("consumer", who.username.to_string());
        }
    }
    if let Some(sid) = &r.service_id {
        if snap.chains.get(&("services", sid.to_string())).is_some_and(|c| c.iter().any(|q| same(p, q))) {
            return ("service", sid.to_string());
        }
    }
    if r.route.plugins.contains_key(p.entry.name) {
        return ("route", r.id.to_string());
    }
    match r.route.plugin_config_id() {
        Some(id) => ("plugin_config", id.0.clone()),
        None => ("route", r.id.to_string()),
    }
}

/// An identified consumer and its own plugins.
type ConsumerChain = (Arc<weir_plugin::Consumer>, PluginChain);

type ConsumerFound = (ConsumerReport, Option<(String, u16)>, Option<ConsumerChain>);

/// Runs the `rewrite` phase of the auth plugins (those with a consumer schema) on a copy of the
/// request, as the data plane would, to see who the consumer is: `(report, the plugin that
/// answers itself and its status, the consumer and its plugins)`. A phase that waits (a remote
/// call) is not run: the consumer is then decided at run time.
fn consumer_of(global: &PluginChain, route: &PluginChain, ctx: &RequestCtx) -> ConsumerFound {
    let auth: Vec<&BoundPlugin> =
        global.iter().chain(route.iter()).filter(|p| p.entry.consumer_schema.is_some() && p.runs_for(ctx)).collect();
    if auth.is_empty() {
        let report = ConsumerReport {
            status: "none",
            username: None,
            by: None,
            note: "no auth plugin runs on this route: no consumer".into(),
        };
        return (report, None, None);
    }
    let mut copy = RequestCtx::new(
        ctx.method.clone(),
        ctx.path.clone(),
        ctx.query.clone(),
        ctx.headers.clone(),
        ctx.remote_addr,
        ctx.remote_ip.clone(),
        ctx.local_addr,
    );
    copy.route_id = ctx.route_id.clone();
    copy.service_id = ctx.service_id.clone();
    copy.matched_uri = ctx.matched_uri.clone();
    copy.params = ctx.params.clone();
    for p in auth {
        let name = p.entry.name.to_owned();
        match p.instance.rewrite(&mut copy) {
            Flow::Continue => {}
            Flow::Respond(r) => {
                let status = r.status.as_u16();
                let report = ConsumerReport {
                    status: "refused",
                    username: None,
                    by: Some(name.clone()),
                    note: format!("{name} answers {status} with these headers: no consumer"),
                };
                return (report, Some((name, status)), None);
            }
            Flow::Wait(_) => {
                let report = ConsumerReport {
                    status: "runtime",
                    username: None,
                    by: Some(name.clone()),
                    note: format!("{name} decides by a remote call: the consumer is determined at run time"),
                };
                return (report, None, None);
            }
        }
        if let Some(c) = copy.consumer.clone() {
            let chain = c.plugins.as_ref().and_then(|x| x.downcast_ref::<PluginChain>()).cloned();
            let report = ConsumerReport {
                status: "identified",
                username: Some(c.username.to_string()),
                by: Some(name.clone()),
                note: match &chain {
                    Some(_) => format!("identified by {name}; the consumer's plugins are merged into the chain"),
                    None => format!("identified by {name}"),
                },
            };
            let found = chain.map(|ch| (c.clone(), ch)).or_else(|| Some((c, PluginChain::default())));
            return (report, None, found);
        }
    }
    let report = ConsumerReport {
        status: "anonymous",
        username: None,
        by: None,
        note: "the auth plugins let the request through without identifying a consumer".into(),
    };
    (report, None, None)
}

fn upstream_report(u: &Arc<CompiledUpstream>, hash: Option<u32>) -> UpstreamReport {
    let checker = u.checker.get();
    let entry = checker.map(|c| c.entry());
    let health_of = |addr: SocketAddr| node_health(entry.as_ref(), addr);
    let nodes: Vec<NodeHealth> = u
        .nodes
        .iter()
        .map(|n| NodeHealth { address: n.addr.to_string(), weight: n.weight, health: health_of(n.addr) })
        .collect();
    let (pick, pick_note) = match u.peek_node(checker.map(|c| &**c), hash) {
        Some((i, fallback)) => {
            let node = u.nodes[i].addr;
            let note = if fallback {
                format!("no node is healthy: the balancer uses all nodes and picks {node}")
            } else {
                format!("{} picks {node} ({}) for the next request", u.balancer_name(), health_of(node))
            };
            (Some(node.to_string()), note)
        }
        None => (None, "no node with a weight above 0".to_owned()),
    };
    UpstreamReport {
        owner: format!("{}/{}", u.owner.0, u.owner.1),
        balancer: u.balancer_name(),
        scheme: serde_json::to_value(u.scheme).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
        retries: u.retries,
        retry_timeout: u.retry_timeout.map(|t| t.as_secs_f64()),
        checker: match (checker, &u.conf.checks) {
            (Some(_), _) => "running",
            (None, Some(_)) => "not started",
            (None, None) => "none",
        },
        nodes,
        pick,
        pick_note,
    }
}

/// A node's health by its upstream's checker entry: `unchecked` without a checker, and a node the
/// checker does not list yet is `healthy` (it takes traffic).
pub fn node_health(entry: Option<&crate::health::Entry>, addr: SocketAddr) -> &'static str {
    match entry {
        None => "unchecked",
        Some(e) => e
            .nodes
            .iter()
            .find(|n| n.port == addr.port() && n.ip == addr.ip().to_string())
            .map_or("healthy", |n| n.status),
    }
}

fn timeouts_report(t: crate::tables::upstream::Timeouts, from: &'static str) -> TimeoutsReport {
    TimeoutsReport { connect: t.connect.as_secs_f64(), send: t.send.as_secs_f64(), read: t.read.as_secs_f64(), from }
}

fn explain_stream(s: &StreamExplainRequest, snap: &Snapshot) -> Result<Explanation, String> {
    let server_ip = parse_ip("stream.server_addr", s.server_addr.as_deref())?;
    let client = parse_ip("stream.client_ip", s.client_ip.as_deref())?;
    if s.server_port == 0 {
        return Err("stream.server_port: must be 1-65535".into());
    }
    let local = SocketAddr::new(server_ip, s.server_port);
    // The stream proxy matches the SNI as it reads it from the ClientHello: lower-case.
    let sni = s.sni.as_deref().map(str::to_ascii_lowercase);
    let listed = snap.stream_table.explain(local, client, sni.as_deref());
    let chosen = snap.stream_table.find(local, client, sni.as_deref()).cloned();
    let mut candidates = Vec::with_capacity(listed.len());
    for (r, why) in &listed {
        let (result, reason) = match (why, &chosen) {
            (Some(w), _) => ("rejected", stream_rejection(r, *w, local, client, sni.as_deref())),
            (None, Some(c)) if Arc::ptr_eq(c, r) => ("matched", "its filters accept the connection".to_owned()),
            (None, Some(c)) => ("outranked", format!("it accepts the connection, but `{}` is more specific", c.id)),
            (None, None) => ("rejected", String::new()),
        };
        candidates.push(CandidateReport {
            id: r.id.to_string(),
            table: "stream",
            uri: None,
            priority: 0,
            result,
            field: why.map(|w| w.field()),
            reason,
        });
    }
    let request = ExplainedRequest {
        method: String::new(),
        raw_path: String::new(),
        path: None,
        path_error: None,
        query: String::new(),
        host: String::new(),
        client_ip: client.to_string(),
        server: Some(local.to_string()),
        sni: sni.clone(),
    };
    let consumer =
        ConsumerReport { status: "none", username: None, by: None, note: "stream routes have no consumers".into() };
    let Some(route) = chosen else {
        return Ok(Explanation {
            kind: "stream",
            verdict: Verdict {
                status: None,
                by: "closed",
                summary: format!("no stream route takes a connection to {local} from {client}: it is closed"),
            },
            request,
            route: None,
            candidates,
            routes_total: snap.stream_routes.len(),
            plugins: Vec::new(),
            consumer,
            upstream: None,
            timeouts: None,
            notes: vec!["stream routes are tried most specific first: exact SNI, longest wildcard SNI, longest client prefix, server_addr, server_port, then definition order".into()],
            took_us: 0,
        });
    };
    let plugins = route
        .plugins
        .iter()
        .map(|p| PluginStep {
            name: p.entry.name.to_owned(),
            priority: p.entry.priority,
            source: "stream_route",
            source_id: route.id.to_string(),
            runs: true,
            note: None,
        })
        .collect();
    let (upstream, timeouts, verdict) = match &route.upstream {
        Some(u) => {
            let hash = u.hash_key_source().map(|_| fnv1a(client.to_string().as_bytes()));
            let report = upstream_report(u, hash);
            let from = if u.conf.timeout.is_some() { "upstream" } else { "default" };
            let summary = match &report.pick {
                Some(node) => format!("stream route `{}` takes it; relayed to {node} ({})", route.id, report.owner),
                None => format!("stream route `{}` takes it, but no node can be picked: it is closed", route.id),
            };
            (Some(report), Some(timeouts_report(u.timeouts, from)), Verdict { status: None, by: "upstream", summary })
        }
        None => (
            None,
            None,
            Verdict {
                status: None,
                by: "closed",
                summary: format!("stream route `{}` takes it but has no upstream: it is closed", route.id),
            },
        ),
    };
    let route_report = MatchedRoute {
        id: route.id.to_string(),
        name: route.route.name.clone(),
        table: "stream",
        uri: None,
        priority: 0,
        params: BTreeMap::new(),
        service_id: route.route.service_id.as_ref().map(|s| s.0.clone()),
        why: "the most specific stream route whose server_addr, server_port, remote_addr and sni accept the connection"
            .into(),
    };
    Ok(Explanation {
        kind: "stream",
        verdict,
        request,
        route: Some(route_report),
        candidates,
        routes_total: snap.stream_routes.len(),
        plugins,
        consumer,
        upstream,
        timeouts,
        notes: vec!["for a stream connection, `timeouts.read` is how long the relay may idle".into()],
        took_us: 0,
    })
}

fn stream_rejection(
    r: &crate::tables::stream_router::CompiledStreamRoute,
    why: crate::tables::stream_router::StreamReject,
    local: SocketAddr,
    client: IpAddr,
    sni: Option<&str>,
) -> String {
    use crate::tables::stream_router::StreamReject;
    let route = &r.route;
    match why {
        StreamReject::ServerAddr => {
            format!("listener address {} is not server_addr {}", local.ip(), route.server_addr.as_deref().unwrap_or(""))
        }
        StreamReject::ServerPort => {
            format!("listener port {} is not server_port {}", local.port(), route.server_port.unwrap_or(0))
        }
        StreamReject::RemoteAddr => {
            format!("client {client} is not in remote_addr {}", route.remote_addr.as_deref().unwrap_or(""))
        }
        StreamReject::Sni => match sni {
            None => format!("the route wants SNI {} and the connection sends none", route.sni.as_deref().unwrap_or("")),
            Some(s) => format!("SNI `{s}` does not match {}", route.sni.as_deref().unwrap_or("")),
        },
    }
}
