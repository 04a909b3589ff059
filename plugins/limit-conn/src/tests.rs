//! Unit tests of the HTTP plugin (built from JSON, run with the SDK's test kit; a request holds
//! its places as long as its context lives).

use std::time::{Duration, Instant};

use serde_json::json;
use weir_plugin::testing::{instance, run, TestRequest};
use weir_plugin::{Plugin, RequestCtx};

use super::*;

fn status(chain: &[std::sync::Arc<dyn weir_plugin::PluginInstance>], ctx: &mut RequestCtx) -> u16 {
    run(chain, ctx).map_or(200, |r| r.status.as_u16())
}

#[test]
fn conn_burst_delay_and_release() {
    let p = LimitConnHttp::default();
    let i = instance(
        &p,
        json!({"conn": 1, "burst": 1, "default_conn_delay": 0.1, "key": "remote_addr", "rejected_code": 429, "only_use_default_delay": true}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let chain = [i];
    let mut first = TestRequest::get("/").build();
    assert_eq!(status(&chain, &mut first), 200);
    let started = Instant::now();
    let mut second = TestRequest::get("/").build();
    assert_eq!(status(&chain, &mut second), 200);
    assert!(started.elapsed() >= Duration::from_millis(90), "the burst waits a unit");
    let mut third = TestRequest::get("/").build();
    assert_eq!(status(&chain, &mut third), 429, "over conn + burst");
    drop(third);
    drop(first);
    let mut fourth = TestRequest::get("/").build();
    assert_eq!(status(&chain, &mut fourth), 200, "a place was given back");
    drop((second, fourth));
    assert_eq!(weir_plugin::limit::stats::StoreStats::keys(&*p.local_store()), 0, "empty keys leave the store");
}

#[test]
fn rules_apply_in_order_and_skip_absent_keys() {
    let p = LimitConnHttp::default();
    // The APISIX documentation's example.
    let i = instance(
        &p,
        json!({"rejected_code": 429, "default_conn_delay": 0.1, "policy": "local", "rules": [
            {"key": "${http_x_subscription_id}", "conn": "${http_x_custom_conn ?? 5}", "burst": 1},
            {"key": "${http_x_trial_id}", "conn": 1, "burst": 1}
        ]}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let chain = [i];
    // No rule applies: nothing counted, nothing held.
    let mut none = TestRequest::get("/").build();
    assert_eq!(status(&chain, &mut none), 200);
    assert!(none.slots.is_empty());
    // Subscriber with a conn of 1 and burst 1: two in progress, the third rejected.
    let sub = || TestRequest::get("/").header("x-subscription-id", "s1").header("x-custom-conn", "1").build();
    let (mut a, mut b, mut c) = (sub(), sub(), sub());
    assert_eq!(status(&chain, &mut a), 200);
    assert_eq!(status(&chain, &mut b), 200);
    assert_eq!(status(&chain, &mut c), 429);
    // A trial user is counted apart.
    let mut t = TestRequest::get("/").header("x-trial-id", "t1").build();
    assert_eq!(status(&chain, &mut t), 200);
}

#[test]
fn configurations_apisix_refuses_are_refused() {
    let p = LimitConnHttp::default();
    for (conf, why) in [
        (json!({"conn": 1, "burst": 0}), "default_conn_delay"),
        (json!({"conn": 1, "burst": 0, "default_conn_delay": 0}), "default_conn_delay"),
        (json!({"conn": 0, "burst": 0, "default_conn_delay": 1}), "conn"),
        (json!({"burst": 0, "default_conn_delay": 1}), "conn and burst are required"),
        (
            json!({"conn": 1, "burst": 0, "default_conn_delay": 1, "rules": [{"key": "$remote_addr", "conn": 1, "burst": 0}]}),
            "at the same time",
        ),
        (json!({"conn": 1, "burst": 0, "default_conn_delay": 1, "policy": "redis"}), "redis_host"),
        (json!({"conn": 1, "burst": 0, "default_conn_delay": 1, "key": "nope"}), "unknown variable"),
    ] {
        let e = instance(&p, conf.clone()).err().unwrap_or_default();
        assert!(e.contains(why), "{conf}: {e}");
    }
    assert_eq!(Plugin::name(&p), "limit-conn");
}
