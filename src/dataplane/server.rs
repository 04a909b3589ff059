//! The data-plane listeners: `worker_processes` threads, each a single-threaded tokio runtime
//! that accepts on every `node_listen` socket and serves HTTP/1.1 with hyper. A request stays on
//! the worker that accepted its connection from accept to upstream and back: no locks, no
//! cross-thread hand-off, one `Worker` (upstream pool, path rules) per thread.
//!
//! Stop: accept loops end, every connection is told to finish its in-flight request and close,
//! and the workers wait for that up to the grace period.

use std::cell::Cell;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::guard::Guarded;
use super::normalize::PathRules;
use super::proxy::{self, ConnInfo, Worker};
use crate::config::{Config, EscapedSlashes};
use crate::state::Gateway;

/// How long a connection may take to send a request head, and how long it may stay idle between
/// requests (nginx's `client_header_timeout`).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(60);

/// The running data plane.
pub struct DataPlane {
    stop: watch::Sender<bool>,
    workers: Vec<JoinHandle<()>>,
}

impl DataPlane {
    /// Binds every listener (errors name the key) and starts the workers.
    pub fn start(gateway: Arc<Gateway>, config: &Config) -> Result<DataPlane, String> {
        let mut listeners = Vec::new();
        for listen in &config.gateway.node_listen {
            let addr = listen.addr();
            let l = bind(addr).map_err(|e| format!("cannot listen on {addr} (gateway.node_listen): {e}"))?;
            listeners.push(l);
        }
        let rules = PathRules {
            merge_slashes: config.gateway.merge_slashes,
            reject_escaped_slashes: config.gateway.escaped_slashes == EscapedSlashes::Reject,
        };
        let (stop, stopped) = watch::channel(false);
        let mut workers = Vec::new();
        for i in 0..config.gateway.worker_processes.count() {
            let mine = listeners
                .iter()
                .map(|l| l.try_clone())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("cannot share the data-plane listener with worker {i}: {e}"))?;
            let gateway = gateway.clone();
            let stopped = stopped.clone();
            let handle = std::thread::Builder::new()
                .name(format!("weir-worker-{i}"))
                .spawn(move || run_worker(gateway, mine, rules, stopped))
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

/// A listening socket with SO_REUSEADDR and a backlog for bursts of connections ([`BACKLOG`];
/// the standard library's 128 drops SYNs under a burst of a few hundred clients). Must run inside
/// a tokio runtime; the socket is handed over as a std listener for the workers to share.
fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(BACKLOG)?.into_std()?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Pending connections the kernel queues per listener (nginx uses 511; Linux caps it at
/// `net.core.somaxconn`).
pub const BACKLOG: u32 = 2048;

fn run_worker(
    gateway: Arc<Gateway>,
    listeners: Vec<std::net::TcpListener>,
    rules: PathRules,
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
    local.block_on(&runtime, async move {
        let worker = Rc::new(Worker::new(rules));
        let open = Rc::new(Cell::new(0usize));
        for l in listeners {
            match TcpListener::from_std(l) {
                Ok(l) => {
                    tokio::task::spawn_local(accept_loop(
                        l,
                        gateway.clone(),
                        worker.clone(),
                        open.clone(),
                        stopped.clone(),
                    ));
                }
                Err(e) => log::error!("data-plane listener: {e}"),
            }
        }
        let mut stop = stopped.clone();
        let _ = stop.wait_for(|s| *s).await;
        // Connections finish their in-flight request and close; wait for them, within the grace.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(super::SHUTDOWN_GRACE_SECS);
        while open.get() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

async fn accept_loop(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    worker: Rc<Worker>,
    open: Rc<Cell<usize>>,
    mut stopped: watch::Receiver<bool>,
) {
    let local = listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopped.wait_for(|s| *s) => return,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                log::warn!("accept on {local}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let info = ConnInfo { peer, peer_ip: Arc::from(peer.ip().to_string()), local };
        open.set(open.get() + 1);
        let (gateway, worker, open, stopped) = (gateway.clone(), worker.clone(), open.clone(), stopped.clone());
        tokio::task::spawn_local(async move {
            serve(stream, info, gateway, worker, stopped).await;
            open.set(open.get() - 1);
        });
    }
}

async fn serve(
    stream: tokio::net::TcpStream,
    info: ConnInfo,
    gateway: Arc<Gateway>,
    worker: Rc<Worker>,
    mut stopped: watch::Receiver<bool>,
) {
    let io = TokioIo::new(Guarded::new(stream, info.peer));
    let peer = info.peer;
    let service = service_fn(move |req| {
        let (gateway, worker, info) = (gateway.clone(), worker.clone(), info.clone());
        async move { Ok::<_, Infallible>(proxy::handle(req, info, &gateway, &worker).await) }
    });
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).max_buf_size(64 << 10);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = stopped.wait_for(|s| *s) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        // The client's doing (reset, timeout, malformed input): never at error level.
        log::debug!("client {peer}: {e}");
    }
}
