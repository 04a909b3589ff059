//! The etcd resource provider against a real etcd server (`etcd` and `etcdctl` from Debian's
//! etcd-server and etcd-client packages; without them these tests are reported as skipped).
//! Resources written to etcd are served; changes apply within a second; invalid values are
//! skipped with their key; etcd going away leaves the last good resources serving, and changes
//! made meanwhile apply once it is back.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::upstream::Upstream;
use common::{eventually, get, request, Prefix, Weir};
use serde_json::json;

struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    client: u16,
    peer: u16,
    /// Serve clients over TLS, requiring a client certificate (files in `dir/pki`).
    tls: bool,
}

impl Etcd {
    fn start() -> Option<Etcd> {
        if Command::new("etcd").arg("--version").output().is_err()
            || Command::new("etcdctl").arg("version").output().is_err()
        {
            // CI installs etcd: there these tests must run, never skip.
            assert!(
                std::env::var_os("WEIR_REQUIRE_ETCD").is_none(),
                "WEIR_REQUIRE_ETCD is set but etcd is not installed"
            );
            return None;
        }
        let dir = std::env::temp_dir().join(format!("weir-etcd-{}-{}", std::process::id(), common::free_port()));
        let mut e = Etcd { child: None, dir, client: common::free_port(), peer: common::free_port(), tls: false };
        e.run();
        Some(e)
    }

    /// etcd serving clients over TLS with `--client-cert-auth`: a CA, a server certificate for
    /// 127.0.0.1, and a client certificate, all under `dir/pki`.
    fn start_tls() -> Option<Etcd> {
        let mut e = Etcd::start()?;
        e.stop();
        let pki = e.dir.join("pki");
        std::fs::create_dir_all(&pki).expect("pki dir");
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, "weir test CA");
        let ca = ca.self_signed(&ca_key).expect("sign CA");
        std::fs::write(pki.join("ca.crt"), ca.pem()).expect("write");
        for (name, usage) in [
            ("server", rcgen::ExtendedKeyUsagePurpose::ServerAuth),
            ("client", rcgen::ExtendedKeyUsagePurpose::ClientAuth),
        ] {
            let key = rcgen::KeyPair::generate().expect("key");
            let mut p =
                rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).expect("params");
            p.distinguished_name.push(rcgen::DnType::CommonName, name);
            p.extended_key_usages = vec![usage];
            let cert = p.signed_by(&key, &ca, &ca_key).expect("sign");
            std::fs::write(pki.join(format!("{name}.crt")), cert.pem()).expect("write");
            std::fs::write(pki.join(format!("{name}.key")), key.serialize_pem()).expect("write");
        }
        e.tls = true;
        e.run();
        Some(e)
    }

    fn pki(&self, file: &str) -> String {
        self.dir.join("pki").join(file).to_string_lossy().into_owned()
    }

    fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client)
    }

    fn run(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let child = Command::new("etcd")
            .args(["--name", "weir-test", "--data-dir"])
            .arg(&self.dir)
            .args(["--listen-client-urls", &self.endpoint(), "--advertise-client-urls", &self.endpoint()])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("weir-test={peer}")])
            .args(self.tls_args("--", "cert-file", "key-file", "trusted-ca-file", "server"))
            .args(if self.tls { &["--client-cert-auth"][..] } else { &[] })
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
        let up = eventually(Duration::from_secs(20), || self.ctl(&["endpoint", "health"]).is_ok());
        assert!(up, "etcd did not come up");
    }

    /// `--<cert>=... --<key>=... --<ca>=...` of certificate `name`, when serving TLS.
    fn tls_args(&self, dash: &str, cert: &str, key: &str, ca: &str, name: &str) -> Vec<String> {
        if !self.tls {
            return Vec::new();
        }
        vec![
            format!("{dash}{cert}={}", self.pki(&format!("{name}.crt"))),
            format!("{dash}{key}={}", self.pki(&format!("{name}.key"))),
            format!("{dash}{ca}={}", self.pki("ca.crt")),
        ]
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn ctl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoint()])
            .args(self.tls_args("--", "cert", "key", "cacert", "client"))
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn put(&self, key: &str, value: &str) {
        self.ctl(&["put", key, value]).unwrap_or_else(|e| panic!("etcdctl put {key}: {e}"));
    }

    fn del(&self, key: &str) {
        self.ctl(&["del", key]).unwrap_or_else(|e| panic!("etcdctl del {key}: {e}"));
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const ADMIN_KEY: &str = "test-admin-key";
const VIEWER_KEY: &str = "test-viewer-key";

/// A gateway on `etcd`; its Admin API listens on the returned port.
fn gateway_with_admin(etcd: &Etcd) -> (Prefix, Weir, u16) {
    let admin = common::free_port();
    let deployment = format!(
        "deployment:\n  config_provider: etcd\n  etcd:\n    host: [\"{}\"]\n    timeout: 2\n  admin:\n    admin_listen: {{ip: 127.0.0.1, port: {admin}}}\n    admin_key:\n      - {{name: ops, key: {ADMIN_KEY}, role: admin}}\n      - {{name: dash, key: {VIEWER_KEY}, role: viewer}}\n",
        etcd.endpoint()
    );
    let p = Prefix::new("", &deployment, "");
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    w.wait_ready(SocketAddr::from(([127, 0, 0, 1], admin)));
    (p, w, admin)
}

fn gateway(etcd: &Etcd) -> (Prefix, Weir) {
    let (p, w, _) = gateway_with_admin(etcd);
    (p, w)
}

fn route(uri: &str, up: &Upstream) -> String {
    format!("{{\"uri\": \"{uri}\", \"upstream\": {{\"nodes\": {{\"{}\": 1}}}}}}", up.node())
}

fn status(addr: SocketAddr, path: &str) -> u16 {
    get(addr, path).status
}

#[test]
fn resources_in_etcd_are_served_and_follow_changes() {
    let Some(etcd) = Etcd::start() else {
        return common::skip("resources_in_etcd_are_served_and_follow_changes", "etcd/etcdctl are not installed");
    };
    let up = Upstream::start("u");
    etcd.put("/weir/routes/1", &route("/one", &up));
    // Written behind Weir's back: not JSON, a schema error, a route naming a missing upstream.
    etcd.put("/weir/routes/bad-json", "{nope");
    etcd.put("/weir/routes/bad-uri", &route("no-slash", &up));
    etcd.put("/weir/routes/dangling", "{\"uri\": \"/dangling\", \"upstream_id\": \"missing\"}");
    etcd.put("/weir/routes/bad-node", "{\"uri\": \"/bad-node\", \"upstream\": {\"nodes\": {\"127.0.0.1:0\": 1}}}");
    let (p, w) = gateway(&etcd);
    assert_eq!(status(p.node(), "/one"), 200);
    let st = get(p.control(), "/v1/config_status").json();
    assert_eq!(st["provider"], "etcd", "{st}");
    assert_eq!(st["connected"], true, "{st}");
    assert!(st["revision"].as_i64().is_some_and(|r| r > 0), "{st}");
    let skipped = st["skipped"].to_string();
    assert!(skipped.contains("/weir/routes/bad-uri") && skipped.contains("/weir/routes/dangling"), "{st}");
    let log = w.log_text();
    assert!(log.contains("etcd /weir/routes/bad-json: the value is not JSON"), "{log}");
    assert!(log.contains("etcd /weir/routes/dangling:") && log.contains("upstream `missing` does not exist"), "{log}");

    // A change applies within a second, and so does a delete.
    etcd.put("/weir/routes/2", &route("/two", &up));
    assert!(eventually(Duration::from_secs(1), || status(p.node(), "/two") == 200), "the new route was not served");
    etcd.del("/weir/routes/1");
    assert!(
        eventually(Duration::from_secs(1), || status(p.node(), "/one") == 404),
        "the deleted route is still served"
    );
    // An upstream object and a route naming it, in that order.
    etcd.put("/weir/upstreams/u1", &format!("{{\"nodes\": {{\"{}\": 1}}}}", up.node()));
    etcd.put("/weir/routes/3", "{\"uri\": \"/three\", \"upstream_id\": \"u1\"}");
    assert!(eventually(Duration::from_secs(1), || status(p.node(), "/three") == 200));

    // Rebuilds reuse what earlier builds parsed; an entry that failed its own checks is checked
    // again every time, never reused as valid.
    assert_eq!(status(p.node(), "/bad-node"), 404);
    let st = get(p.control(), "/v1/config_status").json();
    assert!(st["skipped"].to_string().contains("/weir/routes/bad-node"), "{st}");

    // A plugin reload rebuilds from what etcd holds now (no copy is kept in memory).
    let r = common::request(p.control(), "PUT", "/v1/plugins/reload", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!((status(p.node(), "/two"), status(p.node(), "/three"), status(p.node(), "/one")), (200, 200, 404));
}

#[test]
fn etcd_outage_keeps_the_last_good_resources() {
    let Some(mut etcd) = Etcd::start() else {
        return common::skip("etcd_outage_keeps_the_last_good_resources", "etcd/etcdctl are not installed");
    };
    let up = Upstream::start("u");
    etcd.put("/weir/routes/1", &route("/one", &up));
    let (p, w) = gateway(&etcd);
    assert_eq!(status(p.node(), "/one"), 200);

    etcd.stop();
    assert!(
        eventually(Duration::from_secs(10), || get(p.control(), "/v1/config_status").json()["connected"] == false),
        "the outage was not reported"
    );
    assert_eq!(status(p.node(), "/one"), 200, "the last good resources must keep serving");
    assert_eq!(get(p.control(), "/v1/healthcheck").status, 200);

    // Back, with changes made while Weir was away: they apply after the reconnection.
    etcd.run();
    etcd.put("/weir/routes/2", &route("/two", &up));
    assert!(
        eventually(Duration::from_secs(15), || status(p.node(), "/two") == 200),
        "the change made during the outage was not applied: {}",
        get(p.control(), "/v1/config_status").text()
    );
    assert_eq!(get(p.control(), "/v1/config_status").json()["connected"], true);
    let log = w.log_text();
    assert_eq!(
        log.matches("serving the last good resources, retrying").count(),
        1,
        "log once per state change:\n{log}"
    );
}

#[test]
fn unreachable_etcd_at_start_serves_nothing_until_it_appears() {
    let Some(mut etcd) = Etcd::start() else {
        return common::skip("unreachable_etcd_at_start", "etcd/etcdctl are not installed");
    };
    let up = Upstream::start("u");
    etcd.put("/weir/routes/1", &route("/one", &up));
    etcd.stop();
    let (p, _w) = gateway(&etcd);
    assert_eq!(status(p.node(), "/one"), 404);
    assert_eq!(get(p.control(), "/v1/config_status").json()["connected"], false);
    etcd.run();
    assert!(eventually(Duration::from_secs(15), || status(p.node(), "/one") == 200), "never caught up");
}

/// One Admin API call with `key`.
fn admin_call(port: u16, method: &str, path: &str, key: Option<&str>, body: &str) -> common::Response {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(k) = key {
        headers.push(("X-API-KEY", k));
    }
    common::request(SocketAddr::from(([127, 0, 0, 1], port)), method, path, &headers, body.as_bytes())
}

#[test]
fn admin_api_writes_validated_resources_that_three_instances_serve() {
    let Some(etcd) = Etcd::start() else {
        return common::skip("admin_api_writes_validated_resources", "etcd/etcdctl are not installed");
    };
    let up = Upstream::start("u");
    let (p, _w, admin) = gateway_with_admin(&etcd);
    let (p2, _w2) = gateway(&etcd);
    let (p3, _w3) = gateway(&etcd);
    let call = |method: &str, path: &str, body: &str| admin_call(admin, method, path, Some(ADMIN_KEY), body);

    // Keys and roles.
    assert_eq!(admin_call(admin, "GET", "/apisix/admin/routes", None, "").status, 401);
    assert_eq!(admin_call(admin, "GET", "/apisix/admin/routes", Some("wrong"), "").status, 401);
    assert_eq!(admin_call(admin, "GET", "/apisix/admin/routes", Some(VIEWER_KEY), "").status, 200);
    assert_eq!(admin_call(admin, "PUT", "/apisix/admin/routes/1", Some(VIEWER_KEY), "{}").status, 403);

    // PUT creates (201), the value comes back with id and times; both instances serve it.
    let upstream = format!("{{\"nodes\": [{{\"host\": \"127.0.0.1\", \"port\": {}, \"weight\": 1}}]}}", up.addr.port());
    let r = call("PUT", "/apisix/admin/upstreams/u1", &upstream);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = call(
        "PUT",
        "/apisix/admin/routes/1",
        "{\"uri\": \"/one\", \"upstream_id\": \"u1\", \"enable_websocket\": false, \"status\": 1, \"priority\": 0, \"plugins\": {}}",
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let v = r.json();
    assert_eq!(v["key"], "/weir/routes/1");
    assert_eq!(v["value"]["id"], "1");
    assert!(v["value"]["create_time"].is_i64() && v["value"]["update_time"].is_i64(), "{v}");
    // Three instances converge on what one Admin API wrote.
    for gw in [p.node(), p2.node(), p3.node()] {
        assert!(eventually(Duration::from_secs(1), || status(gw, "/one") == 200), "not served by {gw}");
    }
    // The node list stays a list.
    let got = call("GET", "/weir/admin/upstreams/u1", "").json();
    assert!(got["value"]["nodes"].is_array(), "{got}");
    assert!(got["createdIndex"].is_i64() && got["modifiedIndex"].is_i64(), "{got}");
    // Replace: 200.
    assert_eq!(call("PUT", "/apisix/admin/routes/1", "{\"uri\": \"/one\", \"upstream_id\": \"u1\"}").status, 200);

    // Validation before etcd: the file's wording, nothing stored.
    let r = call("PUT", "/apisix/admin/routes/2", "{\"uri\": \"no-slash\", \"upstream_id\": \"u1\"}");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error_msg"].as_str().is_some_and(|m| m.contains("uri")), "{}", r.text());
    let r = call("PUT", "/apisix/admin/routes/2", "{\"uri\": \"/two\", \"upstream_id\": \"missing\"}");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("upstream `missing` does not exist"), "{}", r.text());
    assert_eq!(call("GET", "/apisix/admin/routes/2", "").json(), serde_json::json!({"message": "Key not found"}));

    // POST generates the id; the list counts it; paging.
    let r = call("POST", "/apisix/admin/routes", "{\"uri\": \"/posted\", \"upstream_id\": \"u1\"}");
    assert_eq!(r.status, 201, "{}", r.text());
    let posted = r.json()["value"]["id"].as_str().map(str::to_owned).expect("generated id");
    let listed = call("GET", "/apisix/admin/routes", "").json();
    assert_eq!(listed["total"], 2, "{listed}");
    // Found by schemathesis: a page far beyond the end overflowed the offset.
    let far = call("GET", "/apisix/admin/routes?page=18446744073709551615&page_size=18446744073709551615", "");
    assert_eq!((far.status, far.json()["list"].as_array().map(Vec::len)), (200, Some(0)), "{}", far.text());
    let page = call("GET", "/apisix/admin/routes?page=2&page_size=1", "").json();
    assert_eq!(page["list"].as_array().map(Vec::len), Some(1), "{page}");

    // PATCH merges, also on a sub-path; compare-and-swap with If-Match.
    let r = call("PATCH", "/apisix/admin/routes/1/plugins", "{\"example-plugin\": {\"i\": 1}}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["value"]["plugins"]["example-plugin"]["i"], 1);
    let current = call("GET", "/apisix/admin/routes/1", "").json();
    let stale = (current["modifiedIndex"].as_i64().expect("revision") - 1).to_string();
    let headers = [("Content-Type", "application/json"), ("X-API-KEY", ADMIN_KEY), ("If-Match", stale.as_str())];
    let body = "{\"uri\": \"/one\", \"upstream_id\": \"u1\"}";
    let addr = SocketAddr::from(([127, 0, 0, 1], admin));
    let r = common::request(addr, "PUT", "/apisix/admin/routes/1", &headers, body.as_bytes());
    assert_eq!(r.status, 412, "{}", r.text());

    // Consumers: PUT /consumers with the username in the body.
    let r = call(
        "PUT",
        "/apisix/admin/consumers",
        "{\"username\": \"jack\", \"plugins\": {\"key-auth\": {\"key\": \"k1\"}}}",
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(call("GET", "/apisix/admin/consumers/jack", "").status, 200);

    // An upstream in use cannot go; a route can.
    let r = call("DELETE", "/apisix/admin/upstreams/u1", "");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("routes/1"), "{}", r.text());
    let r = call("DELETE", &format!("/apisix/admin/routes/{posted}"), "");
    assert_eq!(r.json()["deleted"], "1", "{}", r.text());
    assert_eq!(call("DELETE", "/apisix/admin/routes/nope", "").status, 404);
}

#[test]
fn a_write_that_breaks_the_set_is_refused_and_never_empties_it() {
    let Some(etcd) = Etcd::start() else {
        return common::skip("a_write_that_breaks_the_set", "etcd/etcdctl are not installed");
    };
    let up = Upstream::start("u");
    etcd.put("/weir/routes/1", &route("/one", &up));
    etcd.put("/weir/consumers/alice", "{\"plugins\": {\"key-auth\": {\"key\": \"k1\"}}}");
    let (p, _w, admin) = gateway_with_admin(&etcd);
    assert_eq!(status(p.node(), "/one"), 200);
    let call = |method: &str, path: &str, key: &str, body: &str| admin_call(admin, method, path, Some(key), body);

    // A second consumer with alice's key: no single entry is wrong, the set is. Refused.
    let r = call(
        "PUT",
        "/apisix/admin/consumers",
        ADMIN_KEY,
        "{\"username\": \"bob\", \"plugins\": {\"key-auth\": {\"key\": \"k1\"}}}",
    );
    assert_eq!(r.status, 400, "{}", r.text());
    // Written behind Weir's back anyway: the instances keep the last good set.
    etcd.put("/weir/consumers/bob", "{\"plugins\": {\"key-auth\": {\"key\": \"k1\"}}}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(status(p.node(), "/one"), 200, "one bad write emptied the configuration");
    etcd.del("/weir/consumers/bob");

    // Viewers do not see credentials; sub-paths are for PATCH only.
    let alice = call("GET", "/apisix/admin/consumers/alice", VIEWER_KEY, "").json();
    assert_eq!(alice["value"]["plugins"]["key-auth"]["key"], "******", "{alice}");
    let alice = call("GET", "/apisix/admin/consumers/alice", ADMIN_KEY, "").json();
    assert_eq!(alice["value"]["plugins"]["key-auth"]["key"], "k1", "{alice}");
    assert_eq!(call("DELETE", "/apisix/admin/routes/1/plugins", ADMIN_KEY, "").status, 404);
    assert_eq!(call("GET", "/apisix/admin/routes/1", ADMIN_KEY, "").status, 200);
}

#[test]
fn an_admin_api_validation_leaves_no_trace() {
    let Some(etcd) = Etcd::start() else {
        return common::skip("an_admin_api_validation_leaves_no_trace", "etcd/etcdctl are not installed");
    };
    let (p, _w, admin) = gateway_with_admin(&etcd);
    let log = p.dir.join("validated-only.log");
    // A route whose file-logger would open a file, refused for another reason (its upstream
    // does not exist): the validation builds the plugin without opening anything.
    let body = json!({
        "uri": "/v",
        "upstream_id": "missing",
        "plugins": {"file-logger": {"path": log.to_string_lossy()}}
    });
    let r = admin_call(admin, "PUT", "/apisix/admin/routes/1", Some(ADMIN_KEY), &body.to_string());
    assert_eq!(r.status, 400, "{}", r.text());
    std::thread::sleep(Duration::from_millis(300));
    assert!(!log.exists(), "a refused write opened {}", log.display());

    // APISIX's documented shapes: the id in the body of a PUT, raw newlines inside strings,
    // schema validation that stores nothing.
    let up = Upstream::start("u");
    let body = format!(
        "{{\"id\": 7, \"uri\": \"/seven\", \"desc\": \"two\nlines\", \"upstream\": {{\"nodes\": {{\"{}\": 1}}}}}}",
        up.node()
    );
    let r = admin_call(admin, "PUT", "/apisix/admin/routes", Some(ADMIN_KEY), &body);
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(eventually(Duration::from_secs(5), || status(p.node(), "/seven") == 200));
    let ok = json!({"uri": "/x", "upstream_id": "missing"});
    let r = admin_call(admin, "POST", "/apisix/admin/schema/validate/routes", Some(ADMIN_KEY), &ok.to_string());
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("missing"), "{}", r.text());
    let good = json!({"uri": "/x", "plugins": {"file-logger": {"path": log.to_string_lossy()}}, "upstream": {"nodes": {"127.0.0.1:1": 1}}});
    let r = admin_call(admin, "POST", "/apisix/admin/schema/validate/routes", Some(ADMIN_KEY), &good.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!log.exists(), "a validation opened {}", log.display());
    assert_eq!(status(p.node(), "/x"), 404, "a validation stores nothing");
    // A method the path does not take: 405 with the methods it does (RFC 9110's `Allow`).
    for (method, path, allow) in [
        ("GET", "/apisix/admin/schema/validate/routes", "POST"),
        ("DELETE", "/apisix/admin/routes", "GET, PUT, POST"),
        ("POST", "/apisix/admin/routes/7", "GET, PUT, PATCH, DELETE"),
        ("POST", "/apisix/admin/consumers", "GET, PUT"),
    ] {
        let r = admin_call(admin, method, path, Some(ADMIN_KEY), "");
        assert_eq!((r.status, r.header("allow")), (405, Some(allow)), "{method} {path}: {}", r.text());
    }
}

#[test]
fn a_watch_compacted_past_its_revision_resyncs() {
    let Some(etcd) = Etcd::start() else {
        return common::skip("a_watch_compacted_past_its_revision_resyncs", "etcd/etcdctl are not installed");
    };
    let up = Upstream::start("u");
    etcd.put("/weir/routes/1", &route("/one", &up));
    let (p, w) = gateway(&etcd);
    assert_eq!(status(p.node(), "/one"), 200);

    // A watcher that stops reading falls behind: etcd stops sending to it once the stream's
    // buffers are full. Compacting the history past its revision meanwhile means etcd can only
    // cancel its watch ("compacted"); the instance must then read everything again.
    let pid = w.pid().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill").args([sig, &pid]).status().is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let written = runtime.block_on(async {
        let mut c = weir::etcd::Client::connect(&[etcd.endpoint()], Default::default()).await?;
        // Route changes, then enough traffic on the watch (~60 MB) to fill every buffer between
        // etcd and the stopped instance.
        for i in 0..50 {
            c.put(format!("/weir/routes/bulk-{i}"), route(&format!("/bulk-{i}"), &up)).await?;
        }
        let filler = format!("{{\"pad\": \"{}\"}}", "x".repeat(100_000));
        for _ in 0..600 {
            c.put("/weir/filler/x", filler.clone()).await?;
        }
        c.put("/weir/routes/2", route("/two", &up)).await?;
        c.delete("/weir/routes/1", false).await?;
        let rev = c.get("/weir/routes/2", false).await?.header.map_or(0, |h| h.revision);
        c.compact(rev, true).await?;
        Ok::<i64, String>(rev)
    });
    signal("-CONT");
    let rev = written.expect("write and compact through the etcd client");
    assert!(
        eventually(Duration::from_secs(20), || status(p.node(), "/two") == 200 && status(p.node(), "/one") == 404),
        "the changes behind the compaction were not applied: {}",
        get(p.control(), "/v1/config_status").text()
    );
    assert_eq!(status(p.node(), "/bulk-49"), 200);
    let log = w.log_text();
    assert!(log.contains("compacted at"), "the watch was not cancelled by the compaction:\n{log}");
    let st = get(p.control(), "/v1/config_status").json();
    assert!(st["revision"].as_i64().is_some_and(|r| r >= rev), "{st}");
    assert_eq!(st["connected"], true, "{st}");
}

#[test]
fn etcd_over_tls_with_a_client_certificate() {
    let Some(etcd) = Etcd::start_tls() else {
        return common::skip("etcd_over_tls_with_a_client_certificate", "etcd/etcdctl are not installed");
    };
    let up = Upstream::start("u");
    etcd.put("/weir/routes/1", &route("/one", &up));
    let deployment = |tls: &str| {
        format!(
            "deployment:\n  config_provider: etcd\n  etcd:\n    host: [\"{}\"]\n    timeout: 2\n    tls: {tls}\n  admin: {{enable_admin: false}}\n",
            etcd.endpoint()
        )
    };
    // Relative paths are under the prefix directory.
    let p = Prefix::new("", &deployment("{cert: pki/client.crt, key: pki/client.key, ca: pki/ca.crt}"), "");
    std::fs::create_dir_all(p.dir.join("pki")).expect("pki dir");
    for f in ["client.crt", "client.key", "ca.crt"] {
        p.write(&format!("pki/{f}"), &std::fs::read_to_string(etcd.pki(f)).expect("read pki"));
    }
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(status(p.node(), "/one"), 200);
    etcd.put("/weir/routes/2", &route("/two", &up));
    assert!(eventually(Duration::from_secs(2), || status(p.node(), "/two") == 200), "the watch over TLS");
    assert_eq!(get(p.control(), "/v1/config_status").json()["connected"], true);
    drop(w);

    // Without the client certificate etcd refuses the handshake: nothing is served, and the
    // status says why.
    let p = Prefix::new("", &deployment(&format!("{{ca: {}}}", etcd.pki("ca.crt"))), "");
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(status(p.node(), "/one"), 404);
    let st = get(p.control(), "/v1/config_status").json();
    assert_eq!(st["connected"], false, "{st}");
    drop(w);

    // A CA that did not sign etcd's certificate: refused the same way (verification is on).
    let other = rcgen::generate_simple_self_signed(vec!["other".to_owned()]).expect("cert");
    let p = Prefix::new("", &deployment("{ca: other-ca.crt}"), "");
    p.write("other-ca.crt", &other.cert.pem());
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(status(p.node(), "/one"), 404);
    drop(w);

    // Configuration errors name the key and the reason.
    for (tls, key, why) in [
        ("{verify: false}", "deployment.etcd.tls.verify", "deployment.etcd.tls.ca"),
        ("{cert: pki/client.crt}", "deployment.etcd.tls.key", "both `cert` and `key`"),
        ("{ca: missing.pem}", "deployment.etcd.tls.ca", "cannot read"),
        ("{ca: conf/config.yaml}", "deployment.etcd.tls.ca", "does not hold PEM certificates"),
    ] {
        let p = Prefix::new("", &deployment(tls), "");
        let (code, err) = common::start_refused(&p);
        assert_ne!(code, 0, "{tls}");
        assert!(err.contains(key) && err.contains(why), "{tls}: {err}");
    }
    let plain = "deployment:\n  config_provider: etcd\n  etcd:\n    host: [\"http://127.0.0.1:2379\"]\n    tls: {}\n";
    let (_, err) = common::start_refused(&Prefix::new("", plain, ""));
    assert!(err.contains("deployment.etcd.host[0]") && err.contains("plain http"), "{err}");
}

/// APISIX 3.x credentials through the Admin API, as its credential guide does it: a consumer
/// without credentials, two key-auth credentials under it, a route with key-auth. Each key
/// identifies the consumer and names its credential upstream; a credential duplicating another
/// consumer's key is refused naming both; deleting the consumer takes its credentials along.
#[test]
fn credentials_through_the_admin_api() {
    let Some(etcd) = Etcd::start() else {
        return common::skip("credentials_through_the_admin_api", "etcd/etcdctl are not installed");
    };
    let up = Upstream::start("u");
    let (p, _w, admin) = gateway_with_admin(&etcd);
    let call = |method: &str, path: &str, body: &str| admin_call(admin, method, path, Some(ADMIN_KEY), body);
    assert_eq!(call("PUT", "/apisix/admin/consumers", r#"{"username": "jack"}"#).status, 201);
    for (id, key) in [("key-auth-one", "auth-one"), ("key-auth-two", "auth-two")] {
        let body = json!({"plugins": {"key-auth": {"key": key}}}).to_string();
        let r = call("PUT", &format!("/apisix/admin/consumers/jack/credentials/{id}"), &body);
        assert_eq!(r.status, 201, "{}", r.text());
        assert_eq!(r.json()["value"]["id"], id, "{}", r.text());
    }
    // As APISIX's plugin pages write it: the credential's id in the body.
    let body = json!({"id": "cred-jack-jwt-auth", "plugins": {"jwt-auth": {"key": "jack-key", "secret": "jack-hs256-secret-jack-hs256-secret"}}});
    let r = call("PUT", "/apisix/admin/consumers/jack/credentials", &body.to_string());
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        r.json()["key"].as_str().map(|k| k.ends_with("/consumers/jack/credentials/cred-jack-jwt-auth")),
        Some(true)
    );
    let route = json!({"uri": "/hello", "plugins": {"key-auth": {}}, "upstream": {"nodes": {up.node(): 1}, "type": "roundrobin"}});
    assert_eq!(call("PUT", "/apisix/admin/routes/1", &route.to_string()).status, 201);
    for (key, id) in [("auth-one", "key-auth-one"), ("auth-two", "key-auth-two")] {
        let ok = eventually(Duration::from_secs(5), || {
            request(p.node(), "GET", "/hello", &[("apikey", key)], b"").status == 200
        });
        assert!(ok, "{key}");
        let r = request(p.node(), "GET", "/hello", &[("apikey", key), ("x-credential-identifier", "forged")], b"");
        assert_eq!(r.json()["headers"]["x-consumer-username"], "jack");
        assert_eq!(r.json()["headers"]["x-credential-identifier"], id);
    }
    // Listing: the consumer's credentials; the consumers list holds consumers only.
    let r = call("GET", "/apisix/admin/consumers/jack/credentials", "");
    assert_eq!(r.json()["total"], 3, "{}", r.text());
    assert_eq!(call("GET", "/apisix/admin/consumers", "").json()["total"], 1);
    let r = admin_call(admin, "GET", "/apisix/admin/consumers/jack/credentials/key-auth-one", Some(VIEWER_KEY), "");
    assert_eq!(r.json()["value"]["plugins"]["key-auth"]["key"], "******", "viewers never see a credential");

    // Another consumer claiming jack's key is refused, naming both.
    assert_eq!(call("PUT", "/apisix/admin/consumers", r#"{"username": "rose"}"#).status, 201);
    let dup = json!({"plugins": {"key-auth": {"key": "auth-one"}}}).to_string();
    let r = call("PUT", "/apisix/admin/consumers/rose/credentials/mine", &dup);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("`jack`") && r.text().contains("`rose`"), "{}", r.text());
    // Only auth plugins' credentials; no credential without its consumer.
    let r = call(
        "PUT",
        "/apisix/admin/consumers/rose/credentials/x",
        r#"{"plugins": {"limit-count": {"count": 1, "time_window": 60}}}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = call("PUT", "/apisix/admin/consumers/nobody/credentials/x", r#"{"plugins": {"key-auth": {"key": "zz"}}}"#);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("nobody"), "{}", r.text());

    // One credential deleted: its key stops working, the other keeps working.
    assert_eq!(call("DELETE", "/apisix/admin/consumers/jack/credentials/key-auth-two", "").status, 200);
    assert!(eventually(Duration::from_secs(5), || request(p.node(), "GET", "/hello", &[("apikey", "auth-two")], b"")
        .status
        == 401));
    assert_eq!(request(p.node(), "GET", "/hello", &[("apikey", "auth-one")], b"").status, 200);
    // The consumer deleted: its credentials go with it.
    assert_eq!(call("DELETE", "/apisix/admin/consumers/jack", "").status, 200);
    assert_eq!(call("GET", "/apisix/admin/consumers/jack/credentials", "").json()["total"], 0);
    assert!(eventually(Duration::from_secs(5), || request(p.node(), "GET", "/hello", &[("apikey", "auth-one")], b"")
        .status
        == 401));
}

#[test]
fn plugin_configs_through_the_admin_api() {
    let Some(etcd) = Etcd::start() else {
        return common::skip("plugin_configs_through_the_admin_api", "etcd/etcdctl are not installed");
    };
    let up = Upstream::start("u");
    let (p, _w, admin) = gateway_with_admin(&etcd);
    let call = |method: &str, path: &str, body: &str| admin_call(admin, method, path, Some(ADMIN_KEY), body);
    // APISIX's plugin-config page, as written (the upstream pointed at a local server).
    let config = json!({"desc": "enable limit-count plugin", "plugins": {"limit-count": {"count": 2, "time_window": 60, "rejected_code": 503}}});
    let r = call("PUT", "/apisix/admin/plugin_configs/1", &config.to_string());
    assert_eq!(r.status, 201, "{}", r.text());
    let route = json!({"uris": ["/index.html"], "plugin_config_id": 1, "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}});
    let r = call("PUT", "/apisix/admin/routes/1", &route.to_string());
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(eventually(Duration::from_secs(5), || get(p.node(), "/index.html").status == 200));
    let limited = eventually(Duration::from_secs(5), || get(p.node(), "/index.html").status == 503);
    assert!(limited, "the config's limit-count applies to the route");

    // A route naming a config that does not exist is refused; a config in use cannot be deleted.
    let bad = json!({"uri": "/other", "plugin_config_id": "nope", "upstream": {"nodes": {up.node(): 1}}});
    let r = call("PUT", "/apisix/admin/routes/2", &bad.to_string());
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("plugin config `nope` does not exist"), "{}", r.text());
    let r = call("DELETE", "/apisix/admin/plugin_configs/1", "");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("routes/1"), "{}", r.text());
    assert_eq!(call("GET", "/apisix/admin/plugin_configs", "").json()["total"], 1);
    // Once no route names it, it goes.
    assert_eq!(call("DELETE", "/apisix/admin/routes/1", "").status, 200);
    assert_eq!(call("DELETE", "/apisix/admin/plugin_configs/1", "").status, 200);
}

#[test]
fn admin_writes_are_judged_on_what_etcd_holds_even_right_after_other_writes() {
    let Some(etcd) = Etcd::start() else {
        return common::skip("admin_writes_are_judged_on_what_etcd_holds", "etcd/etcdctl are not installed");
    };
    let up = Upstream::start("u");
    let (p, _w, admin) = gateway_with_admin(&etcd);
    let call = |method: &str, path: &str, body: &str| admin_call(admin, method, path, Some(ADMIN_KEY), body);
    let upstream = format!("{{\"nodes\": {{\"{}\": 1}}}}", up.node());
    // Each route names the upstream written just before it: the write is judged once the
    // watcher has applied that one (never against a set without it).
    for i in 0..15 {
        assert_eq!(call("PUT", &format!("/apisix/admin/upstreams/u{i}"), &upstream).status, 201);
        let r = call(
            "PUT",
            &format!("/apisix/admin/routes/r{i}"),
            &format!("{{\"uri\": \"/r{i}\", \"upstream_id\": \"u{i}\"}}"),
        );
        assert_eq!(r.status, 201, "route {i}: {}", r.text());
    }
    // Written behind the Admin API's back, then named at once: seen, though the watcher may
    // not have applied it yet.
    for i in 0..5 {
        etcd.put(&format!("/weir/upstreams/side{i}"), &upstream);
        let r = call(
            "PUT",
            &format!("/apisix/admin/routes/s{i}"),
            &format!("{{\"uri\": \"/s{i}\", \"upstream_id\": \"side{i}\"}}"),
        );
        assert_eq!(r.status, 201, "side route {i}: {}", r.text());
    }
    // Deleted behind its back, then named at once: refused, though the watcher may not have
    // applied the deletion yet.
    etcd.del("/weir/upstreams/side0");
    let r = call("PUT", "/apisix/admin/routes/gone", "{\"uri\": \"/gone\", \"upstream_id\": \"side0\"}");
    assert_eq!(r.status, 400, "{}", r.text());
    // A patch that leaves no object is refused; the set is left alone.
    let r = call("PATCH", "/apisix/admin/routes/r1", "null");
    assert_eq!(r.status, 400, "{}", r.text());
    // A refused write leaves nothing behind in the set writes are judged on: the next change
    // builds r0 as stored, not as refused.
    let r = call("PUT", "/apisix/admin/routes/r0", "{\"uri\": \"/refused\", \"upstream_id\": \"missing\"}");
    assert_eq!(r.status, 400, "{}", r.text());
    // (s0 is broken since side0 went: a write that moves it in the list still passes.)
    let r = call("PUT", "/apisix/admin/routes/after", "{\"uri\": \"/after\", \"upstream_id\": \"u1\"}");
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(eventually(Duration::from_secs(5), || status(p.node(), "/after") == 200));
    for path in ["/r0", "/r1", "/r14", "/s4"] {
        assert_eq!(status(p.node(), path), 200, "{path}");
    }
    assert_eq!(status(p.node(), "/refused"), 404);
}

#[test]
fn route_changes_apply_as_patches_and_a_bad_route_is_still_named() {
    let Some(etcd) = Etcd::start() else {
        return common::skip("route_changes_apply_as_patches", "etcd/etcdctl are not installed");
    };
    let (up, other) = (Upstream::start("u"), Upstream::start("v"));
    etcd.put("/weir/upstreams/u1", &format!("{{\"nodes\": {{\"{}\": 1}}}}", up.node()));
    etcd.put(
        "/weir/services/s1",
        "{\"upstream_id\": \"u1\", \"plugins\": {\"proxy-rewrite\": {\"headers\": {\"set\": {\"x-from\": \"s1\"}}}}}",
    );
    etcd.put("/weir/routes/1", &route("/one", &up));
    let (p, w, admin) = gateway_with_admin(&etcd);
    let patches = || w.log_text().matches("(a patch of 1 route(s)").count();
    let builds = || w.log_text().matches(" ms (built in ").count();
    let served = |path: &str| eventually(Duration::from_secs(2), || status(p.node(), path) == 200);
    // The log line follows the swap that serves the change, so a count is awaited, not read.
    let counted = |want: (usize, usize)| eventually(Duration::from_secs(2), || (builds(), patches()) == want);

    // The first change after start-up builds the whole set; a change to routes only after that
    // patches the snapshot serving.
    etcd.put("/weir/routes/2", &route("/two", &up));
    assert!(served("/two"));
    assert!(counted((1, 0)), "{}", w.log_text());
    etcd.put("/weir/routes/3", "{\"uri\": \"/three\", \"service_id\": \"s1\"}");
    assert!(served("/three"));
    let echo = get(p.node(), "/three").json();
    assert_eq!((echo["node"].as_str(), echo["headers"]["x-from"].as_str()), (Some("u"), Some("s1")), "{echo}");
    assert!(counted((1, 1)), "{}", w.log_text());
    // Another route of the same URI, with a key before route 3's: defined first, it wins.
    etcd.put("/weir/routes/20", &route("/three", &other));
    assert!(eventually(Duration::from_secs(2), || get(p.node(), "/three").json()["node"] == "v"));
    assert!(counted((1, 2)), "{}", w.log_text());

    // A bad route written behind Weir's back: named and skipped as before; the rest serves.
    etcd.put("/weir/routes/4", &route("no-slash", &up));
    let skipped = || get(p.control(), "/v1/config_status").json()["skipped"].to_string();
    assert!(eventually(Duration::from_secs(2), || skipped().contains("/weir/routes/4")), "{}", skipped());
    assert!(w.log_text().contains("etcd /weir/routes/4:"), "{}", w.log_text());
    assert_eq!((status(p.node(), "/one"), status(p.node(), "/three")), (200, 200));
    // Mended: the set held a skipped key, so it is built whole; then patches resume.
    etcd.put("/weir/routes/4", &route("/four", &up));
    assert!(served("/four"));
    assert_eq!(skipped(), "[]");
    assert!(counted((3, 2)), "{}", w.log_text());
    etcd.del("/weir/routes/2");
    assert!(eventually(Duration::from_secs(2), || status(p.node(), "/two") == 404));
    assert!(counted((3, 3)), "{}", w.log_text());

    // The Admin API judges a route write by a patch too, and still names what is wrong.
    let call = |path: &str, body: &str| admin_call(admin, "PUT", path, Some(ADMIN_KEY), body);
    assert_eq!(call("/apisix/admin/routes/5", "{\"uri\": \"/five\", \"upstream_id\": \"u1\"}").status, 201);
    assert!(served("/five"));
    let r = call("/apisix/admin/routes/6", "{\"uri\": \"/six\", \"upstream_id\": \"missing\"}");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("upstream `missing` does not exist"), "{}", r.text());
    // A limit-count group is checked against every route's: that change is built whole.
    let grouped = json!({
        "uri": "/seven", "upstream_id": "u1",
        "plugins": {"limit-count": {"count": 5, "time_window": 60, "group": "g"}},
    })
    .to_string();
    etcd.put("/weir/routes/7", &grouped);
    assert!(served("/seven"));
    assert!(eventually(Duration::from_secs(2), || builds() == 4), "{}", w.log_text());
    let mismatched = grouped.replace("\"count\":5", "\"count\":6").replace("/seven", "/eight");
    let r = call("/apisix/admin/routes/8", &mismatched);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("group conf mismatched"), "{}", r.text());
}
