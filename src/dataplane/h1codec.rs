//! HTTP/1.1 towards upstreams, as bytes (RFC 9112): the request head Weir writes, the response
//! head it reads, and the chunked body decoder. No IO here: `upstream_conn` drives it, and the
//! `upstream_response` fuzz target runs it over arbitrary bytes.
//!
//! Reading is strict where a lenient reader could be made to disagree with the client about
//! where a response ends: line ends are CRLF, chunk sizes are bounded hex, Content-Length
//! values must agree, and a response that is framed by both Transfer-Encoding and
//! Content-Length is read as chunked and its connection is not reused.
#![allow(unsafe_code)] // each block says why it is sound (SAFETY)

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{Method, StatusCode, Version};

use super::headers::{is_hop_by_hop, remove_named, Decimal, FieldKind};

/// Fields a response head's map has room for beyond the upstream's own.
const ROOM_FOR_PLUGINS: usize = 4;

/// Longest response head read (status line and header fields), as nginx's larger
/// `proxy_buffer_size` settings allow; longer is a 502.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in a response head.
pub const MAX_HEADERS: usize = 100;
/// Longest chunk-size line, and most trailer bytes, of a chunked body.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 64 * 1024;

/// How the request body is framed on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestBody {
    /// No body (`content-length: 0` when the client sent one).
    None,
    /// `content-length: n`.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
}

/// Writes the request head into `out` (cleared first). Fields of `headers` named in `set` are
/// replaced by `set`'s lines; framing fields are replaced by what `body` says, so that the
/// upstream reads exactly the body Weir sends.
pub fn encode_request(
    out: &mut Vec<u8>,
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    set: &[(&HeaderName, &[u8])],
    body: RequestBody,
) {
    out.clear();
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut had_length = false;
    for (name, value) in headers {
        if name == CONTENT_LENGTH {
            had_length = true;
            continue;
        }
        if name == TRANSFER_ENCODING || set.iter().any(|(n, _)| *n == name) {
            continue;
        }
        push_field(out, name, value.as_bytes());
    }
    for (name, value) in set {
        // An empty value: the field is removed, not written.
        if !value.is_empty() {
            push_field(out, name, value);
        }
    }
    match body {
        RequestBody::None if had_length => out.extend_from_slice(b"content-length: 0\r\n"),
        RequestBody::None => {}
        RequestBody::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            push_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        RequestBody::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes the field `name: value` and its CRLF.
pub(super) fn push_field(out: &mut Vec<u8>, name: &HeaderName, value: &[u8]) {
    let name = name.as_str().as_bytes();
    let (n, v) = (name.len(), value.len());
    // (Saturating: a length past the address space makes `reserve` panic, never a short room.)
    let total = n.saturating_add(v).saturating_add(4);
    out.reserve(total);
    // One room check for the four pieces (every field of every head goes through here).
    // SAFETY: `reserve` left room for `total` bytes after the length; the four writes fill
    // exactly those bytes (name, ": ", value, CRLF), and only then does the length cover them.
    unsafe {
        let at = out.as_mut_ptr().add(out.len());
        std::ptr::copy_nonoverlapping(name.as_ptr(), at, n);
        at.add(n).cast::<[u8; 2]>().write_unaligned(*b": ");
        std::ptr::copy_nonoverlapping(value.as_ptr(), at.add(n + 2), v);
        at.add(n + 2 + v).cast::<[u8; 2]>().write_unaligned(*b"\r\n");
        out.set_len(out.len() + total);
    }
}

fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(Decimal::new(n).as_bytes());
}

/// The size line that starts a chunk of `len` bytes.
pub fn chunk_line(len: usize) -> ChunkLine {
    let mut bytes = [0u8; 18];
    let mut n = len as u64;
    let mut i = 16;
    loop {
        i -= 1;
        bytes[i] = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    bytes[16] = b'\r';
    bytes[17] = b'\n';
    ChunkLine { bytes, start: i }
}

/// A chunk-size line (at most 16 hex digits and CRLF).
pub struct ChunkLine {
    bytes: [u8; 18],
    start: usize,
}

impl ChunkLine {
    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[self.start..]
    }
}

/// How the response body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyLen {
    /// No body (HEAD, 1xx, 204, 304, or a zero length).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked.
    Chunked,
    /// Until the upstream closes the connection.
    ToEof,
}

/// A response head.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: BodyLen,
    /// The connection may carry another request once the body has been read.
    pub keep_alive: bool,
    /// The fields as lines to send on, when they were asked for that way (`headers` is then
    /// empty).
    pub lines: Option<Lines>,
}

/// Why a response could not be read.
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed(pub String);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn malformed(what: impl Into<String>) -> Malformed {
    Malformed(what.into())
}

/// Reads a response head from the front of `buf` and removes it (and any interim 1xx
/// responses before it). `None`: more bytes are needed. `head_request`: the request was HEAD,
/// so the response has no body whatever its headers say.
pub fn parse_response(buf: &mut BytesMut, head_request: bool) -> Result<Option<ResponseHead>, Malformed> {
    parse_response_with(buf, head_request, &mut Vec::new(), false)
}

/// [`parse_response`] with a scratch vector kept by the caller (no allocation per response).
///
/// `as_lines`: the fields are wanted as the lines to send on ([`ResponseHead::lines`]) rather
/// than in a map, when no plugin reads them and the client is HTTP/1.1 (`proxy::forward`
/// decides). A bodiless answer (204, 304), and one whose `Connection` names other fields, still
/// comes with a map.
pub fn parse_response_with(
    buf: &mut BytesMut,
    head_request: bool,
    spans: &mut Vec<[usize; 4]>,
    as_lines: bool,
) -> Result<Option<ResponseHead>, Malformed> {
    let config = httparse::ParserConfig::default();
    loop {
        let mut fields = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let len = match config.parse_response_with_uninit_headers(&mut resp, buf, &mut fields) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(malformed(format!("response head longer than {MAX_HEAD} bytes")))
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(malformed(format!("more than {MAX_HEADERS} response header fields")))
            }
            Err(e) => return Err(malformed(format!("invalid response head: {e}"))),
        };
        if len > MAX_HEAD {
            return Err(malformed(format!("response head longer than {MAX_HEAD} bytes")));
        }
        let code = resp.code.unwrap_or(0);
        let status = StatusCode::from_u16(code).map_err(|_| malformed(format!("invalid status {code}")))?;
        if status.is_informational() {
            if status == StatusCode::SWITCHING_PROTOCOLS {
                return Err(malformed("101 Switching Protocols to a request that did not ask for it"));
            }
            // 100 Continue, 103 Early Hints: interim, skipped (as nginx does).
            let _ = buf.split_to(len);
            continue;
        }
        let version = if resp.version == Some(0) { Version::HTTP_10 } else { Version::HTTP_11 };
        // Offsets of each field, taken before the buffer is split: values are slices of it.
        let base = buf.as_ptr() as usize;
        spans.clear();
        spans.extend(resp.headers.iter().map(|h| {
            let name = h.name.as_ptr() as usize - base;
            let value = h.value.as_ptr() as usize - base;
            [name, name + h.name.len(), value, value + h.value.len()]
        }));
        let bytes = buf.split_to(len).freeze();
        let bodiless = status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
        if as_lines && !head_request && !bodiless {
            let mut fields = Fields::default();
            if let Some(lines) = fields_as_lines(&bytes, spans, &mut fields)? {
                let mut head = framing(status, version, HeaderMap::new(), fields, head_request);
                head.lines = Some(lines);
                return Ok(Some(head));
            }
        }
        let mut fields = Fields::default();
        // Room for the few fields plugins add (quota headers, request ids, CORS): growing the
        // map rehashes every field, about 300 instructions a response.
        let mut headers = HeaderMap::with_capacity(spans.len() + ROOM_FOR_PLUGINS);
        for &[ns, ne, vs, ve] in spans.iter() {
            let name = HeaderName::from_bytes(&bytes[ns..ne])
                .map_err(|_| malformed(format!("invalid header name {:?}", String::from_utf8_lossy(&bytes[ns..ne]))))?;
            let value = field_value(bytes.slice(vs..ve));
            // Hop-by-hop fields are read here and never reach the map (the client gets its own).
            if name == CONNECTION {
                if fields.connection(value.as_bytes()) {
                    fields.named.push(value);
                }
            } else if name == TRANSFER_ENCODING {
                fields.transfer_encoding = Some(value);
            } else if name == CONTENT_LENGTH {
                fields.content_length(value.as_bytes())?;
                headers.append(name, value);
            } else if !is_hop_by_hop(&name) {
                headers.append(name, value);
            }
        }
        for line in &fields.named {
            remove_named(&mut headers, line);
        }
        return Ok(Some(framing(status, version, headers, fields, head_request)));
    }
}

/// A response's fields as the HTTP/1.1 lines to send on, without a map (see
/// [`ResponseHead::lines`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Lines {
    /// `name: value` and CRLF per field, names in lower case; the framing and hop-by-hop
    /// fields left out (the server writes its own).
    pub text: Vec<u8>,
    /// A `Date` is among them.
    pub dated: bool,
}

/// The fields of a head as lines to send on, with what its framing fields say in `fields`.
/// `None` when a `Connection` names other fields (they must go too), or a field is one the
/// proxy replaces ([`FieldKind::SetByTheProxy`]): the map does either.
fn fields_as_lines(bytes: &Bytes, spans: &[[usize; 4]], fields: &mut Fields) -> Result<Option<Lines>, Malformed> {
    let mut lines = Lines { text: Vec::with_capacity(bytes.len()), dated: false };
    for &[ns, ne, vs, ve] in spans {
        let (name, value) = (&bytes[ns..ne], &bytes[vs..ve]);
        // httparse takes a name of token characters only, which is what `HeaderName` takes.
        debug_assert!(HeaderName::from_bytes(name).is_ok(), "{name:?}");
        debug_assert!(value.iter().all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f)));
        match FieldKind::of(name) {
            Some(FieldKind::Connection) => {
                if fields.connection(value) {
                    return Ok(None);
                }
            }
            Some(FieldKind::TransferEncoding) => fields.transfer_encoding = Some(field_value(bytes.slice(vs..ve))),
            Some(FieldKind::ContentLength) => fields.content_length(value)?,
            Some(FieldKind::HopByHop) => {}
            Some(FieldKind::SetByTheProxy) => return Ok(None),
            None => {
                lines.dated |= name.eq_ignore_ascii_case(b"date");
                let text = &mut lines.text;
                text.reserve(name.len() + value.len() + 4);
                text.extend(name.iter().map(u8::to_ascii_lowercase));
                text.extend_from_slice(b": ");
                text.extend_from_slice(value);
                text.extend_from_slice(b"\r\n");
            }
        }
    }
    Ok(Some(lines))
}

/// A header value httparse accepted, as a slice of the head's bytes.
pub(super) fn field_value(bytes: Bytes) -> HeaderValue {
    debug_assert!(bytes.iter().all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f)));
    // SAFETY: httparse accepts in a header value exactly the bytes `HeaderValue` allows (HTAB,
    // SP, VCHAR, obs-text: `\t | 0x20..=0x7e | 0x80..=0xff`, its HEADER_VALUE_MAP), so the
    // check `from_maybe_shared` would make again cannot fail. The fuzz target
    // `upstream_response` runs the debug assertion above on arbitrary heads.
    unsafe { HeaderValue::from_maybe_shared_unchecked(bytes) }
}

/// What the framing fields of a response head say.
#[derive(Default)]
struct Fields {
    close: bool,
    keep_alive: bool,
    /// Connection lines that name other fields (removed as hop-by-hop).
    named: Vec<HeaderValue>,
    /// The last Transfer-Encoding line.
    transfer_encoding: Option<HeaderValue>,
    content_length: Option<u64>,
}

impl Fields {
    /// Reads a Connection line; whether it names other fields (which are hop-by-hop then).
    fn connection(&mut self, value: &[u8]) -> bool {
        let mut names_others = false;
        for token in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
            if token.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if token.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive = true;
            } else if !token.is_empty() {
                names_others = true;
            }
        }
        names_others
    }

    /// Every line and list member of Content-Length must be the same number.
    fn content_length(&mut self, value: &[u8]) -> Result<(), Malformed> {
        for member in value.split(|b| *b == b',') {
            let digits = member.trim_ascii();
            if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
                return Err(malformed("invalid Content-Length"));
            }
            let n = digits.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            if self.content_length.is_some_and(|f| f != n) {
                return Err(malformed("conflicting Content-Length values"));
            }
            self.content_length = Some(n);
        }
        Ok(())
    }
}

/// The body length and reuse of a response (RFC 9112 §6.3).
fn framing(
    status: StatusCode,
    version: Version,
    mut headers: HeaderMap,
    fields: Fields,
    head_request: bool,
) -> ResponseHead {
    let mut keep_alive = if version == Version::HTTP_11 { !fields.close } else { fields.keep_alive && !fields.close };
    let bodiless = head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    let body = if bodiless {
        BodyLen::Empty
    } else if let Some(te) = &fields.transfer_encoding {
        // Transfer-Encoding overrides Content-Length, which goes: the client must not see a length
        // that disagrees with what it gets. The connection is not reused after such a response.
        // (A head read as lines has no map; its length was read all the same.)
        if headers.remove(CONTENT_LENGTH).is_some() || fields.content_length.is_some() {
            keep_alive = false;
        }
        let last_coding = te.as_bytes().rsplit(|b| *b == b',').next().unwrap_or(b"").trim_ascii();
        if version == Version::HTTP_11 && last_coding.eq_ignore_ascii_case(b"chunked") {
            BodyLen::Chunked
        } else {
            keep_alive = false;
            BodyLen::ToEof
        }
    } else {
        match fields.content_length {
            Some(0) => BodyLen::Empty,
            Some(len) => BodyLen::Length(len),
            None => {
                keep_alive = false;
                BodyLen::ToEof
            }
        }
    };
    ResponseHead { status, version, headers, body, keep_alive, lines: None }
}

/// Where a chunked body's decoder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChunkState {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk, with this many bytes left.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: trailer fields, `seen` bytes of them so far, then an empty line.
    Trailers(usize),
    /// The body ended.
    Done,
}

/// What the decoder produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The buffer ends inside the framing: read more.
    NeedMore,
    /// The body ended (trailers are read and dropped).
    Done,
}

/// A chunked body decoder that hands out the chunks' data as slices of the read buffer.
#[derive(Debug)]
pub struct Chunked {
    state: ChunkState,
    /// Trailer fields read so far (boxed: rare, and the decoder lives in every chunked body).
    trailers: Option<Box<HeaderMap>>,
}

impl Default for Chunked {
    fn default() -> Self {
        Chunked { state: ChunkState::Size, trailers: None }
    }
}

/// One trailer field line (`name: value`); `None` for a field that is not passed on (hop-by-hop
/// or framing fields, which mean nothing after the body).
fn trailer_field(line: &[u8]) -> Result<Option<(HeaderName, HeaderValue)>, Malformed> {
    let invalid = || malformed("chunked body: invalid trailer field");
    let colon = line.iter().position(|b| *b == b':').ok_or_else(invalid)?;
    let name = HeaderName::from_bytes(&line[..colon]).map_err(|_| invalid())?;
    let value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii()).map_err(|_| invalid())?;
    if is_hop_by_hop(&name) || name == CONTENT_LENGTH {
        return Ok(None);
    }
    Ok(Some((name, value)))
}

/// The next line of `buf` without its CRLF, and the length to consume; `None` when the line is
/// not complete yet. A bare LF is refused.
fn line(buf: &[u8], limit: usize) -> Result<Option<(&[u8], usize)>, Malformed> {
    match buf.iter().position(|b| *b == b'\n') {
        Some(i) => match buf[..i].strip_suffix(b"\r") {
            Some(l) => Ok(Some((l, i + 1))),
            None => Err(malformed("chunked body: line not ended by CRLF")),
        },
        None if buf.len() > limit => Err(malformed("chunked body: line too long")),
        None => Ok(None),
    }
}

impl Chunked {
    /// Decodes from the front of `buf`, removing what it used.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, Malformed> {
        loop {
            match self.state {
                ChunkState::Done => return Ok(Decoded::Done),
                ChunkState::Size => {
                    let Some((l, used)) = line(buf, MAX_CHUNK_LINE)? else { return Ok(Decoded::NeedMore) };
                    // chunk-size [ BWS ";" extensions ]: the extensions are ignored.
                    let size_part = match l.iter().position(|b| *b == b';') {
                        Some(i) => l[..i].trim_ascii_end(),
                        None => l,
                    };
                    if size_part.is_empty() || size_part.len() > 16 || !size_part.iter().all(u8::is_ascii_hexdigit) {
                        return Err(malformed("chunked body: invalid chunk size"));
                    }
                    let size = size_part.iter().fold(0u64, |n, d| {
                        let v = match d {
                            b'0'..=b'9' => d - b'0',
                            b'a'..=b'f' => d - b'a' + 10,
                            _ => d - b'A' + 10,
                        };
                        (n << 4) | u64::from(v)
                    });
                    let _ = buf.split_to(used);
                    self.state = if size == 0 { ChunkState::Trailers(0) } else { ChunkState::Data(size) };
                }
                ChunkState::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(n).freeze();
                    let left = left - n as u64;
                    self.state = if left == 0 { ChunkState::DataEnd } else { ChunkState::Data(left) };
                    return Ok(Decoded::Data(data));
                }
                ChunkState::DataEnd => {
                    if buf.len() < 2 {
                        if buf.first().is_some_and(|b| *b != b'\r') {
                            return Err(malformed("chunked body: chunk data not followed by CRLF"));
                        }
                        return Ok(Decoded::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(malformed("chunked body: chunk data not followed by CRLF"));
                    }
                    let _ = buf.split_to(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers(seen) => {
                    let Some((l, used)) = line(buf, MAX_TRAILERS.saturating_sub(seen))? else {
                        return Ok(Decoded::NeedMore);
                    };
                    if l.is_empty() {
                        let _ = buf.split_to(used);
                        self.state = ChunkState::Done;
                        continue;
                    }
                    if seen + used > MAX_TRAILERS {
                        return Err(malformed("chunked body: trailers too long"));
                    }
                    if let Some((name, value)) = trailer_field(l)? {
                        self.trailers.get_or_insert_with(Box::default).append(name, value);
                    }
                    let _ = buf.split_to(used);
                    self.state = ChunkState::Trailers(seen + used);
                }
            }
        }
    }

    /// The trailer fields, once the body has ended (at most once).
    pub fn take_trailers(&mut self) -> Option<HeaderMap> {
        self.trailers.take().map(|t| *t)
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, head: bool) -> Result<Option<ResponseHead>, Malformed> {
        parse_response(&mut BytesMut::from(text), head)
    }

    #[test]
    fn request_framing_replaces_the_clients() {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("a"));
        h.insert("content-length", HeaderValue::from_static("99"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        let mut out = Vec::new();
        encode_request(&mut out, &Method::POST, "/x?y", &h, &[], RequestBody::Length(12));
        assert_eq!(out, b"POST /x?y HTTP/1.1\r\nhost: a\r\ncontent-length: 12\r\n\r\n");
        encode_request(&mut out, &Method::POST, "/", &h, &[], RequestBody::Chunked);
        assert_eq!(out, b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n");
        encode_request(&mut out, &Method::POST, "/", &h, &[], RequestBody::None);
        assert_eq!(out, b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 0\r\n\r\n");
        h.remove("content-length");
        h.append("x-f", HeaderValue::from_static("1"));
        h.append("x-f", HeaderValue::from_static("2"));
        let xf = HeaderName::from_static("x-f");
        encode_request(&mut out, &Method::GET, "/", &h, &[(&xf, b"3"), (&http::header::HOST, b"b")], RequestBody::None);
        assert_eq!(out, b"GET / HTTP/1.1\r\nx-f: 3\r\nhost: b\r\n\r\n");
        assert_eq!(chunk_line(0x1a2b).as_bytes(), b"1a2b\r\n");
    }

    fn as_lines(text: &str) -> ResponseHead {
        let mut buf = BytesMut::from(text);
        parse_response_with(&mut buf, false, &mut Vec::new(), true).expect("valid").expect("complete")
    }

    #[test]
    fn a_head_read_as_lines_keeps_the_fields_to_send_on_and_frames_the_same() {
        let head = as_lines(
            "HTTP/1.1 200 OK\r\nServer: up\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\
             Keep-Alive: timeout=5\r\nDate: then\r\nX-Two:  a b \r\nTE: x\r\n\r\nabc",
        );
        assert_eq!((head.status, head.body, head.keep_alive), (StatusCode::OK, BodyLen::Length(3), true));
        assert!(head.headers.is_empty());
        let lines = head.lines.expect("read as lines");
        assert_eq!(String::from_utf8_lossy(&lines.text), "server: up\r\ndate: then\r\nx-two: a b\r\n");
        assert!(lines.dated);
        // Framed by both: chunked, and the connection is not reused (as with a map).
        let head = as_lines("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!((head.body, head.keep_alive), (BodyLen::Chunked, false));
        assert_eq!(head.lines.map(|l| l.text), Some(Vec::new()));
        // A Connection that names other fields, and bodiless answers, come with a map.
        let head =
            as_lines("HTTP/1.1 200 OK\r\nConnection: x-hop\r\nX-Hop: 1\r\nX-End: 2\r\nContent-Length: 0\r\n\r\n");
        assert!(head.lines.is_none());
        assert!(!head.headers.contains_key("x-hop") && head.headers.contains_key("x-end"));
        assert!(as_lines("HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n").lines.is_none());
        // So does a field the proxy replaces: the upstream cannot add a second one.
        let head = as_lines("HTTP/1.1 502 Bad Gateway\r\nX-Weir-Upstream-Status: 200\r\nContent-Length: 0\r\n\r\n");
        assert!(head.lines.is_none() && head.headers.contains_key("x-weir-upstream-status"));
        // Conflicting lengths are refused either way.
        let mut buf = BytesMut::from("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n");
        assert!(parse_response_with(&mut buf, false, &mut Vec::new(), true).is_err());
    }

    #[test]
    fn hop_fields_by_their_bytes_are_the_hop_by_hop_list() {
        for name in [
            "connection",
            "keep-alive",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "proxy-connection",
            "content-length",
            "date",
            "content-type",
            "x-te",
            "trailers",
            "upgrades",
            "alt-svc",
            "x-weir-upstream-status",
        ] {
            let header = HeaderName::from_static(name);
            let hop = is_hop_by_hop(&header) || header == CONTENT_LENGTH;
            let told = |n: &str| FieldKind::of(n.as_bytes()).is_some_and(|f| f != FieldKind::SetByTheProxy);
            assert_eq!(told(name), hop, "{name}");
            assert_eq!(told(&name.to_ascii_uppercase()), hop, "{name}");
        }
    }

    #[test]
    fn response_framing() {
        let mut buf =
            BytesMut::from("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\nX: y\r\n\r\nabc");
        let head = parse_response(&mut buf, false).expect("valid").expect("complete");
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.body, BodyLen::Length(3));
        assert!(head.keep_alive);
        assert_eq!(head.headers["x"], "y");
        assert_eq!(&buf[..], b"abc");
        // Hop-by-hop fields, and those Connection names, never reach the map.
        let head = parse(
            "HTTP/1.1 200 OK\r\nConnection: keep-alive, x-private\r\nKeep-Alive: timeout=5\r\nX-Private: 1\r\n\
             Upgrade: h2c\r\nX-Kept: 1\r\nContent-Length: 0\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        let mut kept = head.headers.keys().map(HeaderName::as_str).collect::<Vec<_>>();
        kept.sort_unstable();
        assert_eq!(kept, ["content-length", "x-kept"]);

        assert!(parse("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n", false).expect("partial").is_none());
        let head = parse("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", true).expect("ok").expect("complete");
        assert_eq!(head.body, BodyLen::Empty);
        let head = parse("HTTP/1.1 304 Not Modified\r\nContent-Length: 3\r\n\r\n", false).unwrap().unwrap();
        assert_eq!(head.body, BodyLen::Empty);
        let head = parse("HTTP/1.1 200 OK\r\n\r\n", false).unwrap().unwrap();
        assert_eq!((head.body, head.keep_alive), (BodyLen::ToEof, false));
        let head = parse("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", false).unwrap().unwrap();
        assert!(!head.keep_alive);
        let head =
            parse("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\n", false).unwrap().unwrap();
        assert!(head.keep_alive);
        let head = parse("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n", false).unwrap().unwrap();
        assert!(!head.keep_alive);
        // Both framings: chunked wins, the length goes, the connection is not reused.
        let head = parse("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", false)
            .unwrap()
            .unwrap();
        assert_eq!((head.body, head.keep_alive), (BodyLen::Chunked, false));
        assert!(!head.headers.contains_key("content-length"));
        let head = parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false).unwrap().unwrap();
        assert_eq!(head.body, BodyLen::ToEof);
        let head =
            parse("HTTP/1.1 200 OK\r\nContent-Length: 4, 4\r\nContent-Length: 4\r\n\r\n", false).unwrap().unwrap();
        assert_eq!(head.body, BodyLen::Length(4));
    }

    #[test]
    fn malformed_responses_are_refused() {
        for bad in [
            "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX: a\u{1}b\r\n\r\n",
        ] {
            assert!(parse(bad, false).is_err(), "{bad:?}");
        }
        let long = format!("HTTP/1.1 200 OK\r\nX: {}", "a".repeat(MAX_HEAD));
        assert!(parse(&long, false).is_err());
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x{i}: y\r\n")).collect();
        assert!(parse(&format!("HTTP/1.1 200 OK\r\n{many}\r\n"), false).is_err());
    }

    fn dechunk(input: &[u8], step: usize) -> Result<Vec<u8>, Malformed> {
        let mut dec = Chunked::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut fed = 0;
        loop {
            match dec.decode(&mut buf)? {
                Decoded::Data(d) => out.extend_from_slice(&d),
                Decoded::Done => return Ok(out),
                Decoded::NeedMore if fed < input.len() => {
                    let end = (fed + step).min(input.len());
                    buf.extend_from_slice(&input[fed..end]);
                    fed = end;
                }
                Decoded::NeedMore => return Err(malformed("cut short")),
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_read_sizes() {
        let body = b"5\r\nhello\r\nA;ext=1\r\n0123456789\r\n0\r\nx-t: 1\r\n\r\n";
        for step in [1, 2, 3, 7, body.len()] {
            assert_eq!(dechunk(body, step).expect("valid"), b"hello0123456789", "step {step}");
        }
        // Trailers are kept, except hop-by-hop and framing fields.
        let mut dec = Chunked::default();
        let mut buf = BytesMut::from(&b"0\r\ngrpc-status: 0\r\nConnection: x\r\nContent-Length: 9\r\n\r\n"[..]);
        assert_eq!(dec.decode(&mut buf).expect("valid"), Decoded::Done);
        let trailers = dec.take_trailers().expect("trailers");
        assert_eq!(trailers.len(), 1);
        assert_eq!(trailers["grpc-status"], "0");
        assert!(dechunk(b"0\r\nno colon\r\n\r\n", 1).is_err());
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b"g\r\n",
            b"\r\n",
            b"11111111111111111\r\n",
            b"-1\r\n",
            b"5\r\nhello\r\n0\r\n\r",
        ] {
            assert!(dechunk(bad, 1).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
