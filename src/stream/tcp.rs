//! One TCP connection of the stream proxy: SNI (TLS listeners), route, `preread`, connect
//! (with retries on connect failure), `connect`, relay, `log`.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use weir_plugin::{StreamCtx, StreamFlow};

use super::copy::{copy_idle, relay, Relayed};
use super::sni::{client_hello_sni, Hello, MAX_HELLO};
use crate::deadline::{within, HANDSHAKE_TIMEOUT};
use crate::health::checker::Source as ReportSource;
use crate::health::state::Report;
use crate::health::HealthRegistry;
use crate::state::Gateway;
use crate::tables::stream_router::StreamChain;
use crate::tables::upstream::{fnv1a, CompiledUpstream, InFlight};

/// How long a client on a TLS stream listener may take to send its ClientHello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Per-worker state of the stream proxy (the worker is single-threaded: nothing is locked).
#[derive(Default)]
pub struct StreamWorker {
    /// The buffer every relay of this worker reads into (see `copy::relay`).
    pub scratch: RefCell<Vec<u8>>,
    /// Upstreams are told the client with a PROXY v1 header
    /// (`gateway.proxy_protocol.enable_tcp_pp_to_upstream`).
    pub pp_to_upstream: bool,
}

/// Runs the log phase when the connection is done, whatever way it ends.
struct Logged {
    ctx: StreamCtx,
    chain: StreamChain,
}

impl Drop for Logged {
    fn drop(&mut self) {
        let c = &self.ctx;
        log::debug!(
            "stream {} {} -> {:?} (route {:?}): {} bytes up, {} down, {}",
            c.protocol,
            c.remote_addr,
            c.upstream_addr,
            c.route_id,
            c.bytes_from_client,
            c.bytes_to_client,
            c.close_reason
        );
        for p in self.chain.iter() {
            p.instance.log(&self.ctx);
        }
    }
}

/// Runs `preread` of `chain`; `Err(reason)` closes the connection.
pub async fn preread(chain: &StreamChain, ctx: &mut StreamCtx) -> Result<(), String> {
    for p in chain.iter() {
        match p.instance.preread(ctx) {
            StreamFlow::Continue => {}
            StreamFlow::Delay(d) => tokio::time::sleep(d).await,
            StreamFlow::Close(reason) => return Err(format!("{}: {reason}", p.entry.name)),
        }
    }
    Ok(())
}

/// Waits for the client's ClientHello (without consuming it) and reads its SNI.
async fn peek_hello(stream: &TcpStream) -> std::io::Result<Hello> {
    let mut buf = vec![0u8; MAX_HELLO];
    let mut wait = Duration::from_millis(1);
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Ok(Hello::NotTls);
        }
        match client_hello_sni(&buf[..n]) {
            // The socket stays readable while bytes are queued: wait longer each time rather
            // than spin on an incomplete record.
            Hello::NeedMore if n < buf.len() => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(200));
            }
            Hello::NeedMore => return Ok(Hello::Sni(None)),
            found => return Ok(found),
        }
    }
}

/// Connects to a node of `upstream`, trying the next node on connect failure (`retries`).
pub async fn connect(
    upstream: &Arc<CompiledUpstream>,
    health: &HealthRegistry,
    client: SocketAddr,
) -> Result<(TcpStream, SocketAddr, Option<InFlight>), String> {
    let checker = upstream.checker(health);
    let hash = upstream.hash_key_source().map(|_| fnv1a(client.ip().to_string().as_bytes()));
    // Filled only by failures: a connection whose first node answers allocates nothing here.
    let mut tried: Vec<usize> = Vec::new();
    let mut last = None;
    for _ in 0..=upstream.retries {
        let Some((idx, inflight)) = upstream.pick_node(checker.as_deref(), hash, &tried) else { break };
        let addr = upstream.nodes[idx].addr;
        let (report, why) = match tokio::time::timeout(upstream.timeouts.connect, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                if let Some(c) = &checker {
                    c.report(addr, Report::Success, ReportSource::Passive, &"connected");
                }
                return Ok((s, addr, inflight));
            }
            Ok(Err(e)) => (Report::TcpFailure, format!("connect to {addr} failed: {e}")),
            Err(_) => (Report::Timeout, format!("connect to {addr} timed out after {:?}", upstream.timeouts.connect)),
        };
        if let Some(c) = &checker {
            c.report(addr, report, ReportSource::Passive, &why);
        }
        tried.push(idx);
        last = Some(why);
    }
    Err(last.unwrap_or_else(|| "no node available".to_owned()))
}

/// A client's TLS session, terminated here.
type ClientTls = Box<tokio_rustls::server::TlsStream<TcpStream>>;

/// Finishes the client's TLS handshake. Boxed by the caller, as is every TLS step: rustls'
/// connection state is kilobytes, and a plain TCP connection's future should not carry room for
/// it (each connection's future is moved into its task when spawned).
async fn handshake(config: Arc<ServerConfig>, client: TcpStream) -> Result<ClientTls, String> {
    within(HANDSHAKE_TIMEOUT, "TLS handshake", TlsAcceptor::from(config).accept(client)).await.map(Box::new)
}

/// Serves one accepted connection. `tls`: the listener speaks TLS (terminated with this
/// configuration unless the route passes it through).
pub async fn serve(
    client: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    tls: Option<Arc<ServerConfig>>,
    gateway: Arc<Gateway>,
    worker: Rc<StreamWorker>,
) {
    let _live = super::Live::tcp();
    let mut ctx = StreamCtx::new("tcp", peer, local);
    if tls.is_some() {
        match Box::pin(within(HELLO_TIMEOUT, "ClientHello", peek_hello(&client))).await {
            Ok(Hello::Sni(sni)) => ctx.sni = sni,
            Ok(_) => {
                log::debug!("stream client {peer} on {local}: not a TLS ClientHello; closing");
                return;
            }
            Err(why) => {
                log::debug!("stream client {peer}: {why}");
                return;
            }
        }
    }
    let route = {
        let snap = gateway.resources.load();
        match snap.stream_table.find(local, peer.ip(), ctx.sni.as_deref()) {
            Some(route) => route.clone(),
            None => {
                log::info!("stream: no stream route for {peer} on {local} (sni {:?}); closing", ctx.sni);
                return;
            }
        }
    };
    ctx.route_id = Some(route.id.clone());
    let mut logged = Logged { ctx, chain: route.plugins.clone() };
    if !route.plugins.is_empty() {
        if let Err(reason) = preread(&route.plugins, &mut logged.ctx).await {
            logged.ctx.close_reason = reason;
            return;
        }
    }
    let Some(upstream) = route.upstream.clone() else {
        logged.ctx.close_reason = "no upstream".into();
        return;
    };
    // Terminated TLS: finish the client's handshake before any upstream connection is made, so
    // that scanners and failed handshakes cost the upstream nothing.
    let client_tls: Result<ClientTls, TcpStream> = match tls {
        Some(config) if !route.route.tls_passthrough => match Box::pin(handshake(config, client)).await {
            Ok(tls) => Ok(tls),
            Err(why) => {
                logged.ctx.close_reason = why;
                return;
            }
        },
        // Plain TCP, or TLS passed through untouched (the ClientHello was only peeked at).
        _ => Err(client),
    };
    let (up, addr, _inflight) = match connect(&upstream, &gateway.health, peer).await {
        Ok(c) => c,
        Err(e) => {
            log::warn!("stream route {}: {e}", route.id);
            logged.ctx.close_reason = e;
            return;
        }
    };
    let mut up = up;
    if worker.pp_to_upstream {
        use tokio::io::AsyncWriteExt;
        let line = crate::proxy_protocol::v1_header(peer, local);
        if let Err(e) = up.write_all(line.as_bytes()).await {
            logged.ctx.close_reason = format!("PROXY header to {addr}: {e}");
            return;
        }
    }
    logged.ctx.upstream_addr = Some(addr);
    for p in route.plugins.iter() {
        p.instance.connect(&mut logged.ctx);
    }
    let idle = upstream.timeouts.read;
    let done: Relayed = match client_tls {
        Ok(tls) => Box::pin(copy_idle(tls, up, idle)).await,
        Err(client) => relay(&client, &up, idle, &worker.scratch).await,
    };
    logged.ctx.bytes_from_client = done.up;
    logged.ctx.bytes_to_client = done.down;
    logged.ctx.close_reason = done.reason;
}
