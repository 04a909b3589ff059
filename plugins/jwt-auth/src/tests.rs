//! Tokens signed by the reference implementation (`jsonwebtoken`) with every algorithm, and the
//! hostile ones: `alg: none`, algorithm swaps, RS/HS key confusion, a `kid` naming another
//! consumer, expired and not-yet-valid tokens, oversized and malformed tokens.

use super::*;
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::json;
use weir_plugin::testing::{instance_with_consumers, run, TestRequest};

const RSA_KEY: &str = include_str!("../testdata/rsa.key");
const RSA_PUB: &str = include_str!("../testdata/rsa.pub");
const EC_KEY: &str = include_str!("../testdata/ec.key");
const EC_PUB: &str = include_str!("../testdata/ec.pub");
const ED_KEY: &str = include_str!("../testdata/ed.key");
const ED_PUB: &str = include_str!("../testdata/ed.pub");
const SECRET: &str = "jack-hs256-secret-of-32-bytes-!!";

fn sign(alg: jsonwebtoken::Algorithm, claims: &Value) -> String {
    let key = match alg {
        jsonwebtoken::Algorithm::HS256 | jsonwebtoken::Algorithm::HS384 | jsonwebtoken::Algorithm::HS512 => {
            EncodingKey::from_secret(SECRET.as_bytes())
        }
        jsonwebtoken::Algorithm::ES256 => EncodingKey::from_ec_pem(EC_KEY.as_bytes()).unwrap_or_else(|e| panic!("{e}")),
        jsonwebtoken::Algorithm::EdDSA => EncodingKey::from_ed_pem(ED_KEY.as_bytes()).unwrap_or_else(|e| panic!("{e}")),
        _ => EncodingKey::from_rsa_pem(RSA_KEY.as_bytes()).unwrap_or_else(|e| panic!("{e}")),
    };
    encode(&Header::new(alg), claims, &key).unwrap_or_else(|e| panic!("{e}"))
}

fn consumers() -> Vec<(&'static str, Value)> {
    vec![
        ("jack", json!({"key": "jack-key", "secret": SECRET})),
        ("rsa", json!({"key": "rsa-key", "algorithm": "RS256", "public_key": RSA_PUB})),
        ("pss", json!({"key": "pss-key", "algorithm": "PS256", "public_key": RSA_PUB})),
        ("ec", json!({"key": "ec-key", "algorithm": "ES256", "public_key": EC_PUB})),
        ("ed", json!({"key": "ed-key", "algorithm": "EdDSA", "public_key": ED_PUB})),
        ("hs512", json!({"key": "hs512-key", "algorithm": "HS512", "secret": SECRET, "lifetime_grace_period": 30})),
        (
            "b64",
            json!({"key": "b64-key", "secret": "amFjay1oczI1Ni1zZWNyZXQtb2YtMzItYnl0ZXMtISE=", "base64_secret": true}),
        ),
    ]
}

/// `(status or None when let through, consumer seen, message)`.
fn outcome(conf: Value, req: TestRequest) -> (Option<u16>, Option<String>, String) {
    let p = instance_with_consumers(&JwtAuth, conf, &consumers()).unwrap_or_else(|e| panic!("{e}"));
    let mut ctx = req.build();
    let answer = run(&[p], &mut ctx);
    let message = answer.as_ref().map(|r| String::from_utf8_lossy(&r.body).into_owned()).unwrap_or_default();
    (answer.map(|r| r.status.as_u16()), ctx.consumer.map(|c| c.username.to_string()), message)
}

fn bearer(token: &str) -> TestRequest {
    TestRequest::get("/").header("authorization", &format!("Bearer {token}"))
}

fn far() -> i64 {
    now() + 3600
}

#[test]
fn every_algorithm_identifies_its_consumer() {
    use jsonwebtoken::Algorithm::*;
    for (alg, key, who) in [
        (HS256, "jack-key", "jack"),
        (HS512, "hs512-key", "hs512"),
        (HS256, "b64-key", "b64"),
        (RS256, "rsa-key", "rsa"),
        (PS256, "pss-key", "pss"),
        (ES256, "ec-key", "ec"),
        (EdDSA, "ed-key", "ed"),
    ] {
        let t = sign(alg, &json!({"key": key, "exp": far()}));
        assert_eq!(outcome(json!({}), bearer(&t)).1.as_deref(), Some(who), "{alg:?}");
    }
    // Bare header, query argument, cookie.
    let t = sign(HS256, &json!({"key": "jack-key"}));
    let bare = TestRequest::get("/").header("authorization", &t);
    assert_eq!(outcome(json!({}), bare).1.as_deref(), Some("jack"));
    assert_eq!(outcome(json!({}), TestRequest::get(&format!("/?jwt={t}"))).1.as_deref(), Some("jack"));
    let cookie = TestRequest::get("/").header("cookie", &format!("a=b; jwt={t}"));
    assert_eq!(outcome(json!({}), cookie).1.as_deref(), Some("jack"));
}

#[test]
fn the_algorithm_is_the_credentials_never_the_tokens() {
    use jsonwebtoken::Algorithm::*;
    // alg none, with and without a signature.
    let none_header = weir_b64(r#"{"alg":"none","typ":"JWT"}"#);
    let claims = weir_b64(&json!({"key": "jack-key"}).to_string());
    for t in [format!("{none_header}.{claims}."), format!("{none_header}.{claims}.c2ln")] {
        assert_eq!(outcome(json!({}), bearer(&t)).2, r#"{"message":"failed to verify jwt"}"#, "{t}");
    }
    // RS/HS confusion: an HS256 token whose MAC key is the RSA consumer's public key.
    let forged = encode(&Header::new(HS256), &json!({"key": "rsa-key"}), &EncodingKey::from_secret(RSA_PUB.as_bytes()))
        .unwrap_or_default();
    assert_eq!(outcome(json!({}), bearer(&forged)).0, Some(401));
    // Another algorithm of the same family than the credential's.
    assert_eq!(outcome(json!({}), bearer(&sign(HS384, &json!({"key": "jack-key"})))).0, Some(401));
    assert_eq!(outcome(json!({}), bearer(&sign(RS512, &json!({"key": "rsa-key"})))).0, Some(401));
    // A `kid` naming another consumer changes nothing: the `key` claim picks the credential,
    // whose key must have signed it.
    let mut h = Header::new(HS256);
    h.kid = Some("rsa-key".into());
    let t = encode(&h, &json!({"key": "rsa-key"}), &EncodingKey::from_secret(SECRET.as_bytes())).unwrap_or_default();
    assert_eq!(outcome(json!({}), bearer(&t)).0, Some(401));
}

fn weir_b64(s: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

#[test]
fn times_and_grace() {
    use jsonwebtoken::Algorithm::*;
    let expired = sign(HS256, &json!({"key": "jack-key", "exp": now() - 10}));
    assert_eq!(outcome(json!({}), bearer(&expired)).0, Some(401));
    let early = sign(HS256, &json!({"key": "jack-key", "nbf": now() + 60}));
    assert_eq!(outcome(json!({}), bearer(&early)).0, Some(401));
    // hs512 has 30 s of grace.
    let recent = sign(HS512, &json!({"key": "hs512-key", "exp": now() - 10}));
    assert_eq!(outcome(json!({}), bearer(&recent)).1.as_deref(), Some("hs512"));
    // claims_to_verify makes a listed claim required.
    let no_exp = sign(HS256, &json!({"key": "jack-key"}));
    assert_eq!(outcome(json!({"claims_to_verify": ["exp"]}), bearer(&no_exp)).0, Some(401));
    assert_eq!(outcome(json!({}), bearer(&no_exp)).0, None);
}

#[test]
fn hostile_tokens_get_apisix_answers_and_never_echo_anything() {
    let secretish = ["jack-hs256", "BEGIN", SECRET];
    let big = "A".repeat(1 << 20);
    let cases = [
        (TestRequest::get("/"), "Missing JWT token in request"),
        (bearer("not.a.token"), "JWT token invalid"),
        (bearer("%%%.%%%.%%%"), "JWT token invalid"),
        (bearer(&big), "JWT token invalid"),
        (bearer(&sign(jsonwebtoken::Algorithm::HS256, &json!({"sub": "x"}))), "missing user key in JWT token"),
        (bearer(&sign(jsonwebtoken::Algorithm::HS256, &json!({"key": "nobody"}))), "Invalid user key in JWT token"),
    ];
    for (req, message) in cases {
        let p = instance_with_consumers(&JwtAuth, json!({}), &consumers()).unwrap_or_else(|e| panic!("{e}"));
        let mut ctx = req.build();
        let Some(r) = run(&[p], &mut ctx) else { panic!("{message}: let through") };
        assert_eq!(r.status.as_u16(), 401);
        let body = String::from_utf8_lossy(&r.body).into_owned();
        assert_eq!(body, json!({ "message": message }).to_string());
        assert_eq!(r.headers.get("www-authenticate").and_then(|v| v.to_str().ok()), Some("Bearer realm=\"jwt\""));
        assert!(secretish.iter().all(|s| !body.contains(s)));
    }
    // Duplicate keys in the header (`alg` twice) are refused, not read either way.
    let dup = format!("{}.{}.x", weir_b64(r#"{"alg":"HS256","alg":"none"}"#), weir_b64(r#"{"key":"jack-key"}"#));
    assert_eq!(outcome(json!({}), bearer(&dup)).2, r#"{"message":"JWT token invalid"}"#);
}

#[test]
fn credentials_that_cannot_work_are_refused_at_load() {
    let load = |c: Value| instance_with_consumers(&JwtAuth, json!({}), &[("x", c)]).err().unwrap_or_default();
    assert!(load(json!({"key": "k"})).contains("secret"), "HS without a secret");
    assert!(load(json!({"key": "k", "algorithm": "RS256"})).contains("public key"));
    assert!(load(json!({"key": "k", "algorithm": "RS256", "public_key": "-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----"})).contains("public_key"));
    assert!(!load(json!({"key": "k", "algorithm": "none", "secret": "s"})).is_empty());
    assert!(!load(json!({"key": "k", "algorithm": "ES512", "public_key": EC_PUB})).is_empty());
    assert!(load(json!({"key": "k", "secret": "!!", "base64_secret": true})).contains("base64"));
    let e = load(
        json!({"key": "k", "algorithm": "RS256", "public_key": "-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----"}),
    );
    assert!(!e.contains("nope"), "errors never quote key material: {e}");
    let dup = [("a", json!({"key": "k", "secret": SECRET})), ("b", json!({"key": "k", "secret": SECRET}))];
    let e = instance_with_consumers(&JwtAuth, json!({}), &dup).err().unwrap_or_default();
    assert_eq!(e, "consumers `a` and `b` have the same key; it must be unique");
}

#[test]
fn hidden_credentials_and_anonymous() {
    let t = sign(jsonwebtoken::Algorithm::HS256, &json!({"key": "jack-key"}));
    let p = instance_with_consumers(&JwtAuth, json!({"hide_credentials": true}), &consumers())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut ctx = TestRequest::get(&format!("/?a=1&jwt={t}")).build();
    assert!(run(std::slice::from_ref(&p), &mut ctx).is_none());
    assert_eq!(ctx.query, "a=1");
    let mut ctx = TestRequest::get("/").header("cookie", &format!("jwt={t}; b=2")).build();
    assert!(run(std::slice::from_ref(&p), &mut ctx).is_none());
    assert_eq!(ctx.header("cookie"), Some("b=2"));
    let mut ctx = bearer(&t).build();
    assert!(run(&[p], &mut ctx).is_none());
    assert!(ctx.header("authorization").is_none());
    let (status, who, _) = outcome(json!({"anonymous_consumer": "ed"}), bearer("garbage"));
    assert_eq!((status, who.as_deref()), (None, Some("ed")));
}

#[test]
fn verified_public_key_tokens_are_cached_until_they_expire() {
    let p = instance_with_consumers(&JwtAuth, json!({}), &consumers()).unwrap_or_else(|e| panic!("{e}"));
    let t = sign(jsonwebtoken::Algorithm::RS256, &json!({"key": "rsa-key", "exp": far()}));
    for _ in 0..3 {
        let mut ctx = bearer(&t).build();
        assert!(run(std::slice::from_ref(&p), &mut ctx).is_none());
        assert_eq!(ctx.consumer.map(|c| c.username.to_string()).as_deref(), Some("rsa"));
    }
    // A token differing in its signature only is not a cache hit.
    let mut tampered = t.clone();
    tampered.pop();
    tampered.push(if t.ends_with('A') { 'B' } else { 'A' });
    let mut ctx = bearer(&tampered).build();
    assert_eq!(run(&[p], &mut ctx).map(|r| r.status.as_u16()), Some(401));
}
