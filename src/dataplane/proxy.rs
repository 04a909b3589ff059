//! The request path: match a route, run the plugin phases, pick a node, forward, stream back.

use std::cell::RefCell;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::http::StatusCode as ActixStatus;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::{Bytes, BytesMut};
use futures_core::Stream;
use http::{HeaderValue, Method, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use tokio::sync::mpsc;
use weir_plugin::{Flow, PluginResponse, RequestCtx, ResponseHead};

use super::body::{OnFinish, ProxyBody, UpstreamBody};
use super::headers::{from_actix, set_forwarded, strip_hop_by_hop};
use super::upstream::{fnv1a, CompiledUpstream, InFlight};
use crate::health::checker::Source as ReportSource;
use crate::health::state::Report;
use crate::health::HealthRegistry;
use crate::resources::model::{HashOn, PassHost, Scheme};
use crate::resources::snapshot::PluginChain;
use crate::state::Gateway;

/// Largest request body buffered for a plugin that asks for the whole body.
pub const MAX_BUFFERED_BODY: usize = 16 << 20;
/// Request bodies up to this size (with a known length) are read before proxying, so that a
/// failed attempt can be retried on the next node, as nginx does with `client_body_buffer_size`.
/// Larger bodies stream and are not retried once sent.
pub const REPLAYABLE_BODY: u64 = 64 << 10;
/// Longest request target (path and query), as nginx's default `large_client_header_buffers`.
pub const MAX_REQUEST_TARGET: usize = 8 << 10;
/// Longest single header line.
pub const MAX_HEADER_LINE: usize = 8 << 10;
/// Largest total size of request headers.
pub const MAX_HEADERS_TOTAL: usize = 32 << 10;

/// Request line and header limits (actix's own limits are looser: 128 KiB buffer, 96 headers).
fn check_limits(req: &HttpRequest) -> Option<HttpResponse> {
    let target = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    if target > MAX_REQUEST_TARGET {
        return Some(error_response(ActixStatus::URI_TOO_LONG, "414 Request-URI Too Large"));
    }
    let mut total = 0;
    for (k, v) in req.headers().iter() {
        let line = k.as_str().len() + v.len() + 4;
        total += line;
        if line > MAX_HEADER_LINE || total > MAX_HEADERS_TOTAL {
            return Some(error_response(
                ActixStatus::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "431 Request Header Fields Too Large",
            ));
        }
    }
    None
}

/// An upstream client: plain HTTP, or HTTPS (whose TLS configuration, and the system root
/// certificates, are loaded only when an https upstream exists).
#[derive(Clone)]
enum HttpClient {
    Plain(Client<HttpConnector, ProxyBody>),
    Tls(Client<HttpsConnector<HttpConnector>, ProxyBody>),
}

impl HttpClient {
    async fn request(
        &self,
        req: http::Request<ProxyBody>,
    ) -> Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        match self {
            HttpClient::Plain(c) => c.request(req).await,
            HttpClient::Tls(c) => c.request(req).await,
        }
    }
}

/// What distinguishes one upstream client (and its pool) from another.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ClientKey {
    tls: bool,
    connect_timeout: Duration,
    verify: bool,
    pool_size: u32,
    idle_timeout_ms: u64,
}

/// Per-worker state: upstream connection pools, one client per distinct connection setting
/// (typically a handful), looked up without hashing.
#[derive(Default)]
pub struct Worker {
    clients: RefCell<Vec<(ClientKey, HttpClient)>>,
}

impl Worker {
    fn client(&self, upstream: &CompiledUpstream) -> HttpClient {
        let pool = upstream.conf.keepalive_pool;
        let key = ClientKey {
            tls: upstream.scheme == Scheme::Https,
            connect_timeout: upstream.timeouts.connect,
            verify: upstream.conf.tls.is_none_or(|t| t.verify),
            pool_size: pool.map_or(320, |p| p.size),
            idle_timeout_ms: pool.map_or(60_000, |p| (p.idle_timeout * 1000.0) as u64),
        };
        let mut clients = self.clients.borrow_mut();
        if let Some((_, c)) = clients.iter().find(|(k, _)| *k == key) {
            return c.clone();
        }
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        http.set_connect_timeout(Some(key.connect_timeout));
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_idle_timeout(Duration::from_millis(key.idle_timeout_ms.max(1)))
            .pool_max_idle_per_host(key.pool_size as usize);
        let client = if key.tls {
            let connector = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(super::tls::client_config(key.verify))
                .https_only()
                .enable_http1()
                .wrap_connector(http);
            HttpClient::Tls(builder.build(connector))
        } else {
            HttpClient::Plain(builder.build(http))
        };
        clients.push((key, client.clone()));
        client
    }
}

/// The log phase, run once the response is done; also carries body filters.
struct Finish {
    ctx: RequestCtx,
    chains: [PluginChain; 2],
    filters_body: bool,
    _inflight: Option<InFlight>,
}

impl Finish {
    fn new(ctx: RequestCtx, chains: [PluginChain; 2]) -> Self {
        let filters_body = chains.iter().flat_map(|c| c.iter()).any(|p| p.instance.wants_response_body());
        Finish { ctx, chains, filters_body, _inflight: None }
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
}

impl Drop for Finish {
    fn drop(&mut self) {
        for p in self.chains.iter().flat_map(|c| c.iter()) {
            p.instance.log(&self.ctx);
        }
    }
}

fn error_response(status: ActixStatus, msg: &str) -> HttpResponse {
    HttpResponse::build(status)
        .insert_header((actix_web::http::header::CONTENT_TYPE, "application/json"))
        .body(json!({ "error_msg": msg }).to_string())
}

/// Converts an `http` 1 response head + body into an actix response.
fn to_actix(head: ResponseHead) -> actix_web::HttpResponseBuilder {
    let status = ActixStatus::from_u16(head.status.as_u16()).unwrap_or(ActixStatus::BAD_GATEWAY);
    let mut out = HttpResponse::build(status);
    for (k, v) in head.headers.iter() {
        if k == http::header::CONTENT_LENGTH || k == http::header::TRANSFER_ENCODING {
            continue;
        }
        out.append_header((k.as_str(), v.as_bytes()));
    }
    out
}

/// Answers with a plugin's response, after the header filters.
fn plugin_response(resp: PluginResponse, mut finish: Finish) -> HttpResponse {
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
    to_actix(head).body(body)
}

async fn resolve(mut flow: Flow) -> Option<PluginResponse> {
    loop {
        match flow {
            Flow::Continue => return None,
            Flow::Respond(r) => return Some(r),
            Flow::Defer(f) => flow = f.await,
        }
    }
}

async fn read_body(payload: &mut web::Payload, limit: usize) -> Result<Bytes, HttpResponse> {
    let mut buf = BytesMut::new();
    while let Some(chunk) = poll_fn(|cx| Pin::new(&mut *payload).poll_next(cx)).await {
        let chunk =
            chunk.map_err(|e| error_response(ActixStatus::BAD_REQUEST, &format!("cannot read request body: {e}")))?;
        if buf.len() + chunk.len() > limit {
            return Err(error_response(ActixStatus::PAYLOAD_TOO_LARGE, "request body too large"));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// Where the upstream request body comes from.
enum Source {
    Empty,
    Buffered(Bytes),
    Stream(Option<web::Payload>),
}

/// The data-plane handler.
pub async fn handle(
    req: HttpRequest,
    mut payload: web::Payload,
    gw: web::Data<Gateway>,
    worker: web::Data<Worker>,
) -> HttpResponse {
    if let Some(refused) = check_limits(&req) {
        return refused;
    }
    let snap = gw.resources.load_full();
    let remote = req.peer_addr().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    let local = req.app_config().local_addr();
    let host_header = req.headers().get(actix_web::http::header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    let host = strip_port(host_header);
    let Some(matched) = snap.table.find(req.method().as_str(), host, req.path(), remote.ip()) else {
        return error_response(ActixStatus::NOT_FOUND, "404 Route Not Found");
    };
    let method = Method::from_bytes(req.method().as_str().as_bytes()).unwrap_or(Method::GET);
    let mut ctx = RequestCtx::new(
        method,
        req.path().to_owned(),
        req.query_string().to_owned(),
        from_actix(req.headers()),
        remote,
        local,
    );
    let route = matched.route;
    ctx.route_id = Some(route.id.clone());
    ctx.service_id = route.service_id.clone();
    ctx.params = matched.params;
    let chains = [snap.global_chain.clone(), route.plugins.clone()];

    let declared_len: Option<u64> = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let chunked = req.headers().contains_key(actix_web::http::header::TRANSFER_ENCODING);
    let has_body = chunked || declared_len.is_some_and(|n| n > 0);
    let mut body_buf: Option<Bytes> = None;
    let wants_body = chains.iter().flat_map(|c| c.iter()).any(|p| p.instance.wants_request_body());
    let small = declared_len.is_some_and(|n| n <= REPLAYABLE_BODY) && !chunked;
    if (wants_body || small) && has_body {
        match read_body(&mut payload, MAX_BUFFERED_BODY).await {
            Ok(b) => body_buf = Some(b),
            Err(resp) => return resp,
        }
    }

    if wants_body {
        ctx.body = body_buf.take();
    }
    for phase in 0..2 {
        for p in chains.iter().flat_map(|c| c.iter()) {
            let flow = if phase == 0 { p.instance.rewrite(&mut ctx) } else { p.instance.access(&mut ctx) };
            if let Some(resp) = resolve(flow).await {
                return plugin_response(resp, Finish::new(ctx, chains));
            }
        }
    }

    let Some(upstream) = route.upstream.clone() else {
        ctx.status = 503;
        let _finish = Finish::new(ctx, chains);
        return error_response(ActixStatus::SERVICE_UNAVAILABLE, "missing upstream configuration in Route or Service");
    };
    let source = match ctx.body.take().or(body_buf) {
        Some(b) => Source::Buffered(b),
        None if has_body => Source::Stream(Some(payload)),
        None => Source::Empty,
    };
    forward(ctx, chains, upstream, source, host_header, &worker, &gw.health).await
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
    Some(fnv1a(value.unwrap_or_else(|| ctx.remote_addr.ip().to_string()).as_bytes()))
}

enum Failure {
    BadGateway,
    Timeout,
}

async fn forward(
    mut ctx: RequestCtx,
    chains: [PluginChain; 2],
    upstream: Arc<CompiledUpstream>,
    mut source: Source,
    original_host: &str,
    worker: &Worker,
    health: &HealthRegistry,
) -> HttpResponse {
    let checker = health.ensure(&upstream);
    let replayable = !matches!(source, Source::Stream(_));
    let max_attempts = if replayable { upstream.retries + 1 } else { 1 };
    let started = Instant::now();
    let client = worker.client(&upstream);
    let hash = hash_key(&ctx, &upstream);
    let original_host = HeaderValue::from_str(original_host).ok();
    let scheme = match upstream.scheme {
        Scheme::Http => "http",
        Scheme::Https => "https",
    };
    set_forwarded(
        &mut ctx.headers,
        &ctx.remote_addr.ip().to_string(),
        ctx.scheme,
        original_host.as_ref(),
        ctx.local_addr.port(),
    );
    let mut tried: Vec<usize> = Vec::with_capacity(2);
    let mut last = Failure::BadGateway;
    // A failed attempt is reported to the health checker when it is retried (as the reference says).
    let mut pending: Option<(SocketAddr, Report, String)> = None;
    for attempt in 0..max_attempts {
        if attempt > 0 && upstream.retry_timeout.is_some_and(|t| started.elapsed() > t) {
            break;
        }
        let healthy_exists =
            checker.as_ref().is_none_or(|c| upstream.nodes.iter().any(|n| n.weight > 0 && c.takes_traffic(n.addr)));
        if let Some(c) = &checker {
            c.note_fallback(!healthy_exists);
        }
        let eligible = |i: usize| {
            !tried.contains(&i)
                && (!healthy_exists || checker.as_ref().is_none_or(|c| c.takes_traffic(upstream.nodes[i].addr)))
        };
        let Some((idx, inflight)) = upstream.pick(hash, eligible) else { break };
        if let (Some(c), Some((addr, report, why))) = (&checker, pending.take()) {
            c.report(addr, report, ReportSource::Passive, &why);
        }
        tried.push(idx);
        let node = &upstream.nodes[idx];
        ctx.upstream_addrs.push(node.addr);
        let uri = if ctx.query.is_empty() {
            format!("{scheme}://{}{}", node.authority, ctx.path)
        } else {
            format!("{scheme}://{}{}?{}", node.authority, ctx.path, ctx.query)
        };
        // The last attempt may move the headers out, unless a plugin reads them after the request.
        let keep = attempt + 1 < max_attempts || chains.iter().any(|c| !c.is_empty());
        let mut headers = if keep { ctx.headers.clone() } else { std::mem::take(&mut ctx.headers) };
        match upstream.pass_host {
            PassHost::Pass => {}
            PassHost::Node => {
                headers.insert(http::header::HOST, node.host_header.clone());
            }
            PassHost::Rewrite => {
                if let Some(h) = &upstream.upstream_host {
                    headers.insert(http::header::HOST, h.clone());
                }
            }
        }
        let body = match &mut source {
            Source::Empty => ProxyBody::Empty,
            Source::Buffered(b) => ProxyBody::Full(Some(b.clone())),
            Source::Stream(p) => match p.take() {
                Some(payload) => pump(payload, headers.get(http::header::CONTENT_LENGTH)),
                None => ProxyBody::Empty,
            },
        };
        let mut request = http::Request::new(body);
        *request.method_mut() = ctx.method.clone();
        *request.uri_mut() = match uri.parse() {
            Ok(u) => u,
            Err(e) => return error_response(ActixStatus::BAD_REQUEST, &format!("invalid request path: {e}")),
        };
        *request.headers_mut() = headers;
        let budget = upstream.timeouts.connect + upstream.timeouts.send + upstream.timeouts.read;
        match tokio::time::timeout(budget, client.request(request)).await {
            Ok(Ok(resp)) => {
                if let Some(c) = &checker {
                    c.report_status(node.addr, resp.status().as_u16());
                }
                return respond(resp, ctx, chains, inflight, upstream.timeouts.read);
            }
            Ok(Err(e)) if e.is_connect() => {
                log::warn!("upstream {} of route {:?}: connect failed: {e:?}", node.addr, ctx.route_id);
                last = Failure::BadGateway;
                pending = Some((node.addr, Report::TcpFailure, format!("tcp failure: {e}")));
            }
            Ok(Err(e)) => {
                log::warn!("upstream {} of route {:?}: {e:?}", node.addr, ctx.route_id);
                last = Failure::BadGateway;
                pending = Some((node.addr, Report::TcpFailure, format!("tcp failure: {e}")));
            }
            Err(_) => {
                log::warn!("upstream {} of route {:?}: timed out after {budget:?}", node.addr, ctx.route_id);
                last = Failure::Timeout;
                pending = Some((node.addr, Report::Timeout, "timeout: no response".to_owned()));
            }
        }
    }
    let (status, msg) = match last {
        Failure::Timeout => (ActixStatus::GATEWAY_TIMEOUT, "504 Gateway Timeout: the upstream did not answer in time"),
        Failure::BadGateway => (ActixStatus::BAD_GATEWAY, "502 Bad Gateway: no upstream node could serve the request"),
    };
    ctx.status = status.as_u16();
    let _finish = Finish::new(ctx, chains);
    error_response(status, msg)
}

/// Streams the client's body to the upstream through a bounded channel.
fn pump(mut payload: web::Payload, content_length: Option<&HeaderValue>) -> ProxyBody {
    let len = content_length.and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    actix_web::rt::spawn(async move {
        while let Some(chunk) = poll_fn(|cx| Pin::new(&mut payload).poll_next(cx)).await {
            let item = chunk.map_err(std::io::Error::other);
            let failed = item.is_err();
            if tx.send(item).await.is_err() || failed {
                break;
            }
        }
    });
    ProxyBody::Channel { rx, len }
}

fn respond(
    resp: http::Response<hyper::body::Incoming>,
    mut ctx: RequestCtx,
    chains: [PluginChain; 2],
    inflight: Option<InFlight>,
    read_timeout: Duration,
) -> HttpResponse {
    let (parts, incoming) = resp.into_parts();
    let len = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut head = ResponseHead { status: parts.status, headers: parts.headers };
    strip_hop_by_hop(&mut head.headers);
    for (k, v) in ctx.response_headers.drain(..) {
        head.headers.append(k, v);
    }
    ctx.status = head.status.as_u16();
    for p in chains.iter().flat_map(|c| c.iter()) {
        p.instance.header_filter(&mut ctx, &mut head);
    }
    ctx.status = head.status.as_u16();
    let no_body = head.status == StatusCode::NO_CONTENT || head.status == StatusCode::NOT_MODIFIED;
    let mut finish = Finish::new(ctx, chains);
    finish._inflight = inflight;
    let mut out = to_actix(head);
    if no_body {
        return out.finish();
    }
    out.body(UpstreamBody::new(incoming, len, finish, read_timeout))
}
