//! limit-count, limit-req and limit-conn end to end: the real binary on loopback, a real
//! upstream, and real `redis-server`s for the shared policies (skipped, and reported so, when
//! Redis is not installed; required in CI). Codes, bodies and headers as clients see them,
//! bursts and delays by the clock, groups, sliding windows, places given back when a client
//! goes away, Redis outages, the APISIX documentation's examples loaded unchanged, and a flood
//! of distinct keys held at the configured bound, as the Prometheus exporter reports it.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::redis::Redis;
use common::upstream::Upstream;
use common::{eventually, get, request, start, Prefix, Weir};
use serde_json::json;

fn route(id: &str, uri: &str, u: &Upstream, plugins: &str) -> String {
    format!("  - {{id: {id}, uri: \"{uri}\", upstream: {{nodes: {{\"{}\": 1}}}}, plugins: {plugins}}}\n", u.node())
}

/// GETs `path` from `n` threads at once: (status, seconds taken) of each, by status then time.
fn concurrent(addr: SocketAddr, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<(u16, f64)> {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (b, path) = (barrier.clone(), path.to_owned());
            let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            std::thread::spawn(move || {
                let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                b.wait();
                let t = Instant::now();
                let r = request(addr, "GET", &path, &h, b"");
                (r.status, t.elapsed().as_secs_f64())
            })
        })
        .collect();
    let mut out: Vec<(u16, f64)> = handles.into_iter().map(|h| h.join().expect("client thread")).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    out
}

/// One keep-alive connection sending GETs, one at a time.
struct KeepAlive {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl KeepAlive {
    fn open(addr: SocketAddr) -> KeepAlive {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        KeepAlive { reader: BufReader::new(s.try_clone().expect("clone")), writer: s }
    }

    /// The status of `GET path` with `headers`.
    fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> u16 {
        let mut head = format!("GET {path} HTTP/1.1\r\nHost: limiters\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        self.writer.write_all(head.as_bytes()).expect("write");
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("status line");
        let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            self.reader.read_line(&mut h).expect("header");
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; len];
        self.reader.read_exact(&mut body).expect("body");
        status
    }
}

/// The value of a sample in the exporter's text (`weir_limiter_keys{plugin="limit-req"}`).
fn metric(p: &Prefix, sample: &str) -> Option<f64> {
    let text = get(p.metrics(), "/weir/prometheus/metrics").text();
    text.lines().find_map(|l| l.strip_prefix(sample).and_then(|v| v.trim().parse().ok()))
}

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The limiter configurations of the APISIX 3.x documentation (docs/en/latest/plugins/
/// limit-count.md, limit-req.md, limit-conn.md), exactly as written there (the limit-req PATCH
/// example merged into the configuration it patches).
const APISIX_EXAMPLES: &[(&str, &str)] = &[
    (
        "limit-count",
        r#"{"count": 1, "time_window": 30, "rejected_code": 429, "key_type": "var", "key": "remote_addr", "policy": "local"}"#,
    ),
    (
        "limit-count",
        r#"{"count": 1, "time_window": 30, "rejected_code": 429, "key_type": "var_combination", "key": "$remote_addr $consumer_name"}"#,
    ),
    (
        "limit-count",
        r#"{"count": 1, "time_window": 30, "rejected_code": 429, "key": "remote_addr", "policy": "redis", "redis_host": "192.168.xxx.xxx", "redis_port": 6379, "redis_password": "p@ssw0rd", "redis_database": 1}"#,
    ),
    (
        "limit-count",
        r#"{"count": 1, "time_window": 30, "rejected_code": 429, "key": "remote_addr", "policy": "redis-cluster", "redis_cluster_nodes": ["192.168.xxx.xxx:6379", "192.168.xxx.xxx:16379"], "redis_password": "p@ssw0rd", "redis_cluster_name": "redis-cluster-1", "redis_cluster_ssl": true}"#,
    ),
    (
        "limit-count",
        r#"{"count": 1, "time_window": 30, "rejected_code": 429, "key": "remote_addr", "policy": "redis-sentinel", "redis_sentinels": [{"host": "192.168.xxx.xxx", "port": 26379}, {"host": "192.168.xxx.xxx", "port": 26380}, {"host": "192.168.xxx.xxx", "port": 26381}], "redis_master_name": "mymaster", "redis_password": "p@ssw0rd", "sentinel_password": "s3ntinelp@ss", "redis_database": 1}"#,
    ),
    (
        "limit-count",
        r#"{"count": 10, "time_window": 60, "rejected_code": 429, "key": "remote_addr", "window_type": "sliding"}"#,
    ),
    (
        "limit-count",
        r#"{"count": 1000, "time_window": 60, "rejected_code": 429, "key": "remote_addr", "policy": "redis", "redis_host": "192.168.xxx.xxx", "redis_port": 6379, "redis_password": "p@ssw0rd", "redis_database": 1, "sync_interval": 1}"#,
    ),
    (
        "limit-count",
        r#"{"count": 1, "time_window": 30, "rejected_code": 429, "key_type": "var", "key": "remote_addr"}"#,
    ),
    (
        "limit-req",
        r#"{"rate": 1, "burst": 0, "key": "remote_addr", "key_type": "var", "rejected_code": 429, "policy": "local", "nodelay": true}"#,
    ),
    ("limit-req", r#"{"rate": 1, "burst": 1, "key": "remote_addr", "rejected_code": 429, "policy": "local"}"#),
    (
        "limit-req",
        r#"{"rate": 1, "burst": 1, "key": "remote_addr", "rejected_code": 429, "policy": "local", "nodelay": true}"#,
    ),
    (
        "limit-req",
        r#"{"rate": 1, "burst": 0, "key": "$remote_addr $consumer_name", "key_type": "var_combination", "rejected_code": 429, "policy": "local"}"#,
    ),
    (
        "limit-conn",
        r#"{"conn": 2, "burst": 1, "default_conn_delay": 0.1, "key_type": "var", "key": "remote_addr", "policy": "local", "rejected_code": 429}"#,
    ),
    (
        "limit-conn",
        r#"{"conn": 2, "burst": 1, "default_conn_delay": 0.1, "rejected_code": 429, "policy": "local", "key_type": "var_combination", "key": "$remote_addr $consumer_name"}"#,
    ),
    (
        "limit-conn",
        r#"{"conn": 1, "burst": 1, "default_conn_delay": 0.1, "rejected_code": 429, "key_type": "var", "key": "remote_addr", "policy": "redis", "redis_host": "192.168.xxx.xxx", "redis_port": 6379, "redis_password": "p@ssw0rd", "redis_database": 1}"#,
    ),
    (
        "limit-conn",
        r#"{"conn": 1, "burst": 1, "default_conn_delay": 0.1, "rejected_code": 429, "key_type": "var", "key": "remote_addr", "policy": "redis-cluster", "redis_cluster_nodes": ["192.168.xxx.xxx:6379", "192.168.xxx.xxx:16379"], "redis_password": "p@ssw0rd", "redis_cluster_name": "redis-cluster", "redis_cluster_ssl": true}"#,
    ),
    (
        "limit-conn",
        r#"{"rejected_code": 429, "default_conn_delay": 0.1, "policy": "local", "rules": [{"key": "${http_x_subscription_id}", "conn": "${http_x_custom_conn ?? 5}", "burst": 1}, {"key": "${http_x_trial_id}", "conn": 1, "burst": 1}]}"#,
    ),
];

#[test]
fn apisix_documentation_examples_load_unchanged_and_behave_as_documented() {
    let u = Upstream::start("u");
    let mut routes = String::new();
    for (i, (plugin, conf)) in APISIX_EXAMPLES.iter().enumerate() {
        routes.push_str(&route(&format!("ex{i}"), &format!("/ex{i}"), &u, &format!("{{{plugin}: {conf}}}")));
    }
    let n = u.node();
    // "Share Quota among Routes": the group on a service, two routes under it.
    let group = r#"{"count": 1, "time_window": 30, "rejected_code": 429, "policy": "local", "group": "srv1"}"#;
    // "Rate Limit with Anonymous Consumer" and "Customize Rate Limiting Headers".
    let resources = format!(
        "routes:\n{routes}  - {{id: limit-count-route-1, service_id: limit-count-service, uri: /get1}}\n  - {{id: limit-count-route-2, service_id: limit-count-service, uri: /get2}}\n  - {{id: key-auth-route, uri: /anything, upstream: {{nodes: {{\"{n}\": 1}}}}, plugins: {{key-auth: {{anonymous_consumer: anonymous}}}}}}\n  - {{id: meta, uri: /meta, upstream: {{nodes: {{\"{n}\": 1}}}}, plugins: {{limit-count: {{\"count\": 1, \"time_window\": 30, \"rejected_code\": 429, \"key_type\": \"var\", \"key\": \"remote_addr\"}}}}}}\nservices:\n  - {{id: limit-count-service, upstream: {{nodes: {{\"{n}\": 1}}}}, plugins: {{limit-count: {group}}}}}\nconsumers:\n  - username: john\n    plugins: {{limit-count: {{\"count\": 3, \"time_window\": 30, \"rejected_code\": 429}}}}\n    credentials:\n      - {{id: cred-john-key-auth, plugins: {{key-auth: {{key: john-key}}}}}}\n  - username: anonymous\n    plugins: {{limit-count: {{\"count\": 1, \"time_window\": 30, \"rejected_code\": 429}}}}\nplugin_metadata:\n  - {{id: limit-count, \"limit_header\": \"X-Custom-RateLimit-Limit\", \"remaining_header\": \"X-Custom-RateLimit-Remaining\", \"reset_header\": \"X-Custom-RateLimit-Reset\"}}\n"
    );
    let p = Prefix::new("", "", &resources);
    let (code, out) = common::run_weir(&["-t", "-p", &common::path_str(&p.dir)]);
    assert_eq!(code, 0, "weir -t refused the documentation's examples:\n{out}");
    let w = Weir::start(&p);
    w.wait_ready(p.node());

    // "Apply Rate Limiting by Remote Address": one per 30 s, then 429.
    assert_eq!(get(p.node(), "/ex0").status, 200);
    assert_eq!(get(p.node(), "/ex0").status, 429);
    // "Share Quota among Routes": the second route finds the quota spent.
    assert_eq!(get(p.node(), "/get1").status, 200);
    assert_eq!(get(p.node(), "/get2").status, 429);
    // "Rate Limit with Anonymous Consumer": john 3 of 5, anonymous 1 of 5.
    let codes = |h: &[(&str, &str)]| -> Vec<u16> {
        (0..5).map(|_| request(p.node(), "GET", "/anything", h, b"").status).collect()
    };
    assert_eq!(codes(&[("apikey", "john-key")]), [200, 200, 200, 429, 429]);
    assert_eq!(codes(&[]), [200, 429, 429, 429, 429]);
    // "Customize Rate Limiting Headers".
    let r = get(p.node(), "/meta");
    assert_eq!(r.header("x-custom-ratelimit-limit"), Some("1"), "{:?}", r.headers);
    assert_eq!(r.header("x-custom-ratelimit-remaining"), Some("0"));
    assert!(r.header("x-ratelimit-limit").is_none());
    // "Rate Limit by Rules": the subscriber's header sets its own conn.
    let r = request(p.node(), "GET", "/ex16", &[("x-subscription-id", "s1"), ("x-custom-conn", "2")], b"");
    assert_eq!(r.status, 200);
}

#[test]
fn limit_count_local_codes_bodies_headers_and_groups() {
    let u = Upstream::start("u");
    let resources = format!(
        "routes:\n{}{}{}{}",
        route(
            "a",
            "/a",
            &u,
            "{limit-count: {count: 2, time_window: 60, rejected_code: 429, rejected_msg: slow down, key: http_x_user}}"
        ),
        route("quiet", "/quiet", &u, "{limit-count: {count: 1, time_window: 60, show_limit_quota_header: false}}"),
        route("g1", "/g1", &u, "{limit-count: {count: 3, time_window: 60, group: shared, rejected_code: 429}}"),
        route(
            "g2",
            "/g2",
            &u,
            "{limit-count: {count: 3, time_window: 60, group: shared, rejected_code: 429, key: remote_addr}}"
        ),
    );
    let (p, _w) = start(&resources);
    let alice = [("x-user", "alice")];
    let r = request(p.node(), "GET", "/a", &alice, b"");
    assert_eq!(r.status, 200);
    assert_eq!(
        (r.header("x-ratelimit-limit"), r.header("x-ratelimit-remaining"), r.header("x-ratelimit-reset")),
        (Some("2"), Some("1"), Some("60"))
    );
    assert_eq!(request(p.node(), "GET", "/a", &alice, b"").status, 200);
    let r = request(p.node(), "GET", "/a", &alice, b"");
    assert_eq!((r.status, r.json()), (429, json!({"error_msg": "slow down"})));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"), "rejections carry the quota headers");
    assert_eq!(request(p.node(), "GET", "/a", &[("x-user", "bob")], b"").status, 200, "another key");
    // No header: the key falls back to the client address, a key of its own.
    assert_eq!(get(p.node(), "/a").status, 200);

    let r = get(p.node(), "/quiet");
    assert_eq!(r.status, 200);
    assert!(r.headers.iter().all(|(k, _)| !k.to_ascii_lowercase().starts_with("x-ratelimit")), "{:?}", r.headers);
    let r = get(p.node(), "/quiet");
    assert_eq!((r.status, r.json()), (503, json!({"error_msg": "rate limit exceeded"})), "the defaults");

    // A group's routes share one counter (the defaults make the two configurations equal).
    let codes: Vec<u16> = ["/g1", "/g2", "/g1", "/g2"].iter().map(|u| get(p.node(), u).status).collect();
    assert_eq!(codes, [200, 200, 200, 429]);
    assert_eq!(u.hits(), 8, "rejected requests never reach the upstream");
}

#[test]
fn a_group_configured_two_ways_is_refused() {
    let u = Upstream::start("u");
    let resources = format!(
        "routes:\n{}{}",
        route("g1", "/g1", &u, "{limit-count: {count: 3, time_window: 60, group: shared}}"),
        route("g2", "/g2", &u, "{limit-count: {count: 4, time_window: 60, group: shared}}"),
    );
    let p = Prefix::new("", "", &resources);
    let (code, out) = common::start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("routes[1] (id g2): plugins.limit-count: group conf mismatched"), "{out}");
    assert!(out.contains("routes[0] (id g1)"), "the other member is named: {out}");
}

#[test]
fn limit_count_sliding_window_does_not_refill_at_the_boundary() {
    let u = Upstream::start("u");
    let resources = format!(
        "routes:\n{}",
        route("s", "/s", &u, "{limit-count: {count: 3, time_window: 2, window_type: sliding, key_type: constant, key: all, rejected_code: 429}}")
    );
    let (p, _w) = start(&resources);
    // Start just after a window begins.
    while !(50..300).contains(&(wall_ms() % 2000)) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let codes: Vec<u16> = (0..4).map(|_| get(p.node(), "/s").status).collect();
    assert_eq!(codes, [200, 200, 200, 429]);
    // 200 ms into the next window, 90 % of the previous one still counts (2.7 of 3): one more
    // fits, not a whole new quota as a fixed window would give.
    let next = wall_ms() / 2000 + 1;
    while wall_ms() / 2000 < next || wall_ms() % 2000 < 150 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let codes: Vec<u16> = (0..3).map(|_| get(p.node(), "/s").status).collect();
    assert_eq!(codes, [200, 429, 429]);
}

#[test]
fn limit_req_delays_within_the_burst_and_rejects_beyond() {
    let u = Upstream::start("u");
    let resources = format!(
        "routes:\n{}{}",
        route("d", "/d", &u, "{limit-req: {rate: 1, burst: 1, key: remote_addr, rejected_code: 429}}"),
        route("n", "/n", &u, "{limit-req: {rate: 1, burst: 1, key: remote_addr, nodelay: true, rejected_msg: easy}}"),
    );
    let (p, _w) = start(&resources);
    let got = concurrent(p.node(), "/d", &[], 3);
    let codes: Vec<u16> = got.iter().map(|g| g.0).collect();
    assert_eq!(codes, [200, 200, 429], "{got:?}");
    assert!(got[0].1 < 0.5, "the first goes at once: {got:?}");
    assert!(got[1].1 >= 0.9, "the second waits for the rate (1 s): {got:?}");
    assert!(got[2].1 < 0.5, "the rejected one is answered at once: {got:?}");

    let got = concurrent(p.node(), "/n", &[], 3);
    assert!(got.iter().all(|g| g.1 < 0.5), "nodelay: nobody waits: {got:?}");
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [200, 200, 503]);
    let r = get(p.node(), "/n");
    assert_eq!((r.status, r.json()), (503, json!({"error_msg": "easy"})));
}

#[test]
fn limit_conn_bursts_delays_and_gives_places_back_when_clients_go_away() {
    let u = Upstream::start("u");
    let resources = format!(
        "routes:\n{}",
        route(
            "c",
            "/sleep/*",
            &u,
            "{limit-conn: {conn: 1, burst: 1, default_conn_delay: 0.5, only_use_default_delay: true, key: remote_addr}}"
        ),
    );
    let (p, _w) = start(&resources);
    // A holds its place for 1.5 s; B (within the burst) waits a unit, then goes in.
    let node = p.node();
    let a = std::thread::spawn(move || get(node, "/sleep/1500").status);
    std::thread::sleep(Duration::from_millis(200));
    let b = std::thread::spawn(move || {
        let t = Instant::now();
        (get(node, "/sleep/500").status, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    let r = get(p.node(), "/sleep/1");
    assert_eq!((r.status, r.json()), (503, json!({"error_msg": "too many requests in progress"})), "over conn + burst");
    assert_eq!(a.join().expect("a"), 200);
    let (status, took) = b.join().expect("b");
    assert_eq!(status, 200);
    assert!(took >= Duration::from_millis(950), "delayed 0.5 s, then 0.5 s upstream: {took:?}");
    assert_eq!(get(p.node(), "/sleep/1").status, 200, "both places given back");

    // A client that goes away while its request is at the upstream gives its place back then,
    // not when the upstream answers (30 s later).
    let one = format!(
        "routes:\n{}",
        route("one", "/sleep/*", &u, "{limit-conn: {conn: 1, burst: 0, default_conn_delay: 0.1, rejected_code: 429, rejected_msg: one at a time}}")
    );
    let (p, _w1) = start(&one);
    let mut gone = TcpStream::connect(p.node()).expect("connect");
    gone.write_all(b"GET /sleep/30000 HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    std::thread::sleep(Duration::from_millis(300));
    let r = get(p.node(), "/sleep/1");
    assert_eq!((r.status, r.json()), (429, json!({"error_msg": "one at a time"})));
    drop(gone);
    let back = eventually(Duration::from_secs(5), || get(p.node(), "/sleep/1").status == 200);
    assert!(back, "the place of a client that left is given back");
}

#[test]
fn a_flood_of_distinct_keys_stays_at_the_bound() {
    let u = Upstream::start("u");
    let resources = format!(
        "routes:\n{}{}",
        route("r", "/r", &u, "{limit-req: {rate: 100, burst: 0, nodelay: true, key: http_x_key}}"),
        route("c", "/c", &u, "{limit-count: {count: 10, time_window: 60, key: http_x_key}}"),
    );
    let p =
        Prefix::new("", "plugin_attr:\n  limit-req: {max_keys: 1000}\n  limit-count: {max_keys: 1000}\n", &resources);
    let _w = Weir::start(&p);
    let mut conn = KeepAlive::open(p.node());
    for i in 0..5000 {
        let key = format!("attacker-{i}");
        assert_eq!(conn.get("/r", &[("x-key", &key)]), 200);
        assert_eq!(conn.get("/c", &[("x-key", &key)]), 200);
    }
    for plugin in ["limit-req", "limit-count"] {
        let keys = metric(&p, &format!("weir_limiter_keys{{plugin=\"{plugin}\"}}"));
        let max = metric(&p, &format!("weir_limiter_max_keys{{plugin=\"{plugin}\"}}"));
        let evicted = metric(&p, &format!("weir_limiter_evictions_total{{plugin=\"{plugin}\"}}"));
        assert_eq!((keys, max, evicted), (Some(1000.0), Some(1000.0), Some(4000.0)), "{plugin}");
    }
    // A key evicted starts afresh; a recent key keeps its count.
    let recent = [("x-key", "attacker-4999")];
    let statuses: Vec<u16> = (0..10).map(|_| conn.get("/c", &recent)).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 503).count(), 1, "9 left of 10, then rejected: {statuses:?}");
}

#[test]
fn limiters_share_their_limits_through_redis() {
    let Some(redis) = Redis::single(&[]) else {
        return common::skip("limiters_share_their_limits_through_redis", "redis-server is not installed");
    };
    let u = Upstream::start("u");
    let r = format!("policy: redis, redis_host: 127.0.0.1, redis_port: {}", redis.ports[0]);
    let resources = format!(
        "routes:\n{}{}{}{}",
        route(
            "req",
            "/req",
            &u,
            &format!("{{limit-req: {{rate: 1, burst: 0, key: remote_addr, rejected_code: 429, {r}}}}}")
        ),
        route("conn", "/sleep/*", &u, &format!("{{limit-conn: {{conn: 1, burst: 0, default_conn_delay: 0.1, {r}}}}}")),
        route(
            "slide",
            "/slide",
            &u,
            &format!("{{limit-count: {{count: 2, time_window: 60, window_type: sliding, rejected_code: 429, {r}}}}}")
        ),
        route("sync", "/sync", &u, &format!("{{limit-count: {{count: 5, time_window: 60, sync_interval: 0.2, {r}}}}}")),
    );
    let (a, _wa) = start(&resources);
    let (b, _wb) = start(&resources);

    // limit-req: one bucket for both instances.
    assert_eq!(get(a.node(), "/req").status, 200);
    let r = get(b.node(), "/req");
    assert_eq!((r.status, r.json()), (429, json!({"error_msg": "rate limit exceeded"})));
    let keys = redis.cli(redis.ports[0], &["--scan", "--pattern", "weir:limit-req:*"]);
    assert!(keys.trim().starts_with("weir:limit-req:routes/req:") && keys.trim().ends_with(":127.0.0.1"), "{keys}");

    // limit-conn: a request in progress on one instance fills the other's place.
    let node = a.node();
    let holder = std::thread::spawn(move || get(node, "/sleep/1500").status);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get(b.node(), "/sleep/1").status, 503);
    let conn_keys = redis.cli(redis.ports[0], &["--scan", "--pattern", "weir:limit-conn:*"]);
    let conn_key = conn_keys.lines().next().unwrap_or_default().to_owned();
    assert!(conn_key.starts_with("weir:limit-conn:routes/conn:"), "{conn_keys}");
    assert_eq!(redis.cli(redis.ports[0], &["zcard", &conn_key]).trim(), "1", "one request in progress");
    assert_eq!(holder.join().expect("holder"), 200);
    let emptied = eventually(Duration::from_secs(3), || redis.cli(redis.ports[0], &["zcard", &conn_key]).trim() == "0");
    assert!(emptied, "the place is removed from Redis when the request ends ({conn_key})");
    assert_eq!(get(b.node(), "/sleep/1").status, 200);

    // limit-count, sliding window in Redis.
    let codes: Vec<u16> = [&a, &b, &a].iter().map(|p| get(p.node(), "/slide").status).collect();
    assert_eq!(codes, [200, 200, 429]);
    let slide = redis.cli(redis.ports[0], &["--scan", "--pattern", "weir:limit-count:{routes/slide:*"]);
    assert_eq!(slide.lines().count(), 1, "the current window's key: {slide}");

    // limit-count with sync_interval: counted locally, added to Redis every 0.2 s.
    let codes: Vec<u16> = (0..6).map(|_| get(a.node(), "/sync").status).collect();
    assert_eq!(codes, [200, 200, 200, 200, 200, 503], "one instance alone never passes the limit");
    let key = redis.cli(redis.ports[0], &["--scan", "--pattern", "weir:limit-count:routes/sync:*"]);
    let key = key.trim().to_owned();
    let synced = eventually(Duration::from_secs(3), || redis.cli(redis.ports[0], &["get", &key]).trim() == "5");
    assert!(synced, "the local counts reach Redis: {}", redis.cli(redis.ports[0], &["get", &key]));
    assert_eq!(get(b.node(), "/sync").status, 503, "the other instance sees them");
}

#[test]
fn redis_outages_follow_allow_degradation() {
    let Some(mut redis) = Redis::single(&[]) else {
        return common::skip("redis_outages_follow_allow_degradation", "redis-server is not installed");
    };
    let u = Upstream::start("u");
    let r = format!("policy: redis, redis_host: 127.0.0.1, redis_port: {}, redis_timeout: 300", redis.ports[0]);
    let resources = format!(
        "routes:\n{}{}{}{}",
        route("rs", "/rs", &u, &format!("{{limit-req: {{rate: 100, burst: 10, key: remote_addr, {r}}}}}")),
        route(
            "rl",
            "/rl",
            &u,
            &format!("{{limit-req: {{rate: 100, burst: 10, key: remote_addr, allow_degradation: true, {r}}}}}")
        ),
        route("cs", "/cs", &u, &format!("{{limit-conn: {{conn: 5, burst: 0, default_conn_delay: 0.1, {r}}}}}")),
        route(
            "cl",
            "/cl",
            &u,
            &format!("{{limit-conn: {{conn: 5, burst: 0, default_conn_delay: 0.1, allow_degradation: true, {r}}}}}")
        ),
    );
    let (p, w) = start(&resources);
    for path in ["/rs", "/rl", "/cs", "/cl"] {
        assert_eq!(get(p.node(), path).status, 200, "{path} with Redis up");
    }
    redis.stop(0);
    for (path, plugin) in [("/rs", "limit-req"), ("/cs", "limit-conn")] {
        let r = get(p.node(), path);
        assert_eq!(
            (r.status, r.json()),
            (503, json!({"error_msg": format!("{plugin}: the rate-limit store is unavailable")})),
            "{path}"
        );
    }
    assert_eq!(get(p.node(), "/rl").status, 200, "allow_degradation lets requests through");
    assert_eq!(get(p.node(), "/cl").status, 200);
    let log = w.log_text();
    assert!(log.contains("limit-req: redis 127.0.0.1") && log.contains("is unavailable"), "{log}");
    redis.spawn(0, &[]);
    let resumed = eventually(Duration::from_secs(10), || get(p.node(), "/rs").status == 200);
    assert!(resumed, "limiting resumes once Redis is back");
}

#[test]
fn hostile_configurations_and_input_are_refused_or_contained() {
    let u = Upstream::start("u");
    // Refused at load, naming the route and the field.
    for (conf, expected) in [
        ("{limit-req: {rate: 0, burst: 1, key: remote_addr}}", "rate"),
        ("{limit-req: {rate: 1, burst: 1, key: remote_adr}}", "did you mean `$remote_addr`"),
        ("{limit-conn: {conn: 1, burst: 0}}", "default_conn_delay"),
        (
            "{limit-count: {count: 1, time_window: 1, key_type: var_combination, key: \"$nope\"}}",
            "unknown variable `$nope`",
        ),
        (
            "{limit-count: {count: 1, time_window: 1, policy: redis, redis_host: h, sync_interval: 5}}",
            "smaller than time_window",
        ),
    ] {
        let p = Prefix::new("", "", &format!("routes:\n{}", route("x", "/x", &u, conf)));
        let (code, out) = common::start_refused(&p);
        assert_ne!(code, 0, "{conf}");
        assert!(out.contains("routes[0] (id x)") && out.contains(expected), "{conf}: {out}");
    }
    let p = Prefix::new("", "plugin_attr:\n  limit-req: {max_keys: 1}\n", "");
    let (code, out) = common::start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("plugin_attr.limit-req"), "{out}");

    // Hostile keys: long, odd bytes, a limit from a header that is not a number.
    let resources = format!(
        "routes:\n{}{}",
        route(
            "k",
            "/k",
            &u,
            "{limit-count: {count: 2, time_window: 60, key_type: var_combination, key: \"$http_x_a|$http_x_b\"}}"
        ),
        route("v", "/v", &u, "{limit-count: {count: \"$http_x_quota\", time_window: 60}}"),
    );
    let (p, _w) = start(&resources);
    let long = "k".repeat(6000);
    // x-b is not UTF-8 (obs-text): absent as a variable.
    let h = [("x-a", long.as_str()), ("x-b", "caf\u{e9}")];
    let codes: Vec<u16> = (0..3).map(|_| request(p.node(), "GET", "/k", &h, b"").status).collect();
    assert_eq!(codes, [200, 200, 503]);
    let r = request(p.node(), "GET", "/v", &[("x-quota", "1e99")], b"");
    assert_eq!((r.status, r.json()), (500, json!({"error_msg": "failed to limit count"})));
    assert!(!r.text().contains("1e99"), "the client's value is not echoed");
    assert_eq!(request(p.node(), "GET", "/v", &[("x-quota", "3")], b"").status, 200);
}

#[test]
fn limiters_work_on_a_redis_cluster() {
    let Some(cluster) = Redis::cluster() else {
        return common::skip("limiters_work_on_a_redis_cluster", "redis-server is not installed");
    };
    let u = Upstream::start("u");
    let c = format!(
        "policy: redis-cluster, redis_cluster_name: t, redis_cluster_nodes: [\"127.0.0.1:{}\"]",
        cluster.ports[0]
    );
    let resources = format!(
        "routes:\n{}{}{}",
        route("req", "/req", &u, &format!("{{limit-req: {{rate: 1, burst: 0, key: http_x_user, {c}}}}}")),
        route(
            "conn",
            "/conn",
            &u,
            &format!("{{limit-conn: {{conn: 2, burst: 0, default_conn_delay: 0.1, key: http_x_user, {c}}}}}")
        ),
        route(
            "slide",
            "/slide",
            &u,
            &format!("{{limit-count: {{count: 2, time_window: 60, window_type: sliding, key: http_x_user, {c}}}}}")
        ),
    );
    let (p, _w) = start(&resources);
    // Many users, so that their keys land on every shard; each script runs on one slot.
    for user in 0..12 {
        let h = [("x-user", format!("user-{user}"))];
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let req: Vec<u16> = (0..2).map(|_| request(p.node(), "GET", "/req", &h, b"").status).collect();
        assert_eq!(req, [200, 503], "limit-req, user {user}");
        assert_eq!(request(p.node(), "GET", "/conn", &h, b"").status, 200, "limit-conn, user {user}");
        let slide: Vec<u16> = (0..3).map(|_| request(p.node(), "GET", "/slide", &h, b"").status).collect();
        assert_eq!(slide, [200, 200, 503], "sliding limit-count, user {user}");
    }
    let count = |pattern: &str| -> Vec<usize> {
        cluster.ports.iter().map(|port| cluster.cli(*port, &["--scan", "--pattern", pattern]).lines().count()).collect()
    };
    let req = count("weir:limit-req:*");
    assert_eq!(req.iter().sum::<usize>(), 12);
    assert!(req.iter().filter(|n| **n > 0).count() >= 2, "spread over the shards: {req:?}");
    assert_eq!(count("weir:limit-count:*").iter().sum::<usize>(), 12, "one window key per user");
}

/// A self-signed certificate for 127.0.0.1 in `dir`: (cert, key) paths.
fn self_signed(dir: &std::path::Path) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).expect("params");
    let cert = params.self_signed(&key).expect("sign");
    let (c, k) = (dir.join("redis.crt"), dir.join("redis.key"));
    std::fs::write(&c, cert.pem()).expect("write cert");
    std::fs::write(&k, key.serialize_pem()).expect("write key");
    (common::path_str(&c), common::path_str(&k))
}

/// A child process killed on drop.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn redis_over_tls_and_behind_sentinel() {
    if !common::redis::installed() {
        return common::skip("redis_over_tls_and_behind_sentinel", "redis-server is not installed");
    }
    let pki = Redis::scratch();
    let (cert, key) = self_signed(&pki);
    let tls_port = common::free_port();
    let tls_args = [
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &cert,
        "--tls-auth-clients",
        "no",
    ]
    .map(str::to_owned);
    let tls_args: Vec<&str> = tls_args.iter().map(String::as_str).collect();
    let Some(tls) = Redis::single(&tls_args) else { return };

    // Sentinel in front of a plain master.
    let master = Redis::single(&[]).expect("master");
    let sentinel_port = common::free_port();
    let conf = pki.join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {sentinel_port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {} 1\n",
            common::path_str(&pki),
            master.ports[0]
        ),
    )
    .expect("sentinel.conf");
    let sentinel = Killed(
        std::process::Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start sentinel"),
    );
    let knows = eventually(Duration::from_secs(10), || {
        master
            .cli(sentinel_port, &["sentinel", "get-master-addr-by-name", "mymaster"])
            .contains(&master.ports[0].to_string())
    });
    assert!(knows, "the sentinel did not come up");

    let u = Upstream::start("u");
    let resources = format!(
        "routes:\n{}{}{}",
        route("tls", "/tls", &u, &format!("{{limit-count: {{count: 1, time_window: 60, policy: redis, redis_host: 127.0.0.1, redis_port: {tls_port}, redis_ssl: true}}}}")),
        route(
            "verify",
            "/verify",
            &u,
            &format!("{{limit-count: {{count: 1, time_window: 60, policy: redis, redis_host: 127.0.0.1, redis_port: {tls_port}, redis_ssl: true, redis_ssl_verify: true, redis_timeout: 500}}}}")
        ),
        route(
            "sentinel",
            "/sentinel",
            &u,
            &format!("{{limit-count: {{count: 1, time_window: 60, policy: redis-sentinel, redis_sentinels: [{{host: 127.0.0.1, port: {sentinel_port}}}], redis_master_name: mymaster}}}}")
        ),
    );
    let (p, w) = start(&resources);
    assert_eq!(get(p.node(), "/tls").status, 200);
    assert_eq!(get(p.node(), "/tls").status, 503, "counted over TLS");
    let keys = tls.cli(tls.ports[0], &["--scan", "--pattern", "weir:limit-count:routes/tls:*"]);
    assert_eq!(keys.lines().count(), 1, "{keys}");
    let r = get(p.node(), "/verify");
    assert_eq!(
        r.json(),
        json!({"error_msg": "limit-count: the rate-limit store is unavailable"}),
        "a self-signed certificate fails verification"
    );
    assert!(w.log_text().contains("rediss 127.0.0.1"), "{}", w.log_text());

    assert_eq!(get(p.node(), "/sentinel").status, 200);
    assert_eq!(get(p.node(), "/sentinel").status, 503);
    let keys = master.cli(master.ports[0], &["--scan", "--pattern", "weir:limit-count:routes/sentinel:*"]);
    assert_eq!(keys.lines().count(), 1, "counted on the master the sentinel named: {keys}");
    drop(sentinel);
    let _ = std::fs::remove_dir_all(&pki);
}
