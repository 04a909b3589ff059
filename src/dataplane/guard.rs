//! The client socket as the HTTP server sees it: every byte passes [`Framer`] first.
//!
//! Request heads are held back until they are complete and valid; a refused one never reaches
//! the server. The refusal (JSON, `connection: close`) is written when the server closes the
//! connection, after any response it was still writing, and is logged at debug level with the
//! client's address: client errors never reach the error log. Bodies with a `Content-Length`
//! are read straight into the server's buffer; only heads and chunked bodies are copied once.
//! While a connection is idle between requests it holds no buffer of its own.
//!
//! Parking: when a connection has had no request in flight and no byte to read for a whole
//! [`PARK_AFTER`], the server is shown the end of the stream (and its shutdown is not passed on),
//! so that it ends and frees its buffers; the socket stays open, held by [`Guarded`] alone, until
//! the client sends again ([`Guarded::wait_parked`]) and a new server connection takes it up.
//! An idle keep-alive client then costs a socket and this struct, not the server's 16 KiB.
#![allow(unsafe_code)] // each block says why it is sound (SAFETY)

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::framing::{Fed, Framer, Refusal};

/// Bytes read from the socket per call when the framer must look at them.
const READ_CHUNK: usize = 4096;

/// How long a connection must be idle (no request in flight, nothing to read, nothing left to
/// write) before it is parked. Parking and unparking cost a server connection's setup, so a
/// client sending requests back to back never parks.
pub const PARK_AFTER: Duration = Duration::from_secs(1);

/// How long a client may take to send a request head (nginx's `client_header_timeout`): counted
/// in park periods in which no request began, none was in flight and nothing was going out, so
/// it costs no timer of its own (hyper's header timer cost a timer-wheel entry per request).
/// Precise to a period; a parked wait is bounded by the server (`serve_h1`).
pub const HEAD_TIMEOUT: Duration = super::HEADER_TIMEOUT;
const HEAD_WAIT_PERIODS: u32 = (HEAD_TIMEOUT.as_secs() / PARK_AFTER.as_secs()) as u32;

/// What the server shares with the connection's socket: requests in flight, and requests begun
/// (to tell a connection that stayed idle from one that was busy in between).
#[derive(Default)]
pub struct Activity {
    in_flight: AtomicU32,
    begun: AtomicU32,
}

impl Activity {
    /// A request begins; it is in flight until the returned guard is dropped (with the response
    /// body, or with the request when the client goes away first).
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.begun.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }
}

/// A request in flight (see [`Activity::begin`]).
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A client connection behind the framing check.
pub struct Guarded<S> {
    stream: S,
    peer: SocketAddr,
    framer: Framer,
    /// Received, not yet judged (an incomplete head, or bytes after it).
    held: Vec<u8>,
    /// Judged and passed, not yet read by the server.
    passed: Vec<u8>,
    passed_at: usize,
    /// A refusal still to be written (then the connection is shut down).
    refusal: Option<(Vec<u8>, usize)>,
    eof: bool,
    activity: Arc<Activity>,
    /// Runs while the server waits for the client; `begun` as it was when it was last (re)armed.
    park_timer: Option<(Pin<Box<tokio::time::Sleep>>, u32)>,
    /// The server was shown the end of the stream to park the connection.
    parked: bool,
    /// The socket refused the last write (the server still holds bytes for it).
    write_blocked: bool,
    /// Bytes written and not yet flushed.
    unflushed: bool,
    /// Park periods in a row in which the client owed a request head (see [`HEAD_TIMEOUT`]).
    head_wait: u32,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Guarded<S> {
    /// Wraps an accepted connection (plain or TLS) from `peer`.
    pub fn new(stream: S, peer: SocketAddr, activity: Arc<Activity>) -> Self {
        Guarded {
            stream,
            peer,
            framer: Framer::default(),
            held: Vec::new(),
            passed: Vec::new(),
            passed_at: 0,
            refusal: None,
            eof: false,
            activity,
            park_timer: None,
            parked: false,
            write_blocked: false,
            unflushed: false,
            head_wait: 0,
        }
    }

    /// Whether the server was ended to park the connection (see the module documentation).
    pub fn parked(&self) -> bool {
        self.parked
    }

    /// While parked: waits for the client's next bytes, holding no buffer until they arrive, and
    /// judges them. `false` when the client closed the connection instead.
    pub async fn wait_parked(&mut self) -> io::Result<bool> {
        let more = std::future::poll_fn(|cx| {
            // On the stack only while polled: a parked connection keeps no buffer.
            let mut tmp = [std::mem::MaybeUninit::<u8>::uninit(); READ_CHUNK];
            let mut buf = ReadBuf::uninit(&mut tmp);
            std::task::ready!(Pin::new(&mut self.stream).poll_read(cx, &mut buf))?;
            if buf.filled().is_empty() {
                return Poll::Ready(Ok::<_, io::Error>(false));
            }
            self.held.extend_from_slice(buf.filled());
            Poll::Ready(Ok(true))
        })
        .await?;
        self.parked = false;
        if more {
            self.judge();
        }
        Ok(more)
    }

    /// Nothing in flight either way, nothing buffered: the server is only waiting for the client.
    fn idle(&self) -> bool {
        self.framer.between_requests()
            && self.held.is_empty()
            && self.passed_at == self.passed.len()
            && self.refusal.is_none()
            && !self.eof
            && !self.write_blocked
            && !self.unflushed
            && self.activity.in_flight.load(Ordering::Relaxed) == 0
    }

    /// The socket has nothing to read: `Ready` (the end of the stream, for the server) when the
    /// connection has been idle for [`PARK_AFTER`] and is to be parked, else `Pending`. The timer
    /// is armed whenever the server waits for the client, also with a response still going out:
    /// the response may finish after this read, and nothing else would look again.
    fn poll_park(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let begun = self.activity.begun.load(Ordering::Relaxed);
        let idle = self.idle();
        let quiet = self.activity.in_flight.load(Ordering::Relaxed) == 0 && !self.write_blocked && !self.unflushed;
        let Some((sleep, armed_at)) = &mut self.park_timer else {
            let mut sleep = Box::pin(tokio::time::sleep(PARK_AFTER));
            let _ = sleep.as_mut().poll(cx);
            self.park_timer = Some((sleep, begun));
            return Poll::Pending;
        };
        // The sleep was polled, its waker registered, when it was last armed: the timer wakes
        // this task when it fires, and until then a look at its state is enough.
        if !sleep.is_elapsed() {
            return Poll::Pending;
        }
        if *armed_at == begun && idle {
            // Idle for a whole period.
            self.park_timer = None;
            self.parked = true;
            self.head_wait = 0;
            return Poll::Ready(Ok(()));
        }
        // A whole period with no request begun or in flight and nothing going out: the client
        // owes a request head (a partial one is held, or bytes are waiting to be read).
        self.head_wait = if *armed_at == begun && quiet { self.head_wait + 1 } else { 0 };
        if self.head_wait >= HEAD_WAIT_PERIODS {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no complete request head within {} s", HEAD_TIMEOUT.as_secs()),
            )));
        }
        // Busy in between, or still: look again a period from now (one timer reset per period,
        // not one per request).
        *armed_at = begun;
        sleep.as_mut().reset(tokio::time::Instant::now() + PARK_AFTER);
        let _ = sleep.as_mut().poll(cx);
        Poll::Pending
    }

    /// Notes how a write went (see [`Guarded::idle`]).
    fn wrote(&mut self, polled: &Poll<io::Result<usize>>) {
        self.write_blocked = polled.is_pending();
        if let Poll::Ready(Ok(n)) = polled {
            self.unflushed |= *n > 0;
        }
    }

    fn refuse(&mut self, r: Refusal) {
        log::debug!("client {}: request refused ({} {})", self.peer, r.status, r.reason);
        self.refusal = Some((r.response(), 0));
        self.held = Vec::new();
    }

    /// Judges `held`: moves what may go on to `passed`.
    fn judge(&mut self) {
        match self.framer.feed(&self.held) {
            Fed::Pass(n) => {
                if self.passed_at == self.passed.len() {
                    self.passed.clear();
                    self.passed_at = 0;
                }
                self.passed.extend_from_slice(&self.held[..n]);
                self.held.drain(..n);
            }
            Fed::Refuse { pass, refusal } => {
                self.passed.extend_from_slice(&self.held[..pass]);
                self.refuse(refusal);
            }
        }
        if self.held.is_empty() && self.held.capacity() > 0 && self.framer.between_requests() {
            // Idle between requests: keep no buffer.
            self.held = Vec::new();
        }
    }
}

/// Reads from `stream` into the unfilled part of `buf`, at most `limit` bytes, without zeroing
/// it first; returns how many bytes arrived (they are initialized, not yet filled).
fn read_uninit<S: AsyncRead + Unpin>(
    stream: &mut S,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
    limit: usize,
) -> Poll<io::Result<usize>> {
    // SAFETY: the slice is only handed to a ReadBuf, which never de-initializes bytes.
    let unfilled = unsafe { buf.unfilled_mut() };
    let limit = limit.min(unfilled.len());
    let mut part = ReadBuf::uninit(&mut unfilled[..limit]);
    std::task::ready!(Pin::new(stream).poll_read(cx, &mut part))?;
    let n = part.filled().len();
    // SAFETY: the read initialized these `n` bytes of `buf`'s unfilled part.
    unsafe { buf.assume_init(n) };
    Poll::Ready(Ok(n))
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.passed_at < this.passed.len() {
                let n = (this.passed.len() - this.passed_at).min(buf.remaining());
                buf.put_slice(&this.passed[this.passed_at..this.passed_at + n]);
                this.passed_at += n;
                if this.passed_at == this.passed.len() {
                    this.passed = Vec::new();
                    this.passed_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.refusal.is_some() || this.eof {
                // The server sees the end of the stream, closes, and the refusal is written then.
                return Poll::Ready(Ok(()));
            }
            if this.held.is_empty() {
                // Read straight into the server's buffer, then judge the bytes where they lie:
                // the common case (whole heads, bodies of known length) copies nothing.
                let limit = this.framer.length_left().map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
                let n = match read_uninit(&mut this.stream, cx, buf, limit) {
                    Poll::Ready(n) => n?,
                    Poll::Pending => return this.poll_park(cx),
                };
                if n == 0 {
                    this.eof = true;
                    return Poll::Ready(Ok(()));
                }
                let start = buf.filled().len();
                // SAFETY: `read_uninit` initialized these bytes just past the filled part.
                let fresh = unsafe { std::slice::from_raw_parts(buf.inner_mut().as_ptr().add(start).cast::<u8>(), n) };
                match this.framer.feed(fresh) {
                    Fed::Pass(k) => {
                        this.held.extend_from_slice(&fresh[k..]);
                        buf.advance(k);
                        if k > 0 {
                            return Poll::Ready(Ok(()));
                        }
                    }
                    Fed::Refuse { pass, refusal } => {
                        // Earlier pipelined requests still go; the refused one and all after it not.
                        buf.advance(pass);
                        this.refuse(refusal);
                        if pass > 0 {
                            return Poll::Ready(Ok(()));
                        }
                    }
                }
                continue;
            }
            // An incomplete head is held: read more after it and judge it whole.
            this.held.reserve(READ_CHUNK);
            let len = this.held.len();
            let mut part = ReadBuf::uninit(this.held.spare_capacity_mut());
            let polled = Pin::new(&mut this.stream).poll_read(cx, &mut part);
            let n = part.filled().len();
            // SAFETY: the read initialized `n` bytes of the spare capacity.
            unsafe { this.held.set_len(len + n) };
            match polled {
                // An incomplete head: the park timer counts how long it takes.
                Poll::Pending => return this.poll_park(cx),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if n == 0 => {
                    // End of the client's stream: what is held is an incomplete head.
                    this.eof = true;
                    this.held = Vec::new();
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Ok(())) => this.judge(),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.wrote(&polled);
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.wrote(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_flush(cx);
        if let Poll::Ready(Ok(())) = polled {
            this.unflushed = false;
        }
        polled
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.parked {
            // The server ends because the connection is parked: the socket stays open.
            return Poll::Ready(Ok(()));
        }
        if let Some((bytes, at)) = &mut this.refusal {
            while *at < bytes.len() {
                let n = std::task::ready!(Pin::new(&mut this.stream).poll_write(cx, &bytes[*at..]))?;
                if n == 0 {
                    break;
                }
                *at += n;
            }
        }
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn guarded(server: tokio::io::DuplexStream) -> Guarded<tokio::io::DuplexStream> {
        Guarded::new(server, SocketAddr::from(([127, 0, 0, 1], 1)), Arc::new(Activity::default()))
    }

    /// Reads until the guard answers with an error; how long that took.
    async fn time_to_error(g: &mut Guarded<tokio::io::DuplexStream>) -> (io::Error, Duration) {
        let started = tokio::time::Instant::now();
        let mut buf = [0u8; 256];
        loop {
            match g.read(&mut buf).await {
                Ok(0) => panic!("the guard showed the end of the stream instead of a timeout"),
                Ok(_) => {}
                Err(e) => return (e, started.elapsed()),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_incomplete_head_ends_the_connection_after_the_head_timeout() {
        let (mut client, server) = tokio::io::duplex(4096);
        let mut g = guarded(server);
        client.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").await.expect("write");
        let (err, waited) = time_to_error(&mut g).await;
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(waited >= HEAD_TIMEOUT - PARK_AFTER && waited <= HEAD_TIMEOUT + 2 * PARK_AFTER, "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_sent_a_byte_at_a_time_is_bounded_all_the_same() {
        let (mut client, server) = tokio::io::duplex(4096);
        let mut g = guarded(server);
        let trickle = tokio::spawn(async move {
            let _ = client.write_all(b"GET / HTTP/1.1\r\nX-Slow: ").await;
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_secs(5)).await;
                if client.write_all(b"a").await.is_err() {
                    return;
                }
            }
        });
        let (err, waited) = time_to_error(&mut g).await;
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(waited <= HEAD_TIMEOUT + 2 * PARK_AFTER, "{waited:?}");
        trickle.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_parks_after_a_period() {
        let (_client, server) = tokio::io::duplex(4096);
        let mut g = guarded(server);
        let started = tokio::time::Instant::now();
        let mut buf = [0u8; 16];
        assert_eq!(g.read(&mut buf).await.expect("parks"), 0);
        assert!(g.parked());
        assert!(started.elapsed() >= PARK_AFTER && started.elapsed() <= 3 * PARK_AFTER, "{:?}", started.elapsed());
    }
}
