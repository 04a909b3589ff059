//! The HTTP/1.1 client side of the proxy against upstreams that answer in every legal (and some
//! illegal) shape: chunked and read-to-close bodies, interim 1xx answers, hop-by-hop fields,
//! conflicting framing, answers before the request body is sent, and pooled connections the
//! upstream closes. Real binary, real sockets; the upstream is a scripted TCP server.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// A scripted upstream: answers each request by its path; counts connections and requests.
struct Scripted {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    /// Connections the gateway closed.
    closed: Arc<AtomicUsize>,
}

/// Reads a request head: (path, content-length), or None at the end of the connection.
fn read_head(r: &mut BufReader<TcpStream>) -> Option<(String, usize)> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let path = line.split(' ').nth(1)?.to_owned();
    let mut len = 0;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        if h == "\r\n" {
            return Some((path, len));
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
}

/// The answer to `path`, and whether the connection closes after it.
fn answer(path: &str) -> (&'static [u8], bool) {
    match path {
        "/chunked" => (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nT: 1\r\n\r\n", false),
        "/eof" => (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", true),
        "/interim" => (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false),
        "/conflict" => (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", true),
        "/hop" => (
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive, x-private\r\nX-Private: 1\r\nKeep-Alive: timeout=5\r\nX-Kept: 1\r\nContent-Length: 2\r\n\r\nok",
            false,
        ),
        "/both" => (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", false),
        "/early" => (b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope", true),
        "/closing" => (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true),
        "/fields" => (
            b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nDate: Tue, 01 Jan 2030 00:00:00 GMT\r\nX-Mid: m\r\nSet-Cookie: b=2\r\nContent-Length: 2\r\n\r\nok",
            false,
        ),
        "/nocontent" => (b"HTTP/1.1 204 No Content\r\nX-Up: 1\r\n\r\n", false),
        "/spoofed" => (
            b"HTTP/1.1 503 Service Unavailable\r\nX-Weir-Upstream-Status: 200\r\nContent-Length: 4\r\n\r\ndown",
            false,
        ),
        _ => (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false),
    }
}

impl Scripted {
    fn start() -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (connections, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let closed = Arc::new(AtomicUsize::new(0));
        let (c, q, e) = (connections.clone(), requests.clone(), closed.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(s) = conn else { return };
                c.fetch_add(1, Ordering::SeqCst);
                let (q, e) = (q.clone(), e.clone());
                std::thread::spawn(move || {
                    let mut w = s.try_clone().expect("clone");
                    let mut r = BufReader::new(s);
                    while let Some((path, len)) = read_head(&mut r) {
                        q.fetch_add(1, Ordering::SeqCst);
                        if path != "/early" {
                            let mut body = vec![0u8; len];
                            if r.read_exact(&mut body).is_err() {
                                return;
                            }
                        }
                        let (bytes, close) = answer(&path);
                        if path == "/early" {
                            // Answered without reading the body; then a lingering close, as
                            // servers do, so that the answer is not lost to a reset.
                            let _ = w.write_all(bytes);
                            let _ = w.shutdown(std::net::Shutdown::Write);
                            let _ = r.get_ref().set_read_timeout(Some(Duration::from_secs(2)));
                            let mut sink = [0u8; 65536];
                            while matches!(r.read(&mut sink), Ok(n) if n > 0) {}
                            return;
                        }
                        if w.write_all(bytes).is_err() || close {
                            // The upstream's side closes (for /closing, a while after answering,
                            // as a keep-alive timeout would).
                            if path == "/closing" {
                                std::thread::sleep(Duration::from_millis(200));
                            }
                            return;
                        }
                    }
                    e.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Scripted { addr, connections, requests, closed }
    }
}

fn gateway(up: &Scripted) -> (Prefix, Weir) {
    gateway_with(up, "{}")
}

fn gateway_with(up: &Scripted, pool: &str) -> (Prefix, Weir) {
    start(&format!(
        r#"{{"routes": [{{"id": "1", "uri": "/*", "upstream": {{"type": "roundrobin", "nodes": {{"{}": 1}}, "retries": 0, "keepalive_pool": {pool}}}}}]}}"#,
        up.addr
    ))
}

#[test]
fn every_response_framing_reaches_the_client_whole() {
    let up = Scripted::start();
    let (p, _w) = gateway(&up);
    let r = get(p.node(), "/chunked");
    assert_eq!((r.status, r.text()), (200, "hello world".to_owned()));
    let r = get(p.node(), "/eof");
    assert_eq!((r.status, r.text()), (200, "until the end".to_owned()));
    let r = get(p.node(), "/interim");
    assert_eq!((r.status, r.text()), (200, "ok".to_owned()));
    let r = get(p.node(), "/hop");
    assert_eq!((r.status, r.text()), (200, "ok".to_owned()));
    assert_eq!(r.header("x-kept"), Some("1"));
    assert_eq!(r.header("x-private"), None, "a field the upstream's Connection names is hop-by-hop");
    assert_eq!(r.header("keep-alive"), None);
    // Chunked wins over Content-Length, which the client must not see.
    let r = get(p.node(), "/both");
    assert_eq!((r.status, r.text()), (200, "abc".to_owned()));
    assert_ne!(r.header("content-length"), Some("100"));
    // Conflicting lengths: the response is refused, not guessed at.
    let r = get(p.node(), "/conflict");
    assert_eq!(r.status, 502, "{}", r.text());
}

/// An answer's fields on a route where nothing reads them travel as the lines they came in
/// (no header map): in the upstream's order, one Date, one length; a field the proxy sets is
/// the proxy's alone.
#[test]
fn answer_fields_pass_in_order_and_the_proxys_own_are_not_doubled() {
    let up = Scripted::start();
    let (p, _w) = gateway(&up);
    let r = get(p.node(), "/fields");
    assert_eq!((r.status, r.text()), (200, "ok".to_owned()));
    let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
    let cookies: Vec<&str> =
        r.headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie")).map(|(_, v)| v.as_str()).collect();
    assert_eq!(cookies, ["a=1", "b=2"], "{names:?}");
    let at = |n: &str| names.iter().position(|k| k.eq_ignore_ascii_case(n));
    assert!(at("x-mid") < names.iter().rposition(|k| k.eq_ignore_ascii_case("set-cookie")), "{names:?}");
    assert_eq!(names.iter().filter(|k| k.eq_ignore_ascii_case("date")).count(), 1, "{names:?}");
    assert_eq!(r.header("date"), Some("Tue, 01 Jan 2030 00:00:00 GMT"), "the upstream's Date is passed on");
    assert_eq!(names.iter().filter(|k| k.eq_ignore_ascii_case("content-length")).count(), 1, "{names:?}");
    // A 5xx says the upstream made it, once, whatever the upstream itself claimed.
    let r = get(p.node(), "/spoofed");
    assert_eq!((r.status, r.text()), (503, "down".to_owned()));
    let said: Vec<&str> = r
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("x-weir-upstream-status"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(said, ["503"]);
}

/// A header filter that makes an upstream's 204 a 200 with a body of its own: the body is sent
/// (whether an answer has a body is decided after the header filters).
#[test]
fn a_status_a_header_filter_rewrites_decides_whether_a_body_is_sent() {
    let up = Scripted::start();
    let (p, _w) = start(&format!(
        r#"{{"routes": [{{"id": "1", "uri": "/nocontent", "plugins": {{"response-rewrite": {{"status_code": 200, "body": "made"}}}}, "upstream": {{"nodes": {{"{}": 1}}}}}}]}}"#,
        up.addr
    ));
    let r = get(p.node(), "/nocontent");
    assert_eq!((r.status, r.text()), (200, "made".to_owned()), "{:?}", r.headers);
}

#[test]
fn keepalive_connections_are_reused_and_a_closed_one_is_replaced() {
    let up = Scripted::start();
    let (p, _w) = gateway(&up);
    for _ in 0..5 {
        assert_eq!(get(p.node(), "/ok").status, 200);
    }
    assert_eq!(up.connections.load(Ordering::SeqCst), 1, "five requests, one upstream connection");
    // The upstream closes its side after answering: the pooled connection is found closed
    // and the next request goes out on a new one, without an error.
    assert_eq!(get(p.node(), "/closing").status, 200);
    std::thread::sleep(Duration::from_millis(400));
    for _ in 0..3 {
        let r = get(p.node(), "/ok");
        assert_eq!((r.status, r.text()), (200, "ok".to_owned()));
    }
    assert_eq!(up.connections.load(Ordering::SeqCst), 2);
    assert_eq!(up.requests.load(Ordering::SeqCst), 9);
}

#[test]
fn an_answer_before_the_body_is_sent_is_passed_on() {
    let up = Scripted::start();
    let (p, _w) = gateway(&up);
    let mut s = TcpStream::connect(p.node()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let size = 8 << 20;
    let head = format!("POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n");
    s.write_all(head.as_bytes()).expect("head");
    // The body goes out from another thread: the gateway stops reading it once answered.
    let mut w = s.try_clone().expect("clone");
    std::thread::spawn(move || {
        let chunk = vec![b'x'; 64 << 10];
        for _ in 0..(size / chunk.len()) {
            if w.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !raw.windows(4).any(|w| w == b"nope") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
    }
    let r = parse_response(&raw);
    assert_eq!((r.status, r.text()), (413, "nope".to_owned()));
}

#[test]
fn keepalive_pool_idle_timeout_and_requests_are_enforced() {
    let up = Scripted::start();
    let (p, _w) = gateway_with(&up, r#"{"size": 4, "idle_timeout": 1, "requests": 2}"#);
    for _ in 0..3 {
        assert_eq!(get(p.node(), "/ok").status, 200);
    }
    // Two requests per connection: the first is closed after its second request.
    assert_eq!(up.connections.load(Ordering::SeqCst), 2);
    assert!(eventually(Duration::from_millis(500), || up.closed.load(Ordering::SeqCst) == 1));
    let idle_since = std::time::Instant::now();
    // The second one idles, and is closed once idle_timeout (1 s, enforced once a second) passes.
    assert!(
        eventually(Duration::from_secs(5), || up.closed.load(Ordering::SeqCst) == 2),
        "the idle connection was not closed after idle_timeout"
    );
    assert!(idle_since.elapsed() >= Duration::from_millis(400), "closed after {:?}", idle_since.elapsed());
}

#[test]
fn trailers_of_a_chunked_body_reach_an_http2_client() {
    if std::process::Command::new("curl").arg("--version").output().is_err() {
        return skip("trailers_of_a_chunked_body_reach_an_http2_client", "curl is not installed");
    }
    let up = Scripted::start();
    let p = Prefix::new(
        "",
        "",
        &format!(r#"{{"routes": [{{"id": "1", "uri": "/*", "upstream": {{"nodes": {{"{}": 1}}}}}}]}}"#, up.addr),
    );
    // A cleartext HTTP/2 listener (HTTP/1.1 clients are sent trailers only when the response
    // declares them, and `Trailer` is hop-by-hop).
    let h2c_port = p.add_h2c_listener();
    let w = Weir::start(&p);
    let h2c = SocketAddr::from(([127, 0, 0, 1], h2c_port));
    w.wait_ready(h2c);
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--http2-prior-knowledge", "-D", "-"])
        .arg(format!("http://{h2c}/chunked"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("hello world"), "{text}");
    assert!(text.contains("t: 1"), "the trailer did not reach the client:\n{text}");
}

/// Sends `head` and `sent` bytes of its body, then waits: the answer and how long it took.
fn stall_after(p: &Prefix, head: &str, sent: usize) -> (Response, Duration) {
    let mut s = TcpStream::connect(p.node()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15))).expect("timeout");
    s.write_all(head.as_bytes()).expect("head");
    s.write_all(&vec![b'x'; sent]).expect("body");
    let started = std::time::Instant::now();
    let mut raw = Vec::new();
    // Read to the end: the gateway closes the connection after its 408.
    let _ = s.read_to_end(&mut raw);
    (parse_response(&raw), started.elapsed())
}

/// `gateway.client_body_timeout` (nginx's): a client that stops sending a body it announced gets
/// 408 and its connection closed, whether the body was being read whole (small) or streamed to
/// the upstream (large), and the upstream is not blamed for it; a slow body that keeps moving is
/// served. Without the limit both stalled requests held their connections for good.
#[test]
fn a_request_body_that_stalls_gets_408_and_one_that_trickles_is_served() {
    let up = Scripted::start();
    let p = Prefix::new(
        "  client_body_timeout: 1\n",
        "",
        &format!(
            r#"{{"routes": [{{"id": "1", "uri": "/*", "upstream": {{"type": "roundrobin", "nodes": {{"{}": 1}}, "retries": 0}}}}]}}"#,
            up.addr
        ),
    );
    let w = Weir::start(&p);
    // (`start` waits for the control port; the data plane may bind a moment later.)
    w.wait_ready(p.node());
    // Read whole before the upstream is contacted (64 KiB or less).
    let (r, took) = stall_after(&p, "POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", 9);
    assert_eq!(r.status, 408, "{}", r.text());
    assert_eq!(r.header("connection"), Some("close"));
    assert!(r.text().contains("client_body_timeout"), "{}", r.text());
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    // Streamed to the upstream after its first 64 KiB.
    let (r, took) = stall_after(&p, "POST /large HTTP/1.1\r\nHost: x\r\nContent-Length: 8388608\r\n\r\n", 100 << 10);
    assert_eq!(r.status, 408, "{}", r.text());
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    let log = w.log_text();
    assert!(!log.contains(" of route "), "the upstream was blamed:\n{log}");
    // A body that trickles in, a part every 400 ms for 2 s, never waits a whole second.
    let mut s = TcpStream::connect(p.node()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15))).expect("timeout");
    s.write_all(b"POST /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\n").expect("head");
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(400));
        s.write_all(b"x").expect("body");
    }
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let r = parse_response(&raw);
    assert_eq!((r.status, r.text()), (200, "ok".to_owned()));
    assert_eq!(up.requests.load(Ordering::SeqCst), 2, "the streamed request and the slow one reached the upstream");
}

/// A client whose streamed body turns out malformed (its chunked encoding breaks after the
/// first 64 KiB went upstream) gets 400, and the upstream is not blamed: no warning, no health
/// report (the same branch), no retry. Before, it was a 502 "tcp failure" reported against the node, so a client
/// could have healthy nodes marked down by sending broken bodies.
#[test]
fn a_streamed_body_that_breaks_gets_400_and_the_upstream_is_not_blamed() {
    // An upstream that reads whatever comes and never answers (the request is never complete).
    let sink = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = sink.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in sink.incoming() {
            let Ok(mut s) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    let p = Prefix::new(
        "",
        "",
        &format!(
            r#"{{"routes": [{{"id": "1", "uri": "/*", "upstream": {{"type": "roundrobin", "nodes": {{"{addr}": 1}}, "retries": 1}}}}]}}"#
        ),
    );
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let mut s = TcpStream::connect(p.node()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15))).expect("timeout");
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").expect("head");
    let chunk = format!("4000\r\n{}\r\n", "x".repeat(0x4000));
    for _ in 0..8 {
        s.write_all(chunk.as_bytes()).expect("chunk");
    }
    s.write_all(b"zz-not-a-size\r\n").expect("garbage");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let r = parse_response(&raw);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("chunked encoding"), "{}", r.text());
    let log = w.log_text();
    assert!(!log.contains(" of route "), "the upstream was blamed:\n{log}");
}
