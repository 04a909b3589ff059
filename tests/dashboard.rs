//! The dashboard (`GET /v1/dashboard`, `GET /` of the control server) in headless Chromium: the
//! static parts with JavaScript off, the numbers moving with real traffic with it on, the explain
//! form posted without JavaScript, and the stats it reads. Screenshots go to the test's output
//! directory (CARGO_TARGET_TMPDIR); their paths are printed.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::upstream::Upstream;
use common::*;

use common::chromium::ARGS as COMMON_ARGS;

/// Runs chromium on `url`: the DOM after `budget_ms` of (virtual) time, and a screenshot to `shot`.
fn browse(chromium: &str, profile: &Path, url: &str, js: bool, budget_ms: u32, shot: &Path) -> String {
    let mut extra: Vec<String> = vec![format!("--user-data-dir={}", profile.display())];
    if !js {
        // JavaScript off as a user turns it off: the profile's content setting (blocks the
        // page's scripts; `--dump-dom` still works, unlike with `scriptEnabled=false`).
        std::fs::create_dir_all(profile.join("Default")).expect("create profile");
        std::fs::write(
            profile.join("Default/Preferences"),
            r#"{"profile": {"default_content_setting_values": {"javascript": 2}}}"#,
        )
        .expect("write profile preferences");
    }
    extra.push(format!("--virtual-time-budget={budget_ms}"));
    let dom = std::process::Command::new(chromium)
        .args(COMMON_ARGS)
        .args(&extra)
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("run chromium");
    let text = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert!(text.contains("<html"), "no page from chromium: {}", String::from_utf8_lossy(&dom.stderr));
    let status = std::process::Command::new(chromium)
        .args(COMMON_ARGS)
        .args(&extra)
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1400,1100")
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(shot.exists(), "no screenshot: {}", String::from_utf8_lossy(&status.stderr));
    println!("screenshot: {}", shot.display());
    text
}

fn out_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// The text of the cell of `route`'s number `k` in the DOM.
fn cell(dom: &str, route: &str, k: &str) -> String {
    let marker = format!("data-r=\"{route}\" data-k=\"{k}\">");
    let at = dom.find(&marker).unwrap_or_else(|| panic!("no {k} cell for {route}"));
    let rest = &dom[at + marker.len()..];
    rest[..rest.find('<').unwrap_or(0)].to_owned()
}

fn resources(up: &Upstream, dead: u16) -> String {
    format!(
        "global_rules:\n  - {{id: g, plugins: {{request-id: {{}}}}}}\n\
         upstreams:\n  - id: pool\n    nodes: {{\"{n}\": 1, \"127.0.0.1:{dead}\": 1}}\n    checks: {{active: {{type: tcp, healthy: {{interval: 1}}, unhealthy: {{interval: 1, tcp_failures: 1}}}}}}\n\
         routes:\n  - {{id: busy, uri: /status/*, upstream_id: pool, plugins: {{proxy-rewrite: {{headers: {{set: {{x-a: b}}}}}}}}}}\n\
         \x20 - {{id: quiet, name: \"<quiet>\", uri: /quiet, upstream: {{nodes: {{\"{n}\": 1}}}}}}\n",
        n = up.node()
    )
}

#[test]
fn dashboard_static_parts_render_with_javascript_off() {
    let Some(chromium) = common::chromium::find("dashboard_static_parts_render_with_javascript_off") else { return };
    let up = Upstream::start("u");
    let dead = free_port();
    let (p, _w) = start(&resources(&up, dead));
    let _ = get(p.node(), "/status/200");
    assert!(eventually(Duration::from_secs(10), || {
        let page = get(p.control(), "/v1/dashboard").text();
        page.contains(&format!("127.0.0.1:{dead} (1, unhealthy)"))
    }));
    let dom = browse(
        chromium,
        &p.dir.join("chromium-nojs"),
        &format!("http://{}/v1/dashboard", p.control()),
        false,
        1000,
        &out_dir().join("dashboard-nojs.png"),
    );
    assert!(!dom.contains("<body data-samples="), "the script did not run");
    for part in [
        "<table id=\"route-table\">",
        "<td>busy</td>",
        "request-id (",
        "proxy-rewrite (",
        "upstreams/pool",
        &format!("{} (1, healthy)", up.node()),
        &format!("127.0.0.1:{dead} (1, unhealthy)"),
        "<th>provider</th><td>yaml</td>",
        "<form id=\"explain-form\" method=\"post\" action=\"/v1/explain\">",
    ] {
        assert!(dom.contains(part), "{part} missing: {dom}");
    }
    assert!(dom.contains("&lt;quiet&gt;") && !dom.contains("<quiet>"), "names are escaped");
    // `/` of the control server is the same page.
    let root = get(p.control(), "/");
    assert_eq!(root.status, 200);
    assert!(root.text().contains("<table id=\"route-table\">"));
    // The form, posted without a script, answers with a page.
    let form = request(
        p.control(),
        "POST",
        "/v1/explain",
        &[("Content-Type", "application/x-www-form-urlencoded"), ("Accept", "text/html")],
        b"method=GET&uri=%2Fstatus%2F200&host=&client_ip=127.0.0.1&headers=X-A%3A+1",
    );
    assert_eq!(form.status, 200, "{}", form.text());
    assert!(form.text().contains("route `busy` matches"), "{}", form.text());
    let bad = request(
        p.control(),
        "POST",
        "/v1/explain",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"uri=%2F&headers=no-colon",
    );
    assert_eq!(bad.status, 400);
    assert!(bad.json()["error_msg"].as_str().unwrap_or("").contains("name: value"));
}

#[test]
fn dashboard_numbers_move_with_traffic() {
    let Some(chromium) = common::chromium::find("dashboard_numbers_move_with_traffic") else { return };
    let up = Upstream::start("u");
    let (p, _w) = start(&resources(&up, free_port()));
    let url = format!("http://{}/v1/dashboard", p.control());
    let before = browse(chromium, &p.dir.join("chromium-1"), &url, true, 3000, &out_dir().join("dashboard-idle.png"));
    assert_eq!(cell(&before, "busy", "rps"), "0.00", "no traffic yet");
    assert!(before.contains("<body data-samples="), "the script refreshed the numbers");
    // Real traffic: successes and upstream 5xx on `busy`.
    for i in 0..60 {
        let path = if i % 4 == 0 { "/status/500" } else { "/status/200" };
        let _ = get(p.node(), path);
    }
    assert!(eventually(Duration::from_secs(10), || {
        let s = get(p.control(), "/v1/dashboard/stats").json();
        s["routes"].as_array().is_some_and(|r| r.iter().any(|r| r["id"] == "busy" && r["requests"] == 60))
    }));
    let after = browse(chromium, &p.dir.join("chromium-2"), &url, true, 3000, &out_dir().join("dashboard.png"));
    let rps: f64 = cell(&after, "busy", "rps").parse().unwrap_or(0.0);
    assert!(rps > 0.0, "busy's rate moved: {}", cell(&after, "busy", "rps"));
    assert_eq!(cell(&after, "busy", "error_rate"), "25.0 %", "a quarter of the answers were 5xx");
    assert!(cell(&after, "busy", "mean_ms").ends_with(" ms"));
    assert!(cell(&after, "busy", "p99_ms").starts_with('≤'));
    assert!(cell(&after, "*", "rps").parse::<f64>().unwrap_or(0.0) > 0.0);
    assert_eq!(cell(&after, "quiet", "rps"), "0.00");
    let spark = after.split("<polyline").nth(1).unwrap_or("");
    assert!(spark.contains("points=\"") && !spark.starts_with(" fill=\"none\" points=\"\""), "a sparkline: {spark}");
}

#[test]
fn dashboard_stats_count_routes_and_unrouted_requests() {
    let up = Upstream::start("u");
    let (p, _w) = start(&resources(&up, free_port()));
    for _ in 0..10 {
        let _ = get(p.node(), "/status/204");
    }
    for _ in 0..5 {
        let _ = get(p.node(), "/no/such/route");
    }
    assert!(eventually(Duration::from_secs(10), || {
        let s = get(p.control(), "/v1/dashboard/stats").json();
        let of = |id: &str| {
            s["routes"].as_array().and_then(|r| r.iter().find(|r| r["id"] == id)).map(|r| r["requests"].clone())
        };
        of("busy") == Some(10.into()) && of("") == Some(5.into()) && s["total"]["requests"] == 15
    }));
    let s = get(p.control(), "/v1/dashboard/stats").json();
    let unrouted = s["routes"].as_array().and_then(|r| r.iter().find(|r| r["id"] == "")).cloned().unwrap_or_default();
    assert_eq!(unrouted["client_error_rate"], 1.0, "the 404s: {s}");
    assert!(s["window_seconds"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(!s["series"].as_array().is_some_and(|v| v.is_empty()));
}

#[test]
fn dashboard_shows_the_last_load_error_until_a_good_load() {
    let up = Upstream::start("u");
    let (p, _w) = start(&resources(&up, free_port()));
    p.write_resources("routes:\n  - {id: broken, uri: /b, upstream_id: nowhere}\n");
    let error_cell = |page: &str| {
        let at = page.find("id=\"last-error\"").map(|i| &page[i..]).unwrap_or("");
        at[..at.find("</td>").unwrap_or(0)].to_owned()
    };
    assert!(
        eventually(Duration::from_secs(10), || error_cell(&get(p.control(), "/v1/dashboard").text())
            .contains("nowhere")),
        "the refused file is shown: {}",
        get(p.control(), "/v1/dashboard").text()
    );
    assert!(get(p.control(), "/v1/config_status").json()["last_error"].as_str().unwrap_or("").contains("nowhere"));
    // The running routes are still the last good ones.
    assert!(get(p.control(), "/v1/dashboard").text().contains("<td>busy</td>"));
    p.write_resources(&resources(&up, free_port()));
    assert!(eventually(Duration::from_secs(10), || error_cell(&get(p.control(), "/v1/dashboard").text())
        .ends_with(">none")));
}
