//! The route model beyond `uri`, against the real binary and real upstreams: `vars` (APISIX
//! expressions, `post_arg_*` on form bodies), `filter_func` refused, route `timeout`,
//! `plugin_configs` with `plugin_config_id`, and service `hosts`.

mod common;

use std::time::{Duration, Instant};

use common::upstream::Upstream;
use common::*;

fn up(u: &Upstream) -> String {
    format!("{{nodes: {{\"{}\": 1}}}}", u.node())
}

#[test]
fn vars_route_by_arguments_headers_cookies_and_form_bodies() {
    let stable = Upstream::start("stable");
    let canary = Upstream::start("canary");
    // The APISIX docs' examples, as written (upstreams pointed at local servers).
    let (p, _w) = start(&format!(
        r#"routes:
  - id: plain
    uri: /index.html
    upstream: {stable}
  - id: canary
    uri: /index.html
    priority: 1
    vars: [["arg_name", "==", "jack"], ["http_x_env", "~~", "^ca"]]
    upstream: {canary}
  - id: or
    uri: /or
    vars: ["OR", [["arg_a", "==", "1"]], ["AND", ["cookie_b", "==", "2"], ["http_x_c", "in", ["x", "y"]]]]
    upstream: {canary}
  - id: negated
    uri: /not
    vars: [["http_x_env", "!", "~~", "^prod"], ["request_method", "==", "GET"]]
    upstream: {canary}
  - id: form
    uri: /login
    methods: [POST]
    vars: [["post_arg_user", "==", "jack the 1st"]]
    upstream: {canary}
  - id: form-fallback
    uri: /login
    methods: [POST]
    upstream: {stable}
"#,
        stable = up(&stable),
        canary = up(&canary),
    ));
    let node = |path: &str, headers: &[(&str, &str)]| {
        let r = request(p.node(), "GET", path, headers, b"");
        (r.status, r.json()["node"].as_str().unwrap_or("").to_owned())
    };
    assert_eq!(node("/index.html?name=jack", &[("x-env", "canary")]), (200, "canary".into()));
    assert_eq!(node("/index.html?name=jack", &[("x-env", "production")]), (200, "stable".into()));
    assert_eq!(node("/index.html?name=rose", &[("x-env", "canary")]), (200, "stable".into()));
    assert_eq!(node("/index.html", &[("X-Env", "canary")]), (200, "stable".into()), "all conditions must hold");
    assert_eq!(node("/or?a=1", &[]).0, 200);
    assert_eq!(node("/or", &[("cookie", "z=0; b=2"), ("x-c", "y")]).0, 200);
    assert_eq!(node("/or", &[("cookie", "b=2"), ("x-c", "z")]).0, 404, "in: not in the list");
    assert_eq!(node("/not", &[("x-env", "staging")]).0, 200);
    assert_eq!(node("/not", &[("x-env", "prod-eu")]).0, 404);
    assert_eq!(node("/not", &[]).0, 200, "a missing variable does not match `~~`; negated, it holds");

    // A form body picks the route and still reaches the upstream whole.
    let form = |body: &str, ctype: &str| {
        let r = request(p.node(), "POST", "/login", &[("content-type", ctype)], body.as_bytes());
        let v = r.json();
        (v["node"].as_str().unwrap_or("").to_owned(), v["body"].as_str().unwrap_or("").to_owned())
    };
    let body = "pass=x&user=jack+the+%31st";
    assert_eq!(form(body, "application/x-www-form-urlencoded; charset=utf-8"), ("canary".into(), body.into()));
    assert_eq!(form("user=rose", "application/x-www-form-urlencoded").0, "stable");
    assert_eq!(form(body, "text/plain").0, "stable", "post_arg_* reads form bodies only");
}

#[test]
fn a_vars_that_cannot_work_is_refused_at_load_with_its_path() {
    for (vars, why) in [
        (r#"[["arg_a", "=~", "x"]]"#, "vars: [0][1]: unknown operator `=~`"),
        (r#"[["arg_a", "==", "x"], ["http_x", "~~", "(unclosed"]]"#, "vars: [1]"),
        (r#"[["nope_var", "==", "x"]]"#, "unknown variable `nope_var`"),
        (r#"[["arg_a", "in", "not-a-list"]]"#, "`in` takes a list"),
        (r#"[["arg_a", "~~", "a{1000}{1000}{1000}"]]"#, "invalid regex"),
    ] {
        let p = Prefix::new("", "", &format!("routes:\n  - {{id: r1, uri: /x, vars: {vars}}}\n"));
        let (code, out) = start_refused(&p);
        assert_ne!(code, 0, "{vars}");
        assert!(out.contains("routes[0] (id r1)") && out.contains(why), "{vars}: {out}");
    }
    let p = Prefix::new("", "", "routes:\n  - {id: f, uri: /x, filter_func: \"function(vars) return true end\"}\n");
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("filter_func") && out.contains("Lua") && out.contains("vars"), "{out}");
}

#[test]
fn a_route_timeout_overrides_its_upstreams() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: quick, uri: /sleep/*, timeout: {{connect: 1, send: 1, read: 0.3}}, upstream: {u}}}\n  - {{id: slow, uri: /slow/*, plugins: {{proxy-rewrite: {{regex_uri: [\"^/slow/(.*)\", \"/sleep/$1\"]}}}}, upstream: {{nodes: {{\"{n}\": 1}}, timeout: {{connect: 1, send: 1, read: 0.3}}}}, timeout: {{connect: 1, send: 1, read: 5}}}}\n",
        u = up(&u),
        n = u.node()
    ));
    let t = Instant::now();
    let r = get(p.node(), "/sleep/1500");
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(t.elapsed() < Duration::from_millis(1400), "the route's read timeout: {:?}", t.elapsed());
    let r = get(p.node(), "/slow/600");
    assert_eq!(r.status, 200, "the route's longer read timeout wins over the upstream's: {}", r.text());
}

#[test]
fn plugin_configs_are_shared_and_a_routes_own_conf_wins() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        r#"plugin_configs:
  - id: 1
    desc: shared headers
    plugins:
      proxy-rewrite: {{headers: {{set: {{x-from: plugin-config}}}}}}
      request-id: {{}}
routes:
  - {{id: a, uri: /a, plugin_config_id: 1, upstream: {u}}}
  - {{id: b, uri: /b, plugin_config_id: 1, upstream: {u}, plugins: {{proxy-rewrite: {{headers: {{set: {{x-from: route}}}}}}}}}}
"#,
        u = up(&u)
    ));
    let r = get(p.node(), "/a");
    assert_eq!(r.json()["headers"]["x-from"], "plugin-config");
    assert!(r.header("x-request-id").is_some(), "every plugin of the config runs");
    let r = get(p.node(), "/b");
    assert_eq!(r.json()["headers"]["x-from"], "route", "the route's own configuration wins");
    assert!(r.header("x-request-id").is_some(), "the config's other plugins still run");

    // References are checked as for upstreams, and a config's plugins as a route's.
    let p = Prefix::new("", "", "routes:\n  - {id: a, uri: /a, plugin_config_id: 9}\n");
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("plugin_config_id") && out.contains("plugin config `9` does not exist"), "{out}");
    let p = Prefix::new("", "", "plugin_configs:\n  - {id: 1, plugins: {limit-count: {count: -1, time_window: 1}}}\n");
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("plugin_configs[0] (id 1)") && out.contains("plugins.limit-count"), "{out}");
}

#[test]
fn service_hosts_apply_to_routes_that_name_none() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "services:\n  - {{id: s, hosts: [\"*.example.com\", api.test], upstream: {u}}}\nroutes:\n  - {{id: r, uri: /svc, service_id: s}}\n  - {{id: own, uri: /own, service_id: s, host: own.test}}\n",
        u = up(&u)
    ));
    let at = |path: &str, host: &str| request(p.node(), "GET", path, &[("host", host)], b"").status;
    assert_eq!(at("/svc", "a.example.com"), 200);
    assert_eq!(at("/svc", "api.test"), 200);
    assert_eq!(at("/svc", "other.test"), 404);
    assert_eq!(at("/own", "own.test"), 200);
    assert_eq!(at("/own", "api.test"), 404, "a route's own host wins over the service's");
}
