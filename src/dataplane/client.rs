//! Upstream connections: connect (TCP, then TLS) under `timeout.connect`, and a per-worker LIFO
//! pool of HTTP/1.1 connections that honours `keepalive_pool` (`size`, `idle_timeout` to the
//! second, `requests`); one shared HTTP/2 connection per gRPC node (hyper's). The HTTP/1.1 exchange
//! itself, with nginx's send and read timeouts, is `upstream_conn`'s.
//!
//! Whether any byte of a request reached the upstream is reported with every failure
//! ([`SendError::sent`]), so that the caller never retries a non-idempotent request that an
//! upstream may already have acted on. A pooled connection found closed before the request was
//! written gives the request back and the next connection is tried; an idempotent request with
//! a replayable body whose pooled connection was closed under it (no byte of an answer came) is
//! sent once more on a new connection, as nginx does for its cached connections.

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
use hyper::client::conn::http2;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::body::{BodyWait, ProxyBody};
use super::h1codec::ResponseHead;
use super::upstream_conn::{Conn, H1Body, RequestHead};
use crate::tables::upstream::{PoolKey, PoolSettings, Timeouts};

/// A failed exchange.
pub struct SendError {
    /// Whether some of the request may have reached the upstream.
    pub sent: bool,
    /// A timeout (504) rather than an error (502).
    pub timeout: bool,
    /// What happened, for the log.
    pub reason: String,
    /// The request body, when none of the request was written (it can be sent elsewhere).
    pub body: Option<ProxyBody>,
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

/// An idle connection in the pool.
struct Idle {
    conn: Box<Conn>,
    /// When it went idle, by the pool's coarse clock (up to a second early). The sweeper
    /// enforces `idle_timeout` once a second: a connection is closed up to a second early, or
    /// reused up to a second past it.
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
    /// The idle sweeper runs (it stops when the pool is empty).
    sweeping: Cell<bool>,
    /// The time of the sweeper's last round, while it runs: when connections are released, a
    /// coarse clock (idle timeouts are enforced to the second) that costs no clock read.
    now: Cell<Option<Instant>>,
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
    fn checkout(&self, key: &PoolKey, settings: &PoolSettings) -> Option<Box<Conn>> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(key)?;
        // The idle timeout is the sweeper's to enforce (once a second): no clock read here.
        while let Some(mut c) = list.pop() {
            if c.conn.is_open() {
                c.conn.settings = *settings;
                return Some(c.conn);
            }
        }
        None
    }

    /// Takes back a connection whose response was read to the end.
    pub fn release(pool: &Rc<Pool>, mut conn: Box<Conn>) {
        conn.served += 1;
        let settings = conn.settings;
        if conn.served >= settings.requests || !conn.reusable() || settings.size == 0 {
            return;
        }
        let since = match (pool.sweeping.get(), pool.now.get()) {
            (true, Some(now)) => now,
            _ => {
                let now = Instant::now();
                pool.now.set(Some(now));
                now
            }
        };
        let mut idle = pool.idle.borrow_mut();
        let list = match idle.get_mut(&conn.key) {
            Some(list) => list,
            None => idle.entry(conn.key.clone()).or_default(),
        };
        if list.len() >= settings.size {
            // Full: the least recently used connection goes (nginx's upstream keepalive).
            list.remove(0);
        }
        list.push(Idle { conn, since });
        drop(idle);
        if !pool.sweeping.replace(true) {
            let weak = Rc::downgrade(pool);
            tokio::task::spawn_local(sweep(weak));
        }
    }

    /// Closes idle connections past their idle timeout or closed by the upstream; false once
    /// none is left.
    fn sweep(&self) -> bool {
        let now = Instant::now();
        self.now.set(Some(now));
        let mut idle = self.idle.borrow_mut();
        idle.retain(|_, list| {
            list.retain_mut(|c| {
                let keep = now.duration_since(c.since) < c.conn.settings.idle_timeout && c.conn.is_open();
                if keep {
                    // Idle for up to a second: its read buffer goes (memory follows requests).
                    c.conn.shed();
                }
                keep
            });
            !list.is_empty()
        });
        let any = !idle.is_empty();
        if !any {
            self.sweeping.set(false);
        }
        any
    }

    async fn connect(&self, key: &PoolKey) -> io::Result<Stream> {
        let tcp = TcpStream::connect(key.addr).await?;
        tcp.set_nodelay(true)?;
        match &key.tls {
            None => Ok(Stream::Plain(tcp)),
            Some(tls) => {
                let name = ServerName::try_from(tls.name.to_string())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
                let connector = match &tls.client {
                    Some(client) => TlsConnector::from(client.configs[usize::from(key.h2)].clone()),
                    None => self.tls_connector(tls.verify, key.h2),
                };
                let tls = connector.connect(name, tcp).await?;
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
                let fail = |reason: String, timeout: bool| SendError { sent: false, timeout, reason, body: None };
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
            return Err(SendError { sent: false, timeout: false, reason: describe(&e), body: None });
        }
        match tokio::time::timeout(t.read, sender.send_request(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(SendError { sent: true, timeout: is_timeout(&e), reason: describe(&e), body: None }),
            Err(_) => Err(SendError {
                sent: true,
                timeout: true,
                reason: format!("no response head within {:?}", t.read),
                body: None,
            }),
        }
    }

    /// Sends a request on a pooled connection of `key`, or on a new one, and reads the response
    /// head; its body streams from the connection. `stalled` is set while the request body waits
    /// on the client. `replay`: the request may be sent again when a pooled connection turns
    /// out to be closed under it (an idempotent request).
    #[allow(clippy::too_many_arguments)]
    pub async fn send(
        pool: &Rc<Pool>,
        key: &PoolKey,
        settings: PoolSettings,
        t: &Timeouts,
        head: &RequestHead<'_>,
        mut body: ProxyBody,
        stalled: Option<Rc<Cell<BodyWait>>>,
        replay: bool,
    ) -> Result<http::Response<H1Body>, SendError> {
        let replayable = replay && !matches!(body, ProxyBody::Client(_));
        while let Some(mut conn) = pool.checkout(key, &settings) {
            let copy = if replayable { Some(clone_body(&body)) } else { None };
            match conn.exchange(head, body, t, stalled.clone()).await {
                Ok(answer) => return Ok(response(conn, pool, answer)),
                // Closed before the request was written: nothing was sent, try the next one.
                Err(SendError { body: Some(back), .. }) => body = back,
                // Closed under the request before any answer: once more on a new connection.
                Err(e) if !e.timeout && !conn.heard() && copy.is_some() => {
                    body = copy.unwrap_or(ProxyBody::Empty);
                    log::debug!("pooled connection to {} closed under a request: {}", key.addr, e.reason);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let stream = match tokio::time::timeout(t.connect, pool.connect(key)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(SendError {
                    sent: false,
                    timeout: e.kind() == io::ErrorKind::TimedOut,
                    reason: format!("connect failed: {e}"),
                    body: Some(body),
                })
            }
            Err(_) => {
                return Err(SendError {
                    sent: false,
                    timeout: true,
                    reason: format!("connect timed out after {:?}", t.connect),
                    body: Some(body),
                })
            }
        };
        let mut conn = Conn::new(stream, key.clone(), settings);
        let answer = conn.exchange(head, body, t, stalled).await?;
        Ok(response(conn, pool, answer))
    }
}

/// A second copy of a replayable body.
fn clone_body(body: &ProxyBody) -> ProxyBody {
    match body {
        ProxyBody::Full(b) => ProxyBody::Full(b.clone()),
        _ => ProxyBody::Empty,
    }
}

/// The response of `head`, its body read from `conn`.
fn response(conn: Box<Conn>, pool: &Rc<Pool>, head: ResponseHead) -> http::Response<H1Body> {
    let body = H1Body::new(conn, pool.clone(), head.body).with_lines(head.lines);
    let mut resp = http::Response::new(body);
    *resp.status_mut() = head.status;
    *resp.version_mut() = head.version;
    *resp.headers_mut() = head.headers;
    resp
}

/// Runs the pool's sweeper every second while it holds idle connections.
async fn sweep(pool: std::rc::Weak<Pool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match pool.upgrade() {
            Some(p) if p.sweep() => {}
            _ => return,
        }
    }
}
