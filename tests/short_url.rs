//! The short-url plugin through the real binary: the envelope and every error, redirects, expiry,
//! concurrency, crash durability, and PostgreSQL shared by two instances (with an outage).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn resources(p: &Prefix, extra_meta: &str) -> String {
    format!(
        "routes:\n  - {{id: c, uri: /short/v1/urls, methods: [POST], plugins: {{short-url: {{}}}}}}\n  - {{id: r, uri: /s/*, methods: [GET, HEAD], plugins: {{short-url: {{action: resolve}}}}}}\nplugin_metadata:\n  - {{id: short-url, short_base: \"http://{}/s\"{extra_meta}}}\n",
        p.node()
    )
}

fn gateway_with(env: &[(&str, &str)], meta: &str, config_extra: &str) -> (Prefix, Weir) {
    let p = Prefix::new("", config_extra, "");
    p.write_resources(&resources(&p, meta));
    let w = Weir::spawn_env(&p, env);
    w.wait_ready(p.control());
    w.wait_ready(p.node());
    (p, w)
}

fn gateway() -> (Prefix, Weir) {
    gateway_with(&[], "", "")
}

fn create(p: &Prefix, body: &Value) -> Response {
    request(p.node(), "POST", "/short/v1/urls", &[("Content-Type", "application/json")], body.to_string().as_bytes())
}

fn path_of(short_url: &str) -> String {
    format!("/s/{}", short_url.rsplit('/').next().unwrap_or(""))
}

#[test]
fn creates_and_redirects() {
    let (p, _w) = gateway();
    let r = create(
        &p,
        &json!([{"origin_url": "https://example.com/a?x=1"}, {"origin_url": "http://example.org/", "valid_day": "30"}]),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let env = r.json();
    assert_eq!((env["code"].as_u64(), env["message"].as_str()), (Some(200), Some("success")));
    assert!(env["timestamp"].as_i64().is_some_and(|t| t > 1_700_000_000));
    let items = env["data"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["data"]["origin_url"], "https://example.com/a?x=1", "order kept");
    assert_eq!(items[1]["data"]["origin_url"], "http://example.org/");
    for it in &items {
        assert_eq!((it["code"].as_u64(), it["message"].as_str()), (Some(200), Some("success")));
        let code = it["data"]["short_code"].as_str().unwrap_or_default();
        assert!(code.len() == 8 && code.chars().all(|c| c.is_ascii_alphanumeric()), "{code}");
        assert_eq!(it["data"]["short_url"], format!("http://{}/s/{code}", p.node()));
    }
    let r = get(p.node(), &path_of(items[0]["data"]["short_url"].as_str().unwrap_or_default()));
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some("https://example.com/a?x=1"));
    assert_eq!(r.header("cache-control"), Some("private, max-age=90"));
    let r = request(p.node(), "HEAD", &path_of(items[1]["data"]["short_url"].as_str().unwrap_or_default()), &[], b"");
    assert_eq!((r.status, r.header("location")), (302, Some("http://example.org/")));
    let r = get(p.node(), "/s/AAAAAAAA");
    assert_eq!((r.status, r.json()["error_msg"].as_str()), (404, Some("short code `AAAAAAAA` not found")));
    assert_eq!(get(p.node(), "/s/short").status, 404);
    // A code has one URL: other segments around it are not it (they were skipped, so that
    // `/s/anything/<code>` redirected too).
    let code = items[0]["data"]["short_code"].as_str().unwrap_or_default();
    assert_eq!(get(p.node(), &format!("/s/{code}/qr")).status, 200);
    for other in [format!("/s/x/{code}"), format!("/s/a/b/{code}"), format!("/s/{code}/"), format!("/s/x/{code}/qr")] {
        let r = get(p.node(), &other);
        assert_eq!((r.status, r.header("location")), (404, None), "{other}: {}", r.text());
    }
    let r = get(p.node(), &format!("/s/{code}/qr/x"));
    assert_eq!(r.status, 404, "{}", r.text());
    // The same URL twice gets two codes.
    let r = create(&p, &json!([{"origin_url": "https://dup.example/"}, {"origin_url": "https://dup.example/"}])).json();
    assert_ne!(r["data"][0]["data"]["short_code"], r["data"][1]["data"]["short_code"]);
}

/// A redirect route with a path parameter before its `*` reads the code after its whole prefix,
/// as `/s/*` does (the last segment was taken, so `/t/acme/s/x/<code>` redirected too).
#[test]
fn a_parameter_route_names_the_code_after_its_prefix() {
    let p = Prefix::new("", "", "");
    p.write_resources(&format!(
        "routes:\n  - {{id: c, uri: /short/v1/urls, methods: [POST], plugins: {{short-url: {{}}}}}}\n  - {{id: r, uri: /t/:tenant/s/*, plugins: {{short-url: {{action: resolve}}}}}}\nplugin_metadata:\n  - {{id: short-url, short_base: \"http://{}/s\"}}\n",
        p.node()
    ));
    let w = Weir::spawn_env(&p, &[]);
    w.wait_ready(p.control());
    w.wait_ready(p.node());
    let r = create(&p, &json!([{"origin_url": "https://tenant.example/"}])).json();
    let code = r["data"][0]["data"]["short_code"].as_str().unwrap_or_default().to_string();
    let r = get(p.node(), &format!("/t/acme/s/{code}"));
    assert_eq!((r.status, r.header("location")), (302, Some("https://tenant.example/")), "{}", r.text());
    assert_eq!(get(p.node(), &format!("/t/acme/s/{code}/qr")).status, 200);
    for other in [format!("/t/acme/s/x/{code}"), format!("/t/acme/s/{code}/"), format!("/t/acme/s/x/{code}/qr")] {
        let r = get(p.node(), &other);
        assert_eq!((r.status, r.header("location")), (404, None), "{other}: {}", r.text());
    }
}

#[test]
fn redirect_status_follows_metadata() {
    let (p, _w) = gateway_with(&[], ", redirect_status: 301", "");
    let r = create(&p, &json!([{"origin_url": "https://example.com/"}])).json();
    let r = get(p.node(), &path_of(r["data"][0]["data"]["short_url"].as_str().unwrap_or_default()));
    assert_eq!((r.status, r.header("location")), (301, Some("https://example.com/")));
}

fn assert_request_error(r: &Response, status: u16, contains: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let env = r.json();
    assert_eq!(env["code"].as_u64(), Some(status as u64), "{env}");
    assert_eq!(env["data"], json!([]));
    assert!(env["message"].as_str().is_some_and(|m| m.contains(contains)), "{env}");
}

#[test]
fn request_level_errors() {
    let (p, _w) = gateway();
    let post = |body: &[u8], ct: &str| request(p.node(), "POST", "/short/v1/urls", &[("Content-Type", ct)], body);
    assert_request_error(&post(b"{not json", "application/json"), 400, "not valid JSON");
    assert_request_error(&post(b"{\"origin_url\":\"http://x.org\"}", "application/json"), 400, "JSON array");
    assert_request_error(&post(b"[]", "application/json"), 400, "empty array");
    assert_request_error(&post(b"[{\"origin_url\":\"http://x.org\"}]", "text/plain"), 415, "application/json");
    let many: Vec<Value> = (0..101).map(|i| json!({"origin_url": format!("http://x.org/{i}")})).collect();
    assert_request_error(&create(&p, &json!(many)), 400, "at most 100 per request, got 101");
    let hundred: Vec<Value> = (0..100).map(|i| json!({"origin_url": format!("http://x.org/{i}")})).collect();
    let r = create(&p, &json!(hundred));
    assert_eq!((r.status, r.json()["data"].as_array().map(Vec::len)), (200, Some(100)));
    let big = format!("[{{\"origin_url\":\"http://x.org/{}\"}}]", "a".repeat(2 << 20));
    assert_request_error(&post(big.as_bytes(), "application/json"), 413, "larger than");
    // A missing Content-Type is accepted.
    let r = request(p.node(), "POST", "/short/v1/urls", &[], b"[{\"origin_url\":\"http://x.org\"}]");
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn entry_level_errors_partial_success_and_order() {
    let (p, _w) = gateway();
    let r = create(
        &p,
        &json!([
            {"origin_url": "https://ok.example/1"},
            {"origin_url": "ftp://bad.example/"},
            {"origin_url": "https://ok.example/2", "valid_day": "07"},
            {"valid_day": "3"},
            {"origin_url": format!("http://{}/s/loop", p.node())},
            {"origin_url": "https://ok.example/3", "valid_day": 5},
        ]),
    );
    assert_eq!(r.status, 200);
    let env = r.json();
    assert_eq!((env["code"].as_u64(), env["message"].as_str()), (Some(207), Some("partial success")));
    let d = env["data"].as_array().cloned().unwrap_or_default();
    let codes: Vec<u64> = d.iter().map(|i| i["code"].as_u64().unwrap_or(0)).collect();
    assert_eq!(codes, vec![200, 400, 400, 400, 400, 200]);
    assert!(d[1]["message"].as_str().is_some_and(|m| m.starts_with("origin_url: scheme must be http or https")));
    assert!(d[2]["message"].as_str().is_some_and(|m| m.starts_with("valid_day: `07`")));
    assert_eq!(d[3]["message"], "origin_url: is required");
    assert!(d[4]["message"].as_str().is_some_and(|m| m.contains("redirect loop")));
    assert_eq!(d[1]["data"], json!({"origin_url": "ftp://bad.example/", "short_code": null, "short_url": null}));
    assert_eq!(d[3]["data"]["origin_url"], Value::Null);
    assert_eq!(d[5]["data"]["origin_url"], "https://ok.example/3");
    let r = create(&p, &json!([{"origin_url": "nope"}, {"origin_url": "http://x.org", "valid_day": "0"}]));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["code"], 400);
    assert_eq!(r.json()["data"].as_array().map(Vec::len), Some(2));
}

#[test]
fn expired_codes_answer_410_cached_or_not() {
    // One "day" lasts three seconds in this test (WEIR_SHORT_URL_DAY_SECS): expiry is counted
    // in whole seconds, so a one-second day could end a moment after creation, before the
    // first visit on a loaded machine (it failed so here once).
    let env = [("WEIR_SHORT_URL_DAY_SECS", "3")];
    let (p, w) = gateway_with(&env, "", "");
    let r = create(&p, &json!([{"origin_url": "https://soon.example/", "valid_day": "1"}, {"origin_url": "https://later.example/", "valid_day": "100"}])).json();
    let soon = path_of(r["data"][0]["data"]["short_url"].as_str().unwrap_or_default());
    let later = path_of(r["data"][1]["data"]["short_url"].as_str().unwrap_or_default());
    assert_eq!(get(p.node(), &soon).status, 302);
    std::thread::sleep(Duration::from_millis(3200));
    let r = get(p.node(), &soon);
    assert_eq!(
        (r.status, r.json()["error_msg"].as_str().map(|m| m.contains("expired"))),
        (410, Some(true)),
        "cache hit"
    );
    assert_eq!(get(p.node(), &later).status, 302);
    // After a restart nothing is cached: the stored expiry decides.
    drop(w);
    let _w = Weir::spawn_env(&p, &env);
    _w.wait_ready(p.node());
    assert_eq!(get(p.node(), &soon).status, 410, "storage read");
    assert_eq!(get(p.node(), &later).status, 302);
}

#[test]
fn concurrent_batches_get_distinct_codes() {
    let (p, _w) = gateway();
    let node = p.node();
    let threads: Vec<_> = (0..16)
        .map(|t| {
            std::thread::spawn(move || {
                let body: Vec<Value> =
                    (0..100).map(|i| json!({"origin_url": format!("https://c.example/{t}/{i}")})).collect();
                let r = request(node, "POST", "/short/v1/urls", &[], json!(body).to_string().as_bytes());
                assert_eq!(r.status, 200, "{}", r.text());
                r.json()["data"].as_array().cloned().unwrap_or_default()
            })
        })
        .collect();
    let mut codes = Vec::new();
    for t in threads {
        for it in t.join().unwrap_or_default() {
            codes.push((
                it["data"]["short_code"].as_str().unwrap_or_default().to_owned(),
                it["data"]["origin_url"].clone(),
            ));
        }
    }
    assert_eq!(codes.len(), 1600);
    let mut unique: Vec<&String> = codes.iter().map(|(c, _)| c).collect();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 1600);
    for (code, origin) in codes.iter().step_by(53) {
        let r = get(node, &format!("/s/{code}"));
        assert_eq!(r.header("location"), origin.as_str());
    }
}

#[test]
fn acknowledged_codes_survive_kill_9() {
    let (p, mut w) = gateway();
    let mut acked = Vec::new();
    for b in 0..5 {
        let body: Vec<Value> = (0..100).map(|i| json!({"origin_url": format!("https://k.example/{b}/{i}")})).collect();
        let r = create(&p, &json!(body));
        assert_eq!(r.status, 200);
        for it in r.json()["data"].as_array().cloned().unwrap_or_default() {
            acked.push((
                it["data"]["short_code"].as_str().unwrap_or_default().to_owned(),
                it["data"]["origin_url"].clone(),
            ));
        }
    }
    w.child.kill().expect("kill -9"); // SIGKILL, right after the last response
    let _ = w.child.wait();
    let w2 = Weir::spawn(&p);
    w2.wait_ready(p.node());
    for (code, origin) in &acked {
        let r = get(p.node(), &format!("/s/{code}"));
        assert_eq!((r.status, r.header("location")), (302, origin.as_str()), "{code} lost after kill -9");
    }
}

#[test]
fn stats_and_code_lookup_on_the_control_server() {
    let (p, _w) = gateway();
    let r = create(&p, &json!([{"origin_url": "https://s.example/", "valid_day": "3"}])).json();
    let code = r["data"][0]["data"]["short_code"].as_str().unwrap_or_default().to_owned();
    let stats = get(p.control(), "/v1/plugin/short-url/stats").json();
    assert_eq!(stats["backend"], "sqlite");
    assert_eq!((stats["codes"].as_u64(), stats["expired"].as_u64()), (Some(1), Some(0)));
    // Without the parameter router, `:code` is literal.
    assert_eq!(get(p.control(), &format!("/v1/plugin/short-url/codes/{code}")).status, 404);
    let schema = get(p.control(), "/v1/schema").json();
    let su = &schema["plugins"]["short-url"];
    for key in ["short_base", "redirect_status", "max_valid_day", "default_valid_day"] {
        assert!(su["metadata_schema"]["properties"][key].is_object(), "{key}");
    }
}

#[test]
fn code_lookup_with_the_parameter_router() {
    let p = Prefix::new("    router: radixtree_uri_with_parameter\n", "", "");
    p.write(
        "conf/config.yaml",
        &format!("gateway:\n  ssl: {{enable: false}}\n  node_listen: [{{ip: 127.0.0.1, port: {}}}]\n  worker_processes: 1\n  control:\n    port: {}\n    router: radixtree_uri_with_parameter\nplugin_attr:\n  prometheus:\n    export_addr: {{ip: 127.0.0.1, port: {}}}\n", p.node_port, p.control_port, p.metrics_port),
    );
    p.write_resources(&resources(&p, ""));
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let r = create(&p, &json!([{"origin_url": "https://l.example/", "valid_day": "2"}])).json();
    let code = r["data"][0]["data"]["short_code"].as_str().unwrap_or_default().to_owned();
    let rec = get(p.control(), &format!("/v1/plugin/short-url/codes/{code}")).json();
    assert_eq!(rec["origin_url"], "https://l.example/");
    assert_eq!(rec["expired"], false);
    assert_eq!(rec["expires_at"].as_i64().zip(rec["created_at"].as_i64()).map(|(e, c)| e - c), Some(2 * 86400));
    let r = get(p.control(), "/v1/plugin/short-url/codes/NOTACODE");
    assert_eq!((r.status, r.json()), (404, json!({"error_msg": "code[NOTACODE] not found"})));
}

/// A TCP relay to PostgreSQL that a test can cut (refuse and reset) and restore.
struct Relay {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
}

impl Relay {
    fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let addr = listener.local_addr().expect("addr");
        let up = Arc::new(AtomicBool::new(true));
        let up2 = up.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: the client sees a reset
                }
                let Ok(server) = TcpStream::connect(target) else { continue };
                for (mut from, mut to) in
                    [(client.try_clone().expect("clone"), server.try_clone().expect("clone")), (server, client)]
                {
                    let up = up2.clone();
                    std::thread::spawn(move || {
                        let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
                        let mut buf = [0u8; 16384];
                        loop {
                            if !up.load(Ordering::SeqCst) {
                                let _ = from.shutdown(std::net::Shutdown::Both);
                                let _ = to.shutdown(std::net::Shutdown::Both);
                                return;
                            }
                            match from.read(&mut buf) {
                                Ok(0) => return,
                                Ok(n) => {
                                    if to.write_all(&buf[..n]).is_err() {
                                        return;
                                    }
                                }
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                    ) => {}
                                Err(_) => return,
                            }
                        }
                    });
                }
            }
        });
        Relay { addr, up }
    }
}

fn pg_gateway(url: &str) -> (Prefix, Weir) {
    let attr = format!("plugin_attr:\n  short-url:\n    storage: {{backend: postgres, url: \"{url}\"}}\n");
    gateway_with(&[], "", &attr)
}

#[test]
fn a_server_error_is_logged_in_the_servers_words() {
    let Some(base) = std::env::var("WEIR_TEST_POSTGRES_URL").ok().filter(|u| !u.is_empty()) else {
        skip("a_server_error_is_logged_in_the_servers_words", "set WEIR_TEST_POSTGRES_URL (.ci/run does)");
        return;
    };
    let mut url = url::Url::parse(&base).expect("WEIR_TEST_POSTGRES_URL is a URL");
    url.set_path(&format!("weir_never_created_{}", std::process::id()));
    let (p, w) = pg_gateway(url.as_str());
    // The gateway starts (the store retries on demand) and says why the store is unavailable.
    let r = create(&p, &json!([{"origin_url": "https://missing.example/"}]));
    assert_eq!(r.status, 503, "{}", r.text());
    let said = eventually(Duration::from_secs(5), || {
        w.log_text().contains("3D000") && w.log_text().contains("does not exist")
    });
    assert!(said, "{}", w.log_text());
}

#[test]
fn two_instances_share_one_postgres() {
    let Some(db) = pg::PgDb::fresh("share") else { return };
    let (a, wa) = pg_gateway(db.url());
    let (b, _wb) = pg_gateway(db.url());
    assert!(wa.log_text().contains("short-url: storage postgres://"), "{}", wa.log_text());
    let r = create(&a, &json!([{"origin_url": "https://shared.example/"}])).json();
    let code = r["data"][0]["data"]["short_code"].as_str().unwrap_or_default().to_owned();
    let r = get(b.node(), &format!("/s/{code}"));
    assert_eq!(
        (r.status, r.header("location")),
        (302, Some("https://shared.example/")),
        "created through a, resolved through b"
    );
    assert_eq!(get(b.control(), "/v1/plugin/short-url/stats").json()["backend"], "postgres");
}

#[test]
fn postgres_outage_answers_503_and_recovers() {
    let Some(db) = pg::PgDb::fresh("outage") else { return };
    let url = db.parsed();
    let target: SocketAddr = format!("{}:{}", url.host_str().unwrap_or("127.0.0.1"), url.port().unwrap_or(5432))
        .parse()
        .expect("postgres host is an IP address in WEIR_TEST_POSTGRES_URL");
    let relay = Relay::start(target);
    let mut via = url.clone();
    let _ = via.set_port(Some(relay.addr.port()));
    let _ = via.set_host(Some("127.0.0.1"));
    let (p, w) = pg_gateway(via.as_str());
    // Another route keeps working throughout.
    let up = common::upstream::Upstream::start("other");
    let mut res = resources(&p, "");
    res = res.replace(
        "routes:\n",
        &format!("routes:\n  - {{id: o, uri: /other, upstream: {{nodes: {{\"{}\": 1}}}}}}\n", up.node()),
    );
    p.write_resources(&res);
    assert!(eventually(Duration::from_secs(3), || get(p.node(), "/other").status == 200));
    assert_eq!(create(&p, &json!([{"origin_url": "https://before.example/"}])).status, 200);

    relay.up.store(false, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    let r =
        create(&p, &json!([{"origin_url": "https://during.example/1"}, {"origin_url": "https://during.example/2"}]));
    assert_request_error(&r, 503, "nothing of this request was stored");
    assert_eq!(get(p.node(), "/other").status, 200, "other routes keep serving");

    relay.up.store(true, Ordering::SeqCst);
    let recovered = eventually(Duration::from_secs(10), || {
        create(&p, &json!([{"origin_url": "https://after.example/"}])).status == 200
    });
    assert!(recovered, "{}", w.log_text());
    let during: i64 = db
        .client()
        .query_one("SELECT count(*) FROM short_url_codes WHERE origin_url LIKE 'https://during.example/%'", &[])
        .expect("count")
        .get(0);
    assert_eq!(during, 0, "nothing half-written");
    assert!(w.log_text().contains("is back"), "{}", w.log_text());
}
