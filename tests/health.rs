//! Upstream health checks against real upstreams on loopback: state machine, active http / https /
//! tcp probes, passive reports, node selection, reload lifecycles, the control endpoints.

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::upstream::Upstream;
use common::*;
use serde_json::{json, Value};

fn entry(p: &Prefix, kind: &str, id: &str) -> Value {
    get(p.control(), &format!("/v1/healthcheck/{kind}/{id}")).json()
}

/// (status, counters) of the first node of an entry.
fn state(e: &Value) -> (String, [u64; 4]) {
    let n = &e["nodes"][0];
    let c = &n["counter"];
    let v = |k: &str| c[k].as_u64().unwrap_or(99);
    (
        n["status"].as_str().unwrap_or("-").to_owned(),
        [v("success"), v("http_failure"), v("tcp_failure"), v("timeout_failure")],
    )
}

fn wait_for(p: &Prefix, kind: &str, id: &str, secs: u64, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let e = entry(p, kind, id);
        if pred(&e) {
            return e;
        }
        assert!(Instant::now() < deadline, "condition not reached; last entry: {e}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn state_machine_through_every_state_with_active_tcp_probes() {
    // successes 2, tcp_failures 2, interval 1 s: the reference's example, driven by a real port.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{retries: 0, timeout: {{connect: 1, send: 1, read: 1}}, nodes: {{\"127.0.0.1:{port}\": 1}}, checks: {{active: {{type: tcp, healthy: {{interval: 1, successes: 2}}, unhealthy: {{interval: 1, tcp_failures: 2}}}}}}}}}}\n"
    ));
    let _ = get(p.node(), "/"); // first request creates the checker
    let e = entry(&p, "routes", "1");
    assert_eq!(e["name"], "/weir/routes/1");
    assert_eq!(e["type"], "tcp");
    assert_eq!(state(&e), ("healthy".into(), [0, 0, 0, 0]));
    drop(listener);
    let mut seen = vec![state(&e)];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut relistened: Option<TcpListener> = None;
    while Instant::now() < deadline {
        let s = state(&entry(&p, "routes", "1"));
        if seen.last() != Some(&s) {
            seen.push(s.clone());
        }
        if s.0 == "unhealthy" && relistened.is_none() {
            relistened = Some(TcpListener::bind(("127.0.0.1", port)).expect("rebind"));
        }
        if relistened.is_some() && s.0 == "healthy" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let expected: Vec<(String, [u64; 4])> = vec![
        ("healthy".into(), [0, 0, 0, 0]),
        ("mostly_healthy".into(), [0, 0, 1, 0]),
        ("unhealthy".into(), [0, 0, 2, 0]),
        ("mostly_unhealthy".into(), [1, 0, 0, 0]),
        ("healthy".into(), [2, 0, 0, 0]),
    ];
    assert_eq!(seen, expected);
    let e = entry(&p, "routes", "1");
    assert!(e["nodes"][0]["changed_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{e}");
    assert!(e["nodes"][0]["last_failure"].as_str().is_some_and(|r| r.contains("tcp failure")), "{e}");
}

#[test]
fn transitions_are_logged_once_each() {
    let (p, w) = start(
        "routes:\n  - {id: 1, uri: /*, upstream: {nodes: {\"127.0.0.2:1988\": 1}, checks: {active: {type: tcp, timeout: 0.5}}}}\n",
    );
    let _ = get(p.node(), "/");
    wait_for(&p, "routes", "1", 10, |e| e["nodes"][0]["status"] == "unhealthy");
    std::thread::sleep(Duration::from_millis(1500));
    let log = w.log_text();
    assert_eq!(log.matches("target 127.0.0.2:1988 unhealthy: tcp failure 2/2").count(), 1, "{log}");
    assert_eq!(log.matches("target 127.0.0.2:1988 mostly_healthy: tcp failure 1/2").count(), 1, "{log}");
}

#[test]
fn active_http_probes_judge_statuses() {
    let up = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: ok, uri: /ok, upstream: {{nodes: {{\"{n}\": 1}}, checks: {{active: {{http_path: /status/200, req_headers: [\"X-Probe: 1\"], healthy: {{interval: 1}}}}}}}}}}\n  - {{id: bad, uri: /bad, upstream: {{nodes: {{\"{n}\": 1}}, checks: {{active: {{http_path: /status/500, host: probe.local, unhealthy: {{interval: 1, http_failures: 2}}}}}}}}}}\n",
        n = up.node()
    ));
    let _ = get(p.node(), "/ok");
    let _ = get(p.node(), "/bad");
    let e = wait_for(&p, "routes", "bad", 10, |e| e["nodes"][0]["status"] == "unhealthy");
    assert_eq!(state(&e), ("unhealthy".into(), [0, 2, 0, 0]));
    assert_eq!(e["nodes"][0]["hostname"], "probe.local");
    assert_eq!(e["nodes"][0]["last_failure"], "http failure: status 500");
    let e = entry(&p, "routes", "ok");
    assert_eq!(e["nodes"][0]["status"], "healthy");
    assert_eq!(e["type"], "http");
}

#[test]
fn active_https_probes_verify_or_not() {
    let tls = common::tls_upstream::TlsUpstream::start();
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: lax, uri: /lax, upstream: {{scheme: https, tls: {{verify: false}}, nodes: {{\"{a}\": 1}}, checks: {{active: {{type: https, https_verify_certificate: false, healthy: {{successes: 1}}}}}}}}}}\n  - {{id: strict, uri: /strict, upstream: {{scheme: https, tls: {{verify: false}}, nodes: {{\"{a}\": 1}}, checks: {{active: {{type: https}}}}}}}}\n",
        a = tls.addr
    ));
    assert_eq!(get(p.node(), "/lax").status, 200);
    assert_eq!(get(p.node(), "/strict").status, 200);
    let e = wait_for(&p, "routes", "strict", 10, |e| e["nodes"][0]["status"] == "unhealthy");
    assert!(e["nodes"][0]["last_failure"].as_str().is_some_and(|r| r.contains("tls")), "{e}");
    assert_eq!(e["type"], "https");
    // The lax checker sees successes: stays healthy with nothing but successes counted.
    std::thread::sleep(Duration::from_millis(1500));
    let e = entry(&p, "routes", "lax");
    assert_eq!(e["nodes"][0]["status"], "healthy");
    assert_eq!(e["nodes"][0]["counter"]["tcp_failure"], 0);
}

#[test]
fn passive_500s_make_a_node_unhealthy_and_traffic_avoids_it() {
    let (bad, good) = (Upstream::start("bad"), Upstream::start("good"));
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"{b}\": 1, \"{g}\": 1}}, checks: {{active: {{type: tcp, healthy: {{interval: 60}}, unhealthy: {{interval: 60}}}}, passive: {{unhealthy: {{http_failures: 2}}}}}}}}}}\n",
        b = bad.node(),
        g = good.node()
    ));
    // Both nodes answer /status/500 with 500; round robin sends two to each.
    for _ in 0..4 {
        assert_eq!(get(p.node(), "/status/500").status, 500);
    }
    let e = entry(&p, "routes", "1");
    assert!(e["nodes"].as_array().is_some_and(|n| n.iter().all(|n| n["status"] == "unhealthy")), "{e}");
    assert_eq!(e["nodes"][0]["counter"]["http_failure"], 2);
    // All down: traffic still goes to all nodes (fallback), logged once.
    let before = (bad.hits(), good.hits());
    for _ in 0..4 {
        assert_eq!(get(p.node(), "/").status, 200);
    }
    assert!(bad.hits() > before.0 && good.hits() > before.1, "fallback uses all nodes");
}

#[test]
fn traffic_avoids_unhealthy_nodes() {
    let good = Upstream::start("good");
    let dead = free_port();
    let (p, w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{retries: 0, nodes: {{\"127.0.0.1:{dead}\": 1, \"{g}\": 1}}, checks: {{active: {{type: tcp, unhealthy: {{interval: 1}}}}}}}}}}\n",
        g = good.node()
    ));
    let _ = get(p.node(), "/");
    wait_for(&p, "routes", "1", 10, |e| {
        e["nodes"].as_array().is_some_and(|n| n.iter().any(|n| n["status"] == "unhealthy"))
    });
    for _ in 0..20 {
        assert_eq!(get(p.node(), "/").json()["node"], "good", "the unhealthy node is never picked (retries: 0)");
    }
    assert!(!w.log_text().contains("no node is healthy"));
}

#[test]
fn all_nodes_down_falls_back_and_logs_once() {
    let (p, w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"127.0.0.1:{}\": 1, \"127.0.0.1:{}\": 1}}, checks: {{active: {{type: tcp, unhealthy: {{interval: 1}}}}}}}}}}\n",
        free_port(),
        free_port()
    ));
    let _ = get(p.node(), "/");
    wait_for(&p, "routes", "1", 10, |e| {
        e["nodes"].as_array().is_some_and(|n| n.iter().all(|n| n["status"] == "unhealthy"))
    });
    for _ in 0..5 {
        assert_eq!(get(p.node(), "/").status, 502, "still tried (fallback), still down");
    }
    assert_eq!(w.log_text().matches("no node is healthy; using all nodes").count(), 1, "{}", w.log_text());
}

#[test]
fn entries_appear_after_the_first_request_only() {
    let up = Upstream::start("u");
    let (p, _w) = start(&format!(
        "upstreams:\n  - {{id: 7, nodes: {{\"{n}\": 1}}, checks: {{active: {{type: tcp}}}}}}\nservices:\n  - {{id: s, upstream: {{nodes: {{\"{n}\": 1}}, checks: {{active: {{type: tcp}}}}}}}}\nroutes:\n  - {{id: 1, uri: /u, upstream_id: 7}}\n  - {{id: 2, uri: /s, service_id: s}}\n  - {{id: 3, uri: /plain, upstream: {{nodes: {{\"{n}\": 1}}}}}}\n",
        n = up.node()
    ));
    assert_eq!(get(p.control(), "/v1/healthcheck").json(), json!([]));
    let r = get(p.control(), "/v1/healthcheck/upstreams/7");
    assert_eq!((r.status, r.json()), (404, json!({"error_msg": "no checker for upstreams[7]"})));
    assert_eq!(get(p.node(), "/u").status, 200);
    assert_eq!(get(p.node(), "/s").status, 200);
    assert_eq!(get(p.node(), "/plain").status, 200);
    let list = get(p.control(), "/v1/healthcheck").json();
    let names: Vec<&str> =
        list.as_array().map(|a| a.iter().filter_map(|e| e["name"].as_str()).collect()).unwrap_or_default();
    assert_eq!(names, vec!["/weir/services/s", "/weir/upstreams/7"]);
    let e = entry(&p, "upstreams", "7");
    assert_eq!(e["nodes"][0]["ip"], "127.0.0.1");
    assert_eq!(e["nodes"][0]["port"], up.addr.port());
    assert_eq!(e["nodes"][0]["hostname"], "127.0.0.1");
    let r = get(p.control(), "/v1/healthcheck/routes/3");
    assert_eq!((r.status, r.json()), (404, json!({"error_msg": "no checker for routes[3]"})));
    // Asking for HTML gives the list page with that one entry; errors stay JSON.
    let html = [("Accept", "text/html,application/xhtml+xml;q=0.9")];
    let r = request(p.control(), "GET", "/v1/healthcheck/upstreams/7", &html, b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let page = r.text();
    assert!(page.contains("/weir/upstreams/7"), "{page}");
    assert!(!page.contains("/weir/services/s"), "only the asked entry: {page}");
    let r = request(p.control(), "GET", "/v1/healthcheck/routes/3", &html, b"");
    assert_eq!((r.status, r.json()), (404, json!({"error_msg": "no checker for routes[3]"})));
}

#[test]
fn probe_port_override_merges_nodes_into_one_target() {
    let probe = TcpListener::bind("127.0.0.1:0").expect("bind");
    let pp = probe.local_addr().expect("addr").port();
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"127.0.0.1:{}\": 1, \"127.0.0.1:{}\": 1}}, checks: {{active: {{type: tcp, port: {pp}}}}}}}}}\n",
        free_port(),
        free_port()
    ));
    let _ = get(p.node(), "/");
    let e = entry(&p, "routes", "1");
    assert_eq!(e["nodes"].as_array().map(Vec::len), Some(1), "{e}");
    assert_eq!(e["nodes"][0]["port"], pp);
}

#[test]
fn reload_lifecycles() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let res = |nodes: &str, checks: &str| {
        format!("routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{{nodes}}}{checks}}}}}\n")
    };
    let both = format!("\"{}\": 1, \"{}\": 1", a.node(), b.node());
    let only_a = format!("\"{}\": 1", a.node());
    let tcp = ", checks: {active: {type: tcp, healthy: {interval: 1}}}";
    let (p, w) = start(&res(&both, tcp));
    let _ = get(p.node(), "/");
    assert_eq!(entry(&p, "routes", "1")["nodes"].as_array().map(Vec::len), Some(2));
    std::thread::sleep(Duration::from_millis(1200));
    let probes_a = a.hits();

    // Node removed: gone from the report at once; survivors keep their state.
    p.write_resources(&res(&only_a, tcp));
    wait_for(&p, "routes", "1", 3, |e| e["nodes"].as_array().map(Vec::len) == Some(1));
    assert_eq!(entry(&p, "routes", "1")["nodes"][0]["port"], a.addr.port());

    // Checks changed: thresholds rebuilt (http probes now), still reported.
    p.write_resources(&res(
        &only_a,
        ", checks: {active: {type: http, http_path: /status/500, unhealthy: {interval: 1, http_failures: 1}}}",
    ));
    let e = wait_for(&p, "routes", "1", 5, |e| e["type"] == "http" && e["nodes"][0]["status"] == "unhealthy");
    assert_eq!(e["nodes"][0]["counter"]["http_failure"], 1);
    assert!(w.log_text().contains("checks changed, thresholds rebuilt"));

    // Checks removed: the checker stops, its entry is gone, no more probes reach the upstream.
    p.write_resources(&res(&only_a, ""));
    assert!(eventually(Duration::from_secs(3), || get(p.control(), "/v1/healthcheck/routes/1").status == 404));
    assert_eq!(get(p.control(), "/v1/healthcheck").json(), json!([]));
    assert!(w.log_text().contains("health checker /weir/routes/1 stopped"));
    std::thread::sleep(Duration::from_millis(300));
    let settled = a.hits();
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(a.hits(), settled, "probes kept running after the checker stopped (leaked tasks)");
    assert!(settled > probes_a, "probes did run before");
}

#[test]
fn health_page_renders_in_a_real_browser() {
    // CI sets WEIR_REQUIRE_CHROMIUM so that this test can never be skipped there.
    let Some(chromium) = common::chromium::find("health_page_renders_in_a_real_browser") else { return };
    let up = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: ok, uri: /ok, upstream: {{nodes: {{\"{}\": 1}}, checks: {{active: {{type: tcp, host: \"<b>x</b>\"}}}}}}}}\n  - {{id: down, uri: /down, upstream: {{nodes: {{\"127.0.0.1:{}\": 1}}, checks: {{active: {{type: tcp}}}}}}}}\n",
        up.node(),
        free_port()
    ));
    let _ = get(p.node(), "/ok");
    let _ = get(p.node(), "/down");
    wait_for(&p, "routes", "down", 10, |e| e["nodes"][0]["status"] == "unhealthy");
    let out_dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let shot = out_dir.join("healthcheck.png");
    let profile = p.dir.join("chromium-profile");
    let url = format!("http://{}/v1/healthcheck", p.control());
    let common_args = common::chromium::ARGS;
    let dom = std::process::Command::new(chromium)
        .args(common_args)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert!(dom.contains("<table id=\"healthcheck\">"), "{dom}");
    assert!(dom.contains("<tr class=\"unhealthy\">"), "the unhealthy row is highlighted: {dom}");
    assert!(dom.contains("(&lt;b&gt;x&lt;/b&gt;)"), "values are escaped: {dom}");
    assert!(!dom.contains("<b>x</b>"));
    let status = std::process::Command::new(chromium)
        .args(common_args)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1200,400")
        .arg(&url)
        .output()
        .expect("run chromium");
    assert!(shot.exists(), "no screenshot: {}", String::from_utf8_lossy(&status.stderr));
    println!("screenshot: {}", shot.display());
}
