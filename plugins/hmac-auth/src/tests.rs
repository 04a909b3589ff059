//! Signed requests as APISIX's documentation builds them, and the hostile ones: a signature
//! over other headers than required, a stale or missing date, a body changed after signing,
//! an algorithm the route does not allow, another consumer's key id.

use super::*;
use serde_json::json;
use weir_plugin::http::Method;
use weir_plugin::testing::{instance_with_consumers, run, TestRequest};

fn consumers() -> Vec<(&'static str, Value)> {
    vec![
        ("john", json!({"key_id": "john-key", "secret_key": "john-secret-key"})),
        ("rose", json!({"key_id": "rose-key", "secret_key": "rose-secret-key"})),
    ]
}

fn algorithm(name: &str) -> Option<hmac::Algorithm> {
    match name {
        "hmac-sha1" => Some(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY),
        "hmac-sha256" => Some(hmac::HMAC_SHA256),
        "hmac-sha512" => Some(hmac::HMAC_SHA512),
        _ => None,
    }
}

fn http_date(offset: i64) -> String {
    (chrono::Utc::now() + chrono::Duration::seconds(offset)).format("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

/// `Authorization` for `key_id` signing `lines` (already `name: value` / request-target lines).
fn authorization(key_id: &str, secret: &str, alg: &str, names: &str, lines: &[String]) -> String {
    let mut signing = format!("{key_id}\n");
    for l in lines {
        signing.push_str(l);
        signing.push('\n');
    }
    let a = algorithm(alg).unwrap_or(hmac::HMAC_SHA256);
    let sig = STANDARD.encode(hmac::sign(&hmac::Key::new(a, secret.as_bytes()), signing.as_bytes()));
    format!(r#"Signature keyId="{key_id}",algorithm="{alg}",headers="{names}",signature="{sig}""#)
}

fn signed(date: &str, alg: &str) -> TestRequest {
    let lines = [String::from("GET /hello?a=1"), format!("date: {date}")];
    TestRequest::get("/hello?a=1")
        .header("date", date)
        .header("authorization", &authorization("john-key", "john-secret-key", alg, "@request-target date", &lines))
}

fn outcome(conf: Value, req: TestRequest) -> (Option<u16>, Option<String>, String) {
    let p = instance_with_consumers(&HmacAuth, conf, &consumers()).unwrap_or_else(|e| panic!("{e}"));
    let mut ctx = req.build();
    let answer = run(&[p], &mut ctx);
    let body = answer.as_ref().map(|r| String::from_utf8_lossy(&r.body).into_owned()).unwrap_or_default();
    (answer.map(|r| r.status.as_u16()), ctx.consumer.map(|c| c.username.to_string()), body)
}

#[test]
fn signatures_identify_consumers() {
    for alg in ALGORITHMS {
        assert_eq!(outcome(json!({}), signed(&http_date(0), alg)).1.as_deref(), Some("john"), "{alg}");
    }
}

#[test]
fn hostile_requests_are_refused() {
    let date = http_date(0);
    let refused = |conf: Value, req: TestRequest| {
        let (status, who, body) = outcome(conf, req);
        assert_eq!((status, who), (Some(401), None), "{body}");
        body
    };
    // Stale and future dates (a replay outside the skew), a missing or unreadable date.
    refused(json!({}), signed(&http_date(-301), "hmac-sha256"));
    refused(json!({}), signed(&http_date(301), "hmac-sha256"));
    assert_eq!(outcome(json!({"clock_skew": 600}), signed(&http_date(-301), "hmac-sha256")).0, None);
    let lines = [String::from("GET /hello")];
    let no_date = TestRequest::get("/hello").header(
        "authorization",
        &authorization("john-key", "john-secret-key", "hmac-sha256", "@request-target", &lines),
    );
    refused(json!({"signed_headers": []}), no_date);
    // A signature that does not cover the date (signed_headers defaults to ["date"]): a
    // captured request could be replayed with a fresh Date.
    let lines = [String::from("GET /hello")];
    let unsigned_date = TestRequest::get("/hello").header("date", &date).header(
        "authorization",
        &authorization("john-key", "john-secret-key", "hmac-sha256", "@request-target", &lines),
    );
    refused(json!({}), unsigned_date);
    // Signed over other headers than the route requires.
    refused(json!({"signed_headers": ["date", "x-tenant"]}), signed(&date, "hmac-sha256"));
    // An algorithm the route does not allow.
    refused(json!({"allowed_algorithms": ["hmac-sha512"]}), signed(&date, "hmac-sha256"));
    // Another consumer's key id with john's signature; a target changed after signing.
    let lines = [String::from("GET /hello?a=1"), format!("date: {date}")];
    let other = TestRequest::get("/hello?a=1").header("date", &date).header(
        "authorization",
        &authorization("rose-key", "john-secret-key", "hmac-sha256", "@request-target date", &lines),
    );
    refused(json!({}), other);
    let moved = TestRequest::get("/admin?a=1").header("date", &date).header(
        "authorization",
        &authorization("john-key", "john-secret-key", "hmac-sha256", "@request-target date", &lines),
    );
    refused(json!({}), moved);
    // Unreadable headers name the reason; the others do not.
    let body = refused(json!({}), TestRequest::get("/"));
    assert_eq!(body, r#"{"message":"client request can't be validated: missing Authorization header"}"#);
    let body = refused(json!({}), TestRequest::get("/").header("authorization", "Bearer x"));
    assert!(body.contains("does not start with 'Signature'"), "{body}");
    let body = refused(json!({}), signed(&http_date(-1000), "hmac-sha256"));
    assert_eq!(body, r#"{"message":"client request can't be validated"}"#);
}

#[test]
fn bodies_are_checked_against_their_digest() {
    let date = http_date(0);
    let body = br#"{"name":"jack"}"#;
    let digest = format!("SHA-256={}", STANDARD.encode(ring::digest::digest(&ring::digest::SHA256, body)));
    let lines = [String::from("POST /hello"), format!("date: {date}"), format!("digest: {digest}")];
    let auth = authorization("john-key", "john-secret-key", "hmac-sha256", "@request-target date digest", &lines);
    let req = |b: &[u8], d: &str| {
        TestRequest::new(Method::POST, "/hello")
            .header("date", &date)
            .header("digest", d)
            .header("authorization", &auth)
            .body(b)
    };
    let conf = json!({"validate_request_body": true, "signed_headers": ["date", "digest"]});
    assert_eq!(outcome(conf.clone(), req(body, &digest)).1.as_deref(), Some("john"));
    // The body changed after signing: its digest no longer matches.
    assert_eq!(outcome(conf.clone(), req(br#"{"name":"root"}"#, &digest)).0, Some(401));
    // The body and the (signed) Digest both changed: the signature no longer matches.
    let forged = format!("SHA-256={}", STANDARD.encode(ring::digest::digest(&ring::digest::SHA256, b"x")));
    assert_eq!(outcome(conf.clone(), req(b"x", &forged)).0, Some(401));
    let big = json!({"validate_request_body": true, "signed_headers": ["date", "digest"], "max_req_body_size": 4});
    assert_eq!(outcome(big, req(body, &digest)).0, Some(413));
}

#[test]
fn duplicate_key_ids_and_unknown_algorithms_are_refused() {
    let dup = [("a", json!({"key_id": "k", "secret_key": "s"})), ("b", json!({"key_id": "k", "secret_key": "t"}))];
    let e = instance_with_consumers(&HmacAuth, json!({}), &dup).err().unwrap_or_default();
    assert_eq!(e, "consumers `a` and `b` have the same key_id; it must be unique");
    assert!(instance_with_consumers(&HmacAuth, json!({"allowed_algorithms": ["hmac-md5"]}), &[]).is_err());
}

#[test]
fn apisix_documentation_signing_string_is_reproduced() {
    let header = r#"Signature keyId="john-key",algorithm="hmac-sha256",headers="@request-target date",signature="wWfKQvPDr0wHQ4IHdluB4IzeNZcj0bGJs2wvoCOT5rM=""#;
    let ctx = TestRequest::get("/get").header("date", "Fri, 06 Sep 2024 06:41:29 GMT").build();
    let params = parse_authorization(header).unwrap_or_else(|e| panic!("{e}"));
    let signing = signing_string(&ctx, &params);
    assert_eq!(signing, "john-key\nGET /get\ndate: Fri, 06 Sep 2024 06:41:29 GMT\n");
    let sig = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, b"john-secret-key"), signing.as_bytes());
    // What the documentation's Python script computes for this date (the signature printed in
    // the documentation was made with another secret).
    assert_eq!(STANDARD.encode(sig), "j+feO3Wm5em0agp0A70FZErf6lrMDVs7zjQ9MxomPx0=");
}
