//! The client socket and its read buffer, shared (on the connection's own task) by the server
//! loop, which reads request heads and writes responses, and by the request body the proxy
//! pulls ([`RequestBody`]). Nothing is held across an await: each side borrows for one poll.
//!
//! A body outlived by its request (kept by a plugin) reads nothing of the next one: every
//! request has its own number, and a body whose number is not the connection's current one
//! has ended.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use super::super::framing::BodyFraming;
use super::super::h1codec::{Chunked, Decoded};
use super::super::tunnel::{ClientUpgrade, Upgraded};

/// Bytes asked of the socket per read.
pub(super) const READ_CHUNK: usize = 8 * 1024;
/// What a client that sent `Expect: 100-continue` is told when its body is wanted.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The request body on the wire, as far as it has been read.
#[derive(Debug)]
pub(super) enum Framing {
    /// None, or read to its end.
    Done,
    /// Bytes left by `Content-Length`.
    Length(u64),
    /// Chunked.
    Chunked(Chunked),
    /// The body was malformed or cut: the connection carries no further request.
    Broken,
}

/// The connection state both sides share.
pub(super) struct Conn<S> {
    /// The socket; `None` once it was handed to a WebSocket tunnel.
    pub io: Option<S>,
    /// Received, not yet used: the rest of a head, body bytes, pipelined requests.
    pub buf: BytesMut,
    /// The current request's number.
    pub request: u32,
    /// Its body.
    pub body: Framing,
    /// Bytes of `100 Continue` still to write before the body is read (0: none owed).
    pub continue_left: usize,
    /// Whether `100 Continue` was written for the current request.
    pub continued: bool,
    /// The current request's response head has begun to go out: a `100 Continue` owed and not
    /// begun is dropped (it would land inside the response).
    responded: bool,
    /// The client ended its side of the connection.
    pub eof: bool,
    /// A bodiless upgrade request: the server hands the socket over through `upgrade_tx` after
    /// a `101`, to the tunnel that took `upgrade_rx` (boxed: rare).
    pub upgrade_tx: Option<oneshot::Sender<Upgraded>>,
    upgrade_rx: Option<oneshot::Receiver<Upgraded>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    pub fn new(io: S) -> Self {
        Conn {
            io: Some(io),
            buf: BytesMut::new(),
            request: 0,
            body: Framing::Done,
            continue_left: 0,
            continued: false,
            responded: false,
            eof: false,
            upgrade_tx: None,
            upgrade_rx: None,
        }
    }

    /// A new request begins with `framing`; its client may wait for `100 Continue`.
    pub fn begin(&mut self, framing: BodyFraming, expect_continue: bool, upgrade: bool) {
        self.request = self.request.wrapping_add(1);
        self.body = match framing {
            BodyFraming::Length(n) => Framing::Length(n),
            BodyFraming::Chunked => Framing::Chunked(Chunked::default()),
            BodyFraming::None | BodyFraming::Upgrade => Framing::Done,
        };
        let owed = expect_continue && !matches!(self.body, Framing::Done);
        self.continue_left = if owed { CONTINUE.len() } else { 0 };
        self.continued = false;
        self.responded = false;
        (self.upgrade_tx, self.upgrade_rx) = match upgrade {
            true => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
    }

    /// While parked: waits for the client's next bytes, reading them into a buffer on the
    /// stack (a parked connection keeps none of its own). `false` when the client closed.
    pub fn poll_wake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        let Some(io) = self.io.as_mut() else { return Poll::Ready(Ok(false)) };
        let mut tmp = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut rb = ReadBuf::uninit(&mut tmp);
        std::task::ready!(Pin::new(io).poll_read(cx, &mut rb))?;
        if rb.filled().is_empty() {
            self.eof = true;
            return Poll::Ready(Ok(false));
        }
        self.buf.extend_from_slice(rb.filled());
        Poll::Ready(Ok(true))
    }

    /// Reads what the socket has into `buf` (at most [`READ_CHUNK`] more); `Ok(0)` at the end of
    /// the client's stream.
    pub fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Some(io) = self.io.as_mut() else { return Poll::Ready(Ok(0)) };
        if self.eof {
            return Poll::Ready(Ok(0));
        }
        self.buf.reserve(READ_CHUNK);
        let spare = self.buf.spare_capacity_mut();
        let spare_len = spare.len().min(READ_CHUNK);
        let mut rb = ReadBuf::uninit(&mut spare[..spare_len]);
        std::task::ready!(Pin::new(io).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        // SAFETY: the read initialized `n` bytes of the spare capacity.
        #[allow(unsafe_code)]
        unsafe {
            self.buf.set_len(self.buf.len() + n)
        };
        if n == 0 {
            self.eof = true;
        }
        Poll::Ready(Ok(n))
    }

    /// The response head is about to be written: what is owed of `100 Continue` is settled.
    /// Returns the bytes of one begun and not finished, which must go out first; one not begun
    /// is dropped (the connection then ends after the response: the client may still send the
    /// body, or wait for a go-ahead that never comes).
    pub fn start_response(&mut self) -> &'static [u8] {
        self.responded = true;
        let left = std::mem::take(&mut self.continue_left);
        if left == 0 || left == CONTINUE.len() {
            return &[];
        }
        self.continued = true;
        &CONTINUE[CONTINUE.len() - left..]
    }

    /// Writes what is left of `100 Continue`.
    fn poll_continue(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.responded {
            return Poll::Ready(Ok(()));
        }
        while self.continue_left > 0 {
            let Some(io) = self.io.as_mut() else { return Poll::Ready(Err(io::ErrorKind::NotConnected.into())) };
            let at = CONTINUE.len() - self.continue_left;
            let n = std::task::ready!(Pin::new(&mut *io).poll_write(cx, &CONTINUE[at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.continue_left -= n;
            if self.continue_left == 0 {
                self.continued = true;
                std::task::ready!(Pin::new(io).poll_flush(cx))?;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// The next piece of the current request's body.
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        if let Err(e) = std::task::ready!(self.poll_continue(cx)) {
            self.body = Framing::Broken;
            return Poll::Ready(Some(Err(e)));
        }
        loop {
            match &mut self.body {
                Framing::Done => return Poll::Ready(None),
                Framing::Broken => return Poll::Ready(Some(Err(incomplete()))),
                Framing::Length(left) if !self.buf.is_empty() => {
                    let n = usize::try_from(*left).unwrap_or(usize::MAX).min(self.buf.len());
                    let data = self.buf.split_to(n).freeze();
                    *left -= n as u64;
                    if *left == 0 {
                        self.body = Framing::Done;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Framing::Length(_) => {}
                Framing::Chunked(chunked) => match chunked.decode(&mut self.buf) {
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(Decoded::Done) => {
                        let trailers = chunked.take_trailers();
                        self.body = Framing::Done;
                        if let Some(t) = trailers {
                            return Poll::Ready(Some(Ok(Frame::trailers(t))));
                        }
                        return Poll::Ready(None);
                    }
                    Ok(Decoded::NeedMore) => {}
                    Err(e) => {
                        self.body = Framing::Broken;
                        return Poll::Ready(Some(Err(io::Error::new(io::ErrorKind::InvalidData, e.0))));
                    }
                },
            }
            match std::task::ready!(self.poll_fill(cx)) {
                Ok(0) => {
                    self.body = Framing::Broken;
                    return Poll::Ready(Some(Err(incomplete())));
                }
                Ok(_) => {}
                Err(e) => {
                    self.body = Framing::Broken;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    /// Whether what is left of the current request's body can be read and dropped (at most
    /// `limit` bytes more, and the client is not waiting for a `100 Continue` it never got), so
    /// that the connection may carry the next request.
    pub fn body_discardable(&self, limit: u64) -> bool {
        match self.body {
            Framing::Done => true,
            Framing::Broken => false,
            _ if self.continue_left > 0 => false,
            Framing::Length(left) => left <= limit,
            // Its length is unknown: the answer could not say beforehand that the connection
            // survives it.
            Framing::Chunked(_) => false,
        }
    }

    /// Reads the rest of the current request's body and drops it, when it is at most `limit`
    /// bytes more: `true` when the next request may follow on this connection.
    pub async fn discard_body(this: &RefCell<Self>, limit: u64) -> bool {
        let mut dropped = 0u64;
        loop {
            {
                let conn = this.borrow();
                if matches!(conn.body, Framing::Done) {
                    return true;
                }
                // A client still waiting for `100 Continue` never sends the body: the
                // connection cannot carry another request it would recognize.
                if !conn.body_discardable(limit.saturating_sub(dropped)) {
                    return false;
                }
            }
            match poll_fn(|cx| this.borrow_mut().poll_body(cx)).await {
                None => return true,
                Some(Ok(frame)) => dropped += frame.data_ref().map_or(0, |d| d.len() as u64),
                Some(Err(_)) => return false,
            }
            if dropped > limit {
                return false;
            }
        }
    }
}

fn incomplete() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "the request body ended before it was complete")
}

/// What [`RequestBody`] needs of its connection, whatever its socket type.
trait Source {
    fn poll_body(&self, request: u32, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>>;
    /// `(done, bytes left by length)` for the request numbered `request`.
    fn state(&self, request: u32) -> (bool, Option<u64>);
    fn take_upgrade(&self, request: u32) -> Option<ClientUpgrade>;
}

impl<S: AsyncRead + AsyncWrite + Unpin> Source for RefCell<Conn<S>> {
    fn poll_body(&self, request: u32, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        let mut conn = self.borrow_mut();
        if conn.request != request {
            return Poll::Ready(Some(Err(io::Error::other("the request this body belongs to has ended"))));
        }
        conn.poll_body(cx)
    }

    fn state(&self, request: u32) -> (bool, Option<u64>) {
        let conn = self.borrow();
        match conn.body {
            _ if conn.request != request => (true, None),
            Framing::Done => (true, Some(0)),
            Framing::Length(n) => (false, Some(n)),
            Framing::Chunked(_) | Framing::Broken => (false, None),
        }
    }

    fn take_upgrade(&self, request: u32) -> Option<ClientUpgrade> {
        let mut conn = self.borrow_mut();
        if conn.request != request {
            return None;
        }
        conn.upgrade_rx.take()
    }
}

/// An HTTP/1.1 request's body, read from its connection as the proxy pulls it (the client is
/// sent `100 Continue` on the first pull when it asked for one).
pub struct RequestBody {
    conn: Rc<dyn Source>,
    request: u32,
}

impl RequestBody {
    pub(super) fn new<S: AsyncRead + AsyncWrite + Unpin + 'static>(conn: &Rc<RefCell<Conn<S>>>) -> Self {
        let request = conn.borrow().request;
        RequestBody { conn: conn.clone(), request }
    }

    /// The client's side of the connection after a `101`, for a bodiless upgrade request (once).
    pub fn take_upgrade(&self) -> Option<ClientUpgrade> {
        self.conn.take_upgrade(self.request)
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        self.conn.poll_body(self.request, cx)
    }

    fn is_end_stream(&self) -> bool {
        self.conn.state(self.request).0
    }

    fn size_hint(&self) -> SizeHint {
        match self.conn.state(self.request).1 {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
