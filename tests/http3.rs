//! HTTP/3 against the real `weir` binary with a real HTTP/3 client (aioquic, from PyPI, in a
//! virtualenv the test makes): QUIC on the TLS listener's UDP port with the same certificates,
//! the same routes and plugins, `Alt-Svc` on the TCP side, request bodies both ways.
//! Without pip access the test skips loudly, unless `WEIR_REQUIRE_H3=1` (CI).

mod common;

use std::process::{Command, Stdio};

use common::pki::yaml_block;
use common::upstream::Upstream;
use common::*;
use serde_json::Value;

/// Runs the aioquic client: the answers to `requests` (`[[method, path, body]]`).
fn h3(python: &std::path::Path, p: &Prefix, requests: &str, parallel: bool) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h3_client.py");
    let mut cmd = Command::new(python);
    cmd.args([script, "127.0.0.1", &p.tls_port.to_string(), "h3.test", requests]);
    if parallel {
        cmd.arg("parallel");
    }
    let out = cmd.stderr(Stdio::piped()).output().expect("run the HTTP/3 client");
    assert!(out.status.success(), "HTTP/3 client: {}", String::from_utf8_lossy(&out.stderr));
    let answers: Value = serde_json::from_slice(&out.stdout).expect("the client's JSON");
    answers.as_array().cloned().unwrap_or_default()
}

#[test]
fn http3_serves_the_same_routes_and_plugins_and_is_advertised() {
    let Some(python) = common::venv::python("h3-venv", &["aioquic>=1.2,<2"], "WEIR_REQUIRE_H3") else { return };
    let up = Upstream::start("u");
    let cert = rcgen::generate_simple_self_signed(vec!["h3.test".to_owned()]).expect("certificate");
    let resources = format!(
        "ssls:\n  - id: s\n    snis: [h3.test]\n    cert: {}\n    key: {}\nroutes:\n  - id: api\n    uri: /api/*\n    plugins:\n      proxy-rewrite:\n        regex_uri: [\"^/api/(.*)\", \"/$1\"]\n        headers:\n          set: {{X-Via: \"$server_protocol\"}}\n    upstream:\n      nodes:\n        \"{}\": 1\n",
        yaml_block(&cert.cert.pem(), 4),
        yaml_block(&cert.key_pair.serialize_pem(), 4),
        up.node()
    );
    let p = Prefix::new("", "", &resources);
    p.write_config(&format!("  ssl:\n    listen: [{{ip: 127.0.0.1, port: {}, enable_http3: true}}]\n", p.tls_port), "");
    let w = Weir::start(&p);
    w.wait_ready(p.node());

    // The TCP side advertises HTTP/3 on the same port.
    let resolve = format!("h3.test:{}:127.0.0.1", p.tls_port);
    let out = Command::new("curl")
        .args([
            "-sk",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "--resolve",
            &resolve,
            &format!("https://h3.test:{}/api/x", p.tls_port),
        ])
        .output()
        .expect("curl");
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(head.contains(&format!("alt-svc: h3=\":{}\"; ma=86400", p.tls_port)), "{head}");

    // A GET, a POST with a 200 KB body, a path no route matches.
    let answers = h3(
        &python,
        &p,
        r#"[["GET", "/api/hello?x=1", ""], ["POST", "/api/upload", 200000], ["GET", "/nothing", ""]]"#,
        false,
    );
    assert_eq!(answers.len(), 3, "{answers:?}; log:\n{}", w.log_text());
    assert_eq!(answers[0]["status"], 200, "{:?}; log:\n{}", answers[0], w.log_text());
    let echo: Value = serde_json::from_str(answers[0]["body"].as_str().unwrap_or("")).expect("echo");
    assert_eq!(echo["node"], "u");
    assert_eq!(echo["path"], "/hello");
    assert_eq!(echo["query"], "x=1");
    assert_eq!(echo["headers"]["x-via"], "HTTP/3.0", "the route's plugins ran: {echo}");
    assert_eq!(echo["headers"]["host"], "h3.test", "the authority is the Host upstream: {echo}");
    assert_eq!(echo["headers"]["x-forwarded-proto"], "https");
    assert_eq!(answers[1]["status"], 200);
    assert_eq!(answers[1]["body"], "200000", "the whole body reached the upstream");
    assert_eq!(answers[2]["status"], 404);

    // Concurrent streams on one connection, and a large answer back.
    let many: Vec<String> = (0..20).map(|i| format!("[\"GET\", \"/api/bytes/{}\", \"\"]", 1000 * (i + 1))).collect();
    let answers = h3(&python, &p, &format!("[{}]", many.join(",")), true);
    let mut lens: Vec<u64> = answers.iter().filter_map(|a| a["body_len"].as_u64()).collect();
    lens.sort_unstable();
    assert_eq!(lens, (1..=20u64).map(|i| 1000 * i).collect::<Vec<_>>(), "{answers:?}");
    assert!(answers.iter().all(|a| a["status"] == 200));
}
