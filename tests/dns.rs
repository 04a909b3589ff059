//! Upstreams that move: node names and `discovery_type: dns` resolved by the real `weir` binary
//! against a DNS server on a loopback port whose answers change while traffic flows.

mod common;

use std::time::{Duration, Instant};

use common::dns::{ips, DnsServer, Record};
use common::upstream::Upstream;
use common::*;

/// `dns_resolver` pointing at `dns`, with answers re-read at their TTL.
fn dns_config(dns: &DnsServer) -> String {
    format!("  dns_resolver: [\"{}\"]\n  dns_min_ttl: 1\n", dns.addr)
}

/// Which upstream answered `GET /` (its name), or the status when none did.
fn who(p: &Prefix) -> String {
    let r = get(p.node(), "/");
    if r.status != 200 {
        return format!("status {}", r.status);
    }
    r.json()["node"].as_str().unwrap_or("?").to_owned()
}

/// Two upstreams on one port, on 127.0.0.1 and 127.0.0.2 (a DNS answer names addresses only).
fn pair() -> (Upstream, Upstream) {
    for _ in 0..50 {
        let port = free_port();
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.2", port)) {
            drop(l);
            return (
                Upstream::start_on(&format!("127.0.0.1:{port}"), "a"),
                Upstream::start_on(&format!("127.0.0.2:{port}"), "b"),
            );
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

fn wait_for(p: &Prefix, node: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if who(p) == node {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "traffic did not reach {node} within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_node_name_follows_its_records_and_keeps_the_last_answer_when_dns_fails() {
    let ttl = 1;
    let dns = DnsServer::start(ttl);
    let (a, b) = pair();
    dns.set("app.test", ips(&["127.0.0.1"]));
    let resources = format!(
        "routes:\n  - id: r\n    uri: /*\n    upstream:\n      nodes:\n        \"app.test:{}\": 1\n",
        a.addr.port()
    );
    let p = Prefix::new(&dns_config(&dns), "", &resources);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    for _ in 0..5 {
        assert_eq!(who(&p), "a", "log:\n{}", w.log_text());
    }

    // The record moves: traffic follows within the TTL and a second.
    dns.set("app.test", ips(&["127.0.0.2"]));
    let moved = wait_for(&p, "b", Duration::from_secs(10));
    eprintln!("DNS change to traffic on the new node: {:.2} s (TTL {ttl} s)", moved.as_secs_f64());
    assert!(moved <= Duration::from_secs(u64::from(ttl) + 1), "took {moved:?}");
    for _ in 0..5 {
        assert_eq!(who(&p), "b");
    }

    // Every A record is a node.
    dns.set("app.test", ips(&["127.0.0.1", "127.0.0.2"]));
    wait_for(&p, "a", Duration::from_secs(5));
    let seen: Vec<String> = (0..10).map(|_| who(&p)).collect();
    assert!(seen.iter().any(|n| n == "a") && seen.iter().any(|n| n == "b"), "{seen:?}");

    // SERVFAIL, then NXDOMAIN: the last good answer stays in use.
    dns.fail("app.test");
    let queries = dns.queries.load(std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(3));
    assert!(dns.queries.load(std::sync::atomic::Ordering::SeqCst) > queries, "the name was asked again");
    let seen: Vec<String> = (0..10).map(|_| who(&p)).collect();
    assert!(seen.iter().all(|n| n == "a" || n == "b") && seen.iter().any(|n| n == "a"), "{seen:?}");
    dns.set("app.test", Vec::new());
    std::thread::sleep(Duration::from_secs(3));
    let seen: Vec<String> = (0..10).map(|_| who(&p)).collect();
    assert!(seen.iter().all(|n| n == "a" || n == "b") && seen.iter().any(|n| n == "b"), "{seen:?}");
    let log = w.log_text();
    assert!(log.contains("DNS app.test:") && log.contains("keeping the last answer"), "log:\n{log}");
    drop((a, b));
}

#[test]
fn a_name_that_does_not_resolve_yet_loads_and_joins_when_it_does() {
    let dns = DnsServer::start(1);
    let up = Upstream::start("late");
    let resources = format!(
        "routes:\n  - id: r\n    uri: /*\n    upstream:\n      nodes:\n        \"late.test:{}\": 1\n",
        up.addr.port()
    );
    let p = Prefix::new(&dns_config(&dns), "", &resources);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let first = get(p.node(), "/");
    assert!(first.status == 502 || first.status == 503, "no node yet: {} {}", first.status, first.text());
    dns.set("late.test", ips(&["127.0.0.1"]));
    wait_for(&p, "late", Duration::from_secs(10));
    assert!(w.log_text().contains("does not resolve yet"), "log:\n{}", w.log_text());
}

#[test]
fn srv_records_give_targets_ports_and_weights_of_the_lowest_priority() {
    let dns = DnsServer::start(1);
    let (heavy, light, backup) = (Upstream::start("heavy"), Upstream::start("light"), Upstream::start("backup"));
    let srv = |priority, weight, up: &Upstream, target: &str| Record::Srv {
        priority,
        weight,
        port: up.addr.port(),
        target: target.to_owned(),
    };
    for name in ["heavy.svc.test", "light.svc.test", "backup.svc.test"] {
        dns.set(name, ips(&["127.0.0.1"]));
    }
    dns.set(
        "_http._tcp.svc.test",
        vec![
            srv(10, 3, &heavy, "heavy.svc.test"),
            srv(10, 1, &light, "light.svc.test"),
            srv(20, 1, &backup, "backup.svc.test"),
        ],
    );
    let resources = "routes:\n  - id: r\n    uri: /*\n    upstream:\n      discovery_type: dns\n      service_name: _http._tcp.svc.test\n";
    let p = Prefix::new(&dns_config(&dns), "", resources);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let mut counts = std::collections::HashMap::new();
    for _ in 0..40 {
        *counts.entry(who(&p)).or_insert(0) += 1;
    }
    assert_eq!(counts.get("heavy"), Some(&30), "{counts:?}; log:\n{}", w.log_text());
    assert_eq!(counts.get("light"), Some(&10), "{counts:?}");
    assert_eq!(counts.get("backup"), None, "priority 20 serves only when 10 is gone: {counts:?}");

    // The priority-10 records go: the backup takes over.
    dns.set("_http._tcp.svc.test", vec![srv(20, 1, &backup, "backup.svc.test")]);
    wait_for(&p, "backup", Duration::from_secs(5));
    assert_eq!(who(&p), "backup");
}

#[test]
fn dns_settings_and_discovery_fields_are_checked_at_start() {
    let p = Prefix::new("  dns_resolver: [\"not-an-address\"]\n", "", "");
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("gateway.dns_resolver[0]") && out.contains("not-an-address"), "{out}");

    let p = Prefix::new("", "", "routes:\n  - id: r\n    uri: /\n    upstream:\n      discovery_type: dns\n");
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("upstream.service_name") && out.contains("required with `discovery_type`"), "{out}");
}

#[test]
fn with_etcd_a_dns_change_rebuilds_from_the_document_the_watcher_holds() {
    let Some(etcd) = common::etcd::Etcd::start() else {
        return skip("with_etcd_a_dns_change_rebuilds_from_the_document_the_watcher_holds", "etcd not installed");
    };
    let dns = DnsServer::start(1);
    let (a, b) = pair();
    dns.set("app.test", ips(&["127.0.0.1"]));
    let (p, w, admin) = common::etcd::gateway_with_admin_and(&etcd, &dns_config(&dns), "");
    let route = format!(r#"{{"uri": "/*", "upstream": {{"nodes": {{"app.test:{}": 1}}}}}}"#, a.addr.port());
    let put = common::etcd::admin(admin, "PUT", "/apisix/admin/routes/r", &route);
    assert!(put.status == 200 || put.status == 201, "{} {}", put.status, put.text());
    wait_for(&p, "a", Duration::from_secs(5));
    dns.set("app.test", ips(&["127.0.0.2"]));
    let moved = wait_for(&p, "b", Duration::from_secs(10));
    assert!(moved <= Duration::from_secs(2), "took {moved:?}; log:\n{}", w.log_text());
    // The route itself is unchanged, and a later write still applies on top of it.
    let put = common::etcd::admin(
        admin,
        "PUT",
        "/apisix/admin/routes/s",
        r#"{"uri": "/other", "upstream": {"nodes": {"127.0.0.1:1": 1}}}"#,
    );
    assert!(put.status == 200 || put.status == 201, "{} {}", put.status, put.text());
    assert_eq!(who(&p), "b");
    drop((a, b));
}
