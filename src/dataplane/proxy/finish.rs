//! The response side of a request and the phases around it: `rewrite`/`access` (which may wait
//! with the request in hand), the consumer's plugins merged in, the header and body filters
//! decided per response, the log phase when the response is done, and the answers the gateway
//! or a plugin makes itself.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use serde_json::json;
use weir_plugin::measure::{self, note_phase, phase_clock, Measured, Phase};
use weir_plugin::{BodyFilter, Flow, PluginResponse, RequestCtx, ResponseHead};

use super::Response;
use crate::dataplane::body::{Inbound, OnFinish, ResponseBody, UpstreamBody};
use crate::dataplane::headers::{line_len, strip_hop_by_hop};
use crate::tables::snapshot::{merge_chains, BoundPlugin, PluginChain};
use crate::tables::upstream::{InFlight, Timeouts};

/// The response header `gateway.debug_header` adds.
pub const DEBUG_HEADER: http::HeaderName = http::HeaderName::from_static("x-weir-debug");
/// The upstream's status, on responses the upstream produced (5xx, or all with
/// `gateway.show_upstream_status_in_response_header`), as APISIX's `X-APISIX-Upstream-Status`.
pub const UPSTREAM_STATUS: http::HeaderName = http::HeaderName::from_static("x-weir-upstream-status");

/// The log phase, run once the response is done; also carries body filters.
pub struct Finish {
    pub(super) ctx: RequestCtx,
    /// The global rules' chain and the route's (with its service's and, once known, its
    /// consumer's plugins).
    pub(super) chains: [PluginChain; 2],
    /// The plugins filtering this response's body, by position in `chains`, and whether each
    /// only observes it (decided by their header filters; empty, and no allocation, when none
    /// does).
    filters: Vec<(u16, bool)>,
    /// Some plugin reads the request headers after forwarding (`Late::headers`).
    pub(super) late_headers: bool,
    /// The route proxies gRPC: gateway errors answer in gRPC's terms.
    pub(super) grpc: bool,
    /// Body bytes received from the client, for a streamed body (added to `request_length`).
    pub(super) body_received: Option<Rc<Cell<u64>>>,
    /// When the first upstream attempt began (`upstream_time` runs from here).
    pub(super) upstream_started: Option<Instant>,
    /// The route's own upstream timeouts (`timeout`), over the upstream's.
    pub(super) timeouts: Option<Timeouts>,
    /// Add `X-Weir-Debug` to the response (`gateway.debug_header`, or the route's label).
    pub(super) debug: bool,
    /// Add `X-Weir-Upstream-Status` to every upstream answer, not only 5xx ones
    /// (`gateway.show_upstream_status_in_response_header`).
    pub(super) upstream_status_always: bool,
    pub(super) _inflight: Option<InFlight>,
}

impl Finish {
    /// Boxed: the request context is most of a response's size, and a response is moved
    /// several times on its way to hyper (each move copied ~1 KB).
    pub(super) fn new(mut ctx: RequestCtx, chains: [PluginChain; 2]) -> Box<Self> {
        if measure::always() {
            // Per-plugin cost is on (`plugin_latency`, `$plugin_time`): time every phase.
            ctx.measured = Some(Box::new(Measured { phases: true, ..Measured::default() }));
        }
        let late_headers = chains[0].late_headers || chains[1].late_headers;
        Box::new(Finish {
            ctx,
            chains,
            filters: Vec::new(),
            late_headers,
            grpc: false,
            body_received: None,
            upstream_started: None,
            timeouts: None,
            debug: false,
            upstream_status_always: false,
            _inflight: None,
        })
    }

    /// `X-Weir-Debug: route=<id>; plugins=<a,b>; node=<ip:port>`: the route, the plugins of the
    /// request's chains that apply to it (global rules first), and the last node tried (`-`:
    /// none). Built only when asked for.
    #[cold]
    fn debug_header(&self, head: &mut ResponseHead) {
        let mut v = String::with_capacity(64);
        v.push_str("route=");
        v.push_str(self.ctx.route_id.as_deref().unwrap_or("-"));
        v.push_str("; plugins=");
        let mut first = true;
        for p in self.chains.iter().flat_map(|c| c.iter()).filter(|p| p.runs_for(&self.ctx)) {
            if !first {
                v.push(',');
            }
            first = false;
            v.push_str(p.entry.name);
        }
        if first {
            v.push('-');
        }
        v.push_str("; node=");
        match self.ctx.upstream_addrs.last() {
            Some(a) => v.push_str(&a.to_string()),
            None => v.push('-'),
        }
        if let Ok(value) = HeaderValue::from_str(&v) {
            head.headers.insert(DEBUG_HEADER, value);
        }
    }

    /// Runs the header filters on `head`, and notes which plugins filter this body.
    fn header_filters(&mut self, head: &mut ResponseHead) {
        let Finish { ctx, chains, filters, .. } = self;
        let mut at: u16 = 0;
        for chain in chains.iter() {
            if !chain.header_filters {
                at = at.saturating_add(chain.len() as u16);
                continue;
            }
            for p in chain.iter() {
                if p.late.header_filter && p.runs_for(ctx) {
                    let t0 = phase_clock(ctx);
                    match p.instance.header_filter(ctx, head) {
                        BodyFilter::Skip => {}
                        BodyFilter::Filter => filters.push((at, false)),
                        BodyFilter::Observe => filters.push((at, true)),
                    }
                    note_phase(ctx, t0, p.entry.name, Phase::HeaderFilter);
                }
                at = at.saturating_add(1);
            }
        }
    }
}

impl OnFinish for Finish {
    fn chunk(&mut self, chunk: &mut Bytes, eof: bool) {
        let Finish { ctx, chains, filters, .. } = self;
        for &(at, observe) in filters.iter() {
            let (at, first) = (usize::from(at), chains[0].len());
            let p = if at < first { chains[0].get(at) } else { chains[1].get(at - first) };
            let Some(p) = p else { continue };
            let t0 = phase_clock(ctx);
            if observe {
                // A clone (a reference count): what an observer does to it is not sent.
                p.instance.body_filter(ctx, &mut chunk.clone(), eof);
            } else {
                p.instance.body_filter(ctx, chunk, eof);
            }
            note_phase(ctx, t0, p.entry.name, Phase::BodyFilter);
        }
    }
    fn filters_body(&self) -> bool {
        !self.filters.is_empty()
    }
    fn changes_body(&self) -> bool {
        self.filters.iter().any(|(_, observe)| !observe)
    }
    fn sent(&mut self, n: u64) {
        self.ctx.body_bytes_sent = n;
    }
    fn fields(&self) -> &[(http::HeaderName, HeaderValue)] {
        &self.ctx.response_headers
    }
    fn upstream_done(&mut self) {
        // As nginx's $upstream_response_time: until the upstream's last byte arrived.
        self.ctx.upstream_time = self.upstream_started.map(|t| t.elapsed());
        if self.ctx.measured.is_some() {
            measure::answer_done(&mut self.ctx);
        }
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
        let Finish { ctx, chains, .. } = self;
        let last = chains.iter().any(|c| c.logs_last);
        for chain in chains.iter().filter(|c| c.logs) {
            for p in chain.iter() {
                if !p.late.log || !p.runs_for(ctx) || (last && p.instance.log_last()) {
                    continue;
                }
                let t0 = phase_clock(ctx);
                p.instance.log(ctx);
                note_phase(ctx, t0, p.entry.name, Phase::Log);
            }
        }
        if last {
            // Plugins reporting on the others' phases (opentelemetry) log after all of them.
            for p in chains.iter().flat_map(|c| c.iter()).filter(|p| p.late.log && p.runs_for(ctx)) {
                if p.instance.log_last() {
                    p.instance.log(ctx);
                }
            }
        }
        if ctx.measured.is_some() {
            measure::finished(ctx);
        }
        crate::access_log::record(ctx);
        crate::route_stats::record(ctx);
    }
}

/// Bytes of a response head as HTTP/1.1 text: status line, headers, blank line (`$bytes_sent`).
pub(super) fn head_bytes(head: &ResponseHead) -> u64 {
    (field_bytes(&head.headers) + 17 + head.status.canonical_reason().map_or(0, str::len)) as u64
}

/// Bytes of header fields as HTTP/1.1 text: `name: value` and CRLF each.
fn field_bytes(headers: &http::HeaderMap) -> usize {
    headers.iter().map(|(k, v)| line_len(k, v)).sum()
}

/// Bytes of a list of fields as HTTP/1.1 text.
fn field_list_bytes(fields: &[(http::HeaderName, HeaderValue)]) -> u64 {
    fields.iter().map(|(k, v)| line_len(k, v)).sum::<usize>() as u64
}

/// Bytes of a request head as HTTP/1.1 text (`$request_length`, without the body): the request
/// line (`METHOD SP target SP HTTP/1.1 CRLF`), the fields, the blank line.
/// `fields`: the fields' size ([`crate::dataplane::headers::RequestFields::bytes`]).
pub(super) fn request_head_bytes(method: &Method, target: usize, fields: usize) -> u64 {
    (method.as_str().len() + 1 + target + 1 + 8 + 2 + fields + 2) as u64
}

/// `content-length: N\r\n`, which the server adds to a whole body.
pub(super) fn content_length_bytes(len: usize) -> u64 {
    let digits = len.checked_ilog10().map_or(1, |d| d + 1);
    u64::from(digits) + 18
}

pub(super) fn error_response(status: StatusCode, msg: &str) -> Response {
    let mut resp = http::Response::new(ResponseBody::Full(Some(Bytes::from(json!({ "error_msg": msg }).to_string()))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A response with `head`, its framing fields dropped (the body says its own length) unless
/// `framed_by_server`: Weir's HTTP/1.1 server leaves them out as it encodes the head
/// (`h1server::respond`), which spares two map removals per response; hyper's HTTP/2 server
/// and HTTP/3 would send them as they are.
pub(super) fn with_head(mut head: ResponseHead, body: ResponseBody<Box<Finish>>, framed_by_server: bool) -> Response {
    if !framed_by_server {
        head.headers.remove(http::header::CONTENT_LENGTH);
        head.headers.remove(http::header::TRANSFER_ENCODING);
    }
    let mut resp = http::Response::new(body);
    *resp.status_mut() = head.status;
    *resp.headers_mut() = head.headers;
    resp
}

/// Answers with a plugin's response, after the header filters.
pub(super) fn plugin_response(resp: PluginResponse, mut finish: Box<Finish>) -> Response {
    let mut head = ResponseHead { status: resp.status, headers: resp.headers };
    for (k, v) in finish.ctx.response_headers.drain(..) {
        head.headers.append(k, v);
    }
    finish.ctx.status = head.status.as_u16();
    finish.header_filters(&mut head);
    if finish.debug {
        finish.debug_header(&mut head);
    }
    let mut body = resp.body;
    if finish.filters_body() {
        finish.chunk(&mut body, true);
    }
    finish.ctx.status = head.status.as_u16();
    if finish.ctx.method != Method::HEAD {
        finish.ctx.body_bytes_sent = body.len() as u64;
    }
    finish.ctx.head_bytes_sent = head_bytes(&head) + content_length_bytes(body.len());
    with_head(head, ResponseBody::Full(Some(body)), false)
}

/// A plugin's own answer, with its `_meta.error_response` body if one is set and it is an error.
fn answer(mut r: PluginResponse, p: &BoundPlugin) -> PluginResponse {
    if let (Some(e), true) = (&p.error_response, r.status.as_u16() >= 400) {
        r.body = e.body.clone();
        r.headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(e.content_type));
    }
    r
}

/// Settles one phase of one plugin inside [`access_phases`]: goes on, returns the plugin's
/// answer, or waits. Written out rather than as an `async fn`, so that a phase that decides at
/// once costs no future of its own.
macro_rules! settle {
    ($ctx:expr, $p:expr, $hook:ident, $phase:expr) => {{
        // Timed only when this request's phases are measured (no clock read otherwise).
        let t0 = phase_clock($ctx);
        let answered = {
            let mut flow: Flow<'_> = $p.instance.$hook($ctx);
            loop {
                match flow {
                    Flow::Continue => break None,
                    Flow::Respond(r) => break Some(r),
                    Flow::Wait(f) => flow = f.await,
                }
            }
        };
        note_phase($ctx, t0, $p.entry.name, $phase);
        if let Some(r) = answered {
            return Some(answer(r, $p));
        }
    }};
}

/// Runs `rewrite` then `access` of the request's chains; a plugin's answer ends the request.
/// Once the rewrite phase identified a consumer that has plugins of its own, they are merged
/// into the route's chain (overriding the route's of the same name, as APISIX does) and their
/// rewrite phase runs before the access phase.
pub(super) async fn access_phases(fin: &mut Finish) -> Option<PluginResponse> {
    {
        let Finish { ctx, chains, .. } = &mut *fin;
        for p in chains.iter().flat_map(|c| c.iter()) {
            if p.runs_for(ctx) {
                settle!(ctx, p, rewrite, Phase::Rewrite);
            }
        }
    }
    let consumer_chain = fin
        .ctx
        .consumer
        .as_ref()
        .and_then(|c| c.plugins.as_ref())
        .and_then(|p| p.downcast_ref::<PluginChain>())
        .cloned();
    if let Some(extra) = consumer_chain {
        for p in extra.iter() {
            if p.runs_for(&fin.ctx) {
                settle!(&mut fin.ctx, p, rewrite, Phase::Rewrite);
            }
        }
        fin.chains[1] = merge_chains(&fin.chains[1], &extra);
        fin.late_headers |= extra.late_headers;
    }
    let Finish { ctx, chains, .. } = &mut *fin;
    for p in chains.iter().flat_map(|c| c.iter()) {
        if p.runs_for(ctx) {
            settle!(ctx, p, access, Phase::Access);
        }
    }
    None
}

/// A response the gateway makes itself once the request has a route (502, 503, 504): it goes
/// through `header_filter`, `body_filter` and `log` like any response (docs/phases.md), so that
/// request-id, response-rewrite and loggers see it. On a gRPC route it is a gRPC status instead.
pub(super) fn gateway_error(status: StatusCode, msg: &str, fin: Box<Finish>) -> Response {
    if fin.grpc {
        return plugin_response(grpc_status(status, msg), fin);
    }
    plugin_response(PluginResponse::json(status, &json!({ "error_msg": msg })), fin)
}

/// A gRPC "trailers-only" answer: HTTP 200 with `grpc-status` and `grpc-message` and no body,
/// which gRPC clients read as the call's status. Codes: 504 is DEADLINE_EXCEEDED, other gateway
/// errors UNAVAILABLE (gRPC's HTTP mapping).
pub(super) fn grpc_status(status: StatusCode, msg: &str) -> PluginResponse {
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
pub(super) fn upgraded(
    mut resp: http::Response<Inbound>,
    client: crate::dataplane::tunnel::ClientUpgrade,
    mut finish: Box<Finish>,
    inflight: Option<InFlight>,
    idle: std::time::Duration,
    held: super::Held,
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
    finish.header_filters(&mut head);
    head.headers.insert(http::header::CONNECTION, HeaderValue::from_static("upgrade"));
    head.headers.insert(http::header::UPGRADE, token.unwrap_or(HeaderValue::from_static("websocket")));
    finish.ctx.head_bytes_sent = head_bytes(&head);
    finish._inflight = inflight;
    tokio::task::spawn_local(async move {
        let remote = finish.ctx.remote_addr;
        match crate::dataplane::tunnel::run(client, upstream, idle).await {
            Ok(outcome) => log::debug!("client {remote}: WebSocket closed: {outcome}"),
            Err(e) => log::debug!("client {remote}: WebSocket ended: {e}"),
        }
        drop(finish);
        drop(held);
    });
    let mut out = http::Response::new(ResponseBody::Full(None));
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *out.headers_mut() = head.headers;
    out
}

pub(super) fn respond(resp: http::Response<Inbound>, mut finish: Box<Finish>, inflight: Option<InFlight>) -> Response {
    let (parts, incoming) = resp.into_parts();
    // An HTTP/1.1 body knows the length its head announced (`h1codec` read it); hyper's says
    // it by its field.
    let len = match &incoming {
        Inbound::H1(b) => http_body::Body::size_hint(b).exact(),
        Inbound::Hyper(_) => parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok()),
    };
    let mut head = ResponseHead { status: parts.status, headers: parts.headers };
    // An HTTP/1.1 head arrives without hop-by-hop fields (`h1codec` leaves them out as it
    // parses); only hyper's HTTP/2 answers still need the pass.
    if let Inbound::Hyper(_) = incoming {
        strip_hop_by_hop(&mut head.headers);
    }
    // Weir's HTTP/1.1 server frames the body and writes the head itself (`h1server::respond`).
    let framed_by_server = finish.ctx.version <= http::Version::HTTP_11;
    let no_body = head.status == StatusCode::NO_CONTENT
        || head.status == StatusCode::NOT_MODIFIED
        || finish.ctx.method == Method::HEAD;
    // Plugins' response fields (quota headers, request ids) go into the map only for a header
    // filter to see, or a server that reads the map alone; else the HTTP/1.1 server writes them
    // from the context after the map's (`OnFinish::fields`): no hash per field.
    let fields_in_map = !framed_by_server || no_body || finish.chains.iter().any(|c| c.header_filters);
    if fields_in_map {
        for (k, v) in finish.ctx.response_headers.drain(..) {
            head.headers.append(k, v);
        }
    }
    // The upstream made this answer: say so on 5xx (the gateway's own 502/504 carry no such
    // header), before the header filters, as APISIX does.
    if head.status.is_server_error() || finish.upstream_status_always {
        head.headers.insert(UPSTREAM_STATUS, HeaderValue::from(head.status.as_u16()));
    }
    finish.ctx.status = head.status.as_u16();
    finish.header_filters(&mut head);
    if finish.debug {
        finish.debug_header(&mut head);
    }
    finish.ctx.status = head.status.as_u16();
    // A head read as lines left its Content-Length out of them; the server writes it again.
    let lines = match &incoming {
        Inbound::H1(b) => b.lines().map_or(0, |l| {
            l.text.len() as u64 + len.map_or(0, |n| content_length_bytes(usize::try_from(n).unwrap_or(usize::MAX)))
        }),
        Inbound::Hyper(_) => 0,
    };
    finish.ctx.head_bytes_sent = head_bytes(&head) + lines + field_list_bytes(&finish.ctx.response_headers);
    // As the header filters left it (one may have made a 204 a 200 with a body of its own).
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
    with_head(head, ResponseBody::Upstream(UpstreamBody::new(incoming, len, finish)), framed_by_server)
}
