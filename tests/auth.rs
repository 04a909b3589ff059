//! Authentication plugins against the real binary: basic-auth with consumers, and forward-auth
//! against a real authorization service (a separate Python process) that allows, denies, is
//! slow, or is down.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::upstream::Upstream;
use common::*;
use serde_json::json;

fn up(u: &Upstream) -> String {
    format!("{{nodes: {{\"{}\": 1}}}}", u.node())
}

/// `Basic base64(text)`, without a base64 crate in the tests: Python's encoding is the reference.
fn basic(text: &str) -> String {
    let out = Command::new("python3")
        .args(["-c", "import base64,sys;print(base64.b64encode(sys.argv[1].encode()).decode())", text])
        .output()
        .unwrap_or_else(|e| panic!("python3: {e}"));
    format!("Basic {}", String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn basic_auth_identifies_consumers_and_refuses_everything_else() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "consumers:\n  - {{username: jack, plugins: {{basic-auth: {{username: jack, password: '123456'}}}}}}\n  - {{username: rose, plugins: {{basic-auth: {{username: rose, password: secret}}}}}}\nroutes:\n  - {{id: 1, uri: /b, upstream: {u}, plugins: {{basic-auth: {{hide_credentials: true, realm: weir}}}}}}\n",
        u = up(&u)
    ));
    let r = get(p.node(), "/b");
    assert_eq!((r.status, r.json()), (401, json!({"message": "Missing authorization in request"})));
    assert_eq!(r.header("www-authenticate"), Some("Basic realm=\"weir\""));
    for bad in ["Basic !!!", "Bearer x", basic("no-colon").as_str()] {
        let r = request(p.node(), "GET", "/b", &[("authorization", bad)], b"");
        assert_eq!((r.status, r.json()), (401, json!({"message": "Invalid authorization in request"})), "{bad}");
    }
    for wrong in [basic("jack:1234567"), basic("nobody:123456"), basic("rose:123456")] {
        let r = request(p.node(), "GET", "/b", &[("authorization", &wrong)], b"");
        assert_eq!((r.status, r.json()), (401, json!({"message": "Invalid user authorization"})), "{wrong}");
        assert!(!r.text().contains("123456"), "an answer never echoes the credential");
    }
    assert_eq!(u.hits(), 0, "nothing unauthenticated reached the upstream");
    let forged = basic("jack:123456");
    let r = request(p.node(), "GET", "/b", &[("authorization", &forged), ("x-consumer-username", "rose")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = &r.json()["headers"];
    assert_eq!(seen["x-consumer-username"], "jack", "the consumer, not what the client claimed");
    assert!(seen.get("authorization").is_none(), "hide_credentials");
}

/// An authorization service in its own process: `Bearer good` allows with `X-User-ID: 42`,
/// `Bearer good-noid` allows without it, `Bearer slow` answers after 3 s, anything else is a
/// 401 with its own body and `WWW-Authenticate`.
struct AuthService {
    child: Child,
    port: u16,
}

const AUTH_SERVICE: &str = r#"
import http.server, json, sys, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        seen = {k.lower(): v for k, v in self.headers.items()}
        if auth == "Bearer slow":
            time.sleep(3)
        if auth in ("Bearer good", "Bearer good-noid"):
            body = json.dumps({"seen": seen}).encode()
            self.send_response(200)
            if auth == "Bearer good":
                self.send_header("X-User-ID", "42")
        else:
            body = json.dumps({"error": "denied", "seen": seen}).encode()
            self.send_response(401)
            self.send_header("WWW-Authenticate", "Bearer realm=auth")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

impl AuthService {
    fn start() -> AuthService {
        let mut child = Command::new("python3")
            .args(["-c", AUTH_SERVICE])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("python3: {e}"));
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        BufReader::new(stdout).read_line(&mut line).unwrap_or_else(|e| panic!("auth service: {e}"));
        let port = line.trim().parse().unwrap_or_else(|e| panic!("auth service port {line:?}: {e}"));
        AuthService { child, port }
    }
}

impl Drop for AuthService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn forward_auth_asks_a_real_service_and_fails_closed() {
    let auth = AuthService::start();
    let down = free_port();
    let u = Upstream::start("u");
    let conf = |port: u16, extra: &str| {
        format!(
            "{{forward-auth: {{uri: 'http://127.0.0.1:{port}/auth', request_headers: [Authorization], upstream_headers: [X-User-ID], client_headers: [WWW-Authenticate], timeout: 500{extra}}}}}"
        )
    };
    let (p, _w) = start(&format!(
        "routes:\n  - {{id: 1, uri: /f, upstream: {u}, plugins: {a}}}\n  - {{id: 2, uri: /down, upstream: {u}, plugins: {d}}}\n  - {{id: 3, uri: /degrade, upstream: {u}, plugins: {g}}}\n",
        u = up(&u),
        a = conf(auth.port, ""),
        d = conf(down, ""),
        g = conf(down, ", allow_degradation: true"),
    ));
    // Allowed: the service's X-User-ID replaces the one the client sent.
    let r = request(p.node(), "GET", "/f?q=1", &[("authorization", "Bearer good"), ("x-user-id", "1")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-user-id"], "42");
    // Allowed without the header: the client's own X-User-ID never reaches the upstream.
    let r = request(p.node(), "GET", "/f", &[("authorization", "Bearer good-noid"), ("x-user-id", "1")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["headers"].get("x-user-id").is_none(), "{}", r.text());
    // Denied: the service's status, body and client_headers, and the upstream is not asked.
    let hits = u.hits();
    let r = request(p.node(), "GET", "/f?q=1", &[("authorization", "Bearer bad")], b"");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer realm=auth"));
    let body = r.json();
    assert_eq!(body["error"], "denied");
    let seen = &body["seen"];
    assert_eq!(seen["x-forwarded-uri"], "/f?q=1", "{body}");
    assert_eq!(seen["x-forwarded-method"], "GET");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["authorization"], "Bearer bad", "request_headers go to the service");
    assert_eq!(u.hits(), hits);
    // Slow: the timeout answers 403, in about the timeout.
    let t = Instant::now();
    let r = request(p.node(), "GET", "/f", &[("authorization", "Bearer slow")], b"");
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(t.elapsed() < Duration::from_millis(2500), "{:?}", t.elapsed());
    // Down: fails closed, unless degradation is allowed.
    let r = request(p.node(), "GET", "/down", &[("authorization", "Bearer good")], b"");
    assert_eq!((r.status, r.json()), (403, json!({"message": "the authorization service is unavailable"})));
    assert_eq!(u.hits(), hits);
    let r = request(p.node(), "GET", "/degrade", &[("authorization", "Bearer good")], b"");
    assert_eq!(r.status, 200);
}

/// An HS256 token signed by Python's standard library (an independent implementation).
fn hs256(claims: &serde_json::Value, secret: &str) -> String {
    let script = "import base64,hmac,hashlib,sys\n\
        b=lambda x: base64.urlsafe_b64encode(x).rstrip(b'=').decode()\n\
        s=b(b'{\"alg\":\"HS256\",\"typ\":\"JWT\"}')+'.'+b(sys.argv[1].encode())\n\
        print(s+'.'+b(hmac.new(sys.argv[2].encode(),s.encode(),hashlib.sha256).digest()))";
    let out = Command::new("python3")
        .args(["-c", script, &claims.to_string(), secret])
        .output()
        .unwrap_or_else(|e| panic!("python3: {e}"));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// jwt-auth through the real binary: a credential nested under its consumer whose secret comes
/// from the environment (`$env://`), APISIX's answers for every hostile token, nothing
/// unauthenticated upstream, and neither the secret nor a token in an answer or the log.
#[test]
fn jwt_auth_with_credentials_and_env_secrets() {
    const SECRET: &str = "jack-secret-from-the-environment-0123456789";
    let u = Upstream::start("u");
    let resources = format!(
        "consumers:\n  - username: jack\n    credentials:\n      - id: jack-jwt\n        plugins:\n          jwt-auth: {{key: jack-key, secret: \"$env://WEIR_TEST_JWT_SECRET\"}}\n  - username: rose\n    plugins:\n      jwt-auth: {{key: rose-key, secret: rose-secret-rose-secret-rose-secret}}\nroutes:\n  - {{id: 1, uri: /j, upstream: {u}, plugins: {{jwt-auth: {{hide_credentials: true}}}}}}\n",
        u = up(&u)
    );
    let p = Prefix::new("", "", &resources);
    let w = Weir::spawn_env(&p, &[("WEIR_TEST_JWT_SECRET", SECRET)]);
    w.wait_ready(p.node());
    let far = unix_now() + 3600;

    let good = hs256(&json!({"key": "jack-key", "exp": far}), SECRET);
    let r = request(
        p.node(),
        "GET",
        "/j",
        &[("authorization", &format!("Bearer {good}")), ("x-credential-identifier", "x")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = &r.json()["headers"];
    assert_eq!(seen["x-consumer-username"], "jack");
    assert_eq!(seen["x-credential-identifier"], "jack-jwt");
    assert!(seen.get("authorization").is_none(), "hide_credentials");
    let r =
        get(p.node(), &format!("/j?jwt={}", hs256(&json!({"key": "rose-key"}), "rose-secret-rose-secret-rose-secret")));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-consumer-username"], "rose");
    let hits = u.hits();

    let none = format!(
        "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{}.",
        hs256(&json!({"key": "jack-key"}), "x").split('.').nth(1).unwrap_or_default()
    );
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "Missing JWT token in request"),
        ("Bearer a.b.c".into(), "JWT token invalid"),
        (format!("Bearer {none}"), "failed to verify jwt"),
        (format!("Bearer {}", hs256(&json!({"key": "jack-key"}), "guessed-secret")), "failed to verify jwt"),
        (
            format!("Bearer {}", hs256(&json!({"key": "jack-key", "exp": unix_now() - 5}), SECRET)),
            "failed to verify jwt",
        ),
        (format!("Bearer {}", hs256(&json!({"key": "jack-key", "nbf": far}), SECRET)), "failed to verify jwt"),
        (format!("Bearer {}", hs256(&json!({"key": "rose-key"}), SECRET)), "failed to verify jwt"),
        (format!("Bearer {}", hs256(&json!({"key": "nobody"}), SECRET)), "Invalid user key in JWT token"),
    ];
    for (auth, message) in &cases {
        let headers: Vec<(&str, &str)> = if auth.is_empty() { vec![] } else { vec![("authorization", auth.as_str())] };
        let r = request(p.node(), "GET", "/j", &headers, b"");
        assert_eq!((r.status, r.json()), (401, json!({ "message": message })), "{auth}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"jwt\""));
        assert!(!r.text().contains(SECRET));
    }
    // A 1 MiB token never reaches the plugin's parser whole, nor the upstream.
    let huge = format!("Bearer {}", "A".repeat(1 << 20));
    let r = request(p.node(), "GET", "/j", &[("authorization", &huge)], b"");
    assert!(r.status == 431 || r.status == 400 || r.status == 401, "{}", r.status);
    assert_eq!(u.hits(), hits, "nothing unauthenticated reached the upstream");
    let log = w.log_text();
    assert!(!log.contains(SECRET), "the secret never reaches the log");
    assert!(!log.contains(&good), "a token never reaches the log");
}

/// A secret reference to an unset variable refuses the start, naming the reference, not a value.
#[test]
fn unset_env_secret_refuses_the_start() {
    let p = Prefix::new(
        "",
        "",
        "consumers:\n  - username: jack\n    plugins:\n      jwt-auth: {key: k, secret: \"$env://WEIR_TEST_NOT_SET_ANYWHERE\"}\n",
    );
    let (code, out) = common::start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("WEIR_TEST_NOT_SET_ANYWHERE") && out.contains("plugins.jwt-auth.secret"), "{out}");
}

/// `(Date, Authorization[, Digest])` signed by Python's standard library as APISIX's hmac-auth
/// documentation does it.
fn hmac_headers(path: &str, method: &str, body: Option<&[u8]>, date_offset: i64) -> Vec<(String, String)> {
    let script = r#"
import base64,hashlib,hmac,sys
from datetime import datetime, timezone, timedelta
path, method, offset, body = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None
date = (datetime.now(timezone.utc) + timedelta(seconds=offset)).strftime('%a, %d %b %Y %H:%M:%S GMT')
names, lines = "@request-target date", ["john-key", f"{method} {path}", f"date: {date}"]
out = [("Date", date)]
if body is not None:
    digest = "SHA-256=" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
    names += " digest"; lines.append(f"digest: {digest}"); out.append(("Digest", digest))
sig = base64.b64encode(hmac.new(b"john-secret-key", ("\n".join(lines) + "\n").encode(), hashlib.sha256).digest()).decode()
out.append(("Authorization", f'Signature keyId="john-key",algorithm="hmac-sha256",headers="{names}",signature="{sig}"'))
for k, v in out: print(f"{k}\t{v}")
"#;
    let mut args =
        vec!["-c".to_owned(), script.to_owned(), path.to_owned(), method.to_owned(), date_offset.to_string()];
    if let Some(b) = body {
        args.push(String::from_utf8_lossy(b).into_owned());
    }
    let out = Command::new("python3").args(&args).output().unwrap_or_else(|e| panic!("python3: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('\t').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

/// hmac-auth through the real binary, with a top-level credential: a signed request passes,
/// and a replay outside the skew, a changed body, or another target never reach the upstream.
#[test]
fn hmac_auth_signed_requests_and_replays() {
    let u = Upstream::start("u");
    let resources = format!(
        "consumers:\n  - username: john\ncredentials:\n  - {{id: john-hmac, consumer: john, plugins: {{hmac-auth: {{key_id: john-key, secret_key: \"$env://WEIR_TEST_HMAC\"}}}}}}\nroutes:\n  - {{id: 1, uri: /h, upstream: {u}, plugins: {{hmac-auth: {{}}}}}}\n  - {{id: 2, uri: /body, upstream: {u}, plugins: {{hmac-auth: {{validate_request_body: true, signed_headers: [date, digest]}}}}}}\n",
        u = up(&u)
    );
    let p = Prefix::new("", "", &resources);
    let w = Weir::spawn_env(&p, &[("WEIR_TEST_HMAC", "john-secret-key")]);
    w.wait_ready(p.node());
    let send = |method: &str, path: &str, headers: &[(String, String)], body: &[u8]| {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        request(p.node(), method, path, &h, body)
    };
    let r = send("GET", "/h?x=1", &hmac_headers("/h?x=1", "GET", None, 0), b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-consumer-username"], "john");
    assert_eq!(r.json()["headers"]["x-credential-identifier"], "john-hmac");
    let body = br#"{"amount": 10}"#;
    let r = send("POST", "/body", &hmac_headers("/body", "POST", Some(body), 0), body);
    assert_eq!(r.status, 200, "{}", r.text());
    let hits = u.hits();

    // A captured request replayed outside the skew; one replayed to another target; a body
    // changed after signing (same length, so only the digest can tell).
    let r = send("GET", "/h", &hmac_headers("/h", "GET", None, -400), b"");
    assert_eq!((r.status, r.json()), (401, json!({"message": "client request can't be validated"})));
    assert_eq!(r.header("www-authenticate"), Some("hmac realm=\"hmac\""));
    let r = send("GET", "/h?admin=1", &hmac_headers("/h?x=1", "GET", None, 0), b"");
    assert_eq!(r.status, 401);
    let r = send("POST", "/body", &hmac_headers("/body", "POST", Some(body), 0), br#"{"amount": 99}"#);
    assert_eq!(r.status, 401);
    let r = request(p.node(), "GET", "/h", &[], b"");
    assert_eq!(r.json(), json!({"message": "client request can't be validated: missing Authorization header"}));
    assert_eq!(u.hits(), hits, "nothing refused reached the upstream");
    assert!(!w.log_text().contains("john-secret-key"));
}

/// APISIX's multi-auth and consumer-restriction examples through the real binary, with a
/// consumer group's limit-count merged once the consumer is known.
#[test]
fn multi_auth_consumer_restriction_and_group_plugins() {
    let u = Upstream::start("u");
    let resources = format!(
        "consumer_groups:\n  - {{id: gold, plugins: {{limit-count: {{count: 2, time_window: 60, key: consumer_name, rejected_code: 429}}}}}}\nconsumers:\n  - username: jack\n    group_id: gold\n    plugins:\n      basic-auth: {{username: jack, password: jack-pass}}\n      key-auth: {{key: jack-key}}\n  - username: rose\n    plugins:\n      key-auth: {{key: rose-key}}\nroutes:\n  - id: 1\n    uri: /m\n    upstream: {u}\n    plugins:\n      multi-auth: {{auth_plugins: [{{basic-auth: {{}}}}, {{key-auth: {{}}}}]}}\n  - id: 2\n    uri: /only-jack\n    upstream: {u}\n    plugins:\n      key-auth: {{}}\n      consumer-restriction: {{whitelist: [jack]}}\n",
        u = up(&u)
    );
    let (p, _w) = start(&resources);
    let r = request(p.node(), "GET", "/m", &[("authorization", &basic("jack:jack-pass"))], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-consumer-username"], "jack");
    let r = request(p.node(), "GET", "/m", &[("apikey", "rose-key")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-consumer-username"], "rose");
    for bad in [vec![("apikey", "nope")], vec![("authorization", "Basic !!")], vec![]] {
        let r = request(p.node(), "GET", "/m", &bad, b"");
        assert_eq!((r.status, r.json()), (401, json!({"message": "Authorization Failed"})), "{bad:?}");
    }
    // jack's group limits jack to 2 requests a minute (he used 1); rose is not limited.
    assert_eq!(request(p.node(), "GET", "/m", &[("apikey", "jack-key")], b"").status, 200);
    assert_eq!(request(p.node(), "GET", "/m", &[("apikey", "jack-key")], b"").status, 429);
    for _ in 0..3 {
        assert_eq!(request(p.node(), "GET", "/m", &[("apikey", "rose-key")], b"").status, 200);
    }
    let r = request(p.node(), "GET", "/only-jack", &[("apikey", "rose-key")], b"");
    assert_eq!((r.status, r.json()), (403, json!({"message": "The consumer_name is forbidden."})));
}

/// multi-auth refuses what cannot work, at load.
#[test]
fn multi_auth_refuses_non_auth_plugins() {
    let p = Prefix::new(
        "",
        "",
        "routes:\n  - {id: 1, uri: /m, upstream: {nodes: {\"127.0.0.1:1\": 1}}, plugins: {multi-auth: {auth_plugins: [{key-auth: {}}, {limit-count: {count: 1, time_window: 1}}]}}}\n",
    );
    let (code, out) = common::start_refused(&p);
    assert_ne!(code, 0);
    assert!(out.contains("limit-count plugin is not supported"), "{out}");
}
