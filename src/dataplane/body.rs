//! Bodies crossing the proxy.
//!
//! Upstream-ward, [`ProxyBody`] is empty (no body channel for body-less requests: that costs
//! throughput), a buffered body, or a bounded channel fed from the client connection (actix's
//! payload is not `Send`, hyper's client needs a `Send` body). Client-ward, [`UpstreamBody`]
//! streams hyper's body into actix, runs body filters, and runs the log phase when it is done.

use std::pin::Pin;
use std::task::{Context, Poll};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

/// An upstream request body.
pub enum ProxyBody {
    /// No body.
    Empty,
    /// A whole body.
    Full(Option<Bytes>),
    /// Streamed from the client; `len` from Content-Length when known.
    Channel { rx: mpsc::Receiver<Result<Bytes, std::io::Error>>, len: Option<u64> },
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            ProxyBody::Empty => Poll::Ready(None),
            ProxyBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Channel { rx, .. } => match rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
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

/// The upstream's response body on its way to the client.
pub struct UpstreamBody<F: OnFinish> {
    inner: hyper::body::Incoming,
    size: BodySize,
    hooks: F,
    read_timeout: std::time::Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    done: bool,
}

impl<F: OnFinish> UpstreamBody<F> {
    /// Wraps `inner`; `len` is the Content-Length to announce (when no filter changes the body).
    pub fn new(inner: hyper::body::Incoming, len: Option<u64>, hooks: F, read_timeout: std::time::Duration) -> Self {
        let size = match len {
            Some(n) if !hooks.filters_body() => BodySize::Sized(n),
            _ => BodySize::Stream,
        };
        UpstreamBody { inner, size, hooks, read_timeout, timer: None, done: false }
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
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => {
                    // Read timeout between two reads from the upstream, as nginx's proxy_read_timeout.
                    let timeout = this.read_timeout;
                    let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                    if timer.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Some(Err("upstream read timed out".into())));
                    }
                    return Poll::Pending;
                }
                Poll::Ready(frame) => {
                    this.timer = None;
                    match frame {
                        None => {
                            this.done = true;
                            if this.hooks.filters_body() {
                                let mut last = Bytes::new();
                                this.hooks.chunk(&mut last, true);
                                if !last.is_empty() {
                                    return Poll::Ready(Some(Ok(last)));
                                }
                            }
                            return Poll::Ready(None);
                        }
                        Some(Err(e)) => return Poll::Ready(Some(Err(Box::new(e)))),
                        Some(Ok(frame)) => {
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
    }
}

use std::future::Future;
