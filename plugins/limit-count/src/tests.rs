//! Unit tests of the plugin as a whole (built from JSON, run with the SDK's test kit).

use serde_json::json;
use weir_plugin::testing::{instance, run, TestRequest};

use super::*;

#[test]
fn scope_names_are_stable_across_reordering() {
    let owner = |label, id| Owner { kind: "routes", id, label };
    assert_eq!(scope_name(&owner("routes[2] (id 7)", "7")), "routes/7");
    assert_eq!(scope_name(&owner("routes[0] (id 7)", "7")), "routes/7");
    assert_eq!(scope_name(&owner("routes[1]", "")), "routes[1]");
}

#[test]
fn local_counts_with_headers_and_rejects() {
    let p = LimitCount::default();
    let i = instance(&p, json!({"count": 2, "time_window": 60, "rejected_code": 429, "key": "http_x_user"}))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut ctx = TestRequest::get("/").header("x-user", "a").build();
    assert!(run(std::slice::from_ref(&i), &mut ctx).is_none());
    let h: Vec<String> =
        ctx.response_headers.iter().map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or(""))).collect();
    assert_eq!(h, ["x-ratelimit-limit: 2", "x-ratelimit-remaining: 1", "x-ratelimit-reset: 60"]);
    let mut ctx = TestRequest::get("/").header("x-user", "a").build();
    assert!(run(std::slice::from_ref(&i), &mut ctx).is_none());
    let mut ctx = TestRequest::get("/").header("x-user", "a").build();
    let r = run(std::slice::from_ref(&i), &mut ctx)
        .map(|r| (r.status.as_u16(), r.body, r.headers.get("x-ratelimit-remaining").cloned()));
    assert_eq!(r, Some((429, bytes_of(r#"{"error_msg":"rate limit exceeded"}"#), Some(HeaderValue::from(0u64)))));
    let mut ctx = TestRequest::get("/").header("x-user", "b").build();
    assert!(run(&[i], &mut ctx).is_none(), "another key");
}

fn bytes_of(s: &str) -> weir_plugin::Bytes {
    weir_plugin::Bytes::copy_from_slice(s.as_bytes())
}

#[test]
fn quota_headers_can_be_off_and_counts_can_be_variables() {
    let p = LimitCount::default();
    let i = instance(
        &p,
        json!({"count": "${http_x_quota ?? 1}", "time_window": 60, "show_limit_quota_header": false, "key_type": "constant", "key": "all"}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut ctx = TestRequest::get("/").header("x-quota", "3").build();
    assert!(run(std::slice::from_ref(&i), &mut ctx).is_none());
    assert!(ctx.response_headers.is_empty());
    let mut ctx = TestRequest::get("/").header("x-quota", "nope").build();
    assert_eq!(run(&[i], &mut ctx).map(|r| r.status.as_u16()), Some(500), "an unusable limit: 500, as APISIX");
}

#[test]
fn configurations_apisix_refuses_are_refused() {
    let p = LimitCount::default();
    for (conf, why) in [
        (json!({"count": 0, "time_window": 1}), "count"),
        (json!({"count": 1, "time_window": 1, "policy": "redis"}), "redis_host"),
        (json!({"count": 1, "time_window": 1, "policy": "redis-cluster"}), "redis_cluster_nodes"),
        (
            json!({"count": 1, "time_window": 1, "policy": "redis-sentinel", "redis_master_name": "m"}),
            "redis_sentinels",
        ),
        (
            json!({"count": 1, "time_window": 10, "policy": "redis", "redis_host": "h", "sync_interval": 0.05}),
            "smaller than 0.1",
        ),
        (
            json!({"count": 1, "time_window": 10, "policy": "redis", "redis_host": "h", "sync_interval": 10}),
            "smaller than time_window",
        ),
        (json!({"count": 1, "time_window": 1, "key": "remote_adr"}), "did you mean"),
        (json!({"count": 1, "time_window": 1, "window_type": "rolling"}), "rolling"),
    ] {
        let e = instance(&p, conf.clone()).err().unwrap_or_default();
        assert!(e.contains(why), "{conf}: {e}");
    }
    // sync_interval is ignored by the local policy (APISIX checks it for Redis policies only).
    assert!(instance(&p, json!({"count": 1, "time_window": 1, "sync_interval": 5})).is_ok());
}

#[test]
fn groups_must_agree() {
    let a = json!({"count": 1, "time_window": 30, "group": "g", "policy": "local"});
    let b = json!({"count": 1, "time_window": 30, "group": "g"}); // defaults filled: the same
    let c = json!({"count": 2, "time_window": 30, "group": "g"});
    let d = json!({"count": 5, "time_window": 30});
    let owners = ["routes[0] (id 1)", "routes[1] (id 2)", "routes[2] (id 3)", "routes[3] (id 4)"];
    let confs: Vec<(Owner<'_>, &Value)> =
        owners.iter().zip([&a, &b, &c, &d]).map(|(o, c)| (Owner { kind: "routes", id: "x", label: o }, c)).collect();
    let issues = conf::check_groups(&confs);
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert_eq!(issues[0].0, 2);
    assert!(issues[0].1.contains("group conf mismatched") && issues[0].1.contains("routes[0] (id 1)"), "{issues:?}");
}
