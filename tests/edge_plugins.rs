//! The edge plugins (redirect, cors, ip-restriction, uri-blocker, request-validation,
//! response-rewrite) in the real binary against real upstreams: the APISIX documentation's
//! example configurations, unchanged, through resources.yaml and through the Admin API; then
//! hostile input: regexes and schemas that cannot work (refused at load, named), forged
//! origins, paths spelled to slip past a rule, bodies too large or read two ways.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::etcd::{admin, gateway_with_admin, Etcd};
use common::upstream::Upstream;
use common::*;
use serde_json::{json, Value};

fn up(u: &Upstream) -> String {
    format!("{{\"nodes\": {{\"{}\": 1}}}}", u.node())
}

/// The plugin configurations of the APISIX 3.x documentation's examples, exactly as written
/// there (`docs/en/latest/plugins/<name>.md`), each with the route URI it is served on here
/// (the documents reuse `/anything` and `/get`) and whether it has an upstream.
const EXAMPLES: &[(&str, &str, &str, bool)] = &[
    ("redirect-1", "/test/index.html", r#"{"redirect": {"uri": "/test/default.html", "ret_code": 301}}"#, true),
    ("redirect-2", "/test", r#"{"redirect": {"uri": "$uri/index.html", "ret_code": 301}}"#, true),
    ("redirect-3", "/hello", r#"{"redirect": {"http_to_https": true}}"#, false),
    (
        "cors-1",
        "/cors-list",
        r#"{"cors": {"allow_origins": "http://sub.domain.com,http://sub2.domain.com", "allow_methods": "GET,POST", "allow_headers": "headr1,headr2", "expose_headers": "ex-headr1,ex-headr2", "max_age": 50, "allow_credential": true}}"#,
        true,
    ),
    (
        "cors-2",
        "/cors-regex",
        r#"{"cors": {"allow_methods": "GET,POST", "allow_headers": "headr1,headr2", "expose_headers": "ex-headr1,ex-headr2", "max_age": 50, "allow_origins_by_regex": [ ".*\\.test.com$" ]}}"#,
        true,
    ),
    (
        "cors-3",
        "/cors-meta",
        r#"{"cors": {"allow_methods": "GET,POST", "allow_headers": "headr1,headr2", "expose_headers": "ex-headr1,ex-headr2", "max_age": 50, "allow_origins_by_metadata": ["key_1"]}}"#,
        true,
    ),
    ("ip-1", "/ip", r#"{"ip-restriction": {"whitelist": ["192.168.0.1/24"], "message": "Access denied"}}"#, true),
    ("uri-blocker-1", "/ub/*", r#"{"uri-blocker": {"block_rules": ["root.exe", "root.m+"]}}"#, true),
    (
        "rv-1",
        "/rv-headers",
        r#"{"request-validation": {"header_schema": {"type": "object", "required": ["User-Agent", "Host"], "properties": {"User-Agent": {"type": "string", "pattern": "^curl\/"}, "Host": {"type": "string", "enum": ["httpbin.org", "httpbin"]}}}}}"#,
        true,
    ),
    (
        "rv-2",
        "/rv-custom",
        r#"{"request-validation": {"header_schema": {"type": "object", "required": ["Host"], "properties": {"Host": {"type": "string", "enum": ["httpbin.org", "httpbin"]}}}, "rejected_code": 403, "rejected_msg": "Request header validation failed."}}"#,
        true,
    ),
    (
        "rv-3",
        "/rv-json",
        r#"{"request-validation": {"header_schema": {"type": "object", "required": ["Content-Type"], "properties": {"Content-Type": {"type": "string", "pattern": "^application\/json$"}}}, "body_schema": {"type": "object", "required": ["required_payload"], "properties": {"required_payload": {"type": "string"}, "boolean_payload": {"type": "boolean"}, "array_payload": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 200, "maximum": 599}, "uniqueItems": true, "default": [200]}}}}}"#,
        true,
    ),
    (
        "rv-4",
        "/rv-form",
        r#"{"request-validation": {"header_schema": {"type": "object", "required": ["Content-Type"], "properties": {"Content-Type": {"type": "string", "pattern": "^application\/x-www-form-urlencoded$"}}}, "body_schema": {"type": "object", "required": ["required_payload", "enum_payload"], "properties": {"required_payload": {"type": "string"}, "enum_payload": {"type": "string", "enum": ["enum_string_1", "enum_string_2"], "default": "enum_string_1"}}}}}"#,
        true,
    ),
    (
        "rw-1",
        "/rw-headers",
        r#"{"response-rewrite": {"body": "{\"code\":\"ok\",\"message\":\"new json body\"}", "headers": {"set": {"X-Server-id": 3, "X-Server-status": "on", "X-Server-balancer-addr": "$balancer_ip:$balancer_port"}}, "vars": [ [ "status","==",200 ] ]}}"#,
        true,
    ),
    (
        "rw-2",
        "/rw-filters/*",
        r#"{"response-rewrite": {"filters": [{"regex": "X-Amzn-Trace-Id", "scope": "global", "replace": "X-Amzn-Trace-Id-Replace"}]}}"#,
        true,
    ),
    ("rw-3", "/rw-base64", r#"{"response-rewrite": {"body": "SGVsbG8gV29ybGQ=", "body_base64": true}}"#, true),
    (
        "rw-4",
        "/rw-auth",
        r#"{"key-auth": {}, "response-rewrite": {"status_code": 200, "body": "{\"code\": 200, \"msg\": \"success\"}"}}"#,
        true,
    ),
];

/// The cors documentation's plugin metadata.
const CORS_METADATA: &str = r#"{"allow_origins": {"key_1": "https://domain.com", "key_2": "https://sub.domain.com,https://sub2.domain.com", "key_3": "*"}}"#;

/// One example route as an Admin API body: the documented plugins, this test's upstream.
fn example_route(id: &str, uri: &str, plugins: &str, upstream: Option<&str>) -> String {
    let up = upstream.map(|u| format!(", \"upstream\": {u}")).unwrap_or_default();
    format!("{{\"id\": \"{id}\", \"uri\": \"{uri}\", \"plugins\": {plugins}{up}}}")
}

/// Checks what the documentation says these examples do, on a gateway serving all of them.
fn examples_behave_as_documented(node: SocketAddr, u: &Upstream) {
    let r = get(node, "/test/index.html");
    assert_eq!((r.status, r.header("location")), (301, Some("/test/default.html")));
    let r = get(node, "/test");
    assert_eq!((r.status, r.header("location")), (301, Some("/test/index.html")));
    let r = request(node, "GET", "/hello?x=1", &[("Host", "example.com:9080")], b"");
    assert_eq!((r.status, r.header("location")), (301, Some("https://example.com/hello?x=1")));

    let r = request(node, "GET", "/cors-list", &[("Origin", "http://sub2.domain.com")], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some("http://sub2.domain.com"));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("access-control-allow-methods"), Some("GET,POST"));
    assert_eq!(r.header("access-control-max-age"), Some("50"));
    assert_eq!(r.header("access-control-expose-headers"), Some("ex-headr1,ex-headr2"));
    assert_eq!(r.header("access-control-allow-headers"), Some("headr1,headr2"));
    assert_eq!(r.header("vary"), Some("Origin"));
    let r = request(node, "GET", "/cors-list", &[("Origin", "http://sub3.domain.com")], b"");
    assert_eq!((r.status, r.header("access-control-allow-origin"), r.header("vary")), (200, None, Some("Origin")));
    let r = request(node, "GET", "/cors-regex", &[("Origin", "http://a.test.com")], b"");
    assert_eq!(r.header("access-control-allow-origin"), Some("http://a.test.com"));
    let r = request(node, "GET", "/cors-regex", &[("Origin", "http://a.test2.com")], b"");
    assert_eq!(r.header("access-control-allow-origin"), None);
    let r = request(node, "GET", "/cors-meta", &[("Origin", "https://domain.com")], b"");
    assert_eq!(r.header("access-control-allow-origin"), Some("https://domain.com"));
    let r = request(node, "GET", "/cors-meta", &[("Origin", "https://sub.domain.com")], b"");
    assert_eq!(r.header("access-control-allow-origin"), None, "key_2 is not named by the route");

    let r = get(node, "/ip");
    assert_eq!((r.status, r.json()), (403, json!({"message": "Access denied"})));

    assert_eq!(get(node, "/ub/root.exe").status, 403);
    assert_eq!(get(node, "/ub/rootmmm").status, 403);
    assert_eq!(get(node, "/ub/hello").status, 200);

    let ok = request(node, "GET", "/rv-headers", &[("Host", "httpbin"), ("User-Agent", "curl/8.5.0")], b"");
    assert_eq!(ok.status, 200, "{}", ok.text());
    let r = request(node, "GET", "/rv-headers", &[("Host", "httpbin"), ("User-Agent", "cli-mock")], b"");
    assert_eq!(r.status, 400);
    assert!(r.text().contains("User-Agent"), "{}", r.text());
    let r = request(node, "GET", "/rv-custom", &[("Host", "httpbin2")], b"");
    assert_eq!((r.status, r.text().as_str()), (403, "Request header validation failed."));
    let json_type = [("Content-Type", "application/json")];
    let r = request(node, "POST", "/rv-json", &json_type, br#"{"required_payload":"hello", "array_payload":[301]}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request(node, "POST", "/rv-json", &json_type, br#"{"required_payload":"hello", "array_payload":[101]}"#);
    assert_eq!(r.status, 400, "{}", r.text());
    let form_type = [("Content-Type", "application/x-www-form-urlencoded")];
    let r = request(node, "POST", "/rv-form", &form_type, b"required_payload=hello&enum_payload=enum_string_1");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request(node, "POST", "/rv-form", &form_type, b"required_payload=hello&enum_payload=enum_string_3");
    assert_eq!(r.status, 400, "{}", r.text());

    let r = get(node, "/rw-headers");
    assert_eq!((r.status, r.text().as_str()), (200, "{\"code\":\"ok\",\"message\":\"new json body\"}"));
    assert_eq!(r.header("x-server-id"), Some("3"));
    assert_eq!(r.header("x-server-status"), Some("on"));
    assert_eq!(r.header("x-server-balancer-addr"), Some(u.node().as_str()));
    let r = get(node, "/rw-filters/X-Amzn-Trace-Id");
    assert_eq!(r.json()["path"], "/rw-filters/X-Amzn-Trace-Id-Replace", "{}", r.text());
    assert_eq!(get(node, "/rw-base64").text(), "Hello World");
    let r = get(node, "/rw-auth");
    assert_eq!((r.status, r.text().as_str()), (200, "{\"code\": 200, \"msg\": \"success\"}"), "the 401 is rewritten");
    let r = request(node, "GET", "/rw-auth", &[("apikey", "jack-key")], b"");
    assert_eq!((r.status, r.text().as_str()), (200, "{\"code\": 200, \"msg\": \"success\"}"));
}

#[test]
fn apisix_examples_load_unchanged_from_resources_yaml() {
    let u = Upstream::start("u");
    let mut yaml = String::from(
        "consumers:\n  - {\"username\": \"jack\", \"plugins\": {\"key-auth\": {\"key\": \"jack-key\"}}}\n",
    );
    yaml.push_str(&format!("plugin_metadata:\n  - {{\"id\": \"cors\", {}\nroutes:\n", &CORS_METADATA[1..]));
    for (id, uri, plugins, with_upstream) in EXAMPLES {
        let upstream = with_upstream.then(|| up(&u));
        yaml.push_str(&format!("  - {}\n", example_route(id, uri, plugins, upstream.as_deref())));
    }
    let (p, _w) = start(&yaml);
    examples_behave_as_documented(p.node(), &u);
}

#[test]
fn apisix_examples_load_unchanged_through_the_admin_api() {
    let Some(etcd) = Etcd::start() else {
        return skip("apisix_examples_load_unchanged_through_the_admin_api", "etcd/etcdctl are not installed");
    };
    let u = Upstream::start("u");
    let (p, _w, port) = gateway_with_admin(&etcd, "");
    // As the documents do it: the consumer, its credential, the metadata, then each route.
    let r = admin(port, "PUT", "/apisix/admin/consumers", r#"{"username": "jack"}"#);
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    let cred = r#"{"id": "cred-jack-key-auth", "plugins": {"key-auth": {"key": "jack-key"}}}"#;
    let r = admin(port, "PUT", "/apisix/admin/consumers/jack/credentials", cred);
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    let r = admin(port, "PUT", "/apisix/admin/plugin_metadata/cors", CORS_METADATA);
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    for (id, uri, plugins, with_upstream) in EXAMPLES {
        let upstream = with_upstream.then(|| up(&u));
        let r = admin(port, "PUT", "/apisix/admin/routes", &example_route(id, uri, plugins, upstream.as_deref()));
        assert_eq!(r.status, 201, "{id}: {}", r.text());
    }
    // Changes apply in the order they were written: once the last route is served, all are.
    let served = eventually(Duration::from_secs(3), || get(p.node(), "/rw-auth").status == 200);
    assert!(served, "the routes written through the Admin API were not served");
    examples_behave_as_documented(p.node(), &u);

    // What cannot work is refused by the Admin API, with the place, and never reaches etcd.
    let bad = r#"{"uri": "/bad", "plugins": {"uri-blocker": {"block_rules": ["ok", "(unclosed"]}}}"#;
    let r = admin(port, "PUT", "/apisix/admin/routes/bad", bad);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("plugins.uri-blocker: block_rules[1]: invalid regex"), "{}", r.text());
    let bad = r#"{"uri": "/bad", "plugins": {"cors": {"allow_credential": true}}}"#;
    let r = admin(port, "PUT", "/apisix/admin/routes/bad", bad);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("you can not set '*'"), "{}", r.text());
    assert_eq!(admin(port, "GET", "/apisix/admin/routes/bad", "").status, 404);
}

#[test]
fn regexes_and_schemas_that_cannot_work_are_refused_at_load_with_their_place() {
    let bad = [
        (r#"{"redirect": {"regex_uri": ["^/(a", "/$1"]}}"#, "plugins.redirect: regex_uri[0]: invalid regex"),
        (r#"{"redirect": {"regex_uri": ["^/(a)", "/$2"]}}"#, "plugins.redirect: regex_uri[1]: `$2` names a group"),
        (
            r#"{"cors": {"allow_origins_by_regex": ["(?<=x)y"]}}"#,
            "plugins.cors: allow_origins_by_regex[0]: invalid regex",
        ),
        (
            r#"{"uri-blocker": {"block_rules": ["fine", "a{99999999}"]}}"#,
            "plugins.uri-blocker: block_rules[1]: invalid regex",
        ),
        (
            r#"{"response-rewrite": {"filters": [{"regex": "[z-a]", "replace": "x"}]}}"#,
            "plugins.response-rewrite: filters[0].regex: invalid regex",
        ),
        (
            r#"{"request-validation": {"body_schema": {"properties": {"age": {"type": "integr"}}}}}"#,
            "plugins.request-validation: body_schema.properties.age.type:",
        ),
        (
            r#"{"request-validation": {"header_schema": {"properties": {"x": {"type": "string", "pattern": "(a)\\1"}}}}}"#,
            "plugins.request-validation: header_schema.properties.x.pattern:",
        ),
        (r#"{"ip-restriction": {"whitelist": ["10.0.0.0/8", "10.0.0.300"]}}"#, "plugins.ip-restriction: whitelist[1]:"),
    ];
    let mut yaml = String::from("routes:\n");
    for (i, (plugins, _)) in bad.iter().enumerate() {
        yaml.push_str(&format!("  - {{\"id\": \"bad{i}\", \"uri\": \"/bad{i}\", \"plugins\": {plugins}}}\n"));
    }
    let p = Prefix::new("", "", &yaml);
    let (code, out) = start_refused(&p);
    assert_ne!(code, 0, "{out}");
    for (i, (_, expected)) in bad.iter().enumerate() {
        let line = format!("routes[{i}] (id bad{i}): {expected}");
        assert!(out.contains(&line), "expected `{line}` in:\n{out}");
    }
}

#[test]
fn redirects_to_https_with_the_configured_port_and_by_regex() {
    let u = Upstream::start("u");
    let resources = format!(
        "routes:\n  - {{id: 1, uri: /secure/*, plugins: {{redirect: {{http_to_https: true}}}}, upstream: {u}}}\n  - {{id: 2, uri: /old/*, plugins: {{redirect: {{regex_uri: [\"^/old/(.*)\", \"/new/$1\"], append_query_string: true, ret_code: 307}}}}, upstream: {u}}}\n",
        u = up(&u)
    );
    let p = Prefix::new("", "plugin_attr:\n  redirect: {https_port: 9443}\n", &resources);
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    let r = request(p.node(), "POST", "/secure/a?b=1", &[("Host", "Shop.Example:80")], b"x");
    assert_eq!((r.status, r.header("location")), (308, Some("https://shop.example:9443/secure/a?b=1")));
    let r = request(p.node(), "GET", "/secure/a", &[("X-Forwarded-Proto", "https")], b"");
    assert_eq!(r.status, 200, "already HTTPS in front of the gateway: proxied");
    let r = request(p.node(), "GET", "/secure/a", &[("Host", "evil.example/phish")], b"");
    assert_eq!(r.status, 400, "a forged Host is not redirected to");
    let r = get(p.node(), "/old/a/b?x=1");
    assert_eq!((r.status, r.header("location")), (307, Some("/new/a/b?x=1")));
    assert_eq!(r.body.len(), 0);
    assert_eq!(u.hits(), 1, "redirects never reach the upstream");
}

#[test]
fn cors_preflights_stay_at_the_gateway_and_forged_origins_get_nothing() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /api/*, plugins: {{key-auth: {{}}, cors: {{allow_origins: \"https://app.example,https://admin.example\", allow_methods: \"**\", allow_headers: \"**\", allow_credential: true, timing_allow_origins: \"https://app.example\"}}}}, upstream: {u}}}\nconsumers:\n  - {{username: jack, plugins: {{key-auth: {{key: k}}}}}}\n",
        u = up(&u)
    ));
    let preflight = |origin: &str| {
        request(
            p.node(),
            "OPTIONS",
            "/api/x",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "PUT"),
                ("Access-Control-Request-Headers", "apikey,x-b"),
            ],
            b"",
        )
    };
    let r = preflight("https://app.example");
    assert_eq!((r.status, r.body.len()), (200, 0), "answered before key-auth: {}", r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"));
    assert_eq!(r.header("access-control-allow-headers"), Some("apikey,x-b"));
    assert_eq!(r.header("access-control-allow-methods"), Some("GET,POST,PUT,DELETE,PATCH,HEAD,OPTIONS,CONNECT,TRACE"));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("timing-allow-origin"), Some("https://app.example"));
    for forged in [
        "https://app.example.evil.org",
        "https://evil.org",
        "null",
        "https://APP.example",
        "https://app.example,https://evil.org",
    ] {
        let r = preflight(forged);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("access-control-allow-origin"), None, "{forged}");
        assert_eq!(r.header("access-control-allow-credentials"), None, "{forged}");
        assert_eq!(r.header("vary"), Some("Origin"));
    }
    assert_eq!(u.hits(), 0, "preflights never reach the upstream");
    let r = request(p.node(), "GET", "/api/x", &[("Origin", "https://admin.example"), ("apikey", "k")], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some("https://admin.example"));
    assert_eq!(r.header("timing-allow-origin"), None, "not in the timing list");
    let r = request(p.node(), "GET", "/api/x", &[("Origin", "https://admin.example")], b"");
    assert_eq!(r.status, 401, "CORS does not replace authentication");
    assert_eq!(r.header("access-control-allow-origin"), Some("https://admin.example"), "the browser may read the 401");
    assert_eq!(u.hits(), 1);
}

#[test]
fn ip_restriction_on_http_routes_and_stream_routes_under_one_name() {
    let u = Upstream::start("u");
    let tcp = free_port();
    let resources = format!(
        "routes:\n  - {{id: allow, uri: /allow, plugins: {{ip-restriction: {{whitelist: [\"127.0.0.0/8\", \"::1\"]}}}}, upstream: {u}}}\n  - {{id: deny, uri: /deny, plugins: {{ip-restriction: {{blacklist: [\"10.0.0.0/8\", \"127.0.0.1\"], response_code: 404}}}}, upstream: {u}}}\n  - {{id: other, uri: /other, plugins: {{ip-restriction: {{whitelist: [\"10.0.0.0/8\"]}}}}, upstream: {u}}}\nstream_routes:\n  - {{id: s, server_port: {tcp}, plugins: {{ip-restriction: {{blacklist: [\"127.0.0.0/8\"]}}}}, upstream: {u}}}\n",
        u = up(&u)
    );
    let p = Prefix::new(
        &format!("  stream_proxy:\n    tcp: [{{ip: 127.0.0.1, port: {tcp}}}]\n"),
        "plugins: [ip-restriction]\nstream_plugins: [ip-restriction]\n",
        &resources,
    );
    let w = Weir::start(&p);
    w.wait_ready(p.node());
    assert_eq!(get(p.node(), "/allow").status, 200);
    let r = get(p.node(), "/deny");
    assert_eq!((r.status, r.json()), (404, json!({"message": "Your IP address is not allowed"})));
    let r = get(p.node(), "/other");
    assert_eq!((r.status, r.json()), (403, json!({"message": "Your IP address is not allowed"})));
    assert_eq!(u.hits(), 1, "refused requests never reach the upstream");
    // The stream side of the same name closes the connection.
    let mut s = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], tcp))).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let _ = s.write_all(b"GET /allow HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = [0u8; 64];
    assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)), "a blacklisted stream client was served");
    assert_eq!(u.hits(), 1);
    let schema = get(p.control(), "/v1/schema").json();
    assert!(schema["plugins"]["ip-restriction"].is_object() && schema["stream-plugins"]["ip-restriction"].is_object());
}

/// Sends `target` exactly as written (no client-side normalization).
fn raw_get(addr: SocketAddr, target: &str) -> u16 {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    parse_response(&out).status
}

#[test]
fn uri_blocker_sees_every_spelling_of_a_path() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /*, plugins: {{uri-blocker: {{block_rules: [\"^/internal/\", \"<script\", \"^/files/a/b$\", \"union select\"], rejected_msg: blocked}}}}, upstream: {u}}}\n  - {{id: 2, uri: /ci/*, plugins: {{uri-blocker: {{block_rules: [\"^/ci/secret\"], case_insensitive: true}}}}, upstream: {u}}}\n",
        u = up(&u)
    ));
    let node = p.node();
    let r = get(node, "/internal/x");
    assert_eq!((r.status, r.json()), (403, json!({"error_msg": "blocked"})));
    for spelled in [
        "//internal/x",
        "/public/../internal/x",
        "/public/%2e%2e/internal/x",
        "/./internal/x",
        "/%69nternal/x",
        "/files/a%2Fb",
        "/files/a%2fb",
        "/search?q=%3Cscript%3Ealert(1)",
        "/search?q=%3cscript",
        "/search?q=1%20union%20select%20password",
        "http://x/internal/x",
    ] {
        assert_eq!(raw_get(node, spelled), 403, "{spelled} got past the rules");
    }
    // Paths the normalizer refuses never reach a plugin; the rest are served.
    assert_eq!(raw_get(node, "/../internal/x"), 400);
    assert_eq!(raw_get(node, "/internal%00/x"), 400);
    assert_eq!(raw_get(node, "/public/internal/x"), 200);
    assert_eq!(raw_get(node, "/Internal/x"), 200, "rules are case-sensitive unless told");
    assert_eq!(raw_get(node, "/ci/SeCrEt"), 403);
    assert_eq!(raw_get(node, "/ci/public"), 200);
    let hits = u.hits();
    assert_eq!(raw_get(node, "/internal/y"), 403);
    assert_eq!(u.hits(), hits, "blocked requests never reach the upstream");
}

#[test]
fn request_validation_against_hostile_bodies() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /v, plugins: {{request-validation: {{body_schema: {{type: object, required: [name], properties: {{name: {{type: string, maxLength: 8}}}}}}}}}}, upstream: {u}}}\n  - {{id: 2, uri: /small, plugins: {{request-validation: {{body_schema: {{type: object}}, max_req_body_size: 1024, rejected_code: 413, rejected_msg: too large}}}}, upstream: {u}}}\n  - {{id: 3, uri: /upload, plugins: {{request-validation: {{header_schema: {{type: object, required: [x-token]}}}}}}, upstream: {u}}}\n",
        u = up(&u)
    ));
    let node = p.node();
    let ct = [("Content-Type", "application/json")];
    let r = request(node, "POST", "/v", &ct, br#"{"name": "jack"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["body"], r#"{"name": "jack"}"#, "the body is passed on exactly as sent");
    let hits = u.hits();
    for (body, why) in [
        (&br#"{"name": "jack", "name": {"admin": true}}"#[..], "duplicate key"),
        (br#"{"name": "a-very-long-name"}"#, "name"),
        (br#"{"name": "jack""#, "invalid JSON"),
        (b"", "missing"),
        (b"[1, 2]", ""),
    ] {
        let r = request(node, "POST", "/v", &ct, body);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(body));
        assert!(r.text().contains(why), "{why}: {}", r.text());
    }
    let two = [("Content-Type", "application/json"), ("Content-Type", "application/x-www-form-urlencoded")];
    let r = request(node, "POST", "/v", &two, br#"{"name": "jack"}"#);
    assert_eq!(r.status, 400, "{}", r.text());
    // Over max_req_body_size, and over the gateway's buffering limit.
    let r = request(node, "POST", "/small", &ct, format!("{{\"pad\": \"{}\"}}", "x".repeat(4096)).as_bytes());
    assert_eq!((r.status, r.text().as_str()), (413, "too large"));
    assert_eq!(post_len(node, "/v", &[], 17 << 20).status, 413, "over the gateway's 16 MiB buffer");
    assert_eq!(u.hits(), hits, "no refused body reached the upstream");
    // Without a body schema the body is not buffered: a large upload streams through.
    let r = request(node, "POST", "/upload", &[("x-token", "t")], b"");
    assert_eq!(r.status, 200);
    let n: usize = 20 << 20;
    let r = post_len(node, "/upload", &[("x-token", "t")], n);
    assert_eq!((r.status, r.text()), (200, n.to_string()), "streamed to the upstream whole");
}

/// POSTs `n` bytes with a Content-Length, tolerating a gateway that answers (and closes)
/// before the body is all sent; the response.
fn post_len(addr: SocketAddr, path: &str, headers: &[(&str, &str)], n: usize) -> Response {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let mut head = format!("POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {n}\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("head");
    let chunk = vec![b'u'; 64 << 10];
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len());
        if s.write_all(&chunk[..k]).is_err() {
            break;
        }
        left -= k;
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    parse_response(&out)
}

#[test]
fn response_rewrite_vars_filters_and_large_bodies() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /status/*, plugins: {{response-rewrite: {{vars: [[\"status\", \">=\", 500]], status_code: 503, body: \"{{\\\"error\\\":\\\"unavailable\\\"}}\", headers: {{add: [\"X-Rewritten: yes\"], remove: [content-type]}}}}}}, upstream: {u}}}\n  - {{id: 2, uri: /echo/*, plugins: {{response-rewrite: {{filters: [{{regex: \"\\\"node\\\":\\\"(\\\\w+)\\\"\", replace: \"\\\"node\\\":\\\"<$1>\\\"\"}}, {{regex: \"SECRET-\\\\d+\", scope: global, replace: \"[redacted]\", options: i}}]}}}}, upstream: {u}}}\n  - {{id: 3, uri: /bytes/*, plugins: {{response-rewrite: {{filters: [{{regex: x, scope: global, replace: y}}], max_resp_body_size: 100000}}}}, upstream: {u}}}\n",
        u = up(&u)
    ));
    let node = p.node();
    let r = get(node, "/status/502");
    assert_eq!((r.status, r.text().as_str()), (503, "{\"error\":\"unavailable\"}"));
    assert_eq!(r.header("x-rewritten"), Some("yes"));
    assert_eq!(r.header("content-type"), None);
    let r = get(node, "/status/201");
    assert_eq!((r.status, r.text().as_str()), (201, "status 201 from u"), "vars do not hold: untouched");
    assert_eq!(r.header("x-rewritten"), None);

    let r = get(node, "/echo/secret-1/SECRET-22");
    let body = r.json();
    assert_eq!(body["node"], "<u>");
    assert_eq!(body["path"], "/echo/[redacted]/[redacted]");
    assert_eq!(r.header("content-length"), None);

    // Under the bound: substituted. Over it: the whole body, unchanged.
    let r = get(node, "/bytes/50000");
    assert!(r.body.len() == 50_000 && r.body.iter().all(|b| *b == b'y'), "substituted under the bound");
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    for n in [100_001, 3_000_000] {
        let r = get(node, &format!("/bytes/{n}"));
        assert_eq!(r.status, 200);
        assert!(
            r.body.len() == n && r.body.iter().all(|b| *b == b'x'),
            "{n} bytes: whole and unchanged past the bound"
        );
    }
}

#[test]
fn edge_plugins_answer_unmatched_requests_as_global_rules() {
    let (p, _w) = start(
        "global_rules:\n  - {id: g, plugins: {cors: {allow_origins: \"https://app.example\"}, uri-blocker: {block_rules: [\"\\\\.php$\"]}}}\n",
    );
    let r = request(p.node(), "GET", "/index.php", &[("Origin", "https://app.example")], b"");
    assert_eq!(r.status, 403);
    assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"), "the refusal is readable");
    let r = request(p.node(), "GET", "/nothing", &[("Origin", "https://app.example")], b"");
    assert_eq!(r.status, 404);
    assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"));
    let v: Value = r.json();
    assert_eq!(v["error_msg"], "404 Route Not Found");
}
