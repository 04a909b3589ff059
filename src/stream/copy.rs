//! Copying bytes both ways between two connections, with half-close, backpressure, and an
//! idle timeout.
//!
//! [`relay`] is the TCP path: readiness-driven, reading into the worker's scratch buffer and
//! writing straight on, so that a connection holds no buffer while idle (only bytes an
//! upstream or client has not accepted yet are kept, at most one read's worth per direction,
//! and reading stops until they are written). [`copy_idle`] serves any pair of async streams
//! (TLS-terminated connections, WebSocket tunnels) with tokio's copy.

use std::cell::{Cell, RefCell};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Bytes read per call from one side (and the size of a worker's scratch buffer).
pub const SCRATCH: usize = 64 << 10;

/// How a relay ended.
#[derive(Debug)]
pub struct Relayed {
    /// Bytes from the client to the upstream.
    pub up: u64,
    /// Bytes from the upstream to the client.
    pub down: u64,
    /// `closed`, `idle timeout`, or the error.
    pub reason: String,
}

/// Relays between `client` and `upstream` until both directions end (an end of stream on one
/// side is passed on as a half-close of the other) or nothing moves for `idle`.
///
/// Polled by hand rather than written as two `async` loops: each wake polls the sockets' own
/// readiness slots (no waiter list, no future per wait) and looks at the idle timer only when it
/// has fired.
pub async fn relay(client: &TcpStream, upstream: &TcpStream, idle: Duration, scratch: &RefCell<Vec<u8>>) -> Relayed {
    let mut state = Relay {
        up: Direction::new(client, upstream),
        down: Direction::new(upstream, client),
        scratch,
        idle,
        last: Instant::now(),
        armed: false,
        down_first: false,
    };
    let timer = tokio::time::sleep_until(state.last + idle);
    tokio::pin!(timer);
    let reason = std::future::poll_fn(|cx| state.poll(cx, timer.as_mut())).await;
    Relayed { up: state.up.count, down: state.down.count, reason }
}

/// Both directions of a [`relay`] and its idle clock.
struct Relay<'a> {
    up: Direction<'a>,
    down: Direction<'a>,
    scratch: &'a RefCell<Vec<u8>>,
    idle: Duration,
    /// When bytes last moved (read once per wake that moved some).
    last: Instant,
    /// The timer has been polled for its current deadline (its waker is this task's).
    armed: bool,
    /// Which direction the last wake polled first.
    down_first: bool,
}

impl Relay<'_> {
    fn poll(&mut self, cx: &mut Context<'_>, mut timer: Pin<&mut tokio::time::Sleep>) -> Poll<String> {
        let mut moved = false;
        // Each direction goes first every other wake: a side that keeps its socket full spends
        // the task's cooperative budget, and the other side must not always find it spent.
        self.down_first = !self.down_first;
        let (up, down) = if self.down_first {
            let down = self.down.poll_move(cx, self.scratch, &mut moved);
            (self.up.poll_move(cx, self.scratch, &mut moved), down)
        } else {
            let up = self.up.poll_move(cx, self.scratch, &mut moved);
            (up, self.down.poll_move(cx, self.scratch, &mut moved))
        };
        match (up, down) {
            (Poll::Ready(Err(e)), _) | (_, Poll::Ready(Err(e))) => return Poll::Ready(e.to_string()),
            // Both sides are done: closing the sockets says the rest (no half-close first).
            (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => return Poll::Ready("closed".to_owned()),
            _ => {}
        }
        self.up.pass_on_end();
        self.down.pass_on_end();
        if moved {
            self.last = Instant::now();
        }
        // The timer keeps the waker it was polled with: until it fires there is nothing to ask it.
        while !self.armed || timer.is_elapsed() {
            let deadline = self.last + self.idle;
            if self.armed || timer.deadline() != deadline {
                if deadline <= Instant::now() {
                    return Poll::Ready("idle timeout".to_owned());
                }
                timer.as_mut().reset(deadline);
            }
            self.armed = true;
            // Outside the cooperative budget: a busy relay spends it, and a timer poll refused
            // for want of it would leave the timer without this task's waker (it is not polled
            // again until it fires, and then nobody would be woken).
            if std::future::Future::poll(std::pin::pin!(tokio::task::coop::unconstrained(timer.as_mut())), cx)
                .is_pending()
            {
                break;
            }
        }
        Poll::Pending
    }
}

/// One direction of a [`relay`]: what `src` sends is written to `dst` at once; only what `dst`
/// would not take is kept, and `src` is not read again until it has been written.
struct Direction<'a> {
    src: &'a TcpStream,
    dst: &'a TcpStream,
    /// Read but not yet written (empty, with no allocation, while the connection waits).
    pending: Vec<u8>,
    count: u64,
    /// `src` has ended.
    ended: bool,
    /// ... and `dst` was told so (half-closed).
    passed_on: bool,
}

impl<'a> Direction<'a> {
    fn new(src: &'a TcpStream, dst: &'a TcpStream) -> Self {
        Direction { src, dst, pending: Vec::new(), count: 0, ended: false, passed_on: false }
    }

    /// Moves bytes until a socket would block (`Pending`, with this task's waker registered) or
    /// `src` ends (`Ready(Ok)`). Reads go on until one would block, not only until one comes
    /// back short: a peer's end of stream usually follows its last bytes at once, and this
    /// read sees it without another turn of the event loop. The sockets' readiness polls take
    /// tokio's cooperative budget, so a busy relay still yields.
    fn poll_move(
        &mut self,
        cx: &mut Context<'_>,
        scratch: &RefCell<Vec<u8>>,
        moved: &mut bool,
    ) -> Poll<io::Result<()>> {
        if self.ended {
            return Poll::Ready(Ok(()));
        }
        loop {
            while !self.pending.is_empty() {
                std::task::ready!(self.dst.poll_write_ready(cx))?;
                match self.dst.try_write(&self.pending) {
                    Ok(k) => {
                        self.pending.drain(..k);
                        *moved = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            if self.pending.capacity() > 0 {
                // Written: hold nothing while the connection waits.
                self.pending = Vec::new();
            }
            std::task::ready!(self.src.poll_read_ready(cx))?;
            // Borrowed only within this call: the worker is single-threaded, so every relay of
            // the worker shares one scratch buffer.
            let mut buf = scratch.borrow_mut();
            if buf.len() < SCRATCH {
                buf.resize(SCRATCH, 0);
            }
            let n = match self.src.try_read(&mut buf[..]) {
                Ok(0) => {
                    self.ended = true;
                    return Poll::Ready(Ok(()));
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            };
            *moved = true;
            self.count += n as u64;
            let mut at = 0;
            while at < n {
                match self.dst.try_write(&buf[at..n]) {
                    Ok(k) => at += k,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            if at < n {
                self.pending.extend_from_slice(&buf[at..n]);
            }
        }
    }

    /// Once `src` has ended while the other direction goes on, half-closes `dst`.
    fn pass_on_end(&mut self) {
        if self.ended && !self.passed_on {
            self.passed_on = true;
            let _ = socket2::SockRef::from(self.dst).shutdown(std::net::Shutdown::Write);
        }
    }
}

/// Copies both ways between two async streams until one side closes (passed on as a
/// half-close) or nothing moves for `idle`. Returns `(to b, to a)` byte counts and the reason.
pub async fn copy_idle<A, B>(a: A, b: B, idle: Duration) -> Relayed
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let last = std::rc::Rc::new(Cell::new(Instant::now()));
    let mut a = Watched { io: a, last: last.clone() };
    let mut b = Watched { io: b, last: last.clone() };
    let copy = tokio::io::copy_bidirectional(&mut a, &mut b);
    tokio::pin!(copy);
    loop {
        tokio::select! {
            done = &mut copy => {
                return match done {
                    Ok((up, down)) => Relayed { up, down, reason: "closed".into() },
                    Err(e) => Relayed { up: 0, down: 0, reason: e.to_string() },
                };
            }
            _ = tokio::time::sleep_until(last.get() + idle) => {
                if last.get().elapsed() >= idle {
                    return Relayed { up: 0, down: 0, reason: "idle timeout".into() };
                }
            }
        }
    }
}

/// A stream that notes when bytes last arrived.
struct Watched<T> {
    io: T,
    last: std::rc::Rc<Cell<Instant>>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.last.set(Instant::now());
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Poll;
    use tokio::net::TcpListener;

    /// Two connected loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
        (a.expect("connect"), b.expect("accept").0)
    }

    #[tokio::test]
    async fn a_relay_first_polled_with_no_budget_left_still_times_out() {
        let (_client, client) = pair().await;
        let (upstream, _server) = pair().await;
        let scratch = RefCell::new(Vec::new());
        let relay = relay(&client, &upstream, Duration::from_millis(200), &scratch);
        tokio::pin!(relay);
        // Spend the task's whole cooperative budget, as a busy relay does, then poll: the idle
        // timer must still get this task's waker.
        std::future::poll_fn(|cx| {
            while let Poll::Ready(spent) = tokio::task::coop::poll_proceed(cx) {
                spent.made_progress();
            }
            assert!(std::future::Future::poll(relay.as_mut(), cx).is_pending(), "a relay with nothing to move ended");
            Poll::Ready(())
        })
        .await;
        let done = tokio::time::timeout(Duration::from_secs(5), relay).await.expect("the idle relay was never woken");
        assert_eq!(done.reason, "idle timeout");
        assert_eq!((done.up, done.down), (0, 0));
    }

    #[tokio::test]
    async fn bytes_cross_both_ways_and_each_end_is_passed_on() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, client_side) = pair().await;
        let (upstream_side, mut server) = pair().await;
        let scratch = RefCell::new(Vec::new());
        // As the stream proxy does: the sockets close as soon as the relay ends (when both
        // ends arrive in one wake, that close is what passes the second one on).
        let relay = async {
            let done = relay(&client_side, &upstream_side, Duration::from_secs(5), &scratch).await;
            drop((client_side, upstream_side));
            done
        };
        let peers = async {
            client.write_all(b"request").await.expect("client writes");
            client.shutdown().await.expect("client half-closes");
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.expect("server reads to the client's end");
            assert_eq!(got, b"request");
            server.write_all(b"answer").await.expect("server writes");
            server.shutdown().await.expect("server closes");
            let mut back = Vec::new();
            client.read_to_end(&mut back).await.expect("client reads to the server's end");
            assert_eq!(back, b"answer");
        };
        let (done, ()) = tokio::join!(relay, peers);
        assert_eq!((done.up, done.down, done.reason.as_str()), (7, 6, "closed"));
    }
}
