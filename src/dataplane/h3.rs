//! HTTP/3: QUIC (quinn) on the UDP side of a TLS listener's port with `enable_http3`, HTTP/3
//! framing (the `h3` crate), and the same request path as HTTP/1.1 and HTTP/2
//! ([`super::proxy::handle`]).
//!
//! The handshake uses the TLS listener's certificates (the same SNI resolver), TLS 1.3 only,
//! ALPN `h3`. Limits: 128 concurrent request streams per connection, 32 KiB of header fields,
//! 60 s idle timeout, QUIC's 3x anti-amplification limit before the client's address is
//! validated (quinn enforces it), and with `quic_retry` every new connection proves its address
//! with a Retry token first. Endpoints run on the first worker (a UDP socket has no accept to
//! share between threads).

use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::watch;

use super::body::BoxError;
use super::proxy::{self, ConnInfo, Worker};
use crate::state::Gateway;

/// Concurrent request streams per connection (HTTP/2's `H2_MAX_STREAMS`).
pub const MAX_STREAMS: u32 = 128;
/// Largest header section of a request as HTTP/3 counts it (HTTP/2's `H2_MAX_HEADER_LIST`):
/// above the HTTP/1.1 head limit, which the proxy judges itself with a JSON 431.
pub const MAX_FIELD_SECTION: u64 = crate::dataplane::server::H2_MAX_HEADER_LIST as u64;
/// A connection with no packet for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// An HTTP/3 listener, ready for the worker that serves it.
pub struct Listener {
    /// The bound UDP socket.
    pub socket: std::net::UdpSocket,
    /// QUIC and TLS settings.
    pub config: quinn::ServerConfig,
    /// Whether new connections must prove their address with a Retry first.
    pub retry: bool,
}

/// The QUIC server configuration of a TLS listener: its SNI resolver, TLS 1.3, ALPN `h3`.
pub fn server_config(resolver: Arc<dyn rustls::server::ResolvesServerCert>) -> Result<quinn::ServerConfig, String> {
    let mut tls = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("gateway.ssl (HTTP/3): {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic =
        quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|e| format!("gateway.ssl (HTTP/3): {e}"))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    transport.max_concurrent_bidi_streams(MAX_STREAMS.into());
    // The client's control and QPACK streams, and nothing else it could open.
    transport.max_concurrent_uni_streams(3u32.into());
    let idle = quinn::IdleTimeout::try_from(IDLE_TIMEOUT).map_err(|e| format!("idle timeout: {e}"))?;
    transport.max_idle_timeout(Some(idle));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// Accepts QUIC connections on `listener` until the worker stops.
pub async fn serve(
    listener: Listener,
    info: ConnInfo,
    gateway: Arc<Gateway>,
    worker: Rc<Worker>,
    mut stopped: watch::Receiver<bool>,
) {
    let local = listener.socket.local_addr().ok();
    let runtime = Arc::new(quinn::TokioRuntime);
    let endpoint = match quinn::Endpoint::new(Default::default(), Some(listener.config), listener.socket, runtime) {
        Ok(e) => e,
        Err(e) => return log::error!("HTTP/3 listener {local:?}: {e}"),
    };
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => i,
            _ = stopped.wait_for(|s| *s) => break,
        };
        let Some(incoming) = incoming else { break };
        if listener.retry && !incoming.remote_address_validated() {
            let _ = incoming.retry();
            continue;
        }
        let mut info = info.clone();
        info.peer = incoming.remote_address();
        info.peer_ip = Arc::from(info.peer.ip().to_string());
        let (gateway, worker, stopped) = (gateway.clone(), worker.clone(), stopped.clone());
        tokio::task::spawn_local(async move {
            if let Err(e) = connection(incoming, info, gateway, worker, stopped).await {
                log::debug!("HTTP/3 connection: {e}");
            }
        });
    }
    // Stopping: tell clients to go (GOAWAY through the connections' close), then let quinn
    // finish what is in flight.
    endpoint.close(0u32.into(), b"shutting down");
}

async fn connection(
    incoming: quinn::Incoming,
    info: ConnInfo,
    gateway: Arc<Gateway>,
    worker: Rc<Worker>,
    mut stopped: watch::Receiver<bool>,
) -> Result<(), String> {
    let connecting = incoming.accept().map_err(|e| e.to_string())?;
    let conn = crate::deadline::within(crate::deadline::HANDSHAKE_TIMEOUT, "QUIC handshake", connecting).await?;
    let mut h3 = h3::server::builder()
        .max_field_section_size(MAX_FIELD_SECTION)
        .build::<_, Bytes>(h3_quinn::Connection::new(conn))
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let next = tokio::select! {
            r = h3.accept() => r,
            _ = stopped.wait_for(|s| *s) => {
                let _ = h3.shutdown(0).await;
                return Ok(());
            }
        };
        let resolver = match next {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        let (info, gateway, worker) = (info.clone(), gateway.clone(), worker.clone());
        tokio::task::spawn_local(async move {
            let (req, stream) = match resolver.resolve_request().await {
                Ok(pair) => pair,
                Err(e) => return log::debug!("client {}: HTTP/3 request: {e}", info.peer),
            };
            if let Err(e) = request(req, stream, info.clone(), &gateway, &worker).await {
                log::debug!("client {}: HTTP/3 stream: {e}", info.peer);
            }
        });
    }
}

type Stream = h3::server::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;

/// One request: through the proxy, and the answer back on its stream.
async fn request(
    req: http::Request<()>,
    stream: Stream,
    info: ConnInfo,
    gateway: &Gateway,
    worker: &Worker,
) -> Result<(), String> {
    let (mut send, mut recv) = stream.split();
    // Whether a body follows is known once the first of it (or the stream's end) arrives: a
    // request without one is forwarded without one.
    let first = recv.recv_data().await.map_err(|e| e.to_string())?.map(|mut b| b.copy_to_bytes(b.remaining()));
    let done = first.is_none();
    let body = H3Body { first, stream: recv, done };
    let resp =
        Box::into_pin(super::boxed_in_place(|| proxy::handle(req.map(|()| Box::new(body)), info, gateway, worker)))
            .await;
    let (parts, mut body) = resp.into_parts();
    send.send_response(http::Response::from_parts(parts, ())).await.map_err(|e| e.to_string())?;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        match frame.into_data() {
            Ok(data) => send.send_data(data).await.map_err(|e| e.to_string())?,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    send.send_trailers(trailers).await.map_err(|e| e.to_string())?;
                }
            }
        }
    }
    send.finish().await.map_err(|e| e.to_string())
}

/// A request body read from an HTTP/3 stream.
pub struct H3Body {
    first: Option<Bytes>,
    stream: h3::server::RequestStream<h3_quinn::RecvStream, Bytes>,
    done: bool,
}

impl Body for H3Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if this.done {
            return Poll::Ready(None);
        }
        match this.stream.poll_recv_data(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(Ok(Some(mut buf))) => Poll::Ready(Some(Ok(Frame::data(buf.copy_to_bytes(buf.remaining()))))),
            Poll::Ready(Ok(None)) => match this.stream.poll_recv_trailers(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(r) => {
                    this.done = true;
                    match r {
                        Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
                        Ok(None) => Poll::Ready(None),
                        Err(e) => Poll::Ready(Some(Err(Box::new(e)))),
                    }
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.first.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
