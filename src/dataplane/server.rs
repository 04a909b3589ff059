//! The data-plane listeners: `worker_processes` threads, each a single-threaded tokio runtime
//! that accepts on every `node_listen` and `gateway.ssl.listen` socket and serves them with
//! Weir's own server connections: HTTP/1.1 ([`super::h1server`]) and HTTP/2
//! ([`super::h2server`]). A request stays on the worker that accepted its connection from accept
//! to upstream and back: no locks, no cross-thread hand-off, one `Worker` (upstream pool, path
//! rules) per thread.
//!
//! Protocol per connection: a plain listener serves HTTP/1.1, and with `enable_http2` also
//! cleartext HTTP/2 when the connection opens with the HTTP/2 preface (prior knowledge). A TLS
//! listener terminates TLS with the `ssls` certificates ([`crate::tables::certs`]) and serves what ALPN
//! chose. HTTP/1.1 heads are parsed once, by the strict framer ([`super::framing`]); HTTP/2 has its own binary
//! framing, bounded by the limits below.
//!
//! Stop: accept loops end, every connection is told to finish its in-flight request and close,
//! and the workers wait for that up to the grace period.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::normalize::PathRules;
use super::proxy::{self, ConnInfo, TlsConn, Worker};
use super::resolver::SniResolver;
use crate::config::{Config, EscapedSlashes, SslSection};
use crate::deadline::{within, HANDSHAKE_TIMEOUT};
use crate::metrics::{bump, Raised, WorkerStats};
use crate::mtls::{client_cert, ClientAuth, ConnAuth};
use crate::state::Gateway;
use crate::stream::tcp::StreamWorker;

use super::HEADER_TIMEOUT;
/// How long a connection on an h2c listener may take to send enough bytes to tell HTTP/2 from
/// HTTP/1.1 (24 at most).
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 limits (docs/data-plane.md). Streams open at once per connection.
pub const H2_MAX_STREAMS: u32 = 128;
/// Largest header list (decoded) of one HTTP/2 request, as HTTP/2 counts it (32 bytes more per
/// field than its text). Above the HTTP/1.1 head limit (32 KiB in 100 lines), which the proxy
/// judges itself with a JSON 431 (`proxy::within_head_limits`): this one only bounds what `h2`
/// decodes, the CONTINUATION flood included, and past it `h2` answers a bare 431.
pub const H2_MAX_HEADER_LIST: u32 = 48 << 10;
/// Per-stream and per-connection receive windows: what one client may make Weir buffer.
pub const H2_STREAM_WINDOW: u32 = 256 << 10;
/// See [`H2_STREAM_WINDOW`].
pub const H2_CONN_WINDOW: u32 = 1 << 20;
/// Streams a client may open and reset before Weir answers them (the rapid-reset attack):
/// beyond it the connection is closed with `ENHANCE_YOUR_CALM`.
pub const H2_MAX_PENDING_RESETS: usize = 20;
/// Streams Weir may reset for protocol errors before it closes the connection.
pub const H2_MAX_ERROR_RESETS: usize = 256;

/// What a listening socket speaks.
#[derive(Clone)]
enum Kind {
    /// HTTP/1.1, and cleartext HTTP/2 by prior knowledge when `h2c`.
    Plain { h2c: bool },
    /// TLS, then what ALPN chose; what its connections add (the `Alt-Svc` value when the port
    /// also serves HTTP/3).
    Tls(TlsListen, Option<Arc<TlsConn>>),
    /// The stream proxy's TCP (`stream_routes`); with TLS (SNI routing) when set.
    Stream(Option<Arc<ServerConfig>>),
}

/// A TLS listener's two configurations, alike but for whose cipher suite order decides: the
/// listener's (`crate::tls::listener_provider`: AES-128-GCM first), or, for a client that lists
/// ChaCha20-Poly1305 first (one without AES hardware, as BoringSSL and Go read it), the client's.
#[derive(Clone)]
struct TlsListen {
    ours: Arc<ServerConfig>,
    theirs: Arc<ServerConfig>,
}

impl TlsListen {
    /// The configuration for a client that says `hello`.
    fn for_hello(&self, hello: &rustls::server::ClientHello<'_>) -> Arc<ServerConfig> {
        if crate::tls::prefers_chacha(hello.cipher_suites()) {
            self.theirs.clone()
        } else {
            self.ours.clone()
        }
    }
}

/// The TLS listeners' configurations: Weir's SNI resolver, TLS 1.2 and 1.3, session resumption,
/// ALPN `h2` or not. Built on first use; every listener shares one session cache and one ticket
/// key schedule, so a client resumes on any of them and the cache (32k sessions) exists once.
struct TlsConfigs<'a> {
    gateway: &'a Arc<Gateway>,
    ssl: &'a SslSection,
    resumption: Option<(Arc<dyn rustls::server::StoresServerSessions>, Arc<dyn rustls::server::ProducesTickets>)>,
    built: [Option<TlsListen>; 2],
}

impl<'a> TlsConfigs<'a> {
    fn new(gateway: &'a Arc<Gateway>, ssl: &'a SslSection) -> Self {
        TlsConfigs { gateway, ssl, resumption: None, built: [None, None] }
    }

    /// The configurations offering `h2` by ALPN when `h2`, HTTP/1.1 only otherwise.
    fn get(&mut self, h2: bool) -> Result<TlsListen, String> {
        if let Some(c) = &self.built[usize::from(h2)] {
            return Ok(c.clone());
        }
        let (sessions, ticketer) = match &self.resumption {
            Some(r) => r.clone(),
            None => {
                let sessions: Arc<dyn rustls::server::StoresServerSessions> =
                    rustls::server::ServerSessionMemoryCache::new(32 << 10);
                let ticketer =
                    crate::tls::backend::Ticketer::new().map_err(|e| format!("gateway.ssl: session tickets: {e}"))?;
                self.resumption.insert((sessions, ticketer)).clone()
            }
        };
        let resolver = SniResolver::new(self.gateway, self.ssl.fallback_sni.clone());
        let theirs = listener_config(resolver, h2, None, sessions, ticketer)?;
        let mut ours = theirs.clone();
        // The listener's suite order decides (`crate::tls::listener_provider`: AES-128-GCM first).
        ours.ignore_client_order = true;
        let listen = TlsListen { ours: Arc::new(ours), theirs: Arc::new(theirs) };
        self.built[usize::from(h2)] = Some(listen.clone());
        Ok(listen)
    }
}

/// The most TLS 1.3 tickets a client gets by asking for them (RFC 9149 `ticket_request`), as a
/// client that opens several connections at once does to resume each of them.
const MAX_TICKETS_ASKED: usize = 4;

/// A TLS listener's configuration: TLS 1.3 and 1.2, certificates by SNI, ALPN `h2` when `h2`,
/// and client certificates checked by `clients` (none: not asked for).
fn listener_config(
    resolver: SniResolver,
    h2: bool,
    clients: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    sessions: Arc<dyn rustls::server::StoresServerSessions>,
    ticketer: Arc<dyn rustls::server::ProducesTickets>,
) -> Result<ServerConfig, String> {
    let builder = ServerConfig::builder_with_provider(crate::tls::listener_provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("gateway.ssl: {e}"))?;
    let builder = match clients {
        None => builder.with_no_client_auth(),
        Some(verifier) => builder.with_client_cert_verifier(verifier),
    };
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = if h2 { vec![b"h2".to_vec(), b"http/1.1".to_vec()] } else { vec![b"http/1.1".to_vec()] };
    // Last: only an ACME CA offers it (and only it); such connections end after the handshake.
    config.alpn_protocols.push(super::resolver::ACME_TLS_ALPN.to_vec());
    config.session_storage = sessions;
    config.ticketer = ticketer;
    // One TLS 1.3 ticket per handshake, more when the client asks (RFC 9149, up to
    // `MAX_TICKETS_ASKED`): each resumption brings the next ticket, and rustls packs a second
    // ticket into the first one's record, which OpenSSL clients pay 4 % of a full handshake to
    // read (docs/data-plane.md, "Session tickets", also for what a second ticket would buy).
    config.send_tls13_tickets = 1;
    config.max_tls13_tickets = MAX_TICKETS_ASKED;
    Ok(config)
}

/// The configuration of a server name whose entry asks for client certificates: the listener's,
/// with the entry's verifier, and a session cache and ticket keys of its own (a session made
/// without a client certificate never resumes here). Built on first use.
fn mtls_config(gateway: &Arc<Gateway>, auth: &ClientAuth, h2: bool) -> Result<Arc<ServerConfig>, String> {
    if let Some(c) = auth.configs[usize::from(h2)].get() {
        return Ok(c.clone());
    }
    let fallback = gateway.config.load().gateway.ssl.fallback_sni.clone();
    let ticketer = crate::tls::backend::Ticketer::new().map_err(|e| format!("session tickets: {e}"))?;
    let sessions = rustls::server::ServerSessionMemoryCache::new(4 << 10);
    // The client's suite order (one configuration per entry, not two as in `TlsListen`).
    let config =
        listener_config(SniResolver::new(gateway, fallback), h2, Some(auth.verifier.clone()), sessions, ticketer)?;
    Ok(auth.configs[usize::from(h2)].get_or_init(|| Arc::new(config)).clone())
}

/// A TLS handshake while some server name asks for client certificates: the ClientHello's SNI
/// (or `fallback_sni`) picks the configuration; the connection's [`ConnAuth`] says what the
/// client presented.
async fn mtls_handshake(
    stream: TcpStream,
    listen: TlsListen,
    gateway: &Arc<Gateway>,
) -> std::io::Result<(tokio_rustls::server::TlsStream<TcpStream>, Option<Arc<ConnAuth>>)> {
    let start = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream).await?;
    let entry = {
        let snap = gateway.resources.load();
        let hello = start.client_hello();
        let found = hello.server_name().and_then(|sni| snap.certs.find(sni)).cloned();
        found.or_else(|| {
            let fallback = gateway.config.load().gateway.ssl.fallback_sni.clone()?;
            snap.certs.find(&fallback.to_ascii_lowercase()).cloned()
        })
    };
    let Some((entry, auth)) = entry.and_then(|e| e.client.clone().map(|a| (e, a))) else {
        let config = listen.for_hello(&start.client_hello());
        return Ok((start.into_stream(config).await?, None));
    };
    let h2 = listen.ours.alpn_protocols.iter().any(|p| p == b"h2");
    let config = mtls_config(gateway, &auth, h2).map_err(std::io::Error::other)?;
    let tls = start.into_stream(config).await?;
    let cert = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|leaf| Arc::new(client_cert(leaf)));
    Ok((tls, Some(Arc::new(ConnAuth { cert, entry: Arc::from(entry.id.as_str()), auth }))))
}

/// The running data plane.
pub struct DataPlane {
    stop: watch::Sender<bool>,
    workers: Vec<JoinHandle<()>>,
}

impl DataPlane {
    /// Binds every listener (errors name the key) and starts the workers.
    pub fn start(gateway: Arc<Gateway>, config: &Config) -> Result<DataPlane, String> {
        // Bound in reverse order of how clients find the gateway: stream (UDP, then TCP), TLS,
        // and `node_listen` last. A probe that reaches the plain port (tests, orchestrators, the
        // package's smoke check) then knows every listener is bound: a datagram sent to a UDP
        // port not yet bound is lost without a trace.
        let mut listeners = Vec::new();
        let mut udp = Vec::new();
        let mut quic = Vec::new();
        let ssl = &config.gateway.ssl;
        let pp = config.gateway.proxy_protocol.clone().unwrap_or_default();
        let mut tls = TlsConfigs::new(&gateway, ssl);
        if let Some(stream) = &config.gateway.stream_proxy {
            for listen in &stream.udp {
                let addr = listen.addr();
                let s = crate::handover::udp(addr)
                    .map_err(|e| format!("cannot listen on {addr} (gateway.stream_proxy.udp): {e}"))?;
                udp.push(s);
            }
            for listen in &stream.tcp {
                let addr = listen.addr();
                let l = crate::handover::tcp(addr)
                    .map_err(|e| format!("cannot listen on {addr} (gateway.stream_proxy.tcp): {e}"))?;
                let config = if listen.tls() { Some(tls.get(false)?.theirs) } else { None };
                listeners.push((l, Kind::Stream(config), pp.enable_tcp_pp));
            }
        }
        if ssl.enable {
            for listen in &ssl.listen {
                let addr = listen.addr();
                // UDP first: a client that reads Alt-Svc finds the port bound.
                let alt_svc = if listen.http3() {
                    let socket = crate::handover::udp(addr)
                        .map_err(|e| format!("cannot listen on {addr}/udp (gateway.ssl.listen, HTTP/3): {e}"))?;
                    let resolver = Arc::new(SniResolver::new(&gateway, ssl.fallback_sni.clone()));
                    let config = super::h3::server_config(resolver)?;
                    quic.push(super::h3::Listener { socket, config, retry: listen.quic_retry() });
                    let alt_svc = http::HeaderValue::from_str(&format!("h3=\":{}\"; ma=86400", addr.port())).ok();
                    Some(Arc::new(TlsConn { alt_svc, mtls: None }))
                } else {
                    None
                };
                let l = crate::handover::tcp(addr)
                    .map_err(|e| format!("cannot listen on {addr} (gateway.ssl.listen): {e}"))?;
                listeners.push((l, Kind::Tls(tls.get(listen.http2(true))?, alt_svc), false));
            }
            if let Some(port) = pp.listen_https_port {
                let addr = SocketAddr::from(([0, 0, 0, 0], port));
                let l = crate::handover::tcp(addr)
                    .map_err(|e| format!("cannot listen on {addr} (gateway.proxy_protocol.listen_https_port): {e}"))?;
                listeners.push((l, Kind::Tls(tls.get(true)?, None), true));
            }
        }
        for listen in &config.gateway.node_listen {
            let addr = listen.addr();
            let l = crate::handover::tcp(addr)
                .map_err(|e| format!("cannot listen on {addr} (gateway.node_listen): {e}"))?;
            listeners.push((l, Kind::Plain { h2c: listen.http2(false) }, false));
        }
        if let Some(port) = pp.listen_http_port {
            let addr = SocketAddr::from(([0, 0, 0, 0], port));
            let l = crate::handover::tcp(addr)
                .map_err(|e| format!("cannot listen on {addr} (gateway.proxy_protocol.listen_http_port): {e}"))?;
            listeners.push((l, Kind::Plain { h2c: false }, true));
        }
        let real_ip = config.gateway.real_ip.as_ref().map(|r| Arc::new(super::real_ip::RealIp::new(r)));
        let pp_to_upstream = pp.enable_tcp_pp_to_upstream;
        let rules = PathRules {
            merge_slashes: config.gateway.merge_slashes,
            reject_escaped_slashes: config.gateway.escaped_slashes == EscapedSlashes::Reject,
        };
        let (stop, stopped) = watch::channel(false);
        let mut workers = Vec::new();
        for i in 0..config.gateway.worker_processes.count() {
            let mine = listeners
                .iter()
                .map(|(l, kind, pp)| l.try_clone().map(|l| (l, kind.clone(), *pp)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("cannot share the data-plane listener with worker {i}: {e}"))?;
            let gateway = gateway.clone();
            let stopped = stopped.clone();
            // UDP sessions and QUIC endpoints live on the first worker (a datagram socket has no
            // accept to share).
            let udp = if i == 0 { std::mem::take(&mut udp) } else { Vec::new() };
            let quic = if i == 0 { std::mem::take(&mut quic) } else { Vec::new() };
            let settings = WorkerSettings {
                shutdown: Duration::from_secs(config.gateway.worker_shutdown_timeout.into()),
                body_timeout: Duration::from_secs(config.gateway.client_body_timeout.into()),
                rules,
                real_ip: real_ip.clone(),
                pp_to_upstream,
            };
            let handle = std::thread::Builder::new()
                .name(format!("weir-worker-{i}"))
                .spawn(move || run_worker(gateway, mine, udp, quic, settings, stopped))
                .map_err(|e| format!("cannot start data-plane worker {i}: {e}"))?;
            workers.push(handle);
        }
        Ok(DataPlane { stop, workers })
    }

    /// Stops accepting, lets in-flight requests finish (up to the grace period), and returns
    /// when every worker has ended. Blocking.
    pub fn stop(self) {
        let _ = self.stop.send(true);
        for w in self.workers {
            let _ = w.join();
        }
    }
}

/// What every worker is configured with.
struct WorkerSettings {
    /// How long a stop waits for connections to finish (`gateway.worker_shutdown_timeout`).
    shutdown: Duration,
    /// How long a body read waits for the client's next bytes (`gateway.client_body_timeout`).
    body_timeout: Duration,
    rules: PathRules,
    real_ip: Option<Arc<super::real_ip::RealIp>>,
    pp_to_upstream: bool,
}

/// A listener, what it serves, and whether its connections open with a PROXY header.
type Listening = (std::net::TcpListener, Kind, bool);

fn run_worker(
    gateway: Arc<Gateway>,
    listeners: Vec<Listening>,
    udp: Vec<std::net::UdpSocket>,
    quic: Vec<super::h3::Listener>,
    settings: WorkerSettings,
    stopped: watch::Receiver<bool>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            log::error!("data-plane worker cannot start its runtime: {e}");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    // The worker's body is a task of its own: `block_on` polls its future every time the
    // runtime wakes, and a finished-or-not check of a task costs far less than a poll of the body
    // waiting on the stop signal (once or more per connection).
    let body = local.spawn_local(async move {
        let worker = Rc::new(Worker::new(settings.rules, settings.real_ip, settings.body_timeout));
        let streams = Rc::new(StreamWorker { pp_to_upstream: settings.pp_to_upstream, ..Default::default() });
        let open = Rc::new(Cell::new(0usize));
        for listener in quic {
            let local = listener.socket.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
            let info = ConnInfo { peer: local, peer_ip: Arc::from(""), local, scheme: "https", tls: None };
            let (gateway, worker, stopped) = (gateway.clone(), worker.clone(), stopped.clone());
            tokio::task::spawn_local(super::h3::serve(listener, info, gateway, worker, stopped));
        }
        for socket in udp {
            match tokio::net::UdpSocket::from_std(socket) {
                Ok(s) => {
                    let (gateway, mut stopped) = (gateway.clone(), stopped.clone());
                    tokio::task::spawn_local(async move {
                        tokio::select! {
                            _ = crate::stream::udp::serve(s, gateway) => {}
                            _ = stopped.wait_for(|s| *s) => {}
                        }
                    });
                }
                Err(e) => log::error!("stream UDP listener: {e}"),
            }
        }
        for (l, kind, pp) in listeners {
            match TcpListener::from_std(l) {
                Ok(l) => {
                    tokio::task::spawn_local(accept_loop(
                        l,
                        kind,
                        pp,
                        gateway.clone(),
                        worker.clone(),
                        streams.clone(),
                        open.clone(),
                        stopped.clone(),
                    ));
                }
                Err(e) => log::error!("data-plane listener: {e}"),
            }
        }
        let sweeper = worker.clone();
        tokio::task::spawn_local(async move { super::idle::sweep(&sweeper.idle).await });
        let mut stop = stopped.clone();
        let _ = stop.wait_for(|s| *s).await;
        worker.draining.set(true);
        // Parked keep-alive connections close now; busy ones say `Connection: close`.
        worker.idle.stop();
        // Connections finish their in-flight request and close, and long-lived ones (WebSocket,
        // stream TCP) run until they end; wait for them, within the shutdown timeout.
        let deadline = tokio::time::Instant::now() + settings.shutdown;
        while (open.get() > 0 || worker.held.get() > 0) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if open.get() + worker.held.get() > 0 {
            log::info!("shutdown timeout: closing {} connections still open", open.get() + worker.held.get());
        }
    });
    if let Err(e) = local.block_on(&runtime, body) {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn accept_loop(
    listener: TcpListener,
    kind: Kind,
    pp: bool,
    gateway: Arc<Gateway>,
    worker: Rc<Worker>,
    streams: Rc<StreamWorker>,
    open: Rc<Cell<usize>>,
    stopped: watch::Receiver<bool>,
) {
    let local = listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    // One wait for the stop, registered once, not a new one per accepted connection. `biased`:
    // a ready accept is taken without looking at the stop. The listener's cooperative budget
    // makes `accept` yield after a burst, and the stop is then looked at outside that budget
    // (the watch asks for budget too), so a flood of clients cannot hold the stop off.
    let mut on_stop = stopped.clone();
    let stop = async move { on_stop.wait_for(|s| *s).await.is_ok() };
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            biased;
            a = listener.accept() => a,
            _ = tokio::task::coop::unconstrained(&mut stop) => return,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => {
                if OUT_OF_DESCRIPTORS.load(Ordering::Relaxed) && OUT_OF_DESCRIPTORS.swap(false, Ordering::Relaxed) {
                    log::info!("accept on {local}: accepting again (descriptors were freed)");
                }
                pair
            }
            Err(e) if out_of_descriptors(&e) => {
                // As nginx does: close the oldest idle keep-alive connections to make room, so
                // that new clients are served; said once per shortage, not per attempt.
                if !OUT_OF_DESCRIPTORS.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "accept on {local}: {e}; closing idle keep-alive connections to make room \
                         (raise the descriptor limit, `ulimit -n`, if this recurs)"
                    );
                }
                let closed = worker.idle.reclaim(super::idle::RECLAIM_BATCH);
                bump(&worker.stats.reclaimed, closed as i64);
                // Let the reclaimed connections close before accepting again; with none to
                // close, back off instead of spinning.
                let wait = if closed > 0 { Duration::from_millis(1) } else { Duration::from_millis(50) };
                tokio::time::sleep(wait).await;
                continue;
            }
            Err(e) => {
                log::warn!("accept on {local}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        // On a wildcard listener the connection's own address is what `$server_addr` and stream
        // routes' `server_addr` mean.
        let local = if local.ip().is_unspecified() { stream.local_addr().unwrap_or(local) } else { local };
        if let Kind::Stream(tls) = &kind {
            let (gateway, streams, tls) = (gateway.clone(), streams.clone(), tls.clone());
            let held = proxy::Held::new(&worker.held);
            if pp {
                tokio::task::spawn_local(async move {
                    let mut stream = stream;
                    if let Some(peer) = client_of(&mut stream, peer).await {
                        Box::pin(crate::stream::tcp::serve(stream, peer, local, tls, gateway, streams)).await;
                    }
                    drop(held);
                });
            } else {
                // Boxed once here: the task then moves a pointer, where a future of this size
                // would be copied when spawned, polled first and completed.
                let serve = Box::pin(crate::stream::tcp::serve(stream, peer, local, tls, gateway, streams));
                tokio::task::spawn_local(async move {
                    serve.await;
                    drop(held);
                });
            }
            continue;
        }
        let (scheme, tls) = match &kind {
            Kind::Tls(_, tls) => ("https", tls.clone()),
            _ => ("http", None),
        };
        bump(&worker.stats.accepted, 1);
        // Counted open from now until its task ends, however it ends.
        let counted = OpenConn::new(open.clone(), worker.stats.clone());
        let (gateway, worker, stopped) = (gateway.clone(), worker.clone(), stopped.clone());
        let kind = kind.clone();
        if pp {
            tokio::task::spawn_local(async move {
                let mut stream = stream;
                let Some(peer) = reading(&worker.stats, client_of(&mut stream, peer)).await else { return };
                let info = ConnInfo { peer, peer_ip: Arc::from(peer.ip().to_string()), local, scheme, tls };
                Box::pin(serve(stream, kind, info, gateway, worker, stopped, counted)).await
            });
        } else {
            let info = ConnInfo { peer, peer_ip: Arc::from(peer.ip().to_string()), local, scheme, tls };
            tokio::task::spawn_local(serve(stream, kind, info, gateway, worker, stopped, counted));
        }
    }
}

/// Set while accepts fail for want of descriptors (its log line is written once per shortage).
static OUT_OF_DESCRIPTORS: AtomicBool = AtomicBool::new(false);

/// Whether an accept failed because the process or the system ran out of descriptors (or of
/// the memory for a socket).
fn out_of_descriptors(e: &std::io::Error) -> bool {
    // EMFILE, ENFILE, ENOBUFS, ENOMEM (Linux's numbers; Weir runs on Linux).
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12))
}

/// The client a PROXY header names (the connection's own peer for a `LOCAL`/`UNKNOWN` one);
/// `None` closes the connection: without a valid header, nobody is believed.
async fn client_of(stream: &mut TcpStream, peer: SocketAddr) -> Option<SocketAddr> {
    match within(HEADER_TIMEOUT, "PROXY protocol header", crate::proxy_protocol::read(stream)).await {
        Ok(Some((client, _))) => Some(client),
        Ok(None) => Some(peer),
        Err(why) => {
            log::debug!("client {peer}: {why}");
            None
        }
    }
}

/// The preface every HTTP/2 connection opens with (RFC 9113 section 3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the connection opens with the HTTP/2 preface. Peeks, so the bytes stay for the
/// server; gives up (HTTP/1.1) at the first byte that differs.
async fn opens_with_h2_preface(stream: &TcpStream) -> std::io::Result<bool> {
    let mut buf = [0u8; 24];
    let mut wait = Duration::from_millis(1);
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 || buf[..n] != H2_PREFACE[..n] {
            return Ok(false);
        }
        if n == buf.len() {
            return Ok(true);
        }
        // A prefix of the preface so far: wait for the rest (rare; bounded by the caller). The
        // socket stays readable while bytes are queued, so waits grow instead of spinning.
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_millis(200));
    }
}

/// An open client connection: counted in the worker's `open` (the shutdown waits for it) and
/// `active` gauge from accept until dropped.
struct OpenConn {
    open: Rc<Cell<usize>>,
    stats: Arc<WorkerStats>,
}

impl OpenConn {
    fn new(open: Rc<Cell<usize>>, stats: Arc<WorkerStats>) -> Self {
        open.set(open.get() + 1);
        bump(&stats.active, 1);
        OpenConn { open, stats }
    }
}

impl Drop for OpenConn {
    fn drop(&mut self) {
        self.open.set(self.open.get() - 1);
        bump(&self.stats.active, -1);
    }
}

/// Runs `step` (a TLS handshake, protocol detection) counted as `reading` in the metrics, also
/// when the step is dropped half-way.
async fn reading<T>(stats: &WorkerStats, step: impl std::future::Future<Output = T>) -> T {
    let _reading = Raised::new(&stats.reading);
    step.await
}

async fn serve(
    stream: TcpStream,
    kind: Kind,
    info: ConnInfo,
    gateway: Arc<Gateway>,
    worker: Rc<Worker>,
    stopped: watch::Receiver<bool>,
    counted: OpenConn,
) {
    // Counted open until the connection ends, however it ends (the future is the task: no
    // wrapper holding a second copy of every argument). An HTTP/1.1 connection takes the count
    // along when it parks outside this task.
    let peer = info.peer;
    // The task lives as long as its connection, idle or not, and is as large as its largest
    // state: HTTP/2, TLS and h2c detection are boxed, so an idle HTTP/1.1 connection keeps a
    // small task.
    match kind {
        Kind::Plain { h2c: false } => super::h1server::serve(stream, info, gateway, worker, stopped, counted).await,
        Kind::Plain { h2c: true } => {
            // Boxed, like HTTP/2 and TLS: 1.5 KB of detection state would otherwise be part of
            // every HTTP/1.1 connection's task.
            let detected = within(HEADER_TIMEOUT, "protocol detection", opens_with_h2_preface(&stream));
            match Box::pin(reading(&worker.stats, detected)).await {
                Ok(true) => {
                    let _counted = counted;
                    Box::pin(super::h2server::serve(stream, info, gateway, worker, stopped)).await
                }
                Ok(false) => super::h1server::serve(stream, info, gateway, worker, stopped, counted).await,
                Err(why) => log::debug!("client {peer}: {why}"),
            }
        }
        // Served by `accept_loop` directly.
        Kind::Stream(_) => {}
        Kind::Tls(config, _) => Box::pin(serve_tls(stream, config, info, gateway, worker, stopped, counted)).await,
    }
}

async fn serve_tls(
    stream: TcpStream,
    listen: TlsListen,
    info: ConnInfo,
    gateway: Arc<Gateway>,
    worker: Rc<Worker>,
    stopped: watch::Receiver<bool>,
    counted: OpenConn,
) {
    let _counted = counted;
    let peer = info.peer;
    let handshake = async {
        // Only while some server name asks for client certificates is the SNI read first.
        if gateway.resources.load().certs.client_auth {
            return mtls_handshake(stream, listen, &gateway).await;
        }
        // The ClientHello first: its suites choose the configuration (`TlsListen`).
        let start = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream).await?;
        let config = listen.for_hello(&start.client_hello());
        start.into_stream(config).await.map(|tls| (tls, None))
    };
    let handshake = within(HANDSHAKE_TIMEOUT, "TLS handshake", handshake);
    let mut info = info;
    let tls = match reading(&worker.stats, handshake).await {
        Ok((tls, mtls)) => {
            if let Some(mtls) = mtls {
                let alt_svc = info.tls.as_ref().and_then(|t| t.alt_svc.clone());
                info.tls = Some(Arc::new(TlsConn { alt_svc, mtls: Some(mtls) }));
            }
            tls
        }
        Err(why) => {
            // Unknown SNI, no shared cipher, a scanner: the client's doing, never an error.
            log::debug!("client {peer}: {why}");
            return;
        }
    };
    let alpn = tls.get_ref().1.alpn_protocol();
    if alpn == Some(super::resolver::ACME_TLS_ALPN) {
        log::info!("TLS-ALPN-01 challenge answered to {peer}");
        return;
    }
    if alpn == Some(b"h2") {
        super::h2server::serve(tls, info, gateway, worker, stopped).await;
    } else {
        super::h1server::serve(tls, info, gateway, worker, stopped, ()).await;
    }
}
