//! The client socket as the HTTP server sees it: every byte passes [`Framer`] first.
//!
//! Request heads are held back until they are complete and valid; a refused one never reaches
//! the server. The refusal (JSON, `connection: close`) is written when the server closes the
//! connection, after any response it was still writing, and is logged at debug level with the
//! client's address: client errors never reach the error log. Bodies with a `Content-Length`
//! are read straight into the server's buffer; only heads and chunked bodies are copied once.
//! While a connection is idle between requests it holds no buffer of its own.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::framing::{Fed, Framer, Refusal};

/// Bytes read from the socket per call when the framer must look at them.
const READ_CHUNK: usize = 4096;

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
}

impl<S: AsyncRead + AsyncWrite + Unpin> Guarded<S> {
    /// Wraps an accepted connection (plain or TLS) from `peer`.
    pub fn new(stream: S, peer: SocketAddr) -> Self {
        Guarded {
            stream,
            peer,
            framer: Framer::default(),
            held: Vec::new(),
            passed: Vec::new(),
            passed_at: 0,
            refusal: None,
            eof: false,
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
                let n = std::task::ready!(read_uninit(&mut this.stream, cx, buf, limit))?;
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
                Poll::Pending => return Poll::Pending,
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
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
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
