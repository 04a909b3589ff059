//! openid-connect against a real OpenID provider: PyPI's `oidc-provider-mock` (with the additions
//! of tests/oidc_provider.py) in a virtualenv made once under the target directory. Bearer
//! tokens (JWKS, key rotation, introspection), the whole authorization-code login followed as a
//! browser would (redirects and cookies), renewal, logout, and a provider that is down.
//!
//! Without pip access the tests skip loudly, unless `WEIR_REQUIRE_OIDC=1` (CI) makes that a
//! failure.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use common::upstream::Upstream;
use common::*;
use serde_json::{json, Value};

const MOCK: &str = "oidc-provider-mock>=0.3,<0.4";

/// The virtualenv's python with the OpenID provider mock, made once.
fn venv_python() -> Option<PathBuf> {
    common::venv::python("oidc-venv", &[MOCK, "authlib"], "WEIR_REQUIRE_OIDC")
}

/// The provider process; killed on drop.
struct Idp {
    child: Child,
    port: u16,
}

impl Idp {
    fn start(python: &Path, port: u16, max_age: u64) -> Idp {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oidc_provider.py");
        let mut child = Command::new(python)
            .arg(script)
            .args([port.to_string(), max_age.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("provider: {e}"));
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        BufReader::new(stdout).read_line(&mut line).unwrap_or_else(|e| panic!("provider: {e}"));
        let port = line.trim().parse().unwrap_or_else(|e| panic!("provider port {line:?}: {e}"));
        Idp { child, port }
    }
    fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
    fn discovery(&self) -> String {
        self.url("/.well-known/openid-configuration")
    }
    /// A body the provider's test endpoints return.
    fn mint(&self, path_query: &str) -> String {
        let r = get(self.addr(), path_query);
        assert_eq!(r.status, 200, "{path_query}: {}", r.text());
        r.text()
    }
}

impl Drop for Idp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn up(u: &Upstream) -> String {
    format!("{{nodes: {{\"{}\": 1}}}}", u.node())
}

fn bearer(p: &Prefix, path: &str, token: &str) -> Response {
    request(p.node(), "GET", path, &[("authorization", &format!("Bearer {token}"))], b"")
}

/// `token` with the character at `at` changed.
fn tamper(token: &str, at: usize) -> String {
    let mut t = token.to_owned();
    let new = if &t[at..at + 1] == "A" { "B" } else { "A" };
    t.replace_range(at..at + 1, new);
    t
}

fn b64_json(v: &str) -> Value {
    let raw = base64::engine::general_purpose::STANDARD.decode(v).unwrap_or_else(|e| panic!("base64 {v:?}: {e}"));
    serde_json::from_slice(&raw).unwrap_or_else(|e| panic!("json: {e}"))
}

#[test]
fn bearer_tokens_are_verified_against_the_jwks() {
    let Some(python) = venv_python() else { return };
    let idp = Idp::start(&python, 0, 3600);
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /api, upstream: {u}, plugins: {{openid-connect: {{client_id: weir, client_secret: weir-secret, discovery: '{d}', bearer_only: true, use_jwks: true}}}}}}\n  - {{id: 2, uri: /scoped, upstream: {u}, plugins: {{openid-connect: {{client_id: weir, discovery: '{d}', bearer_only: true, use_jwks: true, required_scopes: [profile]}}}}}}\n",
        u = up(&u),
        d = idp.discovery()
    ));
    // Valid: the upstream sees the token and the claims, not what the client claimed.
    let token = idp.mint("/test/jwt?sub=alice&scope=openid%20profile");
    let r = request(
        p.node(),
        "GET",
        "/api",
        &[("authorization", &format!("Bearer {token}")), ("x-userinfo", "forged"), ("x-id-token", "forged")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = &r.json()["headers"];
    assert_eq!(seen["x-access-token"], token.as_str());
    assert_eq!(b64_json(seen["x-userinfo"].as_str().unwrap_or(""))["sub"], "alice");
    assert!(seen.get("x-id-token").is_none(), "a client's X-ID-Token never reaches the upstream");
    // Again: from the cache, same answer.
    assert_eq!(bearer(&p, "/api", &token).status, 200);
    let hits = u.hits();
    // Refused, each with its reason, never echoing the token.
    let cases = [
        (idp.mint("/test/jwt?exp_in=-3600"), "token expired"),
        (idp.mint("/test/jwt?iss=http://evil.example"), "token issuer not accepted"),
        (idp.mint("/test/jwt?alg=none"), "unsigned tokens (alg none) are not accepted"),
        (idp.mint("/test/jwt?alg=HS256"), "token signature algorithm not accepted"),
        ("garbage".to_owned(), "malformed token"),
        (tamper(&token, token.len() - 10), "invalid token signature"),
    ];
    for (bad, why) in &cases {
        let r = bearer(&p, "/api", bad);
        assert_eq!((r.status, r.json()), (401, json!({ "message": why })), "{bad}");
        assert!(r.header("www-authenticate").is_some_and(|v| v.starts_with("Bearer realm=\"apisix\"")));
        assert!(!r.text().contains(bad.as_str()));
    }
    let r = get(p.node(), "/api");
    assert_eq!((r.status, r.json()), (401, json!({"message": "No bearer token found in request"})));
    // Scopes.
    let r = bearer(&p, "/scoped", &idp.mint("/test/jwt?scope=openid"));
    assert_eq!((r.status, r.json()), (403, json!({"message": "required scopes profile not present"})));
    assert_eq!(u.hits(), hits, "nothing unauthenticated reached the upstream");
    assert_eq!(bearer(&p, "/scoped", &idp.mint("/test/jwt?scope=openid%20profile")).status, 200);
    // Key rotation: the new kid is unknown until the JWKS is fetched again (at most every 10 s).
    assert_eq!(get(idp.addr(), "/test/rotate").status, 405);
    assert_eq!(request(idp.addr(), "POST", "/test/rotate", &[], b"").status, 204);
    let rotated = idp.mint("/test/jwt?sub=bob");
    assert!(
        eventually(Duration::from_secs(15), || bearer(&p, "/api", &rotated).status == 200),
        "a token of the rotated key is accepted once the JWKS is refreshed"
    );
    assert_eq!(bearer(&p, "/api", &token).status, 200, "a verified token stays cached until it expires");
}

#[test]
fn introspection_decides_for_opaque_tokens() {
    let Some(python) = venv_python() else { return };
    let idp = Idp::start(&python, 0, 3600);
    let u = Upstream::start("u");
    let conf = |secret: &str| {
        format!(
            "{{openid-connect: {{client_id: weir, client_secret: {secret}, bearer_only: true, introspection_endpoint: '{}', required_scopes: [openid]}}}}",
            idp.url("/introspect")
        )
    };
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /i, upstream: {u}, plugins: {a}}}\n  - {{id: 2, uri: /wrong, upstream: {u}, plugins: {b}}}\n",
        u = up(&u),
        a = conf("weir-secret"),
        b = conf("not-the-secret"),
    ));
    let token = idp.mint("/test/opaque?sub=carol&scope=openid%20email");
    let r = bearer(&p, "/i", &token);
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = &r.json()["headers"];
    assert_eq!(seen["x-access-token"], token.as_str());
    assert_eq!(b64_json(seen["x-userinfo"].as_str().unwrap_or(""))["sub"], "carol");
    let hits = u.hits();
    let r = bearer(&p, "/i", "not-a-token-the-provider-knows");
    assert_eq!((r.status, r.json()), (401, json!({"message": "token is not active"})));
    let r = bearer(&p, "/i", &idp.mint("/test/opaque?exp_in=-10"));
    assert_eq!(r.status, 401);
    let r = bearer(&p, "/wrong", &token);
    assert_eq!((r.status, r.json()), (401, json!({"message": "introspection failed"})), "the client secret is checked");
    let r = bearer(&p, "/i", &idp.mint("/test/opaque?scope=email"));
    assert_eq!(r.status, 403);
    assert_eq!(u.hits(), hits);
}

/// A browser: cookies by name, redirects followed across the gateway and the provider.
struct Browser {
    cookies: Vec<(String, String)>,
}

impl Browser {
    fn cookie_header(&self) -> String {
        self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ")
    }
    fn take_cookies(&mut self, r: &Response) {
        for (k, v) in &r.headers {
            if !k.eq_ignore_ascii_case("set-cookie") {
                continue;
            }
            let pair = v.split(';').next().unwrap_or("");
            let Some((name, value)) = pair.split_once('=') else { continue };
            self.cookies.retain(|(n, _)| n != name);
            if !value.is_empty() && !v.contains("Max-Age=0") {
                self.cookies.push((name.to_owned(), value.to_owned()));
            }
        }
    }
    fn send(&mut self, addr: std::net::SocketAddr, method: &str, path: &str, body: &[u8]) -> Response {
        let cookie = self.cookie_header();
        let mut headers = vec![];
        if !cookie.is_empty() {
            headers.push(("cookie", cookie.as_str()));
        }
        if !body.is_empty() {
            headers.push(("content-type", "application/x-www-form-urlencoded"));
        }
        let r = request(addr, method, path, &headers, body);
        self.take_cookies(&r);
        r
    }
}

/// `(address, path?query)` of an absolute `http://127.0.0.1:port/...` URL or a path.
fn target(location: &str, default: std::net::SocketAddr) -> (std::net::SocketAddr, String) {
    match location.strip_prefix("http://") {
        Some(rest) => {
            let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            (host.parse().unwrap_or_else(|e| panic!("{host}: {e}")), path.to_owned())
        }
        None => (default, location.to_owned()),
    }
}

fn location(r: &Response) -> String {
    assert_eq!(r.status, 302, "{}", r.text());
    r.header("location").unwrap_or_else(|| panic!("no Location")).to_owned()
}

#[test]
fn authorization_code_login_renewal_and_logout() {
    let Some(python) = venv_python() else { return };
    // Tokens live 4 s: the session is renewed with the refresh token within the test.
    let idp = Idp::start(&python, 0, 4);
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: '/app/*', upstream: {u}, plugins: {{openid-connect: {{client_id: weir, client_secret: weir-secret, discovery: '{d}', scope: 'openid email', use_pkce: true, logout_path: /app/logout, post_logout_redirect_uri: 'http://127.0.0.1:{n}/bye', session: {{secret: 'a-session-secret-of-some-length'}}}}}}}}\n  - {{id: 2, uri: /deny, upstream: {u}, plugins: {{openid-connect: {{client_id: weir, client_secret: s, discovery: '{d}', unauth_action: deny, session: {{secret: 'a-session-secret-of-some-length'}}}}}}}}\n  - {{id: 3, uri: /pass, upstream: {u}, plugins: {{openid-connect: {{client_id: weir, client_secret: s, discovery: '{d}', unauth_action: pass, session: {{secret: 'a-session-secret-of-some-length'}}}}}}}}\n",
        u = up(&u),
        d = idp.discovery(),
        n = free_port(),
    ));
    let r = get(p.node(), "/deny");
    assert_eq!((r.status, r.json()), (401, json!({"message": "authentication required"})));
    let r = request(p.node(), "GET", "/pass", &[("x-userinfo", "forged")], b"");
    assert_eq!(r.status, 200);
    assert!(r.json()["headers"].get("x-userinfo").is_none());
    assert_eq!(u.hits(), 1);

    let mut b = Browser { cookies: Vec::new() };
    // 1. The gateway sends the browser to the provider.
    let r = b.send(p.node(), "GET", "/app/page?x=1", b"");
    let authorize = location(&r);
    assert!(authorize.starts_with(&idp.url("/oauth2/authorize?")), "{authorize}");
    for arg in
        ["state=", "nonce=", "code_challenge_method=S256", "code_challenge=", "scope=openid+email", "client_id=weir"]
    {
        assert!(authorize.contains(arg), "{arg} in {authorize}");
    }
    assert!(b.cookies.iter().any(|(n, _)| n == "session_login"), "{:?}", r.headers);
    // 2. The user picks a subject at the provider (a form POST), which redirects back.
    let (idp_addr, path) = target(&authorize, p.node());
    let r = b.send(idp_addr, "POST", &path, b"sub=alice");
    let callback = location(&r);
    assert!(callback.contains("/app/page/.apisix/redirect?"), "{callback}");
    // A forged state is refused.
    let (gw, cb_path) = target(&callback, p.node());
    let forged = cb_path.replace("state=", "state=x");
    let r = b.send(gw, "GET", &forged, b"");
    assert_eq!((r.status, r.json()), (401, json!({"message": "the callback's state does not match the login"})));
    // 3. The callback sets the session and goes back to the original URL.
    let r = b.send(gw, "GET", &cb_path, b"");
    assert_eq!(location(&r), "/app/page?x=1");
    assert!(b.cookies.iter().any(|(n, _)| n == "session"));
    assert!(!b.cookies.iter().any(|(n, _)| n == "session_login"), "the login cookie is cleared");
    // 4. The original URL, with identity headers.
    let r = b.send(p.node(), "GET", "/app/page?x=1", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = &r.json()["headers"];
    assert_eq!(b64_json(seen["x-id-token"].as_str().unwrap_or(""))["sub"], "alice");
    assert_eq!(b64_json(seen["x-id-token"].as_str().unwrap_or(""))["aud"], json!(["weir"]));
    assert_eq!(b64_json(seen["x-userinfo"].as_str().unwrap_or(""))["email"], "alice");
    let first_token = seen["x-access-token"].as_str().unwrap_or("").to_owned();
    assert!(!first_token.is_empty());
    // A replayed callback (its code is spent, its login cookie gone) does not log in again.
    let mut stranger = Browser { cookies: Vec::new() };
    assert_eq!(stranger.send(gw, "GET", &cb_path, b"").status, 401);
    // A tampered session is no session.
    let mut tampered = Browser { cookies: b.cookies.clone() };
    for (_, v) in tampered.cookies.iter_mut() {
        v.replace_range(10..11, if &v[10..11] == "A" { "B" } else { "A" });
    }
    assert_eq!(tampered.send(p.node(), "GET", "/app/page", b"").status, 302);
    // 5. Past the tokens' lifetime, the refresh token renews the session (a new cookie).
    std::thread::sleep(Duration::from_secs(5));
    let r = b.send(p.node(), "GET", "/app/page", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("set-cookie") && v.starts_with("session=")));
    let renewed = r.json()["headers"]["x-access-token"].as_str().unwrap_or("").to_owned();
    assert!(!renewed.is_empty() && renewed != first_token, "a new access token");
    assert_eq!(b.send(p.node(), "GET", "/app/page", b"").status, 200, "the renewed session holds");
    // 6. Logout: cookies cleared, off to the provider's end_session_endpoint.
    let r = b.send(p.node(), "GET", "/app/logout", b"");
    let end = location(&r);
    assert!(end.starts_with(&idp.url("/oauth2/end_session?")), "{end}");
    assert!(end.contains("id_token_hint=") && end.contains("post_logout_redirect_uri="), "{end}");
    assert!(!b.cookies.iter().any(|(n, _)| n == "session"), "{:?}", r.headers);
    let r = b.send(p.node(), "GET", "/app/page", b"");
    assert_eq!(r.status, 302, "logged out: back to the provider");
}

#[test]
fn the_gateway_serves_while_the_provider_is_down() {
    let Some(python) = venv_python() else { return };
    let port = free_port();
    let u = Upstream::start("u");
    let d = format!("http://127.0.0.1:{port}/.well-known/openid-configuration");
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /open, upstream: {u}}}\n  - {{id: 2, uri: '/app/*', upstream: {u}, plugins: {{openid-connect: {{client_id: weir, client_secret: s, discovery: '{d}', timeout: 1, session: {{secret: 'a-session-secret-of-some-length'}}}}}}}}\n  - {{id: 3, uri: /api, upstream: {u}, plugins: {{openid-connect: {{client_id: weir, discovery: '{d}', bearer_only: true, use_jwks: true}}}}}}\n",
        u = up(&u),
    ));
    assert_eq!(get(p.node(), "/open").status, 200);
    let unavailable = json!({"message": "the identity provider is unavailable"});
    let r = get(p.node(), "/app/x");
    assert_eq!((r.status, r.json()), (503, unavailable.clone()));
    let r = bearer(&p, "/api", "a.b.c");
    assert_eq!(r.status, 401, "a malformed token is refused before the provider is asked");
    let r = bearer(&p, "/api", "eyJhbGciOiJSUzI1NiJ9.e30.c2ln");
    assert_eq!((r.status, r.json()), (503, unavailable));
    assert_eq!(u.hits(), 1);
    // The provider comes up: discovery is tried again after the backoff.
    let _idp = Idp::start(&python, port, 3600);
    assert!(eventually(Duration::from_secs(15), || get(p.node(), "/app/x").status == 302));
}

#[test]
fn bad_configurations_are_refused_at_load() {
    let cases = [
        ("{client_id: a, client_secret: s, discovery: 'http://x/d', session: {secret: short}}", "secret"),
        ("{client_id: a, client_secret: s, discovery: 'http://x/d'}", "session.secret"),
        ("{client_id: a, bearer_only: true}", "discovery"),
        ("{client_id: a, bearer_only: true, public_key: 'nope'}", "public_key"),
        (
            "{client_id: a, bearer_only: true, discovery: 'http://x/d', token_signing_alg_values_expected: HS256}",
            "symmetric",
        ),
        ("{client_id: a, discovery: 'http://x/d', session: {secret: 0123456789abcdef}}", "client_secret"),
    ];
    for (conf, needle) in cases {
        let p = Prefix::new("", "", &format!("routes:\n  - {{id: 1, uri: /x, upstream: {{nodes: {{'127.0.0.1:1': 1}}}}, plugins: {{openid-connect: {conf}}}}}\n"));
        let (code, out) = start_refused(&p);
        assert_ne!(code, 0, "{conf} was accepted");
        assert!(out.contains(needle), "{conf}: {out}");
    }
}
