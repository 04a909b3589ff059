//! Forwarding a request upstream: choose a node (skipping tried ones), send through the
//! worker's pool, retry what may be retried, report to the health checker, answer 502/504.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderValue, StatusCode};
use weir_plugin::{measure, RequestCtx};

use super::finish::{error_response, gateway_error, respond, upgraded, Finish};
use super::{Response, Source, Tunnel, Worker};
use crate::dataplane::body::{BodyWait, Inbound, ProxyBody};
use crate::dataplane::client::Pool;
use crate::dataplane::headers::ProxyHeaders;
use crate::dataplane::upstream_conn::RequestHead;
use crate::health::checker::Source as ReportSource;
use crate::health::state::Report;
use crate::health::HealthRegistry;
use crate::resources::model::PassHost;
use crate::tables::upstream::CompiledUpstream;

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

fn is_idempotent(ctx: &RequestCtx) -> bool {
    !ctx.non_idempotent && !matches!(ctx.method.as_str(), "POST" | "PATCH" | "LOCK")
}

pub(super) async fn forward(
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
    let hash = upstream.request_hash(&fin.ctx);
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
        Source::Stream(Some(body)) => body.wait(),
        _ => None,
    };
    let timeouts = fin.timeouts.unwrap_or(upstream.timeouts);
    let mut tried = Tried::default();
    let mut last_timeout = false;
    // A failed attempt is reported to the health checker when it is retried (as the reference says).
    let mut pending: Option<(SocketAddr, Report, String)> = None;
    // A plugin records the attempts or traces them (opentelemetry): only then is anything
    // measured or written per attempt.
    let watched = measure::attempts_watched(&fin.ctx);
    // The answer's fields go to an HTTP/1.1 client as the lines they came in (names in lower
    // case), never into a map, when nothing reads them on the way: no header filter, no debug
    // header, not a HEAD or a WebSocket handshake (`h1codec::Lines`).
    let as_lines = fin.ctx.version <= http::Version::HTTP_11
        && !fin.debug
        && fin.ctx.method != http::Method::HEAD
        && tunnel.is_none()
        && !fin.chains.iter().any(|c| c.header_filters);
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
        // Each attempt is a span of its own, and goes upstream with its id in `traceparent`.
        let trace = if watched { measure::attempt_trace(&fin.ctx.measured) } else { None };
        let begun = if watched { measure::attempt_begins(&fin.ctx.measured, trace.as_ref()) } else { None };
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
            if let Some(t) = &trace {
                t.apply(&mut headers);
            }
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
                Box::pin(crate::dataplane::tunnel::handshake(&worker.pool, &node.pool_key, &timeouts, request)).await
            } else {
                Box::pin(worker.pool.send_h2(&node.pool_key, &timeouts, request)).await
            };
            answer.map(|r| r.map(Inbound::Hyper))
        } else {
            // HTTP/1.1: the head is written from the client's header map as it is, with the
            // proxy headers and Host set as it is encoded (no copy of the map per attempt).
            let (mut set, mut n) = proxy_headers.lines(host);
            if let Some(t) = &trace {
                // An empty tracestate removes the client's.
                set[n] = (&crate::dataplane::headers::TRACEPARENT_NAME, t.traceparent());
                set[n + 1] = (&crate::dataplane::headers::TRACESTATE_NAME, t.tracestate());
                n += crate::dataplane::headers::LINES_ROOM;
            }
            let head = RequestHead {
                method: &fin.ctx.method,
                target: &target,
                headers: &fin.ctx.headers,
                set: &set[..n],
                lines: as_lines,
            };
            Pool::send(&worker.pool, &node.pool_key, upstream.pool, &timeouts, &head, body, stalled.clone(), idempotent)
                .await
                .map(|r| r.map(Inbound::H1))
        };
        match exchange {
            Ok(resp) => {
                fin.ctx.upstream_time = Some(started.elapsed());
                if begun.is_some() {
                    measure::attempt_ends(&mut fin.ctx.measured, begun, node.addr, Some(resp.status().as_u16()), None);
                }
                if let Some(c) = &checker {
                    c.report_status(node.addr, resp.status().as_u16());
                }
                if let (Some(t), StatusCode::SWITCHING_PROTOCOLS) = (tunnel.take(), resp.status()) {
                    let held = super::Held::new(&worker.held);
                    return upgraded(resp, t.client, fin, inflight, timeouts.read, held);
                }
                return respond(resp, fin, inflight);
            }
            Err(e) => {
                if begun.is_some() {
                    measure::attempt_ends(&mut fin.ctx.measured, begun, node.addr, None, Some(&e.reason));
                }
                // The client's fault, not the node's: no health report, no retry (nginx answers
                // these 408 and 400 too). Else a client could have healthy nodes marked down by
                // sending broken bodies.
                let client_fault = match stalled.as_ref().map(|w| w.get()) {
                    // It stopped sending its body (`gateway.client_body_timeout`).
                    Some(BodyWait::GaveUp) => {
                        Some((StatusCode::REQUEST_TIMEOUT, super::body_stalled(worker.body_timeout)))
                    }
                    Some(BodyWait::Failed) => Some((StatusCode::BAD_REQUEST, super::BODY_BROKEN.to_owned())),
                    _ => None,
                };
                if let Some((status, msg)) = client_fault {
                    log::debug!("client {}: {} (route {:?})", fin.ctx.remote_addr, e.reason, fin.ctx.route_id);
                    return gateway_error(status, &msg, fin);
                }
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
