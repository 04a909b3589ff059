//! The log sinks (http-logger, tcp-logger, udp-logger, syslog) through the real binary, each
//! against a real receiver on loopback: an HTTP server, a TCP server, a UDP socket, a syslog
//! receiver whose messages are checked against RFC 5424's grammar. A sink that accepts and
//! stops reading, and one that is not there, cost the requests nothing: they are answered, the
//! entries over the bound are dropped and counted in the metrics, and what is held stays under
//! `max_pending_entries` / `max_pending_bytes`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use common::upstream::Upstream;
use common::*;
use serde_json::{json, Value};

fn up(u: &Upstream) -> String {
    format!("{{nodes: {{\"{}\": 1}}}}", u.node())
}

/// One request an HTTP receiver got.
#[derive(Debug)]
struct Received {
    head: String,
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
}

/// A real HTTP/1.1 server (keep-alive, Content-Length bodies) that records every request and
/// answers `status`.
fn http_receiver(status: u16) -> (SocketAddr, Receiver<Received>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().expect("clone"));
                let mut w = conn;
                loop {
                    let mut head = String::new();
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        head.push_str(&line);
                    }
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    let mut body = vec![0; len];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    let _ = tx.send(Received { head, body });
                    let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n");
                    if w.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, rx)
}

/// A TCP server that accepts and never reads: the stalled sink.
fn stalled_receiver() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in l.incoming().flatten() {
            held.push(conn);
        }
    });
    addr
}

/// A TCP server that reads each connection to its end and passes on what came.
fn tcp_receiver() -> (SocketAddr, Receiver<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for mut conn in l.incoming().flatten() {
            let mut all = Vec::new();
            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
            if conn.read_to_end(&mut all).is_ok() {
                let _ = tx.send(all);
            }
        }
    });
    (addr, rx)
}

/// A UDP socket to receive on, and its port.
fn udp_receiver() -> (UdpSocket, u16) {
    let udp = UdpSocket::bind("127.0.0.1:0").expect("bind");
    udp.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let port = udp.local_addr().expect("addr").port();
    (udp, port)
}

/// The next datagram.
fn datagram(udp: &UdpSocket, w: &Weir) -> Vec<u8> {
    let mut buf = vec![0u8; 65536];
    let n = udp.recv(&mut buf).unwrap_or_else(|e| panic!("no datagram ({e}); log:\n{}", w.log_text()));
    buf.truncate(n);
    buf
}

fn metric(p: &Prefix, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = get(p.metrics(), "/weir/prometheus/metrics").text();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
        .sum()
}

fn recv<T>(rx: &Receiver<T>, w: &Weir) -> T {
    rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("nothing received; log:\n{}", w.log_text()))
}

#[test]
fn http_logger_posts_full_log_batches_with_bodies_and_the_auth_header() {
    let u = Upstream::start("u");
    let (sink, rx) = http_receiver(200);
    let (p, w) = start(&format!(
        "routes:\n  - {{id: r1, uri: /a, upstream: {u}, plugins: {{http-logger: {{uri: \"http://{sink}/logs?k=1\", auth_header: \"Bearer t0k\", batch_max_size: 2, inactive_timeout: 1, include_req_body: true, include_resp_body: true, max_req_body_bytes: 4, max_resp_body_bytes: 5}}}}}}\n",
        u = up(&u)
    ));
    for i in 0..3 {
        let r = request(p.node(), "POST", &format!("/a?i={i}"), &[("X-Test", "yes")], b"hello-body");
        assert_eq!(r.status, 200);
    }
    let first = recv(&rx, &w);
    assert!(first.head.starts_with("POST /logs?k=1 HTTP/1.1"), "{}", first.head);
    assert_eq!(first.header("authorization").as_deref(), Some("Bearer t0k"));
    assert_eq!(first.header("content-type").as_deref(), Some("application/json"));
    let batch: Vec<Value> = serde_json::from_slice(&first.body).expect("a JSON array");
    assert_eq!(batch.len(), 2, "batch_max_size");
    let e = &batch[0];
    assert_eq!(e["route_id"], "r1");
    assert_eq!(e["request"]["method"], "POST");
    assert_eq!(e["request"]["uri"], "/a?i=0");
    assert_eq!(e["request"]["querystring"], json!({"i": "0"}));
    assert_eq!(e["request"]["headers"]["x-test"], "yes");
    assert_eq!(e["request"]["body"], "hell", "cut at max_req_body_bytes");
    assert_eq!(e["response"]["status"], 200);
    assert_eq!(e["response"]["body"].as_str().map(str::len), Some(5), "cut at max_resp_body_bytes: {e}");
    assert_eq!(e["upstream"], u.node());
    assert_eq!(e["client_ip"], "127.0.0.1");
    assert!(e["latency"].is_number() && e["start_time"].is_number() && e["server"]["hostname"].is_string(), "{e}");
    // The third waits for inactive_timeout (1 s), alone in its batch.
    let second = recv(&rx, &w);
    let batch: Vec<Value> = serde_json::from_slice(&second.body).expect("a JSON array");
    assert_eq!(batch.len(), 1);
    assert_eq!(batch[0]["request"]["uri"], "/a?i=2");
    assert!(eventually(Duration::from_secs(5), || metric(
        &p,
        "weir_log_sink_sent_total",
        &[("plugin", "http-logger"), ("id", "r1")]
    ) == 3.0));
}

#[test]
fn http_logger_follows_the_metadata_log_format_and_concatenates_lines() {
    let u = Upstream::start("u");
    let (sink, rx) = http_receiver(200);
    let (p, w) = start(&format!(
        "plugin_metadata:\n  - {{id: http-logger, log_format: {{who: $remote_addr, agent: $http_user_agent, st: $status, at: {{port: $server_port}}, fixed: weir}}}}\nroutes:\n  - {{id: m, uri: /m, upstream: {u}, plugins: {{http-logger: {{uri: \"http://{sink}/\", concat_method: new_line, batch_max_size: 2}}}}}}\n  - {{id: own, uri: /own, upstream: {u}, plugins: {{http-logger: {{uri: \"http://{sink}/\", batch_max_size: 1, log_format: {{path: $uri}}}}}}}}\n",
        u = up(&u)
    ));
    request(p.node(), "GET", "/m", &[("User-Agent", "t1")], b"");
    request(p.node(), "GET", "/m", &[("User-Agent", "t2")], b"");
    let got = recv(&rx, &w);
    assert_eq!(got.header("content-type").as_deref(), Some("text/plain"));
    let lines: Vec<Value> =
        String::from_utf8_lossy(&got.body).lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert_eq!(
        lines[0],
        json!({"who": "127.0.0.1", "agent": "t1", "st": 200, "at": {"port": p.node_port.to_string()}, "fixed": "weir", "route_id": "m"})
    );
    assert_eq!(lines[1]["agent"], "t2");
    // A route's own log_format wins over the metadata; one entry a batch is a bare object.
    get(p.node(), "/own");
    let got = recv(&rx, &w);
    assert_eq!(serde_json::from_slice::<Value>(&got.body).expect("JSON"), json!({"path": "/own", "route_id": "own"}));
}

#[test]
fn a_sink_that_stops_reading_costs_requests_nothing_and_holds_at_most_its_bound() {
    let u = Upstream::start("u");
    let stalled = stalled_receiver();
    let (p, w) = start(&format!(
        "plugin_metadata:\n  - {{id: http-logger, max_pending_entries: 50, max_pending_bytes: 1048576}}\n  - {{id: tcp-logger, max_pending_entries: 1000, max_pending_bytes: 8388608}}\nroutes:\n  - {{id: h, uri: /h, upstream: {u}, plugins: {{http-logger: {{uri: \"http://{stalled}/\", batch_max_size: 10, timeout: 60}}}}}}\n  - {{id: t, uri: /t, upstream: {u}, plugins: {{tcp-logger: {{host: \"127.0.0.1\", port: {port}, batch_max_size: 120, timeout: 60000, include_req_body: true}}}}}}\n",
        u = up(&u),
        port = stalled.port()
    ));
    // 120 entries of 48 KiB: a batch more than the kernel buffers for a socket that is not
    // read (4 MiB of send buffer here), so the first batch hangs in its write.
    let body = vec![b'x'; 48 << 10];
    for _ in 0..300 {
        assert_eq!(get(p.node(), "/h").status, 200);
        assert_eq!(request(p.node(), "POST", "/t", &[], &body).status, 200);
    }
    let labels = |id| [("plugin", if id == "h" { "http-logger" } else { "tcp-logger" }), ("id", id)];
    let held = metric(&p, "weir_log_sink_pending_entries", &labels("h"));
    assert!(held <= 50.0, "http-logger holds {held} entries");
    assert!(metric(&p, "weir_log_sink_dropped_total", &[("reason", "full"), ("plugin", "http-logger")]) >= 250.0);
    let bytes = metric(&p, "weir_log_sink_pending_bytes", &labels("t"));
    assert!(bytes > 4194304.0 && bytes <= 8388608.0, "tcp-logger holds {bytes} bytes");
    assert!(metric(&p, "weir_log_sink_dropped_total", &[("reason", "full"), ("plugin", "tcp-logger")]) >= 100.0);
    assert_eq!(metric(&p, "weir_log_sink_sent_total", &labels("h")), 0.0, "{}", w.log_text());
}

#[test]
fn a_dead_sink_fails_batches_after_their_retries_and_requests_go_on() {
    let u = Upstream::start("u");
    let dead = free_port();
    let (p, w) = start(&format!(
        "routes:\n  - {{id: d, uri: /d, upstream: {u}, plugins: {{http-logger: {{uri: \"http://127.0.0.1:{dead}/\", batch_max_size: 1, max_retry_count: 1, retry_delay: 0}}, tcp-logger: {{host: \"127.0.0.1\", port: {dead}, batch_max_size: 1}}, udp-logger: {{host: \"127.0.0.1\", port: {dead}, batch_max_size: 1}}}}}}\n",
        u = up(&u)
    ));
    for _ in 0..5 {
        assert_eq!(get(p.node(), "/d").status, 200);
    }
    let failed =
        |plugin| metric(&p, "weir_log_sink_dropped_total", &[("reason", "failed"), ("plugin", plugin), ("id", "d")]);
    assert!(
        eventually(Duration::from_secs(10), || failed("http-logger") == 5.0 && failed("tcp-logger") == 5.0),
        "{}",
        get(p.metrics(), "/weir/prometheus/metrics").text()
    );
    assert_eq!(metric(&p, "weir_log_sink_retries_total", &[("plugin", "http-logger"), ("id", "d")]), 5.0);
    // UDP has no answer to miss: the datagrams go (and the kernel discards them).
    assert!(eventually(Duration::from_secs(10), || metric(
        &p,
        "weir_log_sink_sent_total",
        &[("plugin", "udp-logger")]
    ) == 5.0));
    assert!(w.log_text().contains("sending a batch failed"), "{}", w.log_text());
}

#[test]
fn tcp_and_udp_loggers_deliver_json_batches() {
    let (u, (tcp, tcp_rx), (udp, udp_port)) = (Upstream::start("u"), tcp_receiver(), udp_receiver());
    let (p, w) = start(&format!(
        "routes:\n  - {{id: t, uri: /t, upstream: {u}, plugins: {{tcp-logger: {{host: \"127.0.0.1\", port: {tp}, batch_max_size: 2}}, udp-logger: {{host: \"localhost\", port: {udp_port}, batch_max_size: 2, log_format: {{m: $request_method, u: $uri}}}}}}}}\n",
        u = up(&u),
        tp = tcp.port()
    ));
    get(p.node(), "/t");
    request(p.node(), "DELETE", "/t", &[], b"");
    let got: Vec<Value> = serde_json::from_slice(&recv(&tcp_rx, &w)).expect("a JSON array");
    assert_eq!(got.len(), 2);
    assert_eq!(
        (got[0]["request"]["method"].as_str(), got[1]["request"]["method"].as_str()),
        (Some("GET"), Some("DELETE"))
    );
    let got: Value = serde_json::from_slice(&datagram(&udp, &w)).expect("JSON");
    assert_eq!(got, json!([{"m": "GET", "u": "/t", "route_id": "t"}, {"m": "DELETE", "u": "/t", "route_id": "t"}]));
}

/// Checks `msg` against RFC 5424's grammar (section 6) as this plugin fills it (NILVALUE
/// structured data, a JSON MSG); returns (PRI, HOSTNAME, MSG).
fn parse_rfc5424(msg: &str) -> (u8, String, Value) {
    let rest = msg.strip_prefix('<').unwrap_or_else(|| panic!("no PRI: {msg}"));
    let (pri, rest) = rest.split_once('>').unwrap_or_else(|| panic!("no PRI end: {msg}"));
    assert!(!pri.is_empty() && pri.len() <= 3 && pri.bytes().all(|b| b.is_ascii_digit()), "PRI {pri}");
    let pri: u8 = pri.parse().expect("PRI");
    assert!(pri <= 191);
    let mut parts = rest.splitn(7, ' ');
    let mut next = || parts.next().unwrap_or_else(|| panic!("too few fields: {msg}"));
    assert_eq!(next(), "1", "VERSION");
    let ts = next();
    assert!(
        chrono::DateTime::parse_from_rfc3339(ts).is_ok() && ts.ends_with('Z') && ts.contains('T'),
        "TIMESTAMP {ts}"
    );
    let printable = |f: &str, max: usize| !f.is_empty() && f.len() <= max && f.bytes().all(|b| (33..=126).contains(&b));
    let host = next();
    assert!(printable(host, 255), "HOSTNAME {host}");
    let app = next();
    assert!(printable(app, 48), "APP-NAME {app}");
    let procid = next();
    assert!(printable(procid, 128), "PROCID {procid}");
    let msgid = next();
    assert!(printable(msgid, 32), "MSGID {msgid}");
    let sd_and_msg = next();
    let body = sd_and_msg.strip_prefix("- ").unwrap_or_else(|| panic!("STRUCTURED-DATA: {sd_and_msg}"));
    (pri, host.to_owned(), serde_json::from_str(body).unwrap_or_else(|e| panic!("MSG {body}: {e}")))
}

#[test]
fn syslog_sends_rfc5424_messages_over_udp_and_octet_counted_tcp() {
    let (u, (tcp, tcp_rx), (udp, udp_port)) = (Upstream::start("u"), tcp_receiver(), udp_receiver());
    let (p, w) = start(&format!(
        "routes:\n  - {{id: s, uri: /s, upstream: {u}, plugins: {{syslog: {{host: \"127.0.0.1\", port: {tp}, batch_max_size: 2, log_format: {{u: $uri, a: $arg_n}}}}}}}}\n  - {{id: su, uri: /su, upstream: {u}, plugins: {{syslog: {{host: \"127.0.0.1\", port: {udp_port}, sock_type: udp, facility: LOCAL4, severity: WARNING, batch_max_size: 2}}}}}}\n",
        u = up(&u),
        tp = tcp.port()
    ));
    get(p.node(), "/s?n=1");
    get(p.node(), "/s?n=2");
    let stream = recv(&tcp_rx, &w);
    // RFC 6587 octet counting: MSG-LEN SP SYSLOG-MSG, repeated.
    let mut rest = &stream[..];
    let mut messages = Vec::new();
    while !rest.is_empty() {
        let sp = rest.iter().position(|b| *b == b' ').expect("MSG-LEN SP");
        let len: usize = std::str::from_utf8(&rest[..sp]).expect("ASCII").parse().expect("MSG-LEN");
        messages.push(String::from_utf8(rest[sp + 1..sp + 1 + len].to_vec()).expect("UTF-8"));
        rest = &rest[sp + 1 + len..];
    }
    assert_eq!(messages.len(), 2, "{stream:?}");
    let (pri, host, msg) = parse_rfc5424(&messages[0]);
    assert_eq!((pri, host.as_str()), (46, "127.0.0.1"), "SYSLOG.INFO, the request's host");
    assert_eq!(msg, json!({"u": "/s", "a": "1", "route_id": "s"}));
    assert_eq!(parse_rfc5424(&messages[1]).2["a"], "2");

    get(p.node(), "/su");
    get(p.node(), "/su");
    for _ in 0..2 {
        let (pri, _, msg) = parse_rfc5424(&String::from_utf8(datagram(&udp, &w)).expect("UTF-8"));
        assert_eq!(pri, 20 * 8 + 4, "LOCAL4.WARNING");
        assert_eq!(msg["request"]["uri"], "/su");
    }
}

#[test]
fn malformed_sink_configurations_are_refused_naming_the_key() {
    for (plugin, conf, key) in [
        ("http-logger", "{uri: \"ftp://127.0.0.1/\"}", "uri"),
        ("http-logger", "{uri: \"http://127.0.0.1/\", inactive_timeout: 0}", "inactive_timeout"),
        ("tcp-logger", "{host: \"127.0.0.1\", port: 70000}", "port"),
        ("udp-logger", "{host: \"127.0.0.1\", port: 9, log_format: {a: {b: $remot_addr}}}", "log_format.a.b"),
        ("syslog", "{host: \"127.0.0.1\", port: 9, sock_type: sctp}", "sock_type"),
        ("syslog", "{host: \"127.0.0.1\", port: 9, facility: LOCAL9}", "facility"),
    ] {
        let p = Prefix::new("", "", &format!("routes:\n  - {{id: 1, uri: /x, plugins: {{{plugin}: {conf}}}}}\n"));
        let (code, out) = start_refused(&p);
        assert_ne!(code, 0, "{plugin} {conf} was accepted");
        assert!(out.contains(plugin) && out.contains(key), "{plugin} {conf}: {out}");
    }
}
