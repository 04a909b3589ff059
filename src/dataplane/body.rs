//! Bodies crossing the proxy.
//!
//! Upstream-ward, [`ProxyBody`] is empty (no body channel for body-less requests: that costs
//! throughput), a buffered body, or a bounded channel fed from the client connection. Client-ward,
//! [`UpstreamBody`] streams hyper's body into actix, runs body filters, hands the upstream
//! connection back to the pool at the end, and runs the log phase when it is dropped.

use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

use super::client::{Conn, Pool};

/// An upstream request body.
pub enum ProxyBody {
    /// No body.
    Empty,
    /// A whole body.
    Full(Option<Bytes>),
    /// Streamed from the client; `len` from Content-Length when known. `stalled` is set while
    /// the channel waits on the client (the upstream read timeout does not run then).
    Channel { rx: mpsc::Receiver<Result<Bytes, std::io::Error>>, len: Option<u64>, stalled: Rc<Cell<bool>> },
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            ProxyBody::Empty => Poll::Ready(None),
            ProxyBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Channel { rx, stalled, .. } => {
                let polled = rx.poll_recv(cx);
                stalled.set(polled.is_pending());
                match polled {
                    Poll::Ready(Some(Ok(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
                    Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
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
            ProxyBody::Channel { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Empty => SizeHint::with_exact(0),
            ProxyBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            ProxyBody::Channel { len: Some(n), .. } => SizeHint::with_exact(*n),
            ProxyBody::Channel { len: None, .. } => SizeHint::default(),
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
}

/// The upstream's response body on its way to the client. Its connection goes back to the pool
/// when the body has been read to the end; a body abandoned half-way closes it.
pub struct UpstreamBody<F: OnFinish> {
    inner: hyper::body::Incoming,
    size: BodySize,
    hooks: F,
    conn: Option<(Conn, Rc<Pool>)>,
    done: bool,
}

impl<F: OnFinish> UpstreamBody<F> {
    /// Wraps `inner`; `len` is the Content-Length to announce (when no filter changes the body).
    pub fn new(inner: hyper::body::Incoming, len: Option<u64>, hooks: F, conn: Conn, pool: Rc<Pool>) -> Self {
        let size = match len {
            Some(n) if !hooks.filters_body() => BodySize::Sized(n),
            _ => BodySize::Stream,
        };
        UpstreamBody { inner, size, hooks, conn: Some((conn, pool)), done: false }
    }
}

impl<F: OnFinish + Unpin> MessageBody for UpstreamBody<F> {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.size
    }

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        loop {
            // Read timeouts are enforced on the upstream socket (see `client`).
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.done = true;
                    if let Some((conn, pool)) = this.conn.take() {
                        pool.release(conn);
                    }
                    if this.hooks.filters_body() {
                        let mut last = Bytes::new();
                        this.hooks.chunk(&mut last, true);
                        if !last.is_empty() {
                            return Poll::Ready(Some(Ok(last)));
                        }
                    }
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(mut data) = frame.into_data() else { continue };
                    if this.hooks.filters_body() {
                        this.hooks.chunk(&mut data, false);
                    }
                    if data.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(data)));
                }
            }
        }
    }
}
