//! ACME against Debian's `pebble` (the ACME test server) on loopback: a DNS server of the test's
//! own points the names at 127.0.0.1, pebble's HTTPS is trusted through
//! `gateway.ssl.ssl_trusted_certificate`, and the real `weir` binary answers HTTP-01 on its
//! plain port and TLS-ALPN-01 on its TLS port. Issuance, a renewal, a renewal that fails (the
//! certificate in use stays), and a refused order's problem document.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::dns::{ips, DnsServer};
use common::pki::Pki;
use common::upstream::Upstream;
use common::*;

struct Pebble {
    child: std::process::Child,
    port: u16,
}

impl Pebble {
    fn start(pki: &Pki, dns: &DnsServer, http_port: u16, tls_port: u16) -> Option<Pebble> {
        if Command::new("pebble").arg("-h").stderr(Stdio::null()).output().is_err() {
            assert!(
                std::env::var_os("WEIR_REQUIRE_PEBBLE").is_none(),
                "WEIR_REQUIRE_PEBBLE is set but pebble is not installed"
            );
            return None;
        }
        let (port, mgmt) = (free_port(), free_port());
        let config = format!(
            r#"{{"pebble": {{"listenAddress": "127.0.0.1:{port}", "managementListenAddress": "127.0.0.1:{mgmt}",
              "certificate": "{}", "privateKey": "{}", "httpPort": {http_port}, "tlsPort": {tls_port},
              "ocspResponderURL": "", "externalAccountBindingRequired": false}}}}"#,
            pki.path("pebble.pem"),
            pki.path("pebble.key")
        );
        std::fs::write(pki.dir.join("pebble.json"), config).expect("pebble config");
        let log = std::fs::File::create(pki.dir.join("pebble.log")).expect("pebble log");
        let child = Command::new("pebble")
            .args(["-config", &pki.path("pebble.json"), "-dnsserver", &dns.addr.to_string()])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start pebble");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "pebble did not listen: {}", pki.read("pebble.log"));
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Pebble { child, port })
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `(issuer, serial)` of the certificate Weir serves for `sni`, read with `openssl s_client`.
fn served(tls: std::net::SocketAddr, sni: &str) -> Option<(String, String)> {
    let shown = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect {tls} -servername {sni} </dev/null 2>/dev/null | openssl x509 -noout -issuer -serial"
        ))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&shown.stdout).into_owned();
    let issuer = text.lines().find_map(|l| l.strip_prefix("issuer="))?.trim().to_owned();
    let serial = text.lines().find_map(|l| l.strip_prefix("serial="))?.trim().to_owned();
    Some((issuer, serial))
}

fn certificate(p: &Prefix, id: &str) -> serde_json::Value {
    let list = get(p.control(), "/v1/certificates").json();
    list["list"].as_array().and_then(|l| l.iter().find(|c| c["id"] == id).cloned()).unwrap_or_default()
}

fn wait_until(what: &str, secs: u64, w: &Weir, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "{what} did not happen; log:\n{}", w.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn certificates_are_issued_renewed_and_kept_when_a_renewal_fails() {
    let pki = Pki::new("acme");
    pki.ca("pebble-ca");
    pki.leaf("pebble", "pebble-ca", "/CN=pebble", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    let dns = DnsServer::start(60);
    for name in ["acme.test", "alpn.test"] {
        dns.set(name, ips(&["127.0.0.1"]));
    }
    let up = Upstream::start("site");
    let resources = format!(
        "ssls:\n  - {{id: site, snis: [acme.test], acme: {{}}}}\n  - {{id: alpn, snis: [alpn.test], acme: {{challenge: tls-alpn-01}}}}\n  - {{id: nowhere, snis: [nowhere.test], acme: {{}}}}\nroutes:\n  - {{id: r, uri: /*, upstream: {{nodes: {{\"{}\": 1}}}}}}\n",
        up.node()
    );
    let p = Prefix::new("", "", &resources);
    let Some(pebble) = Pebble::start(&pki, &dns, p.node_port, p.tls_port) else {
        return skip("certificates_are_issued_renewed_and_kept_when_a_renewal_fails", "pebble not installed");
    };
    std::fs::copy(pki.dir.join("pebble-ca.pem"), p.dir.join("conf/pebble-ca.pem")).expect("trust pebble");
    p.write_config(
        &format!(
            "  dns_resolver: [\"{}\"]\n  ssl:\n    listen: [{{ip: 127.0.0.1, port: {}}}]\n    ssl_trusted_certificate: conf/pebble-ca.pem\n  acme:\n    directory_url: https://127.0.0.1:{}/dir\n    email: ops@acme.test\n",
            dns.addr, p.tls_port, pebble.port
        ),
        "",
    );
    let w = Weir::start(&p);
    w.wait_ready(p.node());

    // Issued through HTTP-01 (site) and TLS-ALPN-01 (alpn), and served.
    for (id, sni) in [("site", "acme.test"), ("alpn", "alpn.test")] {
        wait_until(&format!("{id} issued"), 60, &w, || certificate(&p, id)["not_after"].is_i64());
        let (issuer, _) = served(p.tls(), sni).unwrap_or_default();
        assert!(issuer.contains("Pebble"), "{sni} served by {issuer:?}");
        assert_eq!(certificate(&p, id)["snis"], serde_json::json!([sni]));
    }
    let (_, key) = weir::acme::files(&p.dir.join("data"), "site");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key).expect("stored key").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the stored key is the owner's alone");
    let metrics = get(p.metrics(), "/weir/prometheus/metrics").text();
    assert!(
        metrics.contains("weir_ssl_certificate_expiry_timestamp_seconds{ssl_id=\"site\",sni=\"acme.test\"}"),
        "{metrics}"
    );
    // Its renewal is due at two thirds of its own lifetime.
    let site = certificate(&p, "site");
    let (renew_at, not_after) =
        (site["acme"]["renew_at"].as_i64().unwrap_or(0), site["not_after"].as_i64().unwrap_or(0));
    let now = chrono::Utc::now().timestamp();
    assert!(renew_at > now && renew_at < not_after, "renew at {renew_at}, expires {not_after}");

    // A refused order: pebble cannot reach nowhere.test; its problem document is logged.
    wait_until("the refused order's problem", 60, &w, || w.log_text().contains("urn:ietf:params:acme:error"));
    assert!(certificate(&p, "nowhere")["acme"]["last_error"].is_string());
    assert!(certificate(&p, "nowhere")["snis"].as_array().is_some_and(|s| s.is_empty()), "not served");

    // Renewal on request: a new certificate replaces the old one.
    let (_, before) = served(p.tls(), "acme.test").unwrap_or_default();
    let r = request(p.control(), "POST", "/v1/certificates/site/renew", &[], b"");
    assert_eq!(r.status, 202, "{}", r.text());
    wait_until("the renewal", 60, &w, || certificate(&p, "site")["acme"]["issued"] == 2);
    wait_until("the renewed certificate served", 10, &w, || {
        served(p.tls(), "acme.test").is_some_and(|(_, serial)| serial != before)
    });
    let (_, renewed) = served(p.tls(), "acme.test").unwrap_or_default();

    // The CA goes away: the renewal fails, and the certificate in use stays.
    drop(pebble);
    let r = request(p.control(), "POST", "/v1/certificates/site/renew", &[], b"");
    assert_eq!(r.status, 202);
    wait_until("the failed renewal", 30, &w, || certificate(&p, "site")["acme"]["last_error"].is_string());
    assert_eq!(served(p.tls(), "acme.test").map(|s| s.1), Some(renewed), "the renewed certificate stays");
    assert!(w.log_text().contains("ACME site: order failed"), "{}", w.log_text());
    assert_eq!(request(p.control(), "POST", "/v1/certificates/missing/renew", &[], b"").status, 404);
}

/// All `etcdctl get --prefix --keys-only` keys under `prefix`.
fn etcd_keys(etcd: &common::etcd::Etcd, prefix: &str) -> Vec<String> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &etcd.endpoint(), "get", "--prefix", "--keys-only", prefix])
        .output()
        .expect("etcdctl");
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

/// Two instances on one etcd: one orders each certificate, both serve it, and each answers the
/// CA for a name the other ordered. Every certificate names one host on 127.0.0.1 (instance a)
/// and one on 127.0.0.2 (instance b), and pebble checks both, so whichever instance holds the
/// lock, the other answers one challenge from what the fleet shares in etcd.
#[test]
fn a_fleet_on_etcd_orders_once_and_every_instance_serves_and_answers() {
    let Some(etcd) = common::etcd::Etcd::start() else {
        return skip("a_fleet_on_etcd_orders_once_and_every_instance_serves_and_answers", "etcd not installed");
    };
    let pki = Pki::new("acme-fleet");
    pki.ca("pebble-ca");
    pki.leaf("pebble", "pebble-ca", "/CN=pebble", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    let dns = DnsServer::start(60);
    for (name, ip) in [
        ("a.fleet.test", "127.0.0.1"),
        ("b.fleet.test", "127.0.0.2"),
        ("a.alpn.test", "127.0.0.1"),
        ("b.alpn.test", "127.0.0.2"),
    ] {
        dns.set(name, ips(&[ip]));
    }
    let (http_port, tls_port) = (free_port(), free_port());
    let Some(pebble) = Pebble::start(&pki, &dns, http_port, tls_port) else {
        return skip("a_fleet_on_etcd_orders_once_and_every_instance_serves_and_answers", "pebble not installed");
    };
    let admin_port = free_port();
    let instance = |ip: &str, admin: bool| {
        let admin = match admin {
            true => format!(
                "  admin:\n    admin_listen: {{ip: 127.0.0.1, port: {admin_port}}}\n    admin_key:\n      - {{name: ops, key: {}, role: admin}}\n",
                common::etcd::ADMIN_KEY
            ),
            false => "  admin:\n    enable_admin: false\n".into(),
        };
        let deployment = format!(
            "deployment:\n  config_provider: etcd\n  etcd:\n    host: [\"{}\"]\n    timeout: 2\n{admin}",
            etcd.endpoint()
        );
        let p = Prefix::new("", &deployment, "");
        std::fs::copy(pki.dir.join("pebble-ca.pem"), p.dir.join("conf/pebble-ca.pem")).expect("trust pebble");
        p.write_config(
            &format!(
                "  ssl:\n    listen: [{{ip: {ip}, port: {tls_port}}}]\n    ssl_trusted_certificate: conf/pebble-ca.pem\n  acme:\n    directory_url: https://127.0.0.1:{}/dir\n    email: ops@fleet.test\n",
                pebble.port
            ),
            &deployment,
        );
        let config = std::fs::read_to_string(p.dir.join("conf/config.yaml")).expect("config");
        let config = config.replacen(
            &format!("{{ip: 127.0.0.1, port: {}}}", p.node_port),
            &format!("{{ip: {ip}, port: {http_port}}}"),
            1,
        );
        p.write("conf/config.yaml", &config);
        let w = Weir::start(&p);
        (p, w)
    };
    let (pa, wa) = instance("127.0.0.1", true);
    let (pb, wb) = instance("127.0.0.2", false);
    wa.wait_ready(std::net::SocketAddr::from(([127, 0, 0, 1], admin_port)));
    for (id, snis, challenge) in [
        ("fleet", "[\"a.fleet.test\", \"b.fleet.test\"]", "http-01"),
        ("alpn", "[\"a.alpn.test\", \"b.alpn.test\"]", "tls-alpn-01"),
    ] {
        let body = format!("{{\"snis\": {snis}, \"acme\": {{\"challenge\": \"{challenge}\"}}}}");
        let r = common::etcd::admin(admin_port, "PUT", &format!("/apisix/admin/ssls/{id}"), &body);
        assert!(r.status == 200 || r.status == 201, "{}", r.text());
    }

    // Orders counted over the fleet: each instance's `issued` for the entry, summed.
    let issued = |id: &str| -> i64 {
        [&pa, &pb].iter().map(|p| certificate(p, id)["acme"]["issued"].as_i64().unwrap_or(0)).sum()
    };
    let tls_a = std::net::SocketAddr::from(([127, 0, 0, 1], tls_port));
    let tls_b = std::net::SocketAddr::from(([127, 0, 0, 2], tls_port));
    for (id, sni) in [("fleet", "a.fleet.test"), ("alpn", "b.alpn.test")] {
        for (p, w) in [(&pa, &wa), (&pb, &wb)] {
            wait_until(&format!("{id} stored on every instance"), 90, w, || certificate(p, id)["not_after"].is_i64());
        }
        // The orderer counts its order once its turn ends (after the lock's lease is revoked), so
        // the fleet's copy can be stored and served on both instances a moment before the count.
        wait_until(&format!("{id} counted as ordered"), 10, &wa, || issued(id) >= 1);
        assert_eq!(issued(id), 1, "{id} ordered once for the fleet; a:\n{}\nb:\n{}", wa.log_text(), wb.log_text());
        let (la, lb) = (wa.log_text(), wb.log_text());
        let ordered = format!("ACME {id}: ordering for the fleet");
        let mirrored = format!("ACME {id}: certificate from the fleet");
        assert!(
            (la.contains(&ordered) && lb.contains(&mirrored)) || (lb.contains(&ordered) && la.contains(&mirrored)),
            "one orders, the other takes the fleet's; a:\n{la}\nb:\n{lb}"
        );
        let (on_a, on_b) = (served(tls_a, sni), served(tls_b, sni));
        assert!(on_a.as_ref().is_some_and(|(issuer, _)| issuer.contains("Pebble")), "{on_a:?}");
        assert_eq!(on_a, on_b, "{id}: both instances serve the fleet's certificate");
    }
    let keys = etcd_keys(&etcd, "/weir_acme/");
    assert!(keys.contains(&"/weir_acme/certs/fleet".to_owned()), "{keys:?}");
    assert!(keys.iter().any(|k| k.starts_with("/weir_acme/accounts/")), "{keys:?}");
    assert_eq!(keys.iter().filter(|k| k.contains("/locks/") || k.contains("/challenges/")).count(), 0, "{keys:?}");
    assert!(
        !wa.log_text().contains("not a resource key") && !wb.log_text().contains("not a resource key"),
        "the fleet's keys stay out of the resources' prefix"
    );

    // A renewal asked of either instance is ordered (once) and reaches the other.
    let (_, before) = served(tls_a, "a.fleet.test").unwrap_or_default();
    let r = request(pb.control(), "POST", "/v1/certificates/fleet/renew", &[], b"");
    assert_eq!(r.status, 202, "{}", r.text());
    wait_until("the renewal served by a", 60, &wa, || {
        served(tls_a, "a.fleet.test").is_some_and(|(_, serial)| serial != before)
    });
    assert_eq!(served(tls_a, "b.fleet.test"), served(tls_b, "b.fleet.test"));
    wait_until("the renewal counted", 10, &wa, || issued("fleet") >= 2);
    assert_eq!(issued("fleet"), 2, "renewed once; a:\n{}\nb:\n{}", wa.log_text(), wb.log_text());
}
