//! The request path: match a route, run the plugin phases (`finish`), pick a node and forward
//! (`forward`), stream back.

mod finish;
mod forward;

use std::cell::Cell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;
use weir_plugin::{PluginResponse, RequestCtx, UpstreamRef};

use super::body::ResponseBody;
use super::body::{ClientBody, ProxyBody};
use super::client::Pool;
use super::headers::{strip_hop_by_hop, RequestFields};
use super::normalize::{normalize, strip_port, PathRules};
use crate::metrics::{bump, Raised, WorkerStats};
use crate::state::Gateway;
use crate::tables::snapshot::PluginChain;
use crate::tables::upstream::CompiledUpstream;
pub use finish::Finish;
use finish::{access_phases, error_response, gateway_error, plugin_response, request_head_bytes};
use forward::forward;

/// Largest request body buffered for a plugin that asks for the whole body.
pub const MAX_BUFFERED_BODY: usize = 16 << 20;
/// Request bodies up to this size (with a known length) are read before proxying, so that a
/// failed attempt can be retried on the next node, as nginx does with `client_body_buffer_size`.
/// Larger bodies stream and are not retried once sent.
pub const REPLAYABLE_BODY: u64 = 64 << 10;
/// A response on its way to the client.
pub type Response = http::Response<ResponseBody<Box<Finish>>>;

/// The connection a request arrived on.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The client.
    pub peer: SocketAddr,
    /// The client's IP as text, formatted once per connection (`$remote_addr`, X-Forwarded-For).
    pub peer_ip: Arc<str>,
    /// The local address (listener).
    pub local: SocketAddr,
    /// `https` on a TLS listener, else `http` (`$scheme`, `X-Forwarded-Proto`).
    pub scheme: &'static str,
    /// What TLS adds, when there is something (one pointer: the connection's info is copied per
    /// request).
    pub tls: Option<Arc<TlsConn>>,
}

/// What a TLS connection adds to its requests.
#[derive(Debug, Default)]
pub struct TlsConn {
    /// `Alt-Svc` for every response, when the listener's port also serves HTTP/3.
    pub alt_svc: Option<HeaderValue>,
    /// Mutual TLS, when the server name the client asked for wants client certificates.
    pub mtls: Option<Arc<crate::mtls::ConnAuth>>,
}

/// Per-worker state: the upstream connection pool and the path rules (the worker's runtime is
/// single-threaded, so nothing here is locked).
pub struct Worker {
    pool: Rc<Pool>,
    rules: PathRules,
    /// `gateway.real_ip`, when set.
    real_ip: Option<Arc<super::real_ip::RealIp>>,
    /// This worker's connection and request counters (`metrics`).
    pub stats: Arc<WorkerStats>,
    /// Its parked keep-alive connections (closed to make room when descriptors run out).
    pub idle: super::idle::IdleSet,
    /// Long-lived connections it serves besides HTTP ones (WebSocket tunnels, stream proxy
    /// TCP connections): a stop waits for them too, up to `gateway.worker_shutdown_timeout`.
    pub held: Rc<Cell<usize>>,
    /// Set when the worker stops: HTTP/1.1 responses then carry `Connection: close`, so that
    /// keep-alive clients move to the next process on their next request.
    pub draining: Cell<bool>,
    /// How long a body read waits for the client's next bytes (`gateway.client_body_timeout`).
    body_timeout: Duration,
}

/// Counts one long-lived connection in [`Worker::held`] while it lives.
pub struct Held(Rc<Cell<usize>>);

impl Held {
    /// Counts one more in `count`.
    pub fn new(count: &Rc<Cell<usize>>) -> Held {
        count.set(count.get() + 1);
        Held(count.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

impl Worker {
    /// A worker normalizing paths with `rules`, believing `real_ip`'s trusted proxies, waiting
    /// `body_timeout` at most for each part of a request body it reads.
    pub fn new(rules: PathRules, real_ip: Option<Arc<super::real_ip::RealIp>>, body_timeout: Duration) -> Self {
        let pool = Rc::new(Pool::default());
        // Plugins' own requests on this thread share the worker's pool.
        super::outbound::set_worker_pool(pool.clone());
        super::outbound::register();
        Worker {
            pool,
            rules,
            real_ip,
            stats: WorkerStats::register(),
            idle: Default::default(),
            held: Default::default(),
            draining: Cell::new(false),
            body_timeout,
        }
    }
}

/// Reads the request body up to `limit` bytes. `Ok(Err(prefix))` when the body is longer: the
/// chunks read so far, to be sent before the rest. A client that sends nothing of it for
/// `timeout` (between two reads, as nginx's `client_body_timeout`) gets 408: without it, a body
/// announced and never sent held its connection, and the request's memory, for good.
async fn read_body(
    body: &mut ClientBody,
    limit: usize,
    remote: SocketAddr,
    timeout: Duration,
) -> Result<Result<Bytes, Vec<Bytes>>, Response> {
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut total = 0;
    loop {
        let Ok(next) = tokio::time::timeout(timeout, body.frame()).await else {
            log::debug!("client {remote}: request body stalled for {} s after {total} bytes", timeout.as_secs());
            return Err(error_response(StatusCode::REQUEST_TIMEOUT, &body_stalled(timeout)));
        };
        let Some(frame) = next else { break };
        let frame = frame.map_err(|e| {
            // A client-side protocol error: one short line, never at error level.
            log::debug!("client {remote}: invalid request body: {e}");
            let incomplete = e.downcast_ref::<hyper::Error>().is_some_and(|h| h.is_incomplete_message())
                || e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::UnexpectedEof);
            let why = if incomplete { BODY_CUT } else { BODY_BROKEN };
            error_response(StatusCode::BAD_REQUEST, why)
        })?;
        let Ok(chunk) = frame.into_data() else { continue };
        total += chunk.len();
        chunks.push(chunk);
        if total > limit {
            return Ok(Err(chunks));
        }
    }
    Ok(Ok(match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().unwrap_or_default(),
        _ => {
            let mut buf = BytesMut::with_capacity(total);
            for c in &chunks {
                buf.extend_from_slice(c);
            }
            buf.freeze()
        }
    }))
}

/// The answer to a request whose body ended before its announced length.
const BODY_CUT: &str = "400 Bad Request: invalid request body: it ended before it was complete";

/// The answer to a request whose body is malformed, or ended early (what a streamed body's error
/// says, after its first bytes went upstream).
const BODY_BROKEN: &str = "400 Bad Request: invalid request body: its chunked encoding is malformed, or it ended early";

/// The answer to a request whose body stalled for `timeout`.
fn body_stalled(timeout: Duration) -> String {
    format!(
        "408 Request Timeout: the request body stalled (no bytes for {} s, gateway.client_body_timeout)",
        timeout.as_secs()
    )
}

/// Where the upstream request body comes from.
enum Source {
    Empty,
    Buffered(Bytes),
    /// Streamed (taken by the first attempt; given back when it was never sent).
    Stream(Option<ProxyBody>),
}

/// The data-plane handler.
pub async fn handle<B: Into<ClientBody>>(
    req: http::Request<B>,
    conn: ConnInfo,
    gw: &Gateway,
    worker: &Worker,
) -> Response {
    // HTTP/1.x: read here, for the upgrade; HTTP/2 and HTTP/3 in `serve`, once `:authority`
    // may have become the Host field.
    let version = req.version();
    let fields = (version < http::Version::HTTP_2).then(|| RequestFields::of(req.headers()));
    let upgrade_asked = fields.as_ref().is_some_and(|f| f.upgrade);
    // Taken apart here, not re-assembled around another body type: a request head is a few
    // hundred bytes to move.
    let (parts, body) = req.into_parts();
    bump(&worker.stats.requests, 1);
    // `writing` until the response head is made, also when the client goes away first.
    let _writing = Raised::new(&worker.stats.writing);
    // Every answer on a TLS port that also serves HTTP/3 says so (HTTP/1.1 and HTTP/2 alike).
    let alt_svc = conn.tls.as_ref().and_then(|t| t.alt_svc.clone());
    let mut resp = serve(parts, fields, body.into(), conn, gw, worker, upgrade_asked).await;
    if let Some(v) = alt_svc {
        resp.headers_mut().insert(http::header::ALT_SVC, v);
    }
    if resp.status() == StatusCode::REQUEST_TIMEOUT && version < http::Version::HTTP_2 {
        // The body stalled (`read_body`): its rest is not waited for, the connection ends.
        resp.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    if upgrade_asked && resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The framer stopped judging this connection's bytes at the upgrade request (`framing`):
        // whatever the client sent after it is never served as a request.
        resp.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// HTTP/2 names the target host in `:authority`: it becomes the Host header that routing,
/// plugins and the upstream see. A Host header naming another host is refused (RFC 9113
/// section 8.3.1), so that no decision is made on one name and the request sent with the other.
fn authority_as_host(parts: &mut http::request::Parts) -> Result<(), &'static str> {
    // HTTP/1.1's framer refuses two Host headers; HTTP/2's parser does not, and an upstream
    // reading the last one would serve another host than the one routed on.
    if parts.headers.get_all(http::header::HOST).iter().nth(1).is_some() {
        return Err("more than one Host header");
    }
    if parts.uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err("userinfo in :authority");
    }
    let Some(authority) = parts.uri.authority() else {
        return if parts.headers.contains_key(http::header::HOST) { Ok(()) } else { Err("no :authority and no Host") };
    };
    match parts.headers.get(http::header::HOST) {
        Some(h) if h.as_bytes().eq_ignore_ascii_case(authority.as_str().as_bytes()) => Ok(()),
        Some(_) => Err("the Host header and :authority name different hosts"),
        None => match HeaderValue::from_str(authority.as_str()) {
            Ok(v) => {
                parts.headers.insert(http::header::HOST, v);
                Ok(())
            }
            Err(_) => Err("invalid :authority"),
        },
    }
}

/// HTTP/2 and HTTP/3 requests are held to the HTTP/1.1 framer's limits (`framing`), measured
/// as the framer measures the request they go on as, as nginx holds them to
/// `large_client_header_buffers`: the request line at most 8 KiB (414), each field at most 8 KiB
/// as a line (431), at most 100 field lines and a head of at most 32 KiB (431). So a request
/// refused over one protocol is not served over another. `fields` is read before cookies are
/// joined: each cookie is a line of its own for the 8 KiB limit (as a browser sends them), and the
/// one line they become for the count and the head's size.
fn within_head_limits(parts: &http::request::Parts, fields: &RequestFields) -> Result<(), super::framing::Refusal> {
    use super::framing::{Refusal, MAX_HEAD, MAX_HEADERS, MAX_HEADER_LINE, MAX_REQUEST_LINE};
    let target = parts.uri.path_and_query().map_or(1, |p| p.as_str().len());
    // `METHOD target HTTP/1.1`
    let request_line = parts.method.as_str().len() + 1 + target + 9;
    if request_line > MAX_REQUEST_LINE {
        return Err(Refusal { status: 414, reason: "request line longer than 8 KiB" });
    }
    if fields.longest > MAX_HEADER_LINE {
        return Err(Refusal { status: 431, reason: "a header line longer than 8 KiB" });
    }
    // The request line and the empty line end with CRLF.
    let (mut lines, mut head) = (parts.headers.len(), request_line + 2 + fields.bytes + 2);
    if lines > MAX_HEADERS || head > MAX_HEAD {
        // Joined, each cookie after the first costs `; ` rather than `cookie: ` and CRLF.
        let cookies = parts.headers.get_all(http::header::COOKIE).iter().count();
        if cookies > 1 {
            lines -= cookies - 1;
            head -= (cookies - 1) * 8;
        }
        if lines > MAX_HEADERS {
            return Err(Refusal { status: 431, reason: "too many header lines" });
        }
        if head > MAX_HEAD {
            return Err(Refusal { status: 431, reason: "request head larger than 32 KiB" });
        }
    }
    Ok(())
}

/// HTTP/2 and HTTP/3 clients may send each cookie as a field of its own (browsers do, for
/// compression). Before the request goes on as HTTP/1.1 they are joined with `"; "` into one
/// `cookie` field (RFC 9113 section 8.2.3): an upstream reading the first `Cookie` line would
/// otherwise see one cookie, and plugins another set than the upstream.
fn join_cookies(headers: &mut http::HeaderMap) {
    let mut values = headers.get_all(http::header::COOKIE).iter();
    let (Some(_), Some(_)) = (values.next(), values.next()) else { return };
    let mut joined = Vec::new();
    for v in headers.get_all(http::header::COOKIE) {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(v.as_bytes());
    }
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(http::header::COOKIE, v);
    }
}

/// A form body (`application/x-www-form-urlencoded`), whose arguments `post_arg_*` reads.
fn is_form(headers: &http::HeaderMap) -> bool {
    headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/x-www-form-urlencoded"))
    })
}

/// An HTTP/1.1 WebSocket handshake: `Upgrade: websocket` and `Connection: upgrade`.
fn is_websocket(headers: &http::HeaderMap) -> bool {
    let has = |name: http::header::HeaderName, token: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    has(http::header::UPGRADE, "websocket") && has(http::header::CONNECTION, "upgrade")
}

async fn serve(
    mut parts: http::request::Parts,
    fields: Option<RequestFields>,
    mut payload: ClientBody,
    conn: ConnInfo,
    gw: &Gateway,
    worker: &Worker,
    upgrade_asked: bool,
) -> Response {
    // Request line and header limits were enforced by the framer (`framing`) before hyper parsed
    // (HTTP/1.1), or by the HTTP/2 settings (`server`).
    // The client: the connection's peer (after a PROXY header), or whom a trusted proxy names.
    let (remote, remote_ip) = match worker.real_ip.as_ref().and_then(|r| r.client(conn.peer, &parts.headers)) {
        Some(client) => (client, Arc::from(client.ip().to_string())),
        None => (conn.peer, conn.peer_ip),
    };
    // HTTP/2 and HTTP/3 name the host in `:authority`.
    let h2 = matches!(parts.version, http::Version::HTTP_2 | http::Version::HTTP_3);
    if h2 {
        if let Err(why) = authority_as_host(&mut parts) {
            log::debug!("client {remote}: {why}");
            return error_response(StatusCode::BAD_REQUEST, &format!("400 Bad Request: {why}"));
        }
    }
    let mut fields = fields.unwrap_or_else(|| RequestFields::of(&parts.headers));
    if h2 {
        if let Err(refused) = within_head_limits(&parts, &fields) {
            log::debug!("client {remote}: {}", refused.reason);
            return error_response(refused.status(), &refused.message());
        }
        join_cookies(&mut parts.headers);
    }
    let websocket = upgrade_asked && is_websocket(&parts.headers);
    let on_upgrade = if websocket { payload.take_upgrade() } else { None };
    // One normalized path for routing, plugins and the upstream (docs/data-plane.md).
    let path = match normalize(parts.uri.path(), worker.rules) {
        Ok(p) => p.into_owned(),
        Err(e) => {
            log::debug!("client {remote}: invalid path: {e}");
            return error_response(StatusCode::BAD_REQUEST, &format!("400 Bad Request: invalid path: {e}"));
        }
    };
    // An ACME CA checking an HTTP-01 challenge (only while one is open).
    if let Some(answer) = crate::acme::http_answer(&path) {
        let mut resp = http::Response::new(ResponseBody::Full(Some(Bytes::from(answer))));
        resp.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        return resp;
    }
    let snap = gw.resources.load_full();
    // A shared handle on the header's bytes, for X-Forwarded-Host: no copy, no re-validation.
    let host_header: Option<HeaderValue> = fields.host.take();
    let host = strip_port(host_header.as_ref().and_then(|v| v.to_str().ok()).unwrap_or(""));
    // Mutual TLS is decided on the normalized path and the Host the route is matched on.
    let mtls = conn.tls.as_ref().and_then(|t| t.mtls.as_deref());
    if snap.certs.client_auth || mtls.is_some() {
        let host_entry = snap.certs.client_auth_for(host);
        if let Some((status, why)) = crate::mtls::refusal(mtls, host_entry, &path) {
            log::debug!("client {remote}: {why}");
            return error_response(status, &format!("{} {why}", status));
        }
    }
    let query = parts.uri.query().unwrap_or("").to_owned();
    let request_target = parts.uri.path_and_query().cloned();
    let declared_len: Option<u64> = fields.content_length;
    let chunked = fields.transfer_encoding;
    // HTTP/1.1: a length or chunked; HTTP/2: no END_STREAM on the request's HEADERS frame.
    let has_body = !http_body::Body::is_end_stream(&payload);
    let upgrade_token = if websocket { parts.headers.get(http::header::UPGRADE).cloned() } else { None };
    let target_len = request_target.as_ref().map_or(path.len(), |t| t.as_str().len());
    let request_length = request_head_bytes(&parts.method, target_len, fields.bytes);
    if fields.hop_by_hop {
        strip_hop_by_hop(&mut parts.headers);
    }
    // A route's `vars` may read form arguments (`post_arg_*`): a small form body is then read
    // before routing, and serves as the buffered body afterwards. Read before the context is
    // made, so that no context is held across this wait (it would make every request's future
    // larger).
    let mut early_body: Option<Bytes> = None;
    if has_body
        && snap.table.reads_form()
        && is_form(&parts.headers)
        && declared_len.is_some_and(|n| n <= REPLAYABLE_BODY)
    {
        match Box::pin(read_body(&mut payload, REPLAYABLE_BODY as usize, remote, worker.body_timeout)).await {
            Ok(Ok(b)) => early_body = Some(b),
            Ok(Err(_)) => return error_response(StatusCode::PAYLOAD_TOO_LARGE, "413 Request Entity Too Large"),
            Err(resp) => return resp,
        }
    }
    let mut ctx = RequestCtx::new(parts.method, path, query, parts.headers, remote, remote_ip, conn.local);
    ctx.scheme = conn.scheme;
    ctx.client_cert = conn.tls.as_ref().and_then(|t| t.mtls.as_ref()).and_then(|m| m.cert.clone());
    ctx.version = parts.version;
    ctx.request_target = request_target;
    ctx.request_length = request_length;
    ctx.body = early_body.clone();
    let matched = snap.table.find(host, remote.ip(), &ctx);
    if early_body.is_some() {
        ctx.body = None;
    }
    let Some(matched) = matched else {
        // As APISIX: global rules run for unmatched requests too, then the 404 is sent.
        let mut fin = Finish::new(ctx, [snap.global_chain.clone(), PluginChain::default()]);
        fin.debug = gw.debug.header;
        if let Some(resp) = access_phases(&mut fin).await {
            return plugin_response(resp, fin);
        }
        let not_found = PluginResponse::json(StatusCode::NOT_FOUND, &json!({ "error_msg": "404 Route Not Found" }));
        return plugin_response(not_found, fin);
    };
    let route = matched.route;
    ctx.route_id = Some(route.id.clone());
    ctx.matched_uri = matched.uri;
    if !route.hosts.is_empty() {
        ctx.matched_host = route.matched_host(host);
    }
    ctx.service_id = route.service_id.clone();
    ctx.params = matched.params;
    // From here on the log phase runs whatever happens, also when the client goes away while
    // the request waits (the future is dropped with `fin`; status 499, as nginx logs it).
    let mut fin = Finish::new(ctx, [snap.global_chain.clone(), route.plugins.clone()]);
    fin.grpc = route.upstream.as_ref().is_some_and(|u| u.scheme.grpc());
    fin.timeouts = route.timeouts;
    fin.debug = gw.debug.header || route.debug_header;
    fin.upstream_status_always = gw.debug.upstream_status_always;

    let wants_body = fin.chains[0].wants_body || fin.chains[1].wants_body;
    // Small bodies, and the first REPLAYABLE_BODY bytes of chunked ones, are read before any
    // upstream is contacted: a malformed chunked body is refused before an upstream sees a byte of
    // it, and a read body can be replayed on the next node. An HTTP/2 body of unknown length
    // streams at once (its framing is not ambiguous, and gRPC streams wait for answers).
    let small = declared_len.is_some_and(|n| n <= REPLAYABLE_BODY);
    let mut source = Source::Empty;
    if let Some(b) = early_body {
        source = Source::Buffered(b);
    } else if has_body && (wants_body || small || chunked) {
        let limit = if wants_body { MAX_BUFFERED_BODY } else { REPLAYABLE_BODY as usize };
        match read_body(&mut payload, limit, remote, worker.body_timeout).await {
            Ok(Ok(b)) => source = Source::Buffered(b),
            Ok(Err(_)) if wants_body => {
                fin.ctx.status = 413;
                return error_response(StatusCode::PAYLOAD_TOO_LARGE, "413 Request Entity Too Large");
            }
            Ok(Err(prefix)) => {
                source =
                    Source::Stream(Some(ProxyBody::client(prefix.into(), payload, declared_len, worker.body_timeout)))
            }
            Err(resp) => {
                fin.ctx.status = resp.status().as_u16();
                return resp;
            }
        }
    } else if has_body {
        source = Source::Stream(Some(ProxyBody::client(VecDeque::new(), payload, declared_len, worker.body_timeout)));
    }
    match &source {
        Source::Buffered(b) => fin.ctx.request_length += b.len() as u64,
        Source::Stream(Some(body)) => {
            fin.body_received = body.received();
            fin.ctx.body_streams = true;
        }
        _ => {}
    }
    // A body read whole (asked for, or small enough to be read before proxying) is the
    // plugins' to see: proxy-mirror copies it without making the gateway buffer larger ones.
    if let Source::Buffered(b) = &source {
        fin.ctx.body = Some(b.clone());
    }
    if let Some(resp) = access_phases(&mut fin).await {
        return plugin_response(resp, fin);
    }

    // A plugin may have chosen another upstream for this request (traffic-split).
    let upstream = match fin.ctx.upstream.take() {
        None => route.upstream.clone(),
        Some(UpstreamRef::Id(id)) => match snap.upstream_objects.get(&*id) {
            Some(u) => Some(u.clone()),
            None => {
                let msg = format!("503 Service Unavailable: upstream `{id}` chosen by a plugin does not exist");
                return gateway_error(StatusCode::SERVICE_UNAVAILABLE, &msg, fin);
            }
        },
        Some(UpstreamRef::Compiled(any)) => any.downcast::<CompiledUpstream>().ok(),
    };
    let Some(upstream) = upstream else {
        return gateway_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "missing upstream configuration in Route or Service",
            fin,
        );
    };
    if let Some(b) = fin.ctx.body.take() {
        // A plugin may have replaced the body it read.
        source = Source::Buffered(b);
    }
    // A WebSocket handshake is tunnelled only on routes that ask for it; elsewhere it is
    // proxied as plain HTTP (Upgrade and Connection were removed above), as APISIX does.
    let tunnel = match (on_upgrade, upgrade_token) {
        (Some(client), Some(token)) if route.websocket && !has_body => Some(Tunnel { client, token }),
        _ => None,
    };
    forward(fin, upstream, source, host_header, worker, &gw.health, tunnel).await
}

/// A WebSocket handshake to pass on: the client side of the upgrade, and its `Upgrade` value.
struct Tunnel {
    client: crate::dataplane::tunnel::ClientUpgrade,
    token: HeaderValue,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_fields_are_joined_into_one() {
        let mut h = http::HeaderMap::new();
        h.insert(http::header::COOKIE, HeaderValue::from_static("a=1"));
        join_cookies(&mut h);
        assert_eq!(h.get_all(http::header::COOKIE).iter().count(), 1);
        h.append(http::header::COOKIE, HeaderValue::from_static("b=2"));
        h.append(http::header::COOKIE, HeaderValue::from_static("c=3"));
        join_cookies(&mut h);
        let all: Vec<_> = h.get_all(http::header::COOKIE).iter().collect();
        assert_eq!(all, ["a=1; b=2; c=3"]);
    }
}
