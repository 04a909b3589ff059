//! The request path: match a route, run the plugin phases, pick a node, forward, stream back.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::{HeaderName, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::json;
use weir_plugin::{Flow, PluginResponse, RequestCtx, ResponseHead};

use super::body::{Inbound, OnFinish, ProxyBody, ResponseBody, UpstreamBody};
use super::client::Pool;
use super::headers::{strip_hop_by_hop, ProxyHeaders};
use super::normalize::{normalize, PathRules};
use super::upstream_conn::RequestHead;
use crate::health::checker::Source as ReportSource;
use crate::health::state::Report;
use crate::health::HealthRegistry;
use crate::metrics::{bump, Raised, WorkerStats};
use crate::resources::model::{HashOn, PassHost};
use crate::state::Gateway;
use crate::tables::snapshot::PluginChain;
use crate::tables::upstream::{fnv1a, CompiledUpstream, InFlight};

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
}

/// Per-worker state: the upstream connection pool and the path rules (the worker's runtime is
/// single-threaded, so nothing here is locked).
pub struct Worker {
    pool: Rc<Pool>,
    rules: PathRules,
    /// This worker's connection and request counters (`metrics`).
    pub stats: Arc<WorkerStats>,
}

impl Worker {
    /// A worker normalizing paths with `rules`.
    pub fn new(rules: PathRules) -> Self {
        Worker { pool: Rc::new(Pool::default()), rules, stats: WorkerStats::register() }
    }
}

/// The log phase, run once the response is done; also carries body filters.
pub struct Finish {
    ctx: RequestCtx,
    chains: [PluginChain; 2],
    filters_body: bool,
    /// Some plugin reads the request headers after forwarding (`reads_request_headers_late`).
    late_headers: bool,
    /// The route proxies gRPC: gateway errors answer in gRPC's terms.
    grpc: bool,
    /// Body bytes received from the client, for a streamed body (added to `request_length`).
    body_received: Option<Rc<Cell<u64>>>,
    /// When the first upstream attempt began (`upstream_time` runs from here).
    upstream_started: Option<Instant>,
    _inflight: Option<InFlight>,
}

impl Finish {
    /// Boxed: the request context is most of a response's size, and a response is moved
    /// several times on its way to hyper (each move copied ~1 KB).
    fn new(ctx: RequestCtx, chains: [PluginChain; 2]) -> Box<Self> {
        let (mut filters_body, mut late_headers) = (false, false);
        for p in chains.iter().flat_map(|c| c.iter()) {
            filters_body |= p.instance.wants_response_body();
            late_headers |= p.instance.reads_request_headers_late();
        }
        Box::new(Finish {
            ctx,
            chains,
            filters_body,
            late_headers,
            grpc: false,
            body_received: None,
            upstream_started: None,
            _inflight: None,
        })
    }
}

impl OnFinish for Finish {
    fn chunk(&mut self, chunk: &mut Bytes, eof: bool) {
        for p in self.chains.iter().flat_map(|c| c.iter()) {
            if p.instance.wants_response_body() {
                p.instance.body_filter(&mut self.ctx, chunk, eof);
            }
        }
    }
    fn filters_body(&self) -> bool {
        self.filters_body
    }
    fn sent(&mut self, n: u64) {
        self.ctx.body_bytes_sent = n;
    }
    fn upstream_done(&mut self) {
        // As nginx's $upstream_response_time: until the upstream's last byte arrived.
        self.ctx.upstream_time = self.upstream_started.map(|t| t.elapsed());
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        if self.ctx.status == 0 {
            // No response was made: the client went away first (nginx logs 499).
            self.ctx.status = 499;
        }
        if let Some(received) = &self.body_received {
            self.ctx.request_length += received.get();
        }
        for p in self.chains.iter().flat_map(|c| c.iter()) {
            p.instance.log(&self.ctx);
        }
        crate::access_log::record(&self.ctx);
    }
}

/// Bytes of a response head as HTTP/1.1 text: status line, headers, blank line (`$bytes_sent`).
fn head_bytes(head: &ResponseHead) -> u64 {
    (field_bytes(&head.headers) + 17 + head.status.canonical_reason().map_or(0, str::len)) as u64
}

/// Bytes of header fields as HTTP/1.1 text: `name: value` and CRLF each.
fn field_bytes(headers: &http::HeaderMap) -> usize {
    headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum()
}

/// Bytes of a request head as HTTP/1.1 text (`$request_length`, without the body): the request
/// line (`METHOD SP target SP HTTP/1.1 CRLF`), the fields, the blank line.
fn request_head_bytes(method: &Method, target: usize, headers: &http::HeaderMap) -> u64 {
    (method.as_str().len() + 1 + target + 1 + 8 + 2 + field_bytes(headers) + 2) as u64
}

/// `content-length: N\r\n`, which the server adds to a whole body.
fn content_length_bytes(len: usize) -> u64 {
    let digits = len.checked_ilog10().map_or(1, |d| d + 1);
    u64::from(digits) + 18
}

fn error_response(status: StatusCode, msg: &str) -> Response {
    let mut resp = http::Response::new(ResponseBody::Full(Some(Bytes::from(json!({ "error_msg": msg }).to_string()))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A response with `head` (framing headers dropped: the body says its own length).
fn with_head(mut head: ResponseHead, body: ResponseBody<Box<Finish>>) -> Response {
    head.headers.remove(http::header::CONTENT_LENGTH);
    head.headers.remove(http::header::TRANSFER_ENCODING);
    let mut resp = http::Response::new(body);
    *resp.status_mut() = head.status;
    *resp.headers_mut() = head.headers;
    resp
}

/// Answers with a plugin's response, after the header filters.
fn plugin_response(resp: PluginResponse, mut finish: Box<Finish>) -> Response {
    let mut head = ResponseHead { status: resp.status, headers: resp.headers };
    for (k, v) in finish.ctx.response_headers.drain(..) {
        head.headers.append(k, v);
    }
    finish.ctx.status = head.status.as_u16();
    for p in finish.chains.iter().flat_map(|c| c.iter()) {
        p.instance.header_filter(&mut finish.ctx, &mut head);
    }
    let mut body = resp.body;
    if finish.filters_body {
        finish.chunk(&mut body, true);
    }
    finish.ctx.status = head.status.as_u16();
    if finish.ctx.method != Method::HEAD {
        finish.ctx.body_bytes_sent = body.len() as u64;
    }
    finish.ctx.head_bytes_sent = head_bytes(&head) + content_length_bytes(body.len());
    with_head(head, ResponseBody::Full(Some(body)))
}

async fn resolve(mut flow: Flow, response_headers: &mut Vec<(HeaderName, HeaderValue)>) -> Option<PluginResponse> {
    loop {
        match flow {
            Flow::Continue => return None,
            Flow::ContinueWith(headers) => {
                response_headers.extend(headers);
                return None;
            }
            Flow::Respond(r) => return Some(r),
            Flow::Defer(f) => flow = f.await,
        }
    }
}

/// Reads the request body up to `limit` bytes. `Ok(Err(prefix))` when the body is longer: the
/// chunks read so far, to be sent before the rest.
async fn read_body(
    body: &mut Incoming,
    limit: usize,
    remote: SocketAddr,
) -> Result<Result<Bytes, Vec<Bytes>>, Response> {
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut total = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            // A client-side protocol error: one short line, never at error level.
            log::debug!("client {remote}: invalid request body: {e}");
            let why = if e.is_incomplete_message() {
                "it ended before it was complete"
            } else {
                "its chunked encoding is malformed, or it ended early"
            };
            error_response(StatusCode::BAD_REQUEST, &format!("400 Bad Request: invalid request body: {why}"))
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

/// The nodes a request has tried: held inline for the first few (no allocation per request).
enum Tried {
    Inline([usize; 4], usize),
    Heap(Vec<usize>),
}

impl Default for Tried {
    fn default() -> Self {
        Tried::Inline([0; 4], 0)
    }
}

impl Tried {
    fn push(&mut self, node: usize) {
        match self {
            Tried::Inline(list, n) if *n < list.len() => {
                list[*n] = node;
                *n += 1;
            }
            Tried::Inline(list, n) => {
                let mut all = list[..*n].to_vec();
                all.push(node);
                *self = Tried::Heap(all);
            }
            Tried::Heap(all) => all.push(node),
        }
    }

    fn as_slice(&self) -> &[usize] {
        match self {
            Tried::Inline(list, n) => &list[..*n],
            Tried::Heap(all) => all,
        }
    }
}

/// Where the upstream request body comes from.
enum Source {
    Empty,
    Buffered(Bytes),
    /// Streamed (taken by the first attempt; given back when it was never sent).
    Stream(Option<ProxyBody>),
}

fn is_idempotent(ctx: &RequestCtx) -> bool {
    !ctx.non_idempotent && !matches!(ctx.method.as_str(), "POST" | "PATCH" | "LOCK")
}

/// Runs `rewrite` then `access` of `chains`; a plugin's answer ends the request.
async fn access_phases(ctx: &mut RequestCtx, chains: &[PluginChain; 2]) -> Option<PluginResponse> {
    for phase in 0..2 {
        for p in chains.iter().flat_map(|c| c.iter()) {
            let flow = if phase == 0 { p.instance.rewrite(ctx) } else { p.instance.access(ctx) };
            if let Some(resp) = resolve(flow, &mut ctx.response_headers).await {
                return Some(resp);
            }
        }
    }
    None
}

/// The data-plane handler.
pub async fn handle(req: http::Request<Incoming>, conn: ConnInfo, gw: &Gateway, worker: &Worker) -> Response {
    let upgrade_asked = req.version() < http::Version::HTTP_2 && req.headers().contains_key(http::header::UPGRADE);
    bump(&worker.stats.requests, 1);
    // `writing` until the response head is made, also when the client goes away first.
    let _writing = Raised::new(&worker.stats.writing);
    let mut resp = serve(req, conn, gw, worker, upgrade_asked).await;
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
    req: http::Request<Incoming>,
    conn: ConnInfo,
    gw: &Gateway,
    worker: &Worker,
    upgrade_asked: bool,
) -> Response {
    // Request line and header limits were enforced by the framer (`framing`) before hyper parsed
    // (HTTP/1.1), or by the HTTP/2 settings (`server`).
    let (mut parts, mut payload) = req.into_parts();
    let remote = conn.peer;
    let h2 = parts.version == http::Version::HTTP_2;
    if h2 {
        if let Err(why) = authority_as_host(&mut parts) {
            log::debug!("client {remote}: {why}");
            return error_response(StatusCode::BAD_REQUEST, &format!("400 Bad Request: {why}"));
        }
    }
    let websocket = upgrade_asked && is_websocket(&parts.headers);
    let on_upgrade = if websocket { parts.extensions.remove::<hyper::upgrade::OnUpgrade>() } else { None };
    // One normalized path for routing, plugins and the upstream (docs/data-plane.md).
    let path = match normalize(parts.uri.path(), worker.rules) {
        Ok(p) => p.into_owned(),
        Err(e) => {
            log::debug!("client {remote}: invalid path: {e}");
            return error_response(StatusCode::BAD_REQUEST, &format!("400 Bad Request: invalid path: {e}"));
        }
    };
    let snap = gw.resources.load_full();
    // A shared handle on the header's bytes, for X-Forwarded-Host: no copy, no re-validation.
    let host_header: Option<HeaderValue> = parts.headers.get(http::header::HOST).cloned();
    let host = strip_port(host_header.as_ref().and_then(|v| v.to_str().ok()).unwrap_or(""));
    let matched = snap.table.find(parts.method.as_str(), host, &path, remote.ip());
    let query = parts.uri.query().unwrap_or("").to_owned();
    let request_target = parts.uri.path_and_query().cloned();
    let declared_len: Option<u64> =
        parts.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let chunked = parts.headers.contains_key(http::header::TRANSFER_ENCODING);
    // HTTP/1.1: a length or chunked; HTTP/2: no END_STREAM on the request's HEADERS frame.
    let has_body = !http_body::Body::is_end_stream(&payload);
    let upgrade_token = if websocket { parts.headers.get(http::header::UPGRADE).cloned() } else { None };
    let target_len = request_target.as_ref().map_or(path.len(), |t| t.as_str().len());
    let request_length = request_head_bytes(&parts.method, target_len, &parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    let mut ctx = RequestCtx::new(parts.method, path, query, parts.headers, remote, conn.peer_ip, conn.local);
    ctx.scheme = conn.scheme;
    ctx.version = parts.version;
    ctx.request_target = request_target;
    ctx.request_length = request_length;
    let Some(matched) = matched else {
        // As APISIX: global rules run for unmatched requests too, then the 404 is sent.
        let mut fin = Finish::new(ctx, [snap.global_chain.clone(), PluginChain::from([])]);
        if let Some(resp) = access_phases(&mut fin.ctx, &fin.chains).await {
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

    let wants_body = fin.chains.iter().flat_map(|c| c.iter()).any(|p| p.instance.wants_request_body());
    // Small bodies, and the first REPLAYABLE_BODY bytes of chunked ones, are read before any
    // upstream is contacted: a malformed chunked body is refused before an upstream sees a byte of
    // it, and a read body can be replayed on the next node. An HTTP/2 body of unknown length
    // streams at once (its framing is not ambiguous, and gRPC streams wait for answers).
    let small = declared_len.is_some_and(|n| n <= REPLAYABLE_BODY);
    let mut source = Source::Empty;
    if has_body && (wants_body || small || chunked) {
        let limit = if wants_body { MAX_BUFFERED_BODY } else { REPLAYABLE_BODY as usize };
        match read_body(&mut payload, limit, remote).await {
            Ok(Ok(b)) => source = Source::Buffered(b),
            Ok(Err(_)) if wants_body => {
                fin.ctx.status = 413;
                return error_response(StatusCode::PAYLOAD_TOO_LARGE, "413 Request Entity Too Large");
            }
            Ok(Err(prefix)) => source = Source::Stream(Some(ProxyBody::client(prefix.into(), payload, declared_len))),
            Err(resp) => {
                fin.ctx.status = resp.status().as_u16();
                return resp;
            }
        }
    } else if has_body {
        source = Source::Stream(Some(ProxyBody::client(VecDeque::new(), payload, declared_len)));
    }
    match &source {
        Source::Buffered(b) => fin.ctx.request_length += b.len() as u64,
        Source::Stream(Some(body)) => fin.body_received = body.received(),
        _ => {}
    }
    if wants_body {
        if let Source::Buffered(b) = &source {
            fin.ctx.body = Some(b.clone());
        }
    }
    if let Some(resp) = access_phases(&mut fin.ctx, &fin.chains).await {
        return plugin_response(resp, fin);
    }

    let Some(upstream) = route.upstream.clone() else {
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
        (Some(client), Some(token)) if route.route.enable_websocket && !has_body => Some(Tunnel { client, token }),
        _ => None,
    };
    forward(fin, upstream, source, host_header, worker, &gw.health, tunnel).await
}

/// A WebSocket handshake to pass on: the client side of the upgrade, and its `Upgrade` value.
struct Tunnel {
    client: hyper::upgrade::OnUpgrade,
    token: HeaderValue,
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split(']').next().map(|h| h.trim_start_matches('[')).unwrap_or(host);
    }
    host.split(':').next().unwrap_or(host)
}

fn hash_key(ctx: &RequestCtx, upstream: &CompiledUpstream) -> Option<u32> {
    let (on, key) = upstream.hash_key_source()?;
    let value = match on {
        HashOn::Vars => ctx.var(key).map(|v| v.into_owned()),
        HashOn::Header => ctx.header(key).map(str::to_owned),
        HashOn::Cookie => ctx.header("cookie").and_then(|c| {
            c.split(';').find_map(|kv| kv.trim().split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v.to_owned()))
        }),
        HashOn::Consumer => ctx.consumer.as_ref().map(|c| c.username.to_string()),
    };
    Some(fnv1a(value.unwrap_or_else(|| ctx.remote_ip.to_string()).as_bytes()))
}

async fn forward(
    mut fin: Box<Finish>,
    upstream: Arc<CompiledUpstream>,
    mut source: Source,
    original_host: Option<HeaderValue>,
    worker: &Worker,
    health: &HealthRegistry,
    mut tunnel: Option<Tunnel>,
) -> Response {
    let checker = upstream.checker(health);
    let idempotent = is_idempotent(&fin.ctx);
    let max_attempts = upstream.retries + 1;
    let started = Instant::now();
    fin.upstream_started = Some(started);
    let hash = hash_key(&fin.ctx, &upstream);
    let proxy_headers = ProxyHeaders::new(
        &fin.ctx.headers,
        &fin.ctx.remote_ip,
        fin.ctx.scheme,
        original_host.as_ref(),
        fin.ctx.local_addr.port(),
    );
    // The request target as forwarded: the normalized path and the query. Used as it is when
    // every byte is one `http` accepts unescaped (the usual case: no copy, no parse); anything
    // else goes through `PathAndQuery`, which refuses what cannot be sent.
    let target: Cow<'_, str> = if fin.ctx.query.is_empty() {
        Cow::Borrowed(&fin.ctx.path)
    } else {
        Cow::Owned(format!("{}?{}", fin.ctx.path, fin.ctx.query))
    };
    let target: Cow<'_, str> = if plain_target(&fin.ctx.path) {
        target
    } else {
        match target.parse::<http::uri::PathAndQuery>() {
            Ok(t) => Cow::Owned(t.as_str().to_owned()),
            Err(e) => return error_response(StatusCode::BAD_REQUEST, &format!("400 Bad Request: invalid path: {e}")),
        }
    };
    let stalled = match &source {
        Source::Stream(Some(ProxyBody::Client { stalled, .. })) => Some(stalled.clone()),
        _ => None,
    };
    let mut tried = Tried::default();
    let mut last_timeout = false;
    // A failed attempt is reported to the health checker when it is retried (as the reference says).
    let mut pending: Option<(SocketAddr, Report, String)> = None;
    for attempt in 0..max_attempts {
        if attempt > 0 && upstream.retry_timeout.is_some_and(|t| started.elapsed() > t) {
            break;
        }
        let body = match &mut source {
            Source::Empty => ProxyBody::Empty,
            Source::Buffered(b) => ProxyBody::Full(Some(b.clone())),
            Source::Stream(slot) => match slot.take() {
                Some(b) => b,
                // Already (partly) sent to a node: it cannot be sent again.
                None => break,
            },
        };
        let Some((idx, inflight)) = upstream.pick_node(checker.as_deref(), hash, tried.as_slice()) else { break };
        if let (Some(c), Some((addr, report, why))) = (&checker, pending.take()) {
            c.report(addr, report, ReportSource::Passive, &why);
        }
        tried.push(idx);
        let node = &upstream.nodes[idx];
        fin.ctx.upstream_addrs.push(node.addr);
        let host = match upstream.pass_host {
            PassHost::Pass if fin.ctx.headers.contains_key(http::header::HOST) => None,
            PassHost::Pass | PassHost::Node => Some(&node.host_header),
            PassHost::Rewrite => Some(upstream.upstream_host.as_ref().unwrap_or(&node.host_header)),
        };
        // The WebSocket and HTTP/2 exchanges are boxed: their futures are large and rare, and
        // inline they would make every HTTP/1.1 request's future (moved on each request) larger.
        let exchange = if tunnel.is_some() || node.pool_key.h2 {
            // The last attempt moves the headers out, unless a plugin reads them after the
            // request; the access log keeps only those its format reads.
            let mut headers = if attempt + 1 < max_attempts || fin.late_headers {
                fin.ctx.headers.clone()
            } else {
                let all = std::mem::take(&mut fin.ctx.headers);
                if let Some(kept) = crate::access_log::headers_kept(&all) {
                    fin.ctx.headers = kept;
                }
                all
            };
            proxy_headers.apply(&mut headers, host);
            let mut request = http::Request::new(body);
            *request.method_mut() = fin.ctx.method.clone();
            match http::Uri::try_from(&*target) {
                Ok(uri) => *request.uri_mut() = uri,
                Err(e) => return gateway_error(StatusCode::BAD_GATEWAY, &format!("invalid upstream target: {e}"), fin),
            }
            if let Some(t) = &tunnel {
                headers.insert(http::header::CONNECTION, HeaderValue::from_static("upgrade"));
                headers.insert(http::header::UPGRADE, t.token.clone());
            }
            if node.pool_key.h2 {
                // HTTP/2 carries the host in `:authority`, and gRPC servers want `te: trailers`.
                match h2_uri(node.pool_key.tls.is_some(), headers.remove(http::header::HOST), &target) {
                    Ok(uri) => *request.uri_mut() = uri,
                    Err(e) => return gateway_error(StatusCode::BAD_GATEWAY, &e, fin),
                }
                headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
            }
            *request.headers_mut() = headers;
            let answer = if tunnel.is_some() {
                Box::pin(super::tunnel::handshake(&worker.pool, &node.pool_key, &upstream.timeouts, request)).await
            } else {
                Box::pin(worker.pool.send_h2(&node.pool_key, &upstream.timeouts, request)).await
            };
            answer.map(|r| r.map(Inbound::Hyper))
        } else {
            // HTTP/1.1: the head is written from the client's header map as it is, with the
            // proxy headers and Host set as it is encoded (no copy of the map per attempt).
            let (set, n) = proxy_headers.lines(host);
            let head =
                RequestHead { method: &fin.ctx.method, target: &target, headers: &fin.ctx.headers, set: &set[..n] };
            Pool::send(
                &worker.pool,
                &node.pool_key,
                upstream.pool,
                &upstream.timeouts,
                &head,
                body,
                stalled.clone(),
                idempotent,
            )
            .await
            .map(|r| r.map(Inbound::H1))
        };
        match exchange {
            Ok(resp) => {
                fin.ctx.upstream_time = Some(started.elapsed());
                if let Some(c) = &checker {
                    c.report_status(node.addr, resp.status().as_u16());
                }
                if let (Some(t), StatusCode::SWITCHING_PROTOCOLS) = (tunnel.take(), resp.status()) {
                    return upgraded(resp, t.client, fin, inflight, upstream.timeouts.read);
                }
                return respond(resp, fin, inflight);
            }
            Err(e) => {
                log::warn!("upstream {} of route {:?}: {}", node.addr, fin.ctx.route_id, e.reason);
                last_timeout = e.timeout;
                let report = if e.timeout { Report::Timeout } else { Report::TcpFailure };
                let why = if e.timeout { "timeout: no response" } else { "tcp failure" };
                pending = Some((node.addr, report, format!("{why}: {}", e.reason)));
                if let (Some(back), Source::Stream(slot)) = (e.body, &mut source) {
                    // Never sent: the streamed body is intact and may go to the next node.
                    *slot = Some(back);
                }
                if e.sent && !idempotent {
                    // The node may have acted on it: never send a non-idempotent request twice.
                    break;
                }
            }
        }
    }
    let (status, msg) = if last_timeout {
        (StatusCode::GATEWAY_TIMEOUT, "504 Gateway Timeout: the upstream did not answer in time")
    } else {
        (StatusCode::BAD_GATEWAY, "502 Bad Gateway: no upstream node could serve the request")
    };
    gateway_error(status, msg, fin)
}

/// The absolute URI of a request to an HTTP/2 upstream (`:scheme`, `:authority`, `:path`).
/// Whether every byte of a path is one `http::uri::PathAndQuery` takes as it is (RFC 3986
/// `pchar` and `/`, and the `"`, `{`, `}` that clients send unescaped).
fn plain_target(path: &str) -> bool {
    path.bytes()
        .all(|b| matches!(b, 0x21 | 0x24..=0x3B | 0x3D | 0x40..=0x5F | 0x61..=0x7A | 0x7C | 0x7E | b'"' | b'{' | b'}'))
}

fn h2_uri(tls: bool, host: Option<HeaderValue>, target: &str) -> Result<http::Uri, String> {
    let host = host.ok_or("no host for the upstream request")?;
    let authority =
        http::uri::Authority::try_from(host.as_bytes()).map_err(|e| format!("invalid upstream host: {e}"))?;
    http::Uri::builder()
        .scheme(if tls { "https" } else { "http" })
        .authority(authority)
        .path_and_query(target)
        .build()
        .map_err(|e| format!("invalid upstream URI: {e}"))
}

/// A response the gateway makes itself once the request has a route (502, 503, 504): it goes
/// through `header_filter`, `body_filter` and `log` like any response (docs/phases.md), so that
/// request-id, response-rewrite and loggers see it. On a gRPC route it is a gRPC status instead.
fn gateway_error(status: StatusCode, msg: &str, fin: Box<Finish>) -> Response {
    if fin.grpc {
        return plugin_response(grpc_status(status, msg), fin);
    }
    plugin_response(PluginResponse::json(status, &json!({ "error_msg": msg })), fin)
}

/// A gRPC "trailers-only" answer: HTTP 200 with `grpc-status` and `grpc-message` and no body,
/// which gRPC clients read as the call's status. Codes: 504 is DEADLINE_EXCEEDED, other gateway
/// errors UNAVAILABLE (gRPC's HTTP mapping).
fn grpc_status(status: StatusCode, msg: &str) -> PluginResponse {
    let code = match status {
        StatusCode::GATEWAY_TIMEOUT => "4",
        StatusCode::NOT_FOUND => "12",
        StatusCode::UNAUTHORIZED => "16",
        StatusCode::FORBIDDEN => "7",
        StatusCode::TOO_MANY_REQUESTS | StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE => "14",
        _ => "13",
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from_static(code));
    // grpc-message is percent-encoded (gRPC over HTTP/2, "Responses").
    let mut encoded = String::with_capacity(msg.len());
    for b in msg.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            encoded.push(char::from(b));
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    if let Ok(v) = HeaderValue::from_str(&encoded) {
        headers.insert("grpc-message", v);
    }
    PluginResponse { status: StatusCode::OK, headers, body: Bytes::new() }
}

/// The upstream accepted the WebSocket handshake: answer the client with its 101 (after the
/// header filters), then copy bytes both ways on the worker until either side closes or the
/// tunnel idles for `timeout.read`. The log phase runs when the tunnel ends.
fn upgraded(
    mut resp: http::Response<Inbound>,
    client: hyper::upgrade::OnUpgrade,
    mut finish: Box<Finish>,
    inflight: Option<InFlight>,
    idle: std::time::Duration,
) -> Response {
    let upstream = hyper::upgrade::on(&mut resp);
    let (parts, _) = resp.into_parts();
    let mut head = ResponseHead { status: parts.status, headers: parts.headers };
    let token = head.headers.get(http::header::UPGRADE).cloned();
    strip_hop_by_hop(&mut head.headers);
    for (k, v) in finish.ctx.response_headers.drain(..) {
        head.headers.append(k, v);
    }
    finish.ctx.status = 101;
    for p in finish.chains.iter().flat_map(|c| c.iter()) {
        p.instance.header_filter(&mut finish.ctx, &mut head);
    }
    head.headers.insert(http::header::CONNECTION, HeaderValue::from_static("upgrade"));
    head.headers.insert(http::header::UPGRADE, token.unwrap_or(HeaderValue::from_static("websocket")));
    finish.ctx.head_bytes_sent = head_bytes(&head);
    finish._inflight = inflight;
    tokio::task::spawn_local(async move {
        let remote = finish.ctx.remote_addr;
        match super::tunnel::run(client, upstream, idle).await {
            Ok(outcome) => log::debug!("client {remote}: WebSocket closed: {outcome}"),
            Err(e) => log::debug!("client {remote}: WebSocket ended: {e}"),
        }
        drop(finish);
    });
    let mut out = http::Response::new(ResponseBody::Full(None));
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *out.headers_mut() = head.headers;
    out
}

fn respond(resp: http::Response<Inbound>, mut finish: Box<Finish>, inflight: Option<InFlight>) -> Response {
    let (parts, incoming) = resp.into_parts();
    let len = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut head = ResponseHead { status: parts.status, headers: parts.headers };
    // An HTTP/1.1 head arrives without hop-by-hop fields (`h1codec` leaves them out as it
    // parses); only hyper's HTTP/2 answers still need the pass.
    if let Inbound::Hyper(_) = incoming {
        strip_hop_by_hop(&mut head.headers);
    }
    for (k, v) in finish.ctx.response_headers.drain(..) {
        head.headers.append(k, v);
    }
    finish.ctx.status = head.status.as_u16();
    for p in finish.chains.iter().flat_map(|c| c.iter()) {
        p.instance.header_filter(&mut finish.ctx, &mut head);
    }
    finish.ctx.status = head.status.as_u16();
    finish.ctx.head_bytes_sent = head_bytes(&head);
    let no_body = head.status == StatusCode::NO_CONTENT
        || head.status == StatusCode::NOT_MODIFIED
        || finish.ctx.method == Method::HEAD;
    finish._inflight = inflight;
    if no_body {
        // A bodiless HTTP/1.1 answer already gave its connection back to the pool; one that
        // came with a body anyway is closed with `incoming`.
        drop(incoming);
        // The upstream's Content-Length stays (HEAD announces the length of what GET returns).
        let mut resp = http::Response::new(ResponseBody::Full(None));
        *resp.status_mut() = head.status;
        *resp.headers_mut() = head.headers;
        drop(finish);
        return resp;
    }
    with_head(head, ResponseBody::Upstream(UpstreamBody::new(incoming, len, finish)))
}
