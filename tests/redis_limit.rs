//! `limit-count` with `policy: redis` and `redis-cluster` against real Redis servers
//! (`redis-server` and `redis-cli` from Debian's redis-server package; without them these tests
//! are reported as skipped). Two gateway instances naming one Redis enforce one limit together;
//! Redis going away rejects with 503 or lets requests through, as `allow_degradation` says, and
//! counting resumes once it is back.

mod common;

use std::time::Duration;

use common::redis::Redis;
use common::upstream::Upstream;
use common::{eventually, get, request, Prefix, Weir};
use serde_json::json;

fn gateway(resources: &str) -> (Prefix, Weir) {
    let p = Prefix::new("", "", resources);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    (p, w)
}

fn route(id: &str, uri: &str, u: &Upstream, limit: &str) -> String {
    format!(
        "  - {{id: {id}, uri: {uri}, upstream: {{nodes: {{\"{}\": 1}}}}, plugins: {{limit-count: {limit}}}}}\n",
        u.node()
    )
}

#[test]
fn two_instances_share_one_limit_in_redis() {
    let Some(redis) = Redis::single(&[]) else {
        return common::skip("two_instances_share_one_limit_in_redis", "redis-server is not installed");
    };
    let u = Upstream::start("u");
    let limit = format!(
        "{{count: 4, time_window: 60, rejected_code: 429, policy: redis, redis_host: 127.0.0.1, redis_port: {}}}",
        redis.ports[0]
    );
    let resources = format!("routes:\n{}", route("1", "/shared", &u, &limit));
    let (a, _wa) = gateway(&resources);
    let (b, _wb) = gateway(&resources);
    let mut remaining = Vec::new();
    for i in 0..4 {
        let r = get(if i % 2 == 0 { a.node() } else { b.node() }, "/shared");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(r.header("x-ratelimit-limit"), Some("4"));
        let reset: u64 = r.header("x-ratelimit-reset").and_then(|v| v.parse().ok()).unwrap_or(0);
        assert!((59..=60).contains(&reset), "reset {reset}");
        remaining.push(r.header("x-ratelimit-remaining").unwrap_or("").to_owned());
    }
    assert_eq!(remaining, ["3", "2", "1", "0"], "both instances count in one window");
    for node in [a.node(), b.node()] {
        let r = get(node, "/shared");
        assert_eq!((r.status, r.json()), (429, json!({"error_msg": "rate limit exceeded"})));
        assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    }
    assert_eq!(u.hits(), 4, "rejected requests never reach the upstream");
    // The counter is one Redis key with the window as its expiry.
    let keys = redis.cli(redis.ports[0], &["--scan", "--pattern", "weir:limit-count:*"]);
    let key = keys.lines().next().unwrap_or_default().to_owned();
    assert!(key.starts_with("weir:limit-count:routes/1:") && key.ends_with(":127.0.0.1"), "{keys}");
    let ttl: i64 = redis.cli(redis.ports[0], &["ttl", &key]).trim().parse().unwrap_or(-9);
    assert!((55..=60).contains(&ttl), "ttl {ttl}");
}

#[test]
fn redis_outage_follows_allow_degradation_and_counting_resumes() {
    let Some(mut redis) = Redis::single(&["--requirepass", "s3cret"]) else {
        return common::skip("redis_outage_follows_allow_degradation_and_counting_resumes", "no redis-server");
    };
    let u = Upstream::start("u");
    let port = redis.ports[0];
    let base = format!("policy: redis, redis_host: 127.0.0.1, redis_port: {port}, redis_timeout: 300");
    let resources = format!(
        "routes:\n{}{}{}",
        route("strict", "/strict", &u, &format!("{{count: 100, time_window: 60, {base}, redis_password: s3cret}}")),
        route(
            "lenient",
            "/lenient",
            &u,
            &format!("{{count: 100, time_window: 60, {base}, redis_password: s3cret, allow_degradation: true}}")
        ),
        route("wrongpw", "/wrongpw", &u, &format!("{{count: 100, time_window: 60, {base}, redis_password: nope}}")),
    );
    let (p, w) = gateway(&resources);
    assert_eq!(get(p.node(), "/strict").header("x-ratelimit-remaining"), Some("99"));
    let r = get(p.node(), "/wrongpw");
    assert_eq!(r.status, 503, "a password Redis refuses is an outage, not a pass: {}", r.text());

    let before = w.log_text().matches("is unavailable").count();
    redis.stop(0);
    let r = get(p.node(), "/strict");
    assert_eq!(r.status, 503);
    assert_eq!(r.json(), json!({"error_msg": "limit-count: the rate-limit store is unavailable"}));
    let r = get(p.node(), "/lenient");
    assert_eq!(r.status, 200, "allow_degradation lets requests through");
    assert_eq!(r.header("x-ratelimit-remaining"), None, "no counter, no quota headers");
    for _ in 0..5 {
        assert_eq!(get(p.node(), "/strict").status, 503);
    }
    let log = w.log_text();
    assert_eq!(log.matches("is unavailable").count(), before + 1, "one line per change of state: {log}");
    assert!(!log.contains("s3cret"), "the password is never logged");

    redis.spawn(0, &["--requirepass", "s3cret"]);
    let resumed = eventually(Duration::from_secs(10), || get(p.node(), "/strict").status == 200);
    assert!(resumed, "counting resumes once Redis is back");
    assert!(w.log_text().contains("is reachable again"));
    let r = get(p.node(), "/lenient");
    assert!(r.header("x-ratelimit-remaining").is_some(), "the lenient route counts again");
}

#[test]
fn two_instances_share_one_limit_in_a_redis_cluster() {
    let Some(cluster) = Redis::cluster() else {
        return common::skip("two_instances_share_one_limit_in_a_redis_cluster", "redis-server is not installed");
    };
    let u = Upstream::start("u");
    // One seed node is enough: the client learns the others from it.
    let limit = format!(
        "{{count: 3, time_window: 60, key: $http_x_user, policy: redis-cluster, redis_cluster_name: test, redis_cluster_nodes: [\"127.0.0.1:{}\"]}}",
        cluster.ports[0]
    );
    let resources = format!("routes:\n{}", route("1", "/c", &u, &limit));
    let (a, _wa) = gateway(&resources);
    let (b, _wb) = gateway(&resources);
    // Many users, so that their keys land in every shard.
    for user in 0..12 {
        let h = format!("user-{user}");
        let statuses: Vec<u16> = (0..4)
            .map(|i| request(if i % 2 == 0 { a.node() } else { b.node() }, "GET", "/c", &[("x-user", &h)], b"").status)
            .collect();
        assert_eq!(statuses, [200, 200, 200, 503], "user {user}");
    }
    let keys: usize = cluster
        .ports
        .iter()
        .map(|p| cluster.cli(*p, &["--scan", "--pattern", "weir:limit-count:*"]).lines().count())
        .sum();
    assert_eq!(keys, 12);
    let shards_used = cluster
        .ports
        .iter()
        .filter(|p| !cluster.cli(**p, &["--scan", "--pattern", "weir:limit-count:*"]).trim().is_empty())
        .count();
    assert!(shards_used >= 2, "the keys are spread over the shards");
}

#[test]
fn shared_policies_without_their_server_are_refused_at_start() {
    let p = Prefix::new(
        "",
        "",
        "routes:\n  - {id: 1, uri: /x, upstream: {nodes: {\"127.0.0.1:1\": 1}}, plugins: {limit-count: {count: 1, time_window: 1, policy: redis}}}\n",
    );
    let (code, err) = common::start_refused(&p);
    assert_ne!(code, 0);
    assert!(err.contains("routes[0]") && err.contains("redis_host"), "{err}");
}

/// Concurrent requests for one key share Redis calls (`coalesce`), yet each gets a count of its
/// own: exactly `count` pass across two instances, and the accepted ones saw every remaining
/// value once.
#[test]
fn concurrent_requests_share_calls_and_keep_exact_counts() {
    let Some(redis) = Redis::single(&["--databases", "4"]) else {
        return common::skip("concurrent_requests_share_calls_and_keep_exact_counts", "redis-server is not installed");
    };
    let u = Upstream::start("u");
    let limit = format!(
        "{{count: 150, time_window: 60, rejected_code: 429, policy: redis, redis_host: 127.0.0.1, redis_port: {}, redis_database: 3}}",
        redis.ports[0]
    );
    let resources = format!("routes:\n{}", route("1", "/burst", &u, &limit));
    let (a, _wa) = gateway(&resources);
    let (b, _wb) = gateway(&resources);
    let outcomes: Vec<(u16, Option<String>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..40)
            .map(|t| {
                let node = if t % 2 == 0 { a.node() } else { b.node() };
                s.spawn(move || {
                    (0..6)
                        .map(|_| {
                            let r = get(node, "/burst");
                            (r.status, r.header("x-ratelimit-remaining").map(str::to_owned))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("client thread")).collect()
    });
    let passed: Vec<u64> =
        outcomes.iter().filter(|(s, _)| *s == 200).filter_map(|(_, r)| r.as_deref()?.parse().ok()).collect();
    let rejected = outcomes.iter().filter(|(s, _)| *s == 429).count();
    assert_eq!((passed.len(), rejected), (150, 90), "{outcomes:?}");
    let mut seen = passed.clone();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, (0..150).collect::<Vec<u64>>(), "every accepted request had a count of its own");
    assert_eq!(u.hits(), 150);
    // `redis_database` is honoured: the counter is in database 3, not 0.
    let in_3 = redis.cli(redis.ports[0], &["-n", "3", "--scan", "--pattern", "weir:limit-count:*"]);
    let in_0 = redis.cli(redis.ports[0], &["-n", "0", "--scan", "--pattern", "weir:limit-count:*"]);
    assert!(!in_3.trim().is_empty() && in_0.trim().is_empty(), "db 3: {in_3:?}; db 0: {in_0:?}");
    let n: u64 =
        redis.cli(redis.ports[0], &["-n", "3", "get", in_3.lines().next().unwrap_or("")]).trim().parse().unwrap_or(0);
    assert_eq!(n, 240, "every request counted once");
}
