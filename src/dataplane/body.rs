//! Bodies crossing the proxy.
//!
//! Upstream-ward, [`ProxyBody`] is empty, a buffered body, or the client's own body (after the
//! part already read), pulled by the upstream connection as it writes: backpressure both ways,
//! no task or channel in between. Client-ward, [`ResponseBody`] is a whole body (plugin and
//! gateway answers) or an [`UpstreamBody`], which runs body filters, hands the upstream
//! connection back to the pool at the end, and runs the log phase when it is dropped.

use std::cell::Cell;
use std::collections::VecDeque;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::h1codec::Lines;
use super::upstream_conn::{H1Body, Timer};

/// A client's request body: from Weir's HTTP/1.1 server, hyper's HTTP/2 or an HTTP/3 stream.
pub enum ClientBody {
    /// HTTP/1.1, read from the client's connection as it is pulled.
    H1(super::h1server::RequestBody),
    /// HTTP/2, read from its stream.
    H2(super::h2server::H2Body),
    /// HTTP/3 (boxed: a QUIC stream is large, and HTTP/1.1 requests should not carry its size).
    H3(Box<super::h3::H3Body>),
}

impl From<super::h2server::H2Body> for ClientBody {
    fn from(body: super::h2server::H2Body) -> Self {
        ClientBody::H2(body)
    }
}

impl From<Box<super::h3::H3Body>> for ClientBody {
    fn from(body: Box<super::h3::H3Body>) -> Self {
        ClientBody::H3(body)
    }
}

impl ClientBody {
    /// The client's side of the connection once a `101` is written (HTTP/1.1 upgrade requests).
    pub fn take_upgrade(&self) -> Option<super::tunnel::ClientUpgrade> {
        match self {
            ClientBody::H1(b) => b.take_upgrade(),
            _ => None,
        }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ClientBody::H1(b) => Pin::new(b).poll_frame(cx).map_err(|e| Box::new(e) as BoxError),
            ClientBody::H2(b) => Pin::new(b).poll_frame(cx),
            ClientBody::H3(b) => Pin::new(&mut **b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::H1(b) => b.is_end_stream(),
            ClientBody::H2(b) => b.is_end_stream(),
            ClientBody::H3(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::H1(b) => b.size_hint(),
            ClientBody::H2(b) => b.size_hint(),
            ClientBody::H3(b) => b.size_hint(),
        }
    }
}

/// An upstream request body.
pub enum ProxyBody {
    /// No body.
    Empty,
    /// A whole body.
    Full(Option<Bytes>),
    /// The client's body, streamed (boxed: every request moves its `ProxyBody` several times
    /// on its way to the upstream connection, and most have none, so the enum stays small).
    Client(Box<ClientStream>),
}

/// The client's body as it streams upstream: `prefix` (already read) first, then the rest;
/// `len` from Content-Length when known. `wait` says whether it waits on the client (the
/// upstream read timeout does not run then), and turns to [`BodyWait::GaveUp`] when a wait
/// outlasts `idle_limit` (`gateway.client_body_timeout`), or to [`BodyWait::Failed`] when the
/// client's bytes are not a valid body: the body then ends with an error, and the request is
/// answered 408 or 400 without blaming the upstream. `received` counts the body bytes
/// read from the client so far (`$request_length`).
pub struct ClientStream {
    prefix: VecDeque<Bytes>,
    body: ClientBody,
    len: Option<u64>,
    wait: Rc<Cell<BodyWait>>,
    received: Rc<Cell<u64>>,
    idle: Timer,
    idle_limit: std::time::Duration,
}

impl ClientStream {
    /// Content-Length, when the client gave one (else the upstream gets it chunked).
    pub fn content_length(&self) -> Option<u64> {
        self.len
    }
}

/// Where a streamed client body stands, for the upstream connection that pulls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BodyWait {
    /// Bytes come (or came last time it was polled).
    #[default]
    Flowing,
    /// Waiting on the client.
    Stalled,
    /// The client sent nothing for `gateway.client_body_timeout`: the body ended in an error.
    GaveUp,
    /// The client's body was malformed (its chunked encoding) or ended before it was complete:
    /// the body ended in an error.
    Failed,
}

impl ProxyBody {
    /// The client's body, after the chunks already read (counted as received), waiting at most
    /// `idle_limit` for each of its next bytes.
    pub fn client(
        prefix: VecDeque<Bytes>,
        body: ClientBody,
        len: Option<u64>,
        idle_limit: std::time::Duration,
    ) -> Self {
        let received = Rc::new(Cell::new(prefix.iter().map(|b| b.len() as u64).sum()));
        let (wait, idle) = (Default::default(), Timer::new());
        ProxyBody::Client(Box::new(ClientStream { prefix, body, len, wait, received, idle, idle_limit }))
    }

    /// The counter of body bytes received from the client, for a streamed client body.
    pub fn received(&self) -> Option<Rc<Cell<u64>>> {
        match self {
            ProxyBody::Client(c) => Some(c.received.clone()),
            _ => None,
        }
    }

    /// Where a streamed client body stands (none for other bodies).
    pub fn wait(&self) -> Option<Rc<Cell<BodyWait>>> {
        match self {
            ProxyBody::Client(c) => Some(c.wait.clone()),
            _ => None,
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            ProxyBody::Empty => Poll::Ready(None),
            ProxyBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Client(c) => {
                let ClientStream { prefix, body, wait, received, idle, idle_limit, .. } = &mut **c;
                if let Some(b) = prefix.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                let polled = Pin::new(body).poll_frame(cx);
                wait.set(if polled.is_pending() { BodyWait::Stalled } else { BodyWait::Flowing });
                if polled.is_pending() {
                    if idle.expired(cx, 0, *idle_limit) {
                        wait.set(BodyWait::GaveUp);
                        let why = format!("client body stalled for {} s", idle_limit.as_secs());
                        return Poll::Ready(Some(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, why))));
                    }
                } else {
                    idle.disarm();
                }
                match polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Some(data) = frame.data_ref() {
                            received.set(received.get() + data.len() as u64);
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                    // A malformed or cut chunked body: the upstream request is aborted before
                    // its last chunk, so the upstream never sees a complete request.
                    Poll::Ready(Some(Err(e))) => {
                        wait.set(BodyWait::Failed);
                        Poll::Ready(Some(Err(std::io::Error::other(e.to_string()))))
                    }
                    Poll::Ready(None) => Poll::Ready(None),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Empty => true,
            ProxyBody::Full(b) => b.is_none(),
            ProxyBody::Client(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Empty => SizeHint::with_exact(0),
            ProxyBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            ProxyBody::Client(c) => c.len.map_or_else(SizeHint::default, SizeHint::with_exact),
        }
    }
}

/// Something to run when a response body is finished (or abandoned).
pub trait OnFinish: 'static {
    /// Called once, with the body filter hook for each chunk before.
    fn chunk(&mut self, _chunk: &mut Bytes, _eof: bool) {}
    /// Whether `chunk` must see the body.
    fn filters_body(&self) -> bool {
        false
    }
    /// Whether `chunk` may change the body (else the upstream's length stays announced).
    fn changes_body(&self) -> bool {
        self.filters_body()
    }
    /// The body is done (or abandoned) after `n` bytes went to the client; called before the
    /// hooks are dropped.
    fn sent(&mut self, _n: u64) {}
    /// The upstream's body was received to its end.
    fn upstream_done(&mut self) {}
    /// Fields the HTTP/1.1 server writes after those of the head's map: plugins' response
    /// fields that no header filter had to see (`Finish` leaves them where plugins put them
    /// rather than hashing each into the map).
    fn fields(&self) -> &[(HeaderName, HeaderValue)] {
        &[]
    }
}

/// A boxed finisher (the request path's `Finish` is boxed so that responses move as pointers).
impl<F: OnFinish + ?Sized> OnFinish for Box<F> {
    fn chunk(&mut self, chunk: &mut Bytes, eof: bool) {
        (**self).chunk(chunk, eof);
    }
    fn filters_body(&self) -> bool {
        (**self).filters_body()
    }
    fn changes_body(&self) -> bool {
        (**self).changes_body()
    }
    fn sent(&mut self, n: u64) {
        (**self).sent(n);
    }
    fn upstream_done(&mut self) {
        (**self).upstream_done();
    }
    fn fields(&self) -> &[(HeaderName, HeaderValue)] {
        (**self).fields()
    }
}

/// A response body towards the client.
pub enum ResponseBody<F: OnFinish> {
    /// A whole body (plugin answers, gateway errors), or none.
    Full(Option<Bytes>),
    /// The upstream's body.
    Upstream(UpstreamBody<F>),
}

/// Errors of a response body (the upstream failed mid-body).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<F: OnFinish> ResponseBody<F> {
    /// The upstream's fields as lines to send on, when its head was read that way (they go
    /// before the map's).
    pub fn lines(&self) -> Option<&Lines> {
        match self {
            ResponseBody::Upstream(UpstreamBody { inner: Inbound::H1(b), .. }) => b.lines(),
            _ => None,
        }
    }

    /// Fields to write after the head's map ([`OnFinish::fields`]).
    pub fn fields(&self) -> &[(HeaderName, HeaderValue)] {
        match self {
            ResponseBody::Full(_) => &[],
            ResponseBody::Upstream(u) => u.hooks.fields(),
        }
    }
}

impl<F: OnFinish + Unpin> Body for ResponseBody<F> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ResponseBody::Full(b) => Poll::Ready(b.take().filter(|b| !b.is_empty()).map(|b| Ok(Frame::data(b)))),
            ResponseBody::Upstream(u) => Pin::new(u).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Full(b) => b.as_ref().is_none_or(Bytes::is_empty),
            ResponseBody::Upstream(u) => u.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            ResponseBody::Upstream(u) => match u.len {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::default(),
            },
        }
    }
}

/// An upstream's response body: from an HTTP/1.1 connection of our own (which goes back to the
/// pool when the body has been read to the end; a body abandoned half-way closes it), or from
/// hyper (HTTP/2, and the handshake answer of a WebSocket tunnel).
pub enum Inbound {
    /// HTTP/1.1.
    H1(H1Body),
    /// HTTP/2 or a tunnel's connection.
    Hyper(Incoming),
}

impl Body for Inbound {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Inbound::H1(b) => Pin::new(b).poll_frame(cx).map_err(|e| Box::new(e) as BoxError),
            Inbound::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(|e| Box::new(e) as BoxError),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Inbound::H1(b) => b.is_end_stream(),
            Inbound::Hyper(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Inbound::H1(b) => b.size_hint(),
            Inbound::Hyper(b) => b.size_hint(),
        }
    }
}

/// The upstream's response body on its way to the client.
pub struct UpstreamBody<F: OnFinish> {
    inner: Inbound,
    /// Content-Length to announce (none: chunked), when no body filter changes the body.
    len: Option<u64>,
    hooks: F,
    done: bool,
    /// Body bytes handed to the client so far (told to `hooks` when the body is dropped).
    sent: u64,
    /// Trailers held back while the body filters' last bytes go first (boxed: rare, and this
    /// body is moved several times per response).
    trailers: Option<Box<http::HeaderMap>>,
}

impl<F: OnFinish> Drop for UpstreamBody<F> {
    fn drop(&mut self) {
        self.hooks.sent(self.sent);
    }
}

impl<F: OnFinish> UpstreamBody<F> {
    /// Wraps `inner`; `len` is the upstream's Content-Length.
    pub fn new(inner: Inbound, len: Option<u64>, hooks: F) -> Self {
        let len = len.filter(|_| !hooks.changes_body());
        UpstreamBody { inner, len, hooks, done: false, sent: 0, trailers: None }
    }

    /// The upstream body was read to the end.
    fn finished(&mut self) {
        if !self.done {
            self.hooks.upstream_done();
        }
        self.done = true;
    }
}

impl<F: OnFinish + Unpin> Body for UpstreamBody<F> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(*t))));
        }
        loop {
            // Read timeouts are enforced on the upstream socket (see `client`).
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.finished();
                    if this.hooks.filters_body() {
                        let mut last = Bytes::new();
                        this.hooks.chunk(&mut last, true);
                        if !last.is_empty() {
                            this.sent += last.len() as u64;
                            return Poll::Ready(Some(Ok(Frame::data(last))));
                        }
                    }
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => {
                    let mut data = match frame.into_data() {
                        Ok(data) => data,
                        // Trailers (gRPC's status) pass through as they are; they end the body,
                        // after what the body filters still had to say.
                        Err(frame) if frame.is_trailers() => {
                            if this.hooks.filters_body() {
                                this.finished();
                                let mut last = Bytes::new();
                                this.hooks.chunk(&mut last, true);
                                if !last.is_empty() {
                                    this.trailers = frame.into_trailers().ok().map(Box::new);
                                    this.sent += last.len() as u64;
                                    return Poll::Ready(Some(Ok(Frame::data(last))));
                                }
                            }
                            return Poll::Ready(Some(Ok(frame)));
                        }
                        Err(_) => continue,
                    };
                    if this.hooks.filters_body() {
                        this.hooks.chunk(&mut data, false);
                    }
                    if this.inner.is_end_stream() {
                        // The last bytes of a body of known length: the server will not ask for
                        // more (the connection went back to the pool with them), and once the
                        // announced length is written it stops polling, so the end is told now.
                        this.finished();
                        if this.hooks.filters_body() {
                            let mut last = Bytes::new();
                            this.hooks.chunk(&mut last, true);
                            if !last.is_empty() {
                                data = [data, last].concat().into();
                            }
                        }
                    }
                    if data.is_empty() {
                        if this.done {
                            return Poll::Ready(None);
                        }
                        continue;
                    }
                    this.sent += data.len() as u64;
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Trailers held back behind a body filter's last bytes are still to come.
        self.done && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.len {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
