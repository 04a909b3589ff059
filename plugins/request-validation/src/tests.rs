//! Unit tests of request-validation: APISIX's examples, hostile bodies, load-time refusals.

use super::*;
use serde_json::json;
use weir_plugin::http::Method;
use weir_plugin::testing::{instance, run, TestRequest};

fn check(conf: Value, req: TestRequest) -> Option<(u16, String)> {
    let i = instance(&RequestValidation, conf).unwrap_or_else(|e| panic!("{e}"));
    let mut ctx = req.build();
    run(&[i], &mut ctx).map(|r| (r.status.as_u16(), String::from_utf8_lossy(&r.body).into_owned()))
}

fn header_example() -> Value {
    json!({"header_schema": {
        "type": "object",
        "required": ["User-Agent", "Host"],
        "properties": {
            "User-Agent": {"type": "string", "pattern": "^curl/"},
            "Host": {"type": "string", "enum": ["httpbin.org", "httpbin"]}
        }
    }})
}

fn body_example() -> Value {
    json!({
        "header_schema": {
            "type": "object",
            "required": ["Content-Type"],
            "properties": {"Content-Type": {"type": "string", "pattern": "^application/json$"}}
        },
        "body_schema": {
            "type": "object",
            "required": ["required_payload"],
            "properties": {
                "required_payload": {"type": "string"},
                "boolean_payload": {"type": "boolean"},
                "array_payload": {
                    "type": "array", "minItems": 1,
                    "items": {"type": "integer", "minimum": 200, "maximum": 599},
                    "uniqueItems": true, "default": [200]
                }
            }
        }
    })
}

fn post(body: &str, content_type: &str) -> TestRequest {
    TestRequest::new(Method::POST, "/post").header("content-type", content_type).body(body.as_bytes())
}

#[test]
fn apisix_header_examples() {
    let ok = TestRequest::get("/get").header("host", "httpbin").header("user-agent", "curl/8.5");
    assert_eq!(check(header_example(), ok), None);
    let r =
        check(header_example(), TestRequest::get("/get").header("host", "httpbin").header("user-agent", "cli-mock"));
    assert!(r.as_ref().is_some_and(|(s, m)| *s == 400 && m.contains("/User-Agent")), "{r:?}");
    let r = check(header_example(), TestRequest::get("/get"));
    assert!(r.as_ref().is_some_and(|(s, m)| *s == 400 && m.contains("User-Agent")), "{r:?}");
    let mut custom = header_example();
    custom["rejected_code"] = json!(403);
    custom["rejected_msg"] = json!("Request header validation failed.");
    let r = check(custom, TestRequest::get("/get").header("host", "httpbin2").header("user-agent", "curl/8"));
    assert_eq!(r, Some((403, "Request header validation failed.".into())));
}

#[test]
fn apisix_body_examples() {
    let json_type = "application/json";
    assert_eq!(check(body_example(), post(r#"{"required_payload":"hello", "array_payload":[301]}"#, json_type)), None);
    let r = check(body_example(), post(r#"{"required_payload":"hello", "array_payload":[100]}"#, json_type));
    assert!(r.as_ref().is_some_and(|(s, m)| *s == 400 && m.contains("/array_payload/0")), "{r:?}");
    let r = check(body_example(), post("{}", json_type));
    assert!(r.as_ref().is_some_and(|(_, m)| m.contains("required_payload")), "{r:?}");
    let form = json!({
        "header_schema": {"type": "object", "required": ["Content-Type"],
            "properties": {"Content-Type": {"type": "string", "pattern": "^application/x-www-form-urlencoded$"}}},
        "body_schema": {"type": "object", "required": ["required_payload", "enum_payload"],
            "properties": {"required_payload": {"type": "string"},
                "enum_payload": {"type": "string", "enum": ["enum_string_1", "enum_string_2"], "default": "enum_string_1"}}}
    });
    let ct = "application/x-www-form-urlencoded";
    assert_eq!(check(form.clone(), post("required_payload=hello&enum_payload=enum_string_1", ct)), None);
    assert!(check(form, post("required_payload=hello&enum_payload=enum_string_3", ct)).is_some());
}

#[test]
fn hostile_bodies_are_refused() {
    let ct = "application/json";
    let conf = body_example();
    let dup = r#"{"required_payload": 1, "required_payload": "ok"}"#;
    let r = check(conf.clone(), post(dup, ct));
    assert!(r.as_ref().is_some_and(|(_, m)| m.contains("duplicate key")), "last-wins parsers must not disagree: {r:?}");
    assert!(check(conf.clone(), post("{not json", ct)).is_some());
    let empty = TestRequest::new(Method::POST, "/post").header("content-type", ct);
    assert_eq!(check(conf.clone(), empty).map(|r| r.0), Some(400), "a missing body is refused");
    let two_types = post(r#"{"required_payload":"x"}"#, ct).header("content-type", "application/x-www-form-urlencoded");
    assert!(check(conf.clone(), two_types).is_some_and(|(_, m)| m.contains("Content-Type")));
    let mut small = conf;
    small["max_req_body_size"] = json!(10);
    small["rejected_msg"] = json!("too big");
    assert_eq!(check(small, post(r#"{"required_payload":"hello"}"#, ct)), Some((400, "too big".into())));
    // JSON is the default whatever the declared type says (as APISIX).
    let only_body = json!({"body_schema": {"type": "object", "required": ["a"]}});
    assert_eq!(check(only_body, post(r#"{"a":1}"#, "text/plain")), None);
}

#[test]
fn the_body_is_asked_for_only_with_a_body_schema() {
    let h = instance(&RequestValidation, header_example()).unwrap_or_else(|e| panic!("{e}"));
    assert!(!h.wants_request_body());
    let b = instance(&RequestValidation, body_example()).unwrap_or_else(|e| panic!("{e}"));
    assert!(b.wants_request_body());
}

#[test]
fn what_cannot_work_is_refused_at_load() {
    for (bad, why) in [
        (json!({}), "at least one of"),
        (json!({"rejected_msg": "x"}), "at least one of"),
        (json!({"body_schema": {"type": "objekt"}}), "body_schema.type: "),
        (json!({"header_schema": {"properties": {"a": {"pattern": "(a)\\1"}}}}), "header_schema"),
        (json!({"body_schema": []}), ""),
        (json!({"body_schema": {}, "rejected_code": 600}), ""),
        (json!({"body_schema": {}, "rejected_msg": ""}), ""),
        (json!({"body_schema": {}, "max_req_body_size": 0}), ""),
    ] {
        let e = instance(&RequestValidation, bad.clone()).err().unwrap_or_default();
        assert!(!e.is_empty() && e.contains(why), "{bad}: {e}");
    }
}
