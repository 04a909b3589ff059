//! Unit tests of response-rewrite: APISIX's examples, `vars`, body replacement and filters.

use super::*;
use serde_json::json;
use weir_plugin::http::{HeaderMap, HeaderValue};
use weir_plugin::testing::{instance, respond, TestRequest};

fn rewrite(conf: Value, status: u16, headers: &[(&'static str, &'static str)], body: &[u8]) -> (u16, HeaderMap, Bytes) {
    let i = instance(&ResponseRewrite, conf).unwrap_or_else(|e| panic!("{e}"));
    let mut ctx = TestRequest::get("/headers").build();
    ctx.upstream_addrs.push("10.0.0.7:80".parse().unwrap_or_else(|e| panic!("{e}")));
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        map.append(*k, HeaderValue::from_static(v));
    }
    let head = ResponseHead { status: StatusCode::from_u16(status).unwrap_or(StatusCode::OK), headers: map };
    let (head, body) = respond(&[i], &mut ctx, head, body);
    (head.status.as_u16(), head.headers, body)
}

fn h<'m>(headers: &'m HeaderMap, name: &str) -> Option<&'m str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn example() -> Value {
    json!({
        "body": "{\"code\":\"ok\",\"message\":\"new json body\"}",
        "headers": {"set": {"X-Server-id": 3, "X-Server-status": "on", "X-Server-balancer-addr": "$balancer_ip:$balancer_port"}},
        "vars": [["status", "==", 200]]
    })
}

#[test]
fn apisix_example_header_and_body_for_200_only() {
    let (status, hs, body) = rewrite(example(), 200, &[("content-length", "5"), ("etag", "\"x\"")], b"hello");
    assert_eq!(status, 200);
    assert_eq!(body.as_ref(), b"{\"code\":\"ok\",\"message\":\"new json body\"}");
    assert_eq!(h(&hs, "x-server-id"), Some("3"));
    assert_eq!(h(&hs, "x-server-status"), Some("on"));
    assert_eq!(h(&hs, "x-server-balancer-addr"), Some("10.0.0.7:80"));
    assert!(hs.get("content-length").is_none() && hs.get("etag").is_none(), "the body changed: {hs:?}");
    let (status, hs, body) = rewrite(example(), 404, &[("content-length", "5")], b"hello");
    assert_eq!((status, body.as_ref()), (404, &b"hello"[..]), "vars do not hold: untouched");
    assert!(hs.get("x-server-id").is_none() && hs.get("content-length").is_some());
}

#[test]
fn apisix_example_filters() {
    let conf =
        json!({"filters": [{"regex": "X-Amzn-Trace-Id", "scope": "global", "replace": "X-Amzn-Trace-Id-Replace"}]});
    let body = br#"{"headers": {"X-Amzn-Trace-Id": "Root=1", "Other": "X-Amzn-Trace-Id"}}"#;
    let (_, hs, out) = rewrite(conf.clone(), 200, &[("content-length", "60")], body);
    assert_eq!(
        out.as_ref(),
        &br#"{"headers": {"X-Amzn-Trace-Id-Replace": "Root=1", "Other": "X-Amzn-Trace-Id-Replace"}}"#[..]
    );
    assert!(hs.get("content-length").is_none());
    // A compressed body is passed on as it is (Weir does not decompress it).
    let (_, hs, out) = rewrite(conf, 200, &[("content-encoding", "gzip"), ("content-length", "3")], b"\x1f\x8b\x08");
    assert_eq!((out.as_ref(), h(&hs, "content-length")), (&b"\x1f\x8b\x08"[..], Some("3")));
}

#[test]
fn apisix_example_base64_and_status() {
    let (_, _, body) = rewrite(json!({"body": "SGVsbG8gV29ybGQ=", "body_base64": true}), 200, &[], b"x");
    assert_eq!(body.as_ref(), b"Hello World");
    let conf = json!({"status_code": 200, "body": "{\"code\": 200, \"msg\": \"success\"}"});
    let (status, _, body) = rewrite(conf, 401, &[], b"{\"message\":\"Missing API key in request\"}");
    assert_eq!((status, body.as_ref()), (200, &b"{\"code\": 200, \"msg\": \"success\"}"[..]));
}

#[test]
fn vars_see_the_request_too() {
    let conf =
        json!({"headers": {"set": {"x-hit": "1"}}, "vars": ["OR", ["status", ">=", 500], ["uri", "==", "/headers"]]});
    let (_, hs, _) = rewrite(conf, 200, &[], b"");
    assert_eq!(h(&hs, "x-hit"), Some("1"));
    let i = instance(&ResponseRewrite, json!({"vars": [["http_x_a", "==", "1"]], "headers": {"x": "1"}}))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(i.late().headers, "vars reading request headers keep them for the header filter");
    let i = instance(&ResponseRewrite, example()).unwrap_or_else(|e| panic!("{e}"));
    assert!(!i.late().headers, "{:?}", i.late());
}

#[test]
fn what_apisix_refuses_is_refused() {
    for (bad, why) in [
        (json!({"body": "x", "filters": [{"regex": "a", "replace": "b"}]}), "cannot be configured together"),
        (json!({"body_base64": true}), "invalid base64"),
        (json!({"body": "", "body_base64": true}), "invalid base64"),
        (json!({"body": "not base64!", "body_base64": true}), "invalid base64"),
        (json!({"vars": [["status", "=~", 200]]}), "vars[0][1]: unknown operator"),
        (json!({"vars": [["nope", "==", 200]]}), "vars[0][0]: unknown variable"),
        (json!({"filters": []}), ""),
        (json!({"filters": [{"regex": "(", "replace": ""}]}), "filters[0].regex"),
        (json!({"status_code": 599}), ""),
        (json!({"status_code": 199}), ""),
        (json!({"headers": {"add": ["nocolon"]}}), "headers.add[0]"),
        (json!({"max_resp_body_size": 0, "filters": [{"regex": "a", "replace": "b"}]}), ""),
    ] {
        let e = instance(&ResponseRewrite, bad.clone()).err().unwrap_or_default();
        assert!(!e.is_empty() && e.contains(why), "{bad}: {e}");
    }
}
