//! Upstream connections: connect (TCP, then TLS) under `timeout.connect`, HTTP/1.1 over hyper's
//! connection API, nginx's send and read timeouts enforced on the socket itself, and a per-worker
//! LIFO pool that honours `keepalive_pool` (`size`, `idle_timeout`, `requests`).
//!
//! Timeouts follow nginx: `send` bounds each write that makes no progress (`proxy_send_timeout`),
//! `read` bounds each wait for bytes from the upstream, the response head included, once the
//! request has been handed over (`proxy_read_timeout`); neither is a budget for the whole
//! exchange. While the request body waits on a slow client, no read timer runs.
//!
//! Whether any byte of a request reached the upstream is reported with every failure
//! ([`SendError::sent`]), so that the caller never retries a non-idempotent request that an
//! upstream may already have acted on. A pooled connection found closed before the request was
//! written gives the request back and the next connection is tried.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::client::conn::http2;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::body::ProxyBody;
use crate::tables::upstream::{PoolKey, PoolSettings, Timeouts};

/// A failed exchange.
pub struct SendError {
    /// Whether some of the request may have reached the upstream.
    pub sent: bool,
    /// A timeout (504) rather than an error (502).
    pub timeout: bool,
    /// What happened, for the log.
    pub reason: String,
    /// The request, when it was never handed to a connection (it can be sent elsewhere as is).
    pub request: Option<http::Request<ProxyBody>>,
}

/// State shared between a connection's socket wrapper and the request using it.
struct IoState {
    /// A request is in flight.
    active: Cell<bool>,
    /// Bumped when a request starts or ends, so that a timer armed before re-arms.
    epoch: Cell<u32>,
    send: Cell<Duration>,
    read: Cell<Duration>,
    idle: Duration,
    /// Set while the request body waits on the client (no read timer then).
    client_stalled: RefCell<Option<Rc<Cell<bool>>>>,
}

impl IoState {
    fn begin(&self, t: &Timeouts, stalled: Option<Rc<Cell<bool>>>) {
        self.send.set(t.send);
        self.read.set(t.read);
        *self.client_stalled.borrow_mut() = stalled;
        self.active.set(true);
        self.epoch.set(self.epoch.get().wrapping_add(1));
    }
    fn end(&self) {
        self.active.set(false);
        self.client_stalled.borrow_mut().take();
        self.epoch.set(self.epoch.get().wrapping_add(1));
    }
    fn stalled(&self) -> bool {
        self.client_stalled.borrow().as_ref().is_some_and(|s| s.get())
    }
}

/// A connected socket, plain or TLS.
pub enum Stream {
    /// Cleartext.
    Plain(TcpStream),
    /// TLS.
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Runs hyper's background tasks (HTTP/2 streams) on the worker's own thread: the request path
/// is not `Send`.
#[derive(Clone, Copy, Debug)]
pub struct LocalExec;

impl<F: Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

/// A timer armed on first use and reused, never reallocated, afterwards.
///
/// Arming records a deadline; the tokio sleep is only moved when it would wake the task too
/// late. A sleep left from an earlier, earlier-ending wait wakes the task before the deadline,
/// and is then moved on to it: a request's timeouts cost a clock read, not a timer-wheel update
/// (callgrind: three resets per proxied request before).
struct Timer {
    sleep: Option<Pin<Box<Sleep>>>,
    /// The epoch it was armed in (None: disarmed).
    armed: Option<u32>,
    /// When the armed wait ends (meaningful while armed).
    deadline: tokio::time::Instant,
}

impl Timer {
    fn new() -> Self {
        Timer { sleep: None, armed: None, deadline: tokio::time::Instant::now() }
    }
    fn disarm(&mut self) {
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
    fn expired(&mut self, cx: &mut Context<'_>, epoch: u32, after: Duration) -> bool {
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

/// The socket of an upstream connection with nginx's send/read timeouts and the pool's idle
/// timeout.
struct TimedIo {
    stream: Stream,
    state: Rc<IoState>,
    read_timer: Timer,
    write_timer: Timer,
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_owned())
}

impl AsyncRead for TimedIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if polled.is_ready() {
            this.read_timer.disarm();
            return polled;
        }
        let state = &this.state;
        let epoch = state.epoch.get();
        if !state.active.get() {
            // Idle in the pool: close once the idle timeout passes (EOF ends the connection).
            if this.read_timer.expired(cx, epoch, state.idle) {
                return Poll::Ready(Ok(()));
            }
        } else if state.stalled() {
            this.read_timer.disarm();
        } else if this.read_timer.expired(cx, epoch, state.read.get()) {
            return Poll::Ready(Err(timed_out("upstream read timed out")));
        }
        Poll::Pending
    }
}

impl TimedIo {
    /// `wrote`: bytes were written (a flush that had nothing to do is not progress).
    fn write_progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
        wrote: impl Fn(&T) -> bool,
    ) -> Poll<io::Result<T>> {
        if let Poll::Ready(r) = &polled {
            self.write_timer.disarm();
            if r.as_ref().is_ok_and(wrote) && self.state.active.get() {
                // Progress on the request restarts the wait for the answer.
                self.read_timer.restart(self.state.read.get());
            }
            return polled;
        }
        if self.write_timer.expired(cx, self.state.epoch.get(), self.state.send.get()) {
            return Poll::Ready(Err(timed_out("upstream send timed out")));
        }
        Poll::Pending
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.write_progress(cx, polled, |n| *n > 0)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.write_progress(cx, polled, |n| *n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_flush(cx);
        this.write_progress(cx, polled, |_| false)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// A connection serving one request; hand it back with [`Pool::release`] once the response is
/// fully read.
pub struct Conn {
    key: PoolKey,
    sender: SendRequest<ProxyBody>,
    state: Rc<IoState>,
    served: u32,
    settings: PoolSettings,
}

struct Idle {
    sender: SendRequest<ProxyBody>,
    state: Rc<IoState>,
    served: u32,
    since: Instant,
}

/// FNV-1a: the pool's keys are ours (addresses), not the client's, so a keyed hash buys nothing
/// and SipHash costs twice per request.
#[derive(Default)]
pub struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 { 0xcbf2_9ce4_8422_2325 } else { self.0 };
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<Fnv>>;

/// Per-worker upstream connections (the worker's runtime is single-threaded: no locks).
#[derive(Default)]
pub struct Pool {
    idle: RefCell<FastMap<PoolKey, Vec<Idle>>>,
    /// One multiplexed connection per HTTP/2 (gRPC) node.
    h2: RefCell<FastMap<PoolKey, http2::SendRequest<ProxyBody>>>,
    /// Connectors by `(verify, h2)`.
    tls: RefCell<[Option<TlsConnector>; 4]>,
}

/// Whether an error (or one of its causes) is a timeout.
fn is_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if e.downcast_ref::<io::Error>().is_some_and(|io| io.kind() == io::ErrorKind::TimedOut) {
            return true;
        }
        cur = e.source();
    }
    false
}

/// Error text with its causes.
fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}

impl Pool {
    fn tls_connector(&self, verify: bool, h2: bool) -> TlsConnector {
        let mut slots = self.tls.borrow_mut();
        slots[usize::from(verify) + 2 * usize::from(h2)]
            .get_or_insert_with(|| {
                let mut config = crate::tls::client_config(verify);
                config.alpn_protocols = vec![if h2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
                TlsConnector::from(Arc::new(config))
            })
            .clone()
    }

    /// The most recently used idle connection of `key` that is still usable.
    fn checkout(&self, key: &PoolKey, settings: &PoolSettings) -> Option<Idle> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(key)?;
        while let Some(c) = list.pop() {
            if !c.sender.is_closed() && c.since.elapsed() < settings.idle_timeout {
                return Some(c);
            }
        }
        None
    }

    /// Returns a connection whose response was read to the end.
    pub fn release(&self, conn: Conn) {
        conn.state.end();
        let served = conn.served + 1;
        if served >= conn.settings.requests || conn.sender.is_closed() || conn.settings.size == 0 {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let list = idle.entry(conn.key).or_default();
        if list.len() >= conn.settings.size {
            // Full: the least recently used connection goes (nginx's upstream keepalive).
            list.remove(0);
        }
        list.push(Idle { sender: conn.sender, state: conn.state, served, since: Instant::now() });
    }

    async fn connect(&self, key: &PoolKey) -> io::Result<Stream> {
        let tcp = TcpStream::connect(key.addr).await?;
        tcp.set_nodelay(true)?;
        match &key.tls {
            None => Ok(Stream::Plain(tcp)),
            Some((name, verify)) => {
                let name = ServerName::try_from(name.to_string())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
                let tls = self.tls_connector(*verify, key.h2).connect(name, tcp).await?;
                Ok(Stream::Tls(Box::new(tls)))
            }
        }
    }

    /// A new connection of `key` for a tunnel (WebSocket): never pooled.
    pub async fn connect_tunnel(&self, key: &PoolKey, timeout: Duration) -> Result<Stream, String> {
        match tokio::time::timeout(timeout, self.connect(key)).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(format!("connect failed: {e}")),
            Err(_) => Err(format!("connect timed out after {timeout:?}")),
        }
    }

    /// Sends `req` over the node's shared HTTP/2 connection (made on first use). `timeout.read`
    /// bounds the wait for the response head; streaming bodies may then idle (gRPC streams).
    pub async fn send_h2(
        &self,
        key: &PoolKey,
        t: &Timeouts,
        req: http::Request<ProxyBody>,
    ) -> Result<http::Response<Incoming>, SendError> {
        let shared = self.h2.borrow().get(key).filter(|s| !s.is_closed()).cloned();
        let mut sender = match shared {
            Some(s) => s,
            None => {
                let fail = |reason: String, timeout: bool| SendError { sent: false, timeout, reason, request: None };
                let stream = match tokio::time::timeout(t.connect, self.connect(key)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => return Err(fail(format!("connect failed: {e}"), false)),
                    Err(_) => return Err(fail(format!("connect timed out after {:?}", t.connect), true)),
                };
                let mut builder = http2::Builder::new(LocalExec);
                builder
                    .timer(hyper_util::rt::TokioTimer::new())
                    .keep_alive_interval(Duration::from_secs(30))
                    .keep_alive_timeout(Duration::from_secs(10))
                    .keep_alive_while_idle(false);
                let (sender, connection) = match builder.handshake(TokioIo::new(stream)).await {
                    Ok(pair) => pair,
                    Err(e) => return Err(fail(describe(&e), false)),
                };
                tokio::task::spawn_local(async move {
                    if let Err(e) = connection.await {
                        log::debug!("upstream HTTP/2 connection closed: {e}");
                    }
                });
                self.h2.borrow_mut().insert(key.clone(), sender.clone());
                sender
            }
        };
        if let Err(e) = sender.ready().await {
            self.h2.borrow_mut().remove(key);
            return Err(SendError { sent: false, timeout: false, reason: describe(&e), request: None });
        }
        match tokio::time::timeout(t.read, sender.send_request(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(SendError { sent: true, timeout: is_timeout(&e), reason: describe(&e), request: None }),
            Err(_) => Err(SendError {
                sent: true,
                timeout: true,
                reason: format!("no response head within {:?}", t.read),
                request: None,
            }),
        }
    }

    /// Sends `req` on a pooled connection of `key`, or on a new one. `stalled` is set while the
    /// request body waits on the client.
    pub async fn send(
        &self,
        key: &PoolKey,
        settings: PoolSettings,
        t: &Timeouts,
        mut req: http::Request<ProxyBody>,
        stalled: Option<Rc<Cell<bool>>>,
    ) -> Result<(http::Response<Incoming>, Conn), SendError> {
        while let Some(mut idle) = self.checkout(key, &settings) {
            idle.state.begin(t, stalled.clone());
            match idle.sender.try_send_request(req).await {
                Ok(resp) => {
                    let conn = Conn {
                        key: key.clone(),
                        sender: idle.sender,
                        state: idle.state,
                        served: idle.served,
                        settings,
                    };
                    return Ok((resp, conn));
                }
                Err(mut e) => match e.take_message() {
                    // Closed before the request was written: nothing was sent, try the next one.
                    Some(back) => req = back,
                    None => {
                        let err = e.into_error();
                        return Err(SendError {
                            sent: true,
                            timeout: is_timeout(&err),
                            reason: describe(&err),
                            request: None,
                        });
                    }
                },
            }
        }
        let stream = match tokio::time::timeout(t.connect, self.connect(key)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(SendError {
                    sent: false,
                    timeout: e.kind() == io::ErrorKind::TimedOut,
                    reason: format!("connect failed: {e}"),
                    request: Some(req),
                })
            }
            Err(_) => {
                return Err(SendError {
                    sent: false,
                    timeout: true,
                    reason: format!("connect timed out after {:?}", t.connect),
                    request: Some(req),
                })
            }
        };
        let state = Rc::new(IoState {
            active: Cell::new(false),
            epoch: Cell::new(0),
            send: Cell::new(t.send),
            read: Cell::new(t.read),
            idle: settings.idle_timeout,
            client_stalled: RefCell::new(None),
        });
        let io = TimedIo { stream, state: state.clone(), read_timer: Timer::new(), write_timer: Timer::new() };
        let (mut sender, connection) = match http1::Builder::new().handshake(TokioIo::new(io)).await {
            Ok(pair) => pair,
            Err(e) => return Err(SendError { sent: false, timeout: false, reason: describe(&e), request: Some(req) }),
        };
        actix_web::rt::spawn(async move {
            if let Err(e) = connection.await {
                log::debug!("upstream connection closed: {e}");
            }
        });
        state.begin(t, stalled);
        match sender.try_send_request(req).await {
            Ok(resp) => Ok((resp, Conn { key: key.clone(), sender, state, served: 0, settings })),
            Err(mut e) => {
                let back = e.take_message();
                let err = e.into_error();
                Err(SendError {
                    sent: back.is_none(),
                    timeout: is_timeout(&err),
                    reason: describe(&err),
                    request: back,
                })
            }
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
