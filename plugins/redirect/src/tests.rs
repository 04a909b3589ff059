//! Unit tests of the redirect plugin: targets, statuses, load-time refusals.

use super::*;
use serde_json::json;
use weir_plugin::testing::{instance, run, TestRequest};

fn redirect(conf: Value, req: TestRequest) -> Option<(u16, String)> {
    let plugin = Redirect::default();
    plugin.https_port.store(0, Ordering::Relaxed);
    let i = instance(&plugin, conf).unwrap_or_else(|e| panic!("{e}"));
    let mut ctx = req.build();
    run(&[i], &mut ctx).map(|r| {
        let loc = r.headers.get(LOCATION).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        (r.status.as_u16(), loc)
    })
}

#[test]
fn apisix_examples() {
    let r = redirect(json!({"uri": "/test/default.html", "ret_code": 301}), TestRequest::get("/test/index.html"));
    assert_eq!(r, Some((301, "/test/default.html".into())));
    let r = redirect(json!({"uri": "$uri/index.html", "ret_code": 301}), TestRequest::get("/test"));
    assert_eq!(r, Some((301, "/test/index.html".into())));
    let r = redirect(json!({"http_to_https": true}), TestRequest::get("/hello?a=1").header("host", "Example.com:9080"));
    assert_eq!(r, Some((301, "https://example.com/hello?a=1".into())));
    let r = redirect(json!({"regex_uri": ["^/iresty/(.*)/(.*)/(.*)", "/$1-$2-$3"]}), TestRequest::get("/iresty/a/b/c"));
    assert_eq!(r, Some((302, "/a-b-c".into())), "302 by default");
}

#[test]
fn http_to_https_keeps_method_semantics_and_skips_https() {
    let post = TestRequest::new(Method::POST, "/x").header("host", "h");
    assert_eq!(redirect(json!({"http_to_https": true}), post), Some((308, "https://h/x".into())));
    let head = TestRequest::new(Method::HEAD, "/x").header("host", "h");
    assert_eq!(redirect(json!({"http_to_https": true}), head).map(|r| r.0), Some(301));
    let behind_tls = TestRequest::get("/x").header("host", "h").header("x-forwarded-proto", "https");
    assert_eq!(redirect(json!({"http_to_https": true}), behind_tls), None);
    let mut on_tls = TestRequest::get("/x").header("host", "h").build();
    on_tls.scheme = "https";
    let i = instance(&Redirect::default(), json!({"http_to_https": true})).unwrap_or_else(|e| panic!("{e}"));
    assert!(run(&[i], &mut on_tls).is_none());
    let forged = TestRequest::get("/x").header("host", "evil.com/steal");
    let i = instance(&Redirect::default(), json!({"http_to_https": true})).unwrap_or_else(|e| panic!("{e}"));
    let mut ctx = forged.build();
    assert_eq!(run(&[i], &mut ctx).map(|r| r.status.as_u16()), Some(400));
}

#[test]
fn the_https_port_comes_from_plugin_attr() {
    let plugin = Redirect::default();
    let env = InitEnv { data_dir: std::env::temp_dir(), check_only: false, proxy_cache: Default::default() };
    plugin.init(Some(&json!({"https_port": 9443})), &env).unwrap_or_else(|e| panic!("{e}"));
    let i = instance(&plugin, json!({"http_to_https": true})).unwrap_or_else(|e| panic!("{e}"));
    let mut ctx = TestRequest::get("/p").header("host", "[::1]:9080").build();
    let loc = run(std::slice::from_ref(&i), &mut ctx).and_then(|r| r.headers.get(LOCATION).cloned());
    assert_eq!(loc.as_ref().and_then(|v| v.to_str().ok()), Some("https://[::1]:9443/p"));
    // A reload applies to the instances already built.
    plugin.init(None, &env).unwrap_or_else(|e| panic!("{e}"));
    let mut ctx = TestRequest::get("/p").header("host", "h").build();
    let loc = run(&[i], &mut ctx).and_then(|r| r.headers.get(LOCATION).cloned());
    assert_eq!(loc.as_ref().and_then(|v| v.to_str().ok()), Some("https://h/p"));
}

#[test]
fn regex_uri_without_a_match_proxies() {
    assert_eq!(redirect(json!({"regex_uri": ["^/old/(.*)", "/new/$1"]}), TestRequest::get("/other")), None);
    let r = redirect(json!({"regex_uri": ["/old/", "/new/"], "ret_code": 307}), TestRequest::get("/a/old/b"));
    assert_eq!(r, Some((307, "/a/new/b".into())), "the first match is replaced, the rest of the path kept");
}

#[test]
fn query_strings_and_encoding() {
    let conf = json!({"uri": "/new?x=1", "append_query_string": true});
    assert_eq!(redirect(conf.clone(), TestRequest::get("/old?a=b")), Some((302, "/new?x=1&a=b".into())));
    assert_eq!(redirect(conf, TestRequest::get("/old")), Some((302, "/new?x=1".into())));
    let conf = json!({"uri": "/new", "append_query_string": true});
    assert_eq!(redirect(conf, TestRequest::get("/old?a=b")), Some((302, "/new?a=b".into())));
    let conf = json!({"regex_uri": ["^/old/(.*)", "/new/$1 x?q=1 2"], "encode_uri": true});
    let r = redirect(conf, TestRequest::get("/old/%C3%BC"));
    assert_eq!(r, Some((302, "/new/%25C3%25BC%20x?q=1 2".into())), "only the path is escaped, `%` included");
}

#[test]
fn what_apisix_refuses_is_refused() {
    for (bad, why) in [
        (json!({}), "exactly one of"),
        (json!({"http_to_https": true, "uri": "/x"}), "exactly one of"),
        (json!({"http_to_https": false, "regex_uri": ["a", "b"]}), "exactly one of"),
        (json!({"uri": "/x", "regex_uri": ["a", "b"]}), "exactly one of"),
        (json!({"http_to_https": true, "append_query_string": true}), "only one of"),
        (json!({"uri": "/"}), ""),
        (json!({"uri": "/x", "ret_code": 199}), ""),
        (json!({"regex_uri": ["a"]}), ""),
        (json!({"regex_uri": ["(", "/x"]}), "regex_uri[0]: invalid regex"),
        (json!({"regex_uri": ["(?=x)", "/x"]}), "regex_uri[0]: invalid regex"),
        (json!({"regex_uri": ["^/(a)", "/$2"]}), "regex_uri[1]: `$2` names a group"),
        (json!({"regex_uri": ["^/(a)", "/$host"]}), "regex_uri[1]:"),
        (json!({"uri": "/x/$ur1"}), "uri: unknown variable `$ur1`"),
    ] {
        let e = instance(&Redirect::default(), bad.clone()).err().unwrap_or_default();
        assert!(!e.is_empty() && e.contains(why), "{bad}: {e}");
    }
    assert!(instance(&Redirect::default(), json!({"http_to_https": false})).is_ok());
}
