//! A request head, parsed once by the framer's [`parse_head`], turned into the request the
//! proxy handles: the target and every field value are slices of the bytes read, not copies.

use bytes::{Buf, BytesMut};
use http::header::{HeaderMap, HeaderName};
use http::{Method, Uri, Version};

use super::super::framing::{parse_head, skip_empty_lines, BodyFraming, Refusal, MAX_HEADERS};
use super::super::h1codec::field_value;

/// Fields a request's map has room for beyond the client's own (plugins add a few: request
/// ids, forwarded headers); growing the map rehashes every field.
const ROOM_FOR_PLUGINS: usize = 4;

/// What a request head asks of its connection.
#[derive(Debug, Clone, Copy)]
pub struct Asks {
    /// How its body is framed.
    pub framing: BodyFraming,
    /// Whether the connection may carry another request after it (HTTP/1.1 unless
    /// `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`; never after CONNECT).
    pub keep_alive: bool,
    /// HTTP/1.0: a keep-alive answer says `Connection: keep-alive`.
    pub http10: bool,
    /// `Expect: 100-continue`: the client waits for a `100 Continue` before it sends the body.
    pub expect_continue: bool,
    /// `TE: trailers`: the client accepts trailer fields after a chunked body.
    pub trailers: bool,
    /// A HEAD request: the answer has no body.
    pub head: bool,
}

/// Takes the request head at the front of `buf` (empty lines before it are dropped).
/// `Ok(None)` while it is incomplete; a refusal says why the head, or its framing, is not served.
pub fn take_head(buf: &mut BytesMut) -> Result<Option<(http::Request<()>, Asks)>, Refusal> {
    let skip = skip_empty_lines(buf);
    if skip > 0 {
        buf.advance(skip);
    }
    if buf.is_empty() {
        return Ok(None);
    }
    // Offsets of the target and of each field, taken before the buffer is split: the values
    // become slices of the frozen head.
    let mut spans = [const { std::mem::MaybeUninit::<[u32; 4]>::uninit() }; MAX_HEADERS];
    let mut fields = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    let base = buf.as_ptr() as usize;
    let offset = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
    let (len, method, target, version, count, mut asks) = {
        let Some((len, req, framing)) = parse_head(buf, &mut fields)? else { return Ok(None) };
        let method = req.method.unwrap_or_default();
        let method = Method::from_bytes(method.as_bytes()).map_err(|_| Refusal::bad("malformed method"))?;
        let path = req.path.unwrap_or_default().as_bytes();
        let target = (offset(path), offset(path) + path.len() as u32);
        let version = if req.version == Some(0) { Version::HTTP_10 } else { Version::HTTP_11 };
        let (mut close, mut keep_alive, mut expect_continue, mut trailers) = (false, false, false, false);
        for (span, h) in spans.iter_mut().zip(req.headers.iter()) {
            let name = offset(h.name.as_bytes());
            let value = offset(h.value);
            span.write([name, name + h.name.len() as u32, value, value + h.value.len() as u32]);
            if h.name.eq_ignore_ascii_case("connection") {
                for token in tokens(h.value) {
                    close |= token.eq_ignore_ascii_case(b"close");
                    keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            } else if h.name.eq_ignore_ascii_case("expect") {
                expect_continue |= h.value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
            } else if h.name.eq_ignore_ascii_case("te") {
                trailers |= tokens(h.value).any(|t| t.eq_ignore_ascii_case(b"trailers"));
            }
        }
        let http10 = version == Version::HTTP_10;
        let asks = Asks {
            framing,
            keep_alive: !close && (!http10 || keep_alive) && method != Method::CONNECT,
            http10,
            expect_continue: expect_continue && !http10,
            trailers,
            head: method == Method::HEAD,
        };
        (len, method, target, version, req.headers.len(), asks)
    };
    let bytes = buf.split_to(len).freeze();
    let uri = Uri::from_maybe_shared(bytes.slice(target.0 as usize..target.1 as usize))
        .map_err(|_| Refusal::bad("malformed request target"))?;
    let mut headers = HeaderMap::with_capacity(count + ROOM_FOR_PLUGINS);
    for span in &spans[..count] {
        // SAFETY: the loop above wrote the first `count` spans, one per field.
        #[allow(unsafe_code)]
        let [ns, ne, vs, ve] = unsafe { span.assume_init() };
        let name = HeaderName::from_bytes(&bytes[ns as usize..ne as usize])
            .map_err(|_| Refusal::bad("malformed header name (no whitespace before the colon, no obs-fold)"))?;
        headers.append(name, field_value(bytes.slice(vs as usize..ve as usize)));
    }
    if asks.framing == BodyFraming::Length(0) {
        asks.framing = BodyFraming::None;
    }
    let mut req = http::Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = version;
    *req.headers_mut() = headers;
    Ok(Some((req, asks)))
}

/// The members of a comma-separated field value, trimmed.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|b| *b == b',').map(<[u8]>::trim_ascii)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(s: &str) -> Result<Option<(http::Request<()>, Asks)>, Refusal> {
        take_head(&mut BytesMut::from(s))
    }

    #[test]
    fn a_head_becomes_a_request_and_says_what_it_asks() {
        let mut buf = BytesMut::from(
            "\r\nPOST /a?b=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\nTE: trailers\r\nX-A: 1\r\nX-A: 2\r\n\r\nabcGET",
        );
        let (req, asks) = take_head(&mut buf).expect("valid").expect("complete");
        assert_eq!(&buf[..], b"abcGET");
        assert_eq!(req.method(), Method::POST);
        assert_eq!(req.uri().path(), "/a");
        assert_eq!(req.uri().query(), Some("b=1"));
        assert_eq!(req.headers().get_all("x-a").iter().count(), 2);
        assert_eq!(asks.framing, BodyFraming::Length(3));
        assert!(asks.keep_alive && asks.expect_continue && asks.trailers && !asks.http10 && !asks.head);
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection() {
        let ka = |s: &str| take(s).expect("valid").expect("complete").1.keep_alive;
        assert!(ka("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(!ka("GET / HTTP/1.1\r\nHost: x\r\nConnection: foo, Close\r\n\r\n"));
        assert!(!ka("GET / HTTP/1.0\r\n\r\n"));
        assert!(ka("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
        assert!(!ka("CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n"));
    }

    #[test]
    fn incomplete_heads_wait_and_bad_ones_are_refused() {
        assert!(take("GET / HTTP/1.1\r\nHost: x\r\n").expect("valid so far").is_none());
        assert!(take("\r\n\r\n").expect("only empty lines").is_none());
        assert_eq!(take("GET / HTTP/1.1\r\n\r\n").map(|_| ()).map_err(|r| r.status), Err(400));
        assert!(take("GET http://[::1 HTTP/1.1\r\nHost: x\r\n\r\n").is_err());
        assert!(take("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n").is_err());
    }
}
