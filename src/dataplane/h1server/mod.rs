//! Weir's HTTP/1.1 server connection (RFC 9112), plain or over TLS, driven by the connection's
//! own task: no second task, no channel, and one parse of each request head.
//!
//! A request goes: the head is read into the connection's buffer and parsed once by the strict
//! framer ([`super::framing::parse_head`]: every smuggling shape is refused with a JSON 400
//! before anything else sees it), then becomes the request (`head`: target and values are
//! slices of the bytes read). The proxy pulls the body from the same buffer and socket
//! (`conn::RequestBody`, with `100 Continue` sent on the first pull when the client asked). The
//! response head is encoded into the connection's write buffer and the body follows it
//! (`respond`). Then the rest of an unread body is dropped (or the connection closed) and the
//! next request is read; pipelined requests are answered in order.
//!
//! While it waits for a head, a connection has one timer, re-armed once a second (never per
//! request). A client idle for [`PARK_AFTER`] is parked: its buffers are freed, it joins the
//! worker's [`super::idle`] set, and it waits on the bare socket, holding a few hundred bytes,
//! until it sends again (or [`super::HEADER_TIMEOUT`] passes, or the worker needs the
//! descriptor). A head still incomplete after [`HEAD_TIMEOUT`] ends the connection.
//!
//! A client that closes its side while its request is handled is gone: the request is dropped
//! (logged 499, as nginx does), unless it still sends a body. A bodiless upgrade request that
//! is answered `101` hands the socket, and any bytes after the head, to its tunnel; answered
//! otherwise, the connection closes (what follows may be another protocol).

mod conn;
mod head;
mod respond;

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Sleep;

use conn::Conn;
pub use conn::RequestBody;
pub use head::{take_head, Asks};
pub(crate) use respond::with_date;
use respond::{respond, write_all, Sent};

use super::body::ClientBody;
use super::framing::{skip_empty_lines, BodyFraming, Refusal};
use super::proxy::{self, ConnInfo, Worker};
use super::tunnel::Upgraded;
use crate::metrics::Raised;
use crate::state::Gateway;

/// How long a connection must wait for the client, with nothing of a request read, before it
/// is parked. Parking and waking cost a buffer each, so a client sending requests back to back
/// never parks.
pub const PARK_AFTER: Duration = Duration::from_secs(1);

/// How long a client may take to send a request head (nginx's `client_header_timeout`),
/// counted in [`PARK_AFTER`] periods in which no request began: precise to a period.
pub const HEAD_TIMEOUT: Duration = super::HEADER_TIMEOUT;
const HEAD_WAIT_PERIODS: u32 = (HEAD_TIMEOUT.as_secs() / PARK_AFTER.as_secs()) as u32;

/// Most bytes of an unread request body (a plugin answered without it) read and dropped to keep
/// the connection for the next request; a longer rest closes it (nginx discards bodies too).
pub(crate) const DISCARD_LIMIT: u64 = 1 << 20;
/// How long dropping that rest may take (nginx's `lingering_timeout`).
pub(crate) const DISCARD_TIME: Duration = Duration::from_secs(5);

/// A client connection's transport, as the server parks it.
pub trait Io: AsyncRead + AsyncWrite + Unpin + 'static {
    /// The plain TCP socket under it, which parks outside any task
    /// ([`super::idle::IdleSet::park_socket`]); otherwise itself back (TLS keeps its session in
    /// the task).
    fn detach(self) -> Result<TcpStream, Self>
    where
        Self: Sized,
    {
        Err(self)
    }
}

impl Io for TcpStream {
    fn detach(self) -> Result<TcpStream, Self> {
        Ok(self)
    }
}

impl Io for tokio_rustls::server::TlsStream<TcpStream> {}

/// Serves HTTP/1.1 on `stream` until the client leaves, idles out, or the worker stops.
/// `keep` lives as long as the connection, parked or not (the worker's count of open ones).
pub async fn serve<S: Io, K: 'static>(
    stream: S,
    info: ConnInfo,
    gateway: Arc<Gateway>,
    worker: Rc<Worker>,
    mut stopped: watch::Receiver<bool>,
    keep: K,
) {
    let conn = Rc::new(RefCell::new(Conn::new(stream)));
    loop {
        // Boxed: awake, a connection holds its request's future (several KiB), its timer, its
        // write buffer and its watch on the stop signal; parked, none of them (the worker's idle
        // set closes it on a stop or at its idle limit). The box is made once per wake, not
        // per request.
        if !Box::pin(awake(&conn, &info, &gateway, &worker, &mut stopped)).await {
            return;
        }
        conn.borrow_mut().buf = BytesMut::new();
        // A plain TCP connection leaves its task, which ends here: the idle set keeps the
        // socket and starts a new task when the client sends again.
        if worker.idle.takes_sockets() {
            let io = conn.borrow_mut().io.take();
            match io.map(S::detach) {
                Some(Ok(tcp)) => return park_socket(tcp, info, gateway, worker, stopped, keep),
                Some(Err(io)) => conn.borrow_mut().io = Some(io),
                None => return,
            }
        }
        if let Err(why) = park(&conn, &worker).await {
            log::debug!("client {}: {why}", info.peer);
            return;
        }
    }
}

/// Hands an idle plain TCP connection to the worker's idle set, with what starts its task
/// again ([`serve`]) when its client sends.
fn park_socket<K: 'static>(
    tcp: TcpStream,
    info: ConnInfo,
    gateway: Arc<Gateway>,
    worker: Rc<Worker>,
    stopped: watch::Receiver<bool>,
    keep: K,
) {
    let socket = match tcp.into_std() {
        Ok(socket) => socket,
        Err(e) => {
            log::debug!("client {}: parking failed: {e}", info.peer);
            return;
        }
    };
    let until = parked_until();
    let idle = ParkedGauge::new(worker);
    let worker = idle.0.clone();
    let resume = Box::new(move |socket: std::net::TcpStream| {
        let worker = idle.0.clone();
        drop(idle);
        match TcpStream::from_std(socket) {
            Ok(tcp) => {
                tokio::task::spawn_local(serve(tcp, info, gateway, worker, stopped, keep));
            }
            Err(e) => log::debug!("client {}: resuming failed: {e}", info.peer),
        }
    });
    worker.idle.park_socket(socket, until, resume);
}

/// How long a connection parking now may stay idle: what is left of [`super::HEADER_TIMEOUT`]
/// after the period it waited awake.
fn parked_until() -> tokio::time::Instant {
    tokio::time::Instant::now() + super::HEADER_TIMEOUT.saturating_sub(PARK_AFTER)
}

/// Counts a connection parked outside its task in the worker's `parked` and `parked_sockets`
/// gauges while it lives.
struct ParkedGauge(Rc<Worker>);

impl ParkedGauge {
    fn new(worker: Rc<Worker>) -> Self {
        crate::metrics::bump(&worker.stats.parked, 1);
        crate::metrics::bump(&worker.stats.parked_sockets, 1);
        ParkedGauge(worker)
    }
}

impl Drop for ParkedGauge {
    fn drop(&mut self) {
        crate::metrics::bump(&self.0.stats.parked, -1);
        crate::metrics::bump(&self.0.stats.parked_sockets, -1);
    }
}

/// Serves requests until the connection idles for a period (`true`: park it) or ends.
async fn awake<S>(
    conn: &Rc<RefCell<Conn<S>>>,
    info: &ConnInfo,
    gateway: &Gateway,
    worker: &Worker,
    stopped: &mut watch::Receiver<bool>,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let peer = info.peer;
    let mut stop = pin!(stopped.wait_for(|s| *s));
    let mut out = Vec::new();
    let mut clock = Clock::default();
    loop {
        let (req, asks) = match next_head(conn, &mut clock, stop.as_mut()).await {
            Next::Head(req, asks) => (req, asks),
            Next::Park => return true,
            Next::Refused(refusal) => {
                log::debug!("client {peer}: request refused ({} {})", refusal.status, refusal.reason);
                out.clear();
                out.extend_from_slice(&refusal.response());
                let _ = write_all(conn, &mut out, None).await;
                close(conn).await;
                return false;
            }
            Next::End(why) => {
                if let Some(why) = why {
                    log::debug!("client {peer}: {why}");
                }
                close(conn).await;
                return false;
            }
        };
        let upgrade = asks.framing == BodyFraming::Upgrade;
        conn.borrow_mut().begin(asks.framing, asks.expect_continue, upgrade);
        clock.begun = clock.begun.wrapping_add(1);
        let req = req.map(|()| ClientBody::H1(RequestBody::new(conn)));
        let watch = matches!(asks.framing, BodyFraming::None | BodyFraming::Upgrade);
        let handled = pin!(proxy::handle(req, info.clone(), gateway, worker));
        let Some(mut resp) = until_client_leaves(conn, handled, watch).await else {
            log::debug!("client {peer}: closed the connection before the response");
            return false;
        };
        let handover = conn.borrow_mut().upgrade_tx.take();
        if worker.draining.get() && resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
            // Stopping: this client's next request goes to a new connection (and process).
            resp.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
        }
        // A body too long to drop, or one the client still holds back, ends the connection:
        // the answer says so.
        let mut asks = asks;
        asks.keep_alive &= conn.borrow().body_discardable(DISCARD_LIMIT);
        match respond(conn, &mut out, resp, &asks).await {
            Ok(Sent::Done(true)) if !upgrade => {}
            Ok(Sent::Done(_)) => {
                close(conn).await;
                return false;
            }
            Ok(Sent::Upgraded) => {
                let mut c = conn.borrow_mut();
                let (io, prefix) = (c.io.take(), c.buf.split().freeze());
                if let (Some(io), Some(tx)) = (io, handover) {
                    let _ = tx.send(Upgraded { io: Box::new(io), prefix });
                }
                return false;
            }
            Err(e) => {
                log::debug!("client {peer}: response not completed: {e}");
                return false;
            }
        }
        // Bounded in time too: a client that stops sending its body is let go.
        let drained = tokio::time::timeout(DISCARD_TIME, Conn::discard_body(conn, DISCARD_LIMIT)).await;
        if !drained.unwrap_or(false) {
            close(conn).await;
            return false;
        }
    }
}

/// Runs `handled` to its response, unless the client closes the connection first (`None`).
/// Only a request without a body is watched: a body's reader sees the end itself.
async fn until_client_leaves<S, F>(conn: &RefCell<Conn<S>>, mut handled: Pin<&mut F>, watch: bool) -> Option<F::Output>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Future,
{
    poll_fn(|cx| {
        if let Poll::Ready(resp) = handled.as_mut().poll(cx) {
            return Poll::Ready(Some(resp));
        }
        if watch {
            let mut c = conn.borrow_mut();
            // Bytes that arrive (a pipelined request) are kept for later, and the watch ends.
            if c.buf.is_empty() && !c.eof {
                if let Poll::Ready(Ok(0) | Err(_)) = c.poll_fill(cx) {
                    return Poll::Ready(None);
                }
            }
        }
        Poll::Pending
    })
    .await
}

/// Shuts the connection down (a TLS close_notify, then FIN), within a second.
async fn close<S: AsyncRead + AsyncWrite + Unpin>(conn: &RefCell<Conn<S>>) {
    let shutdown = poll_fn(|cx| match conn.borrow_mut().io.as_mut() {
        Some(io) => Pin::new(io).poll_shutdown(cx),
        None => Poll::Ready(Ok(())),
    });
    let _ = tokio::time::timeout(PARK_AFTER, shutdown).await;
}

/// What waiting for a request head came to.
// Returned once per request and taken apart at once: a box would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Next {
    /// A complete head.
    Head(http::Request<()>, Asks),
    /// Idle for a whole period: park.
    Park,
    /// The head is refused.
    Refused(Refusal),
    /// The connection ends (the client closed it, an error, the head timeout, a stop), with
    /// why when it is worth a debug line.
    End(Option<String>),
}

/// The connection's one timer while it waits for the client (see the module documentation).
#[derive(Default)]
struct Clock {
    sleep: Option<Pin<Box<Sleep>>>,
    /// Requests begun on this connection, and as many when the timer was last armed.
    begun: u32,
    armed_at: u32,
    /// Periods in a row in which the client owed a request head.
    head_wait: u32,
    /// The worker is stopping: the client has this period to send a request already on its way.
    stopping: bool,
    /// Empty lines came since the last request head.
    blank: bool,
}

/// What the timer says.
enum Alarm {
    Park,
    End(Option<String>),
}

impl Clock {
    fn poll(&mut self, cx: &mut Context<'_>, nothing_read: bool) -> Poll<Alarm> {
        let Some(sleep) = &mut self.sleep else {
            let mut sleep = Box::pin(tokio::time::sleep(PARK_AFTER));
            let _ = sleep.as_mut().poll(cx);
            self.sleep = Some(sleep);
            self.armed_at = self.begun;
            return Poll::Pending;
        };
        // Polled when it was armed: it wakes the task when it fires, and until then a look at
        // its state is enough.
        if !sleep.is_elapsed() {
            return Poll::Pending;
        }
        if self.stopping {
            return Poll::Ready(Alarm::End(None));
        }
        let quiet = self.armed_at == self.begun;
        if quiet && nothing_read {
            // Parked connections hold no timer.
            self.sleep = None;
            self.head_wait = 0;
            return Poll::Ready(Alarm::Park);
        }
        self.head_wait = if quiet { self.head_wait + 1 } else { 0 };
        if self.head_wait >= HEAD_WAIT_PERIODS {
            let why = format!("no complete request head within {} s", HEAD_TIMEOUT.as_secs());
            return Poll::Ready(Alarm::End(Some(why)));
        }
        // Busy in between, or a head on its way: look again a period from now (one timer reset
        // per period, not one per request).
        self.armed_at = self.begun;
        sleep.as_mut().reset(tokio::time::Instant::now() + PARK_AFTER);
        let _ = sleep.as_mut().poll(cx);
        Poll::Pending
    }

    /// The worker stops: wait one more period at most.
    fn stop(&mut self, cx: &mut Context<'_>) {
        self.stopping = true;
        let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(PARK_AFTER)));
        sleep.as_mut().reset(tokio::time::Instant::now() + PARK_AFTER);
        let _ = sleep.as_mut().poll(cx);
    }
}

/// Reads until a request head is complete, or the wait ends.
async fn next_head<S, F>(conn: &RefCell<Conn<S>>, clock: &mut Clock, mut stop: Pin<&mut F>) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Future,
{
    poll_fn(|cx| loop {
        let mut c = conn.borrow_mut();
        // Empty lines before a request line are ignored, but they are no request: a client
        // sending only them still owes a head within the head timeout (it never parks).
        let blank = skip_empty_lines(&c.buf);
        if blank > 0 {
            c.buf.advance(blank);
            clock.blank = true;
        }
        match take_head(&mut c.buf) {
            Ok(Some((req, asks))) => {
                clock.blank = false;
                return Poll::Ready(Next::Head(req, asks));
            }
            Ok(None) => {}
            Err(refusal) => return Poll::Ready(Next::Refused(refusal)),
        }
        match c.poll_fill(cx) {
            Poll::Ready(Ok(0)) => {
                let why = (!c.buf.is_empty()).then(|| "closed the connection inside a request head".to_owned());
                return Poll::Ready(Next::End(why));
            }
            Poll::Ready(Ok(_)) => continue,
            Poll::Ready(Err(e)) => return Poll::Ready(Next::End(Some(e.to_string()))),
            Poll::Pending => {}
        }
        let nothing_read = c.buf.is_empty() && !clock.blank;
        drop(c);
        if !clock.stopping && stop.as_mut().poll(cx).is_ready() {
            if nothing_read {
                // Between requests: a request already on the wire gets a period to arrive.
                clock.stop(cx);
            } else {
                clock.stopping = true;
            }
        }
        return match clock.poll(cx, nothing_read) {
            Poll::Ready(Alarm::Park) => Poll::Ready(Next::Park),
            Poll::Ready(Alarm::End(why)) => Poll::Ready(Next::End(why)),
            Poll::Pending => Poll::Pending,
        };
    })
    .await
}

/// Waits, parked, for the client's next bytes (`Ok`), until the worker's idle set closes the
/// connection: at its idle limit (what is left of [`super::HEADER_TIMEOUT`]), on a stop, or to
/// make room when descriptors run out.
async fn park<S: AsyncRead + AsyncWrite + Unpin>(conn: &RefCell<Conn<S>>, worker: &Worker) -> Result<(), String> {
    let _parked = Raised::new(&worker.stats.parked);
    let until = parked_until();
    let place = worker.idle.park(until);
    let woken = poll_fn(|cx| conn.borrow_mut().poll_wake(cx));
    tokio::select! {
        r = woken => match r {
            Ok(true) => Ok(()),
            Ok(false) => Err("closed while idle".to_owned()),
            Err(e) => Err(format!("waiting for the next request failed: {e}")),
        },
        why = place.closed() => Err(why.why().to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn conn(server: tokio::io::DuplexStream) -> RefCell<Conn<tokio::io::DuplexStream>> {
        RefCell::new(Conn::new(server))
    }

    /// Waits for heads until the wait ends otherwise; how it ended and how long it took.
    async fn wait_for_end(c: &RefCell<Conn<tokio::io::DuplexStream>>) -> (&'static str, Option<String>, Duration) {
        let started = tokio::time::Instant::now();
        let mut clock = Clock::default();
        let mut never = pin!(std::future::pending::<()>());
        loop {
            match next_head(c, &mut clock, never.as_mut()).await {
                Next::Head(..) => clock.begun += 1,
                Next::Park => return ("park", None, started.elapsed()),
                Next::Refused(r) => return ("refused", Some(r.reason.to_owned()), started.elapsed()),
                Next::End(why) => return ("end", why, started.elapsed()),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_incomplete_head_ends_the_connection_after_the_head_timeout() {
        let (mut client, server) = tokio::io::duplex(4096);
        let c = conn(server);
        client.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").await.expect("write");
        let (how, why, waited) = wait_for_end(&c).await;
        assert_eq!(how, "end");
        assert!(why.is_some_and(|w| w.contains("no complete request head")));
        assert!(waited >= HEAD_TIMEOUT - PARK_AFTER && waited <= HEAD_TIMEOUT + 2 * PARK_AFTER, "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_sent_a_byte_at_a_time_is_bounded_all_the_same() {
        let (mut client, server) = tokio::io::duplex(4096);
        let c = conn(server);
        let trickle = tokio::spawn(async move {
            let _ = client.write_all(b"GET / HTTP/1.1\r\nX-Slow: ").await;
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_secs(5)).await;
                if client.write_all(b"a").await.is_err() {
                    return;
                }
            }
        });
        let (how, _, waited) = wait_for_end(&c).await;
        assert_eq!(how, "end");
        assert!(waited <= HEAD_TIMEOUT + 2 * PARK_AFTER, "{waited:?}");
        trickle.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_parks_after_a_period() {
        let (_client, server) = tokio::io::duplex(4096);
        let c = conn(server);
        let (how, _, waited) = wait_for_end(&c).await;
        assert_eq!(how, "park");
        assert!(waited >= PARK_AFTER && waited <= 3 * PARK_AFTER, "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn empty_lines_alone_do_not_keep_a_connection_open() {
        let (mut client, server) = tokio::io::duplex(4096);
        let c = conn(server);
        let sender = tokio::spawn(async move {
            for _ in 0..100 {
                if client.write_all(b"\r\n").await.is_err() {
                    return;
                }
                tokio::time::sleep(PARK_AFTER * 3 / 2).await;
            }
        });
        let (how, why, waited) = wait_for_end(&c).await;
        assert_eq!(how, "end", "{why:?}");
        assert!(waited <= HEAD_TIMEOUT + 3 * PARK_AFTER, "{waited:?}");
        sender.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_sending_requests_every_period_never_parks() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let c = conn(server);
        let sender = tokio::spawn(async move {
            for _ in 0..5 {
                let _ = client.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
                tokio::time::sleep(PARK_AFTER / 2).await;
            }
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        let (how, _, waited) = wait_for_end(&c).await;
        assert_eq!(how, "park");
        assert!(waited >= 5 * PARK_AFTER / 2, "{waited:?}");
        sender.abort();
    }

    #[tokio::test]
    async fn a_smuggling_shape_is_refused_before_anything_is_handled() {
        let (mut client, server) = tokio::io::duplex(4096);
        let c = conn(server);
        client
            .write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n")
            .await
            .expect("write");
        let (how, why, _) = wait_for_end(&c).await;
        assert_eq!((how, why.as_deref()), ("refused", Some("Content-Length and Transfer-Encoding together")));
    }
}
