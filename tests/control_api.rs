//! The control server's plugin-independent endpoints, against the real binary.

mod common;

use common::*;
use serde_json::json;

const RESOURCES: &str = r#"
upstreams:
  - id: 1
    nodes:
      "127.0.0.1:1980": 1
  - id: checked
    nodes:
      - {host: 127.0.0.1, port: 1981, weight: 2}
    checks:
      active:
        type: tcp
services:
  - id: s1
    upstream_id: 1
routes:
  - id: 1
    uri: /hello
    upstream_id: 1
  - id: r2
    uris: [/a, /b/*]
    service_id: s1
    plugins:
      example-plugin: {i: 1}
plugin_metadata:
  - id: example-plugin
    ikey: 1
    skey: val
"#;

fn gateway() -> (Prefix, Weir) {
    let p = Prefix::new("", "", RESOURCES);
    let w = Weir::start(&p);
    (p, w)
}

#[test]
fn schema_lists_core_kinds_and_enabled_plugins() {
    let (p, _w) = gateway();
    let r = get(p.control(), "/v1/schema");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let doc = r.json();
    for kind in ["route", "service", "upstream", "consumer", "global_rule", "plugin_metadata", "ssl", "stream_route"] {
        assert!(doc["main"][kind]["properties"].is_object(), "main.{kind}.properties missing: {doc}");
    }
    assert!(doc["main"]["route"]["properties"]["uri"].is_object());
    assert!(doc["main"]["upstream"]["properties"]["checks"]["properties"]["active"].is_object());
    // No `stream_plugins:` in config.yaml: every compiled-in stream plugin is enabled.
    let stream = doc["stream-plugins"].as_object().expect("stream-plugins object");
    assert_eq!(stream.contains_key("limit-conn"), cfg!(feature = "limit-conn"), "{doc}");
    let example = &doc["plugins"]["example-plugin"];
    assert_eq!(example["priority"], 0);
    assert_eq!(example["version"], 0.1);
    assert_eq!(example["schema"]["required"], json!(["i"]));
    assert!(example["metadata_schema"]["properties"]["ikey"].is_object());
    assert!(example.get("type").is_none() && example.get("consumer_schema").is_none(), "{example}");
    let key_auth = &doc["plugins"]["key-auth"];
    assert_eq!(key_auth["type"], "auth");
    assert!(key_auth["consumer_schema"]["properties"]["key"].is_object());
}

#[test]
fn schema_reported_is_the_schema_that_validates() {
    // The reported example-plugin schema requires `i`; a route without it must be refused, and
    // the error must name the plugin's field.
    let (p, w) = gateway();
    let schema = get(p.control(), "/v1/schema").json();
    assert_eq!(schema["plugins"]["example-plugin"]["schema"]["properties"]["i"]["type"], "integer");
    p.write_resources(&RESOURCES.replace("example-plugin: {i: 1}", "example-plugin: {i: \"one\"}"));
    assert!(
        eventually(std::time::Duration::from_secs(3), || w
            .log_text()
            .contains("plugins.example-plugin.i: expected integer")),
        "log:\n{}",
        w.log_text()
    );
}

#[test]
fn plugin_metadata_endpoints() {
    let (p, _w) = gateway();
    let r = get(p.control(), "/v1/plugin_metadatas");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!([{"id": "example-plugin", "ikey": 1, "skey": "val"}]));
    let r = get(p.control(), "/v1/plugin_metadata/example-plugin");
    assert_eq!(r.json(), json!({"id": "example-plugin", "ikey": 1, "skey": "val"}));
    let r = get(p.control(), "/v1/plugin_metadata/key-auth");
    assert_eq!(r.status, 404);
    assert_eq!(r.json(), json!({"error_msg": "plugin metadata[key-auth] not found"}));
}

#[test]
fn empty_collections_are_arrays() {
    let p = Prefix::new("", "", "");
    let _w = Weir::start(&p);
    for path in ["/v1/plugin_metadatas", "/v1/routes", "/v1/services", "/v1/upstreams", "/v1/healthcheck"] {
        let r = get(p.control(), path);
        assert_eq!((r.status, r.json()), (200, json!([])), "{path}");
    }
}

#[test]
fn resource_dumps_with_defaults_and_string_ids() {
    let (p, _w) = gateway();
    let routes = get(p.control(), "/v1/routes").json();
    assert_eq!(routes.as_array().map(Vec::len), Some(2));
    let r1 = get(p.control(), "/v1/route/1").json();
    assert_eq!(r1["id"], "1");
    assert_eq!(r1["upstream_id"], "1");
    assert_eq!(r1["status"], 1);
    assert_eq!(r1["priority"], 0);
    let r2 = get(p.control(), "/v1/route/r2").json();
    assert_eq!(r2["plugins"]["example-plugin"]["i"], 1);
    let up = get(p.control(), "/v1/upstream/checked").json();
    assert_eq!(up["type"], "roundrobin");
    assert_eq!(up["pass_host"], "pass");
    assert_eq!(up["checks"]["active"]["healthy"]["successes"], 2);
    assert_eq!(up["checks"]["active"]["unhealthy"]["tcp_failures"], 2);
    assert_eq!(up["checks"]["active"]["http_path"], "/");
    assert_eq!(get(p.control(), "/v1/services").json()[0]["id"], "s1");
    assert_eq!(get(p.control(), "/v1/service/s1").json()["upstream_id"], "1");
    for (path, msg) in [
        ("/v1/route/9", "route[9] not found"),
        ("/v1/service/9", "service[9] not found"),
        ("/v1/upstream/9", "upstream[9] not found"),
    ] {
        let r = get(p.control(), path);
        assert_eq!((r.status, r.json()), (404, json!({ "error_msg": msg })), "{path}");
    }
}

#[test]
fn healthcheck_answers_and_errors() {
    let (p, _w) = gateway();
    let c = p.control();
    assert_eq!(get(c, "/v1/healthcheck").json(), json!([]));
    for (path, status, msg) in [
        ("/v1/healthcheck/routes", 404, "missing src id for src type routes"),
        ("/v1/healthcheck/routes/", 404, "missing src id for src type routes"),
        ("/v1/healthcheck/route", 404, "missing src id for src type route"),
        ("/v1/healthcheck/route/1", 400, "invalid src type route"),
        ("/v1/healthcheck/routes/404", 404, "routes[404] not found"),
        ("/v1/healthcheck/upstreams/nope", 404, "upstreams[nope] not found"),
        // Checks configured but no request served yet: no checker (the seed's inclusion rule).
        ("/v1/healthcheck/upstreams/checked", 404, "no checker for upstreams[checked]"),
        ("/v1/healthcheck/upstreams/1", 404, "no checker for upstreams[1]"),
        ("/v1/healthcheck/services/s1", 404, "no checker for services[s1]"),
    ] {
        let r = get(c, path);
        assert_eq!((r.status, r.json()), (status, json!({ "error_msg": msg })), "{path}");
    }
    // Errors stay JSON when the client asks for HTML.
    let r = request(c, "GET", "/v1/healthcheck/route/1", &[("Accept", "text/html")], b"");
    assert_eq!(r.header("content-type"), Some("application/json"));
}

#[test]
fn healthcheck_html_when_asked() {
    let (p, _w) = gateway();
    let r = request(p.control(), "GET", "/v1/healthcheck", &[("Accept", "TEXT/HTML,application/xhtml+xml;q=0.9")], b"");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap_or("").starts_with("text/html"));
    let page = r.text();
    for col in [
        "Index",
        "Upstream",
        "Check type",
        "Host",
        "Status",
        "Success counts",
        "TCP Failures",
        "HTTP Failures",
        "TIMEOUT Failures",
    ] {
        assert!(page.contains(&format!("<th>{col}</th>")), "column {col} missing");
    }
    let r = request(p.control(), "GET", "/v1/healthcheck", &[("Accept", "application/json")], b"");
    assert_eq!(r.json(), json!([]));
}

#[test]
fn unknown_paths_and_wrong_methods() {
    let (p, _w) = gateway();
    let r = get(p.control(), "/v1/nothing");
    assert_eq!((r.status, r.json()), (404, json!({"error_msg": "not found"})));
    let r = get(p.control(), "/v1/gc");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));
    assert!(r.json()["error_msg"].is_string());
    let r = request(p.control(), "POST", "/v1/schema", &[], b"");
    assert_eq!((r.status, r.header("allow")), (405, Some("GET")));
    let r = get(p.control(), "/v1/plugins/reload");
    assert_eq!((r.status, r.header("allow")), (405, Some("PUT")));
    let r = request(p.control(), "DELETE", "/v1/plugin/example-plugin/hello", &[], b"");
    assert_eq!((r.status, r.header("allow")), (405, Some("GET")));
}

#[test]
fn gc_reports_memory_and_returns_freed_pages() {
    let up = common::upstream::Upstream::start("slow");
    let p = Prefix::new(
        "",
        "",
        &format!("routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()),
    );
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    // A burst of allocation from real traffic: 500 concurrent 60 KiB uploads (small bodies are
    // buffered so they can be retried) held by a slow upstream, then all released.
    let node = p.node();
    let body = vec![b'x'; 60 * 1024];
    let threads: Vec<_> = (0..500)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || request(node, "POST", "/sleep/1500", &[], &body).status)
        })
        .collect();
    let statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap_or(0)).collect();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let rss_before = w.rss();
    let r = request(p.control(), "POST", "/v1/gc", &[], b"");
    assert_eq!(r.status, 200);
    let report = r.json();
    for side in ["before", "after"] {
        for field in ["allocated", "resident", "rss"] {
            assert!(report[side][field].as_u64().is_some(), "{side}.{field} missing: {report}");
        }
    }
    let rss_after = w.rss();
    let resident_before = report["before"]["resident"].as_u64().unwrap_or(0);
    let resident_after = report["after"]["resident"].as_u64().unwrap_or(u64::MAX);
    const MIB: u64 = 1 << 20;
    assert!(resident_after + 8 * MIB < resident_before, "allocator resident not lowered: {report}");
    assert!(rss_after + 8 * MIB < rss_before, "process RSS not lowered: {rss_before} -> {rss_after} ({report})");
}
