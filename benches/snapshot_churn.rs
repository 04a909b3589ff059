//! One route changed among many: what the etcd provider's rebuild costs (issue 25's "one route
//! change applied at 10k routes"), without etcd or sockets, so that it can run under callgrind.
//!
//!   cargo bench --bench snapshot_churn -- [ROUTES] [CHANGES] [plugins]
//!   valgrind --tool=callgrind target/release/deps/snapshot_churn-* 10000 20
//!
//! Each change rewrites one route's value, as a watch event does, and goes through what
//! `watch::etcd::apply` runs: the document taken from the values, the known fingerprints, the
//! build against the snapshot serving, the values given back. It also times a validation build
//! of the same set, and then the same changes as patches of the snapshot serving (what the
//! watcher and the Admin API run for a change to routes only, `Snapshot::patch_routes`).
use std::path::Path;
use std::time::Instant;

use serde_json::json;
use weir::resources::etcd::{valid_document, Values};
use weir::tables::snapshot::{Mode, Prints, RouteChange, Snapshot};

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let routes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let changes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    // `plugins`: every route has one plugin of its own (an instance per route to carry over).
    let plugins = args.next().is_some_and(|a| a == "plugins");
    let catalog = weir::plugins_catalog();
    let enabled = catalog.enable(&catalog.names());
    let prefix = "/weir";
    let mut values: Values = (0..routes)
        .map(|i| {
            let mut v = json!({"uri": format!("/cold/{i}"), "upstream": {"nodes": {"127.0.0.1:18481": 1}}});
            if plugins {
                v["plugins"] = json!({"proxy-rewrite": {"headers": {"set": {"x-route": format!("cold{i}")}}}});
            }
            (format!("{prefix}/routes/cold{i}"), v)
        })
        .collect();
    let mut prints = Prints::default();
    let base = Path::new(".");
    let mut serving: Option<Snapshot> = None;
    let mut times = Vec::with_capacity(changes);
    for change in 0..=changes {
        if change > 0 {
            let key = format!("{prefix}/routes/load{change}");
            values.insert(
                key.clone(),
                json!({"uri": format!("/load/{change}"), "upstream": {"nodes": {"127.0.0.1:18481": 1}}}),
            );
            prints.forget(&key);
        }
        let started = Instant::now();
        let prints = std::cell::RefCell::new(&mut prints);
        let build = |d: &serde_json::Value, keys: &weir::resources::etcd::KeysByList<'_>| {
            let known = prints.borrow_mut().of_document(d, keys);
            Snapshot::build_mode(d, &enabled, base, Mode::Apply(serving.as_ref()), Some(&known))
        };
        let (built, skipped) = valid_document(build, &mut values, prefix, false);
        assert!(skipped.is_empty(), "{skipped:?}");
        let Some((_, snapshot)) = built else { panic!("the set does not build") };
        if change > 0 {
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        // The previous snapshot is freed off the path of the next change, as `publish` does.
        let old = serving.replace(snapshot);
        std::thread::spawn(move || drop(old));
    }
    let report = |what: &str, times: &mut Vec<f64>| {
        times.sort_by(f64::total_cmp);
        let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
        println!("{routes} routes, {changes} changes, {what}: p50 {:.3} ms, p99 {:.3} ms", at(0.5), at(0.99));
    };
    report("full build", &mut times);
    // The same changes as patches of the snapshot serving (what the etcd watcher runs for a
    // change to routes only, `Snapshot::patch_routes`).
    let mut patched = Vec::with_capacity(changes);
    let mut validated = Vec::with_capacity(changes);
    for change in 1..=changes {
        let Some(current) = serving.as_ref() else { break };
        let id = format!("patch{change}");
        let value = json!({"id": id, "uri": format!("/patch/{change}"), "upstream": {"nodes": {"127.0.0.1:18481": 1}}});
        let list = [RouteChange { id: &id, value: Some(&value) }];
        let started = Instant::now();
        assert!(current.patch_routes(&list, &enabled, base, true).is_some(), "the validation patch gave up");
        validated.push(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        let Some(next) = current.patch_routes(&list, &enabled, base, false) else { panic!("the patch gave up") };
        patched.push(started.elapsed().as_secs_f64() * 1e3);
        let old = serving.replace(next);
        std::thread::spawn(move || drop(old));
    }
    report("patch", &mut patched);
    report("validation patch (an Admin API write)", &mut validated);
    // What an Admin API write runs: the set with the write in it, checked against the snapshot
    // serving (its compiled routes and upstreams reused, plugins built check-only).
    let key = format!("{prefix}/routes/admin");
    values.insert(key.clone(), json!({"uri": "/admin", "upstream": {"nodes": {"127.0.0.1:18481": 1}}}));
    prints.forget(&key);
    let started = Instant::now();
    let prints = std::cell::RefCell::new(&mut prints);
    let check = |d: &serde_json::Value, keys: &weir::resources::etcd::KeysByList<'_>| {
        let known = prints.borrow_mut().of_document(d, keys);
        Snapshot::build_mode(d, &enabled, base, Mode::Validate(serving.as_ref()), Some(&known)).map(drop)
    };
    let (ok, _) = valid_document(check, &mut values, prefix, false);
    assert!(ok.is_some());
    println!("validation build of the set with one more route: {:.2} ms", started.elapsed().as_secs_f64() * 1e3);
}
