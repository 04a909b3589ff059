//! Fuzzing entry points: each takes arbitrary bytes, runs one parser of untrusted input the way
//! Weir runs it, and panics when an invariant breaks. The cargo-fuzz targets under `fuzz/` call
//! these, and `tests/fuzz_corpus.rs` runs them over the seed corpus as ordinary tests.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::dataplane::normalize::{normalize, PathRules};
use crate::resources::model::Route;
use crate::tables::router::{CompiledRoute, RouteTable};

/// Routes the path fuzzer matches against: a protected prefix, an open one, a parameter route.
fn table() -> &'static RouteTable {
    static TABLE: OnceLock<RouteTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let routes = [("api", "/api/*"), ("pub", "/pub/*"), ("user", "/users/:id/posts"), ("exact", "/exact")]
            .into_iter()
            .filter_map(|(id, uri)| {
                let route: Route = serde_json::from_value(serde_json::json!({"id": id, "uri": uri})).ok()?;
                Some(Arc::new(CompiledRoute::new(Arc::new(route), None, Default::default(), None)))
            })
            .collect();
        RouteTable::build(routes).0
    })
}

/// Path normalization, then route matching, under each operator setting.
pub fn path_route(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else { return };
    let settings = [
        PathRules::default(),
        PathRules { merge_slashes: false, reject_escaped_slashes: false },
        PathRules { merge_slashes: true, reject_escaped_slashes: true },
    ];
    for rules in settings {
        let Ok(path) = normalize(raw, rules) else { continue };
        assert!(path.starts_with('/'), "{raw:?} -> {path:?}");
        assert_eq!(normalize(&path, rules).as_deref(), Ok(&*path), "not idempotent for {raw:?}");
        assert!(!path.bytes().any(|b| b < 0x20 || b == 0x7f || b == b'\\'), "{raw:?} -> {path:?}");
        for seg in path.split('/') {
            let base = seg.split(';').next().unwrap_or("");
            assert!(base != "." && base != "..", "dot segment left in {path:?} (from {raw:?})");
        }
        if rules.merge_slashes {
            assert!(!path.contains("//"), "{raw:?} -> {path:?}");
        }
        if rules.reject_escaped_slashes {
            assert!(!path.to_ascii_uppercase().contains("%2F"), "{raw:?} -> {path:?}");
        }
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let addr = std::net::SocketAddr::new(ip, 1);
        let ctx = weir_plugin::RequestCtx::new(
            http::Method::GET,
            path.clone().into_owned(),
            String::new(),
            http::HeaderMap::new(),
            addr,
            std::sync::Arc::from("127.0.0.1"),
            addr,
        );
        if let Some(m) = table().find("h", ip, &ctx) {
            match &*m.route.id {
                "api" => assert!(path.starts_with("/api/"), "{path:?} matched /api/*"),
                "pub" => assert!(path.starts_with("/pub/"), "{path:?} matched /pub/*"),
                "exact" => assert_eq!(&*path, "/exact"),
                _ => {}
            }
        }
    }
}

/// config.yaml: YAML parsing and validation, as `weir -t` runs them.
pub fn config_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = Path::new("conf/config.yaml");
    if let Ok(raw) = crate::config::parse_yaml(path, text) {
        let _ = crate::config::Config::from_value(path, &raw, crate::plugins_catalog());
    }
}

/// resources.yaml: YAML parsing and the whole snapshot build (schemas, references, plugin
/// configurations, route table), with every compiled-in plugin enabled in check-only mode.
pub fn resources_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(raw) = crate::config::parse_yaml(Path::new("conf/resources.yaml"), text) else { return };
    static ENABLED: OnceLock<crate::plugins::EnabledSet> = OnceLock::new();
    let enabled = ENABLED.get_or_init(|| {
        let catalog = crate::plugins_catalog();
        let mut set = catalog.enable(&catalog.names());
        set.check_only = true;
        set
    });
    // Files named by the input (`ssls[].cert_file`) resolve where nothing exists.
    let _ = crate::tables::snapshot::Snapshot::build_at(&raw, enabled, Path::new("/nonexistent/weir-fuzz"));
}

/// Runs the request framer over `data` fed `step` bytes at a time: (bytes passed, refusal).
fn frame(data: &[u8], step: usize) -> (usize, Option<crate::dataplane::framing::Refusal>) {
    use crate::dataplane::framing::{Fed, Framer};
    let mut framer = Framer::default();
    let (mut held, mut passed) = (Vec::new(), 0);
    for chunk in data.chunks(step.max(1)) {
        held.extend_from_slice(chunk);
        match framer.feed(&held) {
            Fed::Pass(n) => {
                assert!(n <= held.len());
                passed += n;
                held.drain(..n);
            }
            Fed::Refuse { pass, refusal } => return (passed + pass, Some(refusal)),
        }
    }
    (passed, None)
}

/// The request framer (smuggling checks): the same verdict however the bytes are split across
/// reads, and never more bytes passed than received.
pub fn request_stream(data: &[u8]) {
    let whole = frame(data, data.len());
    let step = 1 + usize::from(data.first().copied().unwrap_or(0) % 13);
    assert_eq!(frame(data, step), whole, "split into {step}-byte reads");
}

/// The HTTP/1.1 server's head parse (`h1server`): it agrees with the framer's verdict on the
/// first request of `data`, and the request it builds says what the bytes say.
pub fn request_head(data: &[u8]) {
    use crate::dataplane::framing::{parse_head, skip_empty_lines, MAX_HEADERS};
    use crate::dataplane::h1server::take_head;
    let mut buf = bytes::BytesMut::from(data);
    let taken = take_head(&mut buf);
    let rest = &data[skip_empty_lines(data)..];
    let mut fields = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    match (parse_head(rest, &mut fields), taken) {
        (Err(a), Err(b)) => assert_eq!(a, b),
        (Ok(None), Ok(None)) => {}
        (Ok(Some((len, raw, framing))), Ok(Some((req, asks)))) => {
            assert_eq!(buf.len(), rest.len() - len, "the head's bytes, and only they, were taken");
            // The map groups a name's values together: each field is found under its name.
            assert_eq!(req.headers().len(), raw.headers.len());
            for h in raw.headers.iter() {
                let values = req.headers().get_all(h.name);
                assert!(values.iter().any(|v| v.as_bytes() == h.value), "{}: {:?}", h.name, h.value);
            }
            assert_eq!(req.method().as_str(), raw.method.unwrap_or_default());
            assert!(
                matches!(asks.framing, f if f == framing || framing == crate::dataplane::framing::BodyFraming::Length(0))
            );
        }
        // Beyond the framer's rules, the server refuses what `http` cannot represent.
        (Ok(Some(_)), Err(r)) => assert!(
            ["malformed method", "malformed request target"].contains(&r.reason)
                || r.reason.starts_with("malformed header name"),
            "{r:?}"
        ),
        (a, b) => panic!("framer {:?}, server {:?}", a.map(|h| h.map(|h| h.0)), b.map(|h| h.map(|h| h.1.framing))),
    }
    let step = 1 + usize::from(data.first().copied().unwrap_or(0) % 13);
    assert_eq!(server_reads(data, step), server_reads(data, data.len()), "split into {step}-byte reads");
}

/// What the server reads from `data` arriving in `step`-byte reads: each request (method,
/// target, body bytes) until the bytes end, or the first refusal or malformed body.
fn server_reads(data: &[u8], step: usize) -> Vec<String> {
    use crate::dataplane::framing::BodyFraming;
    use crate::dataplane::h1codec::{Chunked, Decoded};
    use crate::dataplane::h1server::take_head;
    enum Body {
        Head,
        Length(u64, Vec<u8>),
        Chunked(Chunked, Vec<u8>),
    }
    let mut out = Vec::new();
    let mut buf = bytes::BytesMut::new();
    let mut state = Body::Head;
    let mut chunks = data.chunks(step.max(1));
    loop {
        let progressed = match &mut state {
            Body::Head => match take_head(&mut buf) {
                Err(r) => {
                    out.push(format!("refused {}", r.reason));
                    return out;
                }
                Ok(None) => false,
                Ok(Some((req, asks))) => {
                    out.push(format!("{} {}", req.method(), req.uri()));
                    state = match asks.framing {
                        BodyFraming::Length(n) => Body::Length(n, Vec::new()),
                        BodyFraming::Chunked => Body::Chunked(Chunked::default(), Vec::new()),
                        // What follows an upgrade is another protocol.
                        BodyFraming::Upgrade => return out,
                        BodyFraming::None => Body::Head,
                    };
                    true
                }
            },
            Body::Length(left, got) => {
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                got.extend_from_slice(&buf.split_to(n));
                *left -= n as u64;
                if *left == 0 {
                    out.push(format!("body {:?}", String::from_utf8_lossy(got)));
                    state = Body::Head;
                }
                n > 0 || matches!(state, Body::Head)
            }
            Body::Chunked(decoder, got) => match decoder.decode(&mut buf) {
                Ok(Decoded::Data(d)) => {
                    got.extend_from_slice(&d);
                    true
                }
                Ok(Decoded::Done) => {
                    out.push(format!("body {:?}", String::from_utf8_lossy(got)));
                    state = Body::Head;
                    true
                }
                Ok(Decoded::NeedMore) => false,
                Err(e) => {
                    out.push(format!("malformed body: {}", e.0));
                    return out;
                }
            },
        };
        if !progressed {
            match chunks.next() {
                Some(c) => buf.extend_from_slice(c),
                None => return out,
            }
        }
    }
}

/// A head read as lines to send on (`h1codec::Lines`) says what the same head read into a map
/// says: the same framing and reuse, the same fields (less Content-Length, which the server
/// writes itself), the same refusals.
fn same_as_lines(data: &[u8]) {
    use crate::dataplane::h1codec::parse_response_with;
    let read = |as_lines| parse_response_with(&mut bytes::BytesMut::from(data), false, &mut Vec::new(), as_lines);
    let (map, lines) = (read(false), read(true));
    let (m, l) = match (map, lines) {
        (Ok(Some(m)), Ok(Some(l))) => (m, l),
        (m, l) => {
            assert_eq!(format!("{:?}", m.map(|h| h.is_some())), format!("{:?}", l.map(|h| h.is_some())));
            return;
        }
    };
    assert_eq!(
        format!("{:?}", (m.status, m.version, &m.body, m.keep_alive)),
        format!("{:?}", (l.status, l.version, &l.body, l.keep_alive))
    );
    assert!(m.lines.is_none());
    let Some(text) = &l.lines else {
        assert_eq!(m.headers, l.headers);
        return;
    };
    assert!(l.headers.is_empty());
    let mut from_map: Vec<Vec<u8>> = m
        .headers
        .iter()
        .filter(|(k, _)| *k != http::header::CONTENT_LENGTH)
        .map(|(k, v)| [k.as_str().as_bytes(), b": ", v.as_bytes()].concat())
        .collect();
    // Values of one name keep their order (the map's `get_all` order is the head's).
    for name in m.headers.keys() {
        let prefix = [name.as_str().as_bytes(), b": "].concat();
        let in_map: Vec<&[u8]> = m.headers.get_all(name).iter().map(http::HeaderValue::as_bytes).collect();
        let in_lines: Vec<&[u8]> = text
            .text
            .split(|b| *b == b'\n')
            .filter_map(|l| l.strip_prefix(&prefix[..]))
            .map(|v| v.strip_suffix(b"\r").unwrap_or(v))
            .collect();
        if *name != http::header::CONTENT_LENGTH {
            assert_eq!(in_map, in_lines, "{name}");
        }
    }
    let mut from_lines: Vec<Vec<u8>> = text
        .text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l).to_vec())
        .collect();
    from_map.sort();
    from_lines.sort();
    assert_eq!(from_map, from_lines);
    assert_eq!(text.dated, m.headers.contains_key(http::header::DATE));
}

/// Reads one upstream response from `data` fed in `step`-byte reads: the head's summary and
/// the body bytes, or the error; `None` when the bytes end first.
fn read_response(data: &[u8], step: usize) -> Option<Result<(String, Vec<u8>), String>> {
    use crate::dataplane::h1codec::{parse_response, BodyLen, Chunked, Decoded};
    let mut buf = bytes::BytesMut::new();
    let mut fed = 0;
    let mut feed = |buf: &mut bytes::BytesMut| {
        let end = (fed + step).min(data.len());
        buf.extend_from_slice(&data[fed..end]);
        let more = end > fed;
        fed = end;
        more
    };
    let head = loop {
        match parse_response(&mut buf, false) {
            Ok(Some(head)) => break head,
            Ok(None) => {
                if !feed(&mut buf) {
                    return None;
                }
            }
            Err(e) => return Some(Err(e.0)),
        }
    };
    for hop in ["connection", "transfer-encoding", "keep-alive", "upgrade", "te", "trailer"] {
        assert!(!head.headers.contains_key(hop), "hop-by-hop field {hop} reached the map");
    }
    let mut fields: Vec<String> = head.headers.iter().map(|(k, v)| format!("{k}: {v:?}")).collect();
    fields.sort();
    let summary = format!("{} {:?} {:?} {} {fields:?}", head.status, head.version, head.body, head.keep_alive);
    let mut body = Vec::new();
    match head.body {
        BodyLen::Empty => {}
        BodyLen::Length(n) => {
            while feed(&mut buf) {}
            let n = usize::try_from(n).unwrap_or(usize::MAX).min(buf.len());
            body.extend_from_slice(&buf[..n]);
        }
        BodyLen::ToEof => {
            while feed(&mut buf) {}
            body.extend_from_slice(&buf);
        }
        BodyLen::Chunked => {
            let mut dec = Chunked::default();
            loop {
                match dec.decode(&mut buf) {
                    Ok(Decoded::Data(d)) => body.extend_from_slice(&d),
                    Ok(Decoded::Done) => break,
                    Ok(Decoded::NeedMore) => {
                        if !feed(&mut buf) {
                            return None;
                        }
                    }
                    Err(e) => return Some(Err(e.0)),
                }
            }
        }
    }
    Some(Ok((summary, body)))
}

/// The upstream response reader (`dataplane::h1codec`): never panics, reads a head and a body
/// the same whether the bytes come at once or in small reads, and never yields more body than
/// there were bytes. Hop-by-hop fields never reach the header map.
pub fn upstream_response(data: &[u8]) {
    same_as_lines(data);
    let whole = read_response(data, data.len().max(1));
    let step = 1 + usize::from(data.first().copied().unwrap_or(0) % 13);
    assert_eq!(read_response(data, step), whole, "split into {step}-byte reads");
    if let Some(Ok((_, body))) = &whole {
        assert!(body.len() <= data.len());
    }
}

/// The ClientHello reader of TLS stream listeners: never panics, never reads past the first
/// record, gives the same answer for the bytes with anything appended, and a prefix of a hello
/// it reads never yields a different server name.
pub fn client_hello_sni(data: &[u8]) {
    use crate::stream::sni::{client_hello_sni, Hello};
    let whole = client_hello_sni(data);
    if let Hello::Sni(Some(name)) = &whole {
        assert!(name.len() <= 253 && !name.bytes().any(|b| b.is_ascii_uppercase()), "{name}");
    }
    if !matches!(whole, Hello::NeedMore) {
        let mut longer = data.to_vec();
        longer.extend_from_slice(b"\x16\x03\x01 trailing bytes");
        assert_eq!(client_hello_sni(&longer), whole, "bytes after the record changed the answer");
    }
    for cut in [data.len() / 2, data.len().saturating_sub(1)] {
        match client_hello_sni(&data[..cut]) {
            Hello::Sni(name) => assert_eq!(Hello::Sni(name), whole, "a prefix read differently"),
            Hello::NeedMore | Hello::NotTls => {}
        }
    }
}

/// The access log's formats over a request whose path, query and headers a client chose: each
/// line stays one line, its quoted fields cannot be closed early, and a JSON line parses. The
/// input's first line is a template (the operator's), the rest the client's parts.
pub fn access_log_line(data: &[u8]) {
    use crate::access_log::{format_line, Format};
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (template, client) = text.split_once('\n').unwrap_or((text, ""));
    let mut parts = client.splitn(4, '\n');
    let (path, query) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut headers = http::HeaderMap::new();
    for (name, v) in [("user-agent", parts.next()), ("referer", parts.next())] {
        if let Some(Ok(v)) = v.map(|v| http::HeaderValue::from_bytes(v.as_bytes())) {
            headers.insert(name, v);
        }
    }
    let addr = std::net::SocketAddr::from(([192, 0, 2, 1], 4000));
    let mut ctx = weir_plugin::RequestCtx::new(
        http::Method::GET,
        path.to_owned(),
        query.to_owned(),
        headers,
        addr,
        Arc::from("192.0.2.1"),
        addr,
    );
    ctx.status = 200;
    // The writer adds the newline: a line must contain none of its own.
    let one_line = |line: &str| assert!(!line.contains(['\n', '\r']), "{line:?}");
    let combined = format_line(&Format::Combined, &ctx);
    one_line(&combined);
    // Six quotes delimit the request, the referer and the user agent; a client's quote is escaped.
    assert_eq!(combined.matches('"').count(), 6, "{combined:?}");
    let json = format_line(&Format::Json, &ctx);
    one_line(&json);
    let parsed: Result<serde_json::Value, _> = serde_json::from_str(&json);
    assert!(parsed.is_ok(), "{json:?}");
    if let Ok(f) = Format::parse(template) {
        if !template.contains(|c: char| c.is_control()) {
            let line = format_line(&f, &ctx);
            one_line(&line);
            assert!(!line.contains(|c: char| c.is_control()), "{line:?}");
        }
    }
}

/// `$var` templates (`weir_plugin::template`): compiling any text either fails with a message or
/// gives a template whose pieces put back together are the text's meaning (every variable
/// known, no empty name), and rendering it never panics.
pub fn template(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(t) = weir_plugin::template::Template::compile(text) else { return };
    for p in t.pieces() {
        if let weir_plugin::template::Piece::Var(name) = p {
            assert!(!name.is_empty() && weir_plugin::template::is_known(name), "{name:?} from {text:?}");
        }
    }
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
    let ctx = weir_plugin::RequestCtx::new(
        http::Method::GET,
        "/p".into(),
        "a=1".into(),
        http::HeaderMap::new(),
        addr,
        std::sync::Arc::from("127.0.0.1"),
        addr,
    );
    let _ = t.render(&ctx);
}

/// The PROXY protocol header parser (v1 and v2): never panics, never reads past its input, and
/// a header it accepts is no longer than the bytes given, and names addresses of one family.
pub fn proxy_protocol(data: &[u8]) {
    if let Ok(Some(h)) = crate::proxy_protocol::parse(data) {
        assert!(h.len <= data.len() && h.len >= 15, "{h:?} from {} bytes", data.len());
        if let Some((src, dst)) = h.addrs {
            assert_eq!(src.is_ipv4(), dst.is_ipv4(), "{h:?}");
            if data.starts_with(b"PROXY ") {
                // What Weir writes for such a client reads back the same.
                let line = crate::proxy_protocol::v1_header(src, dst);
                let again = crate::proxy_protocol::parse(line.as_bytes());
                assert_eq!(again.ok().flatten().and_then(|h| h.addrs), Some((src, dst)));
            }
        }
    }
}
