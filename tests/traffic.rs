//! Traffic plugins against the real binary and real upstream servers: traffic-split (weights,
//! vars, inline upstreams, references checked at load, health checks of the upstreams it
//! names), proxy-mirror (the rewritten request copied, a hanging or refusing mirror costing the
//! client nothing, the in-flight bound), fault-injection (abort and delay with vars) and
//! api-breaker (open after N failures, doubling, closed after the healthy count); and the APISIX
//! documentation's examples of all four, loaded unchanged from resources.yaml and through the
//! Admin API.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::upstream::Upstream;
use common::*;
use serde_json::{json, Value};

fn nodes(u: &Upstream) -> String {
    format!("{{\"{}\": 1}}", u.node())
}

/// Which upstream answered (the echo's `node`), or the status when none did.
fn answered_by(r: &Response) -> String {
    if r.status == 200 {
        r.json()["node"].as_str().unwrap_or("?").to_owned()
    } else {
        format!("status {}", r.status)
    }
}

fn tally(p: &Prefix, n: usize, path: &str, headers: &[(&str, &str)]) -> HashMap<String, usize> {
    let mut all = HashMap::new();
    for _ in 0..n {
        *all.entry(answered_by(&request(p.node(), "GET", path, headers, b""))).or_default() += 1;
    }
    all
}

#[test]
fn traffic_split_shares_by_weight_and_never_picks_weight_zero() {
    let (stable, canary, never) = (Upstream::start("stable"), Upstream::start("canary"), Upstream::start("never"));
    let (p, _w) = start(&format!(
        "upstreams:\n  - {{id: canary, nodes: {c}}}\n  - {{id: never, nodes: {n}}}\nroutes:\n  - id: 1\n    uri: /split\n    upstream: {{nodes: {s}}}\n    plugins:\n      traffic-split:\n        rules:\n          - weighted_upstreams:\n              - {{upstream_id: canary, weight: 3}}\n              - {{upstream_id: never, weight: 0}}\n              - {{weight: 2}}\n",
        s = nodes(&stable),
        c = nodes(&canary),
        n = nodes(&never),
    ));
    let got = tally(&p, 100, "/split", &[]);
    assert_eq!(got.get("canary"), Some(&60), "{got:?}");
    assert_eq!(got.get("stable"), Some(&40), "the entry without an upstream is the route's own: {got:?}");
    assert_eq!(never.hits(), 0, "weight 0 is never chosen");
}

#[test]
fn traffic_split_vars_pick_the_canary_with_an_inline_upstream() {
    let (stable, canary) = (Upstream::start("stable"), Upstream::start("canary"));
    let (p, _w) = start(&format!(
        "routes:\n  - id: 1\n    uri: /*\n    upstream: {{nodes: {s}}}\n    plugins:\n      traffic-split:\n        rules:\n          - match:\n              - vars: [[http_x-canary, ==, \"1\"], [arg_user, in, [ann, bob]]]\n              - vars: [[post_arg_id, ==, \"7\"]]\n            weighted_upstreams:\n              - upstream: {{type: roundrobin, nodes: {c}, pass_host: rewrite, upstream_host: canary.internal, timeout: {{connect: 1, send: 1, read: 1}}}}\n",
        s = nodes(&stable),
        c = nodes(&canary),
    ));
    let canary_req = [("x-canary", "1")];
    let r = request(p.node(), "GET", "/a?user=ann", &canary_req, b"");
    assert_eq!(answered_by(&r), "canary");
    assert_eq!(r.json()["headers"]["host"], "canary.internal", "the inline upstream's pass_host");
    assert_eq!(answered_by(&request(p.node(), "GET", "/a?user=eve", &canary_req, b"")), "stable", "AND");
    assert_eq!(answered_by(&get(p.node(), "/a?user=ann")), "stable", "no header");
    // The inline upstream's own timeout (1 s), not the route's.
    let started = Instant::now();
    let r = request(p.node(), "GET", "/sleep/3000?user=bob", &canary_req, b"");
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(started.elapsed() < Duration::from_millis(2500), "{:?}", started.elapsed());
    // A form field (the body is read for the rule that names one).
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let r = request(p.node(), "POST", "/form", &form, b"name=x&id=7");
    assert_eq!(answered_by(&r), "canary");
    assert_eq!(r.json()["body"], "name=x&id=7", "the body still reaches the upstream");
    assert_eq!(answered_by(&request(p.node(), "POST", "/form", &form, b"id=8")), "stable");
    // Hostile input: a header value that is not ASCII, a huge query: no match, no harm.
    let r = request(p.node(), "GET", &format!("/a?user={}", "x".repeat(6000)), &[("x-canary", "\u{e9}")], b"");
    assert_eq!(answered_by(&r), "stable");
}

#[test]
fn traffic_split_refuses_an_unknown_upstream_id_at_load_and_reload() {
    let stable = Upstream::start("stable");
    let refused = Prefix::new(
        "",
        "",
        &format!(
            "routes:\n  - {{id: r1, uri: /x, upstream: {{nodes: {s}}}, plugins: {{traffic-split: {{rules: [{{weighted_upstreams: [{{upstream_id: nope}}]}}]}}}}}}\n",
            s = nodes(&stable)
        ),
    );
    let (code, out) = start_refused(&refused);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("routes[0] (id r1)") && out.contains("upstream `nope` does not exist"), "{out}");

    // Loaded with the upstream, then the upstream goes: the change is refused, naming it,
    // even though the route's plugin configuration did not change.
    let canary = Upstream::start("canary");
    let with = format!(
        "upstreams:\n  - {{id: u1, nodes: {c}}}\nroutes:\n  - {{id: r1, uri: /x, upstream: {{nodes: {s}}}, plugins: {{traffic-split: {{rules: [{{weighted_upstreams: [{{upstream_id: u1}}]}}]}}}}}}\n",
        s = nodes(&stable),
        c = nodes(&canary)
    );
    let p = Prefix::new("", "", &with);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(answered_by(&get(p.node(), "/x")), "canary");
    p.write_resources(&with.replace("upstreams:\n  - {id: u1", "upstreams:\n  - {id: u2"));
    let refused = eventually(Duration::from_secs(5), || w.log_text().contains("upstream `u1` does not exist"));
    assert!(refused, "{}", w.log_text());
    assert_eq!(answered_by(&get(p.node(), "/x")), "canary", "the last good set serves");
}

#[test]
fn traffic_split_keeps_the_health_checks_of_the_upstream_it_names() {
    let live = Upstream::start("live");
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_port = dead.local_addr().expect("addr").port();
    drop(dead);
    let stable = Upstream::start("stable");
    let (p, _w) = start(&format!(
        "upstreams:\n  - id: checked\n    retries: 0\n    nodes: {{\"{live}\": 1, \"127.0.0.1:{dead_port}\": 1}}\n    checks: {{active: {{type: tcp, healthy: {{interval: 1, successes: 1}}, unhealthy: {{interval: 1, tcp_failures: 1}}}}}}\nroutes:\n  - {{id: 1, uri: /h, upstream: {{nodes: {s}}}, plugins: {{traffic-split: {{rules: [{{weighted_upstreams: [{{upstream_id: checked}}]}}]}}}}}}\n",
        live = live.node(),
        s = nodes(&stable),
    ));
    let _ = get(p.node(), "/h"); // the first request through the plugin starts the checker
    let down = eventually(Duration::from_secs(10), || {
        let e = get(p.control(), "/v1/healthcheck/upstreams/checked").json();
        e["nodes"].as_array().is_some_and(|n| n.iter().any(|n| n["status"] == "unhealthy"))
    });
    assert!(down, "{}", get(p.control(), "/v1/healthcheck/upstreams/checked").text());
    let got = tally(&p, 20, "/h", &[]);
    assert_eq!(got.get("live"), Some(&20), "the dead node is skipped without retries: {got:?}");
}

#[test]
fn fault_injection_aborts_and_delays_when_its_vars_hold() {
    let up = Upstream::start("up");
    let (p, _w) = start(&format!(
        "routes:\n  - id: 1\n    uri: /anything\n    upstream: {{nodes: {n}}}\n    plugins:\n      fault-injection:\n        abort: {{http_status: 404, body: \"APISIX Fault Injection for $remote_addr\", headers: {{X-APISIX-Remote-Addr: $remote_addr}}, vars: [[[arg_name, ==, john]]]}}\n        delay: {{duration: 0.6, vars: [[[http_x-slow, ==, \"1\"]], [[arg_name, ==, slow]]]}}\n",
        n = nodes(&up)
    ));
    let r = get(p.node(), "/anything?name=john");
    assert_eq!((r.status, r.text().as_str()), (404, "APISIX Fault Injection for 127.0.0.1"));
    assert_eq!(r.header("x-apisix-remote-addr"), Some("127.0.0.1"));
    assert_eq!(up.hits(), 0, "an abort never reaches the upstream");
    let r = get(p.node(), "/anything?name=jane");
    assert_eq!(answered_by(&r), "up");

    // A delayed request waits without holding up the worker's other requests (one worker).
    let node = p.node();
    let slow = std::thread::spawn(move || {
        let started = Instant::now();
        let r = request(node, "GET", "/anything", &[("x-slow", "1")], b"");
        (r.status, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    assert_eq!(get(p.node(), "/anything").status, 200);
    assert!(started.elapsed() < Duration::from_millis(300), "not delayed: {:?}", started.elapsed());
    let (status, took) = slow.join().expect("slow request");
    assert_eq!(status, 200);
    assert!(took >= Duration::from_millis(600), "{took:?}");
    let started = Instant::now();
    assert_eq!(get(p.node(), "/anything?name=slow").status, 200, "the second expression (OR)");
    assert!(started.elapsed() >= Duration::from_millis(600));
}

#[test]
fn api_breaker_opens_after_failures_doubles_and_closes_after_successes() {
    let up = Upstream::start("up");
    let (p, _w) = start(&format!(
        "routes:\n  - id: 1\n    uri: /*\n    upstream: {{nodes: {n}, retries: 0}}\n    plugins:\n      api-breaker:\n        break_response_code: 503\n        break_response_body: \"breaker open\"\n        break_response_headers: [{{key: X-Client-Addr, value: \"$remote_addr\"}}]\n        unhealthy: {{http_statuses: [500, 502], failures: 2}}\n        healthy: {{http_statuses: [200], successes: 2}}\n",
        n = nodes(&up)
    ));
    let status = |path: &str| get(p.node(), path).status;
    assert_eq!(status("/status/500"), 500);
    assert_eq!(status("/status/404"), 404, "neither healthy nor unhealthy");
    assert_eq!(status("/status/500"), 500, "the second failure is still the upstream's answer");
    let hits = up.hits();
    let r = get(p.node(), "/status/200");
    assert_eq!((r.status, r.text().as_str()), (503, "breaker open"));
    assert_eq!(r.header("x-client-addr"), Some("127.0.0.1"));
    assert_eq!(up.hits(), hits, "an open breaker never reaches the upstream");
    let opened = Instant::now();
    // Open for 2 s (2^1), then requests go through again: the third failure does not reopen it
    // (2 failures per opening), the fourth does, for 4 s (2^2).
    assert!(eventually(Duration::from_secs(4), || status("/status/500") == 500));
    assert!(opened.elapsed() >= Duration::from_millis(1900), "{:?}", opened.elapsed());
    assert_eq!(status("/status/500"), 500);
    let reopened = Instant::now();
    assert_eq!(status("/status/200"), 503);
    std::thread::sleep(Duration::from_millis(3000));
    assert_eq!(status("/status/200"), 503, "still open after 3 s: the time doubled");
    assert!(eventually(Duration::from_secs(3), || status("/status/200") == 200));
    assert!(reopened.elapsed() >= Duration::from_millis(3900), "{:?}", reopened.elapsed());
    // That was the first of two successes: a failure restarts their count, and as the fifth
    // (not a multiple of 2) it does not reopen the breaker.
    assert_eq!(status("/status/500"), 500);
    assert_eq!(status("/status/200"), 200);
    assert_eq!(status("/status/200"), 200);
    // Closed and forgotten: one failure opens nothing.
    assert_eq!(status("/status/500"), 500);
    assert_eq!(status("/status/200"), 200);
}

/// What a mirror target received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// A mirror target on loopback: records each request; answers 200, or never (`hang`).
struct Target {
    addr: std::net::SocketAddr,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
}

impl Target {
    fn start(hang: bool) -> Target {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                    let mut writer = conn;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let mut parts = line.split_whitespace();
                        let (method, target) =
                            (parts.next().unwrap_or("").to_owned(), parts.next().unwrap_or("").to_owned());
                        let mut headers = Vec::new();
                        loop {
                            let mut h = String::new();
                            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                                return;
                            }
                            let h = h.trim_end();
                            if h.is_empty() {
                                break;
                            }
                            if let Some((k, v)) = h.split_once(':') {
                                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
                            }
                        }
                        let len: usize = headers
                            .iter()
                            .find(|(k, _)| k == "content-length")
                            .and_then(|(_, v)| v.parse().ok())
                            .unwrap_or(0);
                        let mut body = vec![0; len];
                        if reader.read_exact(&mut body).is_err() {
                            return;
                        }
                        log.lock().unwrap_or_else(|e| e.into_inner()).push(Seen { method, target, headers, body });
                        if hang {
                            std::thread::sleep(Duration::from_secs(120));
                            return;
                        }
                        if writer.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nmirror").is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Target { addr, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A sample of the proxy-mirror metrics: `outcome` of `weir_proxy_mirror_requests_total`, or
/// another family by its full name and labels.
fn metric(p: &Prefix, line_start: &str) -> Option<f64> {
    let text = get(p.metrics(), "/weir/prometheus/metrics").text();
    text.lines().find(|l| l.starts_with(line_start)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

#[test]
fn proxy_mirror_copies_the_rewritten_request_and_the_client_gets_the_primary_answer() {
    let primary = Upstream::start("primary");
    let target = Target::start(false);
    let (p, _w) = start(&format!(
        "routes:\n  - id: 1\n    uri: /orig/*\n    upstream: {{nodes: {n}}}\n    plugins:\n      proxy-rewrite: {{uri: /v2$uri, headers: {{set: {{X-Rewritten: yes}}, remove: [X-Secret]}}}}\n      proxy-mirror: {{host: \"http://{t}\", path: /copy, path_concat_mode: prefix}}\n      key-auth: {{}}\nconsumers:\n  - {{username: jack, plugins: {{key-auth: {{key: k1}}}}}}\n",
        n = nodes(&primary),
        t = target.addr,
    ));
    let headers = [("apikey", "k1"), ("x-secret", "s"), ("host", "shop.example"), ("content-type", "text/plain")];
    let r = request(p.node(), "POST", "/orig/a?x=1", &headers, b"hello mirror");
    assert_eq!(answered_by(&r), "primary", "the client gets the primary's answer, never the mirror's");
    assert_eq!(r.json()["path"], "/v2/orig/a");
    assert!(eventually(Duration::from_secs(5), || target.seen().len() == 1), "{:?}", target.seen());
    let copy = &target.seen()[0];
    assert_eq!((copy.method.as_str(), copy.target.as_str()), ("POST", "/copy/v2/orig/a?x=1"));
    assert_eq!(copy.header("x-rewritten"), Some("yes"), "headers as proxy-rewrite left them");
    assert_eq!(copy.header("x-secret"), None);
    assert_eq!(copy.header("host"), Some("shop.example"), "the client's Host, as APISIX sends $upstream_host");
    assert_eq!(copy.header("x-consumer-username"), Some("jack"), "after authentication");
    assert_eq!(copy.body, b"hello mirror");
    // A request a plugin answered (401) went nowhere, and is not copied either.
    assert_eq!(request(p.node(), "GET", "/orig/b", &[], b"").status, 401);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(target.seen().len(), 1, "{:?}", target.seen());
    // A body too large to be read first streams to the primary and is not copied (counted).
    let r = upload(p.node(), "/orig/upload?apikey=k1", 300 * 1024);
    assert_eq!((r.status, &r.json()["body_len"]), (200, &json!(300 * 1024)), "the primary got it all");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(target.seen().len(), 1);
    assert_eq!(metric(&p, "weir_proxy_mirror_skipped_total{reason=\"body\"}"), Some(1.0));
}

/// Mean latency of `n` sequential requests to `path`.
fn mean_latency(p: &Prefix, path: &str, n: u32) -> Duration {
    let started = Instant::now();
    for _ in 0..n {
        let r = get(p.node(), path);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    started.elapsed() / n
}

#[test]
fn a_hanging_or_refusing_mirror_costs_the_client_nothing_and_the_bound_drops_and_counts() {
    let primary = Upstream::start("primary");
    let hanging = Target::start(true);
    let refusing = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = l.local_addr().expect("addr");
        drop(l);
        a
    };
    let p = Prefix::new(
        "",
        "plugin_attr:\n  proxy-mirror:\n    max_in_flight: 4\n    timeout: {connect: 1s, read: 60s, send: 1s}\n",
        &format!(
            "routes:\n  - {{id: plain, uri: /plain, upstream: {{nodes: {n}}}}}\n  - {{id: hang, uri: /hang, upstream: {{nodes: {n}}}, plugins: {{proxy-mirror: {{host: \"http://{h}\"}}}}}}\n  - {{id: refuse, uri: /refuse, upstream: {{nodes: {n}}}, plugins: {{proxy-mirror: {{host: \"http://{r}\"}}}}}}\n",
            n = nodes(&primary),
            h = hanging.addr,
            r = refusing,
        ),
    );
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    w.wait_ready(p.metrics());
    let _ = mean_latency(&p, "/plain", 10); // warm up the pool
    let plain = mean_latency(&p, "/plain", 40);
    let hang = mean_latency(&p, "/hang", 40);
    let refuse = mean_latency(&p, "/refuse", 40);
    eprintln!("mean latency: plain {plain:?}, hanging mirror {hang:?}, refusing mirror {refuse:?}");
    let budget = plain * 3 + Duration::from_millis(5);
    assert!(hang < budget && refuse < budget, "plain {plain:?}, hanging mirror {hang:?}, refusing mirror {refuse:?}");
    // 40 copies to the hanging target: 4 in flight (its bound), the other 36 dropped.
    assert!(eventually(Duration::from_secs(5), || hanging.seen().len() == 4), "{}", hanging.seen().len());
    let counted = |outcome: &str| metric(&p, &format!("weir_proxy_mirror_requests_total{{outcome=\"{outcome}\"}}"));
    assert!(
        eventually(Duration::from_secs(5), || counted("failed") == Some(40.0)),
        "the refused copies: {:?}",
        counted("failed")
    );
    assert_eq!(counted("dropped"), Some(36.0));
    assert_eq!(counted("started"), Some(44.0));
    assert_eq!(metric(&p, "weir_proxy_mirror_in_flight "), Some(4.0));
    assert!(w.log_text().lines().all(|l| !l.contains("panic")), "{}", w.log_text());
}

/// The Admin API examples of APISIX's pages for the four plugins (docs/en/latest/plugins/*.md),
/// as they are written there, but for their nodes and the mirror target: `H1`, `H2`, `H3`
/// (httpbin.org, mock.api7.ai and postman-echo.com on 443) become local HTTPS servers, `PLAIN` a
/// local HTTP server, `MIRROR` a local mirror target.
const DOC_EXAMPLES: &[(&str, &str)] = &[
    (
        "traffic-split",
        r#"{"uri": "/headers", "id": "traffic-split-route", "plugins": {"traffic-split": {"rules": [{"weighted_upstreams": [{"upstream": {"type": "roundrobin", "scheme": "https", "pass_host": "node", "nodes": {"H1": 1}}, "weight": 3}, {"weight": 2}]}]}}, "upstream": {"type": "roundrobin", "scheme": "https", "pass_host": "node", "nodes": {"H2": 1}}}"#,
    ),
    (
        "traffic-split",
        r#"{"uri": "/headers", "id": "traffic-split-route", "plugins": {"traffic-split": {"rules": [{"match": [{"vars": [["http_release","==","new_release"]]}], "weighted_upstreams": [{"upstream": {"type": "roundrobin", "scheme": "https", "pass_host": "node", "nodes": {"H1": 1}}}]}]}}, "upstream": {"type": "roundrobin", "scheme": "https", "pass_host": "node", "nodes": {"H2": 1}}}"#,
    ),
    (
        "traffic-split",
        r#"{"uri": "/post", "methods": ["POST"], "id": "traffic-split-route", "plugins": {"traffic-split": {"rules": [{"match": [{"vars": [["post_arg_id", "==", "1"]]}], "weighted_upstreams": [{"upstream": {"type": "roundrobin", "scheme": "https", "pass_host": "node", "nodes": {"H1": 1}}}]}]}}, "upstream": {"type": "roundrobin", "scheme": "https", "pass_host": "node", "nodes": {"H2": 1}}}"#,
    ),
    (
        "traffic-split",
        r#"{"uri": "/headers", "id": "traffic-split-route", "plugins": {"traffic-split": {"rules": [{"match": [{"vars": [["arg_name", "==", "jack"], ["http_user-id", ">", "23"], ["http_apisix-key", "~~", "[a-z]+"]]}], "weighted_upstreams": [{"upstream": {"type": "roundrobin", "scheme": "https", "pass_host": "node", "nodes": {"H1": 1}}, "weight": 3}, {"weight": 2}]}]}}, "upstream": {"type": "roundrobin", "scheme": "https", "pass_host": "node", "nodes": {"H2": 1}}}"#,
    ),
    (
        "traffic-split",
        r#"{"uri": "/headers", "id": "traffic-split-route", "plugins": {"traffic-split": {"rules": [{"match": [{"vars": [["arg_name", "==", "jack"], ["http_user-id", ">", "23"], ["http_apisix-key", "~~", "[a-z]+"]]}, {"vars": [["arg_name2", "==", "rose"], ["http_user-id2", "!", ">", "33"], ["http_apisix-key2", "~~", "[a-z]+"]]}], "weighted_upstreams": [{"upstream": {"type": "roundrobin", "scheme": "https", "pass_host": "node", "nodes": {"H1": 1}}, "weight": 3}, {"weight": 2}]}]}}, "upstream": {"type": "roundrobin", "scheme": "https", "pass_host": "node", "nodes": {"H2": 1}}}"#,
    ),
    (
        "traffic-split",
        r#"{"uri": "/headers", "id": "traffic-split-route", "plugins": {"traffic-split": {"rules": [{"match": [{"vars": [["http_x-api-id","==","1"]]}], "weighted_upstreams": [{"upstream": {"type": "roundrobin", "scheme": "https", "pass_host": "node", "nodes": {"H1": 1}}, "weight": 1}]}, {"match": [{"vars": [["http_x-api-id","==","2"]]}], "weighted_upstreams": [{"upstream": {"type": "roundrobin", "scheme": "https", "pass_host": "node", "nodes": {"H2": 1}}, "weight": 1}]}]}}, "upstream": {"type": "roundrobin", "nodes": {"H3": 1}, "scheme": "https", "pass_host": "node"}}"#,
    ),
    (
        "proxy-mirror",
        r#"{"id": "traffic-mirror-route", "uri": "/get", "plugins": {"proxy-mirror": {"host": "http://MIRROR", "sample_ratio": 0.5}}, "upstream": {"nodes": {"PLAIN": 1}, "type": "roundrobin"}}"#,
    ),
    (
        "fault-injection",
        r#"{"id": "fault-injection-route", "uri": "/anything", "plugins": {"fault-injection": {"abort": {"http_status": 404, "body": "APISIX Fault Injection"}}}, "upstream": {"type": "roundrobin", "nodes": {"PLAIN": 1}}}"#,
    ),
    (
        "fault-injection",
        r#"{"id": "fault-injection-route", "uri": "/anything", "plugins": {"fault-injection": {"delay": {"duration": 3}}}, "upstream": {"type": "roundrobin", "nodes": {"PLAIN": 1}}}"#,
    ),
    (
        "fault-injection",
        r#"{"id": "fault-injection-route", "uri": "/anything", "plugins": {"fault-injection": {"abort": {"http_status": 404, "body": "APISIX Fault Injection", "headers": {"X-APISIX-Remote-Addr": "$remote_addr"}, "vars": [[["arg_name","==","john"]]]}}}, "upstream": {"type": "roundrobin", "nodes": {"PLAIN": 1}}}"#,
    ),
    (
        "api-breaker",
        r#"{"id": "1", "plugins": {"api-breaker": {"break_response_code": 502, "unhealthy": {"http_statuses": [500, 503], "failures": 3}, "healthy": {"http_statuses": [200], "successes": 1}}}, "upstream": {"type": "roundrobin", "nodes": {"PLAIN": 1}}, "uri": "/hello"}"#,
    ),
];

/// Local servers standing in for the examples' hosts.
struct ExampleHosts {
    https: [common::tls_upstream::TlsUpstream; 3],
    plain: Upstream,
    mirror: Target,
    /// The HTTPS servers' certificate, trusted by the gateway (SSL_CERT_FILE).
    ca: std::path::PathBuf,
}

impl ExampleHosts {
    fn start() -> ExampleHosts {
        use common::tls_upstream::TlsUpstream;
        let https = [TlsUpstream::start(), TlsUpstream::start(), TlsUpstream::start()];
        // One file per set of servers: tests run in parallel, each gateway trusting its own.
        let ca =
            std::env::temp_dir().join(format!("weir-traffic-ca-{}-{}.pem", std::process::id(), https[0].addr.port()));
        let pem: String = https.iter().map(|u| u.cert_pem.clone()).collect();
        std::fs::write(&ca, pem).expect("write CA file");
        ExampleHosts { https, plain: Upstream::start("plain"), mirror: Target::start(false), ca }
    }

    /// An example with its hosts pointed here.
    fn local(&self, example: &str) -> Value {
        let text = example
            .replace("H1", &self.https[0].addr.to_string())
            .replace("H2", &self.https[1].addr.to_string())
            .replace("H3", &self.https[2].addr.to_string())
            .replace("PLAIN", &self.plain.node())
            .replace("MIRROR", &self.mirror.addr.to_string());
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    fn env(&self) -> [(&str, &str); 1] {
        [("SSL_CERT_FILE", self.ca.to_str().unwrap_or_default())]
    }
}

impl Drop for ExampleHosts {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ca);
    }
}

/// A request the example's page makes, and the status it expects.
fn try_example(p: &Prefix, plugin: &str, route: &Value) {
    let uri = route["uri"].as_str().unwrap_or("/");
    let r = match (plugin, uri) {
        (_, "/post") => {
            request(p.node(), "POST", "/post", &[("content-type", "application/x-www-form-urlencoded")], b"id=1")
        }
        ("traffic-split", _) => request(
            p.node(),
            "GET",
            "/headers?name=jack",
            &[("user-id", "30"), ("apisix-key", "hello"), ("x-api-id", "1"), ("release", "new_release")],
            b"",
        ),
        ("fault-injection", _) => get(p.node(), "/anything?name=john"),
        _ => get(p.node(), uri),
    };
    let expected = if route.to_string().contains("\"abort\"") { 404 } else { 200 };
    assert_eq!(
        r.status,
        expected,
        "{plugin} {route}: {}\n{}",
        r.text(),
        std::fs::read_to_string(p.log_path()).unwrap_or_default()
    );
    if plugin == "traffic-split" {
        assert_eq!(r.json()["tls"], true, "answered over TLS by a local server: {}", r.text());
    }
}

#[test]
fn the_apisix_documentation_examples_load_from_resources_yaml_and_work() {
    let hosts = ExampleHosts::start();
    for (plugin, example) in DOC_EXAMPLES {
        let route = hosts.local(example);
        let p = Prefix::new("", "", &json!({ "routes": [route] }).to_string());
        let w = Weir::spawn_env(&p, &hosts.env());
        w.wait_ready(p.control());
        w.wait_ready(p.node());
        assert_eq!(
            get(p.control(), &format!("/v1/route/{}", route["id"].as_str().unwrap_or("?"))).status,
            200,
            "{}",
            w.log_text()
        );
        try_example(&p, plugin, &route);
        drop(w);
    }
    // proxy-mirror's example copies about half the requests.
    let before = hosts.mirror.seen().len();
    let route = hosts.local(DOC_EXAMPLES[6].1);
    let (p, _w) = start(&json!({ "routes": [route] }).to_string());
    for _ in 0..40 {
        assert_eq!(get(p.node(), "/get").status, 200);
    }
    std::thread::sleep(Duration::from_millis(300));
    let copies = hosts.mirror.seen().len() - before;
    assert!((8..=32).contains(&copies), "{copies} copies of 40 at sample_ratio 0.5");
}

/// etcd for the Admin API, or `None` (skipped) where it is not installed.
struct Etcd {
    child: std::process::Child,
    dir: std::path::PathBuf,
    client: u16,
}

impl Etcd {
    fn start() -> Option<Etcd> {
        use std::process::{Command, Stdio};
        if Command::new("etcd").arg("--version").output().is_err() {
            assert!(
                std::env::var_os("WEIR_REQUIRE_ETCD").is_none(),
                "WEIR_REQUIRE_ETCD is set but etcd is not installed"
            );
            return None;
        }
        let (client, peer) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("weir-traffic-etcd-{}-{client}", std::process::id()));
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        let child = Command::new("etcd")
            .args(["--name", "traffic", "--data-dir"])
            .arg(&dir)
            .args(["--listen-client-urls", &url(client), "--advertise-client-urls", &url(client)])
            .args(["--listen-peer-urls", &url(peer), "--initial-advertise-peer-urls", &url(peer)])
            .args(["--initial-cluster", &format!("traffic={}", url(peer))])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd");
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], client));
        let up = eventually(Duration::from_secs(20), || {
            std::net::TcpStream::connect(addr).is_ok() && get(addr, "/health").text().contains("true")
        });
        assert!(up, "etcd did not come up");
        Some(Etcd { child, dir, client })
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const ADMIN_KEY: &str = "traffic-admin-key";

fn admin(port: u16, method: &str, path: &str, body: &str) -> Response {
    let headers = [("Content-Type", "application/json"), ("X-API-KEY", ADMIN_KEY)];
    request(std::net::SocketAddr::from(([127, 0, 0, 1], port)), method, path, &headers, body.as_bytes())
}

#[test]
fn the_apisix_documentation_examples_load_through_the_admin_api() {
    let Some(etcd) = Etcd::start() else {
        return skip("the_apisix_documentation_examples_load_through_the_admin_api", "etcd is not installed");
    };
    let hosts = ExampleHosts::start();
    let port = free_port();
    let deployment = format!(
        "deployment:\n  config_provider: etcd\n  etcd:\n    host: [\"http://127.0.0.1:{}\"]\n    timeout: 2\n  admin:\n    admin_listen: {{ip: 127.0.0.1, port: {port}}}\n    admin_key:\n      - {{name: ops, key: {ADMIN_KEY}, role: admin}}\n",
        etcd.client
    );
    let p = Prefix::new("", &deployment, "");
    let w = Weir::spawn_env(&p, &hosts.env());
    w.wait_ready(p.control());
    w.wait_ready(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    for (plugin, example) in DOC_EXAMPLES {
        let route = hosts.local(example);
        // As the pages write it: PUT /routes with the id in the body (api-breaker's names it in
        // the path).
        let r = if *plugin == "api-breaker" {
            admin(port, "PUT", "/apisix/admin/routes/1", &route.to_string())
        } else {
            admin(port, "PUT", "/apisix/admin/routes", &route.to_string())
        };
        assert!(matches!(r.status, 200 | 201), "{plugin}: {} {}", r.status, r.text());
        if *plugin == "fault-injection" && route.to_string().contains("delay") {
            continue; // 3 s per request; loading it is the point here
        }
        let served = eventually(Duration::from_secs(5), || {
            let now = get(p.control(), &format!("/v1/route/{}", route["id"].as_str().unwrap_or("?"))).json();
            now["plugins"] == route["plugins"]
        });
        assert!(served, "{plugin}: {}", w.log_text());
        try_example(&p, plugin, &route);
    }

    // traffic-split's references, as APISIX's Admin API checks them: a missing upstream is
    // refused, and an upstream a rule names cannot be deleted.
    let split = |id: &str| {
        json!({"uri": "/ts", "upstream": {"nodes": {hosts.plain.node(): 1}}, "plugins": {"traffic-split": {"rules": [{"weighted_upstreams": [{"upstream_id": id}]}]}}}).to_string()
    };
    let r = admin(port, "PUT", "/apisix/admin/routes/ts", &split("nope"));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("upstream `nope` does not exist"), "{}", r.text());
    let r =
        admin(port, "PUT", "/apisix/admin/upstreams/canary", &json!({"nodes": {hosts.plain.node(): 1}}).to_string());
    assert!(matches!(r.status, 200 | 201), "{}", r.text());
    let r = admin(port, "PUT", "/apisix/admin/routes/ts", &split("canary"));
    assert!(matches!(r.status, 200 | 201), "{}", r.text());
    let r = admin(port, "DELETE", "/apisix/admin/upstreams/canary", "");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("routes/ts") && r.text().contains("canary"), "{}", r.text());
    assert_eq!(admin(port, "DELETE", "/apisix/admin/routes/ts", "").status, 200);
    assert_eq!(admin(port, "DELETE", "/apisix/admin/upstreams/canary", "").status, 200, "no longer named");
}
