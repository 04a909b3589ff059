//! HTTP/1.1 request framing, checked strictly before the HTTP server sees a byte.
//!
//! Request smuggling lives in the gaps between two parsers' readings of one byte stream. Weir
//! closes them by refusing every request whose framing could be read two ways, as nginx (since
//! 1.21.1) does: `Content-Length` together with `Transfer-Encoding`, two `Content-Length`
//! headers (even equal ones), a `Content-Length` that is not plain digits, a `Transfer-Encoding`
//! other than exactly `chunked`, `Transfer-Encoding` in HTTP/1.0, obs-fold, whitespace before a
//! colon, and a missing `Host` in HTTP/1.1. (hyper would have accepted some of these: it lets
//! `Transfer-Encoding` win over `Content-Length`.)
//!
//! [`parse_head`] is the one parse of a request head: Weir's HTTP/1.1 server (`h1server`) builds
//! the request from it, and reads bodies with `h1codec`'s decoder. [`Framer`] states the same
//! rules over a whole byte stream, sans-IO (fed the bytes of a connection, it says which may go
//! on); the server does not run it. It is the reference the `request_stream` fuzz target holds
//! to one verdict however reads split, and the `request_head` target checks the server's head
//! parse, over pipelined requests and split reads, against the same rules.

/// A refused request: status and the reason given to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// 400, 414 or 431.
    pub status: u16,
    /// Why, for the client and the debug log.
    pub reason: &'static str,
}

impl Refusal {
    pub(crate) const fn bad(reason: &'static str) -> Refusal {
        Refusal { status: 400, reason }
    }

    /// The status, as the request path answers it.
    pub fn status(&self) -> http::StatusCode {
        http::StatusCode::from_u16(self.status).unwrap_or(http::StatusCode::BAD_REQUEST)
    }

    /// The `error_msg` of the answer: the 414 and 431 texts nginx gives, or the reason.
    pub fn message(&self) -> std::borrow::Cow<'static, str> {
        match self.status {
            414 => "414 Request-URI Too Large".into(),
            431 => "431 Request Header Fields Too Large".into(),
            _ => format!("400 Bad Request: {}", self.reason).into(),
        }
    }

    /// The whole HTTP response that carries this refusal (JSON body, connection closed).
    pub fn response(&self) -> Vec<u8> {
        let phrase = match self.status {
            414 => "URI Too Long",
            431 => "Request Header Fields Too Large",
            _ => "Bad Request",
        };
        let message = self.message();
        let body = serde_json::json!({ "error_msg": message }).to_string();
        format!(
            "HTTP/1.1 {} {phrase}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            self.status,
            body.len()
        )
        .into_bytes()
    }
}

/// Longest request line (nginx's `large_client_header_buffers`: 8 KiB).
pub const MAX_REQUEST_LINE: usize = 8 << 10;
/// Longest request head, request line included.
pub const MAX_HEAD: usize = 32 << 10;
/// Longest header line (nginx: one of `large_client_header_buffers`, 8 KiB).
pub const MAX_HEADER_LINE: usize = 8 << 10;
/// Most header lines in one request.
pub const MAX_HEADERS: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Hex digits of a chunk size (value so far, digits seen).
    Size(u64, u8),
    /// After the size: extension up to CR.
    Ext(u64),
    /// CR seen after the size line.
    SizeLf(u64),
    /// Data bytes left.
    Data(u64),
    /// CR after data expected.
    DataCr,
    /// LF after data expected.
    DataLf,
    /// A trailer line (true: it has content).
    Trailer(bool),
    /// CR seen at the end of a trailer line.
    TrailerLf(bool),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for a complete request head.
    Head,
    /// Body bytes left (by `Content-Length`).
    Length(u64),
    /// Inside a chunked body.
    Chunked(Chunk),
    /// Everything goes through unchecked (the server owns the error).
    Passthrough,
}

/// What [`Framer::feed`] decided about the bytes it was given.
#[derive(Debug, PartialEq, Eq)]
pub enum Fed {
    /// This many leading bytes may go to the server; the rest must be kept and fed again with
    /// more input (an incomplete head).
    Pass(usize),
    /// The first `pass` bytes (earlier requests) may still go to the server; the request after
    /// them is refused, and nothing more goes.
    Refuse {
        /// Bytes before the refused request.
        pass: usize,
        /// Why.
        refusal: Refusal,
    },
}

/// The framing state of one connection.
#[derive(Debug)]
pub struct Framer {
    state: State,
}

impl Default for Framer {
    fn default() -> Self {
        Framer { state: State::Head }
    }
}

/// How an accepted request head frames what follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body: the next request head follows.
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// A bodiless upgrade request: what follows may be another protocol (a WebSocket tunnel).
    /// It passes unjudged, and the connection closes after the response unless it switched
    /// protocols (`proxy::handle`), so none of it is ever served as a request.
    Upgrade,
}

/// Parses the request head at the start of `input` (which must not start with the empty lines
/// RFC 9112 lets a client send before it: see [`skip_empty_lines`]) and judges its framing.
/// `Ok(None)` while it is incomplete and within the limits. This is the one parse of a head:
/// the framer follows the connection with it, and the server builds the request from it.
pub fn parse_head<'h, 'b>(
    input: &'b [u8],
    headers: &'h mut [std::mem::MaybeUninit<httparse::Header<'b>>],
) -> Result<Option<(usize, httparse::Request<'h, 'b>, BodyFraming)>, Refusal> {
    let window = &input[..input.len().min(MAX_REQUEST_LINE + 1)];
    if !window.contains(&b'\n') && input.len() > MAX_REQUEST_LINE {
        return Err(Refusal { status: 414, reason: "request line longer than 8 KiB" });
    }
    let head = &input[..input.len().min(MAX_HEAD + 1)];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(head, headers) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if input.len() > MAX_HEAD => {
            return Err(Refusal { status: 431, reason: "request head larger than 32 KiB" });
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Refusal { status: 431, reason: "too many header lines" });
        }
        Err(httparse::Error::Version) => return Err(Refusal::bad("unsupported HTTP version")),
        Err(httparse::Error::Token | httparse::Error::Status) => {
            return Err(Refusal::bad("malformed request line or method"));
        }
        Err(httparse::Error::HeaderName) => {
            return Err(Refusal::bad("malformed header name (no whitespace before the colon, no obs-fold)"));
        }
        Err(httparse::Error::HeaderValue) => return Err(Refusal::bad("malformed header value")),
        Err(_) => return Err(Refusal::bad("malformed request head")),
    };
    let framing = judge_framing(&req)?;
    Ok(Some((len, req, framing)))
}

/// The empty lines before a request line, which are ignored (RFC 9112 section 2.2).
pub fn skip_empty_lines(input: &[u8]) -> usize {
    input.iter().take_while(|b| matches!(b, b'\r' | b'\n')).count()
}

/// The framing rules every accepted head must pass (see the module documentation).
fn judge_framing(req: &httparse::Request<'_, '_>) -> Result<BodyFraming, Refusal> {
    let http11 = req.version == Some(1);
    let (mut length, mut lengths, mut te, mut host, mut upgrade) = (None, 0, None, false, false);
    for h in req.headers.iter() {
        if h.name.len() + h.value.len() + 4 > MAX_HEADER_LINE {
            return Err(Refusal { status: 431, reason: "a header line longer than 8 KiB" });
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            lengths += 1;
            let v = h.value;
            if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
                return Err(Refusal::bad("Content-Length must be a number"));
            }
            length = std::str::from_utf8(v).ok().and_then(|s| s.parse::<u64>().ok());
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if te.is_some() {
                return Err(Refusal::bad("more than one Transfer-Encoding header"));
            }
            te = Some(h.value);
        } else if h.name.eq_ignore_ascii_case("upgrade") {
            upgrade = true;
        } else if h.name.eq_ignore_ascii_case("host") {
            if host {
                return Err(Refusal::bad("more than one Host header"));
            }
            host = true;
        }
    }
    if lengths > 1 {
        return Err(Refusal::bad("more than one Content-Length header"));
    }
    if http11 && !host {
        return Err(Refusal::bad("HTTP/1.1 request without a Host header"));
    }
    Ok(match (te, length) {
        (Some(_), Some(_)) => return Err(Refusal::bad("Content-Length and Transfer-Encoding together")),
        (Some(_), None) if !http11 => return Err(Refusal::bad("Transfer-Encoding in an HTTP/1.0 request")),
        (Some(v), None) if !v.eq_ignore_ascii_case(b"chunked") => {
            return Err(Refusal::bad("Transfer-Encoding must be exactly chunked"))
        }
        (Some(_), None) => BodyFraming::Chunked,
        (None, Some(0) | None) if upgrade => BodyFraming::Upgrade,
        (None, Some(0) | None) => BodyFraming::None,
        (None, Some(n)) => BodyFraming::Length(n),
    })
}

impl Framer {
    /// Whether the framer waits for a request head (the connection is between requests).
    pub fn between_requests(&self) -> bool {
        self.state == State::Head
    }

    /// Body bytes still expected by `Content-Length`, when that is what comes next: they can go
    /// straight to the server.
    pub fn length_left(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            _ => None,
        }
    }

    /// Notes `n` body bytes passed by length.
    fn passed_body(&mut self, n: usize) {
        if let State::Length(left) = self.state {
            let left = left.saturating_sub(n as u64);
            self.state = if left == 0 { State::Head } else { State::Length(left) };
        }
    }

    /// Decides about `input`, the bytes received and not yet passed on.
    pub fn feed(&mut self, input: &[u8]) -> Fed {
        let mut at = 0;
        while at < input.len() {
            match self.state {
                State::Passthrough => return Fed::Pass(input.len()),
                State::Head => {
                    // Empty lines pass at once, so that the verdict never depends on how reads
                    // split.
                    at += skip_empty_lines(&input[at..]);
                    let rest = &input[at..];
                    if rest.is_empty() {
                        break;
                    }
                    let mut headers = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
                    match parse_head(rest, &mut headers) {
                        Ok(Some((end, _, framing))) => {
                            self.state = match framing {
                                BodyFraming::None => State::Head,
                                BodyFraming::Length(n) => State::Length(n),
                                BodyFraming::Chunked => State::Chunked(Chunk::Size(0, 0)),
                                BodyFraming::Upgrade => State::Passthrough,
                            };
                            at += end;
                        }
                        Ok(None) => return Fed::Pass(at),
                        Err(refusal) => return Fed::Refuse { pass: at, refusal },
                    }
                }
                State::Length(n) => {
                    let take = (input.len() - at).min(usize::try_from(n).unwrap_or(usize::MAX));
                    at += take;
                    self.passed_body(take);
                }
                // Chunk data is skipped in one step; only the framing around it is read byte by byte.
                State::Chunked(Chunk::Data(v)) if v > 1 => {
                    let take = (input.len() - at).min(usize::try_from(v - 1).unwrap_or(usize::MAX));
                    at += take;
                    self.state = State::Chunked(Chunk::Data(v - take as u64));
                }
                State::Chunked(c) => {
                    let b = input[at];
                    at += 1;
                    self.state = match step_chunk(c, b) {
                        Some(Some(next)) => State::Chunked(next),
                        Some(None) => State::Head,
                        // Malformed: the server's own decoder refuses it (400).
                        None => State::Passthrough,
                    };
                }
            }
        }
        Fed::Pass(input.len())
    }
}

/// One byte of chunked framing. `Some(Some(s))`: go on in `s`; `Some(None)`: the body ended;
/// `None`: malformed.
fn step_chunk(c: Chunk, b: u8) -> Option<Option<Chunk>> {
    let hex = |b: u8| (b as char).to_digit(16).map(u64::from);
    Some(Some(match c {
        Chunk::Size(v, n) => match (hex(b), b) {
            (Some(d), _) if n < 15 => Chunk::Size(v * 16 + d, n + 1),
            (None, b';' | b' ' | b'\t') if n > 0 => Chunk::Ext(v),
            (None, b'\r') if n > 0 => Chunk::SizeLf(v),
            _ => return None,
        },
        Chunk::Ext(v) => match b {
            b'\r' => Chunk::SizeLf(v),
            b'\n' => return None,
            _ => Chunk::Ext(v),
        },
        Chunk::SizeLf(v) => match (b, v) {
            (b'\n', 0) => Chunk::Trailer(false),
            (b'\n', v) => Chunk::Data(v),
            _ => return None,
        },
        Chunk::Data(1) => Chunk::DataCr,
        Chunk::Data(v) => Chunk::Data(v - 1),
        Chunk::DataCr => match b {
            b'\r' => Chunk::DataLf,
            _ => return None,
        },
        Chunk::DataLf => match b {
            b'\n' => Chunk::Size(0, 0),
            _ => return None,
        },
        Chunk::Trailer(content) => match b {
            b'\r' => Chunk::TrailerLf(content),
            b'\n' => return None,
            _ => Chunk::Trailer(true),
        },
        Chunk::TrailerLf(content) => match (b, content) {
            (b'\n', false) => return Some(None),
            (b'\n', true) => Chunk::Trailer(false),
            _ => return None,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(stream: &[u8]) -> Result<usize, Refusal> {
        let mut f = Framer::default();
        match f.feed(stream) {
            Fed::Pass(n) => Ok(n),
            Fed::Refuse { refusal, .. } => Err(refusal),
        }
    }

    const H: &str = "POST / HTTP/1.1\r\nHost: x\r\n";

    #[test]
    fn smuggling_shapes_are_refused() {
        for (what, head) in [
            ("CL+TE", format!("{H}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n")),
            ("TE+CL", format!("{H}Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n")),
            ("two CL", format!("{H}Content-Length: 4\r\nContent-Length: 4\r\n\r\n")),
            ("CL +4", format!("{H}Content-Length: +4\r\n\r\n")),
            ("CL list", format!("{H}Content-Length: 4, 4\r\n\r\n")),
            ("xchunked", format!("{H}Transfer-Encoding: xchunked\r\n\r\n")),
            ("chunked, identity", format!("{H}Transfer-Encoding: chunked, identity\r\n\r\n")),
            ("two TE", format!("{H}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n")),
            ("obs-fold", format!("{H}X-A: a\r\n b\r\n\r\n")),
            ("space before colon", format!("{H}Transfer-Encoding : chunked\r\n\r\n")),
            ("no host", "GET / HTTP/1.1\r\n\r\n".to_owned()),
            ("TE in 1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n".to_owned()),
        ] {
            assert!(feed_all(head.as_bytes()).is_err(), "{what} was accepted");
        }
    }

    #[test]
    fn bodies_are_followed_to_the_next_head() {
        let two = format!("{H}Content-Length: 5\r\n\r\nhello{H}Transfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n0\r\nT: 1\r\n\r\nGET / HTTP/1.1\r\nHost: y\r\n\r\n");
        assert_eq!(feed_all(two.as_bytes()), Ok(two.len()));
        // A smuggled second request after a valid body is still checked.
        let bad = format!("{H}Content-Length: 5\r\n\r\nhello{H}Content-Length: 1\r\nContent-Length: 2\r\n\r\n");
        assert!(feed_all(bad.as_bytes()).is_err());
    }

    #[test]
    fn incomplete_heads_are_held_back() {
        let mut f = Framer::default();
        assert_eq!(f.feed(b"GET / HTTP/1.1\r\nHo"), Fed::Pass(0));
        assert_eq!(f.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Fed::Pass(27));
        assert!(f.between_requests());
    }

    #[test]
    fn limits() {
        let long = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(9000));
        assert_eq!(feed_all(long.as_bytes()).map_err(|r| r.status), Err(414));
        let big = format!("GET / HTTP/1.1\r\nHost: x\r\n{}\r\n", "X-A: b\r\n".repeat(5000));
        assert_eq!(feed_all(big.as_bytes()).map_err(|r| r.status), Err(431));
    }

    #[test]
    fn bytes_after_an_upgrade_request_pass() {
        let s: &[u8] = b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n\x81\x05hello";
        assert_eq!(feed_all(s), Ok(s.len()));
        // Without the upgrade, the same bytes are a malformed next request.
        let s = "GET /ws HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\n\r\n";
        assert!(feed_all(s.as_bytes()).is_err());
    }

    #[test]
    fn malformed_chunks_pass_to_the_server() {
        let s = format!("{H}Transfer-Encoding: chunked\r\n\r\nzz\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(feed_all(s.as_bytes()), Ok(s.len()));
    }
}
