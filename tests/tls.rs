//! TLS termination and HTTP/2 on the data plane, with real clients: curl (`--resolve` for SNI,
//! `--http2`, `--http2-prior-knowledge`), a rustls client for certificate rotation under load,
//! and raw HTTP/2 frames for the rapid-reset and CONTINUATION-flood attacks.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::upstream::Upstream;
use common::{eventually, start_refused, Prefix, Weir};

/// A self-signed ECDSA P-256 certificate for `names`, whose subject CN is `cn`: (cert, key) PEM.
fn cert(cn: &str, names: &[&str]) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .expect("certificate params");
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("self-sign");
    (cert.pem(), key.serialize_pem())
}

/// PEM text as an indented YAML block scalar.
fn block(pem: &str) -> String {
    let lines: Vec<String> = pem.lines().map(|l| format!("      {l}")).collect();
    format!("|\n{}", lines.join("\n"))
}

fn ssl_entry(id: &str, snis: &[&str], pair: &(String, String)) -> String {
    let snis: Vec<String> = snis.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "  - id: {id}\n    snis: [{}]\n    cert: {}\n    key: {}\n",
        snis.join(", "),
        block(&pair.0),
        block(&pair.1)
    )
}

fn route_to(up: &Upstream) -> String {
    format!("routes:\n  - id: r\n    uri: /*\n    upstream:\n      nodes:\n        \"{}\": 1\n", up.node())
}

/// Runs curl: (exit code, stdout, stderr).
fn curl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new("curl").args(["-sS", "--max-time", "10"]).args(args).output().expect("run curl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn has_curl() -> bool {
    Command::new("curl").arg("--version").output().is_ok()
}

/// The subject CN curl reports for `host` (SNI) on the TLS listener, or curl's error.
fn served_cn(tls: SocketAddr, host: &str) -> Result<String, String> {
    let resolve = format!("{host}:{}:127.0.0.1", tls.port());
    let url = format!("https://{host}:{}/get", tls.port());
    let (code, _, err) = curl(&["-k", "-v", "--resolve", &resolve, &url]);
    if code != 0 {
        return Err(err);
    }
    err.lines()
        .find_map(|l| l.split("subject:").nth(1))
        .and_then(|s| s.split("CN=").nth(1))
        .map(|cn| cn.split(',').next().unwrap_or(cn).trim().to_owned())
        .ok_or(err)
}

#[test]
fn certificates_are_chosen_by_sni_exact_then_longest_wildcard() {
    if !has_curl() {
        return common::skip("certificates_are_chosen_by_sni", "curl is not installed");
    }
    let up = Upstream::start("u");
    let exact = cert("exact", &["api.example.com"]);
    let wide = cert("wide", &["*.example.com"]);
    let narrow = cert("narrow", &["*.v1.example.com"]);
    let resources = format!(
        "{}ssls:\n{}{}{}",
        route_to(&up),
        ssl_entry("1", &["api.example.com"], &exact),
        ssl_entry("2", &["*.example.com"], &wide),
        ssl_entry("3", &["*.v1.example.com"], &narrow)
    );
    let p = Prefix::new("", "", &resources);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(served_cn(p.tls(), "api.example.com").as_deref(), Ok("exact"));
    assert_eq!(served_cn(p.tls(), "www.example.com").as_deref(), Ok("wide"));
    assert_eq!(served_cn(p.tls(), "x.v1.example.com").as_deref(), Ok("narrow"));
    // A name no certificate claims: the handshake fails (curl exit 35), nothing is served.
    let unknown = served_cn(p.tls(), "other.test");
    assert!(unknown.is_err(), "{unknown:?}");

    // Verified end to end: the client trusts the certificate, and the request reaches the upstream
    // with X-Forwarded-Proto https.
    let ca = p.dir.join("exact.pem");
    std::fs::write(&ca, &exact.0).expect("write ca");
    let resolve = format!("api.example.com:{}:127.0.0.1", p.tls_port);
    let url = format!("https://api.example.com:{}/get", p.tls_port);
    let (code, body, err) = curl(&["--cacert", &common::path_str(&ca), "--resolve", &resolve, &url]);
    assert_eq!(code, 0, "{err}");
    let echo: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(echo["headers"]["x-forwarded-proto"], "https", "{echo}");
    assert_eq!(echo["headers"]["host"], format!("api.example.com:{}", p.tls_port), "{echo}");
}

#[test]
fn fallback_sni_answers_unknown_names() {
    if !has_curl() {
        return common::skip("fallback_sni_answers_unknown_names", "curl is not installed");
    }
    let up = Upstream::start("u");
    let fallback = cert("fallback", &["default.example.com"]);
    let resources = format!("{}ssls:\n{}", route_to(&up), ssl_entry("1", &["default.example.com"], &fallback));
    let p = Prefix::new("", "", "");
    p.write_config(
        &format!(
            "  ssl:\n    listen: [{{ip: 127.0.0.1, port: {}}}]\n    fallback_sni: default.example.com\n",
            p.tls_port
        ),
        "",
    );
    p.write_resources(&resources);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(served_cn(p.tls(), "nobody.test").as_deref(), Ok("fallback"));
    // No SNI at all (an IP address in the URL): the fallback too.
    let (code, _, err) = curl(&["-k", "-v", &format!("https://127.0.0.1:{}/get", p.tls_port)]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("CN=fallback"), "{err}");
}

#[test]
fn http2_over_tls_and_cleartext_prior_knowledge() {
    if !has_curl() {
        return common::skip("http2_over_tls_and_cleartext", "curl is not installed");
    }
    let up = Upstream::start("u");
    let pair = cert("h2", &["h2.example.com"]);
    let resources = format!("{}ssls:\n{}", route_to(&up), ssl_entry("1", &["h2.example.com"], &pair));
    let p = Prefix::new("", "", &resources);
    p.write_config("", "");
    // A second plain listener with cleartext HTTP/2 next to HTTP/1.1.
    let h2c_port = p.add_h2c_listener();
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let h2c = SocketAddr::from(([127, 0, 0, 1], h2c_port));
    w.wait_ready(h2c);

    let resolve = format!("h2.example.com:{}:127.0.0.1", p.tls_port);
    let url = format!("https://h2.example.com:{}/over/tls?x=1", p.tls_port);
    let (code, out, err) = curl(&["-k", "--http2", "--resolve", &resolve, "-w", "\n%{http_version}", &url]);
    assert_eq!(code, 0, "{err}");
    let (body, version) = out.rsplit_once('\n').expect("version line");
    assert_eq!(version, "2", "{out}");
    let echo: serde_json::Value = serde_json::from_str(body).expect("echo JSON");
    assert_eq!(echo["path"], "/over/tls", "{echo}");
    assert_eq!(echo["query"], "x=1", "{echo}");
    assert_eq!(echo["headers"]["host"], format!("h2.example.com:{}", p.tls_port), "{echo}");
    assert_eq!(echo["headers"]["x-forwarded-proto"], "https", "{echo}");

    // A POST body over HTTP/2 reaches the upstream whole.
    let (code, out, err) = curl(&[
        "-k",
        "--http2",
        "--resolve",
        &resolve,
        "--data-binary",
        "hello over h2",
        &format!("https://h2.example.com:{}/post", p.tls_port),
    ]);
    assert_eq!(code, 0, "{err}");
    let echo: serde_json::Value = serde_json::from_str(&out).expect("echo JSON");
    assert_eq!(echo["body_len"], 13, "{echo}");

    // Cleartext HTTP/2 with prior knowledge; the same listener still serves HTTP/1.1.
    let url = format!("http://127.0.0.1:{h2c_port}/clear");
    let (code, out, err) = curl(&["--http2-prior-knowledge", "-w", "\n%{http_version}", &url]);
    assert_eq!(code, 0, "{err}");
    assert!(out.ends_with("\n2"), "{out}");
    let (code, out, err) = curl(&["--http1.1", "-w", "\n%{http_version}", &url]);
    assert_eq!(code, 0, "{err}");
    assert!(out.ends_with("\n1.1"), "{out}");
    // The hostile-path rules hold for HTTP/2 too.
    let (code, out, _) = curl(&[
        "--http2-prior-knowledge",
        "--path-as-is",
        "-w",
        "%{http_code}",
        &format!("http://127.0.0.1:{h2c_port}/a/../../x"),
    ]);
    assert_eq!(code, 0);
    assert!(out.ends_with("400"), "{out}");
    // A plain listener without enable_http2 does not speak it.
    let (code, _, _) = curl(&["--http2-prior-knowledge", &format!("http://{}/x", p.node())]);
    assert_ne!(code, 0);
}

#[test]
fn invalid_certificates_are_refused_at_load_with_the_reason() {
    let good = cert("good", &["a.example.com"]);
    let other = cert("other", &["b.example.com"]);
    let mismatched = (good.0.clone(), other.1.clone());
    let mut expired_params = rcgen::CertificateParams::new(vec!["old.example.com".to_owned()]).expect("params");
    expired_params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    expired_params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let key = rcgen::KeyPair::generate().expect("key");
    let expired = (expired_params.self_signed(&key).expect("sign").pem(), key.serialize_pem());
    let cases = [
        (
            ssl_entry("1", &["a.example.com"], &mismatched),
            "ssls[0] (id 1): cert: the key does not match the certificate",
        ),
        (ssl_entry("1", &["old.example.com"], &expired), "the certificate expired on 2021-01-01"),
        (ssl_entry("1", &["bad_name"], &good), "ssls[0] (id 1): snis[0]: `bad_name` is not a host name"),
        (
            format!("{}{}", ssl_entry("1", &["a.example.com"], &good), ssl_entry("2", &["A.example.com"], &good)),
            "ssls[1] (id 2): snis[0]: `a.example.com` is already claimed by ssls[0] (id 1)",
        ),
        (
            "  - id: 1\n    snis: [a.example.com]\n    cert: \"not pem\"\n    key: \"no\"\n".to_owned(),
            "ssls[0] (id 1): cert: ",
        ),
    ];
    let p = Prefix::new("", "", "");
    for (ssls, expected) in cases {
        p.write_resources(&format!("ssls:\n{ssls}"));
        let (code, out) = start_refused(&p);
        assert_ne!(code, 0, "started with {ssls}");
        assert!(out.contains(expected), "expected `{expected}` in:\n{out}");
        assert!(out.contains("resources.yaml"), "{out}");
    }
}

/// A rustls client that accepts any certificate and reports the served certificate's CN.
mod client {
    use super::*;
    use rustls::pki_types::ServerName;

    pub use common::tls_client::{config, config_preferring};

    /// An open TLS connection to the gateway.
    pub struct Conn {
        pub tls: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    }

    impl Conn {
        pub fn open(config: &Arc<rustls::ClientConfig>, addr: SocketAddr, sni: &str) -> Result<Conn, String> {
            let name = ServerName::try_from(sni.to_owned()).map_err(|e| e.to_string())?;
            let conn = rustls::ClientConnection::new(config.clone(), name).map_err(|e| e.to_string())?;
            let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
            tcp.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            while tls.conn.is_handshaking() {
                tls.conn.complete_io(&mut tls.sock).map_err(|e| e.to_string())?;
            }
            Ok(Conn { tls })
        }

        /// The served certificate's subject CN.
        pub fn cn(&self) -> String {
            let certs = self.tls.conn.peer_certificates().unwrap_or_default();
            certs.first().map(|leaf| common::tls_client::common_name(leaf.as_ref())).unwrap_or_default()
        }

        /// One keep-alive GET; the status.
        pub fn get(&mut self, host: &str) -> Result<u16, String> {
            let req = format!("GET /get HTTP/1.1\r\nHost: {host}\r\n\r\n");
            self.tls.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
            common::read_one_response(&mut self.tls)
        }
    }
}

#[test]
fn certificate_rotation_under_load_fails_no_request() {
    let up = Upstream::start("u");
    let v1 = cert("v1", &["rotate.example.com"]);
    let v2 = cert("v2", &["rotate.example.com"]);
    let p = Prefix::new("", "", "");
    // The certificate comes from files, as a renewal tool writes them.
    p.write("conf/rotate.crt", &v1.0);
    p.write("conf/rotate.key", &v1.1);
    p.write_resources(&format!(
        "{}ssls:\n  - id: 1\n    snis: [rotate.example.com]\n    cert_file: conf/rotate.crt\n    key_file: conf/rotate.key\n",
        route_to(&up)
    ));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let tls = p.tls();
    // Session resumption: a second connection of the same client resumes (TLS 1.3 tickets).
    let resuming = client::config(true);
    let mut first = client::Conn::open(&resuming, tls, "rotate.example.com").expect("first connection");
    assert_eq!(first.get("rotate.example.com"), Ok(200));
    let second = client::Conn::open(&resuming, tls, "rotate.example.com").expect("second connection");
    assert_eq!(second.tls.conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed));

    // Full handshakes from here on: each one asks the resolver for the certificate.
    let config = client::config(false);
    let mut kept = client::Conn::open(&config, tls, "rotate.example.com").expect("kept connection");
    assert_eq!(kept.cn(), "v1");
    assert_eq!(kept.get("rotate.example.com"), Ok(200));

    // Two clients make new handshakes and requests without pause while the files change.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let seen_v2_at = Arc::new(Mutex::new(None::<Instant>));
    let load: Vec<_> = (0..2)
        .map(|_| {
            let (stop, failures, done, seen, config) =
                (stop.clone(), failures.clone(), done.clone(), seen_v2_at.clone(), config.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let outcome = client::Conn::open(&config, tls, "rotate.example.com")
                        .and_then(|mut c| c.get("rotate.example.com").map(|s| (s, c.cn())));
                    match outcome {
                        Ok((200, cn)) => {
                            if cn == "v2" {
                                seen.lock().expect("lock").get_or_insert_with(Instant::now);
                            }
                        }
                        Ok((status, _)) => failures.lock().expect("lock").push(format!("status {status}")),
                        Err(e) => failures.lock().expect("lock").push(e),
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let changed = Instant::now();
    p.write("conf/rotate.key", &v2.1);
    p.write("conf/rotate.crt", &v2.0);
    assert!(
        eventually(Duration::from_secs(5), || seen_v2_at.lock().expect("lock").is_some()),
        "new handshakes never got the new certificate"
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    for t in load {
        t.join().expect("load thread");
    }
    let took = seen_v2_at.lock().expect("lock").map(|t| t.duration_since(changed));
    let failures = failures.lock().expect("lock");
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        done.load(Ordering::SeqCst),
        &failures[..failures.len().min(5)]
    );
    assert!(done.load(Ordering::SeqCst) > 20, "too few requests to judge");
    assert!(took.is_some_and(|t| t < Duration::from_millis(1500)), "the new certificate applied after {took:?}");
    // The connection opened before the change still works, on its original certificate.
    assert_eq!(kept.get("rotate.example.com"), Ok(200));
    assert_eq!(kept.cn(), "v1");
}

#[test]
fn a_session_resumes_on_every_tls_listener() {
    let up = Upstream::start("u");
    let pair = cert("shared", &["resume.example.com"]);
    let p = Prefix::new("", "", "");
    let second = common::free_port();
    // Two listeners with different configurations (HTTP/2 offered or not) share one session
    // cache and one ticket key schedule.
    p.write_config(
        &format!(
            "  ssl:\n    listen:\n      - {{ip: 127.0.0.1, port: {}}}\n      - {{ip: 127.0.0.1, port: {second}, enable_http2: false}}\n",
            p.tls_port
        ),
        "",
    );
    p.write_resources(&format!("{}ssls:\n{}", route_to(&up), ssl_entry("1", &["resume.example.com"], &pair)));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let resuming = client::config(true);
    let mut first = client::Conn::open(&resuming, p.tls(), "resume.example.com").expect("first listener");
    // The request makes the server's ticket arrive before the next connection.
    assert_eq!(first.get("resume.example.com"), Ok(200));
    let other = SocketAddr::from(([127, 0, 0, 1], second));
    let mut again = client::Conn::open(&resuming, other, "resume.example.com").expect("second listener");
    assert_eq!(again.tls.conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
    assert_eq!(again.get("resume.example.com"), Ok(200));
}

/// A client session store that counts the TLS 1.3 tickets the server sends.
#[derive(Debug)]
struct CountingTickets {
    inner: rustls::client::ClientSessionMemoryCache,
    received: AtomicUsize,
}

impl rustls::client::ClientSessionStore for CountingTickets {
    fn set_kx_hint(&self, name: rustls::pki_types::ServerName<'static>, group: rustls::NamedGroup) {
        self.inner.set_kx_hint(name, group)
    }
    fn kx_hint(&self, name: &rustls::pki_types::ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.inner.kx_hint(name)
    }
    fn set_tls12_session(
        &self,
        name: rustls::pki_types::ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.inner.set_tls12_session(name, value)
    }
    fn tls12_session(
        &self,
        name: &rustls::pki_types::ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.inner.tls12_session(name)
    }
    fn remove_tls12_session(&self, name: &rustls::pki_types::ServerName<'static>) {
        self.inner.remove_tls12_session(name)
    }
    fn insert_tls13_ticket(
        &self,
        name: rustls::pki_types::ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.received.fetch_add(1, Ordering::SeqCst);
        self.inner.insert_tls13_ticket(name, value)
    }
    fn take_tls13_ticket(
        &self,
        name: &rustls::pki_types::ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.inner.take_tls13_ticket(name)
    }
}

/// One TLS 1.3 ticket per handshake, full or resumed: enough for a client that connects again
/// and again (each resumption brings the next ticket), and what OpenSSL clients read cheapest.
#[test]
fn one_ticket_per_handshake_and_every_next_connection_resumes() {
    let up = Upstream::start("u");
    let pair = cert("tickets", &["tickets.example.com"]);
    let p = Prefix::new("", "", "");
    p.write_resources(&format!("{}ssls:\n{}", route_to(&up), ssl_entry("1", &["tickets.example.com"], &pair)));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let store = Arc::new(CountingTickets {
        inner: rustls::client::ClientSessionMemoryCache::new(16),
        received: AtomicUsize::new(0),
    });
    let mut config = (*client::config(true)).clone();
    config.resumption = rustls::client::Resumption::store(store.clone());
    let config = Arc::new(config);
    for i in 0..4 {
        let mut conn = client::Conn::open(&config, p.tls(), "tickets.example.com").expect("handshake");
        let kind = conn.tls.conn.handshake_kind();
        assert_eq!(kind, Some(if i == 0 { rustls::HandshakeKind::Full } else { rustls::HandshakeKind::Resumed }));
        // The answer comes after the tickets: reading it has read them.
        assert_eq!(conn.get("tickets.example.com"), Ok(200));
        assert_eq!(store.received.load(Ordering::SeqCst), i + 1, "tickets after connection {i}");
    }
}

/// The listener's suite order decides: AES-128-GCM-SHA256 even for a client that prefers
/// AES-256-GCM-SHA384 (as OpenSSL, curl and wrk do); a client that lists ChaCha20 first (one
/// without AES hardware) gets ChaCha20; a client offering only other suites is still served.
#[test]
fn the_listener_prefers_aes_128_gcm_unless_the_client_prefers_chacha20() {
    use rustls::CipherSuite as S;
    let up = Upstream::start("u");
    let pair = cert("suites", &["suites.example.com"]);
    let p = Prefix::new("", "", "");
    p.write_resources(&format!("{}ssls:\n{}", route_to(&up), ssl_entry("1", &["suites.example.com"], &pair)));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let chosen = |offer: &[S]| {
        let config = client::config_preferring(offer);
        let mut conn = client::Conn::open(&config, p.tls(), "suites.example.com").expect("handshake");
        assert_eq!(conn.get("suites.example.com"), Ok(200));
        conn.tls.conn.negotiated_cipher_suite().map(|s| s.suite())
    };
    let openssl_order = [S::TLS13_AES_256_GCM_SHA384, S::TLS13_CHACHA20_POLY1305_SHA256, S::TLS13_AES_128_GCM_SHA256];
    assert_eq!(chosen(&openssl_order), Some(S::TLS13_AES_128_GCM_SHA256));
    let no_aes_hardware = [S::TLS13_CHACHA20_POLY1305_SHA256, S::TLS13_AES_128_GCM_SHA256, S::TLS13_AES_256_GCM_SHA384];
    assert_eq!(chosen(&no_aes_hardware), Some(S::TLS13_CHACHA20_POLY1305_SHA256));
    assert_eq!(chosen(&[S::TLS13_AES_256_GCM_SHA384]), Some(S::TLS13_AES_256_GCM_SHA384));
    assert_eq!(chosen(&[S::TLS13_CHACHA20_POLY1305_SHA256]), Some(S::TLS13_CHACHA20_POLY1305_SHA256));
}

// ---- HTTP/2 attacks, with raw frames on the cleartext HTTP/2 listener ----

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HPACK for `GET /` with `:authority` (static-table indexes, literal values).
fn request_block() -> Vec<u8> {
    let mut b = vec![0x82, 0x86, 0x84, 0x01, 9];
    b.extend_from_slice(b"localhost");
    b
}

/// A literal header `x-pad: <n bytes>` without indexing (HPACK 6.2.2, 7-bit length prefix).
fn padding_header(n: usize) -> Vec<u8> {
    let mut b = vec![0x00, 5];
    b.extend_from_slice(b"x-pad");
    // Length with a 7-bit prefix.
    if n < 127 {
        b.push(n as u8);
    } else {
        b.push(127);
        let mut rest = n - 127;
        while rest >= 128 {
            b.push((rest % 128) as u8 | 0x80);
            rest /= 128;
        }
        b.push(rest as u8);
    }
    b.extend(std::iter::repeat_n(b'a', n));
    b
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads frames until GOAWAY or the end of the connection; (GOAWAY error code, frames read).
fn read_until_goaway(s: &mut TcpStream) -> (Option<u32>, usize) {
    let mut frames = 0;
    loop {
        let mut head = [0u8; 9];
        if s.read_exact(&mut head).is_err() {
            return (None, frames);
        }
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        if s.read_exact(&mut payload).is_err() {
            return (None, frames);
        }
        frames += 1;
        if head[3] == 0x7 && payload.len() >= 8 {
            return (Some(u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]])), frames);
        }
    }
}

fn h2c_gateway(up: &Upstream) -> (Prefix, Weir, SocketAddr) {
    h2c_gateway_on(&route_to(up))
}

/// A gateway serving cleartext HTTP/2 (prior knowledge) on `resources`.
fn h2c_gateway_on(resources: &str) -> (Prefix, Weir, SocketAddr) {
    let p = Prefix::new("", "", resources);
    let config = std::fs::read_to_string(p.dir.join("conf/config.yaml")).expect("read config");
    p.write(
        "conf/config.yaml",
        &config.replace(&format!("port: {}}}", p.node_port), &format!("port: {}, enable_http2: true}}", p.node_port)),
    );
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let addr = p.node();
    (p, w, addr)
}

#[test]
fn http2_rapid_reset_is_cut_off() {
    let up = Upstream::start("u");
    let (p, w, addr) = h2c_gateway(&up);
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    let block = request_block();
    // 5,000 streams opened and cancelled at once (CVE-2023-44487).
    for i in 0..5000u32 {
        let id = 1 + 2 * i;
        out.extend(frame(0x1, 0x4 | 0x1, id, &block));
        out.extend(frame(0x3, 0, id, &8u32.to_be_bytes()));
    }
    let _ = s.write_all(&out);
    let (goaway, _) = read_until_goaway(&mut s);
    // ENHANCE_YOUR_CALM, and far fewer than 5,000 requests reached the upstream.
    assert_eq!(goaway, Some(0xb), "the connection was not cut off");
    assert!(up.hits() < 500, "{} requests reached the upstream", up.hits());
    // Other clients are served meanwhile.
    assert_eq!(common::get(addr, "/still/up").status, 200);
    drop((p, w));
}

#[test]
fn http2_continuation_flood_is_bounded() {
    let up = Upstream::start("u");
    let (p, w, addr) = h2c_gateway(&up);
    let rss_before = w.rss();
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.set_write_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    // HEADERS without END_HEADERS, then CONTINUATION frames that never end the block: 64 MiB of
    // header data if the server kept reading (CVE-2024-27316 and kin).
    out.extend(frame(0x1, 0x1, 1, &request_block()));
    let _ = s.write_all(&out);
    let pad = frame(0x9, 0, 1, &padding_header(16_000));
    let started = Instant::now();
    let mut sent = 0usize;
    while sent < 64 << 20 {
        if s.write_all(&pad).is_err() {
            break;
        }
        sent += pad.len();
    }
    let (goaway, _) = read_until_goaway(&mut s);
    assert!(sent < 64 << 20 || goaway.is_some(), "the server read 64 MiB of one header block");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(up.hits(), 0, "the request must not reach the upstream");
    assert!(w.rss() < rss_before + (16 << 20), "RSS grew from {} to {}", rss_before, w.rss());
    assert_eq!(common::get(addr, "/still/up").status, 200);
    drop(p);
}

#[test]
fn http2_request_with_two_host_headers_is_refused() {
    let up = Upstream::start("u");
    let (p, _w, addr) = h2c_gateway(&up);
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    // :method GET, :scheme http, :path /, :authority localhost, then host: localhost and
    // host: internal (literal headers without indexing, new names).
    let mut block = request_block();
    for value in ["localhost", "internal"] {
        block.extend_from_slice(&[0x00, 4]);
        block.extend_from_slice(b"host");
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4 | 0x1, 1, &block));
    s.write_all(&out).expect("send");
    // The first HEADERS frame on stream 1 carries :status 400 (HPACK static index 12: 0x8c).
    let status = loop {
        let mut head = [0u8; 9];
        s.read_exact(&mut head).expect("frame");
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).expect("payload");
        if head[3] == 0x1 {
            break payload.first().copied();
        }
    };
    assert_eq!(status, Some(0x8c), "expected :status 400");
    assert_eq!(up.hits(), 0);
    drop(p);
}

/// An `h2` client connection to `addr` (cleartext, prior knowledge) with small windows, so that
/// flow control is exercised on every exchange; the connection is driven on `rt`.
async fn h2_client(addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(16 << 10)
        .initial_connection_window_size(64 << 10)
        .handshake(tcp)
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

/// Runs an HTTP/2 exchange to its end, or fails the test after 30 s (a stuck window would
/// otherwise hang it).
fn h2_within(exchange: impl std::future::Future<Output = ()>) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), exchange).await.expect("the exchange took over 30 s");
    });
}

fn h2_get(path: &str) -> http::Request<()> {
    http::Request::get(format!("http://localhost{path}")).body(()).expect("request")
}

/// Reads a response body to its end, giving the window back as it reads; its text.
async fn h2_text(mut body: h2::RecvStream) -> String {
    let mut text = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body chunk");
        let _ = body.flow_control().release_capacity(chunk.len());
        text.extend_from_slice(&chunk);
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// Reads a response body to its end, giving the window back as it reads; its length.
async fn h2_read(mut body: h2::RecvStream) -> u64 {
    let mut n = 0u64;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body chunk");
        n += chunk.len() as u64;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    n
}

#[test]
fn http2_bodies_flow_both_ways_through_small_windows() {
    let up = Upstream::start("u");
    let (_p, _w, addr) = h2c_gateway(&up);
    h2_within(async {
        let mut client = h2_client(addr).await;
        // 3 MB down through a 16 KiB stream window, next to a 2 MiB upload on the same
        // connection: both complete, byte for byte.
        let (down, _) = client.send_request(h2_get("/bytes/3000000"), true).expect("send GET");
        client = client.ready().await.expect("ready");
        let upload = http::Request::post("http://localhost/upload")
            .header("content-length", (2u64 << 20).to_string())
            .body(())
            .expect("request");
        let (up_resp, mut body) = client.send_request(upload, false).expect("send POST");
        let sender = tokio::spawn(async move {
            let mut left = 2usize << 20;
            while left > 0 {
                body.reserve_capacity(left.min(32 << 10));
                let cap = std::future::poll_fn(|cx| body.poll_capacity(cx)).await.expect("open").expect("capacity");
                let n = cap.min(left);
                body.send_data(bytes::Bytes::from(vec![b'u'; n]), n == left).expect("send data");
                left -= n;
            }
        });
        let down = down.await.expect("GET answer");
        assert_eq!(down.status(), 200);
        assert_eq!(down.headers()["content-length"], "3000000");
        assert!(down.headers().contains_key("date"), "{:?}", down.headers());
        assert_eq!(h2_read(down.into_body()).await, 3_000_000);
        sender.await.expect("sender");
        let up_resp = up_resp.await.expect("POST answer");
        assert_eq!(up_resp.status(), 200);
        assert_eq!(h2_text(up_resp.into_body()).await, (2u64 << 20).to_string());
        // Cookies sent as separate fields (as browsers do over HTTP/2) reach the HTTP/1.1
        // upstream as one field (RFC 9113 section 8.2.3).
        client = client.ready().await.expect("ready");
        let cookies = http::Request::get("http://localhost/cookies")
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .body(())
            .expect("request");
        let (echo, _) = client.send_request(cookies, true).expect("send cookies");
        let text = h2_text(echo.await.expect("cookie answer").into_body()).await;
        let echo: serde_json::Value = serde_json::from_str(&text).expect("echo JSON");
        assert_eq!(echo["headers"]["cookie"], "a=1; b=2", "{echo}");
        // An answer Weir makes itself (a refused path) has a body; to HEAD it is the head alone.
        client = client.ready().await.expect("ready");
        let head = http::Request::head("http://localhost/a/../../x").body(()).expect("request");
        let (refused, _) = client.send_request(head, true).expect("send HEAD");
        let refused = refused.await.expect("HEAD answered");
        assert_eq!(refused.status(), 400);
        assert!(refused.body().is_end_stream(), "DATA frames after the head of a HEAD answer");
    });
}

#[test]
fn http2_a_reset_stream_is_dropped_and_leaves_its_neighbours_alone() {
    let up = Upstream::start("u");
    let resources = route_to(&up);
    let p = Prefix::new("  access_log: {path: logs/access.log, format: \"$uri $status\"}\n", "", &resources);
    let config = std::fs::read_to_string(p.dir.join("conf/config.yaml")).expect("read config");
    p.write(
        "conf/config.yaml",
        &config.replace(&format!("port: {}}}", p.node_port), &format!("port: {}, enable_http2: true}}", p.node_port)),
    );
    let _w = Weir::start(&p);
    _w.wait_ready(p.node());
    let addr = p.node();
    let log = p.dir.join("logs/access.log");
    let logged = |line: &str| std::fs::read_to_string(&log).is_ok_and(|t| t.lines().any(|l| l == line));
    h2_within(async {
        let mut client = h2_client(addr).await;
        // No body: the request is with the upstream when the reset comes (a request still sending
        // its body is answered 400 for the failed body instead).
        let (_slow, mut slow_stream) = client.send_request(h2_get("/sleep/3000"), true).expect("send slow");
        client = client.ready().await.expect("ready");
        let (next, _) = client.send_request(h2_get("/sleep/300"), true).expect("send next");
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Cancelled while the upstream works on it: Weir drops the request there and then
        // (logged as 499, as nginx logs a client that left), long before the upstream answers.
        let reset_at = Instant::now();
        slow_stream.send_reset(h2::Reason::CANCEL);
        let next = next.await.expect("neighbour answered");
        assert_eq!(next.status(), 200);
        while !logged("/sleep/3000 499") {
            assert!(
                reset_at.elapsed() < Duration::from_millis(2000),
                "the reset request was not dropped: {:?}",
                std::fs::read_to_string(&log)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The connection goes on serving new streams.
        client = client.ready().await.expect("ready");
        let (again, _) = client.send_request(h2_get("/after"), true).expect("send again");
        let again = again.await.expect("answer after the reset");
        assert_eq!(again.status(), 200);
        assert!(h2_read(again.into_body()).await > 0);
    });
}

#[test]
fn http2_stop_lets_a_stream_in_flight_finish_then_goes_away() {
    let up = Upstream::start("u");
    let (_p, w, addr) = h2c_gateway(&up);
    h2_within(async {
        let mut client = h2_client(addr).await;
        let (slow, _) = client.send_request(h2_get("/sleep/800"), true).expect("send");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let status = Command::new("kill").args(["-TERM", &w.pid().to_string()]).status().expect("kill");
        assert!(status.success());
        // Answered whole although the gateway was told to stop meanwhile.
        let slow = slow.await.expect("the stream in flight is answered");
        assert_eq!(slow.status(), 200);
        assert!(h2_read(slow.into_body()).await > 0);
        // Then GOAWAY: no new stream is taken on this connection.
        let refused = async {
            match client.ready().await {
                Err(_) => true,
                Ok(mut c) => match c.send_request(h2_get("/late"), true) {
                    Err(_) => true,
                    Ok((r, _)) => r.await.is_err(),
                },
            }
        };
        assert!(refused.await, "a new stream was served after the stop");
    });
}

/// Sends `len` bytes on `body` as the server's window allows; `false` if the stream was reset
/// before all of them went (or the send failed).
async fn h2_upload(mut body: h2::SendStream<bytes::Bytes>, len: usize) -> bool {
    let mut left = len;
    while left > 0 {
        body.reserve_capacity(left.min(32 << 10));
        let Some(Ok(cap)) = std::future::poll_fn(|cx| body.poll_capacity(cx)).await else { return false };
        let n = cap.min(left);
        if body.send_data(bytes::Bytes::from(vec![b'u'; n]), n == left).is_err() {
            return false;
        }
        left -= n;
    }
    true
}

#[test]
fn http2_an_early_answer_lets_the_upload_finish_and_expect_continue_is_answered() {
    let up = Upstream::start("u");
    // A node nobody listens on: the proxy tries it (the request waits) and answers 502
    // without ever wanting the body.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port");
    let (_p, _w, addr) = h2c_gateway_on(&format!(
        "{}  - id: dead\n    uri: /dead/*\n    upstream:\n      retries: 0\n      nodes:\n        \"{dead}\": 1\n",
        route_to(&up)
    ));
    h2_within(async {
        let mut client = h2_client(addr).await;
        // Answered before its body is read (a refused path): the upload, far over the stream
        // window, still finishes and the answer is read whole; the stream is not reset under
        // the client while it sends.
        let refused = http::Request::post("http://localhost/a/../../x")
            .header("content-length", (600u32 << 10).to_string())
            .body(())
            .expect("request");
        let (resp, body) = client.send_request(refused, false).expect("send refused POST");
        let sent = tokio::spawn(h2_upload(body, 600 << 10));
        let resp = resp.await.expect("early answer");
        assert_eq!(resp.status(), 400);
        assert!(h2_read(resp.into_body()).await > 0, "the answer's JSON body");
        assert!(sent.await.expect("sender"), "the stream was reset while the client uploaded");
        // A client that waits for `100 Continue` gets it once the proxy wants the body (curl
        // otherwise waits a second before it sends).
        client = client.ready().await.expect("ready");
        let upload = http::Request::post("http://localhost/upload")
            .header("content-length", "100000")
            .header("expect", "100-continue")
            .body(())
            .expect("request");
        let (mut resp, body) = client.send_request(upload, false).expect("send POST");
        let interim =
            tokio::time::timeout(Duration::from_secs(5), std::future::poll_fn(|cx| resp.poll_informational(cx)))
                .await
                .expect("no 100 Continue within 5 s");
        assert_eq!(interim.expect("an interim answer").expect("well-formed").status(), 100);
        assert!(h2_upload(body, 100_000).await, "the upload was cut");
        let resp = resp.await.expect("POST answer");
        assert_eq!(resp.status(), 200);
        assert_eq!(h2_text(resp.into_body()).await, "100000");
        // Failed before its body is wanted: the answer comes with no `100 Continue` before
        // it, so the client never sends the body.
        client = client.ready().await.expect("ready");
        let held = http::Request::post("http://localhost/dead/x")
            .header("content-length", "100000")
            .header("expect", "100-continue")
            .body(())
            .expect("request");
        let (mut resp, mut body) = client.send_request(held, false).expect("send held POST");
        let interim =
            tokio::time::timeout(Duration::from_secs(5), std::future::poll_fn(|cx| resp.poll_informational(cx)))
                .await
                .expect("no answer within 5 s");
        assert!(interim.is_none(), "a 100 Continue before a refusal: {interim:?}");
        assert_eq!(resp.await.expect("early answer").status(), 502);
        body.send_reset(h2::Reason::CANCEL);
        assert_eq!(up.hits(), 1, "only the upload reached the upstream");
    });
}

/// HTTP/2 requests are held to HTTP/1.1's line limits: a target over 8 KiB gets 414 and a field
/// over 8 KiB 431 (JSON, as over HTTP/1.1), neither reaching the upstream; cookies are judged
/// one by one, so many of them still pass.
#[test]
fn http2_requests_meet_the_http1_line_limits() {
    let up = Upstream::start("u");
    let (_p, _w, addr) = h2c_gateway(&up);
    h2_within(async {
        let mut client = h2_client(addr).await;
        let mut ask = async |req: http::Request<()>| -> (u16, String) {
            client = client.clone().ready().await.expect("ready");
            let (resp, _) = client.send_request(req, true).expect("send");
            let resp = resp.await.expect("answer");
            (resp.status().as_u16(), h2_text(resp.into_body()).await)
        };
        let long = "a".repeat(9 << 10);
        let (status, text) = ask(h2_get(&format!("/{long}"))).await;
        assert_eq!(status, 414, "{}", &text[..text.len().min(300)]);
        assert_eq!(text, r#"{"error_msg":"414 Request-URI Too Large"}"#);
        let field = http::Request::get("http://localhost/f").header("x-big", &long).body(()).expect("request");
        let (status, text) = ask(field).await;
        assert_eq!(status, 431, "{}", &text[..text.len().min(300)]);
        assert_eq!(text, r#"{"error_msg":"431 Request Header Fields Too Large"}"#);
        assert_eq!(up.hits(), 0, "refused requests reach no upstream");
        // Just under the limits, and 3 x 4 KiB of cookies (12 KiB once joined): served.
        let near = "a".repeat((8 << 10) - 100);
        let mut ok = http::Request::get(format!("http://localhost/{near}")).header("x-near", &near[..(8 << 10) - 200]);
        for c in ["a", "b", "c"] {
            ok = ok.header("cookie", format!("{c}={}", "v".repeat(4 << 10)));
        }
        let (status, _) = ask(ok.body(()).expect("request")).await;
        assert_eq!(status, 200);
        assert_eq!(up.hits(), 1);
        // More than 100 field lines, and a head over 32 KiB in lines of 7 KiB: the framer's 431s,
        // with their JSON (not `h2`'s own bare 431 for a long header list).
        let mut many = http::Request::get("http://localhost/many");
        for i in 0..101 {
            many = many.header(format!("x-f{i}"), "1");
        }
        let (status, text) = ask(many.body(()).expect("request")).await;
        assert_eq!((status, text.as_str()), (431, r#"{"error_msg":"431 Request Header Fields Too Large"}"#));
        let mut big = http::Request::get("http://localhost/big");
        for i in 0..5 {
            big = big.header(format!("x-b{i}"), "b".repeat(7 << 10));
        }
        let (status, text) = ask(big.body(()).expect("request")).await;
        assert_eq!((status, text.as_str()), (431, r#"{"error_msg":"431 Request Header Fields Too Large"}"#));
        assert_eq!(up.hits(), 1, "refused requests reach no upstream");
        // 60 cookies and 45 other fields: 46 lines once the cookies are joined, so served.
        let mut crumbs = http::Request::get("http://localhost/crumbs");
        for i in 0..60 {
            crumbs = crumbs.header("cookie", format!("c{i}={}", "v".repeat(100)));
        }
        for i in 0..45 {
            crumbs = crumbs.header(format!("x-c{i}"), "1");
        }
        let (status, _) = ask(crumbs.body(()).expect("request")).await;
        assert_eq!(status, 200);
        assert_eq!(up.hits(), 2);
    });
}
