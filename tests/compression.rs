//! The gzip and brotli plugins against the real binary and a real upstream: bodies compressed
//! as they stream (HTTP/1.1 chunked), decoded back to the upstream's bytes; skipped when the
//! client did not ask, the type is not listed, the body is small or already encoded; Brotli
//! preferred when both are on a route; APISIX's examples load as written.

mod common;

use std::io::Read;

use common::upstream::Upstream;
use common::*;

fn up(u: &Upstream) -> String {
    format!("{{nodes: {{\"{}\": 1}}}}", u.node())
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b).read_to_end(&mut out).unwrap_or_else(|e| panic!("gunzip: {e}"));
    out
}

fn unbrotli(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    brotli::Decompressor::new(b, 4096).read_to_end(&mut out).unwrap_or_else(|e| panic!("brotli: {e}"));
    out
}

#[test]
fn responses_are_compressed_as_they_stream() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        r#"routes:
  - id: gz
    uri: /gz/*
    plugins:
      proxy-rewrite: {{regex_uri: ["^/gz/(.*)", "/$1"]}}
      gzip: {{types: ["application/json", "application/octet-stream"], min_length: 100, comp_level: 6, vary: true}}
    upstream: {u}
  - id: both
    uri: /both/*
    plugins:
      proxy-rewrite: {{regex_uri: ["^/both/(.*)", "/$1"]}}
      gzip: {{types: "*"}}
      brotli: {{types: "*"}}
    upstream: {u}
"#,
        u = up(&u)
    ));
    // A 100 KiB JSON document (the upstream echoes the request body inside its JSON answer).
    let doc: String = (0..2000).map(|i| format!("{{\"id\":{i},\"name\":\"item-{i}\"}},")).collect();
    let r = request(p.node(), "POST", "/gz/echo", &[("accept-encoding", "gzip")], doc.as_bytes());
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    assert!(r.header("content-length").is_none(), "the length changed: chunked");
    let plain = gunzip(&r.body);
    let v: serde_json::Value = serde_json::from_slice(&plain).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v["body"].as_str(), Some(doc.as_str()));
    assert!(r.body.len() * 5 < plain.len(), "{} -> {}", plain.len(), r.body.len());

    // 3 MiB streamed from the upstream in chunks: decoded whole.
    let r = request(p.node(), "GET", "/gz/bytes/3145728", &[("accept-encoding", "gzip")], b"");
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(gunzip(&r.body).len(), 3 << 20);

    // Not asked, not listed, too small: untouched, with the upstream's length.
    let r = request(p.node(), "POST", "/gz/echo", &[], doc.as_bytes());
    assert_eq!((r.header("content-encoding"), r.json()["body"].as_str()), (None, Some(doc.as_str())));
    let r = request(p.node(), "GET", "/gz/status/200", &[("accept-encoding", "gzip")], b"");
    assert_eq!(r.header("content-encoding"), None, "text/plain is not listed");
    let r = request(p.node(), "POST", "/gz/echo", &[("accept-encoding", "gzip;q=0")], b"x");
    assert_eq!(r.header("content-encoding"), None, "q=0 refuses");
    let r = request(p.node(), "HEAD", "/gz/echo", &[("accept-encoding", "gzip")], b"");
    assert_eq!(r.header("content-encoding"), None, "HEAD");

    // Both plugins: Brotli for clients that take it, gzip for the others.
    let r = request(p.node(), "POST", "/both/echo", &[("accept-encoding", "gzip, deflate, br")], doc.as_bytes());
    assert_eq!(r.header("content-encoding"), Some("br"));
    let text = String::from_utf8_lossy(&unbrotli(&r.body)).into_owned();
    assert!(
        text.contains("item-1999"),
        "{} bytes decoded, {} sent; ends with {:?}",
        text.len(),
        r.body.len(),
        &text[text.len().saturating_sub(300)..]
    );
    let r = request(p.node(), "POST", "/both/echo", &[("accept-encoding", "gzip")], doc.as_bytes());
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert!(String::from_utf8_lossy(&gunzip(&r.body)).contains("item-1999"));
}

#[test]
fn apisix_examples_load_unchanged() {
    let u = Upstream::start("u");
    let (p, _w) = start(&format!(
        "routes:\n  - id: 1\n    uri: /echo\n    plugins:\n      gzip: {{buffers: {{number: 8}}}}\n    upstream: {u}\n  - id: 2\n    uri: /anything\n    plugins:\n      brotli: {{comp_level: 5, lgwin: 24, lgblock: 16, types: [\"text/plain\", \"application/json\"], min_length: 1}}\n    upstream: {u}\n",
        u = up(&u)
    ));
    let r = request(p.node(), "GET", "/anything", &[("accept-encoding", "br")], b"");
    assert_eq!(r.header("content-encoding"), Some("br"));
    assert!(String::from_utf8_lossy(&unbrotli(&r.body)).contains("\"node\":\"u\""));
}
