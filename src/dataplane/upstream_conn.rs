//! One HTTP/1.1 connection to an upstream node, driven by the task of the request it carries:
//! the request head and body are written, the response head is read, and the response body
//! is streamed by [`H1Body`], which hands the connection back to the pool at its end. No
//! background task and no channel per connection (hyper's client connection needed both:
//! about a third of the instructions of a proxied request went there).
//!
//! Timeouts follow nginx and are enforced on the socket: `send` bounds each write that makes no
//! progress (`proxy_send_timeout`), `read` bounds each wait for bytes from the upstream once
//! the request has been handed over, the response head included (`proxy_read_timeout`). While
//! the request body waits on a slow client, no read timer runs. The framing itself is
//! `h1codec`'s.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, Method};
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncWrite;
use tokio::time::Sleep;

use super::body::{BodyWait, ProxyBody};
use super::client::{Pool, SendError, Stream};
use super::h1codec::{self, BodyLen, Chunked, Decoded, RequestBody, ResponseHead};
use crate::tables::upstream::{PoolKey, PoolSettings, Timeouts};

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 16 * 1024;

/// A timer armed on first use and reused, never reallocated, afterwards.
///
/// Arming records a deadline; the tokio sleep is only moved when it would wake the task too
/// late. A sleep left from an earlier, earlier-ending wait wakes the task before the deadline,
/// and is then moved on to it: a request's timeouts cost a clock read, not a timer-wheel update.
pub struct Timer {
    sleep: Option<Pin<Box<Sleep>>>,
    /// The epoch it was armed in (None: disarmed).
    armed: Option<u32>,
    /// When the armed wait ends (meaningful while armed).
    deadline: tokio::time::Instant,
}

impl Default for Timer {
    fn default() -> Self {
        Self::new()
    }
}

impl Timer {
    /// A disarmed timer (no tokio sleep until first armed).
    pub fn new() -> Self {
        Timer { sleep: None, armed: None, deadline: tokio::time::Instant::now() }
    }
    /// Stops the wait (the sleep stays, to be moved by the next arming).
    pub fn disarm(&mut self) {
        self.armed = None;
    }
    /// Moves an armed timer's deadline to `after` from now (the sleep, set no later, still
    /// wakes the task in time even if nobody polls it before then).
    fn restart(&mut self, after: Duration) {
        if self.armed.is_some() {
            self.set_deadline(tokio::time::Instant::now() + after);
        }
    }
    fn set_deadline(&mut self, deadline: tokio::time::Instant) {
        self.deadline = deadline;
        match &mut self.sleep {
            Some(s) if s.deadline() <= deadline => {}
            Some(s) => s.as_mut().reset(deadline),
            None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }
    /// Arms (unless armed in this epoch) and polls; true when the time is up.
    pub fn expired(&mut self, cx: &mut Context<'_>, epoch: u32, after: Duration) -> bool {
        if self.armed != Some(epoch) {
            self.set_deadline(tokio::time::Instant::now() + after);
            self.armed = Some(epoch);
        }
        let deadline = self.deadline;
        let Some(sleep) = self.sleep.as_mut() else { return false };
        if sleep.as_mut().poll(cx).is_pending() {
            return false;
        }
        if tokio::time::Instant::now() < deadline {
            // Woken for an older, earlier deadline: wait on for this one.
            sleep.as_mut().reset(deadline);
            if sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
        }
        self.armed = None;
        true
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_owned())
}

/// The head of a request to an upstream.
pub struct RequestHead<'a> {
    pub method: &'a Method,
    /// Path and query.
    pub target: &'a str,
    /// The header fields, except those `set` replaces.
    pub headers: &'a HeaderMap,
    /// Fields set by the proxy (Host, `X-Forwarded-*`, `traceparent`): written instead of those
    /// of `headers`; one with an empty value removes the field.
    pub set: &'a [(&'a HeaderName, &'a [u8])],
    /// The answer's fields are wanted as lines to send on (`h1codec::Lines`), not in a map.
    pub lines: bool,
}

/// An upstream connection, in the pool or serving one request.
pub struct Conn {
    stream: Stream,
    /// Bytes read and not yet used.
    rbuf: BytesMut,
    /// The request head being written (kept: no allocation per request).
    wbuf: Vec<u8>,
    /// Scratch for the response head parser.
    spans: Vec<[usize; 4]>,
    read_timer: Timer,
    write_timer: Timer,
    /// Bumped per request, so that a timer armed for an earlier one re-arms.
    epoch: u32,
    send_timeout: Duration,
    read_timeout: Duration,
    /// Set while the request body waits on the client (no read timer then).
    stalled: Option<Rc<Cell<BodyWait>>>,
    pub(super) key: PoolKey,
    pub(super) settings: PoolSettings,
    /// Requests served before the current one.
    pub(super) served: u32,
    /// The connection can carry another request once the current response is read.
    reusable: bool,
    /// Some bytes of an answer to the current request came.
    heard: bool,
}

/// How an exchange failed.
fn failure(sent: bool, err: &io::Error, body: Option<ProxyBody>) -> SendError {
    SendError { sent, timeout: err.kind() == io::ErrorKind::TimedOut, reason: err.to_string(), body }
}

impl Conn {
    /// A new connection over `stream`.
    pub(super) fn new(stream: Stream, key: PoolKey, settings: PoolSettings) -> Box<Self> {
        Box::new(Conn {
            stream,
            rbuf: BytesMut::new(),
            wbuf: Vec::new(),
            spans: Vec::new(),
            read_timer: Timer::new(),
            write_timer: Timer::new(),
            epoch: 0,
            send_timeout: Duration::ZERO,
            read_timeout: Duration::ZERO,
            stalled: None,
            key,
            settings,
            served: 0,
            reusable: true,
            heard: false,
        })
    }

    /// Whether an idle connection is still usable: the upstream has neither closed it nor sent
    /// anything unasked.
    pub(super) fn is_open(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        self.rbuf.clear();
        let read = poll_read_buf(Pin::new(&mut self.stream), &mut cx, &mut self.rbuf);
        read.is_pending()
    }

    /// Whether it may go back to the pool.
    pub(super) fn reusable(&self) -> bool {
        self.reusable && self.rbuf.is_empty()
    }

    /// Lets go of the read buffer while the connection idles in the pool (memory follows
    /// requests, not idle connections); the next response reads into a new one. The sweeper
    /// does this, once a second: doing it per request cost 800 instructions.
    pub(super) fn shed(&mut self) {
        self.rbuf = BytesMut::new();
    }

    /// Whether any byte of an answer to the current request came.
    pub(super) fn heard(&self) -> bool {
        self.heard
    }

    fn stalled(&self) -> bool {
        self.stalled.as_ref().is_some_and(|s| s.get() == BodyWait::Stalled)
    }

    /// Reads what the socket has into `rbuf`; `Ok(0)` is the end of the stream. Pending waits
    /// are bounded by the read timeout, except while the request body waits on the client.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
            self.rbuf.reserve(READ_CHUNK);
        }
        match poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.rbuf) {
            Poll::Ready(r) => {
                self.read_timer.disarm();
                if matches!(r, Ok(n) if n > 0) {
                    self.heard = true;
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if self.stalled() {
                    self.read_timer.disarm();
                } else if self.read_timer.expired(cx, self.epoch, self.read_timeout) {
                    return Poll::Ready(Err(timed_out("upstream read timed out")));
                }
                Poll::Pending
            }
        }
    }

    /// Writes the concatenation of `parts`, `done` bytes of which are written already; each
    /// wait for the socket is bounded by the send timeout, and progress restarts the wait for
    /// the answer.
    fn poll_write_parts(&mut self, cx: &mut Context<'_>, parts: &[&[u8]], done: &mut usize) -> Poll<io::Result<()>> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        while *done < total {
            let mut skip = *done;
            let mut slices = [io::IoSlice::new(&[]); 3];
            let mut n = 0;
            for p in parts {
                if skip >= p.len() {
                    skip -= p.len();
                    continue;
                }
                if n < slices.len() {
                    slices[n] = io::IoSlice::new(&p[skip..]);
                    n += 1;
                }
                skip = 0;
            }
            match Pin::new(&mut self.stream).poll_write_vectored(cx, &slices[..n]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(wrote)) => {
                    *done += wrote;
                    self.write_timer.disarm();
                    self.read_timer.restart(self.read_timeout);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return self.write_wait(cx),
            }
        }
        match Pin::new(&mut self.stream).poll_flush(cx) {
            Poll::Ready(r) => {
                self.write_timer.disarm();
                Poll::Ready(r)
            }
            Poll::Pending => self.write_wait(cx),
        }
    }

    fn write_wait(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.write_timer.expired(cx, self.epoch, self.send_timeout) {
            return Poll::Ready(Err(timed_out("upstream send timed out")));
        }
        Poll::Pending
    }

    /// Reads whatever the upstream sent while the request body is still going out: a complete
    /// response head ends the upload early (the connection is not reused then).
    fn poll_early_answer(&mut self, cx: &mut Context<'_>, head_request: bool) -> Poll<io::Result<ResponseHead>> {
        loop {
            match self.poll_fill(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "upstream closed the connection before the request body was sent",
                    )))
                }
                // (An early answer, rare: its fields go in a map.)
                Poll::Ready(Ok(_)) => {
                    match h1codec::parse_response_with(&mut self.rbuf, head_request, &mut self.spans, false) {
                        Ok(Some(head)) => return Poll::Ready(Ok(head)),
                        Ok(None) => {}
                        Err(e) => return Poll::Ready(Err(io::Error::other(e.0))),
                    }
                }
            }
        }
    }

    /// Sends a request and reads the response head. The error says whether any of the request
    /// was written, and gives the body back when none of it was.
    pub(super) async fn exchange(
        &mut self,
        req: &RequestHead<'_>,
        mut body: ProxyBody,
        t: &Timeouts,
        stalled: Option<Rc<Cell<BodyWait>>>,
    ) -> Result<ResponseHead, SendError> {
        self.epoch = self.epoch.wrapping_add(1);
        self.send_timeout = t.send;
        self.read_timeout = t.read;
        self.read_timer.disarm();
        self.write_timer.disarm();
        self.stalled = stalled;
        self.reusable = true;
        self.heard = false;
        let head_request = req.method == Method::HEAD;
        let full = match &mut body {
            ProxyBody::Full(b) => b.take(),
            _ => None,
        };
        let framing = match (&body, &full) {
            (_, Some(b)) => RequestBody::Length(b.len() as u64),
            (ProxyBody::Client(c), _) => c.content_length().map_or(RequestBody::Chunked, RequestBody::Length),
            _ => RequestBody::None,
        };
        let mut wbuf = std::mem::take(&mut self.wbuf);
        h1codec::encode_request(&mut wbuf, req.method, req.target, req.headers, req.set, framing);
        let mut done = 0;
        let full_bytes: &[u8] = full.as_deref().unwrap_or(&[]);
        let wrote = poll_fn(|cx| self.poll_write_parts(cx, &[&wbuf, full_bytes], &mut done)).await;
        self.wbuf = wbuf;
        if let Err(e) = wrote {
            self.reusable = false;
            let back = if done == 0 { Some(if full.is_some() { ProxyBody::Full(full) } else { body }) } else { None };
            return Err(failure(done > 0, &e, back));
        }
        if let ProxyBody::Client(_) = body {
            match self.upload(body, framing == RequestBody::Chunked, head_request).await {
                Ok(Some(head)) => {
                    // Answered before the whole body was sent: the connection is not reused.
                    self.reusable = false;
                    self.stalled = None;
                    return Ok(head);
                }
                Ok(None) => {}
                Err(e) => {
                    self.reusable = false;
                    return Err(failure(true, &e, None));
                }
            }
        }
        self.stalled = None;
        loop {
            if !self.rbuf.is_empty() {
                match h1codec::parse_response_with(&mut self.rbuf, head_request, &mut self.spans, req.lines) {
                    Ok(Some(head)) => {
                        self.reusable = head.keep_alive;
                        return Ok(head);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.reusable = false;
                        return Err(SendError { sent: true, timeout: false, reason: e.0, body: None });
                    }
                }
            }
            match poll_fn(|cx| self.poll_fill(cx)).await {
                Ok(0) => {
                    self.reusable = false;
                    let why = if self.rbuf.is_empty() {
                        "upstream closed the connection before answering"
                    } else {
                        "upstream closed the connection in the response head"
                    };
                    return Err(SendError { sent: true, timeout: false, reason: why.to_owned(), body: None });
                }
                Ok(_) => {}
                Err(e) => {
                    self.reusable = false;
                    return Err(failure(true, &e, None));
                }
            }
        }
    }

    /// Streams the client's body (chunked when its length is unknown). `Some(head)`: the
    /// upstream answered before the body was all sent.
    async fn upload(
        &mut self,
        mut body: ProxyBody,
        chunked: bool,
        head_request: bool,
    ) -> io::Result<Option<ResponseHead>> {
        let mut pending: Option<Bytes> = None;
        let mut line = h1codec::chunk_line(0);
        let mut done = 0;
        let mut ended = false;
        poll_fn(|cx| loop {
            if let Some(data) = &pending {
                let parts: [&[u8]; 3] = if ended {
                    [data, &[], &[]]
                } else if chunked {
                    [line.as_bytes(), data, b"\r\n"]
                } else {
                    [data, &[], &[]]
                };
                match self.poll_write_parts(cx, &parts, &mut done) {
                    Poll::Ready(Ok(())) => {
                        pending = None;
                        done = 0;
                        if ended {
                            return Poll::Ready(Ok(None));
                        }
                    }
                    Poll::Ready(Err(e)) => {
                        // A server that answered and closed without reading the body: its
                        // answer may still be waiting to be read.
                        if let Poll::Ready(Ok(head)) = self.poll_early_answer(cx, head_request) {
                            return Poll::Ready(Ok(Some(head)));
                        }
                        return Poll::Ready(Err(e));
                    }
                    Poll::Pending => {
                        return self.poll_early_answer(cx, head_request).map(|r| r.map(Some));
                    }
                }
                continue;
            }
            if ended {
                return Poll::Ready(Ok(None));
            }
            match Pin::new(&mut body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        if !data.is_empty() {
                            line = h1codec::chunk_line(data.len());
                            pending = Some(data);
                        }
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Err(io::Error::other(format!("client body: {e}"))));
                }
                Poll::Ready(None) => {
                    ended = true;
                    if chunked {
                        pending = Some(Bytes::from_static(b"0\r\n\r\n"));
                    }
                }
                Poll::Pending => {
                    return self.poll_early_answer(cx, head_request).map(|r| r.map(Some));
                }
            }
        })
        .await
    }
}

/// Reads into the spare capacity of `buf` (tokio-util's `poll_read_buf`: no zeroing).
fn poll_read_buf(stream: Pin<&mut Stream>, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
    tokio_util::io::poll_read_buf(stream, cx, buf)
}

/// Where a response body is.
enum Framing {
    Length(u64),
    Chunked(Chunked),
    ToEof,
    Done,
}

/// A response body read from an upstream connection; the connection goes back to the pool when
/// the body ends, and is closed when the body is dropped before.
pub struct H1Body {
    conn: Option<Box<Conn>>,
    pool: Rc<Pool>,
    framing: Framing,
    /// The head's fields as lines to send on, when they were read that way.
    lines: Option<h1codec::Lines>,
}

impl H1Body {
    /// The response's fields as lines to send on ([`RequestHead::lines`]), if read that way.
    pub fn lines(&self) -> Option<&h1codec::Lines> {
        self.lines.as_ref()
    }

    /// With the response's fields as `lines`.
    pub(super) fn with_lines(mut self, lines: Option<h1codec::Lines>) -> Self {
        self.lines = lines;
        self
    }

    /// The body announced by `len` on `conn` (given back to `pool` at its end).
    pub(super) fn new(conn: Box<Conn>, pool: Rc<Pool>, len: BodyLen) -> Self {
        let framing = match len {
            BodyLen::Empty => Framing::Done,
            BodyLen::Length(n) => Framing::Length(n),
            BodyLen::Chunked => Framing::Chunked(Chunked::default()),
            BodyLen::ToEof => Framing::ToEof,
        };
        let mut body = H1Body { conn: Some(conn), pool, framing, lines: None };
        if matches!(body.framing, Framing::Done) {
            body.finish();
        }
        body
    }

    fn finish(&mut self) {
        self.framing = Framing::Done;
        if let Some(conn) = self.conn.take() {
            Pool::release(&self.pool, conn);
        }
    }

    fn fail(&mut self, err: io::Error) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.framing = Framing::Done;
        self.conn = None;
        Poll::Ready(Some(Err(err)))
    }
}

fn cut_short() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "upstream closed the connection in the response body")
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else { return Poll::Ready(None) };
            match &mut this.framing {
                Framing::Done => return Poll::Ready(None),
                Framing::Length(left) => {
                    if !conn.rbuf.is_empty() {
                        let n = usize::try_from(*left).unwrap_or(usize::MAX).min(conn.rbuf.len());
                        let data = conn.rbuf.split_to(n).freeze();
                        *left -= n as u64;
                        if *left == 0 {
                            this.finish();
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                Framing::Chunked(dec) => match dec.decode(&mut conn.rbuf) {
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(Decoded::Done) => {
                        let trailers = dec.take_trailers();
                        this.finish();
                        return Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))));
                    }
                    Ok(Decoded::NeedMore) => {}
                    Err(e) => return this.fail(io::Error::other(e.0)),
                },
                Framing::ToEof => {
                    if !conn.rbuf.is_empty() {
                        let data = conn.rbuf.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
            }
            match conn.poll_fill(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    if matches!(this.framing, Framing::ToEof) {
                        // The end of the body: the connection is done too.
                        this.framing = Framing::Done;
                        this.conn = None;
                        return Poll::Ready(None);
                    }
                    return this.fail(cut_short());
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return this.fail(e),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.framing, Framing::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Timer;
    use std::time::Duration;

    /// Polls `timer` (epoch `epoch`, wait `after`) until it fires; how long that took.
    async fn fires_after(timer: &mut Timer, epoch: u32, after: Duration) -> Duration {
        let started = tokio::time::Instant::now();
        std::future::poll_fn(|cx| {
            if timer.expired(cx, epoch, after) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
        started.elapsed()
    }

    #[test]
    fn a_later_wait_is_not_cut_short_by_an_earlier_sleep() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        rt.block_on(async {
            let mut t = Timer::new();
            // Armed for 200 ms, then done early: the sleep stays set for 200 ms from then.
            let noop = std::task::Waker::noop();
            assert!(!t.expired(&mut std::task::Context::from_waker(noop), 1, Duration::from_millis(200)));
            t.disarm();
            tokio::time::sleep(Duration::from_millis(100)).await;
            // A new wait of 300 ms must last 300 ms, although the old sleep ends after 100.
            let waited = fires_after(&mut t, 2, Duration::from_millis(300)).await;
            assert!(waited >= Duration::from_millis(300), "fired after {waited:?}");
            // A shorter wait than what is left of the sleep moves the sleep earlier.
            let mut context = std::task::Context::from_waker(noop);
            assert!(!t.expired(&mut context, 3, Duration::from_secs(60)));
            t.disarm();
            let waited = fires_after(&mut t, 4, Duration::from_millis(50)).await;
            assert!(waited < Duration::from_secs(5), "fired after {waited:?}");
            // Restarting moves an armed wait's end later.
            assert!(!t.expired(&mut context, 5, Duration::from_millis(100)));
            tokio::time::sleep(Duration::from_millis(60)).await;
            t.restart(Duration::from_millis(200));
            let waited = fires_after(&mut t, 5, Duration::from_millis(100)).await;
            assert!(waited >= Duration::from_millis(190), "fired after {waited:?}");
        });
    }
}
