//! The data plane against real upstream servers on loopback.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::upstream::Upstream;
use common::*;
use serde_json::json;

fn node_of(p: &Prefix, path: &str) -> String {
    let r = get(p.node(), path);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()["node"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn proxies_with_forwarded_headers_and_without_hop_by_hop() {
    let up = Upstream::start("a");
    let (p, _w) =
        start(&format!("routes:\n  - {{id: 1, uri: /echo, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()));
    let r = request(
        p.node(),
        "GET",
        "/echo?x=1",
        &[("X-Forwarded-For", "10.0.0.1"), ("Connection", "close, X-Secret"), ("X-Secret", "s"), ("X-Keep", "k")],
        b"",
    );
    assert_eq!(r.status, 200);
    let echo = r.json();
    let h = &echo["headers"];
    assert_eq!(echo["path"], "/echo");
    assert_eq!(echo["query"], "x=1");
    assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
    assert_eq!(h["x-real-ip"], "127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-host"], p.node().to_string());
    assert_eq!(h["x-forwarded-port"], p.node_port.to_string());
    assert_eq!(h["x-keep"], "k");
    assert!(h.get("x-secret").is_none(), "header named by Connection must not be forwarded: {h}");
    assert_eq!(h["host"], p.node().to_string(), "pass_host: pass keeps the client's Host");
    // The upstream's hop-by-hop header (named in its Connection header) is not sent back.
    assert!(r.header("x-upstream-hop").is_none(), "{:?}", r.headers);
}

#[test]
fn no_route_is_a_json_404() {
    let (p, _w) = start("routes:\n  - {id: 1, uri: /only}\n");
    let r = get(p.node(), "/else");
    assert_eq!((r.status, r.json()), (404, json!({"error_msg": "404 Route Not Found"})));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let r = get(p.node(), "/only");
    assert_eq!(r.status, 503, "a route without upstream and without a serving plugin");
    assert_eq!(r.json()["error_msg"], "missing upstream configuration in Route or Service");
}

#[test]
fn routing_rules() {
    let (a, b, c, d) =
        (Upstream::start("exact"), Upstream::start("param"), Upstream::start("prefix"), Upstream::start("other"));
    let n = |u: &Upstream| format!("{{nodes: {{\"{}\": 1}}}}", u.node());
    let res = format!(
        "routes:
  - {{id: exact, uri: /a/b, upstream: {ea}}}
  - {{id: param, uri: /a/:x, upstream: {pa}}}
  - {{id: prefix, uri: /a/*, upstream: {pr}}}
  - {{id: post, uri: /m, methods: [POST], upstream: {ea}}}
  - {{id: get, uri: /m, methods: [GET], upstream: {pa}}}
  - {{id: host, uri: /h, hosts: [\"*.example.com\"], upstream: {ea}}}
  - {{id: host2, uri: /h, host: exact.org, upstream: {pa}}}
  - {{id: addr, uri: /ip, remote_addrs: [\"10.0.0.0/8\"], upstream: {ea}}}
  - {{id: addr2, uri: /ip, remote_addrs: [\"127.0.0.0/8\"], upstream: {pa}}}
  - {{id: low, uri: /p/*, upstream: {ea}}}
  - {{id: high, uri: /p/*, priority: 5, upstream: {ot}}}
  - {{id: off, uri: /off, status: 0, upstream: {ea}}}
  - {{id: multi, uris: [/u1, /u2/*], upstream: {ot}}}
",
        ea = n(&a),
        pa = n(&b),
        pr = n(&c),
        ot = n(&d)
    );
    let (p, _w) = start(&res);
    assert_eq!(node_of(&p, "/a/b"), "exact");
    assert_eq!(node_of(&p, "/a/c"), "param");
    assert_eq!(node_of(&p, "/a/c/d"), "prefix");
    let r = request(p.node(), "POST", "/m", &[], b"x");
    assert_eq!(r.json()["node"], "exact");
    assert_eq!(node_of(&p, "/m"), "param");
    assert_eq!(request(p.node(), "PUT", "/m", &[], b"").status, 404);
    assert_eq!(request(p.node(), "GET", "/h", &[("Host", "api.example.com")], b"").json()["node"], "exact");
    assert_eq!(request(p.node(), "GET", "/h", &[("Host", "exact.org:9080")], b"").json()["node"], "param");
    assert_eq!(request(p.node(), "GET", "/h", &[("Host", "example.com")], b"").status, 404);
    assert_eq!(node_of(&p, "/ip"), "param");
    assert_eq!(node_of(&p, "/p/x"), "other");
    assert_eq!(get(p.node(), "/off").status, 404);
    assert_eq!(node_of(&p, "/u1"), "other");
    assert_eq!(node_of(&p, "/u2/z"), "other");
    assert_eq!(get(p.node(), "/u2").status, 404);
}

#[test]
fn services_and_upstream_objects() {
    let (a, b) = (Upstream::start("svc"), Upstream::start("obj"));
    let res = format!(
        "upstreams:\n  - {{id: u1, nodes: {{\"{}\": 1}}}}\nservices:\n  - {{id: s1, upstream: {{nodes: {{\"{}\": 1}}}}}}\nroutes:\n  - {{id: 1, uri: /s, service_id: s1}}\n  - {{id: 2, uri: /o, upstream_id: u1}}\n  - {{id: 3, uri: /so, service_id: s1, upstream_id: u1}}\n",
        b.node(),
        a.node()
    );
    let (p, _w) = start(&res);
    assert_eq!(node_of(&p, "/s"), "svc");
    assert_eq!(node_of(&p, "/o"), "obj");
    assert_eq!(node_of(&p, "/so"), "obj", "the route's own upstream beats the service's");
}

#[test]
fn roundrobin_respects_weights_and_skips_weight_zero() {
    let (a, b, c) = (Upstream::start("a"), Upstream::start("b"), Upstream::start("c"));
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"{}\": 3, \"{}\": 1, \"{}\": 0}}}}}}\n",
        a.node(),
        b.node(),
        c.node()
    ));
    let mut counts: HashMap<String, usize> = HashMap::new();
    for _ in 0..200 {
        *counts.entry(node_of(&p, "/")).or_default() += 1;
    }
    assert_eq!(counts.get("c"), None, "weight 0 must never be picked: {counts:?}");
    let (na, nb) = (counts.get("a").copied().unwrap_or(0), counts.get("b").copied().unwrap_or(0));
    assert!((140..=160).contains(&na) && (40..=60).contains(&nb), "3:1 expected, got {counts:?}");
}

#[test]
fn chash_pins_a_key_to_a_node() {
    let (a, b, c) = (Upstream::start("a"), Upstream::start("b"), Upstream::start("c"));
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{type: chash, hash_on: header, key: x-user, nodes: {{\"{}\": 1, \"{}\": 1, \"{}\": 1}}}}}}\n",
        a.node(),
        b.node(),
        c.node()
    ));
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut nodes = std::collections::HashSet::new();
    for round in 0..3 {
        for user in 0..30 {
            let r = request(p.node(), "GET", "/", &[("X-User", &format!("user-{user}"))], b"");
            let node = r.json()["node"].as_str().unwrap_or_default().to_owned();
            nodes.insert(node.clone());
            if round == 0 {
                seen.insert(user.to_string(), node);
            } else {
                assert_eq!(seen.get(&user.to_string()), Some(&node), "user-{user} moved");
            }
        }
    }
    assert_eq!(nodes.len(), 3, "30 keys should reach all 3 nodes");
}

#[test]
fn least_conn_sends_to_the_idle_node() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{type: least_conn, nodes: {{\"{}\": 1, \"{}\": 1}}}}}}\n",
        a.node(),
        b.node()
    ));
    // One slow request occupies a node; requests meanwhile all go to the other one.
    let node = p.node();
    let slow = std::thread::spawn(move || get(node, "/sleep/1500"));
    std::thread::sleep(Duration::from_millis(300));
    let busy = if a.hits() == 1 { "a" } else { "b" };
    for _ in 0..10 {
        assert_ne!(node_of(&p, "/"), busy);
    }
    assert_eq!(slow.join().map(|r| r.status).unwrap_or(0), 200);
}

#[test]
fn retries_skip_dead_nodes_and_respect_limits() {
    let up = Upstream::start("alive");
    let dead = free_port();
    let (p, w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /r/*, upstream: {{nodes: {{\"127.0.0.1:{dead}\": 1, \"{}\": 1}}}}}}\n  - {{id: 2, uri: /n/*, upstream: {{retries: 0, nodes: [{{host: 127.0.0.1, port: {dead}, weight: 1}}, {{host: 127.0.0.1, port: {}, weight: 1}}]}}}}\n  - {{id: 3, uri: /all/*, upstream: {{nodes: {{\"127.0.0.1:{dead}\": 1, \"127.0.0.1:{}\": 1}}}}}}\n",
        up.node(),
        up.addr.port(),
        free_port()
    ));
    for _ in 0..6 {
        assert_eq!(node_of(&p, "/r/x"), "alive", "a dead node is retried on the next one");
    }
    for _ in 0..4 {
        let r = request(p.node(), "POST", "/r/x", &[], b"small body");
        assert_eq!(
            (r.status, r.json()["body"].as_str()),
            (200, Some("small body")),
            "small bodies are replayed on retry"
        );
    }
    let statuses: Vec<u16> = (0..6).map(|_| get(p.node(), "/n/x").status).collect();
    assert!(statuses.contains(&502) && statuses.contains(&200), "retries: 0 must not retry: {statuses:?}");
    let r = get(p.node(), "/all/x");
    assert_eq!(r.status, 502);
    assert_eq!(r.json()["error_msg"], "502 Bad Gateway: no upstream node could serve the request");
    assert!(w.log_text().contains("connect failed"), "{}", w.log_text());
}

#[test]
fn read_timeout_is_a_504() {
    let up = Upstream::start("slow");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{retries: 0, timeout: {{connect: 1, send: 1, read: 0.5}}, nodes: {{\"{}\": 1}}}}}}\n",
        up.node()
    ));
    let t = std::time::Instant::now();
    let r = get(p.node(), "/sleep/4000");
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["error_msg"], "504 Gateway Timeout: the upstream did not answer in time");
    assert!(t.elapsed() < Duration::from_secs(4));
    assert_eq!(get(p.node(), "/sleep/10").status, 200);
}

#[test]
fn pass_host_modes() {
    let up = Upstream::start("h");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /node, upstream: {{pass_host: node, nodes: {{\"{n}\": 1}}}}}}\n  - {{id: 2, uri: /rw, upstream: {{pass_host: rewrite, upstream_host: api.internal, nodes: {{\"{n}\": 1}}}}}}\n",
        n = up.node()
    ));
    assert_eq!(get(p.node(), "/node").json()["headers"]["host"], up.node());
    assert_eq!(get(p.node(), "/rw").json()["headers"]["host"], "api.internal");
}

#[test]
fn large_bodies_stream_both_ways_with_bounded_memory() {
    let up = Upstream::start("big");
    let (p, w) = start(&format!("routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()));
    assert_eq!(get(p.node(), "/bytes/10").status, 200);
    let before = w.rss();
    const N: u64 = 256 << 20;
    let (status, len) = download_count(p.node(), &format!("/bytes/{N}"));
    assert_eq!((status, len), (200, N));
    let r = upload(p.node(), "/upload", N);
    assert_eq!((r.status, r.text()), (200, N.to_string()));
    let grew = w.rss().saturating_sub(before);
    assert!(grew < 24 << 20, "RSS grew by {} MiB while streaming 2 x 256 MiB", grew >> 20);
}

#[test]
fn request_line_and_header_limits() {
    let up = Upstream::start("x");
    let (p, _w) = start(&format!("routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()));
    let long = format!("/{}", "a".repeat(9000));
    let r = get(p.node(), &long);
    assert_eq!((r.status, r.json()["error_msg"].as_str()), (414, Some("414 Request-URI Too Large")));
    let big = "b".repeat(9000);
    let r = request(p.node(), "GET", "/", &[("X-Big", &big)], b"");
    assert_eq!(r.status, 431);
    let many: Vec<(String, String)> = (0..40).map(|i| (format!("X-H{i}"), "v".repeat(1000))).collect();
    let refs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(request(p.node(), "GET", "/", &refs, b"").status, 431);
    // Garbage is a 400, never a crash.
    let mut s = std::net::TcpStream::connect(p.node()).expect("connect");
    use std::io::{Read, Write};
    s.write_all(b"NOT HTTP\r\n\r\n").expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 400"), "{}", String::from_utf8_lossy(&out));
    assert_eq!(get(p.node(), "/ok").status, 200);
}

#[test]
fn hot_reload_drops_no_requests() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let res = |u: &Upstream| format!("routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", u.node());
    let (p, _w) = start(&res(&a));
    let node = p.node();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let client = std::thread::spawn(move || {
        let mut statuses: HashMap<u16, usize> = HashMap::new();
        while !s2.load(std::sync::atomic::Ordering::SeqCst) {
            *statuses.entry(get(node, "/").status).or_default() += 1;
        }
        statuses
    });
    for i in 0..10 {
        p.write_resources(&res(if i % 2 == 0 { &b } else { &a }));
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let statuses = client.join().unwrap_or_default();
    assert_eq!(statuses.keys().copied().collect::<Vec<_>>(), vec![200], "{statuses:?}");
    assert!(a.hits() > 0 && b.hits() > 0);
}

#[test]
fn https_upstreams_verify_certificates_by_default() {
    let tls = common::tls_upstream::TlsUpstream::start();
    let (p, w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /strict, upstream: {{scheme: https, retries: 0, nodes: {{\"{a}\": 1}}}}}}\n  - {{id: 2, uri: /lax, upstream: {{scheme: https, tls: {{verify: false}}, nodes: {{\"{a}\": 1}}}}}}\n  - {{id: 3, uri: /named, upstream: {{scheme: https, tls: {{verify: false}}, nodes: [{{host: localhost, port: {port}, weight: 1}}]}}}}\n",
        a = tls.addr,
        port = tls.addr.port()
    ));
    let r = get(p.node(), "/strict");
    assert_eq!(r.status, 502, "a self-signed certificate must be refused by default: {}", r.text());
    assert!(w.log_text().contains("Certificate") || w.log_text().contains("certificate"), "{}", w.log_text());
    let r = get(p.node(), "/lax");
    assert_eq!((r.status, r.json()["tls"].as_bool()), (200, Some(true)));
    let r = get(p.node(), "/named");
    assert_eq!(r.json()["sni"], "localhost", "SNI carries the node's host name");
}

#[test]
fn sigterm_lets_in_flight_requests_finish() {
    let up = Upstream::start("slow");
    let (p, w) = start(&format!("routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()));
    let node = p.node();
    let in_flight = std::thread::spawn(move || get(node, "/sleep/1500"));
    std::thread::sleep(Duration::from_millis(300));
    let sent = std::process::Command::new("kill").arg("-TERM").arg(w.pid().to_string()).status();
    assert!(sent.is_ok_and(|s| s.success()), "kill -TERM");
    // While the request is still in flight, a new client is refused at once: the listening
    // socket is closed, not left open with nobody accepting (where a client would hang).
    assert!(
        common::eventually(Duration::from_millis(800), || std::net::TcpStream::connect(node).is_err()),
        "a new client must be refused once the stop began"
    );
    assert!(!in_flight.is_finished(), "checked while the request was still in flight");
    let r = in_flight.join().expect("client thread");
    assert_eq!((r.status, r.text()), (200, "slept on slow".to_owned()), "the in-flight request completes");
    let status = w.terminate();
    assert!(status.success(), "{status:?}");
}

/// Reads one response with a `Content-Length` body from a keep-alive connection: (status,
/// body length).
fn read_one(s: &mut std::net::TcpStream) -> (u16, usize) {
    use std::io::Read;
    let r = read_head_of(s);
    let len: usize = r.header("content-length").and_then(|v| v.parse().ok()).expect("content-length");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).expect("read body");
    (r.status, len)
}

/// A keep-alive connection idle for longer than the park delay (1 s) gives up the server's
/// state and buffers; it must serve the next request as if nothing happened: one request, a
/// pipelined pair, a response slower than the delay (never parked mid-request), and a response
/// the client does not read for longer than the delay (never parked while bytes wait to go).
#[test]
fn idle_keepalive_connections_park_and_keep_serving() {
    use std::io::Write;
    let up = Upstream::start("a");
    let (p, _w) = start(&format!("routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()));
    let mut s = std::net::TcpStream::connect(p.node()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: h\r\n\r\n");
    s.write_all(get("/one").as_bytes()).expect("write");
    assert_eq!(read_one(&mut s).0, 200);
    std::thread::sleep(Duration::from_millis(2500));
    #[cfg(feature = "prometheus")]
    {
        let m = common::get(p.metrics(), "/weir/prometheus/metrics").text();
        assert!(m.contains("\nweir_http_parked_connections 1\n"), "the idle connection is parked: {m}");
    }
    s.write_all(get("/two").as_bytes()).expect("write after idle");
    assert_eq!(read_one(&mut s).0, 200, "a parked connection serves the next request");
    std::thread::sleep(Duration::from_millis(2500));
    s.write_all(format!("{}{}", get("/three"), get("/four")).as_bytes()).expect("write pipelined");
    assert_eq!(read_one(&mut s).0, 200);
    assert_eq!(read_one(&mut s).0, 200, "both pipelined requests after a park are served");
    s.write_all(get("/sleep/2500").as_bytes()).expect("write slow");
    assert_eq!(read_one(&mut s), (200, "slept on a".len()), "a slow response is never cut by parking");
    // 8 MiB does not fit in the socket buffers: the gateway is blocked writing while the client
    // sleeps.
    s.write_all(get("/bytes/8388608").as_bytes()).expect("write download");
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(read_one(&mut s), (200, 8 << 20), "an unread response is never cut by parking");
    s.write_all(get("/five").as_bytes()).expect("write last");
    assert_eq!(read_one(&mut s).0, 200);
    assert_eq!(up.hits(), 7, "every request reached the upstream once");
    #[cfg(feature = "prometheus")]
    {
        let m = common::get(p.metrics(), "/weir/prometheus/metrics").text();
        assert!(m.contains("\nweir_http_parked_connections 0\n"), "a busy connection is not parked: {m}");
    }
}

/// Parked keep-alive connections live outside any task, in the worker's readiness set: a client
/// that sends again is served (also when its head arrives in pieces), one that leaves is
/// forgotten (the gauges come back down: nothing leaks), and a stop closes the rest at once
/// instead of waiting out the shutdown timeout for them.
#[test]
#[cfg(feature = "prometheus")]
fn parked_connections_wake_leave_and_close_on_stop() {
    use std::io::{Read, Write};
    let up = Upstream::start("a");
    let (p, w) = start(&format!("routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()));
    let gauge = |name: &str| -> Option<u64> {
        let m = common::get(p.metrics(), "/weir/prometheus/metrics").text();
        m.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
    };
    let mut clients: Vec<std::net::TcpStream> = (0..20)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(p.node()).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
            assert_eq!(keep_alive_get(&mut s, "/first"), Some(200));
            s
        })
        .collect();
    let parked = "weir_http_parked_connections ";
    let sockets = "weir_http_parked_sockets ";
    let active = "weir_nginx_http_current_connections{state=\"active\"} ";
    assert!(common::eventually(Duration::from_secs(5), || gauge(parked) == Some(20)), "{:?}", gauge(parked));
    assert_eq!(gauge(sockets), Some(20), "parked as bare sockets, outside any task");
    // Ten leave while parked.
    let stay = clients.split_off(10);
    drop(clients);
    assert!(
        common::eventually(Duration::from_secs(5), || gauge(parked) == Some(10) && gauge(active) == Some(10)),
        "parked {:?}, active {:?}",
        gauge(parked),
        gauge(active)
    );
    // The others send again: half of them a head in two pieces, the rest after the first piece.
    let mut stay = stay;
    for (i, s) in stay.iter_mut().enumerate() {
        if i % 2 == 0 {
            s.write_all(b"GET /again HTTP/1.1\r\nHo").expect("write");
            std::thread::sleep(Duration::from_millis(50));
            s.write_all(b"st: h\r\n\r\n").expect("write");
            assert_eq!(read_one_response(s), Ok(200), "client {i}, head in pieces");
        } else {
            assert_eq!(keep_alive_get(s, "/again"), Some(200), "client {i}");
        }
    }
    assert_eq!(up.hits(), 30);
    // Parked again, then a stop: they are closed at once (the shutdown timeout is 30 s).
    assert!(common::eventually(Duration::from_secs(5), || gauge(parked) == Some(10)), "{:?}", gauge(parked));
    assert_eq!(gauge(sockets), Some(10));
    let asked = std::time::Instant::now();
    let status = w.terminate();
    assert!(status.success(), "{status:?}");
    assert!(asked.elapsed() < Duration::from_secs(5), "the stop waited {:?} for parked connections", asked.elapsed());
    for s in &mut stay {
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty(), "a parked connection closes without a word: {rest:?}");
    }
}

/// One request on an open keep-alive connection: its status, `None` when the connection ended.
fn keep_alive_get(s: &mut std::net::TcpStream, path: &str) -> Option<u16> {
    use std::io::Write;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: fd.test\r\n\r\n").as_bytes()).ok()?;
    read_one_response(s).ok()
}

#[test]
fn out_of_descriptors_closes_idle_keep_alive_clients_to_serve_new_ones() {
    let up = Upstream::start("a");
    let p = Prefix::new(
        "",
        "",
        &format!("routes:\n  - {{id: 1, uri: /x, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()),
    );
    // The gateway at a 256-descriptor limit, as `ulimit -n 256` sets it.
    let log = p.log_path();
    let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log");
    let child = std::process::Command::new("sh")
        .args(["-c", "ulimit -n 256 && exec \"$0\" -p \"$1\"", BIN])
        .arg(&p.dir)
        .env("RUST_LOG", "info")
        .stdout(file.try_clone().expect("log"))
        .stderr(file)
        .spawn()
        .expect("spawn weir");
    let w = Weir { child, log };
    w.wait_ready(p.control());
    w.wait_ready(p.node());
    // Idle keep-alive clients until the gateway runs out: each has had one answer.
    let mut idle = Vec::new();
    while idle.len() < 300 {
        let Ok(mut s) = std::net::TcpStream::connect(p.node()) else { break };
        s.set_read_timeout(Some(Duration::from_millis(500))).expect("timeout");
        match keep_alive_get(&mut s, "/x") {
            Some(200) => idle.push(s),
            _ => break,
        }
    }
    assert!(idle.len() > 150, "only {} idle clients were served; log:\n{}", idle.len(), w.log_text());
    // Parked after a second of idleness: what the gateway may close to make room.
    std::thread::sleep(Duration::from_millis(1500));
    for i in 0..40 {
        let mut s = std::net::TcpStream::connect(p.node()).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        assert_eq!(keep_alive_get(&mut s, "/x"), Some(200), "new client {i} was not served; log:\n{}", w.log_text());
    }
    let text = w.log_text();
    assert_eq!(text.matches("closing idle keep-alive connections").count(), 1, "said once:\n{text}");
    // Some of the oldest idle clients were closed, and the newest are still served.
    let closed = idle.iter_mut().take(64).map(|s| keep_alive_get(s, "/x")).filter(Option::is_none).count();
    assert!(closed > 0, "no idle client was closed");
}

/// Reads one response head from `s` (byte by byte: what follows stays in the socket).
fn read_head_of(s: &mut std::net::TcpStream) -> Response {
    use std::io::Read;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).expect("read head"), 1, "connection closed after {head:?}");
        head.push(byte[0]);
    }
    parse_response(&head)
}

/// Reads what is left until the gateway closes the connection.
fn read_to_close(s: &mut std::net::TcpStream) -> Vec<u8> {
    use std::io::Read;
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    rest
}

/// The HTTP/1.1 server connection (RFC 9112) as clients meet it: `100 Continue`, pipelining in
/// order, HTTP/1.0 keep-alive, HEAD, and a request body left unread by a plugin's answer.
#[test]
fn the_http11_server_keeps_rfc_9112() {
    use std::io::{Read, Write};
    let up = Upstream::start("a");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"{n}\": 1}}}}}}\n  - {{id: 2, uri: /locked/*, plugins: {{key-auth: {{}}}}, upstream: {{nodes: {{\"{n}\": 1}}}}}}\n",
        n = up.node()
    ));
    let connect = || {
        let s = std::net::TcpStream::connect(p.node()).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        s
    };

    // Expect: 100-continue: the interim answer comes before the body is sent.
    let mut s = connect();
    s.write_all(b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n").expect("write");
    let interim = read_head_of(&mut s);
    assert_eq!(interim.status, 100);
    s.write_all(b"hello").expect("write body");
    let r = read_head_of(&mut s);
    assert_eq!(r.status, 200);
    let mut body = vec![0u8; r.header("content-length").and_then(|v| v.parse().ok()).expect("length")];
    s.read_exact(&mut body).expect("body");
    let echo: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(echo["body"], "hello");
    assert!(r.header("date").is_some(), "every answer is dated: {:?}", r.headers);

    // Refused before the body was asked for: no 100, and the connection closes (the client
    // would otherwise send a body the server reads as its next request).
    let mut s = connect();
    // (A body this large is not read before the plugins run.)
    s.write_all(b"POST /locked/x HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n")
        .expect("write");
    let r = read_head_of(&mut s);
    assert_eq!(r.status, 401);
    assert_eq!(r.header("connection"), Some("close"));

    // A small body left unread by a plugin's answer is dropped; the connection goes on.
    let mut s = connect();
    let mut unread = b"POST /locked/x HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n".to_vec();
    unread.extend_from_slice(&[b'x'; 100000]);
    unread.extend_from_slice(b"GET /after HTTP/1.1\r\nHost: h\r\n\r\n");
    s.write_all(&unread).expect("write");
    assert_eq!(read_one(&mut s).0, 401);
    assert_eq!(read_one(&mut s).0, 200, "the request after an unread body is served");

    // Pipelined requests are answered in order.
    let mut s = connect();
    let three: String = ["/p1", "/p2", "/p3"].iter().map(|t| format!("GET {t} HTTP/1.1\r\nHost: h\r\n\r\n")).collect();
    s.write_all(three.as_bytes()).expect("write");
    for want in ["/p1", "/p2", "/p3"] {
        let r = read_head_of(&mut s);
        let mut body = vec![0u8; r.header("content-length").and_then(|v| v.parse().ok()).expect("length")];
        s.read_exact(&mut body).expect("body");
        let echo: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(echo["path"], want);
    }

    // HTTP/1.0: keep-alive only when asked, and said so.
    let mut s = connect();
    s.write_all(b"GET /ten HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").expect("write");
    let (status, _) = read_one(&mut s);
    assert_eq!(status, 200);
    s.write_all(b"GET /ten HTTP/1.0\r\n\r\n").expect("write again");
    let rest = read_to_close(&mut s);
    let r = parse_response(&rest);
    assert_eq!(r.status, 200);
    assert!(r.text().contains("\"path\":\"/ten\""), "{}", r.text());

    // HEAD: the length a GET would have, no body, and the connection goes on.
    let mut s = connect();
    s.write_all(b"HEAD /h HTTP/1.1\r\nHost: h\r\n\r\nGET /h HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        .expect("write");
    let head = read_head_of(&mut s);
    assert_eq!(head.status, 200);
    let rest = read_to_close(&mut s);
    let get = parse_response(&rest);
    assert_eq!(get.status, 200, "the GET after a HEAD starts right after its head");
    assert!(
        head.header("content-length").and_then(|v| v.parse::<u64>().ok()).is_some_and(|n| n > 0),
        "{:?}",
        head.headers
    );
    assert_eq!(up.hits(), 9);
}
