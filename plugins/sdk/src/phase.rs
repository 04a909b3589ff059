//! Request-phase hooks and the per-request context.
//!
//! The data plane runs, for every request and in plugin priority order: `rewrite` → `access` →
//! (balancing and proxying) → `header_filter` → `body_filter` → `log`. `rewrite` and `access` may
//! answer the request themselves (reject it, or serve it) and stop the chain; `log` always runs.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};

/// A phase that waits: a future that may borrow the plugin instance and the request context
/// (`&mut RequestCtx`), so that after a remote call it can still set upstream headers, the
/// consumer or response headers. It runs on the worker's single-threaded runtime, so it need not
/// be `Send`.
pub type WaitFuture<'a> = Pin<Box<dyn Future<Output = Flow<'static>> + 'a>>;

/// What a `rewrite` or `access` hook decided.
pub enum Flow<'a> {
    /// Go on with the next plugin / phase.
    Continue,
    /// Answer the client with this response; later rewrite/access hooks and the upstream are skipped.
    Respond(PluginResponse),
    /// Wait for the future (which may still use the request context), then act on its result.
    /// Hooks that never wait return the other variants and cost no allocation.
    Wait(WaitFuture<'a>),
}

impl<'a> Flow<'a> {
    /// Waits for `fut` (see [`Flow::Wait`]).
    pub fn wait(fut: impl Future<Output = Flow<'static>> + 'a) -> Self {
        Flow::Wait(Box::pin(fut))
    }
}

/// What a plugin uses after the request was forwarded, read once per configuration: the host
/// leaves a plugin out of the phases it does not use, and moves the request headers into the
/// upstream request instead of copying them when no plugin reads them late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Late {
    /// `header_filter`, `body_filter` or `log` read the request headers ([`RequestCtx::headers`];
    /// without this they may find them empty).
    pub headers: bool,
    /// [`PluginInstance::header_filter`] does something.
    pub header_filter: bool,
    /// [`PluginInstance::log`] does something.
    pub log: bool,
}

impl Late {
    /// Everything (the default).
    pub const ALL: Late = Late { headers: true, header_filter: true, log: true };
    /// Nothing after forwarding: a plugin of `rewrite`/`access` only.
    pub const NONE: Late = Late { headers: false, header_filter: false, log: false };
    /// A header filter that reads no request header.
    pub const HEADER_FILTER: Late = Late { header_filter: true, ..Late::NONE };
    /// A log phase that reads no request header.
    pub const LOG: Late = Late { log: true, ..Late::NONE };
}

/// Whether a plugin filters the body of this response: returned by
/// [`PluginInstance::header_filter`], decided per response (a response nobody filters keeps its
/// `Content-Length`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BodyFilter {
    /// The body passes untouched (the default).
    #[default]
    Skip,
    /// [`PluginInstance::body_filter`] sees every chunk of this response.
    Filter,
    /// [`PluginInstance::body_filter`] sees every chunk of this response but does not change it
    /// (a cache storing the body as it streams): the response keeps its `Content-Length` when no
    /// other plugin filters it, and changes made to the chunk are not sent.
    Observe,
}

/// A response produced by a plugin.
#[derive(Debug, Clone)]
pub struct PluginResponse {
    /// Status code.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl PluginResponse {
    /// A JSON response (`Content-Type: application/json`).
    pub fn json(status: StatusCode, value: &serde_json::Value) -> Self {
        Self::json_of(status, value)
    }
    /// A JSON response of any serializable value, written straight into the body (no
    /// `serde_json::Value` in between). A value that cannot be serialized (a map with non-string
    /// keys) answers 500 with the reason.
    pub fn json_of<T: serde::Serialize + ?Sized>(status: StatusCode, value: &T) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        match serde_json::to_vec(value) {
            Ok(body) => PluginResponse { status, headers, body: Bytes::from(body) },
            Err(e) => Self::message(StatusCode::INTERNAL_SERVER_ERROR, &format!("response not serializable: {e}")),
        }
    }
    /// A `{"message": ...}` JSON response, the shape APISIX plugins answer rejections with.
    pub fn message(status: StatusCode, msg: &str) -> Self {
        Self::json(status, &serde_json::json!({ "message": msg }))
    }
}

/// Response status and headers as they go to the client; `header_filter` may change them.
#[derive(Debug)]
pub struct ResponseHead {
    /// Status code.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
}

/// The consumer a request was authenticated as: built once per snapshot, shared by requests.
#[derive(Clone)]
pub struct Consumer {
    /// Username (`$consumer_name`, `X-Consumer-Username` upstream).
    pub username: Arc<str>,
    /// The consumer group it belongs to (`group_id`).
    pub group_id: Option<Arc<str>>,
    /// Its labels.
    pub labels: Vec<(String, String)>,
    /// The credential that identified it (`X-Credential-Identifier` upstream), when the
    /// credential has an id of its own.
    pub credential_id: Option<Arc<str>>,
    /// `username` as a header value, made once.
    pub username_header: Option<HeaderValue>,
    /// The consumer's (and its group's) other plugins, for the host to merge into the chain once
    /// the consumer is known. Opaque to plugins.
    pub plugins: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl Consumer {
    /// A consumer with only a name (tests, anonymous consumers).
    pub fn named(username: &str) -> Self {
        Consumer {
            username: Arc::from(username),
            group_id: None,
            labels: Vec::new(),
            credential_id: None,
            username_header: HeaderValue::from_str(username).ok(),
            plugins: None,
        }
    }
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("username", &self.username)
            .field("group_id", &self.group_id)
            .field("credential_id", &self.credential_id)
            .finish_non_exhaustive()
    }
}

/// The certificate a client presented on a mutual-TLS connection, verified by Weir against the
/// CA of the server name it asked for (`ssls[].client`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// Its subject, as RFC 2253 writes it (`CN=client,O=Acme,C=DE`; nginx's `$ssl_client_s_dn`).
    pub subject: Arc<str>,
    /// The SHA-1 of its DER, lower-case hex (`$ssl_client_fingerprint`).
    pub fingerprint: Arc<str>,
}

/// The upstream addresses a request was sent to, in order (retries included; the last one
/// answered). The first is kept inline: a request without retries allocates nothing for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamAddrs {
    first: Option<SocketAddr>,
    rest: Vec<SocketAddr>,
}

impl UpstreamAddrs {
    /// Records the next attempt's address.
    pub fn push(&mut self, addr: SocketAddr) {
        if self.first.is_none() {
            self.first = Some(addr);
        } else {
            self.rest.push(addr);
        }
    }

    /// The last address (the one that answered, when one did).
    pub fn last(&self) -> Option<&SocketAddr> {
        self.rest.last().or(self.first.as_ref())
    }

    /// Every address, in order.
    pub fn iter(&self) -> impl Iterator<Item = &SocketAddr> {
        self.first.iter().chain(self.rest.iter())
    }

    /// How many attempts were made.
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    /// Whether no upstream was tried.
    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }
}

/// Per-request context: the request as the upstream will see it, plus what the gateway learned.
pub struct RequestCtx {
    /// Request method (mutable: `proxy-rewrite`).
    pub method: Method,
    /// HTTP version of the client's request.
    pub version: Version,
    /// Request path, normalized by the gateway (see docs/data-plane.md): what routing matched
    /// and what the upstream receives (mutable: `proxy-rewrite`).
    pub path: String,
    /// Raw query string without `?` (empty when none).
    pub query: String,
    /// The request target exactly as the client sent it (before normalization and rewrites):
    /// `$request_uri` and the access log's `$request`. `None` in contexts not made from a request.
    pub request_target: Option<http::uri::PathAndQuery>,
    /// Request headers (mutable: plugins add or remove).
    pub headers: HeaderMap,
    /// Client address.
    pub remote_addr: SocketAddr,
    /// The client's IP as text (`$remote_addr`), formatted once per connection.
    pub remote_ip: Arc<str>,
    /// Local address the request arrived on.
    pub local_addr: SocketAddr,
    /// `http` or `https`.
    pub scheme: &'static str,
    /// Matched route id.
    pub route_id: Option<Arc<str>>,
    /// The route URI pattern that matched (`/api/*`): a bounded label, unlike the path.
    pub matched_uri: Option<Arc<str>>,
    /// The route host pattern that matched (`*.example.com`), when the route names hosts.
    pub matched_host: Option<Arc<str>>,
    /// Service of the matched route.
    pub service_id: Option<Arc<str>>,
    /// Authenticated consumer.
    pub consumer: Option<Arc<Consumer>>,
    /// Route path parameters (`:name` / `{name}` segments).
    pub params: Vec<(Arc<str>, String)>,
    /// Upstream addresses tried, in order (the last one answered).
    pub upstream_addrs: UpstreamAddrs,
    /// The verified client certificate of a mutual-TLS connection.
    pub client_cert: Option<Arc<ClientCert>>,
    /// Status sent to the client (0 until known).
    pub status: u16,
    /// From the first upstream attempt until the answering node's response was received to its
    /// last byte (to its head when the body was not read to the end); `None` when no upstream
    /// answered (`$upstream_response_time`; the upstream latency of metrics).
    pub upstream_time: Option<Duration>,
    /// Bytes of the client's request: request line, headers and the body bytes actually
    /// received (`$request_length`; the head is counted as HTTP/1.1 text for every protocol).
    pub request_length: u64,
    /// Response body bytes sent to the client (`$body_bytes_sent`), set when the response ends.
    pub body_bytes_sent: u64,
    /// Bytes of the response head as HTTP/1.1 text (`$bytes_sent` = this + body bytes).
    pub head_bytes_sent: u64,
    /// When the request arrived.
    pub started: Instant,
    /// The whole request body: present when a plugin asked for it (`wants_request_body`), and
    /// when the gateway read it before the phases anyway (a `Content-Length` up to 64 KiB, or a
    /// chunked body that ended within 64 KiB). `None` for a body that streams.
    pub body: Option<Bytes>,
    /// The request has a body that streams to the upstream as it arrives (too large to be read
    /// first, and not asked for whole): it is not in [`RequestCtx::body`].
    pub body_streams: bool,
    /// Headers to add to the response, set by rewrite/access hooks (e.g. rate-limit headers).
    pub response_headers: Vec<(HeaderName, HeaderValue)>,
    /// Variables set by plugins, readable as `$name`.
    pub vars: Vec<(Cow<'static, str>, String)>,
    /// Set by a plugin to treat this request as non-idempotent (as POST, PATCH and LOCK are): once
    /// any byte of it reached an upstream node, it is never sent to another one.
    pub non_idempotent: bool,
    /// The upstream a plugin chose for this request instead of the route's (traffic-split).
    pub upstream: Option<crate::services::UpstreamRef>,
    /// Typed per-request state of plugins ([`crate::slots`]).
    pub slots: crate::slots::Slots,
    /// What the host measures of this request ([`crate::measure`]): `None`, and no clock read,
    /// unless a plugin or a process-wide setting asked.
    pub measured: Option<Box<crate::measure::Measured>>,
}

impl RequestCtx {
    /// A fresh context for a request.
    pub fn new(
        method: Method,
        path: String,
        query: String,
        headers: HeaderMap,
        remote_addr: SocketAddr,
        remote_ip: Arc<str>,
        local_addr: SocketAddr,
    ) -> Self {
        RequestCtx {
            method,
            version: Version::HTTP_11,
            request_target: None,
            path,
            query,
            headers,
            remote_addr,
            remote_ip,
            local_addr,
            scheme: "http",
            route_id: None,
            matched_uri: None,
            matched_host: None,
            service_id: None,
            consumer: None,
            params: Vec::new(),
            upstream_addrs: UpstreamAddrs::default(),
            client_cert: None,
            status: 0,
            upstream_time: None,
            request_length: 0,
            body_bytes_sent: 0,
            head_bytes_sent: 0,
            started: Instant::now(),
            body: None,
            body_streams: false,
            response_headers: Vec::new(),
            vars: Vec::new(),
            non_idempotent: false,
            upstream: None,
            slots: crate::slots::Slots::default(),
            measured: None,
        }
    }

    /// The request target as the client sent it (`$request_uri`); without one, the current path
    /// and query.
    pub fn request_uri(&self) -> Cow<'_, str> {
        match &self.request_target {
            Some(t) => Cow::Borrowed(t.as_str()),
            None if self.query.is_empty() => Cow::Borrowed(self.path.as_str()),
            None => Cow::Owned(format!("{}?{}", self.path, self.query)),
        }
    }

    /// A request header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The raw value of query argument `name`.
    pub fn arg(&self, name: &str) -> Option<&str> {
        crate::query_arg(&self.query, name)
    }

    /// The value of cookie `name` (the first one of that name, from any `Cookie` header).
    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.headers.get_all(http::header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|line| {
            line.split(';').find_map(|kv| kv.trim().split_once('=').filter(|(k, _)| *k == name).map(|(_, v)| v))
        })
    }

    /// The typed per-request state of type `T` ([`crate::slots`]).
    pub fn slot<T: std::any::Any>(&self) -> Option<&T> {
        self.slots.get()
    }

    /// A route path parameter.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| &**k == name).map(|(_, v)| v.as_str())
    }

    /// Sets a plugin variable, readable as `$name`.
    pub fn set_var(&mut self, name: impl Into<Cow<'static, str>>, value: String) {
        let name = name.into();
        if let Some(slot) = self.vars.iter_mut().find(|(k, _)| *k == name) {
            slot.1 = value;
        } else {
            self.vars.push((name, value));
        }
    }

    /// The header `http_<name>` names (`_` for `-`), looked up without allocating for names up
    /// to 64 bytes.
    fn header_var(&self, name: &str) -> Option<Cow<'_, str>> {
        let mut buf = [0u8; 64];
        let value = match buf.get_mut(..name.len()) {
            Some(dst) => {
                for (d, c) in dst.iter_mut().zip(name.bytes()) {
                    *d = if c == b'_' { b'-' } else { c };
                }
                // Only ASCII bytes were replaced by ASCII: still UTF-8.
                let h = std::str::from_utf8(dst).ok()?;
                self.headers.get(h)
            }
            None => self.headers.get(name.replace('_', "-").as_str()),
        };
        value.and_then(|v| v.to_str().ok()).map(Cow::Borrowed)
    }

    /// The argument `name` of a form body (`application/x-www-form-urlencoded`) the host read
    /// (`post_arg_<name>`): percent-decoded, `+` as a space. `None` for another content type or
    /// a body not read whole.
    pub fn post_arg(&self, name: &str) -> Option<Cow<'_, str>> {
        let form = self.header("content-type")?.split(';').next()?.trim();
        if !form.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
            return None;
        }
        let body = std::str::from_utf8(self.body.as_deref()?).ok()?;
        body.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (form_decode(k) == name).then(|| form_decode(v))
        })
    }

    /// Resolves a variable by name (with or without the leading `$`): `host`, `uri`, `request_uri`,
    /// `args`, `request_method`, `scheme`, `remote_addr`, `remote_port`, `server_port`, `status`,
    /// (`request_uri` and `request` as the client sent them, before normalization and rewrites),
    /// `request_time`, `upstream_addr`, `balancer_ip` and `balancer_port` (the node that answered),
    /// `upstream_response_time`, `request_length`, `bytes_sent`, `plugin_time` (time spent in each
    /// plugin's phases, when they are timed: [`crate::measure`]),
    /// `body_bytes_sent`, `server_protocol`, `request` (the request line), `remote_user` (none:
    /// `-`), `route_id`, `service_id`, `consumer_name`, `ssl_client_s_dn`,
    /// `ssl_client_fingerprint` and `ssl_client_verify` (mutual TLS: [`ClientCert`]), `http_<name>`,
    /// `arg_<name>`, `post_arg_<name>` ([`RequestCtx::post_arg`]), `param_<name>`,
    /// `cookie_<name>`, and any plugin-set variable.
    pub fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        let name = name.strip_prefix('$').unwrap_or(name);
        let owned = |s: String| Some(Cow::Owned(s));
        match name {
            "host" => self.header("host").map(|h| Cow::Borrowed(h.split(':').next().unwrap_or(h))),
            "uri" => Some(Cow::Borrowed(self.path.as_str())),
            "request_uri" => Some(self.request_uri()),
            "args" | "query_string" => Some(Cow::Borrowed(self.query.as_str())),
            "request_method" => Some(Cow::Borrowed(self.method.as_str())),
            "scheme" => Some(Cow::Borrowed(self.scheme)),
            "remote_addr" => Some(Cow::Borrowed(&*self.remote_ip)),
            "remote_port" => owned(self.remote_addr.port().to_string()),
            "server_addr" => owned(self.local_addr.ip().to_string()),
            "server_port" => owned(self.local_addr.port().to_string()),
            "status" => owned(self.status.to_string()),
            "request_time" => owned(format!("{:.3}", self.started.elapsed().as_secs_f64())),
            "upstream_addr" => {
                let mut addrs = self.upstream_addrs.iter();
                addrs.next().map(|first| {
                    let mut text = first.to_string();
                    for a in addrs {
                        let _ = write!(text, ", {a}");
                    }
                    Cow::Owned(text)
                })
            }
            "balancer_ip" => self.upstream_addrs.last().map(|a| Cow::Owned(a.ip().to_string())),
            "balancer_port" => self.upstream_addrs.last().map(|a| Cow::Owned(a.port().to_string())),
            "upstream_response_time" => self.upstream_time.map(|t| Cow::Owned(format!("{:.3}", t.as_secs_f64()))),
            "request_length" => owned(self.request_length.to_string()),
            "bytes_sent" => owned((self.head_bytes_sent + self.body_bytes_sent).to_string()),
            "body_bytes_sent" => owned(self.body_bytes_sent.to_string()),
            "server_protocol" => Some(Cow::Borrowed(version_str(self.version))),
            "request" => owned(format!("{} {} {}", self.method, self.request_uri(), version_str(self.version))),
            "remote_user" => Some(Cow::Borrowed("-")),
            "matched_uri" => self.matched_uri.as_deref().map(Cow::Borrowed),
            "matched_host" => self.matched_host.as_deref().map(Cow::Borrowed),
            "route_id" => self.route_id.as_deref().map(Cow::Borrowed),
            "service_id" => self.service_id.as_deref().map(Cow::Borrowed),
            "consumer_name" => self.consumer.as_ref().map(|c| Cow::Borrowed(&*c.username)),
            "ssl_client_s_dn" => self.client_cert.as_ref().map(|c| Cow::Borrowed(&*c.subject)),
            "ssl_client_fingerprint" => self.client_cert.as_ref().map(|c| Cow::Borrowed(&*c.fingerprint)),
            // nginx's values; a failed verification ends the handshake, so no request sees one.
            "ssl_client_verify" => match (&self.client_cert, self.scheme) {
                (Some(_), _) => Some(Cow::Borrowed("SUCCESS")),
                (None, "https") => Some(Cow::Borrowed("NONE")),
                (None, _) => None,
            },
            "plugin_time" => self.measured.as_ref().filter(|m| m.phases).map(|m| Cow::Owned(m.plugin_time())),
            _ => {
                if let Some(h) = name.strip_prefix("http_") {
                    return self.header_var(h);
                }
                if let Some(a) = name.strip_prefix("post_arg_") {
                    return self.post_arg(a);
                }
                if let Some(a) = name.strip_prefix("arg_") {
                    return self.arg(a).map(Cow::Borrowed);
                }
                if let Some(p) = name.strip_prefix("param_") {
                    return self.param(p).map(Cow::Borrowed);
                }
                if let Some(c) = name.strip_prefix("cookie_") {
                    return self.cookie(c).map(Cow::Borrowed);
                }
                self.vars.iter().find(|(k, _)| k == name).map(|(_, v)| Cow::Borrowed(v.as_str()))
            }
        }
    }
}

/// Decodes a form component: `+` is a space, `%XX` a byte (invalid escapes kept as they are).
fn form_decode(s: &str) -> Cow<'_, str> {
    if !s.contains(['+', '%']) {
        return Cow::Borrowed(s);
    }
    let bytes = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes.get(i..i + 3) {
            Some([b'%', h, l]) => hex(*h).zip(hex(*l)).map(|(h, l)| (h * 16 + l) as u8),
            _ => None,
        };
        match (bytes[i], escaped) {
            (_, Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', None) => {
                out.push(b' ');
                i += 1;
            }
            (c, None) => {
                out.push(c);
                i += 1;
            }
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// `HTTP/1.1`, as `$server_protocol` spells a version.
pub fn version_str(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

/// The runtime form of one plugin configuration, built once per resource snapshot.
///
/// Every hook has a no-op default; a plugin implements the phases it needs. `rewrite` and
/// `access` return at once when they can ([`Flow::Continue`], [`Flow::Respond`]) and wait with
/// the request in hand when they must ([`Flow::Wait`]).
pub trait PluginInstance: Send + Sync + 'static {
    /// Whether this plugin needs the whole request body in [`RequestCtx::body`] before `access`.
    /// Bodies are streamed unless some plugin of the request asks for this.
    fn wants_request_body(&self) -> bool {
        false
    }
    /// Which of the hooks after forwarding this plugin uses ([`Late`]); the host leaves it out
    /// of the others. The default, [`Late::ALL`], is always correct; say less to cost less.
    fn late(&self) -> Late {
        Late::ALL
    }
    /// Rewrite phase: adjust the request before authentication.
    fn rewrite<'a>(&'a self, _ctx: &'a mut RequestCtx) -> Flow<'a> {
        Flow::Continue
    }
    /// Access phase: authenticate, authorize, limit, or serve the request.
    fn access<'a>(&'a self, _ctx: &'a mut RequestCtx) -> Flow<'a> {
        Flow::Continue
    }
    /// Header filter: adjust the response status and headers before they are sent, and say
    /// whether this response's body goes through [`PluginInstance::body_filter`].
    fn header_filter(&self, _ctx: &mut RequestCtx, _resp: &mut ResponseHead) -> BodyFilter {
        BodyFilter::Skip
    }
    /// Body filter: called per response chunk (`eof` on the last call) when `header_filter`
    /// returned [`BodyFilter::Filter`] for this response.
    fn body_filter(&self, _ctx: &mut RequestCtx, _chunk: &mut Bytes, _eof: bool) {}
    /// Log phase: runs for every request, after the response was sent.
    fn log(&self, _ctx: &RequestCtx) {}
    /// Whether this plugin's `log` runs after every other plugin's (read once per
    /// configuration): a plugin that reports on the others' phase times
    /// ([`RequestCtx::measured`]) sees their log phase too.
    fn log_last(&self) -> bool {
        false
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// A GET of `/` from 127.0.0.1.
    pub fn ctx() -> RequestCtx {
        let addr = SocketAddr::from(([127, 0, 0, 1], 40000));
        RequestCtx::new(Method::GET, "/".into(), String::new(), HeaderMap::new(), addr, Arc::from("127.0.0.1"), addr)
    }
}
