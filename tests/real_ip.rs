//! The client's real address, against the real binary: PROXY protocol v1 and v2 on the
//! listeners that enable it (HTTP and stream, and to stream upstreams), `gateway.real_ip`
//! behind trusted proxies, and the `real-ip` plugin; forged headers and missing PROXY headers
//! from untrusted clients change nothing.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use common::upstream::Upstream;
use common::*;

fn up(u: &Upstream) -> String {
    format!("{{nodes: {{\"{}\": 1}}}}", u.node())
}

/// One request on a fresh connection that first sends `preamble` (a PROXY header).
fn with_preamble(addr: SocketAddr, preamble: &[u8], path: &str, headers: &str) -> Option<Response> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut req = preamble.to_vec();
    req.extend_from_slice(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n").as_bytes());
    s.write_all(&req).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    (!raw.is_empty()).then(|| parse_response(&raw))
}

fn v2_tcp4(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x21, 0x11, 0, 12]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h
}

#[test]
fn proxy_protocol_names_the_client_on_the_listeners_that_enable_it() {
    let u = Upstream::start("u");
    let pp_port = free_port();
    let p = Prefix::new(
        &format!("  proxy_protocol:\n    listen_http_port: {pp_port}\n  access_log: {{path: logs/access.log, format: \"$remote_addr $uri\"}}\n"),
        "",
        &format!(
            "routes:\n  - {{id: lb-only, uri: /lb, remote_addrs: [203.0.113.0/24], upstream: {u}}}\n  - {{id: echo, uri: /echo, upstream: {u}}}\n",
            u = up(&u)
        ),
    );
    let w = Weir::start(&p);
    let pp = SocketAddr::from(([127, 0, 0, 1], pp_port));
    w.wait_ready(p.node());
    w.wait_ready(pp);

    let r = with_preamble(pp, b"PROXY TCP4 203.0.113.7 10.0.0.1 56324 80\r\n", "/lb", "").expect("answer");
    assert_eq!(r.status, 200, "routes filter on the address the PROXY header names");
    let xff = r.json()["headers"]["x-forwarded-for"].as_str().unwrap_or("").to_owned();
    assert_eq!(xff, "203.0.113.7");
    let r = with_preamble(pp, &v2_tcp4([203, 0, 113, 8], 1234, [10, 0, 0, 1], 80), "/lb", "").expect("answer");
    assert_eq!((r.status, r.json()["headers"]["x-real-ip"].as_str()), (200, Some("203.0.113.8")));
    let local = with_preamble(pp, b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00", "/echo", "").expect("answer");
    assert_eq!(local.json()["headers"]["x-real-ip"], "127.0.0.1", "LOCAL keeps the connection's own address");

    // Without a PROXY header the connection is closed: nobody reaching the port directly is believed.
    assert!(with_preamble(pp, b"", "/echo", "").is_none(), "no header: closed");
    assert!(with_preamble(pp, b"PROXY TCP4 1.2.3.4 nope 1 2\r\n", "/echo", "").is_none(), "bad header: closed");
    // The ordinary listener knows nothing of PROXY headers, and its clients are who they are.
    assert_eq!(get(p.node(), "/lb").status, 404);
    let r = with_preamble(p.node(), b"PROXY TCP4 203.0.113.7 10.0.0.1 1 80\r\n", "/lb", "").expect("answer");
    assert_eq!(r.status, 400, "a PROXY line on a plain listener is a malformed request");

    assert!(
        eventually(Duration::from_secs(5), || std::fs::read_to_string(p.log_path().with_file_name("logs/access.log"))
            .is_ok_and(|l| l.contains("203.0.113.7 /lb") && l.contains("203.0.113.8 /lb"))),
        "the access log has the real clients"
    );
}

#[test]
fn real_ip_believes_trusted_proxies_only() {
    let u = Upstream::start("u");
    let route = format!(
        "routes:\n  - {{id: r, uri: /r, remote_addrs: [198.51.100.0/24], upstream: {u}, plugins: {{proxy-rewrite: {{headers: {{set: {{x-seen: $remote_addr}}}}}}}}}}\n",
        u = up(&u)
    );
    // The test client (127.0.0.1) is a trusted proxy.
    let trusting = Prefix::new(
        "  real_ip:\n    trusted_addresses: [127.0.0.1, 10.0.0.0/8]\n    header: X-Forwarded-For\n    recursive: true\n",
        "",
        &route,
    );
    let w = Weir::start(&trusting);
    w.wait_ready(trusting.node());
    let r = request(trusting.node(), "GET", "/r", &[("x-forwarded-for", "6.6.6.6, 198.51.100.4, 10.1.1.1")], b"");
    assert_eq!(r.status, 200, "routing sees the real client: {}", r.text());
    assert_eq!(r.json()["headers"]["x-seen"], "198.51.100.4");
    assert_eq!(
        r.json()["headers"]["x-forwarded-for"],
        "6.6.6.6, 198.51.100.4, 10.1.1.1, 198.51.100.4",
        "as nginx's $proxy_add_x_forwarded_for: the incoming list plus the client"
    );
    let r = request(trusting.node(), "GET", "/r", &[("x-forwarded-for", "198.51.100.4, 6.6.6.6")], b"");
    assert_eq!(r.status, 404, "a client cannot hide behind an address it puts further left");

    // Not a trusted proxy: the same headers are ignored.
    let strict = Prefix::new("  real_ip:\n    trusted_addresses: [10.0.0.0/8]\n    header: X-Real-IP\n", "", &route);
    let w2 = Weir::start(&strict);
    w2.wait_ready(strict.node());
    let r =
        request(strict.node(), "GET", "/r", &[("x-real-ip", "198.51.100.4"), ("x-forwarded-for", "198.51.100.4")], b"");
    assert_eq!(r.status, 404, "a forged header from an untrusted peer changes nothing");
    drop(w);

    let bad = Prefix::new("  real_ip:\n    trusted_addresses: [10.0.0.0/33]\n", "", "");
    let (code, out) = start_refused(&bad);
    assert_ne!(code, 0);
    assert!(out.contains("gateway.real_ip.trusted_addresses[0]"), "{out}");
}

#[test]
fn the_real_ip_plugin_sets_the_client_for_later_plugins_and_the_upstream() {
    let u = Upstream::start("u");
    // APISIX's real-ip example, as written (the upstream pointed at a local server).
    let (p, _w) = start(&format!(
        "routes:\n  - id: real-ip-route\n    uri: /get\n    plugins:\n      real-ip: {{source: arg_realip, trusted_addresses: [\"127.0.0.0/24\"]}}\n      proxy-rewrite: {{headers: {{set: {{remote_addr: $remote_addr, remote_port: $remote_port}}}}}}\n    upstream: {u}\n  - {{id: x, uri: /x, plugins: {{real-ip: {{source: http_x_forwarded_for, trusted_addresses: [127.0.0.1], recursive: true}}}}, upstream: {u}}}\n",
        u = up(&u)
    ));
    let r = get(p.node(), "/get?realip=1.2.3.4:9080");
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = r.json()["headers"].clone();
    assert_eq!((seen["remote_addr"].as_str(), seen["remote_port"].as_str()), (Some("1.2.3.4"), Some("9080")));
    assert_eq!(r.json()["headers"]["x-forwarded-for"], "1.2.3.4", "the upstream is told the same client");
    let r = request(p.node(), "GET", "/x", &[("x-forwarded-for", "9.9.9.9, 5.6.7.8, 127.0.0.1")], b"");
    assert_eq!(r.json()["headers"]["x-real-ip"], "5.6.7.8");
}

/// A TCP server that records the first bytes of each connection.
fn recording_server() -> (SocketAddr, std::sync::mpsc::Receiver<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut conn = conn;
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let mut got = Vec::new();
                let mut buf = [0u8; 512];
                while !got.ends_with(b"ping") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = conn.write_all(b"pong");
                let _ = tx.send(got);
            });
        }
    });
    (addr, rx)
}

#[test]
fn stream_listeners_read_and_send_proxy_headers() {
    let (server, received) = recording_server();
    let port = free_port();
    let p = Prefix::new(
        &format!("  stream_proxy:\n    tcp: [{{ip: 127.0.0.1, port: {port}}}]\n  proxy_protocol:\n    enable_tcp_pp: true\n    enable_tcp_pp_to_upstream: true\n"),
        "",
        &format!("stream_routes:\n  - {{id: s, remote_addr: 203.0.113.0/24, upstream: {{nodes: {{\"{server}\": 1}}}}}}\n"),
    );
    let w = Weir::start(&p);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    w.wait_ready(addr);
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    c.write_all(b"PROXY TCP4 203.0.113.7 127.0.0.1 4444 80\r\nping").expect("write");
    let mut answer = [0u8; 4];
    c.read_exact(&mut answer).expect("pong");
    assert_eq!(&answer, b"pong");
    let got = received.recv_timeout(Duration::from_secs(5)).expect("upstream saw the connection");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("PROXY TCP4 203.0.113.7 127.0.0.1 4444 "), "{text}");
    assert!(text.ends_with("\r\nping"), "the client's bytes follow the header: {text}");

    // Without a PROXY header the stream connection is closed before any upstream sees it.
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    c.write_all(b"ping").expect("write");
    let mut buf = [0u8; 4];
    assert!(matches!(c.read(&mut buf), Ok(0) | Err(_)), "closed");
    assert!(received.recv_timeout(Duration::from_millis(300)).is_err(), "no upstream connection");
}

#[test]
fn ip_restriction_sees_the_address_real_ip_set() {
    let u = Upstream::start("u");
    // APISIX's ip-restriction example with real-ip, as written (the upstream pointed at a local server).
    let (p, _w) = start(&format!(
        "routes:\n  - id: ip-restriction-route\n    uri: /anything\n    plugins:\n      real-ip: {{source: http_x_forwarded_for, trusted_addresses: [\"127.0.0.0/24\"]}}\n      ip-restriction: {{whitelist: [\"192.168.1.241\"]}}\n    upstream: {u}\n",
        u = up(&u)
    ));
    let r = request(p.node(), "GET", "/anything", &[("x-forwarded-for", "192.168.1.241")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request(p.node(), "GET", "/anything", &[("x-forwarded-for", "192.168.10.24")], b"");
    assert_eq!((r.status, r.json()["message"].as_str()), (403, Some("Your IP address is not allowed")));
    assert_eq!(get(p.node(), "/anything").status, 403, "without the header: the connection's own address");
}
