//! Requests of plugins' own (forward-auth, openid-connect, loggers) through the host's HTTP/1.1
//! client: the calling worker's connection pool, the upstream exchange code and rustls, so that
//! no plugin carries a second HTTP stack. Registered with the tables at start
//! (`tables::services::set_http_client`). Also the worker side of background requests
//! (`weir_plugin::background`): tasks detached from any request, run on the worker that started
//! them.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, HOST};
use http::HeaderName;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use weir_plugin::services::{LocalTask, OutboundError, SendFuture};
use weir_plugin::{HttpClient, OutboundRequest, OutboundResponse};

use super::body::ProxyBody;
use super::client::Pool;
use super::upstream_conn::RequestHead;
use crate::tables::upstream::{PoolKey, PoolSettings, Timeouts, TlsKey};

thread_local! {
    /// The pool of the data-plane worker running on this thread.
    static WORKER_POOL: RefCell<Option<Rc<Pool>>> = const { RefCell::new(None) };
    /// Where background tasks of this thread's worker go: its task that spawns them.
    static DETACHED: RefCell<Option<mpsc::UnboundedSender<LocalTask>>> = const { RefCell::new(None) };
}

/// Makes `pool` the one plugins' requests on this thread use (a data-plane worker's), and
/// starts the worker's runner of background tasks. Called on the worker's runtime, inside its
/// `LocalSet`.
pub fn set_worker_pool(pool: Rc<Pool>) {
    WORKER_POOL.with(|p| *p.borrow_mut() = Some(pool));
    let (tx, mut rx) = mpsc::unbounded_channel::<LocalTask>();
    // A plugin's spawn only queues: the tasks are spawned from here, a task of the worker's
    // `LocalSet`, so no call from any context can panic for want of one. When the worker's
    // runtime ends, this task goes and later spawns are refused.
    tokio::task::spawn_local(async move {
        while let Some(task) = rx.recv().await {
            tokio::task::spawn_local(task);
        }
    });
    DETACHED.with(|d| *d.borrow_mut() = Some(tx));
}

/// The host's client (see the module documentation).
pub struct HostClient;

/// Registers [`HostClient`] as the client plugins get.
pub fn register() {
    crate::tables::services::set_http_client(Arc::new(HostClient));
}

fn fail(timeout: bool, reason: impl Into<String>) -> OutboundError {
    OutboundError { timeout, reason: reason.into() }
}

/// `(tls, host, port, path and query)` of an absolute `http`/`https` URL.
fn split_url(url: &str) -> Result<(bool, String, u16, String), OutboundError> {
    let uri: http::Uri = url.parse().map_err(|e| fail(false, format!("invalid URL {url:?}: {e}")))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(fail(false, format!("URL {url:?} is not http:// or https://"))),
    };
    let authority = uri.authority().ok_or_else(|| fail(false, format!("URL {url:?} names no host")))?;
    if authority.as_str().contains('@') {
        return Err(fail(false, format!("URL {url:?} carries user information")));
    }
    let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_owned();
    let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let target = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    Ok((tls, host, port, target))
}

async fn resolve(host: &str, port: u16) -> Result<SocketAddr, OutboundError> {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let mut found =
        tokio::net::lookup_host((host, port)).await.map_err(|e| fail(false, format!("resolving {host}: {e}")))?;
    found.next().ok_or_else(|| fail(false, format!("{host} has no address")))
}

async fn exchange(req: OutboundRequest) -> Result<OutboundResponse, OutboundError> {
    let (tls, host, port, target) = split_url(&req.url)?;
    let addr = resolve(&host, port).await?;
    let tls_key = tls.then(|| TlsKey { name: Arc::from(host.as_str()), verify: req.verify_tls, client: None });
    let key = PoolKey { addr, tls: tls_key, h2: false };
    let pool = WORKER_POOL.with(|p| p.borrow().clone()).unwrap_or_else(|| Rc::new(Pool::default()));
    let settings = PoolSettings {
        size: if req.keepalive { 32 } else { 0 },
        idle_timeout: Duration::from_secs(60),
        requests: if req.keepalive { 1000 } else { 1 },
    };
    let timeouts = Timeouts { connect: req.timeout, send: req.timeout, read: req.timeout };
    let default_port = if tls { 443 } else { 80 };
    let host_value = match (host.contains(':'), port == default_port) {
        (false, true) => host.clone(),
        (false, false) => format!("{host}:{port}"),
        (true, true) => format!("[{host}]"),
        (true, false) => format!("[{host}]:{port}"),
    };
    let mut headers = req.headers;
    let length = req.body.len().to_string();
    let mut set: Vec<(&HeaderName, &[u8])> = Vec::with_capacity(2);
    // A Host the caller set goes as it is (a mirror passes the client's, as nginx's mirror
    // location does); without one, the URL's.
    let given_host = headers.get(HOST).cloned();
    headers.remove(HOST);
    set.push((&HOST, given_host.as_ref().map_or(host_value.as_bytes(), |h| h.as_bytes())));
    if !req.body.is_empty() || !matches!(req.method.as_str(), "GET" | "HEAD" | "OPTIONS" | "DELETE") {
        headers.remove(CONTENT_LENGTH);
        set.push((&CONTENT_LENGTH, length.as_bytes()));
    }
    let head = RequestHead { method: &req.method, target: &target, headers: &headers, set: &set, lines: false };
    let body = if req.body.is_empty() { ProxyBody::Empty } else { ProxyBody::Full(Some(req.body.clone())) };
    let idempotent = matches!(req.method.as_str(), "GET" | "HEAD" | "OPTIONS");
    let resp = Pool::send(&pool, &key, settings, &timeouts, &head, body, None, idempotent)
        .await
        .map_err(|e| fail(e.timeout, format!("{}: {}", req.url, e.reason)))?;
    let (parts, mut incoming) = resp.into_parts();
    let mut body = BytesMut::new();
    while let Some(frame) = incoming.frame().await {
        let frame = frame.map_err(|e| fail(false, format!("{}: reading the body: {e}", req.url)))?;
        if let Ok(data) = frame.into_data() {
            if body.len() + data.len() > req.max_body {
                return Err(fail(false, format!("{}: the answer is larger than {} bytes", req.url, req.max_body)));
            }
            body.extend_from_slice(&data);
        }
    }
    Ok(OutboundResponse { status: parts.status, headers: parts.headers, body: Bytes::from(body) })
}

impl HttpClient for HostClient {
    fn send(&self, req: OutboundRequest) -> SendFuture {
        let limit = req.timeout;
        let url = req.url.clone();
        Box::pin(async move {
            match tokio::time::timeout(limit, exchange(req)).await {
                Ok(answer) => answer,
                Err(_) => Err(fail(true, format!("{url}: no answer within {limit:?}"))),
            }
        })
    }

    fn spawn(&self, task: LocalTask) -> bool {
        // Bounded by the caller (`weir_plugin::background::Background`): the queue holds at
        // most the tasks sent since the runner last ran, on this thread.
        DETACHED.with(|d| d.borrow().as_ref().is_some_and(|tx| tx.send(task).is_ok()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn background_tasks_run_on_the_worker_and_are_refused_elsewhere() {
        // No worker on this thread: refused, never a panic.
        assert!(!HostClient.spawn(Box::pin(async {})));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let local = tokio::task::LocalSet::new();
        let ran = Rc::new(std::cell::Cell::new(false));
        let seen = ran.clone();
        local.block_on(&rt, async move {
            set_worker_pool(Rc::new(Pool::default()));
            assert!(HostClient.spawn(Box::pin(async move { seen.set(true) })));
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        assert!(ran.get(), "the task ran, detached from the one that spawned it");
    }

    #[test]
    fn urls_split_into_their_parts() {
        let ok = |u: &str| split_url(u).unwrap_or_else(|e| panic!("{u}: {e}"));
        assert_eq!(ok("http://127.0.0.1:8080/auth?x=1"), (false, "127.0.0.1".into(), 8080, "/auth?x=1".into()));
        assert_eq!(ok("https://auth.example"), (true, "auth.example".into(), 443, "/".into()));
        assert_eq!(ok("http://[::1]:9/"), (false, "::1".into(), 9, "/".into()));
        assert!(split_url("ftp://x/").is_err());
        assert!(split_url("http://user@x/").is_err());
        assert!(split_url("/relative").is_err());
    }
}
