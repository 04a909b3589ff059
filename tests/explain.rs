//! `POST /v1/explain` against the real binary: the route it names is the one the data plane
//! picks (checked with the debug header on real requests), every other candidate's reason, the
//! plugin chain and where each plugin comes from, the consumer, the node the balancer would pick
//! with its health, the timeouts, path normalization, stream routes and bad input. Also the
//! response headers that show who answered: `X-Weir-Debug` and `X-Weir-Upstream-Status`.

mod common;

use std::time::Duration;

use common::upstream::Upstream;
use common::*;
use serde_json::{json, Value};

fn explain(p: &Prefix, body: &Value) -> Response {
    request(p.control(), "POST", "/v1/explain", &[("Content-Type", "application/json")], body.to_string().as_bytes())
}

fn explained(p: &Prefix, body: Value) -> Value {
    let r = explain(p, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn candidate<'a>(e: &'a Value, id: &str) -> &'a Value {
    e["candidates"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["id"] == id))
        .unwrap_or_else(|| panic!("no candidate {id}: {e:#}"))
}

/// The route the data plane took, from `X-Weir-Debug`.
fn served_by(r: &Response) -> String {
    let h = r.header("x-weir-debug").unwrap_or_else(|| panic!("no X-Weir-Debug: {r:?}"));
    h.split("; ").find_map(|kv| kv.strip_prefix("route=")).unwrap_or("").to_owned()
}

#[test]
fn explain_names_the_route_the_data_plane_picks_and_why_the_others_lose() {
    let up = Upstream::start("u");
    let u = format!("{{nodes: {{\"{}\": 1}}}}", up.node());
    let (p, _w) = {
        let p = Prefix::new(
            "  debug_header: true\n",
            "",
            &format!(
                "routes:\n\
                 \x20 - {{id: post-only, uri: /a/b, methods: [POST], upstream: {u}}}\n\
                 \x20 - {{id: off, uri: /a/b, status: 0, upstream: {u}}}\n\
                 \x20 - {{id: api-host, uri: /a/:x, hosts: [api.example.com], upstream: {u}}}\n\
                 \x20 - {{id: canary, uri: /a/*, priority: 5, vars: [[http_x_env, ==, canary]], upstream: {u}}}\n\
                 \x20 - {{id: office, uri: /a/*, priority: 3, remote_addrs: [10.0.0.0/8], upstream: {u}}}\n\
                 \x20 - {{id: any, uri: /a/*, upstream: {u}}}\n\
                 \x20 - {{id: second-any, uri: /a/*, upstream: {u}}}\n"
            ),
        );
        let w = Weir::start(&p);
        w.wait_ready(p.node());
        (p, w)
    };
    let e = explained(&p, json!({"method": "GET", "uri": "/a/b?q=1", "host": "h.example.com:9080"}));
    assert_eq!(e["route"]["id"], "any", "{e:#}");
    assert_eq!(e["route"]["table"], "prefix");
    assert_eq!(e["route"]["uri"], "/a/*");
    assert_eq!(e["request"]["host"], "h.example.com", "the port is not part of the host routes see");
    assert_eq!(e["request"]["query"], "q=1");
    assert_eq!(e["verdict"]["by"], "upstream");
    assert_eq!(candidate(&e, "post-only")["field"], "methods");
    assert!(candidate(&e, "post-only")["reason"].as_str().unwrap_or("").contains("GET"), "{e:#}");
    assert_eq!(candidate(&e, "off")["field"], "status");
    assert_eq!(candidate(&e, "api-host")["field"], "hosts");
    assert_eq!(candidate(&e, "api-host")["table"], "parameter");
    assert_eq!(candidate(&e, "canary")["field"], "vars");
    assert_eq!(candidate(&e, "office")["field"], "remote_addrs");
    assert_eq!(candidate(&e, "second-any")["result"], "outranked");
    assert_eq!(e["routes_total"], 7);
    // The data plane agrees, request by request.
    let asked = [
        (json!({"uri": "/a/b"}), vec![]),
        (json!({"method": "POST", "uri": "/a/b"}), vec![]),
        (json!({"uri": "/a/z", "host": "api.example.com"}), vec![("Host", "api.example.com")]),
        (json!({"uri": "/a/b", "headers": {"x-env": "canary"}}), vec![("X-Env", "canary")]),
    ];
    for (body, headers) in asked {
        let e = explained(&p, body.clone());
        let method = body["method"].as_str().unwrap_or("GET");
        let path = body["uri"].as_str().unwrap_or("/");
        let r = request(p.node(), method, path, &headers, b"");
        assert_eq!(r.status, 200, "{body}: {r:?}");
        assert_eq!(
            Value::from(served_by(&r)),
            e["route"]["id"],
            "explain and the data plane disagree on {body}: {e:#}"
        );
    }
    let e = explained(&p, json!({"uri": "/a/b", "client_ip": "10.1.2.3"}));
    assert_eq!(e["route"]["id"], "office", "remote_addrs and priority: {e:#}");
    assert_eq!(candidate(&e, "any")["result"], "outranked");
    assert!(candidate(&e, "any")["reason"].as_str().unwrap_or("").contains("priority"), "{e:#}");
    // No route: whose 404 it is.
    let e = explained(&p, json!({"uri": "/nothing"}));
    assert!(e["route"].is_null());
    assert_eq!(e["verdict"]["status"], 404);
    assert_eq!(e["verdict"]["by"], "gateway");
    assert!(e["took_us"].as_u64().is_some());
}

#[test]
fn explain_lists_the_plugin_chain_with_sources_and_the_consumer() {
    let up = Upstream::start("u");
    let (p, _w) = start(&format!(
        "global_rules:\n  - {{id: g, plugins: {{request-id: {{}}}}}}\n\
         services:\n  - id: s\n    plugins: {{proxy-rewrite: {{headers: {{set: {{x-from: service}}}}}}}}\n    upstream: {{nodes: {{\"{n}\": 1}}}}\n\
         plugin_configs:\n  - {{id: pc, plugins: {{response-rewrite: {{headers: {{set: {{x-pc: \"1\"}}}}}}}}}}\n\
         consumers:\n  - username: jack\n    plugins:\n      key-auth: {{key: jack-key}}\n      limit-count: {{count: 100, time_window: 60}}\n\
         routes:\n  - id: r\n    uri: /auth\n    service_id: s\n    plugin_config_id: pc\n    plugins: {{key-auth: {{}}}}\n\
         \x20 - id: filtered\n    uri: /f\n    upstream: {{nodes: {{\"{n}\": 1}}}}\n    plugins: {{fault-injection: {{abort: {{http_status: 418}}, _meta: {{filter: [[arg_fail, ==, \"1\"]]}}}}}}\n",
        n = up.node()
    ));
    let e = explained(&p, json!({"uri": "/auth", "headers": {"apikey": "jack-key"}}));
    let steps: Vec<(String, String, String)> = e["plugins"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    (
                        s["name"].as_str().unwrap_or("").to_owned(),
                        s["source"].as_str().unwrap_or("").to_owned(),
                        s["source_id"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let has = |name: &str, source: &str, id: &str| {
        assert!(steps.contains(&(name.into(), source.into(), id.into())), "{name} from {source} {id}: {steps:?}");
    };
    has("request-id", "global_rule", "g");
    has("proxy-rewrite", "service", "s");
    has("response-rewrite", "plugin_config", "pc");
    has("key-auth", "route", "r");
    has("limit-count", "consumer", "jack");
    assert_eq!(steps[0].0, "request-id", "global rules run first: {steps:?}");
    let route_part: Vec<i64> = e["plugins"]
        .as_array()
        .map(|a| a[1..].iter().filter_map(|s| s["priority"].as_i64()).collect())
        .unwrap_or_default();
    assert!(route_part.windows(2).all(|w| w[0] >= w[1]), "the route's chain runs in priority order: {e:#}");
    assert_eq!(e["consumer"]["status"], "identified");
    assert_eq!(e["consumer"]["username"], "jack");
    assert_eq!(e["consumer"]["by"], "key-auth");

    // Without a key: key-auth answers, not the upstream, and the data plane agrees.
    let e = explained(&p, json!({"uri": "/auth"}));
    assert_eq!(e["consumer"]["status"], "refused");
    assert_eq!(e["verdict"]["by"], "plugin");
    assert_eq!(e["verdict"]["status"], 401);
    assert_eq!(get(p.node(), "/auth").status, 401);
    assert!(!e["plugins"].as_array().is_some_and(|a| a.iter().any(|s| s["source"] == "consumer")));

    // `_meta.filter` decides whether a plugin runs.
    let e = explained(&p, json!({"uri": "/f"}));
    let fi = e["plugins"].as_array().and_then(|a| a.iter().find(|s| s["name"] == "fault-injection")).cloned();
    assert_eq!(fi.as_ref().map(|s| s["runs"].clone()), Some(json!(false)), "{e:#}");
    let e = explained(&p, json!({"uri": "/f?fail=1"}));
    let fi = e["plugins"].as_array().and_then(|a| a.iter().find(|s| s["name"] == "fault-injection")).cloned();
    assert_eq!(fi.map(|s| s["runs"].clone()), Some(json!(true)));
    assert_eq!(get(p.node(), "/f?fail=1").status, 418);
}

#[test]
fn explain_names_the_node_the_balancer_picks_with_health_and_timeouts() {
    let up = Upstream::start("alive");
    let dead = free_port();
    let (p, _w) = start(&format!(
        "upstreams:\n  - id: pool\n    nodes: {{\"{n}\": 1, \"127.0.0.1:{dead}\": 1}}\n    timeout: {{connect: 2, send: 3, read: 4}}\n    checks: {{active: {{type: tcp, healthy: {{interval: 1}}, unhealthy: {{interval: 1, tcp_failures: 1}}}}}}\n\
         routes:\n  - {{id: r, uri: /r, upstream_id: pool}}\n  - {{id: t, uri: /t, upstream_id: pool, timeout: {{connect: 1, send: 1, read: 9}}}}\n",
        n = up.node()
    ));
    let e = explained(&p, json!({"uri": "/r"}));
    assert_eq!(e["upstream"]["owner"], "upstreams/pool");
    assert_eq!(e["upstream"]["checker"], "not started", "{e:#}");
    assert_eq!(e["timeouts"], json!({"connect": 2.0, "send": 3.0, "read": 4.0, "from": "upstream"}));
    let e = explained(&p, json!({"uri": "/t"}));
    assert_eq!(e["timeouts"], json!({"connect": 1.0, "send": 1.0, "read": 9.0, "from": "route"}));
    // The first request starts the checker; the dead node goes unhealthy.
    let _ = get(p.node(), "/r");
    let dead_addr = format!("127.0.0.1:{dead}");
    assert!(
        eventually(Duration::from_secs(10), || {
            let e = explained(&p, json!({"uri": "/r"}));
            e["upstream"]["nodes"]
                .as_array()
                .is_some_and(|n| n.iter().any(|n| n["address"] == dead_addr && n["health"] == "unhealthy"))
        }),
        "the dead node never showed unhealthy"
    );
    for _ in 0..4 {
        let e = explained(&p, json!({"uri": "/r"}));
        assert_eq!(e["upstream"]["checker"], "running");
        assert_eq!(e["upstream"]["pick"], Value::from(up.node()), "only the healthy node is picked: {e:#}");
        // Explaining moves no balancer state: the data plane still reaches the healthy node.
        assert_eq!(get(p.node(), "/r").status, 200);
    }
}

#[test]
fn explain_normalizes_the_path_as_the_data_plane_does() {
    let up = Upstream::start("u");
    let (p, _w) = start(&format!("routes:\n  - {{id: r, uri: /b/c, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()));
    let e = explained(&p, json!({"uri": "/a/..//b/./%63"}));
    assert_eq!(e["request"]["path"], "/b/c", "{e:#}");
    assert_eq!(e["route"]["id"], "r");
    assert!(e["notes"].to_string().contains("normalized"), "{e:#}");
    assert_eq!(get(p.node(), "/a/..//b/./%63").status, 200);
    // An ambiguous path: the data plane refuses it before routing, and explain says so.
    let e = explained(&p, json!({"uri": "/a/..%2F..%2Fb"}));
    assert_eq!(e["verdict"]["status"], 400, "{e:#}");
    assert_eq!(e["verdict"]["by"], "gateway");
    assert!(e["request"]["path_error"].is_string());
    assert!(e["route"].is_null());
    assert_eq!(get(p.node(), "/a/..%2F..%2Fb").status, 400);
}

#[test]
fn explain_stream_connections() {
    let up = Upstream::start("u");
    let port = free_port();
    let p = Prefix::new(
        &format!("  stream_proxy:\n    tcp: [{{ip: 127.0.0.1, port: {port}}}]\n"),
        "",
        &format!(
            "stream_routes:\n  - {{id: lan, server_port: {port}, remote_addr: 10.0.0.0/8, upstream: {{nodes: {{\"{n}\": 1}}}}}}\n\
             \x20 - {{id: db, server_port: {port}, sni: db.example.com, upstream: {{nodes: {{\"{n}\": 1}}}}}}\n\
             \x20 - {{id: any, server_port: {port}, upstream: {{nodes: {{\"{n}\": 1}}}}}}\n",
            n = up.node()
        ),
    );
    let _w = Weir::start(&p);
    _w.wait_ready(p.node());
    let e = explained(&p, json!({"stream": {"server_port": port, "client_ip": "192.168.1.1"}}));
    assert_eq!(e["kind"], "stream");
    assert_eq!(e["route"]["id"], "any", "{e:#}");
    assert_eq!(candidate(&e, "lan")["field"], "remote_addr");
    assert_eq!(candidate(&e, "db")["field"], "sni");
    assert_eq!(e["upstream"]["pick"], Value::from(up.node()));
    let e = explained(&p, json!({"stream": {"server_port": port, "sni": "DB.example.com"}}));
    assert_eq!(e["route"]["id"], "db");
    assert_eq!(candidate(&e, "any")["result"], "outranked");
    let e = explained(&p, json!({"stream": {"server_port": port + 1}}));
    assert!(e["route"].is_null());
    assert_eq!(e["verdict"]["by"], "closed");
    assert_eq!(candidate(&e, "any")["field"], "server_port");
}

#[test]
fn explain_refuses_malformed_bodies_saying_what_is_wrong() {
    let (p, _w) = start("");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{not json".to_vec(), "invalid body"),
        (json!({"uri": "/", "colour": "red"}).to_string().into_bytes(), "colour"),
        (json!({"method": "G E T", "uri": "/"}).to_string().into_bytes(), "method"),
        (json!({"uri": "/", "client_ip": "localhost"}).to_string().into_bytes(), "client_ip"),
        (json!({"host": "x"}).to_string().into_bytes(), "uri: required"),
        (json!({"uri": "/", "headers": {"bad name": "v"}}).to_string().into_bytes(), "headers"),
        (json!({"uri": "/", "stream": {"server_port": 1}}).to_string().into_bytes(), "stream"),
        (json!({"stream": {"server_port": 0}}).to_string().into_bytes(), "server_port"),
        (json!({"stream": {}}).to_string().into_bytes(), "server_port"),
    ];
    for (body, what) in cases {
        let r = request(p.control(), "POST", "/v1/explain", &[("Content-Type", "application/json")], &body);
        assert_eq!(r.status, 400, "{}: {}", String::from_utf8_lossy(&body), r.text());
        let msg = r.json()["error_msg"].as_str().unwrap_or("").to_owned();
        assert!(msg.contains(what), "{what} not in {msg:?}");
    }
    assert_eq!(request(p.control(), "GET", "/v1/explain", &[], b"").status, 405);
}

#[test]
fn debug_header_per_route_and_upstream_status_on_upstream_errors() {
    let up = Upstream::start("u");
    let dead = free_port();
    let (p, _w) = start(&format!(
        "global_rules:\n  - {{id: g, plugins: {{request-id: {{}}}}}}\n\
         routes:\n  - {{id: dbg, uri: /dbg/*, labels: {{debug_header: \"true\"}}, plugins: {{proxy-rewrite: {{regex_uri: [\"^/dbg/(.*)\", \"/$1\"]}}}}, upstream: {{nodes: {{\"{n}\": 1}}}}}}\n\
         \x20 - {{id: plain, uri: /status/*, upstream: {{nodes: {{\"{n}\": 1}}}}}}\n\
         \x20 - {{id: dead, uri: /dead, upstream: {{nodes: {{\"127.0.0.1:{dead}\": 1}}}}}}\n",
        n = up.node()
    ));
    let r = get(p.node(), "/dbg/status/200");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-weir-debug"),
        Some(format!("route=dbg; plugins=request-id,proxy-rewrite; node={}", up.node()).as_str()),
        "{r:?}"
    );
    assert_eq!(r.header("x-weir-upstream-status"), None, "only 5xx answers carry it by default");
    let r = get(p.node(), "/status/200");
    assert_eq!(r.header("x-weir-debug"), None, "the other routes carry no debug header");
    // A 5xx the upstream made says so; the gateway's own 502 does not.
    let r = get(p.node(), "/status/503");
    assert_eq!(r.status, 503);
    assert_eq!(r.header("x-weir-upstream-status"), Some("503"), "{r:?}");
    let r = get(p.node(), "/dead");
    assert_eq!(r.status, 502);
    assert_eq!(r.header("x-weir-upstream-status"), None, "the gateway made this 502: {r:?}");
    let r = get(p.node(), "/dbg/status/500");
    assert_eq!(r.header("x-weir-upstream-status"), Some("500"));
    assert!(r.header("x-weir-debug").is_some_and(|h| h.starts_with("route=dbg;")));
}

#[test]
fn debug_header_for_every_route_and_upstream_status_always() {
    let up = Upstream::start("u");
    let p = Prefix::new(
        "  debug_header: true\n  show_upstream_status_in_response_header: true\n",
        "",
        &format!("routes:\n  - {{id: r, uri: /status/*, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()),
    );
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let r = get(p.node(), "/status/201");
    assert_eq!(r.header("x-weir-upstream-status"), Some("201"));
    assert_eq!(r.header("x-weir-debug"), Some(format!("route=r; plugins=-; node={}", up.node()).as_str()));
    let r = get(p.node(), "/none");
    assert_eq!(r.status, 404);
    assert_eq!(r.header("x-weir-debug"), Some("route=-; plugins=-; node=-"), "the gateway's own 404");
    assert_eq!(r.header("x-weir-upstream-status"), None);
    // A malformed setting is refused at load, naming the key.
    let bad = Prefix::new("  debug_header: maybe\n", "", "");
    let (code, out) = start_refused(&bad);
    assert_ne!(code, 0);
    assert!(out.contains("debug_header"), "{out}");
}
