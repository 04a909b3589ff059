//! The stream proxy with real sockets: TCP echo, a 1 GiB transfer in bounded memory with
//! half-close, UDP with two clients, SNI routing (terminated and passed through), the stream
//! plugins' accept and reject paths, the idle timeout, the stream health entry, and configuration
//! errors.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, get, start_refused, Prefix, Weir};

/// A TCP server: `echo` sends back what it reads; otherwise it reads to the end of the stream
/// and then answers with the byte count (`"<n>\n"`) and closes.
fn tcp_server(echo: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let conns = Arc::new(AtomicUsize::new(0));
    let seen = conns.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            seen.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 256 << 10];
                let mut total = 0u64;
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            total += n as u64;
                            if echo && s.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
                if !echo {
                    let _ = s.write_all(format!("{total}\n").as_bytes());
                }
            });
        }
    });
    (addr, conns)
}

fn udp_echo() -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let addr = s.local_addr().expect("addr");
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            let mut reply = format!("{from}|").into_bytes();
            reply.extend_from_slice(&buf[..n]);
            let _ = s.send_to(&reply, from);
        }
    });
    addr
}

/// A gateway with `stream_proxy` listeners (`tcp`/`udp` YAML lists) and `resources`.
fn gateway(stream_proxy: &str, extra: &str, resources: &str) -> (Prefix, Weir) {
    let p = Prefix::new(&format!("  stream_proxy:\n{stream_proxy}"), extra, resources);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    (p, w)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s
}

fn echo_once(addr: SocketAddr, msg: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut s = connect(addr);
    s.write_all(msg)?;
    let mut got = vec![0u8; msg.len()];
    s.read_exact(&mut got)?;
    Ok(got)
}

/// Whether the gateway closes a new connection on `addr` without answering.
fn closed_at_once(addr: SocketAddr) -> bool {
    let mut s = connect(addr);
    let _ = s.write_all(b"ping");
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

#[test]
fn tcp_echo_and_a_gibibyte_with_half_close_in_bounded_memory() {
    let (echo, _) = tcp_server(true);
    let (sink, _) = tcp_server(false);
    let (tcp1, tcp2) = (common::free_port(), common::free_port());
    let (_p, w) = gateway(
        &format!("    tcp: [{{ip: 127.0.0.1, port: {tcp1}}}, {{ip: 127.0.0.1, port: {tcp2}}}]\n"),
        "",
        &format!(
            "stream_routes:\n  - id: echo\n    server_port: {tcp1}\n    upstream:\n      nodes:\n        \"{echo}\": 1\n\
             \x20 - id: sink\n    server_port: {tcp2}\n    upstream:\n      nodes:\n        \"{sink}\": 1\n"
        ),
    );
    let a1 = SocketAddr::from(([127, 0, 0, 1], tcp1));
    let a2 = SocketAddr::from(([127, 0, 0, 1], tcp2));
    assert_eq!(echo_once(a1, b"hello stream").expect("echo"), b"hello stream");

    // 1 GiB up; the client's half-close reaches the upstream, which then answers with the count.
    let rss_before = w.rss();
    let mut s = connect(a2);
    s.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
    let chunk = vec![b'x'; 1 << 20];
    let mut peak = 0;
    for i in 0..1024 {
        s.write_all(&chunk).expect("send");
        if i % 128 == 0 {
            peak = peak.max(w.rss());
        }
    }
    s.shutdown(Shutdown::Write).expect("half-close");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("answer after half-close");
    assert_eq!(answer.trim(), (1u64 << 30).to_string());
    assert!(peak < rss_before + (32 << 20), "RSS went from {rss_before} to {peak} bytes during the transfer");
}

#[test]
fn udp_sessions_keep_clients_apart() {
    let echo = udp_echo();
    let udp = common::free_port();
    let (_p, _w) = gateway(
        &format!("    udp: [{{ip: 127.0.0.1, port: {udp}}}]\n"),
        "",
        &format!(
            "stream_routes:\n  - id: dns\n    server_port: {udp}\n    upstream:\n      nodes:\n        \"{echo}\": 1\n"
        ),
    );
    let gw = SocketAddr::from(([127, 0, 0, 1], udp));
    let clients: Vec<UdpSocket> = (0..2).map(|_| UdpSocket::bind("127.0.0.1:0").expect("bind")).collect();
    let mut upstream_sides = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        c.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        for round in 0..3 {
            let msg = format!("client {i} round {round}");
            c.send_to(msg.as_bytes(), gw).expect("send");
            let mut buf = [0u8; 2048];
            let (n, from) = c.recv_from(&mut buf).expect("answer through the gateway");
            assert_eq!(from, gw);
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            let (side, echoed) = text.split_once('|').expect("reply shape");
            assert_eq!(echoed, msg);
            upstream_sides.push((i, side.to_owned()));
        }
    }
    // Each client has one session (one upstream-side address), and the two differ.
    let side = |i: usize| upstream_sides.iter().filter(|(c, _)| *c == i).map(|(_, s)| s.clone()).collect::<Vec<_>>();
    let (a, b) = (side(0), side(1));
    assert!(a.iter().all(|s| *s == a[0]) && b.iter().all(|s| *s == b[0]), "{upstream_sides:?}");
    assert_ne!(a[0], b[0]);
}

/// A TLS echo server with its own certificate (CN `upstream`), for passthrough.
fn tls_echo() -> SocketAddr {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec!["pass.example.com".to_owned()]).expect("params");
    params.distinguished_name.push(rcgen::DnType::CommonName, "upstream");
    let cert = params.self_signed(&key).expect("sign");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key_der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der");
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key_der)
        .expect("config");
    let config = Arc::new(config);
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let config = config.clone();
            std::thread::spawn(move || {
                let Ok(conn) = rustls::ServerConnection::new(config) else { return };
                let mut tls = rustls::StreamOwned::new(conn, s);
                let mut buf = [0u8; 4096];
                while let Ok(n) = tls.read(&mut buf) {
                    if n == 0 || tls.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Connects with TLS to `addr` asking for `sni`; echoes `msg` and returns the server's CN.
fn tls_echo_cn(addr: SocketAddr, sni: &str, msg: &[u8]) -> Result<String, String> {
    let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(common::tls_client::config(false), name).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, connect(addr));
    tls.write_all(msg).map_err(|e| e.to_string())?;
    let mut got = vec![0u8; msg.len()];
    tls.read_exact(&mut got).map_err(|e| e.to_string())?;
    if got != msg {
        return Err("echo differs".into());
    }
    let certs = tls.conn.peer_certificates().ok_or("no certificate")?;
    Ok(common::tls_client::common_name(certs[0].as_ref()))
}

#[test]
fn tls_listener_routes_on_sni_terminating_or_passing_through() {
    let passthrough_upstream = tls_echo();
    let (plain_echo, _) = tcp_server(true);
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec!["term.example.com".to_owned()]).expect("params");
    params.distinguished_name.push(rcgen::DnType::CommonName, "weir");
    let cert = params.self_signed(&key).expect("sign");
    let port = common::free_port();
    let p = Prefix::new(&format!("  stream_proxy:\n    tcp: [{{ip: 127.0.0.1, port: {port}, tls: true}}]\n"), "", "");
    p.write("conf/term.crt", &cert.pem());
    p.write("conf/term.key", &key.serialize_pem());
    p.write_resources(&format!(
        "ssls:\n  - id: t\n    snis: [term.example.com]\n    cert_file: conf/term.crt\n    key_file: conf/term.key\n\
         stream_routes:\n  - id: pass\n    sni: pass.example.com\n    tls_passthrough: true\n    upstream:\n      nodes:\n        \"{passthrough_upstream}\": 1\n\
         \x20 - id: term\n    sni: \"*.example.com\"\n    upstream:\n      nodes:\n        \"{plain_echo}\": 1\n"
    ));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // Passed through: the client talks TLS with the upstream itself.
    assert_eq!(tls_echo_cn(addr, "pass.example.com", b"through").as_deref(), Ok("upstream"));
    // Terminated by Weir (its certificate), plain bytes to the upstream.
    assert_eq!(tls_echo_cn(addr, "term.example.com", b"terminated").as_deref(), Ok("weir"));
    // No route for the name: closed.
    assert!(tls_echo_cn(addr, "other.test", b"x").is_err());
}

#[test]
fn stream_plugins_accept_and_reject() {
    let (echo, upstream_conns) = tcp_server(true);
    let ports: Vec<u16> = (0..4).map(|_| common::free_port()).collect();
    let listeners: Vec<String> = ports.iter().map(|p| format!("{{ip: 127.0.0.1, port: {p}}}")).collect();
    let log = std::env::temp_dir().join(format!("weir-stream-log-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let route = |id: &str, port: u16, plugins: &str| {
        format!("  - id: {id}\n    server_port: {port}\n    plugins: {plugins}\n    upstream:\n      nodes:\n        \"{echo}\": 1\n")
    };
    let resources = format!(
        "stream_routes:\n{}{}{}{}",
        route("allow", ports[0], "{ip-restriction: {whitelist: [127.0.0.0/8]}}"),
        route("deny", ports[1], "{ip-restriction: {blacklist: [127.0.0.1]}}"),
        route("limited", ports[2], "{limit-conn: {conn: 1, burst: 0, default_conn_delay: 0.1}}"),
        route("logged", ports[3], &format!("{{stream-file-logger: {{path: \"{}\"}}}}", common::path_str(&log))),
    );
    let (_p, _w) = gateway(&format!("    tcp: [{}]\n", listeners.join(", ")), "", &resources);
    let at = |i: usize| SocketAddr::from(([127, 0, 0, 1], ports[i]));

    assert_eq!(echo_once(at(0), b"allowed").expect("whitelisted client"), b"allowed");
    let before = upstream_conns.load(Ordering::SeqCst);
    assert!(closed_at_once(at(1)), "a blacklisted client was served");
    assert_eq!(upstream_conns.load(Ordering::SeqCst), before, "a refused connection reached the upstream");

    // limit-conn: one at a time; the second is closed while the first is open.
    let mut first = connect(at(2));
    first.write_all(b"1").expect("send");
    let mut one = [0u8; 1];
    first.read_exact(&mut one).expect("first is served");
    assert!(closed_at_once(at(2)), "a connection over conn + burst was served");
    drop(first);
    assert!(
        eventually(Duration::from_secs(3), || echo_once(at(2), b"again").is_ok_and(|g| g == b"again")),
        "the slot was not given back"
    );

    // stream-file-logger: one JSON line per connection with the byte counts.
    assert_eq!(echo_once(at(3), b"12345").expect("logged echo"), b"12345");
    assert!(eventually(Duration::from_secs(3), || std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() == 1)));
    let text = std::fs::read_to_string(&log).expect("log");
    let line: serde_json::Value = serde_json::from_str(text.trim()).expect("a JSON line");
    assert_eq!(line["route_id"], "logged", "{line}");
    assert_eq!(line["bytes_from_client"], 5, "{line}");
    assert_eq!(line["bytes_to_client"], 5, "{line}");
    assert_eq!(line["protocol"], "tcp", "{line}");
    assert_eq!(line["upstream"], echo.to_string(), "{line}");
    assert!(line["close_reason"].as_str().is_some_and(|r| !r.is_empty()), "{line}");
    let _ = std::fs::remove_file(&log);
}

#[test]
fn an_idle_relay_is_closed_at_the_read_timeout_and_a_busy_one_is_not() {
    let (echo, _) = tcp_server(true);
    let port = common::free_port();
    let log = std::env::temp_dir().join(format!("weir-stream-idle-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let (_p, _w) = gateway(
        &format!("    tcp: [{{ip: 127.0.0.1, port: {port}}}]\n"),
        "",
        &format!(
            "stream_routes:\n  - id: idle\n    plugins: {{stream-file-logger: {{path: \"{}\"}}}}\n    upstream:\n      \
             timeout: {{connect: 1, send: 1, read: 1}}\n      nodes:\n        \"{echo}\": 1\n",
            common::path_str(&log)
        ),
    );
    let at = SocketAddr::from(([127, 0, 0, 1], port));

    // Busy: a byte every 400 ms for 2 s (well past the 1 s timeout), every one echoed.
    let mut busy = connect(at);
    let mut quiet = std::time::Instant::now();
    for i in 0..6u8 {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(400));
        }
        busy.write_all(&[b'a' + i]).expect("send while busy");
        let mut one = [0u8; 1];
        busy.read_exact(&mut one).unwrap_or_else(|e| panic!("echo {i} of a busy relay: {e}"));
        assert_eq!(one[0], b'a' + i);
        quiet = std::time::Instant::now();
    }
    // Then idle: closed a timeout after the last byte moved (plus the timer's and the test's
    // slack), not before.
    let mut buf = [0u8; 8];
    let n = busy.read(&mut buf).expect("an end of stream, not the test's own read timeout");
    let waited = quiet.elapsed();
    assert_eq!(n, 0, "bytes from an idle relay");
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(4), "closed after {waited:?} idle");

    assert!(eventually(Duration::from_secs(3), || std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() == 1)));
    let text = std::fs::read_to_string(&log).expect("log");
    let line: serde_json::Value = serde_json::from_str(text.trim()).expect("a JSON line");
    assert_eq!(line["close_reason"], "idle timeout", "{line}");
    assert_eq!(line["bytes_from_client"], 6, "{line}");
    assert_eq!(line["bytes_to_client"], 6, "{line}");
    let _ = std::fs::remove_file(&log);
}

#[test]
fn stream_health_entry_and_schema() {
    let (echo, _) = tcp_server(true);
    let port = common::free_port();
    let (p, _w) = gateway(
        &format!("    tcp: [{{ip: 127.0.0.1, port: {port}}}]\n"),
        "",
        &format!(
            "stream_routes:\n  - id: db\n    server_port: {port}\n    upstream:\n      checks:\n        active:\n          type: tcp\n          healthy: {{interval: 1}}\n      nodes:\n        \"{echo}\": 1\n"
        ),
    );
    // Listed only once the route has carried a connection (as HTTP routes).
    assert_eq!(get(p.control(), "/v1/healthcheck/stream_routes/db").status, 404);
    assert_eq!(get(p.control(), "/v1/healthcheck/stream_routes/nope").status, 404);
    assert_eq!(echo_once(SocketAddr::from(([127, 0, 0, 1], port)), b"hi").expect("echo"), b"hi");
    let ok = eventually(Duration::from_secs(5), || {
        let r = get(p.control(), "/v1/healthcheck/stream_routes/db");
        r.status == 200 && r.json()["nodes"][0]["status"] == "healthy"
    });
    assert!(ok, "{}", get(p.control(), "/v1/healthcheck/stream_routes/db").text());

    let schema = get(p.control(), "/v1/schema").json();
    let stream = schema["stream-plugins"].as_object().expect("stream-plugins object");
    for name in ["ip-restriction", "limit-conn", "stream-file-logger"] {
        let entry = &stream[name];
        assert!(
            entry["schema"].is_object() && entry["priority"].is_number() && entry["version"].is_number(),
            "{name}: {entry}"
        );
    }
    assert!(schema["main"]["stream_route"].is_object());
    let gc = common::request(p.control(), "POST", "/v1/gc", &[], b"").json();
    assert!(gc["subsystems"]["stream"].is_object(), "{gc}");
}

#[test]
fn stream_configuration_errors_name_the_key() {
    let p = Prefix::new("", "stream_plugins: [key-auth]\n", "");
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("stream_plugins[0]: `key-auth` is an HTTP plugin: list it under `plugins`"), "{out}");
    p.write_config("", "plugins: [stream-file-logger]\n");
    let (_, out) = start_refused(&p);
    assert!(
        out.contains("plugins[0]: `stream-file-logger` is a stream plugin: list it under `stream_plugins`"),
        "{out}"
    );
    p.write_config("", "");
    for (resources, expected) in [
        (
            "stream_routes:\n  - id: 1\n    plugins: {key-auth: {}}\n    upstream: {nodes: {\"127.0.0.1:1\": 1}}\n",
            "stream_routes[0] (id 1): plugins.key-auth: `key-auth` is an HTTP plugin; stream routes take stream plugins",
        ),
        (
            "stream_routes:\n  - id: 1\n    remote_addr: 300.1.1.1\n    upstream: {nodes: {\"127.0.0.1:1\": 1}}\n",
            "stream_routes[0] (id 1): remote_addr:",
        ),
        ("stream_routes:\n  - id: 1\n", "a stream route needs `upstream`, `upstream_id` or `service_id`"),
        (
            "stream_routes:\n  - id: 1\n    tls_passthrough: true\n    upstream: {nodes: {\"127.0.0.1:1\": 1}}\n",
            "routing on the SNI without terminating TLS needs `sni`",
        ),
        (
            "stream_routes:\n  - id: 1\n    plugins: {ip-restriction: {}}\n    upstream: {nodes: {\"127.0.0.1:1\": 1}}\n",
            "exactly one of `whitelist` and `blacklist` is required",
        ),
    ] {
        p.write_resources(resources);
        let (code, out) = start_refused(&p);
        assert_ne!(code, 0, "started with {resources}");
        assert!(out.contains(expected), "expected `{expected}` in:\n{out}");
    }
}

#[test]
fn stream_plugins_follow_config_on_plugin_reload() {
    let p = Prefix::new("", "stream_plugins: [ip-restriction, limit-conn]\n", "");
    let _w = Weir::start(&p);
    let listed = || {
        let schema = get(p.control(), "/v1/schema").json();
        let mut names: Vec<String> =
            schema["stream-plugins"].as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
        names.sort_unstable();
        names
    };
    assert_eq!(listed(), ["ip-restriction", "limit-conn"]);
    p.write_config("", "stream_plugins: [stream-file-logger]\n");
    let r = common::request(p.control(), "PUT", "/v1/plugins/reload", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(listed(), ["stream-file-logger"]);
    // A name of the wrong kind is refused, and the running set stays.
    p.write_config("", "stream_plugins: [key-auth]\n");
    let r = common::request(p.control(), "PUT", "/v1/plugins/reload", &[], b"");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("`key-auth` is an HTTP plugin"), "{}", r.text());
    assert_eq!(listed(), ["stream-file-logger"]);
}
