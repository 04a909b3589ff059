//! The request path against hostile input: path normalization in front of key-auth, nginx's
//! timeout semantics, retries that never duplicate a write, malformed and smuggled requests,
//! global rules on unmatched requests. Real binary, real sockets, real upstreams.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::upstream::Upstream;
use common::*;
use serde_json::json;

/// Writes `bytes` on a fresh connection and reads until the gateway closes it (or 10 s pass).
fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A misbehaving upstream that counts the requests whose head it received.
struct Hole {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
}

#[derive(Clone, Copy)]
enum Mode {
    /// Reads the request, then closes without answering (a node that crashed mid-request).
    CloseAfterRequest,
    /// Reads the request and never answers.
    Silent,
    /// Reads the request head, then stops reading.
    StopReading,
    /// Answers the head and 10 of 100 body bytes, then stalls.
    StallBody,
}

/// Reads one request head (and a Content-Length body unless `body` is false).
fn read_request(s: &mut TcpStream, body: bool) -> bool {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return false,
        }
    }
    if body {
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let len: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut rest = vec![0u8; len];
        if s.read_exact(&mut rest).is_err() {
            return false;
        }
    }
    true
}

impl Hole {
    fn start(mode: Mode) -> Hole {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut s) = conn else { return };
                let h = h.clone();
                std::thread::spawn(move || {
                    let whole = !matches!(mode, Mode::StopReading);
                    if !read_request(&mut s, whole) {
                        return;
                    }
                    h.fetch_add(1, Ordering::SeqCst);
                    match mode {
                        Mode::CloseAfterRequest => {}
                        Mode::Silent | Mode::StopReading => std::thread::sleep(Duration::from_secs(30)),
                        Mode::StallBody => {
                            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789");
                            std::thread::sleep(Duration::from_secs(30));
                        }
                    }
                });
            }
        });
        Hole { addr, hits }
    }
    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Every way a lenient upstream might read `path`: decoded once (with `%2F` and `\` as
/// separators), with servlet `;` parameters cut, dot segments resolved, slashes merged.
fn lenient_views(path: &str) -> Vec<String> {
    fn decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' && i + 2 < b.len() {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                if let Ok(v) = u8::from_str_radix(hex, 16) {
                    out.push(v);
                    i += 3;
                    continue;
                }
            }
            out.push(b[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).replace('\\', "/")
    }
    fn resolve(p: &str, cut_params: bool) -> String {
        let mut stack: Vec<&str> = Vec::new();
        for seg in p.split('/') {
            let seg = if cut_params { seg.split(';').next().unwrap_or("") } else { seg };
            match seg {
                "" | "." => {}
                ".." => {
                    stack.pop();
                }
                s => stack.push(s),
            }
        }
        format!("/{}", stack.join("/"))
    }
    let once = decode(path);
    vec![resolve(path, false), resolve(path, true), resolve(&once, false), resolve(&once, true)]
}

#[test]
fn hostile_paths_never_reach_a_protected_route_without_a_key() {
    let up = Upstream::start("u");
    let (p, w) = start(&format!(
        "consumers:\n  - {{username: jack, plugins: {{key-auth: {{key: jack-key}}}}}}\nroutes:\n  - {{id: api, uri: /api/*, upstream: {{nodes: {{\"{n}\": 1}}}}, plugins: {{key-auth: {{}}}}}}\n  - {{id: pub, uri: /pub/*, upstream: {{nodes: {{\"{n}\": 1}}}}}}\n",
        n = up.node()
    ));
    let long = format!("/pub/{}/../../api/x", "a/".repeat(5000));
    // (request target, expected status, path the upstream must see when proxied)
    let table: Vec<(&str, u16, Option<&str>)> = vec![
        ("/api/x", 401, None),
        ("/pub/../api/x", 401, None),
        ("/%61pi/x", 401, None),
        ("/%61%70%69/x", 401, None),
        ("/pub/%2e%2e/api/x", 401, None),
        ("/pub/.%2E/api/x", 401, None),
        ("/pub/%2e/../api/x", 401, None),
        ("//api//x", 401, None),
        ("/pub;x=1/../api/x", 401, None),
        ("http://evil.example/api/x", 401, None),
        // Decoded once only: the upstream gets %25 back and decodes to a literal %2e%2e.
        ("/pub/%252e%252e/api/x", 200, Some("/pub/%252e%252e/api/x")),
        ("/pub/%%32%65%%32%65/api/x", 400, None),
        ("/pub/..;/api/x", 400, None),
        ("/pub/%2e%2e;/api/x", 400, None),
        ("/pub/..%2Fapi/x", 400, None),
        ("/pub/%2e%2e%2fapi/x", 400, None),
        ("/pub/..%5Capi/x", 400, None),
        ("/pub/%5c..%5capi/x", 400, None),
        ("/pub/%00/../api/x", 400, None),
        ("/pub/x%0d%0aX-Injected:%201", 400, None),
        ("/pub/..%c0%af..%c0%afapi/x", 400, None),
        ("/pub/x/../../../api/x", 400, None),
        ("/%2e%2e/api/x", 400, None),
        ("/api%2Fx", 404, None),
        ("/API/x", 404, None),
        ("/pub/a/./b/../c", 200, Some("/pub/a/c")),
        ("/pub/%7Euser/%41", 200, Some("/pub/~user/A")),
        ("/pub/group%2fname", 200, Some("/pub/group%2Fname")),
        ("/pub/x%3B..%3B/api", 200, Some("/pub/x%3B..%3B/api")),
        (long.as_str(), 414, None),
    ];
    let mut failures = Vec::new();
    for (target, want, seen) in &table {
        let r = get(p.node(), target);
        if r.status != *want {
            failures.push(format!("{target}: status {} (want {want}): {}", r.status, r.text()));
            continue;
        }
        if r.status == 200 {
            let upstream_path = r.json()["path"].as_str().unwrap_or_default().to_owned();
            if let Some(seen) = seen {
                if upstream_path != *seen {
                    failures.push(format!("{target}: upstream saw {upstream_path}, want {seen}"));
                }
            }
            for view in lenient_views(&upstream_path) {
                if view.starts_with("/api") {
                    failures.push(format!("{target}: forwarded {upstream_path}, which an upstream may read as {view}"));
                }
            }
        } else if r.status >= 400 {
            let body = r.json();
            if !body["error_msg"].is_string() && !body["message"].is_string() {
                failures.push(format!("{target}: {} without a JSON reason: {}", r.status, r.text()));
            }
        }
    }
    // Raw backslashes cannot be sent through a well-formed URI, so they go byte for byte.
    for target in ["/pub\\..\\api/x", "/pub/..\\api/x"] {
        let out = raw(p.node(), format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes());
        if !out.starts_with("HTTP/1.1 400") {
            failures.push(format!("{target}: {}", out.lines().next().unwrap_or("")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The same normalization with a key: what the gateway authorized is what the upstream sees.
    let r = request(p.node(), "GET", "/pub/../%61pi/./x", &[("apikey", "jack-key")], b"");
    assert_eq!((r.status, r.json()["path"].as_str()), (200, Some("/api/x")));
    assert!(!w.log_text().contains("ERROR"), "client errors must not be logged at error level:\n{}", w.log_text());
}

#[test]
fn plugins_see_the_normalized_path() {
    let up = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /v1/*, upstream: {{nodes: {{\"{n}\": 1}}}}, plugins: {{proxy-rewrite: {{regex_uri: [\"^/v1/(.*)\", \"/v2/$1\"]}}}}}}\n  - {{id: 2, uri: /w/*, upstream: {{nodes: {{\"{n}\": 1}}}}, plugins: {{proxy-rewrite: {{headers: {{set: {{x-uri: $uri}}}}}}}}}}\n",
        n = up.node()
    ));
    // The regex matched the normalized path (else the upstream would get /v2/x/../%79/./z).
    assert_eq!(get(p.node(), "/v1/x/../%79/./z").json()["path"], "/v2/y/z");
    let echo = get(p.node(), "/w/x/..//%79/./z").json();
    assert_eq!((echo["path"].as_str(), echo["headers"]["x-uri"].as_str()), (Some("/w/y/z"), Some("/w/y/z")));
}

#[test]
fn slash_settings() {
    let up = Upstream::start("u");
    let res = format!("routes:\n  - {{id: 1, uri: /p/*, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node());
    let p = Prefix::new("  merge_slashes: false\n  escaped_slashes: reject\n", "", &res);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(get(p.node(), "/p//x").json()["path"], "/p//x");
    let r = get(p.node(), "/p/a%2Fb");
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error_msg"],
        "400 Bad Request: invalid path: encoded slashes (%2F) are not allowed (gateway.escaped_slashes: reject)"
    );
}

fn within(elapsed: Duration, lo: f64, hi: f64, what: &str) {
    let s = elapsed.as_secs_f64();
    assert!(s >= lo && s < hi, "{what}: took {s:.2} s, expected between {lo} and {hi} s");
}

#[test]
fn connect_timeout_bounds_the_connect_only() {
    // A listener that never accepts: once its accept queue is full, further SYNs are dropped
    // and connects hang.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut held = Vec::new();
    for _ in 0..2000 {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => held.push(s),
            Err(_) => break,
        }
    }
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{retries: 0, timeout: {{connect: 1, send: 5, read: 5}}, nodes: {{\"{addr}\": 1}}}}}}\n"
    ));
    let t = Instant::now();
    let r = get(p.node(), "/");
    assert_eq!(r.status, 504, "{}", r.text());
    within(t.elapsed(), 0.9, 1.6, "connect timeout of 1 s");
    drop(held);
}

#[test]
fn read_timeout_bounds_the_wait_for_the_head_and_each_body_read() {
    let (silent, stall) = (Hole::start(Mode::Silent), Hole::start(Mode::StallBody));
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /head, upstream: {{retries: 0, timeout: {{connect: 3, send: 3, read: 1}}, nodes: {{\"{}\": 1}}}}}}\n  - {{id: 2, uri: /body, upstream: {{retries: 0, timeout: {{connect: 3, send: 3, read: 1}}, nodes: {{\"{}\": 1}}}}}}\n",
        silent.addr, stall.addr
    ));
    let t = Instant::now();
    let r = get(p.node(), "/head");
    assert_eq!(r.status, 504, "{}", r.text());
    within(t.elapsed(), 0.9, 1.6, "read timeout of 1 s (not connect + send + read)");
    // The head arrives, then the body stalls: the client gets what came and the connection ends
    // one read timeout later.
    let t = Instant::now();
    let out = raw(p.node(), b"GET /body HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with("0123456789"), "{out}");
    within(t.elapsed(), 0.9, 1.8, "read timeout between body reads");
}

#[test]
fn send_timeout_bounds_each_write() {
    let hole = Hole::start(Mode::StopReading);
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{retries: 0, timeout: {{connect: 5, send: 1, read: 5}}, nodes: {{\"{}\": 1}}}}}}\n",
        hole.addr
    ));
    let mut s = TcpStream::connect(p.node()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let total: u64 = 256 << 20;
    let head = format!("PUT /up HTTP/1.1\r\nHost: x\r\nContent-Length: {total}\r\n\r\n");
    s.write_all(head.as_bytes()).expect("head");
    let mut writer = s.try_clone().expect("clone");
    let t = Instant::now();
    std::thread::spawn(move || {
        let chunk = vec![b'x'; 64 << 10];
        let mut sent = 0;
        while sent < total {
            if writer.write_all(&chunk).is_err() {
                return;
            }
            sent += chunk.len() as u64;
        }
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    // Socket buffers on loopback fill within milliseconds; then one send timeout.
    within(t.elapsed(), 0.9, 2.5, "send timeout of 1 s");
    assert_eq!(hole.hits(), 1);
}

#[test]
fn non_idempotent_requests_are_never_sent_twice() {
    let crash = Hole::start(Mode::CloseAfterRequest);
    let good = Upstream::start("good");
    let dead = free_port();
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /crash/*, upstream: {{retries: 1, nodes: {{\"{c}\": 1000, \"{g}\": 1}}}}}}\n  - {{id: 2, uri: /dead/*, upstream: {{retries: 1, nodes: {{\"127.0.0.1:{dead}\": 1000, \"{g}\": 1}}}}}}\n",
        c = crash.addr,
        g = good.node()
    ));
    // POST and PATCH reached the first node, which may have acted on them: no second node.
    for method in ["POST", "PATCH"] {
        let before = (crash.hits(), good.hits());
        let r = request(p.node(), method, "/crash/order", &[], b"{\"qty\": 1}");
        assert_eq!(r.status, 502, "{method}: {}", r.text());
        assert_eq!((crash.hits(), good.hits()), (before.0 + 1, before.1), "{method} must not be sent twice");
    }
    // Idempotent methods are retried on the next node.
    for method in ["GET", "PUT", "DELETE"] {
        let before = (crash.hits(), good.hits());
        let r = request(p.node(), method, "/crash/item", &[], b"");
        assert_eq!(r.status, 200, "{method}: {}", r.text());
        assert_eq!((crash.hits(), good.hits()), (before.0 + 1, before.1 + 1), "{method}");
    }
    // Nothing was sent when the connect failed: a POST may go to the next node, once.
    let before = good.hits();
    let r = request(p.node(), "POST", "/dead/order", &[], b"{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(good.hits(), before + 1);
    // Even a streamed body (larger than what is buffered for replay) survives a failed connect.
    let body = vec![b'z'; 200 << 10];
    let r = request(p.node(), "POST", "/dead/big", &[], &body);
    assert_eq!((r.status, r.json()["body_len"].as_u64()), (200, Some(200 << 10)));
}

#[test]
fn malformed_bodies_and_smuggling_shapes_are_refused_and_never_forwarded() {
    let up = Upstream::start("u");
    let (p, w) = start(&format!("routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()));
    let head = "POST /x HTTP/1.1\r\nHost: x\r\n";
    let cases: Vec<(&str, String)> = vec![
        ("bad chunk size", format!("{head}Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n")),
        ("missing CRLF after chunk data", format!("{head}Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n")),
        ("CL + TE", format!("{head}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")),
        ("TE + CL", format!("{head}Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n")),
        ("two Content-Length", format!("{head}Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd")),
        ("two equal Content-Length", format!("{head}Content-Length: 4\r\nContent-Length: 4\r\n\r\nabcd")),
        ("obs-fold", format!("{head}X-A: a\r\n b\r\nContent-Length: 0\r\n\r\n")),
        ("Transfer-Encoding: xchunked", format!("{head}Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n")),
        (
            "Transfer-Encoding: chunked, identity",
            format!("{head}Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n"),
        ),
        ("space before colon", format!("{head}Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n")),
        ("Content-Length: +4", format!("{head}Content-Length: +4\r\n\r\nabcd")),
    ];
    let mut failures = Vec::new();
    for (what, bytes) in &cases {
        let out = raw(p.node(), bytes.as_bytes());
        if !out.starts_with("HTTP/1.1 400") {
            failures.push(format!("{what}: {:?}", out.lines().next().unwrap_or("(closed without an answer)")));
        } else if !out.contains("{\"error_msg\":\"400 Bad Request: ") {
            failures.push(format!("{what}: no JSON reason in {out:?}"));
        }
    }
    // A body cut short: the client stops sending half-way through a chunk.
    let mut s = TcpStream::connect(p.node()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(format!("{head}Transfer-Encoding: chunked\r\n\r\n100\r\nonly a few bytes").as_bytes()).expect("write");
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    if !out.starts_with("HTTP/1.1 400") {
        failures.push(format!("truncated chunked body: {:?}", out.lines().next()));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(up.hits(), 0, "no upstream may see any part of a refused request");
    // A well-formed chunked body still goes through.
    let out = raw(
        p.node(),
        format!("{head}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n").as_bytes(),
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("\"body\":\"hello\""), "{out}");
    let log = w.log_text();
    assert!(!log.contains("ERROR"), "client protocol errors must not be logged at error level:\n{log}");
}

#[test]
fn global_rules_run_for_unmatched_requests() {
    let log = std::env::temp_dir().join(format!("weir-edge-global-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let (p, _w) = start(&format!(
        "global_rules:\n  - {{id: g, plugins: {{request-id: {{}}, file-logger: {{path: \"{}\"}}}}}}\nroutes:\n  - {{id: 1, uri: /only}}\n",
        log.display()
    ));
    let r = get(p.node(), "/nowhere");
    assert_eq!((r.status, r.json()), (404, json!({"error_msg": "404 Route Not Found"})));
    assert!(r.header("x-request-id").is_some_and(|v| !v.is_empty()), "{:?}", r.headers);
    assert!(
        eventually(Duration::from_secs(5), || std::fs::read_to_string(&log).unwrap_or_default().contains("404")),
        "the log phase of global rules ran: {:?}",
        std::fs::read_to_string(&log)
    );
    let _ = std::fs::remove_file(&log);
}

#[test]
fn gateway_made_errors_pass_through_header_filters() {
    let dead = free_port();
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /dead, upstream: {{nodes: {{\"127.0.0.1:{dead}\": 1}}}}, plugins: {{request-id: {{}}, response-rewrite: {{headers: {{set: {{x-edge: \"1\"}}}}}}}}}}\n  - {{id: 2, uri: /none, plugins: {{request-id: {{}}}}}}\n"
    ));
    let r = get(p.node(), "/dead");
    assert_eq!(r.status, 502);
    assert!(r.header("x-request-id").is_some_and(|v| !v.is_empty()), "{:?}", r.headers);
    assert_eq!(r.header("x-edge"), Some("1"));
    assert_eq!(r.json()["error_msg"], "502 Bad Gateway: no upstream node could serve the request");
    let r = get(p.node(), "/none");
    assert_eq!(r.status, 503);
    assert!(r.header("x-request-id").is_some(), "{:?}", r.headers);
}

#[test]
fn client_gone_before_the_upstream_answered_is_logged_as_499() {
    let up = Upstream::start("slow");
    let log = std::env::temp_dir().join(format!("weir-edge-499-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, upstream: {{nodes: {{\"{}\": 1}}}}, plugins: {{file-logger: {{path: \"{}\"}}}}}}\n",
        up.node(),
        log.display()
    ));
    let mut s = TcpStream::connect(p.node()).expect("connect");
    s.write_all(b"GET /sleep/3000 HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    std::thread::sleep(Duration::from_millis(300));
    drop(s);
    let line = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(5), || line().contains("\"status\":499")
            || line().contains("\"status\":\"499\"")),
        "the log phase ran with 499: {:?}",
        line()
    );
    let _ = std::fs::remove_file(&log);
}
