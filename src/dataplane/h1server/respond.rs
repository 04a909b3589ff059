//! Responses onto the client connection. The head is encoded straight into the connection's
//! write buffer; the body is framed by its length when it is known (also for HEAD, whose body is
//! never sent), chunked otherwise (HTTP/1.0 clients: until the connection closes). Small pieces
//! are gathered behind the head, so a whole small response leaves in one write; the buffer goes
//! out whenever the body has nothing ready.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderMap, StatusCode};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Sleep;

use super::super::body::ResponseBody;
use super::super::h1codec::{chunk_line, push_field, Lines};
use super::super::headers::Decimal;
use super::super::proxy::Response;
use super::conn::Conn;
use super::head::Asks;

/// Body pieces up to this size are copied behind what is buffered; larger ones are written
/// with it in one vectored write.
const GATHER: usize = 16 * 1024;

/// How a response left.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Sent {
    /// Whole; the connection may carry the next request when `true`.
    Done(bool),
    /// `101 Switching Protocols`: the connection belongs to the tunnel now.
    Upgraded,
}

/// How the body is framed on the wire.
enum Mode {
    /// No body follows the head.
    None,
    /// This many bytes are still owed.
    Length(u64),
    Chunked,
    /// Until the connection closes (an HTTP/1.0 client and a body of unknown length).
    Eof,
}

/// Writes `resp` to the client: the head, then its body as the body yields it.
pub(super) async fn respond<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &RefCell<Conn<S>>,
    out: &mut Vec<u8>,
    resp: Response,
    asks: &Asks,
) -> io::Result<Sent> {
    let (parts, mut body) = resp.into_parts();
    let status = parts.status;
    let headers = parts.headers;
    let upgraded = status == StatusCode::SWITCHING_PROTOCOLS;
    let mut keep_alive = asks.keep_alive;
    let bodiless = status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    // A head without a body keeps the length its map names (an upstream's answer to HEAD, a
    // 304's; never a 1xx's or 204's, RFC 9110 section 8.6); a body that is sent is framed by
    // what it yields, never by a field it carries (`encode_head` leaves the field out).
    let drop_length = (bodiless && status != StatusCode::NOT_MODIFIED) || !(bodiless || asks.head);
    let named_length = !drop_length
        && (headers.contains_key(CONTENT_LENGTH) || body.fields().iter().any(|(n, _)| n == CONTENT_LENGTH));
    let mut mode = match body.size_hint().exact() {
        _ if bodiless || named_length => Mode::None,
        // HEAD: the length of a body that has bytes (a plugin's answer); an empty one says
        // nothing (an upstream's chunked answer to HEAD is no empty resource).
        Some(0) if asks.head => Mode::None,
        Some(n) => Mode::Length(n),
        None if asks.head => Mode::None,
        None if !asks.http10 => Mode::Chunked,
        None => {
            keep_alive = false;
            Mode::Eof
        }
    };
    // What is owed of `100 Continue` is settled before the head: finished if begun, else
    // dropped (`body_discardable` has made the connection end after this response).
    out.extend_from_slice(conn.borrow_mut().start_response());
    // The response's own `Connection` (a draining worker's `close`) decides with the client's.
    let framed = Framed { keep_alive, http10: asks.http10, upgraded, drop_length };
    keep_alive = encode_head(out, status, (body.lines(), &headers, body.fields()), &mode, framed);
    if bodiless || asks.head {
        // Dropped before the head goes out: the log phase runs now, as it does for a body sent.
        body = ResponseBody::Full(None);
        mode = Mode::None;
    }
    let mut trailers: Option<HeaderMap> = None;
    loop {
        match mode {
            Mode::None | Mode::Length(0) => break,
            _ => {}
        }
        let Some(frame) = next_frame(conn, out, &mut body).await? else { break };
        let frame = frame.map_err(io::Error::other)?;
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                // Trailers go to a client that said it takes them, after the last chunk.
                if matches!(mode, Mode::Chunked) && asks.trailers {
                    trailers = frame.into_trailers().ok();
                }
                continue;
            }
        };
        if data.is_empty() {
            continue;
        }
        match &mut mode {
            Mode::Length(left) => {
                if data.len() as u64 > *left {
                    return Err(io::Error::other("the body is longer than its announced length"));
                }
                *left -= data.len() as u64;
                put(conn, out, data).await?;
            }
            Mode::Chunked => {
                out.extend_from_slice(chunk_line(data.len()).as_bytes());
                put(conn, out, data).await?;
                out.extend_from_slice(b"\r\n");
            }
            Mode::Eof => put(conn, out, data).await?,
            Mode::None => {}
        }
    }
    match mode {
        Mode::Length(left) if left > 0 => {
            // The client sees a body shorter than announced: the connection must close.
            write_all(conn, out, None).await?;
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the body ended before its announced length"));
        }
        Mode::Chunked => {
            out.extend_from_slice(b"0\r\n");
            for (name, value) in trailers.iter().flatten() {
                push_field(out, name, value.as_bytes());
            }
            out.extend_from_slice(b"\r\n");
        }
        _ => {}
    }
    drop(body);
    write_all(conn, out, None).await?;
    Ok(if upgraded { Sent::Upgraded } else { Sent::Done(keep_alive && !matches!(mode, Mode::Eof)) })
}

/// A response's fields, in the order they are written: the upstream's as lines (when its head
/// was read that way), the map's, and plugins' ([`crate::dataplane::body::OnFinish::fields`]).
type Fields<'a> = (Option<&'a Lines>, &'a HeaderMap, &'a [(HeaderName, HeaderValue)]);

/// What `encode_head` needs to know of the connection and the framing besides the fields.
struct Framed {
    keep_alive: bool,
    http10: bool,
    upgraded: bool,
    /// The map's `Content-Length` is left out (the body frames itself).
    drop_length: bool,
}

/// The status line and the fields, in one pass over the map: the fields that frame the message
/// on this connection (`Transfer-Encoding`, `Connection` unless upgraded, `Content-Length`
/// when the body frames itself) are Weir's to write and are left out of it, rather than
/// removed from the map first (each removal hashes and probes); a `Date` is added after the
/// fields when the map has none. A `Connection: close` of the map ends the connection after
/// this response: whether it may carry another is returned (and said in the head).
fn encode_head(out: &mut Vec<u8>, status: StatusCode, fields: Fields<'_>, mode: &Mode, mut f: Framed) -> bool {
    let (lines, headers, more) = fields;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut dated = false;
    if let Some(lines) = lines {
        // The upstream's own, framing and hop-by-hop fields already left out (`h1codec`).
        out.extend_from_slice(&lines.text);
        dated = lines.dated;
    }
    for (name, value) in headers.iter().chain(more.iter().map(|(n, v)| (n, v))) {
        if *name == CONNECTION && !f.upgraded {
            f.keep_alive &=
                !value.as_bytes().split(|b| *b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
            continue;
        }
        if *name == TRANSFER_ENCODING || (*name == CONTENT_LENGTH && f.drop_length) {
            continue;
        }
        dated |= *name == DATE;
        push_field(out, name, value.as_bytes());
    }
    if !dated {
        out.extend_from_slice(b"date: ");
        with_date(|d| out.extend_from_slice(d));
        out.extend_from_slice(b"\r\n");
    }
    match mode {
        Mode::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(Decimal::new(*n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Mode::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Mode::None | Mode::Eof => {}
    }
    if !f.upgraded {
        if !f.keep_alive && !f.http10 {
            out.extend_from_slice(b"connection: close\r\n");
        } else if f.keep_alive && f.http10 {
            out.extend_from_slice(b"connection: keep-alive\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
    f.keep_alive
}

/// The body's next frame. When it has nothing ready, what is buffered goes out first.
async fn next_frame<S: AsyncRead + AsyncWrite + Unpin, B: Body + Unpin>(
    conn: &RefCell<Conn<S>>,
    out: &mut Vec<u8>,
    body: &mut B,
) -> io::Result<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
    if !out.is_empty() {
        // A look without a waker: when the body has nothing yet, the buffer is written and the
        // body is polled again below, with this task's waker.
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(frame) = Pin::new(&mut *body).poll_frame(&mut cx) {
            return Ok(frame);
        }
        write_all(conn, out, None).await?;
    }
    Ok(poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await)
}

/// Adds `data` to what goes out: copied behind the buffer when small, else written with it.
async fn put<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &RefCell<Conn<S>>,
    out: &mut Vec<u8>,
    data: Bytes,
) -> io::Result<()> {
    if out.len() + data.len() <= GATHER {
        out.extend_from_slice(&data);
        return Ok(());
    }
    write_all(conn, out, Some(&data)).await
}

/// Writes `out` (then clears it) and `extra` whole, and flushes.
pub(super) async fn write_all<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &RefCell<Conn<S>>,
    out: &mut Vec<u8>,
    extra: Option<&Bytes>,
) -> io::Result<()> {
    let extra: &[u8] = extra.map_or(&[], |b| &b[..]);
    let total = out.len() + extra.len();
    let mut at = 0;
    // Armed only when the socket makes the write wait, and moved on with every bit of progress.
    let mut stalled: Option<(Pin<Box<Sleep>>, usize)> = None;
    poll_fn(|cx| {
        let mut conn = conn.borrow_mut();
        let Some(io) = conn.io.as_mut() else { return Poll::Ready(Err(io::ErrorKind::NotConnected.into())) };
        while at < total {
            let polled = if at < out.len() {
                let bufs = [IoSlice::new(&out[at..]), IoSlice::new(extra)];
                Pin::new(&mut *io).poll_write_vectored(cx, &bufs)
            } else {
                Pin::new(&mut *io).poll_write(cx, &extra[at - out.len()..])
            };
            let n = match polled {
                Poll::Ready(n) => n?,
                Poll::Pending => return poll_stall(&mut stalled, at, cx),
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            at += n;
        }
        match Pin::new(io).poll_flush(cx) {
            Poll::Pending => poll_stall(&mut stalled, at, cx),
            ready => ready,
        }
    })
    .await?;
    out.clear();
    Ok(())
}

/// How long a write may make no progress (nginx's `send_timeout`): a client that stops reading
/// is let go, with the upstream connection its response holds.
pub(super) const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// A write that waits: `Pending` until [`SEND_TIMEOUT`] passes with no progress since `at`.
fn poll_stall(stalled: &mut Option<(Pin<Box<Sleep>>, usize)>, at: usize, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    match stalled {
        Some((sleep, since)) if *since == at => {
            if sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client read nothing for 60 s")));
            }
        }
        _ => {
            let mut sleep = Box::pin(tokio::time::sleep(SEND_TIMEOUT));
            let _ = sleep.as_mut().poll(cx);
            *stalled = Some((sleep, at));
        }
    }
    Poll::Pending
}

thread_local! {
    /// The `Date` value, rebuilt when the second changes (`(unix second, text)`).
    static DATE_CACHE: (Cell<u64>, RefCell<[u8; 29]>) = const { (Cell::new(0), RefCell::new([0; 29])) };
}

/// Calls `f` with the current `Date` value (IMF-fixdate, as RFC 9110 asks), made once a second
/// per thread (HTTP/1.1 heads and HTTP/2 answers share it).
pub(crate) fn with_date(f: impl FnOnce(&[u8])) {
    let now = std::time::SystemTime::now();
    let secs = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE_CACHE.with(|(at, text)| {
        if at.get() != secs {
            let fresh = httpdate::fmt_http_date(now);
            if fresh.len() == 29 {
                text.borrow_mut().copy_from_slice(fresh.as_bytes());
            }
            at.set(secs);
        }
        f(&text.borrow()[..]);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(status: StatusCode, mode: Mode, keep_alive: bool, http10: bool) -> String {
        let mut out = Vec::new();
        let mut headers = HeaderMap::new();
        headers.insert(DATE, http::HeaderValue::from_static("x"));
        let _ = encode_head(
            &mut out,
            status,
            (None, &headers, &[]),
            &mode,
            Framed { keep_alive, http10, upgraded: false, drop_length: true },
        );
        String::from_utf8(out).expect("text")
    }

    #[test]
    fn framing_fields_of_the_map_are_left_out_and_a_date_added() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_LENGTH, http::HeaderValue::from_static("99"));
        headers.insert(TRANSFER_ENCODING, http::HeaderValue::from_static("chunked"));
        headers.insert(CONNECTION, http::HeaderValue::from_static("close"));
        headers.insert("x-kept", http::HeaderValue::from_static("1"));
        let encode = |drop_length: bool, upgraded: bool, mode: Mode| {
            let mut out = Vec::new();
            let f = Framed { keep_alive: true, http10: false, upgraded, drop_length };
            let more = [(HeaderName::from_static("x-more"), HeaderValue::from_static("2"))];
            let lines = Lines { text: b"x-up: 0\r\n".to_vec(), dated: false };
            let kept = encode_head(&mut out, StatusCode::OK, (Some(&lines), &headers, &more), &mode, f);
            (String::from_utf8(out).expect("text"), kept)
        };
        let (sent, kept) = encode(true, false, Mode::Length(5));
        assert!(!kept, "the map's `Connection: close` ends the connection");
        let lines: Vec<&str> = sent.split("\r\n").collect();
        assert_eq!(lines[0], "HTTP/1.1 200 OK");
        assert_eq!(
            &lines[1..4],
            ["x-up: 0", "x-kept: 1", "x-more: 2"],
            "the upstream's lines, the map's, the plugins'"
        );
        assert!(lines[4].starts_with("date: ") && lines[4].ends_with(" GMT"), "{sent}");
        assert_eq!(&lines[5..], ["content-length: 5", "connection: close", "", ""], "{sent}");
        // A head without a body keeps its named length, once; a 101 keeps its Connection.
        let (sent, kept) = encode(false, true, Mode::None);
        assert!(kept);
        assert_eq!(sent.matches("content-length").count(), 1, "{sent}");
        assert!(sent.contains("content-length: 99\r\n") && sent.contains("connection: close\r\n"), "{sent}");
        assert!(!sent.contains("transfer-encoding"), "{sent}");
    }

    #[test]
    fn heads_say_their_framing_and_connection() {
        assert_eq!(
            head(StatusCode::OK, Mode::Length(5), true, false),
            "HTTP/1.1 200 OK\r\ndate: x\r\ncontent-length: 5\r\n\r\n"
        );
        assert_eq!(
            head(StatusCode::NOT_FOUND, Mode::Chunked, false, false),
            "HTTP/1.1 404 Not Found\r\ndate: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
        assert_eq!(head(StatusCode::OK, Mode::Eof, false, true), "HTTP/1.1 200 OK\r\ndate: x\r\n\r\n");
        assert_eq!(
            head(StatusCode::NO_CONTENT, Mode::None, true, true),
            "HTTP/1.1 204 No Content\r\ndate: x\r\nconnection: keep-alive\r\n\r\n"
        );
    }

    #[test]
    fn the_date_is_an_imf_fixdate() {
        let mut d = Vec::new();
        with_date(|v| d.extend_from_slice(v));
        let text = String::from_utf8(d).expect("ascii");
        assert!(httpdate::parse_http_date(&text).is_ok(), "{text}");
        assert!(text.ends_with(" GMT"), "{text}");
    }
}
