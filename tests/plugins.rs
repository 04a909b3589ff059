//! Built-in plugins in the request path, against real upstreams.

mod common;

use std::time::Duration;

use common::upstream::Upstream;
use common::*;
use serde_json::json;

fn up(u: &Upstream) -> String {
    format!("{{nodes: {{\"{}\": 1}}}}", u.node())
}

#[test]
fn key_auth_rejects_missing_and_wrong_keys_and_sets_the_consumer() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "consumers:\n  - {{username: jack, plugins: {{key-auth: {{key: jack-key}}}}}}\n  - {{username: rose, plugins: {{key-auth: {{key: rose-key}}}}}}\nroutes:\n  - {{id: 1, uri: /k, upstream: {u}, plugins: {{key-auth: {{}}, proxy-rewrite: {{headers: {{set: {{x-consumer: $consumer_name}}}}}}}}}}\n  - {{id: 2, uri: /hidden, upstream: {u}, plugins: {{key-auth: {{header: x-key, hide_credentials: true}}}}}}\n",
        u = up(&u)
    ));
    let r = get(p.node(), "/k");
    assert_eq!((r.status, r.json()), (401, json!({"message": "Missing API key in request"})));
    let r = request(p.node(), "GET", "/k", &[("apikey", "nope")], b"");
    assert_eq!((r.status, r.json()), (401, json!({"message": "Invalid API key in request"})));
    let r = request(p.node(), "GET", "/k", &[("apikey", "rose-key")], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["headers"]["x-consumer"], "rose", "the consumer is known to later plugins");
    assert_eq!(get(p.node(), "/k?apikey=jack-key").json()["headers"]["x-consumer"], "jack", "key from the query");
    let r = request(p.node(), "GET", "/hidden?x=1", &[("x-key", "jack-key")], b"");
    assert_eq!(r.status, 200);
    assert!(r.json()["headers"].get("x-key").is_none(), "hide_credentials removes the key");
    let r = get(p.node(), "/hidden?a=1&apikey=jack-key");
    assert_eq!(r.status, 200, "the query argument keeps its default name");
    assert_eq!(r.json()["query"], "a=1", "hide_credentials removes the query argument too");
}

#[test]
fn key_auth_refuses_duplicate_keys_at_load() {
    let p = Prefix::new("", "", "consumers:\n  - {username: a, plugins: {key-auth: {key: same}}}\n  - {username: b, plugins: {key-auth: {key: same}}}\n");
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("consumers `a` and `b` have the same key"), "{out}");
}

#[test]
fn limit_count_rejects_over_the_limit_with_headers() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "consumers:\n  - {{username: jack, plugins: {{key-auth: {{key: k1}}}}}}\n  - {{username: rose, plugins: {{key-auth: {{key: k2}}}}}}\nroutes:\n  - {{id: 1, uri: /l, upstream: {u}, plugins: {{limit-count: {{count: 2, time_window: 60}}}}}}\n  - {{id: 2, uri: /c, upstream: {u}, plugins: {{key-auth: {{}}, limit-count: {{count: 1, time_window: 60, key: consumer_name, rejected_code: 429, rejected_msg: slow down}}}}}}\n",
        u = up(&u)
    ));
    let r = get(p.node(), "/l");
    assert_eq!(r.status, 200);
    assert_eq!((r.header("x-ratelimit-limit"), r.header("x-ratelimit-remaining")), (Some("2"), Some("1")));
    let reset: u64 = r.header("x-ratelimit-reset").and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!((59..=60).contains(&reset), "reset {reset}");
    assert_eq!(get(p.node(), "/l").header("x-ratelimit-remaining"), Some("0"));
    let r = get(p.node(), "/l");
    assert_eq!((r.status, r.json()), (503, json!({"error_msg": "rate limit exceeded"})));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    let hits = u.hits();
    assert_eq!(get(p.node(), "/l").status, 503);
    assert_eq!(u.hits(), hits, "rejected requests never reach the upstream");
    // Per consumer.
    assert_eq!(get(p.node(), "/c?apikey=k1").status, 200);
    let r = get(p.node(), "/c?apikey=k1");
    assert_eq!((r.status, r.json()), (429, json!({"error_msg": "slow down"})));
    assert_eq!(get(p.node(), "/c?apikey=k2").status, 200, "another consumer has its own counter");
}

#[test]
fn proxy_rewrite_changes_uri_host_method_and_headers() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /old/*, upstream: {u}, plugins: {{proxy-rewrite: {{regex_uri: [\"^/old/(.*)\", \"/new/$1\"], host: api.internal, method: POST, headers: {{add: {{x-added: a}}, set: {{x-set: $remote_addr}}, remove: [x-drop]}}}}}}}}\n  - {{id: 2, uri: /fixed, upstream: {u}, plugins: {{proxy-rewrite: {{uri: \"/target?from=$uri\"}}}}}}\n",
        u = up(&u)
    ));
    let r = request(p.node(), "GET", "/old/a/b?q=1", &[("X-Drop", "d"), ("X-Set", "client")], b"");
    let e = r.json();
    assert_eq!(e["path"], "/new/a/b");
    assert_eq!(e["query"], "q=1");
    assert_eq!(e["method"], "POST");
    assert_eq!(e["headers"]["host"], "api.internal");
    assert_eq!(e["headers"]["x-added"], "a");
    assert_eq!(e["headers"]["x-set"], "127.0.0.1");
    assert!(e["headers"].get("x-drop").is_none());
    let e = get(p.node(), "/fixed").json();
    assert_eq!((e["path"].as_str(), e["query"].as_str()), (Some("/target"), Some("from=/fixed")));
}

#[test]
fn response_rewrite_changes_status_body_and_headers() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /r, upstream: {u}, plugins: {{response-rewrite: {{status_code: 202, body: replaced, headers: {{set: {{x-server: weir}}, remove: [content-type]}}}}}}}}\n  - {{id: 2, uri: /h, upstream: {u}, plugins: {{response-rewrite: {{headers: {{add: {{x-extra: \"1\"}}}}}}}}}}\n  - {{id: 3, uri: /denied, upstream: {u}, plugins: {{key-auth: {{}}, response-rewrite: {{status_code: 403, body: \"{{\\\"denied\\\":true}}\"}}}}}}\n",
        u = up(&u)
    ));
    let r = get(p.node(), "/r");
    assert_eq!((r.status, r.text().as_str()), (202, "replaced"));
    assert_eq!(r.header("x-server"), Some("weir"));
    assert!(r.header("content-type").is_none());
    let r = get(p.node(), "/h");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-extra"), Some("1"));
    assert_eq!(r.json()["node"], "u", "the body is untouched without `body`");
    let r = get(p.node(), "/denied");
    assert_eq!((r.status, r.text().as_str()), (403, "{\"denied\":true}"), "applies to plugin responses too");
}

#[test]
fn request_id_reaches_upstream_and_client() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "global_rules:\n  - {{id: 1, plugins: {{request-id: {{}}}}}}\nroutes:\n  - {{id: 1, uri: /*, upstream: {u}}}\n",
        u = up(&u)
    ));
    let r = get(p.node(), "/x");
    let id = r.header("x-request-id").unwrap_or_default().to_owned();
    assert_eq!(id.len(), 36, "uuid: {id}");
    assert_eq!(r.json()["headers"]["x-request-id"], id);
    let r = request(p.node(), "GET", "/x", &[("X-Request-Id", "given")], b"");
    assert_eq!(r.header("x-request-id"), Some("given"));
    assert_ne!(get(p.node(), "/x").header("x-request-id"), Some(id.as_str()));
}

#[test]
fn service_plugins_are_overridden_by_route_plugins() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "services:\n  - {{id: s, upstream: {u}, plugins: {{proxy-rewrite: {{headers: {{set: {{x-from: service}}}}}}, request-id: {{header_name: x-svc-id}}}}}}\nroutes:\n  - {{id: 1, uri: /a, service_id: s}}\n  - {{id: 2, uri: /b, service_id: s, plugins: {{proxy-rewrite: {{headers: {{set: {{x-from: route}}}}}}}}}}\n",
        u = up(&u)
    ));
    let a = get(p.node(), "/a");
    assert_eq!(a.json()["headers"]["x-from"], "service");
    assert!(a.header("x-svc-id").is_some());
    let b = get(p.node(), "/b");
    assert_eq!(b.json()["headers"]["x-from"], "route");
    assert!(b.header("x-svc-id").is_some(), "service plugins the route does not override still run");
}

fn read_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn file_logger_writes_json_lines_in_the_metadata_format() {
    let u = Upstream::start("u");
    let p = Prefix::new("", "", "");
    let default_log = p.dir.join("logs/default.log");
    let custom_log = p.dir.join("logs/custom.log");
    p.write_resources(&format!(
        "routes:\n  - {{id: d, uri: /d, upstream: {u}, plugins: {{file-logger: {{path: \"{}\"}}}}}}\n",
        default_log.display(),
        u = up(&u)
    ));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(get(p.node(), "/d?x=1").status, 200);
    assert!(eventually(Duration::from_secs(3), || read_lines(&default_log).len() == 1));
    let line = &read_lines(&default_log)[0];
    assert_eq!(line["uri"], "/d?x=1");
    assert_eq!(line["status"], 200);
    assert_eq!(line["route_id"], "d");
    assert_eq!(line["client_ip"], "127.0.0.1");
    assert_eq!(line["upstream_addr"], u.node());
    assert!(line["time"].as_str().is_some_and(|t| t.ends_with('Z')));

    p.write_resources(&format!(
        "plugin_metadata:\n  - {{id: file-logger, log_format: {{who: $remote_addr, agent: $http_user_agent, what: $request_method, fixed: weir}}}}\nroutes:\n  - {{id: c, uri: /c, upstream: {u}, plugins: {{file-logger: {{path: \"{}\"}}}}}}\n",
        custom_log.display(),
        u = up(&u)
    ));
    assert!(eventually(Duration::from_secs(3), || get(p.node(), "/c").status == 200));
    request(p.node(), "GET", "/c", &[("User-Agent", "tester")], b"");
    assert!(
        eventually(Duration::from_secs(3), || read_lines(&custom_log).iter().any(|l| l["agent"] == "tester")),
        "{}\n{}",
        std::fs::read_to_string(&custom_log).unwrap_or_default(),
        w.log_text()
    );
    let line = read_lines(&custom_log).into_iter().find(|l| l["agent"] == "tester").unwrap_or_default();
    assert_eq!(line, json!({"who": "127.0.0.1", "agent": "tester", "what": "GET", "fixed": "weir"}));
}

#[test]
fn file_logger_reopens_on_sigusr1_and_flushes_on_shutdown() {
    let u = Upstream::start("u");
    let p = Prefix::new("", "", "");
    let log = p.dir.join("access.log");
    p.write_resources(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {u}, plugins: {{file-logger: {{path: \"{}\"}}}}}}\n",
        log.display(),
        u = up(&u)
    ));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(get(p.node(), "/before").status, 200);
    assert!(eventually(Duration::from_secs(3), || read_lines(&log).len() == 1));
    let rotated = p.dir.join("access.log.1");
    std::fs::rename(&log, &rotated).expect("rotate");
    let _ = std::process::Command::new("kill").arg("-USR1").arg(w.pid().to_string()).status();
    assert!(eventually(Duration::from_secs(3), || w.log_text().contains("reopening log files")));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(get(p.node(), "/after").status, 200);
    assert!(eventually(Duration::from_secs(3), || read_lines(&log).len() == 1), "new file after SIGUSR1");
    assert_eq!(read_lines(&log)[0]["uri"], "/after");
    assert_eq!(read_lines(&rotated).len(), 1);

    // A burst, then SIGTERM at once: every acknowledged request is in the file.
    let node = p.node();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || (0..50).filter(|i| get(node, &format!("/burst/{t}/{i}")).status == 200).count())
        })
        .collect();
    let sent: usize = threads.into_iter().map(|t| t.join().unwrap_or(0)).sum();
    let status = w.terminate();
    assert!(status.success());
    let burst = read_lines(&log).iter().filter(|l| l["uri"].as_str().is_some_and(|u| u.starts_with("/burst/"))).count();
    assert_eq!((sent, burst), (200, 200));
}

/// `_meta.filter` (an APISIX expression) decides per request whether a plugin runs; one that
/// cannot work refuses the start, naming its place.
#[test]
fn meta_filter_runs_a_plugin_only_where_it_holds() {
    let u = common::upstream::Upstream::start("u");
    let resources = format!(
        "consumers:\n  - {{username: jack, plugins: {{key-auth: {{key: k}}}}}}\nroutes:\n  - {{id: 1, uri: /f, upstream: {{nodes: {{\"{}\": 1}}}}, plugins: {{key-auth: {{_meta: {{filter: [[\"arg_auth\", \"==\", \"yes\"], [\"http_x_env\", \"~~\", \"^prod\"]]}}}}}}}}\n",
        u.node()
    );
    let (p, _w) = common::start(&resources);
    assert_eq!(common::get(p.node(), "/f").status, 200, "the filter does not hold: key-auth is skipped");
    assert_eq!(common::request(p.node(), "GET", "/f?auth=yes", &[("x-env", "staging")], b"").status, 200);
    assert_eq!(common::request(p.node(), "GET", "/f?auth=yes", &[("x-env", "production")], b"").status, 401);
    let ok = common::request(p.node(), "GET", "/f?auth=yes", &[("x-env", "production"), ("apikey", "k")], b"");
    assert_eq!(ok.status, 200);

    let bad = common::Prefix::new(
        "",
        "",
        "routes:\n  - {id: 1, uri: /f, upstream: {nodes: {\"127.0.0.1:1\": 1}}, plugins: {key-auth: {_meta: {filter: [[\"arg_a\", \"=~\", \"x\"]]}}}}\n",
    );
    let (code, out) = common::start_refused(&bad);
    assert_ne!(code, 0);
    assert!(out.contains("plugins.key-auth._meta.filter[0][1]") && out.contains("unknown operator `=~`"), "{out}");
}
