//! Mutual TLS against the real `weir` binary, with certificates made by the `openssl` command:
//! client certificates per server name (CA, depth, paths served without one, a Host that names
//! another server name), what a verified certificate tells the request, and client
//! certificates Weir presents to an upstream that demands one (`openssl s_server -Verify`).

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::pki::{yaml_block, Pki};
use common::upstream::Upstream;
use common::*;

const CLIENT_EXT: &str = "extendedKeyUsage=clientAuth\n";
const INTERMEDIATE_EXT: &str = "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n";

fn server_ext(names: &[&str]) -> String {
    let sans: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
    format!("subjectAltName={}\nextendedKeyUsage=serverAuth\n", sans.join(","))
}

/// `curl` to `https://<host>:<port><path>` connecting to 127.0.0.1, with a client certificate
/// `cert` (a `<name>` of `pki`), and `host_header` when set: (status, body). Status 0: the
/// handshake failed.
fn curl(pki: &Pki, port: u16, sni: &str, path: &str, cert: Option<&str>, host_header: Option<&str>) -> (u16, String) {
    let url = format!("https://{sni}:{port}{path}");
    let resolve = format!("{sni}:{port}:127.0.0.1");
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--path-as-is", "--max-time", "5", "--resolve", &resolve, "-w", "\n%{http_code}", &url]);
    if let Some(c) = cert {
        cmd.args(["--cert", &pki.path(&format!("{c}.pem")), "--key", &pki.path(&format!("{c}.key"))]);
    }
    if let Some(h) = host_header {
        cmd.args(["-H", &format!("Host: {h}")]);
    }
    let out = cmd.stderr(Stdio::null()).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

#[test]
fn client_certificates_are_required_per_server_name_and_reach_the_request() {
    let pki = Pki::new("listener");
    pki.ca("ca");
    pki.ca("other-ca");
    pki.leaf("server", "ca", "/CN=server", &server_ext(&["mtls.test", "open.test"]));
    pki.leaf("client", "ca", "/C=DE/O=Acme, Inc./CN=client one", CLIENT_EXT);
    pki.leaf("stranger", "other-ca", "/CN=stranger", CLIENT_EXT);
    pki.leaf("intermediate", "ca", "/CN=intermediate", INTERMEDIATE_EXT);
    pki.leaf("deep", "intermediate", "/CN=deep", CLIENT_EXT);
    // The deep client presents its chain: its own certificate and the intermediate.
    let chain = format!("{}{}", pki.read("deep.pem"), pki.read("intermediate.pem"));
    std::fs::write(pki.dir.join("deepchain.pem"), chain).expect("chain");
    std::fs::copy(pki.dir.join("deep.key"), pki.dir.join("deepchain.key")).expect("key");

    let up = Upstream::start("echo");
    let (cert, key, ca) = (pki.read("server.pem"), pki.read("server.key"), pki.read("ca.pem"));
    let resources = format!(
        r#"ssls:
  - id: mtls
    snis: [mtls.test]
    cert: {cert}
    key: {key}
    client:
      ca: {ca}
      skip_mtls_uri_regex: ["^/public/"]
  - id: open
    snis: [open.test]
    cert: {cert}
    key: {key}
routes:
  - id: r
    uri: /*
    plugins:
      proxy-rewrite:
        headers:
          set:
            X-Client-DN: $ssl_client_s_dn
            X-Client-Fingerprint: $ssl_client_fingerprint
            X-Client-Verify: $ssl_client_verify
    upstream:
      nodes:
        "{}": 1
"#,
        up.node(),
        cert = yaml_block(&cert, 4),
        key = yaml_block(&key, 4),
        ca = yaml_block(&ca, 6),
    );
    let p = Prefix::new("", "", &resources);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let port = p.tls_port;

    // A client of the CA: through, and the request knows who it is.
    let (status, body) = curl(&pki, port, "mtls.test", "/private", Some("client"), None);
    assert_eq!(status, 200, "{body}; log:\n{}", w.log_text());
    let echo: serde_json::Value = serde_json::from_str(&body).expect("echo json");
    let headers = &echo["headers"];
    assert_eq!(headers["x-client-dn"], r"CN=client one,O=Acme\, Inc.,C=DE", "{echo}");
    assert_eq!(headers["x-client-fingerprint"], pki.fingerprint("client").as_str(), "{echo}");
    assert_eq!(headers["x-client-verify"], "SUCCESS", "{echo}");

    // No certificate: only the paths `skip_mtls_uri_regex` names, matched on the normalized path.
    let (status, body) = curl(&pki, port, "mtls.test", "/private", None, None);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("client certificate is required"), "{body}");
    let (status, body) = curl(&pki, port, "mtls.test", "/public/x", None, None);
    assert_eq!(status, 200, "{body}");
    let echo: serde_json::Value = serde_json::from_str(&body).expect("echo json");
    assert_eq!(echo["headers"]["x-client-verify"], "NONE", "{echo}");
    for sneaky in ["/public/../private", "/public/%2e%2e/private", "//public/../private"] {
        let (status, body) = curl(&pki, port, "mtls.test", sneaky, None, None);
        assert_eq!(status, 400, "{sneaky}: {body}");
    }

    // A certificate of another CA, or a chain deeper than `depth` (1): no handshake.
    assert_eq!(curl(&pki, port, "mtls.test", "/public/x", Some("stranger"), None).0, 0);
    assert_eq!(curl(&pki, port, "mtls.test", "/public/x", Some("deepchain"), None).0, 0);

    // A server name without `client` asks for nothing; its connection cannot reach the mTLS
    // name's routes by naming that Host.
    assert_eq!(curl(&pki, port, "open.test", "/private", None, None).0, 200);
    let (status, body) = curl(&pki, port, "open.test", "/private", None, Some("mtls.test"));
    assert_eq!(status, 400, "{body}");
    assert_eq!(curl(&pki, port, "open.test", "/public/x", None, Some("mtls.test")).0, 200);

    // A larger depth lets the intermediate's client in.
    let deeper = resources.replace("      skip_mtls_uri_regex", "      depth: 2\n      skip_mtls_uri_regex");
    p.write_resources(&deeper);
    let deadline = Instant::now() + Duration::from_secs(10);
    while curl(&pki, port, "mtls.test", "/private", Some("deepchain"), None).0 != 200 {
        assert!(Instant::now() < deadline, "depth 2 not applied; log:\n{}", w.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn bad_client_settings_are_refused_with_their_key() {
    let pki = Pki::new("refused");
    pki.ca("ca");
    pki.leaf("server", "ca", "/CN=server", &server_ext(&["mtls.test"]));
    let (cert, key) = (yaml_block(&pki.read("server.pem"), 4), yaml_block(&pki.read("server.key"), 4));
    let p = Prefix::new(
        "",
        "",
        &format!("ssls:\n  - id: s\n    snis: [mtls.test]\n    cert: {cert}\n    key: {key}\n    client:\n      ca: not a certificate\n"),
    );
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("client.ca"), "{out}");
    let p = Prefix::new(
        "",
        "",
        "routes:\n  - id: r\n    uri: /\n    upstream:\n      scheme: https\n      nodes: {\"127.0.0.1:1\": 1}\n      tls: {client_cert_id: nope}\n",
    );
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("upstream.tls.client_cert_id") && out.contains("nope"), "{out}");
}

/// `openssl s_server` demanding a client certificate of `ca`, answering with a status page.
struct DemandingUpstream {
    child: std::process::Child,
    port: u16,
}

impl DemandingUpstream {
    fn start(pki: &Pki) -> DemandingUpstream {
        let port = free_port();
        let child = Command::new("openssl")
            .args(["s_server", "-accept", &port.to_string(), "-cert", "upstream.pem", "-key", "upstream.key"])
            .args(["-CAfile", "ca.pem", "-Verify", "1", "-verify_return_error", "-www", "-quiet"])
            .current_dir(&pki.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start openssl s_server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "s_server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        DemandingUpstream { child, port }
    }
}

impl Drop for DemandingUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn weir_presents_a_client_certificate_to_upstreams_that_demand_one() {
    let pki = Pki::new("upstream");
    pki.ca("ca");
    pki.leaf(
        "upstream",
        "ca",
        "/CN=upstream",
        &format!("{}subjectAltName=DNS:localhost\n", "extendedKeyUsage=serverAuth\n"),
    );
    pki.leaf("weir", "ca", "/CN=weir", CLIENT_EXT);
    let up = DemandingUpstream::start(&pki);
    let (cert, key) = (pki.read("weir.pem"), pki.read("weir.key"));
    let route = |id: &str, uri: &str, tls: &str| {
        format!(
            "  - id: {id}\n    uri: {uri}\n    upstream:\n      scheme: https\n      pass_host: node\n      nodes: {{\"localhost:{}\": 1}}\n      tls:\n        verify: false\n{tls}",
            up.port
        )
    };
    let resources = format!(
        "ssls:\n  - id: weir-client\n    type: client\n    cert: {}\n    key: {}\nroutes:\n{}\n{}\n{}\n",
        yaml_block(&cert, 4),
        yaml_block(&key, 4),
        route(
            "inline",
            "/inline",
            &format!("        client_cert: {}\n        client_key: {}", yaml_block(&cert, 8), yaml_block(&key, 8))
        ),
        route("by-id", "/by-id", "        client_cert_id: weir-client"),
        route("none", "/none", ""),
    );
    let p = Prefix::new("", "", &resources);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    for path in ["/inline", "/by-id"] {
        let r = get(p.node(), path);
        assert_eq!(r.status, 200, "{path}: {}; log:\n{}", r.text(), w.log_text());
        assert!(r.text().contains("Cipher"), "{path}: s_server's status page: {}", r.text());
    }
    let r = get(p.node(), "/none");
    assert_eq!(r.status, 502, "no client certificate, no answer: {}", r.text());
}
