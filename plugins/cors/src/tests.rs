//! Unit tests of the cors plugin: APISIX's examples, preflights, credentials, metadata.

use super::*;
use weir_plugin::testing::{instance, respond, run, TestRequest};
use weir_plugin::{ConsumerDirectory, NoServices, Owner};

fn cors(conf: Value) -> Arc<dyn PluginInstance> {
    instance(&Cors, conf).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs the request phases and, unless the plugin answered, a 200 from the "upstream":
/// the response's status and headers.
fn exchange(p: &Arc<dyn PluginInstance>, req: TestRequest) -> (u16, HeaderMap) {
    let mut ctx = req.build();
    let chain = std::slice::from_ref(p);
    let head = match run(chain, &mut ctx) {
        Some(r) => ResponseHead { status: r.status, headers: r.headers },
        None => ResponseHead { status: StatusCode::OK, headers: HeaderMap::new() },
    };
    let (head, _) = respond(chain, &mut ctx, head, b"");
    (head.status.as_u16(), head.headers)
}

fn h<'m>(headers: &'m HeaderMap, name: &str) -> Option<&'m str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[test]
fn apisix_example_list_with_credentials() {
    let p = cors(json!({
        "allow_origins": "http://sub.domain.com,http://sub2.domain.com",
        "allow_methods": "GET,POST",
        "allow_headers": "headr1,headr2",
        "expose_headers": "ex-headr1,ex-headr2",
        "max_age": 50,
        "allow_credential": true
    }));
    let (status, hs) = exchange(&p, TestRequest::get("/anything").header("origin", "http://sub2.domain.com"));
    assert_eq!(status, 200);
    assert_eq!(h(&hs, "access-control-allow-origin"), Some("http://sub2.domain.com"));
    assert_eq!(h(&hs, "access-control-allow-credentials"), Some("true"));
    assert_eq!(h(&hs, "vary"), Some("Origin"));
    assert_eq!(h(&hs, "access-control-allow-methods"), Some("GET,POST"));
    assert_eq!(h(&hs, "access-control-max-age"), Some("50"));
    assert_eq!(h(&hs, "access-control-expose-headers"), Some("ex-headr1,ex-headr2"));
    assert_eq!(h(&hs, "access-control-allow-headers"), Some("headr1,headr2"));
    let (_, hs) = exchange(&p, TestRequest::get("/anything").header("origin", "http://sub3.domain.com"));
    assert_eq!(h(&hs, "vary"), Some("Origin"));
    assert!(hs.keys().all(|k| !k.as_str().starts_with("access-control-")), "{hs:?}");
    // A forged origin that merely contains an allowed one.
    for forged in
        ["http://sub2.domain.com.evil.org", "http://evil.org/http://sub2.domain.com", "HTTP://SUB2.DOMAIN.COM"]
    {
        let (_, hs) = exchange(&p, TestRequest::get("/").header("origin", forged));
        assert!(hs.get("access-control-allow-origin").is_none(), "{forged}");
    }
}

#[test]
fn defaults_allow_any_origin_without_vary() {
    let p = cors(json!({}));
    let (_, hs) = exchange(&p, TestRequest::get("/").header("origin", "http://x.org"));
    assert_eq!(h(&hs, "access-control-allow-origin"), Some("*"));
    assert_eq!(h(&hs, "access-control-allow-methods"), Some("*"));
    assert_eq!(h(&hs, "access-control-allow-headers"), Some("*"));
    assert_eq!(h(&hs, "access-control-max-age"), Some("5"));
    assert!(hs.get("vary").is_none() && hs.get("access-control-allow-credentials").is_none());
    let (_, hs) = exchange(&p, TestRequest::get("/"));
    assert_eq!(h(&hs, "access-control-allow-origin"), Some("*"), "APISIX answers `*` without an Origin too");
}

#[test]
fn preflights_are_answered_here() {
    let p =
        cors(json!({"allow_origins": "**", "allow_methods": "**", "allow_headers": "**", "allow_credential": true}));
    let pre = TestRequest::new(Method::OPTIONS, "/api")
        .header("origin", "https://app.example")
        .header("access-control-request-method", "PUT")
        .header("access-control-request-headers", "x-token,content-type");
    let mut ctx = pre.build();
    let r = run(std::slice::from_ref(&p), &mut ctx);
    assert_eq!(r.as_ref().map(|r| (r.status.as_u16(), r.body.len())), Some((200, 0)), "answered, empty body");
    let (_, hs) = exchange(
        &p,
        TestRequest::new(Method::OPTIONS, "/api")
            .header("origin", "https://app.example")
            .header("access-control-request-method", "PUT")
            .header("access-control-request-headers", "x-token,content-type"),
    );
    assert_eq!(h(&hs, "access-control-allow-origin"), Some("https://app.example"));
    assert_eq!(h(&hs, "access-control-allow-methods"), Some(ALL_METHODS));
    assert_eq!(h(&hs, "access-control-allow-headers"), Some("x-token,content-type"), "`**` echoes what was asked");
    assert_eq!(h(&hs, "access-control-allow-credentials"), Some("true"));
    // Not a preflight: OPTIONS without Access-Control-Request-Method goes upstream.
    let mut ctx = TestRequest::new(Method::OPTIONS, "/api").header("origin", "https://a").build();
    assert!(run(std::slice::from_ref(&p), &mut ctx).is_none());
    let mut ctx = TestRequest::new(Method::OPTIONS, "/api").header("access-control-request-method", "GET").build();
    assert!(run(&[p], &mut ctx).is_none(), "no Origin: not a CORS request");
}

#[test]
fn regexes_replace_the_list() {
    let p = cors(json!({"allow_methods": "GET,POST", "allow_origins_by_regex": [".*\\.test.com$"]}));
    let (_, hs) = exchange(&p, TestRequest::get("/").header("origin", "http://a.test.com"));
    assert_eq!(h(&hs, "access-control-allow-origin"), Some("http://a.test.com"));
    assert_eq!(h(&hs, "vary"), Some("Origin"), "the answer depends on the origin");
    let (_, hs) = exchange(&p, TestRequest::get("/").header("origin", "http://a.test2.com"));
    assert!(hs.get("access-control-allow-origin").is_none());
    let (_, hs) = exchange(&p, TestRequest::get("/").header("origin", "http://a.test.com.evil.org"));
    assert!(hs.get("access-control-allow-origin").is_none(), "the example's `$` anchors it");
    let (_, hs) = exchange(&p, TestRequest::get("/"));
    assert!(hs.get("access-control-allow-origin").is_none(), "no Origin, no regex match");
}

fn with_metadata(conf: Value, metadata: Value) -> Result<Arc<dyn PluginInstance>, String> {
    let directory = ConsumerDirectory::default();
    let ctx = BuildContext {
        owner: Owner { kind: "routes", id: "1", label: "routes[0] (id 1)" },
        raw: &conf,
        metadata: Some(&metadata),
        shared: None,
        check_only: false,
        consumers: &directory,
        services: &NoServices,
    };
    weir_plugin::DynPlugin::build(&Cors, &conf, &ctx)
}

#[test]
fn metadata_lists() {
    let meta = json!({"allow_origins": {
        "key_1": "https://domain.com",
        "key_2": "https://sub.domain.com,https://sub2.domain.com",
        "key_3": "*"
    }});
    let p = with_metadata(json!({"allow_methods": "GET,POST", "allow_origins_by_metadata": ["key_1"]}), meta.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let (_, hs) = exchange(&p, TestRequest::get("/").header("origin", "https://domain.com"));
    assert_eq!(h(&hs, "access-control-allow-origin"), Some("https://domain.com"));
    let (_, hs) = exchange(&p, TestRequest::get("/").header("origin", "https://sub.domain.com"));
    assert!(hs.get("access-control-allow-origin").is_none(), "the default `*` does not open a metadata route");
    assert_eq!(h(&hs, "vary"), Some("Origin"));
    let any = with_metadata(json!({"allow_origins_by_metadata": ["key_3", "missing"]}), meta.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let (_, hs) = exchange(&any, TestRequest::get("/").header("origin", "https://x.org"));
    assert_eq!(h(&hs, "access-control-allow-origin"), Some("https://x.org"), "metadata answers the origin itself");
    let both =
        with_metadata(json!({"allow_origins": "http://local.org", "allow_origins_by_metadata": ["key_1"]}), meta)
            .unwrap_or_else(|e| panic!("{e}"));
    let (_, hs) = exchange(&both, TestRequest::get("/").header("origin", "http://local.org"));
    assert_eq!(h(&hs, "access-control-allow-origin"), Some("http://local.org"), "an explicit list still applies");
}

#[test]
fn timing_allow_origin() {
    let p = cors(json!({"timing_allow_origins": "http://a.org,http://b.org"}));
    let (_, hs) = exchange(&p, TestRequest::get("/").header("origin", "http://b.org"));
    assert_eq!(h(&hs, "timing-allow-origin"), Some("http://b.org"));
    assert_eq!(h(&hs, "vary"), Some("Origin"));
    let (_, hs) = exchange(&p, TestRequest::get("/").header("origin", "http://c.org"));
    assert!(hs.get("timing-allow-origin").is_none());
    let p = cors(json!({"timing_allow_origins_by_regex": ["^http://.*\\.a\\.org$"]}));
    let (_, hs) = exchange(&p, TestRequest::get("/").header("origin", "http://x.a.org"));
    assert_eq!(h(&hs, "timing-allow-origin"), Some("http://x.a.org"));
}

#[test]
fn vary_is_added_once() {
    let p = cors(json!({"allow_origins": "http://a.org"}));
    let mut ctx = TestRequest::get("/").header("origin", "http://a.org").build();
    let mut headers = HeaderMap::new();
    headers.insert(VARY, HeaderValue::from_static("Accept-Encoding, origin"));
    let (head, _) = respond(&[p], &mut ctx, ResponseHead { status: StatusCode::OK, headers }, b"");
    assert_eq!(head.headers.get_all(VARY).iter().count(), 1);
}

#[test]
fn what_apisix_refuses_is_refused() {
    for (bad, why) in [
        (json!({"allow_credential": true}), "allow_origins: you can not set '*'"),
        (json!({"allow_credential": true, "allow_origins": "**"}), "allow_methods: you can not set '*'"),
        (
            json!({"allow_credential": true, "allow_origins": "**", "allow_methods": "GET", "allow_headers": "**", "expose_headers": "*"}),
            "expose_headers:",
        ),
        (json!({"allow_origins": "example.com"}), ""),
        (json!({"allow_origins": "http://a.com,"}), ""),
        (json!({"allow_origins": "http://a.com,null"}), ""),
        (json!({"allow_origins_by_regex": []}), ""),
        (json!({"allow_origins_by_regex": ["ok", "(unclosed"]}), "allow_origins_by_regex[1]: invalid regex"),
        (
            json!({"timing_allow_origins_by_regex": ["(?=lookahead)"]}),
            "timing_allow_origins_by_regex[0]: invalid regex",
        ),
        (json!({"allow_methods": "GET\nX"}), ""),
        (json!({"max_age": "5"}), ""),
    ] {
        let e = instance(&Cors, bad.clone()).err().unwrap_or_default();
        assert!(!e.is_empty() && e.contains(why), "{bad}: {e}");
    }
    let ok = json!({"allow_credential": true, "allow_origins": "**", "allow_methods": "**", "allow_headers": "**"});
    assert!(instance(&Cors, ok).is_ok());
    assert!(instance(&Cors, json!({"allow_origins": "null", "max_age": -1})).is_ok());
}
