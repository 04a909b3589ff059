//! The log entries of the logger plugins (file-logger, http-logger, tcp-logger, udp-logger,
//! syslog), built the way APISIX's `log-util` builds them.
//!
//! - [`LogFormat`]: a `log_format` object (route configuration or plugin metadata) compiled once
//!   at load: every string value is a [`Template`] (`"$remote_addr"`, `"${host}:${server_port}"`;
//!   a lone variable keeps its type: `$status` is a number, an absent variable `null`), objects
//!   nest (5 levels, as APISIX), other values are written as they are. `"$request_body"` is the
//!   request body (cut at `max_req_body_bytes`). A misspelled variable refuses the
//!   configuration, naming the field.
//! - [`full_log`]: APISIX's default entry (`request`, `response`, `server`, `upstream`,
//!   `route_id`, `service_id`, `consumer`, `client_ip`, `start_time`, `latency`,
//!   `upstream_latency`, `apisix_latency`), for loggers without a `log_format`.
//! - [`EntryBuilder`]: what a sink plugin keeps per configuration: the format (the route's
//!   `log_format`, else the metadata's, else the full log), and the body fields
//!   ([`BodyConf`]: `include_req_body`, `include_resp_body`, their `_expr`s and size caps). Its
//!   `header_filter` / `body_filter` collect what the log phase needs; `build` makes the entry.
//!
//! ```
//! use serde_json::json;
//! use weir_plugin::log_entry::LogFormat;
//!
//! let f = LogFormat::compile(json!({"who": "$remote_addr", "at": {"port": "$server_port"}, "v": 1}).as_object().unwrap()).unwrap();
//! assert_eq!(f.len(), 3);
//! let err = LogFormat::compile(json!({"x": {"y": "$remote_adr"}}).as_object().unwrap()).err().expect("refused");
//! assert!(err.starts_with("log_format.x.y: unknown variable"), "{err}");
//! ```

use std::marker::PhantomData;
use std::sync::LazyLock;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::expr::Expr;
use crate::phase::{BodyFilter, Late, ResponseHead};
use crate::template::{self, Piece, Template};
use crate::RequestCtx;

/// How deep `log_format` objects nest (APISIX's `MAX_LOG_FORMAT_DEPTH`).
pub const MAX_DEPTH: usize = 5;

/// APISIX's default cap of logged request and response bodies (512 KiB).
pub const MAX_BODY: usize = 524_288;

enum Field {
    Template(Template),
    RequestBody,
    Literal(Value),
    Nested(LogFormat),
}

/// A compiled `log_format` (see the module documentation).
pub struct LogFormat {
    fields: Vec<(String, Field)>,
    /// Per field, the JSON text before its value: `"key":`, after a `,` but for the first.
    prefixes: Vec<String>,
}

impl LogFormat {
    /// Compiles a `log_format` object; errors name the field (`log_format.a.b: ...`).
    pub fn compile(format: &Map<String, Value>) -> Result<LogFormat, String> {
        Self::compile_at(format, "log_format", 1)
    }

    /// Compiles field → text pairs (file-logger's flat format).
    pub fn compile_pairs(pairs: &[(String, String)]) -> Result<LogFormat, String> {
        let map: Map<String, Value> = pairs.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        Self::compile(&map)
    }

    fn compile_at(format: &Map<String, Value>, path: &str, depth: usize) -> Result<LogFormat, String> {
        let mut fields = Vec::with_capacity(format.len());
        for (k, v) in format {
            let here = format!("{path}.{k}");
            let field = match v {
                Value::String(s) if s == "$request_body" => Field::RequestBody,
                Value::String(s) => Field::Template(Template::compile(s).map_err(|e| format!("{here}: {e}"))?),
                Value::Object(o) if depth >= MAX_DEPTH => {
                    return Err(format!(
                        "{here}: log_format nests deeper than {MAX_DEPTH} levels ({} keys here)",
                        o.len()
                    ))
                }
                Value::Object(o) => Field::Nested(Self::compile_at(o, &here, depth + 1)?),
                other => Field::Literal(other.clone()),
            };
            fields.push((k.clone(), field));
        }
        let prefixes = fields
            .iter()
            .enumerate()
            .map(|(i, (k, _))| {
                let mut p = String::from(if i > 0 { "," } else { "" });
                push_json_str(&mut p, k);
                p.push(':');
                p
            })
            .collect();
        Ok(LogFormat { fields, prefixes })
    }

    /// Fields at the top level.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether it has no field.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Whether some value is `$request_body`.
    pub fn uses_request_body(&self) -> bool {
        self.fields.iter().any(|(_, f)| match f {
            Field::RequestBody => true,
            Field::Nested(n) => n.uses_request_body(),
            _ => false,
        })
    }

    /// The entry of one request; `$request_body` is `body` cut at `max_req_body` bytes.
    pub fn render(&self, ctx: &RequestCtx, body: Option<&[u8]>, max_req_body: usize) -> Map<String, Value> {
        let mut out = Map::new();
        for (k, f) in &self.fields {
            let v = match f {
                Field::Template(t) => match t.pieces() {
                    // A lone variable keeps its type: absent is `null`, the status a number.
                    [Piece::Var(name)] if &**name == "status" => Value::from(ctx.status),
                    [Piece::Var(name)] => {
                        template::value(name, ctx).map_or(Value::Null, |v| Value::String(v.into_owned()))
                    }
                    _ => Value::String(t.render(ctx).into_owned()),
                },
                Field::RequestBody => body.map_or(Value::Null, |b| Value::String(body_text(b, max_req_body))),
                Field::Literal(v) => v.clone(),
                Field::Nested(n) => Value::Object(n.render(ctx, body, max_req_body)),
            };
            out.insert(k.clone(), v);
        }
        out
    }
}

impl LogFormat {
    /// [`LogFormat::render`] written straight as one JSON object into `out`: the same text as
    /// `Value::Object(render(..)).to_string()` (keys sorted, as `serde_json::Map` keeps them),
    /// without a map, a `Value` or a key copy per field.
    pub fn write_json(&self, ctx: &RequestCtx, body: Option<&[u8]>, max_req_body: usize, out: &mut String) {
        out.push('{');
        for ((_, f), prefix) in self.fields.iter().zip(&self.prefixes) {
            out.push_str(prefix);
            match f {
                Field::Template(t) => match t.pieces() {
                    [Piece::Var(name)] if &**name == "status" => push_status(out, ctx.status),
                    [Piece::Var(name)] => match template::value(name, ctx) {
                        Some(v) => push_json_str(out, &v),
                        None => out.push_str("null"),
                    },
                    _ => push_json_str(out, &t.render(ctx)),
                },
                Field::RequestBody => match body {
                    Some(b) => push_json_str(out, &String::from_utf8_lossy(&b[..b.len().min(max_req_body)])),
                    None => out.push_str("null"),
                },
                Field::Literal(v) => out.push_str(&v.to_string()),
                Field::Nested(n) => n.write_json(ctx, body, max_req_body, out),
            }
        }
        out.push('}');
    }
}

/// An HTTP status (three digits) without the formatting machinery; other numbers as `Display`.
fn push_status(out: &mut String, status: u16) {
    if (100..1000).contains(&status) {
        for d in [status / 100, status / 10 % 10, status % 10] {
            out.push(char::from(b'0' + d as u8));
        }
    } else {
        let _ = std::fmt::Write::write_fmt(out, format_args!("{status}"));
    }
}

/// How [`push_json_str`] writes each byte: 0 as it is, `u` as `\u00XX`, else `\` and this byte.
static ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// Appends `s` as a JSON string, escaped as `serde_json` escapes it: `"`, `\`, the short
/// forms `\b \f \n \r \t`, other control characters as `\u00XX`; everything else as it is.
pub fn push_json_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape = ESCAPE[usize::from(b)];
        if escape == 0 {
            continue;
        }
        // Only ASCII bytes are escaped, so `start..i` falls on character boundaries.
        out.push_str(&s[start..i]);
        if escape == b'u' {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        } else {
            out.push('\\');
            out.push(char::from(escape));
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// A body as text (invalid UTF-8 replaced), cut at `max` bytes.
pub fn body_text(body: &[u8], max: usize) -> String {
    String::from_utf8_lossy(&body[..body.len().min(max)]).into_owned()
}

static HOSTNAME: LazyLock<String> = LazyLock::new(|| {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
});

/// This machine's name (`server.hostname` of the full log; syslog's HOSTNAME).
pub fn hostname() -> &'static str {
    &HOSTNAME
}

fn headers_object(h: &http::HeaderMap) -> Value {
    let mut out = Map::with_capacity(h.keys_len());
    for name in h.keys() {
        let mut values =
            h.get_all(name).iter().map(|v| Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()));
        let v = match (values.next(), values.next()) {
            (Some(one), None) => one,
            (Some(a), Some(b)) => Value::Array([a, b].into_iter().chain(values).collect()),
            (None, _) => continue,
        };
        out.insert(name.as_str().to_owned(), v);
    }
    Value::Object(out)
}

fn query_object(query: &str) -> Value {
    let mut out = Map::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').map_or((pair, Value::Bool(true)), |(k, v)| (k, Value::String(v.to_owned())));
        match out.get_mut(k) {
            Some(Value::Array(a)) => a.push(v),
            Some(prev) => *prev = Value::Array(vec![prev.take(), v]),
            None => {
                out.insert(k.to_owned(), v);
            }
        }
    }
    Value::Object(out)
}

/// APISIX's default entry (`get_full_log`) of one request; `response_headers` as captured in
/// the header filter, the bodies when the configuration logs them.
pub fn full_log(
    ctx: &RequestCtx,
    response_headers: Option<Value>,
    request_body: Option<String>,
    response_body: Option<String>,
) -> Map<String, Value> {
    let host = ctx.var("host").map(|h| h.into_owned()).unwrap_or_default();
    let uri = ctx.request_uri();
    let url = format!("{}://{}:{}{}", ctx.scheme, host, ctx.local_addr.port(), uri);
    let elapsed = ctx.started.elapsed();
    let latency = elapsed.as_secs_f64() * 1000.0;
    let upstream_latency = ctx.upstream_time.map(|t| t.as_secs_f64() * 1000.0);
    let start_ms = chrono::Utc::now().timestamp_millis() - i64::try_from(elapsed.as_millis()).unwrap_or(0);
    let mut request = Map::with_capacity(7);
    request.insert("url".into(), Value::String(url));
    request.insert("uri".into(), Value::String(uri.into_owned()));
    request.insert("method".into(), Value::String(ctx.method.as_str().to_owned()));
    request.insert("headers".into(), headers_object(&ctx.headers));
    request.insert("querystring".into(), query_object(&ctx.query));
    request.insert("size".into(), Value::from(ctx.request_length));
    if let Some(b) = request_body {
        request.insert("body".into(), Value::String(b));
    }
    let mut response = Map::with_capacity(4);
    response.insert("status".into(), Value::from(ctx.status));
    response.insert("headers".into(), response_headers.unwrap_or_else(|| Value::Object(Map::new())));
    response.insert("size".into(), Value::from(ctx.head_bytes_sent + ctx.body_bytes_sent));
    if let Some(b) = response_body {
        response.insert("body".into(), Value::String(b));
    }
    let mut server = Map::with_capacity(2);
    server.insert("hostname".into(), Value::String(hostname().to_owned()));
    server.insert("version".into(), Value::String(env!("CARGO_PKG_VERSION").to_owned()));
    let mut log = Map::with_capacity(13);
    log.insert("request".into(), Value::Object(request));
    log.insert("response".into(), Value::Object(response));
    log.insert("server".into(), Value::Object(server));
    log.insert("upstream".into(), ctx.var("upstream_addr").map_or(Value::Null, |a| Value::String(a.into_owned())));
    let (service_id, route_id) = match &ctx.route_id {
        Some(r) => (ctx.service_id.as_deref().unwrap_or(""), Value::String(r.to_string())),
        None => (host.as_str(), Value::Null),
    };
    log.insert("service_id".into(), Value::String(service_id.to_owned()));
    log.insert("route_id".into(), route_id);
    if let Some(c) = &ctx.consumer {
        let mut consumer = Map::with_capacity(1);
        consumer.insert("username".into(), Value::String(c.username.to_string()));
        log.insert("consumer".into(), Value::Object(consumer));
    }
    log.insert("client_ip".into(), Value::String(ctx.remote_ip.to_string()));
    log.insert("start_time".into(), Value::from(start_ms));
    log.insert("latency".into(), Value::from(latency));
    if let Some(u) = upstream_latency {
        log.insert("upstream_latency".into(), Value::from(u));
    }
    log.insert("apisix_latency".into(), Value::from((latency - upstream_latency.unwrap_or(0.0)).max(0.0)));
    log
}

fn yes_no_default() -> bool {
    false
}
fn max_body() -> usize {
    MAX_BODY
}

/// The body fields every sink plugin takes (APISIX's names and defaults); flatten it into the
/// plugin's configuration.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct BodyConf {
    /// Log the request body (`request.body` of the full log). The body is read before `access`
    /// (up to the gateway's 16 MiB), as APISIX reads it.
    #[serde(default = "yes_no_default")]
    pub include_req_body: bool,
    /// Log the request body only for requests this APISIX expression holds for.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub include_req_body_expr: Option<Vec<Value>>,
    /// Log the response body (`response.body`).
    #[serde(default = "yes_no_default")]
    pub include_resp_body: bool,
    /// Log the response body only for responses this APISIX expression holds for (evaluated
    /// when the response head is known: `$status` is set).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub include_resp_body_expr: Option<Vec<Value>>,
    /// The most request body bytes logged (the rest is cut).
    #[serde(default = "max_body")]
    #[schemars(range(min = 1))]
    pub max_req_body_bytes: usize,
    /// The most response body bytes logged (the rest is cut).
    #[serde(default = "max_body")]
    #[schemars(range(min = 1))]
    pub max_resp_body_bytes: usize,
}

/// The request body as `access` saw it (the host hands it to the upstream afterwards).
struct RequestBody<M>(bytes::Bytes, PhantomData<fn() -> M>);

/// What the header and body filters collect for the log phase, per request and per plugin
/// (`M` is the plugin's marker type: two loggers on one route collect separately).
struct Collected<M> {
    headers: Option<Value>,
    body: Option<Vec<u8>>,
    _of: PhantomData<fn() -> M>,
}

/// How a sink plugin makes its entries (see the module documentation). `M` is a type of the
/// plugin's own, naming its per-request state.
pub struct EntryBuilder<M> {
    format: Option<LogFormat>,
    body: BodyConf,
    req_expr: Option<Expr>,
    resp_expr: Option<Expr>,
    _of: PhantomData<fn() -> M>,
}

impl<M: 'static> EntryBuilder<M> {
    /// From the route's `log_format` (wins when given), the metadata's `log_format` (when not
    /// empty) and the body fields; errors name the key.
    pub fn new(
        conf_format: Option<&Map<String, Value>>,
        meta_format: Option<&Map<String, Value>>,
        body: BodyConf,
    ) -> Result<Self, String> {
        let format = match (conf_format, meta_format) {
            (Some(f), _) => Some(LogFormat::compile(f)?),
            (None, Some(f)) if !f.is_empty() => {
                Some(LogFormat::compile(f).map_err(|e| format!("plugin metadata: {e}"))?)
            }
            _ => None,
        };
        let compile = |e: &Option<Vec<Value>>, key: &str| {
            e.as_ref()
                .map(|e| Expr::compile(&Value::Array(e.clone())).map_err(|err| format!("{key}: {err}")))
                .transpose()
        };
        let req_expr = compile(&body.include_req_body_expr, "include_req_body_expr")?;
        let resp_expr = compile(&body.include_resp_body_expr, "include_resp_body_expr")?;
        Ok(EntryBuilder { format, body, req_expr, resp_expr, _of: PhantomData })
    }

    /// Whether entries are the full log (no `log_format`).
    pub fn is_full_log(&self) -> bool {
        self.format.is_none()
    }

    /// Whether the request body is needed before `access` (`include_req_body`, or a format
    /// naming `$request_body`).
    pub fn wants_request_body(&self) -> bool {
        match &self.format {
            None => self.body.include_req_body,
            Some(f) => f.uses_request_body(),
        }
    }

    /// The hooks after forwarding it needs: the log phase, request headers, and the header
    /// filter when it collects response headers or the body.
    pub fn late(&self) -> Late {
        Late { headers: true, header_filter: self.format.is_none(), log: true }
    }

    /// Keeps the request body for the log phase (a reference, not a copy), when it is logged.
    pub fn access(&self, ctx: &mut RequestCtx) {
        if !self.wants_request_body() {
            return;
        }
        let logged = self.format.is_some() || self.req_expr.as_ref().is_none_or(|e| e.matches(ctx));
        if let Some(b) = ctx.body.as_ref().filter(|_| logged) {
            let kept = b.slice(..b.len().min(self.body.max_req_body_bytes));
            ctx.slots.insert(RequestBody::<M>(kept, PhantomData));
        }
    }

    /// Collects the response headers (full log) and decides whether the body is logged.
    pub fn header_filter(&self, ctx: &mut RequestCtx, resp: &ResponseHead) -> BodyFilter {
        if self.format.is_some() {
            return BodyFilter::Skip;
        }
        let headers = Some(headers_object(&resp.headers));
        let logs_body = self.body.include_resp_body && self.resp_expr.as_ref().is_none_or(|e| e.matches(ctx));
        ctx.slots.insert(Collected::<M> { headers, body: logs_body.then(Vec::new), _of: PhantomData });
        if logs_body {
            BodyFilter::Observe
        } else {
            BodyFilter::Skip
        }
    }

    /// Keeps the first `max_resp_body_bytes` of the response body.
    pub fn body_filter(&self, ctx: &mut RequestCtx, chunk: &[u8]) {
        let cap = self.body.max_resp_body_bytes;
        if let Some(Collected { body: Some(b), .. }) = ctx.slots.get_mut::<Collected<M>>() {
            let room = cap.saturating_sub(b.len());
            b.extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
    }

    /// The entry of a request, in the log phase. With a `log_format`, `route_id` and
    /// `service_id` are added (APISIX's custom format does it) unless the format has them.
    pub fn build(&self, ctx: &RequestCtx) -> Map<String, Value> {
        match &self.format {
            Some(f) => {
                let body = ctx.slot::<RequestBody<M>>().map(|b| &b.0[..]);
                let mut entry = f.render(ctx, body, self.body.max_req_body_bytes);
                if let Some(r) = &ctx.route_id {
                    entry.entry("route_id").or_insert_with(|| Value::String(r.to_string()));
                    if let Some(s) = &ctx.service_id {
                        entry.entry("service_id").or_insert_with(|| Value::String(s.to_string()));
                    }
                }
                entry
            }
            None => {
                let collected = ctx.slot::<Collected<M>>();
                let req_body = ctx.slot::<RequestBody<M>>().map(|b| body_text(&b.0, self.body.max_req_body_bytes));
                let resp_body =
                    collected.and_then(|c| c.body.as_ref()).map(|b| String::from_utf8_lossy(b).into_owned());
                full_log(ctx, collected.and_then(|c| c.headers.clone()), req_body, resp_body)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::phase::tests_support::ctx;

    struct Mine;

    fn body(v: Value) -> BodyConf {
        serde_json::from_value(v).expect("valid")
    }

    #[test]
    fn a_format_renders_nested_typed_values_and_the_body() {
        let mut c = ctx();
        c.status = 201;
        c.body = Some(bytes::Bytes::from_static(b"hello world"));
        let f =
            json!({"s": "$status", "n": {"ip": "$remote_addr", "none": "$http_x_none"}, "b": "$request_body", "k": 7});
        let f = LogFormat::compile(f.as_object().expect("object")).expect("valid");
        assert!(f.uses_request_body());
        let out = Value::Object(f.render(&c, c.body.as_deref(), 5));
        assert_eq!(out, json!({"s": 201, "n": {"ip": "127.0.0.1", "none": null}, "b": "hello", "k": 7}));
    }

    #[test]
    fn the_json_written_directly_is_the_rendered_maps() {
        let mut c = ctx();
        c.status = 502;
        c.headers.insert("x-t", http::HeaderValue::from_static("tab\there \"q\" back\\slash"));
        let nasty = "nul\u{0}bell\u{7}\u{1f} \u{7f} é 日本 \"\\ \r\n\u{8}\u{c}";
        c.body = Some(bytes::Bytes::from(nasty.as_bytes().to_vec()));
        for f in [
            json!({"s": "$status", "n": {"ip": "$remote_addr", "none": "$http_x_none", "t": "$http_x_t"}, "b": "$request_body", "k": 7}),
            json!({"z": "${remote_addr}:${status}", "a": [1, "two"], "m": {"x": {"y": {"z": "$uri"}}}, "lit": null}),
            json!({}),
        ] {
            let f = LogFormat::compile(f.as_object().expect("object")).expect("valid");
            for body in [c.body.as_deref(), None] {
                let mut direct = String::new();
                f.write_json(&c, body, 9, &mut direct);
                assert_eq!(direct, Value::Object(f.render(&c, body, 9)).to_string());
            }
        }
        let f = LogFormat::compile(json!({"s": "$status"}).as_object().expect("object")).expect("valid");
        for status in [0, 7, 99, 100, 200, 404, 502, 999, 1000, 65535] {
            c.status = status;
            let mut direct = String::new();
            f.write_json(&c, None, 9, &mut direct);
            assert_eq!(direct, Value::Object(f.render(&c, None, 9)).to_string());
        }
        let every_ascii: String = (0u8..=0x7f).map(char::from).collect();
        for text in [every_ascii.as_str(), nasty, "", "plain", "\"", "é\u{1}"] {
            let mut out = String::new();
            push_json_str(&mut out, text);
            assert_eq!(out, serde_json::to_string(text).unwrap_or_default());
        }
    }

    #[test]
    fn formats_too_deep_or_misspelled_are_refused_with_their_path() {
        let deep = json!({"a": {"b": {"c": {"d": {"e": {"f": "$uri"}}}}}});
        let e = LogFormat::compile(deep.as_object().expect("object")).err().expect("too deep");
        assert!(e.starts_with("log_format.a.b.c.d.e: "), "{e}");
        let e = EntryBuilder::<Mine>::new(None, json!({"x": "$hots"}).as_object(), body(json!({}))).err().expect("bad");
        assert!(e.starts_with("plugin metadata: log_format.x: unknown variable `$hots`"), "{e}");
        let e = EntryBuilder::<Mine>::new(None, None, body(json!({"include_req_body_expr": [["uri", "=~", "/"]]})))
            .err()
            .expect("bad operator");
        assert!(e.starts_with("include_req_body_expr"), "{e}");
    }

    #[test]
    fn the_full_log_has_apisix_keys_and_bodies_when_asked() {
        let b = EntryBuilder::<Mine>::new(
            None,
            Some(&Map::new()),
            body(json!({"include_req_body": true, "include_resp_body": true, "max_resp_body_bytes": 4})),
        )
        .expect("valid");
        assert!(b.is_full_log() && b.wants_request_body());
        let mut c = ctx();
        c.query = "a=1&a=2&b".into();
        c.body = Some(bytes::Bytes::from_static(b"req"));
        b.access(&mut c);
        c.body = None; // handed to the upstream
        c.route_id = Some("r1".into());
        let mut head = ResponseHead { status: http::StatusCode::OK, headers: http::HeaderMap::new() };
        head.headers.insert("x-up", http::HeaderValue::from_static("1"));
        assert_eq!(b.header_filter(&mut c, &head), BodyFilter::Observe);
        b.body_filter(&mut c, b"abc");
        b.body_filter(&mut c, b"defg");
        c.status = 200;
        let e = Value::Object(b.build(&c));
        assert_eq!(e["request"]["querystring"], json!({"a": ["1", "2"], "b": true}));
        assert_eq!(e["request"]["body"], "req");
        assert_eq!(e["response"]["body"], "abcd");
        assert_eq!(e["response"]["headers"]["x-up"], "1");
        assert_eq!(e["route_id"], "r1");
        for key in ["server", "client_ip", "start_time", "latency", "apisix_latency", "upstream", "service_id"] {
            assert!(e.get(key).is_some(), "{key} in {e}");
        }
    }
}
