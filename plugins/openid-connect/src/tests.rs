//! Unit tests of the plugin: configuration checks, and bearer verification against a provider
//! simulated by a test HTTP client (discovery + JWKS of an Ed25519 key made here).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::Engine as _;
use jsonwebtoken::{EncodingKey, Header};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{json, Value};
use weir_plugin::http::StatusCode;
use weir_plugin::services::{OutboundError, OutboundResponse, SendFuture, UpstreamRef};
use weir_plugin::testing::{instance, instance_with, run, TestRequest};
use weir_plugin::{HttpClient, OutboundRequest, Services};

use super::*;

const ISS: &str = "http://idp.test";

struct Idp {
    jwks: Value,
    jwks_fetches: AtomicUsize,
}

struct Client(Arc<Idp>);

impl HttpClient for Client {
    fn send(&self, req: OutboundRequest) -> SendFuture {
        let body = if req.url.ends_with("/.well-known/openid-configuration") {
            Some(
                json!({"issuer": ISS, "jwks_uri": format!("{ISS}/jwks"), "authorization_endpoint": format!("{ISS}/auth"), "token_endpoint": format!("{ISS}/token")}),
            )
        } else if req.url.ends_with("/jwks") {
            self.0.jwks_fetches.fetch_add(1, Ordering::SeqCst);
            Some(self.0.jwks.clone())
        } else {
            None
        };
        Box::pin(async move {
            match body {
                Some(b) => Ok(OutboundResponse {
                    status: StatusCode::OK,
                    headers: Default::default(),
                    body: b.to_string().into(),
                }),
                None => Err(OutboundError { timeout: false, reason: "down".into() }),
            }
        })
    }
}

struct Host(Arc<Idp>);

impl Services for Host {
    fn http_client(&self) -> Arc<dyn HttpClient> {
        Arc::new(Client(self.0.clone()))
    }
    fn compile_upstream(&self, _conf: &Value) -> Result<UpstreamRef, String> {
        Err("none".into())
    }
}

struct Signer {
    key: EncodingKey,
    kid: String,
}

fn keypair(kid: &str) -> (Signer, Value) {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap_or_else(|e| panic!("{e}"));
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap_or_else(|e| panic!("{e}"));
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
    let jwk = json!({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"});
    (Signer { key: EncodingKey::from_ed_der(pkcs8.as_ref()), kid: kid.into() }, jwk)
}

fn sign(s: &Signer, claims: Value) -> String {
    let mut h = Header::new(jsonwebtoken::Algorithm::EdDSA);
    h.kid = Some(s.kid.clone());
    jsonwebtoken::encode(&h, &claims, &s.key).unwrap_or_else(|e| panic!("{e}"))
}

fn claims(iss: &str, exp_in: i64) -> Value {
    json!({"iss": iss, "sub": "alice", "aud": "weir", "scope": "openid", "iat": now(), "exp": now() + exp_in})
}

fn setup() -> (Signer, Arc<Idp>, Arc<dyn PluginInstance>) {
    let (signer, jwk) = keypair("k1");
    let idp = Arc::new(Idp { jwks: json!({"keys": [jwk, {"kty": "weird"}]}), jwks_fetches: AtomicUsize::new(0) });
    let conf = json!({"client_id": "weir", "discovery": format!("{ISS}/.well-known/openid-configuration"), "bearer_only": true});
    let inst = instance_with(&OpenIdConnect, conf, &[], &Host(idp.clone())).unwrap_or_else(|e| panic!("{e}"));
    (signer, idp, inst)
}

fn answer(inst: &Arc<dyn PluginInstance>, token: &str) -> (Option<u16>, String, RequestCtx) {
    let mut ctx = TestRequest::get("/")
        .header("authorization", &format!("Bearer {token}"))
        .header("x-userinfo", "forged")
        .build();
    let r = run(std::slice::from_ref(inst), &mut ctx);
    let msg = r.as_ref().map(|r| String::from_utf8_lossy(&r.body).into_owned()).unwrap_or_default();
    (r.map(|r| r.status.as_u16()), msg, ctx)
}

#[test]
fn a_valid_token_passes_with_its_claims_upstream() {
    let (signer, _idp, inst) = setup();
    let token = sign(&signer, claims(ISS, 60));
    let (status, msg, ctx) = answer(&inst, &token);
    assert_eq!(status, None, "{msg}");
    assert_eq!(ctx.header("x-access-token"), Some(token.as_str()));
    let userinfo =
        base64::engine::general_purpose::STANDARD.decode(ctx.header("x-userinfo").unwrap_or("")).unwrap_or_default();
    assert_eq!(serde_json::from_slice::<Value>(&userinfo).ok().map(|v| v["sub"].clone()), Some(json!("alice")));
}

#[test]
fn none_wrong_issuer_expired_and_garbage_are_refused_with_their_reason() {
    let (signer, _idp, inst) = setup();
    let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let none = format!("{}.{}.", b64(json!({"alg": "none"})), b64(claims(ISS, 60)));
    let hs = format!("{}.{}.c2ln", b64(json!({"alg": "HS256", "kid": "k1"})), b64(claims(ISS, 60)));
    let cases = [
        (none, "unsigned tokens (alg none) are not accepted"),
        (hs, "token signature algorithm not accepted"),
        (sign(&signer, claims("http://evil.test", 60)), "token issuer not accepted"),
        (sign(&signer, claims(ISS, -10)), "token expired"),
        ("x.y".into(), "malformed token"),
    ];
    for (token, why) in cases {
        let (status, msg, ctx) = answer(&inst, &token);
        assert_eq!(status, Some(401), "{why}");
        assert_eq!(serde_json::from_str::<Value>(&msg).ok(), Some(json!({ "message": why })));
        assert_eq!(ctx.header("x-userinfo"), None, "the client's header is removed");
    }
}

#[test]
fn an_unknown_kid_refreshes_the_jwks_at_most_once_per_period() {
    let (_, idp, inst) = setup();
    let (other, _) = keypair("k2");
    let token = sign(&other, claims(ISS, 60));
    for _ in 0..3 {
        let (status, msg, _) = answer(&inst, &token);
        assert_eq!((status, msg), (Some(401), json!({"message": "token signed with an unknown key"}).to_string()));
    }
    // Fetched once: a refresh for the unknown kid waits until 10 s after the last fetch, so a
    // stream of tokens with made-up kids never hammers the provider.
    assert_eq!(idp.jwks_fetches.load(Ordering::SeqCst), 1);
}

#[test]
fn login_state_and_id_token_nonce_are_checked() {
    let settings = session_settings(
        &serde_json::from_value(
            json!({"client_id": "weir", "discovery": "http://x", "session": {"secret": "0123456789abcdef"}}),
        )
        .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|| panic!("settings"));
    let login = session::Login {
        state: "s1".into(),
        nonce: "n1".into(),
        verifier: None,
        original_url: "/a".into(),
        redirect_uri: "http://gw/a/.apisix/redirect".into(),
        until: 100,
    };
    let sealed =
        settings.sealer.seal(session::LOGIN, &serde_json::to_vec(&login).unwrap_or_default()).unwrap_or_default();
    let ctx = TestRequest::get("/cb").header("cookie", &format!("session_login={sealed}")).build();
    assert!(flow::check_login(&settings, &ctx, Some("s1"), 50).is_ok());
    assert!(flow::check_login(&settings, &ctx, Some("s2"), 50).is_err(), "another state");
    assert!(flow::check_login(&settings, &ctx, None, 50).is_err(), "no state");
    assert!(flow::check_login(&settings, &ctx, Some("s1"), 100).is_err(), "expired");
    let none = TestRequest::get("/cb").build();
    assert!(flow::check_login(&settings, &none, Some("s1"), 50).is_err(), "no login cookie");
    let mut c = serde_json::Map::new();
    c.insert("aud".into(), json!(["weir"]));
    c.insert("nonce".into(), json!("n1"));
    let expect = |nonce| jwt::Expect {
        issuers: None,
        audience: None,
        client_id: "weir",
        id_token: true,
        nonce,
        iat_slack: 0,
        now: 0,
    };
    assert!(jwt::check_claims(&c, &expect(Some("n1"))).is_ok());
    assert_eq!(jwt::check_claims(&c, &expect(Some("n2"))), Err(Invalid::Nonce));
    c.insert("aud".into(), json!("other"));
    assert_eq!(jwt::check_claims(&c, &expect(Some("n1"))), Err(Invalid::Audience));
    assert_eq!(
        flow::pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
        "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    );
}

#[test]
fn configurations_are_checked_at_load() {
    let ok = |v: Value| instance(&OpenIdConnect, v);
    assert!(ok(json!({"client_id": "a", "bearer_only": true, "discovery": "http://x/d"})).is_ok());
    assert!(ok(json!({"client_id": "a", "client_secret": "s", "discovery": "http://x/d", "session": {"secret": "0123456789abcdef"}})).is_ok());
    for (bad, needle) in [
        (json!({"client_id": "a", "bearer_only": true}), "discovery"),
        (json!({"client_id": "a", "client_secret": "s", "discovery": "http://x/d"}), "session.secret"),
        (
            json!({"client_id": "a", "client_secret": "s", "discovery": "http://x/d", "session": {"secret": "short"}}),
            "secret",
        ),
        (
            json!({"client_id": "a", "discovery": "http://x/d", "session": {"secret": "0123456789abcdef"}}),
            "client_secret",
        ),
        (
            json!({"client_id": "a", "bearer_only": true, "discovery": "http://x/d", "token_endpoint_auth_method": "private_key_jwt"}),
            "not supported",
        ),
        (json!({"client_id": "a", "bearer_only": true, "discovery": "ftp://x/d"}), "discovery"),
        (json!({"client_id": "a", "bearer_only": true, "public_key": "not pem"}), "public_key"),
        (
            json!({"client_id": "a", "bearer_only": true, "discovery": "http://x/d", "unauth_action": "maybe"}),
            "unauth_action",
        ),
        (json!({"client_id": "a", "bearer_only": true, "discovery": "http://x/d", "nope": 1}), "nope"),
    ] {
        let err = ok(bad.clone()).err().unwrap_or_else(|| panic!("{bad} was accepted"));
        assert!(err.contains(needle), "{bad}: {err}");
    }
    // APISIX fields Weir does not implement are accepted (and logged).
    let conf = json!({"client_id": "a", "bearer_only": true, "discovery": "http://x/d", "proxy_opts": {}, "accept_none_alg": true, "session_contents": {"access_token": true}});
    assert!(ok(conf.clone()).is_ok());
    let parsed: Conf = serde_json::from_value(conf).unwrap_or_else(|e| panic!("{e}"));
    let ignored = conf::ignored_fields(&parsed);
    assert!(ignored.contains(&"proxy_opts") && ignored.contains(&"session_contents"), "{ignored:?}");
}

/// A token signed by `s` over the raw header and payload JSON given (duplicate keys and all).
fn sign_raw(s: &Signer, header: &str, payload: &str) -> String {
    let b64 = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    let signed = format!("{}.{}", b64(header), b64(payload));
    let sig = jsonwebtoken::crypto::sign(signed.as_bytes(), &s.key, jsonwebtoken::Algorithm::EdDSA)
        .unwrap_or_else(|e| panic!("{e}"));
    format!("{signed}.{sig}")
}

#[test]
fn duplicate_claims_are_malformed_not_read_either_way() {
    let (signer, _idp, inst) = setup();
    let (iat, exp) = (now(), now() + 60);
    let header = r#"{"alg":"EdDSA","kid":"k1"}"#;
    let rest = format!(r#""sub":"alice","aud":"weir","scope":"openid","iat":{iat},"exp":{exp}"#);
    let single = sign_raw(&signer, header, &format!(r#"{{"iss":"{ISS}",{rest}}}"#));
    assert_eq!(answer(&inst, &single).0, None, "the same token without duplicates passes");
    for (first, last) in [("http://evil.test", ISS), (ISS, "http://evil.test")] {
        let token = sign_raw(&signer, header, &format!(r#"{{"iss":"{first}",{rest},"iss":"{last}"}}"#));
        assert_eq!(jwt::parse(&token, None).err(), Some(Invalid::Malformed));
        let (status, msg, _) = answer(&inst, &token);
        assert_eq!((status, msg), (Some(401), json!({"message": "malformed token"}).to_string()));
    }
    // Also claims that no library check reads (here `scope`, which grants access).
    let token = sign_raw(&signer, header, &format!(r#"{{"iss":"{ISS}",{rest},"scope":"openid admin"}}"#));
    assert_eq!(jwt::parse(&token, None).err(), Some(Invalid::Malformed));
}

#[test]
fn a_header_with_two_algs_is_malformed() {
    let (signer, _idp, inst) = setup();
    let payload = claims(ISS, 60).to_string();
    for header in [r#"{"alg":"EdDSA","kid":"k1","alg":"none"}"#, r#"{"alg":"none","kid":"k1","alg":"EdDSA"}"#] {
        let token = sign_raw(&signer, header, &payload);
        assert_eq!(jwt::parse(&token, None).err(), Some(Invalid::Malformed), "{header}");
        let (status, msg, _) = answer(&inst, &token);
        assert_eq!((status, msg), (Some(401), json!({"message": "malformed token"}).to_string()), "{header}");
    }
    let token = sign_raw(&signer, r#"{"alg":"EdDSA","kid":"k1"}"#, &payload);
    assert_eq!(answer(&inst, &token).0, None, "the same token with one alg passes");
}

#[test]
fn a_public_key_verifies_its_own_algorithms_only() {
    let (signer, jwk) = keypair("k1");
    let raw =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(jwk["x"].as_str().unwrap_or("")).unwrap_or_default();
    // SubjectPublicKeyInfo of an Ed25519 key: the fixed prefix, then the 32 bytes.
    let mut der = vec![0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];
    der.extend_from_slice(&raw);
    let pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(&der)
    );
    let inst = instance(&OpenIdConnect, json!({"client_id": "weir", "bearer_only": true, "public_key": pem}))
        .unwrap_or_else(|e| panic!("{e}"));
    let token = sign(&signer, claims(ISS, 60));
    assert_eq!(answer(&inst, &token).0, None, "{}", answer(&inst, &token).1);
    let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let sig = token.rsplit('.').next().unwrap_or("");
    let es256 = format!("{}.{}.{sig}", b64(json!({"alg": "ES256"})), b64(claims(ISS, 60)));
    let (other, _) = keypair("k1");
    for (bad, why) in [
        (es256, "token signature algorithm not accepted"),
        (sign(&other, claims(ISS, 60)), "invalid token signature"),
        (format!("{}!", &token[..token.len() - 1]), "malformed token"),
    ] {
        let (status, msg, _) = answer(&inst, &bad);
        assert_eq!((status, msg), (Some(401), json!({ "message": why }).to_string()), "{why}");
    }
    let only_rs = json!({"client_id": "weir", "bearer_only": true, "public_key": pem, "token_signing_alg_values_expected": "RS256"});
    let inst = instance(&OpenIdConnect, only_rs).unwrap_or_else(|e| panic!("{e}"));
    let (status, msg, _) = answer(&inst, &token);
    assert_eq!((status, msg), (Some(401), json!({"message": "token signature algorithm not accepted"}).to_string()));
}

#[test]
fn times_have_no_leeway_and_a_token_is_valid_from_its_nbf_second() {
    let c = |v: Value| v.as_object().cloned().unwrap_or_default();
    assert_eq!(jwt::check_times(&c(json!({"exp": 100, "nbf": 100})), 100), Ok(()));
    assert_eq!(jwt::check_times(&c(json!({"exp": 99})), 100), Err(Invalid::Expired));
    assert_eq!(jwt::check_times(&c(json!({"exp": 200, "nbf": 101})), 100), Err(Invalid::NotYetValid));
    assert_eq!(jwt::check_times(&c(json!({})), 100), Err(Invalid::MissingClaim("exp")));
    assert_eq!(jwt::check_times(&c(json!({"exp": "200"})), 100), Err(Invalid::MissingClaim("exp")));
    assert_eq!(jwt::check_times(&c(json!({"exp": 150.4})), 100), Ok(()));
}
