//! WebSocket tunnels: the upstream handshake on a connection of its own (never pooled: after a
//! 101 it is no longer HTTP), then a byte copy both ways until either side closes or nothing
//! moves for the route's `timeout.read`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::body::ProxyBody;
use super::client::{Pool, SendError};
use crate::tables::upstream::PoolKey;
use crate::tables::upstream::Timeouts;

/// Sends the handshake `req` to the node of `key` on a new connection; `timeout.connect` bounds
/// the connect, `timeout.read` the wait for the answer.
pub async fn handshake(
    pool: &Pool,
    key: &PoolKey,
    t: &Timeouts,
    req: http::Request<ProxyBody>,
) -> Result<http::Response<Incoming>, SendError> {
    let stream = match pool.connect_tunnel(key, t.connect).await {
        Ok(s) => s,
        Err(reason) => {
            let timeout = reason.contains("timed out");
            return Err(SendError { sent: false, timeout, reason, body: Some(req.into_body()) });
        }
    };
    let (mut sender, connection) = match http1::Builder::new().handshake(TokioIo::new(stream)).await {
        Ok(pair) => pair,
        Err(e) => {
            return Err(SendError { sent: false, timeout: false, reason: e.to_string(), body: Some(req.into_body()) })
        }
    };
    tokio::task::spawn_local(async move {
        if let Err(e) = connection.with_upgrades().await {
            log::debug!("upstream WebSocket connection: {e}");
        }
    });
    match tokio::time::timeout(t.read, sender.send_request(req)).await {
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) => Err(SendError { sent: true, timeout: false, reason: e.to_string(), body: None }),
        Err(_) => Err(SendError {
            sent: true,
            timeout: true,
            reason: format!("no handshake answer within {:?}", t.read),
            body: None,
        }),
    }
}

/// The client's side of a switched connection: its socket, and the bytes it sent after the
/// handshake (already read by the server).
pub struct Upgraded {
    /// The socket (plain or TLS).
    pub io: Box<dyn ClientIo>,
    /// Bytes read past the handshake's head.
    pub prefix: Bytes,
}

/// A client socket, whatever its type.
pub trait ClientIo: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> ClientIo for T {}

/// Where the client's side arrives once the server has written the `101`.
pub type ClientUpgrade = tokio::sync::oneshot::Receiver<Upgraded>;

impl AsyncRead for Upgraded {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut *self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io).poll_shutdown(cx)
    }
}

/// Waits for both sides of the upgrade, then copies until one side closes (the close is passed
/// on as a half-close) or the tunnel idles for `idle`. Returns how it ended.
pub async fn run(client: ClientUpgrade, upstream: OnUpgrade, idle: Duration) -> Result<String, String> {
    let client = async { client.await.map_err(|_| "the client's connection was not handed over".to_owned()) };
    let upstream = async { upstream.await.map_err(|e| format!("upgrade failed: {e}")) };
    let (client, upstream) = tokio::try_join!(client, upstream)?;
    let done = crate::stream::copy::copy_idle(client, TokioIo::new(upstream), idle).await;
    Ok(format!("{}: {} bytes to the upstream, {} to the client", done.reason, done.up, done.down))
}
