//! Header handling of the proxy: hop-by-hop removal and `X-Forwarded-*`.

use http::header::{HeaderMap, HeaderName, HeaderValue};

use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING, UPGRADE};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// What a field is to the proxy, told by its name's bytes in any case: a length, then a
/// comparison without case (no `HeaderName` needed: the upstream response reader classifies raw
/// names with it, `h1codec`). The one list of hop-by-hop fields: RFC 9110 §7.6.1's, and
/// `proxy-connection`, a non-standard one clients still send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// `Connection`: hop-by-hop, and its tokens name more.
    Connection,
    /// `Transfer-Encoding`: hop-by-hop, and frames the body.
    TransferEncoding,
    /// One of the other hop-by-hop fields.
    HopByHop,
    /// `Content-Length`: end to end, and frames the body.
    ContentLength,
    /// Not hop-by-hop: a field the proxy sets on an answer by replacing the upstream's
    /// (`X-Weir-Upstream-Status` on a 5xx, `Alt-Svc` on ports that serve HTTP/3).
    SetByTheProxy,
}

impl FieldKind {
    /// The kind of the field named `name`, if it is one of these.
    pub fn of(name: &[u8]) -> Option<FieldKind> {
        let is = |s: &[u8]| name.eq_ignore_ascii_case(s);
        match name.len() {
            2 if is(b"te") => Some(FieldKind::HopByHop),
            7 if is(b"trailer") || is(b"upgrade") => Some(FieldKind::HopByHop),
            7 if is(b"alt-svc") => Some(FieldKind::SetByTheProxy),
            10 if is(b"connection") => Some(FieldKind::Connection),
            10 if is(b"keep-alive") => Some(FieldKind::HopByHop),
            14 if is(b"content-length") => Some(FieldKind::ContentLength),
            16 if is(b"proxy-connection") => Some(FieldKind::HopByHop),
            17 if is(b"transfer-encoding") => Some(FieldKind::TransferEncoding),
            18 if is(b"proxy-authenticate") => Some(FieldKind::HopByHop),
            19 if is(b"proxy-authorization") => Some(FieldKind::HopByHop),
            22 if is(b"x-weir-upstream-status") => Some(FieldKind::SetByTheProxy),
            _ => None,
        }
    }

    /// Whether a field of this kind is hop-by-hop.
    pub fn is_hop_by_hop(self) -> bool {
        matches!(self, FieldKind::Connection | FieldKind::TransferEncoding | FieldKind::HopByHop)
    }
}

/// Whether `name` is a hop-by-hop field ([`FieldKind`]).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    FieldKind::of(name.as_str().as_bytes()).is_some_and(FieldKind::is_hop_by_hop)
}

/// The size of one field as HTTP/1.1 text: `name: value` and CRLF.
pub fn line_len(name: &HeaderName, value: &HeaderValue) -> usize {
    name.as_str().len() + value.len() + 4
}

/// What the proxy reads of a request's fields before routing, found in one pass over them
/// rather than a lookup each (a lookup hashes the name and probes, even for a field that is not
/// there, which is most of them).
#[derive(Default)]
pub struct RequestFields {
    /// The first `Host`.
    pub host: Option<HeaderValue>,
    /// The first `Content-Length`, when it is a number.
    pub content_length: Option<u64>,
    /// A `Transfer-Encoding` was sent.
    pub transfer_encoding: bool,
    /// An `Upgrade` was sent.
    pub upgrade: bool,
    /// Some hop-by-hop field was sent ([`strip_hop_by_hop`] has work to do).
    pub hop_by_hop: bool,
    /// The fields' size as HTTP/1.1 text (`name: value` and CRLF each).
    pub bytes: usize,
    /// The longest field as an HTTP/1.1 line ([`line_len`]): HTTP/2 and HTTP/3 requests are
    /// held to the HTTP/1.1 framer's limit on it.
    pub longest: usize,
}

impl RequestFields {
    /// The facts of `headers`.
    pub fn of(headers: &HeaderMap) -> Self {
        let mut f = RequestFields::default();
        let mut length_seen = false;
        for (name, value) in headers {
            let len = line_len(name, value);
            f.bytes += len;
            f.longest = f.longest.max(len);
            if *name == HOST {
                if f.host.is_none() {
                    f.host = Some(value.clone());
                }
            } else if *name == CONTENT_LENGTH {
                if !length_seen {
                    length_seen = true;
                    f.content_length = value.to_str().ok().and_then(|v| v.parse().ok());
                }
            } else if is_hop_by_hop(name) {
                f.hop_by_hop = true;
                f.transfer_encoding |= *name == TRANSFER_ENCODING;
                f.upgrade |= *name == UPGRADE;
            }
        }
        f
    }
}

/// Removes hop-by-hop headers, including those named by `Connection`. One pass over the
/// headers when there is nothing to remove (the common case for requests); no allocation for
/// the common response (`Connection: keep-alive`).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    // Headers that Connection names are hop-by-hop too. One Connection line is read where it
    // lies once taken out; several are copied first (their tokens remove other headers).
    match headers.get_all(CONNECTION).iter().take(2).count() {
        0 => {}
        1 => {
            if let Some(v) = headers.remove(CONNECTION) {
                remove_named(headers, &v);
            }
        }
        _ => {
            let lines: Vec<HeaderValue> = headers.get_all(CONNECTION).iter().cloned().collect();
            headers.remove(CONNECTION);
            for v in &lines {
                remove_named(headers, v);
            }
        }
    }
    if headers.keys().any(is_hop_by_hop) {
        let hop: Vec<HeaderName> = headers.keys().filter(|k| is_hop_by_hop(k)).cloned().collect();
        for n in hop {
            headers.remove(n);
        }
    }
}

/// Removes the headers one `Connection` line names (a token that is no header name names none).
pub fn remove_named(headers: &mut HeaderMap, connection: &HeaderValue) {
    let Ok(tokens) = connection.to_str() else { return };
    for token in tokens.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        // Headers of the fixed list (keep-alive, upgrade, te: the usual tokens) go anyway.
        if FieldKind::of(token.as_bytes()).is_some_and(FieldKind::is_hop_by_hop) {
            continue;
        }
        headers.remove(token);
    }
}

/// The proxy headers of an upstream request (`X-Forwarded-For`, appended to the client's,
/// `X-Forwarded-Proto`, `X-Forwarded-Host`, `X-Forwarded-Port`, `X-Real-IP`), worked out once
/// per request and kept as bytes. An HTTP/1.1 upstream request writes them as it encodes its
/// head (the client's header map is not touched, and nothing is allocated unless the client sent
/// an `X-Forwarded-For`); HTTP/2 and tunnel requests get them in their map
/// ([`ProxyHeaders::apply`]).
pub struct ProxyHeaders<'a> {
    /// The X-Forwarded-For value, when the client sent one to append to.
    xff: Option<String>,
    ip: std::sync::Arc<str>,
    proto: &'static str,
    host: Option<&'a HeaderValue>,
    port: Decimal,
}

impl<'a> ProxyHeaders<'a> {
    /// The headers for a client at `client_ip`, on `scheme`, that sent `host`, to local `port`.
    pub fn new(
        headers: &HeaderMap,
        client_ip: &std::sync::Arc<str>,
        scheme: &str,
        host: Option<&'a HeaderValue>,
        port: u16,
    ) -> Self {
        let xff = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
            Some(prev) if !prev.is_empty() => Some(format!("{prev}, {client_ip}")),
            _ => None,
        };
        let proto = if scheme == "https" { "https" } else { "http" };
        ProxyHeaders { xff, ip: client_ip.clone(), proto, host, port: Decimal::new(u64::from(port)) }
    }

    fn xff(&self) -> &[u8] {
        self.xff.as_deref().unwrap_or(&self.ip).as_bytes()
    }

    /// The header lines, and the Host line when `host` replaces the client's. The array has
    /// room for [`LINES_ROOM`] more (the trace context).
    pub fn lines<'s>(&'s self, host: Option<&'s HeaderValue>) -> ([(&'static HeaderName, &'s [u8]); 8], usize) {
        let mut lines: [(&'static HeaderName, &'s [u8]); 8] = [
            (&X_FORWARDED_FOR, self.xff()),
            (&X_REAL_IP, self.ip.as_bytes()),
            (&X_FORWARDED_PROTO, self.proto.as_bytes()),
            (&X_FORWARDED_PORT, self.port.as_bytes()),
            (&X_FORWARDED_HOST, b""),
            (&HOST_NAME, b""),
            (&HOST_NAME, b""),
            (&HOST_NAME, b""),
        ];
        let mut n = 4;
        if let Some(h) = self.host {
            lines[n] = (&X_FORWARDED_HOST, h.as_bytes());
            n += 1;
        }
        if let Some(h) = host {
            lines[n] = (&HOST_NAME, h.as_bytes());
            n += 1;
        }
        (lines, n)
    }

    /// Sets them in `headers` (and the Host header to `host`, when given). Values that are not
    /// valid header values (none of these can be) are left out.
    pub fn apply(&self, headers: &mut HeaderMap, host: Option<&HeaderValue>) {
        let (lines, n) = self.lines(host);
        for (name, value) in &lines[..n] {
            if let Ok(v) = HeaderValue::from_bytes(value) {
                headers.insert(HeaderName::clone(name), v);
            }
        }
    }
}

static HOST_NAME: HeaderName = http::header::HOST;

/// Room [`ProxyHeaders::lines`] leaves after its own lines.
pub const LINES_ROOM: usize = 2;

/// `traceparent` and `tracestate`, as set lines of an upstream head.
pub static TRACEPARENT_NAME: HeaderName = weir_plugin::measure::TRACEPARENT;
pub static TRACESTATE_NAME: HeaderName = weir_plugin::measure::TRACESTATE;

pub use crate::decimal::Decimal;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hop_by_hop_and_connection_named() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("keep-alive, x-secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-keep"));
    }

    #[test]
    fn every_connection_line_counts_and_odd_tokens_are_harmless() {
        let mut h = HeaderMap::new();
        h.append("connection", HeaderValue::from_static("close"));
        h.append("connection", HeaderValue::from_static(" x-one ,, not a name, X-TWO"));
        h.insert("x-one", HeaderValue::from_static("1"));
        h.insert("x-two", HeaderValue::from_static("2"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-keep"]);
    }

    #[test]
    fn forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        let host = HeaderValue::from_static("ex.com");
        let proxy = ProxyHeaders::new(&h, &std::sync::Arc::from("2.2.2.2"), "http", Some(&host), 9080);
        let (lines, n) = proxy.lines(None);
        assert_eq!(n, 5);
        assert_eq!(lines[0], (&X_FORWARDED_FOR, &b"1.1.1.1, 2.2.2.2"[..]));
        assert_eq!(lines[3], (&X_FORWARDED_PORT, &b"9080"[..]));
        let alone = ProxyHeaders::new(&HeaderMap::new(), &std::sync::Arc::from("2.2.2.2"), "https", None, 0);
        let (lines, n) = alone.lines(None);
        assert_eq!(
            &lines[..n],
            [
                (&X_FORWARDED_FOR, &b"2.2.2.2"[..]),
                (&X_REAL_IP, &b"2.2.2.2"[..]),
                (&X_FORWARDED_PROTO, &b"https"[..]),
                (&X_FORWARDED_PORT, &b"0"[..]),
            ]
        );
        proxy.apply(&mut h, Some(&HeaderValue::from_static("node")));
        assert_eq!(h["host"], "node");
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2");
        assert_eq!(h["x-real-ip"], "2.2.2.2");
        assert_eq!(h["x-forwarded-host"], "ex.com");
        assert_eq!(h["x-forwarded-port"], "9080");
    }
}
