//! Weir's HTTP/2 server connection: the `h2` crate frames, and one task per connection polls
//! the connection and every request it carries ([`serve`]). There is no task per stream: a
//! request's future lives in the connection's set, is polled where it is, and answers through
//! its stream handle. This module owns what happens between a stream's HEADERS and its last
//! frame: the request body as the proxy reads it ([`H2Body`], which gives the client flow-control
//! credit back as it is read), a client's reset cancelling its request, the answer's fields an
//! HTTP/2 peer needs (`date`, `content-length`, no connection-specific fields), and its body sent
//! as the peer's windows allow. The connection's own life is here too: GOAWAY on stop or after
//! [`HEADER_TIMEOUT`] without a new stream, and keep-alive PINGs.
//!
//! The limits are [`super::server`]'s `H2_*` constants (docs/data-plane.md, "HTTP/2").

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::header::{HeaderMap, HeaderValue, CONTENT_LENGTH, DATE, EXPECT};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use super::body::BoxError;
use super::h1server::{DISCARD_LIMIT, DISCARD_TIME};
use super::headers::strip_hop_by_hop;
use super::proxy::{self, ConnInfo, Response, Worker};
use super::server::{
    H2_CONN_WINDOW, H2_MAX_ERROR_RESETS, H2_MAX_HEADER_LIST, H2_MAX_PENDING_RESETS, H2_MAX_STREAMS, H2_STREAM_WINDOW,
};
use super::HEADER_TIMEOUT;
use crate::deadline::within;
use crate::state::Gateway;

/// How long a keep-alive PING may go unanswered before the connection is dropped.
const PING_TIMEOUT: Duration = Duration::from_secs(20);
/// Answer bytes `h2` holds per stream beyond what it has written: with the client's window as
/// the other bound, what a client that advertises a huge window and then stops reading can make
/// Weir keep (128 streams x 64 KiB per connection, for at most [`SEND_TIMEOUT`]).
const H2_SEND_BUFFER: usize = 64 << 10;
/// How long an answer may wait for the client's window (nginx's `send_timeout`, the HTTP/1.1
/// server's): then the stream is reset and its upstream released.
const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// A request's future in the connection's set: boxed once, where it is made. A panic in it
/// (a plugin's bug) ends that stream only, as it ended only its task when streams had tasks:
/// the stream is reset, its neighbours go on.
struct StreamTask(Pin<Box<dyn Future<Output = ()>>>);

impl Future for StreamTask {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let fut = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(p) => p,
            Err(_) => {
                log::error!("an HTTP/2 request panicked; its stream is reset");
                Poll::Ready(())
            }
        }
    }
}

/// Serves one HTTP/2 connection (after TLS with ALPN `h2`, or an h2c preface) to its end.
pub async fn serve<S>(io: S, info: ConnInfo, gateway: Arc<Gateway>, worker: Rc<Worker>, stopped: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let peer = info.peer;
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(H2_MAX_HEADER_LIST)
        .initial_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONN_WINDOW)
        .max_pending_accept_reset_streams(H2_MAX_PENDING_RESETS)
        .max_local_error_reset_streams(Some(H2_MAX_ERROR_RESETS))
        .max_send_buffer_size(H2_SEND_BUFFER);
    let handshake = within(HEADER_TIMEOUT, "HTTP/2 preface", builder.handshake::<_, Bytes>(io));
    let mut waiting = stopped.clone();
    let mut conn = tokio::select! {
        c = handshake => match c {
            Ok(c) => c,
            Err(why) => return log::debug!("client {peer}: {why}"),
        },
        _ = waiting.wait_for(|s| *s) => return,
    };
    let mut keepalive =
        KeepAlive { pings: conn.ping_pong(), waiting_since: None, next: Instant::now() + HEADER_TIMEOUT };
    let mut streams: FuturesUnordered<StreamTask> = FuturesUnordered::new();
    let mut last_stream = Instant::now();
    let mut closing = false;
    let mut stop = pin!(async move {
        let mut stopped = stopped;
        // A dropped sender is a stop too.
        let _ = stopped.wait_for(|s| *s).await;
    });
    let mut tick = pin!(sleep_until(keepalive.next.min(last_stream + HEADER_TIMEOUT)));
    let ended = poll_fn(|cx| {
        // Stop, or no new stream for HEADER_TIMEOUT: GOAWAY, streams in flight finish (nginx's
        // keepalive_timeout), and the connection ends when they have.
        if !closing && stop.as_mut().poll(cx).is_ready() {
            closing = true;
            conn.graceful_shutdown();
        }
        keepalive.poll_pong(cx);
        while tick.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            if !closing && last_stream + HEADER_TIMEOUT <= now {
                closing = true;
                conn.graceful_shutdown();
            }
            if let Err(why) = keepalive.on_tick(now) {
                return Poll::Ready(Err(why));
            }
            let idle_at =
                if closing { keepalive.deadline() } else { (last_stream + HEADER_TIMEOUT).min(keepalive.deadline()) };
            tick.as_mut().reset(idle_at.max(now + Duration::from_millis(1)));
        }
        loop {
            // Requests first: what they answer is then flushed by the connection's poll below.
            while let Poll::Ready(Some(())) = streams.poll_next_unpin(cx) {}
            let mut accepted = false;
            loop {
                match conn.poll_accept(cx) {
                    Poll::Ready(Some(Ok((req, respond)))) => {
                        last_stream = Instant::now();
                        accepted = true;
                        let (info, gateway, worker) = (info.clone(), gateway.clone(), worker.clone());
                        let task =
                            super::boxed_in_place(
                                || async move { stream(req, respond, info, &gateway, &worker).await },
                            );
                        streams.push(StreamTask(Box::into_pin(task)));
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e.to_string())),
                    // Closed (GOAWAY sent and every stream done, or the client left): requests
                    // still in the set have nobody to answer to.
                    Poll::Ready(None) => return Poll::Ready(Ok(())),
                    Poll::Pending => break,
                }
            }
            if !accepted {
                return Poll::Pending;
            }
        }
    })
    .await;
    if let Err(why) = ended {
        log::debug!("client {peer} (HTTP/2): {why}");
    }
}

/// Keep-alive PINGs: one every [`HEADER_TIMEOUT`]; a peer that leaves one unanswered for
/// [`PING_TIMEOUT`] is gone, and its streams and buffers are released.
struct KeepAlive {
    pings: Option<h2::PingPong>,
    waiting_since: Option<Instant>,
    next: Instant,
}

impl KeepAlive {
    fn deadline(&self) -> Instant {
        match self.waiting_since {
            Some(at) => at + PING_TIMEOUT,
            None => self.next,
        }
    }

    fn on_tick(&mut self, now: Instant) -> Result<(), String> {
        let Some(pings) = self.pings.as_mut() else { return Ok(()) };
        match self.waiting_since {
            Some(at) if at + PING_TIMEOUT <= now => Err(format!("no answer to a PING in {} s", PING_TIMEOUT.as_secs())),
            Some(_) => Ok(()),
            None if self.next <= now => {
                if pings.send_ping(h2::Ping::opaque()).is_ok() {
                    self.waiting_since = Some(now);
                }
                self.next = now + HEADER_TIMEOUT;
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn poll_pong(&mut self, cx: &mut Context<'_>) {
        if self.waiting_since.is_none() {
            return;
        }
        if let Some(pings) = self.pings.as_mut() {
            if pings.poll_pong(cx).is_ready() {
                self.waiting_since = None;
                self.next = Instant::now() + HEADER_TIMEOUT;
            }
        }
    }
}

/// One request: through the proxy (cancelled if the client resets the stream first), then the
/// answer on the stream, then what the proxy left unread of the request body.
async fn stream(
    req: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    info: ConnInfo,
    gateway: &Gateway,
    worker: &Worker,
) {
    let peer = info.peer;
    let (parts, recv) = req.into_parts();
    let head = parts.method == http::Method::HEAD;
    let len = content_length(&parts.headers);
    // Only a request with a body shares anything with it (no allocation for the others).
    let share = (!recv.is_end_stream()).then(|| {
        let expects =
            parts.headers.get(EXPECT).is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"100-continue"));
        let continuing = Cell::new(if expects { Continue::Owed } else { Continue::No });
        Rc::new(BodyShare { continuing, rest: RefCell::default() })
    });
    let body = H2Body { recv: Some(recv), left: len, data_done: false, share: share.clone() };
    let req = http::Request::from_parts(parts, body);
    // In place, not boxed: this future is boxed whole where the connection makes it (a
    // separate box for the request path measured 1,359 instructions more per request).
    let mut handling = pin!(proxy::handle(req, info, gateway, worker));
    let resp = poll_fn(|cx| match handling.as_mut().poll(cx) {
        Poll::Ready(r) => Poll::Ready(Some(r)),
        Poll::Pending => {
            // The proxy pulled the body of a client waiting for `100 Continue`: it is owed now
            // (the client's DATA then wakes the body's reader).
            if let Some(share) = &share {
                if share.continuing.get() == Continue::Wanted {
                    share.continuing.set(Continue::Sent);
                    let _ = respond.send_informational(continue_answer());
                }
            }
            // Reset by the client before the answer: the request is dropped where it stands.
            match respond.poll_reset(cx) {
                Poll::Ready(_) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }
        }
    })
    .await;
    let Some(resp) = resp else { return };
    if let Err(e) = answer(resp, respond, head).await {
        return log::debug!("client {peer} (HTTP/2 stream): {e}");
    }
    if let Some(share) = share {
        share.drain().await;
    }
}

/// What a request with a body shares with the body's reader: where the stream stands with
/// `100 Continue`, and the stream the proxy dropped unread, handed back to be drained after the
/// answer.
struct BodyShare {
    continuing: Cell<Continue>,
    rest: RefCell<Option<RecvStream>>,
}

/// Where a stream stands with `Expect: 100-continue` (RFC 9110 section 10.1.1). As over
/// HTTP/1.1, the `100 Continue` goes when the proxy first pulls the body: a request refused
/// before (auth, limits, no route) is answered without the client ever sending its body.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Continue {
    /// The client did not ask for one.
    No,
    /// Asked for; the body not pulled yet.
    Owed,
    /// The proxy pulled the body: the connection's task sends it now.
    Wanted,
    Sent,
}

/// The interim answer to `Expect: 100-continue`.
fn continue_answer() -> http::Response<()> {
    let mut interim = http::Response::new(());
    *interim.status_mut() = http::StatusCode::CONTINUE;
    interim
}

impl BodyShare {
    /// Reads and drops what is left of a body the proxy did not read, up to [`DISCARD_LIMIT`]
    /// within [`DISCARD_TIME`], as the HTTP/1.1 server does. A client still uploading when its
    /// answer came (a 401, a 404, an upstream's 413) then ends its request normally; a reset
    /// while it sends, even `RST_STREAM(NO_ERROR)` after a complete answer (RFC 9113 section
    /// 8.1), makes curl 7.88 (Debian 12) report an empty reply instead of the answer. A client
    /// holding its body back for a `100 Continue` resets or ends the stream itself once it has
    /// the answer. A longer rest gets `RST_STREAM(NO_ERROR)`.
    async fn drain(&self) {
        let Some(mut recv) = self.rest.borrow_mut().take() else { return };
        let mut dropped = 0u64;
        let _ = tokio::time::timeout(DISCARD_TIME, async {
            while let Some(Ok(data)) = recv.data().await {
                let _ = recv.flow_control().release_capacity(data.len());
                dropped += data.len() as u64;
                if dropped > DISCARD_LIMIT {
                    break;
                }
            }
        })
        .await;
    }
}

/// Sends `resp` on the stream: its head, then its body as the windows allow. The answer to a
/// HEAD request is its head alone (with the length the body would have had), whatever made it.
async fn answer(resp: Response, mut respond: SendResponse<Bytes>, head: bool) -> Result<(), h2::Error> {
    let (mut parts, body) = resp.into_parts();
    // Fields that only mean something on one HTTP/1.1 connection, and those `connection`
    // names: `h2` refuses to send them (RFC 9113 section 8.2.2). The proxy's own mechanism, one
    // pass over the names when there are none.
    strip_hop_by_hop(&mut parts.headers);
    if !parts.headers.contains_key(DATE) {
        parts.headers.insert(DATE, date());
    }
    let no_body = body.is_end_stream();
    if !no_body {
        if let Some(len) = body.size_hint().exact() {
            if let http::header::Entry::Vacant(v) = parts.headers.entry(CONTENT_LENGTH) {
                v.insert(HeaderValue::from(len));
            }
        }
    }
    let end = no_body || head;
    let send = match respond.send_response(http::Response::from_parts(parts, ()), end) {
        Ok(s) => s,
        Err(e) => {
            respond.send_reset(Reason::INTERNAL_ERROR);
            return Err(e);
        }
    };
    if end {
        return Ok(());
    }
    send_body(send, body).await
}

/// Sends the body as the client's windows allow. A chunk is pulled from the upstream first and
/// only then is capacity asked for it: capacity reserved with nothing to send would sit on the
/// connection's window, and a client that grants more only once its window is used up would
/// starve every other stream (hyper's issue #4003). The first chunk goes without waiting
/// (sending asks for its capacity); each next one waits until the stream has capacity again, so
/// a client that reads slowly holds the upstream back. A client that grants nothing for
/// [`SEND_TIMEOUT`] gets the stream reset.
async fn send_body(
    mut send: SendStream<Bytes>,
    body: super::body::ResponseBody<Box<proxy::Finish>>,
) -> Result<(), h2::Error> {
    let mut body = pin!(body);
    let mut held: Option<Bytes> = None;
    let mut sent_any = false;
    let mut stalled: Option<Pin<Box<tokio::time::Sleep>>> = None;
    poll_fn(|cx| loop {
        if let Some(chunk) = held.take() {
            if sent_any && send.capacity() == 0 {
                send.reserve_capacity(1);
                match send.poll_capacity(cx) {
                    Poll::Ready(Some(Ok(_))) => stalled = None,
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                    Poll::Ready(None) => return Poll::Ready(Err(h2::Error::from(Reason::CANCEL))),
                    Poll::Pending => {
                        let timer = stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(SEND_TIMEOUT)));
                        if timer.as_mut().poll(cx).is_ready() {
                            send.send_reset(Reason::CANCEL);
                            return Poll::Ready(Err(h2::Error::from(Reason::CANCEL)));
                        }
                        held = Some(chunk);
                        return Poll::Pending;
                    }
                }
            }
            let end = body.is_end_stream();
            send.send_data(chunk, end)?;
            if end {
                return Poll::Ready(Ok(()));
            }
            sent_any = true;
            continue;
        }
        let frame = match body.as_mut().poll_frame(cx) {
            Poll::Ready(f) => f,
            Poll::Pending => {
                // The client may reset the stream while the upstream is slow.
                if let Poll::Ready(r) = send.poll_reset(cx) {
                    return Poll::Ready(Err(h2::Error::from(r.unwrap_or(Reason::CANCEL))));
                }
                return Poll::Pending;
            }
        };
        match frame {
            None => return Poll::Ready(send.send_data(Bytes::new(), true)),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => held = Some(data),
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        send.reserve_capacity(0);
                        return Poll::Ready(send.send_trailers(trailers));
                    }
                }
            },
            // The upstream failed mid-answer: the client sees the stream reset, never a
            // short body that looks complete.
            Some(Err(_)) => {
                send.send_reset(Reason::INTERNAL_ERROR);
                return Poll::Ready(Ok(()));
            }
        }
    })
    .await
}

/// The request's declared length, when it has exactly one valid `content-length`.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(CONTENT_LENGTH).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    first.to_str().ok()?.parse().ok()
}

/// The current `date` field, from the HTTP/1.1 server's once-a-second text. Only answers whose
/// upstream sent none need it.
fn date() -> HeaderValue {
    let mut value = HeaderValue::from_static("");
    super::h1server::with_date(|d| {
        if let Ok(v) = HeaderValue::from_bytes(d) {
            value = v;
        }
    });
    value
}

/// A request body read from an HTTP/2 stream. Each chunk read gives its bytes back to the
/// client's window, so the window bounds what waits unread in Weir, not what a request may send.
pub struct H2Body {
    /// Taken only when the body is dropped unread (see [`BodyShare::drain`]).
    recv: Option<RecvStream>,
    /// What `content-length` says is still to come (`h2` refuses a stream whose DATA disagrees).
    left: Option<u64>,
    data_done: bool,
    /// `None` for a request without a body.
    share: Option<Rc<BodyShare>>,
}

impl Drop for H2Body {
    fn drop(&mut self) {
        if let (Some(share), Some(recv)) = (&self.share, self.recv.take()) {
            if !recv.is_end_stream() {
                *share.rest.borrow_mut() = Some(recv);
            }
        }
    }
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(recv) = this.recv.as_mut() else { return Poll::Ready(None) };
        if let Some(share) = &this.share {
            if share.continuing.get() == Continue::Owed {
                share.continuing.set(Continue::Wanted);
            }
        }
        if !this.data_done {
            match recv.poll_data(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(data))) => {
                    let _ = recv.flow_control().release_capacity(data.len());
                    if let Some(left) = this.left.as_mut() {
                        *left = left.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(Box::new(e)))),
                Poll::Ready(None) => this.data_done = true,
            }
        }
        match recv.poll_trailers(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(trailers))) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(Box::new(e)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.as_ref().is_none_or(RecvStream::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        if self.is_end_stream() {
            return SizeHint::with_exact(0);
        }
        match self.left {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_fields_and_the_fields_they_name_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("close, x-hop"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let names: Vec<_> = h.keys().map(|k| k.as_str().to_owned()).collect();
        assert_eq!(names, ["x-kept"]);
        let mut h = HeaderMap::new();
        h.insert("te", HeaderValue::from_static("gzip"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        strip_hop_by_hop(&mut h);
        assert!(h.is_empty());
    }

    #[test]
    fn content_length_needs_one_valid_value() {
        let mut h = HeaderMap::new();
        assert_eq!(content_length(&h), None);
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("12"));
        assert_eq!(content_length(&h), Some(12));
        h.append(CONTENT_LENGTH, HeaderValue::from_static("12"));
        assert_eq!(content_length(&h), None);
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("-1"));
        assert_eq!(content_length(&h), None);
    }

    #[test]
    fn date_is_an_imf_fixdate() {
        let d = date();
        assert_eq!(d.len(), 29);
        assert!(d.to_str().is_ok_and(|s| s.ends_with(" GMT")));
    }
}
