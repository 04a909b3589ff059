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
pub async fn relay(client: &TcpStream, upstream: &TcpStream, idle: Duration, scratch: &RefCell<Vec<u8>>) -> Relayed {
    let last = Cell::new(Instant::now());
    let (up, down) = (Cell::new(0u64), Cell::new(0u64));
    let both = async {
        tokio::try_join!(
            one_way(client, upstream, scratch, &last, &up),
            one_way(upstream, client, scratch, &last, &down)
        )
    };
    tokio::pin!(both);
    let reason = loop {
        tokio::select! {
            done = &mut both => break match done {
                Ok(_) => "closed".to_owned(),
                Err(e) => e.to_string(),
            },
            _ = tokio::time::sleep_until(last.get() + idle) => {
                if last.get().elapsed() >= idle {
                    break "idle timeout".to_owned();
                }
            }
        }
    };
    Relayed { up: up.get(), down: down.get(), reason }
}

/// One direction: read what `src` has, write it to `dst` at once; keep only what `dst` would not
/// take, and read no more until it has.
async fn one_way(
    src: &TcpStream,
    dst: &TcpStream,
    scratch: &RefCell<Vec<u8>>,
    last: &Cell<Instant>,
    count: &Cell<u64>,
) -> io::Result<()> {
    let mut pending: Vec<u8> = Vec::new();
    loop {
        src.readable().await?;
        {
            // Borrowed only between awaits: the worker is single-threaded, so every connection
            // of the worker can share one scratch buffer.
            let mut buf = scratch.borrow_mut();
            if buf.len() < SCRATCH {
                buf.resize(SCRATCH, 0);
            }
            let n = match src.try_read(&mut buf[..]) {
                Ok(0) => {
                    // The end of this direction: pass it on, keep the other one open.
                    let _ = socket2::SockRef::from(dst).shutdown(std::net::Shutdown::Write);
                    return Ok(());
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            };
            last.set(Instant::now());
            count.set(count.get() + n as u64);
            let mut at = 0;
            while at < n {
                match dst.try_write(&buf[at..n]) {
                    Ok(k) => at += k,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
            if at < n {
                pending.extend_from_slice(&buf[at..n]);
            }
        }
        while !pending.is_empty() {
            dst.writable().await?;
            match dst.try_write(&pending) {
                Ok(k) => {
                    pending.drain(..k);
                    last.set(Instant::now());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if pending.capacity() > 0 {
            // Written: hold nothing while the connection waits.
            pending = Vec::new();
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
